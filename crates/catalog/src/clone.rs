//! Worker system disks from goldens: a `raw` reflink (copy-on-write) clone grown sparsely to
//! the worker's size, or a `qcow2` overlay backed by the golden.
//!
//! A clone that would silently degrade or be wrong is refused before anything is created,
//! naming the cause and the way out: the golden is absent or `Failed`; a `raw` clone onto
//! another filesystem, or onto one without reflinks (that would be a full copy: allowed only
//! with `--allow-copy`); a size below the golden's. Not refusals: a golden still importing is
//! waited for (the caller polls [`plan`]), and a worker whose disk already exists and belongs
//! to that golden and pool is left as it is — for `raw` even if the golden has since gone,
//! while a `qcow2` overlay whose golden is gone cannot be read, and says so.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::clones::{read_tags, write_tags, CloneRecord, Format, Method, Registry};
use crate::fsutil::{sync_dir, temp_beside, TempGuard};
use crate::record::{now_secs, valid_name, GoldenRecord, Phase, Records};
use crate::size::human;
use crate::sparse::write_sparse;

/// One worker disk to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneRequest {
    pub golden: String,
    pub pool: String,
    pub worker: String,
    /// Virtual size in bytes.
    pub size: u64,
    pub to: PathBuf,
    pub format: Format,
    pub allow_copy: bool,
    /// The config names this golden (so a golden with no record yet is `Pending`, not absent).
    pub configured: bool,
}

/// What [`execute`] will do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The disk exists and belongs to this golden and pool: leave it untouched.
    Exists { to: PathBuf, format: Format, worker: Option<String>, size: u64 },
    /// A copy-on-write clone of the golden, grown to `size`.
    Reflink { golden: PathBuf, to: PathBuf, size: u64 },
    /// A full (sparse) copy, because `--allow-copy` was given.
    Copy { golden: PathBuf, to: PathBuf, size: u64, why: String },
    /// A qcow2 overlay backed by the golden.
    Overlay { golden: PathBuf, to: PathBuf, size: u64 },
}

impl Plan {
    pub fn describe(&self) -> String {
        match self {
            Plan::Exists { to, format, worker, size } => format!(
                "{} already exists ({} disk of {}{}) and belongs to this golden and pool: left untouched",
                to.display(),
                format.as_str(),
                human(*size),
                worker.as_ref().map(|w| format!(", worker {w}")).unwrap_or_default()
            ),
            Plan::Reflink { golden, to, size } => format!(
                "reflink (copy-on-write) clone of {} to {}, grown sparsely to {} ({size} bytes)",
                golden.display(),
                to.display(),
                human(*size)
            ),
            Plan::Copy { golden, to, size, why } => format!(
                "full sparse copy of {} to {} ({why}; allowed by --allow-copy), grown to {} ({size} bytes)",
                golden.display(),
                to.display(),
                human(*size)
            ),
            Plan::Overlay { golden, to, size } => format!(
                "qcow2 overlay {} backed by {}, virtual size {} ({size} bytes)",
                to.display(),
                golden.display(),
                human(*size)
            ),
        }
    }
}

