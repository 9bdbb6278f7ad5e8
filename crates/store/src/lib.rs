//! Content-addressed storage under tender's data directory.
//!
//! Layout (format 1):
//! ```text
//! tender-data.json        format version; a newer tender migrates, an older one refuses
//! lock                    held (flock) by the one process that owns the directory
//! objects/sha256/ab/<hex> committed, verified content: manifests, blobs, OS image assets
//! meta/sha256/ab/<hex>.json  media type and size of a manifest object
//! tags/ab/<key>.json      tag -> digest records (upstream, repository, tag, fetched time)
//! trust/<key>.json        first verified sha256 of each OS image asset (never evicted)
//! pins/<hex>.json         objects kept out of eviction (prefetch --pin)
//! spool/<key>.part        fills in progress; resumed or removed after a crash
//! quarantine/             objects fsck found corrupt (moved aside, never deleted)
//! ```
//! Invariant: nothing appears under `objects/` before its sha256 matched the digest it is
//! stored under. Every write goes temp file -> hash -> fsync -> rename -> fsync directory.

mod fsutil;
mod layout;
mod maintenance;
mod records;
mod spool;

pub use fsutil::write_atomic;
pub use layout::{OpenMode, Store, StoreError, FORMAT_VERSION};
pub use maintenance::{FsckReport, GcPlan, GcReport};
pub use records::{now_secs, ManifestMeta, TagRecord, TrustRecord};
pub use spool::{Sealed, SpoolWriter};
