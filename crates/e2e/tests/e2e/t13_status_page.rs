//! The status page in a real browser: headless Chromium renders the real binary's page (it has
//! no script) after pulls through it, the test checks what it shows, and writes a screenshot to
//! `<target>/status-page.png` (docs/status-page.png is a copy of one).

use std::path::Path;
use std::process::{Command, Output};

use std::sync::Arc;
use std::time::Duration;

use tender_e2e::digest::sha256;
use tender_e2e::registry::Sizes;
use tender_e2e::slow::{noise, SlowBlobServer};
use tender_e2e::tender::write_config;
use tender_e2e::{http, poll_until, proc};

use crate::Bed;

fn chromium() -> &'static str {
    proc::need(&["chromium"]);
    "chromium"
}

/// Chromium as the machine allows it here: headless, no sandbox (root), and none of the
/// background connections that a closed network refuses.
fn headless(profile: &Path, extra: &[String], url: &str) -> Output {
    proc::output(
        Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(extra)
            .arg(url),
    )
}

#[test]
fn should_render_the_status_page_in_headless_chromium() {
    let bed = Bed::new("status-page", Sizes::KUBELET);
    // tagTtl 0: every pull by tag asks the upstream, so one after the stop is answered stale.
    // A second upstream that sends a blob slowly (256 KiB/s), for a fill in progress.
    let slow_blob = Arc::new(noise(8 << 20));
    let slow_digest = sha256(&slow_blob);
    let slow = SlowBlobServer::start("e2e/slow", &slow_digest, slow_blob, 256 << 10);
    let upstream = [("ghcr.io", bed.registry.url()), ("slow.example", slow.url())];
    let upstream: Vec<(&str, &str)> = upstream.iter().map(|(n, u)| (*n, u.as_str())).collect();
    write_config(&bed.path("tender.yaml"), &upstream, "fetch:\n  tagTtl: 0s\n");
    let t = bed.start_tender("tender.log");
    let index = bed.images.var("KUBELET_INDEX");
    let amd64 = bed.images.var("KUBELET_AMD64");
    for path in [
        "/v2/siderolabs/kubelet/manifests/v1.33.1?ns=ghcr.io".to_string(),
        format!("/v2/siderolabs/kubelet/manifests/{index}?ns=ghcr.io"),
        format!("/v2/siderolabs/kubelet/manifests/{amd64}?ns=ghcr.io"),
    ] {
        let accept = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json";
        let r = http::request(t.addr, "GET", &path, &[("Accept", accept)]).unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let blob = bed.images.config_and_layers(amd64).pop().unwrap();
    assert_eq!(http::get(t.addr, &format!("/v2/siderolabs/kubelet/blobs/{blob}?ns=ghcr.io")).unwrap().status(), 200);

    let url = format!("http://{}/", t.hostport());
    let profile = tempfile::tempdir().unwrap();
    let out = headless(profile.path(), &["--dump-dom".into()], &url);
    let dom = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(dom.contains("<h1>tender"), "{dom}");
    assert!(dom.contains("id=\"upstreams\""), "{dom}");
    assert!(dom.contains("ghcr.io") && dom.contains("class=\"up\""), "the upstream shows as up: {dom}");
    assert!(dom.contains("ghcr.io/siderolabs/kubelet"), "the most-served repository is listed: {dom}");
    assert!(dom.contains("id=\"hit-rate\""), "{dom}");
    assert!(dom.contains("http-equiv=\"refresh\""), "the page reloads itself: {dom}");

    // The upstream stops: the page says it is down, why (connect), and counts the stale answer.
    let Bed { registry, images: _images, dir: _dir } = bed;
    drop(registry);
    let r = http::get(t.addr, "/v2/siderolabs/kubelet/manifests/v1.33.1?ns=ghcr.io").unwrap();
    assert_eq!(r.status(), 200, "the cached tag resolves with the upstream stopped");
    let out = headless(profile.path(), &["--dump-dom".into()], &url);
    let dom = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(dom.contains("class=\"down\">down"), "the upstream shows as down: {dom}");
    assert!(dom.contains("class=\"cause\">connect"), "the page names the cause: {dom}");
    assert!(dom.contains("Connection refused"), "and the cause chain: {dom}");
    assert!(dom.contains("id=\"stale-served\">1<"), "the stale answer is counted: {dom}");

    // A fill in progress (issue 20, item 1): in /api/v1/fills with its bytes growing, an ETA and
    // its client, in the log, and on the page.
    let (addr, path) = (t.addr, format!("/v2/e2e/slow/blobs/{slow_digest}?ns=slow.example"));
    std::thread::spawn(move || http::Conn::open(addr)?.request_to("GET", &path, &[], &mut |_| {}));
    let fill = |min: u64| {
        let r = http::get(t.addr, "/api/v1/fills").ok()?;
        let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
        let f = v["active"].as_array()?.iter().find(|f| f["upstream"] == "slow.example")?.clone();
        (f["bytes"].as_u64()? > min && f["etaSeconds"].is_u64() && f["clients"].as_u64()? >= 1).then_some(f)
    };
    let first = poll_until("the slow fill under way", Duration::from_secs(20), || fill(0));
    let then = first["bytes"].as_u64().unwrap();
    let later = poll_until("the slow fill growing", Duration::from_secs(20), || fill(then));
    assert_eq!(later["total"], 8 << 20, "{later}");
    assert_eq!(later["object"], slow_digest.as_str(), "{later}");
    let started = t.log_json().into_iter().any(|l| {
        l["message"] == "fill started"
            && l["level"] == "INFO"
            && l["upstream"] == "slow.example"
            && l["path"].as_str().is_some_and(|p| p.contains("/e2e/slow/blobs/"))
    });
    assert!(started, "an INFO line when the fill starts: {:?}", t.log_json());
    let out = headless(profile.path(), &["--dump-dom".into()], &url);
    let dom = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(dom.contains("<tr class=\"fill\"><td>slow.example</td>"), "the fill in progress is listed: {dom}");
    assert!(dom.contains(later["id"].as_str().unwrap()), "with its id: {dom}");

    let shot = tender_e2e::paths::tender_bin().parent().unwrap().parent().unwrap().join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let args = vec![format!("--screenshot={}", shot.display()), "--window-size=1100,1500".to_string()];
    let out = headless(profile.path(), &args, &url);
    assert!(out.status.success(), "chromium screenshot failed: {}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&shot).expect("a screenshot was written");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 5_000, "a real PNG");
}
