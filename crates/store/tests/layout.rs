#![allow(clippy::unwrap_used, reason = "tests")]

use std::fs;

use tender_oci::{Algorithm, Digest};
use tender_store::{OpenMode, Store, StoreError};

#[test]
fn should_refuse_a_second_owner_of_the_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
    let second = Store::open(dir.path(), OpenMode::Exclusive).unwrap_err();
    assert!(matches!(second, StoreError::Locked { .. }), "{second}");
    assert!(second.to_string().contains("in use by another tender"), "{second}");
    assert!(Store::is_locked(dir.path()));
}

#[test]
fn should_refuse_a_newer_format() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path(), OpenMode::Exclusive).unwrap());
    fs::write(dir.path().join("tender-data.json"), r#"{"format": 99, "createdBy": "tender 9"}"#).unwrap();
    let err = Store::open(dir.path(), OpenMode::Exclusive).unwrap_err();
    assert!(err.to_string().contains("format 99, newer than this tender"), "{err}");
}

#[test]
fn should_refuse_a_foreign_directory() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("important.txt"), "not ours").unwrap();
    let err = Store::open(dir.path(), OpenMode::Exclusive).unwrap_err();
    assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
    assert_eq!(fs::read_to_string(dir.path().join("important.txt")).unwrap(), "not ours");
}

#[test]
fn should_take_a_fresh_volume_holding_only_lost_and_found() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("lost+found")).unwrap();
    drop(Store::open(dir.path(), OpenMode::Exclusive).unwrap());
    assert!(dir.path().join("tender-data.json").is_file());
    assert!(dir.path().join("lost+found").is_dir(), "left alone");
}

#[test]
fn should_never_make_a_mismatching_object_visible() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
    let claimed = Digest::of(b"the real thing");
    let err = store.put_bytes("k", b"an impostor", &claimed).unwrap_err();
    assert!(matches!(err, StoreError::DigestMismatch { .. }));
    assert!(store.object_len(&claimed).is_none());
    assert_eq!(fs::read_dir(store.spool_dir()).unwrap().count(), 0, "the spool file is cleaned up");
}

#[test]
fn should_resume_a_spool_with_its_hash() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
    let mut w = store.create_spool("blob", Algorithm::Sha256).unwrap();
    w.append(b"hello ").unwrap();
    drop(w);
    let mut w = store.resume_spool("blob", Algorithm::Sha256).unwrap().unwrap();
    assert_eq!(w.len(), 6);
    assert!(w.matches_at(0, b"hello").unwrap());
    assert!(!w.matches_at(0, b"jello").unwrap());
    w.append(b"world").unwrap();
    let sealed = w.seal().unwrap();
    store.commit(sealed, &Digest::of(b"hello world")).unwrap();
    assert_eq!(store.read_object(&Digest::of(b"hello world")).unwrap().unwrap(), b"hello world");
}

#[test]
fn should_migrate_format_1_with_objects_known_in_no_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::write(root.join("tender-data.json"), r#"{"format":1,"createdBy":"tender 0.1.0"}"#).unwrap();
    let body = b"an object stored by format 1";
    let d = Digest::of(body);
    fs::create_dir_all(root.join("objects/sha256").join(&d.hex()[..2])).unwrap();
    fs::write(root.join("objects/sha256").join(&d.hex()[..2]).join(d.hex()), body).unwrap();
    fs::create_dir_all(root.join("spool")).unwrap();
    fs::write(root.join("spool/0123.part"), b"a format-1 fill").unwrap();
    let store = Store::open(root, OpenMode::Exclusive).unwrap();
    let format: serde_json::Value = serde_json::from_slice(&fs::read(root.join("tender-data.json")).unwrap()).unwrap();
    assert_eq!((format["format"].as_u64(), format["migratedFrom"].as_u64()), (Some(2), Some(1)), "{format}");
    assert_eq!(store.read_object(&d).unwrap().unwrap(), body, "objects stay where they are");
    assert!(store.known_upstreams(&d).unwrap().is_empty(), "known in no upstream");
    assert!(!root.join("spool/0123.part").exists(), "format-1 spool files are dropped");
    store.record_known(&d, "ghcr.io").unwrap();
    store.record_known(&d, "GHCR.io").unwrap();
    store.record_known(&d, "docker.io").unwrap();
    drop(store);
    let store = Store::open(root, OpenMode::Exclusive).unwrap();
    assert_eq!(store.known_upstreams(&d).unwrap(), ["docker.io", "ghcr.io"]);
    assert!(store.is_known_in(&d, "ghcr.io").unwrap() && !store.is_known_in(&d, "quay.io").unwrap());
    store.remove_object(&d).unwrap();
    assert!(store.known_upstreams(&d).unwrap().is_empty(), "eviction forgets where it was known");
}

