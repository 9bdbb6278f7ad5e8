//! Single-flight fills: one upstream transfer per object, however many clients ask.
//!
//! A [`Fill`] owns a spool file and a detached task that writes the upstream body into it,
//! retrying and resuming on faults, and commits it to the store only once verified. Every
//! requester (the first included) is a reader of the growing spool: headers go out as soon as
//! the size is known, bytes as soon as they are written, a range as soon as its bytes are
//! there. A client that disconnects drops only its reader; the fill goes on.
//!
//! Full-body readers never receive the last byte before the object verified, so no client
//! gets a complete wrong body; a mismatch fails the fill (readers are cut short), counts it,
//! and starts over once from zero.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::{BoxStream, StreamExt};
use tender_oci::{Algorithm, Digest};
use tender_store::{SpoolWriter, Store};
use tokio::sync::watch;

pub use crate::container::Container;
use crate::container::StreamCheck;
use crate::error::{FetchError, FetchErrorKind};
use crate::fills::{epoch, rate_and_eta, EndedFill, FillInfo, FillView, FillsView, Recent};
use crate::metrics::{upstream_label, FetchMetrics};
use crate::settings::FetchSettings;
use crate::shared::{self, BucketSource, Plan};
use crate::window::{Place, Window};
use tender_bucket::Bucket;

/// Bytes handed to a client per read (copied through a buffer).
const READ_CHUNK: u64 = 256 * 1024;
/// Bytes handed to a client per file span (sent with `sendfile`, no buffer): longer than a read,
/// since a span costs no memory, and every `sendfile` call, socket wake-up and client `recv`
/// saved is CPU the clients and the fill get instead.
const SPAN_CHUNK: u64 = 1024 * 1024;
/// New bytes a reader that caught up with its fill waits for before it sends file spans again.
/// Every hand-out is sent at once and wakes its client; with N clients at the front of a fill
/// those wake-ups cost more than the bytes (batches of 4 MiB instead of 256 KiB took `sendfile`
/// from 41% to 32% of tender's CPU at N=8). A fill that arrives at 200 MB/s now reaches a
/// client as 8 MiB bursts every 40 ms instead of 256 KiB ones every 1.3 ms.
const SPAN_BATCH: u64 = 8 * SPAN_CHUNK;
/// Longest a reader that caught up with its fill waits for a whole batch of new bytes.
const BATCH_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// A transfer opened by a [`Source`].
pub struct Opened {
    /// The upstream honoured our `Range: bytes=<offset>-` (206 from that offset).
    pub partial: bool,
    /// The whole object's length, when the upstream says it.
    pub total: Option<u64>,
    pub body: BoxStream<'static, Result<Bytes, FetchError>>,
}

/// Where a fill gets its bytes: opens the object at an offset (0, or a resume point).
pub trait Source: Send + Sync + 'static {
    fn upstream(&self) -> &str;
    fn open(&self, offset: u64) -> BoxFuture<'static, Result<Opened, FetchError>>;
    /// Largest object this source may deliver (the upstream's `maxObjectSize`).
    fn max_size(&self) -> Option<u64> {
        None
    }
    /// The upstream path fetched, for operators (`/v2/<repo>/blobs/<digest>`, `/image/…`).
    fn path(&self) -> &str {
        ""
    }
}

/// How a fill knows its bytes are right.
#[derive(Debug, Clone)]
pub enum Expect {
    /// A content-addressed object: its digest (sha256 or sha512, the one asked for) must match.
    Digest(Digest),
    /// An asset with no published checksum (Image Factory): complete by its announced
    /// length or its container's own check, then its sha256 is trusted on first use; a later
    /// fetch with other bytes is refused.
    Tofu { key: String, container: Container },
}

impl Expect {
    /// What the fill stores: the digest, or the asset key (GC protects it while the fill runs).
    fn object(&self) -> String {
        match self {
            Expect::Digest(d) => d.to_string(),
            Expect::Tofu { key, .. } => key.clone(),
        }
    }

    /// The algorithm the fill hashes with: the digest's own, sha256 for a trusted asset.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Expect::Digest(d) => d.algorithm(),
            Expect::Tofu { .. } => Algorithm::Sha256,
        }
    }

    /// The stored object this expectation is already met by, if any.
    fn stored(&self, store: &Store) -> Option<Digest> {
        match self {
            Expect::Digest(d) => store.object_len(d).map(|_| *d),
            Expect::Tofu { key, .. } => {
                let t = store.trust_get(key).ok()??;
                store.object_len(&t.digest).map(|_| t.digest)
            }
        }
    }
}

#[derive(Debug, Clone)]
pub enum Phase {
    /// Waiting for the upstream's response headers (or retrying before any).
    Connecting,
    Streaming,
    /// Every byte is in and verified; being made durable and visible. Readers may release the
    /// withheld final byte now: the content is right whatever the commit does.
    Verified(Digest),
    /// Verified and visible in the store.
    Committed(Digest),
    /// Verified and served to the fill's readers, not stored: the data directory had no room
    /// (a pass-through fill). Its readers read on from memory; nobody else can join it.
    PassedThrough(Digest),
    Failed(FetchError),
}

/// What readers see of a fill.
#[derive(Debug, Clone)]
pub struct FillState {
    pub written: u64,
    pub total: Option<u64>,
    pub phase: Phase,
    /// The bytes must match a trust record before any of them goes out (a refill of an asset
    /// tender already trusts): readers wait for `Verified`.
    pub gated: bool,
}

/// One object being fetched.
#[derive(Debug)]
pub struct Fill {
    key: String,
    /// The digest or asset key being filled (several upstreams may fill one digest at once).
    object: String,
    /// Kept even when nobody reads it (a prefetch, a catalog import): never cancelled as abandoned.
    keep: std::sync::atomic::AtomicBool,
    /// Not yet taken by the request that started the fill ([`Fill::take_start`]).
    start: std::sync::atomic::AtomicBool,
    /// The spool file, opened once: readers use this handle, never the path, so the rename
    /// into the store cannot race with a reader opening it.
    file: Arc<File>,
    /// The bytes a pass-through fill holds in memory (it could not store them).
    window: Arc<Window>,
    /// The room this fill was given in the data directory, until it ends.
    room: Mutex<Option<tender_store::Reservation>>,
    state: watch::Sender<FillState>,
    info: FillInfo,
}

