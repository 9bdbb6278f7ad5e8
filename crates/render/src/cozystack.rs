//! Cozystack as it is: feed its charts the values they already take, and check those values
//! with the seed's rules before they reach a HelmRelease.
//!
//! - [`render`]: the merge patches for a tenant's `Kubernetes` and `KubernetesNodes` resources
//!   (`spec.talos.registryMirrors` -> the mirror; `spec.osImage` on request) and the
//!   `kubernetesWorkerImage` values of the `cozystack.cozystack-platform` Package, in the
//!   charts' own key spellings;
//! - [`check`]: a `Kubernetes` / `KubernetesNodes` resource or values file against every rule
//!   that needs no HelmRelease (R-1..R-8, D-1..D-6, N-1..N-4, A-1, G-7..G-9, U-1).
//!
//! The keys Cozystack's charts define live only in their sources; [`KEYS`] is the committed
//! list (`testdata/reference/cozystack/value-keys.yaml`, origin noted there). Output uses only
//! listed keys; input with a key not on the list is refused, as `render pool` refuses unknown
//! keys.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::catalog::{validate, CatalogConfig, CatalogImage, ConfigFile, DEFAULT_ARCH, DEFAULT_PLATFORM};
use crate::clone::CATALOG_NAMESPACE;
use crate::golden::{render_catalog, DEFAULT_GOLDEN_STORAGE};
use crate::k8s::resolve_disk;
use crate::pool::{defaults, DiskSource, PoolFile};
use crate::registries::Registry;
use crate::rules::{check_no_control, check_no_credentials, is_dns_label, Refusal, Rule};
use crate::state::ClusterState;
use crate::url::parse_http_url;
use crate::Error;

pub const APPS_API_VERSION: &str = "apps.cozystack.io/v1alpha1";
pub const PACKAGE_API_VERSION: &str = "cozystack.io/v1alpha1";
pub const PLATFORM_PACKAGE: &str = "cozystack.cozystack-platform";
/// The package that renders the goldens, enabled through `bundles.enabledPackages` (G-4).
pub const CATALOG_PACKAGE: &str = "cozystack.kubernetes-worker-image";

/// The committed key list: section -> `path: type`.
pub const KEYS: &str = include_str!("cozystack-value-keys.yaml");

/// Which value set a key list section describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chart {
    /// `KubernetesNodes` (`packages/apps/kubernetes-nodes`), plus `osImage`.
    Nodes,
    /// `Kubernetes` (`packages/apps/kubernetes`).
    Kubernetes,
    /// The platform Package's `kubernetesWorkerImage`.
    WorkerImage,
}

impl Chart {
    fn section(self) -> &'static str {
        match self {
            Chart::Nodes => "kubernetes-nodes",
            Chart::Kubernetes => "kubernetes",
            Chart::WorkerImage => "kubernetesWorkerImage",
        }
    }
}

/// The key list, parsed: section -> schema path -> type.
pub fn key_list() -> Result<BTreeMap<String, BTreeMap<String, String>>, Error> {
    serde_norway::from_str(KEYS)
        .map_err(|e| Error::Serialise { what: "the Cozystack key list".into(), message: e.to_string() })
}

/// Walk `value` against the key list: every key must be listed (a map key as `*`, a list
/// item as `[]`); below a free-form key anything goes. Returns the schema path of each key
/// seen, or the first unlisted key as a usage error naming it.
pub fn check_keys(chart: Chart, value: &Value, shown_prefix: &str) -> Result<Vec<String>, Error> {
    let keys = key_list()?;
    let section = keys.get(chart.section()).cloned().unwrap_or_default();
    let mut seen = Vec::new();
    walk_keys(&section, value, "", shown_prefix, &mut seen)?;
    Ok(seen)
}

