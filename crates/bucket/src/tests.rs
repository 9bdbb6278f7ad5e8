#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::sync::Arc;

use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::multipart::MultipartStore;
use object_store::{ObjectStore, PutPayload};

use std::time::Duration;

use object_store::path::Path as ObjectPath;
use object_store::{PutMode, PutOptions};

use super::*;

fn bucket_on(store: &Arc<InMemory>, replica: &str) -> Arc<Bucket> {
    keyed_on(store, replica, None)
}

fn content(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 1000) as u8).collect()
}

async fn uploaded(b: &Arc<Bucket>, bytes: &[u8]) -> Digest {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("obj");
    std::fs::write(&f, bytes).unwrap();
    let d = Digest::of(bytes);
    b.upload(&d, &f).await.unwrap();
    d
}

/// Uploaded in index format 2 (chunk hashes), as an upload that did not know the object's
/// size from the start writes it (and as every tender before bucket format 4 did).
async fn uploaded_v2(b: &Arc<Bucket>, bytes: &[u8]) -> Digest {
    let d = Digest::of(bytes);
    let mut u = b.begin_parts(None, Some(d), None);
    for c in bytes.chunks(b.settings().chunk_size as usize) {
        u.put_chunk(Bytes::copy_from_slice(c)).await.unwrap();
    }
    let index = u.finish(&d, bytes.len() as u64, None).await.unwrap();
    assert_eq!(index.format, 2);
    d
}

async fn read_all(b: &Arc<Bucket>, d: Digest, start: u64, end: u64) -> Result<Vec<u8>, BucketError> {
    let index = b.index(&d).await?.expect("indexed");
    let mut s = b.read(d, index, start, end);
    let mut out = Vec::new();
    while let Some(c) = s.next().await {
        out.extend_from_slice(&c?);
    }
    Ok(out)
}

#[tokio::test]
async fn should_serve_any_range_of_an_uploaded_object_verified() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let bytes = content(10 * 1024 + 17);
    let d = uploaded(&b, &bytes).await;
    let index = b.index(&d).await.unwrap().unwrap();
    assert_eq!(index.chunks.len(), 11);
    assert_eq!(index.size, bytes.len() as u64);
    for (s, e) in [(0, bytes.len()), (0, 1), (1023, 1025), (5000, 9000), (10 * 1024, 10 * 1024 + 17), (3, 3)] {
        assert_eq!(read_all(&b, d, s as u64, e as u64).await.unwrap(), &bytes[s..e], "{s}..{e}");
    }
    // Another replica sees it through the index only.
    let other = bucket_on(&mem, "b");
    assert_eq!(read_all(&other, d, 0, bytes.len() as u64).await.unwrap(), bytes);
    assert!(other.index(&Digest::of(b"absent")).await.unwrap().is_none());
    // An empty object has one empty chunk.
    let e = uploaded(&b, b"").await;
    assert_eq!(read_all(&b, e, 0, 0).await.unwrap(), b"");
}

#[tokio::test]
async fn should_refuse_a_corrupt_chunk_and_quarantine_it_with_fsck() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let bytes = content(4 * 1024);
    let d = uploaded(&b, &bytes).await;
    let good = uploaded(&b, &content(3000)[1000..]).await;
    let mut bad = bytes[2 * 1024..3 * 1024].to_vec();
    bad[5] ^= 1;
    let index = b.index(&d).await.unwrap().unwrap();
    let upload = index.upload.clone().expect("written as chunk objects");
    let p = ObjectPath::from(format!("fleet/parts/{upload}/00000002"));
    mem.put(&p, PutPayload::from(bad)).await.unwrap();

    // Chunks before the bad one are served; the bad one is not, not even in part.
    let mut s = b.read(d, index, 1000, 4000);
    let mut got = Vec::new();
    let err = loop {
        match s.next().await {
            Some(Ok(c)) => got.extend_from_slice(&c),
            Some(Err(e)) => break e,
            None => panic!("a corrupt chunk was served"),
        }
    };
    assert!(err.is_corrupt(), "{err}");
    assert_eq!(got, &bytes[1000..2048]);
    assert_eq!(b.metrics().corrupt.get(), 1);

    let report = b.fsck(false).await.unwrap();
    assert_eq!(report.objects_checked, 2);
    assert_eq!(report.corrupt.len(), 1, "{report:?}");
    assert_eq!(report.corrupt[0].digest, d.to_string());
    assert!(report.corrupt[0].problem.contains("chunk 2"), "{report:?}");
    let repaired = b.fsck(true).await.unwrap();
    assert_eq!(repaired.quarantined, 1);
    assert!(b.index(&d).await.unwrap().is_none(), "a quarantined object is invisible");
    let aside = ObjectPath::from(format!("fleet/quarantine/sha256/{}/00000002", d.hex()));
    assert!(mem.head(&aside).await.is_ok(), "moved aside, not deleted");
    assert!(mem.head(&p).await.is_err(), "moved");
    assert!(b.fsck(false).await.unwrap().is_clean());
    assert!(b.index(&good).await.unwrap().is_some());
}

#[tokio::test]
async fn should_find_a_rewritten_index_and_unfinished_uploads() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let d = uploaded(&b, &content(2048)).await;
    // Someone replaces content and index consistently: the chunks match, the digest does not.
    let other = content(2048).iter().map(|x| x.wrapping_add(1)).collect::<Vec<u8>>();
    let chunks = other.chunks(1024).map(|c| hex::encode(Sha256::digest(c))).collect();
    let forged = ChunkIndex::new(2048, 1024, chunks, "x");
    mem.put(&ObjectPath::from(format!("fleet/objects/sha256/{}", d.hex())), PutPayload::from(other)).await.unwrap();
    let fresh = bucket_on(&mem, "b");
    mem.put(
        &ObjectPath::from(format!("fleet/index/sha256/{}.json", d.hex())),
        PutPayload::from(serde_json::to_vec(&forged).unwrap()),
    )
    .await
    .unwrap();
    mem.put(&ObjectPath::from(format!("fleet/objects/sha256/{}", "ab".repeat(32))), PutPayload::from_static(b"x"))
        .await
        .unwrap();
    let r = fresh.fsck(false).await.unwrap();
    assert!(r.corrupt[0].problem.contains("index was rewritten"), "{r:?}");
    // The forged index (format 1) names no chunk objects: the real upload's are unindexed now.
    let upload = b.index(&d).await.unwrap().unwrap().upload.clone().unwrap();
    assert_eq!(r.unindexed, vec![format!("sha256:{}", "ab".repeat(32)), format!("parts/{upload}")]);
    let repaired = fresh.fsck(true).await.unwrap();
    assert_eq!(repaired.unindexed.len(), 2, "{repaired:?}");
    let left: Vec<_> = mem.list(Some(&ObjectPath::from(format!("fleet/parts/{upload}")))).collect().await;
    assert!(left.is_empty(), "--repair removes chunk objects no index or upload names: {left:?}");
}

async fn uploaded_sha512(b: &Arc<Bucket>, bytes: &[u8]) -> Digest {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("obj");
    std::fs::write(&f, bytes).unwrap();
    let d = tender_oci::Algorithm::Sha512.digest(bytes);
    b.upload_typed(&d, &f, Some("application/vnd.oci.image.manifest.v1+json")).await.unwrap();
    d
}

/// sha512 objects live in the `sha512/` trees, verified with sha512 on upload, on a whole read
/// and by fsck, which finds and quarantines a corrupt one like a sha256 one.
#[tokio::test]
async fn should_round_trip_and_check_sha512_objects() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let bytes = content(3 * 1024 + 5);
    let d = uploaded_sha512(&b, &bytes).await;
    let plain = uploaded(&b, &bytes).await;
    assert_ne!(d, plain);
    let upload = b.index(&d).await.unwrap().unwrap().upload.clone().unwrap();
    for p in [format!("fleet/parts/{upload}/00000003"), format!("fleet/index/sha512/{}.json", d.hex())] {
        assert!(mem.head(&ObjectPath::from(p.clone())).await.is_ok(), "{p}");
    }
    let other = bucket_on(&mem, "b");
    assert_eq!(read_all(&other, d, 0, bytes.len() as u64).await.unwrap(), bytes);
    let (small, index) = other.read_small(&d, 1 << 20).await.unwrap().unwrap();
    assert_eq!(
        (small.as_ref(), index.media_type.as_deref()),
        (&bytes[..], Some("application/vnd.oci.image.manifest.v1+json"))
    );
    other.put_known(&d, "ghcr.io").await.unwrap();
    assert!(bucket_on(&mem, "c").is_known(&d, "GHCR.io").await.unwrap());
    assert!(!bucket_on(&mem, "c").is_known(&plain, "ghcr.io").await.unwrap(), "known per digest, not per content");
    // The local copy must hash to the sha512 it is uploaded as.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("obj");
    std::fs::write(&f, b"other").unwrap();
    let e = b.upload(&tender_oci::Algorithm::Sha512.digest(b"claimed"), &f).await.expect_err("hash differs");
    assert!(e.is_corrupt(), "{e}");

    // Content and index replaced consistently: only the whole sha512 shows it.
    let forged: Vec<u8> = bytes.iter().map(|x| x.wrapping_add(1)).collect();
    let chunks = forged.chunks(1024).map(|c| hex::encode(Sha256::digest(c))).collect();
    let index = ChunkIndex::new(forged.len() as u64, 1024, chunks, "x");
    mem.put(&ObjectPath::from(format!("fleet/objects/sha512/{}", d.hex())), PutPayload::from(forged)).await.unwrap();
    mem.put(
        &ObjectPath::from(format!("fleet/index/sha512/{}.json", d.hex())),
        PutPayload::from(serde_json::to_vec(&index).unwrap()),
    )
    .await
    .unwrap();
    mem.put(&ObjectPath::from(format!("fleet/objects/sha512/{}", "cd".repeat(64))), PutPayload::from_static(b"x"))
        .await
        .unwrap();
    let fresh = bucket_on(&mem, "d");
    assert!(fresh.read_small(&d, 1 << 20).await.unwrap_err().is_corrupt());
    let r = fresh.fsck(false).await.unwrap();
    assert_eq!(r.objects_checked, 2);
    assert_eq!(r.corrupt.len(), 1, "{r:?}");
    assert_eq!(r.corrupt[0].digest, d.to_string());
    assert!(r.corrupt[0].problem.contains("index was rewritten"), "{r:?}");
    assert_eq!(r.unindexed, vec![format!("sha512:{}", "cd".repeat(64)), format!("parts/{upload}")]);
    assert_eq!(fresh.fsck(true).await.unwrap().quarantined, 1);
    assert!(mem.head(&ObjectPath::from(format!("fleet/quarantine/sha512/{}", d.hex()))).await.is_ok());
    assert!(fresh.index(&d).await.unwrap().is_none());
    assert_eq!(read_all(&fresh, plain, 0, bytes.len() as u64).await.unwrap(), bytes, "the sha256 copy is untouched");
}

#[tokio::test]
async fn should_not_upload_a_local_copy_that_rotted() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("obj");
    std::fs::write(&f, content(3000)).unwrap();
    let claimed = Digest::of(b"something else");
    let e = b.upload(&claimed, &f).await.expect_err("hash differs");
    assert!(e.is_corrupt() && e.to_string().contains("not uploaded"), "{e}");
    assert!(b.index(&claimed).await.unwrap().is_none());
}

#[tokio::test]
async fn should_give_a_lease_to_one_replica_and_take_over_an_expired_one() {
    let mem = Arc::new(InMemory::new());
    let (a, b) = (bucket_on(&mem, "a"), bucket_on(&mem, "b"));
    let won = match a.lease("sha256:x").await.unwrap() {
        LeaseOutcome::Won(l) => l,
        o => panic!("{o:?}"),
    };
    match b.lease("sha256:x").await.unwrap() {
        LeaseOutcome::Held { owner, .. } => assert_eq!(owner, "a"),
        o => panic!("{o:?}"),
    }
    assert!(matches!(b.lease("sha256:other").await.unwrap(), LeaseOutcome::Won(_)));
    won.release().await;
    assert!(matches!(b.lease("sha256:x").await.unwrap(), LeaseOutcome::Won(_)));

    // A holder that died: its lease expired (written here with a past expiry).
    let p = a.lease_path("sha256:dead");
    let stale = serde_json::json!({"key": "sha256:dead", "owner": "gone", "expiresAt": 1});
    mem.put(&p, PutPayload::from(serde_json::to_vec(&stale).unwrap())).await.unwrap();
    assert!(matches!(a.lease("sha256:dead").await.unwrap(), LeaseOutcome::Won(_)));
    assert!(matches!(b.lease("sha256:dead").await.unwrap(), LeaseOutcome::Held { .. }));
    assert_eq!(a.metrics().leases.get_or_create(&vec![("outcome".into(), "taken_over".into())]).get(), 1);
}

