//! Bundles into a running tender: `POST /api/v1/admin/import` (a tar streamed in the body,
//! verified with the same rules as `tender import --data`; `GET` on the same path asks first
//! whether a bundle of that size would be taken) and `DELETE /api/v1/admin/tags`
//! (`tender tag rm --server`).

use std::io;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::TryStreamExt as _;
pub use tender_bundle::Routes;
use tender_bundle::{ImportError, ImportOptions};
use tender_fetch::Mirror;

use crate::auth::require_admin;
use crate::AppState;

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportQuery {
    /// `--registry`: the registry (and repository, for a bare tag) of names without one.
    registry: Option<String>,
    /// `pin=false`: leave what was imported evictable.
    pin: Option<bool>,
    /// `--expect-index`: refuse a bundle whose index.json has another digest.
    expect_index: Option<String>,
    /// `--allow-public`: register images that were private where they were exported under
    /// upstreams that are not private here.
    allow_public: Option<bool>,
    /// The bundle's file name on the client (kept in the import record).
    source: Option<String>,
}

/// `POST /api/v1/admin/import[?registry=NAME][&pin=false][&expectIndex=DIGEST][&allowPublic=true]`: the body is a bundle as a tar
/// (`tender import --server` streams a directory as one). 200 with what was registered; 422
/// when the bundle is refused (nothing of it became visible); 413 over `admin.maxImportSize`.
pub async fn import(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<ImportQuery>,
    body: Body,
) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    let cap = app.security.admin.as_ref().map_or(0, |a| a.import_cap);
    let announced = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > cap) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the bundle is larger than admin.maxImportSize ({cap} bytes)"),
        );
    }
    let expect_index = match q.expect_index.as_deref().map(str::parse::<tender_oci::Digest>).transpose() {
        Ok(d) => d,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("expectIndex: {e}")),
    };
    let mirror = app.mirror().clone();
    let options = ImportOptions {
        registry: q.registry,
        max_bytes: Some(cap),
        pin: q.pin.unwrap_or(true),
        expect_index,
        allow_public: q.allow_public.unwrap_or(false),
        identity: "admin token".to_string(),
        // Printable, bounded: it is shown on the status page.
        source: q.source.map(|s| s.chars().filter(|c| !c.is_control()).take(256).collect()),
    };
    let reader = tokio_util::io::StreamReader::new(body.into_data_stream().map_err(io::Error::other));
    let handle = tokio::runtime::Handle::current();
    let result = tokio::task::spawn_blocking(move || {
        let mut sync = tokio_util::io::SyncIoBridge::new_with_handle(reader, handle);
        tender_bundle::import_into(&mut sync, &mirror, &options)
    })
    .await;
    match result {
        Ok(Ok(report)) => {
            tracing::info!(index = %report.index_digest, images = report.images.len(), assets = report.assets.len(),
                new_blobs = report.new_blobs, "bundle imported");
            (StatusCode::OK, Json(report)).into_response()
        }
        Ok(Err(e @ ImportError::Refused(_))) => {
            tracing::warn!(error = %e, "bundle refused");
            error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
        }
        Ok(Err(e @ ImportError::TooLarge(_))) => error(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        Ok(Err(ImportError::Io(e))) => error(StatusCode::BAD_REQUEST, format!("reading the bundle: {e}")),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("the import failed unexpectedly: {e}")),
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreflightQuery {
    /// The bundle's size in bytes, or at least that many (a directory, packed on the way).
    size: Option<u64>,
    /// `--expect-index`, checked for its form.
    expect_index: Option<String>,
}

/// `GET /api/v1/admin/import[?size=N][&expectIndex=DIGEST]`: whether a `POST` of a bundle of
/// (at least) `size` bytes would be taken, answered before a byte of it is sent. `tender import
/// --server` asks first, since its HTTP client cannot wait for `100 Continue`: 401 without the
/// admin token, 413 over `admin.maxImportSize`, 400 for a malformed digest, else 200 with the cap.
pub async fn preflight(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<PreflightQuery>,
) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    let cap = app.security.admin.as_ref().map_or(0, |a| a.import_cap);
    if let Some(size) = q.size.filter(|n| *n > cap) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the bundle ({size} bytes) is larger than admin.maxImportSize ({cap} bytes)"),
        );
    }
    if let Some(Err(e)) = q.expect_index.as_deref().map(str::parse::<tender_oci::Digest>) {
        return error(StatusCode::BAD_REQUEST, format!("expectIndex: {e}"));
    }
    (StatusCode::OK, Json(serde_json::json!({ "maxImportSize": cap }))).into_response()
}

#[derive(serde::Deserialize)]
pub struct TagQuery {
    /// `ghcr.io/siderolabs/kubelet:v1.35.0`
    name: String,
}

/// `DELETE /api/v1/admin/tags?name=IMAGE:TAG`: forget what a tag points to (an imported tag
/// stops being authoritative; the next pull asks the upstream). 404 when there was no record.
pub async fn remove_tag(State(app): State<Arc<AppState>>, headers: HeaderMap, Query(q): Query<TagQuery>) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    match remove(&app.mirror(), &q.name) {
        Ok(Some(released)) => {
            (StatusCode::OK, Json(serde_json::json!({ "removed": q.name, "released": released }))).into_response()
        }
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no tag record for {}", q.name)),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

/// Remove the tag record `name` routes to, and the pins imported bundles hold under it.
/// `Ok(None)`: there was none.
pub fn remove(mirror: &Mirror, name: &str) -> Result<Option<tender_fetch::service::Released>, String> {
    mirror.remove_tag(name).map_err(|e| e.message)
}
