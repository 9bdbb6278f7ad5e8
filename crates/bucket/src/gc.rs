//! `tender gc --bucket`: a size cap on every byte under the prefix (one listing, sorted by what
//! each key is for: module `books`), reached by removing the strays older than `gcGrace` and
//! then evicting the least recently served objects. Every replica's served records (module `served`) are merged (newest per digest);
//! an object no replica recorded counts as served when it was uploaded (its index's
//! `uploadedAt`). Safe while replicas run: an object under a live fill lease is never evicted,
//! nor one served (or uploaded) within `gcGrace` (a replica may be reading it right now). An
//! eviction deletes the index first, so readers stop seeing the object before its content goes
//! ([`Bucket::remove_object`]); a replica that still holds the object locally keeps serving
//! it, one that does not fetches it from the upstream again.

use std::collections::{HashMap, HashSet};

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use serde::{Deserialize, Serialize};
use tender_oci::Digest;

use crate::books::Stray;
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
    /// Every byte under the prefix, which the cap applies to: the indexed objects' content,
    /// uploads in progress, strays, quarantine and records.
    #[serde(default)]
    pub total_bytes_before: u64,
    /// After the run (in a dry run: would hold).
    #[serde(default)]
    pub total_bytes_after: u64,
    /// Of `totalBytesBefore`: the chunk objects (or whole content) of the indexed objects.
    #[serde(default)]
    pub content_bytes: u64,
    /// Of `totalBytesBefore`: chunks of uploads a progress record names and no index yet.
    #[serde(default)]
    pub in_progress_bytes: u64,
    /// Of `totalBytesBefore`: keys nothing names (chunks of an upload no index or record
    /// names, probe objects, content without an index), of any age.
    #[serde(default)]
    pub stray_bytes: u64,
    /// Of `totalBytesBefore`: what `tender fsck --bucket --repair` moved to `quarantine/`
    /// (never removed by gc).
    #[serde(default)]
    pub quarantine_bytes: u64,
    /// Of `totalBytesBefore`: indexes, progress, trust, known, lease and served records.
    #[serde(default)]
    pub record_bytes: u64,
    /// Strays older than `gcGrace`, removed before any eviction (in a dry run: would be).
    #[serde(default)]
    pub strays: Vec<Stray>,
}

impl BucketGcReport {
    /// Every byte the run freed (would free): strays, evicted content and their records.
    pub fn freed_bytes(&self) -> u64 {
        self.total_bytes_before.saturating_sub(self.total_bytes_after)
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

    /// Bring every byte under the prefix within `max_size`: strays older than `gcGrace` go
    /// first (module `books`), then the least recently served objects; with `dry_run`, only
    /// report what would go.
    pub async fn gc(&self, max_size: u64, dry_run: bool) -> Result<BucketGcReport, BucketError> {
        self.gc_at(max_size, dry_run, now_ms()).await
    }

    /// [`Bucket::gc`] as at `now` (milliseconds since the Unix epoch).
    pub(crate) async fn gc_at(&self, max_size: u64, dry_run: bool, now: u64) -> Result<BucketGcReport, BucketError> {
        let mut report =
            BucketGcReport { bucket: self.settings.bucket.clone(), max_size, dry_run, ..BucketGcReport::default() };
        let books = self.books(true).await?;
        let served = self.served_times().await?;
        let names = self.names(&books.indexes, &books.progress, true).await?;

        // Every byte, by what it is for.
        let by_index: HashSet<&str> = names.indexes.iter().filter_map(|e| e.upload.as_deref()).collect();
        for (upload, dir) in &books.uploads {
            let to = if by_index.contains(upload.as_str()) {
                &mut report.content_bytes
            } else if names.by_progress.contains(upload) {
                &mut report.in_progress_bytes
            } else {
                &mut report.stray_bytes
            };
            *to = to.saturating_add(dir.bytes);
        }
        let indexed: HashSet<Digest> = books.indexes.iter().map(|(d, _)| *d).collect();
        for (d, m) in &books.whole {
            let to = if indexed.contains(d) { &mut report.content_bytes } else { &mut report.stray_bytes };
            *to = to.saturating_add(m.size);
        }
        report.stray_bytes = report.stray_bytes.saturating_add(books.probes.iter().map(|m| m.size).sum::<u64>());
        report.quarantine_bytes = books.quarantine;
        report.record_bytes = books.records;
        report.total_bytes_before = books.total;
        report.total_bytes_after = books.total;

        // Strays first: nothing reads them.
        let found = books.strays(&names, now, Some(self.settings.gc_grace), self.probe_age());
        report.strays = if dry_run {
            found.into_iter().map(|f| f.stray).collect()
        } else {
            self.remove_strays(found, true).await?
        };
        let freed: u64 = report.strays.iter().filter(|s| dry_run || s.removed).map(|s| s.bytes).sum();
        report.total_bytes_after = report.total_bytes_after.saturating_sub(freed);

        let index_bytes: HashMap<Digest, u64> = books.indexes.iter().map(|(d, m)| (*d, m.size)).collect();
        let mut objects: Vec<(u64, Digest, u64, u64)> = names
            .indexes
            .iter()
            .map(|e| {
                let last = served.get(&e.digest).copied().unwrap_or(0).max(e.uploaded_at);
                let footprint = books.footprint(e, index_bytes.get(&e.digest).copied().unwrap_or(0));
                (last, e.digest, e.size, footprint)
            })
            .collect();
        report.objects_before = objects.len() as u64;
        report.bytes_before = objects.iter().map(|o| o.2).sum();
        report.objects_after = report.objects_before;
        report.bytes_after = report.bytes_before;
        if report.total_bytes_after <= max_size {
            return Ok(report);
        }
        objects.sort_by_cached_key(|(last, d, _, _)| (*last, d.to_string()));
        let leased = self.leased_objects(now).await?;
        let grace = self.settings.gc_grace.as_secs();
        let now_secs = now / 1000;
        for (last, d, size, footprint) in objects {
            if report.total_bytes_after <= max_size {
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
                // Read afresh: a healed object's index names another upload than the one remembered.
                self.forget(&d);
                let index = match self.index(&d).await {
                    Ok(Some(i)) => i,
                    Ok(None) => continue,
                    Err(e) if e.is_corrupt() => {
                        tracing::warn!(digest = %d, error = %e, "index unreadable; left for tender fsck --bucket");
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                self.remove_object(&d, &index).await?;
                tracing::info!(bucket = %self.settings.bucket, digest = %d, bytes = index.size, last_served = last,
                    "evicted from the bucket (least recently served)");
            }
            report.bytes_after = report.bytes_after.saturating_sub(size);
            report.total_bytes_after = report.total_bytes_after.saturating_sub(footprint);
            report.objects_after -= 1;
            report.evicted.push(EvictedObject { digest: d.to_string(), size, last_served: last });
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
}
