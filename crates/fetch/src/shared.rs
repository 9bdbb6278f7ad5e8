//! A replica's side of the shared bucket (`storage.s3`): before a fill goes upstream it looks
//! in the bucket, and with leases on it waits for the replica that already fetches; after a
//! fill from upstream commits, its object goes to the bucket for the others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tender_bucket::{Bucket, BucketError, ChunkIndex, Lease, LeaseOutcome, PartUpload, Progress};
use tender_oci::Digest;
use tender_store::{Store, TrustRecord};

use crate::error::{FetchError, FetchErrorKind};
use crate::expect::{Expect, Opened, Source};

/// How often a replica waiting on another's fill asks the bucket for news.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// How often it asks while its clients have no byte yet (see [`first_pause`]).
const FIRST_POLL: Duration = Duration::from_millis(25);
/// How long a follower that read every chunk waits for the holder's signed index before it
/// hashes the object itself: the holder writes it right after its last chunk, and the
/// follower's clients wait for their last byte meanwhile.
const VOUCH_WAIT: Duration = Duration::from_secs(2);

/// The pause between two looks for the holder's first bytes, `waited` into the wait: they are
/// due within milliseconds (the holder announces its upload with them), so 10 ms for the first
/// quarter second, 25 ms to 2 s, then [`FOLLOW_POLL`]: about 95 requests in the first 2 s of a
/// wait, not many more than 25 ms throughout (a fleet booting at once has many waits at once).
fn first_pause(waited: Duration) -> Duration {
    if waited < Duration::from_millis(250) {
        Duration::from_millis(10)
    } else if waited < Duration::from_secs(2) {
        FIRST_POLL
    } else {
        FOLLOW_POLL
    }
}

/// An object the bucket holds, found by digest or by asset key.
#[derive(Debug, Clone)]
pub struct SharedObject {
    pub digest: Digest,
    pub index: Arc<ChunkIndex>,
    /// The asset's trust record, when found by key.
    pub trust: Option<TrustRecord>,
}

/// Where a fill gets its bytes when the bucket is configured.
pub(crate) enum Plan {
    /// Another replica committed it: copy it from the bucket, chunk by chunk, verified.
    Bucket(SharedObject),
    /// Another replica fetches it now and writes its chunks to the bucket as they land: read
    /// them as they appear.
    Follow(Finished, Progress),
    /// Fetch from upstream; holding the lease when one was taken.
    Upstream(Option<Lease>),
}

/// How a replica following another's upload finds the finished object once the upload's
/// progress record is gone (its index is written before the record goes).
#[derive(Debug, Clone)]
pub(crate) enum Finished {
    /// A registry object: its index by digest.
    Digest(Digest),
    /// An Image Factory asset, whose digest is known once fetched: the trust record the holder
    /// puts under this key after the index names it.
    Trust(String),
}

impl Finished {
    /// The digest, when known before the object is.
    pub(crate) fn digest(&self) -> Option<Digest> {
        match self {
            Finished::Digest(d) => Some(*d),
            Finished::Trust(_) => None,
        }
    }

    pub(crate) fn of(expect: &Expect) -> Finished {
        match expect {
            Expect::Digest(d) => Finished::Digest(*d),
            Expect::Tofu { key, .. } => Finished::Trust(key.clone()),
        }
    }
}

/// The finished object's digest and index, once the bucket names both.
async fn finished_index(
    bucket: &Bucket,
    finished: &Finished,
) -> Result<Option<(Digest, Arc<ChunkIndex>)>, BucketError> {
    let d = match finished {
        Finished::Digest(d) => *d,
        Finished::Trust(key) => match bucket.trust(key).await? {
            Some(t) => t.digest,
            None => return Ok(None),
        },
    };
    Ok(bucket.index(&d).await?.map(|index| (d, index)))
}

/// The label a bucket-sourced fill carries in metrics and logs.
pub fn source_label(bucket: &Bucket) -> String {
    format!("bucket:{}", bucket.name())
}

/// A bucket copy's error as a fill sees it. Never retried: gone since its index was read, or
/// down (the bucket client already retried within `requestTimeout`, and the breaker is open
/// now), the fill goes on from the upstream at once; only corrupt bytes are their own kind.
pub(crate) fn fetch_error(bucket: &Bucket, e: BucketError) -> FetchError {
    let kind = if e.is_corrupt() { FetchErrorKind::Corrupt } else { FetchErrorKind::NotFound };
    FetchError::new(kind, &source_label(bucket), e.to_string())
}

