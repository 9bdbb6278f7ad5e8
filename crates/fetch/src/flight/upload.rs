//! The fill's side of the shared bucket while it runs under the fill lease: its chunks go to
//! the bucket as they land, so replicas waiting on the lease read them at once
//! ([`crate::shared::FollowSource`]), and the last one as soon as the content verified.

use std::sync::Arc;

use tender_bucket::parts::Known;
use tender_bucket::{Bucket, GiveUp, PartUpload};
use tender_oci::Digest;

use super::fill::{Fill, Phase};

/// Write a fill's chunks to the bucket as they land (the fill runs under the lease `key`), so
/// replicas waiting on the lease read them at once ([`crate::shared::FollowSource`]). Returns
/// the upload with every whole chunk written once the fill verified, for
/// [`crate::shared::publish`] to finish; `None` when the fill failed or the bucket refused
/// (publish then uploads from scratch).
///
/// An upload that stops before the fill verified (a chunk or the record not written, the
/// bucket down, the bytes no longer on disk) gives the lease up at once (`lease`): the
/// replicas waiting on it take it over or fetch themselves, and never follow an upload nobody
/// is doing. A fill that failed leaves its lease to the fill's task.
pub(super) fn spawn_streamer(
    bucket: Arc<Bucket>,
    fill: Arc<Fill>,
    digest: Option<Digest>,
    lease: GiveUp,
) -> tokio::task::JoinHandle<Option<PartUpload>> {
    let key = lease.key().to_string();
    tokio::spawn(async move {
        let upload = stream(&bucket, &fill, digest, &key).await;
        if let Err(why) = &upload {
            lease.give_up(why).await;
        }
        upload.ok().flatten()
    })
}

/// The streamer's work: `Ok(Some(upload))` once every chunk is in, `Ok(None)` when the fill
/// failed (or nothing was uploaded), `Err(why)` when the upload stopped while the fill goes on.
async fn stream(
    bucket: &Arc<Bucket>,
    fill: &Fill,
    digest: Option<Digest>,
    key: &str,
) -> Result<Option<PartUpload>, &'static str> {
    let mut rx = fill.subscribe();
    let cs = bucket.settings().chunk_size;
    let mut upload: Option<PartUpload> = None;
    let mut next = 0u64;
    let stopped = loop {
        let (written, total, phase) = {
            let s = rx.borrow_and_update();
            (s.written, s.total, s.phase.clone())
        };
        if matches!(phase, Phase::Failed(_)) {
            break None;
        }
        let verified = matches!(phase, Phase::Verified(_) | Phase::Committed(_));
        let verified_as = match &phase {
            Phase::Verified(d) | Phase::Committed(d) => Some(*d),
            _ => None,
        };
        let head = (tender_bucket::parts::HEAD_LEN as u64).min(total.unwrap_or(u64::MAX));
        if upload.is_none() && (total.is_some() || written > 0) && (written >= head || verified) {
            // The upstream answered and the object's first bytes are in: announce the
            // upload with its size and those bytes, so the waiters' clients get them now
            // and not once the whole first chunk is in the bucket.
            let mut u = bucket.begin_parts(Some(key), digest, total);
            let n = written.min(head);
            if n > 0 {
                if let Some(buf) = read_span(fill, 0, n).await {
                    u.set_head(&buf).await;
                }
            }
            if let Err(e) = u.announce().await {
                tracing::debug!(key, error = %e, "upload not announced; the upload after the fill covers it");
                break Some("its upload could not be announced");
            }
            upload = Some(u);
        }
        let start = next.saturating_mul(cs);
        // A whole chunk as soon as it is written; the last, shorter one once the content
        // verified (so the waiters do not wait for the upload after the commit).
        let len = if written >= start.saturating_add(cs) {
            cs
        } else if verified && written > start {
            written.saturating_sub(start)
        } else {
            0
        };
        if len > 0 {
            let Some(buf) = read_span(fill, start, len).await else {
                break Some("the fill's bytes are not on disk to upload");
            };
            let u = upload.get_or_insert_with(|| bucket.begin_parts(Some(key), digest, total));
            let known = u.piece_size().and_then(|p| noted(fill, start, len, p, total, verified_as));
            if let Err(e) = u.put_chunk_with(bytes::Bytes::from(buf), known).await {
                tracing::debug!(key, error = %e, "chunk not written during the fill; the upload after it covers it");
                break Some("a chunk of its upload could not be written");
            }
            next = next.saturating_add(1);
            continue;
        }
        if verified {
            let Some(mut u) = upload else { return Ok(None) };
            return match u.flush().await {
                Ok(()) => Ok(Some(u)),
                Err(_) => {
                    u.abort().await;
                    Err("a chunk of its upload could not be written")
                }
            };
        }
        // Wait for more bytes, or for a chunk in flight to fail (the upload is dead then,
        // whether or not more bytes come).
        let stopped = upload.as_ref().map(PartUpload::stopped);
        let more = tokio::select! {
            r = rx.changed() => r.is_ok(),
            () = async { match stopped { Some(s) => s.await, None => std::future::pending().await } } => {
                break Some("a chunk of its upload could not be written");
            }
        };
        if !more {
            break None;
        }
    };
    if let Some(u) = upload {
        u.abort().await;
    }
    stopped.map_or(Ok(None), Err)
}

