//! The process around the server: the data-directory lock, config errors, SIGTERM (idle and
//! with a download in flight), SIGHUP.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tender_e2e::containerd::UNREACHABLE;
use tender_e2e::digest::sha256;
use tender_e2e::http::{self, Conn};
use tender_e2e::poll_until;
use tender_e2e::registry::Sizes;
use tender_e2e::slow::{noise, SlowBlobServer};
use tender_e2e::tender::{self, write_config, Tender};
use tender_e2e::TestDir;

use crate::Bed;

const INDEX_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn should_refuse_a_second_server_on_the_same_data_dir() {
    let dir = TestDir::new("lock");
    let config = dir.path().join("tender.yaml");
    write_config(&config, &[("ghcr.io", UNREACHABLE)], "");
    let data = dir.path().join("data");
    let first = Tender::start(&config, &data, &dir.path().join("tender.log"));

    let second = tender::run([
        "serve".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
        "--data".as_ref(),
        data.as_os_str(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
    ]);
    let stderr = text(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "second serve on the same --data: {stderr}");
    assert!(stderr.contains("in use by another tender"), "the refusal says why: {stderr}");
    assert!(stderr.contains(&first.pid().to_string()), "the refusal names the holder's pid: {stderr}");

    let health = http::get(first.addr, "/healthz").expect("the first tender still answers");
    assert_eq!(health.status(), 200);
}

#[test]
fn should_exit_2_naming_an_unknown_config_key() {
    let dir = TestDir::new("config");
    let cases = [
        ("top level", "listen: 127.0.0.1:0\nmirrorEverything: true\n", "mirrorEverything"),
        (
            "upstream",
            "upstreams:\n  - name: ghcr.io\n    url: http://127.0.0.1:1\n    insecureSkipTLS: true\n",
            "insecureSkipTLS",
        ),
        ("fetch", "fetch:\n  retries: 3\n", "retries"),
        ("cache", "cache:\n  maxsize: 1Gi\n", "maxsize"),
    ];
    for (i, (what, yaml, key)) in cases.iter().enumerate() {
        let config = dir.path().join(format!("bad-{i}.yaml"));
        std::fs::write(&config, yaml).unwrap();
        let data = dir.path().join(format!("data-{i}"));
        let out = tender::run([
            "serve".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
            "--data".as_ref(),
            data.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
        ]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: an unknown key is a config error: {stderr}");
        assert!(stderr.contains(key), "{what}: the message names {key:?}: {stderr}");
        assert!(!data.exists(), "{what}: a refused config leaves no data directory behind");
    }
}

#[test]
fn should_exit_0_soon_after_sigterm_with_an_idle_client_connected() {
    let dir = TestDir::new("sigterm");
    let config = dir.path().join("tender.yaml");
    write_config(&config, &[("ghcr.io", UNREACHABLE)], "");
    let t = Tender::start(&config, &dir.path().join("data"), &dir.path().join("tender.log"));

    // A keep-alive connection left open, as containerd and kubelet leave theirs.
    let mut idle = Conn::open(t.addr).unwrap();
    assert_eq!(idle.request("GET", "/healthz", &[]).unwrap().status(), 200);

    let status = t.terminate(Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean shutdown: {status}");
    drop(idle);
}

#[test]
fn should_finish_an_in_flight_download_on_sigterm_then_exit_0() {
    let dir = TestDir::new("drain");
    let body = Arc::new(noise(16 << 20));
    let digest = sha256(&body);
    let upstream = SlowBlobServer::start("e2e/drain", &digest, body.clone(), 16 << 20);
    let config = dir.path().join("tender.yaml");
    write_config(&config, &[("ghcr.io", &upstream.url())], "");
    let t = Tender::start(&config, &dir.path().join("data"), &dir.path().join("tender.log"));

    let received = Arc::new(AtomicU64::new(0));
    let client = {
        let (addr, path, received) = (t.addr, format!("/v2/ghcr.io/e2e/drain/blobs/{digest}"), received.clone());
        std::thread::spawn(move || {
            let mut body = Vec::new();
            let head = Conn::open(addr)?.request_to("GET", &path, &[], &mut |b| {
                received.fetch_add(b.len() as u64, Ordering::SeqCst);
                body.extend_from_slice(b);
            })?;
            Ok::<_, std::io::Error>((head.status, body))
        })
    };
    poll_until("the download to be under way", Duration::from_secs(20), || {
        (received.load(Ordering::SeqCst) >= 2 << 20).then_some(())
    });
    let status = t.terminate(Duration::from_secs(15));
    let (code, got) = client.join().expect("client thread").expect("the in-flight download completes after SIGTERM");
    assert_eq!(code, 200);
    assert_eq!(sha256(&got), digest, "the in-flight client got the whole blob");
    assert_eq!(status.code(), Some(0), "and tender then exited cleanly: {status}");
}

#[test]
fn should_route_a_new_upstream_after_sighup_without_restarting() {
    let bed = Bed::new("sighup", Sizes::KUBELET);
    let mut t = bed.start_tender("tender.log");
    let path = "/v2/siderolabs/kubelet/manifests/v1.33.1?ns=quay.io";
    let index = bed.images.var("KUBELET_INDEX").to_string();

    // One keep-alive connection for the whole test: the reload must not drop it.
    let mut conn = Conn::open(t.addr).unwrap();
    let before = bed.registry.stats();
    let r = conn.request("GET", path, &[("Accept", INDEX_ACCEPT)]).unwrap();
    assert_eq!(r.status(), 404, "quay.io is not configured yet: {}", r.text());
    assert!(r.text().contains("NAME_UNKNOWN"), "an unknown ns is NAME_UNKNOWN: {}", r.text());
    assert_eq!(bed.registry.stats().requests, before.requests, "an unknown ns sends nothing upstream");

    let pid = t.pid();
    write_config(&t.config, &[("ghcr.io", &bed.registry.url()), ("quay.io", &bed.registry.url())], "");
    t.signal("HUP");
    let r = poll_until("?ns=quay.io to route after SIGHUP", Duration::from_secs(10), || {
        let r = conn
            .request("GET", path, &[("Accept", INDEX_ACCEPT)])
            .expect("the keep-alive connection opened before the reload still works");
        (r.status() == 200).then_some(r)
    });
    assert_eq!(r.header("docker-content-digest"), Some(index.as_str()));
    assert_eq!(tender_e2e::digest::sha256(&r.body), index);

    assert_eq!(t.pid(), pid);
    assert!(t.try_wait().is_none(), "tender kept running through the reload");
    let quay: Vec<_> = t.access().into_iter().filter(|a| a.ns == "quay.io").collect();
    assert_eq!(quay.first().map(|a| a.status), Some(404), "{quay:?}");
    assert!(quay.iter().any(|a| a.status == 200 && a.upstream == "quay.io"), "{quay:?}");
}
