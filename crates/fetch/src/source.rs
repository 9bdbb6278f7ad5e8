//! The object source: every reader of an object this replica does not hold locally goes
//! local store → shared bucket → upstream, and a source that fails mid-stream (the bucket down,
//! the object quarantined, a chunk that fails its check) hands over to the next at the same
//! byte, so a client sees latency, never a cut. Full bodies get this from the fill
//! ([`crate::flight`]: a `BucketSource` or `FollowSource` fill continues from the upstream);
//! ranges and `HEAD`s answered straight from the bucket get it here ([`Flights::shared_range`]).
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
            None => match fallback.open(found.digest, start, end) {
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
    /// Bytes `from..end` of the object, from its local copy or its fill.
    fn open(self, digest: Digest, from: u64, end: u64) -> io::Result<BoxStream<'static, io::Result<Bytes>>> {
        match (self.claim)().map_err(io::Error::other)? {
            Claim::Stored(d) => {
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
        Bucket(BoxStream<'static, Result<Bytes, tender_bucket::BucketError>>, Fallback),
        Other(BoxStream<'static, io::Result<Bytes>>),
        Done,
    }
    let digest = found.digest;
    let first = From::Bucket(bucket.read(digest, found.index.clone(), start, end), fallback);
    stream::unfold((first, start), move |(from, pos)| async move {
        match from {
            From::Bucket(mut s, fallback) => match s.next().await {
                Some(Ok(b)) => {
                    let next = pos.saturating_add(b.len() as u64);
                    Some((Ok(b), (From::Bucket(s, fallback), next)))
                }
                None => None,
                Some(Err(e)) => {
                    tracing::warn!(%digest, at = pos, end, error = %e,
                        "shared bucket failed while serving a range; the rest from the local copy or the upstream");
                    drop(s);
                    match fallback.open(digest, pos, end) {
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
