//! `tender prefetch`: warm the cache before workers need it.
//!
//! What: images named on the command line or in `--file`, plus presets derived from a release
//! (`--talos` → the installer and the catalog's OS image, `--kubernetes` → the kubelet). Only
//! the requested platforms of a multi-arch index are walked: the index, each matching
//! manifest, then its config and layer blobs.
//!
//! Where: `--server URL` warms a running tender through its own endpoints (`?ns=<registry>`),
//! so its single-flight, verification and accounting apply; every request carries
//! `X-Tender-Prefetch: 1` (and `X-Tender-Pin: 1` with `--pin`). `--data DIR` warms a stopped
//! one: the mirror is built in-process on the data directory (which refuses while a server
//! holds it) and the fetch layer is used directly; `--pin` then pins what it fetched.
//!
//! Exit: 0 when everything is in the cache; 1 if anything failed definitely (404, refused,
//! wrong bytes); 3 if only transient failures (timeouts, 5xx, an unreachable server) remain.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{self, StreamExt as _};
use indicatif::{HumanBytes, MultiProgress, ProgressBar, ProgressStyle};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use tender_catalog::asset::{self, AssetPath};
use tender_fetch::flight::{Claim, Fill, Phase};
use tender_fetch::mirror::CacheResult;
use tender_fetch::{FetchError, FetchErrorKind, Mirror, Upstream};
use tender_oci::media::{self, AcceptList, ALL_MANIFESTS};
use tender_oci::{Algorithm, Digest, Reference, RepoName};
use tender_store::{OpenMode, Store};
use tokio::sync::Semaphore;
use url::Url;

use crate::exit::{Context as _, Failure, Result};
use crate::http::{self, ClientArgs, ClientOptions, ImageRef, TenderClient};
use crate::progress::{Show, Totals};

/// Cozystack's default schematic ("cozystack-tested vanilla"), `talos.schematicID`.
pub const DEFAULT_SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";
/// Cozystack's `talos.installerRepository`.
pub const DEFAULT_INSTALLER_REPOSITORY: &str = "factory.talos.dev/installer";
/// Where the kubelet image lives.
pub const KUBELET_REPOSITORY: &str = "ghcr.io/siderolabs/kubelet";
/// Kubernetes minor → patch, as Cozystack's `packages/apps/kubernetes/files/versions.yaml`.
const KUBERNETES_VERSIONS: &str = include_str!("kubernetes-versions.yaml");
/// Largest manifest read from a server.
const MAX_MANIFEST_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug, clap::Args)]
pub struct PrefetchArgs {
    /// Images to warm, e.g. ghcr.io/siderolabs/kubelet:v1.35.6 (alpine = docker.io/library/alpine:latest)
    #[arg(value_name = "IMAGE")]
    pub images: Vec<String>,
    /// A file of images, one per line; `#` starts a comment (repeatable)
    #[arg(long = "file", value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Talos release: warms <installer-repository>/<schematic>:<talos> and the catalog's OS image
    #[arg(long, value_name = "VERSION")]
    pub talos: Option<String>,
    /// Kubernetes minor (v1.35, mapped to Cozystack's patch) or patch (v1.35.6): warms the kubelet
    #[arg(long, value_name = "VERSION")]
    pub kubernetes: Option<String>,
    /// Image Factory schematic of the installer and OS image
    #[arg(long, value_name = "ID", default_value = DEFAULT_SCHEMATIC, requires = "talos")]
    pub schematic: String,
    /// Installer repository (the schematic is appended as the last path component)
    #[arg(long, value_name = "REPO", default_value = DEFAULT_INSTALLER_REPOSITORY, requires = "talos")]
    pub installer_repository: String,
    /// Talos platform of the OS image (the OS image is <os-platform>-<arch>.<format>)
    #[arg(long, value_name = "NAME", default_value = "openstack", requires = "talos")]
    pub os_platform: String,
    /// Architecture of the OS image [default: the architecture of the first --platform]
    #[arg(long, value_name = "ARCH", requires = "talos")]
    pub arch: Option<String>,
    /// Disk format of the OS image
    #[arg(long, value_name = "FORMAT", default_value = "raw.xz", requires = "talos")]
    pub format: String,
    /// An OS image path to warm, /image/<schematic>/<version>/<asset> (repeatable)
    #[arg(long = "os-image", value_name = "PATH")]
    pub os_images: Vec<String>,
    /// Image platforms to walk in a multi-arch index (repeatable)
    #[arg(long = "platform", value_name = "OS/ARCH[/VARIANT]", default_value = "linux/amd64")]
    pub platforms: Vec<String>,
    /// Keep what was fetched out of eviction
    #[arg(long)]
    pub pin: bool,
    /// A running tender to warm through its endpoints, e.g. http://127.0.0.1:5000 [env:
    /// TENDER_SERVER, without --data]
    #[arg(long, value_name = "URL", conflicts_with = "data")]
    pub server: Option<String>,
    /// The data directory of a stopped tender to warm in-process
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Config file naming the upstreams (with --data) [default: the embedded default]
    #[arg(long, value_name = "FILE", requires = "data")]
    pub config: Option<PathBuf>,
    /// Blob transfers in parallel
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub jobs: usize,
    /// Times a transiently failed request (5xx, 429, timeout, reset, refused) is tried again
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub retries: u32,
    /// Longest silence from the server, waiting for an answer or between body bytes (with --server)
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// No progress on stderr (bars or lines); the summary still goes to stdout
    #[arg(long, short)]
    pub quiet: bool,
    /// When stderr is not a terminal: how often a progress line is printed
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    pub progress_interval: Duration,
    #[command(flatten)]
    pub client: ClientArgs,
    /// Further Talos sets (`export --spec`): each selects what `--talos`/`--kubernetes` would.
    #[arg(skip)]
    pub talos_sets: Vec<PrefetchArgs>,
}

