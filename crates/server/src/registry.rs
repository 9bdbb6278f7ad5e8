//! The OCI distribution pull API: `/v2/...` parsed into a typed route, then served.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tender_fetch::mirror::{CacheResult, Listing, ListingKind};
use tender_fetch::{Ask, FetchError, FetchErrorKind, Head, Object, Routed, Viewer};
use tender_oci::media::AcceptList;
use tender_oci::{Digest, ErrorCode, Reference, Route, RouteError, RouteKind};

use crate::access::AccessInfo;
use crate::auth::Identity;
use crate::error::{ApiError, Subject};
use crate::object;
use crate::AppState;

const API_VERSION: &str = "registry/2.0";

/// The `ns` query parameter (percent-decoded), and the rest of the query (passed to the
/// upstream with listings: `n`, `last`, `artifactType`, the opaque ones of an upstream's `Link`).
struct Query {
    ns: Option<String>,
    rest: Vec<(String, String)>,
}

fn parse_query(q: Option<&str>) -> Query {
    let mut out = Query { ns: None, rest: Vec::new() };
    for (k, v) in url::form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "ns" => out.ns = Some(v.into_owned()),
            // A page size that is not a number is ignored, as the reference registry ignores it:
            // never passed on.
            "n" if v.parse::<u32>().is_err() => {}
            _ => out.rest.push((k.into_owned(), v.into_owned())),
        }
    }
    out
}

fn with_info(mut resp: Response, info: AccessInfo) -> Response {
    resp.extensions_mut().insert(info);
    resp
}

/// Entry point for everything under `/v2`.
pub async fn handle(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, _body) = req.into_parts();
    if parts.uri.path() == "/v2/_catalog" && (parts.method == Method::GET || parts.method == Method::HEAD) {
        let identity = parts.extensions.get::<Identity>();
        let mut resp = crate::inventory::catalog(&app, identity, parts.uri.query()).await;
        resp.headers_mut().insert("docker-distribution-api-version", HeaderValue::from_static(API_VERSION));
        return with_info(resp, AccessInfo { route: "catalog", ..AccessInfo::default() });
    }
    let mut info = AccessInfo { route: "other", ..AccessInfo::default() };
    let result = dispatch(&app, &parts, &mut info).await;
    let uri = &parts.uri;
    // The spec's SHOULD for `?ns=` requests: name the namespace that answered.
    let namespace = match (&info.upstream, parse_query(uri.query()).ns) {
        (Some(up), Some(_)) => HeaderValue::from_str(up).ok(),
        _ => None,
    };
    if let (true, Ok(_), Some(d)) = (info.pin, &result, info.digest) {
        if let Err(e) = app.mirror().pin(&d, "prefetch") {
            tracing::warn!(digest = %d, error = %e, "could not pin");
        }
    }
    if result.is_ok() && matches!(info.route, "manifest" | "blob") {
        note_served(&app, &info);
    }
    let mut resp = match result {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    resp.headers_mut().insert("docker-distribution-api-version", HeaderValue::from_static(API_VERSION));
    if let Some(ns) = namespace {
        resp.headers_mut().insert("oci-namespace", ns);
    }
    with_info(resp, info)
}

/// Note for the shared bucket's size cap (`tender gc --bucket`) that this replica served the
/// object `info` names, from its data directory, the bucket or a fill (a map insert; the
/// records are flushed in batches). A pass served nothing of ours.
pub(crate) fn note_served(app: &AppState, info: &AccessInfo) {
    if info.cache.is_none_or(|c| c == CacheResult::Pass.as_str()) {
        return;
    }
    if let Some(d) = info.digest {
        app.mirror().note_served(&d);
    }
}

