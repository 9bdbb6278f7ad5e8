//! End-to-end checks of `tender_verify::verify` against signatures made here: a test Fulcio
//! (P-384 root and intermediate, P-256 leaves with the Fulcio issuer extension and an embedded
//! SCT), a test CT log, a test Rekor (signed entry timestamps over hashedrekord entries), the
//! `trusted_root.json` that pins them, and cosign's simple-signing payloads and layer
//! annotations. Every time is fixed; nothing reads the clock.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::time::{Duration, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType, SerialNumber, PKCS_ECDSA_P384_SHA384,
};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use tender_oci::Digest;
use tender_verify::policy::{RawKeyless, RawPublicKey, RawRule};
use tender_verify::{verify, Action, Candidate, Failure, Policy, RawPolicy, SignatureLayer, Verdict};
use x509_cert::der::asn1::{OctetString, Utf8StringRef};
use x509_cert::der::{Decode, Encode};

/// The leaf's notBefore; it is valid for [`LIFETIME`] seconds, as Fulcio's are.
const NOT_BEFORE: u64 = 1_700_000_000;
const LIFETIME: u64 = 600;
/// Rekor's integrated time of the signature, inside the leaf's ten minutes.
const SIGNED_AT: u64 = NOT_BEFORE + 60;
/// When the CA, the CT log and Rekor keys start being trusted (2023-01-01).
const TRUST_START: u64 = 1_672_531_200;
const SUBJECT: &str = "builder@example.com";
const ISSUER: &str = "https://accounts.example.com";
const IMAGE: &str = "ghcr.io/example/app";
const PATTERN: &str = "ghcr.io/example/*";
const ISSUER_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 57264, 1, 8];
const SCT_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 11129, 2, 4, 2];

fn at(secs: u64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn rfc3339(secs: u64) -> String {
    humantime::format_rfc3339_millis(at(secs)).to_string()
}

fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// A P-256 key: ring signs with it, rcgen puts it in certificates.
struct Key {
    pair: EcdsaKeyPair,
    rcgen: KeyPair,
}

impl Key {
    fn p256() -> Key {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        let rcgen = KeyPair::try_from(pkcs8.as_ref()).unwrap();
        Key { pair, rcgen }
    }

    /// ASN.1 DER ECDSA over SHA-256, as cosign, Rekor and CT logs sign.
    fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(&SystemRandom::new(), message).unwrap().as_ref().to_vec()
    }

    fn spki(&self) -> Vec<u8> {
        self.rcgen.public_key_der()
    }

    /// SHA-256 of the DER SubjectPublicKeyInfo: a log's ID.
    fn id(&self) -> [u8; 32] {
        sha256(&self.spki())
    }

    fn pem(&self) -> String {
        self.rcgen.public_key_pem()
    }
}

/// A certificate authority: a P-384 key and its certificate.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn params(name: &str) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.not_before = at(TRUST_START).into();
        p.not_after = at(TRUST_START + 10 * 365 * 86_400).into();
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::OrganizationName, "tender test");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        p
    }

    fn root(name: &str) -> Ca {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384).unwrap();
        let cert = Ca::params(name).self_signed(&key).unwrap();
        Ca { cert, key }
    }

    fn intermediate(name: &str, parent: &Ca) -> Ca {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P384_SHA384).unwrap();
        let mut p = Ca::params(name);
        p.use_authority_key_identifier_extension = true;
        // Fulcio refuses an intermediate without codeSigning (EKU chaining); so does webpki.
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        let cert = p.signed_by(&key, &parent.cert, &parent.key).unwrap();
        Ca { cert, key }
    }

    fn der(&self) -> Vec<u8> {
        self.cert.der().to_vec()
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }
}

/// A signature as the fetch layer hands it over: the layer (annotations) and its payload.
#[derive(Clone)]
struct Signed {
    layer: SignatureLayer,
    payload: Vec<u8>,
}

impl Signed {
    fn new(payload: Vec<u8>, signature: &[u8]) -> Signed {
        let layer = SignatureLayer {
            payload: Digest::of(&payload),
            size: payload.len() as u64,
            signature: b64(signature),
            certificate: None,
            chain: None,
            bundle: None,
        };
        Signed { layer, payload }
    }

    fn candidate(&self) -> Candidate<'_> {
        Candidate { layer: &self.layer, payload: &self.payload }
    }

    /// One byte of the payload changed, the layer digest updated: only the signature is wrong.
    fn with_tampered_payload(mut self) -> Signed {
        let i = self.payload.windows(5).position(|w| w == b"/app\"").unwrap() + 3;
        self.payload[i] = b'q';
        self.layer.payload = Digest::of(&self.payload);
        self.layer.size = self.payload.len() as u64;
        self
    }
}

/// Which SCT the leaf embeds.
#[derive(Clone, Debug)]
enum SctMode {
    /// Signed by the pinned CT log over the precertificate.
    Valid,
    /// No SCT list extension at all.
    Absent,
    /// Properly signed by a CT log the trusted root does not name.
    UnknownLog,
    /// Names the pinned CT log, signed by another key.
    BadSignature,
    /// One from an unknown log, one from a v2 SCT, then the valid one.
    SeveralLastValid,
    /// This SignedCertificateTimestampList (TLS bytes) inside the OCTET STRING.
    List(Vec<u8>),
    /// This extnValue content, as is.
    Extension(Vec<u8>),
}

type Edit = Box<dyn Fn(&mut Value)>;

/// A keyless signature in the making: a leaf from the test Fulcio, an SCT, a Rekor entry.
struct KeylessBuilder<'f> {
    f: &'f Fixture,
    san: SanType,
    issuer: String,
    eku: ExtendedKeyUsagePurpose,
    ca: &'f Ca,
    sct: SctMode,
    payload: Vec<u8>,
    integrated_time: u64,
    set_key: &'f Key,
    log_id_key: &'f Key,
    body_edit: Option<Edit>,
    bundle_edit: Option<Edit>,
    bundle: bool,
    chain: Option<String>,
}

