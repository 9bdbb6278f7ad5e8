//! Serving one object, stored or still filling: 200 / 206 / 304 / 416, `Content-Length`,
//! `Accept-Ranges`, `ETag`, `Last-Modified`, conditional requests. Shared by registry blobs
//! and Image Factory assets.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::Method;
use axum::http::{header, HeaderMap, StatusCode, Version};
use axum::response::Response;
use tender_fetch::flight::{stored_pieces, stored_reader, Fill, Phase};
use tender_fetch::{Head, Opened, SharedBody, Stored};
use tender_oci::Digest;

use crate::access::AccessInfo;
use crate::error::{ApiError, Subject};
use crate::range::{self, RangeAsk};
use crate::zerocopy;

/// The headers that describe an object.
#[derive(Debug, Clone, Default)]
pub struct Describe {
    pub content_type: String,
    /// `Docker-Content-Digest` (registry blobs).
    pub docker_digest: Option<Digest>,
    /// The sha256 the object is known by, for the `ETag` (absent while an unverified asset fills).
    pub etag_digest: Option<Digest>,
    pub last_modified: Option<SystemTime>,
    /// `Content-Disposition: attachment; filename=...`
    pub filename: Option<String>,
    pub immutable: bool,
}

impl Describe {
    fn etag(&self) -> Option<String> {
        self.etag_digest.map(|d| format!("\"{d}\""))
    }

    fn builder(&self) -> http::response::Builder {
        let mut b =
            Response::builder().header(header::CONTENT_TYPE, &self.content_type).header(header::ACCEPT_RANGES, "bytes");
        if let Some(d) = &self.docker_digest {
            b = b.header("docker-content-digest", d.to_string());
        }
        if let Some(e) = self.etag() {
            b = b.header(header::ETAG, e);
        }
        if let Some(t) = self.last_modified {
            b = b.header(header::LAST_MODIFIED, httpdate::fmt_http_date(t));
        }
        if let Some(f) = &self.filename {
            b = b.header(header::CONTENT_DISPOSITION, format!("attachment; filename={f}"));
        }
        if self.immutable {
            b = b.header(header::CACHE_CONTROL, "max-age=31536000, immutable");
        }
        b
    }

    /// `If-None-Match` (strong or weak comparison) or, without it, `If-Modified-Since`.
    fn not_modified(&self, req: &HeaderMap) -> bool {
        if let Some(inm) = req.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
            let Some(tag) = self.etag() else { return false };
            return inm.split(',').any(|t| {
                let t = t.trim().trim_start_matches("W/");
                t == "*" || t == tag
            });
        }
        match (req.get(header::IF_MODIFIED_SINCE).and_then(|v| v.to_str().ok()), self.last_modified) {
            (Some(since), Some(lm)) => httpdate::parse_http_date(since).is_ok_and(|s| truncate(lm) <= s),
            _ => false,
        }
    }

    /// Which part to send, honouring `If-Range` (an entity tag or a date).
    fn ask(&self, req: &HeaderMap, total: u64) -> RangeAsk {
        if let Some(ir) = req.get(header::IF_RANGE).and_then(|v| v.to_str().ok()) {
            let ir = ir.trim();
            let matches = if ir.starts_with('"') {
                self.etag().is_some_and(|e| e == ir)
            } else {
                match (httpdate::parse_http_date(ir), self.last_modified) {
                    (Ok(d), Some(lm)) => truncate(lm) == d,
                    _ => false,
                }
            };
            if !matches {
                return RangeAsk::Full;
            }
        }
        range::resolve(req.get(header::RANGE).and_then(|v| v.to_str().ok()), total)
    }
}

/// HTTP dates have whole seconds.
fn truncate(t: SystemTime) -> SystemTime {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(e.to_string())
}

pub fn unsatisfiable(total: u64) -> ApiError {
    ApiError::unsatisfiable(total)
}

