//! Importing a bundle into a store, in three phases:
//!
//! 1. **Content.** Every blob is hashed while it is read (a directory's files, or a tar's members
//!    as they stream by) and committed under its digest only if it matches; one that does not
//!    refuses the bundle. Committing early is harmless: an object nobody knows in an upstream,
//!    with no tag, trust record or pin, is served to no one. Only regular files are read: a
//!    directory bundle's members are opened without following a link or waiting on a FIFO or a
//!    device, and a tar member named as a layout file that is a link or a special file refuses
//!    the bundle (issue 32 (6)).
//! 2. **Verification.** `index.json` is walked: every image manifest's config and layers, and at
//!    least one manifest of every index, must be in the bundle, or (a delta relies on what an
//!    earlier import stored) already known in the upstream the entry's name routes to (for an OS
//!    image: already trusted under the same asset path). An object the bundle does not carry is
//!    never granted to a new upstream, and the refusal reads the same whether this store holds it
//!    or not (no size, no "stored"). Names must route to a configured upstream; an OS image's
//!    trust record may not contradict one this store already holds. Each distinct manifest is
//!    read and walked once, however many entries or indexes name it, and an index holds at most
//!    [`MAX_INDEX_ENTRIES`] entries, a manifest [`MAX_LAYERS`] layers (issue 32 (4)).
//! 3. **Registration**, only when the whole bundle verified: manifest records, the upstream each
//!    object is known in, pins, then the tags (authoritative: `imported`) and trust records;
//!    each record once, however many entries share it, written in batches
//!    ([`Store::put_records`]).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Condvar, Mutex, MutexGuard, PoisonError};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use tender_catalog::asset::AssetPath;
use tender_oci::{media, Algorithm, Digest, ImageRef, Reference, RepoName};
use tender_store::{ImportEntry, ImportRecord, ManifestMeta, Store, StoreError, TagRecord, TrustRecord, BUNDLE_PIN};

use crate::layout::{self, Descriptor, Document, INDEX_FILE, LAYOUT_FILE, MAX_DOCUMENT_BYTES};
use crate::packing::{OnBytes, Packed};

/// Where an image name is served from: the upstream a client's request for it routes to.
pub trait Router {
    /// `(upstream name, repository in that upstream)`, or why the name has no upstream.
    fn route(&self, image: &ImageRef) -> Result<(String, RepoName), String>;

    /// Whether what is served through `upstream` goes only to authenticated clients (it has
    /// credentials or is `private` at this site).
    fn is_private(&self, _upstream: &str) -> bool {
        false
    }

    /// The site's signature policy: every image it covers must verify with what the bundle
    /// carries, or the bundle is refused whole.
    fn policy(&self) -> Option<std::sync::Arc<tender_verify::Policy>> {
        None
    }
}

#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// `--registry`: the registry (and, for a bare tag, repository) of names that lack one.
    pub registry: Option<String>,
    /// Refuse a bundle larger than this many bytes of members.
    pub max_bytes: Option<u64>,
    /// Keep what was imported out of eviction (an air-gapped site cannot fetch it again).
    pub pin: bool,
    /// `--expect-index`: the index digest `tender export` printed on the other side; a bundle
    /// whose `index.json` is anything else is refused.
    pub expect_index: Option<Digest>,
    /// `--allow-public`: register an image the exporting site served only to authenticated
    /// clients under an upstream that is not private here.
    pub allow_public: bool,
    /// Who imports (kept in the import record): `admin token`, `user root`.
    pub identity: String,
    /// Where the bundle was read from, when known (kept in the import record).
    pub source: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The bundle is wrong: nothing of it became visible.
    #[error("bundle refused: {0}")]
    Refused(String),
    #[error("bundle refused: larger than the import limit of {0} bytes")]
    TooLarge(u64),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reading the bundle: {0}")]
    Io(#[from] io::Error),
}

fn refused(message: impl Into<String>) -> ImportError {
    ImportError::Refused(message.into())
}

/// What an import registered.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportReport {
    /// sha256 of the bundle's `index.json`, as `tender export` printed it.
    pub index_digest: String,
    /// A delta: the index digest of the bundle it builds on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta_of: Option<String>,
    /// Blobs the bundle held, all verified; of them, not stored before.
    pub blobs: u64,
    pub new_blobs: u64,
    pub bytes: u64,
    pub images: Vec<ImportedImage>,
    pub assets: Vec<ImportedAsset>,
    /// Entries with no name to register (their content is stored, not visible).
    pub unnamed: Vec<String>,
    /// Members that are not part of an OCI layout, skipped.
    pub ignored: Vec<String>,
    /// The digest of the bundle's declared content (`export --spec`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportedImage {
    /// `ghcr.io/siderolabs/kubelet:v1.35.0`, or `registry/repository@digest` for an untagged one.
    pub name: String,
    pub upstream: String,
    pub digest: String,
    pub media_type: String,
    /// Manifests and blobs of its graph that are stored.
    pub objects: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportedAsset {
    pub path: String,
    pub digest: String,
    pub size: u64,
}

/// Phase 1: members as they arrive.
struct Intake<'a> {
    store: &'a Store,
    /// New blobs, hashed and written, on their way to be made durable and committed (on
    /// other threads, so the next blob is read and hashed meanwhile).
    commits: mpsc::SyncSender<Pending>,
    ahead: &'a Ahead,
    /// Verified blobs of the bundle and their sizes.
    verified: HashMap<Digest, u64>,
    new_blobs: u64,
    bytes: u64,
    index: Option<Vec<u8>>,
    layout: Option<Vec<u8>>,
    ignored: Vec<String>,
    max_bytes: Option<u64>,
    seq: u64,
}

/// Ignored member names reported, at most.
const MAX_IGNORED: usize = 20;

