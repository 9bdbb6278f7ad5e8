//! Issue 37's protocol corners, with docker-registry as the reference: each case is asked of
//! the reference registry itself and of tender in front of it, and tender must answer as the
//! reference does (or, where the reference has no rule, as the distribution spec says).

use std::net::SocketAddr;
use std::path::Path;

use tender_e2e::digest::sha256;
use tender_e2e::registry::Sizes;
use tender_e2e::tender::write_config;

use crate::t15_protocol::{push_manifest, OCI_MANIFEST};
use crate::Bed;

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// A case: what it is, the path after `/v2/<repository>/`, the request's headers.
type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>);

/// The distribution spec's fourteen error codes: no JSON error body carries another.
const SPEC_CODES: [&str; 14] = [
    "BLOB_UNKNOWN",
    "BLOB_UPLOAD_INVALID",
    "BLOB_UPLOAD_UNKNOWN",
    "DIGEST_INVALID",
    "MANIFEST_BLOB_UNKNOWN",
    "MANIFEST_INVALID",
    "MANIFEST_UNKNOWN",
    "NAME_INVALID",
    "NAME_UNKNOWN",
    "SIZE_INVALID",
    "UNAUTHORIZED",
    "DENIED",
    "UNSUPPORTED",
    "TOOMANYREQUESTS",
];

/// (status, the first error code of a JSON error body or ""). Read raw to the connection's
/// end: the reference registry's 416 announces the blob's length and sends less.
fn answer(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let code = serde_json::from_str::<serde_json::Value>(body.trim())
        .ok()
        .and_then(|v| v["errors"][0]["code"].as_str().map(str::to_string))
        .unwrap_or_default();
    (status, code)
}

/// Push a small image: a config, one layer, an OCI manifest tagged `oci`, an OCI index naming
/// it tagged `index`, and a Docker v2s2 manifest of the same blobs tagged `docker`. Returns
/// (OCI manifest digest, layer digest, layer bytes).
fn push_image(reg: &str, repo: &str, work: &Path) -> (String, String, Vec<u8>) {
    let layer: Vec<u8> = (0..20_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let config = br#"{"architecture":"amd64","os":"linux"}"#.to_vec();
    let (ld, cd) = (sha256(&layer), sha256(&config));
    crate::t15_protocol::push_blob(reg, repo, &layer, work);
    crate::t15_protocol::push_blob(reg, repo, &config, work);
    let body = |mt: &str, cmt: &str, lmt: &str| {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{mt}","config":{{"mediaType":"{cmt}","digest":"{cd}","size":{}}},"layers":[{{"mediaType":"{lmt}","digest":"{ld}","size":{}}}]}}"#,
            config.len(),
            layer.len()
        )
    };
    let oci = body(OCI_MANIFEST, "application/vnd.oci.image.config.v1+json", "application/vnd.oci.image.layer.v1.tar");
    let md = push_manifest(reg, repo, "oci", OCI_MANIFEST, &oci, work);
    let index = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{{"mediaType":"{OCI_MANIFEST}","digest":"{md}","size":{},"platform":{{"architecture":"amd64","os":"linux"}}}}]}}"#,
        oci.len()
    );
    push_manifest(reg, repo, "index", OCI_INDEX, &index, work);
    let docker = body(
        DOCKER_MANIFEST,
        "application/vnd.docker.container.image.v1+json",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
    );
    push_manifest(reg, repo, "docker", DOCKER_MANIFEST, &docker, work);
    (md, ld, layer)
}

