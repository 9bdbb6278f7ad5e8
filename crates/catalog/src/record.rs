//! Golden state records: `<data>/catalog/goldens/<golden>.json`, one per golden, written
//! atomically. A record carries the entry's source and settings as they were when the golden
//! was imported, so an edit of an existing golden can be refused (rule 4), and it outlives the
//! entry: dropping an entry from the config keeps its golden and its record.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Entry, Source};
use crate::fsutil::write_atomic;

/// Where a golden stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// Configured, not imported yet.
    Pending,
    /// Being fetched or decompressed (or interrupted: the next sync resumes it).
    ImportInProgress,
    /// The raw golden is in place and verified.
    Succeeded,
    /// Every attempt failed; `reason` says why. `tender catalog sync --retry-failed` tries again.
    Failed,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Pending, Phase::ImportInProgress, Phase::Succeeded, Phase::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::ImportInProgress => "ImportInProgress",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
        }
    }

    /// Still on its way to `Succeeded` or `Failed`.
    pub fn is_open(self) -> bool {
        matches!(self, Phase::Pending | Phase::ImportInProgress)
    }
}

/// Which part of an import is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Stage {
    /// The compressed asset through the cache (`done`/`total`: asset bytes).
    Download,
    /// The asset into the raw golden (`done`/`total`: asset bytes consumed).
    Decompress,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    pub stage: Stage,
    pub done: u64,
    pub total: Option<u64>,
}

impl Progress {
    /// Overall percent: the download is the first half, the decompression the second.
    pub fn percent(&self) -> f64 {
        let frac = match self.total {
            Some(t) if t > 0 => (self.done as f64 / t as f64).min(1.0),
            _ => 0.0,
        };
        let base = match self.stage {
            Stage::Download => 0.0,
            Stage::Decompress => 50.0,
        };
        ((base + frac * 50.0) * 10.0).round() / 10.0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GoldenRecord {
    pub name: String,
    pub source: Source,
    pub dir: PathBuf,
    /// `<dir>/<name>.raw`
    pub path: PathBuf,
    #[serde(default)]
    pub storage_class: Option<String>,
    #[serde(default)]
    pub storage: Option<String>,
    #[serde(default)]
    pub storage_bytes: Option<u64>,
    pub phase: Phase,
    #[serde(default)]
    pub reason: Option<String>,
    /// The failure was transient: the factory could not be reached.
    #[serde(default)]
    pub transient: bool,
    #[serde(default)]
    pub progress: Option<Progress>,
    /// Attempts made by the last sync that imported (or tried to).
    #[serde(default)]
    pub attempts: u32,
    /// The compressed asset in the store (`sha256:...`), trusted on first use.
    #[serde(default)]
    pub asset_digest: Option<String>,
    /// Size of the raw golden in bytes.
    #[serde(default)]
    pub virtual_size: Option<u64>,
    /// sha256 of the raw golden's bytes (hex).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    #[serde(default)]
    pub imported_at: Option<u64>,
    pub updated_at: u64,
}

pub fn now_secs() -> u64 {
    tender_store::now_secs()
}

impl GoldenRecord {
    /// A fresh `Pending` record for an entry.
    pub fn pending(entry: &Entry) -> GoldenRecord {
        let now = now_secs();
        GoldenRecord {
            name: entry.name.clone(),
            source: entry.source.clone(),
            dir: entry.dir.clone(),
            path: entry.golden_path(),
            storage_class: entry.storage_class.clone(),
            storage: entry.storage.clone(),
            storage_bytes: entry.storage_bytes,
            phase: Phase::Pending,
            reason: None,
            transient: false,
            progress: None,
            attempts: 0,
            asset_digest: None,
            virtual_size: None,
            sha256: None,
            created_at: now,
            imported_at: None,
            updated_at: now,
        }
    }

    /// Take the entry's source and settings (allowed while the golden does not exist).
    pub fn adopt(&mut self, entry: &Entry) {
        self.source = entry.source.clone();
        self.dir = entry.dir.clone();
        self.path = entry.golden_path();
        self.storage_class = entry.storage_class.clone();
        self.storage = entry.storage.clone();
        self.storage_bytes = entry.storage_bytes;
    }

    /// What differs between the golden as imported and the entry now, in the entry's words.
    pub fn changes(&self, entry: &Entry) -> Vec<String> {
        let mut out = Vec::new();
        let mut diff = |what: &str, was: String, now: String| {
            if was != now {
                out.push(format!("{what} {was} -> {now}"));
            }
        };
        let (a, b) = (&self.source, &entry.source);
        diff("imageFactory", format!("{:?}", a.image_factory), format!("{:?}", b.image_factory));
        diff("schematic", format!("{:?}", a.schematic), format!("{:?}", b.schematic));
        diff("version", format!("{:?}", a.version), format!("{:?}", b.version));
        diff("platform", format!("{:?}", a.platform), format!("{:?}", b.platform));
        diff("arch", format!("{:?}", a.arch), format!("{:?}", b.arch));
        diff("format", format!("{:?}", a.format), format!("{:?}", b.format));
        diff("dir", format!("{:?}", self.dir), format!("{:?}", entry.dir));
        if self.storage_bytes != entry.storage_bytes {
            diff("storage", shown(&self.storage), shown(&entry.storage));
        }
        diff("storageClass", shown(&self.storage_class), shown(&entry.storage_class));
        out
    }

    /// Whether the golden exists: imported and its file in place.
    pub fn exists(&self) -> bool {
        self.phase == Phase::Succeeded && self.path.is_file()
    }
}

fn shown(v: &Option<String>) -> String {
    match v {
        Some(s) => format!("{s:?}"),
        None => "(unset)".into(),
    }
}

/// Whether `name` can be a golden's file name (what `catalog rm`, `refs` and `clone` accept).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && !name.contains("..")
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// The records under a data directory.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn new(data: &Path) -> Records {
        Records { dir: data.join("catalog").join("goldens") }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }

