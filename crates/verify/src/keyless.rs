//! Keyless (Fulcio) signatures verified offline: the short-lived certificate chains to a pinned
//! Fulcio root at the signing time, carries a valid SCT from a pinned CT log, and the signature
//! is in Rekor (the signed entry timestamp checked with the pinned Rekor key, the entry's body
//! naming this payload, signature and certificate). The signing time is Rekor's integrated time,
//! which must fall inside the certificate's ten minutes.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use rustls_pki_types::{CertificateDer, UnixTime};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use x509_cert::der::asn1::{Ia5String, OctetString};
use x509_cert::der::{Decode, Encode};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::spki::ObjectIdentifier;
use x509_cert::Certificate;

use crate::keys::{PublicKey, MAX_PEM};
use crate::root::{b64, TrustedRoot};

const SAN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");
const SCT_LIST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.11129.2.4.2");
/// Fulcio's OIDC issuer, a raw string (deprecated, still written).
const ISSUER_V1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.1");
/// Fulcio's OIDC issuer, a DER UTF8String.
const ISSUER_V2: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.57264.1.8");
/// id-kp-codeSigning (1.3.6.1.5.5.7.3.3), the OID's DER value.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];
/// The largest Rekor bundle annotation read.
const MAX_BUNDLE: usize = 64 << 10;

/// Who signed, as the certificate says, and when, as Rekor says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signer {
    /// The certificate's identities: its SAN emails, URIs, other names (a rule's subject may
    /// match any, as cosign matches).
    pub subjects: Vec<String>,
    /// The OIDC issuer Fulcio recorded.
    pub issuer: String,
    /// Rekor's integrated time (Unix seconds).
    pub signed_at: u64,
    pub log_index: i64,
}

/// The evidence of one keyless signature.
pub struct Evidence<'a> {
    pub payload: &'a [u8],
    pub signature: &'a [u8],
    /// The leaf certificate (PEM), perhaps followed by its chain.
    pub certificate: &'a str,
    /// The chain annotation (PEM), if any.
    pub chain: Option<&'a str>,
    /// cosign's Rekor bundle annotation (JSON).
    pub bundle: Option<&'a str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawBundle {
    signed_entry_timestamp: String,
    payload: RawBundlePayload,
}

#[derive(Deserialize, Serialize)]
struct RawBundlePayload {
    body: String,
    #[serde(rename = "integratedTime")]
    integrated_time: i64,
    #[serde(rename = "logIndex")]
    log_index: i64,
    #[serde(rename = "logID")]
    log_id: String,
}

/// The bytes Rekor's signed entry timestamp signs: the entry's fields as canonical JSON
/// (keys sorted, no spaces).
#[derive(Serialize)]
struct Canonical<'a> {
    body: &'a str,
    #[serde(rename = "integratedTime")]
    integrated_time: i64,
    #[serde(rename = "logID")]
    log_id: &'a str,
    #[serde(rename = "logIndex")]
    log_index: i64,
}

#[derive(Deserialize)]
struct Entry {
    kind: String,
    spec: EntrySpec,
}

#[derive(Deserialize)]
struct EntrySpec {
    data: EntryData,
    signature: EntrySignature,
}

#[derive(Deserialize)]
struct EntryData {
    hash: EntryHash,
}

#[derive(Deserialize)]
struct EntryHash {
    algorithm: String,
    value: String,
}

#[derive(Deserialize)]
struct EntrySignature {
    content: String,
    #[serde(rename = "publicKey")]
    public_key: EntryKey,
}

#[derive(Deserialize)]
struct EntryKey {
    content: String,
}

