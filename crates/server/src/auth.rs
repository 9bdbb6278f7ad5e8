//! Who is asking: client authentication for pulls (htpasswd bcrypt users, static bearer tokens,
//! verified client certificates) and the admin token. Off unless configured.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use crate::error::ApiError;
use crate::AppState;

/// Shortest static token accepted: anything shorter can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;
/// bcrypt is slow on purpose; this many checks run at once, so wrong passwords cannot take
/// every core.
const BCRYPT_PARALLEL: usize = 2;
/// Checks waiting for a bcrypt slot at most; more are refused at once (429).
const BCRYPT_QUEUE: usize = 16;
/// Longest a check waits for a bcrypt slot before it is refused (429).
const BCRYPT_WAIT: Duration = Duration::from_secs(2);
/// Failed authentications one client address may have per [`FAILURE_WINDOW`]; beyond, its
/// attempts are refused (429) without running bcrypt, except credentials already verified.
const FAILURES_PER_ADDRESS: u32 = 10;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered for the failure limit (memory stays bounded under address spraying).
const FAILURE_ADDRESSES: usize = 65_536;
/// Verified credentials remembered, so a client sending Basic on every request pays bcrypt once.
const VERIFIED_CACHE: usize = 4096;
/// Checks one client address may have waiting for or holding a bcrypt slot: a flood from a few
/// addresses cannot fill the queue by itself.
const BCRYPT_PER_ADDRESS: usize = 2;
/// A user who logged in within this long goes ahead of unknown ones (its own slot and queue).
const KNOWN_USER_FOR: Duration = Duration::from_secs(3600);
/// Users remembered as having logged in lately.
const KNOWN_USERS: usize = 4096;
/// Checks of such users waiting at most (their lane's queue).
const KNOWN_QUEUE: usize = 16;

/// Who a request authenticated as; put in the request's extensions by [`layer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// No credentials (allowed only with `anonymousPull`, or when auth is off).
    Anonymous,
    /// An htpasswd user.
    User(String),
    /// A static bearer token.
    Token,
    /// A client certificate verified against `--tls-client-ca`.
    Certificate,
    /// The admin token.
    Admin,
}

impl Identity {
    pub fn is_authenticated(&self) -> bool {
        !matches!(self, Identity::Anonymous)
    }
}

/// Set by the connection layer on requests that came over TLS with a verified client certificate.
#[derive(Debug, Clone, Copy)]
pub struct VerifiedClientCert;

/// Client authentication: htpasswd users and/or static tokens.
pub struct ClientAuth {
    users: HashMap<String, String>,
    /// sha256 of each token: compared in constant time, never kept in the clear.
    tokens: Vec<[u8; 32]>,
    anonymous_pull: bool,
    verified: Mutex<HashSet<[u8; 32]>>,
    bcrypt_slots: Semaphore,
    /// Checks waiting for (or holding) a bcrypt slot.
    bcrypt_queued: AtomicUsize,
    /// A slot of its own for users who logged in lately, so a flood of unknown or wrong
    /// credentials never keeps them out (they may take a general slot too).
    known_slot: Semaphore,
    known_queued: AtomicUsize,
    /// Users who logged in lately, and when (carried over a reload).
    known_users: Mutex<HashMap<String, Instant>>,
    /// Checks in the queue per client address.
    queued_by_address: Mutex<HashMap<IpAddr, usize>>,
    /// What an unknown user's password is checked against, at the users' own cost, so an
    /// unknown user takes as long as a wrong password.
    decoy: Option<String>,
    /// Failed authentications per client address in the current window.
    failures: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

/// The outcome of checking presented credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// Wrong user, password or token.
    Refused,
    /// The address failed too often lately; no check was run.
    RateLimited,
    /// The bcrypt queue is full or the wait for a slot timed out; no check was run.
    Busy,
}

/// A file that cannot be used, with the reason (the caller names the flag or key).
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct AuthFileError {
    pub path: String,
    pub message: String,
}

