//! A replica's side of the shared bucket (`storage.s3`): before a fill goes upstream it looks
//! in the bucket, and with leases on it waits for the replica that already fetches; after a
//! fill from upstream commits, its object goes to the bucket for the others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tender_bucket::{Bucket, BucketError, ChunkIndex, Lease, LeaseOutcome};
use tender_oci::Digest;
use tender_store::{Store, TrustRecord};

use crate::error::{FetchError, FetchErrorKind};
use crate::flight::{Expect, Opened, Source};

/// An object the bucket holds, found by digest or by asset key.
#[derive(Debug, Clone)]
pub struct SharedObject {
    pub digest: Digest,
    pub index: Arc<ChunkIndex>,
    /// The asset's trust record, when found by key.
    pub trust: Option<TrustRecord>,
}

/// Where a fill gets its bytes when the bucket is configured.
pub(crate) enum Plan {
    /// Another replica committed it: copy it from the bucket, chunk by chunk, verified.
    Bucket(SharedObject),
    /// Fetch from upstream; holding the lease when one was taken.
    Upstream(Option<Lease>),
}

/// The label a bucket-sourced fill carries in metrics and logs.
pub fn source_label(bucket: &Bucket) -> String {
    format!("bucket:{}", bucket.name())
}

/// A bucket copy's error as a fill sees it. Never retried: gone since its index was read, or
/// down (the bucket client already retried within `requestTimeout`, and the breaker is open
/// now), the fill goes on from the upstream at once; only corrupt bytes are their own kind.
pub(crate) fn fetch_error(bucket: &Bucket, e: BucketError) -> FetchError {
    let kind = if e.is_corrupt() { FetchErrorKind::Corrupt } else { FetchErrorKind::NotFound };
    FetchError::new(kind, &source_label(bucket), e.to_string())
}

/// The object `expect` asks for, if the bucket holds it. With `known_in`, only if the object is
/// known to exist in that upstream (recorded here or in the bucket): a fill for one upstream
/// never hands out a copy that only another upstream's clients may have.
pub async fn lookup(
    bucket: &Bucket,
    store: &Store,
    expect: &Expect,
    known_in: Option<&str>,
) -> Result<Option<SharedObject>, BucketError> {
    let (digest, trust) = match expect {
        Expect::Digest(d) => (*d, None),
        Expect::Tofu { key, .. } => match store.trust_get(key).ok().flatten() {
            Some(t) => (t.digest, Some(t)),
            None => match bucket.trust(key).await? {
                Some(t) => {
                    // Recorded locally too, so a refill from the factory is checked against it.
                    if let Err(e) = store.trust_put(&t) {
                        tracing::warn!(key, error = %e, "could not record the bucket's trust record locally");
                    }
                    (t.digest, Some(t))
                }
                None => return Ok(None),
            },
        },
    };
    if let Some(u) = known_in {
        if !store.is_known_in(&digest, u).unwrap_or(false) && !bucket.is_known(&digest, u).await? {
            return Ok(None);
        }
    }
    Ok(bucket.index(&digest).await?.map(|index| SharedObject { digest, index, trust }))
}

/// Decide where the fill of `key` gets its bytes. Waits (bounded by `deadline`) while another
/// replica holds the lease; a bucket that cannot be reached never blocks a fill: it goes
/// upstream.
pub(crate) async fn plan(
    bucket: &Arc<Bucket>,
    store: &Store,
    key: &str,
    expect: &Expect,
    known_in: Option<&str>,
    deadline: Instant,
) -> Plan {
    let mut waited = false;
    loop {
        match lookup(bucket, store, expect, known_in).await {
            Ok(Some(found)) => return Plan::Bucket(found),
            Ok(None) => {}
            Err(e) if e.is_down() => return Plan::Upstream(None),
            Err(e) => {
                tracing::warn!(key, error = %e, "shared bucket unavailable; fetching from upstream");
                return Plan::Upstream(None);
            }
        }
        if !bucket.lease_enabled() {
            return Plan::Upstream(None);
        }
        match bucket.lease(key).await {
            Ok(LeaseOutcome::Won(lease)) => {
                // The holder may have committed between our look and our lease.
                if waited {
                    if let Ok(Some(found)) = lookup(bucket, store, expect, known_in).await {
                        lease.release().await;
                        return Plan::Bucket(found);
                    }
                }
                return Plan::Upstream(Some(lease));
            }
            Ok(LeaseOutcome::Held { owner, retry_in }) => {
                if !waited {
                    tracing::info!(key, %owner, "another replica fetches this object; waiting for it in the bucket");
                }
                waited = true;
                let pause = retry_in.max(Duration::from_millis(25));
                if crate::later(pause) >= deadline {
                    tracing::warn!(key, %owner, "waited for another replica until the fill deadline; fetching from upstream");
                    return Plan::Upstream(None);
                }
                tokio::time::sleep(pause).await;
            }
            Err(e) if e.is_down() => return Plan::Upstream(None),
            Err(e) => {
                tracing::warn!(key, error = %e, "fill lease unavailable; fetching from upstream");
                return Plan::Upstream(None);
            }
        }
    }
}

/// Upload a committed object (and an asset's trust record, or the upstream a registry object
/// is known in), retrying a few times; then give the lease up (after the known record, so a
/// replica waiting on the lease finds the object usable). `replace`: the bucket's copy failed
/// verification; overwrite it. A failure leaves the object local only: other replicas fetch it
/// themselves.
pub(crate) async fn publish(
    bucket: Arc<Bucket>,
    digest: Digest,
    path: std::path::PathBuf,
    trust: Option<TrustRecord>,
    known_in: Option<String>,
    lease: Option<Lease>,
    replace: bool,
) {
    let mut attempt = 0u32;
    loop {
        attempt = attempt.saturating_add(1);
        let key = lease.as_ref().map(Lease::key);
        let uploaded = if replace {
            bucket.replace(&digest, &path, key).await
        } else {
            bucket.upload_leased(&digest, &path, None, key).await
        };
        let result = match uploaded {
            Ok(_) => match (&trust, &known_in) {
                (Some(t), _) => bucket.put_trust(t).await,
                (None, Some(u)) => bucket.put_known(&digest, u).await,
                (None, None) => Ok(()),
            },
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => break,
            Err(e) if e.is_down() => {
                tracing::info!(%digest, error = %e, "not uploaded to the shared bucket (down); the object stays on this replica only");
                break;
            }
            Err(e) if !e.is_corrupt() && attempt < 4 => {
                let wait = Duration::from_millis(500).saturating_mul(2u32.saturating_pow(attempt));
                tracing::warn!(%digest, attempt, error = %e, "upload to the shared bucket failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(e) => {
                tracing::error!(%digest, error = %e, "upload to the shared bucket failed; the object stays on this replica only");
                break;
            }
        }
    }
    if let Some(l) = lease {
        l.release().await;
    }
}

/// A fill's source that copies a committed object out of the bucket.
pub(crate) struct BucketSource {
    pub bucket: Arc<Bucket>,
    pub label: String,
    pub object: SharedObject,
}

impl Source for BucketSource {
    fn upstream(&self) -> &str {
        &self.label
    }

    fn open(&self, offset: u64) -> BoxFuture<'static, Result<Opened, FetchError>> {
        let (bucket, d, index) = (self.bucket.clone(), self.object.digest, self.object.index.clone());
        async move {
            let total = index.size;
            let b = bucket.clone();
            let body = bucket.read(d, index, offset, total).map(move |r| r.map_err(|e| fetch_error(&b, e))).boxed();
            Ok(Opened { partial: true, total: Some(total), body })
        }
        .boxed()
    }
}
