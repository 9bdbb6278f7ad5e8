//! `tender serve`: load the config, open the data directory, wire the mirror, serve until
//! SIGTERM / SIGINT, reload on SIGHUP.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tender_catalog::{Catalog, CatalogMetrics, ImportSettings};
use tender_client::datadir;
use tender_client::local::build_mirror;
use tender_config::{self as config, Overrides, Settings};
use tender_fetch::{FetchMetrics, Flights, Mirror, UpstreamSettings};
use tender_server::listen::{self, ListenOptions};
use tender_server::tls::TlsReloader;
use tender_server::{router_for, AppState, Security, ServerMetrics, Surface};
use tender_store::{OpenMode, Store};
use tokio::net::TcpListener;

use crate::exit::Failure;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// YAML config file (default: the embedded default config)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:5000]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Data directory [default: ./tender-data]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Add an upstream registry or replace its URL (repeatable), e.g. ghcr.io=http://127.0.0.1:5001
    #[arg(long = "upstream", value_name = "NAME=URL")]
    pub upstreams: Vec<String>,
    /// Upstream for names that carry neither ns nor a configured prefix
    #[arg(long, value_name = "NAME")]
    pub default_upstream: Option<String>,
    /// Image Factory upstream URL [default: https://factory.talos.dev]
    #[arg(long, value_name = "URL")]
    pub image_factory: Option<String>,
    /// Log format: text or json
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// Serve TLS with this certificate chain (PEM); reloaded when the file changes
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA bundle (PEM): mutual TLS
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Require HTTP Basic credentials from this htpasswd file (bcrypt entries, htpasswd -B)
    #[arg(long, value_name = "FILE")]
    pub auth_htpasswd: Option<PathBuf>,
    /// Accept these static bearer tokens (one per line)
    #[arg(long, value_name = "FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Enable the admin endpoints (POST /api/v1/admin/...), which then require this token
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Serve /metrics, the status page and /api/v1/ on this address instead of --listen
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Send every upstream request to this tender instead (repeatable: tried in order);
    /// its upstream names are learned from GET /api/v1/upstreams
    #[arg(long = "parent", value_name = "URL")]
    pub parents: Vec<String>,
    /// Extra CA bundle (PEM) to trust for the parents' certificates
    #[arg(long, value_name = "FILE")]
    pub parent_ca: Option<PathBuf>,
    /// Client certificate (PEM) for parents that require mutual TLS
    #[arg(long, value_name = "FILE", requires = "parent_client_key")]
    pub parent_client_cert: Option<PathBuf>,
    /// Private key (PEM) of --parent-client-cert
    #[arg(long, value_name = "FILE", requires = "parent_client_cert")]
    pub parent_client_key: Option<PathBuf>,
    /// User name for parents that require HTTP Basic authentication
    #[arg(long, value_name = "USER", requires = "parent_password_file")]
    pub parent_username: Option<String>,
    /// File holding the password of --parent-username
    #[arg(long, value_name = "FILE", requires = "parent_username")]
    pub parent_password_file: Option<PathBuf>,
    /// When no parent answers, go to the upstream itself for the names this config also lists
    /// (parent.fallbackToUpstream; default: only through the parents)
    #[arg(long, requires = "parents")]
    pub parent_fallback_to_upstream: bool,
    /// Contact no upstream and no Image Factory: serve what the data directory holds (cached
    /// or imported), answer a miss with 404 at once (as `offline: true` on every upstream)
    #[arg(long)]
    pub offline: bool,
}

impl ServeArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            data: self.data.clone(),
            upstreams: self.upstreams.clone(),
            default_upstream: self.default_upstream.clone(),
            log_format: self.log_format.clone(),
            image_factory: self.image_factory.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            tls_client_ca: self.tls_client_ca.clone(),
            auth_htpasswd: self.auth_htpasswd.clone(),
            auth_token_file: self.auth_token_file.clone(),
            admin_token_file: self.admin_token_file.clone(),
            admin_listen: self.admin_listen.clone(),
            parents: self.parents.clone(),
            parent_ca: self.parent_ca.clone(),
            parent_client_cert: self.parent_client_cert.clone(),
            parent_client_key: self.parent_client_key.clone(),
            parent_username: self.parent_username.clone(),
            parent_password_file: self.parent_password_file.clone(),
            parent_fallback_to_upstream: self.parent_fallback_to_upstream,
            offline: self.offline,
        }
    }

    /// Read and validate the configuration (again, on SIGHUP).
    pub fn load(&self) -> Result<Settings, config::ConfigError> {
        let (name, raw) = config::read(self.config.as_deref())?;
        config::resolve(&name, raw, &self.overrides())
    }
}