fn read_small(reader: &mut dyn Read, limit: u64, what: &str) -> Result<Vec<u8>, ImportError> {
    let mut buf = Vec::new();
    reader.take(limit + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > limit {
        return Err(refused(format!("{what} is larger than {limit} bytes")));
    }
    Ok(buf)
}

/// Whether a member name is one import reads: `oci-layout`, `index.json` or a blob.
fn is_layout_member(name: &str) -> bool {
    name == INDEX_FILE || name == LAYOUT_FILE || layout::blob_digest(name).is_some()
}

impl<'a> Intake<'a> {
    fn new(
        store: &'a Store,
        max_bytes: Option<u64>,
        commits: mpsc::SyncSender<Pending>,
        ahead: &'a Ahead,
    ) -> Intake<'a> {
        Intake {
            store,
            commits,
            ahead,
            verified: HashMap::new(),
            new_blobs: 0,
            bytes: 0,
            index: None,
            layout: None,
            ignored: Vec::new(),
            max_bytes,
            seq: 0,
        }
    }

    fn member(&mut self, name: &str, size: u64, reader: &mut dyn Read) -> Result<(), ImportError> {
        self.bytes += size;
        if let Some(max) = self.max_bytes.filter(|m| self.bytes > *m) {
            return Err(ImportError::TooLarge(max));
        }
        let name = layout::normalize(name);
        match name {
            INDEX_FILE => self.index = Some(read_small(reader, MAX_DOCUMENT_BYTES, INDEX_FILE)?),
            LAYOUT_FILE => self.layout = Some(read_small(reader, 4096, LAYOUT_FILE)?),
            _ => match layout::blob_digest(name) {
                Some(d) => self.blob(&d, size, reader)?,
                None => {
                    if self.ignored.len() < MAX_IGNORED {
                        self.ignored.push(name.to_string());
                    }
                }
            },
        }
        Ok(())
    }

    /// Hash a blob; commit it when it is new and matches.
    fn blob(&mut self, digest: &Digest, size: u64, reader: &mut dyn Read) -> Result<(), ImportError> {
        // (a small blob gets a small buffer: 2,000 of them do not zero 2 GB)
        let mut buf = vec![0u8; usize::try_from(size.clamp(4096, 1 << 20)).unwrap_or(1 << 20)];
        if self.verified.contains_key(digest) || self.store.object_len(digest) == Some(size) {
            // Stored already (or twice in the bundle): verified, not written again.
            let mut hasher = digest.algorithm().hasher();
            let mut len = 0u64;
            loop {
                let n = reader.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                len += n as u64;
            }
            let got = hasher.finalize();
            if got != *digest || len != size {
                return Err(refused(format!("{}: its content hashes to {got}", layout::blob_path(digest))));
            }
            self.verified.insert(*digest, size);
            return Ok(());
        }
        if size <= SMALL_BLOB {
            return self.small_blob(digest, size, reader);
        }
        self.seq += 1;
        let key = format!("import:{digest}#{}#{}", std::process::id(), self.seq);
        let mut spool = self.store.create_spool(&key, digest.algorithm())?;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    spool.discard();
                    return Err(e.into());
                }
            };
            if n == 0 {
                break;
            }
            if let Err(e) = spool.append(&buf[..n]) {
                spool.discard();
                return Err(ImportError::Io(e));
            }
        }
        let len = spool.len();
        if len != size {
            spool.discard();
            return Err(refused(format!("{}: {len} bytes where {size} were announced", layout::blob_path(digest))));
        }
        self.send(Pending::Spooled { spool: Box::new(spool), digest: *digest, len })?;
        self.verified.insert(*digest, size);
        self.new_blobs += 1;
        Ok(())
    }

    /// A new small blob: read and verified in memory, then written, made durable and committed
    /// by a committer (so that creating its file overlaps with the others', too).
    fn small_blob(&mut self, digest: &Digest, size: u64, reader: &mut dyn Read) -> Result<(), ImportError> {
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        reader.take(size + 1).read_to_end(&mut bytes)?;
        let len = bytes.len() as u64;
        if len != size {
            return Err(refused(format!("{}: {len} bytes where {size} were announced", layout::blob_path(digest))));
        }
        let got = digest.algorithm().digest(&bytes);
        if got != *digest {
            return Err(refused(format!("{}: its content hashes to {got}", layout::blob_path(digest))));
        }
        self.send(Pending::Bytes { bytes, digest: *digest })?;
        self.verified.insert(*digest, size);
        self.new_blobs += 1;
        Ok(())
    }

    /// Hand a new blob to the committers, once it fits in [`COMMIT_AHEAD`].
    fn send(&mut self, pending: Pending) -> Result<(), ImportError> {
        let len = pending.len();
        self.ahead.reserve(len);
        if let Err(mpsc::SendError(p)) = self.commits.send(pending) {
            self.ahead.release(len);
            p.discard();
            return Err(io::Error::other("the committers stopped").into());
        }
        Ok(())
    }
}

/// A new blob on its way to be made durable and committed.
enum Pending {
    /// Written and hashed by the reader into a spool file, committed if it hashed to `digest`.
    Spooled { spool: Box<tender_store::SpoolWriter>, digest: Digest, len: u64 },
    /// Read and verified in memory ([`SMALL_BLOB`] bytes at most).
    Bytes { bytes: Vec<u8>, digest: Digest },
}

impl Pending {
    fn len(&self) -> u64 {
        match self {
            Pending::Spooled { len, .. } => *len,
            Pending::Bytes { bytes, .. } => bytes.len() as u64,
        }
    }

    fn discard(self) {
        if let Pending::Spooled { spool, .. } = self {
            spool.discard();
        }
    }
}

/// Blobs this size or smaller are read into memory, not spooled by the reader.
const SMALL_BLOB: u64 = 1 << 20;

/// Threads that make new blobs durable and commit them. The file system overlaps their
/// fsyncs: 2,000 small blobs took 13 s one at a time on an ext4 disk (two fsyncs each), a
/// tenth of that sixteen at a time.
const COMMITTERS: usize = 16;

/// Bytes of new blobs read ahead of their commits, at most (one blob, whatever its size, may
/// always be): how far the reader runs ahead of the fsyncs, and what small blobs in flight hold
/// in memory.
const COMMIT_AHEAD: u64 = 64 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// New blobs handed to the committers and not committed yet: how many, how many bytes.
#[derive(Default)]
struct Ahead {
    state: Mutex<(usize, u64)>,
    committed: Condvar,
}

impl Ahead {
    /// Wait until `len` more bytes fit (or nothing is in flight), then count them.
    fn reserve(&self, len: u64) {
        let mut s = lock(&self.state);
        while s.0 > 0 && s.1.saturating_add(len) > COMMIT_AHEAD {
            s = self.committed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.0 += 1;
        s.1 += len;
    }

    fn release(&self, len: u64) {
        let mut s = lock(&self.state);
        s.0 = s.0.saturating_sub(1);
        s.1 = s.1.saturating_sub(len);
        self.committed.notify_all();
    }
}

/// Releases a blob's place in [`Ahead`] however its commit ends.
struct Released<'a>(&'a Ahead, u64);

