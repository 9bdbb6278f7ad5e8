//! Uploads a dead replica left behind, found and removed.
//!
//! Tender writes content as chunk objects under a progress record (see [`crate::parts`]): a
//! record renewed by its uploader every third of `leaseTtl` while it runs, removed after the
//! index. An upload is *abandoned* when its record was not renewed for 3 × `leaseTtl` and the
//! fill lease it runs under (if any) is not live: `tender fsck --bucket` lists those,
//! `--repair` and each replica's background sweep ([`Bucket::spawn_sweeper`]) delete their
//! chunks and record (only the record, when the index naming the upload was written). Chunks
//! no record and no index names any more (a takeover replaced the record, a healed object's
//! index names its new upload) are strays, which the same sweep removes (module `books`).
//!
//! Tenders before bucket format 3 wrote multipart uploads with a record under
//! `uploads/<alg>/<hex>/<sha256(upload id)>.json`; those are still found and aborted. Uploads
//! started without a record (another tool) are not seen: a bucket lifecycle rule
//! (`AbortIncompleteMultipartUpload`) covers those.

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use tender_oci::Digest;

use crate::lease::now_ms;
use crate::parts::Progress;
use crate::{Bucket, BucketError};

/// Records read per sweep at most (a bucket that lists more is swept again next time).
const MAX_RECORDS: usize = 10_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UploadRecord {
    pub digest: Digest,
    pub upload_id: String,
    pub replica: String,
    /// The fill lease the upload runs under (its key), if any.
    #[serde(default)]
    pub lease: Option<String>,
    /// Milliseconds since the Unix epoch, by the uploader's clock.
    pub started_at: u64,
    pub renewed_at: u64,
}

/// An unfinished upload whose uploader is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AbandonedUpload {
    pub digest: String,
    pub replica: String,
    pub upload_id: String,
    /// Seconds since its record was last renewed.
    pub idle_secs: u64,
    /// Aborted (with `--repair`, or by a replica's sweep).
    pub removed: bool,
}

/// Whether an upload last renewed at `renewed_at` is abandoned at `now` (all milliseconds):
/// idle for more than 3 × `ttl`, and not under a live lease. A record from the future (a
/// clock ahead of ours) is idle for 0.
pub(crate) fn is_abandoned(renewed_at: u64, now: u64, ttl: Duration, lease_live: bool) -> bool {
    let limit = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).saturating_mul(3);
    !lease_live && now.saturating_sub(renewed_at) > limit
}

impl Bucket {
    /// Unfinished uploads whose uploader is gone; with `remove`, abort them and drop their
    /// records. Records naming an upload already gone are dropped silently. Not gated by the
    /// breaker (fsck asks a bucket regardless); every request has the deadline.
    pub async fn abandoned_uploads(&self, remove: bool) -> Result<Vec<AbandonedUpload>, BucketError> {
        let mut found = self.abandoned_parts(remove).await?;
        found.extend(self.abandoned_multipart(remove).await?);
        Ok(found)
    }

    /// The records under `dir` (at most [`MAX_RECORDS`]; past the breaker, with the deadline).
    async fn records(&self, dir: &str) -> Result<Vec<object_store::path::Path>, BucketError> {
        let dir = self.path(dir);
        match self.timed("list", &dir, self.store.list(Some(&dir)).try_collect::<Vec<_>>()).await? {
            Ok(m) => Ok(m.into_iter().take(MAX_RECORDS).map(|m| m.location).collect()),
            Err(e) => Err(self.store_err("list", &dir, e)),
        }
    }