/// Why a clone is not made. Every message names the cause and the way out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    Usage(String),
    #[error(
        "golden {golden} does not exist in {data}{detail}; fix: add its entry to catalog.images and run `tender catalog sync` (`tender catalog ls` lists the goldens)"
    )]
    NoGolden { golden: String, data: PathBuf, detail: String },
    #[error("golden {golden} failed to import: {reason}; fix: `tender catalog sync --retry-failed`, or clone another golden")]
    GoldenFailed { golden: String, reason: String },
    /// Not a refusal for long: the caller waits (`--wait`) while an importer runs.
    #[error("golden {golden} is {phase}{progress}{hint}")]
    NotReady { golden: String, phase: Phase, progress: String, importer: bool, hint: String },
    #[error(
        "--size {size} bytes ({}) is smaller than golden {golden}'s virtual size {virtual_size} bytes ({}); a disk cannot be smaller than its source; fix: --size {virtual_size} or more",
        human(*size), human(*virtual_size)
    )]
    TooSmall { golden: String, size: u64, virtual_size: u64 },
    #[error(
        "{to} is on another filesystem than golden {golden} ({golden_path}): a raw disk there would be a full copy of {}, not a copy-on-write clone; fix: put --to on the golden's filesystem (beside {golden_path}), or use --format qcow2, or pass --allow-copy to accept a full copy",
        human(*size)
    )]
    OtherFilesystem { to: String, golden: String, golden_path: String, size: u64 },
    #[error(
        "the filesystem of {dir} has no reflinks (FICLONE: {error}): a raw disk there would be a full copy of {}, not a copy-on-write clone; fix: keep goldens and raw disks on a filesystem with reflinks (XFS with reflink=1, Btrfs), or use --format qcow2, or pass --allow-copy to accept a full copy",
        human(*size)
    )]
    NoReflink { dir: String, error: String, size: u64 },
    #[error("{to} already exists and is not golden {golden}'s disk for pool {pool} ({owner}); fix: choose another --to, or remove it")]
    Occupied { to: String, golden: String, pool: String, owner: String },
    #[error(
        "{to} is a qcow2 overlay of golden {golden}, whose file {golden_path} is gone: the overlay cannot be read; fix: import the golden again (`tender catalog sync`) or remove {to} and clone it anew"
    )]
    BackingGone { to: String, golden: String, golden_path: String },
    #[error("{0}")]
    Io(String),
}

impl Refusal {
    /// A refusal worth waiting out (the golden is still importing and someone imports it).
    pub fn is_wait(&self) -> bool {
        matches!(self, Refusal::NotReady { importer: true, .. })
    }
}

fn io_err(what: impl std::fmt::Display, e: io::Error) -> Refusal {
    Refusal::Io(format!("{what}: {e}"))
}

fn check_label(what: &str, v: &str) -> Result<(), Refusal> {
    let ok = !v.is_empty() && v.len() <= 253 && !v.chars().any(|c| c.is_control() || c == '/');
    if ok {
        Ok(())
    } else {
        Err(Refusal::Usage(format!(
            "--{what} {v:?} is not a name; fix: use the exact {what} name, without slashes or control characters"
        )))
    }
}

/// `--to` made absolute through its (existing) directory.
fn target_path(to: &Path) -> Result<PathBuf, Refusal> {
    let name = to
        .file_name()
        .ok_or_else(|| Refusal::Usage(format!("--to {} names no file; fix: give the disk's path", to.display())))?;
    let parent = match to.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dir = parent.canonicalize().map_err(|e| {
        Refusal::Usage(format!(
            "--to {}: directory {} is not usable ({e}); fix: create it first",
            to.display(),
            parent.display()
        ))
    })?;
    Ok(dir.join(name))
}

/// Who a disk at `to` belongs to: the registry first, then the disk's own attributes.
fn owner(registry: &Registry, to: &Path) -> (Option<CloneRecord>, Option<(String, String)>) {
    let rec = registry.at(to).ok().flatten();
    if let Some(r) = &rec {
        return (rec.clone(), Some((r.golden.clone(), r.pool.clone())));
    }
    let tags = read_tags(to);
    match (tags.golden, tags.pool) {
        (Some(g), Some(p)) => (None, Some((g, p))),
        _ => (None, None),
    }
}

/// Whether the file at `path` is a qcow2 image (by its magic).
fn is_qcow2(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"QFI\xfb"
}

