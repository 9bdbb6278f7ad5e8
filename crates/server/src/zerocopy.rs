//! Zero-copy bodies on plain HTTP/1.1 connections: file bytes go from the page cache to the
//! socket with `sendfile`, never through a user-space buffer (as nginx serves files).
//!
//! hyper writes whatever bytes a body yields, so the body cannot hand it a file. Instead:
//! - the connection's socket is a [`ZeroCopyStream`], which shares a one-span slot
//!   ([`ZeroCopy`]) with the bodies served on it;
//! - a body with a file span ([`Piece::File`]) puts the span into the slot and yields a
//!   stand-in of the same length: a slice of the static [`DECOY`] buffer, whose address no
//!   other buffer can have;
//! - when hyper writes bytes at the decoy's address, the stream sends the span's file bytes
//!   with `sendfile` instead, at the position the decoy offset names, and frees the slot when
//!   the span is out. The next span waits for the slot, so spans go out in order, one at a time.
//!
//! What keeps the decoy's zeros off the wire: hyper must queue body chunks as given, never copy
//! them into its own buffer — the connection is built with `writev(true)` (its queue strategy);
//! TLS and HTTP/2 copy and frame bytes, so only plain HTTP/1 requests get a [`ZeroCopy`]
//! (`listen.rs`). A decoy write that does not match the slot (no span, or not at the position
//! the span has reached) fails the connection instead of sending anything.

use std::fs::File;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll, Waker};

use axum::body::Body;
use bytes::Bytes;
use futures::stream::{BoxStream, Stream, StreamExt};
use prometheus_client::metrics::counter::Counter;
use tender_fetch::flight::MAX_PIECE;
use tender_fetch::Piece;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// Stand-in bytes for a file span: never sent themselves.
static DECOY: [u8; MAX_PIECE] = [0; MAX_PIECE];

tokio::task_local! {
    /// The zero-copy slot of the connection a request came on, while its handler runs: the
    /// handler builds the body (`object.rs`), hyper polls it later on the same connection.
    static CURRENT: Option<ZeroCopy>;
}

/// Run a request's handler with its connection's slot (`None`: bodies copy their bytes).
pub async fn scope<F: std::future::Future>(slot: Option<ZeroCopy>, handler: F) -> F::Output {
    CURRENT.scope(slot, handler).await
}

/// The slot of the connection the current request came on, if it sends file spans itself.
pub fn current() -> Option<ZeroCopy> {
    CURRENT.try_with(Clone::clone).ok().flatten()
}

/// A connection's slot for the one file span being sent.
#[derive(Clone, Default, Debug)]
pub struct ZeroCopy {
    slot: Arc<Mutex<Slot>>,
    /// Bytes sent with `sendfile` (`tender_http_sendfile_bytes_total`).
    sent: Counter,
}

#[derive(Default, Debug)]
struct Slot {
    span: Option<Span>,
    /// A body waiting for the slot to free.
    waiting: Option<Waker>,
}

#[derive(Debug)]
struct Span {
    file: Arc<File>,
    offset: u64,
    len: usize,
    sent: usize,
}

