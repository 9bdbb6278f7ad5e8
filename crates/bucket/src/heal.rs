//! Chunks missing under their index (an operator's lifecycle rule, a partial restore) put back
//! from a replica's verified local copy. Without this, every replica without a local copy
//! would copy up to the hole, fetch the rest from the upstream, and leave the hole as it was,
//! until `tender fsck --bucket --repair`.
//!
//! A heal never rewrites an index and never overwrites a chunk: each missing chunk is read
//! from the committed local file, checked against the sha256 its index names, and written with
//! a conditional create, so of several replicas healing the same object one writes each chunk
//! and the others' creates are refused. A corrupt chunk (present, wrong bytes) is not a heal's
//! business: the replica that read it overwrites the whole object (`Bucket::replace`).

use std::collections::HashSet;
use std::path::Path;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{PutMode, PutOptions, PutPayload};
use tender_oci::Digest;

use crate::{Bucket, BucketError, ChunkIndex};

/// What a heal of one object found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealReport {
    /// The bucket holds no index for the object (evicted, quarantined): there is nothing to
    /// heal; the next upload writes the object anew.
    NoIndex,
    /// The index names one whole object (written before bucket format 3), not chunk objects:
    /// not healed here.
    Whole,
    /// Another heal of the object runs on this replica now.
    Busy,
    /// Every chunk of the index was looked for: `missing` were absent, of which this replica
    /// wrote `restored` (another replica wrote the others first).
    Checked { chunks: usize, missing: Vec<usize>, restored: Vec<usize> },
}

impl HealReport {
    /// The chunks this replica put back.
    pub fn restored(&self) -> &[usize] {
        match self {
            HealReport::Checked { restored, .. } => restored,
            HealReport::NoIndex | HealReport::Whole | HealReport::Busy => &[],
        }
    }
}

/// The object's slot in [`Bucket`]'s set of heals running, freed when dropped.
struct Healing<'a> {
    bucket: &'a Bucket,
    digest: Digest,
}

impl Drop for Healing<'_> {
    fn drop(&mut self) {
        if let Ok(mut h) = self.bucket.healing.lock() {
            h.remove(&self.digest);
        }
    }
}

