//! Which Cozystack `render cozystack` and `check cozystack` are for: the values schemas of its
//! `kubernetes` and `kubernetes-nodes` charts, and what each can express (issue 33).
//!
//! A capability is written with the key the target's schema has, and only then: Helm accepts
//! unknown keys silently (neither chart closes its root or `talos`), so a key the target lacks
//! would change nothing and say nothing. The schemas tender carries are the charts' own
//! `values.schema.json` (`testdata/cozystack/schemas/`, origin and commits in its README).

use serde_json::{json, Value};

use crate::Error;

/// The `--cozystack` versions tender carries, in the order `--help` lists them.
pub const VERSIONS: &[&str] = &["v1.6.0", "v1.6.1", "v1.6.2", "main", "golden-catalog"];

/// The default: the newest release whose charts have `talos.registryMirrors`. No release has
/// them yet (v1.6.2 is the newest), so it is `main` at the pinned commit.
pub const DEFAULT_VERSION: &str = "main";

/// The commit `main` stands for.
pub const MAIN_COMMIT: &str = "3c780acd4";

const MAIN_KUBERNETES: &str = include_str!("../../../testdata/cozystack/schemas/main-3c780acd4.json");
const MAIN_NODES: &str = include_str!("../../../testdata/cozystack/schemas/kubernetes-nodes/main-3c780acd4.json");
// v1.6.0, v1.6.1 and v1.6.2 carry byte-identical schemas (testdata/cozystack/README.md).
const V1_6_KUBERNETES: &str = include_str!("../../../testdata/cozystack/schemas/v1.6.2.json");
const V1_6_NODES: &str = include_str!("../../../testdata/cozystack/schemas/kubernetes-nodes/v1.6.2.json");

/// A key a capability is written to, as a path of property names.
pub const REGISTRY_MIRRORS: &[&str] = &["talos", "registryMirrors"];
pub const IMAGE_FACTORY_URL: &[&str] = &["talos", "imageFactoryURL"];
pub const INSTALLER_REPOSITORY: &[&str] = &["talos", "installerRepository"];
pub const OS_IMAGE_BUILTIN: &[&str] = &["osImage", "builtin"];
pub const OS_IMAGE_FACTORY: &[&str] = &["osImage", "factory"];

/// The Cozystack a render is for.
#[derive(Debug, Clone)]
pub struct Target {
    /// How messages name it: `main (3c780acd4)`, `v1.6.2`, `golden-catalog`, or the file.
    pub name: String,
    /// The `kubernetes` app's values schema (the `Kubernetes` resource's `spec`).
    pub kubernetes: Value,
    /// The `kubernetes-nodes` chart's values schema (the `KubernetesNodes` resource's `spec`).
    pub nodes: Value,
    /// The platform Package takes `kubernetesWorkerImage` (the golden catalog).
    pub worker_image_catalog: bool,
}

fn parse(what: &str, text: &str) -> Result<Value, Error> {
    serde_json::from_str(text).map_err(|e| Error::Malformed { what: what.into(), message: format!("is not JSON: {e}") })
}

impl Target {
    /// A schema tender carries: one of [`VERSIONS`].
    pub fn embedded(version: &str) -> Result<Target, Error> {
        let (name, k, n) = match version {
            "v1.6.0" | "v1.6.1" | "v1.6.2" => (version.to_string(), V1_6_KUBERNETES, V1_6_NODES),
            "main" => (format!("main ({MAIN_COMMIT})"), MAIN_KUBERNETES, MAIN_NODES),
            "golden-catalog" => ("golden-catalog".to_string(), MAIN_KUBERNETES, MAIN_NODES),
            other => {
                return Err(Error::Malformed {
                    what: format!("--cozystack {:?}", other.escape_debug().to_string()),
                    message: format!(
                        "is not a version tender carries a schema for; give one of {}, or the chart's schema with --values-schema FILE",
                        VERSIONS.join(", ")
                    ),
                })
            }
        };
        let kubernetes = parse("the embedded kubernetes schema", k)?;
        let mut nodes = parse("the embedded kubernetes-nodes schema", n)?;
        let golden = version == "golden-catalog";
        if golden {
            // The design of the worker-image catalog (seed spec §6, P-1..P-4): `osImage` on the
            // pool, `kubernetesWorkerImage` on the platform Package; not in any Cozystack yet.
            let image = json!({"type": "object", "properties": {
                "imageFactoryURL": {"type": "string"}, "schematicID": {"type": "string"}, "version": {"type": "string"}}});
            let builtin = json!({"type": "object", "properties": {
                "schematicID": {"type": "string"}, "version": {"type": "string"}}});
            nodes["properties"]["osImage"] =
                json!({"type": "object", "properties": {"builtin": builtin, "factory": image}});
        }
        Ok(Target { name, kubernetes, nodes, worker_image_catalog: golden })
    }

