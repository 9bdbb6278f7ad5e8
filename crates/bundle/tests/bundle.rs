//! Bundles written with `BundleWriter` and imported into a store: what becomes visible, and that
//! nothing does when a bundle is wrong.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tender_bundle::layout::{self, Descriptor, Document};
use tender_bundle::{import_path, BundleWriter, ImportError, ImportOptions, Router};
use tender_oci::{media, Algorithm, Digest, ImageRef, RepoName};
use tender_store::{OpenMode, Store};

/// Routes `ghcr.io` and `docker.io` (as the upstreams of those names); anything else has none.
struct TwoUpstreams;

impl Router for TwoUpstreams {
    fn route(&self, image: &ImageRef) -> Result<(String, RepoName), String> {
        match image.registry.as_str() {
            "ghcr.io" | "docker.io" => Ok((image.registry.clone(), image.repository.clone())),
            other => Err(format!("{other} is not an upstream")),
        }
    }
}

struct Blob {
    digest: Digest,
    bytes: Vec<u8>,
    media_type: &'static str,
}

fn blob(bytes: &[u8], media_type: &'static str) -> Blob {
    Blob { digest: Algorithm::Sha256.digest(bytes), bytes: bytes.to_vec(), media_type }
}

impl Blob {
    fn descriptor(&self) -> Descriptor {
        Descriptor::new(self.media_type, &self.digest, self.bytes.len() as u64)
    }
}

/// A two-platform image: an index, the amd64 manifest, its config and layer; the arm64
/// manifest exists only as the index's second entry (not exported).
struct Image {
    index: Blob,
    manifest: Blob,
    config: Blob,
    layer: Blob,
}

fn image(seed: &str) -> Image {
    image_with_layer(seed, format!("layer bytes of {seed}").repeat(1000).as_bytes())
}

fn image_with_layer(seed: &str, layer: &[u8]) -> Image {
    let config = blob(
        format!("{{\"architecture\":\"amd64\",\"os\":\"linux\",\"seed\":\"{seed}\"}}").as_bytes(),
        "application/vnd.oci.image.config.v1+json",
    );
    let layer = blob(layer, "application/vnd.oci.image.layer.v1.tar+gzip");
    let manifest_doc = serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
        "config": config.descriptor(), "layers": [layer.descriptor()],
    });
    let manifest = blob(&serde_json::to_vec(&manifest_doc).unwrap(), media::OCI_MANIFEST);
    let other = Algorithm::Sha256.digest(format!("arm64 of {seed}").as_bytes());
    let index_doc = serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_INDEX,
        "manifests": [
            {"mediaType": media::OCI_MANIFEST, "digest": manifest.digest.to_string(), "size": manifest.bytes.len(), "platform": {"os": "linux", "architecture": "amd64"}},
            {"mediaType": media::OCI_MANIFEST, "digest": other.to_string(), "size": 500, "platform": {"os": "linux", "architecture": "arm64"}},
        ],
    });
    let index = blob(&serde_json::to_vec(&index_doc).unwrap(), media::OCI_INDEX);
    Image { index, manifest, config, layer }
}

fn write_bundle(path: &Path, images: &[(&str, &Image)], skip: HashSet<Digest>, since: Option<&str>) -> Digest {
    let mut w = BundleWriter::create(path, skip).unwrap();
    let mut entries = Vec::new();
    for (name, img) in images {
        for b in [&img.layer, &img.config, &img.manifest, &img.index] {
            w.add_bytes(&b.digest, &b.bytes).unwrap();
        }
        entries.push(img.index.descriptor().with(layout::REF_NAME, *name));
    }
    let mut annotations = BTreeMap::new();
    if let Some(s) = since {
        annotations.insert(layout::SINCE.to_string(), s.to_string());
    }
    w.finish(&Document::index(entries, annotations)).unwrap().index_digest.unwrap()
}

fn store(dir: &Path) -> Store {
    Store::open(dir, OpenMode::Exclusive).unwrap()
}

fn options() -> ImportOptions {
    ImportOptions { pin: true, ..ImportOptions::default() }
}

/// Nothing of `img` is visible as `ghcr.io/a/b:<tag>`: no tag, no known record, no pin.
fn assert_invisible(store: &Store, img: &Image, tag: &str) {
    assert!(store.tag_get("ghcr.io", "a/b", tag).unwrap().is_none(), "tag registered");
    for b in [&img.index, &img.manifest, &img.config, &img.layer] {
        assert!(!store.is_known_in(&b.digest, "ghcr.io").unwrap(), "{} known", b.digest);
        assert!(!store.is_pinned(&b.digest), "{} pinned", b.digest);
    }
}

