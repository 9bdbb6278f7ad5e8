//! `tender render pool`'s inputs (`crates/render`): a pool file, and optionally the cluster
//! state after a line `#state` (what `kubectl get storageclasses,datavolumes,... -o yaml` prints).
//!
//! Properties: parsing and validation never panic; a refusal names a field and prints no
//! control character (a hostile value cannot rewrite the operator's terminal); a valid pool
//! renders (patches always; manifests whenever the cluster checks pass or are skipped), the
//! same bytes every time; the output is YAML that parses back into exactly the four documents
//! in order, in the pool's namespace and under its names; the TalosConfigTemplate carries
//! exactly the patch documents, and the installer image is the one the pool resolved, carried
//! literally.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tender_render::k8s::{render_pool, PoolFormat};
use tender_render::pool::{parse, DiskSource, Pool};
use tender_render::state::ClusterState;
use tender_render::{Error, Refusal};

fn check_refusal(r: &Refusal) {
    assert!(!r.field.is_empty(), "a refusal names its field: {r:?}");
    let shown = r.to_string();
    assert!(!shown.chars().any(char::is_control), "a refusal prints a control character: {shown:?}");
}

fn check_error(e: &Error) {
    match e {
        Error::Refused(r) => check_refusal(r),
        Error::Serialise { .. } => panic!("serialising valid data failed: {e}"),
        Error::Malformed { .. } | Error::MissingClusterState | Error::IncompleteState { .. } => {}
    }
}

fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(m) => m.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

fn check_render(pool: &Pool, state: Option<&ClusterState>) {
    let patch = render_pool(pool, None, false, PoolFormat::Patch).expect("patches render for every valid pool");
    let again = render_pool(pool, None, false, PoolFormat::Patch).expect("patches");
    assert_eq!(patch.text, again.text, "rendering is deterministic");
    let patches = tender_fuzz::reparse_yaml("patch", &patch.text);
    assert!(!patches.is_empty());
    let mut leaves = Vec::new();
    patches.iter().for_each(|d| strings(d, &mut leaves));
    assert!(leaves.contains(&pool.installer_image()), "the installer image is carried literally");

    for (state, skip) in [(state, false), (None, true)] {
        let out = match render_pool(pool, state, skip, PoolFormat::Manifests) {
            Ok(out) => out,
            Err(e) => {
                check_error(&e);
                let builtin = matches!(pool.disk, DiskSource::Builtin { .. });
                assert!(builtin && !skip, "only the builtin clone checks refuse a valid pool: {e}");
                if state.is_none() {
                    assert!(matches!(e, Error::MissingClusterState), "{e}");
                }
                continue;
            }
        };
        let again = render_pool(pool, state, skip, PoolFormat::Manifests).expect("renders twice");
        assert_eq!(out.text, again.text, "rendering is deterministic");
        let docs = tender_fuzz::reparse_yaml("pool", &out.text);
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap_or("")).collect();
        assert_eq!(
            kinds,
            ["KubevirtMachineTemplate", "MachineDeployment", "MachineHealthCheck", "TalosConfigTemplate"]
        );
        for d in &docs {
            assert_eq!(d["metadata"]["namespace"].as_str(), Some(pool.namespace.as_str()), "namespace");
        }
        assert_eq!(docs[0]["metadata"]["name"].as_str(), out.kmt_name.as_deref());
        for d in &docs[1..] {
            assert_eq!(d["metadata"]["name"].as_str(), Some(pool.name().as_str()));
        }
        let embedded: Vec<Value> = docs[3]["spec"]["template"]["spec"]["strategicPatches"]
            .as_array()
            .expect("strategicPatches")
            .iter()
            .flat_map(|p| tender_fuzz::reparse_yaml("strategic patch", p.as_str().expect("a patch is a string")))
            .collect();
        assert_eq!(embedded, patches, "the TalosConfigTemplate carries exactly the pool's patches");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(text) = tender_fuzz::text(data) else { return };
    let (pool_text, state_text) = match text.split_once("\n#state\n") {
        Some((p, s)) => (p, Some(s)),
        None => (text, None),
    };
    let state = match state_text.map(ClusterState::from_yaml) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => {
            check_error(&e);
            None
        }
    };
    let file = match parse(pool_text) {
        Ok(f) => f,
        Err(e) => return check_error(&e),
    };
    match file.validate() {
        Ok(pool) => check_render(&pool, state.as_ref()),
        Err(r) => check_refusal(&r),
    }
});