fn file_err(path: &Path, message: impl Into<String>) -> AuthFileError {
    AuthFileError { path: path.display().to_string(), message: message.into() }
}

fn sha(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// The mode of a secret file that users other than its owner's group may read (`o+r`), if it
/// is one: a password or token file should be 0600 or 0640.
pub fn readable_by_others(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (mode & 0o004 != 0).then_some(mode & 0o7777)
}

/// Warn (once per read) that a secret file is readable by every user of the host.
pub fn warn_if_exposed(path: &Path, what: &str) {
    if let Some(mode) = readable_by_others(path) {
        tracing::warn!(
            file = %path.display(),
            mode = format!("{mode:04o}"),
            "{what} is readable by every user of this host; chmod 0600 it (or 0640 with tender's group)"
        );
    }
}

/// Read a token file: one token per line, `#` comments and blank lines ignored.
pub fn read_tokens(path: &Path) -> Result<Vec<String>, AuthFileError> {
    warn_if_exposed(path, "the token file");
    let text = std::fs::read_to_string(path).map_err(|e| file_err(path, format!("cannot read: {e}")))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if t.len() < MIN_TOKEN_LEN || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(file_err(
                path,
                format!(
                    "line {}: a token must be at least {MIN_TOKEN_LEN} characters without spaces \
                     (make one with: openssl rand -hex 32)",
                    i + 1
                ),
            ));
        }
        out.push(t.to_string());
    }
    if out.is_empty() {
        return Err(file_err(path, "holds no token; write one per line (openssl rand -hex 32)"));
    }
    Ok(out)
}

/// Read an htpasswd file; only bcrypt entries (`htpasswd -B`) are accepted.
pub fn read_htpasswd(path: &Path) -> Result<HashMap<String, String>, AuthFileError> {
    warn_if_exposed(path, "the htpasswd file");
    let text = std::fs::read_to_string(path).map_err(|e| file_err(path, format!("cannot read: {e}")))?;
    let mut users = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let Some((user, hash)) = l.split_once(':') else {
            return Err(file_err(path, format!("line {}: not user:hash", i + 1)));
        };
        if user.is_empty() {
            return Err(file_err(path, format!("line {}: empty user name", i + 1)));
        }
        // Parse the hash, don't run it: a bcrypt check per user would slow every start and reload.
        if !(hash.starts_with("$2y$") || hash.starts_with("$2b$") || hash.starts_with("$2a$"))
            || hash.parse::<bcrypt::HashParts>().is_err()
        {
            return Err(file_err(
                path,
                format!("line {}: user {user:?}: only bcrypt hashes are accepted; create it with htpasswd -B", i + 1),
            ));
        }
        if users.insert(user.to_string(), hash.to_string()).is_some() {
            return Err(file_err(path, format!("line {}: user {user:?} appears twice", i + 1)));
        }
    }
    if users.is_empty() {
        return Err(file_err(path, "holds no user; add one with htpasswd -B"));
    }
    Ok(users)
}