/// Where an edge keeps the upstream names its parent gave it, to start while the parent is down.
pub const PARENT_FILE: &str = "parent-upstreams.json";

/// What `GET /api/v1/upstreams` answers.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ParentView {
    upstreams: Vec<String>,
    default_upstream: Option<String>,
}

/// Ask the parents (in order) for their upstream names; fall back to the list saved the last
/// time one answered. The edge then routes exactly those names, each through the parents.
async fn learn_parent(settings: &mut Settings) -> anyhow::Result<()> {
    let Some(p) = settings.parent.clone() else {
        return Ok(());
    };
    let saved = settings.data.join(PARENT_FILE);
    let b = reqwest::Client::builder().use_rustls_tls().no_proxy().timeout(Duration::from_secs(10));
    let identity = p.client_identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    let client = tender_client::http::with_tls_files(b, p.ca_file.as_deref(), identity, "parent-")?
        .build()
        .context("HTTP client for the parents")?;
    let mut view = None;
    for url in &p.urls {
        let u = format!("{}/api/v1/upstreams", url.as_str().trim_end_matches('/'));
        let mut req = client.get(&u);
        if let Some(c) = &p.credentials {
            req = req.basic_auth(&c.username, Some(&c.password));
        }
        match req.send().await.and_then(reqwest::Response::error_for_status) {
            Ok(r) => match r.json::<ParentView>().await {
                Ok(v) => {
                    view = Some(v);
                    break;
                }
                Err(e) => tracing::warn!(parent = %url, error = %e, "the parent's upstream list is not readable"),
            },
            Err(e) => tracing::warn!(parent = %url, error = %e, "parent did not answer"),
        }
    }
    let view = match view {
        Some(v) => {
            if let Ok(text) = serde_json::to_vec_pretty(&v) {
                if tender_store::write_atomic(&saved, &text).is_err() {
                    tracing::warn!(path = %saved.display(), "could not save the parent's upstream list");
                }
            }
            v
        }
        None => {
            let text = std::fs::read(&saved).map_err(|_| {
                Failure::transient(format!(
                    "no parent answered GET /api/v1/upstreams ({}) and no list was saved before in {}",
                    p.urls.iter().map(url::Url::as_str).collect::<Vec<_>>().join(", "),
                    saved.display()
                ))
            })?;
            tracing::warn!(path = %saved.display(), "no parent answered: using the upstream list saved last time");
            serde_json::from_slice(&text).map_err(|e| Failure::problem(format!("{}: {e}", saved.display())))?
        }
    };
    if !settings.upstreams.is_empty() && !p.fallback_to_upstream {
        tracing::info!("--parent: the configured upstreams are replaced by the parent's");
    }
    let own = std::mem::take(&mut settings.upstreams);
    let fallback_for = |name: &str| -> Option<Box<UpstreamSettings>> {
        if !p.fallback_to_upstream || settings.offline {
            return None;
        }
        let found = own.iter().find(|u| u.name.eq_ignore_ascii_case(name) && !u.offline);
        if found.is_none() {
            tracing::warn!(upstream = %name, "parent.fallbackToUpstream: this config does not list {name}, so it goes only through the parents");
        }
        found.map(|u| Box::new(UpstreamSettings { fallback: None, ..u.clone() }))
    };
    settings.upstreams = view
        .upstreams
        .iter()
        .map(|n| (n, fallback_for(n)))
        .map(|(n, fallback)| UpstreamSettings {
            name: n.clone(),
            endpoints: p.urls.clone(),
            ca_file: p.ca_file.clone(),
            insecure_skip_verify: false,
            proxy: None,
            credentials: p.credentials.clone(),
            // The operator gave the edge the parent's credentials for its clients.
            public: true,
            private: false,
            range_before_verify: false,
            redirect_hosts: None,
            token_realm_hosts: Vec::new(),
            // A name that may go to the upstream itself is spelled as that upstream wants it
            // (`library/` on Docker Hub); the parent takes either spelling.
            library_prefix: fallback.as_ref().is_some_and(|f| f.library_prefix),
            max_object_size: None,
            stale_max_age: None,
            ns_param: Some(n.clone()),
            client_identity: p.client_identity.clone(),
            offline: false,
            fallback,
        })
        .collect();
    settings.default_upstream = view.default_upstream;
    tracing::info!(parents = ?p.urls.iter().map(url::Url::as_str).collect::<Vec<_>>(), upstreams = ?view.upstreams, "routing through the parent tenders");
    Ok(())
}