impl ZeroCopy {
    /// The slot of a new connection; `sent` counts the bytes it sends with `sendfile`.
    pub fn new(sent: Counter) -> ZeroCopy {
        ZeroCopy { slot: Arc::default(), sent }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Put `span` into the slot, or hand it back (and wake `cx` when the slot frees).
    fn try_place(&self, span: Span, cx: &Context<'_>) -> Result<(), Span> {
        let mut slot = self.lock();
        if slot.span.is_some() {
            slot.waiting = Some(cx.waker().clone());
            return Err(span);
        }
        slot.span = Some(span);
        Ok(())
    }
}

/// A response body from `pieces`, sending file spans through `slot`'s connection.
pub fn body(pieces: BoxStream<'static, io::Result<Piece>>, slot: ZeroCopy) -> Body {
    Body::from_stream(SpanBody { pieces, slot, held: None })
}

/// The body side: spans go into the slot, decoys to hyper.
struct SpanBody {
    pieces: BoxStream<'static, io::Result<Piece>>,
    slot: ZeroCopy,
    /// A span read from `pieces` that waits for the slot.
    held: Option<Span>,
}

impl Stream for SpanBody {
    type Item = io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(span) = this.held.take() {
                let len = span.len;
                return match this.slot.try_place(span, cx) {
                    Ok(()) => Poll::Ready(Some(Ok(Bytes::from_static(&DECOY[..len])))),
                    Err(span) => {
                        this.held = Some(span);
                        Poll::Pending
                    }
                };
            }
            match ready!(this.pieces.poll_next_unpin(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                Some(Ok(Piece::Bytes(b))) => return Poll::Ready(Some(Ok(b))),
                Some(Ok(Piece::File { len: 0, .. })) => {}
                Some(Ok(Piece::File { file, offset, len })) => {
                    if len > MAX_PIECE {
                        return Poll::Ready(Some(Err(io::Error::other(format!(
                            "internal error: a file span of {len} bytes is over the {MAX_PIECE} a decoy covers"
                        )))));
                    }
                    this.held = Some(Span { file, offset, len, sent: 0 });
                }
            }
        }
    }
}

/// A plain TCP connection that sends decoy bytes as the file span they stand for.
#[derive(Debug)]
pub struct ZeroCopyStream {
    tcp: TcpStream,
    slot: ZeroCopy,
}

