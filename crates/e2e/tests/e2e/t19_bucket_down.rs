//! A replica whose shared bucket (SeaweedFS) fails: killed (connections refused) or paused with
//! SIGSTOP (connections accepted, never answered). Clients get byte-exact bodies, never a cut;
//! the first request after the bucket hangs costs at most `requestTimeout` more, and the ones
//! after it cost what they cost without a bucket (the breaker is open). A replica started while
//! the bucket was down probes it and uses it once it is up.

use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use tender_e2e::http::Conn;
use tender_e2e::registry::Sizes;
use tender_e2e::s3::S3Server;
use tender_e2e::tender::{self, write_config, Tender};
use tender_e2e::{poll_until, TestDir};

use crate::Bed;

const BUCKET: &str = "tender-e2e";
const REPO: &str = "/v2/ghcr.io/siderolabs/kubelet/blobs";

/// A GET: status, body, and the time from sending it to the first body byte (or to the head,
/// for an empty body). A cut body is an error.
fn timed_get(t: &Tender, path: &str, headers: &[(&str, &str)]) -> std::io::Result<(u16, Vec<u8>, Duration)> {
    let start = Instant::now();
    let mut first = None;
    let mut body = Vec::new();
    let head = Conn::open(t.addr)?.request_to("GET", path, headers, &mut |b| {
        first.get_or_insert_with(|| start.elapsed());
        body.extend_from_slice(b);
    })?;
    Ok((head.status, body, first.unwrap_or_else(|| start.elapsed())))
}

/// A whole GET on its own thread: status, the body's sha256 (hex), the time to its first body
/// byte and to its end. A cut body is an error.
type HashedGet = std::io::Result<(u16, String, Option<Duration>, Duration)>;
fn spawn_hashed_get(addr: std::net::SocketAddr, path: String) -> std::thread::JoinHandle<HashedGet> {
    std::thread::spawn(move || {
        let start = Instant::now();
        let (mut first, mut h) = (None, Sha256::new());
        let head = Conn::open(addr)?.request_to("GET", &path, &[], &mut |x| {
            first.get_or_insert_with(|| start.elapsed());
            h.update(x);
        })?;
        Ok((head.status, hex::encode(h.finalize()), first, start.elapsed()))
    })
}

/// GET `path` through the waiting replica `b` while the holder's client (`holder`) still reads
/// its fill: both byte-exact (`body`), and the waiter's first byte before half the holder's
/// fill (it read the chunks as they landed, not the finished object).
fn follow_while_filling(holder: std::thread::JoinHandle<HashedGet>, b: &Tender, path: &str, body: &[u8]) {
    let (status, got, waited) = timed_get(b, path, &[]).expect("b's client is not cut");
    let (a_status, a_got, a_first, a_whole) = holder.join().unwrap().expect("a's client is not cut");
    assert_eq!((status, a_status), (200, 200));
    assert!(got == body, "byte-exact through the chunks in progress");
    assert_eq!(a_got, hex::encode(Sha256::digest(body)));
    eprintln!("holder: first byte {a_first:?}, whole {a_whole:?}; waiter: first byte {waited:?}");
    assert!(
        waited < a_whole / 2,
        "the waiter's first byte ({waited:?}) came after half the holder's fill ({a_whole:?}): it waited for the index"
    );
}

/// The kubelet image's blobs (both platforms), with their bytes.
fn blobs(bed: &Bed) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for m in ["KUBELET_AMD64", "KUBELET_ARM64"] {
        for d in bed.images.config_and_layers(bed.images.var(m)) {
            let bytes = std::fs::read(bed.images.blob_path(&d)).unwrap();
            out.push((d, bytes));
        }
    }
    out
}

/// Replica `a` fills every blob (and uploads it); replica `c`, started after, answers a HEAD of
/// each from the bucket, so it holds each blob's index and no local copy.
fn warm(bed: &Bed, s3: &S3Server, extra: &str) -> (Tender, Tender, Vec<(String, Vec<u8>)>) {
    let ups = [("ghcr.io", bed.registry.url())];
    let ups: Vec<(&str, &str)> = ups.iter().map(|(n, u)| (*n, u.as_str())).collect();
    let (a_cfg, c_cfg) = (bed.path("a.yaml"), bed.path("c.yaml"));
    write_config(&a_cfg, &ups, &s3.storage_yaml(bed.dir.path(), "fleet", "a", ""));
    write_config(&c_cfg, &ups, &s3.storage_yaml(bed.dir.path(), "fleet", "c", extra));
    let a = Tender::start(&a_cfg, &bed.path("a-data"), &bed.path("a.log"));
    let blobs = blobs(bed);
    for (d, bytes) in &blobs {
        let (status, body, _) = timed_get(&a, &format!("{REPO}/{d}"), &[]).unwrap();
        assert_eq!((status, body.len()), (200, bytes.len()), "{d} through a");
    }
    let c = Tender::start(&c_cfg, &bed.path("c-data"), &bed.path("c.log"));
    for (d, _) in &blobs {
        let path = format!("{REPO}/{d}");
        poll_until("c to find the blob in the bucket", Duration::from_secs(60), || {
            let r = Conn::open(c.addr).ok()?.request("HEAD", &path, &[]).ok()?;
            (r.status() == 200 && c.access().iter().any(|x| x.cache == "shared" && x.path == path)).then_some(())
        });
    }
    (a, c, blobs)
}

