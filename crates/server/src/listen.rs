//! The accept loop: plain HTTP or TLS (HTTP/2 and HTTP/1.1), with the connection-level limits
//! (connections in all and per address, first byte, TLS handshake, request head size and time,
//! idle time, a socket that stopped taking bytes, its send buffer) and graceful shutdown. Every
//! connection state has a deadline.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

use crate::auth::VerifiedClientCert;
use crate::conns::{ConnState, Conns, Refused};
use crate::limits::Limits;
use crate::metrics::ServerMetrics;
use crate::stall::{StallExec, WriteWatch};
use crate::tls::TlsReloader;
use crate::zerocopy::{self, ZeroCopy, ZeroCopyStream};

/// How one listener serves.
#[derive(Clone)]
pub struct ListenOptions {
    pub tls: Option<Arc<TlsReloader>>,
    pub limits: Limits,
}

/// The HTTP builders of a listener: `auto` for TLS connections (ALPN or the preface decides),
/// and for plain ones `h1`, or `h2` when the client opens with the HTTP/2 preface (h2c prior
/// knowledge). A plain HTTP/1 connection built with `h1` carries no HTTP/2 state: it is the
/// common case, and 10,000 idle connections are one of issue 23's figures.
struct Builders {
    auto: auto::Builder<StallExec>,
    h1: hyper::server::conn::http1::Builder,
    h2: hyper::server::conn::http2::Builder<StallExec>,
}

fn builders(limits: &Limits, metrics: &Arc<ServerMetrics>) -> Builders {
    // HTTP/2 streams run as tasks of this executor, each reset once it stalls (`stall.rs`).
    let exec = StallExec { timeout: limits.send_stall_timeout, metrics: metrics.clone() };
    let mut auto = auto::Builder::new(exec.clone());
    let mut h1 = hyper::server::conn::http1::Builder::new();
    let mut h2 = hyper::server::conn::http2::Builder::new(exec);
    macro_rules! http1 {
        ($b:expr) => {
            $b.timer(TokioTimer::new())
                // Queue body chunks as given, never copy them into hyper's buffer: zero-copy
                // bodies (zerocopy.rs) rely on it.
                .writev(true)
                .header_read_timeout(limits.header_timeout)
                // `limits::admit` refuses a head over `maxHeaderBytes` at that size; hyper's own
                // cut (431, counted too) is twice that, where its read buffer ends.
                .max_buf_size(limits.max_header_bytes.saturating_mul(2).max(8192))
                .max_headers(128)
        };
    }
    macro_rules! http2 {
        ($b:expr) => {
            $b.timer(TokioTimer::new())
                // `limits::admit` refuses a head over `maxHeaderBytes` (431, counted, and after
                // a few the connection is sent away); h2's own cut, which it answers itself, is
                // four times that (its list size counts 32 bytes more per field).
                .max_header_list_size(u32::try_from(limits.max_header_bytes.saturating_mul(4)).unwrap_or(u32::MAX))
                .max_concurrent_streams(MAX_STREAMS)
                // What one stream may queue beyond what its window lets out (hyper's default is
                // 400 KiB): with a peer that stopped reading, bytes held per stream.
                .max_send_buf_size(STREAM_SEND_BUFFER)
                .keep_alive_interval(Some(Duration::from_secs(30)))
                .keep_alive_timeout(Duration::from_secs(20))
        };
    }
    http1!(auto.http1());
    http1!(&mut h1);
    http2!(auto.http2());
    http2!(&mut h2);
    Builders { auto, h1, h2 }
}

/// How long a connection tender closes by its own deadline has to read the GOAWAY.
const GOAWAY_GRACE: Duration = Duration::from_millis(250);

/// Concurrent streams of one HTTP/2 connection.
const MAX_STREAMS: u32 = 256;
/// Bytes an HTTP/2 stream queues in user space, at most, before its body is asked for more.
pub(crate) const STREAM_SEND_BUFFER: usize = 64 * 1024;

