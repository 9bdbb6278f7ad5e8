//! One test per rule of §6 that has a renderer form, named after the rule.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use common::*;
use serde_json::json;
use tender_render::catalog::{parse_config, validate};
use tender_render::golden::render_catalog;
use tender_render::state::ClusterState;

fn assert_refused(text: &str, rule: &str, mentions: &[&str]) {
    assert!(text.starts_with(&format!("{rule}: ")), "expected {rule}, got: {text}");
    assert!(text.contains("fix: "), "no fix in: {text}");
    for m in mentions {
        assert!(text.contains(m), "{m:?} missing in: {text}");
    }
}

fn catalog_yaml(images: &str) -> String {
    format!("imageFactory: https://factory.talos.dev\ncatalog:\n  images:\n{images}")
}

fn catalog(images: &str, state: Option<&ClusterState>) -> Result<String, String> {
    let config = parse_config(&catalog_yaml(images)).map_err(|e| e.to_string())?;
    render_catalog(&config, None, state).map_err(|e| e.to_string())
}

const ENTRY: &str =
    "  - schematic: ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515\n    version: v1.13.6\n";

// ---- G: catalog -------------------------------------------------------------------------

#[test]
fn rule_g7_duplicate_catalog_entries_are_refused() {
    let err = catalog(&format!("{ENTRY}{ENTRY}"), None).unwrap_err();
    assert_refused(&err, "G-7", &["catalog.images[1]", "v1.13.6"]);
    // Another flavor of the same release is not a duplicate.
    let arm = format!("{ENTRY}{ENTRY}    arch: arm64\n");
    let out = catalog(&arm, None).unwrap();
    assert_eq!(docs(&out).len(), 2);
}

#[test]
fn rule_g8_catalog_names_no_pool_could_rebuild_are_refused() {
    for (schematic, version, field) in [
        ("CE4C", "v1.13.6", "schematic"),
        ("ce4c-1", "v1.13.6", "schematic"),
        ("", "v1.13.6", "schematic"),
        ("ce4c", "v1.13", "version"),
        ("ce4c", "1.13.6", "version"),
        ("ce4c", "v1.13.6-rc1", "version"),
        ("ce4c", "v1.13.6\nEOF", "version"),
    ] {
        let images = format!("  - schematic: {schematic:?}\n    version: {version:?}\n");
        let err = catalog(&images, None).unwrap_err();
        assert_refused(&err, "G-8", &[&format!("catalog.images[0].{field}")]);
    }
}

#[test]
fn rule_g9_editing_a_golden_that_exists_is_refused() {
    let live = healthy().build();
    // Unchanged: passes.
    let same = catalog(ENTRY, Some(&State::new().build())).unwrap();
    assert_eq!(docs(&same).len(), 1);
    assert!(catalog(ENTRY, Some(&live)).is_ok());
    for (edit, mentions) in [
        ("    storage: 8Gi\n", "storage \"6Gi\" -> \"8Gi\""),
        ("    storageClass: local\n", "storageClass \"replicated\" -> \"local\""),
        ("    format: qcow2\n", "source URL"),
    ] {
        let err = catalog(&format!("{ENTRY}{edit}"), Some(&live)).unwrap_err();
        assert_refused(&err, "G-9", &[mentions, GOLDEN]);
    }
    let config = parse_config(&catalog_yaml(ENTRY)).unwrap();
    let moved = render_catalog(&config, Some("http://tender:5000"), Some(&live)).unwrap_err().to_string();
    assert_refused(&moved, "G-9", &["source URL"]);
}

#[test]
fn rule_g9_golden_unchanged_from_the_live_one_passes() {
    let config = parse_config(&catalog_yaml(ENTRY)).unwrap();
    let first = render_catalog(&config, None, None).unwrap();
    // The cluster now holds exactly what was rendered.
    let mut live = docs(&first).remove(0);
    live["status"] = json!({"phase": "Succeeded"});
    let state = ClusterState::from_yaml(&serde_norway::to_string(&live).unwrap()).unwrap();
    assert_eq!(render_catalog(&config, None, Some(&state)).unwrap(), first);
}