#[test]
fn should_import_a_bundle_as_authoritative_tags_known_in_their_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("one");
    for name in ["bundle", "bundle.tar"] {
        let path = dir.path().join(name);
        let index_digest = write_bundle(&path, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
        let s = store(&dir.path().join(format!("data-{name}")));
        let report = import_path(&path, &s, &TwoUpstreams, &options()).unwrap();
        assert_eq!(report.index_digest, index_digest.to_string());
        assert_eq!((report.blobs, report.new_blobs), (4, 4));
        assert_eq!(report.images.len(), 1);
        assert_eq!(report.images[0].name, "ghcr.io/a/b:v1");
        let tag = s.tag_get("ghcr.io", "a/b", "v1").unwrap().unwrap();
        assert!(tag.imported && tag.digest == img.index.digest && tag.media_type == media::OCI_INDEX);
        for b in [&img.index, &img.manifest, &img.config, &img.layer] {
            assert!(s.is_known_in(&b.digest, "ghcr.io").unwrap());
            assert!(s.is_pinned(&b.digest));
            assert_eq!(s.read_object(&b.digest).unwrap().unwrap(), b.bytes);
        }
        assert_eq!(s.meta_get(&img.manifest.digest).unwrap().unwrap().media_type, media::OCI_MANIFEST);
        // Importing again changes nothing and stores nothing new.
        let again = import_path(&path, &s, &TwoUpstreams, &options()).unwrap();
        assert_eq!(again.new_blobs, 0);
    }
}

#[test]
fn should_refuse_a_flipped_byte_and_register_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("flip");
    let path = dir.path().join("bundle");
    write_bundle(&path, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
    let layer_path = path.join(layout::blob_path(&img.layer.digest));
    let mut bytes = fs::read(&layer_path).unwrap();
    bytes[100] ^= 0x01;
    fs::write(&layer_path, bytes).unwrap();
    let s = store(&dir.path().join("data"));
    let e = import_path(&path, &s, &TwoUpstreams, &options()).unwrap_err();
    assert!(matches!(e, ImportError::Refused(_)), "{e}");
    assert!(e.to_string().contains(&img.layer.digest.hex()), "{e}");
    assert_invisible(&s, &img, "v1");
    assert!(s.object_len(&img.layer.digest).is_none(), "the wrong bytes were stored");
}

#[test]
fn should_refuse_a_truncated_tar_and_register_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("cut");
    let path = dir.path().join("bundle.tar");
    write_bundle(&path, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
    let bytes = fs::read(&path).unwrap();
    for cut in [bytes.len() / 3, bytes.len() / 2, bytes.len() - 2048] {
        let cut_path = dir.path().join(format!("cut-{cut}.tar"));
        fs::write(&cut_path, &bytes[..cut]).unwrap();
        let s = store(&dir.path().join(format!("data-{cut}")));
        let e = import_path(&cut_path, &s, &TwoUpstreams, &options()).unwrap_err();
        assert!(matches!(e, ImportError::Refused(_)), "cut at {cut}: {e}");
        assert_invisible(&s, &img, "v1");
    }
}

#[test]
fn should_import_only_the_bundle_whose_index_digest_was_expected() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("expected");
    let path = dir.path().join("bundle.tar");
    let index_digest = write_bundle(&path, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
    let s = store(&dir.path().join("data"));
    let other = Algorithm::Sha256.digest(b"another bundle's index");
    let wrong = ImportOptions { expect_index: Some(other), ..options() };
    let e = import_path(&path, &s, &TwoUpstreams, &wrong).unwrap_err().to_string();
    assert!(e.contains(&index_digest.to_string()) && e.contains(&other.to_string()), "{e}");
    assert_invisible(&s, &img, "v1");
    let right = ImportOptions { expect_index: Some(index_digest), ..options() };
    import_path(&path, &s, &TwoUpstreams, &right).unwrap();
    assert!(s.tag_get("ghcr.io", "a/b", "v1").unwrap().is_some());
}

#[test]
fn should_refuse_a_dangling_reference() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("dangling");
    let path = dir.path().join("bundle");
    let mut w = BundleWriter::create(&path, HashSet::new()).unwrap();
    for b in [&img.config, &img.manifest, &img.index] {
        w.add_bytes(&b.digest, &b.bytes).unwrap();
    }
    w.finish(&Document::index(vec![img.index.descriptor().with(layout::REF_NAME, "ghcr.io/a/b:v1")], BTreeMap::new()))
        .unwrap();
    let s = store(&dir.path().join("data"));
    let e = import_path(&path, &s, &TwoUpstreams, &options()).unwrap_err().to_string();
    assert!(e.contains("not in the bundle") && e.contains(&img.layer.digest.to_string()), "{e}");
    assert_invisible(&s, &img, "v1");
}