impl PrefetchArgs {
    /// A copy carrying only the preset options (for one more Talos set).
    pub(crate) fn preset_only(&self) -> PrefetchArgs {
        PrefetchArgs {
            images: Vec::new(),
            files: Vec::new(),
            talos: None,
            kubernetes: None,
            schematic: self.schematic.clone(),
            installer_repository: self.installer_repository.clone(),
            os_platform: self.os_platform.clone(),
            arch: self.arch.clone(),
            format: self.format.clone(),
            os_images: Vec::new(),
            platforms: self.platforms.clone(),
            pin: false,
            server: None,
            data: None,
            config: None,
            jobs: self.jobs,
            retries: self.retries,
            timeout: self.timeout,
            quiet: self.quiet,
            progress_interval: self.progress_interval,
            client: ClientArgs::default(),
            talos_sets: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What to fetch

/// An image platform, `os/arch[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Platform {
    os: String,
    arch: String,
    variant: Option<String>,
}

impl FromStr for Platform {
    type Err = String;

    fn from_str(s: &str) -> Result<Platform, String> {
        let word = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let parts: Vec<&str> = s.trim().split('/').collect();
        match parts.as_slice() {
            [os, arch] if word(os) && word(arch) => {
                Ok(Platform { os: os.to_string(), arch: arch.to_string(), variant: None })
            }
            [os, arch, v] if word(os) && word(arch) && word(v) => {
                Ok(Platform { os: os.to_string(), arch: arch.to_string(), variant: Some(v.to_string()) })
            }
            _ => Err(format!("--platform {s:?}: expected os/arch[/variant], e.g. linux/amd64 or linux/arm64/v8")),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.arch)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

impl Platform {
    /// Whether an index entry's platform is this one. No variant asked: any variant; `arm64`
    /// entries without a variant are `v8`.
    fn matches(&self, p: &IndexPlatform) -> bool {
        if p.os != self.os || p.architecture != self.arch {
            return false;
        }
        match (&self.variant, &p.variant) {
            (None, _) => true,
            (Some(want), Some(got)) => want == got,
            (Some(want), None) => self.arch == "arm64" && want == "v8",
        }
    }
}

/// One thing to warm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Item {
    Image(ImageRef),
    OsImage(AssetPath),
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Image(i) => write!(f, "{i}"),
            Item::OsImage(a) => write!(f, "{}", a.path()),
        }
    }
}

/// The embedded Kubernetes minor → patch map.
fn kubernetes_versions() -> Result<BTreeMap<String, String>> {
    serde_norway::from_str(KUBERNETES_VERSIONS).context("reading the embedded Kubernetes version map")
}

/// `v1.35` → Cozystack's patch for it; a full `v1.35.2` is taken as written.
fn kubernetes_patch(raw: &str) -> Result<String> {
    let v = if raw.starts_with('v') { raw.to_string() } else { format!("v{raw}") };
    if asset::valid_version(&v) {
        return Ok(v);
    }
    let map = kubernetes_versions()?;
    match map.get(&v) {
        Some(patch) => Ok(patch.clone()),
        None => {
            let mut allowed: Vec<&String> = map.keys().collect();
            allowed.sort_by(|a, b| b.cmp(a));
            let allowed: Vec<&str> = allowed.iter().map(|s| s.as_str()).collect();
            Err(Failure::usage(format!(
                "--kubernetes {raw}: Kubernetes version {v} is not supported, allowed versions are [{}] \
                 (or give a full patch version like v1.35.6)",
                allowed.join(" ")
            )))
        }
    }
}

/// The items the presets stand for.
fn preset_items(args: &PrefetchArgs, platforms: &[Platform]) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    if let Some(talos) = &args.talos {
        if !asset::valid_version(talos) {
            return Err(Failure::usage(format!("--talos {talos:?}: expected a Talos release like v1.13.6")));
        }
        if !asset::valid_schematic(&args.schematic) {
            return Err(Failure::usage(format!(
                "--schematic {:?} is not an Image Factory schematic ID",
                args.schematic
            )));
        }
        let repo = args.installer_repository.trim_end_matches('/');
        let installer = format!("{repo}/{}:{talos}", args.schematic);
        items.push(Item::Image(
            ImageRef::parse(&installer).map_err(|e| Failure::usage(format!("--installer-repository: {e}")))?,
        ));
        let arch = match &args.arch {
            Some(a) => a.clone(),
            None => platforms.first().map(|p| p.arch.clone()).unwrap_or_else(|| "amd64".to_string()),
        };
        let name = format!("{}-{arch}.{}", args.os_platform, args.format);
        let asset = AssetPath::new(&args.schematic, talos, &name)
            .map_err(|e| Failure::usage(format!("the OS image {name:?} (--os-platform/--arch/--format): {e}")))?;
        items.push(Item::OsImage(asset));
    }
    if let Some(k) = &args.kubernetes {
        let patch = kubernetes_patch(k)?;
        let kubelet = format!("{KUBELET_REPOSITORY}:{patch}");
        items.push(Item::Image(ImageRef::parse(&kubelet).map_err(|e| Failure::usage(format!("--kubernetes: {e}")))?));
    }
    Ok(items)
}

/// Every item asked for, in order (files, arguments, os images, presets), without duplicates.
fn collect_items(args: &PrefetchArgs, platforms: &[Platform]) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    for f in &args.files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| Failure::usage(format!("cannot read --file {}: {e}", f.display())))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let img = ImageRef::parse(line).map_err(|e| Failure::usage(format!("{}:{}: {e}", f.display(), n + 1)))?;
            items.push(Item::Image(img));
        }
    }
    for raw in &args.images {
        items.push(Item::Image(ImageRef::parse(raw).map_err(Failure::usage)?));
    }
    for raw in &args.os_images {
        let a = AssetPath::parse(raw.trim()).map_err(|e| Failure::usage(format!("--os-image {raw:?}: {e}")))?;
        items.push(Item::OsImage(a));
    }
    items.extend(preset_items(args, platforms)?);
    for set in &args.talos_sets {
        items.extend(preset_items(set, platforms)?);
    }
    let mut seen = HashSet::new();
    items.retain(|i| seen.insert(i.to_string()));
    if items.is_empty() {
        return Err(Failure::usage("nothing to prefetch: name images, --file, --os-image, --talos or --kubernetes"));
    }
    Ok(items)
}