impl Bucket {
    /// Put back the chunks of `d`'s index that the bucket lacks, from `local`, the replica's
    /// committed (verified) copy of `d`. Each is checked against its entry in the index before
    /// it is written (a local chunk that differs fails the heal with [`BucketError::Corrupt`]
    /// and is not written) and written only if still absent (a conditional create: one that
    /// another replica wrote meanwhile is left as it is). The index is read afresh and never
    /// written; read again after the writes, it must still name the upload, or what was written
    /// goes again ([`HealReport::NoIndex`]: `gc` or `replace` removed that upload meanwhile). At
    /// most one heal of an object runs on a replica at a time ([`HealReport::Busy`]).
    pub async fn heal_missing(&self, d: &Digest, local: &Path) -> Result<HealReport, BucketError> {
        let Some(_slot) = self.take_heal(d) else { return Ok(HealReport::Busy) };
        let p = self.index_path(d);
        // From the bucket, not the memory: the index may have gone or been replaced since.
        let Some(index) = self.get_json::<ChunkIndex>(&p).await? else { return Ok(HealReport::NoIndex) };
        index.validate_for(d).map_err(|m| self.corrupt(&p, m))?;
        let Some(upload) = index.upload.clone() else { return Ok(HealReport::Whole) };
        let present = self.listed_parts(&upload).await?;
        let missing: Vec<usize> = (0..index.chunks.len()).filter(|i| !present.contains(i)).collect();
        let chunks = index.chunks.len();
        if missing.is_empty() {
            return Ok(HealReport::Checked { chunks, missing, restored: Vec::new() });
        }
        let local_err = |e: std::io::Error| BucketError::Local {
            bucket: self.settings.bucket.clone(),
            path: local.display().to_string(),
            source: e,
        };
        let file = std::sync::Arc::new(std::fs::File::open(local).map_err(local_err)?);
        let size = file.metadata().map_err(local_err)?.len();
        if size != index.size {
            return Err(BucketError::Corrupt {
                bucket: self.settings.bucket.clone(),
                key: local.display().to_string(),
                message: format!(
                    "the local copy of {d} is {size} bytes, its index {}; no chunk re-uploaded",
                    index.size
                ),
            });
        }
        let mut restored = Vec::new();
        for &i in &missing {
            let bytes = self.local_chunk(&file, &index, i).await.map_err(local_err)?;
            let Some(check) = index.check_of(i, d) else { return Ok(HealReport::NoIndex) };
            if let Err(m) = self.check_chunk(&bytes, &check, None).await? {
                self.metrics.corrupt.inc();
                return Err(BucketError::Corrupt {
                    bucket: self.settings.bucket.clone(),
                    key: local.display().to_string(),
                    message: format!("chunk {i} of the local copy of {d} {m}; not re-uploaded"),
                });
            }
            let n = bytes.len() as u64;
            let part = self.part_path(&upload, i);
            let opts = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
            match self.call("put", &part, self.store.put_opts(&part, PutPayload::from(bytes), opts)).await? {
                Ok(_) => {
                    self.metrics.healed_chunks.inc();
                    self.metrics.uploaded_bytes.inc_by(n);
                    restored.push(i);
                }
                // Another replica put it back first.
                Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {}
                Err(e) => return Err(self.store_err("put", &part, e)),
            }
        }
        if !restored.is_empty() && !self.still_indexed(&p, &upload).await {
            // Removed (gc) or replaced meanwhile: nothing names what was written any more, so
            // it goes again (what a delete misses, fsck --bucket --repair lists and removes).
            for &i in &restored {
                let part = self.part_path(&upload, i);
                let _ = self.call("delete", &part, self.store.delete(&part)).await;
            }
            return Ok(HealReport::NoIndex);
        }
        if !restored.is_empty() {
            tracing::info!(bucket = %self.settings.bucket, digest = %d, %upload, chunks = ?restored,
                "re-uploaded missing chunks to the bucket from the verified local copy");
        }
        Ok(HealReport::Checked { chunks, missing, restored })
    }

    /// The slot of `d` in the set of heals running, unless a heal of it runs already.
    fn take_heal(&self, d: &Digest) -> Option<Healing<'_>> {
        let mut h = self.healing.lock().ok()?;
        h.insert(*d).then(|| Healing { bucket: self, digest: *d })
    }

    /// Whether the index at `p` still names `upload` (when it cannot be read, it is taken to).
    async fn still_indexed(&self, p: &object_store::path::Path, upload: &str) -> bool {
        match self.get_json::<ChunkIndex>(p).await {
            Ok(Some(i)) => i.upload.as_deref() == Some(upload),
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// The chunk numbers an upload's objects hold (one listing, not a request per chunk).
    async fn listed_parts(&self, upload: &str) -> Result<HashSet<usize>, BucketError> {
        let dir = self.path(&format!("parts/{upload}"));
        let listed = self.call("list", &dir, self.store.list(Some(&dir)).try_collect::<Vec<_>>()).await?;
        let metas = listed.map_err(|e| self.store_err("list", &dir, e))?;
        Ok(metas.iter().filter_map(|m| m.location.filename()?.parse().ok()).collect())
    }

    /// Chunk `i` of the local copy, read on the blocking pool.
    async fn local_chunk(
        &self,
        file: &std::sync::Arc<std::fs::File>,
        index: &ChunkIndex,
        i: usize,
    ) -> std::io::Result<Bytes> {
        use std::os::unix::fs::FileExt as _;
        let range = index.chunk_range(i);
        let file = file.clone();
        let len = usize::try_from(range.end - range.start).map_err(std::io::Error::other)?;
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; len];
            file.read_exact_at(&mut buf, range.start)?;
            Ok(Bytes::from(buf))
        })
        .await
        .map_err(std::io::Error::other)?
    }
}
