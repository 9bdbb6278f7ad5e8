//! The data directory: format version, lock, object paths and commits; the hit path
//! ([`Store::open_stored`]) and the first reads of large objects it notes for a scrubber.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::SyncSender;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tender_oci::{Algorithm, Digest};

use crate::budget::Room;
use crate::fsutil::{sync_dir, write_atomic};
use crate::memory::{Memory, MemoryLimit};
use crate::spool::{Sealed, SpoolWriter};
use crate::types::now_secs;

/// The data directory format this tender writes. 2: objects record the upstreams they are
/// known to exist in (`known/`); fill keys (spool names) include the upstream. Every path of
/// content is qualified by its digest algorithm (`objects/sha256/`, `meta/sha256/`,
/// `known/sha256/`), and sha512 objects live in the `sha512/` trees beside them: a format-2
/// directory written before tender knew sha512 is read as is.
pub const FORMAT_VERSION: u32 = 2;
const FORMAT_FILE: &str = "tender-data.json";
const LOCK_FILE: &str = "lock";
/// How often an object's mtime (its LRU clock) is refreshed on read, at most.
/// Distinguishes concurrent in-memory writes of the same key.
static SPOOL_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
const TOUCH_EVERY: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("data directory {dir}: {source}")]
    Io {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "data directory {dir} has format {found}, newer than this tender understands ({FORMAT_VERSION}); run a newer tender or point --data at another directory"
    )]
    TooNew { dir: PathBuf, found: u32 },
    #[error(
        "data directory {dir} is not empty and has no {FORMAT_FILE}; it is not a tender data directory (point --data at an empty or tender directory)"
    )]
    Foreign { dir: PathBuf },
    #[error("data directory {dir} has an unreadable {FORMAT_FILE}: {reason}")]
    BadFormatFile { dir: PathBuf, reason: String },
    #[error(
        "data directory {dir} is in use by another tender{holder}; stop it, or use its --server URL, or choose another --data"
    )]
    Locked { dir: PathBuf, holder: String },
    #[error("content of {path} does not match {expected} (got {actual}); nothing was stored")]
    DigestMismatch {
        path: PathBuf,
        /// Boxed: a digest is 65 bytes, and this error travels in every store `Result`.
        expected: Box<Digest>,
        actual: Box<Digest>,
    },
}

impl StoreError {
    pub(crate) fn io(dir: &Path, source: io::Error) -> StoreError {
        StoreError::Io { dir: dir.to_path_buf(), source }
    }

    /// True when the disk refused a write for lack of space.
    pub fn is_disk_full(&self) -> bool {
        let full = [rustix::io::Errno::NOSPC.raw_os_error(), rustix::io::Errno::DQUOT.raw_os_error()];
        matches!(self, StoreError::Io { source, .. }
            if source.raw_os_error().is_some_and(|n| full.contains(&n)) || source.kind() == io::ErrorKind::StorageFull)
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FormatFile {
    format: u32,
    created_by: String,
    /// The format this directory was migrated from, and by which tender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    migrated_from: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    migrated_by: Option<String>,
}

/// How a command opens the data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Take the lock: the owner (`serve`, or a CLI command that changes the store).
    Exclusive,
    /// Read without the lock (`catalog ls`, `fsck` without `--repair`, `stats`).
    ReadOnly,
}

/// An open data directory.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    _lock: Option<File>,
    /// Serialises read-modify-write of known-upstream records.
    pub(crate) known_lock: std::sync::Mutex<()>,
    /// Known-upstream records read or written lately (they only grow while the object lives).
    pub(crate) known_cache: std::sync::Mutex<std::collections::HashMap<Digest, Vec<String>>>,
    /// Small objects and the records a hit reads, in memory.
    pub(crate) memory: Memory,
    /// `objects/<algorithm>` held open (an `O_PATH` handle, one per [`Algorithm::ALL`]), taken
    /// on first use: a hit opens `xx/<hex>` relative to it, so the kernel walks two path
    /// components, not the whole data directory's path (a path walk was 9% of a small hit).
    objects_dirs: [std::sync::OnceLock<std::os::fd::OwnedFd>; 2],
    /// The cap and free-space floor enforced at fill time, and the objects' running total.
    pub(crate) room: Room,
    /// Large objects opened since the start, announced to a scrubber.
    pub(crate) first_reads: FirstReads,
}

/// Large objects remembered as read since the start (more: the set starts over; an object
/// checked twice costs a re-hash, nothing else).
const FIRST_READS: usize = 262_144;

