//! Shared storage in an S3-compatible bucket, in front of which each replica's data directory
//! is a spool and read cache.
//!
//! Layout under the configured prefix (bucket format 4, see [`BUCKET_FORMAT`]); `<alg>` is the
//! digest's algorithm, `sha256` or `sha512`:
//! ```text
//! tender-bucket.json            the bucket format; a replica refuses a newer one
//! parts/<upload>/<i>            content, one object per chunk of chunkSize, written by one
//!                               upload as the chunks land (see [`parts`])
//! progress/<sha256(key)>.json   an upload in progress: each chunk written so far (its link in
//!                               the object's sha256, module [`chain`], or its sha256);
//!                               replicas waiting on the fill lease `key` read chunks as they
//!                               appear instead of waiting for the index
//! objects/<alg>/<hex>           content as one object (written before format 3; still read)
//! index/<alg>/<hex>.json        size, chunk size, the upload that wrote the chunks, and each
//!                               chunk as a link of the object's sha256 with the states every
//!                               MiB inside it (format 3, module [`chain`]) or, format 2, the
//!                               sha256 of every chunk and of its sub-chunks of 1 MiB;
//!                               written last, after the content was hashed
//!                               (with <alg>) and uploaded: an object without its index does
//!                               not exist for readers
//! known/<alg>/<hex>/<sha256(upstream)>.json
//!                               the object is known to exist in that upstream (create-only;
//!                               an object without one is known in no upstream)
//! trust/<sha256(key)>.json      first verified digest of an Image Factory asset
//! leases/<sha256(key)>.json     the replica fetching `key` from upstream now (conditional create)
//! quarantine/<alg>/<hex>        content `tender fsck --repair` found corrupt (moved, never deleted)
//! served/<replica>/<shard>.json
//!                               digest → when this replica last served it (seconds), for the
//!                               digests whose hex starts with <shard> (0-f); flushed in batches
//!                               (module `served`), merged by `tender gc --bucket` (module `gc`)
//! uploads/<alg>/<hex>/<sha256(upload id)>.json
//!                               a multipart upload by a tender before format 3 (see
//!                               [`uploads`]): one left unrenewed is abandoned and aborted
//! ```
//! The `sha512/` trees sit beside the `sha256/` ones in the same format: a format-2 bucket
//! written before tender knew sha512 is read as is.
//! Every read fetches whole chunks and checks each against the index before a byte of it is
//! handed on; a range that needs only part of a chunk fetches only the 1 MiB pieces that cover
//! it, each checked the same way (from the state before them, or their sha256).
//! A chunk missing under its index is put back by the next replica that holds the object's
//! verified bytes (module `heal`): never by rewriting the index, never over a chunk that exists.
//!
//! Every request has a deadline (`requestTimeout`, retries included); one that fails or times
//! out opens the [`breaker`], and until a background probe ([`Bucket::spawn_prober`]) gets
//! through every call fails at once with [`BucketError::Down`]: no request path waits on a
//! bucket that is down.

mod books;
pub mod breaker;
pub mod chain;
mod gc;
mod heal;
mod index;
mod lease;
mod maintenance;
mod metrics;
pub mod parts;
mod served;
mod settings;
mod uploads;

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use sha2::{Digest as _, Sha256};
use tender_oci::Digest;
use tender_store::TrustRecord;

pub use books::Stray;
pub use breaker::{BucketState, Cause};
pub use gc::{BucketGcReport, EvictedObject};
pub use heal::HealReport;
pub use index::ChunkIndex;
pub use lease::{GiveUp, Lease, LeaseOutcome};
pub use maintenance::{BucketFsckReport, BucketProblem};
pub use metrics::BucketMetrics;
pub use parts::{PartUpload, Progress};
pub use served::SERVED_PER_SHARD;
pub use settings::{
    BucketSettings, Credentials, IndexKey, MAX_CHUNK_SIZE, MAX_SUB_CHUNKS, MIN_CHUNK_SIZE, SUB_CHUNK_SIZE,
};
pub use uploads::AbandonedUpload;

