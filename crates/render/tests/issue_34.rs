//! Issue 34, item 4: no fallback around a refusal. A namespace that a refusing rule of tender's
//! `imageVerification` covers (keyless, publicKey, deny) is rendered without the upstream
//! fallback (containerd tries the next host on any error, so a node would pull a refused image
//! from the registry itself), and the policy goes to Talos nodes as an `ImageVerificationConfig`
//! document (Talos 1.13 and later).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use common::*;
use serde_json::{json, Value};
use tender_render::catalog::parse_config;
use tender_render::containerd::hosts_files;
use tender_render::cozystack::{render, RenderRequest};
use tender_render::registries::{MirrorPlan, RegistriesRequest, Registry};
use tender_render::talos::TalosVersion;
use tender_render::verification::{guard, render_talos, ImageVerification};

const KEY: &str = include_str!("../../../testdata/sigstore/keyed/cosign.pub");

/// A policy in tender's config: a keyed rule (tender's `publicKey.key`), a skip, a keyless rule
/// written against Docker Hub as `docker.io`, and a catch-all skip.
fn tender_config() -> String {
    let key = KEY.trim_end().replace('\n', "\n          ");
    [
        "listen: 0.0.0.0:5000",
        "upstreams:",
        "- name: ghcr.io",
        "  url: https://ghcr.io",
        "- name: docker.io",
        "  url: https://registry-1.docker.io",
        "- name: registry.k8s.io",
        "  url: https://registry.k8s.io",
        "imageVerification:",
        "  trustedRoot: /etc/tender/trusted_root.json",
        "  rules:",
        "    - image: ghcr.io/siderolabs/*",
        "      publicKey:",
        "        key: |",
        &format!("          {key}"),
        "    - image: registry.k8s.io/*",
        "      skip: true",
        "    - image: docker.io/library/*",
        "      keyless:",
        "        issuer: https://accounts.google.com",
        "        subjectRegex: .*@example\\.com",
        "    - image: '*'",
        "      skip: true",
        "",
    ]
    .join("\n")
}

fn policy(text: &str) -> ImageVerification {
    ImageVerification::read("--config tender.yaml", text).unwrap().expect("a policy")
}

fn mirror_plan(registries: &[&str]) -> MirrorPlan {
    RegistriesRequest {
        mirror: "http://tender.kube-system.svc:5000".into(),
        more_mirrors: Vec::new(),
        registries: registries.iter().map(|r| r.to_string()).collect(),
        skip_fallback: false,
        ca: None,
        client_cert: None,
        client_key: None,
        insecure_skip_verify: false,
        username: None,
        password: None,
    }
    .validate()
    .unwrap()
}

fn talos(plan: &MirrorPlan, version: &str, policy: Option<&ImageVerification>) -> (String, Vec<String>) {
    let out = render_talos(plan, TalosVersion::parse("v", version).unwrap(), policy, true).unwrap();
    (out.text, out.notes)
}

fn talos_validator(minor: &str) -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(&reference(&format!("talos/config.schema.v{minor}.json"))).unwrap();
    jsonschema::draft202012::new(&schema).unwrap()
}

/// `ImageVerificationConfig` v1alpha1 as Talos v1.13 defines it: siderolabs/talos
/// `pkg/machinery/config/types/security/image_verification.go` at v1.13.9 (the YAML names of
/// `ImageVerificationConfigV1Alpha1`, `ImageVerificationRuleV1Alpha1`,
/// `ImageKeylessVerifierV1Alpha1`, `ImagePublicKeyVerifierV1Alpha1`; every field `omitempty`).
/// The published `config.schema.json` of v1.13 (testdata/reference) does not list this kind,
/// so the fields are pinned here, with unknown ones refused.
fn image_verification_schema() -> jsonschema::Validator {
    let strict = |props: Value| json!({"type": "object", "additionalProperties": false, "properties": props});
    let rule = strict(json!({
        "image": {"type": "string"},
        "skip": {"type": "boolean"},
        "deny": {"type": "boolean"},
        "keyless": strict(json!({"issuer": {"type": "string"}, "subject": {"type": "string"}, "subjectRegex": {"type": "string"}})),
        "publicKey": strict(json!({"certificate": {"type": "string"}})),
    }));
    let mut doc = strict(json!({
        "apiVersion": {"const": "v1alpha1"},
        "kind": {"const": "ImageVerificationConfig"},
        "rules": {"type": "array", "items": rule},
    }));
    doc["required"] = json!(["apiVersion", "kind", "rules"]);
    jsonschema::draft202012::new(&doc).unwrap()
}

