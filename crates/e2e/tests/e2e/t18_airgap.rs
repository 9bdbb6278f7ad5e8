//! Issue 21 items 1 and 2: carrying a release across an air gap. A connected tender in front of
//! docker-registry and the factory stand-in exports a multi-arch index, a single image with a
//! signature (an OCI fallback-tag referrer) and an OS image; a second tender whose upstreams
//! are offline (a silent listener, never contacted) imports the bundle and serves it to skopeo,
//! containerd (`ctr --platform`) and `nbdkit curl` + `qemu-img`, byte-exact. The export is read
//! by `skopeo copy oci:` and `umoci unpack`; a skopeo-made layout and one naming images in full
//! import too. Bundles with a flipped byte, a truncated tar or a dangling reference are refused
//! and nothing of them becomes visible; a `--since` delta imports on top of its base.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tender_e2e::containerd::Containerd;
use tender_e2e::digest::{hex_of, sha256, sha256_file, verify_oci_layout};
use tender_e2e::factory::Factory;
use tender_e2e::proc;
use tender_e2e::registry::Sizes;
use tender_e2e::tender::{self, write_config, Tender};
use tender_e2e::{http, TestDir};

use crate::t11_prefetch::xz;
use crate::t15_protocol::{ctr_pull_arm64, push_fallback_signature, OCI_INDEX, OCI_MANIFEST};
use crate::{oci, skopeo_pull, Bed};

const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
const KUBELET: &str = "ghcr.io/siderolabs/kubelet:v1.33.1";
const INSTALLER: &str = "ghcr.io/siderolabs/installer:v1.10.5";
const ADMIN: &str = "airgap-admin-token";

fn os_image_path() -> String {
    format!("/image/{SCHEMATIC}/v1.12.0/nocloud-amd64.raw.xz")
}

