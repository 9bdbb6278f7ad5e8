//! Bundles sized for media (issue 35 (3)): a tar bundle compressed with zstd, and a tar bundle
//! (compressed or not) split into numbered parts.
//!
//! A part set written for `PATH` is the files `PATH.000`, `PATH.001`, … and its manifest
//! `PATH.parts.json` ([`PartSet`]): each part's file name, size and sha256, and what the joined
//! stream is (`tar` or `tar+zstd`). The manifest is written last, so a part set whose manifest
//! exists is complete. `PATH` itself is the bundle's name (`PATH.digest` and `PATH.sig` sign
//! it); no file is written there.
//!
//! Reading ([`open`], [`Packed::tar_reader`]) is one stream, never an unpacked copy: the parts
//! are read in order, each hashed as it goes by and compared with the manifest at its end, and
//! zstd is decoded on the way. Before anything is read, every part must be there, a regular
//! file of the size the manifest names. The last [`HOLD_BACK`] bytes of the tar (its end
//! blocks) are handed out only once the whole input was read and every part verified, so a
//! reader that stops at the tar's end (the server's import) has seen no end before that.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use tender_oci::{Algorithm, Digest, Hasher};

/// The smallest part `--split` writes: smaller parts are a mistake (a unit left off), not media.
pub const MIN_PART: u64 = 1 << 20;
/// The manifest of a part set is `PATH` with this appended.
pub const PARTS_SUFFIX: &str = ".parts.json";
/// `mediaType` of a part set's manifest.
pub const PARTS_MEDIA_TYPE: &str = "application/vnd.dev.tender.bundle.parts.v1+json";
/// zstd level: 3 (zstd's default), quick enough that the USB stick, not the CPU, sets the pace.
pub const ZSTD_LEVEL: i32 = 3;
/// Bytes of the tar held back until the whole input is read and verified: more than a tar's
/// end (two zero blocks, padded to a 10 KiB record by GNU tar).
pub const HOLD_BACK: usize = 16 << 10;
/// The largest part set manifest read.
const MAX_MANIFEST: u64 = 4 << 20;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Called with each count of bytes read from (or, writing, put into) a bundle.
pub type OnBytes = Arc<dyn Fn(u64) + Send + Sync>;

/// How a tar bundle's stream is compressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Compress {
    #[default]
    None,
    Zstd,
}

impl Compress {
    pub fn kind(self) -> StreamKind {
        match self {
            Compress::None => StreamKind::Tar,
            Compress::Zstd => StreamKind::TarZstd,
        }
    }
}

/// What a part set joins into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StreamKind {
    #[serde(rename = "tar")]
    Tar,
    #[serde(rename = "tar+zstd")]
    TarZstd,
}

impl StreamKind {
    fn compress(self) -> Compress {
        match self {
            StreamKind::Tar => Compress::None,
            StreamKind::TarZstd => Compress::Zstd,
        }
    }
}

/// How `export` packs a tar bundle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Packing {
    pub compress: Compress,
    /// Bytes per part (at least [`MIN_PART`]); `None`: one file.
    pub split: Option<u64>,
}

impl Packing {
    /// A tar (not a directory) is written: `PATH.tar`, `PATH.tar.zst`, or packed.
    pub fn is_stream(&self, dest: &Path) -> bool {
        self.compress != Compress::None || self.split.is_some() || is_tar(dest)
    }

    /// What a path's name asks for: `.tar.zst` / `.tzst` is compressed.
    pub fn for_name(dest: &Path) -> Packing {
        Packing { compress: compress_of_name(dest), split: None }
    }
}

/// Whether `path` names a tar bundle.
pub fn is_tar(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("tar"))
}

/// `Zstd` when the name ends in `.zst` or `.tzst`.
pub fn compress_of_name(path: &Path) -> Compress {
    match path.extension() {
        Some(e) if e.eq_ignore_ascii_case("zst") || e.eq_ignore_ascii_case("tzst") => Compress::Zstd,
        _ => Compress::None,
    }
}

/// One part of a part set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    /// A file name in the manifest's directory.
    pub name: String,
    pub size: u64,
    pub sha256: Digest,
}

/// `PATH.parts.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartSet {
    pub media_type: String,
    /// The joined parts: a tar, or a zstd-compressed tar.
    pub kind: StreamKind,
    pub parts: Vec<Part>,
    /// Bytes of all parts.
    pub size: u64,
    /// The bundle's index digest as written (for people; import checks the `index.json` it reads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_digest: Option<String>,
}

