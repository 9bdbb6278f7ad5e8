//! The containerd output of `tender render registries` used by a real containerd: the rendered
//! `certs.d/ghcr.io/hosts.toml` (with `--skip-fallback`, so a failing mirror can never send the
//! test to the internet) pulls a multi-arch image through tender.

use std::process::Command;

use tender_e2e::containerd::Containerd;
use tender_e2e::paths::tender_bin;
use tender_e2e::proc;
use tender_e2e::registry::Sizes;

use crate::Bed;

/// `tender render registries --format containerd --skip-fallback` for ghcr.io through
/// `mirror`, into `certs`; the hosts.toml it wrote.
fn render_hosts_toml(mirror: &str, certs: &std::path::Path) -> String {
    proc::run(Command::new(tender_bin()).args([
        "render",
        "registries",
        "--format",
        "containerd",
        "--mirror",
        mirror,
        "--registry",
        "ghcr.io",
        "--skip-fallback",
        "--out",
        certs.to_str().unwrap(),
    ]));
    std::fs::read_to_string(certs.join("ghcr.io/hosts.toml")).unwrap()
}

/// `ctr images pull` of the test bed's kubelet (linux/amd64) with the hosts files under `certs`;
/// it must succeed and list the image at `index`.
fn pull_kubelet(ctrd: &Containerd, certs: &std::path::Path, index: &str, how: &str) {
    let image = "ghcr.io/siderolabs/kubelet:v1.33.1";
    let pull = ctrd.ctr(&[
        "-n",
        "e2e",
        "images",
        "pull",
        "--hosts-dir",
        certs.to_str().unwrap(),
        "--platform",
        "linux/amd64",
        "--snapshotter",
        "native",
        image,
    ]);
    assert!(
        pull.status.success(),
        "ctr images pull {how} failed:\n{}{}",
        String::from_utf8_lossy(&pull.stdout),
        String::from_utf8_lossy(&pull.stderr)
    );
    let ls = String::from_utf8_lossy(&ctrd.ctr(&["-n", "e2e", "images", "ls"]).stdout).into_owned();
    assert!(ls.lines().any(|l| l.starts_with(image) && l.contains(index)), "{image} at {index} in:\n{ls}");
}

#[test]
fn should_pull_through_tender_with_the_rendered_containerd_hosts_toml() {
    let bed = Bed::new("render-containerd", Sizes::SMALL);
    let t = bed.start_tender("tender.log");
    let ctrd = Containerd::start(&bed.path("containerd"));
    let certs = bed.path("certs.d");
    let rendered = render_hosts_toml(&format!("http://{}", t.hostport()), &certs);
    assert!(rendered.contains(&t.hostport()), "{rendered}");
    assert!(!rendered.contains("https://ghcr.io"), "no fallback to the real registry: {rendered}");

    // A miss containerd cannot resolve: asked of tender once, not once per listed host.
    let missing = ctrd.ctr(&[
        "-n",
        "e2e",
        "images",
        "pull",
        "--hosts-dir",
        certs.to_str().unwrap(),
        "--snapshotter",
        "native",
        "ghcr.io/siderolabs/kubelet:no-such-tag",
    ]);
    assert!(!missing.status.success(), "a tag the upstream lacks does not pull");
    let asked = t.access().iter().filter(|a| a.path.contains("/manifests/no-such-tag")).count();
    assert_eq!(asked, 1, "containerd asked tender once for the missing tag");
    // issue 17 item 7: tender is listed once (as `server`), with the empty `[host]` table that
    // containerd 1.6 needs, exactly as docs/render.md shows it
    let mirror = format!("http://{}", t.hostport());
    assert_eq!(rendered, format!("server = \"{mirror}\"\ncapabilities = [\"pull\", \"resolve\"]\n\n[host]\n"));

    pull_kubelet(&ctrd, &certs, bed.images.var("KUBELET_INDEX"), "with the rendered hosts.toml");
    // containerd sent ns=ghcr.io to the mirror, and every request reached the ghcr.io upstream
    let access = t.access();
    let registry: Vec<_> = access
        .iter()
        .filter(|a| a.path.starts_with("/v2/") && a.path != "/v2/" && !a.path.contains("no-such-tag"))
        .collect();
    assert!(!registry.is_empty());
    for a in &registry {
        assert_eq!((a.ns.as_str(), a.upstream.as_str(), a.status), ("ghcr.io", "ghcr.io", 200), "{a:?}");
    }
}

/// Issue 17 item 5: a path-routed mirror (`override_path`) makes containerd send both a path
/// prefix and `ns`; the prefix names the upstream and the pull works.
#[test]
fn should_pull_through_a_path_routed_mirror_with_override_path() {
    let bed = Bed::new("render-override-path", Sizes::SMALL);
    let t = bed.start_tender("tender.log");
    let ctrd = Containerd::start(&bed.path("containerd"));
    let certs = bed.path("certs.d");
    let rendered = render_hosts_toml(&format!("http://{}/v2/ghcr.io", t.hostport()), &certs);
    assert!(rendered.contains("override_path = true"), "{rendered}");
    pull_kubelet(&ctrd, &certs, bed.images.var("KUBELET_INDEX"), "through a path-routed mirror");
    let access = t.access();
    let registry: Vec<_> = access.iter().filter(|a| a.path.starts_with("/v2/ghcr.io/")).collect();
    assert!(!registry.is_empty(), "containerd used the path prefix: {access:#?}");
    for a in &registry {
        assert_eq!((a.ns.as_str(), a.upstream.as_str(), a.status), ("ghcr.io", "ghcr.io", 200), "{a:?}");
    }
}

/// Issue 38 (6): `--mirror` repeated for a node in a rack, its rack tender first and the parent
/// second, with `--skip-fallback`. The rack is down: containerd pulls from the parent (the file's
/// second host) and never reaches for the registry itself.
#[test]
fn should_pull_from_the_parent_when_the_rack_tender_named_first_is_down() {
    let bed = Bed::new("render-tree", Sizes::SMALL);
    let parent = bed.start_tender("parent.log");
    let ctrd = Containerd::start(&bed.path("containerd"));
    let certs = bed.path("certs.d");
    // A rack tender that is down: a loopback port nothing listens on.
    let rack = format!("http://127.0.0.1:{}", tender_e2e::registry::free_port());
    let parent_url = format!("http://{}", parent.hostport());
    proc::run(Command::new(tender_bin()).args([
        "render",
        "registries",
        "--format",
        "containerd",
        "--mirror",
        &rack,
        "--mirror",
        &parent_url,
        "--registry",
        "ghcr.io",
        "--skip-fallback",
        "--out",
        certs.to_str().unwrap(),
    ]));
    let rendered = std::fs::read_to_string(certs.join("ghcr.io/hosts.toml")).unwrap();
    // containerd tries the [host] tables in file order and `server` last.
    assert_eq!(
        rendered,
        format!("server = \"{parent_url}\"\ncapabilities = [\"pull\", \"resolve\"]\n\n[host.\"{rack}\"]\ncapabilities = [\"pull\", \"resolve\"]\n")
    );
    pull_kubelet(&ctrd, &certs, bed.images.var("KUBELET_INDEX"), "past a dead rack tender");
    assert!(parent.access().iter().any(|a| a.is_blob() && a.status == 200), "the parent served the blobs");
}