/// Decide what to do (or why not), changing nothing. `data` is tender's data directory.
pub fn plan(data: &Path, req: &CloneRequest) -> Result<Plan, Refusal> {
    if !valid_name(&req.golden) {
        return Err(Refusal::Usage(format!(
            "{:?} is not a golden name; fix: use a name from `tender catalog ls`, like talos-worker-<schematic>-<version>",
            req.golden
        )));
    }
    check_label("pool", &req.pool)?;
    check_label("worker", &req.worker)?;
    let to = target_path(&req.to)?;
    let registry = Registry::new(data);
    let record = Records::new(data).get(&req.golden).map_err(|e| io_err("reading the golden's record", e))?;

    if fs::symlink_metadata(&to).is_ok() {
        let (rec, own) = owner(&registry, &to);
        let mine = own.as_ref().is_some_and(|(g, p)| *g == req.golden && *p == req.pool);
        if !mine {
            let owner = match own {
                Some((g, p)) => format!("it is golden {g}'s disk for pool {p}"),
                None => "tender has no record of it".to_string(),
            };
            return Err(Refusal::Occupied {
                to: to.display().to_string(),
                golden: req.golden.clone(),
                pool: req.pool.clone(),
                owner,
            });
        }
        let format = rec.as_ref().map(|r| r.format).unwrap_or(if is_qcow2(&to) { Format::Qcow2 } else { Format::Raw });
        if format != req.format {
            return Err(Refusal::Occupied {
                to: to.display().to_string(),
                golden: req.golden.clone(),
                pool: req.pool.clone(),
                owner: format!(
                    "it is this golden's {} disk, and --format {} was asked",
                    format.as_str(),
                    req.format.as_str()
                ),
            });
        }
        if format == Format::Qcow2 {
            let golden_path = record.as_ref().map(|r| r.path.clone());
            if !golden_path.as_ref().is_some_and(|p| p.is_file()) {
                return Err(Refusal::BackingGone {
                    to: to.display().to_string(),
                    golden: req.golden.clone(),
                    golden_path: golden_path.map(|p| p.display().to_string()).unwrap_or_else(|| "(no record)".into()),
                });
            }
        }
        let size = fs::metadata(&to).map(|m| m.len()).unwrap_or(0);
        let size = if format == Format::Qcow2 { rec.as_ref().map_or(size, |r| r.size) } else { size };
        return Ok(Plan::Exists { to, format, worker: rec.map(|r| r.worker), size });
    }

    let golden = usable_golden(data, &req.golden, record, req.configured)?;
    let virtual_size = golden.virtual_size.unwrap_or(0);
    if req.size < virtual_size {
        return Err(Refusal::TooSmall { golden: req.golden.clone(), size: req.size, virtual_size });
    }
    let golden_path = golden.path.clone();
    match req.format {
        Format::Qcow2 => Ok(Plan::Overlay { golden: golden_path, to, size: req.size }),
        Format::Raw => {
            let dir = to.parent().map(Path::to_path_buf).unwrap_or_default();
            let golden_dev = fs::metadata(&golden_path).map_err(|e| io_err(golden_path.display(), e))?.dev();
            let to_dev = fs::metadata(&dir).map_err(|e| io_err(dir.display(), e))?.dev();
            if golden_dev != to_dev {
                if req.allow_copy {
                    return Ok(Plan::Copy {
                        golden: golden_path,
                        to,
                        size: req.size,
                        why: "another filesystem than the golden's".into(),
                    });
                }
                return Err(Refusal::OtherFilesystem {
                    to: to.display().to_string(),
                    golden: req.golden.clone(),
                    golden_path: golden_path.display().to_string(),
                    size: virtual_size,
                });
            }
            match probe_reflink(&dir) {
                Ok(()) => Ok(Plan::Reflink { golden: golden_path, to, size: req.size }),
                Err(e) if req.allow_copy => {
                    Ok(Plan::Copy { golden: golden_path, to, size: req.size, why: format!("no reflinks here ({e})") })
                }
                Err(e) => Err(Refusal::NoReflink { dir: dir.display().to_string(), error: e, size: virtual_size }),
            }
        }
    }
}

