//! The catalog service in process: many sync requests at once make one import and one
//! upstream transfer per golden; the view and the metrics follow the phases.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest as _, Sha256};
use tender_catalog::{Catalog, CatalogMetrics, ImportSettings, Phase, Quiet};
use tender_fetch::{FetchMetrics, FetchSettings, Flights, Mirror, Upstream, UpstreamSettings};
use tender_store::{OpenMode, Store};

const S: &str = "abc123";

/// 8 MiB: data at the start, a hole, data in the middle.
fn image() -> Vec<u8> {
    let mut v = vec![0u8; 8 << 20];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let (head, tail) = v.split_at_mut(5 << 20);
    for b in head[..(1 << 20)].iter_mut().chain(tail[..300_000].iter_mut()) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    v
}

struct Factory {
    body: bytes::Bytes,
    gets: AtomicU64,
}

async fn serve_asset(State(f): State<Arc<Factory>>) -> Response {
    f.gets.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await; // a cold asset answers late
    ([(header::CONTENT_LENGTH, f.body.len().to_string())], f.body.clone()).into_response()
}

async fn start_factory(body: Vec<u8>) -> (String, Arc<Factory>) {
    let f = Arc::new(Factory { body: body.into(), gets: AtomicU64::new(0) });
    let app = axum::Router::new()
        .route(&format!("/image/{S}/v1.13.6/openstack-amd64.raw.zst"), axum::routing::get(serve_asset))
        .fallback(|| async { StatusCode::NOT_FOUND })
        .with_state(f.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, f)
}

fn mirror(data: &Path, factory: &str) -> Arc<Mirror> {
    let store = Arc::new(Store::open(data, OpenMode::Exclusive).unwrap());
    let settings = FetchSettings::default();
    let metrics = FetchMetrics::default();
    let flights = Flights::new(store, settings.clone(), metrics.clone());
    let up = UpstreamSettings {
        name: "image-factory".into(),
        endpoints: vec![factory.parse().unwrap()],
        ca_file: None,
        insecure_skip_verify: false,
        proxy: None,
        credentials: None,
        public: true,
        private: false,
        range_before_verify: false,
        redirect_hosts: None,
        token_realm_hosts: Vec::new(),
        library_prefix: false,
        max_object_size: None,
        stale_max_age: None,
        ns_param: None,
        fallback: None,
        client_identity: None,
        offline: false,
    };
    let factory = Arc::new(Upstream::new(up, settings.clone(), metrics).unwrap());
    Mirror::with_image_factory(Vec::new(), None, factory, flights, settings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_import_once_however_many_syncs_are_asked_for() {
    let raw = image();
    let zst = {
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        e.include_checksum(true).unwrap();
        e.write_all(&raw).unwrap();
        e.finish().unwrap()
    };
    let (url, factory) = start_factory(zst).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let yaml = format!("images:\n  - schematic: {S}\n    version: v1.13.6\n    format: raw.zst\n");
    let v: serde_norway::Value = serde_norway::from_str(&yaml).unwrap();
    let settings = tender_catalog::config::resolve(Some(&v), &data, &format!("{url}/")).unwrap();
    let metrics = CatalogMetrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let catalog = Catalog::open(
        &data,
        settings.clone(),
        mirror(&data, &url),
        ImportSettings { attempts: 3, backoff_base: Duration::from_millis(10), backoff_max: Duration::from_millis(50) },
        metrics,
    )
    .unwrap();
    assert_eq!(catalog.view().unwrap().goldens[0].phase, Phase::Pending);

    // Dozens of background requests and a foreground sync, all at once.
    for _ in 0..32 {
        catalog.spawn_sync(false);
    }
    let report = catalog.sync(false, &Quiet).await;
    assert_eq!(report.outcomes.len(), 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v = catalog.view().unwrap();
        if v.goldens[0].phase == Phase::Succeeded {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no import: {v:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let any queued background pass finish before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(factory.gets.load(Ordering::SeqCst), 1, "one upstream transfer");
    let golden = settings.entries[0].golden_path();
    let got = std::fs::read(&golden).unwrap();
    assert_eq!(got.len(), raw.len());
    assert!(got == raw, "the golden is the image");
    let g = &catalog.view().unwrap().goldens[0];
    assert_eq!(g.sha256.as_deref(), Some(hex::encode(Sha256::digest(&raw)).as_str()));
    assert_eq!(g.virtual_size, Some(raw.len() as u64));

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("tender_catalog_goldens{phase=\"Succeeded\"} 1"), "{text}");
    assert!(text.contains("tender_catalog_goldens{phase=\"Pending\"} 0"), "{text}");
}
