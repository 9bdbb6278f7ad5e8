//! Content-addressed storage under tender's data directory.
//!
//! Layout (format 2):
//! ```text
//! tender-data.json        format version; a newer tender migrates, an older one refuses
//! lock                    held (flock) by the one process that owns the directory
//! objects/<alg>/ab/<hex>  committed, verified content: manifests, blobs, OS image assets
//! meta/<alg>/ab/<hex>.json   media type and size of a manifest object
//! known/<alg>/ab/<hex>.json  upstreams the object is known to exist in (none: no record)
//! tags/ab/<key>.json      tag -> digest records (upstream, repository, tag, fetched time)
//! trust/<key>.json        first verified sha256 of each OS image asset (never evicted)
//! pins/<hex>.json         sha256 objects kept out of eviction (prefetch --pin, reason
//!                         `prefetch`; an import, reason `bundle`);
//! pins/tags/<key>.json    each tag prefetch --pin pinned (tag rm releases its graph);
//!                         pins/sha512/<hex>.json for sha512 objects
//! imports/<alg>/<hex>.json  each imported bundle (by index digest): when, by whom, and the
//!                         objects each of its entries holds (`tender bundle rm` releases them)
//! retired/<alg>/<hex>     objects a retired release left without a holder: gc frees them
//!                         unless a pin, a tag or another bundle still holds them
//! spool/<key>.part        fills in progress (key: upstream and digest, or asset key);
//!                         resumed or removed after a crash
//! quarantine/             objects fsck found corrupt (moved aside, never deleted):
//!                         <hex>.<time> for sha256, sha512-<hex>.<time>
//! ```
//! `<alg>` is `sha256` or `sha512` ([`tender_oci::Algorithm`]): the `sha512/` trees sit beside
//! the `sha256/` ones in format 2, so a directory written before them reads unchanged.
//! Invariant: nothing appears under `objects/` before it hashed, with the algorithm of the
//! digest it is stored under, to that digest; nothing is served through an upstream it is not known in. Every write goes temp file -> hash -> fsync -> rename -> fsync directory.

mod budget;
mod fsutil;
mod imports;
mod inventory;
mod layout;
mod maintenance;
mod memory;
mod records;
mod room;
mod scrub;
mod spool;
mod types;

pub use budget::{Reservation, RoomPolicy};
pub use fsutil::write_atomic;
pub use imports::{ImportEntry, ImportRecord, Released, TagPin, BUNDLE_PIN, PREFETCH_PIN};
pub use inventory::InventoryItem;
pub use layout::{OpenMode, Store, StoreError, Stored, FORMAT_VERSION};
pub use maintenance::{FsckReport, GcPlan, GcReport};
pub use memory::MemoryLimit;
pub use room::RoomReport;
pub use scrub::{Pace, Scrubbed};
pub use spool::{CatchUp, ChainStates, Sealed, SpoolWriter, Vouch, PARALLEL_APPEND_MIN, STATE_STEP};
pub use types::{now_secs, KnownRecord, ListingRecord, ManifestMeta, TagRecord, TrustRecord, VerdictRecord};
