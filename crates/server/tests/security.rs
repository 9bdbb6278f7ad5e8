//! Hardening, in-process: TLS (HTTP/2 by ALPN, reload without dropping connections, mutual
//! TLS), client authentication, the admin surface and the limits. The real pull clients over
//! TLS and authentication are in the end-to-end suite (crates/e2e, t8_security).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use support::*;
use tender_fetch::Credentials;
use tender_server::admin::Admin;
use tender_server::auth::{AdminToken, ClientAuth};
use tender_server::limits::Limits;
use tender_server::tls::{TlsFiles, TlsReloader};
use tender_server::{Security, Surface};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "pull-token-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789abcdef";

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        let cert = p.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A leaf certificate and its key, PEM.
    fn issue(&self, sans: &[&str], client: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        p.distinguished_name.push(DnType::CommonName, sans.first().copied().unwrap_or("client"));
        if client {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn https_client(ca: &str, identity: Option<(&str, &str)>, http1: bool) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .no_proxy()
        .use_rustls_tls()
        .timeout(Duration::from_secs(30))
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap());
    if let Some((cert, key)) = identity {
        b = b.identity(reqwest::Identity::from_pem(format!("{cert}\n{key}").as_bytes()).unwrap());
    }
    if http1 {
        b = b.http1_only();
    }
    b.build().unwrap()
}

struct TlsBed {
    _dir: tempfile::TempDir,
    files: TlsFiles,
    reloader: Arc<TlsReloader>,
}

fn tls_bed(server_ca: &Ca, client_ca: Option<&Ca>) -> TlsBed {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = server_ca.issue(&["127.0.0.1", "localhost"], false);
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
        client_ca: client_ca.map(|_| dir.path().join("client-ca.pem")),
    };
    std::fs::write(&files.cert, cert).unwrap();
    std::fs::write(&files.key, key).unwrap();
    if let (Some(ca), Some(p)) = (client_ca, &files.client_ca) {
        std::fs::write(p, ca.pem()).unwrap();
    }
    let reloader = TlsReloader::load(files.clone()).unwrap();
    TlsBed { _dir: dir, files, reloader }
}

async fn tls_tender(fake: &FakeUpstream, tls: &TlsBed) -> Tender {
    Tender::start_full(
        vec![upstream_settings("ghcr.io", &fake.url())],
        None,
        fast_settings(),
        Security::default(),
        Some(tls.reloader.clone()),
        Surface::All,
    )
    .await
}

#[tokio::test]
async fn should_serve_tls_with_http2_and_http1_and_verify_every_byte() {
    let fake = FakeUpstream::start().await;
    let blob = random_bytes(3 << 20, 7);
    let d = fake.add_blob(blob.clone());
    let ca = Ca::new("server CA");
    let bed = tls_bed(&ca, None);
    let tender = tls_tender(&fake, &bed).await;
    let url = format!("https://{}/v2/ghcr.io/a/b/blobs/{d}", tender.addr);
    for http1 in [false, true] {
        let resp = https_client(&ca.pem(), None, http1).get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let want = if http1 { reqwest::Version::HTTP_11 } else { reqwest::Version::HTTP_2 };
        assert_eq!(resp.version(), want, "ALPN picks the protocol");
        assert_eq!(sha(&resp.bytes().await.unwrap()), sha(&blob));
    }
    assert_eq!(tender.app.metrics().sendfile_bytes.get(), 0, "TLS bodies are encrypted, never sent from a file");
    // Plain HTTP on a TLS listener gets no answer.
    assert!(client().get(format!("http://{}/v2/", tender.addr)).send().await.is_err());
    // A client that does not trust the CA is refused at the handshake.
    let other = Ca::new("other CA");
    assert!(https_client(&other.pem(), None, false).get(&url).send().await.is_err());
    assert_eq!(fake.blob_gets(), 1);
}

