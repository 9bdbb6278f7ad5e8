//! Regressions pinned by issue 22 ("Render for Cozystack as it is"): YAML every reader parses
//! the same, names Kubernetes accepts, incomplete state said rather than guessed, the
//! autoscaler's capacity annotations, and messages that name the field and the fix.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use common::*;
use tender_render::catalog::parse_config;
use tender_render::golden::render_catalog;

// ---- 1. YAML every reader parses the same ------------------------------------------------

#[test]
fn issue_22_should_quote_strings_a_yaml11_reader_takes_for_something_else() {
    let yaml =
        "cluster: off\nnamespace: 'on'\npool: md0\nstorageClass: 'no'\ninstanceType: '0.5'\ngpus:\n- name: '1_000'\n";
    let out = render(yaml, None).text;
    for bare in [": on\n", ": off\n", ": no\n", ": 0.5\n", ": 1_000\n", "pciAddress: 0000:07:00.0\n"] {
        assert!(!out.contains(bare), "{bare:?} is bare in:\n{out}");
    }
    let d = docs(&out);
    assert_eq!(d[0]["metadata"]["namespace"], "on");
    assert_eq!(d[1]["spec"]["clusterName"], "off");
}

// ---- 2. Names Kubernetes accepts ------------------------------------------------------------

#[test]
fn issue_22_should_refuse_a_golden_name_longer_than_a_dns_subdomain() {
    let long = "a".repeat(240);
    let config = format!("catalog:\n  images:\n  - schematic: {long}\n    version: v1.13.6\n");
    let err = render_catalog(&parse_config(&config).unwrap(), None, None).unwrap_err().to_string();
    assert!(err.contains("catalog.images[0].schematic") && err.contains("253"), "{err}");

    let pool = pool_yaml(&format!("osImage:\n  builtin:\n    schematicID: {long}\n"));
    let err = refusal(&pool, Some(&healthy().build()));
    assert!(err.contains("osImage.builtin.schematicID") && err.contains("253"), "{err}");
}

// ---- 5. Incomplete state is said, not guessed -----------------------------------------------

#[test]
fn issue_22_should_say_a_succeeded_golden_without_its_pvc_is_incomplete_state() {
    let state = State::new().storage_class("replicated", true, "2024-01-01T00:00:00Z").golden("Succeeded", None, "6Gi");
    let err = try_render(&pool_yaml(BUILTIN), Some(&state.build())).unwrap_err();
    assert!(matches!(err, tender_render::Error::IncompleteState { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("PersistentVolumeClaim") && text.contains("kubectl get persistentvolumeclaims -n cozy-public")
    );
}

#[test]
fn issue_22_should_say_a_cloned_pool_without_its_pvcs_is_incomplete_state() {
    let mut state = healthy();
    state = state.cloned_disk("disk-system-a", "kubernetes-test/md0", "replicated");
    let yaml = state.yaml().replace("kind: PersistentVolumeClaim", "kind: Ignored");
    let err = try_render(&pool_yaml(BUILTIN), Some(&tender_render::state::ClusterState::from_yaml(&yaml).unwrap()))
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, tender_render::Error::IncompleteState { .. }), "{text}");
    assert!(text.contains("kubectl get persistentvolumeclaims -n tenant-test"), "{text}");
}

#[test]
fn issue_22_should_say_a_state_without_storage_classes_is_incomplete() {
    let state = State::new().golden("Succeeded", Some("replicated"), "6Gi");
    let err = try_render(&pool_yaml(BUILTIN), Some(&state.build())).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, tender_render::Error::IncompleteState { .. }), "{text}");
    assert!(text.contains("StorageClass") && text.contains("kubectl get storageclasses"), "{text}");
}

// ---- 6. Cluster API: the autoscaler's capacity annotations ----------------------------------

#[test]
fn issue_22_should_annotate_the_machine_deployment_with_known_capacity() {
    let out = render(&pool_yaml("resources:\n  cpu: 2\n  memory: 4Gi\n"), None).text;
    let md = doc_of_kind(&out, "MachineDeployment");
    let a = &md["metadata"]["annotations"];
    assert_eq!(a["capacity.cluster-autoscaler.kubernetes.io/cpu"], "2");
    assert_eq!(a["capacity.cluster-autoscaler.kubernetes.io/memory"], "4Gi");
    let sized_by_type = doc_of_kind(&render(&pool_yaml(""), None).text, "MachineDeployment");
    assert!(sized_by_type["metadata"]["annotations"].get("capacity.cluster-autoscaler.kubernetes.io/cpu").is_none());
}

#[test]
fn issue_22_should_divide_the_ephemeral_storage_request_by_the_ratio() {
    let out = render(&pool_yaml("ephemeralStorageAllocationRatio: 40\n"), None).text;
    let kmt = doc_of_kind(&out, "KubevirtMachineTemplate");
    let r =
        &kmt["spec"]["template"]["spec"]["virtualMachineTemplate"]["spec"]["template"]["spec"]["domain"]["resources"];
    assert_eq!(r["limits"]["ephemeral-storage"], "2Gi");
    assert_eq!(r["requests"]["ephemeral-storage"], "53687091");
    // Ratio 1 (the default) keeps the pinned template, and so the KMT name.
    let plain = render(&pool_yaml(""), None).kmt_name;
    assert_eq!(render(&pool_yaml("ephemeralStorageAllocationRatio: 1\n"), None).kmt_name, plain);
}

// ---- 7. Messages that name the field and the fix --------------------------------------------

#[test]
fn issue_22_should_explain_a_fractional_cpu() {
    let err = refusal(&pool_yaml("resources:\n  cpu: 2.5\n  memory: 4Gi\n"), None);
    assert!(err.contains("resources.cpu") && err.contains("whole number"), "{err}");
    assert!(!err.contains("untagged enum"), "{err}");
}

#[test]
fn issue_22_should_refuse_credentials_in_a_mirror_url_as_credentials() {
    let pool =
        pool_yaml("talos:\n  registryMirrors:\n    ghcr.io:\n      endpoints: ['http://user:s3cret@m.example:5000']\n");
    let err = refusal(&pool, None);
    assert!(err.contains("credentials"), "{err}");
    assert!(!err.contains("port") && !err.contains("s3cret"), "{err}");
}

#[test]
fn issue_22_should_quote_a_value_once() {
    let err = refusal(&pool_yaml("images:\n  kubectl: x\n"), None);
    assert!(err.contains("images.kubectl \"x\""), "{err}");
    assert!(!err.contains("\\\""), "double-escaped: {err}");
}

#[test]
fn issue_22_should_give_an_over_long_version_the_version_rule() {
    let err = refusal(&pool_yaml("talos:\n  version: v1.13.12345678\n"), None);
    assert!(err.starts_with("R-7: talos.version"), "{err}");
}
