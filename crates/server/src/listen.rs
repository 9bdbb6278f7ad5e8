//! The accept loop: plain HTTP or TLS (HTTP/2 and HTTP/1.1), with the connection-level limits
//! (connections in all and per address, first byte, TLS handshake, request head size and time,
//! idle time) and graceful shutdown. Every connection state has a deadline.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

use crate::auth::VerifiedClientCert;
use crate::conns::{ConnState, Conns, Refused};
use crate::limits::Limits;
use crate::metrics::ServerMetrics;
use crate::tls::TlsReloader;
use crate::zerocopy::{self, ZeroCopy, ZeroCopyStream};

/// How one listener serves.
#[derive(Clone)]
pub struct ListenOptions {
    pub tls: Option<Arc<TlsReloader>>,
    pub limits: Limits,
}

fn builder(limits: &Limits) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        // Queue body chunks as given, never copy them into hyper's buffer: zero-copy bodies
        // (zerocopy.rs) rely on it.
        .writev(true)
        .header_read_timeout(limits.header_timeout)
        // hyper answers 431 when the head does not fit.
        .max_buf_size(limits.max_header_bytes.max(8192))
        .max_headers(128);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(256)
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    b
}

/// Serve `router` on `listener` until `shutdown` resolves, then wait for the requests in flight.
pub async fn run(
    listener: TcpListener,
    router: Router,
    opts: ListenOptions,
    metrics: Arc<ServerMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let builder = Arc::new(builder(&opts.limits));
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
        let (builder, router, opts, metrics) = (builder.clone(), router.clone(), opts.clone(), metrics.clone());
        let (alive, stopping) = (alive.clone(), stopping.clone());
        tokio::spawn(async move {
            let _alive = alive;
            let state = admitted.state.clone();
            tokio::select! {
                () = serve_connection(tcp, peer, &builder, router, &opts, &metrics, state.clone(), stopping) => {}
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

/// Wait for the first byte of a plain connection; false when it never came (counted) or the
/// peer went away.
async fn first_byte(tcp: &TcpStream, limits: &Limits, metrics: &ServerMetrics) -> bool {
    let mut one = [0u8; 1];
    match tokio::time::timeout(limits.first_byte_timeout, tcp.peek(&mut one)).await {
        Ok(Ok(n)) => n > 0,
        Ok(Err(_)) => false,
        Err(_) => {
            metrics.limit_refusal("first_byte_timeout");
            false
        }
    }
}

#[allow(clippy::too_many_arguments, reason = "one connection's whole context, passed once")]
async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    builder: &auto::Builder<TokioExecutor>,
    router: Router,
    opts: &ListenOptions,
    metrics: &ServerMetrics,
    state: Arc<ConnState>,
    stopping: tokio::sync::watch::Receiver<bool>,
) {
    let opened = Instant::now();
    let Some(tls) = &opts.tls else {
        if !first_byte(&tcp, &opts.limits, metrics).await {
            return;
        }
        state.spoke();
        let slot = ZeroCopy::new(metrics.sendfile_bytes.clone());
        let svc = service(router, peer, false, Some(slot.clone()), state.clone());
        let conn = builder.serve_connection(TokioIo::new(ZeroCopyStream::new(tcp, slot)), svc);
        drive(conn, peer, opened, &opts.limits, metrics, &state, stopping).await;
        return;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
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
    let svc = service(router, peer, verified, None, state.clone());
    let conn = builder.serve_connection(TokioIo::new(stream), svc);
    drive(conn, peer, Instant::now(), &opts.limits, metrics, &state, stopping).await;
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
        let deadline = match (closing, state.head_seen(), state.idle_since()) {
            (Some(Some(give_up)), _, _) => give_up,
            (Some(None), _, _) => now + limits.idle_timeout,
            (None, false, _) => opened + limits.header_timeout,
            (None, true, Some(idle)) => idle + limits.idle_timeout,
            (None, true, None) => now + limits.idle_timeout,
        };
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    let e: Box<dyn std::error::Error + Send + Sync> = e.into();
                    count_refusal(metrics, &*e);
                    tracing::debug!(error = %e, %peer, "connection ended with an error");
                }
                return;
            }
            changed = stopping.changed(), if closing.is_none() => {
                if changed.is_err() || *stopping.borrow() {
                    conn.as_mut().graceful_shutdown();
                    closing = Some(None);
                }
            }
            () = tokio::time::sleep_until(deadline.into()) => {
                let now = Instant::now();
                match closing {
                    Some(Some(give_up)) if now >= give_up => return,
                    Some(_) => {}
                    None if !state.head_seen() && now >= opened + limits.header_timeout => {
                        metrics.limit_refusal("header_timeout");
                        return;
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
        if verified_cert {
            req.extensions_mut().insert(VerifiedClientCert);
        }
        // HTTP/2 frames (and so copies) body bytes: only HTTP/1 bodies may send file spans.
        let slot = zero_copy.clone().filter(|_| req.version() <= http::Version::HTTP_11);
        // In progress until the response body is done (or dropped).
        let guard = conn.request();
        let handled = zerocopy::scope(slot, router.clone().oneshot(req.map(axum::body::Body::new)));
        async move {
            let resp = handled.await?;
            Ok(resp.map(|b| {
                axum::body::Body::new(http_body_util::BodyExt::map_frame(b, move |f| {
                    let _in_progress = &guard;
                    f
                }))
            }))
        }
    })
}