/// A copy of `tests/fixtures/format-2` (a data directory as a format-2 tender wrote it before
/// sha512: objects, manifest metadata, known upstreams, a tag record, a pin).
fn format_2_fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-2");
    let mut stack = vec![from.clone()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let to = dir.path().join(e.path().strip_prefix(&from).unwrap());
            if e.file_type().unwrap().is_dir() {
                fs::create_dir_all(&to).unwrap();
                stack.push(e.path());
            } else {
                fs::copy(e.path(), to).unwrap();
            }
        }
    }
    dir
}

const FIXTURE_BLOB: &str = "sha256:2f062c5ff8a803ee237d660ac35cbfad7fd964cdea0bc76702c64504b4842f60";
const FIXTURE_MANIFEST: &str = "sha256:2e00d5c9f984b037df25a79869f4936c8dad4a4c569d138031309a978e3f3558";

#[test]
fn should_read_a_format_2_store_written_before_sha512_unchanged() {
    let dir = format_2_fixture();
    let root = dir.path();
    let format_before = fs::read(root.join("tender-data.json")).unwrap();
    let store = Store::open(root, OpenMode::Exclusive).unwrap();
    assert_eq!(fs::read(root.join("tender-data.json")).unwrap(), format_before, "no migration");
    let (blob, manifest): (Digest, Digest) = (FIXTURE_BLOB.parse().unwrap(), FIXTURE_MANIFEST.parse().unwrap());
    assert_eq!(store.read_object(&blob).unwrap().unwrap(), b"a layer written by a format-2 tender before sha512\n");
    let m = store.read_object(&manifest).unwrap().unwrap();
    assert_eq!(Digest::of(&m), manifest);
    let meta = store.meta_get(&manifest).unwrap().unwrap();
    assert_eq!((meta.media_type.as_str(), meta.size), ("application/vnd.oci.image.manifest.v1+json", m.len() as u64));
    for d in [&blob, &manifest] {
        assert_eq!(store.known_upstreams(d).unwrap(), ["ghcr.io"]);
    }
    let tag = store.tag_get("ghcr.io", "a/b", "v1").unwrap().unwrap();
    assert_eq!((tag.digest, tag.fetched_at), (manifest, 1_700_000_000));
    assert_eq!(store.pins().unwrap(), [blob]);
    assert!(store.is_pinned(&blob) && !store.is_pinned(&manifest));
    let report = store.fsck(false).unwrap();
    assert_eq!((report.checked, report.corrupt.len(), report.stray.len()), (2, 0, 0), "{report:?}");
    let mut listed: Vec<Digest> = store.list_objects().unwrap().into_iter().map(|o| o.digest).collect();
    listed.sort();
    assert_eq!(listed, [manifest, blob]);
}

