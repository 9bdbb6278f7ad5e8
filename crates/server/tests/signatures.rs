//! The signature policy (`imageVerification`, issue 34) on the way to a manifest, against the
//! fake upstream: cosign tag-scheme signatures made here with a P-256 key, as `cosign sign
//! --key` makes them. What verifies is served and stored with its verdict; what does not is
//! refused 403 DENIED with the reason and never reaches the store.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use support::*;
use tender_oci::Digest;
use tender_verify::policy::{RawPolicy, RawPublicKey, RawRule};
use tender_verify::Policy;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

struct Signer {
    pair: EcdsaKeyPair,
    public_pem: String,
}

impl Signer {
    fn new() -> Signer {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        let public_pem = rcgen::KeyPair::try_from(pkcs8.as_ref()).unwrap().public_key_pem();
        Signer { pair, public_pem }
    }

    /// Sign `digest` of `repo` in `fake` the way cosign does: a simple-signing payload blob
    /// and a `sha256-<hex>.sig` manifest whose layer carries the signature annotation.
    fn sign(&self, fake: &FakeUpstream, repo: &str, digest: &str, names: &str) {
        let payload = format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"ghcr.io/{repo}"}},"image":{{"docker-manifest-digest":"{names}"}},"type":"cosign container image signature"}},"optional":null}}"#
        );
        let sig = self.pair.sign(&ring::rand::SystemRandom::new(), payload.as_bytes()).unwrap();
        let sig = base64::engine::general_purpose::STANDARD.encode(sig.as_ref());
        let layer = fake.add_blob(Bytes::from(payload.clone()));
        let config = fake.add_blob(Bytes::from_static(b"{}"));
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config}","size":2}},"layers":[{{"mediaType":"application/vnd.dev.cosign.simplesigning.v1+json","digest":"{layer}","size":{},"annotations":{{"dev.cosignproject.cosign/signature":"{sig}"}}}}]}}"#,
            payload.len()
        );
        let tag = digest.replace(':', "-") + ".sig";
        fake.add_manifest(repo, &tag, OCI_MANIFEST, manifest.as_bytes());
    }
}

fn image(fake: &FakeUpstream, repo: &str, tag: &str, seed: u64) -> String {
    let layer = fake.add_blob(random_bytes(100, seed));
    let m = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{layer}","size":100}},"layers":[]}}"#
    );
    fake.add_manifest(repo, tag, OCI_MANIFEST, m.as_bytes())
}

fn keyed(image: &str, key: &str) -> RawRule {
    RawRule {
        image: image.into(),
        public_key: Some(RawPublicKey { key: Some(key.into()), certificate: None }),
        ..RawRule::default()
    }
}

fn policy(rules: Vec<RawRule>) -> Arc<Policy> {
    Arc::new(Policy::compile(&RawPolicy { rules, ..RawPolicy::default() }, None).unwrap())
}

fn stored(tender: &Tender, digest: &str) -> bool {
    tender.store.object_len(&digest.parse::<Digest>().unwrap()).is_some()
}

fn message(got: &Got) -> String {
    String::from_utf8_lossy(got.body.as_ref().unwrap()).to_string()
}

fn verifications(tender: &Tender, result: &str) -> u64 {
    tender.metrics.verifications.get_or_create(&vec![("result".to_string(), result.to_string())]).get()
}