impl<'f> KeylessBuilder<'f> {
    fn with_email(mut self, email: &str) -> Self {
        self.san = SanType::Rfc822Name(email.try_into().unwrap());
        self
    }

    fn with_uri(mut self, uri: &str) -> Self {
        self.san = SanType::URI(uri.try_into().unwrap());
        self
    }

    fn with_issuer(mut self, issuer: &str) -> Self {
        self.issuer = issuer.into();
        self
    }

    fn with_eku(mut self, eku: ExtendedKeyUsagePurpose) -> Self {
        self.eku = eku;
        self
    }

    /// The leaf is issued by `ca` instead of the pinned intermediate.
    fn issued_by(mut self, ca: &'f Ca) -> Self {
        self.ca = ca;
        self
    }

    fn with_sct(mut self, sct: SctMode) -> Self {
        self.sct = sct;
        self
    }

    fn with_payload(mut self, payload: Vec<u8>) -> Self {
        self.payload = payload;
        self
    }

    /// Rekor's integrated time (the SET is signed over it: only the time is off).
    fn with_integrated_time(mut self, t: u64) -> Self {
        self.integrated_time = t;
        self
    }

    /// The SET signed by `key`, the bundle still naming the pinned Rekor's log ID.
    fn with_set_signed_by(mut self, key: &'f Key) -> Self {
        self.set_key = key;
        self
    }

    /// The bundle names `key`'s log and its SET is signed by it.
    fn with_rekor(mut self, key: &'f Key) -> Self {
        self.set_key = key;
        self.log_id_key = key;
        self
    }

    /// Change the hashedrekord body before it is signed into the SET.
    fn with_body(mut self, edit: impl Fn(&mut Value) + 'static) -> Self {
        self.body_edit = Some(Box::new(edit));
        self
    }

    /// Change the bundle annotation after the SET is signed.
    fn with_bundle_edit(mut self, edit: impl Fn(&mut Value) + 'static) -> Self {
        self.bundle_edit = Some(Box::new(edit));
        self
    }

    fn without_bundle(mut self) -> Self {
        self.bundle = false;
        self
    }

    /// The chain annotation cosign writes (intermediate, then root).
    fn with_chain(mut self, chain: String) -> Self {
        self.chain = Some(chain);
        self
    }

    fn leaf_params(&self, sct: Option<Vec<u8>>) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.not_before = at(NOT_BEFORE).into();
        p.not_after = at(NOT_BEFORE + LIFETIME).into();
        p.serial_number = Some(SerialNumber::from_slice(&[0x3a, 0x51, 0x7f, 0x02, 0x99]));
        p.distinguished_name = DistinguishedName::new();
        p.subject_alt_names = vec![self.san.clone()];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![self.eku.clone()];
        p.use_authority_key_identifier_extension = true;
        let issuer = Utf8StringRef::new(&self.issuer).unwrap().to_der().unwrap();
        p.custom_extensions = vec![CustomExtension::from_oid_content(ISSUER_OID, issuer)];
        if let Some(value) = sct {
            p.custom_extensions.push(CustomExtension::from_oid_content(SCT_OID, value));
        }
        p
    }

    /// The leaf (DER): built once without the SCT list for the precertificate TBS the SCT
    /// signs, then again with the SCT list appended last.
    fn leaf(&self, key: &Key) -> Vec<u8> {
        let precert = self.leaf_params(None).signed_by(&key.rcgen, &self.ca.cert, &self.ca.key).unwrap();
        let tbs = x509_cert::Certificate::from_der(precert.der()).unwrap().tbs_certificate.to_der().unwrap();
        let issuer_spki = x509_cert::Certificate::from_der(self.ca.cert.der())
            .unwrap()
            .tbs_certificate
            .subject_public_key_info
            .to_der()
            .unwrap();
        let timestamp = NOT_BEFORE * 1000 + 1234;
        let f = self.f;
        let value = match &self.sct {
            SctMode::Absent => None,
            SctMode::Valid => Some(sct_list(&[sct(&f.ctlog, &f.ctlog, timestamp, &issuer_spki, &tbs)])),
            SctMode::UnknownLog => Some(sct_list(&[sct(&f.other, &f.other, timestamp, &issuer_spki, &tbs)])),
            SctMode::BadSignature => Some(sct_list(&[sct(&f.ctlog, &f.other, timestamp, &issuer_spki, &tbs)])),
            SctMode::SeveralLastValid => {
                let mut v2 = sct(&f.ctlog, &f.ctlog, timestamp, &issuer_spki, &tbs);
                v2[0] = 1;
                Some(sct_list(&[
                    sct(&f.other, &f.other, timestamp, &issuer_spki, &tbs),
                    v2,
                    sct(&f.ctlog, &f.ctlog, timestamp, &issuer_spki, &tbs),
                ]))
            }
            SctMode::List(list) => Some(list.clone()),
            SctMode::Extension(_) => None,
        };
        let value = match &self.sct {
            SctMode::Extension(raw) => Some(raw.clone()),
            _ => value.map(|list| OctetString::new(list).unwrap().to_der().unwrap()),
        };
        let leaf = self.leaf_params(value).signed_by(&key.rcgen, &self.ca.cert, &self.ca.key).unwrap();
        leaf.der().to_vec()
    }

    fn build(self) -> Signed {
        let key = Key::p256();
        let leaf_der = self.leaf(&key);
        let leaf_pem = pem::encode(&pem::Pem::new("CERTIFICATE", leaf_der));
        let signature = key.sign(&self.payload);

        let mut body = json!({
            "apiVersion": "0.0.1",
            "kind": "hashedrekord",
            "spec": {
                "data": {"hash": {"algorithm": "sha256", "value": hex::encode(sha256(&self.payload))}},
                "signature": {"content": b64(&signature), "publicKey": {"content": b64(leaf_pem.as_bytes())}}
            }
        });
        if let Some(edit) = &self.body_edit {
            edit(&mut body);
        }
        let body = b64(&serde_json::to_vec(&body).unwrap());
        let log_id = hex::encode(self.log_id_key.id());
        let (time, index) = (self.integrated_time, 4_242_424_u64);
        // Rekor's canonical JSON of the entry: keys sorted, no spaces.
        let canonical = format!(r#"{{"body":"{body}","integratedTime":{time},"logID":"{log_id}","logIndex":{index}}}"#);
        let set = self.set_key.sign(canonical.as_bytes());
        let mut bundle = json!({
            "SignedEntryTimestamp": b64(&set),
            "Payload": {"body": body, "integratedTime": time, "logIndex": index, "logID": log_id}
        });
        if let Some(edit) = &self.bundle_edit {
            edit(&mut bundle);
        }

        let mut signed = Signed::new(self.payload, &signature);
        signed.layer.certificate = Some(leaf_pem);
        signed.layer.chain = self.chain;
        signed.layer.bundle = self.bundle.then(|| bundle.to_string());
        signed
    }
}

