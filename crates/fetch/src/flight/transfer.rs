//! One fill's transfer: open the source at the bytes the spool holds, compare any bytes sent
//! again, append the rest (joined into larger chunks), retry and resume on faults within the
//! fill's deadline; make room in the data directory, or go on without storing (pass through).

use std::os::unix::fs::FileExt;
use std::time::Instant;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use tender_store::SpoolWriter;

use super::fill::{Fill, Phase};
use super::registry::Flights;
use crate::container::StreamCheck;
use crate::error::{FetchError, FetchErrorKind};
use crate::expect::Source;
use crate::metrics::upstream_label;

impl Flights {
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
        // Bytes written unhashed (their source was to vouch for them) are hashed from the file
        // while it still holds them.
        if let Err(e) = catch_up(writer).await {
            tracing::warn!(key = %fill.key, error = %e, "could not hash the spooled bytes; the fill fails its check");
        }
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

    pub(super) async fn transfer_with_retries(
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
        if let Some(v) = &opened.vouch {
            // The source proves the digest once its body ended: no second hash of its bytes.
            writer.defer_hashing(v.clone());
        }
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

/// Hash what a writer owes (its bytes were written unhashed and no proof came) on a blocking
/// thread, so its digest is ready without blocking the ones serving connections.
pub(super) async fn catch_up(writer: &mut SpoolWriter) -> std::io::Result<()> {
    let Some(job) = writer.catch_up()? else { return Ok(()) };
    let done = tokio::task::spawn_blocking(move || job.run()).await.map_err(std::io::Error::other)??;
    writer.caught_up(done)
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
}
