//! `tender prefetch` end to end: docker-registry (the test bed's `upstream.sh`, filled by
//! `mkimages.sh` with a multi-arch kubelet index and a single-arch installer) as the upstream,
//! the bed's Image Factory stand-in, and the real binary both ways: `--server` (through a
//! running tender) and `--data` (in-process on a stopped one's data directory). Each proves
//! from the registry's access log that only the amd64 blobs were fetched, each exactly once,
//! and that a second run fetches nothing from upstream.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpListener;
use std::process::{Command, Stdio};

use tender_e2e::factory::Factory;
use tender_e2e::proc;
use tender_e2e::registry::{Images, Registry, Sizes};
use tender_e2e::tender::{self, write_config, Tender};
use tender_e2e::TestDir;

const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
const TALOS: &str = "v1.10.5";

fn os_image_path() -> String {
    format!("/image/{SCHEMATIC}/{TALOS}/openstack-amd64.raw.xz")
}

/// What belongs to which platform in the synthetic images.
struct Digests {
    kubelet_index: String,
    amd64_manifest: String,
    arm64_manifest: String,
    amd64_blobs: Vec<String>,
    arm64_blobs: Vec<String>,
    installer_manifest: String,
    installer_blobs: Vec<String>,
}

/// The upstream, its images (also as the preset installer `installer/<schematic>:<talos>`),
/// the factory with an xz OS image, and a config naming them.
struct Site {
    registry: Registry,
    digests: Digests,
    factory: Factory,
    dir: TestDir,
}

