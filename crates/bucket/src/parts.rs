//! Content as chunk objects (bucket format 4, index formats 3 and 2): an upload writes each
//! chunk as its own object, `parts/<upload>/<i>`, as soon as the chunk is there, and keeps a
//! small progress record, `progress/<sha256(key)>.json`, listing every chunk written so far:
//! its link in the object's sha256 ([`crate::chain`]) when the upload knew the object's size
//! from the start, else its sha256. `key` is the fill lease's key when the upload runs under one (so a replica waiting on
//! that lease finds the record and reads chunks as they land, instead of waiting for the whole
//! object: S3 cannot read an unfinished multipart upload), else `upload:<id>`.
//!
//! The index, written last, still marks the object complete; the progress record goes after it.
//! A record whose uploader stopped renewing it (3 × `leaseTtl`, no live lease) is abandoned:
//! its chunks are removed by the sweep and `tender fsck --bucket --repair`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use std::collections::VecDeque;

use futures::stream::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{PutMode, PutPayload};
use serde::{Deserialize, Serialize};
use tender_oci::Digest;

use crate::chain::ChunkCheck;
pub use crate::chain::Known;
use crate::index::{is_upload_id, new_upload_id};
use crate::lease::now_ms;
use crate::{key_hash, Bucket, BucketError, ChunkIndex};

/// Chunk uploads in flight per upload: one request per chunk costs a round trip; several in
/// flight keep the link busy (at most this many chunks of memory).
const IN_FLIGHT: usize = 4;

/// The first bytes of an object an upload puts in its progress record (base64) while its first
/// chunk is still on its way: a follower's client gets its first bytes one small write after
/// the holder's, not one whole chunk (fetched, written and read back) after.
pub const HEAD_LEN: usize = 64 << 10;
/// The longest head a reader takes from a record (another replica may be set otherwise).
const HEAD_MAX: usize = 1 << 20;

/// What an upload in progress has written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// The fill lease key the upload runs under, or `upload:<id>`.
    pub key: String,
    pub upload: String,
    pub replica: String,
    pub chunk_size: u64,
    /// The object's size, when its upstream said it.
    #[serde(default)]
    pub total: Option<u64>,
    /// The object being uploaded, when known before it verified.
    #[serde(default)]
    pub digest: Option<Digest>,
    /// Whether `key` is a fill lease (checked before the record is taken for abandoned).
    #[serde(default)]
    pub leased: bool,
    /// Lowercase hex sha256 of each chunk written, in order. With `chained`: the hash state
    /// after each chunk, and the object's sha256 for the last ([`crate::chain`]).
    pub chunks: Vec<String>,
    /// The chunks are listed as links of the object's own sha256 (an upload for an index of
    /// format 3).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chained: bool,
    /// The object's first bytes (base64, at most [`HEAD_LEN`] as written), until the first
    /// chunk is listed. Older readers ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// Milliseconds since the Unix epoch, by the uploader's clock.
    pub started_at: u64,
    pub renewed_at: u64,
}

impl Progress {
    /// A record another replica wrote must describe chunks a reader can check.
    fn validate(&self) -> Result<(), String> {
        if !is_upload_id(&self.upload) {
            return Err(format!("upload id {:?} is not 32 hex characters", self.upload));
        }
        if self.chunk_size == 0 || self.chunk_size > crate::MAX_CHUNK_SIZE {
            return Err(format!("chunk size {} is not within 1..={}", self.chunk_size, crate::MAX_CHUNK_SIZE));
        }
        if let Some(bad) = self.chunks.iter().find(|c| c.len() != 64 || !c.bytes().all(|b| b.is_ascii_hexdigit())) {
            return Err(format!("chunk digest {bad:?} is not 64 hex characters"));
        }
        if let Some(t) = self.total {
            if self.chunks.len() > ChunkIndex::chunk_count(t, self.chunk_size) {
                return Err(format!("{} chunks for {t} bytes in chunks of {}", self.chunks.len(), self.chunk_size));
            }
        }
        if let Some(h) = &self.head {
            // Checked before decoding: base64 is 4 characters for 3 bytes.
            if h.len() > HEAD_MAX.div_ceil(3) * 4 {
                return Err(format!("a head of {} base64 characters is longer than {HEAD_MAX} bytes", h.len()));
            }
            let n = self.head_bytes()?.map_or(0, |b| b.len() as u64);
            if n > self.chunk_size || self.total.is_some_and(|t| n > t) {
                return Err(format!("a head of {n} bytes is longer than the first chunk or the object"));
            }
        }
        Ok(())
    }

