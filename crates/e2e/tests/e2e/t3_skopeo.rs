//! skopeo through tender: OCI index, single-arch OCI manifest and a Docker manifest list pulled
//! intact, every blob fetched from the upstream once, and nothing fetched again when warm.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use tender_e2e::digest::{verify_dir_layout, verify_oci_layout};
use tender_e2e::proc;
use tender_e2e::registry::Sizes;
use tender_e2e::tender::{Access, Tender};

use crate::{oci, skopeo_pull, Bed};

const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const OCI_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json";

/// The top-level digests the upstream announces for the three images.
struct Upstream {
    docker_list: String,
    kubelet_index: String,
    installer: String,
}

/// Pull all three images into `round`-named directories; return every blob digest seen.
fn pull_all(bed: &Bed, t: &Tender, round: &str, want: &Upstream) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let (docker_list, kubelet_index, installer) =
        (&want.docker_list, want.kubelet_index.as_str(), want.installer.as_str());

    // A Docker manifest list: skopeo's dir: transport is the one that keeps it byte for byte.
    let docker_dir = bed.path(&format!("{round}-docker"));
    skopeo_pull(t, "ghcr.io/e2e/docker-kubelet:v1", &format!("dir:{}", docker_dir.display()));
    seen.extend(verify_dir_layout(&docker_dir, docker_list));
    let list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(docker_dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(list["mediaType"], DOCKER_LIST, "the Docker list came through as a Docker list");
    assert!(list["manifests"].as_array().unwrap().iter().all(|m| m["mediaType"] == DOCKER_MANIFEST));

    // The multi-arch OCI index, both platforms.
    let kubelet_dir = bed.path(&format!("{round}-kubelet"));
    skopeo_pull(t, "ghcr.io/siderolabs/kubelet:v1.33.1", &oci(&kubelet_dir));
    let (top, blobs) = verify_oci_layout(&kubelet_dir);
    assert_eq!(top, [kubelet_index], "the pulled index is the upstream's");
    for m in [bed.images.var("KUBELET_AMD64"), bed.images.var("KUBELET_ARM64")] {
        assert!(blobs.contains(m), "both platforms' manifests were pulled ({m})");
    }
    seen.extend(blobs);

    // The single-arch OCI manifest.
    let installer_dir = bed.path(&format!("{round}-installer"));
    skopeo_pull(t, "ghcr.io/siderolabs/installer:v1.10.5", &oci(&installer_dir));
    let (top, blobs) = verify_oci_layout(&installer_dir);
    assert_eq!(top, [installer], "the pulled manifest is the upstream's");
    seen.extend(blobs);
    seen
}

#[test]
fn should_pull_oci_and_docker_images_intact_and_fetch_each_blob_once() {
    let bed = Bed::new("skopeo", Sizes::SMALL);
    let t = bed.start_tender("tender.log");
    // The kubelet index again, converted to Docker media types (manifest list + v2 schema 2).
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
    let want = Upstream {
        docker_list: bed.registry.manifest_digest("e2e/docker-kubelet", "v1", DOCKER_LIST),
        kubelet_index: bed.registry.manifest_digest("siderolabs/kubelet", "v1.33.1", OCI_ACCEPT),
        installer: bed.registry.manifest_digest("siderolabs/installer", "v1.10.5", OCI_ACCEPT),
    };
    assert_eq!(want.kubelet_index, bed.images.var("KUBELET_INDEX"));
    assert_eq!(want.installer, bed.images.var("INSTALLER_MANIFEST"));

    let cold = pull_all(&bed, &t, "cold", &want);
    let after_cold = bed.registry.stats();
    for (digest, gets) in &after_cold.blob_gets_by_digest {
        assert_eq!(*gets, 1, "tender fetched {digest} from the upstream {gets} times; once is the point");
    }
    // What skopeo got that tender did not fetch as a blob are the manifests it served.
    let access = t.access();
    for d in cold.iter().filter(|d| !after_cold.blob_gets_by_digest.contains_key(*d)) {
        let served = access.iter().any(|a| a.path.contains("/manifests/") && &a.digest == d && a.status == 200);
        assert!(served, "{d} reached skopeo but is neither a blob fetched upstream nor a manifest tender served");
    }

    let warm = pull_all(&bed, &t, "warm", &want);
    assert_eq!(warm, cold, "the warm pull got the same content");
    let after_warm = bed.registry.stats();
    assert_eq!(
        after_warm.blob_gets, after_cold.blob_gets,
        "a warm pull fetches no blob from the upstream: {after_warm:?}"
    );
    // tender's side: per blob, the first GET was the miss that filled it, every later one a hit.
    let mut by_digest: BTreeMap<String, Vec<Access>> = BTreeMap::new();
    for a in t.access().into_iter().filter(|a| a.is_blob() && a.method == "GET") {
        by_digest.entry(a.digest.clone()).or_default().push(a);
    }
    assert_eq!(by_digest.len(), after_cold.blob_gets_by_digest.len(), "{by_digest:#?}");
    for (digest, gets) in &by_digest {
        let caches: Vec<&str> = gets.iter().map(|a| a.cache.as_str()).collect();
        assert!(gets.len() >= 2 && caches[0] == "miss", "{digest}: {caches:?}");
        assert!(caches[1..].iter().all(|c| *c == "hit"), "{digest}: later GETs are hits: {caches:?}");
        assert!(gets.iter().all(|a| a.status == 200 && a.complete), "{digest}: {gets:#?}");
    }
}
