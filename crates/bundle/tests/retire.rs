//! Retiring a release (issue 35 (2)): import release A, import release B as a delta on it,
//! remove A: gc frees exactly A's objects that B does not hold, and nothing else.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::time::Duration;

use tender_bundle::layout::{self, Descriptor, Document};
use tender_bundle::{blobs_of, import_path, BundleWriter, ImportOptions, Router};
use tender_oci::{media, Algorithm, Digest, ImageRef, RepoName};
use tender_store::{OpenMode, Store};

const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

struct Ghcr;

impl Router for Ghcr {
    fn route(&self, image: &ImageRef) -> Result<(String, RepoName), String> {
        Ok((image.registry.clone(), image.repository.clone()))
    }
}

/// An image: (bytes, media type) of its layer, config and manifest, the manifest last.
type Image = Vec<(Vec<u8>, &'static str)>;

fn image(seed: &str) -> Image {
    let layer = format!("layer of {seed}").repeat(500).into_bytes();
    let config = format!(r#"{{"architecture":"amd64","os":"linux","seed":"{seed}"}}"#).into_bytes();
    let d = |b: &[u8], t: &str| Descriptor::new(t, &Algorithm::Sha256.digest(b), b.len() as u64);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
        "config": d(&config, CONFIG), "layers": [d(&layer, LAYER)],
    }))
    .unwrap();
    vec![(layer, LAYER), (config, CONFIG), (manifest, media::OCI_MANIFEST)]
}

fn digests(img: &[(Vec<u8>, &str)]) -> BTreeSet<Digest> {
    img.iter().map(|(b, _)| Algorithm::Sha256.digest(b)).collect()
}

/// A bundle of `images` (name, image); a delta leaves out what `since` holds.
fn bundle(path: &Path, images: &[(&str, &Image)], since: Option<&Path>) -> Digest {
    let skip = since.map(|p| blobs_of(p).unwrap()).unwrap_or_default();
    let mut w = BundleWriter::create(path, skip).unwrap();
    let mut entries = Vec::new();
    for (name, img) in images {
        for (bytes, _) in img.iter() {
            w.add_bytes(&Algorithm::Sha256.digest(bytes), bytes).unwrap();
        }
        let (manifest, t) = img.last().unwrap();
        entries.push(
            Descriptor::new(t, &Algorithm::Sha256.digest(manifest), manifest.len() as u64)
                .with(layout::REF_NAME, *name),
        );
    }
    let mut annotations = BTreeMap::new();
    if let Some(old) = since {
        annotations.insert(layout::SINCE.to_string(), tender_bundle::list::list(old).unwrap().index_digest);
    }
    w.finish(&Document::index(entries, annotations)).unwrap().index_digest.unwrap()
}

fn options() -> ImportOptions {
    ImportOptions { pin: true, identity: "user test".into(), ..ImportOptions::default() }
}

fn gc(store: &Store) -> (BTreeSet<Digest>, u64) {
    let plan = store.gc_plan(None, Duration::ZERO, &|d| store.is_pinned(d)).unwrap();
    let report = store.gc_apply(&plan).unwrap();
    (plan.evict.iter().map(|o| o.digest).collect(), report.freed_bytes)
}

fn held(store: &Store, set: &BTreeSet<Digest>) -> bool {
    set.iter().all(|d| store.object_len(d).is_some())
}

#[test]
fn should_free_exactly_the_retired_release_objects_that_the_next_release_does_not_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (x1, x2, y, z) = (image("x1"), image("x2"), image("y"), image("z"));
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let a_index = bundle(&a, &[("ghcr.io/s/x:v1", &x1), ("ghcr.io/s/y:v1", &y)], None);
    let b_index = bundle(&b, &[("ghcr.io/s/x:v2", &x2), ("ghcr.io/s/y:v1", &y)], Some(&a));
    let store = Store::open(&dir.path().join("data"), OpenMode::Exclusive).unwrap();
    import_path(&a, &store, &Ghcr, &options()).unwrap();
    import_path(&b, &store, &Ghcr, &options()).unwrap();
    // Something pulled, untagged and unpinned: a cache entry gc must leave (no cap).
    let (zl, _) = &z[0];
    store.put_bytes("k", zl, &Algorithm::Sha256.digest(zl)).unwrap();

    let records = store.imports().unwrap();
    assert_eq!(records.iter().map(|r| r.index).collect::<Vec<_>>(), [a_index, b_index]);
    assert_eq!(records[0].identity, "user test");
    assert_eq!(records[1].delta_of.as_deref(), Some(a_index.to_string().as_str()));
    // Nothing retired: a gc frees nothing.
    assert!(gc(&store).0.is_empty());

    // A dry run says what removing A would free, and changes nothing.
    let dry = store.import_remove(&a_index, true).unwrap().unwrap();
    assert_eq!(dry.retired.iter().copied().collect::<BTreeSet<_>>(), digests(&x1));
    assert_eq!(dry.still_held, 3, "y's three objects are B's too");
    assert!(store.import_get(&a_index).unwrap().is_some() && store.tag_get("ghcr.io", "s/x", "v1").unwrap().is_some());
    assert!(gc(&store).0.is_empty());

    let removed = store.import_remove(&a_index, false).unwrap().unwrap();
    assert_eq!(removed.retired.iter().copied().collect::<BTreeSet<_>>(), digests(&x1));
    let x1_bytes: u64 = x1.iter().map(|(b, _)| b.len() as u64).sum();
    assert_eq!(removed.retired_bytes, x1_bytes);
    assert!(store.tag_get("ghcr.io", "s/x", "v1").unwrap().is_none(), "A's own tag goes with it");
    assert!(store.tag_get("ghcr.io", "s/y", "v1").unwrap().is_some(), "B registered y:v1 too");
    assert!(store.import_remove(&a_index, false).unwrap().is_none(), "removed once");

    let (freed, bytes) = gc(&store);
    assert_eq!(freed, digests(&x1), "exactly A's objects not in B");
    assert_eq!(bytes, x1_bytes);
    assert!(!x1.iter().any(|(b, _)| store.object_len(&Algorithm::Sha256.digest(b)).is_some()));
    assert!(held(&store, &digests(&x2)) && held(&store, &digests(&y)));
    assert!(store.object_len(&Algorithm::Sha256.digest(zl)).is_some(), "the cache is not touched");
    assert!(store.retired().unwrap().is_empty());
    assert!(gc(&store).0.is_empty(), "a second gc frees nothing");
}

