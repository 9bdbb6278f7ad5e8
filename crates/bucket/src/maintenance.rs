//! `tender fsck` over the bucket: every indexed object re-read chunk by chunk and hashed whole
//! (and each chunk's sub-chunks against the index, when it records them);
//! the keys nothing names (module `books`) reported, and removed with `--repair`.

use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use tender_oci::Digest;

use crate::books::{Stray, StrayKind};
use crate::lease::now_ms;
use crate::{AbandonedUpload, Bucket, BucketError};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketProblem {
    pub digest: String,
    pub problem: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketFsckReport {
    pub bucket: String,
    pub objects_checked: u64,
    pub bytes_checked: u64,
    /// Objects whose content does not match their index or their digest.
    pub corrupt: Vec<BucketProblem>,
    /// Content nothing names: `sha256:<hex>` (stored whole, no index) or `parts/<upload>` (chunk
    /// objects no index or progress record names), invisible to readers; also in `strays`.
    pub unindexed: Vec<String>,
    /// Corrupt objects moved to `quarantine/` (with `--repair`).
    pub quarantined: u64,
    /// Multipart uploads whose replica died mid-upload (record unrenewed for 3 × `leaseTtl`,
    /// no live lease); aborted with `--repair`.
    #[serde(default)]
    pub abandoned_uploads: Vec<AbandonedUpload>,
    /// Keys nothing names, with their bytes (module `books`): the `unindexed` content and
    /// probe objects older than `gcGrace`; removed with `--repair`.
    #[serde(default)]
    pub strays: Vec<Stray>,
    #[serde(default)]
    pub stray_bytes: u64,
}

impl BucketFsckReport {
    pub fn is_clean(&self) -> bool {
        self.corrupt.is_empty()
    }
}

impl Bucket {
    /// Check one indexed object: every chunk against the index, the whole against the digest
    /// (a chain's chunks, checked in order, are the whole's own hash: no second pass).
    async fn check_object(&self, d: &Digest) -> Result<Option<String>, BucketError> {
        let index = match self.index(d).await {
            Ok(Some(i)) => i,
            Ok(None) => return Ok(Some("index vanished during the check".into())),
            Err(e) if e.is_corrupt() => return Ok(Some(e.to_string())),
            Err(e) => return Err(e),
        };
        let mut whole = d.algorithm().hasher();
        for i in 0..index.chunks.len() {
            match self.chunk(d, &index, i).await {
                Ok(bytes) => {
                    if let Some((s, want)) = index.sub_hashes(i) {
                        if self.sub_hashes(&bytes, s).await? != want {
                            self.metrics.corrupt.inc();
                            return Ok(Some(format!(
                                "chunk {i} matches the index but its sub-chunk digests do not; its ranges fail"
                            )));
                        }
                    }
                    if !index.is_chain() {
                        whole.update(&bytes)
                    }
                }
                Err(e) if e.is_corrupt() => return Ok(Some(e.to_string())),
                Err(BucketError::Store { source, .. }) if matches!(*source, object_store::Error::NotFound { .. }) => {
                    return Ok(Some("content missing under its index".into()))
                }
                Err(e) => return Err(e),
            }
        }
        let got = whole.finalize();
        if got != *d && !index.is_chain() {
            self.metrics.corrupt.inc();
            return Ok(Some(format!("chunks match the index but the content is {got}; the index was rewritten")));
        }
        Ok(None)
    }

    /// Re-verify every object in the bucket; with `repair`, move the corrupt ones to
    /// `quarantine/` (index first, so no replica serves them meanwhile) and remove the strays
    /// (module `books`: uploads and content nothing names, of any age; probes older than
    /// `gcGrace`).
    pub async fn fsck(&self, repair: bool) -> Result<BucketFsckReport, BucketError> {
        let mut report = BucketFsckReport { bucket: self.settings.bucket.clone(), ..BucketFsckReport::default() };
        // Every key, listed before the records and indexes that name them are listed again
        // (module `books`).
        let books = self.books(false).await?;
        for name in &books.bad_indexes {
            let algorithm = name.split(':').next().unwrap_or_default();
            report.corrupt.push(BucketProblem {
                digest: name.clone(),
                problem: format!("index name is not a {algorithm} digest"),
            });
        }
        let mut quarantined = std::collections::HashSet::new();
        for (d, _) in &books.indexes {
            report.objects_checked += 1;
            if let Some(problem) = self.check_object(d).await? {
                tracing::error!(bucket = %self.settings.bucket, digest = %d, %problem, "bucket object fails verification");
                if repair {
                    quarantined.extend(self.quarantine(d).await?);
                    report.quarantined += 1;
                }
                report.corrupt.push(BucketProblem { digest: d.to_string(), problem });
            } else if let Some(i) = self.index(d).await? {
                report.bytes_checked += i.size;
            }
        }
        let (names, _) = self.fresh_names(false).await?;
        let found: Vec<_> = books
            .strays(&names, now_ms(), None, self.probe_age())
            .into_iter()
            .filter(|f| !matches!(&f.kind, StrayKind::Upload(u) if quarantined.contains(u)))
            .collect();
        for f in &found {
            match &f.kind {
                StrayKind::Upload(u) => report.unindexed.push(format!("parts/{u}")),
                StrayKind::Whole(d, _) => report.unindexed.push(d.to_string()),
                StrayKind::Probe(_) => {}
            }
        }
        report.strays =
            if repair { self.remove_strays(found, false).await? } else { found.into_iter().map(|f| f.stray).collect() };
        report.stray_bytes = report.strays.iter().map(|s| s.bytes).sum();
        report.abandoned_uploads = self.abandoned_uploads(repair).await?;
        Ok(report)
    }

    /// Move an object aside; the upload whose chunks were moved, if any.
    async fn quarantine(&self, d: &Digest) -> Result<Option<String>, BucketError> {
        let (index, content) = (self.index_path(d), self.object_path(d));
        let aside = self.path(&format!("quarantine/{}/{}", d.algorithm(), d.hex()));
        let written = self.get_json::<crate::ChunkIndex>(&index).await.ok().flatten();
        self.store.delete(&index).await.map_err(|e| self.store_err("delete", &index, e))?;
        self.forget(d);
        if let Some(upload) = written.and_then(|i| i.upload) {
            // Chunk objects: each moved aside, under the object's name.
            let dir = self.path(&format!("parts/{upload}"));
            let parts: Vec<_> =
                self.store.list(Some(&dir)).try_collect().await.map_err(|e| self.store_err("list", &dir, e))?;
            for m in parts {
                let Some(name) = m.location.filename().map(str::to_string) else { continue };
                let to = self.path(&format!("quarantine/{}/{}/{name}", d.algorithm(), d.hex()));
                match self.store.copy(&m.location, &to).await {
                    Ok(()) => {
                        self.store.delete(&m.location).await.map_err(|e| self.store_err("delete", &m.location, e))?
                    }
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.store_err("copy", &m.location, e)),
                }
            }
            tracing::warn!(bucket = %self.settings.bucket, digest = %d, to = %aside, "quarantined a corrupt bucket object");
            return Ok(Some(upload));
        }
        match self.store.copy(&content, &aside).await {
            Ok(()) => self.store.delete(&content).await.map_err(|e| self.store_err("delete", &content, e))?,
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.store_err("copy", &content, e)),
        }
        tracing::warn!(bucket = %self.settings.bucket, digest = %d, to = %aside, "quarantined a corrupt bucket object");
        Ok(None)
    }
}
