//! One structured access-log line and the HTTP metrics per request, emitted when the response
//! body ends (or the client goes away), so bytes and duration are the real ones.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body::Frame;

use crate::metrics::ServerMetrics;

/// Set by handlers on their response: what the access log and metrics should say.
#[derive(Debug, Clone, Default)]
pub struct AccessInfo {
    pub route: &'static str,
    pub upstream: Option<String>,
    pub cache: Option<&'static str>,
    pub digest: Option<tender_oci::Digest>,
    /// `<upstream>/<repository>` for registry requests (`image-factory/<schematic>/<version>/<asset>`
    /// for OS images), for the served statistics.
    pub repository: Option<String>,
    /// Keep what this request fetched out of eviction (a prefetch with `X-Tender-Pin: 1`).
    pub pin: bool,
}

/// A digest in the access log, or nothing.
struct DigestField<'a>(Option<&'a tender_oci::Digest>);

impl std::fmt::Display for DigestField<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(d) => std::fmt::Display::fmt(d, f),
            None => Ok(()),
        }
    }
}

/// The OCI error code of an error response.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCodeSeen(pub &'static str);

struct Record {
    method: String,
    path: String,
    ns: Option<String>,
    user_agent: String,
    prefetch: bool,
    status: u16,
    info: AccessInfo,
    content_length: Option<u64>,
    error: Option<&'static str>,
    started: Instant,
    metrics: Arc<ServerMetrics>,
}

/// A response body that counts what it sends and logs when it is done.
struct CountingBody {
    inner: Body,
    bytes: u64,
    complete: bool,
    record: Option<Record>,
}

impl http_body::Body for CountingBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    self.bytes += d.len() as u64;
                }
            }
            Poll::Ready(None) => self.complete = true,
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for CountingBody {
    fn drop(&mut self) {
        let Some(r) = self.record.take() else { return };
        let complete = self.complete
            || http_body::Body::is_end_stream(&self.inner)
            || r.content_length.is_some_and(|n| n == self.bytes);
        let secs = r.started.elapsed().as_secs_f64();
        r.metrics.observe(&r.info, &r.method, r.status, self.bytes, secs, r.prefetch);
        tracing::info!(
            target: "access",
            method = %r.method,
            path = %r.path,
            ns = r.ns.as_deref().unwrap_or(""),
            upstream = r.info.upstream.as_deref().unwrap_or(""),
            status = r.status,
            bytes = self.bytes,
            duration_ms = (secs * 1000.0).round() as u64,
            cache = r.info.cache.unwrap_or(""),
            digest = %DigestField(r.info.digest.as_ref()),
            error = r.error.unwrap_or(""),
            complete,
            prefetch = r.prefetch,
            user_agent = %r.user_agent,
            "request"
        );
    }
}

/// Middleware: wrap every response body so it is logged and counted when done.
pub async fn layer(State(metrics): State<Arc<ServerMetrics>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    // A method is a token of any length: the log line carries at most 16 bytes of it.
    let method = {
        let m = req.method().as_str();
        let end = (0..=m.len().min(16)).rev().find(|&i| m.is_char_boundary(i)).unwrap_or(0);
        m[..end].to_string()
    };
    let path = req.uri().path().to_string();
    let ns = req.uri().query().and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("ns="))).map(str::to_string);
    let user_agent =
        req.headers().get(http::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let prefetch = req.headers().get("x-tender-prefetch").is_some_and(|v| v.as_bytes() == b"1");
    let resp = next.run(req).await;
    let (mut parts, body) = resp.into_parts();
    let prefetch = prefetch && parts.extensions.remove::<crate::auth::PrefetchIgnored>().is_none();
    let info = parts.extensions.remove::<AccessInfo>().unwrap_or_default();
    let error = parts.extensions.remove::<ErrorCodeSeen>().map(|e| e.0);
    let content_length =
        parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let record = Record {
        method,
        path,
        ns,
        user_agent,
        prefetch,
        status: parts.status.as_u16(),
        info,
        content_length,
        error,
        started,
        metrics,
    };
    let body = CountingBody { inner: body, bytes: 0, complete: false, record: Some(record) };
    Response::from_parts(parts, Body::new(body))
}
