//! The room bookkeeping the store holds (issue 41): the policy (`cache.maxSize`,
//! `cache.minFree`), the objects' running total, and the room fills in progress were given
//! ([`Reservation`]). Counters only, below the `Store`, which updates the total on every commit
//! and removal; `room` decides with them (`Store::make_room`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What the data directory may hold: the cache cap and the free space to leave on its file
/// system.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoomPolicy {
    /// `cache.maxSize`: the objects' total, at most.
    pub max_size: Option<u64>,
    /// `cache.minFree`: bytes left free on the data directory's file system, at least.
    pub min_free: u64,
}

/// The store's bookkeeping for `Store::make_room` (`room`).
#[derive(Debug, Default)]
pub(crate) struct Room {
    pub(crate) policy: Mutex<RoomPolicy>,
    /// Objects' total as last counted and updated since (`u64::MAX`: not counted yet).
    pub(crate) used: AtomicU64,
    /// Bytes that fills in progress were given room for and have not committed yet (counted
    /// against the cap).
    pub(crate) reserved: Arc<AtomicU64>,
    /// Of those, the bytes not written yet (counted against the free space).
    pub(crate) unwritten: Arc<AtomicU64>,
    /// One eviction at a time: concurrent fills that all need room would otherwise each walk
    /// the store and evict for themselves.
    pub(crate) evicting: Mutex<()>,
}

impl Room {
    pub(crate) fn new() -> Room {
        Room { used: AtomicU64::new(u64::MAX), ..Room::default() }
    }

    /// An object of `len` bytes became visible (not a replacement of one already there).
    pub(crate) fn added(&self, len: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| (u != u64::MAX).then(|| u.saturating_add(len)));
    }

    /// An object of `len` bytes was removed.
    pub(crate) fn removed(&self, len: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| (u != u64::MAX).then(|| u.saturating_sub(len)));
    }

    /// The exact total, from a walk of the store.
    pub(crate) fn counted(&self, total: u64) {
        self.used.store(total.min(u64::MAX - 1), Ordering::Relaxed);
    }

    /// Hold room for `bytes` until the [`Reservation`] is dropped.
    pub(crate) fn reserve(&self, bytes: u64) -> Reservation {
        self.reserved.fetch_add(bytes, Ordering::Relaxed);
        self.unwritten.fetch_add(bytes, Ordering::Relaxed);
        Reservation { reserved: self.reserved.clone(), unwritten: self.unwritten.clone(), bytes, left: bytes }
    }
}

/// Room a fill in progress was given: counted against the cap until it is dropped (the fill
/// committed or ended), so fills that start together do not each count the same room.
#[derive(Debug)]
pub struct Reservation {
    reserved: Arc<AtomicU64>,
    unwritten: Arc<AtomicU64>,
    bytes: u64,
    /// Bytes of this reservation not written yet.
    left: u64,
}

fn sub(counter: &AtomicU64, n: u64) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| Some(r.saturating_sub(n)));
}

impl Reservation {
    /// The fill wrote `n` more bytes: the file system's free space shows them now.
    pub fn wrote(&mut self, n: u64) {
        let n = n.min(self.left);
        self.left -= n;
        sub(&self.unwritten, n);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        sub(&self.reserved, self.bytes);
        sub(&self.unwritten, self.left);
    }
}
