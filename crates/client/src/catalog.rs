//! `tender catalog`: sync, ls, rm, refs and trust, the CLI around `tender-catalog`.
//!
//! Exit codes: 2 for usage and configuration (a bad entry, an edit of an existing golden);
//! 1 for a refusal or a golden that failed; 3 when a failure was transient (the factory or the
//! server could not be reached).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use tender_catalog::api::build_view;
use tender_catalog::clone::{refs, remove_golden, RmRefusal};
use tender_catalog::clones::Registry;
use tender_catalog::size::human;
use tender_catalog::{
    AssetPath, Catalog, CatalogMetrics, CatalogView, GoldenRecord, GoldenView, ImportSettings, Observer, Phase,
    Progress, Stage,
};
use tender_config::{LogFormat, Settings};
use tender_store::{OpenMode, Store, StoreError};

use crate::exit::{Failure, Result};
use crate::local::Location;
use crate::progress::{Show, Totals};

#[derive(Debug, Args)]
pub struct CatalogArgs {
    #[command(subcommand)]
    command: CatalogCommand,
}

#[derive(Debug, Subcommand)]
enum CatalogCommand {
    /// Import every catalog entry once into a raw golden (here, or through a running server)
    Sync(SyncArgs),
    /// Show every golden: phase, virtual size, sha256, directory, age, clones
    Ls(LsArgs),
    /// Delete a golden (refused while qcow2 overlays depend on it; raw clones need --force)
    Rm(RmArgs),
    /// List the worker disks cloned from a golden, flagging those that are gone
    Refs(RefsArgs),
    /// Forget the trusted sha256 of an Image Factory asset
    Trust(TrustArgs),
}

#[derive(Debug, Args)]
struct SyncArgs {
    #[command(flatten)]
    at: Location,
    /// Sync through a running tender (its URL, e.g. http://127.0.0.1:5000) instead of its data
    /// directory [env: TENDER_SERVER, without --config and --data]
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// Try goldens whose import failed again
    #[arg(long)]
    retry_failed: bool,
    /// No progress on stderr (bars or lines); the outcome still goes to stdout
    #[arg(long, short)]
    quiet: bool,
    /// When stderr is not a terminal: how often a progress line for the whole sync is printed
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    progress_interval: Duration,
    /// With --server: TLS trust and the admin token (--token-file)
    #[command(flatten)]
    client: crate::http::ClientArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Debug, Args)]
struct LsArgs {
    #[command(flatten)]
    at: Location,
    #[arg(long, value_enum, default_value = "table")]
    output: Output,
}

#[derive(Debug, Args)]
struct RmArgs {
    #[command(flatten)]
    at: Location,
    /// The golden's name (see `tender catalog ls`)
    golden: String,
    /// Remove it even though raw clones were made from it (they do not need it)
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct RefsArgs {
    #[command(flatten)]
    at: Location,
    /// The golden's name (see `tender catalog ls`)
    golden: String,
    /// Forget the clones whose disks no longer exist
    #[arg(long)]
    prune: bool,
    #[arg(long, value_enum, default_value = "table")]
    output: Output,
}

#[derive(Debug, Args)]
struct TrustArgs {
    #[command(flatten)]
    at: Location,
    /// The asset whose trust record to forget, as <schematic>/<version>/<asset>
    #[arg(long, value_name = "SCHEMATIC/VERSION/ASSET")]
    reset: String,
}

/// How `catalog sync` on a data directory starts `tender serve`'s logging in the config's
/// format (when `TENDER_LOG` is set): the binary owns the process's log setup.
pub type InitLogging = fn(LogFormat);

pub fn run(args: CatalogArgs, init_logging: InitLogging) -> Result<ExitCode> {
    match args.command {
        CatalogCommand::Sync(a) => sync(a, init_logging),
        CatalogCommand::Ls(a) => ls(a),
        CatalogCommand::Rm(a) => rm(a),
        CatalogCommand::Refs(a) => refs_cmd(a),
        CatalogCommand::Trust(a) => trust(a),
    }
}

// ---- helpers ----

fn open_exclusive(settings: &Settings, what: &str) -> Result<Store> {
    crate::datadir::own_files(&settings.data)?;
    let store = Store::open(&settings.data, OpenMode::Exclusive).map_err(|e| match e {
        StoreError::Locked { dir, holder } => {
            Failure::problem(format!("data directory {} is held by a running tender{holder}; {what}", dir.display()))
        }
        other => Failure::problem(other.to_string()),
    })?;
    crate::datadir::close(&settings.data, &crate::datadir::golden_dirs(&settings.catalog))
        .iter()
        .for_each(|p| eprintln!("tender: warning: {p}"));
    Ok(store)
}

fn require_data_dir(settings: &Settings) -> Result<()> {
    if settings.data.join("tender-data.json").exists() {
        crate::datadir::require_owner(&settings.data)
    } else {
        Err(Failure::usage(format!("{} is not a tender data directory; check --data", settings.data.display())))
    }
}

/// `talos-worker-ce4c9805…-v1.13.6`: the schematic cut for bars and tables.
fn short(name: &str) -> String {
    let parts: Vec<&str> = name.splitn(4, '-').collect();
    match parts.as_slice() {
        ["talos", "worker", schematic, rest] if schematic.len() > 12 => {
            format!("talos-worker-{}…-{rest}", &schematic[..8])
        }
        _ => name.to_string(),
    }
}

fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::problem(format!("starting the async runtime: {e}")))
}

