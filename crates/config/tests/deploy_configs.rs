//! Issue 35 (6): the configs shipped in deploy/ load, with what their comments offer switched
//! on, and mirror the same upstreams.
#![allow(clippy::unwrap_used, reason = "tests")]

use std::path::Path;

fn shipped(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)).unwrap()
}

fn upstreams(name: &str, text: &str) -> Vec<String> {
    let raw = tender_config::parse(name, text).unwrap();
    let s = tender_config::resolve(name, raw, &tender_config::Overrides::default()).unwrap();
    s.upstreams.iter().map(|u| u.name.clone()).collect()
}

#[test]
fn should_load_the_systemd_config_with_its_offline_and_admin_examples_switched_on() {
    let text = shipped("deploy/systemd/tender.yaml");
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("admin-token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
    let on = text
        .replace("#   offline: true", "offline: true")
        .replace("#   admin:", "admin:")
        .replace("#     tokenFile: /etc/tender/admin-token", &format!("  tokenFile: {}", token.display()));
    assert_ne!(on, text);
    let raw = tender_config::parse("systemd", &on).unwrap();
    let s = tender_config::resolve("systemd", raw, &tender_config::Overrides::default()).unwrap();
    assert!(s.offline && s.upstreams.iter().all(|u| u.offline), "the offline example");
    assert!(s.admin.token.is_some(), "the admin.tokenFile example");
    let base = upstreams("base", &shipped("deploy/base/tender.yaml"));
    assert_eq!(upstreams("systemd", &text), base, "the same upstreams as deploy/base");
    assert_eq!(upstreams("pvc", &shipped("deploy/overlays/pvc/tender.yaml")), base);
    assert_eq!(base.len(), 5);
}