    /// Chunk-object uploads whose uploader is gone ([`Bucket::abandoned_uploads`]).
    async fn abandoned_parts(&self, remove: bool) -> Result<Vec<AbandonedUpload>, BucketError> {
        let mut found = Vec::new();
        for p in self.records("progress").await? {
            let Some(record) = self.get_json_via::<Progress>(&p, false).await.ok().flatten() else { continue };
            let lease_live = record.leased && self.lease_live(&record.key).await?;
            let now = now_ms();
            if !is_abandoned(record.renewed_at, now, self.settings.lease_ttl, lease_live) {
                continue;
            }
            // Finished (its index names it) but the record was not dropped: only the record goes.
            let finished = match record.digest {
                Some(d) => self
                    .get_json_via::<crate::ChunkIndex>(&self.index_path(&d), false)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|i| i.upload.as_deref() == Some(record.upload.as_str())),
                None => false,
            };
            let mut removed = false;
            if remove {
                if !finished {
                    self.remove_parts(&record.upload, false).await?;
                }
                match self.timed("delete", &p, self.store.delete(&p)).await? {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.store_err("delete", &p, e)),
                }
                removed = true;
                if !finished {
                    self.metrics.abandoned_uploads_removed.inc();
                    tracing::warn!(bucket = %self.settings.bucket, key = %record.key, replica = %record.replica,
                        upload = %record.upload, chunks = record.chunks.len(),
                        "removed an abandoned upload (its replica stopped renewing it)");
                }
            }
            if finished {
                continue;
            }
            found.push(AbandonedUpload {
                digest: record.digest.map_or_else(|| format!("(not yet known: {})", record.key), |d| d.to_string()),
                replica: record.replica,
                upload_id: record.upload,
                idle_secs: now.saturating_sub(record.renewed_at) / 1000,
                removed,
            });
        }
        Ok(found)
    }

    /// Multipart uploads of tenders before bucket format 3 whose uploader is gone.
    async fn abandoned_multipart(&self, remove: bool) -> Result<Vec<AbandonedUpload>, BucketError> {
        let mut found = Vec::new();
        for p in self.records("uploads").await? {
            let Some(record) = self.get_json_via::<UploadRecord>(&p, false).await.ok().flatten() else {
                // Unreadable or gone: a record is ours to judge only when it parses.
                continue;
            };
            let lease_live = match &record.lease {
                Some(key) => self.lease_live(key).await?,
                None => false,
            };
            let now = now_ms();
            if !is_abandoned(record.renewed_at, now, self.settings.lease_ttl, lease_live) {
                continue;
            }
            let mut removed = false;
            if remove {
                let object = self.object_path(&record.digest);
                match self
                    .timed("abort upload", &object, self.multipart.abort_multipart(&object, &record.upload_id))
                    .await?
                {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.store_err("abort upload", &object, e)),
                }
                match self.timed("delete", &p, self.store.delete(&p)).await? {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.store_err("delete", &p, e)),
                }
                removed = true;
                self.metrics.abandoned_uploads_removed.inc();
                tracing::warn!(bucket = %self.settings.bucket, digest = %record.digest, replica = %record.replica,
                    upload_id = %record.upload_id, "aborted an abandoned multipart upload (its replica stopped renewing it)");
            }
            found.push(AbandonedUpload {
                digest: record.digest.to_string(),
                replica: record.replica,
                upload_id: record.upload_id,
                idle_secs: now.saturating_sub(record.renewed_at) / 1000,
                removed,
            });
        }
        Ok(found)
    }

    /// Abort abandoned uploads in the background every 3 × `leaseTtl` (not while the bucket is
    /// down), until the bucket is dropped; at most once per `gcGrace`, also remove the strays
    /// older than `gcGrace` (module `books`: chunks nothing names, stale probe objects).
    pub fn spawn_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let every = self.settings.lease_ttl.saturating_mul(3).max(Duration::from_millis(100));
        let strays_every = self.settings.gc_grace;
        tokio::spawn(async move {
            let mut strays_swept: Option<tokio::time::Instant> = None;
            loop {
                // Replicas started together need not sweep together.
                let jitter = Duration::from_millis(rand::random::<u64>() % 1000);
                tokio::time::sleep(every.saturating_add(jitter)).await;
                let Some(b) = weak.upgrade() else { return };
                if !b.breaker.is_up() {
                    continue;
                }
                if let Err(e) = b.abandoned_uploads(true).await {
                    tracing::debug!(bucket = %b.settings.bucket, error = %e, "sweep of abandoned uploads failed; next time");
                }
                if strays_swept.is_some_and(|t| t.elapsed() < strays_every) {
                    continue;
                }
                match b.sweep_strays().await {
                    Ok(_) => strays_swept = Some(tokio::time::Instant::now()),
                    Err(e) => {
                        tracing::debug!(bucket = %b.settings.bucket, error = %e, "sweep of strays failed; next time")
                    }
                }
            }
        })
    }
}
