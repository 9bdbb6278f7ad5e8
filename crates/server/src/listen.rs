//! The accept loop: plain HTTP or TLS (HTTP/2 and HTTP/1.1), with the connection-level limits
//! (connections, TLS handshake time, request head size and time) and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::auth::VerifiedClientCert;
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
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(opts.limits.max_connections));
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.limit_refusal("connections");
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (builder, router, opts, metrics) = (builder.clone(), router.clone(), opts.clone(), metrics.clone());
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _slot = slot;
            serve_connection(tcp, peer, &builder, router, &opts, &metrics, watcher).await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

async fn serve_connection(
    tcp: TcpStream,
    peer: SocketAddr,
    builder: &auto::Builder<TokioExecutor>,
    router: Router,
    opts: &ListenOptions,
    metrics: &ServerMetrics,
    watcher: hyper_util::server::graceful::Watcher,
) {
    let Some(tls) = &opts.tls else {
        let slot = ZeroCopy::new(metrics.sendfile_bytes.clone());
        let svc = service(router, peer, false, Some(slot.clone()));
        let conn = builder.serve_connection(TokioIo::new(ZeroCopyStream::new(tcp, slot)), svc).into_owned();
        if let Err(e) = watcher.watch(conn).await {
            count_refusal(metrics, &*e);
            tracing::debug!(error = %e, %peer, "connection ended with an error");
        }
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
    let verified = tls.mutual() && stream.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
    let svc = service(router, peer, verified, None);
    let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
    if let Err(e) = watcher.watch(conn).await {
        count_refusal(metrics, &*e);
        tracing::debug!(error = %e, %peer, "connection ended with an error");
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
        zerocopy::scope(slot, router.clone().oneshot(req.map(axum::body::Body::new)))
    })
}
