//! One HTTP client per configured upstream: endpoints tried in order, TLS and proxy settings,
//! the bearer-token dance, and the redirect / address policy.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use reqwest::header::{HeaderMap, RETRY_AFTER, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};
use url::Url;

use crate::error::{FetchError, FetchErrorKind};
use crate::metrics::FetchMetrics;
use crate::settings::{FetchSettings, UpstreamSettings};
use crate::wire::{parse_challenge, parse_token_response, Challenge};
pub use crate::wire::{parse_retry_after, MAX_RETRY_AFTER};

/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 5;
/// Docker Hub's token realm: receives docker.io's credentials without configuration.
const DOCKER_HUB_REALM: &str = "auth.docker.io";
/// Largest token response read (a JWT is a few KiB).
pub const MAX_TOKEN_BYTES: usize = 1 << 20;

/// Held while one request asks for the token of a (host, scope).
type TokenGate = Arc<tokio::sync::Mutex<()>>;

/// A configured upstream and its client.
#[derive(Debug)]
pub struct Upstream {
    settings: UpstreamSettings,
    fetch: FetchSettings,
    client: reqwest::Client,
    policy: Arc<AddressPolicy>,
    tokens: Mutex<HashMap<(String, String), (String, Instant)>>,
    /// One token request at a time per (host, scope): the others wait and take its token.
    token_gates: Mutex<HashMap<(String, String), TokenGate>>,
    metrics: FetchMetrics,
    /// Up or down, since when, and why.
    health: crate::health::Tracker,
    /// `parent.fallbackToUpstream`: the upstream itself, asked when no parent answered.
    fallback: Option<Box<Upstream>>,
}

/// Which addresses a redirect or token realm may lead to.
#[derive(Debug)]
struct AddressPolicy {
    upstream: String,
    /// The upstream itself lives on a loopback / private address, so those are allowed.
    allow_private: bool,
    /// Hosts of the configured endpoints: always allowed.
    endpoint_hosts: Vec<String>,
    redirect_hosts: Option<Vec<String>>,
    /// Hosts besides the endpoints that may receive the upstream's credentials (token realms).
    credential_hosts: Vec<String>,
    metrics: FetchMetrics,
}

/// Loopback, private, link-local, unique-local, unspecified, CGNAT, or cloud metadata.
pub fn is_internal_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || (o[0] == 100 && (64..128).contains(&o[1]))
                || o[0] == 0
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal_ip(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback() || v6.is_unspecified() || (s[0] & 0xfe00) == 0xfc00 || (s[0] & 0xffc0) == 0xfe80
        }
    }
}

fn is_internal_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    if let Ok(ip) = h.parse::<IpAddr>() {
        return is_internal_ip(ip);
    }
    h == "localhost" || h.ends_with(".localhost") || h == "metadata.google.internal" || h.ends_with(".internal")
}

fn host_matches(pattern: &str, host: &str) -> bool {
    let (p, h) = (pattern.to_ascii_lowercase(), host.to_ascii_lowercase());
    match p.strip_prefix("*.") {
        Some(suffix) => h.ends_with(&format!(".{suffix}")),
        None => p == h,
    }
}

impl AddressPolicy {
    /// Why `next` may not be followed from `prev`, if it may not.
    fn refuse(&self, prev: Option<&Url>, next: &Url) -> Option<String> {
        if !matches!(next.scheme(), "http" | "https") {
            return Some(format!("scheme {} is not http(s)", next.scheme()));
        }
        if prev.is_some_and(|p| p.scheme() == "https") && next.scheme() == "http" {
            return Some("https to http downgrade".to_string());
        }
        let Some(host) = next.host_str() else {
            return Some("no host".to_string());
        };
        let is_endpoint = self.endpoint_hosts.iter().any(|h| h.eq_ignore_ascii_case(host));
        if let Some(allowed) = &self.redirect_hosts {
            if !is_endpoint && !allowed.iter().any(|p| host_matches(p, host)) {
                return Some(format!("host {host} is not in redirectHosts"));
            }
        }
        if !self.allow_private && !is_endpoint && is_internal_host(host) {
            return Some(format!("host {host} is an internal address"));
        }
        None
    }