fn walk_keys(
    section: &BTreeMap<String, String>,
    value: &Value,
    path: &str,
    shown: &str,
    seen: &mut Vec<String>,
) -> Result<(), Error> {
    let join = |a: &str, b: &str| if a.is_empty() { b.to_string() } else { format!("{a}.{b}") };
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let exact = join(path, k);
                let any = join(path, "*");
                let (schema, ty) = match (section.get(&exact), section.get(&any)) {
                    (Some(t), _) => (exact, t),
                    (None, Some(t)) => (any, t),
                    (None, None) => {
                        let mut near: Vec<&str> = section
                            .keys()
                            .filter(|p| p.rsplit_once('.').map_or(path.is_empty(), |(parent, _)| parent == path))
                            .map(|p| p.rsplit('.').next().unwrap_or(p))
                            .collect();
                        near.dedup();
                        // Escaped: a hostile key cannot rewrite the operator's terminal.
                        return Err(Error::Malformed {
                            what: format!("{}{}", shown, join(path, k)).escape_debug().to_string(),
                            message: format!(
                                "is not a key of Cozystack's chart (the committed key list); the keys here are [{}]",
                                near.join(", ")
                            ),
                        });
                    }
                };
                seen.push(schema.clone());
                if !ty.ends_with("(free-form)") {
                    walk_keys(section, v, &schema, shown, seen)?;
                }
            }
        }
        Value::Array(items) => {
            let item = format!("{path}[]");
            if section.contains_key(&item) {
                for v in items {
                    walk_keys(section, v, &item, shown, seen)?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

// ---- render cozystack --------------------------------------------------------------------------

/// Which `osImage` form a pool is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OsImage {
    /// `osImage.builtin`: clone a golden of tender's catalog.
    Builtin,
    /// `osImage.factory`: import over HTTP from the mirror.
    Factory,
}

/// What `tender render cozystack` was asked for.
#[derive(Debug, Clone, Default)]
pub struct RenderRequest {
    pub mirror: String,
    /// The `Kubernetes` application name (`test` for the cluster `kubernetes-test`).
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    /// Pools to patch (`KubernetesNodes` `<cluster>-<pool>`).
    pub pools: Vec<String>,
    pub os_image: Option<OsImage>,
    /// Choose the catalog entry for `osImage` when the catalog has several.
    pub schematic: Option<String>,
    pub version: Option<String>,
}

/// One output document: a merge patch, its file name, and what applying it does.
#[derive(Debug, Clone)]
pub struct Document {
    pub file_name: String,
    /// Comment lines printed above the document (and on standard error).
    pub notes: Vec<String>,
    pub value: Value,
}

#[derive(Debug, Clone, Default)]
pub struct Rendered {
    pub documents: Vec<Document>,
    pub warnings: Vec<String>,
}

impl Rendered {
    /// Multi-document YAML: each document after its notes as `#` comments.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for d in &self.documents {
            out.push_str("---\n");
            for n in &d.notes {
                out.push_str(&format!("# {n}\n"));
            }
            out.push_str(&crate::yaml::to_string(&crate::hash::sorted(&d.value)));
        }
        out
    }
}

/// `line` with its control characters escaped (`\t`, `\u{1b}`): names and values from the
/// input or the cluster state go to the operator's terminal.
fn printable(line: &str) -> std::borrow::Cow<'_, str> {
    if line.chars().any(char::is_control) {
        std::borrow::Cow::Owned(
            line.chars().map(|c| if c.is_control() { c.escape_debug().to_string() } else { c.to_string() }).collect(),
        )
    } else {
        std::borrow::Cow::Borrowed(line)
    }
}

/// A refusal of the input. Its text may quote the input (a YAML reader's message does), so
/// control characters in it are escaped: a hostile file cannot drive the operator's terminal.
fn usage(what: &str, message: impl Into<String>) -> Error {
    let message: String = message.into();
    Error::Malformed { what: printable(what).into_owned(), message: printable(&message).into_owned() }
}

/// The catalog's default-flavor entries (the only ones Cozystack's catalog imports:
/// `openstack-amd64.raw.xz`), with the rest named in `warnings`.
fn cozystack_images(
    config: &ConfigFile,
    warnings: &mut Vec<String>,
) -> Result<Vec<crate::catalog::GoldenImage>, Error> {
    let Some(catalog) = &config.catalog else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for g in validate(catalog)? {
        if g.platform == DEFAULT_PLATFORM && g.arch == DEFAULT_ARCH && g.format == crate::catalog::DEFAULT_FORMAT {
            out.push(g);
        } else {
            warnings.push(format!(
                "catalog entry {} {} ({}) left out of kubernetesWorkerImage: Cozystack's catalog imports only openstack-amd64.raw.xz",
                g.schematic,
                g.version,
                g.file_name()
            ));
        }
    }
    Ok(out)
}