impl ClientAuth {
    pub fn new(users: HashMap<String, String>, tokens: &[String], anonymous_pull: bool) -> ClientAuth {
        // The decoy costs what the users cost (the highest, if they differ): one bcrypt run at
        // start and reload.
        let cost = users.values().filter_map(|h| h.parse::<bcrypt::HashParts>().ok()).map(|p| p.get_cost()).max();
        let decoy = cost.and_then(|c| bcrypt::hash("tender-decoy", c).ok());
        ClientAuth {
            users,
            tokens: tokens.iter().map(|t| sha(t.as_bytes())).collect(),
            anonymous_pull,
            verified: Mutex::new(HashSet::new()),
            bcrypt_slots: Semaphore::new(BCRYPT_PARALLEL),
            bcrypt_queued: AtomicUsize::new(0),
            known_slot: Semaphore::new(1),
            known_queued: AtomicUsize::new(0),
            known_users: Mutex::new(HashMap::new()),
            queued_by_address: Mutex::new(HashMap::new()),
            decoy,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Keep what the running configuration learned in the one that replaces it on a reload:
    /// who logged in lately (the users that still exist) and which addresses failed lately (a
    /// reload must not hand a flood a fresh budget).
    pub fn inherit(&self, old: &ClientAuth) {
        if std::ptr::eq(self, old) {
            return;
        }
        {
            let theirs = old.known_users.lock().unwrap_or_else(|p| p.into_inner());
            let mut mine = self.known_users.lock().unwrap_or_else(|p| p.into_inner());
            mine.extend(theirs.iter().filter(|(u, _)| self.users.contains_key(*u)).map(|(u, t)| (u.clone(), *t)));
        }
        let theirs = old.failures.lock().unwrap_or_else(|p| p.into_inner());
        let mut mine = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        mine.extend(theirs.iter().filter(|(_, (_, since))| since.elapsed() < FAILURE_WINDOW).map(|(ip, f)| (*ip, *f)));
    }

    /// Whether `user` logged in successfully within [`KNOWN_USER_FOR`].
    fn known_user(&self, user: &str) -> bool {
        let known = self.known_users.lock().unwrap_or_else(|p| p.into_inner());
        known.get(user).is_some_and(|t| t.elapsed() < KNOWN_USER_FOR)
    }

    fn logged_in(&self, user: &str) {
        let mut known = self.known_users.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= KNOWN_USERS && !known.contains_key(user) {
            known.retain(|_, t| t.elapsed() < KNOWN_USER_FOR);
            if known.len() >= KNOWN_USERS {
                return;
            }
        }
        known.insert(user.to_string(), Instant::now());
    }

    /// Whether `ip` failed too often in the current window.
    fn limited(&self, ip: Option<IpAddr>) -> bool {
        let Some(ip) = ip else { return false };
        let f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.get(&ip).is_some_and(|(n, since)| *n >= FAILURES_PER_ADDRESS && since.elapsed() < FAILURE_WINDOW)
    }

    /// Count a failed authentication from `ip`.
    fn failed(&self, ip: Option<IpAddr>) {
        let Some(ip) = ip else { return };
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if f.len() >= FAILURE_ADDRESSES && !f.contains_key(&ip) {
            f.retain(|_, (_, since)| since.elapsed() < FAILURE_WINDOW);
            if f.len() >= FAILURE_ADDRESSES {
                // Still full within one window: forget the oldest half rather than grow.
                let mut ages: Vec<Instant> = f.values().map(|(_, s)| *s).collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                f.retain(|_, (_, since)| *since > cut);
            }
        }
        let e = f.entry(ip).or_insert((0, Instant::now()));
        if e.1.elapsed() >= FAILURE_WINDOW {
            *e = (0, Instant::now());
        }
        e.0 = e.0.saturating_add(1);
    }

    /// Check a bearer token (cheap, constant time): `Accepted`, `Refused`, or `RateLimited`
    /// for a wrong one from an address over its failure limit.
    pub fn bearer_verdict(&self, token: &str, ip: Option<IpAddr>) -> Verdict {
        if self.token_ok(token) {
            return Verdict::Accepted;
        }
        let limited = self.limited(ip);
        self.failed(ip);
        if limited {
            Verdict::RateLimited
        } else {
            Verdict::Refused
        }
    }

    /// Check Basic credentials: a credential already verified passes at once (never limited);
    /// otherwise an address over its failure limit, a full bcrypt queue or a long wait for a
    /// slot are refused without running bcrypt.
    pub async fn basic_verdict(&self, user: &str, password: &str, ip: Option<IpAddr>) -> Verdict {
        let known = self.users.get(user);
        if let Some(hash) = known {
            let key = sha(format!("{user}\0{password}\0{hash}").as_bytes());
            if self.verified.lock().unwrap_or_else(|p| p.into_inner()).contains(&key) {
                return Verdict::Accepted;
            }
        }
        if self.limited(ip) {
            self.failed(ip);
            return Verdict::RateLimited;
        }
        let ahead = known.is_some() && self.known_user(user);
        let ok = match self.bcrypt(known.or(self.decoy.as_ref()), password, ip, ahead).await {
            None => {
                // A refusal for want of a slot counts against its address, like a failure.
                self.failed(ip);
                return Verdict::Busy;
            }
            Some(ok) => ok && known.is_some(),
        };
        if ok {
            self.logged_in(user);
            if let Some(hash) = known {
                let key = sha(format!("{user}\0{password}\0{hash}").as_bytes());
                let mut v = self.verified.lock().unwrap_or_else(|p| p.into_inner());
                if v.len() >= VERIFIED_CACHE {
                    v.clear();
                }
                v.insert(key);
            }
            Verdict::Accepted
        } else {
            self.failed(ip);
            Verdict::Refused
        }
    }

    /// Run bcrypt on the bounded pool: `None` when the queue is full, the address has its share
    /// of it already, or no slot came in time. `ahead`: a user who logged in lately, in a lane
    /// of its own (its own queue, its own slot or a general one, whichever comes first).
    async fn bcrypt(&self, hash: Option<&String>, password: &str, ip: Option<IpAddr>, ahead: bool) -> Option<bool> {
        let hash = hash?.clone();
        struct Queued<'a>(&'a AtomicUsize);
        impl Drop for Queued<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        struct Share<'a>(&'a Mutex<HashMap<IpAddr, usize>>, Option<IpAddr>);
        impl Drop for Share<'_> {
            fn drop(&mut self) {
                let Some(ip) = self.1 else { return };
                let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(n) = m.get_mut(&ip) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        m.remove(&ip);
                    }
                }
            }
        }
        let _share = {
            let mut m = self.queued_by_address.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(ip) = ip {
                let n = m.entry(ip).or_insert(0);
                if *n >= BCRYPT_PER_ADDRESS {
                    return None;
                }
                *n = n.saturating_add(1);
            }
            Share(&self.queued_by_address, ip)
        };
        let (queued, cap) = if ahead {
            (&self.known_queued, KNOWN_QUEUE)
        } else {
            (&self.bcrypt_queued, BCRYPT_QUEUE.saturating_add(BCRYPT_PARALLEL))
        };
        if queued.fetch_add(1, Ordering::AcqRel) >= cap {
            queued.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let _queued = Queued(queued);
        let slot = async {
            if ahead {
                tokio::select! {
                    s = self.known_slot.acquire() => s,
                    s = self.bcrypt_slots.acquire() => s,
                }
            } else {
                self.bcrypt_slots.acquire().await
            }
        };
        let _slot = tokio::time::timeout(BCRYPT_WAIT, slot).await.ok()?.ok()?;
        let password = password.to_string();
        Some(
            tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
                .await
                .unwrap_or(false),
        )
    }

    /// Whether requests without credentials may pull from upstreams without credentials.
    pub fn anonymous_pull(&self) -> bool {
        self.anonymous_pull
    }

    fn token_ok(&self, token: &str) -> bool {
        let h = sha(token.as_bytes());
        // Check every entry: the time taken does not say which one matched.
        self.tokens.iter().fold(false, |ok, t| ok | bool::from(t.ct_eq(&h)))
    }

    #[cfg(test)]
    async fn basic_ok(&self, user: &str, password: &str) -> bool {
        self.basic_verdict(user, password, None).await == Verdict::Accepted
    }
}

