//! Issue 35, "done when": the far side of an air gap for years. A connected tender in front of
//! docker-registry exports release A (the kubelet index and the installer), compressed, split
//! into parts and signed; the
//! offline tender imports it through its admin endpoint and shows what it holds (`tender
//! images`, `/api/v1/imports`); skopeo lists the imported tags although the upstream is
//! offline. The far side writes its have-list, the near side exports release B (the kubelet
//! and a new image) as a delta against it, the far side imports it and containerd pulls the new
//! image. Release A is retired (`bundle rm`): `gc --dry-run` says what it would free, `gc`
//! frees exactly A's objects that B does not hold; B still pulls, A's installer is gone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use tender_e2e::containerd::Containerd;
use tender_e2e::digest::{hex_of, sha256, sha256_file};
use tender_e2e::registry::Sizes;
use tender_e2e::tender::{write_config, Tender};
use tender_e2e::{http, proc};

use crate::t15_protocol::{push_blob, push_manifest, OCI_MANIFEST};
use crate::t18_airgap::ok;
use crate::Bed;

const KUBELET: &str = "ghcr.io/siderolabs/kubelet:v1.33.1";
const INSTALLER: &str = "ghcr.io/siderolabs/installer:v1.10.5";
const EXTRA: &str = "ghcr.io/siderolabs/extra:v1";
const ADMIN: &str = "far-side-admin-token";

/// Push `siderolabs/extra:v1`: one layer, a config, an OCI manifest. Returns the manifest's
/// digest and its config and layer digests.
fn push_extra(registry: &str, work: &Path) -> (String, Vec<String>) {
    let content: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_246_822_519) >> 9) as u8).collect();
    let layer = tar_of("extra.bin", &content);
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
        sha256(&layer)
    )
    .into_bytes();
    let (ld, cd) =
        (push_blob(registry, "siderolabs/extra", &layer, work), push_blob(registry, "siderolabs/extra", &config, work));
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{cd}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{ld}","size":{}}}]}}"#,
        config.len(),
        layer.len()
    );
    let md = push_manifest(registry, "siderolabs/extra", "v1", OCI_MANIFEST, &manifest, work);
    (md, vec![cd, ld])
}

