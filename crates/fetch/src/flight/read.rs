//! Readers: of a fill's growing spool ([`Fill::reader`], [`Fill::pieces`] and their
//! `verified_` forms, which wait for the verdict) and of a committed object
//! ([`stored_reader`], [`stored_pieces`]). Each hands out bytes as they are written, as
//! [`Piece`]s (file spans the page cache holds, for `sendfile`) or bytes, keeps back what must
//! wait for the content to verify, and wakes for batches, not for every append.

use std::fs::File;
use std::io;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use tender_oci::Digest;
use tokio::sync::watch;

use super::fill::{Fill, FillState, Phase};
use super::pool::BufPool;
use crate::window::Place;

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

/// A body to stream to a client, with the object's size when known.
pub struct ObjectBody {
    pub total: Option<u64>,
    pub stream: BoxStream<'static, io::Result<Bytes>>,
}

impl Fill {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use crate::error::{FetchError, FetchErrorKind};
    use crate::fills::FillInfo;
    use tender_oci::Algorithm;
    use tender_store::Store;

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
