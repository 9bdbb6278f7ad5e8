//! `tender prefetch` end to end: Debian's `docker-registry` (started by the shared harness and
//! filled by `mkimages.sh` with a multi-arch kubelet index and a single-arch installer) as the
//! upstream, an in-process Image Factory stand-in, and the real binary both ways:
//! `--server` (through a running tender) and `--data` (in-process on a stopped one's data
//! directory). Each proves from the registry's access log that only the amd64 blobs were
//! fetched, each exactly once, and that a second run fetches nothing from upstream.
//!
//! Needs `docker-registry`, `skopeo`, `jq`, `openssl` and `curl`; without them the tests print
//! SKIPPED and pass, unless `CI` is set, where they fail.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
const TALOS: &str = "v1.10.5";

// ---------------------------------------------------------------------------------------------
// The peers

/// `<workspace root>/../shared/harness` (or `TENDER_HARNESS`); a missing harness fails loudly.
fn harness_dir() -> PathBuf {
    let dir = match std::env::var_os("TENDER_HARNESS") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/harness"),
    };
    assert!(
        dir.join("upstream.sh").is_file() && dir.join("mkimages.sh").is_file(),
        "the shared test harness is missing: expected upstream.sh and mkimages.sh in {} \
         (shared/ must sit beside the workspace, or set TENDER_HARNESS)",
        dir.display()
    );
    dir
}

/// Whether the peers are installed; without them: SKIPPED, or a failure under CI. A missing
/// harness always fails.
fn peers_present(test: &str) -> bool {
    harness_dir();
    let missing: Vec<&str> = ["docker-registry", "skopeo", "jq", "openssl", "curl"]
        .into_iter()
        .filter(|c| {
            !Command::new("sh").arg("-c").arg(format!("command -v {c}")).output().is_ok_and(|o| o.status.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: missing {} (apt-get install docker-registry skopeo jq openssl curl)", missing.join(", "));
    }
    // Straight to the stderr handle, past libtest's capture, so a plain `cargo test` shows it.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: missing {} (apt-get install docker-registry skopeo jq openssl curl)",
        missing.join(", ")
    );
    false
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    out
}

fn must(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `docker-registry` through the harness, stopped when dropped.
struct Registry {
    dir: PathBuf,
    port: u16,
}

impl Registry {
    fn start(dir: &Path) -> Registry {
        let script = harness_dir().join("upstream.sh");
        let mut last = String::new();
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let out = run(Command::new(&script).arg("start").arg(dir).arg(port.to_string()));
            if out.status.success() {
                return Registry { dir: dir.to_path_buf(), port };
            }
            last = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            let _ = run(Command::new(&script).arg("stop").arg(dir));
        }
        panic!("docker-registry did not start:\n{last}");
    }

    fn hostport(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn log_len(&self) -> u64 {
        std::fs::metadata(self.dir.join("access.log")).map(|m| m.len()).unwrap_or(0)
    }

    /// Request lines (`GET /v2/...`) logged after `offset`.
    fn requests_since(&self, offset: u64) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(200));
        let mut text = String::new();
        let mut f = std::fs::File::open(self.dir.join("access.log")).unwrap();
        f.read_to_string(&mut text).unwrap();
        let text = text.get(offset as usize..).unwrap_or("");
        text.lines()
            .filter_map(|l| {
                let start = l.find("\"GET ").or_else(|| l.find("\"HEAD "))?;
                let rest = &l[start + 1..];
                Some(rest[..rest.find(" HTTP/")?].to_string())
            })
            .collect()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = run(Command::new(harness_dir().join("upstream.sh")).arg("stop").arg(&self.dir));
    }
}

/// The synthetic images: digests of what belongs to which platform.
struct Images {
    kubelet_index: String,
    amd64_manifest: String,
    arm64_manifest: String,
    amd64_blobs: Vec<String>,
    arm64_blobs: Vec<String>,
    installer_manifest: String,
    installer_blobs: Vec<String>,
}

