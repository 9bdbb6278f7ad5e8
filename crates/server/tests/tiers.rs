//! Tiers in process (issue 38): a child tender whose upstream is a parent tender (`?ns=`) in
//! front of an upstream that wants a bearer token. A storm of nodes at the child costs the
//! upstream one token per scope, one request per tag per `tagTtl` and one transfer per blob;
//! with every parent down, the child goes to the upstream itself only when allowed.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::join_all;
use support::*;

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Short, so that the test sees a second revalidation.
const TAG_TTL: Duration = Duration::from_secs(2);

/// A route to `parent` for `name`, as `serve --parent` builds it.
fn through(parent: &str, name: &str) -> tender_fetch::UpstreamSettings {
    let mut s = upstream_settings(name, parent);
    s.ns_param = Some(name.to_string());
    s.public = true;
    s
}

/// How many requests the upstream saw whose path contains `part`.
fn paths_with(fake: &FakeUpstream, part: &str) -> usize {
    fake.state.paths.lock().unwrap().iter().filter(|p| p.contains(part)).count()
}

fn sent_to(t: &Tender, upstream: &str) -> u64 {
    t.metrics.upstream_requests.get_or_create(&vec![("upstream".to_string(), upstream.to_string())]).get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_ask_the_upstream_once_per_tier_when_a_storm_of_nodes_pulls_one_image() {
    let fake = FakeUpstream::start().await;
    *fake.state.require_token.lock().unwrap() = Some("s3cret".to_string());
    *fake.state.steady.lock().unwrap() = Some(Fault::SlowDrip(8 << 20));
    let blobs: Vec<String> = (0..6).map(|i| fake.add_blob(random_bytes(256 << 10, 100 + i))).collect();
    let layers: Vec<serde_json::Value> = blobs
        .iter()
        .map(|d| serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": 256 << 10}))
        .collect();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": blobs[0], "size": 256 << 10},
        "layers": layers,
    }))
    .unwrap();
    let mdigest = fake.add_manifest("siderolabs/kubelet", "v1", MANIFEST, &manifest);
    let mut settings = fast_settings();
    settings.tag_ttl = TAG_TTL;
    let parent = Tender::start(vec![upstream_settings("ghcr.io", &fake.url())], settings.clone()).await;
    let child = Tender::start(vec![through(&parent.url(""), "ghcr.io")], settings).await;
    let base = child.url("/v2/ghcr.io/siderolabs/kubelet");

    // 16 nodes ask for every blob at once, cold: six fills per tier meet the upstream's 401
    // together, and ask for one token.
    let gets = blobs.iter().flat_map(|d| (0..16).map(move |_| d.clone())).map(|d| {
        let url = format!("{base}/blobs/{d}");
        async move { (d, get(&url, &[]).await) }
    });
    for (d, g) in join_all(gets).await {
        assert_eq!(g.status, 200, "a node was refused {d}");
        assert_eq!(sha(g.body.as_ref().unwrap()), d);
    }
    assert_eq!(fake.state.token_requests.load(Ordering::SeqCst), 1, "one token per scope for the whole tree");
    assert_eq!(fake.blob_gets(), 6, "one transfer per blob");
    assert_eq!(sent_to(&child, "ghcr.io"), 6, "the child asked its parent once per blob");

    // 200 nodes resolve the tag at the same moment (HEAD, as containerd does, and GET): one
    // request for the tag reaches the parent, and one the upstream.
    let storm = |n: usize| {
        join_all((0..n).map(|i| {
            let url = format!("{base}/manifests/v1");
            async move {
                let req = if i % 2 == 0 { client().head(&url) } else { client().get(&url) };
                let r = req.header("accept", MANIFEST).send().await.unwrap();
                let digest = r.headers().get("docker-content-digest").map(|v| v.to_str().unwrap().to_string());
                (r.status().as_u16(), digest)
            }
        }))
    };
    // At most one request per tier per tagTtl: a storm that outlasts tagTtl on a loaded machine
    // may revalidate once more per tagTtl it lasted, never once per node.
    let per_ttl = |took: Duration| 1 + (took.as_millis() / TAG_TTL.as_millis()) as usize;
    let before = sent_to(&child, "ghcr.io");
    let began = std::time::Instant::now();
    for (status, digest) in storm(200).await {
        assert_eq!(status, 200, "no node is refused (no 429) under the default limits");
        assert_eq!(digest.as_deref(), Some(mdigest.as_str()));
    }
    let most = per_ttl(began.elapsed());
    let upstream = paths_with(&fake, "/manifests/v1");
    assert!((1..=most).contains(&upstream), "{upstream} upstream requests for the tag (at most {most})");
    let from_child = (sent_to(&child, "ghcr.io") - before) as usize;
    assert!((1..=most).contains(&from_child), "{from_child} requests from the child (at most {most})");

    // Once tagTtl passed, the next storm revalidates the tag once per tier, not once per node.
    tokio::time::sleep(TAG_TTL + Duration::from_millis(100)).await;
    let (before, upstream_before) = (sent_to(&child, "ghcr.io"), paths_with(&fake, "/manifests/v1"));
    let began = std::time::Instant::now();
    for (status, _) in storm(100).await {
        assert_eq!(status, 200);
    }
    let most = per_ttl(began.elapsed());
    let upstream = paths_with(&fake, "/manifests/v1") - upstream_before;
    assert!((1..=most).contains(&upstream), "{upstream} more upstream requests for the tag (at most {most})");
    let from_child = (sent_to(&child, "ghcr.io") - before) as usize;
    assert!((1..=most).contains(&from_child), "{from_child} more requests from the child (at most {most})");
    assert_eq!(fake.state.token_requests.load(Ordering::SeqCst), 1, "the token is still good");
}

