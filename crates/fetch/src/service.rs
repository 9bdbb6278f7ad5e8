//! Narrow service interfaces for the admin and status endpoints: the data directory's room and
//! size, the shared bucket's state, the fills, gc, fsck and tag removal (bundle import is
//! `tender_bundle::import_into`). The server reaches the store and the bucket only through
//! these (and objects only through [`crate::entry`]); its crate does not depend on
//! `tender-store` or `tender-bucket` at all.

use std::collections::BTreeSet;
use std::time::SystemTime;

use tender_oci::{Digest, ImageRef, Reference};

pub use tender_store::{now_secs, FsckReport, GcPlan, GcReport, ImportRecord, InventoryItem, Released};

use crate::error::{FetchError, FetchErrorKind};
use crate::fills::FillsView;
use crate::mirror::Mirror;

/// The store's size and what it keeps in memory, for the gauges and the status page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreSize {
    pub bytes: u64,
    pub objects: usize,
}

/// The room on the data directory's file system.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Room {
    pub free: u64,
    pub capacity: u64,
}

/// The shared bucket's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketStatus {
    Up {
        /// Fill leases in use (the server has conditional writes and `lease` is on).
        leases: bool,
        /// `lease: true` in the configuration.
        leases_configured: bool,
        /// It keeps failing chunks for `slow` right after probes close the breaker.
        slow: bool,
    },
    Down {
        /// `dns`, `connect`, `tls`, `timeout`, `auth`, ...
        cause: &'static str,
        message: String,
        since: SystemTime,
    },
}

/// The shared bucket, as the status endpoints show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketView {
    pub name: String,
    pub status: BucketStatus,
}

fn local(e: &tender_store::StoreError) -> FetchError {
    FetchError::store("store", e)
}

impl Mirror {
    /// The data directory's room, for `/api/v1/health` and the status page: `full` (under 1 MiB
    /// free: nothing new can be stored, fills pass through), `low` (under `cache.minFree`) or
    /// `ok`, with the figures. Its path is not shown (a client need not know it).
    pub fn data_directory(&self) -> serde_json::Value {
        let store = self.flights().store();
        let policy = store.room_policy();
        match (store.free_bytes(), store.capacity_bytes()) {
            (Ok(free), Ok(size)) => {
                let state = if free < 1 << 20 {
                    "full"
                } else if free < policy.min_free {
                    "low"
                } else {
                    "ok"
                };
                serde_json::json!({
                    "state": state,
                    "freeBytes": free,
                    "sizeBytes": size,
                    "minFreeBytes": policy.min_free,
                    "maxSizeBytes": policy.max_size,
                })
            }
            (Err(e), _) | (_, Err(e)) => serde_json::json!({ "state": "unknown", "error": e.to_string() }),
        }
    }

    /// Whether the data directory is usable (its object tree is there).
    pub fn data_ready(&self) -> bool {
        self.flights().store().root().join("objects").is_dir()
    }

    /// The stored objects' count and bytes (walks the object tree: call it off the async
    /// threads, and not often).
    pub fn store_size(&self) -> StoreSize {
        let objects = self.flights().store().list_objects().unwrap_or_default();
        StoreSize { bytes: objects.iter().map(|o| o.size).sum(), objects: objects.len() }
    }

    /// Objects kept in memory and their bytes.
    pub fn memory_usage(&self) -> (usize, u64) {
        self.flights().store().memory_usage()
    }

    /// Free and total bytes of the data directory's file system.
    pub fn room(&self) -> Option<Room> {
        let st = rustix::fs::statvfs(self.flights().store().root()).ok()?;
        Some(Room { free: st.f_bavail.saturating_mul(st.f_frsize), capacity: st.f_blocks.saturating_mul(st.f_frsize) })
    }

    /// The shared bucket, if there is one.
    pub fn bucket(&self) -> Option<BucketView> {
        let b = self.flights().shared()?;
        let status = match b.state() {
            tender_bucket::BucketState::Up => {
                BucketStatus::Up { leases: b.lease_enabled(), leases_configured: b.settings().lease, slow: b.is_slow() }
            }
            tender_bucket::BucketState::Down { cause, message, since } => {
                BucketStatus::Down { cause: cause.as_str(), message, since }
            }
        };
        Some(BucketView { name: b.name().to_string(), status })
    }

    /// Every fill in progress and the recently ended ones.
    pub fn fills(&self) -> FillsView {
        let mut view = self.flights().fills();
        view.verifications = self.verification.recent(tender_store::now_secs());
        view
    }

