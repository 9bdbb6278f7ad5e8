//! Replicas on shared S3 storage: two tenders on one bucket of a real S3 server (SeaweedFS) in
//! front of docker-registry. Clients spread over both replicas cost one upstream fetch per
//! blob in total (the fill lease); a replica killed mid-fill is taken over by the other once
//! its lease expires; a corrupted object in the bucket is found by `tender fsck --bucket` and
//! never served.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tender_e2e::http::Conn;
use tender_e2e::registry::Sizes;
use tender_e2e::s3::{S3Server, SECRET_ACCESS_KEY};
use tender_e2e::slow::{noise, SlowBlobServer};
use tender_e2e::tender::{self, write_config, Tender};
use tender_e2e::{poll_until, proc, TestDir};

use crate::{spawn_pull, wait_pulls, Bed};

const BUCKET: &str = "tender-e2e";

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// GET `path` whole: the status and the body's digest, or the error that cut it short.
fn get_digest(t: &Tender, path: &str, headers: &[(&str, &str)]) -> std::io::Result<(u16, String, u64)> {
    let mut h = Sha256::new();
    let mut n = 0u64;
    let head = Conn::open(t.addr)?.request_to("GET", path, headers, &mut |b| {
        h.update(b);
        n += b.len() as u64;
    })?;
    Ok((head.status, format!("sha256:{}", hex::encode(h.finalize())), n))
}

fn no_secret_in(log: &std::path::Path) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(!text.contains(SECRET_ACCESS_KEY), "{} shows the S3 secret key", log.display());
}

