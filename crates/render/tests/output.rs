//! The rendered bytes: schema validity (CRDs, Talos schemas per version), snapshots,
//! determinism, and drift guards against the Cozystack reference data.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::{json, Value};
use tender_render::catalog::parse_config;
use tender_render::containerd::hosts_files;
use tender_render::golden::render_catalog;
use tender_render::registries::RegistriesRequest;
use tender_render::talos::{render_registries, TalosVersion};

// ---- schemas -----------------------------------------------------------------------------

/// Make every object schema that lists properties reject unknown ones (unless it preserves
/// unknown fields): the API server would silently prune such a field, which is a bug for us.
fn strict(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let preserve = map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            if map.contains_key("properties") && !preserve && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for v in map.values_mut() {
                strict(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strict),
        _ => {}
    }
}

fn crd_validator(file: &str, version: &str) -> jsonschema::Validator {
    let crd: Value = serde_norway::from_str(&reference(file)).unwrap();
    let versions = crd["spec"]["versions"].as_array().unwrap();
    let v = versions.iter().find(|v| v["name"] == version).unwrap_or_else(|| panic!("{file} has no {version}"));
    let mut schema = v["schema"]["openAPIV3Schema"].clone();
    strict(&mut schema);
    jsonschema::draft4::new(&schema).unwrap()
}

fn talos_validator(minor: &str) -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(&reference(&format!("talos/config.schema.v{minor}.json"))).unwrap();
    jsonschema::draft202012::new(&schema).unwrap()
}

fn assert_valid(validator: &jsonschema::Validator, instance: &Value, what: &str) {
    let errors: Vec<String> =
        validator.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(
        errors.is_empty(),
        "{what} does not validate:\n{}\n{}",
        errors.join("\n"),
        serde_norway::to_string(instance).unwrap()
    );
}

/// The Talos schema minor to validate a Talos version's output against.
fn schema_minor(talos_version: &str) -> &'static str {
    match talos_version {
        v if v.starts_with("v1.11") => "1.11",
        v if v.starts_with("v1.12") => "1.12",
        _ => "1.13",
    }
}

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n";

fn pool_variants() -> Vec<(String, String, Option<tender_render::state::ClusterState>)> {
    let registries = format!(
        "talos:\n  version: {{V}}\n  registryMirrors:\n    ghcr.io: {{endpoints: [https://tender.example:5000]}}\n    docker.io: {{endpoints: [http://tender.kube-system.svc:5000/v2/docker], overridePath: true, skipFallback: true}}\n    \"*\": {{endpoints: [http://tender.kube-system.svc:5000]}}\n  registryConfig:\n    tender.example:5000:\n      tls: {{ca: {ca:?}, clientIdentity: {{crt: {ca:?}, key: {key:?}}}, insecureSkipVerify: true}}\n      auth: {{username: u, password: p}}\n",
        ca = CA,
        key = KEY
    );
    let mut out = vec![
        ("default".to_string(), pool_yaml(""), None),
        ("builtin".to_string(), pool_yaml(BUILTIN), Some(healthy().build())),
        (
            "sized".to_string(),
            pool_yaml("roles: [ingress-nginx]\nresources: {cpu: 4, memory: 8Gi}\ngpus: [{name: nvidia.com/AD102GL_L40S}]\nlogSerialConsole: true\nmaxUnhealthy: 2\nstorageClass: \"\"\n"),
            None,
        ),
    ];
    for (k8s, v) in [("v1.34", "v1.11.6"), ("v1.35", "v1.12.4"), ("v1.35", "v1.13.6")] {
        let yaml = pool_yaml(&format!("kubernetesVersion: {k8s}\n{}", registries.replace("{V}", v)));
        out.push((format!("registries-{v}"), yaml, None));
    }
    out
}

