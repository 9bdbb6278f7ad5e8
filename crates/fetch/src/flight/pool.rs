//! The read buffers of a reader: a chunk handed to a client returns to its reader's pool once
//! written, and what the page cache holds is copied without a thread hand-off.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// The read buffers of one reader. A chunk handed to the response goes back to its reader's pool
/// once the connection wrote it, so a long read reuses a few buffers instead of allocating (and
/// page-faulting, and zeroing) a fresh one for every chunk: on the hot path that churn cost more
/// CPU than the copies themselves.
#[derive(Clone, Default)]
pub(super) struct BufPool(Arc<Mutex<Vec<Vec<u8>>>>);

/// A pool buffer lent to a `Bytes`; returns home when the last reference drops.
struct Lent {
    buf: Vec<u8>,
    len: usize,
    home: BufPool,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let mut free = self.home.0.lock().unwrap_or_else(|p| p.into_inner());
        // A reader has at most a few chunks in flight; keep that many.
        if free.len() < 4 {
            free.push(buf);
        }
    }
}

impl BufPool {
    /// `n` (at most the reader's chunk, `size`) bytes at `pos`, in a pooled buffer of `size`. What the page cache holds
    /// is copied right here (`preadv2` with `RWF_NOWAIT` never waits for the disk); only the rest
    /// goes to the blocking pool, so a hot object costs no thread hand-off per chunk and a cold
    /// disk never stalls the runtime.
    pub(super) async fn read_at(&self, file: Arc<File>, pos: u64, n: usize, size: usize) -> io::Result<Bytes> {
        let taken = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut buf = taken.filter(|b| b.len() >= n).unwrap_or_else(|| vec![0u8; size.max(n)]);
        let mut have = 0;
        while have < n {
            let mut iov = [io::IoSliceMut::new(&mut buf[have..n])];
            match rustix::io::preadv2(
                &*file,
                &mut iov,
                pos.saturating_add(have as u64),
                rustix::io::ReadWriteFlags::NOWAIT,
            ) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "object shorter than expected")),
                Ok(got) => have = have.saturating_add(got),
                Err(rustix::io::Errno::INTR) => {}
                // Not cached (EAGAIN), or a kernel or file system without RWF_NOWAIT.
                Err(_) => break,
            }
        }
        if have < n {
            buf = tokio::task::spawn_blocking(move || {
                file.read_exact_at(&mut buf[have..n], pos.saturating_add(have as u64)).map(|()| buf)
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)))?;
        }
        Ok(Bytes::from_owner(Lent { buf, len: n, home: self.clone() }))
    }
}