/// A body to stream to a client, with the object's size when known.
pub struct ObjectBody {
    pub total: Option<u64>,
    pub stream: BoxStream<'static, io::Result<Bytes>>,
}

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
    store: Arc<Store>,
    settings: FetchSettings,
    metrics: FetchMetrics,
    active: Mutex<HashMap<String, Arc<Fill>>>,
    /// `maxConcurrentFills`: a fill holds a slot from its first upstream request to its end.
    slots: Option<Arc<tokio::sync::Semaphore>>,
    /// `maxFillsPerUpstream`: taken before a global slot, so one upstream never holds them all.
    upstream_slots: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// The bucket shared with other replicas (`storage.s3`), if any.
    shared: Option<Arc<Bucket>>,
    /// Fills that ended in the last hour.
    recent: Recent,
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
        })
    }

    /// The shared bucket, if configured.
    pub fn shared(&self) -> Option<&Arc<Bucket>> {
        self.shared.as_ref()
    }

    /// The object `expect` asks for, if the shared bucket holds it (for HEAD and ranges served
    /// straight from the bucket). A bucket error reads as absent: the caller fills instead.
    /// Whether a client may have it is the caller's question ([`crate::Mirror::known_in`]).
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
        FillsView { active, ended: self.recent.list() }
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
    fn ended(&self, fill: &Fill, outcome: &'static str, error: Option<String>) {
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
    fn gated(&self, expect: &Expect, from_bucket: bool) -> bool {
        match expect {
            Expect::Tofu { key, .. } => !from_bucket && self.store.trust_get(key).ok().flatten().is_some(),
            Expect::Digest(_) => false,
        }
    }

    /// The digest `expect` will commit, when known before the fill ends: a registry object's,
    /// or an asset's trust record's (a refill).
    fn known_digest(&self, expect: &Expect) -> Option<Digest> {
        match expect {
            Expect::Digest(d) => Some(*d),
            Expect::Tofu { key, .. } => self.store.trust_get(key).ok().flatten().map(|t| t.digest),
        }
    }

    /// The per-upstream slot, then the global one; both `None` when not limited.
    async fn take_slots(
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

    fn finish(&self, fill: &Arc<Fill>) {
        // Committed (now counted as stored) or ended: the room it was given is free again.
        drop(fill.room.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Ok(mut active) = self.active.lock() {
            if active.get(&fill.key).is_some_and(|f| Arc::ptr_eq(f, fill)) {
                active.remove(&fill.key);
            }
        }
    }

    /// The owner task: transfer with retries, verify, commit; one restart from zero on a
    /// mismatch.
    async fn run(
        self: Arc<Self>,
        mut fill: Arc<Fill>,
        mut writer: SpoolWriter,
        mut expect: Expect,
        mut source: Arc<dyn Source>,
    ) {
        let origin = (source.clone(), expect.clone());
        // The upstream the object is known in once this fill commits (registry objects).
        let known_in = match &expect {
            Expect::Digest(_) => Some(source.upstream().to_string()),
            Expect::Tofu { .. } => None,
        };
        let grace = self.settings.abandoned_fill_grace;
        let _slots = tokio::select! {
            s = self.take_slots(&fill, source.upstream()) => s,
            () = abandoned(&fill, grace) => {
                self.abandon(&fill, source.upstream(), "waiting for a slot");
                return;
            }
        };
        let deadline = crate::later(self.settings.fill_deadline);
        // With a shared bucket: copy what another replica committed, or wait for the replica
        // holding the lease, or fetch (holding it ourselves).
        let mut lease = None;
        // Copying from the bucket: the digest (not yet known when following an asset's
        // upload), and an asset's trust record.
        let mut from_bucket: Option<(Option<Digest>, Option<tender_store::TrustRecord>)> = None;
        let mut streamer = None;
        // Reading another replica's upload in progress (its lease holder may die): its id.
        let mut following: Option<String> = None;
        if let Some(bucket) = &self.shared {
            match shared::plan(bucket, &self.store, &fill.key, &expect, known_in.as_deref(), deadline).await {
                Plan::Bucket(found) => {
                    expect = Expect::Digest(found.digest);
                    from_bucket = Some((Some(found.digest), found.trust.clone()));
                    let label = shared::source_label(bucket);
                    source = Arc::new(BucketSource { bucket: bucket.clone(), label, object: found });
                    fill.state.send_modify(|s| s.gated = false);
                }
                Plan::Follow(finished, progress) => {
                    from_bucket = Some((finished.digest(), None));
                    following = Some(progress.upload.clone());
                    let label = shared::source_label(bucket);
                    let key = fill.key.clone();
                    source = Arc::new(shared::FollowSource { bucket: bucket.clone(), label, key, finished, progress });
                    // An asset refilled against its trust record waits for its verdict here
                    // as it would from the factory.
                    let gated = self.gated(&expect, false);
                    fill.state.send_modify(|s| s.gated = gated);
                }
                Plan::Upstream(l) => {
                    if let Some(held) = &l {
                        // Replicas waiting on the lease read the chunks as they land.
                        let key = held.key().to_string();
                        let digest = self.known_digest(&expect);
                        streamer = Some(shared::spawn_streamer(bucket.clone(), fill.clone(), digest, key));
                    }
                    lease = l;
                    // The bucket's trust record (now local too) gates a refill from upstream.
                    let gated = self.gated(&expect, false);
                    fill.state.send_modify(|s| s.gated = gated);
                }
            }
        }
        let mut upstream = source.upstream().to_string();
        self.metrics.fills_started.get_or_create(&upstream_label(&upstream)).inc();
        tracing::info!(%upstream, key = %fill.key, id = %fill.info.id, path = %fill.info.path, "fill started");
        let mut restarted = false;
        let mut bucket_copy_bad = false;
        let outcome = loop {
            let mut check = stream_check(&expect, &writer, self.settings.max_decoded_size);
            let result = tokio::select! {
                r = self.transfer_with_retries(&fill, &mut writer, source.as_ref(), deadline, &mut check) => r,
                () = abandoned(&fill, grace) => {
                    drop(check);
                    // The spool stays: a later claim resumes it.
                    drop(writer);
                    self.abandon(&fill, &upstream, "transferring");
                    if let Some(l) = lease.take() {
                        l.release().await;
                    }
                    return;
                }
            };
            // A failure while copying (not the final check): the bytes written so far passed
            // their chunk checks.
            let mid_copy = result.is_err();
            let verdict = match result {
                Ok(()) => {
                    let total = fill.state.borrow().total;
                    let checked = match check {
                        Some(c) => Some(c.finish().await),
                        None => None,
                    };
                    self.verify_and_commit(&fill, writer, &expect, &upstream, total, checked, known_in.as_deref()).await
                }
                Err(e) => Err((e, Some(writer))),
            };
            match verdict {
                Ok(digest) => break Ok(digest),
                Err((e, Some(w))) if (e.kind != FetchErrorKind::Corrupt || mid_copy) && from_bucket.is_some() => {
                    // The bucket failed mid-copy (gone, quarantined, unreachable, or a chunk
                    // that fails its check, never written): the bytes so far were verified
                    // chunk by chunk; the upstream continues from there, and the fill's readers
                    // do not notice. A bad copy is replaced after the commit.
                    if e.kind == FetchErrorKind::Corrupt {
                        bucket_copy_bad = true;
                    }
                    tracing::warn!(key = %fill.key, error = %e, have = w.len(),
                        "copy from the shared bucket failed; continuing from the upstream");
                    if let (Some((Some(digest), _)), Some(bucket)) = (from_bucket.take(), &self.shared) {
                        bucket.forget(&digest);
                    }
                    (source, expect) = origin.clone();
                    if let Some(failed) = following.take() {
                        // The replica we followed stopped: become the one that fetches (the
                        // lease ran out), so the other waiters follow this fill instead; or
                        // follow whoever took over first.
                        if let Some(bucket) = &self.shared {
                            match shared::take_over(bucket, &fill.key).await {
                                shared::TakeOver::Won(l) => {
                                    let key = l.key().to_string();
                                    let digest = self.known_digest(&expect);
                                    streamer = Some(shared::spawn_streamer(bucket.clone(), fill.clone(), digest, key));
                                    lease = Some(l);
                                }
                                // Never the upload that just failed: that would go round.
                                shared::TakeOver::Follow(progress) if progress.upload != failed => {
                                    let finished = shared::Finished::of(&expect);
                                    from_bucket = Some((finished.digest(), None));
                                    following = Some(progress.upload.clone());
                                    let label = shared::source_label(bucket);
                                    let key = fill.key.clone();
                                    source = Arc::new(shared::FollowSource {
                                        bucket: bucket.clone(),
                                        label,
                                        key,
                                        finished,
                                        progress,
                                    });
                                }
                                shared::TakeOver::Follow(_) | shared::TakeOver::Alone => {}
                            }
                        }
                    }
                    upstream = source.upstream().to_string();
                    self.metrics.fills_started.get_or_create(&upstream_label(&upstream)).inc();
                    let gated = self.gated(&expect, false);
                    fill.state.send_modify(|s| s.gated = gated);
                    writer = w;
                }
                Err((e, w)) if e.kind == FetchErrorKind::Corrupt && !restarted => {
                    // Discard, count, cut readers short, and start once more from zero.
                    restarted = true;
                    tracing::warn!(%upstream, key = %fill.key, error = %e, "fill corrupt: discarding and restarting from zero");
                    self.metrics.fills_finished.get_or_create(&result_label(&upstream, "corrupt")).inc();
                    if let Some(w) = w {
                        w.discard();
                    }
                    fill.fail(e.clone());
                    let fresh = match self.store.create_spool(&fill.key, expect.algorithm()) {
                        Ok(w) => w,
                        Err(se) if se.is_disk_full() => {
                            match self.store.unstored_spool(&fill.key, expect.algorithm()) {
                                Ok(w) => w,
                                Err(se) => {
                                    break Err(FetchError::new(FetchErrorKind::Local, &upstream, se.to_string()))
                                }
                            }
                        }
                        Err(se) => break Err(FetchError::new(FetchErrorKind::Local, &upstream, se.to_string())),
                    };
                    let next = match Fill::new(
                        &fill.key,
                        &fill.object,
                        &fresh,
                        fill.state.borrow().gated,
                        fill.info.again(),
                    ) {
                        Ok(f) => Arc::new(f),
                        Err(e) => {
                            fresh.discard();
                            break Err(FetchError::new(
                                FetchErrorKind::Local,
                                &upstream,
                                format!("opening the spool: {e}"),
                            ));
                        }
                    };
                    if fill.keep.load(std::sync::atomic::Ordering::Relaxed) {
                        next.keep();
                    }
                    if let Ok(mut active) = self.active.lock() {
                        active.insert(fill.key.clone(), next.clone());
                    }
                    fill = next;
                    writer = fresh;
                    if from_bucket.take().is_some() {
                        // The bucket's copy is bad: go to the upstream instead, and put the
                        // verified object over it afterwards.
                        (source, expect) = origin.clone();
                        bucket_copy_bad = true;
                        upstream = source.upstream().to_string();
                        let gated = self.gated(&expect, false);
                        fill.state.send_modify(|s| s.gated = gated);
                        self.metrics.fills_started.get_or_create(&upstream_label(&upstream)).inc();
                    }
                }
                Err((e, w)) => {
                    if let Some(w) = w {
                        // A transient failure keeps the spool for a later resume; wrong bytes do not.
                        if !e.is_retryable() {
                            w.discard();
                        }
                    }
                    break Err(e);
                }
            }
        };
        self.metrics.fills_active.dec();
        let label = upstream_label(&upstream);
        match outcome {
            Ok(digest) if fill.is_pass_through() => {
                // Verified and served, not stored: nothing to commit or publish.
                fill.state.send_modify(|s| s.phase = Phase::PassedThrough(digest));
                self.metrics.fills_finished.get_or_create(&result_label(&upstream, "passed_through")).inc();
                if from_bucket.is_none() {
                    self.metrics.upstream_up.get_or_create(&label).set(1);
                }
                self.finish(&fill);
                let v = fill.view();
                tracing::warn!(%upstream, key = %fill.key, id = %v.id, bytes = v.bytes, clients = v.served,
                    "fill passed through: verified and served, not stored (no room in the data directory)");
                self.ended(&fill, "passed_through", None);
                if let Some(s) = streamer.take() {
                    s.abort();
                }
                if let Some(l) = lease.take() {
                    l.release().await;
                }
            }
            Ok(digest) => {
                self.metrics.fills_finished.get_or_create(&result_label(&upstream, "committed")).inc();
                if from_bucket.is_none() {
                    self.metrics.upstream_up.get_or_create(&label).set(1);
                }
                if let Some(t) = from_bucket.as_ref().and_then(|f| f.1.as_ref()) {
                    if let Err(e) = self.store.trust_put(t) {
                        tracing::warn!(key = %fill.key, error = %e, "could not record the bucket's trust record locally");
                    }
                }
                fill.state.send_modify(|s| s.phase = Phase::Committed(digest));
                self.finish(&fill);
                let v = fill.view();
                let secs = fill.info.began.elapsed().as_secs_f64();
                tracing::info!(%upstream, key = %fill.key, id = %v.id, bytes = v.bytes, seconds = secs,
                    rate = v.rate, retries = v.retries, clients = v.served, "fill finished");
                self.ended(&fill, "committed", None);
                if let (Some(bucket), None) = (&self.shared, &from_bucket) {
                    let trust = match &expect {
                        Expect::Tofu { key, .. } => self.store.trust_get(key).ok().flatten(),
                        Expect::Digest(_) => None,
                    };
                    let path = self.store.object_path(&digest);
                    let known = known_in.clone();
                    let resume = match streamer.take() {
                        Some(s) => s.await.ok().flatten(),
                        None => None,
                    };
                    shared::publish(bucket.clone(), digest, path, trust, known, lease.take(), bucket_copy_bad, resume)
                        .await;
                }
            }
            Err(e) => {
                let result = if e.kind == FetchErrorKind::Corrupt { "corrupt" } else { "failed" };
                self.metrics.fills_finished.get_or_create(&result_label(&upstream, result)).inc();
                if e.is_upstream_down() {
                    self.metrics.upstream_up.get_or_create(&label).set(0);
                }
                let v = fill.view();
                tracing::warn!(%upstream, key = %fill.key, id = %v.id, bytes = v.bytes, retries = v.retries,
                    clients = v.served, error = %e, "fill failed");
                self.finish(&fill);
                self.ended(&fill, result, Some(e.to_string()));
                fill.fail(e);
                if let Some(l) = lease.take() {
                    l.release().await;
                }
            }
        }
    }

    /// Room in the data directory for `needed` more bytes, evicting least recently used
    /// objects now if that makes it (never one being filled or pinned). False: the fill must
    /// pass through. A failure to look (statvfs, a walk) answers true: the write will tell.
    async fn room_for(&self, fill: &Fill, needed: u64) -> bool {
        let active = self.active_keys();
        let store = self.store.clone();
        let made = tokio::task::spawn_blocking(move || {
            store.make_room(needed, &|d| active.binary_search(&d.to_string()).is_ok() || store.is_pinned(d))
        })
        .await;
        match made {
            Ok(Ok((r, held))) => {
                if held.is_some() {
                    *fill.room.lock().unwrap_or_else(|p| p.into_inner()) = held;
                }
                r.fits
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not make room in the data directory");
                true
            }
            Err(_) => true,
        }
    }

    /// Go on without storing: the rest of the fill's bytes reach its readers through memory.
    /// What the spool file holds moves to memory too when it fits in half the window, so its
    /// disk space goes back at once (to another fill, which may then be stored).
    async fn pass_through(&self, fill: &Fill, writer: &mut SpoolWriter, upstream: &str, why: &str) {
        let at = writer.len();
        writer.stop_storing();
        let mut moved = false;
        if at > 0 && at <= crate::window::WINDOW / 2 {
            let file = fill.file.clone();
            let head = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; usize::try_from(at).unwrap_or(0)];
                file.read_exact_at(&mut buf, 0).map(|()| buf)
            })
            .await;
            if let Ok(Ok(head)) = head {
                fill.window.begin_with(Bytes::from(head));
                moved = true;
                if let Err(e) = writer.drop_stored() {
                    tracing::warn!(key = %fill.key, error = %e, "could not give back a passed-through fill's disk space");
                }
            }
        }
        if !moved {
            fill.window.begin(at);
        }
        self.metrics.store_write_errors.get_or_create(&vec![("kind".to_string(), "no_space".to_string())]).inc();
        tracing::warn!(%upstream, key = %fill.key, at = writer.len(), why,
            "the fill passes through: served to its clients from memory, not stored");
    }

    async fn transfer_with_retries(
        &self,
        fill: &Fill,
        writer: &mut SpoolWriter,
        source: &dyn Source,
        deadline: Instant,
        check: &mut Option<StreamCheck>,
    ) -> Result<(), FetchError> {
        let mut attempt = 0u32;
        loop {
            attempt = attempt.saturating_add(1);
            match self.transfer(fill, writer, source, check).await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_retryable() && attempt < self.settings.attempts => {
                    let wait = e.retry_after.unwrap_or_else(|| self.settings.backoff(attempt));
                    if crate::later(wait) >= deadline {
                        return Err(e);
                    }
                    self.metrics.fill_retries.get_or_create(&upstream_label(source.upstream())).inc();
                    fill.info.retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::info!(upstream = %source.upstream(), key = %fill.key, attempt, have = writer.len(),
                        wait_ms = wait.as_millis() as u64, error = %e, "fill retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt: open at the bytes we have, compare any bytes re-sent, append the rest.
    async fn transfer(
        &self,
        fill: &Fill,
        writer: &mut SpoolWriter,
        source: &dyn Source,
        check: &mut Option<StreamCheck>,
    ) -> Result<(), FetchError> {
        let upstream = source.upstream().to_string();
        let err = |kind, m: String| FetchError::new(kind, &upstream, m);
        let have = writer.len();
        let opened = source.open(have).await?;
        let known_total = fill.state.borrow().total;
        if let (Some(before), Some(now)) = (known_total, opened.total) {
            if before != now {
                return Err(err(
                    FetchErrorKind::Corrupt,
                    format!("object size changed from {before} to {now} between attempts"),
                ));
            }
        }
        let total = opened.total.or(known_total);
        let too_large = |n: u64| {
            err(
                FetchErrorKind::TooLarge,
                format!(
                    "object of {n} bytes or more is over this upstream's maxObjectSize of {} bytes",
                    source.max_size().unwrap_or(0)
                ),
            )
        };
        if let (Some(t), Some(max)) = (total, source.max_size()) {
            if t > max {
                return Err(too_large(t));
            }
        }
        if let Some(t) = total {
            if have > t {
                return Err(err(FetchErrorKind::Corrupt, format!("have {have} bytes of an object of {t}")));
            }
        }
        fill.state.send_modify(|s| {
            s.total = total;
            s.phase = Phase::Streaming;
        });
        if let Some(t) = total {
            let needed = t.saturating_sub(writer.len());
            if writer.unstored_from().is_none() && needed > 0 {
                // A retry asks again for what is left: its earlier room is not counted twice.
                drop(fill.room.lock().unwrap_or_else(|p| p.into_inner()).take());
                if !self.room_for(fill, needed).await {
                    self.pass_through(
                        fill,
                        writer,
                        &upstream,
                        "larger than the room left in the data directory after eviction",
                    )
                    .await;
                }
            }
        }
        let mut pos = if opened.partial { have } else { 0 };
        let mut body = coalesce(opened.body);
        let bytes_counter = self.metrics.upstream_bytes.get_or_create(&upstream_label(&upstream)).clone();
        loop {
            let next = match tokio::time::timeout(self.settings.stall_timeout, body.next()).await {
                Ok(n) => n,
                Err(_) => {
                    return Err(err(
                        FetchErrorKind::Timeout,
                        format!("body stalled for {:?} at byte {}", self.settings.stall_timeout, writer.len()),
                    ))
                }
            };
            let Some(chunk) = next else { break };
            let chunk = chunk?;
            bytes_counter.inc_by(chunk.len() as u64);
            let mut data = &chunk[..];
            if pos < writer.len() {
                let n = usize::try_from(writer.len().saturating_sub(pos).min(data.len() as u64)).unwrap_or(0);
                let same = writer
                    .matches_at(pos, &data[..n])
                    .map_err(|e| err(FetchErrorKind::Local, format!("reading spool: {e}")))?;
                if !same {
                    return Err(err(
                        FetchErrorKind::Corrupt,
                        format!("restarted transfer differs from the bytes already received near byte {pos}"),
                    ));
                }
                pos = pos.saturating_add(n as u64);
                data = data.get(n..).unwrap_or_default();
            }
            if data.is_empty() {
                continue;
            }
            let after = writer.len().saturating_add(data.len() as u64);
            if let Some(t) = total {
                if after > t {
                    return Err(err(FetchErrorKind::Body, format!("body is longer than the announced {t} bytes")));
                }
            }
            if source.max_size().is_some_and(|max| after > max) {
                return Err(too_large(after));
            }
            let fresh = chunk.slice(chunk.len().saturating_sub(data.len())..);
            if writer.unstored_from().is_some() {
                writer.append_unstored(data);
                fill.window.push(fresh.clone()).await;
            } else if let Err(e) = writer.append(data) {
                if !crate::records::io_full(&e) {
                    return Err(err(FetchErrorKind::Local, format!("writing spool: {e}")));
                }
                // The disk is full: make room (at fill time, not on the next GC tick) and write
                // once more, else go on without storing.
                let needed = total.map_or(data.len() as u64, |t| t.saturating_sub(writer.len()));
                drop(fill.room.lock().unwrap_or_else(|p| p.into_inner()).take());
                let written = self.room_for(fill, needed).await && writer.append(data).is_ok();
                if written {
                    fill.wrote(data.len() as u64);
                } else {
                    self.pass_through(fill, writer, &upstream, "the data directory's file system is full").await;
                    writer.append_unstored(data);
                    fill.window.push(fresh.clone()).await;
                }
            } else {
                fill.wrote(data.len() as u64);
            }
            if let Some(c) = check.as_mut() {
                if let Err(e) = c.feed(fresh).await {
                    return Err(err(
                        FetchErrorKind::Corrupt,
                        format!("{:?} integrity check failed by byte {}: {e}", c.container(), writer.len()),
                    ));
                }
            }
            pos = pos.saturating_add(data.len() as u64);
            let written = writer.len();
            fill.state.send_modify(|s| s.written = written);
        }
        if let Some(t) = total {
            if writer.len() < t {
                return Err(err(FetchErrorKind::Body, format!("body ended at {} of {t} bytes", writer.len())));
            }
        }
        if pos < writer.len() {
            return Err(err(
                FetchErrorKind::Body,
                format!("restarted body ended at {pos}, before the {} bytes already received", writer.len()),
            ));
        }
        Ok(())
    }

    /// A fill nobody waits for any more: fail it for anyone who comes late (they claim anew)
    /// and free its slots.
    fn abandon(&self, fill: &Arc<Fill>, upstream: &str, when: &str) {
        let grace = self.settings.abandoned_fill_grace;
        let (outcome, error) = if fill.info.is_cancelled() {
            tracing::warn!(%upstream, key = %fill.key, id = %fill.info.id, when, "fill cancelled by an operator");
            (
                "cancelled",
                FetchError::new(
                    FetchErrorKind::Refused,
                    upstream,
                    format!("fill cancelled by an operator (DELETE /api/v1/admin/fills/{})", fill.info.id),
                ),
            )
        } else {
            tracing::info!(%upstream, key = %fill.key, when, grace_ms = grace.as_millis() as u64,
                "fill cancelled: no client has waited for it for the grace period");
            (
                "abandoned",
                FetchError::new(
                    FetchErrorKind::Timeout,
                    upstream,
                    format!("fill cancelled after {grace:?} without a client (limits.abandonedFillGrace)"),
                ),
            )
        };
        self.metrics.fills_active.dec();
        self.metrics.fills_finished.get_or_create(&result_label(upstream, outcome)).inc();
        self.finish(fill);
        self.ended(fill, outcome, Some(error.to_string()));
        fill.fail(error);
    }

    #[allow(clippy::too_many_arguments, reason = "one call site, each argument distinct")]
    async fn verify_and_commit(
        &self,
        fill: &Fill,
        writer: SpoolWriter,
        expect: &Expect,
        upstream: &str,
        total: Option<u64>,
        checked: Option<io::Result<u64>>,
        known_in: Option<&str>,
    ) -> Result<Digest, (FetchError, Option<SpoolWriter>)> {
        let err = |kind, m: String| FetchError::new(kind, upstream, m);
        let got = writer.digest_so_far();
        let (want, trust) = match expect {
            Expect::Digest(want) => {
                if got != *want {
                    return Err((
                        err(FetchErrorKind::Corrupt, format!("content is {got}, expected {want}")),
                        Some(writer),
                    ));
                }
                (*want, None)
            }
            Expect::Tofu { key, container } => {
                if total.is_none() && !container.has_checksum() {
                    return Err((
                        err(
                            FetchErrorKind::Unverifiable,
                            format!("{key}: no Content-Length and no checksummed container: completeness cannot be established, not stored"),
                        ),
                        Some(writer),
                    ));
                }
                if container.has_checksum() {
                    // Checked while the bytes arrived; a check that could not start (the resumed
                    // prefix unreadable) is done now, over the whole file.
                    let checked = match checked {
                        Some(r) => r,
                        None => {
                            let (path, c, max) =
                                (writer.path().to_path_buf(), *container, self.settings.max_decoded_size);
                            tokio::task::spawn_blocking(move || crate::container::check(&path, c, max))
                                .await
                                .unwrap_or_else(|e| Err(std::io::Error::other(e)))
                        }
                    };
                    if let Err(e) = checked {
                        return Err((
                            err(FetchErrorKind::Corrupt, format!("{key}: {container:?} integrity check failed: {e}")),
                            Some(writer),
                        ));
                    }
                }
                let trusted = self.store.trust_get(key).ok().flatten();
                if let Some(t) = trusted.as_ref().filter(|t| t.digest != got) {
                    return Err((
                        err(
                            FetchErrorKind::Corrupt,
                            format!(
                                "{key}: the upstream now sends {got}, but {} was trusted at its first fetch; refused \
                                 (if the asset was rebuilt on purpose, accept it with `tender catalog trust --reset`)",
                                t.digest
                            ),
                        ),
                        Some(writer),
                    ));
                }
                let record = tender_store::TrustRecord {
                    key: key.clone(),
                    digest: got,
                    size: writer.len(),
                    first_seen: tender_store::now_secs(),
                };
                (got, Some(record))
            }
        };
        fill.state.send_modify(|s| s.phase = Phase::Verified(want));
        if writer.unstored_from().is_some() {
            // Passed through: the readers had every byte, and there is nothing to commit.
            writer.discard();
            if let Some(r) = trust {
                if let Err(e) = self.store.trust_put(&r) {
                    tracing::warn!(key = %r.key, error = %e, "trust record of a passed-through asset not written");
                }
            }
            return Ok(want);
        }
        let store = self.store.clone();
        let known_in = known_in.map(str::to_string);
        let committed = tokio::task::spawn_blocking(move || {
            let sealed = writer.seal().map_err(|e| e.to_string())?;
            store.commit(sealed, &want).map_err(|e| e.to_string())?;
            // Before the fill leaves the registry: a later request through this upstream is a hit.
            if let Some(u) = &known_in {
                store.record_known(&want, u).map_err(|e| e.to_string())?;
            }
            if let Some(r) = trust {
                store.trust_put(&r).map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        })
        .await;
        match committed {
            Ok(Ok(())) => Ok(want),
            Ok(Err(e)) => Err((FetchError::new(FetchErrorKind::Local, upstream, format!("commit: {e}")), None)),
            Err(e) => Err((FetchError::new(FetchErrorKind::Local, upstream, format!("commit task: {e}")), None)),
        }
    }
}

/// The streaming container check of a fill that needs one (an asset in xz, gzip or zstd),
/// starting after the bytes a resumed spool file already holds.
fn stream_check(expect: &Expect, writer: &SpoolWriter, max_decoded: u64) -> Option<StreamCheck> {
    let Expect::Tofu { container, .. } = expect else { return None };
    if !container.has_checksum() {
        return None;
    }
    if writer.is_empty() {
        return Some(StreamCheck::start(*container, None, max_decoded));
    }
    let prefix = File::open(writer.path()).ok()?;
    Some(StreamCheck::start(*container, Some((prefix, writer.len())), max_decoded))
}

fn result_label(upstream: &str, result: &str) -> Vec<(String, String)> {
    vec![("upstream".to_string(), upstream.to_string()), ("result".to_string(), result.to_string())]
}

/// Resolves once nobody has read or waited for `fill` for `grace` (a fill kept for a prefetch
/// never does). Readers hold a subscription to the fill's state; a client between its claim and
/// its first read has none for a moment, which the grace period covers.
async fn abandoned(fill: &Fill, grace: std::time::Duration) {
    let tick = grace
        .checked_div(4)
        .unwrap_or_default()
        .clamp(std::time::Duration::from_millis(10), std::time::Duration::from_secs(1));
    let mut idle_since: Option<Instant> = None;
    loop {
        if fill.info.is_cancelled() {
            return;
        }
        if fill.keep.load(std::sync::atomic::Ordering::Relaxed) || fill.state.receiver_count() > 0 {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= grace {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            () = fill.info.cancel.notified() => {}
        }
    }
}

impl Fill {
    fn new(key: &str, object: &str, writer: &SpoolWriter, gated: bool, info: FillInfo) -> io::Result<Fill> {
        let (state, _) =
            watch::channel(FillState { written: writer.len(), total: None, phase: Phase::Connecting, gated });
        Ok(Fill {
            key: key.to_string(),
            object: object.to_string(),
            keep: std::sync::atomic::AtomicBool::new(false),
            start: std::sync::atomic::AtomicBool::new(true),
            file: Arc::new(writer.read_handle()?),
            window: {
                let w = Arc::new(Window::default());
                if let Some(at) = writer.unstored_from() {
                    w.begin(at);
                }
                w
            },
            room: Mutex::new(None),
            state,
            info,
        })
    }

    /// Bytes before this offset are in the fill's file; from it on (a pass-through fill) only
    /// in memory, for the fill's readers. `u64::MAX` while every byte is stored.
    pub fn stored_until(&self) -> u64 {
        self.window.from()
    }

    /// `n` more bytes of this fill are on disk: the room it was given shrinks by them.
    fn wrote(&self, n: u64) {
        if let Some(r) = self.room.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            r.wrote(n);
        }
    }

    /// Whether this fill stopped storing its bytes (the data directory could not take them).
    pub fn is_pass_through(&self) -> bool {
        self.window.passing_through()
    }

    /// What operators see of this fill now.
    pub fn view(&self) -> FillView {
        let s = self.state.borrow().clone();
        let (rate, eta) = rate_and_eta(s.written, s.total, self.info.began.elapsed());
        FillView {
            id: self.info.id.clone(),
            upstream: self.info.upstream.clone(),
            object: self.object.clone(),
            path: self.info.path.clone(),
            phase: match s.phase {
                Phase::Connecting => "connecting",
                Phase::Streaming => "streaming",
                Phase::Verified(_) => "verified",
                Phase::Committed(_) => "committed",
                Phase::PassedThrough(_) => "passed_through",
                Phase::Failed(_) => "failed",
            },
            bytes: s.written,
            total: s.total,
            rate,
            eta_seconds: eta,
            retries: self.info.retries.load(std::sync::atomic::Ordering::Relaxed),
            clients: self.state.receiver_count(),
            served: self.info.served.load(std::sync::atomic::Ordering::Relaxed),
            started_at: epoch(self.info.started),
        }
    }

    /// Never cancel this fill for want of readers (a prefetch or an import waits for it by
    /// polling, without reading).
    pub fn keep(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every change of the fill's state.
    pub(crate) fn subscribe(&self) -> watch::Receiver<FillState> {
        self.state.subscribe()
    }

    /// The spool file (readers use this handle, never the path).
    pub(crate) fn file(&self) -> Arc<File> {
        self.file.clone()
    }

    fn fail(&self, e: FetchError) {
        self.state.send_modify(|s| s.phase = Phase::Failed(e));
    }

    pub fn state(&self) -> FillState {
        self.state.borrow().clone()
    }

    /// Whether this call is the first to ask since the fill was created: the request that
    /// started it (its access line says miss however fast a small fill verified meanwhile).
    pub fn take_start(&self) -> bool {
        self.start.swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// Every byte is in and verified (the commit may still be under way): as good as stored.
    pub fn is_verified(&self) -> bool {
        matches!(self.state.borrow().phase, Phase::Verified(_))
    }

    /// Wait for the end of a fill whose content verified: the digest once the object is
    /// committed. None when the content has not verified (the fill may still take long) or the
    /// commit failed.
    pub async fn committed(&self) -> Option<Digest> {
        let mut rx = self.state.subscribe();
        loop {
            match &rx.borrow_and_update().phase {
                Phase::Committed(d) => return Some(*d),
                Phase::Verified(_) => {}
                _ => return None,
            }
            rx.changed().await.ok()?;
        }
    }

    /// Wait until every byte is in and the content verified (or the object is committed), or
    /// the fill failed.
    pub async fn settled(&self) -> FillState {
        let mut rx = self.state.subscribe();
        loop {
            let s = rx.borrow_and_update().clone();
            if !matches!(s.phase, Phase::Connecting | Phase::Streaming) {
                return s;
            }
            if rx.changed().await.is_err() {
                return s;
            }
        }
    }

    /// Wait until the upstream answered (size known, or streaming without one), the object
    /// is committed, or the fill failed.
    pub async fn started(&self) -> FillState {
        let mut rx = self.state.subscribe();
        loop {
            let s = rx.borrow_and_update().clone();
            if !matches!(s.phase, Phase::Connecting) {
                return s;
            }
            if rx.changed().await.is_err() {
                return s;
            }
        }
    }

    /// A reader of bytes `start..end` (`end` None: to the end of the object). `withhold`
    /// keeps the final byte back until the object verified (full-body responses).
    pub fn reader(
        self: &Arc<Self>,
        start: u64,
        end: Option<u64>,
        withhold: bool,
    ) -> BoxStream<'static, io::Result<Bytes>> {
        only_bytes(self.read(start, end, withhold, false))
    }

    /// [`Fill::reader`] for a connection that can send file spans itself (`sendfile`): bytes
    /// the page cache holds come as [`Piece::File`], the rest as bytes.
    pub fn pieces(
        self: &Arc<Self>,
        start: u64,
        end: Option<u64>,
        withhold: bool,
    ) -> BoxStream<'static, io::Result<Piece>> {
        self.read(start, end, withhold, true)
    }

    /// [`Fill::pieces`] (or, without `spans`, [`Fill::reader`]) that hands out nothing until
    /// the fill's content verified: a range of an object from an upstream that is not trusted
    /// with unverified bytes (`rangeBeforeVerify: false`).
    pub fn verified_pieces(
        self: &Arc<Self>,
        start: u64,
        end: Option<u64>,
        spans: bool,
    ) -> BoxStream<'static, io::Result<Piece>> {
        let mut source = ReadSource::new(self.file.clone(), spans);
        source.until_verified = true;
        self.read_from(source, start, end, false)
    }

    /// [`Fill::verified_pieces`] as bytes, for a connection that cannot send file spans.
    pub fn verified_reader(self: &Arc<Self>, start: u64, end: Option<u64>) -> BoxStream<'static, io::Result<Bytes>> {
        only_bytes(self.verified_pieces(start, end, false))
    }

    fn read(&self, start: u64, end: Option<u64>, withhold: bool, spans: bool) -> BoxStream<'static, io::Result<Piece>> {
        self.read_from(ReadSource::new(self.file.clone(), spans), start, end, withhold)
    }

    fn read_from(
        &self,
        mut source: ReadSource,
        start: u64,
        end: Option<u64>,
        withhold: bool,
    ) -> BoxStream<'static, io::Result<Piece>> {
        self.info.served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        source.place = Some(self.window.place(start));
        read_stream(source, self.state.subscribe(), start, end, withhold)
    }
}

