//! What `serve` checks of its data directory before it opens it: no other user can write it,
//! and nothing inside it is a symlink that leads out of it. The directory's own path may be a
//! symlink (systemd's `StateDirectory` makes one). And how every command that works on it keeps
//! it to itself: as its owner only, files owner-only.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt};
use std::path::Path;

use crate::exit::Failure;

/// Where `serve` keeps the served statistics across restarts (`tender stats --data` reads them).
pub const SERVED_FILE: &str = "served.json";

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

/// Everything tender creates from now on is its own: files 0600, directories 0700 (umask 077).
/// Called before a command opens the data directory; what must be shared (goldens, their
/// directories) gets its mode explicitly. Refused (exit 2) unless this process runs as the
/// directory's owner ([`require_owner`]).
pub fn own_files(data: &Path) -> Result<(), Failure> {
    require_owner(data)?;
    rustix::process::umask(rustix::fs::Mode::from_bits_truncate(0o077));
    Ok(())
}

/// Every command on a data directory runs as the directory's owner: another user (root, on a
/// systemd host where the directory is the service user's) would leave files the service cannot
/// read, or read what it must not. Refused with a usage error (exit 2) naming the same command
/// line under `sudo -u <owner>`. A directory that does not exist yet passes: this user creates it.
pub fn require_owner(data: &Path) -> Result<(), Failure> {
    let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    match not_owner(data, rustix::process::geteuid().as_raw(), &args) {
        Some(message) => Err(Failure::usage(message)),
        None => Ok(()),
    }
}

/// Why `euid` may not run `args` on `data`, or `None` when it may.
fn not_owner(data: &Path, euid: u32, args: &[String]) -> Option<String> {
    let owner = std::fs::metadata(data).ok()?.uid();
    if owner == euid {
        return None;
    }
    let name = user_name(owner).unwrap_or_else(|| format!("#{owner}"));
    let line: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    Some(format!(
        "data directory {} belongs to {name} (uid {owner}), not to this user (uid {euid}): run the command as \
         its owner, so every file it writes stays readable by the service: sudo -u {} {}",
        data.display(),
        shell_quote(&name),
        line.join(" ")
    ))
}

/// The name of a user from /etc/passwd (no NSS: a host's service users are local).
fn user_name(uid: u32) -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id = fields.nth(1)?.parse::<u32>().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_string())
    })
}

/// An argument as a POSIX shell reads it back: as it is when it holds only safe characters,
/// else in single quotes.
fn shell_quote(arg: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !arg.is_empty() && arg.chars().all(safe) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

/// The directories goldens live in: `catalog.dir` (by default `<data>/goldens`) and each
/// entry's own `dir`.
pub fn golden_dirs(catalog: &tender_catalog::CatalogSettings) -> Vec<std::path::PathBuf> {
    let mut dirs = vec![catalog.dir.clone()];
    for e in &catalog.entries {
        if !dirs.contains(&e.dir) {
            dirs.push(e.dir.clone());
        }
    }
    dirs
}

/// [`close`], with what it could not do logged as warnings.
pub fn close_logged(data: &Path, catalog: &tender_catalog::CatalogSettings) {
    for problem in close(data, &golden_dirs(catalog)) {
        tracing::warn!(%problem, "data directory: a mode tender could not set");
    }
}

/// Close the data directory to other users, as far as tender owns it: its entries become
/// owner-only (the files and directories an older tender made under a 022 umask included: a
/// closed directory closes what is below it). The exception is the way to each golden directory
/// `goldens` names inside it: qemu, under its own user, opens goldens as backing files, so each
/// directory on that way keeps (or gets) traverse permission, never listing. Golden directories
/// that do not exist yet are created 0755. A mode tender cannot change (not the owner) is
/// reported, not fatal: the check above already refused a directory others can write.
pub fn close(data: &Path, goldens: &[std::path::PathBuf]) -> Vec<String> {
    let mut problems = Vec::new();
    for g in goldens {
        if let Err(e) = tender_catalog::create_shared_dir(g) {
            problems.push(format!("golden directory {}: {e}", g.display()));
        }
    }
    let Ok(real) = std::fs::canonicalize(data) else {
        return problems;
    };
    // Directories on the way from the data directory to a golden directory inside it.
    let mut ways: Vec<std::path::PathBuf> = Vec::new();
    for g in goldens.iter().filter_map(|g| std::fs::canonicalize(g).ok()) {
        if let Ok(rest) = g.strip_prefix(&real) {
            let mut at = real.clone();
            ways.push(at.clone());
            for part in rest.components() {
                at.push(part);
                ways.push(at.clone());
            }
        }
    }
    let mut set = |path: &Path, want: u32| {
        let Ok(meta) = std::fs::symlink_metadata(path) else { return };
        let mode = meta.permissions().mode() & 0o7777;
        if mode != want {
            if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(want)) {
                problems.push(format!("{}: could not set mode {want:o} (is {mode:o}): {e}", path.display()));
            }
        }
    };
    let mode_of = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o700);
    let traverse = |p: &Path| (mode_of(p) & 0o700) | 0o011;
    set(&real, if ways.contains(&real) { traverse(&real) } else { mode_of(&real) & 0o700 });
    if let Ok(entries) = std::fs::read_dir(&real) {
        for entry in entries.flatten() {
            let p = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() && ways.contains(&p) => {}
                Ok(t) if t.is_dir() => set(&p, mode_of(&p) & 0o700),
                Ok(t) if t.is_file() => set(&p, mode_of(&p) & 0o600),
                _ => {}
            }
        }
    }
    let golden: Vec<_> = goldens.iter().filter_map(|g| std::fs::canonicalize(g).ok()).collect();
    for w in ways.iter().filter(|w| **w != real) {
        // A golden directory keeps what it has (0755 when tender made it); one only on the way
        // is traversed, never listed.
        set(w, if golden.contains(w) { mode_of(w) | 0o011 } else { traverse(w) });
    }
    problems
}

