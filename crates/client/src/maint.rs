//! `tender fsck` and `tender gc`: store maintenance from the command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tender_store::{GcPlan, GcReport, OpenMode, Store};

use crate::exit::{Failure, Result};
use crate::http::{admin_failure, join, parse_base_url, server_or_env, ClientArgs, ClientOptions};

#[derive(Debug, clap::Args)]
pub struct FsckArgs {
    /// Data directory [default: from --config, else ./tender-data]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Config file naming the data directory
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Move objects that fail verification to quarantine/ (needs the data directory to itself;
    /// with --bucket, the bucket's quarantine/, safe while replicas run)
    #[arg(long)]
    pub repair: bool,
    /// Check the bucket of storage.s3 (from --config) instead of the data directory: every
    /// chunk against its index, every object against its digest; list keys nothing names
    /// (--repair removes them)
    #[arg(long, requires = "config", conflicts_with_all = ["data", "server"])]
    pub bucket: bool,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    /// Act through this running tender (POST /api/v1/admin/fsck) instead of the data directory;
    /// pass the admin token with --token-file [env: TENDER_SERVER, TENDER_ADMIN_TOKEN_FILE]
    #[arg(long, value_name = "URL", conflicts_with = "data")]
    pub server: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, clap::Args)]
pub struct GcArgs {
    /// Data directory [default: from --config, else ./tender-data]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Config file naming the data directory and cache.maxSize
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Evict least recently used objects down to this size (default: cache.maxSize)
    #[arg(long, value_name = "SIZE")]
    pub max_size: Option<String>,
    /// Report what would be freed; change nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Cap every byte under the prefix of the bucket of storage.s3 (from --config) instead of
    /// the data directory: remove keys nothing names older than storage.s3.gcGrace, then evict
    /// the least recently served objects (default cap: storage.s3.maxSize); safe while replicas run
    #[arg(long, requires = "config", conflicts_with_all = ["data", "server"])]
    pub bucket: bool,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    /// Act through this running tender (POST /api/v1/admin/gc) instead of the data directory;
    /// pass the admin token with --token-file [env: TENDER_SERVER, TENDER_ADMIN_TOKEN_FILE]
    #[arg(long, value_name = "URL", conflicts_with = "data")]
    pub server: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// POST an admin endpoint of a running tender and return its JSON answer.
fn admin_post(server: &str, client: &ClientArgs, path_and_query: &str) -> Result<serde_json::Value> {
    let base = parse_base_url(server)?;
    let url = join(&base, path_and_query);
    let c = client.client(&ClientOptions {
        user_agent: concat!("tender/", env!("CARGO_PKG_VERSION")),
        headers: &[],
        connect_timeout: Duration::from_secs(10),
        read_timeout: Some(Duration::from_secs(3600)),
        admin: true,
    })?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let resp = c
            .request(reqwest::Method::POST, url.clone())
            .send()
            .await
            .map_err(|e| Failure::transient(format!("{url}: {e}")))?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| Failure::transient(format!("{url}: {e}")))?;
        if status.is_success() {
            serde_json::from_str(&body).map_err(|e| Failure::problem(format!("{url}: answer is not JSON: {e}")))
        } else {
            Err(admin_failure(&url, status, &body))
        }
    })
}

fn data_dir(data: &Option<PathBuf>, cfg: &Option<PathBuf>) -> Result<(PathBuf, Option<u64>)> {
    let s = crate::local::settings(cfg.as_deref(), data.clone())?;
    Ok((s.data, s.cache_max_size))
}

fn open(dir: &std::path::Path, mode: OpenMode) -> Result<Store> {
    if !dir.join("tender-data.json").exists() {
        return Err(Failure::usage(format!("{} is not a tender data directory; check --data", dir.display())));
    }
    crate::datadir::own_files(dir)?;
    Store::open(dir, mode).map_err(|e| Failure::problem(e.to_string()))
}