#[test]
fn rule_g10_goldens_carry_resource_policy_keep() {
    let out = catalog(ENTRY, None).unwrap();
    let dv = doc_of_kind(&out, "DataVolume");
    assert_eq!(dv["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    assert_eq!(dv["metadata"]["namespace"], "cozy-public");
    assert_eq!(dv["metadata"]["name"], GOLDEN);
    assert_eq!(
        dv["spec"]["source"]["http"]["url"],
        format!("https://factory.talos.dev/image/{SCHEMATIC}/v1.13.6/openstack-amd64.raw.xz")
    );
}

#[test]
fn should_refuse_catalog_formats_cdi_cannot_import() {
    let err = catalog(&format!("{ENTRY}    format: raw.zst\n"), None).unwrap_err();
    assert!(err.contains("zstd") && err.contains("format"), "{err}");
    assert!(catalog(&format!("{ENTRY}    format: qcow2\n"), None).is_ok());
}

#[test]
fn should_import_goldens_from_the_source_url() {
    let config = parse_config(&catalog_yaml(ENTRY)).unwrap();
    let out = render_catalog(&config, Some("http://tender.kube-system.svc:5000/"), None).unwrap();
    assert_eq!(
        doc_of_kind(&out, "DataVolume")["spec"]["source"]["http"]["url"],
        format!("http://tender.kube-system.svc:5000/image/{SCHEMATIC}/v1.13.6/openstack-amd64.raw.xz")
    );
    let entries = validate(&config.catalog.unwrap()).unwrap();
    assert_eq!(entries[0].name(), GOLDEN);
}

// ---- P: the osImage selector ------------------------------------------------------------

#[test]
fn rule_p1_builtin_and_factory_together_are_refused() {
    let err = refusal(&pool_yaml("osImage:\n  builtin: {}\n  factory: {}\n"), None);
    assert_refused(&err, "P-1", &["osImage"]);
    // Present as null still counts as present.
    let err = refusal(&pool_yaml("osImage:\n  builtin:\n  factory:\n"), None);
    assert_refused(&err, "P-1", &[]);
}

#[test]
fn rule_p2_builtin_clones_the_golden_with_no_http_source() {
    let out = render(&pool_yaml(BUILTIN), Some(&healthy().build()));
    let d = disk(&out.text);
    assert_eq!(d["spec"]["source"], json!({"pvc": {"name": GOLDEN, "namespace": "cozy-public"}}));
    assert!(d["spec"]["source"].get("http").is_none());
    assert!(d["metadata"]["annotations"].get("cdi.kubevirt.io/storage.usePopulator").is_none());
}

#[test]
fn rule_p3_factory_pins_url_schematic_and_version_per_pool() {
    let yaml = pool_yaml(
        "osImage:\n  factory:\n    imageFactoryURL: http://tender.kube-system.svc:5000/\n    schematicID: abc123\n    version: v1.13.2\n",
    );
    let out = render(&yaml, None);
    assert_eq!(
        disk(&out.text)["spec"]["source"]["http"]["url"],
        "http://tender.kube-system.svc:5000/image/abc123/v1.13.2/openstack-amd64.raw.xz"
    );
}

#[test]
fn rule_p4_omitted_os_image_is_factory_fed_from_talos_values() {
    let omitted = render(&pool_yaml(""), None).text;
    assert_eq!(render(&pool_yaml("osImage:\n  factory: {}\n"), None).text, omitted);
    assert_eq!(render(&pool_yaml("osImage: {}\n"), None).text, omitted);
    let explicit = format!(
        "osImage:\n  factory:\n    imageFactoryURL: https://factory.talos.dev\n    schematicID: {SCHEMATIC}\n    version: v1.13.6\n"
    );
    assert_eq!(render(&pool_yaml(&explicit), None).text, omitted);
    assert_eq!(
        disk(&omitted)["spec"]["source"]["http"]["url"],
        format!("https://factory.talos.dev/image/{SCHEMATIC}/v1.13.6/openstack-amd64.raw.xz")
    );
}

#[test]
fn rule_p5_installer_and_talos_version_follow_the_effective_release() {
    for os_image in [
        "osImage:\n  factory:\n    schematicID: abc123\n    version: v1.13.2\n",
        "osImage:\n  builtin:\n    schematicID: abc123\n    version: v1.13.2\n",
    ] {
        let yaml = pool_yaml(&format!("talos:\n  installerRepository: registry.example/talos/installer/\n{os_image}"));
        let pool = tender_render::pool::parse(&yaml).unwrap().validate().unwrap();
        let out =
            tender_render::k8s::render_pool(&pool, None, true, tender_render::k8s::PoolFormat::Manifests).unwrap();
        let tct = doc_of_kind(&out.text, "TalosConfigTemplate");
        assert_eq!(tct["spec"]["template"]["spec"]["talosVersion"], "v1.13.2");
        let patch = docs(tct["spec"]["template"]["spec"]["strategicPatches"][0].as_str().unwrap()).remove(0);
        assert_eq!(patch["machine"]["install"]["image"], "registry.example/talos/installer/abc123:v1.13.2");
    }
}

#[test]
fn rule_p6_editing_os_image_renames_the_kmt() {
    let base = render(&pool_yaml(""), None).kmt_name.unwrap();
    let factory = render(&pool_yaml("osImage:\n  factory:\n    version: v1.13.2\n"), None).kmt_name.unwrap();
    let builtin = render(&pool_yaml(BUILTIN), Some(&healthy().build())).kmt_name.unwrap();
    assert_ne!(base, factory);
    assert_ne!(base, builtin);
    assert_ne!(factory, builtin);
}

#[test]
fn rule_p7_rerendering_a_healthy_builtin_pool_keeps_the_kmt_name() {
    for class in ["storageClass: replicated\n", "storageClass: \"\"\n"] {
        let yaml = pool_yaml(&format!("{BUILTIN}{class}"));
        let before = render(&yaml, Some(&healthy().build())).kmt_name.unwrap();
        let again = render(&yaml, Some(&healthy().build())).kmt_name.unwrap();
        // After the workers cloned (their disks exist, annotated for this pool):
        let cloned =
            healthy().cloned_disk("disk-system-kubernetes-test-md0-abcde", "kubernetes-test/md0", "replicated");
        let after = render(&yaml, Some(&cloned.build())).kmt_name.unwrap();
        assert_eq!(before, again);
        assert_eq!(before, after, "{class}");
    }
}

// ---- R: refusals ------------------------------------------------------------------------

#[test]
fn rule_r1_absent_golden_is_refused_for_a_pool_that_has_not_cloned() {
    let state = State::new().storage_class("replicated", true, "2024-01-01T00:00:00Z").build();
    assert_refused(&refusal(&pool_yaml(BUILTIN), Some(&state)), "R-1", &[GOLDEN, "cozy-public"]);
}

#[test]
fn rule_r2_failed_golden_is_refused_for_a_pool_that_has_not_cloned() {
    let state = State::new()
        .storage_class("replicated", true, "2024-01-01T00:00:00Z")
        .golden("Failed", Some("replicated"), "6Gi")
        .build();
    assert_refused(&refusal(&pool_yaml(BUILTIN), Some(&state)), "R-2", &[GOLDEN, "Failed"]);
}

#[test]
fn rule_r3_storage_class_mismatch_is_refused() {
    let state = healthy().build();
    let err = refusal(&pool_yaml(&format!("{BUILTIN}storageClass: local\n")), Some(&state));
    assert_refused(&err, "R-3", &["\"local\"", "\"replicated\"", "host-assisted"]);
    // No presence gate: an empty pool class resolves to the default and is still compared.
    let moved = State::new()
        .storage_class("local", true, "2024-01-01T00:00:00Z")
        .golden("Succeeded", Some("replicated"), "6Gi")
        .build();
    let err = refusal(&pool_yaml(&format!("{BUILTIN}storageClass: \"\"\n")), Some(&moved));
    assert_refused(&err, "R-3", &["\"local\"", "cluster default"]);
}

#[test]
fn rule_r4_disk_smaller_than_the_golden_is_refused() {
    let state = healthy().build();
    let err = refusal(&pool_yaml(&format!("{BUILTIN}diskSize: 4Gi\n")), Some(&state));
    assert_refused(&err, "R-4", &["diskSize", "4Gi", "6Gi"]);
    // Equal is allowed, in any unit.
    assert!(try_render(&pool_yaml(&format!("{BUILTIN}diskSize: 6144Mi\n")), Some(&state)).is_ok());
}

#[test]
fn rule_r5_support_matrix_refuses_a_known_bad_pairing_on_every_path() {
    for (extra, field) in [
        ("talos:\n  version: v1.11.6\n", "talos.version"),
        ("osImage:\n  factory:\n    version: v1.11.6\n", "osImage.factory.version"),
        ("osImage:\n  builtin:\n    version: v1.11.6\n", "osImage.builtin.version"),
    ] {
        let err = refusal(&pool_yaml(&format!("kubernetesVersion: v1.35\n{extra}")), Some(&healthy().build()));
        assert_refused(&err, "R-5", &[field, "v1.11.6", "v1.35"]);
    }
    assert!(try_render(&pool_yaml("kubernetesVersion: v1.34\ntalos:\n  version: v1.11.6\n"), None).is_ok());
}

#[test]
fn rule_r6_schematic_that_is_not_lowercase_alphanumeric_is_refused_on_every_path() {
    for (extra, field) in [
        ("talos:\n  schematicID: CE4C\n", "talos.schematicID"),
        ("osImage:\n  factory:\n    schematicID: ce4c/../x\n", "osImage.factory.schematicID"),
        ("osImage:\n  builtin:\n    schematicID: \"ce4c\\n\"\n", "osImage.builtin.schematicID"),
    ] {
        assert_refused(&refusal(&pool_yaml(extra), Some(&healthy().build())), "R-6", &[field]);
    }
}

#[test]
fn rule_r7_version_that_is_not_a_full_release_is_refused_on_every_path() {
    for (extra, field) in [
        ("talos:\n  version: v1.13\n", "talos.version"),
        ("osImage:\n  factory:\n    version: 1.13.6\n", "osImage.factory.version"),
        ("osImage:\n  builtin:\n    version: v1.13.6-beta.0\n", "osImage.builtin.version"),
    ] {
        assert_refused(&refusal(&pool_yaml(extra), Some(&healthy().build())), "R-7", &[field]);
    }
}

#[test]
fn rule_r8_empty_image_factory_url_is_refused() {
    for extra in [
        "talos:\n  imageFactoryURL: \"\"\n",
        "talos:\n  imageFactoryURL: /\n",
        "osImage:\n  factory:\n    imageFactoryURL: \"\"\n",
    ] {
        assert_refused(&refusal(&pool_yaml(extra), None), "R-8", &["imageFactoryURL", "empty"]);
    }
    assert_refused(&refusal(&pool_yaml("talos:\n  imageFactoryURL: factory.talos.dev\n"), None), "R-8", &["http"]);
}

// ---- N: what must not fail -----------------------------------------------------------------

#[test]
fn rule_n1_golden_mid_import_passes() {
    for phase in ["ImportScheduled", "ImportInProgress", "Pending", ""] {
        let state = State::new()
            .storage_class("replicated", true, "2024-01-01T00:00:00Z")
            .golden(phase, Some("replicated"), "6Gi")
            .build();
        assert!(try_render(&pool_yaml(BUILTIN), Some(&state)).is_ok(), "{phase}");
    }
}

#[test]
fn rule_n2_cloned_pool_survives_a_missing_or_failed_golden() {
    let base = State::new().storage_class("replicated", true, "2024-01-01T00:00:00Z");
    for state in [base.clone(), base.clone().golden("Failed", Some("replicated"), "6Gi")] {
        let cloned = state.cloned_disk("disk-system-kubernetes-test-md0-x1", "kubernetes-test/md0", "replicated");
        assert!(try_render(&pool_yaml(BUILTIN), Some(&cloned.build())).is_ok());
    }
}

#[test]
fn rule_n3_unlisted_talos_minor_passes() {
    for version in ["v1.14.0", "v1.10.9", "v2.0.0"] {
        let yaml = pool_yaml(&format!("kubernetesVersion: v1.31\ntalos:\n  version: {version}\n"));
        assert!(try_render(&yaml, None).is_ok(), "{version}");
    }
}

#[test]
fn rule_n4_cloned_pool_ignores_a_moved_cluster_default() {
    // The pool cloned on `replicated` while it was the default; an admin then made `local` the
    // (newer) default. The golden declares no class, so only the PVCs remember `replicated`.
    let state = State::new()
        .storage_class("replicated", false, "2024-01-01T00:00:00Z")
        .storage_class("local", true, "2025-01-01T00:00:00Z")
        .golden("Succeeded", None, "6Gi")
        .pvc("cozy-public", GOLDEN, "replicated")
        .cloned_disk("disk-system-kubernetes-test-md0-x1", "kubernetes-test/md0", "replicated");
    let out = render(&pool_yaml(&format!("{BUILTIN}storageClass: \"\"\n")), Some(&state.build()));
    assert_eq!(disk(&out.text)["spec"]["storage"]["storageClassName"], "replicated");
}

// ---- D: StorageClass resolution ---------------------------------------------------------------

#[test]
fn rule_d1_empty_class_resolves_to_the_cluster_default_on_both_sides() {
    // Golden without a class and without a PVC yet (mid-import): the default.
    let state = State::new()
        .storage_class("replicated", true, "2024-01-01T00:00:00Z")
        .golden("ImportInProgress", None, "6Gi")
        .build();
    let out = render(&pool_yaml(&format!("{BUILTIN}storageClass: \"\"\n")), Some(&state));
    assert_eq!(disk(&out.text)["spec"]["storage"]["storageClassName"], "replicated");
    // Classes, but no default: the empty pool class cannot be resolved. (No StorageClass at
    // all is an incomplete state, issue 22: tests/issue_22.rs.)
    let none = State::new()
        .storage_class("replicated", false, "2024-01-01T00:00:00Z")
        .golden("Succeeded", Some("replicated"), "6Gi")
        .build();
    let err = refusal(&pool_yaml(&format!("{BUILTIN}storageClass: \"\"\n")), Some(&none));
    assert_refused(&err, "D-1", &["storageClass"]);
}

#[test]
fn rule_d2_the_newest_default_class_wins() {
    let state = State::new()
        .storage_class("old-default", true, "2023-01-01T00:00:00Z")
        .storage_class("new-default", true, "2024-06-01T12:00:00Z")
        .storage_class("not-default", false, "2025-01-01T00:00:00Z")
        .build();
    assert_eq!(state.default_storage_class(), Some("new-default"));
    // Same timestamp: the name breaks the tie, as Kubernetes does.
    let tie = State::new()
        .storage_class("b", true, "2024-01-01T00:00:00Z")
        .storage_class("a", true, "2024-01-01T00:00:00Z")
        .build();
    assert_eq!(tie.default_storage_class(), Some("a"));
    let beta = ClusterState::from_yaml(
        "kind: List\nitems:\n- kind: StorageClass\n  metadata:\n    name: beta\n    creationTimestamp: \"2024-01-01T00:00:00Z\"\n    annotations:\n      storageclass.beta.kubernetes.io/is-default-class: \"true\"\n",
    )
    .unwrap();
    assert_eq!(beta.default_storage_class(), Some("beta"));
}

#[test]
fn rule_d3_golden_without_a_class_reads_its_pvc_not_the_default() {
    let state = State::new()
        .storage_class("local", true, "2025-01-01T00:00:00Z")
        .golden("Succeeded", None, "6Gi")
        .pvc("cozy-public", GOLDEN, "replicated")
        .build();
    assert!(try_render(&pool_yaml(&format!("{BUILTIN}storageClass: replicated\n")), Some(&state)).is_ok());
    let err = refusal(&pool_yaml(&format!("{BUILTIN}storageClass: local\n")), Some(&state));
    assert_refused(&err, "R-3", &["\"replicated\""]);
}

#[test]
fn rule_d4_cloned_pool_reads_its_own_bound_pvc_class() {
    let state = State::new()
        .storage_class("local", true, "2025-01-01T00:00:00Z")
        .golden("Succeeded", Some("replicated"), "6Gi")
        .cloned_disk("disk-system-kubernetes-test-md0-x1", "kubernetes-test/md0", "replicated")
        .build();
    let out = render(&pool_yaml(&format!("{BUILTIN}storageClass: \"\"\n")), Some(&state));
    assert_eq!(disk(&out.text)["spec"]["storage"]["storageClassName"], "replicated");
}

#[test]
fn rule_d5_builtin_disk_carries_the_resolved_class_even_when_the_pool_says_empty() {
    let out = render(&pool_yaml(&format!("{BUILTIN}storageClass: \"\"\n")), Some(&healthy().build()));
    assert_eq!(disk(&out.text)["spec"]["storage"]["storageClassName"], "replicated");
}

#[test]
fn rule_d6_http_disk_omits_an_empty_class() {
    let out = render(&pool_yaml("storageClass: \"\"\n"), Some(&healthy().build()));
    assert!(disk(&out.text)["spec"]["storage"].get("storageClassName").is_none());
    let out = render(&pool_yaml(""), None);
    assert_eq!(disk(&out.text)["spec"]["storage"]["storageClassName"], "replicated");
}

// ---- A: clone detection and annotations ------------------------------------------------------

#[test]
fn rule_a1_clone_detection_matches_the_pool_exactly_not_by_prefix() {
    // Only pool md0-gpu has cloned; md0 has not, so a missing golden still fails md0 ...
    let state = State::new()
        .storage_class("replicated", true, "2024-01-01T00:00:00Z")
        .cloned_disk("disk-system-kubernetes-test-md0-gpu-x1", "kubernetes-test/md0-gpu", "replicated")
        .build();
    assert_refused(&refusal(&pool_yaml(BUILTIN), Some(&state)), "R-1", &[]);
    // ... while md0-gpu itself passes.
    let gpu = "cluster: kubernetes-test\nnamespace: tenant-test\npool: md0-gpu\nosImage:\n  builtin: {}\n";
    assert!(try_render(gpu, Some(&state)).is_ok());
    // A disk in another namespace does not count either.
    let other_ns = State::new()
        .storage_class("replicated", true, "2024-01-01T00:00:00Z")
        .cloned_disk_in("tenant-other", "disk-system-kubernetes-test-md0-x1", "kubernetes-test/md0", "replicated")
        .build();
    assert_refused(&refusal(&pool_yaml(BUILTIN), Some(&other_ns)), "R-1", &[]);
}

#[test]
fn rule_a2_cloned_disk_names_its_golden_and_pool() {
    let out = render(&pool_yaml(BUILTIN), Some(&healthy().build()));
    let annotations = &disk(&out.text)["metadata"]["annotations"];
    assert_eq!(annotations["kubernetes-worker-image.cozystack.io/golden"], GOLDEN);
    assert_eq!(annotations["kubernetes-worker-image.cozystack.io/pool"], "kubernetes-test/md0");
}

// ---- U: values that now hard-fail at upgrade --------------------------------------------------

#[test]
fn rule_u1_values_that_never_booted_a_worker_fail_with_the_rule_and_fix() {
    for (extra, rule, value) in [
        ("talos:\n  version: v1.13\n", "R-7", "\"v1.13\""),
        ("talos:\n  schematicID: Not-A-Schematic\n", "R-6", "\"Not-A-Schematic\""),
        ("talos:\n  imageFactoryURL: \"\"\n", "R-8", "\"\""),
    ] {
        assert_refused(&refusal(&pool_yaml(extra), None), rule, &[value]);
    }
}

#[test]
fn should_exit_with_missing_state_for_builtin_without_cluster_state() {
    let err = try_render(&pool_yaml(BUILTIN), None).unwrap_err();
    assert!(matches!(err, tender_render::Error::MissingClusterState), "{err}");
    let pool = tender_render::pool::parse(&pool_yaml(BUILTIN)).unwrap().validate().unwrap();
    let out = tender_render::k8s::render_pool(&pool, None, true, tender_render::k8s::PoolFormat::Manifests).unwrap();
    assert_eq!(out.warnings.len(), 1);
}

#[test]
fn should_read_cozystack_empty_defaults_and_refuse_settings_tender_does_not_render() {
    assert!(try_render(
        &pool_yaml("kubelet: {}\nimages: {}\nroles: []\ngpus: []\nresources: {}\nversion: v1.34\n"),
        None
    )
    .is_ok());
    let err = refusal(&pool_yaml("kubelet:\n  kubeReservedCpu: 100m\n"), None);
    assert!(err.contains("kubelet.kubeReservedCpu") && err.contains("fix:"), "{err}");
    assert!(matches!(try_render(&pool_yaml("podCpuLimit: 2\n"), None), Err(tender_render::Error::Malformed { .. })));
}