/// Chunks a copy into a replica's cache requests at once (so holds in memory at most).
pub const COPY_AHEAD: usize = 4;
/// Indexes kept in memory (they never change once written); the map is cleared when full.
const INDEX_CACHE: usize = 8192;
/// The longest record (index, progress, lease, trust, served) read: the index of a 64 GiB
/// object in chunks of 5 MiB is about 900 KB.
const RECORD_MAX: u64 = 16 << 20;
/// Known-upstream records remembered (positive answers only); the set is cleared when full.
const KNOWN_CACHE: usize = 65536;
/// The bucket format this tender writes: 2 added `known/` (format 1 had no marker file), 3
/// content as chunk objects (`parts/`, `progress/`; index format 2), which a replica of
/// format 2 cannot read, 4 chunks listed as links of the object's own sha256 (index format 3,
/// [`chain`]), which a replica of format 3 would misread as chunk hashes.
pub const BUCKET_FORMAT: u32 = 4;
const FORMAT_KEY: &str = "tender-bucket.json";

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct BucketFormat {
    format: u32,
    created_by: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct KnownMarker {
    digest: Digest,
    upstream: String,
    replica: String,
}

#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    #[error("bucket {bucket}: {op} {key}: {source}")]
    Store {
        bucket: String,
        op: &'static str,
        key: String,
        #[source]
        source: Box<object_store::Error>,
    },
    #[error("bucket {bucket}: {key}: {message}")]
    Corrupt { bucket: String, key: String, message: String },
    #[error("bucket {bucket}: {message}")]
    Setup { bucket: String, message: String },
    #[error("bucket {bucket}: {op} {key}: no answer within {after:?} (storage.s3.requestTimeout)")]
    Timeout { bucket: String, op: &'static str, key: String, after: Duration },
    #[error("bucket {bucket} is down ({cause}); not asked until a probe gets through")]
    Down { bucket: String, cause: &'static str },
    #[error("bucket {bucket}: reading {path}: {source}")]
    Local {
        bucket: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl BucketError {
    /// Content that does not match its index (never retried, never served).
    pub fn is_corrupt(&self) -> bool {
        matches!(self, BucketError::Corrupt { .. })
    }

    /// What the error says about the bucket (why it is down), if anything.
    pub fn cause(&self) -> Option<Cause> {
        match self {
            BucketError::Store { source, .. } => Cause::of(source),
            BucketError::Timeout { .. } => Some(Cause::Timeout),
            BucketError::Setup { .. } => Some(Cause::Error),
            BucketError::Corrupt { .. } | BucketError::Down { .. } | BucketError::Local { .. } => None,
        }
    }

    /// The breaker is open: the bucket was not asked.
    pub fn is_down(&self) -> bool {
        matches!(self, BucketError::Down { .. })
    }

    /// The bucket has no such key (any more).
    pub fn is_not_found(&self) -> bool {
        matches!(self, BucketError::Store { source, .. } if matches!(**source, object_store::Error::NotFound { .. }))
    }
}

/// A bucket shared by the replicas.
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// The same store, for multipart uploads by id (so an abandoned one can be aborted).
    multipart: Arc<dyn MultipartStore>,
    settings: BucketSettings,
    indexes: Mutex<HashMap<Digest, Arc<ChunkIndex>>>,
    known: Mutex<std::collections::HashSet<(Digest, String)>>,
    metrics: BucketMetrics,
    breaker: breaker::Breaker,
    /// The last check found conditional writes; without them the replica runs as with
    /// `lease: false`.
    conditional: AtomicBool,
    /// Objects this replica served since the last flush of its served records, and when
    /// (seconds since the Unix epoch; module `served`).
    served: Mutex<HashMap<Digest, u64>>,
    /// What each index names, by index key, as last read (module `books`).
    names: Mutex<HashMap<String, books::IndexEntry>>,
    /// When (ms after `epoch`) the bucket last answered a small request (not a chunk's): a
    /// chunk that times out after it began is the bucket being slow, not hung.
    small_answered_ms: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
    /// Until when (ms after `epoch`) the bucket counts as slow ([`Bucket::note_slow`]).
    slow_until_ms: std::sync::atomic::AtomicU64,
    /// Objects whose missing chunks this replica is putting back now (module `heal`).
    healing: Mutex<std::collections::HashSet<Digest>>,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("settings", &self.settings).finish_non_exhaustive()
    }
}

fn key_hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

impl Bucket {
    /// A client for the configured bucket (no request is made yet; see [`Bucket::check`]).
    pub fn new(settings: BucketSettings, metrics: BucketMetrics) -> Result<Arc<Bucket>, BucketError> {
        let store = settings.build()?;
        Ok(Bucket::with_store(store, settings, metrics))
    }

    /// A bucket over any object store (tests use the in-memory one).
    pub fn with_store<S: ObjectStore + MultipartStore>(
        store: Arc<S>,
        settings: BucketSettings,
        metrics: BucketMetrics,
    ) -> Arc<Bucket> {
        let breaker = breaker::Breaker::new(settings.probe_interval, &metrics);
        metrics.conditional_writes.set(1);
        Arc::new(Bucket {
            multipart: store.clone(),
            store,
            settings,
            indexes: Mutex::new(HashMap::new()),
            known: Mutex::default(),
            metrics,
            breaker,
            conditional: AtomicBool::new(true),
            served: Mutex::default(),
            names: Mutex::default(),
            healing: Mutex::default(),
            small_answered_ms: std::sync::atomic::AtomicU64::new(0),
            slow_until_ms: std::sync::atomic::AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        })
    }

    /// Up, or down and why (for `/readyz`, the status page).
    pub fn state(&self) -> BucketState {
        self.breaker.state()
    }

    /// Up, but slow: chunks keep failing for `slow` right after probes close the breaker, or a
    /// fill went to the upstream because the bucket was measured slower ([`Bucket::note_slow`])
    /// not long ago.
    pub fn is_slow(&self) -> bool {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.breaker.is_slow() || now < self.slow_until_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A fill bypassed the bucket as slower than its upstream: `degraded (slow)` for `for_`.
    pub fn note_slow(&self, for_: std::time::Duration) {
        self.metrics.bypassed_slow.inc();
        let until = self.epoch.elapsed().saturating_add(for_);
        let until = u64::try_from(until.as_millis()).unwrap_or(u64::MAX);
        self.slow_until_ms.fetch_max(until, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether fills take a lease: `lease: true` and the last check found conditional writes.
    pub fn lease_enabled(&self) -> bool {
        self.settings.lease && self.conditional.load(Ordering::Acquire)
    }

    /// Refuse at once while the breaker is open.
    fn ensure_up(&self) -> Result<(), BucketError> {
        if self.breaker.is_up() {
            return Ok(());
        }
        let cause = match self.breaker.state() {
            BucketState::Down { cause, .. } => cause.as_str(),
            BucketState::Up => "recovering",
        };
        Err(BucketError::Down { bucket: self.settings.bucket.clone(), cause })
    }

    /// One request to the bucket: refused at once while it is down, else given
    /// `requestTimeout`; a timeout opens the breaker. The inner result is the store's answer
    /// (map its errors with [`Bucket::store_err`], which opens the breaker on a failure).
    async fn call<T>(
        &self,
        op: &'static str,
        p: &ObjectPath,
        fut: impl Future<Output = object_store::Result<T>>,
    ) -> Result<object_store::Result<T>, BucketError> {
        self.ensure_up()?;
        self.timed(op, p, fut).await
    }

    /// [`Bucket::call`] without the breaker's gate (the probe's own requests).
    async fn timed<T>(
        &self,
        op: &'static str,
        p: &ObjectPath,
        fut: impl Future<Output = object_store::Result<T>>,
    ) -> Result<object_store::Result<T>, BucketError> {
        let after = self.settings.request_timeout;
        let began = std::time::Instant::now();
        let bulk = is_bulk(op, p);
        match tokio::time::timeout(after, fut).await {
            Ok(r) => {
                // Each request and what it cost (TENDER_LOG=tender_bucket=trace).
                tracing::trace!(op, key = %p, ms = began.elapsed().as_secs_f64() * 1e3, ok = r.is_ok(), "bucket request");
                let failed = r.as_ref().err().and_then(Cause::of);
                // The S3 client has `requestTimeout` too; its own timeout reads as a failed
                // request ("error sending request") but is a timeout.
                if failed.is_some_and(|c| c != Cause::Denied) && began.elapsed() >= after.mul_f64(0.9) {
                    return Err(self.timed_out(op, p, began, bulk));
                }
                if failed.is_none() && !bulk {
                    self.small_answered();
                }
                Ok(r)
            }
            Err(_) => Err(self.timed_out(op, p, began, bulk)),
        }
    }

    /// A request that got no answer within `requestTimeout`: the breaker opens, for `slow` when
    /// it moved a chunk and the bucket answered a small request meanwhile, else `timeout`.
    fn timed_out(&self, op: &'static str, p: &ObjectPath, began: std::time::Instant, bulk: bool) -> BucketError {
        self.metrics.errors.get_or_create(&vec![("op".to_string(), op.to_string())]).inc();
        let after = self.settings.request_timeout;
        let e = BucketError::Timeout { bucket: self.settings.bucket.clone(), op, key: p.to_string(), after };
        let began_ms = u64::try_from(began.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX);
        let answered = self.small_answered_ms.load(std::sync::atomic::Ordering::Relaxed);
        let cause = if bulk && answered > began_ms { Cause::Slow } else { Cause::Timeout };
        self.trip(cause, &e);
        e
    }

    fn small_answered(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX).max(1);
        self.small_answered_ms.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
    }

    fn trip(&self, cause: Cause, e: &BucketError) {
        if self.breaker.fail(cause, e.to_string()) {
            tracing::warn!(bucket = %self.settings.bucket, cause = cause.as_str(), error = %e,
                probe_in = ?self.breaker.interval(),
                "shared bucket down: serving from local copies and upstreams without asking it until a probe gets through");
        }
    }

    /// Probe a bucket that is down in the background, with backoff, until the bucket is
    /// dropped; each probe is the start-up check ([`Bucket::probe`]).
    pub fn spawn_prober(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(b) = weak.upgrade() else { return };
                let wait = match b.breaker.next_probe() {
                    Some(at) => at.saturating_duration_since(std::time::Instant::now()),
                    None => b.breaker.interval(),
                };
                if wait.is_zero() {
                    b.probe().await;
                    continue;
                }
                drop(b);
                tokio::time::sleep(wait).await;
            }
        })
    }

    /// Check the bucket as at start ([`Bucket::check`]), past the breaker: on success the
    /// breaker closes. A bucket without conditional writes is used as with `lease: false`.
    pub async fn probe(&self) -> bool {
        match self.check_writes(false).await {
            Ok(conditional) => {
                self.metrics.probe("ok");
                self.set_conditional(conditional);
                if self.breaker.probe_ok() {
                    tracing::info!(bucket = %self.settings.bucket, lease = self.lease_enabled(), "shared bucket up again");
                }
                true
            }
            Err(e) => {
                self.metrics.probe("failed");
                let cause = e.cause().unwrap_or(Cause::Error);
                self.breaker.probe_failed(cause, e.to_string());
                let next = self.breaker.next_probe().map(|t| t.saturating_duration_since(std::time::Instant::now()));
                tracing::warn!(bucket = %self.settings.bucket, cause = cause.as_str(), error = %e, next_probe = ?next,
                    "shared bucket still down");
                false
            }
        }
    }

    fn set_conditional(&self, conditional: bool) {
        self.metrics.conditional_writes.set(i64::from(conditional));
        let was = self.conditional.swap(conditional, Ordering::AcqRel);
        if was && !conditional && self.settings.lease {
            tracing::warn!(bucket = %self.settings.bucket,
                "the S3 server ignored If-None-Match on a second create: fill leases are off until a check finds \
                 conditional writes (each replica may fetch a cold object once); use a server with conditional writes");
        } else if !was && conditional && self.settings.lease {
            tracing::info!(bucket = %self.settings.bucket, "the S3 server has conditional writes again: fill leases are on");
        }
    }

    pub fn settings(&self) -> &BucketSettings {
        &self.settings
    }

    pub fn metrics(&self) -> &BucketMetrics {
        &self.metrics
    }

    /// The name operators know the bucket by, for messages.
    pub fn name(&self) -> &str {
        &self.settings.bucket
    }

    fn path(&self, rel: &str) -> ObjectPath {
        if self.settings.prefix.is_empty() {
            ObjectPath::from(rel)
        } else {
            ObjectPath::from(format!("{}/{rel}", self.settings.prefix))
        }
    }

    fn object_path(&self, d: &Digest) -> ObjectPath {
        self.path(&format!("objects/{}/{}", d.algorithm(), d.hex()))
    }

    fn index_path(&self, d: &Digest) -> ObjectPath {
        self.path(&format!("index/{}/{}.json", d.algorithm(), d.hex()))
    }

    fn known_path(&self, d: &Digest, upstream: &str) -> ObjectPath {
        self.path(&format!("known/{}/{}/{}.json", d.algorithm(), d.hex(), key_hash(&upstream.to_ascii_lowercase())))
    }

    /// Whether a replica recorded that `d` exists in `upstream`.
    pub async fn is_known(&self, d: &Digest, upstream: &str) -> Result<bool, BucketError> {
        let key = (*d, upstream.to_ascii_lowercase());
        if self.known.lock().is_ok_and(|k| k.contains(&key)) {
            return Ok(true);
        }
        let p = self.known_path(d, upstream);
        let found = match self.call("head", &p, self.store.head(&p)).await? {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => return Err(self.store_err("head", &p, e)),
        };
        if found {
            self.remember_known(key);
        }
        Ok(found)
    }

    /// Record that `d` exists in `upstream` (create-only: replicas never race on a record).
    pub async fn put_known(&self, d: &Digest, upstream: &str) -> Result<(), BucketError> {
        let marker = KnownMarker { digest: *d, upstream: upstream.to_string(), replica: self.settings.replica.clone() };
        self.put_json(&self.known_path(d, upstream), &marker, PutMode::Create).await?;
        self.remember_known((*d, upstream.to_ascii_lowercase()));
        Ok(())
    }

    fn remember_known(&self, key: (Digest, String)) {
        if let Ok(mut k) = self.known.lock() {
            if k.len() >= KNOWN_CACHE {
                k.clear();
            }
            k.insert(key);
        }
    }

    /// Check the bucket's format marker, writing it when absent: a bucket of a newer format is
    /// refused (its records would be misread), an older one (format 1 had no marker) is used as
    /// is: its objects are known in no upstream.
    pub async fn check_format(&self) -> Result<(), BucketError> {
        self.check_format_via(true).await
    }

    async fn check_format_via(&self, gated: bool) -> Result<(), BucketError> {
        let p = self.path(FORMAT_KEY);
        match self.get_json_via::<BucketFormat>(&p, gated).await? {
            Some(f) if f.format > BUCKET_FORMAT => Err(BucketError::Setup {
                bucket: self.settings.bucket.clone(),
                message: format!(
                    "the bucket has format {} (written by {}), newer than this tender understands ({BUCKET_FORMAT}); \
                     upgrade this replica, or point storage.s3 at another bucket or prefix",
                    f.format, f.created_by
                ),
            }),
            Some(f) if f.format == BUCKET_FORMAT => Ok(()),
            Some(f) => {
                // Older: read as is; the marker moves on, so replicas too old to read chunk
                // objects refuse the bucket instead of missing what newer ones wrote.
                tracing::info!(bucket = %self.settings.bucket, from = f.format, to = BUCKET_FORMAT,
                    "bucket format upgraded (objects written before stay readable)");
                let f =
                    BucketFormat { format: BUCKET_FORMAT, created_by: format!("tender {}", env!("CARGO_PKG_VERSION")) };
                self.put_json_via(&p, &f, PutMode::Overwrite, gated).await
            }
            None => {
                let f =
                    BucketFormat { format: BUCKET_FORMAT, created_by: format!("tender {}", env!("CARGO_PKG_VERSION")) };
                self.put_json_via(&p, &f, PutMode::Create, gated).await
            }
        }
    }

    fn trust_path(&self, key: &str) -> ObjectPath {
        self.path(&format!("trust/{}.json", key_hash(key)))
    }

    /// A failed request, counted; one that says the bucket is unwell (not an answer about
    /// the key: absent, already there) opens the breaker.
    fn store_err(&self, op: &'static str, key: &ObjectPath, source: object_store::Error) -> BucketError {
        self.metrics.errors.get_or_create(&vec![("op".to_string(), op.to_string())]).inc();
        let cause = Cause::of(&source);
        let e = BucketError::Store {
            bucket: self.settings.bucket.clone(),
            op,
            key: key.to_string(),
            source: Box::new(source),
        };
        if let Some(c) = cause {
            self.trip(c, &e);
        }
        e
    }

    fn corrupt(&self, key: &ObjectPath, message: String) -> BucketError {
        self.metrics.corrupt.inc();
        BucketError::Corrupt { bucket: self.settings.bucket.clone(), key: key.to_string(), message }
    }

    /// A small JSON object, or `None` when absent.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, p: &ObjectPath) -> Result<Option<T>, BucketError> {
        self.get_json_via(p, true).await
    }

    /// A whole object, or its size (from the response head) when it is longer than `max`: its
    /// body is then never read (anyone who can write the bucket could make it any size).
    pub(crate) async fn get_at_most(&self, p: &ObjectPath, max: u64) -> object_store::Result<Result<Bytes, u64>> {
        let got = self.store.get(p).await?;
        if got.meta.size > max {
            return Ok(Err(got.meta.size));
        }
        Ok(Ok(got.bytes().await?))
    }

    /// `gated`: refused while the breaker is open (every request path); the probe's are not.
    async fn get_json_via<T: serde::de::DeserializeOwned>(
        &self,
        p: &ObjectPath,
        gated: bool,
    ) -> Result<Option<T>, BucketError> {
        let fut = self.get_at_most(p, RECORD_MAX);
        let got = if gated { self.call("get", p, fut).await? } else { self.timed("get", p, fut).await? };
        let bytes = match got {
            Ok(Ok(b)) => b,
            Ok(Err(n)) => return Err(self.corrupt(p, format!("a record of {n} bytes is longer than {RECORD_MAX}"))),
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.store_err("get", p, e)),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| self.corrupt(p, format!("not a valid record: {e}")))
    }

    /// Delete a key; one already gone is fine.
    pub(crate) async fn delete_quietly(&self, p: &ObjectPath) -> Result<(), BucketError> {
        match self.timed("delete", p, self.store.delete(p)).await? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.store_err("delete", p, e)),
        }
    }

    async fn put_json<T: serde::Serialize>(&self, p: &ObjectPath, value: &T, mode: PutMode) -> Result<(), BucketError> {
        self.put_json_via(p, value, mode, true).await
    }

    async fn put_json_via<T: serde::Serialize>(
        &self,
        p: &ObjectPath,
        value: &T,
        mode: PutMode,
        gated: bool,
    ) -> Result<(), BucketError> {
        let bytes = serde_json::to_vec_pretty(value).map_err(|e| self.corrupt(p, e.to_string()))?;
        let opts = PutOptions { mode, ..PutOptions::default() };
        let fut = self.store.put_opts(p, PutPayload::from(bytes), opts);
        let put = if gated { self.call("put", p, fut).await? } else { self.timed("put", p, fut).await? };
        match put {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(self.store_err("put", p, e)),
        }
    }

    /// Reach the bucket with the configured credentials; with leases on, make sure it refuses a
    /// second conditional create (an S3 server without conditional writes would let two replicas
    /// fetch the same object, silently). Run at start, past the breaker: a failure opens the
    /// breaker (and [`Bucket::spawn_prober`] probes), success closes it.
    pub async fn check(&self) -> Result<(), BucketError> {
        let conditional = self.check_writes(false).await?;
        self.set_conditional(conditional);
        self.breaker.probe_ok();
        if !conditional && self.settings.lease {
            return Err(BucketError::Setup {
                bucket: self.settings.bucket.clone(),
                message: "the S3 server ignored If-None-Match on a second create, so fill leases cannot work; \
                          use a server with conditional writes or set storage.s3.lease: false (then each \
                          replica may fetch a cold object once)"
                    .into(),
            });
        }
        Ok(())
    }

    /// Create a probe object twice, conditionally, and check the format marker: whether the
    /// second create was refused (conditional writes work).
    async fn check_writes(&self, gated: bool) -> Result<bool, BucketError> {
        let probe = self.path(&format!("leases/.probe-{}-{}", self.settings.replica, rand::random::<u64>()));
        let create = || PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        let put = || self.store.put_opts(&probe, PutPayload::from_static(b"{}"), create());
        let first = if gated { self.call("put", &probe, put()).await } else { self.timed("put", &probe, put()).await };
        let second = match first {
            Ok(Ok(_)) => self.timed("put", &probe, put()).await,
            Ok(Err(e)) => Err(self.store_err("put", &probe, e)),
            Err(e) => Err(e),
        };
        let second = match second {
            Ok(second) => second,
            Err(e) => {
                // A request that timed out or failed may still land: the probe object is
                // deleted once that could have happened (else the sweep removes it).
                self.forget_probe(probe);
                return Err(e);
            }
        };
        if !matches!(self.timed("delete", &probe, self.store.delete(&probe)).await, Ok(Ok(()))) {
            self.forget_probe(probe.clone());
        }
        self.check_format_via(gated).await?;
        match second {
            Err(object_store::Error::AlreadyExists { .. }) | Err(object_store::Error::Precondition { .. }) => Ok(true),
            Ok(_) => Ok(false),
            Err(e) => Err(self.store_err("put", &probe, e)),
        }
    }

    /// Delete a probe object in the background, `requestTimeout` from now (a request for it
    /// that timed out may land meanwhile); what stays behind is a stray the sweep removes.
    fn forget_probe(&self, probe: ObjectPath) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let (store, after) = (self.store.clone(), self.settings.request_timeout);
        rt.spawn(async move {
            tokio::time::sleep(after).await;
            if let Ok(Err(e)) = tokio::time::timeout(after, store.delete(&probe)).await {
                tracing::debug!(probe = %probe, error = %e, "probe object not deleted; the sweep removes it");
            }
        });
    }

    /// The index of a committed object, if the bucket holds one. Refused while the bucket is
    /// down, even when remembered: its content could not be read.
    pub async fn index(&self, d: &Digest) -> Result<Option<Arc<ChunkIndex>>, BucketError> {
        self.ensure_up()?;
        if let Some(i) = self.indexes.lock().ok().and_then(|m| m.get(d).cloned()) {
            return Ok(Some(i));
        }
        let p = self.index_path(d);
        let Some(mut index) = self.get_json::<ChunkIndex>(&p).await? else { return Ok(None) };
        index.validate_for(d).map_err(|m| self.corrupt(&p, m))?;
        index.signed = self.signs(d, &index);
        let index = Arc::new(index);
        if let Ok(mut m) = self.indexes.lock() {
            if m.len() >= INDEX_CACHE {
                m.clear();
            }
            m.insert(*d, index.clone());
        }
        Ok(Some(index))
    }

    /// Whether `index` is signed with this replica's index key as the index of `d`. A
    /// signature that does not hold (another key, or none) is not an error: the readers of
    /// the object hash it whole, as without a key.
    fn signs(&self, d: &Digest, index: &ChunkIndex) -> bool {
        let Some(k) = &self.settings.index_key else { return false };
        if index.mac.is_none() {
            return false;
        }
        let good = index.verify(k, d);
        if !good {
            self.metrics.unsigned_indexes.inc();
            tracing::warn!(bucket = %self.settings.bucket, digest = %d, by = %index.uploaded_by,
                "an index's signature does not hold under this replica's storage.s3.indexKeyFile (another key, or \
                 forged): its object is hashed whole when read");
        }
        good
    }

    /// The trust record of an asset key, if a replica recorded one.
    pub async fn trust(&self, key: &str) -> Result<Option<TrustRecord>, BucketError> {
        let p = self.trust_path(key);
        let r: Option<TrustRecord> = self.get_json(&p).await?;
        match r {
            Some(r) if r.key != key => Err(self.corrupt(&p, format!("trust record names {:?}, not {key:?}", r.key))),
            r => Ok(r),
        }
    }

    /// Record an asset's first verified digest; an existing record is never replaced.
    pub async fn put_trust(&self, r: &TrustRecord) -> Result<(), BucketError> {
        self.put_json(&self.trust_path(&r.key), r, PutMode::Create).await
    }

    /// Upload a committed local object: re-hash it while reading (a local copy that rotted since
    /// its commit never reaches the bucket), upload its content, then write its index.
    pub async fn upload(self: &Arc<Self>, d: &Digest, local: &std::path::Path) -> Result<Arc<ChunkIndex>, BucketError> {
        self.upload_typed(d, local, None).await
    }

    /// [`Bucket::upload_typed`] under the fill lease `lease` (named in the upload's record, so
    /// the upload is never taken for abandoned while the lease lives).
    pub async fn upload_leased(
        self: &Arc<Self>,
        d: &Digest,
        local: &std::path::Path,
        media_type: Option<&str>,
        lease: Option<&str>,
    ) -> Result<Arc<ChunkIndex>, BucketError> {
        if let Some(i) = self.index(d).await? {
            return Ok(i);
        }
        self.put(d, local, media_type, lease, None).await
    }

    /// [`Bucket::upload_leased`] for a blob or asset whose first chunks `resume` already wrote
    /// while it was fetched (see [`PartUpload`]).
    pub async fn upload_resumed(
        self: &Arc<Self>,
        d: &Digest,
        local: &std::path::Path,
        lease: Option<&str>,
        resume: Option<PartUpload>,
    ) -> Result<Arc<ChunkIndex>, BucketError> {
        match self.index(d).await {
            Ok(Some(i)) => {
                if let Some(u) = resume {
                    u.abort().await;
                }
                Ok(i)
            }
            Ok(None) => self.put(d, local, None, lease, resume).await,
            Err(e) => {
                if let Some(u) = resume {
                    u.abort().await;
                }
                Err(e)
            }
        }
    }

    /// Upload a verified local copy over a bucket copy that failed verification (content, then
    /// index), so the bucket heals without waiting for `fsck --repair`.
    pub async fn replace(
        self: &Arc<Self>,
        d: &Digest,
        local: &std::path::Path,
        lease: Option<&str>,
    ) -> Result<Arc<ChunkIndex>, BucketError> {
        // What the bad copy was written as, removed once the good one is in.
        let old = self.get_json::<ChunkIndex>(&self.index_path(d)).await.ok().flatten();
        self.forget(d);
        let index = self.put(d, local, None, lease, None).await?;
        match old.and_then(|o| o.upload) {
            Some(u) if Some(&u) != index.upload.as_ref() => {
                if let Err(e) = self.remove_parts(&u, true).await {
                    tracing::debug!(upload = %u, error = %e, "the bad copy's chunks stay; fsck --bucket --repair removes them");
                }
            }
            Some(_) => {}
            None => {
                let p = self.object_path(d);
                let _ = self.call("delete", &p, self.store.delete(&p)).await;
            }
        }
        Ok(index)
    }

    /// [`Bucket::upload`] for a manifest, whose media type the index keeps.
    pub async fn upload_typed(
        self: &Arc<Self>,
        d: &Digest,
        local: &std::path::Path,
        media_type: Option<&str>,
    ) -> Result<Arc<ChunkIndex>, BucketError> {
        self.upload_leased(d, local, media_type, None).await
    }

    /// Upload a committed local file as chunk objects, then its index. `resume`: an upload
    /// that already wrote the file's first chunks while it was being fetched (under the fill
    /// lease, for the replicas waiting on it); each of its chunks is checked against the file,
    /// and the upload starts over when one differs.
    async fn put(
        self: &Arc<Self>,
        d: &Digest,
        local: &std::path::Path,
        media_type: Option<&str>,
        lease: Option<&str>,
        resume: Option<PartUpload>,
    ) -> Result<Arc<ChunkIndex>, BucketError> {
        let started = std::time::Instant::now();
        let chunk = self.settings.chunk_size;
        let local_err = |e: std::io::Error| BucketError::Local {
            bucket: self.settings.bucket.clone(),
            path: local.display().to_string(),
            source: e,
        };
        let file = tokio::fs::File::open(local).await.map_err(local_err)?;
        let size = file.metadata().await.map_err(local_err)?.len();
        let mut file = tokio::io::BufReader::with_capacity(1 << 20, file);
        let (mut upload, mut done) = match resume {
            Some(mut u) if u.chunk_size() == chunk && u.covers(size) => {
                // Every chunk was written during the fill from its spool file, which the fill
                // hashed as it wrote it and committed under `d`: the file is not read and
                // hashed a second time (the trust model in SECURITY.md).
                u.set_total(Some(size)).await;
                let index = u.finish(d, size, media_type).await?;
                self.metrics.uploads.inc();
                tracing::info!(bucket = %self.settings.bucket, digest = %d, bytes = size, streamed = true,
                    ms = started.elapsed().as_millis() as u64, "uploaded to the bucket");
                return Ok(index);
            }
            Some(mut u) if u.chunk_size() == chunk => {
                u.set_total(Some(size)).await;
                // Every chunk handed over is listed once landed (the streamer flushes; a caller
                // that did not would otherwise have its chunks in flight written twice).
                if u.flush().await.is_ok() {
                    let done = u.chunks().await;
                    (u, done)
                } else {
                    u.abort().await;
                    (self.begin_parts(lease, Some(*d), Some(size)), Vec::new())
                }
            }
            Some(u) => {
                u.abort().await;
                (self.begin_parts(lease, Some(*d), Some(size)), Vec::new())
            }
            None => (self.begin_parts(lease, Some(*d), Some(size)), Vec::new()),
        };
        if done.len() > ChunkIndex::chunk_count(size, chunk) {
            upload.abort().await;
            (upload, done) = (self.begin_parts(lease, Some(*d), Some(size)), Vec::new());
        }
        let resumed = done.len();
        // In chain form one pass over the file gives every chunk's entry and the whole's
        // digest; otherwise the whole is hashed, and each resumed chunk again to compare.
        let piece = upload.piece_size();
        let mut whole = d.algorithm().hasher();
        let mut chain = chain::Chain::new();
        let mut left = size;
        let mut i = 0usize;
        while left > 0 {
            let n = left.min(chunk) as usize;
            let mut buf = vec![0u8; n];
            if let Err(e) = tokio::io::AsyncReadExt::read_exact(&mut file, &mut buf).await {
                upload.abort().await;
                return Err(local_err(e));
            }
            left -= n as u64;
            // Megabytes hashed on a blocking thread, not on the ones serving connections.
            let check = done.get(i).is_some();
            let hashed = tokio::task::spawn_blocking(move || {
                let mut known = None;
                let chunk = match piece {
                    Some(p) => {
                        let (k, entry) = chain::hash_known(&mut chain, &buf, p, size);
                        known = Some(k);
                        Some(entry)
                    }
                    None => {
                        whole.update(&buf);
                        check.then(|| hex::encode(Sha256::digest(&buf)))
                    }
                };
                (whole, chain, buf, chunk, known)
            })
            .await;
            let (chunk_hash, known);
            (whole, chain, buf, chunk_hash, known) = match hashed {
                Ok(h) => h,
                Err(e) => {
                    upload.abort().await;
                    return Err(BucketError::Setup {
                        bucket: self.settings.bucket.clone(),
                        message: format!("hashing the local copy: {e}"),
                    });
                }
            };
            if let Some(have) = done.get(i) {
                if chunk_hash.as_deref() != Some(have.as_str()) {
                    // Written from bytes the fill later replaced: start over from scratch.
                    tracing::warn!(bucket = %self.settings.bucket, digest = %d, chunk = i,
                        "a chunk written during the fill differs from the committed object; uploading it again");
                    upload.abort().await;
                    return Box::pin(self.put(d, local, media_type, lease, None)).await;
                }
            } else if let Err(e) = upload.put_chunk_with(Bytes::from(buf), known).await {
                upload.abort().await;
                return Err(e);
            }
            i += 1;
        }
        done.clear();
        let got = match piece {
            Some(_) => Digest::from_bytes(tender_oci::Algorithm::Sha256, &chain.finalize()),
            None => Some(whole.finalize()),
        };
        if got != Some(*d) {
            self.metrics.corrupt.inc();
            upload.abort().await;
            let got = got.map_or_else(|| "not sha256".to_string(), |g| g.to_string());
            return Err(BucketError::Corrupt {
                bucket: self.settings.bucket.clone(),
                key: local.display().to_string(),
                message: format!("local copy is {got}, not {d}; not uploaded (run tender fsck)"),
            });
        }
        let index = upload.finish(d, size, media_type).await?;
        self.metrics.uploads.inc();
        tracing::info!(bucket = %self.settings.bucket, digest = %d, bytes = size, resumed_chunks = resumed,
            ms = started.elapsed().as_millis() as u64, "uploaded to the bucket");
        Ok(index)
    }

    /// The sha256 of a chunk read back, in hex. A chunk is megabytes: hashed on a blocking
    /// thread, not on the ones serving connections (8 MiB is about 6 ms of one core).
    pub(crate) async fn sha256_hex(&self, bytes: &Bytes) -> Result<String, BucketError> {
        let hashed = bytes.clone();
        tokio::task::spawn_blocking(move || hex::encode(Sha256::digest(&hashed))).await.map_err(|e| {
            BucketError::Setup { bucket: self.settings.bucket.clone(), message: format!("hashing a chunk: {e}") }
        })
    }

    /// The sha256 of a chunk and, with `sub`, of each of its sub-chunks of `sub` bytes: one
    /// pass over the bytes (each piece goes into the chunk's hasher and its own while it is in
    /// cache), on a blocking thread.
    pub(crate) async fn chunk_hashes(
        &self,
        bytes: &Bytes,
        sub: Option<u64>,
    ) -> Result<(String, Option<Vec<String>>), BucketError> {
        let hashed = bytes.clone();
        tokio::task::spawn_blocking(move || hash_chunk(&hashed, sub)).await.map_err(|e| BucketError::Setup {
            bucket: self.settings.bucket.clone(),
            message: format!("hashing a chunk: {e}"),
        })
    }

    /// The sha256 of each piece of `s` bytes, in hex (empty bytes are one piece), on a
    /// blocking thread.
    pub(crate) async fn sub_hashes(&self, bytes: &Bytes, s: u64) -> Result<Vec<String>, BucketError> {
        let hashed = bytes.clone();
        let s = usize::try_from(s).unwrap_or(usize::MAX).max(1);
        tokio::task::spawn_blocking(move || hash_pieces(&hashed, s)).await.map_err(|e| BucketError::Setup {
            bucket: self.settings.bucket.clone(),
            message: format!("hashing sub-chunks: {e}"),
        })
    }

    pub(crate) fn remember_index(&self, d: &Digest, index: Arc<ChunkIndex>) {
        if let Ok(mut m) = self.indexes.lock() {
            if m.len() >= INDEX_CACHE {
                m.clear();
            }
            m.insert(*d, index);
        }
    }

    /// One chunk, fetched and checked against the index.
    async fn chunk(&self, d: &Digest, index: &ChunkIndex, i: usize) -> Result<Bytes, BucketError> {
        let range: Range<u64> = index.chunk_range(i);
        if let Some(upload) = &index.upload {
            let Some(check) = index.check_of(i, d) else {
                return Err(self.corrupt(&self.index_path(d), format!("chunk {i} has no entry in its index")));
            };
            return match self.part(upload, i, &check, Some(range.end - range.start), index.chunk_size).await {
                Err(e) if e.is_not_found() => {
                    // Quarantined or deleted since its index was read: forget the index.
                    self.forget(d);
                    Err(e)
                }
                r => r,
            };
        }
        let p = self.object_path(d);
        let bytes = match self.call("get", &p, self.store.get_range(&p, range.clone())).await? {
            Ok(b) => b,
            Err(e) => {
                if matches!(e, object_store::Error::NotFound { .. }) {
                    // Quarantined or deleted since its index was read: forget the index.
                    self.forget(d);
                }
                return Err(self.store_err("get", &p, e));
            }
        };
        let got = self.sha256_hex(&bytes).await?;
        if bytes.len() as u64 != range.end - range.start || got != index.chunks[i] {
            return Err(self.corrupt(
                &p,
                format!(
                    "chunk {i} (bytes {}-{}) does not match its index ({} bytes, sha256 {got}); not served",
                    range.start,
                    range.end.saturating_sub(1),
                    bytes.len()
                ),
            ));
        }
        self.metrics.read_bytes.inc_by(bytes.len() as u64);
        Ok(bytes)
    }

    /// Bytes `within` of chunk `i` (offsets in the chunk) read as the sub-chunks that cover
    /// them, with one ranged GET, each checked against the index. `None` when the index has
    /// no sub-chunk hashes, the range needs the whole chunk, or the bucket did not answer the
    /// ranged GET with the range (then the whole chunk is read, as before sub-chunks).
    async fn sub_chunks(
        &self,
        d: &Digest,
        index: &ChunkIndex,
        i: usize,
        within: Range<u64>,
    ) -> Result<Option<Bytes>, BucketError> {
        if index.is_chain() {
            return self.pieces(d, index, i, within).await;
        }
        let (Some((s, hashes)), Some(upload)) = (index.sub_hashes(i), &index.upload) else { return Ok(None) };
        let Some((a, b, span)) = pieces_of(index, i, s, hashes.len(), &within) else { return Ok(None) };
        let p = self.part_path(upload, i);
        let chunk = index.chunk_range(i);
        let len = chunk.end - chunk.start;
        let Some(bytes) = self.ranged_part(d, &p, i, len, span.clone()).await? else { return Ok(None) };
        let got = self.sub_hashes(&bytes, s).await?;
        if bytes.len() as u64 != span.end - span.start || got.as_slice() != &hashes[a..b] {
            let bad = got.iter().zip(&hashes[a..b]).position(|(g, w)| g != w).map_or(a, |k| a + k);
            return Err(self.corrupt(
                &p,
                format!(
                    "chunk {i} sub-chunk {bad} (bytes {}-{} of the chunk, {} read) does not match its index; not served",
                    span.start,
                    span.end.saturating_sub(1),
                    bytes.len()
                ),
            ));
        }
        self.metrics.read_bytes.inc_by(bytes.len() as u64);
        Ok(Some(bytes.slice((within.start - span.start) as usize..(within.end - span.start) as usize)))
    }

    /// Bytes `span` of chunk `i` (`len` bytes, object `p`), with one ranged GET. `None` when
    /// the bucket did not answer with the range (then the whole chunk is read).
    async fn ranged_part(
        &self,
        d: &Digest,
        p: &ObjectPath,
        i: usize,
        len: u64,
        span: Range<u64>,
    ) -> Result<Option<Bytes>, BucketError> {
        let opts = object_store::GetOptions {
            range: Some(object_store::GetRange::Bounded(span.clone())),
            ..Default::default()
        };
        let get = async {
            let got = self.store.get_opts(p, opts).await?;
            // The chunk's size is in the response head: a chunk unlike its index is refused
            // before a byte of it is read, as by `get_at_most`.
            if got.meta.size != len || got.range != span {
                return Ok(Err((got.meta.size, got.range)));
            }
            Ok(Ok(got.bytes().await?))
        };
        match self.call("get", p, get).await? {
            Ok(Ok(b)) => Ok(Some(b)),
            Ok(Err((size, got))) => Err(self.corrupt(
                p,
                format!(
                    "chunk {i} is {size} bytes (answered bytes {}-{}), not the {len} its index says; not read",
                    got.start,
                    got.end.saturating_sub(1)
                ),
            )),
            Err(e @ object_store::Error::NotFound { .. }) => {
                // Quarantined or deleted since its index was read: forget the index.
                self.forget(d);
                Err(self.store_err("get", p, e))
            }
            Err(e) if matches!(Cause::of(&e), Some(Cause::Timeout | Cause::Connect | Cause::Denied)) => {
                Err(self.store_err("get", p, e))
            }
            Err(e) => {
                // An answer that refuses the range (a server without ranges, a chunk shorter
                // than the range): the whole chunk is read and judged as before sub-chunks.
                tracing::debug!(key = %p, error = %e, "ranged read of sub-chunks refused; reading the whole chunk");
                Ok(None)
            }
        }
    }

    /// [`Bucket::sub_chunks`] of an index in chain form (format 3): the pieces that cover
    /// `within`, checked from the state before the first to the state after the last (the
    /// object's sha256 when the last is the object's).
    async fn pieces(
        &self,
        d: &Digest,
        index: &ChunkIndex,
        i: usize,
        within: Range<u64>,
    ) -> Result<Option<Bytes>, BucketError> {
        let (Some(s), Some(upload)) = (index.sub_chunk_size.filter(|s| *s > 0), &index.upload) else { return Ok(None) };
        let chunk = index.chunk_range(i);
        let len = chunk.end - chunk.start;
        let n = ChunkIndex::chunk_count(len, s);
        let Some((a, b, span)) = pieces_of(index, i, s, n, &within) else { return Ok(None) };
        let Some((piece, start, ends)) = index.piece_states(i, a, b) else { return Ok(None) };
        let p = self.part_path(upload, i);
        let Some(bytes) = self.ranged_part(d, &p, i, len, span.clone()).await? else { return Ok(None) };
        let last = (i + 1 == index.chunks.len() && b == n).then_some(*d);
        let at = chunk.start + span.start;
        let checked = bytes.clone();
        let verdict = tokio::task::spawn_blocking(move || {
            if checked.len() as u64 != span.end - span.start {
                return Err(format!("{} bytes read for {}", checked.len(), span.end - span.start));
            }
            chain::check_pieces(start, at, &checked, piece, &ends, last.as_ref())
        })
        .await
        .map_err(|e| BucketError::Setup {
            bucket: self.settings.bucket.clone(),
            message: format!("hashing pieces: {e}"),
        })?;
        if let Err(m) = verdict {
            return Err(self.corrupt(&p, format!("chunk {i} pieces {a}..{b}: {m}; not served")));
        }
        self.metrics.read_bytes.inc_by(bytes.len() as u64);
        Ok(Some(bytes.slice((within.start - a as u64 * s) as usize..(within.end - a as u64 * s) as usize)))
    }

    /// Bytes `start..end` of a committed object. Each chunk, or each sub-chunk when the index
    /// records them and the range needs only part of a chunk, is verified before any of it is
    /// yielded; a mismatch ends the stream with an error. One chunk is read ahead (a range
    /// holds at most two chunks in memory).
    pub fn read(
        self: &Arc<Self>,
        d: Digest,
        index: Arc<ChunkIndex>,
        start: u64,
        end: u64,
    ) -> BoxStream<'static, Result<Bytes, BucketError>> {
        self.read_ahead(d, index, start, end, 2, true)
    }

    /// A whole object copied into a replica's cache: [`Bucket::read`] with [`COPY_AHEAD`]
    /// chunks requested at once (one request per chunk costs a round trip that one stream of
    /// the same bytes would not; several in flight hide it), always whole chunks.
    pub fn copy(
        self: &Arc<Self>,
        d: Digest,
        index: Arc<ChunkIndex>,
        start: u64,
        end: u64,
    ) -> BoxStream<'static, Result<Bytes, BucketError>> {
        self.read_ahead(d, index, start, end, COPY_AHEAD, false)
    }

    fn read_ahead(
        self: &Arc<Self>,
        d: Digest,
        index: Arc<ChunkIndex>,
        start: u64,
        end: u64,
        ahead: usize,
        sub_chunks: bool,
    ) -> BoxStream<'static, Result<Bytes, BucketError>> {
        let end = end.min(index.size);
        if start >= end {
            return stream::empty().boxed();
        }
        let cs = index.chunk_size;
        let (first, last) = ((start / cs) as usize, ((end - 1) / cs) as usize);
        let (me, me_name) = (self.clone(), self.settings.bucket.clone());
        stream::iter(first..=last)
            .map(move |i| {
                let (me, index) = (me.clone(), index.clone());
                // Each chunk its own task: its request goes on while the reader writes.
                let task = tokio::spawn(async move {
                    let base = i as u64 * cs;
                    let (from, to) = (start.saturating_sub(base), (end - base).min(cs));
                    if sub_chunks {
                        if let Some(piece) = me.sub_chunks(&d, &index, i, from..to).await? {
                            return Ok(piece);
                        }
                    }
                    let bytes = me.chunk(&d, &index, i).await?;
                    let (from, to) = (from as usize, (to as usize).min(bytes.len()));
                    Ok(bytes.slice(from.min(to)..to))
                });
                let bucket = me_name.clone();
                async move {
                    match task.await {
                        Ok(r) => r,
                        Err(e) => Err(BucketError::Setup { bucket, message: format!("chunk read task: {e}") }),
                    }
                }
            })
            .buffered(ahead.max(1))
            .boxed()
    }

    /// A small object whole (a manifest, at most `limit` bytes): every chunk verified, then
    /// the whole against its digest. `None` when the bucket does not hold it or it is larger.
    pub async fn read_small(
        self: &Arc<Self>,
        d: &Digest,
        limit: u64,
    ) -> Result<Option<(Bytes, Arc<ChunkIndex>)>, BucketError> {
        let Some(index) = self.index(d).await? else { return Ok(None) };
        if index.size > limit {
            return Ok(None);
        }
        let mut s = self.read(*d, index.clone(), 0, index.size);
        let mut out = Vec::with_capacity(index.size as usize);
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c?);
        }
        let got = d.algorithm().digest(&out);
        if got != *d {
            return Err(self.corrupt(&self.object_path(d), format!("content is {got}, not {d}")));
        }
        Ok(Some((Bytes::from(out), index)))
    }

    /// Forget what this process remembers of an object (after fsck moved it aside).
    pub fn forget(&self, d: &Digest) {
        if let Ok(mut m) = self.indexes.lock() {
            m.remove(d);
        }
    }
}