/// The golden, if a clone can be made from it now.
fn usable_golden(
    data: &Path,
    name: &str,
    record: Option<GoldenRecord>,
    configured: bool,
) -> Result<GoldenRecord, Refusal> {
    let phase = match &record {
        Some(g) => g.phase,
        None if configured => Phase::Pending,
        None => {
            return Err(Refusal::NoGolden { golden: name.to_string(), data: data.to_path_buf(), detail: String::new() })
        }
    };
    match phase {
        Phase::Succeeded => match record {
            Some(g) if g.path.is_file() => Ok(g),
            g => Err(Refusal::NoGolden {
                golden: name.to_string(),
                data: data.to_path_buf(),
                detail: format!(" (its file {} is gone)", g.map(|g| g.path.display().to_string()).unwrap_or_default()),
            }),
        },
        Phase::Failed => Err(Refusal::GoldenFailed {
            golden: name.to_string(),
            reason: record.and_then(|g| g.reason).unwrap_or_else(|| "no reason recorded".into()),
        }),
        Phase::Pending | Phase::ImportInProgress => {
            let importer = tender_store::Store::is_locked(data);
            let progress = match (phase, record.and_then(|g| g.progress)) {
                (Phase::ImportInProgress, Some(p)) => format!(" ({:.0}%)", p.percent()),
                _ => String::new(),
            };
            let hint = if importer {
                String::new()
            } else {
                format!(
                    ", and no tender holds {} to import it; fix: start `tender serve`, or run `tender catalog sync`",
                    data.display()
                )
            };
            Err(Refusal::NotReady { golden: name.to_string(), phase, progress, importer, hint })
        }
    }
}

/// Whether files in `dir` can be reflinked: clone one small temp file into another (both
/// removed again).
pub fn probe_reflink(dir: &Path) -> Result<(), String> {
    let a = TempGuard::new(temp_beside(&dir.join("reflink-probe")).map_err(|e| e.to_string())?);
    let b = TempGuard::new(temp_beside(&dir.join("reflink-probe")).map_err(|e| e.to_string())?);
    let mut fa = OpenOptions::new().write(true).create_new(true).open(a.path()).map_err(|e| e.to_string())?;
    fa.write_all(&[0x5a; 4096]).map_err(|e| e.to_string())?;
    fa.sync_all().map_err(|e| e.to_string())?;
    let fb = OpenOptions::new().write(true).create_new(true).open(b.path()).map_err(|e| e.to_string())?;
    let src = File::open(a.path()).map_err(|e| e.to_string())?;
    rustix::fs::ioctl_ficlone(&fb, &src).map_err(errno_text)
}

fn errno_text(e: rustix::io::Errno) -> String {
    let name = match e {
        rustix::io::Errno::OPNOTSUPP => "EOPNOTSUPP",
        rustix::io::Errno::XDEV => "EXDEV",
        rustix::io::Errno::INVAL => "EINVAL",
        rustix::io::Errno::NOTTY => "ENOTTY",
        rustix::io::Errno::NOSYS => "ENOSYS",
        _ => "",
    };
    let text = io::Error::from_raw_os_error(e.raw_os_error()).to_string();
    if name.is_empty() {
        text
    } else {
        format!("{name}, {text}")
    }
}

/// What [`execute`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    pub record: CloneRecord,
    /// False when the plan was `Exists`: nothing was touched.
    pub created: bool,
    /// The disk carries the `user.tender.*` attributes.
    pub tagged: bool,
}