/// Progress on stderr: bars (bytes, rate, ETA) and a total bar on a terminal, plain lines
/// otherwise, nothing with `--quiet`.
struct Ui {
    show: Show,
    multi: Option<MultiProgress>,
    bars: Mutex<HashMap<String, (ProgressBar, Stage)>>,
    lines: Mutex<HashMap<String, (Instant, Stage)>>,
    totals: Arc<Totals>,
    /// Each golden's current stage: (bytes done, bytes to do), summed into the totals.
    work: Mutex<HashMap<String, (u64, u64)>>,
}

impl Ui {
    fn new(quiet: bool, interval: Duration) -> Ui {
        let show = Show::choose(quiet);
        let multi = show.multi();
        let totals = Totals::new("catalog sync", multi.as_ref());
        if show == Show::Lines {
            totals.spawn_ticker(interval);
        }
        Ui {
            show,
            multi,
            bars: Mutex::new(HashMap::new()),
            lines: Mutex::new(HashMap::new()),
            totals,
            work: Mutex::new(HashMap::new()),
        }
    }

    /// `n` goldens this sync looks at.
    fn expect(&self, n: usize) {
        self.totals.add_objects(n as u64);
    }

    fn finish(&self) {
        self.totals.finish(self.show);
    }

    fn say(&self, line: &str) {
        if self.show == Show::Quiet {
            return;
        }
        match &self.multi {
            Some(m) => {
                let _ = m.println(line);
            }
            None => eprintln!("{line}"),
        }
    }

    fn show(&self, golden: &str, p: &Progress) {
        let stage = match p.stage {
            Stage::Download => "download",
            Stage::Decompress => "decompress",
        };
        {
            let mut work = self.work.lock().unwrap_or_else(|e| e.into_inner());
            work.insert(golden.to_string(), (p.done, p.total.unwrap_or(p.done)));
            let (done, known) =
                work.values().fold((0u64, 0u64), |a, w| (a.0.saturating_add(w.0), a.1.saturating_add(w.1)));
            self.totals.set_bytes(done, known);
        }
        if self.show == Show::Quiet {
            return;
        }
        if let Some(multi) = &self.multi {
            let mut bars = self.bars.lock().unwrap_or_else(|e| e.into_inner());
            let entry = bars.entry(golden.to_string()).or_insert_with(|| {
                let bar = multi.add(ProgressBar::new(0));
                let style = ProgressStyle::with_template(
                    "{msg:40} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
                bar.set_style(style);
                (bar, p.stage)
            });
            if entry.1 != p.stage {
                entry.1 = p.stage;
                entry.0.reset();
            }
            entry.0.set_message(format!("{} {stage}", short(golden)));
            entry.0.set_length(p.total.unwrap_or(0));
            entry.0.set_position(p.done);
            return;
        }
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let due = match lines.get(golden) {
            Some((at, s)) => *s != p.stage || at.elapsed() >= Duration::from_secs(2),
            None => true,
        };
        if due {
            lines.insert(golden.to_string(), (Instant::now(), p.stage));
            let of = p.total.map(|t| format!(" of {}", human(t))).unwrap_or_default();
            eprintln!("{}: {stage} {}{of} ({:.0}%)", short(golden), human(p.done), p.percent());
        }
    }

    fn done(&self, golden: &str, phase: Phase, detail: &str) {
        self.totals.object_done();
        let bar = self.bars.lock().unwrap_or_else(|e| e.into_inner()).remove(golden);
        if let Some((bar, _)) = bar {
            bar.finish_and_clear();
        }
        self.say(&format!("{}: {phase}{detail}", short(golden)));
    }
}

impl Observer for Ui {
    fn progress(&self, golden: &str, p: &Progress) {
        self.show(golden, p);
    }

