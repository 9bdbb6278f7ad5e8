//! Issue 17 with real clients: a v2s2-only client never changes what a multi-arch tag means
//! for containerd and skopeo asking for arm64, with the upstream up and stopped.

use std::path::Path;
use std::process::Command;

use tender_e2e::containerd::Containerd;
use tender_e2e::digest::{hex_of, sha256, sha512};
use tender_e2e::proc;
use tender_e2e::registry::Sizes;
use tender_e2e::tender::{self, write_config, Tender};

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
    ctr_pull_arm64(ctrd, hosts, ns, "ghcr.io/e2e/docker-kubelet:v1");
}

/// `ctr images pull --platform linux/arm64` of `image` with the hosts directory `hosts`.
pub(crate) fn ctr_pull_arm64(ctrd: &Containerd, hosts: &Path, ns: &str, image: &str) {
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
        image,
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

pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const SIGNATURE: &str = "application/vnd.example.signature.v1";

/// Push a blob to docker-registry (POST an upload, PUT it with the digest); its digest.
pub(crate) fn push_blob(registry: &str, repo: &str, body: &[u8], work: &Path) -> String {
    push_blob_as(registry, repo, body, &sha256(body), work)
}

/// [`push_blob`] under a digest of any algorithm (docker-registry accepts sha512 uploads).
fn push_blob_as(registry: &str, repo: &str, body: &[u8], digest: &str, work: &Path) -> String {
    let digest = digest.to_string();
    let file = work.join(digest.replacen(':', "-", 1));
    std::fs::write(&file, body).unwrap();
    let location = proc::run(Command::new("curl").args([
        "-sSf",
        "-o",
        "/dev/null",
        "-X",
        "POST",
        "-w",
        "%header{location}",
        &format!("http://{registry}/v2/{repo}/blobs/uploads/"),
    ]));
    let location = location.trim();
    let location =
        if location.starts_with("http") { location.to_string() } else { format!("http://{registry}{location}") };
    let sep = if location.contains('?') { '&' } else { '?' };
    proc::run(Command::new("curl").args([
        "-sSf",
        "-X",
        "PUT",
        "-H",
        "Content-Type: application/octet-stream",
        "--data-binary",
        &format!("@{}", file.display()),
        &format!("{location}{sep}digest={digest}"),
    ]));
    digest
}

/// PUT a manifest of `media_type` under `reference`; its digest.
pub(crate) fn push_manifest(
    registry: &str,
    repo: &str,
    reference: &str,
    media_type: &str,
    body: &str,
    work: &Path,
) -> String {
    let digest = sha256(body.as_bytes());
    let file = work.join(format!("{}.json", hex_of(&digest)));
    std::fs::write(&file, body).unwrap();
    proc::run(Command::new("curl").args([
        "-sSf",
        "-X",
        "PUT",
        "-H",
        &format!("Content-Type: {media_type}"),
        "--data-binary",
        &format!("@{}", file.display()),
        &format!("http://{registry}/v2/{repo}/manifests/{reference}"),
    ]));
    digest
}

/// A referrers client as the distribution spec prescribes it: the referrers API, and on 404
/// the tag-schema fallback (`<alg>-<hex>`). The referrers' descriptors.
fn referrers(t: &Tender, repo: &str, subject: &str) -> Vec<serde_json::Value> {
    let addr = t.hostport().parse().unwrap();
    let r = tender_e2e::http::request(addr, "GET", &format!("/v2/{repo}/referrers/{subject}"), &[]).unwrap();
    let index = match r.status() {
        200 => r.text(),
        404 => {
            let tag = subject.replacen(':', "-", 1);
            let r = tender_e2e::http::request(
                addr,
                "GET",
                &format!("/v2/{repo}/manifests/{tag}"),
                &[("Accept", OCI_INDEX)],
            )
            .unwrap();
            match r.status() {
                200 => r.text(),
                404 => return Vec::new(),
                s => panic!("fallback tag {tag}: {s} {}", r.text()),
            }
        }
        s => panic!("referrers of {subject}: {s} {}", r.text()),
    };
    let v: serde_json::Value = serde_json::from_str(&index).unwrap();
    v["manifests"].as_array().cloned().unwrap_or_default()
}

/// `skopeo list-tags` through tender.
fn list_tags(t: &Tender, repo: &str) -> Vec<String> {
    let out = proc::run(Command::new("skopeo").args([
        "list-tags",
        "--tls-verify=false",
        &format!("docker://{}/{repo}", t.hostport()),
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["Tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect()
}

/// Push a signature of the installer manifest to the bed's registry (which has no referrers
/// API) under the tag-schema fallback tag `sha256-<hex>`, as a spec client would: its config,
/// its payload `signed`, the signature manifest, the fallback index. (signature digest,
/// payload digest).
pub(crate) fn push_fallback_signature(bed: &Bed, signed: &[u8]) -> (String, String) {
    let (reg, repo) = (bed.registry.hostport(), "siderolabs/installer");
    let subject = bed.images.var("INSTALLER_MANIFEST").to_string();
    let subject_len = std::fs::metadata(bed.images.blob_path(&subject)).unwrap().len();
    let work = bed.path("push");
    std::fs::create_dir_all(&work).unwrap();
    let config = push_blob(&reg, repo, b"{}", &work);
    let payload = push_blob(&reg, repo, signed, &work);
    let signature = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","artifactType":"{SIGNATURE}","config":{{"mediaType":"application/vnd.oci.empty.v1+json","digest":"{config}","size":2}},"layers":[{{"mediaType":"application/octet-stream","digest":"{payload}","size":{}}}],"subject":{{"mediaType":"{OCI_MANIFEST}","digest":"{subject}","size":{subject_len}}}}}"#,
        signed.len()
    );
    let sig_digest = sha256(signature.as_bytes());
    push_manifest(&reg, repo, &sig_digest, OCI_MANIFEST, &signature, &work);
    let fallback = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{{"mediaType":"{OCI_MANIFEST}","artifactType":"{SIGNATURE}","digest":"{sig_digest}","size":{}}}]}}"#,
        signature.len()
    );
    push_manifest(&reg, repo, &subject.replacen(':', "-", 1), OCI_INDEX, &fallback, &work);
    (sig_digest, payload)
}

