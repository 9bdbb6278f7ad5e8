//! `tender render` end to end: the real binary, its files, its exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::process::Output;

mod cli_support;
use cli_support::{tender, write};

const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ\n-----END CERTIFICATE-----\n";

fn code(o: &Output) -> i32 {
    o.status.code().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn kinds(text: &str) -> Vec<String> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(text)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .map(|v| v["kind"].as_str().unwrap_or("").to_string())
        .collect()
}

const POOL: &str = "cluster: kubernetes-test\nnamespace: tenant-test\npool: md0\n";

const STATE: &str = r#"apiVersion: v1
kind: List
items:
- apiVersion: storage.k8s.io/v1
  kind: StorageClass
  metadata:
    name: replicated
    creationTimestamp: "2024-01-01T00:00:00Z"
    annotations:
      storageclass.kubernetes.io/is-default-class: "true"
- apiVersion: cdi.kubevirt.io/v1beta1
  kind: DataVolume
  metadata:
    name: talos-worker-ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515-v1.13.6
    namespace: cozy-public
  spec:
    storage:
      storageClassName: replicated
      resources:
        requests:
          storage: 6Gi
  status:
    phase: Succeeded
"#;

#[test]
fn should_print_talos_documents_for_registries() {
    let o = tender(
        &[
            "render",
            "registries",
            "--mirror",
            "http://tender.kube-system.svc:5000",
            "--registry",
            "ghcr.io",
            "--registry",
            "docker.io",
        ],
        None,
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(kinds(&stdout(&o)), ["RegistryMirrorConfig", "RegistryMirrorConfig"]);
    let legacy = tender(
        &["render", "registries", "--mirror", "http://m:5000", "--registry", "*", "--talos-version", "v1.11.6"],
        None,
    );
    assert_eq!(code(&legacy), 0, "{}", stderr(&legacy));
    assert!(stdout(&legacy).contains("machine:\n  registries:\n    mirrors:\n      '*':"), "{}", stdout(&legacy));
}

#[test]
fn should_write_containerd_hosts_files_with_owner_only_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let ca = write(dir.path(), "ca.pem", CA);
    let pw = write(dir.path(), "pw", "s3cret\n");
    let out = dir.path().join("certs.d");
    let o = tender(
        &[
            "render",
            "registries",
            "--format",
            "containerd",
            "--out",
            out.to_str().unwrap(),
            "--mirror",
            "https://tender.example:5000",
            "--registry",
            "ghcr.io",
            "--registry",
            "*",
            "--ca",
            &ca,
            "--username",
            "puller",
            "--password-file",
            &pw,
        ],
        None,
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let hosts = std::fs::read_to_string(out.join("ghcr.io/hosts.toml")).unwrap();
    let parsed: toml::Table = toml::from_str(&hosts).unwrap();
    assert_eq!(parsed["server"].as_str(), Some("https://ghcr.io"));
    let host = &parsed["host"]["https://tender.example:5000"];
    assert_eq!(host["capabilities"].as_array().unwrap().len(), 2);
    assert_eq!(host["ca"].as_str(), Some("ca.crt"));
    // base64("puller:s3cret"): the trailing newline of the password file is not part of it.
    assert_eq!(host["header"]["Authorization"].as_str(), Some("Basic cHVsbGVyOnMzY3JldA=="));
    assert_eq!(std::fs::read_to_string(out.join("ghcr.io/ca.crt")).unwrap(), CA);
    assert!(out.join("_default/hosts.toml").exists());
    assert!(!std::fs::read_to_string(out.join("_default/hosts.toml")).unwrap().contains("server"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(out.join("ghcr.io/hosts.toml")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "hosts.toml with credentials must be owner-only: {mode:o}");
    }
    assert!(stdout(&o).contains("ghcr.io/hosts.toml"));
}

#[test]
fn should_route_everything_to_the_mirror_alone_with_skip_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let o = tender(
        &[
            "render",
            "registries",
            "--format",
            "containerd",
            "--out",
            dir.path().to_str().unwrap(),
            "--mirror",
            "http://tender:5000/v2/ghcr",
            "--registry",
            "ghcr.io",
            "--skip-fallback",
        ],
        None,
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let parsed: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.path().join("ghcr.io/hosts.toml")).unwrap()).unwrap();
    assert_eq!(parsed["server"].as_str(), Some("http://tender:5000/v2/ghcr"));
    assert_eq!(parsed["override_path"].as_bool(), Some(true));
    // an empty [host] table (containerd 1.6 needs a host tree): the mirror is listed once
    let hosts = parsed["host"].as_table().unwrap();
    assert!(hosts.is_empty(), "{hosts:?}");
    assert!(!std::fs::read_to_string(dir.path().join("ghcr.io/hosts.toml")).unwrap().contains("https://ghcr.io"));
}

