//! The open connections of one listener: the global and per-address caps, and who gives way
//! when a cap is reached. A connection that has not sent a complete request head is worth
//! least (it may be a socket that never will), so it is closed first, oldest first; then the
//! oldest idle one; a connection with a request in progress is never closed for another, unless
//! its peer stopped reading its response (stalled: those go before any other, longest first).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

/// What the connection task and the request service share about one connection.
#[derive(Debug)]
pub(crate) struct ConnState {
    /// The peer sent a byte (plain HTTP) or finished the TLS handshake.
    spoke: AtomicBool,
    /// A complete request head arrived (HTTP/1 request or HTTP/2 stream).
    head_seen: AtomicBool,
    /// Requests whose response body is not done yet.
    in_flight: AtomicUsize,
    /// When the last request ended (or the connection opened).
    idle_since: Mutex<Instant>,
    /// Closed to make room for another connection.
    evict: Notify,
    /// Since when the socket has accepted no byte of a write it refused (`stall.rs`).
    pub(crate) blocked: crate::moment::Moment,
    blocked_now: Notify,
    /// Close with a reset (`SO_LINGER` 0): the bytes still queued for a peer that stopped
    /// reading are dropped at once instead of being retried for minutes.
    abort: AtomicBool,
    /// Request heads over `maxHeaderBytes` refused on this connection.
    head_refusals: AtomicUsize,
    /// Too many of those: the connection is sent away (HTTP/2: GOAWAY).
    flood: Notify,
}

/// How many request heads over `maxHeaderBytes` one connection may send before it is sent away
/// (HTTP/1 connections close after the first).
pub(crate) const HEAD_REFUSALS_MAX: usize = 3;

/// The connection a request came on, as a request extension: what the limits note about it.
#[derive(Clone)]
pub(crate) struct ConnRef(pub(crate) Arc<ConnState>);

impl ConnState {
    fn new() -> ConnState {
        ConnState {
            spoke: AtomicBool::new(false),
            head_seen: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            evict: Notify::new(),
            blocked: crate::moment::Moment::new(),
            blocked_now: Notify::new(),
            abort: AtomicBool::new(false),
            head_refusals: AtomicUsize::new(0),
            flood: Notify::new(),
        }
    }

    /// A request head over `maxHeaderBytes` was refused; at `HEAD_REFUSALS_MAX` of them the
    /// connection's driver sends it away.
    pub(crate) fn refused_head(&self) {
        if self.head_refusals.fetch_add(1, Ordering::Relaxed) + 1 == HEAD_REFUSALS_MAX {
            self.flood.notify_one();
        }
    }

    /// Resolves when the connection sent too many heads over the limit.
    pub(crate) async fn flooding(&self) {
        self.flood.notified().await;
    }

    /// A write was refused: from now on (unless already), the socket counts as blocked, and
    /// the connection's driver looks at when it must give up.
    pub(crate) fn note_blocked(&self) {
        if self.blocked.set_now_if_none() {
            self.blocked_now.notify_one();
        }
    }

    /// Resolves when the socket became blocked (since the last call).
    pub(crate) async fn became_blocked(&self) {
        self.blocked_now.notified().await;
    }

    /// Since when the socket has refused to take more bytes, if it has.
    pub(crate) fn blocked_since(&self) -> Option<Instant> {
        self.blocked.get()
    }

    /// Whether the connection is stalled on its peer: blocked for [`STALLED_AFTER`] or more.
    fn stalled(&self) -> Option<Instant> {
        self.blocked_since().filter(|b| b.elapsed() >= STALLED_AFTER)
    }

    /// Chosen to make room: close it, with a reset when its peer stopped reading (set before
    /// the connection's task drops the socket).
    fn close_for_room(&self) {
        if self.blocked_since().is_some() {
            self.abort();
        }
        self.evict.notify_one();
    }

