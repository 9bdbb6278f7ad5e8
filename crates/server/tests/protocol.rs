//! The OCI pull API's edge cases against an in-process upstream: Accept negotiation, Range,
//! HEAD, ETag, error bodies, name validation, hostile `ns`, the auth challenge, redirects.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// The least a manifest without `mediaType` must hold to be one: a config and layers.
const BARE: &[u8] = br#"{"config":{},"layers":[]}"#;

use support::*;

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const ALL_MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// A multi-arch tag `v1` in `a/multi`: a Docker manifest list naming arm64 first, then amd64.
/// Returns (list, amd64, arm64) digests.
fn add_multi_arch(fake: &FakeUpstream) -> (String, String, String) {
    let child = |arch: &str| {
        format!(r#"{{"schemaVersion":2,"mediaType":"{DOCKER_MANIFEST}","config":{{"digest":"{arch}"}},"layers":[]}}"#)
    };
    let (amd, arm) = (child("amd64"), child("arm64"));
    let amd_d = fake.add_manifest("a/multi", "amd64-only", DOCKER_MANIFEST, amd.as_bytes());
    let arm_d = fake.add_manifest("a/multi", "arm64-only", DOCKER_MANIFEST, arm.as_bytes());
    let entry = |d: &str, len: usize, arch: &str| {
        format!(
            r#"{{"mediaType":"{DOCKER_MANIFEST}","digest":"{d}","size":{len},"platform":{{"os":"linux","architecture":"{arch}"}}}}"#
        )
    };
    let list = format!(
        r#"{{"schemaVersion":2,"mediaType":"{DOCKER_LIST}","manifests":[{},{}]}}"#,
        entry(&arm_d, arm.len(), "arm64"),
        entry(&amd_d, amd.len(), "amd64")
    );
    let list_d = fake.add_manifest("a/multi", "v1", DOCKER_LIST, list.as_bytes());
    (list_d, amd_d, arm_d)
}

async fn error_code(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    let v: serde_json::Value = resp.json().await.expect("an OCI error body");
    (status, v["errors"][0]["code"].as_str().unwrap_or("").to_string())
}

#[tokio::test]
async fn should_answer_the_base_endpoint() {
    let fake = FakeUpstream::start().await;
    let tender = Tender::in_front_of(&fake).await;
    let resp = client().get(tender.url("/v2/")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["docker-distribution-api-version"], "registry/2.0");
    assert_eq!(fake.requests(), 0, "/v2/ is answered locally");
}

#[tokio::test]
async fn should_negotiate_manifest_media_types_with_accept() {
    let fake = FakeUpstream::start().await;
    let index = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
    let digest = fake.add_manifest("siderolabs/kubelet", "v1", OCI_INDEX, index);
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url("/v2/ghcr.io/siderolabs/kubelet/manifests/v1");

    let resp = client().get(&url).header("Accept", format!("{OCI_INDEX}, {OCI_MANIFEST}")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], OCI_INDEX);
    assert_eq!(resp.headers()["docker-content-digest"], digest.as_str());
    assert_eq!(resp.headers()["etag"], format!("\"{digest}\"").as_str());
    assert_eq!(resp.headers()["content-length"], index.len().to_string().as_str());
    assert_eq!(resp.bytes().await.unwrap().as_ref(), index);
    // the tag is resolved with every manifest type, whatever the client named
    assert_eq!(fake.state.accepts.lock().unwrap().last().unwrap(), ALL_MANIFESTS);

    // a cached tag whose type the client accepts is served without asking upstream
    let gets = fake.state.manifest_gets.load(Ordering::SeqCst);
    let resp = client().get(&url).header("Accept", OCI_INDEX).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(fake.state.manifest_gets.load(Ordering::SeqCst), gets);

    // a client that does not accept the index gets its platform manifest from the stored
    // index; this one has none: 404 MANIFEST_UNKNOWN, as distribution answers, and no question
    // upstream with the client's narrowed Accept
    let resp = client().get(&url).header("Accept", DOCKER_MANIFEST).send().await.unwrap();
    assert_eq!(error_code(resp).await, (404, "MANIFEST_UNKNOWN".into()));
    assert!(fake.state.accepts.lock().unwrap().iter().all(|a| a != DOCKER_MANIFEST));

    // by digest: served from the store
    let gets = fake.state.manifest_gets.load(Ordering::SeqCst);
    let resp =
        client().get(tender.url(&format!("/v2/ghcr.io/siderolabs/kubelet/manifests/{digest}"))).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(fake.state.manifest_gets.load(Ordering::SeqCst), gets);
}

