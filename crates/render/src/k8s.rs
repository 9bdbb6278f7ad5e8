//! The Kubernetes objects of a worker pool, built as data: KubevirtMachineTemplate (named by a
//! hash of its `spec.template`), MachineDeployment, MachineHealthCheck and TalosConfigTemplate.

use serde_json::{json, Map, Value};

use crate::clone::{CATALOG_NAMESPACE, GOLDEN_ANNOTATION, POOL_ANNOTATION};
use crate::hash::{hash6, yaml_one};
use crate::pool::{DiskSource, MaxUnhealthy, Pool};
use crate::talos::pool_patches;
use crate::Error;

pub const KMT_API_VERSION: &str = "infrastructure.cluster.x-k8s.io/v1alpha1";
pub const CAPI_API_VERSION: &str = "cluster.x-k8s.io/v1beta1";
pub const CABPT_API_VERSION: &str = "bootstrap.cluster.x-k8s.io/v1alpha3";
pub const CAPACITY_CPU: &str = "capacity.cluster-autoscaler.kubernetes.io/cpu";
pub const CAPACITY_MEMORY: &str = "capacity.cluster-autoscaler.kubernetes.io/memory";

/// The worker pod's ephemeral-storage limit, 2Gi: persistent DataVolumes are not counted as pod
/// ephemeral storage.
pub const POD_EPHEMERAL_STORAGE_BYTES: u64 = 2 << 30;

/// The worker disk's source and class, as resolved for this render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    pub source: DiskSource,
    /// Empty: omit `storageClassName` (D-6). The builtin path always has one (D-5) unless the
    /// operator skipped the cluster checks.
    pub storage_class: String,
}

/// `disk-system`, the one DataVolume template of the VM.
pub fn disk_template(pool: &Pool, disk: &Disk) -> Value {
    let (annotations, source) = match &disk.source {
        DiskSource::Factory { url } => {
            (json!({"cdi.kubevirt.io/storage.usePopulator": "false"}), json!({"http": {"url": url}}))
        }
        DiskSource::Builtin { golden } => (
            json!({GOLDEN_ANNOTATION: golden, POOL_ANNOTATION: pool.annotation()}),
            json!({"pvc": {"namespace": CATALOG_NAMESPACE, "name": golden}}),
        ),
    };
    let mut storage = json!({"resources": {"requests": {"storage": pool.disk_size.as_str()}}});
    if !disk.storage_class.is_empty() {
        storage["storageClassName"] = Value::String(disk.storage_class.clone());
    }
    json!({
        "metadata": {"name": "disk-system", "annotations": annotations},
        "spec": {"source": source, "storage": storage},
    })
}

/// The KMT's `spec.template`: everything here feeds the hash name.
pub fn kmt_template(pool: &Pool, disk: &Disk) -> Value {
    let name = pool.name();
    let mut role_labels = Map::new();
    for r in &pool.roles {
        role_labels.insert(format!("node-role.kubernetes.io/{r}"), Value::String(String::new()));
    }
    let mut pod_labels = role_labels.clone();
    pod_labels.insert("cluster.x-k8s.io/deployment-name".into(), Value::String(name));
    pod_labels.insert("apps.cozystack.io/application.group".into(), json!("apps.cozystack.io"));
    pod_labels.insert("apps.cozystack.io/application.kind".into(), json!("Kubernetes"));
    let app = pool.cluster.strip_prefix("kubernetes-").unwrap_or(&pool.cluster);
    pod_labels.insert("apps.cozystack.io/application.name".into(), json!(app));

    let mut devices = json!({
        "disks": [{
            "name": "system",
            "disk": {"bus": "virtio", "pciAddress": "0000:07:00.0"},
            "blockSize": {"custom": {"logical": 512, "physical": 4096}},
        }],
        "interfaces": [{"name": "default", "bridge": {}}],
    });
    if !pool.gpus.is_empty() {
        let gpus: Vec<Value> = pool
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| json!({"name": format!("gpu{}", i + 1), "deviceName": g}))
            .collect();
        devices["gpus"] = Value::Array(gpus);
    }
    if pool.log_serial_console {
        devices["logSerialConsole"] = Value::Bool(true);
    }
    // Ratio 1 keeps the text "2Gi" (and so the pinned template hash); any other ratio gives
    // the request in bytes, truncated, as Cozystack's chart does.
    let request = match pool.ephemeral_storage_ratio {
        0 | 1 => json!("2Gi"),
        r => json!((POD_EPHEMERAL_STORAGE_BYTES / u64::from(r)).to_string()),
    };
    let mut domain = json!({
        "devices": devices,
        "resources": {
            "requests": {"ephemeral-storage": request},
            "limits": {"ephemeral-storage": "2Gi"},
        },
    });
    if let (Some(cpu), Some(memory)) = (&pool.cpu, &pool.memory) {
        domain["cpu"] = json!({"threads": 1, "cores": cpu, "sockets": 1});
        domain["memory"] = json!({"guest": memory});
    }

    let mut vm_spec = json!({
        "runStrategy": "Always",
        "dataVolumeTemplates": [disk_template(pool, disk)],
        "template": {
            "metadata": {
                "annotations": {"kubevirt.io/allow-pod-bridge-network-live-migration": "true"},
                "labels": pod_labels,
            },
            "spec": {
                "domain": domain,
                "evictionStrategy": "External",
                "volumes": [{"name": "system", "dataVolume": {"name": "disk-system"}}],
                "networks": [{"name": "default", "pod": {}}],
            },
        },
    });
    if let Some(it) = &pool.instance_type {
        vm_spec["instancetype"] = json!({"kind": "VirtualMachineClusterInstancetype", "name": it});
    }
    let mut vm_meta = json!({"namespace": pool.namespace});
    if !role_labels.is_empty() {
        vm_meta["labels"] = Value::Object(role_labels);
    }
    json!({
        "spec": {
            "virtualMachineBootstrapCheck": {"checkStrategy": "none"},
            "virtualMachineTemplate": {"metadata": vm_meta, "spec": vm_spec},
        }
    })
}

