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
use crate::target::{
    has_key, Target, IMAGE_FACTORY_URL, INSTALLER_REPOSITORY, OS_IMAGE_BUILTIN, OS_IMAGE_FACTORY, REGISTRY_MIRRORS,
};
use crate::url::parse_http_url;
use crate::verification::ImageVerification;
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
                if let Some(expected) = kind_mismatch(ty, v) {
                    return Err(Error::Malformed {
                        what: format!("{}{}", shown, join(path, k)).escape_debug().to_string(),
                        message: format!("is {}; Cozystack's chart takes {expected} here", kind_of(v)),
                    });
                }
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

/// The kind of a YAML value, as an operator reads it.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "empty (null)",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// The kind a key list type takes, when `v` is not of it. A null passes: the chart's default
/// applies.
fn kind_mismatch(ty: &str, v: &Value) -> Option<&'static str> {
    let ok = |expected: &'static str, ok: bool| if ok { None } else { Some(expected) };
    match (ty.split_whitespace().next().unwrap_or(ty), v) {
        (_, Value::Null) => None,
        ("string", v) => ok("a string", v.is_string()),
        ("integer", v) => ok("an integer", v.is_i64() || v.is_u64()),
        ("int-or-string", v) => ok("an integer or a string (e.g. 2 or 20Gi)", v.is_number() || v.is_string()),
        ("boolean", v) => ok("a boolean (true or false)", v.is_boolean()),
        ("object", v) => ok("a mapping", v.is_object()),
        ("array", v) => ok("a list", v.is_array()),
        _ => None,
    }
}

// ---- render cozystack --------------------------------------------------------------------------

/// Which `osImage` form a pool is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OsImage {
    /// `osImage.builtin`: clone a golden of tender's catalog.
    Builtin,
    /// The disk imported over HTTP from the mirror: `talos.imageFactoryURL`, or
    /// `osImage.factory` where the target has it.
    Factory,
}

/// What `tender render cozystack` was asked for.
#[derive(Debug, Clone, Default)]
pub struct RenderRequest {
    pub mirror: String,
    /// Registry mirrors tried after `mirror`, in order (`--mirror` repeated: the rack's tender
    /// first, then its parent). The disk and the installer come from `mirror`.
    pub more_mirrors: Vec<String>,
    /// The `Kubernetes` application name (`test` for the cluster `kubernetes-test`).
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    /// Pools to patch (`KubernetesNodes` `<cluster>-<pool>`).
    pub pools: Vec<String>,
    pub os_image: Option<OsImage>,
    /// Choose the catalog entry for `osImage` when the catalog has several.
    pub schematic: Option<String>,
    pub version: Option<String>,
    /// The Cozystack the patches are for; `None`: [`crate::target::DEFAULT_VERSION`].
    pub target: Option<Target>,
    /// The cluster, to find goldens the Package patch would re-point (item 2 of issue 33).
    pub state: Option<ClusterState>,
    /// How the suggested commands name tender's config (`--config`); `tender.yaml` when unset.
    pub config_name: Option<String>,
}

/// One output document: a merge patch, its file name, and what applying it does.
#[derive(Debug, Clone)]
pub struct Document {
    pub file_name: String,
    /// Comment lines printed above the document (and on standard error).
    pub notes: Vec<String>,
    pub value: Value,
}

/// A capability the target cannot express: what, on which resource, the key it lacks, and
/// the way to get it anyway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unexpressed {
    pub resource: String,
    pub what: String,
    pub key: String,
    pub alternative: String,
}

impl std::fmt::Display for Unexpressed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({}); alternative: {}", self.resource, self.what, self.key, self.alternative)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Rendered {
    pub documents: Vec<Document>,
    pub warnings: Vec<String>,
    /// What the target cannot express; the documents hold everything else.
    pub unexpressed: Vec<Unexpressed>,
    /// The target's name, for messages.
    pub target: String,
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

/// The Image Factory's registry: the installer `factory.talos.dev/installer/<schematic>:<v>`.
pub const FACTORY_REGISTRY: &str = "factory.talos.dev";

/// Helm's limit on a release name; Cozystack's releases are `kubernetes-<name>` and
/// `kubernetes-nodes-<cluster>-<pool>`.
pub const HELM_RELEASE_MAX: usize = 53;