/// Verify one keyless signature against `root`. `Err` is the reason it does not verify; the
/// identity is returned for the caller to compare with its rule.
pub fn verify(root: &TrustedRoot, e: &Evidence<'_>) -> Result<Signer, String> {
    if e.certificate.len() > MAX_PEM || e.chain.is_some_and(|c| c.len() > MAX_PEM) {
        return Err(format!("a certificate annotation of more than {MAX_PEM} bytes"));
    }
    let mut pems = pem::parse_many(e.certificate).map_err(|x| format!("the certificate is not PEM: {x}"))?;
    if let Some(chain) = e.chain {
        pems.extend(pem::parse_many(chain).map_err(|x| format!("the chain is not PEM: {x}"))?);
    }
    let ders: Vec<Vec<u8>> =
        pems.into_iter().filter(|p| p.tag() == "CERTIFICATE").map(pem::Pem::into_contents).collect();
    let leaf_der = ders.first().ok_or("no certificate in the certificate annotation")?;
    let key = PublicKey::of_certificate(leaf_der)?;
    if !key.verify(e.payload, e.signature) {
        return Err("the signature is not the certificate's over this payload".into());
    }

    // Rekor: the entry is signed by a pinned log key and is this signature.
    let bundle = e
        .bundle
        .ok_or("no Rekor bundle (dev.sigstore.cosign/bundle): a keyless signature needs its transparency log entry")?;
    if bundle.len() > MAX_BUNDLE {
        return Err(format!("a Rekor bundle of more than {MAX_BUNDLE} bytes"));
    }
    let bundle: RawBundle =
        serde_json::from_str(bundle).map_err(|x| format!("the Rekor bundle is not JSON of cosign's form: {x}"))?;
    let p = &bundle.payload;
    let set = b64(&bundle.signed_entry_timestamp).map_err(|x| format!("SignedEntryTimestamp: {x}"))?;
    let time = check_tlog(
        root,
        &Tlog {
            body: &p.body,
            integrated_time: p.integrated_time,
            log_index: p.log_index,
            log_id: &p.log_id,
            set: &set,
        },
    )?;
    check_entry(&p.body, e.payload, e.signature, leaf_der)?;
    certified(root, &ders, time, p.log_index)
}

/// A Rekor v1 entry as a bundle carries it: what its signed entry timestamp covers.
pub(crate) struct Tlog<'a> {
    /// The entry body, base64, as Rekor returned it.
    pub body: &'a str,
    pub integrated_time: i64,
    pub log_index: i64,
    /// The log's ID, lowercase hex.
    pub log_id: &'a str,
    /// The signed entry timestamp (DER ECDSA).
    pub set: &'a [u8],
}

/// Check a Rekor entry's signed entry timestamp with the pinned log key; the entry's integrated
/// time (Unix seconds) is the signing time.
pub(crate) fn check_tlog(root: &TrustedRoot, t: &Tlog<'_>) -> Result<u64, String> {
    let time = u64::try_from(t.integrated_time).map_err(|_| "the Rekor entry's integrated time is negative")?;
    let log_id = hex::decode(t.log_id).map_err(|_| "the Rekor bundle's logID is not hex")?;
    let log = root.tlog(&log_id).ok_or_else(|| format!("Rekor log {} is not in the trusted root", t.log_id))?;
    if !log.valid.covers(time) {
        return Err(format!("the Rekor key was not valid at the integrated time {}", show_time(time)));
    }
    let canonical = serde_json::to_vec(&Canonical {
        body: t.body,
        integrated_time: t.integrated_time,
        log_id: t.log_id,
        log_index: t.log_index,
    })
    .map_err(|x| x.to_string())?;
    if !log.key.verify(&canonical, t.set) {
        return Err("the Rekor signed entry timestamp does not verify with the pinned Rekor key".into());
    }
    Ok(time)
}

/// The leaf (`ders[0]`, the rest its chain) was valid at `time`, chains to a pinned Fulcio
/// root in force then, and carries a valid SCT; returns who it names.
pub(crate) fn certified(root: &TrustedRoot, ders: &[Vec<u8>], time: u64, log_index: i64) -> Result<Signer, String> {
    let leaf_der = ders.first().ok_or("no certificate")?;
    let leaf = Certificate::from_der(leaf_der).map_err(|x| format!("the certificate is not X.509: {x}"))?;
    // The certificate was valid when Rekor saw the signature.
    let validity = &leaf.tbs_certificate.validity;
    let (nb, na) = (validity.not_before.to_unix_duration().as_secs(), validity.not_after.to_unix_duration().as_secs());
    if time < nb || time > na {
        return Err(format!(
            "signing time {} is outside the certificate's validity ({} to {})",
            show_time(time),
            show_time(nb),
            show_time(na)
        ));
    }
    // The chain, to a Fulcio root in force at that time.
    let issuer = chain_to_root(root, ders, time)?;
    check_sct(root, &leaf, &issuer)?;
    let (subjects, issuer) = identity(&leaf)?;
    Ok(Signer { subjects, issuer, signed_at: time, log_index })
}

