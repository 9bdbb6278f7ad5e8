//! Issue 38 (6): rendering for a tree. `--mirror` repeated names a node's rack tender first and
//! its parent second; every output keeps that order (not sorted), and the fallback rules stay.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use tender_render::catalog::parse_config;
use tender_render::containerd::hosts_files;
use tender_render::cozystack::{render, RenderRequest};
use tender_render::registries::RegistriesRequest;
use tender_render::talos::{render_registries, TalosVersion};

/// Sorted, the parent would come first: the order must be the one given.
const RACK: &str = "http://tender-rack-b.example:5000";
const PARENT: &str = "http://tender-a-site.example:5000";

fn request(skip_fallback: bool) -> RegistriesRequest {
    RegistriesRequest {
        mirror: RACK.into(),
        more_mirrors: vec![PARENT.into()],
        registries: vec!["ghcr.io".into(), "docker.io".into()],
        skip_fallback,
        ..RegistriesRequest::default()
    }
}

fn position(text: &str, needle: &str) -> usize {
    text.find(needle).unwrap_or_else(|| panic!("{needle} not in:\n{text}"))
}

#[test]
fn should_list_the_rack_then_the_parent_for_talos() {
    for version in ["v1.13.6", "v1.11.6"] {
        let plan = request(false).validate().unwrap();
        let text = render_registries(&plan, TalosVersion::parse("v", version).unwrap()).unwrap();
        let docs: Vec<serde_json::Value> = text
            .split("\n---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| serde_norway::from_str(d).unwrap())
            .collect();
        let endpoints: Vec<&serde_json::Value> = docs
            .iter()
            .flat_map(|d| {
                // v1.13: one RegistryMirrorConfig per registry; v1.11: machine.registries.mirrors.
                let one = d.get("endpoints").map(|e| vec![e]).unwrap_or_default();
                let many: Vec<&serde_json::Value> = d
                    .pointer("/machine/registries/mirrors")
                    .and_then(|m| m.as_object())
                    .map(|m| m.values().filter_map(|v| v.get("endpoints")).collect())
                    .unwrap_or_default();
                one.into_iter().chain(many)
            })
            .collect();
        assert_eq!(endpoints.len(), 2, "{version}: both registries:\n{text}");
        for e in endpoints {
            // v1.13 lists `{url: ...}`, v1.11 the URLs.
            let urls: Vec<&str> =
                e.as_array().unwrap().iter().map(|u| u.get("url").unwrap_or(u).as_str().unwrap()).collect();
            assert_eq!(urls.len(), 3, "{version}:\n{text}");
            assert!(urls[0].starts_with(RACK) && urls[1].starts_with(PARENT), "{version}: rack first: {urls:?}");
            assert!(urls[2].starts_with("https://"), "{version}: the registry itself last: {urls:?}");
        }
        let strict =
            render_registries(&request(true).validate().unwrap(), TalosVersion::parse("v", version).unwrap()).unwrap();
        assert!(!strict.contains("https://"), "{version}: no fallback to the registry:\n{strict}");
    }
}

#[test]
fn should_write_hosts_toml_with_the_rack_then_the_parent_then_the_upstream() {
    let files = hosts_files(&request(false).validate().unwrap()).unwrap();
    let ghcr = files.iter().find(|f| f.path == "ghcr.io/hosts.toml").unwrap();
    let text = String::from_utf8(ghcr.contents.clone()).unwrap();
    assert!(position(&text, RACK) < position(&text, PARENT), "rack first:\n{text}");
    assert!(text.contains("server = \"https://ghcr.io\""), "then the registry itself:\n{text}");
    let parsed: toml::Value = toml::from_str(&text).unwrap();
    assert_eq!(parsed["host"].as_table().unwrap().len(), 2, "{text}");

    // --skip-fallback: containerd appends `server` last, so the parent is the server and
    // nothing follows it.
    let files = hosts_files(&request(true).validate().unwrap()).unwrap();
    let ghcr = files.iter().find(|f| f.path == "ghcr.io/hosts.toml").unwrap();
    let text = String::from_utf8(ghcr.contents.clone()).unwrap();
    assert!(text.contains(&format!("server = \"{PARENT}\"")), "{text}");
    assert!(!text.contains("https://ghcr.io"), "no fallback to the registry:\n{text}");
    let parsed: toml::Value = toml::from_str(&text).unwrap();
    let hosts: Vec<&String> = parsed["host"].as_table().unwrap().keys().collect();
    assert_eq!(hosts.len(), 1, "{text}");
    assert!(hosts[0].starts_with(RACK), "{text}");
}

#[test]
fn should_refuse_a_mirror_given_twice() {
    let mut req = request(false);
    req.more_mirrors = vec![format!("{RACK}/")];
    let err = req.validate().unwrap_err().to_string();
    assert!(err.contains("given before"), "{err}");
}

#[test]
fn should_give_cozystack_workers_the_rack_then_the_parent_and_the_disk_from_the_rack() {
    let config = parse_config(
        "upstreams:\n- name: ghcr.io\n  url: https://ghcr.io\n- name: factory.talos.dev\n  url: https://factory.talos.dev\n",
    )
    .unwrap();
    let req = RenderRequest {
        mirror: RACK.into(),
        more_mirrors: vec![PARENT.into()],
        cluster: Some("test".into()),
        namespace: Some("tenant-test".into()),
        target: Some(tender_render::target::Target::embedded("main").unwrap()),
        os_image: Some(tender_render::cozystack::OsImage::Factory),
        ..RenderRequest::default()
    };
    let text = render(&config, &req).unwrap().text();
    let docs: Vec<serde_json::Value> =
        text.split("\n---\n").filter(|d| !d.trim().is_empty()).map(|d| serde_norway::from_str(d).unwrap()).collect();
    let talos = docs.iter().find_map(|d| d.pointer("/spec/talos")).unwrap_or_else(|| panic!("{text}"));
    for registry in ["ghcr.io", "factory.talos.dev"] {
        let urls: Vec<&str> = talos["registryMirrors"][registry]["endpoints"]
            .as_array()
            .unwrap_or_else(|| panic!("{registry}:\n{text}"))
            .iter()
            .map(|u| u.as_str().unwrap())
            .collect();
        assert_eq!(urls.len(), 2, "{text}");
        assert!(urls[0].starts_with(RACK) && urls[1].starts_with(PARENT), "{urls:?}");
    }
    let disk = talos["imageFactoryURL"].as_str().unwrap_or_else(|| panic!("a disk URL:\n{text}"));
    assert!(disk.starts_with(RACK), "the disk from the rack: {disk}");
}
