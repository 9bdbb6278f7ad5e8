//! Spool files: a fill's bytes as they arrive, hashed while written.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tender_oci::{Algorithm, Digest, Hasher};

/// The smallest span [`SpoolWriter::append`] hashes on a second thread.
pub const PARALLEL_APPEND_MIN: usize = 1 << 20;

/// An append-only spool file that hashes every byte written to it, with the algorithm of the
/// digest it is to be committed under. Bytes once written never change (readers and a fill's
/// in-memory window of recent bytes rely on it).
#[derive(Debug)]
pub struct SpoolWriter {
    path: PathBuf,
    file: File,
    hasher: Hasher,
    len: u64,
}

/// A spool file whose writing is finished: its path, length and digest.
#[derive(Debug)]
pub struct Sealed {
    pub path: PathBuf,
    pub len: u64,
    pub digest: Digest,
}

impl SpoolWriter {
    pub(crate) fn create(path: PathBuf, algorithm: Algorithm) -> io::Result<SpoolWriter> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
        Ok(SpoolWriter { path, file, hasher: algorithm.hasher(), len: 0 })
    }

    /// Reopen an existing spool file and re-hash its content, to append after it.
    pub(crate) fn reopen(path: PathBuf, algorithm: Algorithm) -> io::Result<SpoolWriter> {
        let mut file = OpenOptions::new().read(true).write(true).open(&path)?;
        let mut hasher = algorithm.hasher();
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0u64;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            len += n as u64;
        }
        Ok(SpoolWriter { path, file, hasher, len })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A second handle on the same open file, for readers: it stays valid when the file is
    /// renamed into the store (same inode), so a reader never looks the path up.
    pub fn read_handle(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append bytes at the end, hashing them. A large span (a chunk copied from the bucket is
    /// 8 MiB) is hashed on a second thread while this one writes, so it costs the longer of
    /// the two, not their sum; smaller spans are hashed in line (a thread costs more than
    /// them). A failed append leaves the writer as it was.
    pub fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() < PARALLEL_APPEND_MIN {
            self.file.write_all_at(bytes, self.len)?;
            self.hasher.update(bytes);
        } else {
            // The hash goes into a copy, kept only when both halves succeed.
            let (file, mut hasher, at) = (&self.file, self.hasher.clone(), self.len);
            self.hasher = std::thread::scope(|s| {
                let hashing = s.spawn(move || {
                    hasher.update(bytes);
                    hasher
                });
                let written = file.write_all_at(bytes, at);
                let hashed = hashing.join().map_err(|_| io::Error::other("hashing the spooled bytes failed"));
                written.and(hashed)
            })?;
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Whether `bytes` equal what the spool holds at `offset` (a restarted transfer re-sends
    /// bytes already received; they must be the same bytes).
    pub fn matches_at(&self, offset: u64, bytes: &[u8]) -> io::Result<bool> {
        if offset + bytes.len() as u64 > self.len {
            return Ok(false);
        }
        let mut have = vec![0u8; bytes.len()];
        self.file.read_exact_at(&mut have, offset)?;
        Ok(have == bytes)
    }

    /// The digest of what was written so far, without finishing.
    pub fn digest_so_far(&self) -> Digest {
        self.hasher.clone().finalize()
    }

    /// The algorithm the bytes are hashed with.
    pub fn algorithm(&self) -> Algorithm {
        self.hasher.algorithm()
    }

    /// Flush to disk and hand over the file for commit.
    pub fn seal(self) -> io::Result<Sealed> {
        self.file.sync_all()?;
        Ok(Sealed { digest: self.hasher.finalize(), path: self.path, len: self.len })
    }

    /// Remove the spool file (a failed or discarded fill).
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