/// Carry out a plan made by [`plan`] for `req`.
pub fn execute(data: &Path, req: &CloneRequest, plan: &Plan) -> Result<Done, Refusal> {
    let registry = Registry::new(data);
    let record = |to: &Path, method: Method, size: u64| CloneRecord {
        path: to.to_path_buf(),
        golden: req.golden.clone(),
        pool: req.pool.clone(),
        worker: req.worker.clone(),
        format: req.format,
        method,
        size,
        created: now_secs(),
    };
    let (to, method, size) = match plan {
        Plan::Exists { to, format, worker, size } => {
            let known = registry.at(to).map_err(|e| io_err("reading the clone registry", e))?;
            let rec = match known {
                Some(r) => r,
                None => {
                    // Tagged but unrecorded (a crash between placing and recording): record it.
                    let method = if *format == Format::Qcow2 { Method::Overlay } else { Method::Reflink };
                    let mut r = record(to, method, *size);
                    r.format = *format;
                    r.worker = worker.clone().unwrap_or_else(|| req.worker.clone());
                    registry.add(r.clone()).map_err(|e| io_err("recording the clone", e))?;
                    r
                }
            };
            return Ok(Done { record: rec, created: false, tagged: read_tags(to).golden.is_some() });
        }
        Plan::Reflink { to, size, .. } => (to, Method::Reflink, *size),
        Plan::Copy { to, size, .. } => (to, Method::Copy, *size),
        Plan::Overlay { to, size, .. } => (to, Method::Overlay, *size),
    };
    let tmp = TempGuard::new(temp_beside(to).map_err(|e| io_err(to.display(), e))?);
    match plan {
        Plan::Reflink { golden, .. } => {
            let src = File::open(golden).map_err(|e| io_err(golden.display(), e))?;
            let out = create(tmp.path())?;
            rustix::fs::ioctl_ficlone(&out, &src).map_err(|e| Refusal::NoReflink {
                dir: to.parent().map(|p| p.display().to_string()).unwrap_or_default(),
                error: errno_text(e),
                size: src.metadata().map(|m| m.len()).unwrap_or(0),
            })?;
            if out.metadata().map_err(|e| io_err(tmp.path().display(), e))?.len() < size {
                out.set_len(size).map_err(|e| io_err("growing the disk", e))?;
            }
            out.sync_all().map_err(|e| io_err("fsync", e))?;
        }
        Plan::Copy { golden, .. } => {
            let mut src = File::open(golden).map_err(|e| io_err(golden.display(), e))?;
            let out = create(tmp.path())?;
            write_sparse(&mut src, &out, Some(size), &mut |_| {}).map_err(|e| io_err("copying the golden", e))?;
            out.sync_all().map_err(|e| io_err("fsync", e))?;
        }
        Plan::Overlay { golden, .. } => {
            let output = Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
                .arg(golden)
                .arg(tmp.path())
                .arg(size.to_string())
                .output()
                .map_err(|e| {
                    Refusal::Io(format!("cannot run qemu-img ({e}); fix: install qemu-utils, or use --format raw"))
                })?;
            if !output.status.success() {
                return Err(Refusal::Io(format!(
                    "qemu-img create failed: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                )));
            }
            File::open(tmp.path()).and_then(|f| f.sync_all()).map_err(|e| io_err("fsync", e))?;
        }
        Plan::Exists { .. } => {}
    }
    let tagged = {
        let f = OpenOptions::new().write(true).open(tmp.path()).map_err(|e| io_err(tmp.path().display(), e))?;
        write_tags(&f, &req.golden, &req.pool, &req.worker).map_err(|e| io_err("tagging the disk", e))?
    };
    place(tmp.path(), to, &req.golden, &req.pool)?;
    tmp.keep();
    if let Some(dir) = to.parent() {
        sync_dir(dir).map_err(|e| io_err("fsync of the disk's directory", e))?;
    }
    let rec = record(to, method, size);
    registry.add(rec.clone()).map_err(|e| io_err("recording the clone", e))?;
    Ok(Done { record: rec, created: true, tagged })
}

fn create(path: &Path) -> Result<File, Refusal> {
    OpenOptions::new().read(true).write(true).create_new(true).open(path).map_err(|e| io_err(path.display(), e))
}

/// Move the finished disk into place, never over an existing file.
fn place(tmp: &Path, to: &Path, golden: &str, pool: &str) -> Result<(), Refusal> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    match renameat_with(CWD, tmp, CWD, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::EXIST) => Err(Refusal::Occupied {
            to: to.display().to_string(),
            golden: golden.to_string(),
            pool: pool.to_string(),
            owner: "it appeared while the clone was made".into(),
        }),
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS | rustix::io::Errno::OPNOTSUPP) => {
            // No RENAME_NOREPLACE here: a hard link fails the same way on an existing name.
            fs::hard_link(tmp, to).map_err(|e| io_err(format!("placing {}", to.display()), e))?;
            fs::remove_file(tmp).map_err(|e| io_err(tmp.display(), e))
        }
        Err(e) => Err(io_err(format!("placing {}", to.display()), io::Error::from_raw_os_error(e.raw_os_error()))),
    }
}