/// `<cluster>-<pool>-<hash6>`, hash6 over the canonical JSON of `spec.template`.
pub fn kmt_name(pool: &Pool, template: &Value) -> String {
    format!("{}-{}", pool.name(), hash6(template))
}

pub fn kubevirt_machine_template(pool: &Pool, template: &Value) -> Value {
    json!({
        "apiVersion": KMT_API_VERSION,
        "kind": "KubevirtMachineTemplate",
        "metadata": {"name": kmt_name(pool, template), "namespace": pool.namespace},
        "spec": {"template": template},
    })
}

fn selector_labels(pool: &Pool) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("cluster.x-k8s.io/cluster-name".into(), json!(pool.cluster));
    m.insert("cluster.x-k8s.io/deployment-name".into(), json!(pool.name()));
    m
}

pub fn machine_deployment(pool: &Pool, kmt_name: &str) -> Value {
    let mut template_labels = selector_labels(pool);
    for r in &pool.roles {
        template_labels.insert(format!("node-role.kubernetes.io/{r}"), json!(""));
    }
    // spec.replicas is left to the cluster-autoscaler (the min-size annotation seeds it).
    let mut annotations = json!({
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": pool.min_replicas.to_string(),
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": pool.max_replicas.to_string(),
        "cluster.x-k8s.io/autoscaling-options-maxnodeprovisiontime": pool.max_node_provision_time,
    });
    // Scale from zero: the autoscaler learns a node's size from these when the pool has none.
    // Known only when the pool is sized by resources (an instancetype lives in the cluster).
    if let (Some(cpu), Some(memory)) = (&pool.cpu, &pool.memory) {
        annotations[CAPACITY_CPU] = json!(cpu.to_string());
        annotations[CAPACITY_MEMORY] = json!(memory);
    }
    json!({
        "apiVersion": CAPI_API_VERSION,
        "kind": "MachineDeployment",
        "metadata": {
            "name": pool.name(),
            "namespace": pool.namespace,
            "annotations": annotations,
        },
        "spec": {
            "clusterName": pool.cluster,
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": pool.max_replicas, "maxUnavailable": 1},
            },
            "selector": {"matchLabels": selector_labels(pool)},
            "template": {
                "metadata": {"labels": template_labels},
                "spec": {
                    "clusterName": pool.cluster,
                    "bootstrap": {"configRef": {
                        "apiVersion": CABPT_API_VERSION,
                        "kind": "TalosConfigTemplate",
                        "name": pool.name(),
                        "namespace": pool.namespace,
                    }},
                    "infrastructureRef": {
                        "apiVersion": KMT_API_VERSION,
                        "kind": "KubevirtMachineTemplate",
                        "name": kmt_name,
                        "namespace": pool.namespace,
                    },
                    "version": pool.kubernetes_patch,
                },
            },
        },
    })
}

