//! Test bed for the catalog and clone tests: a fake Image Factory (in process, on
//! 127.0.0.1:0) that, like the real one, serves no ranges and answers slowly on a cold asset;
//! real disk images (an MBR-partitioned raw image with an ext4 filesystem holding files) in
//! xz, zstd and gzip; the real `tender` binary; and loop-mounted filesystems behind Drop
//! guards. `TIMING=1` prints how long each tender command took, with its debug log.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, reason = "test support")]

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use sha2::{Digest as _, Sha256};

pub const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
/// The disk image's size.
pub const IMAGE_SIZE: u64 = 32 << 20;

// ---------- prerequisites ----------

/// Whether the machine has `tool`.
pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .env("PATH", format!("{}:/usr/sbin:/sbin", std::env::var("PATH").unwrap_or_default()))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    found
}

/// A test that needs what `why` names fails, saying what is missing: the tests that need root
/// or tools live in crates/e2e, whose peers scripts/test.sh installs.
pub fn require(test: &str, why: Option<String>) {
    if let Some(w) = why {
        panic!("{test}: {w} (scripts/test.sh installs the packages; run as root)");
    }
}

pub fn missing_tools(tools: &[&str]) -> Option<String> {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !have(t)).collect();
    (!missing.is_empty()).then(|| format!("needs {}", missing.join(", ")))
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

// ---------- disk images ----------

/// A real disk image and its compressed forms, built once per test binary.
pub struct Images {
    pub raw: Vec<u8>,
    pub sha256: String,
    pub xz: Bytes,
    pub zst: Bytes,
    pub gz: Bytes,
}

fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// An MBR partition table with one Linux partition from 1 MiB to the end.
fn mbr(total: u64) -> [u8; 512] {
    let mut m = [0u8; 512];
    let start: u32 = 2048;
    let sectors = (total / 512) as u32 - start;
    let e = &mut m[446..462];
    e[0] = 0x00; // not bootable
    e[1..4].copy_from_slice(&[0xfe, 0xff, 0xff]); // CHS: use LBA
    e[4] = 0x83; // Linux
    e[5..8].copy_from_slice(&[0xfe, 0xff, 0xff]);
    e[8..12].copy_from_slice(&start.to_le_bytes());
    e[12..16].copy_from_slice(&sectors.to_le_bytes());
    m[440..444].copy_from_slice(&0x7e4d_e12du32.to_le_bytes()); // disk signature
    m[510] = 0x55;
    m[511] = 0xaa;
    m
}

/// A 32 MiB raw disk laid out like a small OS image, built in memory (no mkfs): an MBR with one
/// Linux partition from 1 MiB, and data extents scattered through the partition with zeros
/// between them, so the compressed forms are small and a sparse copy skips most blocks.
fn build_image() -> Vec<u8> {
    let mut raw = vec![0u8; IMAGE_SIZE as usize];
    raw[..512].copy_from_slice(&mbr(IMAGE_SIZE));
    let mut put = |at: usize, bytes: &[u8]| raw[at..at + bytes.len()].copy_from_slice(bytes);
    // (offset, content): a superblock-sized header, a kernel, a data file, a config text
    put((1 << 20) + 1024, &pseudo_random(1024, 3));
    put(2 << 20, b"talos.platform=openstack console=ttyS0\n");
    put(4 << 20, &pseudo_random(512 << 10, 11));
    put(12 << 20, &pseudo_random(3 << 20, 7));
    put((IMAGE_SIZE as usize) - (64 << 10), &pseudo_random(4096, 13));
    raw
}

pub fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

pub fn sha256_file(p: &Path) -> String {
    let mut f = std::fs::File::open(p).unwrap();
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).unwrap();
    hex::encode(h.finalize())
}

