//! The day-2 side of an air gap: `tender images` (what the site holds), `tender bundle rm`
//! (retire an imported release) and `tender bundle diff` (what changed between two bundles).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use indicatif::HumanBytes;
use tender_fetch::service::{InventoryItem, Released};
use tender_oci::Digest;
use tender_store::{OpenMode, Store};

use crate::exit::{Failure, Result};
use crate::http::{join, parse_base_url, server_or_env, ClientArgs, ClientOptions};
use crate::import::Target;

#[derive(Debug, clap::Args)]
pub struct BundleArgs {
    #[command(subcommand)]
    pub command: BundleCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum BundleCommand {
    /// List what a bundle holds: names, platforms, OS images, sizes
    Ls {
        /// The bundle: a directory, a tar (zstd-compressed or not) or a part set
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// Print the listing as JSON
        #[arg(long)]
        json: bool,
    },
    /// Retire an imported bundle: release its pins and the tags only it registered; the next
    /// `tender gc` frees what no other bundle, pin or tag holds
    Rm(Box<BundleRmArgs>),
    /// What changed between two bundles, by name and by bytes
    Diff {
        /// The older bundle: a directory or a tar
        #[arg(value_name = "OLD")]
        old: PathBuf,
        /// The newer bundle
        #[arg(value_name = "NEW")]
        new: PathBuf,
        /// Print the changes as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct BundleRmArgs {
    /// The bundle's index digest, as `tender export` and `tender import` printed it
    #[arg(value_name = "INDEX_DIGEST")]
    pub index: tender_oci::Digest,
    #[command(flatten)]
    pub target: Target,
    /// Say what would be retired and how much gc would free; change nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}

/// `tender bundle ls|rm|diff`.
pub fn run_bundle(args: BundleArgs) -> Result<ExitCode> {
    match args.command {
        BundleCommand::Ls { path, json } => crate::import::run_bundle_ls(path, json),
        BundleCommand::Rm(a) => run_bundle_rm(&a.index, &a.target, a.dry_run, a.json),
        BundleCommand::Diff { old, new, json } => run_bundle_diff(&old, &new, json),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One line per image
    Table,
    /// Every field, as JSON
    Json,
    /// Every object digest held, one per line: the have-list `export --since-digests` reads
    Digests,
}

#[derive(Debug, clap::Args)]
pub struct ImagesArgs {
    #[command(flatten)]
    pub target: Target,
    /// How to print it
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    pub output: Output,
}

/// A stopped tender's store, read without its lock (a running one's is read as well: nothing
/// is changed).
fn read_store(data: &Path, config: Option<&Path>) -> Result<Store> {
    let settings = crate::local::settings(config, Some(data.to_path_buf()))?;
    if !settings.data.join("tender-data.json").exists() {
        return Err(Failure::usage(format!(
            "{} is not a tender data directory; check --data",
            settings.data.display()
        )));
    }
    crate::datadir::require_owner(&settings.data)?;
    Store::open(&settings.data, OpenMode::ReadOnly).map_err(|e| Failure::problem(e.to_string()))
}

fn admin_client(client: &ClientArgs) -> Result<crate::http::TenderClient> {
    client.client(&ClientOptions {
        user_agent: concat!("tender/", env!("CARGO_PKG_VERSION")),
        headers: &[],
        connect_timeout: Duration::from_secs(10),
        read_timeout: Some(Duration::from_secs(600)),
        admin: true,
    })
}

/// Send an admin request and read its answer: the body of a 2xx; otherwise the server's own
/// message, with the exit code its status calls for.
fn admin_call(client: &ClientArgs, url: reqwest::Url, method: reqwest::Method) -> Result<String> {
    let c = admin_client(client)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let resp =
            c.request(method, url.clone()).send().await.map_err(|e| Failure::transient(format!("{url}: {e}")))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| Failure::transient(format!("{url}: {e}")))?;
        if status.is_success() {
            return Ok(text);
        }
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                v["error"]
                    .as_str()
                    .map(str::to_string)
                    .or_else(|| v["errors"][0]["message"].as_str().map(str::to_string))
            })
            .unwrap_or_else(|| text.trim().to_string());
        match status.as_u16() {
            401 => Err(Failure::usage(format!("{url}: 401: {message}; pass the admin token with --token-file"))),
            403 | 404 | 413 => Err(Failure::usage(format!("{url}: {status}: {message}"))),
            s if s >= 500 => Err(Failure::transient(format!("{url}: {status}: {message}"))),
            _ => Err(Failure::problem(format!("{url}: {status}: {message}"))),
        }
    })
}