#[tokio::test]
async fn should_share_trust_records_and_keep_the_first() {
    let mem = Arc::new(InMemory::new());
    let (a, b) = (bucket_on(&mem, "a"), bucket_on(&mem, "b"));
    let r = TrustRecord { key: "/image/x/v1/a.raw.xz".into(), digest: Digest::of(b"1"), size: 1, first_seen: 5 };
    a.put_trust(&r).await.unwrap();
    let mut other = r.clone();
    other.digest = Digest::of(b"2");
    b.put_trust(&other).await.unwrap();
    assert_eq!(b.trust(&r.key).await.unwrap(), Some(r));
    assert_eq!(b.trust("/image/y").await.unwrap(), None);
}

#[test]
fn should_never_show_credentials() {
    let c =
        Credentials { access_key_id: "AKIAEXAMPLE".into(), secret_access_key: "s3cr3t".into(), session_token: None };
    let mut s = BucketSettings::new("b");
    s.credentials = Some(c);
    let shown = format!("{s:?}");
    assert!(!shown.contains("s3cr3t") && !shown.contains("AKIAEXAMPLE"), "{shown}");
}

#[tokio::test]
async fn should_record_known_upstreams_for_every_replica_and_refuse_a_newer_bucket_format() {
    let mem = Arc::new(InMemory::new());
    let (a, b) = (bucket_on(&mem, "a"), bucket_on(&mem, "b"));
    let d = uploaded(&a, &content(3000)).await;
    assert!(!b.is_known(&d, "ghcr.io").await.unwrap(), "an object without a record is known nowhere");
    a.put_known(&d, "ghcr.io").await.unwrap();
    a.put_known(&d, "GHCR.io").await.unwrap();
    assert!(b.is_known(&d, "ghcr.io").await.unwrap(), "another replica sees the record");
    assert!(b.is_known(&d, "Ghcr.IO").await.unwrap(), "names compare as routing does");
    assert!(!b.is_known(&d, "docker.io").await.unwrap());

    a.check_format().await.unwrap();
    let marker = object_store::path::Path::from("fleet/tender-bucket.json");
    let f: serde_json::Value = serde_json::from_slice(&mem.get(&marker).await.unwrap().bytes().await.unwrap()).unwrap();
    assert_eq!(f["format"], BUCKET_FORMAT);
    b.check_format().await.unwrap();
    mem.put(&marker, PutPayload::from_static(br#"{"format":99,"createdBy":"tender 9"}"#)).await.unwrap();
    let e = b.check_format().await.unwrap_err();
    assert!(e.to_string().contains("format 99") && e.to_string().contains("upgrade this replica"), "{e}");
}

/// What [`Faulty`] does with each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Accept and never answer (a server stopped with SIGSTOP).
    Hang,
    /// Fail at once (connection refused).
    Refuse,
    /// Answer, but ignore `If-None-Match` (a server without conditional writes).
    NoConditional,
    /// Answer everything but chunk objects from the third on (and multipart parts), which
    /// never get an answer (an upload that is under way when its replica is killed).
    HangParts,
    /// Never answer a create of a key that exists (the start-up check's second probe PUT
    /// timing out).
    HangExisting,
    /// List a directory whose objects were all deleted as a common prefix still (SeaweedFS).
    EmptyDirs,
    /// List no chunk objects (a listing made before another replica wrote them).
    StaleParts,
    /// Remove every index just before a chunk object is written (`gc` running meanwhile).
    GcOnPart,
}

/// An in-memory store that lies on demand.
#[derive(Debug)]
struct Faulty {
    inner: InMemory,
    fault: std::sync::Mutex<Fault>,
    /// Every key deleted (for [`Fault::EmptyDirs`]).
    deleted: std::sync::Mutex<Vec<ObjectPath>>,
    /// Bytes of content the GETs answered with (what a read costs in transfer).
    got_bytes: std::sync::atomic::AtomicU64,
}

impl std::fmt::Display for Faulty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Faulty")
    }
}

impl Faulty {
    fn new(fault: Fault) -> Faulty {
        Faulty {
            inner: InMemory::new(),
            fault: std::sync::Mutex::new(fault),
            deleted: Default::default(),
            got_bytes: Default::default(),
        }
    }

    fn set(&self, f: Fault) {
        *self.fault.lock().unwrap() = f;
    }