/// A DNS-1035 label: lowercase letters, digits and `-`, a letter first, at most 63 characters.
/// Cozystack's API takes an application name only in this form.
pub fn is_dns_1035_label(s: &str) -> bool {
    is_dns_label(s) && s.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
}

/// A resource name the API and the chart take: a DNS-1035 label whose release name
/// (`<prefix><name>`) fits Helm's 53 characters.
fn check_app_name(flag: &str, value: &str, prefix: &str, fix: &str) -> Result<(), Error> {
    if !is_dns_1035_label(value) {
        return Err(Refusal::input(
            flag,
            value,
            "is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter and ending with a letter or digit, at most 63 characters); Cozystack's API refuses the name",
            fix,
        )
        .into());
    }
    let release = format!("{prefix}{value}");
    if release.len() > HELM_RELEASE_MAX {
        return Err(Refusal::input(
            flag,
            value,
            format!(
                "makes the Helm release name {release} {} characters long; Helm allows at most {HELM_RELEASE_MAX}",
                release.len()
            ),
            fix,
        )
        .into());
    }
    Ok(())
}

/// Validate `--mirror` as the config validates a URL: a plain http(s) URL (an IPv6 host in
/// brackets), without credentials, and, for Cozystack, without a path: it is tender's root,
/// the base of every registry endpoint and of the disk URL (`<mirror>/image/...`).
fn check_mirror(mirror: &str) -> Result<crate::url::HttpUrl, Error> {
    check_no_control("--mirror", mirror)?;
    check_no_credentials("--mirror", mirror)?;
    let fix = "give tender's URL as the tenant workers reach it, e.g. http://tender.cozy-tender.svc:5000";
    let url = parse_http_url(mirror)
        .map_err(|problem| Refusal::input("--mirror", mirror, format!("is not a plain http(s) URL: {problem}"), fix))?;
    if !url.path.is_empty() {
        return Err(Refusal::input(
            "--mirror",
            mirror,
            format!("has a path ({}); tender serves registries under /v2/ and disks under /image/ of its root, and the chart appends those to this URL", url.path),
            fix,
        )
        .into());
    }
    Ok(url)
}

/// The `talos` keys and the disk keys of one resource, as far as its chart's schema takes them.
struct Capabilities<'a> {
    schema: &'a Value,
    /// tender's signature policy: the registries it refuses images of do not fall back.
    policy: Option<&'a ImageVerification>,
    /// How a suggested `tender render registries` names tender's config.
    config_name: &'a str,
    resource: String,
    unexpressed: &'a mut Vec<Unexpressed>,
    warnings: &'a mut Vec<String>,
}

