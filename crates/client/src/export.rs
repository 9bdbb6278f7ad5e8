//! `tender export`: carry a release across an air gap as one OCI image layout.
//!
//! The selection is `tender prefetch`'s: the items are first warmed exactly as prefetch warms
//! them (fetched once, verified, through a running tender or in-process on a data directory),
//! then written to the bundle from the store (`--data`: copied from the verified objects) or
//! through the server (`--server`: hashed again on the way). Each image is one `index.json`
//! entry named by `org.opencontainers.image.ref.name` (and containerd's name annotation) with
//! only the requested platforms' manifests and blobs; its referrers found by the referrers API
//! or the tag schemes (`sha256-<hex>`, cosign's `.sig` / `.att`) come along. An OS image is an
//! OCI artifact (one layer, the asset) carrying its Image Factory path and its trust digest.
//! `--since OLD` leaves out the blobs OLD holds: a delta, importable on top of OLD.
//! `--compress zstd` and `--split SIZE` pack the tar for media ([`tender_bundle::packing`]).

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use futures::TryStreamExt as _;
use indicatif::HumanBytes;
use reqwest::StatusCode;
use tender_bundle::layout::{self, Descriptor, Document};
use tender_bundle::packing::{self, Compress, Packing};
use tender_bundle::BundleWriter;
use tender_catalog::asset::AssetPath;
use tender_fetch::mirror::ListingKind;
use tender_oci::{media, Algorithm, Digest, ImageRef, Reference, Tag};

use crate::exit::{Context as _, Failure, Result};
use crate::http;
use crate::prefetch::{self, Blob, Failed, Item, Manifest, Mode, PrefetchArgs, Progress, Run};
use crate::progress::{Show, Totals};

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// Where to write the bundle: a directory, or one tar file when PATH ends in .tar (must not exist)
    #[arg(long, value_name = "PATH", required_unless_present = "talos_image_cache")]
    pub out: Option<PathBuf>,
    /// An earlier bundle (directory or tar): write only the blobs it lacks, plus a complete index
    #[arg(long, value_name = "OLD_BUNDLE", conflicts_with = "since_digests", requires = "out")]
    pub since: Option<PathBuf>,
    /// The far side's have-list (`tender images --output digests` there): write only the blobs
    /// it lacks, plus a complete index
    #[arg(long, value_name = "FILE", requires = "out")]
    pub since_digests: Option<PathBuf>,
    /// Sign the bundle's index digest with this PKCS#8 PEM ECDSA P-256 private key: writes
    /// PATH.digest and PATH.sig (a cosign-compatible blob signature of PATH.digest)
    #[arg(long, value_name = "FILE", requires = "out")]
    pub sign_key: Option<PathBuf>,
    /// Also (or, without --out, only) write the images as Talos' own image cache, the layout
    /// `talosctl images cache-create` writes (must not exist; OS images are left out)
    #[arg(long, value_name = "DIR")]
    pub talos_image_cache: Option<PathBuf>,
    /// The image cache's layout: oci (for imager --image-cache) or flat (what the node reads)
    #[arg(long, value_name = "oci|flat", default_value = "oci")]
    pub talos_image_cache_layout: tender_bundle::CacheLayout,
    /// A file declaring what the bundle carries (images, platforms, Talos sets, OS images, OCI
    /// Helm charts), added to the selection and kept in the bundle's index.json
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    /// Compress the bundle as one tar (zstd: multi-threaded, level 3); an --out ending in
    /// .tar.zst is compressed without it
    #[arg(long, value_enum, value_name = "ALGORITHM")]
    pub compress: Option<CompressArg>,
    /// Split the tar into parts of at most SIZE (e.g. 4GiB; at least 1MiB): PATH.000, PATH.001,
    /// … and PATH.parts.json, their sizes and sha256
    #[arg(long, value_name = "SIZE", value_parser = parse_split)]
    pub split: Option<u64>,
    /// What to export: exactly `tender prefetch`'s selection and options
    #[command(flatten)]
    pub select: PrefetchArgs,
}