/// Issue 17 items 2 and 6: a signature pushed to docker-registry (which has no referrers API)
/// as a tag-schema fallback tag is found through tender by a spec client; tag lists, the
/// referrers 404 and `skopeo inspect` keep working with the upstream stopped.
#[test]
fn should_find_a_fallback_tag_signature_and_keep_listing_with_the_upstream_stopped() {
    let bed = Bed::new("referrers", Sizes::SMALL);
    proc::need(&["skopeo", "curl"]);
    let repo = "siderolabs/installer";
    let subject = bed.images.var("INSTALLER_MANIFEST").to_string();
    let (sig_digest, payload) = push_fallback_signature(&bed, b"signed by e2e");
    let t = bed.start_tender("tender.log");
    let name = format!("ghcr.io/{repo}");

    let check = |when: &str| {
        let found = referrers(&t, &name, &subject);
        assert_eq!(found.len(), 1, "{when}: the signature through the fallback tag: {found:?}");
        assert_eq!(found[0]["digest"], sig_digest.as_str(), "{when}");
        assert_eq!(found[0]["artifactType"], SIGNATURE, "{when}");
        let addr = t.hostport().parse().unwrap();
        let sig = tender_e2e::http::request(
            addr,
            "GET",
            &format!("/v2/{name}/manifests/{sig_digest}"),
            &[("Accept", OCI_MANIFEST)],
        )
        .unwrap();
        assert_eq!(sig.status(), 200, "{when}");
        assert_eq!(sha256(sig.text().as_bytes()), sig_digest, "{when}");
        let blob = tender_e2e::http::request(addr, "GET", &format!("/v2/{name}/blobs/{payload}"), &[]).unwrap();
        assert_eq!(blob.text(), "signed by e2e", "{when}");
        let tags = list_tags(&t, &name);
        assert!(
            tags.contains(&"v1.10.5".to_string()) && tags.contains(&subject.replacen(':', "-", 1)),
            "{when}: {tags:?}"
        );
        let inspect = proc::run(Command::new("skopeo").args([
            "inspect",
            "--tls-verify=false",
            &format!("docker://{}/{name}:v1.10.5", t.hostport()),
        ]));
        let v: serde_json::Value = serde_json::from_str(&inspect).unwrap();
        assert_eq!(v["Digest"], subject.as_str(), "{when}: skopeo inspect");
    };
    check("upstream up");
    let Bed { registry, images: _images, dir: _dir } = bed;
    drop(registry);
    check("upstream stopped");
    let stale = t.access().iter().filter(|a| a.cache == "stale").count();
    assert!(stale >= 2, "tag list and manifests answered stale");
}

