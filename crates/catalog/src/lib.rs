//! OS images: the Image Factory's asset grammar, the golden catalog and worker-disk clones.
//!
//! - [`asset`]: the factory's `/image/<schematic>/<version>/<asset>` grammar.
//! - [`config`]: the `catalog` section of the config file, resolved (directories, sizes).
//! - [`record`]: one state record per golden under `<data>/catalog/goldens/`, and its phases.
//! - [`service`]: imports (through the cache, then decompressed into a sparse raw golden),
//!   idempotent and resumable; the rule that an existing golden is never edited.
//! - [`api`]: the view shown by `tender catalog ls` and `GET /api/v1/catalog`, and the
//!   [`CatalogApi`] trait the HTTP layer calls.
//! - [`clone`] and [`clones`]: worker disks (reflink or qcow2 overlay), their refusals, and
//!   the registry of which disk came from which golden.
//!
//! Invariant: a golden is only ever visible whole: it is decompressed beside its final name,
//! fsynced and renamed into place.

pub mod api;
pub mod asset;
pub mod clone;
pub mod clones;
pub mod config;
mod fsutil;
pub mod metrics;
pub mod record;
pub mod service;
pub mod size;
pub mod sparse;

pub use api::{CatalogApi, CatalogView, GoldenView, SyncAccepted};
pub use asset::{AssetError, AssetKind, AssetPath, Compression};
pub use config::{CatalogSettings, ConfigProblem, Entry, Source};
pub use fsutil::create_shared_dir;
pub use metrics::CatalogMetrics;
pub use record::{GoldenRecord, Phase, Progress, Records, Stage};
pub use service::{Catalog, CatalogError, ImportSettings, Observer, Outcome, Quiet, SyncReport};

// Here, not in asset.rs: the fuzz targets compile asset.rs on its own, without tender-fetch.
impl asset::Compression {
    /// The container the fetch layer checks an asset of this compression against.
    pub fn container(self) -> tender_fetch::Container {
        match self {
            asset::Compression::None => tender_fetch::Container::None,
            asset::Compression::Xz => tender_fetch::Container::Xz,
            asset::Compression::Gz | asset::Compression::TarGz => tender_fetch::Container::Gz,
            asset::Compression::Zst => tender_fetch::Container::Zst,
        }
    }
}