/// Accept honoured, a bad `n`, a bad `Range`, a bad reference: tender answers each as the
/// reference registry does, with spec error codes only; and the access log says `revalidated`
/// for an answer that asked the upstream, `hit` only when it did not.
#[test]
fn should_answer_protocol_corners_as_the_reference_registry_does() {
    let bed = Bed::new("corners", Sizes::SMALL);
    let (reg, repo) = (bed.registry.hostport(), "e2e/corners");
    let work = bed.path("push");
    std::fs::create_dir_all(&work).unwrap();
    let (md, ld, layer) = push_image(&reg, repo, &work);
    // The same registry under a second name: an object stored for ghcr.io is confirmed there.
    let url = bed.registry.url();
    write_config(&bed.path("tender.yaml"), &[("ghcr.io", &url), ("quay.io", &url)], "");
    let t = bed.start_tender("tender.log");
    let (reference, tender): (SocketAddr, SocketAddr) = (reg.parse().unwrap(), t.hostport().parse().unwrap());
    let docker_only = [("Accept", DOCKER_MANIFEST)];
    let docker_both = format!("{DOCKER_MANIFEST}, {DOCKER_LIST}");
    let oci_only = [("Accept", OCI_MANIFEST)];
    let cases: Vec<Case> = vec![
        ("docker-only client, tag naming an OCI index", "manifests/index".into(), docker_only.to_vec()),
        ("docker-only client, tag naming an OCI manifest", "manifests/oci".into(), docker_only.to_vec()),
        ("docker-only client, OCI manifest by digest", format!("manifests/{md}"), docker_only.to_vec()),
        (
            "docker list+manifest client, tag naming an OCI index",
            "manifests/index".into(),
            vec![("Accept", &docker_both)],
        ),
        ("OCI-manifest-only client, tag naming an OCI index", "manifests/index".into(), oci_only.to_vec()),
        ("OCI client, tag naming an OCI manifest", "manifests/oci".into(), oci_only.to_vec()),
        ("docker client, docker manifest", "manifests/docker".into(), docker_only.to_vec()),
        ("a page size that is not a number", "tags/list?n=abc".into(), vec![]),
        ("a range past the end", format!("blobs/{ld}"), vec![("Range", "bytes=999999-")]),
        ("a range that is no range", format!("blobs/{ld}"), vec![("Range", "bytes=abc")]),
        ("a digest of an unknown algorithm", "blobs/md5:abc".into(), vec![]),
    ];
    for (what, rest, headers) in &cases {
        let want = answer(reference, "GET", &format!("/v2/{repo}/{rest}"), headers);
        let got = answer(tender, "GET", &format!("/v2/ghcr.io/{repo}/{rest}"), headers);
        assert_eq!(got, want, "{what}: tender (left) against the reference registry (right)");
        assert!(got.1.is_empty() || SPEC_CODES.contains(&got.1.as_str()), "{what}: {got:?}");
    }
    // A 416 names the size, as the reference's does.
    let path = format!("blobs/{ld}");
    let r =
        tender_e2e::http::request(tender, "GET", &format!("/v2/ghcr.io/{repo}/{path}"), &[("Range", "bytes=999999-")])
            .unwrap();
    assert_eq!(r.header("content-range"), Some(format!("bytes */{}", layer.len()).as_str()));

    // Cache status: the layer is stored (ghcr.io); through quay.io tender asks the upstream
    // whether it holds it: revalidated. Asked again: recorded, a hit.
    let blob =
        |up: &str| tender_e2e::http::request(tender, "GET", &format!("/v2/{up}/{repo}/blobs/{ld}"), &[]).unwrap();
    assert!(blob("ghcr.io").body == layer);
    assert!(blob("quay.io").body == layer);
    assert!(blob("quay.io").body == layer);
    let caches: Vec<String> = t
        .access()
        .into_iter()
        .filter(|a| a.path == format!("/v2/quay.io/{repo}/blobs/{ld}") && a.method == "GET")
        .map(|a| a.cache)
        .collect();
    assert_eq!(caches, ["revalidated", "hit"], "the first answer asked the upstream");
}

/// A blob over the upstream's `maxObjectSize` is refused alike by HEAD and GET (403 DENIED
/// with the reason); a manifest over `limits.maxManifestSize` is refused with 403 DENIED naming
/// the limit, and not fetched again while the refusal is remembered.
#[test]
fn should_refuse_what_is_over_a_limit_alike_for_head_and_get() {
    let bed = Bed::new("limits", Sizes::SMALL);
    let (reg, repo) = (bed.registry.hostport(), "e2e/limits");
    let work = bed.path("push");
    std::fs::create_dir_all(&work).unwrap();
    let (_md, ld, _layer) = push_image(&reg, repo, &work);
    // A manifest of 20 KiB (annotations make it big): over a 16 KiB limit.
    let pad = "x".repeat(20 << 10);
    let big = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2}},"layers":[],"annotations":{{"pad":"{pad}"}}}}"#
    );
    crate::t15_protocol::push_blob(&reg, repo, b"{}", &work);
    push_manifest(&reg, repo, "big", OCI_MANIFEST, &big, &work);
    let yaml = format!(
        "upstreams:\n  - name: ghcr.io\n    url: {}\n    maxObjectSize: 10Ki\nlimits:\n  maxManifestSize: 16Ki\n",
        bed.registry.url()
    );
    std::fs::write(bed.path("tender.yaml"), yaml).unwrap();
    let t = bed.start_tender("tender.log");
    let tender: SocketAddr = t.hostport().parse().unwrap();
    let path = format!("/v2/ghcr.io/{repo}/blobs/{ld}");
    for method in ["HEAD", "GET", "HEAD"] {
        let r = tender_e2e::http::request(tender, method, &path, &[]).unwrap();
        assert_eq!(r.status(), 403, "{method} of a 20,000-byte blob over maxObjectSize 10Ki");
        if method == "GET" {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(v["errors"][0]["code"], "DENIED");
            assert!(v["errors"][0]["message"].as_str().unwrap().contains("maxObjectSize"), "{v}");
        }
    }
    let offset = bed.registry.log_len();
    let mpath = format!("/v2/ghcr.io/{repo}/manifests/big");
    for _ in 0..3 {
        let r = tender_e2e::http::request(tender, "GET", &mpath, &[]).unwrap();
        assert_eq!(r.status(), 403, "{}", r.text());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["errors"][0]["code"], "DENIED");
        assert!(v["errors"][0]["message"].as_str().unwrap().contains("limits.maxManifestSize"), "{v}");
    }
    let gets = bed.registry.requests_since(offset).iter().filter(|l| l.contains("/manifests/big")).count();
    assert_eq!(gets, 1, "the refusal is remembered: the upstream was asked once");
}