/// `tender fsck --bucket`: the shared bucket, which needs no lock (quarantine hides an object's
/// index before moving its content).
fn fsck_bucket(args: &FsckArgs) -> Result<ExitCode> {
    let (name, raw) = tender_config::read(args.config.as_deref()).map_err(|e| Failure::usage(e.to_string()))?;
    let s = tender_config::resolve(&name, raw, &tender_config::Overrides::default())
        .map_err(|e| Failure::usage(e.to_string()))?;
    let Some(settings) = s.storage else {
        return Err(Failure::usage(format!("{name} has no storage.s3 section; --bucket checks that bucket")));
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = rt.block_on(async {
        let bucket = tender_bucket::Bucket::new(settings, tender_bucket::BucketMetrics::default())
            .map_err(|e| Failure::usage(e.to_string()))?;
        bucket.fsck(args.repair).await.map_err(|e| Failure::transient(e.to_string()))
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "bucket {}: checked {} objects, {} bytes",
            report.bucket, report.objects_checked, report.bytes_checked
        );
        for c in &report.corrupt {
            println!("corrupt {}: {}", c.digest, c.problem);
        }
        for st in &report.strays {
            let done = if st.removed { "removed" } else { "run with --repair to remove it" };
            println!(
                "stray {} ({} objects, {} bytes, written {} s ago; no index or upload names it): {done}",
                st.key, st.objects, st.bytes, st.age_secs
            );
        }
        for a in &report.abandoned_uploads {
            let done = if a.removed { "removed" } else { "run with --repair to remove it" };
            println!(
                "abandoned upload {} by {} (upload id {}, idle {} s): {done}",
                a.digest, a.replica, a.upload_id, a.idle_secs
            );
        }
        if report.quarantined > 0 {
            println!("quarantined {} objects under quarantine/", report.quarantined);
        }
        if !report.corrupt.is_empty() && !args.repair {
            println!("run `tender fsck --bucket --repair` to move corrupt objects to the bucket's quarantine/");
        }
    }
    Ok(if report.is_clean() || args.repair { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

pub fn fsck(args: FsckArgs) -> Result<ExitCode> {
    if args.bucket {
        return fsck_bucket(&args);
    }
    let server = server_or_env(&args.server, args.data.is_some() || args.config.is_some());
    let report = match &server {
        Some(server) => {
            let v = admin_post(server, &args.client, &format!("/api/v1/admin/fsck?repair={}", args.repair))?;
            serde_json::from_value(v).map_err(|e| Failure::problem(format!("{server}: not an fsck report: {e}")))?
        }
        None => {
            if args.client.is_set() {
                return Err(Failure::usage("client options (--ca, --token-file, ...) need --server"));
            }
            let (dir, _) = data_dir(&args.data, &args.config)?;
            let store = open(&dir, if args.repair { OpenMode::Exclusive } else { OpenMode::ReadOnly })?;
            store.fsck(args.repair).map_err(|e| Failure::problem(e.to_string()))?
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("checked {} objects, {} bytes", report.checked, report.bytes);
        for c in &report.corrupt {
            println!("corrupt {c}");
        }
        for q in &report.quarantined {
            println!("quarantined {q}");
        }
        for s in &report.stray {
            println!("stray {s}");
        }
        if !report.corrupt.is_empty() && !args.repair {
            println!(
                "run `tender fsck --repair` (with the server stopped, or with --server) to move corrupt objects to quarantine/"
            );
        }
    }
    Ok(if report.corrupt.is_empty() || args.repair { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `tender gc --bucket`: bring every byte under the bucket's prefix within the cap: strays older
/// than `gcGrace` first, then the least recently served objects.
/// Needs no lock: an object under a live fill lease or served within `gcGrace` stays, and an
/// eviction hides the index before the content goes.
fn gc_bucket(args: &GcArgs, max_size: Option<u64>) -> Result<ExitCode> {
    let (name, raw) = tender_config::read(args.config.as_deref()).map_err(|e| Failure::usage(e.to_string()))?;
    let s = tender_config::resolve(&name, raw, &tender_config::Overrides::default())
        .map_err(|e| Failure::usage(e.to_string()))?;
    let Some(settings) = s.storage else {
        return Err(Failure::usage(format!("{name} has no storage.s3 section; --bucket caps that bucket")));
    };
    let Some(cap) = max_size.or(settings.max_size) else {
        return Err(Failure::usage(format!(
            "no size cap for the bucket: pass --max-size or set storage.s3.maxSize in {name}"
        )));
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = rt.block_on(async {
        let bucket = tender_bucket::Bucket::new(settings, tender_bucket::BucketMetrics::default())
            .map_err(|e| Failure::usage(e.to_string()))?;
        bucket.gc(cap, args.dry_run).await.map_err(|e| Failure::transient(e.to_string()))
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if report.dry_run { "would remove" } else { "removed" };
    for st in report.strays.iter().filter(|st| report.dry_run || st.removed) {
        println!(
            "{verb} stray {} ({} objects, {} bytes, written {} s ago; no index or upload names it)",
            st.key, st.objects, st.bytes, st.age_secs
        );
    }
    let verb = if report.dry_run { "would evict" } else { "evicted" };
    for e in &report.evicted {
        println!("{verb} {} ({} bytes, last served {})", e.digest, e.size, e.last_served);
    }
    if report.skipped_under_lease > 0 || report.skipped_recent > 0 {
        println!(
            "kept {} objects under a live fill lease and {} served within storage.s3.gcGrace",
            report.skipped_under_lease, report.skipped_recent
        );
    }
    println!(
        "bucket {}: holds {} bytes: content of {} objects {}, uploads in progress {}, strays {}, quarantine {}, records {}",
        report.bucket,
        report.total_bytes_before,
        report.objects_before,
        report.content_bytes,
        report.in_progress_bytes,
        report.stray_bytes,
        report.quarantine_bytes,
        report.record_bytes
    );
    let removed = report.strays.iter().filter(|st| report.dry_run || st.removed).count();
    println!(
        "bucket {}: {} {} bytes from {} objects and {removed} strays; {} bytes before, {} bytes after (cap {} bytes); \
         {} objects, {} bytes of content after",
        report.bucket,
        if report.dry_run { "would free" } else { "freed" },
        report.freed_bytes(),
        report.evicted.len(),
        report.total_bytes_before,
        report.total_bytes_after,
        report.max_size,
        report.objects_after,
        report.bytes_after
    );
    if report.total_bytes_after > report.max_size {
        println!(
            "bucket {}: still over the cap by {} bytes (objects under a lease or within gcGrace, uploads in progress, \
             quarantine and records are kept)",
            report.bucket,
            report.total_bytes_after - report.max_size
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn gc(args: GcArgs) -> Result<ExitCode> {
    let max_size = match &args.max_size {
        Some(s) => Some(tender_config::parse_size(s).ok_or_else(|| {
            Failure::usage(format!("--max-size {s:?} is not a size; write it like 500Gi, 100G or 1073741824"))
        })?),
        None => None,
    };
    if args.bucket {
        return gc_bucket(&args, max_size);
    }
    if let Some(server) = &server_or_env(&args.server, args.data.is_some() || args.config.is_some()) {
        let mut q = format!("/api/v1/admin/gc?dryRun={}", args.dry_run);
        if let Some(m) = max_size {
            q.push_str(&format!("&maxSize={m}"));
        }
        let v = admin_post(server, &args.client, &q)?;
        let plan: GcPlan = serde_json::from_value(v["plan"].clone())
            .map_err(|e| Failure::problem(format!("{server}: not a gc plan: {e}")))?;
        let report: Option<GcReport> = serde_json::from_value(v["report"].clone())
            .map_err(|e| Failure::problem(format!("{server}: not a gc report: {e}")))?;
        print_gc(&plan, report.as_ref(), args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.client.is_set() {
        return Err(Failure::usage("client options (--ca, --token-file, ...) need --server"));
    }
    let (dir, cfg_cap) = data_dir(&args.data, &args.config)?;
    let cap = max_size.or(cfg_cap);
    let store = open(&dir, if args.dry_run { OpenMode::ReadOnly } else { OpenMode::Exclusive })?;
    // No server holds the directory (the lock says so), so every spool file is an orphan.
    let pins = store.pins().map_err(|e| Failure::problem(e.to_string()))?;
    let plan =
        store.gc_plan(cap, Duration::ZERO, &|d| pins.contains(d)).map_err(|e| Failure::problem(e.to_string()))?;
    let report =
        if args.dry_run { None } else { Some(store.gc_apply(&plan).map_err(|e| Failure::problem(e.to_string()))?) };
    print_gc(&plan, report.as_ref(), args.json)?;
    Ok(ExitCode::SUCCESS)
}

/// The plan of a dry run, or what a run freed (as JSON: `{"plan": …, "report": …}`, the
/// report `null` in a dry run).
fn print_gc(plan: &GcPlan, report: Option<&GcReport>, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "plan": plan, "report": report }))?);
        return Ok(());
    }
    match report {
        None => {
            for o in &plan.evict {
                println!("would evict {} ({} bytes)", o.digest, o.size);
            }
            for o in &plan.orphans {
                println!("would remove orphan {}", o.display());
            }
            println!(
                "would free {} bytes from {} objects ({} of them, {} bytes, retired by bundle rm or tag rm); store holds {} bytes",
                plan.evict_bytes,
                plan.evict.len(),
                plan.retired,
                plan.retired_bytes,
                plan.total_bytes
            );
        }
        Some(r) => println!(
            "freed {} bytes: {} objects evicted ({} retired), {} orphans removed; store holds {} bytes",
            r.freed_bytes,
            r.evicted,
            plan.retired,
            r.orphans_removed,
            plan.total_bytes - r.freed_bytes
        ),
    }
    Ok(())
}
