//! The `tender` binary: commands, configuration and wiring.

mod exit;
mod render_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "tender", version, about = "Fetch every artifact once, serve the fleet locally")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Render Talos, containerd and Kubernetes configuration that points nodes at tender
    Render(render_cmd::RenderArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    let result = match cli.command {
        Command::Render(args) => render_cmd::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("tender: {err:#}");
            exit::code_for(&err)
        }
    }
}
