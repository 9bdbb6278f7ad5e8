//! Bundles sized for media (issue 35 (3)): a zstd-compressed tar, and a tar (compressed or not)
//! split into parts listed with their sha256 in `PATH.parts.json`. Written, listed, used as a
//! delta's base and imported as one stream; a wrong, missing or cut part is refused by its name
//! and nothing of the bundle becomes visible.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use tender_bundle::layout::{self, Descriptor, Document};
use tender_bundle::packing::{self, Compress, Packing, PartSet, MIN_PART};
use tender_bundle::{import_path, BundleWriter, ImportError, ImportOptions, Router};
use tender_oci::{media, Algorithm, Digest, ImageRef, RepoName};
use tender_store::{OpenMode, Store};

struct Ghcr;

impl Router for Ghcr {
    fn route(&self, image: &ImageRef) -> Result<(String, RepoName), String> {
        match image.registry.as_str() {
            "ghcr.io" => Ok((image.registry.clone(), image.repository.clone())),
            other => Err(format!("{other} is not an upstream")),
        }
    }
}

struct Blob {
    digest: Digest,
    bytes: Vec<u8>,
    media_type: &'static str,
}

fn blob(bytes: Vec<u8>, media_type: &'static str) -> Blob {
    Blob { digest: Algorithm::Sha256.digest(&bytes), bytes, media_type }
}

impl Blob {
    fn descriptor(&self) -> Descriptor {
        Descriptor::new(self.media_type, &self.digest, self.bytes.len() as u64)
    }
}

/// Bytes zstd cannot shrink (xorshift), so that a split bundle has several parts.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Image {
    manifest: Blob,
    config: Blob,
    layer: Blob,
}

/// An image whose layer is `layer_len` bytes of noise.
fn image(seed: u64, layer_len: usize) -> Image {
    let config = blob(
        format!("{{\"architecture\":\"amd64\",\"os\":\"linux\",\"seed\":{seed}}}").into_bytes(),
        "application/vnd.oci.image.config.v1+json",
    );
    let layer = blob(noise(seed, layer_len), "application/vnd.oci.image.layer.v1.tar+gzip");
    let doc = serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
        "config": config.descriptor(), "layers": [layer.descriptor()],
    });
    let manifest = blob(serde_json::to_vec(&doc).unwrap(), media::OCI_MANIFEST);
    Image { manifest, config, layer }
}

fn write(path: &Path, packing: Packing, images: &[(&str, &Image)], skip: HashSet<Digest>) -> Digest {
    let mut w = BundleWriter::create_packed(path, skip, packing).unwrap();
    let mut entries = Vec::new();
    for (name, img) in images {
        for b in [&img.layer, &img.config, &img.manifest] {
            w.add_bytes(&b.digest, &b.bytes).unwrap();
        }
        entries.push(img.manifest.descriptor().with(layout::REF_NAME, *name));
    }
    w.finish(&Document::index(entries, BTreeMap::new())).unwrap().index_digest.unwrap()
}

fn store(dir: &Path) -> Store {
    Store::open(dir, OpenMode::Exclusive).unwrap()
}

fn options() -> ImportOptions {
    ImportOptions { pin: true, ..ImportOptions::default() }
}

fn zstd() -> Packing {
    Packing { compress: Compress::Zstd, split: None }
}

fn split(compress: Compress) -> Packing {
    Packing { compress, split: Some(MIN_PART) }
}

fn sidecar(path: &Path, ext: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(ext);
    PathBuf::from(s)
}

fn part_set(path: &Path) -> PartSet {
    serde_json::from_slice(&fs::read(sidecar(path, ".parts.json")).unwrap()).unwrap()
}

/// Nothing of `img` is visible: no tag, nothing known in the upstream or pinned.
fn assert_invisible(s: &Store, img: &Image, tag: &str) {
    assert!(s.tag_get("ghcr.io", "a/b", tag).unwrap().is_none(), "tag registered");
    for b in [&img.manifest, &img.config, &img.layer] {
        assert!(!s.is_known_in(&b.digest, "ghcr.io").unwrap(), "{} known", b.digest);
        assert!(!s.is_pinned(&b.digest), "{} pinned", b.digest);
    }
}

fn assert_imported(s: &Store, img: &Image, tag: &str) {
    let t = s.tag_get("ghcr.io", "a/b", tag).unwrap().expect("tag registered");
    assert!(t.imported && t.digest == img.manifest.digest);
    for b in [&img.manifest, &img.config, &img.layer] {
        assert_eq!(s.read_object(&b.digest).unwrap().unwrap(), b.bytes);
        assert!(s.is_known_in(&b.digest, "ghcr.io").unwrap());
    }
}