#[tokio::test]
async fn should_reload_the_certificate_without_dropping_open_connections() {
    let fake = FakeUpstream::start().await;
    let d = fake.add_blob(random_bytes(1000, 8));
    let (old_ca, new_ca) = (Ca::new("old CA"), Ca::new("new CA"));
    let bed = tls_bed(&old_ca, None);
    let tender = tls_tender(&fake, &bed).await;
    let url = format!("https://{}/v2/ghcr.io/a/b/blobs/{d}", tender.addr);
    // An HTTP/2 connection opened under the old certificate.
    let old_client = https_client(&old_ca.pem(), None, false);
    assert_eq!(old_client.get(&url).send().await.unwrap().status(), 200);
    let new_client = https_client(&new_ca.pem(), None, false);
    assert!(new_client.get(&url).send().await.is_err(), "the new CA is not in use yet");

    assert!(!bed.reloader.reload_if_changed().unwrap(), "nothing changed yet");
    // A broken renewal keeps the old certificate.
    std::fs::write(&bed.files.cert, "not a certificate").unwrap();
    assert!(bed.reloader.reload_if_changed().is_err());
    assert_eq!(old_client.get(&url).send().await.unwrap().status(), 200);

    let (cert, key) = new_ca.issue(&["127.0.0.1"], false);
    std::fs::write(&bed.files.key, key).unwrap();
    std::fs::write(&bed.files.cert, cert).unwrap();
    assert!(bed.reloader.reload_if_changed().unwrap());
    assert_eq!(new_client.get(&url).send().await.unwrap().status(), 200, "new connections get the new certificate");
    // The old connection lives on: the same client, its pooled connection, no new handshake
    // (a new handshake would fail: it trusts only the old CA).
    assert_eq!(old_client.get(&url).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn should_require_a_client_certificate_from_the_client_ca() {
    let fake = FakeUpstream::start().await;
    let d = fake.add_blob(random_bytes(1000, 9));
    let (server_ca, client_ca, rogue_ca) = (Ca::new("server CA"), Ca::new("client CA"), Ca::new("rogue CA"));
    let bed = tls_bed(&server_ca, Some(&client_ca));
    let tender = tls_tender(&fake, &bed).await;
    let url = format!("https://{}/v2/ghcr.io/a/b/blobs/{d}", tender.addr);
    let (cert, key) = client_ca.issue(&["worker-1"], true);
    let ok = https_client(&server_ca.pem(), Some((&cert, &key)), false);
    assert_eq!(ok.get(&url).send().await.unwrap().status(), 200);
    assert!(https_client(&server_ca.pem(), None, false).get(&url).send().await.is_err(), "no certificate");
    let (rcert, rkey) = rogue_ca.issue(&["mallory"], true);
    let rogue = https_client(&server_ca.pem(), Some((&rcert, &rkey)), false);
    assert!(rogue.get(&url).send().await.is_err(), "a certificate from another CA");
    let text = ok.get(format!("https://{}/metrics", tender.addr)).send().await.unwrap().text().await.unwrap();
    let failures: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tender_tls_handshake_failures_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(failures >= 2, "{text}");
}

fn auth_security(anonymous_pull: bool) -> Security {
    let users = HashMap::from([("worker".to_string(), bcrypt::hash("s3cret", 4).unwrap())]);
    let auth = ClientAuth::new(users, &[TOKEN.to_string()], anonymous_pull);
    Security { auth: std::sync::RwLock::new(Some(Arc::new(auth))), ..Security::default() }
}

#[tokio::test]
async fn should_challenge_and_accept_basic_users_and_bearer_tokens() {
    let fake = FakeUpstream::start().await;
    let d = fake.add_blob(random_bytes(1000, 10));
    let tender = secured(&fake, auth_security(false)).await;
    let blob = tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}"));
    for path in ["/v2/", blob.trim_start_matches(&format!("http://{}", tender.addr)), "/metrics", "/"] {
        let resp = client().get(tender.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path}");
        assert_eq!(resp.headers()["www-authenticate"], "Basic realm=\"tender\"", "{path}");
    }
    assert_eq!(fake.blob_gets(), 0, "nothing fetched for a client that did not authenticate");
    assert_eq!(client().get(tender.url("/healthz")).send().await.unwrap().status(), 200);
    assert_eq!(client().get(tender.url("/readyz")).send().await.unwrap().status(), 200);
    let wrong = client().get(&blob).basic_auth("worker", Some("guess")).send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let nobody = client().get(&blob).basic_auth("nobody", Some("s3cret")).send().await.unwrap();
    assert_eq!(nobody.status(), 401);
    let bad_token = client().get(&blob).bearer_auth("pull-token-wrong-0000000").send().await.unwrap();
    assert_eq!(bad_token.status(), 401);
    let ok = client().get(&blob).basic_auth("worker", Some("s3cret")).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.bytes().await.unwrap().len(), 1000);
    assert_eq!(client().get(&blob).bearer_auth(TOKEN).send().await.unwrap().status(), 200);
    let text = client().get(tender.url("/metrics")).bearer_auth(TOKEN).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("tender_auth_failures_total 3"), "{text}");
}

