//! Tiers that stream through every hop (issue 38): node → child tender (`--parent`) → parent
//! tender → a slow upstream. The node holds bytes while the upstream is still sending; the
//! parent is killed mid-stream and restarted where the child looks for it, and the child
//! resumes from its offset on a stream the parent passes on as it refills, so the node's one
//! GET completes with the right bytes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tender_e2e::digest::sha256;
use tender_e2e::http::Conn;
use tender_e2e::poll_until;
use tender_e2e::slow::{noise, SlowBlobServer};
use tender_e2e::tender::{write_config, Tender};
use tender_e2e::TestDir;

const BLOB_BYTES: usize = 48 << 20;
/// The upstream link: six seconds for the blob.
const RATE: u64 = 8 << 20;
/// How far the node may trail the upstream while both stream: a few buffers per hop, well
/// under one 8 MiB chunk.
const LAG: u64 = 8 << 20;

/// Bytes the upstream has sent so far, over all its requests.
fn upstream_sent(up: &SlowBlobServer) -> u64 {
    up.hits().iter().map(|h| h.sent).sum()
}

#[test]
fn should_stream_through_two_tiers_and_resume_when_the_parent_restarts() {
    let dir = TestDir::new("fleet-tiers");
    let body = Arc::new(noise(BLOB_BYTES));
    let digest = sha256(&body);
    let upstream = SlowBlobServer::start("e2e/big", &digest, body.clone(), RATE);
    let parent_config = dir.path().join("parent.yaml");
    write_config(&parent_config, &[("ghcr.io", &upstream.url())], "");
    let parent_data = dir.path().join("parent-data");
    let mut parent = Tender::start(&parent_config, &parent_data, &dir.path().join("parent-1.log"));
    let parent_addr = parent.addr;
    let child_config = dir.path().join("child.yaml");
    write_config(&child_config, &[], "");
    let child = Tender::start_with(
        &child_config,
        &dir.path().join("child-data"),
        &dir.path().join("child.log"),
        &["--parent", &format!("http://{parent_addr}")],
    );

    // One node pulls the blob through the child.
    let received = Arc::new(AtomicU64::new(0));
    let node = {
        let (addr, received) = (child.addr, received.clone());
        let path = format!("/v2/ghcr.io/e2e/big/blobs/{digest}");
        std::thread::spawn(move || {
            let mut h = Sha256::new();
            let head = Conn::open(addr)?.request_to("GET", &path, &[], &mut |b| {
                h.update(b);
                received.fetch_add(b.len() as u64, Ordering::SeqCst);
            })?;
            Ok::<_, std::io::Error>((head.status, format!("sha256:{}", hex::encode(h.finalize()))))
        })
    };

    // Streaming through both hops: the node holds bytes while the upstream is still sending,
    // and trails it by less than a chunk.
    poll_until("the node to hold 4 MiB", Duration::from_secs(60), || {
        (received.load(Ordering::SeqCst) >= 4 << 20).then_some(())
    });
    let (got, sent) = (received.load(Ordering::SeqCst), upstream_sent(&upstream));
    assert!(sent < BLOB_BYTES as u64, "the upstream had not finished ({sent} bytes) when the node held {got}");
    assert!(sent.saturating_sub(got) <= LAG, "the node trails the upstream by {} bytes", sent - got);

    // The parent dies mid-stream and comes back on the same address.
    poll_until("the node to hold 12 MiB", Duration::from_secs(60), || {
        (received.load(Ordering::SeqCst) >= 12 << 20).then_some(())
    });
    parent.kill9();
    let at_kill = received.load(Ordering::SeqCst);
    assert!(at_kill < BLOB_BYTES as u64, "the parent died mid-stream");
    let parent = Tender::start_on(&parent_config, &parent_data, &dir.path().join("parent-2.log"), parent_addr, &[]);

    // The child resumes from its offset and the bytes stream again before the parent's refill
    // ends: the node gains 4 MiB while the upstream is still sending the rest.
    poll_until("the node to gain 4 MiB after the restart", Duration::from_secs(60), || {
        (received.load(Ordering::SeqCst) >= at_kill + (4 << 20)).then_some(())
    });
    let hits = upstream.hits();
    let last = hits.last().expect("the upstream was asked");
    let remaining = BLOB_BYTES as u64 - last.range_start().unwrap_or(0);
    assert!(
        last.sent < remaining,
        "the restarted parent's refill had not ended ({} of {remaining} bytes) when the node got new bytes: {hits:#?}",
        last.sent
    );

    // The node's one GET completes with the blob.
    let (status, got_digest) = node.join().expect("node thread").expect("the node's GET completes");
    assert_eq!(status, 200);
    assert_eq!(got_digest, digest, "the node holds the blob");
    assert_eq!(received.load(Ordering::SeqCst), BLOB_BYTES as u64);

    // The restarted parent answered the child a range (206): the child resumed, not restarted.
    let resumed: Vec<_> = parent.access().into_iter().filter(|a| a.is_blob() && a.method == "GET").collect();
    assert_eq!(resumed.len(), 1, "one request from the child after the restart: {resumed:?}");
    assert_eq!(resumed[0].status, 206, "the child asked for the bytes it lacked: {resumed:?}");
    assert!(resumed[0].bytes < BLOB_BYTES as u64, "{resumed:?}");
    // And the parent resumed its own spool: the upstream sent the blob about once.
    let hits = upstream.hits();
    let sent: u64 = hits.iter().map(|h| h.sent).sum();
    assert!(
        sent < BLOB_BYTES as u64 + (16 << 20),
        "the upstream sent {sent} bytes for a blob of {BLOB_BYTES}: {hits:#?}"
    );
    assert!(hits.iter().skip(1).all(|h| h.range_start().is_some_and(|s| s > 0)), "{hits:#?}");
    drop(child);
    drop(parent);
}

