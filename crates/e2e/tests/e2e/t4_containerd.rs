//! containerd through tender the way a node uses a mirror: hosts.toml maps ghcr.io to tender,
//! containerd sends `?ns=ghcr.io`, and ghcr.io itself is unreachable.

use tender_e2e::containerd::{Containerd, UNREACHABLE};
use tender_e2e::digest::{hex_of, sha256_file};
use tender_e2e::registry::Sizes;

use crate::Bed;

#[test]
fn should_serve_containerd_through_the_ns_route_with_ghcr_unreachable() {
    let bed = Bed::new("containerd", Sizes::SMALL);
    let t = bed.start_tender("tender.log");
    let ctrd = Containerd::start(&bed.path("containerd"));
    let hosts = ctrd.hosts_dir("ghcr.io", &t.hostport());
    let image = "ghcr.io/siderolabs/kubelet:v1.33.1";

    // The native snapshotter unpacks without overlay mounts, so this works in any container;
    // unpacking checks every layer against the config's diff_ids.
    let pull = ctrd.ctr(&[
        "--debug",
        "-n",
        "e2e",
        "images",
        "pull",
        "--hosts-dir",
        hosts.to_str().unwrap(),
        "--platform",
        "linux/amd64",
        "--snapshotter",
        "native",
        image,
    ]);
    assert!(
        pull.status.success(),
        "ctr images pull through tender failed:\n{}{}",
        String::from_utf8_lossy(&pull.stdout),
        String::from_utf8_lossy(&pull.stderr)
    );
    // ctr --debug logs every registry request: all went to tender with ns=ghcr.io, none to the
    // fallback standing in for ghcr.io.
    let debug = format!("{}{}", String::from_utf8_lossy(&pull.stdout), String::from_utf8_lossy(&pull.stderr));
    let fallback = UNREACHABLE.trim_start_matches("http://");
    assert!(debug.contains(&format!("{}/v2/", t.hostport())), "ctr --debug shows requests to tender:\n{debug}");
    assert!(debug.contains("ns=ghcr.io"), "containerd sent ns=ghcr.io:\n{debug}");
    assert!(!debug.contains(&format!("{fallback}/")), "containerd never fell back to the upstream:\n{debug}");

    // The image containerd recorded is the upstream's index.
    let index = bed.images.var("KUBELET_INDEX");
    let ls = ctrd.ctr(&["-n", "e2e", "images", "ls"]);
    let ls = String::from_utf8_lossy(&ls.stdout).into_owned();
    let line = ls.lines().find(|l| l.starts_with(image)).unwrap_or_else(|| panic!("{image} not in:\n{ls}"));
    assert!(line.contains(index), "containerd's image is the upstream index {index}: {line}");

    // Every blob in containerd's content store hashes to its name, and the amd64 image is whole.
    let store = ctrd.content_blobs();
    let mut have = Vec::new();
    for e in std::fs::read_dir(&store).unwrap() {
        let p = e.unwrap().path();
        let name = format!("sha256:{}", p.file_name().unwrap().to_string_lossy());
        assert_eq!(sha256_file(&p), name, "{} does not hash to its name", p.display());
        have.push(name);
    }
    let amd64 = bed.images.var("KUBELET_AMD64");
    let mut want = vec![index.to_string(), amd64.to_string()];
    want.extend(bed.images.config_and_layers(amd64));
    for d in &want {
        assert!(have.contains(d), "{d} is missing from containerd's content store ({have:?})");
        let ours = std::fs::read(store.join(hex_of(d))).unwrap();
        assert_eq!(ours, std::fs::read(bed.images.blob_path(d)).unwrap(), "{d} differs from the source");
    }
    let snaps = ctrd.ctr(&["-n", "e2e", "snapshots", "--snapshotter", "native", "ls"]);
    let snaps = String::from_utf8_lossy(&snaps.stdout).into_owned();
    assert!(snaps.lines().filter(|l| l.contains("Committed")).count() >= 2, "both layers unpacked:\n{snaps}");

    // tender saw containerd's ns=ghcr.io on every registry request, and filled the blobs.
    let access = t.access();
    let registry_requests: Vec<_> = access.iter().filter(|a| a.path.starts_with("/v2/") && a.path != "/v2/").collect();
    assert!(!registry_requests.is_empty());
    for a in &registry_requests {
        assert_eq!((a.ns.as_str(), a.upstream.as_str(), a.status), ("ghcr.io", "ghcr.io", 200), "{a:?}");
        assert!(!a.path.starts_with("/v2/ghcr.io/"), "containerd asks by the plain name: {a:?}");
    }
    let blob_misses =
        registry_requests.iter().filter(|a| a.is_blob() && a.method == "GET" && a.cache == "miss").count();
    assert_eq!(
        blob_misses,
        want.len() - 2,
        "config and layers were filled through the ns route: {registry_requests:#?}"
    );
}