/// Serve `router` on `listener` until `shutdown` resolves, then wait for the requests in flight.
pub async fn run(
    listener: TcpListener,
    router: Router,
    opts: ListenOptions,
    metrics: Arc<ServerMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let builder = Arc::new(builders(&opts.limits, &metrics));
    let conns = Arc::new(Conns::default());
    // Every connection task holds a sender: when all are gone, every connection has ended.
    let (alive, mut all_ended) = tokio::sync::mpsc::channel::<()>(1);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: keep the listener, let others finish.
                tracing::warn!(error = %e, "accept failed");
                metrics.limit_refusal("accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let limits = &opts.limits;
        let admitted = match conns.admit(peer.ip(), limits.max_connections, limits.max_connections_per_address) {
            Ok((a, evicted)) => {
                for _ in 0..evicted {
                    metrics.limit_refusal("evicted");
                }
                a
            }
            Err(refused) => {
                metrics.limit_refusal(match refused {
                    Refused::Connections => "connections",
                    Refused::PerAddress => "connections_per_address",
                });
                drop(tcp);
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        if limits.send_buffer > 0 {
            // What a reader that never reads can pin in the kernel: Linux doubles what it is
            // given (room for its bookkeeping), so half of it makes the buffer `ss -tm` shows
            // (`tb`) the configured size; autotuning stops for this socket.
            let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(limits.send_buffer / 2);
        }
        let (builder, router, opts, metrics) = (builder.clone(), router.clone(), opts.clone(), metrics.clone());
        let (alive, stopping) = (alive.clone(), stopping.clone());
        tokio::spawn(async move {
            let _alive = alive;
            let state = admitted.state.clone();
            tokio::select! {
                () = serve_connection(tcp, Conn {
                    peer, builder: &builder, router, opts: &opts, metrics: &metrics, state: state.clone(), stopping,
                }) => {}
                // Dropping the connection closes it.
                () = state.evicted() => tracing::debug!(%peer, "connection closed to make room for another"),
            }
            drop(admitted);
        });
        // Let the connection just accepted (and the others that are ready) run before the next
        // accept: under a flood of new sockets, an honest client's first bytes are seen, and
        // so protected from eviction, before many more connections arrive.
        tokio::task::yield_now().await;
    }
    drop(listener);
    let _ = stop.send(true);
    drop(alive);
    let _ = all_ended.recv().await;
    Ok(())
}

/// How a plain connection opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opening {
    Http1,
    /// The HTTP/2 connection preface (`PRI * HTTP/2.0`): h2c with prior knowledge.
    Http2,
}

/// Wait for the first bytes of a plain connection and tell HTTP/2's connection preface from
/// an HTTP/1 request; `None` when none came in time (counted) or the peer went away.
async fn first_bytes(tcp: &TcpStream, limits: &Limits, metrics: &ServerMetrics) -> Option<Opening> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let deadline = tokio::time::Instant::now() + limits.first_byte_timeout;
    let mut seen = [0u8; PREFACE.len()];
    loop {
        match tokio::time::timeout_at(deadline, tcp.peek(&mut seen)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) if !PREFACE.starts_with(&seen[..n]) => return Some(Opening::Http1),
            Ok(Ok(n)) if n == PREFACE.len() => return Some(Opening::Http2),
            // A prefix of the preface and no more yet: honest clients send it whole, so this
            // is rare; look again shortly (peek would answer at once).
            Ok(Ok(_)) => {
                if tokio::time::timeout_at(deadline, tokio::time::sleep(Duration::from_millis(5))).await.is_err() {
                    metrics.limit_refusal("first_byte_timeout");
                    return None;
                }
            }
            Err(_) => {
                metrics.limit_refusal("first_byte_timeout");
                return None;
            }
        }
    }
}

