//! Replicas sharing one bucket (`storage.s3`), in process: the object_store in-memory bucket
//! stands in for S3 (the e2e test `t10_s3` uses a real S3 server). Fetch once across replicas
//! with the fill lease, ranges straight from the bucket, corrupt bucket content never served.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::IntoResponse;
use object_store::memory::InMemory;
use object_store::{ObjectStore, PutPayload};
use support::*;
use tender_bucket::{Bucket, BucketMetrics, BucketSettings};
use tender_server::{Security, Surface};

fn bucket(mem: &Arc<InMemory>, replica: &str) -> Arc<Bucket> {
    bucket_with_ttl(mem, replica, BucketSettings::new("fleet").lease_ttl)
}

/// [`bucket`] with its own fill lease TTL.
fn bucket_with_ttl(mem: &Arc<InMemory>, replica: &str, ttl: Duration) -> Arc<Bucket> {
    let mut s = settings(replica);
    s.lease_ttl = ttl;
    Bucket::with_store(mem.clone(), s, BucketMetrics::default())
}

/// A replica's bucket settings: chunks of 1 MiB.
fn settings(replica: &str) -> BucketSettings {
    let mut s = BucketSettings::new("fleet");
    s.chunk_size = 1 << 20;
    s.replica = replica.into();
    s
}

async fn replica(fake: &FakeUpstream, factory: Option<String>, b: Arc<Bucket>) -> Tender {
    let ups = vec![upstream_settings("ghcr.io", &fake.url())];
    Tender::start_replica(ups, factory, fast_settings(), Security::default(), None, Surface::All, Some(b)).await
}

/// Until the bucket indexes `digest` (the upload follows the commit).
async fn uploaded(b: &Bucket, digest: &str) {
    let d: tender_oci::Digest = digest.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.index(&d).await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "{digest} never reached the bucket");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_fetch_once_across_replicas_and_serve_ranges_from_the_bucket() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(5 << 20, 11);
    let digest = fake.add_blob(body.clone());
    let mem = Arc::new(InMemory::new());
    let (ba, bb) = (bucket(&mem, "a"), bucket(&mem, "b"));
    let a = replica(&fake, None, ba.clone()).await;
    let b = replica(&fake, None, bb.clone()).await;
    let path = format!("/v2/ghcr.io/x/blobs/{digest}");
    let mut clients = Vec::new();
    for i in 0..8 {
        let url = if i % 2 == 0 { a.url(&path) } else { b.url(&path) };
        clients.push(tokio::spawn(async move { get(&url, &[]).await }));
    }
    for c in clients {
        let got = c.await.unwrap();
        assert_eq!(got.status, 200);
        assert_eq!(sha(&got.body.unwrap()), sha(&body), "every client gets the blob");
    }
    assert_eq!(fake.blob_gets(), 1, "one upstream fetch for both replicas (the lease)");
    let won = |b: &Bucket, o: &str| b.metrics().leases.get_or_create(&vec![("outcome".into(), o.into())]).get();
    assert_eq!(won(&ba, "won") + won(&bb, "won"), 1, "exactly one replica won the lease");
    uploaded(&ba, &digest).await;

    // A third replica serves a range and a HEAD from the bucket without a local copy.
    let c = replica(&fake, None, bucket(&mem, "c")).await;
    let got = get(&c.url(&path), &[("range", "bytes=1048000-3000000")]).await;
    assert_eq!(got.status, 206);
    assert_eq!(sha(&got.body.unwrap()), sha(&body.slice(1048000..3000001)));
    let head = client().head(c.url(&path)).send().await.unwrap();
    assert_eq!(head.headers()["content-length"].to_str().unwrap(), body.len().to_string());
    let d: tender_oci::Digest = digest.parse().unwrap();
    assert!(c.store.object_len(&d).is_none(), "a range does not download the whole object");
    // A full GET fills its local cache from the bucket, not from upstream.
    assert_eq!(sha(&get(&c.url(&path), &[]).await.body.unwrap()), sha(&body));
    c.wait_idle().await;
    assert_eq!(c.store.object_len(&d), Some(body.len() as u64));
    assert_eq!(fake.blob_gets(), 1);
}

/// A blob of `len` bytes fetched by a replica "a" and uploaded to a fresh bucket: the upstream,
/// the bucket, that replica, the bytes, their digest and the blob's path.
async fn in_bucket(len: usize, seed: u64) -> (FakeUpstream, Arc<InMemory>, Tender, bytes::Bytes, String, String) {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(len, seed);
    let digest = fake.add_blob(body.clone());
    let mem = Arc::new(InMemory::new());
    let a = replica(&fake, None, bucket(&mem, "a")).await;
    let path = format!("/v2/ghcr.io/x/blobs/{digest}");
    assert_eq!(sha(&get(&a.url(&path), &[]).await.body.unwrap()), sha(&body));
    uploaded(&bucket(&mem, "probe"), &digest).await;
    (fake, mem, a, body, digest, path)
}