/// One RFC 6962 v1 SCT over a precertificate, naming `log`, signed by `signer`.
fn sct(log: &Key, signer: &Key, timestamp: u64, issuer_spki: &[u8], tbs: &[u8]) -> Vec<u8> {
    let mut signed = vec![0, 0]; // v1, certificate_timestamp
    signed.extend_from_slice(&timestamp.to_be_bytes());
    signed.extend_from_slice(&1u16.to_be_bytes()); // precert_entry
    signed.extend_from_slice(&sha256(issuer_spki));
    signed.extend_from_slice(&(tbs.len() as u32).to_be_bytes()[1..]);
    signed.extend_from_slice(tbs);
    signed.extend_from_slice(&0u16.to_be_bytes()); // no extensions
    let signature = signer.sign(&signed);

    let mut out = vec![0]; // v1
    out.extend_from_slice(&log.id());
    out.extend_from_slice(&timestamp.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&[4, 3]); // sha256, ecdsa
    out.extend_from_slice(&(signature.len() as u16).to_be_bytes());
    out.extend_from_slice(&signature);
    out
}

/// A `SignedCertificateTimestampList`: u16-length list of u16-length SCTs.
fn sct_list(scts: &[Vec<u8>]) -> Vec<u8> {
    let mut list = Vec::new();
    for s in scts {
        list.extend_from_slice(&(s.len() as u16).to_be_bytes());
        list.extend_from_slice(s);
    }
    let mut out = (list.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(&list);
    out
}

/// What `trusted_root.json` pins: validity windows as `[start, end)` Unix seconds.
struct RootSpec {
    ca_chain: Vec<Vec<u8>>,
    ca_valid: (u64, Option<u64>),
    tlog_valid: (u64, Option<u64>),
    ctlog_valid: (u64, Option<u64>),
    tlog: Vec<u8>,
    ctlog: Vec<u8>,
    /// More `tlogs` entries, as written.
    more_tlogs: Vec<Value>,
}

impl RootSpec {
    fn json(&self) -> String {
        let valid = |(start, end): (u64, Option<u64>)| match end {
            Some(end) => json!({"start": rfc3339(start), "end": rfc3339(end)}),
            None => json!({"start": rfc3339(start)}),
        };
        let log = |spki: &[u8], v| {
            json!({
                "baseUrl": "https://log.example.com",
                "hashAlgorithm": "SHA2_256",
                "publicKey": {"rawBytes": b64(spki), "keyDetails": "PKIX_ECDSA_P256_SHA_256", "validFor": valid(v)},
                "logId": {"keyId": b64(&sha256(spki))}
            })
        };
        let chain: Vec<Value> = self.ca_chain.iter().map(|c| json!({"rawBytes": b64(c)})).collect();
        let mut tlogs = vec![log(&self.tlog, self.tlog_valid)];
        tlogs.extend(self.more_tlogs.iter().cloned());
        json!({
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": tlogs,
            "certificateAuthorities": [{
                "subject": {"organization": "tender test", "commonName": "fulcio"},
                "uri": "https://fulcio.example.com",
                "certChain": {"certificates": chain},
                "validFor": valid(self.ca_valid)
            }],
            "ctlogs": [log(&self.ctlog, self.ctlog_valid)],
            "timestampAuthorities": []
        })
        .to_string()
    }
}

/// The test Sigstore: a Fulcio, a CT log, a Rekor, a cosign key pair and an image digest.
struct Fixture {
    root: Ca,
    intermediate: Ca,
    ctlog: Key,
    rekor: Key,
    /// The key of keyed signatures (`cosign generate-key-pair`).
    keyed: Key,
    /// A key nobody trusts.
    other: Key,
    digest: Digest,
}

impl Fixture {
    fn new() -> Fixture {
        let root = Ca::root("fulcio root");
        let intermediate = Ca::intermediate("fulcio intermediate", &root);
        Fixture {
            root,
            intermediate,
            ctlog: Key::p256(),
            rekor: Key::p256(),
            keyed: Key::p256(),
            other: Key::p256(),
            digest: Digest::of(b"the image manifest"),
        }
    }

    /// cosign's simple-signing payload for `digest`.
    fn payload_for(digest: &Digest) -> Vec<u8> {
        format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"{IMAGE}"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
        )
        .into_bytes()
    }

    fn payload(&self) -> Vec<u8> {
        Fixture::payload_for(&self.digest)
    }

    /// A keyless signature of the image, by [`SUBJECT`] from [`ISSUER`], all valid.
    fn keyless(&self) -> KeylessBuilder<'_> {
        KeylessBuilder {
            f: self,
            san: SanType::Rfc822Name(SUBJECT.try_into().unwrap()),
            issuer: ISSUER.into(),
            eku: ExtendedKeyUsagePurpose::CodeSigning,
            ca: &self.intermediate,
            sct: SctMode::Valid,
            payload: self.payload(),
            integrated_time: SIGNED_AT,
            set_key: &self.rekor,
            log_id_key: &self.rekor,
            body_edit: None,
            bundle_edit: None,
            bundle: true,
            chain: None,
        }
    }

    fn keyless_candidate(&self) -> Signed {
        self.keyless().build()
    }

    /// A keyed signature of `payload` by `key`.
    fn keyed_by(key: &Key, payload: Vec<u8>) -> Signed {
        let signature = key.sign(&payload);
        Signed::new(payload, &signature)
    }

    fn keyed_candidate(&self) -> Signed {
        Fixture::keyed_by(&self.keyed, self.payload())
    }

    /// cosign's chain annotation for the pinned Fulcio.
    fn chain_pem(&self) -> String {
        format!("{}{}", self.intermediate.pem(), self.root.pem())
    }

    fn root_spec(&self) -> RootSpec {
        RootSpec {
            ca_chain: vec![self.intermediate.der(), self.root.der()],
            ca_valid: (TRUST_START, None),
            tlog_valid: (TRUST_START, None),
            ctlog_valid: (TRUST_START, None),
            tlog: self.rekor.spki(),
            ctlog: self.ctlog.spki(),
            more_tlogs: Vec::new(),
        }
    }

    fn policy(&self, rules: Vec<RawRule>) -> Policy {
        self.policy_with(&self.root_spec(), rules)
    }

    fn policy_with(&self, root: &RootSpec, rules: Vec<RawRule>) -> Policy {
        let raw = RawPolicy { trusted_root: Some("trusted_root.json".into()), rules, ..RawPolicy::default() };
        Policy::compile(&raw, Some(root.json().as_bytes())).unwrap()
    }

    /// Verify `sigs` of the fixture's digest under the rule `IMAGE` matches.
    fn verify(&self, policy: &Policy, sigs: &[&Signed]) -> Result<Verdict, Failure> {
        let rule = policy.rule_for(IMAGE).expect("a rule for the image");
        let found: Vec<Candidate<'_>> = sigs.iter().map(|s| s.candidate()).collect();
        verify(policy, rule, &self.digest, &found)
    }
}

