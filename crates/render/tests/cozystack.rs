//! Issue 22, item 3: `render cozystack` writes Cozystack's own keys only, with the types its
//! charts declare, and the key list is the one committed under testdata/reference.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use common::*;
use serde_json::{json, Value};
use tender_render::catalog::parse_config;
use tender_render::cozystack::{check, check_keys, key_list, read_input, render, Chart, OsImage, RenderRequest, KEYS};

const MIRROR: &str = "http://tender.cozy-tender.svc:5000";

fn config() -> String {
    format!(
        "listen: 0.0.0.0:5000\nupstreams:\n- name: docker.io\n  url: https://registry-1.docker.io\n- name: ghcr.io\n  url: https://ghcr.io\n- name: 'on'\n  url: https://on\ncatalog:\n  images:\n  - schematicID: {SCHEMATIC}\n    version: v1.13.6\n"
    )
}

fn request(os_image: Option<OsImage>) -> RenderRequest {
    RenderRequest {
        mirror: MIRROR.into(),
        cluster: Some("test".into()),
        namespace: Some("tenant-test".into()),
        pools: vec!["md1".into()],
        os_image,
        // What these tests pin is the golden-catalog design (osImage, kubernetesWorkerImage).
        target: Some(tender_render::target::Target::embedded("golden-catalog").unwrap()),
        ..RenderRequest::default()
    }
}

fn rendered(os_image: Option<OsImage>) -> (String, Vec<Value>) {
    let out = render(&parse_config(&config()).unwrap(), &request(os_image)).unwrap();
    let text = out.text();
    tender_render::yaml::check_readers_agree(&text).unwrap();
    (text.clone(), docs(&text))
}

/// RFC 7386 merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// The chart's values as its schema defaults them (values.yaml), nested objects included.
fn schema_defaults(schema: &Value) -> Value {
    let mut out = json!({});
    for (k, v) in schema["properties"].as_object().unwrap() {
        let mut d = v.get("default").cloned().unwrap_or(Value::Null);
        if v.get("properties").is_some() {
            let nested = schema_defaults(v);
            if !d.is_object() {
                d = json!({});
            }
            for (nk, nv) in nested.as_object().unwrap() {
                if d.get(nk).is_none() {
                    d[nk] = nv.clone();
                }
            }
        }
        if !d.is_null() {
            out[k] = d;
        }
    }
    out
}

#[test]
fn should_keep_the_key_list_equal_to_the_committed_fixture() {
    assert_eq!(KEYS, reference("cozystack/value-keys.yaml"));
    // Every kubernetes-nodes key (osImage aside, from the seed) is in the committed schema.
    let schema: Value = serde_json::from_str(&reference("cozystack/kubernetes-nodes.values.schema.json")).unwrap();
    for path in key_list().unwrap()["kubernetes-nodes"].keys().filter(|p| !p.starts_with("osImage")) {
        let mut node = &schema;
        for seg in path.split('.') {
            let (name, item) = seg.strip_suffix("[]").map_or((seg, false), |n| (n, true));
            node = &node["properties"][name];
            if item {
                node = &node["items"];
            }
        }
        assert!(node.is_object(), "{path} is not in the kubernetes-nodes schema");
    }
}

#[test]
fn should_write_only_listed_keys_in_the_charts_own_spelling() {
    for os in [None, Some(OsImage::Builtin), Some(OsImage::Factory)] {
        let (text, docs) = rendered(os);
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["Kubernetes", "KubernetesNodes", "Package"], "{text}");
        check_keys(Chart::Kubernetes, &docs[0]["spec"], "spec.").unwrap();
        let nodes = check_keys(Chart::Nodes, &docs[1]["spec"], "spec.").unwrap();
        assert!(nodes.contains(&"talos.registryMirrors".to_string()));
        let values = &docs[2]["spec"]["components"]["platform"]["values"];
        assert_eq!(values.as_object().unwrap().keys().collect::<Vec<_>>(), ["kubernetesWorkerImage"]);
        check_keys(Chart::WorkerImage, &values["kubernetesWorkerImage"], "").unwrap();
        assert!(text.contains("schematicID:") && !text.contains("schematic:"), "{text}");
    }
}

