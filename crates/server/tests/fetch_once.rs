//! Fetch once, stream to all, survive upstream faults: an in-process upstream that misbehaves
//! on purpose, with 1 and 32 concurrent clients.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::StreamExt;
use support::*;
use tender_oci::Digest;

const SIZE: usize = 4 * 1024 * 1024;

/// Every client's outcome must be either the right bytes or an incomplete body: never a
/// complete body with a wrong digest.
fn assert_never_complete_and_wrong(got: &[Got], want: &str) {
    for g in got {
        if let (200, Ok(body)) = (g.status, &g.body) {
            if g.content_length == Some(body.len() as u64) {
                assert_eq!(sha(body), want, "a client received a complete body with the wrong digest");
            }
        }
    }
}

async fn fan_out(url: &str, n: usize) -> Vec<Got> {
    join_all((0..n).map(|_| get(url, &[]))).await
}

struct Case {
    name: &'static str,
    faults: Vec<Fault>,
    ignore_range: bool,
    /// Exact number of upstream blob GETs.
    gets: u64,
    /// A resume (`Range: bytes=N-`, 0 < N <= this) is expected.
    resumed_at_most: Option<u64>,
}

async fn check_fault(case: &Case, clients: usize) {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(SIZE, 7);
    let digest = fake.add_blob(body.clone());
    fake.set_faults(case.faults.clone());
    *fake.state.ignore_range.lock().unwrap() = case.ignore_range;
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url(&format!("/v2/ghcr.io/siderolabs/kubelet/blobs/{digest}"));

    let got = fan_out(&url, clients).await;
    assert_never_complete_and_wrong(&got, &digest);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.status, 200, "{}: client {i} status", case.name);
        let b = g.body.as_ref().unwrap_or_else(|e| panic!("{}: client {i} body failed: {e}", case.name));
        assert_eq!(sha(b), digest, "{}: client {i} got wrong bytes", case.name);
    }
    assert_eq!(fake.blob_gets(), case.gets, "{}: upstream transfers with {clients} clients", case.name);
    if let Some(max) = case.resumed_at_most {
        let ranges = fake.state.ranges.lock().unwrap().clone();
        let resumed = ranges.iter().any(|r| {
            r.strip_prefix("bytes=")
                .and_then(|r| r.strip_suffix('-'))
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n > 0 && n <= max)
        });
        assert!(resumed, "{}: expected a resume with Range: bytes=N- (0 < N <= {max}), saw {ranges:?}", case.name);
    }
    // stored, and served from the store from now on
    let again = get(&url, &[]).await;
    assert_eq!(sha(again.body.as_ref().unwrap()), digest);
    assert_eq!(fake.blob_gets(), case.gets, "{}: a stored blob is never fetched again", case.name);
    let report = tender.store.fsck(false).unwrap();
    assert!(report.corrupt.is_empty(), "{}: fsck", case.name);
}