fn keyless_rule(subject: &str, issuer: &str) -> RawRule {
    RawRule {
        image: PATTERN.into(),
        keyless: Some(RawKeyless { issuer: Some(issuer.into()), subject: Some(subject.into()), subject_regex: None }),
        ..RawRule::default()
    }
}

fn keyless_regex_rule(regex: &str, issuer: &str) -> RawRule {
    RawRule {
        image: PATTERN.into(),
        keyless: Some(RawKeyless { issuer: Some(issuer.into()), subject: None, subject_regex: Some(regex.into()) }),
        ..RawRule::default()
    }
}

fn key_rule(pem: &str) -> RawRule {
    RawRule {
        image: PATTERN.into(),
        public_key: Some(RawPublicKey { certificate: None, key: Some(pem.into()) }),
        ..RawRule::default()
    }
}

fn certificate_rule(pem: &str) -> RawRule {
    RawRule {
        image: PATTERN.into(),
        public_key: Some(RawPublicKey { certificate: Some(pem.into()), key: None }),
        ..RawRule::default()
    }
}

fn rule(image: &str, skip: bool, deny: bool) -> RawRule {
    RawRule { image: image.into(), skip, deny, ..RawRule::default() }
}

/// The failure is `DoesNotVerify` and its text carries `why`.
#[track_caller]
fn assert_invalid(r: Result<Verdict, Failure>, why: &str) {
    match r {
        Err(f @ Failure::DoesNotVerify(_)) => {
            let text = f.to_string();
            assert!(text.starts_with("signature does not verify: "), "{text}");
            assert!(text.contains(why), "{text:?} does not say {why:?}");
            assert_eq!(f.label(), "invalid");
        }
        other => panic!("expected DoesNotVerify({why:?}), got {other:?}"),
    }
}

#[track_caller]
fn assert_mismatch(r: Result<Verdict, Failure>, got: &str) {
    match r {
        Err(f @ Failure::IdentityMismatch(_)) => {
            assert_eq!(f.to_string(), format!("identity mismatch: got {got}"));
            assert_eq!(f.label(), "mismatch");
        }
        other => panic!("expected IdentityMismatch({got:?}), got {other:?}"),
    }
}

// ---- positive ----

#[test]
fn should_verify_a_keyless_signature_by_subject_and_issuer() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let v = f.verify(&policy, &[&f.keyless_candidate()]).unwrap();
    assert_eq!(v.method, "keyless");
    assert_eq!(v.identity, SUBJECT);
}

#[test]
fn should_verify_a_keyless_signature_with_cosigns_chain_annotation() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_chain(f.chain_pem()).build();
    assert!(f.verify(&policy, &[&sig]).is_ok());
}

#[test]
fn should_verify_a_keyless_signature_by_subject_regex() {
    let f = Fixture::new();
    let workflow = "https://github.com/example/app/.github/workflows/release.yml@refs/tags/v1.2.3";
    let issuer = "https://token.actions.githubusercontent.com";
    let policy = f.policy(vec![keyless_regex_rule(
        r"^https://github\.com/example/app/\.github/workflows/release\.yml@refs/tags/v.*$",
        issuer,
    )]);
    let sig = f.keyless().with_uri(workflow).with_issuer(issuer).build();
    let v = f.verify(&policy, &[&sig]).unwrap();
    assert_eq!(v.identity, workflow);
    assert_eq!(v.issuer.as_deref(), Some(issuer));
}

#[test]
fn should_verify_a_keyed_signature_with_public_key_key() {
    let f = Fixture::new();
    let policy = f.policy(vec![key_rule(&f.keyed.pem())]);
    let v = f.verify(&policy, &[&f.keyed_candidate()]).unwrap();
    assert_eq!(v.method, "key");
}

