//! A fill that runs out of disk fails cleanly: the real binary with its data directory on a
//! 12 MiB tmpfs (root: mount), docker-registry holding a 32 MiB blob and a 1 MiB one. No
//! client gets a complete body of the blob that did not fit, nothing of it is committed, its
//! spool file is removed, and cached content keeps being served.

use std::process::Command;
use std::time::Duration;

use tender_e2e::digest::sha256;
use tender_e2e::registry::Sizes;
use tender_e2e::tender::{self, Tender};
use tender_e2e::{http, poll_until, proc};

use crate::Bed;

/// A tmpfs mounted for the test's lifetime.
struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A metric's value in a `/metrics` text (the sum over every line that starts with `prefix`).
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

#[test]
fn should_fail_a_fill_cleanly_when_the_disk_is_full() {
    proc::need(&["mount", "umount"]);
    let bed = Bed::new("disk-full", Sizes { kubelet: "", installer: "1", big_mb: 32 });
    let data = bed.path("data");
    std::fs::create_dir_all(&data).unwrap();
    proc::run(Command::new("mount").args(["-t", "tmpfs", "-o", "size=12m,mode=0700", "tmpfs"]).arg(&data));
    let _mount = Tmpfs(data.clone());
    let t = Tender::start(&bed.path("tender.yaml"), &data, &bed.path("tender.log"));

    let installer = bed.images.var("INSTALLER_MANIFEST").to_string();
    let small = bed.images.config_and_layers(&installer).pop().unwrap();
    let big = bed.images.var("BIG_DIGEST").to_string();
    let url = |d: &str| format!("/v2/ghcr.io/siderolabs/installer/blobs/{d}");
    let big_url = format!("/v2/ghcr.io/bench/big/blobs/{big}");

    let r = http::get(t.addr, &url(&small)).unwrap();
    assert_eq!((r.status(), sha256(&r.body)), (200, small.clone()), "the small blob is served");

    let addr = t.addr;
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let u = big_url.clone();
            std::thread::spawn(move || http::get(addr, &u).map(|r| (r.status(), r.body)))
        })
        .collect();
    for c in clients {
        if let Ok((status, body)) = c.join().unwrap() {
            assert!(
                !(status == 200 && sha256(&body) == big),
                "no client gets a complete body from a fill that ran out of disk"
            );
        }
    }
    // the fill ends (failed), its spool file goes, nothing is committed
    let metrics = poll_until("the failed fill to end", Duration::from_secs(30), || {
        let m = http::get(t.addr, "/metrics").ok()?.text();
        (metric(&m, "tender_fills_active") == 0.0).then_some(m)
    });
    assert!(
        metric(&metrics, "tender_fills_finished_total{upstream=\"ghcr.io\",result=\"failed\"}") >= 1.0,
        "{metrics}"
    );
    let spool: Vec<_> = std::fs::read_dir(data.join("spool")).map(|d| d.flatten().collect()).unwrap_or_default();
    assert!(spool.is_empty(), "the failed spool file is removed: {spool:?}");
    let hex = &big["sha256:".len()..];
    assert!(!data.join("objects/sha256").join(&hex[..2]).join(hex).exists(), "nothing is committed");

    // cached content keeps serving, and what is stored verifies
    let r = http::get(t.addr, &url(&small)).unwrap();
    assert_eq!((r.status(), sha256(&r.body)), (200, small), "the small blob is still served");
    drop(t);
    let out = tender::run(["fsck".as_ref(), "--data".as_ref(), data.as_os_str()]);
    assert!(out.status.success(), "fsck: {}", String::from_utf8_lossy(&out.stdout));
}