#[tokio::test]
async fn should_serve_a_signed_image_and_refuse_an_unsigned_one() {
    let fake = FakeUpstream::start().await;
    let signer = Signer::new();
    let signed = image(&fake, "org/signed", "v1", 1);
    signer.sign(&fake, "org/signed", &signed, &signed);
    let unsigned = image(&fake, "org/unsigned", "v1", 2);
    let tender = Tender::in_front_of(&fake).await;
    tender.app.mirror().set_policy(policy(vec![keyed("ghcr.io/org/*", &signer.public_pem)]));

    let got = get(&tender.url("/v2/org/signed/manifests/v1?ns=ghcr.io"), &[]).await;
    assert_eq!(got.status, 200, "{}", message(&got));
    assert!(stored(&tender, &signed));
    let verdict = tender.store.verdict_get(&signed.parse().unwrap()).unwrap().expect("a verdict is stored");
    assert_eq!((verdict.rule, verdict.method.as_str()), (0, "key"));
    assert!(verdict.identity.starts_with("sha256:"), "{verdict:?}");
    assert_eq!(verifications(&tender, "verified"), 1);

    // A hit reads the verdict: no signature is fetched again.
    let gets = fake.state.manifest_gets.load(Ordering::SeqCst);
    let got = get(&tender.url(&format!("/v2/org/signed/manifests/{signed}?ns=ghcr.io")), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(fake.state.manifest_gets.load(Ordering::SeqCst), gets, "a hit asks nothing");
    assert_eq!(verifications(&tender, "verified"), 1);

    for _ in 0..2 {
        let got = get(&tender.url("/v2/org/unsigned/manifests/v1?ns=ghcr.io"), &[]).await;
        assert_eq!(got.status, 403, "{}", message(&got));
        let text = message(&got);
        assert!(text.contains("DENIED") && text.contains("no signature"), "{text}");
        assert!(text.contains("imageVerification.rules[0] (ghcr.io/org/*)"), "{text}");
    }
    assert!(!stored(&tender, &unsigned), "nothing unsigned reaches the store");
    let record = tender.store.tag_get("ghcr.io", "org/unsigned", "v1").unwrap();
    assert!(record.is_none(), "the tag of a refused manifest is not recorded");
    assert_eq!(verifications(&tender, "unsigned"), 2, "a refusal is never cached as a success");

    // The decisions, per digest, in /api/v1/fills and on the status page.
    let v: serde_json::Value = client().get(tender.url("/api/v1/fills")).send().await.unwrap().json().await.unwrap();
    let list = v["verifications"].as_array().unwrap();
    let ok = list.iter().find(|d| d["digest"] == signed.as_str()).expect("the verified digest is listed");
    assert_eq!((ok["result"].as_str(), ok["method"].as_str()), (Some("verified"), Some("key")), "{ok}");
    assert_eq!(ok["image"], "ghcr.io/org/signed");
    let refused = list.iter().find(|d| d["digest"] == unsigned.as_str()).expect("the refusal is listed");
    assert_eq!(refused["result"], "unsigned");
    assert_eq!(refused["reason"], "no signature");
    let page = client().get(tender.url("/")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("id=\"verifications\"") && page.contains("ghcr.io/org/unsigned"), "status page");
}

#[tokio::test]
async fn should_refuse_a_wrong_key_and_a_payload_for_another_digest() {
    let fake = FakeUpstream::start().await;
    let (signer, other) = (Signer::new(), Signer::new());
    let a = image(&fake, "org/a", "v1", 3);
    other.sign(&fake, "org/a", &a, &a);
    let b = image(&fake, "org/b", "v1", 4);
    let c = image(&fake, "org/b", "v2", 5);
    signer.sign(&fake, "org/b", &b, &c);
    let tender = Tender::in_front_of(&fake).await;
    tender.app.mirror().set_policy(policy(vec![keyed("ghcr.io/org/*", &signer.public_pem)]));

    let got = get(&tender.url("/v2/org/a/manifests/v1?ns=ghcr.io"), &[]).await;
    assert_eq!(got.status, 403);
    assert!(message(&got).contains("signature does not verify: not signed by the key"), "{}", message(&got));
    let got = get(&tender.url("/v2/org/b/manifests/v1?ns=ghcr.io"), &[]).await;
    assert_eq!(got.status, 403);
    assert!(message(&got).contains("payload names another digest"), "{}", message(&got));
    assert!(!stored(&tender, &a) && !stored(&tender, &b));
    assert_eq!(verifications(&tender, "invalid"), 2);
}

#[tokio::test]
async fn should_deny_without_asking_and_skip_as_today() {
    let fake = FakeUpstream::start().await;
    image(&fake, "blocked/x", "v1", 6);
    image(&fake, "open/x", "v1", 7);
    let tender = Tender::in_front_of(&fake).await;
    let rules = vec![
        RawRule { image: "ghcr.io/blocked/*".into(), deny: true, ..RawRule::default() },
        RawRule { image: "ghcr.io/open/*".into(), skip: true, ..RawRule::default() },
        keyed("*", &Signer::new().public_pem),
    ];
    tender.app.mirror().set_policy(policy(rules));
    let got = get(&tender.url("/v2/blocked/x/manifests/v1?ns=ghcr.io"), &[]).await;
    assert_eq!(got.status, 403);
    assert!(message(&got).contains("denied by the signature policy"), "{}", message(&got));
    assert_eq!(fake.requests(), 0, "a deny rule answers without asking the upstream");
    assert_eq!(get(&tender.url("/v2/open/x/manifests/v1?ns=ghcr.io"), &[]).await.status, 200);
    assert_eq!(verifications(&tender, "denied"), 1);
}

#[tokio::test]
async fn should_cover_an_index_children_and_refuse_a_child_alone() {
    let fake = FakeUpstream::start().await;
    let signer = Signer::new();
    let child = image(&fake, "org/multi", "amd64", 8);
    let index = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{{"mediaType":"{OCI_MANIFEST}","digest":"{child}","size":1,"platform":{{"os":"linux","architecture":"amd64"}}}}]}}"#
    );
    let index = fake.add_manifest("org/multi", "v1", OCI_INDEX, index.as_bytes());
    signer.sign(&fake, "org/multi", &index, &index);
    let lone = image(&fake, "org/lone", "amd64", 9);
    let tender = Tender::in_front_of(&fake).await;
    tender.app.mirror().set_policy(policy(vec![keyed("ghcr.io/org/*", &signer.public_pem)]));

    // A child asked for by digest before its index: it has no signature of its own.
    let got = get(&tender.url(&format!("/v2/org/multi/manifests/{child}?ns=ghcr.io")), &[]).await;
    assert_eq!(got.status, 403, "{}", message(&got));
    assert!(message(&got).contains("no signature"));
    let got = get(&tender.url("/v2/org/multi/manifests/v1?ns=ghcr.io"), &[]).await;
    assert_eq!(got.status, 200, "{}", message(&got));
    let got = get(&tender.url(&format!("/v2/org/multi/manifests/{child}?ns=ghcr.io")), &[]).await;
    assert_eq!(got.status, 200, "the verified index covers its child: {}", message(&got));
    let v = tender.store.verdict_get(&child.parse().unwrap()).unwrap().unwrap();
    assert_eq!((v.method.as_str(), v.parent), ("parent", Some(index.parse().unwrap())));
    let got = get(&tender.url(&format!("/v2/org/lone/manifests/{lone}?ns=ghcr.io")), &[]).await;
    assert_eq!(got.status, 403);
}