/// The leaf chains to a pinned authority valid at `time`; returns the leaf's issuer (DER).
fn chain_to_root(root: &TrustedRoot, ders: &[Vec<u8>], time: u64) -> Result<Vec<u8>, String> {
    let leaf = CertificateDer::from(ders[0].as_slice());
    let ee = webpki::EndEntityCert::try_from(&leaf).map_err(|x| format!("the certificate is not usable: {x:?}"))?;
    let at = UnixTime::since_unix_epoch(Duration::from_secs(time));
    let mut last = String::from("no certificate authority in the trusted root was valid at the signing time");
    for ca in root.authorities.iter().filter(|a| a.valid.covers(time)) {
        let Some(anchor_der) = ca.chain.last() else { continue };
        let anchor_cert = CertificateDer::from(anchor_der.as_slice());
        let Ok(anchor) = webpki::anchor_from_trusted_cert(&anchor_cert) else { continue };
        let anchors = [anchor];
        let mut inter: Vec<CertificateDer<'_>> =
            ca.chain[..ca.chain.len() - 1].iter().map(|c| CertificateDer::from(c.as_slice())).collect();
        inter.extend(ders[1..].iter().map(|c| CertificateDer::from(c.as_slice())));
        match ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &anchors,
            &inter,
            at,
            webpki::KeyUsage::required(CODE_SIGNING),
            None,
            None,
        ) {
            Ok(path) => {
                let issuer = path.intermediate_certificates().next().map(|c| c.der().to_vec());
                return Ok(issuer.unwrap_or_else(|| anchor_der.clone()));
            }
            Err(x) => last = format!("the certificate does not chain to {} ({x:?})", ca.uri),
        }
    }
    Err(last)
}

/// The Rekor entry is a hashedrekord of this payload's SHA-256, this signature and this
/// certificate.
fn check_entry(body: &str, payload: &[u8], signature: &[u8], leaf_der: &[u8]) -> Result<(), String> {
    let body = b64(body).map_err(|x| format!("the Rekor entry body: {x}"))?;
    let entry: Entry =
        serde_json::from_slice(&body).map_err(|x| format!("the Rekor entry is not a hashedrekord: {x}"))?;
    if !matches!(entry.kind.as_str(), "hashedrekord" | "rekord") {
        return Err(format!("a Rekor entry of kind {:?} (hashedrekord expected)", entry.kind));
    }
    let hash = &entry.spec.data.hash;
    if !hash.algorithm.eq_ignore_ascii_case("sha256") || hash.value != hex::encode(Sha256::digest(payload)) {
        return Err("the Rekor entry records another payload".into());
    }
    if b64(&entry.spec.signature.content).ok().as_deref() != Some(signature) {
        return Err("the Rekor entry records another signature".into());
    }
    let key = b64(&entry.spec.signature.public_key.content).map_err(|x| format!("the Rekor entry's key: {x}"))?;
    let same = pem::parse(&key).is_ok_and(|p| p.contents() == leaf_der);
    if !same {
        return Err("the Rekor entry records another certificate".into());
    }
    Ok(())
}

/// At least one SCT embedded in the leaf verifies with a pinned CT log key.
fn check_sct(root: &TrustedRoot, leaf: &Certificate, issuer_der: &[u8]) -> Result<(), String> {
    let exts = leaf.tbs_certificate.extensions.as_deref().unwrap_or_default();
    let ext = exts.iter().find(|x| x.extn_id == SCT_LIST).ok_or("the certificate carries no SCT")?;
    let list = OctetString::from_der(ext.extn_value.as_bytes()).map_err(|x| format!("the SCT list: {x}"))?;
    let scts = parse_sct_list(list.as_bytes()).ok_or("the SCT list is malformed")?;
    let issuer = Certificate::from_der(issuer_der).map_err(|x| format!("the issuer certificate: {x}"))?;
    let issuer_spki = issuer.tbs_certificate.subject_public_key_info.to_der().map_err(|x| x.to_string())?;
    let issuer_key_hash = Sha256::digest(&issuer_spki);
    let mut tbs = leaf.tbs_certificate.clone();
    if let Some(exts) = tbs.extensions.as_mut() {
        exts.retain(|x| x.extn_id != SCT_LIST);
    }
    let tbs = tbs.to_der().map_err(|x| x.to_string())?;
    let tbs_len = u32::try_from(tbs.len()).ok().filter(|n| *n < 1 << 24).ok_or("the certificate is too large")?;
    let mut last = "no SCT is from a CT log in the trusted root".to_string();
    for sct in scts {
        let Some(log) = root.ctlog(sct.log_id) else { continue };
        let mut signed = Vec::with_capacity(tbs.len() + 64);
        signed.push(0); // v1
        signed.push(0); // certificate_timestamp
        signed.extend_from_slice(&sct.timestamp.to_be_bytes());
        signed.extend_from_slice(&1u16.to_be_bytes()); // precert_entry
        signed.extend_from_slice(&issuer_key_hash);
        signed.extend_from_slice(&tbs_len.to_be_bytes()[1..]);
        signed.extend_from_slice(&tbs);
        signed.extend_from_slice(&(sct.extensions.len() as u16).to_be_bytes());
        signed.extend_from_slice(sct.extensions);
        if log.key.verify(&signed, sct.signature) {
            if log.valid.covers(sct.timestamp / 1000) {
                return Ok(());
            }
            last = "the SCT's CT log key was not valid at its timestamp".into();
        } else {
            last = "the SCT does not verify with its CT log's key".into();
        }
    }
    Err(last)
}