impl Drop for Released<'_> {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}

/// One committer: make each pending blob durable and commit it; a blob whose bytes are not its
/// digest refuses the bundle (it is removed, never visible). After a failure (`failed`, set by
/// any committer) the rest is discarded.
fn commit_all(
    store: &Store,
    pending: &Mutex<mpsc::Receiver<Pending>>,
    ahead: &Ahead,
    failed: &AtomicBool,
) -> Result<(), ImportError> {
    let mut first_error = None;
    loop {
        let next = lock(pending).recv();
        let Ok(next) = next else { break };
        let _released = Released(ahead, next.len());
        if failed.load(Ordering::Relaxed) {
            next.discard();
            continue;
        }
        let (committed, digest) = match next {
            Pending::Spooled { spool, digest, .. } => match spool.seal() {
                Ok(sealed) => (store.commit(sealed, &digest), digest),
                Err(e) => {
                    failed.store(true, Ordering::Relaxed);
                    first_error.get_or_insert(ImportError::Io(e));
                    continue;
                }
            },
            Pending::Bytes { bytes, digest } => (store.put_bytes(&format!("import:{digest}"), &bytes, &digest), digest),
        };
        let result = match committed {
            Ok(_) => continue,
            Err(StoreError::DigestMismatch { actual, .. }) => {
                refused(format!("{}: its content hashes to {actual}", layout::blob_path(&digest)))
            }
            Err(e) => e.into(),
        };
        failed.store(true, Ordering::Relaxed);
        first_error.get_or_insert(result);
    }
    first_error.map_or(Ok(()), Err)
}

/// Run phase 1 with `read` feeding an intake while other threads commit, then phases 2 and 3.
fn import_with(
    store: &Store,
    router: &dyn Router,
    options: &ImportOptions,
    read: impl FnOnce(&mut Intake<'_>) -> Result<(), ImportError>,
) -> Result<ImportReport, ImportError> {
    let ahead = Ahead::default();
    let failed = AtomicBool::new(false);
    let (tx, rx) = mpsc::sync_channel(COMMITTERS);
    let rx = Mutex::new(rx);
    std::thread::scope(|scope| {
        let committers: Vec<_> =
            (0..COMMITTERS).map(|_| scope.spawn(|| commit_all(store, &rx, &ahead, &failed))).collect();
        let mut intake = Intake::new(store, options.max_bytes, tx, &ahead);
        let read_result = read(&mut intake);
        let Intake { store, commits, verified, new_blobs, index, layout, ignored, .. } = intake;
        drop(commits);
        // A wrong digest found by a committer explains a reader error that followed it.
        let mut committed = Ok(());
        for c in committers {
            let result = c.join().unwrap_or_else(|_| Err(io::Error::other("a committer panicked").into()));
            committed = match (committed, result) {
                (Err(e @ ImportError::Refused(_)), _) | (Ok(()), Err(e)) => Err(e),
                (Err(_), Err(e @ ImportError::Refused(_))) => Err(e),
                (done, _) => done,
            };
        }
        match (committed, read_result) {
            (Err(e @ ImportError::Refused(_)), _) => return Err(e),
            (_, Err(e)) => return Err(e),
            (Err(e), Ok(())) => return Err(e),
            (Ok(()), Ok(())) => {}
        }
        let done = Read1 { store, verified, new_blobs, index, layout, ignored };
        finish(done, router, options)
    })
}

/// What phase 1 read and committed.
struct Read1<'a> {
    store: &'a Store,
    verified: HashMap<Digest, u64>,
    new_blobs: u64,
    index: Option<Vec<u8>>,
    layout: Option<Vec<u8>>,
    ignored: Vec<String>,
}

/// What a file that is not a regular one is.
fn kind_of(t: FileType) -> &'static str {
    match t {
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Directory => "a directory",
        FileType::RegularFile => "a regular file",
        FileType::Unknown => "of an unknown type",
    }
}

fn not_regular(path: &Path, kind: &str) -> ImportError {
    refused(format!(
        "{} is {kind}, not a regular file: import reads only regular files and follows no link",
        path.display()
    ))
}

fn errno(e: Errno) -> ImportError {
    ImportError::Io(e.into())
}

/// A file's type, as `lstat` says (a link is itself).
fn type_at(dir: impl AsFd, name: &CStr) -> Result<Option<FileType>, ImportError> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(errno(e)),
    }
}

/// Open `name` in the directory `dir` (shown as `shown`) if it is a regular file: its handle and
/// length, `None` if there is none. Anything else refuses the bundle. A look first, so that a
/// FIFO or a device is not even opened; then the open follows no link (`O_NOFOLLOW`) and waits
/// on nothing (`O_NONBLOCK`), and the type of what it opened decides (`fstat`), so nothing
/// swapped in after the look is read.
fn open_file(dir: &OwnedFd, name: &CStr, shown: &Path) -> Result<Option<(File, u64)>, ImportError> {
    match type_at(dir, name)? {
        None => return Ok(None),
        Some(FileType::RegularFile) => {}
        Some(other) => return Err(not_regular(shown, kind_of(other))),
    }
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(Errno::LOOP) => return Err(not_regular(shown, kind_of(FileType::Symlink))),
        Err(e) => return Err(errno(e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(errno)?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Ok(Some((File::from(fd), u64::try_from(st.st_size).unwrap_or(0)))),
        other => Err(not_regular(shown, kind_of(other))),
    }
}

/// Open the directory `name` in `dir` without following a link; `None` if there is none.
fn open_dir(dir: &OwnedFd, name: &CStr, shown: &Path) -> Result<Option<OwnedFd>, ImportError> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(Errno::LOOP | Errno::NOTDIR) => {
            let kind = type_at(dir, name)?.map_or("gone", kind_of);
            Err(refused(format!("{} is {kind}, not a directory: import follows no link", shown.display())))
        }
        Err(e) => Err(errno(e)),
    }
}

