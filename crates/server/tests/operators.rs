//! What operators see and steer (issue 20): the offline policy (a cached tag keeps resolving
//! while its upstream is unreachable; an upstream that answers wins), upstream health with its
//! cause, `/api/v1/health`, the probe endpoint and the metrics behind them. Every upstream here
//! is a stub on 127.0.0.1 that fails one way.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use support::*;
use tender_oci::Digest;
use tender_store::{ManifestMeta, TagRecord};

const MEDIA: &str = "application/vnd.oci.image.manifest.v1+json";
const MANIFEST: &[u8] = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#;
/// Ten days: older than the old default limit (168 h).
const TEN_DAYS: u64 = 10 * 24 * 3600;

/// How a stub upstream fails.
#[derive(Debug, Clone, Copy)]
enum Stub {
    /// Nothing listens: connection refused.
    Refused,
    /// Accepts and never answers: a timeout.
    Silent,
    /// Answers every request with this status.
    Status(u16),
    /// Plain HTTP where tender expects TLS: the handshake fails.
    NotTls,
}

/// A stub upstream; the listener (and the accepted sockets) live as long as the returned guard.
async fn stub(kind: Stub) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = match kind {
        Stub::Refused => {
            drop(listener);
            tokio::spawn(async {})
        }
        Stub::Silent => tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        }),
        Stub::NotTls => {
            let app = axum::Router::new().fallback(|| async { "plain" });
            let task = tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            return (format!("https://{addr}"), task);
        }
        Stub::Status(code) => {
            let app = axum::Router::new().fallback(move || async move {
                let status = StatusCode::from_u16(code).unwrap();
                (status, [("retry-after", "1")], "{}").into_response()
            });
            tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            })
        }
    };
    (format!("http://{addr}"), task)
}

fn settings() -> tender_fetch::FetchSettings {
    let mut s = fast_settings();
    // Whatever the default is: the policy under test.
    s.stale_max_age = tender_fetch::FetchSettings::default().stale_max_age;
    s.tag_ttl = Duration::ZERO;
    s.attempts = 1;
    s.first_byte_timeout = Duration::from_millis(600);
    s.connect_timeout = Duration::from_millis(600);
    s
}

/// A tag record `age` seconds old for `ghcr.io/a/b:v1`, its manifest stored and known there.
fn seed(tender: &Tender, age: u64) -> Digest {
    seed_as(tender, age, false)
}

/// [`seed`], the record registered by `tender import` when `imported`.
fn seed_as(tender: &Tender, age: u64, imported: bool) -> Digest {
    let digest = Digest::of(MANIFEST);
    tender.store.put_bytes(&format!("manifest:{digest}"), MANIFEST, &digest).unwrap();
    tender.store.meta_put(&digest, &ManifestMeta { media_type: MEDIA.into(), size: MANIFEST.len() as u64 }).unwrap();
    tender.store.record_known(&digest, "ghcr.io").unwrap();
    tender
        .store
        .tag_put(&TagRecord {
            upstream: "ghcr.io".into(),
            repository: "a/b".into(),
            tag: "v1".into(),
            digest,
            media_type: MEDIA.into(),
            size: MANIFEST.len() as u64,
            fetched_at: tender_store::now_secs() - age,
            imported,
        })
        .unwrap();
    digest
}

/// Admin endpoints on, with the token `admin-secret`.
fn admin_security() -> tender_server::Security {
    tender_server::Security {
        admin: Some(tender_server::admin::Admin {
            token: tender_server::auth::AdminToken::new("admin-secret"),
            gc_cap: None,
            import_cap: 1 << 30,
        }),
        ..tender_server::Security::default()
    }
}

async fn text(url: &str) -> String {
    String::from_utf8(get(url, &[]).await.body.unwrap().to_vec()).unwrap()
}

