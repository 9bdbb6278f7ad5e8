//! The `fail` checks of Cozystack's own charts, on the values they would render (issue 33,
//! item 3): what `helm template` of the `kubernetes-nodes` chart (and the node groups of the
//! `kubernetes` chart) refuses after the values schema passed. Each check names the template
//! that holds the `fail` and gives the chart's message; the inventory of every `fail` is in
//! testdata/cozystack/FINDINGS.md ("Every `fail` in the templates"), and docs/render.md says
//! which are reproduced here and why the rest are not (a cluster `lookup`, a library helper
//! called only with the chart's own arguments, or a value the schema's enum already bounds).
//!
//! The arithmetic is the chart's: quantities as `cozy-lib.resources.toFloat` reads them (a
//! suffix, then Go's float parse, where an unparsable number is 0) and CPU as
//! `kubernetes.cpuToMillicores` does. Template truth is Go's: `false`, `0`, `""`, empty
//! collections and null are false.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use crate::target::has_key;

/// One `fail` the chart would reach: the template, the key it is about, and the message.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartFail {
    /// `templates/nodegroup.yaml`, `templates/_helpers.tpl`, `templates/cluster.yaml`.
    pub file: &'static str,
    pub field: String,
    pub value: String,
    pub message: String,
}

fn re(p: &str) -> Option<Regex> {
    Regex::new(p).ok()
}

static MEMORY: LazyLock<Option<Regex>> =
    LazyLock::new(|| re(r"^[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"));
static CPU: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"^([0-9]+m|[0-9]+(\.[0-9]+)?)$"));
static PERCENT: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"^[0-9]+(\.[0-9]+)?$"));
static DURATION: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"^[1-9][0-9]{0,4}[smh]([0-9]{1,5}[smh]){0,2}$"));
static INT_PERCENT: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"^[0-9]+%$"));
static INT: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"^[0-9]+$"));

fn matches(r: &LazyLock<Option<Regex>>, s: &str) -> bool {
    r.as_ref().is_some_and(|r| r.is_match(s))
}

/// Go template truth.
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(m)) => !m.is_empty(),
    }
}

/// Sprig's `toString`.
fn to_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "<nil>".into(),
        other => other.to_string(),
    }
}

/// `cozy-lib.resources.toFloat`: a string loses its unit suffix (the unit multiplies), then
/// `float64` of the rest, which is 0 when Go cannot parse it.
pub fn to_float(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().unwrap_or(0.0),
        Value::String(s) => {
            const UNITS: [(&str, f64); 15] = [
                ("E", 1e18),
                ("Ei", 1_152_921_504_606_846_976.0),
                ("G", 1e9),
                ("Gi", 1_073_741_824.0),
                ("Ki", 1024.0),
                ("M", 1e6),
                ("Mi", 1_048_576.0),
                ("P", 1e15),
                ("Pi", 1_125_899_906_842_624.0),
                ("T", 1e12),
                ("Ti", 1_099_511_627_776.0),
                ("k", 1e3),
                ("m", 1e-3),
                ("n", 1e-9),
                ("u", 1e-6),
            ];
            let (mut value, mut unit) = (s.as_str(), 1.0);
            // The template ranges over the merged dict in key order; the last suffix that
            // matches wins.
            for (k, u) in UNITS {
                if s.ends_with(k) {
                    value = &s[..s.len() - k.len()];
                    unit = u;
                }
            }
            go_float(value) * unit
        }
        Value::Bool(true) => 1.0,
        _ => 0.0,
    }
}

/// cast.ToFloat64 of a string: strconv.ParseFloat, 0 on error.
fn go_float(s: &str) -> f64 {
    if s.is_empty() || s.contains(['_', ' ']) || s.eq_ignore_ascii_case("inf") || s.eq_ignore_ascii_case("nan") {
        return 0.0;
    }
    s.parse::<f64>().ok().filter(|f| f.is_finite()).unwrap_or(0.0)
}

/// `kubernetes.cpuToMillicores`: `100m` -> 100, else cores × 1000 (truncated).
pub fn cpu_millis(v: &Value) -> f64 {
    let s = to_string(v);
    match s.strip_suffix('m') {
        Some(m) => m.parse::<i64>().map_or(0.0, |i| i as f64),
        None => (go_float(&s) * 1000.0).trunc(),
    }
}

struct Group<'a> {
    file: &'static str,
    name: &'a str,
    /// How fields are shown: `` for a pool's values, `nodeGroups.md0.` for a group.
    shown: String,
    out: Vec<ChartFail>,
}

impl Group<'_> {
    fn fail(&mut self, field: &str, value: impl Into<String>, message: String) {
        self.out.push(ChartFail {
            file: self.file,
            field: format!("{}{field}", self.shown),
            value: value.into(),
            message,
        });
    }
}

/// The checks `nodegroup.yaml` (and `cluster.yaml` per node group) makes on one group.
/// `pod_cpu`: the chart has `podCpuLimit` / `podCpuRequest` (main, not v1.6.x).
fn group_checks(g: &mut Group<'_>, group: &Value, pod_cpu: bool) {
    let name = g.name.to_string();
    let instance_type = truthy(group.get("instanceType"));
    let resources = group.get("resources");
    let has_cpu = truthy(resources) && truthy(resources.and_then(|r| r.get("cpu")));
    let has_mem = truthy(resources) && truthy(resources.and_then(|r| r.get("memory")));
    if instance_type && has_cpu != has_mem {
        g.fail("resources", "", format!("nodeGroup {name}: set both resources.cpu and resources.memory, or neither"));
    }
    if pod_cpu {
        pod_cpu_checks(g, group, instance_type && !(has_cpu && has_mem));
    }
    kubelet_checks(g, group, instance_type, has_cpu, has_mem);
}

