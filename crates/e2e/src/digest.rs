//! sha256 and sha512 helpers and the verification of pulled images: every blob hashes to its name and
//! every descriptor reachable from the top manifest is present with its declared size.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest as _, Sha256, Sha512};

/// `sha256:<hex>` of some bytes.
pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// `sha512:<hex>` of some bytes.
pub fn sha512(bytes: &[u8]) -> String {
    format!("sha512:{}", hex::encode(Sha512::digest(bytes)))
}

/// `sha256:<hex>` of a file's content.
pub fn sha256_file(p: &Path) -> String {
    let mut f = File::open(p).unwrap_or_else(|e| panic!("opening {}: {e}", p.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// The hex part of `sha256:<hex>`.
pub fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or_else(|| panic!("{digest:?} is not a sha256 digest"))
}

fn read_json(p: &Path) -> Value {
    let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{} is not JSON: {e}", p.display()))
}

/// Descriptors a manifest or index points at: `(digest, size, is_manifest)`.
fn children(doc: &Value) -> Vec<(String, u64, bool)> {
    let mut out = Vec::new();
    let desc = |d: &Value, manifest: bool| {
        let digest = d.get("digest")?.as_str()?.to_string();
        let size = d.get("size")?.as_u64()?;
        Some((digest, size, manifest))
    };
    if let Some(ms) = doc.get("manifests").and_then(Value::as_array) {
        out.extend(ms.iter().filter_map(|m| desc(m, true)));
    }
    if let Some(c) = doc.get("config") {
        out.extend(desc(c, false));
    }
    if let Some(ls) = doc.get("layers").and_then(Value::as_array) {
        out.extend(ls.iter().filter_map(|l| desc(l, false)));
    }
    out
}

/// An OCI image layout (`skopeo copy ... oci:DIR`): every file under `blobs/sha256` hashes to
/// its name, and everything reachable from `index.json` is present with its declared size.
/// Returns the top-level digests named in `index.json` and the set of all blob digests.
pub fn verify_oci_layout(dir: &Path) -> (Vec<String>, BTreeSet<String>) {
    let blobs = dir.join("blobs/sha256");
    let all = verify_named_by_hash(&blobs, "");
    assert!(!all.is_empty(), "no blobs in {}", blobs.display());
    let index = read_json(&dir.join("index.json"));
    let top: Vec<(String, u64, bool)> = children(&index).into_iter().map(|(d, s, _)| (d, s, true)).collect();
    walk(&top, &|d| blobs.join(hex_of(d)));
    (top.into_iter().map(|(d, _, _)| d).collect(), all)
}

/// A `dir:` layout written by `skopeo copy --all` (the only skopeo destination that keeps a
/// Docker manifest list byte for byte): `manifest.json` is the top manifest (it must hash to
/// `top`), instances are `<hex>.manifest.json`, blobs are `<hex>`. Returns all digests seen.
pub fn verify_dir_layout(dir: &Path, top: &str) -> BTreeSet<String> {
    let got = sha256_file(&dir.join("manifest.json"));
    assert_eq!(got, top, "{}/manifest.json is not the upstream's manifest", dir.display());
    let mut all = verify_named_by_hash(dir, ".manifest.json");
    all.extend(verify_named_by_hash(dir, ""));
    let doc = read_json(&dir.join("manifest.json"));
    walk(&children(&doc), &|d| {
        let plain = dir.join(hex_of(d));
        if plain.exists() {
            plain
        } else {
            dir.join(format!("{}.manifest.json", hex_of(d)))
        }
    });
    all
}

/// Check every descriptor (recursively through manifests) exists at `path_of(digest)`, hashes
/// to its digest and has its declared size.
fn walk(descs: &[(String, u64, bool)], path_of: &dyn Fn(&str) -> PathBuf) {
    for (digest, size, manifest) in descs {
        let p = path_of(digest);
        let meta = std::fs::metadata(&p).unwrap_or_else(|e| panic!("{digest} is missing ({}): {e}", p.display()));
        assert_eq!(meta.len(), *size, "{digest} has {} bytes, its descriptor says {size}", meta.len());
        assert_eq!(&sha256_file(&p), digest, "{} does not hash to {digest}", p.display());
        if *manifest {
            walk(&children(&read_json(&p)), path_of);
        }
    }
}

/// Every file in `dir` whose name is `<64 hex><suffix>` hashes to that hex; returns the digests.
fn verify_named_by_hash(dir: &Path, suffix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
    for e in entries {
        let e = e.unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(hex) = name.strip_suffix(suffix).filter(|h| is_hex64(h)) else {
            continue;
        };
        let want = format!("sha256:{hex}");
        assert_eq!(sha256_file(&e.path()), want, "{} does not hash to its name", e.path().display());
        out.insert(want);
    }
    out
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
