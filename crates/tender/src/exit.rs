//! The exit code of a failed command. The convention (and the error that carries a class) is
//! `tender_client::exit`'s, shared by every command.

use std::process::ExitCode;

pub use tender_client::exit::{Class, Failure};

/// The exit code for an error chain: the first `Failure` found decides, otherwise 1.
pub fn code_for(err: &anyhow::Error) -> ExitCode {
    let class = err.chain().find_map(|e| e.downcast_ref::<Failure>().map(|f| f.class)).unwrap_or(Class::Problem);
    ExitCode::from(class.code())
}
