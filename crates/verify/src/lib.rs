//! tender's signature policy (`imageVerification:`): Talos' `ImageVerificationConfig` rules,
//! cosign signatures verified without any network call — keyed against a public key, keyless
//! against a pinned Sigstore trusted root (Fulcio chain, SCT, Rekor signed entry timestamp).
//!
//! Pure: the caller (`tender-fetch`'s fill) hands in the signature manifest, the payloads and
//! the digest being served, and gets a [`Verdict`] or the [`Failure`] to refuse with.

pub mod bundle;
pub mod cosign;
pub mod keyless;
pub mod keys;
pub mod policy;
pub mod root;

use tender_oci::Digest;

pub use crate::cosign::SignatureLayer;
pub use crate::policy::{normalise, Action, Policy, PolicyError, RawPolicy, Rule};
pub use crate::root::TrustedRoot;

/// Why a verifying rule refuses a manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// No signature object for the digest (no `.sig` tag, no signature layer).
    NoSignature,
    /// A signature exists but does not verify (the reason of the closest one).
    DoesNotVerify(String),
    /// A signature verifies, by someone else.
    IdentityMismatch(String),
    /// Fetching the signature failed (upstream down, ...): not a verdict on the image.
    Unavailable(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NoSignature => f.write_str("no signature"),
            Failure::DoesNotVerify(why) => write!(f, "signature does not verify: {why}"),
            Failure::IdentityMismatch(got) => write!(f, "identity mismatch: got {got}"),
            Failure::Unavailable(why) => write!(f, "signature unavailable: {why}"),
        }
    }
}

impl Failure {
    /// The `result` label of `tender_verifications_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Failure::NoSignature => "unsigned",
            Failure::DoesNotVerify(_) => "invalid",
            Failure::IdentityMismatch(_) => "mismatch",
            Failure::Unavailable(_) => "unavailable",
        }
    }
}

/// A signature that verified: which rule, whose, when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub rule: usize,
    pub image: String,
    pub fingerprint: String,
    /// `key` or `keyless`.
    pub method: &'static str,
    /// The key's fingerprint, or the certificate's subject.
    pub identity: String,
    /// The OIDC issuer (keyless).
    pub issuer: Option<String>,
    /// Rekor's integrated time (keyless).
    pub signed_at: Option<u64>,
}

impl Verdict {
    fn of(
        rule: &Rule,
        method: &'static str,
        identity: String,
        issuer: Option<String>,
        signed_at: Option<u64>,
    ) -> Verdict {
        Verdict {
            rule: rule.index,
            image: rule.image.clone(),
            fingerprint: rule.fingerprint.clone(),
            method,
            identity,
            issuer,
            signed_at,
        }
    }
}

/// One signature of the digest: a signature layer and its payload, fetched.
pub struct Candidate<'a> {
    pub layer: &'a SignatureLayer,
    pub payload: &'a [u8],
}

