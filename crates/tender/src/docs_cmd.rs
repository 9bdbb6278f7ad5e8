//! `tender completions <shell>` and `tender man`: generated from the same clap definition the
//! binary parses, so they cannot drift from it.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::CommandFactory as _;

use crate::exit::Failure;
use crate::Cli;

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write tender.1 and one tender-<command>.1 per command (and sub-command) into this
    /// directory instead of printing tender.1
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub fn completions(args: &CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut cmd = Cli::command();
    // Generated into memory: clap_complete panics when its writer fails.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "tender", &mut script);
    write_out(&script).context("writing the completion script")?;
    Ok(ExitCode::SUCCESS)
}

/// `bytes` to standard output. A reader that stopped reading (`tender completions bash | head`)
/// is no error: what it wanted, it got.
fn write_out(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

pub fn man(args: &ManArgs) -> anyhow::Result<ExitCode> {
    let cmd = Cli::command();
    match &args.out {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd).render(&mut page).context("writing the man page")?;
            write_out(&page).context("writing the man page")?;
        }
        Some(dir) => {
            if !dir.is_dir() {
                return Err(Failure::usage(format!("--out {}: not a directory", dir.display())).into());
            }
            clap_mangen::generate_to(cmd, dir).with_context(|| format!("writing man pages into {}", dir.display()))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

    use super::*;

    #[test]
    fn should_write_a_page_per_command_and_sub_command() {
        let dir = tempfile::tempdir().unwrap();
        man(&ManArgs { out: Some(dir.path().to_path_buf()) }).unwrap();
        for page in ["tender.1", "tender-serve.1", "tender-catalog.1", "tender-catalog-sync.1", "tender-man.1"] {
            let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
            assert!(text.starts_with(".ie") || text.contains(".TH"), "{page} is roff: {text:.80}");
        }
        let serve = std::fs::read_to_string(dir.path().join("tender-serve.1")).unwrap();
        assert!(serve.contains("\\-\\-listen") || serve.contains("listen"), "serve's page lists its flags");
    }

    #[test]
    fn should_refuse_an_out_that_is_not_a_directory() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let err = man(&ManArgs { out: Some(f.path().to_path_buf()) }).unwrap_err();
        assert_eq!(crate::exit::code_for(&err), ExitCode::from(2));
    }
}