impl Capabilities<'_> {
    fn has(&self, path: &[&str]) -> bool {
        has_key(self.schema, path)
    }

    fn cannot(&mut self, what: impl Into<String>, key: &[&str], alternative: impl Into<String>) {
        self.unexpressed.push(Unexpressed {
            resource: self.resource.clone(),
            what: what.into(),
            key: format!("{} is not in its values schema", key.join(".")),
            alternative: alternative.into(),
        });
    }

    /// Registry mirrors, and the installer through tender: `spec.talos` of the patch.
    fn talos(
        &mut self,
        config: &ConfigFile,
        mirror: &crate::url::HttpUrl,
        more: &[crate::url::HttpUrl],
    ) -> Result<Map<String, Value>, Error> {
        let endpoints: Vec<String> = std::iter::once(mirror).chain(more).map(ToString::to_string).collect();
        // As `tender render registries` takes them: every mirror, in order.
        let shown = endpoints.join(" --mirror ");
        let mut mirrors = Map::new();
        let named = upstream_registries(config)?;
        for registry in &named {
            let mut entry = json!({ "endpoints": endpoints });
            // Issue 34: a worker that fell back would pull what tender refuses from the registry.
            if self.policy.is_some_and(|p| p.fallback_reason(registry, &named).is_some()) {
                entry["skipFallback"] = json!(true);
            }
            mirrors.insert(registry.talos_name(), entry);
        }
        let serves_factory = mirrors.contains_key(FACTORY_REGISTRY);
        let mut talos = Map::new();
        if self.has(REGISTRY_MIRRORS) {
            // The installer (factory.talos.dev/installer/<schematic>:<version>) comes through
            // the factory.talos.dev mirror entry: containerd asks the mirror over its own
            // scheme, so a plain-HTTP tender works, and falls back to the factory.
            if !serves_factory {
                self.warnings.push(format!(
                    "{}: the installer ({FACTORY_REGISTRY}/installer) does not come through tender: tender's config has no {FACTORY_REGISTRY} upstream; add it under upstreams",
                    self.resource
                ));
            }
            talos.insert("registryMirrors".into(), Value::Object(mirrors));
        } else {
            let hosts: Vec<&String> = mirrors.keys().filter(|h| h.as_str() != FACTORY_REGISTRY).collect();
            if !hosts.is_empty() {
                let mut flags: String = hosts.iter().map(|h| format!(" --registry {h}")).collect();
                if self.policy.is_some_and(|p| !p.is_empty()) {
                    flags.push_str(&format!(" --config {}", self.config_name));
                }
                self.cannot(
                    format!("container images through tender (registry mirrors for {})", hosts.iter().map(|h| h.as_str()).collect::<Vec<_>>().join(", ")),
                    REGISTRY_MIRRORS,
                    format!("a Talos machine-config patch for the workers (`tender render registries --mirror {shown}{flags}`, applied with talosctl patch mc or Cozystack's talos patches), or a Cozystack whose charts have talos.registryMirrors (main, --cozystack main)"),
                );
            }
            // Only installerRepository is left: containerd pulls a non-localhost registry over
            // HTTPS unless a mirror or registry config says otherwise, and the chart can say
            // neither, so it moves only to a tender that speaks HTTPS.
            if !self.has(INSTALLER_REPOSITORY) {
                self.cannot(
                    "the installer through tender",
                    INSTALLER_REPOSITORY,
                    "a Talos machine-config patch setting machine.install.image",
                );
            } else if !mirror.https {
                self.cannot(
                    format!("the installer through tender: talos.installerRepository would name {}, and the workers pull it over HTTPS while tender at {mirror} speaks plain HTTP", mirror.authority),
                    INSTALLER_REPOSITORY,
                    format!("serve tender over HTTPS with a certificate the workers trust and render again, or a Talos machine-config patch routing {FACTORY_REGISTRY} through tender (`tender render registries --mirror {shown} --registry {FACTORY_REGISTRY}`)"),
                );
            } else {
                if !serves_factory {
                    self.warnings.push(format!(
                        "{}: talos.installerRepository points at tender, whose config has no {FACTORY_REGISTRY} upstream: add it under upstreams, or the installer pull fails",
                        self.resource
                    ));
                }
                talos.insert(
                    "installerRepository".into(),
                    json!(format!("{}/{FACTORY_REGISTRY}/installer", mirror.authority)),
                );
            }
        }
        Ok(talos)
    }
}

/// The notes of a patch that changes the worker Talos config only.
const CONFIG_NOTE: &str = "its registry keys change only the worker Talos config (the TalosConfigTemplate the reconcile Job applies): they re-image no worker, and only Machines created afterwards use them";