    /// How many fills are in progress.
    pub fn fills_in_progress(&self) -> usize {
        self.flights().active_keys().len()
    }

    /// Cancel the fill `id` (as `/api/v1/fills` names it). `false`: no such fill.
    pub fn cancel_fill(&self, id: &str) -> bool {
        self.flights().cancel(id)
    }

    /// Evict least recently used objects down to `cap` and remove day-old orphaned spool files,
    /// never touching fills in progress or pinned objects; with `dry_run`, only the plan.
    /// Blocking: call it off the async threads.
    pub fn gc(&self, cap: Option<u64>, dry_run: bool) -> Result<(GcPlan, Option<GcReport>), FetchError> {
        let active = self.flights().active_keys();
        let store = self.flights().store();
        // Spool files of live fills are protected by `active`; a day-old one is an orphan.
        let plan = store
            .gc_plan(cap, std::time::Duration::from_secs(24 * 3600), &|d| {
                active.contains(&d.to_string()) || store.is_pinned(d)
            })
            .map_err(|e| local(&e))?;
        let report = if dry_run { None } else { Some(store.gc_apply(&plan).map_err(|e| local(&e))?) };
        Ok((plan, report))
    }

    /// Re-verify every stored object; with `repair`, move the ones that fail to quarantine/.
    /// Blocking: call it off the async threads.
    pub fn fsck(&self, repair: bool) -> Result<FsckReport, FetchError> {
        self.flights().store().fsck(repair).map_err(|e| local(&e))
    }

    /// The imported bundles, oldest first. Blocking.
    pub fn imports(&self) -> Result<Vec<ImportRecord>, FetchError> {
        self.flights().store().imports().map_err(|e| local(&e))
    }

    /// Retire the imported bundle `index` (`tender bundle rm`); `None`: none was imported.
    /// Blocking.
    pub fn remove_bundle(&self, index: &Digest, dry_run: bool) -> Result<Option<Released>, FetchError> {
        self.flights().store().import_remove(index, dry_run).map_err(|e| local(&e))
    }

    /// Every image and imported OS image held (`tender images`). Blocking.
    pub fn inventory(&self) -> Result<Vec<InventoryItem>, FetchError> {
        self.flights().store().inventory().map_err(|e| local(&e))
    }

    /// Every object digest held, sorted: the have-list of `export --since-digests`. Blocking.
    pub fn held_digests(&self) -> Result<BTreeSet<Digest>, FetchError> {
        let objects = self.flights().store().list_objects().map_err(|e| local(&e))?;
        Ok(objects.into_iter().map(|o| o.digest).collect())
    }

    /// `(upstream, repository)` of every repository a tag record or an import names. Blocking.
    pub fn repositories(&self) -> Result<BTreeSet<(String, String)>, FetchError> {
        let store = self.flights().store();
        let mut out = BTreeSet::new();
        for t in store.tag_records().map_err(|e| local(&e))? {
            out.insert((t.upstream, t.repository));
        }
        for r in store.imports().map_err(|e| local(&e))? {
            for e in r.entries {
                if let (Some(u), Some(repo)) = (e.upstream, e.repository) {
                    out.insert((u, repo));
                }
            }
        }
        Ok(out)
    }

    /// Forget what the tag `name` (`ghcr.io/siderolabs/kubelet:v1.35.0`) points to, in the
    /// upstream its pull would reach, and release the pins imported bundles hold under it
    /// (retired: the next gc frees what nothing else holds). `Ok(None)`: there was no record.
    pub fn remove_tag(&self, name: &str) -> Result<Option<Released>, FetchError> {
        let refused = |m: String| FetchError::new(FetchErrorKind::NotFound, "tag", m);
        let image = ImageRef::parse(name).map_err(refused)?;
        let Reference::Tag(tag) = &image.reference else {
            return Err(refused(format!("{name}: name a tag, not a digest")));
        };
        let (up, repo) = self.route(Some(&image.registry), &image.repository).map_err(|e| refused(e.to_string()))?;
        let store = self.flights().store();
        let had = store.tag_remove(up.name(), repo.as_str(), tag.as_str()).map_err(|e| local(&e))?;
        let released = store.import_release_tag(up.name(), repo.as_str(), tag.as_str()).map_err(|e| local(&e))?;
        Ok((had || !released.entries.is_empty()).then_some(released))
    }
}