#[test]
fn should_release_an_imported_tag_and_keep_what_a_tag_or_a_prefetch_pin_still_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = (image("x"), image("y"));
    let a = dir.path().join("a");
    bundle(&a, &[("ghcr.io/s/x:v1", &x), ("ghcr.io/s/y:v1", &y), ("ghcr.io/s/y:latest", &y)], None);
    let store = Store::open(&dir.path().join("data"), OpenMode::Exclusive).unwrap();
    import_path(&a, &store, &Ghcr, &options()).unwrap();
    let x_layer = Algorithm::Sha256.digest(&x[0].0);
    store.pin(&x_layer, "prefetch").unwrap();

    // y:v1 released; y:latest still holds the same objects.
    store.tag_remove("ghcr.io", "s/y", "v1").unwrap();
    let r = store.import_release_tag("ghcr.io", "s/y", "v1").unwrap();
    assert!(r.retired.is_empty() && r.still_held == 3, "{r:?}");
    // x:v1 released: its layer keeps the prefetch pin.
    store.tag_remove("ghcr.io", "s/x", "v1").unwrap();
    let r = store.import_release_tag("ghcr.io", "s/x", "v1").unwrap();
    let want: HashSet<Digest> = digests(&x).into_iter().filter(|d| *d != x_layer).collect();
    assert_eq!(r.retired.iter().copied().collect::<HashSet<_>>(), want);
    let (freed, _) = gc(&store);
    assert_eq!(freed.into_iter().collect::<HashSet<_>>(), want);
    assert!(store.object_len(&x_layer).is_some() && held(&store, &digests(&y)));
    assert_eq!(store.imports().unwrap()[0].entries.len(), 1, "only y:latest is left of the bundle");
}

/// A tag `prefetch --pin` pinned holds its objects through a `bundle rm`, and `tag rm` releases
/// exactly what no other pinned tag or bundle holds.
#[test]
fn should_hold_a_prefetch_pinned_tag_until_tag_rm_releases_it() {
    let dir = tempfile::tempdir().unwrap();
    let (x, y, z) = (image("x"), image("y"), image("z"));
    let a = dir.path().join("a");
    let a_index = bundle(&a, &[("ghcr.io/s/x:v1", &x), ("ghcr.io/s/y:v1", &y)], None);
    let store = Store::open(&dir.path().join("data"), OpenMode::Exclusive).unwrap();
    import_path(&a, &store, &Ghcr, &options()).unwrap();
    // As `prefetch --pin` leaves them: y:v1 pinned again as a tag; z:v1 pulled and pinned.
    let prefetch = |img: &Image, repo: &str| {
        for (bytes, t) in img {
            let d = Algorithm::Sha256.digest(bytes);
            store.put_bytes("k", bytes, &d).unwrap();
            if *t == media::OCI_MANIFEST {
                let meta = tender_store::ManifestMeta { media_type: t.to_string(), size: bytes.len() as u64 };
                store.meta_put(&d, &meta).unwrap();
                store.pin_tag("ghcr.io", repo, "v1", &d).unwrap();
            }
            store.pin(&d, tender_store::PREFETCH_PIN).unwrap();
        }
    };
    prefetch(&y, "s/y");
    prefetch(&z, "s/z");

    let removed = store.import_remove(&a_index, false).unwrap().unwrap();
    assert_eq!(removed.retired.iter().copied().collect::<BTreeSet<_>>(), digests(&x), "y stays: a pinned tag holds it");
    assert_eq!(gc(&store).0, digests(&x));
    assert!(held(&store, &digests(&y)) && held(&store, &digests(&z)));

    let released = store.import_release_tag("ghcr.io", "s/z", "v1").unwrap();
    assert_eq!(released.retired.iter().copied().collect::<BTreeSet<_>>(), digests(&z));
    assert_eq!(store.tag_pins().unwrap().len(), 1, "only y:v1 is still pinned");
    assert_eq!(gc(&store).0, digests(&z));
    assert!(held(&store, &digests(&y)));
}