#[test]
fn should_import_a_delta_only_on_top_of_its_base() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (image("base"), image("next"));
    let base = dir.path().join("base.tar");
    let base_digest = write_bundle(&base, &[("ghcr.io/a/b:v1", &one)], HashSet::new(), None);
    let skip = tender_bundle::blobs_of(&base).unwrap();
    assert_eq!(skip.len(), 4);
    let delta = dir.path().join("delta.tar");
    write_bundle(&delta, &[("ghcr.io/a/b:v1", &one), ("ghcr.io/a/b:v2", &two)], skip, Some(&base_digest.to_string()));
    assert_eq!(tender_bundle::blobs_of(&delta).unwrap().len(), 4, "only the new image's blobs");

    let fresh = store(&dir.path().join("fresh"));
    let e = import_path(&delta, &fresh, &TwoUpstreams, &options()).unwrap_err().to_string();
    assert!(e.contains("not in the bundle"), "a delta alone: {e}");
    assert!(e.contains(&format!("a delta on the bundle with index {base_digest}: import that one first")), "{e}");
    assert_invisible(&fresh, &two, "v2");

    let s = store(&dir.path().join("data"));
    import_path(&base, &s, &TwoUpstreams, &options()).unwrap();
    let report = import_path(&delta, &s, &TwoUpstreams, &options()).unwrap();
    assert_eq!(report.delta_of.as_deref(), Some(base_digest.to_string().as_str()));
    assert_eq!(report.new_blobs, 4);
    assert_eq!(s.tag_get("ghcr.io", "a/b", "v2").unwrap().unwrap().digest, two.index.digest);
    assert_eq!(s.tag_get("ghcr.io", "a/b", "v1").unwrap().unwrap().digest, one.index.digest);
}

#[test]
fn should_name_entries_from_bare_tags_only_with_a_registry_and_refuse_unrouted_names() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("names");
    let path = dir.path().join("bundle");
    write_bundle(&path, &[("v3", &img)], HashSet::new(), None);
    let s = store(&dir.path().join("data"));
    let e = import_path(&path, &s, &TwoUpstreams, &options()).unwrap_err().to_string();
    assert!(e.contains("--registry"), "{e}");
    let with = ImportOptions { registry: Some("ghcr.io/a/b".into()), ..options() };
    import_path(&path, &s, &TwoUpstreams, &with).unwrap();
    assert!(s.tag_get("ghcr.io", "a/b", "v3").unwrap().unwrap().imported);

    let other = image("unrouted");
    let path = dir.path().join("unrouted");
    write_bundle(&path, &[("quay.io/a/b:v1", &other)], HashSet::new(), None);
    let e = import_path(&path, &s, &TwoUpstreams, &options()).unwrap_err().to_string();
    assert!(e.contains("quay.io is not an upstream"), "{e}");
}

fn asset_bundle(path: &Path, asset: &[u8]) -> Digest {
    let layer = blob(asset, layout::ASSET_LAYER_MEDIA);
    let empty = blob(layout::EMPTY_JSON, layout::EMPTY_MEDIA);
    let factory_path = format!("/image/{}/v1.12.0/nocloud-amd64.raw.xz", "a".repeat(64));
    let doc = serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST, "artifactType": layout::OS_IMAGE_ARTIFACT,
        "config": empty.descriptor(), "layers": [layer.descriptor()],
        "annotations": {layout::FACTORY_PATH: factory_path, layout::TRUST_SHA256: layer.digest.to_string()},
    });
    let manifest = blob(&serde_json::to_vec(&doc).unwrap(), media::OCI_MANIFEST);
    let mut w = BundleWriter::create(path, HashSet::new()).unwrap();
    for b in [&layer, &empty, &manifest] {
        w.add_bytes(&b.digest, &b.bytes).unwrap();
    }
    let entry = manifest.descriptor().with(layout::FACTORY_PATH, factory_path);
    w.finish(&Document::index(vec![entry], BTreeMap::new())).unwrap();
    layer.digest
}