/// Where tender stores the object `<alg>:<hex>` under its data directory.
fn object_file(data: &Path, digest: &str) -> std::path::PathBuf {
    let (alg, hex) = digest.split_once(':').unwrap();
    data.join("objects").join(alg).join(&hex[..2]).join(hex)
}

/// Issue 17 item 4 with the real docker-registry: a blob pushed to it by sha512 is pulled
/// through tender by that digest, byte-exact (whole, a range, HEAD), stored under
/// `objects/sha512/`, a hit the second time; `tender fsck` finds it corrupted, `--repair`
/// quarantines it, and the next GET fetches it again, verified.
#[test]
fn should_pull_a_sha512_blob_pushed_to_docker_registry_byte_exact() {
    let bed = Bed::new("sha512", Sizes::SMALL);
    proc::need(&["curl"]);
    let (reg, repo) = (bed.registry.hostport(), "e2e/sha512");
    let work = bed.path("push");
    std::fs::create_dir_all(&work).unwrap();
    let body: Vec<u8> = (0..3u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let digest = push_blob_as(&reg, repo, &body, &sha512(&body), &work);
    let t = bed.start_tender("tender.log");
    let addr = t.hostport().parse().unwrap();
    let path = format!("/v2/ghcr.io/{repo}/blobs/{digest}");
    let offset = bed.registry.log_len();
    for round in ["miss", "hit"] {
        let r = tender_e2e::http::request(addr, "GET", &path, &[]).unwrap();
        assert_eq!(r.status(), 200, "{round}: {}", r.text());
        assert_eq!(r.header("docker-content-digest"), Some(digest.as_str()), "{round}");
        assert!(r.body == body, "{round}: byte-exact ({} bytes of {})", r.body.len(), body.len());
    }
    let r = tender_e2e::http::request(addr, "GET", &path, &[("Range", "bytes=1000-1999")]).unwrap();
    assert_eq!(r.status(), 206);
    assert!(r.body == body[1000..2000]);
    let r = tender_e2e::http::request(addr, "HEAD", &path, &[]).unwrap();
    assert_eq!((r.status(), r.header("content-length")), (200, Some(body.len().to_string().as_str())));
    let upstream = bed.registry.requests_since(offset);
    let gets = upstream.iter().filter(|l| l.starts_with("GET ") && l.contains("/blobs/sha512:")).count();
    assert_eq!(gets, 1, "the upstream served the blob once: {upstream:?}");
    let object = object_file(&t.data, &digest);
    assert!(std::fs::read(&object).unwrap() == body, "stored under objects/sha512/");

    // fsck sees sha512 objects: a flipped byte is found and quarantined, then fetched again.
    let data = t.data.clone();
    assert_eq!(t.terminate(std::time::Duration::from_secs(10)).code(), Some(0));
    let mut bytes = std::fs::read(&object).unwrap();
    bytes[body.len() / 2] ^= 0xff;
    std::fs::write(&object, &bytes).unwrap();
    let d = data.as_os_str();
    let json = tender::run(["fsck".as_ref(), "--data".as_ref(), d, "--json".as_ref()]);
    assert_eq!(json.status.code(), Some(1), "{}", String::from_utf8_lossy(&json.stderr));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["corrupt"], serde_json::json!([digest]), "{report}");
    let repair = tender::run(["fsck".as_ref(), "--data".as_ref(), d, "--repair".as_ref()]);
    assert_eq!(repair.status.code(), Some(0), "{}", String::from_utf8_lossy(&repair.stdout));
    assert!(!object.exists(), "the corrupt object left objects/");
    let t = bed.start_tender("tender-2.log");
    let r = tender_e2e::http::request(t.hostport().parse().unwrap(), "GET", &path, &[]).unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.body == body, "fetched again, byte-exact");
    // The client's last byte goes out once the content verified; the commit follows.
    tender_e2e::poll_until("the refetched object to be committed", std::time::Duration::from_secs(10), || {
        object.exists().then_some(())
    });
    let clean = tender::run(["fsck".as_ref(), "--data".as_ref(), d, "--json".as_ref()]);
    let report: serde_json::Value = serde_json::from_slice(&clean.stdout).unwrap();
    assert_eq!(report["corrupt"], serde_json::json!([]), "{report}");
    assert!(report["checked"].as_u64().unwrap() >= 1, "{report}");
}
