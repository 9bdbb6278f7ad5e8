//! What a site holds, over HTTP: `GET /api/v1/admin/images` (`tender images --server`),
//! `DELETE /api/v1/admin/bundles/<index-digest>` (`tender bundle rm --server`),
//! `GET /api/v1/imports` (the imported bundles, also on the status page) and
//! `GET /v2/_catalog` (the repositories held, for an authenticated client).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use tender_fetch::service::ImportRecord;
use tender_oci::{Digest, ErrorCode};

use crate::auth::{require_admin, Identity};
use crate::error::ApiError;
use crate::{AppState, Viewer};

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

/// `GET /api/v1/admin/images`: every image and imported OS image the store holds.
pub async fn images(State(app): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    let mirror = app.mirror();
    match tokio::task::spawn_blocking(move || mirror.inventory()).await {
        Ok(Ok(items)) => Json(serde_json::json!({ "images": items })).into_response(),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `GET /api/v1/admin/digests`: every object digest the store holds, one per line (the
/// have-list `export --since-digests` reads).
pub async fn digests(State(app): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    let mirror = app.mirror();
    match tokio::task::spawn_blocking(move || mirror.held_digests()).await {
        Ok(Ok(digests)) => {
            let mut text = String::with_capacity(digests.len() * 72);
            for d in digests {
                text.push_str(&d.to_string());
                text.push('\n');
            }
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
        }
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoveQuery {
    #[serde(default)]
    dry_run: bool,
}

/// `DELETE /api/v1/admin/bundles/<index-digest>[?dryRun=true]`: retire an imported bundle
/// (its pins released, its own tags dropped); the next gc frees what nothing else holds.
/// 404 when no bundle of that index was imported.
pub async fn remove_bundle(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(index): Path<String>,
    Query(q): Query<RemoveQuery>,
) -> Response {
    if let Some(refused) = require_admin(&app, &headers) {
        return refused;
    }
    let index: Digest = match index.parse() {
        Ok(d) => d,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{index}: not a digest: {e}")),
    };
    let mirror = app.mirror();
    let done = tokio::task::spawn_blocking(move || mirror.remove_bundle(&index, q.dry_run)).await;
    match done {
        Ok(Ok(Some(released))) => {
            if !q.dry_run {
                tracing::info!(%index, retired = released.retired.len(), retired_bytes = released.retired_bytes,
                    "bundle removed");
            }
            Json(serde_json::json!({ "index": index, "dryRun": q.dry_run, "released": released })).into_response()
        }
        Ok(Ok(None)) => error(StatusCode::NOT_FOUND, format!("no bundle with index {index} was imported here")),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// An imported bundle as `/api/v1/imports` and the status page show it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportView {
    pub index: Digest,
    pub imported_at: u64,
    pub identity: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta_of: Option<String>,
    pub pinned: bool,
    pub blobs: u64,
    pub bytes: u64,
    /// The names it registered that this viewer may see.
    pub names: Vec<String>,
    /// Names it registered under upstreams this viewer may not see.
    pub hidden: usize,
}

/// The imported bundles, oldest first, with the names `viewer` may see.
pub(crate) fn imports_of(app: &AppState, viewer: Viewer) -> Vec<ImportView> {
    let mirror = app.mirror();
    let records = mirror.imports().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "reading the import records");
        Vec::new()
    });
    records.into_iter().map(|r| view(&r, |up| viewer.sees_upstream(&mirror, up))).collect()
}

fn view(r: &ImportRecord, sees: impl Fn(&str) -> bool) -> ImportView {
    let mut names = Vec::new();
    let mut hidden = 0;
    for e in &r.entries {
        match (&e.upstream, e.kind.as_str()) {
            (Some(up), _) if !sees(up) => hidden += 1,
            (_, "unnamed") => {}
            _ => names.push(e.name.clone()),
        }
    }
    ImportView {
        index: r.index,
        imported_at: r.imported_at,
        identity: r.identity.clone(),
        delta_of: r.delta_of.clone(),
        pinned: r.pinned,
        blobs: r.blobs,
        bytes: r.bytes,
        names,
        hidden,
    }
}

/// `GET /api/v1/imports`: the imported bundles (index digest, when, by whom, names).
pub async fn imports(State(app): State<Arc<AppState>>, identity: Option<axum::Extension<Identity>>) -> Response {
    let viewer = Viewer::of(&app, identity.as_deref());
    let app2 = app.clone();
    match tokio::task::spawn_blocking(move || imports_of(&app2, viewer)).await {
        Ok(list) => Json(serde_json::json!({ "imports": list })).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Largest `n` of a catalog page.
const MAX_CATALOG_PAGE: usize = 1000;

/// `GET /v2/_catalog[?n=N][&last=NAME]`: the repositories the store holds a tag of
/// (`<upstream>/<repository>`, as a client pulls them), sorted, paginated with a `Link` to the
/// next page. Only for an authenticated identity; only the upstreams it may pull from.
pub async fn catalog(app: &Arc<AppState>, identity: Option<&Identity>, query: Option<&str>) -> Response {
    if !identity.is_some_and(Identity::is_authenticated) {
        let mut resp = ApiError::new(
            ErrorCode::Unauthorized,
            "the catalog lists repositories to an authenticated client only (a token, a user or a client certificate)",
        )
        .into_response();
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer realm=\"tender\""));
        return resp;
    }
    let (mut n, mut last) = (MAX_CATALOG_PAGE, None::<String>);
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            // A page size that is not a number is ignored, as the tag list ignores it.
            "n" => {
                if let Ok(v) = v.parse::<usize>() {
                    n = v.min(MAX_CATALOG_PAGE);
                }
            }
            "last" => last = Some(v.into_owned()),
            _ => {}
        }
    }
    let viewer = Viewer::of(app, identity);
    let app2 = app.clone();
    let all = tokio::task::spawn_blocking(move || {
        let mirror = app2.mirror();
        let repos = mirror.repositories().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "listing the repositories held");
            BTreeSet::new()
        });
        repos
            .into_iter()
            .filter(|(up, _)| viewer.sees_upstream(&mirror, up))
            .map(|(up, repo)| format!("{up}/{repo}"))
            .collect::<BTreeSet<String>>()
    })
    .await
    .unwrap_or_default();
    let page: Vec<&String> =
        all.iter().filter(|r| last.as_ref().is_none_or(|l| r.as_str() > l.as_str())).take(n).collect();
    let more = page.last().is_some_and(|l| all.iter().any(|r| r > *l)) && page.len() == n;
    let body = serde_json::json!({ "repositories": page });
    let mut resp = Json(body).into_response();
    if let (true, Some(l)) = (more, page.last()) {
        let q = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("n", &n.to_string())
            .append_pair("last", l)
            .finish();
        if let Ok(v) = header::HeaderValue::from_str(&format!("</v2/_catalog?{q}>; rel=\"next\"")) {
            resp.headers_mut().insert(header::LINK, v);
        }
    }
    resp
}