#[test]
fn should_register_an_os_image_trust_record_and_refuse_a_contradicting_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(&dir.path().join("data"));
    let digest = asset_bundle(&dir.path().join("a1"), b"disk image one");
    let report = import_path(&dir.path().join("a1"), &s, &TwoUpstreams, &options()).unwrap();
    assert_eq!(report.assets.len(), 1);
    let key = format!("image:{}/v1.12.0/nocloud-amd64.raw.xz", "a".repeat(64));
    assert_eq!(s.trust_get(&key).unwrap().unwrap().digest, digest);
    assert!(s.is_pinned(&digest));

    asset_bundle(&dir.path().join("a2"), b"disk image two");
    let e = import_path(&dir.path().join("a2"), &s, &TwoUpstreams, &options()).unwrap_err().to_string();
    assert!(e.contains("trusts") && e.contains("--reset"), "{e}");
    assert_eq!(s.trust_get(&key).unwrap().unwrap().digest, digest, "the first trust record stands");
}

#[test]
fn should_list_names_platforms_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("ls");
    let path = dir.path().join("bundle.tar");
    write_bundle(&path, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
    asset_bundle(&dir.path().join("asset"), b"an os image");
    let l = tender_bundle::list::list(&path).unwrap();
    assert_eq!(l.entries.len(), 1);
    let e = &l.entries[0];
    assert_eq!((e.name.as_str(), e.kind.as_str()), ("ghcr.io/a/b:v1", "index"));
    assert_eq!(e.platforms, ["linux/amd64"]);
    assert_eq!(e.absent, 1, "the arm64 manifest is not in the bundle");
    let total: u64 = [&img.index, &img.manifest, &img.config, &img.layer].iter().map(|b| b.bytes.len() as u64).sum();
    assert_eq!(e.bytes, total);
    let a = tender_bundle::list::list(&dir.path().join("asset")).unwrap();
    assert_eq!(a.entries[0].kind, "os-image");
    assert!(a.entries[0].name.starts_with("/image/"));
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 48, ..Default::default() })]

    /// Hostile bytes: a tar bundle with bytes changed anywhere or cut anywhere never panics the
    /// importer; it either refuses (nothing visible) or, when the change missed everything that
    /// matters (tar padding), imports exactly the original content.
    #[test]
    fn should_refuse_or_import_exactly_whatever_bytes_a_tar_holds(
        edits in proptest::collection::vec((0usize..1 << 20, 1u8..=255), 0..4),
        cut in proptest::option::of(0usize..1 << 20),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let img = image("prop");
        let path = dir.path().join("b.tar");
        write_bundle(&path, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
        let mut bytes = fs::read(&path).unwrap();
        for (at, x) in &edits {
            let i = at % bytes.len();
            bytes[i] ^= x;
        }
        if let Some(c) = cut {
            bytes.truncate(c % (bytes.len() + 1));
        }
        fs::write(&path, &bytes).unwrap();
        let s = store(&dir.path().join("data"));
        match import_path(&path, &s, &TwoUpstreams, &options()) {
            Ok(report) => {
                // What was registered is what the (possibly edited) index names, and whole.
                for i in &report.images {
                    let d: Digest = i.digest.parse().unwrap();
                    let bytes = s.read_object(&d).unwrap().unwrap();
                    proptest::prop_assert_eq!(Algorithm::Sha256.digest(&bytes), d);
                    let name = ImageRef::parse(&i.name).unwrap();
                    if let tender_oci::Reference::Tag(t) = &name.reference {
                        let tag = s.tag_get("ghcr.io", name.repository.as_str(), t.as_str()).unwrap();
                        proptest::prop_assert!(tag.is_some_and(|r| r.digest == d && r.imported));
                    }
                }
                for b in [&img.layer, &img.config] {
                    if s.is_known_in(&b.digest, "ghcr.io").unwrap() {
                        proptest::prop_assert_eq!(s.read_object(&b.digest).unwrap().unwrap(), b.bytes.clone());
                    }
                }
            }
            Err(_) => {
                proptest::prop_assert!(s.tag_get("ghcr.io", "a/b", "v1").unwrap().is_none());
                for b in [&img.index, &img.manifest, &img.config, &img.layer] {
                    proptest::prop_assert!(!s.is_known_in(&b.digest, "ghcr.io").unwrap());
                    proptest::prop_assert!(!s.is_pinned(&b.digest));
                }
            }
        }
    }
}

/// A bundle of `entries` that carries only `blobs`.
fn hostile_bundle(path: &Path, blobs: &[&Blob], entries: Vec<Descriptor>) {
    let mut w = BundleWriter::create(path, HashSet::new()).unwrap();
    for b in blobs {
        w.add_bytes(&b.digest, &b.bytes).unwrap();
    }
    w.finish(&Document::index(entries, BTreeMap::new())).unwrap();
}

