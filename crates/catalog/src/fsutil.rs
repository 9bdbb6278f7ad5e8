//! Crash-safe file primitives: temp file beside the target, fsync, rename, fsync the directory.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// fsync a directory so a rename inside it survives a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Create `dir` and its missing parents as 0755 whatever the process umask: a golden directory
/// is read by qemu under its own user, and tender's umask keeps everything else private.
pub fn create_shared_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at {
        if d.as_os_str().is_empty() || d.exists() {
            break;
        }
        missing.push(d);
        at = d.parent();
    }
    for d in missing.into_iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => fs::set_permissions(d, fs::Permissions::from_mode(0o755))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A temp path beside `path`: `.<name>.tmp-<pid>-<seq>` (hidden, never a golden's name).
pub fn temp_beside(path: &Path) -> io::Result<PathBuf> {
    let dir = path.parent().ok_or_else(|| io::Error::other(format!("{} has no parent directory", path.display())))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    Ok(dir.join(format!(".{name}.tmp-{}-{seq}", std::process::id())))
}

/// Whether `file_name` is one of [`temp_beside`]'s names for `target_name`.
pub fn is_temp_of(file_name: &str, target_name: &str) -> bool {
    file_name.strip_prefix('.').and_then(|r| r.strip_prefix(target_name)).is_some_and(|r| r.starts_with(".tmp-"))
}

/// Remove temp files of `target` left by a crash.
pub fn remove_stale_temps(target: &Path) -> io::Result<usize> {
    let (Some(dir), Some(name)) = (target.parent(), target.file_name().and_then(|n| n.to_str())) else {
        return Ok(0);
    };
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut n = 0;
    for e in entries.flatten() {
        if e.file_name().to_str().is_some_and(|f| is_temp_of(f, name)) {
            fs::remove_file(e.path())?;
            n += 1;
        }
    }
    Ok(n)
}

/// Write `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| io::Error::other("path has no parent"))?;
    fs::create_dir_all(dir)?;
    let tmp = temp_beside(path)?;
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Deletes a temp file on drop unless [`TempGuard::keep`] was called.
pub struct TempGuard {
    path: Option<PathBuf>,
}

impl TempGuard {
    pub fn new(path: PathBuf) -> TempGuard {
        TempGuard { path: Some(path) }
    }

    pub fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }

    /// The file was renamed into place: nothing to delete.
    pub fn keep(mut self) {
        self.path = None;
    }
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_recognise_only_its_own_temp_names() {
        let t = temp_beside(Path::new("/d/talos-worker-a-v1.0.0.raw")).unwrap();
        let name = t.file_name().unwrap().to_str().unwrap();
        assert!(is_temp_of(name, "talos-worker-a-v1.0.0.raw"));
        assert!(!is_temp_of(name, "talos-worker-a-v1.0.0"));
        assert!(!is_temp_of("talos-worker-a-v1.0.0.raw", "talos-worker-a-v1.0.0.raw"));
        assert!(!is_temp_of(".talos-worker-a-v1.0.0.raw.tmpx", "talos-worker-a-v1.0.0.raw"));
    }

    #[test]
    fn should_remove_stale_temps_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("g.raw");
        fs::write(&target, b"golden").unwrap();
        fs::write(temp_beside(&target).unwrap(), b"partial").unwrap();
        fs::write(dir.path().join(".other.raw.tmp-1-1"), b"x").unwrap();
        assert_eq!(remove_stale_temps(&target).unwrap(), 1);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
