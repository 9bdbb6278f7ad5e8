//! Content-addressed storage under tender's data directory.
//!
//! Layout (format 2):
//! ```text
//! tender-data.json        format version; a newer tender migrates, an older one refuses
//! lock                    held (flock) by the one process that owns the directory
//! objects/sha256/ab/<hex> committed, verified content: manifests, blobs, OS image assets
//! meta/sha256/ab/<hex>.json  media type and size of a manifest object
//! known/sha256/ab/<hex>.json upstreams the object is known to exist in (none: no record)
//! tags/ab/<key>.json      tag -> digest records (upstream, repository, tag, fetched time)
//! trust/<key>.json        first verified sha256 of each OS image asset (never evicted)
//! pins/<hex>.json         objects kept out of eviction (prefetch --pin)
//! spool/<key>.part        fills in progress (key: upstream and digest, or asset key);
//!                         resumed or removed after a crash
//! quarantine/             objects fsck found corrupt (moved aside, never deleted)
//! ```
//! Every content path names its digest algorithm, so sha512 objects fit beside (`objects/sha512/`,
//! `meta/sha512/`, `known/sha512/`) without a new format.
//! Invariant: nothing appears under `objects/` before its sha256 matched the digest it is
//! stored under; nothing is served through an upstream it is not known in. Every write goes temp file -> hash -> fsync -> rename -> fsync directory.

mod fsutil;
mod layout;
mod maintenance;
mod records;
mod spool;

pub use fsutil::write_atomic;
pub use layout::{OpenMode, Store, StoreError, FORMAT_VERSION};
pub use maintenance::{FsckReport, GcPlan, GcReport};
pub use records::{now_secs, KnownRecord, ListingRecord, ManifestMeta, TagRecord, TrustRecord};
pub use spool::{Sealed, SpoolWriter};