#[test]
fn should_go_to_the_upstream_itself_when_the_parents_are_down_only_with_fallback_to_upstream() {
    let dir = TestDir::new("fleet-fallback");
    let body = Arc::new(noise(1 << 20));
    let digest = sha256(&body);
    let upstream = SlowBlobServer::start("e2e/small", &digest, body.clone(), 64 << 20);
    let parent_config = dir.path().join("parent.yaml");
    write_config(&parent_config, &[("ghcr.io", &upstream.url())], "");
    let parent = Tender::start(&parent_config, &dir.path().join("parent-data"), &dir.path().join("parent.log"));
    let parent_url = format!("http://{}", parent.addr);
    // Both children list the upstream themselves; one may fall back to it (config key), the
    // other not (the default).
    let child = |name: &str, extra: &str| {
        let config = dir.path().join(format!("{name}.yaml"));
        write_config(&config, &[("ghcr.io", &upstream.url())], &format!("parent:\n  urls: [{parent_url}]\n{extra}"));
        Tender::start(&config, &dir.path().join(format!("{name}-data")), &dir.path().join(format!("{name}.log")))
    };
    let strict = child("strict", "");
    let allowed = child("allowed", "  fallbackToUpstream: true\n");
    let _ = parent.terminate(Duration::from_secs(10));
    let path = format!("/v2/ghcr.io/e2e/small/blobs/{digest}");

    let r = Conn::open(strict.addr).unwrap().request("GET", &path, &[]).unwrap();
    assert!(r.head.status >= 500, "no parent and no fallback: {}", r.head.status);
    assert!(upstream.hits().is_empty(), "the strict child did not touch the upstream: {:?}", upstream.hits());

    let r = Conn::open(allowed.addr).unwrap().request("GET", &path, &[]).unwrap();
    assert_eq!(r.head.status, 200);
    assert_eq!(sha256(&r.body), digest);
    assert_eq!(upstream.hits().len(), 1, "the allowed child asked the upstream once");

    let health = |t: &Tender| -> serde_json::Value {
        serde_json::from_slice(&tender_e2e::http::get(t.addr, "/api/v1/health").unwrap().body).unwrap()
    };
    let h = health(&allowed);
    assert_eq!(h["upstreams"][0]["fallbackToUpstream"], true, "{h}");
    assert_eq!(h["upstreams"][0]["fallback"]["state"], "up", "{h}");
    assert_eq!(h["upstreams"][0]["fallback"]["requests"], 1, "{h}");
    let h = health(&strict);
    assert_eq!(h["upstreams"][0]["fallbackToUpstream"], false, "{h}");
}
