//! `tender gc --bucket`: a size cap on the bucket, reached by evicting the least recently served
//! objects. Every replica's served records (module `served`) are merged (newest per digest);
//! an object no replica recorded counts as served when it was uploaded (its index's
//! `uploadedAt`). Safe while replicas run: an object under a live fill lease is never evicted,
//! nor one served (or uploaded) within `gcGrace` (a replica may be reading it right now). An
//! eviction deletes the index first, so readers stop seeing the object before its content goes
//! ([`Bucket::remove_object`]); a replica that still holds the object locally keeps serving
//! it, one that does not fetches it from the upstream again.

use std::collections::HashSet;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use serde::{Deserialize, Serialize};
use tender_oci::{Algorithm, Digest};

use crate::lease::{now_ms, LeaseRecord};
use crate::{Bucket, BucketError, ChunkIndex};

/// One object evicted (or, in a dry run, that would be).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictedObject {
    pub digest: String,
    pub size: u64,
    /// Seconds since the Unix epoch: the last time a replica recorded serving it, else its upload.
    pub last_served: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketGcReport {
    pub bucket: String,
    pub max_size: u64,
    pub dry_run: bool,
    pub objects_before: u64,
    pub bytes_before: u64,
    /// What the bucket holds after the run (in a dry run: would hold).
    pub objects_after: u64,
    pub bytes_after: u64,
    /// Least recently served first.
    pub evicted: Vec<EvictedObject>,
    /// Objects kept although the cap asked for them: under a live fill lease.
    pub skipped_under_lease: u64,
    /// Objects kept although the cap asked for them: served or uploaded within `gcGrace`.
    pub skipped_recent: u64,
}

impl BucketGcReport {
    pub fn freed_bytes(&self) -> u64 {
        self.bytes_before.saturating_sub(self.bytes_after)
    }
}

/// The digest a fill key names: `<upstream>@<digest>` (a blob), `manifest:<digest>`; `None`
/// for an Image Factory path (its digest is in its trust record).
pub(crate) fn key_digest(key: &str) -> Option<Digest> {
    if let Some(d) = key.strip_prefix("manifest:") {
        return d.parse().ok();
    }
    key.rsplit_once('@').and_then(|(_, d)| d.parse().ok())
}

impl Bucket {
    async fn list_paths(&self, dir: &str) -> Result<Vec<ObjectPath>, BucketError> {
        let p = self.path(dir);
        match self.timed("list", &p, self.store.list(Some(&p)).try_collect::<Vec<_>>()).await? {
            Ok(m) => Ok(m.into_iter().map(|m| m.location).collect()),
            Err(e) => Err(self.store_err("list", &p, e)),
        }
    }