/// The object `expect` asks for, if the bucket holds it. With `known_in`, only if the object is
/// known to exist in that upstream (recorded here or in the bucket): a fill for one upstream
/// never hands out a copy that only another upstream's clients may have.
pub async fn lookup(
    bucket: &Bucket,
    store: &Store,
    expect: &Expect,
    known_in: Option<&str>,
) -> Result<Option<SharedObject>, BucketError> {
    let (digest, trust) = match expect {
        Expect::Digest(d) => (*d, None),
        Expect::Tofu { key, .. } => match store.trust_get(key).ok().flatten() {
            Some(t) => (t.digest, Some(t)),
            None => match bucket.trust(key).await? {
                Some(t) => {
                    // Recorded locally too, so a refill from the factory is checked against it.
                    if let Err(e) = store.trust_put(&t) {
                        tracing::warn!(key, error = %e, "could not record the bucket's trust record locally");
                    }
                    (t.digest, Some(t))
                }
                None => return Ok(None),
            },
        },
    };
    if let Some(u) = known_in {
        if !store.is_known_in(&digest, u).unwrap_or(false) && !bucket.is_known(&digest, u).await? {
            return Ok(None);
        }
    }
    Ok(bucket.index(&digest).await?.map(|index| SharedObject { digest, index, trust }))
}

/// Decide where the fill of `key` gets its bytes. Waits (bounded by `deadline`) while another
/// replica holds the lease; a bucket that cannot be reached never blocks a fill: it goes
/// upstream.
pub(crate) async fn plan(
    bucket: &Arc<Bucket>,
    store: &Store,
    key: &str,
    expect: &Expect,
    known_in: Option<&str>,
    deadline: Instant,
) -> Plan {
    let mut waited = false;
    let began = Instant::now();
    let ttl = bucket.settings().lease_ttl;
    // Since when another replica holds the lease with no upload this replica can follow.
    let mut no_upload_since: Option<Instant> = None;
    loop {
        match lookup(bucket, store, expect, known_in).await {
            Ok(Some(found)) => return Plan::Bucket(found),
            Ok(None) => {}
            Err(e) if e.is_down() => return Plan::Upstream(None),
            Err(e) => {
                tracing::warn!(key, error = %e, "shared bucket unavailable; fetching from upstream");
                return Plan::Upstream(None);
            }
        }
        if !bucket.lease_enabled() {
            return Plan::Upstream(None);
        }
        match bucket.lease(key).await {
            Ok(LeaseOutcome::Won(lease)) => {
                // The holder may have committed between our look and our lease.
                if waited {
                    if let Ok(Some(found)) = lookup(bucket, store, expect, known_in).await {
                        lease.release().await;
                        return Plan::Bucket(found);
                    }
                }
                return Plan::Upstream(Some(lease));
            }
            Ok(LeaseOutcome::Held { owner, retry_in }) => {
                // A registry object must be the one the upload names (when it names one); an
                // asset's bytes are checked by this fill as a fetch from the factory would be.
                let finished = Finished::of(expect);
                // The holder's record is looked for every pause; the bucket's index and the
                // lease again (the holder may have finished, or died) once per FOLLOW_POLL.
                let recheck = crate::later(retry_in.clamp(FIRST_POLL, FOLLOW_POLL));
                loop {
                    match bucket.progress(key).await {
                        // A record not renewed for a lease term is an upload nobody is doing.
                        Ok(Some(p))
                            if p.is_fresh(ttl)
                                && finished.digest().is_none_or(|d| p.digest.is_none_or(|pd| pd == d)) =>
                        {
                            tracing::info!(key, %owner, upload = %p.upload, chunks = p.chunks.len(),
                                "another replica fetches this object; reading its chunks from the bucket as they land");
                            return Plan::Follow(finished, p);
                        }
                        Ok(_) => {}
                        Err(e) if e.is_down() => return Plan::Upstream(None),
                        Err(e) => tracing::debug!(key, error = %e, "upload progress unreadable; waiting for the index"),
                    }
                    if !waited {
                        tracing::info!(key, %owner, "another replica fetches this object; waiting for it in the bucket");
                    }
                    waited = true;
                    // A holder that shows no upload for a lease term (it has not announced one,
                    // or its upload stopped and its lease has not run out yet) is not waited
                    // for any longer: fetch alone.
                    let since = *no_upload_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > ttl {
                        tracing::warn!(key, %owner, ttl = ?ttl,
                            "the replica holding the fill lease shows no upload in progress; fetching from upstream");
                        return Plan::Upstream(None);
                    }
                    let pause = first_pause(began.elapsed());
                    if crate::later(pause) >= deadline {
                        tracing::warn!(key, %owner, "waited for another replica until the fill deadline; fetching from upstream");
                        return Plan::Upstream(None);
                    }
                    tokio::time::sleep(pause).await;
                    if Instant::now() >= recheck {
                        break;
                    }
                }
            }
            Err(e) if e.is_down() => return Plan::Upstream(None),
            Err(e) => {
                tracing::warn!(key, error = %e, "fill lease unavailable; fetching from upstream");
                return Plan::Upstream(None);
            }
        }
    }
}

