//! Issue 16, low item: `tender serve` keeps its data directory to itself. Files it creates are
//! 0600 whatever the umask it was started with, what an older tender left readable is closed,
//! and the default golden directory stays reachable (traverse only) for qemu, which reads
//! goldens under its own user.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

mod probe_support;
use probe_support::{respond, Fake, Tender};

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn should_keep_the_data_directory_to_itself_but_the_way_to_its_goldens() {
    let upstream = Fake::start(|_| respond(404, &[], ""));
    let tender = Tender::start(&upstream.url());
    let data = tender.dir.path().join("data");
    assert_eq!(mode(&data), 0o711, "others may only pass through, to the goldens");
    assert_eq!(mode(&data.join("goldens")), 0o755, "qemu opens goldens by path");
    let mut private = 0;
    for entry in std::fs::read_dir(&data).unwrap() {
        let p = entry.unwrap().path();
        if p.file_name().unwrap() == "goldens" {
            continue;
        }
        let m = mode(&p);
        assert_eq!(m & 0o077, 0, "{} is {m:o}", p.display());
        private += 1;
    }
    assert!(private >= 2, "the store's own files and directories were looked at");
}

mod cli_support;

/// Issue 35 (6): every command on a data directory, run as root on one that belongs to another
/// user (the service's, on a systemd host), refuses with exit 2 and the same command line under
/// `sudo -u <owner>`, and leaves no file behind that the service could not read.
#[test]
fn should_refuse_every_data_command_of_another_user_than_the_owner() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root to give a directory away");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let marker = data.join("tender-data.json");
    std::fs::write(&marker, "{}").unwrap();
    for p in [&data, &marker] {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    }
    let bundle = dir.path().join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    let d = data.to_str().unwrap();
    let b = bundle.to_str().unwrap();
    let out = dir.path().join("out.tar");
    let o = out.to_str().unwrap();
    let commands: &[&[&str]] = &[
        &["import", b, "--data", d],
        &["gc", "--data", d],
        &["gc", "--dry-run", "--data", d],
        &["fsck", "--data", d],
        &["tag", "rm", "ghcr.io/a/b:v1", "--data", d],
        &["prefetch", "ghcr.io/a/b:v1", "--data", d],
        &["export", "ghcr.io/a/b:v1", "--out", o, "--data", d],
        &["stats", "--data", d],
        &["images", "--data", d],
        &["bundle", "rm", "sha256:0000000000000000000000000000000000000000000000000000000000000000", "--data", d],
        &["catalog", "ls", "--data", d],
        &["serve", "--listen", "127.0.0.1:0", "--data", d],
    ];
    for args in commands {
        let run = cli_support::tender(args, None);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
        let line = args.join(" ");
        assert!(stderr.contains("sudo -u nobody ") && stderr.contains(&line), "{args:?}: {stderr}");
        let mut left: Vec<_> = std::fs::read_dir(&data).unwrap().map(|e| e.unwrap().file_name()).collect();
        left.sort();
        assert_eq!(left, ["tender-data.json"], "{args:?} left files behind");
        assert!(!out.exists());
    }
}
