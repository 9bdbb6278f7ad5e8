//! The end-to-end test bed: the real `tender` binary against real peers on 127.0.0.1.
//!
//! Every peer is a guard that ends its process when dropped (also when a test panics), every
//! wait is a bounded poll, and every test works in its own temporary directory. Nothing here
//! reaches beyond the loopback interface: tender is always started with a config file that names
//! only loopback upstreams, never with the embedded default.
//!
//! - [`paths`]: the workspace, the test bed scripts (`scripts/testbed`), the `tender` binary
//! - [`proc`]: child-process guards, signals, bounded waits, running commands
//! - [`http`]: a small blocking HTTP/1.1 client (keep-alive, streaming bodies)
//! - [`tender`]: a running `tender serve` and its JSON access log
//! - [`registry`]: `docker-registry` as the upstream (test bed `upstream.sh`) and the synthetic
//!   images of `mkimages.sh`
//! - [`factory`]: the Image Factory stand-in (`factory-upstream.sh`)
//! - [`slow`]: a throttled blob server that honours `Range` and logs every request
//! - [`containerd`]: a private containerd with its own root, state and socket
//! - [`digest`]: sha256 helpers and OCI layout verification

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test harness: a failed step fails the test, loudly")]

pub mod containerd;
pub mod digest;
pub mod factory;
pub mod http;
pub mod paths;
pub mod proc;
pub mod registry;
pub mod s3;
pub mod slow;
pub mod tender;
pub mod throttle;

use std::path::Path;
use std::time::{Duration, Instant};

/// Poll `f` every 50 ms until it returns `Some`, for at most `limit`; panic naming `what`
/// when it never does.
pub fn poll_until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A temporary directory for one test, removed when dropped unless `TENDER_E2E_KEEP` is set
/// (then its path is printed, for a post-mortem).
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("tender-e2e-{name}."))
            .tempdir()
            .expect("creating a temporary directory");
        TestDir { dir: Some(dir) }
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().map(|d| d.path()).expect("temporary directory is present until dropped")
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if let Some(d) = self.dir.take() {
            if std::env::var_os("TENDER_E2E_KEEP").is_some() {
                eprintln!("kept {}", d.keep().display());
            }
        }
    }
}
