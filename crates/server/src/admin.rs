//! The admin surface: endpoints that change state. They exist only when an admin token is
//! configured (`--admin-token-file`) and then require it (`Authorization: Bearer <token>`).
//! `tender gc --server` and `tender fsck --server` call them.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::auth::{require_admin, AdminToken};
use crate::AppState;

/// What the admin endpoints need besides the token.
pub struct Admin {
    pub token: AdminToken,
    /// `cache.maxSize`: what `POST /api/v1/admin/gc` evicts down to unless the request names a size.
    pub gc_cap: Option<u64>,
    /// `admin.maxImportSize`: the largest bundle `POST /api/v1/admin/import` takes.
    pub import_cap: u64,
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// `DELETE /api/v1/admin/fills/<id>`: cancel a fill (`GET /api/v1/fills` lists the ids). Its
/// clients get a clean 503; its spool stays, so a later request resumes it.
pub async fn cancel_fill(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    if app.mirror().cancel_fill(&id) {
        (StatusCode::ACCEPTED, Json(serde_json::json!({ "cancelled": id }))).into_response()
    } else {
        error(StatusCode::NOT_FOUND, format!("no fill in progress has the id {id:?}"))
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogSyncQuery {
    #[serde(default)]
    retry_failed: bool,
}

/// `POST /api/v1/admin/catalog/sync[?retryFailed=true]`: import pending entries now, in the
/// background (202); `retryFailed` gives failed ones another try.
pub async fn catalog_sync(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<CatalogSyncQuery>,
) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    let Some(catalog) = app.catalog().cloned() else {
        return error(StatusCode::NOT_FOUND, "this tender has no catalog".into());
    };
    match catalog.request_sync(q.retry_failed) {
        Ok(accepted) => (StatusCode::ACCEPTED, Json(accepted)).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcQuery {
    /// Bytes to evict down to (default: `cache.maxSize`; none: orphans only).
    max_size: Option<u64>,
    #[serde(default)]
    dry_run: bool,
}

/// `POST /api/v1/admin/gc[?maxSize=BYTES][&dryRun=true]`: evict least recently used objects
/// down to the cap and remove orphaned spool files, never touching fills in progress or pinned
/// objects. Answers the plan and, unless a dry run, what was freed.
pub async fn gc(State(app): State<Arc<AppState>>, headers: HeaderMap, Query(q): Query<GcQuery>) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    let cap = q.max_size.or(app.security.admin.as_ref().and_then(|a| a.gc_cap));
    let mirror = app.mirror();
    let done = tokio::task::spawn_blocking(move || mirror.gc(cap, q.dry_run)).await;
    match done {
        Ok(Ok((plan, report))) => {
            if let Some(r) = &report {
                tracing::info!(
                    freed_bytes = r.freed_bytes,
                    evicted = r.evicted,
                    orphans = r.orphans_removed,
                    "admin gc"
                );
            }
            Json(serde_json::json!({ "dryRun": q.dry_run, "plan": plan, "report": report })).into_response()
        }
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `POST /api/v1/admin/upstreams/<name>/probe`: ask the upstream (or `image-factory`) now and
/// answer its new health, as `/api/v1/health` shows it.
pub async fn probe(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    match app.mirror().probe(&name).await {
        Some(health) => {
            tracing::info!(upstream = %health.name, state = health.state.as_str(), "admin probe");
            Json(health).into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("{name:?} is not a configured upstream")),
    }
}

#[derive(serde::Deserialize)]
pub struct FsckQuery {
    #[serde(default)]
    repair: bool,
}

/// `POST /api/v1/admin/fsck[?repair=true]`: re-verify every stored object; with `repair`,
/// move the ones that fail to quarantine/ (a reader that has one open keeps its handle).
pub async fn fsck(State(app): State<Arc<AppState>>, headers: HeaderMap, Query(q): Query<FsckQuery>) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    let mirror = app.mirror();
    match tokio::task::spawn_blocking(move || mirror.fsck(q.repair)).await {
        Ok(Ok(report)) => {
            if !report.corrupt.is_empty() {
                app.metrics().fsck_corrupt.inc_by(report.corrupt.len() as u64);
                tracing::warn!(corrupt = report.corrupt.len(), repair = q.repair, "admin fsck found corrupt objects");
            }
            Json(report).into_response()
        }
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