    /// Close this connection with a reset when it ends.
    pub(crate) fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
    }

    pub(crate) fn aborting(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }

    /// The peer sent something: it is not a silent socket.
    pub(crate) fn spoke(&self) {
        self.spoke.store(true, Ordering::Relaxed);
    }

    fn has_spoken(&self) -> bool {
        self.spoke.load(Ordering::Relaxed)
    }

    pub(crate) fn head_seen(&self) -> bool {
        self.head_seen.load(Ordering::Relaxed)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Since when nothing is in progress; `None` while a request is.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        (self.in_flight() == 0).then(|| *self.idle_since.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A request head arrived; the returned guard ends the request when dropped (with its
    /// response body).
    pub(crate) fn request(self: &Arc<Self>) -> RequestGuard {
        self.spoke();
        self.head_seen.store(true, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        RequestGuard(self.clone())
    }

    /// Resolves when the connection was chosen to make room.
    pub(crate) async fn evicted(&self) {
        self.evict.notified().await;
    }
}

/// One request in progress on a connection.
pub(crate) struct RequestGuard(Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How long a socket must have refused bytes before its connection counts as stalled at a
/// cap (a fast download blocks for milliseconds at a time; a reader that stopped, for good).
const STALLED_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a new connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `maxConnections`, every connection busy.
    Connections,
    /// `maxConnectionsPerAddress`, every connection of the address busy.
    PerAddress,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// By id: ids grow, so the first entries are the oldest.
    open: BTreeMap<u64, (IpAddr, Arc<ConnState>)>,
    per_ip: HashMap<IpAddr, usize>,
}

impl Inner {
    fn remove(&mut self, id: u64) -> Option<Arc<ConnState>> {
        let (ip, state) = self.open.remove(&id)?;
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
        Some(state)
    }

    /// The connection to close for room among those `from` admits: the one stalled longest on a
    /// peer that stopped reading, else the oldest without a request head (one that never sent
    /// a byte before one that did: an honest client's head may be on its way), else the oldest
    /// idle one.
    fn victim(&self, from: impl Fn(IpAddr) -> bool) -> Option<u64> {
        let candidates = || self.open.iter().filter(|(_, (ip, _))| from(*ip));
        let first = |pick: &dyn Fn(&ConnState) -> bool| candidates().find(|(_, (_, s))| pick(s)).map(|(id, _)| *id);
        candidates()
            .filter_map(|(id, (_, s))| s.stalled().map(|b| (b, *id)))
            .min()
            .map(|(_, id)| id)
            .or_else(|| first(&|s| !s.has_spoken() && !s.head_seen()))
            .or_else(|| first(&|s| !s.head_seen()))
            .or_else(|| first(&|s| s.in_flight() == 0))
    }
}

/// The open connections of one listener.
#[derive(Default)]
pub(crate) struct Conns {
    inner: Mutex<Inner>,
}

/// An admitted connection: leaves the table when dropped.
pub(crate) struct Admitted {
    conns: Arc<Conns>,
    id: u64,
    pub(crate) state: Arc<ConnState>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.conns.lock().remove(self.id);
    }
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admit a connection from `ip`, closing others to make room if a cap is reached. Returns
    /// the admitted connection and how many were evicted for it.
    pub(crate) fn admit(
        self: &Arc<Self>,
        ip: IpAddr,
        max_total: usize,
        max_per_ip: usize,
    ) -> Result<(Admitted, usize), Refused> {
        let mut inner = self.lock();
        let mut evicted = 0;
        if inner.per_ip.get(&ip).copied().unwrap_or(0) >= max_per_ip {
            let id = inner.victim(|i| i == ip).ok_or(Refused::PerAddress)?;
            if let Some(s) = inner.remove(id) {
                s.close_for_room();
                evicted += 1;
            }
        }
        if inner.open.len() >= max_total {
            let id = inner.victim(|_| true).ok_or(Refused::Connections)?;
            if let Some(s) = inner.remove(id) {
                s.close_for_room();
                evicted += 1;
            }
        }
        let id = inner.next;
        inner.next = inner.next.wrapping_add(1);
        let state = Arc::new(ConnState::new());
        inner.open.insert(id, (ip, state.clone()));
        *inner.per_ip.entry(ip).or_insert(0) += 1;
        Ok((Admitted { conns: self.clone(), id, state }, evicted))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().open.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, n])
    }

    #[test]
    fn should_evict_headless_then_idle_and_never_busy_connections() {
        let conns = Arc::new(Conns::default());
        let (busy, _) = conns.admit(ip(1), 3, 10).unwrap();
        let _req = busy.state.request();
        let (idle, _) = conns.admit(ip(1), 3, 10).unwrap();
        drop(idle.state.request());
        let (silent, _) = conns.admit(ip(2), 3, 10).unwrap();
        // Full: the silent one goes first, although it is the youngest.
        let (fourth, n) = conns.admit(ip(3), 3, 10).unwrap();
        let _r4 = fourth.state.request();
        assert_eq!(n, 1);
        assert!(!conns.lock().open.values().any(|(_, s)| Arc::ptr_eq(s, &silent.state)));
        // Then the idle one; the busy one never.
        let (fifth, _) = conns.admit(ip(3), 3, 10).unwrap();
        assert!(!conns.lock().open.values().any(|(_, s)| Arc::ptr_eq(s, &idle.state)));
        let _r5 = fifth.state.request();
        assert_eq!(conns.admit(ip(4), 3, 10).err(), Some(Refused::Connections), "every connection is busy");
        drop((silent, idle));
        assert_eq!(conns.len(), 3);
    }

    #[test]
    fn should_keep_one_address_within_its_own_cap() {
        let conns = Arc::new(Conns::default());
        let (a, _) = conns.admit(ip(1), 100, 2).unwrap();
        let _ra = a.state.request();
        let (b, _) = conns.admit(ip(1), 100, 2).unwrap();
        let _rb = b.state.request();
        assert_eq!(conns.admit(ip(1), 100, 2).err(), Some(Refused::PerAddress));
        assert!(conns.admit(ip(2), 100, 2).is_ok(), "another address is not limited by it");
    }
}