    async fn gate(&self) -> object_store::Result<()> {
        let f = *self.fault.lock().unwrap();
        match f {
            Fault::Hang => futures::future::pending().await,
            Fault::Refuse => Err(object_store::Error::Generic { store: "faulty", source: "connection refused".into() }),
            Fault::None
            | Fault::NoConditional
            | Fault::HangParts
            | Fault::HangExisting
            | Fault::EmptyDirs
            | Fault::StaleParts
            | Fault::GcOnPart => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl object_store::multipart::MultipartStore for Faulty {
    async fn create_multipart(&self, path: &ObjectPath) -> object_store::Result<object_store::MultipartId> {
        self.gate().await?;
        self.inner.create_multipart(path).await
    }

    async fn put_part(
        &self,
        path: &ObjectPath,
        id: &object_store::MultipartId,
        part_idx: usize,
        data: PutPayload,
    ) -> object_store::Result<object_store::multipart::PartId> {
        self.gate().await?;
        if *self.fault.lock().unwrap() == Fault::HangParts && part_idx >= 2 {
            futures::future::pending::<()>().await;
        }
        self.inner.put_part(path, id, part_idx, data).await
    }

    async fn complete_multipart(
        &self,
        path: &ObjectPath,
        id: &object_store::MultipartId,
        parts: Vec<object_store::multipart::PartId>,
    ) -> object_store::Result<object_store::PutResult> {
        self.gate().await?;
        self.inner.complete_multipart(path, id, parts).await
    }

    async fn abort_multipart(&self, path: &ObjectPath, id: &object_store::MultipartId) -> object_store::Result<()> {
        self.gate().await?;
        self.inner.abort_multipart(path, id).await
    }
}

#[async_trait::async_trait]
impl ObjectStore for Faulty {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        mut opts: PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.gate().await?;
        let part = location.as_ref().contains("parts/")
            && location.filename().and_then(|f| f.parse::<u32>().ok()).is_some_and(|i| i >= 2);
        if *self.fault.lock().unwrap() == Fault::HangParts && part {
            futures::future::pending::<()>().await;
        }
        if *self.fault.lock().unwrap() == Fault::HangExisting
            && opts.mode == PutMode::Create
            && self.inner.head(location).await.is_ok()
        {
            futures::future::pending::<()>().await;
        }
        if *self.fault.lock().unwrap() == Fault::GcOnPart && location.as_ref().contains("parts/") {
            let indexes: Vec<_> = self.inner.list(Some(&ObjectPath::from("index"))).collect().await;
            for m in indexes {
                self.inner.delete(&m?.location).await?;
            }
        }
        if *self.fault.lock().unwrap() == Fault::NoConditional && opts.mode == PutMode::Create {
            opts.mode = PutMode::Overwrite;
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.gate().await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.gate().await?;
        let head = options.head;
        let got = self.inner.get_opts(location, options).await?;
        if !head {
            self.got_bytes.fetch_add(got.range.end - got.range.start, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(got)
    }

    async fn delete(&self, location: &ObjectPath) -> object_store::Result<()> {
        self.gate().await?;
        self.deleted.lock().unwrap().push(location.clone());
        self.inner.delete(location).await
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        if *self.fault.lock().unwrap() == Fault::StaleParts {
            let parts = |r: &object_store::Result<object_store::ObjectMeta>| {
                r.as_ref().is_ok_and(|m| m.location.as_ref().contains("parts/"))
            };
            return self.inner.list(prefix).filter(move |r| std::future::ready(!parts(r))).boxed();
        }
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&ObjectPath>) -> object_store::Result<object_store::ListResult> {
        self.gate().await?;
        let mut listed = self.inner.list_with_delimiter(prefix).await?;
        if *self.fault.lock().unwrap() == Fault::EmptyDirs {
            // The directory each deleted key was in, one level under `prefix`, stays listed.
            let under = prefix.map(|p| format!("{p}/")).unwrap_or_default();
            for d in self.deleted.lock().unwrap().iter() {
                let Some(rest) = d.as_ref().strip_prefix(&under) else { continue };
                let Some((dir, _)) = rest.split_once('/') else { continue };
                let dir = ObjectPath::from(format!("{under}{dir}"));
                if !listed.common_prefixes.contains(&dir) {
                    listed.common_prefixes.push(dir);
                }
            }
        }
        Ok(listed)
    }

    async fn copy(&self, from: &ObjectPath, to: &ObjectPath) -> object_store::Result<()> {
        self.gate().await?;
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &ObjectPath, to: &ObjectPath) -> object_store::Result<()> {
        self.gate().await?;
        self.inner.copy_if_not_exists(from, to).await
    }
}

fn faulty_bucket(timeout: Duration) -> (Arc<Faulty>, Arc<Bucket>) {
    let store = Arc::new(Faulty::new(Fault::None));
    let mut s = BucketSettings::new("test");
    s.chunk_size = 1024;
    s.request_timeout = timeout;
    s.probe_interval = Duration::from_millis(100);
    (store.clone(), Bucket::with_store(store, s, BucketMetrics::default()))
}

fn cause_of(b: &Bucket) -> Option<Cause> {
    match b.state() {
        BucketState::Up => None,
        BucketState::Down { cause, .. } => Some(cause),
    }
}

#[tokio::test]
async fn should_open_on_a_hung_request_and_refuse_at_once_even_a_cached_index_until_a_probe_gets_through() {
    let (store, b) = faulty_bucket(Duration::from_millis(300));
    b.check().await.unwrap();
    let d = uploaded(&b, &content(3000)).await;
    assert!(b.index(&d).await.unwrap().is_some(), "indexed and remembered");

    store.set(Fault::Hang);
    let t = std::time::Instant::now();
    let e = b.trust("some/asset").await.expect_err("a hung bucket fails the request");
    assert!(matches!(e, BucketError::Timeout { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2), "bounded by requestTimeout: {:?}", t.elapsed());
    assert_eq!(cause_of(&b), Some(Cause::Timeout));
    assert_eq!(b.metrics().up.get(), 0);

    let t = std::time::Instant::now();
    let e = b.index(&d).await.expect_err("refused while down, though remembered");
    assert!(e.is_down(), "{e}");
    assert!(read_all(&b, d, 0, 10).await.is_err());
    assert!(b.lease("k").await.expect_err("no lease while down").is_down());
    assert!(t.elapsed() < Duration::from_millis(100), "refused at once: {:?}", t.elapsed());

    assert!(!b.probe().await, "the probe waits out requestTimeout and fails");
    assert_eq!(cause_of(&b), Some(Cause::Timeout));
    store.set(Fault::None);
    assert!(b.probe().await);
    assert_eq!((cause_of(&b), b.metrics().up.get()), (None, 1));
    assert_eq!(read_all(&b, d, 0, 3000).await.unwrap(), content(3000));
}

#[tokio::test]
async fn should_turn_leases_off_when_a_later_probe_finds_no_conditional_writes_and_on_again() {
    let (store, b) = faulty_bucket(Duration::from_secs(5));
    b.check().await.unwrap();
    assert!(b.lease_enabled());
    store.set(Fault::Refuse);
    assert!(b.trust("some/asset").await.is_err());
    assert_eq!(cause_of(&b), Some(Cause::Error));
    assert!(!b.probe().await);

    store.set(Fault::NoConditional);
    assert!(b.probe().await, "a bucket without conditional writes is used");
    assert!(!b.lease_enabled(), "as with lease: false");
    assert_eq!(b.metrics().conditional_writes.get(), 0);
    let probes = |r: &str| b.metrics().probes.get_or_create(&vec![("result".to_string(), r.to_string())]).get();
    assert_eq!((probes("ok"), probes("failed")), (1, 1));

    store.set(Fault::None);
    assert!(b.probe().await);
    assert!(b.lease_enabled());
    assert_eq!(b.metrics().conditional_writes.get(), 1);
}

#[tokio::test]
async fn should_refuse_the_start_without_conditional_writes_and_probe_a_bucket_down_at_start() {
    let (store, b) = faulty_bucket(Duration::from_secs(5));
    store.set(Fault::NoConditional);
    assert!(matches!(b.check().await, Err(BucketError::Setup { .. })));
    // A fresh replica whose bucket refuses at start: down, then up once the prober gets through.
    let (store, b) = faulty_bucket(Duration::from_secs(5));
    store.set(Fault::Refuse);
    assert!(b.check().await.is_err());
    assert_eq!(cause_of(&b), Some(Cause::Error));
    let prober = b.spawn_prober();
    store.set(Fault::None);
    let t = std::time::Instant::now();
    while cause_of(&b).is_some() {
        assert!(t.elapsed() < Duration::from_secs(5), "the prober never closed the breaker");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(b.index(&Digest::of(b"x")).await.unwrap().is_none());
    prober.abort();
}

/// Upload records in the bucket: (record path, upload id).
async fn upload_records(store: &Faulty) -> Vec<(ObjectPath, String)> {
    let metas: Vec<_> =
        store.inner.list(Some(&ObjectPath::from("progress"))).map(|m| m.unwrap().location).collect().await;
    let mut out = Vec::new();
    for p in metas {
        let bytes = store.inner.get(&p).await.unwrap().bytes().await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        out.push((p, v["upload"].as_str().unwrap().to_string()));
    }
    out
}

/// The chunk objects an upload wrote.
async fn parts_of(store: &Faulty, upload: &str) -> usize {
    store.inner.list(Some(&ObjectPath::from(format!("parts/{upload}")))).collect::<Vec<_>>().await.len()
}

/// Start uploading `n` KiB (in 1 KiB chunks; parts from the third on never get an answer),
/// under `lease`; returns the task once the upload's record exists.
async fn upload_under_way(
    store: &Faulty,
    b: &Arc<Bucket>,
    n: usize,
    lease: Option<&'static str>,
) -> (tokio::task::JoinHandle<()>, String) {
    let before = upload_records(store).await.len();
    let dir = tempfile::tempdir().unwrap();
    let bytes = content(n * 1024);
    let d = Digest::of(&bytes);
    std::fs::write(dir.path().join("obj"), &bytes).unwrap();
    let b2 = b.clone();
    let task = tokio::spawn(async move {
        let _ = b2.upload_leased(&d, &dir.path().join("obj"), None, lease).await;
        drop(dir);
    });
    for _ in 0..200 {
        if upload_records(store).await.len() > before {
            return (task, d.to_string());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the upload never recorded itself");
}

#[tokio::test]
async fn should_list_and_abort_only_uploads_abandoned_by_a_dead_replica() {
    // leaseTtl 150 ms: an upload record unrenewed for 450 ms, without a live lease, is abandoned.
    let store = Arc::new(Faulty::new(Fault::HangParts));
    let replica = |name: &str| {
        let mut s = BucketSettings::new("test");
        s.chunk_size = 1024;
        s.lease_ttl = Duration::from_millis(150);
        s.replica = name.into();
        Bucket::with_store(store.clone(), s, BucketMetrics::default())
    };
    let (a, b, c) = (replica("a"), replica("b"), replica("c"));

    // a: killed mid-upload, no lease. b: killed mid-upload, but its fill lease lives on (held
    // by c, renewing). c: alive, its upload still waiting on a part.
    let (killed, dead_digest) = upload_under_way(&store, &a, 8, None).await;
    let held = match c.lease("upstream@sha256:leased").await.unwrap() {
        LeaseOutcome::Won(l) => l,
        o => panic!("{o:?}"),
    };
    let (killed_leased, _) = upload_under_way(&store, &b, 9, Some("upstream@sha256:leased")).await;
    let (alive, alive_digest) = upload_under_way(&store, &c, 10, None).await;
    killed.abort();
    killed_leased.abort();
    let records = upload_records(&store).await;
    assert_eq!(records.len(), 3, "{records:?}");

    // Younger than 3 x leaseTtl: nothing is abandoned yet.
    let young = a.fsck(false).await.unwrap();
    assert!(young.abandoned_uploads.is_empty(), "{young:?}");

    tokio::time::sleep(Duration::from_millis(700)).await;
    let r = a.fsck(false).await.unwrap();
    assert_eq!(r.abandoned_uploads.len(), 1, "{r:?}");
    let found = &r.abandoned_uploads[0];
    assert_eq!((found.digest.as_str(), found.replica.as_str(), found.removed), (dead_digest.as_str(), "a", false));
    assert!(found.idle_secs < 60, "{found:?}");
    assert_eq!(upload_records(&store).await.len(), 3, "listing removes nothing");

    let r = a.fsck(true).await.unwrap();
    assert_eq!(r.abandoned_uploads.len(), 1, "{r:?}");
    assert!(r.abandoned_uploads[0].removed);
    assert_eq!(a.metrics().abandoned_uploads_removed.get(), 1);
    let left = upload_records(&store).await;
    assert_eq!(left.len(), 2, "{left:?}");
    // The abandoned upload's chunks are gone from the store; the others' are not.
    let gone = records.iter().find(|(_, id)| !left.iter().any(|(_, l)| l == id)).unwrap();
    assert_eq!(parts_of(&store, &gone.1).await, 0);
    for (_, id) in &left {
        assert_eq!(parts_of(&store, id).await, 2, "{id}");
    }

    // The lease ends (its holder died too): the upload under it is abandoned, and a replica's
    // background sweep aborts it; the live upload stays.
    drop(held);
    let sweeper = b.spawn_sweeper();
    let mut waited = Duration::ZERO;
    while upload_records(&store).await.len() > 1 {
        assert!(waited < Duration::from_secs(10), "the sweep never removed the upload under the dead lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    sweeper.abort();
    let left = upload_records(&store).await;
    assert_eq!(left.len(), 1);
    let kept = store.inner.get(&left[0].0).await.unwrap().bytes().await.unwrap();
    assert!(
        String::from_utf8_lossy(&kept).contains(alive_digest.trim_start_matches("sha256:")),
        "the live upload stays"
    );
    assert!(c.fsck(true).await.unwrap().abandoned_uploads.is_empty());
    alive.abort();
}

#[tokio::test]
async fn should_complete_uploads_and_drop_their_records() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let bytes = content(5 * 1024 + 3);
    let d = uploaded(&b, &bytes).await;
    assert_eq!(read_all(&b, d, 0, bytes.len() as u64).await.unwrap(), bytes);
    let records: Vec<_> = mem.list(Some(&ObjectPath::from("fleet/progress"))).collect().await;
    assert!(records.is_empty(), "{records:?}");
    let parts: Vec<_> = mem.list(Some(&ObjectPath::from("fleet/parts"))).map(|m| m.unwrap().location).collect().await;
    let upload = b.index(&d).await.unwrap().unwrap().upload.clone().unwrap();
    let want: Vec<_> = (0..6).map(|i| ObjectPath::from(format!("fleet/parts/{upload}/{i:08}"))).collect();
    assert_eq!(parts, want, "one object per chunk, under its upload");
}

/// A multipart upload a tender before bucket format 3 left behind, with its record, is still
/// found and aborted.
#[tokio::test]
async fn should_abort_a_multipart_upload_an_older_tender_left_behind() {
    let mem = Arc::new(InMemory::new());
    let mut s = BucketSettings::new("test");
    s.lease_ttl = Duration::from_millis(10);
    let b = Bucket::with_store(mem.clone(), s, BucketMetrics::default());
    let d = Digest::of(b"old");
    let object = ObjectPath::from(format!("objects/sha256/{}", d.hex()));
    let id = mem.create_multipart(&object).await.unwrap();
    mem.put_part(&object, &id, 0, PutPayload::from_static(b"x")).await.unwrap();
    let record = serde_json::json!({"digest": d, "uploadId": id, "replica": "old", "startedAt": 1, "renewedAt": 1});
    let p = ObjectPath::from(format!("uploads/sha256/{}/{}.json", d.hex(), "0".repeat(64)));
    mem.put(&p, PutPayload::from(serde_json::to_vec(&record).unwrap())).await.unwrap();
    let r = b.fsck(true).await.unwrap();
    assert_eq!(r.abandoned_uploads.len(), 1, "{r:?}");
    assert!(r.abandoned_uploads[0].removed);
    assert!(mem.put_part(&object, &id, 1, PutPayload::from_static(b"x")).await.is_err(), "aborted");
    assert!(mem.head(&p).await.is_err(), "record dropped");
}

#[test]
fn should_call_an_upload_abandoned_only_past_three_lease_ttls_without_a_live_lease() {
    let ttl = Duration::from_secs(30);
    for (renewed, now, live, abandoned) in [
        (1_000, 1_000, false, false),
        (1_000, 91_000, false, false),
        (1_000, 91_001, false, true),
        (1_000, 10_000_000, true, false),
        (90_000, 1_000, false, false),
        (0, u64::MAX, false, true),
    ] {
        assert_eq!(uploads::is_abandoned(renewed, now, ttl, live), abandoned, "{renewed} {now} {live}");
    }
}

/// Issue 36: a 1 MiB range of an object in chunks of 4 MiB fetches the sub-chunks of 1 MiB that
/// cover it, not the whole chunks, byte-exact, at chunk boundaries and the object's ends alike.
#[tokio::test]
async fn should_fetch_only_the_sub_chunks_a_range_needs() {
    let store = Arc::new(Faulty::new(Fault::None));
    let mut s = BucketSettings::new("test");
    s.chunk_size = 4 << 20;
    let b = Bucket::with_store(store.clone(), s, BucketMetrics::default());
    let bytes = content((10 << 20) + 12345);
    let d = uploaded(&b, &bytes).await;
    let index = b.index(&d).await.unwrap().unwrap();
    let (mib, n) = (1usize << 20, bytes.len());
    for (start, end) in [
        (0, mib),
        (0, 1),
        (n - 1, n),
        (mib / 2, mib / 2 + mib),
        ((4 << 20) - 10, (4 << 20) + 10),
        ((8 << 20) - mib, 8 << 20),
        (8 << 20, n),
        (3 * mib + 7, 3 * mib + 8),
        (5000, 5000),
    ] {
        let (fetched, counted) =
            (store.got_bytes.load(std::sync::atomic::Ordering::Relaxed), b.metrics().read_bytes.get());
        let mut got = Vec::new();
        let mut r = b.read(d, index.clone(), start as u64, end as u64);
        while let Some(c) = r.next().await {
            got.extend_from_slice(&c.unwrap());
        }
        assert!(got == bytes[start..end], "{start}..{end}: not the object's bytes");
        let fetched = store.got_bytes.load(std::sync::atomic::Ordering::Relaxed) - fetched;
        assert!(fetched <= (end - start + 2 * mib) as u64, "{start}..{end}: fetched {fetched} bytes");
        assert_eq!(b.metrics().read_bytes.get() - counted, fetched, "{start}..{end}: read_bytes counts what was read");
    }
}

/// A bucket over a counting store with chunks of 4 KiB in sub-chunks of 1 KiB.
fn sub_bucket(store: &Arc<Faulty>, replica: &str) -> Arc<Bucket> {
    let mut s = BucketSettings::new("test");
    s.chunk_size = 4096;
    s.sub_chunk_size = 1024;
    s.replica = replica.into();
    Bucket::with_store(store.clone(), s, BucketMetrics::default())
}

/// `start..end` read through `index`, and the bytes the store answered GETs with meanwhile.
async fn read_counted(
    store: &Faulty,
    b: &Arc<Bucket>,
    d: Digest,
    index: &Arc<ChunkIndex>,
    start: u64,
    end: u64,
) -> (Result<Vec<u8>, BucketError>, u64) {
    let before = store.got_bytes.load(std::sync::atomic::Ordering::Relaxed);
    let mut s = b.read(d, index.clone(), start, end);
    let mut out = Vec::new();
    let r = loop {
        match s.next().await {
            Some(Ok(c)) => out.extend_from_slice(&c),
            Some(Err(e)) => break Err(e),
            None => break Ok(out),
        }
    };
    (r, store.got_bytes.load(std::sync::atomic::Ordering::Relaxed) - before)
}

/// Every range between the pieces' edges of `d` (3 chunks of 4 KiB and 1,500 bytes, pieces of
/// 1 KiB) read through `index`, the first and last byte, empty or whole, is byte-exact and
/// fetches at most the span and two pieces more.
async fn assert_every_range(store: &Faulty, reader: &Arc<Bucket>, d: Digest, index: &Arc<ChunkIndex>, bytes: &[u8]) {
    let n = bytes.len() as u64;
    let points =
        [0, 1, 1023, 1024, 1025, 2047, 2048, 4095, 4096, 4097, 5000, 8191, 8192, 12287, 12288, 13311, n - 1, n];
    for &start in &points {
        for &end in points.iter().filter(|&&e| e >= start) {
            let (got, fetched) = read_counted(store, reader, d, index, start, end).await;
            let got = got.unwrap();
            assert!(got == bytes[start as usize..end as usize], "{start}..{end}: not the object's bytes");
            assert!(fetched <= end - start + 2 * 1024, "{start}..{end}: fetched {fetched} bytes");
        }
    }
}

/// The upload records the sha256 of every sub-chunk (computed with the chunk's in one pass),
/// and every range, at sub-chunk and chunk boundaries, the first and last byte, empty or
/// whole, is byte-exact and fetches at most the span and two sub-chunks more.
#[tokio::test]
async fn should_record_sub_chunk_hashes_and_read_any_range_from_them_byte_exact() {
    let store = Arc::new(Faulty::new(Fault::None));
    let b = sub_bucket(&store, "a");
    let bytes = content(3 * 4096 + 1500);
    let d = uploaded_v2(&b, &bytes).await;
    let raw = store.inner.get(&ObjectPath::from(format!("index/sha256/{}.json", d.hex()))).await.unwrap();
    let json: serde_json::Value = serde_json::from_slice(&raw.bytes().await.unwrap()).unwrap();
    assert_eq!(json["subChunkSize"], 1024);
    assert_eq!(json["format"], 2, "a compatible addition: the index format stays 2");
    let index = sub_bucket(&store, "b").index(&d).await.unwrap().unwrap();
    let want: Vec<Vec<String>> =
        bytes.chunks(4096).map(|c| c.chunks(1024).map(|p| hex::encode(Sha256::digest(p))).collect()).collect();
    assert_eq!(index.sub_chunks, want);
    assert_eq!(index.sub_chunks.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 4, 2]);

    let n = bytes.len() as u64;
    let reader = sub_bucket(&store, "c");
    assert_every_range(&store, &reader, d, &index, &bytes).await;
    assert_eq!(reader.metrics().corrupt.get(), 0);
    // A whole copy reads whole chunks.
    let before = store.got_bytes.load(std::sync::atomic::Ordering::Relaxed);
    let mut c = reader.copy(d, index.clone(), 0, n);
    let mut out = Vec::new();
    while let Some(piece) = c.next().await {
        out.extend_from_slice(&piece.unwrap());
    }
    assert!(out == bytes);
    assert_eq!(store.got_bytes.load(std::sync::atomic::Ordering::Relaxed) - before, n);
    // An empty object has one empty chunk, and one empty sub-chunk.
    let e = uploaded_v2(&b, b"").await;
    let ei = reader.index(&e).await.unwrap().unwrap();
    assert_eq!(ei.sub_chunks, vec![vec![hex::encode(Sha256::digest(b""))]]);
    assert_eq!(read_all(&reader, e, 0, 0).await.unwrap(), b"");
    assert!(reader.fsck(false).await.unwrap().is_clean());
}

/// A sub-chunk that fails its hash is refused as corrupt (as a chunk is: the server falls back
/// to upstream at the same byte) for a range over it; a range elsewhere in the same chunk reads
/// only other sub-chunks, which verify, so it is served.
#[tokio::test]
async fn should_refuse_a_corrupt_sub_chunk_and_serve_the_rest_of_its_chunk() {
    let store = Arc::new(Faulty::new(Fault::None));
    let b = sub_bucket(&store, "a");
    let bytes = content(3 * 4096);
    let d = uploaded_v2(&b, &bytes).await;
    let index = b.index(&d).await.unwrap().unwrap();
    let upload = index.upload.clone().unwrap();
    // Chunk 1, sub-chunk 2 (bytes 6144..7168 of the object) rots.
    let p = ObjectPath::from(format!("parts/{upload}/00000001"));
    let mut bad = bytes[4096..8192].to_vec();
    bad[2048 + 5] ^= 1;
    store.inner.put(&p, PutPayload::from(bad)).await.unwrap();
    let reader = sub_bucket(&store, "b");

    let (r, _) = read_counted(&store, &reader, d, &index, 6144 + 100, 6144 + 200).await;
    let e = r.unwrap_err();
    assert!(e.is_corrupt() && e.to_string().contains("sub-chunk 2"), "{e}");
    assert_eq!(reader.metrics().corrupt.get(), 1);
    // Over it from the chunk before: chunk 0's bytes come, then the error, not a byte of chunk 1.
    let mut s = reader.read(d, index.clone(), 1000, 7000);
    let mut got = Vec::new();
    let e = loop {
        match s.next().await {
            Some(Ok(c)) => got.extend_from_slice(&c),
            Some(Err(e)) => break e,
            None => panic!("a corrupt sub-chunk was served"),
        }
    };
    assert!(e.is_corrupt(), "{e}");
    assert_eq!(got, &bytes[1000..4096]);
    // Elsewhere in the same chunk: sub-chunks 0, 1 and 3 verify.
    for (start, end) in [(4096, 6144), (4096 + 10, 4096 + 20), (7168, 8192), (7168, 9000)] {
        let (r, _) = read_counted(&store, &reader, d, &index, start, end).await;
        assert!(r.unwrap() == bytes[start as usize..end as usize], "{start}..{end}");
    }
    // The whole chunk (a copy, or a range over all of it) is refused.
    let e = read_all(&reader, d, 4096, 8192).await.unwrap_err();
    assert!(e.is_corrupt() && e.to_string().contains("chunk 1"), "{e}");

    // A chunk replaced by 64 MiB, or cut short: refused from the answer's head, unread.
    let (r, fetched) = {
        store.inner.put(&p, PutPayload::from(vec![0u8; 64 << 20])).await.unwrap();
        read_counted(&store, &reader, d, &index, 4096 + 10, 4096 + 20).await
    };
    let e = r.unwrap_err();
    assert!(e.is_corrupt() && e.to_string().contains("not the 4096"), "{e}");
    assert!(fetched <= 1024, "fetched {fetched}");
    store.inner.put(&p, PutPayload::from(bytes[4096..4096 + 100].to_vec())).await.unwrap();
    for (start, end) in [(4096 + 10, 4096 + 20), (4096 + 2000, 4096 + 2010)] {
        let (r, _) = read_counted(&store, &reader, d, &index, start, end).await;
        let e = r.unwrap_err();
        assert!(e.is_corrupt(), "{start}..{end}: {e}");
    }
    assert!(reader.state() == BucketState::Up, "a corrupt chunk says nothing about the bucket");
}

/// An index an older tender wrote has no sub-chunk hashes: its ranges read whole chunks, and
/// what this tender writes carries nothing an older one refuses (the new fields are optional).
#[tokio::test]
async fn should_read_whole_chunks_of_an_index_without_sub_chunk_hashes() {
    let store = Arc::new(Faulty::new(Fault::None));
    let b = sub_bucket(&store, "a");
    let bytes = content(2 * 4096 + 100);
    let d = uploaded_v2(&b, &bytes).await;
    let key = ObjectPath::from(format!("index/sha256/{}.json", d.hex()));
    let raw = store.inner.get(&key).await.unwrap().bytes().await.unwrap();
    let mut json: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    let obj = json.as_object_mut().unwrap();
    assert!(obj.remove("subChunkSize").is_some() && obj.remove("subChunks").is_some());
    store.inner.put(&key, PutPayload::from(serde_json::to_vec(&json).unwrap())).await.unwrap();
    let reader = sub_bucket(&store, "b");
    let index = reader.index(&d).await.unwrap().unwrap();
    assert!(index.sub_chunk_size.is_none() && index.sub_chunks.is_empty());
    let (r, fetched) = read_counted(&store, &reader, d, &index, 5000, 5100).await;
    assert!(r.unwrap() == bytes[5000..5100]);
    assert_eq!(fetched, 4096, "the whole chunk, as before sub-chunks");
    // A chunk size that is no multiple of the sub-chunk size records none.
    let plain = bucket_on(&Arc::new(InMemory::new()), "c");
    let e = uploaded_v2(&plain, &bytes).await;
    assert!(plain.index(&e).await.unwrap().unwrap().sub_chunk_size.is_none());
}

/// Sub-chunk hashes from the bucket are checked like the rest of the index: a wrong count, an
/// absurd sub-chunk size or a digest that is not hex is refused (corrupt), never a panic or an
/// allocation the index does not pay for.
#[tokio::test]
async fn should_refuse_an_index_with_sub_chunk_hashes_unlike_its_chunks() {
    let store = Arc::new(Faulty::new(Fault::None));
    let b = sub_bucket(&store, "a");
    let bytes = content(2 * 4096 + 100);
    let d = uploaded_v2(&b, &bytes).await;
    let good = (*b.index(&d).await.unwrap().unwrap()).clone();
    good.validate().unwrap();
    type Spoil = fn(&mut ChunkIndex);
    let cases: Vec<(&str, Spoil)> = vec![
        ("a chunk's count", |i| {
            i.sub_chunks[0].pop();
        }),
        ("a chunk's count", |i| i.sub_chunks[2].push("0".repeat(64))),
        ("of 3 chunks", |i| {
            i.sub_chunks.pop();
        }),
        ("size", |i| i.sub_chunk_size = Some(0)),
        ("size", |i| i.sub_chunk_size = Some(1000)),
        ("size", |i| i.sub_chunk_size = Some(4096)),
        ("size", |i| i.sub_chunk_size = Some(u64::MAX)),
        ("a chunk's count", |i| i.sub_chunk_size = Some(1)),
        ("hex", |i| i.sub_chunks[1][3] = "zz".repeat(32)),
        ("without a sub-chunk size", |i| i.sub_chunk_size = None),
        ("format 1", |i| (i.format, i.upload) = (1, None)),
    ];
    for (want, spoil) in cases {
        let mut bad = good.clone();
        spoil(&mut bad);
        let key = ObjectPath::from(format!("index/sha256/{}.json", d.hex()));
        store.inner.put(&key, PutPayload::from(serde_json::to_vec(&bad).unwrap())).await.unwrap();
        let e = sub_bucket(&store, "b").index(&d).await.unwrap_err();
        let want = if want == "a chunk's count" { "sub-chunk digests for chunk" } else { want };
        assert!(e.is_corrupt() && e.to_string().contains(want), "{want}: {e}");
    }
    // Digests that are hex but wrong: the index reads, the range over them is refused, and
    // fsck says why.
    let mut wrong = good.clone();
    wrong.sub_chunks[1][0] = "ab".repeat(32);
    let key = ObjectPath::from(format!("index/sha256/{}.json", d.hex()));
    store.inner.put(&key, PutPayload::from(serde_json::to_vec(&wrong).unwrap())).await.unwrap();
    let reader = sub_bucket(&store, "c");
    let e = read_all(&reader, d, 4096, 4097).await.unwrap_err();
    assert!(e.is_corrupt(), "{e}");
    let r = reader.fsck(false).await.unwrap();
    assert!(r.corrupt.len() == 1 && r.corrupt[0].problem.contains("sub-chunk digests"), "{r:?}");
}

/// An upload resumed from the chunks the fill's streamer wrote records the sub-chunk hashes of
/// those chunks too (kept with the upload in memory; the progress record lists chunks only).
#[tokio::test]
async fn should_record_sub_chunk_hashes_of_an_upload_resumed_from_the_fill() {
    let store = Arc::new(Faulty::new(Fault::None));
    let b = sub_bucket(&store, "a");
    let bytes = content(3 * 4096 + 7);
    let d = Digest::of(&bytes);
    let mut u = b.begin_parts(Some("k"), Some(d), Some(bytes.len() as u64));
    u.put_chunk(Bytes::copy_from_slice(&bytes[..4096])).await.unwrap();
    u.put_chunk(Bytes::copy_from_slice(&bytes[4096..8192])).await.unwrap();
    u.flush().await.unwrap();
    let p = b.progress("k").await.unwrap().unwrap();
    assert_eq!(p.chunks.len(), 2);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("obj"), &bytes).unwrap();
    let index = b.upload_resumed(&d, &dir.path().join("obj"), Some("k"), Some(u)).await.unwrap();
    // In chain form: the states inside each chunk (one fewer than its pieces).
    assert_eq!(index.format, 3);
    assert_eq!(index.sub_chunks.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 3, 0]);
    let reader = sub_bucket(&store, "b");
    let index = reader.index(&d).await.unwrap().unwrap();
    let (r, fetched) = read_counted(&store, &reader, d, &index, 1024, 2048).await;
    assert!(r.unwrap() == bytes[1024..2048]);
    assert_eq!(fetched, 1024);
}

/// A bucket written before format 3 keeps working: an object stored whole under `objects/`
/// with a format-1 index is read by ranges and checked like chunk objects; the format marker
/// moves on to 3.
#[tokio::test]
async fn should_read_objects_written_whole_before_format_3() {
    let mem = Arc::new(InMemory::new());
    let bytes = content(2 * 1024 + 10);
    let d = Digest::of(&bytes);
    let chunks = bytes.chunks(1024).map(|c| hex::encode(Sha256::digest(c))).collect();
    let index = ChunkIndex::new(bytes.len() as u64, 1024, chunks, "old");
    mem.put(&ObjectPath::from(format!("fleet/objects/sha256/{}", d.hex())), PutPayload::from(bytes.clone()))
        .await
        .unwrap();
    mem.put(
        &ObjectPath::from(format!("fleet/index/sha256/{}.json", d.hex())),
        PutPayload::from(serde_json::to_vec(&index).unwrap()),
    )
    .await
    .unwrap();
    let marker = ObjectPath::from("fleet/tender-bucket.json");
    mem.put(&marker, PutPayload::from_static(br#"{"format":2,"createdBy":"tender 0.2"}"#)).await.unwrap();
    let b = bucket_on(&mem, "new");
    b.check().await.unwrap();
    let f: serde_json::Value = serde_json::from_slice(&mem.get(&marker).await.unwrap().bytes().await.unwrap()).unwrap();
    assert_eq!(f["format"], crate::BUCKET_FORMAT);
    assert_eq!(read_all(&b, d, 1000, bytes.len() as u64).await.unwrap(), &bytes[1000..]);
    assert_eq!(b.read_small(&d, 1 << 20).await.unwrap().unwrap().0.as_ref(), &bytes[..]);
    let r = b.fsck(false).await.unwrap();
    assert!(r.is_clean() && r.unindexed.is_empty(), "{r:?}");
    assert_eq!(r.objects_checked, 1);
}

/// A reader following an upload in progress sees each chunk once it is in the bucket, checked
/// against the record; the record goes once the index is written.
#[tokio::test]
async fn should_list_chunks_in_progress_until_the_index_is_written() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let bytes = content(3 * 1024 + 1);
    let d = Digest::of(&bytes);
    let mut up = b.begin_parts(Some("up@x"), Some(d), Some(bytes.len() as u64));
    assert!(b.progress("up@x").await.unwrap().is_none(), "nothing written before the first chunk");
    for c in bytes.chunks(1024).take(2) {
        up.put_chunk(bytes::Bytes::copy_from_slice(c)).await.unwrap();
    }
    up.flush().await.unwrap();
    let other = bucket_on(&mem, "b");
    let p = other.progress("up@x").await.unwrap().unwrap();
    assert_eq!((p.chunks.len(), p.total, p.digest, p.leased), (2, Some(3 * 1024 + 1), Some(d), true));
    assert!(p.chained, "the size and digest are known from the start: chunks as links of the chain");
    let check = p.check_of(1, None).unwrap();
    assert_eq!(other.part(&p.upload, 1, &check, None, 1024).await.unwrap().as_ref(), &bytes[1024..2048]);
    let wrong = p.check_of(0, None).unwrap();
    assert!(other.part(&p.upload, 1, &wrong, None, 1024).await.unwrap_err().is_corrupt());
    assert!(other.index(&d).await.unwrap().is_none(), "not visible before its index");
    for c in bytes.chunks(1024).skip(2) {
        up.put_chunk(bytes::Bytes::copy_from_slice(c)).await.unwrap();
    }
    let index = up.finish(&d, bytes.len() as u64, None).await.unwrap();
    assert_eq!((index.format, index.upload.as_deref()), (3, Some(p.upload.as_str())));
    assert!(other.progress("up@x").await.unwrap().is_none());
    assert_eq!(read_all(&other, d, 0, bytes.len() as u64).await.unwrap(), bytes);
    // Another key's record is not this one's.
    assert!(other.progress("up@y").await.unwrap().is_none());
}

/// Issue 19 (9): the record carries the object's first bytes until the first chunk is listed,
/// so a follower's client need not wait for a whole chunk; a record with a head that cannot be
/// the object's is refused.
#[tokio::test]
async fn should_carry_the_first_bytes_in_the_record_until_the_first_chunk_is_listed() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let bytes = content(2 * 1024 + 7);
    let d = Digest::of(&bytes);
    let mut up = b.begin_parts(Some("up@h"), Some(d), Some(bytes.len() as u64));
    up.set_head(&bytes).await;
    up.announce().await.unwrap();
    let other = bucket_on(&mem, "b");
    let p = other.progress("up@h").await.unwrap().unwrap();
    assert!(p.chunks.is_empty());
    let chunk = usize::try_from(p.chunk_size).unwrap();
    assert_eq!(p.head_bytes().unwrap().unwrap().as_ref(), &bytes[..chunk], "at most one chunk of head");
    up.put_chunk(bytes::Bytes::copy_from_slice(&bytes[..chunk])).await.unwrap();
    up.flush().await.unwrap();
    let p = other.progress("up@h").await.unwrap().unwrap();
    assert_eq!((p.chunks.len(), p.head.is_none()), (1, true), "the head goes once the first chunk is listed");

    // Hostile records: a head longer than the first chunk, or not base64.
    let path = ObjectPath::from(format!("fleet/progress/{}.json", crate::key_hash("up@h")));
    let mut bad = p.clone();
    bad.chunks.clear();
    for head in ["QUJD".repeat(chunk), "not base64!".to_string()] {
        bad.head = Some(head);
        mem.put(&path, PutPayload::from(serde_json::to_vec(&bad).unwrap())).await.unwrap();
        let e = other.progress("up@h").await.unwrap_err();
        assert!(e.is_corrupt() && e.to_string().contains("head"), "{e}");
    }
}

/// Hostile bucket content is bounded before it is read: a chunk object longer than its record
/// allows, a record of many megabytes, a record naming chunks over 1 GiB.
#[tokio::test]
async fn should_refuse_oversized_chunks_and_records_before_reading_them() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let bytes = content(3 * 1024 + 5);
    let d = uploaded(&b, &bytes).await;
    let index = b.index(&d).await.unwrap().unwrap();
    let upload = index.upload.clone().unwrap();
    // Chunk 1 replaced by 64 MiB: the reader learns the size from the response and stops.
    let p = ObjectPath::from(format!("fleet/parts/{upload}/00000001"));
    mem.put(&p, PutPayload::from(vec![0u8; 64 << 20])).await.unwrap();
    let reader = bucket_on(&mem, "b");
    let e = reader.part(&upload, 1, &index.check_of(1, &d).unwrap(), None, 1024).await.unwrap_err();
    assert!(e.is_corrupt() && e.to_string().contains("more than the 1024"), "{e}");
    let e = read_all(&reader, d, 0, bytes.len() as u64).await.unwrap_err();
    assert!(e.is_corrupt() && e.to_string().contains("more than the 1024"), "{e}");

    // An index of 17 MiB (whitespace is valid JSON) is refused unread.
    let other = Digest::of(b"other");
    let mut big = vec![b' '; 17 << 20];
    big.extend_from_slice(b"{}");
    mem.put(&ObjectPath::from(format!("fleet/index/sha256/{}.json", other.hex())), PutPayload::from(big))
        .await
        .unwrap();
    let e = reader.index(&other).await.unwrap_err();
    assert!(e.is_corrupt() && e.to_string().contains("longer than"), "{e}");

    // A record that names chunks of 2 GiB is refused (a chunk is read whole into memory).
    let mut huge = (*index).clone();
    huge.chunk_size = 2 << 30;
    huge.size = 2 << 30;
    huge.chunks.truncate(1);
    assert!(huge.validate().unwrap_err().contains("chunk size"));
}

// ---- tender gc --bucket, served records ----

/// `n` bytes unlike every other `tag`'s.
fn distinct(tag: u8, n: usize) -> Vec<u8> {
    let mut v = content(n);
    v[0] = tag;
    v[1] = tag.wrapping_mul(31);
    v
}

/// Seconds since the epoch, an hour ahead: later than every upload of the test.
fn later_secs() -> u64 {
    tender_store::now_secs() + 3600
}

/// A gc run as at a day from now, past the grace of everything the test served.
async fn gc_tomorrow(b: &Bucket, max: u64, dry_run: bool) -> BucketGcReport {
    b.gc_at(max, dry_run, (tender_store::now_secs() + 86_400) * 1000).await.unwrap()
}

fn evicted(r: &BucketGcReport) -> Vec<String> {
    r.evicted.iter().map(|e| e.digest.clone()).collect()
}

async fn keys_under(mem: &InMemory, dir: &str) -> Vec<String> {
    let p = ObjectPath::from(dir);
    let mut keys: Vec<String> = mem.list(Some(&p)).map(|m| m.unwrap().location.to_string()).collect::<Vec<_>>().await;
    keys.sort();
    keys
}

async fn put_lease(mem: &InMemory, key: &str, expires_at: u64) {
    let body = serde_json::json!({ "key": key, "owner": "c", "expiresAt": expires_at });
    let p = ObjectPath::from(format!("fleet/leases/{}.json", key_hash(key)));
    mem.put(&p, PutPayload::from(serde_json::to_vec(&body).unwrap())).await.unwrap();
}

#[tokio::test]
async fn should_evict_the_least_recently_served_across_replicas_down_to_the_cap() {
    let mem = Arc::new(InMemory::new());
    let (a, b) = (bucket_on(&mem, "a"), bucket_on(&mem, "b"));
    let mut d = Vec::new();
    for i in 0..4 {
        d.push(uploaded(&a, &distinct(i, 1000)).await);
    }
    let t = later_secs();
    // d0: a long ago, b lately (newest wins); d1: a; d2: b, before d1; d3: never (its upload).
    a.note_served_at(&d[0], t + 10);
    a.note_served_at(&d[1], t + 30);
    b.note_served_at(&d[0], t + 40);
    b.note_served_at(&d[2], t + 20);
    a.flush_served().await.unwrap();
    b.flush_served().await.unwrap();

    // The cap is on every byte under the prefix (records too): 2000 bytes less than it holds.
    let total = bytes_under(&mem, "fleet").await;
    let cap = total - 2000;
    let r = gc_tomorrow(&a, cap, false).await;
    assert_eq!(evicted(&r), vec![d[3].to_string(), d[2].to_string()], "{r:?}");
    assert_eq!(r.evicted[1].last_served, t + 20);
    assert!(r.evicted[0].last_served < t, "never served: its upload time");
    assert_eq!((r.objects_before, r.bytes_before, r.objects_after, r.bytes_after), (4, 4000, 2, 2000));
    assert_eq!((r.skipped_under_lease, r.skipped_recent, r.dry_run, r.max_size), (0, 0, false, cap));
    assert_eq!((r.total_bytes_before, r.total_bytes_after), (total, bytes_under(&mem, "fleet").await));
    assert!(r.total_bytes_after <= cap, "{r:?}");
    for (i, kept) in [(0, true), (1, true), (2, false), (3, false)] {
        assert_eq!(b.index(&d[i]).await.unwrap().is_some(), kept, "d{i}");
    }
    // At the cap: nothing more goes.
    let again = gc_tomorrow(&b, cap, false).await;
    assert!(again.evicted.is_empty(), "{again:?}");
    assert_eq!((again.objects_before, again.bytes_after), (2, 2000));
}

#[tokio::test]
async fn should_never_evict_an_object_under_a_live_lease_and_evict_it_once_the_lease_expired() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let mut d = Vec::new();
    for i in 0..4 {
        d.push(uploaded(&b, &distinct(i, 1000)).await);
    }
    let t = later_secs();
    for (i, digest) in d.iter().enumerate() {
        b.note_served_at(digest, t + i as u64);
    }
    b.flush_served().await.unwrap();
    // Three forms of fill key: a blob, a manifest, an OS image (digest by its trust record).
    let now_ms = (tender_store::now_secs() + 86_400) * 1000;
    let live = now_ms + 60_000;
    put_lease(&mem, &format!("ghcr.io@{}", d[0]), live).await;
    put_lease(&mem, &format!("manifest:{}", d[1]), live).await;
    let image = "image:abc/v1.9.0/metal-amd64.iso";
    b.put_trust(&TrustRecord { key: image.into(), digest: d[2], size: 1000, first_seen: 1 }).await.unwrap();
    put_lease(&mem, image, live).await;
    // An expired lease protects nothing.
    put_lease(&mem, &format!("ghcr.io@{}", d[3]), now_ms - 1).await;

    let r = b.gc_at(0, false, now_ms).await.unwrap();
    assert_eq!(evicted(&r), vec![d[3].to_string()], "{r:?}");
    assert_eq!((r.skipped_under_lease, r.objects_after, r.bytes_after), (3, 3, 3000));
    for x in &d[..3] {
        assert!(b.index(x).await.unwrap().is_some());
    }
    // Past the leases' expiry they go, least recently served first.
    let r = b.gc_at(0, false, live + 1).await.unwrap();
    assert_eq!(evicted(&r), vec![d[0].to_string(), d[1].to_string(), d[2].to_string()], "{r:?}");
    assert_eq!((r.skipped_under_lease, r.objects_after, r.bytes_after), (0, 0, 0));
    // The trust record stays: it names the asset's digest, not a bucket copy.
    assert!(b.trust(image).await.unwrap().is_some());
}

#[tokio::test]
async fn should_change_nothing_in_a_dry_run() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let d0 = uploaded(&b, &distinct(0, 1500)).await;
    let d1 = uploaded(&b, &distinct(1, 1500)).await;
    b.note_served_at(&d1, later_secs());
    b.flush_served().await.unwrap();
    let before = keys_under(&mem, "fleet").await;
    let r = gc_tomorrow(&b, 2200, true).await;
    assert!(r.dry_run);
    assert_eq!(evicted(&r), vec![d0.to_string()], "{r:?}");
    assert_eq!((r.objects_before, r.bytes_before, r.objects_after, r.bytes_after), (2, 3000, 1, 1500));
    assert_eq!(keys_under(&mem, "fleet").await, before);
    assert_eq!(read_all(&bucket_on(&mem, "x"), d0, 0, 1500).await.unwrap(), distinct(0, 1500));
}

#[tokio::test]
async fn should_keep_what_was_served_within_the_grace() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let d = uploaded(&b, &distinct(0, 1000)).await;
    // Uploaded just now, never served: within the grace (10 min by default).
    let r = b.gc(0, false).await.unwrap();
    assert!(r.evicted.is_empty(), "{r:?}");
    assert_eq!((r.skipped_recent, r.bytes_after), (1, 1000));
    assert!(b.index(&d).await.unwrap().is_some());
}

#[tokio::test]
async fn should_leave_readers_seeing_an_evicted_object_absent() {
    let mem = Arc::new(InMemory::new());
    let (a, b) = (bucket_on(&mem, "a"), bucket_on(&mem, "b"));
    let bytes = distinct(7, 3000);
    let d = uploaded(&a, &bytes).await;
    a.put_known(&d, "ghcr.io").await.unwrap();
    // b read it and remembers its index.
    assert_eq!(read_all(&b, d, 0, 3000).await.unwrap(), bytes);
    let r = gc_tomorrow(&a, 0, false).await;
    assert_eq!(evicted(&r), vec![d.to_string()]);
    assert!(a.index(&d).await.unwrap().is_none(), "the evicting replica forgot it");
    assert!(bucket_on(&mem, "c").index(&d).await.unwrap().is_none(), "a fresh replica never sees it");
    // A replica that remembered the index finds the content gone, then forgets it too.
    assert!(read_all(&b, d, 0, 3000).await.expect_err("content gone").is_not_found());
    assert!(b.index(&d).await.unwrap().is_none());
    assert!(!bucket_on(&mem, "c").is_known(&d, "ghcr.io").await.unwrap());
    for dir in ["fleet/index", "fleet/objects", "fleet/parts", "fleet/known"] {
        assert!(keys_under(&mem, dir).await.is_empty(), "{dir}: {:?}", keys_under(&mem, dir).await);
    }
}

/// The record of `replica`'s shard `shard`, as stored.
async fn served_record(mem: &InMemory, replica: &str, shard: char) -> Option<served::ServedRecord> {
    let p = ObjectPath::from(format!("fleet/served/{replica}/{shard}.json"));
    match mem.get(&p).await {
        Ok(g) => Some(serde_json::from_slice(&g.bytes().await.unwrap()).unwrap()),
        Err(object_store::Error::NotFound { .. }) => None,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn should_flush_served_times_by_shard_keep_the_newest_and_cap_each_record() {
    let mem = Arc::new(InMemory::new());
    let (a, b) = (bucket_on(&mem, "a"), bucket_on(&mem, "b"));
    // 64 digests, four or so per shard; noted at times 100 + i.
    let digests: Vec<Digest> = (0..64u8).map(|i| Digest::of(&[i])).collect();
    for (i, d) in digests.iter().enumerate() {
        a.note_served_at(d, 100 + i as u64);
    }
    let shards: std::collections::BTreeSet<char> = digests.iter().map(|d| d.hex().chars().next().unwrap()).collect();
    assert_eq!(a.flush_served_capped(2).await.unwrap(), shards.len());
    for s in &shards {
        let r = served_record(&mem, "a", *s).await.unwrap();
        assert_eq!(r.replica, "a");
        let mut want: Vec<(u64, String)> = digests
            .iter()
            .enumerate()
            .filter(|(_, d)| d.hex().starts_with(*s))
            .map(|(i, d)| (100 + i as u64, d.to_string()))
            .collect();
        want.sort();
        let keep: std::collections::BTreeMap<String, u64> =
            want.iter().rev().take(2).map(|(t, d)| (d.clone(), *t)).collect();
        assert_eq!(r.served, keep, "shard {s}: the newest two");
    }
    // Nothing noted: nothing written. One digest noted older than recorded: one shard
    // rewritten, the newer time kept.
    assert_eq!(a.flush_served().await.unwrap(), 0);
    let last = digests[63];
    let s = last.hex().chars().next().unwrap();
    a.note_served_at(&last, 5);
    assert_eq!(a.flush_served().await.unwrap(), 1);
    assert_eq!(served_record(&mem, "a", s).await.unwrap().served[&last.to_string()], 163);
    // Another replica's records merge, newest per digest.
    b.note_served_at(&last, 500);
    b.note_served_at(&digests[0], 1);
    b.flush_served().await.unwrap();
    let merged = a.served_times().await.unwrap();
    assert_eq!(merged[&last], 500);
    assert!(merged.len() <= 2 * shards.len() + 1);
}

#[test]
fn should_cap_served_entries_dropping_the_oldest() {
    let mut m: std::collections::BTreeMap<String, u64> = (0..10).map(|i| (format!("d{i}"), 100 - i)).collect();
    served::cap_entries(&mut m, 3);
    assert_eq!(m.into_iter().collect::<Vec<_>>(), vec![("d0".into(), 100), ("d1".into(), 99), ("d2".into(), 98)]);
}

#[tokio::test]
async fn should_keep_served_times_for_the_next_flush_while_the_bucket_is_down() {
    let (store, b) = faulty_bucket(Duration::from_secs(5));
    b.check().await.unwrap();
    let d = Digest::of(b"served while down");
    b.note_served_at(&d, 42);
    store.set(Fault::Refuse);
    assert!(b.flush_served().await.is_err());
    // Down now: refused at once, still kept.
    assert!(b.flush_served().await.expect_err("down").is_down());
    store.set(Fault::None);
    assert!(b.probe().await);
    assert_eq!(b.flush_served().await.unwrap(), 1);
    assert_eq!(b.served_times().await.unwrap().get(&d), Some(&42));
}

#[test]
fn should_read_the_digest_of_a_fill_key() {
    let d = Digest::of(b"x");
    assert_eq!(gc::key_digest(&format!("ghcr.io@{d}")), Some(d));
    assert_eq!(gc::key_digest(&format!("manifest:{d}")), Some(d));
    assert_eq!(gc::key_digest("image:abc/v1.9.0/metal-amd64.iso"), None);
}

/// The `x-amz-content-sha256` header of one PUT of `body` through a store built from settings
/// with `sign_payload`, as an S3 server on loopback receives it.
async fn content_sha256_header(sign_payload: bool, body: &'static [u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        // The head, then the body it announces (bounded: the test sends a few bytes).
        let head_end = loop {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0 && got.len() < 64 << 10, "the request head never ended");
            got.extend_from_slice(&buf[..n]);
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
        };
        let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
        let header = |name: &str| {
            head.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string())).unwrap_or_default()
        };
        let length: usize = header("content-length:").parse().unwrap();
        while got.len() < head_end + 4 + length {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "the body ended early");
            got.extend_from_slice(&buf[..n]);
        }
        conn.write_all(b"HTTP/1.1 200 OK\r\netag: \"e\"\r\ncontent-length: 0\r\n\r\n").await.unwrap();
        header("x-amz-content-sha256:")
    });
    let mut s = BucketSettings::new("fleet");
    s.endpoint = Some(format!("http://{addr}"));
    s.credentials =
        Some(Credentials { access_key_id: "AKIATEST".into(), secret_access_key: "secret".into(), session_token: None });
    s.retries = 0;
    s.sign_payload = sign_payload;
    s.build().unwrap().put(&ObjectPath::from("parts/x/0"), PutPayload::from_static(body)).await.unwrap();
    server.await.unwrap()
}

