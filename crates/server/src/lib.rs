//! tender's HTTP layer: requests parsed into typed endpoints, served from the store or
//! through the fetch layer, errors mapped to status codes and OCI error bodies. This is the
//! only crate that knows HTTP status codes.

pub mod access;
pub mod error;
mod image;
pub mod metrics;
pub mod object;
pub mod range;
mod registry;
pub mod served;
mod status;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tender_fetch::Mirror;
use tokio::net::TcpListener;

pub use metrics::ServerMetrics;

/// What every request handler sees. The mirror is swapped whole on a config reload; fills in
/// progress belong to the shared fill registry and are not disturbed.
pub struct AppState {
    mirror: RwLock<Arc<Mirror>>,
    metrics: Arc<ServerMetrics>,
    catalog: Option<Arc<dyn tender_catalog::CatalogApi>>,
    sizes: status::SizeCache,
}

impl AppState {
    pub fn new(mirror: Arc<Mirror>, metrics: Arc<ServerMetrics>) -> Arc<AppState> {
        Arc::new(AppState { mirror: RwLock::new(mirror), catalog: None, metrics, sizes: status::SizeCache::default() })
    }

    /// With the golden catalog behind `/api/v1/catalog` and `/api/v1/admin/catalog/sync`.
    pub fn with_catalog(
        mirror: Arc<Mirror>,
        metrics: Arc<ServerMetrics>,
        catalog: Arc<dyn tender_catalog::CatalogApi>,
    ) -> Arc<AppState> {
        let mut app = AppState::new(mirror, metrics);
        if let Some(a) = Arc::get_mut(&mut app) {
            a.catalog = Some(catalog);
        }
        app
    }

    pub fn catalog(&self) -> Option<&Arc<dyn tender_catalog::CatalogApi>> {
        self.catalog.as_ref()
    }

    pub fn mirror(&self) -> Arc<Mirror> {
        match self.mirror.read() {
            Ok(m) => m.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replace the mirror (new upstream settings) without dropping connections.
    pub fn replace_mirror(&self, mirror: Arc<Mirror>) {
        match self.mirror.write() {
            Ok(mut m) => *m = mirror,
            Err(poisoned) => *poisoned.into_inner() = mirror,
        }
    }

    pub fn metrics(&self) -> &Arc<ServerMetrics> {
        &self.metrics
    }

    /// The catalog section of the status page, when a catalog is attached (reads records:
    /// call it off the async threads).
    fn catalog_html(&self) -> Option<String> {
        let catalog = self.catalog.as_ref()?;
        Some(match catalog.view() {
            Ok(view) => status::catalog_section(&view),
            Err(e) => format!("<h2>Catalog</h2><p>catalog unavailable: {}</p>", status::esc(&e)),
        })
    }
}

/// The whole HTTP surface.
pub fn router(app: Arc<AppState>) -> Router {
    let metrics = app.metrics.clone();
    Router::new()
        .route("/v2", get(registry::handle).head(registry::handle))
        .route("/v2/", get(registry::handle).head(registry::handle))
        .route("/v2/{*rest}", axum::routing::any(registry::handle))
        .route("/image/{*rest}", axum::routing::any(image::handle))
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/catalog", get(catalog_view))
        .route("/api/v1/admin/catalog/sync", axum::routing::post(catalog_sync))
        .route("/", get(status::page))
        .route("/api/v1/served", get(served_handler))
        .fallback(not_found)
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(metrics, access::layer))
}

#[derive(serde::Deserialize)]
struct ServedQuery {
    repository: Option<String>,
}

/// `GET /api/v1/served?repository=ghcr.io/siderolabs/kubelet`: whether and how often workers
/// pulled it; without `repository`, every repository.
async fn served_handler(
    State(app): State<Arc<AppState>>,
    axum::extract::Query(q): axum::extract::Query<ServedQuery>,
) -> axum::response::Response {
    let served = &app.metrics.served;
    match q.repository {
        Some(r) => axum::Json(served.get(&r)).into_response(),
        None => axum::Json(served.snapshot()).into_response(),
    }
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct CatalogSyncQuery {
    #[serde(default)]
    retry_failed: bool,
}

fn catalog_error(status: StatusCode, message: String) -> axum::response::Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

/// `GET /api/v1/catalog`: every golden (phase, progress, size, sha256, clones), as JSON.
async fn catalog_view(State(app): State<Arc<AppState>>) -> axum::response::Response {
    let Some(catalog) = app.catalog.clone() else {
        return catalog_error(StatusCode::NOT_FOUND, "this tender has no catalog".into());
    };
    match tokio::task::spawn_blocking(move || catalog.view()).await {
        Ok(Ok(view)) => axum::Json(view).into_response(),
        Ok(Err(e)) => catalog_error(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => catalog_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `POST /api/v1/admin/catalog/sync[?retryFailed=true]`: import pending entries now, in the
/// background (202); `retryFailed` gives failed ones another try.
async fn catalog_sync(
    State(app): State<Arc<AppState>>,
    axum::extract::Query(q): axum::extract::Query<CatalogSyncQuery>,
) -> axum::response::Response {
    let Some(catalog) = app.catalog.clone() else {
        return catalog_error(StatusCode::NOT_FOUND, "this tender has no catalog".into());
    };
    match catalog.request_sync(q.retry_failed) {
        Ok(accepted) => (StatusCode::ACCEPTED, axum::Json(accepted)).into_response(),
        Err(e) => catalog_error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// Anything else: a real 404 with an OCI error body, never a page that looks like success.
async fn not_found(uri: axum::http::Uri) -> error::ApiError {
    error::ApiError::new(tender_oci::ErrorCode::NameUnknown, format!("no such endpoint: {}", uri.path()))
}

async fn metrics_handler(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], app.metrics.render())
}

/// Ready while the data directory is usable; an upstream being down does not make tender
/// unready, since everything stored keeps serving.
async fn readyz(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    let root = app.mirror().flights().store().root().to_path_buf();
    if root.join("objects").is_dir() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "data directory unavailable\n")
    }
}

/// Serve on `listener` until `shutdown` resolves, then finish in-flight requests.
pub async fn serve(
    listener: TcpListener,
    app: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = router(app);
    axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(shutdown)
        .await
}