/// Issue 32 (1): registering never adds an upstream to bytes that did not arrive in the
/// bundle. With an image imported into docker.io (a private upstream's stand-in), bundles that
/// name its index, its manifest (from an index they carry), its layer (from a manifest they
/// carry) or its layer as an OS image, under ghcr.io, are refused, grant nothing, and read
/// exactly as they would if the store did not hold those objects.
#[test]
fn should_never_grant_bytes_the_bundle_does_not_carry() {
    let dir = tempfile::tempdir().unwrap();
    let private = image("private");
    let s = store(&dir.path().join("data"));
    write_bundle(&dir.path().join("base"), &[("docker.io/team/app:v1", &private)], HashSet::new(), None);
    import_path(&dir.path().join("base"), &s, &TwoUpstreams, &options()).unwrap();
    let empty = store(&dir.path().join("empty"));

    // a manifest that names the private layer, and an index that names the private manifest
    let own_config = blob(b"{\"architecture\":\"amd64\",\"os\":\"linux\"}", "application/vnd.oci.image.config.v1+json");
    let thief_doc = serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
        "config": own_config.descriptor(), "layers": [private.layer.descriptor()],
    });
    let thief_manifest = blob(&serde_json::to_vec(&thief_doc).unwrap(), media::OCI_MANIFEST);
    let thief_index_doc = serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": [private.manifest.descriptor()],
    });
    let thief_index = blob(&serde_json::to_vec(&thief_index_doc).unwrap(), media::OCI_INDEX);
    let factory_path = format!("/image/{}/v1.12.0/metal-amd64.raw.xz", "b".repeat(64));
    let empty_json = blob(layout::EMPTY_JSON, layout::EMPTY_MEDIA);
    let mut layer_as_asset = private.layer.descriptor();
    layer_as_asset.media_type = layout::ASSET_LAYER_MEDIA.to_string();
    let asset_doc = serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST, "artifactType": layout::OS_IMAGE_ARTIFACT,
        "config": empty_json.descriptor(), "layers": [layer_as_asset],
    });
    let asset_manifest = blob(&serde_json::to_vec(&asset_doc).unwrap(), media::OCI_MANIFEST);

    let name = |d: Descriptor| d.with(layout::REF_NAME, "ghcr.io/stolen/app:v1");
    let cases: Vec<(&str, Vec<&Blob>, Descriptor)> = vec![
        ("the index", vec![], name(private.index.descriptor())),
        ("the manifest", vec![], name(private.manifest.descriptor())),
        ("a manifest from a carried index", vec![&thief_index], name(thief_index.descriptor())),
        ("the layer from a carried manifest", vec![&thief_manifest, &own_config], name(thief_manifest.descriptor())),
        (
            "the layer as an OS image",
            vec![&asset_manifest, &empty_json],
            asset_manifest.descriptor().with(layout::FACTORY_PATH, &factory_path),
        ),
    ];
    for (i, (what, blobs, entry)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("hostile-{i}"));
        hostile_bundle(&path, &blobs, vec![entry]);
        let holding = import_path(&path, &s, &TwoUpstreams, &options()).unwrap_err().to_string();
        let not_holding = import_path(&path, &empty, &TwoUpstreams, &options()).unwrap_err().to_string();
        assert!(holding.contains("not in the bundle"), "{what}: {holding}");
        assert_eq!(holding, not_holding, "{what}: the refusal tells what this store holds");
        for b in [&private.index, &private.manifest, &private.config, &private.layer] {
            assert!(!s.is_known_in(&b.digest, "ghcr.io").unwrap(), "{what}: {} granted to ghcr.io", b.digest);
        }
        assert!(s.tag_get("ghcr.io", "stolen/app", "v1").unwrap().is_none(), "{what}: tag registered");
        let key = format!("image:{}/v1.12.0/metal-amd64.raw.xz", "b".repeat(64));
        assert!(s.trust_get(&key).unwrap().is_none(), "{what}: trust record registered");
    }
    // the same names under the upstream the objects are known in: a delta, accepted
    let path = dir.path().join("same-upstream");
    hostile_bundle(&path, &[], vec![private.index.descriptor().with(layout::REF_NAME, "docker.io/team/app:v2")]);
    import_path(&path, &s, &TwoUpstreams, &options()).unwrap();
    assert_eq!(s.tag_get("docker.io", "team/app", "v2").unwrap().unwrap().digest, private.index.digest);
}