/// Unreachable (connect refused, no answer in time, 5xx, 429): the last known digest of a tag
/// is served however old it is (`staleMaxAge: never`, the default), with `X-Tender-Stale`, and
/// counted; the health of the upstream names the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_serve_a_cached_tag_while_its_upstream_is_unreachable() {
    let cases = [
        (Stub::Refused, "connect"),
        (Stub::Silent, "timeout"),
        (Stub::NotTls, "tls"),
        (Stub::Status(503), "http"),
        (Stub::Status(502), "http"),
        (Stub::Status(429), "http"),
    ];
    for (kind, cause) in cases {
        let (url, _guard) = stub(kind).await;
        let tender = Tender::start(vec![upstream_settings("ghcr.io", &url)], settings()).await;
        let digest = seed(&tender, TEN_DAYS);
        let resp = client().get(tender.url("/v2/ghcr.io/a/b/manifests/v1")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{kind:?}: a cached tag resolves while the upstream is unreachable");
        assert_eq!(resp.headers()["docker-content-digest"], digest.to_string().as_str(), "{kind:?}");
        let age: u64 = resp.headers()["x-tender-stale"].to_str().unwrap().parse().unwrap();
        assert!((TEN_DAYS..TEN_DAYS + 60).contains(&age), "{kind:?}: X-Tender-Stale {age}");
        assert_eq!(resp.bytes().await.unwrap().as_ref(), MANIFEST);

        let metrics = text(&tender.url("/metrics")).await;
        assert!(metrics.contains(r#"tender_stale_served_total{upstream="ghcr.io"} 1"#), "{kind:?}: {metrics}");
        assert!(metrics.contains(r#"tender_upstream_up{upstream="ghcr.io"} 0"#), "{kind:?}: {metrics}");

        let health: serde_json::Value = serde_json::from_str(&text(&tender.url("/api/v1/health")).await).unwrap();
        let up = health["upstreams"].as_array().unwrap().iter().find(|u| u["name"] == "ghcr.io").unwrap().clone();
        assert_eq!(up["state"], "down", "{kind:?}: {up}");
        assert_eq!(up["lastError"]["cause"], cause, "{kind:?}: {up}");
        assert!(up["lastError"]["at"].as_u64().unwrap() > 0, "{kind:?}: {up}");
        assert!(up["lastSuccess"].is_null(), "{kind:?}: {up}");
        if let Stub::Status(code) = kind {
            assert_eq!(up["lastError"]["status"], code, "{kind:?}: {up}");
        }
        assert_eq!(health["staleServed"], 1, "{kind:?}: {health}");

        let page = text(&tender.url("/")).await;
        assert!(page.contains("http-equiv=\"refresh\""), "the status page refreshes itself");
        assert!(page.contains(&format!("class=\"cause\">{cause}")), "{kind:?}: the page names the cause: {page}");
        assert!(page.contains("id=\"stale-served\">1<"), "{kind:?}: the page counts stale answers");
    }
}

/// An upstream that answers 404, 401 or 403 has answered: its answer wins over the cached tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_let_an_answering_upstream_win_over_the_cached_tag() {
    for (code, want) in [(404, 404), (401, 404), (403, 404)] {
        let (url, _guard) = stub(Stub::Status(code)).await;
        let tender = Tender::start(vec![upstream_settings("ghcr.io", &url)], settings()).await;
        seed(&tender, 60);
        let resp = client().get(tender.url("/v2/ghcr.io/a/b/manifests/v1")).send().await.unwrap();
        assert_eq!(resp.status(), want, "upstream {code}");
        assert!(resp.headers().get("x-tender-stale").is_none());
        let metrics = text(&tender.url("/metrics")).await;
        assert!(!metrics.contains(r#"tender_stale_served_total{upstream="ghcr.io"} 1"#), "{metrics}");
        let health: serde_json::Value = serde_json::from_str(&text(&tender.url("/api/v1/health")).await).unwrap();
        assert_eq!(health["upstreams"][0]["state"], "up", "an upstream that answers {code} is up: {health}");
    }
}

/// An imported tag is authoritative (issue 21): however old, with `tagTtl: 0` and an upstream
/// that answers 404 for it, it resolves to what was imported, as a hit; `tender tag rm`
/// (the admin endpoint) ends that, and the upstream's answer counts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_resolve_an_imported_tag_without_its_upstream_until_it_is_removed() {
    let (url, _guard) = stub(Stub::Status(404)).await;
    let security = tender_server::Security {
        admin: Some(tender_server::admin::Admin {
            token: tender_server::auth::AdminToken::new("admin-secret"),
            gc_cap: None,
            import_cap: 1 << 30,
        }),
        ..tender_server::Security::default()
    };
    let tender = Tender::start_full(
        vec![upstream_settings("ghcr.io", &url)],
        None,
        settings(),
        security,
        None,
        tender_server::Surface::All,
    )
    .await;
    let digest = seed_as(&tender, TEN_DAYS, true);
    let resp = client().get(tender.url("/v2/ghcr.io/a/b/manifests/v1")).send().await.unwrap();
    assert_eq!(resp.status(), 200, "the imported tag wins over the upstream's 404");
    assert_eq!(resp.headers()["docker-content-digest"], digest.to_string().as_str());
    assert!(resp.headers().get("x-tender-stale").is_none(), "an imported tag is not stale");
    assert_eq!(resp.bytes().await.unwrap().as_ref(), MANIFEST);

    let rm = client()
        .delete(tender.url("/api/v1/admin/tags?name=ghcr.io/a/b:v1"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(rm.status(), 200);
    assert_eq!(get(&tender.url("/v2/ghcr.io/a/b/manifests/v1"), &[]).await.status, 404, "the upstream answers again");
    let again = client()
        .delete(tender.url("/api/v1/admin/tags?name=ghcr.io/a/b:v1"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404, "no record left");
}

/// A configured limit still applies, and the error it causes names `staleMaxAge`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_name_stale_max_age_when_the_limit_refuses_a_tag() {
    let (url, _guard) = stub(Stub::Refused).await;
    let mut s = settings();
    s.stale_max_age = tender_fetch::StaleLimit::Max(Duration::from_secs(3600));
    let tender = Tender::start(vec![upstream_settings("ghcr.io", &url)], s.clone()).await;
    seed(&tender, 7200);
    let resp = client().get(tender.url("/v2/ghcr.io/a/b/manifests/v1")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    let body = resp.text().await.unwrap();
    assert!(body.contains("staleMaxAge"), "{body}");

    // The upstream's own key overrides the global one.
    let mut up = upstream_settings("ghcr.io", &url);
    up.stale_max_age = Some(tender_fetch::StaleLimit::Never);
    let tender = Tender::start(vec![up], s).await;
    seed(&tender, 7200);
    assert_eq!(get(&tender.url("/v2/ghcr.io/a/b/manifests/v1"), &[]).await.status, 200);
}

/// `/api/v1/health` follows the visibility rule: an anonymous client (client auth on) sees
/// only the upstreams it may pull from, never an endpoint URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_show_health_only_of_upstreams_the_viewer_may_see() {
    let (url, _guard) = stub(Stub::Status(503)).await;
    let mut private = upstream_settings("private.example", &url);
    private.credentials = Some(tender_fetch::Credentials { username: "u".into(), password: "p".into() });
    let public = upstream_settings("ghcr.io", &url);
    let auth = tender_server::auth::ClientAuth::new(Default::default(), &["tok".to_string()], true);
    let security = tender_server::Security {
        auth: std::sync::RwLock::new(Some(Arc::new(auth))),
        ..tender_server::Security::default()
    };
    let tender =
        Tender::start_full(vec![public, private], None, settings(), security, None, tender_server::Surface::All).await;
    // `serve --parent` reads /api/v1/upstreams: its shape stays exactly as it was.
    assert_eq!(
        text(&tender.url("/api/v1/upstreams")).await,
        r#"{"defaultUpstream":"ghcr.io","imageFactory":false,"upstreams":["ghcr.io","private.example"]}"#
    );
    let anon = text(&tender.url("/api/v1/health")).await;
    assert!(anon.contains("ghcr.io") && !anon.contains("private.example"), "{anon}");
    assert!(!anon.contains("127.0.0.1"), "no URL to anonymous clients: {anon}");
    let resp = client().get(tender.url("/api/v1/health")).bearer_auth("tok").send().await.unwrap();
    let full = resp.text().await.unwrap();
    assert!(full.contains("ghcr.io") && full.contains("private.example"), "{full}");
}

/// `POST /api/v1/admin/upstreams/<name>/probe` asks the upstream now and answers its new
/// health; it needs the admin token, and names only configured upstreams.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn should_probe_an_upstream_now_with_the_admin_token_only() {
    let fake = FakeUpstream::start().await;
    let tender = Tender::start_full(
        vec![upstream_settings("ghcr.io", &fake.url())],
        None,
        settings(),
        admin_security(),
        None,
        tender_server::Surface::All,
    )
    .await;
    let probe = tender.url("/api/v1/admin/upstreams/ghcr.io/probe");
    let resp = client().post(&probe).send().await.unwrap();
    assert_eq!(resp.status(), 401, "no token");
    let resp = client().post(&probe).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(resp.status(), 401, "wrong token");
    assert_eq!(fake.requests(), 0, "a refused probe asks nobody");

    let resp = client().post(&probe).bearer_auth("admin-secret").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let h: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(h["name"], "ghcr.io");
    assert_eq!(h["state"], "up", "{h}");
    assert!(h["lastSuccess"].as_u64().unwrap() > 0, "{h}");
    assert!(fake.requests() >= 1);

    *fake.state.down.lock().unwrap() = true;
    let h: serde_json::Value =
        client().post(&probe).bearer_auth("admin-secret").send().await.unwrap().json().await.unwrap();
    assert_eq!(h["state"], "down", "{h}");
    assert_eq!(h["lastError"]["cause"], "http", "{h}");
    assert_eq!(h["lastError"]["status"], 503, "{h}");
    assert!(h["lastSuccess"].as_u64().unwrap() > 0, "the last success is kept: {h}");
    let metrics = text(&tender.url("/metrics")).await;
    assert!(metrics.contains(r#"tender_upstream_last_success_timestamp_seconds{upstream="ghcr.io"}"#), "{metrics}");

    let resp = client()
        .post(tender.url("/api/v1/admin/upstreams/nope.example/probe"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}