/// How often a replica writes what it served to the bucket's served records (and at shutdown).
const SERVED_FLUSH: Duration = Duration::from_secs(60);
/// The most the last flush of the served records may delay the exit.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(5);

/// The bucket of `storage.s3`, checked: one that cannot keep the lease promise (no conditional
/// writes) refuses the start; one that cannot be reached now is probed in the background and
/// used once a probe gets through (the probe checks conditional writes again; without them
/// the replica runs as with `lease: false`). Fills go upstream meanwhile.
pub(crate) async fn open_bucket(
    settings: &Settings,
    metrics: tender_bucket::BucketMetrics,
) -> anyhow::Result<Option<Arc<tender_bucket::Bucket>>> {
    let Some(s) = &settings.storage else { return Ok(None) };
    let bucket = tender_bucket::Bucket::new(s.clone(), metrics).map_err(|e| Failure::usage(e.to_string()))?;
    match bucket.check().await {
        Ok(()) => tracing::info!(bucket = %s.bucket, endpoint = ?s.endpoint, prefix = %s.prefix, replica = %s.replica,
            lease = s.lease, chunk_size = s.chunk_size, "shared bucket ready"),
        Err(e @ tender_bucket::BucketError::Setup { .. }) => return Err(Failure::usage(e.to_string()).into()),
        Err(e) => tracing::error!(error = %e, probe_every = ?s.probe_interval,
            "shared bucket unreachable at start; serving without it and probing it in the background"),
    }
    bucket.spawn_prober();
    bucket.spawn_sweeper();
    bucket.spawn_flusher(SERVED_FLUSH);
    Ok(Some(bucket))
}

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let settings = args.load().map_err(|e| Failure::usage(e.to_string()))?;
    crate::logging::serve(settings.log_format);
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let runtime =
        runtime_builder(cpus).enable_all().thread_name("tender").build().context("starting the async runtime")?;
    tracing::debug!(cpus, "async runtime started");
    runtime.block_on(serve(args, settings))
}

/// The async runtime for `cpus` usable CPUs (affinity and cgroup quota counted). On one CPU it
/// is tokio's current-thread scheduler: its run queue is one unbounded FIFO, so every ready
/// connection is served in turn. The multi-thread scheduler with one worker holds at most 256
/// ready tasks in its local queue and moves the rest to a global queue it looks at far less
/// often: at 512 busy keep-alive connections a fifth of them waited five times longer than the
/// others (p99 72 ms against a p50 of 11 ms, against 27 and 19 ms on the current-thread one;
/// BENCHMARKS.md, issue 23). Blocking work still goes to the blocking pool in both.
fn runtime_builder(cpus: usize) -> tokio::runtime::Builder {
    if cpus <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
}

/// What the start line says of offline upstreams: ` offline` when nothing is ever contacted
/// (`offline: true`, `--offline`), the names when only some are.
fn offline_mode(all: bool, upstreams: &[&str]) -> String {
    match (all, upstreams) {
        (true, _) => " offline (no upstream, the Image Factory included, is contacted)".to_string(),
        (false, []) => String::new(),
        (false, names) => format!(" (offline upstreams: {})", names.join(", ")),
    }
}

