//! `tender fsck` over the bucket: every indexed object re-read chunk by chunk and hashed whole.

use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use tender_oci::{Algorithm, Digest};

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
    /// Content without an index, by digest (`sha256:<hex>`): an upload that never finished
    /// (invisible to readers).
    pub unindexed: Vec<String>,
    /// Corrupt objects moved to `quarantine/` (with `--repair`).
    pub quarantined: u64,
    /// Multipart uploads whose replica died mid-upload (record unrenewed for 3 × `leaseTtl`,
    /// no live lease); aborted with `--repair`.
    #[serde(default)]
    pub abandoned_uploads: Vec<AbandonedUpload>,
}

impl BucketFsckReport {
    pub fn is_clean(&self) -> bool {
        self.corrupt.is_empty()
    }
}

impl Bucket {
    async fn list_names(&self, dir: &str, suffix: &str) -> Result<Vec<String>, BucketError> {
        let p = self.path(dir);
        let metas: Vec<_> = self.store.list(Some(&p)).try_collect().await.map_err(|e| self.store_err("list", &p, e))?;
        Ok(metas
            .into_iter()
            .filter_map(|m| m.location.filename().and_then(|f| f.strip_suffix(suffix)).map(str::to_string))
            .collect())
    }

    /// Check one indexed object: every chunk against the index, the whole against the digest.
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
                Ok(bytes) => whole.update(&bytes),
                Err(e) if e.is_corrupt() => return Ok(Some(e.to_string())),
                Err(BucketError::Store { source, .. }) if matches!(*source, object_store::Error::NotFound { .. }) => {
                    return Ok(Some("content missing under its index".into()))
                }
                Err(e) => return Err(e),
            }
        }
        let got = whole.finalize();
        if got != *d {
            self.metrics.corrupt.inc();
            return Ok(Some(format!("chunks match the index but the content is {got}; the index was rewritten")));
        }
        Ok(None)
    }

    /// Re-verify every object in the bucket; with `repair`, move the corrupt ones to
    /// `quarantine/` (index first, so no replica serves them meanwhile).
    pub async fn fsck(&self, repair: bool) -> Result<BucketFsckReport, BucketError> {
        let mut report = BucketFsckReport { bucket: self.settings.bucket.clone(), ..BucketFsckReport::default() };
        // Chunk-object uploads, listed before the records and indexes that name them: an
        // upload writes its record before its first chunk and drops it after its index, so
        // one that runs meanwhile is named by one of the later listings.
        let uploads = self.list_uploads().await?;
        let mut named: std::collections::HashSet<String> = self.progress_uploads().await?;
        for algorithm in Algorithm::ALL {
            let indexed = self.list_names(&format!("index/{algorithm}"), ".json").await?;
            let content = self.list_names(&format!("objects/{algorithm}"), "").await?;
            for hex in &indexed {
                let Ok(d) = Digest::from_hex(algorithm, hex) else {
                    report.corrupt.push(BucketProblem {
                        digest: format!("{algorithm}:{hex}"),
                        problem: format!("index name is not a {algorithm} digest"),
                    });
                    continue;
                };
                report.objects_checked += 1;
                if let Some(problem) = self.check_object(&d).await? {
                    tracing::error!(bucket = %self.settings.bucket, digest = %d, %problem, "bucket object fails verification");
                    if repair {
                        self.quarantine(&d).await?;
                        report.quarantined += 1;
                    }
                    report.corrupt.push(BucketProblem { digest: d.to_string(), problem });
                } else if let Some(i) = self.index(&d).await? {
                    report.bytes_checked += i.size;
                }
                if let Ok(Some(i)) = self.get_json::<crate::ChunkIndex>(&self.index_path(&d)).await {
                    named.extend(i.upload);
                }
            }
            let indexed: std::collections::HashSet<&String> = indexed.iter().collect();
            report
                .unindexed
                .extend(content.iter().filter(|c| !indexed.contains(c)).map(|c| format!("{algorithm}:{c}")));
        }
        for upload in uploads.into_iter().filter(|u| !named.contains(u)) {
            if repair {
                self.remove_parts(&upload, false).await?;
            }
            report.unindexed.push(format!("parts/{upload}"));
        }
        report.abandoned_uploads = self.abandoned_uploads(repair).await?;
        Ok(report)
    }

    /// The upload ids under `parts/`.
    async fn list_uploads(&self) -> Result<Vec<String>, BucketError> {
        let dir = self.path("parts");
        let listed = self.store.list_with_delimiter(Some(&dir)).await.map_err(|e| self.store_err("list", &dir, e))?;
        Ok(listed.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_string)).collect())
    }

    /// The uploads progress records name (running, or abandoned and removed separately).
    async fn progress_uploads(&self) -> Result<std::collections::HashSet<String>, BucketError> {
        let dir = self.path("progress");
        let metas: Vec<_> =
            self.store.list(Some(&dir)).try_collect().await.map_err(|e| self.store_err("list", &dir, e))?;
        let mut named = std::collections::HashSet::new();
        for m in metas {
            if let Ok(Some(r)) = self.get_json_via::<crate::Progress>(&m.location, false).await {
                named.insert(r.upload);
            }
        }
        Ok(named)
    }

    async fn quarantine(&self, d: &Digest) -> Result<(), BucketError> {
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
            return Ok(());
        }
        match self.store.copy(&content, &aside).await {
            Ok(()) => self.store.delete(&content).await.map_err(|e| self.store_err("delete", &content, e))?,
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.store_err("copy", &content, e)),
        }
        tracing::warn!(bucket = %self.settings.bucket, digest = %d, to = %aside, "quarantined a corrupt bucket object");
        Ok(())
    }
}