    /// How chunk `i` is checked, once it is listed. A chained chunk is the object's last when
    /// the record's size says so, or when it is shorter than a chunk.
    pub fn check_of(&self, i: usize, len: Option<u64>) -> Option<ChunkCheck> {
        let entry = self.chunks.get(i)?;
        if !self.chained {
            return Some(ChunkCheck::Sha256(entry.clone()));
        }
        let at = (i as u64).saturating_mul(self.chunk_size);
        let start = if i == 0 { crate::chain::START } else { crate::chain::state_of(self.chunks.get(i - 1)?)? };
        let last = match (self.total, len) {
            (Some(t), _) => at.saturating_add(self.chunk_size) >= t,
            (None, Some(n)) => n < self.chunk_size,
            (None, None) => false,
        };
        Some(ChunkCheck::Chain(crate::chain::Link {
            start,
            at,
            last,
            end: entry.clone(),
            piece: self.chunk_size,
            interior: None,
        }))
    }

    /// Whether its uploader renewed the record within `ttl` (by this replica's clock, as leases
    /// are judged): a record renewed longer ago belongs to an upload nobody is doing.
    pub fn is_fresh(&self, ttl: Duration) -> bool {
        now_ms().saturating_sub(self.renewed_at) <= u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// The object's first bytes the record carries, while its first chunk is not listed.
    pub fn head_bytes(&self) -> Result<Option<Bytes>, String> {
        use base64::Engine as _;
        match &self.head {
            Some(h) if self.chunks.is_empty() => base64::engine::general_purpose::STANDARD
                .decode(h)
                .map(|b| Some(Bytes::from(b)))
                .map_err(|e| format!("head is not base64: {e}")),
            _ => Ok(None),
        }
    }
}

/// A chunk's entry from what its caller hashed: the states at its piece boundaries (its end
/// included unless it is the object's last, which ends in `digest`). `None` when they do not
/// fit a chunk of `len` bytes.
fn from_known(k: Known, len: u64, piece: u64, last: bool) -> Option<crate::chain::Hashed> {
    use tender_oci::chain::state_hex;
    let pieces = ChunkIndex::chunk_count(len, piece);
    if last {
        let d = k.digest.filter(|d| d.algorithm() == tender_oci::Algorithm::Sha256)?;
        (k.states.len() + 1 == pieces).then(|| crate::chain::Hashed {
            end: d.hex(),
            end_state: None,
            interior: k.states.iter().map(state_hex).collect(),
        })
    } else {
        let (end, interior) = k.states.split_last()?;
        (k.states.len() == pieces && len.is_multiple_of(piece)).then(|| crate::chain::Hashed {
            end: state_hex(end),
            end_state: Some(*end),
            interior: interior.iter().map(state_hex).collect(),
        })
    }
}

/// A record and the chunks that landed out of order (listed once those before them did).
struct Recorded {
    progress: Progress,
    landed: std::collections::BTreeMap<usize, (String, Option<Vec<String>>)>,
    /// The sub-chunk hashes of each chunk listed, for the index (kept here, not in the record:
    /// followers read whole chunks); `None` once a chunk had none or there are more than
    /// [`crate::MAX_SUB_CHUNKS`].
    subs: Option<Vec<Vec<String>>>,
    /// Sub-chunk hashes in `subs`.
    sub_count: usize,
}

impl Recorded {
    /// Chunk `i` is in the bucket: list it, with any landed after it that now follow on.
    /// Whether the list grew.
    fn land(&mut self, i: usize, hash: String, sub: Option<Vec<String>>) -> bool {
        self.landed.insert(i, (hash, sub));
        let before = self.progress.chunks.len();
        while let Some((h, sub)) = self.landed.remove(&self.progress.chunks.len()) {
            self.progress.chunks.push(h);
            self.sub_count = self.sub_count.saturating_add(sub.as_ref().map_or(0, Vec::len));
            match (self.subs.as_mut(), sub) {
                (Some(all), Some(sub)) if self.sub_count <= crate::MAX_SUB_CHUNKS => all.push(sub),
                _ => self.subs = None,
            }
        }
        if !self.progress.chunks.is_empty() {
            // The first chunk holds the head's bytes, verified.
            self.progress.head = None;
        }
        self.progress.chunks.len() > before
    }
}

/// An upload this replica runs. Dropped without [`PartUpload::finish`] or
/// [`PartUpload::abort`], it stops renewing its record and the sweep removes it.
pub struct PartUpload {
    bucket: Arc<Bucket>,
    /// The upload's id and chunk size (also in the record; kept here so no chunk waits on the
    /// record's lock).
    upload: String,
    chunk_size: u64,
    /// The sub-chunks each chunk's pieces are hashed in, for the index (none: whole chunks).
    sub_chunk_size: Option<u64>,
    path: ObjectPath,
    /// The record, written under this lock so writes never overtake one another.
    record: Arc<tokio::sync::Mutex<Recorded>>,
    /// Chunk uploads in flight, in order; each lists its chunk in the record when it landed.
    pending: VecDeque<tokio::task::JoinHandle<Result<(), BucketError>>>,
    /// Chunks handed to [`PartUpload::put_chunk`] so far, and their bytes.
    queued: usize,
    handed: u64,
    /// A chunk shorter than `chunk_size` was handed over before another one (only the last
    /// may be short): the chunks do not tile an object.
    ragged: bool,
    /// Whether the record was written yet (it is, before the first chunk).
    recorded: bool,
    renewer: Option<tokio::task::JoinHandle<()>>,
    /// Set by the first chunk that could not be written: the upload is dead from then on (its
    /// record is no longer renewed, so followers see it stop, and its holder gives its lease up).
    failed: Arc<tokio::sync::watch::Sender<bool>>,
    /// The chunks as links of the object's chain (index format 3), when the upload knows the
    /// object's size from the start and its digest is sha256 (or not known yet).
    chain: Option<ChainUp>,
    /// Bytes of the chunks handed over that this upload hashed itself (in chain form, those
    /// handed without [`Known`] states; otherwise all of them).
    hashed: u64,
}

/// An upload in chain form: its pieces, the object's size, and the state where the next chunk
/// starts (`None` once the chunks handed over stopped tiling an object of that size).
#[derive(Debug, Clone, Copy)]
struct ChainUp {
    piece: u64,
    total: u64,
    next: Option<tender_oci::chain::State>,
}

impl std::fmt::Debug for PartUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartUpload").field("path", &self.path).field("queued", &self.queued).finish_non_exhaustive()
    }
}