/// What Talos v1.13.9's `ImageVerificationConfigV1Alpha1.Validate` refuses, rule by rule.
fn talos_validate(doc: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    for (i, r) in doc["rules"].as_array().unwrap().iter().enumerate() {
        let yes = |k: &str| r.get(k).and_then(Value::as_bool).unwrap_or(false);
        let (skip, deny) = (yes("skip"), yes("deny"));
        let verifier = r.get("keyless").is_some() || r.get("publicKey").is_some();
        if r["image"].as_str().unwrap_or("").is_empty() {
            errs.push(format!("rule {i}: imagePattern must be specified"));
        }
        if skip && deny {
            errs.push(format!("rule {i}: skip and deny cannot both be true"));
        }
        if (skip || deny) && verifier {
            errs.push(format!("rule {i}: verifiers cannot be configured if skip or deny is true"));
        }
        if !skip && !deny && !verifier {
            errs.push(format!("rule {i}: at least one verifier must be configured"));
        }
        if r.get("keyless").is_some() && r.get("publicKey").is_some() {
            errs.push(format!("rule {i}: only one of keyless or publicKey verifier can be configured"));
        }
        if let Some(k) = r.get("keyless") {
            if k["issuer"].as_str().unwrap_or("").is_empty() {
                errs.push(format!("rule {i}: verifier OIDC issuer must be specified"));
            }
            if k["subject"].as_str().unwrap_or("").is_empty() && k["subjectRegex"].as_str().unwrap_or("").is_empty() {
                errs.push(format!("rule {i}: verifier subject or subjectRegex must be specified"));
            }
        }
        if let Some(p) = r.get("publicKey") {
            if p["certificate"].as_str().unwrap_or("").is_empty() {
                errs.push(format!("rule {i}: verifier certificates must be specified"));
            }
        }
    }
    errs
}

/// The text of each YAML document (between `---` lines), comments included.
fn parts(text: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    for line in text.lines() {
        if line == "---" {
            out.push(String::new());
        } else if let Some(last) = out.last_mut() {
            last.push_str(line);
            last.push('\n');
        }
    }
    out
}

fn mirror_doc<'a>(docs: &'a [Value], name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == "RegistryMirrorConfig" && d["name"] == name)
        .unwrap_or_else(|| panic!("no RegistryMirrorConfig {name}"))
}

// ---- which namespaces a rule covers -----------------------------------------------------------