/// `<path><suffix>`.
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The name of part `n` of `base`.
fn part_name(base: &str, n: usize) -> String {
    format!("{base}.{n:03}")
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

// ---------------------------------------------------------------------------------------------
// Writing

/// Where a tar bundle's bytes go: one file or numbered parts, compressed or not.
pub(crate) struct Sink {
    layer: Layer,
    progress: Option<OnBytes>,
}

enum Layer {
    Plain(Bottom),
    Zstd(Box<zstd::stream::write::Encoder<'static, Bottom>>),
}

enum Bottom {
    File(BufWriter<File>),
    Parts(Box<Splitter>),
}

impl Write for Bottom {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Bottom::File(f) => f.write(buf),
            Bottom::Parts(p) => p.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Bottom::File(f) => f.flush(),
            Bottom::Parts(p) => p.flush(),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = match &mut self.layer {
            Layer::Plain(b) => b.write(buf)?,
            Layer::Zstd(z) => z.write(buf)?,
        };
        if let Some(p) = &self.progress {
            p(n as u64);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.layer {
            Layer::Plain(b) => b.flush(),
            Layer::Zstd(z) => z.flush(),
        }
    }
}

/// What a finished sink left: the file `partial`, or parts under temporary names.
pub(crate) enum Sunk {
    File(PathBuf),
    Parts(Vec<(PathBuf, Part)>),
}

impl Sink {
    /// Start writing to `partial` (one file) or, split, to `partial.000`, ….
    pub(crate) fn create(partial: &Path, dest: &Path, packing: Packing) -> io::Result<Sink> {
        let bottom = match packing.split {
            Some(size) => {
                if size < MIN_PART {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("parts of {size} bytes: a part is at least {MIN_PART} bytes (1MiB)"),
                    ));
                }
                let base = dest
                    .file_name()
                    .and_then(|n| n.to_str())
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a part set needs a UTF-8 file name"))?;
                Bottom::Parts(Box::new(Splitter {
                    partial: partial.to_path_buf(),
                    base: base.to_string(),
                    size,
                    current: None,
                    done: Vec::new(),
                }))
            }
            None => Bottom::File(BufWriter::with_capacity(1 << 20, File::create(partial)?)),
        };
        let layer = match packing.compress {
            Compress::None => Layer::Plain(bottom),
            Compress::Zstd => {
                let mut z = Box::new(zstd::stream::write::Encoder::new(bottom, ZSTD_LEVEL)?);
                z.include_checksum(true)?;
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                z.multithread(u32::try_from(threads).unwrap_or(1))?;
                Layer::Zstd(z)
            }
        };
        Ok(Sink { layer, progress: None })
    }

    pub(crate) fn set_progress(&mut self, progress: OnBytes) {
        self.progress = Some(progress);
    }

    /// Finish the stream and make every file durable (still under its temporary name).
    pub(crate) fn finish(self, partial: &Path) -> io::Result<Sunk> {
        let bottom = match self.layer {
            Layer::Plain(b) => b,
            Layer::Zstd(z) => (*z).finish()?,
        };
        match bottom {
            Bottom::File(w) => {
                let file = w.into_inner().map_err(|e| e.into_error())?;
                file.sync_all()?;
                Ok(Sunk::File(partial.to_path_buf()))
            }
            Bottom::Parts(mut s) => {
                s.close()?;
                Ok(Sunk::Parts(s.done))
            }
        }
    }
}