fn cases() -> Vec<Case> {
    let mib = 1024 * 1024;
    vec![
        Case { name: "clean", faults: vec![], ignore_range: false, gets: 1, resumed_at_most: None },
        Case {
            name: "truncated",
            faults: vec![Fault::TruncateAt(mib)],
            ignore_range: false,
            gets: 2,
            resumed_at_most: Some(mib),
        },
        Case {
            name: "reset",
            faults: vec![Fault::ResetAt(mib + mib / 2)],
            ignore_range: false,
            gets: 2,
            resumed_at_most: Some(mib + mib / 2),
        },
        Case {
            name: "stalled",
            faults: vec![Fault::StallAt(2 * mib)],
            ignore_range: false,
            gets: 2,
            resumed_at_most: Some(2 * mib),
        },
        Case {
            name: "range ignored",
            faults: vec![Fault::TruncateAt(mib)],
            ignore_range: true,
            gets: 2,
            resumed_at_most: Some(mib),
        },
        Case {
            name: "429 retry-after",
            faults: vec![Fault::TooManyRequests],
            ignore_range: false,
            gets: 2,
            resumed_at_most: None,
        },
        Case {
            name: "flapping 500",
            faults: vec![Fault::ServerError, Fault::ServerError, Fault::ServerError],
            ignore_range: false,
            gets: 4,
            resumed_at_most: None,
        },
        Case {
            name: "truncated twice then slow",
            faults: vec![Fault::TruncateAt(mib), Fault::TruncateAt(3 * mib), Fault::SlowDrip(64 * mib)],
            ignore_range: false,
            gets: 3,
            resumed_at_most: Some(3 * mib),
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_recover_from_each_fault_with_one_client() {
    for case in cases() {
        check_fault(&case, 1).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_recover_from_each_fault_with_32_clients() {
    for case in cases() {
        check_fault(&case, 32).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_fetch_once_for_64_concurrent_cold_clients() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(SIZE, 11);
    let digest = fake.add_blob(body);
    *fake.state.steady.lock().unwrap() = Some(Fault::SlowDrip(16 * 1024 * 1024));
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url(&format!("/v2/ghcr.io/x/blobs/{digest}"));
    let got = fan_out(&url, 64).await;
    for g in &got {
        assert_eq!(g.status, 200);
        assert_eq!(sha(g.body.as_ref().unwrap()), digest);
    }
    assert_eq!(fake.blob_gets(), 1);
    assert_eq!(fake.state.bytes_sent.load(Ordering::SeqCst), SIZE as u64, "upstream bytes exactly 1.00x the blob");
}

/// On plain HTTP/1, stored bytes go from the page cache to the socket with sendfile; HTTP/2
/// (which frames them) copies. Every body is right either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_send_stored_bytes_with_sendfile_on_plain_http1_only() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(SIZE, 12);
    let digest = fake.add_blob(body.clone());
    *fake.state.steady.lock().unwrap() = Some(Fault::SlowDrip(16 * 1024 * 1024));
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url(&format!("/v2/ghcr.io/x/blobs/{digest}"));
    for g in fan_out(&url, 8).await {
        assert_eq!(sha(g.body.as_ref().unwrap()), digest, "cold, while the fill runs");
    }
    tender.wait_idle().await;
    let sent = || tender.app.metrics().sendfile_bytes.get();
    let before = sent();
    let hot = get(&url, &[]).await;
    assert_eq!(sha(hot.body.as_ref().unwrap()), digest);
    assert_eq!(sent() - before, SIZE as u64, "a hot body goes out with sendfile, every byte");
    let range = get(&url, &[("Range", "bytes=1000-300999")]).await;
    assert_eq!(range.status, 206);
    assert_eq!(range.body.as_ref().unwrap(), &body.slice(1000..301_000));
    assert_eq!(sent() - before, SIZE as u64 + 300_000);
    let h2 = reqwest::Client::builder().no_proxy().http2_prior_knowledge().build().unwrap();
    let resp = h2.get(&url).send().await.unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    assert_eq!(sha(&resp.bytes().await.unwrap()), digest);
    assert_eq!(sent() - before, SIZE as u64 + 300_000, "HTTP/2 copies");
    assert_eq!(fake.blob_gets(), 1);
}

/// A wrong body is discarded, counted and retried once from zero; clients connected to the
/// bad fill are cut short and never get its last byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_discard_a_corrupt_fill_and_retry_once_from_zero() {
    for clients in [1usize, 32] {
        let fake = FakeUpstream::start().await;
        let body = random_bytes(SIZE, 3);
        let digest = fake.add_blob(body);
        fake.set_faults(vec![Fault::WrongByteAt(100)]);
        let tender = Tender::in_front_of(&fake).await;
        let url = tender.url(&format!("/v2/ghcr.io/x/blobs/{digest}"));
        let got = fan_out(&url, clients).await;
        assert_never_complete_and_wrong(&got, &digest);
        // The restart runs on after the cut clients are gone.
        tender.wait_idle().await;
        assert_eq!(fake.blob_gets(), 2, "the corrupt transfer and one restart from zero");
        // whoever was cut short retries and gets the right bytes from the store
        let again = get(&url, &[]).await;
        assert_eq!(sha(again.body.as_ref().unwrap()), digest);
        assert_eq!(fake.blob_gets(), 2);
        let corrupt = tender
            .metrics
            .fills_finished
            .get_or_create(&vec![("upstream".into(), "ghcr.io".into()), ("result".into(), "corrupt".into())])
            .get();
        assert_eq!(corrupt, 1, "the mismatch is counted");
    }
}

/// When every attempt is wrong, nothing is committed, no client gets a complete body, and
/// once the upstream recovers a retrying client gets the right bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_never_serve_a_complete_wrong_body() {
    for clients in [1usize, 32] {
        let fake = FakeUpstream::start().await;
        let body = random_bytes(SIZE, 5);
        let digest = fake.add_blob(body);
        *fake.state.steady.lock().unwrap() = Some(Fault::WrongByteAt(SIZE as u64 - 1));
        let tender = Tender::in_front_of(&fake).await;
        let url = tender.url(&format!("/v2/ghcr.io/x/blobs/{digest}"));
        let got = fan_out(&url, clients).await;
        for g in &got {
            if let Ok(b) = &g.body {
                assert!(b.len() < SIZE, "the final byte is withheld until verified");
            }
        }
        assert!(tender.store.object_len(&digest.parse::<Digest>().unwrap()).is_none(), "nothing corrupt is committed");
        // fills outlive their clients: let the last corrupt one end before the upstream recovers
        tender.wait_idle().await;
        *fake.state.steady.lock().unwrap() = None;
        let again = get(&url, &[]).await;
        assert_eq!(again.status, 200);
        assert_eq!(sha(again.body.as_ref().unwrap()), digest);
        assert!(tender.store.fsck(false).unwrap().corrupt.is_empty());
    }
}

/// A body that is shorter than its Content-Length is never committed as complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_not_commit_a_body_shorter_than_announced() {
    let fake = FakeUpstream::start().await;
    let digest = fake.add_blob(random_bytes(SIZE, 9));
    *fake.state.steady.lock().unwrap() = Some(Fault::LongerContentLength);
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url(&format!("/v2/ghcr.io/x/blobs/{digest}"));
    let got = fan_out(&url, 8).await;
    assert_never_complete_and_wrong(&got, &digest);
    assert!(tender.store.object_len(&digest.parse().unwrap()).is_none());
    tender.wait_idle().await;
    *fake.state.steady.lock().unwrap() = None;
    let again = get(&url, &[]).await;
    assert_eq!(sha(again.body.as_ref().unwrap()), digest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_complete_the_fill_after_the_client_disconnects() {
    let fake = FakeUpstream::start().await;
    let digest = fake.add_blob(random_bytes(SIZE, 13));
    *fake.state.steady.lock().unwrap() = Some(Fault::SlowDrip(8 * 1024 * 1024));
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url(&format!("/v2/ghcr.io/x/blobs/{digest}"));
    {
        let resp = client().get(&url).send().await.unwrap();
        let mut stream = resp.bytes_stream();
        let first = stream.next().await.unwrap().unwrap();
        assert!(!first.is_empty());
        // dropped here: the client goes away mid-body
    }
    let d: Digest = digest.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while tender.store.object_len(&d).is_none() {
        assert!(Instant::now() < deadline, "the fill was not completed after the client left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = get(&url, &[]).await;
    assert_eq!(sha(again.body.as_ref().unwrap()), digest);
    assert_eq!(fake.blob_gets(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_answer_a_range_while_the_fill_is_running() {
    let fake = FakeUpstream::start().await;
    let body = random_bytes(SIZE, 17);
    let digest = fake.add_blob(body.clone());
    // 4 MiB at 2 MiB/s: about 2 s of fill
    *fake.state.steady.lock().unwrap() = Some(Fault::SlowDrip(2 * 1024 * 1024));
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url(&format!("/v2/ghcr.io/x/blobs/{digest}"));
    let full = tokio::spawn({
        let url = url.clone();
        async move { get(&url, &[]).await }
    });
    let started = Instant::now();
    let part = get(&url, &[("Range", "bytes=1000-1999")]).await;
    assert_eq!(part.status, 206);
    assert_eq!(part.body.as_ref().unwrap(), &body.slice(1000..2000));
    assert!(
        tender.store.object_len(&digest.parse().unwrap()).is_none(),
        "the range was answered before the fill finished ({:?})",
        started.elapsed()
    );
    let full = full.await.unwrap();
    assert_eq!(sha(full.body.as_ref().unwrap()), digest);
    assert_eq!(fake.blob_gets(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_send_headers_and_first_bytes_before_the_fill_ends() {
    let fake = FakeUpstream::start().await;
    let digest = fake.add_blob(random_bytes(SIZE, 19));
    *fake.state.steady.lock().unwrap() = Some(Fault::SlowDrip(2 * 1024 * 1024));
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url(&format!("/v2/ghcr.io/x/blobs/{digest}"));
    let resp = client().get(&url).send().await.unwrap();
    assert_eq!(resp.content_length(), Some(SIZE as u64), "Content-Length goes out at once");
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    assert!(tender.store.object_len(&digest.parse().unwrap()).is_none(), "first body bytes arrived mid-fill");
}

/// Upstream down: tags resolve to the last known digest, stored content keeps serving,
/// /readyz stays ready and the metrics say the upstream is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_keep_serving_when_the_upstream_is_down() {
    let fake = FakeUpstream::start().await;
    let blob = fake.add_blob(random_bytes(1024, 23));
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{blob}","size":1024}},"layers":[]}}"#
    );
    let mdigest = fake.add_manifest(
        "siderolabs/kubelet",
        "v1",
        "application/vnd.oci.image.manifest.v1+json",
        manifest.as_bytes(),
    );
    let mut settings = fast_settings();
    settings.tag_ttl = Duration::ZERO;
    settings.attempts = 2;
    let tender = Tender::start(vec![upstream_settings("ghcr.io", &fake.url())], settings).await;
    let murl = tender.url("/v2/ghcr.io/siderolabs/kubelet/manifests/v1");
    let burl = tender.url(&format!("/v2/ghcr.io/siderolabs/kubelet/blobs/{blob}"));
    assert_eq!(get(&murl, &[]).await.status, 200);
    assert_eq!(get(&burl, &[]).await.status, 200);
    // The blob's fill commits just after its client got the last byte.
    tender.wait_idle().await;

    *fake.state.down.lock().unwrap() = true;
    let resp = client().get(&murl).send().await.unwrap();
    assert_eq!(resp.status(), 200, "stale-if-error");
    assert_eq!(resp.headers()["docker-content-digest"], mdigest.as_str());
    assert_eq!(get(&burl, &[]).await.status, 200);
    assert_eq!(get(&tender.url("/readyz"), &[]).await.status, 200);
    let metrics = String::from_utf8(get(&tender.url("/metrics"), &[]).await.body.unwrap().to_vec()).unwrap();
    assert!(metrics.contains(r#"tender_upstream_up{upstream="ghcr.io"} 0"#), "{metrics}");
    // a tag we never saw cannot be served
    assert_eq!(get(&tender.url("/v2/ghcr.io/siderolabs/kubelet/manifests/v2"), &[]).await.status, 503);
}

/// Past the maximum stale age, a tag is not served from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_not_serve_tags_older_than_the_stale_limit() {
    let fake = FakeUpstream::start().await;
    let m = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#;
    fake.add_manifest("a/b", "v1", "application/vnd.oci.image.manifest.v1+json", m);
    let mut settings = fast_settings();
    settings.tag_ttl = Duration::ZERO;
    settings.stale_max_age = tender_fetch::StaleLimit::Max(Duration::ZERO);
    settings.attempts = 1;
    let tender = Tender::start(vec![upstream_settings("ghcr.io", &fake.url())], settings).await;
    let url = tender.url("/v2/ghcr.io/a/b/manifests/v1");
    assert_eq!(get(&url, &[]).await.status, 200);
    *fake.state.down.lock().unwrap() = true;
    // the record is at least 0 s old; wait out the 1 s clock granularity
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(get(&url, &[]).await.status, 503);
}
