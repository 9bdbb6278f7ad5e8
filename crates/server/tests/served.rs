//! Served statistics and prefetch pins: what workers pulled, excluding prefetch requests.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use support::*;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

#[tokio::test]
async fn should_count_worker_pulls_but_not_prefetch() {
    let fake = FakeUpstream::start().await;
    let m = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","layers":[]}"#;
    fake.add_manifest("siderolabs/kubelet", "v1", OCI_MANIFEST, m);
    let blob = fake.add_blob(random_bytes(3000, 1));
    let tender = Tender::in_front_of(&fake).await;
    let murl = tender.url("/v2/siderolabs/kubelet/manifests/v1?ns=ghcr.io");
    let burl = tender.url(&format!("/v2/siderolabs/kubelet/blobs/{blob}?ns=ghcr.io"));

    // a prefetch warms the cache and is not counted
    let pre = [("X-Tender-Prefetch", "1")];
    assert_eq!(get(&murl, &pre).await.status, 200);
    assert_eq!(get(&burl, &pre).await.status, 200);
    let v: serde_json::Value = client()
        .get(tender.url("/api/v1/served?repository=ghcr.io/siderolabs/kubelet"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["served"], false, "{v}");

    // workers are
    assert_eq!(get(&murl, &[]).await.status, 200);
    assert_eq!(get(&burl, &[]).await.status, 200);
    assert_eq!(get(&burl, &[("Range", "bytes=0-9")]).await.status, 206);
    let v: serde_json::Value = client()
        .get(tender.url("/api/v1/served?repository=ghcr.io/siderolabs/kubelet"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["served"], true);
    assert_eq!(v["manifestRequests"], 1);
    assert_eq!(v["blobRequests"], 2);
    assert_eq!(v["bytes"], m.len() + 3000 + 10);
    assert_eq!(v["hits"], 3, "the prefetch made every worker request a hit");
    assert_eq!(v["misses"], 0);
    assert!(v["lastServed"].as_u64().unwrap() > 0);
    let all: serde_json::Value = client().get(tender.url("/api/v1/served")).send().await.unwrap().json().await.unwrap();
    assert!(all.get("ghcr.io/siderolabs/kubelet").is_some());
}

#[tokio::test]
async fn should_pin_what_a_pinning_prefetch_fetched() {
    let fake = FakeUpstream::start().await;
    let m = br#"{"schemaVersion":2,"config":{},"layers":[]}"#;
    let md = fake.add_manifest("a/b", "v1", OCI_MANIFEST, m);
    let blob = fake.add_blob(random_bytes(1000, 2));
    let other = fake.add_blob(random_bytes(1000, 3));
    let tender = Tender::in_front_of(&fake).await;
    let pin = [("X-Tender-Prefetch", "1"), ("X-Tender-Pin", "1")];
    get(&tender.url("/v2/ghcr.io/a/b/manifests/v1"), &pin).await;
    get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{blob}")), &pin).await;
    // a pin header without the prefetch header is ignored
    get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{other}")), &[("X-Tender-Pin", "1")]).await;
    let pins = tender.store.pins().unwrap();
    assert!(pins.contains(&md.parse().unwrap()));
    assert!(pins.contains(&blob.parse().unwrap()));
    assert!(!pins.contains(&other.parse().unwrap()));
    // The tag holds them (issue 35 (2)): `tag rm` releases exactly its graph.
    let tags = tender.store.tag_pins().unwrap();
    assert_eq!(tags.len(), 1);
    assert_eq!((tags[0].repository.as_str(), tags[0].tag.as_str()), ("a/b", "v1"));
    assert_eq!(tags[0].digest.to_string(), md);
}

#[tokio::test]
async fn should_show_a_status_page_without_javascript() {
    let fake = FakeUpstream::start().await;
    let blob = fake.add_blob(random_bytes(1000, 4));
    let tender = Tender::in_front_of(&fake).await;
    get(&tender.url(&format!("/v2/ghcr.io/a/b/blobs/{blob}")), &[]).await;
    let resp = client().get(tender.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = resp.text().await.unwrap();
    assert!(!html.contains("<script"), "works with JavaScript disabled");
    assert!(html.contains("ghcr.io"));
    assert!(html.contains(">up<"), "the upstream answered, so it is up");
    assert!(html.contains("ghcr.io/a/b"), "most-served repositories");
}

struct FakeCatalog(tender_catalog::CatalogView);

impl tender_catalog::CatalogApi for FakeCatalog {
    fn view(&self) -> Result<tender_catalog::CatalogView, String> {
        Ok(self.0.clone())
    }
    fn request_sync(&self, _retry_failed: bool) -> Result<tender_catalog::SyncAccepted, String> {
        Err("not in this test".into())
    }
}

#[tokio::test]
async fn should_show_catalog_goldens_and_their_phases_on_the_status_page() {
    let golden = |name: &str, phase: &str, reason: Option<&str>| {
        serde_json::json!({
            "name": name, "entry": "catalog.images[0]", "phase": phase, "percent": null, "progress": null,
            "reason": reason, "virtualSize": 1073741824u64, "sha256": "ab".repeat(32), "path": "/g/x.raw", "dir": "/g",
            "ageSeconds": 5, "clones": 2,
            "source": {"imageFactory": "https://factory.talos.dev", "schematic": "abc", "version": "v1.13.6",
                       "platform": "openstack", "arch": "amd64", "format": "raw.xz"},
            "storageClass": null, "storage": null, "attempts": 1
        })
    };
    let view: tender_catalog::CatalogView = serde_json::from_value(serde_json::json!({
        "goldens": [golden("talos-worker-abc-v1.13.6", "Succeeded", None),
                    golden("talos-worker-<b>-v1.13.5", "Failed", Some("upstream 404"))]
    }))
    .unwrap();
    let fake = FakeUpstream::start().await;
    let base = Tender::in_front_of(&fake).await;
    // the same mirror and metrics, with a catalog attached
    let app = tender_server::AppState::with_catalog(
        base.app.mirror(),
        base.app.metrics().clone(),
        std::sync::Arc::new(FakeCatalog(view)),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = tender_server::serve(listener, app, std::future::pending()).await;
    });
    let html = client().get(format!("http://{addr}/")).send().await.unwrap().text().await.unwrap();
    assert!(html.contains("id=\"catalog\""), "{html}");
    assert!(html.contains("talos-worker-abc-v1.13.6"));
    assert!(html.contains(">Succeeded<"));
    assert!(html.contains("Failed: upstream 404"));
    assert!(html.contains("talos-worker-&lt;b&gt;-v1.13.5"), "names are escaped");
    assert!(html.contains("1.0 GiB"));
}

/// Issue 20, item 8: the status page shows per upstream and in total the bytes fetched from the
/// upstream against the bytes served to workers, and the last 24 hours as an inline SVG chart.
#[tokio::test]
async fn should_show_what_tender_saved() {
    let fake = FakeUpstream::start().await;
    let blob = fake.add_blob(random_bytes(1_000_000, 7));
    let tender = Tender::in_front_of(&fake).await;
    let burl = tender.url(&format!("/v2/siderolabs/kubelet/blobs/{blob}?ns=ghcr.io"));
    for _ in 0..3 {
        assert_eq!(get(&burl, &[]).await.status, 200);
    }
    tender.wait_idle().await;
    let page = client().get(tender.url("/")).send().await.unwrap().text().await.unwrap();
    let table = page.split("<table id=\"savings\">").nth(1).expect("a savings table").split("</table>").next().unwrap();
    assert!(
        table.contains("<tr><td>ghcr.io</td><td class=\"num\">976.6 KiB</td><td class=\"num\">2.9 MiB</td><td class=\"num\">1.9 MiB</td><td class=\"num\">3.0×</td></tr>"),
        "fetched once, served three times: {table}"
    );
    assert!(table.contains("<tr id=\"savings-total\"><th>total</th>"), "{table}");
    let svg = page.split("<svg id=\"savings-chart\"").nth(1).expect("an inline chart").split("</svg>").next().unwrap();
    assert!(svg.contains("class=\"fetched\"") && svg.contains("class=\"served\""), "{svg}");
    assert!(!page.contains("<script"), "no JavaScript");
}
