//! `tender fsck` and `tender gc`: store maintenance from the command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tender_store::{OpenMode, Store};

use crate::config;
use crate::exit::Failure;

#[derive(Debug, clap::Args)]
pub struct FsckArgs {
    /// Data directory [default: from --config, else ./tender-data]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Config file naming the data directory
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Move objects that fail verification to quarantine/ (needs the data directory to itself)
    #[arg(long)]
    pub repair: bool,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
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
}

fn data_dir(data: &Option<PathBuf>, cfg: &Option<PathBuf>) -> anyhow::Result<(PathBuf, Option<u64>)> {
    let (name, raw) = config::read(cfg.as_deref()).map_err(|e| Failure::usage(e.to_string()))?;
    let o = config::Overrides { data: data.clone(), ..config::Overrides::default() };
    let s = config::resolve(&name, raw, &o).map_err(|e| Failure::usage(e.to_string()))?;
    Ok((s.data, s.cache_max_size))
}

fn open(dir: &std::path::Path, mode: OpenMode) -> anyhow::Result<Store> {
    if !dir.join("tender-data.json").exists() {
        return Err(Failure::usage(format!("{} is not a tender data directory; check --data", dir.display())));
    }
    Store::open(dir, mode).map_err(|e| Failure::problem(e.to_string()))
}

pub fn fsck(args: FsckArgs) -> anyhow::Result<ExitCode> {
    let (dir, _) = data_dir(&args.data, &args.config)?;
    let store = open(&dir, if args.repair { OpenMode::Exclusive } else { OpenMode::ReadOnly })?;
    let report = store.fsck(args.repair).map_err(|e| Failure::problem(e.to_string()))?;
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
            println!("run `tender fsck --repair` (with the server stopped) to move corrupt objects to quarantine/");
        }
    }
    Ok(if report.corrupt.is_empty() || args.repair { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

pub fn gc(args: GcArgs) -> anyhow::Result<ExitCode> {
    let (dir, cfg_cap) = data_dir(&args.data, &args.config)?;
    let cap = match &args.max_size {
        Some(s) => Some(config::parse_size(s).ok_or_else(|| {
            Failure::usage(format!("--max-size {s:?} is not a size; write it like 500Gi, 100G or 1073741824"))
        })?),
        None => cfg_cap,
    };
    let store = open(&dir, if args.dry_run { OpenMode::ReadOnly } else { OpenMode::Exclusive })?;
    // No server holds the directory (the lock says so), so every spool file is an orphan.
    let pins = store.pins().map_err(|e| Failure::problem(e.to_string()))?;
    let plan =
        store.gc_plan(cap, Duration::ZERO, &|d| pins.contains(d)).map_err(|e| Failure::problem(e.to_string()))?;
    let verb = if args.dry_run { "would free" } else { "freed" };
    if args.dry_run {
        for o in &plan.evict {
            println!("would evict {} ({} bytes)", o.digest, o.size);
        }
        for o in &plan.orphans {
            println!("would remove orphan {}", o.display());
        }
        println!(
            "{verb} {} bytes from {} objects; store holds {} bytes",
            plan.evict_bytes,
            plan.evict.len(),
            plan.total_bytes
        );
        return Ok(ExitCode::SUCCESS);
    }
    let report = store.gc_apply(&plan).map_err(|e| Failure::problem(e.to_string()))?;
    println!(
        "{verb} {} bytes: {} objects evicted, {} orphans removed; store holds {} bytes",
        report.freed_bytes,
        report.evicted,
        report.orphans_removed,
        plan.total_bytes - report.freed_bytes
    );
    Ok(ExitCode::SUCCESS)
}