#[tokio::test]
async fn should_serve_an_upstream_with_credentials_only_to_authenticated_clients() {
    let fake = FakeUpstream::start().await;
    let d = fake.add_blob(random_bytes(1000, 11));
    let mut private = upstream_settings("private.example", &fake.url());
    private.credentials = Some(Credentials { username: "robot".into(), password: "upstream-secret".into() });
    let mut marked_public = upstream_settings("public.example", &fake.url());
    marked_public.credentials = private.credentials.clone();
    marked_public.public = true;
    let tender = Tender::start_full(
        vec![upstream_settings("ghcr.io", &fake.url()), private, marked_public],
        None,
        fast_settings(),
        auth_security(true),
        None,
        Surface::All,
    )
    .await;
    // Anonymous pulls are allowed here (anonymousPull), but not from the private upstream.
    assert_eq!(client().get(tender.url("/v2/")).send().await.unwrap().status(), 200);
    let anon = |ns: &str| client().get(tender.url(&format!("/v2/a/b/blobs/{d}?ns={ns}"))).send();
    assert_eq!(anon("ghcr.io").await.unwrap().status(), 200);
    assert_eq!(anon("public.example").await.unwrap().status(), 200);
    let refused = anon("private.example").await.unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(refused.headers()["www-authenticate"], "Basic realm=\"tender\"");
    let body = refused.text().await.unwrap();
    assert!(!body.contains("upstream-secret") && !body.contains("robot"), "{body}");
    let authed = client()
        .get(tender.url(&format!("/v2/a/b/blobs/{d}?ns=private.example")))
        .basic_auth("worker", Some("s3cret"))
        .send()
        .await
        .unwrap();
    assert_eq!(authed.status(), 200);
}

/// Issue 32 (3): an upstream marked `private` has no credentials (an offline upstream at an
/// air-gapped site has nothing to log in to) and is served only to authenticated clients, like
/// one with credentials: anonymous clients get a 401 and do not see it on the status page.
#[tokio::test]
async fn should_serve_a_private_upstream_without_credentials_only_to_authenticated_clients() {
    let fake = FakeUpstream::start().await;
    let d = fake.add_blob(random_bytes(1000, 12));
    let mut private = upstream_settings("offline.example", &fake.url());
    private.private = true;
    assert!(private.credentials.is_none());
    let ups = vec![upstream_settings("ghcr.io", &fake.url()), private];
    let tender = Tender::start_full(ups, None, fast_settings(), auth_security(true), None, Surface::All).await;
    let url = tender.url(&format!("/v2/a/b/blobs/{d}?ns=offline.example"));
    let refused = client().get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 401, "an anonymous client of a private upstream");
    assert_eq!(fake.blob_gets(), 0, "nothing fetched for it");
    let authed = client().get(&url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(authed.status(), 200);
    assert_eq!(authed.bytes().await.unwrap().len(), 1000);
    // Stored now; still refused to anonymous clients, through any route to it.
    assert_eq!(client().get(&url).send().await.unwrap().status(), 401);
    let page = client().get(tender.url("/")).send().await.unwrap().text().await.unwrap();
    assert!(!page.contains("offline.example"), "the status page shows a private upstream to anonymous clients");
}