/// Issue 32 (6): a directory bundle's blob that is a symbolic link is refused, not read: named
/// by the digest of a file outside the bundle (here one this test wrote; in the review,
/// /etc/shadow), it "verified" and imported, a hash oracle for local files and a way to copy
/// them into the store. Nothing is stored or registered.
#[test]
fn should_refuse_a_symlinked_blob_whose_target_matches_its_digest() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    let bytes = b"root:$6$not-for-the-bundle:19000:0:99999:7:::\n".repeat(20);
    fs::write(&secret, &bytes).unwrap();
    let img = image_with_layer("symlink", &bytes);
    assert_eq!(img.layer.digest, Algorithm::Sha256.digest(&fs::read(&secret).unwrap()));
    let path = dir.path().join("bundle");
    write_bundle(&path, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
    let layer_path = path.join(layout::blob_path(&img.layer.digest));
    fs::remove_file(&layer_path).unwrap();
    symlink(&secret, &layer_path).unwrap();
    let s = store(&dir.path().join("data"));
    let e = import_path(&path, &s, &TwoUpstreams, &options()).expect_err("a symlinked blob imported");
    assert!(matches!(e, ImportError::Refused(_)), "{e}");
    let e = e.to_string();
    assert!(e.contains(&layout::blob_path(&img.layer.digest)) && e.contains("not a regular file"), "{e}");
    assert_invisible(&s, &img, "v1");
    assert!(s.object_len(&img.layer.digest).is_none(), "the symlink's target was copied into the store");
}

/// Run an import of `path` on another thread; `None` if it did not end within `limit` (then
/// `unblock` is called so the thread can end, and the test fails rather than hangs).
fn import_within(
    path: &Path,
    s: &Store,
    limit: Duration,
    unblock: impl FnOnce(),
) -> Option<(Result<tender_bundle::ImportReport, ImportError>, Duration)> {
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        let started = Instant::now();
        scope.spawn(move || {
            let _ = tx.send(import_path(path, s, &TwoUpstreams, &options()));
        });
        match rx.recv_timeout(limit) {
            Ok(result) => Some((result, started.elapsed())),
            Err(_) => {
                unblock();
                None
            }
        }
    })
}

