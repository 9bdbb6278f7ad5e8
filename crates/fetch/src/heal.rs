//! The shared bucket's missing chunks put back from this replica's verified copy, off the
//! response path: after a fill whose copy from the bucket broke off (a chunk or the object
//! gone, the bucket down) committed from the upstream, and when a range the bucket could not
//! finish for want of a chunk went on from the local copy. Which chunks are missing, their
//! check against the index and the conditional writes are `Bucket::heal_missing`'s (one heal
//! per object on a replica at a time; every request through the bucket's breaker).

use std::path::PathBuf;
use std::sync::Arc;

use tender_bucket::Bucket;
use tender_oci::Digest;

/// Look for the chunks of `digest` the bucket lacks and put them back from `local`, the
/// committed object, in a task of its own.
pub(crate) fn spawn(bucket: Arc<Bucket>, digest: Digest, local: PathBuf) {
    tokio::spawn(async move {
        match bucket.heal_missing(&digest, &local).await {
            Ok(report) => tracing::debug!(%digest, ?report, "shared bucket checked for missing chunks"),
            Err(e) if e.is_down() => {
                tracing::debug!(%digest, error = %e, "missing chunks not looked for: the shared bucket is down");
            }
            Err(e) => tracing::warn!(%digest, error = %e,
                "missing chunks not re-uploaded to the shared bucket; replicas without a copy fetch them from the upstream"),
        }
    });
}