    /// `--values-schema FILE`: a chart's `values.schema.json`, or the `ApplicationDefinition`
    /// as `kubectl get applicationdefinitions kubernetes -o yaml` prints it (its
    /// `spec.application.openAPISchema` holds the schema as a JSON string). The one schema
    /// stands for both charts.
    pub fn from_schema_file(name: &str, text: &str) -> Result<Target, Error> {
        let bad = |message: String| Error::Malformed { what: format!("--values-schema {name}"), message };
        let doc: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(_) => serde_norway::from_str(text).map_err(|e| bad(format!("is neither JSON nor YAML: {e}")))?,
        };
        let schema = if doc.get("kind").and_then(Value::as_str) == Some("ApplicationDefinition") {
            let Some(s) = doc.pointer("/spec/application/openAPISchema").and_then(Value::as_str) else {
                return Err(bad(
                    "is an ApplicationDefinition without spec.application.openAPISchema (a JSON string)".into()
                ));
            };
            serde_json::from_str(s).map_err(|e| bad(format!("spec.application.openAPISchema is not JSON: {e}")))?
        } else {
            doc
        };
        if !schema.get("properties").is_some_and(Value::is_object) {
            return Err(bad(
                "has no properties: give the chart's values.schema.json or its ApplicationDefinition".into()
            ));
        }
        let worker_image_catalog = has_key(&schema, OS_IMAGE_BUILTIN);
        Ok(Target { name: name.to_string(), kubernetes: schema.clone(), nodes: schema, worker_image_catalog })
    }

    pub fn schema(&self, nodes: bool) -> &Value {
        if nodes {
            &self.nodes
        } else {
            &self.kubernetes
        }
    }
}

/// Whether `schema` declares the property path (`properties` at each step).
pub fn has_key(schema: &Value, path: &[&str]) -> bool {
    let mut node = schema;
    for seg in path {
        match node.get("properties").and_then(|p| p.get(*seg)) {
            Some(n) => node = n,
            None => return false,
        }
    }
    true
}

/// The schema as the values are checked against it: without `required`. Cozystack's API and the
/// chart's values.yaml fill every required key with its default, so a resource that leaves one
/// out is valid; what remains is types, patterns, enums and bounds.
pub fn without_required(schema: &Value) -> Value {
    match schema {
        Value::Object(m) => Value::Object(
            m.iter().filter(|(k, _)| k.as_str() != "required").map(|(k, v)| (k.clone(), without_required(v))).collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_required).collect()),
        other => other.clone(),
    }
}

/// The keys of `values` the schema does not declare, as dotted paths: Helm renders them without
/// a word and no template reads them. Below `additionalProperties` (a map of any keys) or
/// `x-kubernetes-preserve-unknown-fields`, and below a non-object, anything goes.
pub fn undeclared_keys(schema: &Value, values: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk_undeclared(schema, values, "", &mut out);
    out
}

fn walk_undeclared(schema: &Value, values: &Value, path: &str, out: &mut Vec<String>) {
    let Value::Object(map) = values else {
        if let (Value::Array(items), Some(item)) = (values, schema.get("items")) {
            for (i, v) in items.iter().enumerate() {
                walk_undeclared(item, v, &format!("{path}[{i}]"), out);
            }
        }
        return;
    };
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    for (k, v) in map {
        let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
        match (props.and_then(|m| m.get(k)), additional) {
            (Some(s), _) => walk_undeclared(s, v, &p, out),
            (None, Some(s @ Value::Object(_))) => walk_undeclared(s, v, &p, out),
            (None, Some(Value::Bool(true))) => {}
            (None, _) if props.is_none() => {}
            (None, _) => out.push(p),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_know_which_version_has_which_key() {
        for (v, mirrors, builtin) in [
            ("v1.6.0", false, false),
            ("v1.6.1", false, false),
            ("v1.6.2", false, false),
            ("main", true, false),
            ("golden-catalog", true, true),
        ] {
            let t = Target::embedded(v).unwrap();
            for nodes in [false, true] {
                assert_eq!(has_key(t.schema(nodes), REGISTRY_MIRRORS), mirrors, "{v}");
                assert!(has_key(t.schema(nodes), IMAGE_FACTORY_URL), "{v}");
                assert!(has_key(t.schema(nodes), INSTALLER_REPOSITORY), "{v}");
            }
            assert_eq!(has_key(&t.nodes, OS_IMAGE_BUILTIN), builtin, "{v}");
            assert!(!has_key(&t.kubernetes, OS_IMAGE_BUILTIN), "{v}");
            assert_eq!(t.worker_image_catalog, builtin, "{v}");
        }
        assert!(Target::embedded("v1.7.0").unwrap_err().to_string().contains("--values-schema"));
        assert_eq!(DEFAULT_VERSION, "main");
    }

    #[test]
    fn should_read_a_schema_or_the_application_definition_that_carries_it() {
        let schema = MAIN_KUBERNETES;
        let t = Target::from_schema_file("values.schema.json", schema).unwrap();
        assert!(has_key(&t.nodes, REGISTRY_MIRRORS));
        let quoted = serde_json::to_string(schema.trim()).unwrap();
        let ad = format!("apiVersion: cozystack.io/v1alpha1\nkind: ApplicationDefinition\nmetadata:\n  name: kubernetes\nspec:\n  application:\n    kind: Kubernetes\n    openAPISchema: {quoted}\n");
        let t = Target::from_schema_file("ad.yaml", &ad).unwrap();
        assert!(has_key(&t.kubernetes, REGISTRY_MIRRORS));
        assert!(Target::from_schema_file("x", "kind: ApplicationDefinition\nspec: {}\n").is_err());
        assert!(Target::from_schema_file("x", "[1]").is_err());
    }

    #[test]
    fn should_list_keys_the_schema_does_not_declare() {
        let t = Target::embedded("v1.6.2").unwrap();
        let values = json!({"cluster": "c", "osImage": {"factory": {}}, "talos": {"registryMirrors": {}, "version": "v1.13.6"},
            "kubelet": {"nope": 1}});
        assert_eq!(undeclared_keys(&t.nodes, &values), ["kubelet.nope", "osImage", "talos.registryMirrors"]);
        let main = Target::embedded("main").unwrap();
        assert_eq!(
            undeclared_keys(&main.nodes, &json!({"talos": {"registryMirrors": {"x": {"any": 1}}}})),
            Vec::<String>::new()
        );
    }
}
