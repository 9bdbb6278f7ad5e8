//! Shared fixtures for the render tests: pool files, cluster states and the reference schemas.
#![allow(dead_code, reason = "each test binary uses a different part of the fixtures")]
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test fixtures fail loudly")]

use std::path::PathBuf;

use serde_json::{json, Value};
use tender_render::k8s::{render_pool, PoolFormat, PoolRender};
use tender_render::state::ClusterState;
use tender_render::Error;

pub const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
pub const GOLDEN_URL: &str = "https://factory.talos.dev/image/ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515/v1.13.6/openstack-amd64.raw.xz";
pub const GOLDEN: &str = "talos-worker-ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515-v1.13.6";

/// A reference file under the repository's `testdata/reference/` (origin and licence in its
/// README). Missing means the checkout is broken: fail loudly, never skip.
pub fn reference(rel: &str) -> String {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/reference/")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reference file {} is missing ({e})", path.display()))
}

/// The minimal pool file with `extra` YAML appended at the top level.
pub fn pool_yaml(extra: &str) -> String {
    format!("cluster: kubernetes-test\nnamespace: tenant-test\npool: md0\n{extra}")
}

pub fn try_render(yaml: &str, state: Option<&ClusterState>) -> Result<PoolRender, Error> {
    let pool = tender_render::pool::parse(yaml)?.validate()?;
    render_pool(&pool, state, false, PoolFormat::Manifests)
}

pub fn render(yaml: &str, state: Option<&ClusterState>) -> PoolRender {
    try_render(yaml, state).unwrap_or_else(|e| panic!("render failed: {e}\n{yaml}"))
}

pub fn patches(yaml: &str) -> String {
    let pool = tender_render::pool::parse(yaml).unwrap().validate().unwrap();
    render_pool(&pool, None, false, PoolFormat::Patch).unwrap().text
}

/// The refusal's text, or a panic if the render passed.
pub fn refusal(yaml: &str, state: Option<&ClusterState>) -> String {
    match try_render(yaml, state) {
        Ok(_) => panic!("render passed, expected a refusal\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

/// Parse multi-document YAML into JSON values.
pub fn docs(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

pub fn doc_of_kind(text: &str, kind: &str) -> Value {
    docs(text).into_iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in\n{text}"))
}

/// The worker disk template of the rendered KMT.
pub fn disk(text: &str) -> Value {
    doc_of_kind(text, "KubevirtMachineTemplate")["spec"]["template"]["spec"]["virtualMachineTemplate"]["spec"]
        ["dataVolumeTemplates"][0]
        .clone()
}

/// A cluster state, built as the `List` kubectl prints and parsed back.
#[derive(Default, Clone)]
pub struct State {
    items: Vec<Value>,
}

impl State {
    pub fn new() -> Self {
        State::default()
    }

    pub fn storage_class(mut self, name: &str, default: bool, created: &str) -> Self {
        let mut sc = json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name, "creationTimestamp": created},
            "provisioner": "linstor.csi.linbit.com",
        });
        if default {
            sc["metadata"]["annotations"] = json!({"storageclass.kubernetes.io/is-default-class": "true"});
        }
        self.items.push(sc);
        self
    }

    /// The golden in cozy-public; `class` None means no declared class.
    pub fn golden(mut self, phase: &str, class: Option<&str>, storage: &str) -> Self {
        let mut storage_spec = json!({"resources": {"requests": {"storage": storage}}});
        if let Some(c) = class {
            storage_spec["storageClassName"] = json!(c);
        }
        self.items.push(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {"name": GOLDEN, "namespace": "cozy-public"},
            "spec": {"source": {"http": {"url": GOLDEN_URL}}, "storage": storage_spec},
            "status": {"phase": phase},
        }));
        self
    }

    pub fn pvc(mut self, namespace: &str, name: &str, class: &str) -> Self {
        self.items.push(json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"storageClassName": class},
            "status": {"phase": "Bound"},
        }));
        self
    }

    /// A worker disk cloned for `pool_annotation` (e.g. `kubernetes-test/md0`), with its PVC.
    pub fn cloned_disk(self, name: &str, pool_annotation: &str, class: &str) -> Self {
        self.cloned_disk_in("tenant-test", name, pool_annotation, class)
    }

    pub fn cloned_disk_in(mut self, namespace: &str, name: &str, pool_annotation: &str, class: &str) -> Self {
        self.items.push(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {
                    "kubernetes-worker-image.cozystack.io/golden": GOLDEN,
                    "kubernetes-worker-image.cozystack.io/pool": pool_annotation,
                },
            },
            "spec": {"source": {"pvc": {"name": GOLDEN, "namespace": "cozy-public"}}},
            "status": {"phase": "Succeeded"},
        }));
        self.pvc(namespace, name, class)
    }

    pub fn yaml(&self) -> String {
        serde_norway::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": self.items})).unwrap()
    }

    pub fn build(&self) -> ClusterState {
        ClusterState::from_yaml(&self.yaml()).unwrap()
    }
}

/// The usual cluster: `replicated` is the default class, the golden imported on it.
pub fn healthy() -> State {
    State::new()
        .storage_class("replicated", true, "2024-01-01T00:00:00Z")
        .storage_class("local", false, "2024-01-01T00:00:00Z")
        .golden("Succeeded", Some("replicated"), "6Gi")
}

pub const BUILTIN: &str = "osImage:\n  builtin: {}\n";
