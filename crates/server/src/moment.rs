//! [`Moment`]: an atomic `Option<Instant>`, for since when a connection's socket or an HTTP/2
//! stream has been stalled (set by the watches in `stall`, read by `conns` and the connection's
//! driver).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A moment as nanoseconds after a base instant, `0` for none (an atomic `Option<Instant>`).
#[derive(Debug)]
pub(crate) struct Moment {
    base: Instant,
    at: AtomicU64,
}

impl Moment {
    pub(crate) fn new() -> Moment {
        Moment { base: Instant::now(), at: AtomicU64::new(0) }
    }

    pub(crate) fn set_now(&self) {
        let n = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
        self.at.store(n, Ordering::Relaxed);
    }

    /// Set to now unless set; whether it was unset.
    pub(crate) fn set_now_if_none(&self) -> bool {
        let unset = self.at.load(Ordering::Relaxed) == 0;
        if unset {
            self.set_now();
        }
        unset
    }

    pub(crate) fn clear(&self) {
        if self.at.load(Ordering::Relaxed) != 0 {
            self.at.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn get(&self) -> Option<Instant> {
        match self.at.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.base + Duration::from_nanos(n)),
        }
    }
}