/// Who runs a `--data` command, as an import record names it.
pub fn local_identity() -> String {
    let uid = rustix::process::getuid().as_raw();
    let name = std::env::var("SUDO_USER").ok().filter(|u| !u.is_empty() && uid == 0);
    match name.or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty())) {
        Some(user) => format!("user {user} (uid {uid})"),
        None => format!("uid {uid}"),
    }
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

    /// Issue 35 (6): a command run by another user than the data directory's owner (root, on a
    /// systemd host) is refused with the same command line under `sudo -u <owner>`, before it
    /// writes anything.
    #[test]
    fn should_refuse_a_user_who_does_not_own_the_data_directory() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let args: Vec<String> = ["tender", "import", "/media/usb/release 1.tar", "--data"]
            .iter()
            .map(|a| a.to_string())
            .chain([data.display().to_string()])
            .collect();
        assert_eq!(not_owner(&data, 0, &args), None, "not there yet: this user creates it");
        std::fs::create_dir(&data).unwrap();
        let me = rustix::process::geteuid().as_raw();
        assert_eq!(not_owner(&data, me, &args), None);
        assert!(require_owner(&data).is_ok());
        let refusal = not_owner(&data, me + 1, &args).unwrap();
        let owner = user_name(me).unwrap_or_else(|| format!("'#{me}'"));
        assert!(
            refusal.ends_with(&format!(
                "sudo -u {owner} tender import '/media/usb/release 1.tar' --data {}",
                data.display()
            )),
            "{refusal}"
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote("#65534"), "'#65534'");
    }

    /// The same as root on a directory that belongs to `nobody` (the tests run as root): refused,
    /// exit 2, and the umask is left alone.
    #[test]
    fn should_refuse_root_on_a_directory_of_nobody() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root to give a directory away");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::os::unix::fs::chown(&data, Some(65534), Some(65534)).unwrap();
        let e = own_files(&data).unwrap_err();
        assert_eq!(e.class, crate::exit::Class::Usage);
        let name = user_name(65534).unwrap_or_else(|| "'#65534'".to_string());
        assert!(e.message.contains(&format!("belongs to {name} (uid 65534)")), "{}", e.message);
        assert!(e.message.contains(&format!("sudo -u {name} ")), "{}", e.message);
        assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0);
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// What an older tender left under a 022 umask is closed; the way to each golden directory
    /// inside the data directory stays traversable (not listable); goldens outside are created.
    #[test]
    fn should_close_the_data_directory_but_the_way_to_its_goldens() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        for d in ["objects/ab", "records", "pools/a/goldens"] {
            std::fs::create_dir_all(data.join(d)).unwrap();
        }
        for f in ["objects/ab/old", "tender-data.json"] {
            std::fs::write(data.join(f), b"x").unwrap();
            std::fs::set_permissions(data.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        for d in ["", "objects", "objects/ab", "records", "pools", "pools/a", "pools/a/goldens"] {
            std::fs::set_permissions(data.join(d), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let elsewhere = dir.path().join("shared/goldens");
        let goldens = [data.join("goldens"), data.join("pools/a/goldens"), elsewhere.clone()];
        assert!(close(&data, &goldens).is_empty());
        assert_eq!(mode(&data), 0o711, "traversable for the goldens inside, not listable");
        assert_eq!(mode(&data.join("objects")), 0o700);
        assert_eq!(mode(&data.join("records")), 0o700);
        assert_eq!(mode(&data.join("tender-data.json")), 0o600);
        assert_eq!(mode(&data.join("objects/ab")), 0o755, "closed by its parent; left as it was");
        assert_eq!(mode(&data.join("goldens")), 0o755, "created for qemu");
        assert_eq!(mode(&data.join("pools")), 0o755 & 0o700 | 0o011);
        assert_eq!(mode(&data.join("pools/a/goldens")), 0o755);
        assert_eq!(mode(&elsewhere), 0o755);
        assert_eq!(mode(elsewhere.parent().unwrap()), 0o755);
        // Without goldens inside, the data directory is the owner's alone.
        assert!(close(&data, &[elsewhere]).is_empty());
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&data.join("goldens")), 0o700);
    }
}
