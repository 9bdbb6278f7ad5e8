//! What the catalog shows: one view per golden, the same for `tender catalog ls`, the server's
//! `GET /api/v1/catalog` and `tender catalog sync --server`. [`CatalogApi`] is how the HTTP
//! layer reaches the catalog without knowing how it works.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::clones::Registry;
use crate::config::{CatalogSettings, Source};
use crate::record::{now_secs, GoldenRecord, Phase, Progress, Records};

/// One golden as shown to people and programs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GoldenView {
    pub name: String,
    /// The config names it (`catalog.images[i]`); a golden whose entry was dropped is kept
    /// but no longer managed.
    pub entry: Option<String>,
    pub phase: Phase,
    /// Overall import progress while `ImportInProgress`.
    pub percent: Option<f64>,
    pub progress: Option<Progress>,
    /// Why the import failed.
    pub reason: Option<String>,
    /// The failure was transient (the factory could not be reached).
    #[serde(default)]
    pub transient: bool,
    pub virtual_size: Option<u64>,
    /// sha256 of the raw golden (hex).
    pub sha256: Option<String>,
    pub path: PathBuf,
    pub dir: PathBuf,
    /// Seconds since the import finished (or since the golden was first configured).
    pub age_seconds: u64,
    /// Worker disks recorded as made from it.
    pub clones: usize,
    pub source: Source,
    pub storage_class: Option<String>,
    pub storage: Option<String>,
    pub attempts: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CatalogView {
    pub goldens: Vec<GoldenView>,
}

impl CatalogView {
    /// Managed goldens still on their way (Pending or ImportInProgress).
    pub fn open(&self) -> impl Iterator<Item = &GoldenView> {
        self.goldens.iter().filter(|g| g.entry.is_some() && g.phase.is_open())
    }
}

/// The answer to a sync request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncAccepted {
    /// Entries the sync covers.
    pub entries: usize,
    pub retry_failed: bool,
}

/// The catalog as the HTTP layer sees it.
pub trait CatalogApi: Send + Sync {
    /// Every golden (`GET /api/v1/catalog`).
    fn view(&self) -> Result<CatalogView, String>;
    /// Start importing pending entries in the background, `Failed` ones too when asked
    /// (`POST /api/v1/admin/catalog/sync`). Returns at once.
    fn request_sync(&self, retry_failed: bool) -> Result<SyncAccepted, String>;
}

/// Build the view from the records under `data`, the configured entries (an entry with no
/// record yet is `Pending`) and the live progress of imports running in this process.
pub fn build_view(
    data: &Path,
    settings: Option<&CatalogSettings>,
    live: &HashMap<String, Progress>,
) -> io::Result<CatalogView> {
    let mut records = Records::new(data).list()?;
    if let Some(s) = settings {
        for e in &s.entries {
            if !records.iter().any(|r| r.name == e.name) {
                records.push(GoldenRecord::pending(e));
            }
        }
    }
    records.sort_by(|a, b| a.name.cmp(&b.name));
    let clones = Registry::new(data).list().unwrap_or_default();
    let now = now_secs();
    let goldens = records
        .into_iter()
        .map(|r| {
            let entry = settings.and_then(|s| s.entry(&r.name)).map(|e| e.key());
            let progress =
                if r.phase == Phase::ImportInProgress { live.get(&r.name).copied().or(r.progress) } else { None };
            GoldenView {
                entry,
                phase: r.phase,
                percent: progress.map(|p| p.percent()),
                progress,
                reason: r.reason.clone(),
                transient: r.transient,
                virtual_size: r.virtual_size,
                sha256: r.sha256.clone(),
                age_seconds: now.saturating_sub(r.imported_at.unwrap_or(r.created_at)),
                clones: clones.iter().filter(|c| c.golden == r.name).count(),
                storage_class: r.storage_class.clone(),
                storage: r.storage.clone(),
                attempts: r.attempts,
                path: r.path,
                dir: r.dir,
                source: r.source,
                name: r.name,
            }
        })
        .collect();
    Ok(CatalogView { goldens })
}