// ---------------------------------------------------------------------------------------------
// Outcomes

/// Why something could not be warmed, and whether trying again later could help.
#[derive(Debug, Clone)]
pub(crate) struct Failed {
    pub(crate) transient: bool,
    pub(crate) message: String,
}

impl Failed {
    /// As a command's failure: transient (exit 3) or a problem (exit 1).
    pub(crate) fn into_failure(self) -> Failure {
        if self.transient {
            Failure::transient(self.message)
        } else {
            Failure::problem(self.message)
        }
    }

    pub(crate) fn definite(message: impl Into<String>) -> Failed {
        Failed { transient: false, message: message.into() }
    }

    fn transient(message: impl Into<String>) -> Failed {
        Failed { transient: true, message: message.into() }
    }

    fn from_fetch(what: &str, e: &FetchError) -> Failed {
        let transient = e.is_retryable() || e.is_upstream_down();
        Failed { transient, message: format!("{what}: {e}") }
    }

    /// A non-success status from the server.
    pub(crate) fn status(what: &str, status: StatusCode) -> Failed {
        Failed::answered(what, status, None)
    }

    /// A non-success status from the server, with the message its body carried.
    pub(crate) fn answered(what: &str, status: StatusCode, said: Option<&str>) -> Failed {
        let code = status.as_u16();
        let message = match said {
            Some(m) => format!("{what}: the server answered {status}: {m}"),
            None => format!("{what}: the server answered {status}"),
        };
        if code >= 500 || code == 408 || code == 429 {
            Failed::transient(message)
        } else {
            Failed::definite(message)
        }
    }

    pub(crate) fn transport(what: &str, e: &reqwest::Error) -> Failed {
        let mut m = format!("{what}: {e}");
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            m.push_str(": ");
            m.push_str(&s.to_string());
            source = s.source();
        }
        Failed::transient(m)
    }
}

/// What warming one item did.
#[derive(Default, Clone)]
pub(crate) struct Done {
    /// Manifests and blobs (or the OS image) now in the cache.
    objects: usize,
    pub(crate) bytes: u64,
    /// Of those, already stored before this run (known with --data only).
    already: usize,
    pub(crate) platforms: Vec<String>,
    /// An image's manifests and blobs, as walked.
    pub(crate) graph: Option<Graph>,
}

/// An image as walked: its manifest or index, the chosen platforms' manifests, their blobs.
#[derive(Clone)]
pub(crate) struct Graph {
    pub(crate) top: Manifest,
    pub(crate) children: Vec<Manifest>,
    pub(crate) blobs: Vec<Blob>,
}

// ---------------------------------------------------------------------------------------------
// Progress

/// One progress bar per item on a terminal; plain lines otherwise; nothing with `--quiet`. Every
/// item also counts into the run's [`Totals`].
#[derive(Clone)]
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    show: Show,
    totals: Arc<Totals>,
    /// The bytes this item announced to the totals so far.
    known: Arc<std::sync::atomic::AtomicU64>,
}