#[test]
fn should_patch_registry_mirrors_for_every_upstream_to_the_mirror() {
    let (text, docs) = rendered(None);
    for d in &docs[..2] {
        let mirrors = &d["spec"]["talos"]["registryMirrors"];
        assert_eq!(mirrors.as_object().unwrap().len(), 3, "{text}");
        for host in ["docker.io", "ghcr.io", "on"] {
            assert_eq!(mirrors[host]["endpoints"], json!([MIRROR]), "{text}");
        }
    }
    assert!(text.contains("re-image no worker"), "{text}");
    assert!(!text.contains("osImage"), "{text}");
    assert_eq!(docs[1]["metadata"]["name"], "test-md1");
}

#[test]
fn should_parse_as_the_kubernetes_nodes_values_its_schema_describes() {
    let schema: Value = serde_json::from_str(&reference("cozystack/kubernetes-nodes.values.schema.json")).unwrap();
    let validator = jsonschema::draft7::new(&schema).unwrap();
    for os in [None, Some(OsImage::Builtin), Some(OsImage::Factory)] {
        let (text, docs) = rendered(os);
        let mut values = schema_defaults(&schema);
        values["cluster"] = json!("test");
        merge(&mut values, &docs[1]["spec"]);
        let errors: Vec<String> =
            validator.iter_errors(&values).map(|e| format!("{e} at {}", e.instance_path())).collect();
        assert!(errors.is_empty(), "{errors:?}\n{text}");
        // The patched pool still renders (tender's own reading of the same values).
        let mut pool = values.clone();
        for k in ["cluster", "podCpuLimit", "podCpuRequest", "kubelet", "images"] {
            pool.as_object_mut().unwrap().remove(k);
        }
        pool["cluster"] = json!("kubernetes-test");
        pool["namespace"] = json!("tenant-test");
        pool["pool"] = json!("md1");
        let file: tender_render::pool::PoolFile = serde_json::from_value(pool).unwrap();
        file.validate().unwrap();
    }
}

#[test]
fn should_say_that_editing_os_image_re_images_the_pool() {
    let out = render(&parse_config(&config()).unwrap(), &request(Some(OsImage::Builtin))).unwrap();
    assert!(out.text().contains("re-images pool md1 (P-6)"));
    assert!(out.warnings.iter().any(|w| w.contains("P-6")));
    let d = docs(&out.text());
    assert_eq!(d[1]["spec"]["osImage"], json!({"builtin": {"schematicID": SCHEMATIC, "version": "v1.13.6"}}));
    let f = docs(&render(&parse_config(&config()).unwrap(), &request(Some(OsImage::Factory))).unwrap().text());
    assert_eq!(
        f[1]["spec"]["osImage"],
        json!({"factory": {"imageFactoryURL": MIRROR, "schematicID": SCHEMATIC, "version": "v1.13.6"}})
    );
}

#[test]
fn should_read_cozystack_spellings_in_the_catalog_config() {
    let c = parse_config(
        "imageFactoryURL: https://f.example\ncatalog:\n  images:\n  - schematicID: abc\n    version: v1.13.6\n",
    )
    .unwrap();
    assert_eq!(c.image_factory.as_deref(), Some("https://f.example"));
    assert_eq!(c.catalog.unwrap().images[0].schematic, "abc");
}

#[test]
fn should_refuse_a_key_not_on_the_list_naming_it() {
    let err = check_keys(Chart::Nodes, &json!({"talos": {"schematicId": "x"}}), "spec.").unwrap_err().to_string();
    assert!(err.contains("spec.talos.schematicId") && err.contains("schematicID"), "{err}");
    // Free-form below registryMirrors; Cozystack's own keys pass.
    check_keys(
        Chart::Nodes,
        &json!({"talos": {"registryMirrors": {"x": {"anything": 1}}}, "podCpuLimit": 2, "images": {"kubectl": ""}}),
        "",
    )
    .unwrap();
}

#[test]
fn should_escape_a_hostile_unlisted_key() {
    let err = check_keys(Chart::Nodes, &json!({"talos\u{1b}[2J\n": 1}), "spec.").unwrap_err().to_string();
    assert!(!err.chars().any(char::is_control), "{err:?}");
}

/// Found by the `render_cozystack` fuzz target in CI: an unknown `kind` was printed raw.
#[test]
fn should_escape_a_hostile_kind() {
    let input = "apiVersion: apps.cozystack.io/v1alpha1\nkind: \"KubernetesNodes\\t\\e[2J\"\n";
    let err = read_input(input, Some("test-md1"), Some("tenant-test")).unwrap_err().to_string();
    assert!(err.contains("KubernetesNodes"), "{err:?}");
    assert!(!err.chars().any(char::is_control), "{err:?}");
}