/// Part of a body: bytes in memory, or a span of the object's file (at most [`MAX_PIECE`]
/// bytes, in the page cache when handed out) for a connection that sends it with `sendfile`.
#[derive(Debug)]
pub enum Piece {
    Bytes(Bytes),
    File { file: Arc<File>, offset: u64, len: usize },
}

/// The longest piece a reader hands out.
pub const MAX_PIECE: usize = SPAN_CHUNK as usize;

/// A reader of a committed object (no fill involved).
pub fn stored_reader(
    file: File,
    len: u64,
    digest: Digest,
    start: u64,
    end: u64,
) -> BoxStream<'static, io::Result<Bytes>> {
    only_bytes(stored_read(file, len, digest, start, end, false))
}

/// [`stored_reader`] for a connection that can send file spans itself.
pub fn stored_pieces(
    file: File,
    len: u64,
    digest: Digest,
    start: u64,
    end: u64,
) -> BoxStream<'static, io::Result<Piece>> {
    stored_read(file, len, digest, start, end, true)
}

fn stored_read(
    file: File,
    len: u64,
    digest: Digest,
    start: u64,
    end: u64,
    spans: bool,
) -> BoxStream<'static, io::Result<Piece>> {
    let (tx, rx) =
        watch::channel(FillState { written: len, total: Some(len), phase: Phase::Committed(digest), gated: false });
    drop(tx);
    read_stream(ReadSource::new(Arc::new(file), spans), rx, start, Some(end), false)
}