fn blobs_of(layout: &Path, manifest: &str) -> Vec<String> {
    let path = layout.join("blobs/sha256").join(manifest.trim_start_matches("sha256:"));
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut out = vec![m["config"]["digest"].as_str().unwrap().to_string()];
    out.extend(m["layers"].as_array().unwrap().iter().map(|l| l["digest"].as_str().unwrap().to_string()));
    out
}

fn make_images(reg: &Registry, work: &Path) -> Images {
    must(
        Command::new(harness_dir().join("mkimages.sh"))
            .arg(reg.hostport())
            .env("KUBELET_LAYERS_MB", "3 1")
            .env("INSTALLER_LAYERS_MB", "2")
            .env("BIG_MB", "0")
            .env("WORK", work),
    );
    let env = std::fs::read_to_string(work.join("images.env")).unwrap();
    let vars: BTreeMap<&str, &str> = env.lines().filter_map(|l| l.split_once('=')).collect();
    let layout = work.join("layout");
    let (amd64, arm64, installer) = (vars["KUBELET_AMD64"], vars["KUBELET_ARM64"], vars["INSTALLER_MANIFEST"]);
    // the preset installer: <installer-repository>/<schematic>:<talos>
    must(Command::new("skopeo").args([
        "copy",
        "-q",
        "--all",
        "--preserve-digests",
        "--src-tls-verify=false",
        "--dest-tls-verify=false",
        &format!("docker://{}/siderolabs/installer:v1.10.5", reg.hostport()),
        &format!("docker://{}/installer/{SCHEMATIC}:{TALOS}", reg.hostport()),
    ]));
    Images {
        kubelet_index: vars["KUBELET_INDEX"].to_string(),
        amd64_manifest: amd64.to_string(),
        arm64_manifest: arm64.to_string(),
        amd64_blobs: blobs_of(&layout, amd64),
        arm64_blobs: blobs_of(&layout, arm64),
        installer_manifest: installer.to_string(),
        installer_blobs: blobs_of(&layout, installer),
    }
}

/// An Image Factory stand-in: the OS image, whole, `200` to every GET (Range ignored, as the
/// real factory does), counting GETs.
struct Factory {
    url: String,
    gets: Arc<AtomicUsize>,
}

fn os_image_path() -> String {
    format!("/image/{SCHEMATIC}/{TALOS}/openstack-amd64.raw.xz")
}

impl Factory {
    fn start() -> Factory {
        let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
        e.write_all(&(0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>()).unwrap();
        let image = Arc::new(e.finish().unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let gets = Arc::new(AtomicUsize::new(0));
        let g = gets.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (image, g) = (image.clone(), g.clone());
                std::thread::spawn(move || serve_factory(conn, &image, &g));
            }
        });
        Factory { url, gets }
    }
}

fn serve_factory(mut conn: TcpStream, image: &[u8], gets: &AtomicUsize) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request = String::new();
    let _ = reader.read_line(&mut request);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if path != os_image_path() {
        let _ = conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    }
    if method == "GET" {
        gets.fetch_add(1, Ordering::SeqCst);
    }
    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", image.len());
    let _ = conn.write_all(head.as_bytes());
    if method == "GET" {
        let _ = conn.write_all(image);
    }
}

