//! What an operator needs to know about an upstream: up or down, since when, and why (the
//! cause of the last failure in a class they can act on: DNS, connect, TLS, timeout, an HTTP
//! status). Fed by every request the upstream client sends.

use std::sync::Mutex;

use crate::error::{FetchError, FetchErrorKind};

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

/// The last failure that made an upstream count as down.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastError {
    pub cause: Cause,
    /// The HTTP status, for `http`.
    pub status: Option<u16>,
    /// What happened, without URLs (the log has them).
    pub message: String,
    /// Seconds since the Unix epoch.
    pub at: u64,
}

/// Up, down, or not asked yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Unknown,
    Up,
    Down,
    /// Configured `offline`: never asked.
    Offline,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Unknown => "unknown",
            State::Up => "up",
            State::Down => "down",
            State::Offline => "offline",
        }
    }
}

/// One upstream's health, as `/api/v1/health` and the probe endpoint answer it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    pub name: String,
    pub state: State,
    /// Seconds since the Unix epoch of the last answer that made the upstream count as up.
    pub last_success: Option<u64>,
    pub last_error: Option<LastError>,
    /// Tags and listings served stale because this upstream was unreachable.
    pub stale_served: u64,
}

/// The mutable part, behind a mutex (updated once per upstream request).
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    state: Option<bool>,
    last_success: Option<u64>,
    last_error: Option<LastError>,
}

impl Tracker {
    pub(crate) fn up(&self, now: u64) {
        let mut i = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        i.state = Some(true);
        i.last_success = Some(now);
    }

    pub(crate) fn down(&self, error: LastError) {
        let mut i = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        i.state = Some(false);
        i.last_error = Some(error);
    }

    pub(crate) fn state(&self) -> Option<bool> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).state
    }

    pub(crate) fn report(&self, name: &str, stale_served: u64) -> Health {
        let i = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Health {
            name: name.to_string(),
            state: match i.state {
                None => State::Unknown,
                Some(true) => State::Up,
                Some(false) => State::Down,
            },
            last_success: i.last_success,
            last_error: i.last_error.clone(),
            stale_served,
        }
    }
}
