//! `kill -9` in the middle of a fill: nothing partial becomes visible, and the restarted tender
//! resumes from its spool file with `Range: bytes=N-` instead of starting over.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tender_e2e::digest::{hex_of, sha256};
use tender_e2e::http::Conn;
use tender_e2e::poll_until;
use tender_e2e::slow::{noise, SlowBlobServer};
use tender_e2e::tender::{self, write_config, Tender};
use tender_e2e::TestDir;

const BLOB_BYTES: usize = 64 << 20;
const RATE: u64 = 20 << 20;
/// Kill tender once its spool holds this much.
const KILL_AT: u64 = 6 << 20;

/// The `.part` files in the spool directory with their sizes.
fn spool_files(data: &std::path::Path) -> Vec<(std::path::PathBuf, u64)> {
    let Ok(entries) = std::fs::read_dir(data.join("spool")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
        .map(|e| (e.path(), e.metadata().map(|m| m.len()).unwrap_or(0)))
        .collect()
}

/// Every file under objects/ whose name is `hex`.
fn objects_named(data: &std::path::Path, hex: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![data.join("objects")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.file_name().to_string_lossy().contains(hex) {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn should_resume_a_fill_from_its_spool_after_kill_9() {
    let dir = TestDir::new("crash");
    let body = Arc::new(noise(BLOB_BYTES));
    let digest = sha256(&body);
    let hex = hex_of(&digest).to_string();
    let upstream = SlowBlobServer::start("e2e/big", &digest, body.clone(), RATE);
    let config = dir.path().join("tender.yaml");
    write_config(&config, &[("ghcr.io", &upstream.url())], "");
    let data = dir.path().join("data");
    let path = format!("/v2/ghcr.io/e2e/big/blobs/{digest}");

    // A client starts the pull; tender begins filling its spool.
    let mut t = Tender::start(&config, &data, &dir.path().join("tender-1.log"));
    let received = Arc::new(AtomicU64::new(0));
    let client = {
        let (addr, path, received) = (t.addr, path.clone(), received.clone());
        std::thread::spawn(move || {
            let mut conn = Conn::open(addr)?;
            conn.request_to("GET", &path, &[], &mut |b| {
                received.fetch_add(b.len() as u64, Ordering::SeqCst);
            })
        })
    };
    poll_until("tender's spool to pass 6 MiB", Duration::from_secs(30), || {
        spool_files(&data).iter().any(|(_, len)| *len >= KILL_AT).then_some(())
    });

    t.kill9();
    let spooled = spool_files(&data);
    assert_eq!(spooled.len(), 1, "one spool file for the one fill: {spooled:?}");
    let spooled_len = spooled[0].1;
    assert!(spooled_len < BLOB_BYTES as u64, "killed mid-fill");
    assert!(objects_named(&data, &hex).is_empty(), "nothing of the partial blob is visible under objects/");
    let cut = client.join().expect("client thread");
    let got = received.load(Ordering::SeqCst);
    assert!(cut.is_err(), "the first client's body was cut short, not completed ({got} bytes)");
    assert!(got < BLOB_BYTES as u64, "no client gets a whole body that was never verified");

    // Restart on the same directory: the same GET now completes, and the fill resumed.
    let t = Tender::start(&config, &data, &dir.path().join("tender-2.log"));
    let mut conn = Conn::open(t.addr).unwrap();
    let mut h = Sha256::new();
    let mut len = 0u64;
    let head = conn
        .request_to("GET", &path, &[], &mut |b| {
            h.update(b);
            len += b.len() as u64;
        })
        .expect("the GET after the restart completes");
    assert_eq!(head.status, 200);
    assert_eq!(len, BLOB_BYTES as u64);
    assert_eq!(format!("sha256:{}", hex::encode(h.finalize())), digest, "the body is the blob");

    let hits = upstream.hits();
    let ranged: Vec<_> = hits.iter().filter(|h| h.method == "GET" && h.range.is_some()).collect();
    assert_eq!(
        ranged.iter().map(|h| (h.range_start(), h.status)).collect::<Vec<_>>(),
        [(Some(spooled_len), 206)],
        "the restarted fill asked for exactly the bytes its spool lacked: {hits:#?}"
    );
    let sent: u64 = hits.iter().map(|h| h.sent).sum();
    assert!(sent < 2 * BLOB_BYTES as u64, "the upstream did not send the blob twice ({sent} bytes): {hits:#?}");

    // Shut down cleanly: the object is committed, nothing is left in the spool, fsck is happy.
    assert_eq!(t.terminate(Duration::from_secs(10)).code(), Some(0));
    assert_eq!(objects_named(&data, &hex).len(), 1);
    assert!(spool_files(&data).is_empty(), "the spool file became the object: {:?}", spool_files(&data));
    let fsck = tender::run(["fsck".as_ref(), "--data".as_ref(), data.as_os_str()]);
    assert_eq!(fsck.status.code(), Some(0), "{}", String::from_utf8_lossy(&fsck.stdout));
}
