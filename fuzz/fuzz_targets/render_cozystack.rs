//! `tender check cozystack` and `tender render cozystack` (`tender_render::cozystack`, issue 22).
//!
//! Input: a first byte choosing the target (v1.6.2, main, golden-catalog), then a `Kubernetes` /
//! `KubernetesNodes` resource or values file, then optionally `#state` and a cluster state;
//! the same text is also tried as tender's config for `render cozystack`.
//!
//! The input is read as `tender check cozystack` reads it (issue 33): YAML 1.1 as kubectl and
//! Helm read it, the target's schema and the chart's `fail`s (`schema_findings`), then the
//! values the target declares (`read_checked_input`); the reader of before (`read_input`) too.
//!
//! Properties: no panic; an unlisted key is a usage error whose text has no control character;
//! a report's findings name a field, and its text prints no control character; the same input
//! gives the same findings and report; `render cozystack` output uses only listed keys and reads
//! the same to YAML 1.1 and 1.2 readers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tender_render::catalog::parse_config;
use tender_render::cozystack::{
    check, check_keys, read_checked_input, read_input, render, schema_findings, Chart, OsImage, RenderRequest, Report,
};
use tender_render::state::ClusterState;
use tender_render::target::Target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, data)) = data.split_first() else { return };
    let Some(text) = tender_fuzz::text(data) else { return };
    let version = ["v1.6.2", "main", "golden-catalog"][usize::from(pick) % 3];
    let target = Target::embedded(version).expect("an embedded target");
    let (input, state_text) = match text.split_once("\n#state\n") {
        Some((i, s)) => (i, Some(s)),
        None => (text, None),
    };
    let state = state_text.and_then(|s| ClusterState::from_yaml(s).ok()).unwrap_or_default();
    let clean = |m: &str| !m.chars().any(|c| c.is_control() && c != '\n');
    match schema_findings(input, Some("test-md1"), Some("tenant-test"), &target) {
        Ok(found) => {
            let again = schema_findings(input, Some("test-md1"), Some("tenant-test"), &target).expect("deterministic");
            assert_eq!(format!("{:?}", found.invalid), format!("{:?}", again.invalid));
            for f in found.invalid.iter().chain(&found.undeclared) {
                assert!(!f.field.is_empty(), "{f:?}");
            }
            let all = found.invalid.iter().chain(&found.undeclared).cloned().collect();
            let shown = Report { ok: false, findings: all, ..Report::default() }.text();
            assert!(clean(&shown), "{shown}");
            if found.invalid.is_empty() {
                match read_checked_input(input, Some("test-md1"), Some("tenant-test"), &target) {
                    Ok(pools) => {
                        if let Ok(report) = check(&pools, None, &state) {
                            assert!(clean(&report.text()), "{}", report.text());
                            assert_eq!(report.ok, report.findings.is_empty());
                        }
                    }
                    Err(e) => assert!(clean(&e.to_string()), "{e}"),
                }
            }
        }
        Err(e) => assert!(clean(&e.to_string()), "{e}"),
    }
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