/// Issue 32 (6): a FIFO named as a blob hung the import forever (opened for reading, waiting on
/// a writer). It is refused at once, as not a regular file, and nothing is registered.
#[test]
fn should_refuse_a_fifo_named_as_a_blob_without_waiting_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("fifo");
    let path = dir.path().join("bundle");
    write_bundle(&path, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
    let layer_path = path.join(layout::blob_path(&img.layer.digest));
    fs::remove_file(&layer_path).unwrap();
    rustix::fs::mkfifoat(rustix::fs::CWD, &layer_path, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
    let s = store(&dir.path().join("data"));
    // A writer that opens and closes lets a reader blocked in open(2) go on (to EOF).
    let unblock = || {
        use std::os::unix::fs::OpenOptionsExt;
        let nonblock = rustix::fs::OFlags::NONBLOCK.bits() as i32;
        let _ = fs::OpenOptions::new().write(true).custom_flags(nonblock).open(&layer_path);
    };
    // A second in practice; 5 allow for a loaded CI machine.
    let limit = Duration::from_secs(5);
    let Some((result, took)) = import_within(&path, &s, limit, unblock) else {
        panic!("the import of a bundle with a FIFO as a blob was still waiting after {limit:?}");
    };
    eprintln!("refused in {took:?}");
    let e = result.expect_err("a FIFO imported");
    let e = e.to_string();
    assert!(e.contains(&layout::blob_path(&img.layer.digest)) && e.contains("not a regular file"), "{e}");
    assert_invisible(&s, &img, "v1");
}

/// Issue 32 (6): `index.json`, `oci-layout`, `blobs` and `blobs/sha256` are read only as what
/// they are, never through a symbolic link (each case points at an exact copy outside the
/// bundle, which imported before).
#[test]
fn should_refuse_symlinks_in_place_of_the_layout_files_and_directories() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("linked");
    for (i, member) in ["index.json", "oci-layout", "blobs", "blobs/sha256"].into_iter().enumerate() {
        let path = dir.path().join(format!("bundle-{i}"));
        write_bundle(&path, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
        let elsewhere = dir.path().join(format!("elsewhere-{i}"));
        fs::create_dir(&elsewhere).unwrap();
        let moved = elsewhere.join("moved");
        fs::rename(path.join(member), &moved).unwrap();
        symlink(&moved, path.join(member)).unwrap();
        let s = store(&dir.path().join(format!("data-{i}")));
        let e = import_path(&path, &s, &TwoUpstreams, &options()).expect_err(member);
        assert!(matches!(e, ImportError::Refused(_)), "{member}: {e}");
        let e = e.to_string();
        assert!(e.contains(member) && e.contains("symbolic link"), "{member}: {e}");
        assert_invisible(&s, &img, "v1");
    }
}

/// The members of a directory bundle as a tar, with `special` (a member name and a header of
/// another type) in place of that member.
fn tar_with(dir: &Path, out: &Path, special: (&str, tar::Header)) {
    let mut b = tar::Builder::new(fs::File::create(out).unwrap());
    let mut members = vec![layout::LAYOUT_FILE.to_string(), layout::INDEX_FILE.to_string()];
    for alg in fs::read_dir(dir.join("blobs")).unwrap() {
        let alg = alg.unwrap();
        for f in fs::read_dir(alg.path()).unwrap() {
            members.push(format!(
                "blobs/{}/{}",
                alg.file_name().to_str().unwrap(),
                f.unwrap().file_name().to_str().unwrap()
            ));
        }
    }
    let (special_name, mut special_header) = special;
    for name in members {
        if name == special_name {
            b.append_data(&mut special_header, &name, io::empty()).unwrap();
        } else {
            b.append_path_with_name(dir.join(&name), &name).unwrap();
        }
    }
    b.into_inner().unwrap();
}

/// Issue 32 (6), tar bundles: a member that is a symbolic link, a hard link, a FIFO or a device
/// is never followed or opened (tar members are read from the stream only); named as a layout
/// member it refuses the bundle, as not a regular file, and nothing is stored or registered.
#[test]
fn should_refuse_tar_members_that_are_links_or_special_files() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    let bytes = b"not for the bundle\n".repeat(50);
    fs::write(&secret, &bytes).unwrap();
    let img = image_with_layer("tar-links", &bytes);
    let layout_dir = dir.path().join("bundle");
    write_bundle(&layout_dir, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
    let layer_name = layout::blob_path(&img.layer.digest);
    let header = |kind: tar::EntryType, link: Option<&Path>| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o644);
        if let Some(l) = link {
            h.set_link_name(l).unwrap();
        }
        h
    };
    let cases = [
        ("symlink to a matching file", layer_name.as_str(), header(tar::EntryType::Symlink, Some(&secret))),
        ("hard link to a matching file", layer_name.as_str(), header(tar::EntryType::Link, Some(&secret))),
        (
            "hard link to another member",
            layer_name.as_str(),
            header(tar::EntryType::Link, Some(Path::new("oci-layout"))),
        ),
        ("FIFO", layer_name.as_str(), header(tar::EntryType::Fifo, None)),
        ("character device", layer_name.as_str(), header(tar::EntryType::Char, None)),
        ("block device", layer_name.as_str(), header(tar::EntryType::Block, None)),
        ("symlinked index.json", "index.json", header(tar::EntryType::Symlink, Some(&layout_dir.join("index.json")))),
    ];
    for (i, (what, name, h)) in cases.into_iter().enumerate() {
        let tar_path = dir.path().join(format!("special-{i}.tar"));
        tar_with(&layout_dir, &tar_path, (name, h));
        let s = store(&dir.path().join(format!("data-{i}")));
        let e = import_path(&tar_path, &s, &TwoUpstreams, &options()).expect_err(what);
        assert!(matches!(e, ImportError::Refused(_)), "{what}: {e}");
        let e = e.to_string();
        assert!(e.contains(name) && e.contains("not a regular file"), "{what}: {e}");
        assert_invisible(&s, &img, "v1");
        assert!(s.object_len(&img.layer.digest).is_none(), "{what}: the link's target was stored");
    }
}

/// Issue 32 (4): an index holds at most 10,000 entries and a manifest at most 10,000
/// descriptors; past that the bundle is refused with the cap named, before anything is walked.
#[test]
fn should_refuse_an_index_or_a_manifest_over_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("caps");
    let s = store(&dir.path().join("data"));

    let entries: Vec<Descriptor> =
        (0..10_001).map(|i| img.index.descriptor().with(layout::REF_NAME, format!("ghcr.io/a/b:t{i}"))).collect();
    let path = dir.path().join("entries");
    // (without the layer: the cap refuses before any entry is walked)
    hostile_bundle(&path, &[&img.config, &img.manifest, &img.index], entries);
    let e = import_path(&path, &s, &TwoUpstreams, &options()).unwrap_err().to_string();
    assert!(e.contains("10001 entries") && e.contains("10000"), "{e}");
    assert_invisible(&s, &img, "t0");

    let layers: Vec<Descriptor> = (0..10_001u32)
        .map(|i| Descriptor::new(img.layer.media_type, &Algorithm::Sha256.digest(&i.to_be_bytes()), 4))
        .collect();
    let doc = serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST, "config": img.config.descriptor(), "layers": layers,
    });
    let wide = blob(&serde_json::to_vec(&doc).unwrap(), media::OCI_MANIFEST);
    let path = dir.path().join("descriptors");
    hostile_bundle(&path, &[&img.config, &wide], vec![wide.descriptor().with(layout::REF_NAME, "ghcr.io/a/b:wide")]);
    let e = import_path(&path, &s, &TwoUpstreams, &options()).unwrap_err().to_string();
    assert!(e.contains("10001 layers") && e.contains("10000") && e.contains(&wide.digest.to_string()), "{e}");
    assert!(s.tag_get("ghcr.io", "a/b", "wide").unwrap().is_none());
}