/// What the fill's spool hashed of the chunk `start..start + len` of an object of `total`
/// bytes: the states at its boundaries of `piece` bytes (but the object's end) and, for the
/// last chunk, the digest the fill verified. `None` when the spool did not note them (the
/// upload then hashes the chunk itself).
fn noted(fill: &Fill, start: u64, len: u64, piece: u64, total: Option<u64>, verified: Option<Digest>) -> Option<Known> {
    let total = total?;
    if !piece.is_multiple_of(tender_store::STATE_STEP) {
        return None;
    }
    let end = start.checked_add(len)?;
    let last = end == total;
    let offsets = (1..=len.checked_div(piece)?)
        .map_while(|k| k.checked_mul(piece).and_then(|o| start.checked_add(o)))
        .filter(|o| *o < end || !last);
    let states = fill.chain.at(offsets)?;
    let digest = if last { Some(verified.filter(|d| d.algorithm() == tender_oci::Algorithm::Sha256)?) } else { None };
    Some(Known { states, digest })
}

/// `len` bytes of a fill's spool file from `start` (written already), off the threads serving
/// connections; `None` when the read failed.
async fn read_span(fill: &Fill, start: u64, len: u64) -> Option<Vec<u8>> {
    // A fill that passes through has the rest only in memory, for its own readers: no upload.
    if start.saturating_add(len) > fill.stored_until() {
        return None;
    }
    let file = fill.file();
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; usize::try_from(len).ok()?];
        std::os::unix::fs::FileExt::read_exact_at(&*file, &mut buf, start).ok().map(|()| buf)
    })
    .await
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use crate::fills::FillInfo;
    use tender_oci::Algorithm;
    use tender_store::Store;

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
        let tender_bucket::LeaseOutcome::Won(lease) = bucket.lease(&key).await.unwrap() else { panic!("a lease") };
        let streamer = spawn_streamer(bucket.clone(), fill.clone(), Some(d), lease.give_up_handle());
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
        // Issue 36: every chunk's entry came from the states the spool noted as it hashed the
        // object; the upload hashed no byte a second time, and the chain ends in the digest.
        assert_eq!(upload.hashed_bytes(), 0);
        assert_eq!(upload.chunks().await.last(), Some(&d.hex()));
        let listed = bucket.progress(&key).await.unwrap().unwrap();
        assert_eq!(listed.chunks.len(), 3, "and listed for the waiters");
        writer.discard();
    }
}
