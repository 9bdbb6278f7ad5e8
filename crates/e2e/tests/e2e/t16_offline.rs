//! Issue 20 item 4: the offline policy, with a real docker-registry stopped. With
//! `staleMaxAge: never` (the default) pulls by tag keep working however long the outage; with a
//! limit, an older tag fails with an error that names `staleMaxAge`.

use std::time::Duration;

use tender_e2e::registry::Sizes;
use tender_e2e::tender::{write_config, Tender};
use tender_e2e::{http, poll_until};

use crate::{oci, skopeo_pull, Bed};

const TAG: &str = "ghcr.io/siderolabs/installer:v1.10.5";
const PATH: &str = "/v2/ghcr.io/siderolabs/installer/manifests/v1.10.5";

#[test]
fn should_keep_pulls_by_tag_working_with_the_upstream_stopped_past_a_short_stale_max_age() {
    let bed = Bed::new("offline", Sizes::SMALL);
    let url = bed.registry.url();
    // tagTtl 0: every pull asks the upstream, so every pull after the stop is a stale answer.
    write_config(&bed.path("never.yaml"), &[("ghcr.io", &url)], "fetch:\n  tagTtl: 0s\n  staleMaxAge: never\n");
    write_config(&bed.path("limited.yaml"), &[("ghcr.io", &url)], "fetch:\n  tagTtl: 0s\n  staleMaxAge: 2s\n");
    let never = Tender::start(&bed.path("never.yaml"), &bed.path("data-never"), &bed.path("never.log"));
    let limited = Tender::start(&bed.path("limited.yaml"), &bed.path("data-limited"), &bed.path("limited.log"));
    skopeo_pull(&never, TAG, &oci(&bed.path("pulled-never-1")));
    skopeo_pull(&limited, TAG, &oci(&bed.path("pulled-limited-1")));

    let Bed { registry, images: _images, dir } = bed;
    drop(registry);

    // The limited tender serves the tag stale until it is older than 2 s, then refuses it
    // naming the key (bounded: well within 30 s).
    let limited_addr = limited.hostport().parse().unwrap();
    let refused = poll_until("the limited tender to refuse the tag past staleMaxAge", Duration::from_secs(30), || {
        let r = http::request(limited_addr, "GET", PATH, &[]).ok()?;
        match r.status() {
            200 => None,
            _ => Some((r.status(), r.text())),
        }
    });
    assert_eq!(refused.0, 503, "{}", refused.1);
    assert!(refused.1.contains("staleMaxAge"), "the error names the limit: {}", refused.1);

    // Past that same age, `never` keeps resolving the tag: a full pull by tag, and the stale age.
    skopeo_pull(&never, TAG, &oci(&dir.path().join("pulled-never-2")));
    let r = http::request(never.hostport().parse().unwrap(), "GET", PATH, &[]).unwrap();
    assert_eq!(r.status(), 200);
    let age: u64 = r.header("x-tender-stale").expect("X-Tender-Stale on a stale answer").parse().unwrap();
    assert!(age >= 2, "the answer is older than the other tender's limit: {age}");
    assert!(never.access().iter().any(|a| a.cache == "stale"), "answered stale");
    let health = http::get(never.hostport().parse().unwrap(), "/api/v1/health").unwrap().text();
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["upstreams"][0]["name"], "ghcr.io", "{health}");
    assert_eq!(health["upstreams"][0]["state"], "down", "{health}");
    assert_eq!(health["upstreams"][0]["lastError"]["cause"], "connect", "{health}");
    assert!(health["staleServed"].as_u64().unwrap() >= 1, "{health}");
    // Each failed attempt is logged at WARN with its cause and the whole chain.
    let warned = never.log_json().into_iter().any(|l| {
        l["level"] == "WARN"
            && l["message"] == "upstream request failed"
            && l["cause"] == "connect"
            && l["error"].as_str().is_some_and(|e| e.contains("Connection refused"))
    });
    assert!(warned, "a WARN line with the cause chain");
}

/// Issue 21 item 3: `tender serve --offline` contacts no upstream. What the data directory
/// holds is served as if pulled through (skopeo pulls the image by tag, byte-exact); a miss is
/// a 404 at once, with an upstream that would never answer (a silent listener) configured, and
/// the health says `offline`.
#[test]
fn should_serve_what_it_holds_offline_and_answer_a_miss_at_once() {
    let bed = Bed::new("offline-flag", Sizes::SMALL);
    write_config(&bed.path("online.yaml"), &[("ghcr.io", &bed.registry.url())], "");
    let online = Tender::start(&bed.path("online.yaml"), &bed.path("data"), &bed.path("online.log"));
    skopeo_pull(&online, TAG, &oci(&bed.path("pulled-online")));
    assert_eq!(online.terminate(Duration::from_secs(10)).code(), Some(0));

    // The same data directory, its upstream now an address that accepts and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    write_config(&bed.path("offline.yaml"), &[("ghcr.io", &silent_url)], "");
    let offline =
        Tender::start_with(&bed.path("offline.yaml"), &bed.path("data"), &bed.path("offline.log"), &["--offline"]);
    skopeo_pull(&offline, TAG, &oci(&bed.path("pulled-offline")));
    let addr = offline.hostport().parse().unwrap();
    let r = http::request(addr, "GET", PATH, &[]).unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.header("x-tender-stale").is_none(), "an offline upstream's answer is not stale");

    let started = std::time::Instant::now();
    let miss = http::get(addr, "/v2/ghcr.io/siderolabs/installer/manifests/v9.9.9").unwrap();
    assert_eq!(miss.status(), 404, "{}", miss.text());
    assert!(miss.text().contains("offline"), "{}", miss.text());
    let blob = format!("/v2/ghcr.io/siderolabs/installer/blobs/sha256:{}", "0".repeat(64));
    assert_eq!(http::get(addr, &blob).unwrap().status(), 404);
    assert!(started.elapsed() < Duration::from_secs(2), "no connect or first-byte timeout: {:?}", started.elapsed());
    silent.set_nonblocking(true).unwrap();
    assert!(silent.accept().is_err(), "the upstream was never contacted");

    let health: serde_json::Value = serde_json::from_str(&http::get(addr, "/api/v1/health").unwrap().text()).unwrap();
    assert_eq!(health["upstreams"][0]["state"], "offline", "{health}");
    assert_eq!(health["staleServed"], 0, "{health}");
}