/// The images, built once and kept under the target directory, so later test binaries and runs
/// reuse them.
pub fn images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    let t0 = Instant::now();
    let r = IMAGES.get_or_init(|| {
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("catalog-images-v2");
        let read = |ext: &str| std::fs::read(cache.join(format!("disk.{ext}"))).ok();
        if let (Some(raw), Some(xz), Some(zst), Some(gz)) =
            (read("raw"), read("raw.xz"), read("raw.zst"), read("raw.gz"))
        {
            return Images { sha256: sha256_hex(&raw), raw, xz: xz.into(), zst: zst.into(), gz: gz.into() };
        }
        let raw = build_image();
        let xz = {
            let mut e = liblzma::write::XzEncoder::new(Vec::new(), 0);
            e.write_all(&raw).unwrap();
            Bytes::from(e.finish().unwrap())
        };
        let zst = {
            let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
            e.include_checksum(true).unwrap();
            e.write_all(&raw).unwrap();
            Bytes::from(e.finish().unwrap())
        };
        let gz = {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&raw).unwrap();
            Bytes::from(e.finish().unwrap())
        };
        // Publish atomically: another test binary may be building the same cache.
        let tmp = cache.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        for (ext, b) in [("raw", &raw[..]), ("raw.xz", &xz[..]), ("raw.zst", &zst[..]), ("raw.gz", &gz[..])] {
            std::fs::write(tmp.join(format!("disk.{ext}")), b).unwrap();
        }
        if std::fs::rename(&tmp, &cache).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Images { sha256: sha256_hex(&raw), raw, xz, zst, gz }
    });
    if std::env::var_os("TIMING").is_some() {
        eprintln!("TIMING images {:?}", t0.elapsed());
    }
    r
}

// ---------- the fake Image Factory ----------

#[derive(Default)]
pub struct FactoryState {
    /// `/image/<schematic>/<version>/<asset>` -> body
    pub assets: Mutex<HashMap<String, Bytes>>,
    /// Paths asked for at least once (a cold asset answers late the first time).
    warm: Mutex<Vec<String>>,
    pub cold_delay: Mutex<Duration>,
    /// Send the body in chunks of this size with this pause between them.
    pub drip: Mutex<Option<(usize, Duration)>>,
    /// Answer 500 to this many GETs.
    pub fail_next: AtomicU32,
    /// Answer every GET 500.
    pub down: Mutex<bool>,
    pub gets: Mutex<HashMap<String, u64>>,
    pub ranges_seen: AtomicU64,
    pub bytes_sent: Arc<AtomicU64>,
}

pub struct FakeFactory {
    pub addr: SocketAddr,
    pub state: Arc<FactoryState>,
    _runtime: Arc<tokio::runtime::Runtime>,
}

impl FakeFactory {
    pub fn start() -> FakeFactory {
        let runtime =
            Arc::new(tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap());
        let state = Arc::new(FactoryState { cold_delay: Mutex::new(Duration::from_millis(300)), ..Default::default() });
        let st = state.clone();
        let addr = runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let app = axum::Router::new().fallback(handle).with_state(st);
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            addr
        });
        FakeFactory { addr, state, _runtime: runtime }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn put(&self, version: &str, asset: &str, body: Bytes) {
        self.state.assets.lock().unwrap().insert(format!("/image/{SCHEMATIC}/{version}/{asset}"), body);
    }

    pub fn gets(&self, version: &str, asset: &str) -> u64 {
        *self.state.gets.lock().unwrap().get(&format!("/image/{SCHEMATIC}/{version}/{asset}")).unwrap_or(&0)
    }

    pub fn total_gets(&self) -> u64 {
        self.state.gets.lock().unwrap().values().sum()
    }

    pub fn set_drip(&self, d: Option<(usize, Duration)>) {
        *self.state.drip.lock().unwrap() = d;
    }

    pub fn set_down(&self, down: bool) {
        *self.state.down.lock().unwrap() = down;
    }

    pub fn bytes_sent(&self) -> u64 {
        self.state.bytes_sent.load(Ordering::SeqCst)
    }
}