    /// Whether the upstream's credentials may go to `url`: an endpoint host, or a listed
    /// token realm host, over https unless the endpoint itself is plain http.
    fn may_receive_credentials(&self, url: &Url) -> bool {
        let Some(host) = url.host_str() else { return false };
        self.endpoint_hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
            || self.credential_hosts.iter().any(|p| host_matches(p, host))
    }

    fn check(&self, prev: Option<&Url>, next: &Url) -> Result<(), String> {
        match self.refuse(prev, next) {
            None => Ok(()),
            Some(reason) => {
                self.metrics.redirects_refused.get_or_create(&self.label()).inc();
                tracing::warn!(upstream = %self.upstream, target = %redact(next), %reason, "redirect refused");
                Err(reason)
            }
        }
    }

    fn label(&self) -> Vec<(String, String)> {
        vec![("upstream".to_string(), self.upstream.clone())]
    }
}

/// A URL without its query (signed CDN URLs carry credentials there).
fn redact(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

/// DNS resolution that refuses internal addresses for hosts other than the endpoints, unless
/// the upstream itself is internal.
#[derive(Debug)]
struct GuardedResolver {
    policy: Arc<AddressPolicy>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let exempt = policy.allow_private || policy.endpoint_hosts.iter().any(|h| h.eq_ignore_ascii_case(&host));
            let kept: Vec<SocketAddr> = addrs.into_iter().filter(|a| exempt || !is_internal_ip(a.ip())).collect();
            if kept.is_empty() {
                policy.metrics.redirects_refused.get_or_create(&policy.label()).inc();
                tracing::warn!(upstream = %policy.upstream, %host, "refused: host resolves only to internal addresses");
                let err: Box<dyn std::error::Error + Send + Sync> =
                    format!("{host} resolves only to internal addresses").into();
                return Err(err);
            }
            let iter: reqwest::dns::Addrs = Box::new(kept.into_iter());
            Ok(iter)
        })
    }
}

/// Credentials attached to one request.
enum Auth {
    Bearer(String),
    Basic(String, String),
}

/// Whether an answer with `status` shows the upstream usable: anything but 5xx and 429 (a
/// 401, 403 or 404 is an answer).
fn usable(status: StatusCode) -> bool {
    !status.is_server_error() && status != StatusCode::TOO_MANY_REQUESTS
}

/// An upstream's `Retry-After` (seconds or an HTTP date), at most [`MAX_RETRY_AFTER`].
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    parse_retry_after(headers.get(RETRY_AFTER)?.to_str().ok()?, std::time::SystemTime::now())
}

