//! Writing a bundle: a directory, or one tar file when the path ends in `.tar`, compressed or
//! split into parts as [`Packing`] says. Everything goes to `<path>.partial` (parts:
//! `<path>.partial.000`, …) first and is renamed into place only when the index is written, so
//! a bundle that exists is complete.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use tender_oci::{Algorithm, Digest};

use crate::layout::{self, Document, INDEX_FILE, LAYOUT_FILE};
pub use crate::packing::is_tar;
use crate::packing::{self, OnBytes, Packing, Sink, Sunk};

/// Where the bytes go.
enum Out {
    /// Files are made durable all at once when the bundle is finished (as `cp` + `sync`), not
    /// one by one.
    Dir {
        partial: PathBuf,
        unsynced: Vec<PathBuf>,
    },
    Tar {
        builder: Box<tar::Builder<BufWriter<Sink>>>,
        partial: PathBuf,
        packing: Packing,
    },
}

/// What a finished bundle holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// sha256 of `index.json`: compare it across the gap.
    pub index_digest: Option<Digest>,
    pub blobs: u64,
    pub bytes: u64,
    /// Blobs left out because the older bundle (`--since`) has them.
    pub skipped: u64,
}

/// A bundle being written.
pub struct BundleWriter {
    out: Out,
    dest: PathBuf,
    /// Blobs the older bundle holds (a delta leaves them out).
    skip: HashSet<Digest>,
    written: HashSet<Digest>,
    summary: Written,
    /// A directory bundle's progress (a tar counts in its [`Sink`]).
    progress: Option<OnBytes>,
}

fn partial_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    dest.with_file_name(name)
}

fn mismatch(digest: &Digest, got: &Digest) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{digest}: the content read hashes to {got}"))
}

/// A reader that hashes and counts what passes through it.
pub(crate) struct Hashing<'a> {
    pub(crate) inner: &'a mut dyn Read,
    pub(crate) hasher: tender_oci::Hasher,
    pub(crate) len: u64,
}

impl Read for Hashing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

/// The paths a bundle written at `dest` with `packing` occupies: `dest`, or a part set's
/// manifest and first part.
pub fn occupied(dest: &Path, packing: Packing) -> Vec<PathBuf> {
    match packing.split {
        Some(_) => vec![
            dest.to_path_buf(),
            packing::with_suffix(dest, packing::PARTS_SUFFIX),
            packing::with_suffix(dest, ".000"),
        ],
        None => vec![dest.to_path_buf()],
    }
}

impl BundleWriter {
    /// Start a bundle at `dest` (which must not exist): a directory, or a tar when the name
    /// ends in `.tar` (`.tar.zst`: compressed). `skip`: blobs to leave out (`--since`).
    pub fn create(dest: &Path, skip: HashSet<Digest>) -> io::Result<BundleWriter> {
        BundleWriter::create_packed(dest, skip, Packing::for_name(dest))
    }

