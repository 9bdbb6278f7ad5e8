//! Real signatures, made by cosign and by the public-good Sigstore services, verified offline
//! against the public-good trusted root. Sources and commits: testdata/sigstore/README.md.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::PathBuf;

use tender_oci::Digest;
use tender_verify::cosign::{SignatureLayer, SIMPLE_SIGNING};
use tender_verify::policy::{RawKeyless, RawPolicy, RawPublicKey, RawRule};
use tender_verify::{verify, Candidate, Failure, Policy, TrustedRoot};

fn data(path: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sigstore").join(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn text(path: &str) -> String {
    String::from_utf8(data(path)).unwrap()
}

/// The signature layer cosign writes for `dir` (its annotations, the payload's digest).
fn layer(dir: &str, keyless: bool) -> SignatureLayer {
    let payload = data(&format!("{dir}/payload.json"));
    SignatureLayer {
        payload: tender_oci::Algorithm::Sha256.digest(&payload),
        size: payload.len() as u64,
        signature: text(&format!("{dir}/signature.b64")),
        certificate: keyless.then(|| text(&format!("{dir}/cert.pem"))),
        chain: keyless.then(|| text(&format!("{dir}/chain.pem"))),
        bundle: std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../testdata/sigstore/{dir}/bundle.json")),
        )
        .ok(),
    }
}

fn image_digest(dir: &str) -> Digest {
    tender_oci::Algorithm::Sha256.digest(&data(&format!("{dir}/image-manifest.json")))
}

fn keyed_policy(key: &str) -> Policy {
    let rule = RawRule {
        image: "*".into(),
        public_key: Some(RawPublicKey { key: Some(key.into()), certificate: None }),
        ..RawRule::default()
    };
    Policy::compile(&RawPolicy { rules: vec![rule], ..RawPolicy::default() }, None).unwrap()
}

fn keyless_policy(issuer: &str, subject: &str) -> Policy {
    let rule = RawRule {
        image: "*".into(),
        keyless: Some(RawKeyless { issuer: Some(issuer.into()), subject: Some(subject.into()), subject_regex: None }),
        ..RawRule::default()
    };
    let raw = RawPolicy { trusted_root: Some("trusted_root.json".into()), rules: vec![rule], ..RawPolicy::default() };
    Policy::compile(&raw, Some(&data("trusted_root.json"))).unwrap()
}

#[test]
fn should_parse_the_public_good_trusted_root() {
    let root = TrustedRoot::parse(&data("trusted_root.json")).unwrap();
    assert!(root.authorities.len() >= 2 && !root.tlogs.is_empty() && !root.ctlogs.is_empty());
    let rekor = hex_id("c0d23d6ad406973f9559f3ba2d1ca01f84147d8ffc5b8445c224f98b9591801d");
    assert!(root.tlog(&rekor).is_some(), "rekor.sigstore.dev is pinned");
    let ctfe = hex_id("dd3d306ac6c7113263191e1c99673702a24a5eb8de3cadff878a72802f29ee8e");
    assert!(root.ctlog(&ctfe).is_some(), "ctfe.sigstore.dev/2022 is pinned");
}