/// The entries of a directory and their types (asked with `lstat` where the file system does
/// not say).
fn entries(dir: &OwnedFd) -> Result<Vec<(CString, FileType)>, ImportError> {
    let mut out = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir).map_err(errno)? {
        let entry = entry.map_err(errno)?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => type_at(dir, name)?.unwrap_or(FileType::Unknown),
            known => known,
        };
        out.push((name.to_owned(), kind));
    }
    Ok(out)
}

/// Phase 1 over a directory layout: `oci-layout`, `index.json` and `blobs/<algorithm>/*`, each
/// opened relative to its directory's handle (issue 32 (6): a blob that was a symbolic link
/// "verified" against the file it pointed at, a FIFO hung the import). Anything under `blobs/`
/// that is neither a directory nor a regular file, or anything in `blobs/<algorithm>/` that is
/// not a regular file, refuses the bundle; other regular files in `blobs/` are not read.
fn read_dir(dir: &Path, intake: &mut Intake<'_>) -> Result<(), ImportError> {
    let root = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("{}: {e}", dir.display())))?;
    for (name, c_name) in [(LAYOUT_FILE, c"oci-layout"), (INDEX_FILE, c"index.json")] {
        if let Some((mut f, len)) = open_file(&root, c_name, &dir.join(name))? {
            intake.member(name, len, &mut f)?;
        }
    }
    let blobs_path = dir.join("blobs");
    let Some(blobs) = open_dir(&root, c"blobs", &blobs_path)? else { return Ok(()) };
    let mut algorithms = Vec::new();
    let mut files = Vec::new();
    for (name, kind) in entries(&blobs)? {
        let a = name.to_string_lossy().into_owned();
        let shown = blobs_path.join(&a);
        match kind {
            FileType::Directory => {
                let Some(fd) = open_dir(&blobs, &name, &shown)? else { continue };
                for (f, kind) in entries(&fd)? {
                    let member = format!("blobs/{a}/{}", f.to_string_lossy());
                    if kind != FileType::RegularFile {
                        return Err(not_regular(&dir.join(&member), kind_of(kind)));
                    }
                    files.push((member, algorithms.len(), f));
                }
                algorithms.push(fd);
            }
            FileType::RegularFile => {}
            other => return Err(not_regular(&shown, kind_of(other))),
        }
    }
    files.sort();
    for (member, algorithm, name) in files {
        let shown = dir.join(&member);
        let Some((mut f, len)) = open_file(&algorithms[algorithm], &name, &shown)? else {
            return Err(refused(format!("{} vanished while the bundle was read", shown.display())));
        };
        intake.member(&member, len, &mut f)?;
    }
    Ok(())
}

/// What a tar member that is not a regular file is.
fn tar_kind(t: tar::EntryType) -> String {
    match t {
        tar::EntryType::Symlink => "a symbolic link".into(),
        tar::EntryType::Link => "a hard link".into(),
        tar::EntryType::Fifo => "a FIFO".into(),
        tar::EntryType::Char => "a character device".into(),
        tar::EntryType::Block => "a block device".into(),
        tar::EntryType::Directory => "a directory".into(),
        tar::EntryType::GNUSparse => "a sparse file".into(),
        other => format!("a member of type {:?}", other.as_byte() as char),
    }
}