/// A clone of a golden as `refs` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ref {
    #[serde(flatten)]
    pub record: CloneRecord,
    /// The disk is still there.
    pub exists: bool,
}

/// The clones recorded for `golden`, each flagged whether it still exists.
pub fn refs(data: &Path, golden: &str) -> io::Result<Vec<Ref>> {
    Ok(Registry::new(data)
        .of_golden(golden)?
        .into_iter()
        .map(|r| {
            let exists = r.path.exists();
            Ref { record: r, exists }
        })
        .collect())
}

/// Why `catalog rm` does not remove a golden.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RmRefusal {
    #[error("no golden named {golden} in {data}; `tender catalog ls` lists them")]
    Unknown { golden: String, data: PathBuf },
    #[error(
        "golden {golden} backs {} qcow2 overlay(s), which cannot be read without it: {}; fix: remove those disks first, then `tender catalog refs {golden} --prune`",
        overlays.len(), overlays.join(", ")
    )]
    Overlays { golden: String, overlays: Vec<String> },
    #[error(
        "golden {golden} has {} raw clone(s): {}; they are independent copies and keep working without it; pass --force to remove the golden anyway",
        raw.len(), raw.join(", ")
    )]
    RawClones { golden: String, raw: Vec<String> },
    #[error("{0}")]
    Io(String),
}

/// What `catalog rm` removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    pub golden: PathBuf,
    pub file_removed: bool,
    pub raw_clones_left: usize,
}

/// Delete a golden's file and record. Always refused while qcow2 overlays depend on it; with
/// raw clones left, only with `force`. The caller holds the data directory (the store lock).
pub fn remove_golden(data: &Path, golden: &str, force: bool) -> Result<Removed, RmRefusal> {
    let records = Records::new(data);
    let io = |e: io::Error| RmRefusal::Io(e.to_string());
    let Some(rec) = records.get(golden).map_err(io)?.filter(|_| valid_name(golden)) else {
        return Err(RmRefusal::Unknown { golden: golden.to_string(), data: data.to_path_buf() });
    };
    let live: Vec<Ref> = refs(data, golden).map_err(io)?.into_iter().filter(|r| r.exists).collect();
    let overlays: Vec<String> =
        live.iter().filter(|r| r.record.format == Format::Qcow2).map(|r| r.record.path.display().to_string()).collect();
    if !overlays.is_empty() {
        return Err(RmRefusal::Overlays { golden: golden.to_string(), overlays });
    }
    let raw: Vec<String> = live.iter().map(|r| r.record.path.display().to_string()).collect();
    if !raw.is_empty() && !force {
        return Err(RmRefusal::RawClones { golden: golden.to_string(), raw });
    }
    let file_removed = match fs::remove_file(&rec.path) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(RmRefusal::Io(format!("{}: {e}", rec.path.display()))),
    };
    let _ = crate::fsutil::remove_stale_temps(&rec.path);
    if let Some(dir) = rec.path.parent() {
        let _ = sync_dir(dir);
    }
    records.remove(golden).map_err(io)?;
    Ok(Removed { golden: rec.path, file_removed, raw_clones_left: raw.len() })
}
