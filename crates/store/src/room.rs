//! Room for a fill at the moment it needs it (issue 41): `cache.maxSize` and `cache.minFree`
//! are enforced before a fill of known size writes, and again when the disk refuses a write,
//! not only on the GC tick. Eviction goes least recently used first and never takes what the
//! caller protects (objects being filled, pinned ones). The counts it decides on are the
//! store's `Room` (`budget`), which commits and removals keep up to date.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tender_oci::Digest;

use crate::budget::{Reservation, RoomPolicy};
use crate::layout::{Store, StoreError};

/// What [`Store::make_room`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomReport {
    /// The fill can be written: within the cap and leaving `minFree`, after eviction.
    pub fits: bool,
    pub evicted: usize,
    pub freed_bytes: u64,
}

impl Store {
    /// Set the cap and free-space floor that [`Store::make_room`] enforces.
    pub fn set_room_policy(&self, policy: RoomPolicy) {
        *self.room.policy.lock().unwrap_or_else(|p| p.into_inner()) = policy;
    }

    pub fn room_policy(&self) -> RoomPolicy {
        *self.room.policy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Free bytes on the data directory's file system (what an unprivileged writer may use).
    pub fn free_bytes(&self) -> Result<u64, StoreError> {
        let s = rustix::fs::statvfs(self.root()).map_err(|e| self.err(e.into()))?;
        Ok(s.f_bavail.saturating_mul(s.f_frsize))
    }

    /// Bytes the data directory's file system holds in all.
    pub fn capacity_bytes(&self) -> Result<u64, StoreError> {
        let s = rustix::fs::statvfs(self.root()).map_err(|e| self.err(e.into()))?;
        Ok(s.f_blocks.saturating_mul(s.f_frsize))
    }

    /// Make room for `needed` more bytes: evict least recently used objects (none that
    /// `protected` names) until the objects' total, the room fills in progress hold and
    /// `needed` are within the cap, and the file system keeps `minFree` free after what those
    /// fills have still to write and `needed`. Cheap when there is room (one `statvfs` and a
    /// few counters); a walk of the store only when something must go. `fits` is false when
    /// even evicting every unprotected object would not make the room; else the room is the
    /// caller's until it drops the [`Reservation`].
    pub fn make_room(
        &self,
        needed: u64,
        protected: &dyn Fn(&Digest) -> bool,
    ) -> Result<(RoomReport, Option<Reservation>), StoreError> {
        let policy = self.room_policy();
        let mut report = RoomReport { fits: true, evicted: 0, freed_bytes: 0 };
        // One at a time: two fills must not both count the same room before either holds it.
        let _one = self.room.evicting.lock().unwrap_or_else(|p| p.into_inner());
        let reserved = self.room.reserved.load(Ordering::Relaxed);
        let unwritten = self.room.unwritten.load(Ordering::Relaxed);
        let short = |store: &Store, used: Option<u64>| -> Result<u64, StoreError> {
            let free = store.free_bytes()?.saturating_sub(unwritten);
            let for_free = policy.min_free.saturating_add(needed).saturating_sub(free);
            let for_cap = match (policy.max_size, used) {
                (Some(cap), Some(used)) => used.saturating_add(reserved).saturating_add(needed).saturating_sub(cap),
                _ => 0,
            };
            Ok(for_free.max(for_cap))
        };
        let used = self.room.used.load(Ordering::Relaxed);
        let known = (used != u64::MAX).then_some(used);
        if (known.is_some() || policy.max_size.is_none()) && short(self, known)? == 0 {
            return Ok((report, Some(self.room.reserve(needed))));
        }
        // Counted afresh: another fill may have evicted meanwhile, and the counter may drift
        // from what is on disk (objects a CLI command added while serving).
        let objects = self.list_objects()?;
        let total: u64 = objects.iter().map(|o| o.size).sum();
        self.room.counted(total);
        let want = short(self, Some(total))?;
        if want == 0 {
            return Ok((report, Some(self.room.reserve(needed))));
        }
        let plan = self.gc_plan(Some(total.saturating_sub(want)), Duration::MAX, protected)?;
        if plan.evict_bytes < want {
            // Evicting every object that may go would still not make the room (the disk is
            // full of something else, or of what is protected): keep the cache as it is.
            report.fits = false;
            return Ok((report, None));
        }
        let done = self.gc_apply(&plan)?;
        report.evicted = done.evicted;
        report.freed_bytes = done.freed_bytes;
        if done.evicted > 0 {
            tracing::info!(
                needed,
                evicted = done.evicted,
                freed_bytes = done.freed_bytes,
                "evicted at fill time to stay within cache.maxSize and cache.minFree"
            );
        }
        // Space of a removed file that a reader still holds open comes back only when it closes.
        report.fits = short(self, Some(total.saturating_sub(done.freed_bytes)))? == 0;
        let held = report.fits.then(|| self.room.reserve(needed));
        Ok((report, held))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::OpenMode;

    fn put(s: &Store, n: usize, b: u8) -> Digest {
        let bytes = vec![b; n];
        let d = tender_oci::Algorithm::Sha256.digest(&bytes);
        s.put_bytes(&format!("t{b}"), &bytes, &d).unwrap();
        d
    }

    #[test]
    fn should_evict_least_recently_used_objects_to_fit_a_fill_under_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
        s.set_room_policy(RoomPolicy { max_size: Some(300_000), min_free: 0 });
        let old = put(&s, 100_000, 1);
        let old_time = std::time::SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::options().write(true).open(s.object_path(&old)).unwrap().set_modified(old_time).unwrap();
        let pinned = put(&s, 100_000, 2);
        std::fs::File::options().write(true).open(s.object_path(&pinned)).unwrap().set_modified(old_time).unwrap();
        let fresh = put(&s, 100_000, 3);
        // 300,000 stored; a 50,000-byte fill needs 50,000 freed: the oldest unprotected goes.
        let (r, held) = s.make_room(50_000, &|d| *d == pinned).unwrap();
        assert_eq!((r.fits, r.evicted, r.freed_bytes), (true, 1, 100_000));
        drop(held);
        assert!(s.object_len(&old).is_none(), "the least recently used object was evicted");
        assert!(s.object_len(&pinned).is_some() && s.object_len(&fresh).is_some());
        // Now within the cap: no walk, nothing evicted.
        let (r, held) = s.make_room(50_000, &|_| false).unwrap();
        assert_eq!((r.fits, r.evicted), (true, 0));
        // Held by a fill in progress: a second fill of the same size does not count that room
        // again, so an object must go for it.
        let (r, second) = s.make_room(150_000, &|d| *d == pinned).unwrap();
        assert_eq!((r.fits, r.evicted), (true, 1), "{r:?}");
        drop((held, second));
        // More than the cap can ever hold with the pinned object kept: does not fit, and
        // nothing is evicted for a fill that would not fit anyway.
        let (r, held) = s.make_room(250_000, &|d| *d == pinned).unwrap();
        assert_eq!((r.fits, r.evicted), (false, 0), "{r:?}");
        assert!(held.is_none());
        assert!(s.object_len(&pinned).is_some());
    }

    #[test]
    fn should_ask_for_the_free_space_floor_on_top_of_the_fill() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
        let free = s.free_bytes().unwrap();
        assert!(free > 0 && s.capacity_bytes().unwrap() >= free);
        // A floor above what the file system has can never be met, and nothing is evicted for it
        // beyond what is there.
        s.set_room_policy(RoomPolicy { max_size: None, min_free: u64::MAX / 2 });
        let kept = put(&s, 1000, 7);
        let (r, _) = s.make_room(1, &|d| *d == kept).unwrap();
        assert!(!r.fits);
        assert!(s.object_len(&kept).is_some());
        s.set_room_policy(RoomPolicy { max_size: None, min_free: 0 });
        let (r, mut held) = s.make_room(free / 2, &|_| false).unwrap();
        assert!(r.fits);
        // What a fill has still to write counts against the free space: a second fill of the
        // same size does not fit beside it (nothing to evict), until the first wrote its bytes.
        let (r, _) = s.make_room(free / 2 + free / 4, &|_| false).unwrap();
        assert!(!r.fits, "{r:?}");
        if let Some(h) = held.as_mut() {
            h.wrote(free / 2);
        }
        assert_eq!(s.room.unwritten.load(Ordering::Relaxed), 0);
        drop(held);
        assert_eq!(s.room.reserved.load(Ordering::Relaxed), 0);
    }
}
