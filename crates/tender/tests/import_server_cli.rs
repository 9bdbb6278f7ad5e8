//! Issue 35 (6): `tender import --server` learns the server's answer before it streams the
//! bundle, prints the server's own message, and exits by the convention: 401, 403, 404 and 413
//! are usage errors (2), only an unreachable server or a 5xx is transient (3), a refused bundle
//! is a problem (1).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::process::{Command, Stdio};

mod cli_support;
mod probe_support;
use cli_support::tender;
use probe_support::wait_for_listen;

const TOKEN: &str = "import-admin-token-0123456789";

/// A real `tender serve` (no upstream is ever asked), with the admin endpoints when `admin`
/// holds its extra config lines.
struct Server {
    child: std::process::Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Server {
    fn start(admin: Option<&str>) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("admin-token");
        std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
        let admin = admin.map(|extra| format!("admin:\n  tokenFile: {}\n{extra}", token.display())).unwrap_or_default();
        let config = dir.path().join("tender.yaml");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:0\ndata: {}\ndefaultUpstream: ghcr.io\nupstreams:\n  - name: ghcr.io\n    \
                 url: http://127.0.0.1:9\n    offline: true\n{admin}",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let log = dir.path().join("tender.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_tender"))
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let url = wait_for_listen(&log, &mut child);
        Server { child, url, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tender.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- tender log ---\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn should_learn_the_servers_answer_before_streaming_and_exit_by_its_class() {
    let with_admin = Server::start(Some("  maxImportSize: 4KiB\n"));
    let without_admin = Server::start(None);
    let dir = tempfile::tempdir().unwrap();
    let token = cli_support::write(dir.path(), "token", TOKEN);
    let wrong = cli_support::write(dir.path(), "wrong", "not-the-token");
    let big = dir.path().join("big.tar");
    std::fs::write(&big, vec![0u8; 64 << 10]).unwrap();
    let small = dir.path().join("small.tar");
    std::fs::write(&small, b"not a tar at all").unwrap();
    let (big, small) = (big.to_str().unwrap(), small.to_str().unwrap());
    // A port nothing listens on: bound, then closed.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let a = with_admin.url.as_str();
    let cases: &[(&str, &[&str], i32, &str)] = &[
        ("no token", &["import", small, "--server", a], 2, "this endpoint needs the admin token"),
        ("a wrong token", &["import", small, "--server", a, "--token-file", &wrong], 2, "needs the admin token"),
        (
            "over maxImportSize",
            &["import", big, "--server", a, "--token-file", &token],
            2,
            "larger than admin.maxImportSize",
        ),
        (
            "no admin endpoints",
            &["import", small, "--server", &without_admin.url, "--token-file", &token],
            2,
            "no such endpoint: /api/v1/admin/import",
        ),
        (
            "nothing listening",
            &["import", small, "--server", &closed, "--token-file", &token],
            3,
            "/api/v1/admin/import",
        ),
        (
            "not a bundle",
            &["import", small, "--server", a, "--token-file", &token],
            1,
            "/api/v1/admin/import?source=small.tar: 422 Unprocessable Entity: bundle refused",
        ),
        ("gc without a token", &["gc", "--server", a], 2, "this endpoint needs the admin token"),
        (
            "tag rm without a token",
            &["tag", "rm", "ghcr.io/a/b:v1", "--server", a],
            2,
            "this endpoint needs the admin token",
        ),
    ];
    for (what, args, code, says) in cases {
        let out = tender(args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{what}: {stderr}");
        assert!(stderr.contains(says), "{what}: {stderr}");
    }
    // The refusals came from the question, not from a streamed body: the server saw no POST
    // before the one bundle it was allowed to receive (`not a bundle`).
    let log = with_admin.log();
    assert!(log.contains(&format!("tender serving on {a} (offline upstreams: ghcr.io)")), "{log}");
    let posts = log.lines().filter(|l| l.contains("POST") && l.contains("/api/v1/admin/import")).count();
    assert!(posts <= 1, "the refused bundles were streamed anyway:\n{log}");
}
