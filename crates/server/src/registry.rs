//! The OCI distribution pull API: `/v2/...` parsed into a typed route, then served.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tender_fetch::flight::{Claim, Expect};
use tender_fetch::mirror::{CacheResult, Listing, ListingKind, ObjectKind};
use tender_fetch::Upstream;
use tender_oci::media::AcceptList;
use tender_oci::{Digest, ErrorCode, Reference, RepoName, Route, RouteError, RouteKind};

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
    n: Option<String>,
    rest: Vec<(String, String)>,
}

fn parse_query(q: Option<&str>) -> Query {
    let mut out = Query { ns: None, n: None, rest: Vec::new() };
    for (k, v) in url::form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "ns" => out.ns = Some(v.into_owned()),
            _ => {
                if k == "n" {
                    out.n = Some(v.to_string());
                }
                out.rest.push((k.into_owned(), v.into_owned()));
            }
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
    let mut info = AccessInfo { route: "other", ..AccessInfo::default() };
    let result = dispatch(&app, &parts, &mut info).await;
    let uri = &parts.uri;
    // The spec's SHOULD for `?ns=` requests: name the namespace that answered.
    let namespace = match (&info.upstream, parse_query(uri.query()).ns) {
        (Some(up), Some(_)) => HeaderValue::from_str(up).ok(),
        _ => None,
    };
    if let (true, Ok(_), Some(d)) = (info.pin, &result, info.digest) {
        if let Err(e) = app.mirror().flights().store().pin(&d, "prefetch") {
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
    let mirror = app.mirror();
    let Some(bucket) = mirror.flights().shared() else { return };
    if info.cache.is_none_or(|c| c == CacheResult::Pass.as_str()) {
        return;
    }
    if let Some(d) = info.digest {
        bucket.note_served(&d);
    }
}

async fn dispatch(app: &Arc<AppState>, req: &Parts, info: &mut AccessInfo) -> Result<Response, ApiError> {
    let (method, path, query, headers) = (&req.method, req.uri.path(), req.uri.query(), &req.headers);
    let authenticated = req.extensions.get::<Identity>().is_some_and(Identity::is_authenticated);
    let route = Route::parse(path).map_err(|e| match e {
        RouteError::Unsupported => ApiError::new(ErrorCode::Unsupported, e.to_string()),
        RouteError::NotFound(_) => ApiError::new(ErrorCode::NameUnknown, e.to_string()),
        RouteError::Name(_) => ApiError::new(ErrorCode::NameInvalid, e.to_string()),
        RouteError::Reference(_) => ApiError::new(ErrorCode::TagInvalid, e.to_string()),
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
    let (up, repo) =
        mirror.route(q.ns.as_deref(), &name).map_err(|e| ApiError::new(ErrorCode::NameUnknown, e.to_string()))?;
    info.upstream = Some(up.name().to_string());
    info.repository = Some(format!("{}/{}", up.name(), repo));
    // What tender pulls with an upstream's credentials goes only to authenticated clients,
    // unless the operator marked the upstream public.
    if up.settings().needs_identity() && !authenticated {
        return Ok(crate::auth::challenge(&format!("{} is served to authenticated clients only", up.name())));
    }
    let flag = |h: &str| headers.get(h).is_some_and(|v| v.as_bytes() == b"1");
    info.pin = flag("x-tender-prefetch") && flag("x-tender-pin");
    let head = method == Method::HEAD;
    match route.kind {
        RouteKind::Base => Err(ApiError::new(ErrorCode::NameUnknown, "no such endpoint")),
        RouteKind::Manifest(reference) => {
            info.route = "manifest";
            info.confirmed = matches!(reference, tender_oci::Reference::Tag(_));
            manifest(app, &up, &repo, &reference, headers, head, info).await
        }
        RouteKind::Blob(digest) => {
            info.route = "blob";
            info.digest = Some(digest);
            blob(app, &up, &repo, &digest, req, info).await
        }
        RouteKind::TagsList => {
            info.route = "tags";
            if let Some(n) = &q.n {
                if n.parse::<u32>().is_err() {
                    return Err(ApiError::new(ErrorCode::PaginationNumberInvalid, format!("n={n:?} is not a number")));
                }
            }
            let listing = mirror
                .listing(&up, &repo, &ListingKind::Tags, &q.rest, &name, q.ns.as_deref())
                .await
                .map_err(|e| ApiError::from_fetch(&e, Subject::Repository))?;
            info.cache = Some(listing.cache.as_str());
            Ok(listing_response(listing, head))
        }
        RouteKind::Referrers(digest) => {
            info.route = "referrers";
            // An upstream without the referrers API answers 404, and so does tender: that 404 is
            // what makes clients use the tag-schema fallback (`sha256-<hex>` tags).
            let listing = mirror
                .listing(&up, &repo, &ListingKind::Referrers(digest), &q.rest, &name, q.ns.as_deref())
                .await
                .map_err(|e| ApiError::from_fetch(&e, Subject::Manifest))?;
            info.cache = Some(listing.cache.as_str());
            Ok(listing_response(listing, head))
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

async fn manifest(
    app: &Arc<AppState>,
    up: &Arc<Upstream>,
    repo: &RepoName,
    reference: &Reference,
    headers: &HeaderMap,
    head: bool,
    info: &mut AccessInfo,
) -> Result<Response, ApiError> {
    let accept = AcceptList::parse(headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()));
    let hit = app
        .mirror()
        .manifest(up, repo, reference, &accept)
        .await
        .map_err(|e| ApiError::from_fetch(&e, Subject::Manifest))?;
    info.cache = Some(hit.cache.as_str());
    info.digest = Some(hit.digest);
    let mut builder = Response::builder()
        .header(header::CONTENT_TYPE, &hit.media_type)
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header("docker-content-digest", hit.digest.to_string())
        .header(header::ETAG, etag(&hit.digest));
    if up.settings().needs_identity() {
        // Only an authenticated client gets here: it learns that what it pulled is private, so
        // `tender export --server` can record it in the bundle (issue 32).
        builder = builder.header(PRIVATE_HEADER, "1");
    }
    if let Some(age) = hit.stale_age {
        builder = builder.header(STALE_HEADER, age);
    }
    let resp = if if_none_match(headers, &hit.digest) {
        builder.status(StatusCode::NOT_MODIFIED).body(Body::empty())
    } else {
        builder.status(StatusCode::OK).header(header::CONTENT_LENGTH, hit.bytes.len()).body(if head {
            Body::empty()
        } else {
            Body::from(hit.bytes)
        })
    };
    resp.map_err(|e| ApiError::new(ErrorCode::Unknown, e.to_string()))
}

/// What `up` answers for a blob it does not hold: 404 `BLOB_UNKNOWN`.
fn unknown_blob(up: &Upstream, repo: &RepoName, digest: &Digest) -> ApiError {
    ApiError::new(ErrorCode::BlobUnknown, format!("{repo}@{digest} is unknown to {}", up.name()))
}

fn blob_describe(digest: &Digest) -> object::Describe {
    object::Describe {
        content_type: "application/octet-stream".to_string(),
        docker_digest: Some(*digest),
        etag_digest: Some(*digest),
        immutable: true,
        ..object::Describe::default()
    }
}

async fn blob(
    app: &Arc<AppState>,
    up: &Arc<Upstream>,
    repo: &RepoName,
    digest: &Digest,
    req: &Parts,
    info: &mut AccessInfo,
) -> Result<Response, ApiError> {
    let (headers, head) = (&req.headers, req.method == Method::HEAD);
    let mirror = app.mirror();
    let store = mirror.flights().store().clone();
    let local = |e: tender_store::StoreError| ApiError::new(ErrorCode::Unknown, e.to_string());
    let describe = blob_describe(digest);
    // Stored here or in the bucket (perhaps for another upstream): nothing of it, not even a
    // 304, goes to a client of `up` unless the blob is known to exist in `up`.
    let here = store.open_stored(digest).map_err(local)?;
    // Not known in `up` yet: the check below asks the upstream, in this repository.
    info.confirmed = !store.is_known_in(digest, up.name()).unwrap_or(true);
    let shared = if here.is_some() { None } else { mirror.flights().shared_lookup(&Expect::Digest(*digest)).await };
    if (here.is_some() || shared.is_some())
        && !mirror
            .known_in(up, repo, digest, ObjectKind::Blob)
            .await
            .map_err(|e| ApiError::from_fetch(&e, Subject::Blob))?
    {
        info.cache = Some(CacheResult::Pass.as_str());
        return Err(unknown_blob(up, repo, digest));
    }
    if let Some(object) = here {
        info.cache = Some(CacheResult::Hit.as_str());
        return object::stored(object, *digest, &describe, headers, head);
    }
    if let Some(found) = &shared {
        let (m, up2, repo2, d) = (mirror.clone(), up.clone(), repo.clone(), *digest);
        let fallback = object::Fallback { store: store.clone(), claim: Box::new(move || m.blob(&up2, &repo2, &d)) };
        if let Some(resp) = object::shared(mirror.flights(), found, &describe, headers, head, fallback) {
            info.cache = Some(CacheResult::Shared.as_str());
            return resp;
        }
    }
    if head {
        info.cache = Some(CacheResult::Pass.as_str());
        let size = mirror.blob_size(up, repo, digest).await.map_err(|e| ApiError::from_fetch(&e, Subject::Blob))?;
        return object::head(&describe, size);
    }
    match mirror.blob(up, repo, digest).map_err(|e| ApiError::from_fetch(&e, Subject::Blob))? {
        Claim::Stored(_) => {
            // Committed since the look above, by this upstream's fill or another's.
            if !mirror
                .known_in(up, repo, digest, ObjectKind::Blob)
                .await
                .map_err(|e| ApiError::from_fetch(&e, Subject::Blob))?
            {
                return Err(unknown_blob(up, repo, digest));
            }
            info.cache = Some(CacheResult::Hit.as_str());
            let object = store
                .open_stored(digest)
                .map_err(local)?
                .ok_or_else(|| ApiError::new(ErrorCode::BlobUnknown, "blob vanished"))?;
            object::stored(object, *digest, &describe, headers, head)
        }
        Claim::Filling(fill) => {
            if headers.get("x-tender-prefetch").is_some_and(|v| v.as_bytes() == b"1") {
                fill.keep();
            }
            // A fill whose content already verified (its commit is under way) holds every byte:
            // for this request it is as good as stored.
            // The request that started the fill is its miss, however fast a small fill verified.
            let hit = !fill.take_start() && fill.is_verified();
            info.cache = Some(if hit { CacheResult::Hit } else { CacheResult::Miss }.as_str());
            object::filling(fill, &describe, headers, req.version, Subject::Blob, up.settings().range_before_verify)
                .await
        }
    }
}