impl Upstream {
    pub fn new(
        settings: UpstreamSettings,
        fetch: FetchSettings,
        metrics: FetchMetrics,
    ) -> Result<Upstream, FetchError> {
        let bad = |m: String| FetchError::new(FetchErrorKind::Local, &settings.name, m);
        let endpoint_hosts: Vec<String> =
            settings.endpoints.iter().filter_map(|u| u.host_str().map(str::to_string)).collect();
        let policy = Arc::new(AddressPolicy {
            upstream: settings.name.clone(),
            allow_private: endpoint_hosts.iter().any(|h| is_internal_host(h)),
            endpoint_hosts,
            redirect_hosts: settings.redirect_hosts.clone(),
            credential_hosts: {
                let mut hosts = settings.token_realm_hosts.clone();
                if settings.name.eq_ignore_ascii_case("docker.io") {
                    hosts.push(DOCKER_HUB_REALM.to_string());
                }
                hosts
            },
            metrics: metrics.clone(),
        });
        let redirect_policy = {
            let policy = policy.clone();
            reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() > MAX_REDIRECTS {
                    return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
                }
                let prev = attempt.previous().last().cloned();
                match policy.check(prev.as_ref(), attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(reason) => attempt.error(format!("redirect refused: {reason}")),
                }
            })
        };
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(fetch.connect_timeout)
            .redirect(redirect_policy)
            .dns_resolver(Arc::new(GuardedResolver { policy: policy.clone() }))
            .user_agent(concat!("tender/", env!("CARGO_PKG_VERSION")))
            .no_proxy()
            .pool_idle_timeout(Duration::from_secs(60))
            .tcp_nodelay(true);
        if let Some(ca) = &settings.ca_file {
            let pem = std::fs::read(ca).map_err(|e| bad(format!("caFile {}: {e}", ca.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| bad(format!("caFile {}: not a PEM bundle: {e}", ca.display())))?;
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        if settings.insecure_skip_verify {
            builder = builder.danger_accept_invalid_certs(true);
        }
        if let Some((cert, key)) = &settings.client_identity {
            let mut pem =
                std::fs::read(cert).map_err(|e| bad(format!("client certificate {}: {e}", cert.display())))?;
            pem.push(b'\n');
            pem.extend(std::fs::read(key).map_err(|e| bad(format!("client key {}: {e}", key.display())))?);
            let id = reqwest::Identity::from_pem(&pem)
                .map_err(|e| bad(format!("client certificate {} / key {}: {e}", cert.display(), key.display())))?;
            builder = builder.identity(id);
        }
        if let Some(proxy) = &settings.proxy {
            let p = reqwest::Proxy::all(proxy.as_str()).map_err(|e| bad(format!("proxy {proxy}: {e}")))?;
            builder = builder.proxy(p);
        }
        let client = builder.build().map_err(|e| bad(format!("cannot build HTTP client: {e}")))?;
        let fallback = match &settings.fallback {
            Some(f) => Some(Box::new(Upstream::new((**f).clone(), fetch.clone(), metrics.clone())?)),
            None => None,
        };
        Ok(Upstream {
            settings,
            fetch,
            client,
            policy,
            tokens: Mutex::new(HashMap::new()),
            token_gates: Mutex::new(HashMap::new()),
            metrics,
            health: crate::health::Tracker::default(),
            fallback,
        })
    }

    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// The last outcome: `Some(true)` up, `Some(false)` down, `None` not asked yet.
    pub fn health(&self) -> Option<bool> {
        self.health.state()
    }

    /// State, last success, last error with its cause, stale answers served; on a route
    /// through the parents, whether it may go to the upstream itself and how that went.
    pub fn health_report(&self) -> crate::health::Health {
        let mut h =
            self.health.report(self.name(), self.metrics.stale_served.get_or_create(&self.policy.label()).get());
        if self.settings.offline {
            h.state = crate::health::State::Offline;
        }
        if self.settings.ns_param.is_some() {
            h.fallback_to_upstream = Some(self.fallback.is_some());
            h.fallback = self.fallback.as_ref().map(|f| {
                let mut fh = f.health.report(self.name(), 0);
                fh.requests = Some(self.metrics.parent_fallbacks.get_or_create(&self.policy.label()).get());
                Box::new(fh)
            });
        }
        h
    }

    /// Count an answer served stale because this upstream was unreachable.
    pub fn record_stale(&self) {
        self.metrics.stale_served.get_or_create(&self.policy.label()).inc();
    }

    /// Ask the upstream now (`GET path` on each endpoint, no credentials, until one answers)
    /// and return its health. Any answer below 500 but 429 counts as up (a registry answers
    /// `/v2/` with 401 when it wants a token).
    pub async fn probe(&self, path: &str) -> crate::health::Health {
        let endpoints = if self.settings.offline { &[][..] } else { &self.settings.endpoints[..] };
        for endpoint in endpoints {
            let Ok(url) = self.join(endpoint, path) else { continue };
            if let Ok(r) = self.send(&Method::GET, &url, &HeaderMap::new(), None).await {
                if usable(r.status()) {
                    break;
                }
            }
        }
        self.health_report()
    }

    /// Record an answer: up, or down for a 5xx or 429.
    fn note_answer(&self, url: &Url, status: StatusCode) {
        let now = tender_store::now_secs();
        if usable(status) {
            self.metrics.upstream_up.get_or_create(&self.policy.label()).set(1);
            self.metrics
                .upstream_last_success
                .get_or_create(&self.policy.label())
                .set(i64::try_from(now).unwrap_or(i64::MAX));
            self.health.up(now);
        } else {
            let code = status.as_u16();
            tracing::warn!(upstream = %self.name(), url = %redact(url), status = code, cause = "http",
                "upstream request failed: HTTP {code}");
            self.metrics.upstream_up.get_or_create(&self.policy.label()).set(0);
            self.health.down(crate::health::LastError {
                cause: crate::health::Cause::Http,
                status: Some(code),
                message: format!("HTTP {status}"),
                at: now,
            });
        }
    }

    pub fn settings(&self) -> &UpstreamSettings {
        &self.settings
    }

    fn join(&self, base: &Url, path_and_query: &str) -> Result<Url, String> {
        let base_path = base.path().trim_end_matches('/');
        let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
        let mut u = base.clone();
        u.set_path(&format!("{base_path}{path}"));
        u.set_query(if query.is_empty() { None } else { Some(query) });
        // Through a parent tender: name the upstream the way containerd does, so the parent
        // routes it as if the client had asked it.
        if let (Some(ns), true) = (&self.settings.ns_param, path.starts_with("/v2/") && path.len() > 4) {
            u.query_pairs_mut().append_pair("ns", ns);
        }
        Ok(u)
    }

    /// Send a request to the upstream's endpoints in order and return the first successful
    /// (2xx) response. `scope` is the token scope (`repository:<name>:pull`).
    pub async fn request(
        &self,
        method: Method,
        path_and_query: &str,
        headers: HeaderMap,
        scope: Option<&str>,
    ) -> Result<reqwest::Response, FetchError> {
        if self.settings.offline {
            return Err(FetchError::new(
                FetchErrorKind::Offline,
                self.name(),
                format!("{} is offline (offline: true): only what tender holds is served", self.name()),
            ));
        }
        let mut last: Option<FetchError> = None;
        for endpoint in &self.settings.endpoints {
            let url = self
                .join(endpoint, path_and_query)
                .map_err(|e| FetchError::new(FetchErrorKind::Local, self.name(), e))?;
            match self.request_endpoint(&method, url, &headers, scope).await {
                Ok(r) => return Ok(r),
                Err(e) => {
                    tracing::debug!(upstream = %self.name(), endpoint = %endpoint, error = %e, "endpoint failed");
                    // A definite "not found" from one endpoint does not hide another's answer,
                    // but a later endpoint's transient failure should not mask a definite one.
                    let keep_last = last.as_ref().is_some_and(|l| !l.is_retryable() && e.is_retryable());
                    if !keep_last {
                        last = Some(e);
                    }
                }
            }
        }
        let last =
            last.unwrap_or_else(|| FetchError::new(FetchErrorKind::Local, self.name(), "no endpoints configured"));
        match &self.fallback {
            // No parent answered at all (connect, DNS, TLS, timeout): the upstream itself, as
            // parent.fallbackToUpstream allows. A parent that answered, even with a 5xx, is up
            // and keeps the request.
            Some(f) if matches!(last.kind, FetchErrorKind::Connect | FetchErrorKind::Timeout) => {
                self.metrics.parent_fallbacks.get_or_create(&self.policy.label()).inc();
                tracing::warn!(upstream = %self.name(), error = %last,
                    "no parent answered: asking the upstream itself (parent.fallbackToUpstream)");
                Box::pin(f.request(method, path_and_query, headers, scope)).await
            }
            _ => Err(last),
        }
    }

    async fn request_endpoint(
        &self,
        method: &Method,
        url: Url,
        headers: &HeaderMap,
        scope: Option<&str>,
    ) -> Result<reqwest::Response, FetchError> {
        let host = url.host_str().unwrap_or_default().to_string();
        let cached = scope.and_then(|s| self.cached_token(&host, s));
        let first = self.send(method, &url, headers, cached.clone().map(Auth::Bearer).as_ref()).await?;
        if first.status() != StatusCode::UNAUTHORIZED {
            return self.check_status(first);
        }
        let challenge = first.headers().get(WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).and_then(parse_challenge);
        let auth = match challenge {
            Some(Challenge::Bearer { realm, service, scope: asked }) => {
                let scope = scope.map(str::to_string).or(asked);
                match &scope {
                    Some(s) => {
                        // Requests for one scope that meet a 401 together ask for one token:
                        // the first asks, the others take the token it stored.
                        let gate = self.token_gate(&host, s);
                        let _one = gate.lock().await;
                        match self.cached_token(&host, s).filter(|t| cached.as_ref() != Some(t)) {
                            Some(t) => Auth::Bearer(t),
                            None => {
                                let token = self.fetch_token(&url, &realm, service.as_deref(), Some(s)).await?;
                                self.store_token(&host, s, &token);
                                Auth::Bearer(token.0)
                            }
                        }
                    }
                    None => Auth::Bearer(self.fetch_token(&url, &realm, service.as_deref(), None).await?.0),
                }
            }
            Some(Challenge::Basic) => match &self.settings.credentials {
                Some(c) => Auth::Basic(c.username.clone(), c.password.clone()),
                None => return Err(self.unauthorized("asks for Basic credentials and none are configured")),
            },
            None => return Err(self.unauthorized("answered 401 without a usable WWW-Authenticate challenge")),
        };
        let second = self.send(method, &url, headers, Some(&auth)).await?;
        if second.status() == StatusCode::UNAUTHORIZED {
            return Err(self.unauthorized("refused our credentials"));
        }
        self.check_status(second)
    }

    fn unauthorized(&self, what: &str) -> FetchError {
        FetchError::new(FetchErrorKind::Unauthorized, self.name(), what).with_status(401)
    }

    async fn send(
        &self,
        method: &Method,
        url: &Url,
        headers: &HeaderMap,
        auth: Option<&Auth>,
    ) -> Result<reqwest::Response, FetchError> {
        let mut req = self.client.request(method.clone(), url.clone()).headers(headers.clone());
        match auth {
            Some(Auth::Bearer(t)) => req = req.bearer_auth(t),
            Some(Auth::Basic(u, p)) => req = req.basic_auth(u, Some(p)),
            None => {}
        }
        self.metrics.upstream_requests.get_or_create(&self.policy.label()).inc();
        match tokio::time::timeout(self.fetch.first_byte_timeout, req.send()).await {
            Ok(Ok(r)) => {
                self.note_answer(url, r.status());
                Ok(r)
            }
            Ok(Err(e)) => {
                let e = FetchError::from_reqwest(self.name(), &e);
                // The whole cause chain (connection refused, certificate unknown, ...) at WARN.
                tracing::warn!(upstream = %self.name(), url = %redact(url), cause = %crate::health::Cause::of(&e),
                    error = %e.message, "upstream request failed");
                Err(self.count(e))
            }
            Err(_) => {
                let e = FetchError::new(
                    FetchErrorKind::Timeout,
                    self.name(),
                    format!("no response headers within {:?}", self.fetch.first_byte_timeout),
                );
                tracing::warn!(upstream = %self.name(), url = %redact(url), cause = "timeout", error = %e.message,
                    "upstream request failed");
                Err(self.count(e))
            }
        }
    }

    fn count(&self, e: FetchError) -> FetchError {
        if e.is_upstream_down() {
            self.metrics.upstream_up.get_or_create(&self.policy.label()).set(0);
            self.health.down(crate::health::LastError {
                cause: crate::health::Cause::of(&e),
                status: e.status,
                message: e.message.clone(),
                at: tender_store::now_secs(),
            });
        }
        let kind = format!("{:?}", e.kind).to_ascii_lowercase();
        self.metrics
            .upstream_errors
            .get_or_create(&vec![("upstream".to_string(), self.name().to_string()), ("kind".to_string(), kind)])
            .inc();
        e
    }

    /// Read a small body (token response, manifest, listing) whole: at most `limit` bytes,
    /// no gap longer than `stallTimeout`, all of it within `metadataTimeout`. A stall or the
    /// deadline is a timeout (the upstream counts as down: a tag may be served stale).
    pub async fn read_small(&self, resp: reqwest::Response, limit: usize, what: &str) -> Result<Bytes, FetchError> {
        if resp.content_length().is_some_and(|l| l > limit as u64) {
            return Err(FetchError::new(
                FetchErrorKind::TooLarge,
                self.name(),
                format!(
                    "{what} of {} bytes is over tender's limit of {limit} bytes",
                    resp.content_length().unwrap_or(0)
                ),
            ));
        }
        let deadline = crate::later(self.fetch.metadata_timeout);
        let mut out = Vec::new();
        let mut stream = resp.bytes_stream();
        loop {
            let wait = deadline.saturating_duration_since(Instant::now()).min(self.fetch.stall_timeout);
            let next = match tokio::time::timeout(wait, stream.next()).await {
                Ok(n) => n,
                Err(_) => {
                    let e = FetchError::new(
                        FetchErrorKind::Timeout,
                        self.name(),
                        format!(
                            "{what} stalled or took longer than {:?} at byte {}",
                            self.fetch.metadata_timeout,
                            out.len()
                        ),
                    );
                    return Err(self.count(e));
                }
            };
            let Some(chunk) = next else { break };
            let chunk = chunk.map_err(|e| self.count(FetchError::from_reqwest(self.name(), &e)))?;
            if out.len().saturating_add(chunk.len()) > limit {
                return Err(FetchError::new(
                    FetchErrorKind::TooLarge,
                    self.name(),
                    format!("{what} of more than {limit} bytes is over tender's limit of {limit} bytes"),
                ));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    }

    /// Count an error the caller found (a body that broke off, a digest mismatch).
    pub fn record_error(&self, e: &FetchError) {
        let _ = self.count(e.clone());
    }

    fn check_status(&self, r: reqwest::Response) -> Result<reqwest::Response, FetchError> {
        let status = r.status();
        if status.is_success() {
            return Ok(r);
        }
        let code = status.as_u16();
        let url = redact(r.url());
        let (kind, what) = match status {
            StatusCode::NOT_FOUND => (FetchErrorKind::NotFound, "not found"),
            StatusCode::FORBIDDEN => (FetchErrorKind::Unauthorized, "forbidden"),
            StatusCode::TOO_MANY_REQUESTS => (FetchErrorKind::TooManyRequests, "too many requests"),
            StatusCode::RANGE_NOT_SATISFIABLE => (FetchErrorKind::Status, "range not satisfiable"),
            _ => (FetchErrorKind::Status, "unexpected status"),
        };
        // The URL stays in the log: error messages reach clients, which learn the upstream's
        // configured name only.
        tracing::debug!(upstream = %self.name(), %url, status = code, "upstream answered {what}");
        let mut e = FetchError::new(kind, self.name(), format!("{what} ({code})")).with_status(code);
        e.retry_after = retry_after(r.headers());
        Err(if kind == FetchErrorKind::NotFound { e } else { self.count(e) })
    }

    fn cached_token(&self, host: &str, scope: &str) -> Option<String> {
        let tokens = self.tokens.lock().ok()?;
        let (token, expiry) = tokens.get(&(host.to_string(), scope.to_string()))?;
        (Instant::now() < *expiry).then(|| token.clone())
    }

    /// The lock that single-flights token requests for (`host`, `scope`); gates no request
    /// holds are dropped once there are many.
    fn token_gate(&self, host: &str, scope: &str) -> TokenGate {
        let mut gates = self.token_gates.lock().unwrap_or_else(|p| p.into_inner());
        if gates.len() >= 1024 {
            gates.retain(|_, g| Arc::strong_count(g) > 1);
        }
        gates.entry((host.to_string(), scope.to_string())).or_default().clone()
    }

    fn store_token(&self, host: &str, scope: &str, token: &(String, Duration)) {
        if let Ok(mut tokens) = self.tokens.lock() {
            let life = token.1.saturating_sub(Duration::from_secs(10)).max(Duration::from_secs(5));
            tokens.insert((host.to_string(), scope.to_string()), (token.0.clone(), crate::later(life)));
        }
    }

    async fn fetch_token(
        &self,
        origin: &Url,
        realm: &str,
        service: Option<&str>,
        scope: Option<&str>,
    ) -> Result<(String, Duration), FetchError> {
        let mut realm_url = Url::parse(realm).map_err(|e| {
            FetchError::new(FetchErrorKind::Refused, self.name(), format!("token realm {realm:?}: {e}"))
        })?;
        self.policy
            .check(Some(origin), &realm_url)
            .map_err(|r| FetchError::new(FetchErrorKind::Refused, self.name(), format!("token realm refused: {r}")))?;
        {
            let mut q = realm_url.query_pairs_mut();
            if let Some(s) = service {
                q.append_pair("service", s);
            }
            if let Some(s) = scope {
                q.append_pair("scope", s);
            }
        }
        // Credentials only to the upstream's own hosts and its tokenRealmHosts: any other realm
        // is asked for an anonymous token (enough for public content), and the refusal logged.
        let auth = match &self.settings.credentials {
            Some(c) if self.policy.may_receive_credentials(&realm_url) => {
                Some(Auth::Basic(c.username.clone(), c.password.clone()))
            }
            Some(_) => {
                self.metrics.redirects_refused.get_or_create(&self.policy.label()).inc();
                tracing::warn!(upstream = %self.name(), realm = %redact(&realm_url),
                    "token realm is not one of the upstream's hosts nor in tokenRealmHosts: asking without credentials");
                None
            }
            None => None,
        };
        let resp = self.send(&Method::GET, &realm_url, &HeaderMap::new(), auth.as_ref()).await?;
        let resp = self.check_status(resp).map_err(|mut e| {
            if e.status == Some(401) || e.status == Some(403) {
                e.kind = FetchErrorKind::Unauthorized;
            }
            e
        })?;
        let bytes = self.read_small(resp, MAX_TOKEN_BYTES, "token response").await?;
        parse_token_response(&bytes).map_err(|m| FetchError::new(FetchErrorKind::Unauthorized, self.name(), m))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_parse_bearer_challenges() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/alpine:pull".into()),
            })
        );
        assert_eq!(parse_challenge("Basic realm=\"x\""), Some(Challenge::Basic));
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(parse_challenge("Bearer service=\"x\""), None);
    }

    #[test]
    fn should_cap_retry_after_whatever_the_upstream_says() {
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(&u64::MAX.to_string(), now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", now), Some(Duration::ZERO));
        for junk in ["", "-1", "1e99", "soon", "99999999999999999999999"] {
            assert_eq!(parse_retry_after(junk, now), None, "{junk}");
        }
        assert!(crate::later(Duration::MAX) > Instant::now());
    }

    #[test]
    fn should_classify_internal_addresses() {
        for h in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "172.16.5.4",
            "169.254.169.254",
            "[::1]",
            "[fe80::1]",
            "[fd00::1]",
            "localhost",
            "metadata.google.internal",
            "100.64.0.1",
            "0.0.0.0",
        ] {
            assert!(is_internal_host(h), "{h}");
        }
        for h in ["ghcr.io", "8.8.8.8", "[2606:4700::1]", "pkg-containers.githubusercontent.com"] {
            assert!(!is_internal_host(h), "{h}");
        }
    }

    fn policy(allow_private: bool, redirect_hosts: Option<Vec<String>>) -> AddressPolicy {
        AddressPolicy {
            upstream: "ghcr.io".into(),
            allow_private,
            endpoint_hosts: vec!["ghcr.io".into()],
            redirect_hosts,
            credential_hosts: vec!["*.ghcr-auth.example".into()],
            metrics: FetchMetrics::default(),
        }
    }

    #[test]
    fn should_refuse_redirects_to_internal_or_downgraded_targets() {
        let p = policy(false, None);
        let from = Url::parse("https://ghcr.io/v2/x/blobs/sha256:1").ok();
        let check = |to: &str| p.refuse(from.as_ref(), &Url::parse(to).expect("test url"));
        assert!(check("https://pkg-containers.githubusercontent.com/x").is_none());
        assert!(check("http://pkg-containers.githubusercontent.com/x").is_some(), "downgrade");
        assert!(check("https://169.254.169.254/latest/meta-data").is_some(), "metadata");
        assert!(check("https://127.0.0.1/x").is_some(), "loopback");
        assert!(check("https://10.0.0.1/x").is_some(), "private");
        assert!(check("ftp://example.com/x").is_some(), "scheme");
        let allow_list = policy(false, Some(vec!["*.githubusercontent.com".into()]));
        assert!(allow_list
            .refuse(from.as_ref(), &Url::parse("https://pkg-containers.githubusercontent.com/x").expect("url"))
            .is_none());
        assert!(allow_list.refuse(from.as_ref(), &Url::parse("https://evil.example.com/x").expect("url")).is_some());
        let url = |u: &str| Url::parse(u).expect("url");
        assert!(p.may_receive_credentials(&url("https://ghcr.io/token")));
        assert!(p.may_receive_credentials(&url("https://eu.ghcr-auth.example/token")));
        assert!(!p.may_receive_credentials(&url("https://evil.example/token")));
        assert!(!p.may_receive_credentials(&url("https://ghcr.io.evil.example/token")));
        let internal = policy(true, None);
        assert!(internal.refuse(None, &Url::parse("http://127.0.0.2:9000/x").expect("url")).is_none());
    }
}
