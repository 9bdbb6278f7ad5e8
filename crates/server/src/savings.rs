//! What tender saves (issue 20, item 8): per upstream, the bytes it fetched from the upstream
//! against the bytes it served to workers, and both over the last 24 hours in 15-minute
//! buckets. Kept across restarts inside the served statistics' file.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// One bucket of the chart.
pub const BUCKET_SECS: u64 = 900;
/// How far back the chart goes.
pub const WINDOW_SECS: u64 = 24 * 3600;

/// One 15-minute bucket: bytes fetched from upstreams and served to workers in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Start, seconds since the Unix epoch.
    pub at: u64,
    pub fetched: u64,
    pub served: u64,
}

/// The savings record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Savings {
    /// Bytes received from each upstream, over every run of this data directory.
    pub fetched: BTreeMap<String, u64>,
    /// The last 24 hours, oldest first.
    pub buckets: VecDeque<Bucket>,
    /// What the earlier runs had fetched (this run's counters start at zero).
    #[serde(skip)]
    before: BTreeMap<String, u64>,
    /// Totals at the last tick (fetched, served), to turn totals into per-bucket amounts.
    #[serde(skip)]
    last: (u64, u64),
}

impl Savings {
    /// After a load: what is saved is what earlier runs did, `served_total` the bytes they
    /// served; the first tick counts only what came since.
    pub fn loaded(mut self, served_total: u64) -> Savings {
        self.before = self.fetched.clone();
        self.last = (self.fetched.values().fold(0u64, |a, b| a.saturating_add(*b)), served_total);
        self
    }

    /// Take this run's per-upstream counters (bytes received since start) and the total served
    /// so far (which survives restarts), and put what changed since the last tick into the
    /// bucket of `now`.
    pub fn tick(&mut self, now: u64, counters: &BTreeMap<String, u64>, served_total: u64) {
        for (up, n) in counters {
            let before = self.before.get(up).copied().unwrap_or(0);
            self.fetched.insert(up.clone(), before.saturating_add(*n));
        }
        let fetched_total = self.fetched.values().fold(0u64, |a, b| a.saturating_add(*b));
        let (last_f, last_s) = self.last;
        self.last = (fetched_total, served_total);
        let (df, ds) = (fetched_total.saturating_sub(last_f), served_total.saturating_sub(last_s));
        let at = now - now % BUCKET_SECS;
        match self.buckets.back_mut() {
            Some(b) if b.at == at => {
                b.fetched = b.fetched.saturating_add(df);
                b.served = b.served.saturating_add(ds);
            }
            _ => self.buckets.push_back(Bucket { at, fetched: df, served: ds }),
        }
        let oldest = at.saturating_sub(WINDOW_SECS - BUCKET_SECS);
        while self.buckets.front().is_some_and(|b| b.at < oldest) {
            self.buckets.pop_front();
        }
    }
}

/// `served / fetched` as `12.5×` (`—` before anything was fetched).
pub fn ratio(fetched: u64, served: u64) -> String {
    if fetched == 0 {
        return "—".to_string();
    }
    format!("{:.1}×", served as f64 / fetched as f64)
}

/// The last 24 hours as an inline SVG bar chart: per 15 minutes, bytes fetched from upstreams
/// (dark) beside bytes served (light), on one scale. No script.
pub fn chart(buckets: &VecDeque<Bucket>, now: u64, human: impl Fn(u64) -> String) -> String {
    const W: u64 = 960;
    const H: u64 = 160;
    let n = WINDOW_SECS / BUCKET_SECS;
    let last = now - now % BUCKET_SECS;
    let first = last.saturating_sub(WINDOW_SECS - BUCKET_SECS);
    let max = buckets.iter().map(|b| b.fetched.max(b.served)).max().unwrap_or(0).max(1);
    let slot = W / n;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg id=\"savings-chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{}\" \
         viewBox=\"0 0 {W} {}\" role=\"img\" aria-label=\"bytes fetched from upstreams and served to workers, last 24 hours\">",
        H + 20,
        H + 20
    );
    let _ = write!(s, "<line x1=\"0\" y1=\"{H}\" x2=\"{W}\" y2=\"{H}\" stroke=\"#999\"/>");
    for b in buckets.iter().filter(|b| b.at >= first && b.at <= last) {
        let i = (b.at - first) / BUCKET_SECS;
        let x = i * slot;
        for (k, (v, color, what)) in
            [(b.fetched, "#1f4e79", "fetched"), (b.served, "#8ab6e0", "served")].iter().enumerate()
        {
            let h = (u128::from(*v) * u128::from(H) / u128::from(max)) as u64;
            if h == 0 {
                continue;
            }
            let _ = write!(
                s,
                "<rect class=\"{what}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{h}\" fill=\"{color}\"><title>{what} {}</title></rect>",
                x + k as u64 * (slot / 2),
                H - h,
                (slot / 2).max(1),
                human(*v)
            );
        }
    }
    let _ = write!(
        s,
        "<text x=\"0\" y=\"{}\" font-size=\"11\">24 h ago</text><text x=\"{W}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\">now</text>\
         <text x=\"4\" y=\"12\" font-size=\"11\">{} per 15 min</text></svg>",
        H + 15,
        H + 15,
        human(max)
    );
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn counters(v: &[(&str, u64)]) -> BTreeMap<String, u64> {
        v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    #[test]
    fn should_bucket_what_changed_and_carry_totals_over_a_restart() {
        let t0 = 1_800_000_000 - 1_800_000_000 % BUCKET_SECS;
        let mut s = Savings::default();
        s.tick(t0, &counters(&[("ghcr.io", 0)]), 0);
        s.tick(t0 + 10, &counters(&[("ghcr.io", 100)]), 300);
        s.tick(t0 + BUCKET_SECS + 5, &counters(&[("ghcr.io", 150)]), 900);
        assert_eq!(s.fetched["ghcr.io"], 150);
        let b: Vec<_> = s.buckets.iter().copied().collect();
        assert_eq!(
            b,
            [Bucket { at: t0, fetched: 100, served: 300 }, Bucket { at: t0 + BUCKET_SECS, fetched: 50, served: 600 }]
        );
        // A restart: counters start again at zero, the totals go on.
        let json = serde_json::to_string(&s).unwrap();
        let mut r: Savings = serde_json::from_str::<Savings>(&json).unwrap().loaded(900);
        r.tick(t0 + BUCKET_SECS + 60, &counters(&[("ghcr.io", 0)]), 900);
        r.tick(t0 + BUCKET_SECS + 70, &counters(&[("ghcr.io", 10)]), 1000);
        assert_eq!(r.fetched["ghcr.io"], 160);
        assert_eq!(r.buckets.back().copied(), Some(Bucket { at: t0 + BUCKET_SECS, fetched: 60, served: 700 }));
        // A day later the old buckets are gone.
        r.tick(t0 + WINDOW_SECS, &counters(&[("ghcr.io", 10)]), 1000);
        assert_eq!(r.buckets.len(), 2, "{:?}", r.buckets);
        assert_eq!(r.buckets.front().unwrap().at, t0 + BUCKET_SECS);
        assert_eq!(ratio(160, 1000), "6.2×");
        assert_eq!(ratio(0, 5), "—");
        let svg = chart(&r.buckets, t0 + WINDOW_SECS, |n| n.to_string());
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>") && svg.contains("class=\"served\""), "{svg}");
    }
}