/// Chunk `i` of the object the bucket indexes as `digest`, as its chunk object holds it.
async fn chunk_object(mem: &Arc<InMemory>, digest: &str) -> impl Fn(usize) -> object_store::path::Path {
    let d: tender_oci::Digest = digest.parse().unwrap();
    let index = bucket(mem, "probe").index(&d).await.unwrap().expect("indexed");
    let upload = index.upload.clone().expect("written as chunk objects");
    move |i| object_store::path::Path::from(format!("parts/{upload}/{i:08}"))
}

/// Bit rot in the bucket: the byte at `at` of the object flipped in its chunk object.
async fn rot(mem: &Arc<InMemory>, digest: &str, body: &[u8], at: usize) {
    let (i, cs) = (at >> 20, 1usize << 20);
    let mut bad = body[i * cs..((i + 1) * cs).min(body.len())].to_vec();
    bad[at - i * cs] ^= 0x40;
    let path = chunk_object(mem, digest).await(i);
    mem.put(&path, PutPayload::from(bad)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_never_serve_corrupt_bucket_content() {
    let (fake, mem, _a, body, digest, path) = in_bucket(3 << 20, 12).await;
    // Bit rot in the bucket: one byte of the second chunk.
    rot(&mem, &digest, &body, (1 << 20) + 77).await;

    // A range over the bad chunk: never its bytes (the rest comes from the upstream; see
    // should_continue_from_upstream_at_a_corrupt_chunk_and_heal_the_bucket).
    let c = replica(&fake, None, bucket(&mem, "c")).await;
    let got = get(&c.url(&path), &[("range", "bytes=0-2097151")]).await;
    assert_eq!(got.status, 206);
    if let Ok(b) = &got.body {
        assert_eq!(sha(b), sha(&body.slice(0..2097152)), "no wrong byte in a range");
    }
    // A full GET: the copy from the bucket fails verification and the fill starts over from
    // the upstream. The first client gets an error (502, or a body cut short) or the right bytes, never wrong ones.
    let first = get(&c.url(&path), &[]).await;
    if let (200, Ok(b)) = (first.status, &first.body) {
        assert_eq!(sha(b), sha(&body), "no complete wrong body");
    }
    c.wait_idle().await;
    let again = get(&c.url(&path), &[]).await;
    assert_eq!(sha(&again.body.unwrap()), sha(&body), "after the fall back to upstream, the right bytes");
    assert_eq!(fake.blob_gets(), 2, "the corrupt bucket copy cost one more upstream fetch");
    // The replica put its verified copy over the rotten one: the bucket heals by itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let report = bucket(&mem, "fsck").fsck(false).await.unwrap();
        if report.is_clean() {
            assert_eq!(report.objects_checked, 1);
            break;
        }
        assert!(Instant::now() < deadline, "the bucket copy was never replaced: {report:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 19 (3, 4): a corrupt chunk in the bucket costs clients nothing but latency. A range
/// over it and the first full GET are byte-exact, never cut: the copy from the bucket stops at
/// the bad chunk and the same fill continues from the upstream at the byte it reached (a
/// `Range` request), then the replica puts its verified copy over the bad one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_continue_from_upstream_at_a_corrupt_chunk_and_heal_the_bucket() {
    let (fake, mem, _a, body, digest, path) = in_bucket(3 << 20, 14).await;
    let healed = || async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let report = bucket(&mem, "fsck").fsck(false).await.unwrap();
            if report.is_clean() {
                break;
            }
            assert!(Instant::now() < deadline, "the bucket copy was never replaced: {report:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let continued_at = |from: u64| fake.state.ranges.lock().unwrap().iter().any(|r| r == &format!("bytes={from}-"));

    // A range over the second chunk (of three, 1 MiB each), bad.
    rot(&mem, &digest, &body, (1 << 20) + 77).await;
    let c = replica(&fake, None, bucket(&mem, "c")).await;
    let got = get(&c.url(&path), &[("range", "bytes=1000-2097151")]).await;
    assert_eq!(got.status, 206);
    let got = got.body.expect("a range over a corrupt chunk is not cut");
    assert_eq!(sha(&got), sha(&body.slice(1000..2097152)), "byte-exact");
    c.wait_idle().await;
    assert!(continued_at(1 << 20), "continued from the upstream at the bad chunk: {:?}", fake.state.ranges);
    assert_eq!(fake.blob_gets(), 2);
    healed().await;

    // The first full GET of another replica over a bad third chunk: byte-exact, not restarted.
    rot(&mem, &digest, &body, (2 << 20) + 5).await;
    let d = replica(&fake, None, bucket(&mem, "d")).await;
    let got = get(&d.url(&path), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(&got.body.expect("the first full GET is not cut")), sha(&body), "byte-exact");
    d.wait_idle().await;
    assert!(continued_at(2 << 20), "continued from the upstream at the bad chunk: {:?}", fake.state.ranges);
    assert_eq!(fake.blob_gets(), 3, "one upstream request for the rest, no restart from zero");
    healed().await;
}

#[derive(Default)]
struct Factory {
    gets: AtomicU64,
}

async fn factory_asset(State(f): State<Arc<Factory>>) -> axum::response::Response {
    f.gets.fetch_add(1, Ordering::SeqCst);
    random_bytes(3 << 20, 13).into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_share_an_image_factory_asset_and_its_trust_record() {
    let f = Arc::new(Factory::default());
    let app = axum::Router::new().fallback(factory_asset).with_state(f.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let factory = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let fake = FakeUpstream::start().await;
    let mem = Arc::new(InMemory::new());
    let a = replica(&fake, Some(factory.clone()), bucket(&mem, "a")).await;
    let b = replica(&fake, Some(factory), bucket(&mem, "b")).await;
    let path = format!("/image/{}/v1.11.5/metal-amd64.raw", "a".repeat(64));
    let want = random_bytes(3 << 20, 13);
    assert_eq!(sha(&get(&a.url(&path), &[]).await.body.unwrap()), sha(&want));
    a.wait_idle().await;
    // b finds it by key through the shared trust record: a range, then the whole.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = get(&b.url(&path), &[("range", "bytes=10-19")]).await;
        if got.status == 206 && f.gets.load(Ordering::SeqCst) == 1 {
            let etag = client().head(b.url(&path)).send().await.unwrap();
            assert!(etag.headers().contains_key("etag"));
            assert_eq!(sha(&got.body.unwrap()), sha(&want.slice(10..20)));
            break;
        }
        assert!(Instant::now() < deadline, "the asset never reached the bucket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sha(&get(&b.url(&path), &[]).await.body.unwrap()), sha(&want));
    b.wait_idle().await;
    assert_eq!(f.gets.load(Ordering::SeqCst), 1, "one factory download for both replicas");
    let key = format!("image:{}/v1.11.5/metal-amd64.raw", "a".repeat(64));
    assert_eq!(b.store.trust_get(&key).unwrap().unwrap(), a.store.trust_get(&key).unwrap().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_fill_from_upstream_when_the_bucket_is_unreachable() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(1 << 20, 14);
    let digest = fake.add_blob(body.clone());
    // Nothing listens there: every bucket request fails to connect.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut s = BucketSettings::new("fleet");
    s.endpoint = Some(format!("http://{}", closed.local_addr().unwrap()));
    drop(closed);
    s.credentials = Some(tender_bucket::Credentials {
        access_key_id: "k".into(),
        secret_access_key: "s".into(),
        session_token: None,
    });
    let b = Bucket::new(s, BucketMetrics::default()).unwrap();
    let t = replica(&fake, None, b.clone()).await;
    let got = get(&t.url(&format!("/v2/ghcr.io/x/blobs/{digest}")), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(&got.body.unwrap()), sha(&body), "served from upstream while the bucket is down");
    assert_eq!(fake.blob_gets(), 1);
    assert!(b.metrics().errors.get_or_create(&vec![("op".into(), "get".into())]).get() >= 1);
}

const SHARED_MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const SHARED_MANIFEST: &[u8] = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}"#;

/// Replicas `a` and `b` on one in-memory bucket in front of `fake`, and the path of `digest`
/// as a manifest by digest.
async fn two_replicas(fake: &FakeUpstream, mem: &Arc<InMemory>, digest: &str) -> (Tender, Tender, String) {
    let a = replica(fake, None, bucket(mem, "a")).await;
    let b = replica(fake, None, bucket(mem, "b")).await;
    (a, b, format!("/v2/ghcr.io/x/manifests/{digest}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_share_manifests_by_digest() {
    let fake = FakeUpstream::start().await;
    let (mt, body) = (SHARED_MANIFEST_TYPE, SHARED_MANIFEST);
    let digest = fake.add_manifest("x", "v1", mt, body);
    let mem = Arc::new(InMemory::new());
    let (a, b, path) = two_replicas(&fake, &mem, &digest).await;
    let accept = [("accept", mt)];
    let got = get(&a.url(&path), &accept).await;
    assert_eq!(got.status, 200);
    uploaded(&bucket(&mem, "probe"), &digest).await;
    let before = fake.requests();
    let got = client().get(b.url(&path)).header("accept", mt).send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.headers()["content-type"], mt, "the media type travels with the index");
    assert_eq!(got.headers()["docker-content-digest"].to_str().unwrap(), digest);
    assert_eq!(got.bytes().await.unwrap().as_ref(), body);
    assert_eq!(fake.requests(), before, "the second replica did not ask the upstream");
}

/// Issue 19 (8): two replicas asked for one manifest by digest at once cost one upstream GET:
/// the manifest takes the fill lease a blob takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_fetch_a_manifest_by_digest_once_across_replicas() {
    let fake = FakeUpstream::start().await;
    let (mt, body) = (SHARED_MANIFEST_TYPE, SHARED_MANIFEST);
    let digest = fake.add_manifest("x", "v1", mt, body);
    *fake.state.manifest_delay.lock().unwrap() = Some(Duration::from_millis(300));
    let mem = Arc::new(InMemory::new());
    let (a, b, path) = two_replicas(&fake, &mem, &digest).await;
    let mut clients = Vec::new();
    for i in 0..6 {
        let url = if i % 2 == 0 { a.url(&path) } else { b.url(&path) };
        clients.push(tokio::spawn(async move {
            let r = client().get(url).header("accept", mt).send().await.unwrap();
            (r.status().as_u16(), r.bytes().await.unwrap())
        }));
    }
    for c in clients {
        let (status, got) = c.await.unwrap();
        assert_eq!((status, got.as_ref()), (200, body), "every client gets the manifest");
    }
    let gets = fake.state.manifest_gets.load(Ordering::SeqCst);
    assert_eq!(gets, 1, "two replicas fetched the same manifest {gets} times (one lease)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_continue_from_upstream_when_the_bucket_copy_vanishes() {
    let (fake, mem, _a, body, digest, path) = in_bucket(3 << 20, 15).await;
    // c learns the index (a HEAD), then the content goes away (quarantined by fsck elsewhere).
    let c = replica(&fake, None, bucket(&mem, "c")).await;
    assert_eq!(client().head(c.url(&path)).send().await.unwrap().status(), 200);
    mem.delete(&chunk_object(&mem, &digest).await(0)).await.unwrap();
    let got = get(&c.url(&path), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(&got.body.unwrap()), sha(&body), "the fill went on from the upstream");
    assert_eq!(fake.blob_gets(), 2);
}

/// A sha512 blob and manifest filled by one replica are published to the bucket's `sha512/`
/// trees and served by another replica from there, verified with sha512, without the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_share_sha512_objects_across_replicas() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(3 << 20, 17);
    let digest = fake.add_blob_sha512(body.clone());
    let manifest = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#;
    let md = fake.add_manifest_sha512("x", "application/vnd.oci.image.manifest.v1+json", manifest);
    let mem = Arc::new(InMemory::new());
    let ba = bucket(&mem, "a");
    let a = replica(&fake, None, ba.clone()).await;
    let (path, mpath) = (format!("/v2/ghcr.io/x/blobs/{digest}"), format!("/v2/ghcr.io/x/manifests/{md}"));
    assert!(get(&a.url(&path), &[]).await.body.unwrap() == body);
    assert_eq!(get(&a.url(&mpath), &[]).await.body.unwrap().as_ref(), manifest);
    uploaded(&ba, &digest).await;
    uploaded(&ba, &md).await;
    assert!(mem.head(&chunk_object(&mem, &digest).await(2)).await.is_ok());
    let hex = digest.strip_prefix("sha512:").unwrap();
    assert!(mem.head(&format!("index/sha512/{hex}.json").into()).await.is_ok());

    let b = replica(&fake, None, bucket(&mem, "b")).await;
    let got = get(&b.url(&path), &[("range", "bytes=1048000-2000000")]).await;
    assert_eq!(got.status, 206);
    assert!(got.body.unwrap() == body.slice(1048000..2000001));
    assert!(get(&b.url(&path), &[]).await.body.unwrap() == body);
    let resp = client().get(b.url(&mpath)).send().await.unwrap();
    assert_eq!(resp.headers()["docker-content-digest"], md.as_str());
    assert_eq!(resp.bytes().await.unwrap().as_ref(), manifest);
    b.wait_idle().await;
    assert_eq!((fake.blob_gets(), fake.state.manifest_gets.load(Ordering::SeqCst)), (1, 1), "the upstream once");
    let report = b.store.fsck(false).unwrap();
    assert_eq!((report.checked, report.corrupt.len()), (2, 0), "{report:?}");
}

/// Issue 19 (9): a replica waiting on another's fill lease streams the object from the chunk
/// objects the holder writes as they land, not after the whole upload: its client's first
/// bytes arrive while the object has no index yet, and it never asks the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_stream_chunks_to_a_waiting_replica_as_they_land() {
    // About 3 s for the whole blob; a chunk (1 MiB) lands every second.
    let Dripping { fake, probe, _a, b, body, digest, path, key, holder } =
        dripping_fill(3 << 20, 91, 1 << 20, |p| !p.chunks.is_empty()).await;
    let d: tender_oci::Digest = digest.parse().unwrap();
    let mut waiter = client().get(b.url(&path)).send().await.unwrap();
    assert_eq!(waiter.status(), 200);
    let mut got = Vec::new();
    while got.len() < 1 << 20 {
        got.extend_from_slice(&waiter.chunk().await.unwrap().expect("body ended early"));
    }
    assert!(
        probe.index(&d).await.unwrap().is_none(),
        "the waiting replica's client got its first MiB before the object was complete in the bucket"
    );
    while let Some(c) = waiter.chunk().await.unwrap() {
        got.extend_from_slice(&c);
    }
    assert_eq!(got, body, "byte-exact through the chunks in progress");
    assert_eq!(holder.await.unwrap(), body);
    uploaded(&probe, &digest).await;
    assert_eq!(fake.blob_gets(), 1, "one upstream transfer for both replicas");
    assert!(probe.progress(&key).await.unwrap().is_none(), "the progress record goes once the index is there");
    let index = probe.index(&d).await.unwrap().unwrap();
    assert_eq!(index.format, 3, "the chunks as links of the object's sha256");
    assert_eq!(read_all(&probe, d, &index).await, body);
}

/// Issue 19 (9): a waiting replica's client gets the object's first bytes from the holder's
/// progress record, before the first chunk is in the bucket (not a whole chunk later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_give_a_waiting_replica_the_first_bytes_before_the_first_chunk_lands() {
    // About 2 s until the holder has its first chunk (1 MiB).
    let Dripping { fake, probe, _a, b, body, digest: _, path, key, holder } =
        dripping_fill((1 << 20) + 4321, 93, 512 << 10, |_| true).await;
    let mut waiter = client().get(b.url(&path)).send().await.unwrap();
    assert_eq!(waiter.status(), 200);
    let mut got = waiter.chunk().await.unwrap().expect("body ended at once").to_vec();
    let p = probe.progress(&key).await.unwrap().expect("the upload is still under way");
    assert!(p.chunks.is_empty(), "the waiter's client got its first bytes only after the first chunk landed");
    while let Some(c) = waiter.chunk().await.unwrap() {
        got.extend_from_slice(&c);
    }
    assert_eq!(sha(&got), sha(&body), "byte-exact: the head, then the rest of the first chunk");
    assert_eq!(holder.await.unwrap(), body);
    assert_eq!(fake.blob_gets(), 1, "one upstream transfer for both replicas");
}

/// Two replicas on one bucket (chunks of 1 MiB) in front of an upstream that drips `len`
/// random bytes at `rate` bytes/s, once replica `a`'s client started the fill and the holder's
/// progress record satisfies `ready`.
struct Dripping {
    fake: FakeUpstream,
    probe: Arc<Bucket>,
    _a: Tender,
    b: Tender,
    body: bytes::Bytes,
    digest: String,
    path: String,
    key: String,
    holder: tokio::task::JoinHandle<bytes::Bytes>,
}

async fn dripping_fill(len: usize, seed: u64, rate: u64, ready: impl Fn(&tender_bucket::Progress) -> bool) -> Dripping {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(len, seed);
    let digest = fake.add_blob(body.clone());
    *fake.state.steady.lock().unwrap() = Some(Fault::SlowDrip(rate));
    let mem = Arc::new(InMemory::new());
    let probe = bucket(&mem, "probe");
    let (a, b, _) = two_replicas(&fake, &mem, &digest).await;
    let path = format!("/v2/ghcr.io/x/blobs/{digest}");
    let holder = tokio::spawn(get_owned(a.url(&path)));
    let key = format!("ghcr.io@{digest}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !probe.progress(&key).await.unwrap().is_some_and(|p| ready(&p)) {
        assert!(Instant::now() < deadline, "the holder's progress record never got ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Dripping { fake, probe, _a: a, b, body, digest, path, key, holder }
}

async fn get_owned(url: String) -> bytes::Bytes {
    let r = client().get(url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap()
}

async fn read_all(b: &Arc<Bucket>, d: tender_oci::Digest, index: &Arc<tender_bucket::ChunkIndex>) -> Vec<u8> {
    use futures::StreamExt;
    let mut s = b.read(d, index.clone(), 0, index.size);
    let mut out = Vec::new();
    while let Some(c) = s.next().await {
        out.extend_from_slice(&c.unwrap());
    }
    out
}

/// A replica `name` (lease term `ttl`) that holds the fill lease of `digest` (upstream
/// `ghcr.io`) and wrote the first `chunks` MiB of `body` as its upload's chunks, listed.
async fn holding_upload(
    mem: &Arc<InMemory>,
    name: &str,
    ttl: Duration,
    digest: &str,
    body: &bytes::Bytes,
    chunks: usize,
) -> (tender_bucket::Lease, tender_bucket::PartUpload) {
    let d: tender_oci::Digest = digest.parse().unwrap();
    let holder = bucket_with_ttl(mem, name, ttl);
    let key = format!("ghcr.io@{digest}");
    let lease = match holder.lease(&key).await.unwrap() {
        tender_bucket::LeaseOutcome::Won(l) => l,
        o => panic!("{o:?}"),
    };
    let mut up = holder.begin_parts(Some(&key), Some(d), Some(body.len() as u64));
    for i in 0..chunks {
        up.put_chunk(body.slice(i << 20..(i + 1) << 20)).await.unwrap();
    }
    up.flush().await.unwrap();
    (lease, up)
}

/// Issue 19 (9): the replica a waiter follows dies mid-fill (its upload stops, its lease runs
/// out): the waiter's fill continues from the upstream at the byte it reached, and its client
/// sees nothing but latency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_continue_from_upstream_when_the_followed_replica_dies() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes((2 << 20) + 333, 92);
    let digest = fake.add_blob(body.clone());
    let mem = Arc::new(InMemory::new());
    // The dead replica: it held the lease and wrote one chunk, then stopped.
    let (lease, up) = holding_upload(&mem, "ghost", Duration::from_secs(2), &digest, &body, 1).await;
    drop((up, lease));

    let b = replica(&fake, None, bucket_with_ttl(&mem, "b", Duration::from_millis(300))).await;
    let got = get(&b.url(&format!("/v2/ghcr.io/x/blobs/{digest}")), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(&got.body.expect("not cut")), sha(&body), "byte-exact");
    let ranges = fake.state.ranges.lock().unwrap().clone();
    assert_eq!(ranges, vec![format!("bytes={}-", 1 << 20)], "continued from the upstream at the byte reached");
    assert_eq!(fake.blob_gets(), 1);
}

/// Issue 19 (5): right after `fsck --bucket --repair` moved a corrupt object aside, a replica
/// that still remembers its index serves a range over it byte-exact: the bucket's answer
/// (gone) hands the range over to the upstream at the same byte, never a cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_serve_a_byte_exact_range_right_after_fsck_repair_with_the_old_index_cached() {
    let (fake, mem, _a, body, digest, path) = in_bucket(3 << 20, 16).await;
    let c = replica(&fake, None, bucket(&mem, "c")).await;
    // c learns the index (a HEAD answered from the bucket).
    assert_eq!(client().head(c.url(&path)).send().await.unwrap().status(), 200);
    rot(&mem, &digest, &body, (1 << 20) + 9).await;
    let repaired = bucket(&mem, "fsck").fsck(true).await.unwrap();
    assert_eq!(repaired.quarantined, 1, "{repaired:?}");
    for range in ["bytes=0-2097151", "bytes=1048576-1049000", "bytes=3000000-"] {
        let got = get(&c.url(&path), &[("range", range)]).await;
        assert_eq!(got.status, 206, "{range}");
        let (from, to) = match range.trim_start_matches("bytes=").split_once('-').unwrap() {
            (f, "") => (f.parse::<usize>().unwrap(), body.len()),
            (f, t) => (f.parse::<usize>().unwrap(), t.parse::<usize>().unwrap() + 1),
        };
        assert_eq!(sha(&got.body.expect("not cut")), sha(&body.slice(from..to)), "{range} byte-exact");
        c.wait_idle().await;
    }
}

/// A chunk the followed upload lists but the bucket no longer holds (while its holder is alive
/// and keeps the lease): the waiter continues from the upstream at that byte at once, rather
/// than following the same upload round and round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_leave_a_followed_upload_that_lost_a_listed_chunk_for_the_upstream() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes((2 << 20) + 5, 93);
    let digest = fake.add_blob(body.clone());
    let mem = Arc::new(InMemory::new());
    let (lease, up) = holding_upload(&mem, "holder", Duration::from_secs(60), &digest, &body, 2).await;
    mem.delete(&object_store::path::Path::from(format!("parts/{}/00000001", up.upload_id()))).await.unwrap();

    let b = replica(&fake, None, bucket(&mem, "b")).await;
    let started = Instant::now();
    let got = get(&b.url(&format!("/v2/ghcr.io/x/blobs/{digest}")), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(&got.body.expect("not cut")), sha(&body), "byte-exact");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    let ranges = fake.state.ranges.lock().unwrap().clone();
    assert_eq!(ranges, vec![format!("bytes={}-", 1 << 20)], "continued from the upstream at the missing chunk");
    assert_eq!(fake.blob_gets(), 1);
    drop((up, lease));
}

/// Issue 36 (1): the holder still renews its lease but its upload stopped (one chunk listed,
/// the record no longer renewed): a waiter follows it only until `leaseTtl` passes without
/// news, then continues from the upstream at the byte it reached, never waiting for the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_leave_an_upload_that_shows_no_progress_for_a_lease_term_though_its_lease_lives() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes((2 << 20) + 7, 94);
    let digest = fake.add_blob(body.clone());
    let mem = Arc::new(InMemory::new());
    let (lease, up) = holding_upload(&mem, "holder", Duration::from_millis(600), &digest, &body, 1).await;
    // The upload dies (its record is not renewed any more); the lease is renewed on.
    drop(up);

    let b = replica(&fake, None, bucket_with_ttl(&mem, "b", Duration::from_millis(600))).await;
    let started = Instant::now();
    let got = get(&b.url(&format!("/v2/ghcr.io/x/blobs/{digest}")), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(&got.body.expect("not cut")), sha(&body), "byte-exact");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    let ranges = fake.state.ranges.lock().unwrap().clone();
    assert_eq!(ranges, vec![format!("bytes={}-", 1 << 20)], "continued from the upstream at the byte reached");
    assert_eq!(fake.blob_gets(), 1);
    assert!(lease.held(), "the holder's lease lived throughout");
    drop(lease);
}

const INDEX_KEY: &str = "0123456789abcdef0123456789abcdef";

/// [`bucket`] with the replicas' index key (`storage.s3.indexKeyFile`), or another, or none.
fn keyed(mem: &Arc<InMemory>, replica: &str, key: Option<&str>) -> Arc<Bucket> {
    let mut s = settings(replica);
    s.index_key = key.map(|k| tender_bucket::IndexKey::new(k.as_bytes()));
    Bucket::with_store(mem.clone(), s, BucketMetrics::default())
}

/// Issue 36 (one hash pass per byte): a replica that follows another's upload, and one that
/// copies the finished object, verify each chunk as a link of the object's chain (and
/// against the signed index, with the key) and do not hash the whole object again
/// (`tender_bucket_vouched_bytes`); without the key too, since the chain ends in the digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_hash_each_byte_once_when_following_or_copying_under_a_signed_index() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(3 << 20, 93);
    let digest = fake.add_blob(body.clone());
    *fake.state.steady.lock().unwrap() = Some(Fault::SlowDrip(2 << 20));
    let mem = Arc::new(InMemory::new());
    let (ba, bb) = (keyed(&mem, "a", Some(INDEX_KEY)), keyed(&mem, "b", Some(INDEX_KEY)));
    let a = replica(&fake, None, ba.clone()).await;
    let b = replica(&fake, None, bb.clone()).await;
    let path = format!("/v2/ghcr.io/x/blobs/{digest}");
    let holder = tokio::spawn(get_owned(a.url(&path)));
    let (probe, key) = (bucket(&mem, "probe"), format!("ghcr.io@{digest}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while probe.progress(&key).await.unwrap().is_none_or(|p| p.chunks.is_empty()) {
        assert!(Instant::now() < deadline, "the holder's upload never listed a chunk");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(get_owned(b.url(&path)).await, body, "the follower's client");
    assert_eq!(holder.await.unwrap(), body);
    a.wait_idle().await;
    b.wait_idle().await;
    assert_eq!(fake.blob_gets(), 1);
    assert_eq!(bb.metrics().vouched_bytes.get(), body.len() as u64, "the follower hashed each byte once");
    assert_eq!(ba.metrics().vouched_bytes.get(), 0, "the holder hashed what the upstream sent");
    let d: tender_oci::Digest = digest.parse().unwrap();
    assert!(keyed(&mem, "check", Some(INDEX_KEY)).index(&d).await.unwrap().unwrap().signed);

    *fake.state.steady.lock().unwrap() = None;
    let bc = keyed(&mem, "c", Some(INDEX_KEY));
    let c = replica(&fake, None, bc.clone()).await;
    assert_eq!(get_owned(c.url(&path)).await, body, "a copy from the bucket");
    c.wait_idle().await;
    assert_eq!(bc.metrics().vouched_bytes.get(), body.len() as u64, "the copy hashed each byte once");
    let plain = keyed(&mem, "d", None);
    let d_ = replica(&fake, None, plain.clone()).await;
    assert_eq!(get_owned(d_.url(&path)).await, body);
    d_.wait_idle().await;
    assert_eq!(plain.metrics().vouched_bytes.get(), body.len() as u64, "no key: the chain proves the digest");
    assert_eq!(fake.blob_gets(), 1, "every replica from the bucket");
}

/// Issue 36: a bucket writer without the replicas' index key writes chunk objects and an
/// index for a digest that describe other bytes (consistently: each chunk matches its hash,
/// or its link of the forged bytes' chain, the last entry naming the digest), unsigned or
/// signed with a key of its own. A replica with the key never serves them: a format-2 index
/// is not signed under its key, so the copy is hashed whole and found wrong; a chain does
/// not end in the digest. The object comes from the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_never_serve_a_forged_index_and_forged_chunks_with_the_index_key() {
    for (forger_key, chain) in [
        (None, false),
        (Some("a forger's own key of 32 bytes!!"), false),
        (None, true),
        (Some("a forger's own key of 32 bytes!!"), true),
    ] {
        let fake = FakeUpstream::start().await;
        let len = (2 << 20) + 5;
        let body = random_bytes(len, 94);
        let digest = fake.add_blob(body.clone());
        let d: tender_oci::Digest = digest.parse().unwrap();
        let mem = Arc::new(InMemory::new());
        let forger = keyed(&mem, "x", forger_key);
        let forged = random_bytes(len, 95);
        if chain {
            // The forged bytes' own chain, under their digest, then moved to `d` with its
            // last entry naming `d` (and signed for `d` with the forger's key).
            let fd = tender_oci::Digest::of(&forged);
            let mut u = forger.begin_parts(None, Some(fd), Some(len as u64));
            for piece in forged.chunks(1 << 20) {
                u.put_chunk(bytes::Bytes::copy_from_slice(piece)).await.unwrap();
            }
            let mut index = (*u.finish(&fd, len as u64, None).await.unwrap()).clone();
            assert_eq!(index.format, 3);
            *index.chunks.last_mut().unwrap() = d.hex();
            index.mac = forger_key.map(|k| index.sign(&tender_bucket::IndexKey::new(k.as_bytes()), &d));
            let p = object_store::path::Path::from(format!("index/sha256/{}.json", d.hex()));
            mem.put(&p, object_store::PutPayload::from(serde_json::to_vec(&index).unwrap())).await.unwrap();
        } else {
            let mut u = forger.begin_parts(None, Some(d), None);
            for piece in forged.chunks(1 << 20) {
                u.put_chunk(bytes::Bytes::copy_from_slice(piece)).await.unwrap();
            }
            assert_eq!(u.finish(&d, len as u64, None).await.unwrap().format, 2);
        }

        let bc = keyed(&mem, "c", Some(INDEX_KEY));
        let c = replica(&fake, None, bc.clone()).await;
        let path = format!("/v2/ghcr.io/x/blobs/{digest}");
        let first = get(&c.url(&path), &[]).await;
        if let (200, Ok(got)) = (first.status, &first.body) {
            assert_eq!(sha(got), sha(&body), "never the forged bytes ({forger_key:?})");
        }
        c.wait_idle().await;
        let again = get(&c.url(&path), &[]).await;
        assert_eq!(sha(&again.body.unwrap()), sha(&body), "from the upstream ({forger_key:?}, chain {chain})");
        assert_eq!(bc.metrics().vouched_bytes.get(), 0);
        assert_eq!(
            bc.metrics().unsigned_indexes.get(),
            u64::from(forger_key.is_some()),
            "a signature that does not hold"
        );
        assert!(fake.blob_gets() >= 1);
    }
}
