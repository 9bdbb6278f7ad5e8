//! The Image Factory endpoint against an in-process factory that, like the real one, serves
//! no ranges and answers slowly on a cold asset.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::future::join_all;
use support::*;

const S: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";

#[derive(Default)]
struct Factory {
    assets: Mutex<HashMap<String, Bytes>>,
    gets: AtomicU64,
    heads: AtomicU64,
    ranges_seen: AtomicU64,
    /// Close-delimited bodies with no Content-Length.
    no_length: Mutex<bool>,
    /// Stop after this many bytes (connection closed), for the next GETs.
    cut_at: Mutex<Option<usize>>,
    /// Delay before the response headers (building the asset).
    build_delay: Mutex<Duration>,
    /// Bytes per second.
    rate: Mutex<Option<u64>>,
}

async fn factory_handler(State(f): State<Arc<Factory>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    if req.headers().contains_key(header::RANGE) {
        f.ranges_seen.fetch_add(1, Ordering::SeqCst);
    }
    let Some(body) = f.assets.lock().unwrap().get(&path).cloned() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let delay = *f.build_delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    if req.method() == axum::http::Method::HEAD {
        f.heads.fetch_add(1, Ordering::SeqCst);
        return Response::builder().header(header::CONTENT_LENGTH, body.len()).body(Body::empty()).unwrap();
    }
    f.gets.fetch_add(1, Ordering::SeqCst);
    let cut = *f.cut_at.lock().unwrap();
    let rate = *f.rate.lock().unwrap();
    let full_len = body.len();
    let limit = cut.unwrap_or(full_len).min(full_len);
    let stream = futures::stream::unfold(0usize, move |pos| {
        let body = body.clone();
        async move {
            if pos >= limit {
                return if cut.is_some() { Some((Err(std::io::Error::other("cut")), usize::MAX)) } else { None };
            }
            if pos == usize::MAX {
                return None;
            }
            let n = (64 * 1024).min(limit - pos);
            if let Some(r) = rate {
                tokio::time::sleep(Duration::from_secs_f64(n as f64 / r as f64)).await;
            }
            Some((Ok::<Bytes, std::io::Error>(body.slice(pos..pos + n)), pos + n))
        }
    });
    // The factory answers 200 with the whole body, whatever Range asked.
    let mut b = Response::builder().status(StatusCode::OK);
    if !*f.no_length.lock().unwrap() {
        b = b.header(header::CONTENT_LENGTH, full_len);
    }
    b.body(Body::from_stream(stream)).unwrap()
}

struct Bed {
    factory: Arc<Factory>,
    tender: Tender,
}

