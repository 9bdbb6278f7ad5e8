//! tender's HTTP layer: requests parsed into typed endpoints, served from the store or
//! through the fetch layer, errors mapped to status codes and OCI error bodies. This is the
//! only crate that knows HTTP status codes.

pub mod access;
mod access_info;
pub mod admin;
pub mod auth;
mod conns;
pub mod error;
mod image;
pub mod import;
mod inventory;
pub mod limits;
pub mod listen;
pub mod metrics;
mod moment;
pub mod object;
pub mod range;
mod registry;
pub mod savings;
pub mod served;
mod stall;
mod status;
pub mod tls;
pub mod zerocopy;

use std::future::Future;
use std::sync::{Arc, RwLock};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tender_fetch::service::{BucketStatus, BucketView};
use tender_fetch::Mirror;
use tokio::net::TcpListener;

pub use metrics::ServerMetrics;

/// Who may do what, and the limits: fixed when the server starts.
#[derive(Default)]
pub struct Security {
    /// Client authentication for pulls (off: everyone who reaches tender may pull); replaced
    /// on a config reload.
    pub auth: RwLock<Option<Arc<auth::ClientAuth>>>,
    /// The admin endpoints (absent: they do not exist).
    pub admin: Option<admin::Admin>,
    pub limits: limits::Limits,
}

impl Security {
    pub fn auth(&self) -> Option<Arc<auth::ClientAuth>> {
        self.auth.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// New users and tokens (SIGHUP); requests in flight keep what they were checked against.
    pub fn set_auth(&self, auth: Option<Arc<auth::ClientAuth>>) {
        *self.auth.write().unwrap_or_else(|p| p.into_inner()) = auth;
    }
}

/// Which endpoints a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// Everything on one listener.
    All,
    /// The pull endpoints (`/v2/`, `/image/`) and the health probes.
    Pull,
    /// `/metrics`, the status page, `/api/v1/` and the health probes (`--admin-listen`).
    Admin,
}

/// What every request handler sees. The mirror is swapped whole on a config reload; fills in
/// progress belong to the shared fill registry and are not disturbed.
pub struct AppState {
    mirror: RwLock<Arc<Mirror>>,
    metrics: Arc<ServerMetrics>,
    catalog: Option<Arc<dyn tender_catalog::CatalogApi>>,
    sizes: status::SizeCache,
    pub(crate) security: Security,
    pub(crate) client_counts: Arc<limits::ClientCounts>,
}

impl AppState {
    pub fn new(mirror: Arc<Mirror>, metrics: Arc<ServerMetrics>) -> Arc<AppState> {
        AppState::full(mirror, metrics, None, Security::default())
    }

    /// With the golden catalog behind `/api/v1/catalog` and `/api/v1/admin/catalog/sync`.
    pub fn with_catalog(
        mirror: Arc<Mirror>,
        metrics: Arc<ServerMetrics>,
        catalog: Arc<dyn tender_catalog::CatalogApi>,
    ) -> Arc<AppState> {
        AppState::full(mirror, metrics, Some(catalog), Security::default())
    }

    /// Everything: catalog (optional), authentication, admin endpoints and limits.
    pub fn full(
        mirror: Arc<Mirror>,
        metrics: Arc<ServerMetrics>,
        catalog: Option<Arc<dyn tender_catalog::CatalogApi>>,
        security: Security,
    ) -> Arc<AppState> {
        Arc::new(AppState {
            mirror: RwLock::new(mirror),
            catalog,
            metrics,
            sizes: status::SizeCache::default(),
            security,
            client_counts: Arc::default(),
        })
    }

