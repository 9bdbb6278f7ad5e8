//! The object source: every reader of an object this replica does not hold locally goes
//! local store → shared bucket → upstream, and a source that fails mid-stream (the bucket down,
//! the object quarantined, a chunk that fails its check) hands over to the next at the same
//! byte, so a client sees latency, never a cut. Full bodies get this from the fill
//! ([`crate::flight`]: a `BucketSource` or `FollowSource` fill continues from the upstream);
//! ranges and `HEAD`s answered straight from the bucket get it here ([`Flights::shared_range`]).
//! A chunk the bucket lacked is put back from the local copy the rest came from (module
//! `heal`; a fill does it once it commits).
//! The server's handlers ask [`Flights::shared_lookup`] and [`Flights::shared_range`] and
//! never see the bucket.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use tender_bucket::Bucket;
use tender_oci::Digest;
use tender_store::Store;

use crate::flight::{stored_reader, Claim, Flights};
use crate::shared::SharedObject;
use crate::FetchError;

impl Flights {
    /// Bytes `start..end` of an object the bucket holds ([`Flights::shared_lookup`]): from
    /// the bucket, each chunk verified before a byte of it goes on; when the bucket fails (at
    /// the first byte or later), the rest from `fallback` at the same byte.
    pub fn shared_range(
        &self,
        found: &SharedObject,
        start: u64,
        end: u64,
        fallback: Fallback,
    ) -> BoxStream<'static, io::Result<Bytes>> {
        match self.shared() {
            Some(bucket) => resilient_range(bucket, found, start, end, fallback),
            None => match fallback.open(found.digest, start, end, None) {
                Ok(s) => s,
                Err(e) => stream::once(async move { Err(e) }).boxed(),
            },
        }
    }
}

/// Where the rest of a range comes from when the bucket fails while serving it: the object's
/// claim as a miss would make it (a fill from the upstream, or the local copy committed since).
pub struct Fallback {
    pub store: Arc<Store>,
    pub claim: Box<dyn FnOnce() -> Result<Claim, FetchError> + Send>,
}

impl Fallback {
    /// Bytes `from..end` of the object, from its local copy or its fill. `heal`: the bucket
    /// lacked a chunk; a local copy puts it back (a fill does once it commits).
    fn open(
        self,
        digest: Digest,
        from: u64,
        end: u64,
        heal: Option<Arc<Bucket>>,
    ) -> io::Result<BoxStream<'static, io::Result<Bytes>>> {
        match (self.claim)().map_err(io::Error::other)? {
            Claim::Stored(d) => {
                if let Some(bucket) = heal {
                    crate::heal::spawn(bucket, d, self.store.object_path(&d));
                }
                let (file, len) = self
                    .store
                    .open_object(&d)
                    .map_err(io::Error::other)?
                    .ok_or_else(|| io::Error::other(format!("{digest} vanished from the store")))?;
                Ok(stored_reader(file, len, d, from, end))
            }
            Claim::Filling(fill) => Ok(fill.reader(from, Some(end), false)),
        }
    }
}

/// Bytes `start..end` from the bucket; when the bucket fails (at the first byte or later), the
/// rest from `fallback` at the same byte: the client sees latency, never a cut. Corrupt bucket
/// bytes are never handed on (each chunk is verified first), so the fallback covers them too.
pub(crate) fn resilient_range(
    bucket: &Arc<Bucket>,
    found: &SharedObject,
    start: u64,
    end: u64,
    fallback: Fallback,
) -> BoxStream<'static, io::Result<Bytes>> {
    enum From {
        Bucket(BoxStream<'static, Result<Bytes, tender_bucket::BucketError>>, Fallback, Arc<Bucket>),
        Other(BoxStream<'static, io::Result<Bytes>>),
        Done,
    }
    let digest = found.digest;
    let first = From::Bucket(bucket.read(digest, found.index.clone(), start, end), fallback, bucket.clone());
    stream::unfold((first, start), move |(from, pos)| async move {
        match from {
            From::Bucket(mut s, fallback, bucket) => match s.next().await {
                Some(Ok(b)) => {
                    let next = pos.saturating_add(b.len() as u64);
                    Some((Ok(b), (From::Bucket(s, fallback, bucket), next)))
                }
                None => None,
                Some(Err(e)) => {
                    tracing::warn!(%digest, at = pos, end, error = %e,
                        "shared bucket failed while serving a range; the rest from the local copy or the upstream");
                    drop(s);
                    match fallback.open(digest, pos, end, e.is_not_found().then_some(bucket)) {
                        Ok(mut other) => {
                            let item = other.next().await?;
                            Some((item, (From::Other(other), pos)))
                        }
                        Err(e) => Some((Err(e), (From::Done, pos))),
                    }
                }
            },
            From::Other(mut s) => {
                let item = s.next().await?;
                Some((item, (From::Other(s), pos)))
            }
            From::Done => None,
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use futures::TryStreamExt as _;
    use object_store::ObjectStore as _;

    /// Issue 36 (2): a range the bucket cannot finish for want of a chunk goes on from the
    /// local copy at the same byte, and the chunk is put back from that copy, off the response
    /// path.
    #[tokio::test]
    async fn should_put_a_missing_chunk_back_from_the_local_copy_a_range_went_on_from() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path(), tender_store::OpenMode::Exclusive).unwrap());
        let mut settings = tender_bucket::BucketSettings::new("fleet");
        settings.chunk_size = 1024;
        let mem = Arc::new(object_store::memory::InMemory::new());
        let bucket = Bucket::with_store(mem.clone(), settings, tender_bucket::BucketMetrics::default());
        let content: Vec<u8> = (0..3 * 1024 + 5).map(|i| (i % 251) as u8).collect();
        let d = Digest::of(&content);
        let local = store.put_bytes("k", &content, &d).unwrap();
        let index = bucket.upload(&d, &local).await.unwrap();
        let upload = index.upload.clone().expect("chunk objects");
        let hole = object_store::path::Path::from(format!("parts/{upload}/00000001"));
        mem.delete(&hole).await.unwrap();

        let found = SharedObject { digest: d, index, trust: None };
        let fallback = Fallback { store: store.clone(), claim: Box::new(move || Ok(Claim::Stored(d))) };
        let got: Vec<Bytes> = resilient_range(&bucket, &found, 100, 3000, fallback).try_collect().await.unwrap();
        assert_eq!(got.concat(), &content[100..3000], "byte-exact, not cut");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while mem.head(&hole).await.is_err() {
            assert!(std::time::Instant::now() < deadline, "the missing chunk was never put back");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(bucket.metrics().healed_chunks.get(), 1);
    }
}