fn range_of(bytes: &[u8]) -> (String, Vec<u8>) {
    let end = bytes.len().min(1100);
    let start = end.saturating_sub(1000);
    (format!("bytes={start}-{}", end - 1), bytes[start..end].to_vec())
}

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

#[test]
fn should_serve_byte_exact_ranges_and_bodies_from_the_upstream_when_the_bucket_is_killed() {
    let bed = Bed::new("s3-killed", Sizes::SMALL);
    let mut s3 = S3Server::start(bed.dir.path(), BUCKET);
    let (_a, c, blobs) = warm(&bed, &s3, "");
    s3.kill();
    for (i, (d, bytes)) in blobs.iter().enumerate() {
        let path = format!("{REPO}/{d}");
        if i % 2 == 0 {
            let (range, want) = range_of(bytes);
            let (status, body, _) = timed_get(&c, &path, &[("Range", &range)])
                .unwrap_or_else(|e| panic!("Range {range} of {d} with the bucket down: {e}"));
            assert_eq!(status, 206, "{d}");
            assert!(body == want, "{d}: {range} is not the blob's bytes ({} bytes)", body.len());
        } else {
            let (status, body, _) =
                timed_get(&c, &path, &[]).unwrap_or_else(|e| panic!("GET {d} with the bucket down: {e}"));
            assert_eq!((status, sha256(&body)), (200, d.clone()));
        }
    }
    let log = tender::tail(&c.log, 400);
    assert!(log.contains("shared bucket down"), "c logs the bucket failure:\n{log}");
    assert!(log.contains("shared bucket failed while serving a range"), "c logs the fallback:\n{log}");
}

#[test]
fn should_answer_within_the_request_timeout_when_the_bucket_hangs_and_then_as_without_it() {
    let bed = Bed::new("s3-hung", Sizes::SMALL);
    let s3 = S3Server::start(bed.dir.path(), BUCKET);
    let (_a, c, blobs) = warm(&bed, &s3, "    requestTimeout: 2s\n    probeInterval: 1s\n");
    // The same requests through a tender with no bucket, for the cost of each without one.
    let plain = bed.start_tender("plain.log");
    s3.pause();

    let (d, bytes) = &blobs[0];
    let (range, want) = range_of(bytes);
    let (status, body, first) = timed_get(&c, &format!("{REPO}/{d}"), &[("Range", &range)])
        .unwrap_or_else(|e| panic!("first Range after the bucket hung: {e}"));
    assert_eq!(status, 206);
    assert!(body == want, "the first range after the hang is the blob's bytes ({} bytes)", body.len());
    eprintln!("first byte of the first request after the bucket hung: {first:?} (requestTimeout 2s)");
    assert!(first <= Duration::from_secs(3), "first byte after {first:?}, more than requestTimeout + 1 s");
    // Issue 36 (5): a hung bucket is `timeout`, the S3 client's own timeout included.
    let ready = tender_e2e::http::get(c.addr, "/readyz").unwrap().text();
    assert!(ready.contains("down (timeout)"), "/readyz after the hang: {ready}");

    // The breaker is open: every other blob but the last, a HEAD and a Range, as fast as
    // without a bucket.
    let (last, measured) = blobs[1..].split_last().unwrap();
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for (d, bytes) in measured {
        let path = format!("{REPO}/{d}");
        let (range, want) = range_of(bytes);
        for (t, out) in [(&plain, &mut without), (&c, &mut with)] {
            let start = Instant::now();
            let r = Conn::open(t.addr).unwrap().request("HEAD", &path, &[]).unwrap();
            assert_eq!(r.status(), 200, "HEAD {d}");
            let (status, body, _) = timed_get(t, &path, &[("Range", &range)]).unwrap();
            assert_eq!(status, 206);
            assert!(body == want, "{d}: {range} is not the blob's bytes");
            out.push(start.elapsed());
        }
    }
    with.sort();
    without.sort();
    let (w, wo) = (with[with.len() / 2], without[without.len() / 2]);
    eprintln!("HEAD + Range while the breaker is open: median {w:?}, without a bucket {wo:?} ({with:?} / {without:?})");
    assert!(w <= wo + Duration::from_millis(100), "with the bucket hung {w:?}, without a bucket {wo:?}");

    // The bucket answers again: a probe closes the breaker. Then it hangs once more, under a
    // full GET that the bucket was to serve (c remembers the last blob's index): the fill goes
    // on from the upstream after requestTimeout, byte-exact.
    s3.resume();
    poll_until("a probe to find the bucket up", Duration::from_secs(40), || {
        let r = tender_e2e::http::get(c.addr, "/readyz").ok()?;
        r.text().contains(": up").then_some(())
    });
    s3.pause();
    let (d, bytes) = last;
    let (status, body, first) = timed_get(&c, &format!("{REPO}/{d}"), &[])
        .unwrap_or_else(|e| panic!("full GET with the bucket hung again: {e}"));
    assert_eq!((status, sha256(&body)), (200, d.clone()));
    assert_eq!(body.len(), bytes.len());
    eprintln!("first byte of a full GET from the bucket after it hung again: {first:?}");
    assert!(first <= Duration::from_secs(3), "first byte after {first:?}, more than requestTimeout + 1 s");
    s3.resume();
}

