#![allow(clippy::unwrap_used, reason = "tests")]

use std::fs;

use tender_oci::Digest;
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
    let mut w = store.create_spool("blob").unwrap();
    w.append(b"hello ").unwrap();
    drop(w);
    let mut w = store.resume_spool("blob").unwrap().unwrap();
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