/// Render the patches and values for Cozystack.
pub fn render(config: &ConfigFile, req: &RenderRequest) -> Result<Rendered, Error> {
    check_no_control("--mirror", &req.mirror)?;
    check_no_credentials("--mirror", &req.mirror)?;
    let mirror = parse_http_url(&req.mirror)
        .map_err(|problem| {
            Refusal::input(
                "--mirror",
                &req.mirror,
                format!("is not a plain http(s) URL: {problem}"),
                "give tender's URL as the tenant workers reach it, e.g. http://tender.cozy-tender.svc:5000",
            )
        })?
        .to_string();
    let mut out = Rendered::default();
    let images = cozystack_images(config, &mut out.warnings)?;

    if !req.pools.is_empty() && req.cluster.is_none() {
        return Err(usage("--pool", "patches a KubernetesNodes <cluster>-<pool>: pass --cluster and --namespace too"));
    }
    if req.os_image.is_some() && req.pools.is_empty() {
        return Err(usage("--os-image", "sets osImage on a pool: pass --pool NAME"));
    }

    if let Some(cluster) = &req.cluster {
        let Some(namespace) = &req.namespace else {
            return Err(usage("--cluster", "needs --namespace, the tenant namespace the Kubernetes resource lives in"));
        };
        for (flag, v) in [("--cluster", cluster), ("--namespace", namespace)] {
            if !is_dns_label(v) {
                return Err(Refusal::input(
                    flag,
                    v,
                    "is not a DNS-1123 label",
                    "give the resource's name as kubectl shows it",
                )
                .into());
            }
        }
        let mut mirrors = Map::new();
        for u in &config.upstreams {
            let registry = Registry::parse("upstreams[].name", &u.name.to_ascii_lowercase())?;
            mirrors.insert(registry.talos_name(), json!({"endpoints": [mirror]}));
        }
        if mirrors.is_empty() {
            return Err(usage(
                "--config",
                "has no upstreams, so there is no registry to mirror; list them under upstreams",
            ));
        }
        let talos = json!({"registryMirrors": mirrors});
        let mirror_note = "sets spec.talos.registryMirrors: only the worker Talos config changes; no pool re-images, and only Machines created afterwards use the mirror";
        out.documents.push(Document {
            file_name: format!("kubernetes-{cluster}.yaml"),
            notes: vec![
                format!("kubectl patch kubernetes {cluster} -n {namespace} --type merge --patch-file kubernetes-{cluster}.yaml"),
                mirror_note.into(),
            ],
            value: json!({
                "apiVersion": APPS_API_VERSION,
                "kind": "Kubernetes",
                "metadata": {"name": cluster, "namespace": namespace},
                "spec": {"talos": talos},
            }),
        });
        for pool in &req.pools {
            if !is_dns_label(pool) {
                return Err(
                    Refusal::input("--pool", pool, "is not a DNS-1123 label", "give the pool name, e.g. md1").into()
                );
            }
            let name = format!("{cluster}-{pool}");
            let mut spec = json!({"talos": talos});
            let mut notes = vec![
                format!("kubectl patch kubernetesnodes {name} -n {namespace} --type merge --patch-file kubernetesnodes-{name}.yaml"),
                mirror_note.into(),
            ];
            if let Some(kind) = req.os_image {
                let g = choose(&images, req.schematic.as_deref(), req.version.as_deref(), kind)?;
                let (schematic, version) = match &g {
                    Some(g) => (g.schematic.clone(), g.version.clone()),
                    None => (defaults::SCHEMATIC_ID.to_string(), defaults::TALOS_VERSION.to_string()),
                };
                spec["osImage"] = match kind {
                    OsImage::Builtin => json!({"builtin": {"schematicID": schematic, "version": version}}),
                    OsImage::Factory => {
                        json!({"factory": {"imageFactoryURL": mirror, "schematicID": schematic, "version": version}})
                    }
                };
                let note = format!(
                    "sets spec.osImage: editing osImage re-images pool {pool} (P-6): every worker is replaced, one at a time"
                );
                out.warnings.push(format!("{name}: {note}"));
                notes.push(note);
            }
            out.documents.push(Document {
                file_name: format!("kubernetesnodes-{name}.yaml"),
                notes,
                value: json!({
                    "apiVersion": APPS_API_VERSION,
                    "kind": "KubernetesNodes",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": spec,
                }),
            });
        }
    }

    if !images.is_empty() {
        out.documents.push(Document {
            file_name: "package-cozystack-platform.yaml".into(),
            notes: vec![
                format!("kubectl patch packages.cozystack.io {PLATFORM_PACKAGE} --type merge --patch-file package-cozystack-platform.yaml"),
                format!("the catalog renders only when {CATALOG_PACKAGE} is in spec.components.platform.values.bundles.enabledPackages (a list: add it by hand, a merge patch would replace it)"),
            ],
            value: json!({
                "apiVersion": PACKAGE_API_VERSION,
                "kind": "Package",
                "metadata": {"name": PLATFORM_PACKAGE},
                "spec": {"components": {"platform": {"values": {"kubernetesWorkerImage": worker_image(&mirror, &images)?}}}},
            }),
        });
    }
    if out.documents.is_empty() {
        return Err(usage(
            "render cozystack",
            "has nothing to render: pass --cluster and --namespace for the registry-mirror patches, or list catalog.images in --config",
        ));
    }
    Ok(out)
}