#[test]
fn should_probe_a_bucket_that_was_down_at_start_and_use_it_once_up() {
    let bed = Bed::new("s3-late", Sizes::SMALL);
    let dir = TestDir::new("s3-late-bucket");
    let mut s3 = S3Server::unstarted(dir.path(), BUCKET);
    let ups = [("ghcr.io", bed.registry.url())];
    let ups: Vec<(&str, &str)> = ups.iter().map(|(n, u)| (*n, u.as_str())).collect();
    let cfg = bed.path("c.yaml");
    write_config(&cfg, &ups, &s3.storage_yaml(bed.dir.path(), "late", "c", ""));
    let c = Tender::start(&cfg, &bed.path("c-data"), &bed.path("c.log"));
    let down = tender_e2e::http::get(c.addr, "/readyz").unwrap();
    assert_eq!(down.status(), 200, "a replica without its bucket still serves");

    s3.start_again();
    poll_until("the probe to check the bucket (its format marker)", Duration::from_secs(30), || {
        s3.has("late/tender-bucket.json").then_some(())
    });
    assert!(down.text().contains("down"), "/readyz names the bucket's state: {}", down.text());
    let ready = tender_e2e::http::get(c.addr, "/readyz").unwrap();
    assert!(ready.text().contains(" up"), "/readyz after the probe: {}", ready.text());
    let metrics = tender_e2e::http::get(c.addr, "/metrics").unwrap().text();
    assert!(metrics.lines().any(|l| l.starts_with("tender_bucket_up") && l.ends_with(" 1")), "{metrics}");

    // Used: a fill is uploaded.
    let (d, bytes) = &blobs(&bed)[1];
    let (status, body, _) = timed_get(&c, &format!("{REPO}/{d}"), &[]).unwrap();
    assert_eq!((status, body.len()), (200, bytes.len()));
    poll_until("the fill to reach the bucket", Duration::from_secs(30), || {
        s3.has(&format!("late/index/sha256/{}.json", &d[7..])).then_some(())
    });
}

#[test]
fn should_show_a_wrong_secret_as_the_bucket_down_for_denied_and_serve_without_it() {
    let bed = Bed::new("s3-denied", Sizes::SMALL);
    let s3 = S3Server::start(bed.dir.path(), BUCKET);
    let ups = [("ghcr.io", bed.registry.url())];
    let ups: Vec<(&str, &str)> = ups.iter().map(|(n, u)| (*n, u.as_str())).collect();
    let cfg = bed.path("c.yaml");
    write_config(&cfg, &ups, &s3.storage_yaml(bed.dir.path(), "denied", "c", "    probeInterval: 1s\n"));
    std::fs::write(bed.path("s3-secret-access-key"), "not-the-secret\n").unwrap();
    let c = Tender::start(&cfg, &bed.path("c-data"), &bed.path("c.log"));

    let ready = tender_e2e::http::get(c.addr, "/readyz").unwrap();
    assert_eq!(ready.status(), 200, "a replica without its bucket still serves");
    assert!(ready.text().contains("down (denied)"), "/readyz: {}", ready.text());
    let metrics = tender_e2e::http::get(c.addr, "/metrics").unwrap().text();
    for want in ["tender_bucket_up 0", "tender_bucket_down_cause{cause=\"denied\"} 1"] {
        assert!(metrics.lines().any(|l| l == want), "{want} in:\n{metrics}");
    }
    let page = tender_e2e::http::get(c.addr, "/").unwrap().text();
    assert!(page.contains("id=\"bucket\"") && page.contains("denied"), "the status page names the cause");
    let (d, bytes) = &blobs(&bed)[1];
    let (status, body, _) = timed_get(&c, &format!("{REPO}/{d}"), &[]).unwrap();
    assert_eq!((status, body.len()), (200, bytes.len()), "served from the upstream");
    // Probed again (every second here), and still down for the same cause.
    poll_until("a second failed probe", Duration::from_secs(30), || {
        let m = tender_e2e::http::get(c.addr, "/metrics").ok()?.text();
        m.lines()
            .find_map(|l| l.strip_prefix("tender_bucket_probes_total{result=\"failed\"} "))
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|n| *n >= 2.0)
    });
    assert!(!s3.has("denied/tender-bucket.json"), "nothing was written with a wrong secret");
}

/// A bucket on SeaweedFS, a `size`-byte blob served at `rate` bytes/s, and one config per
/// replica name under `prefix`: (server, upstream, blob, its digest, configs). Keep the server
/// and the upstream alive for the test.
fn blob_and_bucket(
    dir: &TestDir,
    prefix: &str,
    names: &[&str],
    size: usize,
    rate: u64,
) -> (S3Server, tender_e2e::slow::SlowBlobServer, std::sync::Arc<Vec<u8>>, String, Vec<std::path::PathBuf>) {
    let s3 = S3Server::start(dir.path(), BUCKET);
    let body = std::sync::Arc::new(tender_e2e::slow::noise(size));
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(body.as_slice())));
    let upstream = tender_e2e::slow::SlowBlobServer::start("e2e/big", &digest, body.clone(), rate);
    let cfgs = names
        .iter()
        .map(|name| {
            let cfg = dir.path().join(format!("{name}.yaml"));
            write_config(&cfg, &[("ghcr.io", &upstream.url())], &s3.storage_yaml(dir.path(), prefix, name, ""));
            cfg
        })
        .collect();
    (s3, upstream, body, digest, cfgs)
}