/// A stream read without `spans` holds only bytes.
fn only_bytes(pieces: BoxStream<'static, io::Result<Piece>>) -> BoxStream<'static, io::Result<Bytes>> {
    pieces
        .map(|p| match p? {
            Piece::Bytes(b) => Ok(b),
            Piece::File { .. } => Err(io::Error::other("internal error: a file span on a byte reader")),
        })
        .boxed()
}

/// Where a reader's bytes come from.
struct ReadSource {
    file: Arc<File>,
    /// A fill's reader: its place in the fill's window (bytes a pass-through fill holds only
    /// in memory). None for a stored object.
    place: Option<Place>,
    /// Hand out nothing before the fill's content verified (as for a gated fill).
    until_verified: bool,
    /// Hand out spans of the file the page cache holds instead of reading them.
    spans: bool,
    /// Bytes read per chunk, at most ([`READ_CHUNK`], or less under [`small_reads`]).
    chunk: u64,
}

impl ReadSource {
    fn new(file: Arc<File>, spans: bool) -> ReadSource {
        let chunk = SMALL_READS.try_with(|n| *n).map_or(READ_CHUNK, |n| n.clamp(4096, READ_CHUNK));
        ReadSource { file, place: None, until_verified: false, spans, chunk }
    }
}

tokio::task_local! {
    static SMALL_READS: u64;
}

/// Run `f` with the readers it creates reading at most `chunk` bytes at a time (an HTTP/2
/// stream: what it holds while its window is shut or its peer stops reading is one such chunk
/// beyond what the connection queued).
pub async fn small_reads<F: std::future::Future>(chunk: u64, f: F) -> F::Output {
    SMALL_READS.scope(chunk, f).await
}

/// Whether the page cache holds the first and the last byte of `offset..offset + len`
/// (`RWF_NOWAIT` never waits for the disk): a span to send without blocking on a read. tmpfs
/// and ramfs have no `RWF_NOWAIT` (EOPNOTSUPP), but their pages are memory: always a span.
fn cached(file: &File, offset: u64, len: usize) -> bool {
    let mut probe = [0u8; 1];
    let last = offset.saturating_add(len as u64).saturating_sub(1);
    [offset, last].into_iter().all(|at| {
        let mut iov = [io::IoSliceMut::new(&mut probe)];
        match rustix::io::preadv2(file, &mut iov, at, rustix::io::ReadWriteFlags::NOWAIT) {
            Ok(n) => n == 1,
            Err(rustix::io::Errno::OPNOTSUPP) => in_memory_fs(file),
            Err(_) => false,
        }
    })
}

/// Whether `file` lives on tmpfs or ramfs, where a read never waits for a disk.
fn in_memory_fs(file: &File) -> bool {
    const TMPFS_MAGIC: i128 = 0x0102_1994;
    const RAMFS_MAGIC: i128 = 0x8584_58f6;
    rustix::fs::fstatfs(file).is_ok_and(|s| matches!(i128::from(s.f_type), TMPFS_MAGIC | RAMFS_MAGIC))
}

struct ReadState {
    source: ReadSource,
    rx: watch::Receiver<FillState>,
    pos: u64,
    end: Option<u64>,
    withhold: bool,
    done: bool,
    /// The fill's content verified (the final byte may go out).
    verified: bool,
    pool: BufPool,
}

fn read_stream(
    source: ReadSource,
    rx: watch::Receiver<FillState>,
    start: u64,
    end: Option<u64>,
    withhold: bool,
) -> BoxStream<'static, io::Result<Piece>> {
    let st =
        ReadState { source, rx, pos: start, end, withhold, done: false, verified: false, pool: BufPool::default() };
    futures::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            let s = st.rx.borrow_and_update().clone();
            let committed = match &s.phase {
                // The content verified before the commit failed: what the reader gets is right,
                // and its open handle still has every byte.
                Phase::Failed(_) if st.verified => true,
                Phase::Verified(_) | Phase::PassedThrough(_) => {
                    st.verified = true;
                    true
                }
                Phase::Failed(e) => {
                    st.done = true;
                    return Some((Err(io::Error::other(format!("upstream transfer failed: {e}"))), st));
                }
                Phase::Committed(_) => true,
                _ => false,
            };
            let end = st.end.or(s.total).or(if committed { Some(s.written) } else { None });
            if end.is_some_and(|e| st.pos >= e) {
                return None;
            }
            // A gated fill hands out nothing before its content matched the trust record.
            let mut limit = if (s.gated || st.source.until_verified) && !committed { st.pos } else { s.written };
            if let Some(e) = end {
                limit = limit.min(e);
                if st.withhold && !committed {
                    limit = limit.min(e.saturating_sub(1));
                }
            }
            if st.pos < limit {
                if let Some(place) = &st.source.place {
                    // Loaded after the state: bytes announced past the switch are never in the file.
                    let from = place.window().from();
                    if st.pos >= from {
                        let n = (limit.saturating_sub(st.pos)).min(SPAN_CHUNK);
                        return match place.window().read(st.pos, n) {
                            Ok(b) => {
                                st.pos = st.pos.saturating_add(b.len() as u64);
                                place.set(st.pos);
                                Some((Ok(Piece::Bytes(b)), st))
                            }
                            Err(behind) => {
                                st.done = true;
                                Some((Err(io::Error::other(behind.to_string())), st))
                            }
                        };
                    }
                    limit = limit.min(from);
                }
                let (file, pos) = (st.source.file.clone(), st.pos);
                if st.source.spans {
                    // pos < limit, and a span is at most SPAN_CHUNK: both fit.
                    let n = (limit.saturating_sub(pos)).min(SPAN_CHUNK) as usize;
                    if cached(&file, pos, n) {
                        st.pos = st.pos.saturating_add(n as u64);
                        if let Some(place) = &st.source.place {
                            place.set(st.pos);
                        }
                        return Some((Ok(Piece::File { file, offset: pos, len: n }), st));
                    }
                }
                let n = (limit.saturating_sub(pos)).min(st.source.chunk) as usize;
                let read = st.pool.read_at(file, pos, n, st.source.chunk as usize).await;
                return match read {
                    Ok(b) => {
                        st.pos = st.pos.saturating_add(b.len() as u64);
                        if let Some(place) = &st.source.place {
                            place.set(st.pos);
                        }
                        Some((Ok(Piece::Bytes(b)), st))
                    }
                    // The fill moved these bytes to memory and emptied its file meanwhile (a
                    // pass-through): read them there.
                    Err(_) if st.source.place.as_ref().is_some_and(|p| p.window().from() <= pos) => continue,
                    Err(e) => {
                        st.done = true;
                        Some((Err(e), st))
                    }
                };
            }
            if committed {
                // Everything up to `end` was read, or the object is shorter than asked.
                return None;
            }
            // Caught up with the fill: wake for a batch of new bytes (or the end, or a change of
            // phase), not for every chunk appended, so N followers do not each turn every small
            // append into a read and a socket write.
            let (pos, asked_end, withhold, hold) = (st.pos, st.end, st.withhold, st.source.until_verified);
            let batch = if st.source.spans { SPAN_BATCH } else { st.source.chunk };
            let ready = move |s: &FillState| {
                if !matches!(s.phase, Phase::Connecting | Phase::Streaming) {
                    return true;
                }
                if s.gated || hold {
                    return false;
                }
                // What this reader may read now, and the most it will ever read before the end.
                let end = asked_end.or(s.total);
                let mut limit = s.written;
                let mut last = u64::MAX;
                if let Some(e) = end {
                    last = if withhold { e.saturating_sub(1) } else { e };
                    limit = limit.min(last);
                }
                limit > pos && (limit.saturating_sub(pos) >= batch || limit >= last)
            };
            // A slow upstream still reaches the client: whatever arrived goes out after BATCH_WAIT.
            let sender_gone = matches!(tokio::time::timeout(BATCH_WAIT, st.rx.wait_for(ready)).await, Ok(Err(_)));
            if sender_gone {
                st.done = true;
                return Some((Err(io::Error::other("upstream transfer ended without result")), st));
            }
        }
    })
    .boxed()
}