/// Issue 17 item 8: the config.toml drop-in each containerd release needs, next to the hosts
/// files, naming them by absolute path.
#[test]
fn should_write_the_containerd_drop_in_for_the_release_asked() {
    for (version, local_pull) in [("1.7", false), ("2.0.5", false), ("2.1", true), ("v2.2.0", true)] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().to_str().unwrap();
        let o = tender(
            &[
                "render",
                "registries",
                "--format",
                "containerd",
                "--out",
                out,
                "--mirror",
                "http://tender:5000",
                "--registry",
                "ghcr.io",
                "--containerd-version",
                version,
            ],
            None,
        );
        assert_eq!(code(&o), 0, "{version}: {}", stderr(&o));
        assert!(stdout(&o).contains("tender-containerd.toml"), "{version}: {}", stdout(&o));
        let text = std::fs::read_to_string(dir.path().join("tender-containerd.toml")).unwrap();
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        let plugins = parsed["plugins"].as_table().unwrap();
        let (name, plugin) = plugins.iter().next().unwrap();
        assert_eq!(plugin["registry"]["config_path"].as_str(), Some(out), "{version}: {text}");
        assert_eq!(
            plugin.get("use_local_image_pull").and_then(|v| v.as_bool()).unwrap_or(false),
            local_pull,
            "{version}"
        );
        let want = if version.trim_start_matches('v').starts_with('1') {
            "io.containerd.grpc.v1.cri"
        } else {
            "io.containerd.cri.v1.images"
        };
        assert_eq!(name, want, "{version}");
    }
    // without --format containerd, or a release it does not know: usage errors
    for args in [
        vec!["--mirror", "http://m:5000", "--registry", "ghcr.io", "--containerd-version", "2.1"],
        vec![
            "--mirror",
            "http://m:5000",
            "--registry",
            "ghcr.io",
            "--format",
            "containerd",
            "--out",
            "/nonexistent-x",
            "--containerd-version",
            "1.4",
        ],
    ] {
        let mut full = vec!["render", "registries"];
        full.extend(args.iter().copied());
        let o = tender(&full, None);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn should_exit_2_for_bad_registries_flags() {
    for args in [
        vec!["--mirror", "http://m:5000", "--registry", "ghcr.io", "--registry", "ghcr.io"],
        vec!["--mirror", "m:5000", "--registry", "ghcr.io"],
        vec!["--mirror", "http://m:5000", "--registry", "GHCR.IO"],
        vec!["--mirror", "http://m:5000", "--registry", "ghcr.io", "--format", "containerd"],
        vec!["--mirror", "http://m:5000", "--registry", "ghcr.io", "--talos-version", "1.13"],
        vec!["--mirror", "http://m:5000", "--registry", "ghcr.io", "--insecure-skip-verify"],
        vec!["--mirror", "http://m:5000"],
    ] {
        let mut full = vec!["render", "registries"];
        full.extend(args.iter().copied());
        let o = tender(&full, None);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn should_exit_2_for_builtin_without_cluster_state_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let pool = write(dir.path(), "pool.yaml", &format!("{POOL}osImage:\n  builtin: {{}}\n"));
    let o = tender(&["render", "pool", "-f", &pool], None);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--cluster-state"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
    let skipped = tender(&["render", "pool", "-f", &pool, "--skip-cluster-checks"], None);
    assert_eq!(code(&skipped), 0, "{}", stderr(&skipped));
    assert!(stderr(&skipped).contains("warning"), "{}", stderr(&skipped));
}

#[test]
fn should_render_builtin_with_the_cluster_state_piped_in() {
    let dir = tempfile::tempdir().unwrap();
    let pool = write(dir.path(), "pool.yaml", &format!("{POOL}osImage:\n  builtin: {{}}\n"));
    let o = tender(&["render", "pool", "-f", &pool, "--cluster-state", "-"], Some(STATE));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    assert_eq!(
        kinds(&text),
        ["KubevirtMachineTemplate", "MachineDeployment", "MachineHealthCheck", "TalosConfigTemplate"]
    );
    assert!(text.contains(&format!("name: talos-worker-{SCHEMATIC}-v1.13.6")), "{text}");
    // The pool file can come from standard input too, but not both.
    let both = tender(&["render", "pool", "-f", "-", "--cluster-state", "-"], Some(POOL));
    assert_eq!(code(&both), 2);
}

#[test]
fn should_exit_1_naming_the_rule_value_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    let pool = write(dir.path(), "pool.yaml", &format!("{POOL}talos:\n  version: v1.13\n"));
    let o = tender(&["render", "pool", "-f", &pool], None);
    assert_eq!(code(&o), 1);
    let err = stderr(&o);
    assert!(err.contains("R-7") && err.contains("\"v1.13\"") && err.contains("fix:"), "{err}");
    // A cluster with a StorageClass and no golden. (One without any StorageClass is an
    // incomplete state, exit 2: issue 22.)
    let state = write(
        dir.path(),
        "state.yaml",
        "apiVersion: v1\nkind: List\nitems:\n- kind: StorageClass\n  metadata:\n    name: replicated\n",
    );
    let builtin = write(dir.path(), "builtin.yaml", &format!("{POOL}osImage:\n  builtin: {{}}\n"));
    let o = tender(&["render", "pool", "-f", &builtin, "--cluster-state", &state], None);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("R-1"), "{}", stderr(&o));
}

