//! `tender clone`: one worker's system disk from a golden (see `tender_catalog::clone`).
//!
//! Exit codes: 0 made (or already there and left untouched); 1 refused, nothing created;
//! 2 usage; 3 the golden is still importing after `--wait`, or nobody is importing it.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use tender_catalog::clone::{execute, plan, CloneRequest, Plan, Refusal};
use tender_catalog::clones::Format;
use tender_catalog::size::{human, parse_bytes};

use crate::exit::Failure;
use tender_client::local::Location;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    /// A reflink (copy-on-write) clone on the golden's filesystem, grown sparsely
    Raw,
    /// A qcow2 overlay whose backing file is the golden
    Qcow2,
}

#[derive(Debug, Args)]
pub struct CloneArgs {
    /// The golden to clone (a name from `tender catalog ls`)
    golden: String,
    /// The worker's pool, by its exact name
    #[arg(long, value_name = "NAME")]
    pool: String,
    /// The worker's name
    #[arg(long, value_name = "NAME")]
    worker: String,
    /// The disk's virtual size: bytes, or with a unit (20Gi); at least the golden's size
    #[arg(long, value_name = "SIZE")]
    size: String,
    /// Where to create the disk
    #[arg(long, value_name = "PATH")]
    to: PathBuf,
    #[arg(long, value_enum, default_value = "raw")]
    format: FormatArg,
    #[command(flatten)]
    at: Location,
    /// Allow a raw disk to be a full copy when no reflink is possible (another filesystem, or none)
    #[arg(long)]
    allow_copy: bool,
    /// How long to wait for a golden that is still importing
    #[arg(long, value_name = "DURATION", default_value = "30m")]
    wait: String,
    /// Print what would happen; create nothing
    #[arg(long)]
    dry_run: bool,
}

pub fn run(a: CloneArgs) -> anyhow::Result<ExitCode> {
    let size = parse_bytes(&a.size).ok_or_else(|| {
        Failure::usage(format!("--size {:?} is not a size; write it like 20Gi or 21474836480", a.size))
    })?;
    let wait = humantime::parse_duration(a.wait.trim()).map_err(|e| {
        Failure::usage(format!("--wait {:?} is not a duration ({e}); write it like 30s or 10m", a.wait))
    })?;
    let settings = a.at.settings()?;
    let data = settings.data.clone();
    let req = CloneRequest {
        golden: a.golden.clone(),
        pool: a.pool.clone(),
        worker: a.worker.clone(),
        size,
        to: a.to.clone(),
        format: match a.format {
            FormatArg::Raw => Format::Raw,
            FormatArg::Qcow2 => Format::Qcow2,
        },
        allow_copy: a.allow_copy,
        configured: settings.catalog.entry(&a.golden).is_some(),
    };
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last_said = None::<Instant>;
    let planned = loop {
        match plan(&data, &req) {
            Ok(p) => break p,
            Err(r) if r.is_wait() && a.dry_run => {
                println!("would wait up to {} for the import to finish: {r}", humantime::format_duration(wait));
                return Ok(ExitCode::SUCCESS);
            }
            Err(r) if r.is_wait() && started.elapsed() < wait => {
                if last_said.is_none_or(|t| t.elapsed() >= Duration::from_secs(if tty { 1 } else { 5 })) {
                    last_said = Some(Instant::now());
                    let line = format!(
                        "waiting for the import: {r} (waited {}s of --wait {})",
                        started.elapsed().as_secs(),
                        humantime::format_duration(wait)
                    );
                    if tty {
                        eprint!("\r\x1b[2K{line}");
                    } else {
                        eprintln!("{line}");
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(r) => {
                if tty && last_said.is_some() {
                    eprintln!();
                }
                return Err(refusal(r, wait, a.dry_run).into());
            }
        }
    };
    if tty && last_said.is_some() {
        eprintln!();
    }
    if a.dry_run {
        println!("would make {}", planned.describe());
        return Ok(ExitCode::SUCCESS);
    }
    let done = execute(&data, &req, &planned).map_err(|r| refusal(r, wait, false))?;
    match &planned {
        Plan::Exists { .. } => println!("{}", planned.describe()),
        _ => println!(
            "{} cloned from {} for worker {} of pool {}: {} ({}, {})",
            done.record.path.display(),
            req.golden,
            req.worker,
            req.pool,
            done.record.method.as_str(),
            done.record.format.as_str(),
            human(done.record.size)
        ),
    }
    if done.created && !done.tagged {
        eprintln!(
            "note: this filesystem keeps no user xattrs; the clone is recorded in {} only",
            data.join("catalog/clones.json").display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn refusal(r: Refusal, wait: Duration, dry_run: bool) -> Failure {
    let prefix = if dry_run { "would refuse" } else { "refused" };
    match r {
        Refusal::Usage(m) => Failure::usage(m),
        Refusal::NotReady { importer: true, .. } => Failure::transient(format!(
            "{r}, still after --wait {}; fix: wait longer (--wait), or watch `tender catalog ls`",
            humantime::format_duration(wait)
        )),
        Refusal::NotReady { .. } => Failure::transient(r.to_string()),
        Refusal::Io(m) => Failure::problem(format!("clone failed, nothing created: {m}")),
        other => Failure::problem(format!("{prefix}: {other}")),
    }
}