/// Verify `digest` under the verifying `rule` of `policy` with the signatures found.
pub fn verify(policy: &Policy, rule: &Rule, digest: &Digest, found: &[Candidate<'_>]) -> Result<Verdict, Failure> {
    verify_all(policy, rule, digest, &[], found, &[])
}

/// Verify `digest` (whose bytes are `manifest`) under `rule` with cosign's tag-scheme
/// signatures (`found`) and Sigstore bundles (`bundles`): the first that verifies wins; else
/// the closest failure (someone else's signature before an invalid one).
pub fn verify_all(
    policy: &Policy,
    rule: &Rule,
    digest: &Digest,
    manifest: &[u8],
    found: &[Candidate<'_>],
    bundles: &[&[u8]],
) -> Result<Verdict, Failure> {
    if found.is_empty() && bundles.is_empty() {
        return Err(Failure::NoSignature);
    }
    let mut mismatch = None;
    let mut invalid = None;
    let outcomes = found
        .iter()
        .map(|c| verify_one(policy, rule, digest, c))
        .chain(bundles.iter().map(|b| verify_bundle(policy, rule, digest, manifest, b)));
    for outcome in outcomes {
        match outcome {
            Ok(v) => return Ok(v),
            Err(f @ Failure::IdentityMismatch(_)) => mismatch = mismatch.or(Some(f)),
            Err(f) => invalid = invalid.or(Some(f)),
        }
    }
    Err(mismatch.or(invalid).unwrap_or(Failure::NoSignature))
}

fn verify_bundle(
    policy: &Policy,
    rule: &Rule,
    digest: &Digest,
    manifest: &[u8],
    json: &[u8],
) -> Result<Verdict, Failure> {
    let bad = Failure::DoesNotVerify;
    let verdict = |method, identity, issuer, signed_at| Verdict::of(rule, method, identity, issuer, signed_at);
    match &rule.action {
        Action::Key(key) => {
            bundle::verify(bundle::Trust::Key(key), json, digest, manifest).map_err(bad)?;
            Ok(verdict("key", key.fingerprint(), None, None))
        }
        Action::Keyless { issuer, subject, subject_regex } => {
            let root = policy.trusted_root.as_ref().ok_or_else(|| bad("no trusted root".into()))?;
            let signer = bundle::verify(bundle::Trust::Root(root), json, digest, manifest).map_err(bad)?;
            identify(signer, issuer, subject.as_deref(), subject_regex.as_ref())
                .map(|(s, i, t)| verdict("keyless", s, Some(i), Some(t)))
        }
        Action::Skip | Action::Deny => Err(bad("the rule does not verify".into())),
    }
}

/// The signer's identity under a keyless rule: subject exact, subjectRegex unanchored (as
/// cosign and Talos match), against any SAN; the issuer exact.
fn identify(
    signer: keyless::Signer,
    issuer: &str,
    subject: Option<&str>,
    subject_regex: Option<&regex::Regex>,
) -> Result<(String, String, u64), Failure> {
    let matched = signer
        .subjects
        .iter()
        .find(|s| subject.is_none_or(|want| want == s.as_str()) && subject_regex.is_none_or(|re| re.is_match(s)));
    match matched {
        Some(s) if signer.issuer == issuer => Ok((s.clone(), signer.issuer, signer.signed_at)),
        _ => {
            let first = signer.subjects.first().cloned().unwrap_or_default();
            Err(Failure::IdentityMismatch(format!("{first} from {}", signer.issuer)))
        }
    }
}

fn verify_one(policy: &Policy, rule: &Rule, digest: &Digest, c: &Candidate<'_>) -> Result<Verdict, Failure> {
    let bad = Failure::DoesNotVerify;
    if c.layer.payload.algorithm().digest(c.payload) != c.layer.payload {
        return Err(bad("the payload is not the layer's digest".into()));
    }
    let signature = keyless::decode_signature(&c.layer.signature).map_err(bad)?;
    let verdict = |method, identity, issuer, signed_at| Verdict::of(rule, method, identity, issuer, signed_at);
    match &rule.action {
        Action::Key(key) => {
            if !key.verify(c.payload, &signature) {
                return Err(bad(format!("not signed by the key {}", key.fingerprint())));
            }
            cosign::check_payload(c.payload, digest).map_err(bad)?;
            Ok(verdict("key", key.fingerprint(), None, None))
        }
        Action::Keyless { issuer, subject, subject_regex } => {
            let root = policy.trusted_root.as_ref().ok_or_else(|| bad("no trusted root".into()))?;
            let certificate = c
                .layer
                .certificate
                .as_deref()
                .ok_or_else(|| bad("a signature without a certificate (keyed?)".into()))?;
            let evidence = keyless::Evidence {
                payload: c.payload,
                signature: &signature,
                certificate,
                chain: c.layer.chain.as_deref(),
                bundle: c.layer.bundle.as_deref(),
            };
            let signer = keyless::verify(root, &evidence).map_err(bad)?;
            cosign::check_payload(c.payload, digest).map_err(bad)?;
            identify(signer, issuer, subject.as_deref(), subject_regex.as_ref())
                .map(|(s, i, t)| verdict("keyless", s, Some(i), Some(t)))
        }
        Action::Skip | Action::Deny => Err(bad("the rule does not verify".into())),
    }
}
