//! A fill's owner task: with a shared bucket, copy what another replica committed, follow its
//! upload in progress, or fetch under the lease; then transfer (with retries), verify and
//! commit, once more from zero on a mismatch; and the outcome, for readers, metrics and the
//! bucket. A fill nobody waits for any more is abandoned.

use std::sync::Arc;
use std::time::Instant;

use tender_oci::Digest;
use tender_store::SpoolWriter;

use super::commit::stream_check;
use super::fill::{Fill, Phase};
use super::registry::Flights;
use super::upload::spawn_streamer;
use crate::error::{FetchError, FetchErrorKind};
use crate::expect::{Expect, Source};
use crate::metrics::upstream_label;
use crate::shared::{self, BucketSource, Plan};

impl Flights {
    /// The owner task: transfer with retries, verify, commit; one restart from zero on a
    /// mismatch.
    pub(super) async fn run(
        self: Arc<Self>,
        mut fill: Arc<Fill>,
        mut writer: SpoolWriter,
        mut expect: Expect,
        mut source: Arc<dyn Source>,
    ) {
        let origin = (source.clone(), expect.clone());
        // The upstream the object is known in once this fill commits (registry objects).
        let known_in = match &expect {
            Expect::Digest(_) => Some(source.upstream().to_string()),
            Expect::Tofu { .. } => None,
        };
        let grace = self.settings.abandoned_fill_grace;
        let _slots = tokio::select! {
            s = self.take_slots(&fill, source.upstream()) => s,
            () = abandoned(&fill, grace) => {
                self.abandon(&fill, source.upstream(), "waiting for a slot");
                return;
            }
        };
        let deadline = crate::later(self.settings.fill_deadline);
        // With a shared bucket: copy what another replica committed, or wait for the replica
        // holding the lease, or fetch (holding it ourselves).
        let mut lease = None;
        // Copying from the bucket: the digest (not yet known when following an asset's
        // upload), and an asset's trust record.
        let mut from_bucket: Option<(Option<Digest>, Option<tender_store::TrustRecord>)> = None;
        let mut streamer = None;
        // Reading another replica's upload in progress (its lease holder may die): its id and
        // the replica doing it.
        let mut following: Option<(String, String)> = None;
        if let Some(bucket) = &self.shared {
            match shared::plan(bucket, &self.store, &fill.key, &expect, known_in.as_deref(), deadline).await {
                Plan::Bucket(found) if self.bucket_too_slow(bucket, source.upstream(), found.index.size) => {
                    // Fetched from the upstream as if the bucket did not hold it (no lease:
                    // the bucket has it already).
                    let gated = self.gated(&expect, false);
                    fill.state.send_modify(|s| s.gated = gated);
                }
                Plan::Bucket(found) => {
                    expect = Expect::Digest(found.digest);
                    from_bucket = Some((Some(found.digest), found.trust.clone()));
                    let label = shared::source_label(bucket);
                    source = Arc::new(BucketSource { bucket: bucket.clone(), label, object: found });
                    fill.state.send_modify(|s| s.gated = false);
                }
                Plan::Follow(finished, progress) => {
                    from_bucket = Some((finished.digest(), None));
                    following = Some((progress.upload.clone(), progress.replica.clone()));
                    let label = shared::source_label(bucket);
                    let key = fill.key.clone();
                    source = Arc::new(shared::FollowSource { bucket: bucket.clone(), label, key, finished, progress });
                    // An asset refilled against its trust record waits for its verdict here
                    // as it would from the factory.
                    let gated = self.gated(&expect, false);
                    fill.state.send_modify(|s| s.gated = gated);
                }
                Plan::Upstream(l) => {
                    if let Some(held) = &l {
                        // Replicas waiting on the lease read the chunks as they land.
                        let digest = self.known_digest(&expect);
                        streamer = Some(spawn_streamer(bucket.clone(), fill.clone(), digest, held.give_up_handle()));
                    }
                    lease = l;
                    // The bucket's trust record (now local too) gates a refill from upstream.
                    let gated = self.gated(&expect, false);
                    fill.state.send_modify(|s| s.gated = gated);
                }
            }
        }
        let mut upstream = source.upstream().to_string();
        self.metrics.fills_started.get_or_create(&upstream_label(&upstream)).inc();
        tracing::info!(%upstream, key = %fill.key, id = %fill.info.id, path = %fill.info.path, "fill started");
        let mut restarted = false;
        // The fill changed source mid-way (its pace is no source's alone).
        let mut switched = false;
        let mut bucket_copy_bad = false;
        // A bucket copy broke off for want of content, not for bad bytes: heal after the commit.
        let mut heal = false;
        let outcome = loop {
            let mut check = stream_check(&expect, &writer, self.settings.max_decoded_size);
            let result = tokio::select! {
                r = self.transfer_with_retries(&fill, &mut writer, source.as_ref(), deadline, &mut check) => r,
                () = abandoned(&fill, grace) => {
                    drop(check);
                    // The spool stays: a later claim resumes it.
                    drop(writer);
                    self.abandon(&fill, &upstream, "transferring");
                    if let Some(l) = lease.take() {
                        l.release().await;
                    }
                    return;
                }
            };
            // A failure while copying (not the final check): the bytes written so far passed
            // their chunk checks.
            let mid_copy = result.is_err();
            let verdict = match result {
                Ok(()) => {
                    let total = fill.state.borrow().total;
                    let checked = match check {
                        Some(c) => Some(c.finish().await),
                        None => None,
                    };
                    self.verify_and_commit(&fill, writer, &expect, &upstream, total, checked, known_in.as_deref()).await
                }
                Err(e) => Err((e, Some(writer))),
            };
            match verdict {
                Ok(digest) => break Ok(digest),
                Err((e, Some(w))) if (e.kind != FetchErrorKind::Corrupt || mid_copy) && from_bucket.is_some() => {
                    // The bucket failed mid-copy (gone, quarantined, unreachable, or a chunk
                    // that fails its check, never written): the bytes so far were verified
                    // chunk by chunk; the upstream continues from there, and the fill's readers
                    // do not notice. A bad copy is replaced after the commit.
                    if e.kind == FetchErrorKind::Corrupt {
                        bucket_copy_bad = true;
                    } else {
                        heal = true;
                    }
                    switched = true;
                    tracing::warn!(key = %fill.key, error = %e, have = w.len(),
                        "copy from the shared bucket failed; continuing from the upstream");
                    if let (Some((Some(digest), _)), Some(bucket)) = (from_bucket.take(), &self.shared) {
                        bucket.forget(&digest);
                    }
                    (source, expect) = origin.clone();
                    if let Some((failed, failed_replica)) = following.take() {
                        // The replica we followed stopped: become the one that fetches (the
                        // lease ran out), so the other waiters follow this fill instead; or
                        // follow whoever took over first.
                        if let Some(bucket) = &self.shared {
                            match shared::take_over(bucket, &fill.key, &failed, &failed_replica).await {
                                shared::TakeOver::Won(l) => {
                                    let digest = self.known_digest(&expect);
                                    let give_up = l.give_up_handle();
                                    streamer = Some(spawn_streamer(bucket.clone(), fill.clone(), digest, give_up));
                                    lease = Some(l);
                                }
                                // Never the upload that just failed (take_over checks).
                                shared::TakeOver::Follow(progress) => {
                                    let finished = shared::Finished::of(&expect);
                                    from_bucket = Some((finished.digest(), None));
                                    following = Some((progress.upload.clone(), progress.replica.clone()));
                                    let label = shared::source_label(bucket);
                                    let key = fill.key.clone();
                                    source = Arc::new(shared::FollowSource {
                                        bucket: bucket.clone(),
                                        label,
                                        key,
                                        finished,
                                        progress,
                                    });
                                }
                                shared::TakeOver::Alone => {}
                            }
                        }
                    }
                    upstream = source.upstream().to_string();
                    self.metrics.fills_started.get_or_create(&upstream_label(&upstream)).inc();
                    let gated = self.gated(&expect, false);
                    fill.state.send_modify(|s| s.gated = gated);
                    writer = w;
                }
                Err((e, w)) if e.kind == FetchErrorKind::Corrupt && !restarted => {
                    // Discard, count, cut readers short, and start once more from zero.
                    restarted = true;
                    tracing::warn!(%upstream, key = %fill.key, error = %e, "fill corrupt: discarding and restarting from zero");
                    self.metrics.fills_finished.get_or_create(&result_label(&upstream, "corrupt")).inc();
                    if let Some(w) = w {
                        w.discard();
                    }
                    fill.fail(e.clone());
                    let fresh = match self.store.create_spool(&fill.key, expect.algorithm()) {
                        Ok(w) => w,
                        Err(se) if se.is_disk_full() => {
                            match self.store.unstored_spool(&fill.key, expect.algorithm()) {
                                Ok(w) => w,
                                Err(se) => {
                                    break Err(FetchError::new(FetchErrorKind::Local, &upstream, se.to_string()))
                                }
                            }
                        }
                        Err(se) => break Err(FetchError::new(FetchErrorKind::Local, &upstream, se.to_string())),
                    };
                    let next = match Fill::new(
                        &fill.key,
                        &fill.object,
                        &fresh,
                        fill.state.borrow().gated,
                        fill.info.again(),
                    ) {
                        Ok(f) => Arc::new(f),
                        Err(e) => {
                            fresh.discard();
                            break Err(FetchError::new(
                                FetchErrorKind::Local,
                                &upstream,
                                format!("opening the spool: {e}"),
                            ));
                        }
                    };
                    if fill.keep.load(std::sync::atomic::Ordering::Relaxed) {
                        next.keep();
                    }
                    if let Ok(mut active) = self.active.lock() {
                        active.insert(fill.key.clone(), next.clone());
                    }
                    fill = next;
                    writer = fresh;
                    if from_bucket.take().is_some() {
                        // The bucket's copy is bad: go to the upstream instead, and put the
                        // verified object over it afterwards.
                        (source, expect) = origin.clone();
                        bucket_copy_bad = true;
                        upstream = source.upstream().to_string();
                        let gated = self.gated(&expect, false);
                        fill.state.send_modify(|s| s.gated = gated);
                        self.metrics.fills_started.get_or_create(&upstream_label(&upstream)).inc();
                    }
                }
                Err((e, w)) => {
                    if let Some(w) = w {
                        // A transient failure keeps the spool for a later resume; wrong bytes do not.
                        if !e.is_retryable() {
                            w.discard();
                        }
                    }
                    break Err(e);
                }
            }
        };
        self.metrics.fills_active.dec();
        let label = upstream_label(&upstream);
        match outcome {
            Ok(digest) if fill.is_pass_through() => {
                // Verified and served, not stored: nothing to commit or publish.
                fill.state.send_modify(|s| s.phase = Phase::PassedThrough(digest));
                self.metrics.fills_finished.get_or_create(&result_label(&upstream, "passed_through")).inc();
                if from_bucket.is_none() {
                    self.metrics.upstream_up.get_or_create(&label).set(1);
                }
                self.finish(&fill);
                let v = fill.view();
                tracing::warn!(%upstream, key = %fill.key, id = %v.id, bytes = v.bytes, clients = v.served,
                    "fill passed through: verified and served, not stored (no room in the data directory)");
                self.ended(&fill, "passed_through", None);
                if let Some(s) = streamer.take() {
                    s.abort();
                }
                if let Some(l) = lease.take() {
                    l.release().await;
                }
            }
            Ok(digest) => {
                self.metrics.fills_finished.get_or_create(&result_label(&upstream, "committed")).inc();
                if from_bucket.is_none() {
                    self.metrics.upstream_up.get_or_create(&label).set(1);
                }
                if let Some(t) = from_bucket.as_ref().and_then(|f| f.1.as_ref()) {
                    if let Err(e) = self.store.trust_put(t) {
                        tracing::warn!(key = %fill.key, error = %e, "could not record the bucket's trust record locally");
                    }
                }
                fill.state.send_modify(|s| s.phase = Phase::Committed(digest));
                self.finish(&fill);
                let v = fill.view();
                if !switched && !restarted {
                    self.paces.note(&upstream, v.bytes, fill.info.began.elapsed());
                }
                let secs = fill.info.began.elapsed().as_secs_f64();
                tracing::info!(%upstream, key = %fill.key, id = %v.id, bytes = v.bytes, seconds = secs,
                    rate = v.rate, retries = v.retries, clients = v.served, "fill finished");
                self.ended(&fill, "committed", None);
                if let (Some(bucket), None) = (&self.shared, &from_bucket) {
                    let trust = match &expect {
                        Expect::Tofu { key, .. } => self.store.trust_get(key).ok().flatten(),
                        Expect::Digest(_) => None,
                    };
                    let path = self.store.object_path(&digest);
                    let known = known_in.clone();
                    let resume = match streamer.take() {
                        Some(s) => s.await.ok().flatten(),
                        None => None,
                    };
                    shared::publish(bucket.clone(), digest, path, trust, known, lease.take(), bucket_copy_bad, resume)
                        .await;
                    if heal && !bucket_copy_bad {
                        crate::heal::spawn(bucket.clone(), digest, self.store.object_path(&digest));
                    }
                }
            }
            Err(e) => {
                let result = if e.kind == FetchErrorKind::Corrupt { "corrupt" } else { "failed" };
                self.metrics.fills_finished.get_or_create(&result_label(&upstream, result)).inc();
                if e.is_upstream_down() {
                    self.metrics.upstream_up.get_or_create(&label).set(0);
                }
                let v = fill.view();
                tracing::warn!(%upstream, key = %fill.key, id = %v.id, bytes = v.bytes, retries = v.retries,
                    clients = v.served, error = %e, "fill failed");
                self.finish(&fill);
                self.ended(&fill, result, Some(e.to_string()));
                fill.fail(e);
                if let Some(l) = lease.take() {
                    l.release().await;
                }
            }
        }
    }