#[test]
fn should_add_sha512_objects_beside_a_format_2_store() {
    let dir = format_2_fixture();
    let root = dir.path();
    let store = Store::open(root, OpenMode::Exclusive).unwrap();
    let body = b"a sha512 layer";
    let d = Algorithm::Sha512.digest(body);
    store.put_bytes("k", body, &d).unwrap();
    store.record_known(&d, "ghcr.io").unwrap();
    store.pin(&d, "prefetch").unwrap();
    drop(store);
    let store = Store::open(root, OpenMode::Exclusive).unwrap();
    assert_eq!(store.read_object(&d).unwrap().unwrap(), body);
    assert_eq!(store.pins().unwrap(), [FIXTURE_BLOB.parse().unwrap(), d]);
    assert_eq!(store.fsck(false).unwrap().checked, 3);
    assert_eq!(
        store.read_object(&FIXTURE_BLOB.parse().unwrap()).unwrap().unwrap(),
        b"a layer written by a format-2 tender before sha512\n"
    );
    let format: serde_json::Value = serde_json::from_slice(&fs::read(root.join("tender-data.json")).unwrap()).unwrap();
    assert_eq!(format["format"], 2);
}

#[test]
fn should_keep_sha512_objects_in_their_own_tree_verified_with_sha512() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
    let body = b"content addressed by sha512";
    let d = Algorithm::Sha512.digest(body);
    let path = store.put_bytes("k", body, &d).unwrap();
    let hex = d.hex();
    assert_eq!(path, dir.path().join("objects/sha512").join(&hex[..2]).join(&hex));
    assert_eq!(store.read_object(&d).unwrap().unwrap(), body);
    assert!(store.object_len(&Digest::of(body)).is_none(), "the sha256 of the same bytes names nothing");

    // The wrong bytes, and the right bytes hashed with the other algorithm, are both refused.
    let claimed = Algorithm::Sha512.digest(b"the real thing");
    let err = store.put_bytes("k2", b"an impostor", &claimed).unwrap_err();
    assert!(matches!(err, StoreError::DigestMismatch { .. }), "{err}");
    let mut w = store.create_spool("k3", Algorithm::Sha256).unwrap();
    w.append(b"the real thing").unwrap();
    let err = store.commit(w.seal().unwrap(), &claimed).unwrap_err();
    assert!(matches!(err, StoreError::DigestMismatch { .. }), "{err}");
    assert!(store.object_len(&claimed).is_none());
    assert_eq!(fs::read_dir(store.spool_dir()).unwrap().count(), 0, "spool files are cleaned up");

    // A resumed sha512 spool re-hashes with sha512.
    let mut w = store.create_spool("blob", Algorithm::Sha512).unwrap();
    w.append(b"hello ").unwrap();
    drop(w);
    let mut w = store.resume_spool("blob", Algorithm::Sha512).unwrap().unwrap();
    w.append(b"world").unwrap();
    assert_eq!(w.digest_so_far().unwrap(), Algorithm::Sha512.digest(b"hello world"));
    let want = Algorithm::Sha512.digest(b"hello world");
    store.commit(w.seal().unwrap(), &want).unwrap();
    assert_eq!(store.read_object(&want).unwrap().unwrap(), b"hello world");

    // Metadata, known upstreams and pins follow the digest's algorithm.
    let meta = tender_store::ManifestMeta { media_type: "application/vnd.oci.image.manifest.v1+json".into(), size: 1 };
    store.meta_put(&d, &meta).unwrap();
    assert_eq!(store.meta_get(&d).unwrap().unwrap(), meta);
    assert!(store.meta_get(&Digest::of(body)).unwrap().is_none());
    assert!(dir.path().join("meta/sha512").join(&hex[..2]).join(format!("{hex}.json")).is_file());
    store.record_known(&d, "ghcr.io").unwrap();
    assert!(dir.path().join("known/sha512").join(&hex[..2]).join(format!("{hex}.json")).is_file());
    store.pin(&d, "prefetch").unwrap();
    assert!(store.is_pinned(&d) && !store.is_pinned(&want));
    assert_eq!(store.pins().unwrap(), [d]);
    assert!(store.unpin(&d).unwrap());
    assert!(store.pins().unwrap().is_empty());
    store.remove_object(&d).unwrap();
    assert!(store.object_len(&d).is_none() && store.known_upstreams(&d).unwrap().is_empty());
}