/// Issue 19 (9): a client of a replica waiting on another's fill lease gets its first byte
/// while the holder still fetches, not after the whole object reached the bucket: the holder
/// writes each chunk as it lands and the waiter reads the chunks as they appear. One upstream
/// transfer; both bodies byte-exact.
#[test]
fn should_stream_a_fill_in_progress_to_a_waiting_replica() {
    const SIZE: usize = 48 << 20;
    let dir = TestDir::new("s3-follow");
    // 16 MiB/s: 3 s for the whole blob, a 5 MiB chunk about every 0.3 s.
    let (s3, upstream, body, digest, cfgs) = blob_and_bucket(&dir, "follow", &["a", "b"], SIZE, 16 << 20);
    let a = Tender::start(&cfgs[0], &dir.path().join("a-data"), &dir.path().join("a.log"));
    let b = Tender::start(&cfgs[1], &dir.path().join("b-data"), &dir.path().join("b.log"));
    let path = format!("/v2/ghcr.io/e2e/big/blobs/{digest}");
    let index = format!("follow/index/sha256/{}.json", &digest[7..]);

    let holder = spawn_hashed_get(a.addr, path.clone());
    poll_until("a to be filling", Duration::from_secs(30), || {
        upstream.hits().iter().any(|h| h.method == "GET" && h.sent >= 1 << 20).then_some(())
    });
    follow_while_filling(holder, &b, &path, &body);
    let gets = upstream.hits().iter().filter(|h| h.method == "GET").count();
    assert_eq!(gets, 1, "one upstream transfer for both replicas");
    poll_until("the index to be written", Duration::from_secs(30), || s3.has(&index).then_some(()));
    // Every chunk under its upload, nothing beside: 48 MiB in chunks of 5 MiB.
    let (_, _) = s3.chunk_key("follow", &digest, 0);
    let uploads = s3.list("follow/parts");
    assert_eq!(uploads.len(), 1, "one upload, no chunk outside it: {uploads:?}");
    assert_eq!(s3.list(&format!("follow/parts/{}", uploads[0])).len(), 10);
    assert!(
        tender::tail(&dir.path().join("b.log"), 200).contains("reading its chunks from the bucket as they land"),
        "b followed a's upload"
    );
    drop((a, b));
}

/// Issue 19 (9) for an Image Factory asset, whose digest nobody knows before it is fetched: a
/// client of the replica waiting on another's fill lease gets its first byte while the holder
/// still fetches, reading the holder's chunks as they land; at the end it finds the rest by the
/// trust record the holder puts in the bucket. One factory transfer; both bodies byte-exact.
#[test]
fn should_stream_an_image_factory_asset_in_progress_to_a_waiting_replica() {
    let dir = TestDir::new("s3-follow-asset");
    let s3 = S3Server::start(dir.path(), BUCKET);
    let asset = crate::t11_prefetch::xz(&tender_e2e::slow::noise(24 << 20));
    let path = "/image/ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515/v1.10.5/metal-amd64.raw.xz";
    // 8 MiB/s: 3 s for the whole asset, a 5 MiB chunk about every 0.6 s.
    let factory = tender_e2e::slow::SlowBlobServer::start_objects(
        vec![(path.to_string(), std::sync::Arc::new(asset.clone()), "application/x-xz".into())],
        8 << 20,
    );
    let replicas: Vec<Tender> = ["a", "b"]
        .iter()
        .map(|name| {
            let cfg = dir.path().join(format!("{name}.yaml"));
            let storage = s3.storage_yaml(dir.path(), "asset", name, "");
            write_config(&cfg, &[], &format!("imageFactory: {}\n{storage}", factory.url()));
            Tender::start(&cfg, &dir.path().join(format!("{name}-data")), &dir.path().join(format!("{name}.log")))
        })
        .collect();
    let (a, b) = (&replicas[0], &replicas[1]);
    let holder = spawn_hashed_get(a.addr, path.to_string());
    poll_until("a to be filling", Duration::from_secs(30), || {
        factory.hits().iter().any(|h| h.method == "GET" && h.sent >= 1 << 20).then_some(())
    });
    follow_while_filling(holder, b, path, &asset);
    let gets = factory.hits().iter().filter(|h| h.method == "GET").count();
    assert_eq!(gets, 1, "one factory transfer for both replicas");
    assert!(
        tender::tail(&dir.path().join("b.log"), 200).contains("reading its chunks from the bucket as they land"),
        "b followed a's upload"
    );
    // The waiter verified what it served and holds it: a second GET is a local hit.
    let again = Conn::open(b.addr).unwrap().request("GET", path, &[]).unwrap();
    assert!(again.status() == 200 && again.body == asset, "b serves its own copy");
    assert_eq!(factory.hits().iter().filter(|h| h.method == "GET").count(), 1);
    drop(replicas);
}

