//! The importing site's signature policy over a bundle (issue 34 (5)): every image a verifying
//! rule covers must verify with the cosign signatures the bundle carries, or the bundle is
//! refused whole and nothing of it becomes visible.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use tender_bundle::layout::{self, Descriptor, Document};
use tender_bundle::{import_path, BundleWriter, ImportError, ImportOptions, Router};
use tender_oci::{media, Algorithm, Digest, ImageRef, RepoName};
use tender_store::{OpenMode, Store};
use tender_verify::policy::{RawPolicy, RawPublicKey, RawRule};
use tender_verify::Policy;

struct Site(Arc<Policy>);

impl Router for Site {
    fn route(&self, image: &ImageRef) -> Result<(String, RepoName), String> {
        Ok((image.registry.clone(), image.repository.clone()))
    }

    fn policy(&self) -> Option<Arc<Policy>> {
        Some(self.0.clone())
    }
}

struct Key {
    pair: EcdsaKeyPair,
    public_pem: String,
}

fn key() -> Key {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    Key { public_pem: rcgen::KeyPair::try_from(pkcs8.as_ref()).unwrap().public_key_pem(), pair }
}

fn site(k: &Key) -> Site {
    let rule = RawRule {
        image: "ghcr.io/org/*".into(),
        public_key: Some(RawPublicKey { key: Some(k.public_pem.clone()), certificate: None }),
        ..RawRule::default()
    };
    Site(Arc::new(Policy::compile(&RawPolicy { rules: vec![rule], ..RawPolicy::default() }, None).unwrap()))
}

/// A bundle entry's objects: (digest, bytes) and its descriptor in index.json.
struct Entry {
    objects: Vec<(Digest, Vec<u8>)>,
    descriptor: Descriptor,
}

fn object(bytes: &[u8]) -> (Digest, Vec<u8>) {
    (Algorithm::Sha256.digest(bytes), bytes.to_vec())
}

fn image(name: &str, seed: &str) -> (Entry, Digest) {
    let config = object(format!("{{\"seed\":\"{seed}\"}}").as_bytes());
    let doc = serde_json::json!({"schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config.0.to_string(), "size": config.1.len()},
        "layers": []});
    let manifest = object(&serde_json::to_vec(&doc).unwrap());
    let d = manifest.0;
    let descriptor = Descriptor::new(media::OCI_MANIFEST, &d, manifest.1.len() as u64).with(layout::REF_NAME, name);
    (Entry { objects: vec![config, manifest], descriptor }, d)
}

/// cosign's `.sig` entry for `digest` in `repo`, its payload naming `names`, signed by `k`.
fn signature(k: &Key, repo: &str, digest: &Digest, names: &Digest) -> Entry {
    let payload = format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"ghcr.io/{repo}"}},"image":{{"docker-manifest-digest":"{names}"}},"type":"cosign container image signature"}},"optional":null}}"#
    );
    let sig = k.pair.sign(&ring::rand::SystemRandom::new(), payload.as_bytes()).unwrap();
    let sig = base64::engine::general_purpose::STANDARD.encode(sig.as_ref());
    let layer = object(payload.as_bytes());
    let config = object(b"{}");
    let doc = serde_json::json!({"schemaVersion": 2, "mediaType": media::OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config.0.to_string(), "size": 2},
        "layers": [{"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "digest": layer.0.to_string(),
            "size": layer.1.len(), "annotations": {"dev.cosignproject.cosign/signature": sig}}]});
    let manifest = object(&serde_json::to_vec(&doc).unwrap());
    let name = format!("ghcr.io/{repo}:sha256-{}.sig", digest.hex());
    let descriptor =
        Descriptor::new(media::OCI_MANIFEST, &manifest.0, manifest.1.len() as u64).with(layout::REF_NAME, &name);
    Entry { objects: vec![layer, config, manifest], descriptor }
}

fn write(path: &Path, entries: &[&Entry]) {
    let mut w = BundleWriter::create(path, HashSet::new()).unwrap();
    let mut index = Vec::new();
    let mut written = HashSet::new();
    for e in entries {
        for (d, b) in &e.objects {
            if written.insert(*d) {
                w.add_bytes(d, b).unwrap();
            }
        }
        index.push(e.descriptor.clone());
    }
    w.finish(&Document::index(index, BTreeMap::new())).unwrap();
}

fn store(dir: &Path) -> Store {
    Store::open(dir, OpenMode::Exclusive).unwrap()
}

#[test]
fn should_import_signed_images_with_their_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let k = key();
    let (app, d) = image("ghcr.io/org/app:v1", "a");
    let sig = signature(&k, "org/app", &d, &d);
    let (other, _) = image("ghcr.io/elsewhere/x:v1", "b"); // no rule covers it
    write(&dir.path().join("b"), &[&app, &sig, &other]);
    let s = store(&dir.path().join("data"));
    let report = import_path(&dir.path().join("b"), &s, &site(&k), &ImportOptions::default()).unwrap();
    assert_eq!(report.images.len(), 3);
    assert!(s.tag_get("ghcr.io", "org/app", "v1").unwrap().is_some());
    let v = s.verdict_get(&d).unwrap().expect("the verdict is stored with the image");
    assert_eq!((v.method.as_str(), v.rule), ("key", 0));
}

#[test]
fn should_refuse_the_whole_bundle_when_a_covered_image_does_not_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (k, stranger) = (key(), key());
    let (good, gd) = image("ghcr.io/org/good:v1", "g");
    let good_sig = signature(&k, "org/good", &gd, &gd);
    let (unsigned, _) = image("ghcr.io/org/unsigned:v1", "u");
    let (forged, fd) = image("ghcr.io/org/forged:v1", "f");
    let forged_sig = signature(&stranger, "org/forged", &fd, &fd);
    let (swapped, sd) = image("ghcr.io/org/swapped:v1", "s");
    let swapped_sig = signature(&k, "org/swapped", &sd, &gd); // names another digest
    for (case, bad, want) in [
        (
            "unsigned",
            vec![&unsigned],
            "ghcr.io/org/unsigned:v1: imageVerification.rules[0] (ghcr.io/org/*): no signature",
        ),
        ("forged", vec![&forged, &forged_sig], "signature does not verify: not signed by the key"),
        ("swapped", vec![&swapped, &swapped_sig], "payload names another digest"),
    ] {
        let path = dir.path().join(case);
        let mut entries = vec![&good, &good_sig];
        entries.extend(bad);
        write(&path, &entries);
        let s = store(&dir.path().join(format!("data-{case}")));
        let e = import_path(&path, &s, &site(&k), &ImportOptions::default()).unwrap_err();
        assert!(matches!(e, ImportError::Refused(_)), "{case}: {e}");
        assert!(e.to_string().contains(want), "{case}: {e}");
        assert!(s.tag_get("ghcr.io", "org/good", "v1").unwrap().is_none(), "{case}: nothing is visible");
        assert!(s.verdict_get(&gd).unwrap().is_none(), "{case}: no verdict");
    }
}