async fn dispatch(app: &Arc<AppState>, req: &Parts, info: &mut AccessInfo) -> Result<Response, ApiError> {
    let (method, path, query, headers) = (&req.method, req.uri.path(), req.uri.query(), &req.headers);
    let authenticated = req.extensions.get::<Identity>().is_some_and(Identity::is_authenticated);
    let route = Route::parse(path).map_err(|e| match e {
        RouteError::Unsupported => ApiError::new(ErrorCode::Unsupported, e.to_string()),
        RouteError::NotFound(_) => ApiError::new(ErrorCode::NameUnknown, e.to_string()),
        RouteError::Name(_) => ApiError::new(ErrorCode::NameInvalid, e.to_string()),
        // A reference that is neither a tag nor a digest names no manifest (the reference
        // registry answers 404); one that tries to be a digest is an invalid digest.
        RouteError::Reference(_) if path.rsplit('/').next().is_some_and(|r| r.contains(':')) => {
            ApiError::new(ErrorCode::DigestInvalid, e.to_string())
        }
        RouteError::Reference(_) => ApiError::new(ErrorCode::ManifestUnknown, e.to_string()),
        RouteError::Digest(_) => ApiError::new(ErrorCode::DigestInvalid, e.to_string()),
    })?;
    if method != Method::GET && method != Method::HEAD {
        return Err(ApiError::new(ErrorCode::Unsupported, "tender is a pull-through mirror: only GET and HEAD"));
    }
    let q = parse_query(query);
    let Some(name) = route.name.clone() else {
        info.route = "base";
        return Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], "{}").into_response());
    };
    let mirror = app.mirror();
    let routed =
        mirror.routed(q.ns.as_deref(), &name).map_err(|e| ApiError::new(ErrorCode::NameUnknown, e.to_string()))?;
    info.upstream = Some(routed.upstream().to_string());
    info.repository = Some(format!("{}/{}", routed.upstream(), routed.repository()));
    let flag = |h: &str| headers.get(h).is_some_and(|v| v.as_bytes() == b"1");
    info.pin = flag("x-tender-prefetch") && flag("x-tender-pin");
    let accept = AcceptList::parse(headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()));
    let viewer = Viewer { authenticated };
    let ask = Ask { viewer, accept: &accept, head: method == Method::HEAD, keep: flag("x-tender-prefetch") };
    match route.kind {
        RouteKind::Base => Err(ApiError::new(ErrorCode::NameUnknown, "no such endpoint")),
        RouteKind::Manifest(reference) => {
            info.route = "manifest";
            let pinned_tag = match &reference {
                Reference::Tag(t) if info.pin => Some(t.to_string()),
                _ => None,
            };
            let answer = manifest(app, &routed, reference, ask, headers, info).await;
            if let (Ok(_), Some(tag), Some(d)) = (&answer, pinned_tag, info.digest) {
                if let Err(e) = mirror.pin_tag(routed.upstream(), routed.repository().as_str(), &tag, &d) {
                    tracing::warn!(%tag, digest = %d, error = %e, "could not pin the tag");
                }
            }
            answer
        }
        RouteKind::Blob(digest) => {
            info.route = "blob";
            info.digest = Some(digest);
            blob(app, &routed, digest, ask, req, info).await
        }
        RouteKind::TagsList | RouteKind::Referrers(_) => {
            let (kind, subject) = match route.kind {
                RouteKind::Referrers(digest) => {
                    info.route = "referrers";
                    (ListingKind::Referrers(digest), Subject::Manifest)
                }
                _ => {
                    info.route = "tags";
                    (ListingKind::Tags, Subject::Repository)
                }
            };
            // An upstream without the referrers API answers 404, and so does tender: that 404 is
            // what makes clients use the tag-schema fallback (`sha256-<hex>` tags).
            let listing = match mirror.list(&routed, viewer, &kind, &q.rest, &name, q.ns.as_deref()).await {
                Ok(l) => l,
                Err(e) => return refused(&e, subject),
            };
            info.cache = Some(listing.cache.as_str());
            Ok(listing_response(listing, ask.head))
        }
    }
}

/// The header on an answer served stale while its upstream is unreachable: the age of the
/// copy, in seconds.
pub const STALE_HEADER: &str = "x-tender-stale";
/// On a manifest from an upstream whose content goes only to authenticated clients (it has
/// credentials or is `private`): `1`.
pub const PRIVATE_HEADER: &str = "x-tender-private";

