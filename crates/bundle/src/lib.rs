//! Bundles: one OCI image layout (a directory, or a tar) that carries images and OS images across
//! an air gap. `tender export` writes them ([`write`]), a tar compressed or split into parts
//! for media ([`packing`]); `tender import` and
//! `POST /api/v1/admin/import` verify everything in them before any of it becomes visible
//! ([`import`]); `tender bundle ls` lists them ([`list`]). `tender export --talos-image-cache` writes Talos' own
//! image cache instead of (or beside) a bundle ([`talos_cache`]).

pub mod import;
pub mod layout;
pub mod list;
pub mod mirror;
pub mod packing;
pub mod signed;
pub mod talos_cache;
pub mod write;

pub use import::{
    import_dir, import_packed, import_path, import_tar, ImportError, ImportOptions, ImportReport, Router,
};
pub use layout::{Descriptor, Document};
pub use mirror::{import_into, Routes};
pub use packing::{Compress, Packing};
pub use talos_cache::{CacheLayout, CacheWritten, TalosCacheWriter};
pub use write::{blobs_of, is_tar, BundleWriter, Written};