fn pod_cpu_checks(g: &mut Group<'_>, group: &Value, sized_by_instance_type: bool) {
    let name = g.name.to_string();
    let limit = group.get("podCpuLimit").filter(|v| !v.is_null());
    let request = group.get("podCpuRequest").filter(|v| !v.is_null());
    if limit.is_some() && sized_by_instance_type {
        g.fail("podCpuLimit", limit.map(to_string).unwrap_or_default(), format!("nodeGroup {name}: podCpuLimit cannot be combined with instanceType sizing, because KubeVirt rejects a VirtualMachine that references an instancetype and also sets domain.resources.limits.cpu. Set both resources.cpu and resources.memory, which drops the instancetype from the VM, or drop podCpuLimit."));
    }
    if request.is_some() && sized_by_instance_type {
        g.fail("podCpuRequest", request.map(to_string).unwrap_or_default(), format!("nodeGroup {name}: podCpuRequest cannot be combined with instanceType sizing, because KubeVirt rejects a VirtualMachine that references an instancetype and also sets domain.resources.requests.cpu. Set both resources.cpu and resources.memory, which drops the instancetype from the VM, or drop podCpuRequest."));
    }
    if let Some(l) = limit.filter(|l| to_float(l) < 0.0) {
        g.fail(
            "podCpuLimit",
            to_string(l),
            format!("nodeGroup {name}: podCpuLimit ({}) must not be negative", to_string(l)),
        );
    }
    if let Some(r) = request.filter(|r| to_float(r) < 0.0) {
        g.fail(
            "podCpuRequest",
            to_string(r),
            format!("nodeGroup {name}: podCpuRequest ({}) must not be negative", to_string(r)),
        );
    }
    match (limit, request) {
        (Some(l), None) if to_float(l) == 0.0 => g.fail("podCpuLimit", to_string(l), format!("nodeGroup {name}: podCpuLimit 0 needs podCpuRequest 0 beside it. A zero limit removes the ceiling, but KubeVirt still derives a CPU request from the guest vCPU count when the VM declares none, and a request above a declared limit of zero is rejected when the worker's Pod is created.")),
        (Some(l), Some(r)) => {
            let (lf, rf) = (to_float(l), to_float(r));
            if rf == 0.0 && lf != 0.0 {
                g.fail("podCpuRequest", to_string(r), format!("nodeGroup {name}: podCpuRequest 0 beside a podCpuLimit does not reserve nothing. KubeVirt replaces a zero CPU request with the declared limit ({}), so the worker would ask the scheduler for its whole ceiling, which is what podCpuRequest exists to prevent. Give podCpuRequest a non-zero value, or drop it and accept the same outcome deliberately.", to_string(l)));
            }
            if rf > lf {
                g.fail("podCpuRequest", to_string(r), format!("nodeGroup {name}: podCpuRequest ({}) exceeds podCpuLimit ({}), and a container cannot request more CPU than its limit", to_string(r), to_string(l)));
            }
        }
        _ => {}
    }
}

