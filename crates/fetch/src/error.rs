//! Fetch errors that know where they came from and whether a retry makes sense.
//! The retry policy reads these fields, never the message.

use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchErrorKind {
    /// The upstream said the object does not exist (404).
    NotFound,
    /// The upstream refused our credentials (401 after auth) or forbade access (403).
    Unauthorized,
    /// 429 from the upstream.
    TooManyRequests,
    /// Any other non-success status from the upstream (5xx and odd 4xx).
    Status,
    /// Could not connect, DNS, TLS, reset before headers.
    Connect,
    /// No headers or no body bytes within the configured timeout.
    Timeout,
    /// The body broke off: reset, truncated, longer than announced.
    Body,
    /// The bytes are wrong: digest mismatch, a restarted transfer that differs, bad manifest.
    Corrupt,
    /// A redirect or auth realm that the address policy refuses.
    Refused,
    /// The body's completeness cannot be established (no length, no checksummed container).
    Unverifiable,
    /// Larger than the upstream's `maxObjectSize`.
    TooLarge,
    /// Our own side failed: I/O in the data directory, an internal error.
    Local,
    /// The data directory's file system is full (ENOSPC, EDQUOT) and the answer needed a write.
    NoSpace,
    /// The upstream is configured `offline`: it was not asked.
    Offline,
    /// The client must present an identity: the upstream's content goes to authenticated
    /// clients only. Nothing was asked or looked up.
    Unauthenticated,
    /// The signature policy (`imageVerification`) refuses the manifest: a `deny` rule, or a
    /// verifying rule whose signature is missing, invalid or someone else's (403 DENIED).
    Unverified,
}

/// An error on the way to or from an upstream.
#[derive(Debug, Clone)]
pub struct FetchError {
    pub kind: FetchErrorKind,
    pub upstream: String,
    pub message: String,
    /// Upstream status when there was one.
    pub status: Option<u16>,
    /// A `Retry-After` the upstream sent.
    pub retry_after: Option<Duration>,
    /// The class of a transport failure (DNS, connect, TLS, ...), when it is known.
    pub cause: Option<Cause>,
}

impl FetchError {
    pub fn new(kind: FetchErrorKind, upstream: &str, message: impl Into<String>) -> FetchError {
        FetchError {
            kind,
            upstream: upstream.to_string(),
            message: message.into(),
            status: None,
            retry_after: None,
            cause: None,
        }
    }

    /// A failure of the data directory on the way to an answer from `upstream`: `NoSpace`
    /// when its file system is full, else `Local`. The message names the data directory.
    pub fn store(upstream: &str, e: &tender_store::StoreError) -> FetchError {
        let kind = if e.is_disk_full() { FetchErrorKind::NoSpace } else { FetchErrorKind::Local };
        FetchError::new(kind, upstream, e.to_string())
    }

    /// Whether this failure is tender's own (its data directory, an internal error), not the
    /// upstream's.
    pub fn is_local(&self) -> bool {
        matches!(self.kind, FetchErrorKind::Local | FetchErrorKind::NoSpace)
    }

    pub fn with_status(mut self, status: u16) -> FetchError {
        self.status = Some(status);
        self
    }

    /// Whether trying again (after a backoff) could succeed.
    pub fn is_retryable(&self) -> bool {
        match self.kind {
            FetchErrorKind::TooManyRequests
            | FetchErrorKind::Connect
            | FetchErrorKind::Timeout
            | FetchErrorKind::Body => true,
            FetchErrorKind::Status => self.status.is_none_or(|s| s >= 500 || s == 408),
            FetchErrorKind::NotFound
            | FetchErrorKind::Unauthorized
            | FetchErrorKind::Corrupt
            | FetchErrorKind::Refused
            | FetchErrorKind::Unverifiable
            | FetchErrorKind::TooLarge
            | FetchErrorKind::Offline
            | FetchErrorKind::Unauthenticated
            | FetchErrorKind::Unverified
            | FetchErrorKind::Local
            | FetchErrorKind::NoSpace => false,
        }
    }

