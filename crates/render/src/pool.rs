//! A worker pool file: what the Cozystack `KubernetesNodes` app holds, plus the cluster and
//! namespace it lives in. Parsed strictly (unknown keys refused), then validated into a
//! [`Pool`] with every default and every effective value resolved.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use crate::quantity::{IntOrString, Quantity};
use crate::registries::{
    check_pem, check_secret_text, Auth, ClientIdentity, Endpoint, EndpointConfig, Mirror, Registry, Routing, Tls,
};
use crate::rules::{
    check_factory_url, check_name_length, check_no_control, check_no_credentials, check_schematic,
    check_support_matrix, check_version, is_dns_label, is_dns_subdomain, is_label_name, is_positive_duration,
    kubernetes_patch, Refusal, Rule, DNS_SUBDOMAIN_MAX, LABEL_VALUE_MAX,
};
use crate::talos::TalosVersion;
use crate::url::{parse_http_url, Authority};
use crate::Error;

/// The Cozystack defaults (`packages/apps/kubernetes-nodes/values.yaml`).
pub mod defaults {
    pub const KUBERNETES_VERSION: &str = "v1.35";
    pub const TALOS_VERSION: &str = "v1.13.6";
    pub const SCHEMATIC_ID: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
    pub const IMAGE_FACTORY_URL: &str = "https://factory.talos.dev";
    pub const INSTALLER_REPOSITORY: &str = "factory.talos.dev/installer";
    pub const STORAGE_CLASS: &str = "replicated";
    pub const DISK_SIZE: &str = "20Gi";
    pub const INSTANCE_TYPE: &str = "u1.medium";
    pub const MIN_REPLICAS: u32 = 0;
    pub const MAX_REPLICAS: u32 = 10;
    pub const MAX_UNHEALTHY: &str = "50%";
    pub const NODE_STARTUP_TIMEOUT: &str = "20m";
    pub const READY_UNKNOWN_TIMEOUT: &str = "5m";
    pub const READY_FALSE_TIMEOUT: &str = "10m";
    pub const MAX_NODE_PROVISION_TIME: &str = "30m";
}