    /// A fill nobody waits for any more: fail it for anyone who comes late (they claim anew)
    /// and free its slots.
    fn abandon(&self, fill: &Arc<Fill>, upstream: &str, when: &str) {
        let grace = self.settings.abandoned_fill_grace;
        let (outcome, error) = if fill.info.is_cancelled() {
            tracing::warn!(%upstream, key = %fill.key, id = %fill.info.id, when, "fill cancelled by an operator");
            (
                "cancelled",
                FetchError::new(
                    FetchErrorKind::Refused,
                    upstream,
                    format!("fill cancelled by an operator (DELETE /api/v1/admin/fills/{})", fill.info.id),
                ),
            )
        } else {
            tracing::info!(%upstream, key = %fill.key, when, grace_ms = grace.as_millis() as u64,
                "fill cancelled: no client has waited for it for the grace period");
            (
                "abandoned",
                FetchError::new(
                    FetchErrorKind::Timeout,
                    upstream,
                    format!("fill cancelled after {grace:?} without a client (limits.abandonedFillGrace)"),
                ),
            )
        };
        self.metrics.fills_active.dec();
        self.metrics.fills_finished.get_or_create(&result_label(upstream, outcome)).inc();
        self.finish(fill);
        self.ended(fill, outcome, Some(error.to_string()));
        fill.fail(error);
    }
}