/// The admin token (`--admin-token-file`); its sha256 only.
pub struct AdminToken([u8; 32]);

impl AdminToken {
    pub fn new(token: &str) -> AdminToken {
        AdminToken(sha(token.as_bytes()))
    }

    pub fn matches(&self, token: &str) -> bool {
        bool::from(self.0.ct_eq(&sha(token.as_bytes())))
    }
}

enum Presented {
    None,
    Basic(String, String),
    Bearer(String),
    Malformed,
}

fn presented(headers: &HeaderMap) -> Presented {
    let Some(v) = headers.get(header::AUTHORIZATION) else {
        return Presented::None;
    };
    let Ok(v) = v.to_str() else {
        return Presented::Malformed;
    };
    let (scheme, rest) = v.trim().split_once(' ').unwrap_or((v, ""));
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") && !rest.is_empty() {
        return Presented::Bearer(rest.to_string());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded =
            base64::engine::general_purpose::STANDARD.decode(rest).ok().and_then(|b| String::from_utf8(b).ok());
        if let Some((u, p)) = decoded.as_deref().and_then(|d| d.split_once(':')) {
            return Presented::Basic(u.to_string(), p.to_string());
        }
    }
    Presented::Malformed
}

/// The bearer token of a request, if it sent one.
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    match presented(headers) {
        Presented::Bearer(t) => Some(t),
        _ => None,
    }
}