/// Render the patches and values for Cozystack.
pub fn render(config: &ConfigFile, req: &RenderRequest) -> Result<Rendered, Error> {
    let url = check_mirror(&req.mirror)?;
    let mirror = url.to_string();
    let mut more = Vec::new();
    for m in &req.more_mirrors {
        let u = check_mirror(m)?;
        crate::registries::check_new_mirror(m, &u, std::iter::once(&url).chain(&more))?;
        more.push(u);
    }
    let target = match &req.target {
        Some(t) => t.clone(),
        None => Target::embedded(crate::target::DEFAULT_VERSION)?,
    };
    let mut out = Rendered { target: target.name.clone(), ..Rendered::default() };
    let images = cozystack_images(config, &mut out.warnings)?;
    let policy = config.image_verification.clone().map(ImageVerification::new).transpose()?;
    let config_name = req.config_name.as_deref().unwrap_or("tender.yaml");

    if !req.pools.is_empty() && req.cluster.is_none() {
        return Err(usage("--pool", "patches a KubernetesNodes <cluster>-<pool>: pass --cluster and --namespace too"));
    }
    if req.os_image.is_some() && req.cluster.is_none() {
        return Err(usage("--os-image", "sets the worker disk of a cluster's node groups or pools: pass --cluster and --namespace (and --pool NAME)"));
    }

    if let Some(cluster) = &req.cluster {
        let Some(namespace) = &req.namespace else {
            return Err(usage("--cluster", "needs --namespace, the tenant namespace the Kubernetes resource lives in"));
        };
        check_app_name("--cluster", cluster, "kubernetes-", "give the Kubernetes resource's name as kubectl shows it")?;
        if !is_dns_label(namespace) {
            return Err(Refusal::input(
                "--namespace",
                namespace,
                "is not a DNS-1123 label",
                "give the tenant namespace as kubectl shows it",
            )
            .into());
        }
        for pool in &req.pools {
            check_app_name(
                "--pool",
                &format!("{cluster}-{pool}"),
                "kubernetes-nodes-",
                "give the pool name (the KubernetesNodes resource is <cluster>-<pool>), e.g. md1",
            )
            .map_err(|e| match e {
                Error::Refused(r) => Error::Refused(Refusal {
                    value: pool.clone(),
                    problem: format!(
                        "gives the KubernetesNodes name {cluster}-{pool}, which {}",
                        r.problem.trim_start_matches("is ")
                    ),
                    ..r
                }),
                other => other,
            })?;
        }
        if config.upstreams.is_empty() {
            return Err(usage(
                "--config",
                "has no upstreams, so there is no registry to mirror; list them under upstreams",
            ));
        }
        // The disk goes on the pools named, else on the Kubernetes app's own node groups.
        let app_disk = req.pools.is_empty();
        let resource = format!("Kubernetes {namespace}/{cluster}");
        let mut caps = Capabilities {
            schema: &target.kubernetes,
            policy: policy.as_ref(),
            config_name,
            resource,
            unexpressed: &mut out.unexpressed,
            warnings: &mut out.warnings,
        };
        let mut spec = json!({"talos": caps.talos(config, &url, &more)?});
        let mut disk_note = None;
        if let (true, Some(kind)) = (app_disk, req.os_image) {
            disk_note = disk(&mut caps, &mut spec, kind, &mirror, &images, req, "every node group of this cluster")?;
        }
        let kubectl = format!(
            "kubectl patch kubernetes {cluster} -n {namespace} --type merge --patch-file kubernetes-{cluster}.yaml"
        );
        push_patch(&mut out.documents, ("Kubernetes", "kubernetes"), cluster, namespace, spec, kubectl, disk_note);
        for pool in &req.pools {
            let name = format!("{cluster}-{pool}");
            let resource = format!("KubernetesNodes {namespace}/{name}");
            let mut caps = Capabilities {
                schema: &target.nodes,
                policy: policy.as_ref(),
                config_name,
                resource,
                unexpressed: &mut out.unexpressed,
                warnings: &mut out.warnings,
            };
            let mut spec = json!({"talos": caps.talos(config, &url, &more)?});
            let mut disk_note = None;
            if let Some(kind) = req.os_image {
                disk_note = disk(&mut caps, &mut spec, kind, &mirror, &images, req, &format!("pool {pool}"))?;
            }
            let kubectl = format!("kubectl patch kubernetesnodes {name} -n {namespace} --type merge --patch-file kubernetesnodes-{name}.yaml");
            push_patch(
                &mut out.documents,
                ("KubernetesNodes", "kubernetesnodes"),
                &name,
                namespace,
                spec,
                kubectl,
                disk_note,
            );
        }
    }

    if let Some(policy) = policy.as_ref().filter(|p| !p.is_empty()) {
        policy_notes(config, policy, &out.documents, &mut out.warnings)?;
    }

    if !images.is_empty() {
        if target.worker_image_catalog {
            check_package_goldens(&mirror, &images, req.state.as_ref(), &mut out.warnings)?;
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
        } else {
            out.warnings.push(format!(
                "the catalog of tender's config is not written: {} has no worker-image catalog (kubernetesWorkerImage of {PLATFORM_PACKAGE}); it is for --cozystack golden-catalog",
                target.name
            ));
        }
    }
    if out.documents.is_empty() && out.unexpressed.is_empty() {
        return Err(usage(
            "render cozystack",
            "has nothing to render: pass --cluster and --namespace for the registry-mirror patches, or list catalog.images in --config (for --cozystack golden-catalog)",
        ));
    }
    Ok(out)
}

