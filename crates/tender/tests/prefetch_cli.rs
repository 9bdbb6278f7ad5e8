//! `tender prefetch --server` as a binary against an in-process fake registry: the headers
//! every request carries (`X-Tender-Prefetch`, `X-Tender-Pin`, `?ns=`, credentials), which
//! platforms are walked, and which failures give exit 1 (definite) or 3 (transient only).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

mod probe_support;

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;

use probe_support::{respond, Fake, Reply, Req};
use sha2::Digest as _;

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn digest(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}

/// A registry holding `a/multi:v1` (index: linux/amd64, linux/arm64/v8) and `a/single:v1`
/// (one amd64 manifest), each with a config and one layer.
struct Content {
    /// path (without query) -> (content type, body)
    routes: HashMap<String, (&'static str, Vec<u8>)>,
    amd64_blobs: Vec<String>,
    arm64_blobs: Vec<String>,
    single_blobs: Vec<String>,
}

fn image(
    repo: &str,
    arch: &str,
    routes: &mut HashMap<String, (&'static str, Vec<u8>)>,
) -> (String, usize, Vec<String>) {
    let config = format!(r#"{{"architecture":"{arch}","os":"linux","rootfs":{{"type":"layers","diff_ids":[]}}}}"#);
    let layer: Vec<u8> = format!("{repo}-{arch}-layer").bytes().cycle().take(50_000).collect();
    let (cd, ld) = (digest(config.as_bytes()), digest(&layer));
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{cd}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{ld}","size":{}}}]}}"#,
        config.len(),
        layer.len()
    );
    let md = digest(manifest.as_bytes());
    routes.insert(format!("/v2/{repo}/blobs/{cd}"), ("application/octet-stream", config.into_bytes()));
    routes.insert(format!("/v2/{repo}/blobs/{ld}"), ("application/octet-stream", layer));
    routes.insert(format!("/v2/{repo}/manifests/{md}"), (OCI_MANIFEST, manifest.clone().into_bytes()));
    (md, manifest.len(), vec![cd, ld])
}

fn content() -> Arc<Content> {
    let mut routes = HashMap::new();
    let (amd, amd_size, amd64_blobs) = image("a/multi", "amd64", &mut routes);
    let (arm, arm_size, arm64_blobs) = image("a/multi", "arm64", &mut routes);
    let index = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{{"mediaType":"{OCI_MANIFEST}","digest":"{amd}","size":{amd_size},"platform":{{"architecture":"amd64","os":"linux"}}}},{{"mediaType":"{OCI_MANIFEST}","digest":"{arm}","size":{arm_size},"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}}]}}"#
    );
    routes.insert("/v2/a/multi/manifests/v1".to_string(), (OCI_INDEX, index.into_bytes()));
    let (single, _, single_blobs) = image("a/single", "amd64", &mut routes);
    let body = routes[&format!("/v2/a/single/manifests/{single}")].clone();
    routes.insert("/v2/a/single/manifests/v1".to_string(), body);
    Arc::new(Content { routes, amd64_blobs, arm64_blobs, single_blobs })
}

fn serve(c: &Content, req: &Req) -> Reply {
    let path = req.path.split('?').next().unwrap_or("");
    match c.routes.get(path) {
        Some((ct, body)) => respond(200, &[("Content-Type", ct)], body.clone()),
        None => respond(404, &[("Content-Type", "application/json")], r#"{"errors":[{"code":"NOT_FOUND"}]}"#),
    }
}

fn prefetch(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tender")).arg("prefetch").args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// Blob digests GET-requested, in order.
fn blob_gets(seen: &[Req]) -> Vec<String> {
    seen.iter()
        .filter(|r| r.method == "GET" && r.path.contains("/blobs/"))
        .map(|r| r.path.split("/blobs/").nth(1).unwrap().split('?').next().unwrap().to_string())
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn should_send_the_prefetch_and_pin_headers_ns_and_credentials_on_every_request() {
    let c = content();
    let reg = Fake::start({
        let c = c.clone();
        move |r| serve(&c, r)
    });
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let (code, out) =
        prefetch(&["--server", &reg.url(), "--pin", "--token-file", token.to_str().unwrap(), "ghcr.io/a/multi:v1"]);
    assert_eq!(code, 0, "{out}");
    let seen = reg.seen();
    assert_eq!(seen.len(), 4, "index, amd64 manifest, config, layer: {seen:#?}");
    for r in &seen {
        assert_eq!(r.header("x-tender-prefetch"), Some("1"), "{r:?}");
        assert_eq!(r.header("x-tender-pin"), Some("1"), "{r:?}");
        assert_eq!(r.header("authorization"), Some("Bearer t0ken"), "{r:?}");
        assert!(r.header("user-agent").is_some_and(|u| u.starts_with("tender-prefetch/")), "{r:?}");
        assert!(r.path.ends_with("?ns=ghcr.io"), "{r:?}");
    }
    assert_eq!(sorted(blob_gets(&seen)), sorted(c.amd64_blobs.clone()), "only the amd64 blobs");

    // without --pin: no pin header
    let reg = Fake::start(move |r| serve(&c, r));
    let (code, out) = prefetch(&["--server", &reg.url(), "ghcr.io/a/multi:v1"]);
    assert_eq!(code, 0, "{out}");
    assert!(reg
        .seen()
        .iter()
        .all(|r| r.header("x-tender-pin").is_none() && r.header("x-tender-prefetch") == Some("1")));
}

#[test]
fn should_walk_every_requested_platform_and_single_arch_images_directly() {
    let c = content();
    let reg = Fake::start({
        let c = c.clone();
        move |r| serve(&c, r)
    });
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("images.txt");
    std::fs::write(&list, "# the worker images\nghcr.io/a/multi:v1   # both arches\n\nghcr.io/a/single:v1\n").unwrap();
    let (code, out) = prefetch(&[
        "--server",
        &reg.url(),
        "--file",
        list.to_str().unwrap(),
        "--platform",
        "linux/arm64",
        "--platform",
        "linux/amd64",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("[linux/arm64, linux/amd64]") && out.contains("[single-platform]"), "{out}");
    let want: Vec<String> = c.amd64_blobs.iter().chain(&c.arm64_blobs).chain(&c.single_blobs).cloned().collect();
    assert_eq!(sorted(blob_gets(&reg.seen())), sorted(want), "each blob once");
}

#[test]
fn should_exit_1_on_a_definite_failure() {
    let c = content();
    let reg = Fake::start({
        let c = c.clone();
        move |r| serve(&c, r)
    });
    // a platform the index does not have
    let (code, out) = prefetch(&["--server", &reg.url(), "--platform", "linux/s390x", "ghcr.io/a/multi:v1"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no linux/s390x manifest in the index"), "{out}");
    // an image the registry does not have, beside one it has
    let (code, out) = prefetch(&["--server", &reg.url(), "ghcr.io/a/missing:v1", "ghcr.io/a/single:v1"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("failed    ghcr.io/a/missing:v1") && out.contains("fetched   ghcr.io/a/single:v1"), "{out}");

    // a blob that is complete but not the size its manifest says
    let short = Fake::start(move |r| match serve(&c, r) {
        Reply::Respond { status: 200, headers, mut body } if r.path.contains("/blobs/") => {
            body.truncate(body.len() / 2);
            Reply::Respond { status: 200, headers, body }
        }
        other => other,
    });
    let (code, out) = prefetch(&["--server", &short.url(), "ghcr.io/a/single:v1"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("where the manifest says"), "{out}");
}

#[test]
fn should_exit_3_when_only_transient_failures_remain() {
    let c = content();
    let flaky = Fake::start({
        let c = c.clone();
        move |r| if r.path.contains("/blobs/") { respond(503, &[], "") } else { serve(&c, r) }
    });
    let (code, out) =
        prefetch(&["--server", &flaky.url(), "--retries", "0", "ghcr.io/a/multi:v1", "ghcr.io/a/single:v1"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("transient ghcr.io/a/multi:v1"), "{out}");

    // one transient and one definite failure: the definite one decides
    let (code, out) =
        prefetch(&["--server", &flaky.url(), "--retries", "0", "ghcr.io/a/single:v1", "ghcr.io/a/missing:v1"]);
    assert_eq!(code, 1, "{out}");

    // a server that answers nothing useful at all
    let rude = Fake::start(|_| Reply::Close);
    let (code, out) = prefetch(&["--server", &rude.url(), "--retries", "1", "ghcr.io/a/single:v1"]);
    assert_eq!(code, 3, "{out}");
    assert_eq!(rude.hits(), 2, "the manifest asked twice: once and one retry");
}

#[test]
fn should_retry_transient_failures_and_succeed() {
    let c = content();
    let failed_once = std::sync::Mutex::new(std::collections::HashSet::new());
    let flaky = Fake::start(move |r| {
        // every path answers 503 the first time it is asked
        if failed_once.lock().unwrap().insert(r.path.clone()) {
            return respond(503, &[], "");
        }
        serve(&c, r)
    });
    let (code, out) = prefetch(&["--server", &flaky.url(), "ghcr.io/a/multi:v1"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(flaky.hits(), 8, "4 requests, each once more after its 503");
}

#[test]
fn should_refuse_bad_arguments_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("data");
    let d = d.to_str().unwrap();
    for args in [
        vec!["alpine"],
        vec!["--server", "http://127.0.0.1:1"],
        vec!["--server", "http://127.0.0.1:1", "--data", d, "alpine"],
        vec!["--data", d, "--token-file", "/nonexistent", "alpine"],
        vec!["--server", "http://127.0.0.1:1", "--kubernetes", "v1.20"],
        vec!["--server", "http://127.0.0.1:1", "--platform", "amd64", "alpine"],
        vec!["--server", "http://127.0.0.1:1", "--file", "/nonexistent"],
        vec!["--server", "http://127.0.0.1:1", "--os-image", "/image/x/y"],
        vec!["--server", "http://127.0.0.1:1", "--schematic", "abc", "alpine"],
    ] {
        let (code, out) = prefetch(&args);
        assert_eq!(code, 2, "{args:?}: {out}");
    }
    assert!(!dir.path().join("data").exists(), "a usage error touches no data directory");
}

/// A registry whose blobs each take `delay` to answer (a slow upstream).
fn slow_registry(delay: std::time::Duration) -> (Arc<Content>, Fake) {
    let c = content();
    let reg = Fake::start({
        let c = c.clone();
        move |r| {
            if r.path.contains("/blobs/") {
                std::thread::sleep(delay);
            }
            serve(&c, r)
        }
    });
    (c, reg)
}

/// Issue 20, item 2: output that is not a terminal gets a line for the whole run every
/// `--progress-interval` and one at the end; `--quiet` prints no progress at all.
#[test]
fn should_print_plain_progress_lines_to_a_pipe_and_none_when_quiet() {
    let (_c, reg) = slow_registry(std::time::Duration::from_millis(700));
    let out = Command::new(env!("CARGO_BIN_EXE_tender"))
        .args([
            "prefetch",
            "--server",
            &reg.url(),
            "--progress-interval",
            "100ms",
            "--jobs",
            "1",
            "ghcr.io/a/single:v1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(" objects, ")).collect();
    assert!(lines.len() >= 3, "periodic lines and the last one: {err}");
    let last = lines.last().unwrap();
    assert!(last.starts_with("prefetch: 3/3 objects, "), "{err}");
    assert!(last.contains("/s"), "{last}");
    assert!(lines[0].starts_with("prefetch: ") && lines[0].contains(" of "), "{err}");
    assert!(!err.contains('\u{1b}'), "no terminal codes into a pipe: {err:?}");

    let (_c, reg) = slow_registry(std::time::Duration::ZERO);
    let out = Command::new(env!("CARGO_BIN_EXE_tender"))
        .args(["prefetch", "--server", &reg.url(), "--quiet", "ghcr.io/a/single:v1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "--quiet");
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 of 1 item(s) in the cache"), "the summary stays");
}

/// Issue 20, item 2: on a terminal (a pty from `script`, util-linux) the run gets a total bar
/// with objects, bytes, rate and ETA above the per-item bars.
#[test]
fn should_draw_a_total_bar_on_a_terminal() {
    let (_c, reg) = slow_registry(std::time::Duration::from_millis(300));
    let cmd = format!("{} prefetch --server {} --jobs 1 ghcr.io/a/single:v1", env!("CARGO_BIN_EXE_tender"), reg.url());
    let out = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("TERM", "xterm")
        .env("COLUMNS", "160")
        .output()
        .expect("script (util-linux) runs the command on a pty");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("total"), "{text}");
    assert!(text.contains("/3 objects"), "{text}");
    assert!(text.contains("ETA"), "{text}");
    assert!(text.contains("1 of 1 item(s) in the cache"), "{text}");
}