async fn serve(args: ServeArgs, mut settings: Settings) -> anyhow::Result<ExitCode> {
    datadir::check(&settings.data).map_err(Failure::problem)?;
    datadir::own_files(&settings.data)?;
    let store = Store::open(&settings.data, OpenMode::Exclusive)
        .map_err(|e| Failure::problem(e.to_string()))?
        .with_memory(settings.memory);
    datadir::close_logged(&settings.data, &settings.catalog);
    learn_parent(&mut settings).await?;
    // Enforced at fill time (evict first, else pass the object through), not only on the tick.
    let min_free = settings.cache_min_free.unwrap_or_else(|| default_min_free(store.capacity_bytes().unwrap_or(0)));
    store.set_room_policy(tender_store::RoomPolicy { max_size: settings.cache_max_size, min_free });
    tracing::info!(max_size = settings.cache_max_size, min_free, "cache limits");
    if !settings.policy.is_empty() {
        let rules: Vec<String> = settings.policy.rules.iter().map(|r| r.name()).collect();
        let root = settings.policy.trusted_root.as_ref().map(|r| r.digest.clone());
        tracing::info!(?rules, trusted_root = ?root, "signature policy: manifests its verifying rules cover are served only once verified");
    }
    let store = Arc::new(store);
    let fetch_metrics = FetchMetrics::default();
    let catalog_metrics = CatalogMetrics::default();
    let bucket_metrics = tender_bucket::BucketMetrics::default();
    let server_metrics = Arc::new(ServerMetrics::with_hook(&fetch_metrics, |r| {
        catalog_metrics.register(r);
        // Always, so dashboards and alerts find the names (zero without storage.s3).
        bucket_metrics.register(r);
    }));
    let bucket = open_bucket(&settings, bucket_metrics).await?;
    let flights = Flights::with_bucket(store.clone(), settings.fetch.clone(), fetch_metrics.clone(), bucket);
    let mirror = build_mirror(&settings, flights.clone(), &fetch_metrics)?;
    let catalog = start_catalog(&settings, mirror.clone(), catalog_metrics)?;
    let security = Security {
        auth: std::sync::RwLock::new(client_auth(&settings)),
        admin: settings.admin.token.as_deref().map(|t| tender_server::admin::Admin {
            token: tender_server::auth::AdminToken::new(t),
            gc_cap: settings.cache_max_size,
            import_cap: settings.admin.max_import_size,
        }),
        limits: settings.limits.clone(),
    };
    let catalog_api: Arc<dyn tender_catalog::CatalogApi> = catalog.clone();
    let app = AppState::full(mirror, server_metrics.clone(), Some(catalog_api), security);
    raise_fd_limit();

    let tls = match &settings.tls {
        Some(t) => {
            let r = TlsReloader::load(t.files.clone()).map_err(|e| Failure::usage(e.to_string()))?;
            r.spawn_watch(t.reload_interval);
            Some(r)
        }
        None => None,
    };
    let bind = |addr: std::net::SocketAddr, flag: &'static str| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|e| Failure::problem(format!("cannot listen on {addr}: {e}; choose another {flag}")))
    };
    let listener = bind(settings.listen, "--listen").await?;
    let local = listener.local_addr().context("reading the listening address")?;
    let admin_listener = match settings.admin.listen {
        Some(a) => Some(bind(a, "--admin-listen").await?),
        None => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let offline: Vec<&str> = settings.upstreams.iter().filter(|u| u.offline).map(|u| u.name.as_str()).collect();
    tracing::info!(
        listen = %local,
        offline = settings.offline,
        offline_upstreams = ?offline,
        data = %settings.data.display(),
        upstreams = ?settings.upstreams.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(),
        default_upstream = settings.default_upstream.as_deref().unwrap_or(""),
        tls = tls.is_some(),
        mutual_tls = tls.as_ref().is_some_and(|t| t.mutual()),
        client_auth = settings.auth.is_some(),
        admin_endpoints = settings.admin.token.is_some(),
        "tender serving on {scheme}://{local}{}",
        offline_mode(settings.offline, &offline)
    );
    warn_exposure(&settings, local, admin_listener.as_ref().and_then(|l| l.local_addr().ok()));

    // `start_catalog` started the first catalog sync.
    spawn_reload(args, settings.clone(), app.clone(), flights.clone(), fetch_metrics.clone(), catalog.clone());
    spawn_gc(&settings, flights.clone());
    spawn_scrub(&settings, flights.clone(), server_metrics.clone());
    let served_path = settings.data.join(datadir::SERVED_FILE);
    spawn_served_saver(app.clone(), served_path.clone());

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let opts = ListenOptions { tls, limits: settings.limits.clone() };
    let main_surface = if admin_listener.is_some() { Surface::Pull } else { Surface::All };
    let main =
        listen::run(listener, router_for(app.clone(), main_surface), opts.clone(), app.metrics().clone(), stopped());
    match admin_listener {
        Some(l) => {
            tracing::info!(listen = %l.local_addr().context("reading the admin address")?, "admin surface (metrics, status, /api/v1/) on its own listener");
            let admin_opts = ListenOptions { tls: None, limits: settings.limits.clone() };
            let admin =
                listen::run(l, router_for(app.clone(), Surface::Admin), admin_opts, app.metrics().clone(), stopped());
            let (a, b) = tokio::join!(main, admin);
            a.and(b).context("serving")?;
        }
        None => main.await.context("serving")?,
    }
    app.tick_savings();
    if let Some(bucket) = app.mirror().flights().shared() {
        // What this replica served since the last flush, for `tender gc --bucket`; a bucket
        // that is down refuses at once, a hung one delays the exit by at most SHUTDOWN_FLUSH.
        match tokio::time::timeout(SHUTDOWN_FLUSH, bucket.flush_served()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not flush the served records to the shared bucket"),
            Err(_) => {
                tracing::warn!(after = ?SHUTDOWN_FLUSH, "flushing the served records to the shared bucket took too long; left out")
            }
        }
    }
    if let Err(e) = app.metrics().served.save(&served_path) {
        tracing::warn!(error = %e, "could not save the served statistics");
    }
    tracing::info!("tender stopped");
    Ok(ExitCode::SUCCESS)
}