impl Drop for PartUpload {
    fn drop(&mut self) {
        for task in self.pending.drain(..) {
            task.abort();
        }
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
    }
}

impl PartUpload {
    pub fn upload_id(&self) -> String {
        self.upload.clone()
    }

    /// The object's size, once known (readers following the upload use it).
    pub async fn set_total(&mut self, total: Option<u64>) {
        if let Some(c) = self.chain.as_mut() {
            if total != Some(c.total) {
                // Links of an object of another size: the index cannot be written in chain form.
                c.next = None;
                return;
            }
        }
        self.record.lock().await.progress.total = total;
    }

    /// Whether the chunks handed over are, in order, exactly `size` bytes in chunks of
    /// `chunk_size` (the last one shorter): an object of that size, whole.
    pub fn covers(&self, size: u64) -> bool {
        !self.ragged && self.handed == size && self.queued == ChunkIndex::chunk_count(size, self.chunk_size)
    }

    /// The sha256 of every chunk written (after [`PartUpload::flush`], every chunk handed over).
    pub async fn chunks(&self) -> Vec<String> {
        self.record.lock().await.progress.chunks.clone()
    }

    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Bytes of the chunks handed over that this upload hashed itself, rather than taking the
    /// states its caller hashed ([`PartUpload::put_chunk_with`]).
    pub fn hashed_bytes(&self) -> u64 {
        self.hashed
    }

    /// In chain form (index format 3): the size of the pieces whose boundary states the index
    /// lists ([`Known::states`]).
    pub fn piece_size(&self) -> Option<u64> {
        self.chain.map(|c| c.piece)
    }