fn kubelet_checks(g: &mut Group<'_>, group: &Value, instance_type: bool, has_cpu: bool, has_mem: bool) {
    let name = g.name.to_string();
    let empty = Value::Object(serde_json::Map::new());
    let kubelet = group.get("kubelet").filter(|k| truthy(Some(k))).unwrap_or(&empty);
    let user = |k: &str| kubelet.get(k).filter(|v| truthy(Some(v)));
    // With an instanceType and no explicit sizing, the effective size comes from the cluster's
    // VirtualMachineClusterInstancetype (a lookup): what depends on it is not decided here.
    let from_cluster = instance_type && !(has_cpu && has_mem);
    let resources = group.get("resources");
    let effective_mem = if has_mem { resources.and_then(|r| r.get("memory")).map(to_string) } else { None };
    let effective_cpu = if has_cpu { resources.and_then(|r| r.get("cpu")).map(to_string) } else { None };
    let auto_mi = effective_mem.as_ref().map_or(256, |m| {
        let mi = (to_float(&Value::String(m.clone())) / 1_048_576.0) as i64;
        ((mi as f64 * 0.05) as i64).clamp(256, 1024)
    });
    let auto_millis = effective_cpu.as_ref().map_or(50, |c| {
        let millis = cpu_millis(&Value::String(c.clone())) as i64;
        ((millis as f64 * 0.05) as i64).clamp(50, 500)
    });
    let or = |k: &str, d: String| user(k).map_or(d, to_string);
    let sys_mem = or("systemReservedMemory", format!("{auto_mi}Mi"));
    let kube_mem = or("kubeReservedMemory", format!("{auto_mi}Mi"));
    let sys_cpu = or("systemReservedCpu", format!("{auto_millis}m"));
    let kube_cpu = or("kubeReservedCpu", format!("{auto_millis}m"));
    let hard = or("evictionHardMemory", "7%".into());
    let soft = or("evictionSoftMemory", "10%".into());
    for (key, pattern, hint) in [
        ("systemReservedMemory", &MEMORY, "a valid Kubernetes memory quantity (e.g. 128Mi, 1Gi, 1e9, 500e6)"),
        ("kubeReservedMemory", &MEMORY, "a valid Kubernetes memory quantity (e.g. 128Mi, 1Gi, 1e9, 500e6)"),
        (
            "systemReservedCpu",
            &CPU,
            "a valid Kubernetes CPU quantity (integer millicores like 100m, or decimal cores like 0.5, 1)",
        ),
        (
            "kubeReservedCpu",
            &CPU,
            "a valid Kubernetes CPU quantity (integer millicores like 100m, or decimal cores like 0.5, 1)",
        ),
    ] {
        if let Some(v) = user(key) {
            let s = to_string(v);
            if !matches(pattern, &s) {
                g.fail(
                    &format!("kubelet.{key}"),
                    s.clone(),
                    format!("nodeGroup {name}: invalid {key} value {s:?} — must be {hint}"),
                );
                return;
            }
        }
    }
    for key in ["systemReservedMemory", "kubeReservedMemory"] {
        if let Some(v) = user(key) {
            if to_float(&Value::String(to_string(v))) <= 0.0 {
                g.fail(
                    &format!("kubelet.{key}"),
                    to_string(v),
                    format!("nodeGroup {name}: {key} must be a positive value, got {}", to_string(v)),
                );
                return;
            }
        }
    }
    for key in ["systemReservedCpu", "kubeReservedCpu"] {
        if let Some(v) = user(key) {
            if cpu_millis(v) <= 0.0 {
                g.fail(
                    &format!("kubelet.{key}"),
                    to_string(v),
                    format!("nodeGroup {name}: {key} must be a positive value, got {}", to_string(v)),
                );
                return;
            }
        }
    }
    let (hard_pct, soft_pct) = (hard.ends_with('%'), soft.ends_with('%'));
    if !hard_pct && !matches(&MEMORY, &hard) {
        g.fail("kubelet.evictionHardMemory", hard.clone(), format!("nodeGroup {name}: invalid evictionHardMemory value {hard:?} — must be a percentage (e.g. 7%) or a valid Kubernetes memory quantity (e.g. 500Mi, 1Gi, 1e9)"));
        return;
    }
    if !soft_pct && !matches(&MEMORY, &soft) {
        g.fail("kubelet.evictionSoftMemory", soft.clone(), format!("nodeGroup {name}: invalid evictionSoftMemory value {soft:?} — must be a percentage (e.g. 10%) or a valid Kubernetes memory quantity (e.g. 500Mi, 1Gi, 1e9)"));
        return;
    }
    match (hard_pct, soft_pct) {
        (true, true) => {
            let (h, s) = (hard.trim_end_matches('%'), soft.trim_end_matches('%'));
            for (key, v) in [("evictionHardMemory", h), ("evictionSoftMemory", s)] {
                if !matches(&PERCENT, v) {
                    g.fail(
                        &format!("kubelet.{key}"),
                        format!("{v}%"),
                        format!("nodeGroup {name}: {key} percentage value {v:?} is not a valid number"),
                    );
                    return;
                }
            }
            let (hf, sf) = (go_float(h), go_float(s));
            for (key, v, f) in [("evictionHardMemory", h, hf), ("evictionSoftMemory", s, sf)] {
                if f <= 0.0 || f > 100.0 {
                    g.fail(
                        &format!("kubelet.{key}"),
                        format!("{v}%"),
                        format!("nodeGroup {name}: {key} percentage must be greater than 0 and at most 100, got {v}%"),
                    );
                    return;
                }
            }
            if hf >= sf {
                g.fail("kubelet.evictionHardMemory", hard.clone(), format!("nodeGroup {name}: evictionHardMemory ({hard}) must be strictly less than evictionSoftMemory ({soft})"));
                return;
            }
        }
        (false, false) => {
            if to_float(&Value::String(hard.clone())) >= to_float(&Value::String(soft.clone())) {
                g.fail("kubelet.evictionHardMemory", hard.clone(), format!("nodeGroup {name}: evictionHardMemory ({hard}) must be strictly less than evictionSoftMemory ({soft})"));
                return;
            }
        }
        _ => {
            g.fail("kubelet.evictionHardMemory", hard.clone(), format!("nodeGroup {name}: evictionHardMemory ({hard}) and evictionSoftMemory ({soft}) must use the same unit type (both percentage or both absolute)"));
            return;
        }
    }
    if let Some(mem) = &effective_mem {
        let mem_bytes = to_float(&Value::String(mem.clone()));
        let hard_bytes = if hard_pct {
            mem_bytes * (go_float(hard.trim_end_matches('%')) / 100.0)
        } else {
            to_float(&Value::String(hard.clone()))
        };
        let total = to_float(&Value::String(sys_mem.clone())) + to_float(&Value::String(kube_mem.clone())) + hard_bytes;
        if total >= mem_bytes {
            g.fail("kubelet", "", format!("nodeGroup {name}: total reserved memory (systemReservedMemory={sys_mem} + kubeReservedMemory={kube_mem} + evictionHardMemory={hard}) must be less than effective node memory ({mem})"));
            return;
        }
    }
    if let Some(cpu) = &effective_cpu {
        let total = cpu_millis(&Value::String(sys_cpu.clone())) + cpu_millis(&Value::String(kube_cpu.clone()));
        if total >= cpu_millis(&Value::String(cpu.clone())) {
            g.fail("kubelet", "", format!("nodeGroup {name}: total reserved CPU (systemReservedCpu={sys_cpu} + kubeReservedCpu={kube_cpu}) must be less than effective node CPU ({cpu} cores)"));
            return;
        }
    }
    let memory_keys = ["systemReservedMemory", "kubeReservedMemory", "evictionHardMemory", "evictionSoftMemory"];
    if effective_mem.is_none() && !from_cluster && memory_keys.iter().any(|k| user(k).is_some()) {
        g.fail("kubelet", "", format!("nodeGroup {name}: kubelet memory reservations require effective memory to validate — set resources.memory or instanceType"));
        return;
    }
    if effective_cpu.is_none()
        && !from_cluster
        && ["systemReservedCpu", "kubeReservedCpu"].iter().any(|k| user(k).is_some())
    {
        g.fail("kubelet", "", format!("nodeGroup {name}: cannot validate kubelet CPU reservations without effective CPU — set resources.cpu or a valid instanceType"));
    }
}

/// The values as Helm coalesces them with the chart's `values.yaml`, which tender knows through
/// the schema's top-level `default`s: a key the values lack takes the default, maps merge
/// key by key, and a null removes the key (and its default with it).
pub fn helm_merged(schema: &Value, values: &Value) -> Value {
    let defaults: serde_json::Map<String, Value> = schema
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, s)| s.get("default").map(|d| (k.clone(), d.clone())))
        .collect();
    coalesce(values, &Value::Object(defaults))
}

