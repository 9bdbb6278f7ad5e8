//! The catalog at work: imports every configured entry once into a raw golden, idempotently
//! and resumably, for `tender serve` (in the background) and `tender catalog sync` (in the
//! foreground).
//!
//! An import is two steps. The compressed asset comes through the cache
//! ([`Mirror::asset`]): single-flight, retried and resumed from its spool by the fetch layer,
//! verified and trusted on first use. Then the verified object is decompressed into a sparse
//! raw file beside the golden, fsynced, and renamed into place. A crash in the first step
//! resumes from the spool; in the second, the decompression simply starts again from the
//! verified asset. After `attempts` failed attempts the golden is `Failed` with the reason.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use tender_fetch::flight::{Claim, Fill, FillState, Phase as FillPhase};
use tender_fetch::{Container, FetchError, FetchErrorKind, FetchSettings, Mirror};
use tender_oci::Digest;

use crate::api::{build_view, CatalogApi, CatalogView, SyncAccepted};
use crate::asset::Compression;
use crate::config::{CatalogSettings, Entry};
use crate::fsutil::{create_shared_dir, remove_stale_temps, sync_dir, temp_beside, TempGuard};
use crate::metrics::CatalogMetrics;
use crate::record::{now_secs, GoldenRecord, Phase, Progress, Records, Stage};
use crate::size::human;
use crate::sparse::{write_sparse, Written};

/// How hard an import tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportSettings {
    /// Attempts per golden and sync, the first included (each attempt's download is itself
    /// retried by the fetch layer, `fetch.attempts`).
    pub attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl ImportSettings {
    pub const ATTEMPTS: u32 = 3;

    /// Three attempts, backing off like the fetch layer (`fetch.backoffBase`, `fetch.backoffMax`).
    pub fn from_fetch(f: &FetchSettings) -> ImportSettings {
        ImportSettings { attempts: Self::ATTEMPTS, backoff_base: f.backoff_base, backoff_max: f.backoff_max }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        self.backoff_base.saturating_mul(1u32 << attempt.saturating_sub(1).min(16)).min(self.backoff_max)
    }
}

/// The compression container of an asset, as the fetch layer checks and decodes it.
pub fn container(c: Compression) -> Container {
    match c {
        Compression::None => Container::None,
        Compression::Xz => Container::Xz,
        Compression::Gz | Compression::TarGz => Container::Gz,
        Compression::Zst => Container::Zst,
    }
}

/// Wait until a fill committed (its digest) or failed, reporting its state as it goes.
pub async fn wait_committed(fill: &Fill, mut on_state: impl FnMut(&FillState)) -> Result<Digest, FetchError> {
    // Waited for by polling, without reading: not an abandoned fill.
    fill.keep();
    fill.started().await;
    loop {
        let s = fill.state();
        on_state(&s);
        match s.phase {
            FillPhase::Committed(d) => return Ok(d),
            FillPhase::Failed(e) => return Err(e),
            FillPhase::PassedThrough(_) => {
                return Err(FetchError::new(
                    FetchErrorKind::Local,
                    "store",
                    "verified but not stored: the data directory has no room for it (free space or cache.maxSize)",
                ))
            }
            FillPhase::Connecting | FillPhase::Streaming | FillPhase::Verified(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Hears how a sync goes (the CLI draws progress bars with it).
pub trait Observer: Send + Sync {
    fn progress(&self, _golden: &str, _p: &Progress) {}
    fn retrying(&self, _golden: &str, _attempt: u32, _reason: &str, _wait: Duration) {}
    fn finished(&self, _golden: &str, _record: &GoldenRecord) {}
}

/// An observer that hears nothing.
pub struct Quiet;
impl Observer for Quiet {}

/// What a sync did for one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub name: String,
    pub phase: Phase,
    /// Imported by this sync (false: it was already there, or it stays `Failed`).
    pub imported: bool,
    pub reason: Option<String>,
    /// The failure was a transient one (the factory could not be reached).
    pub transient: bool,
}

#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    pub outcomes: Vec<Outcome>,
}

/// Why the catalog cannot take a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// Rule 4: an entry whose golden exists was edited.
    #[error(
        "{key}: golden {name} already exists, and the entry changed its {changes}; an existing golden is never changed in place. fix: revert the entry, or add a new entry (another schematic or version), or remove the golden with `tender catalog rm {name}` and sync again",
        changes = changes.join(", ")
    )]
    Edited { key: String, name: String, changes: Vec<String> },
    #[error("catalog records under {dir}: {message}")]
    Records { dir: PathBuf, message: String },
}

