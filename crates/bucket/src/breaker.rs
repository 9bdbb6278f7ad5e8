//! The bucket's circuit breaker: after one failed or timed-out request the bucket is *down*, and
//! no request path waits on it again: every call is refused at once (the replica serves from its
//! local copy or the upstream) until a background probe ([`crate::Bucket::probe`]) gets through;
//! probes back off from `probeInterval` to [`MAX_BACKOFF_FACTOR`] times it. A breaker that opens
//! again soon after a probe closed it (a bucket that answers the probe's small requests but
//! fails the next real one: a slow bucket) keeps backing off instead of starting afresh.
//!
//! [`Machine`] is the state alone, with the clock passed in, so its tests need no runtime;
//! [`Breaker`] puts it behind a mutex, with a flag for the fast path and the metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::metrics::gauge::Gauge;

use crate::metrics::BucketMetrics;

/// Probes back off up to this many probe intervals.
pub const MAX_BACKOFF_FACTOR: u32 = 16;

/// Why the bucket is down, for `/readyz`, the status page and `tender_bucket_down_cause`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// No answer within `requestTimeout` (a hung server, a black-holed network).
    Timeout,
    /// The connection failed (refused, reset, DNS, TLS).
    Connect,
    /// The bucket refused our credentials (a wrong secret, a missing permission).
    Denied,
    /// Any other error answer (5xx, a malformed reply).
    Error,
    /// A chunk could not be moved within `requestTimeout` while the bucket answered small
    /// requests meanwhile: a slow link or a saturated bucket, not a hung one.
    Slow,
}

impl Cause {
    pub const ALL: [Cause; 5] = [Cause::Timeout, Cause::Connect, Cause::Denied, Cause::Error, Cause::Slow];

    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Timeout => "timeout",
            Cause::Connect => "connect",
            Cause::Denied => "denied",
            Cause::Error => "error",
            Cause::Slow => "slow",
        }
    }

    /// What an object store error says about the bucket: `None` when it is an answer about one
    /// key (absent, already there, a failed precondition), which says the bucket is up.
    pub fn of(e: &object_store::Error) -> Option<Cause> {
        use object_store::Error as E;
        match e {
            E::NotFound { .. } | E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => None,
            E::PermissionDenied { .. } | E::Unauthenticated { .. } => Some(Cause::Denied),
            e => {
                let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
                while let Some(s) = source {
                    if let Some(h) = s.downcast_ref::<object_store::client::HttpError>() {
                        return Some(match h.kind() {
                            object_store::client::HttpErrorKind::Timeout => Cause::Timeout,
                            object_store::client::HttpErrorKind::Connect => Cause::Connect,
                            _ => Cause::Error,
                        });
                    }
                    source = s.source();
                }
                Some(Cause::Error)
            }
        }
    }
}

/// What the breaker says now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketState {
    Up,
    Down { cause: Cause, message: String, since: SystemTime },
}

/// The breaker's state, with the clock passed in.
#[derive(Debug)]
pub struct Machine {
    interval: Duration,
    backoff: Duration,
    next_probe: Instant,
    state: BucketState,
    /// When a probe last closed the breaker.
    closed_at: Option<Instant>,
    /// Why it opened last.
    last_cause: Option<Cause>,
}