#[test]
fn should_cover_a_registry_by_its_name_and_slash_or_a_leading_star() {
    let p = |rules: &str| policy(&format!("imageVerification:\n  rules:\n{rules}"));
    let deny = |image: &str| p(&format!("  - image: '{image}'\n    deny: true\n"));
    let named = |names: &[&str]| names.iter().map(|n| Registry::parse("r", n).unwrap()).collect::<Vec<_>>();
    let reg = |n: &str| Registry::parse("r", n).unwrap();
    let all = named(&["ghcr.io", "docker.io", "quay.io", "registry.k8s.io:5000"]);
    for (image, covered) in [
        ("ghcr.io/org/*", vec!["ghcr.io"]),
        ("ghcr.io/org/app", vec!["ghcr.io"]),
        ("*", vec!["ghcr.io", "docker.io", "quay.io", "registry.k8s.io:5000"]),
        ("*/siderolabs/*", vec!["ghcr.io", "docker.io", "quay.io", "registry.k8s.io:5000"]),
        // `*` crosses `/` (Talos' glob): `gh*` matches ghcr.io/...
        ("gh*", vec!["ghcr.io"]),
        ("ghcr.io*", vec!["ghcr.io"]),
        ("registry.k8s.io:5000/*", vec!["registry.k8s.io:5000"]),
        // A prefix of another registry's name is not that registry.
        ("ghcr.io.evil/*", vec![]),
        ("ghcr.iox/*", vec![]),
        ("quay.io", vec![]),
        ("library/*", vec![]),
    ] {
        let policy = deny(image);
        let got: Vec<String> =
            all.iter().filter(|r| !policy.refusing_rules(r, &all).is_empty()).map(|r| r.to_string()).collect();
        assert_eq!(got, covered, "{image}");
    }
    // Docker Hub is one registry by any of its names, in the rule and in --registry.
    for image in ["docker.io/library/*", "index.docker.io/library/*", "registry-1.docker.io/*"] {
        for hub in ["docker.io", "index.docker.io", "registry-1.docker.io"] {
            assert_eq!(deny(image).refusing_rules(&reg(hub), &named(&[hub])), [0], "{image} for {hub}");
        }
        assert!(deny(image).refusing_rules(&reg("ghcr.io"), &all).is_empty(), "{image}");
    }
    // Only rules that refuse: keyless, publicKey, deny; never skip.
    let keyed = p(&format!(
        "  - image: ghcr.io/a/*\n    skip: true\n  - image: ghcr.io/*\n    publicKey:\n      key: {:?}\n",
        KEY
    ));
    assert_eq!(keyed.refusing_rules(&reg("ghcr.io"), &all), [1]);
    assert!(p("  - image: '*'\n    skip: true\n").refusing_rules(&reg("ghcr.io"), &all).is_empty());
    // `*` (containerd's _default) is covered by a rule for a registry no --registry names.
    let star = reg("*");
    let with_star = |names: &[&str]| named(names).into_iter().chain([reg("*")]).collect::<Vec<_>>();
    assert!(deny("ghcr.io/*").refusing_rules(&star, &with_star(&["ghcr.io"])).is_empty());
    assert_eq!(deny("ghcr.io/*").refusing_rules(&star, &with_star(&["docker.io"])), [0]);
    assert_eq!(deny("index.docker.io/*").refusing_rules(&star, &with_star(&["ghcr.io"])), [0]);
    assert!(deny("index.docker.io/*").refusing_rules(&star, &with_star(&["docker.io"])).is_empty());
    assert_eq!(deny("gh*").refusing_rules(&star, &with_star(&["ghcr.io"])), [0], "gh* also matches ghx.io/...");
    assert_eq!(deny("*").refusing_rules(&star, &with_star(&["ghcr.io"])), [0]);
}

// ---- render registries --format talos ---------------------------------------------------------

#[test]
fn should_skip_the_fallback_of_covered_namespaces_in_talos_documents() {
    let policy = policy(&tender_config());
    let mut plan = mirror_plan(&["ghcr.io", "docker.io", "registry.k8s.io", "quay.io"]);
    let notes = guard(&mut plan, &policy);
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with("docker.io: ")
            && notes[0].contains("imageVerification.rules[2] (docker.io/library/*) verifies"),
        "{notes:?}"
    );
    assert!(
        notes[1].starts_with("ghcr.io: ") && notes[1].contains("imageVerification.rules[0] (ghcr.io/siderolabs/*)"),
        "{notes:?}"
    );
    assert!(notes[1].contains("https://ghcr.io"), "{notes:?}");
    let (text, _) = talos(&plan, "v1.13.6", Some(&policy));
    tender_render::yaml::check_readers_agree(&text).unwrap();
    let d = docs(&text);
    let validator = talos_validator("1.13");
    for doc in d.iter().filter(|d| d["kind"] != "ImageVerificationConfig") {
        let errors: Vec<String> = validator.iter_errors(doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{errors:?}\n{text}");
    }
    for (name, skip, urls) in [
        ("ghcr.io", true, vec!["http://tender.kube-system.svc:5000"]),
        ("docker.io", true, vec!["http://tender.kube-system.svc:5000"]),
        ("registry.k8s.io", false, vec!["http://tender.kube-system.svc:5000", "https://registry.k8s.io"]),
        ("quay.io", false, vec!["http://tender.kube-system.svc:5000", "https://quay.io"]),
    ] {
        let m = mirror_doc(&d, name);
        assert_eq!(m.get("skipFallback").and_then(Value::as_bool).unwrap_or(false), skip, "{name}\n{text}");
        let got: Vec<&str> = m["endpoints"].as_array().unwrap().iter().map(|e| e["url"].as_str().unwrap()).collect();
        assert_eq!(got, urls, "{name}");
    }
    // The why is a comment right above the document it explains.
    let ghcr = parts(&text).into_iter().find(|d| d.contains("name: ghcr.io")).unwrap();
    assert!(ghcr.starts_with("# skipFallback: imageVerification.rules[0] (ghcr.io/siderolabs/*) verifies"), "{ghcr}");
    let quay = parts(&text).into_iter().find(|d| d.contains("name: quay.io")).unwrap();
    assert!(!quay.contains('#'), "{quay}");
}

