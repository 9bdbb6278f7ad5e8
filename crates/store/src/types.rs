//! The records' types: what a JSON record under `tags/`, `meta/`, `known/`, `trust/` and
//! `listings/` holds, and [`now_secs`], the clock they are stamped with. Plain data, below the
//! in-memory copies (`memory`) and the store that reads and writes them (`records`).

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tender_oci::Digest;

/// What a tag pointed to when tender last asked its upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TagRecord {
    pub upstream: String,
    pub repository: String,
    pub tag: String,
    pub digest: Digest,
    pub media_type: String,
    pub size: u64,
    /// Seconds since the Unix epoch when the upstream confirmed this mapping (or, imported,
    /// when the bundle was imported).
    pub fetched_at: u64,
    /// Registered by `tender import`: authoritative, resolved without asking the upstream at
    /// any age, until a later import or `tender tag rm` changes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub imported: bool,
}

impl TagRecord {
    /// Age of the record in seconds (0 if the clock went backwards).
    pub fn age_secs(&self) -> u64 {
        now_secs().saturating_sub(self.fetched_at)
    }
}

/// The sha256 an asset had at its first complete, verified fetch (trust on first use).
/// Never evicted; a later fetch with other bytes is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrustRecord {
    /// What was fetched, e.g. `image:<schematic>/<version>/<asset>`.
    pub key: String,
    pub digest: Digest,
    pub size: u64,
    /// Seconds since the Unix epoch of the first verified fetch.
    pub first_seen: u64,
}

/// A manifest that verified under a rule of the signature policy (`imageVerification`):
/// which rule (by its fingerprint: a changed rule verifies again), whose signature, when.
/// Only successes are recorded; a refusal is never stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerdictRecord {
    pub digest: Digest,
    /// The rule's fingerprint (`sha256:` of the rule as written, and the trusted root).
    pub fingerprint: String,
    /// The rule's place in `imageVerification.rules` and its `image` pattern.
    pub rule: usize,
    pub image: String,
    /// `key`, `keyless`, or `parent` (covered by a verified index).
    pub method: String,
    /// The key's fingerprint or the certificate's subject; for `parent`, the index's.
    pub identity: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// Rekor's integrated time (keyless), seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_at: Option<u64>,
    /// The verified index that covers this manifest (`method: parent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Digest>,
    /// When tender verified it, seconds since the Unix epoch.
    pub verified_at: u64,
}

/// An upstream's last good answer to a listing request (a tag list or referrers page), served
/// while the upstream is down. Keyed by upstream and request: never served through another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListingRecord {
    pub upstream: String,
    /// The upstream-side path and query, e.g. `/v2/library/alpine/tags/list?n=100`.
    pub request: String,
    pub content_type: String,
    /// The upstream's own `Link` and `OCI-Filters-Applied` headers, as it sent them.
    pub link: Option<String>,
    pub filters_applied: Option<String>,
    pub body: String,
    /// The upstream answered 404 (no referrers API: clients fall back to tags); kept so that
    /// the same 404, not an error, is the answer while it is down.
    #[serde(default)]
    pub not_found: bool,
    /// Seconds since the Unix epoch when the upstream gave this answer.
    pub fetched_at: u64,
}

impl ListingRecord {
    /// Age of the record in seconds (0 if the clock went backwards).
    pub fn age_secs(&self) -> u64 {
        now_secs().saturating_sub(self.fetched_at)
    }
}

/// Media type and size of a stored manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestMeta {
    pub media_type: String,
    pub size: u64,
}

pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The upstreams an object is known to exist in: each one served it to tender, or confirmed
/// it with a HEAD by digest. An object without a record is known in no upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KnownRecord {
    pub upstreams: Vec<String>,
}
