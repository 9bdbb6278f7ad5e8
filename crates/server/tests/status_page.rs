//! The status page in a real browser: headless Chromium renders it (the page has no script), the test
//! checks what it shows, and writes a screenshot to target/status-page.png.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::*;

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"].iter().map(PathBuf::from).find(|p| p.exists())
}

fn headless(bin: &PathBuf, profile: &std::path::Path, extra: &[String], url: &str) -> std::process::Output {
    Command::new(bin)
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
        .arg(url)
        .output()
        .expect("run chromium")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_render_the_status_page_in_headless_chromium() {
    let Some(bin) = chromium() else {
        assert!(std::env::var("CI").is_err(), "CI installs chromium (scripts/test.sh): this test must run there");
        eprintln!("SKIPPED should_render_the_status_page_in_headless_chromium: chromium is not installed (apt-get install chromium)");
        return;
    };
    let fake = FakeUpstream::start().await;
    let blob = fake.add_blob(random_bytes(4096, 9));
    let m = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#;
    fake.add_manifest("siderolabs/kubelet", "v1.35.0", "application/vnd.oci.image.manifest.v1+json", m);
    let tender = Tender::in_front_of(&fake).await;
    for _ in 0..3 {
        get(&tender.url("/v2/siderolabs/kubelet/manifests/v1.35.0?ns=ghcr.io"), &[]).await;
    }
    get(&tender.url(&format!("/v2/siderolabs/kubelet/blobs/{blob}?ns=ghcr.io")), &[]).await;
    let url = tender.url("/");
    let profile = tempfile::tempdir().unwrap();

    let (bin2, p2, u2) = (bin.clone(), profile.path().to_path_buf(), url.clone());
    let out = tokio::task::spawn_blocking(move || headless(&bin2, &p2, &["--dump-dom".into()], &u2)).await.unwrap();
    let dom = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(dom.contains("<h1>tender"), "{dom}");
    assert!(dom.contains("id=\"upstreams\""));
    assert!(dom.contains("ghcr.io") && dom.contains("class=\"up\""), "the upstream shows as up");
    assert!(dom.contains("ghcr.io/siderolabs/kubelet"), "the most-served repository is listed");
    assert!(dom.contains("id=\"hit-rate\""));

    let target = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target");
    std::fs::create_dir_all(&target).unwrap();
    let shot = target.join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let args = vec![format!("--screenshot={}", shot.display()), "--window-size=1100,800".to_string()];
    let (p3, u3) = (profile.path().to_path_buf(), url.clone());
    let out = tokio::task::spawn_blocking(move || headless(&bin, &p3, &args, &u3)).await.unwrap();
    assert!(out.status.success(), "chromium screenshot failed: {}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&shot).expect("a screenshot was written");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 5_000, "a real PNG");
}