pub fn machine_health_check(pool: &Pool) -> Value {
    let max_unhealthy = match &pool.max_unhealthy {
        MaxUnhealthy::Count(n) => json!(n),
        MaxUnhealthy::Percent(p) => json!(p),
    };
    json!({
        "apiVersion": CAPI_API_VERSION,
        "kind": "MachineHealthCheck",
        "metadata": {"name": pool.name(), "namespace": pool.namespace},
        "spec": {
            "clusterName": pool.cluster,
            "maxUnhealthy": max_unhealthy,
            "nodeStartupTimeout": pool.node_startup_timeout,
            "selector": {"matchLabels": selector_labels(pool)},
            "unhealthyConditions": [
                {"type": "Ready", "status": "Unknown", "timeout": pool.ready_unknown_timeout},
                {"type": "Ready", "status": "False", "timeout": pool.ready_false_timeout},
            ],
        },
    })
}

/// The pool's Talos patches (install image, kubelet image, registries), each one document.
pub fn talos_patches(pool: &Pool) -> Vec<Value> {
    pool_patches(&pool.installer_image(), &pool.kubelet_image(), &pool.routing, pool.talos)
}

/// TalosConfigTemplate `<cluster>-<pool>`: `generateType: worker`, so the bootstrap provider
/// generates the config with the cluster's secrets, and tender's settings as strategic patches.
pub fn talos_config_template(pool: &Pool) -> Result<Value, Error> {
    let patches = talos_patches(pool).iter().map(yaml_one).collect::<Result<Vec<String>, Error>>()?;
    Ok(json!({
        "apiVersion": CABPT_API_VERSION,
        "kind": "TalosConfigTemplate",
        "metadata": {"name": pool.name(), "namespace": pool.namespace},
        "spec": {"template": {"spec": {
            "generateType": "worker",
            "talosVersion": pool.talos_version,
            "strategicPatches": patches,
        }}},
    }))
}

/// What `tender render pool` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolFormat {
    /// KubevirtMachineTemplate, MachineDeployment, MachineHealthCheck, TalosConfigTemplate.
    Manifests,
    /// Only the Talos patch documents, for platforms that assemble the machine config themselves.
    Patch,
}

/// A rendered pool.
#[derive(Debug, Clone)]
pub struct PoolRender {
    pub text: String,
    pub kmt_name: Option<String>,
    /// Things the operator should know (e.g. checks skipped); never part of the output.
    pub warnings: Vec<String>,
}

/// Resolve the worker disk: the HTTP path ignores the cluster state entirely (so a pool without
/// `osImage` renders the same bytes whether or not a catalog exists); the builtin path runs the
/// clone rules against it.
pub fn resolve_disk(
    pool: &Pool,
    state: Option<&crate::state::ClusterState>,
    skip_cluster_checks: bool,
    warnings: &mut Vec<String>,
) -> Result<Disk, Error> {
    match &pool.disk {
        DiskSource::Factory { .. } => Ok(Disk { source: pool.disk.clone(), storage_class: pool.storage_class.clone() }),
        DiskSource::Builtin { golden } => match state {
            Some(state) => {
                let checked = crate::clone::check(pool, golden, state)?;
                Ok(Disk { source: pool.disk.clone(), storage_class: checked.storage_class })
            }
            None if skip_cluster_checks => {
                warnings.push(format!(
                    "osImage.builtin rendered without the cluster checks: golden {golden} is assumed to exist, to share this pool's StorageClass and to be no larger than diskSize (R-1 to R-4 not checked)"
                ));
                Ok(Disk { source: pool.disk.clone(), storage_class: pool.storage_class.clone() })
            }
            None => Err(Error::MissingClusterState),
        },
    }
}

/// Render a validated pool.
pub fn render_pool(
    pool: &Pool,
    state: Option<&crate::state::ClusterState>,
    skip_cluster_checks: bool,
    format: PoolFormat,
) -> Result<PoolRender, Error> {
    let mut warnings = Vec::new();
    if format == PoolFormat::Patch {
        let text = crate::hash::yaml_documents(&talos_patches(pool))?;
        return Ok(PoolRender { text, kmt_name: None, warnings });
    }
    let disk = resolve_disk(pool, state, skip_cluster_checks, &mut warnings)?;
    let template = kmt_template(pool, &disk);
    let name = kmt_name(pool, &template);
    let docs = vec![
        kubevirt_machine_template(pool, &template),
        machine_deployment(pool, &name),
        machine_health_check(pool),
        talos_config_template(pool)?,
    ];
    Ok(PoolRender { text: crate::hash::yaml_documents(&docs)?, kmt_name: Some(name), warnings })
}
