//! Issue 20, items 1 and 9: operators see every fill while it runs (`GET /api/v1/fills`: bytes
//! so far, total, rate, ETA, retries, clients) and the last hour's ended fills with their
//! outcome, and cancel one with `DELETE /api/v1/admin/fills/<id>` (admin token).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::Value;
use support::*;
use tender_server::admin::Admin;
use tender_server::auth::AdminToken;
use tender_server::{Security, Surface};

const ADMIN: &str = "admin-token-0123456789abcdef";

async fn fills(tender: &Tender) -> Value {
    client().get(tender.url("/api/v1/fills")).send().await.unwrap().json().await.unwrap()
}

/// Poll `/api/v1/fills` (bounded) until `ok` holds of it.
async fn fills_until(tender: &Tender, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let v = fills(tender).await;
        if ok(&v) {
            return v;
        }
        assert!(Instant::now() < until, "{what}: {v:#}");
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_show_a_fill_in_progress_and_cancel_it_for_an_admin() {
    let fake = FakeUpstream::start().await;
    let blob = random_bytes(2_000_000, 31);
    let d = fake.add_blob(blob.clone());
    *fake.state.steady.lock().unwrap() = Some(Fault::SlowDrip(200_000));
    let security = Security {
        admin: Some(Admin { token: AdminToken::new(ADMIN), gc_cap: None, import_cap: 1 << 30 }),
        ..Security::default()
    };
    let ups = vec![upstream_settings("ghcr.io", &fake.url())];
    let tender = Tender::start_full(ups, None, fast_settings(), security, None, Surface::All).await;

    // Two clients on one fill, reading to the end (or to the cut).
    let url = tender.url(&format!("/v2/ghcr.io/a/b/blobs/{d}"));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let resp = client().get(&url).send().await.unwrap();
                let status = resp.status().as_u16();
                let mut body = resp.bytes_stream();
                let mut n = 0usize;
                while let Some(chunk) = body.next().await {
                    match chunk {
                        Ok(c) => n += c.len(),
                        Err(_) => return (status, n, false),
                    }
                }
                (status, n, true)
            })
        })
        .collect();

    let first = fills_until(&tender, "a fill with bytes in", |v| {
        v["active"].as_array().is_some_and(|a| a.len() == 1 && a[0]["bytes"].as_u64() > Some(0))
    })
    .await;
    let f = &first["active"][0];
    let bytes_then = f["bytes"].as_u64().unwrap();
    assert_eq!(f["upstream"], "ghcr.io");
    assert_eq!(f["object"], d.as_str());
    assert_eq!(f["path"], format!("/v2/a/b/blobs/{d}"), "{f:#}");
    assert_eq!(f["total"], 2_000_000);
    assert_eq!(f["phase"], "streaming");
    assert!(f["startedAt"].as_u64().unwrap() > 1_700_000_000, "{f:#}");
    let id = f["id"].as_str().unwrap().to_string();
    let later = fills_until(&tender, "bytes growing, an ETA, both clients", |v| {
        let a = &v["active"][0];
        a["bytes"].as_u64() > Some(bytes_then) && a["etaSeconds"].as_u64().is_some() && a["clients"].as_u64() >= Some(2)
    })
    .await;
    let f = &later["active"][0];
    assert!(f["rate"].as_u64().unwrap() > 0, "{f:#}");
    // The status page shows it too, with the id an admin cancels it by.
    let page = client().get(tender.url("/")).send().await.unwrap().text().await.unwrap();
    let table = page.split("<table id=\"fills\">").nth(1).expect("a fills table").split("</table>").next().unwrap();
    assert!(table.contains("<tr class=\"fill\"><td>ghcr.io</td>") && table.contains(&id), "{table}");
    assert!(table.contains(&d[..19]) && table.contains(" of 1.9 MiB"), "{table}");
    assert_eq!(f["served"], 2, "{f:#}");
    assert_eq!(f["retries"], 0);

    // Cancelling takes the admin token.
    let del = |token: Option<&str>, id: &str| {
        let mut r = client().delete(tender.url(&format!("/api/v1/admin/fills/{id}")));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    assert_eq!(del(None, &id).await.unwrap().status(), 401);
    assert_eq!(del(Some("wrong"), &id).await.unwrap().status(), 401);
    assert_eq!(del(Some(ADMIN), "0000000000000000").await.unwrap().status(), 404);
    assert_eq!(del(Some(ADMIN), &id).await.unwrap().status(), 202);
    for r in readers {
        let (status, n, complete) = r.await.unwrap();
        assert_eq!(status, 200);
        assert!(!complete && n < blob.len(), "a cancelled fill's clients are cut, never given a whole body");
    }
    let after = fills_until(&tender, "the cancelled fill among the ended", |v| {
        v["active"].as_array().is_some_and(Vec::is_empty) && v["ended"].as_array().is_some_and(|e| !e.is_empty())
    })
    .await;
    let e = &after["ended"][0];
    assert_eq!(e["id"], id.as_str());
    assert_eq!(e["outcome"], "cancelled", "{e:#}");
    assert!(e["error"].as_str().unwrap().contains("cancelled by an operator"), "{e:#}");
    assert!(e["bytes"].as_u64().unwrap() > 0);
    let page = client().get(tender.url("/")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("no fill in progress"), "{page}");
    let ended = page.split("<table id=\"fills-ended\">").nth(1).expect("an ended-fills table");
    assert!(ended.contains(">cancelled</span>: ") && ended.contains("cancelled by an operator"), "{ended}");

    // A later client starts the fill again (resuming the spool) and gets the whole blob.
    *fake.state.steady.lock().unwrap() = None;
    let got = get(&url, &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(&got.body.unwrap()), d);
    let done = fills_until(&tender, "the committed fill", |v| {
        v["ended"].as_array().is_some_and(|e| e.iter().any(|x| x["outcome"] == "committed"))
    })
    .await;
    assert_eq!(done["ended"][0]["outcome"], "committed", "newest first: {done:#}");
}