/// Issue 37: the upstream is asked with the client's own further types (besides the image
/// types tender needs), so an artifact of a custom type reaches a client that asks for it from
/// an upstream that enforces Accept; a client that does not list the type gets 404
/// MANIFEST_UNKNOWN, as the reference registry answers, by tag and by digest.
#[tokio::test]
async fn should_ask_the_upstream_with_the_clients_artifact_types() {
    let fake = FakeUpstream::start().await;
    const ARTIFACT: &str = "application/vnd.example.artifact.v1+json";
    let body = br#"{"schemaVersion":2,"mediaType":"application/vnd.example.artifact.v1+json","blobs":[]}"#;
    let digest = fake.add_manifest("a/art", "v1", ARTIFACT, body);
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url("/v2/ghcr.io/a/art/manifests/v1");
    let resp = client().get(&url).header("Accept", format!("{OCI_MANIFEST}, {ARTIFACT}")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], ARTIFACT);
    assert_eq!(resp.headers()["docker-content-digest"], digest.as_str());
    assert_eq!(resp.bytes().await.unwrap().as_ref(), body);
    let asked = fake.state.accepts.lock().unwrap().last().unwrap().clone();
    assert!(asked.contains(ARTIFACT) && asked.contains(OCI_INDEX) && asked.contains(DOCKER_LIST), "{asked}");
    // stored now: a client that does not list the type is refused, by tag and by digest
    for reference in ["v1", digest.as_str()] {
        let url = tender.url(&format!("/v2/ghcr.io/a/art/manifests/{reference}"));
        let resp = client().get(&url).header("Accept", format!("{OCI_MANIFEST}, {OCI_INDEX}")).send().await.unwrap();
        assert_eq!(error_code(resp).await, (404, "MANIFEST_UNKNOWN".into()), "{reference}");
    }
    // a client with no Accept at all takes anything
    let resp = client().get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

/// Issue 17 item 1: a client that accepts only Docker v2s2 never changes what a tag means for
/// the others, and gets the linux/amd64 manifest chosen from the stored list — also with the
/// upstream down.
#[tokio::test]
async fn should_never_let_a_narrow_accept_change_the_tag_record() {
    let fake = FakeUpstream::start().await;
    let (list, amd, arm) = add_multi_arch(&fake);
    // every request revalidates the tag, so the upstream's answer is what counts each time
    let settings = tender_fetch::FetchSettings { tag_ttl: std::time::Duration::ZERO, ..fast_settings() };
    let tender = Tender::start(vec![upstream_settings("ghcr.io", &fake.url())], settings).await;
    let url = tender.url("/v2/ghcr.io/a/multi/manifests/v1");
    let digest_of = |resp: &reqwest::Response| resp.headers()["docker-content-digest"].to_str().unwrap().to_string();
    for down in [false, true] {
        *fake.state.down.lock().unwrap() = down;
        let narrow = client().get(&url).header("Accept", DOCKER_MANIFEST).send().await.unwrap();
        assert_eq!(narrow.status(), 200, "down={down}");
        assert_eq!(narrow.headers()["content-type"], DOCKER_MANIFEST, "down={down}");
        assert_eq!(digest_of(&narrow), amd, "down={down}: linux/amd64 from the list");
        let record = tender.store.tag_get("ghcr.io", "a/multi", "v1").unwrap().expect("a tag record");
        assert_eq!(record.digest.to_string(), list, "down={down}: the record names the list");
        assert_eq!(record.media_type, DOCKER_LIST);
        let full = client().get(&url).header("Accept", ALL_MANIFESTS).send().await.unwrap();
        assert_eq!(full.status(), 200, "down={down}");
        assert_eq!(digest_of(&full), list, "down={down}");
        assert_eq!(full.headers()["content-type"], DOCKER_LIST);
        if !down {
            // the arm64 client then follows the list by digest
            let resp = client().get(tender.url(&format!("/v2/ghcr.io/a/multi/manifests/{arm}"))).send().await.unwrap();
            assert_eq!(resp.status(), 200);
        }
    }
    // tags were always resolved upstream with the complete Accept set
    let accepts = fake.state.accepts.lock().unwrap().clone();
    assert!(accepts.iter().all(|a| a.contains(DOCKER_LIST) && a.contains(OCI_INDEX)), "{accepts:?}");
}

#[tokio::test]
async fn should_answer_head_with_length_and_digest_but_no_body() {
    let fake = FakeUpstream::start().await;
    let m = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#;
    let md = fake.add_manifest("a/b", "v1", OCI_MANIFEST, m);
    let blob = random_bytes(5000, 1);
    let bd = fake.add_blob(blob.clone());
    let tender = Tender::in_front_of(&fake).await;

    let resp = client().head(tender.url("/v2/ghcr.io/a/b/manifests/v1")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-length"], m.len().to_string().as_str());
    assert_eq!(resp.headers()["docker-content-digest"], md.as_str());
    assert!(resp.bytes().await.unwrap().is_empty());

    // cold blob HEAD: answered from the upstream's HEAD, no transfer
    let url = tender.url(&format!("/v2/ghcr.io/a/b/blobs/{bd}"));
    let resp = client().head(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-length"], "5000");
    assert_eq!(fake.blob_gets(), 0);

    get(&url, &[]).await;
    let resp = client().head(&url).send().await.unwrap();
    assert_eq!(resp.headers()["content-length"], "5000");
    assert_eq!(resp.headers()["accept-ranges"], "bytes");
    assert_eq!(resp.headers()["docker-content-digest"], bd.as_str());
}

#[tokio::test]
async fn should_serve_ranges_and_refuse_unsatisfiable_ones() {
    let fake = FakeUpstream::start().await;
    let blob = random_bytes(10_000, 2);
    let d = fake.add_blob(blob.clone());
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}"));
    for warm in [false, true] {
        let resp = client().get(&url).header("Range", "bytes=100-199").send().await.unwrap();
        assert_eq!(resp.status(), 206, "warm={warm}");
        assert_eq!(resp.headers()["content-range"], "bytes 100-199/10000");
        assert_eq!(resp.headers()["content-length"], "100");
        assert_eq!(resp.bytes().await.unwrap(), blob.slice(100..200));

        let resp = client().get(&url).header("Range", "bytes=-10").send().await.unwrap();
        assert_eq!(resp.status(), 206);
        assert_eq!(resp.bytes().await.unwrap(), blob.slice(9990..));

        // 416 with its Content-Range, as the reference registry answers it: no error body (no
        // spec error code is about ranges)
        let resp = client().get(&url).header("Range", "bytes=10000-").send().await.unwrap();
        assert_eq!(resp.status(), 416);
        assert_eq!(resp.headers()["content-range"], "bytes */10000");
        assert!(resp.bytes().await.unwrap().is_empty());
    }
    // If-Range with another validator: the whole object
    let resp =
        client().get(&url).header("Range", "bytes=0-0").header("If-Range", "\"sha256:other\"").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    // If-None-Match: 304
    let resp = client().get(&url).header("If-None-Match", format!("\"{d}\"")).send().await.unwrap();
    assert_eq!(resp.status(), 304);
    assert_eq!(fake.blob_gets(), 1);
}

#[tokio::test]
async fn should_answer_if_none_match_with_304_while_the_object_is_still_filling() {
    let fake = FakeUpstream::start().await;
    let blob = random_bytes(1 << 20, 3);
    let d = fake.add_blob(blob.clone());
    // The upstream stalls half-way: the fill stays open for the whole test.
    fake.set_faults(vec![Fault::StallAt(1 << 19)]);
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}"));
    // A whole-body reader holds the fill open (a range would wait for the verdict: issue 32).
    let mut first = client().get(&url).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let head = first.chunk().await.unwrap().unwrap();
    assert_eq!(head, blob.slice(0..head.len()));
    let resp = client().get(&url).header("If-None-Match", format!("W/\"{d}\"")).send().await.unwrap();
    assert_eq!(resp.status(), 304);
    let resp = client().get(&url).header("If-None-Match", "\"sha256:other\"").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-length"], (1u64 << 20).to_string().as_str());
    assert_eq!(fake.blob_gets(), 1);
    drop(first);
}

