//! Served statistics: per upstream repository, how often workers pulled it. Requests that
//! identify themselves as prefetch are not counted. The counts survive restarts (the binary
//! saves them to the data directory).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::savings::Savings;

/// The counts of one repository (`<upstream>/<name>`, e.g. `ghcr.io/siderolabs/kubelet`) or
/// OS image (`image-factory/<schematic>/<version>/<asset>`, counted as blobs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RepoServed {
    pub manifest_requests: u64,
    pub blob_requests: u64,
    pub bytes: u64,
    pub hits: u64,
    pub misses: u64,
    /// Seconds since the Unix epoch.
    pub last_served: u64,
}

/// Most repositories counted: a further confirmed one takes the place of the least recently
/// served (the names come from requests, so the map must not grow with them).
pub const MAX_REPOSITORIES: usize = 4096;

/// All repositories' counts, and what tender saved (fetched against served bytes).
#[derive(Debug, Default)]
pub struct Served {
    repos: Mutex<BTreeMap<String, RepoServed>>,
    savings: Mutex<Savings>,
}

/// The file: the repositories' counts and the savings. An older file holds the counts alone.
#[derive(Serialize, Deserialize)]
struct Saved {
    repositories: BTreeMap<String, RepoServed>,
    #[serde(default)]
    savings: Savings,
}

/// What `GET /api/v1/served?repository=…` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServedAnswer {
    pub repository: String,
    pub served: bool,
    #[serde(flatten)]
    pub counts: RepoServed,
}

