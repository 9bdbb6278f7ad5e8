//! Regressions pinned by issue 33, item 6: small defects of `render cozystack` and
//! `check cozystack` found while testing them against Cozystack's real charts.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use common::*;
use tender_render::catalog::parse_config;
use tender_render::cozystack::{read_input, render, OsImage, RenderRequest};

const CONFIG: &str = "upstreams:\n- name: ghcr.io\n  url: https://ghcr.io\n";

fn request(mirror: &str, cluster: &str, pool: &str) -> RenderRequest {
    RenderRequest {
        mirror: mirror.into(),
        cluster: Some(cluster.into()),
        namespace: Some("tenant-test".into()),
        pools: vec![pool.into()],
        ..RenderRequest::default()
    }
}

fn rendered(req: &RenderRequest) -> Result<String, String> {
    render(&parse_config(CONFIG).unwrap(), req).map(|r| r.text()).map_err(|e| e.to_string())
}

/// Rust's own names (`u32`, `struct TalosValues`, `untagged enum Raw`) mean nothing to an
/// operator: a wrong type names the YAML key and the kind of value it takes.
#[test]
fn issue_33_should_name_the_key_and_the_expected_kind_not_a_rust_type() {
    for (spec, key, kind) in [
        ("minReplicas: x", "minReplicas", "an integer"),
        ("diskSize: [1]", "diskSize", "an integer or a string"),
        ("talos: 5", "talos", "a mapping"),
        ("resources: {cpu: [2]}", "resources.cpu", "an integer or a string"),
        ("logSerialConsole: {}", "logSerialConsole", "a boolean"),
    ] {
        let input = format!("kind: KubernetesNodes\nmetadata: {{name: test-md1, namespace: tenant-test}}\nspec:\n  cluster: test\n  {spec}\n");
        let err = read_input(&input, None, None).unwrap_err().to_string();
        assert!(err.contains(key) && err.contains(kind), "{spec}: {err}");
        for rust in ["u32", "u64", "struct", "enum", "Raw", "TalosValues", "IntOrString"] {
            assert!(!err.contains(rust), "{spec}: {err}");
        }
    }
    for (pool, key) in [("minReplicas: x", "minReplicas"), ("diskSize: [1]", "diskSize"), ("talos: 5", "talos")] {
        let err = tender_render::pool::parse(&pool_yaml(pool)).unwrap_err().to_string();
        assert!(err.contains(key), "{pool}: {err}");
        for rust in ["u32", "struct", "enum", "Raw", "TalosValues"] {
            assert!(!err.contains(rust), "{pool}: {err}");
        }
    }
}

#[test]
fn issue_33_should_accept_an_ipv6_mirror() {
    let text = rendered(&request("http://[::1]:5000", "test", "md1")).unwrap();
    assert!(text.contains("http://[::1]:5000"), "{text}");
    for bad in ["http://[::1", "http://[zz::1]:5000", "http://[::1]x:5000", "http://::1:5000"] {
        assert!(rendered(&request(bad, "test", "md1")).is_err(), "{bad}");
    }
}

/// The mirror is tender's root: a path would become part of every registry endpoint and of the
/// disk URL, which tender does not serve.
#[test]
fn issue_33_should_refuse_a_mirror_with_a_path() {
    let err = rendered(&request("http://tender:5000/v2/ghcr", "test", "md1")).unwrap_err();
    assert!(err.contains("--mirror") && err.contains("path"), "{err}");
}

/// Cozystack names a `Kubernetes` release `kubernetes-<name>` and a `KubernetesNodes` one
/// `kubernetes-nodes-<cluster>-<pool>`: DNS-1035 labels (a letter first), a Helm release name
/// at most 53 characters.
#[test]
fn issue_33_should_refuse_names_the_api_or_the_chart_refuses() {
    for (cluster, pool) in
        [("1test", "md1"), ("test", "md_1"), ("Test", "md1"), (&*"c".repeat(43), "md1"), (&*"c".repeat(30), "p234567")]
    {
        let err = rendered(&request("http://tender:5000", cluster, pool)).unwrap_err();
        assert!(err.contains("DNS-1035") || err.contains("53"), "{cluster} {pool}: {err}");
    }
    rendered(&request("http://tender:5000", &"c".repeat(30), "p2345")).unwrap();
}

/// Only a key that changes the worker disk re-images a pool: the note is printed for that and
/// for nothing else.
#[test]
fn issue_33_should_say_re_images_only_when_a_disk_key_is_written() {
    let out = render(&parse_config(CONFIG).unwrap(), &request("http://tender:5000", "test", "md1")).unwrap();
    assert!(!out.text().contains("re-images pool"), "{}", out.text());
    assert!(!out.warnings.iter().any(|w| w.contains("re-image")), "{:?}", out.warnings);
    let mut req = request("http://tender:5000", "test", "md1");
    req.os_image = Some(OsImage::Factory);
    let out = render(&parse_config(CONFIG).unwrap(), &req).unwrap();
    assert!(out.text().contains("re-images pool md1"), "{}", out.text());
}

// ---- items 1 and 2: render for the Cozystack the cluster runs -------------------------------

use serde_json::json;
use tender_render::state::ClusterState;
use tender_render::target::Target;

const FULL: &str = "upstreams:\n- name: ghcr.io\n  url: https://ghcr.io\n- name: factory.talos.dev\n  url: https://factory.talos.dev\ncatalog:\n  images:\n  - schematicID: ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515\n    version: v1.13.6\n";

fn for_target(version: &str, mirror: &str, os: Option<OsImage>) -> tender_render::cozystack::Rendered {
    let req = RenderRequest {
        os_image: os,
        target: Some(Target::embedded(version).unwrap()),
        ..request(mirror, "test", "md1")
    };
    render(&parse_config(FULL).unwrap(), &req).unwrap()
}

