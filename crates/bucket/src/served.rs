//! Last-served records: each replica notes in memory which objects it served (from its data
//! directory or from the bucket) and when, and flushes them in batches ([`Bucket::spawn_flusher`],
//! and at shutdown) to `served/<replica>/<shard>.json`, one record per first hex digit of the
//! digest (16 shards; only the shards with news are rewritten). A record maps digest to the last
//! time (seconds since the Unix epoch) the replica served it, newest kept; at most
//! [`SERVED_PER_SHARD`] entries, the oldest dropped beyond. `tender gc --bucket` merges every
//! replica's records (newest per digest) to evict the least recently served objects.
//!
//! Noting is a map insert; a flush that fails (the bucket is down) keeps its entries for the
//! next flush and never blocks a request.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::PutMode;
use serde::{Deserialize, Serialize};
use tender_oci::Digest;

use crate::{Bucket, BucketError};

/// Entries one shard record keeps at most (16 shards: 65536 objects per replica).
pub const SERVED_PER_SHARD: usize = 4096;
/// Digests noted between two flushes at most; further ones wait for a later request.
const MAX_PENDING: usize = 16 * SERVED_PER_SHARD;

/// `served/<replica>/<shard>.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ServedRecord {
    pub replica: String,
    /// Digest (`sha256:<hex>`) → seconds since the Unix epoch.
    pub served: BTreeMap<String, u64>,
}

/// The shard of a digest: the first hex digit of its hash.
fn shard(d: &Digest) -> char {
    d.hex().chars().next().unwrap_or('0')
}

/// Keep the newest `cap` entries (ties: the smaller digest goes first, so the result does not
/// depend on map order).
pub(crate) fn cap_entries(served: &mut BTreeMap<String, u64>, cap: usize) {
    if served.len() <= cap {
        return;
    }
    let mut by_age: Vec<(u64, String)> = served.iter().map(|(d, t)| (*t, d.clone())).collect();
    by_age.sort();
    let drop = served.len() - cap;
    for (_, d) in by_age.into_iter().take(drop) {
        served.remove(&d);
    }
}

impl Bucket {
    /// A path part may not hold `/`: a replica name with one is recorded under `_`.
    fn served_path(&self, shard: char) -> ObjectPath {
        let replica = self.settings.replica.replace('/', "_");
        self.path(&format!("served/{replica}/{shard}.json"))
    }

    /// Note that this replica served `d` now (a map insert; flushed later).
    pub fn note_served(&self, d: &Digest) {
        self.note_served_at(d, tender_store::now_secs());
    }

    /// [`Bucket::note_served`] at `secs` (seconds since the Unix epoch).
    pub fn note_served_at(&self, d: &Digest, secs: u64) {
        let Ok(mut pending) = self.served.lock() else { return };
        if pending.len() >= MAX_PENDING && !pending.contains_key(d) {
            return;
        }
        let t = pending.entry(*d).or_insert(secs);
        *t = (*t).max(secs);
    }

    /// Put entries back after a failed flush (newest kept).
    fn requeue(&self, entries: impl IntoIterator<Item = (Digest, u64)>) {
        for (d, t) in entries {
            self.note_served_at(&d, t);
        }
    }

    /// Write what this replica served since the last flush to its records: each shard with news
    /// is read, merged (newest per digest), capped and rewritten. On a failure the unwritten
    /// entries stay for the next flush. Returns the number of shards written.
    pub async fn flush_served(&self) -> Result<usize, BucketError> {
        self.flush_served_capped(SERVED_PER_SHARD).await
    }

    pub(crate) async fn flush_served_capped(&self, cap: usize) -> Result<usize, BucketError> {
        let pending: HashMap<Digest, u64> = match self.served.lock() {
            Ok(mut p) => std::mem::take(&mut *p),
            Err(_) => return Ok(0),
        };
        let mut shards: BTreeMap<char, Vec<(Digest, u64)>> = BTreeMap::new();
        for (d, t) in pending {
            shards.entry(shard(&d)).or_default().push((d, t));
        }
        let mut written = 0;
        let mut shards = shards.into_iter();
        while let Some((s, entries)) = shards.next() {
            if let Err(e) = self.flush_shard(s, &entries, cap).await {
                self.requeue(entries);
                self.requeue(shards.flat_map(|(_, e)| e));
                return Err(e);
            }
            written += 1;
        }
        Ok(written)
    }

    async fn flush_shard(&self, s: char, entries: &[(Digest, u64)], cap: usize) -> Result<(), BucketError> {
        let p = self.served_path(s);
        let mut record = match self.get_json::<ServedRecord>(&p).await {
            Ok(Some(r)) => r,
            Ok(None) => ServedRecord::default(),
            // Ours to rewrite: a record that does not parse is replaced.
            Err(e) if e.is_corrupt() => ServedRecord::default(),
            Err(e) => return Err(e),
        };
        record.replica = self.settings.replica.clone();
        for (d, t) in entries {
            let v = record.served.entry(d.to_string()).or_insert(*t);
            *v = (*v).max(*t);
        }
        cap_entries(&mut record.served, cap);
        self.put_json(&p, &record, PutMode::Overwrite).await
    }

    /// Every replica's records merged: digest → the last time any replica served it. Records
    /// that do not parse are skipped (logged). Not gated by the breaker (`tender gc`'s question).
    pub(crate) async fn served_times(&self) -> Result<HashMap<Digest, u64>, BucketError> {
        let dir = self.path("served");
        let metas: Vec<_> = match self.timed("list", &dir, self.store.list(Some(&dir)).try_collect::<Vec<_>>()).await? {
            Ok(m) => m,
            Err(e) => return Err(self.store_err("list", &dir, e)),
        };
        let mut merged: HashMap<Digest, u64> = HashMap::new();
        for meta in metas {
            let record = match self.get_json_via::<ServedRecord>(&meta.location, false).await {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) if e.is_corrupt() => {
                    tracing::warn!(record = %meta.location, error = %e, "served record skipped");
                    continue;
                }
                Err(e) => return Err(e),
            };
            for (d, t) in record.served {
                let Ok(d) = d.parse::<Digest>() else { continue };
                let v = merged.entry(d).or_insert(t);
                *v = (*v).max(t);
            }
        }
        Ok(merged)
    }

    /// Flush the served records every `every` until the bucket is dropped (a flush with nothing
    /// noted asks nothing; one that fails keeps its entries for the next).
    pub fn spawn_flusher(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let every = every.max(Duration::from_millis(10));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(b) = weak.upgrade() else { return };
                if b.served.lock().map(|p| p.is_empty()).unwrap_or(true) {
                    continue;
                }
                match b.flush_served().await {
                    Ok(_) => {}
                    Err(e) if e.is_down() => {}
                    Err(e) => {
                        tracing::debug!(bucket = %b.settings.bucket, error = %e, "served records not flushed; next time")
                    }
                }
            }
        })
    }
}