/// A key that is present, even as `null` or `{}`, counts (Helm's `hasKey`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de> + Default>(d: D) -> Result<Option<T>, D::Error> {
    Ok(Some(Option::<T>::deserialize(d)?.unwrap_or_default()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolFile {
    pub cluster: String,
    pub namespace: String,
    pub pool: String,
    /// Cozystack's app calls this `version`; both spellings are read.
    #[serde(default, alias = "version")]
    pub kubernetes_version: Option<String>,
    #[serde(default)]
    pub talos: TalosValues,
    #[serde(default)]
    pub os_image: Option<OsImageValues>,
    #[serde(default)]
    pub storage_class: Option<String>,
    #[serde(default)]
    pub disk_size: Option<IntOrString>,
    #[serde(default)]
    pub instance_type: Option<String>,
    #[serde(default)]
    pub min_replicas: Option<u32>,
    #[serde(default)]
    pub max_replicas: Option<u32>,
    #[serde(default)]
    pub roles: Vec<String>,
    #[serde(default)]
    pub resources: ResourcesValues,
    #[serde(default)]
    pub gpus: Vec<GpuValues>,
    #[serde(default)]
    pub log_serial_console: bool,
    #[serde(default)]
    pub max_unhealthy: Option<IntOrString>,
    #[serde(default)]
    pub node_startup_timeout: Option<String>,
    #[serde(default)]
    pub ready_unknown_timeout: Option<String>,
    #[serde(default)]
    pub ready_false_timeout: Option<String>,
    #[serde(default)]
    pub max_node_provision_time: Option<String>,
    /// The worker pod's ephemeral-storage request is its 2Gi limit divided by this (Cozystack's
    /// `ephemeral-storage-allocation-ratio`, 40 there). tender's default 1 requests the whole
    /// limit, which keeps the machine-template names pinned before this setting existed.
    #[serde(default)]
    pub ephemeral_storage_allocation_ratio: Option<u32>,
    /// Cozystack's kubelet reservations and image overrides: read so a Cozystack values file
    /// with their empty defaults parses, refused when set (tender does not render them).
    #[serde(default)]
    pub kubelet: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub images: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TalosValues {
    pub version: Option<String>,
    #[serde(rename = "schematicID")]
    pub schematic_id: Option<String>,
    #[serde(rename = "imageFactoryURL")]
    pub image_factory_url: Option<String>,
    pub installer_repository: Option<String>,
    #[serde(default)]
    pub registry_mirrors: BTreeMap<String, MirrorValues>,
    #[serde(default)]
    pub registry_config: BTreeMap<String, RegistryConfigValues>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MirrorValues {
    #[serde(default)]
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub override_path: bool,
    #[serde(default)]
    pub skip_fallback: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RegistryConfigValues {
    #[serde(default)]
    pub tls: Option<TlsValues>,
    #[serde(default)]
    pub auth: Option<AuthValues>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsValues {
    pub ca: Option<String>,
    pub client_identity: Option<ClientIdentityValues>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientIdentityValues {
    pub crt: String,
    pub key: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuthValues {
    pub username: Option<String>,
    pub password: Option<String>,
    pub auth: Option<String>,
    pub identity_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OsImageValues {
    #[serde(default, deserialize_with = "present")]
    pub builtin: Option<BuiltinValues>,
    #[serde(default, deserialize_with = "present")]
    pub factory: Option<FactoryValues>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuiltinValues {
    #[serde(rename = "schematicID")]
    pub schematic_id: Option<String>,
    pub version: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FactoryValues {
    #[serde(rename = "imageFactoryURL")]
    pub image_factory_url: Option<String>,
    #[serde(rename = "schematicID")]
    pub schematic_id: Option<String>,
    pub version: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourcesValues {
    pub cpu: Option<IntOrString>,
    pub memory: Option<IntOrString>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuValues {
    pub name: String,
}

/// Where the worker OS disk comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskSource {
    /// HTTP import from an Image Factory (omitted `osImage`, or `osImage.factory`).
    Factory { url: String },
    /// CSI clone of the golden `cozy-public/talos-worker-<schematic>-<version>`.
    Builtin { golden: String },
}

/// A validated pool with every default and effective value resolved.
#[derive(Debug, Clone)]
pub struct Pool {
    pub cluster: String,
    pub namespace: String,
    pub pool: String,
    pub kubernetes_minor: String,
    pub kubernetes_patch: String,
    pub schematic: String,
    pub talos_version: String,
    pub talos: TalosVersion,
    pub installer_repository: String,
    pub disk: DiskSource,
    pub routing: Routing,
    /// As written; empty means "the cluster default".
    pub storage_class: String,
    pub disk_size: Quantity,
    pub instance_type: Option<String>,
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub roles: Vec<String>,
    /// Guest CPU cores, when sized by `resources` instead of `instanceType`.
    pub cpu: Option<u32>,
    pub memory: Option<String>,
    pub gpus: Vec<String>,
    pub log_serial_console: bool,
    pub max_unhealthy: MaxUnhealthy,
    pub node_startup_timeout: String,
    pub ready_unknown_timeout: String,
    pub ready_false_timeout: String,
    pub max_node_provision_time: String,
    /// Divides the 2Gi ephemeral-storage limit into the request (1: request the limit).
    pub ephemeral_storage_ratio: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaxUnhealthy {
    Count(u64),
    Percent(String),
}

impl Pool {
    /// `<cluster>-<pool>`: the MachineDeployment, MachineHealthCheck and TalosConfigTemplate.
    pub fn name(&self) -> String {
        format!("{}-{}", self.cluster, self.pool)
    }

    /// The value of the pool annotation on cloned disks: `<cluster>/<pool>`.
    pub fn annotation(&self) -> String {
        format!("{}/{}", self.cluster, self.pool)
    }

    /// `<installerRepository>/<schematic>:<version>` of the effective release (P-5).
    pub fn installer_image(&self) -> String {
        format!("{}/{}:{}", self.installer_repository, self.schematic, self.talos_version)
    }

    pub fn kubelet_image(&self) -> String {
        format!("ghcr.io/siderolabs/kubelet:{}", self.kubernetes_patch)
    }
}

/// The golden DataVolume name a pool clones: `talos-worker-<schematic>-<version>`.
pub fn golden_name(schematic: &str, version: &str) -> String {
    format!("talos-worker-{schematic}-{version}")
}

/// Parse a pool file (strict: unknown keys are refused).
pub fn parse(text: &str) -> Result<PoolFile, Error> {
    serde_norway::from_str(text)
        .map_err(|e| Error::Malformed { what: "pool file".into(), message: crate::yaml::humane(&e.to_string()) })
}

fn name_check(field: &str, value: &str, ok: bool, what: &str) -> Result<(), Refusal> {
    if ok {
        return Ok(());
    }
    Err(Refusal::input(field, value, format!("is not {what}"), format!("use {what}")))
}

impl PoolFile {
    /// Validate every field and resolve the defaults, the effective image (P-1, P-3, P-4, P-5)
    /// and the rules that need no cluster state.
    pub fn validate(&self) -> Result<Pool, Refusal> {
        for (field, map) in [("kubelet", &self.kubelet), ("images", &self.images)] {
            if let Some((key, value)) = map.iter().next() {
                return Err(Refusal::input(
                    format!("{field}.{key}"),
                    // A string is shown as itself: Display quotes it once.
                    value.as_str().map_or_else(|| value.to_string(), str::to_string),
                    "is not rendered by tender",
                    format!("drop {field} from the pool file; tender renders no {field} settings"),
                ));
            }
        }
        name_check("cluster", &self.cluster, is_dns_label(&self.cluster), "a DNS-1123 label (e.g. kubernetes-test)")?;
        name_check("namespace", &self.namespace, is_dns_label(&self.namespace), "a DNS-1123 label (e.g. tenant-test)")?;
        name_check("pool", &self.pool, is_dns_label(&self.pool), "a DNS-1123 label (e.g. md0)")?;
        // `<cluster>-<pool>` names the MachineDeployment and is its deployment-name label value.
        check_name_length(
            None,
            "cluster, pool",
            &format!("{}-{}", self.cluster, self.pool),
            "MachineDeployment name (the cluster.x-k8s.io/deployment-name label value)",
            LABEL_VALUE_MAX,
        )?;

        let kubernetes_minor = self.kubernetes_version.clone().unwrap_or_else(|| defaults::KUBERNETES_VERSION.into());
        let kubernetes_patch = kubernetes_patch("kubernetesVersion", &kubernetes_minor)?.to_string();

        let t = &self.talos;
        let talos_version = t.version.clone().unwrap_or_else(|| defaults::TALOS_VERSION.into());
        let talos_schematic = t.schematic_id.clone().unwrap_or_else(|| defaults::SCHEMATIC_ID.into());
        let talos_factory = t.image_factory_url.clone().unwrap_or_else(|| defaults::IMAGE_FACTORY_URL.into());
        check_support_matrix("talos.version", &talos_version, &kubernetes_minor)?;

        // P-1, P-3, P-4: resolve the effective (schematic, version, factory URL) and the source.
        let os = self.os_image.as_ref();
        let (builtin, factory) = (os.and_then(|o| o.builtin.as_ref()), os.and_then(|o| o.factory.as_ref()));
        let (schematic, schematic_field, version, version_field, factory_url, factory_field, clone) =
            match (builtin, factory) {
                (Some(_), Some(_)) => {
                    return Err(Refusal::new(
                        Some(Rule::P1),
                        "osImage",
                        "builtin + factory",
                        "sets both builtin and factory, which are mutually exclusive",
                        "keep osImage.builtin (clone a golden) or osImage.factory (import over HTTP), not both",
                    ))
                }
                (Some(b), None) => (
                    b.schematic_id.clone().unwrap_or(talos_schematic),
                    if b.schematic_id.is_some() { "osImage.builtin.schematicID" } else { "talos.schematicID" },
                    b.version.clone().unwrap_or(talos_version.clone()),
                    if b.version.is_some() { "osImage.builtin.version" } else { "talos.version" },
                    talos_factory,
                    "talos.imageFactoryURL",
                    true,
                ),
                (None, Some(f)) => (
                    f.schematic_id.clone().unwrap_or(talos_schematic),
                    if f.schematic_id.is_some() { "osImage.factory.schematicID" } else { "talos.schematicID" },
                    f.version.clone().unwrap_or(talos_version.clone()),
                    if f.version.is_some() { "osImage.factory.version" } else { "talos.version" },
                    f.image_factory_url.clone().unwrap_or(talos_factory),
                    if f.image_factory_url.is_some() {
                        "osImage.factory.imageFactoryURL"
                    } else {
                        "talos.imageFactoryURL"
                    },
                    false,
                ),
                (None, None) => (
                    talos_schematic,
                    "talos.schematicID",
                    talos_version.clone(),
                    "talos.version",
                    talos_factory,
                    "talos.imageFactoryURL",
                    false,
                ),
            };
        check_schematic(Rule::R6, schematic_field, &schematic)?;
        check_version(Rule::R7, version_field, &version)?;
        let factory_url = check_factory_url(factory_field, &factory_url)?;
        if version != talos_version {
            check_support_matrix(version_field, &version, &kubernetes_minor)?;
        }
        let talos = TalosVersion::parse(version_field, &version)?;
        let disk = if clone {
            let golden = golden_name(&schematic, &version);
            let field = if schematic.len() >= version.len() { schematic_field } else { version_field };
            check_name_length(
                Some(if field == schematic_field { Rule::R6 } else { Rule::R7 }),
                field,
                &golden,
                "golden DataVolume name (a DNS-1123 subdomain)",
                DNS_SUBDOMAIN_MAX,
            )?;
            DiskSource::Builtin { golden }
        } else {
            DiskSource::Factory { url: format!("{factory_url}/image/{schematic}/{version}/openstack-amd64.raw.xz") }
        };

        let installer_repository =
            installer_repository(t.installer_repository.as_deref().unwrap_or(defaults::INSTALLER_REPOSITORY))?;
        let routing = routing(&t.registry_mirrors, &t.registry_config)?;

        let storage_class = self.storage_class.clone().unwrap_or_else(|| defaults::STORAGE_CLASS.into());
        if !storage_class.is_empty() {
            name_check(
                "storageClass",
                &storage_class,
                is_dns_subdomain(&storage_class),
                "a StorageClass name (DNS-1123 subdomain), or \"\" for the cluster default",
            )?;
        }
        let disk_size_text = self.disk_size.clone().map(|q| q.0).unwrap_or_else(|| defaults::DISK_SIZE.into());
        let disk_size = quantity("diskSize", &disk_size_text)?;
        if disk_size.is_zero() {
            return Err(Refusal::input(
                "diskSize",
                &disk_size_text,
                "is zero",
                "give the worker disk a size, e.g. 20Gi",
            ));
        }

        let cpu = self.resources.cpu.as_ref().map(|q| cores(&q.0)).transpose()?;
        let memory = self
            .resources
            .memory
            .as_ref()
            .map(|q| quantity("resources.memory", &q.0).map(|q| q.to_string()))
            .transpose()?;
        if cpu.is_some() != memory.is_some() {
            return Err(Refusal::input(
                "resources",
                cpu.map(|c| c.to_string()).or(memory.clone()).unwrap_or_default(),
                "sets only one of cpu and memory; KubeVirt rejects a VM that mixes an instancetype with either",
                "set both resources.cpu and resources.memory, or neither",
            ));
        }
        let instance_type = match (&cpu, &self.instance_type) {
            (Some(_), _) => None,
            (None, Some(it)) if it.is_empty() => None,
            (None, it) => {
                let it = it.clone().unwrap_or_else(|| defaults::INSTANCE_TYPE.into());
                name_check("instanceType", &it, is_dns_subdomain(&it), "an instancetype name (DNS-1123 subdomain)")?;
                Some(it)
            }
        };
        let min_replicas = self.min_replicas.unwrap_or(defaults::MIN_REPLICAS);
        let max_replicas = self.max_replicas.unwrap_or(defaults::MAX_REPLICAS);
        if min_replicas > max_replicas {
            return Err(Refusal::input(
                "minReplicas",
                min_replicas.to_string(),
                format!("is above maxReplicas {max_replicas}"),
                "keep minReplicas <= maxReplicas",
            ));
        }
        for r in &self.roles {
            name_check("roles[]", r, is_label_name(r), "a label name ([A-Za-z0-9._-], at most 63)")?;
        }
        let mut gpus = Vec::new();
        for g in &self.gpus {
            let ok = !g.name.is_empty()
                && g.name.len() <= 253
                && g.name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'));
            name_check("gpus[].name", &g.name, ok, "a device name such as nvidia.com/AD102GL_L40S")?;
            gpus.push(g.name.clone());
        }

        let max_unhealthy =
            max_unhealthy(self.max_unhealthy.as_ref().map_or(defaults::MAX_UNHEALTHY, |m| m.0.as_str()))?;
        let duration = |field: &str, value: &Option<String>, default: &str| -> Result<String, Refusal> {
            let v = value.clone().unwrap_or_else(|| default.into());
            if is_positive_duration(&v) {
                Ok(v)
            } else {
                Err(Refusal::input(field, &v, "is not a whole number of s, m or h", "write it like 30m or 1h30m"))
            }
        };

        let ephemeral_storage_ratio = self.ephemeral_storage_allocation_ratio.unwrap_or(1);
        if ephemeral_storage_ratio == 0 {
            return Err(Refusal::input(
                "ephemeralStorageAllocationRatio",
                "0",
                "is zero; the ephemeral-storage request is the limit divided by it",
                "give a positive integer (Cozystack uses 40), or leave it out to request the whole limit",
            ));
        }

        Ok(Pool {
            ephemeral_storage_ratio,
            cluster: self.cluster.clone(),
            namespace: self.namespace.clone(),
            pool: self.pool.clone(),
            kubernetes_minor,
            kubernetes_patch,
            schematic,
            talos_version: version,
            talos,
            installer_repository,
            disk,
            routing,
            storage_class,
            disk_size,
            instance_type,
            min_replicas,
            max_replicas,
            roles: self.roles.clone(),
            cpu,
            memory,
            gpus,
            log_serial_console: self.log_serial_console,
            max_unhealthy,
            node_startup_timeout: duration(
                "nodeStartupTimeout",
                &self.node_startup_timeout,
                defaults::NODE_STARTUP_TIMEOUT,
            )?,
            ready_unknown_timeout: duration(
                "readyUnknownTimeout",
                &self.ready_unknown_timeout,
                defaults::READY_UNKNOWN_TIMEOUT,
            )?,
            ready_false_timeout: duration(
                "readyFalseTimeout",
                &self.ready_false_timeout,
                defaults::READY_FALSE_TIMEOUT,
            )?,
            max_node_provision_time: duration(
                "maxNodeProvisionTime",
                &self.max_node_provision_time,
                defaults::MAX_NODE_PROVISION_TIME,
            )?,
        })
    }
}

fn quantity(field: &str, text: &str) -> Result<Quantity, Refusal> {
    Quantity::parse(text).map_err(|problem| {
        Refusal::input(field, text, format!("is not a Kubernetes quantity: it {problem}"), "write it like 20Gi")
    })
}

fn cores(text: &str) -> Result<u32, Refusal> {
    match text.parse::<u32>() {
        Ok(n) if n > 0 && !text.starts_with('0') && text.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(Refusal::input(
            "resources.cpu",
            text,
            "is not a whole number of cores; it becomes the VM's cpu.cores",
            "give a positive integer, e.g. 2",
        )),
    }
}

fn max_unhealthy(value: &str) -> Result<MaxUnhealthy, Refusal> {
    let digits = |s: &str| !s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(n) = value.strip_suffix('%') {
        if digits(n) {
            return Ok(MaxUnhealthy::Percent(value.to_string()));
        }
    } else if digits(value) {
        if let Ok(n) = value.parse::<u64>() {
            return Ok(MaxUnhealthy::Count(n));
        }
    }
    Err(Refusal::input(
        "maxUnhealthy",
        value,
        "is neither a bare integer nor an integer percentage",
        "write it like 1 or 50%",
    ))
}

/// The installer repository: an OCI repository (`host[:port]/path`), one trailing `/` stripped.
fn installer_repository(value: &str) -> Result<String, Refusal> {
    check_no_control("talos.installerRepository", value)?;
    let repo = value.strip_suffix('/').unwrap_or(value);
    let ok = match repo.split_once('/') {
        Some((host, path)) => {
            Authority::parse(host).is_ok()
                && path.split('/').all(|c| {
                    !c.is_empty()
                        && c.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
                        && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                        && c.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
                })
        }
        None => false,
    };
    if !ok {
        return Err(Refusal::input(
            "talos.installerRepository",
            value,
            "is not an OCI repository (host[:port]/path, lowercase)",
            "use the installer repository of your factory or mirror, e.g. factory.talos.dev/installer",
        ));
    }
    Ok(repo.to_string())
}

fn routing(
    mirrors: &BTreeMap<String, MirrorValues>,
    configs: &BTreeMap<String, RegistryConfigValues>,
) -> Result<Routing, Refusal> {
    let mut out = Routing::default();
    for (host, m) in mirrors {
        let field = format!("talos.registryMirrors.{host:?}");
        let registry = Registry::parse(&field, host)?;
        if m.endpoints.is_empty() {
            return Err(Refusal::input(&field, host, "has no endpoints", "list the mirror URLs under endpoints"));
        }
        let mut endpoints: Vec<Endpoint> = Vec::new();
        for e in &m.endpoints {
            check_no_control(&format!("{field}.endpoints[]"), e)?;
            check_no_credentials(&format!("{field}.endpoints[]"), e)?;
            let url = parse_http_url(e).map_err(|problem| {
                Refusal::input(
                    format!("{field}.endpoints[]"),
                    e,
                    format!("is not a plain http(s) URL: {problem}"),
                    "give the mirror as http(s)://host[:port][/path]",
                )
            })?;
            if endpoints.iter().any(|x| x.url == url) {
                return Err(Refusal::input(
                    format!("{field}.endpoints[]"),
                    e,
                    "is listed twice",
                    "list each endpoint once",
                ));
            }
            endpoints.push(Endpoint { url, override_path: m.override_path });
        }
        out.mirrors.push(Mirror { registry, endpoints, skip_fallback: m.skip_fallback });
    }
    for (host, c) in configs {
        let field = format!("talos.registryConfig.{host:?}");
        let authority = Authority::parse(host).map_err(|problem| {
            Refusal::input(
                &field,
                host,
                format!("is not an endpoint host: {problem}"),
                "key it by the mirror's host[:port]",
            )
        })?;
        let tls = match &c.tls {
            None => None,
            Some(t) => {
                if let Some(ca) = &t.ca {
                    check_pem(&format!("{field}.tls.ca"), ca, "CA certificate")?;
                }
                if let Some(ci) = &t.client_identity {
                    check_pem(&format!("{field}.tls.clientIdentity.crt"), &ci.crt, "certificate")?;
                    check_pem(&format!("{field}.tls.clientIdentity.key"), &ci.key, "private key")?;
                }
                Some(Tls {
                    ca: t.ca.clone(),
                    client: t
                        .client_identity
                        .as_ref()
                        .map(|ci| ClientIdentity { crt: ci.crt.clone(), key: ci.key.clone() }),
                    insecure_skip_verify: t.insecure_skip_verify,
                })
            }
        };
        let auth = match &c.auth {
            None => None,
            Some(a) => {
                for (k, v) in [
                    ("username", &a.username),
                    ("password", &a.password),
                    ("auth", &a.auth),
                    ("identityToken", &a.identity_token),
                ] {
                    if let Some(v) = v {
                        check_secret_text(&format!("{field}.auth.{k}"), v)?;
                    }
                }
                Some(Auth {
                    username: a.username.clone(),
                    password: a.password.clone(),
                    auth: a.auth.clone(),
                    identity_token: a.identity_token.clone(),
                })
            }
        };
        if tls.is_none() && auth.is_none() {
            continue;
        }
        out.configs.insert(authority, EndpointConfig { tls, auth });
    }
    Ok(out)
}
