//! Signed bundles (issue 34 (5)): `tender export --sign-key KEY` signs the bundle's index
//! digest, `tender import --verify-key KEY` refuses an unsigned or wrongly signed bundle before
//! reading any of it. Two files beside the bundle: `<PATH>.digest`, the index digest as text
//! (`sha256:<hex>`, no newline), and `<PATH>.sig`, a cosign-compatible blob signature of that
//! file (base64 ECDSA P-256 / SHA-256, DER), so `cosign verify-blob --insecure-ignore-tlog
//! --key KEY.pub --signature PATH.sig PATH.digest` checks it too. Import then accepts only the
//! bundle whose `index.json` is that digest.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use tender_oci::Digest;
use tender_verify::keys::PublicKey;

use crate::exit::{Failure, Result};

/// The largest key, digest or signature file read.
const MAX_FILE: u64 = 64 << 10;

fn sidecar(bundle: &Path, ext: &str) -> PathBuf {
    let mut s = bundle.as_os_str().to_owned();
    s.push(format!(".{ext}"));
    PathBuf::from(s)
}

fn read_small(path: &Path, what: &str) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path).map_err(|e| Failure::usage(format!("{what} {}: {e}", path.display())))?;
    if meta.len() > MAX_FILE {
        return Err(Failure::usage(format!("{what} {}: larger than {MAX_FILE} bytes", path.display())));
    }
    std::fs::read(path).map_err(|e| Failure::usage(format!("{what} {}: {e}", path.display())))
}

/// A signing key: a PKCS#8 PEM ECDSA P-256 private key (`openssl genpkey -algorithm EC -pkeyopt
/// ec_paramgen_curve:P-256`).
pub struct SigningKey(EcdsaKeyPair);

impl SigningKey {
    pub fn load(path: &Path) -> Result<SigningKey> {
        let text = read_small(path, "--sign-key")?;
        let blocks = pem_blocks(&text).map_err(|e| Failure::usage(format!("--sign-key {}: {e}", path.display())))?;
        let der = match blocks.iter().find(|(tag, _)| tag == "PRIVATE KEY") {
            Some((_, der)) => der.clone(),
            None => {
                let found = blocks.first().map_or("no PEM block".to_string(), |(t, _)| format!("a {t} block"));
                return Err(Failure::usage(format!(
                    "--sign-key {}: {found}; give a PKCS#8 P-256 private key (-----BEGIN PRIVATE KEY-----, \
                     as `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` writes it)",
                    path.display()
                )));
            }
        };
        let rng = ring::rand::SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &der, &rng).map_err(|_| {
            Failure::usage(format!("--sign-key {}: not an ECDSA P-256 PKCS#8 private key", path.display()))
        })?;
        Ok(SigningKey(pair))
    }

    /// Sign `index` and write the two files beside `bundle`; returns the signature's path.
    pub fn sign(&self, bundle: &Path, index: &Digest) -> Result<PathBuf> {
        let message = index.to_string();
        let rng = ring::rand::SystemRandom::new();
        let sig =
            self.0.sign(&rng, message.as_bytes()).map_err(|_| Failure::problem("signing the index digest failed"))?;
        let (digest_path, sig_path) = (sidecar(bundle, "digest"), sidecar(bundle, "sig"));
        std::fs::write(&digest_path, &message)
            .map_err(|e| Failure::problem(format!("writing {}: {e}", digest_path.display())))?;
        std::fs::write(&sig_path, STANDARD.encode(sig.as_ref()))
            .map_err(|e| Failure::problem(format!("writing {}: {e}", sig_path.display())))?;
        Ok(sig_path)
    }
}

/// Check `bundle`'s signature with the public key at `key` (a PEM public key, as
/// `cosign.pub`); returns the index digest it signs.
pub fn verify(bundle: &Path, key: &Path) -> Result<Digest> {
    let pem = read_small(key, "--verify-key")?;
    let pem = String::from_utf8(pem).map_err(|_| Failure::usage(format!("--verify-key {}: not PEM", key.display())))?;
    let public =
        PublicKey::from_pem(&pem).map_err(|e| Failure::usage(format!("--verify-key {}: {e}", key.display())))?;
    let (digest_path, sig_path) = (sidecar(bundle, "digest"), sidecar(bundle, "sig"));
    if !sig_path.exists() || !digest_path.exists() {
        return Err(Failure::problem(format!(
            "bundle refused: {} is not signed (no {} and {} beside it; tender export --sign-key writes them)",
            bundle.display(),
            digest_path.display(),
            sig_path.display()
        )));
    }
    let message = read_small(&digest_path, "the bundle's digest file")?;
    let sig = read_small(&sig_path, "the bundle's signature")?;
    let sig = STANDARD
        .decode(String::from_utf8_lossy(&sig).trim())
        .map_err(|_| Failure::problem(format!("bundle refused: {} is not base64", sig_path.display())))?;
    if !public.verify(&message, &sig) {
        return Err(Failure::problem(format!(
            "bundle refused: {} is not a signature of {} by the key {} ({})",
            sig_path.display(),
            digest_path.display(),
            key.display(),
            public.fingerprint()
        )));
    }
    let text = String::from_utf8_lossy(&message);
    text.trim().parse::<Digest>().map_err(|_| {
        Failure::problem(format!("bundle refused: {} does not hold an index digest", digest_path.display()))
    })
}