/// The registries of a patch's `talos.registryMirrors` that do not fall back, sorted.
fn skipped_fallbacks(talos: &Map<String, Value>) -> Vec<String> {
    let mut out: Vec<String> = talos
        .get("registryMirrors")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(_, e)| e.get("skipFallback") == Some(&Value::Bool(true)))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Issue 34: say which registries lost their fallback and why, and that the workers do not
/// check signatures themselves (no chart takes a Talos `ImageVerificationConfig`).
fn policy_notes(
    config: &ConfigFile,
    policy: &ImageVerification,
    documents: &[Document],
    warnings: &mut Vec<String>,
) -> Result<(), Error> {
    let mirrored = documents.iter().any(|d| d.value.pointer("/spec/talos/registryMirrors").is_some());
    if !mirrored {
        return Ok(());
    }
    let named = upstream_registries(config)?;
    for registry in &named {
        if let Some(why) = policy.fallback_reason(registry, &named) {
            warnings.push(format!(
                "{registry}: skipFallback: {why}, and a worker that fell back would pull what tender refuses straight from the registry"
            ));
        }
    }
    warnings.push(
        "the workers do not check signatures themselves: Cozystack's charts take no Talos ImageVerificationConfig (tender verifies, and skipFallback keeps the workers from pulling around it); for a machine config you manage, `tender render registries --config` writes that document (Talos 1.13 and later)".into(),
    );
    Ok(())
}

/// One merge patch, unless the target took nothing for this resource.
fn push_patch(
    docs: &mut Vec<Document>,
    (kind, file): (&str, &str),
    name: &str,
    namespace: &str,
    mut spec: Value,
    kubectl: String,
    disk_note: Option<String>,
) {
    let mut notes = vec![kubectl];
    if let Some(m) = spec.as_object_mut() {
        if m.get("talos").and_then(Value::as_object).is_some_and(|t| {
            let config_only = t.keys().any(|k| k == "registryMirrors" || k == "installerRepository");
            if config_only {
                notes.push(format!("talos: {CONFIG_NOTE}"));
            }
            let skipped = skipped_fallbacks(t);
            if !skipped.is_empty() {
                notes.push(format!(
                    "talos.registryMirrors: skipFallback on {}: tender's imageVerification refuses images of theirs that do not verify, and a worker that fell back would pull those straight from the registry",
                    skipped.join(", ")
                ));
            }
            t.is_empty()
        }) {
            m.remove("talos");
        }
        if m.is_empty() {
            return;
        }
    }
    notes.extend(disk_note);
    docs.push(Document {
        file_name: format!("{file}-{name}.yaml"),
        notes,
        value: json!({
            "apiVersion": APPS_API_VERSION,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }),
    });
}

/// The worker disk through tender, with the key the target has: `osImage.<kind>` where the
/// chart has it (the golden-catalog design), else `talos.imageFactoryURL` for an HTTP import.
/// Returns the re-image note when a disk key was written, and only then.
fn disk(
    caps: &mut Capabilities<'_>,
    spec: &mut Value,
    kind: OsImage,
    mirror: &str,
    images: &[crate::catalog::GoldenImage],
    req: &RenderRequest,
    whom: &str,
) -> Result<Option<String>, Error> {
    let os_key = match kind {
        OsImage::Builtin => OS_IMAGE_BUILTIN,
        OsImage::Factory => OS_IMAGE_FACTORY,
    };
    let what = if caps.has(os_key) {
        let g = choose(images, req.schematic.as_deref(), req.version.as_deref(), kind)?;
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
        "spec.osImage: editing osImage"
    } else if kind == OsImage::Factory && caps.has(IMAGE_FACTORY_URL) {
        // tender's /image/ is Image Factory-compatible: the chart's DataVolume imports
        // <imageFactoryURL>/image/<schematicID>/<version>/openstack-amd64.raw.xz.
        spec["talos"]["imageFactoryURL"] = json!(mirror);
        "spec.talos.imageFactoryURL: a new disk URL"
    } else {
        match kind {
            OsImage::Builtin => caps.cannot(
                "the worker disk cloned from a golden of tender's catalog (osImage.builtin)",
                OS_IMAGE_BUILTIN,
                "--os-image factory (the disk streamed from tender through talos.imageFactoryURL), or a Cozystack with the worker-image catalog (--cozystack golden-catalog)",
            ),
            OsImage::Factory => caps.cannot("the worker disk from tender", IMAGE_FACTORY_URL, "edit the DataVolume source of the chart's KubevirtMachineTemplate"),
        }
        return Ok(None);
    };
    let note = format!("sets {what} re-images {whom} (P-6): every worker is replaced, one at a time");
    caps.warnings.push(format!("{}: {note}", caps.resource));
    Ok(Some(note))
}

