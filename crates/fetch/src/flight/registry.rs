//! The registry of fills in progress ([`Flights`]): a claim joins the fill for its key or
//! starts one (unless the object is stored already), under the fill slots of `limits`; and what
//! operators see of the fills, and cancel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tender_bucket::Bucket;
use tender_oci::Digest;
use tender_store::Store;

use super::fill::Fill;
use crate::error::{FetchError, FetchErrorKind};
use crate::expect::{Expect, Source};
use crate::fills::{epoch, EndedFill, FillInfo, FillView, FillsView, Recent};
use crate::metrics::FetchMetrics;
use crate::settings::FetchSettings;
use crate::shared;

/// The result of asking for an object.
pub enum Claim {
    /// Already in the store.
    Stored(Digest),
    /// Being fetched (by this call or an earlier one).
    Filling(Arc<Fill>),
}

/// The registry of fills in progress.
#[derive(Debug)]
pub struct Flights {
    pub(super) store: Arc<Store>,
    pub(super) settings: FetchSettings,
    pub(super) metrics: FetchMetrics,
    pub(super) active: Mutex<HashMap<String, Arc<Fill>>>,
    /// `maxConcurrentFills`: a fill holds a slot from its first upstream request to its end.
    pub(super) slots: Option<Arc<tokio::sync::Semaphore>>,
    /// `maxFillsPerUpstream`: taken before a global slot, so one upstream never holds them all.
    pub(super) upstream_slots: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// The bucket shared with other replicas (`storage.s3`), if any.
    pub(super) shared: Option<Arc<Bucket>>,
    /// Fills that ended in the last hour.
    pub(super) recent: Recent,
    /// How fast the bucket and each upstream delivered recent fills.
    pub(super) paces: crate::pace::Paces,
}

impl Flights {
    pub fn metrics(&self) -> &FetchMetrics {
        &self.metrics
    }

    pub fn new(store: Arc<Store>, settings: FetchSettings, metrics: FetchMetrics) -> Arc<Flights> {
        Flights::with_bucket(store, settings, metrics, None)
    }

    /// Fills that look in (and publish to) a bucket shared with other replicas.
    pub fn with_bucket(
        store: Arc<Store>,
        settings: FetchSettings,
        metrics: FetchMetrics,
        shared: Option<Arc<Bucket>>,
    ) -> Arc<Flights> {
        let slots = settings.max_concurrent_fills.map(|n| Arc::new(tokio::sync::Semaphore::new(n.max(1))));
        Arc::new(Flights {
            store,
            settings,
            metrics,
            active: Mutex::new(HashMap::new()),
            slots,
            upstream_slots: Mutex::new(HashMap::new()),
            shared,
            recent: Recent::default(),
            paces: crate::pace::Paces::default(),
        })
    }

    /// The shared bucket, if configured.
    pub fn shared(&self) -> Option<&Arc<Bucket>> {
        self.shared.as_ref()
    }