fn pem_blocks(text: &[u8]) -> std::result::Result<Vec<(String, Vec<u8>)>, String> {
    let blocks = pem::parse_many(text).map_err(|e| format!("not PEM: {e}"))?;
    Ok(blocks.into_iter().map(|b| (b.tag().to_string(), b.into_contents())).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    fn keys(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let private =
            format!("-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n", STANDARD.encode(pkcs8.as_ref()));
        let public = rcgen::KeyPair::try_from(pkcs8.as_ref()).unwrap().public_key_pem();
        let (k, p) = (dir.join(format!("{name}.key")), dir.join(format!("{name}.pub")));
        std::fs::write(&k, private).unwrap();
        std::fs::write(&p, public).unwrap();
        (k, p)
    }

    #[test]
    fn should_accept_only_a_bundle_signed_by_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let (key, public) = keys(dir.path(), "site");
        let (_, other) = keys(dir.path(), "other");
        let bundle = dir.path().join("b.tar");
        let d: Digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111".parse().unwrap();

        let unsigned = verify(&bundle, &public).unwrap_err();
        assert!(unsigned.to_string().contains("is not signed"), "{unsigned}");

        SigningKey::load(&key).unwrap().sign(&bundle, &d).unwrap();
        assert_eq!(verify(&bundle, &public).unwrap(), d);
        let wrong = verify(&bundle, &other).unwrap_err();
        assert!(wrong.to_string().contains("is not a signature"), "{wrong}");

        // Another digest swapped in beside the signature.
        std::fs::write(sidecar(&bundle, "digest"), d.to_string().replace('1', "2")).unwrap();
        assert!(verify(&bundle, &public).unwrap_err().to_string().contains("is not a signature"));
    }

    /// Issue 35 (3): a split, compressed bundle is signed under its name `PATH`; the signature
    /// is found from the manifest, the first part or `PATH`, and the import accepts only the
    /// index it signs.
    #[test]
    fn should_verify_a_signed_part_set_from_any_of_its_names() {
        use tender_bundle::packing::{self, Compress, Packing, MIN_PART};
        let dir = tempfile::tempdir().unwrap();
        let (key, public) = keys(dir.path(), "site");
        let bundle = dir.path().join("r.tar.zst");
        let packing = Packing { compress: Compress::Zstd, split: Some(MIN_PART) };
        let mut w = tender_bundle::BundleWriter::create_packed(&bundle, Default::default(), packing).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..(3 << 20))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        w.add_bytes(&tender_oci::Algorithm::Sha256.digest(&noise), &noise).unwrap();
        let index = w.finish(&tender_bundle::Document::index(vec![], Default::default())).unwrap();
        let index = index.index_digest.unwrap();
        SigningKey::load(&key).unwrap().sign(&bundle, &index).unwrap();
        for name in ["r.tar.zst.parts.json", "r.tar.zst.000", "r.tar.zst"] {
            let packed = packing::open(&dir.path().join(name)).unwrap();
            assert_eq!(packed.base(), bundle.as_path(), "{name}");
            assert_eq!(verify(packed.base(), &public).unwrap(), index, "{name}");
        }

        struct NoUpstream;
        impl tender_bundle::Router for NoUpstream {
            fn route(&self, _: &tender_oci::ImageRef) -> std::result::Result<(String, tender_oci::RepoName), String> {
                Err("none".into())
            }
        }
        let store = tender_store::Store::open(&dir.path().join("data"), tender_store::OpenMode::Exclusive).unwrap();
        let packed = packing::open(&bundle).unwrap();
        let other = tender_oci::Algorithm::Sha256.digest(b"another index");
        let wrong = tender_bundle::ImportOptions { expect_index: Some(other), ..Default::default() };
        let e = tender_bundle::import_packed(&packed, &store, &NoUpstream, &wrong, None).unwrap_err();
        assert!(e.to_string().contains("not the expected"), "{e}");
        let right = tender_bundle::ImportOptions { expect_index: Some(index), ..Default::default() };
        let r = tender_bundle::import_packed(&packed, &store, &NoUpstream, &right, None).unwrap();
        assert_eq!(r.index_digest, index.to_string());
    }

    #[test]
    fn should_refuse_a_public_key_as_the_signing_key() {
        let dir = tempfile::tempdir().unwrap();
        let (_, public) = keys(dir.path(), "site");
        let e = SigningKey::load(&public).err().unwrap();
        assert!(e.to_string().contains("PKCS#8"), "{e}");
    }
}