    /// Whether a chunk could not be written: nothing more lands, and the record is not renewed.
    pub fn has_failed(&self) -> bool {
        *self.failed.borrow()
    }

    /// Returns once a chunk could not be written (pending forever while the upload is alive).
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.failed.subscribe();
        async move {
            if rx.wait_for(|f| *f).await.is_err() {
                // The upload is gone: it stops nothing any more.
                std::future::pending::<()>().await;
            }
        }
    }

    fn dead(&self) -> BucketError {
        BucketError::Setup {
            bucket: self.bucket.settings.bucket.clone(),
            message: format!("upload {} stopped: a chunk could not be written", self.upload),
        }
    }

    /// Carry the object's first bytes (at most [`HEAD_LEN`]) in the record until the first
    /// chunk is listed; written with the next record write ([`PartUpload::announce`]).
    pub async fn set_head(&mut self, head: &[u8]) {
        use base64::Engine as _;
        let head = &head[..head.len().min(HEAD_LEN).min(usize::try_from(self.chunk_size).unwrap_or(usize::MAX))];
        let mut r = self.record.lock().await;
        if r.progress.chunks.is_empty() && !head.is_empty() {
            r.progress.head = Some(base64::engine::general_purpose::STANDARD.encode(head));
        }
    }

    /// Write the record now, before the first chunk, so replicas waiting on the lease follow
    /// the upload at once (their clients get headers with the size while the chunks come).
    pub async fn announce(&mut self) -> Result<(), BucketError> {
        if !self.recorded {
            self.write_record().await?;
            self.recorded = true;
            self.renewer = Some(self.spawn_renewer());
        }
        Ok(())
    }

    /// Write the next chunk (chunks are handed over in order, each but the last exactly
    /// `chunkSize` long). Returns once fewer than [`IN_FLIGHT`] chunks are in flight; the record
    /// lists a chunk once it is in the bucket.
    pub async fn put_chunk(&mut self, bytes: Bytes) -> Result<(), BucketError> {
        self.put_chunk_with(bytes, None).await
    }

    /// [`PartUpload::put_chunk`], with what the caller already hashed of it (in chain form,
    /// the chunk is then not hashed again; `known` unlike the chunk's pieces is ignored).
    pub async fn put_chunk_with(&mut self, bytes: Bytes, known: Option<Known>) -> Result<(), BucketError> {
        if self.has_failed() {
            // The chunk that failed is in flight or landed: its error is the upload's.
            self.flush().await?;
            return Err(self.dead());
        }
        self.announce().await?;
        let i = self.queued;
        let at = self.handed;
        if i > 0 && at != (i as u64).saturating_mul(self.chunk_size) {
            self.ragged = true;
        }
        self.queued += 1;
        self.handed = self.handed.saturating_add(bytes.len() as u64);
        // In chain form the entry is known before the upload: the state after the chunk.
        let linked = match self.chain.as_mut() {
            Some(c) => match c.next {
                Some(start) if self.handed <= c.total && !self.ragged => {
                    let last = self.handed == c.total;
                    let h = match known.and_then(|k| from_known(k, bytes.len() as u64, c.piece, last)) {
                        Some(h) => Some(h),
                        None => {
                            self.hashed = self.hashed.saturating_add(bytes.len() as u64);
                            let (b, piece) = (bytes.clone(), c.piece);
                            tokio::task::spawn_blocking(move || crate::chain::hash_link(start, at, &b, piece, last))
                                .await
                                .map_err(|e| BucketError::Setup {
                                    bucket: self.bucket.settings.bucket.clone(),
                                    message: format!("hashing a chunk: {e}"),
                                })?
                        }
                    };
                    // None after the last chunk (it ends in the digest) or one not linked.
                    c.next = h.as_ref().and_then(|h| h.end_state);
                    h
                }
                _ => {
                    c.next = None;
                    None
                }
            },
            None => None,
        };
        let chained = self.chain.is_some();
        if !chained {
            self.hashed = self.hashed.saturating_add(bytes.len() as u64);
        }
        let p = self.bucket.part_path(&self.upload_id(), i);
        let (me, record, path) = (self.bucket.clone(), self.record.clone(), self.path.clone());
        let (failed, sub) = (self.failed.clone(), self.sub_chunk_size);
        self.pending.push_back(tokio::spawn(async move {
            let put = async {
                let (hash, subs) = match linked {
                    Some(h) => (h.end, Some(h.interior)),
                    // A chain that broke off: listed as nothing a reader accepts, so followers
                    // stop here and take the rest from elsewhere; the index is not written.
                    None if chained => ("0".repeat(64), None),
                    None => me.chunk_hashes(&bytes, sub).await?,
                };
                let n = bytes.len() as u64;
                me.call("put", &p, me.store.put(&p, PutPayload::from(bytes)))
                    .await?
                    .map_err(|e| me.store_err("put", &p, e))?;
                me.metrics.uploaded_bytes.inc_by(n);
                // Listed at once, so a follower waits for the chunk and not for the next one.
                let mut r = record.lock().await;
                if r.land(i, hash, subs) {
                    r.progress.renewed_at = now_ms();
                    me.put_json(&path, &r.progress, PutMode::Overwrite).await?;
                }
                Ok(())
            };
            let r = put.await;
            if r.is_err() {
                failed.send_replace(true);
            }
            r
        }));
        while self.pending.len() >= IN_FLIGHT {
            self.land_one().await?;
        }
        Ok(())
    }

    /// Wait for the oldest chunk in flight (and its listing in the record).
    async fn land_one(&mut self) -> Result<(), BucketError> {
        let Some(task) = self.pending.pop_front() else { return Ok(()) };
        match task.await {
            Ok(r) => r?,
            Err(e) => {
                return Err(BucketError::Setup {
                    bucket: self.bucket.settings.bucket.clone(),
                    message: format!("chunk upload task: {e}"),
                })
            }
        }
        Ok(())
    }

    /// Every chunk handed over is in the bucket and listed in the record.
    pub async fn flush(&mut self) -> Result<(), BucketError> {
        while !self.pending.is_empty() {
            self.land_one().await?;
        }
        Ok(())
    }

    async fn write_record(&self) -> Result<(), BucketError> {
        let mut r = self.record.lock().await;
        r.progress.renewed_at = now_ms();
        self.bucket.put_json(&self.path, &r.progress, PutMode::Overwrite).await
    }

    /// Renew the record every third of `leaseTtl` while the upload lives: its `renewedAt` is
    /// what tells a follower the upload is still going. A dead upload is not renewed.
    fn spawn_renewer(&self) -> tokio::task::JoinHandle<()> {
        let (bucket, path, record) = (self.bucket.clone(), self.path.clone(), self.record.clone());
        let every = (self.bucket.settings.lease_ttl / 3).max(Duration::from_millis(10));
        let failed = self.failed.subscribe();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if *failed.borrow() {
                    return;
                }
                let mut r = record.lock().await;
                r.progress.renewed_at = now_ms();
                if let Err(e) = bucket.put_json(&path, &r.progress, PutMode::Overwrite).await {
                    tracing::debug!(record = %path, error = %e, "upload progress not renewed; retrying");
                }
            }
        })
    }

    /// Every chunk is in: write the index (the object is visible from now on), then drop the
    /// record. `size` must match the chunks handed over.
    pub async fn finish(
        mut self,
        d: &Digest,
        size: u64,
        media_type: Option<&str>,
    ) -> Result<Arc<ChunkIndex>, BucketError> {
        if self.queued == 0 {
            // An empty object is one empty chunk.
            self.put_chunk(Bytes::new()).await?;
        }
        self.flush().await?;
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        let (chunks, subs, chunk_size, upload) = {
            let mut r = self.record.lock().await;
            (r.progress.chunks.clone(), r.subs.take(), self.chunk_size, self.upload.clone())
        };
        let b = self.bucket.clone();
        let mut index = match self.chain {
            Some(c) => {
                // Every chunk linked, from the first byte to the object's end, which is `d`.
                let linked = c.total == size && self.handed == size && !self.ragged && !self.has_failed();
                if !linked || chunks.last() != Some(&d.hex()) {
                    return Err(b.corrupt(
                        &b.index_path(d),
                        format!("the chunks uploaded do not hash to {d} ({size} bytes); no index written"),
                    ));
                }
                let subs = subs.unwrap_or_default();
                ChunkIndex::of_chain(size, chunk_size, c.piece, chunks, subs, &b.settings.replica, &upload)
            }
            None => {
                let mut index = ChunkIndex::of_parts(size, chunk_size, chunks, &b.settings.replica, &upload);
                if let (Some(s), Some(subs)) = (self.sub_chunk_size, subs) {
                    if index.validate().is_ok() {
                        index = index.with_sub_chunks(s, subs);
                    }
                }
                index
            }
        };
        index.media_type = media_type.map(str::to_string);
        index.validate_for(d).map_err(|m| b.corrupt(&b.index_path(d), m))?;
        if let Some(k) = &b.settings.index_key {
            index.mac = Some(index.sign(k, d));
            index.signed = true;
        }
        b.put_json(&b.index_path(d), &index, PutMode::Overwrite).await?;
        self.drop_record(&upload).await;
        let index = Arc::new(index);
        b.remember_index(d, index.clone());
        Ok(index)
    }

    /// Delete the record if it still names this upload (a takeover's upload may own it now).
    async fn drop_record(&self, upload: &str) {
        let b = &self.bucket;
        if let Ok(Some(r)) = b.get_json::<Progress>(&self.path).await {
            if r.upload != upload {
                return;
            }
        }
        if let Ok(Err(e)) = b.call("delete", &self.path, b.store.delete(&self.path)).await {
            if !matches!(e, object_store::Error::NotFound { .. }) {
                tracing::debug!(record = %self.path, error = %e, "upload progress not deleted; the sweep removes it");
            }
        }
    }

    /// Give the upload up: its chunks and its record go (best effort, bounded; what stays
    /// behind is abandoned, and the sweep removes it).
    pub async fn abort(mut self) {
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        // Each ends within requestTimeout; awaited so none lands after its chunks were removed.
        for task in self.pending.drain(..) {
            let _ = task.await;
        }
        let upload = self.upload_id();
        if !self.bucket.breaker.is_up() {
            return;
        }
        if self.bucket.remove_parts(&upload, true).await.is_ok() {
            self.drop_record(&upload).await;
        }
    }
}

