//! The signature policy (`imageVerification`) on the one way to a manifest: a rule that denies
//! answers before the upstream is asked; a verifying rule's manifest is verified before it is
//! committed (a fill) or served (a stored manifest without a verdict under the rule in force),
//! and the verdict is stored with the object. A hit reads the stored verdict (memory first).

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method};
use tender_oci::{media, Digest, Reference, RepoName};
use tender_store::VerdictRecord;
use tender_verify::cosign::{self, SignatureLayer};
use tender_verify::{Candidate, Failure, Policy, Rule};

use crate::client::Upstream;
use crate::error::{FetchError, FetchErrorKind};
use crate::mirror::Mirror;
use crate::verdicts::result_label;

/// Children of an index that its verdict covers (an index lists a few platforms).
const MAX_CHILDREN: usize = 1024;

fn unverified(up: &Upstream, message: String) -> FetchError {
    FetchError::new(FetchErrorKind::Unverified, up.name(), message).with_status(403)
}

impl Mirror {
    /// Put `policy` in force: the next request of every image is decided by it (verdicts under
    /// a changed rule no longer count).
    pub fn set_policy(&self, policy: Arc<Policy>) {
        self.verification.set(policy);
    }

    /// The rule of the policy for `repo` of `up`, when it verifies; `Err` when it denies.
    /// cosign's supporting tags (`sha256-<hex>.sig`, `.att`, ...) are signatures, verified by
    /// what they say: no rule applies to them.
    pub(crate) fn rule_for(
        &self,
        up: &Upstream,
        repo: &RepoName,
        reference: &Reference,
    ) -> Result<Option<Rule>, FetchError> {
        let policy = self.verification.policy();
        if policy.is_empty() {
            return Ok(None);
        }
        if let Reference::Tag(t) = reference {
            if cosign::is_supporting_tag(t.as_str()) {
                return Ok(None);
            }
        }
        let image = tender_verify::normalise(up.name(), repo.as_str());
        let Some(rule) = policy.rule_for(&image) else { return Ok(None) };
        match rule.action {
            tender_verify::Action::Skip => Ok(None),
            tender_verify::Action::Deny => {
                self.flights().metrics().verifications.get_or_create(&result_label("denied")).inc();
                tracing::warn!(upstream = %up.name(), %image, rule = %rule.name(), "image denied by the signature policy");
                Err(unverified(up, format!("{}: {image} is denied by the signature policy", rule.name())))
            }
            _ => Ok(Some(rule.clone())),
        }
    }

    /// Verify `digest` (whose bytes are `body`) of `repo` under `rule`, unless it already
    /// verified under this rule. `Ok`: the manifest may be committed and served.
    pub(crate) async fn vet(
        self: &Arc<Self>,
        up: &Arc<Upstream>,
        repo: &RepoName,
        rule: &Rule,
        digest: &Digest,
        media_type: &str,
        body: &[u8],
    ) -> Result<(), FetchError> {
        if self.verification.remembered(digest, &rule.fingerprint) {
            return Ok(());
        }
        let store = self.flights().store();
        if let Ok(Some(v)) = store.verdict_get(digest) {
            if v.fingerprint == rule.fingerprint {
                self.verification.remember(*digest, &rule.fingerprint);
                return Ok(());
            }
        }
        let image = tender_verify::normalise(up.name(), repo.as_str());
        let policy = self.verification.policy();
        let outcome = match self.signatures(up, repo, digest).await {
            Ok(found) => {
                let candidates: Vec<Candidate<'_>> =
                    found.iter().map(|(layer, payload)| Candidate { layer, payload }).collect();
                tender_verify::verify(&policy, rule, digest, &candidates)
            }
            Err(f) => Err(f),
        };
        let metrics = self.flights().metrics();
        let verdict = match outcome {
            Ok(v) => v,
            Err(failure) => {
                metrics.verifications.get_or_create(&result_label(failure.label())).inc();
                tracing::warn!(upstream = %up.name(), %image, %digest, rule = %rule.name(), reason = %failure, "manifest refused by the signature policy");
                let e = unverified(up, format!("{}: {image}@{digest}: {failure}", rule.name()));
                return Err(match failure {
                    // Not a verdict on the image: the signature could not be fetched.
                    Failure::Unavailable(_) => FetchError { kind: FetchErrorKind::Status, status: None, ..e },
                    _ => e,
                });
            }
        };
        metrics.verifications.get_or_create(&result_label("verified")).inc();
        tracing::info!(upstream = %up.name(), %image, %digest, rule = %rule.name(), identity = %verdict.identity, "manifest verified");
        let now = tender_store::now_secs();
        let record = VerdictRecord {
            digest: *digest,
            fingerprint: verdict.fingerprint.clone(),
            rule: verdict.rule,
            image: verdict.image.clone(),
            method: verdict.method.to_string(),
            identity: verdict.identity.clone(),
            issuer: verdict.issuer.clone(),
            signed_at: verdict.signed_at,
            parent: None,
            verified_at: now,
        };
        self.keep_verdict(&record);
        // An index that verifies covers its children by digest.
        if media::is_index(media_type) {
            for child in media::index_children(body).into_iter().take(MAX_CHILDREN) {
                let mut covered = record.clone();
                covered.digest = child;
                covered.method = "parent".into();
                covered.parent = Some(*digest);
                self.keep_verdict(&covered);
            }
        }
        Ok(())
    }