/// Phase 1 over a tar stream. A member cut short, a damaged header or a read error refuses
/// the bundle. Members are only read from the stream, never unpacked, so no link is followed;
/// a link or special file named as a layout member (`index.json`, a blob) refuses the bundle,
/// anywhere else it is skipped.
fn read_tar(reader: &mut dyn Read, intake: &mut Intake<'_>) -> Result<(), ImportError> {
    let damaged = |e: io::Error| refused(format!("the tar is truncated or damaged: {e}"));
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(damaged)? {
        let mut entry = entry.map_err(damaged)?;
        let kind = entry.header().entry_type();
        let name = entry.path().map_err(damaged)?.to_string_lossy().into_owned();
        if !matches!(kind, tar::EntryType::Regular | tar::EntryType::Continuous) {
            let name = layout::normalize(&name);
            if is_layout_member(name) {
                return Err(refused(format!(
                    "{name} is {}, not a regular file: a bundle's layout files and blobs are regular files, and import follows no link",
                    tar_kind(kind)
                )));
            }
            continue;
        }
        let size = entry.size();
        match intake.member(&name, size, &mut entry) {
            Ok(()) => {}
            Err(ImportError::Io(e)) => return Err(damaged(e)),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One index entry, verified.
struct Planned {
    entry: Descriptor,
    digest: Digest,
    media_type: String,
    /// Its manifest in the graph.
    node: usize,
    what: Kind,
}

enum Kind {
    Image { name: String, upstream: String, repository: RepoName, tag: Option<String> },
    Asset { asset: AssetPath, layer: Digest, size: u64 },
    Unnamed,
}

/// What an object the bundle does not carry must already be, to satisfy a descriptor of an
/// entry: registering never adds an upstream (or a trust record) to bytes that did not arrive
/// in this bundle.
#[derive(Clone, Copy)]
enum Scope<'a> {
    /// The entry's name routes to this upstream: known in it already.
    Upstream(&'a str),
    /// An OS image: this store already trusts the asset path (its layer is checked against the
    /// trust record by [`asset_kind`]).
    TrustedAsset,
    /// Nothing: every object must be in the bundle.
    Carried,
}

impl Scope<'_> {
    /// The scope as a key of the walks remembered.
    fn key(self) -> String {
        match self {
            Scope::Upstream(u) => format!("upstream:{}", u.to_ascii_lowercase()),
            Scope::TrustedAsset => "trusted-asset".into(),
            Scope::Carried => "carried".into(),
        }
    }
}

/// Deepest nesting of indexes walked.
const MAX_DEPTH: usize = 8;
/// Entries of an index (`index.json`, or an image index in the bundle), at most.
pub const MAX_INDEX_ENTRIES: usize = 10_000;
/// Layers of an image manifest, at most.
pub const MAX_LAYERS: usize = 10_000;

/// A manifest walked: what it refers to that is there.
struct Node {
    object: u32,
    /// Its media type, verified.
    media_type: String,
    size: u64,
    children: Vec<Edge>,
    /// Levels of descriptors below it, absent ones included (a layer: 1).
    height: usize,
    /// An image manifest of exactly one layer: that layer and the manifest's trust annotation
    /// (what an OS image is).
    single_layer: Option<(Descriptor, Option<String>)>,
}

#[derive(Clone, Copy)]
enum Edge {
    /// A blob (or a manifest referred to as a blob): an object.
    Leaf(u32),
    /// A manifest walked: a node.
    Node(usize),
}

/// Phase 2: the entries' graphs. Every object is numbered once, and every manifest is read and
/// walked once per declared media type and scope, however many entries or indexes name it
/// (issue 32 (4): 3,000 entries naming one manifest of 2,000 layers walked it 3,000 times,
/// and kept 3,000 copies of its objects: 103 s and 555 MB).
struct Verifier<'a> {
    store: &'a Store,
    verified: &'a HashMap<Digest, u64>,
    objects: Vec<Digest>,
    numbers: HashMap<Digest, u32>,
    nodes: Vec<Node>,
    /// (object, declared media type, scope) → node.
    walked: HashMap<(u32, String, String), usize>,
    /// A delta's base: the index digest of the bundle it was made against (`layout::SINCE`).
    since: Option<String>,
}

impl<'a> Verifier<'a> {
    fn new(store: &'a Store, verified: &'a HashMap<Digest, u64>) -> Verifier<'a> {
        Verifier {
            store,
            verified,
            objects: Vec::new(),
            numbers: HashMap::new(),
            nodes: Vec::new(),
            walked: HashMap::new(),
            since: None,
        }
    }

    fn number(&mut self, d: Digest) -> u32 {
        let next = self.objects.len() as u32;
        let n = *self.numbers.entry(d).or_insert(next);
        if n == next {
            self.objects.push(d);
        }
        n
    }

    /// Whether `d` of `size` bytes is in the bundle, or stored and already granted to `scope`.
    /// A size that disagrees with the bundle's own bytes refuses; for bytes the bundle does not
    /// carry, a disagreeing size reads as absent: nothing is said about what this store holds.
    fn available(&self, d: &Digest, size: u64, context: &str, scope: Scope<'_>) -> Result<bool, ImportError> {
        if let Some(n) = self.verified.get(d).copied() {
            return if n == size {
                Ok(true)
            } else {
                Err(refused(format!("{context}: {d} is {n} bytes in the bundle where its descriptor says {size}")))
            };
        }
        let granted = match scope {
            Scope::Upstream(upstream) => self.store.is_known_in(d, upstream)?,
            Scope::TrustedAsset => true,
            Scope::Carried => false,
        };
        Ok(granted && self.store.object_len(d) == Some(size))
    }

    /// Walk a descriptor's graph: its edge, or `None` when it is absent and not required.
    fn walk(
        &mut self,
        desc: &Descriptor,
        required: bool,
        context: &str,
        depth: usize,
        scope: Scope<'_>,
    ) -> Result<Option<Edge>, ImportError> {
        if depth > MAX_DEPTH {
            return Err(refused(format!("{context}: indexes nested deeper than {MAX_DEPTH}")));
        }
        let d: Digest =
            desc.digest.parse().map_err(|e| refused(format!("{context}: bad digest {:?}: {e}", desc.digest)))?;
        if !self.available(&d, desc.size, context, scope)? {
            if required {
                return Err(missing(context, &desc.media_type, &d, scope, self.since.as_deref()));
            }
            return Ok(None);
        }
        let object = self.number(d);
        if !media::is_manifest(&desc.media_type) {
            return Ok(Some(Edge::Leaf(object)));
        }
        let key = (object, desc.media_type.clone(), scope.key());
        if let Some(&node) = self.walked.get(&key) {
            if depth + self.nodes[node].height > MAX_DEPTH {
                return Err(refused(format!("{context}: indexes nested deeper than {MAX_DEPTH}")));
            }
            return Ok(Some(Edge::Node(node)));
        }
        if desc.size > MAX_DOCUMENT_BYTES {
            return Err(refused(format!("{context}: manifest {d} is larger than {MAX_DOCUMENT_BYTES} bytes")));
        }
        let bytes = self.store.read_object(&d)?.ok_or_else(|| refused(format!("{context}: {d} vanished")))?;
        let media_type = media::verified_media_type(Some(&desc.media_type), &bytes)
            .filter(|t| media::is_manifest(t))
            .ok_or_else(|| refused(format!("{context}: {d} is not a manifest")))?;
        let doc: Document = serde_json::from_slice(&bytes)
            .map_err(|e| refused(format!("{context}: manifest {d} does not parse: {e}")))?;
        drop(bytes);
        let inner = format!("{context} > {d}");
        let mut children = Vec::new();
        let mut height = 0;
        let mut below = |edge: Option<Edge>, nodes: &[Node]| {
            height = height.max(match edge {
                Some(Edge::Node(n)) => 1 + nodes[n].height,
                Some(Edge::Leaf(_)) | None => 1,
            });
            children.extend(edge);
        };
        let mut single_layer = None;
        if media::is_index(&media_type) {
            if doc.manifests.len() > MAX_INDEX_ENTRIES {
                return Err(refused(format!(
                    "{inner}: the index has {} entries, more than the {MAX_INDEX_ENTRIES} an index may have",
                    doc.manifests.len()
                )));
            }
            let mut present = 0;
            for child in &doc.manifests {
                let edge = self.walk(child, false, &inner, depth + 1, scope)?;
                present += usize::from(edge.is_some());
                below(edge, &self.nodes);
            }
            if present == 0 && !doc.manifests.is_empty() {
                return Err(refused(format!(
                    "{inner}: none of the index's manifests is there: not in the bundle{}",
                    delta_hint(scope, self.since.as_deref())
                )));
            }
        } else {
            if doc.layers.len() > MAX_LAYERS {
                return Err(refused(format!(
                    "{context}: manifest {d} has {} layers, more than the {MAX_LAYERS} a manifest may have",
                    doc.layers.len()
                )));
            }
            if let Some(config) = &doc.config {
                let edge = self.walk(config, true, &inner, depth + 1, scope)?;
                below(edge, &self.nodes);
            }
            for layer in &doc.layers {
                // A non-distributable layer (with `urls`) may be absent, as registries allow.
                let edge = self.walk(layer, layer.urls.is_empty(), &inner, depth + 1, scope)?;
                below(edge, &self.nodes);
            }
            if let [layer] = doc.layers.as_slice() {
                single_layer = Some((layer.clone(), doc.annotations.get(layout::TRUST_SHA256).cloned()));
            }
        }
        self.nodes.push(Node { object, media_type, size: desc.size, children, height, single_layer });
        let node = self.nodes.len() - 1;
        self.walked.insert(key, node);
        Ok(Some(Edge::Node(node)))
    }

    /// Call `each` once for every object of the graphs below `roots` (theirs included).
    fn visit(&self, roots: &[usize], marks: &mut Marks, mut each: impl FnMut(u32)) {
        marks.epoch += 1;
        let mut stack: Vec<usize> = roots.iter().copied().filter(|&n| marks.node(n)).collect();
        while let Some(n) = stack.pop() {
            let node = &self.nodes[n];
            if marks.object(node.object) {
                each(node.object);
            }
            for edge in &node.children {
                match *edge {
                    Edge::Leaf(o) => {
                        if marks.object(o) {
                            each(o);
                        }
                    }
                    Edge::Node(m) => {
                        if marks.node(m) {
                            stack.push(m);
                        }
                    }
                }
            }
        }
    }
}