impl Progress {
    pub(crate) fn new(multi: Option<&MultiProgress>, label: String, show: Show, totals: Arc<Totals>) -> Progress {
        let bar = multi.map(|m| {
            let style =
                ProgressStyle::with_template("{msg:50!} {bar:30} {bytes:>10}/{total_bytes:<10} {bytes_per_sec}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
            let b = m.add(ProgressBar::new(0).with_style(style));
            b.set_message(label.clone());
            b
        });
        Progress { bar, label, show, totals, known: Arc::default() }
    }

    fn start(&self, total: u64, detail: &str) {
        self.set_length(total);
        if self.bar.is_none() && self.show == Show::Lines {
            eprintln!("prefetch: {} {detail}", self.label);
        }
    }

    /// The size, once known.
    fn set_length(&self, total: u64) {
        if let Some(b) = &self.bar {
            b.set_length(total);
        }
        let before = self.known.swap(total, std::sync::atomic::Ordering::Relaxed);
        self.totals.add_bytes_known(total.saturating_sub(before));
    }

    fn inc(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
        self.totals.add_bytes_done(n);
    }

    /// `n` more objects this item will fetch (manifests, blobs, the OS image).
    fn objects(&self, n: usize) {
        self.totals.add_objects(n as u64);
    }

    fn object_done(&self) {
        self.totals.object_done();
    }

    fn finish(&self, line: &str) {
        match &self.bar {
            Some(b) => {
                if let Ok(style) = ProgressStyle::with_template("{msg}") {
                    b.set_style(style);
                }
                b.abandon_with_message(format!("{} {line}", self.label));
            }
            None if self.show == Show::Lines => eprintln!("prefetch: {} {line}", self.label),
            None => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Manifests

#[derive(Debug, Deserialize)]
struct IndexPlatform {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    variant: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Descriptor {
    digest: String,
    #[serde(default)]
    size: u64,
    platform: Option<IndexPlatform>,
}

#[derive(Debug, Deserialize)]
struct IndexDoc {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct ManifestDoc {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

/// A manifest as fetched.
#[derive(Clone)]
pub(crate) struct Manifest {
    pub(crate) digest: Digest,
    pub(crate) media_type: String,
    pub(crate) bytes: Bytes,
    /// Served from the store without a transfer (known with --data only).
    already: bool,
    /// From an upstream whose content goes only to authenticated clients (credentials, or
    /// `private`): `export` records it, and `import` keeps it private (issue 32).
    pub(crate) private: bool,
}

pub(crate) fn is_index(media_type: &str) -> bool {
    media_type.eq_ignore_ascii_case(media::OCI_INDEX) || media_type.eq_ignore_ascii_case(media::DOCKER_LIST)
}

fn parse_digest(what: &str, d: &str) -> Result<Digest, Failed> {
    d.parse::<Digest>().map_err(|e| Failed::definite(format!("{what}: {e}")))
}

/// A blob to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blob {
    pub(crate) digest: Digest,
    pub(crate) size: u64,
}

/// The index entries for the requested platforms, in the order asked (the first match of each).
fn select_platforms(img: &ImageRef, index: &IndexDoc, platforms: &[Platform]) -> Result<Vec<Digest>, Failed> {
    let mut out = Vec::new();
    for p in platforms {
        let found = index.manifests.iter().find(|d| d.platform.as_ref().is_some_and(|ip| p.matches(ip)));
        let Some(d) = found else {
            let have: Vec<String> = index
                .manifests
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .map(|ip| match &ip.variant {
                    Some(v) => format!("{}/{}/{v}", ip.os, ip.architecture),
                    None => format!("{}/{}", ip.os, ip.architecture),
                })
                .collect();
            return Err(Failed::definite(format!("{img}: no {p} manifest in the index (it has {})", have.join(", "))));
        };
        let digest = parse_digest(&img.to_string(), &d.digest)?;
        if !out.contains(&digest) {
            out.push(digest);
        }
    }
    Ok(out)
}

/// Config and layers of an image manifest.
pub(crate) fn manifest_blobs(img: &ImageRef, m: &Manifest) -> Result<Vec<Blob>, Failed> {
    if is_index(&m.media_type) {
        return Err(Failed::definite(format!("{img}: manifest {} is an index inside an index", m.digest)));
    }
    let doc: ManifestDoc = serde_json::from_slice(&m.bytes)
        .map_err(|e| Failed::definite(format!("{img}: manifest {} is not an image manifest: {e}", m.digest)))?;
    let mut out = Vec::new();
    for d in std::iter::once(&doc.config).chain(doc.layers.iter()) {
        out.push(Blob { digest: parse_digest(&img.to_string(), &d.digest)?, size: d.size });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Where the bytes go: a running server, or the fetch layer on a data directory

pub(crate) enum Mode {
    Server(ServerBackend),
    Local(LocalBackend),
}

/// Where the bytes go, and how often a transient failure is tried again.
pub(crate) struct Backend {
    pub(crate) mode: Mode,
    retries: u32,
}

/// What fetching one object did.
pub(crate) struct Got {
    bytes: u64,
    already: bool,
}

impl Backend {
    /// Run `op`, again after a capped exponential backoff while it fails transiently.
    async fn retrying<T, Fut: std::future::Future<Output = Result<T, Failed>>>(
        &self,
        mut op: impl FnMut() -> Fut,
    ) -> Result<T, Failed> {
        let mut attempt = 0u32;
        loop {
            match op().await {
                Err(f) if f.transient && attempt < self.retries => {
                    attempt += 1;
                    let wait = Duration::from_millis(250u64 << attempt.min(5)).min(Duration::from_secs(5));
                    tracing::info!(attempt, wait_ms = wait.as_millis() as u64, error = %f.message, "retrying");
                    tokio::time::sleep(wait).await;
                }
                r => return r,
            }
        }
    }

    pub(crate) async fn manifest(&self, img: &ImageRef, reference: &Reference) -> Result<Manifest, Failed> {
        self.retrying(|| async {
            match &self.mode {
                Mode::Server(s) => s.manifest(img, reference).await,
                Mode::Local(l) => l.manifest(img, reference).await,
            }
        })
        .await
    }

    pub(crate) async fn blob(&self, img: &ImageRef, blob: &Blob, progress: &Progress) -> Result<Got, Failed> {
        self.retrying(|| async {
            match &self.mode {
                Mode::Server(s) => s.blob(img, blob, progress).await,
                Mode::Local(l) => l.blob(img, blob, progress).await,
            }
        })
        .await
    }

    pub(crate) async fn os_image(&self, asset: &AssetPath, progress: &Progress) -> Result<Got, Failed> {
        self.retrying(|| async {
            match &self.mode {
                Mode::Server(s) => s.os_image(asset, progress).await,
                Mode::Local(l) => l.os_image(asset, progress).await,
            }
        })
        .await
    }
}

pub(crate) struct ServerBackend {
    pub(crate) client: TenderClient,
    pub(crate) base: Url,
}

impl ServerBackend {
    /// A blob's bytes from the server as a blocking reader on `runtime` (the writer that reads
    /// them hashes them on the way: the server's bytes are not trusted here).
    pub(crate) fn blob_reader(
        &self,
        runtime: &tokio::runtime::Runtime,
        img: &ImageRef,
        digest: &Digest,
        what: &str,
    ) -> std::result::Result<impl std::io::Read, Failed> {
        use futures::TryStreamExt as _;
        let path = format!("/v2/{}/blobs/{digest}?ns={}", img.repository, img.registry);
        let resp = runtime.block_on(self.get(what, &path, None))?;
        let reader = tokio_util::io::StreamReader::new(resp.bytes_stream().map_err(std::io::Error::other));
        Ok(tokio_util::io::SyncIoBridge::new_with_handle(reader, runtime.handle().clone()))
    }

    pub(crate) async fn get(&self, what: &str, path: &str, accept: Option<&str>) -> Result<reqwest::Response, Failed> {
        let url = http::join(&self.base, path);
        let mut headers = HeaderMap::new();
        if let Some(a) = accept.and_then(|a| HeaderValue::from_str(a).ok()) {
            headers.insert(ACCEPT, a);
        }
        let resp = self
            .client
            .request(Method::GET, url)
            .headers(headers)
            .send()
            .await
            .map_err(|e| Failed::transport(what, &e))?;
        if resp.status() != StatusCode::OK {
            let status = resp.status();
            let said = http::server_message(&resp.text().await.unwrap_or_default());
            return Err(Failed::answered(what, status, said.as_deref()));
        }
        Ok(resp)
    }

    async fn manifest(&self, img: &ImageRef, reference: &Reference) -> Result<Manifest, Failed> {
        let what = format!("{img}: manifest {reference}");
        let path = format!("/v2/{}/manifests/{reference}?ns={}", img.repository, img.registry);
        let mut resp = self.get(&what, &path, Some(&ALL_MANIFESTS.join(", "))).await?;
        let media_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_string())
            .unwrap_or_default();
        if !media::is_manifest(&media_type) {
            return Err(Failed::definite(format!("{what}: answered with {media_type:?}, not a manifest type")));
        }
        let announced = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<Digest>().ok());
        let private = resp.headers().get("x-tender-private").is_some_and(|v| v.as_bytes() == b"1");
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| Failed::transport(&what, &e))? {
            if body.len() + chunk.len() > MAX_MANIFEST_BYTES {
                return Err(Failed::definite(format!("{what}: larger than 8 MiB")));
            }
            body.extend_from_slice(&chunk);
        }
        // By digest, verified with that digest's algorithm; by tag, named like the server names it.
        let algorithm = match reference {
            Reference::Digest(want) => want.algorithm(),
            Reference::Tag(_) => announced.map_or(Algorithm::Sha256, |d| d.algorithm()),
        };
        let digest = algorithm.digest(&body);
        if let Reference::Digest(want) = reference {
            if *want != digest {
                return Err(Failed::definite(format!("{what}: the server sent {digest}")));
            }
        }
        Ok(Manifest { digest, media_type, bytes: Bytes::from(body), already: false, private })
    }

    /// Read a body to the end (the server verifies and keeps it), counting bytes.
    async fn drain(what: &str, mut resp: reqwest::Response, progress: &Progress) -> Result<u64, Failed> {
        let mut n = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| Failed::transport(what, &e))? {
            n += chunk.len() as u64;
            progress.inc(chunk.len() as u64);
        }
        Ok(n)
    }

    async fn blob(&self, img: &ImageRef, blob: &Blob, progress: &Progress) -> Result<Got, Failed> {
        let what = format!("{img}: blob {}", blob.digest);
        let path = format!("/v2/{}/blobs/{}?ns={}", img.repository, blob.digest, img.registry);
        let resp = self.get(&what, &path, None).await?;
        let n = Self::drain(&what, resp, progress).await?;
        if n != blob.size {
            return Err(Failed::definite(format!("{what}: {n} bytes where the manifest says {}", blob.size)));
        }
        Ok(Got { bytes: n, already: false })
    }

    async fn os_image(&self, asset: &AssetPath, progress: &Progress) -> Result<Got, Failed> {
        let what = asset.path();
        let resp = self.get(&what, &asset.path(), None).await?;
        let len = resp.content_length().unwrap_or(0);
        progress.start(len, &HumanBytes(len).to_string());
        let n = Self::drain(&what, resp, progress).await?;
        Ok(Got { bytes: n, already: false })
    }
}

pub(crate) struct LocalBackend {
    pub(crate) mirror: Arc<Mirror>,
    pub(crate) store: Arc<Store>,
    pin: bool,
    /// Longest wait for one fill (the fill's own deadline, plus a margin).
    wait_limit: Duration,
}

impl LocalBackend {
    pub(crate) fn route(&self, img: &ImageRef) -> Result<(Arc<Upstream>, RepoName), Failed> {
        self.mirror
            .route(Some(&img.registry), &img.repository)
            .map_err(|e| Failed::definite(format!("{img}: {e}; add it to the upstreams of the --config file")))
    }

    fn pin(&self, what: &str, digest: &Digest) -> Result<(), Failed> {
        if self.pin {
            self.store.pin(digest, "prefetch").map_err(|e| Failed::definite(format!("{what}: pinning: {e}")))?;
        }
        Ok(())
    }

    async fn manifest(&self, img: &ImageRef, reference: &Reference) -> Result<Manifest, Failed> {
        let what = format!("{img}: manifest {reference}");
        let (up, repo) = self.route(img)?;
        let accept = AcceptList::parse([ALL_MANIFESTS.join(", ").as_str()]);
        let hit =
            self.mirror.manifest(&up, &repo, reference, &accept).await.map_err(|e| Failed::from_fetch(&what, &e))?;
        self.pin(&what, &hit.digest)?;
        if let (true, Reference::Tag(tag)) = (self.pin, reference) {
            self.store
                .pin_tag(up.name(), repo.as_str(), tag.as_str(), &hit.digest)
                .map_err(|e| Failed::definite(format!("{what}: pinning the tag: {e}")))?;
        }
        let already = hit.cache != CacheResult::Miss;
        let private = up.settings().needs_identity();
        Ok(Manifest { digest: hit.digest, media_type: hit.media_type, bytes: hit.bytes, already, private })
    }

    /// Wait for a fill to commit, reporting its bytes as they arrive.
    async fn wait(
        &self,
        fill: &Arc<Fill>,
        progress: &Progress,
        sized_by_fill: bool,
        reported: &mut u64,
    ) -> Result<Digest, FetchError> {
        let give_up = Instant::now() + self.wait_limit;
        // Waited for by polling, without reading: not an abandoned fill.
        fill.keep();
        loop {
            let s = fill.state();
            if let (Some(t), true) = (s.total, sized_by_fill) {
                progress.set_length(t);
            }
            if s.written > *reported {
                progress.inc(s.written - *reported);
                *reported = s.written;
            }
            match s.phase {
                Phase::Committed(d) => return Ok(d),
                Phase::Failed(e) => return Err(e),
                Phase::PassedThrough(_) => {
                    return Err(FetchError::new(
                        FetchErrorKind::Local,
                        "store",
                        "verified but not stored: the data directory has no room for it (free space or cache.maxSize)",
                    ))
                }
                Phase::Connecting | Phase::Streaming | Phase::Verified(_) => {}
            }
            if Instant::now() >= give_up {
                return Err(FetchError::new(FetchErrorKind::Timeout, "prefetch", "the fill did not finish in time"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Claim, wait; a fill that failed as corrupt restarts once from zero inside the fetch
    /// layer, so claim once more to follow it.
    async fn fill(
        &self,
        what: &str,
        claim: impl Fn() -> Result<Claim, FetchError>,
        progress: &Progress,
        sized_by_fill: bool,
    ) -> Result<(Digest, bool), Failed> {
        let mut reported = 0u64;
        for attempt in 0..2 {
            match claim().map_err(|e| Failed::from_fetch(what, &e))? {
                Claim::Stored(d) => return Ok((d, attempt == 0)),
                Claim::Filling(fill) => match self.wait(&fill, progress, sized_by_fill, &mut reported).await {
                    Ok(d) => return Ok((d, false)),
                    Err(e) if e.kind == FetchErrorKind::Corrupt && attempt == 0 => {
                        reported = 0;
                        continue;
                    }
                    Err(e) => return Err(Failed::from_fetch(what, &e)),
                },
            }
        }
        Err(Failed::definite(format!("{what}: the upstream sent wrong bytes twice")))
    }

    async fn blob(&self, img: &ImageRef, blob: &Blob, progress: &Progress) -> Result<Got, Failed> {
        let what = format!("{img}: blob {}", blob.digest);
        let (up, repo) = self.route(img)?;
        let before = Instant::now();
        let (digest, already) =
            self.fill(&what, || self.mirror.blob(&up, &repo, &blob.digest), progress, false).await?;
        let size = self.store.object_len(&digest).unwrap_or(blob.size);
        if already {
            progress.inc(size);
        }
        tracing::debug!(digest = %digest, already, ms = before.elapsed().as_millis() as u64, "blob ready");
        self.pin(&what, &digest)?;
        Ok(Got { bytes: size, already })
    }

    async fn os_image(&self, asset: &AssetPath, progress: &Progress) -> Result<Got, Failed> {
        let what = asset.path();
        let c = asset.compression().container();
        let (path, key) = (asset.path(), asset.key());
        progress.start(0, "from the Image Factory");
        let (digest, already) = self.fill(&what, || self.mirror.asset(&path, &key, c), progress, true).await?;
        let size = self.store.object_len(&digest).unwrap_or(0);
        progress.set_length(size);
        if already {
            progress.inc(size);
        }
        self.pin(&what, &digest)?;
        Ok(Got { bytes: size, already })
    }
}

// ---------------------------------------------------------------------------------------------
// The walk

/// Warm one image: the manifest, the chosen platforms' manifests, their blobs.
async fn warm_image(
    backend: &Backend,
    img: &ImageRef,
    platforms: &[Platform],
    jobs: &Semaphore,
    progress: &Progress,
) -> Result<Done, Failed> {
    progress.objects(1);
    let top = backend.manifest(img, &img.reference).await?;
    progress.object_done();
    let mut done = Done { objects: 1, already: usize::from(top.already), ..Done::default() };
    let mut manifests = Vec::new();
    let top_kept = top.clone();
    if is_index(&top.media_type) {
        let index: IndexDoc = serde_json::from_slice(&top.bytes)
            .map_err(|e| Failed::definite(format!("{img}: the index is not valid JSON: {e}")))?;
        let chosen = select_platforms(img, &index, platforms)?;
        progress.objects(chosen.len());
        for d in chosen {
            let m = backend.manifest(img, &Reference::Digest(d)).await?;
            progress.object_done();
            done.objects += 1;
            done.already += usize::from(m.already);
            manifests.push(m);
        }
        done.platforms = platforms.iter().map(ToString::to_string).collect();
    } else {
        manifests.push(top);
        done.platforms = vec!["single-platform".to_string()];
    }
    let mut blobs: Vec<Blob> = Vec::new();
    for m in &manifests {
        for b in manifest_blobs(img, m)? {
            if !blobs.iter().any(|x| x.digest == b.digest) {
                blobs.push(b);
            }
        }
    }
    let total: u64 = blobs.iter().map(|b| b.size).sum();
    progress.start(total, &format!("{} blobs, {}", blobs.len(), HumanBytes(total)));
    progress.objects(blobs.len());
    let results: Vec<Result<Got, Failed>> = stream::iter(blobs.iter())
        .map(|b| async move {
            let _permit = jobs.acquire().await.map_err(|_| Failed::definite("the job limiter closed"))?;
            let got = backend.blob(img, b, progress).await;
            if got.is_ok() {
                progress.object_done();
            }
            got
        })
        .buffer_unordered(blobs.len().max(1))
        .collect()
        .await;
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(g) => {
                done.objects += 1;
                done.bytes += g.bytes;
                done.already += usize::from(g.already);
            }
            Err(f) => failures.push(f),
        }
    }
    if let Some(first) = failures.first() {
        let transient = failures.iter().all(|f| f.transient);
        let more =
            if failures.len() > 1 { format!(" (and {} more blob(s))", failures.len() - 1) } else { String::new() };
        return Err(Failed { transient, message: format!("{}{more}", first.message) });
    }
    let children = if is_index(&top_kept.media_type) { manifests } else { Vec::new() };
    done.graph = Some(Graph { top: top_kept, children, blobs });
    Ok(done)
}

async fn warm(
    backend: &Backend,
    item: &Item,
    platforms: &[Platform],
    jobs: &Semaphore,
    progress: &Progress,
) -> Result<Done, Failed> {
    match item {
        Item::Image(img) => warm_image(backend, img, platforms, jobs, progress).await,
        Item::OsImage(asset) => {
            let _permit = jobs.acquire().await.map_err(|_| Failed::definite("the job limiter closed"))?;
            progress.objects(1);
            let g = backend.os_image(asset, progress).await?;
            progress.object_done();
            Ok(Done { objects: 1, bytes: g.bytes, already: usize::from(g.already), ..Done::default() })
        }
    }
}

fn local_backend(args: &PrefetchArgs) -> Result<Backend> {
    let settings = crate::local::settings(args.config.as_deref(), args.data.clone())?;
    crate::datadir::check(&settings.data).map_err(Failure::problem)?;
    crate::datadir::own_files(&settings.data)?;
    let store = Store::open(&settings.data, OpenMode::Exclusive).map_err(|e| Failure::problem(e.to_string()))?;
    for p in crate::datadir::close(&settings.data, &crate::datadir::golden_dirs(&settings.catalog)) {
        eprintln!("tender: warning: {p}");
    }
    let store = Arc::new(store);
    let mirror = crate::local::mirror(&settings, store.clone())?;
    let local = LocalBackend {
        mirror,
        store,
        pin: args.pin,
        wait_limit: settings.fetch.fill_deadline + Duration::from_secs(60),
    };
    Ok(Backend { mode: Mode::Local(local), retries: args.retries })
}

fn server_backend(args: &PrefetchArgs, url: &str) -> Result<Backend> {
    let base = http::parse_base_url(url)?;
    let headers: &[(&'static str, &'static str)] =
        if args.pin { &[("x-tender-prefetch", "1"), ("x-tender-pin", "1")] } else { &[("x-tender-prefetch", "1")] };
    let client = args.client.client(&ClientOptions {
        user_agent: concat!("tender-prefetch/", env!("CARGO_PKG_VERSION")),
        headers,
        connect_timeout: Duration::from_secs(10).min(args.timeout),
        read_timeout: Some(args.timeout),
        admin: false,
    })?;
    Ok(Backend { mode: Mode::Server(ServerBackend { client, base }), retries: args.retries })
}

/// A prefetch (or export) ready to run: what to fetch, and where.
pub(crate) struct Run {
    pub(crate) items: Vec<Item>,
    pub(crate) platforms: Vec<Platform>,
    pub(crate) backend: Backend,
    pub(crate) runtime: tokio::runtime::Runtime,
}

/// Check the arguments and build the backend; nothing is fetched yet.
pub(crate) fn start(args: &PrefetchArgs) -> Result<Run> {
    let mut platforms = Vec::new();
    for p in &args.platforms {
        platforms.push(p.parse::<Platform>().map_err(Failure::usage)?);
    }
    if args.jobs == 0 {
        return Err(Failure::usage("--jobs must be at least 1"));
    }
    if args.data.is_some() && args.client.is_set() {
        return Err(Failure::usage(
            "the client options (--ca, --username, --token-file, …) go with --server, not --data",
        ));
    }
    let items = collect_items(args, &platforms)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tender-prefetch")
        .build()
        .context("starting the async runtime")?;
    let backend = match &http::server_or_env(&args.server, args.data.is_some()) {
        Some(url) => server_backend(args, url)?,
        None if args.data.is_none() => {
            return Err(Failure::usage("give --server URL (or TENDER_SERVER) or --data DIR"));
        }
        None => local_backend(args)?,
    };
    Ok(Run { items, platforms, backend, runtime })
}

/// Warm every item (progress on stderr, labelled `verb`), print the summary.
pub(crate) fn warm_all(run: &Run, args: &PrefetchArgs, verb: &'static str) -> Vec<(Item, Result<Done, Failed>)> {
    let show = Show::choose(args.quiet);
    let multi = show.multi();
    let totals = Totals::new(verb, multi.as_ref());
    if show == Show::Lines {
        totals.spawn_ticker(args.progress_interval);
    }
    let jobs = Semaphore::new(args.jobs);
    let started = Instant::now();
    let outcomes: Vec<(Item, Result<Done, Failed>)> = run.runtime.block_on(async {
        let work = run.items.iter().map(|item| {
            let progress = Progress::new(multi.as_ref(), item.to_string(), show, totals.clone());
            let (backend, platforms, jobs) = (&run.backend, &run.platforms, &jobs);
            async move {
                let r = warm(backend, item, platforms, jobs, &progress).await;
                match &r {
                    Ok(d) => progress.finish(&format!("ok: {} objects, {}", d.objects, HumanBytes(d.bytes))),
                    Err(f) => progress.finish(if f.transient { "failed (transient)" } else { "FAILED" }),
                }
                (item.clone(), r)
            }
        });
        futures::future::join_all(work).await
    });
    totals.finish(show);
    print_summary(&outcomes, started.elapsed(), matches!(run.backend.mode, Mode::Local(_)));
    outcomes
}

/// The error for the failed items, if any: transient (exit 3) when all failures were.
pub(crate) fn verdict(outcomes: &[(Item, Result<Done, Failed>)], what: &str) -> Result<()> {
    let failed: Vec<&Failed> = outcomes.iter().filter_map(|(_, r)| r.as_ref().err()).collect();
    if failed.is_empty() {
        return Ok(());
    }
    let message = format!("{} of {} item(s) not {what}", failed.len(), outcomes.len());
    if failed.iter().all(|f| f.transient) {
        Err(Failure::transient(format!("{message}; all failures were transient, try again")))
    } else {
        Err(Failure::problem(message))
    }
}

pub fn run(args: PrefetchArgs) -> Result<ExitCode> {
    let run = start(&args)?;
    let outcomes = warm_all(&run, &args, "prefetch");
    verdict(&outcomes, "warmed")?;
    Ok(ExitCode::SUCCESS)
}

fn print_summary(outcomes: &[(Item, Result<Done, Failed>)], took: Duration, local: bool) {
    let mut objects = 0;
    let mut bytes = 0;
    for (item, r) in outcomes {
        match r {
            Ok(d) => {
                objects += d.objects;
                bytes += d.bytes;
                let platforms =
                    if d.platforms.is_empty() { String::new() } else { format!(" [{}]", d.platforms.join(", ")) };
                let already = if local { format!(", {} already stored", d.already) } else { String::new() };
                println!("{:<10}{item}{platforms}: {} objects, {}{already}", "fetched", d.objects, HumanBytes(d.bytes));
            }
            Err(f) => {
                let kind = if f.transient { "transient" } else { "failed" };
                println!("{kind:<10}{}", f.message);
            }
        }
    }
    let failed = outcomes.iter().filter(|(_, r)| r.is_err()).count();
    println!(
        "prefetch: {} of {} item(s) in the cache ({objects} objects, {}) in {:.1}s; {failed} failed",
        outcomes.len() - failed,
        outcomes.len(),
        HumanBytes(bytes),
        took.as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: PrefetchArgs,
    }

    fn items(argv: &[&str]) -> Vec<String> {
        let cli = Cli::try_parse_from(std::iter::once("prefetch").chain(argv.iter().copied())).unwrap();
        let platforms: Vec<Platform> = cli.args.platforms.iter().map(|p| p.parse().unwrap()).collect();
        collect_items(&cli.args, &platforms).unwrap().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn should_embed_the_kubernetes_version_map() {
        let m = kubernetes_versions().unwrap();
        assert_eq!(m.get("v1.35").map(String::as_str), Some("v1.35.6"));
        assert_eq!(kubernetes_patch("v1.34").unwrap(), "v1.34.9");
        assert_eq!(kubernetes_patch("1.33").unwrap(), "v1.33.13");
        assert_eq!(kubernetes_patch("v1.35.2").unwrap(), "v1.35.2", "a full patch is taken as written");
        let e = kubernetes_patch("v1.20").unwrap_err().to_string();
        assert!(e.contains("not supported") && e.contains("v1.35"), "{e}");
    }

    #[test]
    fn should_derive_the_cozystack_release_presets() {
        let got = items(&["--server", "http://x", "--talos", "v1.13.6", "--kubernetes", "v1.35"]);
        assert_eq!(
            got,
            [
                format!("factory.talos.dev/installer/{DEFAULT_SCHEMATIC}:v1.13.6"),
                format!("/image/{DEFAULT_SCHEMATIC}/v1.13.6/openstack-amd64.raw.xz"),
                "ghcr.io/siderolabs/kubelet:v1.35.6".to_string(),
            ]
        );
    }

    #[test]
    fn should_change_the_os_image_and_installer_with_flags() {
        let got = items(&[
            "--server",
            "http://x",
            "--talos",
            "v1.12.0",
            "--schematic",
            "abc123",
            "--installer-repository",
            "registry.example/talos/installer/",
            "--platform",
            "linux/arm64",
            "--os-platform",
            "nocloud",
            "--format",
            "qcow2",
        ]);
        assert_eq!(
            got,
            ["registry.example/talos/installer/abc123:v1.12.0", "/image/abc123/v1.12.0/nocloud-arm64.qcow2"]
        );
    }

    #[test]
    fn should_read_image_files_with_comments_and_drop_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("images.txt");
        std::fs::write(&f, "# kubelet\nghcr.io/siderolabs/kubelet:v1.35.6  # pinned\n\nalpine\n  alpine:latest\n")
            .unwrap();
        let got = items(&["--server", "http://x", "--file", f.to_str().unwrap(), "busybox"]);
        assert_eq!(
            got,
            [
                "ghcr.io/siderolabs/kubelet:v1.35.6",
                "docker.io/library/alpine:latest",
                "docker.io/library/busybox:latest"
            ]
        );
    }

    #[test]
    fn should_refuse_bad_presets_and_empty_requests() {
        let parse = |argv: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("prefetch").chain(argv.iter().copied()))
                .map_err(|e| e.to_string())?;
            let platforms: Vec<Platform> = cli.args.platforms.iter().map(|p| p.parse().unwrap()).collect();
            collect_items(&cli.args, &platforms).map_err(|e| e.to_string())
        };
        assert!(parse(&["--server", "http://x"]).is_err(), "nothing to do");
        assert!(parse(&["--server", "http://x", "--talos", "1.13"]).is_err());
        assert!(parse(&["--server", "http://x", "--talos", "v1.13.6", "--schematic", "NOT/ok"]).is_err());
        assert!(parse(&["--server", "http://x", "--schematic", "abc"]).is_err(), "--schematic needs --talos");
        assert!(parse(&["--server", "http://x", "--data", "/d", "alpine"]).is_err());
    }

    #[test]
    fn should_pick_only_the_requested_platforms_first_match_wins() {
        let index: IndexDoc = serde_json::from_value(serde_json::json!({"manifests": [
            {"digest": format!("sha256:{}", "1".repeat(64)), "size": 1, "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": format!("sha256:{}", "2".repeat(64)), "size": 1, "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
            {"digest": format!("sha256:{}", "3".repeat(64)), "size": 1, "platform": {"os": "unknown", "architecture": "unknown"}},
            {"digest": format!("sha256:{}", "4".repeat(64)), "size": 1, "platform": {"os": "linux", "architecture": "amd64"}},
        ]}))
        .unwrap();
        let img = ImageRef::parse("ghcr.io/a/b:c").unwrap();
        let pick = |ps: &[&str]| {
            let ps: Vec<Platform> = ps.iter().map(|p| p.parse().unwrap()).collect();
            select_platforms(&img, &index, &ps).map(|v| v.iter().map(|d| d.hex()[..1].to_string()).collect::<Vec<_>>())
        };
        assert_eq!(pick(&["linux/amd64"]).unwrap(), ["1"]);
        assert_eq!(pick(&["linux/arm64"]).unwrap(), ["2"]);
        assert_eq!(pick(&["linux/arm64/v8", "linux/amd64"]).unwrap(), ["2", "1"]);
        let e = pick(&["linux/s390x"]).unwrap_err();
        assert!(!e.transient && e.message.contains("linux/amd64, linux/arm64/v8"), "{}", e.message);
    }

    #[test]
    fn should_parse_platforms() {
        assert_eq!("linux/arm64/v8".parse::<Platform>().unwrap().to_string(), "linux/arm64/v8");
        for bad in ["linux", "linux/", "Linux/amd64", "a/b/c/d"] {
            assert!(bad.parse::<Platform>().is_err(), "{bad}");
        }
    }
}
