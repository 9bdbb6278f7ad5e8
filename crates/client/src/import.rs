//! `tender import`, `tender bundle ls` and `tender tag rm`: the receiving side of an air gap.
//!
//! `import` verifies a bundle with tender-bundle's rules (every blob hashed, every reference
//! resolved, names routed) and only then registers its tags, trust records and pins: into the
//! data directory of a stopped tender (`--data`), or through a running one
//! (`--server`, `POST /api/v1/admin/import`, a directory streamed as a tar; a compressed tar
//! or a part set decompressed and joined on the way, every part verified).

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use indicatif::HumanBytes;
use tender_bundle::packing::{OnBytes, Packed};
use tender_bundle::{ImportError, ImportOptions, ImportReport};
use tender_store::{OpenMode, Store};

use crate::exit::{Context as _, Failure, Result};
use crate::http::{admin_failure, join, parse_base_url, server_or_env, ClientArgs, ClientOptions};
use crate::progress::{Show, Totals};

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// The bundle: an OCI image layout directory, or a tar of one (tender export, skopeo
    /// copy oci:, ctr images export), zstd-compressed or not, or a part set (PATH.parts.json,
    /// its first part PATH.000, or PATH)
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
    #[command(flatten)]
    pub target: Target,
    /// Registry of names without one: REGISTRY for `repo:tag`, REGISTRY/REPOSITORY for a bare tag
    #[arg(long, value_name = "NAME")]
    pub registry: Option<String>,
    /// Leave what was imported evictable (default: pinned, as an air-gapped site cannot fetch it again)
    #[arg(long)]
    pub no_pin: bool,
    /// The index digest `tender export` printed on the connected side: refuse any other bundle
    #[arg(long, value_name = "DIGEST")]
    pub expect_index: Option<tender_oci::Digest>,
    /// Register images that were private where they were exported (served to authenticated
    /// clients only) under upstreams that are not private here, served to everyone
    #[arg(long)]
    pub allow_public: bool,
    /// Refuse the bundle unless PATH.sig is a signature of PATH.digest by this public key
    /// (PEM, as cosign.pub) and index.json is that digest: checked before anything is read
    #[arg(long, value_name = "FILE")]
    pub verify_key: Option<PathBuf>,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

/// Which tender a command changes: a stopped one's data directory, or a running one.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// The data directory of a stopped tender
    #[arg(long, value_name = "DIR", conflicts_with = "server")]
    pub data: Option<PathBuf>,
    /// Config file naming the upstreams names route to (with --data) [default: the embedded default]
    #[arg(long, value_name = "FILE", requires = "data")]
    pub config: Option<PathBuf>,
    /// A running tender, through its admin endpoints; pass its admin token with --token-file
    /// [env: TENDER_SERVER, TENDER_ADMIN_TOKEN_FILE]
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, clap::Args)]
pub struct TagArgs {
    #[command(subcommand)]
    pub command: TagCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum TagCommand {
    /// Forget what tags point to: an imported tag stops being authoritative, the next pull asks
    /// the upstream
    Rm(TagRmArgs),
}

#[derive(Debug, clap::Args)]
pub struct TagRmArgs {
    /// Tags to forget, e.g. ghcr.io/siderolabs/kubelet:v1.35.0
    #[arg(value_name = "IMAGE:TAG", required = true)]
    pub names: Vec<String>,
    #[command(flatten)]
    pub target: Target,
}

/// The store and routing of a stopped tender's data directory.
fn open_local(data: &Path, cfg: Option<&Path>) -> Result<Arc<tender_fetch::Mirror>> {
    let settings = crate::local::settings(cfg, Some(data.to_path_buf()))?;
    crate::datadir::check(&settings.data).map_err(Failure::problem)?;
    crate::datadir::own_files(&settings.data)?;
    let store = Store::open(&settings.data, OpenMode::Exclusive).map_err(|e| Failure::problem(e.to_string()))?;
    crate::datadir::close_logged(&settings.data, &settings.catalog);
    crate::local::mirror(&settings, Arc::new(store))
}

/// Find the bundle at `path` (a part set's parts all there, of their sizes).
fn open_bundle(path: &Path) -> Result<Packed> {
    tender_bundle::packing::open(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Failure::usage(format!("{}: no such bundle", path.display())),
        io::ErrorKind::InvalidData => Failure::problem(format!("bundle refused: {e}")),
        _ => Failure::problem(format!("{}: {e}", path.display())),
    })
}