    fn retrying(&self, golden: &str, attempt: u32, reason: &str, wait: Duration) {
        self.say(&format!(
            "{}: attempt {attempt} failed: {reason}; retrying in {}",
            short(golden),
            humantime::format_duration(Duration::from_millis(wait.as_millis() as u64))
        ));
    }

    fn finished(&self, golden: &str, r: &GoldenRecord) {
        let detail = match r.phase {
            Phase::Succeeded => format!(
                " ({}, sha256 {})",
                human(r.virtual_size.unwrap_or(0)),
                r.sha256.as_deref().map(|s| &s[..s.len().min(12)]).unwrap_or("?")
            ),
            Phase::Failed => format!(": {}", r.reason.as_deref().unwrap_or("no reason recorded")),
            _ => String::new(),
        };
        self.done(golden, r.phase, &detail);
    }
}

/// Exit code for the managed goldens after a sync: 1 if any failed (3 if every failure was
/// transient).
fn sync_exit(failed: &[(String, String, bool)]) -> ExitCode {
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else if failed.iter().all(|f| f.2) {
        ExitCode::from(3)
    } else {
        ExitCode::from(1)
    }
}

// ---- sync ----

fn sync(a: SyncArgs, init_logging: InitLogging) -> Result<ExitCode> {
    let local = a.at.config.is_some() || a.at.data.is_some();
    if let Some(url) = &crate::http::server_or_env(&a.server, local) {
        let client = a.client.client(&crate::http::ClientOptions {
            user_agent: concat!("tender/", env!("CARGO_PKG_VERSION")),
            headers: &[],
            connect_timeout: Duration::from_secs(10),
            read_timeout: Some(Duration::from_secs(30)),
            admin: true,
        })?;
        let ui = Ui::new(a.quiet, a.progress_interval);
        let r = runtime()?.block_on(sync_remote(url.trim_end_matches('/').to_string(), client, a.retry_failed, &ui));
        ui.finish();
        return r;
    }
    let settings = a.at.settings()?;
    if settings.catalog.entries.is_empty() {
        println!("the config has no catalog.images entries: nothing to import");
        return Ok(ExitCode::SUCCESS);
    }
    let store =
        open_exclusive(&settings, "sync through it with --server URL (its listen address), or stop it and sync again")?;
    if std::env::var_os("TENDER_LOG").is_some() {
        init_logging(settings.log_format);
    }
    runtime()?.block_on(async move {
        let mirror = crate::local::mirror(&settings, Arc::new(store))?;
        let catalog = Catalog::open(
            &settings.data,
            settings.catalog.clone(),
            mirror,
            ImportSettings::from_fetch(&settings.fetch),
            CatalogMetrics::default(),
        )
        .map_err(|e| Failure::usage(e.to_string()))?;
        let ui = Ui::new(a.quiet, a.progress_interval);
        ui.expect(settings.catalog.entries.len());
        let report = catalog.sync(a.retry_failed, &ui).await;
        ui.finish();
        let mut failed = Vec::new();
        for o in &report.outcomes {
            match o.phase {
                Phase::Succeeded if o.imported => println!("{} imported", o.name),
                Phase::Succeeded => println!("{} already imported", o.name),
                Phase::Failed => {
                    let reason = o.reason.clone().unwrap_or_default();
                    let hint = if o.imported { "" } else { " (run with --retry-failed to try again)" };
                    println!("{} Failed: {reason}{hint}", o.name);
                    failed.push((o.name.clone(), reason, o.transient));
                }
                p => println!("{} {p}", o.name),
            }
        }
        Ok(sync_exit(&failed))
    })
}

async fn sync_remote(url: String, client: crate::http::TenderClient, retry_failed: bool, ui: &Ui) -> Result<ExitCode> {
    let post = format!("{url}/api/v1/admin/catalog/sync?retryFailed={retry_failed}");
    let post_url = url::Url::parse(&post).map_err(|e| Failure::usage(format!("--server {url}: {e}")))?;
    let resp = client
        .request(reqwest::Method::POST, post_url.clone())
        .send()
        .await
        .map_err(|e| Failure::transient(format!("{post}: {e}")))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        return Err(crate::http::admin_failure(&post_url, status, &body));
    }
    let get = format!("{url}/api/v1/catalog");
    let mut counted = false;
    loop {
        let get_url = url::Url::parse(&get).map_err(|e| Failure::usage(format!("--server {url}: {e}")))?;
        let view: CatalogView = client
            .request(reqwest::Method::GET, get_url)
            .send()
            .await
            .map_err(|e| Failure::transient(format!("{get}: {e}")))?
            .error_for_status()
            .map_err(|e| Failure::problem(format!("{get}: {e}")))?
            .json()
            .await
            .map_err(|e| Failure::problem(format!("{get}: not a catalog view: {e}")))?;
        if !counted {
            ui.expect(view.goldens.iter().filter(|g| g.entry.is_some()).count());
            counted = true;
        }
        for g in view.goldens.iter().filter(|g| g.entry.is_some()) {
            if g.phase == Phase::ImportInProgress {
                if let Some(p) = &g.progress {
                    ui.show(&g.name, p);
                }
            }
        }
        if view.open().next().is_none() {
            let mut failed = Vec::new();
            for g in view.goldens.iter().filter(|g| g.entry.is_some()) {
                let reason = g.reason.clone().unwrap_or_default();
                let detail = if g.phase == Phase::Failed { format!(": {reason}") } else { String::new() };
                ui.done(&g.name, g.phase, &detail);
                println!("{} {}{detail}", g.name, g.phase);
                if g.phase == Phase::Failed {
                    failed.push((g.name.clone(), reason, g.transient));
                }
            }
            return Ok(sync_exit(&failed));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

// ---- ls ----

fn ls(a: LsArgs) -> Result<ExitCode> {
    let settings = a.at.settings()?;
    require_data_dir(&settings)?;
    let view = build_view(&settings.data, Some(&settings.catalog), &HashMap::new())
        .map_err(|e| Failure::problem(format!("reading the catalog under {}: {e}", settings.data.display())))?;
    match a.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&view)?),
        Output::Table => print_table(&view.goldens),
    }
    Ok(ExitCode::SUCCESS)
}

