//! Spool files: a fill's bytes as they arrive, hashed while written.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tender_oci::{Algorithm, Digest, Hasher};

/// The smallest span [`SpoolWriter::append`] hashes on a second thread.
pub const PARALLEL_APPEND_MIN: usize = 1 << 20;

/// The spacing of the hash states a spool notes ([`ChainStates`]).
pub const STATE_STEP: u64 = 1 << 20;

/// The sha256 chain states ([`tender_oci::chain`]) of a spool's bytes at every multiple of
/// [`STATE_STEP`], as its writer hashed them: the holder of a shared bucket's fill lease
/// takes its chunks' index entries from them instead of hashing the bytes a second time.
/// None for a sha512 spool; none from where hashing was deferred or the states would not
/// follow on. 32 bytes per MiB.
#[derive(Debug, Clone, Default)]
pub struct ChainStates(std::sync::Arc<std::sync::Mutex<Noted>>);

#[derive(Debug, Default)]
struct Noted {
    /// `states[k]`: the state after the first `(k + 1) * STATE_STEP` bytes.
    states: Vec<tender_oci::chain::State>,
    /// A state went missing: no more are noted (they would be misplaced).
    stopped: bool,
}

impl ChainStates {
    /// The states at each of `offsets` (multiples of [`STATE_STEP`] above zero), or `None`
    /// when one of them is not noted.
    pub fn at(&self, offsets: impl IntoIterator<Item = u64>) -> Option<Vec<tender_oci::chain::State>> {
        let n = self.0.lock().unwrap_or_else(|p| p.into_inner());
        offsets
            .into_iter()
            .map(|o| {
                let k = o.checked_div(STATE_STEP).filter(|_| o.is_multiple_of(STATE_STEP))?.checked_sub(1)?;
                n.states.get(usize::try_from(k).ok()?).copied()
            })
            .collect()
    }

    /// Note states hashed after byte `at` (`noted[0]` the first boundary after it).
    fn note(&self, at: u64, noted: Vec<tender_oci::chain::State>) {
        if noted.is_empty() {
            return;
        }
        let mut n = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if n.stopped || n.states.len() as u64 != at / STATE_STEP {
            n.stopped = true;
            return;
        }
        n.states.extend(noted);
    }

    fn stop(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).stopped = true;
    }
}

/// Hash `bytes`, which follow the first `at` bytes, into `hasher`, noting its state at every
/// multiple of [`STATE_STEP`] they reach (a sha256 hasher only).
fn hash_noting(hasher: &mut Hasher, at: u64, bytes: &[u8], noted: &mut Vec<tender_oci::chain::State>) {
    if hasher.algorithm() != Algorithm::Sha256 {
        hasher.update(bytes);
        return;
    }
    let mut pos = at;
    let mut rest = bytes;
    while !rest.is_empty() {
        let to_next = STATE_STEP - pos % STATE_STEP;
        let n = usize::try_from(to_next).unwrap_or(usize::MAX).min(rest.len());
        hasher.update(&rest[..n]);
        pos += n as u64;
        rest = &rest[n..];
        if pos.is_multiple_of(STATE_STEP) {
            if let Some(s) = hasher.chain_state() {
                noted.push(s);
            }
        }
    }
}

/// An append-only spool file that hashes every byte written to it, with the algorithm of the
/// digest it is to be committed under. Bytes once written never change (readers and a fill's
/// in-memory window of recent bytes rely on it).
#[derive(Debug)]
pub struct SpoolWriter {
    path: PathBuf,
    file: File,
    hasher: Hasher,
    len: u64,
    /// Bytes from this offset on were hashed but not written (a pass-through fill: the disk
    /// could not take them); the file, unlinked, holds only what came before.
    unstored_from: Option<u64>,
    /// The bytes are written but not hashed (from the first): their source vouches for the
    /// object's digest once it delivered them all ([`SpoolWriter::defer_hashing`]).
    deferred: Option<Vouch>,
    /// The hash states noted as the bytes were hashed.
    states: ChainStates,
}

/// A source's word for a fill's digest: set once the source delivered, from the object's first
/// byte to its last, only bytes it verified against a record that names that digest (a shared
/// bucket's signed index). Until it is set the bytes count as unhashed.
#[derive(Debug, Clone, Default)]
pub struct Vouch(std::sync::Arc<std::sync::OnceLock<Digest>>);

impl Vouch {
    pub fn new() -> Vouch {
        Vouch::default()
    }