impl CatalogError {
    /// The config key the error names.
    pub fn key(&self) -> String {
        match self {
            CatalogError::Edited { key, .. } => key.clone(),
            CatalogError::Records { .. } => "catalog".into(),
        }
    }
}

/// Rule 4: refuse an edit to the directory, size, class or source of an entry whose golden
/// already exists.
pub fn check_entries(data: &Path, settings: &CatalogSettings) -> Result<(), CatalogError> {
    let records = Records::new(data);
    for e in &settings.entries {
        let rec = records
            .get(&e.name)
            .map_err(|err| CatalogError::Records { dir: data.join("catalog"), message: err.to_string() })?;
        if let Some(r) = rec.filter(|r| r.phase == Phase::Succeeded) {
            let changes = r.changes(e);
            if !changes.is_empty() {
                return Err(CatalogError::Edited { key: e.key(), name: e.name.clone(), changes });
            }
        }
    }
    Ok(())
}

struct Active {
    settings: CatalogSettings,
    mirror: Arc<Mirror>,
    import: ImportSettings,
}

/// The catalog of one data directory.
pub struct Catalog {
    data: PathBuf,
    records: Records,
    active: RwLock<Arc<Active>>,
    live: Mutex<HashMap<String, Progress>>,
    metrics: CatalogMetrics,
    run_lock: tokio::sync::Mutex<()>,
    again: AtomicBool,
    me: Weak<Catalog>,
}

/// A failed import attempt.
struct AttemptError {
    message: String,
    /// Another attempt may succeed.
    retry: bool,
    /// Could not reach something (exit 3 rather than 1).
    transient: bool,
}

impl AttemptError {
    fn fetch(e: &FetchError) -> AttemptError {
        AttemptError { message: e.to_string(), retry: e.is_retryable(), transient: e.is_upstream_down() }
    }
    fn local(message: String) -> AttemptError {
        AttemptError { message, retry: true, transient: false }
    }
    fn fatal(message: String) -> AttemptError {
        AttemptError { message, retry: false, transient: false }
    }
}

impl Catalog {
    /// The catalog of `data` with these entries, after checking them against the goldens
    /// that exist (rule 4).
    pub fn open(
        data: &Path,
        settings: CatalogSettings,
        mirror: Arc<Mirror>,
        import: ImportSettings,
        metrics: CatalogMetrics,
    ) -> Result<Arc<Catalog>, CatalogError> {
        check_entries(data, &settings)?;
        let catalog = Arc::new_cyclic(|me| Catalog {
            data: data.to_path_buf(),
            records: Records::new(data),
            active: RwLock::new(Arc::new(Active { settings, mirror, import })),
            live: Mutex::new(HashMap::new()),
            metrics,
            run_lock: tokio::sync::Mutex::new(()),
            again: AtomicBool::new(false),
            me: me.clone(),
        });
        catalog.update_metrics();
        Ok(catalog)
    }