fn phase_text(g: &GoldenView) -> String {
    match (g.phase, g.percent) {
        (Phase::ImportInProgress, Some(p)) => format!("ImportInProgress {p:.0}%"),
        (p, _) => p.to_string(),
    }
}

fn print_table(goldens: &[GoldenView]) {
    if goldens.is_empty() {
        println!("no goldens: add entries under catalog.images and run `tender catalog sync`");
        return;
    }
    let rows: Vec<[String; 8]> = goldens
        .iter()
        .map(|g| {
            [
                g.name.clone(),
                phase_text(g),
                g.virtual_size.map(human).unwrap_or_else(|| "-".into()),
                g.sha256.as_deref().map(|s| s[..s.len().min(12)].to_string()).unwrap_or_else(|| "-".into()),
                g.dir.display().to_string(),
                age(g.age_seconds),
                g.clones.to_string(),
                g.entry.clone().unwrap_or_else(|| "(not managed)".into()),
            ]
        })
        .collect();
    let header = ["NAME", "PHASE", "SIZE", "SHA256", "DIR", "AGE", "CLONES", "ENTRY"];
    let mut width = header.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(&header.map(String::from));
    for (r, g) in rows.iter().zip(goldens) {
        line(r);
        if let Some(reason) = g.reason.as_deref().filter(|_| g.phase == Phase::Failed) {
            println!("  reason: {reason}");
        }
    }
}

