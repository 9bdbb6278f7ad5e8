//! Hostile values, for every input field that reaches the output: each comes out as a literal
//! string or is refused, and the output keeps its shape (no injected document or key).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use common::*;
use serde_json::{json, Value};
use tender_render::catalog::parse_config;
use tender_render::containerd::hosts_files;
use tender_render::golden::render_catalog;
use tender_render::registries::RegistriesRequest;
use tender_render::talos::{base64, render_registries, TalosVersion};

const HOSTILE: &[&str] = &[
    "$(id)",
    "`id`",
    "a\\b",
    "\"q'",
    "x\nEOF\nid",
    "x\n---\nkind: Secret",
    "{{ .Values.x }}",
    "a: b",
    "# c",
    "x\u{0}y",
    "x\ty",
    "-----END CERTIFICATE-----",
];

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// Every string leaf of the output, with embedded Talos patches parsed too.
fn leaves(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => {
            out.push(s.clone());
            if s.contains('\n') && (s.contains("machine:") || s.contains("apiVersion: v1alpha1")) {
                for d in docs(s) {
                    leaves(&d, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| leaves(x, out)),
        Value::Object(m) => m.iter().for_each(|(k, x)| {
            out.push(k.clone());
            leaves(x, out)
        }),
        _ => {}
    }
}

fn base() -> Value {
    json!({
        "cluster": "kubernetes-test",
        "namespace": "tenant-test",
        "pool": "md0",
        "talos": {
            "registryMirrors": {"ghcr.io": {"endpoints": ["https://tender.example:5000"]}},
            "registryConfig": {"tender.example:5000": {
                "tls": {"ca": pem("ca"), "clientIdentity": {"crt": pem("crt"), "key": pem("key")}},
                "auth": {"username": "u", "password": "p", "auth": "a", "identityToken": "t"},
            }},
        },
    })
}

fn pem(h: &str) -> String {
    format!("-----BEGIN CERTIFICATE-----\n{h}\n-----END CERTIFICATE-----\n")
}

fn set(v: &mut Value, path: &[&str], value: Value) {
    let mut cur = v;
    for p in &path[..path.len() - 1] {
        if cur.get(*p).is_none() {
            cur[*p] = json!({});
        }
        cur = &mut cur[*p];
    }
    cur[path[path.len() - 1]] = value;
}

/// Fields whose value is free text and must come out literally (never refused unless it
/// carries a control character): (path, wrap the hostile value, is PEM).
const LITERAL_FIELDS: &[&[&str]] = &[
    &["talos", "registryConfig", "tender.example:5000", "tls", "ca"],
    &["talos", "registryConfig", "tender.example:5000", "tls", "clientIdentity", "crt"],
    &["talos", "registryConfig", "tender.example:5000", "tls", "clientIdentity", "key"],
    &["talos", "registryConfig", "tender.example:5000", "auth", "username"],
    &["talos", "registryConfig", "tender.example:5000", "auth", "password"],
    &["talos", "registryConfig", "tender.example:5000", "auth", "auth"],
    &["talos", "registryConfig", "tender.example:5000", "auth", "identityToken"],
];

/// Fields whose value is a name, version, URL or quantity: a hostile value is refused.
const SHAPED_FIELDS: &[&[&str]] = &[
    &["cluster"],
    &["namespace"],
    &["pool"],
    &["kubernetesVersion"],
    &["talos", "version"],
    &["talos", "schematicID"],
    &["talos", "imageFactoryURL"],
    &["talos", "installerRepository"],
    &["osImage", "factory", "imageFactoryURL"],
    &["osImage", "factory", "schematicID"],
    &["osImage", "factory", "version"],
    &["osImage", "builtin", "schematicID"],
    &["osImage", "builtin", "version"],
    &["storageClass"],
    &["diskSize"],
    &["instanceType"],
    &["resources", "memory"],
    &["maxUnhealthy"],
    &["nodeStartupTimeout"],
    &["readyUnknownTimeout"],
    &["readyFalseTimeout"],
    &["maxNodeProvisionTime"],
];

fn render_value(v: &Value) -> Result<String, tender_render::Error> {
    let yaml = serde_norway::to_string(v).unwrap();
    try_render(&yaml, Some(&healthy().build())).map(|r| r.text)
}

fn assert_shape(text: &str) {
    let kinds: Vec<String> = docs(text).iter().map(|d| d["kind"].as_str().unwrap().to_string()).collect();
    assert_eq!(kinds, ["KubevirtMachineTemplate", "MachineDeployment", "MachineHealthCheck", "TalosConfigTemplate"]);
}

fn assert_refusal_is_clean(err: &tender_render::Error, h: &str) {
    assert!(matches!(err, tender_render::Error::Refused(_) | tender_render::Error::Malformed { .. }), "{h:?}: {err:?}");
    assert!(!err.to_string().contains('\n'), "a refusal must escape control characters: {err}");
}

#[test]
fn should_render_free_text_fields_literally_or_refuse_control_characters() {
    for path in LITERAL_FIELDS {
        for h in HOSTILE {
            let is_pem = path.last().is_some_and(|p| matches!(*p, "ca" | "crt" | "key"));
            let value = if is_pem { pem(h) } else { h.to_string() };
            let mut v = base();
            set(&mut v, path, json!(value));
            match render_value(&v) {
                Ok(text) => {
                    assert_shape(&text);
                    let mut all = Vec::new();
                    docs(&text).iter().for_each(|d| leaves(d, &mut all));
                    assert!(all.contains(&value), "{path:?}: {value:?} not found literally");
                }
                Err(e) => {
                    let refusable = if is_pem { has_control(&value.replace('\n', "")) } else { has_control(&value) };
                    assert!(refusable, "{path:?}: {h:?} was refused: {e}");
                    assert_refusal_is_clean(&e, h);
                }
            }
        }
    }
}

#[test]
fn should_refuse_hostile_values_in_every_shaped_field() {
    for path in SHAPED_FIELDS {
        for h in HOSTILE {
            let mut v = base();
            set(&mut v, path, json!(h));
            match render_value(&v) {
                Ok(text) => panic!("{path:?} = {h:?} rendered:\n{text}"),
                Err(e) => assert_refusal_is_clean(&e, h),
            }
        }
    }
}

#[test]
fn should_refuse_hostile_registry_hosts_endpoints_and_list_items() {
    for h in HOSTILE {
        let cases: Vec<Value> = vec![
            json!({"talos": {"registryMirrors": {*h: {"endpoints": ["https://m.example"]}}}}),
            json!({"talos": {"registryMirrors": {"ghcr.io": {"endpoints": [format!("https://m.example/{h}")]}}}}),
            json!({"talos": {"registryMirrors": {"ghcr.io": {"endpoints": [h]}}}}),
            json!({"talos": {"registryConfig": {*h: {"auth": {"username": "u"}}}}}),
            json!({"roles": [h]}),
            json!({"gpus": [{"name": h}]}),
            json!({"resources": {"cpu": h, "memory": "8Gi"}}),
        ];
        for extra in cases {
            let mut v = base();
            v["talos"] = json!({});
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            match render_value(&v) {
                Ok(text) => panic!("{extra} rendered:\n{text}"),
                Err(e) => assert_refusal_is_clean(&e, h),
            }
        }
    }
}

fn request() -> RegistriesRequest {
    RegistriesRequest {
        mirror: "https://tender.example:5000".into(),
        more_mirrors: Vec::new(),
        registries: vec!["ghcr.io".into()],
        skip_fallback: false,
        ca: None,
        client_cert: None,
        client_key: None,
        insecure_skip_verify: false,
        username: None,
        password: None,
    }
}

#[test]
fn should_keep_hostile_credentials_and_certificates_literal_in_registries_output() {
    for h in HOSTILE.iter().filter(|h| !has_control(h)) {
        let mut req = request();
        req.username = Some(format!("user{}", h.replace(':', "")));
        req.password = Some(h.to_string());
        req.ca = Some(pem(h));
        let plan = req.validate().unwrap();
        let talos = render_registries(&plan, TalosVersion::parse("v", "v1.13.6").unwrap()).unwrap();
        let all: Vec<Value> = docs(&talos);
        assert_eq!(all.len(), 3, "{h:?}");
        let auth = all.iter().find(|d| d["kind"] == "RegistryAuthConfig").unwrap();
        assert_eq!(auth["password"], *h);
        let tls = all.iter().find(|d| d["kind"] == "RegistryTLSConfig").unwrap();
        assert_eq!(tls["ca"], pem(h));
        for f in hosts_files(&plan).unwrap() {
            if f.path.ends_with("hosts.toml") {
                let parsed: toml::Table = toml::from_str(std::str::from_utf8(&f.contents).unwrap()).unwrap();
                let header = &parsed["host"]["https://tender.example:5000"]["header"]["Authorization"];
                let want = format!("Basic {}", base64(format!("{}:{h}", req.username.as_deref().unwrap()).as_bytes()));
                assert_eq!(header.as_str(), Some(want.as_str()));
                assert_eq!(parsed.len(), 2, "only server and host: {parsed:?}");
            } else {
                assert_eq!(f.contents, pem(h).into_bytes());
            }
        }
    }
}

#[test]
fn should_refuse_hostile_registries_flags() {
    for h in HOSTILE {
        let mut req = request();
        req.mirror = format!("https://tender.example:5000/{h}");
        assert!(req.validate().is_err(), "--mirror {h:?}");
        let mut req = request();
        req.registries = vec![h.to_string()];
        assert!(req.validate().is_err(), "--registry {h:?}");
        if has_control(h) {
            let mut req = request();
            req.username = Some("u".into());
            req.password = Some(h.to_string());
            let err = req.validate().unwrap_err().to_string();
            assert!(!err.contains(h), "a refused password must not be echoed: {err}");
        }
    }
}

#[test]
fn should_refuse_hostile_catalog_values() {
    let fields = ["schematic", "version", "platform", "arch", "format", "storageClass", "storage", "dir"];
    for h in HOSTILE {
        for field in fields {
            let mut entry = json!({"schematic": "abc", "version": "v1.13.6"});
            entry[field] = json!(h);
            let config = json!({"catalog": {"images": [entry]}});
            let parsed = parse_config(&serde_norway::to_string(&config).unwrap()).unwrap();
            let result = render_catalog(&parsed, None, None);
            if field == "dir" && !has_control(h) {
                // dir is the server's storage path; it never reaches the rendered object.
                let out = result.unwrap();
                assert!(!out.contains(h), "{out}");
                continue;
            }
            let err = result.err().unwrap_or_else(|| panic!("{field} = {h:?} rendered"));
            assert!(!err.to_string().contains('\n'), "{err}");
        }
        let config = parse_config("catalog:\n  images: []\n").unwrap();
        assert!(render_catalog(&config, Some(&format!("https://t.example/{h}")), None).is_err());
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any text in an image coordinate is refused, or reaches the disk URL / installer image
        /// exactly as given.
        #[test]
        fn should_refuse_or_keep_literal_any_image_coordinate(
            field in prop::sample::select(vec!["version", "schematicID", "installerRepository", "imageFactoryURL"]),
            text in "[a-z0-9v./:$`\\\\\"' \\n-]{0,24}",
        ) {
            let mut v = base();
            v["talos"][field] = json!(text);
            match render_value(&v) {
                Ok(out) => {
                    assert_shape(&out);
                    let mut all = Vec::new();
                    docs(&out).iter().for_each(|d| leaves(d, &mut all));
                    let trimmed = text.strip_suffix('/').unwrap_or(&text).to_string();
                    prop_assert!(all.iter().any(|l| l.contains(&trimmed)), "{} not in output", trimmed);
                    prop_assert!(!text.chars().any(|c| c.is_control() || "$`\\\"' ".contains(c)));
                }
                Err(e) => assert_refusal_is_clean(&e, &text),
            }
        }
    }
}