impl Bucket {
    pub(crate) fn part_path(&self, upload: &str, i: usize) -> ObjectPath {
        self.path(&format!("parts/{upload}/{i:08}"))
    }

    fn progress_path(&self, key: &str) -> ObjectPath {
        self.path(&format!("progress/{}.json", key_hash(key)))
    }

    /// Start an upload of chunk objects (no request is made before the first chunk). `lease`:
    /// the fill lease it runs under, so replicas waiting on the lease can follow it.
    pub fn begin_parts(
        self: &Arc<Self>,
        lease: Option<&str>,
        digest: Option<Digest>,
        total: Option<u64>,
    ) -> PartUpload {
        let upload = new_upload_id();
        let key = lease.map_or_else(|| format!("upload:{upload}"), str::to_string);
        let now = now_ms();
        let cs = self.settings.chunk_size;
        // Chain form when the links can be computed from the first byte: the size known, the
        // digest sha256, chunks of whole blocks. Pieces as the sub-chunks, unless an index
        // would list too many.
        let chain = match total {
            Some(t)
                if digest.is_none_or(|d| d.algorithm() == tender_oci::Algorithm::Sha256) && cs.is_multiple_of(64) =>
            {
                let piece = self.settings.sub_chunks_of(cs).filter(|p| p.is_multiple_of(64)).unwrap_or(cs);
                let piece = if ChunkIndex::chunk_count(t, piece) > crate::MAX_SUB_CHUNKS { cs } else { piece };
                Some(ChainUp { piece, total: t, next: Some(crate::chain::START) })
            }
            _ => None,
        };
        let record = Progress {
            key: key.clone(),
            upload,
            replica: self.settings.replica.clone(),
            chunk_size: cs,
            total,
            digest,
            leased: lease.is_some(),
            chunks: Vec::new(),
            chained: chain.is_some(),
            head: None,
            started_at: now,
            renewed_at: now,
        };
        let sub_chunk_size = self.settings.sub_chunks_of(record.chunk_size);
        PartUpload {
            bucket: self.clone(),
            upload: record.upload.clone(),
            chunk_size: record.chunk_size,
            sub_chunk_size,
            path: self.progress_path(&key),
            record: Arc::new(tokio::sync::Mutex::new(Recorded {
                progress: record,
                landed: Default::default(),
                subs: (sub_chunk_size.is_some() || chain.is_some()).then(Vec::new),
                sub_count: 0,
            })),
            pending: VecDeque::new(),
            queued: 0,
            handed: 0,
            ragged: false,
            recorded: false,
            renewer: None,
            failed: Arc::new(tokio::sync::watch::channel(false).0),
            chain,
            hashed: 0,
        }
    }

