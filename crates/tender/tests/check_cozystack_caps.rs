//! `tender check cozystack` refuses input it would take too long or too much memory to parse
//! (issue 32, item 7): over 4 MiB (`--max-input-size` raises it) or nested deeper than 64
//! levels, found before parsing, with exit 2 and a message naming the cap.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod cli_support;
use cli_support::write;

/// A pool `md1` of cluster `test` that passes the checks against [`STATE`].
const NODES: &str = "apiVersion: apps.cozystack.io/v1alpha1\nkind: KubernetesNodes\nmetadata:\n  name: test-md1\n  namespace: tenant-test\nspec:\n  cluster: test\n  storageClass: replicated\n";
const STATE: &str = r#"{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "replicated", "creationTimestamp": "2024-01-01T00:00:00Z", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}]}"#;

struct Run {
    code: Option<i32>,
    stderr: String,
    took: Duration,
}

/// `tender args…` with `stdin`, killed (and the test failed) when it runs over `limit`.
fn run(args: &[&str], stdin: &str, limit: Duration) -> Run {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tender"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_string();
    let feeder = std::thread::spawn(move || {
        let _ = input.write_all(stdin.as_bytes());
    });
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let took = t0.elapsed();
            let _ = feeder.join();
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
            return Run { code: status.code(), stderr, took };
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tender {} still ran after {limit:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Exit 2, within two seconds, the message naming `words`.
fn assert_refused_quickly(r: &Run, words: &[&str]) {
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert!(r.took < Duration::from_secs(2), "took {:?}: {}", r.took, r.stderr);
    for w in words {
        assert!(r.stderr.contains(w), "{w:?} not in: {}", r.stderr);
    }
}

#[test]
fn issue_32_should_refuse_64000_levels_of_nesting_before_parsing_them() {
    let dir = tempfile::tempdir().unwrap();
    let s = write(dir.path(), "state.yaml", STATE);
    let flow = format!("{}{}", "{a: ".repeat(64_000), "}".repeat(64_000));
    let seqs = format!("{}{}", "[".repeat(64_000), "]".repeat(64_000));
    let block = format!("cluster: test\n{}x\n", "- ".repeat(64_000));
    for deep in [&flow, &seqs, &block] {
        let f = write(dir.path(), "deep.yaml", deep);
        let r = run(&["check", "cozystack", "-f", &f, "--cluster-state", &s], "", Duration::from_secs(20));
        assert_refused_quickly(&r, &["-f", "64 levels"]);
        let r = run(&["check", "cozystack", "-f", "-", "--cluster-state", &s], deep, Duration::from_secs(20));
        assert_refused_quickly(&r, &["-f", "64 levels"]);
    }
    let f = write(dir.path(), "in.yaml", NODES);
    let state = format!("{}{}", "[".repeat(64_000), "]".repeat(64_000));
    let r = run(&["check", "cozystack", "-f", &f, "--cluster-state", "-"], &state, Duration::from_secs(20));
    assert_refused_quickly(&r, &["--cluster-state", "64 levels"]);
    let values = write(dir.path(), "values.yaml", &flow);
    let r = run(
        &["check", "cozystack", "-f", &f, "--cluster-state", &s, "--catalog-values", &values],
        "",
        Duration::from_secs(20),
    );
    assert_refused_quickly(&r, &["--catalog-values", "64 levels"]);
}

#[test]
fn issue_32_should_refuse_an_input_over_4_mib_unless_the_cap_is_raised() {
    let dir = tempfile::tempdir().unwrap();
    let s = write(dir.path(), "state.yaml", STATE);
    // A valid pool whose comment takes it past 4 MiB.
    let big = format!("{NODES}# {}\n", "x".repeat(4 << 20));
    let f = write(dir.path(), "big.yaml", &big);
    let r = run(&["check", "cozystack", "-f", &f, "--cluster-state", &s], "", Duration::from_secs(20));
    assert_refused_quickly(&r, &["-f", "4.0 MiB", "--max-input-size"]);
    let r = run(&["check", "cozystack", "-f", "-", "--cluster-state", &s], &big, Duration::from_secs(20));
    assert_refused_quickly(&r, &["-f", "4.0 MiB", "--max-input-size"]);
    let f = write(dir.path(), "in.yaml", NODES);
    let r = run(&["check", "cozystack", "-f", &f, "--cluster-state", "-"], &big, Duration::from_secs(20));
    assert_refused_quickly(&r, &["--cluster-state", "4.0 MiB"]);

    let big_f = write(dir.path(), "big.yaml", &big);
    let r = run(
        &["check", "cozystack", "-f", &big_f, "--cluster-state", &s, "--max-input-size", "8Mi"],
        "",
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let r = run(
        &["check", "cozystack", "-f", &big_f, "--cluster-state", &s, "--max-input-size", "lots"],
        "",
        Duration::from_secs(20),
    );
    assert_refused_quickly(&r, &["--max-input-size"]);
}

#[test]
fn issue_32_should_still_check_a_cozystack_values_document() {
    let dir = tempfile::tempdir().unwrap();
    let s = write(dir.path(), "state.yaml", STATE);
    let f = write(dir.path(), "in.yaml", NODES);
    let r = run(&["check", "cozystack", "-f", &f, "--cluster-state", &s], "", Duration::from_secs(20));
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let values = write(dir.path(), "values.yaml", "cluster: test\nstorageClass: ''\nroles: [ingress-nginx]\n");
    let r = run(
        &[
            "check",
            "cozystack",
            "-f",
            &values,
            "--cluster-state",
            &s,
            "--name",
            "test-md1",
            "--namespace",
            "tenant-test",
        ],
        "",
        Duration::from_secs(20),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
}
