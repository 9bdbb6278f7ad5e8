//! What operators see of fills (issue 20): each fill's progress while it runs, and the fills
//! that ended in the last hour with their outcome. `GET /api/v1/fills` and the status page
//! show these views; `DELETE /api/v1/admin/fills/<id>` cancels a fill by its id.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use sha2::Digest as _;

/// How long an ended fill stays listed, and the most kept (a burst of tiny fills must not grow
/// the list without bound).
pub const RECENT_FOR: Duration = Duration::from_secs(3600);
pub const RECENT_MAX: usize = 1000;

/// A fill's id: stable for its key (a restart from zero keeps it), short, URL-safe.
pub fn fill_id(key: &str) -> String {
    hex::encode(&sha2::Sha256::digest(key.as_bytes())[..8])
}

/// What a fill knows of itself beyond its bytes.
#[derive(Debug)]
pub struct FillInfo {
    pub id: String,
    pub upstream: String,
    /// The upstream path (`/v2/<repo>/blobs/<digest>`, `/image/…`), when the source has one.
    pub path: String,
    pub started: SystemTime,
    pub began: Instant,
    pub retries: AtomicU32,
    /// Readers created so far (clients served, the first included).
    pub served: AtomicU64,
    /// An operator asked to cancel it.
    pub cancelled: AtomicBool,
    pub cancel: tokio::sync::Notify,
}

impl FillInfo {
    pub fn new(key: &str, upstream: &str, path: &str) -> FillInfo {
        FillInfo {
            id: fill_id(key),
            upstream: upstream.to_string(),
            path: path.to_string(),
            started: SystemTime::now(),
            began: Instant::now(),
            retries: AtomicU32::new(0),
            served: AtomicU64::new(0),
            cancelled: AtomicBool::new(false),
            cancel: tokio::sync::Notify::new(),
        }
    }

    /// The same fill started over from zero (a corrupt transfer): same id, start and counts.
    pub fn again(&self) -> FillInfo {
        FillInfo {
            id: self.id.clone(),
            upstream: self.upstream.clone(),
            path: self.path.clone(),
            started: self.started,
            began: self.began,
            retries: AtomicU32::new(self.retries.load(Ordering::Relaxed)),
            served: AtomicU64::new(self.served.load(Ordering::Relaxed)),
            cancelled: AtomicBool::new(self.cancelled.load(Ordering::Relaxed)),
            cancel: tokio::sync::Notify::new(),
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

/// A fill in progress.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FillView {
    pub id: String,
    pub upstream: String,
    /// The digest, or the Image Factory asset key.
    pub object: String,
    pub path: String,
    /// `connecting`, `streaming`, `verified` (being committed).
    pub phase: &'static str,
    pub bytes: u64,
    pub total: Option<u64>,
    /// Average since the fill started, bytes per second.
    pub rate: u64,
    pub eta_seconds: Option<u64>,
    pub retries: u32,
    /// Clients reading it now.
    pub clients: usize,
    /// Clients it has served so far.
    pub served: u64,
    /// Seconds since the epoch.
    pub started_at: u64,
}

/// A fill that ended.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndedFill {
    pub id: String,
    pub upstream: String,
    pub object: String,
    pub path: String,
    /// `committed`, `failed`, `corrupt`, `abandoned` or `cancelled`.
    pub outcome: &'static str,
    pub error: Option<String>,
    pub bytes: u64,
    pub retries: u32,
    pub served: u64,
    pub started_at: u64,
    pub ended_at: u64,
    pub seconds: f64,
    #[serde(skip)]
    pub ended: Option<Instant>,
}

/// `GET /api/v1/fills`.
#[derive(Debug, Clone, Serialize)]
pub struct FillsView {
    pub active: Vec<FillView>,
    /// The last hour's, newest first.
    pub ended: Vec<EndedFill>,
    /// The signature policy's decisions on manifests in the last hour, newest first.
    pub verifications: Vec<crate::verdicts::Decision>,
}

pub fn epoch(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Bytes per second over `elapsed`, and the seconds left at that rate.
pub fn rate_and_eta(bytes: u64, total: Option<u64>, elapsed: Duration) -> (u64, Option<u64>) {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { (bytes as f64 / secs) as u64 } else { 0 };
    let eta = match total {
        Some(t) if rate > 0 && t >= bytes => Some(t.saturating_sub(bytes).div_ceil(rate)),
        _ => None,
    };
    (rate, eta)
}

/// The ended fills of the last hour.
#[derive(Debug, Default)]
pub struct Recent(Mutex<VecDeque<EndedFill>>);

impl Recent {
    pub fn push(&self, e: EndedFill) {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        q.push_front(e);
        q.truncate(RECENT_MAX);
        prune(&mut q);
    }

    pub fn list(&self) -> Vec<EndedFill> {
        let mut q = self.0.lock().unwrap_or_else(|p| p.into_inner());
        prune(&mut q);
        q.iter().cloned().collect()
    }
}

fn prune(q: &mut VecDeque<EndedFill>) {
    while q.back().is_some_and(|e| e.ended.is_some_and(|t| t.elapsed() > RECENT_FOR)) {
        q.pop_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_estimate_rate_and_time_left() {
        assert_eq!(rate_and_eta(50, Some(150), Duration::from_secs(5)), (10, Some(10)));
        assert_eq!(rate_and_eta(50, None, Duration::from_secs(5)), (10, None));
        assert_eq!(rate_and_eta(0, Some(150), Duration::ZERO), (0, None));
        assert_eq!(fill_id("ghcr.io@sha256:ab").len(), 16);
        assert_eq!(fill_id("k"), fill_id("k"));
    }

    #[test]
    fn should_keep_a_bounded_newest_first_list() {
        let r = Recent::default();
        for i in 0..(RECENT_MAX + 5) {
            r.push(EndedFill {
                id: i.to_string(),
                upstream: "u".into(),
                object: "o".into(),
                path: String::new(),
                outcome: "committed",
                error: None,
                bytes: 0,
                retries: 0,
                served: 0,
                started_at: 0,
                ended_at: 0,
                seconds: 0.0,
                ended: Some(Instant::now()),
            });
        }
        let l = r.list();
        assert_eq!(l.len(), RECENT_MAX);
        assert_eq!(l[0].id, (RECENT_MAX + 4).to_string());
    }
}
