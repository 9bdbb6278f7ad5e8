//! `tender gc --bucket`: two replicas on one bucket of a real S3 server (SeaweedFS) record what
//! they served (flushed at shutdown); the command evicts the least recently served blobs down
//! to `--max-size` (a dry run first changes nothing), and a replica then serves every blob
//! byte-exact: the kept ones from the bucket, the evicted ones from the upstream again.
//! Keys nothing names (issue 36, items 4 and 5) are counted by gc, reported and removed by
//! fsck, and removed by a running replica's sweep.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest as _, Sha256};
use tender_e2e::http::Conn;
use tender_e2e::poll_until;
use tender_e2e::registry::Sizes;
use tender_e2e::s3::S3Server;
use tender_e2e::tender::{self, write_config, Tender};

use crate::Bed;

const BUCKET: &str = "tender-e2e";
const REPO: &str = "/v2/ghcr.io/siderolabs/kubelet/blobs";

fn get(t: &Tender, d: &str) -> Vec<u8> {
    let r = Conn::open(t.addr).unwrap().request("GET", &format!("{REPO}/{d}"), &[]).unwrap();
    assert_eq!(r.status(), 200, "{d}");
    r.body
}

fn json(s3: &S3Server, key: &str) -> Value {
    serde_json::from_slice(&s3.get(key).unwrap_or_else(|| panic!("{key} in the bucket"))).unwrap()
}