/// What a replica whose followed upload stopped does next.
pub(crate) enum TakeOver {
    /// It holds the lease now: it fetches the rest, and writes its chunks for the others.
    Won(Lease),
    /// Another waiter took over first: follow that one's upload.
    Follow(Progress),
    /// Fetch the rest without a lease (leases off, the bucket down, nothing to follow yet).
    Alone,
}

/// Take the fill lease of `key` over after the upload `failed` (the one this replica followed,
/// by replica `failed_replica`) stopped. When another waiter won it at the same moment, follow
/// that one's upload once it is announced (a fresh record), waiting for it at most `leaseTtl`;
/// while the replica whose upload stopped still holds the lease, or when nothing can be
/// followed, fetch alone.
pub(crate) async fn take_over(bucket: &Arc<Bucket>, key: &str, failed: &str, failed_replica: &str) -> TakeOver {
    if !bucket.lease_enabled() {
        return TakeOver::Alone;
    }
    let ttl = bucket.settings().lease_ttl;
    let began = Instant::now();
    loop {
        match bucket.lease(key).await {
            Ok(LeaseOutcome::Won(l)) => return TakeOver::Won(l),
            Ok(LeaseOutcome::Held { owner, .. }) => match bucket.progress(key).await {
                Ok(Some(p)) if p.upload != failed && p.is_fresh(ttl) => return TakeOver::Follow(p),
                // Its holder keeps the lease and does no upload: nothing to wait for.
                Ok(_) if owner == failed_replica => return TakeOver::Alone,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(key, error = %e, "upload progress unreadable; fetching the rest alone");
                    return TakeOver::Alone;
                }
            },
            Err(e) => {
                tracing::debug!(key, error = %e, "fill lease not taken over; fetching the rest alone");
                return TakeOver::Alone;
            }
        }
        let pause = first_pause(began.elapsed());
        if began.elapsed().saturating_add(pause) > ttl {
            tracing::info!(
                key,
                "another replica took the fill lease over and shows no upload yet; fetching the rest alone"
            );
            return TakeOver::Alone;
        }
        tokio::time::sleep(pause).await;
    }
}

