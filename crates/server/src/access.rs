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

pub use crate::access_info::AccessInfo;
pub use crate::error::ErrorCodeSeen;
use crate::metrics::ServerMetrics;

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

struct Record {
    /// What the request said, taken before it was handed on.
    request: Begin,
    status: u16,
    info: AccessInfo,
    content_length: Option<u64>,
    error: Option<&'static str>,
    metrics: Arc<ServerMetrics>,
}

/// A response body that counts what it sends and logs when it is done.
struct CountingBody {
    inner: Body,
    bytes: u64,
    complete: bool,
    record: Option<Record>,
    /// The request's place under `limits.maxClientRequests`, held until the body is done:
    /// a 1 GiB download is one request in progress until its last byte.
    _slot: Option<crate::limits::Slot>,
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
        let secs = r.request.started.elapsed().as_secs_f64();
        // A method is a token of any length: the log line carries at most 16 bytes of it.
        let method = {
            let m = r.request.method.as_str();
            let end = (0..=m.len().min(16)).rev().find(|&i| m.is_char_boundary(i)).unwrap_or(0);
            &m[..end]
        };
        r.metrics.observe(&r.info, method, r.status, self.bytes, secs, r.request.prefetch);
        let ns = r.request.uri.query().and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("ns="))).unwrap_or("");
        let line = Line {
            method,
            path: r.request.uri.path(),
            ns,
            upstream: r.info.upstream.as_deref().unwrap_or(""),
            status: r.status,
            bytes: self.bytes,
            duration_ms: (secs * 1000.0).round() as u64,
            cache: r.info.cache.unwrap_or(""),
            digest: r.info.digest.as_ref(),
            error: r.error.unwrap_or(""),
            complete,
            prefetch: r.request.prefetch,
            user_agent: r.request.user_agent.as_ref().and_then(|v| v.to_str().ok()).unwrap_or(""),
        };
        line.emit();
    }
}

/// The fields of one access-log line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Line<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub ns: &'a str,
    pub upstream: &'a str,
    pub status: u16,
    pub bytes: u64,
    pub duration_ms: u64,
    pub cache: &'a str,
    pub digest: Option<&'a tender_oci::Digest>,
    pub error: &'a str,
    pub complete: bool,
    pub prefetch: bool,
    pub user_agent: &'a str,
}

/// How the process's log is formatted, for access lines written directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStyle {
    /// tracing-subscriber's full text format, without colours.
    Text,
    /// tracing-subscriber's JSON format with the event's fields flattened.
    Json,
}

/// Where access lines go when written directly: the log's own writer.
pub type LineWriter = fn(&[u8]);

static DIRECT: std::sync::OnceLock<(LogStyle, LineWriter)> = std::sync::OnceLock::new();

/// Write access lines straight to `write`, formatted as the process's tracing subscriber
/// formats events (`style`), instead of as tracing events: one line costs a few small writes
/// into a buffer instead of tracing's visitor and formatting machinery (a sixth of a small
/// hit). The `access` target's filter (`TENDER_LOG=access=off`) still applies. Set once, by
/// the binary, with its subscriber.
pub fn log_directly(style: LogStyle, write: LineWriter) {
    let _ = DIRECT.set((style, write));
}