/// Remove what an interrupted export left: `partial` and `partial.000`, ….
pub(crate) fn remove_partial_parts(partial: &Path) -> io::Result<()> {
    for n in 0.. {
        let p = with_suffix(partial, &format!(".{n:03}"));
        match fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Rename finished parts into place and write the manifest last.
pub(crate) fn place_parts(
    dest: &Path,
    kind: StreamKind,
    parts: Vec<(PathBuf, Part)>,
    index_digest: Option<&Digest>,
) -> io::Result<()> {
    let dir = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut listed = Vec::new();
    for (tmp, part) in parts {
        fs::rename(&tmp, dir.join(&part.name))?;
        listed.push(part);
    }
    let set = PartSet {
        media_type: PARTS_MEDIA_TYPE.to_string(),
        kind,
        size: listed.iter().map(|p| p.size).sum(),
        parts: listed,
        index_digest: index_digest.map(|d| d.to_string()),
    };
    let manifest = with_suffix(dest, PARTS_SUFFIX);
    let tmp = with_suffix(&manifest, ".partial");
    let mut f = File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(&set).map_err(io::Error::other)?)?;
    f.sync_all()?;
    fs::rename(&tmp, &manifest)
}

/// Writes a stream into parts of `size` bytes, hashing each.
struct Splitter {
    /// Part `n` is written as `<partial>.<n>`.
    partial: PathBuf,
    /// The bundle's file name: part `n` is renamed to `<base>.<n>`.
    base: String,
    size: u64,
    current: Option<(BufWriter<File>, Hasher, u64)>,
    done: Vec<(PathBuf, Part)>,
}

impl Splitter {
    fn tmp(&self, n: usize) -> PathBuf {
        with_suffix(&self.partial, &format!(".{n:03}"))
    }

    /// Make the part being written durable and note it.
    fn close(&mut self) -> io::Result<()> {
        let Some((w, hasher, len)) = self.current.take() else { return Ok(()) };
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        let n = self.done.len();
        let part = Part { name: part_name(&self.base, n), size: len, sha256: hasher.finalize() };
        self.done.push((self.tmp(n), part));
        Ok(())
    }
}

impl Write for Splitter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.current.is_none() {
            let f = File::create(self.tmp(self.done.len()))?;
            self.current = Some((BufWriter::with_capacity(1 << 20, f), Algorithm::Sha256.hasher(), 0));
        }
        let size = self.size;
        let Some((w, hasher, len)) = self.current.as_mut() else { return Ok(0) };
        let room = usize::try_from(size - *len).unwrap_or(usize::MAX);
        let n = w.write(&buf[..buf.len().min(room)])?;
        hasher.update(&buf[..n]);
        *len += n as u64;
        if *len >= size {
            self.close()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.current {
            Some((w, ..)) => w.flush(),
            None => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reading

/// A bundle found at a path: a directory, a tar file (compressed or not) or a part set.
#[derive(Debug, Clone)]
pub struct Packed {
    base: PathBuf,
    source: Source,
}

#[derive(Debug, Clone)]
enum Source {
    Dir,
    File { path: PathBuf, compress: Compress, len: u64 },
    Parts { dir: PathBuf, set: PartSet },
}

/// Find the bundle at `path`: a directory; a file, compressed when it starts with zstd's magic
/// number; a part set named by its manifest (`PATH.parts.json`), its first (or any) part
/// (`PATH.000`) or by `PATH`. A part set's parts are all checked to be there, regular files of
/// their sizes, before this returns (`InvalidData` names the first that is not).
pub fn open(path: &Path) -> io::Result<Packed> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let manifest = with_suffix(path, PARTS_SUFFIX);
            if manifest.is_file() {
                return open_parts(&manifest);
            }
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: no such bundle (nor a part set {})", path.display(), manifest.display()),
            ));
        }
        Err(e) => return Err(e),
    };
    if meta.is_dir() {
        return Ok(Packed { base: path.to_path_buf(), source: Source::Dir });
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if name.ends_with(PARTS_SUFFIX) {
        return open_parts(path);
    }
    if let Some((stem, n)) = name.rsplit_once('.') {
        if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            let manifest = path.with_file_name(format!("{stem}{PARTS_SUFFIX}"));
            if manifest.is_file() {
                return open_parts(&manifest);
            }
        }
    }
    let mut magic = [0u8; 4];
    let mut f = File::open(path)?;
    let got = f.read(&mut magic)?;
    let compress = if got == 4 && magic == ZSTD_MAGIC { Compress::Zstd } else { Compress::None };
    Ok(Packed {
        base: path.to_path_buf(),
        source: Source::File { path: path.to_path_buf(), compress, len: meta.len() },
    })
}

fn open_parts(manifest: &Path) -> io::Result<Packed> {
    let shown = manifest.display();
    let mut bytes = Vec::new();
    File::open(manifest)?.take(MAX_MANIFEST + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_MANIFEST {
        return Err(invalid(format!("{shown}: larger than {MAX_MANIFEST} bytes: not a part set")));
    }
    let set: PartSet =
        serde_json::from_slice(&bytes).map_err(|e| invalid(format!("{shown}: not a part set manifest: {e}")))?;
    if set.media_type != PARTS_MEDIA_TYPE {
        return Err(invalid(format!("{shown}: mediaType {:?}, not {PARTS_MEDIA_TYPE}", set.media_type)));
    }
    if set.parts.is_empty() {
        return Err(invalid(format!("{shown}: lists no parts")));
    }
    let dir = manifest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
    for part in &set.parts {
        let plain = Path::new(&part.name).file_name().is_some_and(|n| n == part.name.as_str());
        if !plain || part.name.starts_with('.') {
            return Err(invalid(format!(
                "{shown}: part {:?} is not a file name beside the manifest: a part set names only its own files",
                part.name
            )));
        }
        let meta = match fs::symlink_metadata(dir.join(&part.name)) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(invalid(format!("part {} is missing (beside {shown})", part.name)))
            }
            Err(e) => return Err(e),
        };
        if !meta.is_file() {
            return Err(invalid(format!("part {} is not a regular file", part.name)));
        }
        if meta.len() != part.size {
            return Err(invalid(format!(
                "part {}: {} bytes where the part set says {} (cut short, or still being copied?)",
                part.name,
                meta.len(),
                part.size
            )));
        }
    }
    let base = PathBuf::from(manifest.as_os_str().to_string_lossy().trim_end_matches(PARTS_SUFFIX).to_string());
    Ok(Packed { base, source: Source::Parts { dir, set } })
}

