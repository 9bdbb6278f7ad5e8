//! Public keys as cosign, Fulcio, Rekor and CT logs write them (a PEM `PUBLIC KEY`, the key of
//! a `CERTIFICATE`, a DER SubjectPublicKeyInfo), and signature checks on ring.

use std::fmt;

use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use sha2::{Digest as _, Sha256};
use x509_cert::der::{Decode, Encode};
use x509_cert::spki::{ObjectIdentifier, SubjectPublicKeyInfoRef};
use x509_cert::Certificate;

const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
const P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
const ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");
const RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

/// The most PEM a key or certificate field is read from (a chain of a few certificates).
pub const MAX_PEM: usize = 64 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    P256,
    P384,
    Ed25519,
    Rsa,
}

/// A public key that checks signatures the way cosign makes them: ECDSA P-256 with SHA-256
/// (cosign's default), P-384 with SHA-384, Ed25519, RSA PKCS#1 v1.5 with SHA-256.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    kind: Kind,
    /// The whole DER SubjectPublicKeyInfo (what log IDs and key fingerprints hash).
    spki: Vec<u8>,
    /// The key itself (the SPKI's BIT STRING).
    bits: Vec<u8>,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({:?}, {})", self.kind, self.fingerprint())
    }
}

impl PublicKey {
    /// A DER SubjectPublicKeyInfo.
    pub fn from_spki_der(der: &[u8]) -> Result<PublicKey, String> {
        let spki = SubjectPublicKeyInfoRef::from_der(der).map_err(|e| format!("not a DER public key: {e}"))?;
        let oid = spki.algorithm.oid;
        let kind = if oid == EC_PUBLIC_KEY {
            let curve = spki
                .algorithm
                .parameters
                .and_then(|p| p.decode_as::<ObjectIdentifier>().ok())
                .ok_or("an EC public key without its named curve")?;
            match curve {
                c if c == P256 => Kind::P256,
                c if c == P384 => Kind::P384,
                c => return Err(format!("EC curve {c} is not supported (P-256 or P-384)")),
            }
        } else if oid == ED25519 {
            Kind::Ed25519
        } else if oid == RSA {
            Kind::Rsa
        } else {
            return Err(format!("public key algorithm {oid} is not supported (ECDSA, Ed25519 or RSA)"));
        };
        let bits = spki.subject_public_key.as_bytes().ok_or("the public key is not a whole number of bytes")?;
        Ok(PublicKey { kind, spki: der.to_vec(), bits: bits.to_vec() })
    }

    /// The first PEM block of `text`: a `PUBLIC KEY`, or a `CERTIFICATE` whose key is taken
    /// (Talos' `publicKey.certificate` takes either).
    pub fn from_pem(text: &str) -> Result<PublicKey, String> {
        if text.len() > MAX_PEM {
            return Err(format!("more than {MAX_PEM} bytes of PEM"));
        }
        let blocks = pem::parse_many(text).map_err(|e| format!("not PEM: {e}"))?;
        let block = blocks.first().ok_or("no PEM block (-----BEGIN PUBLIC KEY----- or CERTIFICATE)")?;
        match block.tag() {
            "PUBLIC KEY" => PublicKey::from_spki_der(block.contents()),
            "CERTIFICATE" => PublicKey::of_certificate(block.contents()),
            "ENCRYPTED SIGSTORE PRIVATE KEY" | "ENCRYPTED COSIGN PRIVATE KEY" | "PRIVATE KEY" | "EC PRIVATE KEY" => {
                Err(format!("a {} block: give the public key (cosign.pub), never the private one", block.tag()))
            }
            other => Err(format!("a {other} block is not a public key or certificate")),
        }
    }

    /// The key of a DER certificate.
    pub fn of_certificate(der: &[u8]) -> Result<PublicKey, String> {
        let cert = Certificate::from_der(der).map_err(|e| format!("not a DER certificate: {e}"))?;
        let spki = cert.tbs_certificate.subject_public_key_info.to_der().map_err(|e| e.to_string())?;
        PublicKey::from_spki_der(&spki)
    }

    /// `sha256:<hex>` of the DER SubjectPublicKeyInfo: how a verdict names the key.
    pub fn fingerprint(&self) -> String {
        format!("sha256:{}", hex::encode(self.key_id()))
    }

    /// SHA-256 of the DER SubjectPublicKeyInfo: the log ID of a Rekor or CT log key.
    pub fn key_id(&self) -> [u8; 32] {
        Sha256::digest(&self.spki).into()
    }

    /// Whether `signature` (ASN.1 DER for ECDSA) is this key's over `message`.
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        let alg: &dyn VerificationAlgorithm = match self.kind {
            Kind::P256 => &signature::ECDSA_P256_SHA256_ASN1,
            Kind::P384 => &signature::ECDSA_P384_SHA384_ASN1,
            Kind::Ed25519 => &signature::ED25519,
            Kind::Rsa => &signature::RSA_PKCS1_2048_8192_SHA256,
        };
        UnparsedPublicKey::new(alg, &self.bits).verify(message, signature).is_ok()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_refuse_what_is_not_a_public_key() {
        for (text, want) in [
            ("", "no PEM block"),
            (
                "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
                "never the private",
            ),
            ("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "not a DER public key"),
        ] {
            let e = PublicKey::from_pem(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn should_check_a_p256_signature_as_cosign_makes_it() {
        let rng = ring::rand::SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_ASN1_SIGNING;
        let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
        let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
        let key = rcgen::KeyPair::try_from(pkcs8.as_ref()).unwrap();
        let public = PublicKey::from_pem(&key.public_key_pem()).unwrap();
        let sig = pair.sign(&rng, b"payload").unwrap();
        assert!(public.verify(b"payload", sig.as_ref()));
        assert!(!public.verify(b"payloaD", sig.as_ref()));
        assert!(public.fingerprint().starts_with("sha256:"));
    }
}