/// The catalog of a starting server: refuses (exit 2) an entry that edits an existing golden.
fn start_catalog(settings: &Settings, mirror: Arc<Mirror>, metrics: CatalogMetrics) -> anyhow::Result<Arc<Catalog>> {
    let catalog = Catalog::open(
        &settings.data,
        settings.catalog.clone(),
        mirror,
        ImportSettings::from_fetch(&settings.fetch),
        metrics,
    )
    .map_err(|e| Failure::usage(e.to_string()))?;
    catalog.spawn_sync(false);
    Ok(catalog)
}

/// After a successful reload: take the new entries and import what is pending; an edit of an
/// existing golden keeps the running catalog configuration.
fn reload_catalog(catalog: &Catalog, settings: &Settings, mirror: Arc<Mirror>) {
    match catalog.reconfigure(settings.catalog.clone(), mirror, ImportSettings::from_fetch(&settings.fetch)) {
        Ok(()) => {
            // A new golden directory inside the data directory needs its way opened.
            datadir::close_logged(&settings.data, &settings.catalog);
            catalog.spawn_sync(false);
        }
        Err(e) => tracing::error!(error = %e, "catalog: reload refused; keeping the running catalog configuration"),
    }
}

/// Client authentication from the resolved settings.
fn client_auth(settings: &Settings) -> Option<Arc<tender_server::auth::ClientAuth>> {
    settings
        .auth
        .as_ref()
        .map(|a| Arc::new(tender_server::auth::ClientAuth::new(a.users.clone(), &a.tokens, a.anonymous_pull)))
}

/// Say so when a non-loopback listener is open without TLS or without client authentication,
/// and when the configuration looks like a mistake (nothing to mirror, a cache of size 0).
fn warn_exposure(settings: &Settings, main: std::net::SocketAddr, admin: Option<std::net::SocketAddr>) {
    for w in start_warnings(settings, main) {
        tracing::warn!(listen = %main, "{w}");
    }
    if !main.ip().is_loopback() && settings.auth.is_none() && settings.tls.is_some() {
        tracing::info!(listen = %main, "no client authentication: everyone who reaches this address may pull");
    }
    if let Some(a) = admin {
        if !a.ip().is_loopback() {
            tracing::warn!(listen = %a, "the admin listener (metrics, status page, /api/v1/) is on a non-loopback \
                address without TLS or client authentication; bind it to an internal address");
        }
    }
}

