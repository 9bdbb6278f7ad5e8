//! What `serve` checks of its data directory before it opens it: no other user can write it,
//! and nothing inside it is a symlink that leads out of it. The directory's own path may be a
//! symlink (systemd's `StateDirectory` makes one).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Refuse a data directory another user can write, or one holding a symlink that leads out of
/// it. A directory that does not exist yet passes (it is created with tender's umask).
pub fn check(path: &Path) -> Result<(), String> {
    let real = match std::fs::canonicalize(path) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("data directory {}: {e}", path.display())),
    };
    let meta = std::fs::metadata(&real).map_err(|e| format!("data directory {}: {e}", path.display()))?;
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(format!(
            "data directory {} can be written by other users (mode {:o}); fix: chmod go-w {}",
            path.display(),
            mode & 0o7777,
            real.display()
        ));
    }
    let mut dirs = vec![real.clone()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
            let p = entry.path();
            let kind = entry.file_type().map_err(|e| format!("{}: {e}", p.display()))?;
            if kind.is_symlink() {
                let inside = std::fs::canonicalize(&p).is_ok_and(|t| t.starts_with(&real));
                if !inside {
                    return Err(format!(
                        "{} is a symlink leading out of the data directory {}; remove it",
                        p.display(),
                        path.display()
                    ));
                }
            } else if kind.is_dir() {
                dirs.push(p);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_refuse_a_data_directory_others_can_write_or_that_leads_out() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        assert!(check(&data).is_ok(), "not there yet: created later");
        std::fs::create_dir_all(data.join("objects/ab")).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(check(&data).is_ok());
        // The path itself may be a symlink (systemd StateDirectory), and links inside may stay inside.
        let link = dir.path().join("state");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        std::os::unix::fs::symlink(data.join("objects"), data.join("objects/ab/up")).unwrap();
        assert!(check(&link).is_ok());
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check(&link).unwrap_err().contains("chmod go-w"));
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink("/etc", data.join("objects/ab/out")).unwrap();
        assert!(check(&data).unwrap_err().contains("leading out"));
    }
}
