//! The only code that talks to upstreams.
//!
//! - [`entry`]: the one way to an object: every rule that decides what a client gets
//!   (admission, provenance, `Accept`, size limits, the source, the cache status) in one place.
//! - [`service`]: the narrow interfaces the admin and status endpoints use (room, sizes,
//!   the bucket's state, gc, fsck, fills, bundle import, tag removal).
//! - [`client`]: one HTTP client per configured upstream, with its TLS, proxy, credentials,
//!   the bearer-token dance and the redirect / address policy.
//! - [`flight`]: single-flight fills: one upstream transfer per object, any number of readers
//!   streaming from the growing spool, retry and resume, verify before commit.
//! - [`mirror`]: registry semantics on top: tags with a TTL and stale-if-error, manifests,
//!   blobs.
//! - [`shared`] and [`source`]: the shared bucket as a source between the local store and
//!   the upstream; `heal`: chunks missing in it put back from a verified local copy.
//! - [`verify`] (over [`verdicts`]): the signature policy on the way to a manifest: deny
//!   before asking, verify before committing or serving, the verdict stored with the object.
//!
//! An upstream is always chosen from configuration, never from a request.

//! Upstream numbers (sizes, lifetimes, `Retry-After`) are hostile input: every operation on
//! them is checked or saturating, and the lint below keeps it so.
#![deny(clippy::arithmetic_side_effects)]

pub mod client;
pub mod container;
pub mod entry;
pub mod error;
pub mod expect;
pub mod fills;
pub mod flight;
mod heal;
pub mod health;
pub mod imported_tags;
pub mod metrics;
pub mod mirror;
pub mod pace;
pub mod records;
pub mod route;
pub mod service;
pub mod settings;
pub mod shared;
pub mod source;
pub mod verdicts;
pub mod verify;
pub mod window;
pub mod wire;

pub use client::Upstream;
pub use container::Container;
pub use entry::{Ask, AssetAsk, Body, Head, Object, Opened, Routed, SharedBody, Stored, Viewer};
pub use error::{FetchError, FetchErrorKind};
pub use flight::{Fill, Flights, ObjectBody, Piece};
pub use metrics::FetchMetrics;
pub use mirror::{ManifestHit, Mirror};
pub use settings::{Credentials, FetchSettings, StaleLimit, UpstreamSettings};

/// `now + d`, or far in the future when that does not fit in an `Instant` (a `Retry-After`
/// or a configured duration can be anything).
pub(crate) fn later(d: std::time::Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(d).or_else(|| now.checked_add(FAR)).unwrap_or(now)
}

/// "Never", as a duration every `Instant` can take: 100 years.
const FAR: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