/// Issue 19: a chunk's body is not hashed a second time for the signature unless asked (every
/// chunk is verified against its own sha256 when read; S3 signs no response either).
#[tokio::test]
async fn should_send_bodies_unsigned_unless_sign_payload_is_set() {
    assert_eq!(content_sha256_header(false, b"chunk bytes").await, "unsigned-payload");
    let signed = content_sha256_header(true, b"chunk bytes").await;
    assert_eq!(signed, hex::encode(sha2::Sha256::digest(b"chunk bytes")), "signPayload: true signs the body's sha256");
}

// ---- issue 36 (4, 5): what no index and no record names ----

/// The sizes of every key under `dir`, summed.
async fn bytes_under(mem: &InMemory, dir: &str) -> u64 {
    let p = ObjectPath::from(dir);
    mem.list(Some(&p)).map(|m| m.unwrap().size).collect::<Vec<_>>().await.into_iter().sum()
}

/// Put `n` chunk objects of 1000 bytes under `parts/<upload>` (an upload nothing names).
async fn put_stray(mem: &InMemory, upload: &str, n: usize) {
    for i in 0..n {
        let p = ObjectPath::from(format!("fleet/parts/{upload}/{i:08}"));
        mem.put(&p, PutPayload::from(distinct(i as u8, 1000))).await.unwrap();
    }
}

