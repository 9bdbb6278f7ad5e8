//! cosign's signature objects: the `sha256-<hex>.sig` tag's manifest, whose layers are
//! simple-signing payloads annotated with the signature, and for keyless signatures the
//! Fulcio certificate, its chain and the Rekor bundle. The caller fetches the manifest and the
//! payload blobs; this module reads them.

use std::collections::BTreeMap;

use serde::Deserialize;
use tender_oci::Digest;

pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
pub const CERTIFICATE_ANNOTATION: &str = "dev.sigstore.cosign/certificate";
pub const CHAIN_ANNOTATION: &str = "dev.sigstore.cosign/chain";
pub const BUNDLE_ANNOTATION: &str = "dev.sigstore.cosign/bundle";
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The type a simple-signing payload of a container image signature declares.
pub const SIGNATURE_TYPE: &str = "cosign container image signature";

/// Signature layers read from one signature manifest (cosign appends one per `cosign sign`).
pub const MAX_SIGNATURES: usize = 64;
/// The largest simple-signing payload read (cosign's are a few hundred bytes).
pub const MAX_PAYLOAD: u64 = 256 << 10;

/// The tag cosign stores `digest`'s signatures under: `sha256-<hex>.sig`.
pub fn signature_tag(digest: &Digest) -> String {
    format!("{}-{}.sig", digest.algorithm().name(), digest.hex())
}

/// Whether `tag` is one of cosign's tag-scheme objects (`.sig`, `.att`, `.sbom`) or the
/// referrers fallback tag (`sha256-<hex>`): supporting material, verified by what it says,
/// not itself signed.
pub fn is_supporting_tag(tag: &str) -> bool {
    let Some((alg, rest)) = tag.split_once('-') else { return false };
    if !matches!(alg, "sha256" | "sha512") {
        return false;
    }
    let hex = rest.strip_suffix(".sig").or_else(|| rest.strip_suffix(".att")).or_else(|| rest.strip_suffix(".sbom"));
    let hex = hex.unwrap_or(rest);
    matches!(hex.len(), 64 | 128) && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    #[serde(default)]
    layers: Vec<RawLayer>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawLayer {
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// One signature layer of a signature manifest, before its payload is fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignatureLayer {
    pub payload: Digest,
    pub size: u64,
    pub signature: String,
    pub certificate: Option<String>,
    pub chain: Option<String>,
    pub bundle: Option<String>,
}

/// The signature layers of a cosign signature manifest (at most [`MAX_SIGNATURES`]; layers
/// that are not simple-signing payloads or carry no signature are passed over).
pub fn signature_layers(manifest: &[u8]) -> Result<Vec<SignatureLayer>, String> {
    let raw: RawManifest =
        serde_json::from_slice(manifest).map_err(|e| format!("the signature manifest is not a manifest: {e}"))?;
    let mut out = Vec::new();
    for layer in raw.layers {
        if layer.media_type != SIMPLE_SIGNING {
            continue;
        }
        let Some(signature) = layer.annotations.get(SIGNATURE_ANNOTATION) else { continue };
        let payload: Digest =
            layer.digest.parse().map_err(|_| format!("layer digest {:?} is not a digest", layer.digest))?;
        if layer.size > MAX_PAYLOAD {
            return Err(format!("a signature payload of {} bytes (at most {MAX_PAYLOAD})", layer.size));
        }
        out.push(SignatureLayer {
            payload,
            size: layer.size,
            signature: signature.clone(),
            certificate: layer.annotations.get(CERTIFICATE_ANNOTATION).filter(|c| !c.is_empty()).cloned(),
            chain: layer.annotations.get(CHAIN_ANNOTATION).filter(|c| !c.is_empty()).cloned(),
            bundle: layer.annotations.get(BUNDLE_ANNOTATION).filter(|c| !c.is_empty()).cloned(),
        });
        if out.len() == MAX_SIGNATURES {
            break;
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
struct Payload {
    critical: Critical,
}

#[derive(Deserialize)]
struct Critical {
    #[serde(rename = "type")]
    kind: String,
    image: Image,
    #[serde(default)]
    identity: Option<Identity>,
}

#[derive(Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    digest: String,
}

#[derive(Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference", default)]
    reference: Option<String>,
}

/// What a simple-signing payload claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub digest: String,
    pub reference: Option<String>,
}

/// Read a simple-signing payload and check that it signs `digest`.
pub fn check_payload(payload: &[u8], digest: &Digest) -> Result<Claim, String> {
    let p: Payload =
        serde_json::from_slice(payload).map_err(|e| format!("payload is not a simple-signing payload: {e}"))?;
    if p.critical.kind != SIGNATURE_TYPE {
        return Err(format!("payload type {:?} is not {SIGNATURE_TYPE:?}", p.critical.kind));
    }
    let claim = Claim { digest: p.critical.image.digest, reference: p.critical.identity.and_then(|i| i.reference) };
    if claim.digest != digest.to_string() {
        return Err(format!("payload names another digest ({})", claim.digest));
    }
    Ok(claim)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000abc";

    #[test]
    fn should_name_the_signature_tag_and_know_supporting_tags() {
        let d: Digest = D.parse().unwrap();
        let tag = signature_tag(&d);
        assert_eq!(tag, format!("sha256-{}.sig", d.hex()));
        assert!(is_supporting_tag(&tag));
        assert!(is_supporting_tag(&tag.replace(".sig", ".att")));
        assert!(is_supporting_tag(&tag.replace(".sig", "")));
        for not in ["latest", "sha256-abc.sig", "v1.0.sig", &tag.replace("sha256", "md5"), &tag.to_uppercase()] {
            assert!(!is_supporting_tag(not), "{not}");
        }
    }

    #[test]
    fn should_check_that_a_payload_signs_the_digest() {
        let d: Digest = D.parse().unwrap();
        let ok = format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"r/x"}},"image":{{"docker-manifest-digest":"{D}"}},"type":"cosign container image signature"}},"optional":null}}"#
        );
        assert_eq!(check_payload(ok.as_bytes(), &d).unwrap().reference.as_deref(), Some("r/x"));
        let other = ok.replace("abc", "abd");
        assert!(check_payload(other.as_bytes(), &d).unwrap_err().contains("another digest"));
        let kind = ok.replace("cosign container image signature", "atomic container signature");
        assert!(check_payload(kind.as_bytes(), &d).unwrap_err().contains("payload type"));
        assert!(check_payload(b"{}", &d).is_err());
    }

    #[test]
    fn should_read_signature_layers_and_pass_over_others() {
        let m = format!(
            r#"{{"schemaVersion":2,"layers":[
              {{"mediaType":"{SIMPLE_SIGNING}","digest":"{D}","size":10,"annotations":{{"{SIGNATURE_ANNOTATION}":"c2ln","{BUNDLE_ANNOTATION}":""}}}},
              {{"mediaType":"application/octet-stream","digest":"{D}","size":10}},
              {{"mediaType":"{SIMPLE_SIGNING}","digest":"{D}","size":10}}]}}"#
        );
        let layers = signature_layers(m.as_bytes()).unwrap();
        assert_eq!(layers.len(), 1);
        assert_eq!(layers[0].signature, "c2ln");
        assert_eq!(layers[0].bundle, None);
        let big = m.replace("\"size\":10", "\"size\":99999999");
        assert!(signature_layers(big.as_bytes()).is_err());
    }
}