    /// Take a reloaded configuration, unless it edits an existing golden (then the running
    /// one stays).
    pub fn reconfigure(
        &self,
        settings: CatalogSettings,
        mirror: Arc<Mirror>,
        import: ImportSettings,
    ) -> Result<(), CatalogError> {
        check_entries(&self.data, &settings)?;
        let next = Arc::new(Active { settings, mirror, import });
        match self.active.write() {
            Ok(mut a) => *a = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
        self.update_metrics();
        Ok(())
    }

    fn active(&self) -> Arc<Active> {
        match self.active.read() {
            Ok(a) => a.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn settings(&self) -> CatalogSettings {
        self.active().settings.clone()
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Progress>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every golden, with live progress.
    pub fn view(&self) -> io::Result<CatalogView> {
        let live = self.live().clone();
        build_view(&self.data, Some(&self.active().settings), &live)
    }

    fn update_metrics(&self) {
        match self.view() {
            Ok(v) => self.metrics.set(&v.goldens.iter().map(|g| g.phase).collect::<Vec<_>>()),
            Err(e) => tracing::warn!(error = %e, "catalog: cannot read the golden records for metrics"),
        }
    }

    fn save(&self, rec: &mut GoldenRecord) {
        rec.updated_at = now_secs();
        if let Err(e) = self.records.put(rec) {
            tracing::warn!(golden = %rec.name, error = %e, "catalog: cannot write the golden record");
        }
    }

    /// Give managed `Failed` goldens another chance: back to `Pending`.
    pub fn reset_failed(&self) -> usize {
        let mut n = 0;
        for e in &self.active().settings.entries {
            if let Ok(Some(mut r)) = self.records.get(&e.name) {
                if r.phase == Phase::Failed {
                    r.phase = Phase::Pending;
                    r.reason = None;
                    r.transient = false;
                    r.attempts = 0;
                    self.save(&mut r);
                    n += 1;
                }
            }
        }
        self.update_metrics();
        n
    }

    /// Import every pending entry now (the foreground `tender catalog sync`).
    pub async fn sync(&self, retry_failed: bool, observer: &dyn Observer) -> SyncReport {
        let _running = self.run_lock.lock().await;
        if retry_failed {
            self.reset_failed();
        }
        self.pass(observer).await
    }

    /// Import pending entries in the background; a request while a sync runs makes it go
    /// round once more.
    pub fn spawn_sync(&self, retry_failed: bool) -> SyncAccepted {
        if retry_failed {
            self.reset_failed();
        }
        self.again.store(true, Ordering::SeqCst);
        if let Some(me) = self.me.upgrade() {
            tokio::spawn(async move {
                loop {
                    {
                        let Ok(_running) = me.run_lock.try_lock() else { return };
                        while me.again.swap(false, Ordering::SeqCst) {
                            let report = me.pass(&Quiet).await;
                            let failed = report.outcomes.iter().filter(|o| o.phase == Phase::Failed).count();
                            tracing::info!(entries = report.outcomes.len(), failed, "catalog sync finished");
                        }
                    }
                    // A request that came while the lock was being released finds nobody.
                    if !me.again.load(Ordering::SeqCst) {
                        return;
                    }
                }
            });
        }
        SyncAccepted { entries: self.active().settings.entries.len(), retry_failed }
    }

    async fn pass(&self, observer: &dyn Observer) -> SyncReport {
        let active = self.active();
        let mut report = SyncReport::default();
        for entry in &active.settings.entries {
            let outcome = self.sync_entry(&active, entry, observer).await;
            report.outcomes.push(outcome);
        }
        self.update_metrics();
        report
    }

    async fn sync_entry(&self, active: &Active, entry: &Entry, observer: &dyn Observer) -> Outcome {
        let outcome = |rec: &GoldenRecord, imported: bool| Outcome {
            name: rec.name.clone(),
            phase: rec.phase,
            imported,
            reason: rec.reason.clone(),
            transient: rec.phase == Phase::Failed && rec.transient,
        };
        let mut rec = match self.records.get(&entry.name) {
            Ok(Some(r)) => r,
            Ok(None) => {
                let mut r = GoldenRecord::pending(entry);
                self.save(&mut r);
                r
            }
            Err(e) => {
                return Outcome {
                    name: entry.name.clone(),
                    phase: Phase::Failed,
                    imported: false,
                    reason: Some(format!("cannot read its record: {e}")),
                    transient: false,
                }
            }
        };
        match rec.phase {
            Phase::Succeeded if rec.path.is_file() => return outcome(&rec, false),
            Phase::Succeeded => {
                tracing::warn!(golden = %rec.name, path = %rec.path.display(), "catalog: the golden's file is gone; importing it again");
                rec.phase = Phase::Pending;
            }
            _ => {
                if !rec.changes(entry).is_empty() {
                    // Not imported yet, so the entry may still change; a new setting deserves a fresh try.
                    rec.adopt(entry);
                    if rec.phase == Phase::Failed {
                        rec.phase = Phase::Pending;
                        rec.reason = None;
                    }
                    self.save(&mut rec);
                }
            }
        }
        if rec.phase == Phase::Failed {
            return outcome(&rec, false);
        }
        self.import(active, entry, rec, observer).await
    }

    async fn import(&self, active: &Active, entry: &Entry, mut rec: GoldenRecord, observer: &dyn Observer) -> Outcome {
        let attempts = active.import.attempts.max(1);
        for attempt in 1..=attempts {
            rec.phase = Phase::ImportInProgress;
            rec.attempts = attempt;
            rec.reason = None;
            rec.progress = None;
            self.save(&mut rec);
            self.update_metrics();
            tracing::info!(golden = %rec.name, attempt, asset = %entry.source.file_name(), "catalog: importing");
            let result = self.attempt(active, entry, &rec, observer).await;
            self.live().remove(&rec.name);
            match result {
                Ok((digest, w)) => {
                    rec.phase = Phase::Succeeded;
                    rec.progress = None;
                    rec.asset_digest = Some(digest.to_string());
                    rec.virtual_size = Some(w.len);
                    rec.sha256 = Some(w.sha256.clone());
                    rec.imported_at = Some(now_secs());
                    rec.transient = false;
                    self.save(&mut rec);
                    self.update_metrics();
                    tracing::info!(golden = %rec.name, size = w.len, sha256 = %w.sha256, "catalog: golden imported");
                    observer.finished(&rec.name, &rec);
                    return Outcome {
                        name: rec.name.clone(),
                        phase: rec.phase,
                        imported: true,
                        reason: None,
                        transient: false,
                    };
                }
                Err(e) if e.retry && attempt < attempts => {
                    let wait = active.import.backoff(attempt);
                    tracing::warn!(golden = %rec.name, attempt, error = %e.message, wait_ms = wait.as_millis() as u64, "catalog: import attempt failed; retrying");
                    observer.retrying(&rec.name, attempt, &e.message, wait);
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    rec.phase = Phase::Failed;
                    rec.progress = None;
                    rec.reason = Some(format!("attempt {attempt} of {attempts}: {}", e.message));
                    rec.transient = e.transient;
                    self.save(&mut rec);
                    self.update_metrics();
                    tracing::error!(golden = %rec.name, reason = %e.message, "catalog: import failed");
                    observer.finished(&rec.name, &rec);
                    return Outcome {
                        name: rec.name.clone(),
                        phase: rec.phase,
                        imported: false,
                        reason: rec.reason.clone(),
                        transient: e.transient,
                    };
                }
            }
        }
        // Unreachable: the last attempt returns above.
        debug_assert!(false, "import loop ended without an outcome");
        Outcome {
            name: rec.name.clone(),
            phase: rec.phase,
            imported: false,
            reason: rec.reason.clone(),
            transient: false,
        }
    }

    fn report(&self, rec: &GoldenRecord, p: Progress, observer: &dyn Observer, last_saved: &mut Instant) {
        self.live().insert(rec.name.clone(), p);
        observer.progress(&rec.name, &p);
        if last_saved.elapsed() >= Duration::from_secs(1) {
            *last_saved = Instant::now();
            let mut r = rec.clone();
            r.progress = Some(p);
            self.save(&mut r);
        }
    }

    async fn attempt(
        &self,
        active: &Active,
        entry: &Entry,
        rec: &GoldenRecord,
        observer: &dyn Observer,
    ) -> Result<(Digest, Written), AttemptError> {
        let asset =
            entry.source.asset().map_err(|e| AttemptError::fatal(format!("{}: {e}", entry.source.file_name())))?;
        let c = container(asset.compression());
        let mut last_saved = Instant::now();
        let digest = match active.mirror.asset(&asset.path(), &asset.key(), c).map_err(|e| AttemptError::fetch(&e))? {
            Claim::Stored(d) => d,
            Claim::Filling(fill) => wait_committed(&fill, |s| {
                let p = Progress { stage: Stage::Download, done: s.written, total: s.total };
                self.report(rec, p, observer, &mut last_saved);
            })
            .await
            .map_err(|e| AttemptError::fetch(&e))?,
        };
        let object = active.mirror.flights().store().object_path(&digest);
        let total = fs::metadata(&object).map(|m| m.len()).ok();
        let consumed = Arc::new(AtomicU64::new(0));
        let (dest, storage, key) = (entry.golden_path(), entry.storage_bytes, entry.key());
        let storage_text = entry.storage.clone().unwrap_or_default();
        let counter = consumed.clone();
        let mut task =
            tokio::task::spawn_blocking(move || decompress(&object, c, &dest, storage, &storage_text, &key, counter));
        let written = loop {
            tokio::select! {
                done = &mut task => break done,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    let p = Progress { stage: Stage::Decompress, done: consumed.load(Ordering::Relaxed), total };
                    self.report(rec, p, observer, &mut last_saved);
                }
            }
        };
        let p = Progress { stage: Stage::Decompress, done: total.unwrap_or(0), total };
        observer.progress(&rec.name, &p);
        match written {
            Ok(Ok(w)) => Ok((digest, w)),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(AttemptError::local(format!("decompression task: {e}"))),
        }
    }
}

impl CatalogApi for Catalog {
    fn view(&self) -> Result<CatalogView, String> {
        Catalog::view(self).map_err(|e| e.to_string())
    }

    fn request_sync(&self, retry_failed: bool) -> Result<SyncAccepted, String> {
        Ok(self.spawn_sync(retry_failed))
    }
}

/// Counts bytes read through it.
struct Counting<R> {
    inner: R,
    n: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n.fetch_add(k as u64, Ordering::Relaxed);
        Ok(k)
    }
}

/// Decompress the verified asset into `<dest>` through a temp file beside it: sparse, fsynced,
/// read-only, renamed into place, directory fsynced.
fn decompress(
    object: &Path,
    c: Container,
    dest: &Path,
    storage: Option<u64>,
    storage_text: &str,
    key: &str,
    consumed: Arc<AtomicU64>,
) -> Result<Written, AttemptError> {
    let local = |what: &str, e: io::Error| AttemptError::local(format!("{what}: {e}"));
    let dir = dest.parent().ok_or_else(|| AttemptError::fatal(format!("{} has no directory", dest.display())))?;
    create_shared_dir(dir).map_err(|e| local(&format!("creating {}", dir.display()), e))?;
    remove_stale_temps(dest).map_err(|e| local("removing an interrupted decompression", e))?;
    let tmp = TempGuard::new(temp_beside(dest).map_err(|e| local("temp file", e))?);
    let out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp.path())
        .map_err(|e| local(&format!("creating {}", tmp.path().display()), e))?;
    let src = File::open(object).map_err(|e| local("opening the cached asset (evicted? it is fetched again)", e))?;
    let mut decoder =
        c.decoder(Counting { inner: src, n: consumed }).map_err(|e| local("opening the asset's container", e))?;
    let w = write_sparse(&mut decoder, &out, storage, &mut |_| {})
        .map_err(|e| local(&format!("decompressing into {}", tmp.path().display()), e))?;
    if let Some(s) = storage {
        if w.content_len > s {
            return Err(AttemptError::fatal(format!(
                "the image is {} ({} bytes), larger than storage {storage_text} ({s} bytes); fix: raise {key}.storage, or drop it",
                human(w.content_len),
                w.content_len
            )));
        }
    }
    out.set_permissions(fs::Permissions::from_mode(0o444)).map_err(|e| local("making the golden read-only", e))?;
    out.sync_all().map_err(|e| local("fsync", e))?;
    drop(out);
    fs::rename(tmp.path(), dest).map_err(|e| local(&format!("renaming into {}", dest.display()), e))?;
    tmp.keep();
    sync_dir(dir).map_err(|e| local("fsync of the golden directory", e))?;
    Ok(w)
}
