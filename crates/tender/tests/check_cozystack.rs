//! `tender check cozystack` (issue 22, item 4): every seed rule that needs no HelmRelease, applied
//! to Cozystack's own values — one named test per rule, each in text and in JSON — and the
//! `tender render cozystack` command line (item 3).
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::process::Command;

mod cli_support;
use cli_support::{tender, write};

use serde_json::{json, Value};

const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
const GOLDEN: &str = "talos-worker-ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515-v1.13.6";
const FACTORY: &str = "http://tender.cozy-tender.svc:5000";

/// A `KubernetesNodes` pool `md1` of cluster `test`, with `spec` lines appended.
fn nodes(spec: &str) -> String {
    let spec: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    format!("apiVersion: apps.cozystack.io/v1alpha1\nkind: KubernetesNodes\nmetadata:\n  name: test-md1\n  namespace: tenant-test\nspec:\n  cluster: test\n{spec}")
}

const BUILTIN: &str = "osImage:\n  builtin: {}";

/// A cluster state, as kubectl prints it.
#[derive(Default, Clone)]
struct State(Vec<Value>);

impl State {
    fn class(mut self, name: &str, default: bool, created: &str) -> Self {
        let mut sc = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name, "creationTimestamp": created}});
        if default {
            sc["metadata"]["annotations"] = json!({"storageclass.kubernetes.io/is-default-class": "true"});
        }
        self.0.push(sc);
        self
    }
    fn golden(mut self, phase: &str, class: Option<&str>, storage: &str) -> Self {
        let mut st = json!({"resources": {"requests": {"storage": storage}}});
        if let Some(c) = class {
            st["storageClassName"] = json!(c);
        }
        let url = format!("{FACTORY}/image/{SCHEMATIC}/v1.13.6/openstack-amd64.raw.xz");
        self.0.push(json!({"kind": "DataVolume", "metadata": {"name": GOLDEN, "namespace": "cozy-public"},
            "spec": {"source": {"http": {"url": url}}, "storage": st}, "status": {"phase": phase}}));
        self
    }
    fn pvc(mut self, ns: &str, name: &str, class: &str) -> Self {
        self.0.push(json!({"kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": ns},
            "spec": {"storageClassName": class}, "status": {"phase": "Bound"}}));
        self
    }
    fn cloned(mut self, name: &str, pool_annotation: &str, class: &str) -> Self {
        self.0.push(json!({"kind": "DataVolume", "metadata": {"name": name, "namespace": "tenant-test", "annotations": {
            "kubernetes-worker-image.cozystack.io/golden": GOLDEN, "kubernetes-worker-image.cozystack.io/pool": pool_annotation}},
            "spec": {"source": {"pvc": {"name": GOLDEN, "namespace": "cozy-public"}}}, "status": {"phase": "Succeeded"}}));
        self.pvc("tenant-test", name, class)
    }
    fn yaml(&self) -> String {
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": self.0})).unwrap()
    }
}

fn healthy() -> State {
    State::default()
        .class("replicated", true, "2024-01-01T00:00:00Z")
        .class("local", false, "2024-01-01T00:00:00Z")
        .golden("Succeeded", Some("replicated"), "6Gi")
}

/// The check, in text and in JSON: (exit code, text, JSON report).
struct Checked {
    code: i32,
    text: String,
    json: Value,
}

fn check_with(input: &str, state: &State, extra: &[&str]) -> Checked {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "in.yaml", input);
    let s = write(dir.path(), "state.yaml", &state.yaml());
    // The rules pinned here are the golden-catalog design's (osImage), so that is the target.
    let mut args = vec!["check", "cozystack", "-f", &f, "--cluster-state", &s, "--cozystack", "golden-catalog"];
    args.extend_from_slice(extra);
    let text = tender(&args, None);
    args.extend_from_slice(&["--output", "json"]);
    let json = tender(&args, None);
    assert_eq!(text.status.code(), json.status.code(), "text and JSON exit alike");
    let code = text.status.code().unwrap();
    assert!(code <= 1, "exit {code}: {}", String::from_utf8_lossy(&text.stderr));
    Checked { code, text: String::from_utf8(text.stdout).unwrap(), json: serde_json::from_slice(&json.stdout).unwrap() }
}

fn check(input: &str, state: &State) -> Checked {
    check_with(input, state, &[])
}