#[test]
fn should_share_a_bucket_between_replicas_and_never_serve_a_corrupt_object() {
    proc::need(&["skopeo"]);
    let bed = Bed::new("s3-share", Sizes::SMALL);
    let s3 = S3Server::start(bed.dir.path(), BUCKET);
    let upstream = [("ghcr.io", bed.registry.url())];
    let ups: Vec<(&str, &str)> = upstream.iter().map(|(n, u)| (*n, u.as_str())).collect();
    // Issue 36: the replicas share an index key (signed indexes, each byte hashed once).
    let key = bed.path("index-key");
    std::fs::write(&key, "7f3a0c9e51b2d4e8a6f0c3b7d9e1a5c28b4f6d0e2a9c7b5d3f1e8a6c4b2d0f9e\n").unwrap();
    let keyed = format!("    indexKeyFile: {}\n", key.display());
    let mut replicas = Vec::new();
    for name in ["a", "b", "c"] {
        let cfg = bed.path(&format!("{name}.yaml"));
        write_config(&cfg, &ups, &s3.storage_yaml(bed.dir.path(), "fleet", name, &keyed));
        replicas.push(cfg);
    }
    let a = Tender::start(&replicas[0], &bed.path("a-data"), &bed.path("a.log"));
    let b = Tender::start(&replicas[1], &bed.path("b-data"), &bed.path("b.log"));

    // Four skopeo clients at once, two on each replica.
    let pulls = (0..4)
        .map(|i| {
            let t = if i % 2 == 0 { &a } else { &b };
            let dest = bed.path(&format!("pull-{i}"));
            let child = spawn_pull(&t.hostport(), "ghcr.io/siderolabs/kubelet:v1.33.1", &dest);
            (dest, child)
        })
        .collect();
    wait_pulls(pulls, bed.images.var("KUBELET_INDEX"), "a replica");
    let stats = bed.registry.stats();
    assert!(!stats.blob_gets_by_digest.is_empty(), "blobs came from the upstream");
    for (digest, gets) in &stats.blob_gets_by_digest {
        assert_eq!(*gets, 1, "{digest} fetched {gets} times from the upstream by two replicas (one lease)");
    }
    // Each blob came from the upstream to one replica and through the bucket to the other,
    // which verified its chunks against the signed index and hashed no byte twice.
    let blob_bytes: u64 = stats
        .blob_gets_by_digest
        .keys()
        .map(|d| std::fs::metadata(bed.images.blob_path(d)).map(|m| m.len()).unwrap_or(0))
        .sum();
    let vouched: u64 = [&a, &b]
        .iter()
        .map(|t| {
            let m = tender_e2e::http::get(t.addr, "/metrics").unwrap().text();
            m.lines()
                .find_map(|l| l.strip_prefix("tender_bucket_vouched_bytes_total "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0) as u64
        })
        .sum();
    assert!(vouched > 0 && vouched <= blob_bytes, "bytes hashed once: {vouched} of {blob_bytes}");

    // A third replica answers ranges of every blob from the bucket without asking the upstream.
    let blob = stats
        .blob_gets_by_digest
        .keys()
        .max_by_key(|d| std::fs::metadata(bed.images.blob_path(d)).map(|m| m.len()).unwrap_or(0))
        .unwrap()
        .clone();
    let bytes = std::fs::read(bed.images.blob_path(&blob)).unwrap();
    let path = format!("/v2/ghcr.io/siderolabs/kubelet/blobs/{blob}");
    // The uploads follow the commits: wait until the bucket indexes the blob.
    let c = Tender::start(&replicas[2], &bed.path("c-data"), &bed.path("c.log"));
    poll_until("the blob to reach the bucket", Duration::from_secs(60), || {
        let r = Conn::open(c.addr).ok()?.request("HEAD", &path, &[]).ok()?;
        (r.status() == 200 && c.access().iter().any(|x| x.cache == "shared")).then_some(())
    });
    let r = Conn::open(c.addr).unwrap().request("GET", &path, &[("Range", "bytes=100-1099")]).unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(r.body, &bytes[100..1100]);
    assert_eq!(bed.registry.stats().blob_gets_by_digest[&blob], 1, "the range came from the bucket");

    // Bit rot in the bucket: fsck --bucket finds it, and no replica serves it.
    let rot = || {
        let (key, first) = s3.chunk_key("fleet", &blob, 1000);
        let end = (first as usize + (5 << 20)).min(bytes.len());
        let mut bad = bytes[first as usize..end].to_vec();
        bad[1000 - first as usize] ^= 0x01;
        s3.put(&key, &bad);
    };
    rot();
    let fsck = tender::run(["fsck", "--bucket", "--config", replicas[2].to_str().unwrap()]);
    let out = String::from_utf8_lossy(&fsck.stdout);
    assert_eq!(
        fsck.status.code(),
        Some(1),
        "fsck --bucket reports the corruption:\n{out}{}",
        String::from_utf8_lossy(&fsck.stderr)
    );
    assert!(out.contains(&format!("corrupt {blob}")), "{out}");
    let checked =
        out.lines().find(|l| l.contains(" checked ")).map(|l| l.split(", ").next().unwrap_or(l).to_string()).unwrap();
    // A range over the bad chunk is byte-exact, never cut: the copy from the bucket stops at the
    // bad chunk and the fill continues from the upstream at that byte; the replica then puts its
    // verified copy over the bad one, so the bucket heals by itself.
    let r = Conn::open(c.addr).unwrap().request("GET", &path, &[("Range", "bytes=0-2047")]).expect("a range, not cut");
    assert_eq!((r.status(), r.body.as_slice()), (206, &bytes[..2048]), "a byte-exact range");
    let clean = |what: &str| {
        poll_until(what, Duration::from_secs(60), || {
            let clean = tender::run(["fsck", "--bucket", "--config", replicas[2].to_str().unwrap()]);
            (clean.status.code() == Some(0) && String::from_utf8_lossy(&clean.stdout).contains(&checked)).then_some(())
        })
    };
    clean("the replica to heal the bucket");
    assert_eq!(bed.registry.stats().blob_gets_by_digest[&blob], 2, "the rest of the range came from the upstream");

    // Rot again. --repair hides it (index first) and moves it aside; a new replica's GET goes
    // to the upstream and puts a verified copy back.
    rot();
    let repair = tender::run(["fsck", "--bucket", "--repair", "--config", replicas[2].to_str().unwrap()]);
    assert_eq!(repair.status.code(), Some(0), "{}", String::from_utf8_lossy(&repair.stdout));
    assert!(String::from_utf8_lossy(&repair.stdout).contains("quarantined 1"));
    let d = Tender::start(&replicas[2], &bed.path("d-data"), &bed.path("d.log"));
    let (status, got, _) = get_digest(&d, &path, &[]).expect("GET after the repair");
    assert_eq!((status, got.as_str()), (200, blob.as_str()));
    assert_eq!(bed.registry.stats().blob_gets_by_digest[&blob], 3, "fetched again after the quarantine");
    clean("the bucket to be clean again");

    drop((a, b, c, d));
    for log in ["a.log", "b.log", "c.log", "d.log"] {
        no_secret_in(&bed.path(log));
        let text = std::fs::read_to_string(bed.path(log)).unwrap_or_default();
        assert!(!text.contains("7f3a0c9e51b2d4e8"), "the index key never in a log ({log})");
    }
}

#[test]
fn should_take_over_the_fill_of_a_replica_killed_mid_fill() {
    let dir = TestDir::new("s3-kill");
    let s3 = S3Server::start(dir.path(), BUCKET);
    const SIZE: usize = 40 << 20;
    let body = Arc::new(noise(SIZE));
    let digest = sha256(&body);
    let upstream = SlowBlobServer::start("e2e/big", &digest, body.clone(), 16 << 20);
    let mut cfgs = Vec::new();
    for name in ["a", "b"] {
        let cfg = dir.path().join(format!("{name}.yaml"));
        write_config(&cfg, &[("ghcr.io", &upstream.url())], &s3.storage_yaml(dir.path(), "kill", name, ""));
        cfgs.push(cfg);
    }
    let (a_data, b_data) = (dir.path().join("a-data"), dir.path().join("b-data"));
    let mut a = Tender::start(&cfgs[0], &a_data, &dir.path().join("a.log"));
    let b = Tender::start(&cfgs[1], &b_data, &dir.path().join("b.log"));
    let path = format!("/v2/ghcr.io/e2e/big/blobs/{digest}");

    // a starts the fill (and takes the lease); b's client waits for a.
    let first = {
        let (addr, path) = (a.addr, path.clone());
        std::thread::spawn(move || Conn::open(addr)?.request_to("GET", &path, &[], &mut |_| {}))
    };
    poll_until("a to be filling", Duration::from_secs(30), || {
        upstream.hits().iter().any(|h| h.method == "GET" && h.sent >= 4 << 20).then_some(())
    });
    let second = {
        let (addr, path) = (b.addr, path.clone());
        std::thread::spawn(move || {
            let mut h = Sha256::new();
            let head = Conn::open(addr)?.request_to("GET", &path, &[], &mut |x| h.update(x))?;
            Ok::<_, std::io::Error>((head.status, format!("sha256:{}", hex::encode(h.finalize()))))
        })
    };
    poll_until("b to wait for a's lease", Duration::from_secs(30), || {
        tender::tail(&dir.path().join("b.log"), 50).contains("another replica fetches this object").then_some(())
    });
    a.kill9();
    assert!(first.join().unwrap().is_err(), "a's client was cut short");

    // b takes the expired lease over and completes its client from the upstream.
    let (status, got) = second.join().unwrap().expect("b's client completes");
    assert_eq!((status, got.as_str()), (200, digest.as_str()));
    assert!(tender::tail(&dir.path().join("b.log"), 200).contains("took over an expired fill lease"));
    let gets = || upstream.hits().iter().filter(|h| h.method == "GET").count();
    assert_eq!(gets(), 2, "one upstream fetch per replica at most: a's cut, b's whole");

    // a restarts on its data directory and gets the object from the bucket, not the upstream.
    let a = Tender::start(&cfgs[0], &a_data, &dir.path().join("a2.log"));
    let (status, got, n) = poll_until("a to serve the blob again", Duration::from_secs(60), || {
        get_digest(&a, &path, &[]).ok().filter(|(s, _, _)| *s == 200)
    });
    assert_eq!((status, got.as_str(), n), (200, digest.as_str(), SIZE as u64));
    assert_eq!(gets(), 2, "the restarted replica copied from the bucket");
    let fsck = tender::run(["fsck", "--bucket", "--config", cfgs[0].to_str().unwrap()]);
    assert_eq!(fsck.status.code(), Some(0), "{}", String::from_utf8_lossy(&fsck.stdout));
    drop((a, b));
}

/// The uploads whose chunk objects the bucket holds (by upload id; the filer keeps a
/// directory after its last object went).
fn uploads_in(s3: &S3Server) -> Vec<String> {
    s3.list("abandon/parts").into_iter().filter(|u| !s3.list(&format!("abandon/parts/{u}")).is_empty()).collect()
}

/// Fill `path` through `t` (whole, byte-exact), then SIGKILL `t` as soon as its upload of the
/// object to the bucket is under way (chunk objects written, a progress record, no index).
fn kill_mid_upload(t: &mut Tender, s3: &S3Server, path: &str, digest: &str, size: usize) {
    let (status, got, n) = get_digest(t, path, &[]).expect("the fill");
    assert_eq!((status, got.as_str(), n), (200, digest, size as u64));
    let start = std::time::Instant::now();
    while uploads_in(s3).is_empty() || s3.list("abandon/progress").is_empty() {
        assert!(
            !s3.has(&format!("abandon/index/sha256/{}.json", &digest[7..])),
            "the upload finished before the test could kill its replica"
        );
        assert!(start.elapsed() < Duration::from_secs(60), "no upload of {digest} began");
        std::thread::sleep(Duration::from_millis(5));
    }
    t.kill9();
    assert!(!s3.has(&format!("abandon/index/sha256/{}.json", &digest[7..])), "killed before the upload finished");
}

#[test]
fn should_list_and_abort_the_upload_of_a_replica_killed_mid_upload() {
    let dir = TestDir::new("s3-abandoned");
    let s3 = S3Server::start(dir.path(), BUCKET);
    // leaseTtl 3s (storage_yaml): an upload unrenewed for 9 s, with no live lease, is abandoned.
    const SIZE: usize = 200 << 20;
    let (one, two) = (Arc::new(noise(SIZE)), Arc::new(noise(SIZE + 1)));
    let (d1, d2) = (sha256(&one), sha256(&two));
    let upstream = SlowBlobServer::start_many("e2e/big", vec![(d1.clone(), one), (d2.clone(), two)], 4 << 30);
    let mut cfgs = Vec::new();
    for name in ["a", "b"] {
        let cfg = dir.path().join(format!("{name}.yaml"));
        write_config(&cfg, &[("ghcr.io", &upstream.url())], &s3.storage_yaml(dir.path(), "abandon", name, ""));
        cfgs.push(cfg);
    }
    let fsck = |repair: bool| {
        let mut args = vec!["fsck", "--bucket", "--config", cfgs[1].to_str().unwrap()];
        if repair {
            args.push("--repair");
        }
        let out = tender::run(args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };

    // a is killed mid-upload: its chunk objects stay.
    let mut a = Tender::start(&cfgs[0], &dir.path().join("a-data"), &dir.path().join("a.log"));
    kill_mid_upload(&mut a, &s3, &format!("/v2/ghcr.io/e2e/big/blobs/{d1}"), &d1, SIZE);
    let killed = std::time::Instant::now();
    let held = uploads_in(&s3);
    assert_eq!(held.len(), 1, "{held:?}");
    // Younger than 3 x leaseTtl: not abandoned, not listed.
    let young = fsck(false);
    assert!(!young.contains("abandoned upload"), "{young}");

    // Once 3 x leaseTtl passed without renewal, fsck --bucket lists it; --repair removes it.
    let listed = poll_until("fsck --bucket to list the abandoned upload", Duration::from_secs(60), || {
        let out = fsck(false);
        out.contains(&format!("abandoned upload {d1} by a")).then_some(out)
    });
    let after = killed.elapsed();
    eprintln!("abandoned upload listed {after:?} after the kill (leaseTtl 3s)");
    assert!(after >= Duration::from_secs(7), "listed {after:?} after the kill, before 3 x leaseTtl");
    assert!(listed.contains("run with --repair"), "{listed}");
    assert_eq!(uploads_in(&s3), held, "listing removes nothing");
    let repaired = fsck(true);
    assert!(repaired.contains(&format!("abandoned upload {d1} by a")) && repaired.contains("removed"), "{repaired}");
    assert!(uploads_in(&s3).is_empty(), "the upload's chunks are gone from SeaweedFS");
    assert!(s3.list("abandon/progress").is_empty(), "its record is gone");
    assert!(!fsck(false).contains("abandoned upload"));

    // a runs again; b is killed mid-upload of another blob: a's background sweep removes it.
    let a = Tender::start(&cfgs[0], &dir.path().join("a-data"), &dir.path().join("a2.log"));
    let mut b = Tender::start(&cfgs[1], &dir.path().join("b-data"), &dir.path().join("b.log"));
    kill_mid_upload(&mut b, &s3, &format!("/v2/ghcr.io/e2e/big/blobs/{d2}"), &d2, SIZE + 1);
    let killed = std::time::Instant::now();
    assert_eq!(uploads_in(&s3).len(), 1);
    poll_until("a's sweep to remove b's abandoned upload", Duration::from_secs(60), || {
        uploads_in(&s3).is_empty().then_some(())
    });
    let after = killed.elapsed();
    eprintln!("abandoned upload removed by a sweep {after:?} after the kill");
    assert!(after >= Duration::from_secs(7), "removed {after:?} after the kill, before 3 x leaseTtl");
    // The line follows the abort: wait for it (bounded) rather than race it.
    poll_until("a to log the aborted upload", Duration::from_secs(15), || {
        tender::tail(&dir.path().join("a2.log"), 5000).contains("removed an abandoned upload").then_some(())
    });
    assert!(s3.list("abandon/progress").is_empty(), "its record is gone");
    drop(a);
}
