//! A Sigstore trusted root (`trusted_root.json`, the TUF target that sigstore clients pin):
//! the Fulcio certificate chains, the Rekor and CT log keys, each with the time it is valid for.
//! Read once, at start; everything keyless verification trusts comes from here.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::keys::PublicKey;

/// The largest trusted root read (the public-good one is about 7 KiB).
pub const MAX_TRUSTED_ROOT: usize = 1 << 20;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRoot {
    media_type: Option<String>,
    #[serde(default)]
    tlogs: Vec<RawLog>,
    #[serde(default)]
    certificate_authorities: Vec<RawAuthority>,
    #[serde(default)]
    ctlogs: Vec<RawLog>,
    #[serde(default)]
    timestamp_authorities: Vec<RawAuthority>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLog {
    public_key: RawKey,
    log_id: RawLogId,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawKey {
    raw_bytes: String,
    valid_for: Option<RawValidity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLogId {
    key_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawValidity {
    start: Option<String>,
    end: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawAuthority {
    uri: Option<String>,
    cert_chain: RawChain,
    valid_for: Option<RawValidity>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawChain {
    certificates: Vec<RawCert>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawCert {
    raw_bytes: String,
}

/// When something in the root may be trusted: `[start, end)` in Unix seconds; no end is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub start: u64,
    pub end: Option<u64>,
}

impl Validity {
    pub fn covers(&self, t: u64) -> bool {
        t >= self.start && self.end.is_none_or(|e| t < e)
    }
}

/// A transparency or CT log's key.
#[derive(Clone, Debug)]
pub struct LogKey {
    /// The log's ID as the root names it (`logId.keyId`): Rekor's `logID`, an SCT's `log_id`.
    pub id: [u8; 32],
    pub key: PublicKey,
    pub valid: Validity,
}

/// A certificate authority (Fulcio): its chain, leaf-most first, the root last.
#[derive(Clone, Debug)]
pub struct Authority {
    pub uri: String,
    pub chain: Vec<Vec<u8>>,
    pub valid: Validity,
}

/// A parsed `trusted_root.json`.
#[derive(Clone, Debug)]
pub struct TrustedRoot {
    pub tlogs: Vec<LogKey>,
    pub ctlogs: Vec<LogKey>,
    pub authorities: Vec<Authority>,
    pub timestamp_authorities: Vec<Authority>,
    /// `sha256:<hex>` of the file: part of the policy's version.
    pub digest: String,
}

impl TrustedRoot {
    pub fn parse(bytes: &[u8]) -> Result<TrustedRoot, String> {
        if bytes.len() > MAX_TRUSTED_ROOT {
            return Err(format!("larger than {MAX_TRUSTED_ROOT} bytes"));
        }
        let raw: RawRoot = serde_json::from_slice(bytes).map_err(|e| format!("not a Sigstore trusted root: {e}"))?;
        if let Some(mt) = &raw.media_type {
            if !mt.starts_with("application/vnd.dev.sigstore.trustedroot") {
                return Err(format!("mediaType {mt:?} is not application/vnd.dev.sigstore.trustedroot+json"));
            }
        }
        let logs = |what: &str, raw: Vec<RawLog>| -> Result<Vec<LogKey>, String> {
            raw.into_iter()
                .enumerate()
                .map(|(i, l)| {
                    let der = b64(&l.public_key.raw_bytes).map_err(|e| format!("{what}[{i}].publicKey: {e}"))?;
                    let key = PublicKey::from_spki_der(&der).map_err(|e| format!("{what}[{i}].publicKey: {e}"))?;
                    // The ID bundles and SCTs name the log by, as the root writes it: SHA-256 of
                    // the DER key for Rekor v1 and CT logs, but the signed-note key ID (over the
                    // log's origin and raw key) for Rekor v2 (log2025-1.rekor.sigstore.dev), so
                    // it is not recomputed from the key.
                    let named = b64(&l.log_id.key_id).map_err(|e| format!("{what}[{i}].logId: {e}"))?;
                    let id: [u8; 32] =
                        named.try_into().map_err(|_| format!("{what}[{i}].logId is not 32 bytes (a SHA-256)"))?;
                    let valid = validity(l.public_key.valid_for.as_ref()).map_err(|e| format!("{what}[{i}]: {e}"))?;
                    Ok(LogKey { id, key, valid })
                })
                .collect()
        };
        let authorities = |what: &str, raw: Vec<RawAuthority>| -> Result<Vec<Authority>, String> {
            raw.into_iter()
                .enumerate()
                .map(|(i, a)| {
                    let chain = a
                        .cert_chain
                        .certificates
                        .iter()
                        .map(|c| b64(&c.raw_bytes))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| format!("{what}[{i}].certChain: {e}"))?;
                    if chain.is_empty() {
                        return Err(format!("{what}[{i}].certChain holds no certificate"));
                    }
                    let valid = validity(a.valid_for.as_ref()).map_err(|e| format!("{what}[{i}]: {e}"))?;
                    Ok(Authority { uri: a.uri.unwrap_or_default(), chain, valid })
                })
                .collect()
        };
        let root = TrustedRoot {
            tlogs: logs("tlogs", raw.tlogs)?,
            ctlogs: logs("ctlogs", raw.ctlogs)?,
            authorities: authorities("certificateAuthorities", raw.certificate_authorities)?,
            timestamp_authorities: authorities("timestampAuthorities", raw.timestamp_authorities)?,
            digest: format!("sha256:{}", hex::encode(Sha256::digest(bytes))),
        };
        if root.authorities.is_empty() || root.tlogs.is_empty() {
            return Err("a trusted root for keyless verification needs certificateAuthorities and tlogs".into());
        }
        Ok(root)
    }

    pub fn tlog(&self, id: &[u8]) -> Option<&LogKey> {
        self.tlogs.iter().find(|l| l.id == id)
    }

    pub fn ctlog(&self, id: &[u8]) -> Option<&LogKey> {
        self.ctlogs.iter().find(|l| l.id == id)
    }
}

pub(crate) fn b64(s: &str) -> Result<Vec<u8>, String> {
    STANDARD.decode(s.trim()).map_err(|e| format!("not base64: {e}"))
}

fn validity(v: Option<&RawValidity>) -> Result<Validity, String> {
    let Some(v) = v else { return Ok(Validity { start: 0, end: None }) };
    let time = |s: &Option<String>| -> Result<Option<u64>, String> {
        s.as_deref()
            .map(|s| {
                humantime::parse_rfc3339_weak(s)
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_secs())
                    .ok_or_else(|| format!("validFor {s:?} is not an RFC 3339 time"))
            })
            .transpose()
    };
    Ok(Validity { start: time(&v.start)?.unwrap_or(0), end: time(&v.end)? })
}