    /// The progress of the upload running under the fill lease `key`, if one is.
    pub async fn progress(&self, key: &str) -> Result<Option<Progress>, BucketError> {
        let p = self.progress_path(key);
        let Some(r) = self.get_json::<Progress>(&p).await? else { return Ok(None) };
        r.validate().map_err(|m| self.corrupt(&p, m))?;
        if r.key != key {
            return Err(self.corrupt(&p, format!("progress record names {:?}, not {key:?}", r.key)));
        }
        Ok(Some(r))
    }

    /// Chunk `i` of an upload, checked with `check` (from its index or progress record), and
    /// against its length `len` when known. One longer than `max` (its record's chunk size) is
    /// refused before a byte of it is read.
    pub async fn part(
        &self,
        upload: &str,
        i: usize,
        check: &ChunkCheck,
        len: Option<u64>,
        max: u64,
    ) -> Result<Bytes, BucketError> {
        let p = self.part_path(upload, i);
        let max = len.unwrap_or(max).min(max);
        let bytes = match self.call("get", &p, self.get_at_most(&p, max)).await? {
            Ok(Ok(b)) => b,
            Ok(Err(n)) => {
                return Err(self
                    .corrupt(&p, format!("chunk {i} is {n} bytes, more than the {max} its record allows; not read")))
            }
            Err(e) => return Err(self.store_err("get", &p, e)),
        };
        if let Err(m) = self.check_chunk(&bytes, check, len).await? {
            return Err(self.corrupt(&p, format!("chunk {i} ({} bytes) {m}; not served", bytes.len())));
        }
        self.metrics.read_bytes.inc_by(bytes.len() as u64);
        Ok(bytes)
    }