    fn keep_verdict(&self, record: &VerdictRecord) {
        if let Err(e) = self.flights().store().verdict_put(record) {
            // Verified in memory: served now, verified again after a restart.
            tracing::warn!(digest = %record.digest, error = %e, "verdict not written");
        }
        self.verification.remember(record.digest, &record.fingerprint);
    }

    /// `digest`'s cosign signatures in `repo`: the `sha256-<hex>.sig` manifest (stored, or
    /// from the upstream) and each signature layer's payload.
    async fn signatures(
        self: &Arc<Self>,
        up: &Arc<Upstream>,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Vec<(SignatureLayer, Bytes)>, Failure> {
        let tag = cosign::signature_tag(digest);
        let reference: Reference =
            tag.parse().map_err(|_| Failure::DoesNotVerify(format!("bad signature tag {tag}")))?;
        let resolved = self.resolve_boxed(up, repo, reference).await;
        let hit = match resolved {
            Ok(hit) => hit,
            Err(e) if e.kind == FetchErrorKind::NotFound || e.kind == FetchErrorKind::Offline => {
                return Err(Failure::NoSignature)
            }
            Err(e) => return Err(Failure::Unavailable(e.to_string())),
        };
        let layers = cosign::signature_layers(&hit.bytes).map_err(Failure::DoesNotVerify)?;
        let mut out = Vec::with_capacity(layers.len());
        for layer in layers {
            let payload = self.payload(up, repo, &layer).await.map_err(|e| Failure::Unavailable(e.to_string()))?;
            out.push((layer, payload));
        }
        Ok(out)
    }

    /// `resolve`, behind a named boxed future: the signature manifest is resolved from inside a
    /// manifest fill, and the named type ends the recursion of future types.
    fn resolve_boxed<'a>(
        self: &'a Arc<Self>,
        up: &'a Arc<Upstream>,
        repo: &'a RepoName,
        reference: Reference,
    ) -> futures::future::BoxFuture<'a, Result<crate::mirror::ManifestHit, FetchError>> {
        use futures::FutureExt as _;
        async move { self.resolve(up, repo, &reference, &[]).await }.boxed()
    }

    /// A signature payload blob: stored (an import carried it), or fetched, checked and kept
    /// (an export carries it on).
    async fn payload(&self, up: &Arc<Upstream>, repo: &RepoName, layer: &SignatureLayer) -> Result<Bytes, FetchError> {
        let store = self.flights().store();
        let d = layer.payload;
        let max = cosign::MAX_PAYLOAD;
        if store.object_len(&d).is_some_and(|l| l <= max) {
            if let Ok(Some(b)) = store.read_small(&d) {
                return Ok(b);
            }
        }
        let path = format!("/v2/{repo}/blobs/{d}");
        let scope = format!("repository:{repo}:pull");
        let resp = up.request(Method::GET, &path, HeaderMap::new(), Some(&scope)).await?;
        let body = up.read_small(resp, max as usize, "signature payload").await?;
        if d.algorithm().digest(&body) != d {
            return Err(FetchError::new(
                FetchErrorKind::Corrupt,
                up.name(),
                format!("signature payload {d} has other bytes"),
            ));
        }
        match store.put_bytes(&format!("blob:{d}"), &body, &d) {
            Ok(_) => {
                let _ = store.record_known(&d, up.name());
            }
            Err(e) => tracing::warn!(digest = %d, error = %e, "signature payload not kept"),
        }
        Ok(body)
    }
}
