//! How fast each source delivered its recent fills (issue 36, item 3): the shared bucket
//! (`bucket:<name>`) and each upstream, as bytes per second over a fill's whole time, first
//! byte included. A bucket copy that would be slower than the upstream it stands in for is
//! fetched from the upstream instead ([`Paces::bucket_slower`]).
//!
//! Both sides are measured the same way (a fill's bytes over its seconds), so the comparison
//! is fair whatever the parallelism inside each. Only fills of at least [`MIN_BYTES`] count (a
//! small object's time is its latency). The bucket's figure must be recent ([`FRESH`]): a
//! bucket not used for that long is tried again, which is also how a bucket that got faster
//! is noticed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Fills smaller than this say little about throughput and are not counted.
pub const MIN_BYTES: u64 = 1 << 20;
/// A bucket figure older than this is not trusted to bypass the bucket.
pub const FRESH: Duration = Duration::from_secs(60);
/// The bucket is bypassed only when the upstream is this many times faster (hysteresis).
pub const SLOWER: f64 = 2.0;
/// Weight of the newest fill in the moving average.
const ALPHA: f64 = 0.3;
/// At most this many sources are remembered (one per upstream and the bucket).
const MAX_SOURCES: usize = 256;

#[derive(Debug, Clone, Copy)]
struct Pace {
    /// Bytes per second, moving average.
    rate: f64,
    at: Instant,
}

/// The paces of the sources fills used, by source label.
#[derive(Debug, Default)]
pub struct Paces {
    by_source: Mutex<HashMap<String, Pace>>,
}

impl Paces {
    /// A fill from `source` delivered `bytes` in `elapsed`.
    pub fn note(&self, source: &str, bytes: u64, elapsed: Duration) {
        self.note_at(source, bytes, elapsed, Instant::now());
    }

    fn note_at(&self, source: &str, bytes: u64, elapsed: Duration, now: Instant) {
        let secs = elapsed.as_secs_f64();
        if bytes < MIN_BYTES || secs <= 0.0 {
            return;
        }
        let rate = bytes as f64 / secs;
        let Ok(mut m) = self.by_source.lock() else { return };
        if m.len() >= MAX_SOURCES && !m.contains_key(source) {
            return;
        }
        m.entry(source.to_string())
            .and_modify(|p| {
                p.rate = ALPHA * rate + (1.0 - ALPHA) * p.rate;
                p.at = now;
            })
            .or_insert(Pace { rate, at: now });
    }

    /// The moving average of `source`, bytes per second, and how old its last sample is.
    pub fn rate(&self, source: &str) -> Option<(f64, Duration)> {
        self.rate_at(source, Instant::now())
    }

    fn rate_at(&self, source: &str, now: Instant) -> Option<(f64, Duration)> {
        let m = self.by_source.lock().ok()?;
        m.get(source).map(|p| (p.rate, now.saturating_duration_since(p.at)))
    }

    /// Whether an object of `size` bytes would come faster from `upstream` than from
    /// `bucket`: both measured, the bucket's recently, and the upstream [`SLOWER`] times
    /// faster. Objects under [`MIN_BYTES`] always come from the bucket.
    pub fn bucket_slower(&self, bucket: &str, upstream: &str, size: u64) -> Option<(f64, f64)> {
        self.bucket_slower_at(bucket, upstream, size, Instant::now())
    }

    fn bucket_slower_at(&self, bucket: &str, upstream: &str, size: u64, now: Instant) -> Option<(f64, f64)> {
        if size < MIN_BYTES {
            return None;
        }
        let (b, age) = self.rate_at(bucket, now)?;
        let (u, _) = self.rate_at(upstream, now)?;
        (age <= FRESH && b * SLOWER < u).then_some((b, u))
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, reason = "tests")]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn should_bypass_a_bucket_measured_slower_than_the_upstream_only_while_the_figure_is_fresh() {
        let p = Paces::default();
        let t0 = Instant::now();
        assert_eq!(p.bucket_slower_at("bucket:b", "ghcr.io", 8 * MIB, t0), None, "nothing measured");
        p.note_at("ghcr.io", 64 * MIB, Duration::from_secs(4), t0); // 16 MiB/s
        assert_eq!(p.bucket_slower_at("bucket:b", "ghcr.io", 8 * MIB, t0), None, "the bucket not measured");
        p.note_at("bucket:b", 8 * MIB, Duration::from_secs(8), t0); // 1 MiB/s
        let (b, u) = p.bucket_slower_at("bucket:b", "ghcr.io", 8 * MIB, t0).expect("slower");
        assert_eq!((b as u64, u as u64), (MIB, 16 * MIB));
        assert_eq!(p.bucket_slower_at("bucket:b", "ghcr.io", MIB / 2, t0), None, "a small object: latency");
        assert_eq!(p.bucket_slower_at("bucket:b", "other", 8 * MIB, t0), None, "another upstream, not measured");
        let later = t0 + FRESH + Duration::from_secs(1);
        assert_eq!(p.bucket_slower_at("bucket:b", "ghcr.io", 8 * MIB, later), None, "stale: try the bucket again");
    }

    #[test]
    fn should_need_the_upstream_twice_as_fast_and_follow_the_bucket_getting_faster() {
        let p = Paces::default();
        let t0 = Instant::now();
        p.note_at("up", 10 * MIB, Duration::from_secs(1), t0);
        p.note_at("bucket:b", 6 * MIB, Duration::from_secs(1), t0);
        assert_eq!(p.bucket_slower_at("bucket:b", "up", 8 * MIB, t0), None, "10 vs 6 MiB/s: within the hysteresis");
        p.note_at("bucket:b", MIB, Duration::from_secs(1), t0);
        p.note_at("bucket:b", MIB, Duration::from_secs(1), t0);
        assert!(p.bucket_slower_at("bucket:b", "up", 8 * MIB, t0).is_some(), "a slow bucket");
        for _ in 0..10 {
            p.note_at("bucket:b", 100 * MIB, Duration::from_secs(1), t0);
        }
        assert_eq!(p.bucket_slower_at("bucket:b", "up", 8 * MIB, t0), None, "fast again");
        p.note_at("tiny", 1000, Duration::from_millis(1), t0);
        assert_eq!(p.rate("tiny"), None, "small fills are not counted");
    }
}
