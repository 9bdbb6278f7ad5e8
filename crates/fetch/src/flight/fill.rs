//! One object being fetched ([`Fill`]): its spool file, the bytes a pass-through fill holds in
//! memory, and the state its readers and waiters watch ([`FillState`], [`Phase`]).

use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex};

use tender_oci::Digest;
use tender_store::SpoolWriter;
use tokio::sync::watch;

use crate::error::FetchError;
use crate::fills::{epoch, rate_and_eta, FillInfo, FillView};
use crate::window::Window;

#[derive(Debug, Clone)]
pub enum Phase {
    /// Waiting for the upstream's response headers (or retrying before any).
    Connecting,
    Streaming,
    /// Every byte is in and verified; being made durable and visible. Readers may release the
    /// withheld final byte now: the content is right whatever the commit does.
    Verified(Digest),
    /// Verified and visible in the store.
    Committed(Digest),
    /// Verified and served to the fill's readers, not stored: the data directory had no room
    /// (a pass-through fill). Its readers read on from memory; nobody else can join it.
    PassedThrough(Digest),
    Failed(FetchError),
}

/// What readers see of a fill.
#[derive(Debug, Clone)]
pub struct FillState {
    pub written: u64,
    pub total: Option<u64>,
    pub phase: Phase,
    /// The bytes must match a trust record before any of them goes out (a refill of an asset
    /// tender already trusts): readers wait for `Verified`.
    pub gated: bool,
}

/// One object being fetched.
#[derive(Debug)]
pub struct Fill {
    pub(super) key: String,
    /// The digest or asset key being filled (several upstreams may fill one digest at once).
    pub(super) object: String,
    /// Kept even when nobody reads it (a prefetch, a catalog import): never cancelled as abandoned.
    pub(super) keep: std::sync::atomic::AtomicBool,
    /// Not yet taken by the request that started the fill ([`Fill::take_start`]).
    pub(super) start: std::sync::atomic::AtomicBool,
    /// The spool file, opened once: readers use this handle, never the path, so the rename
    /// into the store cannot race with a reader opening it.
    pub(super) file: Arc<File>,
    /// The hash states the fill's spool notes as it hashes its bytes (for the upload).
    pub(super) chain: tender_store::ChainStates,
    /// The bytes a pass-through fill holds in memory (it could not store them).
    pub(super) window: Arc<Window>,
    /// The room this fill was given in the data directory, until it ends.
    pub(super) room: Mutex<Option<tender_store::Reservation>>,
    pub(super) state: watch::Sender<FillState>,
    pub(super) info: FillInfo,
}

impl Fill {
    pub(super) fn new(key: &str, object: &str, writer: &SpoolWriter, gated: bool, info: FillInfo) -> io::Result<Fill> {
        let (state, _) =
            watch::channel(FillState { written: writer.len(), total: None, phase: Phase::Connecting, gated });
        Ok(Fill {
            key: key.to_string(),
            object: object.to_string(),
            keep: std::sync::atomic::AtomicBool::new(false),
            start: std::sync::atomic::AtomicBool::new(true),
            file: Arc::new(writer.read_handle()?),
            chain: writer.chain_states(),
            window: {
                let w = Arc::new(Window::default());
                if let Some(at) = writer.unstored_from() {
                    w.begin(at);
                }
                w
            },
            room: Mutex::new(None),
            state,
            info,
        })
    }

    /// Bytes before this offset are in the fill's file; from it on (a pass-through fill) only
    /// in memory, for the fill's readers. `u64::MAX` while every byte is stored.
    pub fn stored_until(&self) -> u64 {
        self.window.from()
    }