/// Exit 1 naming the rule (text and JSON), the field and a fix.
fn assert_refused(c: &Checked, rule: &str, field: &str) {
    assert_eq!(c.code, 1, "{}", c.text);
    assert!(c.text.contains(rule) && c.text.contains(field) && c.text.contains("fix: "), "{}", c.text);
    assert_eq!(c.json["ok"], false);
    let f = &c.json["findings"][0];
    assert!(f["rules"].as_array().unwrap().contains(&json!(rule)), "{}", c.json);
    assert!(f["field"].as_str().unwrap().contains(field), "{}", c.json);
    assert!(!f["fix"].as_str().unwrap().is_empty());
}

/// Exit 0; the pool's resolved class, in text and JSON.
fn assert_passes(c: &Checked, class: &str) {
    assert_eq!(c.code, 0, "{}", c.text);
    assert_eq!(c.json["ok"], true, "{}", c.json);
    assert_eq!(c.json["pools"][0]["storageClass"], class, "{}", c.json);
    let shown = if class.is_empty() { "the cluster default (omitted)" } else { class };
    assert!(c.text.contains(&format!("storageClass {shown}")), "{}", c.text);
}

// ---- R: refusals ------------------------------------------------------------------------------

#[test]
fn rule_r1_builtin_with_an_absent_golden_is_refused() {
    let c = check(&nodes(BUILTIN), &State::default().class("replicated", true, "2024-01-01T00:00:00Z"));
    assert_refused(&c, "R-1", "osImage.builtin");
}

#[test]
fn rule_r2_builtin_with_a_failed_golden_is_refused() {
    let state =
        State::default().class("replicated", true, "2024-01-01T00:00:00Z").golden("Failed", Some("replicated"), "6Gi");
    assert_refused(&check(&nodes(BUILTIN), &state), "R-2", "osImage.builtin");
}

#[test]
fn rule_r3_builtin_on_another_storage_class_is_refused() {
    assert_refused(&check(&nodes(&format!("{BUILTIN}\nstorageClass: local")), &healthy()), "R-3", "storageClass");
}

#[test]
fn rule_r4_builtin_smaller_than_the_golden_is_refused() {
    assert_refused(&check(&nodes(&format!("{BUILTIN}\ndiskSize: 4Gi")), &healthy()), "R-4", "diskSize");
}

#[test]
fn rule_r5_a_talos_release_outside_the_support_matrix_is_refused() {
    let c = check(&nodes("version: v1.35\nosImage:\n  factory:\n    version: v1.11.5"), &healthy());
    assert_refused(&c, "R-5", "osImage.factory.version");
}

#[test]
fn rule_r6_a_schematic_that_is_not_lowercase_alphanumeric_is_refused() {
    assert_refused(&check(&nodes("talos:\n  schematicID: CE4C"), &healthy()), "R-6", "talos.schematicID");
}

#[test]
fn rule_r7_a_version_that_is_not_major_minor_patch_is_refused() {
    assert_refused(&check(&nodes("talos:\n  version: v1.13"), &healthy()), "R-7", "talos.version");
}

#[test]
fn rule_r8_an_empty_image_factory_url_is_refused() {
    assert_refused(&check(&nodes("talos:\n  imageFactoryURL: ''"), &healthy()), "R-8", "talos.imageFactoryURL");
}

// ---- D: StorageClass resolution --------------------------------------------------------------

#[test]
fn rule_d1_an_empty_class_resolves_to_the_cluster_default() {
    assert_passes(&check(&nodes(&format!("{BUILTIN}\nstorageClass: ''")), &healthy()), "replicated");
    let no_default = State::default().class("replicated", false, "2024-01-01T00:00:00Z").golden(
        "Succeeded",
        Some("replicated"),
        "6Gi",
    );
    assert_refused(&check(&nodes(&format!("{BUILTIN}\nstorageClass: ''")), &no_default), "D-1", "storageClass");
}

#[test]
fn rule_d2_the_newest_default_class_wins() {
    let state = State::default()
        .class("old", true, "2023-01-01T00:00:00Z")
        .class("replicated", true, "2024-06-01T00:00:00Z")
        .golden("Succeeded", Some("replicated"), "6Gi");
    assert_passes(&check(&nodes(&format!("{BUILTIN}\nstorageClass: ''")), &state), "replicated");
}