    /// Every byte delivered is the object `d`'s (the first call wins).
    pub fn prove(&self, d: Digest) {
        let _ = self.0.set(d);
    }

    pub fn proven(&self) -> Option<Digest> {
        self.0.get().copied()
    }
}

/// The hashing a deferred writer still owes, done off the writer (on a blocking thread): the
/// bytes of its file from the first to `len`.
#[derive(Debug)]
pub struct CatchUp {
    file: File,
    len: u64,
    hasher: Hasher,
}

impl CatchUp {
    /// Hash the bytes (blocking).
    pub fn run(mut self) -> io::Result<CatchUp> {
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < self.len {
            let n = usize::try_from((self.len - at).min(buf.len() as u64)).unwrap_or(buf.len());
            self.file.read_exact_at(&mut buf[..n], at)?;
            self.hasher.update(&buf[..n]);
            at += n as u64;
        }
        Ok(self)
    }
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
        Ok(SpoolWriter {
            path,
            file,
            hasher: algorithm.hasher(),
            len: 0,
            unstored_from: None,
            deferred: None,
            states: ChainStates::default(),
        })
    }

    /// Reopen an existing spool file and re-hash its content, to append after it.
    pub(crate) fn reopen(path: PathBuf, algorithm: Algorithm) -> io::Result<SpoolWriter> {
        let mut file = OpenOptions::new().read(true).write(true).open(&path)?;
        let mut hasher = algorithm.hasher();
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0u64;
        let states = ChainStates::default();
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            let mut noted = Vec::new();
            hash_noting(&mut hasher, len, &buf[..n], &mut noted);
            states.note(len, noted);
            len += n as u64;
        }
        Ok(SpoolWriter { path, file, hasher, len, unstored_from: None, deferred: None, states })
    }

    /// A writer that stores nothing (the spool file could not even be created: no space, no
    /// inode): every byte is hashed only, for a pass-through fill. Its file is an empty
    /// anonymous memory file, so readers have a handle like any other fill's.
    pub(crate) fn unstored(path: PathBuf, algorithm: Algorithm) -> io::Result<SpoolWriter> {
        let fd = rustix::fs::memfd_create("tender-pass-through", rustix::fs::MemfdFlags::CLOEXEC)?;
        Ok(SpoolWriter {
            path,
            file: File::from(fd),
            hasher: algorithm.hasher(),
            len: 0,
            unstored_from: Some(0),
            deferred: None,
            states: ChainStates::default(),
        })
    }

    /// Write the bytes that follow without hashing them, because `vouch` will prove the
    /// object's digest (see [`Vouch`]); only from the first byte of a stored spool. Whatever
    /// `vouch` does not prove is hashed from the file before the digest is given
    /// ([`SpoolWriter::catch_up`], [`SpoolWriter::seal`]): the digest is never taken on trust
    /// without the proof. Returns whether hashing is deferred.
    pub fn defer_hashing(&mut self, vouch: Vouch) -> bool {
        if self.len == 0 && self.unstored_from.is_none() {
            self.deferred = Some(vouch);
            self.states.stop();
        }
        self.deferred.is_some()
    }

    /// Hashing was deferred and is still (proven or not).
    pub fn is_deferred(&self) -> bool {
        self.deferred.is_some()
    }

    /// Hashing is deferred and no proof came (yet): [`SpoolWriter::catch_up`] owes it.
    pub fn owes_hashing(&self) -> bool {
        self.deferred.as_ref().is_some_and(|v| v.proven().is_none())
    }

    /// The hashing a deferred writer owes, for a blocking thread; `None` when it owes none.
    /// Give the result to [`SpoolWriter::caught_up`].
    pub fn catch_up(&self) -> io::Result<Option<CatchUp>> {
        if !self.owes_hashing() {
            return Ok(None);
        }
        Ok(Some(CatchUp { file: self.file.try_clone()?, len: self.len, hasher: self.algorithm().hasher() }))
    }

    /// Take the hash of a finished [`CatchUp`]: the writer hashes as usual from here on.
    pub fn caught_up(&mut self, done: CatchUp) -> io::Result<()> {
        if done.len != self.len {
            return Err(io::Error::other(format!("caught up to byte {} of {}", done.len, self.len)));
        }
        self.hasher = done.hasher;
        self.deferred = None;
        Ok(())
    }

    /// Stop writing to disk: from here on [`SpoolWriter::append_unstored`] hashes the bytes
    /// without storing them. The spool file is unlinked at once (its handles, readers' too,
    /// keep what it holds until they close), so nothing partial stays on disk. A writer that
    /// owes hashing must catch up first.
    pub fn stop_storing(&mut self) {
        debug_assert!(!self.owes_hashing(), "a deferred writer stops storing before it caught up");
        if self.unstored_from.is_none() {
            self.unstored_from = Some(self.len);
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Give back the disk space of what was stored (its bytes were copied to memory by the
    /// caller): the file is emptied, and every byte counts as not stored.
    pub fn drop_stored(&mut self) -> io::Result<()> {
        self.stop_storing();
        self.file.set_len(0)?;
        self.unstored_from = Some(0);
        Ok(())
    }

    /// Where the bytes that are not on disk begin, if this writer stopped storing.
    pub fn unstored_from(&self) -> Option<u64> {
        self.unstored_from
    }

    /// Hash bytes that follow without writing them (after [`SpoolWriter::stop_storing`]).
    pub fn append_unstored(&mut self, bytes: &[u8]) {
        if self.deferred.is_none() {
            let mut noted = Vec::new();
            hash_noting(&mut self.hasher, self.len, bytes, &mut noted);
            self.states.note(self.len, noted);
        }
        self.len += bytes.len() as u64;
    }

    /// The hash states noted so far and from now on, shared.
    pub fn chain_states(&self) -> ChainStates {
        self.states.clone()
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
        if self.deferred.is_some() {
            self.file.write_all_at(bytes, self.len)?;
        } else if bytes.len() < PARALLEL_APPEND_MIN {
            self.file.write_all_at(bytes, self.len)?;
            let mut noted = Vec::new();
            hash_noting(&mut self.hasher, self.len, bytes, &mut noted);
            self.states.note(self.len, noted);
        } else {
            // The hash goes into a copy, kept only when both halves succeed.
            let (file, mut hasher, at) = (&self.file, self.hasher.clone(), self.len);
            let noted;
            (self.hasher, noted) = std::thread::scope(|s| {
                let hashing = s.spawn(move || {
                    let mut noted = Vec::new();
                    hash_noting(&mut hasher, at, bytes, &mut noted);
                    (hasher, noted)
                });
                let written = file.write_all_at(bytes, at);
                let hashed = hashing.join().map_err(|_| io::Error::other("hashing the spooled bytes failed"));
                written.and(hashed)
            })?;
            self.states.note(at, noted);
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Whether `bytes` equal what the spool holds at `offset` (a restarted transfer re-sends
    /// bytes already received; they must be the same bytes).
    /// Bytes not on disk (a pass-through fill) cannot be compared: they are taken as the same,
    /// and the digest over the bytes first received, which readers got, decides.
    pub fn matches_at(&self, offset: u64, bytes: &[u8]) -> io::Result<bool> {
        if offset + bytes.len() as u64 > self.len {
            return Ok(false);
        }
        let stored_end = self.unstored_from.unwrap_or(self.len);
        let n = usize::try_from(stored_end.saturating_sub(offset)).unwrap_or(usize::MAX).min(bytes.len());
        let mut have = vec![0u8; n];
        self.file.read_exact_at(&mut have, offset)?;
        Ok(have[..] == bytes[..n])
    }

    /// The digest of what was written so far, without finishing: the vouched one when hashing
    /// was deferred and proven; hashed from the file now when it was deferred and not proven
    /// (call [`SpoolWriter::catch_up`] on a blocking thread first to spare this one).
    pub fn digest_so_far(&self) -> io::Result<Digest> {
        match &self.deferred {
            None => Ok(self.hasher.clone().finalize()),
            Some(v) => match v.proven() {
                Some(d) => Ok(d),
                None => Ok(CatchUp { file: self.file.try_clone()?, len: self.len, hasher: self.algorithm().hasher() }
                    .run()?
                    .hasher
                    .finalize()),
            },
        }
    }

    /// The algorithm the bytes are hashed with.
    pub fn algorithm(&self) -> Algorithm {
        self.hasher.algorithm()
    }

    /// Flush to disk and hand over the file for commit.
    pub fn seal(self) -> io::Result<Sealed> {
        if let Some(at) = self.unstored_from {
            return Err(io::Error::other(format!("bytes from {at} on were passed through, not stored")));
        }
        let digest = self.digest_so_far()?;
        self.file.sync_all()?;
        Ok(Sealed { digest, path: self.path, len: self.len })
    }

    /// Remove the spool file (a failed or discarded fill).
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