fn coalesce(user: &Value, default: &Value) -> Value {
    match (user, default) {
        (Value::Object(u), Value::Object(d)) => {
            let mut out = d.clone();
            for (k, v) in u {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = coalesce(v, d.get(k).unwrap_or(&Value::Null));
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        (u, _) => u.clone(),
    }
}

/// What `helm template kubernetes-nodes-<name>` of the `kubernetes-nodes` chart whose values
/// schema is `schema` fails on, for values that passed the schema. `values` are as Helm merged
/// them with the chart's defaults ([`helm_merged`]): a key the operator set to
/// null is absent, and the template reads it as `<nil>`.
pub fn nodes(values: &Value, name: &str, schema: &Value) -> Vec<ChartFail> {
    let cluster = values.get("cluster");
    let mut out = Vec::new();
    if !truthy(cluster) {
        out.push(ChartFail {
            file: "templates/_helpers.tpl",
            field: "cluster".into(),
            value: String::new(),
            message: "kubernetes-nodes: .Values.cluster is required — set it to the parent Kubernetes CR name so the pool attaches to cluster kubernetes-<cluster>".into(),
        });
        return out;
    }
    let cluster = cluster.map(to_string).unwrap_or_default();
    let release = format!("kubernetes-nodes-{name}");
    let prefix = format!("kubernetes-nodes-{cluster}-");
    let Some(pool) = release.strip_prefix(&prefix) else {
        out.push(ChartFail {
            file: "templates/_helpers.tpl",
            field: "cluster".into(),
            value: cluster.clone(),
            message: format!("kubernetes-nodes: release name {release:?} must start with {prefix:?} — name the KubernetesNodes CR <cluster>-<pool> (cluster={cluster:?})"),
        });
        return out;
    };
    let mut g = Group { file: "templates/nodegroup.yaml", name: pool, shown: String::new(), out };
    group_checks(&mut g, values, has_key(schema, &["podCpuLimit"]));
    let max_unhealthy = values.get("maxUnhealthy").map(to_string).unwrap_or_else(|| "<nil>".into());
    let ok = if max_unhealthy.ends_with('%') {
        matches(&INT_PERCENT, &max_unhealthy)
    } else {
        matches(&INT, &max_unhealthy)
    };
    if !ok {
        g.fail("maxUnhealthy", max_unhealthy.clone(), format!("maxUnhealthy must be a bare integer (e.g. 0, 1) or an integer percentage (e.g. 50%), got {max_unhealthy:?}"));
    }
    let mut out = g.out;
    // main: kubernetes.positiveDuration on the durations nothing downstream validates.
    if has_key(schema, &["readyUnknownTimeout"]) {
        for key in ["maxNodeProvisionTime", "readyUnknownTimeout", "readyFalseTimeout"] {
            let v = values.get(key).map(to_string).unwrap_or_else(|| "<nil>".into());
            if !matches(&DURATION, &v) {
                out.push(ChartFail {
                    file: "templates/_helpers.tpl",
                    field: key.into(),
                    value: v.clone(),
                    message: format!("{key} must be a whole number of s, m or h (e.g. 30m, 1h30m), got {v:?}"),
                });
            }
        }
    }
    out
}

/// The `fail`s of the `kubernetes` chart, for values that passed its schema (merged with its
/// defaults): each node group's (`templates/cluster.yaml`; an empty `nodeGroups` is the chart's
/// default group `md0`), the Talos support matrix, the control plane's extra volumes and
/// mounts, OIDC against the apiserver's extra arguments, each group's MachineHealthCheck
/// `maxUnhealthy`, and the durations (`templates/_helpers.tpl`). Each where the target's chart
/// has it, as its schema tells.
pub fn kubernetes(values: &Value, schema: &Value) -> Vec<ChartFail> {
    let mut out = Vec::new();
    let pod_cpu = has_key(schema, &["nodeGroups"])
        && schema.pointer("/properties/nodeGroups/additionalProperties/properties/podCpuLimit").is_some();
    let fail = |out: &mut Vec<ChartFail>, file: &'static str, field: &str, value: String, message: String| {
        out.push(ChartFail { file, field: field.to_string(), value, message });
    };
    // A nested key the values lack is the chart's default (its values.yaml, which the schema's
    // nested `default`s repeat; the top-level `default` of such a map is `{}`).
    let value = |path: &[&str]| -> Option<&Value> {
        let ptr: String = path.iter().map(|p| format!("/{p}")).collect();
        let schema_ptr: String = path.iter().map(|p| format!("/properties/{p}")).collect();
        values.pointer(&ptr).or_else(|| schema.pointer(&format!("{schema_ptr}/default")))
    };
    let get = |path: &[&str]| value(path).map(to_string);
    // cluster.yaml: Talos -> Kubernetes support matrix, keyed by the Talos minor.
    let talos = get(&["talos", "version"]).unwrap_or_default();
    let version = get(&["version"]).unwrap_or_default();
    if talos_minor(&talos) == Some("v1.13") {
        let supported = ["v1.31", "v1.32", "v1.33", "v1.34", "v1.35", "v1.36"];
        if !supported.contains(&version.as_str()) {
            fail(&mut out, "templates/cluster.yaml", "version", version.clone(), format!(
                "Kubernetes {version} is not supported by Talos {talos}. Supported versions: [{}]. Bump tenant 'version' or set talos.version explicitly.",
                supported.join(" ")
            ));
        }
    }
    // The groups the chart emits: the user's, else its default one.
    let default = serde_json::json!({"md0": {}});
    let groups = match values.get("nodeGroups") {
        Some(Value::Object(g)) if !g.is_empty() => values.get("nodeGroups").unwrap_or(&default),
        _ => &default,
    };
    let mhc = has_key(schema, &["nodeHealthCheck"]);
    if let Value::Object(groups) = groups {
        for (name, group) in groups {
            if group.get("ephemeralStorage").is_some() {
                fail(&mut out, "templates/cluster.yaml", &format!("nodeGroups.{name}.ephemeralStorage"), String::new(), format!(
                    "nodeGroup {name:?}: ephemeralStorage is no longer supported and should have been automatically migrated to diskSize by platform migration 41. If you see this error after upgrading, the migration did not run — check the cozystack-migration-hook Job logs in cozy-system."
                ));
            }
            if values.get("nodeGroups").is_some_and(|g| g.get(name).is_some()) {
                let mut g = Group {
                    file: "templates/cluster.yaml",
                    name,
                    shown: format!("nodeGroups.{name}."),
                    out: Vec::new(),
                };
                group_checks(&mut g, group, pod_cpu);
                out.extend(g.out);
            }
            if mhc {
                let (mu, source) = match group.get("maxUnhealthy") {
                    Some(v) => (to_string(v), format!("nodeGroups.{name}.maxUnhealthy")),
                    None => (
                        get(&["nodeHealthCheck", "maxUnhealthy"]).unwrap_or_else(|| "<nil>".into()),
                        "nodeHealthCheck.maxUnhealthy".to_string(),
                    ),
                };
                let ok = if mu.ends_with('%') { matches(&INT_PERCENT, &mu) } else { matches(&INT, &mu) };
                if !ok {
                    fail(
                        &mut out,
                        "templates/cluster.yaml",
                        &source,
                        mu.clone(),
                        format!(
                        "{source} must be a bare integer (e.g. 0, 1) or an integer percentage (e.g. 50%), got {mu:?}"
                    ),
                    );
                }
            }
        }
    }
    // cluster.yaml: the control plane's extra volumes and mounts.
    let api = values.pointer("/controlPlane/apiServer");
    let mut names: Vec<String> = Vec::new();
    if let Some(Value::Array(vols)) = api.and_then(|a| a.get("extraVolumes")) {
        for (i, vol) in vols.iter().enumerate() {
            let field = format!("controlPlane.apiServer.extraVolumes[{i}]");
            let name = match named("extraVolumes", i, "volume", vol) {
                Ok(n) => n,
                Err(f) => {
                    out.push(f);
                    break;
                }
            };
            if ["talos-ca", "talos-tls-cert"].contains(&name.as_str()) {
                fail(&mut out, "templates/cluster.yaml", &field, name.clone(), format!(
                    "controlPlane.apiServer.extraVolumes: volume name {name:?} is reserved by the chart for the talos control-plane secrets — rename your volume to avoid a duplicate volume name in the control-plane Deployment"
                ));
                break;
            }
            if names.contains(&name) {
                fail(&mut out, "templates/cluster.yaml", &field, name.clone(), format!(
                    "controlPlane.apiServer.extraVolumes: duplicate volume name {name:?} — each extra volume must have a unique name"
                ));
                break;
            }
            names.push(name.clone());
            let mut sources: Vec<&str> = vol
                .as_object()
                .map(|m| m.keys().map(String::as_str).filter(|k| *k != "name").collect())
                .unwrap_or_default();
            sources.sort_unstable();
            if sources.len() != 1 {
                fail(&mut out, "templates/cluster.yaml", &field, name.clone(), format!(
                    "controlPlane.apiServer.extraVolumes: volume {name:?} must declare exactly one volume source, got {} ([{}])",
                    sources.len(),
                    sources.join(" ")
                ));
                break;
            }
            if let Some(bad) = sources.iter().find(|s| !["configMap", "secret"].contains(s)) {
                fail(&mut out, "templates/cluster.yaml", &field, name.clone(), format!(
                    "controlPlane.apiServer.extraVolumes: volume {name:?} uses a {bad:?} source, which is not permitted on a management-cluster control-plane pod — only configMap and secret sources are allowed"
                ));
                break;
            }
        }
    }
    if out.iter().all(|f| !f.field.starts_with("controlPlane.apiServer.extraVolumes")) {
        if let Some(Value::Array(mounts)) = api.and_then(|a| a.get("extraVolumeMounts")) {
            for (i, m) in mounts.iter().enumerate() {
                let field = format!("controlPlane.apiServer.extraVolumeMounts[{i}]");
                let name = match named("extraVolumeMounts", i, "mount", m) {
                    Ok(n) => n,
                    Err(f) => {
                        out.push(f);
                        break;
                    }
                };
                if !names.contains(&name) {
                    fail(&mut out, "templates/cluster.yaml", &field, name.clone(), format!(
                        "controlPlane.apiServer.extraVolumeMounts: mount {name:?} references no volume declared in controlPlane.apiServer.extraVolumes — the chart-managed talos volumes cannot be mounted"
                    ));
                    break;
                }
            }
        }
    }
    // cluster.yaml: OIDC owns --authentication-config and its volume.
    if has_key(schema, &["oidc"]) {
        let mode = get(&["oidc", "mode"]).unwrap_or_else(|| "<nil>".into());
        if mode == "CustomConfig" {
            // oidc-authn-config.yaml: exactly one source of the AuthenticationConfiguration.
            let text = |ptr: &str| values.pointer(ptr).map(to_string).filter(|s| !s.is_empty());
            match (text("/oidc/customConfig/config"), text("/oidc/customConfig/secretRef/name")) {
                (Some(_), Some(_)) => fail(&mut out, "templates/oidc-authn-config.yaml", "oidc.customConfig", String::new(),
                    "spec.oidc.customConfig: set exactly one of `config` (inline) or `secretRef.name` — they are mutually exclusive.".into()),
                (None, None) => fail(&mut out, "templates/oidc-authn-config.yaml", "oidc.customConfig", String::new(),
                    "spec.oidc.mode: CustomConfig requires either spec.oidc.customConfig.config (inline AuthenticationConfiguration) or spec.oidc.customConfig.secretRef.name (Secret with config.yaml key).".into()),
                _ => {}
            }
        }
        // `System` also needs the platform's OIDC feature (`_cluster.oidc-enabled`, in the
        // platform's values, not the application's): not checked here.
        if mode != "None" {
            if names.iter().any(|n| n == "authentication-config") {
                fail(&mut out, "templates/cluster.yaml", "controlPlane.apiServer.extraVolumes", "authentication-config".into(),
                    "controlPlane.apiServer.extraVolumes: volume name \"authentication-config\" is reserved by the chart for OIDC AuthenticationConfiguration when spec.oidc.mode is not None — rename your volume.".into());
            }
            if let Some(Value::Array(args)) = api.and_then(|a| a.get("extraArgs")) {
                for arg in args.iter().map(to_string) {
                    let why = if arg.starts_with("--oidc-") {
                        "the kube-apiserver refuses to boot with both --authentication-config (injected by spec.oidc) and legacy --oidc-* flags. Remove the --oidc-* flags from controlPlane.apiServer.extraArgs"
                    } else if arg.starts_with("--authentication-config") {
                        "the chart already injects --authentication-config= for OIDC. Drop your explicit flag, or leave spec.oidc.mode: None and keep managing the flag yourself"
                    } else {
                        continue;
                    };
                    fail(
                        &mut out,
                        "templates/cluster.yaml",
                        "controlPlane.apiServer.extraArgs",
                        arg.clone(),
                        format!(
                        "controlPlane.apiServer.extraArgs contains {arg:?} while spec.oidc.mode is {mode:?} — {why}."
                    ),
                    );
                    break;
                }
            }
        }
    }
    // helmreleases/: the addons that need another addon (the chart's defaults fill the flags).
    if has_key(schema, &["addons"]) {
        let on = |path: &[&str]| truthy(value(path));
        let addon = |out: &mut Vec<ChartFail>, file: &'static str, field: &str, message: &str| {
            fail(out, file, field, "true".into(), message.into());
        };
        if on(&["addons", "hami", "enabled"]) && !on(&["addons", "gpuOperator", "enabled"]) {
            addon(
                &mut out,
                "templates/helmreleases/hami.yaml",
                "addons.hami.enabled",
                "addons.hami requires addons.gpuOperator to be enabled",
            );
        }
        if on(&["addons", "ouroboros", "enabled"]) && !on(&["addons", "ingressNginx", "enabled"]) {
            addon(&mut out, "templates/helmreleases/ouroboros.yaml", "addons.ouroboros.enabled",
                "addons.ouroboros.enabled requires addons.ingressNginx.enabled — ouroboros is a hairpin-NAT fix for tenant ingress-nginx and has nothing to fix against without it.");
        }
        // Any truthy spelling, as the chart compares it (toString, lower).
        let gateway = values.pointer("/addons/ouroboros/valuesOverride/ouroboros/controller/gatewayApi/enabled");
        let truthy_word = gateway
            .map(|v| to_string(v).to_lowercase())
            .is_some_and(|w| ["true", "1", "yes", "on", "y"].contains(&w.as_str()));
        if truthy_word && !on(&["addons", "gatewayAPI", "enabled"]) {
            addon(&mut out, "templates/helmreleases/ouroboros.yaml", "addons.ouroboros.valuesOverride.ouroboros.controller.gatewayApi.enabled",
                "addons.ouroboros.valuesOverride.ouroboros.controller.gatewayApi.enabled=true requires addons.gatewayAPI.enabled=true on the same tenant — Gateway-API CRDs would otherwise be missing and the controller would CrashLoopBackOff on WaitForCacheSync. Either enable addons.gatewayAPI for the tenant, or drop the override and let the wrapper mirror the tenant value.");
        }
    }
    // _helpers.tpl (main): kubernetes.positiveDuration.
    if has_key(schema, &["maxNodeProvisionTime"]) {
        let durations: [(&str, &[&str]); 3] = [
            ("maxNodeProvisionTime", &["maxNodeProvisionTime"]),
            ("nodeHealthCheck.readyUnknownTimeout", &["nodeHealthCheck", "readyUnknownTimeout"]),
            ("nodeHealthCheck.readyFalseTimeout", &["nodeHealthCheck", "readyFalseTimeout"]),
        ];
        for (field, path) in durations {
            let v = get(path).unwrap_or_else(|| "<nil>".into());
            if !matches(&DURATION, &v) {
                fail(
                    &mut out,
                    "templates/_helpers.tpl",
                    field,
                    v.clone(),
                    format!("{field} must be a whole number of s, m or h (e.g. 30m, 1h30m), got {v:?}"),
                );
            }
        }
    }
    out
}