    pub fn security(&self) -> &Security {
        &self.security
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

    /// Bring the savings (bytes fetched against bytes served, per upstream and over 24 hours)
    /// up to date from this run's counters. The status page and the saver call it.
    pub fn tick_savings(&self) {
        let mirror = self.mirror();
        let mut names = mirror.upstream_names();
        if let Some(f) = mirror.image_factory() {
            names.push(f.name().to_string());
        }
        let fetch = self.metrics.fetch();
        let counters: std::collections::BTreeMap<String, u64> = names
            .into_iter()
            .map(|n| {
                let got = fetch.upstream_bytes.get_or_create(&vec![("upstream".to_string(), n.clone())]).get();
                (n, got)
            })
            .collect();
        self.metrics.served.tick_savings(tender_fetch::service::now_secs(), &counters);
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

/// The whole HTTP surface on one listener.
pub fn router(app: Arc<AppState>) -> Router {
    router_for(app, Surface::All)
}

/// What a request may see of tender's statistics and configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Viewer {
    /// Everything: client authentication is off (everyone may pull everything), the client
    /// authenticated, or the request came on the admin listener.
    All,
    /// An anonymous client while client authentication is configured: only upstreams it may
    /// pull from, and no upstream URLs.
    Anonymous,
}

impl Viewer {
    pub(crate) fn of(app: &AppState, identity: Option<&auth::Identity>) -> Viewer {
        match identity {
            Some(auth::Identity::Anonymous) if app.security.auth().is_some() => Viewer::Anonymous,
            _ => Viewer::All,
        }
    }

    /// Whether this viewer may see the upstream named `name` (and its repositories).
    pub(crate) fn sees_upstream(self, mirror: &Mirror, name: &str) -> bool {
        match self {
            Viewer::All => true,
            Viewer::Anonymous => {
                mirror.upstream(name).is_some_and(|u| !u.settings().needs_identity())
                    || mirror.image_factory().is_some_and(|f| f.name().eq_ignore_ascii_case(name))
            }
        }
    }

    /// Whether this viewer may see the served counts of `repository` (`<upstream>/<name>`).
    pub(crate) fn sees_repository(self, mirror: &Mirror, repository: &str) -> bool {
        self == Viewer::All || repository.split_once('/').is_some_and(|(up, _)| self.sees_upstream(mirror, up))
    }
}

/// The endpoints of one listener. Client authentication (when configured) covers every
/// endpoint of a listener that serves pulls, the health probes excepted; the admin-only
/// listener relies on where it is bound, and its admin endpoints on the admin token.
pub fn router_for(app: Arc<AppState>, surface: Surface) -> Router {
    // The upstream names are on every listener: an edge tender (`--parent`) learns them there.
    let mut r = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/api/v1/upstreams", get(upstreams_handler));
    if surface != Surface::Admin {
        r = r
            .route("/v2", get(registry::handle).head(registry::handle))
            .route("/v2/", get(registry::handle).head(registry::handle))
            .route("/v2/{*rest}", axum::routing::any(registry::handle))
            .route("/image/{*rest}", axum::routing::any(image::handle));
    }
    if surface != Surface::Pull {
        r = r
            .route("/metrics", get(metrics_handler))
            .route("/api/v1/catalog", get(catalog_view))
            .route("/", get(status::page))
            .route("/api/v1/served", get(served_handler))
            .route("/api/v1/fills", get(fills_handler))
            .route("/api/v1/imports", get(inventory::imports))
            .route("/api/v1/health", get(health_handler));
        if app.security.admin.is_some() {
            r = r
                .route("/api/v1/admin/upstreams/{name}/probe", axum::routing::post(admin::probe))
                .route("/api/v1/admin/catalog/sync", axum::routing::post(admin::catalog_sync))
                .route("/api/v1/admin/gc", axum::routing::post(admin::gc))
                .route("/api/v1/admin/fsck", axum::routing::post(admin::fsck))
                .route("/api/v1/admin/fills/{id}", axum::routing::delete(admin::cancel_fill))
                .route("/api/v1/admin/import", axum::routing::post(import::import).get(import::preflight))
                .route("/api/v1/admin/tags", axum::routing::delete(import::remove_tag))
                .route("/api/v1/admin/images", get(inventory::images))
                .route("/api/v1/admin/digests", get(inventory::digests))
                .route("/api/v1/admin/bundles/{index}", axum::routing::delete(inventory::remove_bundle));
        }
    }
    let front = access::Front { app: app.clone(), auth: surface != Surface::Admin };
    r.fallback(not_found).with_state(app).layer(axum::middleware::from_fn_with_state(front, access::front))
}

/// `GET /api/v1/upstreams`: the upstream names this tender routes (`ns` values and path
/// prefixes), its default upstream and whether it caches an Image Factory. No URLs, no
/// credentials.
async fn upstreams_handler(State(app): State<Arc<AppState>>) -> axum::response::Response {
    let mirror = app.mirror();
    axum::Json(serde_json::json!({
        "upstreams": mirror.upstream_names(),
        "defaultUpstream": mirror.default_upstream(),
        "imageFactory": mirror.image_factory().is_some(),
    }))
    .into_response()
}

/// `GET /api/v1/fills`: every fill in progress (bytes, total, rate, ETA, retries, clients) and
/// those that ended in the last hour with their outcome. An anonymous viewer sees only the
/// upstreams it may pull from.
async fn fills_handler(
    State(app): State<Arc<AppState>>,
    identity: Option<axum::Extension<auth::Identity>>,
) -> axum::response::Response {
    axum::Json(fills_of(&app, Viewer::of(&app, identity.as_deref()))).into_response()
}

/// The fills this viewer may see: those of upstreams it may pull from, and Image Factory assets
/// (public: anyone may pull them).
pub(crate) fn fills_of(app: &AppState, viewer: Viewer) -> tender_fetch::fills::FillsView {
    let mirror = app.mirror();
    let mut view = mirror.fills();
    let sees = |up: &str| viewer.sees_upstream(&mirror, up) || mirror.image_factory().is_some_and(|f| f.name() == up);
    view.active.retain(|f| sees(&f.upstream));
    view.ended.retain(|f| sees(&f.upstream));
    view.verifications.retain(|v| sees(&v.upstream));
    view
}

/// Every upstream's health this viewer may see (the Image Factory last): state, last success,
/// last error with its cause, stale answers served.
pub(crate) fn health_of(app: &AppState, viewer: Viewer) -> Vec<tender_fetch::health::Health> {
    let mirror = app.mirror();
    let mut out: Vec<_> = mirror
        .upstream_names()
        .into_iter()
        .filter(|n| viewer.sees_upstream(&mirror, n))
        .filter_map(|n| mirror.upstream(&n).map(|u| u.health_report()))
        .collect();
    if let Some(f) = mirror.image_factory() {
        out.push(f.health_report());
    }
    out
}

/// `GET /api/v1/health`: per upstream, state, last success and last error with its cause
/// (`dns`, `connect`, `tls`, `timeout`, `http` with its status, `body`), times in Unix
/// seconds; and the stale answers served. Same visibility as `/api/v1/served`.
async fn health_handler(
    State(app): State<Arc<AppState>>,
    identity: Option<axum::Extension<auth::Identity>>,
) -> axum::response::Response {
    let upstreams = health_of(&app, Viewer::of(&app, identity.as_deref()));
    let stale: u64 = upstreams.iter().map(|h| h.stale_served).sum();
    let data = app.mirror().data_directory();
    // The shared bucket's state only (`up`, `degraded (slow)`, `down (cause) for Ns`): its
    // error text is on the status page for those who see everything.
    let bucket = app.mirror().bucket().map(|b| serde_json::json!({ "state": bucket_state(&b) }));
    axum::Json(
        serde_json::json!({ "upstreams": upstreams, "staleServed": stale, "dataDirectory": data, "bucket": bucket }),
    )
    .into_response()
}

#[derive(serde::Deserialize)]
struct ServedQuery {
    repository: Option<String>,
}

/// `GET /api/v1/served?repository=ghcr.io/siderolabs/kubelet`: whether and how often workers
/// pulled it; without `repository`, every repository.
async fn served_handler(
    State(app): State<Arc<AppState>>,
    identity: Option<axum::Extension<auth::Identity>>,
    axum::extract::Query(q): axum::extract::Query<ServedQuery>,
) -> axum::response::Response {
    let served = &app.metrics.served;
    let viewer = Viewer::of(&app, identity.as_deref());
    let mirror = app.mirror();
    match q.repository {
        Some(r) if viewer.sees_repository(&mirror, &r) => axum::Json(served.get(&r)).into_response(),
        // As if never served: an anonymous client learns nothing of a private repository.
        Some(r) => axum::Json(served::Served::default().get(&r)).into_response(),
        None => {
            let mut all = served.snapshot();
            all.retain(|repo, _| viewer.sees_repository(&mirror, repo));
            axum::Json(all).into_response()
        }
    }
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

/// Anything else: a real 404 with an OCI error body, never a page that looks like success.
async fn not_found(uri: axum::http::Uri) -> error::ApiError {
    error::ApiError::new(tender_oci::ErrorCode::NameUnknown, format!("no such endpoint: {}", uri.path()))
}

/// `/metrics`: with client authentication configured, for authenticated identities only
/// (metric labels name private upstreams), unless on the admin listener.
async fn metrics_handler(
    State(app): State<Arc<AppState>>,
    identity: Option<axum::Extension<auth::Identity>>,
) -> axum::response::Response {
    if Viewer::of(&app, identity.as_deref()) == Viewer::Anonymous {
        app.metrics.auth_refusal("no_credentials");
        return auth::challenge("/metrics needs credentials (or the admin listener)");
    }
    let a = app.clone();
    let _ = tokio::task::spawn_blocking(move || {
        let mirror = a.mirror();
        let size = a.sizes.get(&mirror);
        a.metrics.storage.update(size, &mirror);
    })
    .await;
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], app.metrics.render())
        .into_response()
}

/// Ready while the data directory is usable; an upstream or the shared bucket being down does
/// not make tender unready, since everything stored keeps serving (and the upstreams fill what
/// the bucket would have). The body names the bucket's state.
async fn readyz(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    let mirror = app.mirror();
    let bucket = mirror.bucket().map(|b| format!("bucket {}: {}\n", b.name, bucket_state(&b))).unwrap_or_default();
    if mirror.data_ready() {
        (StatusCode::OK, format!("ready\n{bucket}"))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("data directory unavailable\n{bucket}"))
    }
}

/// `up`, `degraded (slow)`, or `down (cause) for 42s`: no error text, since `/readyz` answers without
/// authentication (the status page shows the error to those who may see it).
pub(crate) fn bucket_state(b: &BucketView) -> String {
    match &b.status {
        BucketStatus::Up { slow: true, .. } => "degraded (slow)".to_string(),
        BucketStatus::Up { leases, leases_configured, .. } if *leases || !*leases_configured => "up".to_string(),
        BucketStatus::Up { .. } => "up (no conditional writes: fill leases off)".to_string(),
        BucketStatus::Down { cause, since, .. } => {
            let secs = since.elapsed().map(|d| d.as_secs()).unwrap_or(0);
            format!("down ({cause}) for {secs}s")
        }
    }
}

/// Serve on `listener` until `shutdown` resolves, then finish in-flight requests: plain HTTP,
/// every endpoint, the limits of the app's [`Security`].
pub async fn serve(
    listener: TcpListener,
    app: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let opts = listen::ListenOptions { tls: None, limits: app.security.limits.clone() };
    let metrics = app.metrics.clone();
    listen::run(listener, router(app), opts, metrics, shutdown).await
}
