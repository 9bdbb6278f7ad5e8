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
    sizes: status::SizeCache,
}

impl AppState {
    pub fn new(mirror: Arc<Mirror>, metrics: Arc<ServerMetrics>) -> Arc<AppState> {
        Arc::new(AppState { mirror: RwLock::new(mirror), metrics, sizes: status::SizeCache::default() })
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

    /// The catalog section of the status page, when a catalog is attached.
    fn catalog_html(&self) -> Option<String> {
        None
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
