//! The clone registry: every worker disk made from a golden, in
//! `<data>/catalog/clones.json` (changed under `flock` on `clones.lock`, written atomically),
//! and, where the filesystem allows, as extended attributes on the disk itself
//! (`user.tender.golden`, `user.tender.pool`, `user.tender.worker`).
//!
//! A pool is its exact name: `md0-gpu` is never `md0`.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;

pub const XATTR_GOLDEN: &str = "user.tender.golden";
pub const XATTR_POOL: &str = "user.tender.pool";
pub const XATTR_WORKER: &str = "user.tender.worker";

/// How a worker disk relates to its golden.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Format {
    /// A raw disk: a reflink (copy-on-write) clone, or with `--allow-copy` a full copy. It
    /// does not need the golden once made.
    Raw,
    /// A qcow2 overlay whose backing file is the golden: it needs the golden for ever.
    Qcow2,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Qcow2 => "qcow2",
        }
    }
}

/// How the disk was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Method {
    Reflink,
    Copy,
    Overlay,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Reflink => "reflink",
            Method::Copy => "copy",
            Method::Overlay => "overlay",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CloneRecord {
    /// Absolute path of the worker disk.
    pub path: PathBuf,
    pub golden: String,
    pub pool: String,
    pub worker: String,
    pub format: Format,
    pub method: Method,
    /// Virtual size in bytes.
    pub size: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct RegistryFile {
    clones: Vec<CloneRecord>,
}

/// The registry of one data directory.
#[derive(Debug, Clone)]
pub struct Registry {
    dir: PathBuf,
}

impl Registry {
    pub fn new(data: &Path) -> Registry {
        Registry { dir: data.join("catalog") }
    }

    fn file(&self) -> PathBuf {
        self.dir.join("clones.json")
    }

    /// Every record (a consistent snapshot: the file is replaced atomically).
    pub fn list(&self) -> io::Result<Vec<CloneRecord>> {
        match fs::read(self.file()) {
            Ok(bytes) => serde_json::from_slice::<RegistryFile>(&bytes)
                .map(|f| f.clones)
                .map_err(|e| io::Error::other(format!("{}: {e}", self.file().display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// The records of one golden.
    pub fn of_golden(&self, golden: &str) -> io::Result<Vec<CloneRecord>> {
        Ok(self.list()?.into_iter().filter(|c| c.golden == golden).collect())
    }

    /// The record of the disk at `path`, if any.
    pub fn at(&self, path: &Path) -> io::Result<Option<CloneRecord>> {
        Ok(self.list()?.into_iter().find(|c| c.path == path))
    }

    /// Change the records under the registry's lock (one writer at a time, across processes).
    pub fn update<T>(&self, f: impl FnOnce(&mut Vec<CloneRecord>) -> T) -> io::Result<T> {
        fs::create_dir_all(&self.dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(self.dir.join("clones.lock"))?;
        lock.lock()?;
        let mut clones = self.list()?;
        let out = f(&mut clones);
        clones.sort_by(|a, b| (&a.golden, &a.path).cmp(&(&b.golden, &b.path)));
        let bytes = serde_json::to_vec_pretty(&RegistryFile { clones }).map_err(io::Error::other)?;
        write_atomic(&self.file(), &bytes)?;
        drop(lock);
        Ok(out)
    }

    /// Record a clone (replacing any record of the same path).
    pub fn add(&self, record: CloneRecord) -> io::Result<()> {
        self.update(|v| {
            v.retain(|c| c.path != record.path);
            v.push(record);
        })
    }

    /// Forget the records of `golden` whose disks no longer exist; returns them.
    pub fn prune(&self, golden: &str) -> io::Result<Vec<CloneRecord>> {
        self.update(|v| {
            let (gone, keep): (Vec<_>, Vec<_>) =
                std::mem::take(v).into_iter().partition(|c| c.golden == golden && !c.path.exists());
            *v = keep;
            gone
        })
    }
}

/// The tender attributes of a disk file, if the filesystem keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tags {
    pub golden: Option<String>,
    pub pool: Option<String>,
    pub worker: Option<String>,
}

fn get_attr(path: &Path, name: &str) -> Option<String> {
    xattr::get(path, name).ok().flatten().and_then(|v| String::from_utf8(v).ok())
}

pub fn read_tags(path: &Path) -> Tags {
    Tags {
        golden: get_attr(path, XATTR_GOLDEN),
        pool: get_attr(path, XATTR_POOL),
        worker: get_attr(path, XATTR_WORKER),
    }
}

/// Tag a disk with its golden, pool and worker. `Ok(false)` when the filesystem has no user
/// extended attributes (the registry still records the clone).
pub fn write_tags(file: &File, golden: &str, pool: &str, worker: &str) -> io::Result<bool> {
    use xattr::FileExt as _;
    for (k, v) in [(XATTR_GOLDEN, golden), (XATTR_POOL, pool), (XATTR_WORKER, worker)] {
        if let Err(e) = file.set_xattr(k, v.as_bytes()) {
            let unsupported = e.raw_os_error() == Some(rustix::io::Errno::OPNOTSUPP.raw_os_error())
                || e.kind() == io::ErrorKind::Unsupported;
            return if unsupported { Ok(false) } else { Err(e) };
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn rec(path: &Path, golden: &str, pool: &str) -> CloneRecord {
        CloneRecord {
            path: path.to_path_buf(),
            golden: golden.into(),
            pool: pool.into(),
            worker: "w0".into(),
            format: Format::Raw,
            method: Method::Reflink,
            size: 1,
            created: 0,
        }
    }

    #[test]
    fn should_record_replace_and_prune_clones() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::new(dir.path());
        assert!(reg.list().unwrap().is_empty());
        let a = dir.path().join("a.raw");
        let b = dir.path().join("b.raw");
        fs::write(&a, b"x").unwrap();
        reg.add(rec(&a, "g1", "md0")).unwrap();
        reg.add(rec(&b, "g1", "md0-gpu")).unwrap();
        reg.add(rec(&a, "g1", "md0")).unwrap();
        assert_eq!(reg.list().unwrap().len(), 2);
        assert_eq!(reg.at(&b).unwrap().unwrap().pool, "md0-gpu");
        let gone = reg.prune("g1").unwrap();
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].path, b);
        assert_eq!(reg.of_golden("g1").unwrap().len(), 1);
    }

    #[test]
    fn should_tag_disks_where_the_filesystem_allows() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.raw");
        let f = File::create(&p).unwrap();
        if write_tags(&f, "g", "md0", "w1").unwrap() {
            assert_eq!(
                read_tags(&p),
                Tags { golden: Some("g".into()), pool: Some("md0".into()), worker: Some("w1".into()) }
            );
        } else {
            eprintln!("note: {} has no user xattrs; tags not checked", dir.path().display());
            assert_eq!(read_tags(&p), Tags::default());
        }
    }
}