/// Upload a committed object (and an asset's trust record, or the upstream a registry object
/// is known in), retrying a few times; then give the lease up (after the known record, so a
/// replica waiting on the lease finds the object usable). `replace`: the bucket's copy failed
/// verification; overwrite it. A failure leaves the object local only: other replicas fetch it
/// themselves.
#[allow(clippy::too_many_arguments)] // one call site; each argument is a different fact
pub(crate) async fn publish(
    bucket: Arc<Bucket>,
    digest: Digest,
    path: std::path::PathBuf,
    trust: Option<TrustRecord>,
    known_in: Option<String>,
    lease: Option<Lease>,
    replace: bool,
    mut resume: Option<PartUpload>,
) {
    let mut attempt = 0u32;
    loop {
        attempt = attempt.saturating_add(1);
        // A lease given up (its upload stopped) or lost may be another replica's now: its
        // key's record is that replica's, so this upload runs under its own.
        let key = lease.as_ref().filter(|l| l.held()).map(Lease::key);
        let uploaded = if replace {
            if let Some(u) = resume.take() {
                u.abort().await;
            }
            bucket.replace(&digest, &path, key).await
        } else {
            bucket.upload_resumed(&digest, &path, key, resume.take()).await
        };
        let result = match uploaded {
            Ok(_) => match (&trust, &known_in) {
                (Some(t), _) => bucket.put_trust(t).await,
                (None, Some(u)) => bucket.put_known(&digest, u).await,
                (None, None) => Ok(()),
            },
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => break,
            Err(e) if e.is_down() => {
                tracing::info!(%digest, error = %e, "not uploaded to the shared bucket (down); the object stays on this replica only");
                break;
            }
            Err(e) if !e.is_corrupt() && attempt < 4 => {
                let wait = Duration::from_millis(500).saturating_mul(2u32.saturating_pow(attempt));
                tracing::warn!(%digest, attempt, error = %e, "upload to the shared bucket failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                tracing::error!(%digest, error = %e, "upload to the shared bucket failed; the object stays on this replica only");
                break;
            }
        }
    }
    if let Some(l) = lease {
        l.release().await;
    }
}

/// A fill's source that copies a committed object out of the bucket.
pub(crate) struct BucketSource {
    pub bucket: Arc<Bucket>,
    pub label: String,
    pub object: SharedObject,
}

impl Source for BucketSource {
    fn upstream(&self) -> &str {
        &self.label
    }

    fn open(&self, offset: u64) -> BoxFuture<'static, Result<Opened, FetchError>> {
        let (bucket, d, index) = (self.bucket.clone(), self.object.digest, self.object.index.clone());
        async move {
            let total = index.size;
            let b = bucket.clone();
            // A signed index names the digest of the chunks it lists, and an index in chain
            // form ends its chunks in the digest itself: a copy of every chunk from the first,
            // each verified against it, is that digest's bytes.
            let vouch = ((index.signed || index.is_chain()) && offset == 0).then(tender_store::Vouch::new);
            let body = bucket.copy(d, index, offset, total).map(move |r| r.map_err(|e| fetch_error(&b, e)));
            let body = match &vouch {
                Some(v) => vouching(body, v.clone(), d, total).boxed(),
                None => body.boxed(),
            };
            Ok(Opened { partial: true, total: Some(total), body, vouch })
        }
        .boxed()
    }
}

/// `body` (chunks verified against a signed index of `d`), proving `d` once it ended after
/// `len` bytes without an error.
fn vouching<E: Send + 'static>(
    body: impl futures::Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    vouch: tender_store::Vouch,
    d: Digest,
    len: u64,
) -> impl futures::Stream<Item = Result<bytes::Bytes, E>> + Send + 'static {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (seen, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let (s2, f2) = (seen.clone(), failed.clone());
    body.inspect(move |r| match r {
        Ok(b) => {
            s2.fetch_add(b.len() as u64, Ordering::Relaxed);
        }
        Err(_) => f2.store(true, Ordering::Relaxed),
    })
    .map(Some)
    .chain(futures::stream::once(async move {
        if !failed.load(Ordering::Relaxed) && seen.load(Ordering::Relaxed) == len {
            vouch.prove(d);
        }
        None
    }))
    .filter_map(futures::future::ready)
}

/// Whether `index` is signed and lists `verified` as its first chunks.
fn lists(index: &ChunkIndex, verified: &[String]) -> bool {
    index.signed && index.chunks.get(..verified.len()).is_some_and(|c| c == verified)
}

/// A fill's source that reads another replica's upload in progress chunk by chunk as its
/// chunks appear (polling at most every 100 ms), then the finished object by its index. Stops
/// with an error (and the fill continues from the upstream at the same byte) when the upload
/// is replaced, or shows no progress (no chunk listed, its record not renewed) for `leaseTtl`.
pub(crate) struct FollowSource {
    pub bucket: Arc<Bucket>,
    pub label: String,
    pub key: String,
    pub finished: Finished,
    pub progress: Progress,
}

struct Follow {
    bucket: Arc<Bucket>,
    key: String,
    finished: Finished,
    progress: Progress,
    /// The next chunk, and where in it the requested bytes start.
    next: usize,
    skip: usize,
    /// The head the record carried, once streamed: the first chunk must begin with it.
    head_sent: Option<bytes::Bytes>,
    began: Instant,
    last_news: Instant,
    /// The object finished: the rest comes by its index.
    rest: Option<futures::stream::BoxStream<'static, Result<bytes::Bytes, BucketError>>>,
    /// Opened at the first byte, with the replicas' index key or of an upload in chain form:
    /// proven once every chunk followed is the one the object's signed index lists, or once
    /// the chain of the chunks followed ended in the object's digest (then the fill hashes no
    /// byte twice), along with the entries the chunks followed were verified against.
    vouch: Option<(tender_store::Vouch, Vec<String>)>,
    /// In chain form: the last chunk followed ended the chain, in this digest.
    chain_end: Option<Digest>,
}

