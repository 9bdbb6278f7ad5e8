//! The exit-code convention shared by every tender command.
//!
//! 0 success; 1 a problem found or a request refused; 2 usage or configuration error;
//! 3 a transient failure (could not reach something).

use std::process::ExitCode;

/// Why a command failed, which decides its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A problem found or a request refused (a rule, a failed check): exit 1.
    Problem,
    /// Usage or configuration error: exit 2.
    Usage,
    /// A transient failure, could not reach something: exit 3.
    Transient,
}

impl Class {
    pub fn code(self) -> u8 {
        match self {
            Class::Problem => 1,
            Class::Usage => 2,
            Class::Transient => 3,
        }
    }
}

/// An error that knows its exit class; anything else in an `anyhow` chain exits 1.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub class: Class,
    pub message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> anyhow::Error {
        Failure { class: Class::Usage, message: message.into() }.into()
    }
    pub fn problem(message: impl Into<String>) -> anyhow::Error {
        Failure { class: Class::Problem, message: message.into() }.into()
    }
    pub fn transient(message: impl Into<String>) -> anyhow::Error {
        Failure { class: Class::Transient, message: message.into() }.into()
    }
}

/// The exit code for an error chain: the first `Failure` found decides, otherwise 1.
pub fn code_for(err: &anyhow::Error) -> ExitCode {
    let class = err.chain().find_map(|e| e.downcast_ref::<Failure>().map(|f| f.class)).unwrap_or(Class::Problem);
    ExitCode::from(class.code())
}
