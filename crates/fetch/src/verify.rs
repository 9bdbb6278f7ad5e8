//! The signature policy (`imageVerification`) on the one way to a manifest: a rule that denies
//! answers before the upstream is asked; a verifying rule's manifest is verified before it is
//! committed (a fill) or served (a stored manifest without a verdict under the rule in force),
//! and the verdict is stored with the object. A hit reads the stored verdict (memory first).

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt as _;
use http::{HeaderMap, Method};
use tender_oci::{media, Digest, Reference, RepoName};
use tender_store::VerdictRecord;
use tender_verify::bundle::{self, bundle_layers, bundle_referrers};
use tender_verify::cosign::{self, SignatureLayer};
use tender_verify::{Candidate, Failure, Policy, Rule};

use crate::client::Upstream;
use crate::error::{FetchError, FetchErrorKind};
use crate::mirror::Mirror;
use crate::verdicts::{result_label, Decision};

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

    /// The signature policy in force.
    pub fn policy(&self) -> Arc<Policy> {
        self.verification.policy()
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
                self.verification.record(Decision {
                    upstream: up.name().to_string(),
                    image: image.clone(),
                    digest: None,
                    rule: rule.name(),
                    result: "denied".into(),
                    method: None,
                    identity: None,
                    issuer: None,
                    signed_at: None,
                    reason: Some("a deny rule".into()),
                    at: tender_store::now_secs(),
                });
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
        // One verification per digest and rule however many clients ask at once (after a
        // policy change every stored manifest is asked for again): the others wait for it.
        let key = format!("{digest}\0{}\0{}", rule.fingerprint, up.name());
        let flight = {
            let mut flights = self
                .verification
                .flights
                .lock()
                .map_err(|_| FetchError::new(FetchErrorKind::Local, up.name(), "verification flights poisoned"))?;
            flights
                .entry(key.clone())
                .or_insert_with(|| {
                    let (me, up, repo, rule) = (self.clone(), up.clone(), repo.clone(), rule.clone());
                    let (digest, media_type, body) = (*digest, media_type.to_string(), Bytes::copy_from_slice(body));
                    async move { me.verify_now(&up, &repo, &rule, &digest, &media_type, &body).await }.boxed().shared()
                })
                .clone()
        };
        let _leave = crate::verdicts::Leave { verification: &self.verification, key: &key };
        flight.await
    }

    /// Fetch `digest`'s signatures and verify them under `rule`; store the verdict.
    async fn verify_now(
        self: &Arc<Self>,
        up: &Arc<Upstream>,
        repo: &RepoName,
        rule: &Rule,
        digest: &Digest,
        media_type: &str,
        body: &[u8],
    ) -> Result<(), FetchError> {
        let image = tender_verify::normalise(up.name(), repo.as_str());
        let policy = self.verification.policy();
        // Sigstore bundles (cosign v3: referrers) and cosign's `.sig` tag, both looked at.
        let bundles = self.bundles(up, repo, digest).await;
        let outcome = match self.signatures(up, repo, digest).await {
            Err(f) if !bundles.is_empty() && matches!(f, Failure::NoSignature | Failure::Unavailable(_)) => {
                let found: Vec<&[u8]> = bundles.iter().map(|b| b.as_ref()).collect();
                tender_verify::verify_all(&policy, rule, digest, body, &[], &found)
            }
            Err(f) => Err(f),
            Ok(sigs) => {
                let candidates: Vec<Candidate<'_>> =
                    sigs.iter().map(|(layer, payload)| Candidate { layer, payload }).collect();
                let found: Vec<&[u8]> = bundles.iter().map(|b| b.as_ref()).collect();
                tender_verify::verify_all(&policy, rule, digest, body, &candidates, &found)
            }
        };
        let metrics = self.flights().metrics();
        let verdict = match outcome {
            Ok(v) => v,
            Err(failure) => {
                metrics.verifications.get_or_create(&result_label(failure.label())).inc();
                tracing::warn!(upstream = %up.name(), %image, %digest, rule = %rule.name(), reason = %failure, "manifest refused by the signature policy");
                self.verification.record(Decision {
                    upstream: up.name().to_string(),
                    image: image.clone(),
                    digest: Some(digest.to_string()),
                    rule: rule.name(),
                    result: failure.label().into(),
                    method: None,
                    identity: None,
                    issuer: None,
                    signed_at: None,
                    reason: Some(failure.to_string()),
                    at: tender_store::now_secs(),
                });
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
        self.verification.record(Decision {
            upstream: up.name().to_string(),
            image,
            digest: Some(digest.to_string()),
            rule: rule.name(),
            result: "verified".into(),
            method: Some(record.method.clone()),
            identity: Some(record.identity.clone()),
            issuer: record.issuer.clone(),
            signed_at: record.signed_at,
            reason: None,
            at: now,
        });
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
            let payload = self
                .small_blob(up, repo, &layer.payload, cosign::MAX_PAYLOAD)
                .await
                .map_err(|e| Failure::Unavailable(e.to_string()))?;
            out.push((layer, payload));
        }
        Ok(out)
    }

    /// `digest`'s Sigstore bundles in `repo`: the referrers with a bundle artifact type (the
    /// referrers API, then its fallback tag `sha256-<hex>`), each one's bundle layer. What
    /// cannot be fetched is passed over: the `.sig` tag may still verify.
    async fn bundles(self: &Arc<Self>, up: &Arc<Upstream>, repo: &RepoName, digest: &Digest) -> Vec<Bytes> {
        let mut referrers: Vec<Digest> = Vec::new();
        let query = [("artifactType".to_string(), bundle::BUNDLE_V03.to_string())];
        let kind = crate::mirror::ListingKind::Referrers(*digest);
        if let Ok(listing) = self.listing(up, repo, &kind, &query, repo, None).await {
            referrers.extend(bundle_referrers(&listing.body));
        }
        if referrers.is_empty() {
            let tag = format!("{}-{}", digest.algorithm().name(), digest.hex());
            if let Ok(reference) = tag.parse::<Reference>() {
                if let Ok(hit) = self.resolve_boxed(up, repo, reference).await {
                    if media::is_index(&hit.media_type) {
                        referrers.extend(bundle_referrers(&hit.bytes));
                    } else {
                        referrers.push(hit.digest);
                    }
                }
            }
        }
        let mut out = Vec::new();
        for r in referrers.into_iter().take(bundle::MAX_BUNDLES) {
            let Ok(hit) = self.resolve_boxed(up, repo, Reference::Digest(r)).await else { continue };
            for layer in bundle_layers(&hit.bytes).into_iter().take(bundle::MAX_BUNDLES.saturating_sub(out.len())) {
                match self.small_blob(up, repo, &layer, bundle::MAX_BUNDLE).await {
                    Ok(b) => out.push(b),
                    Err(e) => tracing::warn!(%digest, bundle = %layer, error = %e, "Sigstore bundle not fetched"),
                }
            }
        }
        out
    }

    /// `resolve`, behind a named boxed future: the signature manifest is resolved from inside a
    /// manifest fill, and the named type ends the recursion of future types.
    fn resolve_boxed<'a>(
        self: &'a Arc<Self>,
        up: &'a Arc<Upstream>,
        repo: &'a RepoName,
        reference: Reference,
    ) -> futures::future::BoxFuture<'a, Result<crate::mirror::ManifestHit, FetchError>> {
        async move { self.resolve(up, repo, &reference, &[], true).await }.boxed()
    }

    /// A small blob of signature material (a payload, a bundle): stored (an import carried it),
    /// or fetched, checked and kept (an export carries it on).
    async fn small_blob(&self, up: &Arc<Upstream>, repo: &RepoName, d: &Digest, max: u64) -> Result<Bytes, FetchError> {
        let store = self.flights().store();
        let d = *d;
        if store.object_len(&d).is_some_and(|l| l <= max) {
            if let Ok(Some(b)) = store.read_small(&d) {
                return Ok(b);
            }
        }
        let path = format!("/v2/{repo}/blobs/{d}");
        let scope = format!("repository:{repo}:pull");
        let resp = up.request(Method::GET, &path, HeaderMap::new(), Some(&scope)).await?;
        let body = up.read_small(resp, usize::try_from(max).unwrap_or(usize::MAX), "signature material").await?;
        if d.algorithm().digest(&body) != d {
            return Err(FetchError::new(
                FetchErrorKind::Corrupt,
                up.name(),
                format!("signature blob {d} has other bytes"),
            ));
        }
        match store.put_bytes(&format!("blob:{d}"), &body, &d) {
            Ok(_) => {
                if let Err(e) = store.record_known(&d, up.name()) {
                    tracing::warn!(digest = %d, error = %e, "signature blob's known record not written");
                }
            }
            Err(e) => tracing::warn!(digest = %d, error = %e, "signature blob not kept"),
        }
        Ok(body)
    }
}
