//! Blobs straight from a fake upstream, without a registry client in the way: small cold blobs
//! whose fills commit almost at once, each asked for by several clients together.

use std::collections::BTreeMap;
use std::sync::Arc;

use tender_e2e::digest::sha256;
use tender_e2e::http;
use tender_e2e::slow::SlowBlobServer;
use tender_e2e::tender::{write_config, Tender};
use tender_e2e::TestDir;

const BLOBS: usize = 48;
const CLIENTS: usize = 3;

#[test]
fn should_answer_every_cold_blob_with_its_bytes_however_fast_its_fill_commits() {
    let dir = TestDir::new("blobs");
    let blobs: Vec<(String, Arc<Vec<u8>>)> = (0..BLOBS)
        .map(|i| {
            let b: Vec<u8> = (0..200 + i * 37).map(|j| (i * 31 + j * 7) as u8).collect();
            (sha256(&b), Arc::new(b))
        })
        .collect();
    let upstream = SlowBlobServer::start_many("e2e/small", blobs.clone(), u64::MAX);
    let config = dir.path().join("tender.yaml");
    write_config(&config, &[("ghcr.io", &upstream.url())], "");
    let t = Tender::start(&config, &dir.path().join("data"), &dir.path().join("tender.log"));

    for round in ["cold", "warm"] {
        // Every client of every blob at once: fills commit while their readers are still
        // waiting for a worker thread.
        let clients: Vec<_> = blobs
            .iter()
            .flat_map(|(digest, body)| (0..CLIENTS).map(move |_| (digest.clone(), body.clone())))
            .map(|(digest, body)| {
                let addr = t.addr;
                std::thread::spawn(move || {
                    let path = format!("/v2/ghcr.io/e2e/small/blobs/{digest}");
                    match http::get(addr, &path) {
                        Ok(r) if r.status() == 200 && r.body == *body => None,
                        Ok(r) => Some(format!("{digest}: {} {}", r.status(), r.text())),
                        Err(e) => Some(format!("{digest}: {e}")),
                    }
                })
            })
            .collect();
        let failures: Vec<String> = clients.into_iter().filter_map(|c| c.join().expect("client thread")).collect();
        assert!(
            failures.is_empty(),
            "{round}: {} of {} GETs failed:\n{}",
            failures.len(),
            BLOBS * CLIENTS,
            failures.join("\n")
        );
    }

    let mut gets: BTreeMap<String, usize> = BTreeMap::new();
    for h in upstream.hits().into_iter().filter(|h| h.method == "GET") {
        *gets.entry(h.path).or_default() += 1;
    }
    assert_eq!(gets.len(), BLOBS, "{gets:#?}");
    assert!(gets.values().all(|n| *n == 1), "each blob fetched upstream once: {gets:#?}");
}
