//! Issue 17 with real clients: a v2s2-only client never changes what a multi-arch tag means
//! for containerd and skopeo asking for arm64, with the upstream up and stopped.

use std::path::Path;
use std::process::Command;

use tender_e2e::containerd::Containerd;
use tender_e2e::digest::{hex_of, sha256};
use tender_e2e::proc;
use tender_e2e::registry::Sizes;
use tender_e2e::tender::{write_config, Tender};

use crate::Bed;

const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const ALL_MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// The digest tender announces for `path` with `accept`.
fn digest_through(t: &Tender, path: &str, accept: &str) -> String {
    let r = tender_e2e::http::request(t.hostport().parse().unwrap(), "GET", path, &[("Accept", accept)]).unwrap();
    assert_eq!(r.status(), 200, "GET {path} with Accept {accept}: {}", r.text());
    r.header("docker-content-digest").unwrap().to_string()
}

/// Every tag record tender holds for `repository:tag`, as (digest, media type).
fn tag_records(data: &Path, repository: &str, tag: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![data.join("tags")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&std::fs::read(&p).unwrap_or_default()) {
                if v["repository"] == repository && v["tag"] == tag {
                    out.push((v["digest"].as_str().unwrap_or("").into(), v["mediaType"].as_str().unwrap_or("").into()));
                }
            }
        }
    }
    out
}

/// The digest of the upstream list's entry for linux/`arch`.
fn list_entry(bed: &Bed, arch: &str) -> String {
    let r = tender_e2e::http::request(
        bed.registry.hostport().parse().unwrap(),
        "GET",
        "/v2/e2e/docker-kubelet/manifests/v1",
        &[("Accept", DOCKER_LIST)],
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    let entries = v["manifests"].as_array().unwrap();
    let e = entries.iter().find(|e| e["platform"]["architecture"] == arch).unwrap();
    e["digest"].as_str().unwrap().to_string()
}

/// `skopeo copy --override-arch arm64` of the tag through tender into `dir:`; the digest of
/// the manifest it chose.
fn skopeo_arm64(t: &Tender, dest: &Path) -> String {
    proc::run(Command::new("skopeo").args([
        "copy",
        "-q",
        "--override-arch",
        "arm64",
        "--src-tls-verify=false",
        &format!("docker://{}/ghcr.io/e2e/docker-kubelet:v1", t.hostport()),
        &format!("dir:{}", dest.display()),
    ]));
    sha256(&std::fs::read(dest.join("manifest.json")).unwrap())
}

/// `ctr images pull --platform linux/arm64` of the tag through tender, in namespace `ns`.
fn ctr_arm64(ctrd: &Containerd, hosts: &Path, ns: &str) {
    let pull = ctrd.ctr(&[
        "-n",
        ns,
        "images",
        "pull",
        "--hosts-dir",
        hosts.to_str().unwrap(),
        "--platform",
        "linux/arm64",
        "--snapshotter",
        "native",
        "ghcr.io/e2e/docker-kubelet:v1",
    ]);
    assert!(
        pull.status.success(),
        "ctr --platform linux/arm64 ({ns}):\n{}{}",
        String::from_utf8_lossy(&pull.stdout),
        String::from_utf8_lossy(&pull.stderr)
    );
}

#[test]
fn should_serve_arm64_after_a_v2s2_only_client_also_with_the_upstream_stopped() {
    let bed = Bed::new("multiarch", Sizes::SMALL);
    proc::need(&["skopeo", "containerd", "ctr"]);
    // The kubelet index as a Docker manifest list of v2s2 manifests (amd64 + arm64).
    proc::run(Command::new("skopeo").args([
        "copy",
        "-q",
        "--all",
        "--format",
        "v2s2",
        "--dest-tls-verify=false",
        &format!("oci:{}:kubelet", bed.images.layout().display()),
        &format!("docker://{}/e2e/docker-kubelet:v1", bed.registry.hostport()),
    ]));
    let list = bed.registry.manifest_digest("e2e/docker-kubelet", "v1", DOCKER_LIST);
    let amd64 = bed.registry.manifest_digest("e2e/docker-kubelet", "v1", DOCKER_MANIFEST);
    // No tag TTL: every request below asks the upstream again (or finds it stopped).
    write_config(&bed.path("tender.yaml"), &[("ghcr.io", &bed.registry.url())], "fetch:\n  tagTtl: 0s\n");
    let t = bed.start_tender("tender.log");
    let path = "/v2/ghcr.io/e2e/docker-kubelet/manifests/v1";

    // 1. a client that accepts only Docker v2s2 comes first: it gets linux/amd64
    assert_eq!(digest_through(&t, path, DOCKER_MANIFEST), amd64);
    // the tag's record still names the list, and a full client gets the list
    assert_eq!(tag_records(&bed.path("data"), "e2e/docker-kubelet", "v1"), [(list.clone(), DOCKER_LIST.to_string())]);
    assert_eq!(digest_through(&t, path, ALL_MANIFESTS), list);

    // 2. real clients asking for arm64 get arm64
    let ctrd = Containerd::start(&bed.path("containerd"));
    let hosts = ctrd.hosts_dir("ghcr.io", &t.hostport());
    let arm64 = skopeo_arm64(&t, &bed.path("skopeo-up"));
    assert_ne!(arm64, amd64, "skopeo --override-arch arm64 got the amd64 manifest");
    assert_eq!(arm64, list_entry(&bed, "arm64"), "skopeo got the list's arm64 entry");
    ctr_arm64(&ctrd, &hosts, "up");
    assert!(ctrd.content_blobs().join(hex_of(&arm64)).exists(), "containerd fetched the arm64 manifest");
    assert!(!ctrd.content_blobs().join(hex_of(&amd64)).exists(), "containerd never saw the amd64 manifest");

    // 3. the upstream stopped: the same answers from the store, stale
    let Bed { registry, images: _images, dir: _dir } = bed;
    drop(registry);
    assert_eq!(digest_through(&t, path, DOCKER_MANIFEST), amd64);
    assert_eq!(digest_through(&t, path, ALL_MANIFESTS), list);
    assert_eq!(skopeo_arm64(&t, &_dir.path().join("skopeo-down")), arm64);
    ctr_arm64(&ctrd, &hosts, "down");
    assert_eq!(tag_records(&_dir.path().join("data"), "e2e/docker-kubelet", "v1"), [(list, DOCKER_LIST.to_string())]);
    let stale = t.access().iter().filter(|a| a.cache == "stale").count();
    assert!(stale > 0, "the answers with the upstream stopped were stale ones");
}