/// `tender ARGS`: its exit code, stdout and stderr.
pub(crate) fn tender_cli(args: &[&str]) -> (i32, String, String) {
    let out = tender::run(args.iter().copied());
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub(crate) fn ok(args: &[&str]) -> String {
    let (code, out, err) = tender_cli(args);
    assert_eq!(code, 0, "tender {args:?}:\n{out}{err}");
    out
}

/// The connected side: the registry with its images and a signature, the factory with an OS
/// image, and the plain disk image the OS image decompresses to. The factory comes before the
/// bed: fields drop in order, and the factory's stop needs its pid file, in the bed's directory
/// (the other way round the stand-in outlived the test, as scripts/leftovers.sh found).
struct Connected {
    factory: Factory,
    bed: Bed,
    disk: Vec<u8>,
    signature: String,
}

impl Connected {
    fn new(name: &str) -> Connected {
        proc::need(&["skopeo", "curl", "xz"]);
        let bed = Bed::new(name, Sizes::SMALL);
        let (sig_digest, _) = push_fallback_signature(&bed, b"signed for the air gap");

        let factory = Factory::start(&bed.path("factory"));
        let disk: Vec<u8> = (0..2 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        factory.put(&os_image_path(), &xz(&disk));
        write_config(
            &bed.path("connected.yaml"),
            &[("ghcr.io", &bed.registry.url())],
            &format!("imageFactory: {}\n", factory.url()),
        );
        Connected { bed, factory, disk, signature: sig_digest }
    }

    fn start(&self) -> Tender {
        Tender::start(
            &self.bed.path("connected.yaml"),
            &self.bed.path("data-connected"),
            &self.bed.path("connected.log"),
        )
    }
}

/// The air-gapped side: a tender whose upstream and factory are a listener that never answers,
/// marked offline, with admin endpoints.
struct Gapped {
    tender: Tender,
    silent: TcpListener,
    token: PathBuf,
}

fn gapped(dir: &Path, name: &str) -> Gapped {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    gapped_on(dir, name, silent)
}

/// The config of an air-gapped tender whose upstream and factory are `silent`'s address.
fn gapped_config(dir: &Path, name: &str, silent: &TcpListener) -> PathBuf {
    let url = format!("http://{}", silent.local_addr().unwrap());
    let config = dir.join(format!("{name}.yaml"));
    write_config(&config, &[("ghcr.io", &url)], &format!("imageFactory: {url}\noffline: true\n"));
    config
}

fn gapped_on(dir: &Path, name: &str, silent: TcpListener) -> Gapped {
    let config = gapped_config(dir, name, &silent);
    let token = dir.join(format!("{name}.token"));
    std::fs::write(&token, format!("{ADMIN}\n")).unwrap();
    let tender = Tender::start_with(
        &config,
        &dir.join(format!("data-{name}")),
        &dir.join(format!("{name}.log")),
        &["--admin-token-file", token.to_str().unwrap()],
    );
    Gapped { tender, silent, token }
}

impl Gapped {
    fn url(&self) -> String {
        format!("http://{}", self.tender.hostport())
    }

    fn import(&self, bundle: &Path, extra: &[&str]) -> (i32, String, String) {
        let url = self.url();
        let mut args = vec!["import", bundle.to_str().unwrap(), "--server", &url, "--token-file"];
        args.push(self.token.to_str().unwrap());
        args.extend_from_slice(extra);
        tender_cli(&args)
    }

    fn status(&self, path: &str) -> u16 {
        http::request(self.tender.hostport().parse().unwrap(), "GET", path, &[("Accept", OCI_INDEX)]).unwrap().status()
    }

    /// No connection ever reached the offline upstream.
    fn assert_never_contacted(&self) {
        self.silent.set_nonblocking(true).unwrap();
        assert!(self.silent.accept().is_err(), "the offline upstream was contacted");
    }
}

/// The OS image through tender as qemu reads a disk over NBD: `nbdkit curl` with the xz filter,
/// `qemu-img convert` to a raw file.
fn qemu_read(hostport: &str, dest: &Path) -> Vec<u8> {
    proc::need(&["nbdkit", "qemu-img"]);
    let url = format!("http://{hostport}{}", os_image_path());
    let run = format!("qemu-img convert -f raw -O raw \"$uri\" {}", dest.display());
    proc::run(Command::new("nbdkit").args(["-U", "-", "--filter=xz", "curl", &format!("url={url}"), "--run", &run]));
    std::fs::read(dest).unwrap()
}

#[test]
fn should_carry_images_a_signature_and_an_os_image_across_the_gap_byte_exact() {
    let site = Connected::new("airgap");
    let connected = site.start();
    let bundle = site.bed.path("release.tar");
    let os_image = os_image_path();
    // The release: both platforms of the kubelet, the installer (and its signature), an OS image.
    let export = |out: &Path, source: &[&str]| {
        let mut args = vec!["export", "--out", out.to_str().unwrap()];
        args.extend_from_slice(source);
        args.extend_from_slice(&["--platform", "linux/amd64", "--platform", "linux/arm64", "--os-image", &os_image]);
        args.extend_from_slice(&["--quiet", KUBELET, INSTALLER]);
        ok(&args)
    };
    let out = export(&bundle, &["--server", &format!("http://{}", connected.hostport())]);
    let index_digest = out.lines().find_map(|l| l.strip_prefix("index: ")).expect("export prints the index digest");
    assert!(out.contains("2 image(s), 1 referrer(s), 1 OS image(s)"), "{out}");

    let ls = ok(&["bundle", "ls", bundle.to_str().unwrap()]);
    assert!(ls.contains(KUBELET) && ls.contains("linux/amd64,linux/arm64"), "{ls}");
    assert!(ls.contains(INSTALLER) && ls.contains(&os_image) && ls.contains("os-image"), "{ls}");
    assert!(ls.contains(index_digest), "{ls}");

    // The same release as a directory, from the stopped tender's store (nothing fetched again).
    let upstream_before = site.bed.registry.stats().blob_gets;
    assert_eq!(connected.terminate(Duration::from_secs(10)).code(), Some(0));
    let dir_bundle = site.bed.path("release");
    let (data, config) = (site.bed.path("data-connected"), site.bed.path("connected.yaml"));
    export(&dir_bundle, &["--data", data.to_str().unwrap(), "--config", config.to_str().unwrap()]);
    assert_eq!(site.bed.registry.stats().blob_gets, upstream_before, "the --data export fetched nothing");

    // Other tools read the export: skopeo (oci:) and umoci.
    proc::need(&["umoci"]);
    let via_skopeo = site.bed.path("skopeo-from-bundle");
    proc::run(Command::new("skopeo").args([
        "copy",
        "-q",
        "--preserve-digests",
        &format!("oci:{}:{INSTALLER}", dir_bundle.display()),
        &oci(&via_skopeo),
    ]));
    let (top, _) = verify_oci_layout(&via_skopeo);
    assert_eq!(top, [site.bed.images.var("INSTALLER_MANIFEST")]);
    let unpacked = site.bed.path("umoci-unpacked");
    let umoci = proc::output(Command::new("umoci").args([
        "unpack",
        "--image",
        &format!("{}:{INSTALLER}", dir_bundle.display()),
        unpacked.to_str().unwrap(),
    ]));
    assert!(umoci.status.success(), "umoci unpack:\n{}", String::from_utf8_lossy(&umoci.stderr));
    assert!(unpacked.join("rootfs").is_dir() && unpacked.join("config.json").is_file());

    // The gap: import through the running air-gapped tender's admin endpoint.
    let g = gapped(site.bed.dir.path(), "gapped");
    assert_eq!(g.status(&format!("/v2/{KUBELET_PATH}/manifests/v1.33.1")), 404, "nothing before the import");
    let (code, _, err) = g.import(&bundle, &["--expect-index", &format!("sha256:{}", "0".repeat(64))]);
    assert_eq!(code, 1, "another index digest than the one expected: {err}");
    let (code, out, err) = g.import(&bundle, &["--expect-index", index_digest]);
    assert_eq!(code, 0, "import:\n{out}{err}");
    assert!(out.contains(&format!("index: {index_digest}")), "the same index across the gap: {out}");

    // skopeo: the whole multi-arch index and the single image, byte-exact.
    let pulled = site.bed.path("pulled-kubelet");
    skopeo_pull(&g.tender, KUBELET, &oci(&pulled));
    let (top, blobs) = verify_oci_layout(&pulled);
    assert_eq!(top, [site.bed.images.var("KUBELET_INDEX")]);
    for d in site.bed.images.config_and_layers(site.bed.images.var("KUBELET_ARM64")) {
        assert!(blobs.contains(&d), "arm64 blob {d} pulled from the gapped tender");
    }
    let pulled = site.bed.path("pulled-installer");
    skopeo_pull(&g.tender, INSTALLER, &oci(&pulled));
    assert_eq!(verify_oci_layout(&pulled).0, [site.bed.images.var("INSTALLER_MANIFEST")]);

    // The signature through the fallback tag, byte-exact.
    let subject = site.bed.images.var("INSTALLER_MANIFEST");
    let fallback = format!("/v2/ghcr.io/siderolabs/installer/manifests/{}", subject.replacen(':', "-", 1));
    let r = http::request(g.tender.hostport().parse().unwrap(), "GET", &fallback, &[("Accept", OCI_INDEX)]).unwrap();
    assert_eq!(r.status(), 200, "{}", r.text());
    assert!(r.text().contains(&site.signature), "{}", r.text());
    let sig = http::request(
        g.tender.hostport().parse().unwrap(),
        "GET",
        &format!("/v2/ghcr.io/siderolabs/installer/manifests/{}", site.signature),
        &[("Accept", OCI_MANIFEST)],
    )
    .unwrap();
    assert_eq!(sha256(sig.text().as_bytes()), site.signature);

    // containerd asks for arm64 only.
    proc::need(&["containerd", "ctr"]);
    let ctrd = Containerd::start(&site.bed.path("containerd"));
    let hosts = ctrd.hosts_dir("ghcr.io", &g.tender.hostport());
    ctr_pull_arm64(&ctrd, &hosts, "default", KUBELET);
    let arm64 = site.bed.images.var("KUBELET_ARM64");
    assert!(ctrd.content_blobs().join(hex_of(arm64)).exists(), "containerd got the arm64 manifest");
    for d in site.bed.images.config_and_layers(arm64) {
        let got = ctrd.content_blobs().join(hex_of(&d));
        assert_eq!(sha256_file(&got), d, "containerd's copy of {d}");
    }

    // The OS image as qemu reads it, byte-exact.
    let disk = qemu_read(&g.tender.hostport(), &site.bed.path("disk.raw"));
    assert_eq!(disk.len(), site.disk.len(), "the OS image's size through nbdkit + qemu-img");
    assert!(disk == site.disk, "the OS image through nbdkit + qemu-img is the original disk");
    assert_eq!(site.factory.gets(), 1, "the factory served the OS image once, to the connected side");
    g.assert_never_contacted();
}

const KUBELET_PATH: &str = "ghcr.io/siderolabs/kubelet";

/// A copy of a directory tree.
fn copy_tree(from: &Path, to: &Path) {
    proc::run(Command::new("cp").args(["-a", from.to_str().unwrap(), to.to_str().unwrap()]));
}

#[test]
fn should_refuse_wrong_bundles_register_nothing_and_import_a_delta_on_its_base() {
    let bed = Bed::new("airgap-refuse", Sizes::SMALL);
    write_config(&bed.path("connected.yaml"), &[("ghcr.io", &bed.registry.url())], "");
    let data = bed.path("data-connected");
    let config = bed.path("connected.yaml");
    let export = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "export",
            "--out",
            out.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--quiet",
        ];
        args.extend_from_slice(extra);
        ok(&args)
    };
    let base = bed.path("base");
    export(&base, &[KUBELET]);
    let base_tar = bed.path("base.tar");
    export(&base_tar, &[KUBELET]);
    let delta = bed.path("delta.tar");
    let out = export(&delta, &["--since", base.to_str().unwrap(), KUBELET, INSTALLER]);
    assert!(out.contains("a delta on"), "{out}");
    let installer_objects = 1 + bed.images.config_and_layers(bed.images.var("INSTALLER_MANIFEST")).len();
    let ls = ok(&["bundle", "ls", delta.to_str().unwrap(), "--json"]);
    let ls: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(ls["blobs"], installer_objects, "the delta holds only the installer: {ls}");
    assert!(ls["deltaOf"].is_string(), "{ls}");

    let g = gapped(bed.dir.path(), "gapped");
    let addr: std::net::SocketAddr = g.tender.hostport().parse().unwrap();
    let kubelet_tag = format!("/v2/{KUBELET_PATH}/manifests/v1.33.1");
    let installer_tag = "/v2/ghcr.io/siderolabs/installer/manifests/v1.10.5";

    // A delta alone: its base's blobs are neither in it nor stored.
    let (code, _, err) = g.import(&delta, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is referenced but not in the bundle"), "{err}");
    assert_eq!(g.status(installer_tag), 404, "nothing of a refused delta is visible");

    // One flipped byte in a layer.
    let flipped = bed.path("flipped");
    copy_tree(&base, &flipped);
    let layer = bed.images.config_and_layers(bed.images.var("KUBELET_AMD64")).pop().unwrap();
    let layer_file = flipped.join("blobs/sha256").join(hex_of(&layer));
    let mut bytes = std::fs::read(&layer_file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&layer_file, bytes).unwrap();
    let (code, _, err) = g.import(&flipped, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(hex_of(&layer)), "the refusal names the blob: {err}");

    // A truncated tar.
    let whole = std::fs::read(&base_tar).unwrap();
    let cut = bed.path("cut.tar");
    std::fs::write(&cut, &whole[..whole.len() * 2 / 3]).unwrap();
    let (code, _, err) = g.import(&cut, &[]);
    assert_eq!(code, 1, "{err}");

    // A dangling reference: a layer removed from the layout.
    let dangling = bed.path("dangling");
    copy_tree(&base, &dangling);
    std::fs::remove_file(dangling.join("blobs/sha256").join(hex_of(&layer))).unwrap();
    let (code, _, err) = g.import(&dangling, &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("is referenced but not in the bundle"), "{err}");

    // None of them made a tag, a trust record or a pin visible.
    assert_eq!(g.status(&kubelet_tag), 404);
    let data_gapped = bed.path("data-gapped");
    for d in ["pins", "trust"] {
        let n = std::fs::read_dir(data_gapped.join(d)).map(|r| r.count()).unwrap_or(0);
        assert_eq!(n, 0, "{d}/ after refused imports");
    }

    // The base, then the delta on top: both images pull.
    let (code, out, err) = g.import(&base_tar, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = g.import(&delta, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(g.status(&kubelet_tag), 200);
    assert_eq!(http::request(addr, "GET", installer_tag, &[("Accept", OCI_MANIFEST)]).unwrap().status(), 200);
    skopeo_pull(&g.tender, INSTALLER, &oci(&bed.path("pulled-installer")));
    assert!(std::fs::read_dir(data_gapped.join("pins")).unwrap().count() > 0, "imported content is pinned");

    // `tender tag rm` ends the tag's authority: offline, it is then unknown.
    let token = g.token.to_str().unwrap().to_string();
    ok(&["tag", "rm", KUBELET, "--server", &g.url(), "--token-file", &token]);
    assert_eq!(g.status(&kubelet_tag), 404, "a removed tag is not served");
    g.assert_never_contacted();
}

/// A layout other tools wrote, imported with `--data` into a stopped tender that then serves
/// it: `skopeo copy docker://… oci:DIR:TAG` (a bare tag, named with --registry) and a layout
/// whose index.json names each image by its full reference in `org.opencontainers.image.ref.name`
/// (as `ctr images export` and tender write it), built here from the test images. (Talos' own
/// image cache is another format: `export --talos-image-cache`, t27.)
#[test]
fn should_import_layouts_made_by_skopeo_and_naming_images_in_full() {
    let bed = Bed::new("airgap-layouts", Sizes::SMALL);
    let dir = TestDir::new("airgap-layouts-work");
    let skopeo_layout = dir.path().join("skopeo-layout");
    proc::run(Command::new("skopeo").args([
        "copy",
        "-q",
        "--preserve-digests",
        "--src-tls-verify=false",
        &format!("docker://{}/siderolabs/installer:v1.10.5", bed.registry.hostport()),
        &format!("oci:{}:v7", skopeo_layout.display()),
    ]));

    // A layout naming the installer in full: its manifest, config and layers.
    let talos = dir.path().join("image-cache.oci");
    let manifest = bed.images.var("INSTALLER_MANIFEST");
    std::fs::create_dir_all(talos.join("blobs/sha256")).unwrap();
    for d in std::iter::once(manifest.to_string()).chain(bed.images.config_and_layers(manifest)) {
        std::fs::copy(bed.images.blob_path(&d), talos.join("blobs/sha256").join(hex_of(&d))).unwrap();
    }
    let size = std::fs::metadata(bed.images.blob_path(manifest)).unwrap().len();
    std::fs::write(talos.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        talos.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{{"mediaType":"{OCI_MANIFEST}","size":{size},"digest":"{manifest}","annotations":{{"org.opencontainers.image.ref.name":"ghcr.io/e2e/talos-cached:v1.10.5"}}}}]}}"#
        ),
    )
    .unwrap();

    // Into the data directory of a stopped tender (--data), then served by it.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let config = gapped_config(dir.path(), "gapped", &silent);
    let data = dir.path().join("data-gapped");
    let import = |bundle: &Path, extra: &[&str]| {
        let mut args = vec!["import", bundle.to_str().unwrap(), "--data", data.to_str().unwrap()];
        args.extend_from_slice(&["--config", config.to_str().unwrap()]);
        args.extend_from_slice(extra);
        tender_cli(&args)
    };
    let (code, _, err) = import(&skopeo_layout, &[]);
    assert_eq!(code, 1, "a bare tag without --registry is refused: {err}");
    assert!(err.contains("--registry"), "{err}");
    let (code, out, err) = import(&skopeo_layout, &["--registry", "ghcr.io/e2e/from-skopeo"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = import(&talos, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let g = gapped_on(dir.path(), "gapped", silent);
    for name in ["ghcr.io/e2e/from-skopeo:v7", "ghcr.io/e2e/talos-cached:v1.10.5"] {
        let dest = dir.path().join(name.replace(['/', ':'], "_"));
        skopeo_pull(&g.tender, name, &oci(&dest));
        assert_eq!(verify_oci_layout(&dest).0, [manifest], "{name}");
    }
    g.assert_never_contacted();
}

/// Issue 32 (3): private images stay private across the gap. The connected side's upstream
/// is `private: true` (with client authentication); `export` (from the data directory and
/// through the server) marks the image `dev.tender.private`; the far side refuses it under an
/// upstream that is not private there, naming the key, imports it with `--allow-public`, and
/// under a private upstream keeps it for authenticated clients only.
#[test]
fn should_keep_private_images_private_across_the_gap() {
    let bed = Bed::new("airgap-private", tender_e2e::registry::Sizes { kubelet: "", installer: "1", big_mb: 0 });
    let token = "0123456789abcdef0123456789abcdef";
    let tokens = bed.path("tokens");
    std::fs::write(&tokens, format!("{token}\n")).unwrap();
    let auth = format!("auth:\n  tokenFile: {}\n  anonymousPull: true\n", tokens.display());
    let private_cfg = |path: &Path, url: &str, offline: bool| {
        let extra = if offline { "    offline: true\n" } else { "" };
        let y = format!("upstreams:\n  - name: ghcr.io\n    url: {url}\n    private: true\n{extra}{auth}");
        std::fs::write(path, y).unwrap();
    };
    let connected_cfg = bed.path("connected.yaml");
    private_cfg(&connected_cfg, &bed.registry.url(), false);
    let data = bed.path("data-connected");
    let t = Tender::start(&connected_cfg, &data, &bed.path("connected.log"));
    let marked = |bundle: &Path| {
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(bundle.join("index.json")).unwrap()).unwrap();
        index["manifests"][0]["annotations"]["dev.tender.private"] == "true"
    };
    let through_server = bed.path("via-server");
    let (server, tokens_arg) = (format!("http://{}", t.hostport()), tokens.to_str().unwrap());
    ok(&[
        "export",
        "--out",
        through_server.to_str().unwrap(),
        "--server",
        &server,
        "--token-file",
        tokens_arg,
        "--quiet",
        INSTALLER,
    ]);
    assert!(marked(&through_server), "export --server marks the private image");
    assert_eq!(t.terminate(Duration::from_secs(10)).code(), Some(0));
    let from_data = bed.path("via-data");
    let (data_s, cfg_s) = (data.to_str().unwrap(), connected_cfg.to_str().unwrap());
    ok(&["export", "--out", from_data.to_str().unwrap(), "--data", data_s, "--config", cfg_s, "--quiet", INSTALLER]);
    assert!(marked(&from_data), "export --data marks the private image");

    // The far side: ghcr.io offline and public first.
    let far_public = bed.path("far-public.yaml");
    std::fs::write(
        &far_public,
        format!("upstreams:\n  - name: ghcr.io\n    url: {}\n    offline: true\n", bed.registry.url()),
    )
    .unwrap();
    let far = bed.path("data-far");
    let (far_s, public_s) = (far.to_str().unwrap(), far_public.to_str().unwrap());
    let (code, out, err) = tender_cli(&["import", from_data.to_str().unwrap(), "--data", far_s, "--config", public_s]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(err.contains(INSTALLER) && err.contains("private: true") && err.contains("--allow-public"), "{err}");
    // Under a private upstream: imported, and served to authenticated clients only.
    let far_private = bed.path("far-private.yaml");
    private_cfg(&far_private, &bed.registry.url(), true);
    ok(&["import", from_data.to_str().unwrap(), "--data", far_s, "--config", far_private.to_str().unwrap()]);
    let g = Tender::start(&far_private, &far, &bed.path("far.log"));
    let path = "/v2/ghcr.io/siderolabs/installer/manifests/v1.10.5";
    assert_eq!(http::get(g.addr, path).unwrap().status(), 401, "anonymous clients get nothing of it");
    let authed = http::request(g.addr, "GET", path, &[("authorization", &format!("Bearer {token}"))]).unwrap();
    assert_eq!(authed.status(), 200, "{}", authed.text());
}