    /// Start a bundle at `dest` packed as `packing` says: compressed or split, it is a tar
    /// whatever its name; a split of less than [`packing::MIN_PART`] is `InvalidInput`.
    pub fn create_packed(dest: &Path, skip: HashSet<Digest>, packing: Packing) -> io::Result<BundleWriter> {
        if let Some(taken) = occupied(dest, packing).into_iter().find(|p| fs::symlink_metadata(p).is_ok()) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists; name a new path", taken.display()),
            ));
        }
        let partial = partial_path(dest);
        if partial.is_dir() {
            fs::remove_dir_all(&partial)?;
        } else if partial.exists() {
            fs::remove_file(&partial)?;
        }
        packing::remove_partial_parts(&partial)?;
        let out = if packing.is_stream(dest) {
            let sink = Sink::create(&partial, dest, packing)?;
            let mut builder = Box::new(tar::Builder::new(BufWriter::with_capacity(1 << 20, sink)));
            builder.mode(tar::HeaderMode::Deterministic);
            let mut w = BundleWriter {
                out: Out::Tar { builder, partial, packing },
                dest: dest.to_path_buf(),
                skip,
                written: HashSet::new(),
                summary: Written::default(),
                progress: None,
            };
            w.put_member(LAYOUT_FILE, &layout::layout_file())?;
            return Ok(w);
        } else {
            fs::create_dir_all(partial.join("blobs"))?;
            Out::Dir { partial, unsynced: Vec::new() }
        };
        Ok(BundleWriter {
            out,
            dest: dest.to_path_buf(),
            skip,
            written: HashSet::new(),
            summary: Written::default(),
            progress: None,
        })
    }

    /// Count the bytes put into the bundle (a tar's as they are written, before compression;
    /// a directory's blob by blob).
    pub fn on_progress(&mut self, progress: OnBytes) {
        match &mut self.out {
            Out::Tar { builder, .. } => builder.get_mut().get_mut().set_progress(progress),
            Out::Dir { .. } => self.progress = Some(progress),
        }
    }

    /// Whether the bundle still needs `digest` (not written yet, not in the older bundle).
    pub fn wants(&self, digest: &Digest) -> bool {
        !self.written.contains(digest) && !self.skip.contains(digest)
    }

    /// A small member (`oci-layout`, `index.json`, a manifest) written whole.
    fn put_member(&mut self, name: &str, bytes: &[u8]) -> io::Result<()> {
        match &mut self.out {
            Out::Tar { builder, .. } => {
                let mut header = member_header(bytes.len() as u64);
                builder.append_data(&mut header, name, bytes)
            }
            Out::Dir { partial, unsynced } => {
                let path = partial.join(name);
                if let Some(dir) = path.parent() {
                    fs::create_dir_all(dir)?;
                }
                File::create(&path)?.write_all(bytes)?;
                unsynced.push(path);
                Ok(())
            }
        }
    }

    fn note(&mut self, digest: &Digest, len: u64) {
        if let Some(p) = &self.progress {
            p(len);
        }
        self.written.insert(*digest);
        self.summary.blobs += 1;
        self.summary.bytes += len;
    }

    /// A blob held in memory (a manifest), checked against its digest.
    pub fn add_bytes(&mut self, digest: &Digest, bytes: &[u8]) -> io::Result<()> {
        if !self.wants(digest) {
            self.skipped(digest);
            return Ok(());
        }
        let got = digest.algorithm().digest(bytes);
        if got != *digest {
            return Err(mismatch(digest, &got));
        }
        self.put_member(&layout::blob_path(digest), bytes)?;
        self.note(digest, bytes.len() as u64);
        Ok(())
    }

    /// Count a blob that is not written (already in, or in the older bundle) as a delta's.
    pub fn skipped(&mut self, digest: &Digest) {
        if self.skip.contains(digest) && self.written.insert(*digest) {
            self.summary.skipped += 1;
        }
    }

    /// A blob copied from a file that is already verified (a committed store object): copied
    /// without hashing again (`copy_file_range`, a reflink where the filesystem shares extents).
    pub fn add_verified_file(&mut self, digest: &Digest, source: &Path) -> io::Result<()> {
        if !self.wants(digest) {
            self.skipped(digest);
            return Ok(());
        }
        let len = match &mut self.out {
            Out::Tar { builder, .. } => {
                let mut f = File::open(source)?;
                let len = f.metadata()?.len();
                let mut header = member_header(len);
                builder.append_data(&mut header, layout::blob_path(digest), &mut f)?;
                len
            }
            Out::Dir { partial, unsynced } => {
                let path = partial.join(layout::blob_path(digest));
                if let Some(dir) = path.parent() {
                    fs::create_dir_all(dir)?;
                }
                let len = fs::copy(source, &path)?;
                unsynced.push(path);
                len
            }
        };
        self.note(digest, len);
        Ok(())
    }

    /// A blob read from a stream of `size` bytes, hashed on the way: a body that is not
    /// `digest` fails the export (nothing is renamed into place).
    pub fn add_reader(&mut self, digest: &Digest, size: u64, reader: &mut dyn Read) -> io::Result<()> {
        if !self.wants(digest) {
            self.skipped(digest);
            return Ok(());
        }
        let mut hashing = Hashing { inner: reader, hasher: digest.algorithm().hasher(), len: 0 };
        match &mut self.out {
            Out::Tar { builder, .. } => {
                let mut header = member_header(size);
                let mut limited = (&mut hashing).take(size);
                builder.append_data(&mut header, layout::blob_path(digest), &mut limited)?;
            }
            Out::Dir { partial, unsynced } => {
                let path = partial.join(layout::blob_path(digest));
                if let Some(dir) = path.parent() {
                    fs::create_dir_all(dir)?;
                }
                let mut f = File::create(&path)?;
                io::copy(&mut (&mut hashing).take(size), &mut f)?;
                unsynced.push(path);
            }
        }
        let (len, got) = (hashing.len, hashing.hasher.finalize());
        if len != size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{digest}: {len} bytes where {size} were announced"),
            ));
        }
        if got != *digest {
            return Err(mismatch(digest, &got));
        }
        self.note(digest, len);
        Ok(())
    }

    /// Write `index.json` (and `oci-layout`), make it durable and rename the bundle into place.
    pub fn finish(mut self, index: &Document) -> io::Result<Written> {
        let bytes = serde_json::to_vec_pretty(index).map_err(io::Error::other)?;
        self.summary.index_digest = Some(Algorithm::Sha256.digest(&bytes));
        match self.out {
            Out::Tar { mut builder, partial, packing } => {
                let mut header = member_header(bytes.len() as u64);
                builder.append_data(&mut header, INDEX_FILE, bytes.as_slice())?;
                let mut w = (*builder).into_inner()?;
                w.flush()?;
                let sink = w.into_inner().map_err(|e| e.into_error())?;
                match sink.finish(&partial)? {
                    Sunk::File(file) => fs::rename(&file, &self.dest)?,
                    Sunk::Parts(parts) => packing::place_parts(
                        &self.dest,
                        packing.compress.kind(),
                        parts,
                        self.summary.index_digest.as_ref(),
                    )?,
                }
            }
            Out::Dir { ref partial, .. } => {
                let partial = partial.clone();
                self.put_member(LAYOUT_FILE, &layout::layout_file())?;
                self.put_member(INDEX_FILE, &bytes)?;
                if let Out::Dir { unsynced, .. } = &self.out {
                    for path in unsynced {
                        File::open(path)?.sync_all()?;
                    }
                }
                let mut dirs: Vec<PathBuf> = vec![partial.clone(), partial.join("blobs")];
                if let Ok(algs) = fs::read_dir(partial.join("blobs")) {
                    dirs.extend(algs.flatten().map(|e| e.path()));
                }
                for dir in dirs {
                    File::open(&dir)?.sync_all()?;
                }
                fs::rename(&partial, &self.dest)?;
            }
        }
        if let Some(parent) = self.dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(parent)?.sync_all()?;
        }
        Ok(self.summary)
    }
}

fn member_header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h
}

/// The blobs a bundle holds (directory, tar, compressed tar or part set), for `--since`: read
/// from its file names (a tar is read through, its contents skipped).
pub fn blobs_of(path: &Path) -> io::Result<HashSet<Digest>> {
    let mut out = HashSet::new();
    let packed = packing::open(path)?;
    if packed.is_dir() {
        for alg in fs::read_dir(path.join("blobs"))? {
            let alg = alg?;
            let Some(a) = alg.file_name().to_str().map(str::to_string) else { continue };
            if !alg.file_type()?.is_dir() {
                continue;
            }
            for f in fs::read_dir(alg.path())? {
                let f = f?;
                if let Some(d) = f.file_name().to_str().and_then(|h| layout::blob_digest(&format!("blobs/{a}/{h}"))) {
                    out.insert(d);
                }
            }
        }
        return Ok(out);
    }
    let mut archive = tar::Archive::new(packed.tar_reader(None)?);
    for entry in archive.entries()? {
        let entry = entry?;
        let name = entry.path()?.to_string_lossy().into_owned();
        if let Some(d) = layout::blob_digest(layout::normalize(&name)) {
            out.insert(d);
        }
    }
    Ok(out)
}