/// Issue 33, item 2: the Package points `imageFactoryURL` at tender, and Cozystack's catalog
/// chart renders every golden from it; a golden that already exists with another source URL
/// makes that render refuse (G-9), and every later edit of the Package with it. With the
/// cluster state, refuse and spell out the safe sequence; without, warn.
fn check_package_goldens(
    mirror: &str,
    images: &[crate::catalog::GoldenImage],
    state: Option<&ClusterState>,
    warnings: &mut Vec<String>,
) -> Result<(), Error> {
    let Some(state) = state else {
        warnings.push(format!(
            "the Package patch re-points every golden of the catalog at {mirror}: a golden that already exists with another source URL makes Cozystack's catalog render refuse it (G-9); pass --cluster-state to find them"
        ));
        return Ok(());
    };
    let prefix = format!("{mirror}/image/");
    let mut stale = Vec::new();
    for g in images {
        let name = g.name();
        if let Some(dv) = state.data_volume(CATALOG_NAMESPACE, &name) {
            match &dv.http_url {
                Some(u) if u.starts_with(&prefix) => {}
                other => stale.push(format!(
                    "{CATALOG_NAMESPACE}/{name} (from {})",
                    other.as_deref().unwrap_or("no HTTP source")
                )),
            }
        }
    }
    if stale.is_empty() {
        return Ok(());
    }
    Err(Refusal::new(
        Some(Rule::G9),
        "kubernetesWorkerImage.imageFactoryURL",
        mirror,
        format!(
            "would re-point goldens that already exist with another source URL: {}; Cozystack's catalog render refuses that (G-9), and the Package stays failed until it is undone",
            stale.join(", ")
        ),
        format!(
            "move the catalog in steps: (1) leave the Package's imageFactoryURL as it is; (2) move each pool that clones one of these goldens off it: `tender render cozystack --cozystack golden-catalog --os-image factory --mirror {mirror} --cluster C --namespace NS --pool P` (the pool re-images once, from tender); (3) retire the old goldens when `tender check cozystack` shows no pool cloning them: drop their images from kubernetesWorkerImage.images and `kubectl -n {CATALOG_NAMESPACE} delete datavolume NAME` (they carry helm.sh/resource-policy: keep); (4) apply this Package patch: the new goldens import from tender beside any others; (5) move the pools onto the new goldens with --os-image builtin, then run this command again with --cluster-state"
        ),
    )
    .into())
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
    let v = read_values(text, name, namespace)?;
    check_keys(v.chart, &v.values, v.shown)?;
    match v.chart {
        Chart::Nodes => nodes_pool(&v.values, &v.name, &v.namespace).map(|p| vec![p]),
        _ => kubernetes_pools(&v.values, &v.name, &v.namespace),
    }
}

/// A check input's values, and which chart and resource they are for.
struct Values {
    chart: Chart,
    values: Value,
    name: String,
    namespace: String,
    /// How keys are shown: `spec.` for a resource, nothing for a values file.
    shown: &'static str,
}

impl Values {
    fn label(&self) -> String {
        match self.chart {
            Chart::Nodes => format!("{}/KubernetesNodes {}", self.namespace, self.name),
            _ => format!("{}/Kubernetes {}", self.namespace, self.name),
        }
    }
}