impl Machine {
    /// Up until a request fails (the start-up check is the first request).
    pub fn new(interval: Duration, now: Instant) -> Machine {
        let interval = interval.max(Duration::from_millis(10));
        Machine {
            interval,
            backoff: interval,
            next_probe: now,
            state: BucketState::Up,
            closed_at: None,
            last_cause: None,
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    pub fn is_up(&self) -> bool {
        self.state == BucketState::Up
    }

    pub fn state(&self) -> &BucketState {
        &self.state
    }

    /// A request failed: the bucket is down, probed after one interval. Returns whether this
    /// opened the breaker (it was up). Opened again within the current backoff of a probe
    /// closing it (flapping), the next probe waits that backoff and the one after twice as long,
    /// up to the cap, as if the probe had failed; after a longer time up it starts afresh.
    pub fn fail(&mut self, cause: Cause, message: String, now: Instant) -> bool {
        if !self.is_up() {
            return false;
        }
        self.state = BucketState::Down { cause, message, since: SystemTime::now() };
        self.last_cause = Some(cause);
        let flapping = self.closed_at.is_some_and(|t| now.saturating_duration_since(t) < self.backoff);
        if flapping {
            self.next_probe = now + self.backoff;
            self.backoff = (self.backoff * 2).min(self.interval * MAX_BACKOFF_FACTOR);
        } else {
            self.backoff = self.interval;
            self.next_probe = now + self.interval;
        }
        true
    }

    /// Whether the breaker opened again soon after closing, at least once in a row: the
    /// backoff has grown past one interval since the last time the bucket stayed up.
    pub fn is_flapping(&self) -> bool {
        self.backoff > self.interval
    }

    /// Up, but slow: it keeps opening for `slow` right after probes close it (chunks do not
    /// move within `requestTimeout` while small requests do). `/api/v1/health` says
    /// `degraded (slow)`.
    pub fn is_slow(&self) -> bool {
        self.is_up() && self.is_flapping() && self.last_cause == Some(Cause::Slow)
    }

    /// When the next probe is due, while down.
    pub fn next_probe(&self) -> Option<Instant> {
        (!self.is_up()).then_some(self.next_probe)
    }

    /// A probe failed: the next one waits twice as long (at most [`MAX_BACKOFF_FACTOR`]
    /// intervals); the cause is the probe's.
    pub fn probe_failed(&mut self, cause: Cause, message: String, now: Instant) {
        let since = match &self.state {
            BucketState::Down { since, .. } => *since,
            BucketState::Up => SystemTime::now(),
        };
        self.state = BucketState::Down { cause, message, since };
        self.next_probe = now + self.backoff;
        self.backoff = (self.backoff * 2).min(self.interval * MAX_BACKOFF_FACTOR);
    }

    /// A probe got through: up. The backoff starts afresh unless the breaker opens again
    /// within it ([`Machine::fail`]).
    pub fn probe_ok(&mut self, now: Instant) {
        self.state = BucketState::Up;
        self.closed_at = Some(now);
    }
}

/// The shared breaker of one bucket.
#[derive(Debug)]
pub struct Breaker {
    up: AtomicBool,
    machine: Mutex<Machine>,
    up_gauge: Gauge,
    causes: prometheus_client::metrics::family::Family<Vec<(String, String)>, Gauge>,
}

impl Breaker {
    pub fn new(interval: Duration, metrics: &BucketMetrics) -> Breaker {
        let b = Breaker {
            up: AtomicBool::new(true),
            machine: Mutex::new(Machine::new(interval, Instant::now())),
            up_gauge: metrics.up.clone(),
            causes: metrics.down_cause.clone(),
        };
        b.publish(&BucketState::Up);
        b
    }

    /// Whether requests may go to the bucket (the fast path: one atomic load).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    pub fn state(&self) -> BucketState {
        self.machine.lock().map(|m| m.state().clone()).unwrap_or(BucketState::Up)
    }

    /// Open the breaker after a failed request; `true` when it was closed (log it once).
    pub fn fail(&self, cause: Cause, message: String) -> bool {
        let Ok(mut m) = self.machine.lock() else { return false };
        let opened = m.fail(cause, message, Instant::now());
        if opened {
            self.up.store(false, Ordering::Release);
            self.publish(m.state());
        }
        opened
    }

    pub fn interval(&self) -> Duration {
        self.machine.lock().map(|m| m.interval()).unwrap_or(Duration::from_secs(5))
    }

    /// See [`Machine::is_slow`].
    pub fn is_slow(&self) -> bool {
        self.machine.lock().map(|m| m.is_slow()).unwrap_or(false)
    }

    pub(crate) fn next_probe(&self) -> Option<Instant> {
        self.machine.lock().ok().and_then(|m| m.next_probe())
    }

    pub(crate) fn probe_failed(&self, cause: Cause, message: String) {
        if let Ok(mut m) = self.machine.lock() {
            m.probe_failed(cause, message, Instant::now());
            self.publish(m.state());
        }
    }

    /// Close the breaker; `true` when it was open.
    pub(crate) fn probe_ok(&self) -> bool {
        let Ok(mut m) = self.machine.lock() else { return false };
        let was_down = !m.is_up();
        m.probe_ok(Instant::now());
        self.up.store(true, Ordering::Release);
        self.publish(m.state());
        was_down
    }

    fn publish(&self, s: &BucketState) {
        let current = match s {
            BucketState::Up => None,
            BucketState::Down { cause, .. } => Some(*cause),
        };
        self.up_gauge.set(i64::from(current.is_none()));
        for c in Cause::ALL {
            self.causes
                .get_or_create(&vec![("cause".to_string(), c.as_str().to_string())])
                .set(i64::from(current == Some(c)));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic, reason = "tests")]
mod tests {
    use super::*;

    const I: Duration = Duration::from_secs(5);

    fn cause(m: &Machine) -> Option<Cause> {
        match m.state() {
            BucketState::Up => None,
            BucketState::Down { cause, .. } => Some(*cause),
        }
    }

    #[test]
    fn should_start_up_with_no_probe_due() {
        let m = Machine::new(I, Instant::now());
        assert!(m.is_up());
        assert_eq!((cause(&m), m.next_probe()), (None, None));
    }

    #[test]
    fn should_open_on_a_failure_and_probe_after_one_interval() {
        let t0 = Instant::now();
        let mut m = Machine::new(I, t0);
        assert!(m.fail(Cause::Timeout, "hung".into(), t0), "the first failure opens");
        assert_eq!(cause(&m), Some(Cause::Timeout));
        assert_eq!(m.next_probe(), Some(t0 + I));
        // Failures of requests already under way do not push the probe back or change the cause.
        assert!(!m.fail(Cause::Connect, "refused".into(), t0 + I / 2));
        assert_eq!((cause(&m), m.next_probe()), (Some(Cause::Timeout), Some(t0 + I)));
    }

    #[test]
    fn should_back_off_failed_probes_up_to_the_cap_and_start_afresh_once_up() {
        let t0 = Instant::now();
        let mut m = Machine::new(I, t0);
        m.fail(Cause::Connect, "refused".into(), t0);
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..8 {
            m.probe_failed(Cause::Connect, "refused".into(), now);
            let next = m.next_probe().unwrap();
            waits.push((next - now).as_secs());
            now = next;
        }
        assert_eq!(waits, [5, 10, 20, 40, 80, 80, 80, 80]);
        assert_eq!(cause(&m), Some(Cause::Connect));
        m.probe_ok(now);
        assert!(m.is_up());
        // Up for longer than the backoff: afresh.
        let now = now + I * MAX_BACKOFF_FACTOR + I;
        m.fail(Cause::Denied, "wrong secret".into(), now);
        m.probe_failed(Cause::Denied, "wrong secret".into(), now + I);
        assert_eq!(m.next_probe(), Some(now + I + I), "the backoff starts afresh after a long up");
    }

    /// Issue 36 (3): a bucket that answers the probe but fails the next chunk re-opens the
    /// breaker right after it closed: each round waits twice as long, up to the cap, and a
    /// stretch up longer than the backoff starts it afresh.
    #[test]
    fn should_back_off_a_breaker_that_opens_again_right_after_a_probe_closed_it() {
        let t0 = Instant::now();
        let mut m = Machine::new(I, t0);
        assert!(m.fail(Cause::Slow, "chunk".into(), t0));
        let mut now: Instant;
        let mut waits = Vec::new();
        for _ in 0..7 {
            now = m.next_probe().unwrap();
            m.probe_ok(now);
            assert!(m.is_up());
            // The next chunk fails a second later.
            now += Duration::from_secs(1);
            assert!(m.fail(Cause::Slow, "chunk".into(), now));
            waits.push((m.next_probe().unwrap() - now).as_secs());
        }
        assert_eq!(waits, [5, 10, 20, 40, 80, 80, 80]);
        assert!(m.is_flapping());
        assert!(!m.is_slow(), "down now");
        let closed = m.next_probe().unwrap();
        m.probe_ok(closed);
        assert!(m.is_slow(), "up, and it keeps opening for slow");
        let later = closed + I * MAX_BACKOFF_FACTOR + I;
        m.fail(Cause::Slow, "chunk".into(), later);
        assert_eq!(m.next_probe(), Some(later + I), "up longer than the backoff: afresh");
        assert!(!m.is_flapping());
    }

    #[test]
    fn should_keep_the_time_it_went_down_across_failed_probes() {
        let t0 = Instant::now();
        let mut m = Machine::new(I, t0);
        m.fail(Cause::Timeout, "hung".into(), t0);
        let BucketState::Down { since, .. } = m.state().clone() else { panic!("down") };
        m.probe_failed(Cause::Connect, "refused".into(), t0 + I);
        let BucketState::Down { since: after, cause, .. } = m.state().clone() else { panic!("down") };
        assert_eq!((after, cause), (since, Cause::Connect));
    }

    #[test]
    fn should_read_the_cause_from_object_store_errors() {
        use object_store::Error as E;
        let nf = E::NotFound { path: "x".into(), source: "gone".into() };
        assert_eq!(Cause::of(&nf), None);
        let pre = E::Precondition { path: "x".into(), source: "etag".into() };
        assert_eq!(Cause::of(&pre), None);
        let denied = E::PermissionDenied { path: "x".into(), source: "SignatureDoesNotMatch".into() };
        assert_eq!(Cause::of(&denied), Some(Cause::Denied));
        let other = E::Generic { store: "S3", source: "500 Internal Server Error".into() };
        assert_eq!(Cause::of(&other), Some(Cause::Error));
    }
}