// ---- rm ----

fn rm(a: RmArgs) -> Result<ExitCode> {
    let settings = a.at.settings()?;
    require_data_dir(&settings)?;
    let _store =
        open_exclusive(&settings, "a golden is removed only with the data directory to itself: stop it first")?;
    match remove_golden(&settings.data, &a.golden, a.force) {
        Ok(r) => {
            let file = if r.file_removed { "" } else { " (its file was already gone)" };
            println!("removed golden {} ({}){file}", a.golden, r.golden.display());
            if r.raw_clones_left > 0 {
                println!("{} raw clone(s) remain; they do not need the golden", r.raw_clones_left);
            }
            if let Some(e) = settings.catalog.entry(&a.golden) {
                eprintln!(
                    "note: {} still names this golden, so the next sync imports it again; drop the entry to stop managing it",
                    e.key()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ RmRefusal::Io(_)) => Err(Failure::problem(format!("catalog rm {}: {e}", a.golden))),
        Err(e) => Err(Failure::problem(format!("refused: {e}"))),
    }
}

// ---- refs ----

fn refs_cmd(a: RefsArgs) -> Result<ExitCode> {
    let settings = a.at.settings()?;
    require_data_dir(&settings)?;
    let list = refs(&settings.data, &a.golden).map_err(|e| Failure::problem(format!("the clone registry: {e}")))?;
    match a.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&list)?),
        Output::Table if list.is_empty() => println!("no clones recorded for {}", a.golden),
        Output::Table => {
            println!("PATH\tFORMAT\tMETHOD\tPOOL\tWORKER\tSIZE\tAGE\tSTATUS");
            let now = tender_store::now_secs();
            for r in &list {
                let c = &r.record;
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    c.path.display(),
                    c.format.as_str(),
                    c.method.as_str(),
                    c.pool,
                    c.worker,
                    human(c.size),
                    age(now.saturating_sub(c.created)),
                    if r.exists { "present" } else { "MISSING" }
                );
            }
        }
    }
    let missing = list.iter().filter(|r| !r.exists).count();
    if a.prune {
        let gone = Registry::new(&settings.data)
            .prune(&a.golden)
            .map_err(|e| Failure::problem(format!("pruning the clone registry: {e}")))?;
        println!("forgot {} missing clone(s) of {}", gone.len(), a.golden);
    } else if missing > 0 {
        eprintln!("{missing} clone(s) no longer exist; `tender catalog refs {} --prune` forgets them", a.golden);
    }
    Ok(ExitCode::SUCCESS)
}

// ---- trust ----

fn trust(a: TrustArgs) -> Result<ExitCode> {
    let parts: Vec<&str> = a.reset.split('/').collect();
    let asset = match parts.as_slice() {
        [s, v, x] => AssetPath::new(s, v, x).map_err(|e| Failure::usage(format!("--reset {:?}: {e}", a.reset)))?,
        _ => {
            return Err(Failure::usage(format!(
                "--reset {:?} is not <schematic>/<version>/<asset>, e.g. <schematic>/v1.13.6/openstack-amd64.raw.xz",
                a.reset
            )))
        }
    };
    let settings = a.at.settings()?;
    require_data_dir(&settings)?;
    let store =
        open_exclusive(&settings, "trust records are reset only with the data directory to itself: stop it first")?;
    let key = asset.key();
    match store.trust_reset(&key) {
        Ok(true) => {
            println!("forgot the trusted sha256 of {key}; its next complete fetch is trusted anew");
            Ok(ExitCode::SUCCESS)
        }
        Ok(false) => Err(Failure::problem(format!("no trust record for {key}: nothing to reset"))),
        Err(e) => Err(Failure::problem(e.to_string())),
    }
}