/// Issue 19 (5): right after `tender fsck --bucket --repair` quarantined a corrupt object, a
/// replica that still remembers its index serves ranges over it byte-exact (the rest from the
/// upstream at the same byte), never a cut.
#[test]
fn should_serve_byte_exact_ranges_right_after_fsck_repair() {
    const SIZE: usize = 12 << 20;
    let dir = TestDir::new("s3-repair");
    let (s3, _upstream, body, digest, cfgs) = blob_and_bucket(&dir, "repair", &["a", "c"], SIZE, 1 << 30);
    let a = Tender::start(&cfgs[0], &dir.path().join("a-data"), &dir.path().join("a.log"));
    let path = format!("/v2/ghcr.io/e2e/big/blobs/{digest}");
    let (status, got, _) = timed_get(&a, &path, &[]).expect("a's fill");
    assert_eq!((status, got.len()), (200, SIZE));
    let index = format!("repair/index/sha256/{}.json", &digest[7..]);
    poll_until("the blob to reach the bucket", Duration::from_secs(60), || s3.has(&index).then_some(()));
    // c remembers the index (a HEAD answered from the bucket).
    let c = Tender::start(&cfgs[1], &dir.path().join("c-data"), &dir.path().join("c.log"));
    assert_eq!(Conn::open(c.addr).unwrap().request("HEAD", &path, &[]).unwrap().status(), 200);

    // Bit rot in the second chunk; fsck --bucket --repair moves the object aside.
    let (key, first) = s3.chunk_key("repair", &digest, 6 << 20);
    let mut bad = body[first as usize..(first as usize + (5 << 20)).min(SIZE)].to_vec();
    bad[77] ^= 0x20;
    s3.put(&key, &bad);
    let repair = tender::run(["fsck", "--bucket", "--repair", "--config", cfgs[1].to_str().unwrap()]);
    let out = String::from_utf8_lossy(&repair.stdout);
    assert_eq!(repair.status.code(), Some(0), "{out}");
    assert!(out.contains("quarantined 1"), "{out}");

    for (from, to) in [(0usize, (6 << 20) - 1), (5 << 20, (5 << 20) + 1000), ((10 << 20) + 3, SIZE - 1)] {
        let range = format!("bytes={from}-{to}");
        let (status, got, _) = timed_get(&c, &path, &[("Range", range.as_str())]).expect("a range, not cut");
        assert_eq!(status, 206, "{range}");
        assert!(got == body[from..=to], "{range}: byte-exact");
    }
    drop((a, c));
}

