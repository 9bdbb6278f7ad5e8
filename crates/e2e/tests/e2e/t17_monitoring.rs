//! Issue 20 item 7: the monitoring files operators import as is (`deploy/monitoring/`).
//! Grafana cannot run here, so every dashboard expression is checked by promtool as a
//! recording rule; the alerts are checked and each one fired from sample series by
//! `promtool test rules`; and every metric name the files use is in a live tender's `/metrics`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use tender_e2e::tender::{write_config, Tender};
use tender_e2e::{http, paths, proc, TestDir};

fn monitoring(file: &str) -> PathBuf {
    paths::workspace_root().join("deploy/monitoring").join(file)
}

fn read(file: &str) -> String {
    std::fs::read_to_string(monitoring(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn promtool(args: &[&str]) {
    proc::need(&["promtool"]);
    let out = proc::output(Command::new("promtool").args(args));
    assert!(
        out.status.success(),
        "promtool {args:?} failed (package prometheus):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every `expr` of the dashboard (panel targets), with Grafana's variables as Prometheus sees
/// them after substitution.
fn dashboard_exprs() -> Vec<String> {
    let d: serde_json::Value = serde_json::from_str(&read("tender-dashboard.json")).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let e = t["expr"].as_str().unwrap();
            let e = e.replace("$__rate_interval", "5m").replace("$instance", ".*");
            assert!(!e.contains('$'), "a Grafana variable the test does not substitute: {e}");
            out.push(e);
        }
    }
    out
}

/// The `tender_*` metric names a text uses (recording-rule names, with a colon, excluded).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("tender_") {
        let start = i + at;
        let before_ok = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase() || bytes[end].is_ascii_digit() || bytes[end] == b'_')
        {
            end += 1;
        }
        if before_ok && bytes.get(end) != Some(&b':') {
            out.insert(text[start..end].to_string());
        }
        i = end.max(start + 1);
    }
    out
}

#[test]
fn should_check_the_rules_and_fire_every_alert_with_promtool() {
    promtool(&["check", "rules", monitoring("tender-rules.yaml").to_str().unwrap()]);
    promtool(&["test", "rules", monitoring("tender-rules-test.yaml").to_str().unwrap()]);
    let rules = read("tender-rules.yaml");
    let tests = read("tender-rules-test.yaml");
    let alerts: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
    assert_eq!(alerts.len(), 6, "upstream down, bucket down, fill failures, disk nearly full, corrupt, stale");
    for a in alerts {
        // Each alert has a test case that expects it to fire (exp_labels follows its name).
        let fires = tests
            .split("alertname: ")
            .skip(1)
            .any(|case| case.starts_with(&format!("{a}\n")) && case.contains("exp_labels"));
        assert!(fires, "{a}: no promtool test case fires it");
    }
}

#[test]
fn should_check_every_dashboard_expression_with_promtool() {
    let dir = TestDir::new("dashboard-rules");
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 15, "{exprs:?}");
    let mut y = String::from("groups:\n  - name: tender-dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        // A JSON string is a YAML double-quoted scalar.
        y.push_str(&format!("      - record: tender_dashboard:expr_{i}\n        expr: {}\n", serde_json::json!(e)));
    }
    let file = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&file, y).unwrap();
    promtool(&["check", "rules", file.to_str().unwrap()]);
}

#[test]
fn should_serve_every_metric_the_rules_and_the_dashboard_use() {
    let dir = TestDir::new("monitoring-metrics");
    write_config(&dir.path().join("tender.yaml"), &[], "");
    let t = Tender::start(&dir.path().join("tender.yaml"), &dir.path().join("data"), &dir.path().join("tender.log"));
    let metrics = http::get(t.addr, "/metrics").unwrap();
    assert_eq!(metrics.status(), 200);
    let mut served = BTreeSet::new();
    for line in metrics.text().lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            let (Some(name), Some(kind)) = (w.next(), w.next()) else { continue };
            served.insert(name.to_string());
            match kind {
                "counter" => {
                    served.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for s in ["_bucket", "_sum", "_count"] {
                        served.insert(format!("{name}{s}"));
                    }
                }
                _ => {}
            }
        } else if !line.starts_with('#') {
            if let Some(name) = line.split(['{', ' ']).next() {
                served.insert(name.to_string());
            }
        }
    }
    let mut used = metric_names(&read("tender-rules.yaml"));
    used.extend(metric_names(&dashboard_exprs().join("\n")));
    for must in ["tender_upstream_up", "tender_stale_served_total", "tender_cache_size_bytes", "tender_data_free_bytes"]
    {
        assert!(used.contains(must), "the files use {must}: {used:?}");
    }
    let missing: Vec<&String> = used.iter().filter(|n| !served.contains(*n)).collect();
    assert!(missing.is_empty(), "used in deploy/monitoring but not in /metrics: {missing:?}\n{served:?}");
    // Every metric the files use is listed in README (Observability).
    let readme = std::fs::read_to_string(paths::workspace_root().join("README.md")).unwrap();
    let listed = |n: &str| {
        let base = n.strip_suffix("_bucket").unwrap_or(n);
        readme.contains(&format!("`{base}`"))
    };
    let unlisted: Vec<&String> = used.iter().filter(|n| !listed(n)).collect();
    assert!(unlisted.is_empty(), "used in deploy/monitoring but not listed in README: {unlisted:?}");
}