    /// Check a chunk's bytes (on a blocking thread: megabytes): `Ok(Err(why))` when they are
    /// not what `check` says.
    pub(crate) async fn check_chunk(
        &self,
        bytes: &Bytes,
        check: &ChunkCheck,
        len: Option<u64>,
    ) -> Result<Result<(), String>, BucketError> {
        if let Some(n) = len.filter(|n| *n != bytes.len() as u64) {
            return Ok(Err(format!("is not the {n} bytes its record says")));
        }
        let (checked, check) = (bytes.clone(), check.clone());
        tokio::task::spawn_blocking(move || match &check {
            ChunkCheck::Sha256(want) => {
                let got = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&checked));
                if got == *want {
                    Ok(())
                } else {
                    Err(format!("has sha256 {got}, which does not match its record"))
                }
            }
            ChunkCheck::Chain(l) => crate::chain::check_link(l, &checked).map(|_| ()),
        })
        .await
        .map_err(|e| BucketError::Setup {
            bucket: self.settings.bucket.clone(),
            message: format!("hashing a chunk: {e}"),
        })
    }

    /// Delete every chunk object of an upload. `gated`: refused while the breaker is open.
    pub(crate) async fn remove_parts(&self, upload: &str, gated: bool) -> Result<u64, BucketError> {
        if !is_upload_id(upload) {
            return Ok(0);
        }
        let dir = self.path(&format!("parts/{upload}"));
        let list = self.store.list(Some(&dir)).try_collect::<Vec<_>>();
        let metas = if gated { self.call("list", &dir, list).await? } else { self.timed("list", &dir, list).await? };
        let metas = metas.map_err(|e| self.store_err("list", &dir, e))?;
        let mut removed = 0;
        for m in metas {
            let p = m.location;
            match self.timed("delete", &p, self.store.delete(&p)).await? {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => removed += 1,
                Err(e) => return Err(self.store_err("delete", &p, e)),
            }
        }
        Ok(removed)
    }
}
