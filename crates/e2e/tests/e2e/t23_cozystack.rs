//! Issue 33: `tender render cozystack` through Cozystack's real `kubernetes-nodes` chart and its
//! `kubernetes` app chart with the real Helm, and the chart's reconcile Job run with a recording
//! kubectl
//! (`testdata/cozystack/run-reconcile-job.sh`): the values tender writes reach the worker's Talos
//! config and the DataVolume. Helm comes from `scripts/install-helm.sh`; a test that cannot
//! install it fails, it never skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use tender_e2e::paths::{tender_bin, workspace_root};
use tender_e2e::TestDir;

const MIRROR: &str = "http://tender.tender.svc:5000";
const HTTPS_MIRROR: &str = "https://tender.tender.svc:5443";
const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
const UPSTREAMS: [&str; 4] = ["docker.io", "ghcr.io", "registry.k8s.io", "factory.talos.dev"];

/// The directory holding `helm` and `kubectl`, from scripts/install-helm.sh; panics when the
/// script fails (offline without a cache): the round trip is never skipped silently.
pub(crate) fn helm_dir() -> PathBuf {
    let o = Command::new("bash").arg(workspace_root().join("scripts/install-helm.sh")).output().unwrap();
    assert!(o.status.success(), "scripts/install-helm.sh failed: {}", String::from_utf8_lossy(&o.stderr));
    PathBuf::from(String::from_utf8(o.stdout).unwrap().trim())
}

fn tender(args: &[&str]) -> Output {
    Command::new(tender_bin()).args(args).output().unwrap()
}