/// The pieces `a..b` of `s` bytes (of `n` in chunk `i`) that cover `within` (offsets in the
/// chunk), and their span in the chunk; `None` when `within` is empty or needs every piece
/// (then the whole chunk is read).
fn pieces_of(
    index: &ChunkIndex,
    i: usize,
    s: u64,
    n: usize,
    within: &Range<u64>,
) -> Option<(usize, usize, Range<u64>)> {
    let chunk = index.chunk_range(i);
    let len = chunk.end - chunk.start;
    let (a, b) = ((within.start / s) as usize, within.end.div_ceil(s) as usize);
    if within.start >= within.end || b > n || (a == 0 && b == n) {
        return None;
    }
    Some((a, b, a as u64 * s..(b as u64 * s).min(len)))
}

/// Whether a request moves content (a chunk or an object stored whole), as opposed to a small
/// record, a listing or a delete.
fn is_bulk(op: &str, p: &ObjectPath) -> bool {
    let key = p.as_ref();
    matches!(op, "get" | "put")
        && (key.starts_with("parts/")
            || key.contains("/parts/")
            || key.starts_with("objects/")
            || key.contains("/objects/"))
}

/// The sha256 of `bytes` and, with `sub`, of each piece of `sub` bytes (an empty chunk has one
/// piece, empty), in one loop over the bytes.
pub(crate) fn hash_chunk(bytes: &[u8], sub: Option<u64>) -> (String, Option<Vec<String>>) {
    let Some(sub) = sub.and_then(|s| usize::try_from(s).ok()).filter(|s| *s > 0) else {
        return (hex::encode(Sha256::digest(bytes)), None);
    };
    if bytes.is_empty() {
        let empty = hex::encode(Sha256::digest(bytes));
        return (empty.clone(), Some(vec![empty]));
    }
    let mut whole = Sha256::new();
    let mut subs = Vec::with_capacity(bytes.len().div_ceil(sub));
    for piece in bytes.chunks(sub) {
        whole.update(piece);
        subs.push(hex::encode(Sha256::digest(piece)));
    }
    (hex::encode(whole.finalize()), Some(subs))
}

/// The sha256 of each piece of `s` bytes (empty bytes are one piece, empty).
fn hash_pieces(bytes: &[u8], s: usize) -> Vec<String> {
    if bytes.is_empty() {
        return vec![hex::encode(Sha256::digest(bytes))];
    }
    bytes.chunks(s).map(|c| hex::encode(Sha256::digest(c))).collect()
}

#[cfg(test)]
mod tests;
