//! The signature policy in force and the verdicts this process has seen: below the mirror,
//! which consults them on every manifest (`verify` holds the checks themselves).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, Shared};
use serde::Serialize;

use crate::error::FetchError;

use tender_oci::Digest;
use tender_verify::Policy;

/// Verdicts kept in memory before the map is cleared (then read from disk again).
const VERDICT_CACHE: usize = 65536;

/// The policy in force and the verdicts of this process.
#[derive(Default)]
pub(crate) struct Verification {
    policy: std::sync::RwLock<Arc<Policy>>,
    /// digest -> the fingerprint it verified under.
    verdicts: Mutex<HashMap<Digest, String>>,
    /// The last hour's decisions, newest first (at most `RECENT_DECISIONS`).
    recent: Mutex<VecDeque<Decision>>,
    /// Verifications running, by digest, rule fingerprint and upstream.
    pub(crate) flights: Mutex<HashMap<String, VerifyFlight>>,
}

pub(crate) type VerifyFlight = Shared<BoxFuture<'static, Result<(), FetchError>>>;

/// Takes a verification off the map when its waiter is done or gone.
pub(crate) struct Leave<'a> {
    pub verification: &'a Verification,
    pub key: &'a str,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        if let Ok(mut flights) = self.verification.flights.lock() {
            flights.remove(self.key);
        }
    }
}

/// Decisions kept for `/api/v1/fills` and the status page.
const RECENT_DECISIONS: usize = 1000;
const RECENT_SECS: u64 = 3600;

/// One decision of the signature policy on a manifest: what `/api/v1/fills` lists under
/// `verifications` and the status page shows (the verification provenance Talos shows as its
/// `verified` label).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub upstream: String,
    /// The normalised `registry/repository`.
    pub image: String,
    /// The manifest's digest (none for a `deny`: nothing was asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// `imageVerification.rules[N] (pattern)`.
    pub rule: String,
    /// `verified`, `unsigned`, `invalid`, `mismatch`, `unavailable` or `denied`.
    pub result: String,
    /// `key`, `keyless` or `parent` when verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The key's fingerprint or the certificate's subject.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// Rekor's integrated time (keyless).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed_at: Option<u64>,
    /// Why it was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When tender decided (Unix seconds).
    pub at: u64,
}

impl Verification {
    pub(crate) fn policy(&self) -> Arc<Policy> {
        self.policy.read().map(|p| p.clone()).unwrap_or_default()
    }

    pub(crate) fn set(&self, policy: Arc<Policy>) {
        if let Ok(mut p) = self.policy.write() {
            *p = policy;
        }
    }

    /// Note a decision for `/api/v1/fills` and the status page.
    pub(crate) fn record(&self, d: Decision) {
        if let Ok(mut r) = self.recent.lock() {
            let horizon = d.at.saturating_sub(RECENT_SECS);
            r.push_front(d);
            r.truncate(RECENT_DECISIONS);
            while r.back().is_some_and(|x| x.at < horizon) {
                r.pop_back();
            }
        }
    }

    /// The last hour's decisions, newest first.
    pub(crate) fn recent(&self, now: u64) -> Vec<Decision> {
        let horizon = now.saturating_sub(RECENT_SECS);
        self.recent.lock().map(|r| r.iter().filter(|d| d.at >= horizon).cloned().collect()).unwrap_or_default()
    }

    pub(crate) fn remembered(&self, digest: &Digest, fingerprint: &str) -> bool {
        self.verdicts.lock().is_ok_and(|m| m.get(digest).is_some_and(|f| f == fingerprint))
    }

    pub(crate) fn remember(&self, digest: Digest, fingerprint: &str) {
        if let Ok(mut m) = self.verdicts.lock() {
            if m.len() >= VERDICT_CACHE {
                m.clear();
            }
            m.insert(digest, fingerprint.to_string());
        }
    }
}

pub(crate) fn result_label(result: &str) -> Vec<(String, String)> {
    vec![("result".to_string(), result.to_string())]
}