/// What `serve` warns about at start (issue 20 item 6).
pub(crate) fn start_warnings(settings: &Settings, main: std::net::SocketAddr) -> Vec<String> {
    let mut out = Vec::new();
    if settings.upstreams.is_empty() {
        out.push(
            "no upstreams configured: every registry pull will fail (only OS images from the Image Factory are served); \
             add upstreams or --upstream NAME=URL"
                .to_string(),
        );
    }
    if settings.cache_max_size == Some(0) {
        out.push(
            "cache.maxSize is 0: every gc evicts everything that is not pinned or being filled; \
             remove the key for no limit, or give a size like 500Gi"
                .to_string(),
        );
    }
    if !main.ip().is_loopback() && settings.tls.is_none() {
        let auth = if settings.auth.is_none() {
            " and without client authentication: everyone who reaches this address may pull"
        } else {
            ""
        };
        out.push(format!(
            "serving plain HTTP on a non-loopback address{auth}; pulls and credentials travel unencrypted; \
             use --tls-cert/--tls-key (and --auth-htpasswd/--auth-token-file) unless this is a trusted in-cluster network"
        ));
    }
    out
}

/// Many idle keep-alive connections need many descriptors: raise the soft limit to the hard one.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        let want = rustix::process::Rlimit { current: lim.maximum, maximum: lim.maximum };
        if let Err(e) = setrlimit(Resource::Nofile, want) {
            tracing::warn!(error = %e, "could not raise the open-file limit");
        }
    }
}

/// Load the served statistics (and the savings kept with them), then save them every 10
/// seconds, the savings brought up to date first.
fn spawn_served_saver(app: Arc<AppState>, path: PathBuf) {
    if let Err(e) = app.metrics().served.load(&path) {
        tracing::warn!(error = %e, path = %path.display(), "could not read the served statistics; starting from zero");
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        tick.tick().await;
        loop {
            tick.tick().await;
            let (app, path) = (app.clone(), path.clone());
            app.tick_savings();
            let saved = tokio::task::spawn_blocking(move || app.metrics().served.save(&path)).await;
            if let Ok(Err(e)) = saved {
                tracing::warn!(error = %e, "could not save the served statistics");
            }
        }
    });
}

/// SIGHUP: re-read the config and swap the upstreams; connections and fills go on.
fn spawn_reload(
    args: ServeArgs,
    initial: Settings,
    app: Arc<AppState>,
    flights: Arc<Flights>,
    metrics: FetchMetrics,
    catalog: Arc<Catalog>,
) {
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
            tracing::warn!("cannot install the SIGHUP handler; config reload is off");
            return;
        };
        while hup.recv().await.is_some() {
            let loaded = match args.load() {
                Ok(mut new) => match learn_parent(&mut new).await {
                    Ok(()) => Ok(new),
                    Err(e) => Err(e.to_string()),
                },
                Err(e) => Err(e.to_string()),
            };
            match loaded {
                Ok(new) => {
                    if new.listen != initial.listen || new.data != initial.data {
                        tracing::warn!("listen and data changes need a restart; keeping the old ones");
                    }
                    match build_mirror(&new, flights.clone(), &metrics) {
                        Ok(m) => {
                            app.replace_mirror(m.clone());
                            let auth = client_auth(&new);
                            // Who logged in lately stays known across the reload.
                            if let (Some(new_auth), Some(old)) = (&auth, app.security().auth()) {
                                new_auth.inherit(&old);
                            }
                            app.security().set_auth(auth);
                            reload_catalog(&catalog, &new, m);
                            tracing::info!(
                                upstreams = ?new.upstreams.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(),
                                "configuration reloaded"
                            );
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "reload failed; keeping the running configuration")
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "reload failed; keeping the running configuration")
                }
            }
        }
    });
}

