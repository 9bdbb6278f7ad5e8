//! Issue 34 through real peers: docker-registry holds a cosign-signed image (a multi-arch
//! index, signed with a P-256 key made here, the signature pushed in cosign's tag scheme) and
//! an unsigned one; tender in front of it with an `imageVerification` rule for both. skopeo and
//! containerd pull the signed image whole; both are refused the unsigned one with tender's
//! reason, which never reaches tender's store. A `deny` rule answers without asking the
//! upstream, and a rule without a verifier is refused at start.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use tender_e2e::containerd::Containerd;
use tender_e2e::digest::{hex_of, sha256, verify_oci_layout};
use tender_e2e::registry::Sizes;
use tender_e2e::tender::{self, write_config, Tender};
use tender_e2e::{http, proc};

use crate::t15_protocol::{push_blob, push_manifest, OCI_MANIFEST};
use crate::{oci, skopeo_pull, Bed};

const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const RULE: &str = "imageVerification.rules[0] (ghcr.io/org/*)";

/// A cosign key pair: signs as `cosign sign --key` does (ECDSA P-256, SHA-256, DER).
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

    /// Push to `registry` the cosign signature of `repo@digest` in the tag scheme: the
    /// simple-signing payload blob, an `{}` config blob and the `sha256-<hex>.sig` manifest
    /// whose layer carries the signature annotation. Returns the signature manifest's digest.
    fn sign(&self, registry: &str, repo: &str, digest: &str, work: &Path) -> String {
        let payload = format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"{registry}/{repo}"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
        );
        let sig = self.pair.sign(&ring::rand::SystemRandom::new(), payload.as_bytes()).unwrap();
        let sig = base64::engine::general_purpose::STANDARD.encode(sig.as_ref());
        let layer = push_blob(registry, repo, payload.as_bytes(), work);
        let config = push_blob(registry, repo, b"{}", work);
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config}","size":2}},"layers":[{{"mediaType":"{SIMPLE_SIGNING}","digest":"{layer}","size":{},"annotations":{{"dev.cosignproject.cosign/signature":"{sig}"}}}}]}}"#,
            payload.len()
        );
        let tag = format!("{}.sig", digest.replacen(':', "-", 1));
        push_manifest(registry, repo, &tag, OCI_MANIFEST, &manifest, work)
    }
}

/// `imageVerification:` with `rules` (YAML list items, indented by four).
fn policy_yaml(rules: &str) -> String {
    format!("imageVerification:\n  rules:\n{rules}")
}

/// A `publicKey` rule for `image`, the PEM as a block scalar.
fn key_rule(image: &str, pem: &str) -> String {
    let mut y = format!("    - image: \"{image}\"\n      publicKey:\n        key: |\n");
    for line in pem.lines() {
        y.push_str(&format!("          {line}\n"));
    }
    y
}

/// Copy an image of the bed's source layout to `registry/<repo:tag>`, digests preserved.
fn push_from_layout(bed: &Bed, name: &str, dest: &str) {
    proc::run(Command::new("skopeo").args([
        "copy",
        "-q",
        "--all",
        "--preserve-digests",
        "--dest-tls-verify=false",
        &format!("oci:{}:{name}", bed.images.layout().display()),
        &format!("docker://{}/{dest}", bed.registry.hostport()),
    ]));
}

/// `skopeo copy` through tender expected to fail: its stderr.
fn skopeo_refused(t: &Tender, name: &str, dest: &Path) -> String {
    let out = proc::output(Command::new("skopeo").args([
        "copy",
        "-q",
        "--all",
        "--src-tls-verify=false",
        &format!("docker://{}/{name}", t.hostport()),
        &oci(dest),
    ]));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "skopeo pulled {name} through tender:\n{stderr}");
    stderr
}