/// A loopback port nothing listens on.
async fn dead_port() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_go_to_the_upstream_itself_only_when_allowed_and_say_so_in_health() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(300_000, 7);
    let digest = fake.add_blob(body.clone());
    let parent = dead_port().await;

    // By default a child whose parents are all down does not touch the site's link.
    let strict = Tender::start(vec![through(&parent, "ghcr.io")], fast_settings()).await;
    let g = get(&strict.url(&format!("/v2/ghcr.io/a/b/blobs/{digest}")), &[]).await;
    assert!(g.status >= 500, "no parent, no fallback: {}", g.status);
    assert_eq!(fake.state.requests.load(Ordering::SeqCst), 0, "the upstream was not asked");
    let h: serde_json::Value = client().get(strict.url("/api/v1/health")).send().await.unwrap().json().await.unwrap();
    assert_eq!(h["upstreams"][0]["fallbackToUpstream"], false, "{h}");
    assert!(h["upstreams"][0].get("fallback").is_none(), "{h}");

    // parent.fallbackToUpstream: the same request goes to the upstream itself, and health says
    // the route may and did.
    let mut route = through(&parent, "ghcr.io");
    route.fallback = Some(Box::new(upstream_settings("ghcr.io", &fake.url())));
    let allowed = Tender::start(vec![route], fast_settings()).await;
    let g = get(&allowed.url(&format!("/v2/ghcr.io/a/b/blobs/{digest}")), &[]).await;
    assert_eq!(g.status, 200);
    assert_eq!(sha(g.body.as_ref().unwrap()), digest);
    assert_eq!(fake.blob_gets(), 1);
    let h: serde_json::Value = client().get(allowed.url("/api/v1/health")).send().await.unwrap().json().await.unwrap();
    let up = &h["upstreams"][0];
    assert_eq!(up["fallbackToUpstream"], true, "{h}");
    assert_eq!(up["state"], "down", "the parent route is down: {h}");
    assert_eq!(up["lastError"]["cause"], "connect", "{h}");
    assert_eq!(up["fallback"]["state"], "up", "{h}");
    assert!(up["fallback"]["requests"].as_u64().unwrap() >= 1, "{h}");

    // A parent that answers, even with an error, keeps the request: the fallback is for
    // parents that are down, not for answers the child does not like.
    let fake2 = FakeUpstream::start().await;
    *fake2.state.down.lock().unwrap() = true;
    let mut route = through(&fake2.url(), "ghcr.io");
    route.fallback = Some(Box::new(upstream_settings("ghcr.io", &fake.url())));
    let answered = Tender::start(vec![route], fast_settings()).await;
    let other = fake.add_blob(random_bytes(1000, 8));
    let g = get(&answered.url(&format!("/v2/ghcr.io/a/b/blobs/{other}")), &[]).await;
    assert!(g.status >= 500, "{}", g.status);
    assert_eq!(fake.blob_gets(), 1, "the upstream itself was not asked while a parent answered");
}