/// Re-hash every stored object every `cache.scrubInterval` at `cache.scrubRate` (the first
/// pass a minute after the start), and each large object soon after its first read since the
/// start; a mismatch is quarantined and fetched again on the next request (issue 32). One
/// thread of its own: it sleeps to keep to its rate.
fn spawn_scrub(settings: &Settings, flights: Arc<Flights>, metrics: Arc<ServerMetrics>) {
    if settings.scrub_interval.is_zero() {
        return;
    }
    let (every, rate) = (settings.scrub_interval, settings.scrub_rate);
    let (tx, rx) = std::sync::mpsc::sync_channel::<tender_oci::Digest>(4096);
    flights.store().watch_first_reads(tx);
    let spawned = std::thread::Builder::new().name("tender-scrub".into()).spawn(move || {
        let store = flights.store().clone();
        let mut pace = tender_store::Pace::new(rate);
        // `false`: a fill of it is still running (its commit just happened, or a refetch): try
        // again shortly rather than never (a first read is announced once).
        let check = |d: &tender_oci::Digest, pace: &mut tender_store::Pace| -> bool {
            if flights.active_keys().binary_search(&d.to_string()).is_ok() {
                return false;
            }
            match store.scrub_object(d, pace) {
                Ok(tender_store::Scrubbed::Sound { bytes }) => {
                    metrics.scrub_objects.inc();
                    metrics.scrub_bytes.inc_by(bytes);
                }
                Ok(tender_store::Scrubbed::Corrupt { bytes }) => {
                    metrics.scrub_objects.inc();
                    metrics.scrub_bytes.inc_by(bytes);
                    metrics.scrub_corrupt.inc();
                }
                Ok(tender_store::Scrubbed::Gone) => {}
                Err(e) => tracing::warn!(digest = %d, error = %e, "scrub: could not check an object"),
            }
            true
        };
        // First reads of objects whose fill had not ended yet (bounded: the scheduled pass
        // checks whatever falls off).
        let mut deferred: Vec<tender_oci::Digest> = Vec::new();
        let defer = |d: tender_oci::Digest, deferred: &mut Vec<tender_oci::Digest>| {
            if deferred.len() < 4096 && !deferred.contains(&d) {
                deferred.push(d);
            }
        };
        let mut next_pass = std::time::Instant::now() + every.min(Duration::from_secs(60));
        loop {
            let wait = next_pass.saturating_duration_since(std::time::Instant::now());
            let wait = if deferred.is_empty() { wait } else { wait.min(Duration::from_millis(100)) };
            match rx.recv_timeout(wait.min(Duration::from_secs(1))) {
                Ok(d) => {
                    if !check(&d, &mut pace) {
                        defer(d, &mut deferred);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            }
            deferred.retain(|d| !check(d, &mut pace));
            if std::time::Instant::now() < next_pass {
                continue;
            }
            let objects = match store.list_objects() {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(error = %e, "scrub: could not list the objects");
                    Vec::new()
                }
            };
            let started = std::time::Instant::now();
            for o in &objects {
                // First reads go first, between the scheduled ones.
                while let Ok(d) = rx.try_recv() {
                    if !check(&d, &mut pace) {
                        defer(d, &mut deferred);
                    }
                }
                check(&o.digest, &mut pace);
            }
            tracing::info!(objects = objects.len(), seconds = started.elapsed().as_secs(), "scrub pass done");
            next_pass = std::time::Instant::now() + every;
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "scrub: no thread; stored objects are checked by fsck only");
    }
}

/// `cache.minFree` when not set: 5% of the data directory's file system, at most 1 GiB.
pub(crate) fn default_min_free(capacity: u64) -> u64 {
    (capacity / 20).min(1 << 30)
}

/// Evict down to `cache.maxSize` every `cache.gcInterval`, never touching fills in progress.
fn spawn_gc(settings: &Settings, flights: Arc<Flights>) {
    let Some(cap) = settings.cache_max_size else {
        return;
    };
    let every = settings.gc_interval.max(Duration::from_secs(1));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let flights = flights.clone();
            let result = tokio::task::spawn_blocking(move || {
                let active = flights.active_keys();
                let store = flights.store();
                let plan = store.gc_plan(Some(cap), Duration::from_secs(24 * 3600), &|d| {
                    active.contains(&d.to_string()) || store.is_pinned(d)
                })?;
                store.gc_apply(&plan)
            })
            .await;
            match result {
                Ok(Ok(r)) if r.evicted > 0 || r.orphans_removed > 0 => {
                    tracing::info!(freed_bytes = r.freed_bytes, evicted = r.evicted, orphans = r.orphans_removed, "gc")
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "gc failed"),
                Err(e) => tracing::warn!(error = %e, "gc task failed"),
            }
        }
    });
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
    tracing::info!("shutting down: finishing requests in flight");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    /// Issue 35 (6): the start line says `offline` when it is.
    #[test]
    fn should_say_offline_on_the_start_line() {
        assert_eq!(offline_mode(false, &[]), "");
        assert!(offline_mode(true, &["ghcr.io"]).starts_with(" offline ("));
        assert_eq!(offline_mode(false, &["ghcr.io", "quay.io"]), " (offline upstreams: ghcr.io, quay.io)");
    }

    /// The runtime `serve` picks for one CPU answers 512 busy connections in turn: the client
    /// (its own thread and runtime) keeps one request in flight on each, and the slowest
    /// answers take about as long as the typical one (p99 1.7x p50 here). Seen failing with the
    /// multi-thread scheduler and one worker: p99 32x p50.
    #[test]
    fn should_answer_every_busy_connection_in_its_turn_on_one_cpu() {
        use std::time::Instant;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const CONNS: usize = 512;
        // Two sockets per connection: lift a soft limit on open files of 1,024 (common) first.
        let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        if nofile.current.is_some_and(|n| n < 4096) {
            let raised = rustix::process::Rlimit {
                current: Some(nofile.maximum.map_or(4096, |m| m.min(4096))),
                maximum: nofile.maximum,
            };
            rustix::process::setrlimit(rustix::process::Resource::Nofile, raised).unwrap();
        }
        let server = runtime_builder(1).enable_all().build().unwrap();
        let listener = server.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        // One echo task per connection: a cheap poll, as a hit from memory is.
        server.spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 64];
                    while let Ok(n @ 1..) = s.read(&mut b).await {
                        let sum = b[..n].iter().fold(0u8, |a, x| a.wrapping_add(*x));
                        if s.write_all(&[sum]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = std::thread::spawn(move || server.block_on(stopped));
        let client = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let latencies = client.block_on(async move {
            let mut conns = Vec::new();
            for _ in 0..CONNS {
                let conn = tokio::net::TcpStream::connect(addr).await;
                conns.push(conn.unwrap_or_else(|e| panic!("connecting (this test needs over 1,024 open files): {e}")));
            }
            let start = Instant::now();
            let (from, until) = (start + Duration::from_millis(300), start + Duration::from_millis(1300));
            let tasks: Vec<_> = conns
                .into_iter()
                .map(|mut c| {
                    tokio::spawn(async move {
                        let mut seen = Vec::new();
                        let mut b = [0u8; 1];
                        loop {
                            let t0 = Instant::now();
                            if t0 >= until {
                                return seen;
                            }
                            c.write_all(&[7u8; 32]).await.unwrap();
                            c.read_exact(&mut b).await.unwrap();
                            if t0 >= from {
                                seen.push(t0.elapsed());
                            }
                        }
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.unwrap());
            }
            all
        });
        let _ = stop.send(());
        serving.join().unwrap().unwrap();
        let mut all = latencies;
        all.sort_unstable();
        assert!(all.len() >= CONNS * 4, "{} exchanges", all.len());
        let at = |q: f64| all[((all.len() - 1) as f64 * q) as usize];
        let (p50, p99) = (at(0.5), at(0.99));
        assert!(p99 <= p50 * 4, "p99 {p99:?}, p50 {p50:?}: some connections waited far longer than others");
    }

    #[test]
    fn should_pick_the_current_thread_runtime_for_one_cpu_only() {
        let flavor = |cpus| runtime_builder(cpus).enable_all().build().unwrap().handle().runtime_flavor();
        assert_eq!(flavor(1), tokio::runtime::RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(2), tokio::runtime::RuntimeFlavor::MultiThread);
    }

    #[test]
    fn should_warn_at_start_about_zero_upstreams_a_zero_cache_and_open_plain_http() {
        let settings = |yaml: &str| {
            config::resolve("t", config::parse("t", yaml).unwrap(), &config::Overrides::default()).unwrap()
        };
        let loopback: std::net::SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let open: std::net::SocketAddr = "0.0.0.0:5000".parse().unwrap();
        let one = "upstreams:\n  - name: a.io\n    url: https://a.io\n";
        assert!(start_warnings(&settings(one), loopback).is_empty());
        let w = start_warnings(&settings("upstreams: []\n"), loopback);
        assert!(w.len() == 1 && w[0].contains("no upstreams"), "{w:?}");
        let w = start_warnings(&settings(&format!("{one}cache:\n  maxSize: 0\n")), loopback);
        assert!(w.len() == 1 && w[0].contains("cache.maxSize is 0"), "{w:?}");
        let w = start_warnings(&settings(one), open);
        assert!(w.len() == 1 && w[0].contains("plain HTTP") && w[0].contains("without client authentication"), "{w:?}");
    }
}