/// What serving one connection needs besides its socket.
struct Conn<'a> {
    peer: SocketAddr,
    builder: &'a Builders,
    router: Router,
    opts: &'a ListenOptions,
    metrics: &'a ServerMetrics,
    state: Arc<ConnState>,
    stopping: tokio::sync::watch::Receiver<bool>,
}

async fn serve_connection(tcp: TcpStream, c: Conn<'_>) {
    let opened = Instant::now();
    let Some(tls) = &c.opts.tls else {
        let Some(opening) = first_bytes(&tcp, &c.opts.limits, c.metrics).await else {
            return;
        };
        c.state.spoke();
        let slot = ZeroCopy::new(c.metrics.sendfile_bytes.clone());
        let svc = service(c.router, c.peer, false, Some(slot.clone()), c.state.clone());
        let io = TokioIo::new(WriteWatch::new(ZeroCopyStream::new(tcp, slot), c.state.clone()));
        let (limits, state) = (&c.opts.limits, &c.state);
        if opening == Opening::Http2 {
            let conn = c.builder.h2.serve_connection(io, svc);
            Box::pin(drive(conn, c.peer, opened, limits, c.metrics, state, c.stopping)).await;
        } else {
            let conn = c.builder.h1.serve_connection(io, svc);
            drive(conn, c.peer, opened, limits, c.metrics, state, c.stopping).await;
        }
        return;
    };
    // Boxed: a plain connection's task does not carry the room a TLS one needs (10,000 idle
    // connections are one of issue 23's figures).
    Box::pin(serve_tls(tcp, tls, c)).await;
}

async fn serve_tls(tcp: TcpStream, tls: &TlsReloader, c: Conn<'_>) {
    let (peer, opts, metrics, state) = (c.peer, c.opts, c.metrics, &c.state);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
    let tcp = WriteWatch::new(tcp, state.clone());
    let stream = match tokio::time::timeout(opts.limits.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            metrics.tls_handshake_failures.inc();
            tracing::debug!(error = %e, %peer, "TLS handshake failed");
            return;
        }
        Err(_) => {
            metrics.limit_refusal("handshake_timeout");
            return;
        }
    };
    state.spoke();
    let verified = tls.mutual() && stream.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
    let svc = service(c.router, peer, verified, None, state.clone());
    let conn = c.builder.auto.serve_connection(TokioIo::new(stream), svc);
    drive(conn, peer, Instant::now(), &opts.limits, metrics, state, c.stopping).await;
}