#[test]
fn should_exit_2_for_malformed_or_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = write(dir.path(), "pool.yaml", &format!("{POOL}ephemeralStorage: 20Gi\n"));
    let o = tender(&["render", "pool", "-f", &unknown], None);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("ephemeralStorage"), "{}", stderr(&o));
    let o = tender(&["render", "pool", "-f", "/nonexistent/pool.yaml"], None);
    assert_eq!(code(&o), 2);
    let o = tender(&["render", "pool", "-f", &unknown.replace("pool.yaml", "x")], None);
    assert_eq!(code(&o), 2);
    let o = tender(&["render"], None);
    assert_eq!(code(&o), 2);
}

#[test]
fn should_print_only_the_talos_patches_with_format_patch() {
    let dir = tempfile::tempdir().unwrap();
    let pool = write(
        dir.path(),
        "pool.yaml",
        &format!(
            "{POOL}talos:\n  registryMirrors:\n    ghcr.io: {{endpoints: [http://tender.kube-system.svc:5000]}}\n"
        ),
    );
    let o = tender(&["render", "pool", "-f", &pool, "--format", "patch"], None);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(kinds(&stdout(&o)), ["", "RegistryMirrorConfig"]);
    assert!(stdout(&o).contains("image: ghcr.io/siderolabs/kubelet:v1.35.6"));
}

#[test]
fn should_render_the_catalog_and_refuse_zstd() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "tender.yaml",
        &format!("listen: 0.0.0.0:5000\nimageFactory: https://factory.talos.dev\ncatalog:\n  dir: ./goldens\n  images:\n  - schematic: {SCHEMATIC}\n    version: v1.13.6\n"),
    );
    let o =
        tender(&["render", "catalog", "--config", &config, "--source-url", "http://tender.kube-system.svc:5000"], None);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    assert_eq!(kinds(&text), ["DataVolume"]);
    assert!(text.contains("helm.sh/resource-policy: keep"));
    assert!(text.contains(&format!(
        "url: http://tender.kube-system.svc:5000/image/{SCHEMATIC}/v1.13.6/openstack-amd64.raw.xz"
    )));
    let zst = write(
        dir.path(),
        "zst.yaml",
        &format!("catalog:\n  images:\n  - {{schematic: {SCHEMATIC}, version: v1.13.6, format: raw.zst}}\n"),
    );
    let o = tender(&["render", "catalog", "--config", &zst], None);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("zstd"), "{}", stderr(&o));
    let strict = write(dir.path(), "strict.yaml", "catalog:\n  imagez: []\n");
    assert_eq!(code(&tender(&["render", "catalog", "--config", &strict], None)), 2);
}

