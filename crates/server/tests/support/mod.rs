//! In-process test bed: a fake upstream registry that misbehaves on purpose, and a tender
//! (router + mirror + store) in front of it, both on 127.0.0.1.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, reason = "test support")]

pub mod h2;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use sha2::{Digest as _, Sha256, Sha512};
use tender_fetch::{FetchMetrics, FetchSettings, Flights, Mirror, Upstream, UpstreamSettings};

use tender_server::{AppState, Security, ServerMetrics, Surface};
use tender_store::{OpenMode, Store};

/// How the fake upstream misbehaves on blob GETs.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    None,
    /// Close the connection after this many body bytes.
    TruncateAt(u64),
    /// Abort with a connection reset after this many body bytes.
    ResetAt(u64),
    /// Stop sending (but keep the connection) after this many bytes.
    StallAt(u64),
    /// Flip one byte at this offset.
    WrongByteAt(u64),
    /// Announce a longer Content-Length than the body.
    LongerContentLength,
    /// Answer 429 with Retry-After: 1.
    TooManyRequests,
    /// Answer 500.
    ServerError,
    /// Send at most this many bytes per second.
    SlowDrip(u64),
}

#[derive(Default)]
pub struct FakeState {
    pub blobs: Mutex<HashMap<String, Bytes>>,
    /// (repo, reference) -> (media type, body)
    pub manifests: Mutex<HashMap<(String, String), (String, Bytes)>>,
    /// Faults applied to the next blob GETs, one per request, in order.
    pub faults: Mutex<Vec<Fault>>,
    /// Fault applied to every blob GET once the list above is used up.
    pub steady: Mutex<Option<Fault>>,
    pub ignore_range: Mutex<bool>,
    pub blob_gets: AtomicU64,
    pub blob_heads: AtomicU64,
    pub manifest_gets: AtomicU64,
    pub manifest_heads: AtomicU64,
    pub requests: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub ranges: Mutex<Vec<String>>,
    pub accepts: Mutex<Vec<String>>,
    pub paths: Mutex<Vec<String>>,
    /// When set, every request is answered 503 (upstream down).
    pub down: Mutex<bool>,
    /// Require this bearer token (and serve a token endpoint).
    pub require_token: Mutex<Option<String>>,
    pub token_requests: AtomicU64,
    pub base_url: Mutex<String>,
    /// Answer blob GETs with a 307 to this base URL + the request path.
    pub redirect_blobs_to: Mutex<Option<String>>,
    /// Answer every blob HEAD 200 with this `Docker-Content-Digest`, held or not (a liar).
    pub head_claims: Mutex<Option<String>>,
    /// Tags of every repository (default `a`, `b`), and how their list is paginated.
    pub tags: Mutex<Vec<String>>,
    pub paging: Mutex<Paging>,
    /// Name manifests by their sha512 in `Docker-Content-Digest` (an upstream whose canonical
    /// algorithm is sha512), instead of their sha256.
    pub announce_sha512: Mutex<bool>,
    /// Announce this `Docker-Content-Digest` for every manifest, whatever its bytes (a liar).
    pub announce: Mutex<Option<String>>,
    /// Wait this long before answering a manifest GET (a slow upstream, so replicas overlap).
    pub manifest_delay: Mutex<Option<std::time::Duration>>,
    /// Referrers of every subject; `None`: no referrers API (404).
    pub referrers: Mutex<Option<Vec<serde_json::Value>>>,
}

/// How the fake upstream paginates tag lists and referrers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Paging {
    /// Everything in one page.
    #[default]
    None,
    /// Like distribution: `n` per page, a relative `Link` with `n` and `last`.
    Distribution(usize),
    /// Like Quay: `n` per page, an absolute `Link` with an opaque `next_page` token; `last` ignored.
    Quay(usize),
}

pub struct FakeUpstream {
    pub addr: SocketAddr,
    pub state: Arc<FakeState>,
}

pub fn random_bytes(n: usize, seed: u64) -> Bytes {
    let mut out = Vec::with_capacity(n);
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    Bytes::from(out)
}