/// Found by the same fuzz target: a namespace with tabs reached the report's text raw.
#[test]
fn should_escape_names_in_the_report() {
    let input = "kind: KubernetesNodes\nmetadata:\n  name: test-md1\n  namespace: \"t-\\t\\e[2J tenant\"\nspec:\n  cluster: test\n";
    let pools = read_input(input, None, None).unwrap();
    let report = check(&pools, None, &tender_render::state::ClusterState::default()).unwrap();
    let text = report.text();
    assert!(text.contains("tenant"), "{text}");
    assert!(!text.chars().any(|c| c.is_control() && c != '\n'), "{text:?}");
}

/// Found by the same fuzz target: a YAML reader's message quotes the input, tabs and all.
#[test]
fn should_escape_the_input_a_yaml_error_quotes() {
    let input = "uqstuoidc.user\t\t\t:::::\t!iiii0\nupstreams:\n";
    let err = read_input(input, Some("test-md1"), Some("tenant-test")).unwrap_err().to_string();
    assert!(err.contains("is not YAML"), "{err:?}");
    assert!(!err.chars().any(char::is_control), "{err:?}");
}

#[test]
fn should_refuse_hostile_names_and_mirrors_in_render_cozystack() {
    let config = parse_config(&config()).unwrap();
    for (cluster, namespace, pool, mirror) in [
        ("te$t", "tenant-test", "md1", MIRROR),
        ("test", "tenant\ntest", "md1", MIRROR),
        ("test", "tenant-test", "md1`id`", MIRROR),
        ("test", "tenant-test", "md1", "http://m\n:5000"),
        ("test", "tenant-test", "md1", "http://user:pw@m:5000"),
    ] {
        let req = RenderRequest {
            mirror: mirror.into(),
            cluster: Some(cluster.into()),
            namespace: Some(namespace.into()),
            pools: vec![pool.into()],
            ..RenderRequest::default()
        };
        let err = render(&config, &req).unwrap_err().to_string();
        assert!(!err.contains('\n') && !err.contains("pw@"), "{err}");
    }
}

/// A value of the listed type, for a key path.
fn sample(ty: &str) -> Value {
    match ty.split_whitespace().next().unwrap() {
        "integer" => json!(1),
        "boolean" => json!(false),
        "object" => json!({}),
        "array" => json!([]),
        "int-or-string" => json!("1"),
        _ => json!("test"),
    }
}

/// Place `leaf` at a key-list path (`a.*.b`, `c[].d`).
fn place(root: &mut Value, path: &str, leaf: Value) {
    let mut node = root;
    let segs: Vec<&str> = path.split('.').collect();
    for (i, seg) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        let (name, item) = seg.strip_suffix("[]").map_or((*seg, false), |n| (n, true));
        let name = if name == "*" { "md9" } else { name };
        let next = if item {
            json!([{}])
        } else if last {
            leaf.clone()
        } else {
            json!({})
        };
        if !node.get(name).is_some_and(|v| v.is_object() || v.is_array()) || last && !item {
            node[name] = next;
        }
        node = &mut node[name];
        if item {
            node = &mut node[0];
            if last {
                *node = leaf.clone();
            }
        }
    }
}

#[test]
fn should_accept_every_key_on_the_committed_list() {
    let keys = key_list().unwrap();
    for (chart, section, base) in
        [(Chart::Nodes, "kubernetes-nodes", json!({"cluster": "test"})), (Chart::Kubernetes, "kubernetes", json!({}))]
    {
        for (path, ty) in &keys[section] {
            let mut values = base.clone();
            // A list item's required `name` (gpus[]) comes with it, as the schema requires.
            let named = keys[section].contains_key(&format!("{path}.name"));
            place(&mut values, path, if named { json!({"name": "test"}) } else { sample(ty) });
            check_keys(chart, &values, "").unwrap_or_else(|e| panic!("{path}: {e}"));
            let text = serde_json::to_string(&values).unwrap();
            let name = if chart == Chart::Nodes { "test-md1" } else { "test" };
            tender_render::cozystack::read_input(&text, Some(name), Some("tenant-test"))
                .unwrap_or_else(|e| panic!("{section} {path}: {e}\n{text}"));
        }
    }
    for (path, ty) in &keys["kubernetesWorkerImage"] {
        let mut values = json!({});
        place(&mut values, path, sample(ty));
        check_keys(Chart::WorkerImage, &values, "").unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}