#[test]
fn should_render_identical_bytes_on_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let pool = write(dir.path(), "pool.yaml", POOL);
    let a = tender(&["render", "pool", "-f", &pool], None);
    let b = tender(&["render", "pool", "-f", &pool, "--cluster-state", "-"], Some(STATE));
    assert_eq!(code(&a), 0);
    assert_eq!(a.stdout, b.stdout);
    assert!(stdout(&a).contains("name: kubernetes-test-md0-da9ead"));
}

// ---- issue 22 ---------------------------------------------------------------------------------

#[test]
fn issue_22_should_warn_that_g9_was_not_checked_without_cluster_state() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "tender.yaml",
        &format!("catalog:\n  images:\n  - schematic: {SCHEMATIC}\n    version: v1.13.6\n"),
    );
    let o = tender(&["render", "catalog", "--config", &config], None);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("G-9 not checked"), "{}", stderr(&o));
    let o = tender(&["render", "catalog", "--config", &config, "--cluster-state", "-"], Some(STATE));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!stderr(&o).contains("G-9 not checked"), "{}", stderr(&o));
}

#[test]
fn issue_22_should_exit_2_naming_the_kubectl_get_an_incomplete_state_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let pool = write(dir.path(), "pool.yaml", &format!("{POOL}osImage:\n  builtin: {{}}\n"));
    let o = tender(
        &["render", "pool", "-f", &pool, "--cluster-state", "-"],
        Some("apiVersion: v1\nkind: List\nitems: []\n"),
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("kubectl get storageclasses"), "{}", stderr(&o));
}

/// Issue 33, item 6: CI reading `--output json` got nothing on standard output for a usage
/// error (exit 2); it gets a JSON object saying so.
#[test]
fn should_print_a_json_error_object_on_exit_2_with_output_json() {
    let dir = tempfile::tempdir().unwrap();
    // `.inf` has no JSON form: kubectl and Helm refuse the file, a usage error (issue 33 (3)).
    let bad = write(dir.path(), "bad.yaml", "kind: KubernetesNodes\nmetadata: {name: test-md1, namespace: tenant-test}\nspec:\n  cluster: test\n  podCpuLimit: .inf\n");
    let state = write(dir.path(), "state.yaml", STATE);
    for args in [
        vec!["check", "cozystack", "-f", &bad, "--cluster-state", &state, "--output", "json"],
        vec!["check", "cozystack", "-f", &bad, "--output", "json"],
        vec!["check", "cozystack", "-f", "/nonexistent.yaml", "--cluster-state", &state, "--output", "json"],
    ] {
        let o = tender(&args, None);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        let j: serde_json::Value =
            serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{args:?}: {e}: {:?}", stdout(&o)));
        assert_eq!(j["ok"], false, "{j}");
        assert_eq!(j["exitCode"], 2, "{j}");
        assert!(j["error"].as_str().is_some_and(|e| !e.is_empty()), "{j}");
    }
}

/// Issue 33, item 6: a bad `--mirror`, cluster or pool name is a usage error naming it.
#[test]
fn should_exit_2_for_a_bad_mirror_or_resource_name_and_accept_ipv6() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "tender.yaml", "upstreams:\n- name: ghcr.io\n  url: https://ghcr.io\n");
    let run = |mirror: &str, cluster: &str| {
        tender(
            &[
                "render",
                "cozystack",
                "--config",
                &config,
                "--mirror",
                mirror,
                "--cluster",
                cluster,
                "--namespace",
                "tenant-test",
            ],
            None,
        )
    };
    assert_eq!(code(&run("http://[::1]:5000", "test")), 0);
    for (mirror, cluster, says) in [
        ("tender:5000", "test", "--mirror"),
        ("http://tender:5000/sub", "test", "--mirror"),
        ("http://tender:5000", "1test", "DNS-1035"),
    ] {
        let o = run(mirror, cluster);
        assert_eq!(code(&o), 2, "{mirror} {cluster}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{}", stderr(&o));
    }
}

