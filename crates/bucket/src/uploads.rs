//! Multipart uploads in progress, so the ones a dead replica left behind can be found and
//! removed. S3 keeps the parts of an upload nobody completes or aborts (invisible to readers,
//! but stored and billed); `object_store` cannot list them, so each upload is recorded:
//! `uploads/<alg>/<hex>/<sha256(upload id)>.json` names the upload id, the replica, the fill
//! lease it was started under, and when its uploader last renewed the record (every third of
//! `leaseTtl` while it runs). The record goes after the upload is completed or aborted.
//!
//! An upload is *abandoned* when its record was not renewed for 3 × `leaseTtl` and the fill
//! lease it names (if any) is not live: `tender fsck --bucket` lists those, `--repair` and
//! each replica's background sweep ([`Bucket::spawn_sweeper`]) abort them. Uploads started
//! without a record (by a tender before this one, or another tool) are not seen: a bucket
//! lifecycle rule (`AbortIncompleteMultipartUpload`) covers those.

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{MultipartId, PutMode};
use serde::{Deserialize, Serialize};
use tender_oci::Digest;

use crate::lease::now_ms;
use crate::{key_hash, Bucket, BucketError};

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

/// An unfinished multipart upload whose uploader is gone.
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

/// The record of an upload this replica runs; renewed in the background until finished.
pub(crate) struct UploadGuard {
    bucket: Arc<Bucket>,
    path: ObjectPath,
    renewer: tokio::task::JoinHandle<()>,
}

impl UploadGuard {
    /// The upload completed or was aborted: drop its record (best effort; a record left behind
    /// names an upload that no longer exists, which the sweep removes).
    pub(crate) async fn finish(self) {
        self.renewer.abort();
        let b = &self.bucket;
        if let Ok(Err(e)) = b.call("delete", &self.path, b.store.delete(&self.path)).await {
            if !matches!(e, object_store::Error::NotFound { .. }) {
                tracing::debug!(record = %self.path, error = %e, "upload record not deleted; the sweep removes it");
            }
        }
    }
}

impl Drop for UploadGuard {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

impl Bucket {
    fn upload_record_path(&self, d: &Digest, id: &MultipartId) -> ObjectPath {
        self.path(&format!("uploads/{}/{}/{}.json", d.algorithm(), d.hex(), key_hash(id)))
    }

    /// Record a multipart upload just created, and keep the record renewed while it runs.
    pub(crate) async fn record_upload(
        self: &Arc<Self>,
        d: &Digest,
        id: &MultipartId,
        lease: Option<&str>,
    ) -> Result<UploadGuard, BucketError> {
        let now = now_ms();
        let mut record = UploadRecord {
            digest: *d,
            upload_id: id.clone(),
            replica: self.settings.replica.clone(),
            lease: lease.map(str::to_string),
            started_at: now,
            renewed_at: now,
        };
        let p = self.upload_record_path(d, id);
        self.put_json(&p, &record, PutMode::Overwrite).await?;
        let (me, path) = (self.clone(), p.clone());
        let every = self.settings.lease_ttl / 3;
        let renewer = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                record.renewed_at = now_ms();
                if let Err(e) = me.put_json(&path, &record, PutMode::Overwrite).await {
                    tracing::debug!(record = %path, error = %e, "upload record not renewed; retrying");
                }
            }
        });
        Ok(UploadGuard { bucket: self.clone(), path: p, renewer })
    }

    /// Unfinished uploads whose uploader is gone; with `remove`, abort them and drop their
    /// records. Records naming an upload already gone are dropped silently. Not gated by the
    /// breaker (fsck asks a bucket regardless); every request has the deadline.
    pub async fn abandoned_uploads(&self, remove: bool) -> Result<Vec<AbandonedUpload>, BucketError> {
        let dir = self.path("uploads");
        let metas: Vec<_> = match self.timed("list", &dir, self.store.list(Some(&dir)).try_collect::<Vec<_>>()).await? {
            Ok(m) => m,
            Err(e) => return Err(self.store_err("list", &dir, e)),
        };
        let mut found = Vec::new();
        for meta in metas.into_iter().take(MAX_RECORDS) {
            let p = meta.location;
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
    /// down), until the bucket is dropped.
    pub fn spawn_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(self);
        let every = self.settings.lease_ttl.saturating_mul(3).max(Duration::from_millis(100));
        tokio::spawn(async move {
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
            }
        })
    }
}