impl Packed {
    /// The bundle's name: the directory or file, or a part set's `PATH` (beside which
    /// `PATH.digest` and `PATH.sig` are).
    pub fn base(&self) -> &Path {
        &self.base
    }

    pub fn is_dir(&self) -> bool {
        matches!(self.source, Source::Dir)
    }

    /// Bytes read from the media to import it (a directory: 0, not counted ahead).
    pub fn input_len(&self) -> u64 {
        match &self.source {
            Source::Dir => 0,
            Source::File { len, .. } => *len,
            Source::Parts { set, .. } => set.size,
        }
    }

    /// What it is, for people: `directory`, `tar`, `tar+zstd`, `4 parts of tar+zstd`.
    pub fn describe(&self) -> String {
        let kind = |c: Compress| match c.kind() {
            StreamKind::Tar => "tar",
            StreamKind::TarZstd => "tar+zstd",
        };
        match &self.source {
            Source::Dir => "directory".into(),
            Source::File { compress, .. } => kind(*compress).into(),
            Source::Parts { set, .. } => format!("{} part(s) of {}", set.parts.len(), kind(set.kind.compress())),
        }
    }

    /// The plain tar, read from the file or the parts in order (each verified at its end) and
    /// decompressed on the way; `progress` counts the bytes read from the media. A directory
    /// has none (`Unsupported`).
    pub fn tar_reader(&self, progress: Option<OnBytes>) -> io::Result<TarReader> {
        let (raw, compress, state): (Box<dyn Read + Send>, Compress, Option<Arc<Mutex<PartState>>>) = match &self.source
        {
            Source::Dir => {
                return Err(io::Error::new(io::ErrorKind::Unsupported, "a directory bundle is not a tar stream"))
            }
            Source::File { path, compress, .. } => {
                (Box::new(Counted { inner: File::open(path)?, progress }), *compress, None)
            }
            Source::Parts { dir, set } => {
                let state = Arc::new(Mutex::new(PartState::default()));
                let reader = PartReader {
                    dir: dir.clone(),
                    parts: set.parts.clone(),
                    next: 0,
                    current: None,
                    state: state.clone(),
                    progress,
                };
                (Box::new(reader), set.kind.compress(), Some(state))
            }
        };
        let buffered = BufReader::with_capacity(1 << 20, raw);
        let plain: Box<dyn Read + Send> = match compress {
            Compress::None => Box::new(buffered),
            Compress::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(buffered)?),
        };
        let parts = match &self.source {
            Source::Parts { dir, .. } => state.map(|s| (dir.clone(), s)),
            _ => None,
        };
        Ok(TarReader { inner: HoldBack::new(plain), parts })
    }
}

/// A bundle's plain tar stream ([`Packed::tar_reader`]).
pub struct TarReader {
    inner: HoldBack<Box<dyn Read + Send>>,
    parts: Option<(PathBuf, Arc<Mutex<PartState>>)>,
}

impl Read for TarReader {
    /// A read error that a wrong part explains (zstd data that does not decode, or whose
    /// checksum fails before the part's end is reached) is that part's.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).map_err(|e| self.diagnose().map_or(e, invalid))
    }
}

impl TarReader {
    /// After a failed read or import: the part to blame, if one is wrong. A part found wrong at
    /// its end is named as it was; otherwise the part being read when the reading stopped is
    /// read whole from its file and checked (a blob that does not hash right, or zstd data that
    /// does not decode, is a changed part).
    pub fn diagnose(&self) -> Option<String> {
        let (dir, state) = self.parts.as_ref()?;
        let (failed, current) = {
            let s = state.lock().unwrap_or_else(PoisonError::into_inner);
            (s.failed.clone(), s.current.clone())
        };
        if failed.is_some() {
            return failed;
        }
        let part = current?;
        let mut f = File::open(dir.join(&part.name)).ok()?;
        let mut hasher = Algorithm::Sha256.hasher();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).ok()?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let got = hasher.finalize();
        (got != part.sha256).then(|| mismatch(&part, &got))
    }
}