#[test]
fn should_open_objects_of_each_algorithm_through_their_held_directories() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing in memory: every open goes to disk.
    let limit = tender_store::MemoryLimit { bytes: 0, ..tender_store::MemoryLimit::default() };
    let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap().with_memory(limit);
    let body = b"an object of each algorithm".to_vec();
    let (d256, d512) = (Algorithm::Sha256.digest(&body), Algorithm::Sha512.digest(&body));
    // Asked for before its tree exists: absent, and found once it is stored.
    assert!(store.open_object(&d512).unwrap().is_none());
    for d in [&d256, &d512] {
        store.put_bytes("test", &body, d).unwrap();
        let (mut file, len) = store.open_object(d).unwrap().unwrap_or_else(|| panic!("{d} stored"));
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut got).unwrap();
        assert_eq!((got, len), (body.clone(), body.len() as u64), "{d}");
        let small = store.read_small(d).unwrap().unwrap();
        assert_eq!(small.as_ref(), body.as_slice(), "{d} read whole and verified");
    }
    // Removed, then stored again: the held directory sees both.
    store.remove_object(&d256).unwrap();
    assert!(store.open_object(&d256).unwrap().is_none());
    store.put_bytes("test", &body, &d256).unwrap();
    assert!(store.open_object(&d256).unwrap().is_some());
    // An object whose bytes rotted is quarantined, not served.
    fs::write(store.object_path(&d512), b"rotten").unwrap();
    assert!(store.read_small(&d512).unwrap().is_none());
    assert!(store.open_object(&d512).unwrap().is_none());
}

#[test]
fn should_spool_large_spans_hashed_on_a_second_thread_exactly_as_in_line() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
    // Spans below, at and above the threshold, in an order that mixes both ways.
    let min = tender_store::PARALLEL_APPEND_MIN;
    let spans: Vec<Vec<u8>> =
        [min + 3, 17, min, min - 1, 3 * min + 5].iter().enumerate().map(|(i, n)| vec![i as u8 * 37 + 1; *n]).collect();
    let whole: Vec<u8> = spans.concat();
    for algorithm in [Algorithm::Sha256, Algorithm::Sha512] {
        let expected = algorithm.digest(&whole);
        let mut w = store.create_spool(&format!("parallel-{algorithm:?}"), algorithm).unwrap();
        for s in &spans {
            w.append(s).unwrap();
        }
        assert_eq!((w.len(), w.digest_so_far().unwrap()), (whole.len() as u64, expected));
        assert_eq!(fs::read(w.path()).unwrap(), whole);
        let path = store.commit(w.seal().unwrap(), &expected).unwrap();
        assert_eq!(fs::read(path).unwrap(), whole, "{algorithm:?} committed");
    }
}