/// Answer a request with an object opened by the one way to it ([`tender_fetch::Mirror::open`]
/// and `open_asset`): `describe` turns its head into headers; `info` gets the cache status and
/// digest (a bucket object asked for whole becomes a fill, and says so).
pub async fn respond(
    opened: Opened,
    describe: impl Fn(&Head) -> Describe,
    req: &Parts,
    subject: Subject,
    info: &mut AccessInfo,
) -> Result<Response, ApiError> {
    let is_head = req.method == Method::HEAD;
    let mut opened = opened;
    loop {
        let Opened { head, body } = opened;
        info.cache = Some(head.cache.as_str());
        info.digest = head.digest.or(info.digest);
        let d = describe(&head);
        return match body {
            tender_fetch::Body::Bytes(bytes) => match head.digest {
                Some(digest) => stored(Stored::Memory(bytes), digest, &d, &req.headers, is_head),
                None => Err(internal("an object without a digest")),
            },
            tender_fetch::Body::Stored(object) => match head.digest {
                Some(digest) => stored(object, digest, &d, &req.headers, is_head),
                None => Err(internal("a stored object without a digest")),
            },
            tender_fetch::Body::Filling(fill) => {
                filling(fill, &d, &req.headers, req.version, subject, head.range_before_verify).await
            }
            tender_fetch::Body::Empty => head_only(&d, head.size),
            tender_fetch::Body::Shared(found) => match shared(&found, &d, &req.headers, is_head) {
                Some(resp) => resp,
                None => {
                    opened = found.whole().map_err(|e| ApiError::from_fetch(&e, subject))?;
                    continue;
                }
            },
        };
    }
}

/// Headers only: a `HEAD`, with the length when known.
pub fn head_only(d: &Describe, len: Option<u64>) -> Result<Response, ApiError> {
    let mut b = d.builder().status(StatusCode::OK);
    if let Some(l) = len {
        b = b.header(header::CONTENT_LENGTH, l);
    }
    b.body(Body::empty()).map_err(internal)
}

/// Serve a committed object: its bytes from memory (a small object), or its file.
pub fn stored(
    object: Stored,
    digest: Digest,
    d: &Describe,
    req: &HeaderMap,
    is_head: bool,
) -> Result<Response, ApiError> {
    let len = object.len();
    if d.not_modified(req) {
        return d.builder().status(StatusCode::NOT_MODIFIED).body(Body::empty()).map_err(internal);
    }
    if is_head {
        return head_only(d, Some(len));
    }
    match d.ask(req, len) {
        RangeAsk::Unsatisfiable => Err(unsatisfiable(len)),
        RangeAsk::Partial { start, end } => d
            .builder()
            .status(StatusCode::PARTIAL_CONTENT)
            .header(header::CONTENT_LENGTH, end - start)
            .header(header::CONTENT_RANGE, format!("bytes {start}-{}/{len}", end - 1))
            .body(stored_body(object, digest, start, end))
            .map_err(internal),
        RangeAsk::Full => d
            .builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_LENGTH, len)
            .body(stored_body(object, digest, 0, len))
            .map_err(internal),
    }
}

/// The body of a committed object's bytes `start..end`: one buffer for an object in memory
/// (written with the head in one call), file spans sent with `sendfile` where the connection
/// can (plain HTTP/1), read and copied otherwise.
fn stored_body(object: Stored, digest: Digest, start: u64, end: u64) -> Body {
    match object {
        // `start..end` lies within the object: `ask` resolved it against its length.
        Stored::Memory(bytes) => Body::from(bytes.slice(start as usize..end as usize)),
        Stored::File { file, len } => match zerocopy::current() {
            Some(slot) => zerocopy::body(stored_pieces(file, len, digest, start, end), slot),
            None => Body::from_stream(stored_reader(file, len, digest, start, end)),
        },
    }
}

/// The body of a fill's bytes (see [`Fill::reader`]), with file spans where the connection can.
fn fill_body(fill: &Arc<Fill>, start: u64, end: Option<u64>, withhold: bool) -> Body {
    match zerocopy::current() {
        Some(slot) => zerocopy::body(fill.pieces(start, end, withhold), slot),
        None => Body::from_stream(fill.reader(start, end, withhold)),
    }
}