#[tokio::test]
async fn should_offer_admin_endpoints_only_with_a_token_and_only_to_its_holder() {
    let fake = FakeUpstream::start().await;
    let d = fake.add_blob(random_bytes(5000, 12));
    let plain = Tender::in_front_of(&fake).await;
    let resp = client().post(plain.url("/api/v1/admin/gc")).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(resp.status(), 404, "no admin token configured: the endpoint does not exist");

    let security = Security {
        admin: Some(Admin { token: AdminToken::new(ADMIN), gc_cap: Some(0), import_cap: 1 << 30 }),
        ..Security::default()
    };
    let tender = secured(&fake, security).await;
    assert_eq!(get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}")), &[]).await.status, 200);
    tender.wait_idle().await;
    for path in ["/api/v1/admin/gc", "/api/v1/admin/fsck", "/api/v1/admin/catalog/sync"] {
        let none = client().post(tender.url(path)).send().await.unwrap();
        assert_eq!(none.status(), 401, "{path}");
        let wrong = client().post(tender.url(path)).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(wrong.status(), 401, "{path}");
    }
    let fsck: serde_json::Value =
        client().post(tender.url("/api/v1/admin/fsck")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(fsck["checked"], 1);
    let dry: serde_json::Value = client()
        .post(tender.url("/api/v1/admin/gc?dryRun=true"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(dry["plan"]["evictBytes"], 5000, "{dry}");
    assert!(dry["report"].is_null());
    assert!(tender.store.object_path(&d.parse().unwrap()).exists(), "a dry run changes nothing");
    let done: serde_json::Value =
        client().post(tender.url("/api/v1/admin/gc")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    assert_eq!(done["report"]["freedBytes"], 5000, "{done}");
    assert!(!tender.store.object_path(&d.parse().unwrap()).exists());
}

#[tokio::test]
async fn should_split_the_pull_and_admin_surfaces() {
    let fake = FakeUpstream::start().await;
    let d = fake.add_blob(random_bytes(100, 13));
    let ups = || vec![upstream_settings("ghcr.io", &fake.url())];
    let pull = Tender::start_full(ups(), None, fast_settings(), Security::default(), None, Surface::Pull).await;
    let admin = Tender::start_full(ups(), None, fast_settings(), Security::default(), None, Surface::Admin).await;
    assert_eq!(get(&pull.url(&format!("/v2/ghcr.io/a/b/blobs/{d}")), &[]).await.status, 200);
    for path in ["/metrics", "/", "/api/v1/served", "/api/v1/catalog"] {
        assert_eq!(get(&pull.url(path), &[]).await.status, 404, "{path} is not on the pull listener");
    }
    assert_eq!(get(&admin.url(&format!("/v2/ghcr.io/a/b/blobs/{d}")), &[]).await.status, 404);
    assert_eq!(get(&admin.url("/metrics"), &[]).await.status, 200);
    for t in [&pull, &admin] {
        assert_eq!(get(&t.url("/healthz"), &[]).await.status, 200);
    }
}

fn limited(limits: Limits) -> Security {
    Security { limits, ..Security::default() }
}

/// A plain-HTTP tender on every surface in front of `fake` (as ghcr.io), with `security`.
async fn secured(fake: &FakeUpstream, security: Security) -> Tender {
    let ups = vec![upstream_settings("ghcr.io", &fake.url())];
    Tender::start_full(ups, None, fast_settings(), security, None, Surface::All).await
}

/// Read until the server closes the connection or `limit` passes; what it sent.
async fn read_until_closed(s: &mut tokio::net::TcpStream, limit: Duration) -> Option<String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(String::from_utf8_lossy(&out).into_owned()),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
}

#[tokio::test]
async fn should_survive_slowloris_header_bombs_and_a_thousand_idle_connections() {
    let fake = FakeUpstream::start().await;
    let blob = random_bytes(2 << 20, 14);
    let d = fake.add_blob(blob.clone());
    let limits = Limits { header_timeout: Duration::from_secs(1), max_header_bytes: 16 * 1024, ..Limits::default() };
    let tender = secured(&fake, limited(limits)).await;
    // A thousand idle connections, and a slowloris that never finishes its head.
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(tokio::net::TcpStream::connect(tender.addr).await.unwrap());
    }
    let mut slow = tokio::net::TcpStream::connect(tender.addr).await.unwrap();
    slow.write_all(b"GET /v2/ HTTP/1.1\r\nHost: tender\r\nX-Slow: a").await.unwrap();
    // A header bomb: a head four times the limit.
    let mut bomb = tokio::net::TcpStream::connect(tender.addr).await.unwrap();
    let big = format!("GET /v2/ HTTP/1.1\r\nHost: tender\r\nX-Bomb: {}\r\n\r\n", "a".repeat(64 * 1024));
    let _ = bomb.write_all(big.as_bytes()).await;
    let answer = read_until_closed(&mut bomb, Duration::from_secs(10)).await.expect("the bomb is answered and closed");
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");

    // Meanwhile a normal pull completes, every byte right.
    let got = get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}")), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(&got.body.unwrap()), sha(&blob));

    // The slowloris is cut off after the header timeout (bounded wait, not a sleep).
    let started = Instant::now();
    let closed = read_until_closed(&mut slow, Duration::from_secs(10)).await;
    assert!(closed.is_some(), "the slow client is disconnected");
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(idle);
    // Both refusals are counted (bounded poll: the connection tasks end just after the close).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = String::from_utf8_lossy(&get(&tender.url("/metrics"), &[]).await.body.unwrap()).into_owned();
        if text.contains("tender_limit_refusals_total{limit=\"headers\"} 1")
            && text.contains("tender_limit_refusals_total{limit=\"header_timeout\"}")
        {
            break;
        }
        assert!(Instant::now() < deadline, "refusals not counted:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn should_refuse_long_urls_and_too_many_requests_from_one_client() {
    let fake = FakeUpstream::start().await;
    let big = random_bytes(1 << 20, 15);
    let d = fake.add_blob(big.clone());
    // The upstream drips (about 2 s): the first two downloads stay open while the third asks.
    fake.set_faults(vec![Fault::SlowDrip(512 * 1024)]);
    let limits = Limits { max_url_bytes: 512, max_client_requests: 2, ..Limits::default() };
    let tender = secured(&fake, limited(limits)).await;
    let long = tender.url(&format!("/v2/ghcr.io/{}/manifests/latest", "a/".repeat(300)));
    let resp = client().get(&long).send().await.unwrap();
    assert_eq!(resp.status(), 414);
    assert!(resp.text().await.unwrap().contains("over the limit"));

    let url = tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}"));
    let a = client().get(&url).send().await.unwrap();
    let b = client().get(&url).send().await.unwrap();
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    let third = client().get(&url).send().await.unwrap();
    assert_eq!(third.status(), 429);
    assert_eq!(third.headers()["retry-after"], "1");
    // Finishing one download frees its slot.
    assert_eq!(sha(&a.bytes().await.unwrap()), sha(&big));
    let again = client().get(&url).send().await.unwrap();
    assert_eq!(again.status(), 200);
    drop((b, again));
    let text = get(&tender.url("/metrics"), &[]).await.body.unwrap();
    let text = String::from_utf8_lossy(&text);
    assert!(text.contains("tender_limit_refusals_total{limit=\"url\"} 1"), "{text}");
    assert!(text.contains("tender_limit_refusals_total{limit=\"client_requests\"} 1"), "{text}");
}

#[tokio::test]
async fn should_refuse_objects_over_the_upstreams_max_size_without_storing_them() {
    let fake = FakeUpstream::start().await;
    let d = fake.add_blob(random_bytes(10_000, 16));
    let small = fake.add_blob(random_bytes(500, 17));
    let mut up = upstream_settings("ghcr.io", &fake.url());
    up.max_object_size = Some(1000);
    let tender = Tender::start(vec![up], fast_settings()).await;
    let resp = client().get(tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}"))).send().await.unwrap();
    assert_eq!(resp.status(), 403);
    let body = resp.text().await.unwrap();
    assert!(body.contains("DENIED") && body.contains("maxObjectSize"), "{body}");
    assert!(!tender.store.object_path(&d.parse().unwrap()).exists());
    assert_eq!(get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{small}")), &[]).await.status, 200);
}

#[tokio::test]
async fn should_queue_fills_beyond_the_concurrent_fill_limit() {
    let fake = FakeUpstream::start().await;
    let (x, y) = (random_bytes(1 << 20, 18), random_bytes(1 << 20, 19));
    let (dx, dy) = (fake.add_blob(x.clone()), fake.add_blob(y.clone()));
    fake.set_faults(vec![Fault::SlowDrip(2 << 20), Fault::SlowDrip(2 << 20)]);
    let settings = tender_fetch::FetchSettings { max_concurrent_fills: Some(1), ..fast_settings() };
    let tender = Tender::start(vec![upstream_settings("ghcr.io", &fake.url())], settings).await;
    let (ux, uy) =
        (tender.url(&format!("/v2/ghcr.io/a/b/blobs/{dx}")), tender.url(&format!("/v2/ghcr.io/a/b/blobs/{dy}")));
    let fx = tokio::spawn(async move { get(&ux, &[]).await });
    let fy = tokio::spawn(async move { get(&uy, &[]).await });
    // One of the two waits for the other's slot: the gauge shows it (bounded poll).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = String::from_utf8_lossy(&get(&tender.url("/metrics"), &[]).await.body.unwrap()).into_owned();
        if text.contains("tender_fills_waiting 1") {
            break;
        }
        assert!(Instant::now() < deadline, "no fill ever waited: {text}");
        tokio::task::yield_now().await;
    }
    let (gx, gy) = (fx.await.unwrap(), fy.await.unwrap());
    assert_eq!(sha(&gx.body.unwrap()), sha(&x));
    assert_eq!(sha(&gy.body.unwrap()), sha(&y));
    assert_eq!(fake.blob_gets(), 2);
    let text = String::from_utf8_lossy(&get(&tender.url("/metrics"), &[]).await.body.unwrap()).into_owned();
    assert!(text.contains("tender_fills_waiting 0"), "{text}");
}

/// A bundle (tar bytes) that carries `blobs` and names `entries`.
fn bundle_tar(blobs: &[&[u8]], entries: Vec<tender_bundle::layout::Descriptor>) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.tar");
    let mut w = tender_bundle::BundleWriter::create(&path, std::collections::HashSet::new()).unwrap();
    for b in blobs {
        w.add_bytes(&tender_oci::Algorithm::Sha256.digest(b), b).unwrap();
    }
    w.finish(&tender_bundle::layout::Document::index(entries, std::collections::BTreeMap::new())).unwrap();
    std::fs::read(&path).unwrap()
}