async fn handle(State(st): State<Arc<FactoryState>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    if req.headers().contains_key(header::RANGE) {
        st.ranges_seen.fetch_add(1, Ordering::SeqCst);
    }
    let Some(body) = st.assets.lock().unwrap().get(&path).cloned() else {
        return (StatusCode::NOT_FOUND, "not found\n").into_response();
    };
    let len = body.len();
    if req.method() == Method::HEAD {
        return ([(header::CONTENT_LENGTH, len.to_string())], ()).into_response();
    }
    *st.gets.lock().unwrap().entry(path.clone()).or_default() += 1;
    if *st.down.lock().unwrap() {
        return (StatusCode::INTERNAL_SERVER_ERROR, "factory down\n").into_response();
    }
    if st.fail_next.load(Ordering::SeqCst) > 0 {
        st.fail_next.fetch_sub(1, Ordering::SeqCst);
        return (StatusCode::INTERNAL_SERVER_ERROR, "transient\n").into_response();
    }
    let cold = {
        let mut warm = st.warm.lock().unwrap();
        let cold = !warm.contains(&path);
        if cold {
            warm.push(path.clone());
        }
        cold
    };
    if cold {
        // Like the real factory building an asset on first request: headers come late.
        let d = *st.cold_delay.lock().unwrap();
        tokio::time::sleep(d).await;
    }
    let drip = *st.drip.lock().unwrap();
    let sent = st.bytes_sent.clone();
    // No ranges, like the factory serving directly: always 200 with the whole body.
    let stream = futures::stream::unfold((body, 0usize), move |(body, pos)| {
        let sent = sent.clone();
        async move {
            if pos >= body.len() {
                return None;
            }
            let (chunk, pause) = match drip {
                Some((c, p)) => (c, Some(p)),
                None => (1 << 20, None),
            };
            if let Some(p) = pause {
                tokio::time::sleep(p).await;
            }
            let end = (pos + chunk).min(body.len());
            sent.fetch_add((end - pos) as u64, Ordering::SeqCst);
            Some((Ok::<_, std::io::Error>(body.slice(pos..end)), (body, end)))
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_LENGTH, len.to_string())
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

// ---------- the binary ----------

/// The binary under test: cargo's for the tender package's own tests; for the clone tests in
/// crates/e2e (which include this module) `TENDER_BIN`, else `<target dir>/debug/tender`.
pub fn tender_bin() -> PathBuf {
    if let Some(bin) = option_env!("CARGO_BIN_EXE_tender") {
        return PathBuf::from(bin);
    }
    let bin = std::env::var_os("TENDER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("../debug/tender"));
    assert!(bin.is_file(), "no tender binary at {}: cargo build --bin tender first", bin.display());
    bin
}

pub fn command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = Command::new(tender_bin());
    c.args(args).env_remove("TENDER_LOG").stdin(Stdio::null());
    if std::env::var_os("TIMING").is_some() {
        c.env("TENDER_LOG", "debug");
    }
    c
}

/// Run a tender command to completion (at most 60 s).
pub fn run<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = command(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let t0 = Instant::now();
    let child = c.spawn().expect("starting tender");
    let o = output_within(child, Duration::from_secs(60));
    if std::env::var_os("TIMING").is_some() {
        eprintln!(
            "TIMING {:?} {:?} {}",
            t0.elapsed(),
            c.get_args().take(3).collect::<Vec<_>>(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    o
}

pub fn output_within(mut child: Child, limit: Duration) -> Output {
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "tender did not finish within {limit:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Assert an exit code, showing everything when it is another.
pub fn expect_code(o: &Output, code: i32) {
    assert_eq!(o.status.code(), Some(code), "{}", text(o));
}

/// One catalog entry of the config.
pub struct Image<'a> {
    pub version: &'a str,
    pub format: &'a str,
    pub extra: &'a str,
}

/// A workspace: a config naming the fake factory and some entries, a data directory.
pub struct Bed {
    pub tmp: tempfile::TempDir,
    pub config: PathBuf,
    pub data: PathBuf,
    pub factory_url: String,
}

impl Bed {
    pub fn new(factory_url: &str) -> Bed {
        Self::within(tempfile::tempdir().unwrap(), factory_url)
    }

    /// A bed whose data directory (and so the goldens) lives under `dir`.
    pub fn in_dir(dir: &Path, factory_url: &str) -> Bed {
        Self::within(tempfile::tempdir_in(dir).unwrap(), factory_url)
    }

    fn within(tmp: tempfile::TempDir, factory_url: &str) -> Bed {
        let config = tmp.path().join("tender.yaml");
        let data = tmp.path().join("data");
        Bed { tmp, config, data, factory_url: factory_url.to_string() }
    }

    /// Write the config with these entries (and extra top-level YAML).
    pub fn config(&self, images: &[Image<'_>], extra: &str) {
        let mut y = format!(
            "# catalog tests: loopback factory only\nupstreams: []\nimageFactory: {}\ndata: {}\nfetch:\n  attempts: 2\n  backoffBase: 20ms\n  backoffMax: 100ms\n  stallTimeout: 5s\n  factoryFirstByteTimeout: 10s\n{extra}catalog:\n  images:\n",
            self.factory_url,
            self.data.display()
        );
        if images.is_empty() {
            y = y.replace("  images:\n", "  images: []\n");
        }
        for i in images {
            y.push_str(&format!(
                "    - schematic: {SCHEMATIC}\n      version: {}\n      format: {}\n",
                i.version, i.format
            ));
            for l in i.extra.lines() {
                y.push_str(&format!("      {l}\n"));
            }
        }
        std::fs::write(&self.config, y).unwrap();
    }

    /// `tender <args> --config <config>`
    pub fn run(&self, args: &[&str]) -> Output {
        let mut a: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_ref()).collect();
        a.push("--config".as_ref());
        a.push(self.config.as_os_str());
        run(a)
    }

    pub fn golden_name(&self, version: &str) -> String {
        format!("talos-worker-{SCHEMATIC}-{version}")
    }

    pub fn golden(&self, version: &str) -> PathBuf {
        self.data.join("goldens").join(format!("{}.raw", self.golden_name(version)))
    }

    /// `tender catalog ls --output json`, parsed.
    pub fn ls(&self) -> serde_json::Value {
        let o = self.run(&["catalog", "ls", "--output", "json"]);
        expect_code(&o, 0);
        serde_json::from_slice(&o.stdout).unwrap()
    }

    pub fn golden_view(&self, version: &str) -> serde_json::Value {
        let name = self.golden_name(version);
        self.ls()["goldens"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == name.as_str())
            .cloned()
            .unwrap_or_default()
    }

    /// Start `tender serve` on a free port; returns the guard and its URL.
    /// The file holding [`ADMIN_TOKEN`].
    pub fn admin_token_file(&self) -> std::path::PathBuf {
        self.tmp.path().join("admin-token")
    }

    /// `tender serve` with this bed's config and the admin endpoints on ([`Bed::admin_token_file`]).
    pub fn serve(&self) -> Server {
        let log = self.tmp.path().join("serve.log");
        let file = std::fs::File::create(&log).unwrap();
        std::fs::write(self.admin_token_file(), format!("{ADMIN_TOKEN}\n")).unwrap();
        let child = command(["serve", "--listen", "127.0.0.1:0", "--log-format", "json", "--config"])
            .arg(&self.config)
            .arg("--admin-token-file")
            .arg(self.admin_token_file())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("starting tender serve");
        let mut server = Server { child: Some(child), url: String::new(), log };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            let text = std::fs::read_to_string(&server.log).unwrap_or_default();
            for line in text.lines() {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                    if let Some(l) = v.get("listen").and_then(|x| x.as_str()) {
                        server.url = format!("http://{l}");
                        return server;
                    }
                }
            }
            if let Some(c) = server.child.as_mut() {
                if let Some(status) = c.try_wait().unwrap() {
                    panic!("tender serve exited {status}: {text}");
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("tender serve did not log its address: {}", std::fs::read_to_string(&server.log).unwrap_or_default());
    }
}

/// A running `tender serve`, killed on drop.
pub struct Server {
    child: Option<Child>,
    pub url: String,
    pub log: PathBuf,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }

    /// SIGTERM and wait.
    pub fn stop(mut self) {
        if let Some(mut c) = self.child.take() {
            self.signal_child(&c);
            let t0 = Instant::now();
            while c.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal_child(&self, c: &Child) {
        if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// GET a URL on loopback (blocking, a small client of our own).
pub fn http(method: &str, url: &str) -> (u16, String) {
    http_as(method, url, None)
}

/// The admin token of every [`Bed::serve`].
pub const ADMIN_TOKEN: &str = "catalog-admin-token-0123456789";

/// A request with an optional bearer token.
pub fn http_as(method: &str, url: &str, bearer: Option<&str>) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = reqwest::Client::new();
        let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = client.request(m, url);
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap())
    })
}

/// Poll `f` until it is true or `limit` passes.
pub fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out after {limit:?} waiting for {what}");
}

/// Bytes a file takes on disk.
pub fn allocated(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks() * 512
}

// ---------- loop-mounted filesystems ----------

/// A filesystem in a sparse image file, attached to a loop device and mounted on a temp
/// directory; unmounted and detached on drop.
pub struct Mount {
    pub dir: tempfile::TempDir,
    image_dir: tempfile::TempDir,
    device: Option<String>,
    mounted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    /// XFS with reflink=1: copy-on-write clones.
    XfsReflink,
    /// ext4: no reflinks.
    Ext4,
}

fn sh(cmd: &mut Command) -> Result<String, String> {
    let o = cmd.env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin").output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    } else {
        Err(format!("{cmd:?}: {}", String::from_utf8_lossy(&o.stderr).trim()))
    }
}

/// Why loop-mount tests cannot run here, if they cannot.
pub fn mount_unavailable() -> Option<String> {
    if !is_root() {
        return Some("needs root (loop devices and mount)".into());
    }
    if let Some(m) = missing_tools(&["mkfs.xfs", "mkfs.ext4", "losetup", "mount", "umount", "qemu-img"]) {
        return Some(m);
    }
    None
}

impl Mount {
    pub fn new(fs: Fs) -> Result<Mount, String> {
        let image_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let image = image_dir.path().join("fs.img");
        // XFS needs 300 MiB at least; the file is sparse, so this costs next to nothing.
        std::fs::File::create(&image).and_then(|f| f.set_len(320 << 20)).map_err(|e| e.to_string())?;
        match fs {
            Fs::XfsReflink => sh(Command::new("mkfs.xfs").args(["-q", "-f", "-m", "reflink=1"]).arg(&image))?,
            Fs::Ext4 => sh(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))?,
        };
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut m = Mount { dir, image_dir, device: None, mounted: false };
        let dev = sh(Command::new("losetup").args(["--find", "--show"]).arg(&image))?;
        m.device = Some(dev.clone());
        sh(Command::new("mount").arg(&dev).arg(m.dir.path()))?;
        m.mounted = true;
        Ok(m)
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes in use on the filesystem (after a sync).
    pub fn used(&self) -> u64 {
        rustix::fs::sync();
        let s = rustix::fs::statvfs(self.path()).unwrap();
        (s.f_blocks - s.f_bfree) * s.f_frsize
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted && sh(Command::new("umount").arg(self.dir.path())).is_err() {
            let _ = sh(Command::new("umount").arg("-l").arg(self.dir.path()));
        }
        if let Some(dev) = &self.device {
            let _ = sh(Command::new("losetup").arg("-d").arg(dev));
        }
        let _ = &self.image_dir;
    }
}

/// `qemu-img compare` of a golden and a disk: equal over the golden's length, zeros beyond.
pub fn qemu_compare(golden: &Path, disk: &Path, disk_format: &str) -> Result<(), String> {
    sh(Command::new("qemu-img").args(["compare", "-q", "-f", "raw", "-F", disk_format]).arg(golden).arg(disk))
        .map(|_| ())
}

/// `qemu-img info --output json`
pub fn qemu_info(disk: &Path) -> serde_json::Value {
    let out = sh(Command::new("qemu-img").args(["info", "--output", "json", "-U"]).arg(disk)).unwrap();
    serde_json::from_str(&out).unwrap()
}

/// The file names in a directory (to show that a refusal created nothing).
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// A factory and a bed (its data directory under `dir`, or a temp dir) whose one golden,
/// v1.13.6 from xz, is imported.
pub fn synced_bed(images: &Images, dir: Option<&Path>) -> (FakeFactory, Bed) {
    let f = FakeFactory::start();
    f.put("v1.13.6", "openstack-amd64.raw.xz", images.xz.clone());
    let bed = match dir {
        Some(d) => Bed::in_dir(d, &f.url()),
        None => Bed::new(&f.url()),
    };
    bed.config(&[Image { version: "v1.13.6", format: "raw.xz", extra: "" }], "");
    expect_code(&bed.run(&["catalog", "sync"]), 0);
    (f, bed)
}

impl Bed {
    pub fn gold(&self) -> String {
        self.golden_name("v1.13.6")
    }

    /// `tender clone <golden> --pool P --worker W --size S --to T [more]`
    pub fn clone_disk(&self, pool: &str, worker: &str, size: &str, to: &Path, more: &[&str]) -> Output {
        let gold = self.gold();
        let to = to.to_str().unwrap();
        let mut args = vec!["clone", &gold, "--pool", pool, "--worker", worker, "--size", size, "--to", to];
        args.extend_from_slice(more);
        self.run(&args)
    }

    /// `tender catalog refs <golden> --output json`
    pub fn refs(&self) -> Vec<serde_json::Value> {
        let o = self.run(&["catalog", "refs", &self.gold(), "--output", "json"]);
        expect_code(&o, 0);
        serde_json::from_slice::<Vec<serde_json::Value>>(&o.stdout).unwrap()
    }
}