#[tokio::test]
async fn should_sweep_chunks_nothing_names_once_older_than_the_grace() {
    let mem = Arc::new(InMemory::new());
    let mut s = BucketSettings::new("test");
    s.chunk_size = 1024;
    s.prefix = "fleet".into();
    s.lease_ttl = Duration::from_millis(100);
    s.request_timeout = Duration::from_millis(100);
    s.gc_grace = Duration::from_secs(2);
    let b = Bucket::with_store(mem.clone(), s, BucketMetrics::default());
    // Named by its index; named by the record of an upload that runs (renewed, never finished).
    let d = uploaded(&b, &content(3000)).await;
    let mut live = b.begin_parts(None, None, None);
    live.put_chunk(bytes::Bytes::from(content(1024))).await.unwrap();
    live.flush().await.unwrap();
    let live_id = live.upload_id();
    // Named by nothing: a healed object's first upload, a probe a timed-out check left behind,
    // content stored whole with no index.
    let (old, young) = ("a".repeat(32), "b".repeat(32));
    put_stray(&mem, &old, 2).await;
    let probe = ObjectPath::from("fleet/leases/.probe-dead-1");
    mem.put(&probe, PutPayload::from_static(b"{}")).await.unwrap();
    let whole = ObjectPath::from(format!("fleet/objects/sha256/{}", "cd".repeat(32)));
    mem.put(&whole, PutPayload::from_static(b"x")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2200)).await;
    put_stray(&mem, &young, 1).await;

    let sweeper = b.spawn_sweeper();
    let t = std::time::Instant::now();
    while !keys_under(&mem, &format!("fleet/parts/{old}")).await.is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10), "the sweep never removed chunks nothing names");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(keys_under(&mem, &format!("fleet/parts/{young}")).await.len(), 1, "younger than gcGrace: kept");
    assert!(mem.head(&probe).await.is_err(), "a stale probe goes");
    assert!(mem.head(&whole).await.is_err(), "content without an index goes");
    assert_eq!(read_all(&b, d, 0, 3000).await.unwrap(), content(3000), "an indexed object stays");
    assert_eq!(keys_under(&mem, &format!("fleet/parts/{live_id}")).await.len(), 1, "a running upload stays");
    // Once older than gcGrace, the young one goes too.
    while !keys_under(&mem, &format!("fleet/parts/{young}")).await.is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10), "the sweep never removed the younger stray");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(keys_under(&mem, &format!("fleet/parts/{live_id}")).await.len(), 1, "a running upload stays");
    sweeper.abort();
    live.abort().await;
}