pub fn run_images(args: ImagesArgs) -> Result<ExitCode> {
    let t = &args.target;
    let (items, digests) = match server_or_env(&t.server, t.data.is_some()) {
        Some(url) => {
            let base = parse_base_url(&url)?;
            if args.output == Output::Digests {
                let text = admin_call(&t.client, join(&base, "/api/v1/admin/digests"), reqwest::Method::GET)?;
                (Vec::new(), text.lines().map(str::to_string).collect())
            } else {
                let text = admin_call(&t.client, join(&base, "/api/v1/admin/images"), reqwest::Method::GET)?;
                let v: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| Failure::problem(format!("{url}: not an image list: {e}")))?;
                let items: Vec<InventoryItem> = serde_json::from_value(v["images"].clone())
                    .map_err(|e| Failure::problem(format!("{url}: not an image list: {e}")))?;
                (items, Vec::new())
            }
        }
        None => {
            let Some(data) = &t.data else {
                return Err(Failure::usage("give --data DIR or --server URL"));
            };
            if t.client.is_set() {
                return Err(Failure::usage("the client options (--ca, --token-file, …) go with --server, not --data"));
            }
            let store = read_store(data, t.config.as_deref())?;
            if args.output == Output::Digests {
                let objects = store.list_objects().map_err(|e| Failure::problem(e.to_string()))?;
                let sorted: BTreeSet<Digest> = objects.into_iter().map(|o| o.digest).collect();
                (Vec::new(), sorted.into_iter().map(|d| d.to_string()).collect())
            } else {
                (store.inventory().map_err(|e| Failure::problem(e.to_string()))?, Vec::new())
            }
        }
    };
    let mut out = io::stdout().lock();
    match args.output {
        Output::Digests => {
            for d in digests {
                writeln!(out, "{d}")?;
            }
        }
        Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(&serde_json::json!({ "images": items }))?)?,
        Output::Table => print_table(&mut out, &items)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn ago(secs: Option<u64>) -> String {
    let Some(at) = secs else { return "-".into() };
    let age = tender_store::now_secs().saturating_sub(at);
    match age {
        0..=119 => format!("{age}s ago"),
        120..=7199 => format!("{}m ago", age / 60),
        7200..=172_799 => format!("{}h ago", age / 3600),
        _ => format!("{}d ago", age / 86_400),
    }
}

fn short(d: &Digest) -> String {
    let s = d.to_string();
    s.chars().take(19).collect()
}

fn print_table(out: &mut impl io::Write, items: &[InventoryItem]) -> io::Result<()> {
    writeln!(
        out,
        "{:<56} {:<20} {:>10} {:<6} {:<28} {:<10} {:<8} DIGEST",
        "NAME", "PLATFORMS", "SIZE", "PINNED", "SOURCE", "SERVED", "SIGNED"
    )?;
    let mut total = 0;
    for i in items {
        let platforms = if i.platforms.is_empty() { "-".to_string() } else { i.platforms.join(",") };
        let source = match (&i.source[..], &i.bundle, &i.upstream) {
            ("bundle", Some(b), _) => format!("bundle {} {}", &short(b)[7..], ago(Some(i.since))),
            ("bundle", None, _) => format!("import {}", ago(Some(i.since))),
            (_, _, Some(up)) => format!("pulled {up}"),
            _ => i.source.clone(),
        };
        let size = if i.present < i.objects {
            format!("{} ({}/{})", HumanBytes(i.size), i.present, i.objects)
        } else {
            HumanBytes(i.size).to_string()
        };
        writeln!(
            out,
            "{:<56} {:<20} {:>10} {:<6} {:<28} {:<10} {:<8} {}",
            i.name,
            platforms,
            size,
            if i.pinned { "yes" } else { "no" },
            source,
            ago(i.last_served),
            i.verdict.as_deref().unwrap_or("-"),
            short(&i.digest)
        )?;
        total += i.size;
    }
    writeln!(out, "{} image(s), {} (objects shared between images counted in each)", items.len(), HumanBytes(total))
}

/// `tender bundle rm`.
pub fn run_bundle_rm(index: &Digest, target: &Target, dry_run: bool, json: bool) -> Result<ExitCode> {
    let released: Released = match server_or_env(&target.server, target.data.is_some()) {
        Some(url) => {
            let base = parse_base_url(&url)?;
            let path = format!("/api/v1/admin/bundles/{index}{}", if dry_run { "?dryRun=true" } else { "" });
            let text = admin_call(&target.client, join(&base, &path), reqwest::Method::DELETE)?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Failure::problem(format!("{url}: not a report: {e}")))?;
            serde_json::from_value(v["released"].clone())
                .map_err(|e| Failure::problem(format!("{url}: not a report: {e}")))?
        }
        None => {
            let Some(data) = &target.data else {
                return Err(Failure::usage("give --data DIR (a stopped tender) or --server URL (a running one)"));
            };
            if target.client.is_set() {
                return Err(Failure::usage("the client options (--ca, --token-file, …) go with --server, not --data"));
            }
            let settings = crate::local::settings(target.config.as_deref(), Some(data.clone()))?;
            crate::datadir::check(&settings.data).map_err(Failure::problem)?;
            crate::datadir::own_files(&settings.data)?;
            let mode = if dry_run { OpenMode::ReadOnly } else { OpenMode::Exclusive };
            let store = Store::open(&settings.data, mode).map_err(|e| Failure::problem(e.to_string()))?;
            match store.import_remove(index, dry_run).map_err(|e| Failure::problem(e.to_string()))? {
                Some(r) => r,
                None => return Err(Failure::usage(no_such_bundle(index, &store))),
            }
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "index": index, "dryRun": dry_run, "released": released })
            )?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    for name in &released.entries {
        println!("{verb:<13}{name}");
    }
    println!(
        "bundle {index}: {} {} object(s), {} (freed by the next gc); {} object(s) still held by other bundles or pins",
        if dry_run { "would retire" } else { "retired" },
        released.retired.len(),
        HumanBytes(released.retired_bytes),
        released.still_held
    );
    Ok(ExitCode::SUCCESS)
}