#[tokio::test]
async fn should_use_oci_error_bodies_with_real_statuses() {
    let fake = FakeUpstream::start().await;
    let tender = Tender::in_front_of(&fake).await;
    let zero = format!("sha256:{}", "0".repeat(64));
    let cases: Vec<(reqwest::Method, String, (u16, &str))> = vec![
        (reqwest::Method::GET, "/v2/ghcr.io/a/b/manifests/nope".into(), (404, "MANIFEST_UNKNOWN")),
        (reqwest::Method::GET, format!("/v2/ghcr.io/a/b/blobs/{zero}"), (404, "BLOB_UNKNOWN")),
        (reqwest::Method::GET, "/v2/ghcr.io/A/b/manifests/v1".into(), (400, "NAME_INVALID")),
        (reqwest::Method::GET, "/v2/ghcr.io/a/b/blobs/sha256:xyz".into(), (400, "DIGEST_INVALID")),
        (reqwest::Method::GET, "/v2/ghcr.io/a/b/blobs/md5:abc".into(), (400, "DIGEST_INVALID")),
        (reqwest::Method::GET, format!("/v2/ghcr.io/a/b/blobs/blake3:{}", "0".repeat(64)), (400, "DIGEST_INVALID")),
        (reqwest::Method::GET, format!("/v2/ghcr.io/a/b/blobs/sha512:{}", "A".repeat(128)), (400, "DIGEST_INVALID")),
        (reqwest::Method::GET, format!("/v2/ghcr.io/a/b/blobs/sha512:{}", "0".repeat(64)), (400, "DIGEST_INVALID")),
        // a reference that is neither a tag nor a digest names no manifest (the reference
        // registry: 404); one that tries to be a digest is an invalid digest
        (
            reqwest::Method::GET,
            format!("/v2/ghcr.io/a/b/manifests/sha512:{}", "0".repeat(127)),
            (400, "DIGEST_INVALID"),
        ),
        (reqwest::Method::GET, "/v2/ghcr.io/a/b/manifests/-bad".into(), (404, "MANIFEST_UNKNOWN")),
        (reqwest::Method::POST, "/v2/ghcr.io/a/b/blobs/uploads/".into(), (405, "UNSUPPORTED")),
        (reqwest::Method::PUT, "/v2/ghcr.io/a/b/manifests/v1".into(), (405, "UNSUPPORTED")),
        (reqwest::Method::DELETE, format!("/v2/ghcr.io/a/b/blobs/{zero}"), (405, "UNSUPPORTED")),
        // (clients normalise dot segments: this arrives as /etc/passwd/..., outside /v2)
        (reqwest::Method::GET, "/v2/../../etc/passwd/manifests/x".into(), (404, "NAME_UNKNOWN")),
        (reqwest::Method::GET, "/v2/a%2f..%2fb/manifests/latest".into(), (400, "NAME_INVALID")),
    ];
    for (method, path, want) in cases {
        let resp = client().request(method.clone(), tender.url(&path)).send().await.unwrap();
        assert_eq!(resp.headers()["content-type"], "application/json", "{method} {path}");
        assert_eq!(error_code(resp).await, (want.0, want.1.to_string()), "{method} {path}");
    }
    // a page size that is not a number is ignored, as the reference registry ignores it
    let before = fake.state.paths.lock().unwrap().len();
    let resp = client().get(tender.url("/v2/ghcr.io/a/b/tags/list?n=abc&last=x")).send().await.unwrap();
    assert_ne!(resp.status(), 400);
    let asked = fake.state.paths.lock().unwrap()[before..].to_vec();
    assert!(asked.iter().all(|p| !p.contains("n=abc")), "{asked:?}");
    // invalid input never reached the upstream; unknown objects were asked about
    let paths = fake.state.paths.lock().unwrap().clone();
    assert!(paths.iter().all(|p| !p.contains("..") && !p.contains("A/b") && !p.contains("uploads")), "{paths:?}");
}