/// `ctr images pull` of `image` through tender (hosts.toml maps ghcr.io to it): its output.
pub(crate) fn ctr_pull(ctrd: &Containerd, hosts: &Path, image: &str) -> (bool, String) {
    let out = ctrd.ctr(&[
        "-n",
        "e2e",
        "images",
        "pull",
        "--hosts-dir",
        hosts.to_str().unwrap(),
        "--platform",
        "linux/amd64",
        "--snapshotter",
        "native",
        image,
    ]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// A committed object of tender's data directory (`objects/sha256/<xx>/<hex>`).
fn object(data: &Path, digest: &str) -> PathBuf {
    let hex = hex_of(digest);
    data.join("objects/sha256").join(&hex[..2]).join(hex)
}

/// A verdict of tender's data directory (`verdicts/sha256/<xx>/<hex>.json`).
fn verdict(data: &Path, digest: &str) -> PathBuf {
    let hex = hex_of(digest);
    data.join("verdicts/sha256").join(&hex[..2]).join(format!("{hex}.json"))
}

/// The value of `tender_verifications_total{result="<result>"}` (0 when absent).
fn verifications(t: &Tender, result: &str) -> f64 {
    let text = http::get(t.addr, "/metrics").unwrap().text();
    let prefix = format!("tender_verifications_total{{result=\"{result}\"}} ");
    text.lines().filter_map(|l| l.strip_prefix(&prefix)).filter_map(|v| v.trim().parse::<f64>().ok()).sum()
}

/// The message of a JSON error body's first error, with its code.
fn error_of(r: &http::Response) -> (String, String) {
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.text()));
    let s = |k: &str| v["errors"][0][k].as_str().unwrap_or_default().to_string();
    (s("code"), s("message"))
}

