//! `tender probe` as a binary against real listeners on 127.0.0.1: a working tender (the real
//! binary in front of an in-process fake upstream), a closed port, a server that never
//! answers, a plain web server, a 5xx flapper, a registry that wants credentials, an OS image
//! answered 200 instead of 206, and the cache rule (yes / no reused without asking, unknown
//! never stored).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sha2::Digest as _;

const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

mod probe_support;
use probe_support::{respond, Fake, Reply, Req, Tender};

/// A well-behaved registry: `/v2/`, one manifest, one OS image (honouring Range when asked to).
fn registry(ranges: bool) -> impl Fn(&Req) -> Reply + Send + Sync + 'static {
    let manifest = manifest_json();
    let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&manifest)));
    let image = xz_image();
    move |req: &Req| {
        let path = req.path.split('?').next().unwrap_or("");
        if path == "/v2/" {
            return respond(200, &[("Docker-Distribution-API-Version", "registry/2.0")], "{}");
        }
        if path == "/v2/siderolabs/kubelet/manifests/v1.35.0" || path.ends_with(&format!("/manifests/{digest}")) {
            return respond(
                200,
                &[("Content-Type", OCI_MANIFEST), ("Docker-Content-Digest", &digest)],
                manifest.clone(),
            );
        }
        if path.starts_with("/image/") && path.ends_with(".raw.xz") {
            if ranges && req.header("range") == Some("bytes=0-0") {
                let cr = format!("bytes 0-0/{}", image.len());
                return respond(206, &[("Content-Range", &cr)], image[..1].to_vec());
            }
            return respond(200, &[("Content-Type", "application/octet-stream")], image.clone());
        }
        respond(404, &[("Content-Type", "application/json")], r#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#)
    }
}

fn manifest_json() -> Vec<u8> {
    let cfg = format!("sha256:{}", "c".repeat(64));
    let layer = format!("sha256:{}", "d".repeat(64));
    format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{cfg}","size":2}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{layer}","size":3}}]}}"#
    )
    .into_bytes()
}

fn xz_image() -> Vec<u8> {
    let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
    e.write_all(&vec![7u8; 200_000]).unwrap();
    e.finish().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Running the binary

struct Out {
    line: String,
    code: i32,
    stderr: String,
    took: Duration,
}

fn probe(args: &[&str]) -> Out {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_tender")).arg("probe").args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(stdout.lines().count() <= 1, "probe prints one line, got {stdout:?}");
    Out {
        line: stdout.trim_end().to_string(),
        code: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        took: start.elapsed(),
    }
}

fn assert_outcome(out: &Out, prefix: &str, code: i32) {
    assert!(
        out.line.starts_with(prefix) && out.code == code,
        "expected {prefix:?} with exit {code}, got {:?} exit {} (stderr: {})",
        out.line,
        out.code,
        out.stderr
    );
}

/// A port nothing listens on.
fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

fn os_image() -> String {
    format!("/image/{SCHEMATIC}/v1.13.6/openstack-amd64.raw.xz")
}

// ---------------------------------------------------------------------------------------------
// Outcomes

#[test]
fn should_say_yes_for_a_working_tender_and_no_for_what_it_cannot_serve() {
    let upstream = Fake::start(registry(false));
    let tender = Tender::start(&upstream.url());
    let os = os_image();
    let out = probe(&[&tender.url, "--image", "ghcr.io/siderolabs/kubelet:v1.35.0", "--os-image", &os]);
    assert_outcome(&out, "yes", 0);
    assert_eq!(out.line, "yes");

    // the same OS image again, as a full URL under the base, right after its fill (this once met
    // a 502 when the reader opened the spool during the rename into the store; fixed in fetch)
    let out = probe(&[&tender.url, "--os-image", &format!("{}{os}", tender.url)]);
    assert_outcome(&out, "yes", 0);

    // an image the upstream does not have: tender answers 404
    let out = probe(&[&tender.url, "--image", "ghcr.io/siderolabs/kubelet:v0.0.0"]);
    assert_outcome(&out, "no (not found)", 1);

    // a registry tender does not mirror: 404 without any outbound connection
    let before = upstream.hits();
    let out = probe(&[&tender.url, "--image", "quay.io/x/y:z"]);
    assert_outcome(&out, "no (not found)", 1);
    assert_eq!(upstream.hits(), before, "an unconfigured ns never reaches an upstream");
}

#[test]
fn should_send_the_registry_host_as_ns_and_ask_for_manifest_types() {
    let reg = Fake::start(registry(true));
    let out = probe(&[&reg.url(), "--image", "ghcr.io/siderolabs/kubelet:v1.35.0"]);
    assert_outcome(&out, "yes", 0);
    let seen = reg.seen();
    let head = seen.iter().find(|r| r.method == "HEAD").expect("a HEAD of the manifest");
    assert_eq!(head.path, "/v2/siderolabs/kubelet/manifests/v1.35.0?ns=ghcr.io");
    let accept = head.header("accept").unwrap_or("");
    for t in [
        OCI_MANIFEST,
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ] {
        assert!(accept.contains(t), "Accept {accept:?} lacks {t}");
    }
    assert!(seen.iter().all(|r| r.header("user-agent").is_some_and(|u| u.starts_with("tender-probe/"))));
}

#[test]
fn should_say_no_when_the_port_is_closed() {
    let out = probe(&[&closed_port(), "--timeout", "5s"]);
    assert_outcome(&out, "no (connection refused)", 1);
}

#[test]
fn should_say_unknown_when_the_server_never_answers() {
    let silent = Fake::start(|_| Reply::Hang);
    let out = probe(&[&silent.url(), "--timeout", "1s"]);
    assert_outcome(&out, "unknown (timeout)", 3);
    assert!(out.took < Duration::from_secs(5), "the timeout bounds the whole probe, took {:?}", out.took);
}

#[test]
fn should_say_unknown_when_the_connection_is_reset() {
    let rude = Fake::start(|_| Reply::Close);
    let out = probe(&[&rude.url(), "--timeout", "5s"]);
    assert!(out.line.starts_with("unknown (") && out.code == 3, "{:?} exit {}", out.line, out.code);
}

#[test]
fn should_say_no_to_a_plain_web_server_answering_200_to_everything() {
    let web = Fake::start(|_| respond(200, &[("Content-Type", "text/html")], "<html>welcome</html>"));
    let out = probe(&[&web.url(), "--image", "alpine"]);
    assert_outcome(&out, "no (not a registry)", 1);
}

#[test]
fn should_say_unknown_for_a_5xx_flapper() {
    let n = AtomicUsize::new(0);
    let flapper = Fake::start(move |_| {
        let status = if n.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) { 503 } else { 502 };
        respond(status, &[], "")
    });
    let out = probe(&[&flapper.url()]);
    assert_outcome(&out, "unknown (server error)", 3);

    // /v2/ fine, the manifest flaps: still unknown, not no
    let ok = registry(false);
    let flaky = Fake::start(move |r| if r.path.starts_with("/v2/siderolabs/") { respond(503, &[], "") } else { ok(r) });
    let out = probe(&[&flaky.url(), "--image", "ghcr.io/siderolabs/kubelet:v1.35.0"]);
    assert_outcome(&out, "unknown (server error)", 3);
}