/// Send a request line as is, without a client normalising it; return the status.
async fn raw_status(addr: std::net::SocketAddr, target: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out);
    text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn should_refuse_dot_segments_sent_raw() {
    let fake = FakeUpstream::start().await;
    let tender = Tender::in_front_of(&fake).await;
    for target in [
        "/v2/../../etc/passwd/manifests/x",
        "/v2/a/../../b/manifests/x",
        "/v2/a/./b/manifests/x",
        "/v2/a/b/blobs/sha256:../../../../etc/passwd",
        "/v2/a/b/manifests/..%2f..%2fetc",
        "/v2/%2e%2e/b/manifests/x",
    ] {
        let status = raw_status(tender.addr, target).await;
        assert!(status == 400 || status == 404, "{target}: {status}");
    }
    assert_eq!(fake.requests(), 0);
}

#[tokio::test]
async fn should_refuse_hostile_ns_values_without_any_outbound_connection() {
    let fake = FakeUpstream::start().await;
    fake.add_manifest("a/b", "v1", OCI_MANIFEST, BARE);
    let tender = Tender::in_front_of(&fake).await;
    for ns in [
        "evil.example.com",
        "127.0.0.1:22",
        "169.254.169.254",
        "ghcr.io.evil.com",
        "ghcr.io%00",
        "ghcr.io%2F..",
        "..%2F..",
        "",
        "ghcr.io:443@evil.com",
        "localhost",
        &"a".repeat(5000),
    ] {
        let resp = client().get(tender.url(&format!("/v2/a/b/manifests/v1?ns={ns}"))).send().await.unwrap();
        assert_eq!(error_code(resp).await, (404, "NAME_UNKNOWN".into()), "ns={ns}");
    }
    assert_eq!(fake.requests(), 0, "no outbound request for an unknown ns");
    // the configured one routes (case-insensitively, as hosts are)
    let resp = client().get(tender.url("/v2/a/b/manifests/v1?ns=GHCR.io")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn should_route_by_ns_then_prefix_then_default() {
    let ghcr = FakeUpstream::start().await;
    let hub = FakeUpstream::start().await;
    ghcr.add_manifest("siderolabs/kubelet", "v1", OCI_MANIFEST, b"{\"from\":\"ghcr\",\"config\":{},\"layers\":[]}");
    hub.add_manifest("library/alpine", "3", OCI_MANIFEST, b"{\"from\":\"hub\",\"config\":{},\"layers\":[]}");
    hub.add_manifest(
        "siderolabs/kubelet",
        "v1",
        OCI_MANIFEST,
        b"{\"from\":\"hub-kubelet\",\"config\":{},\"layers\":[]}",
    );
    let tender = Tender::start(
        vec![upstream_settings("docker.io", &hub.url()), upstream_settings("ghcr.io", &ghcr.url())],
        fast_settings(),
    )
    .await;
    let body = |p: &'static str| {
        let url = tender.url(p);
        async move { String::from_utf8(get(&url, &[]).await.body.unwrap().to_vec()).unwrap() }
    };
    assert_eq!(
        body("/v2/siderolabs/kubelet/manifests/v1?ns=ghcr.io").await,
        "{\"from\":\"ghcr\",\"config\":{},\"layers\":[]}"
    );
    assert_eq!(
        body("/v2/ghcr.io/siderolabs/kubelet/manifests/v1").await,
        "{\"from\":\"ghcr\",\"config\":{},\"layers\":[]}"
    );
    assert_eq!(
        body("/v2/siderolabs/kubelet/manifests/v1").await,
        "{\"from\":\"hub-kubelet\",\"config\":{},\"layers\":[]}"
    );
    // docker.io: one-component names get library/
    assert_eq!(body("/v2/alpine/manifests/3").await, "{\"from\":\"hub\",\"config\":{},\"layers\":[]}");
    assert_eq!(body("/v2/alpine/manifests/3?ns=docker.io").await, "{\"from\":\"hub\",\"config\":{},\"layers\":[]}");
    assert_eq!(body("/v2/docker.io/alpine/manifests/3").await, "{\"from\":\"hub\",\"config\":{},\"layers\":[]}");
}

#[tokio::test]
async fn should_do_the_bearer_token_dance_and_cache_the_token() {
    let fake = FakeUpstream::start().await;
    *fake.state.require_token.lock().unwrap() = Some("t0k3n".into());
    fake.add_manifest("a/b", "v1", OCI_MANIFEST, BARE);
    let blob = fake.add_blob(random_bytes(1000, 4));
    let tender = Tender::in_front_of(&fake).await;
    assert_eq!(get(&tender.url("/v2/ghcr.io/a/b/manifests/v1"), &[]).await.status, 200);
    assert_eq!(get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{blob}")), &[]).await.status, 200);
    assert_eq!(fake.state.token_requests.load(Ordering::SeqCst), 1, "the token is cached for the scope");
    let token_req = fake.state.paths.lock().unwrap().iter().find(|p| p.starts_with("/token")).cloned().unwrap();
    assert!(token_req.contains("scope=repository%3Aa%2Fb%3Apull"), "{token_req}");
    assert!(token_req.contains("service=fake"), "{token_req}");
}

#[tokio::test]
async fn should_refuse_a_manifest_whose_digest_does_not_match() {
    let fake = FakeUpstream::start().await;
    let body = br#"{"schemaVersion":2,"layers":[]}"#;
    fake.add_manifest("a/b", "v1", OCI_MANIFEST, body);
    let wrong = format!("sha256:{}", "1".repeat(64));
    // asking by a digest the upstream's bytes do not have
    fake.add_manifest_at("a/b", &wrong, OCI_MANIFEST, body);
    let tender = Tender::in_front_of(&fake).await;
    let resp = client().get(tender.url(&format!("/v2/ghcr.io/a/b/manifests/{wrong}"))).send().await.unwrap();
    let status = resp.status();
    assert_eq!(status, 502, "{:?}", resp.text().await);
    assert!(tender.store.object_len(&wrong.parse().unwrap()).is_none());
}

/// Where a committed object of `digest` (`<alg>:<hex>`) lives in the data directory.
fn object_file(tender: &Tender, digest: &str) -> std::path::PathBuf {
    let (alg, hex) = digest.split_once(':').unwrap();
    tender.dir.path().join("objects").join(alg).join(&hex[..2]).join(hex)
}

/// Every file under `objects/`, whatever its algorithm.
fn object_files(tender: &Tender) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![tender.dir.path().join("objects")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// Issue 17, item 4: a blob and a manifest addressed by `sha512:` are verified with sha512,
/// stored under `objects/sha512/` and served byte-exact with the digest the client asked for;
/// the upstream naming the manifest by its sha256 (as docker-registry does) changes nothing.
#[tokio::test]
async fn should_serve_sha512_blobs_and_manifests_byte_exact() {
    let fake = FakeUpstream::start().await;
    let blob = random_bytes(1 << 20, 51);
    let d = fake.add_blob_sha512(blob.clone());
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{d}","size":{}}},"layers":[]}}"#,
        blob.len()
    );
    let md = fake.add_manifest_sha512("a/b", OCI_MANIFEST, manifest.as_bytes());
    let tender = Tender::in_front_of(&fake).await;

    let url = tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}"));
    let resp = client().get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["docker-content-digest"], d.as_str());
    assert_eq!(resp.headers()["etag"], format!("\"{d}\"").as_str());
    assert_eq!(resp.bytes().await.unwrap(), blob);
    tender.wait_idle().await;
    assert_eq!(std::fs::read(object_file(&tender, &d)).unwrap(), blob, "stored under objects/sha512/");
    let resp = client().get(&url).header("Range", "bytes=10-19").send().await.unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(resp.bytes().await.unwrap(), blob.slice(10..20));
    let resp = client().head(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["docker-content-digest"], d.as_str());
    assert_eq!(resp.headers()["content-length"], blob.len().to_string().as_str());
    assert_eq!(fake.blob_gets(), 1, "the second GET, the range and the HEAD are hits");

    let murl = tender.url(&format!("/v2/ghcr.io/a/b/manifests/{md}"));
    for _ in 0..2 {
        let resp = client().get(&murl).header("Accept", OCI_MANIFEST).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["docker-content-digest"], md.as_str());
        assert_eq!(resp.headers()["content-type"], OCI_MANIFEST);
        assert_eq!(resp.bytes().await.unwrap().as_ref(), manifest.as_bytes());
    }
    assert_eq!(fake.state.manifest_gets.load(Ordering::SeqCst), 1, "the second GET is a hit");
    assert_eq!(std::fs::read(object_file(&tender, &md)).unwrap(), manifest.as_bytes());
    let report = tender.store.fsck(false).unwrap();
    assert_eq!((report.checked, report.corrupt.len(), report.stray.len()), (2, 0, 0), "{report:?}");
}