#[test]
fn should_verify_a_keyed_signature_with_public_key_certificate() {
    let f = Fixture::new();
    let cert =
        CertificateParams::new(vec!["signer.example.com".to_string()]).unwrap().self_signed(&f.keyed.rcgen).unwrap();
    let policy = f.policy(vec![certificate_rule(&cert.pem())]);
    let v = f.verify(&policy, &[&f.keyed_candidate()]).unwrap();
    assert_eq!(v.method, "key");
    assert_eq!(v.identity, format!("sha256:{}", hex::encode(f.keyed.id())));
}

#[test]
fn should_report_the_verdict_fields() {
    let f = Fixture::new();
    let rules = vec![rule("docker.io/*", false, true), keyless_rule(SUBJECT, ISSUER), rule("*", true, false)];
    let policy = f.policy(rules);
    let v = f.verify(&policy, &[&f.keyless_candidate()]).unwrap();
    assert_eq!(
        v,
        Verdict {
            rule: 1,
            image: PATTERN.into(),
            fingerprint: policy.rules[1].fingerprint.clone(),
            method: "keyless",
            identity: SUBJECT.into(),
            issuer: Some(ISSUER.into()),
            signed_at: Some(SIGNED_AT),
        }
    );

    let rules = vec![rule("docker.io/*", true, false), key_rule(&f.keyed.pem())];
    let policy = f.policy(rules);
    let v = f.verify(&policy, &[&f.keyed_candidate()]).unwrap();
    assert_eq!(
        v,
        Verdict {
            rule: 1,
            image: PATTERN.into(),
            fingerprint: policy.rules[1].fingerprint.clone(),
            method: "key",
            identity: format!("sha256:{}", hex::encode(f.keyed.id())),
            issuer: None,
            signed_at: None,
        }
    );
}

#[test]
fn should_take_the_first_signature_that_verifies() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let bad = f.keyless().without_bundle().build();
    let other = f.keyless().with_email("intruder@example.com").build();
    let good = f.keyless_candidate();
    assert!(f.verify(&policy, &[&bad, &other, &good]).is_ok());
    // None verifies: a mismatch says more than an invalid signature.
    assert_mismatch(f.verify(&policy, &[&bad, &other]), &format!("intruder@example.com from {ISSUER}"));
}

#[test]
fn should_verify_a_leaf_issued_by_a_root_alone() {
    // Fulcio's first CA had no intermediate: the SCT's issuer key is then the root's.
    let f = Fixture::new();
    let root = RootSpec { ca_chain: vec![f.root.der()], ..f.root_spec() };
    let policy = f.policy_with(&root, vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().issued_by(&f.root).build();
    assert!(f.verify(&policy, &[&sig]).is_ok());
}

/// The Rekor v2 log of Sigstore's public-good `trusted_root.json` (since 2025-09): its
/// `logId.keyId` is the signed-note key ID, not the SHA-256 of its key.
fn rekor_v2_tlog() -> Value {
    json!({
        "baseUrl": "https://log2025-1.rekor.sigstore.dev",
        "hashAlgorithm": "SHA2_256",
        "publicKey": {
            "rawBytes": "MCowBQYDK2VwAyEAt8rlp1knGwjfbcXAYPYAkn0XiLz1x8O4t0YkEhie244=",
            "keyDetails": "PKIX_ED25519",
            "validFor": {"start": "2025-09-23T00:00:00Z"}
        },
        "logId": {"keyId": "zxGZFVvd0FEmjR8WrFwMdcAJ9vtaY/QXf44Y1wUeP6A="}
    })
}

#[test]
fn should_load_the_public_good_root_with_its_rekor_v2_log() {
    let f = Fixture::new();
    let v2 = rekor_v2_tlog();
    let spki = STANDARD.decode(v2["publicKey"]["rawBytes"].as_str().unwrap()).unwrap();
    let key_id = STANDARD.decode(v2["logId"]["keyId"].as_str().unwrap()).unwrap();
    assert_ne!(sha256(&spki).to_vec(), key_id, "the premise: the v2 log ID is not the key's hash");

    let root = RootSpec { more_tlogs: vec![v2], ..f.root_spec() };
    let policy = f.policy_with(&root, vec![keyless_rule(SUBJECT, ISSUER)]);
    let trusted = policy.trusted_root.as_ref().unwrap();
    assert!(trusted.tlog(&key_id).is_some());
    assert!(trusted.tlog(&f.rekor.id()).is_some());
    assert!(f.verify(&policy, &[&f.keyless_candidate()]).is_ok());

    // A log ID that cannot be one is still refused, naming the key.
    let mut bad = rekor_v2_tlog();
    bad["logId"]["keyId"] = json!(b64(b"short"));
    let root = RootSpec { more_tlogs: vec![bad], ..f.root_spec() };
    let raw = RawPolicy { trusted_root: Some("trusted_root.json".into()), ..RawPolicy::default() };
    let e = Policy::compile(&raw, Some(root.json().as_bytes())).unwrap_err();
    assert_eq!(e.key, "imageVerification.trustedRoot");
    assert!(e.problem.contains("tlogs[1].logId"), "{e}");
}

// ---- negative: who signed ----

#[test]
fn should_refuse_a_keyed_signature_by_another_key() {
    let f = Fixture::new();
    let policy = f.policy(vec![key_rule(&f.keyed.pem())]);
    let sig = Fixture::keyed_by(&f.other, f.payload());
    let want = format!("not signed by the key sha256:{}", hex::encode(f.keyed.id()));
    assert_invalid(f.verify(&policy, &[&sig]), &want);
}

#[test]
fn should_refuse_a_keyless_signature_by_another_subject() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_email("intruder@example.com").build();
    assert_mismatch(f.verify(&policy, &[&sig]), &format!("intruder@example.com from {ISSUER}"));
}

#[test]
fn should_refuse_a_keyless_signature_not_matching_the_subject_regex() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_regex_rule(r"^[a-z]+@example\.com$", ISSUER)]);
    let sig = f.keyless().with_email("builder@example.com.evil.org").build();
    assert_mismatch(f.verify(&policy, &[&sig]), &format!("builder@example.com.evil.org from {ISSUER}"));
}