/// The body of a range of a fill that goes out only once the fill's content verified (see
/// [`Fill::verified_pieces`]).
fn verified_fill_body(fill: &Arc<Fill>, start: u64, end: u64) -> Body {
    match zerocopy::current() {
        Some(slot) => zerocopy::body(fill.verified_pieces(start, Some(end), true), slot),
        None => Body::from_stream(fill.verified_reader(start, Some(end))),
    }
}

/// Serve an object that is being filled: headers as soon as the upstream answered, bytes as
/// they arrive, the final byte of a full body only after verification. A range to the
/// object's end goes out the same way; any other range goes out as it arrives only with
/// `range_before_verify` (an upstream trusted to send the right bytes), otherwise its bytes
/// wait for the fill's verdict (issue 32).
pub async fn filling(
    fill: Arc<Fill>,
    d: &Describe,
    req: &HeaderMap,
    version: Version,
    subject: Subject,
    range_before_verify: bool,
) -> Result<Response, ApiError> {
    let mut state = fill.started().await;
    if state.total.is_none() && version < Version::HTTP_11 {
        // No size from the upstream, and a client without chunked encoding: its body would end
        // where the connection closes, and a cut would read as the end. It gets the object
        // once it verified, with its length.
        state = fill.settled().await;
        if !matches!(state.phase, Phase::Failed(_)) {
            state.total = Some(state.written);
        }
    }
    if let Phase::Failed(e) = &state.phase {
        return Err(ApiError::from_fetch(e, subject));
    }
    // A registry object's tag is its digest, known before the first byte: a client holding it
    // needs nothing from this fill.
    if d.not_modified(req) {
        return d.builder().status(StatusCode::NOT_MODIFIED).body(Body::empty()).map_err(internal);
    }
    let Some(total) = state.total else {
        // No size from the upstream: a chunked body that only ends once the object verified.
        return d.builder().status(StatusCode::OK).body(fill_body(&fill, 0, None, true)).map_err(internal);
    };
    match d.ask(req, total) {
        RangeAsk::Unsatisfiable => Err(unsatisfiable(total)),
        RangeAsk::Partial { start, end } => d
            .builder()
            .status(StatusCode::PARTIAL_CONTENT)
            .header(header::CONTENT_LENGTH, end - start)
            .header(header::CONTENT_RANGE, format!("bytes {start}-{}/{total}", end - 1))
            .body(if range_before_verify || fill.is_verified() {
                fill_body(&fill, start, Some(end), false)
            } else if end == total {
                // A range to the object's end (a child tier resuming, `bytes=N-`) streams as a
                // full body does: its final byte goes out only once the object verified, so
                // a wrong object never arrives whole (issue 38).
                fill_body(&fill, start, Some(end), true)
            } else {
                verified_fill_body(&fill, start, end)
            })
            .map_err(internal),
        RangeAsk::Full => d
            .builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_LENGTH, total)
            .body(fill_body(&fill, 0, Some(total), true))
            .map_err(internal),
    }
}

/// Serve an object this replica does not hold but the shared bucket does, when that needs no
/// local copy: a `HEAD`, a `304`, or a range (fetched as whole chunks, each verified before a
/// byte of it goes out; should the bucket fail, the rest comes from the local copy or the
/// upstream). `None`: a full body, which the caller fills into the local cache.
fn shared(found: &SharedBody, d: &Describe, req: &HeaderMap, is_head: bool) -> Option<Result<Response, ApiError>> {
    let size = found.size();
    if d.not_modified(req) {
        return Some(d.builder().status(StatusCode::NOT_MODIFIED).body(Body::empty()).map_err(internal));
    }
    if is_head {
        return Some(head_only(d, Some(size)));
    }
    match d.ask(req, size) {
        RangeAsk::Full => None,
        RangeAsk::Unsatisfiable => Some(Err(unsatisfiable(size))),
        RangeAsk::Partial { start, end } => Some(
            d.builder()
                .status(StatusCode::PARTIAL_CONTENT)
                .header(header::CONTENT_LENGTH, end - start)
                .header(header::CONTENT_RANGE, format!("bytes {start}-{}/{size}", end - 1))
                .body(Body::from_stream(found.range(start, end)))
                .map_err(internal),
        ),
    }
}
