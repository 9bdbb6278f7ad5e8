//! The `tender` binary: the commands' arguments and their wiring. `serve`, `render`, `check`,
//! `clone`, `completions` and `man` live here; the client commands are `tender-client`'s, the
//! configuration `tender-config`'s. The only crate that uses anyhow.

/// mimalloc: per-thread free lists without glibc's locks and consolidation, on a request path
/// that allocates for every header, log line and label.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod clone_cmd;
#[cfg(test)]
mod docs_check;
mod docs_cmd;
mod exit;
mod logging;
mod logsink;
mod noise;
mod render_cmd;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tender_client::{catalog, export, import, inventory, maint, prefetch, probe, stats};

/// `tender --version`: the package version, the commit and its date (build.rs).
const VERSION: &str =
    concat!(env!("CARGO_PKG_VERSION"), " (", env!("TENDER_REVISION"), " ", env!("TENDER_COMMIT_DATE"), ")");

#[derive(Debug, Parser)]
#[command(name = "tender", version = VERSION, about = "Fetch every artifact once, serve the fleet locally")]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the pull-through registry mirror and Image Factory cache
    Serve(Box<serve::ServeArgs>),
    /// Re-verify every stored object against its digest
    Fsck(maint::FsckArgs),
    /// Evict least recently used objects down to the size cap and remove orphans
    Gc(maint::GcArgs),
    /// What workers pulled, per repository (served statistics)
    Stats(stats::StatsArgs),
    /// Render Talos, containerd and Kubernetes configuration that points nodes at tender
    Render(render_cmd::RenderArgs),
    /// Check configuration against the rules before it is applied (exit 1 naming rule, field and fix)
    Check(render_cmd::CheckArgs),
    /// The golden image catalog: sync, ls, rm, refs, trust
    Catalog(catalog::CatalogArgs),
    /// Create a worker's system disk from a golden (reflink clone or qcow2 overlay)
    Clone(clone_cmd::CloneArgs),
    /// Decide whether a mirror / image cache is usable from here: yes, no or unknown
    Probe(probe::ProbeArgs),
    /// Warm the cache with images and OS images before workers need them
    Prefetch(Box<prefetch::PrefetchArgs>),
    /// Write images and OS images to one OCI image layout bundle (prefetch's selection), to carry across an air gap
    Export(Box<export::ExportArgs>),
    /// Verify a bundle and register its images and OS images (tags authoritative) in a tender
    Import(Box<import::ImportArgs>),
    /// Bundles: ls, rm (retire an imported release), diff
    Bundle(inventory::BundleArgs),
    /// Tags: rm (an imported tag stops being authoritative; its pins are released)
    Tag(import::TagArgs),
    /// Every image this tender holds: name, platforms, size, pinned, source, last served, signature
    Images(inventory::ImagesArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions(docs_cmd::CompletionsArgs),
    /// Print the man page, or write one per command into a directory
    Man(docs_cmd::ManArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    // tender-client's commands fail with a `Failure` (its exit class); in-process work on a
    // data directory logs as the binary sets it up.
    let client = |r: tender_client::Result<ExitCode>| r.map_err(anyhow::Error::from);
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Fsck(args) => client(maint::fsck(args)),
        Command::Gc(args) => client(maint::gc(args)),
        Command::Render(args) => render_cmd::run(args),
        Command::Check(args) => render_cmd::run_check(args),
        Command::Catalog(args) => client(catalog::run(args, logging::serve)),
        Command::Clone(args) => clone_cmd::run(args),
        Command::Stats(args) => client(stats::run(args)),
        Command::Probe(args) => client(probe::run(args)),
        Command::Prefetch(args) => {
            if args.data.is_some() {
                logging::warnings();
            }
            client(prefetch::run(*args))
        }
        Command::Export(args) => {
            if args.select.data.is_some() {
                logging::warnings();
            }
            client(export::run(*args))
        }
        Command::Import(args) => client(import::run_import(*args)),
        Command::Bundle(args) => client(inventory::run_bundle(args)),
        Command::Tag(args) => client(import::run_tag(args)),
        Command::Images(args) => client(inventory::run_images(args)),
        Command::Completions(args) => docs_cmd::completions(&args),
        Command::Man(args) => docs_cmd::man(&args),
    };
    // Access lines still batched reach the log before the process ends.
    logsink::flush();
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("tender: {err:#}");
            exit::code_for(&err)
        }
    }
}
