//! Issue 20 item 5: one set of client options. `stats` takes the shared ones (it could not talk
//! to a server with client authentication), `--insecure` exists, and `TENDER_SERVER`,
//! `TENDER_TOKEN_FILE` (a pull token) and `TENDER_ADMIN_TOKEN_FILE` (gc, fsck, catalog sync)
//! stand in for the flags; a flag wins over the environment.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod probe_support;

use std::process::Command;

use probe_support::{respond, Fake, Req};

const ENV: [&str; 3] = ["TENDER_SERVER", "TENDER_TOKEN_FILE", "TENDER_ADMIN_TOKEN_FILE"];

fn tender(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tender"));
    c.args(args);
    for k in ENV {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// A tender stand-in that wants `Bearer <token>` and answers `/api/v1/served` with one entry.
fn server(token: &'static str) -> Fake {
    Fake::start(move |r: &Req| {
        if r.header("authorization") != Some(&format!("Bearer {token}")) {
            return respond(401, &[("WWW-Authenticate", "Basic realm=\"tender\"")], "");
        }
        match r.path.as_str() {
            "/api/v1/served" => respond(
                200,
                &[("Content-Type", "application/json")],
                r#"{"ghcr.io/a/b":{"manifestRequests":1,"blobRequests":2,"bytes":3,"hits":1,"misses":2,"lastServed":1}}"#,
            ),
            _ => respond(404, &[("Content-Type", "application/json")], r#"{"error":"no"}"#),
        }
    })
}

#[test]
fn should_let_stats_authenticate_with_the_shared_client_options_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let pull = dir.path().join("pull");
    std::fs::write(&pull, "pull-token\n").unwrap();
    let s = server("pull-token");
    let url = s.url();

    // The flags.
    let (code, out) = tender(&["stats", "--server", &url, "--token-file", pull.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ghcr.io/a/b"), "{out}");
    // The environment alone.
    let (code, out) = tender(&["stats"], &[("TENDER_SERVER", &url), ("TENDER_TOKEN_FILE", pull.to_str().unwrap())]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ghcr.io/a/b"), "{out}");
    // Without a token: a usage error that says what to pass.
    let (code, out) = tender(&["stats", "--server", &url], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("401") && out.contains("TENDER_TOKEN_FILE"), "{out}");
    // --data wins over TENDER_SERVER (and is a data directory, not a server).
    let (code, out) = tender(&["stats", "--data", dir.path().to_str().unwrap()], &[("TENDER_SERVER", &url)]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("not a tender data directory"), "{out}");
    // --insecure is a client option (and contradicts --ca).
    let (code, out) = tender(&["stats", "--server", &url, "--insecure", "--ca", "/nonexistent"], &[]);
    assert_eq!(code, 2, "{out}");
    let (code, out) = tender(&["stats", "--server", &url, "--insecure", "--token-file", pull.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn should_send_the_admin_token_from_the_environment_to_admin_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let (pull, admin) = (dir.path().join("pull"), dir.path().join("admin"));
    std::fs::write(&pull, "pull-token\n").unwrap();
    std::fs::write(&admin, "admin-token\n").unwrap();
    let s = server("admin-token");
    let env = [
        ("TENDER_SERVER", s.url()),
        ("TENDER_TOKEN_FILE", pull.to_str().unwrap().to_string()),
        ("TENDER_ADMIN_TOKEN_FILE", admin.to_str().unwrap().to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for args in [&["gc", "--dry-run"][..], &["fsck"], &["catalog", "sync"]] {
        let before = s.seen().len();
        let (_code, out) = tender(args, &env);
        let seen = s.seen();
        let asked: Vec<&Req> = seen[before..].iter().filter(|r| r.path.starts_with("/api/v1/admin/")).collect();
        assert!(!asked.is_empty(), "{args:?} went to TENDER_SERVER: {out}");
        for r in asked {
            assert_eq!(r.header("authorization"), Some("Bearer admin-token"), "{args:?}: {r:?}");
        }
    }
    // A pull command takes the pull token.
    let before = s.seen().len();
    let (_code, out) = tender(&["prefetch", "ghcr.io/a/b:v1"], &env);
    let seen = s.seen();
    assert!(seen.len() > before, "prefetch went to TENDER_SERVER: {out}");
    assert_eq!(seen[before].header("authorization"), Some("Bearer pull-token"), "{out}");
}