/// Which objects and nodes a visit has seen: the number of the last visit that saw each.
struct Marks {
    epoch: u32,
    objects: Vec<u32>,
    nodes: Vec<u32>,
}

impl Marks {
    fn new(verifier: &Verifier<'_>) -> Marks {
        Marks { epoch: 0, objects: vec![0; verifier.objects.len()], nodes: vec![0; verifier.nodes.len()] }
    }

    /// Whether object `o` is new to this visit (it is not any more).
    fn object(&mut self, o: u32) -> bool {
        std::mem::replace(&mut self.objects[o as usize], self.epoch) != self.epoch
    }

    fn node(&mut self, n: usize) -> bool {
        std::mem::replace(&mut self.nodes[n], self.epoch) != self.epoch
    }
}

/// The refusal for content a descriptor needs and the bundle does not provide: the same words
/// whether or not this store holds it.
fn missing(context: &str, media_type: &str, d: &Digest, scope: Scope<'_>, since: Option<&str>) -> ImportError {
    let what = if media_type.is_empty() { "content" } else { media_type };
    refused(format!("{context}: {what} {d} is referenced but not in the bundle{}", delta_hint(scope, since)))
}

/// What to do about content a bundle leaves out: a delta names its base (the bundle to import
/// first, by its index digest, as `export` printed it and `bundle ls` shows it).
fn delta_hint(scope: Scope<'_>, since: Option<&str>) -> String {
    match (scope, since) {
        (Scope::Upstream(upstream), Some(base)) => format!(
            " (this bundle is a delta on the bundle with index {base}: import that one first; a delta may \
             leave out only what an earlier bundle imported into {upstream})"
        ),
        (Scope::Upstream(upstream), None) => {
            format!(" (a delta may leave out only what an earlier bundle imported into {upstream})")
        }
        (Scope::TrustedAsset, Some(base)) => {
            format!(" (this bundle is a delta on the bundle with index {base}: import that one first)")
        }
        (Scope::TrustedAsset | Scope::Carried, _) => String::new(),
    }
}

/// The name an entry is registered under, if any.
fn entry_name(entry: &Descriptor, registry: Option<&str>) -> Result<Option<ImageRef>, String> {
    if let Some(full) = entry.annotation(layout::CONTAINERD_NAME) {
        return ImageRef::parse(full).map(Some);
    }
    if let Some(name) = entry.annotation(layout::REF_NAME) {
        let name = name.trim();
        let bare_tag = !name.contains(['/', ':', '@']);
        if bare_tag {
            return match registry {
                Some(r) => ImageRef::parse(&format!("{}:{name}", r.trim_end_matches('/'))).map(Some),
                None => Err(format!(
                    "the entry {} is named only by the tag {name:?}; give --registry REGISTRY/REPOSITORY to import it",
                    entry.digest
                )),
            };
        }
        let first = name.split('/').next().unwrap_or("");
        let has_host = name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
        return match (registry, has_host) {
            (Some(r), false) => ImageRef::parse(&format!("{}/{name}", r.trim_end_matches('/'))).map(Some),
            _ => ImageRef::parse(name).map(Some),
        };
    }
    if let Some(repo) = entry.annotation(layout::REPOSITORY) {
        return ImageRef::parse(&format!("{repo}@{}", entry.digest)).map(Some);
    }
    Ok(None)
}