#[test]
fn should_validate_every_pool_object_against_its_crd() {
    let kmt = crd_validator("capi/crd-kubevirtmachinetemplates.yaml", "v1alpha1");
    let md = crd_validator("capi/crd-machinedeployments.yaml", "v1beta1");
    let mhc = crd_validator("capi/crd-machinehealthchecks.yaml", "v1beta1");
    let tct = crd_validator("capi/crd-talosconfigtemplates.yaml", "v1alpha3");
    let dv = crd_validator("cdi/crd-datavolumes.yaml", "v1beta1");
    for (name, yaml, state) in pool_variants() {
        let out = render(&yaml, state.as_ref());
        let all = docs(&out.text);
        assert_eq!(all.len(), 4, "{name}");
        for d in &all {
            let validator = match d["kind"].as_str().unwrap() {
                "KubevirtMachineTemplate" => &kmt,
                "MachineDeployment" => &md,
                "MachineHealthCheck" => &mhc,
                "TalosConfigTemplate" => &tct,
                other => panic!("unexpected kind {other}"),
            };
            assert_valid(validator, d, &format!("{name}: {}", d["kind"]));
        }
        // The disk template is a DataVolume too.
        let mut disk_dv = disk(&out.text);
        disk_dv["apiVersion"] = json!("cdi.kubevirt.io/v1beta1");
        disk_dv["kind"] = json!("DataVolume");
        assert_valid(&dv, &disk_dv, &format!("{name}: disk-system"));
    }
}

#[test]
fn should_validate_every_talos_patch_against_the_schema_of_its_version() {
    let validators: BTreeMap<&str, jsonschema::Validator> =
        ["1.11", "1.12", "1.13"].into_iter().map(|m| (m, talos_validator(m))).collect();
    for (name, yaml, state) in pool_variants() {
        let out = render(&yaml, state.as_ref());
        let tct = doc_of_kind(&out.text, "TalosConfigTemplate");
        let version = tct["spec"]["template"]["spec"]["talosVersion"].as_str().unwrap().to_string();
        let validator = &validators[schema_minor(&version)];
        let patches = tct["spec"]["template"]["spec"]["strategicPatches"].as_array().unwrap();
        for p in patches {
            for d in docs(p.as_str().unwrap()) {
                assert_valid(validator, &d, &format!("{name} ({version}) patch"));
            }
        }
        // --format patch prints the same documents.
        let printed = docs(&patches_text(&yaml));
        let embedded: Vec<Value> = patches.iter().flat_map(|p| docs(p.as_str().unwrap())).collect();
        assert_eq!(printed, embedded, "{name}");
    }
}

fn patches_text(yaml: &str) -> String {
    patches(yaml)
}

fn request() -> RegistriesRequest {
    RegistriesRequest {
        mirror: "https://tender.example:5000".into(),
        more_mirrors: Vec::new(),
        registries: vec!["ghcr.io".into(), "docker.io".into(), "*".into()],
        skip_fallback: false,
        ca: Some(CA.into()),
        client_cert: Some(CA.into()),
        client_key: Some(KEY.into()),
        insecure_skip_verify: false,
        username: Some("mirror-user".into()),
        password: Some("s3cret".into()),
    }
}

#[test]
fn should_validate_registries_documents_against_the_talos_schema_of_each_version() {
    for (version, minor) in [("v1.11.6", "1.11"), ("v1.12.4", "1.12"), ("v1.13.6", "1.13"), ("v1.9", "1.11")] {
        let validator = talos_validator(minor);
        for skip_fallback in [false, true] {
            for mirror in ["https://tender.example:5000", "http://tender.kube-system.svc:5000/v2/proxy"] {
                let mut req = request();
                req.skip_fallback = skip_fallback;
                req.mirror = mirror.into();
                if mirror.starts_with("http:") {
                    req.ca = None;
                    req.client_cert = None;
                    req.client_key = None;
                }
                let plan = req.validate().unwrap();
                let text = render_registries(&plan, TalosVersion::parse("v", version).unwrap()).unwrap();
                for d in docs(&text) {
                    assert_valid(&validator, &d, &format!("{version} {mirror} skip={skip_fallback}"));
                }
            }
        }
    }
}

#[test]
fn should_validate_golden_datavolumes_against_the_cdi_crd() {
    let dv = crd_validator("cdi/crd-datavolumes.yaml", "v1beta1");
    let config = parse_config(&format!(
        "imageFactory: https://factory.talos.dev\ncatalog:\n  images:\n  - {{schematic: {SCHEMATIC}, version: v1.13.6}}\n  - {{schematic: {SCHEMATIC}, version: v1.13.6, arch: arm64, storage: 8Gi, storageClass: \"\"}}\n"
    ))
    .unwrap();
    for d in docs(&render_catalog(&config, None, None).unwrap()) {
        assert_valid(&dv, &d, "golden");
    }
}

// ---- snapshots and determinism ---------------------------------------------------------------

