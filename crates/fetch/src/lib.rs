//! The only code that talks to upstreams.
//!
//! - [`client`]: one HTTP client per configured upstream, with its TLS, proxy, credentials,
//!   the bearer-token dance and the redirect / address policy.
//! - [`flight`]: single-flight fills: one upstream transfer per object, any number of readers
//!   streaming from the growing spool, retry and resume, verify before commit.
//! - [`mirror`]: registry semantics on top: tags with a TTL and stale-if-error, manifests,
//!   blobs.
//!
//! An upstream is always chosen from configuration, never from a request.

pub mod client;
pub mod container;
pub mod error;
pub mod flight;
pub mod metrics;
pub mod mirror;
pub mod settings;
pub mod shared;

pub use client::Upstream;
pub use container::Container;
pub use error::{FetchError, FetchErrorKind};
pub use flight::{Fill, Flights, ObjectBody, Piece};
pub use metrics::FetchMetrics;
pub use mirror::{ManifestHit, Mirror};
pub use settings::{Credentials, FetchSettings, UpstreamSettings};