#[test]
fn should_skip_the_fallback_in_the_v1alpha1_patch_before_talos_1_12() {
    let policy = policy(&tender_config());
    let mut plan = mirror_plan(&["ghcr.io", "quay.io"]);
    guard(&mut plan, &policy);
    let (text, notes) = talos(&plan, "v1.11.6", Some(&policy));
    let d = docs(&text);
    assert_eq!(d.len(), 1, "{text}");
    let errors: Vec<String> = talos_validator("1.11").iter_errors(&d[0]).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}\n{text}");
    let mirrors = &d[0]["machine"]["registries"]["mirrors"];
    assert_eq!(mirrors["ghcr.io"], json!({"endpoints": ["http://tender.kube-system.svc:5000"], "skipFallback": true}));
    assert_eq!(mirrors["quay.io"], json!({"endpoints": ["http://tender.kube-system.svc:5000", "https://quay.io"]}));
    assert!(text.contains("# skipFallback on ghcr.io: imageVerification.rules[0]"), "{text}");
    // 1.11 has no ImageVerificationConfig: said, not written.
    assert!(!text.contains("ImageVerificationConfig\n"), "{text}");
    assert!(
        notes.iter().any(|n| n.contains("v1.11.6") && n.contains("cannot express") && n.contains("1.13")),
        "{notes:?}"
    );
}

