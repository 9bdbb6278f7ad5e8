//! House rules about the workspace itself, checked without any peer.

use std::collections::BTreeSet;

use tender_e2e::paths::workspace_root;

/// The quoted strings of the root manifest's `key = [ ... ]` line.
fn string_list(manifest: &str, key: &str) -> BTreeSet<String> {
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{key} =")))
        .unwrap_or_else(|| panic!("the root Cargo.toml has no {key}"));
    line.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn should_list_every_crate_but_e2e_in_default_members() {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert_eq!(string_list(&manifest, "members"), BTreeSet::from(["crates/*".to_string()]));
    let crates: BTreeSet<String> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| format!("crates/{}", p.file_name().unwrap().to_string_lossy()))
        .filter(|c| c != "crates/e2e")
        .collect();
    assert_eq!(
        string_list(&manifest, "default-members"),
        crates,
        "default-members must name every crate except crates/e2e, so a plain `cargo test` covers them \
         and stays green on a machine without the e2e peers"
    );
}
