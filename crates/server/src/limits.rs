//! Request limits: URL size and concurrent requests per client address. Connection-level
//! limits (header size and time, connections, TLS handshake time) live in the listener (`listen`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::AppState;

/// Every limit, with defaults an operator can start from.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest request target (path and query), in bytes: 414 beyond.
    pub max_url_bytes: usize,
    /// Largest request head (request line and headers), in bytes: 431 beyond.
    pub max_header_bytes: usize,
    /// Time a client has to send a whole request head (slowloris): the connection is closed after.
    pub header_timeout: Duration,
    /// Time a client has to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// Requests in progress (streaming bodies included) per client address: 429 beyond.
    pub max_client_requests: usize,
    /// Open connections in all. At the cap, a new connection closes the oldest one that has
    /// not sent a complete request head yet (then the oldest idle one); with none of those it
    /// is closed at once.
    pub max_connections: usize,
    /// Open connections per client address, with the same rule within the address.
    pub max_connections_per_address: usize,
    /// Time a new connection has to send its first byte (plain HTTP; TLS: `handshake_timeout`).
    pub first_byte_timeout: Duration,
    /// Time a connection may stay open with no request in progress (HTTP/2: GOAWAY after it;
    /// HTTP/1 waits at most `header_timeout` for the next request head anyway).
    pub idle_timeout: Duration,
    /// A response that made no progress for this long is given up: an HTTP/1 connection (or
    /// an HTTP/2 one) whose socket accepted no byte while it had bytes to send is closed, an
    /// HTTP/2 stream that was not asked for bytes (its flow-control window shut) is reset.
    pub send_stall_timeout: Duration,
    /// `SO_SNDBUF` of every client socket: what a reader that never reads can pin in the
    /// kernel. `0` leaves the system's default (autotuned up to `tcp_wmem`'s maximum).
    pub send_buffer: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_url_bytes: 8 * 1024,
            max_header_bytes: 64 * 1024,
            header_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            max_client_requests: 256,
            max_connections: 10_000,
            max_connections_per_address: 1024,
            first_byte_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            send_stall_timeout: Duration::from_secs(30),
            send_buffer: 256 * 1024,
        }
    }
}

/// Requests in progress per client address.
#[derive(Default)]
pub struct ClientCounts(Mutex<HashMap<IpAddr, usize>>);

/// One request in progress; counted down when the response body is done or dropped.
pub(crate) struct Slot {
    counts: Arc<ClientCounts>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut m = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

impl ClientCounts {
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<Slot> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(Slot { counts: self.clone(), ip })
    }
}

/// The size of a request's head as HTTP/1.1 writes it: the request line, each field as
/// `name: value` and its line end, and the blank line. An HTTP/2 request is measured the same
/// way, so one limit means one size whichever protocol carried it.
fn head_len(req: &Request) -> usize {
    let target = req.uri().path_and_query().map_or(1, |p| p.as_str().len());
    let line = req.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let fields: usize = req.headers().iter().map(|(n, v)| n.as_str().len() + 2 + v.len() + 2).sum();
    line + fields + 2
}

/// A plain error in the OCI error shape for statuses the OCI codes do not cover.
pub fn refusal(status: StatusCode, code: &str, message: String) -> Response {
    let body = serde_json::json!({ "errors": [{ "code": code, "message": message, "detail": null }] });
    (status, axum::Json(body)).into_response()
}

/// URL size and per-client concurrency, before anything else looks at the request: the slot
/// this request holds (to be kept as long as its response body), or the refusal to send.
#[allow(clippy::result_large_err, reason = "the refusal is the response itself, sent at once")]
pub(crate) fn admit(app: &AppState, req: &Request) -> Result<Option<Slot>, Response> {
    let limits = &app.security.limits;
    let head = head_len(req);
    if head > limits.max_header_bytes {
        app.metrics().limit_refusal("headers");
        if let Some(conn) = req.extensions().get::<crate::conns::ConnRef>() {
            conn.0.refused_head();
        }
        let mut resp = refusal(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "UNSUPPORTED",
            format!(
                "request head of {head} bytes is over the limit of {} bytes (limits.maxHeaderBytes)",
                limits.max_header_bytes
            ),
        );
        // An HTTP/1 connection goes with it, as after hyper's own 431; an HTTP/2 one after a few.
        if req.version() <= axum::http::Version::HTTP_11 {
            resp.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        }
        return Err(resp);
    }
    let target_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target_len > limits.max_url_bytes {
        app.metrics().limit_refusal("url");
        return Err(refusal(
            StatusCode::URI_TOO_LONG,
            "UNSUPPORTED",
            format!("request target of {target_len} bytes is over the limit of {} bytes", limits.max_url_bytes),
        ));
    }
    let Some(ip) = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()) else { return Ok(None) };
    match app.client_counts.take(ip, limits.max_client_requests) {
        Some(s) => Ok(Some(s)),
        None => {
            app.metrics().limit_refusal("client_requests");
            let mut resp = refusal(
                StatusCode::TOO_MANY_REQUESTS,
                "TOOMANYREQUESTS",
                format!(
                    "{ip} has {} requests in progress, the limit (limits.maxClientRequests); retry when one is done",
                    limits.max_client_requests
                ),
            );
            resp.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
            Err(resp)
        }
    }
}