#[tokio::test]
async fn should_count_every_byte_under_the_prefix_and_remove_strays_before_evicting() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let d0 = uploaded(&b, &distinct(0, 1000)).await;
    let d1 = uploaded(&b, &distinct(1, 1000)).await;
    b.note_served_at(&d1, later_secs());
    b.flush_served().await.unwrap();
    let stray = "e".repeat(32);
    put_stray(&mem, &stray, 2).await;
    mem.put(&ObjectPath::from("fleet/leases/.probe-dead-2"), PutPayload::from_static(b"{}")).await.unwrap();
    let total = bytes_under(&mem, "fleet").await;

    // The strays alone bring the bucket within the cap: nothing is evicted.
    let cap = total - 2002;
    let dry = gc_tomorrow(&b, cap, true).await;
    assert_eq!((dry.total_bytes_before, dry.total_bytes_after, dry.stray_bytes), (total, cap, 2002), "{dry:?}");
    assert_eq!((dry.content_bytes, dry.in_progress_bytes, dry.quarantine_bytes), (2000, 0, 0));
    assert_eq!(dry.record_bytes, total - 4002, "indexes and served records");
    let keys: Vec<_> = dry.strays.iter().map(|s| (s.key.as_str(), s.objects, s.bytes, s.removed)).collect();
    assert_eq!(keys, vec![(format!("parts/{stray}").as_str(), 2, 2000, false), ("leases/.probe-dead-2", 1, 2, false)]);
    assert_eq!(keys_under(&mem, &format!("fleet/parts/{stray}")).await.len(), 2, "a dry run removes nothing");
    let r = gc_tomorrow(&b, cap, false).await;
    assert!(r.evicted.is_empty(), "{r:?}");
    assert!(r.strays.iter().all(|s| s.removed), "{r:?}");
    assert_eq!((r.total_bytes_after, r.freed_bytes()), (cap, 2002));
    assert_eq!(b.metrics().strays_removed.get(), 2);
    assert!(keys_under(&mem, &format!("fleet/parts/{stray}")).await.is_empty(), "strays removed first");
    assert!(keys_under(&mem, "fleet/leases").await.is_empty());
    assert_eq!(bytes_under(&mem, "fleet").await, cap);
    // A lower cap: the least recently served object goes, and the total is within the cap.
    let cap = cap - 500;
    let r = gc_tomorrow(&b, cap, false).await;
    assert_eq!(evicted(&r), vec![d0.to_string()], "{r:?}");
    assert!(bytes_under(&mem, "fleet").await <= cap);
    assert_eq!(r.total_bytes_after, bytes_under(&mem, "fleet").await, "{r:?}");
}

