//! Small JSON records: tag -> digest mappings and manifest metadata.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tender_oci::Digest;

use crate::fsutil::write_atomic;
use crate::layout::{Store, StoreError};

/// What a tag pointed to when tender last asked its upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TagRecord {
    pub upstream: String,
    pub repository: String,
    pub tag: String,
    pub digest: Digest,
    pub media_type: String,
    pub size: u64,
    /// Seconds since the Unix epoch when the upstream confirmed this mapping.
    pub fetched_at: u64,
}

impl TagRecord {
    /// Age of the record in seconds (0 if the clock went backwards).
    pub fn age_secs(&self) -> u64 {
        now_secs().saturating_sub(self.fetched_at)
    }
}

/// Media type and size of a stored manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestMeta {
    pub media_type: String,
    pub size: u64,
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Store {
    fn tag_path(&self, upstream: &str, repository: &str, tag: &str) -> PathBuf {
        let mut h = Sha256::new();
        for part in [upstream, repository, tag] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        let key = hex::encode(h.finalize());
        self.root()
            .join("tags")
            .join(&key[..2])
            .join(format!("{key}.json"))
    }

    fn meta_path(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        self.root()
            .join("meta/sha256")
            .join(&hex[..2])
            .join(format!("{hex}.json"))
    }

    pub fn tag_get(
        &self,
        upstream: &str,
        repository: &str,
        tag: &str,
    ) -> Result<Option<TagRecord>, StoreError> {
        read_json(&self.tag_path(upstream, repository, tag)).map_err(|e| self.err(e))
    }

    pub fn tag_put(&self, record: &TagRecord) -> Result<(), StoreError> {
        let path = self.tag_path(&record.upstream, &record.repository, &record.tag);
        let bytes = serde_json::to_vec(record).map_err(|e| self.err(io::Error::other(e)))?;
        write_atomic(&path, &bytes).map_err(|e| self.err(e))
    }

    pub fn meta_get(&self, digest: &Digest) -> Result<Option<ManifestMeta>, StoreError> {
        read_json(&self.meta_path(digest)).map_err(|e| self.err(e))
    }

    pub fn meta_put(&self, digest: &Digest, meta: &ManifestMeta) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(meta).map_err(|e| self.err(io::Error::other(e)))?;
        write_atomic(&self.meta_path(digest), &bytes).map_err(|e| self.err(e))
    }
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &std::path::Path) -> io::Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(v) => Ok(Some(v)),
            // A record that does not parse is treated as absent; it is rewritten on next fetch.
            Err(_) => Ok(None),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