/// A body that does not hash to the sha512 asked for is refused like a sha256 one: a full-body
/// client never gets the last byte, nothing appears under `objects/`, and a manifest is a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_never_make_a_wrong_sha512_body_visible() {
    let fake = FakeUpstream::start().await;
    let size = 1 << 20;
    let blob = random_bytes(size, 52);
    let d = fake.add_blob_sha512(blob.clone());
    *fake.state.steady.lock().unwrap() = Some(Fault::WrongByteAt(size as u64 - 1));
    let body = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#;
    let wrong = sha512(b"other bytes");
    fake.add_manifest_at("a/b", &wrong, OCI_MANIFEST, body);
    let tender = Tender::in_front_of(&fake).await;

    let url = tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}"));
    let got = get(&url, &[]).await;
    assert_eq!(got.status, 200, "headers go out before the verdict");
    if let Ok(b) = &got.body {
        assert!(b.len() < size, "the final byte is withheld until verified");
    }
    let resp = client().get(tender.url(&format!("/v2/ghcr.io/a/b/manifests/{wrong}"))).send().await.unwrap();
    let status = resp.status();
    assert_eq!(status, 502, "{:?}", resp.text().await);
    tender.wait_idle().await;
    assert!(object_files(&tender).is_empty(), "{:?}", object_files(&tender));

    *fake.state.steady.lock().unwrap() = None;
    let again = get(&url, &[]).await;
    assert_eq!(again.status, 200);
    assert!(again.body.unwrap() == blob, "byte-exact once the upstream sends the right bytes");
}