/// The read buffers of one reader. A chunk handed to the response goes back to its reader's pool
/// once the connection wrote it, so a long read reuses a few buffers instead of allocating (and
/// page-faulting, and zeroing) a fresh one for every chunk: on the hot path that churn cost more
/// CPU than the copies themselves.
#[derive(Clone, Default)]
struct BufPool(Arc<Mutex<Vec<Vec<u8>>>>);

/// A pool buffer lent to a `Bytes`; returns home when the last reference drops.
struct Lent {
    buf: Vec<u8>,
    len: usize,
    home: BufPool,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut free = self.home.0.lock().unwrap_or_else(|p| p.into_inner());
        // A reader has at most a few chunks in flight; keep that many.
        if free.len() < 4 {
            free.push(buf);
        }
    }
}

impl BufPool {
    /// `n` (at most the reader's chunk, `size`) bytes at `pos`, in a pooled buffer of `size`. What the page cache holds
    /// is copied right here (`preadv2` with `RWF_NOWAIT` never waits for the disk); only the rest
    /// goes to the blocking pool, so a hot object costs no thread hand-off per chunk and a cold
    /// disk never stalls the runtime.
    async fn read_at(&self, file: Arc<File>, pos: u64, n: usize, size: usize) -> io::Result<Bytes> {
        let taken = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut buf = taken.filter(|b| b.len() >= n).unwrap_or_else(|| vec![0u8; size.max(n)]);
        let mut have = 0;
        while have < n {
            let mut iov = [io::IoSliceMut::new(&mut buf[have..n])];
            match rustix::io::preadv2(
                &*file,
                &mut iov,
                pos.saturating_add(have as u64),
                rustix::io::ReadWriteFlags::NOWAIT,
            ) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "object shorter than expected")),
                Ok(got) => have = have.saturating_add(got),
                Err(rustix::io::Errno::INTR) => {}
                // Not cached (EAGAIN), or a kernel or file system without RWF_NOWAIT.
                Err(_) => break,
            }
        }
        if have < n {
            buf = tokio::task::spawn_blocking(move || {
                file.read_exact_at(&mut buf[have..n], pos.saturating_add(have as u64)).map(|()| buf)
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)))?;
        }
        Ok(Bytes::from_owner(Lent { buf, len: n, home: self.clone() }))
    }
}