#[test]
fn should_refuse_a_keyless_signature_from_another_issuer() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_issuer("https://accounts.evil.org").build();
    assert_mismatch(f.verify(&policy, &[&sig]), &format!("{SUBJECT} from https://accounts.evil.org"));
}

#[test]
fn should_refuse_a_keyed_signature_under_a_keyless_rule() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    assert_invalid(f.verify(&policy, &[&f.keyed_candidate()]), "a signature without a certificate");
}

#[test]
fn should_refuse_a_certificate_from_an_untrusted_ca() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let rogue_root = Ca::root("fulcio root");
    let rogue = Ca::intermediate("fulcio intermediate", &rogue_root);
    let sig = f.keyless().issued_by(&rogue).build();
    assert_invalid(f.verify(&policy, &[&sig]), "does not chain to https://fulcio.example.com");
    // The chain annotation is the signer's word: it cannot add a root.
    let sig = f.keyless().issued_by(&rogue).with_chain(format!("{}{}", rogue.pem(), rogue_root.pem())).build();
    assert_invalid(f.verify(&policy, &[&sig]), "does not chain to https://fulcio.example.com");
}

#[test]
fn should_refuse_a_certificate_without_code_signing() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_eku(ExtendedKeyUsagePurpose::ServerAuth).build();
    assert_invalid(f.verify(&policy, &[&sig]), "does not chain to");
}

// ---- negative: when ----

#[test]
fn should_refuse_a_signing_time_after_the_certificate_expired() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_integrated_time(NOT_BEFORE + LIFETIME + 1).build();
    assert_invalid(f.verify(&policy, &[&sig]), "is outside the certificate's validity");
    // The last second of the ten minutes still counts.
    let sig = f.keyless().with_integrated_time(NOT_BEFORE + LIFETIME).build();
    assert!(f.verify(&policy, &[&sig]).is_ok());
}

#[test]
fn should_refuse_a_signing_time_before_the_certificate() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_integrated_time(NOT_BEFORE - 1).build();
    assert_invalid(f.verify(&policy, &[&sig]), "is outside the certificate's validity");
}

#[test]
fn should_refuse_when_no_ca_of_the_trusted_root_was_valid_at_signing_time() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless_candidate();
    for ca_valid in [(TRUST_START, Some(SIGNED_AT)), (SIGNED_AT + 1, None)] {
        let root = RootSpec { ca_valid, ..f.root_spec() };
        let policy = f.policy_with(&root, vec![keyless_rule(SUBJECT, ISSUER)]);
        assert_invalid(f.verify(&policy, &[&sig]), "no certificate authority in the trusted root was valid");
    }
    assert!(f.verify(&policy, &[&sig]).is_ok());
}

#[test]
fn should_refuse_when_the_rekor_key_was_not_valid_at_signing_time() {
    let f = Fixture::new();
    let root = RootSpec { tlog_valid: (TRUST_START, Some(SIGNED_AT - 1)), ..f.root_spec() };
    let policy = f.policy_with(&root, vec![keyless_rule(SUBJECT, ISSUER)]);
    assert_invalid(f.verify(&policy, &[&f.keyless_candidate()]), "the Rekor key was not valid at the integrated time");
}

// ---- negative: what was signed ----

#[test]
fn should_refuse_a_tampered_payload() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless_candidate().with_tampered_payload();
    assert_invalid(f.verify(&policy, &[&sig]), "the signature is not the certificate's over this payload");

    let policy = f.policy(vec![key_rule(&f.keyed.pem())]);
    let sig = f.keyed_candidate().with_tampered_payload();
    assert_invalid(f.verify(&policy, &[&sig]), "not signed by the key");
}

#[test]
fn should_refuse_a_payload_that_is_not_the_layers_digest() {
    let f = Fixture::new();
    let policy = f.policy(vec![key_rule(&f.keyed.pem())]);
    let mut sig = f.keyed_candidate();
    sig.layer.payload = Digest::of(b"something else");
    assert_invalid(f.verify(&policy, &[&sig]), "the payload is not the layer's digest");
}

#[test]
fn should_refuse_a_payload_naming_another_digest() {
    let f = Fixture::new();
    let elsewhere = Digest::of(b"another image");
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_payload(Fixture::payload_for(&elsewhere)).build();
    assert_invalid(f.verify(&policy, &[&sig]), &format!("payload names another digest ({elsewhere})"));

    let policy = f.policy(vec![key_rule(&f.keyed.pem())]);
    let sig = Fixture::keyed_by(&f.keyed, Fixture::payload_for(&elsewhere));
    assert_invalid(f.verify(&policy, &[&sig]), &format!("payload names another digest ({elsewhere})"));
}

#[test]
fn should_refuse_a_payload_of_another_type() {
    let f = Fixture::new();
    let policy = f.policy(vec![key_rule(&f.keyed.pem())]);
    let payload = String::from_utf8(f.payload()).unwrap().replace("cosign container image", "atomic container");
    let sig = Fixture::keyed_by(&f.keyed, payload.into_bytes());
    assert_invalid(f.verify(&policy, &[&sig]), "payload type \"atomic container signature\"");
}

#[test]
fn should_refuse_a_signature_that_is_not_base64() {
    let f = Fixture::new();
    let policy = f.policy(vec![key_rule(&f.keyed.pem())]);
    let mut sig = f.keyed_candidate();
    sig.layer.signature = "not base64!".into();
    assert_invalid(f.verify(&policy, &[&sig]), "the signature is not base64");
}

#[test]
fn should_say_no_signature_when_there_is_none() {
    let f = Fixture::new();
    for policy in [f.policy(vec![keyless_rule(SUBJECT, ISSUER)]), f.policy(vec![key_rule(&f.keyed.pem())])] {
        let r = f.verify(&policy, &[]);
        assert_eq!(r, Err(Failure::NoSignature));
        let e = r.unwrap_err();
        assert_eq!(e.to_string(), "no signature");
        assert_eq!(e.label(), "unsigned");
    }
}