/// A stored sha512 blob that is not yet known in an upstream is confirmed there with a HEAD;
/// the sha256 `Docker-Content-Digest` docker-registry answers with is no refusal.
#[tokio::test]
async fn should_confirm_a_stored_sha512_blob_with_an_upstream_that_names_it_by_sha256() {
    let fake = FakeUpstream::start().await;
    let blob = random_bytes(3000, 53);
    let d = fake.add_blob_sha512(blob.clone());
    let tender = Tender::in_front_of(&fake).await;
    let path = object_file(&tender, &d);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, &blob).unwrap();
    let got = get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}")), &[]).await;
    assert_eq!(got.status, 200, "{:?}", got.body.map(|b| String::from_utf8_lossy(&b).into_owned()));
    assert!(got.body.unwrap() == blob, "byte-exact");
    assert_eq!((fake.state.blob_heads.load(Ordering::SeqCst), fake.blob_gets()), (1, 0));
}

/// A tag whose upstream names its manifest by sha512 is verified with sha512 and recorded (and
/// served) under that digest; a body that does not match the announced sha512 is refused.
#[tokio::test]
async fn should_verify_a_tag_announced_by_sha512_with_sha512() {
    let fake = FakeUpstream::start().await;
    *fake.state.announce_sha512.lock().unwrap() = true;
    let body = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#;
    fake.add_manifest("a/b", "v1", OCI_MANIFEST, body);
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url("/v2/ghcr.io/a/b/manifests/v1");
    for _ in 0..2 {
        let resp = client().get(&url).header("Accept", OCI_MANIFEST).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["docker-content-digest"], sha512(body).as_str());
        assert_eq!(resp.bytes().await.unwrap().as_ref(), body);
    }
    assert_eq!(fake.state.manifest_gets.load(Ordering::SeqCst), 1, "the second GET is a hit");
    assert_eq!(std::fs::read(object_file(&tender, &sha512(body))).unwrap(), body);
    let record = tender.store.tag_get("ghcr.io", "a/b", "v1").unwrap().unwrap();
    assert_eq!(record.digest.to_string(), sha512(body));

    // The upstream announces a sha512 its body does not have.
    fake.add_manifest("a/c", "v1", OCI_MANIFEST, body);
    *fake.state.announce.lock().unwrap() = Some(sha512(b"other bytes"));
    let resp = client().get(tender.url("/v2/ghcr.io/a/c/manifests/v1")).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    assert!(tender.store.tag_get("ghcr.io", "a/c", "v1").unwrap().is_none(), "no tag record");
}

#[tokio::test]
async fn should_pass_tags_through_with_the_name_the_client_asked_for() {
    let fake = FakeUpstream::start().await;
    let tender = Tender::in_front_of(&fake).await;
    let resp = client().get(tender.url("/v2/ghcr.io/a/b/tags/list?n=10&last=a")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["tags"], serde_json::json!(["a", "b"]));
    assert_eq!(v["name"], "ghcr.io/a/b", "the name the client asked for, not the upstream's a/b");
    assert!(fake.state.paths.lock().unwrap().iter().any(|p| p == "/v2/a/b/tags/list?n=10&last=a"));
    let resp = client().get(tender.url("/v2/a/b/tags/list?ns=ghcr.io")).send().await.unwrap();
    assert_eq!(resp.headers()["oci-namespace"], "ghcr.io");
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["name"], "a/b");
}