fn read_values(text: &str, name: Option<&str>, namespace: Option<&str>) -> Result<Values, Error> {
    // As kubectl sends it and Helm reads it: YAML 1.1 as go-yaml v2 has it (`yes` is true).
    let doc: Value = crate::kubectl_yaml::from_str(text)
        .map_err(|e| usage("-f", format!("is not YAML as kubectl reads it: {}", crate::yaml::humane(&e))))?;
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
    Ok(Values { chart, values, name, namespace, shown })
}

/// A field as findings show it: the path under `shown`, printable; a key that is the empty
/// string is shown as `""`, so every finding names a field.
fn field_name(shown: &str, path: &str) -> String {
    let f = printable(&format!("{shown}{path}")).into_owned();
    if f.is_empty() {
        "\"\"".to_string()
    } else {
        f
    }
}

/// Issue 33: the input against the target's values schema, as Helm checks it (types, patterns,
/// enums; `required` is left to the chart's defaults), and every key the target's chart does not
/// declare, which Helm would take without a word and nothing would read.
pub fn schema_findings(
    text: &str,
    name: Option<&str>,
    namespace: Option<&str>,
    target: &Target,
) -> Result<SchemaFindings, Error> {
    let v = read_values(text, name, namespace)?;
    let schema = target.schema(v.chart == Chart::Nodes);
    let label = v.label();
    let mut findings = Vec::new();
    // As Helm validates: the chart's defaults under the values (a null removes a key), then the
    // schema, `required` included where no default can fill it (a list item, a new node group).
    let merged = crate::chart_fails::helm_merged(schema, &v.values);
    let checked = required_where_no_defaults(schema);
    let validator = jsonschema::draft7::new(&checked).map_err(|e| Error::Malformed {
        what: format!("the values schema of {}", target.name),
        message: e.to_string(),
    })?;
    for e in validator.iter_errors(&merged) {
        let path: Vec<String> = e
            .instance_path()
            .to_string()
            .split('/')
            .skip(1)
            .map(|seg| seg.replace("~1", "/").replace("~0", "~"))
            .collect();
        let field = format!("{}{}", v.shown, path.join("."));
        let value = merged.pointer(&e.instance_path().to_string()).map(Value::to_string).unwrap_or_default();
        findings.push(Finding {
            pool: label.clone(),
            rules: Vec::new(),
            field: field_name("", field.trim_end_matches('.')),
            value,
            problem: printable(&format!("does not match the values schema of {}: {e}", target.name)).into_owned(),
            fix: "give the value the type and form the schema asks for (the chart's values.schema.json)".into(),
        });
    }
    if findings.is_empty() {
        // Helm runs the templates only on values the schema passed; the API checks the name.
        findings.extend(name_findings(&v, &label));
        let fails = match v.chart {
            Chart::Nodes => crate::chart_fails::nodes(&merged, &v.name, schema),
            _ => crate::chart_fails::kubernetes(&merged, schema),
        };
        for f in fails {
            findings.push(Finding {
                pool: label.clone(),
                rules: Vec::new(),
                field: field_name(v.shown, &f.field),
                value: printable(&f.value).into_owned(),
                problem: printable(&format!("is refused by the chart of {}: {}: {}", target.name, f.file, f.message))
                    .into_owned(),
                fix: "change the value as the chart's message says".into(),
            });
        }
    }
    let mut undeclared = Vec::new();
    for key in crate::target::undeclared_keys(schema, &v.values) {
        let fix = if key.starts_with("osImage") {
            format!("remove it: {} has no osImage; for the disk through tender use talos.imageFactoryURL (`tender render cozystack --os-image factory --cozystack ...`)", target.name)
        } else {
            format!("remove it, or check against the Cozystack the cluster runs (--cozystack or --values-schema); {} does not have it", target.name)
        };
        undeclared.push(Finding {
            pool: label.clone(),
            rules: Vec::new(),
            field: field_name(v.shown, &key),
            value: String::new(),
            problem: format!(
                "is not a key of the chart of {}: Helm renders the release without a word and nothing reads it",
                target.name
            ),
            fix,
        });
    }
    Ok(SchemaFindings { invalid: findings, undeclared })
}

