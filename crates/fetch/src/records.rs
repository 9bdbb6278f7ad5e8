//! Writes of records on a request's path (tags, known-in, manifest media types, listings): a
//! failure never fails a request whose answer tender has verified (issue 41). A full disk must
//! not make a stored, re-confirmed image unpullable by tag: the write is skipped, logged at WARN
//! at most once a minute per kind, and counted in
//! `tender_store_write_errors_total{kind="no_space"|"io"}`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tender_store::StoreError;

/// What kind of record failed to be written, for the log's rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Record {
    Tag,
    Known,
    Meta,
    Manifest,
    Listing,
}

impl Record {
    const ALL: [Record; 5] = [Record::Tag, Record::Known, Record::Meta, Record::Manifest, Record::Listing];

    fn name(self) -> &'static str {
        match self {
            Record::Tag => "tag",
            Record::Known => "known-in",
            Record::Meta => "manifest media type",
            Record::Manifest => "manifest",
            Record::Listing => "listing",
        }
    }
}

/// How often each kind's failure is logged, at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The counter and the log's clock; one per mirror, on its fill registry's `store_write_errors`.
#[derive(Debug, Default)]
pub struct WriteErrors {
    counter: Family<Vec<(String, String)>, Counter>,
    logged: Mutex<[Option<Instant>; 5]>,
}

impl WriteErrors {
    pub fn new(counter: Family<Vec<(String, String)>, Counter>) -> WriteErrors {
        WriteErrors { counter, logged: Mutex::new([None; 5]) }
    }

    /// Take the outcome of a record write: `Ok` either way, the failure counted and logged.
    pub fn keep_going(&self, what: Record, result: Result<(), StoreError>) {
        let Err(e) = result else { return };
        let kind = if is_no_space(&e) { "no_space" } else { "io" };
        self.counter.get_or_create(&vec![("kind".to_string(), kind.to_string())]).inc();
        let i = Record::ALL.iter().position(|r| *r == what).unwrap_or(0);
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged[i].is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            logged[i] = Some(Instant::now());
            tracing::warn!(record = what.name(), error = %e, "record not written; the request is answered anyway (logged once a minute)");
        }
    }
}

/// Whether a write failed for want of space (ENOSPC, or EDQUOT: a quota).
pub fn io_full(io: &std::io::Error) -> bool {
    let full = [rustix::io::Errno::NOSPC.raw_os_error(), rustix::io::Errno::DQUOT.raw_os_error()];
    io.raw_os_error().is_some_and(|n| full.contains(&n)) || io.kind() == std::io::ErrorKind::StorageFull
}

/// Whether a store error is a full file system (ENOSPC, or EDQUOT: a quota).
pub fn is_no_space(e: &StoreError) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<std::io::Error>().is_some_and(io_full) {
            return true;
        }
        cur = err.source();
    }
    false
}
