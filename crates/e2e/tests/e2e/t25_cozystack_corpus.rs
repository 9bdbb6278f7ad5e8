//! Issue 33, item 3: `tender check cozystack` refuses what Cozystack refuses, proved
//! differentially. Every values file of `testdata/cozystack/corpus/` goes to `tender check
//! cozystack` and to the real chart of the Cozystack it names, `kubernetes-nodes` or the
//! `kubernetes` app (`helm template`, which validates `values.schema.json` and runs the chart's
//! `fail`s), plus the API's name rules (DNS-1035, the release prefix + name within Helm's 53
//! characters), which Helm does not check. The verdicts (ok / refused) must agree file by file,
//! and agree with the file's `# expect:` line.
//!
//! Header lines of a corpus file: `# expect: ok|refused [text tender's report must hold]`,
//! optionally `# chart: kubernetes-nodes|kubernetes` (default `kubernetes-nodes`), `# name: NAME`
//! (default `demo-md0`, or `demo` for the app) and `# cozystack: VERSION` (default `main`).
//! The app's files name their node groups with `instanceType: ""`: the chart looks an instance
//! type up in the cluster, which `helm template` has not (tender leaves live lookups out).
//! tender runs with `--allow-partial`: a key the chart does not declare is Helm's silent no-op,
//! which tender notes instead of refusing, so only what Cozystack itself refuses counts.

use std::process::Command;

use tender_e2e::paths::{tender_bin, workspace_root};
use tender_e2e::TestDir;

/// What the platform injects into every release and the corpus does not carry.
const PLATFORM_VALUES: &str = "_cluster:\n  cluster-domain: cozy.local\n_namespace: {etcd: tenant-root, host: example.org, ingress: tenant-root, monitoring: tenant-root}\n";

const STATE: &str = r#"{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
  "metadata": {"name": "replicated", "creationTimestamp": "2024-01-01T00:00:00Z",
  "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}]}"#;

fn header<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(&format!("# {key}: ")))
}

/// The API's name rule, written from k8s.io/apimachinery's IsDNS1035Label and Helm's limit on
/// the release `<chart>-<name>`.
fn api_takes(chart: &str, name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && chart.len() + 1 + name.len() <= 53
}

#[test]
fn t25_check_cozystack_agrees_with_the_real_chart_on_the_corpus() {
    let dir = TestDir::new("t25");
    let helm = super::t23_cozystack::helm_dir().join("helm");
    let state = dir.path().join("state.json");
    std::fs::write(&state, STATE).unwrap();
    let platform = dir.path().join("platform.yaml");
    std::fs::write(&platform, PLATFORM_VALUES).unwrap();
    let corpus = workspace_root().join("testdata/cozystack/corpus");
    let mut files: Vec<_> = std::fs::read_dir(&corpus).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    assert!(files.len() >= 80, "the corpus: {files:?}");
    assert!(files.iter().filter(|f| f.to_string_lossy().contains("/app-")).count() >= 30, "the app chart's cases");
    let mut disagreements = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let case = f.file_name().unwrap().to_string_lossy().to_string();
        let expect = header(&text, "expect").unwrap_or_else(|| panic!("{case}: no # expect: line"));
        let (want, needle) = expect.split_once(' ').unwrap_or((expect, ""));
        let chart = header(&text, "chart").unwrap_or("kubernetes-nodes");
        let name = header(&text, "name").unwrap_or(if chart == "kubernetes" { "demo" } else { "demo-md0" });
        let version = header(&text, "cozystack").unwrap_or("main");
        let chart_dir = if version == "main" { "main-3c780acd4" } else { version };
        let tender = Command::new(tender_bin())
            .args(["check", "cozystack", "-f"])
            .arg(f)
            .args(["--name", name, "--namespace", "tenant-demo", "--cozystack", version, "--allow-partial"])
            .arg("--cluster-state")
            .arg(&state)
            .output()
            .unwrap();
        let helm_out = Command::new(&helm)
            .arg("template")
            .arg(format!("{chart}-{name}"))
            .arg(workspace_root().join(format!("testdata/cozystack/{chart_dir}/packages/apps/{chart}")))
            .args(["--namespace", "tenant-demo", "-f"])
            .arg(&platform)
            .arg("-f")
            .arg(f)
            .output()
            .unwrap();
        let verdict = |ok: bool| if ok { "ok" } else { "refused" };
        let t = verdict(tender.status.success());
        let h = verdict(helm_out.status.success() && api_takes(chart, name));
        let report = format!("{}{}", String::from_utf8_lossy(&tender.stdout), String::from_utf8_lossy(&tender.stderr));
        if t != h || h != want || !report.contains(needle) {
            disagreements.push(format!(
                "{case}: tender {t}, Cozystack {h}, expected {want} {needle:?}\n  tender: {}\n  helm: {}",
                report.trim(),
                String::from_utf8_lossy(&helm_out.stderr)
                    .lines()
                    .filter(|l| !l.starts_with("level="))
                    .collect::<Vec<_>>()
                    .join(" | ")
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {} cases disagree:\n{}",
        disagreements.len(),
        files.len(),
        disagreements.join("\n")
    );
}