/// The schema as values are checked against it: `required` holds inside list items and maps of
/// any keys (nothing fills those in), not along `properties`, where `values.yaml` does.
fn required_where_no_defaults(schema: &Value) -> Value {
    fn walk(v: &Value, along_properties: bool) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .filter(|(k, _)| !(along_properties && k.as_str() == "required"))
                    .map(|(k, x)| {
                        let next = match k.as_str() {
                            "properties" => return (k.clone(), walk_props(x, along_properties)),
                            "items" | "additionalProperties" => false,
                            _ => along_properties,
                        };
                        (k.clone(), walk(x, next))
                    })
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(|x| walk(x, along_properties)).collect()),
            other => other.clone(),
        }
    }
    fn walk_props(props: &Value, along: bool) -> Value {
        match props {
            Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (k.clone(), walk(x, along))).collect()),
            other => other.clone(),
        }
    }
    walk(schema, true)
}

/// What `check cozystack` maps onto the seed rules, once the target's chart took the values:
/// only the keys the target declares (the chart reads no other; `--allow-partial` lets the
/// rest through with a note), typed by the schema rather than the committed key list.
pub fn read_checked_input(
    text: &str,
    name: Option<&str>,
    namespace: Option<&str>,
    target: &Target,
) -> Result<Vec<PoolInput>, Error> {
    let mut v = read_values(text, name, namespace)?;
    let schema = target.schema(v.chart == Chart::Nodes);
    for key in crate::target::undeclared_keys(schema, &v.values) {
        remove_path(&mut v.values, &key);
    }
    match v.chart {
        Chart::Nodes => nodes_pool(&v.values, &v.name, &v.namespace).map(|p| vec![p]),
        _ => kubernetes_pools(&v.values, &v.name, &v.namespace),
    }
}

/// Remove the dotted key path from `v` (list items as `[i]` are left alone).
fn remove_path(v: &mut Value, path: &str) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut node = v;
    for p in parts {
        match node.get_mut(p) {
            Some(n) => node = n,
            None => return,
        }
    }
    if let Value::Object(m) = node {
        m.remove(last);
    }
}

/// The API's rules on the resource's name: a DNS-1035 label, and the Helm release
/// (`kubernetes-<name>`, `kubernetes-nodes-<name>`) within Helm's 53 characters.
fn name_findings(v: &Values, label: &str) -> Vec<Finding> {
    let prefix = if v.chart == Chart::Nodes { "kubernetes-nodes-" } else { "kubernetes-" };
    let field = if v.shown.is_empty() { "--name" } else { "metadata.name" };
    match check_app_name(field, &v.name, prefix, "rename the resource") {
        Ok(()) => Vec::new(),
        Err(Error::Refused(r)) => vec![Finding {
            pool: label.to_string(),
            rules: Vec::new(),
            field: r.field,
            value: printable(&r.value).into_owned(),
            problem: format!("{} (Cozystack's API refuses it)", r.problem),
            fix: r.fix,
        }],
        Err(e) => vec![Finding {
            pool: label.to_string(),
            rules: Vec::new(),
            field: field.into(),
            value: printable(&v.name).into_owned(),
            problem: e.to_string(),
            fix: "rename the resource".into(),
        }],
    }
}

/// What [`schema_findings`] found: values the schema refuses, and keys it does not declare
/// (what the target cannot express; `--allow-partial` lets those pass with a note).
#[derive(Debug, Default)]
pub struct SchemaFindings {
    pub invalid: Vec<Finding>,
    pub undeclared: Vec<Finding>,
}

/// Read a mapped value into the tender pool file.
fn pool_file(v: Value, label: &str) -> Result<PoolFile, Error> {
    serde_json::from_value(v)
        .map_err(|e| usage(label, format!("a value has the wrong type: {}", crate::yaml::humane(&e.to_string()))))
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
            image_verification: None,
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

/// The registries tender's config mirrors (its upstreams' names), as render names them.
fn upstream_registries(config: &ConfigFile) -> Result<Vec<Registry>, Error> {
    let named: Result<Vec<_>, _> =
        config.upstreams.iter().map(|u| Registry::parse("upstreams[].name", &u.name.to_ascii_lowercase())).collect();
    Ok(named?)
}
