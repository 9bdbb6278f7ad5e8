//! `tender render`: placeholder wiring, owned by the renderer work.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct RenderArgs {}

pub fn run(_args: RenderArgs) -> anyhow::Result<ExitCode> {
    Err(crate::exit::Failure::usage("tender render: no renderer selected"))
}