/// `--compress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompressArg {
    /// No compression (a plain tar or directory)
    None,
    /// zstd, multi-threaded
    Zstd,
}

/// `--split SIZE`: a size of at least [`packing::MIN_PART`].
fn parse_split(s: &str) -> std::result::Result<u64, String> {
    let n = tender_config::parse_size(s).ok_or_else(|| format!("{s:?} is not a size; write it like 4GiB or 700MiB"))?;
    if n < packing::MIN_PART {
        return Err(format!("{s} is smaller than a part may be (1MiB); write it like 4GiB"));
    }
    Ok(n)
}

/// How `--out`, `--compress` and `--split` pack the bundle.
fn packing_of(args: &ExportArgs, out: &std::path::Path) -> Result<Packing> {
    let named = packing::compress_of_name(out);
    let compress = match args.compress {
        None => named,
        Some(CompressArg::Zstd) => Compress::Zstd,
        Some(CompressArg::None) if named == Compress::Zstd => {
            return Err(Failure::usage(format!(
                "--out {} names a compressed tar, and --compress none asks for none; drop the .zst or the flag",
                out.display()
            )));
        }
        Some(CompressArg::None) => Compress::None,
    };
    Ok(Packing { compress, split: args.split })
}

/// Bytes the bundle will hold, as far as the walk knows them (referrers are found later).
fn bytes_to_write(outcomes: &[(Item, std::result::Result<prefetch::Done, Failed>)], skip: &HashSet<Digest>) -> u64 {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    for (item, outcome) in outcomes {
        let Ok(done) = outcome else { continue };
        match (item, &done.graph) {
            (Item::Image(_), Some(graph)) => {
                for m in std::iter::once(&graph.top).chain(graph.children.iter()) {
                    if seen.insert(m.digest) {
                        total += m.bytes.len() as u64;
                    }
                }
                for b in &graph.blobs {
                    if !skip.contains(&b.digest) && seen.insert(b.digest) {
                        total += b.size;
                    }
                }
            }
            (Item::OsImage(_), _) => total += done.bytes,
            _ => {}
        }
    }
    total
}

/// Deepest nesting of referrer indexes followed.
const MAX_DEPTH: usize = 4;

/// Counts for the summary.
#[derive(Default)]
struct Counts {
    images: usize,
    referrers: usize,
    assets: usize,
}