/// Follow `Link` from `path` through tender like a client; every page's tags, in order.
async fn follow_pages(tender: &Tender, path: &str, ns: Option<&str>) -> Vec<String> {
    let (mut out, mut next, mut pages) = (Vec::new(), Some(path.to_string()), 0);
    while let Some(p) = next.take() {
        pages += 1;
        assert!(pages < 50, "pagination does not end: {out:?}");
        let resp = client().get(tender.url(&p)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{p}");
        if let Some(l) = resp.headers().get("link") {
            let l = l.to_str().unwrap();
            let target = l.strip_prefix('<').and_then(|l| l.split_once('>')).map(|(t, _)| t.to_string()).unwrap();
            assert!(target.starts_with("/v2/"), "Link is tender's own relative path: {l}");
            assert!(l.ends_with(r#"; rel="next""#), "{l}");
            if let Some(ns) = ns {
                assert!(target.contains(&format!("ns={ns}")), "Link keeps ns: {l}");
            }
            next = Some(target);
        }
        let v: serde_json::Value = resp.json().await.unwrap();
        let list = v.get("tags").or(v.get("manifests")).and_then(|t| t.as_array()).cloned().unwrap_or_default();
        out.extend(list.iter().map(|t| t.as_str().map(str::to_string).unwrap_or_else(|| t["digest"].to_string())));
    }
    out
}

/// Issue 17 item 3: `n`, `last` and the upstream's opaque `Link` parameters go upstream; `Link`
/// comes back as tender's own relative path (with `ns` when the client used it); no page is
/// fetched twice.
#[tokio::test]
async fn should_paginate_tag_lists_like_quay_and_like_distribution_without_repeating_a_page() {
    let tags: Vec<String> = (0..7).map(|i| format!("v{i}")).collect();
    for paging in [Paging::Distribution(3), Paging::Quay(3)] {
        for (path, ns) in [("/v2/ghcr.io/a/b/tags/list", None), ("/v2/a/b/tags/list?ns=ghcr.io", Some("ghcr.io"))] {
            let fake = FakeUpstream::start().await;
            *fake.state.tags.lock().unwrap() = tags.clone();
            *fake.state.paging.lock().unwrap() = paging;
            let tender = Tender::in_front_of(&fake).await;
            assert_eq!(follow_pages(&tender, path, ns).await, tags, "{paging:?} {path}");
            let asked: Vec<String> = fake.state.paths.lock().unwrap().clone();
            let mut distinct = asked.clone();
            distinct.dedup();
            assert_eq!(asked.len(), 3, "{paging:?} {path}: three pages, each once: {asked:?}");
            assert_eq!(distinct, asked, "{paging:?} {path}: no page fetched twice");
        }
    }
}

/// Issue 17 item 2: an upstream without the referrers API answers 404 and so does tender (the
/// client then falls back to `sha256-<hex>` tags); a filter the upstream applied is reported in
/// `OCI-Filters-Applied`; referrers pagination is forwarded.
#[tokio::test]
async fn should_pass_the_referrers_404_through_and_report_filters_and_pages() {
    let fake = FakeUpstream::start().await;
    let tender = Tender::in_front_of(&fake).await;
    let zero = format!("sha256:{}", "0".repeat(64));
    let url = tender.url(&format!("/v2/ghcr.io/a/b/referrers/{zero}"));
    let resp = client().get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 404, "the upstream's 404, so clients use the tag-schema fallback");
    // and the same 404 while the upstream is down (issue 17 item 6: signature checks offline)
    *fake.state.down.lock().unwrap() = true;
    let resp = client().get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 404, "the last answer, 404, while the upstream is down");
    *fake.state.down.lock().unwrap() = false;

    let referrer = |i: usize, t: &str| serde_json::json!({"mediaType": OCI_MANIFEST, "digest": format!("sha256:{}", i.to_string().repeat(64)), "size": 1, "artifactType": t});
    *fake.state.referrers.lock().unwrap() = Some(vec![
        referrer(1, "application/vnd.dev.sigstore.bundle+json"),
        referrer(2, "application/spdx+json"),
        referrer(3, "application/vnd.dev.sigstore.bundle+json"),
    ]);
    let resp = client().get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("oci-filters-applied").is_none());
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap()["manifests"].as_array().unwrap().len(), 3);
    let resp = client().get(format!("{url}?artifactType=application/spdx%2Bjson")).send().await.unwrap();
    assert_eq!(resp.headers()["oci-filters-applied"], "artifactType");
    assert_eq!(resp.headers()["content-type"], OCI_INDEX);
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap()["manifests"].as_array().unwrap().len(), 1);

    *fake.state.paging.lock().unwrap() = Paging::Distribution(1);
    fake.state.paths.lock().unwrap().clear();
    let got = follow_pages(&tender, &format!("/v2/ghcr.io/a/b/referrers/{zero}"), None).await;
    assert_eq!(got.len(), 3, "every referrer, over three pages: {got:?}");
    let asked = fake.state.paths.lock().unwrap().clone();
    assert_eq!(asked.len(), 3, "each page once: {asked:?}");
}

