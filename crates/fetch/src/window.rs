//! The memory of a pass-through fill (issue 41): when the data directory cannot take an object
//! (larger than the room left after eviction, ENOSPC mid-fill, no spool file at all), the fill
//! goes on without storing it. Its readers get the bytes the spool file already holds from the
//! file and the rest from this window of recent bytes in memory, with the guarantee of a stored
//! fill (the last byte withheld until the digest verified).
//!
//! Memory is bounded per fill by [`WINDOW`]: bytes every reader has passed are dropped; when the
//! window is full the fill waits for its slowest reader, for at most [`PATIENCE`] at a time,
//! and then drops the oldest bytes anyway. A reader that needs dropped bytes is cut with a clear
//! error; the others go on.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

/// The most bytes a pass-through fill holds in memory.
pub const WINDOW: u64 = 32 * 1024 * 1024;
/// Longest a full window waits for its slowest reader before that reader is left behind.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Not passing through: every byte of the fill is in its spool file.
const STORED: u64 = u64::MAX;

#[derive(Debug)]
pub struct Window {
    /// Offset from which the fill's bytes are in memory and not in its file ([`STORED`]: none).
    from: AtomicU64,
    inner: Mutex<Inner>,
    /// A reader moved on (the fill may drop what everyone passed).
    moved: tokio::sync::Notify,
    cap: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// Offset of the first byte held.
    base: u64,
    chunks: VecDeque<Bytes>,
    held: u64,
    readers: HashMap<u64, Arc<AtomicU64>>,
    next_reader: u64,
}

impl Default for Window {
    fn default() -> Window {
        Window::with_cap(WINDOW)
    }
}

/// A reader's place in a fill: registered while the reader lives, so the window keeps what it
/// has yet to read.
#[derive(Debug)]
pub struct Place {
    window: Arc<Window>,
    id: u64,
    pos: Arc<AtomicU64>,
}

impl Place {
    pub fn set(&self, pos: u64) {
        self.pos.store(pos, Ordering::Release);
        if self.window.passing_through() {
            self.window.moved.notify_waiters();
        }
    }

    pub fn window(&self) -> &Window {
        &self.window
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.window.inner.lock().unwrap_or_else(|p| p.into_inner()).readers.remove(&self.id);
        self.window.moved.notify_waiters();
    }
}

/// Why a reader could not be given bytes from memory.
#[derive(Debug, PartialEq, Eq)]
pub struct Behind {
    pub pos: u64,
    pub base: u64,
    pub cap: u64,
}

impl std::fmt::Display for Behind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this client fell more than {} MiB behind a fill that could not be stored (no space in the data \
             directory): byte {} is gone from memory (held from {}); ask again",
            self.cap >> 20,
            self.pos,
            self.base
        )
    }
}

impl Window {
    pub fn with_cap(cap: u64) -> Window {
        Window { from: AtomicU64::new(STORED), inner: Mutex::default(), moved: tokio::sync::Notify::new(), cap }
    }

    /// Where the bytes in memory begin: the fill's bytes before it are in its file.
    pub fn from(&self) -> u64 {
        self.from.load(Ordering::Acquire)
    }

    pub fn passing_through(&self) -> bool {
        self.from() != STORED
    }

    /// From byte `at` on, the fill's bytes come through memory.
    pub fn begin(&self, at: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if self.from() == STORED {
            inner.base = at;
            self.from.store(at, Ordering::Release);
        }
    }