#[test]
fn should_round_trip_a_tar_zst_and_split_part_sets() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(1, 3 << 20);
    let cases = [
        ("b.tar.zst", zstd()),
        ("b.tar", split(Compress::None)),
        ("b.tar.zst", split(Compress::Zstd)),
        ("b2.tar.zst", Packing { compress: Compress::Zstd, split: Some(64 << 20) }),
    ];
    for (i, (name, packing)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("{i}")).join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let index = write(&path, packing, &[("ghcr.io/a/b:v1", &img)], HashSet::new());
        assert!(!sidecar(&path, ".partial").exists(), "{name}: partial left behind");
        let mut imported_from = vec![path.clone()];
        if let Some(size) = packing.split {
            assert!(!path.exists(), "a part set has no file at PATH itself");
            let set = part_set(&path);
            let expected = if size == MIN_PART { 4 } else { 1 };
            assert!(set.parts.len() >= expected, "{name}: {} part(s)", set.parts.len());
            assert_eq!(set.kind, packing.compress.kind());
            assert_eq!(set.index_digest.as_deref(), Some(index.to_string().as_str()));
            for (n, p) in set.parts.iter().enumerate() {
                assert_eq!(p.name, format!("{name}.{n:03}"));
                let bytes = fs::read(path.with_file_name(&p.name)).unwrap();
                assert_eq!(bytes.len() as u64, p.size);
                assert!(p.size <= size);
                assert_eq!(Algorithm::Sha256.digest(&bytes), p.sha256);
            }
            // the manifest and the first part name the same set
            imported_from = vec![sidecar(&path, ".parts.json"), sidecar(&path, ".000"), path.clone()];
        } else {
            assert_eq!(&fs::read(&path).unwrap()[..4], &[0x28, 0xb5, 0x2f, 0xfd], "zstd magic");
            assert!(fs::metadata(&path).unwrap().len() < (3 << 20) + (1 << 20));
        }
        let l = tender_bundle::list::list(&path).unwrap();
        assert_eq!(l.index_digest, index.to_string());
        assert_eq!((l.entries.len(), l.blobs), (1, 3));
        assert_eq!(tender_bundle::blobs_of(&path).unwrap().len(), 3);
        for (j, from) in imported_from.iter().enumerate() {
            let s = store(&dir.path().join(format!("data-{i}-{j}")));
            let r = import_path(from, &s, &Ghcr, &options()).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
            assert_eq!(r.index_digest, index.to_string());
            assert_eq!(r.new_blobs, 3);
            assert_imported(&s, &img, "v1");
        }
    }
}

#[test]
fn should_refuse_a_split_size_below_the_minimum() {
    let dir = tempfile::tempdir().unwrap();
    let packing = Packing { compress: Compress::None, split: Some(MIN_PART - 1) };
    let e = BundleWriter::create_packed(&dir.path().join("b.tar"), HashSet::new(), packing).err().unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
}

/// One import of a damaged part set: refused, naming `part`, nothing visible.
fn assert_refused_naming(path: &Path, store_dir: &Path, img: &Image, part: &str, what: &str) {
    let s = store(store_dir);
    let e = import_path(path, &s, &Ghcr, &options()).unwrap_err();
    assert!(matches!(e, ImportError::Refused(_)), "{what}: {e}");
    let text = e.to_string();
    assert!(text.contains(&format!("part {part}")), "{what}: {text}");
    assert_invisible(&s, img, "v1");
}

#[test]
fn should_refuse_a_corrupted_part_by_name_and_register_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(2, 3 << 20);
    for compress in [Compress::None, Compress::Zstd] {
        for (n, at) in [(1usize, 1000usize), (2, 500_000)] {
            let path = dir.path().join(format!("{compress:?}-{n}")).join("r.tar");
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            write(&path, split(compress), &[("ghcr.io/a/b:v1", &img)], HashSet::new());
            let part = format!("r.tar.{n:03}");
            let part_path = path.with_file_name(&part);
            let mut bytes = fs::read(&part_path).unwrap();
            bytes[at] ^= 0x40;
            fs::write(&part_path, bytes).unwrap();
            let what = format!("{compress:?}, byte {at} of {part}");
            assert_refused_naming(&path, &dir.path().join(format!("data-{compress:?}-{n}")), &img, &part, &what);
            let e = import_path(&path, &store(&dir.path().join("again")), &Ghcr, &options()).unwrap_err().to_string();
            assert!(e.contains("sha256 mismatch"), "{what}: {e}");
        }
    }
}

/// The last part holds the tar's end: a change there that no blob digest sees is still
/// refused, before anything is registered.
#[test]
fn should_refuse_a_changed_last_part_before_registering() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(3, 3 << 20);
    let path = dir.path().join("r.tar");
    write(&path, split(Compress::None), &[("ghcr.io/a/b:v1", &img)], HashSet::new());
    let set = part_set(&path);
    let last = set.parts.last().unwrap();
    let last_path = path.with_file_name(&last.name);
    let mut bytes = fs::read(&last_path).unwrap();
    let end = bytes.len() - 1;
    bytes[end] ^= 0x01; // the tar's zero end blocks
    fs::write(&last_path, bytes).unwrap();
    assert_refused_naming(&path, &dir.path().join("data"), &img, &last.name, "the end of the last part");
}