/// Issue 34, item 4: `render registries --config` reads tender's `imageVerification`: the
/// namespaces a refusing rule covers lose the upstream fallback, and Talos nodes get the policy
/// as an `ImageVerificationConfig` document.
#[test]
fn should_skip_the_fallback_under_a_refusing_rule_and_write_the_node_policy() {
    const KEY: &str = include_str!("../../../testdata/sigstore/keyed/cosign.pub");
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "tender.yaml",
        &format!(
            "listen: 0.0.0.0:5000\nimageVerification:\n  rules:\n  - image: ghcr.io/siderolabs/*\n    publicKey:\n      key: {KEY:?}\n  - image: '*'\n    skip: true\n"
        ),
    );
    let base =
        ["render", "registries", "--mirror", "http://tender:5000", "--registry", "ghcr.io", "--registry", "quay.io"];
    let run = |extra: &[&str]| tender(&[&base[..], extra].concat(), None);
    let o = run(&["--config", &config]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(kinds(&out), ["RegistryMirrorConfig", "RegistryMirrorConfig", "ImageVerificationConfig"], "{out}");
    assert!(out.contains("name: ghcr.io\nskipFallback: true\n"), "{out}");
    assert!(out.contains("- url: https://quay.io\n"), "{out}");
    assert!(out.contains("certificate: |\n      -----BEGIN PUBLIC KEY-----\n"), "{out}");
    assert!(stderr(&o).contains("tender: note: ghcr.io: "), "{}", stderr(&o));
    // --no-node-policy: the fallback stays off, no document
    let o = run(&["--config", &config, "--no-node-policy"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(kinds(&stdout(&o)), ["RegistryMirrorConfig", "RegistryMirrorConfig"]);
    assert!(stdout(&o).contains("skipFallback: true"));
    // containerd: ghcr.io goes to tender alone
    let certs = dir.path().join("certs.d");
    let o = run(&["--config", &config, "--format", "containerd", "--out", certs.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let ghcr: toml::Table =
        toml::from_str(&std::fs::read_to_string(certs.join("ghcr.io/hosts.toml")).unwrap()).unwrap();
    assert_eq!(ghcr["server"].as_str(), Some("http://tender:5000"));
    let quay: toml::Table =
        toml::from_str(&std::fs::read_to_string(certs.join("quay.io/hosts.toml")).unwrap()).unwrap();
    assert_eq!(quay["server"].as_str(), Some("https://quay.io"));
    // a Talos ImageVerificationConfig document works as well
    let doc = write(
        dir.path(),
        "ivc.yaml",
        "apiVersion: v1alpha1\nkind: ImageVerificationConfig\nrules:\n  - image: quay.io/*\n    deny: true\n",
    );
    let o = run(&["--config", &doc]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("name: quay.io\nskipFallback: true\n"), "{}", stdout(&o));
    // a config without imageVerification changes nothing, and says so
    let plain = write(dir.path(), "plain.yaml", "listen: 0.0.0.0:5000\n");
    let o = run(&["--config", &plain]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), stdout(&run(&[])));
    assert!(stderr(&o).contains("no imageVerification"), "{}", stderr(&o));
    // usage errors, exit 2
    let bad =
        write(dir.path(), "bad.yaml", "imageVerification:\n  rules:\n  - image: x/*\n    publicKey: {key: nope}\n");
    let missing = dir.path().join("missing.yaml");
    let certs = certs.to_str().unwrap();
    for args in [
        vec!["--config", bad.as_str()],
        vec!["--config", missing.to_str().unwrap()],
        vec!["--no-node-policy"],
        vec!["--config", config.as_str(), "--no-node-policy", "--format", "containerd", "--out", certs],
    ] {
        let o = run(&args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
    assert!(stderr(&run(&["--config", bad.as_str()])).contains("imageVerification.rules[0].publicKey.key"));
}
