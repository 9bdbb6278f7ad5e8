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