/// The catalog entry an `osImage` names: the only one, or the one `--schematic` / `--version`
/// select. `factory` may fall back to the chart defaults when the catalog is empty.
fn choose(
    images: &[crate::catalog::GoldenImage],
    schematic: Option<&str>,
    version: Option<&str>,
    kind: OsImage,
) -> Result<Option<crate::catalog::GoldenImage>, Error> {
    let matching: Vec<&crate::catalog::GoldenImage> = images
        .iter()
        .filter(|g| schematic.is_none_or(|s| g.schematic == s) && version.is_none_or(|v| g.version == v))
        .collect();
    match matching.as_slice() {
        [one] => Ok(Some((*one).clone())),
        [] if images.is_empty() && kind == OsImage::Factory && schematic.is_none() && version.is_none() => Ok(None),
        [] => Err(usage(
            "--os-image",
            "names no golden of tender's catalog: add the (schematic, version) under catalog.images, or fix --schematic/--version",
        )),
        several => Err(usage(
            "--os-image",
            format!(
                "matches {} catalog entries ({}): choose one with --schematic and --version",
                several.len(),
                several.iter().map(|g| format!("{} {}", g.schematic, g.version)).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// `kubernetesWorkerImage`: one `storageClass` and `storage` for the whole catalog (G-5), so
/// the entries must agree on them.
fn worker_image(mirror: &str, images: &[crate::catalog::GoldenImage]) -> Result<Value, Error> {
    let class =
        |g: &crate::catalog::GoldenImage| g.storage_class.clone().unwrap_or_else(|| defaults::STORAGE_CLASS.into());
    let storage = |g: &crate::catalog::GoldenImage| {
        g.storage.as_ref().map_or_else(|| DEFAULT_GOLDEN_STORAGE.to_string(), |q| q.as_str().to_string())
    };
    let Some(first) = images.first() else {
        return Ok(json!({"imageFactoryURL": mirror, "images": []}));
    };
    let (first_class, first_storage) = (class(first), storage(first));
    for (i, g) in images.iter().enumerate() {
        if class(g) != first_class || storage(g) != first_storage {
            return Err(Refusal::input(
                format!("catalog.images[{i}]"),
                format!("{} {}", g.schematic, g.version),
                format!("has storageClass {:?} / storage {:?}, the first entry {first_class:?} / {first_storage:?}; Cozystack's catalog has one of each for every image", class(g), storage(g)),
                "give every catalog entry the same storageClass and storage",
            )
            .into());
        }
    }
    let list: Vec<Value> = images.iter().map(|g| json!({"schematicID": g.schematic, "version": g.version})).collect();
    Ok(json!({
        "imageFactoryURL": mirror,
        "storageClass": first_class,
        "storage": first_storage,
        "images": list,
    }))
}

// ---- check cozystack ---------------------------------------------------------------------------

/// A pool read from Cozystack's values, with where it came from.
#[derive(Debug)]
pub struct PoolInput {
    /// `<namespace>/<Kind> <name>` and, for a `Kubernetes` resource, the node group.
    pub label: String,
    pub file: PoolFile,
}

/// What `tender check cozystack -f` read: a `Kubernetes` or `KubernetesNodes` resource, or a
/// values file (then `name` / `namespace` come from the flags).
pub fn read_input(text: &str, name: Option<&str>, namespace: Option<&str>) -> Result<Vec<PoolInput>, Error> {
    let doc: Value = serde_norway::from_str(text).map_err(|e| usage("-f", format!("is not YAML: {e}")))?;
    let Value::Object(top) = &doc else {
        return Err(usage("-f", "is not a mapping: give a Kubernetes or KubernetesNodes resource, or its values"));
    };
    let kind = top.get("kind").and_then(Value::as_str);
    let (chart, values, name, namespace, shown) = match kind {
        Some(k @ ("Kubernetes" | "KubernetesNodes")) => {
            let meta = &doc["metadata"];
            let n = meta["name"].as_str().or(name).ok_or_else(|| usage("-f", "has no metadata.name"))?;
            let ns = meta["namespace"].as_str().or(namespace).ok_or_else(|| {
                usage("-f", "has no metadata.namespace: pass --namespace, the tenant namespace it lives in")
            })?;
            let chart = if k == "Kubernetes" { Chart::Kubernetes } else { Chart::Nodes };
            (chart, doc.get("spec").cloned().unwrap_or(json!({})), n.to_string(), ns.to_string(), "spec.")
        }
        Some(other) => {
            return Err(usage(
                "-f",
                format!("is a {other:?}: give a Kubernetes or KubernetesNodes resource, or its values"),
            ))
        }
        None => {
            let chart = if top.contains_key("cluster") || top.contains_key("osImage") {
                Chart::Nodes
            } else {
                Chart::Kubernetes
            };
            let n = name.ok_or_else(|| {
                usage("--name", "is needed for a values file: the Kubernetes (or KubernetesNodes) resource's name")
            })?;
            let ns =
                namespace.ok_or_else(|| usage("--namespace", "is needed for a values file: the tenant namespace"))?;
            (chart, doc.clone(), n.to_string(), ns.to_string(), "")
        }
    };
    check_keys(chart, &values, shown)?;
    match chart {
        Chart::Nodes => nodes_pool(&values, &name, &namespace).map(|p| vec![p]),
        _ => kubernetes_pools(&values, &name, &namespace),
    }
}

/// Read a mapped value into the tender pool file.
fn pool_file(v: Value, label: &str) -> Result<PoolFile, Error> {
    serde_json::from_value(v).map_err(|e| usage(label, format!("a value has the wrong type: {e}")))
}

fn nodes_pool(values: &Value, name: &str, namespace: &str) -> Result<PoolInput, Error> {
    let cluster = values["cluster"].as_str().unwrap_or_default();
    if cluster.is_empty() {
        return Err(usage("cluster", "is empty; the chart refuses to render a pool without its parent cluster"));
    }
    let Some(pool) = name.strip_prefix(&format!("{cluster}-")).filter(|p| !p.is_empty()) else {
        return Err(usage(
            "metadata.name",
            format!("{name:?} is not <cluster>-<pool> for cluster {cluster:?}; the chart refuses the release"),
        ));
    };
    let mut v = values.clone();
    if let Value::Object(m) = &mut v {
        // Not rendered by tender and under no seed rule: read, listed, not checked here.
        for k in ["podCpuLimit", "podCpuRequest", "kubelet", "images", "cluster"] {
            m.remove(k);
        }
        m.insert("cluster".into(), json!(format!("kubernetes-{cluster}")));
        m.insert("namespace".into(), json!(namespace));
        m.insert("pool".into(), json!(pool));
    }
    let label = format!("{namespace}/KubernetesNodes {name}");
    Ok(PoolInput { file: pool_file(v, &label)?, label })
}

fn kubernetes_pools(values: &Value, name: &str, namespace: &str) -> Result<Vec<PoolInput>, Error> {
    let groups = match values.get("nodeGroups") {
        Some(Value::Object(m)) if !m.is_empty() => m.clone(),
        // The chart's default group when nodeGroups is empty (spec §1.1).
        _ => {
            let mut m = Map::new();
            m.insert(
                "md0".into(),
                json!({"minReplicas": 0, "maxReplicas": 10, "instanceType": "u1.medium", "diskSize": "20Gi", "storageClass": "", "roles": ["ingress-nginx"]}),
            );
            m
        }
    };
    let health = values.get("nodeHealthCheck").cloned().unwrap_or(json!({}));
    let mut out = Vec::new();
    for (group, g) in groups {
        let mut v = Map::new();
        v.insert("cluster".into(), json!(format!("kubernetes-{name}")));
        v.insert("namespace".into(), json!(namespace));
        v.insert("pool".into(), json!(group));
        for k in
            ["diskSize", "instanceType", "minReplicas", "maxReplicas", "roles", "resources", "gpus", "logSerialConsole"]
        {
            if let Some(x) = g.get(k) {
                v.insert(k.into(), x.clone());
            }
        }
        // The group's class, else the app's (spec §1.3): an empty one is omitted on the HTTP path.
        let class = g
            .get("storageClass")
            .and_then(Value::as_str)
            .filter(|c| !c.is_empty())
            .or(values.get("storageClass").and_then(Value::as_str));
        if let Some(c) = class {
            v.insert("storageClass".into(), json!(c));
        }
        for (k, from_group) in [
            ("maxUnhealthy", true),
            ("nodeStartupTimeout", true),
            ("readyUnknownTimeout", false),
            ("readyFalseTimeout", false),
        ] {
            let x = if from_group { g.get(k).cloned() } else { None }.or_else(|| health.get(k).cloned());
            if let Some(x) = x {
                v.insert(k.into(), x);
            }
        }
        for k in ["version", "talos", "maxNodeProvisionTime"] {
            if let Some(x) = values.get(k) {
                v.insert(k.into(), x.clone());
            }
        }
        let label = format!("{namespace}/Kubernetes {name} nodeGroups.{group}");
        out.push(PoolInput { file: pool_file(Value::Object(v), &label)?, label });
    }
    Ok(out)
}

/// One refusal, as CI reads it.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub pool: String,
    /// The rules it breaks (`R-7`, and `U-1` when the upgrade would fail on it); empty for a
    /// shape tender needs that no seed rule names.
    pub rules: Vec<String>,
    pub field: String,
    pub value: String,
    pub problem: String,
    pub fix: String,
}

/// A pool that passed, with what the checks resolved.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolReport {
    pub pool: String,
    /// `factory` (HTTP import) or `builtin` (CSI clone).
    pub source: String,
    pub golden: Option<String>,
    /// The worker disk's class; empty: omitted, the cluster default applies (D-6).
    pub storage_class: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub ok: bool,
    pub findings: Vec<Finding>,
    pub pools: Vec<PoolReport>,
    pub catalog: Option<String>,
}

impl Report {
    pub fn text(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let rules = if f.rules.is_empty() { String::new() } else { format!("{}: ", f.rules.join(", ")) };
            let shown: String = f.value.chars().take(120).collect();
            let line = format!("{}: {rules}{} {shown:?} {}; fix: {}", f.pool, f.field, f.problem, f.fix);
            out.push_str(&printable(&line));
            out.push('\n');
        }
        for p in &self.pools {
            let class = if p.storage_class.is_empty() {
                "the cluster default (omitted)".to_string()
            } else {
                p.storage_class.clone()
            };
            let golden = p.golden.as_ref().map(|g| format!(" cloning {g}")).unwrap_or_default();
            out.push_str(&printable(&format!("ok: {}: {}{golden}, storageClass {class}", p.pool, p.source)));
            out.push('\n');
        }
        if let Some(c) = &self.catalog {
            out.push_str(&printable(&format!("ok: {c}")));
            out.push('\n');
        }
        out
    }
}

fn finding(pool: &str, r: &Refusal) -> Finding {
    let mut rules: Vec<String> = r.rule.map(|x| x.to_string()).into_iter().collect();
    let mut problem = r.problem.clone();
    // U-1: the three values that hard-fail at the platform upgrade, not at the pool's next edit.
    let upgrade = matches!(r.rule, Some(Rule::R6 | Rule::R7 | Rule::R8) if r.field.starts_with("talos."));
    if upgrade {
        rules.push("U-1".into());
        problem.push_str("; this value fails the HelmRelease at the platform upgrade (InstallFailed), and every later edit is then taken everywhere and applied nowhere (U-2)");
    }
    Finding {
        pool: pool.to_string(),
        rules,
        field: r.field.clone(),
        value: r.value.clone(),
        problem,
        fix: r.fix.clone(),
    }
}

/// The `kubernetesWorkerImage` values from a values file, the values themselves, or the
/// platform Package.
pub fn read_catalog_values(text: &str) -> Result<Value, Error> {
    let doc: Value =
        serde_norway::from_str(text).map_err(|e| usage("--catalog-values", format!("is not YAML: {e}")))?;
    let values = if doc.get("kind").and_then(Value::as_str) == Some("Package") {
        doc["spec"]["components"]["platform"]["values"]["kubernetesWorkerImage"].clone()
    } else if let Some(v) = doc.get("kubernetesWorkerImage") {
        v.clone()
    } else {
        doc
    };
    if !values.is_object() {
        return Err(usage("--catalog-values", "has no kubernetesWorkerImage values"));
    }
    check_keys(Chart::WorkerImage, &values, "kubernetesWorkerImage.")?;
    Ok(values)
}

/// Check pools (and the catalog values) against the rules; `Err` only for what is a usage
/// error (exit 2): incomplete state, malformed input.
pub fn check(pools: &[PoolInput], catalog: Option<&Value>, state: &ClusterState) -> Result<Report, Error> {
    let mut report = Report::default();
    for p in pools {
        let pool = match p.file.validate() {
            Ok(pool) => pool,
            Err(r) => {
                report.findings.push(finding(&p.label, &r));
                continue;
            }
        };
        let mut warnings = Vec::new();
        match resolve_disk(&pool, Some(state), false, &mut warnings) {
            Ok(disk) => report.pools.push(PoolReport {
                pool: p.label.clone(),
                source: if matches!(disk.source, DiskSource::Builtin { .. }) { "builtin" } else { "factory" }.into(),
                golden: match &disk.source {
                    DiskSource::Builtin { golden } => Some(format!("{CATALOG_NAMESPACE}/{golden}")),
                    DiskSource::Factory { .. } => None,
                },
                storage_class: disk.storage_class,
            }),
            Err(Error::Refused(r)) => report.findings.push(finding(&p.label, &r)),
            Err(e) => return Err(e),
        }
    }
    if let Some(values) = catalog {
        let images: Vec<CatalogImage> = values["images"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| CatalogImage {
                        schematic: e["schematicID"].as_str().unwrap_or_default().to_string(),
                        version: e["version"].as_str().unwrap_or_default().to_string(),
                        platform: None,
                        arch: None,
                        format: None,
                        dir: None,
                        storage_class: values["storageClass"].as_str().map(str::to_string),
                        storage: match &values["storage"] {
                            Value::String(s) => Some(crate::quantity::IntOrString(s.clone())),
                            Value::Number(n) => Some(crate::quantity::IntOrString(n.to_string())),
                            _ => None,
                        },
                    })
                    .collect()
            })
            .unwrap_or_default();
        let config = ConfigFile {
            image_factory: values["imageFactoryURL"].as_str().map(str::to_string),
            catalog: Some(CatalogConfig { dir: None, images }),
            upstreams: Vec::new(),
        };
        match render_catalog(&config, None, Some(state)) {
            Ok(_) => report.catalog = Some("kubernetesWorkerImage: the catalog passes G-7, G-8 and G-9".into()),
            Err(Error::Refused(r)) => {
                let r = Refusal {
                    field: r
                        .field
                        .replacen("catalog.", "kubernetesWorkerImage.", 1)
                        .replace(".schematic", ".schematicID"),
                    ..r
                };
                report.findings.push(finding("kubernetesWorkerImage", &r));
            }
            Err(e) => return Err(e),
        }
    }
    report.ok = report.findings.is_empty();
    Ok(report)
}
