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
    /// If set, redirects may only go to these hosts (exact, or `*.suffix`).
    pub redirect_hosts: Option<Vec<String>>,
    /// One-component names get `library/` (Docker Hub).
    pub library_prefix: bool,
    /// Largest object fetched from this upstream; larger ones are refused, not stored.
    pub max_object_size: Option<u64>,
    /// Reached through a parent tender: every `/v2/<name>/...` request carries `ns=<this>`.
    pub ns_param: Option<String>,
    /// Client certificate and key (PEM) presented to the endpoints (a parent with mutual TLS).
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

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
    /// How old a tag mapping may be and still be served while the upstream is down.
    pub stale_max_age: Duration,
    /// Upstream fills running at once; more wait for a slot (None: no limit).
    pub max_concurrent_fills: Option<usize>,
    /// Upstream fills running at once per upstream (None: only the global limit), so one slow
    /// or hostile upstream cannot hold every slot.
    pub max_fills_per_upstream: Option<usize>,
    /// A fill nobody reads or waits for (every client gone, not a prefetch) is cancelled after
    /// this long.
    pub abandoned_fill_grace: Duration,
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
            stale_max_age: Duration::from_secs(7 * 24 * 3600),
            max_concurrent_fills: Some(64),
            max_fills_per_upstream: Some(32),
            abandoned_fill_grace: Duration::from_secs(60),
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
