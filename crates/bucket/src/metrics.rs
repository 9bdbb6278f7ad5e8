//! Metrics of the shared bucket. Names are part of tender's interface (README lists them).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

#[derive(Debug, Clone, Default)]
pub struct BucketMetrics {
    /// Objects uploaded, and their bytes.
    pub uploads: Counter,
    pub uploaded_bytes: Counter,
    /// Verified chunk and sub-chunk bytes read from the bucket (what was fetched).
    pub read_bytes: Counter,
    /// Chunks or records that did not match their index (never served).
    pub corrupt: Counter,
    /// Failed bucket requests, by operation.
    pub errors: Family<Labels, Counter>,
    /// Fill leases won, lost (another replica fetches), and taken over after expiry.
    pub leases: Family<Labels, Counter>,
    /// 1 while the breaker lets requests through, 0 while the bucket is down.
    pub up: Gauge,
    /// 1 for the cause the bucket is down for (timeout, connect, denied, error), else 0.
    pub down_cause: Family<Labels, Gauge>,
    /// 1 when the last check found conditional writes (fill leases work), 0 when it did not
    /// (the replica runs as with `lease: false`).
    pub conditional_writes: Gauge,
    /// Background probes of a bucket that is down, by result (ok, failed).
    pub probes: Family<Labels, Counter>,
    /// Multipart uploads a dead replica left behind, aborted (by `fsck --repair` or a sweep).
    pub abandoned_uploads_removed: Counter,
    /// Keys nothing names (chunks of uploads no index or record names, stale probe objects,
    /// content without an index), removed by the sweep, `gc --bucket` or `fsck --repair`; one
    /// per upload directory.
    pub strays_removed: Counter,
    /// Chunks missing under their index that this replica put back from its verified copy.
    pub healed_chunks: Counter,
    /// Fills that went to the upstream because the bucket was measured slower than it.
    pub bypassed_slow: Counter,
    /// Indexes whose signature does not hold under this replica's index key (read whole).
    pub unsigned_indexes: Counter,
    /// Bytes copied into this replica's cache without a second hash pass: every chunk was
    /// verified against a signed index that names the object's digest.
    pub vouched_bytes: Counter,
}

impl BucketMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register("tender_bucket_uploads", "Objects uploaded to the shared bucket", self.uploads.clone());
        r.register("tender_bucket_uploaded_bytes", "Bytes uploaded to the shared bucket", self.uploaded_bytes.clone());
        r.register(
            "tender_bucket_read_bytes",
            "Verified chunk and sub-chunk bytes read from the shared bucket",
            self.read_bytes.clone(),
        );
        r.register("tender_bucket_corrupt", "Bucket chunks or records that failed verification", self.corrupt.clone());
        r.register("tender_bucket_errors", "Failed requests to the shared bucket, by operation", self.errors.clone());
        r.register("tender_bucket_leases", "Fill leases by outcome (won, waited, taken_over)", self.leases.clone());
        r.register(
            "tender_bucket_up",
            "1 while the shared bucket answers, 0 while its breaker is open",
            self.up.clone(),
        );
        r.register(
            "tender_bucket_down_cause",
            "1 for the cause the shared bucket is down for (timeout, connect, denied, error)",
            self.down_cause.clone(),
        );
        r.register(
            "tender_bucket_conditional_writes",
            "1 when the last check found conditional writes (fill leases on), 0 when not (leases off)",
            self.conditional_writes.clone(),
        );
        r.register("tender_bucket_probes", "Probes of a shared bucket that is down, by result", self.probes.clone());
        r.register(
            "tender_bucket_abandoned_uploads_removed",
            "Unfinished multipart uploads of dead replicas aborted (fsck --repair or the background sweep)",
            self.abandoned_uploads_removed.clone(),
        );
        r.register(
            "tender_bucket_strays_removed",
            "Bucket keys nothing names removed (chunks of an upload no index or record names, stale probes)",
            self.strays_removed.clone(),
        );
        r.register(
            "tender_bucket_healed_chunks",
            "Chunks missing under their index put back from this replica's verified copy",
            self.healed_chunks.clone(),
        );
        r.register(
            "tender_bucket_bypassed_slow",
            "Fills that went to the upstream because the bucket was measured slower than it",
            self.bypassed_slow.clone(),
        );
        r.register(
            "tender_bucket_unsigned_indexes",
            "Indexes read whose signature does not hold under storage.s3.indexKeyFile (their objects are hashed whole)",
            self.unsigned_indexes.clone(),
        );
        r.register(
            "tender_bucket_vouched_bytes",
            "Bytes copied from the bucket into the cache hashed once: each chunk verified against a signed index",
            self.vouched_bytes.clone(),
        );
    }

    pub(crate) fn probe(&self, result: &str) {
        self.probes.get_or_create(&vec![("result".to_string(), result.to_string())]).inc();
    }

    pub(crate) fn lease(&self, outcome: &str) {
        self.leases.get_or_create(&vec![("outcome".to_string(), outcome.to_string())]).inc();
    }
}
