//! End-to-end tests: the real `tender` binary against real peers on 127.0.0.1.
//!
//! Run them with `scripts/test.sh`, or after `cargo build --bin tender`:
//! `cargo test -p tender-e2e -- --test-threads=1 [NAME]`. libtest runs tests in name order,
//! so the modules are numbered: the quick ones run first. See docs/testing.md.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests: a failed step fails the test")]

mod t0_workspace;
mod t10_s3;
mod t11_prefetch;
mod t12_disk_full;
mod t13_status_page;
mod t14_probe_tls;
mod t15_protocol;
mod t16_offline;
mod t17_monitoring;
mod t18_airgap;
mod t19_bucket_down;
mod t1_lifecycle;
mod t20_bucket_gc;
mod t21_many_connections;
mod t22_corners;
mod t23_cozystack;
mod t24_signatures;
mod t25_cozystack_corpus;
mod t26_far_side;
mod t27_talos_cache;
mod t28_fleet_tiers;
mod t2_blobs;
mod t3_skopeo;
mod t4_containerd;
mod t5_fsck;
mod t6_crash;
mod t7_render_containerd;
mod t8_security;
mod t9_tiers;

use std::path::{Path, PathBuf};
use std::process::Command;

use tender_e2e::proc;
use tender_e2e::registry::{Images, Registry, Sizes};
use tender_e2e::tender::{write_config, Tender};
use tender_e2e::TestDir;

/// An upstream registry holding the synthetic images, in a test directory. Start a tender in
/// front of it (as `ghcr.io`) with [`Bed::start_tender`]; declare the tender after the bed so
/// it is dropped first. Fields drop in order: the registry, then the directory.
pub struct Bed {
    pub registry: Registry,
    pub images: Images,
    pub dir: TestDir,
}

impl Bed {
    pub fn new(name: &str, sizes: Sizes) -> Bed {
        let dir = TestDir::new(name);
        let registry = Registry::start(&dir.path().join("upstream"));
        let images = Images::push(&registry, &dir.path().join("images"), sizes);
        write_config(&dir.path().join("tender.yaml"), &[("ghcr.io", &registry.url())], "");
        Bed { registry, images, dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `tender serve` with `tender.yaml` (ghcr.io = the registry) and data in `data/`,
    /// logging to `log`.
    pub fn start_tender(&self, log: &str) -> Tender {
        Tender::start(&self.path("tender.yaml"), &self.path("data"), &self.path(log))
    }
}

/// `skopeo copy --all --preserve-digests` from `docker://<tender>/<name>` into `dest`
/// (`oci:DIR` or `dir:DIR`). --preserve-digests makes skopeo fail rather than rewrite a manifest.
pub fn skopeo_pull(tender: &Tender, name: &str, dest: &str) {
    proc::need(&["skopeo"]);
    proc::run(Command::new("skopeo").args([
        "copy",
        "-q",
        "--all",
        "--preserve-digests",
        "--src-tls-verify=false",
        &format!("docker://{}/{name}", tender.hostport()),
        dest,
    ]));
}

/// Start `skopeo copy --all --preserve-digests` of `docker://<hostport>/<name>` into
/// `oci:<dest>` without waiting; [`wait_pulls`] collects the copies.
pub fn spawn_pull(hostport: &str, name: &str, dest: &Path) -> std::process::Child {
    proc::need(&["skopeo"]);
    Command::new("skopeo")
        .args(["copy", "-q", "--all", "--preserve-digests", "--src-tls-verify=false"])
        .arg(format!("docker://{hostport}/{name}"))
        .arg(oci(dest))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait for every pull of [`spawn_pull`]; each must succeed with `index` as its only top-level
/// manifest.
pub fn wait_pulls(pulls: Vec<(PathBuf, std::process::Child)>, index: &str, through: &str) {
    for (dest, child) in pulls {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "skopeo through {through}:\n{}", String::from_utf8_lossy(&out.stderr));
        let (top, _) = tender_e2e::digest::verify_oci_layout(&dest);
        assert_eq!(top, [index], "every client got the upstream's index");
    }
}

/// `oci:<dir>` for skopeo.
pub fn oci(dir: &Path) -> String {
    format!("oci:{}", dir.display())
}