#[test]
fn should_keep_looking_after_unknown_and_prefer_a_definite_no() {
    let ok = registry(false);
    let reg = Fake::start(move |r| if r.path.contains("/flaky/") { respond(500, &[], "") } else { ok(r) });
    let out = probe(&[&reg.url(), "--image", "ghcr.io/a/flaky:1", "--image", "ghcr.io/b/missing:1"]);
    assert_outcome(&out, "no (not found)", 1);
}

fn wants_credentials(req: &Req) -> Reply {
    let ok = matches!(req.header("authorization"), Some("Bearer s3cret") | Some("Basic cm9ib3Q6aHVudGVyMg=="));
    if ok {
        return registry(true)(req);
    }
    respond(
        401,
        &[
            ("Docker-Distribution-API-Version", "registry/2.0"),
            ("WWW-Authenticate", r#"Basic realm="tender""#),
            ("Content-Type", "application/json"),
        ],
        r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
    )
}

#[test]
fn should_say_no_unauthorized_on_401_and_yes_with_credentials() {
    let reg = Fake::start(wants_credentials);
    let dir = tempfile::tempdir().unwrap();
    let out = probe(&[&reg.url()]);
    assert_outcome(&out, "no (unauthorized)", 1);

    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let out =
        probe(&[&reg.url(), "--token-file", token.to_str().unwrap(), "--image", "ghcr.io/siderolabs/kubelet:v1.35.0"]);
    assert_outcome(&out, "yes", 0);

    let password = dir.path().join("password");
    std::fs::write(&password, "hunter2\n").unwrap();
    let out = probe(&[&reg.url(), "--username", "robot", "--password-file", password.to_str().unwrap()]);
    assert_outcome(&out, "yes", 0);

    std::fs::write(&token, "wrong").unwrap();
    let out = probe(&[&reg.url(), "--token-file", token.to_str().unwrap()]);
    assert_outcome(&out, "no (unauthorized)", 1);
}

#[test]
fn should_say_no_when_an_os_image_answers_200_instead_of_206() {
    let os = os_image();
    let no_ranges = Fake::start(registry(false));
    let out = probe(&[&no_ranges.url(), "--os-image", &os]);
    assert_outcome(&out, "no (no range support)", 1);

    let ranges = Fake::start(registry(true));
    let out = probe(&[&ranges.url(), "--os-image", &os]);
    assert_outcome(&out, "yes", 0);
    let seen = ranges.seen();
    assert!(seen.iter().any(|r| r.path == os && r.header("range") == Some("bytes=0-0")));

    let out = probe(&[&ranges.url(), "--os-image", &format!("/image/{SCHEMATIC}/v1.13.6/metal-amd64.iso")]);
    assert_outcome(&out, "no (not found)", 1);
}

#[test]
fn should_say_no_when_a_manifest_has_the_wrong_media_type() {
    let ok = registry(false);
    let html = Fake::start(move |r| {
        if r.path.contains("/manifests/") {
            respond(200, &[("Content-Type", "text/html")], "<html>")
        } else {
            ok(r)
        }
    });
    let out = probe(&[&html.url(), "--image", "ghcr.io/siderolabs/kubelet:v1.35.0"]);
    assert_outcome(&out, "no (not a manifest)", 1);
}

#[test]
fn should_refuse_bad_arguments_with_exit_2() {
    for args in [
        vec!["not a url"],
        vec!["http://127.0.0.1:1", "--image", "UPPER/case"],
        vec!["http://127.0.0.1:1", "--os-image", "http://elsewhere/image/x"],
        vec!["http://127.0.0.1:1", "--cache-ttl", "1m"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tender")).arg("probe").args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stdout.is_empty(), "{args:?}: a usage error prints no verdict");
    }
}

// ---------------------------------------------------------------------------------------------
// The cache rule

fn cache_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("probe-cache.json")
}

#[test]
fn should_reuse_a_cached_yes_without_asking_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(&dir);
    let c = cache.to_str().unwrap();
    let reg = Fake::start(registry(true));
    let url = reg.url();
    let out = probe(&[&url, "--image", "ghcr.io/siderolabs/kubelet:v1.35.0", "--image", "alpine", "--cache", c]);
    // alpine is not there: this question is "no"; ask the one that is "yes" too
    assert_outcome(&out, "no (not found)", 1);
    let out = probe(&[&url, "--image", "ghcr.io/siderolabs/kubelet:v1.35.0", "--cache", c]);
    assert_outcome(&out, "yes", 0);
    let hits = reg.hits();
    drop(reg);
    assert_outcome(&probe(&[&url, "--cache", c]), "no (connection refused)", 1);

    // the same questions, written differently, are answered from the file
    let out = probe(&[&format!("{url}/"), "--image", "ghcr.io/siderolabs/kubelet:v1.35.0", "--cache", c]);
    assert_outcome(&out, "yes", 0);
    let out = probe(&[
        &url,
        "--image",
        "docker.io/library/alpine:latest",
        "--image",
        "GHCR.io/siderolabs/kubelet:v1.35.0",
        "--cache",
        c,
    ]);
    assert_outcome(&out, "no (not found)", 1);
    assert_eq!(hits, 4, "2 probes of 2 requests each reached the server; the cached ones none");

    // another question is asked (and the server is gone)
    let out = probe(&[&url, "--image", "ghcr.io/siderolabs/kubelet:v1.35.1", "--cache", c]);
    assert_outcome(&out, "no (connection refused)", 1);

    // the file is JSON keyed by the question
    let text = std::fs::read_to_string(&cache).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let answers = v["answers"].as_object().unwrap();
    assert!(answers.values().any(|a| a["verdict"]["answer"] == "yes"
        && a["question"]["images"] == serde_json::json!(["ghcr.io/siderolabs/kubelet:v1.35.0"])
        && a["storedAt"].as_u64().is_some()));
}

