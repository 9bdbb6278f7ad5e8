//! The exit-code convention shared by every tender command, and the error this crate's commands
//! return.
//!
//! 0 success; 1 a problem found or a request refused; 2 usage or configuration error;
//! 3 a transient failure (could not reach something).

use std::fmt::Display;

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

/// An error that knows its exit class. Its message is the whole story (what failed, and the
/// causes after `: `), so it has no source.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub class: Class,
    pub message: String,
}

/// What this crate's commands return.
pub type Result<T, E = Failure> = std::result::Result<T, E>;

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure { class: Class::Usage, message: message.into() }
    }
    pub fn problem(message: impl Into<String>) -> Failure {
        Failure { class: Class::Problem, message: message.into() }
    }
    pub fn transient(message: impl Into<String>) -> Failure {
        Failure { class: Class::Transient, message: message.into() }
    }
}

/// An error and its sources, each after `: `.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Say what was being done when an error happened: `<what>: <the error and its sources>`. A
/// [`Failure`] keeps its class; any other error is a problem (exit 1).
pub trait Context<T> {
    fn context(self, what: impl Display) -> Result<T>;
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: std::error::Error + 'static> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Display) -> Result<T> {
        self.with_context(|| what)
    }

    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| {
            let e: &(dyn std::error::Error + 'static) = &e;
            let class = e.downcast_ref::<Failure>().map_or(Class::Problem, |f| f.class);
            Failure { class, message: format!("{}: {}", what(), chain(e)) }
        })
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::problem(chain(&e))
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Failure {
        Failure::problem(chain(&e))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_keep_the_class_of_a_failure_and_name_every_cause() {
        let inner: Result<()> = Err(Failure::transient("the server did not answer"));
        let e = inner.context("syncing").unwrap_err();
        assert_eq!((e.class, e.message.as_str()), (Class::Transient, "syncing: the server did not answer"));
        let io = std::io::Error::other(Failure::usage("bad"));
        let e = Err::<(), _>(io).with_context(|| format!("reading {}", "x")).unwrap_err();
        assert_eq!((e.class, e.message.as_str()), (Class::Problem, "reading x: bad"));
    }
}