/// How often plain progress lines are printed while a bundle is read.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Progress of reading a tar bundle (not a directory) from its media: a bar with bytes, rate
/// and ETA on a terminal, a plain line every [`PROGRESS_EVERY`] otherwise.
struct Reading {
    totals: Arc<Totals>,
    show: Show,
    _multi: Option<indicatif::MultiProgress>,
}

impl Reading {
    fn start(packed: &Packed) -> Option<Reading> {
        let show = Show::choose(false);
        if packed.is_dir() || show == Show::Quiet {
            return None;
        }
        let multi = show.multi();
        let totals = Totals::new("import: reading", multi.as_ref());
        totals.set_prefix("reading");
        totals.add_bytes_known(packed.input_len());
        if show == Show::Lines {
            eprintln!(
                "import: reading {} ({}, {})",
                packed.base().display(),
                packed.describe(),
                HumanBytes(packed.input_len())
            );
            totals.spawn_ticker(PROGRESS_EVERY);
        }
        Some(Reading { totals, show, _multi: multi })
    }

    fn on_bytes(&self) -> OnBytes {
        let t = self.totals.clone();
        Arc::new(move |n| t.add_bytes_done(n))
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.totals.finish(self.show);
    }
}

pub fn run_import(args: ImportArgs) -> Result<ExitCode> {
    let packed = open_bundle(&args.path)?;
    // A signed bundle: its signature first, before any of it is read.
    let mut expect_index = args.expect_index;
    if let Some(key) = &args.verify_key {
        let signed = crate::bundlesig::verify(packed.base(), key)?;
        if expect_index.is_some_and(|want| want != signed) {
            return Err(Failure::problem(format!(
                "bundle refused: it is signed for index {signed}, not the expected {}",
                expect_index.map(|d| d.to_string()).unwrap_or_default()
            )));
        }
        expect_index = Some(signed);
    }
    let options = ImportOptions {
        registry: args.registry.clone(),
        max_bytes: None,
        pin: !args.no_pin,
        expect_index,
        allow_public: args.allow_public,
        identity: crate::datadir::local_identity(),
        source: args.path.file_name().map(|n| n.to_string_lossy().into_owned()),
    };
    let t = &args.target;
    let report = match server_or_env(&t.server, t.data.is_some()) {
        Some(url) => import_through(&url, &args, &options)?,
        None => {
            let Some(data) = &t.data else {
                return Err(Failure::usage("give --data DIR (a stopped tender) or --server URL (a running one)"));
            };
            if t.client.is_set() {
                return Err(Failure::usage("the client options (--ca, --token-file, …) go with --server, not --data"));
            }
            let mirror = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(async { open_local(data, t.config.as_deref()) })?;
            let store = mirror.flights().store().clone();
            let reading = Reading::start(&packed);
            let on_bytes = reading.as_ref().map(Reading::on_bytes);
            let routes = tender_server::import::Routes(&mirror);
            let imported = tender_bundle::import_packed(&packed, &store, &routes, &options, on_bytes);
            drop(reading);
            match imported {
                Ok(r) => r,
                Err(e @ (ImportError::Refused(_) | ImportError::TooLarge(_))) => {
                    return Err(Failure::problem(e.to_string()))
                }
                Err(e) => return Err(e).context(format!("importing {}", args.path.display())),
            }
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&args.path, &report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(path: &Path, r: &ImportReport) {
    let mut out = io::stdout().lock();
    for i in &r.images {
        let _ = writeln!(out, "{:<10}{} ({}, {} objects, via {})", "imported", i.name, i.digest, i.objects, i.upstream);
    }
    for a in &r.assets {
        let _ = writeln!(out, "{:<10}{} ({}, {})", "imported", a.path, a.digest, HumanBytes(a.size));
    }
    for u in &r.unnamed {
        let _ = writeln!(out, "{:<10}{u}: no name in the bundle; stored, not visible", "unnamed");
    }
    if !r.ignored.is_empty() {
        let _ = writeln!(out, "{:<10}{} (not part of an OCI layout)", "ignored", r.ignored.join(", "));
    }
    let delta = r.delta_of.as_ref().map(|d| format!(", a delta on {d}")).unwrap_or_default();
    let _ = writeln!(
        out,
        "import: {} verified: {} blob(s), {} ({} new); {} image name(s), {} OS image(s){delta}",
        path.display(),
        r.blobs,
        HumanBytes(r.bytes),
        r.new_blobs,
        r.images.len(),
        r.assets.len()
    );
    let _ = writeln!(out, "index: {}", r.index_digest);
}

/// Stream a bundle to a running tender: a tar file as it is, a directory packed on the way.
/// The server is asked first (`GET` on the same path, with the size) whether it would take it,
/// so a missing token, an address without admin endpoints or a bundle over
/// `admin.maxImportSize` is told before a byte of it is sent.
fn import_through(url: &str, args: &ImportArgs, options: &ImportOptions) -> Result<ImportReport> {
    let base = parse_base_url(url)?;
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    if let Some(r) = &options.registry {
        q.append_pair("registry", r);
    }
    if !options.pin {
        q.append_pair("pin", "false");
    }
    if options.allow_public {
        q.append_pair("allowPublic", "true");
    }
    if let Some(d) = &options.expect_index {
        q.append_pair("expectIndex", &d.to_string());
    }
    if let Some(source) = &options.source {
        q.append_pair("source", source);
    }
    let q = q.finish();
    let target = join(&base, &format!("/api/v1/admin/import{}{q}", if q.is_empty() { "" } else { "?" }));
    let size = bundle_size(&args.path).with_context(|| format!("reading {}", args.path.display()))?;
    let mut ask = url::form_urlencoded::Serializer::new(String::new());
    ask.append_pair("size", &size.to_string());
    if let Some(d) = &options.expect_index {
        ask.append_pair("expectIndex", &d.to_string());
    }
    let preflight = join(&base, &format!("/api/v1/admin/import?{}", ask.finish()));
    let client = args.target.client.client(&ClientOptions {
        user_agent: concat!("tender-import/", env!("CARGO_PKG_VERSION")),
        headers: &[],
        connect_timeout: Duration::from_secs(10),
        read_timeout: Some(Duration::from_secs(3600)),
        admin: true,
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let path = args.path.clone();
    rt.block_on(async move {
        ask_first(&client, &preflight).await?;
        let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(8);
        let packer = tokio::task::spawn_blocking(move || pack(&path, tx));
        let body = reqwest::Body::wrap_stream(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }));
        let resp = client
            .request(reqwest::Method::POST, target.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/x-tar")
            .body(body)
            .send()
            .await;
        let packed = packer.await.context("packing the bundle")?;
        // A bundle that could not be read (a wrong part) ends the body early: that is the cause
        // then, whatever the request's fate. (The server stopping to read is not: its answer
        // says why.)
        if let Err(read) = &packed {
            if read.kind() != io::ErrorKind::BrokenPipe {
                return Err(Failure::problem(format!("reading {}: {read}", args.path.display())));
            }
        }
        let resp = match resp {
            Ok(resp) => resp,
            Err(e) => return Err(Failure::transient(format!("{target}: {}", crate::exit::chain(&e)))),
        };
        let status = resp.status();
        let text = resp.text().await.map_err(|e| Failure::transient(format!("{target}: {e}")))?;
        if status.is_success() {
            packed.with_context(|| format!("reading {}", args.path.display()))?;
            return serde_json::from_str(&text)
                .map_err(|e| Failure::problem(format!("{target}: answer is not a report: {e}")));
        }
        // The server's answer says more than the broken pipe it may have left the packer with.
        Err(admin_failure(&target, status, &text))
    })
}

/// Ask the admin endpoint whether it would take the bundle. A tender from before the question
/// existed answers 405: then the answer to the `POST` is the only one.
async fn ask_first(client: &crate::http::TenderClient, preflight: &url::Url) -> Result<()> {
    let resp = client
        .request(reqwest::Method::GET, preflight.clone())
        .send()
        .await
        .map_err(|e| Failure::transient(format!("{preflight}: {}", crate::exit::chain(&e))))?;
    let status = resp.status();
    if status.is_success() || status == reqwest::StatusCode::METHOD_NOT_ALLOWED {
        return Ok(());
    }
    let text = resp.text().await.unwrap_or_default();
    Err(admin_failure(preflight, status, &text))
}

/// The bytes the server will receive, at least: a tar file's size, a compressed tar's or a part
/// set's size on the media (the tar it becomes is larger: the server's cap still holds while it
/// reads), or for a directory the sum of its regular files (the tar adds headers and padding,
/// so the server's cap is compared with no more than what is sent).
fn bundle_size(path: &Path) -> io::Result<u64> {
    let packed = tender_bundle::packing::open(path)?;
    if !packed.is_dir() {
        return Ok(packed.input_len());
    }
    let mut total = 0u64;
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                total = total.saturating_add(entry.metadata()?.len());
            }
        }
    }
    Ok(total)
}

/// Write the bundle as a tar into `tx` (a tar file is sent as it is).
fn pack(path: &Path, tx: tokio::sync::mpsc::Sender<io::Result<Bytes>>) -> io::Result<()> {
    struct Chunks(tokio::sync::mpsc::Sender<io::Result<Bytes>>);
    impl io::Write for Chunks {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .blocking_send(Ok(Bytes::copy_from_slice(buf)))
                .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the server stopped reading"))?;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let error_tx = tx.clone();
    let out = io::BufWriter::with_capacity(1 << 20, Chunks(tx));
    if path.is_dir() {
        let mut builder = tar::Builder::new(out);
        builder.follow_symlinks(false);
        builder.append_dir_all(".", path)?;
        builder.into_inner()?.flush()
    } else {
        // a tar as it is; a compressed tar or a part set as the plain tar, every part verified
        // before the tar's last bytes go out
        let mut out = out;
        let copied = tender_bundle::packing::open(path).and_then(|packed| {
            let reading = Reading::start(&packed);
            let mut reader = packed.tar_reader(reading.as_ref().map(Reading::on_bytes))?;
            io::copy(&mut reader, &mut out)
        });
        if let Err(e) = copied {
            // The body must end in an error, not cleanly: a tar cut at a member's end reads as
            // complete to the server. (What is still buffered is dropped, not sent after it.)
            drop(out.into_parts());
            let _ = error_tx.blocking_send(Err(io::Error::new(e.kind(), e.to_string())));
            return Err(e);
        }
        out.flush()
    }
}

/// `tender bundle ls`.
pub fn run_bundle_ls(path: PathBuf, json: bool) -> Result<ExitCode> {
    let l = tender_bundle::list::list(&path)
        .map_err(|e| Failure::problem(format!("{}: not a readable bundle: {e}", path.display())))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&l)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{:<64} {:<9} {:<24} {:>10}  DIGEST", "NAME", "KIND", "PLATFORMS", "SIZE");
    for e in &l.entries {
        let platforms = if e.platforms.is_empty() { "-".to_string() } else { e.platforms.join(",") };
        let _ = writeln!(
            out,
            "{:<64} {:<9} {:<24} {:>10}  {}",
            e.name,
            e.kind,
            platforms,
            HumanBytes(e.bytes).to_string(),
            e.digest
        );
    }
    if let Some(spec) = &l.spec {
        let _ = writeln!(out, "spec (as exported with --spec):");
        for line in spec.lines() {
            // The bundle's text: no control character reaches the terminal.
            let line: String = line.chars().map(|c| if c.is_control() && c != '\t' { '\u{fffd}' } else { c }).collect();
            let _ = writeln!(out, "  {line}");
        }
    }
    let delta = l.delta_of.as_ref().map(|d| format!("; a delta on {d}")).unwrap_or_default();
    let _ = writeln!(
        out,
        "{} entr{}, {} blob(s), {}; index {}{delta}",
        l.entries.len(),
        if l.entries.len() == 1 { "y" } else { "ies" },
        l.blobs,
        HumanBytes(l.bytes),
        l.index_digest
    );
    Ok(ExitCode::SUCCESS)
}

pub fn run_tag(args: TagArgs) -> Result<ExitCode> {
    let TagCommand::Rm(args) = args.command;
    let t = &args.target;
    match server_or_env(&t.server, t.data.is_some()) {
        Some(url) => {
            let base = parse_base_url(&url)?;
            let client = t.client.client(&ClientOptions {
                user_agent: concat!("tender/", env!("CARGO_PKG_VERSION")),
                headers: &[],
                connect_timeout: Duration::from_secs(10),
                read_timeout: Some(Duration::from_secs(60)),
                admin: true,
            })?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let mut missing = 0;
            for name in &args.names {
                let q = url::form_urlencoded::Serializer::new(String::new()).append_pair("name", name).finish();
                let target = join(&base, &format!("/api/v1/admin/tags?{q}"));
                let resp = rt
                    .block_on(async { client.request(reqwest::Method::DELETE, target.clone()).send().await })
                    .map_err(|e| Failure::transient(format!("{target}: {e}")))?;
                match resp.status().as_u16() {
                    200 => println!("removed   {name}"),
                    404 => {
                        println!("no tag    {name}");
                        missing += 1;
                    }
                    _ => {
                        let status = resp.status();
                        let text = rt.block_on(resp.text()).unwrap_or_default();
                        return Err(admin_failure(&target, status, &text)).context(name);
                    }
                }
            }
            tag_verdict(missing)
        }
        None => {
            let Some(data) = &t.data else {
                return Err(Failure::usage("give --data DIR (a stopped tender) or --server URL (a running one)"));
            };
            let mirror = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(async { open_local(data, t.config.as_deref()) })?;
            let mut missing = 0;
            for name in &args.names {
                match tender_server::import::remove(&mirror, name) {
                    Ok(Some(released)) => println!("removed   {name}{}", released_note(&released)),
                    Ok(None) => {
                        println!("no tag    {name}");
                        missing += 1;
                    }
                    Err(e) => return Err(Failure::usage(e)),
                }
            }
            tag_verdict(missing)
        }
    }
}

/// What removing a tag released of the bundles that registered it.
fn released_note(r: &tender_fetch::service::Released) -> String {
    if r.entries.is_empty() {
        return String::new();
    }
    format!(
        " (released from {} bundle entr{}: {} object(s), {} retired for the next gc)",
        r.entries.len(),
        if r.entries.len() == 1 { "y" } else { "ies" },
        r.retired.len(),
        HumanBytes(r.retired_bytes)
    )
}

fn tag_verdict(missing: usize) -> Result<ExitCode> {
    if missing > 0 {
        return Err(Failure::problem(format!("{missing} tag(s) had no record")));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use tender_bundle::packing::{Compress, Packing, MIN_PART};

    fn bundle(path: &Path, packing: Packing) {
        let mut w = tender_bundle::BundleWriter::create_packed(path, Default::default(), packing).unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let noise: Vec<u8> = (0..(3 << 20))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        w.add_bytes(&tender_oci::Algorithm::Sha256.digest(&noise), &noise).unwrap();
        w.finish(&tender_bundle::Document::index(vec![], Default::default())).unwrap();
    }

    /// What `pack` sends: the body's chunks, and whether it ended in an error.
    fn packed(path: &Path) -> (Vec<u8>, Option<String>) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<io::Result<Bytes>>(8);
        let path = path.to_path_buf();
        let packer = std::thread::spawn(move || pack(&path, tx));
        let (mut body, mut error) = (Vec::new(), None);
        while let Some(item) = rx.blocking_recv() {
            match item {
                Ok(b) => body.extend_from_slice(&b),
                Err(e) => error = Some(e.to_string()),
            }
        }
        let _ = packer.join().unwrap();
        (body, error)
    }

    /// `import --server` streams a split, compressed bundle as the plain tar; a wrong last part
    /// ends the body in an error before the tar's end went out.
    #[test]
    fn should_stream_a_part_set_as_the_plain_tar_and_fail_the_body_on_a_wrong_part() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain.tar");
        bundle(&plain, Packing::default());
        let split = dir.path().join("r.tar.zst");
        bundle(&split, Packing { compress: Compress::Zstd, split: Some(MIN_PART) });
        let (body, error) = packed(&split);
        assert_eq!(error, None);
        let want = std::fs::read(&plain).unwrap();
        assert!(body == want, "{} bytes sent, the plain tar is {}", body.len(), want.len());

        let set = tender_bundle::packing::open(&split).unwrap();
        let last = dir.path().join(format!("r.tar.zst.{:03}", set.input_len() / MIN_PART));
        let mut bytes = std::fs::read(&last).unwrap();
        let end = bytes.len() - 1;
        bytes[end] ^= 1;
        std::fs::write(&last, bytes).unwrap();
        let (body, error) = packed(&split);
        let error = error.expect("the body ends in an error");
        assert!(error.contains(&last.file_name().unwrap().to_string_lossy().to_string()), "{error}");
        assert!(body.len() + 1024 <= want.len(), "{} of {} bytes sent", body.len(), want.len());
    }
}