impl Site {
    fn new(name: &str) -> Site {
        proc::need(&["skopeo", "xz"]);
        let dir = TestDir::new(name);
        let registry = Registry::start(&dir.path().join("upstream"));
        let images = Images::push(&registry, &dir.path().join("images"), Sizes::SMALL);
        proc::run(Command::new("skopeo").args([
            "copy",
            "-q",
            "--all",
            "--preserve-digests",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            &format!("docker://{}/siderolabs/installer:v1.10.5", registry.hostport()),
            &format!("docker://{}/installer/{SCHEMATIC}:{TALOS}", registry.hostport()),
        ]));
        let (amd64, arm64, installer) =
            (images.var("KUBELET_AMD64"), images.var("KUBELET_ARM64"), images.var("INSTALLER_MANIFEST"));
        let digests = Digests {
            kubelet_index: images.var("KUBELET_INDEX").to_string(),
            amd64_manifest: amd64.to_string(),
            arm64_manifest: arm64.to_string(),
            amd64_blobs: images.config_and_layers(amd64),
            arm64_blobs: images.config_and_layers(arm64),
            installer_manifest: installer.to_string(),
            installer_blobs: images.config_and_layers(installer),
        };
        let factory = Factory::start(&dir.path().join("factory"));
        factory.put(&os_image_path(), &xz(&(0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>()));
        write_config(
            &dir.path().join("tender.yaml"),
            &[("ghcr.io", &registry.url()), ("factory.talos.dev", &registry.url())],
            &format!("defaultUpstream: ghcr.io\nimageFactory: {}\n", factory.url()),
        );
        Site { registry, digests, factory, dir }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn start_tender(&self) -> Tender {
        Tender::start(&self.path("tender.yaml"), &self.path("data"), &self.path("tender.log"))
    }
}

/// `xz -1` of `bytes`, by the xz command line tool.
pub(crate) fn xz(bytes: &[u8]) -> Vec<u8> {
    let mut child = Command::new("xz").args(["-1", "-c"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = bytes.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "xz failed");
    out.stdout
}

fn prefetch(args: &[&str]) -> (i32, String, String) {
    let out = tender::run(std::iter::once("prefetch").chain(args.iter().copied()));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// How often each blob / manifest digest was fetched from the registry.
fn counts(requests: &[String]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in requests {
        if let Some(d) = r.rsplit('/').next().filter(|d| d.starts_with("sha256:")) {
            *m.entry(d.to_string()).or_insert(0) += 1;
        }
    }
    m
}

fn assert_amd64_once(requests: &[String], d: &Digests) {
    let c = counts(requests);
    let blob_gets: Vec<&String> = requests.iter().filter(|r| r.starts_with("GET ") && r.contains("/blobs/")).collect();
    for x in d.amd64_blobs.iter().chain(&d.installer_blobs) {
        assert_eq!(c.get(x), Some(&1), "{x} fetched once from upstream; requests: {requests:#?}");
    }
    for x in d.arm64_blobs.iter().chain(std::iter::once(&d.arm64_manifest)) {
        assert_eq!(c.get(x), None, "arm64 {x} never fetched; requests: {requests:#?}");
    }
    assert_eq!(c.get(&d.amd64_manifest), Some(&1), "the amd64 manifest once");
    assert_eq!(blob_gets.len(), d.amd64_blobs.len() + d.installer_blobs.len(), "{blob_gets:#?}");
}

fn pinned(data: &std::path::Path, digest: &str) -> bool {
    data.join("pins").join(format!("{}.json", digest.trim_start_matches("sha256:"))).is_file()
}

#[test]
fn should_warm_a_running_server_with_only_the_amd64_blobs_once() {
    let site = Site::new("prefetch-server");
    let tender = site.start_tender();
    let url = format!("http://{}", tender.hostport());

    let offset = site.registry.log_len();
    let args =
        ["--server", &url, "--pin", "ghcr.io/siderolabs/kubelet:v1.33.1", "--talos", TALOS, "--schematic", SCHEMATIC];
    let (code, stdout, stderr) = prefetch(&args);
    assert_eq!(code, 0, "prefetch failed:\n{stdout}{stderr}");
    assert!(stdout.contains("fetched   ghcr.io/siderolabs/kubelet:v1.33.1 [linux/amd64]"), "{stdout}");
    assert!(stdout.contains(&format!("fetched   factory.talos.dev/installer/{SCHEMATIC}:{TALOS}")), "{stdout}");
    assert!(stdout.contains(&format!("fetched   {}", os_image_path())), "{stdout}");
    let requests = site.registry.requests_since(offset);
    assert_amd64_once(&requests, &site.digests);
    assert!(requests.iter().any(|r| r.ends_with(&format!("/manifests/{TALOS}")) && r.contains("installer/")));
    assert_eq!(site.factory.gets(), 1, "the OS image fetched once from the factory");

    // the server saw prefetch requests (kept apart from workers) and pinned what they fetched
    let blobs: Vec<_> = tender.access().into_iter().filter(|a| a.is_blob()).collect();
    assert!(!blobs.is_empty(), "blob requests reached the server");
    let log = std::fs::read_to_string(&tender.log).unwrap();
    let blob_lines: Vec<&str> = log.lines().filter(|l| l.contains("\"access\"") && l.contains("/blobs/")).collect();
    assert!(blob_lines.iter().all(|l| l.contains("\"prefetch\":true")), "{blob_lines:#?}");
    for d in &site.digests.amd64_blobs {
        assert!(pinned(&tender.data, d), "{d} pinned");
    }

    // a second run fetches nothing from upstream
    let offset = site.registry.log_len();
    let (code, stdout, stderr) = prefetch(&args);
    assert_eq!(code, 0, "second prefetch failed:\n{stdout}{stderr}");
    assert_eq!(site.registry.requests_since(offset), Vec::<String>::new(), "nothing from upstream the second time");
    assert_eq!(site.factory.gets(), 1);

    // a missing image is a definite failure: exit 1, the rest still warmed
    let (code, stdout, _) =
        prefetch(&["--server", &url, "ghcr.io/siderolabs/kubelet:v0.0.0", "ghcr.io/siderolabs/kubelet:v1.33.1"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("failed    ghcr.io/siderolabs/kubelet:v0.0.0")
            && stdout.contains("fetched   ghcr.io/siderolabs/kubelet:v1.33.1"),
        "{stdout}"
    );
    drop(tender);

    // no server: only transient failures, exit 3
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (code, stdout, _) = prefetch(&["--server", &format!("http://{closed}"), "--retries", "1", "alpine"]);
    assert_eq!(code, 3, "{stdout}");
}

#[test]
fn should_warm_a_stopped_data_directory_in_process() {
    let site = Site::new("prefetch-data");
    let data = site.path("data");
    let config = site.path("tender.yaml");
    let (d, c) = (data.to_str().unwrap(), config.to_str().unwrap());
    let args =
        ["--data", d, "--config", c, "--pin", "--kubernetes", "v1.33.1", "--talos", TALOS, "--schematic", SCHEMATIC];

    // refused while a server holds the directory
    let tender = site.start_tender();
    let offset = site.registry.log_len();
    let (code, stdout, stderr) = prefetch(&args);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("in use by another tender"), "{stderr}");
    assert_eq!(site.registry.requests_since(offset), Vec::<String>::new());
    drop(tender);

    let (code, stdout, stderr) = prefetch(&args);
    assert_eq!(code, 0, "prefetch --data failed:\n{stdout}{stderr}");
    assert!(stdout.contains("fetched   ghcr.io/siderolabs/kubelet:v1.33.1 [linux/amd64]"), "{stdout}");
    let requests = site.registry.requests_since(offset);
    let dg = &site.digests;
    assert_amd64_once(&requests, dg);
    assert_eq!(site.factory.gets(), 1);
    for x in dg.amd64_blobs.iter().chain(&dg.installer_blobs).chain([
        &dg.kubelet_index,
        &dg.amd64_manifest,
        &dg.installer_manifest,
    ]) {
        assert!(pinned(&data, x), "{x} pinned");
    }
    for x in &dg.arm64_blobs {
        assert!(!data.join("objects/sha256").join(&x[7..9]).join(&x[7..]).exists(), "arm64 {x} not stored");
    }

    // a second run: everything already stored, nothing from upstream
    let offset = site.registry.log_len();
    let (code, stdout, stderr) = prefetch(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(site.registry.requests_since(offset), Vec::<String>::new(), "nothing from upstream the second time");
    assert_eq!(site.factory.gets(), 1);
    assert!(stdout.contains("5 objects, 4.00 MiB, 5 already stored"), "{stdout}");

    // what was written verifies
    let out = tender::run(["fsck", "--data", d]);
    assert!(out.status.success(), "fsck: {}", String::from_utf8_lossy(&out.stdout));
}