async fn bed() -> Bed {
    let factory = Arc::new(Factory::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(factory_handler).with_state(factory.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let tender = Tender::start_with_factory(vec![], Some(format!("http://{addr}")), fast_settings()).await;
    Bed { factory, tender }
}

fn xz(data: &[u8]) -> Bytes {
    let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
    e.write_all(data).unwrap();
    Bytes::from(e.finish().unwrap())
}

fn zst(data: &[u8]) -> Bytes {
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    e.include_checksum(true).unwrap();
    e.write_all(data).unwrap();
    Bytes::from(e.finish().unwrap())
}

/// A disk image: an MBR with one partition, then recognisable sectors and zeros.
fn disk_image(mib: usize) -> Vec<u8> {
    let mut img = vec![0u8; mib << 20];
    img[446] = 0x80;
    img[450] = 0x83;
    img[454..458].copy_from_slice(&2048u32.to_le_bytes());
    img[458..462].copy_from_slice(&(((mib << 20) / 512 - 2048) as u32).to_le_bytes());
    img[510] = 0x55;
    img[511] = 0xaa;
    let noise = random_bytes(mib << 18, 42);
    img[1 << 20..(1 << 20) + noise.len()].copy_from_slice(&noise);
    img
}

impl Bed {
    fn add(&self, asset: &str, body: Bytes) -> String {
        let path = format!("/image/{S}/v1.13.6/{asset}");
        self.factory.assets.lock().unwrap().insert(path.clone(), body);
        path
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_fetch_an_asset_once_for_32_concurrent_clients() {
    let bed = bed().await;
    let body = xz(&disk_image(8));
    let path = bed.add("openstack-amd64.raw.xz", body.clone());
    *bed.factory.build_delay.lock().unwrap() = Duration::from_millis(300);
    *bed.factory.rate.lock().unwrap() = Some(8 << 20);
    let url = bed.tender.url(&path);
    let got = join_all((0..32).map(|_| get(&url, &[]))).await;
    for g in &got {
        assert_eq!(g.status, 200, "a plain GET answers exactly 200");
        assert_eq!(g.body.as_ref().unwrap(), &body);
    }
    assert_eq!(bed.factory.gets.load(Ordering::SeqCst), 1);
    // trusted and served from the store with validators
    let resp = client().head(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-length"], body.len().to_string().as_str());
    assert_eq!(resp.headers()["accept-ranges"], "bytes");
    assert_eq!(resp.headers()["etag"], format!("\"{}\"", sha(&body)).as_str());
    let lm = resp.headers()["last-modified"].to_str().unwrap().to_string();
    let resp = client().get(&url).header("If-Modified-Since", &lm).send().await.unwrap();
    assert_eq!(resp.status(), 304);
    assert_eq!(bed.factory.gets.load(Ordering::SeqCst), 1);
}

/// Issue 20 item 6: OS images count in the served statistics and show in the status page's
/// most-served table, as repositories do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_list_os_images_among_the_most_served() {
    let bed = bed().await;
    let path = bed.add("metal-amd64.raw.xz", xz(&disk_image(4)));
    for _ in 0..2 {
        assert_eq!(get(&bed.tender.url(&path), &[]).await.status, 200);
    }
    let asset = path.trim_start_matches("/image/");
    let want = format!("image-factory/{asset}");
    let served = String::from_utf8(get(&bed.tender.url("/api/v1/served"), &[]).await.body.unwrap().to_vec()).unwrap();
    let served: serde_json::Value = serde_json::from_str(&served).unwrap();
    assert_eq!(served[&want]["blobRequests"], 2, "{served}");
    let page = String::from_utf8(get(&bed.tender.url("/"), &[]).await.body.unwrap().to_vec()).unwrap();
    let table = &page[page.find("id=\"served\"").unwrap()..];
    assert!(table.contains(&want), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_serve_ranges_of_an_asset_the_factory_cannot_range() {
    let bed = bed().await;
    let body = zst(&disk_image(4));
    let path = bed.add("metal-amd64.raw.zst", body.clone());
    let url = bed.tender.url(&path);
    // cold: a range is answered from the fill
    let resp = client().get(&url).header("Range", "bytes=0-0").send().await.unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(resp.headers()["content-range"], format!("bytes 0-0/{}", body.len()).as_str());
    assert_eq!(resp.bytes().await.unwrap(), body.slice(0..1));
    // warm: random ranges against the stored bytes (a property over many draws)
    get(&url, &[]).await;
    let len = body.len() as u64;
    let mut x = 12345u64;
    for _ in 0..200 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let a = (x >> 33) % len;
        let b = a + ((x >> 7) % 70_000).min(len - 1 - a);
        let resp = client().get(&url).header("Range", format!("bytes={a}-{b}")).send().await.unwrap();
        assert_eq!(resp.status(), 206);
        assert_eq!(resp.headers()["content-range"], format!("bytes {a}-{b}/{len}").as_str());
        assert_eq!(resp.bytes().await.unwrap(), body.slice(a as usize..=b as usize), "bytes={a}-{b}");
    }
    let resp = client().get(&url).header("Range", format!("bytes={len}-")).send().await.unwrap();
    assert_eq!(resp.status(), 416);
    assert_eq!(bed.factory.gets.load(Ordering::SeqCst), 1);
    assert_eq!(bed.factory.ranges_seen.load(Ordering::SeqCst), 0, "no range was ever sent to the factory");
}

#[tokio::test]
async fn should_refuse_paths_outside_the_grammar_without_asking_the_factory() {
    let bed = bed().await;
    for p in [
        format!("/image/{S}/v1.13.6/openstack-amd64.raw.xz.sha256"),
        format!("/image/{S}/v1.13.6/openstack-amd64.raw.bz2"),
        format!("/image/{S}/latest/openstack-amd64.raw.xz"),
        format!("/image/{}/v1.13.6/openstack-amd64.raw.xz", S.to_uppercase()),
        format!("/image/{S}/v1.13.6/openstack-amd64.raw.xz/extra"),
        format!("/image/{S}/v1.13.6/openstack-amd64.raw%2exz"),
        format!("/image/{S}/v1.13.6/..%2f..%2fetc%2fpasswd"),
        format!("/image/{S}/v1.13.6/{}-amd64.raw.xz", "a".repeat(300)),
        "/image/".to_string(),
    ] {
        let resp = client().get(bed.tender.url(&p)).send().await.unwrap();
        assert_eq!(resp.status(), 404, "{p}");
    }
    assert_eq!(bed.factory.gets.load(Ordering::SeqCst) + bed.factory.heads.load(Ordering::SeqCst), 0);
    let resp = client()
        .get(bed.tender.url(&format!("/image/{S}/v1.13.6/openstack-amd64.raw.xz?filename=a%0d%0aSet-Cookie:x")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400, "a filename that is not a plain name is refused");
}

#[tokio::test]
async fn should_answer_head_of_a_cold_asset_from_the_factory() {
    let bed = bed().await;
    let body = xz(b"small");
    let path = bed.add("openstack-amd64.raw.xz", body.clone());
    let resp = client().head(bed.tender.url(&format!("{path}?filename=talos.raw.xz"))).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-length"], body.len().to_string().as_str());
    assert_eq!(resp.headers()["content-disposition"], "attachment; filename=talos.raw.xz");
    assert_eq!(bed.factory.gets.load(Ordering::SeqCst), 0);
}

/// Trust on first use: a later fetch with other bytes is refused and reported, never
/// silently replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_refuse_an_asset_whose_bytes_changed_since_first_use() {
    let bed = bed().await;
    let first = xz(&disk_image(2));
    let path = bed.add("openstack-amd64.raw.xz", first.clone());
    let url = bed.tender.url(&path);
    assert_eq!(get(&url, &[]).await.body.unwrap(), first);
    let key = format!("image:{S}/v1.13.6/openstack-amd64.raw.xz");
    // The client's last byte goes out once the content verified; the commit (fsync, rename,
    // trust record) follows.
    let trusted = poll(|| bed.tender.store.trust_get(&key).unwrap()).await;
    assert_eq!(trusted.digest.to_string(), sha(&first));

    // the object is evicted, and the factory now builds different bytes
    bed.tender.store.remove_object(&trusted.digest).unwrap();
    let rebuilt = xz(&disk_image(3));
    bed.add("openstack-amd64.raw.xz", rebuilt.clone());
    let got = get(&url, &[]).await;
    assert!(got.status != 200 || got.body.as_ref().map(|b| b != &rebuilt).unwrap_or(true), "never served as the asset");
    if got.status == 200 {
        assert!(got.body.is_err() || got.body.as_ref().unwrap().len() < rebuilt.len(), "cut short, never complete");
    }
    assert_eq!(bed.tender.store.trust_get(&key).unwrap().unwrap().digest, trusted.digest, "trust is never replaced");
    assert!(bed.tender.store.object_len(&sha(&rebuilt).parse().unwrap()).is_none());

    // accepting a rebuilt asset is explicit
    wait_idle(&bed.tender).await;
    assert!(bed.tender.store.trust_reset(&key).unwrap());
    assert_eq!(get(&url, &[]).await.body.unwrap(), rebuilt);
}

async fn wait_idle(tender: &Tender) {
    for _ in 0..3000 {
        if tender.app.mirror().flights().active_keys().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("fills did not end");
}

/// No Content-Length and no checksummed container: completeness cannot be established, so
/// the body is never committed and no client gets it complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_never_commit_an_unverifiable_body() {
    let bed = bed().await;
    *bed.factory.no_length.lock().unwrap() = true;
    let raw = Bytes::from(disk_image(2));
    let path = bed.add("openstack-amd64.raw", raw.clone());
    let got = get(&bed.tender.url(&path), &[]).await;
    assert!(got.body.is_err(), "the chunked body must end in an error, not a clean end");
    wait_idle(&bed.tender).await;
    assert!(bed.tender.store.object_len(&sha(&raw).parse().unwrap()).is_none());
    assert!(bed.tender.store.trust_list().unwrap().is_empty());
}

/// No Content-Length, but an xz container: its checks establish completeness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_commit_a_lengthless_body_whose_container_verifies() {
    let bed = bed().await;
    *bed.factory.no_length.lock().unwrap() = true;
    let body = xz(&disk_image(2));
    let path = bed.add("openstack-amd64.raw.xz", body.clone());
    let got = get(&bed.tender.url(&path), &[]).await;
    assert_eq!(got.body.unwrap(), body);
    poll(|| bed.tender.store.object_len(&sha(&body).parse().unwrap())).await;
}

/// Poll until `f` gives something (bounded: 10 s).
async fn poll<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for the commit");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A close-delimited body cut short: the xz check fails, nothing is committed, and after the
/// factory recovers the asset is fetched whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_not_commit_a_truncated_lengthless_xz() {
    let bed = bed().await;
    *bed.factory.no_length.lock().unwrap() = true;
    let body = xz(&disk_image(2));
    let path = bed.add("openstack-amd64.raw.xz", body.clone());
    *bed.factory.cut_at.lock().unwrap() = Some(body.len() / 2);
    let got = get(&bed.tender.url(&path), &[]).await;
    assert!(got.body.is_err() || got.body.as_ref().unwrap() != &body);
    wait_idle(&bed.tender).await;
    assert!(bed.tender.store.trust_list().unwrap().is_empty());
    *bed.factory.cut_at.lock().unwrap() = None;
    assert_eq!(get(&bed.tender.url(&path), &[]).await.body.unwrap(), body);
}

/// A damaged xz with a correct Content-Length: the container check, run while the bytes
/// arrive, fails; the last byte is never released, the fill restarts once from zero, and
/// nothing is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_never_release_the_last_byte_of_a_damaged_xz() {
    let bed = bed().await;
    let mut damaged = xz(&disk_image(2)).to_vec();
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0x10;
    let damaged = Bytes::from(damaged);
    let path = bed.add("openstack-amd64.raw.xz", damaged.clone());
    let got = get(&bed.tender.url(&path), &[]).await;
    assert!(got.status != 200 || got.body.is_err(), "a complete body of a damaged container");
    wait_idle(&bed.tender).await;
    assert_eq!(bed.factory.gets.load(Ordering::SeqCst), 2, "discarded, then one restart from zero");
    assert!(bed.tender.store.object_len(&sha(&damaged).parse().unwrap()).is_none());
    assert!(bed.tender.store.trust_list().unwrap().is_empty());
}