/// `tender_bucket_read_bytes_total` of a replica.
fn bucket_read_bytes(t: &Tender) -> u64 {
    let m = tender_e2e::http::get(t.addr, "/metrics").expect("metrics").text();
    m.lines()
        .find_map(|l| l.strip_prefix("tender_bucket_read_bytes_total ").and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// Issue 36 (3): a replica that never had the blob serves a 1 MiB `Range` from the bucket by
/// reading the 1 MiB pieces that cover it (checked from the hash states in the index), not the 5 MiB
/// chunks: byte-exact, and its bucket reads grow by two sub-chunks at most past the range.
#[test]
fn should_serve_a_1_mib_range_from_the_bucket_reading_only_its_sub_chunks() {
    const SIZE: usize = 12 << 20;
    let dir = TestDir::new("s3-subchunks");
    let (s3, _upstream, body, digest, cfgs) = blob_and_bucket(&dir, "sub", &["a", "c"], SIZE, 1 << 30);
    let a = Tender::start(&cfgs[0], &dir.path().join("a-data"), &dir.path().join("a.log"));
    let path = format!("/v2/ghcr.io/e2e/big/blobs/{digest}");
    let (status, got, _) = timed_get(&a, &path, &[]).expect("a's fill");
    assert_eq!((status, got.len()), (200, SIZE));
    let index = format!("sub/index/sha256/{}.json", &digest[7..]);
    poll_until("the blob to reach the bucket", Duration::from_secs(60), || s3.has(&index).then_some(()));
    let json: serde_json::Value = serde_json::from_slice(&s3.get(&index).expect("the index")).unwrap();
    assert_eq!(json["subChunkSize"], 1 << 20, "{json}");
    assert_eq!(json["subChunks"].as_array().map(Vec::len), Some(3), "{json}");

    let c = Tender::start(&cfgs[1], &dir.path().join("c-data"), &dir.path().join("c.log"));
    let mut read = bucket_read_bytes(&c);
    for (from, len) in [((6 << 20) + 100, 1 << 20), (5 << 20, 1 << 20), (SIZE - (1 << 20), 1 << 20), (0, 10)] {
        let to = from + len - 1;
        let range = format!("bytes={from}-{to}");
        let (status, got, _) = timed_get(&c, &path, &[("Range", range.as_str())]).expect("a range, not cut");
        assert_eq!(status, 206, "{range}");
        assert!(got == body[from..=to], "{range}: byte-exact");
        let now = bucket_read_bytes(&c);
        let grew = now - read;
        eprintln!("{range}: {grew} bytes read from the bucket");
        assert!(grew > 0, "{range}: served from the bucket");
        assert!(grew <= (len + (2 << 20)) as u64, "{range}: read {grew} bytes from the bucket, whole chunks");
        read = now;
    }
    let lines = poll_until("c's access log", Duration::from_secs(10), || {
        let l: Vec<_> = c.access().into_iter().filter(|x| x.path == path).collect();
        (l.len() >= 4).then_some(l)
    });
    assert!(lines.iter().all(|x| x.cache == "shared"), "every range came from the bucket: {lines:?}");
    drop((a, c));
}

/// Issue 36 (2): a chunk object gone from under its index (a lifecycle rule, a partial
/// restore) is put back by the next replica that holds the object's verified bytes: its fill
/// copies up to the hole, continues from the upstream at that byte, commits, and re-uploads the
/// missing chunk under the existing index (a conditional create; the index is not rewritten).
/// The replica after it copies the whole object from the bucket again, with no upstream
/// request. A range over a missing chunk heals it the same way, through its fallback fill.
/// Before, every replica without a local copy fetched the object from the upstream, forever.
#[test]
fn should_re_upload_a_missing_chunk_from_the_next_replica_with_the_verified_bytes() {
    const SIZE: usize = 12 << 20;
    const CHUNK: usize = 5 << 20;
    let dir = TestDir::new("s3-heal");
    let (s3, upstream, body, digest, cfgs) = blob_and_bucket(&dir, "heal", &["a", "b", "c", "d"], SIZE, 1 << 30);
    let start = |i: usize| {
        let name = ["a", "b", "c", "d"][i];
        Tender::start(&cfgs[i], &dir.path().join(format!("{name}-data")), &dir.path().join(format!("{name}.log")))
    };
    let gets = || upstream.hits().into_iter().filter(|h| h.method == "GET").collect::<Vec<_>>();
    let path = format!("/v2/ghcr.io/e2e/big/blobs/{digest}");
    let index = format!("heal/index/sha256/{}.json", &digest[7..]);
    let a = start(0);
    let (status, got, _) = timed_get(&a, &path, &[]).expect("a's fill");
    assert_eq!((status, got.len()), (200, SIZE));
    poll_until("the blob to reach the bucket", Duration::from_secs(60), || s3.has(&index).then_some(()));
    let written = s3.get(&index).expect("the index");

    // The second chunk (bytes 5-10 MiB) disappears.
    let (key, first) = s3.chunk_key("heal", &digest, 6 << 20);
    s3.delete(&key);
    assert!(!s3.has(&key), "{key} deleted");
    let b = start(1);
    let (status, got, _) = timed_get(&b, &path, &[]).expect("b's GET is not cut");
    assert_eq!(status, 200);
    assert!(got == *body, "b's body is byte-exact");
    let hits = gets();
    assert_eq!(hits.len(), 2, "b asked the upstream once: {hits:?}");
    assert_eq!(hits[1].range_start(), Some(first), "from the missing chunk on: {hits:?}");
    poll_until("b to put the missing chunk back", Duration::from_secs(30), || s3.has(&key).then_some(()));
    let (from, to) = (first as usize, first as usize + CHUNK);
    assert!(s3.get(&key).expect("the chunk") == body[from..to], "the chunk's bytes are the object's");
    assert_eq!(s3.get(&index).expect("the index"), written, "the index is not rewritten");
    let log = tender::tail(&dir.path().join("b.log"), 400);
    assert!(log.contains("re-uploaded missing chunks"), "b logs the heal:\n{log}");

    // c, with no local copy, copies the whole object from the bucket: no upstream request.
    let c = start(2);
    let (status, got, _) = timed_get(&c, &path, &[]).expect("c's GET");
    assert_eq!(status, 200);
    assert!(got == *body, "c's body is byte-exact");
    assert_eq!(gets().len(), 2, "c asked the upstream nothing: {:?}", gets());

    // The last, shorter chunk (10-12 MiB) disappears; d is asked a range over it.
    let (last, last_first) = s3.chunk_key("heal", &digest, (SIZE - 1) as u64);
    s3.delete(&last);
    let d = start(3);
    let (from, to) = ((9 << 20) + 17, SIZE - 5);
    let range = format!("bytes={from}-{to}");
    let (status, got, _) = timed_get(&d, &path, &[("Range", range.as_str())]).expect("d's range is not cut");
    assert_eq!(status, 206, "{range}");
    assert!(got == body[from..=to], "{range}: byte-exact");
    poll_until("d to put the last chunk back", Duration::from_secs(30), || s3.has(&last).then_some(()));
    assert!(s3.get(&last).expect("the chunk") == body[last_first as usize..], "the last chunk's bytes");
    let hits = gets();
    assert_eq!(hits.len(), 3, "d asked the upstream once: {hits:?}");
    assert_eq!(hits[2].range_start(), Some(last_first), "from the missing chunk on: {hits:?}");
    assert_eq!(s3.get(&index).expect("the index"), written, "the index is not rewritten");
    drop((a, b, c, d));
}

/// Issue 19 (8): two replicas asked for the same manifest by digest at once fetch it from the
/// upstream once: the first takes the fill lease a blob would take, the other waits for it and
/// reads the manifest from the bucket. Before, manifests by digest took no lease and both
/// replicas fetched it.
#[test]
fn should_fetch_a_manifest_by_digest_once_for_two_replicas_at_once() {
    const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    let dir = TestDir::new("s3-manifest");
    let s3 = S3Server::start(dir.path(), BUCKET);
    // 1,000 layers, about 150 KB: served at 64 KiB/s, each GET takes over 2 s, so the two
    // replicas' requests overlap.
    let descriptor = |i: u32| {
        serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": sha256(format!("layer {i}").as_bytes()),
            "size": 1000 + i,
        })
    };
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(b"config"), "size": 6 },
        "layers": (0..1000).map(descriptor).collect::<Vec<_>>(),
    }))
    .unwrap();
    let digest = sha256(&manifest);
    let upstream = tender_e2e::slow::SlowBlobServer::start_objects(
        vec![(format!("/v2/e2e/app/manifests/{digest}"), std::sync::Arc::new(manifest.clone()), OCI_MANIFEST.into())],
        64 << 10,
    );
    let replicas: Vec<Tender> = ["a", "b"]
        .iter()
        .map(|name| {
            let cfg = dir.path().join(format!("{name}.yaml"));
            write_config(&cfg, &[("ghcr.io", &upstream.url())], &s3.storage_yaml(dir.path(), "manifest", name, ""));
            Tender::start(&cfg, &dir.path().join(format!("{name}-data")), &dir.path().join(format!("{name}.log")))
        })
        .collect();
    let path = format!("/v2/ghcr.io/e2e/app/manifests/{digest}");
    let clients: Vec<_> = replicas
        .iter()
        .map(|t| {
            let (addr, path) = (t.addr, path.clone());
            std::thread::spawn(move || {
                let r = Conn::open(addr)?.request("GET", &path, &[("Accept", OCI_MANIFEST)])?;
                Ok::<_, std::io::Error>((r.status(), r.body))
            })
        })
        .collect();
    for c in clients {
        let (status, body) = c.join().unwrap().expect("the manifest, not an error");
        assert_eq!((status, sha256(&body)), (200, digest.clone()), "byte-exact on both replicas");
    }
    let gets: Vec<_> = upstream.hits().into_iter().filter(|h| h.method == "GET").collect();
    assert_eq!(gets.len(), 1, "one upstream GET of the manifest for two replicas: {gets:?}");
    let waited = ["a.log", "b.log"]
        .iter()
        .filter(|l| tender::tail(&dir.path().join(l), 200).contains("another replica fetches this manifest"))
        .count();
    assert_eq!(waited, 1, "one replica waited for the other's fetch");
    drop(replicas);
}