#[test]
fn should_refuse_a_missing_or_cut_part_before_reading_any() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(4, 3 << 20);
    for compress in [Compress::None, Compress::Zstd] {
        let base = dir.path().join(format!("{compress:?}"));
        fs::create_dir_all(&base).unwrap();
        let path = base.join("r.tar");
        write(&path, split(compress), &[("ghcr.io/a/b:v1", &img)], HashSet::new());
        let set = part_set(&path);
        let last = set.parts.last().unwrap().name.clone();

        // the last part cut short
        let last_path = path.with_file_name(&last);
        let bytes = fs::read(&last_path).unwrap();
        fs::write(&last_path, &bytes[..bytes.len() / 2]).unwrap();
        let s = store(&base.join("data-cut"));
        let e = import_path(&path, &s, &Ghcr, &options()).unwrap_err().to_string();
        assert!(e.contains(&format!("part {last}")) && e.contains("bytes"), "{e}");
        assert!(s.object_len(&img.layer.digest).is_none(), "read before the parts were checked");
        assert_invisible(&s, &img, "v1");
        fs::write(&last_path, &bytes).unwrap();

        // a part missing
        let second = path.with_file_name("r.tar.001");
        fs::remove_file(&second).unwrap();
        let s = store(&base.join("data-missing"));
        let e = import_path(&path, &s, &Ghcr, &options()).unwrap_err().to_string();
        assert!(e.contains("part r.tar.001 is missing"), "{e}");
        assert!(s.object_len(&img.layer.digest).is_none(), "read before the parts were checked");
        assert_invisible(&s, &img, "v1");
        assert!(tender_bundle::list::list(&path).unwrap_err().to_string().contains("r.tar.001"));
    }
}

#[test]
fn should_refuse_a_part_name_outside_the_set_directory() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(5, 1 << 20);
    let path = dir.path().join("r.tar");
    write(&path, split(Compress::None), &[("ghcr.io/a/b:v1", &img)], HashSet::new());
    let manifest = sidecar(&path, ".parts.json");
    let text = fs::read_to_string(&manifest).unwrap().replace("\"r.tar.000\"", "\"../r.tar.000\"");
    fs::write(&manifest, text).unwrap();
    let e = packing::open(&manifest).err().unwrap().to_string();
    assert!(e.contains("../r.tar.000"), "{e}");
}

#[test]
fn should_make_a_delta_against_a_split_compressed_base() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (image(6, 2 << 20), image(7, 1 << 20));
    let base = dir.path().join("base.tar.zst");
    write(&base, split(Compress::Zstd), &[("ghcr.io/a/b:v1", &one)], HashSet::new());
    let skip = tender_bundle::blobs_of(&base).unwrap();
    assert_eq!(skip.len(), 3);
    let delta = dir.path().join("delta.tar.zst");
    write(&delta, zstd(), &[("ghcr.io/a/b:v1", &one), ("ghcr.io/a/b:v2", &two)], skip);
    assert_eq!(tender_bundle::blobs_of(&delta).unwrap().len(), 3, "only the new image's blobs");
    let s = store(&dir.path().join("data"));
    import_path(&sidecar(&base, ".parts.json"), &s, &Ghcr, &options()).unwrap();
    import_path(&delta, &s, &Ghcr, &options()).unwrap();
    assert_imported(&s, &one, "v1");
    assert_imported(&s, &two, "v2");
}

/// What `import --server` sends: the plain tar, the same bytes as an uncompressed export, and
/// the last bytes only once every part verified.
#[test]
fn should_read_a_part_set_as_the_plain_tar() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(8, 2 << 20);
    let plain = dir.path().join("plain.tar");
    write(&plain, Packing::default(), &[("ghcr.io/a/b:v1", &img)], HashSet::new());
    let packed = dir.path().join("packed.tar.zst");
    write(&packed, split(Compress::Zstd), &[("ghcr.io/a/b:v1", &img)], HashSet::new());
    // the same content; the index differs only if a creation time were written (none here)
    let opened = packing::open(&packed).unwrap();
    assert_eq!(opened.base(), packed.as_path());
    let mut out = Vec::new();
    let mut reader = opened.tar_reader(None).unwrap();
    std::io::copy(&mut reader, &mut out).unwrap();
    assert_eq!(out, fs::read(&plain).unwrap());

    // a changed last part: the reader fails before it hands out the tar's end
    let set = part_set(&packed);
    let last = packed.with_file_name(&set.parts.last().unwrap().name);
    let mut bytes = fs::read(&last).unwrap();
    let end = bytes.len() - 1;
    bytes[end] ^= 0x01;
    fs::write(&last, bytes).unwrap();
    let mut out = Vec::new();
    let e = std::io::copy(&mut packing::open(&packed).unwrap().tar_reader(None).unwrap(), &mut out).unwrap_err();
    assert!(e.to_string().contains(&set.parts.last().unwrap().name), "{e}");
    let plain_bytes = fs::read(&plain).unwrap();
    assert!(out.len() + 1024 <= plain_bytes.len(), "{} of {} bytes handed out", out.len(), plain_bytes.len());
}