struct Sct<'a> {
    log_id: &'a [u8],
    timestamp: u64,
    extensions: &'a [u8],
    signature: &'a [u8],
}

/// RFC 6962 `SignedCertificateTimestampList`: u16-length list of u16-length v1 SCTs.
fn parse_sct_list(data: &[u8]) -> Option<Vec<Sct<'_>>> {
    fn take<'a>(d: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if d.len() < n {
            return None;
        }
        let (h, t) = d.split_at(n);
        *d = t;
        Some(h)
    }
    fn u16_len<'a>(d: &mut &'a [u8]) -> Option<&'a [u8]> {
        let n = take(d, 2)?;
        take(d, usize::from(u16::from_be_bytes([n[0], n[1]])))
    }
    let mut d = data;
    let mut list = u16_len(&mut d)?;
    let mut out = Vec::new();
    while !list.is_empty() {
        let mut s = u16_len(&mut list)?;
        if take(&mut s, 1)? != [0] {
            continue; // not v1
        }
        let log_id = take(&mut s, 32)?;
        let ts = take(&mut s, 8)?;
        let timestamp = u64::from_be_bytes(ts.try_into().ok()?);
        let extensions = u16_len(&mut s)?;
        let _algorithms = take(&mut s, 2)?;
        let signature = u16_len(&mut s)?;
        out.push(Sct { log_id, timestamp, extensions, signature });
    }
    Some(out)
}

/// The certificate's identities (every SAN: email, URI, DNS name, other name) and Fulcio's
/// OIDC issuer (`.1.8`, else the deprecated `.1.1`; both present and different is refused).
pub fn identity(cert: &Certificate) -> Result<(Vec<String>, String), String> {
    let exts = cert.tbs_certificate.extensions.as_deref().unwrap_or_default();
    let mut subjects = Vec::new();
    if let Some(san) = exts.iter().find(|x| x.extn_id == SAN) {
        let names = SubjectAltName::from_der(san.extn_value.as_bytes()).map_err(|x| format!("the SAN: {x}"))?;
        for n in &names.0 {
            let s = match n {
                GeneralName::Rfc822Name(s) | GeneralName::UniformResourceIdentifier(s) | GeneralName::DnsName(s) => {
                    Some(ia5(s))
                }
                GeneralName::OtherName(o) => {
                    // Fulcio's username identity: [0] EXPLICIT UTF8String.
                    String::from_der(o.value.value())
                        .ok()
                        .or_else(|| std::str::from_utf8(o.value.value()).ok().map(str::to_string))
                }
                _ => None,
            };
            subjects.extend(s);
        }
    }
    let v2 = exts.iter().find(|x| x.extn_id == ISSUER_V2).map(|x| {
        String::from_der(x.extn_value.as_bytes())
            .map_err(|_| "the OIDC issuer extension (.1.8) is not a UTF8String".to_string())
    });
    let v2 = v2.transpose()?;
    let v1 = exts
        .iter()
        .find(|x| x.extn_id == ISSUER_V1)
        .map(|x| String::from_utf8_lossy(x.extn_value.as_bytes()).to_string());
    if let (Some(a), Some(b)) = (&v2, &v1) {
        if a != b {
            return Err(format!("the certificate names two OIDC issuers ({a} and {b})"));
        }
    }
    if subjects.is_empty() {
        return Err("the certificate names no identity (no SAN)".into());
    }
    let issuer = v2.or(v1).ok_or("the certificate names no OIDC issuer (Fulcio extension 1.3.6.1.4.1.57264.1.8)")?;
    Ok((subjects, issuer))
}

fn ia5(s: &Ia5String) -> String {
    s.to_string()
}

pub(crate) fn show_time(t: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(t)).to_string()
}

/// Base64 as cosign writes the signature annotation.
pub fn decode_signature(s: &str) -> Result<Vec<u8>, String> {
    STANDARD.decode(s.trim()).map_err(|x| format!("the signature is not base64: {x}"))
}