/// First reads of large objects since the process started, and where to announce them.
#[derive(Debug, Default)]
pub(crate) struct FirstReads {
    seen: Mutex<HashSet<Digest>>,
    tell: Mutex<Option<SyncSender<Digest>>>,
}

impl FirstReads {
    /// Announce first reads on `tx` from now on ([`Store::watch_first_reads`], the scrub).
    pub(crate) fn announce_to(&self, tx: SyncSender<Digest>) {
        *self.tell.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    }

    /// `digest` (of `len` bytes, over the small-object limit) was opened for a reader.
    pub(crate) fn read(&self, digest: &Digest) {
        let tell = self.tell.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = tell.as_ref() else { return };
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= FIRST_READS {
            seen.clear();
        }
        if seen.insert(*digest) {
            // A full queue: the scheduled pass checks it later.
            let _ = tx.try_send(*digest);
        }
    }
}

/// A committed object to serve: its bytes (a small object, verified when read from disk) or
/// its open file.
#[derive(Debug)]
pub enum Stored {
    Memory(Bytes),
    File { file: File, len: u64 },
}

impl Stored {
    pub fn len(&self) -> u64 {
        match self {
            Stored::Memory(b) => b.len() as u64,
            Stored::File { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Store {
    /// Open (creating if absent) the data directory at `root`.
    pub fn open(root: &Path, mode: OpenMode) -> Result<Store, StoreError> {
        let err = |e| StoreError::io(root, e);
        if mode == OpenMode::Exclusive {
            fs::create_dir_all(root).map_err(err)?;
        }
        let format_path = root.join(FORMAT_FILE);
        let mut migrate_from = None;
        match fs::read(&format_path) {
            Ok(bytes) => {
                let f: FormatFile = serde_json::from_slice(&bytes)
                    .map_err(|e| StoreError::BadFormatFile { dir: root.to_path_buf(), reason: e.to_string() })?;
                if f.format > FORMAT_VERSION {
                    return Err(StoreError::TooNew { dir: root.to_path_buf(), found: f.format });
                }
                if f.format < FORMAT_VERSION {
                    migrate_from = Some(f.format);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if mode == OpenMode::ReadOnly && !root.exists() {
                    return Err(err(e));
                }
                // A fresh ext4 volume mounted as the data directory holds only lost+found.
                let non_empty =
                    fs::read_dir(root).map_err(err)?.filter_map(Result::ok).any(|e| e.file_name() != "lost+found");
                if non_empty {
                    return Err(StoreError::Foreign { dir: root.to_path_buf() });
                }
            }
            Err(e) => return Err(err(e)),
        }
        let lock = if mode == OpenMode::Exclusive { Some(take_lock(root)?) } else { None };
        let me = format!("tender {}", env!("CARGO_PKG_VERSION"));
        if !format_path.exists() {
            let f =
                FormatFile { format: FORMAT_VERSION, created_by: me.clone(), migrated_from: None, migrated_by: None };
            let bytes = serde_json::to_vec_pretty(&f).map_err(|e| err(io::Error::other(e)))?;
            write_atomic(&format_path, &bytes).map_err(err)?;
        }
        let store = Store {
            root: root.to_path_buf(),
            _lock: lock,
            known_lock: std::sync::Mutex::new(()),
            known_cache: std::sync::Mutex::new(std::collections::HashMap::new()),
            memory: Memory::new(MemoryLimit::default()),
            objects_dirs: Default::default(),
            room: Room::new(),
            first_reads: Default::default(),
        };
        if mode == OpenMode::Exclusive {
            for d in ["objects/sha256", "meta/sha256", "known/sha256", "tags", "spool", "quarantine"] {
                fs::create_dir_all(root.join(d)).map_err(err)?;
            }
            if let Some(from) = migrate_from {
                store.migrate(from)?;
                let bytes = fs::read(&format_path).map_err(err)?;
                let mut f: FormatFile = serde_json::from_slice(&bytes)
                    .map_err(|e| StoreError::BadFormatFile { dir: root.to_path_buf(), reason: e.to_string() })?;
                (f.format, f.migrated_from, f.migrated_by) = (FORMAT_VERSION, Some(from), Some(me));
                let bytes = serde_json::to_vec_pretty(&f).map_err(|e| err(io::Error::other(e)))?;
                // Written last: a migration cut short by a crash runs again (every step is idempotent).
                write_atomic(&format_path, &bytes).map_err(err)?;
                tracing::info!(dir = %root.display(), from, to = FORMAT_VERSION, "data directory migrated");
            }
        }
        Ok(store)
    }

    /// Bring an older data directory up to [`FORMAT_VERSION`]. Format 1 -> 2: objects stay where
    /// they are and have no known-upstream record, so each counts as known in no upstream (the
    /// first request through an upstream asks it with a HEAD); spool files are dropped, since fill
    /// keys now name the upstream and a format-1 spool would never be resumed.
    fn migrate(&self, from: u32) -> Result<(), StoreError> {
        if from < 2 {
            match fs::read_dir(self.spool_dir()) {
                Ok(entries) => {
                    for e in entries.flatten() {
                        if e.file_type().is_ok_and(|t| t.is_file()) {
                            fs::remove_file(e.path()).map_err(|e| self.err(e))?;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(())
    }

    /// Keep small objects in memory within `limit` (default: [`MemoryLimit::default`]).
    pub fn with_memory(mut self, limit: MemoryLimit) -> Store {
        self.memory = Memory::new(limit);
        self
    }

    /// Objects kept in memory and their bytes.
    pub fn memory_usage(&self) -> (usize, u64) {
        self.memory.usage()
    }

    /// Whether another process holds the directory's lock now.
    pub fn is_locked(root: &Path) -> bool {
        match OpenOptions::new().read(true).write(true).open(root.join(LOCK_FILE)) {
            Ok(f) => match f.try_lock() {
                Ok(()) => {
                    let _ = f.unlock();
                    false
                }
                Err(_) => true,
            },
            Err(_) => false,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn err(&self, e: io::Error) -> StoreError {
        StoreError::io(&self.root, e)
    }

    /// Where a committed object lives (whether or not it exists): `objects/<algorithm>/ab/<hex>`.
    pub fn object_path(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        self.objects_dir(digest.algorithm()).join(&hex[..2]).join(hex)
    }

    /// The tree of committed objects of one algorithm.
    pub(crate) fn objects_dir(&self, algorithm: Algorithm) -> PathBuf {
        self.root.join("objects").join(algorithm.name())
    }

    pub(crate) fn quarantine_dir(&self) -> PathBuf {
        self.root.join("quarantine")
    }

    /// Directory of in-progress fills.
    pub fn spool_dir(&self) -> PathBuf {
        self.root.join("spool")
    }

    /// The size of a committed object, if present.
    pub fn object_len(&self, digest: &Digest) -> Option<u64> {
        fs::metadata(self.object_path(digest)).ok().filter(|m| m.is_file()).map(|m| m.len())
    }

    /// Open a committed object for reading, refreshing its place in the LRU order.
    pub fn open_object(&self, digest: &Digest) -> Result<Option<(File, u64)>, StoreError> {
        Ok(self.open_touched(digest)?.map(|(file, len, _)| (file, len)))
    }

    /// A committed object opened, its length, and its mtime (seconds) after the LRU refresh.
    fn open_touched(&self, digest: &Digest) -> Result<Option<(File, u64, u64)>, StoreError> {
        let file = match self.open_object_file(digest) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        let meta = file.metadata().map_err(|e| self.err(e))?;
        let touched = touch(|| self.object_path(digest), &meta);
        Ok(Some((file, meta.len(), touched)))
    }

    /// Open a committed object for reading, relative to its held `objects/<algorithm>`
    /// directory (by its whole path when that directory cannot be held open).
    fn open_object_file(&self, digest: &Digest) -> io::Result<File> {
        use rustix::fs::{Mode, OFlags};
        let algorithm = digest.algorithm();
        let slot = &self.objects_dirs[Algorithm::ALL.iter().position(|a| *a == algorithm).unwrap_or(0)];
        let dir = match slot.get() {
            Some(dir) => dir,
            None => match rustix::fs::open(
                self.objects_dir(algorithm),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => slot.get_or_init(|| fd),
                // Not made yet (no object of this algorithm): nothing to open either.
                Err(_) => return File::open(self.object_path(digest)),
            },
        };
        let mut buf = [0u8; 128];
        let hex = digest.hex_in(&mut buf);
        let mut rel = [0u8; 3 + 128];
        let n = 3 + hex.len();
        rel[..2].copy_from_slice(&hex.as_bytes()[..2]);
        rel[2] = b'/';
        rel[3..n].copy_from_slice(hex.as_bytes());
        let rel = std::str::from_utf8(&rel[..n]).map_err(io::Error::other)?;
        let fd = rustix::fs::openat(dir, rel, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(File::from(fd))
    }

    /// A committed object to serve, refreshing its place in the LRU order. One no larger than
    /// the memory limit's `max_object` comes as its bytes: from memory, or read whole and
    /// verified against its digest (then kept in memory). One that does not match its digest
    /// is moved to `quarantine/` and reported absent, so that it is fetched again.
    pub fn open_stored(&self, digest: &Digest) -> Result<Option<Stored>, StoreError> {
        if let Some(hit) = self.memory.object(digest) {
            if hit.claim_touch(now_secs(), TOUCH_EVERY.as_secs()) {
                if let Ok(f) = File::options().write(true).open(self.object_path(digest)) {
                    let _ = f.set_modified(SystemTime::now());
                }
            }
            return Ok(Some(Stored::Memory(hit.bytes)));
        }
        let Some((file, len, touched)) = self.open_touched(digest)? else { return Ok(None) };
        if len > self.memory.limit.max_object {
            // Too large to check on every read: a scrubber checks it after its first read.
            self.first_reads.read(digest);
            return Ok(Some(Stored::File { file, len }));
        }
        // Only from the page cache: a read that would wait for the disk is left to the file
        // path, which reads on a blocking thread (the caller runs on the async threads).
        let Some(buf) = read_cached(&file, len).map_err(|e| self.err(e))? else {
            return Ok(Some(Stored::File { file, len }));
        };
        let actual = digest.algorithm().digest(&buf);
        if actual != *digest {
            let path = self.object_path(digest);
            tracing::error!(%digest, %actual, path = %path.display(), "stored object does not match its digest; quarantined, to be fetched again");
            self.quarantine(digest, &path)?;
            return Ok(None);
        }
        let bytes = Bytes::from(buf);
        self.memory.keep_object(digest, bytes.clone(), touched);
        Ok(Some(Stored::Memory(bytes)))
    }

    /// Move a corrupt object aside (`quarantine/<name>.<time>`), forgetting it.
    pub(crate) fn quarantine(&self, digest: &Digest, path: &Path) -> Result<PathBuf, StoreError> {
        self.memory.forget_object(digest);
        let stamp = now_secs();
        // sha256 objects keep the name format 2 gave them; others name their algorithm.
        let name = match digest.algorithm() {
            Algorithm::Sha256 => format!("{}.{stamp}", digest.hex()),
            other => format!("{other}-{}.{stamp}", digest.hex()),
        };
        let target = self.quarantine_dir().join(name);
        fs::create_dir_all(self.quarantine_dir()).map_err(|e| self.err(e))?;
        fs::rename(path, &target).map_err(|e| self.err(e))?;
        Ok(target)
    }

    /// A small committed object (a manifest) whole, through memory like [`Store::open_stored`]
    /// (one larger than the memory limit's `max_object` is read from disk).
    pub fn read_small(&self, digest: &Digest) -> Result<Option<Bytes>, StoreError> {
        match self.open_stored(digest)? {
            None => Ok(None),
            Some(Stored::Memory(b)) => Ok(Some(b)),
            Some(Stored::File { mut file, len }) => {
                let mut buf = Vec::with_capacity(len as usize);
                file.read_to_end(&mut buf).map_err(|e| self.err(e))?;
                Ok(Some(Bytes::from(buf)))
            }
        }
    }

    /// Read a small committed object (a manifest) whole.
    pub fn read_object(&self, digest: &Digest) -> Result<Option<Vec<u8>>, StoreError> {
        match self.open_object(digest)? {
            None => Ok(None),
            Some((mut f, len)) => {
                let mut buf = Vec::with_capacity(len as usize);
                f.read_to_end(&mut buf).map_err(|e| self.err(e))?;
                Ok(Some(buf))
            }
        }
    }

    /// A spool file for the fill identified by `key` (a digest or an asset key), truncated,
    /// hashing with the algorithm of the digest it is to be committed under.
    pub fn create_spool(&self, key: &str, algorithm: Algorithm) -> Result<SpoolWriter, StoreError> {
        SpoolWriter::create(self.spool_path(key), algorithm).map_err(|e| self.err(e))
    }

    /// A spool writer that stores nothing, for a pass-through fill whose spool file could not
    /// be created (see [`SpoolWriter::stop_storing`]).
    pub fn unstored_spool(&self, key: &str, algorithm: Algorithm) -> Result<SpoolWriter, StoreError> {
        SpoolWriter::unstored(self.spool_path(key), algorithm).map_err(|e| self.err(e))
    }

    /// The spool file for `key`.
    pub fn spool_path(&self, key: &str) -> PathBuf {
        let name = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()));
        self.spool_dir().join(format!("{name}.part"))
    }

    /// Reopen a leftover spool file for `key` (after a crash), re-hashing what it holds.
    pub fn resume_spool(&self, key: &str, algorithm: Algorithm) -> Result<Option<SpoolWriter>, StoreError> {
        let path = self.spool_path(key);
        if !path.exists() {
            return Ok(None);
        }
        SpoolWriter::reopen(path, algorithm).map(Some).map_err(|e| self.err(e))
    }

    /// Make a sealed spool file visible as `expected`, if and only if its content hashes to it
    /// (with `expected`'s algorithm: a spool hashed with another one never matches).
    pub fn commit(&self, sealed: Sealed, expected: &Digest) -> Result<PathBuf, StoreError> {
        if sealed.digest != *expected {
            let _ = fs::remove_file(&sealed.path);
            return Err(StoreError::DigestMismatch {
                path: sealed.path,
                expected: Box::new(*expected),
                actual: Box::new(sealed.digest),
            });
        }
        let target = self.object_path(expected);
        let dir = target.parent().ok_or_else(|| self.err(io::Error::other("object path has no parent")))?;
        fs::create_dir_all(dir).map_err(|e| self.err(e))?;
        let new = !target.exists();
        fs::rename(&sealed.path, &target).map_err(|e| self.err(e))?;
        if new {
            self.room.added(sealed.len);
        }
        sync_dir(dir).map_err(|e| self.err(e))?;
        Ok(target)
    }

    /// Store a small object held in memory (a manifest) under its own digest.
    pub fn put_bytes(&self, key: &str, bytes: &[u8], expected: &Digest) -> Result<PathBuf, StoreError> {
        if let Some(len) = self.object_len(expected) {
            if len == bytes.len() as u64 {
                return Ok(self.object_path(expected));
            }
        }
        let n = SPOOL_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut w = self.create_spool(&format!("{key}#{}#{n}", std::process::id()), expected.algorithm())?;
        if let Err(e) = w.append(bytes) {
            // A full disk: leave no empty spool file behind (issue 41 item 4).
            w.discard();
            return Err(self.err(e));
        }
        let path = w.path().to_path_buf();
        let sealed = w.seal().map_err(|e| {
            let _ = fs::remove_file(&path);
            self.err(e)
        })?;
        self.commit(sealed, expected)
    }

    /// Remove a committed object (eviction, `catalog trust --reset`) and its known-upstream
    /// record (a later copy may come from another upstream).
    pub fn remove_object(&self, digest: &Digest) -> Result<(), StoreError> {
        self.memory.forget_object(digest);
        self.forget_known(digest)?;
        let path = self.object_path(digest);
        let len = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        match fs::remove_file(&path) {
            Ok(()) => {
                self.room.removed(len);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }
}

fn take_lock(root: &Path) -> Result<File, StoreError> {
    let path = root.join(LOCK_FILE);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| StoreError::io(root, e))?;
    if f.try_lock().is_err() {
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        let holder = holder.trim();
        return Err(StoreError::Locked {
            dir: root.to_path_buf(),
            holder: if holder.is_empty() { String::new() } else { format!(" (pid {holder})") },
        });
    }
    let _ = f.set_len(0);
    let _ = write!(f, "{}", std::process::id());
    let _ = f.sync_all();
    Ok(f)
}

/// The whole of a small file, if the page cache holds all of it (`RWF_NOWAIT`: never waits
/// for the disk); `None` when it does not. tmpfs and ramfs have no `RWF_NOWAIT` (EOPNOTSUPP),
/// but their pages are memory: read as usual.
fn read_cached(file: &File, len: u64) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; len as usize];
    let mut at = 0usize;
    while at < buf.len() {
        let mut iov = [io::IoSliceMut::new(&mut buf[at..])];
        match rustix::io::preadv2(file, &mut iov, at as u64, rustix::io::ReadWriteFlags::NOWAIT) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "object shorter than its size")),
            Ok(n) => at += n,
            Err(rustix::io::Errno::AGAIN) => return Ok(None),
            Err(rustix::io::Errno::OPNOTSUPP) => {
                std::os::unix::fs::FileExt::read_exact_at(file, &mut buf[at..], at as u64)?;
                at = buf.len();
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(buf))
}

/// Refresh an object's mtime, the LRU clock, unless it was refreshed recently. The mtime it
/// has now, in seconds.
fn touch(path: impl FnOnce() -> PathBuf, meta: &fs::Metadata) -> u64 {
    let now = SystemTime::now();
    let modified = meta.modified().ok();
    let stale = modified.and_then(|m| now.duration_since(m).ok()).is_none_or(|age| age > TOUCH_EVERY);
    let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if stale {
        if let Ok(f) = File::options().write(true).open(path()) {
            if f.set_modified(now).is_ok() {
                return secs(now);
            }
        }
    }
    modified.map_or(0, secs)
}
