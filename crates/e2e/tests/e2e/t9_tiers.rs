//! Tiered caches: clients → tender (edge, `--parent`) → tender (site) → docker-registry.
//! The edge learns the site's upstream names, routes them through it, and every object
//! crosses the upstream link once in total, however many clients pull at once.

use std::process::Command;

use tender_e2e::digest::verify_oci_layout;
use tender_e2e::proc;
use tender_e2e::registry::Sizes;
use tender_e2e::tender::{write_config, Tender};

use crate::{spawn_pull, wait_pulls, Bed};

#[test]
fn should_fetch_each_object_once_through_two_tiers_and_refuse_unknown_names_at_the_edge() {
    proc::need(&["skopeo"]);
    let bed = Bed::new("tiers", Sizes::SMALL);
    let site = bed.start_tender("site.log");
    // The edge's own config names no upstream: it routes what its parent routes.
    write_config(&bed.path("edge.yaml"), &[], "");
    let parent = format!("http://{}", site.hostport());
    let edge = Tender::start_with(
        &bed.path("edge.yaml"),
        &bed.path("edge-data"),
        &bed.path("edge.log"),
        &["--parent", &parent],
    );

    // The edge answers the same upstream list as the site.
    let listed = tender_e2e::http::get(edge.addr, "/api/v1/upstreams").unwrap();
    assert_eq!(listed.status(), 200);
    let body: serde_json::Value = serde_json::from_slice(&listed.body).unwrap();
    assert_eq!(body["upstreams"], serde_json::json!(["ghcr.io"]), "{body}");

    // Four skopeo clients at once through the edge.
    let pulls = (0..4)
        .map(|i| {
            let dest = bed.path(&format!("pull-{i}"));
            (dest.clone(), spawn_pull(&edge.hostport(), "ghcr.io/siderolabs/kubelet:v1.33.1", &dest))
        })
        .collect();
    let index = bed.images.var("KUBELET_INDEX");
    wait_pulls(pulls, index, "the edge");

    // The upstream served each blob once, for both tiers and four clients together.
    let stats = bed.registry.stats();
    assert!(!stats.blob_gets_by_digest.is_empty(), "blobs came from the upstream");
    for (digest, gets) in &stats.blob_gets_by_digest {
        assert_eq!(*gets, 1, "{digest} fetched {gets} times from the upstream");
    }
    // The edge asked the site with ns=ghcr.io, never the upstream.
    let site_access = site.access();
    assert!(site_access.iter().any(|a| a.is_blob() && a.ns == "ghcr.io"), "the edge named the upstream by ns");

    // A name the parent does not route is refused at the edge: nothing reaches the site.
    let before = site.access().len();
    let refused = tender_e2e::http::get(edge.addr, "/v2/a/b/manifests/latest?ns=quay.io").unwrap();
    assert_eq!(refused.status(), 404);
    assert_eq!(site.access().len(), before, "the edge did not forward an unknown name");

    // The site goes away and the edge restarts: it routes the names it saved and serves what
    // it holds.
    let _ = site.terminate(std::time::Duration::from_secs(10));
    let _ = edge.terminate(std::time::Duration::from_secs(10));
    let edge = Tender::start_with(
        &bed.path("edge.yaml"),
        &bed.path("edge-data"),
        &bed.path("edge2.log"),
        &["--parent", &parent],
    );
    let dest = bed.path("pull-offline");
    let out = Command::new("skopeo")
        .args([
            "copy",
            "-q",
            "--all",
            "--preserve-digests",
            "--src-tls-verify=false",
            &format!("docker://{}/ghcr.io/siderolabs/kubelet:v1.33.1", edge.hostport()),
        ])
        .arg(format!("oci:{}", dest.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo through the edge with its parent down:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(verify_oci_layout(&dest).0, [index]);
    drop(edge);
}