#[test]
fn should_write_the_policy_as_talos_image_verification_config_from_talos_1_13() {
    let policy = policy(&tender_config());
    let mut plan = mirror_plan(&["ghcr.io"]);
    guard(&mut plan, &policy);
    for version in ["v1.13.0", "v1.13.6", "v1.14.1", "v2.0.0"] {
        let (text, notes) = talos(&plan, version, Some(&policy));
        let d = docs(&text);
        let ivc: Vec<&Value> = d.iter().filter(|d| d["kind"] == "ImageVerificationConfig").collect();
        assert_eq!(ivc.len(), 1, "{version}: {text}");
        let doc = ivc[0];
        let errors: Vec<String> = image_verification_schema().iter_errors(doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{errors:?}\n{text}");
        assert_eq!(talos_validate(doc), Vec::<String>::new(), "{text}");
        // In order, Talos' names; the PEM key as `certificate`; Docker Hub as Talos 1.13 names it.
        assert_eq!(
            doc,
            &json!({
                "apiVersion": "v1alpha1",
                "kind": "ImageVerificationConfig",
                "rules": [
                    {"image": "ghcr.io/siderolabs/*", "publicKey": {"certificate": KEY}},
                    {"image": "registry.k8s.io/*", "skip": true},
                    {"image": "index.docker.io/library/*", "keyless": {"issuer": "https://accounts.google.com", "subjectRegex": ".*@example\\.com"}},
                    {"image": "*", "skip": true},
                ],
            }),
            "{version}"
        );
        assert!(d.last().unwrap() == doc, "the policy comes last: {text}");
        let comments: String =
            parts(&text).last().unwrap().lines().filter(|l| l.starts_with('#')).collect::<Vec<_>>().join("\n");
        for want in [
            "rules[0] publicKey.key",
            "publicKey.certificate",
            "trustedRoot",
            "TUF",
            "rules[2] docker.io/library/*",
            "index.docker.io/library/*",
        ] {
            assert!(comments.contains(want), "{want}: {comments}");
        }
        assert!(!text.contains("/etc/tender/trusted_root.json"), "the trusted root stays with tender: {text}");
        assert!(
            notes.iter().any(|n| n.contains("keyless") && n.contains("TUF") && n.contains("--no-node-policy")),
            "{notes:?}"
        );
    }
    // Talos 1.12 has no such document: the registries are written, the policy is said not to be.
    let (text, notes) = talos(&plan, "v1.12.4", Some(&policy));
    assert!(docs(&text).iter().all(|d| d["kind"] == "RegistryMirrorConfig"), "{text}");
    assert!(
        notes.iter().any(|n| n.contains("v1.12.4 cannot express") && n.contains("ImageVerificationConfig")),
        "{notes:?}"
    );
    assert!(text.starts_with("# "), "the output says it too: {text}");
    // --no-node-policy: the fallback stays off, the document is left out.
    let out = render_talos(&plan, TalosVersion::parse("v", "v1.13.6").unwrap(), Some(&policy), false).unwrap();
    assert!(docs(&out.text).iter().all(|d| d["kind"] == "RegistryMirrorConfig"), "{}", out.text);
    assert_eq!(mirror_doc(&docs(&out.text), "ghcr.io")["skipFallback"], json!(true));
}

#[test]
fn should_render_registries_with_a_policy_as_pinned() {
    let policy = policy(&tender_config());
    let mut plan = mirror_plan(&["ghcr.io", "docker.io", "registry.k8s.io", "*"]);
    let notes = guard(&mut plan, &policy);
    let (text, render_notes) = talos(&plan, "v1.13.6", Some(&policy));
    insta::assert_snapshot!("registries_talos_v1_13_image_verification", text);
    insta::assert_snapshot!("registries_image_verification_notes", [notes, render_notes].concat().join("\n"));
    // Without a policy, the output is what it always was.
    let bare = mirror_plan(&["ghcr.io", "docker.io", "registry.k8s.io", "*"]);
    let (plain, plain_notes) = talos(&bare, "v1.13.6", None);
    assert_eq!(
        plain,
        tender_render::talos::render_registries(&bare, TalosVersion::parse("v", "v1.13.6").unwrap()).unwrap()
    );
    assert!(plain_notes.is_empty());
}

// ---- render registries --format containerd ----------------------------------------------------

#[test]
fn should_write_hosts_toml_without_the_upstream_for_covered_namespaces() {
    let policy = policy(&tender_config());
    let mut plan = mirror_plan(&["ghcr.io", "quay.io", "*"]);
    guard(&mut plan, &policy);
    let files = hosts_files(&plan).unwrap();
    let file = |path: &str| {
        String::from_utf8(files.iter().find(|f| f.path == path).unwrap_or_else(|| panic!("{path}")).contents.clone())
            .unwrap()
    };
    // ghcr.io: the mirror alone, as --skip-fallback writes it, with the reason on top.
    let ghcr = file("ghcr.io/hosts.toml");
    assert!(
        ghcr.starts_with(
            "# No fallback to https://ghcr.io: imageVerification.rules[0] (ghcr.io/siderolabs/*) verifies"
        ),
        "{ghcr}"
    );
    let parsed: toml::Table = toml::from_str(&ghcr).unwrap();
    assert_eq!(parsed["server"].as_str(), Some("http://tender.kube-system.svc:5000"));
    assert!(parsed["host"].as_table().unwrap().is_empty(), "{ghcr}");
    assert!(!ghcr.contains("server = \"https://ghcr.io\""), "{ghcr}");
    // quay.io: no rule refuses its images, the fallback stays.
    let quay: toml::Table = toml::from_str(&file("quay.io/hosts.toml")).unwrap();
    assert_eq!(quay["server"].as_str(), Some("https://quay.io"));
    assert!(!file("quay.io/hosts.toml").contains('#'));
    // _default: docker.io/library/* is verified, and no --registry names docker.io.
    let default = file("_default/hosts.toml");
    assert!(
        default.starts_with("# No fallback to each registry itself: imageVerification.rules[2] (docker.io/library/*)"),
        "{default}"
    );
    let parsed: toml::Table = toml::from_str(&default).unwrap();
    assert_eq!(parsed["server"].as_str(), Some("http://tender.kube-system.svc:5000"));
    // naming the registries of every refusing rule takes the policy off _default
    let mut named = mirror_plan(&["ghcr.io", "docker.io", "*"]);
    guard(&mut named, &policy);
    let files = hosts_files(&named).unwrap();
    let default =
        String::from_utf8(files.iter().find(|f| f.path == "_default/hosts.toml").unwrap().contents.clone()).unwrap();
    assert!(!default.contains("server"), "{default}");
    let hub =
        String::from_utf8(files.iter().find(|f| f.path == "docker.io/hosts.toml").unwrap().contents.clone()).unwrap();
    let parsed: toml::Table = toml::from_str(&hub).unwrap();
    assert_eq!(parsed["server"].as_str(), Some("http://tender.kube-system.svc:5000"), "{hub}");
}

// ---- what is read -----------------------------------------------------------------------------

#[test]
fn should_read_tender_config_or_a_talos_document_and_refuse_a_bad_rule_naming_it() {
    // A Talos document, pasted from a machine config, keyless without a trusted root: Talos
    // nodes have their own.
    let doc = "apiVersion: v1alpha1\nkind: ImageVerificationConfig\nrules:\n  - image: registry.k8s.io/*\n    keyless:\n      issuer: https://accounts.google.com\n      subject: krel-trust@k8s-releng-prod.iam.gserviceaccount.com\n  - image: localhost:3000/*\n    deny: true\n";
    let p = policy(doc);
    assert_eq!(p.rules().len(), 2);
    // tender's config whose imageVerification is that document
    let indented: String = doc.lines().map(|l| format!("  {l}\n")).collect();
    let cfg = format!("listen: 0.0.0.0:5000\nimageVerification:\n{indented}");
    assert_eq!(policy(&cfg).rules(), p.rules());
    // a config without imageVerification: no policy
    assert!(ImageVerification::read("--config", "listen: 0.0.0.0:5000\n").unwrap().is_none());
    assert!(ImageVerification::read("--config", "").unwrap().is_none());
    for (text, key) in [
        ("imageVerification:\n  rules:\n  - image: x/*\n", "imageVerification.rules[0]"),
        (
            "imageVerification:\n  rules:\n  - image: x/*\n    skip: true\n    deny: true\n",
            "imageVerification.rules[0]",
        ),
        ("imageVerification:\n  rules:\n  - image: 'a b'\n    deny: true\n", "imageVerification.rules[0].image"),
        (
            "imageVerification:\n  rules:\n  - image: x/*\n    keyless: {subject: s}\n",
            "imageVerification.rules[0].keyless.issuer",
        ),
        (
            "imageVerification:\n  rules:\n  - image: x/*\n    keyless: {issuer: https://i}\n",
            "imageVerification.rules[0].keyless",
        ),
        (
            "imageVerification:\n  rules:\n  - image: x/*\n    keyless: {issuer: https://i, subjectRegex: '('}\n",
            "imageVerification.rules[0].keyless.subjectRegex",
        ),
        (
            "imageVerification:\n  rules:\n  - image: x/*\n    publicKey: {key: not-pem}\n",
            "imageVerification.rules[0].publicKey.key",
        ),
        ("imageVerification:\n  rules:\n  - image: x/*\n    verify: true\n", "unknown field `verify`"),
        (
            "apiVersion: v1alpha1\nkind: ImageVerificationConfig\nrules:\n- image: x/*\n  deny: true\n  extra: 1\n",
            "unknown field `extra`",
        ),
        ("apiVersion: v1alpha2\nkind: ImageVerificationConfig\nrules: []\n", "imageVerification.apiVersion"),
    ] {
        let err = ImageVerification::read("--config f.yaml", text).unwrap_err().to_string();
        assert!(err.contains(key), "{text}: {err}");
        assert!(err.contains("--config f.yaml"), "{err}");
    }
}

// ---- render cozystack -------------------------------------------------------------------------

#[test]
fn should_skip_the_fallback_of_covered_upstreams_in_cozystack_registry_mirrors() {
    let config = parse_config(&tender_config()).unwrap();
    let req = RenderRequest {
        mirror: "http://tender.cozy-tender.svc:5000".into(),
        cluster: Some("test".into()),
        namespace: Some("tenant-test".into()),
        pools: vec!["md1".into()],
        ..RenderRequest::default()
    };
    let out = render(&config, &req).unwrap();
    let text = out.text();
    tender_render::yaml::check_readers_agree(&text).unwrap();
    let d = docs(&text);
    assert_eq!(d.len(), 2, "{text}");
    for doc in &d {
        let mirrors = &doc["spec"]["talos"]["registryMirrors"];
        assert_eq!(
            mirrors["ghcr.io"],
            json!({"endpoints": ["http://tender.cozy-tender.svc:5000"], "skipFallback": true})
        );
        assert_eq!(
            mirrors["docker.io"],
            json!({"endpoints": ["http://tender.cozy-tender.svc:5000"], "skipFallback": true})
        );
        assert_eq!(mirrors["registry.k8s.io"], json!({"endpoints": ["http://tender.cozy-tender.svc:5000"]}));
    }
    assert!(text.contains("# talos.registryMirrors: skipFallback on docker.io, ghcr.io"), "{text}");
    let notes = out.warnings.join("\n");
    assert!(notes.contains("docker.io: ") && notes.contains("ghcr.io: "), "{notes}");
    assert!(notes.contains("ImageVerificationConfig"), "the workers do not check signatures themselves: {notes}");
    // The same config without a policy renders what it did.
    let plain = parse_config(tender_config().split("imageVerification:").next().unwrap()).unwrap();
    let before = render(&plain, &req).unwrap().text();
    assert!(!before.contains("skipFallback"), "{before}");
    // v1.6.x has no registryMirrors: the alternative command carries --config.
    let req = RenderRequest {
        target: Some(tender_render::target::Target::embedded("v1.6.2").unwrap()),
        config_name: Some("tender.yaml".into()),
        ..req
    };
    let out = render(&config, &req).unwrap();
    let alt = out.unexpressed.iter().map(|u| u.alternative.clone()).collect::<Vec<_>>().join("\n");
    assert!(alt.contains("--registry registry.k8s.io --config tender.yaml"), "{alt}");
}

/// Patterns and identities are the operator's text: they come out as data, never as YAML or
/// TOML syntax, in the documents and in the comments that quote them.
#[test]
fn should_keep_hostile_patterns_and_identities_literal() {
    let image = "ghcr.io/'\"$(id)`#---/*";
    let subject = "a\n---\nkind: Evil\n#";
    let raw = tender_verify::policy::RawPolicy {
        rules: vec![
            tender_verify::policy::RawRule { image: image.into(), deny: true, ..Default::default() },
            tender_verify::policy::RawRule {
                image: "quay.io/*".into(),
                keyless: Some(tender_verify::policy::RawKeyless {
                    issuer: Some("https://i\n- image: '*'".into()),
                    subject: Some(subject.into()),
                    subject_regex: None,
                }),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let policy = ImageVerification::new(raw).unwrap();
    let mut plan = mirror_plan(&["ghcr.io", "quay.io"]);
    guard(&mut plan, &policy);
    let (text, _) = talos(&plan, "v1.13.6", Some(&policy));
    tender_render::yaml::check_readers_agree(&text).unwrap();
    let d = docs(&text);
    assert_eq!(d.len(), 3, "{text}");
    let ivc = &d[2];
    assert_eq!(ivc["rules"][0]["image"], json!(image));
    assert_eq!(ivc["rules"][1]["keyless"]["subject"], json!(subject));
    assert_eq!(ivc["rules"].as_array().unwrap().len(), 2);
    for f in hosts_files(&plan).unwrap() {
        let text = String::from_utf8(f.contents).unwrap();
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(parsed["server"].as_str(), Some("http://tender.kube-system.svc:5000"), "{text}");
    }
}