impl Served {
    /// Count one worker request (never a prefetch). A repository not counted yet is added only
    /// when `confirmed` (its upstream, or an import's tag, vouched for it); at the cap it takes
    /// the place of the least recently served one.
    pub fn record(&self, repository: &str, route: &str, bytes: u64, cache: Option<&str>, now: u64, confirmed: bool) {
        let Ok(mut repos) = self.repos.lock() else { return };
        if !repos.contains_key(repository) {
            if !confirmed || !matches!(route, "manifest" | "blob" | "image") {
                return;
            }
            if repos.len() >= MAX_REPOSITORIES {
                let oldest = repos.iter().min_by_key(|(_, r)| r.last_served).map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    repos.remove(&k);
                }
            }
            repos.insert(repository.to_string(), Default::default());
        }
        let Some(r) = repos.get_mut(repository) else { return };
        match route {
            "manifest" => r.manifest_requests += 1,
            // An OS image is one object, like a blob.
            "blob" | "image" => r.blob_requests += 1,
            _ => return,
        }
        r.bytes += bytes;
        match cache {
            Some("miss") => r.misses += 1,
            Some(_) => r.hits += 1,
            None => {}
        }
        r.last_served = now;
    }

    /// Bring the savings up to date: this run's bytes received per upstream (the
    /// `tender_upstream_bytes` counters), and the bytes served so far.
    pub fn tick_savings(&self, now: u64, fetched_this_run: &BTreeMap<String, u64>) {
        let served: u64 = self.snapshot().values().fold(0u64, |a, r| a.saturating_add(r.bytes));
        if let Ok(mut s) = self.savings.lock() {
            s.tick(now, fetched_this_run, served);
        }
    }

    pub fn savings(&self) -> Savings {
        self.savings.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn get(&self, repository: &str) -> ServedAnswer {
        let counts = self.repos.lock().ok().and_then(|r| r.get(repository).cloned()).unwrap_or_default();
        ServedAnswer { repository: repository.to_string(), served: counts.last_served > 0, counts }
    }

    pub fn snapshot(&self) -> BTreeMap<String, RepoServed> {
        self.repos.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The most-served repositories, by requests.
    pub fn top(&self, n: usize) -> Vec<(String, RepoServed)> {
        self.top_where(n, |_| true)
    }

    /// The most-served repositories among those `keep` admits, by requests.
    pub fn top_where(&self, n: usize, keep: impl Fn(&str) -> bool) -> Vec<(String, RepoServed)> {
        let mut v: Vec<(String, RepoServed)> = self.snapshot().into_iter().filter(|(r, _)| keep(r)).collect();
        v.sort_by(|a, b| {
            (b.1.manifest_requests + b.1.blob_requests)
                .cmp(&(a.1.manifest_requests + a.1.blob_requests))
                .then(a.0.cmp(&b.0))
        });
        v.truncate(n);
        v
    }

    /// Replace the counts with those saved at `path` (a missing file is an empty start).
    pub fn load(&self, path: &Path) -> std::io::Result<()> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let saved = match serde_json::from_slice::<Saved>(&bytes) {
            Ok(s) => s,
            Err(_) => Saved {
                repositories: serde_json::from_slice(&bytes).map_err(std::io::Error::other)?,
                savings: Savings::default(),
            },
        };
        let served = saved.repositories.values().fold(0u64, |a, r| a.saturating_add(r.bytes));
        if let Ok(mut r) = self.repos.lock() {
            *r = saved.repositories;
        }
        if let Ok(mut s) = self.savings.lock() {
            *s = saved.savings.loaded(served);
        }
        Ok(())
    }

    /// Save the counts atomically.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let saved = Saved { repositories: self.snapshot(), savings: self.savings() };
        let bytes = serde_json::to_vec_pretty(&saved).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, &bytes)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_count_and_survive_a_restart() {
        let s = Served::default();
        s.record("ghcr.io/siderolabs/kubelet", "manifest", 500, Some("miss"), 10, true);
        s.record("ghcr.io/siderolabs/kubelet", "blob", 1000, Some("hit"), 11, false);
        s.record("ghcr.io/siderolabs/kubelet", "tags", 1000, None, 12, true);
        let a = s.get("ghcr.io/siderolabs/kubelet");
        assert!(a.served);
        assert_eq!((a.counts.manifest_requests, a.counts.blob_requests, a.counts.bytes), (1, 1, 1500));
        assert_eq!((a.counts.hits, a.counts.misses, a.counts.last_served), (1, 1, 11));
        assert!(!s.get("docker.io/library/alpine").served);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("served.json");
        s.save(&path).unwrap();
        let t = Served::default();
        t.load(&path).unwrap();
        assert_eq!(t.get("ghcr.io/siderolabs/kubelet").counts, a.counts);
        // A file an older tender wrote (the counts alone) still loads.
        std::fs::write(&path, serde_json::to_vec(&s.snapshot()).unwrap()).unwrap();
        let u = Served::default();
        u.load(&path).unwrap();
        assert_eq!(u.get("ghcr.io/siderolabs/kubelet").counts, a.counts);
        let none = u.savings();
        assert!(none.fetched.is_empty() && none.buckets.is_empty(), "{none:?}");
    }

    /// Issue 32 (8): made-up names never enter; at the cap, a confirmed repository takes the
    /// place of the least recently served one.
    #[test]
    fn should_take_only_confirmed_names_and_evict_the_least_recently_served() {
        let s = Served::default();
        s.record("ghcr.io/made/up", "blob", 10, Some("hit"), 1, false);
        assert!(!s.get("ghcr.io/made/up").served, "an unconfirmed name is not counted");
        for i in 0..MAX_REPOSITORIES as u64 {
            s.record(&format!("ghcr.io/r/{i}"), "manifest", 10, Some("miss"), 100 + i, true);
        }
        // Served again lately: not the oldest any more.
        s.record("ghcr.io/r/0", "blob", 10, Some("hit"), 10_000, false);
        s.record("ghcr.io/new/one", "manifest", 10, Some("miss"), 10_001, true);
        let all = s.snapshot();
        assert_eq!(all.len(), MAX_REPOSITORIES);
        assert!(all.contains_key("ghcr.io/new/one") && all.contains_key("ghcr.io/r/0"));
        assert!(!all.contains_key("ghcr.io/r/1"), "the least recently served gave way");
        s.record("ghcr.io/made/up/2", "blob", 10, Some("hit"), 10_002, false);
        assert!(!s.snapshot().contains_key("ghcr.io/made/up/2"));
    }
}
