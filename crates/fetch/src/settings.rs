//! Validated settings: what the binary's config loader resolves the YAML and flags into.

use std::path::PathBuf;
use std::time::Duration;

use url::Url;

/// Credentials for one upstream. The password is never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

/// One upstream registry, resolved from configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSettings {
    /// The registry host name clients use (`ghcr.io`, `docker.io`): the `ns` value and the
    /// path prefix that select it.
    pub name: String,
    /// Base URLs tried in order: the upstream's own URL last, extra `endpoints` first.
    pub endpoints: Vec<Url>,
    pub ca_file: Option<PathBuf>,
    pub insecure_skip_verify: bool,
    pub proxy: Option<Url>,
    pub credentials: Option<Credentials>,
    /// Served to unauthenticated clients although it has credentials.
    pub public: bool,
    /// `private: true`: its content needs an authenticated client even without credentials
    /// (an offline upstream at an air-gapped site has nothing to log in to).
    pub private: bool,
    /// `rangeBeforeVerify: true`: a range of an object being fetched may go out before the
    /// object's digest verified (the upstream is trusted to send the right bytes). Default:
    /// the range waits for the verdict.
    pub range_before_verify: bool,
    /// If set, redirects may only go to these hosts (exact, or `*.suffix`).
    pub redirect_hosts: Option<Vec<String>>,
    /// Token realms on other hosts than the endpoints that may receive `credentials` (exact,
    /// or `*.suffix`); docker.io has `auth.docker.io` built in. Other realms are asked for a
    /// token without credentials.
    pub token_realm_hosts: Vec<String>,
    /// One-component names get `library/` (Docker Hub).
    pub library_prefix: bool,
    /// Largest object fetched from this upstream; larger ones are refused, not stored.
    pub max_object_size: Option<u64>,
    /// `staleMaxAge` of this upstream; `None`: the global one.
    pub stale_max_age: Option<StaleLimit>,
    /// `offline: true` (or `serve --offline`): never contacted. Its name still routes; what is
    /// stored is served, a miss is a 404 at once, a cached tag resolves from its last mapping.
    pub offline: bool,
    /// Reached through a parent tender: every `/v2/<name>/...` request carries `ns=<this>`.
    pub ns_param: Option<String>,
    /// `parent.fallbackToUpstream`: on a route through the parents, the upstream itself, asked
    /// only when no parent answered (connect, DNS, TLS, timeout, 5xx, 429).
    pub fallback: Option<Box<UpstreamSettings>>,
    /// Client certificate and key (PEM) presented to the endpoints (a parent with mutual TLS).
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

impl UpstreamSettings {
    /// Whether what tender serves from this upstream goes only to authenticated clients: it
    /// has credentials or is marked `private`, and is not marked `public`.
    pub fn needs_identity(&self) -> bool {
        (self.credentials.is_some() || self.private) && !self.public
    }
}

/// `staleMaxAge`: how old the last known answer of an unreachable upstream may be and still be
/// served. Only an unreachable upstream (DNS, connect, TLS, timeout, 5xx, 429) leads to a stale
/// answer; one that answers 401, 403 or 404 has answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StaleLimit {
    /// As long as the upstream stays unreachable (`never`, the default).
    #[default]
    Never,
    /// Up to this age.
    Max(Duration),
}

impl StaleLimit {
    /// Whether an answer `age_secs` old may still be served.
    pub fn allows(self, age_secs: u64) -> bool {
        match self {
            StaleLimit::Never => true,
            StaleLimit::Max(d) => age_secs <= d.as_secs(),
        }
    }
}

impl std::fmt::Display for StaleLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StaleLimit::Never => f.write_str("never"),
            StaleLimit::Max(d) => write!(f, "{}", humantime_secs(d.as_secs())),
        }
    }
}

/// `1h30m` style, seconds precision.
fn humantime_secs(mut s: u64) -> String {
    if s == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    for (unit, n) in [("d", 86_400u64), ("h", 3600), ("m", 60), ("s", 1)] {
        let q = s.checked_div(n).unwrap_or(0);
        if q > 0 {
            out.push_str(&format!("{q}{unit}"));
            s = s.checked_rem(n).unwrap_or(0);
        }
    }
    out
}

/// Largest manifest accepted from an upstream or the shared bucket by default
/// (`limits.maxManifestSize`).
pub const DEFAULT_MAX_MANIFEST_BYTES: usize = 8 * 1024 * 1024;

/// Timeouts, retries and cache lifetimes of fetching, shared by all upstreams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchSettings {
    /// Attempts per upstream transfer, the first included.
    pub attempts: u32,
    pub connect_timeout: Duration,
    /// Time from request to response headers.
    pub first_byte_timeout: Duration,
    /// Longest gap between two body chunks before the transfer counts as stalled.
    pub stall_timeout: Duration,
    /// Longest a whole fill may take, retries included.
    pub fill_deadline: Duration,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// How long a tag -> digest mapping is used without asking the upstream again.
    pub tag_ttl: Duration,
    /// How old a tag mapping (or listing) may be and still be served while its upstream is
    /// unreachable; an upstream's own `stale_max_age` wins.
    pub stale_max_age: StaleLimit,
    /// Upstream fills running at once; more wait for a slot (None: no limit).
    pub max_concurrent_fills: Option<usize>,
    /// Upstream fills running at once per upstream (None: only the global limit), so one slow
    /// or hostile upstream cannot hold every slot.
    pub max_fills_per_upstream: Option<usize>,
    /// A fill nobody reads or waits for (every client gone, not a prefetch) is cancelled after
    /// this long.
    pub abandoned_fill_grace: Duration,
    /// Largest decompressed size an asset's container check accepts (decompression bombs).
    pub max_decoded_size: u64,
    /// Longest a small upstream body (token response, manifest, tag list, referrers) may take
    /// in whole, after its headers; each gap is bounded by `stall_timeout` too.
    pub metadata_timeout: Duration,
    /// Largest manifest accepted from an upstream or the shared bucket (`limits.maxManifestSize`).
    pub max_manifest_size: usize,
}

impl Default for FetchSettings {
    fn default() -> Self {
        FetchSettings {
            attempts: 5,
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(30),
            stall_timeout: Duration::from_secs(30),
            fill_deadline: Duration::from_secs(3600),
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(10),
            tag_ttl: Duration::from_secs(300),
            stale_max_age: StaleLimit::Never,
            max_concurrent_fills: Some(64),
            max_fills_per_upstream: Some(32),
            abandoned_fill_grace: Duration::from_secs(60),
            max_decoded_size: crate::container::DEFAULT_MAX_DECODED,
            metadata_timeout: Duration::from_secs(60),
            max_manifest_size: DEFAULT_MAX_MANIFEST_BYTES,
        }
    }
}

impl FetchSettings {
    /// Capped exponential backoff with full jitter for retry number `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.backoff_base.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let cap = exp.min(self.backoff_max);
        let jitter: f64 = rand::random::<f64>();
        cap.mul_f64(0.5 + jitter / 2.0)
    }
}