#[tokio::test]
async fn should_verify_again_when_the_policy_changes() {
    let fake = FakeUpstream::start().await;
    let (first, second) = (Signer::new(), Signer::new());
    let d = image(&fake, "org/app", "v1", 10);
    first.sign(&fake, "org/app", &d, &d);
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url("/v2/org/app/manifests/v1?ns=ghcr.io");
    assert_eq!(get(&url, &[]).await.status, 200, "no policy: served as today");
    assert!(stored(&tender, &d));
    tender.app.mirror().set_policy(policy(vec![keyed("ghcr.io/org/*", &first.public_pem)]));
    assert_eq!(get(&url, &[]).await.status, 200, "stored, verified on its next request");
    tender.app.mirror().set_policy(policy(vec![keyed("ghcr.io/org/*", &second.public_pem)]));
    let got = get(&url, &[]).await;
    assert_eq!(got.status, 403, "a changed rule verifies again: {}", message(&got));
}

impl Signer {
    /// Sign `digest` the way cosign v3 does: a Sigstore bundle (v0.3, DSSE over an in-toto
    /// statement naming the digest) in a referrer, listed under the referrers fallback tag.
    fn sign_bundle(&self, fake: &FakeUpstream, repo: &str, digest: &str, predicate: &str) {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let hex = digest.strip_prefix("sha256:").unwrap();
        let statement = format!(
            r#"{{"_type":"https://in-toto.io/Statement/v1","subject":[{{"name":"ghcr.io/{repo}","digest":{{"sha256":"{hex}"}}}}],"predicateType":"{predicate}"}}"#
        );
        let payload_type = "application/vnd.in-toto+json";
        let mut pae = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), statement.len()).into_bytes();
        pae.extend_from_slice(statement.as_bytes());
        let sig = self.pair.sign(&ring::rand::SystemRandom::new(), &pae).unwrap();
        let bundle = format!(
            r#"{{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","verificationMaterial":{{"publicKey":{{"hint":""}},"tlogEntries":[]}},"dsseEnvelope":{{"payload":"{}","payloadType":"{payload_type}","signatures":[{{"sig":"{}"}}]}}}}"#,
            b64(statement.as_bytes()),
            b64(sig.as_ref())
        );
        let bt = "application/vnd.dev.sigstore.bundle.v0.3+json";
        let layer = fake.add_blob(Bytes::from(bundle.clone()));
        let config = fake.add_blob(Bytes::from_static(b"{}"));
        let referrer = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","artifactType":"{bt}","config":{{"mediaType":"application/vnd.oci.empty.v1+json","digest":"{config}","size":2}},"layers":[{{"mediaType":"{bt}","digest":"{layer}","size":{}}}],"subject":{{"mediaType":"{OCI_MANIFEST}","digest":"{digest}","size":1}}}}"#,
            bundle.len()
        );
        let referrer_digest = sha(referrer.as_bytes());
        fake.add_manifest(repo, &format!("r-{hex}"), OCI_MANIFEST, referrer.as_bytes());
        let index = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{{"mediaType":"{OCI_MANIFEST}","digest":"{referrer_digest}","size":{},"artifactType":"{bt}"}}]}}"#,
            referrer.len()
        );
        fake.add_manifest(repo, &format!("sha256-{hex}"), OCI_INDEX, index.as_bytes());
    }
}