/// Issue 17 item 6: tag lists and referrers while the upstream is down come from the last good
/// copy (stale), and only through the upstream that gave it.
#[tokio::test]
async fn should_serve_tag_lists_and_referrers_stale_while_the_upstream_is_down() {
    let fake = FakeUpstream::start().await;
    let other = FakeUpstream::start().await;
    *other.state.down.lock().unwrap() = true;
    *fake.state.referrers.lock().unwrap() = Some(vec![serde_json::json!({"mediaType": OCI_MANIFEST,
        "digest": format!("sha256:{}", "1".repeat(64)), "size": 1, "artifactType": "application/spdx+json"})]);
    let tender = Tender::start(
        vec![upstream_settings("ghcr.io", &fake.url()), upstream_settings("quay.io", &other.url())],
        fast_settings(),
    )
    .await;
    let zero = format!("sha256:{}", "0".repeat(64));
    let paths = ["/v2/ghcr.io/a/b/tags/list".to_string(), format!("/v2/ghcr.io/a/b/referrers/{zero}")];
    let mut up = Vec::new();
    for p in &paths {
        let resp = client().get(tender.url(p)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{p}");
        up.push(resp.bytes().await.unwrap());
    }
    *fake.state.down.lock().unwrap() = true;
    for (p, body) in paths.iter().zip(&up) {
        let resp = client().get(tender.url(p)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{p} with the upstream down");
        let age = resp.headers().get("x-tender-stale").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        assert!(age.is_some_and(|a| a < 60), "{p}: X-Tender-Stale carries the copy's age: {age:?}");
        assert_eq!(&resp.bytes().await.unwrap(), body, "{p}: the last good copy");
    }
    // never through another upstream
    for p in ["/v2/quay.io/a/b/tags/list".to_string(), format!("/v2/quay.io/a/b/referrers/{zero}")] {
        let resp = client().get(tender.url(&p)).send().await.unwrap();
        assert_eq!(resp.status(), 503, "{p}");
    }
}

/// Issue 17 item 5: with docker.io as the default upstream, a first component that is a host
/// name (a `.` or `localhost`) and not a configured upstream is NAME_UNKNOWN without asking
/// anyone; `?ns=` answers carry `OCI-Namespace`.
#[tokio::test]
async fn should_refuse_unconfigured_hostnames_when_the_default_is_docker_io() {
    let hub = FakeUpstream::start().await;
    let ghcr = FakeUpstream::start().await;
    hub.add_manifest("library/alpine", "3", OCI_MANIFEST, BARE);
    ghcr.add_manifest("a/b", "v1", OCI_MANIFEST, BARE);
    let tender = Tender::start(
        vec![upstream_settings("docker.io", &hub.url()), upstream_settings("ghcr.io", &ghcr.url())],
        fast_settings(),
    )
    .await;
    for path in [
        "/v2/quay.io/a/b/manifests/v1",
        "/v2/localhost/a/manifests/v1",
        "/v2/registry.k8s.io/pause/tags/list",
        "/v2/example.com/x/referrers/sha256:0000000000000000000000000000000000000000000000000000000000000000",
    ] {
        let resp = client().get(tender.url(path)).send().await.unwrap();
        assert_eq!(error_code(resp).await, (404, "NAME_UNKNOWN".into()), "{path}");
    }
    assert_eq!(hub.requests() + ghcr.requests(), 0, "no outbound request");
    let resp = client().get(tender.url("/v2/a/b/manifests/v1?ns=ghcr.io")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["oci-namespace"], "ghcr.io");
    let resp = client().get(tender.url("/v2/a/b/manifests/nope?ns=ghcr.io")).send().await.unwrap();
    assert_eq!(resp.headers()["oci-namespace"], "ghcr.io", "errors too");
    let resp = client().get(tender.url("/v2/alpine/manifests/3")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("oci-namespace").is_none());

    let hub_before = hub.requests();
    // containerd with a path-routed mirror (`override_path`) sends both a prefix and `ns`:
    // the prefix, written by the operator, wins; `ns` is what containerd adds for the registry
    let resp = client().get(tender.url("/v2/ghcr.io/a/b/manifests/v1?ns=ghcr.io")).send().await.unwrap();
    assert_eq!(resp.status(), 200, "prefix and ns agree");
    let resp = client().get(tender.url("/v2/ghcr.io/a/b/manifests/v1?ns=docker.io")).send().await.unwrap();
    assert_eq!(resp.status(), 200, "a _default hosts.toml pointing at /v2/ghcr.io");
    assert_eq!(resp.headers()["oci-namespace"], "ghcr.io", "the namespace that answered");
    assert_eq!(hub.requests(), hub_before);

    // another default: a dotted first component goes to it as a repository name
    let tender = Tender::in_front_of(&ghcr).await;
    ghcr.add_manifest("quay.io/a/b", "v1", OCI_MANIFEST, BARE);
    let resp = client().get(tender.url("/v2/quay.io/a/b/manifests/v1")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

/// Redirects are followed (the upstream lives on loopback, so loopback targets are allowed)
/// and the upstream's Authorization never reaches the other host.
#[tokio::test]
async fn should_follow_redirects_without_forwarding_authorization() {
    let fake = FakeUpstream::start().await;
    *fake.state.require_token.lock().unwrap() = Some("secret-token".into());
    let blob = random_bytes(3000, 6);
    let d = fake.add_blob(blob.clone());

    // the "CDN": another host (127.0.0.2) that records the headers it gets
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let cdn = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let cdn_addr = cdn.local_addr().unwrap();
    let (seen2, blob2) = (seen.clone(), blob.clone());
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let (seen, blob) = (seen2.clone(), blob2.clone());
        async move {
            let auth = req.headers().get("authorization").map(|v| v.to_str().unwrap_or("").to_string());
            seen.lock().unwrap().push(auth);
            blob
        }
    });
    tokio::spawn(async move {
        let _ = axum::serve(cdn, app).await;
    });
    *fake.state.redirect_blobs_to.lock().unwrap() = Some(format!("http://{cdn_addr}"));
    let tender = Tender::in_front_of(&fake).await;
    let got = get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}")), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(got.body.as_ref().unwrap()), d);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen, vec![None], "Authorization must not be forwarded to the redirect's host");
}

#[tokio::test]
async fn should_expose_metrics_and_health() {
    let fake = FakeUpstream::start().await;
    let d = fake.add_blob(random_bytes(2048, 8));
    let tender = Tender::in_front_of(&fake).await;
    get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}")), &[]).await;
    tender.wait_idle().await;
    get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}")), &[]).await;
    assert_eq!(get(&tender.url("/healthz"), &[]).await.status, 200);
    assert_eq!(get(&tender.url("/readyz"), &[]).await.status, 200);
    let m = String::from_utf8(get(&tender.url("/metrics"), &[]).await.body.unwrap().to_vec()).unwrap();
    for needle in [
        "tender_http_requests_total{route=\"blob\",method=\"GET\",status=\"200\"} 2",
        "tender_cache_requests_total{kind=\"blob\",result=\"miss\",upstream=\"ghcr.io\",prefetch=\"false\"} 1",
        "tender_cache_requests_total{kind=\"blob\",result=\"hit\",upstream=\"ghcr.io\",prefetch=\"false\"} 1",
        "tender_http_response_bytes_total{route=\"blob\"} 4096",
        "tender_upstream_bytes_total{upstream=\"ghcr.io\"} 2048",
        "tender_fills_started_total{upstream=\"ghcr.io\"} 1",
        "tender_fills_finished_total{upstream=\"ghcr.io\",result=\"committed\"} 1",
    ] {
        assert!(m.contains(needle), "missing {needle} in\n{m}");
    }
}
