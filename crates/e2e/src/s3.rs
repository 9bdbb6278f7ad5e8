//! A real S3 server on 127.0.0.1 for the shared-storage tests: moto's standalone server
//! (`moto[server]` from PyPI; scripts/test.sh installs it into a venv and exports
//! `TENDER_MOTO_SERVER`). moto implements the S3 API tender uses — multipart uploads, ranged
//! GETs, listing, copy, and conditional writes (`If-None-Match: *`, `If-Match`), which the
//! fill lease needs — and keeps the bucket in its process, so every test starts clean.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::proc::Guard;
use crate::registry::free_port;

/// Access key pair the tests hand tender through files (moto accepts any).
pub const ACCESS_KEY_ID: &str = "AKIAE2ETESTKEY";
pub const SECRET_ACCESS_KEY: &str = "e2e-secret-never-logged";

pub struct S3Server {
    pub addr: SocketAddr,
    _guard: Guard,
}

fn moto_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TENDER_MOTO_SERVER") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("TENDER_TEST_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache/tender-test")
    });
    let p = cache.join("moto-venv/bin/moto_server");
    assert!(
        p.is_file(),
        "no S3 server: {} is missing; run scripts/test.sh (it installs moto[server] there) or set TENDER_MOTO_SERVER",
        p.display()
    );
    p
}

impl S3Server {
    /// Start moto on a free loopback port, logging to `log`, and wait until it answers.
    pub fn start(log: &Path) -> S3Server {
        let port = free_port();
        let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let err = out.try_clone().expect("log handle");
        let guard = Guard::spawn(
            "moto_server",
            Command::new(moto_bin())
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err),
        );
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
        crate::poll_until("the S3 server to answer", Duration::from_secs(30), || {
            crate::http::get(addr, "/").ok().map(|_| ())
        });
        S3Server { addr, _guard: guard }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn create_bucket(&self, bucket: &str) {
        let r = crate::http::request(self.addr, "PUT", &format!("/{bucket}"), &[("Content-Length", "0")])
            .expect("create bucket");
        assert_eq!(r.status(), 200, "creating bucket {bucket}: {}", r.text());
    }

    /// Overwrite an object behind tender's back (bit rot, a careless operator), with a signed
    /// request from boto3 (moto's own dependency, in its venv).
    pub fn put(&self, bucket: &str, key: &str, body: &[u8]) {
        let python = moto_bin().with_file_name("python");
        let script = "import sys, boto3\n\
            s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                aws_access_key_id=sys.argv[4], aws_secret_access_key=sys.argv[5])\n\
            s3.put_object(Bucket=sys.argv[2], Key=sys.argv[3], Body=sys.stdin.buffer.read())\n";
        let mut child = Command::new(python)
            .args(["-c", script, &self.url(), bucket, key, ACCESS_KEY_ID, SECRET_ACCESS_KEY])
            .stdin(Stdio::piped())
            .spawn()
            .expect("python from the moto venv");
        use std::io::Write as _;
        child.stdin.take().expect("stdin").write_all(body).expect("writing the body");
        assert!(child.wait().expect("boto3 put").success(), "putting {key} into the bucket");
    }

    /// The `storage:` section of a tender config for this server, with the key files in `dir`.
    pub fn storage_yaml(&self, dir: &Path, bucket: &str, prefix: &str, replica: &str) -> String {
        let (id, secret) = (dir.join("s3-access-key-id"), dir.join("s3-secret-access-key"));
        std::fs::write(&id, format!("{ACCESS_KEY_ID}\n")).expect("key file");
        std::fs::write(&secret, format!("{SECRET_ACCESS_KEY}\n")).expect("key file");
        format!(
            "storage:\n  s3:\n    endpoint: {}\n    bucket: {bucket}\n    prefix: {prefix}\n    \
             accessKeyIdFile: {}\n    secretAccessKeyFile: {}\n    chunkSize: 5Mi\n    leaseTtl: 3s\n    \
             replica: {replica}\n",
            self.url(),
            id.display(),
            secret.display()
        )
    }
}