thread_local! {
    static LINE_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Line<'_> {
    fn emit(&self) {
        let Some((style, write)) = DIRECT.get() else {
            self.event();
            return;
        };
        if !tracing::enabled!(target: "access", tracing::Level::INFO) {
            return;
        }
        LINE_BUF.with(|b| {
            let Ok(mut buf) = b.try_borrow_mut() else {
                self.event();
                return;
            };
            buf.clear();
            self.format(*style, std::time::SystemTime::now(), &mut buf);
            write(&buf);
            if buf.capacity() > 64 * 1024 {
                *buf = Vec::new();
            }
        });
    }

    /// The line as a tracing event (in-process servers, tests).
    fn event(&self) {
        tracing::info!(
            target: "access",
            method = %self.method,
            path = %self.path,
            ns = self.ns,
            upstream = self.upstream,
            status = self.status,
            bytes = self.bytes,
            duration_ms = self.duration_ms,
            cache = self.cache,
            digest = %DigestField(self.digest),
            error = self.error,
            complete = self.complete,
            prefetch = self.prefetch,
            user_agent = %self.user_agent,
            "request"
        );
    }

    /// Byte for byte what tracing-subscriber writes for [`Line::event`] (`%` fields as
    /// written, the others as their `Debug`; JSON: strings, numbers, booleans).
    pub(crate) fn format(&self, style: LogStyle, now: std::time::SystemTime, out: &mut Vec<u8>) {
        use std::io::Write as _;
        // `2026-12-02T04:00:59.092601Z`, as tracing-subscriber's `SystemTime` timer writes it.
        let ts = humantime::format_rfc3339_micros(now);
        let mut num = itoa::Buffer::new();
        match style {
            LogStyle::Text => {
                let _ = write!(out, "{ts}  INFO access: request method=");
                out.extend_from_slice(self.method.as_bytes());
                out.extend_from_slice(b" path=");
                out.extend_from_slice(self.path.as_bytes());
                let _ = write!(out, " ns={:?} upstream={:?} status=", self.ns, self.upstream);
                out.extend_from_slice(num.format(self.status).as_bytes());
                out.extend_from_slice(b" bytes=");
                out.extend_from_slice(num.format(self.bytes).as_bytes());
                out.extend_from_slice(b" duration_ms=");
                out.extend_from_slice(num.format(self.duration_ms).as_bytes());
                let _ = write!(out, " cache={:?} digest=", self.cache);
                if let Some(d) = self.digest {
                    let _ = write!(out, "{d}");
                }
                let _ = write!(
                    out,
                    " error={:?} complete={} prefetch={} user_agent=",
                    self.error, self.complete, self.prefetch
                );
                out.extend_from_slice(self.user_agent.as_bytes());
            }
            LogStyle::Json => {
                let _ = write!(out, "{{\"timestamp\":\"{ts}\",\"level\":\"INFO\",\"message\":\"request\",\"method\":");
                json_str(out, self.method);
                out.extend_from_slice(b",\"path\":");
                json_str(out, self.path);
                out.extend_from_slice(b",\"ns\":");
                json_str(out, self.ns);
                out.extend_from_slice(b",\"upstream\":");
                json_str(out, self.upstream);
                out.extend_from_slice(b",\"status\":");
                out.extend_from_slice(num.format(self.status).as_bytes());
                out.extend_from_slice(b",\"bytes\":");
                out.extend_from_slice(num.format(self.bytes).as_bytes());
                out.extend_from_slice(b",\"duration_ms\":");
                out.extend_from_slice(num.format(self.duration_ms).as_bytes());
                out.extend_from_slice(b",\"cache\":");
                json_str(out, self.cache);
                out.extend_from_slice(b",\"digest\":\"");
                if let Some(d) = self.digest {
                    let _ = write!(out, "{d}");
                }
                out.extend_from_slice(b"\",\"error\":");
                json_str(out, self.error);
                let _ = write!(out, ",\"complete\":{},\"prefetch\":{},\"user_agent\":", self.complete, self.prefetch);
                json_str(out, self.user_agent);
                out.extend_from_slice(b",\"target\":\"access\"}");
            }
        }
        out.push(b'\n');
    }
}

/// A JSON string, escaped as serde_json escapes it.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// What the access line needs of a request, taken before the request is handed on.
pub(crate) struct Begin {
    started: Instant,
    method: http::Method,
    uri: http::Uri,
    user_agent: Option<http::HeaderValue>,
    prefetch: bool,
}

impl Begin {
    pub(crate) fn of(req: &Request) -> Begin {
        Begin {
            started: Instant::now(),
            method: req.method().clone(),
            uri: req.uri().clone(),
            user_agent: req.headers().get(http::header::USER_AGENT).cloned(),
            prefetch: req.headers().get("x-tender-prefetch").is_some_and(|v| v.as_bytes() == b"1"),
        }
    }

    /// Wrap the response body so the request is logged and counted when the body is done (or
    /// dropped), holding `slot` until then. `prefetch_dropped`: the request's prefetch headers
    /// were ignored (an anonymous client), so it is counted as an ordinary pull.
    pub(crate) fn finish(
        self,
        resp: Response,
        metrics: Arc<ServerMetrics>,
        slot: Option<crate::limits::Slot>,
        prefetch_dropped: bool,
    ) -> Response {
        let (mut parts, body) = resp.into_parts();
        let info = parts.extensions.remove::<AccessInfo>().unwrap_or_default();
        let error = parts.extensions.remove::<ErrorCodeSeen>().map(|e| e.0);
        let content_length =
            parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let prefetch = self.prefetch && !prefetch_dropped;
        let record = Record {
            request: Begin { prefetch, ..self },
            status: parts.status.as_u16(),
            info,
            content_length,
            error,
            metrics,
        };
        let body = CountingBody { inner: body, bytes: 0, complete: false, record: Some(record), _slot: slot };
        Response::from_parts(parts, Body::new(body))
    }
}

/// The one middleware of every listener: the access line and metrics (when the body is done),
/// the request limits, and client authentication where `auth` (a listener that serves pulls).
/// One layer instead of three: a small hit pays for one boxed service and one body wrapper.
pub(crate) async fn front(State(front): State<Front>, mut req: Request, next: Next) -> Response {
    let begin = Begin::of(&req);
    let app = &front.app;
    let slot = match crate::limits::admit(app, &req) {
        Ok(slot) => slot,
        Err(refusal) => return begin.finish(refusal, app.metrics.clone(), None, false),
    };
    let mut prefetch_dropped = false;
    if front.auth {
        match crate::auth::check(app, &mut req).await {
            Ok(dropped) => prefetch_dropped = dropped,
            Err(refusal) => return begin.finish(refusal, app.metrics.clone(), slot, false),
        }
    }
    let resp = next.run(req).await;
    begin.finish(resp, app.metrics.clone(), slot, prefetch_dropped)
}