/// Issue 32 (1), the review's attack: after an authorised pull stored a private image, small
/// bundles that name its index, its manifest, its layer (from a manifest they carry) or its
/// layer as an OS image, under a public upstream, are refused through `POST
/// /api/v1/admin/import` and through `import --data` (the same `import_path` on the data
/// directory), and anonymous clients read 0 private bytes through the public route, the
/// default route and `/image/`.
#[tokio::test]
async fn should_never_let_an_import_grant_a_private_image_to_a_public_route() {
    use tender_bundle::layout::{self, Descriptor};
    use tender_oci::media;
    let private_fake = FakeUpstream::start().await;
    let public_fake = FakeUpstream::start().await;
    let layer = random_bytes(300_000, 321);
    let l = private_fake.add_blob(layer.clone());
    let config = br#"{"architecture":"amd64","os":"linux","private":true}"#.to_vec();
    let c = private_fake.add_blob(bytes::Bytes::from(config.clone()));
    let desc = |mt: &str, d: &str, n: usize| serde_json::json!({"mediaType": mt, "digest": d, "size": n});
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
        "config": desc("application/vnd.oci.image.config.v1+json", &c, config.len()),
        "layers": [desc("application/vnd.oci.image.layer.v1.tar", &l, layer.len())],
    }))
    .unwrap();
    let m = private_fake.add_manifest("team/app", "v1", media::OCI_MANIFEST, &manifest);
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_INDEX,
        "manifests": [desc(media::OCI_MANIFEST, &m, manifest.len())],
    }))
    .unwrap();
    let i = private_fake.add_manifest("team/app", "multi", media::OCI_INDEX, &index);

    let mut private = upstream_settings("private.example", &private_fake.url());
    private.credentials = Some(Credentials { username: "robot".into(), password: "upstream-secret".into() });
    let ups = vec![upstream_settings("pub.example", &public_fake.url()), private];
    let mut security = auth_security(true);
    security.admin = Some(Admin { token: AdminToken::new(ADMIN), gc_cap: None, import_cap: 1 << 30 });
    let tender = Tender::start_full(ups, Some(public_fake.url()), fast_settings(), security, None, Surface::All).await;
    for path in [
        "/v2/private.example/team/app/manifests/v1".to_string(),
        "/v2/private.example/team/app/manifests/multi".to_string(),
        format!("/v2/private.example/team/app/blobs/{c}"),
        format!("/v2/private.example/team/app/blobs/{l}"),
    ] {
        let r = client().get(tender.url(&path)).basic_auth("worker", Some("s3cret")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        r.bytes().await.unwrap();
    }
    tender.wait_idle().await;

    // the hostile bundles
    let own_config = br#"{"architecture":"amd64","os":"linux"}"#.to_vec();
    let own_c = tender_oci::Algorithm::Sha256.digest(&own_config).to_string();
    let thief = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
        "config": desc("application/vnd.oci.image.config.v1+json", &own_c, own_config.len()),
        "layers": [desc("application/vnd.oci.image.layer.v1.tar", &l, layer.len())],
    }))
    .unwrap();
    let schematic = "c".repeat(64);
    let factory_path = format!("/image/{schematic}/v1.12.0/metal-amd64.raw.xz");
    let asset = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST, "artifactType": layout::OS_IMAGE_ARTIFACT,
        "config": desc(layout::EMPTY_MEDIA, &tender_oci::Algorithm::Sha256.digest(layout::EMPTY_JSON).to_string(), layout::EMPTY_JSON.len()),
        "layers": [desc(layout::ASSET_LAYER_MEDIA, &l, layer.len())],
    }))
    .unwrap();
    let entry =
        |mt: &str, bytes: &[u8]| Descriptor::new(mt, &tender_oci::Algorithm::Sha256.digest(bytes), bytes.len() as u64);
    let stolen = |d: Descriptor| d.with(layout::REF_NAME, "pub.example/stolen/app:v1");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("an index", bundle_tar(&[], vec![stolen(entry(media::OCI_INDEX, &index))])),
        ("a manifest", bundle_tar(&[], vec![stolen(entry(media::OCI_MANIFEST, &manifest))])),
        ("a blob", bundle_tar(&[&thief, &own_config], vec![stolen(entry(media::OCI_MANIFEST, &thief))])),
        (
            "an OS image asset",
            bundle_tar(
                &[&asset, layout::EMPTY_JSON],
                vec![entry(media::OCI_MANIFEST, &asset).with(layout::FACTORY_PATH, &factory_path)],
            ),
        ),
    ];
    let anonymous_reads = [
        "/v2/pub.example/stolen/app/manifests/v1".to_string(),
        "/v2/stolen/app/manifests/v1".to_string(),
        format!("/v2/pub.example/stolen/app/manifests/{m}"),
        format!("/v2/pub.example/stolen/app/manifests/{i}"),
        format!("/v2/stolen/app/manifests/{m}"),
        format!("/v2/pub.example/stolen/app/blobs/{l}"),
        format!("/v2/pub.example/stolen/app/blobs/{c}"),
        format!("/v2/stolen/app/blobs/{l}"),
        format!("/v2/team/app/blobs/{l}"),
        factory_path.clone(),
    ];
    let private_bytes_read = || async {
        let mut leaked = 0usize;
        for path in &anonymous_reads {
            let got = get(&tender.url(path), &[]).await;
            let body = got.body.unwrap_or_default();
            let private = [&layer[..], &config[..], &manifest[..], &index[..]];
            if got.status == 200 || private.iter().any(|p| body.windows(p.len().min(64)).any(|w| p.starts_with(w))) {
                leaked += body.len().max(1);
                eprintln!("{path}: {} with {} bytes", got.status, body.len());
            }
        }
        leaked
    };
    assert_eq!(private_bytes_read().await, 0, "before any import");
    let mirror = tender.app.mirror();
    let routes = tender_server::import::Routes(&mirror);
    for (what, tar) in &cases {
        let r = client()
            .post(tender.url("/api/v1/admin/import"))
            .bearer_auth(ADMIN)
            .body(tar.clone())
            .send()
            .await
            .unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 422, "{what} through the server: {text}");
        assert!(!text.contains("stored") && !text.contains(&layer.len().to_string()), "{what}: {text}");
        assert_eq!(private_bytes_read().await, 0, "{what} through the server");
        let path = tender.dir.path().join("hostile.tar");
        std::fs::write(&path, tar).unwrap();
        let e = tender_bundle::import_path(&path, &tender.store, &routes, &tender_bundle::ImportOptions::default())
            .unwrap_err();
        assert!(matches!(e, tender_bundle::ImportError::Refused(_)), "{what} through import --data: {e}");
        assert_eq!(private_bytes_read().await, 0, "{what} through import --data");
    }
    // an authenticated client still reads the private image through its own upstream
    let r = client()
        .get(tender.url(&format!("/v2/private.example/team/app/blobs/{l}")))
        .basic_auth("worker", Some("s3cret"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.bytes().await.unwrap(), layer);
}