impl Follow {
    fn err(&self, message: String) -> BucketError {
        BucketError::Setup { bucket: self.bucket.name().to_string(), message }
    }

    /// Every chunk of the object was followed: prove its digest when the signed index, which
    /// the holder writes right after its last chunk, lists exactly the chunks followed. Waited
    /// for at most [`VOUCH_WAIT`] (the client's last byte waits on the fill's verdict); without
    /// it the fill hashes its bytes from its file, as a follower without the key does.
    async fn vouch_at_end(&mut self, total: u64) {
        let Some((vouch, verified)) = self.vouch.take() else { return };
        if self.progress.chained {
            // The chunks followed, each a link from the one before, ended in this digest: it
            // is the digest of the bytes delivered, whoever wrote the record.
            if let Some(d) = self.chain_end.filter(|d| self.finished.digest().is_none_or(|f| f == *d)) {
                if verified.len() == ChunkIndex::chunk_count(total, self.progress.chunk_size) {
                    vouch.prove(d);
                }
            }
            return;
        }
        let waited = Instant::now();
        loop {
            match finished_index(&self.bucket, &self.finished).await {
                Ok(Some((d, index))) => {
                    if index.size == total && index.chunks.len() == verified.len() && lists(&index, &verified) {
                        vouch.prove(d);
                    }
                    return;
                }
                Ok(None) if waited.elapsed() < VOUCH_WAIT.min(self.bucket.settings().lease_ttl) => {
                    tokio::time::sleep(FOLLOW_POLL.min(first_pause(waited.elapsed()))).await;
                }
                _ => return,
            }
        }
    }