#[test]
fn rule_d3_a_golden_without_a_class_is_read_from_its_pvc() {
    // The default moved to local after the golden bound on replicated.
    let state = State::default()
        .class("replicated", false, "2024-01-01T00:00:00Z")
        .class("local", true, "2025-01-01T00:00:00Z")
        .golden("Succeeded", None, "6Gi")
        .pvc("cozy-public", GOLDEN, "replicated");
    assert_passes(&check(&nodes(&format!("{BUILTIN}\nstorageClass: replicated")), &state), "replicated");
    let c = check(&nodes(&format!("{BUILTIN}\nstorageClass: local")), &state);
    assert_refused(&c, "R-3", "storageClass");
    assert!(c.text.contains("\\\"replicated\\\"") || c.text.contains("replicated"), "{}", c.text);
}

#[test]
fn rule_d4_a_cloned_pool_reads_its_own_disks_class() {
    let state = State::default()
        .class("replicated", false, "2024-01-01T00:00:00Z")
        .class("local", true, "2025-01-01T00:00:00Z")
        .golden("Succeeded", Some("replicated"), "6Gi")
        .cloned("disk-system-a", "kubernetes-test/md1", "replicated");
    assert_passes(&check(&nodes(&format!("{BUILTIN}\nstorageClass: ''")), &state), "replicated");
}

#[test]
fn rule_d5_the_resolved_class_is_the_one_the_worker_disk_gets() {
    let c = check(&nodes(&format!("{BUILTIN}\nstorageClass: ''")), &healthy());
    assert_passes(&c, "replicated");
    assert_eq!(c.json["pools"][0]["source"], "builtin");
    assert_eq!(c.json["pools"][0]["golden"], format!("cozy-public/{GOLDEN}"));
}

#[test]
fn rule_d6_an_empty_class_on_the_http_path_is_omitted() {
    let c = check(&nodes("storageClass: ''"), &healthy());
    assert_passes(&c, "");
    assert_eq!(c.json["pools"][0]["source"], "factory");
}

// ---- N: what must not fail -------------------------------------------------------------------

#[test]
fn rule_n1_a_golden_mid_import_passes() {
    let state = State::default().class("replicated", true, "2024-01-01T00:00:00Z").golden(
        "ImportInProgress",
        Some("replicated"),
        "6Gi",
    );
    assert_passes(&check(&nodes(BUILTIN), &state), "replicated");
}

#[test]
fn rule_n2_a_cloned_pool_passes_without_its_golden() {
    let state = State::default().class("replicated", true, "2024-01-01T00:00:00Z").cloned(
        "disk-system-a",
        "kubernetes-test/md1",
        "replicated",
    );
    assert_passes(&check(&nodes(BUILTIN), &state), "replicated");
}

#[test]
fn rule_n3_an_unlisted_talos_minor_passes() {
    let c = check(&nodes("osImage:\n  factory:\n    version: v1.14.0"), &healthy());
    assert_passes(&c, "replicated");
}

#[test]
fn rule_n4_a_cloned_pool_passes_after_the_default_class_moved() {
    let state = State::default()
        .class("replicated", true, "2024-01-01T00:00:00Z")
        .class("local", true, "2025-06-01T00:00:00Z")
        .golden("Succeeded", Some("replicated"), "6Gi")
        .cloned("disk-system-a", "kubernetes-test/md1", "replicated");
    assert_passes(&check(&nodes(&format!("{BUILTIN}\nstorageClass: ''")), &state), "replicated");
}

// ---- A: clone detection -----------------------------------------------------------------------

#[test]
fn rule_a1_only_a_disk_naming_exactly_this_pool_counts_as_cloned() {
    let base = State::default().class("replicated", true, "2024-01-01T00:00:00Z");
    // md1-gpu's disks start with md1 but are not md1's: md1 has not cloned, so R-1 applies.
    let other = base.clone().cloned("disk-system-md1-gpu-a", "kubernetes-test/md1-gpu", "replicated");
    assert_refused(&check(&nodes(BUILTIN), &other), "R-1", "osImage.builtin");
    let own = base.cloned("disk-system-a", "kubernetes-test/md1", "replicated");
    assert_passes(&check(&nodes(BUILTIN), &own), "replicated");
}

// ---- G: the catalog values --------------------------------------------------------------------

fn catalog(values: &str, state: &State) -> Checked {
    let dir = tempfile::tempdir().unwrap();
    let v = write(dir.path(), "values.yaml", values);
    check_with(&nodes(""), state, &["--catalog-values", &v])
}