// ---- negative: Rekor ----

#[test]
fn should_refuse_a_keyless_signature_without_its_rekor_bundle() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().without_bundle().build();
    assert_invalid(f.verify(&policy, &[&sig]), "no Rekor bundle");
}

#[test]
fn should_refuse_a_malformed_rekor_bundle() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|b| b["Payload"]["integratedTime"] = json!(-1)), "integrated time is negative"),
        (Box::new(|b| b["Payload"]["logID"] = json!("not hex")), "logID is not hex"),
        (Box::new(|b| b["SignedEntryTimestamp"] = json!("%%%")), "SignedEntryTimestamp: not base64"),
        (Box::new(|b| *b = json!({"Payload": b["Payload"].clone()})), "not JSON of cosign's form"),
        (Box::new(|b| b["padding"] = json!("x".repeat(70_000))), "a Rekor bundle of more than"),
    ];
    for (edit, why) in cases {
        let sig = f.keyless().with_bundle_edit(edit).build();
        assert_invalid(f.verify(&policy, &[&sig]), why);
    }
    let mut sig = f.keyless_candidate();
    sig.layer.certificate = Some("x".repeat(70_000));
    assert_invalid(f.verify(&policy, &[&sig]), "a certificate annotation of more than");
}

#[test]
fn should_refuse_a_set_from_an_unknown_rekor() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_rekor(&f.other).build();
    let want = format!("Rekor log {} is not in the trusted root", hex::encode(f.other.id()));
    assert_invalid(f.verify(&policy, &[&sig]), &want);
    // The pinned log's ID, another key's signature.
    let sig = f.keyless().with_set_signed_by(&f.other).build();
    assert_invalid(f.verify(&policy, &[&sig]), "signed entry timestamp does not verify with the pinned Rekor key");
}

#[test]
fn should_refuse_a_tampered_set() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let edits: Vec<Edit> = vec![
        Box::new(|b| b["Payload"]["integratedTime"] = json!(SIGNED_AT + 1)),
        Box::new(|b| b["Payload"]["logIndex"] = json!(1)),
        Box::new(|b| {
            let mut set = STANDARD.decode(b["SignedEntryTimestamp"].as_str().unwrap()).unwrap();
            let last = set.len() - 1;
            set[last] ^= 1;
            b["SignedEntryTimestamp"] = json!(b64(&set));
        }),
    ];
    for edit in edits {
        let sig = f.keyless().with_bundle_edit(edit).build();
        assert_invalid(f.verify(&policy, &[&sig]), "signed entry timestamp does not verify");
    }
}

#[test]
fn should_refuse_a_rekor_entry_of_another_payload_signature_or_certificate() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_body(|b| b["spec"]["data"]["hash"]["value"] = json!(hex::encode([7u8; 32]))).build();
    assert_invalid(f.verify(&policy, &[&sig]), "the Rekor entry records another payload");

    let sig = f.keyless().with_body(|b| b["spec"]["signature"]["content"] = json!(b64(b"another"))).build();
    assert_invalid(f.verify(&policy, &[&sig]), "the Rekor entry records another signature");

    let other_leaf = f.keyless_candidate().layer.certificate.unwrap();
    let sig = f
        .keyless()
        .with_body(move |b| b["spec"]["signature"]["publicKey"]["content"] = json!(b64(other_leaf.as_bytes())))
        .build();
    assert_invalid(f.verify(&policy, &[&sig]), "the Rekor entry records another certificate");

    let sig = f.keyless().with_body(|b| b["kind"] = json!("intoto")).build();
    assert_invalid(f.verify(&policy, &[&sig]), "a Rekor entry of kind \"intoto\"");
}

// ---- negative: SCT ----

#[test]
fn should_refuse_a_certificate_without_an_sct() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_sct(SctMode::Absent).build();
    assert_invalid(f.verify(&policy, &[&sig]), "the certificate carries no SCT");
    let sig = f.keyless().with_sct(SctMode::List(sct_list(&[]))).build();
    assert_invalid(f.verify(&policy, &[&sig]), "no SCT is from a CT log in the trusted root");
}

#[test]
fn should_accept_the_one_valid_sct_among_several() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_sct(SctMode::SeveralLastValid).build();
    assert!(f.verify(&policy, &[&sig]).is_ok());
}

#[test]
fn should_refuse_an_sct_from_an_unknown_log() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_sct(SctMode::UnknownLog).build();
    assert_invalid(f.verify(&policy, &[&sig]), "no SCT is from a CT log in the trusted root");
}

#[test]
fn should_refuse_an_sct_with_a_bad_signature() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_sct(SctMode::BadSignature).build();
    assert_invalid(f.verify(&policy, &[&sig]), "the SCT does not verify with its CT log's key");
}

#[test]
fn should_refuse_an_sct_from_a_log_key_not_valid_at_its_timestamp() {
    let f = Fixture::new();
    let root = RootSpec { ctlog_valid: (NOT_BEFORE + 2, None), ..f.root_spec() };
    let policy = f.policy_with(&root, vec![keyless_rule(SUBJECT, ISSUER)]);
    assert_invalid(f.verify(&policy, &[&f.keyless_candidate()]), "the SCT's CT log key was not valid at its timestamp");
}

// ---- skip and deny ----