/// An extra volume's or mount's name as the chart reads it (`.name | default "" | toString`),
/// or the chart's `fail` for item `i` of `list` without one.
fn named(list: &str, i: usize, what: &str, item: &Value) -> Result<String, ChartFail> {
    let name = item.get("name").filter(|n| truthy(Some(n))).map(to_string).unwrap_or_default();
    if name.is_empty() {
        return Err(ChartFail {
            file: "templates/cluster.yaml",
            field: format!("controlPlane.apiServer.{list}[{i}]"),
            value: String::new(),
            message: format!("controlPlane.apiServer.{list}[{i}]: every {what} must set a non-empty name"),
        });
    }
    Ok(name)
}

/// `regexFind "^v[0-9]+\.[0-9]+"` of a Talos version: its minor, `v1.13`.
fn talos_minor(v: &str) -> Option<&str> {
    let rest = v.strip_prefix('v')?;
    let major = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let after = rest.get(major..)?.strip_prefix('.')?;
    let minor = after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len());
    (major > 0 && minor > 0).then(|| &v[..1 + major + 1 + minor])
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use serde_json::json;

    fn main_nodes() -> Value {
        crate::target::Target::embedded("main").unwrap().nodes
    }

    fn base(extra: Value) -> Value {
        let mut v = json!({"cluster": "demo", "instanceType": "", "resources": {"cpu": "2", "memory": "4Gi"}});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    fn fails(extra: Value) -> Vec<String> {
        let schema = main_nodes();
        nodes(&super::helm_merged(&schema, &base(extra)), "demo-md0", &schema)
            .into_iter()
            .map(|f| format!("{}: {}", f.file, f.message))
            .collect()
    }

    #[test]
    fn should_pass_the_values_the_chart_renders() {
        assert!(fails(json!({})).is_empty());
        assert!(fails(json!({"kubelet": {"evictionHardMemory": "5%", "evictionSoftMemory": "10%", "systemReservedCpu": "100m"}, "maxUnhealthy": "2"})).is_empty());
        assert!(fails(json!({"podCpuLimit": "2", "podCpuRequest": "500m"})).is_empty());
    }

    #[test]
    fn should_name_the_template_of_each_fail() {
        for (extra, want) in [
            (json!({"cluster": ""}), "templates/_helpers.tpl: kubernetes-nodes: .Values.cluster is required"),
            (json!({"cluster": "other"}), "templates/_helpers.tpl: kubernetes-nodes: release name \"kubernetes-nodes-demo-md0\" must start with"),
            (json!({"instanceType": "u1.medium", "resources": {"cpu": "2"}}), "templates/nodegroup.yaml: nodeGroup md0: set both resources.cpu"),
            (json!({"podCpuLimit": "-1", "podCpuRequest": "-2"}), "templates/nodegroup.yaml: nodeGroup md0: podCpuLimit (-1) must not be negative"),
            (json!({"podCpuLimit": "0"}), "templates/nodegroup.yaml: nodeGroup md0: podCpuLimit 0 needs podCpuRequest 0"),
            (json!({"podCpuLimit": "1", "podCpuRequest": "0"}), "templates/nodegroup.yaml: nodeGroup md0: podCpuRequest 0 beside a podCpuLimit"),
            (json!({"podCpuLimit": "1", "podCpuRequest": "1500m"}), "templates/nodegroup.yaml: nodeGroup md0: podCpuRequest (1500m) exceeds podCpuLimit (1)"),
            (json!({"kubelet": {"kubeReservedCpu": "1.5x"}}), "templates/nodegroup.yaml: nodeGroup md0: invalid kubeReservedCpu value"),
            (json!({"kubelet": {"evictionHardMemory": "20%"}}), "templates/nodegroup.yaml: nodeGroup md0: evictionHardMemory (20%) must be strictly less than evictionSoftMemory (10%)"),
            (json!({"kubelet": {"evictionHardMemory": "200Mi"}}), "must use the same unit type"),
            (json!({"kubelet": {"evictionHardMemory": "150%", "evictionSoftMemory": "160%"}}), "percentage must be greater than 0 and at most 100"),
            (json!({"kubelet": {"systemReservedMemory": "3584Mi"}}), "total reserved memory"),
            (json!({"kubelet": {"systemReservedCpu": "1", "kubeReservedCpu": "1"}}), "total reserved CPU"),
            (json!({"resources": {}, "kubelet": {"systemReservedMemory": "1Gi"}}), "kubelet memory reservations require effective memory"),
            (json!({"resources": {}, "kubelet": {"kubeReservedCpu": "100m"}}), "cannot validate kubelet CPU reservations"),
            (json!({"maxUnhealthy": "1.5"}), "templates/nodegroup.yaml: maxUnhealthy must be a bare integer"),
            (json!({"maxUnhealthy": "50.5%"}), "templates/nodegroup.yaml: maxUnhealthy must be a bare integer"),
            (json!({"readyFalseTimeout": "30"}), "templates/_helpers.tpl: readyFalseTimeout must be a whole number of s, m or h"),
        ] {
            let got = fails(extra.clone());
            assert!(got.iter().any(|f| f.starts_with(want) || f.contains(want)), "{extra}: {got:?}");
        }
    }

    #[test]
    fn should_know_which_checks_a_version_has() {
        let v162 = crate::target::Target::embedded("v1.6.2").unwrap().nodes;
        let v = base(json!({"podCpuLimit": "0", "readyFalseTimeout": "30"}));
        let merged = |s: &Value| super::helm_merged(s, &v);
        assert!(nodes(&merged(&v162), "demo-md0", &v162).is_empty());
        assert_eq!(nodes(&merged(&main_nodes()), "demo-md0", &main_nodes()).len(), 2);
        // A null removes the key, and its default with it.
        let null = super::helm_merged(&v162, &base(json!({"maxUnhealthy": null})));
        assert!(nodes(&null, "demo-md0", &v162)[0].message.ends_with("got \"<nil>\""));
    }

    #[test]
    fn should_check_each_node_group_of_the_kubernetes_chart() {
        let k = crate::target::Target::embedded("main").unwrap().kubernetes;
        let v = json!({"nodeGroups": {"md0": {"instanceType": "", "resources": {"cpu": 2, "memory": "4Gi"}, "kubelet": {"evictionHardMemory": "20%"}}}});
        let f = kubernetes(&v, &k);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (f[0].file, f[0].field.as_str()),
            ("templates/cluster.yaml", "nodeGroups.md0.kubelet.evictionHardMemory")
        );
    }

    /// The `kubernetes` app chart's own `fail`s (issue 33), each with its template, on main and
    /// where v1.6.2 has them.
    #[test]
    fn should_apply_the_kubernetes_charts_control_plane_oidc_and_health_check_fails() {
        let fails = |version: &str, extra: Value| -> Vec<String> {
            let k = crate::target::Target::embedded(version).unwrap().kubernetes;
            let mut v =
                json!({"nodeGroups": {"md0": {"instanceType": "", "resources": {"cpu": "2", "memory": "4Gi"}}}});
            for (key, x) in extra.as_object().unwrap() {
                v[key] = x.clone();
            }
            kubernetes(&super::helm_merged(&k, &v), &k)
                .into_iter()
                .map(|f| format!("{}: {}", f.file, f.message))
                .collect()
        };
        assert!(fails("main", json!({})).is_empty(), "{:?}", fails("main", json!({})));
        assert!(fails("v1.6.2", json!({})).is_empty());
        let vols = |v: Value| json!({"controlPlane": {"apiServer": v}});
        for (extra, want) in [
            (vols(json!({"extraVolumes": [{"configMap": {"name": "x"}}]})), "templates/cluster.yaml: controlPlane.apiServer.extraVolumes[0]: every volume must set a non-empty name"),
            (vols(json!({"extraVolumes": [{"name": "talos-tls-cert", "secret": {}}]})), "is reserved by the chart for the talos"),
            (vols(json!({"extraVolumes": [{"name": "a", "secret": {}}, {"name": "a", "secret": {}}]})), "duplicate volume name \"a\""),
            (vols(json!({"extraVolumes": [{"name": "a", "secret": {}, "configMap": {}}]})), "must declare exactly one volume source, got 2 ([configMap secret])"),
            (vols(json!({"extraVolumes": [{"name": "a", "projected": {}}]})), "uses a \"projected\" source"),
            (vols(json!({"extraVolumeMounts": [{"name": "a", "mountPath": "/a"}]})), "mount \"a\" references no volume"),
            (vols(json!({"extraVolumeMounts": [{"mountPath": "/a"}]})), "extraVolumeMounts[0]: every mount must set a non-empty name"),
            (json!({"nodeHealthCheck": {"maxUnhealthy": "x"}}), "nodeHealthCheck.maxUnhealthy must be a bare integer"),
            (json!({"nodeGroups": {"md0": {"instanceType": "", "maxUnhealthy": "5.5%"}}}), "nodeGroups.md0.maxUnhealthy must be a bare integer"),
            (json!({"nodeGroups": {"md0": {"instanceType": "", "ephemeralStorage": "5Gi"}}}), "nodeGroup \"md0\": ephemeralStorage is no longer supported"),
            (json!({"maxNodeProvisionTime": "0s"}), "templates/_helpers.tpl: maxNodeProvisionTime must be a whole number"),
            (json!({"version": "v1.30"}), "Kubernetes v1.30 is not supported by Talos v1.13.6"),
            (json!({"oidc": {"mode": "CustomConfig"}}), "templates/oidc-authn-config.yaml: spec.oidc.mode: CustomConfig requires either"),
            (json!({"oidc": {"mode": "CustomConfig", "customConfig": {"config": "a", "secretRef": {"name": "b"}}}}), "set exactly one of"),
            (json!({"addons": {"hami": {"enabled": true}}}), "templates/helmreleases/hami.yaml: addons.hami requires addons.gpuOperator"),
            (json!({"addons": {"ouroboros": {"enabled": true}}}), "templates/helmreleases/ouroboros.yaml: addons.ouroboros.enabled requires"),
            (json!({"addons": {"ouroboros": {"valuesOverride": {"ouroboros": {"controller": {"gatewayApi": {"enabled": "ON"}}}}}}}), "requires addons.gatewayAPI.enabled=true"),
        ] {
            let got = fails("main", extra.clone());
            assert!(got.iter().any(|f| f.starts_with(want) || f.contains(want)), "{extra}: {got:?}");
        }
        let oidc = |args: Value| {
            json!({"oidc": {"mode": "CustomConfig", "customConfig": {"secretRef": {"name": "s"}}},
            "controlPlane": {"apiServer": {"extraArgs": args}}})
        };
        assert!(fails("main", oidc(json!(["--oidc-issuer-url=x"])))[0].contains("legacy --oidc-* flags"));
        assert!(fails("main", oidc(json!(["--authentication-config=/x"])))[0].contains("already injects"));
        assert!(fails("main", oidc(json!(["--v=2"]))).is_empty());
        let mut none = oidc(json!(["--oidc-issuer-url=x"]));
        none["oidc"] = json!({"mode": "None"});
        assert!(fails("main", none).is_empty(), "OIDC off: the flags are the operator's");
        let addons = json!({"addons": {"hami": {"enabled": true}, "gpuOperator": {"enabled": true},
            "ouroboros": {"enabled": true, "valuesOverride": {"ouroboros": {"controller": {"gatewayApi": {"enabled": "off"}}}}},
            "ingressNginx": {"enabled": true}}});
        assert!(fails("main", addons).is_empty());
        // v1.6.2 has the volume checks and no duration check.
        assert!(!fails("v1.6.2", vols(json!({"extraVolumes": [{"name": "talos-ca", "secret": {}}]}))).is_empty());
        assert!(fails("v1.6.2", json!({"maxNodeProvisionTime": "0s"})).is_empty());
        assert_eq!(super::talos_minor("v1.13.6"), Some("v1.13"));
        assert_eq!(super::talos_minor("1.13"), None);
    }

    #[test]
    fn should_read_quantities_as_the_chart_does() {
        assert_eq!(to_float(&json!("4Gi")), 4.0 * 1_073_741_824.0);
        assert_eq!(to_float(&json!("1500m")), 1.5);
        assert_eq!(to_float(&json!("abc")), 0.0);
        assert_eq!(cpu_millis(&json!("250m")), 250.0);
        assert_eq!(cpu_millis(&json!(2)), 2000.0);
    }
}