pub fn run(mut args: ExportArgs) -> Result<ExitCode> {
    let spec = match &args.spec {
        Some(path) => {
            let (text, spec) = crate::spec::read(path)?;
            crate::spec::apply(&spec, &mut args.select)?;
            Some(text)
        }
        None => None,
    };
    let packing = match &args.out {
        Some(out) => packing_of(&args, out)?,
        None => Packing::default(),
    };
    if let Some(out) = &args.out {
        for taken in tender_bundle::write::occupied(out, packing) {
            if std::fs::symlink_metadata(&taken).is_ok() {
                return Err(Failure::usage(format!(
                    "--out {}: {} exists; name a new path",
                    out.display(),
                    taken.display()
                )));
            }
        }
    }
    if let Some(dir) = args.talos_image_cache.as_ref().filter(|p| std::fs::symlink_metadata(p).is_ok()) {
        return Err(Failure::usage(format!("--talos-image-cache {}: exists; name a new path", dir.display())));
    }
    let (skip, since_digest) = match &args.since {
        Some(old) => {
            let listing = tender_bundle::list::list(old)
                .map_err(|e| Failure::usage(format!("--since {}: not a bundle: {e}", old.display())))?;
            let blobs = tender_bundle::blobs_of(old).with_context(|| format!("reading --since {}", old.display()))?;
            (blobs, Some(listing.index_digest))
        }
        None => match &args.since_digests {
            Some(file) => (read_have_list(file)?, None),
            None => (HashSet::new(), None),
        },
    };
    // A key that cannot sign is found before anything is fetched.
    let sign_key = args.sign_key.as_deref().map(crate::bundlesig::SigningKey::load).transpose()?;
    let run = prefetch::start(&args.select)?;
    let outcomes = prefetch::warm_all(&run, &args.select, "export");
    prefetch::verdict(&outcomes, "fetched; nothing written")?;
    if let Some(dir) = &args.talos_image_cache {
        crate::talos_cache::export(&run, &outcomes, dir, args.talos_image_cache_layout, args.select.quiet)?;
    }
    let Some(out) = &args.out else { return Ok(ExitCode::SUCCESS) };

    let show = Show::choose(args.select.quiet);
    let totals = Totals::new("export", None);
    let progress = Progress::new(None, "bundle".into(), show, totals);
    let multi = show.multi();
    let writing = Totals::new("export: writing", multi.as_ref());
    writing.set_prefix("writing");
    writing.add_bytes_known(bytes_to_write(&outcomes, &skip));
    if show == Show::Lines {
        writing.spawn_ticker(args.select.progress_interval);
    }
    let mut writer = BundleWriter::create_packed(out, skip, packing)
        .with_context(|| format!("creating the bundle {}", out.display()))?;
    if show != Show::Quiet {
        let w = writing.clone();
        writer.on_progress(std::sync::Arc::new(move |n| w.add_bytes_done(n)));
    }
    let mut entries = Vec::new();
    let mut counts = Counts::default();
    for (item, outcome) in &outcomes {
        let Ok(done) = outcome else { continue };
        match item {
            Item::Image(img) => {
                let graph = done.graph.as_ref().ok_or_else(|| Failure::problem(format!("{img}: nothing walked")))?;
                let mut manifests = vec![graph.top.clone()];
                manifests.extend(graph.children.iter().cloned());
                for m in &manifests {
                    writer.add_bytes(&m.digest, &m.bytes).with_context(|| format!("{img}: writing {}", m.digest))?;
                }
                for b in &graph.blobs {
                    copy_blob(&run, &mut writer, img, b, &progress)?;
                }
                let name = img.to_string();
                let mut entry = Descriptor::new(&graph.top.media_type, &graph.top.digest, graph.top.bytes.len() as u64)
                    .with(layout::REF_NAME, name.clone())
                    .with(layout::CONTAINERD_NAME, name);
                if prefetch::is_index(&graph.top.media_type) {
                    entry = entry.with(layout::PLATFORMS, done.platforms.join(","));
                }
                if graph.top.private {
                    entry = entry.with(layout::PRIVATE, "true");
                }
                entries.push(entry);
                counts.images += 1;
                for m in &manifests {
                    for r in referrers(&run, img, &m.digest)? {
                        export_graph(&run, &mut writer, &r.image, &r.manifest, &progress, 0)?;
                        let mut entry =
                            Descriptor::new(&r.manifest.media_type, &r.manifest.digest, r.manifest.bytes.len() as u64);
                        entry = match &r.image.reference {
                            Reference::Tag(_) => entry
                                .with(layout::REF_NAME, r.image.to_string())
                                .with(layout::CONTAINERD_NAME, r.image.to_string()),
                            Reference::Digest(_) => {
                                entry.with(layout::REPOSITORY, format!("{}/{}", r.image.registry, r.image.repository))
                            }
                        };
                        if graph.top.private {
                            entry = entry.with(layout::PRIVATE, "true");
                        }
                        if !entries
                            .iter()
                            .any(|e: &Descriptor| e.digest == entry.digest && e.annotations == entry.annotations)
                        {
                            entries.push(entry);
                            counts.referrers += 1;
                        }
                    }
                }
            }
            Item::OsImage(asset) => {
                entries.push(export_asset(&run, &mut writer, asset, &progress)?);
                counts.assets += 1;
            }
        }
    }
    let mut annotations = BTreeMap::new();
    annotations.insert(layout::CREATED.to_string(), humantime::format_rfc3339_seconds(SystemTime::now()).to_string());
    if let Some(d) = &since_digest {
        annotations.insert(layout::SINCE.to_string(), d.clone());
    }
    if let Some(text) = spec {
        annotations.insert(layout::SPEC.to_string(), text);
    }
    let written = writer.finish(&Document::index(entries, annotations));
    writing.finish(show);
    let written = written.with_context(|| format!("finishing the bundle {}", out.display()))?;
    let delta = match (&args.since, &since_digest, &args.since_digests) {
        (Some(old), Some(d), _) => {
            format!("; a delta on {} ({d}): {} blob(s) it holds left out", old.display(), written.skipped)
        }
        (_, _, Some(have)) => {
            format!("; a delta on the have-list {}: {} blob(s) left out", have.display(), written.skipped)
        }
        _ => String::new(),
    };
    println!(
        "export: wrote {}: {} image(s), {} referrer(s), {} OS image(s); {} blob(s), {}{delta}",
        written_where(out, packing),
        counts.images,
        counts.referrers,
        counts.assets,
        written.blobs,
        HumanBytes(written.bytes)
    );
    if let Some(d) = written.index_digest {
        println!("index: {d}");
        if let Some(key) = &sign_key {
            let sig = key.sign(out, &d)?;
            println!("signed: {}", sig.display());
        }
    } else if sign_key.is_some() {
        return Err(Failure::problem("the bundle has no index digest to sign"));
    }
    Ok(ExitCode::SUCCESS)
}

