//! Sigstore bundles (`application/vnd.dev.sigstore.bundle.v0.3+json` and earlier), as cosign v3
//! stores an image's signature: an OCI referrer (or a `sha256-<hex>` tag) whose layer is the
//! bundle. The bundle signs an in-toto statement (DSSE) whose subject is the image's manifest
//! digest — that subject, never the referrer's unsigned `subject` field, ties it to the image —
//! or, as a message signature, the manifest bytes themselves.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tender_oci::Digest;

use crate::keyless::{self, Signer, Tlog};
use crate::keys::PublicKey;
use crate::root::{b64, TrustedRoot};

/// The media type prefix of every Sigstore bundle version.
pub const BUNDLE_MEDIA_TYPE_PREFIX: &str = "application/vnd.dev.sigstore.bundle";
/// The artifact type cosign v3 gives the referrer (and the media type of its layer).
pub const BUNDLE_V03: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The largest bundle read.
pub const MAX_BUNDLE: u64 = 256 << 10;
/// Bundles looked at for one digest.
pub const MAX_BUNDLES: usize = 16;
/// The predicate cosign gives a signature statement: an attestation of anything else (an
/// SBOM, provenance) is not a signature.
pub const SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Bundle {
    media_type: String,
    verification_material: Material,
    dsse_envelope: Option<Envelope>,
    message_signature: Option<MessageSignature>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Material {
    certificate: Option<Raw>,
    x509_certificate_chain: Option<Chain>,
    public_key: Option<serde_json::Value>,
    #[serde(default)]
    tlog_entries: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    raw_bytes: String,
}

#[derive(Deserialize)]
struct Chain {
    certificates: Vec<Raw>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    log_index: String,
    log_id: LogId,
    kind_version: KindVersion,
    integrated_time: Option<String>,
    inclusion_promise: Option<Promise>,
    canonicalized_body: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogId {
    key_id: String,
}

#[derive(Deserialize)]
struct KindVersion {
    kind: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Promise {
    signed_entry_timestamp: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    payload: String,
    payload_type: String,
    signatures: Vec<EnvelopeSignature>,
}

#[derive(Deserialize)]
struct EnvelopeSignature {
    sig: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageSignature {
    message_digest: MessageDigest,
    signature: String,
}

#[derive(Deserialize)]
struct MessageDigest {
    algorithm: String,
    digest: String,
}

#[derive(Deserialize)]
struct Statement {
    #[serde(rename = "_type")]
    kind: String,
    #[serde(rename = "predicateType")]
    predicate_type: String,
    subject: Vec<Subject>,
}

#[derive(Deserialize)]
struct Subject {
    digest: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct DsseBody {
    kind: String,
    spec: DsseSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DsseSpec {
    payload_hash: Hash,
    signatures: Vec<DsseBodySignature>,
}

#[derive(Deserialize)]
struct Hash {
    algorithm: String,
    value: String,
}

#[derive(Deserialize)]
struct DsseBodySignature {
    signature: String,
    verifier: String,
}

#[derive(Deserialize)]
struct HashedBody {
    kind: String,
    spec: HashedSpec,
}

#[derive(Deserialize)]
struct HashedSpec {
    data: HashedData,
    signature: HashedSignature,
}

#[derive(Deserialize)]
struct HashedData {
    hash: Hash,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HashedSignature {
    content: String,
    public_key: HashedKey,
}

#[derive(Deserialize)]
struct HashedKey {
    content: String,
}

/// What a bundle signs and with what, once its signature over it is checked.
struct Signed {
    /// The certificate chain (DER, leaf first); empty for a key.
    ders: Vec<Vec<u8>>,
    signature: Vec<u8>,
    /// For the Rekor entry: the DSSE payload's SHA-256, or the message digest.
    hashed: [u8; 32],
    dsse: bool,
}

/// How a bundle is to be verified: with a key, or keyless against the trusted root.
pub enum Trust<'a> {
    Key(&'a PublicKey),
    Root(&'a TrustedRoot),
}

/// Verify a bundle for the manifest `digest` (whose bytes are `manifest`). Keyless: returns
/// who signed and when; with a key: `Signer` names the key's fingerprint.
pub fn verify(trust: Trust<'_>, bundle: &[u8], digest: &Digest, manifest: &[u8]) -> Result<Signer, String> {
    if bundle.len() as u64 > MAX_BUNDLE {
        return Err(format!("a bundle of more than {MAX_BUNDLE} bytes"));
    }
    let b: Bundle = serde_json::from_slice(bundle).map_err(|e| format!("not a Sigstore bundle: {e}"))?;
    if !b.media_type.starts_with(BUNDLE_MEDIA_TYPE_PREFIX) {
        return Err(format!("mediaType {:?} is not a Sigstore bundle", b.media_type));
    }
    let m = &b.verification_material;
    let ders: Vec<Vec<u8>> = match (&m.certificate, &m.x509_certificate_chain) {
        (Some(c), _) => vec![b64(&c.raw_bytes).map_err(|e| format!("the certificate: {e}"))?],
        (None, Some(chain)) => chain
            .certificates
            .iter()
            .map(|c| b64(&c.raw_bytes))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("the certificate chain: {e}"))?,
        (None, None) => Vec::new(),
    };
    let key = match (&trust, ders.first()) {
        (Trust::Key(k), _) => (*k).clone(),
        (Trust::Root(_), Some(leaf)) => PublicKey::of_certificate(leaf)?,
        (Trust::Root(_), None) if m.public_key.is_some() => {
            return Err("a bundle signed with a key, under a keyless rule".into())
        }
        (Trust::Root(_), None) => return Err("the bundle carries no certificate".into()),
    };
    let signed = signed_content(&b, &key, digest, manifest, ders)?;
    match trust {
        Trust::Key(k) => {
            Ok(Signer { subjects: vec![k.fingerprint()], issuer: String::new(), signed_at: 0, log_index: -1 })
        }
        Trust::Root(root) => {
            let entry = m.tlog_entries.first().ok_or("the bundle has no transparency log entry")?;
            let promise = entry.inclusion_promise.as_ref().ok_or(
                "the bundle's log entry has no signed entry timestamp (a Rekor v2 entry needs a timestamp authority, not supported yet)",
            )?;
            let integrated = entry.integrated_time.as_deref().unwrap_or("0");
            let integrated_time: i64 =
                integrated.parse().map_err(|_| "the log entry's integratedTime is not a number")?;
            let log_index: i64 = entry.log_index.parse().map_err(|_| "the log entry's logIndex is not a number")?;
            let log_id = hex::encode(b64(&entry.log_id.key_id).map_err(|e| format!("the log entry's logId: {e}"))?);
            let set = b64(&promise.signed_entry_timestamp).map_err(|e| format!("signedEntryTimestamp: {e}"))?;
            let tlog = Tlog { body: &entry.canonicalized_body, integrated_time, log_index, log_id: &log_id, set: &set };
            let time = keyless::check_tlog(root, &tlog)?;
            check_body(&entry.kind_version.kind, &entry.canonicalized_body, &signed)?;
            keyless::certified(root, &signed.ders, time, log_index)
        }
    }
}

/// Check the bundle's signature over what it signs, and that what it signs is `digest`.
fn signed_content(
    b: &Bundle,
    key: &PublicKey,
    digest: &Digest,
    manifest: &[u8],
    ders: Vec<Vec<u8>>,
) -> Result<Signed, String> {
    match (&b.dsse_envelope, &b.message_signature) {
        (Some(env), _) => {
            let payload = b64(&env.payload).map_err(|e| format!("the DSSE payload: {e}"))?;
            let sig = env.signatures.first().ok_or("the DSSE envelope holds no signature")?;
            let signature = b64(&sig.sig).map_err(|e| format!("the DSSE signature: {e}"))?;
            if !key.verify(&pae(&env.payload_type, &payload), &signature) {
                return Err("the DSSE signature does not verify".into());
            }
            if env.payload_type != "application/vnd.in-toto+json" {
                return Err(format!("a DSSE payload of type {:?} (an in-toto statement expected)", env.payload_type));
            }
            let st: Statement =
                serde_json::from_slice(&payload).map_err(|e| format!("not an in-toto statement: {e}"))?;
            if !st.kind.starts_with("https://in-toto.io/Statement/") {
                return Err(format!("statement type {:?} is not in-toto's", st.kind));
            }
            if st.predicate_type != SIGN_PREDICATE {
                return Err(format!("an attestation ({}), not a signature ({SIGN_PREDICATE})", st.predicate_type));
            }
            let names =
                st.subject.iter().any(|s| s.digest.get(digest.algorithm().name()).is_some_and(|h| *h == digest.hex()));
            if !names {
                return Err("the statement names another digest".into());
            }
            Ok(Signed { ders, signature, hashed: Sha256::digest(&payload).into(), dsse: true })
        }
        (None, Some(ms)) => {
            let want = b64(&ms.message_digest.digest).map_err(|e| format!("the message digest: {e}"))?;
            if ms.message_digest.algorithm != "SHA2_256"
                || digest.algorithm().name() != "sha256"
                || hex::encode(&want) != digest.hex()
            {
                return Err("the bundle signs another digest".into());
            }
            let signature = b64(&ms.signature).map_err(|e| format!("the signature: {e}"))?;
            if !key.verify(manifest, &signature) {
                return Err("the signature over the manifest does not verify".into());
            }
            let hashed: [u8; 32] = want.try_into().map_err(|_| "the message digest is not 32 bytes")?;
            Ok(Signed { ders, signature, hashed, dsse: false })
        }
        (None, None) => Err("the bundle holds neither a DSSE envelope nor a message signature".into()),
    }
}

/// The Rekor entry records this signature, certificate and signed content.
fn check_body(kind: &str, body: &str, s: &Signed) -> Result<(), String> {
    let body = b64(body).map_err(|e| format!("the log entry body: {e}"))?;
    let leaf = s.ders.first().ok_or("no certificate")?;
    let same_cert = |b64pem: &str| {
        b64(b64pem).ok().and_then(|p| pem::parse(p).ok()).is_some_and(|p| p.contents() == leaf.as_slice())
    };
    let sig_b64 = STANDARD.encode(&s.signature);
    match (kind, s.dsse) {
        ("dsse", true) => {
            let b: DsseBody =
                serde_json::from_slice(&body).map_err(|e| format!("the log entry is not a dsse entry: {e}"))?;
            if b.kind != "dsse"
                || b.spec.payload_hash.algorithm != "sha256"
                || b.spec.payload_hash.value != hex::encode(s.hashed)
            {
                return Err("the log entry records another payload".into());
            }
            let recorded = b.spec.signatures.iter().any(|x| x.signature == sig_b64 && same_cert(&x.verifier));
            if !recorded {
                return Err("the log entry records another signature or certificate".into());
            }
            Ok(())
        }
        ("hashedrekord", false) => {
            let b: HashedBody =
                serde_json::from_slice(&body).map_err(|e| format!("the log entry is not a hashedrekord: {e}"))?;
            if b.kind != "hashedrekord"
                || b.spec.data.hash.algorithm != "sha256"
                || b.spec.data.hash.value != hex::encode(s.hashed)
            {
                return Err("the log entry records another digest".into());
            }
            if b.spec.signature.content != sig_b64 || !same_cert(&b.spec.signature.public_key.content) {
                return Err("the log entry records another signature or certificate".into());
            }
            Ok(())
        }
        (k, _) => Err(format!("a log entry of kind {k:?} does not match the bundle's content")),
    }
}

/// DSSE's pre-authentication encoding.
fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    artifact_type: Option<String>,
    subject: Option<ProbeSubject>,
    #[serde(default)]
    layers: Vec<ProbeLayer>,
    #[serde(default)]
    manifests: Vec<ProbeEntry>,
}

#[derive(Deserialize)]
struct ProbeSubject {
    digest: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProbeLayer {
    media_type: String,
    digest: String,
    size: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProbeEntry {
    digest: String,
    artifact_type: Option<String>,
}

fn is_bundle_type(t: &str) -> bool {
    t.starts_with(BUNDLE_MEDIA_TYPE_PREFIX)
}

/// The referrers an index lists (a referrers answer, or the `sha256-<hex>` fallback tag's
/// index) whose artifact type is a Sigstore bundle.
pub fn bundle_referrers(index: &[u8]) -> Vec<Digest> {
    let Ok(p) = serde_json::from_slice::<Probe>(index) else { return Vec::new() };
    p.manifests
        .into_iter()
        .filter(|e| e.artifact_type.as_deref().is_some_and(is_bundle_type))
        .filter_map(|e| e.digest.parse().ok())
        .collect()
}

/// The layers of a referrer manifest that are Sigstore bundles (of at most [`MAX_BUNDLE`]
/// bytes, at most [`MAX_BUNDLES`]).
pub fn bundle_layers(manifest: &[u8]) -> Vec<Digest> {
    let Ok(p) = serde_json::from_slice::<Probe>(manifest) else { return Vec::new() };
    p.layers
        .into_iter()
        .filter(|l| is_bundle_type(&l.media_type) && l.size <= MAX_BUNDLE)
        .filter_map(|l| l.digest.parse().ok())
        .take(MAX_BUNDLES)
        .collect()
}

/// A manifest with a `subject`: a referrer (a signature, an attestation, an SBOM).
pub fn is_referrer(manifest: &[u8]) -> bool {
    serde_json::from_slice::<Probe>(manifest).is_ok_and(|p| p.subject.is_some())
}

/// The digest a Sigstore bundle referrer names as its subject (none for other manifests).
/// Unsigned: it only finds the bundle; what the bundle signs is checked by [`verify`].
pub fn subject_of(manifest: &[u8]) -> Option<Digest> {
    let p: Probe = serde_json::from_slice(manifest).ok()?;
    let bundle = p.artifact_type.as_deref().is_some_and(is_bundle_type)
        || p.layers.iter().any(|l| is_bundle_type(&l.media_type));
    if !bundle {
        return None;
    }
    p.subject?.digest.parse().ok()
}