    /// Whether the upstream could not be asked at all or failed (vs a definite answer):
    /// the cases where stale content may be served instead.
    pub fn is_upstream_down(&self) -> bool {
        matches!(
            self.kind,
            FetchErrorKind::Connect | FetchErrorKind::Timeout | FetchErrorKind::Body | FetchErrorKind::TooManyRequests
        ) || (self.kind == FetchErrorKind::Status && self.status.is_none_or(|s| s >= 500))
    }

    /// Whether the upstream could not be asked (down, or configured offline): a cached tag or
    /// listing may then be served stale.
    pub fn is_unreachable(&self) -> bool {
        self.is_upstream_down() || self.kind == FetchErrorKind::Offline
    }

    pub(crate) fn from_reqwest(upstream: &str, e: &reqwest::Error) -> FetchError {
        let kind = if e.is_timeout() {
            FetchErrorKind::Timeout
        } else if e.is_redirect() {
            FetchErrorKind::Refused
        } else if e.is_body() || e.is_decode() {
            FetchErrorKind::Body
        } else {
            FetchErrorKind::Connect
        };
        // The chain carries the useful part (connection refused, policy refusal); the URL is
        // left out (messages reach clients; the caller logs it).
        let bare = reqwest_without_url(e);
        let mut message = bare;
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        let mut out = FetchError::new(kind, upstream, message);
        out.cause = Some(Cause::of_reqwest(e));
        out
    }
}

/// A reqwest error's own message without the URL it carries.
fn reqwest_without_url(e: &reqwest::Error) -> String {
    let text = e.to_string();
    match e.url() {
        Some(u) => text.replace(&format!(" ({u})"), "").replace(u.as_str(), "<url>"),
        None => text,
    }
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_local() {
            // Not the upstream's doing: say so, and name the place (the message names the data
            // directory when it is about it).
            write!(f, "tender itself (on the way to upstream {}): {}", self.upstream, self.message)
        } else {
            write!(f, "upstream {}: {}", self.upstream, self.message)
        }
    }
}

impl std::error::Error for FetchError {}

/// Why a request to an upstream failed, in classes an operator can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    /// The name did not resolve (or resolved only to refused addresses).
    Dns,
    /// No TCP connection (refused, unreachable, reset before an answer).
    Connect,
    /// The TLS handshake failed (certificate, protocol).
    Tls,
    /// No answer (or no body bytes) in time.
    Timeout,
    /// The upstream answered with a status that makes it unusable (5xx, 429).
    Http,
    /// The body broke off.
    Body,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Dns => "dns",
            Cause::Connect => "connect",
            Cause::Tls => "tls",
            Cause::Timeout => "timeout",
            Cause::Http => "http",
            Cause::Body => "body",
        }
    }

    /// The class of an error that makes an upstream count as down.
    pub fn of(e: &FetchError) -> Cause {
        if let Some(c) = e.cause {
            return c;
        }
        match e.kind {
            FetchErrorKind::Timeout => Cause::Timeout,
            FetchErrorKind::Status | FetchErrorKind::TooManyRequests => Cause::Http,
            FetchErrorKind::Body => Cause::Body,
            _ => Cause::Connect,
        }
    }

    /// The class of a reqwest failure, from its source chain: a `rustls::Error` anywhere is
    /// TLS; hyper-util's resolver failure ("dns error") is DNS.
    pub(crate) fn of_reqwest(e: &reqwest::Error) -> Cause {
        if e.is_timeout() {
            return Cause::Timeout;
        }
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            if s.is::<rustls::Error>() {
                return Cause::Tls;
            }
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                // reqwest wraps the TLS connector's io::Error in another one.
                let mut cur = io;
                loop {
                    if cur.kind() == std::io::ErrorKind::TimedOut {
                        return Cause::Timeout;
                    }
                    let Some(inner) = cur.get_ref() else { break };
                    if inner.is::<rustls::Error>() {
                        return Cause::Tls;
                    }
                    let Some(next) = inner.downcast_ref::<std::io::Error>() else { break };
                    cur = next;
                }
            }
            // hyper-util's ConnectError for a failed resolution; its type is private.
            if s.to_string().starts_with("dns error") {
                return Cause::Dns;
            }
            source = s.source();
        }
        if e.is_body() || e.is_decode() {
            Cause::Body
        } else {
            Cause::Connect
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