fn hex_id(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn should_verify_a_keyed_signature_cosign_made() {
    let policy = keyed_policy(&text("keyed/cosign.pub"));
    let l = layer("keyed", false);
    let payload = data("keyed/payload.json");
    let digest = image_digest("keyed");
    let found = [Candidate { layer: &l, payload: &payload }];
    let v = verify(&policy, &policy.rules[0], &digest, &found).unwrap();
    assert_eq!((v.method, v.rule), ("key", 0));

    // The other fixture's key, and another digest, do not verify.
    let other = keyed_policy(&text("keyed-rekor/cosign.pub"));
    let e = verify(&other, &other.rules[0], &digest, &found).unwrap_err();
    assert!(matches!(e, Failure::DoesNotVerify(ref m) if m.contains("not signed by the key")), "{e}");
    let e = verify(&policy, &policy.rules[0], &image_digest("keyless"), &found).unwrap_err();
    assert!(e.to_string().contains("payload names another digest"), "{e}");
}

#[test]
fn should_verify_a_keyed_signature_logged_in_rekor() {
    let policy = keyed_policy(&text("keyed-rekor/cosign.pub"));
    let l = layer("keyed-rekor", false);
    let payload = data("keyed-rekor/payload.json");
    let found = [Candidate { layer: &l, payload: &payload }];
    verify(&policy, &policy.rules[0], &image_digest("keyed-rekor"), &found).unwrap();
}

#[test]
fn should_verify_a_real_keyless_signature_offline() {
    let policy = keyless_policy("https://github.com/login/oauth", "mitr@redhat.com");
    let l = layer("keyless", true);
    let payload = data("keyless/payload.json");
    let digest = image_digest("keyless");
    let found = [Candidate { layer: &l, payload: &payload }];
    let v = verify(&policy, &policy.rules[0], &digest, &found).unwrap();
    assert_eq!(v.method, "keyless");
    assert_eq!(v.identity, "mitr@redhat.com");
    assert_eq!(v.issuer.as_deref(), Some("https://github.com/login/oauth"));
    assert_eq!(v.signed_at, Some(1_674_247_893));

    // The same evidence for someone else's identity, or issuer: a mismatch naming who signed.
    for policy in [
        keyless_policy("https://github.com/login/oauth", "someone@example.com"),
        keyless_policy("https://accounts.google.com", "mitr@redhat.com"),
    ] {
        let e = verify(&policy, &policy.rules[0], &digest, &found).unwrap_err();
        assert_eq!(e, Failure::IdentityMismatch("mitr@redhat.com from https://github.com/login/oauth".into()));
        assert_eq!(e.to_string(), "identity mismatch: got mitr@redhat.com from https://github.com/login/oauth");
    }
}

#[test]
fn should_refuse_the_real_keyless_signature_when_any_part_is_changed() {
    let policy = keyless_policy("https://github.com/login/oauth", "mitr@redhat.com");
    let digest = image_digest("keyless");
    let payload = data("keyless/payload.json");
    let base = layer("keyless", true);
    let bundle = base.bundle.clone().unwrap();
    let cases: Vec<(SignatureLayer, &str)> = vec![
        (SignatureLayer { bundle: None, ..base.clone() }, "no Rekor bundle"),
        (
            SignatureLayer {
                bundle: Some(bundle.replace("\"integratedTime\":1674247893", "\"integratedTime\":1674247894")),
                ..base.clone()
            },
            "signed entry timestamp does not verify",
        ),
        (
            SignatureLayer { bundle: Some(bundle.replace("c0d23d6ad4", "00d23d6ad4")), ..base.clone() },
            "not in the trusted root",
        ),
        (SignatureLayer { chain: None, ..base.clone() }, ""),
    ];
    for (l, want) in cases {
        let found = [Candidate { layer: &l, payload: &payload }];
        let r = verify(&policy, &policy.rules[0], &digest, &found);
        if want.is_empty() {
            // The chain annotation is optional: the trusted root holds the intermediate.
            r.unwrap();
            continue;
        }
        let e = r.unwrap_err();
        assert!(matches!(e, Failure::DoesNotVerify(_)) && e.to_string().contains(want), "{want}: {e}");
    }
    // A payload changed by one byte: its layer digest no longer matches, or its signature fails.
    let mut tampered = payload.clone();
    tampered[20] ^= 1;
    let l = SignatureLayer { payload: tender_oci::Algorithm::Sha256.digest(&tampered), ..base.clone() };
    let found = [Candidate { layer: &l, payload: &tampered }];
    let e = verify(&policy, &policy.rules[0], &digest, &found).unwrap_err();
    assert!(e.to_string().contains("not the certificate's"), "{e}");
    // Without a trusted root's CA (another root), the chain fails.
    let mut root: serde_json::Value = serde_json::from_slice(&data("trusted_root.json")).unwrap();
    let cas = root["certificateAuthorities"].as_array_mut().unwrap();
    cas.retain(|ca| !ca["certChain"]["certificates"][0]["rawBytes"].as_str().unwrap().starts_with(&first_ca_prefix()));
    let bytes = serde_json::to_vec(&root).unwrap();
    let rule = policy.raw.rules.clone();
    let raw = RawPolicy { trusted_root: Some("t.json".into()), rules: rule, ..RawPolicy::default() };
    let narrowed = Policy::compile(&raw, Some(&bytes)).unwrap();
    let l = layer("keyless", true);
    let found = [Candidate { layer: &l, payload: &payload }];
    let e = verify(&narrowed, &narrowed.rules[0], &digest, &found).unwrap_err();
    assert!(e.to_string().contains("chain") || e.to_string().contains("certificate authority"), "{e}");
}

/// The start of the base64 DER of the intermediate the keyless fixture chains to.
fn first_ca_prefix() -> String {
    use base64::Engine as _;
    let chain = text("keyless/chain.pem");
    let der = pem_first(&chain);
    base64::engine::general_purpose::STANDARD.encode(&der)[..60].to_string()
}

fn pem_first(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body).unwrap()
}

