//! Who is asking: client authentication for pulls (htpasswd bcrypt users, static bearer tokens,
//! verified client certificates) and the admin token. Off unless configured.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use crate::error::ApiError;
use crate::AppState;

/// Shortest static token accepted: anything shorter can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;
/// bcrypt is slow on purpose; this many checks run at once, more wait (and are refused after
/// a while), so wrong passwords cannot take every core.
const BCRYPT_PARALLEL: usize = 2;
/// Verified credentials remembered, so a client sending Basic on every request pays bcrypt once.
const VERIFIED_CACHE: usize = 4096;

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

/// Read a token file: one token per line, `#` comments and blank lines ignored.
pub fn read_tokens(path: &Path) -> Result<Vec<String>, AuthFileError> {
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
        ClientAuth {
            users,
            tokens: tokens.iter().map(|t| sha(t.as_bytes())).collect(),
            anonymous_pull,
            verified: Mutex::new(HashSet::new()),
            bcrypt_slots: Semaphore::new(BCRYPT_PARALLEL),
        }
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

    async fn basic_ok(&self, user: &str, password: &str) -> bool {
        let Some(hash) = self.users.get(user).cloned() else {
            return false;
        };
        let key = sha(format!("{user}\0{password}\0{hash}").as_bytes());
        if self.verified.lock().unwrap_or_else(|p| p.into_inner()).contains(&key) {
            return true;
        }
        let Ok(_slot) = self.bcrypt_slots.acquire().await else {
            return false;
        };
        let password = password.to_string();
        let ok = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
            .await
            .unwrap_or(false);
        if ok {
            let mut v = self.verified.lock().unwrap_or_else(|p| p.into_inner());
            if v.len() >= VERIFIED_CACHE {
                v.clear();
            }
            v.insert(key);
        }
        ok
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

/// Authenticate every request on a listener that requires it; record the [`Identity`].
pub async fn layer(State(app): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let Some(auth) = app.security.auth() else {
        req.extensions_mut().insert(Identity::Anonymous);
        return next.run(req).await;
    };
    let cert = req.extensions().get::<VerifiedClientCert>().is_some();
    let identity = match presented(req.headers()) {
        Presented::None if cert => Some(Identity::Certificate),
        Presented::None => Some(Identity::Anonymous),
        Presented::Bearer(t) => {
            if app.security.admin.as_ref().is_some_and(|a| a.token.matches(&t)) {
                Some(Identity::Admin)
            } else if auth.token_ok(&t) {
                Some(Identity::Token)
            } else {
                None
            }
        }
        Presented::Basic(u, p) => auth.basic_ok(&u, &p).await.then_some(Identity::User(u)),
        Presented::Malformed => None,
    };
    let path = req.uri().path().to_string();
    match identity {
        None if !exempt(&path) => {
            app.metrics().auth_failures.inc();
            challenge("authentication failed: wrong user name, password or token")
        }
        Some(Identity::Anonymous) if !auth.anonymous_pull() && !exempt(&path) => challenge("authentication required"),
        other => {
            req.extensions_mut().insert(other.unwrap_or(Identity::Anonymous));
            next.run(req).await
        }
    }
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