pub(super) fn result_label(upstream: &str, result: &str) -> Vec<(String, String)> {
    vec![("upstream".to_string(), upstream.to_string()), ("result".to_string(), result.to_string())]
}

/// Resolves once nobody has read or waited for `fill` for `grace` (a fill kept for a prefetch
/// never does). Readers hold a subscription to the fill's state; a client between its claim and
/// its first read has none for a moment, which the grace period covers.
async fn abandoned(fill: &Fill, grace: std::time::Duration) {
    let tick = grace
        .checked_div(4)
        .unwrap_or_default()
        .clamp(std::time::Duration::from_millis(10), std::time::Duration::from_secs(1));
    let mut idle_since: Option<Instant> = None;
    loop {
        if fill.info.is_cancelled() {
            return;
        }
        if fill.keep.load(std::sync::atomic::Ordering::Relaxed) || fill.state.receiver_count() > 0 {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= grace {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            () = fill.info.cancel.notified() => {}
        }
    }
}

impl Flights {
    /// Whether a bucket copy of `size` bytes would be slower than a fetch from `upstream` (both
    /// measured recently, [`crate::pace`]): then the fill goes upstream, and the bucket is
    /// `degraded (slow)` for a while.
    fn bucket_too_slow(&self, bucket: &tender_bucket::Bucket, upstream: &str, size: u64) -> bool {
        let label = shared::source_label(bucket);
        let Some((b, u)) = self.paces.bucket_slower(&label, upstream, size) else { return false };
        bucket.note_slow(crate::pace::FRESH);
        tracing::warn!(bucket = %bucket.name(), %upstream, size, bucket_rate = b as u64, upstream_rate = u as u64,
            "the shared bucket is slower than the upstream for this object; fetching from the upstream");
        true
    }
}