/// 401 with the Basic challenge containerd, skopeo and podman answer with their credentials.
pub fn challenge(message: &str) -> Response {
    let mut resp = ApiError::new(tender_oci::ErrorCode::Unauthorized, message).into_response();
    resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"tender\""));
    resp
}

/// Paths that answer without credentials: the orchestrator's probes.
fn exempt(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

/// Authenticate a request on a listener that requires it and record its [`Identity`] on it.
/// `Ok(true)` when the request's prefetch headers were dropped (an anonymous client's request
/// is an ordinary pull); `Err` is the answer to send instead.
#[allow(clippy::result_large_err, reason = "the refusal is the response itself, sent at once")]
pub(crate) async fn check(app: &AppState, req: &mut Request) -> Result<bool, Response> {
    let Some(auth) = app.security.auth() else {
        req.extensions_mut().insert(Identity::Anonymous);
        return Ok(false);
    };
    if exempt(req.uri().path()) {
        req.extensions_mut().insert(Identity::Anonymous);
        return Ok(false);
    }
    let cert = req.extensions().get::<VerifiedClientCert>().is_some();
    let ip = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let (identity, verdict) = match presented(req.headers()) {
        Presented::None if cert => (Identity::Certificate, Verdict::Accepted),
        Presented::None => (Identity::Anonymous, Verdict::Accepted),
        Presented::Bearer(t) if app.security.admin.as_ref().is_some_and(|a| a.token.matches(&t)) => {
            (Identity::Admin, Verdict::Accepted)
        }
        Presented::Bearer(t) => (Identity::Token, auth.bearer_verdict(&t, ip)),
        Presented::Basic(u, p) => {
            let v = auth.basic_verdict(&u, &p, ip).await;
            (Identity::User(u), v)
        }
        Presented::Malformed => {
            app.metrics().auth_refusal("malformed");
            app.metrics().auth_failures.inc();
            return Err(challenge("authentication failed: the Authorization header is neither Basic nor Bearer"));
        }
    };
    let mut prefetch_dropped = false;
    if verdict == Verdict::Accepted && identity == Identity::Anonymous {
        // Prefetch and pin are for operators: an anonymous client's request is an ordinary pull.
        for h in ["x-tender-prefetch", "x-tender-pin"] {
            prefetch_dropped |= req.headers_mut().remove(h).is_some();
        }
    }
    match verdict {
        Verdict::Accepted if identity == Identity::Anonymous && !auth.anonymous_pull() => {
            app.metrics().auth_refusal("no_credentials");
            Err(challenge("authentication required"))
        }
        Verdict::Accepted => {
            req.extensions_mut().insert(identity);
            Ok(prefetch_dropped)
        }
        Verdict::Refused => {
            app.metrics().auth_refusal("bad_credentials");
            app.metrics().auth_failures.inc();
            Err(challenge("authentication failed: wrong user name, password or token"))
        }
        Verdict::RateLimited => {
            app.metrics().auth_refusal("rate_limited");
            app.metrics().auth_failures.inc();
            Err(too_many("too many failed authentications from this address; retry later", FAILURE_WINDOW))
        }
        Verdict::Busy => {
            app.metrics().auth_refusal("busy");
            Err(too_many("too many password checks in progress; retry shortly", Duration::from_secs(1)))
        }
    }
}

/// 429 with a `Retry-After`: an authentication that was not checked.
fn too_many(message: &str, retry: Duration) -> Response {
    let mut resp = ApiError::new(tender_oci::ErrorCode::TooManyRequests, message).into_response();
    if let Ok(v) = HeaderValue::from_str(&retry.as_secs().max(1).to_string()) {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// Require the admin token on an admin endpoint; `None` when it was presented.
pub fn require_admin(app: &AppState, headers: &HeaderMap) -> Option<Response> {
    let Some(admin) = &app.security.admin else {
        return Some(StatusCode::NOT_FOUND.into_response());
    };
    match bearer(headers) {
        Some(t) if admin.token.matches(&t) => None,
        _ => {
            let mut resp =
                ApiError::new(tender_oci::ErrorCode::Unauthorized, "this endpoint needs the admin token (Bearer)")
                    .into_response();
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"tender-admin\""));
            Some(resp)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Issue 32 (13): a secret file every user of the host may read is noticed (and warned of).
    #[test]
    fn should_notice_secret_files_that_others_can_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = write(&dir, "tokens", "t0k3n\n");
        for (mode, exposed) in [(0o644, Some(0o644)), (0o604, Some(0o604)), (0o640, None), (0o600, None)] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(readable_by_others(&p), exposed, "mode {mode:o}");
        }
        assert_eq!(readable_by_others(&dir.path().join("absent")), None);
    }

    #[test]
    fn should_accept_bcrypt_entries_and_refuse_others_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let ok = write(&dir, "ok", &format!("# users\n\nalice:{hash}\n"));
        let users = read_htpasswd(&ok).unwrap();
        assert!(users.contains_key("alice"));
        let md5 = write(&dir, "md5", "bob:$apr1$abc$def\n");
        let e = read_htpasswd(&md5).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("htpasswd -B"), "{e}");
        let twice = write(&dir, "twice", &format!("a:{hash}\na:{hash}\n"));
        assert!(read_htpasswd(&twice).unwrap_err().to_string().contains("twice"));
        let empty = write(&dir, "empty", "# nobody\n");
        assert!(read_htpasswd(&empty).unwrap_err().to_string().contains("no user"));
    }

    #[test]
    fn should_refuse_short_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let short = write(&dir, "short", "abc\n");
        assert!(read_tokens(&short).unwrap_err().to_string().contains("at least 16"));
        let ok = write(&dir, "ok", "# ci\n0123456789abcdef0123\n");
        assert_eq!(read_tokens(&ok).unwrap(), ["0123456789abcdef0123"]);
    }

    #[tokio::test]
    async fn should_check_passwords_and_tokens() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let users = HashMap::from([("alice".to_string(), hash)]);
        let auth = ClientAuth::new(users, &["0123456789abcdef0123".to_string()], false);
        assert!(auth.basic_ok("alice", "s3cret").await);
        assert!(auth.basic_ok("alice", "s3cret").await, "second time from the cache");
        assert!(!auth.basic_ok("alice", "wrong").await);
        assert!(!auth.basic_ok("mallory", "s3cret").await);
        assert!(auth.token_ok("0123456789abcdef0123"));
        assert!(!auth.token_ok("0123456789abcdef012"));
        let admin = AdminToken::new("admin-token-0123456789");
        assert!(admin.matches("admin-token-0123456789") && !admin.matches("admin"));
    }
}