fn package(images: &str, storage: &str) -> String {
    format!(
        "apiVersion: cozystack.io/v1alpha1\nkind: Package\nmetadata:\n  name: cozystack.cozystack-platform\nspec:\n  components:\n    platform:\n      values:\n        kubernetesWorkerImage:\n          imageFactoryURL: {FACTORY}\n          storageClass: replicated\n          storage: {storage}\n          images:\n{images}"
    )
}

const ENTRY: &str = "          - schematicID: ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515\n            version: v1.13.6\n";

#[test]
fn rule_g7_duplicate_catalog_entries_are_refused() {
    let c = catalog(&package(&format!("{ENTRY}{ENTRY}"), "6Gi"), &healthy());
    assert_refused(&c, "G-7", "kubernetesWorkerImage.images[1].schematicID");
    let ok = catalog(&package(ENTRY, "6Gi"), &healthy());
    assert_eq!(ok.code, 0, "{}", ok.text);
    assert!(ok.text.contains("G-7, G-8 and G-9"), "{}", ok.text);
}

#[test]
fn rule_g8_catalog_names_no_pool_could_rebuild_are_refused() {
    let bad = "          - schematicID: ce4c\n            version: v1.13\n";
    assert_refused(&catalog(&package(bad, "6Gi"), &healthy()), "G-8", "kubernetesWorkerImage.images[0].version");
}

#[test]
fn rule_g9_editing_a_golden_that_exists_is_refused() {
    assert_refused(&catalog(&package(ENTRY, "8Gi"), &healthy()), "G-9", "kubernetesWorkerImage.images[0]");
}

// ---- U: upgrade -----------------------------------------------------------------------------

#[test]
fn rule_u1_values_that_fail_at_the_platform_upgrade_say_so() {
    for (spec, rule) in [
        ("talos:\n  version: v1.13", "R-7"),
        ("talos:\n  schematicID: Not-Lower", "R-6"),
        ("talos:\n  imageFactoryURL: ''", "R-8"),
    ] {
        let c = check(&nodes(spec), &healthy());
        assert_refused(&c, "U-1", "talos.");
        assert_eq!(c.json["findings"][0]["rules"], json!([rule, "U-1"]), "{}", c.json);
        assert!(c.text.contains("InstallFailed"), "{}", c.text);
    }
    // A pool pinning a bad version through osImage is R-7, not an upgrade failure of talos.*.
    let c = check(&nodes("osImage:\n  factory:\n    version: v1.13"), &healthy());
    assert_eq!(c.json["findings"][0]["rules"], json!(["R-7"]), "{}", c.json);
}

// ---- the command line -------------------------------------------------------------------------

#[test]
fn should_accept_every_listed_key_and_refuse_an_undeclared_one() {
    // Sized by resources: the chart refuses podCpuLimit beside instanceType sizing (issue 33 (3)).
    let listed = nodes("resources: {cpu: 2, memory: 4Gi}\npodCpuLimit: 2\npodCpuRequest: 1\nimages:\n  kubectl: ''\nkubelet:\n  evictionHardMemory: 7%\nlogSerialConsole: false\nminReplicas: 0\nmaxReplicas: 3\nroles: [ingress-nginx]\ngpus: []\nmaxUnhealthy: 50%\ntalos:\n  registryMirrors:\n    docker.io:\n      endpoints: [http://m.example]");
    let c = check(&listed, &healthy());
    assert_eq!(c.code, 0, "{}", c.text);
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "in.yaml", &nodes("talos:\n  schematicId: x"));
    let s = write(dir.path(), "state.yaml", &healthy().yaml());
    let o = tender(&["check", "cozystack", "-f", &f, "--cluster-state", &s], None);
    // A key the target's chart does not declare: a finding (Helm would drop it silently).
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("spec.talos.schematicId \"\" is not a key of the chart"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn should_exit_2_naming_the_flag_without_cluster_state() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "in.yaml", &nodes(""));
    let o = tender(&["check", "cozystack", "-f", &f], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--cluster-state"));
}