/// The state of [`front`].
#[derive(Clone)]
pub(crate) struct Front {
    pub app: Arc<crate::AppState>,
    /// Authenticate clients (a listener that serves pulls).
    pub auth: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use std::sync::{Arc, Mutex};

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What tracing-subscriber writes for the line as an event: the reference.
    fn via_tracing(style: LogStyle, line: &Line<'_>) -> String {
        let out = Captured::default();
        let w = out.clone();
        let builder = tracing_subscriber::fmt().with_ansi(false).with_writer(move || w.clone());
        match style {
            LogStyle::Text => tracing::subscriber::with_default(builder.finish(), || line.event()),
            LogStyle::Json => {
                tracing::subscriber::with_default(builder.json().flatten_event(true).finish(), || line.event())
            }
        }
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn direct(style: LogStyle, line: &Line<'_>, now: std::time::SystemTime) -> String {
        let mut out = Vec::new();
        line.format(style, now, &mut out);
        String::from_utf8(out).unwrap()
    }

    /// The line without its timestamp (the two were written at different instants).
    fn untimed(style: LogStyle, s: &str) -> String {
        match style {
            LogStyle::Text => s[27..].to_string(),
            LogStyle::Json => {
                let mut v: serde_json::Value = serde_json::from_str(s).unwrap();
                v.as_object_mut().unwrap().remove("timestamp");
                // Key order and escaping are compared on the text as well, below.
                serde_json::to_string(&v).unwrap() + &s[s.find("\"level\"").unwrap()..]
            }
        }
    }

    fn check(line: &Line<'_>) {
        for style in [LogStyle::Text, LogStyle::Json] {
            let (reference, ours) = (via_tracing(style, line), direct(style, line, std::time::SystemTime::now()));
            assert_eq!(untimed(style, &ours), untimed(style, &reference), "{style:?}");
        }
    }

    fn sample<'a>(d: Option<&'a tender_oci::Digest>) -> Line<'a> {
        Line {
            method: "GET",
            path: "/v2/ghcr.io/siderolabs/kubelet/blobs/sha256:00",
            ns: "ghcr.io",
            upstream: "ghcr.io",
            status: 200,
            bytes: 2087,
            duration_ms: 3,
            cache: "hit",
            digest: d,
            error: "",
            complete: true,
            prefetch: false,
            user_agent: "containerd/v1.7.0",
        }
    }

    #[test]
    fn should_write_access_lines_as_tracing_subscriber_writes_them() {
        let d = tender_oci::Digest::of(b"x");
        check(&sample(Some(&d)));
        check(&sample(None));
        let odd = Line {
            method: "PROPFIND",
            path: "/v2/a\"b\\c/é",
            ns: "quote\" backslash\\ tab\t nl\n del\u{7f} é \u{1}",
            user_agent: "agent \"with\" quotes é\u{2028}",
            error: "MANIFEST_UNKNOWN",
            complete: false,
            prefetch: true,
            status: 404,
            ..sample(None)
        };
        check(&odd);
    }

    #[test]
    fn should_write_the_timestamp_as_tracing_subscriber_does() {
        let line = sample(None);
        for secs in [0u64, 951_782_400, 1_764_648_059, 4_102_444_799, 253_402_300_799] {
            let t = std::time::UNIX_EPOCH + std::time::Duration::new(secs, 92_601_123);
            let ours = direct(LogStyle::Text, &line, t);
            let expected = httpdate_rfc3339(secs);
            assert_eq!(&ours[..27], format!("{expected}.092601Z"), "{secs}");
        }
    }

    /// `YYYY-MM-DDTHH:MM:SS` from the `Date` header format httpdate writes (an independent
    /// calendar).
    fn httpdate_rfc3339(secs: u64) -> String {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        let h = httpdate::fmt_http_date(t); // "Tue, 15 Nov 1994 08:12:31 GMT"
        let p: Vec<&str> = h.split([' ', ':']).collect();
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
        let m = months.iter().position(|x| *x == p[2]).unwrap() + 1;
        format!("{}-{m:02}-{}T{}:{}:{}", p[3], p[1], p[4], p[5], p[6])
    }

    proptest! {
        #[test]
        fn should_match_tracing_subscriber_for_any_field_text(
            path in "\\PC{0,40}", ns in "\\PC{0,12}", ua in "\\PC{0,30}", err in "[A-Z_]{0,20}",
            status in 100u16..600, bytes in any::<u64>(), ms in any::<u64>(),
        ) {
            let line = Line { path: &path, ns: &ns, user_agent: &ua, error: &err, status, bytes, duration_ms: ms, ..sample(None) };
            check(&line);
        }
    }
}