/// Run one connection with a deadline in every state: the first request head within
/// `header_timeout` of the connection's start (protocol detection and the HTTP/2 preface
/// included), no request in progress for at most `idle_timeout` (then a graceful close:
/// HTTP/2 GOAWAY; the peer then has `header_timeout` to let go). Server shutdown closes it
/// gracefully and waits for the requests in progress.
async fn drive<C>(
    conn: C,
    peer: SocketAddr,
    opened: Instant,
    limits: &Limits,
    metrics: &ServerMetrics,
    state: &ConnState,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) where
    C: GracefulConnection,
    C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(conn);
    // Set once a graceful close started: for an idle close, when to give up waiting.
    let mut closing: Option<Option<Instant>> = None;
    loop {
        let now = Instant::now();
        let mut deadline = match (closing, state.head_seen(), state.idle_since()) {
            (Some(Some(give_up)), _, _) => give_up,
            (Some(None), _, _) => now + limits.idle_timeout,
            (None, false, _) => opened + limits.header_timeout,
            (None, true, Some(idle)) => idle + limits.idle_timeout,
            (None, true, None) => now + limits.idle_timeout,
        };
        // A socket that refuses bytes: closed once it took none for `sendStallTimeout` (the
        // socket's watch wakes this loop when it becomes blocked).
        let stall = limits.send_stall_timeout;
        if let Some(b) = state.blocked_since() {
            deadline = deadline.min(b + stall);
        }
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    let e: Box<dyn std::error::Error + Send + Sync> = e.into();
                    count_refusal(metrics, &*e);
                    tracing::debug!(error = %e, %peer, "connection ended with an error");
                }
                return;
            }
            () = state.became_blocked() => {}
            () = state.flooding(), if closing.is_none() => {
                tracing::debug!(%peer, "connection sent away: request heads over limits.maxHeaderBytes again and again");
                conn.as_mut().graceful_shutdown();
                closing = Some(Some(Instant::now() + GOAWAY_GRACE));
            }
            changed = stopping.changed(), if closing.is_none() => {
                if changed.is_err() || *stopping.borrow() {
                    conn.as_mut().graceful_shutdown();
                    closing = Some(None);
                }
            }
            () = tokio::time::sleep_until(deadline.into()) => {
                let now = Instant::now();
                if state.blocked_since().is_some_and(|b| now >= b + stall) {
                    metrics.limit_refusal("send_stall");
                    tracing::debug!(%peer, seconds = stall.as_secs_f64(), "connection closed: its peer stopped reading");
                    state.abort();
                    return;
                }
                match closing {
                    Some(Some(give_up)) if now >= give_up => return,
                    Some(_) => {}
                    None if !state.head_seen() && now >= opened + limits.header_timeout => {
                        metrics.limit_refusal("header_timeout");
                        // Said first where the protocol can say it (HTTP/2: GOAWAY), then closed
                        // after a moment whether or not the peer let go.
                        conn.as_mut().graceful_shutdown();
                        closing = Some(Some(now + GOAWAY_GRACE));
                    }
                    None => {
                        if state.idle_since().is_some_and(|i| now >= i + limits.idle_timeout) {
                            metrics.limit_refusal("idle_timeout");
                            conn.as_mut().graceful_shutdown();
                            closing = Some(Some(now + limits.header_timeout));
                        }
                    }
                }
            }
        }
    }
}

/// hyper ends a connection itself for a request head over `maxHeaderBytes` (after answering
/// 431) or not complete within `headerTimeout`: count those like the other limits.
fn count_refusal(metrics: &ServerMetrics, e: &(dyn std::error::Error + Send + Sync + 'static)) {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            if h.is_parse_too_large() {
                metrics.limit_refusal("headers");
            } else if h.is_timeout() {
                metrics.limit_refusal("header_timeout");
            }
            return;
        }
        cur = err.source();
    }
}

/// The router as a hyper service, each request tagged with its peer (and verified certificate).
fn service(
    router: Router,
    peer: SocketAddr,
    verified_cert: bool,
    zero_copy: Option<ZeroCopy>,
    conn: Arc<ConnState>,
) -> impl hyper::service::Service<
    http::Request<Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |mut req: http::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer));
        req.extensions_mut().insert(crate::conns::ConnRef(conn.clone()));
        if verified_cert {
            req.extensions_mut().insert(VerifiedClientCert);
        }
        // HTTP/2 frames (and so copies) body bytes: only HTTP/1 bodies may send file spans.
        let slot = zero_copy.clone().filter(|_| req.version() <= http::Version::HTTP_11);
        // In progress until the response body is done (or dropped).
        let guard = conn.request();
        let h2 = req.version() == http::Version::HTTP_2;
        let handled = zerocopy::scope(slot, router.clone().oneshot(req.map(axum::body::Body::new)));
        // An HTTP/2 stream's body reads what its send buffer holds at a time: a stream whose
        // window is shut, or whose peer stopped reading, holds that much and no more.
        let handled = async move {
            if h2 {
                tender_fetch::flight::small_reads(STREAM_SEND_BUFFER as u64, handled).await
            } else {
                handled.await
            }
        };
        async move {
            let resp = handled.await?;
            Ok(resp.map(|b| {
                crate::stall::watched(axum::body::Body::new(http_body_util::BodyExt::map_frame(b, move |f| {
                    let _in_progress = &guard;
                    f
                })))
            }))
        }
    })
}