#[test]
fn issue_33_should_write_mirrors_disk_and_installer_with_the_keys_main_has() {
    let out = for_target("main", "http://tender:5000", Some(OsImage::Factory));
    assert!(out.unexpressed.is_empty(), "{:?}", out.unexpressed);
    let d = docs(&out.text());
    let talos = &d[1]["spec"]["talos"];
    assert_eq!(talos["registryMirrors"]["ghcr.io"]["endpoints"], json!(["http://tender:5000"]));
    // The installer comes through the factory.talos.dev mirror entry, not installerRepository.
    assert_eq!(talos["registryMirrors"]["factory.talos.dev"]["endpoints"], json!(["http://tender:5000"]));
    assert!(talos.get("installerRepository").is_none(), "{talos}");
    assert_eq!(talos["imageFactoryURL"], "http://tender:5000");
    assert!(d[1]["spec"].get("osImage").is_none());
    // main has no worker-image catalog: no Package patch, said on stderr.
    assert_eq!(d.len(), 2, "{}", out.text());
    assert!(out.warnings.iter().any(|w| w.contains("kubernetesWorkerImage")), "{:?}", out.warnings);
    assert!(out.text().contains("re-images pool md1"));
}

#[test]
fn issue_33_should_list_what_v1_6_cannot_express_and_write_the_rest() {
    for v in ["v1.6.0", "v1.6.1", "v1.6.2"] {
        let out = for_target(v, "https://tender:5000", Some(OsImage::Factory));
        let what: Vec<String> = out.unexpressed.iter().map(ToString::to_string).collect();
        assert_eq!(what.len(), 2, "{what:?}");
        assert!(
            what.iter().all(|w| w.contains("talos.registryMirrors") && w.contains("tender render registries")),
            "{what:?}"
        );
        let d = docs(&out.text());
        let talos = &d[1]["spec"]["talos"];
        assert!(talos.get("registryMirrors").is_none());
        assert_eq!(talos["installerRepository"], "tender:5000/factory.talos.dev/installer");
        assert_eq!(talos["imageFactoryURL"], "https://tender:5000");
        // Plain HTTP: the workers pull the installer over HTTPS, so it is not written.
        let out = for_target(v, "http://tender:5000", Some(OsImage::Factory));
        assert!(
            out.unexpressed.iter().any(|u| u.what.contains("installer") && u.alternative.contains("HTTPS")),
            "{:?}",
            out.unexpressed
        );
        assert!(!out.text().contains("installerRepository"));
    }
}

#[test]
fn issue_33_should_not_say_re_images_when_builtin_is_not_written() {
    let out = for_target("main", "http://tender:5000", Some(OsImage::Builtin));
    assert!(out.unexpressed.iter().any(|u| u.key.starts_with("osImage.builtin")), "{:?}", out.unexpressed);
    assert!(!out.text().contains("re-images pool") && !out.text().contains("osImage"), "{}", out.text());
    assert!(!out.warnings.iter().any(|w| w.contains("re-image")), "{:?}", out.warnings);
    // golden-catalog is what tender rendered before: osImage.builtin and the Package.
    let out = for_target("golden-catalog", "http://tender:5000", Some(OsImage::Builtin));
    assert!(out.unexpressed.is_empty());
    let d = docs(&out.text());
    assert!(d[1]["spec"]["osImage"]["builtin"].is_object());
    assert_eq!(d.last().unwrap()["kind"], "Package");
}

#[test]
fn issue_33_should_refuse_a_package_patch_that_re_points_existing_goldens() {
    let golden = "talos-worker-ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515-v1.13.6";
    let state = |url: &str| {
        ClusterState::from_yaml(&format!("kind: List\nitems:\n- kind: DataVolume\n  metadata: {{name: {golden}, namespace: cozy-public}}\n  spec:\n    source: {{http: {{url: '{url}'}}}}\n  status: {{phase: Succeeded}}\n")).unwrap()
    };
    let req = |s: Option<ClusterState>| RenderRequest {
        target: Some(Target::embedded("golden-catalog").unwrap()),
        state: s,
        ..request("http://tender:5000", "test", "md1")
    };
    let config = parse_config(FULL).unwrap();
    let err = render(&config, &req(Some(state("https://factory.talos.dev/image/x/v1.13.6/openstack-amd64.raw.xz"))))
        .unwrap_err()
        .to_string();
    assert!(err.contains("G-9") && err.contains(golden) && err.contains("(1)") && err.contains("(5)"), "{err}");
    render(&config, &req(Some(state("http://tender:5000/image/x/v1.13.6/openstack-amd64.raw.xz")))).unwrap();
    let out = render(&config, &req(None)).unwrap();
    assert!(
        out.warnings.iter().any(|w| w.contains("re-points every golden") && w.contains("--cluster-state")),
        "{:?}",
        out.warnings
    );
}

/// Fuzz find (render_cozystack): a key that is the empty string (`? >` is the mapping
/// `{"": null}`) gave a finding with an empty field. Every finding names a field: `""`.
#[test]
fn issue_33_should_name_an_empty_key_in_a_finding() {
    let target = Target::embedded("main").unwrap();
    for text in ["? >", "\"\": 1", "talos: {\"\": x}"] {
        let found =
            tender_render::cozystack::schema_findings(text, Some("demo"), Some("tenant-demo"), &target).unwrap();
        let all: Vec<_> = found.invalid.iter().chain(&found.undeclared).collect();
        assert!(!all.is_empty(), "{text}");
        assert!(all.iter().all(|f| !f.field.is_empty()), "{text}: {all:?}");
    }
}
