//! Registry semantics that know nothing of HTTP or disks: repository names, tags and digests
//! (validated against the distribution grammar), the pull API's paths parsed into a typed
//! route, media types and the OCI error codes.

pub mod chain;
pub mod digest;
pub mod error;
pub mod image;
pub mod media;
pub mod name;
pub mod route;

pub use digest::{Algorithm, Digest, DigestError, Hasher};
pub use error::ErrorCode;
pub use image::ImageRef;
pub use name::{NameError, Reference, RepoName, Tag};
pub use route::{Route, RouteError, RouteKind};
