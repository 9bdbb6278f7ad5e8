//! Scrubbing: stored objects re-hashed in the background at a bounded rate, so bit rot in an
//! object too large to be checked on every read (over `cache.memoryObjectMax`) is found without
//! waiting for `fsck` (issue 32). A scrubber (the caller's thread) calls [`Store::scrub_object`]
//! for every object on a schedule, and first for each large object read for the first time
//! since the process started ([`Store::watch_first_reads`]). A mismatch moves the object to
//! `quarantine/`: the next request fetches it again.

use std::io;
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use tender_oci::Digest;

use crate::maintenance::hash_file_with;
use crate::{Store, StoreError};

/// What scrubbing one object found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scrubbed {
    /// The bytes match the digest.
    Sound { bytes: u64 },
    /// They do not: moved to `quarantine/`.
    Corrupt { bytes: u64 },
    /// Not stored (evicted meanwhile, or never).
    Gone,
}

/// Reads at most `rate` bytes per second, on average, across the objects it paces.
#[derive(Debug)]
pub struct Pace {
    rate: u64,
    since: Instant,
    bytes: u64,
}

impl Pace {
    /// `rate` bytes per second; 0: as fast as the disk goes.
    pub fn new(rate: u64) -> Pace {
        Pace { rate, since: Instant::now(), bytes: 0 }
    }

    /// `n` bytes were read: sleep until the average is back at the rate.
    fn took(&mut self, n: u64) {
        if self.rate == 0 {
            return;
        }
        self.bytes = self.bytes.saturating_add(n);
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        let elapsed = self.since.elapsed();
        if due > elapsed {
            std::thread::sleep(due - elapsed);
        }
        // Start the average afresh now and then, so an idle hour is no credit for a burst.
        if elapsed > Duration::from_secs(10) {
            self.since = Instant::now();
            self.bytes = 0;
        }
    }
}

impl Store {
    /// Announce on `tx` each object over the small-object limit the first time it is opened
    /// for a reader after this call (a scrubber checks those first).
    pub fn watch_first_reads(&self, tx: SyncSender<Digest>) {
        self.first_reads.announce_to(tx);
    }

    /// Re-hash one stored object at `pace` (blocking: call it from a thread of its own);
    /// quarantine it when it does not match its digest.
    pub fn scrub_object(&self, digest: &Digest, pace: &mut Pace) -> Result<Scrubbed, StoreError> {
        let path = self.object_path(digest);
        let (actual, bytes) = match hash_file_with(&path, digest.algorithm(), &mut |n| pace.took(n)) {
            Ok(hashed) => hashed,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Scrubbed::Gone),
            Err(e) => return Err(self.err(e)),
        };
        if actual == *digest {
            return Ok(Scrubbed::Sound { bytes });
        }
        // Replaced meanwhile by a good copy (evicted and fetched again)? Then nothing is wrong.
        if !path.exists() {
            return Ok(Scrubbed::Gone);
        }
        tracing::error!(%digest, %actual, path = %path.display(),
            "scrub: stored object does not match its digest; quarantined, to be fetched again");
        self.quarantine(digest, &path)?;
        Ok(Scrubbed::Corrupt { bytes })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::OpenMode;

    #[test]
    fn should_find_bit_rot_quarantine_it_and_announce_first_reads_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
        let bytes = vec![7u8; 200_000];
        let d = tender_oci::Algorithm::Sha256.digest(&bytes);
        s.put_bytes("t", &bytes, &d).unwrap();
        let mut pace = Pace::new(0);
        assert_eq!(s.scrub_object(&d, &mut pace).unwrap(), Scrubbed::Sound { bytes: 200_000 });

        let (tx, rx) = std::sync::mpsc::sync_channel(8);
        s.watch_first_reads(tx);
        s.open_stored(&d).unwrap().unwrap();
        s.open_stored(&d).unwrap().unwrap();
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![d], "announced once, on its first read");

        // One flipped byte in the middle: found, moved aside, gone from the store.
        let path = s.object_path(&d);
        let mut rotten = std::fs::read(&path).unwrap();
        rotten[100_000] ^= 0x40;
        std::fs::write(&path, &rotten).unwrap();
        assert_eq!(s.scrub_object(&d, &mut pace).unwrap(), Scrubbed::Corrupt { bytes: 200_000 });
        assert!(s.object_len(&d).is_none(), "quarantined: the next request fetches it again");
        assert_eq!(std::fs::read_dir(dir.path().join("quarantine")).unwrap().count(), 1);
        assert_eq!(s.scrub_object(&d, &mut pace).unwrap(), Scrubbed::Gone);
    }

    #[test]
    fn should_keep_to_its_rate() {
        let mut pace = Pace::new(10 << 20);
        let t0 = Instant::now();
        for _ in 0..3 {
            pace.took(1 << 20);
        }
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(280), "3 MiB at 10 MiB/s took {took:?}");
    }
}