impl ZeroCopyStream {
    pub fn new(tcp: TcpStream, slot: ZeroCopy) -> ZeroCopyStream {
        ZeroCopyStream { tcp, slot }
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Send up to `want` bytes of the slot's span, from position `at` of the span.
    fn poll_send_span(&mut self, cx: &mut Context<'_>, at: usize, want: usize) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.tcp.poll_write_ready(cx))?;
            let mut slot = self.slot.lock();
            let Some(span) = slot.span.as_mut() else {
                return Poll::Ready(Err(io::Error::other(
                    "internal error: a body's stand-in bytes came without their file span; closing the connection",
                )));
            };
            if at != span.sent || at + want > span.len {
                return Poll::Ready(Err(io::Error::other(format!(
                    "internal error: stand-in bytes {at}..{} out of step with their file span ({} of {} sent); \
                     closing the connection",
                    at + want,
                    span.sent,
                    span.len
                ))));
            }
            let mut pos = span.offset + span.sent as u64;
            let file = span.file.clone();
            let tcp = &self.tcp;
            match tcp.try_io(Interest::WRITABLE, || Ok(rustix::fs::sendfile(tcp, &*file, Some(&mut pos), want)?)) {
                Ok(0) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the file ended before the span being sent",
                    )))
                }
                Ok(n) => {
                    self.slot.sent.inc_by(n as u64);
                    span.sent += n;
                    if span.sent == span.len {
                        slot.span = None;
                        if let Some(w) = slot.waiting.take() {
                            w.wake();
                        }
                    }
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Where `buf` starts in [`DECOY`], if it is decoy bytes.
fn decoy_offset(buf: &[u8]) -> Option<usize> {
    let at = (buf.as_ptr() as usize).checked_sub(DECOY.as_ptr() as usize)?;
    (at < MAX_PIECE && !buf.is_empty()).then_some(at)
}

impl AsyncRead for ZeroCopyStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for ZeroCopyStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    /// Plain bytes go out with `writev` up to the first decoy; a decoy goes out alone, as its span.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let bufs = match bufs.iter().position(|b| !b.is_empty()) {
            Some(first) => &bufs[first..],
            None => return Poll::Ready(Ok(0)),
        };
        if let Some(at) = decoy_offset(&bufs[0]) {
            let want = bufs[0].len();
            return self.poll_send_span(cx, at, want);
        }
        let plain = bufs.iter().take_while(|b| decoy_offset(b).is_none()).count();
        Pin::new(&mut self.tcp).poll_write_vectored(cx, &bufs[..plain])
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use std::io::Write as _;

    use http_body_util::BodyExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A connected pair: the server side as a zero-copy stream, and the client side.
    async fn pair() -> (ZeroCopyStream, ZeroCopy, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let slot = ZeroCopy::default();
        (ZeroCopyStream::new(server, slot.clone()), slot, client)
    }

    fn file_with(bytes: &[u8]) -> Arc<File> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        Arc::new(f)
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn should_send_a_bodys_file_spans_from_the_file_in_order_with_its_other_bytes() {
        let (mut server, slot, mut client) = pair().await;
        let content = pattern(3 * MAX_PIECE);
        let file = file_with(&content);
        let pieces = vec![
            Ok(Piece::File { file: file.clone(), offset: 10, len: MAX_PIECE }),
            Ok(Piece::Bytes(Bytes::from_static(b"-in memory-"))),
            Ok(Piece::File { file: file.clone(), offset: 2 * MAX_PIECE as u64, len: 1000 }),
            Ok(Piece::File { file, offset: 5, len: 0 }),
        ];
        let mut body = body(futures::stream::iter(pieces).boxed(), slot);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        // What hyper does: the head from its own buffer, then each chunk as the body gave it.
        server.write_all(b"HEAD:").await.unwrap();
        while let Some(frame) = body.frame().await {
            let chunk = frame.unwrap().into_data().unwrap();
            server.write_all(&chunk).await.unwrap();
        }
        server.shutdown().await.unwrap();
        let mut want = b"HEAD:".to_vec();
        want.extend_from_slice(&content[10..10 + MAX_PIECE]);
        want.extend_from_slice(b"-in memory-");
        want.extend_from_slice(&content[2 * MAX_PIECE..2 * MAX_PIECE + 1000]);
        let got = reader.await.unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "the decoy's zeros never go out: the file's bytes do");
    }

    #[tokio::test]
    async fn should_wait_with_the_next_span_until_the_one_before_is_out() {
        let (mut server, slot, mut client) = pair().await;
        let file = file_with(&pattern(100));
        let pieces = vec![
            Ok(Piece::File { file: file.clone(), offset: 0, len: 50 }),
            Ok(Piece::File { file, offset: 50, len: 50 }),
        ];
        let mut body = Box::pin(SpanBody { pieces: futures::stream::iter(pieces).boxed(), slot, held: None });
        let first = body.next().await.unwrap().unwrap();
        assert_eq!(first.len(), 50);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(body.as_mut().poll_next(&mut cx).is_pending(), "the slot still holds the first span");
        server.write_all(&first).await.unwrap();
        let second = body.next().await.unwrap().unwrap();
        server.write_all(&second).await.unwrap();
        drop(server);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, pattern(100));
    }

    #[tokio::test]
    async fn should_fail_rather_than_send_stand_in_bytes_that_match_no_span() {
        let (mut server, slot, mut client) = pair().await;
        let lone = server.write_all(&DECOY[..10]).await.unwrap_err();
        assert!(lone.to_string().contains("without their file span"), "{lone}");
        // A span at 0, but bytes that claim to be its middle.
        slot.lock().span = Some(Span { file: file_with(&pattern(100)), offset: 0, len: 100, sent: 0 });
        let skewed = server.write_all(&DECOY[40..60]).await.unwrap_err();
        assert!(skewed.to_string().contains("out of step"), "{skewed}");
        let longer = server.write_all(&DECOY[..101]).await.unwrap_err();
        assert!(longer.to_string().contains("out of step"), "{longer}");
        drop(server);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty(), "nothing went out: {} bytes", got.len());
    }

    #[tokio::test]
    async fn should_report_a_file_shorter_than_its_span() {
        let (mut server, slot, _client) = pair().await;
        slot.lock().span = Some(Span { file: file_with(&pattern(10)), offset: 0, len: 100, sent: 0 });
        let sent = server.write(&DECOY[..100]).await.unwrap();
        assert_eq!(sent, 10, "what the file has goes out");
        assert_eq!(slot.sent.get(), 10);
        let short = server.write(&DECOY[10..100]).await.unwrap_err();
        assert_eq!(short.kind(), io::ErrorKind::UnexpectedEof);
    }
}