/// Issue 32 (6), `tender bundle ls`: it reads a directory bundle's manifests as import does,
/// never through a link and never waiting on a FIFO (one named as the manifest hung it).
#[test]
fn should_list_a_bundle_without_following_links_or_waiting_on_fifos() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("ls-fifo");
    let path = dir.path().join("bundle");
    write_bundle(&path, &[("ghcr.io/a/b:v1", &img)], HashSet::new(), None);
    let manifest_path = path.join(layout::blob_path(&img.manifest.digest));
    fs::remove_file(&manifest_path).unwrap();
    rustix::fs::mkfifoat(rustix::fs::CWD, &manifest_path, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
    let listed = std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        let path = &path;
        scope.spawn(move || {
            let _ = tx.send(tender_bundle::list::list(path).map(|l| l.entries.len()).map_err(|e| e.to_string()));
        });
        let listed = rx.recv_timeout(Duration::from_secs(5));
        if listed.is_err() {
            use std::os::unix::fs::OpenOptionsExt;
            let nonblock = rustix::fs::OFlags::NONBLOCK.bits() as i32;
            let _ = fs::OpenOptions::new().write(true).custom_flags(nonblock).open(&manifest_path);
        }
        listed
    });
    assert_eq!(listed.expect("bundle ls still waiting on a FIFO after 5 s"), Ok(1));

    let index = path.join(layout::INDEX_FILE);
    let moved = dir.path().join("index-elsewhere.json");
    fs::rename(&index, &moved).unwrap();
    symlink(&moved, &index).unwrap();
    let e = tender_bundle::list::list(&path).unwrap_err().to_string();
    assert!(e.contains("symbolic link"), "{e}");
}

/// Routes like [`TwoUpstreams`], with `docker.io` private at this site.
struct DockerPrivate;

impl Router for DockerPrivate {
    fn route(&self, image: &ImageRef) -> Result<(String, RepoName), String> {
        TwoUpstreams.route(image)
    }

    fn is_private(&self, upstream: &str) -> bool {
        upstream == "docker.io"
    }
}

/// Issue 32 (3): an image exported from an upstream that served it to authenticated clients
/// only carries `dev.tender.private`; it registers only under an upstream that is private at
/// the importing site too (else the whole bundle is refused, naming the image and the key to
/// set, and nothing of it becomes visible), unless `--allow-public` says to serve it to all.
#[test]
fn should_keep_a_private_image_private_or_refuse_it() {
    let dir = tempfile::tempdir().unwrap();
    let img = image("private");
    let write = |path: &Path, name: &str| {
        let mut w = BundleWriter::create(path, HashSet::new()).unwrap();
        for b in [&img.layer, &img.config, &img.manifest, &img.index] {
            w.add_bytes(&b.digest, &b.bytes).unwrap();
        }
        let entry = img.index.descriptor().with(layout::REF_NAME, name).with(layout::PRIVATE, "true");
        w.finish(&Document::index(vec![entry], BTreeMap::new())).unwrap();
    };
    let public = dir.path().join("public");
    write(&public, "ghcr.io/a/b:v1");
    let s = store(&dir.path().join("data"));
    let e = import_path(&public, &s, &DockerPrivate, &options()).unwrap_err().to_string();
    assert!(e.contains("ghcr.io/a/b:v1") && e.contains("private: true") && e.contains("--allow-public"), "{e}");
    assert_invisible(&s, &img, "v1");
    let allowed = ImportOptions { allow_public: true, ..options() };
    import_path(&public, &s, &DockerPrivate, &allowed).unwrap();
    assert!(s.tag_get("ghcr.io", "a/b", "v1").unwrap().is_some(), "--allow-public registers it");
    let private = dir.path().join("private");
    write(&private, "docker.io/a/b:v1");
    import_path(&private, &s, &DockerPrivate, &options()).unwrap();
    assert!(s.tag_get("docker.io", "a/b", "v1").unwrap().is_some(), "a private upstream takes it");
}