#[test]
fn should_reuse_a_cached_no_and_never_store_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(&dir);
    let c = cache.to_str().unwrap();

    let silent = Fake::start(|_| Reply::Hang);
    let silent_url = silent.url();
    assert_outcome(&probe(&[&silent_url, "--timeout", "1s", "--cache", c]), "unknown (timeout)", 3);
    assert!(!cache.exists(), "unknown is never stored");
    drop(silent);
    assert_outcome(&probe(&[&silent_url, "--cache", c]), "no (connection refused)", 1);

    let web = Fake::start(|_| respond(200, &[("Content-Type", "text/html")], "<html>"));
    let url = web.url();
    assert_outcome(&probe(&[&url, "--cache", c]), "no (not a registry)", 1);
    drop(web);
    let out = probe(&[&url, "--cache", c]);
    assert_outcome(&out, "no (not a registry)", 1);
    // without the cache the server's absence shows
    assert_outcome(&probe(&[&url]), "no (connection refused)", 1);
}

#[test]
fn should_ask_again_once_the_cache_ttl_passed() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_in(&dir);
    let c = cache.to_str().unwrap();
    let reg = Fake::start(registry(true));
    let url = reg.url();
    assert_outcome(&probe(&[&url, "--cache", c, "--cache-ttl", "1s"]), "yes", 0);
    drop(reg);
    assert_outcome(&probe(&[&url, "--cache", c, "--cache-ttl", "1h"]), "yes", 0);
    std::thread::sleep(Duration::from_millis(2100));
    assert_outcome(&probe(&[&url, "--cache", c, "--cache-ttl", "1s"]), "no (connection refused)", 1);
}