fn no_such_bundle(index: &Digest, store: &Store) -> String {
    let known: Vec<String> = store.imports().unwrap_or_default().iter().map(|r| r.index.to_string()).collect();
    if known.is_empty() {
        format!("no bundle with index {index} was imported here (no bundle is recorded)")
    } else {
        format!("no bundle with index {index} was imported here; recorded: {}", known.join(", "))
    }
}

/// One name's change between two bundles.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Change {
    name: String,
    /// `added`, `removed`, `changed` or `same`.
    change: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    old: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    new: Option<String>,
    /// Bytes of the entry's graph each bundle carries.
    old_bytes: u64,
    new_bytes: u64,
}

/// `tender bundle diff OLD NEW`.
pub fn run_bundle_diff(old: &Path, new: &Path, json: bool) -> Result<ExitCode> {
    let read = |p: &PathBuf| {
        tender_bundle::list::list(p)
            .map_err(|e| Failure::problem(format!("{}: not a readable bundle: {e}", p.display())))
    };
    let (a, b) = (read(&old.to_path_buf())?, read(&new.to_path_buf())?);
    let blobs = |p: &Path| {
        tender_bundle::blobs_of(p).map_err(|e| Failure::problem(format!("{}: not a readable bundle: {e}", p.display())))
    };
    let (ab, bb) = (blobs(old)?, blobs(new)?);
    let mut names: BTreeMap<&str, (Option<&tender_bundle::list::Entry>, Option<&tender_bundle::list::Entry>)> =
        BTreeMap::new();
    for e in &a.entries {
        names.entry(&e.name).or_default().0 = Some(e);
    }
    for e in &b.entries {
        names.entry(&e.name).or_default().1 = Some(e);
    }
    let changes: Vec<Change> = names
        .into_iter()
        .map(|(name, (o, n))| Change {
            name: name.to_string(),
            change: match (o, n) {
                (None, _) => "added",
                (_, None) => "removed",
                (Some(o), Some(n)) if o.digest != n.digest => "changed",
                _ => "same",
            },
            old: o.map(|e| e.digest.clone()),
            new: n.map(|e| e.digest.clone()),
            old_bytes: o.map_or(0, |e| e.bytes),
            new_bytes: n.map_or(0, |e| e.bytes),
        })
        .collect();
    let (only_new, only_old, shared) =
        (bb.difference(&ab).count(), ab.difference(&bb).count(), ab.intersection(&bb).count());
    if json {
        let v = serde_json::json!({
            "old": a.index_digest, "new": b.index_digest, "changes": changes,
            "blobs": { "added": only_new, "removed": only_old, "shared": shared },
            "bytes": { "old": a.bytes, "new": b.bytes },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = io::stdout().lock();
    for c in changes.iter().filter(|c| c.change != "same") {
        let bytes = match c.change {
            "added" => format!("+{}", HumanBytes(c.new_bytes)),
            "removed" => format!("-{}", HumanBytes(c.old_bytes)),
            _ => format!("{} -> {}", HumanBytes(c.old_bytes), HumanBytes(c.new_bytes)),
        };
        let digests = match (&c.old, &c.new) {
            (Some(o), Some(n)) => format!("{} -> {}", &o[..19.min(o.len())], &n[..19.min(n.len())]),
            (Some(d), None) | (None, Some(d)) => d[..19.min(d.len())].to_string(),
            (None, None) => String::new(),
        };
        writeln!(out, "{:<8} {:<56} {:>24}  {digests}", c.change, c.name, bytes)?;
    }
    let same = changes.iter().filter(|c| c.change == "same").count();
    writeln!(
        out,
        "{} added, {} removed, {} changed, {same} unchanged; blobs: {only_new} only in NEW, {only_old} only in OLD, {shared} shared; {} -> {}",
        changes.iter().filter(|c| c.change == "added").count(),
        changes.iter().filter(|c| c.change == "removed").count(),
        changes.iter().filter(|c| c.change == "changed").count(),
        HumanBytes(a.bytes),
        HumanBytes(b.bytes)
    )?;
    Ok(ExitCode::SUCCESS)
}