fn yaml_docs(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// tender's config: the upstreams whose mirrors the workers get.
fn config(dir: &Path) -> String {
    let mut c = String::from("upstreams:\n");
    for u in UPSTREAMS {
        c.push_str(&format!("- name: {u}\n  url: https://{u}\n"));
    }
    let p = dir.join("tender.yaml");
    std::fs::write(&p, c).unwrap();
    p.to_str().unwrap().to_string()
}

/// `render cozystack` for pool `md0` of cluster `demo`; the KubernetesNodes patch's `spec`.
fn render(dir: &Path, version: &str, mirror: &str, extra: &[&str]) -> (Output, Option<Value>) {
    render_kind(dir, version, mirror, &[&["--pool", "md0"], extra].concat(), "KubernetesNodes")
}

/// `render cozystack` for cluster `demo` (`extra` may name pools); the `kind` patch's `spec`.
fn render_kind(dir: &Path, version: &str, mirror: &str, extra: &[&str], kind: &str) -> (Output, Option<Value>) {
    let config = config(dir);
    let mut args = vec![
        "render",
        "cozystack",
        "--config",
        &config,
        "--mirror",
        mirror,
        "--cluster",
        "demo",
        "--namespace",
        "tenant-demo",
        "--os-image",
        "factory",
        "--cozystack",
        version,
    ];
    args.extend_from_slice(extra);
    let o = tender(&args);
    let spec = yaml_docs(&String::from_utf8_lossy(&o.stdout))
        .into_iter()
        .find(|d| d["kind"] == kind)
        .map(|d| d["spec"].clone());
    (o, spec)
}

/// The values `helm template` gets: the patch's spec over what the chart needs without a
/// cluster (FINDINGS.md, "Verified with the real Helm").
fn values_file(dir: &Path, spec: &Value) -> PathBuf {
    let mut v = serde_json::json!({
        "cluster": "demo",
        "_cluster": {"cluster-domain": "cozy.local"},
        "instanceType": "",
        "resources": {"cpu": "2", "memory": "4Gi"},
    });
    for (k, x) in spec.as_object().unwrap() {
        v[k] = x.clone();
    }
    let p = dir.join("values.yaml");
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
    p
}

/// The values the `kubernetes` app chart gets: the patch's spec over what the chart needs
/// without a cluster (the tenant's namespaces, one node group without an instance type, which
/// `helm template` cannot look up).
fn app_values_file(dir: &Path, spec: &Value) -> PathBuf {
    let mut v = serde_json::json!({
        "_cluster": {"cluster-domain": "cozy.local"},
        "_namespace": {"etcd": "tenant-root", "host": "example.org", "ingress": "tenant-root", "monitoring": "tenant-root"},
        "nodeGroups": {"md0": {"minReplicas": 1, "maxReplicas": 2, "instanceType": "", "diskSize": "20Gi",
            "resources": {"cpu": "2", "memory": "4Gi"}, "roles": ["ingress-nginx"]}},
    });
    for (k, x) in spec.as_object().unwrap() {
        v[k] = x.clone();
    }
    let p = dir.join("app-values.yaml");
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
    p
}

/// `helm template` of the vendored chart, then its reconcile Job; (the rendered objects, the
/// worker's Talos machine config).
fn round_trip(dir: &Path, chart_version: &str, spec: &Value) -> (Vec<Value>, Value) {
    chart_round_trip(dir, chart_version, "kubernetes-nodes", "kubernetes-nodes-demo-md0", &values_file(dir, spec))
}

/// [`round_trip`] through chart `chart` (under `packages/apps/`) as release `release`.
fn chart_round_trip(dir: &Path, chart_version: &str, chart: &str, release: &str, values: &Path) -> (Vec<Value>, Value) {
    let helm = helm_dir().join("helm");
    let chart = workspace_root().join(format!("testdata/cozystack/{chart_version}/packages/apps/{chart}"));
    let o = Command::new(&helm)
        .args(["template", release])
        .arg(&chart)
        .args(["--namespace", "tenant-demo", "-f"])
        .arg(values)
        .output()
        .unwrap();
    assert!(o.status.success(), "helm template: {}", String::from_utf8_lossy(&o.stderr));
    let rendered = dir.join("rendered.yaml");
    std::fs::write(&rendered, &o.stdout).unwrap();
    let out = dir.join("job");
    let o = Command::new("bash")
        .arg(workspace_root().join("testdata/cozystack/run-reconcile-job.sh"))
        .arg(&rendered)
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "run-reconcile-job.sh: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let talos: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".talos.yaml"))
        .collect();
    assert_eq!(talos.len(), 1, "one reconcile Job: {talos:?}");
    let machine: Value = serde_norway::from_str(&std::fs::read_to_string(&talos[0]).unwrap()).unwrap();
    (yaml_docs(&String::from_utf8_lossy(&std::fs::read(&rendered).unwrap())), machine)
}

/// The `disk-system` DataVolume's HTTP URL in the KubevirtMachineTemplate.
fn disk_url(objects: &[Value]) -> String {
    let kmt = objects.iter().find(|o| o["kind"] == "KubevirtMachineTemplate").expect("a KubevirtMachineTemplate");
    let dvs = &kmt["spec"]["template"]["spec"]["virtualMachineTemplate"]["spec"]["dataVolumeTemplates"];
    dvs.as_array().unwrap().iter().find_map(|d| d["spec"]["source"]["http"]["url"].as_str()).unwrap().to_string()
}

/// What v1.6.2 takes with `--allow-partial` and an HTTPS tender: no mirrors (it has no key for
/// them), the installer from tender's repository, the disk from tender.
fn assert_partial_v1_6_2(objects: &[Value], machine: &Value) {
    assert!(machine["machine"].get("registries").is_none_or(|r| r.get("mirrors").is_none()), "{machine}");
    let host = HTTPS_MIRROR.trim_start_matches("https://");
    assert_eq!(
        machine["machine"]["install"]["image"].as_str().unwrap(),
        format!("{host}/factory.talos.dev/installer/{SCHEMATIC}:v1.13.6")
    );
    assert_eq!(disk_url(objects), format!("{HTTPS_MIRROR}/image/{SCHEMATIC}/v1.13.6/openstack-amd64.raw.xz"));
}

#[test]
fn should_reach_the_workers_talos_config_and_disk_through_the_real_main_chart() {
    let dir = TestDir::new("cozystack-main");
    let (o, spec) = render(dir.path(), "main", MIRROR, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (objects, machine) = round_trip(dir.path(), "main-3c780acd4", &spec.unwrap());
    let mirrors = &machine["machine"]["registries"]["mirrors"];
    for u in UPSTREAMS {
        assert_eq!(mirrors[u]["endpoints"], serde_json::json!([MIRROR]), "{u}: {machine}");
    }
    // The installer keeps its repository and comes through tender by the factory.talos.dev mirror.
    let image = machine["machine"]["install"]["image"].as_str().unwrap();
    assert_eq!(image, format!("factory.talos.dev/installer/{SCHEMATIC}:v1.13.6"));
    assert!(mirrors["factory.talos.dev"]["endpoints"][0] == MIRROR);
    assert_eq!(disk_url(&objects), format!("{MIRROR}/image/{SCHEMATIC}/v1.13.6/openstack-amd64.raw.xz"));
}

#[test]
fn should_refuse_v1_6_2_without_allow_partial_and_land_disk_and_installer_with_it() {
    let dir = TestDir::new("cozystack-v1.6.2");
    let (o, spec) = render(dir.path(), "v1.6.2", HTTPS_MIRROR, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(spec.is_none(), "nothing is written on exit 1");
    assert!(err.contains("talos.registryMirrors") && err.contains("tender render registries"), "{err}");

    let (o, spec) = render(dir.path(), "v1.6.2", HTTPS_MIRROR, &["--allow-partial"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("talos.registryMirrors"));
    let (objects, machine) = round_trip(dir.path(), "v1.6.2", &spec.unwrap());
    assert_partial_v1_6_2(&objects, &machine);

    // A plain-HTTP tender: the installer cannot move on v1.6.2 (the workers pull over HTTPS).
    let (o, _) = render(dir.path(), "v1.6.2", MIRROR, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("installer") && err.contains("HTTPS"), "{err}");
}

/// The `Kubernetes` app's own node groups (no `--pool`): the patch through the real
/// `kubernetes` chart reaches its reconcile Job's Talos config (mirrors for every upstream, the
/// installer through tender's factory.talos.dev mirror) and each node group's disk, on main;
/// on v1.6.2, with `--allow-partial`, the disk and the installer land and no mirrors.
#[test]
fn should_reach_the_workers_through_the_real_kubernetes_app_chart() {
    let dir = TestDir::new("cozystack-app");
    let (o, spec) = render_kind(dir.path(), "main", MIRROR, &[], "Kubernetes");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let values = app_values_file(dir.path(), &spec.unwrap());
    let (objects, machine) = chart_round_trip(dir.path(), "main-3c780acd4", "kubernetes", "kubernetes-demo", &values);
    let mirrors = &machine["machine"]["registries"]["mirrors"];
    for u in UPSTREAMS {
        assert_eq!(mirrors[u]["endpoints"], serde_json::json!([MIRROR]), "{u}: {machine}");
    }
    let image = machine["machine"]["install"]["image"].as_str().unwrap();
    assert_eq!(image, format!("factory.talos.dev/installer/{SCHEMATIC}:v1.13.6"));
    assert_eq!(disk_url(&objects), format!("{MIRROR}/image/{SCHEMATIC}/v1.13.6/openstack-amd64.raw.xz"));

    let old = dir.path().join("v1.6.2");
    std::fs::create_dir_all(&old).unwrap();
    let (o, spec) = render_kind(&old, "v1.6.2", HTTPS_MIRROR, &["--allow-partial"], "Kubernetes");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let values = app_values_file(&old, &spec.unwrap());
    let (objects, machine) = chart_round_trip(&old, "v1.6.2", "kubernetes", "kubernetes-demo", &values);
    assert_partial_v1_6_2(&objects, &machine);
}

/// `--values-schema` with the ApplicationDefinition as kubectl prints it gives what the
/// carried schema gives.
#[test]
fn should_take_the_application_definition_as_the_values_schema() {
    let dir = TestDir::new("cozystack-appdef");
    let schema = std::fs::read_to_string(
        workspace_root().join("testdata/cozystack/schemas/kubernetes-nodes/main-3c780acd4.json"),
    )
    .unwrap();
    let ad = serde_json::json!({"apiVersion": "cozystack.io/v1alpha1", "kind": "ApplicationDefinition",
        "metadata": {"name": "kubernetes"}, "spec": {"application": {"kind": "Kubernetes", "openAPISchema": schema}}});
    let ad_path = dir.path().join("ad.yaml");
    std::fs::write(&ad_path, serde_norway::to_string(&ad).unwrap()).unwrap();
    let config = config(dir.path());
    let o = tender(&[
        "render",
        "cozystack",
        "--config",
        &config,
        "--mirror",
        MIRROR,
        "--cluster",
        "demo",
        "--namespace",
        "tenant-demo",
        "--pool",
        "md0",
        "--os-image",
        "factory",
        "--values-schema",
        ad_path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, carried) = render(dir.path(), "main", MIRROR, &[]);
    let from_file =
        yaml_docs(&String::from_utf8_lossy(&o.stdout)).into_iter().find(|d| d["kind"] == "KubernetesNodes").unwrap();
    assert_eq!(from_file["spec"], carried.unwrap());
}