#[tokio::test]
async fn should_remove_its_probe_object_even_when_the_second_create_times_out() {
    let (store, b) = faulty_bucket(Duration::from_millis(200));
    store.set(Fault::HangExisting);
    assert!(matches!(b.check().await, Err(BucketError::Timeout { .. })));
    let t = std::time::Instant::now();
    loop {
        let left: Vec<_> = store.inner.list(Some(&ObjectPath::from("leases"))).collect().await;
        if left.is_empty() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(3), "the probe object stayed: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SeaweedFS lists a directory whose objects were deleted as a common prefix: a repaired
/// bucket is clean.
#[tokio::test]
async fn should_not_report_an_empty_upload_directory_after_a_repair() {
    let store = Arc::new(Faulty::new(Fault::EmptyDirs));
    let b = Bucket::with_store(store.clone(), BucketSettings::new("test"), BucketMetrics::default());
    let stray = "f".repeat(32);
    for i in 0..2 {
        let p = ObjectPath::from(format!("parts/{stray}/{i:08}"));
        store.inner.put(&p, PutPayload::from(distinct(i, 1000))).await.unwrap();
    }
    let r = b.fsck(true).await.unwrap();
    assert_eq!(r.unindexed, vec![format!("parts/{stray}")], "{r:?}");
    assert_eq!((r.strays.len(), r.stray_bytes, r.strays[0].objects, r.strays[0].removed), (1, 2000, 2, true));
    let again = b.fsck(false).await.unwrap();
    assert!(again.unindexed.is_empty() && again.strays.is_empty(), "{again:?}");
}

// ---- issue 36 (2): chunks missing under their index ----

/// The chunk object `i` of `d`'s upload, as the index names it.
async fn part_of(b: &Bucket, d: &Digest, i: usize) -> ObjectPath {
    let upload = b.index(d).await.unwrap().unwrap().upload.clone().expect("written as chunk objects");
    b.part_path(&upload, i)
}

/// A committed local copy of `bytes`, for a heal to read.
fn local_copy(dir: &tempfile::TempDir, bytes: &[u8]) -> std::path::PathBuf {
    let f = dir.path().join("obj");
    std::fs::write(&f, bytes).unwrap();
    f
}

/// Issue 36 (2): chunks gone from under their index are put back from a verified local copy,
/// exactly those, under the same index, and the object reads whole again.
#[tokio::test]
async fn should_restore_exactly_the_missing_chunks_under_the_existing_index() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let bytes = content(4 * 1024 + 300);
    let d = uploaded(&b, &bytes).await;
    let index_path = ObjectPath::from(format!("fleet/index/sha256/{}.json", d.hex()));
    let index_before = mem.get(&index_path).await.unwrap().bytes().await.unwrap();
    let mut tags = Vec::new();
    for i in 0..5 {
        tags.push(mem.head(&part_of(&b, &d, i).await).await.unwrap().e_tag);
    }
    // The second chunk and the last, shorter one disappear.
    for i in [1, 4] {
        mem.delete(&part_of(&b, &d, i).await).await.unwrap();
    }
    let e = read_all(&b, d, 0, bytes.len() as u64).await.expect_err("a hole");
    assert!(e.is_not_found(), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let report = b.heal_missing(&d, &local_copy(&dir, &bytes)).await.unwrap();
    assert_eq!(report, HealReport::Checked { chunks: 5, missing: vec![1, 4], restored: vec![1, 4] });
    assert_eq!(b.metrics().healed_chunks.get(), 2);
    assert_eq!(read_all(&b, d, 0, bytes.len() as u64).await.unwrap(), bytes, "whole again");
    for i in [0, 2, 3] {
        let tag = mem.head(&part_of(&b, &d, i).await).await.unwrap().e_tag;
        assert_eq!(tag, tags[i], "chunk {i} was present and is not written again");
    }
    let index_after = mem.get(&index_path).await.unwrap().bytes().await.unwrap();
    assert_eq!(index_after, index_before, "the index is not rewritten");
}

/// Issue 36 (2): a local chunk whose sha256 differs from the index's is never written, and a
/// chunk the bucket holds is never overwritten (not even one the listing missed: the write is a
/// conditional create).
#[tokio::test]
async fn should_refuse_local_bytes_unlike_the_index_and_never_overwrite_a_chunk() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let bytes = content(3 * 1024);
    let d = uploaded(&b, &bytes).await;
    let hole = part_of(&b, &d, 1).await;
    mem.delete(&hole).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut rotten = bytes.clone();
    rotten[1024 + 9] ^= 1;
    let e = b.heal_missing(&d, &local_copy(&dir, &rotten)).await.expect_err("refused");
    assert!(e.is_corrupt(), "{e}");
    assert!(e.to_string().contains("chunk 1"), "{e}");
    assert!(mem.head(&hole).await.is_err(), "nothing written");
    let e = b.heal_missing(&d, &local_copy(&dir, &bytes[..2000])).await.expect_err("a copy of another size");
    assert!(e.is_corrupt(), "{e}");
    assert_eq!(b.metrics().healed_chunks.get(), 0);
    // Rot in a chunk the bucket holds does not matter: only missing chunks are read.
    let mut elsewhere = bytes.clone();
    elsewhere[5] ^= 1;
    let report = b.heal_missing(&d, &local_copy(&dir, &elsewhere)).await.unwrap();
    assert_eq!(report.restored(), [1]);
    assert_eq!(read_all(&b, d, 0, bytes.len() as u64).await.unwrap(), bytes);

    // A listing that misses chunks written meanwhile: each create is refused, nothing changes.
    let (store, f) = faulty_bucket(Duration::from_secs(5));
    let d = uploaded(&f, &bytes).await;
    let part = part_of(&f, &d, 2).await;
    store.inner.put(&part, PutPayload::from_static(b"another replica's")).await.unwrap();
    store.set(Fault::StaleParts);
    let report = f.heal_missing(&d, &local_copy(&dir, &bytes)).await.unwrap();
    assert_eq!(report, HealReport::Checked { chunks: 3, missing: vec![0, 1, 2], restored: vec![] });
    let kept = store.inner.get(&part).await.unwrap().bytes().await.unwrap();
    assert_eq!(&kept[..], b"another replica's", "never overwritten");
}

/// Issue 36 (2): chunks put back under an index that `gc` removed meanwhile go again, so a
/// heal leaves nothing that no index names.
#[tokio::test]
async fn should_remove_what_it_wrote_when_the_index_went_meanwhile() {
    let (store, f) = faulty_bucket(Duration::from_secs(5));
    let bytes = content(3 * 1024);
    let d = uploaded(&f, &bytes).await;
    let hole = part_of(&f, &d, 1).await;
    store.inner.delete(&hole).await.unwrap();
    store.set(Fault::GcOnPart);
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(f.heal_missing(&d, &local_copy(&dir, &bytes)).await.unwrap(), HealReport::NoIndex);
    assert!(store.inner.head(&hole).await.is_err(), "the chunk written under the removed index went again");
}

/// Issue 36 (2): once one replica put the chunks back, another's heal finds nothing missing and
/// writes nothing; a heal of an object the bucket no longer indexes does nothing; two heals of
/// one object at once on one replica write each chunk once.
#[tokio::test]
async fn should_make_a_second_heal_a_no_op() {
    let mem = Arc::new(InMemory::new());
    let (a, b) = (bucket_on(&mem, "a"), bucket_on(&mem, "b"));
    let bytes = content(3 * 1024 + 1);
    let d = uploaded(&a, &bytes).await;
    mem.delete(&part_of(&a, &d, 2).await).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let local = local_copy(&dir, &bytes);
    let (x, y) = tokio::join!(a.heal_missing(&d, &local), a.heal_missing(&d, &local));
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x.restored().len() + y.restored().len(), 1, "{x:?} {y:?}");
    assert!(matches!(y, HealReport::Busy | HealReport::Checked { .. }), "{y:?}");
    assert_eq!(a.metrics().healed_chunks.get(), 1);

    let report = b.heal_missing(&d, &local).await.unwrap();
    assert_eq!(report, HealReport::Checked { chunks: 4, missing: vec![], restored: vec![] });
    assert_eq!(b.metrics().healed_chunks.get(), 0);

    let gone = uploaded(&a, &content(100)).await;
    mem.delete(&ObjectPath::from(format!("fleet/index/sha256/{}.json", gone.hex()))).await.unwrap();
    a.forget(&gone);
    assert_eq!(b.heal_missing(&gone, &local).await.unwrap(), HealReport::NoIndex);
}

fn keyed_on(store: &Arc<InMemory>, replica: &str, key: Option<&str>) -> Arc<Bucket> {
    let mut s = BucketSettings::new("test");
    s.chunk_size = 1024;
    s.prefix = "fleet".into();
    s.replica = replica.into();
    s.index_key = key.map(|k| IndexKey::new(k.as_bytes()));
    Bucket::with_store(store.clone(), s, BucketMetrics::default())
}

const KEY: &str = "0123456789abcdef0123456789abcdef";