    pub fn get(&self, name: &str) -> io::Result<Option<GoldenRecord>> {
        if !valid_name(name) {
            return Ok(None);
        }
        match fs::read(self.path(name)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io::Error::other(format!("{}: {e}", self.path(name).display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn put(&self, record: &GoldenRecord) -> io::Result<()> {
        let bytes = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
        write_atomic(&self.path(&record.name), &bytes)
    }

    pub fn remove(&self, name: &str) -> io::Result<bool> {
        match fs::remove_file(self.path(name)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Every record, by name. Unreadable records are skipped with a warning.
    pub fn list(&self) -> io::Result<Vec<GoldenRecord>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let file = e.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".json")) else { continue };
            if !valid_name(name) {
                continue;
            }
            match self.get(name) {
                Ok(Some(r)) => out.push(r),
                Ok(None) => {}
                Err(err) => tracing::warn!(golden = name, error = %err, "skipping an unreadable golden record"),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn entry() -> Entry {
        Entry {
            index: 0,
            name: "talos-worker-abc-v1.13.6".into(),
            source: Source {
                image_factory: "https://factory.talos.dev/".into(),
                schematic: "abc".into(),
                version: "v1.13.6".into(),
                platform: "openstack".into(),
                arch: "amd64".into(),
                format: "raw.xz".into(),
            },
            dir: PathBuf::from("/g"),
            storage_class: None,
            storage: Some("6Gi".into()),
            storage_bytes: Some(6 << 30),
        }
    }

    #[test]
    fn should_round_trip_records_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::new(dir.path());
        let r = GoldenRecord::pending(&entry());
        records.put(&r).unwrap();
        assert_eq!(records.get(&r.name).unwrap(), Some(r.clone()));
        assert_eq!(records.list().unwrap(), vec![r.clone()]);
        assert!(records.remove(&r.name).unwrap());
        assert!(!records.remove(&r.name).unwrap());
        assert_eq!(records.get("../../etc/passwd").unwrap(), None);
    }

    #[test]
    fn should_name_every_change_to_an_entry() {
        let r = GoldenRecord::pending(&entry());
        assert!(r.changes(&entry()).is_empty());
        let mut e = entry();
        e.storage = Some("6144Mi".into());
        assert!(r.changes(&e).is_empty(), "the same size written otherwise is no change");
        e.storage = Some("8Gi".into());
        e.storage_bytes = Some(8 << 30);
        e.source.format = "raw.zst".into();
        e.storage_class = Some("replicated".into());
        e.dir = PathBuf::from("/h");
        let c = r.changes(&e);
        assert_eq!(c.len(), 4, "{c:?}");
        assert!(c.iter().any(|x| x == "storage \"6Gi\" -> \"8Gi\""), "{c:?}");
        assert!(c.iter().any(|x| x == "storageClass (unset) -> \"replicated\""), "{c:?}");
    }

    #[test]
    fn should_weigh_download_and_decompression_halves() {
        let p = |stage, done| Progress { stage, done, total: Some(200) };
        assert_eq!(p(Stage::Download, 0).percent(), 0.0);
        assert_eq!(p(Stage::Download, 100).percent(), 25.0);
        assert_eq!(p(Stage::Decompress, 200).percent(), 100.0);
        assert_eq!(Progress { stage: Stage::Download, done: 5, total: None }.percent(), 0.0);
    }
}
