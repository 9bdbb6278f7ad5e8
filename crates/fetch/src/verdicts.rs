//! The signature policy in force and the verdicts this process has seen: below the mirror,
//! which consults them on every manifest (`verify` holds the checks themselves).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
