//! The end of a transfer: check the bytes against what was expected (the digest, the
//! container's own check, an asset's trust record), then make the object durable and visible in
//! the store (or, for a pass-through fill, only release it to its readers).

use std::fs::File;
use std::io;

use tender_oci::Digest;
use tender_store::SpoolWriter;

use super::fill::{Fill, Phase};
use super::registry::Flights;
use crate::container::StreamCheck;
use crate::error::{FetchError, FetchErrorKind};
use crate::expect::Expect;

impl Flights {
    #[allow(clippy::too_many_arguments, reason = "one call site, each argument distinct")]
    pub(super) async fn verify_and_commit(
        &self,
        fill: &Fill,
        writer: SpoolWriter,
        expect: &Expect,
        upstream: &str,
        total: Option<u64>,
        checked: Option<io::Result<u64>>,
        known_in: Option<&str>,
    ) -> Result<Digest, (FetchError, Option<SpoolWriter>)> {
        let err = |kind, m: String| FetchError::new(kind, upstream, m);
        let mut writer = writer;
        // Written unhashed for a source that was to vouch for the digest and did not: hashed
        // now, from the file.
        let vouched = writer.is_deferred() && !writer.owes_hashing();
        if let Err(e) = super::transfer::catch_up(&mut writer).await {
            return Err((err(FetchErrorKind::Local, format!("hashing the spooled bytes: {e}")), Some(writer)));
        }
        let got = match writer.digest_so_far() {
            Ok(d) => d,
            Err(e) => {
                return Err((err(FetchErrorKind::Local, format!("hashing the spooled bytes: {e}")), Some(writer)))
            }
        };
        if vouched {
            if let Some(b) = &self.shared {
                b.metrics().vouched_bytes.inc_by(writer.len());
            }
        }
        let (want, trust) = match expect {
            Expect::Digest(want) => {
                if got != *want {
                    return Err((
                        err(FetchErrorKind::Corrupt, format!("content is {got}, expected {want}")),
                        Some(writer),
                    ));
                }
                (*want, None)
            }
            Expect::Tofu { key, container } => {
                if total.is_none() && !container.has_checksum() {
                    return Err((
                        err(
                            FetchErrorKind::Unverifiable,
                            format!("{key}: no Content-Length and no checksummed container: completeness cannot be established, not stored"),
                        ),
                        Some(writer),
                    ));
                }
                if container.has_checksum() {
                    // Checked while the bytes arrived; a check that could not start (the resumed
                    // prefix unreadable) is done now, over the whole file.
                    let checked = match checked {
                        Some(r) => r,
                        None => {
                            let (path, c, max) =
                                (writer.path().to_path_buf(), *container, self.settings.max_decoded_size);
                            tokio::task::spawn_blocking(move || crate::container::check(&path, c, max))
                                .await
                                .unwrap_or_else(|e| Err(std::io::Error::other(e)))
                        }
                    };
                    if let Err(e) = checked {
                        return Err((
                            err(FetchErrorKind::Corrupt, format!("{key}: {container:?} integrity check failed: {e}")),
                            Some(writer),
                        ));
                    }
                }
                let trusted = self.store.trust_get(key).ok().flatten();
                if let Some(t) = trusted.as_ref().filter(|t| t.digest != got) {
                    return Err((
                        err(
                            FetchErrorKind::Corrupt,
                            format!(
                                "{key}: the upstream now sends {got}, but {} was trusted at its first fetch; refused \
                                 (if the asset was rebuilt on purpose, accept it with `tender catalog trust --reset`)",
                                t.digest
                            ),
                        ),
                        Some(writer),
                    ));
                }
                let record = tender_store::TrustRecord {
                    key: key.clone(),
                    digest: got,
                    size: writer.len(),
                    first_seen: tender_store::now_secs(),
                };
                (got, Some(record))
            }
        };
        fill.state.send_modify(|s| s.phase = Phase::Verified(want));
        if writer.unstored_from().is_some() {
            // Passed through: the readers had every byte, and there is nothing to commit.
            writer.discard();
            if let Some(r) = trust {
                if let Err(e) = self.store.trust_put(&r) {
                    tracing::warn!(key = %r.key, error = %e, "trust record of a passed-through asset not written");
                }
            }
            return Ok(want);
        }
        let store = self.store.clone();
        let known_in = known_in.map(str::to_string);
        let committed = tokio::task::spawn_blocking(move || {
            let sealed = writer.seal().map_err(|e| e.to_string())?;
            store.commit(sealed, &want).map_err(|e| e.to_string())?;
            // Before the fill leaves the registry: a later request through this upstream is a hit.
            if let Some(u) = &known_in {
                store.record_known(&want, u).map_err(|e| e.to_string())?;
            }
            if let Some(r) = trust {
                store.trust_put(&r).map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        })
        .await;
        match committed {
            Ok(Ok(())) => Ok(want),
            Ok(Err(e)) => Err((FetchError::new(FetchErrorKind::Local, upstream, format!("commit: {e}")), None)),
            Err(e) => Err((FetchError::new(FetchErrorKind::Local, upstream, format!("commit task: {e}")), None)),
        }
    }
}

/// The streaming container check of a fill that needs one (an asset in xz, gzip or zstd),
/// starting after the bytes a resumed spool file already holds.
pub(super) fn stream_check(expect: &Expect, writer: &SpoolWriter, max_decoded: u64) -> Option<StreamCheck> {
    let Expect::Tofu { container, .. } = expect else { return None };
    if !container.has_checksum() {
        return None;
    }
    if writer.is_empty() {
        return Some(StreamCheck::start(*container, None, max_decoded));
    }
    let prefix = File::open(writer.path()).ok()?;
    Some(StreamCheck::start(*container, Some((prefix, writer.len())), max_decoded))
}
