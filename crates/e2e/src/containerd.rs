//! A private containerd, a private containerd for the pull tests: its own root, state and
//! socket under a test directory, the CRI plugin off, and a `certs.d` hosts directory that maps
//! a registry host to the mirror under test with a closed loopback port as the fallback
//! `server`, so a broken mirror fails instead of reaching the real registry.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::proc::{self, cmd, need, Guard};

/// The fallback `server` in hosts.toml: a closed loopback port standing in for the real,
/// unreachable registry.
pub const UNREACHABLE: &str = "http://127.0.0.1:1";

/// A running containerd; stopped, and any mount under its directory undone, when dropped.
pub struct Containerd {
    guard: Option<Guard>,
    pub dir: PathBuf,
    pub sock: PathBuf,
}

impl Containerd {
    pub fn start(dir: &Path) -> Containerd {
        need(&["containerd", "ctr"]);
        std::fs::create_dir_all(dir).expect("creating the containerd directory");
        let sock = dir.join("containerd.sock");
        let d = dir.display();
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = "{d}/debug.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
"#
        );
        std::fs::write(dir.join("config.toml"), config).expect("writing config.toml");
        let log = std::fs::File::create(dir.join("containerd.log")).expect("creating containerd.log");
        let mut c = cmd("containerd", ["--config".as_ref(), dir.join("config.toml").as_os_str()]);
        c.stdin(Stdio::null()).stdout(log.try_clone().expect("log handle")).stderr(log);
        let guard = Guard::spawn("containerd", &mut c);
        let ctrd = Containerd { guard: Some(guard), dir: dir.to_path_buf(), sock };
        crate::poll_until("containerd to answer on its socket", Duration::from_secs(30), || {
            ctrd.ctr(&["version"]).status.success().then_some(())
        });
        ctrd
    }

    /// Write `certs.d/<host>/hosts.toml`: the mirror first, [`UNREACHABLE`] as the fallback.
    pub fn hosts_dir(&self, host: &str, mirror_hostport: &str) -> PathBuf {
        let certs = self.dir.join("certs.d");
        std::fs::create_dir_all(certs.join(host)).expect("creating certs.d");
        let toml = format!(
            "server = \"{UNREACHABLE}\"\n\n[host.\"http://{mirror_hostport}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
        std::fs::write(certs.join(host).join("hosts.toml"), toml).expect("writing hosts.toml");
        certs
    }

    /// Run `ctr --address <sock> ARGS...`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        let mut c = cmd("ctr", ["--address".as_ref(), self.sock.as_os_str()]);
        c.args(args);
        proc::output(&mut c)
    }

    /// The content store's blob directory.
    pub fn content_blobs(&self) -> PathBuf {
        self.dir.join("root/io.containerd.content.v1.content/blobs/sha256")
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(mut g) = self.guard.take() {
            if !g.try_signal("TERM") || g.wait_for_exit(Duration::from_secs(10)).is_none() {
                drop(g); // SIGKILL and reap
            }
        }
        // Unpack mounts are temporary, but never let the directory's removal cross a live mount.
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let prefix = format!("{}/", self.dir.display());
        let mut points: Vec<&str> =
            mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).filter(|m| m.starts_with(&prefix)).collect();
        points.sort_unstable_by(|a, b| b.cmp(a));
        for m in points {
            let _ = proc::output(&mut cmd("umount", ["-l", m]));
        }
    }
}