fn gc(cfg: &std::path::Path, max: u64, dry_run: bool) -> Value {
    let max = max.to_string();
    let mut args = vec!["gc", "--bucket", "--config", cfg.to_str().unwrap(), "--max-size", &max, "--json"];
    if dry_run {
        args.push("--dry-run");
    }
    let out = tender::run(&args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn should_evict_the_least_recently_served_blobs_and_still_serve_every_blob() {
    let bed = Bed::new("s3-gc", Sizes::SMALL);
    let s3 = S3Server::start(bed.dir.path(), BUCKET);
    let ups = [("ghcr.io", bed.registry.url())];
    let ups: Vec<(&str, &str)> = ups.iter().map(|(n, u)| (*n, u.as_str())).collect();
    let cfg = |name: &str| {
        let p = bed.path(&format!("{name}.yaml"));
        write_config(&p, &ups, &s3.storage_yaml(bed.dir.path(), "fleet", name, "    gcGrace: 0s\n"));
        p
    };
    let (a_cfg, b_cfg, c_cfg) = (cfg("a"), cfg("b"), cfg("c"));
    let mut blobs: Vec<(String, Vec<u8>)> = Vec::new();
    for m in ["KUBELET_AMD64", "KUBELET_ARM64"] {
        for d in bed.images.config_and_layers(bed.images.var(m)) {
            if blobs.iter().any(|(x, _)| *x == d) {
                continue;
            }
            blobs.push((d.clone(), std::fs::read(bed.images.blob_path(&d)).unwrap()));
        }
    }
    assert!(blobs.len() >= 4, "{} blobs", blobs.len());

    // a serves the first half, b the rest; then both stop (flushing their served records)
    // once every blob is in the bucket.
    let a = Tender::start(&a_cfg, &bed.path("a-data"), &bed.path("a.log"));
    let b = Tender::start(&b_cfg, &bed.path("b-data"), &bed.path("b.log"));
    let half = blobs.len() / 2;
    for (i, (d, bytes)) in blobs.iter().enumerate() {
        let body = get(if i < half { &a } else { &b }, d);
        assert!(body == *bytes, "{d}");
    }
    for (d, _) in &blobs {
        let key = format!("fleet/index/sha256/{}.json", &d[7..]);
        poll_until("every blob to reach the bucket", Duration::from_secs(60), || s3.has(&key).then_some(()));
    }
    assert!(a.terminate(Duration::from_secs(20)).success());
    assert!(b.terminate(Duration::from_secs(20)).success());

    // Each replica recorded what it served; the expected order comes from those records.
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for (replica, served) in [("a", &blobs[..half]), ("b", &blobs[half..])] {
        let mut names = BTreeMap::new();
        for shard in s3.list(&format!("fleet/served/{replica}")) {
            let r = json(&s3, &format!("fleet/served/{replica}/{shard}"));
            assert_eq!(r["replica"], replica);
            for (d, t) in r["served"].as_object().unwrap() {
                names.insert(d.clone(), t.as_u64().unwrap());
            }
        }
        for (d, _) in served {
            assert!(names.contains_key(d), "{replica} recorded serving {d}: {names:?}");
        }
        for (d, t) in names {
            let e = last.entry(d).or_insert(t);
            *e = (*e).max(t);
        }
    }
    let mut order: Vec<(u64, String, u64)> = blobs
        .iter()
        .map(|(d, bytes)| {
            let uploaded = json(&s3, &format!("fleet/index/sha256/{}.json", &d[7..]))["uploadedAt"].as_u64().unwrap();
            (last.get(d).copied().unwrap_or(0).max(uploaded), d.clone(), bytes.len() as u64)
        })
        .collect();
    order.sort();
    let total: u64 = order.iter().map(|o| o.2).sum();
    let want: Vec<&str> = order[..2].iter().map(|o| o.1.as_str()).collect();
    // The cap is on every byte under the prefix (records too): the two blobs' content less
    // than the bucket holds (their index and known records go with them).
    let whole = gc(&c_cfg, 1 << 50, true)["totalBytesBefore"].as_u64().unwrap();
    assert!(whole > total, "{whole} bytes under the prefix, {total} of content");
    let max = whole - order[0].2 - order[1].2;

    // A dry run reports the two least recently served and changes nothing.
    let dry = gc(&c_cfg, max, true);
    let names = |r: &Value| -> Vec<String> {
        r["evicted"].as_array().unwrap().iter().map(|e| e["digest"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&dry), want, "{dry:#}");
    assert_eq!(dry["dryRun"], true);
    for (d, _) in &blobs {
        assert!(s3.has(&format!("fleet/index/sha256/{}.json", &d[7..])), "{d} kept by the dry run");
    }
    // The same, for people: a line per object and the sizes.
    let human = tender::run([
        "gc",
        "--bucket",
        "--config",
        c_cfg.to_str().unwrap(),
        "--max-size",
        &max.to_string(),
        "--dry-run",
    ]);
    let out = String::from_utf8_lossy(&human.stdout);
    assert_eq!(human.status.code(), Some(0), "{out}");
    for d in &want {
        assert!(out.contains(&format!("would evict {d} (")), "{out}");
    }
    let freed = dry["totalBytesBefore"].as_u64().unwrap() - dry["totalBytesAfter"].as_u64().unwrap();
    assert!(freed > whole - max, "the two blobs' records go too: {dry:#}");
    assert!(out.contains(&format!("would free {freed} bytes from 2 objects and 0 strays")), "{out}");

    // Each blob's first chunk object, read from its index while it has one.
    let first_chunk: Vec<String> = blobs.iter().map(|(d, _)| s3.chunk_key("fleet", d, 0).0).collect();
    let r = gc(&c_cfg, max, false);
    assert_eq!(names(&r), want, "{r:#}");
    assert_eq!(
        (&r["dryRun"], &r["maxSize"], &r["objectsBefore"], &r["bytesBefore"]),
        (&Value::from(false), &Value::from(max), &Value::from(blobs.len()), &Value::from(total))
    );
    assert_eq!(
        (&r["objectsAfter"], &r["bytesAfter"]),
        (&Value::from(blobs.len() - 2), &Value::from(total - order[0].2 - order[1].2))
    );
    assert!(r["totalBytesAfter"].as_u64().unwrap() <= max, "{r:#}");
    assert_eq!((&r["contentBytes"], &r["strayBytes"]), (&Value::from(total), &Value::from(0)));
    assert_eq!((&r["skippedUnderLease"], &r["skippedRecent"]), (&Value::from(0), &Value::from(0)));
    assert_eq!(r["evicted"][0]["lastServed"], order[0].0);
    for ((d, _), chunk) in blobs.iter().zip(&first_chunk) {
        let hex = &d[7..];
        let gone = want.contains(&d.as_str());
        assert_eq!(s3.has(&format!("fleet/index/sha256/{hex}.json")), !gone, "{d}: index");
        assert_eq!(s3.has(chunk), !gone, "{d}: content ({chunk})");
    }
    // Under the cap now: a second run evicts nothing.
    assert_eq!(names(&gc(&c_cfg, max, false)), Vec::<String>::new());

    // A new replica serves every blob byte-exact: the evicted ones from the upstream again, the
    // rest from the bucket.
    let c = Tender::start(&c_cfg, &bed.path("c-data"), &bed.path("c.log"));
    for (d, bytes) in &blobs {
        let body = get(&c, d);
        assert!(format!("sha256:{}", hex::encode(Sha256::digest(&body))) == *d && body == *bytes, "{d} through c");
        let gets = bed.registry.stats().blob_gets_by_digest[d];
        assert_eq!(gets, if want.contains(&d.as_str()) { 2 } else { 1 }, "{d}: upstream fetches");
    }
    // And the replica that first served a blob still has it (its local copy).
    let a = Tender::start(&a_cfg, &bed.path("a-data"), &bed.path("a.log"));
    for (d, bytes) in &blobs[..half] {
        assert!(get(&a, d) == *bytes, "{d} through a");
    }
}

/// `tender fsck --bucket` with `--json`: its exit code and report.
fn fsck(cfg: &std::path::Path, repair: bool) -> (Option<i32>, Value) {
    let mut args = vec!["fsck", "--bucket", "--config", cfg.to_str().unwrap(), "--json"];
    if repair {
        args.push("--repair");
    }
    let out = tender::run(&args);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code(), v)
}

fn stray_keys(r: &Value) -> Vec<String> {
    let mut keys: Vec<String> =
        r["strays"].as_array().unwrap().iter().map(|s| s["key"].as_str().unwrap().to_string()).collect();
    keys.sort();
    keys
}

/// Issue 36 (4, 5): chunk objects no index and no upload record names and a probe object a
/// timed-out check left behind are counted by `gc --bucket`, reported by `fsck --bucket` (exit
/// 0: nothing served is wrong) and removed by `--repair`; fsck then reports nothing, though
/// SeaweedFS still lists the emptied upload directory; a running replica's sweep removes such
/// keys once older than `gcGrace`, and keeps the chunks of what it uploaded.
#[test]
fn should_count_report_and_remove_keys_nothing_names() {
    let bed = Bed::new("s3-strays", Sizes::SMALL);
    let s3 = S3Server::start(bed.dir.path(), BUCKET);
    let ups = [("ghcr.io", bed.registry.url())];
    let ups: Vec<(&str, &str)> = ups.iter().map(|(n, u)| (*n, u.as_str())).collect();
    let cfg = bed.path("a.yaml");
    // A probe is a stray once older than gcGrace and 3 x requestTimeout: 6 s here.
    let extra = "    gcGrace: 1s\n    requestTimeout: 2s\n";
    write_config(&cfg, &ups, &s3.storage_yaml(bed.dir.path(), "fleet", "a", extra));
    let strays = |upload: &str, probe: &str| {
        for i in 0..2u8 {
            s3.put(&format!("fleet/parts/{upload}/{i:08}"), &vec![i; 1000]);
        }
        s3.put(&format!("fleet/leases/{probe}"), b"{}");
    };
    let first = "a".repeat(32);
    strays(&first, ".probe-x-1");
    let want = vec![format!("leases/.probe-x-1"), format!("parts/{first}")];
    std::thread::sleep(Duration::from_secs(7));

    // gc counts them (and a dry run removes nothing).
    let dry = gc(&cfg, 1 << 40, true);
    assert_eq!((dry["strayBytes"].as_u64(), stray_keys(&dry)), (Some(2002), want.clone()), "{dry:#}");
    assert!(dry["totalBytesBefore"].as_u64().unwrap() >= 2002, "{dry:#}");
    assert_eq!(dry["totalBytesAfter"].as_u64().unwrap(), dry["totalBytesBefore"].as_u64().unwrap() - 2002);
    assert!(s3.has(&format!("fleet/parts/{first}/00000000")));
    // fsck reports them, with their bytes; --repair removes them.
    let (code, r) = fsck(&cfg, false);
    assert_eq!((code, r["strayBytes"].as_u64(), stray_keys(&r)), (Some(0), Some(2002), want.clone()), "{r:#}");
    assert_eq!(r["unindexed"], serde_json::json!([format!("parts/{first}")]));
    let (code, r) = fsck(&cfg, true);
    assert_eq!((code, stray_keys(&r)), (Some(0), want.clone()), "{r:#}");
    assert!(r["strays"].as_array().unwrap().iter().all(|s| s["removed"] == true), "{r:#}");
    assert!(!s3.has(&format!("fleet/parts/{first}/00000000")) && !s3.has("fleet/leases/.probe-x-1"));
    eprintln!("SeaweedFS lists under fleet/parts after the repair: {:?}", s3.list("fleet/parts"));
    // Repaired: nothing to report, though the emptied directory may still be listed.
    let (code, r) = fsck(&cfg, false);
    assert_eq!(
        (code, stray_keys(&r), &r["unindexed"]),
        (Some(0), Vec::<String>::new(), &serde_json::json!([])),
        "{r:#}"
    );

    // A running replica uploads a blob, and its sweep (every 3 x leaseTtl, 9 s) removes new
    // strays once older than gcGrace; the blob's chunks stay.
    let a = Tender::start(&cfg, &bed.path("a-data"), &bed.path("a.log"));
    let d = bed.images.config_and_layers(bed.images.var("KUBELET_AMD64")).remove(0);
    let bytes = std::fs::read(bed.images.blob_path(&d)).unwrap();
    assert!(get(&a, &d) == bytes, "{d}");
    let index = format!("fleet/index/sha256/{}.json", &d[7..]);
    poll_until("the blob to reach the bucket", Duration::from_secs(60), || s3.has(&index).then_some(()));
    let second = "b".repeat(32);
    strays(&second, ".probe-x-2");
    poll_until("the sweep to remove the strays", Duration::from_secs(60), || {
        (!s3.has(&format!("fleet/parts/{second}/00000000")) && !s3.has("fleet/leases/.probe-x-2")).then_some(())
    });
    assert!(s3.has(&index));
    let (chunk, _) = s3.chunk_key("fleet", &d, 0);
    assert!(s3.has(&chunk), "the sweep keeps what an index names: {chunk}");
    assert!(get(&a, &d) == bytes, "{d}");
    poll_until("a to log the removal", Duration::from_secs(15), || {
        tender::tail(&bed.path("a.log"), 5000).contains("removed keys nothing in the bucket names").then_some(())
    });
    let (code, r) = fsck(&cfg, false);
    assert_eq!((code, stray_keys(&r)), (Some(0), Vec::<String>::new()), "{r:#}");
    assert_eq!(r["objectsChecked"], 1);
}