#[tokio::test]
async fn should_verify_a_sigstore_bundle_referrer_and_refuse_an_attestation() {
    let fake = FakeUpstream::start().await;
    let signer = Signer::new();
    let signed = image(&fake, "org/bundled", "v1", 11);
    signer.sign_bundle(&fake, "org/bundled", &signed, "https://sigstore.dev/cosign/sign/v1");
    let attested = image(&fake, "org/attested", "v1", 12);
    signer.sign_bundle(&fake, "org/attested", &attested, "https://slsa.dev/provenance/v1");
    let tender = Tender::in_front_of(&fake).await;
    tender.app.mirror().set_policy(policy(vec![keyed("ghcr.io/org/*", &signer.public_pem)]));

    let got = get(&tender.url("/v2/org/bundled/manifests/v1?ns=ghcr.io"), &[]).await;
    assert_eq!(got.status, 200, "{}", message(&got));
    assert!(tender.store.verdict_get(&signed.parse().unwrap()).unwrap().is_some());
    let got = get(&tender.url("/v2/org/attested/manifests/v1?ns=ghcr.io"), &[]).await;
    assert_eq!(got.status, 403);
    assert!(
        message(&got).contains("an attestation (https://slsa.dev/provenance/v1), not a signature"),
        "{}",
        message(&got)
    );
    assert!(!stored(&tender, &attested));
}

#[tokio::test]
async fn should_verify_once_however_many_clients_ask_at_once() {
    let fake = FakeUpstream::start().await;
    let signer = Signer::new();
    let d = image(&fake, "org/busy", "v1", 13);
    signer.sign(&fake, "org/busy", &d, &d);
    let tender = Tender::in_front_of(&fake).await;
    let url = tender.url(&format!("/v2/org/busy/manifests/{d}?ns=ghcr.io"));
    assert_eq!(get(&url, &[]).await.status, 200, "stored before any policy");
    // A policy arrives: every client of the stored manifest needs its verdict at once.
    tender.app.mirror().set_policy(policy(vec![keyed("ghcr.io/org/*", &signer.public_pem)]));
    let asks: Vec<_> = (0..16).map(|_| get(&url, &[])).collect();
    for got in futures::future::join_all(asks).await {
        assert_eq!(got.status, 200, "{}", message(&got));
    }
    let paths = fake.state.paths.lock().unwrap().clone();
    let sig_gets = paths.iter().filter(|p| p.ends_with(".sig")).count();
    assert_eq!(sig_gets, 1, "the signature is fetched once");
    assert_eq!(verifications(&tender, "verified"), 1, "and verified once");
}