/// Largest have-list read (a million digests take 72 MB).
const MAX_HAVE_LIST: u64 = 128 << 20;

/// A have-list: one digest per line (blank lines and `#` comments allowed).
fn read_have_list(path: &std::path::Path) -> Result<HashSet<Digest>> {
    let shown = path.display();
    let len = std::fs::metadata(path).map_err(|e| Failure::usage(format!("--since-digests {shown}: {e}")))?.len();
    if len > MAX_HAVE_LIST {
        return Err(Failure::usage(format!("--since-digests {shown}: larger than {MAX_HAVE_LIST} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| Failure::usage(format!("--since-digests {shown}: {e}")))?;
    let mut out = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let d: Digest = line.parse().map_err(|e| {
            Failure::usage(format!("--since-digests {shown}:{}: {line:?} is not a digest ({e})", n + 1))
        })?;
        out.insert(d);
    }
    Ok(out)
}

/// What `--out` became: the path, or a part set's manifest and parts.
fn written_where(out: &std::path::Path, packing: Packing) -> String {
    let Some(_) = packing.split else { return out.display().to_string() };
    let manifest = tender_bundle::write::occupied(out, packing).into_iter().nth(1).unwrap_or_default();
    match packing::open(&manifest) {
        Ok(p) => format!("{} ({}, {})", manifest.display(), p.describe(), HumanBytes(p.input_len())),
        Err(_) => manifest.display().to_string(),
    }
}

/// Copy one blob into the bundle: from the store (verified when it was committed), or through
/// the server (hashed on the way).
fn copy_blob(run: &Run, writer: &mut BundleWriter, img: &ImageRef, blob: &Blob, progress: &Progress) -> Result<()> {
    if !writer.wants(&blob.digest) {
        // Already written, or in the --since bundle: no transfer.
        writer.skipped(&blob.digest);
        return Ok(());
    }
    let what = format!("{img}: blob {}", blob.digest);
    match &run.backend.mode {
        Mode::Local(local) => {
            run.runtime.block_on(run.backend.blob(img, blob, progress)).map_err(failure)?;
            let path = local.store.object_path(&blob.digest);
            writer.add_verified_file(&blob.digest, &path).with_context(|| format!("{what}: copying"))?;
        }
        Mode::Server(server) => {
            let mut sync = server.blob_reader(&run.runtime, img, &blob.digest, &what).map_err(failure)?;
            writer.add_reader(&blob.digest, blob.size, &mut sync).with_context(|| format!("{what}: writing"))?;
        }
    }
    Ok(())
}

fn failure(f: Failed) -> Failure {
    f.into_failure()
}

/// A referrer to carry along: the manifest, and the name it is found under.
struct Referrer {
    image: ImageRef,
    manifest: Manifest,
}

/// The referrers of `digest` in `img`'s repository: the referrers API's answer and the tag
/// schemes (`sha256-<hex>` of OCI's fallback, cosign's `.sig` and `.att`). A 404 is none.
fn referrers(run: &Run, img: &ImageRef, digest: &Digest) -> Result<Vec<Referrer>> {
    let mut out: Vec<Referrer> = Vec::new();
    for d in referrers_api(run, img, digest)? {
        let image = ImageRef { reference: Reference::Digest(d), tag_hint: None, ..img.clone() };
        match run.runtime.block_on(run.backend.manifest(&image, &Reference::Digest(d))) {
            Ok(manifest) => out.push(Referrer { image, manifest }),
            Err(f) if !f.transient => tracing::warn!(referrer = %d, error = %f.message, "referrer not exported"),
            Err(f) => return Err(failure(f)),
        }
    }
    let fallback = format!("{}-{}", digest.algorithm().name(), digest.hex());
    for suffix in ["", ".sig", ".att"] {
        let Ok(tag) = format!("{fallback}{suffix}").parse::<Tag>() else { continue };
        let image = ImageRef { reference: Reference::Tag(tag.clone()), tag_hint: None, ..img.clone() };
        match run.runtime.block_on(run.backend.manifest(&image, &Reference::Tag(tag))) {
            Ok(manifest) => {
                if !out.iter().any(|r| r.manifest.digest == manifest.digest && r.image == image) {
                    out.push(Referrer { image, manifest });
                }
            }
            Err(f) if !f.transient => {}
            Err(f) => return Err(failure(f)),
        }
    }
    Ok(out)
}

/// The manifests the referrers API lists for `digest` (none where it answers 404).
fn referrers_api(run: &Run, img: &ImageRef, digest: &Digest) -> Result<Vec<Digest>> {
    let body = match &run.backend.mode {
        Mode::Server(server) => {
            let path = format!("/v2/{}/referrers/{digest}?ns={}", img.repository, img.registry);
            let what = format!("{img}: referrers of {digest}");
            let url = http::join(&server.base, &path);
            let resp = run.runtime.block_on(async { server.client.request(reqwest::Method::GET, url).send().await });
            match resp {
                Ok(r) if r.status() == StatusCode::OK => {
                    run.runtime.block_on(r.bytes()).map_err(|e| failure(Failed::transport(&what, &e)))?.to_vec()
                }
                Ok(r) if r.status().is_server_error() => return Err(failure(Failed::status(&what, r.status()))),
                Ok(_) => return Ok(Vec::new()),
                Err(e) => return Err(failure(Failed::transport(&what, &e))),
            }
        }
        Mode::Local(local) => {
            let (up, repo) = local.route(img).map_err(failure)?;
            let listing = run.runtime.block_on(local.mirror.listing(
                &up,
                &repo,
                &ListingKind::Referrers(*digest),
                &[],
                &repo,
                None,
            ));
            match listing {
                Ok(l) => l.body.to_vec(),
                Err(e) if e.is_retryable() || e.is_upstream_down() => {
                    return Err(Failure::transient(format!("{img}: referrers of {digest}: {e}")));
                }
                Err(_) => return Ok(Vec::new()),
            }
        }
    };
    let doc: Document = serde_json::from_slice(&body).unwrap_or_default();
    Ok(doc.manifests.iter().filter_map(|d| d.digest.parse().ok()).collect())
}

/// Write a referrer's whole graph: every manifest of an index, every blob.
fn export_graph(
    run: &Run,
    writer: &mut BundleWriter,
    img: &ImageRef,
    manifest: &Manifest,
    progress: &Progress,
    depth: usize,
) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Failure::problem(format!("{img}: referrer indexes nested deeper than {MAX_DEPTH}")));
    }
    writer
        .add_bytes(&manifest.digest, &manifest.bytes)
        .with_context(|| format!("{img}: writing {}", manifest.digest))?;
    if prefetch::is_index(&manifest.media_type) {
        let doc: Document = serde_json::from_slice(&manifest.bytes)
            .map_err(|e| Failure::problem(format!("{img}: index {}: {e}", manifest.digest)))?;
        for child in doc.manifests {
            let Ok(d) = child.digest.parse::<Digest>() else { continue };
            let m = run.runtime.block_on(run.backend.manifest(img, &Reference::Digest(d))).map_err(failure)?;
            export_graph(run, writer, img, &m, progress, depth + 1)?;
        }
        return Ok(());
    }
    for b in prefetch::manifest_blobs(img, manifest).map_err(failure)? {
        copy_blob(run, writer, img, &b, progress)?;
    }
    Ok(())
}