/// Replica `name` of bucket prefix `prefix` (config `<name>.yaml`, data `<name>-data`, log
/// `<name>.log` in `dir`), upstream `ghcr.io` = `upstream`, `extra` lines under `s3:`; it
/// reaches the bucket at `endpoint` (a [`tender_e2e::throttle::Throttle`]) when given.
fn replica_via(
    dir: &TestDir,
    s3: &S3Server,
    upstream: &str,
    prefix: &str,
    name: &str,
    extra: &str,
    endpoint: Option<String>,
) -> Tender {
    let cfg = dir.path().join(format!("{name}.yaml"));
    let mut storage = s3.storage_yaml(dir.path(), prefix, name, extra);
    if let Some(e) = endpoint {
        storage = storage.replace(&s3.url(), &e);
    }
    write_config(&cfg, &[("ghcr.io", upstream)], &storage);
    Tender::start(&cfg, &dir.path().join(format!("{name}-data")), &dir.path().join(format!("{name}.log")))
}

/// Issue 36 (1): a replica never waits on an upload nobody is doing. The holder's link to the
/// bucket turns slow just after it announced its upload: small requests (its lease, its record,
/// the breaker's probe) still go through, a chunk cannot within `requestTimeout`. The holder
/// goes on fetching for its own client from a slow path to the upstream. Replicas that ask
/// later must not follow that dead upload until the holder finishes (or their own fill stalls):
/// they take the lease over (the holder gave it up) or fetch alone after at most `leaseTtl`
/// without news; of two asking at once, one fetches and the other follows it. Every client
/// finishes within leaseTtl + 2 × requestTimeout + its own transfer time, byte-exact.
#[test]
fn should_never_wait_on_an_upload_its_holder_stopped() {
    const SIZE: usize = 24 << 20;
    let dir = TestDir::new("s3-dead-upload");
    let s3 = S3Server::start(dir.path(), BUCKET);
    let body = std::sync::Arc::new(tender_e2e::slow::noise(SIZE));
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(body.as_slice())));
    // The holder's path to the upstream: 1 MiB/s, 24 s for the blob (a chunk of 5 MiB in 5 s).
    let upstream = tender_e2e::slow::SlowBlobServer::start("e2e/big", &digest, body.clone(), 1 << 20);
    // The holder reaches the bucket through a proxy that can turn its uploads slow.
    let link = tender_e2e::throttle::Throttle::start(s3.addr);
    let (lease_ttl, request_timeout) = (Duration::from_secs(3), Duration::from_secs(2));
    let extra = "    requestTimeout: 2s\n    probeInterval: 1s\n";
    let start =
        |name: &str, endpoint: Option<String>| replica_via(&dir, &s3, &upstream.url(), "dead", name, extra, endpoint);
    let (a, b, c) = (start("a", Some(link.url())), start("b", None), start("c", None));
    let path = format!("/v2/ghcr.io/e2e/big/blobs/{digest}");

    let holder = spawn_hashed_get(a.addr, path.clone());
    poll_until("a to announce its upload", Duration::from_secs(30), || {
        (!s3.list("dead/progress").is_empty()).then_some(())
    });
    // 256 KiB/s: a 5 MiB chunk needs 20 s, ten times requestTimeout; a record, 2 ms.
    link.set_upload_rate(256 << 10);
    let down = poll_until("a's first chunk to time out", Duration::from_secs(30), || {
        let log = tender::tail(&dir.path().join("a.log"), 200);
        log.lines().find(|l| l.contains("shared bucket down")).map(str::to_string)
    });
    // Issue 36 (5): a chunk that cannot move while small requests go through is `slow`, not
    // the S3 client's "error sending request" of its own timeout.
    assert!(down.contains(r#""cause":"slow""#), "the breaker's cause: {down}");
    // Everyone else's path to the upstream is fast: 3 s for the blob.
    upstream.set_rate(8 << 20);
    let own_transfer = Duration::from_secs(3);
    let bound = lease_ttl + request_timeout * 2 + own_transfer + Duration::from_secs(2);

    let second = spawn_hashed_get(b.addr, path.clone());
    let third = spawn_hashed_get(c.addr, path.clone());
    let want = hex::encode(Sha256::digest(body.as_slice()));
    for (name, get) in [("b", second), ("c", third)] {
        let (status, got, first, whole) =
            get.join().unwrap().unwrap_or_else(|e| panic!("{name}'s client was cut: {e}"));
        eprintln!("{name}: first byte {first:?}, whole {whole:?} (bound {bound:?})");
        assert_eq!((status, got.as_str()), (200, want.as_str()), "{name}'s body");
        assert!(whole <= bound, "{name} took {whole:?}, more than leaseTtl + 2 × requestTimeout + its transfer");
    }
    let (status, got, _, _) = holder.join().unwrap().expect("a's client is not cut");
    assert_eq!((status, got.as_str()), (200, want.as_str()), "a's body");
    let gets = upstream.hits().iter().filter(|h| h.method == "GET").count();
    assert_eq!(gets, 2, "a's transfer and one more: of b and c, one fetched and the other followed its upload");
    drop((a, b, c));
}

/// Issue 36 (3): a bucket that is slower than the upstream for an object is bypassed. Replica b
/// reaches the bucket through a link that moves 1 MiB/s per connection while the upstream
/// gives 16 MiB/s: after one fill from each, b fetches the next object the bucket holds from
/// the upstream, says so (`degraded (slow)` in `/api/v1/health`, a counter), and serves it
/// byte-exact in a fraction of the bucket's time.
#[test]
fn should_fetch_from_the_upstream_when_the_bucket_is_measured_slower() {
    const SIZE: usize = 6 << 20;
    let dir = TestDir::new("s3-slow-bucket");
    let s3 = S3Server::start(dir.path(), BUCKET);
    let blobs: Vec<(String, std::sync::Arc<Vec<u8>>)> = (0..3)
        .map(|i| {
            let body = std::sync::Arc::new(tender_e2e::slow::noise(SIZE + i));
            (format!("sha256:{}", hex::encode(Sha256::digest(body.as_slice()))), body)
        })
        .collect();
    let upstream = tender_e2e::slow::SlowBlobServer::start_many("e2e/big", blobs.clone(), 16 << 20);
    let link = tender_e2e::throttle::Throttle::start(s3.addr);
    let start =
        |name: &str, endpoint: Option<String>| replica_via(&dir, &s3, &upstream.url(), "slow", name, "", endpoint);
    let (a, b) = (start("a", None), start("b", Some(link.url())));
    let path = |d: &str| format!("/v2/ghcr.io/e2e/big/blobs/{d}");
    let get = |t: &Tender, d: &str| {
        let (status, body, _) = timed_get(t, &path(d), &[]).unwrap_or_else(|e| panic!("GET {d}: {e}"));
        assert_eq!((status, sha256(&body)), (200, d.to_string()), "{d} byte-exact");
    };
    let upstream_gets = |d: &str| upstream.hits().iter().filter(|h| h.method == "GET" && h.path.ends_with(d)).count();
    // a puts blobs 1 and 2 in the bucket.
    for (d, _) in &blobs[1..] {
        get(&a, d);
        poll_until("the upload", Duration::from_secs(30), || {
            s3.has(&format!("slow/index/sha256/{}.json", &d[7..])).then_some(())
        });
    }
    // b measures the upstream (blob 0) and then the bucket, through its slow link (blob 1).
    get(&b, &blobs[0].0);
    link.set_download_rate(1 << 20);
    let began = Instant::now();
    get(&b, &blobs[1].0);
    let from_bucket = began.elapsed();
    assert_eq!(upstream_gets(&blobs[1].0), 1, "blob 1 came from the bucket to b (a's transfer only)");
    // Blob 2 is in the bucket too, but the upstream is faster for b.
    let began = Instant::now();
    get(&b, &blobs[2].0);
    let from_upstream = began.elapsed();
    eprintln!("b: blob 1 from the bucket in {from_bucket:?}, blob 2 from the upstream in {from_upstream:?}");
    assert_eq!(upstream_gets(&blobs[2].0), 2, "blob 2 fetched from the upstream by b too");
    assert!(from_upstream < from_bucket / 2, "{from_upstream:?} against {from_bucket:?} through the bucket");
    let health = tender_e2e::http::get(b.addr, "/api/v1/health").unwrap().text();
    assert!(health.contains(r#""state":"degraded (slow)""#), "/api/v1/health: {health}");
    let metrics = tender_e2e::http::get(b.addr, "/metrics").unwrap().text();
    assert!(metrics.lines().any(|l| l == "tender_bucket_bypassed_slow_total 1"), "{metrics}");
    drop((a, b));
}
