//! OS images: the Image Factory's asset grammar, and the golden catalog.

pub mod asset;

pub use asset::{AssetError, AssetKind, AssetPath, Compression};