    /// The object `expect` asks for, if the shared bucket holds it (for HEAD and ranges served
    /// straight from the bucket). A bucket error reads as absent: the caller fills instead.
    /// Whether a client may have it is the caller's question (the mirror's `known_in`).
    pub async fn shared_lookup(&self, expect: &Expect) -> Option<shared::SharedObject> {
        let bucket = self.shared.as_ref()?;
        match shared::lookup(bucket, &self.store, expect, None).await {
            Ok(found) => found,
            Err(e) if e.is_down() => None,
            Err(e) => {
                tracing::warn!(error = %e, "shared bucket lookup failed");
                None
            }
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Objects being filled (digests and asset keys that GC must not touch), once each.
    pub fn active_keys(&self) -> Vec<String> {
        let mut v: Vec<String> =
            self.active.lock().map(|m| m.values().map(|f| f.object.clone()).collect()).unwrap_or_default();
        v.sort();
        v.dedup();
        v
    }

    /// Every fill in progress and those that ended in the last hour (`GET /api/v1/fills`).
    pub fn fills(&self) -> FillsView {
        let mut active: Vec<FillView> =
            self.active.lock().map(|m| m.values().map(|f| f.view()).collect()).unwrap_or_default();
        active.sort_by(|a, b| a.started_at.cmp(&b.started_at).then_with(|| a.id.cmp(&b.id)));
        FillsView { active, ended: self.recent.list(), verifications: Vec::new() }
    }

    /// Cancel the fill with this id (`DELETE /api/v1/admin/fills/<id>`): its clients get an
    /// error, its spool stays for a later resume. False when no fill has the id.
    pub fn cancel(&self, id: &str) -> bool {
        let Some(fill) = self.active.lock().ok().and_then(|m| m.values().find(|f| f.info.id == id).cloned()) else {
            return false;
        };
        fill.info.cancelled.store(true, std::sync::atomic::Ordering::Relaxed);
        fill.info.cancel.notify_waiters();
        fill.info.cancel.notify_one();
        true
    }

    /// Note a fill's end for [`Flights::fills`].
    pub(super) fn ended(&self, fill: &Fill, outcome: &'static str, error: Option<String>) {
        let f = fill.view();
        let now = std::time::SystemTime::now();
        self.recent.push(EndedFill {
            id: f.id,
            upstream: f.upstream,
            object: f.object,
            path: f.path,
            outcome,
            error,
            bytes: f.bytes,
            retries: f.retries,
            served: f.served,
            started_at: f.started_at,
            ended_at: epoch(now),
            seconds: fill.info.began.elapsed().as_secs_f64(),
            ended: Some(Instant::now()),
        });
    }

    /// The fill key of a registry object: per upstream, so a client of one upstream never joins
    /// (nor waits for, nor fails with) another upstream's transfer of the same digest.
    pub fn blob_key(upstream: &str, digest: &Digest) -> String {
        format!("{}@{digest}", upstream.to_ascii_lowercase())
    }

    /// Join the fill for `key`, or start one, unless the object is already stored.
    pub fn claim(self: &Arc<Self>, key: &str, expect: Expect, source: Arc<dyn Source>) -> Result<Claim, FetchError> {
        let local = |e: tender_store::StoreError| FetchError::store(source.upstream(), &e);
        let mut active = self
            .active
            .lock()
            .map_err(|_| FetchError::new(FetchErrorKind::Local, source.upstream(), "fill registry poisoned"))?;
        if let Some(fill) = active.get(key) {
            return Ok(Claim::Filling(fill.clone()));
        }
        if let Some(digest) = expect.stored(&self.store) {
            return Ok(Claim::Stored(digest));
        }
        let writer = match self.store.resume_spool(key, expect.algorithm()).map_err(local)? {
            Some(w) => {
                tracing::info!(key, bytes = w.len(), "resuming a leftover spool file");
                w
            }
            None => match self.store.create_spool(key, expect.algorithm()) {
                Ok(w) => w,
                // Not even an empty spool file fits: the fill passes through from its first byte.
                Err(e) if e.is_disk_full() => {
                    tracing::warn!(key, error = %e, "no spool file: the fill passes through, not stored");
                    self.store.unstored_spool(key, expect.algorithm()).map_err(local)?
                }
                Err(e) => return Err(local(e)),
            },
        };
        let gated = self.gated(&expect, false);
        let info = FillInfo::new(key, source.upstream(), source.path());
        let fill = Arc::new(Fill::new(key, &expect.object(), &writer, gated, info).map_err(|e| {
            FetchError::new(FetchErrorKind::Local, source.upstream(), format!("opening the spool: {e}"))
        })?);
        active.insert(key.to_string(), fill.clone());
        drop(active);
        self.metrics.fills_active.inc();
        let me = self.clone();
        let first = fill.clone();
        let (watchdog, watched, upstream) = (self.clone(), fill.clone(), source.upstream().to_string());
        let task = tokio::spawn(async move { me.run(first, writer, expect, source).await });
        // A fill task that panicked must not leave readers waiting for ever.
        tokio::spawn(async move {
            if let Err(e) = task.await {
                tracing::error!(key = %watched.key, error = %e, "fill task ended abnormally");
                watchdog.metrics.fills_active.dec();
                watchdog.finish(&watched);
                watched.fail(FetchError::new(
                    FetchErrorKind::Local,
                    &upstream,
                    format!("fill task ended abnormally: {e}"),
                ));
            }
        });
        Ok(Claim::Filling(fill))
    }

    /// The fill in progress for `key`, if there is one (a lookup: it never starts a fill).
    pub fn filling(&self, key: &str) -> Option<Arc<Fill>> {
        self.active.lock().ok()?.get(key).cloned()
    }

    /// Whether a fill's readers must wait for its verdict: an asset that already has a trust
    /// record, refilled from the upstream (a copy from the bucket is verified chunk by chunk
    /// against the index of the trusted digest, so its bytes may go out as they come).
    pub(super) fn gated(&self, expect: &Expect, from_bucket: bool) -> bool {
        match expect {
            Expect::Tofu { key, .. } => !from_bucket && self.store.trust_get(key).ok().flatten().is_some(),
            Expect::Digest(_) => false,
        }
    }

    /// The digest `expect` will commit, when known before the fill ends: a registry object's,
    /// or an asset's trust record's (a refill).
    pub(super) fn known_digest(&self, expect: &Expect) -> Option<Digest> {
        match expect {
            Expect::Digest(d) => Some(*d),
            Expect::Tofu { key, .. } => self.store.trust_get(key).ok().flatten().map(|t| t.digest),
        }
    }

    /// The per-upstream slot, then the global one; both `None` when not limited.
    pub(super) async fn take_slots(
        &self,
        fill: &Fill,
        upstream: &str,
    ) -> (Option<tokio::sync::OwnedSemaphorePermit>, Option<tokio::sync::OwnedSemaphorePermit>) {
        let mine = self.settings.max_fills_per_upstream.and_then(|n| {
            let mut m = self.upstream_slots.lock().ok()?;
            Some(
                m.entry(upstream.to_ascii_lowercase())
                    .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(n.max(1))))
                    .clone(),
            )
        });
        let mut waiting = false;
        let mut take = async |sem: Option<Arc<tokio::sync::Semaphore>>, what: &str| {
            let sem = sem?;
            match sem.clone().try_acquire_owned() {
                Ok(s) => Some(s),
                Err(_) => {
                    // Clients of this fill wait for their headers meanwhile.
                    if !waiting {
                        waiting = true;
                        self.metrics.fills_waiting.inc();
                    }
                    tracing::info!(%upstream, key = %fill.key, "fill waiting for a slot ({what} reached)");
                    sem.acquire_owned().await.ok()
                }
            }
        };
        let own = take(mine, "limits.maxFillsPerUpstream").await;
        let global = take(self.slots.clone(), "limits.maxConcurrentFills").await;
        if waiting {
            self.metrics.fills_waiting.dec();
        }
        (own, global)
    }

    pub(super) fn finish(&self, fill: &Arc<Fill>) {
        // Committed (now counted as stored) or ended: the room it was given is free again.
        drop(fill.room.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Ok(mut active) = self.active.lock() {
            if active.get(&fill.key).is_some_and(|f| Arc::ptr_eq(f, fill)) {
                active.remove(&fill.key);
            }
        }
    }
}
