//! The importing site's signature policy over a bundle (issue 34): every image a verifying rule
//! covers must verify with the signatures the bundle carries (cosign's `.sig` tag, Sigstore
//! bundles in referrers or the `sha256-<hex>` fallback tag), offline, before anything of the
//! bundle becomes visible; else the whole bundle is refused. The verdicts are stored with the
//! objects, so the first pull does not verify again.

use std::collections::HashMap;

use tender_oci::{media, Digest, RepoName};
use tender_store::{Store, VerdictRecord};
use tender_verify::bundle::{self, bundle_layers, is_referrer, subject_of};
use tender_verify::cosign::{self, SignatureLayer};
use tender_verify::{Action, Candidate, Policy};

/// A named image of the bundle, as the import planned it.
pub struct Entry<'a> {
    /// As the report names it (`ghcr.io/org/app:v1`).
    pub name: &'a str,
    pub upstream: &'a str,
    pub repository: &'a RepoName,
    pub tag: Option<&'a str>,
    pub digest: Digest,
    pub media_type: &'a str,
}

/// Check every entry against `policy`; the verdicts to store once the bundle is registered,
/// or why the bundle is refused.
pub fn check(store: &Store, policy: &Policy, entries: &[Entry<'_>], now: u64) -> Result<Vec<VerdictRecord>, String> {
    if policy.is_empty() {
        return Ok(Vec::new());
    }
    // Entries by repository and tag: where a digest's signature tags are.
    let mut tagged: HashMap<(&str, &str, &str), Digest> = HashMap::new();
    let mut untagged: HashMap<(&str, &str), Vec<Digest>> = HashMap::new();
    for e in entries {
        match e.tag {
            Some(t) => {
                tagged.insert((e.upstream, e.repository.as_str(), t), e.digest);
            }
            None => untagged.entry((e.upstream, e.repository.as_str())).or_default().push(e.digest),
        }
    }
    let mut out = Vec::new();
    for e in entries {
        if e.tag.is_some_and(cosign::is_supporting_tag) {
            continue;
        }
        let manifest = read(store, &e.digest)?;
        if e.tag.is_none() && is_referrer(&manifest) {
            continue; // signature material, verified by what it says
        }
        let image = tender_verify::normalise(e.upstream, e.repository.as_str());
        let Some(rule) = policy.rule_for(&image) else { continue };
        match rule.action {
            Action::Skip => continue,
            Action::Deny => return Err(format!("{}: {} is denied by the signature policy", e.name, rule.name())),
            _ => {}
        }
        let repo = e.repository.as_str();
        // cosign's tag scheme.
        let mut layers = Vec::new();
        if let Some(sig) = tagged.get(&(e.upstream, repo, cosign::signature_tag(&e.digest).as_str())) {
            layers = cosign::signature_layers(&read(store, sig)?).map_err(|m| format!("{}: {m}", e.name))?;
        }
        let mut payloads = Vec::with_capacity(layers.len());
        for l in &layers {
            payloads.push(read_bounded(store, &l.payload, cosign::MAX_PAYLOAD)?);
        }
        let found: Vec<Candidate<'_>> = layers
            .iter()
            .zip(&payloads)
            .map(|(layer, payload): (&SignatureLayer, _)| Candidate { layer, payload })
            .collect();
        // Sigstore bundles: the fallback tag's referrers, and untagged referrer entries of
        // this repository.
        let mut referrers: Vec<Digest> = untagged.get(&(e.upstream, repo)).cloned().unwrap_or_default();
        let fallback = format!("{}-{}", e.digest.algorithm().name(), e.digest.hex());
        if let Some(d) = tagged.get(&(e.upstream, repo, fallback.as_str())) {
            let doc = read(store, d)?;
            referrers.extend(media::index_children(&doc));
            referrers.push(*d);
        }
        let mut bundles = Vec::new();
        for r in referrers.iter().take(bundle::MAX_BUNDLES * 4) {
            let Ok(doc) = read(store, r) else { continue };
            if subject_of(&doc) != Some(e.digest) {
                continue;
            }
            for layer in bundle_layers(&doc) {
                bundles.push(read_bounded(store, &layer, bundle::MAX_BUNDLE)?);
            }
        }
        let bundles: Vec<&[u8]> = bundles.iter().map(Vec::as_slice).take(bundle::MAX_BUNDLES).collect();
        let verdict = tender_verify::verify_all(policy, rule, &e.digest, &manifest, &found, &bundles)
            .map_err(|f| format!("{}: {}: {f}", e.name, rule.name()))?;
        let record = VerdictRecord {
            digest: e.digest,
            fingerprint: verdict.fingerprint,
            rule: verdict.rule,
            image: verdict.image,
            method: verdict.method.to_string(),
            identity: verdict.identity,
            issuer: verdict.issuer,
            signed_at: verdict.signed_at,
            parent: None,
            verified_at: now,
        };
        if media::is_index(e.media_type) {
            for child in media::index_children(&manifest).into_iter().take(1024) {
                let mut covered = record.clone();
                covered.digest = child;
                covered.method = "parent".into();
                covered.parent = Some(e.digest);
                out.push(covered);
            }
        }
        out.push(record);
    }
    Ok(out)
}

fn read(store: &Store, d: &Digest) -> Result<Vec<u8>, String> {
    read_bounded(store, d, 16 << 20)
}

fn read_bounded(store: &Store, d: &Digest, max: u64) -> Result<Vec<u8>, String> {
    if store.object_len(d).is_some_and(|l| l > max) {
        return Err(format!("signature material {d} is larger than {max} bytes"));
    }
    match store.read_small(d) {
        Ok(Some(b)) => Ok(b.to_vec()),
        Ok(None) => Err(format!("{d}, named by the bundle's signatures, is neither in the bundle nor stored")),
        Err(e) => Err(e.to_string()),
    }
}