    /// The next piece of the object, `None` at its end.
    async fn next(&mut self) -> Option<Result<bytes::Bytes, BucketError>> {
        loop {
            if let Some(rest) = self.rest.as_mut() {
                return rest.next().await;
            }
            let cs = self.progress.chunk_size;
            if let Some(total) = self.progress.total {
                if (self.next as u64).saturating_mul(cs).saturating_add(self.skip as u64) >= total {
                    self.vouch_at_end(total).await;
                    return None;
                }
            }
            if let Some(hash) = self.progress.chunks.get(self.next) {
                // The last chunk's length is known once the size is; every other is a whole one.
                let len = self.progress.total.map(|t| t.saturating_sub((self.next as u64).saturating_mul(cs)).min(cs));
                let Some(mut check) = self.progress.check_of(self.next, len) else {
                    return Some(Err(
                        self.err(format!("chunk {} of upload {} cannot be checked", self.next, self.progress.upload))
                    ));
                };
                if let (tender_bucket::chain::ChunkCheck::Chain(l), Some((_, verified))) = (&mut check, &self.vouch) {
                    // A link starts where the chunk before it was seen to end (the record may
                    // have been rewritten since): the chain followed is unbroken.
                    match verified.last().and_then(|v| tender_bucket::chain::state_of(v)) {
                        Some(s) if verified.len() == self.next => l.start = s,
                        None if self.next == 0 => {}
                        _ => self.vouch = None,
                    }
                }
                let b = match self.bucket.part(&self.progress.upload, self.next, &check, len, cs).await {
                    Ok(b) => b,
                    Err(e) => return Some(Err(e)),
                };
                if let tender_bucket::chain::ChunkCheck::Chain(l) = &check {
                    if l.last {
                        self.chain_end = Digest::from_hex(tender_oci::Algorithm::Sha256, &l.end).ok();
                    }
                }
                if self.next == 0 {
                    if let Some(h) = self.head_sent.take() {
                        if !b.starts_with(&h) {
                            return Some(Err(self.err(format!(
                                "chunk 0 of upload {} does not begin with the {} bytes its record carried",
                                self.progress.upload,
                                h.len()
                            ))));
                        }
                    }
                }
                if let Some((_, verified)) = self.vouch.as_mut() {
                    verified.push(hash.clone());
                }
                self.next = self.next.saturating_add(1);
                let from = std::mem::take(&mut self.skip).min(b.len());
                return Some(Ok(b.slice(from..)));
            }
            if self.next == 0 && self.head_sent.is_none() {
                // The record carries the object's first bytes until the first chunk is in.
                match self.progress.head_bytes() {
                    Ok(Some(h)) if self.skip < h.len() => {
                        let piece = h.slice(self.skip..);
                        self.skip = h.len();
                        self.head_sent = Some(h);
                        return Some(Ok(piece));
                    }
                    Ok(_) => {}
                    Err(m) => return Some(Err(self.err(m))),
                }
            }
            let first = self.next == 0 && self.head_sent.is_none();
            tokio::time::sleep(if first { first_pause(self.began.elapsed()) } else { FOLLOW_POLL }).await;
            match self.bucket.progress(&self.key).await {
                Ok(Some(p)) if p.upload == self.progress.upload && p.chunk_size == self.progress.chunk_size => {
                    // A chunk listed, or the record renewed: the upload goes on.
                    if p.chunks.len() > self.progress.chunks.len() || p.renewed_at > self.progress.renewed_at {
                        self.last_news = Instant::now();
                    }
                    self.progress = p;
                }
                Ok(Some(p)) => {
                    return Some(Err(self.err(format!("upload {} replaced by {}", self.progress.upload, p.upload))))
                }
                Ok(None) => {
                    // Finished (the index is written before the record goes), or given up.
                    return match finished_index(&self.bucket, &self.finished).await {
                        Ok(Some((d, index))) => {
                            let at = (self.next as u64).saturating_mul(cs).saturating_add(self.skip as u64);
                            let size = index.size;
                            // The index goes on from the chunks followed: signed and listing
                            // them, or a chain whose first links are theirs.
                            let chained = |v: &[String]| {
                                self.progress.chained && index.is_chain() && index.chunks.get(..v.len()) == Some(v)
                            };
                            let vouch = self.vouch.take().filter(|(_, verified)| {
                                self.skip == 0 && (lists(&index, verified) || chained(verified))
                            });
                            let rest = self.bucket.copy(d, index, at, size);
                            self.rest = Some(match vouch {
                                Some((v, _)) => vouching(rest, v, d, size.saturating_sub(at)).boxed(),
                                None => rest,
                            });
                            continue;
                        }
                        // An asset's trust record follows its index: look again while the
                        // replica that fetched it still holds the lease.
                        Ok(None)
                            if matches!(self.finished, Finished::Trust(_))
                                && self.bucket.lease_live(&self.key).await.unwrap_or(false) =>
                        {
                            continue;
                        }
                        Ok(None) => Some(Err(self.err("the replica fetching it gave up".into()))),
                        Err(e) => Some(Err(e)),
                    };
                }
                Err(e) => return Some(Err(e)),
            }
            // No news for a lease term: nobody is doing this upload any more (its record is
            // renewed every third of a term while it lives), whether or not its replica still
            // holds the lease. The fill goes on from the upstream at this byte, or follows
            // whoever takes the lease over.
            let ttl = self.bucket.settings().lease_ttl;
            if self.last_news.elapsed() > ttl {
                return Some(Err(self.err(format!(
                    "upload {} of replica {} shows no progress for {ttl:?}",
                    self.progress.upload, self.progress.replica
                ))));
            }
        }
    }
}

impl Source for FollowSource {
    fn upstream(&self) -> &str {
        &self.label
    }

    fn open(&self, offset: u64) -> BoxFuture<'static, Result<Opened, FetchError>> {
        let cs = self.progress.chunk_size.max(1);
        let follow = Follow {
            bucket: self.bucket.clone(),
            key: self.key.clone(),
            finished: self.finished.clone(),
            progress: self.progress.clone(),
            next: usize::try_from(offset.checked_div(cs).unwrap_or(0)).unwrap_or(usize::MAX),
            skip: usize::try_from(offset.checked_rem(cs).unwrap_or(0)).unwrap_or(0),
            head_sent: None,
            began: Instant::now(),
            last_news: Instant::now(),
            rest: None,
            vouch: (offset == 0 && (self.bucket.settings().index_key.is_some() || self.progress.chained))
                .then(|| (tender_store::Vouch::new(), Vec::new())),
            chain_end: None,
        };
        let vouch = follow.vouch.as_ref().map(|(v, _)| v.clone());
        let total = self.progress.total;
        let bucket = self.bucket.clone();
        async move {
            let body = futures::stream::unfold(follow, |mut f| async move { f.next().await.map(|r| (r, f)) })
                .map(move |r| r.map_err(|e| fetch_error(&bucket, e)))
                .boxed();
            Ok(Opened { partial: true, total, body, vouch })
        }
        .boxed()
    }
}