#[test]
fn should_apply_the_first_matching_rule_and_leave_skip_and_deny_to_the_fetch_layer() {
    let f = Fixture::new();
    let rules = vec![
        rule("ghcr.io/example/legacy", true, false),
        rule("ghcr.io/example/*-debug", false, true),
        keyless_rule(SUBJECT, ISSUER),
        rule("*", false, true),
    ];
    let policy = f.policy(rules);
    let index = |image: &str| policy.rule_for(image).map(|r| r.index);
    assert_eq!(index("ghcr.io/example/legacy"), Some(0));
    assert_eq!(index("ghcr.io/example/app-debug"), Some(1));
    assert_eq!(index(IMAGE), Some(2));
    assert_eq!(index("docker.io/library/alpine"), Some(3));
    assert!(matches!(policy.rules[0].action, Action::Skip));
    assert!(matches!(policy.rules[1].action, Action::Deny));
    assert!(!policy.rules[0].verifies() && !policy.rules[1].verifies() && policy.rules[2].verifies());

    // A signature that verifies under rule 2 verifies nothing under skip or deny.
    let sig = f.keyless_candidate();
    for r in &policy.rules[..2] {
        let res = verify(&policy, r, &f.digest, &[sig.candidate()]);
        assert_invalid(res, "the rule does not verify");
    }
    assert!(verify(&policy, &policy.rules[2], &f.digest, &[sig.candidate()]).is_ok());
    let no_rules = f.policy(vec![]);
    assert!(no_rules.rule_for(IMAGE).is_none());
}

// ---- garbage in, Err out, never a panic ----

#[test]
fn should_refuse_every_truncation_of_the_bundle_and_certificate() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_chain(f.chain_pem()).build();
    let bundle = sig.layer.bundle.clone().unwrap();
    for n in 0..bundle.len() {
        let mut s = sig.clone();
        s.layer.bundle = Some(bundle[..n].to_string());
        assert!(matches!(f.verify(&policy, &[&s]), Err(Failure::DoesNotVerify(_))), "bundle[..{n}]");
    }
    let certificate = sig.layer.certificate.clone().unwrap();
    let der = pem::parse(&certificate).unwrap().into_contents();
    for n in 0..der.len() {
        let mut s = sig.clone();
        s.layer.certificate = Some(pem::encode(&pem::Pem::new("CERTIFICATE", der[..n].to_vec())));
        assert!(matches!(f.verify(&policy, &[&s]), Err(Failure::DoesNotVerify(_))), "der[..{n}]");
    }
    // Up to the last byte of `-----END CERTIFICATE-----` (without the final newline it is whole).
    for n in 0..certificate.trim_end().len() {
        let mut s = sig.clone();
        s.layer.certificate = Some(certificate[..n].to_string());
        assert!(matches!(f.verify(&policy, &[&s]), Err(Failure::DoesNotVerify(_))), "pem[..{n}]");
        let mut s = sig.clone();
        s.layer.chain = Some(certificate[..n].to_string());
        let _ = f.verify(&policy, &[&s]); // a broken chain annotation: any answer but a panic
    }
}

#[test]
fn should_refuse_truncated_and_garbled_scts() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    // A well-formed SCT list, taken from a valid leaf, cut short inside other leaves.
    let good = f.keyless_candidate();
    let der = pem::parse(good.layer.certificate.as_deref().unwrap()).unwrap().into_contents();
    let cert = x509_cert::Certificate::from_der(&der).unwrap();
    let ext = cert.tbs_certificate.extensions.unwrap().into_iter().last().unwrap();
    let list = OctetString::from_der(ext.extn_value.as_bytes()).unwrap().as_bytes().to_vec();
    for n in 0..list.len() {
        let sig = f.keyless().with_sct(SctMode::List(list[..n].to_vec())).build();
        assert_invalid(f.verify(&policy, &[&sig]), "the SCT list is malformed");
    }
    let mut runner = TestRunner::new(Config { cases: 64, ..Config::default() });
    let garbage = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200).prop_map(SctMode::List),
        proptest::collection::vec(any::<u8>(), 0..200).prop_map(SctMode::Extension),
    ];
    runner
        .run(&garbage, |sct| {
            let sig = f.keyless().with_sct(sct).build();
            prop_assert!(matches!(f.verify(&policy, &[&sig]), Err(Failure::DoesNotVerify(_))));
            Ok(())
        })
        .unwrap();
}

#[test]
fn should_never_panic_on_garbled_annotations() {
    let f = Fixture::new();
    let policy = f.policy(vec![keyless_rule(SUBJECT, ISSUER)]);
    let sig = f.keyless().with_chain(f.chain_pem()).build();
    let leaf_der = pem::parse(sig.layer.certificate.as_deref().unwrap()).unwrap().into_contents();
    let mut runner = TestRunner::new(Config { cases: 512, ..Config::default() });
    let strategy = (0..3usize, any::<prop::sample::Index>(), 1..=255u8);
    runner
        .run(&strategy, |(field, i, x)| {
            let mut s = sig.clone();
            let text = match field {
                0 => s.layer.bundle.as_mut().unwrap(),
                1 => s.layer.certificate.as_mut().unwrap(),
                _ => s.layer.chain.as_mut().unwrap(),
            };
            let mut bytes = std::mem::take(text).into_bytes();
            let at = i.index(bytes.len());
            bytes[at] ^= x;
            *text = String::from_utf8_lossy(&bytes).into_owned();
            match (field, f.verify(&policy, &[&s])) {
                (_, Err(Failure::DoesNotVerify(_))) => {}
                // PEM tolerates some changes (whitespace); then the leaf must be the same DER.
                (1, Ok(_)) => {
                    let der = pem::parse(s.layer.certificate.as_deref().unwrap()).unwrap().into_contents();
                    prop_assert_eq!(der, leaf_der.clone());
                }
                // The chain annotation only offers intermediates: garbling it may not matter.
                (2, Ok(_)) => {}
                (_, other) => prop_assert!(false, "garbled field {} at {}: {:?}", field, at, other),
            }
            Ok(())
        })
        .unwrap();
    // And the leaf itself, re-encoded as PEM with one DER byte garbled.
    runner
        .run(&(any::<prop::sample::Index>(), 1..=255u8), |(i, x)| {
            let mut der = leaf_der.clone();
            let at = i.index(der.len());
            der[at] ^= x;
            let mut s = sig.clone();
            s.layer.certificate = Some(pem::encode(&pem::Pem::new("CERTIFICATE", der)));
            prop_assert!(matches!(f.verify(&policy, &[&s]), Err(Failure::DoesNotVerify(_))), "leaf[{}]", at);
            Ok(())
        })
        .unwrap();
}
