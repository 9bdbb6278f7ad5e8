//! What an operator needs to know about an upstream: up or down, since when, and why (the
//! cause of the last failure in a class they can act on: DNS, connect, TLS, timeout, an HTTP
//! status). Fed by every request the upstream client sends.

use std::sync::Mutex;

pub use crate::error::Cause;

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
    /// On a route through the parent tenders: whether `parent.fallbackToUpstream` lets it go
    /// to the upstream itself when no parent answers. Absent on an upstream asked directly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_to_upstream: Option<bool>,
    /// The upstream itself, as the fallback reached it (`requests`: how many went there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Box<Health>>,
    /// Requests sent (on a fallback's report only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
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
            fallback_to_upstream: None,
            fallback: None,
            requests: None,
        }
    }
}