/// Issue 35 (1): `GET /v2/_catalog` answers an authenticated client only, with the repositories
/// tender holds a tag of, page by page (`n`, `last`, a `Link` to the next page).
#[tokio::test]
async fn should_list_the_catalog_only_to_authenticated_clients_page_by_page() {
    let fake = FakeUpstream::start().await;
    let tender = secured(&fake, auth_security(true)).await;
    for repo in ["a/z", "a/x", "a/y"] {
        tender
            .store
            .tag_put(&tender_store::TagRecord {
                upstream: "ghcr.io".into(),
                repository: repo.into(),
                tag: "v1".into(),
                digest: format!("sha256:{}", "ab".repeat(32)).parse().unwrap(),
                media_type: "application/vnd.oci.image.manifest.v1+json".into(),
                size: 10,
                fetched_at: 1,
                imported: true,
            })
            .unwrap();
    }
    let anonymous = client().get(tender.url("/v2/_catalog")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401, "anonymous pulls allowed, the catalog is not");
    let page = client().get(tender.url("/v2/_catalog?n=2")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let link = page.headers()["link"].to_str().unwrap().to_string();
    assert_eq!(link, "</v2/_catalog?n=2&last=ghcr.io%2Fa%2Fy>; rel=\"next\"");
    let body: serde_json::Value = page.json().await.unwrap();
    assert_eq!(body["repositories"], serde_json::json!(["ghcr.io/a/x", "ghcr.io/a/y"]));
    let next =
        client().get(tender.url("/v2/_catalog?n=2&last=ghcr.io%2Fa%2Fy")).bearer_auth(TOKEN).send().await.unwrap();
    assert!(next.headers().get("link").is_none(), "the last page links nowhere");
    let body: serde_json::Value = next.json().await.unwrap();
    assert_eq!(body["repositories"], serde_json::json!(["ghcr.io/a/z"]));
    assert_eq!(fake.requests(), 0, "the catalog asks no upstream");
}
