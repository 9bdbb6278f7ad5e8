//! Responses that make no progress (issues 32 and 41): a reader that never reads, or an HTTP/2
//! stream whose flow-control window stays shut, must not hold a request, a connection slot or
//! memory for longer than `limits.sendStallTimeout`.
//!
//! Two watches, one per level:
//! - **The socket.** [`WriteWatch`] wraps every connection's stream and notes since when a write
//!   has been refused (`Pending`: the socket's send buffer is full) with no byte accepted since.
//!   The connection's driver (`listen.rs`) closes a connection blocked that long, with an
//!   abortive close (RST: the unsent bytes are dropped from the kernel at once, not retried for
//!   minutes), and at the connection cap a blocked connection is the first to give way
//!   (`conns.rs`). That covers HTTP/1.1 and HTTP/2 connections whose peer stopped reading.
//! - **The HTTP/2 stream.** A client can keep its socket drained (answer PINGs) and never open a
//!   stream's window: the socket is healthy, the stream is not. hyper runs each HTTP/2 stream as
//!   a task of the connection's executor: [`StallExec`] runs it inside a [`StreamWatch`], which
//!   the response body ([`watched`]) marks each time it is asked for bytes. A stream whose body
//!   has bytes to give and was not asked for them for the timeout is dropped: h2 resets it
//!   (RST_STREAM CANCEL) and frees what it buffered. A body waiting for its own source (a fill
//!   whose upstream is slow) is not stalled: the watch is off until it has bytes again.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::conns::ConnState;
use crate::metrics::ServerMetrics;
use crate::moment::Moment;

/// A stream over a client's TCP socket.
pub(crate) trait Socket {
    fn socket(&self) -> &TcpStream;
}

impl Socket for TcpStream {
    fn socket(&self) -> &TcpStream {
        self
    }
}

impl Socket for crate::zerocopy::ZeroCopyStream {
    fn socket(&self) -> &TcpStream {
        self.tcp()
    }
}

/// A connection's stream, watched for writes the socket refuses.
pub(crate) struct WriteWatch<T: Socket> {
    inner: T,
    /// Since when the socket has taken no byte of a write that was refused.
    blocked: Arc<ConnState>,
}

impl<T: Socket> Drop for WriteWatch<T> {
    fn drop(&mut self) {
        if self.blocked.aborting() {
            // The close that follows resets the connection and drops what the kernel queued.
            let _ = socket2::SockRef::from(self.inner.socket()).set_linger(Some(Duration::ZERO));
        }
    }
}

impl<T: Socket> WriteWatch<T> {
    pub(crate) fn new(inner: T, conn: Arc<ConnState>) -> WriteWatch<T> {
        WriteWatch { inner, blocked: conn }
    }

    fn note(&self, r: &Poll<io::Result<usize>>) {
        match r {
            Poll::Pending => self.blocked.note_blocked(),
            Poll::Ready(Ok(n)) if *n > 0 => self.blocked.blocked.clear(),
            Poll::Ready(_) => {}
        }
    }
}

impl<T: Socket + AsyncRead + Unpin> AsyncRead for WriteWatch<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: Socket + AsyncWrite + Unpin> AsyncWrite for WriteWatch<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(&r);
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if r.is_pending() {
            self.blocked.note_blocked();
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One HTTP/2 stream's progress: since when its body has had bytes for the client and was not
/// asked for them (`None`: asked, done, or waiting for its own source).
#[derive(Debug)]
pub(crate) struct StreamWatch {
    waiting: Moment,
}

tokio::task_local! {
    static STREAM: Arc<StreamWatch>;
}

/// The executor of a listener's HTTP/2 connections: every stream task runs under a
/// [`StreamWatch`] and is dropped (so reset) once it stalled for `timeout`.
#[derive(Clone)]
pub(crate) struct StallExec {
    pub(crate) timeout: Duration,
    pub(crate) metrics: Arc<ServerMetrics>,
}

impl<F> hyper::rt::Executor<F> for StallExec
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let (timeout, metrics) = (self.timeout, self.metrics.clone());
        tokio::spawn(async move {
            let watch = Arc::new(StreamWatch { waiting: Moment::new() });
            let fut = STREAM.scope(watch.clone(), fut);
            tokio::pin!(fut);
            loop {
                // Off (no body yet, or it waits on its source): look again a timeout later.
                let wake = watch.waiting.get().map_or_else(|| Instant::now() + timeout, |w| w + timeout);
                tokio::select! {
                    _ = &mut fut => return,
                    () = tokio::time::sleep_until(wake.into()) => {
                        if watch.waiting.get().is_some_and(|w| w.elapsed() >= timeout) {
                            metrics.limit_refusal("send_stall");
                            tracing::debug!(seconds = timeout.as_secs_f64(), "HTTP/2 stream reset: its window stayed shut");
                            // Dropping the stream's task resets it (RST_STREAM CANCEL).
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// The response body of the current request, watched when it is an HTTP/2 stream's (under
/// [`StallExec`]); as it is otherwise.
pub(crate) fn watched(body: Body) -> Body {
    match STREAM.try_with(Clone::clone) {
        Ok(watch) => {
            watch.waiting.set_now();
            Body::new(Watched { inner: body, watch })
        }
        Err(_) => body,
    }
}

/// Re-arms a stream's watch when its body's source has bytes again.
struct ArmOnWake {
    watch: Arc<StreamWatch>,
    then: Waker,
}

impl Wake for ArmOnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.watch.waiting.set_now_if_none();
        self.then.wake_by_ref();
    }
}

struct Watched {
    inner: Body,
    watch: Arc<StreamWatch>,
}

impl http_body::Body for Watched {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        // Waiting on its source, the body is off the watch until the source wakes it: from
        // then on it has bytes again, whether or not hyper (its window shut) asks for them.
        let waker = Waker::from(Arc::new(ArmOnWake { watch: self.watch.clone(), then: cx.waker().clone() }));
        let r = Pin::new(&mut self.inner).poll_frame(&mut Context::from_waker(&waker));
        match &r {
            // bytes for the client: it has the timeout to ask for the next ones
            Poll::Ready(Some(Ok(_))) => self.watch.waiting.set_now(),
            Poll::Pending | Poll::Ready(_) => self.watch.waiting.clear(),
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