#[test]
fn should_check_every_node_group_of_a_kubernetes_resource_and_a_values_file() {
    let k8s = "apiVersion: apps.cozystack.io/v1alpha1\nkind: Kubernetes\nmetadata:\n  name: test\n  namespace: tenant-test\nspec:\n  storageClass: replicated\n  version: v1.35\n  nodeGroups:\n    md0:\n      minReplicas: 0\n      maxReplicas: 10\n      diskSize: 20Gi\n      instanceType: u1.medium\n    gpu:\n      minReplicas: 0\n      maxReplicas: 1\n      diskSize: 20Gi\n      instanceType: u1.medium\n      storageClass: nope-\n";
    let c = check(k8s, &healthy());
    assert_eq!(c.code, 1, "{}", c.text);
    assert!(
        c.text.contains("nodeGroups.gpu") && c.text.contains("ok: tenant-test/Kubernetes test nodeGroups.md0"),
        "{}",
        c.text
    );
    // The same pool as a values file, named by the flags.
    let values = "cluster: test\nstorageClass: ''\n";
    let c = check_with(values, &healthy(), &["--name", "test-md1", "--namespace", "tenant-test"]);
    assert_passes(&c, "");
}

#[test]
fn should_render_cozystack_patches_and_write_them_for_kubectl_patch() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "tender.yaml",
        &format!("upstreams:\n- name: ghcr.io\n  url: https://ghcr.io\ncatalog:\n  images:\n  - schematicID: {SCHEMATIC}\n    version: v1.13.6\n"),
    );
    let out = dir.path().join("patches");
    let o = tender(
        &[
            "render",
            "cozystack",
            "--config",
            &config,
            "--mirror",
            FACTORY,
            "--cluster",
            "test",
            "--namespace",
            "tenant-test",
            "--pool",
            "md1",
            "--os-image",
            "factory",
            "--cozystack",
            "golden-catalog",
            "--out",
            out.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("re-images pool md1 (P-6)"));
    let listed = String::from_utf8(o.stdout).unwrap();
    for f in ["kubernetes-test.yaml", "kubernetesnodes-test-md1.yaml", "package-cozystack-platform.yaml"] {
        assert!(listed.contains(f), "{listed}");
        assert!(out.join(f).exists());
    }
    // Usage errors exit 2: --pool without --cluster, a URL with credentials.
    let o = tender(&["render", "cozystack", "--config", &config, "--mirror", FACTORY, "--pool", "md1"], None);
    assert_eq!(o.status.code(), Some(2));
    let o = tender(&["render", "cozystack", "--config", &config, "--mirror", "http://u:p@m.example"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("credentials"));
}

/// docs/render.md, "Using tender with Cozystack": every `tender` line runs, in order, and
/// exits 0; every `--patch-file` a `kubectl` line names was written by them.
#[test]
fn should_run_every_tender_command_of_the_cozystack_guide() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/render.md")).unwrap();
    let section = doc.split("## Using tender with Cozystack").nth(1).expect("the section exists");
    let section = section.split("\n## ").next().unwrap();
    let mut lines = Vec::new();
    let mut in_sh = false;
    for l in section.lines() {
        match l.trim() {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            l if in_sh && !l.is_empty() => lines.push(l.split("  #").next().unwrap().trim().to_string()),
            _ => {}
        }
    }
    let tender_lines: Vec<&String> = lines.iter().filter(|l| l.starts_with("tender ")).collect();
    assert!(tender_lines.len() >= 5, "{lines:?}");

    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "tender.yaml",
        &format!("listen: 0.0.0.0:5000\nupstreams:\n- name: docker.io\n  url: https://registry-1.docker.io\n- name: ghcr.io\n  url: https://ghcr.io\ncatalog:\n  images:\n  - schematicID: {SCHEMATIC}\n    version: v1.13.6\n    storage: 6Gi\n    storageClass: replicated\n"),
    );
    write(dir.path(), "kubernetes-test.yaml", "apiVersion: apps.cozystack.io/v1alpha1\nkind: Kubernetes\nmetadata:\n  name: test\n  namespace: tenant-test\nspec:\n  version: v1.35\n  storageClass: replicated\n");
    write(dir.path(), "kubernetesnodes-test-md1.yaml", &nodes(&format!("{BUILTIN}\nstorageClass: replicated")));
    write(dir.path(), "state.yaml", &healthy().yaml());
    for line in &tender_lines {
        let args: Vec<&str> = line.split_whitespace().skip(1).collect();
        let o = Command::new(env!("CARGO_BIN_EXE_tender")).args(&args).current_dir(dir.path()).output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{line}\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    for line in lines.iter().filter(|l| l.starts_with("kubectl ")) {
        if let Some(file) = line.split_whitespace().skip_while(|w| *w != "--patch-file").nth(1) {
            assert!(dir.path().join(file).exists(), "{line}: {file} was not written");
        }
    }
}