/// `tender serve` on a config naming only loopback upstreams; killed when dropped.
struct Tender {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Tender {
    fn start(config: &Path, log: PathBuf) -> Tender {
        let child = Command::new(env!("CARGO_BIN_EXE_tender"))
            .args(["serve", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut t = Tender { child, url: String::new(), log };
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&t.log).unwrap_or_default();
            if let Some(rest) = text.split("tender serving on ").nth(1) {
                t.url = rest.split_whitespace().next().unwrap().to_string();
                return t;
            }
            if let Ok(Some(status)) = t.child.try_wait() {
                panic!("tender serve exited with {status}:\n{text}");
            }
            assert!(Instant::now() < until, "tender serve did not start:\n{text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Tender {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- tender log ---\n{}", std::fs::read_to_string(&self.log).unwrap_or_default());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_config(dir: &Path, reg: &Registry, factory: &Factory) -> PathBuf {
    let config = dir.join("tender.yaml");
    let up = format!("http://{}", reg.hostport());
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:0\ndata: {}\ndefaultUpstream: ghcr.io\nimageFactory: {}\nupstreams:\n  \
             - name: ghcr.io\n    url: {up}\n  - name: factory.talos.dev\n    url: {up}\n",
            dir.join("data").display(),
            factory.url
        ),
    )
    .unwrap();
    config
}

fn prefetch(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tender")).arg("prefetch").args(args).output().unwrap();
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

fn assert_amd64_once(requests: &[String], img: &Images) {
    let c = counts(requests);
    let blob_gets: Vec<&String> = requests.iter().filter(|r| r.starts_with("GET ") && r.contains("/blobs/")).collect();
    for d in img.amd64_blobs.iter().chain(&img.installer_blobs) {
        assert_eq!(c.get(d), Some(&1), "{d} fetched once from upstream; requests: {requests:#?}");
    }
    for d in img.arm64_blobs.iter().chain(std::iter::once(&img.arm64_manifest)) {
        assert_eq!(c.get(d), None, "arm64 {d} never fetched; requests: {requests:#?}");
    }
    assert_eq!(c.get(&img.amd64_manifest), Some(&1), "the amd64 manifest once");
    assert_eq!(blob_gets.len(), img.amd64_blobs.len() + img.installer_blobs.len(), "{blob_gets:#?}");
}

// ---------------------------------------------------------------------------------------------
// The tests

#[test]
fn should_warm_a_running_server_with_only_the_amd64_blobs_once() {
    if !peers_present("should_warm_a_running_server_with_only_the_amd64_blobs_once") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("tender-prefetch-server.").tempdir().unwrap();
    let reg = Registry::start(&dir.path().join("up"));
    let img = make_images(&reg, &dir.path().join("img"));
    let factory = Factory::start();
    let config = write_config(dir.path(), &reg, &factory);
    let tender = Tender::start(&config, dir.path().join("tender.log"));

    let offset = reg.log_len();
    let args = [
        "--server",
        &tender.url,
        "--pin",
        "ghcr.io/siderolabs/kubelet:v1.33.1",
        "--talos",
        TALOS,
        "--schematic",
        SCHEMATIC,
    ];
    let (code, stdout, stderr) = prefetch(&args);
    assert_eq!(code, 0, "prefetch failed:\n{stdout}{stderr}");
    assert!(stdout.contains("fetched   ghcr.io/siderolabs/kubelet:v1.33.1 [linux/amd64]"), "{stdout}");
    assert!(stdout.contains(&format!("fetched   factory.talos.dev/installer/{SCHEMATIC}:{TALOS}")), "{stdout}");
    assert!(stdout.contains(&format!("fetched   {}", os_image_path())), "{stdout}");
    let requests = reg.requests_since(offset);
    assert_amd64_once(&requests, &img);
    assert!(requests.iter().any(|r| r.ends_with(&format!("/manifests/{TALOS}")) && r.contains("installer/")));
    assert_eq!(factory.gets.load(Ordering::SeqCst), 1, "the OS image fetched once from the factory");

    // the server saw prefetch requests (kept apart from workers) and pinned what they fetched
    let log = std::fs::read_to_string(&tender.log).unwrap();
    let blob_lines: Vec<&str> = log.lines().filter(|l| l.contains("access") && l.contains("/blobs/")).collect();
    assert!(!blob_lines.is_empty() && blob_lines.iter().all(|l| l.contains("prefetch=true")), "{blob_lines:#?}");
    let data = dir.path().join("data");
    for d in &img.amd64_blobs {
        assert!(data.join("pins").join(format!("{}.json", d.trim_start_matches("sha256:"))).is_file(), "{d} pinned");
    }

    // a second run fetches nothing from upstream
    let offset = reg.log_len();
    let (code, stdout, stderr) = prefetch(&args);
    assert_eq!(code, 0, "second prefetch failed:\n{stdout}{stderr}");
    assert_eq!(reg.requests_since(offset), Vec::<String>::new(), "nothing from upstream the second time");
    assert_eq!(factory.gets.load(Ordering::SeqCst), 1);

    // a missing image is a definite failure: exit 1, the rest still warmed
    let (code, stdout, _) =
        prefetch(&["--server", &tender.url, "ghcr.io/siderolabs/kubelet:v0.0.0", "ghcr.io/siderolabs/kubelet:v1.33.1"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("failed    ghcr.io/siderolabs/kubelet:v0.0.0")
            && stdout.contains("fetched   ghcr.io/siderolabs/kubelet:v1.33.1"),
        "{stdout}"
    );
    tender.stop();

    // the server gone: only transient failures, exit 3
    let (code, stdout, _) = prefetch(&["--server", &format!("http://{}", closed_port()), "--retries", "1", "alpine"]);
    assert_eq!(code, 3, "{stdout}");
}

fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

#[test]
fn should_warm_a_stopped_data_directory_in_process() {
    if !peers_present("should_warm_a_stopped_data_directory_in_process") {
        return;
    }
    let dir = tempfile::Builder::new().prefix("tender-prefetch-data.").tempdir().unwrap();
    let reg = Registry::start(&dir.path().join("up"));
    let img = make_images(&reg, &dir.path().join("img"));
    let factory = Factory::start();
    let config = write_config(dir.path(), &reg, &factory);
    let data = dir.path().join("data");
    let (d, c) = (data.to_str().unwrap(), config.to_str().unwrap());
    let args =
        ["--data", d, "--config", c, "--pin", "--kubernetes", "v1.33.1", "--talos", TALOS, "--schematic", SCHEMATIC];

    // refused while a server holds the directory
    let tender = Tender::start(&config, dir.path().join("tender.log"));
    let offset = reg.log_len();
    let (code, stdout, stderr) = prefetch(&args);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("in use by another tender"), "{stderr}");
    assert_eq!(reg.requests_since(offset), Vec::<String>::new());
    tender.stop();

    let (code, stdout, stderr) = prefetch(&args);
    assert_eq!(code, 0, "prefetch --data failed:\n{stdout}{stderr}");
    assert!(stdout.contains("fetched   ghcr.io/siderolabs/kubelet:v1.33.1 [linux/amd64]"), "{stdout}");
    let requests = reg.requests_since(offset);
    assert_amd64_once(&requests, &img);
    assert_eq!(factory.gets.load(Ordering::SeqCst), 1);
    for d in img.amd64_blobs.iter().chain(&img.installer_blobs).chain([
        &img.kubelet_index,
        &img.amd64_manifest,
        &img.installer_manifest,
    ]) {
        assert!(data.join("pins").join(format!("{}.json", d.trim_start_matches("sha256:"))).is_file(), "{d} pinned");
    }
    for d in &img.arm64_blobs {
        assert!(!data.join("objects/sha256").join(&d[7..9]).join(&d[7..]).exists(), "arm64 {d} not stored");
    }

    // a second run: everything already stored, nothing from upstream
    let offset = reg.log_len();
    let (code, stdout, stderr) = prefetch(&args);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(reg.requests_since(offset), Vec::<String>::new(), "nothing from upstream the second time");
    assert_eq!(factory.gets.load(Ordering::SeqCst), 1);
    assert!(stdout.contains("5 objects, 4.00 MiB, 5 already stored"), "{stdout}");

    // what was written verifies
    let out = run(Command::new(env!("CARGO_BIN_EXE_tender")).args(["fsck", "--data", d]));
    assert!(out.status.success(), "fsck: {}", String::from_utf8_lossy(&out.stdout));
}
