//! Fill leases: the replica that creates `leases/<sha256(key)>.json` first (S3 conditional
//! create, `If-None-Match: *`) fetches the object from upstream; the others wait for its index.
//! The holder renews the lease every third of its TTL (`If-Match` on the lease's ETag); a
//! lease not renewed within its TTL (the holder died) is taken over by a conditional
//! overwrite, which exactly one waiter wins.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use object_store::path::Path as ObjectPath;
use object_store::{PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use crate::{key_hash, Bucket, BucketError};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LeaseRecord {
    pub key: String,
    pub owner: String,
    /// Milliseconds since the Unix epoch, by the holder's clock.
    pub expires_at: u64,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// What asking for a lease gave.
#[derive(Debug)]
pub enum LeaseOutcome {
    /// This replica fetches; drop or [`Lease::release`] the lease when the object is in the bucket.
    Won(Lease),
    /// Another replica fetches; ask again after `retry_in` (at most until its lease expires).
    /// `owner` is the holder's replica name, empty when not known (the lease changed hands
    /// between this replica's read and its write).
    Held { owner: String, retry_in: Duration },
}

/// A lease this replica holds; a background task renews it until released or dropped.
#[derive(Debug)]
pub struct Lease {
    bucket: Arc<Bucket>,
    key: String,
    path: ObjectPath,
    renewer: tokio::task::JoinHandle<()>,
    /// Set once the lease is no longer this replica's: given up ([`GiveUp`]) or lost.
    gone: Arc<AtomicBool>,
}

/// The right to give a lease up early, from another task than the one holding it: the
/// holder's upload stopped, so the replicas waiting on the lease must not wait on it.
#[derive(Debug, Clone)]
pub struct GiveUp {
    bucket: Arc<Bucket>,
    key: String,
    path: ObjectPath,
    renewer: tokio::task::AbortHandle,
    gone: Arc<AtomicBool>,
}

impl GiveUp {
    /// The fill key the lease is for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Stop renewing the lease and delete it (through the breaker: while the bucket is down the
    /// lease expires by itself within `leaseTtl`, never renewed again). The holder goes on
    /// fetching for its own clients; another replica may take the lease and upload.
    pub async fn give_up(&self, why: &str) {
        if self.gone.swap(true, Ordering::SeqCst) {
            return;
        }
        self.renewer.abort();
        tracing::info!(key = %self.key, why, "gave the fill lease up: the others take it over or fetch themselves");
        delete_lease(&self.bucket, &self.path).await;
    }
}

async fn delete_lease(b: &Bucket, path: &ObjectPath) {
    match b.call("delete", path, b.store.delete(path)).await {
        Ok(Ok(())) | Ok(Err(object_store::Error::NotFound { .. })) => {}
        Ok(Err(e)) => tracing::warn!(lease = %path, error = %e, "could not delete a fill lease; it expires by itself"),
        Err(e) => tracing::debug!(lease = %path, error = %e, "fill lease not deleted; it expires by itself"),
    }
}

impl Lease {
    /// The fill key the lease is for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether this replica still holds the lease (not given up, not lost to a late renewal):
    /// only then may it write the upload record under the lease's key.
    pub fn held(&self) -> bool {
        !self.gone.load(Ordering::SeqCst)
    }

    /// A handle that gives this lease up early ([`GiveUp::give_up`]).
    pub fn give_up_handle(&self) -> GiveUp {
        GiveUp {
            bucket: self.bucket.clone(),
            key: self.key.clone(),
            path: self.path.clone(),
            renewer: self.renewer.abort_handle(),
            gone: self.gone.clone(),
        }
    }

    /// Give the lease up (after the object's index is written, or when the fill failed). A
    /// lease given up or lost already is not deleted again: another replica may hold it now.
    pub async fn release(self) {
        self.renewer.abort();
        if self.gone.swap(true, Ordering::SeqCst) {
            return;
        }
        delete_lease(&self.bucket, &self.path).await;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

impl Bucket {
    pub(crate) fn lease_path(&self, key: &str) -> ObjectPath {
        self.path(&format!("leases/{}.json", key_hash(key)))
    }

    fn lease_record(&self, key: &str) -> LeaseRecord {
        LeaseRecord {
            key: key.to_string(),
            owner: self.settings.replica.clone(),
            expires_at: now_ms() + self.settings.lease_ttl.as_millis() as u64,
        }
    }

    /// Whether a replica holds the lease of `key` now (a record that has not expired). Not
    /// gated by the breaker (fsck's question); bounded by `requestTimeout`.
    pub async fn lease_live(&self, key: &str) -> Result<bool, BucketError> {
        let p = self.lease_path(key);
        Ok(match self.get_json_via::<LeaseRecord>(&p, false).await {
            Ok(Some(r)) => r.expires_at > now_ms(),
            Ok(None) => false,
            // A record that does not parse is held by someone we cannot read: live.
            Err(e) if e.is_corrupt() => true,
            Err(e) => return Err(e),
        })
    }

    /// Write the lease record; the outer error is the breaker's or the deadline's.
    async fn put_lease(
        &self,
        p: &ObjectPath,
        key: &str,
        mode: PutMode,
    ) -> Result<Result<Option<String>, object_store::Error>, BucketError> {
        let body = match serde_json::to_vec(&self.lease_record(key)) {
            Ok(b) => b,
            Err(e) => return Ok(Err(object_store::Error::Generic { store: "lease", source: Box::new(e) })),
        };
        let put = self.store.put_opts(p, PutPayload::from(body), PutOptions { mode, ..PutOptions::default() });
        Ok(self.call("lease", p, put).await?.map(|r| r.e_tag))
    }

    /// Try to become the replica that fetches `key` from upstream.
    pub async fn lease(self: &Arc<Self>, key: &str) -> Result<LeaseOutcome, BucketError> {
        let p = self.lease_path(key);
        match self.put_lease(&p, key, PutMode::Create).await? {
            Ok(etag) => {
                self.metrics.lease("won");
                return Ok(LeaseOutcome::Won(self.hold(p, key, etag)));
            }
            Err(object_store::Error::AlreadyExists { .. }) | Err(object_store::Error::Precondition { .. }) => {}
            Err(e) => return Err(self.store_err("lease", &p, e)),
        }
        // Held by someone: read it; take it over if its holder stopped renewing it.
        let read = async {
            let got = self.store.get(&p).await?;
            let etag = got.meta.e_tag.clone();
            if got.meta.size > crate::RECORD_MAX {
                return Ok((etag, None));
            }
            Ok((etag, Some(got.bytes().await?)))
        };
        let (etag, bytes) = match self.call("lease", &p, read).await? {
            Ok(g) => g,
            // Released between our create and this read: try again at once.
            Err(object_store::Error::NotFound { .. }) => {
                return Ok(LeaseOutcome::Held { owner: String::new(), retry_in: Duration::ZERO })
            }
            Err(e) => return Err(self.store_err("lease", &p, e)),
        };
        // One unreadable (or too long to read) is taken over like an expired one.
        let record: Option<LeaseRecord> = bytes.and_then(|b| serde_json::from_slice(&b).ok());
        let (owner, expires_at) = record.map(|r| (r.owner, r.expires_at)).unwrap_or_default();
        let now = now_ms();
        if expires_at > now {
            self.metrics.lease("waited");
            let left = Duration::from_millis(expires_at - now);
            return Ok(LeaseOutcome::Held { owner, retry_in: left.min(Duration::from_millis(500)) });
        }
        let mode = PutMode::Update(UpdateVersion { e_tag: etag, version: None });
        match self.put_lease(&p, key, mode).await? {
            Ok(etag) => {
                tracing::warn!(key, previous = %owner, "took over an expired fill lease (its replica stopped renewing it)");
                self.metrics.lease("taken_over");
                Ok(LeaseOutcome::Won(self.hold(p, key, etag)))
            }
            // Another waiter took it over first (who is not known here: not the expired
            // holder), or it was released.
            Err(object_store::Error::Precondition { .. }) | Err(object_store::Error::AlreadyExists { .. }) => {
                Ok(LeaseOutcome::Held { owner: String::new(), retry_in: Duration::from_millis(200) })
            }
            Err(object_store::Error::NotFound { .. }) => {
                Ok(LeaseOutcome::Held { owner: String::new(), retry_in: Duration::ZERO })
            }
            Err(e) => Err(self.store_err("lease", &p, e)),
        }
    }

    fn hold(self: &Arc<Self>, p: ObjectPath, key: &str, etag: Option<String>) -> Lease {
        let lease_key = key.to_string();
        let (me, path, key) = (self.clone(), p.clone(), key.to_string());
        let every = self.settings.lease_ttl / 3;
        let gone = Arc::new(AtomicBool::new(false));
        let lost = gone.clone();
        let renewer = tokio::spawn(async move {
            let mut etag = etag;
            loop {
                tokio::time::sleep(every).await;
                let mode = PutMode::Update(UpdateVersion { e_tag: etag.clone(), version: None });
                match me.put_lease(&path, &key, mode).await {
                    Ok(Ok(t)) => etag = t,
                    Ok(Err(object_store::Error::Precondition { .. }))
                    | Ok(Err(object_store::Error::NotFound { .. })) => {
                        tracing::warn!(
                            key,
                            "fill lease lost (renewed too late); another replica may fetch this object too"
                        );
                        lost.store(true, Ordering::SeqCst);
                        return;
                    }
                    Ok(Err(e)) => tracing::warn!(key, error = %e, "renewing a fill lease failed; retrying"),
                    Err(e) => tracing::debug!(key, error = %e, "fill lease not renewed; retrying"),
                }
            }
        });
        Lease { bucket: self.clone(), key: lease_key, path: p, renewer, gone }
    }
}
