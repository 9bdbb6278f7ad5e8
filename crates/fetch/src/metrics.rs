//! Metrics of the fetch layer. Names are part of tender's interface (README lists them).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Counters shared by every upstream client and fill; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct FetchMetrics {
    /// Requests sent to upstreams (tokens and retries included), by upstream.
    pub upstream_requests: Family<Labels, Counter>,
    /// Upstream failures by upstream and kind.
    pub upstream_errors: Family<Labels, Counter>,
    /// Body bytes received from upstreams, by upstream.
    pub upstream_bytes: Family<Labels, Counter>,
    /// Redirects (and token realms, resolved addresses) refused by the address policy.
    pub redirects_refused: Family<Labels, Counter>,
    /// Fills started (one per object transfer, however many clients wait), by upstream.
    pub fills_started: Family<Labels, Counter>,
    /// Fills ended, by upstream and result (committed, failed, corrupt).
    pub fills_finished: Family<Labels, Counter>,
    /// Retries of a fill after an error, by upstream.
    pub fill_retries: Family<Labels, Counter>,
    /// Fills running now.
    pub fills_active: Gauge,
    /// Fills waiting for a slot (`limits.maxConcurrentFills`).
    pub fills_waiting: Gauge,
    /// Upstream health (1 up, 0 down) from the last transfer or request outcome.
    pub upstream_up: Family<Labels, Gauge>,
    /// When the upstream last answered (seconds since the Unix epoch), by upstream.
    pub upstream_last_success: Family<Labels, Gauge>,
    /// Tags and listings served stale because their upstream was unreachable, by upstream.
    pub stale_served: Family<Labels, Counter>,
    /// Records (tags, known-in, media types, listings) not written, by kind (`no_space`,
    /// `io`): the requests they belonged to were answered anyway.
    pub store_write_errors: Family<Labels, Counter>,
    /// Signature policy decisions, by result (`verified`, `unsigned`, `invalid`, `mismatch`,
    /// `unavailable`, `denied`).
    pub verifications: Family<Labels, Counter>,
    /// Requests a child tier sent to the upstream itself because no parent answered
    /// (`parent.fallbackToUpstream`), by upstream.
    pub parent_fallbacks: Family<Labels, Counter>,
}

impl FetchMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tender_fills_waiting",
            "Fills waiting for a slot (limits.maxConcurrentFills)",
            self.fills_waiting.clone(),
        );
        registry.register("tender_upstream_requests", "Requests sent to upstreams", self.upstream_requests.clone());
        registry.register("tender_upstream_errors", "Upstream failures by kind", self.upstream_errors.clone());
        registry.register("tender_upstream_bytes", "Body bytes received from upstreams", self.upstream_bytes.clone());
        registry.register(
            "tender_upstream_redirects_refused",
            "Redirects and addresses refused by the address policy",
            self.redirects_refused.clone(),
        );
        registry.register(
            "tender_fills_started",
            "Upstream transfers started (single-flight)",
            self.fills_started.clone(),
        );
        registry.register("tender_fills_finished", "Upstream transfers ended, by result", self.fills_finished.clone());
        registry.register("tender_fill_retries", "Fill retries after upstream errors", self.fill_retries.clone());
        registry.register("tender_fills_active", "Upstream transfers in progress", self.fills_active.clone());
        registry.register(
            "tender_upstream_up",
            "1 when the upstream's last outcome was healthy",
            self.upstream_up.clone(),
        );
        registry.register(
            "tender_upstream_last_success_timestamp_seconds",
            "When the upstream last answered usably (Unix seconds)",
            self.upstream_last_success.clone(),
        );
        registry.register(
            "tender_stale_served",
            "Tags and listings served stale because their upstream was unreachable",
            self.stale_served.clone(),
        );
        registry.register(
            "tender_store_write_errors",
            "Records not written (kind: no_space, io); their requests were answered anyway",
            self.store_write_errors.clone(),
        );
        registry.register(
            "tender_verifications",
            "Signature policy decisions on manifests, by result",
            self.verifications.clone(),
        );
        registry.register(
            "tender_parent_fallbacks",
            "Requests sent to the upstream itself because no parent answered (parent.fallbackToUpstream)",
            self.parent_fallbacks.clone(),
        );
    }
}

pub(crate) fn upstream_label(upstream: &str) -> Labels {
    vec![("upstream".to_string(), upstream.to_string())]
}