/// Phase 2 over what phase 1 read.
fn plan<'a>(
    intake: &'a Read1<'_>,
    router: &dyn Router,
    options: &ImportOptions,
) -> Result<(Document, Digest, Verifier<'a>, Vec<Planned>), ImportError> {
    let layout_bytes =
        intake.layout.as_ref().ok_or_else(|| refused("no oci-layout file: not an OCI image layout (or cut short)"))?;
    if !layout::layout_version_ok(layout_bytes) {
        return Err(refused("oci-layout does not name image layout version 1.x"));
    }
    let index_bytes =
        intake.index.as_ref().ok_or_else(|| refused("no index.json: not an OCI image layout (or cut short)"))?;
    let index_digest = Algorithm::Sha256.digest(index_bytes);
    if let Some(want) = options.expect_index.filter(|want| *want != index_digest) {
        return Err(refused(format!("its index.json is {index_digest}, not the expected {want}")));
    }
    let index: Document =
        serde_json::from_slice(index_bytes).map_err(|e| refused(format!("index.json does not parse: {e}")))?;
    if index.manifests.len() > MAX_INDEX_ENTRIES {
        return Err(refused(format!(
            "index.json has {} entries, more than the {MAX_INDEX_ENTRIES} an index may have: split the bundle",
            index.manifests.len()
        )));
    }
    let mut verifier = Verifier::new(intake.store, &intake.verified);
    // Named in refusals only as what it must be: a digest (the annotation is the bundle's word).
    verifier.since = index.annotations.get(layout::SINCE).filter(|s| s.parse::<Digest>().is_ok()).cloned();
    let mut out = Vec::new();
    for entry in &index.manifests {
        let context = entry
            .annotation(layout::REF_NAME)
            .or_else(|| entry.annotation(layout::FACTORY_PATH))
            .map_or_else(|| entry.digest.clone(), str::to_string);
        let digest: Digest = entry.digest.parse().map_err(|e| refused(format!("{context}: {e}")))?;
        // Whom the entry is for decides, before its graph is walked, what it may leave out.
        let asset = match entry.annotation(layout::FACTORY_PATH) {
            Some(path) => Some(AssetPath::parse(path).map_err(|e| refused(format!("{path}: {e}")))?),
            None => None,
        };
        let what = if asset.is_some() {
            None
        } else {
            Some(
                match entry_name(entry, options.registry.as_deref()).map_err(|e| refused(format!("{context}: {e}")))? {
                    Some(image) => {
                        if let Reference::Digest(d) = &image.reference {
                            if *d != digest {
                                return Err(refused(format!("{context}: named {d} but the entry is {digest}")));
                            }
                        }
                        let (upstream, repository) = router.route(&image).map_err(|e| {
                            refused(format!("{image}: {e}; add its registry to the upstreams of the config"))
                        })?;
                        if entry.annotation(layout::PRIVATE) == Some("true")
                            && !options.allow_public
                            && !router.is_private(&upstream)
                        {
                            return Err(refused(format!(
                                "{image} was private where it was exported (served to authenticated clients only), and \
                                 upstream {upstream} is not private here: set private: true on upstream {upstream} \
                                 (with client authentication), or import with --allow-public to serve it to everyone"
                            )));
                        }
                        let tag = match &image.reference {
                            Reference::Tag(t) => Some(t.to_string()),
                            Reference::Digest(_) => None,
                        };
                        Kind::Image { name: image.to_string(), upstream, repository, tag }
                    }
                    None => Kind::Unnamed,
                },
            )
        };
        let routed = match &what {
            Some(Kind::Image { upstream, .. }) => Some(upstream.clone()),
            _ => None,
        };
        let scope = match (&routed, &asset) {
            (Some(upstream), _) => Scope::Upstream(upstream),
            (_, Some(a)) if intake.store.trust_get(&a.key())?.is_some() => Scope::TrustedAsset,
            _ => Scope::Carried,
        };
        let Some(Edge::Node(node)) = verifier.walk(entry, true, &context, 0, scope)? else {
            return Err(refused(format!("{context}: the entry {digest} is not a manifest")));
        };
        let media_type = verifier.nodes[node].media_type.clone();
        let what = match (what, asset) {
            (Some(what), _) => what,
            (None, Some(asset)) => asset_kind(intake.store, &verifier, asset, entry, node, scope)?,
            (None, None) => Kind::Unnamed,
        };
        out.push(Planned { entry: entry.clone(), digest, media_type, node, what });
    }
    Ok((index, index_digest, verifier, out))
}

/// An OS image entry: one layer, the asset; its trust record may not contradict this store's.
fn asset_kind(
    store: &Store,
    verifier: &Verifier<'_>,
    asset: AssetPath,
    entry: &Descriptor,
    node: usize,
    scope: Scope<'_>,
) -> Result<Kind, ImportError> {
    let path = &asset.path();
    let Some((layer, doc_trust)) = &verifier.nodes[node].single_layer else {
        return Err(refused(format!("{path}: an OS image manifest has exactly one layer")));
    };
    let layer_digest: Digest = layer.digest.parse().map_err(|e| refused(format!("{path}: {e}")))?;
    if layer_digest.algorithm() != Algorithm::Sha256 {
        return Err(refused(format!("{path}: an OS image is addressed by sha256")));
    }
    if !verifier.available(&layer_digest, layer.size, path, scope)? {
        return Err(missing(path, &layer.media_type, &layer_digest, scope, verifier.since.as_deref()));
    }
    if let Some(trust) = entry.annotation(layout::TRUST_SHA256).or(doc_trust.as_deref()) {
        if trust != layer_digest.to_string() {
            return Err(refused(format!("{path}: the trust annotation {trust} is not the layer {layer_digest}")));
        }
    }
    if let Some(t) = store.trust_get(&asset.key())? {
        if t.digest != layer_digest {
            return Err(refused(format!(
                "{path}: this tender trusts {} for it since its first fetch, the bundle holds {layer_digest}; \
                 `tender catalog trust --reset` first if the new bytes are right",
                t.digest
            )));
        }
    }
    Ok(Kind::Asset { asset, layer: layer_digest, size: layer.size })
}