fn listing_response(listing: Listing, head: bool) -> Response {
    let mut builder = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, listing.content_type)
        .header(header::CONTENT_LENGTH, listing.body.len());
    if let Some(age) = listing.stale_age {
        builder = builder.header(STALE_HEADER, age);
    }
    if let Some(l) = listing.link {
        builder = builder.header(header::LINK, l);
    }
    if let Some(f) = listing.filters_applied {
        builder = builder.header("oci-filters-applied", f);
    }
    builder
        .body(if head { Body::empty() } else { Body::from(listing.body) })
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn etag(d: &Digest) -> String {
    format!("\"{d}\"")
}

fn if_none_match(headers: &HeaderMap, d: &Digest) -> bool {
    let tag = etag(d);
    headers.get_all(header::IF_NONE_MATCH).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|t| {
        let t = t.trim().trim_start_matches("W/");
        t == "*" || t == tag
    })
}

/// A fetch failure as an answer: a challenge for a client that must log in, else the error.
fn refused(e: &FetchError, subject: Subject) -> Result<Response, ApiError> {
    if e.kind == FetchErrorKind::Unauthenticated {
        return Ok(crate::auth::challenge(&e.message));
    }
    Err(ApiError::from_fetch(e, subject))
}

async fn manifest(
    app: &Arc<AppState>,
    route: &Routed,
    reference: Reference,
    ask: Ask<'_>,
    headers: &HeaderMap,
    info: &mut AccessInfo,
) -> Result<Response, ApiError> {
    let opened = match app.mirror().open(route, &Object::Manifest(reference), ask).await {
        Ok(o) => o,
        Err(e) => return refused(&e, Subject::Manifest),
    };
    let (head, body) = (opened.head, opened.body);
    info.cache = Some(head.cache.as_str());
    info.digest = head.digest;
    info.confirmed = head.name_confirmed;
    let (Some(digest), tender_fetch::Body::Bytes(bytes)) = (head.digest, body) else {
        return Err(ApiError::new(ErrorCode::ManifestUnknown, "not a manifest"));
    };
    let mut builder = Response::builder()
        .header(header::CONTENT_TYPE, head.media_type.as_deref().unwrap_or(tender_oci::media::OCI_MANIFEST))
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header("docker-content-digest", digest.to_string())
        .header(header::ETAG, etag(&digest));
    if head.private {
        // Only an authenticated client gets here: it learns that what it pulled is private, so
        // `tender export --server` can record it in the bundle (issue 32).
        builder = builder.header(PRIVATE_HEADER, "1");
    }
    if let Some(age) = head.stale_age {
        builder = builder.header(STALE_HEADER, age);
    }
    let resp = if if_none_match(headers, &digest) {
        builder.status(StatusCode::NOT_MODIFIED).body(Body::empty())
    } else {
        builder.status(StatusCode::OK).header(header::CONTENT_LENGTH, bytes.len()).body(if ask.head {
            Body::empty()
        } else {
            Body::from(bytes)
        })
    };
    resp.map_err(|e| ApiError::internal(e.to_string()))
}

fn blob_describe(head: &Head) -> object::Describe {
    object::Describe {
        content_type: "application/octet-stream".to_string(),
        docker_digest: head.digest,
        etag_digest: head.digest,
        immutable: true,
        ..object::Describe::default()
    }
}

async fn blob(
    app: &Arc<AppState>,
    route: &Routed,
    digest: Digest,
    ask: Ask<'_>,
    req: &Parts,
    info: &mut AccessInfo,
) -> Result<Response, ApiError> {
    let opened = match app.mirror().open(route, &Object::Blob(digest), ask).await {
        Ok(o) => o,
        Err(e) => return refused(&e, Subject::Blob),
    };
    info.confirmed = opened.head.name_confirmed;
    object::respond(opened, blob_describe, req, Subject::Blob, info).await
}