    /// `n` more bytes of this fill are on disk: the room it was given shrinks by them.
    pub(super) fn wrote(&self, n: u64) {
        if let Some(r) = self.room.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            r.wrote(n);
        }
    }

    /// Whether this fill stopped storing its bytes (the data directory could not take them).
    pub fn is_pass_through(&self) -> bool {
        self.window.passing_through()
    }

    /// What operators see of this fill now.
    pub fn view(&self) -> FillView {
        let s = self.state.borrow().clone();
        let (rate, eta) = rate_and_eta(s.written, s.total, self.info.began.elapsed());
        FillView {
            id: self.info.id.clone(),
            upstream: self.info.upstream.clone(),
            object: self.object.clone(),
            path: self.info.path.clone(),
            phase: match s.phase {
                Phase::Connecting => "connecting",
                Phase::Streaming => "streaming",
                Phase::Verified(_) => "verified",
                Phase::Committed(_) => "committed",
                Phase::PassedThrough(_) => "passed_through",
                Phase::Failed(_) => "failed",
            },
            bytes: s.written,
            total: s.total,
            rate,
            eta_seconds: eta,
            retries: self.info.retries.load(std::sync::atomic::Ordering::Relaxed),
            clients: self.state.receiver_count(),
            served: self.info.served.load(std::sync::atomic::Ordering::Relaxed),
            started_at: epoch(self.info.started),
        }
    }

    /// Never cancel this fill for want of readers (a prefetch or an import waits for it by
    /// polling, without reading).
    pub fn keep(&self) {
        self.keep.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Every change of the fill's state.
    pub(crate) fn subscribe(&self) -> watch::Receiver<FillState> {
        self.state.subscribe()
    }

    /// The spool file (readers use this handle, never the path).
    pub(crate) fn file(&self) -> Arc<File> {
        self.file.clone()
    }

    pub(super) fn fail(&self, e: FetchError) {
        self.state.send_modify(|s| s.phase = Phase::Failed(e));
    }

    pub fn state(&self) -> FillState {
        self.state.borrow().clone()
    }

    /// Whether this call is the first to ask since the fill was created: the request that
    /// started it (its access line says miss however fast a small fill verified meanwhile).
    pub fn take_start(&self) -> bool {
        self.start.swap(false, std::sync::atomic::Ordering::Relaxed)
    }

    /// Every byte is in and verified (the commit may still be under way): as good as stored.
    pub fn is_verified(&self) -> bool {
        matches!(self.state.borrow().phase, Phase::Verified(_))
    }

    /// Wait for the end of a fill whose content verified: the digest once the object is
    /// committed. None when the content has not verified (the fill may still take long) or the
    /// commit failed.
    pub async fn committed(&self) -> Option<Digest> {
        let mut rx = self.state.subscribe();
        loop {
            match &rx.borrow_and_update().phase {
                Phase::Committed(d) => return Some(*d),
                Phase::Verified(_) => {}
                _ => return None,
            }
            rx.changed().await.ok()?;
        }
    }

    /// Wait until every byte is in and the content verified (or the object is committed), or
    /// the fill failed.
    pub async fn settled(&self) -> FillState {
        let mut rx = self.state.subscribe();
        loop {
            let s = rx.borrow_and_update().clone();
            if !matches!(s.phase, Phase::Connecting | Phase::Streaming) {
                return s;
            }
            if rx.changed().await.is_err() {
                return s;
            }
        }
    }

    /// Wait until the upstream answered (size known, or streaming without one), the object
    /// is committed, or the fill failed.
    pub async fn started(&self) -> FillState {
        let mut rx = self.state.subscribe();
        loop {
            let s = rx.borrow_and_update().clone();
            if !matches!(s.phase, Phase::Connecting) {
                return s;
            }
            if rx.changed().await.is_err() {
                return s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;
    use crate::error::FetchErrorKind;
    use tender_oci::Algorithm;
    use tender_store::Store;

    #[tokio::test]
    async fn should_wait_for_the_commit_only_once_the_content_verified() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), tender_store::OpenMode::Exclusive).unwrap();
        let writer = store.create_spool("k", Algorithm::Sha256).unwrap();
        let fill = Arc::new(Fill::new("k", "k", &writer, false, FillInfo::new("k", "u", "")).unwrap());
        fill.state.send_modify(|s| s.phase = Phase::Streaming);
        assert_eq!(fill.committed().await, None, "a fill still streaming is not waited for");
        let d = Digest::of(b"x");
        fill.state.send_modify(|s| s.phase = Phase::Verified(d));
        let waiter = tokio::spawn({
            let fill = fill.clone();
            async move { fill.committed().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a verified fill is waited for until its commit");
        fill.state.send_modify(|s| s.phase = Phase::Committed(d));
        assert_eq!(waiter.await.unwrap(), Some(d));
        fill.state.send_modify(|s| s.phase = Phase::Verified(d));
        let waiter = tokio::spawn({
            let fill = fill.clone();
            async move { fill.committed().await }
        });
        tokio::task::yield_now().await;
        fill.fail(FetchError::new(FetchErrorKind::Local, "u", "commit: disk full"));
        assert_eq!(waiter.await.unwrap(), None, "a failed commit gives no digest");
        writer.discard();
    }
}
