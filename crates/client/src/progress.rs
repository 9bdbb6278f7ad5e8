//! The whole run's progress for the commands that move many objects (`prefetch`,
//! `catalog sync`): a total bar (objects, bytes, rate, ETA) on a terminal, a plain line every
//! few seconds and at the end otherwise, nothing with `--quiet`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown: decided once, from `--quiet` and whether stderr is a terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    Bars,
    Lines,
    Quiet,
}

impl Show {
    pub fn choose(quiet: bool) -> Show {
        if quiet {
            Show::Quiet
        } else if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            Show::Bars
        } else {
            Show::Lines
        }
    }

    /// The bars' container (bars only).
    pub fn multi(self) -> Option<MultiProgress> {
        (self == Show::Bars).then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
    }
}

/// Objects and bytes of the whole run, known and done so far.
pub struct Totals {
    what: &'static str,
    objects_known: AtomicU64,
    objects_done: AtomicU64,
    bytes_known: AtomicU64,
    bytes_done: AtomicU64,
    started: Instant,
    bar: Option<ProgressBar>,
    /// Plain lines: the ticker's stop signal.
    stop: Mutex<bool>,
    wake: Condvar,
    ended: AtomicBool,
}

impl Totals {
    /// `what` starts each plain line (`prefetch`, `catalog sync`). The bar is added to `multi`
    /// first, so it stays above the per-item bars.
    pub fn new(what: &'static str, multi: Option<&MultiProgress>) -> Arc<Totals> {
        let bar = multi.map(|m| {
            let style = ProgressStyle::with_template(
                "{prefix} [{bar:30}] {msg} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            let b = m.add(ProgressBar::new(0).with_style(style));
            b.set_prefix("total");
            b
        });
        let t = Arc::new(Totals {
            what,
            objects_known: AtomicU64::new(0),
            objects_done: AtomicU64::new(0),
            bytes_known: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            started: Instant::now(),
            bar,
            stop: Mutex::new(false),
            wake: Condvar::new(),
            ended: AtomicBool::new(false),
        });
        t.redraw();
        t
    }

    pub fn add_objects(&self, n: u64) {
        self.objects_known.fetch_add(n, Ordering::Relaxed);
        self.redraw();
    }

    pub fn object_done(&self) {
        self.objects_done.fetch_add(1, Ordering::Relaxed);
        self.redraw();
    }

    pub fn add_bytes_known(&self, n: u64) {
        let known = self.bytes_known.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        if let Some(b) = &self.bar {
            b.set_length(known);
        }
    }

    pub fn add_bytes_done(&self, n: u64) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// Absolute figures, for a caller that keeps its own sums.
    pub fn set_bytes(&self, done: u64, known: u64) {
        self.bytes_done.store(done, Ordering::Relaxed);
        self.bytes_known.store(known, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.set_length(known);
            b.set_position(done);
        }
    }

    /// The bar's label (`total` unless set).
    pub fn set_prefix(&self, prefix: &'static str) {
        if let Some(b) = &self.bar {
            b.set_prefix(prefix);
        }
    }

    /// Object counts, when any are known (a run of bytes only has none).
    fn objects(&self) -> Option<String> {
        let known = self.objects_known.load(Ordering::Relaxed);
        (known > 0).then(|| format!("{}/{known} objects", self.objects_done.load(Ordering::Relaxed)))
    }

    fn redraw(&self) {
        if self.objects_known.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(b) = &self.bar {
            b.set_message(format!(
                "{}/{} objects",
                self.objects_done.load(Ordering::Relaxed),
                self.objects_known.load(Ordering::Relaxed)
            ));
        }
    }

    /// `prefetch: 3/10 objects, 45.2 MiB of 120 MiB, 12.3 MiB/s, ETA 9s`.
    pub fn line(&self) -> String {
        let (done, known) = (self.bytes_done.load(Ordering::Relaxed), self.bytes_known.load(Ordering::Relaxed));
        let secs = self.started.elapsed().as_secs_f64();
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        let eta = if rate > 0.0 && known > done {
            let left = Duration::from_secs(((known - done) as f64 / rate).ceil() as u64);
            format!(", ETA {}", humantime::format_duration(left))
        } else {
            String::new()
        };
        let objects = self.objects().map(|o| format!("{o}, ")).unwrap_or_default();
        format!(
            "{}: {objects}{} of {}, {}/s{eta}",
            self.what,
            HumanBytes(done),
            HumanBytes(known),
            HumanBytes(rate as u64),
        )
    }

    /// Plain lines: print [`Totals::line`] to stderr every `every` until [`Totals::finish`].
    pub fn spawn_ticker(self: &Arc<Self>, every: Duration) {
        let me = self.clone();
        std::thread::spawn(move || {
            let mut stopped = me.stop.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                let (s, timeout) = me.wake.wait_timeout(stopped, every).unwrap_or_else(|e| e.into_inner());
                stopped = s;
                if *stopped {
                    return;
                }
                if timeout.timed_out() {
                    eprintln!("{}", me.line());
                }
            }
        });
    }

    /// The end of the run: the bar leaves its last state on screen; plain output gets a last
    /// line. Idempotent.
    pub fn finish(&self, show: Show) {
        if self.ended.swap(true, Ordering::Relaxed) {
            return;
        }
        *self.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.wake.notify_all();
        match (&self.bar, show) {
            (Some(b), _) => b.abandon(),
            (None, Show::Lines) => eprintln!("{}", self.line()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_sum_objects_and_bytes_and_estimate_the_rest() {
        let t = Totals::new("prefetch", None);
        t.add_objects(3);
        t.add_bytes_known(3 << 20);
        t.object_done();
        t.add_bytes_done(1 << 20);
        let line = t.line();
        assert!(line.starts_with("prefetch: 1/3 objects, 1.00 MiB of 3.00 MiB, "), "{line}");
        assert!(line.contains("/s"), "{line}");
        t.set_bytes(3 << 20, 3 << 20);
        assert!(!t.line().contains("ETA"), "nothing left: no estimate");
        t.finish(Show::Quiet);
    }
}