pub fn sha(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

pub fn sha512(b: &[u8]) -> String {
    format!("sha512:{}", hex::encode(Sha512::digest(b)))
}

impl FakeUpstream {
    pub async fn start() -> FakeUpstream {
        let state = Arc::new(FakeState::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        *state.base_url.lock().unwrap() = format!("http://{addr}");
        let app = axum::Router::new().fallback(fake_handler).with_state(state.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeUpstream { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn add_blob(&self, body: Bytes) -> String {
        let d = sha(&body);
        self.state.blobs.lock().unwrap().insert(d.clone(), body);
        d
    }

    /// A blob addressed by its sha512 (the upstream's `Docker-Content-Digest` on HEAD is that).
    pub fn add_blob_sha512(&self, body: Bytes) -> String {
        let d = sha512(&body);
        self.state.blobs.lock().unwrap().insert(d.clone(), body);
        d
    }

    /// A manifest addressed by its sha512 only (no tag). Like docker-registry, the upstream
    /// answers a GET by that digest with the sha256 `Docker-Content-Digest`.
    pub fn add_manifest_sha512(&self, repo: &str, media_type: &str, body: &[u8]) -> String {
        let d = sha512(body);
        let mut m = self.state.manifests.lock().unwrap();
        m.insert((repo.to_string(), d.clone()), (media_type.to_string(), Bytes::copy_from_slice(body)));
        d
    }

    pub fn add_manifest(&self, repo: &str, tag: &str, media_type: &str, body: &[u8]) -> String {
        let d = sha(body);
        let mut m = self.state.manifests.lock().unwrap();
        m.insert((repo.to_string(), tag.to_string()), (media_type.to_string(), Bytes::copy_from_slice(body)));
        m.insert((repo.to_string(), d.clone()), (media_type.to_string(), Bytes::copy_from_slice(body)));
        d
    }

    /// Serve `body` as `repo`'s manifest `reference` only (a tag, or a digest it may not match).
    pub fn add_manifest_at(&self, repo: &str, reference: &str, media_type: &str, body: &'static [u8]) {
        let mut m = self.state.manifests.lock().unwrap();
        m.insert((repo.to_string(), reference.to_string()), (media_type.to_string(), Bytes::from_static(body)));
    }

    pub fn set_faults(&self, faults: Vec<Fault>) {
        *self.state.faults.lock().unwrap() = faults;
    }

    pub fn blob_gets(&self) -> u64 {
        self.state.blob_gets.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }
}

fn next_fault(s: &FakeState) -> Fault {
    let mut f = s.faults.lock().unwrap();
    if f.is_empty() {
        s.steady.lock().unwrap().clone().unwrap_or(Fault::None)
    } else {
        f.remove(0)
    }
}

async fn fake_handler(State(s): State<Arc<FakeState>>, req: Request) -> Response {
    s.requests.fetch_add(1, Ordering::SeqCst);
    let path = req.uri().path().to_string();
    s.paths.lock().unwrap().push(req.uri().to_string());
    if *s.down.lock().unwrap() {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if path == "/token" {
        s.token_requests.fetch_add(1, Ordering::SeqCst);
        let t = s.require_token.lock().unwrap().clone().unwrap_or_default();
        return axum::Json(serde_json::json!({"token": t, "expires_in": 300})).into_response();
    }
    if let Some(t) = s.require_token.lock().unwrap().clone() {
        let ok = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == format!("Bearer {t}"));
        if !ok {
            let base = s.base_url.lock().unwrap().clone();
            return Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header(
                    header::WWW_AUTHENTICATE,
                    format!(r#"Bearer realm="{base}/token",service="fake",scope="repository:x:pull""#),
                )
                .body(Body::empty())
                .unwrap();
        }
    }
    if path == "/v2/" {
        return "{}".into_response();
    }
    let head = req.method() == axum::http::Method::HEAD;
    if let Some((repo, reference)) = path.strip_prefix("/v2/").and_then(|p| p.rsplit_once("/manifests/")) {
        if head {
            s.manifest_heads.fetch_add(1, Ordering::SeqCst);
        } else {
            s.manifest_gets.fetch_add(1, Ordering::SeqCst);
            let delay = *s.manifest_delay.lock().unwrap();
            if let Some(d) = delay {
                tokio::time::sleep(d).await;
            }
        }
        if let Some(a) = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()) {
            s.accepts.lock().unwrap().push(a.to_string());
        }
        let mut m = s.manifests.lock().unwrap().get(&(repo.to_string(), reference.to_string())).cloned();
        // Like a real registry: a tag naming an index, asked for by a client whose Accept
        // excludes the index's type, answers with the linux/amd64 (else the first) entry.
        let accept = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        // Like registries that enforce Accept for artifacts: a manifest of a type that is none
        // of the four image types goes only to a client that names it.
        let image_type = |mt: &str| mt.contains("oci.image.") || mt.contains("docker.distribution.manifest");
        if m.as_ref().is_some_and(|(mt, _)| !image_type(mt) && !accept.is_empty() && !accept.contains(mt.as_str())) {
            m = None;
        }
        if let Some((mt, body)) = m.clone() {
            let list = mt.contains("index") || mt.contains("manifest.list");
            if list && !reference.contains(':') && !accept.is_empty() && !accept.contains(&mt) {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let entries = v["manifests"].as_array().cloned().unwrap_or_default();
                let pick = entries
                    .iter()
                    .find(|e| e["platform"]["os"] == "linux" && e["platform"]["architecture"] == "amd64")
                    .or(entries.first())
                    .and_then(|e| e["digest"].as_str().map(str::to_string));
                m = pick.and_then(|d| s.manifests.lock().unwrap().get(&(repo.to_string(), d)).cloned());
            }
        }
        return match m {
            Some((mt, body)) => Response::builder()
                .header(header::CONTENT_TYPE, mt)
                .header(
                    "docker-content-digest",
                    match (s.announce.lock().unwrap().clone(), *s.announce_sha512.lock().unwrap()) {
                        (Some(d), _) => d,
                        (None, true) => sha512(&body),
                        (None, false) => sha(&body),
                    },
                )
                .header(header::CONTENT_LENGTH, body.len())
                .body(if head { Body::empty() } else { Body::from(body) })
                .unwrap(),
            None => (StatusCode::NOT_FOUND, r#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#).into_response(),
        };
    }
    if let Some((_repo, digest)) = path.strip_prefix("/v2/").and_then(|p| p.rsplit_once("/blobs/")) {
        if let (true, Some(claim)) = (head, s.head_claims.lock().unwrap().clone()) {
            s.blob_heads.fetch_add(1, Ordering::SeqCst);
            return Response::builder().header("docker-content-digest", claim).body(Body::empty()).unwrap();
        }
        let Some(body) = s.blobs.lock().unwrap().get(digest).cloned() else {
            return (StatusCode::NOT_FOUND, r#"{"errors":[{"code":"BLOB_UNKNOWN"}]}"#).into_response();
        };
        if head {
            s.blob_heads.fetch_add(1, Ordering::SeqCst);
            // docker-registry names a blob asked for by sha512 with its sha256.
            let named = if digest.starts_with("sha512:") { sha(&body) } else { digest.to_string() };
            return Response::builder()
                .header(header::CONTENT_LENGTH, body.len())
                .header("docker-content-digest", named)
                .body(Body::empty())
                .unwrap();
        }
        s.blob_gets.fetch_add(1, Ordering::SeqCst);
        if let Some(to) = s.redirect_blobs_to.lock().unwrap().clone() {
            return Response::builder()
                .status(StatusCode::TEMPORARY_REDIRECT)
                .header(header::LOCATION, format!("{to}{path}"))
                .body(Body::empty())
                .unwrap();
        }
        return serve_blob(&s, req.headers(), body).await;
    }
    let query: HashMap<String, String> =
        url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()).into_owned().collect();
    if let Some(repo) = path.strip_prefix("/v2/").and_then(|p| p.strip_suffix("/tags/list")) {
        let mut tags = s.tags.lock().unwrap().clone();
        if tags.is_empty() {
            tags = vec!["a".into(), "b".into()];
        }
        tags.sort();
        let base = s.base_url.lock().unwrap().clone();
        let paging = *s.paging.lock().unwrap();
        let (page, link) = match paging {
            Paging::None => (tags, None),
            Paging::Distribution(per) => {
                let n = query.get("n").and_then(|n| n.parse().ok()).unwrap_or(per);
                let after: Vec<String> = tags.into_iter().filter(|t| query.get("last").is_none_or(|l| t > l)).collect();
                let page: Vec<String> = after.iter().take(n).cloned().collect();
                let link = (after.len() > n)
                    .then(|| format!("</v2/{repo}/tags/list?n={n}&last={}>; rel=\"next\"", page.last().unwrap()));
                (page, link)
            }
            Paging::Quay(per) => {
                let n = query.get("n").and_then(|n| n.parse().ok()).unwrap_or(per);
                let from: usize = query
                    .get("next_page")
                    .map(|t| t.strip_prefix("opaque~").and_then(|o| o.parse().ok()).expect("a token we issued"))
                    .unwrap_or(0);
                let page: Vec<String> = tags.iter().skip(from).take(n).cloned().collect();
                let link = (tags.len() > from + n)
                    .then(|| format!("<{base}/v2/{repo}/tags/list?n={n}&next_page=opaque~{}>; rel=\"next\"", from + n));
                (page, link)
            }
        };
        let mut resp = axum::Json(serde_json::json!({"name": repo, "tags": page})).into_response();
        if let Some(l) = link {
            resp.headers_mut().insert(header::LINK, l.parse().unwrap());
        }
        return resp;
    }
    if path.strip_prefix("/v2/").is_some_and(|p| p.contains("/referrers/")) {
        let Some(all) = s.referrers.lock().unwrap().clone() else {
            return (StatusCode::NOT_FOUND, "404 page not found").into_response();
        };
        let filter = query.get("artifactType");
        let all: Vec<_> =
            all.into_iter().filter(|m| filter.is_none_or(|f| m["artifactType"].as_str() == Some(f))).collect();
        let from: usize = query.get("page").and_then(|p| p.parse().ok()).unwrap_or(0);
        let per = match *s.paging.lock().unwrap() {
            Paging::None => all.len().max(1),
            Paging::Distribution(n) | Paging::Quay(n) => n,
        };
        let page: Vec<_> = all.iter().skip(from).take(per).cloned().collect();
        let body = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": page});
        let mut b = Response::builder().header(header::CONTENT_TYPE, "application/vnd.oci.image.index.v1+json");
        if filter.is_some() {
            b = b.header("oci-filters-applied", "artifactType");
        }
        if all.len() > from + per {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            if let Some(f) = filter {
                q.append_pair("artifactType", f);
            }
            q.append_pair("page", &(from + per).to_string());
            b = b.header(
                header::LINK,
                format!("</v2/{path_rest}?{}>; rel=\"next\"", q.finish(), path_rest = &path[4..]),
            );
        }
        return b.body(Body::from(body.to_string())).unwrap();
    }
    StatusCode::NOT_FOUND.into_response()
}

async fn serve_blob(s: &Arc<FakeState>, headers: &HeaderMap, body: Bytes) -> Response {
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok()).map(str::to_string);
    if let Some(r) = &range {
        s.ranges.lock().unwrap().push(r.clone());
    }
    let fault = next_fault(s);
    match fault {
        Fault::TooManyRequests => {
            return Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header(header::RETRY_AFTER, "1")
                .body(Body::empty())
                .unwrap()
        }
        Fault::ServerError => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        _ => {}
    }
    let total = body.len() as u64;
    let start = match (&range, *s.ignore_range.lock().unwrap()) {
        (Some(r), false) => {
            r.strip_prefix("bytes=").and_then(|r| r.strip_suffix('-')).and_then(|n| n.parse::<u64>().ok())
        }
        _ => None,
    };
    let (status, from) = match start {
        Some(n) if n < total => (StatusCode::PARTIAL_CONTENT, n),
        _ => (StatusCode::OK, 0),
    };
    let mut data = body.slice(from as usize..).to_vec();
    if let Fault::WrongByteAt(at) = fault {
        if at >= from && ((at - from) as usize) < data.len() {
            data[(at - from) as usize] ^= 0xff;
        }
    }
    let len = data.len() as u64;
    let announced = if fault == Fault::LongerContentLength { len + 10 } else { len };
    let cut = match fault {
        Fault::TruncateAt(n) | Fault::ResetAt(n) | Fault::StallAt(n) => Some(n.saturating_sub(from).min(len)),
        _ => None,
    };
    let drip = if let Fault::SlowDrip(r) = fault { Some(r) } else { None };
    let state = s.clone();
    let stream = async_stream_body(Bytes::from(data), cut, fault.clone(), drip, state);
    let mut b = Response::builder().status(status).header(header::CONTENT_LENGTH, announced);
    if status == StatusCode::PARTIAL_CONTENT {
        b = b.header(header::CONTENT_RANGE, format!("bytes {from}-{}/{total}", total - 1));
    }
    b.body(Body::from_stream(stream)).unwrap()
}

fn async_stream_body(
    data: Bytes,
    cut: Option<u64>,
    fault: Fault,
    drip: Option<u64>,
    state: Arc<FakeState>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    const CHUNK: usize = 64 * 1024;
    futures::stream::unfold((0usize, false), move |(pos, ended)| {
        let (data, fault, state) = (data.clone(), fault.clone(), state.clone());
        async move {
            if ended {
                return None;
            }
            let limit = cut.map(|c| c as usize).unwrap_or(data.len());
            if pos >= limit {
                if cut.is_some() {
                    match fault {
                        Fault::StallAt(_) => {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            return None;
                        }
                        Fault::ResetAt(_) => {
                            return Some((
                                Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset")),
                                (pos, true),
                            ))
                        }
                        _ => return Some((Err(std::io::Error::other("truncated")), (pos, true))),
                    }
                }
                if fault == Fault::LongerContentLength {
                    return Some((Err(std::io::Error::other("short body")), (pos, true)));
                }
                return None;
            }
            let n = CHUNK.min(limit - pos);
            if let Some(rate) = drip {
                tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
            }
            state.bytes_sent.fetch_add(n as u64, Ordering::SeqCst);
            Some((Ok(data.slice(pos..pos + n)), (pos + n, false)))
        }
    })
}

/// tender in-process: store in a temp dir, one upstream "ghcr.io" pointing at the fake.
pub struct Tender {
    pub addr: SocketAddr,
    pub store: Arc<Store>,
    pub app: Arc<AppState>,
    pub metrics: FetchMetrics,
    pub dir: tempfile::TempDir,
}

pub fn fast_settings() -> FetchSettings {
    FetchSettings {
        attempts: 5,
        connect_timeout: Duration::from_secs(2),
        first_byte_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_millis(1500),
        fill_deadline: Duration::from_secs(60),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        tag_ttl: Duration::from_secs(300),
        stale_max_age: tender_fetch::StaleLimit::Max(Duration::from_secs(3600)),
        max_concurrent_fills: None,
        max_fills_per_upstream: None,
        abandoned_fill_grace: Duration::from_secs(60),
        ..FetchSettings::default()
    }
}

pub fn upstream_settings(name: &str, url: &str) -> UpstreamSettings {
    UpstreamSettings {
        name: name.to_string(),
        endpoints: vec![url.parse().unwrap()],
        ca_file: None,
        insecure_skip_verify: false,
        proxy: None,
        credentials: None,
        public: false,
        private: false,
        range_before_verify: false,
        redirect_hosts: None,
        token_realm_hosts: Vec::new(),
        library_prefix: name == "docker.io",
        max_object_size: None,
        stale_max_age: None,
        ns_param: None,
        fallback: None,
        client_identity: None,
        offline: false,
    }
}

impl Tender {
    pub async fn start(upstreams: Vec<UpstreamSettings>, settings: FetchSettings) -> Tender {
        Tender::start_with_factory(upstreams, None, settings).await
    }

    pub async fn start_with_factory(
        upstreams: Vec<UpstreamSettings>,
        factory: Option<String>,
        settings: FetchSettings,
    ) -> Tender {
        Tender::start_full(upstreams, factory, settings, Security::default(), None, Surface::All).await
    }

    /// With authentication, admin endpoints, limits, TLS and a choice of surface.
    pub async fn start_full(
        upstreams: Vec<UpstreamSettings>,
        factory: Option<String>,
        settings: FetchSettings,
        security: Security,
        tls: Option<Arc<tender_server::tls::TlsReloader>>,
        surface: Surface,
    ) -> Tender {
        Tender::start_replica(upstreams, factory, settings, security, tls, surface, None).await
    }

    /// One replica of several sharing `bucket`.
    pub async fn start_replica(
        upstreams: Vec<UpstreamSettings>,
        factory: Option<String>,
        settings: FetchSettings,
        security: Security,
        tls: Option<Arc<tender_server::tls::TlsReloader>>,
        surface: Surface,
        bucket: Option<Arc<tender_bucket::Bucket>>,
    ) -> Tender {
        let dir = tempfile::tempdir().unwrap();
        Tender::start_in(dir, upstreams, factory, settings, security, tls, surface, bucket).await
    }

    /// A replica over an existing data directory (an older format, for migration tests).
    #[allow(clippy::too_many_arguments, reason = "test bed")]
    pub async fn start_in(
        dir: tempfile::TempDir,
        upstreams: Vec<UpstreamSettings>,
        factory: Option<String>,
        settings: FetchSettings,
        security: Security,
        tls: Option<Arc<tender_server::tls::TlsReloader>>,
        surface: Surface,
        bucket: Option<Arc<tender_bucket::Bucket>>,
    ) -> Tender {
        let store = Arc::new(Store::open(dir.path(), OpenMode::Exclusive).unwrap());
        let metrics = FetchMetrics::default();
        let flights = Flights::with_bucket(store.clone(), settings.clone(), metrics.clone(), bucket);
        let ups = upstreams
            .into_iter()
            .map(|u| Arc::new(Upstream::new(u, settings.clone(), metrics.clone()).unwrap()))
            .collect::<Vec<_>>();
        let default = ups.first().map(|u| u.name().to_string());
        let mirror = match factory {
            Some(url) => {
                let f =
                    Upstream::new(upstream_settings("image-factory", &url), settings.clone(), metrics.clone()).unwrap();
                Mirror::with_image_factory(ups, default, Arc::new(f), flights, settings)
            }
            None => Mirror::new(ups, default, flights, settings),
        };
        let app = AppState::full(mirror, Arc::new(ServerMetrics::new(&metrics)), None, security);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let a = app.clone();
        let opts = tender_server::listen::ListenOptions { tls, limits: a.security().limits.clone() };
        tokio::spawn(async move {
            let router = tender_server::router_for(a.clone(), surface);
            let _ =
                tender_server::listen::run(listener, router, opts, a.metrics().clone(), std::future::pending()).await;
        });
        Tender { addr, store, app, metrics, dir }
    }

    pub async fn in_front_of(fake: &FakeUpstream) -> Tender {
        Tender::start(vec![upstream_settings("ghcr.io", &fake.url())], fast_settings()).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Wait (bounded) until no fill is running: a client has its last byte once the content
    /// verified, the commit follows.
    pub async fn wait_idle(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !self.app.mirror().flights().active_keys().is_empty() {
            assert!(std::time::Instant::now() < deadline, "fills did not end");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(60)).build().unwrap()
}

/// What one client got.
#[derive(Debug)]
pub struct Got {
    pub status: u16,
    pub content_length: Option<u64>,
    pub body: Result<Bytes, String>,
}

pub async fn get(url: &str, headers: &[(&str, &str)]) -> Got {
    let mut req = client().get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    match req.send().await {
        Err(e) => Got { status: 0, content_length: None, body: Err(e.to_string()) },
        Ok(r) => {
            let status = r.status().as_u16();
            let content_length = r.content_length();
            let body = r.bytes().await.map_err(|e| e.to_string());
            Got { status, content_length, body }
        }
    }
}