fn mismatch(part: &Part, got: &Digest) -> String {
    format!("part {}: sha256 mismatch (expected {}, got {got})", part.name, part.sha256)
}

/// Counts what passes.
struct Counted<R> {
    inner: R,
    progress: Option<OnBytes>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(p) = &self.progress {
            p(n as u64);
        }
        Ok(n)
    }
}

#[derive(Default)]
struct PartState {
    /// The part being read, not verified yet.
    current: Option<Part>,
    /// A part found wrong: the message.
    failed: Option<String>,
}

/// The parts in order as one stream; each hashed as it is read and checked at its end.
struct PartReader {
    dir: PathBuf,
    parts: Vec<Part>,
    next: usize,
    current: Option<(File, Hasher, u64)>,
    state: Arc<Mutex<PartState>>,
    progress: Option<OnBytes>,
}

impl PartReader {
    fn fail(&self, message: String) -> io::Error {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).failed = Some(message.clone());
        invalid(message)
    }
}

impl Read for PartReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(failed) = &self.state.lock().unwrap_or_else(PoisonError::into_inner).failed {
            return Err(invalid(failed.clone()));
        }
        loop {
            if self.current.is_none() {
                let Some(part) = self.parts.get(self.next) else { return Ok(0) };
                let f = match File::open(self.dir.join(&part.name)) {
                    Ok(f) => f,
                    Err(e) => return Err(self.fail(format!("part {}: {e}", part.name))),
                };
                self.state.lock().unwrap_or_else(PoisonError::into_inner).current = Some(part.clone());
                self.current = Some((f, Algorithm::Sha256.hasher(), 0));
            }
            let Some(part) = self.parts.get(self.next) else { return Ok(0) };
            let Some((f, hasher, len)) = self.current.as_mut() else { continue };
            let left = usize::try_from(part.size - *len).unwrap_or(usize::MAX);
            let want = buf.len().min(left);
            let n = if want == 0 { 0 } else { f.read(&mut buf[..want])? };
            if n > 0 {
                hasher.update(&buf[..n]);
                *len += n as u64;
                if let Some(p) = &self.progress {
                    p(n as u64);
                }
                return Ok(n);
            }
            // The part's end: all of it, and its digest.
            let Some((_, hasher, len)) = self.current.take() else { continue };
            let part = part.clone();
            if len != part.size {
                return Err(self.fail(format!(
                    "part {}: {len} bytes where the part set says {} (cut short while read)",
                    part.name, part.size
                )));
            }
            let got = hasher.finalize();
            if got != part.sha256 {
                return Err(self.fail(mismatch(&part, &got)));
            }
            self.state.lock().unwrap_or_else(PoisonError::into_inner).current = None;
            self.next += 1;
        }
    }
}

/// Hands out a stream's bytes only while at least [`HOLD_BACK`] more are known to follow; the
/// rest once the inner stream ended cleanly.
struct HoldBack<R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    ended: bool,
}

impl<R: Read> HoldBack<R> {
    fn new(inner: R) -> HoldBack<R> {
        HoldBack { inner, buf: Vec::with_capacity(HOLD_BACK * 2), start: 0, ended: false }
    }
}

impl<R: Read> Read for HoldBack<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            let held = self.buf.len() - self.start;
            let free = if self.ended { held } else { held.saturating_sub(HOLD_BACK) };
            if free > 0 || self.ended || out.is_empty() {
                let n = free.min(out.len());
                out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
                self.start += n;
                return Ok(n);
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let old = self.buf.len();
            self.buf.resize(old + (64 << 10), 0);
            match self.inner.read(&mut self.buf[old..]) {
                Ok(n) => {
                    self.buf.truncate(old + n);
                    self.ended = n == 0;
                }
                Err(e) => {
                    self.buf.truncate(old);
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    /// Chunks of at most `step` bytes.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(self.1).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn should_hand_out_the_last_bytes_only_at_the_end() {
        for len in [0usize, 10, HOLD_BACK, HOLD_BACK + 1, 5 * HOLD_BACK + 7] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut h = HoldBack::new(Trickle(&data, 1000));
            let mut out = Vec::new();
            let mut buf = [0u8; 777];
            loop {
                let n = h.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                if !h.ended {
                    assert!(out.len() + n + HOLD_BACK <= len, "handed out the held-back tail early");
                }
                out.extend_from_slice(&buf[..n]);
            }
            assert_eq!(out, data);
        }
    }
}
