//! Upstream isolation (issue 16, items 1, 4, 9, 10): what one upstream's clients may get of
//! what tender fetched for another, against real listeners on 127.0.0.1. Every stored object
//! records the upstreams it is known to exist in; a hit through another upstream costs one HEAD
//! there, and fills are per upstream.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::IntoResponse;
use object_store::memory::InMemory;
use support::*;
use tender_bucket::{Bucket, BucketMetrics, BucketSettings};
use tender_fetch::{Credentials, FetchSettings, UpstreamSettings};
use tender_server::auth::ClientAuth;
use tender_server::{Security, Surface};

const MT: &str = "application/vnd.oci.image.manifest.v1+json";

fn auth_security() -> Security {
    let users = HashMap::from([("worker".to_string(), bcrypt::hash("s3cret", 4).unwrap())]);
    let auth = ClientAuth::new(users, &[], true);
    Security { auth: std::sync::RwLock::new(Some(Arc::new(auth))), ..Security::default() }
}

fn private_settings(url: &str) -> UpstreamSettings {
    let mut s = upstream_settings("private.example", url);
    s.credentials = Some(Credentials { username: "robot".into(), password: "upstream-secret".into() });
    s
}

/// What a client received: the status and every body byte that arrived (up to an error).
struct Seen {
    status: u16,
    body: Vec<u8>,
}

async fn send(method: reqwest::Method, url: &str, headers: &[(&str, &str)], authed: bool) -> Seen {
    let mut req = client().request(method, url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if authed {
        req = req.basic_auth("worker", Some("s3cret"));
    }
    let mut resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    while let Ok(Some(c)) = resp.chunk().await {
        body.extend_from_slice(&c);
    }
    Seen { status, body }
}

/// The private content: a layer, a config and a manifest naming them, in repository team/app.
struct Private {
    layer: bytes::Bytes,
    layer_digest: String,
    manifest: Vec<u8>,
    manifest_digest: String,
}

fn private_content(fake: &FakeUpstream, seed: u64) -> Private {
    let layer = random_bytes(1 << 20, seed);
    let layer_digest = fake.add_blob(layer.clone());
    let config = br#"{"architecture":"amd64","os":"linux"}"#;
    let config_digest = fake.add_blob(bytes::Bytes::from_static(config));
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{MT}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{layer_digest}","size":{}}}]}}"#,
        config.len(),
        layer.len()
    )
    .into_bytes();
    let manifest_digest = fake.add_manifest("team/app", "v1", MT, &manifest);
    Private { layer, layer_digest, manifest, manifest_digest }
}