/// An OS image as an OCI artifact: the empty config, one layer (the asset, sha256 of its trust
/// record), the Image Factory path.
fn export_asset(run: &Run, writer: &mut BundleWriter, asset: &AssetPath, progress: &Progress) -> Result<Descriptor> {
    let what = asset.path();
    let (digest, size) = match &run.backend.mode {
        Mode::Local(local) => {
            run.runtime.block_on(run.backend.os_image(asset, progress)).map_err(failure)?;
            let trust = local
                .store
                .trust_get(&asset.key())
                .map_err(|e| Failure::problem(crate::exit::chain(&e)))?
                .ok_or_else(|| Failure::problem(format!("{what}: no trust record after its fetch")))?;
            writer
                .add_verified_file(&trust.digest, &local.store.object_path(&trust.digest))
                .with_context(|| format!("{what}: copying"))?;
            (trust.digest, trust.size)
        }
        Mode::Server(server) => {
            let resp = run.runtime.block_on(server.get(&what, &what, None)).map_err(failure)?;
            let digest = resp
                .headers()
                .get(reqwest::header::ETAG)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim_matches('"').parse::<Digest>().ok())
                .filter(|d| d.algorithm() == Algorithm::Sha256)
                .ok_or_else(|| Failure::problem(format!("{what}: the server named no sha256 ETag for it")))?;
            let size =
                resp.content_length().ok_or_else(|| Failure::problem(format!("{what}: the server sent no length")))?;
            let stream = resp.bytes_stream().map_err(io::Error::other);
            let reader = tokio_util::io::StreamReader::new(stream);
            let mut sync = tokio_util::io::SyncIoBridge::new_with_handle(reader, run.runtime.handle().clone());
            writer.add_reader(&digest, size, &mut sync).with_context(|| format!("{what}: writing"))?;
            (digest, size)
        }
    };
    let empty = Algorithm::Sha256.digest(layout::EMPTY_JSON);
    writer.add_bytes(&empty, layout::EMPTY_JSON)?;
    let layer = Descriptor::new(layout::ASSET_LAYER_MEDIA, &digest, size).with(layout::TITLE, asset.asset.clone());
    let doc = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "artifactType": layout::OS_IMAGE_ARTIFACT,
        "config": Descriptor::new(layout::EMPTY_MEDIA, &empty, layout::EMPTY_JSON.len() as u64),
        "layers": [layer],
        "annotations": { layout::FACTORY_PATH: what, layout::TRUST_SHA256: digest.to_string() },
    });
    let bytes = serde_json::to_vec(&doc)?;
    let manifest = Algorithm::Sha256.digest(&bytes);
    writer.add_bytes(&manifest, &bytes)?;
    let mut entry = Descriptor::new(media::OCI_MANIFEST, &manifest, bytes.len() as u64)
        .with(layout::FACTORY_PATH, what)
        .with(layout::TRUST_SHA256, digest.to_string());
    entry.artifact_type = Some(layout::OS_IMAGE_ARTIFACT.to_string());
    Ok(entry)
}