/// A tar of one regular file (ustar), as an uncompressed layer containerd can unpack.
fn tar_of(name: &str, content: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let field = |h: &mut [u8; 512], at: usize, text: &str| h[at..at + text.len()].copy_from_slice(text.as_bytes());
    field(&mut h, 100, "0000644\0");
    field(&mut h, 108, "0000000\0");
    field(&mut h, 116, "0000000\0");
    field(&mut h, 124, &format!("{:011o}\0", content.len()));
    field(&mut h, 136, "00000000000\0");
    field(&mut h, 156, "0");
    field(&mut h, 257, "ustar\0");
    field(&mut h, 263, "00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    field(&mut h, 148, &format!("{sum:06o}\0 "));
    let mut out = h.to_vec();
    out.extend_from_slice(content);
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

/// A bundle signing key (PKCS#8 PEM) and its public key (PEM), written under `dir`.
fn signing_key(dir: &Path) -> (PathBuf, PathBuf) {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let pair = rcgen::KeyPair::try_from(pkcs8.as_ref()).unwrap();
    let (private, public) = (dir.join("bundle.key"), dir.join("bundle.pub"));
    std::fs::write(&private, pair.serialize_pem()).unwrap();
    std::fs::write(&public, pair.public_key_pem()).unwrap();
    (private, public)
}

/// A committed object of a data directory.
fn object(data: &Path, digest: &str) -> PathBuf {
    let hex = hex_of(digest);
    data.join("objects/sha256").join(&hex[..2]).join(hex)
}

#[test]
fn should_run_the_far_side_import_inventory_list_delta_retire_and_free() {
    proc::need(&["skopeo", "containerd", "ctr"]);
    let bed = Bed::new("far-side", Sizes::SMALL);
    let work = bed.path("push");
    std::fs::create_dir_all(&work).unwrap();
    let (extra_manifest, extra_blobs) = push_extra(&bed.registry.hostport(), &work);
    write_config(&bed.path("connected.yaml"), &[("ghcr.io", &bed.registry.url())], "");
    let (near_data, near_config) = (bed.path("data-connected"), bed.path("connected.yaml"));
    let (key, public) = signing_key(bed.dir.path());
    let export = |out: &Path, extra: &[&str]| {
        let mut args = vec!["export", "--out", out.to_str().unwrap(), "--data", near_data.to_str().unwrap()];
        args.extend_from_slice(&["--config", near_config.to_str().unwrap(), "--quiet"]);
        args.extend_from_slice(&["--platform", "linux/amd64", "--sign-key", key.to_str().unwrap()]);
        args.extend_from_slice(extra);
        ok(&args)
    };

    // Release A, declared in a spec kept in the bundle.
    let spec = bed.path("release-a.yaml");
    std::fs::write(&spec, format!("kind: Bundle\nname: release-a\nimages:\n  - {KUBELET}\n  - {INSTALLER}\n")).unwrap();
    // Sized for media: compressed, in parts of 1 MiB, signed.
    let a = bed.path("release-a");
    let out = export(&a, &["--spec", spec.to_str().unwrap(), "--compress", "zstd", "--split", "1MiB"]);
    assert!(bed.path("release-a.parts.json").is_file() && bed.path("release-a.001").is_file(), "{out}");
    let a_index = out.lines().find_map(|l| l.strip_prefix("index: ")).expect("export prints the index").to_string();
    let ls = ok(&["bundle", "ls", a.to_str().unwrap()]);
    assert!(ls.contains("name: release-a"), "bundle ls shows the spec: {ls}");

    // The far side: offline (its upstream a listener never contacted), admin endpoints, and
    // client authentication for the catalog.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let token = bed.path("admin.token");
    std::fs::write(&token, format!("{ADMIN}\n")).unwrap();
    let tokens = bed.path("pull.tokens");
    std::fs::write(&tokens, "pull-token-for-the-catalog\n").unwrap();
    write_config(
        &bed.path("far.yaml"),
        &[("ghcr.io", &url)],
        &format!("offline: true\nauth:\n  tokenFile: {}\n  anonymousPull: true\n", tokens.display()),
    );
    let far_data = bed.path("data-far");
    let far = Tender::start_with(
        &bed.path("far.yaml"),
        &far_data,
        &bed.path("far.log"),
        &["--admin-token-file", token.to_str().unwrap()],
    );
    let far_url = format!("http://{}", far.hostport());
    let server = ["--server", far_url.as_str(), "--token-file", token.to_str().unwrap()];
    let import = |bundle: &Path| {
        let mut args = vec!["import", bundle.to_str().unwrap(), "--verify-key", public.to_str().unwrap()];
        args.extend_from_slice(&server);
        ok(&args)
    };
    let out = import(&a);
    assert!(out.contains(&format!("index: {a_index}")), "{out}");

    // What the site holds.
    let mut args = vec!["images", "--output", "json"];
    args.extend_from_slice(&server);
    let images: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
    let find = |v: &serde_json::Value, name: &str| {
        v["images"].as_array().unwrap().iter().find(|i| i["name"] == name).cloned().unwrap_or_default()
    };
    let kubelet = find(&images, KUBELET);
    assert_eq!(kubelet["source"], "bundle", "{images}");
    assert_eq!(kubelet["bundle"], a_index.as_str(), "{images}");
    assert_eq!(kubelet["pinned"], true, "{images}");
    assert_eq!(kubelet["platforms"], serde_json::json!(["linux/amd64"]), "{images}");
    assert_eq!(find(&images, INSTALLER)["digest"], bed.images.var("INSTALLER_MANIFEST"), "{images}");
    let mut args = vec!["images"];
    args.extend_from_slice(&server);
    let table = ok(&args);
    assert!(table.contains(KUBELET) && table.contains("yes") && table.contains("bundle"), "{table}");
    let addr: std::net::SocketAddr = far.hostport().parse().unwrap();
    let imports = http::request(addr, "GET", "/api/v1/imports", &[]).unwrap();
    assert!(imports.text().contains(&a_index) && imports.text().contains("admin token"), "{}", imports.text());
    let page = http::request(addr, "GET", "/", &[]).unwrap();
    assert!(page.text().contains("Imported bundles"), "the status page lists the bundles");

    // skopeo lists the tags the bundle registered; the upstream is offline.
    let tags = proc::output(Command::new("skopeo").args([
        "list-tags",
        "--tls-verify=false",
        &format!("docker://{}/ghcr.io/siderolabs/kubelet", far.hostport()),
    ]));
    assert!(tags.status.success(), "skopeo list-tags: {}", String::from_utf8_lossy(&tags.stderr));
    let tags: serde_json::Value = serde_json::from_slice(&tags.stdout).unwrap();
    assert_eq!(tags["Tags"], serde_json::json!(["v1.33.1"]), "{tags}");
    // The catalog: to an authenticated client only.
    assert_eq!(http::request(addr, "GET", "/v2/_catalog", &[]).unwrap().status(), 401);
    let bearer = [("Authorization", "Bearer pull-token-for-the-catalog")];
    let catalog = http::request(addr, "GET", "/v2/_catalog?n=1", &bearer).unwrap();
    assert_eq!(catalog.status(), 200, "{}", catalog.text());
    assert!(catalog.text().contains("ghcr.io/siderolabs/installer"), "{}", catalog.text());

    // The far side's have-list; release B as a delta against it.
    let mut args = vec!["images", "--output", "digests"];
    args.extend_from_slice(&server);
    let have = bed.path("have.txt");
    std::fs::write(&have, ok(&args)).unwrap();
    let b = bed.path("release-b.tar");
    let out = export(&b, &["--since-digests", have.to_str().unwrap(), KUBELET, EXTRA]);
    assert!(out.contains("a delta on the have-list"), "{out}");
    let b_index = out.lines().find_map(|l| l.strip_prefix("index: ")).unwrap().to_string();
    let ls: serde_json::Value = serde_json::from_str(&ok(&["bundle", "ls", "--json", b.to_str().unwrap()])).unwrap();
    assert_eq!(ls["blobs"], 3, "the delta carries only the new image's three objects: {ls}");
    let diff = ok(&["bundle", "diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(
        diff.contains("added") && diff.contains(EXTRA) && diff.contains("removed") && diff.contains(INSTALLER),
        "{diff}"
    );
    import(&b);

    // containerd pulls the new image from the far side.
    let ctrd = Containerd::start(&bed.path("containerd"));
    let hosts = ctrd.hosts_dir("ghcr.io", &far.hostport());
    let (pulled, out) = crate::t24_signatures::ctr_pull(&ctrd, &hosts, EXTRA);
    assert!(pulled, "ctr pull: {out}");
    for d in &extra_blobs {
        assert_eq!(sha256_file(&ctrd.content_blobs().join(hex_of(d))), *d);
    }

    // Retire release A: a dry run first, then for real; gc frees exactly A's objects not in B.
    let installer = bed.images.var("INSTALLER_MANIFEST").to_string();
    let mut installer_objects = vec![installer.clone()];
    installer_objects.extend(bed.images.config_and_layers(&installer));
    let mut args = vec!["bundle", "rm", a_index.as_str(), "--dry-run", "--json"];
    args.extend_from_slice(&server);
    let dry: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
    let mut retired: Vec<String> =
        dry["released"]["retired"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()).collect();
    retired.sort();
    let mut want = installer_objects.clone();
    want.sort();
    assert_eq!(retired, want, "removing A would retire exactly the installer's objects");
    assert!(object(&far_data, &installer).exists(), "a dry run removes nothing");
    let mut args = vec!["bundle", "rm", a_index.as_str()];
    args.extend_from_slice(&server);
    let out = ok(&args);
    assert!(out.contains(&format!("retired {} object(s)", want.len())), "{out}");
    let mut args = vec!["gc", "--dry-run", "--json"];
    args.extend_from_slice(&server);
    let plan: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
    assert_eq!(plan["plan"]["retired"], want.len(), "{plan}");
    let mut args = vec!["gc"];
    args.extend_from_slice(&server);
    ok(&args);
    for d in &installer_objects {
        assert!(!object(&far_data, d).exists(), "{d} freed");
    }
    for d in bed.images.config_and_layers(bed.images.var("KUBELET_AMD64")).iter().chain(&extra_blobs) {
        assert!(object(&far_data, d).exists(), "{d} kept: B holds it");
    }
    let tag = "/v2/ghcr.io/siderolabs/installer/manifests/v1.10.5";
    assert_ne!(http::request(addr, "GET", tag, &[]).unwrap().status(), 200, "A's installer is gone");
    let kubelet = http::request(addr, "GET", "/v2/ghcr.io/siderolabs/kubelet/manifests/v1.33.1", &[]).unwrap();
    assert_eq!(kubelet.status(), 200, "B's kubelet still pulls");
    assert_eq!(sha256(&kubelet.body), bed.images.var("KUBELET_INDEX"));
    let imports = http::request(addr, "GET", "/api/v1/imports", &[]).unwrap();
    assert!(!imports.text().contains(&a_index) && imports.text().contains(&b_index), "{}", imports.text());
    assert!(!object(&far_data, &extra_manifest).exists() || find(&images, EXTRA).is_null());
    let _ = far.terminate(Duration::from_secs(10));
    silent.set_nonblocking(true).unwrap();
    assert!(silent.accept().is_err(), "the offline upstream was contacted");
}