/// Phase 3: make the verified bundle visible. What to record is gathered first, each record
/// once however many entries share it (manifest records of every manifest walked, the upstream
/// of every object of each upstream's images, a pin for every object), and written in batches,
/// the tags last; then the trust records.
fn register(
    store: &Store,
    verifier: &Verifier<'_>,
    planned: &[Planned],
    options: &ImportOptions,
    report: &mut ImportReport,
) -> Result<(), ImportError> {
    let now = tender_store::now_secs();
    let mut metas: HashMap<Digest, ManifestMeta> = HashMap::new();
    for node in &verifier.nodes {
        let meta = ManifestMeta { media_type: node.media_type.clone(), size: node.size };
        metas.insert(verifier.objects[node.object as usize], meta);
    }
    let metas: Vec<(Digest, ManifestMeta)> = metas.into_iter().collect();
    let mut marks = Marks::new(verifier);
    let mut by_upstream: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for p in planned {
        if let Kind::Image { upstream, .. } = &p.what {
            by_upstream.entry(upstream).or_default().push(p.node);
        }
    }
    let mut known = Vec::new();
    for (upstream, roots) in &by_upstream {
        verifier.visit(roots, &mut marks, |o| known.push((verifier.objects[o as usize], *upstream)));
    }
    let pins = if options.pin { verifier.objects.clone() } else { Vec::new() };
    // What each entry holds, kept so that retiring the bundle (or one of its tags) releases
    // exactly its objects. Written before the pins and tags: a crash between them leaves a
    // record that holds more than is pinned, never pins no record accounts for.
    let mut entries = Vec::with_capacity(planned.len());
    let mut graphs: BTreeMap<Digest, Vec<Digest>> = BTreeMap::new();
    for p in planned {
        graphs.entry(p.digest).or_insert_with(|| {
            let mut objects = Vec::new();
            verifier.visit(&[p.node], &mut marks, |o| objects.push(verifier.objects[o as usize]));
            objects.sort();
            objects
        });
        let (kind, name, upstream, repository, tag) = match &p.what {
            Kind::Image { name, upstream, repository, tag } => {
                ("image", name.clone(), Some(upstream.clone()), Some(repository.to_string()), tag.clone())
            }
            Kind::Asset { asset, .. } => ("asset", asset.path(), None, None, None),
            Kind::Unnamed => ("unnamed", p.digest.to_string(), None, None, None),
        };
        entries.push(ImportEntry { kind: kind.into(), name, upstream, repository, tag, digest: p.digest });
    }
    let record = ImportRecord {
        index: report.index_digest.parse().map_err(|e| refused(format!("index digest: {e}")))?,
        imported_at: now,
        identity: options.identity.clone(),
        source: options.source.clone(),
        delta_of: report.delta_of.clone(),
        pinned: options.pin,
        blobs: report.blobs,
        bytes: report.bytes,
        spec: report.spec.as_deref().and_then(|s| s.parse().ok()),
        entries,
        graphs,
    };
    store.import_put(&record)?;
    let mut tags = Vec::new();
    for p in planned {
        if let Kind::Image { upstream, repository, tag: Some(tag), .. } = &p.what {
            tags.push(TagRecord {
                upstream: upstream.clone(),
                repository: repository.to_string(),
                tag: tag.clone(),
                digest: p.digest,
                media_type: p.media_type.clone(),
                size: p.entry.size,
                fetched_at: now,
                imported: true,
            });
        }
    }
    store.put_records(&metas, &known, &pins, BUNDLE_PIN, &tags)?;

    let mut objects: HashMap<usize, usize> = HashMap::new();
    for p in planned {
        match &p.what {
            Kind::Image { name, upstream, .. } => {
                let count = *objects.entry(p.node).or_insert_with(|| {
                    let mut n = 0;
                    verifier.visit(&[p.node], &mut marks, |_| n += 1);
                    n
                });
                report.images.push(ImportedImage {
                    name: name.clone(),
                    upstream: upstream.clone(),
                    digest: p.digest.to_string(),
                    media_type: p.media_type.clone(),
                    objects: count,
                });
            }
            Kind::Asset { asset, layer, size } => {
                if store.trust_get(&asset.key())?.is_none() {
                    store.trust_put(&TrustRecord { key: asset.key(), digest: *layer, size: *size, first_seen: now })?;
                }
                report.assets.push(ImportedAsset { path: asset.path(), digest: layer.to_string(), size: *size });
            }
            Kind::Unnamed => report.unnamed.push(p.digest.to_string()),
        }
    }
    Ok(())
}

fn finish(intake: Read1<'_>, router: &dyn Router, options: &ImportOptions) -> Result<ImportReport, ImportError> {
    let (index, index_digest, verifier, planned) = plan(&intake, router, options)?;
    let mut report = ImportReport {
        index_digest: index_digest.to_string(),
        delta_of: index.annotations.get(layout::SINCE).cloned(),
        blobs: intake.verified.len() as u64,
        new_blobs: intake.new_blobs,
        bytes: intake.verified.values().sum(),
        ignored: intake.ignored.clone(),
        spec: index.annotations.get(layout::SPEC).map(|t| Algorithm::Sha256.digest(t.as_bytes()).to_string()),
        ..ImportReport::default()
    };
    // The site's signature policy, before anything is registered.
    let verdicts = match router.policy() {
        Some(policy) => {
            let entries: Vec<crate::signed::Entry<'_>> = planned
                .iter()
                .filter_map(|p| match &p.what {
                    Kind::Image { name, upstream, repository, tag } => Some(crate::signed::Entry {
                        name,
                        upstream,
                        repository,
                        tag: tag.as_deref(),
                        digest: p.digest,
                        media_type: &p.media_type,
                    }),
                    _ => None,
                })
                .collect();
            crate::signed::check(intake.store, &policy, &entries, tender_store::now_secs()).map_err(refused)?
        }
        None => Vec::new(),
    };
    register(intake.store, &verifier, &planned, options, &mut report)?;
    for v in &verdicts {
        intake.store.verdict_put(v)?;
    }
    Ok(report)
}

/// Import a directory layout.
pub fn import_dir(
    dir: &Path,
    store: &Store,
    router: &dyn Router,
    options: &ImportOptions,
) -> Result<ImportReport, ImportError> {
    import_with(store, router, options, |intake| read_dir(dir, intake))
}

/// Import a tar stream (a file, or a request body).
pub fn import_tar(
    reader: &mut dyn Read,
    store: &Store,
    router: &dyn Router,
    options: &ImportOptions,
) -> Result<ImportReport, ImportError> {
    import_with(store, router, options, |intake| read_tar(reader, intake))
}

/// Import a bundle at `path`: a directory, a tar file (zstd-compressed or not) or a part set
/// ([`crate::packing::open`]).
pub fn import_path(
    path: &Path,
    store: &Store,
    router: &dyn Router,
    options: &ImportOptions,
) -> Result<ImportReport, ImportError> {
    let packed = crate::packing::open(path).map_err(opened)?;
    import_packed(&packed, store, router, options, None)
}

/// A bundle that cannot be opened: a part set that is wrong or incomplete is refused.
pub fn opened(e: io::Error) -> ImportError {
    match e.kind() {
        io::ErrorKind::InvalidData => refused(e.to_string()),
        _ => ImportError::Io(e),
    }
}

/// Import a bundle found by [`crate::packing::open`]; `progress` counts the bytes read from a
/// tar file or the parts. A tar stream is read to its end before anything is registered, so
/// every part is verified (and zstd's checksum checked) first; a failure that a wrong part
/// explains is reported as that part's.
pub fn import_packed(
    packed: &Packed,
    store: &Store,
    router: &dyn Router,
    options: &ImportOptions,
    progress: Option<OnBytes>,
) -> Result<ImportReport, ImportError> {
    if packed.is_dir() {
        return import_dir(packed.base(), store, router, options);
    }
    let mut reader = packed.tar_reader(progress)?;
    let result = import_with(store, router, options, |intake| {
        read_tar(&mut reader, intake)?;
        io::copy(&mut reader, &mut io::sink())
            .map_err(|e| refused(format!("the tar is truncated or damaged after its end: {e}")))?;
        Ok(())
    });
    match result {
        Err(e) => Err(reader.diagnose().map_or(e, refused)),
        ok => ok,
    }
}