#[test]
fn should_know_the_simple_signing_media_type() {
    assert_eq!(SIMPLE_SIGNING, "application/vnd.dev.cosign.simplesigning.v1+json");
}

/// cosign v3's Sigstore bundle (v0.3, DSSE over an in-toto statement) of a real image, public
/// good Fulcio and Rekor: the format cosign now stores as an OCI referrer.
#[test]
fn should_verify_a_real_v03_bundle_of_an_image_offline() {
    let subject = "https://github.com/kubewarden/kubewarden-controller/.github/workflows/release.yml@refs/tags/v1.34.0";
    let issuer = "https://token.actions.githubusercontent.com";
    let digest: Digest = "sha256:c811d58de79c92f03214e63aa339484e488d694ae8a6283b5f3f17a9faf50172".parse().unwrap();
    let bundle = data("bundle-v03-image/bundle.json");
    let policy = keyless_policy(issuer, subject);
    let v = tender_verify::verify_all(&policy, &policy.rules[0], &digest, b"", &[], &[&bundle]).unwrap();
    assert_eq!((v.method, v.identity.as_str(), v.signed_at), ("keyless", subject, Some(1_775_719_409)));

    let other: Digest = "sha256:d811d58de79c92f03214e63aa339484e488d694ae8a6283b5f3f17a9faf50172".parse().unwrap();
    let e = tender_verify::verify_all(&policy, &policy.rules[0], &other, b"", &[], &[&bundle]).unwrap_err();
    assert!(e.to_string().contains("the statement names another digest"), "{e}");

    let wrong = keyless_policy(issuer, "https://github.com/someone/else/.github/workflows/release.yml@refs/tags/v1");
    let e = tender_verify::verify_all(&wrong, &wrong.rules[0], &digest, b"", &[], &[&bundle]).unwrap_err();
    assert_eq!(e, Failure::IdentityMismatch(format!("{subject} from {issuer}")));

    // The statement re-signed by nobody: a changed payload fails the DSSE signature.
    let text = String::from_utf8(bundle.clone()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let payload = v["dsseEnvelope"]["payload"].as_str().unwrap();
    let tampered = text.replace(payload, &payload.replacen('e', "f", 1));
    let e =
        tender_verify::verify_all(&policy, &policy.rules[0], &digest, b"", &[], &[tampered.as_bytes()]).unwrap_err();
    assert!(e.to_string().contains("DSSE signature does not verify"), "{e}");
}