/// Every route to `public.example` (a path prefix, `ns`, and the default upstream without a
/// prefix) for `what` (`manifests/<digest>` or `blobs/<digest>`).
fn public_routes(t: &Tender, what: &str) -> Vec<String> {
    vec![
        t.url(&format!("/v2/public.example/team/app/{what}")),
        t.url(&format!("/v2/team/app/{what}?ns=public.example")),
        t.url(&format!("/v2/team/app/{what}")),
    ]
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Anonymous GET, HEAD and Range of the private manifest and layer through every public route:
/// each refused, not one private byte in any answer.
async fn assert_refused_everywhere(t: &Tender, p: &Private, when: &str) {
    for (what, secret) in [
        (format!("manifests/{}", p.manifest_digest), &p.manifest[..]),
        (format!("blobs/{}", p.layer_digest), &p.layer[..64]),
    ] {
        for url in public_routes(t, &what) {
            let accept = ("accept", MT);
            for (method, headers) in [
                (reqwest::Method::GET, vec![accept]),
                (reqwest::Method::HEAD, vec![accept]),
                (reqwest::Method::GET, vec![accept, ("range", "bytes=0-99")]),
                (reqwest::Method::GET, vec![accept, ("if-none-match", "\"x\"")]),
            ] {
                let seen = send(method.clone(), &url, &headers, false).await;
                assert!(
                    seen.status >= 400,
                    "{when}: anonymous {method} {url} {headers:?} answered {} (a private object through a public route)",
                    seen.status
                );
                assert!(!contains(&seen.body, &secret[..secret.len().min(64)]), "{when}: private bytes in {url}");
                assert!(seen.body.len() < 4096, "{when}: {url} sent {} bytes", seen.body.len());
            }
        }
    }
}

async fn two_upstream_tender(private: &FakeUpstream, public: &FakeUpstream, bucket: Option<Arc<Bucket>>) -> Tender {
    // The first upstream is the default: the public one.
    let ups = vec![upstream_settings("public.example", &public.url()), private_settings(&private.url())];
    Tender::start_replica(ups, None, fast_settings(), auth_security(), None, Surface::All, bucket).await
}

async fn authorised_pull(t: &Tender, p: &Private) {
    let m =
        send(reqwest::Method::GET, &t.url("/v2/private.example/team/app/manifests/v1"), &[("accept", MT)], true).await;
    assert_eq!(m.status, 200);
    assert_eq!(m.body, p.manifest);
    let l = send(
        reqwest::Method::GET,
        &t.url(&format!("/v2/team/app/blobs/{}?ns=private.example", p.layer_digest)),
        &[],
        true,
    )
    .await;
    assert_eq!(l.status, 200);
    assert_eq!(sha(&l.body), p.layer_digest);
    t.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_never_serve_a_private_upstreams_objects_through_a_public_route() {
    let (private, public) = (FakeUpstream::start().await, FakeUpstream::start().await);
    let p = private_content(&private, 31);
    let t = two_upstream_tender(&private, &public, None).await;
    authorised_pull(&t, &p).await;
    assert_refused_everywhere(&t, &p, "stored").await;

    // While a private fill is in progress (the upstream drips for about 2 s).
    let slow = random_bytes(1 << 20, 32);
    let slow_digest = private.add_blob(slow.clone());
    private.set_faults(vec![Fault::SlowDrip(512 * 1024)]);
    let url = t.url(&format!("/v2/private.example/team/app/blobs/{slow_digest}"));
    let filling = tokio::spawn(async move { send(reqwest::Method::GET, &url, &[], true).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while private.state.bytes_sent.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the private fill never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let during = Private { layer: slow.clone(), layer_digest: slow_digest.clone(), ..private_content(&private, 31) };
    assert_refused_everywhere(&t, &during, "filling").await;
    let got = filling.await.unwrap();
    assert_eq!(sha(&got.body), slow_digest, "the authorised client got the whole blob");
    assert_eq!(public.blob_gets(), 0, "the public upstream was only asked with HEAD");

    // Public to public: an object known in one public upstream costs one HEAD the first time it
    // is asked through another that has it too.
    let shared = random_bytes(4096, 33);
    let d = public.add_blob(shared.clone());
    let other = FakeUpstream::start().await;
    other.add_blob(shared.clone());
    let ups =
        vec![upstream_settings("public.example", &public.url()), upstream_settings("other.example", &other.url())];
    let t2 = Tender::start_full(ups, None, fast_settings(), Security::default(), None, Surface::All).await;
    assert_eq!(sha(&get(&t2.url(&format!("/v2/public.example/x/blobs/{d}")), &[]).await.body.unwrap()), d);
    t2.wait_idle().await;
    for _ in 0..2 {
        assert_eq!(sha(&get(&t2.url(&format!("/v2/other.example/x/blobs/{d}")), &[]).await.body.unwrap()), d);
    }
    assert_eq!((other.state.blob_heads.load(Ordering::SeqCst), other.blob_gets()), (1, 0), "one HEAD, then known");
}

fn bucket(mem: &Arc<InMemory>, replica: &str) -> Arc<Bucket> {
    let mut s = BucketSettings::new("fleet");
    s.chunk_size = 256 * 1024;
    s.replica = replica.into();
    Bucket::with_store(mem.clone(), s, BucketMetrics::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_never_serve_a_private_upstreams_objects_through_a_public_route_of_another_replica() {
    let (private, public) = (FakeUpstream::start().await, FakeUpstream::start().await);
    let p = private_content(&private, 34);
    let mem = Arc::new(InMemory::new());
    let a = two_upstream_tender(&private, &public, Some(bucket(&mem, "a"))).await;
    let b = two_upstream_tender(&private, &public, Some(bucket(&mem, "b"))).await;
    authorised_pull(&a, &p).await;
    let probe = bucket(&mem, "probe");
    let deadline = Instant::now() + Duration::from_secs(30);
    for d in [&p.layer_digest, &p.manifest_digest] {
        let d: tender_oci::Digest = d.parse().unwrap();
        while probe.index(&d).await.unwrap().is_none() {
            assert!(Instant::now() < deadline, "{d} never reached the bucket");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_refused_everywhere(&b, &p, "other replica").await;
    assert_refused_everywhere(&a, &p, "same replica").await;
    // The bucket's record travels: the other replica serves an authorised client from the
    // bucket without asking the private upstream again.
    let gets = private.blob_gets();
    let l = send(
        reqwest::Method::GET,
        &b.url(&format!("/v2/private.example/team/app/blobs/{}", p.layer_digest)),
        &[],
        true,
    )
    .await;
    assert_eq!((l.status, sha(&l.body)), (200, p.layer_digest.clone()));
    assert_eq!(private.blob_gets(), gets, "served from the bucket, known in private.example there");
}

/// A data directory as tender format 1 left it: one object the upstream has, one it does not.
fn format1_dir(objects: &[&[u8]]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("tender-data.json"), r#"{"format":1,"createdBy":"tender 0.1.0"}"#).unwrap();
    for d in ["objects/sha256", "meta/sha256", "tags", "spool", "quarantine"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for o in objects {
        let hex = sha(o)[7..].to_string();
        std::fs::create_dir_all(root.join("objects/sha256").join(&hex[..2])).unwrap();
        std::fs::write(root.join("objects/sha256").join(&hex[..2]).join(&hex), o).unwrap();
    }
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_migrate_a_format_1_store_whose_objects_are_known_in_no_upstream() {
    let fake = FakeUpstream::start().await;
    let (there, gone) = (random_bytes(10_000, 35), random_bytes(10_000, 36));
    let there_digest = fake.add_blob(there.clone());
    let gone_digest = sha(&gone);
    let dir = format1_dir(&[&there, &gone]);
    let root = dir.path().to_path_buf();
    let ups = vec![upstream_settings("ghcr.io", &fake.url())];
    let t = Tender::start_in(dir, ups, None, fast_settings(), Security::default(), None, Surface::All, None).await;
    for _ in 0..2 {
        let got = get(&t.url(&format!("/v2/ghcr.io/x/blobs/{there_digest}")), &[]).await;
        assert_eq!((got.status, sha(&got.body.unwrap())), (200, there_digest.clone()));
    }
    let heads = fake.state.blob_heads.load(Ordering::SeqCst);
    assert_eq!((heads, fake.blob_gets()), (1, 0), "an old object is served after one HEAD, then known");
    let got = get(&t.url(&format!("/v2/ghcr.io/x/blobs/{gone_digest}")), &[]).await;
    assert_eq!(got.status, 404, "an old object the upstream does not have is not served");
    assert!(!contains(&got.body.unwrap(), &gone[..64]));
    let format: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("tender-data.json")).unwrap()).unwrap();
    assert_eq!(format["format"], 2, "{format}");
}

/// A public upstream that never finishes a blob (it stalls after 1000 bytes) or sends wrong
/// bytes, and a good one with the same blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_not_let_a_hostile_upstreams_fill_block_or_fail_another_upstreams_client() {
    for fault in [Fault::StallAt(1000), Fault::WrongByteAt(500)] {
        let (evil, good) = (FakeUpstream::start().await, FakeUpstream::start().await);
        let blob = random_bytes(256 * 1024, 37);
        let d = evil.add_blob(blob.clone());
        good.add_blob(blob.clone());
        *evil.state.steady.lock().unwrap() = Some(fault.clone());
        let ups = vec![upstream_settings("evil.example", &evil.url()), upstream_settings("good.example", &good.url())];
        let t = Tender::start(ups, fast_settings()).await;
        let url = t.url(&format!("/v2/evil.example/x/blobs/{d}"));
        let victim = tokio::spawn(async move { get(&url, &[]).await });
        let deadline = Instant::now() + Duration::from_secs(10);
        while evil.blob_gets() == 0 {
            assert!(Instant::now() < deadline, "the hostile fill never started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let started = Instant::now();
        let got = get(&t.url(&format!("/v2/good.example/x/blobs/{d}")), &[]).await;
        assert_eq!((got.status, sha(&got.body.unwrap())), (200, d.clone()), "{fault:?}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{fault:?}: the good client waited {:?}",
            started.elapsed()
        );
        victim.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_keep_fill_slots_per_upstream_and_cancel_abandoned_fills() {
    let (evil, good) = (FakeUpstream::start().await, FakeUpstream::start().await);
    *evil.state.steady.lock().unwrap() = Some(Fault::StallAt(100));
    let evil_blobs: Vec<String> = (0..3).map(|i| evil.add_blob(random_bytes(64 * 1024, 40 + i))).collect();
    let blob = random_bytes(64 * 1024, 39);
    let d = good.add_blob(blob.clone());
    let settings = FetchSettings {
        max_concurrent_fills: Some(3),
        max_fills_per_upstream: Some(2),
        abandoned_fill_grace: Duration::from_millis(300),
        stall_timeout: Duration::from_secs(30),
        ..fast_settings()
    };
    let ups = vec![upstream_settings("evil.example", &evil.url()), upstream_settings("good.example", &good.url())];
    let t = Tender::start(ups, settings).await;
    // Three clients of the hostile upstream: at most two of its fills run, the third waits for
    // one of its own upstream's slots, not for a global one.
    let mut victims = Vec::new();
    for e in &evil_blobs {
        let url = t.url(&format!("/v2/evil.example/x/blobs/{e}"));
        victims.push(tokio::spawn(async move { get(&url, &[]).await }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while evil.blob_gets() < 2 {
        assert!(Instant::now() < deadline, "the hostile fills never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = Instant::now();
    let got = get(&t.url(&format!("/v2/good.example/x/blobs/{d}")), &[]).await;
    assert_eq!((got.status, sha(&got.body.unwrap())), (200, d.clone()));
    assert!(started.elapsed() < Duration::from_secs(2), "the good client waited {:?}", started.elapsed());
    assert_eq!(evil.blob_gets(), 2, "the hostile upstream holds at most its own two slots");
    // Its clients give up: nobody waits for those fills any more, so they end after the grace
    // period (not after the 30 s stall timeout and the retries).
    for v in victims {
        v.abort();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !t.app.mirror().flights().active_keys().is_empty() {
        assert!(Instant::now() < deadline, "abandoned fills were never cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An Image Factory stand-in whose asset bytes the test changes.
#[derive(Default)]
struct Factory {
    body: Mutex<bytes::Bytes>,
    /// Bytes per second for the next GETs (0: all at once).
    rate: AtomicU64,
}

async fn factory_asset(State(f): State<Arc<Factory>>) -> axum::response::Response {
    let body = f.body.lock().unwrap().clone();
    let rate = f.rate.load(Ordering::SeqCst);
    if rate == 0 {
        return body.into_response();
    }
    let len = body.len();
    let chunks = futures::stream::unfold(0usize, move |pos| {
        let body = body.clone();
        async move {
            if pos >= body.len() {
                return None;
            }
            let n = (16 * 1024).min(body.len() - pos);
            tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
            Some((Ok::<_, std::io::Error>(body.slice(pos..pos + n)), pos + n))
        }
    });
    axum::response::Response::builder()
        .header("content-length", len)
        .body(axum::body::Body::from_stream(chunks))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_not_serve_a_byte_of_a_refill_before_it_matched_the_trust_record() {
    let f = Arc::new(Factory::default());
    let first = random_bytes(512 * 1024, 50);
    *f.body.lock().unwrap() = first.clone();
    let app = axum::Router::new().fallback(factory_asset).with_state(f.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let factory = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let fake = FakeUpstream::start().await;
    let t = Tender::start_with_factory(vec![upstream_settings("ghcr.io", &fake.url())], Some(factory), fast_settings())
        .await;
    let path = t.url(&format!("/image/{}/v1.11.5/metal-amd64.raw", "a".repeat(64)));
    assert_eq!(sha(&get(&path, &[]).await.body.unwrap()), sha(&first));
    t.wait_idle().await;
    // Evicted; the factory now builds other bytes of the same length, slowly.
    t.store.remove_object(&sha(&first).parse().unwrap()).unwrap();
    let rebuilt = random_bytes(512 * 1024, 51);
    *f.body.lock().unwrap() = rebuilt.clone();
    f.rate.store(1024 * 1024, Ordering::SeqCst);
    for headers in [vec![("range", "bytes=0-99")], vec![("range", "bytes=1000-")], vec![]] {
        let seen = send(reqwest::Method::GET, &path, &headers, false).await;
        assert!(
            !contains(&seen.body, &rebuilt[..64]) && !contains(&seen.body, &rebuilt[1000..1064]),
            "{headers:?}: {} with {} bytes of a refill that does not match the trust record",
            seen.status,
            seen.body.len()
        );
        t.wait_idle().await;
    }
    // The factory sends the trusted bytes again: a range waits for the verdict and gets them.
    *f.body.lock().unwrap() = first.clone();
    let seen = send(reqwest::Method::GET, &path, &[("range", "bytes=0-99")], false).await;
    assert_eq!((seen.status, &seen.body[..]), (206, &first[..100]));
}