#[test]
fn should_render_the_default_pool_as_pinned() {
    let out = render(&pool_yaml(""), None);
    assert_eq!(out.kmt_name.as_deref(), Some("kubernetes-test-md0-da9ead"));
    insta::assert_snapshot!("default_pool", out.text);
    insta::assert_snapshot!("default_pool_patch", patches(&pool_yaml("")));
}

#[test]
fn should_render_the_builtin_pool_as_pinned() {
    insta::assert_snapshot!("builtin_pool", render(&pool_yaml(BUILTIN), Some(&healthy().build())).text);
}

#[test]
fn should_render_registries_as_pinned() {
    let plan = request().validate().unwrap();
    for (name, version) in [("registries_talos_v1_13", "v1.13.6"), ("registries_talos_v1_11", "v1.11.6")] {
        let text = render_registries(&plan, TalosVersion::parse("v", version).unwrap()).unwrap();
        insta::assert_snapshot!(name, text);
    }
    let files = hosts_files(&plan).unwrap();
    let listing: String = files
        .iter()
        .map(|f| format!("# {} (secret: {})\n{}", f.path, f.secret, String::from_utf8_lossy(&f.contents)))
        .collect::<Vec<_>>()
        .join("\n");
    insta::assert_snapshot!("registries_containerd", listing);
}

#[test]
fn should_render_the_catalog_as_pinned() {
    let config =
        parse_config(&format!("catalog:\n  images:\n  - {{schematic: {SCHEMATIC}, version: v1.13.6}}\n")).unwrap();
    insta::assert_snapshot!(
        "catalog",
        render_catalog(&config, Some("http://tender.kube-system.svc:5000"), None).unwrap()
    );
}

#[test]
fn should_render_the_same_bytes_for_the_same_input() {
    for (name, yaml, state) in pool_variants() {
        let a = render(&yaml, state.as_ref()).text;
        let b = render(&yaml, state.as_ref()).text;
        assert_eq!(a, b, "{name}");
    }
    // Key order and flow style of the input do not matter.
    let a = render(&pool_yaml("diskSize: 30Gi\nstorageClass: local\n"), None).text;
    let b = render(
        "storageClass: local\npool: md0\n{diskSize: 30Gi}\n"
            .replace("{diskSize: 30Gi}\n", "diskSize: 30Gi\ncluster: kubernetes-test\nnamespace: tenant-test\n")
            .as_str(),
        None,
    )
    .text;
    assert_eq!(a, b);
}

#[test]
fn should_render_a_pool_without_os_image_the_same_with_or_without_a_catalog() {
    let yaml = pool_yaml("storageClass: \"\"\n");
    let bare = render(&yaml, None).text;
    let busy = healthy()
        .cloned_disk("disk-system-kubernetes-test-md0-x1", "kubernetes-test/md0", "local")
        .storage_class("newer", true, "2030-01-01T00:00:00Z");
    assert_eq!(render(&yaml, Some(&busy.build())).text, bare);
    assert_eq!(render(&yaml, Some(&State::new().build())).text, bare);
}

#[test]
fn should_name_the_kmt_by_the_hash_of_its_canonical_template() {
    use tender_render::hash::{canonical_json, hash6};
    let out = render(&pool_yaml(""), None);
    let kmt = doc_of_kind(&out.text, "KubevirtMachineTemplate");
    let template = &kmt["spec"]["template"];
    let name = kmt["metadata"]["name"].as_str().unwrap();
    assert_eq!(name, format!("kubernetes-test-md0-{}", hash6(template)));
    // The definition: sha256 over sorted-key, whitespace-free JSON.
    use sha2::Digest;
    let text = canonical_json(template);
    assert!(!text.contains(' ') || text.contains("\" \"") || !text.contains(": "));
    let digest = hex::encode(sha2::Sha256::digest(text.as_bytes()));
    assert!(name.ends_with(&digest[..6]));
    let md = doc_of_kind(&out.text, "MachineDeployment");
    assert_eq!(md["spec"]["template"]["spec"]["infrastructureRef"]["name"], name);
}

// ---- drift guards against the Cozystack reference data -----------------------------------------

#[test]
fn should_keep_the_kubernetes_version_map_equal_to_cozystack() {
    let reference: BTreeMap<String, String> =
        serde_norway::from_str(&reference("cozystack/kubernetes-versions.yaml")).unwrap();
    let ours: BTreeMap<String, String> =
        tender_render::rules::KUBERNETES_VERSIONS.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    assert_eq!(ours, reference);
}