    /// The objects under a live fill lease at `now` (milliseconds). A lease whose record does
    /// not parse names no object we can find; it is logged.
    async fn leased_objects(&self, now: u64) -> Result<HashSet<Digest>, BucketError> {
        let mut out = HashSet::new();
        for p in self.list_paths("leases").await? {
            if p.filename().is_some_and(|f| f.starts_with(".probe-")) {
                continue;
            }
            let record = match self.get_json_via::<LeaseRecord>(&p, false).await {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) if e.is_corrupt() => {
                    tracing::warn!(lease = %p, error = %e, "fill lease record unreadable; its object is not known");
                    continue;
                }
                Err(e) => return Err(e),
            };
            if record.expires_at <= now {
                continue;
            }
            match key_digest(&record.key) {
                Some(d) => {
                    out.insert(d);
                }
                None => match self.trust(&record.key).await {
                    Ok(Some(t)) => {
                        out.insert(t.digest);
                    }
                    // Not fetched before: nothing in the bucket to protect yet.
                    Ok(None) => {}
                    Err(e) if e.is_corrupt() => {
                        tracing::warn!(key = %record.key, error = %e, "trust record unreadable")
                    }
                    Err(e) => return Err(e),
                },
            }
        }
        Ok(out)
    }

    /// Evict the least recently served objects until the bucket holds at most `max_size`
    /// bytes; with `dry_run`, only report what would go.
    pub async fn gc(&self, max_size: u64, dry_run: bool) -> Result<BucketGcReport, BucketError> {
        self.gc_at(max_size, dry_run, now_ms()).await
    }

    /// [`Bucket::gc`] as at `now` (milliseconds since the Unix epoch).
    pub(crate) async fn gc_at(&self, max_size: u64, dry_run: bool, now: u64) -> Result<BucketGcReport, BucketError> {
        let mut report =
            BucketGcReport { bucket: self.settings.bucket.clone(), max_size, dry_run, ..BucketGcReport::default() };
        let served = self.served_times().await?;
        let mut objects: Vec<(u64, Digest, std::sync::Arc<ChunkIndex>)> = Vec::new();
        for algorithm in Algorithm::ALL {
            for p in self.list_paths(&format!("index/{algorithm}")).await? {
                let Some(hex) = p.filename().and_then(|f| f.strip_suffix(".json")) else { continue };
                let Ok(d) = Digest::from_hex(algorithm, hex) else { continue };
                let index = match self.index(&d).await {
                    Ok(Some(i)) => i,
                    Ok(None) => continue,
                    Err(e) if e.is_corrupt() => {
                        tracing::warn!(digest = %d, error = %e, "index unreadable; left for tender fsck --bucket");
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let last = served.get(&d).copied().unwrap_or(0).max(index.uploaded_at);
                objects.push((last, d, index));
            }
        }
        report.objects_before = objects.len() as u64;
        report.bytes_before = objects.iter().map(|(_, _, i)| i.size).sum();
        report.objects_after = report.objects_before;
        report.bytes_after = report.bytes_before;
        if report.bytes_after <= max_size {
            return Ok(report);
        }
        objects.sort_by_cached_key(|(last, d, _)| (*last, d.to_string()));
        let leased = self.leased_objects(now).await?;
        let grace = self.settings.gc_grace.as_secs();
        let now_secs = now / 1000;
        for (last, d, index) in objects {
            if report.bytes_after <= max_size {
                break;
            }
            if leased.contains(&d) {
                report.skipped_under_lease += 1;
                continue;
            }
            if now_secs.saturating_sub(last) < grace {
                report.skipped_recent += 1;
                continue;
            }
            if !dry_run {
                self.remove_object(&d, &index).await?;
                tracing::info!(bucket = %self.settings.bucket, digest = %d, bytes = index.size, last_served = last,
                    "evicted from the bucket (least recently served)");
            }
            report.bytes_after -= index.size;
            report.objects_after -= 1;
            report.evicted.push(EvictedObject { digest: d.to_string(), size: index.size, last_served: last });
        }
        Ok(report)
    }

    /// Delete one object from the bucket: its index first (readers stop seeing it), then its
    /// content, then its known-upstream records; then forget the cached index. Trust records
    /// stay (they say what an asset's digest is, not that the bucket holds it). Every content
    /// key an index names is deleted here, and only here.
    pub async fn remove_object(&self, d: &Digest, index: &ChunkIndex) -> Result<(), BucketError> {
        self.delete_quietly(&self.index_path(d)).await?;
        self.forget(d);
        match &index.upload {
            // Chunk objects (format 2 index); the whole object of an older tender otherwise.
            Some(upload) => {
                self.remove_parts(upload, false).await?;
            }
            None => self.delete_quietly(&self.object_path(d)).await?,
        }
        for p in self.list_paths(&format!("known/{}/{}", d.algorithm(), d.hex())).await? {
            self.delete_quietly(&p).await?;
        }
        self.forget(d);
        tracing::debug!(bucket = %self.settings.bucket, digest = %d, bytes = index.size, "object removed from the bucket");
        Ok(())
    }

    /// Delete a key; one already gone is fine.
    async fn delete_quietly(&self, p: &ObjectPath) -> Result<(), BucketError> {
        match self.timed("delete", p, self.store.delete(p)).await? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.store_err("delete", p, e)),
        }
    }
}