    /// From byte 0 on, the fill's bytes come through memory, starting with `head` (what the
    /// fill's file held, copied before the file gives its space back).
    pub fn begin_with(&self, head: Bytes) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if self.from() == STORED {
            inner.base = 0;
            inner.held = head.len() as u64;
            inner.chunks.push_back(head);
            self.from.store(0, Ordering::Release);
        }
    }

    /// Register a reader at `pos`.
    pub fn place(self: &Arc<Self>, pos: u64) -> Place {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let id = inner.next_reader;
        inner.next_reader = inner.next_reader.wrapping_add(1);
        let slot = Arc::new(AtomicU64::new(pos));
        inner.readers.insert(id, slot.clone());
        Place { window: self.clone(), id, pos: slot }
    }

    /// Up to `n` bytes at `pos` (which must be at or after [`Window::from`] and before the
    /// end of what was pushed).
    pub fn read(&self, pos: u64, n: u64) -> Result<Bytes, Behind> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let behind = || Behind { pos, base: inner.base, cap: self.cap };
        if pos < inner.base {
            return Err(behind());
        }
        let mut at = inner.base;
        for c in &inner.chunks {
            let end = at.saturating_add(c.len() as u64);
            if pos < end {
                let off = usize::try_from(pos.saturating_sub(at)).unwrap_or(0);
                let len = usize::try_from(n.min(end.saturating_sub(pos))).unwrap_or(c.len());
                return Ok(c.slice(off..off.saturating_add(len).min(c.len())));
            }
            at = end;
        }
        // Not pushed yet: the caller reads only what the fill announced, so this is not reached.
        Err(behind())
    }

    /// Add the next bytes of the fill (they follow what was pushed before). When the window is
    /// over its cap, wait for readers to move on (at most [`PATIENCE`]), then drop the oldest
    /// bytes anyway: a reader left behind is cut when it asks for them.
    pub async fn push(&self, bytes: Bytes) {
        {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.held = inner.held.saturating_add(bytes.len() as u64);
            inner.chunks.push_back(bytes);
        }
        let began = tokio::time::Instant::now();
        loop {
            let waiting = self.moved.notified();
            tokio::pin!(waiting);
            waiting.as_mut().enable();
            if self.trim(false) {
                return;
            }
            let left = PATIENCE.saturating_sub(began.elapsed());
            if left.is_zero() {
                self.trim(true);
                return;
            }
            // A missed wake-up costs at most a tenth of a second.
            let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), waiting).await;
        }
    }

    /// Drop whole chunks every reader has passed (with `force`, also the oldest ones until the
    /// window is within its cap). True when the window is within its cap.
    fn trim(&self, force: bool) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // With no reader at all (a moment between a claim and its first read, or everyone left)
        // the newest bytes are kept up to the cap, for a reader that joins now.
        let nobody = inner.readers.is_empty();
        let force = force || nobody;
        let slowest = inner.readers.values().map(|p| p.load(Ordering::Acquire)).min().unwrap_or(0);
        while let Some(first) = inner.chunks.front() {
            let len = first.len() as u64;
            let passed = inner.base.saturating_add(len) <= slowest;
            if !(passed || force && inner.held > self.cap) {
                break;
            }
            inner.chunks.pop_front();
            inner.base = inner.base.saturating_add(len);
            inner.held = inner.held.saturating_sub(len);
        }
        inner.held <= self.cap
    }

    /// Bytes held in memory now.
    pub fn held(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).held
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn chunk(n: usize, b: u8) -> Bytes {
        Bytes::from(vec![b; n])
    }

    #[tokio::test]
    async fn should_keep_what_a_reader_has_yet_to_read_and_drop_what_all_passed() {
        let w = Arc::new(Window::with_cap(100));
        w.begin(1000);
        assert_eq!(w.from(), 1000);
        let a = w.place(1000);
        let b = w.place(1000);
        w.push(chunk(40, 1)).await;
        w.push(chunk(40, 2)).await;
        assert_eq!(w.read(1000, 100).unwrap(), chunk(40, 1));
        assert_eq!(w.read(1050, 100).unwrap(), chunk(30, 2));
        a.set(1080);
        w.push(chunk(10, 3)).await;
        assert_eq!(w.held(), 90, "b has read nothing: all is kept");
        b.set(1040);
        w.push(chunk(10, 4)).await;
        assert_eq!(w.held(), 60, "the first chunk, which both passed, is gone");
        assert_eq!(w.read(1000, 10), Err(Behind { pos: 1000, base: 1040, cap: 100 }));
    }

    #[tokio::test(start_paused = true)]
    async fn should_leave_a_reader_that_never_moves_behind_after_its_patience() {
        let w = Arc::new(Window::with_cap(100));
        w.begin(0);
        let stuck = w.place(0);
        let fast = w.place(0);
        w.push(chunk(80, 1)).await;
        fast.set(80);
        let t0 = tokio::time::Instant::now();
        w.push(chunk(80, 2)).await;
        assert!(t0.elapsed() >= PATIENCE, "the fill waited for the slow reader first");
        assert_eq!(w.held(), 80);
        let e = w.read(0, 10).unwrap_err();
        assert!(e.to_string().contains("fell more than"), "{e}");
        assert_eq!(w.read(80, 10).unwrap(), chunk(10, 2), "the reader that kept up goes on");
        drop(stuck);
    }

    #[tokio::test]
    async fn should_not_wait_when_the_slow_reader_goes_away() {
        let w = Arc::new(Window::with_cap(50));
        w.begin(0);
        let gone = w.place(0);
        w.push(chunk(50, 1)).await;
        let pushing = {
            let w = w.clone();
            tokio::spawn(async move { w.push(chunk(50, 2)).await })
        };
        drop(gone);
        tokio::time::timeout(Duration::from_secs(2), pushing).await.unwrap().unwrap();
        assert_eq!(w.held(), 50, "nobody reads: the newest bytes are kept, up to the cap");
        assert_eq!(w.read(50, 50).unwrap(), chunk(50, 2));
    }
}
