//! Hostile clients and hostile upstreams (issue 16): one test per class of hole, each against
//! real listeners on 127.0.0.1. SECURITY.md names the guarantee each test holds.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt as _;

use support::*;
use tender_server::{Security, Surface};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Tests that measure the process's memory run one at a time.
static MEASURED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This process's resident set, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

async fn secured(fake: &FakeUpstream, security: Security) -> Tender {
    let ups = vec![upstream_settings("ghcr.io", &fake.url())];
    Tender::start_full(ups, None, fast_settings(), security, None, Surface::All).await
}

async fn metrics_text(tender: &Tender) -> String {
    String::from_utf8_lossy(&get(&tender.url("/metrics"), &[]).await.body.unwrap()).into_owned()
}

/// Send one raw request head and read the answer until the server closes or 5 s pass.
async fn raw(addr: SocketAddr, head: &[u8]) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(head).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    out
}

/// Class 2: a label value never comes from the request. 2,000 requests with distinct 60 KB
/// methods (answered 404, 405 or 401) leave `/metrics` and the process's memory flat.
#[tokio::test]
async fn should_keep_metrics_and_memory_flat_under_distinct_long_methods() {
    let _one = MEASURED.lock().await;
    let fake = FakeUpstream::start().await;
    let tender = secured(&fake, Security::default()).await;
    let paths = ["/v2/", "/healthz", "/nope", "/v2/ghcr.io/a/b/manifests/x"];
    let method = |i: usize| format!("M{i:05}{}", "X".repeat(60 * 1024));
    // Warm up: every route and the `other` method once.
    for (i, p) in paths.iter().enumerate() {
        raw(tender.addr, format!("{} {p} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", method(i)).as_bytes())
            .await;
    }
    let before_metrics = metrics_text(&tender).await.len();
    let before_rss = rss();
    let sent = futures::stream::iter(0..2000usize)
        .map(|i| {
            let head = format!(
                "{} {} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                method(i + 100),
                paths[i % paths.len()]
            );
            let addr = tender.addr;
            async move { !raw(addr, head.as_bytes()).await.is_empty() }
        })
        .buffer_unordered(8)
        .filter(|answered| futures::future::ready(*answered))
        .count()
        .await;
    assert!(sent > 1900, "only {sent} of 2000 requests were answered");
    let text = metrics_text(&tender).await;
    let after_rss = rss();
    let grown = text.len().saturating_sub(before_metrics);
    eprintln!(
        "/metrics {} -> {} bytes; RSS {} -> {} MiB",
        before_metrics,
        text.len(),
        before_rss >> 20,
        after_rss >> 20
    );
    assert!(grown < 16 * 1024, "/metrics grew by {grown} bytes");
    assert!(!text.contains("XXXXXXXX"), "a method reached a label");
    assert!(after_rss.saturating_sub(before_rss) < 24 << 20, "RSS grew from {before_rss} to {after_rss}");
}