/// Issue 36: with `storage.s3.indexKeyFile` the uploading replica signs the index; another
/// replica with the same key finds it signed (and then takes chunks verified against it for
/// the digest's bytes); without the key, with another key, for another digest, or with any
/// field that says which bytes are the digest's changed, it is not signed.
#[tokio::test]
async fn should_sign_indexes_so_only_a_replica_with_the_key_trusts_them() {
    let mem = Arc::new(InMemory::new());
    let a = keyed_on(&mem, "a", Some(KEY));
    let bytes = content(3 * 1024 + 9);
    let d = uploaded(&a, &bytes).await;
    let stored: ChunkIndex = serde_json::from_slice(
        &mem.get(&ObjectPath::from(format!("fleet/index/sha256/{}.json", d.hex())))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(stored.mac.as_deref().is_some_and(|m| m.len() == 64), "{stored:?}");
    assert!(!stored.signed, "never stored");
    assert!(keyed_on(&mem, "b", Some(KEY)).index(&d).await.unwrap().unwrap().signed);
    assert!(!keyed_on(&mem, "c", None).index(&d).await.unwrap().unwrap().signed, "no key: read as today");
    let other = keyed_on(&mem, "d", Some("another key of thirty-two bytes!"));
    assert!(!other.index(&d).await.unwrap().unwrap().signed, "another key");
    assert_eq!(other.metrics().unsigned_indexes.get(), 1);
    assert_eq!(
        read_all(&other, d, 0, bytes.len() as u64).await.unwrap(),
        bytes,
        "still read, hashed whole by its reader"
    );

    let k = IndexKey::new(KEY.as_bytes());
    assert!(stored.verify(&k, &d));
    assert!(!stored.verify(&k, &Digest::of(b"another object")), "the signature names the digest");
    let mut changed = stored.clone();
    changed.chunks[1] = "00".repeat(32);
    assert!(!changed.verify(&k, &d), "a chunk hash");
    let mut changed = stored.clone();
    changed.size -= 1;
    assert!(!changed.verify(&k, &d), "the size");
    let mut changed = stored.clone();
    changed.upload = Some("f".repeat(32));
    assert!(!changed.verify(&k, &d), "the chunk objects");
    let mut changed = stored.clone();
    changed.media_type = Some("application/json".into());
    assert!(!changed.verify(&k, &d), "the media type");
    let mut changed = stored.clone();
    changed.uploaded_by = "someone".into();
    assert!(changed.verify(&k, &d), "who wrote it says nothing about the bytes");
    let mut changed = stored.clone();
    changed.mac = Some("zz".into());
    assert!(!changed.verify(&k, &d), "not hex");

    // A signed index copied under another digest: a chain ends in its own object's digest,
    // so it is refused unread (with or without the key); an index of format 2 is read as
    // unsigned, and its reader hashes the whole and finds it is not that object.
    let e = Digest::of(b"the object a forger wants served");
    let put_as = |index: &ChunkIndex| {
        let (mem, json) = (mem.clone(), serde_json::to_vec(index).unwrap());
        async move {
            mem.put(&ObjectPath::from(format!("fleet/index/sha256/{}.json", e.hex())), PutPayload::from(json))
                .await
                .unwrap();
        }
    };
    put_as(&stored).await;
    let b = keyed_on(&mem, "e", Some(KEY));
    let err = b.index(&e).await.unwrap_err();
    assert!(err.is_corrupt() && err.to_string().contains("chain ends in"), "{err}");
    let v2 = uploaded_v2(&a, &content(2 * 1024 + 3)).await;
    let mut stored2: ChunkIndex = serde_json::from_slice(
        &mem.get(&ObjectPath::from(format!("fleet/index/sha256/{}.json", v2.hex())))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(stored2.verify(&k, &v2) && stored2.format == 2);
    stored2.signed = false;
    put_as(&stored2).await;
    let b = keyed_on(&mem, "f", Some(KEY));
    assert!(!b.index(&e).await.unwrap().unwrap().signed);
    assert!(b.read_small(&e, 1 << 20).await.unwrap_err().is_corrupt(), "the whole read shows it");
}

/// Issue 36 (one hash pass): an upload whose chunks the fill's streamer wrote, all of them,
/// is finished without reading the committed file again (the fill hashed those bytes as it
/// spooled them; SECURITY.md); one that wrote only some of them, or chunks that do not tile
/// an object, has the file read and hashed as before.
#[tokio::test]
async fn should_finish_a_fully_streamed_upload_without_reading_the_file_again() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let bytes = content(3 * 1024 + 7);
    let d = Digest::of(&bytes);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("obj");
    // The file the fill committed; not read when every chunk streamed. (Other bytes of the
    // same length stand for "not read": were it read, its digest would refuse the upload.)
    std::fs::write(&file, content(3 * 1024 + 7).iter().map(|x| x ^ 1).collect::<Vec<u8>>()).unwrap();
    let mut u = b.begin_parts(Some("k"), Some(d), Some(bytes.len() as u64));
    for piece in bytes.chunks(1024) {
        u.put_chunk(Bytes::copy_from_slice(piece)).await.unwrap();
    }
    assert!(u.covers(bytes.len() as u64));
    let index = b.upload_resumed(&d, &file, Some("k"), Some(u)).await.unwrap();
    assert_eq!(index.chunks.len(), 4);
    assert_eq!(read_all(&bucket_on(&mem, "b"), d, 0, bytes.len() as u64).await.unwrap(), bytes);

    // Two chunks of three: the file is read, hashed, and its wrong bytes refused.
    let bytes = content(3 * 1024);
    let d = Digest::of(&bytes);
    let mut u = b.begin_parts(Some("k2"), Some(d), Some(bytes.len() as u64));
    u.put_chunk(Bytes::copy_from_slice(&bytes[..1024])).await.unwrap();
    u.put_chunk(Bytes::copy_from_slice(&bytes[1024..2048])).await.unwrap();
    assert!(!u.covers(bytes.len() as u64));
    std::fs::write(&file, bytes.iter().map(|x| x ^ 1).collect::<Vec<u8>>()).unwrap();
    let e = b.upload_resumed(&d, &file, Some("k2"), Some(u)).await.expect_err("read and refused");
    assert!(e.is_corrupt(), "{e}");

    // Chunks that do not tile the object (a short one before the last): read as before.
    let mut u = b.begin_parts(Some("k3"), Some(d), Some(bytes.len() as u64));
    u.put_chunk(Bytes::copy_from_slice(&bytes[..1000])).await.unwrap();
    u.put_chunk(Bytes::copy_from_slice(&bytes[1000..2024])).await.unwrap();
    u.put_chunk(Bytes::copy_from_slice(&bytes[2024..])).await.unwrap();
    assert!(!u.covers(bytes.len() as u64), "1000 + 1024 + 1048 bytes: not chunks of 1024");
    std::fs::write(&file, &bytes).unwrap();
    let index = b.upload_resumed(&d, &file, Some("k3"), Some(u)).await.unwrap();
    assert_eq!(read_all(&bucket_on(&mem, "c"), d, 0, bytes.len() as u64).await.unwrap(), bytes);
    assert_eq!(index.size, bytes.len() as u64);
}

/// The books remember at most `NAMES_CACHE` index entries between sweeps (4 in tests): a
/// larger bucket's other indexes are read again, and every one is still named.
#[tokio::test]
async fn should_remember_a_bounded_number_of_index_entries_between_sweeps() {
    let mem = Arc::new(InMemory::new());
    let b = bucket_on(&mem, "a");
    let mut ds = Vec::new();
    for i in 0..(books::NAMES_CACHE + 3) {
        ds.push(uploaded(&b, &content(100 + i)).await);
    }
    for _ in 0..2 {
        let (names, indexed) = b.fresh_names(true).await.unwrap();
        assert!(names.complete);
        assert_eq!(names.indexes.len(), ds.len(), "every index named");
        assert!(ds.iter().all(|d| indexed.contains(d)));
        assert!(b.names.lock().unwrap().len() <= books::NAMES_CACHE, "bounded");
    }
}

/// Issue 36 (one hash pass): an upload that knows the object's size writes its index in chain
/// form (format 3): each chunk's entry is the hash state after it, the last one the object's
/// digest, and the states inside each chunk every sub-chunk. Every range is byte-exact and
/// reads at most two pieces more than it asks; a rotten piece is refused for a range over
/// it, the rest of its chunk is served, and fsck names it.
#[tokio::test]
async fn should_read_any_range_of_a_chain_byte_exact_and_refuse_a_rotten_piece() {
    let store = Arc::new(Faulty::new(Fault::None));
    let b = sub_bucket(&store, "a");
    let bytes = content(3 * 4096 + 1500);
    let d = uploaded(&b, &bytes).await;
    let index = sub_bucket(&store, "b").index(&d).await.unwrap().unwrap();
    assert_eq!((index.format, index.sub_chunk_size), (3, Some(1024)));
    assert_eq!(index.chunks.last(), Some(&d.hex()), "the chain ends in the object's digest");
    assert_eq!(index.sub_chunks.iter().map(Vec::len).collect::<Vec<_>>(), [3, 3, 3, 1]);
    // The entries are the object's own sha256 states: resumed from chunk 1's, the rest
    // hashes to the digest.
    let mut c = crate::chain::Chain::resume(crate::chain::state_of(&index.chunks[1]).unwrap(), 8192).unwrap();
    c.update(&bytes[8192..]);
    assert_eq!(hex::encode(c.finalize()), d.hex());

    let n = bytes.len() as u64;
    let reader = sub_bucket(&store, "c");
    assert_every_range(&store, &reader, d, &index, &bytes).await;
    assert_eq!(reader.metrics().corrupt.get(), 0);
    let e = uploaded(&b, b"").await;
    let ei = reader.index(&e).await.unwrap().unwrap();
    assert_eq!((ei.format, ei.chunks.clone(), ei.sub_chunks.clone()), (3, vec![e.hex()], vec![vec![]]));
    assert_eq!(read_all(&reader, e, 0, 0).await.unwrap(), b"");
    assert!(reader.fsck(false).await.unwrap().is_clean());

    // Chunk 1, piece 2 (bytes 6144..7168 of the object) rots.
    let upload = index.upload.clone().unwrap();
    let p = ObjectPath::from(format!("parts/{upload}/00000001"));
    let mut bad = bytes[4096..8192].to_vec();
    bad[2048 + 5] ^= 1;
    store.inner.put(&p, PutPayload::from(bad)).await.unwrap();
    let (r, _) = read_counted(&store, &reader, d, &index, 6144 + 100, 6144 + 200).await;
    let err = r.unwrap_err();
    assert!(err.is_corrupt() && err.to_string().contains("pieces 2..3"), "{err}");
    for (start, end) in [(4096, 6144), (4096 + 10, 4096 + 20), (7168, 8192), (7168, 9000)] {
        let (r, _) = read_counted(&store, &reader, d, &index, start, end).await;
        assert!(r.unwrap() == bytes[start as usize..end as usize], "{start}..{end}");
    }
    let err = read_all(&reader, d, 0, n).await.unwrap_err();
    assert!(err.is_corrupt() && err.to_string().contains("chunk 1"), "{err}");
    let r = reader.fsck(false).await.unwrap();
    assert!(r.corrupt.len() == 1 && r.corrupt[0].digest == d.to_string(), "{r:?}");
}

/// A chain index from the bucket is checked like any index before it is used: piece states
/// that do not fit the chunks, a piece size that is not whole blocks dividing the chunk, a
/// state that is not hex, or a chain that does not end in the digest it is read as, are
/// refused (corrupt), never a panic.
#[tokio::test]
async fn should_refuse_a_chain_index_unlike_its_chunks() {
    let store = Arc::new(Faulty::new(Fault::None));
    let b = sub_bucket(&store, "a");
    let bytes = content(2 * 4096 + 100);
    let d = uploaded(&b, &bytes).await;
    let good = (*b.index(&d).await.unwrap().unwrap()).clone();
    good.validate_for(&d).unwrap();
    type Spoil = fn(&mut ChunkIndex);
    let cases: Vec<(&str, Spoil)> = vec![
        ("piece states for chunk 0", |i| {
            i.sub_chunks[0].pop();
        }),
        ("piece states for chunk 2", |i| i.sub_chunks[2].push("0".repeat(64))),
        ("of 3 chunks", |i| {
            i.sub_chunks.pop();
        }),
        ("piece size", |i| i.sub_chunk_size = Some(0)),
        ("piece size", |i| i.sub_chunk_size = Some(1000)),
        ("piece size", |i| i.sub_chunk_size = Some(8192)),
        ("piece size", |i| i.sub_chunk_size = None),
        ("not 64 hex", |i| i.sub_chunks[1][2] = "zz".repeat(32)),
        ("chain ends in", |i| i.chunks[2] = "ab".repeat(32)),
        ("newer than 3", |i| i.format = 4),
        ("with upload", |i| i.upload = None),
    ];
    let key = ObjectPath::from(format!("index/sha256/{}.json", d.hex()));
    for (want, spoil) in cases {
        let mut bad = good.clone();
        spoil(&mut bad);
        store.inner.put(&key, PutPayload::from(serde_json::to_vec(&bad).unwrap())).await.unwrap();
        let e = sub_bucket(&store, "b").index(&d).await.unwrap_err();
        assert!(e.is_corrupt() && e.to_string().contains(want), "{want}: {e}");
    }
    // States that are hex but wrong: the index reads; what crosses them is refused.
    let mut wrong = good.clone();
    wrong.sub_chunks[1][0] = "ab".repeat(32);
    store.inner.put(&key, PutPayload::from(serde_json::to_vec(&wrong).unwrap())).await.unwrap();
    let reader = sub_bucket(&store, "c");
    assert!(read_all(&reader, d, 4096, 4097).await.unwrap_err().is_corrupt());
    assert!(read_all(&reader, d, 0, bytes.len() as u64).await.unwrap_err().is_corrupt());
    assert!(!reader.fsck(false).await.unwrap().is_clean());
}