/// Issue 36: a spool whose source vouches for the digest writes its bytes unhashed; the
/// vouched digest is taken only once proven, and anything unproven is hashed from the file
/// before a digest is given (so a missing proof never lets a wrong object in).
#[test]
fn should_hash_deferred_bytes_only_when_their_source_proves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
    let real = Digest::of(b"chunk one, chunk two");

    // Proven: the vouched digest is the writer's, and no byte was hashed (a vouch for other
    // bytes shows it: the digest is taken as proven, which is what the source is trusted for).
    let mut w = store.create_spool("proven", Algorithm::Sha256).unwrap();
    let vouch = tender_store::Vouch::new();
    assert!(w.defer_hashing(vouch.clone()));
    w.append(b"chunk one, ").unwrap();
    w.append(b"chunk two").unwrap();
    assert!(w.owes_hashing(), "unproven until the source ended");
    let said = Digest::of(b"what the signed index names");
    vouch.prove(said);
    assert!(!w.owes_hashing() && w.is_deferred());
    assert_eq!(w.digest_so_far().unwrap(), said, "proven: not hashed again");
    w.discard();

    // Not proven (the source broke off, or its index was not signed): hashed from the file.
    let mut w = store.create_spool("unproven", Algorithm::Sha256).unwrap();
    assert!(w.defer_hashing(tender_store::Vouch::new()));
    w.append(b"chunk one, ").unwrap();
    w.append(b"chunk two").unwrap();
    assert_eq!(w.digest_so_far().unwrap(), real, "hashed from the file");
    let job = w.catch_up().unwrap().unwrap(); // it owes its hashing
    w.caught_up(job.run().unwrap()).unwrap();
    assert!(!w.is_deferred(), "hashing as usual from here on");
    w.append(b"!").unwrap();
    assert_eq!(w.digest_so_far().unwrap(), Digest::of(b"chunk one, chunk two!"));
    let want = Digest::of(b"chunk one, chunk two!");
    store.commit(w.seal().unwrap(), &want).unwrap();

    // Sealed without catching up first: seal hashes what it owes.
    let mut w = store.create_spool("sealed", Algorithm::Sha256).unwrap();
    assert!(w.defer_hashing(tender_store::Vouch::new()));
    w.append(b"chunk one, chunk two").unwrap();
    store.commit(w.seal().unwrap(), &real).unwrap();
    assert_eq!(store.read_object(&real).unwrap().unwrap(), b"chunk one, chunk two");

    // Only from the first byte: a writer that holds bytes hashes on.
    let mut w = store.create_spool("late", Algorithm::Sha256).unwrap();
    w.append(b"x").unwrap();
    assert!(!w.defer_hashing(tender_store::Vouch::new()), "a vouch covers a whole object, not a tail");
    assert_eq!(w.digest_so_far().unwrap(), Digest::of(b"x"));
    w.discard();
}

/// Issue 36 (one hash pass): a sha256 spool notes its hash state at every MiB as it hashes,
/// whatever the spans written (small, large on the second thread, across a boundary), and
/// the states are those of the object's own sha256; a deferred spool notes none, nor a
/// sha512 one.
#[test]
fn should_note_the_hash_state_at_every_mib_as_the_spool_hashes() {
    use tender_store::STATE_STEP;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
    let content: Vec<u8> = (0..(3 << 20) + 77).map(|i: u32| (i % 249) as u8).collect();
    let mut w = store.create_spool("k", Algorithm::Sha256).unwrap();
    let states = w.chain_states();
    let mut at = 0;
    for n in [10usize, (1 << 20) - 10 + 5, 1 << 20, 4096, content.len()] {
        let end = (at + n).min(content.len());
        w.append(&content[at..end]).unwrap();
        at = end;
    }
    let got = states.at([STATE_STEP, 2 * STATE_STEP, 3 * STATE_STEP]).unwrap();
    for (k, s) in got.iter().enumerate() {
        let mut c = tender_oci::chain::Chain::new();
        c.update(&content[..(k + 1) << 20]);
        assert_eq!(Some(*s), c.state(), "the state after {} MiB", k + 1);
    }
    assert!(states.at([4 * STATE_STEP]).is_none(), "not reached");
    assert!(states.at([STATE_STEP + 1]).is_none(), "only at whole steps");
    assert!(states.at([0]).is_none());
    assert_eq!(w.seal().unwrap().digest, Digest::of(&content));

    let mut deferred = store.create_spool("d", Algorithm::Sha256).unwrap();
    assert!(deferred.defer_hashing(tender_store::Vouch::new()));
    deferred.append(&content).unwrap();
    assert!(deferred.chain_states().at([STATE_STEP]).is_none(), "nothing hashed, nothing noted");
    let mut long = store.create_spool("l", Algorithm::Sha512).unwrap();
    long.append(&content).unwrap();
    assert!(long.chain_states().at([STATE_STEP]).is_none());
}