#[test]
fn should_keep_the_pool_defaults_equal_to_cozystack() {
    use tender_render::pool::defaults as d;
    let schema: Value = serde_json::from_str(&reference("cozystack/kubernetes-nodes.values.schema.json")).unwrap();
    let p = &schema["properties"];
    let t = &p["talos"]["properties"];
    for (value, want) in [
        (&p["version"]["default"], json!(d::KUBERNETES_VERSION)),
        (&p["storageClass"]["default"], json!(d::STORAGE_CLASS)),
        (&p["diskSize"]["default"], json!(d::DISK_SIZE)),
        (&p["instanceType"]["default"], json!(d::INSTANCE_TYPE)),
        (&p["minReplicas"]["default"], json!(d::MIN_REPLICAS)),
        (&p["maxReplicas"]["default"], json!(d::MAX_REPLICAS)),
        (&p["maxUnhealthy"]["default"], json!(d::MAX_UNHEALTHY)),
        (&p["nodeStartupTimeout"]["default"], json!(d::NODE_STARTUP_TIMEOUT)),
        (&p["readyUnknownTimeout"]["default"], json!(d::READY_UNKNOWN_TIMEOUT)),
        (&p["readyFalseTimeout"]["default"], json!(d::READY_FALSE_TIMEOUT)),
        (&p["maxNodeProvisionTime"]["default"], json!(d::MAX_NODE_PROVISION_TIME)),
        (&t["version"]["default"], json!(d::TALOS_VERSION)),
        (&t["schematicID"]["default"], json!(d::SCHEMATIC_ID)),
        (&t["imageFactoryURL"]["default"], json!(d::IMAGE_FACTORY_URL)),
        (&t["installerRepository"]["default"], json!(d::INSTALLER_REPOSITORY)),
    ] {
        assert_eq!(value, &want);
    }
}

// ---- the validators themselves catch mistakes ----------------------------------------------------

#[test]
fn should_reject_what_the_schemas_forbid() {
    // Talos 1.12+ dropped machine.registries; 1.11 still has it.
    let legacy = json!({"machine": {"registries": {"mirrors": {"ghcr.io": {"endpoints": ["https://m"]}}}}});
    assert!(!talos_validator("1.13").is_valid(&legacy));
    assert!(!talos_validator("1.12").is_valid(&legacy));
    assert!(talos_validator("1.11").is_valid(&legacy));
    let bad_endpoint = json!({"apiVersion": "v1alpha1", "kind": "RegistryMirrorConfig", "name": "ghcr.io", "endpoints": [{"url": "m:5000"}]});
    assert!(!talos_validator("1.13").is_valid(&bad_endpoint));
    // A field the API server would prune fails the strict CRD check.
    let out = render(&pool_yaml(""), None);
    let mut kmt = doc_of_kind(&out.text, "KubevirtMachineTemplate");
    kmt["spec"]["template"]["spec"]["virtualMachineBootstrapCheck"]["checkStrategi"] = json!("none");
    assert!(!crd_validator("capi/crd-kubevirtmachinetemplates.yaml", "v1alpha1").is_valid(&kmt));
    let mut mhc = doc_of_kind(&out.text, "MachineHealthCheck");
    mhc["spec"]["unhealthyConditions"][0].as_object_mut().unwrap().remove("timeout");
    assert!(!crd_validator("capi/crd-machinehealthchecks.yaml", "v1beta1").is_valid(&mhc));
}

// ---- house rules: rendering is pure ---------------------------------------------------------------

#[test]
fn should_keep_the_render_crate_free_of_io_clock_env_and_server_crates() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/");
    let manifest: toml::Table = toml::from_str(&std::fs::read_to_string(format!("{dir}Cargo.toml")).unwrap()).unwrap();
    let deps = manifest["dependencies"].as_table().unwrap();
    for forbidden in
        ["tokio", "reqwest", "hyper", "axum", "tender-server", "tender-fetch", "tender-store", "tender-oci"]
    {
        assert!(!deps.contains_key(forbidden), "tender-render must not depend on {forbidden}");
    }
    for entry in std::fs::read_dir(format!("{dir}src")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for forbidden in
            ["std::fs", "std::env", "std::net", "std::process", "SystemTime", "Instant::now", "std::io::stdin"]
        {
            assert!(!text.contains(forbidden), "{} uses {forbidden}: rendering must stay pure", path.display());
        }
    }
}
