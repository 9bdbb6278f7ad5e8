//! `tender fsck` on a real data directory: a corrupted object is found, quarantined by
//! `--repair`, and fetched again correctly by the next pull.

use std::time::Duration;

use tender_e2e::digest::{hex_of, verify_oci_layout};
use tender_e2e::registry::Sizes;
use tender_e2e::tender;

use crate::{oci, skopeo_pull, Bed};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn should_find_quarantine_and_refetch_a_corrupt_object() {
    let bed = Bed::new("fsck", Sizes::SMALL);
    let t = bed.start_tender("tender.log");
    let installer = bed.images.var("INSTALLER_MANIFEST").to_string();
    skopeo_pull(&t, "ghcr.io/siderolabs/installer:v1.10.5", &oci(&bed.path("pull-1")));
    verify_oci_layout(&bed.path("pull-1"));

    // Stop tender, then flip one byte in the middle of the installer's layer.
    let data = t.data.clone();
    assert_eq!(t.terminate(Duration::from_secs(10)).code(), Some(0));
    let layer = bed.images.config_and_layers(&installer)[1].clone();
    let hex = hex_of(&layer).to_string();
    let object = data.join("objects/sha256").join(&hex[..2]).join(&hex);
    let mut bytes =
        std::fs::read(&object).unwrap_or_else(|e| panic!("{layer} is not stored at {}: {e}", object.display()));
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&object, &bytes).unwrap();

    let d = data.as_os_str();
    let check = tender::run(["fsck".as_ref(), "--data".as_ref(), d]);
    assert_eq!(
        check.status.code(),
        Some(1),
        "fsck finds the corruption: {}{}",
        text(&check.stdout),
        text(&check.stderr)
    );
    assert!(text(&check.stdout).contains(&format!("corrupt {layer}")), "fsck names it: {}", text(&check.stdout));
    assert!(object.exists(), "fsck without --repair changes nothing");

    let json = tender::run(["fsck".as_ref(), "--data".as_ref(), d, "--json".as_ref()]);
    assert_eq!(json.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).expect("fsck --json prints JSON");
    assert_eq!(report["corrupt"], serde_json::json!([layer]), "{report}");

    let repair = tender::run(["fsck".as_ref(), "--data".as_ref(), d, "--repair".as_ref()]);
    assert_eq!(repair.status.code(), Some(0), "fsck --repair: {}{}", text(&repair.stdout), text(&repair.stderr));
    assert!(!object.exists(), "the corrupt object left objects/");
    let quarantined: Vec<String> = std::fs::read_dir(data.join("quarantine"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(quarantined.iter().any(|q| q.starts_with(&hex)), "it was moved to quarantine/: {quarantined:?}");
    let clean = tender::run(["fsck".as_ref(), "--data".as_ref(), d]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean.stdout));

    // Restart on the same directory; the next pull fetches that one layer again, and only it.
    let before = bed.registry.stats();
    let t = bed.start_tender("tender-2.log");
    skopeo_pull(&t, "ghcr.io/siderolabs/installer:v1.10.5", &oci(&bed.path("pull-2")));
    let (top, blobs) = verify_oci_layout(&bed.path("pull-2"));
    assert_eq!(top, [installer]);
    assert!(blobs.contains(&layer));
    let after = bed.registry.stats();
    assert_eq!(after.blob_gets, before.blob_gets + 1, "only the quarantined layer is fetched again: {after:?}");
    assert_eq!(after.blob_gets_by_digest.get(&layer), Some(&2), "{after:?}");
    assert_eq!(bed.images.blob_path(&layer).metadata().unwrap().len(), object.metadata().unwrap().len());
    assert_eq!(
        std::fs::read(&object).unwrap(),
        std::fs::read(bed.images.blob_path(&layer)).unwrap(),
        "stored again, intact"
    );
}

/// Issue 32 (12): bit rot in a stored object too large to be checked on every read is found
/// without `fsck`. A 2 MiB blob is pulled and stored; one byte of its object file flips while
/// tender runs; the next read is the object's first from the store since the start, so the
/// background scrub checks it at once, quarantines it (`tender_scrub_corrupt_objects_total`),
/// and the following pull fetches it again, whole and right. Before: served rotten until
/// `fsck` ran.
#[test]
fn should_find_bit_rot_by_scrubbing_and_fetch_the_object_again() {
    use std::sync::Arc;
    use tender_e2e::digest::sha256;
    use tender_e2e::{http, poll_until};
    let dir = tender_e2e::TestDir::new("scrub");
    let blob = tender_e2e::slow::noise(2 << 20);
    let digest = sha256(&blob);
    let upstream = tender_e2e::slow::SlowBlobServer::start("e2e/rot", &digest, Arc::new(blob), u64::MAX);
    let config = dir.path().join("tender.yaml");
    tender::write_config(&config, &[("ghcr.io", &upstream.url())], "cache:\n  scrubInterval: 24h\n");
    let data = dir.path().join("data");
    let t = tender::Tender::start(&config, &data, &dir.path().join("tender.log"));
    let path = format!("/v2/ghcr.io/e2e/rot/blobs/{digest}");
    let r = http::get(t.addr, &path).unwrap();
    assert_eq!((r.status(), sha256(&r.body)), (200, digest.clone()));
    let hex = hex_of(&digest).to_string();
    let object = data.join("objects/sha256").join(&hex[..2]).join(&hex);
    poll_until("the blob to be committed", Duration::from_secs(10), || object.exists().then_some(()));
    let mut bytes = std::fs::read(&object).unwrap();
    bytes[1 << 20] ^= 0x01;
    std::fs::write(&object, &bytes).unwrap();

    // The first read from the store since the start: scrubbed right after.
    let _ = http::get(t.addr, &path);
    poll_until("the scrub to find the rot", Duration::from_secs(20), || {
        let m = http::get(t.addr, "/metrics").ok()?.text();
        m.lines().any(|l| l.starts_with("tender_scrub_corrupt_objects_total 1")).then_some(())
    });
    assert!(!object.exists(), "the rotten object was quarantined");
    let r = http::get(t.addr, &path).unwrap();
    assert_eq!((r.status(), sha256(&r.body)), (200, digest.clone()), "fetched again, whole and right");
    let gets = upstream.hits().iter().filter(|h| h.method == "GET").count();
    assert_eq!(gets, 2, "one fetch, one more after the quarantine");
}
