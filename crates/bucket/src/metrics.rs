//! Metrics of the shared bucket. Names are part of tender's interface (README lists them).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

#[derive(Debug, Clone, Default)]
pub struct BucketMetrics {
    /// Objects uploaded, and their bytes.
    pub uploads: Counter,
    pub uploaded_bytes: Counter,
    /// Verified chunk bytes read from the bucket.
    pub read_bytes: Counter,
    /// Chunks or records that did not match their index (never served).
    pub corrupt: Counter,
    /// Failed bucket requests, by operation.
    pub errors: Family<Labels, Counter>,
    /// Fill leases won, lost (another replica fetches), and taken over after expiry.
    pub leases: Family<Labels, Counter>,
}

impl BucketMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register("tender_bucket_uploads", "Objects uploaded to the shared bucket", self.uploads.clone());
        r.register("tender_bucket_uploaded_bytes", "Bytes uploaded to the shared bucket", self.uploaded_bytes.clone());
        r.register(
            "tender_bucket_read_bytes",
            "Verified chunk bytes read from the shared bucket",
            self.read_bytes.clone(),
        );
        r.register("tender_bucket_corrupt", "Bucket chunks or records that failed verification", self.corrupt.clone());
        r.register("tender_bucket_errors", "Failed requests to the shared bucket, by operation", self.errors.clone());
        r.register("tender_bucket_leases", "Fill leases by outcome (won, waited, taken_over)", self.leases.clone());
    }

    pub(crate) fn lease(&self, outcome: &str) {
        self.leases.get_or_create(&vec![("outcome".to_string(), outcome.to_string())]).inc();
    }
}
