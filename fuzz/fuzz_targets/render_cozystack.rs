//! `tender check cozystack` and `tender render cozystack` (`tender_render::cozystack`, issue 22).
//!
//! Input: a `Kubernetes` / `KubernetesNodes` resource or values file, then optionally `#state`
//! and a cluster state; the same text is also tried as tender's config for `render cozystack`.
//!
//! Properties: no panic; an unlisted key is a usage error whose text has no control character;
//! a report's findings name a field, and its text prints no control character; the same input
//! gives the same report; `render cozystack` output uses only listed keys and reads the same
//! to YAML 1.1 and 1.2 readers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tender_render::catalog::parse_config;
use tender_render::cozystack::{check, check_keys, read_input, render, Chart, OsImage, RenderRequest};
use tender_render::state::ClusterState;

fuzz_target!(|data: &[u8]| {
    let Some(text) = tender_fuzz::text(data) else { return };
    let (input, state_text) = match text.split_once("\n#state\n") {
        Some((i, s)) => (i, Some(s)),
        None => (text, None),
    };
    let state = state_text.and_then(|s| ClusterState::from_yaml(s).ok()).unwrap_or_default();
    match read_input(input, Some("test-md1"), Some("tenant-test")) {
        Ok(pools) => {
            if let Ok(report) = check(&pools, None, &state) {
                let again = check(&pools, None, &state).expect("deterministic");
                assert_eq!(report.text(), again.text());
                assert!(!report.text().chars().any(|c| c.is_control() && c != '\n'), "{}", report.text());
                for f in &report.findings {
                    assert!(!f.field.is_empty(), "{f:?}");
                }
                assert_eq!(report.ok, report.findings.is_empty());
            }
        }
        Err(e) => assert!(!e.to_string().chars().any(char::is_control), "{e}"),
    }
    if let Ok(config) = parse_config(input) {
        let req = RenderRequest {
            mirror: "http://tender.cozy-tender.svc:5000".into(),
            cluster: Some("test".into()),
            namespace: Some("tenant-test".into()),
            pools: vec!["md1".into()],
            os_image: Some(OsImage::Factory),
            ..RenderRequest::default()
        };
        if let Ok(out) = render(&config, &req) {
            let docs = tender_fuzz::reparse_yaml("render cozystack", &out.text());
            for d in &docs {
                match d["kind"].as_str() {
                    Some("Kubernetes") => drop(check_keys(Chart::Kubernetes, &d["spec"], "").expect("listed keys")),
                    Some("KubernetesNodes") => drop(check_keys(Chart::Nodes, &d["spec"], "").expect("listed keys")),
                    Some("Package") => drop(
                        check_keys(Chart::WorkerImage, &d["spec"]["components"]["platform"]["values"]["kubernetesWorkerImage"], "")
                            .expect("listed keys"),
                    ),
                    other => panic!("unexpected document {other:?}"),
                }
            }
        }
    }
});