/// Upstream chunks already received are joined up to this size before they are written and
/// announced to readers: fewer writes and wake-ups, and readers get whole chunks to send.
const COALESCE: usize = 256 * 1024;

/// Join chunks that are ready now (never waiting for more: a slow upstream's bytes go out as
/// they come). An error after some bytes is reported after those bytes.
fn coalesce(body: BoxStream<'static, Result<Bytes, FetchError>>) -> BoxStream<'static, Result<Bytes, FetchError>> {
    struct St {
        body: BoxStream<'static, Result<Bytes, FetchError>>,
        pending: Option<FetchError>,
        ended: bool,
    }
    futures::stream::unfold(St { body, pending: None, ended: false }, |mut st| async move {
        if let Some(e) = st.pending.take() {
            st.ended = true;
            return Some((Err(e), st));
        }
        if st.ended {
            return None;
        }
        let first = match st.body.next().await {
            None => return None,
            Some(Err(e)) => {
                st.ended = true;
                return Some((Err(e), st));
            }
            Some(Ok(b)) => b,
        };
        if first.len() >= COALESCE {
            return Some((Ok(first), st));
        }
        // Copy only to join: a chunk with nothing else ready goes on as it came.
        let second = match futures::FutureExt::now_or_never(st.body.next()) {
            None => return Some((Ok(first), st)),
            Some(None) => {
                st.ended = true;
                return Some((Ok(first), st));
            }
            Some(Some(Err(e))) => {
                st.pending = Some(e);
                return Some((Ok(first), st));
            }
            Some(Some(Ok(b))) => b,
        };
        let mut buf = bytes::BytesMut::with_capacity(COALESCE.max(first.len().saturating_add(second.len())));
        buf.extend_from_slice(&first);
        buf.extend_from_slice(&second);
        while buf.len() < COALESCE {
            match futures::FutureExt::now_or_never(st.body.next()) {
                Some(Some(Ok(b))) => buf.extend_from_slice(&b),
                Some(Some(Err(e))) => {
                    st.pending = Some(e);
                    break;
                }
                Some(None) => {
                    st.ended = true;
                    break;
                }
                None => break,
            }
        }
        Some((Ok(buf.freeze()), st))
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    fn chunk(n: usize, b: u8) -> Result<Bytes, FetchError> {
        Ok(Bytes::from(vec![b; n]))
    }

    #[tokio::test]
    async fn should_join_ready_chunks_and_report_an_error_after_the_bytes_before_it() {
        let items = vec![chunk(1000, 1), chunk(2000, 2), Err(FetchError::new(FetchErrorKind::Body, "up", "reset"))];
        let mut s = coalesce(futures::stream::iter(items).boxed());
        let joined = s.next().await.unwrap().unwrap();
        assert_eq!(joined.len(), 3000);
        assert_eq!((joined[0], joined[2999]), (1, 2));
        assert_eq!(s.next().await.unwrap().unwrap_err().kind, FetchErrorKind::Body);
        assert!(s.next().await.is_none());
    }

    #[tokio::test]
    async fn should_cap_joined_chunks_and_never_wait_for_more() {
        let big = futures::stream::iter((0..10).map(|i| chunk(100 * 1024, i))).boxed();
        let sizes: Vec<usize> = coalesce(big).map(|c| c.unwrap().len()).collect().await;
        assert_eq!(sizes.iter().sum::<usize>(), 1000 * 1024);
        assert!(sizes.iter().all(|&n| n < COALESCE + 100 * 1024), "{sizes:?}");
        assert!(sizes.len() < 10, "ready chunks were joined: {sizes:?}");
        // A chunk that is not there yet is not waited for: the first one goes out alone.
        let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, FetchError>>();
        let alone = Bytes::from(vec![7u8; 10]);
        let at = alone.as_ptr();
        tx.unbounded_send(Ok(alone)).unwrap();
        let mut s = coalesce(rx.boxed());
        let got = s.next().await.unwrap().unwrap();
        assert_eq!((got.len(), got.as_ptr()), (10, at), "a chunk alone goes on without a copy");
        tx.unbounded_send(chunk(20, 8)).unwrap();
        drop(tx);
        assert_eq!(s.next().await.unwrap().unwrap().len(), 20);
        assert!(s.next().await.is_none());
    }

    #[test]
    fn should_count_a_tmpfs_file_as_cached() {
        // tmpfs answers RWF_NOWAIT with EOPNOTSUPP; its pages are memory all the same (with /tmp
        // on tmpfs nothing went out with sendfile and the span tests failed before)
        let shm = std::path::Path::new("/dev/shm");
        assert!(shm.is_dir(), "Linux mounts a tmpfs on /dev/shm");
        let dir = tempfile::tempdir_in(shm).unwrap();
        let path = dir.path().join("object");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let file = File::open(&path).unwrap();
        assert!(in_memory_fs(&file));
        assert!(cached(&file, 0, 8192), "a tmpfs file is a span to send");
        let disk = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = disk.path().join("object");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        assert!(!in_memory_fs(&File::open(&path).unwrap()), "the source tree is not on tmpfs");
    }

    #[tokio::test]
    async fn should_hand_out_cached_bytes_as_file_spans_and_withhold_the_last_until_verified() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), tender_store::OpenMode::Exclusive).unwrap();
        let mut writer = store.create_spool("k", Algorithm::Sha256).unwrap();
        let fill = Arc::new(Fill::new("k", "k", &writer, false, FillInfo::new("k", "u", "")).unwrap());
        let content: Vec<u8> = (0..MAX_PIECE + 100).map(|i| (i % 251) as u8).collect();
        writer.append(&content).unwrap();
        fill.state.send_modify(|s| {
            s.written = content.len() as u64;
            s.total = Some(content.len() as u64);
            s.phase = Phase::Streaming;
        });
        let mut pieces = fill.pieces(0, None, true);
        let spans = [pieces.next().await.unwrap().unwrap(), pieces.next().await.unwrap().unwrap()];
        let got: Vec<(u64, usize)> = spans
            .iter()
            .map(|p| match p {
                Piece::File { offset, len, .. } => (*offset, *len),
                Piece::Bytes(_) => panic!("bytes just written are in the page cache: a span"),
            })
            .collect();
        assert_eq!(got, [(0, MAX_PIECE), (MAX_PIECE as u64, 99)], "the last byte waits for the verdict");
        let waiting = futures::FutureExt::now_or_never(pieces.next());
        assert!(waiting.is_none(), "nothing more before the content verified");
        fill.state.send_modify(|s| s.phase = Phase::Verified(Digest::of(&content)));
        match pieces.next().await.unwrap().unwrap() {
            Piece::File { offset, len, .. } => assert_eq!((offset, len), (content.len() as u64 - 1, 1)),
            Piece::Bytes(_) => panic!("a span"),
        }
        assert!(pieces.next().await.is_none());
        let bytes: Vec<u8> = fill.reader(0, None, false).map(|b| b.unwrap().to_vec()).concat().await;
        assert_eq!(bytes, content, "a byte reader reads the same bytes");
        writer.discard();
    }

    /// Issue 19: the fill-lease holder's streamer writes the last, shorter chunk as soon as the
    /// content verified, so the replicas following the upload get their last bytes without
    /// waiting for the upload that follows the commit (3.2 s of re-hashing for 1 GiB).
    #[tokio::test]
    async fn should_stream_the_last_partial_chunk_once_the_content_verified() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), tender_store::OpenMode::Exclusive).unwrap();
        let mut writer = store.create_spool("k", Algorithm::Sha256).unwrap();
        let fill = Arc::new(Fill::new("k", "k", &writer, false, FillInfo::new("k", "u", "")).unwrap());
        let mut settings = tender_bucket::BucketSettings::new("fleet");
        settings.chunk_size = 1 << 20;
        let mem = Arc::new(object_store::memory::InMemory::new());
        let bucket = Bucket::with_store(mem, settings, tender_bucket::BucketMetrics::default());
        let content: Vec<u8> = (0..(2 << 20) + 333).map(|i| (i % 251) as u8).collect();
        let d = Digest::of(&content);
        let key = format!("u@{d}");
        let streamer = crate::shared::spawn_streamer(bucket.clone(), fill.clone(), Some(d), key.clone());
        writer.append(&content).unwrap();
        fill.state.send_modify(|s| {
            s.written = content.len() as u64;
            s.total = Some(content.len() as u64);
            s.phase = Phase::Streaming;
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while bucket.progress(&key).await.unwrap().is_none_or(|p| p.chunks.len() < 2) {
            assert!(std::time::Instant::now() < deadline, "the two whole chunks were never listed");
            tokio::task::yield_now().await;
        }
        assert_eq!(
            bucket.progress(&key).await.unwrap().unwrap().chunks.len(),
            2,
            "not the partial one while streaming"
        );
        fill.state.send_modify(|s| s.phase = Phase::Verified(d));
        let upload = streamer.await.unwrap().expect("the streamed upload");
        assert_eq!(upload.chunks().await.len(), 3, "the last chunk, 333 bytes, was written by the streamer");
        let listed = bucket.progress(&key).await.unwrap().unwrap();
        assert_eq!(listed.chunks.len(), 3, "and listed for the waiters");
        writer.discard();
    }

    #[tokio::test]
    async fn should_wait_for_the_commit_only_once_the_content_verified() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), tender_store::OpenMode::Exclusive).unwrap();
        let writer = store.create_spool("k", Algorithm::Sha256).unwrap();
        let fill = Arc::new(Fill::new("k", "k", &writer, false, FillInfo::new("k", "u", "")).unwrap());
        fill.state.send_modify(|s| s.phase = Phase::Streaming);
        assert_eq!(fill.committed().await, None, "a fill still streaming is not waited for");
        let d = Digest::of(b"x");
        fill.state.send_modify(|s| s.phase = Phase::Verified(d));
        let waiter = tokio::spawn({
            let fill = fill.clone();
            async move { fill.committed().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a verified fill is waited for until its commit");
        fill.state.send_modify(|s| s.phase = Phase::Committed(d));
        assert_eq!(waiter.await.unwrap(), Some(d));
        fill.state.send_modify(|s| s.phase = Phase::Verified(d));
        let waiter = tokio::spawn({
            let fill = fill.clone();
            async move { fill.committed().await }
        });
        tokio::task::yield_now().await;
        fill.fail(FetchError::new(FetchErrorKind::Local, "u", "commit: disk full"));
        assert_eq!(waiter.await.unwrap(), None, "a failed commit gives no digest");
        writer.discard();
    }

    /// Where a span starts and how long it is.
    fn span(p: Piece) -> (u64, usize) {
        match p {
            Piece::File { offset, len, .. } => (offset, len),
            Piece::Bytes(_) => panic!("bytes just written are in the page cache: a span"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn should_release_spans_to_a_caught_up_reader_in_batches_or_after_the_batch_wait() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), tender_store::OpenMode::Exclusive).unwrap();
        let mut writer = store.create_spool("k", Algorithm::Sha256).unwrap();
        let fill = Arc::new(Fill::new("k", "k", &writer, false, FillInfo::new("k", "u", "")).unwrap());
        let total = 2 * SPAN_BATCH;
        let mut append = |n: u64| {
            writer.append(&vec![7u8; n as usize]).unwrap();
            let written = writer.len();
            fill.state.send_modify(|s| {
                s.written = written;
                s.total = Some(total);
                s.phase = Phase::Streaming;
            });
        };
        append(SPAN_CHUNK);
        let mut pieces = fill.pieces(0, None, true);
        assert_eq!(span(pieces.next().await.unwrap().unwrap()), (0, MAX_PIECE), "bytes already there go at once");
        // The reader's next piece, awaited in a task while the fill appends: the piece and how
        // long it took.
        let next = |mut pieces: BoxStream<'static, io::Result<Piece>>| {
            tokio::spawn(async move {
                let t0 = tokio::time::Instant::now();
                let p = span(pieces.next().await.unwrap().unwrap());
                (p, t0.elapsed(), pieces)
            })
        };

        // Caught up: less than a batch goes out after the batch wait.
        let reader = next(pieces);
        tokio::task::yield_now().await;
        append(SPAN_CHUNK / 2);
        let (first, waited, pieces) = reader.await.unwrap();
        assert_eq!(first, (SPAN_CHUNK, MAX_PIECE / 2));
        assert_eq!(waited, BATCH_WAIT, "a small append reached the client after the batch wait");

        // Caught up again: a whole batch wakes the reader at once, then goes out in spans.
        let reader = next(pieces);
        tokio::task::yield_now().await;
        append(SPAN_BATCH);
        let (first, waited, mut pieces) = reader.await.unwrap();
        assert_eq!(first, (SPAN_CHUNK * 3 / 2, MAX_PIECE));
        assert!(waited < BATCH_WAIT, "a whole batch does not wait for the timer: {waited:?}");
        let mut at = SPAN_CHUNK * 5 / 2;
        while at < SPAN_CHUNK * 3 / 2 + SPAN_BATCH {
            let (offset, len) = span(pieces.next().await.unwrap().unwrap());
            assert_eq!(offset, at);
            at += len as u64;
        }
        let t0 = tokio::time::Instant::now();
        fill.state.send_modify(|s| s.phase = Phase::Failed(FetchError::new(FetchErrorKind::Body, "u", "cut")));
        assert!(pieces.next().await.unwrap().is_err(), "a failed fill ends the reader");
        assert!(t0.elapsed() < BATCH_WAIT, "a change of phase does not wait for a batch");
        writer.discard();
    }
}