#[test]
fn should_serve_a_signed_image_and_refuse_an_unsigned_one_to_skopeo_and_containerd() {
    let bed = Bed::new("signatures", Sizes { kubelet: "1", installer: "1", big_mb: 0 });
    let reg = bed.registry.hostport();
    // org/signed:v1 is the kubelet index (amd64 + arm64), org/unsigned:v1 the installer manifest.
    push_from_layout(&bed, "kubelet", "org/signed:v1");
    push_from_layout(&bed, "installer", "org/unsigned:v1");
    let (signed, unsigned) = (bed.images.var("KUBELET_INDEX").to_string(), bed.images.var("INSTALLER_MANIFEST"));
    let work = bed.path("push");
    std::fs::create_dir_all(&work).unwrap();
    let signer = Signer::new();
    let sig_manifest = signer.sign(&reg, "org/signed", &signed, &work);

    let url = bed.registry.url();
    let rules = key_rule("ghcr.io/org/*", &signer.public_pem);
    write_config(&bed.path("tender.yaml"), &[("ghcr.io", &url)], &policy_yaml(&rules));
    let t = bed.start_tender("tender.log");

    // skopeo: the signed index, both platforms, byte for byte.
    let pulled = bed.path("pulled-signed");
    skopeo_pull(&t, "ghcr.io/org/signed:v1", &oci(&pulled));
    let (top, blobs) = verify_oci_layout(&pulled);
    assert_eq!(top, [signed.as_str()], "skopeo got the signed index");
    for m in [bed.images.var("KUBELET_AMD64"), bed.images.var("KUBELET_ARM64")] {
        assert!(blobs.contains(m), "both platforms' manifests came through ({m})");
    }

    // containerd, through the ns route, pulls and unpacks it.
    let ctrd = Containerd::start(&bed.path("containerd"));
    let hosts = ctrd.hosts_dir("ghcr.io", &t.hostport());
    let (ok, out) = ctr_pull(&ctrd, &hosts, "ghcr.io/org/signed:v1");
    assert!(ok, "ctr pulls the signed image through tender:\n{out}");
    let ls = String::from_utf8_lossy(&ctrd.ctr(&["-n", "e2e", "images", "ls"]).stdout).into_owned();
    assert!(
        ls.lines().any(|l| l.starts_with("ghcr.io/org/signed:v1") && l.contains(&signed)),
        "containerd recorded the signed index:\n{ls}"
    );

    // The unsigned image: refused to both clients, with tender's reason.
    let stderr = skopeo_refused(&t, "ghcr.io/org/unsigned:v1", &bed.path("pulled-unsigned"));
    eprintln!("skopeo on the unsigned image:\n{stderr}");
    for want in ["denied", "no signature", RULE] {
        assert!(stderr.contains(want), "skopeo's error names {want:?}:\n{stderr}");
    }
    let (ok, out) = ctr_pull(&ctrd, &hosts, "ghcr.io/org/unsigned:v1");
    eprintln!("ctr on the unsigned image:\n{out}");
    assert!(!ok, "ctr pulled the unsigned image through tender:\n{out}");
    // containerd answers a HEAD (no body to read tender's reason from) and, on the 403, tries
    // the next host of hosts.toml: here the closed fallback, on a node the registry itself.
    let refused = format!("pulling from host {} failed with status code [manifests v1]: 403 Forbidden", t.hostport());
    assert!(out.contains(&refused), "ctr's error names tender and the refusal:\n{out}");
    let named = format!("ghcr.io/org/unsigned@{unsigned}");
    for path in ["/v2/ghcr.io/org/unsigned/manifests/v1", "/v2/org/unsigned/manifests/v1?ns=ghcr.io"] {
        let r = http::get(t.addr, path).unwrap();
        assert_eq!(r.status(), 403, "GET {path}: {}", r.text());
        let (code, message) = error_of(&r);
        assert_eq!(code, "DENIED", "GET {path}: {}", r.text());
        for want in ["no signature", RULE, named.as_str()] {
            assert!(message.contains(want), "GET {path}: the message names {want:?}: {message}");
        }
    }

    // Nothing unsigned reached the store: not the manifest, nor its config and layer, nor a
    // verdict. The signed index has its verdict (by key), its children theirs (by the index).
    let data = &t.data;
    for d in std::iter::once(unsigned.to_string()).chain(bed.images.config_and_layers(unsigned)) {
        assert!(!object(data, &d).exists(), "{d} of the unsigned image is in tender's store");
    }
    assert!(!verdict(data, unsigned).exists(), "the unsigned manifest has a verdict");
    assert!(object(data, &signed).exists(), "the signed index is stored");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(verdict(data, &signed)).unwrap()).unwrap();
    assert_eq!((v["method"].as_str(), v["rule"].as_u64()), (Some("key"), Some(0)), "{v}");
    let text = std::fs::read_to_string(verdict(data, &signed)).unwrap();
    assert!(text.contains(r#""method": "key""#), "{text}");
    let amd64 = bed.images.var("KUBELET_AMD64");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(verdict(data, amd64)).unwrap()).unwrap();
    assert_eq!((v["method"].as_str(), v["parent"].as_str()), (Some("parent"), Some(signed.as_str())), "{v}");
    // The signature itself is no image: no verdict of its own.
    assert!(!verdict(data, &sig_manifest).exists());

    assert!(verifications(&t, "verified") >= 1.0, "{}", http::get(t.addr, "/metrics").unwrap().text());
    assert!(verifications(&t, "unsigned") >= 1.0, "{}", http::get(t.addr, "/metrics").unwrap().text());
    drop(t);

    // A deny rule before the key rule: 403 at once, the upstream not asked about org/unsigned.
    let deny = format!("    - image: \"ghcr.io/org/unsigned\"\n      deny: true\n{rules}");
    write_config(&bed.path("deny.yaml"), &[("ghcr.io", &url)], &policy_yaml(&deny));
    let t = Tender::start(&bed.path("deny.yaml"), &bed.path("data-deny"), &bed.path("deny.log"));
    let offset = bed.registry.log_len();
    let stderr = skopeo_refused(&t, "ghcr.io/org/unsigned:v1", &bed.path("pulled-denied"));
    eprintln!("skopeo on the denied image:\n{stderr}");
    assert!(stderr.contains("denied by the signature policy"), "{stderr}");
    let r = http::get(t.addr, "/v2/org/unsigned/manifests/v1?ns=ghcr.io").unwrap();
    assert_eq!(r.status(), 403, "{}", r.text());
    let (code, message) = error_of(&r);
    assert_eq!(code, "DENIED");
    assert!(message.contains("imageVerification.rules[0] (ghcr.io/org/unsigned)"), "{message}");
    assert!(message.contains("denied by the signature policy"), "{message}");
    let asked: Vec<String> =
        bed.registry.requests_since(offset).into_iter().filter(|l| l.contains("/org/unsigned/")).collect();
    assert!(asked.is_empty(), "a deny rule answers without asking the upstream: {asked:?}");
    assert!(verifications(&t, "denied") >= 2.0);
    // The key rule, now rules[1], still verifies the signed image.
    let r = http::get(t.addr, "/v2/ghcr.io/org/signed/manifests/v1").unwrap();
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(sha256(&r.body), signed);
    drop(t);

    // A rule without a verifier: refused at start, exit 2, the rule named.
    let bad = bed.path("bad.yaml");
    write_config(&bad, &[("ghcr.io", &url)], &policy_yaml("    - image: \"ghcr.io/org/*\"\n"));
    let data = bed.path("data-bad");
    let out = tender::run([
        "serve".as_ref(),
        "--config".as_ref(),
        bad.as_os_str(),
        "--data".as_ref(),
        data.as_os_str(),
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a rule without a verifier is a config error: {stderr}");
    assert!(stderr.contains("imageVerification.rules[0]"), "{stderr}");
}
