//! `tender bundle ls`: what a bundle holds (a directory, a tar, compressed or split), read from the bundle alone (nothing verified or
//! stored; `tender import` does that).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::Serialize;
use tender_oci::{media, Algorithm, Digest};

use crate::layout::{self, Descriptor, Document, INDEX_FILE, MAX_DOCUMENT_BYTES};

/// JSON members of a tar kept in memory to walk, at most (manifests are small).
const MAX_KEPT_BYTES: u64 = 256 * 1024 * 1024;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    pub index_digest: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta_of: Option<String>,
    pub entries: Vec<Entry>,
    pub blobs: u64,
    pub bytes: u64,
    /// The spec it was exported from (`export --spec`), as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The image name, the OS image path, or the digest of an unnamed entry.
    pub name: String,
    /// `index`, `image`, `artifact`, `os-image`.
    pub kind: String,
    pub digest: String,
    /// Platforms of an index whose manifests the bundle holds.
    pub platforms: Vec<String>,
    /// Bytes of the entry's graph held in the bundle.
    pub bytes: u64,
    /// Objects of its graph the bundle does not hold (a delta's, or an index's other platforms).
    pub absent: u64,
}

enum Source {
    Dir(PathBuf),
    Tar(HashMap<Digest, Vec<u8>>),
}

struct Contents {
    sizes: HashMap<Digest, u64>,
    source: Source,
}

impl Contents {
    fn doc(&self, d: &Digest) -> Option<Document> {
        let bytes = match &self.source {
            Source::Dir(root) => {
                let mut buf = Vec::new();
                open_regular(&root.join(layout::blob_path(d)))
                    .ok()?
                    .take(MAX_DOCUMENT_BYTES)
                    .read_to_end(&mut buf)
                    .ok()?;
                buf
            }
            Source::Tar(kept) => kept.get(d)?.clone(),
        };
        serde_json::from_slice(&bytes).ok()
    }
}

/// Open a file of a directory bundle only if it is a regular file, as import does (issue 32
/// (6)): no link followed, no FIFO or device waited on.
fn open_regular(path: &Path) -> io::Result<File> {
    use rustix::fs::{FileType, Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| match e {
        rustix::io::Errno::LOOP => {
            io::Error::new(io::ErrorKind::InvalidData, format!("{} is a symbolic link", path.display()))
        }
        e => e.into(),
    })?;
    if FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) != FileType::RegularFile {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} is not a regular file", path.display())));
    }
    Ok(File::from(fd))
}

fn read_contents(path: &Path) -> io::Result<(Vec<u8>, Contents)> {
    let mut sizes = HashMap::new();
    let packed = crate::packing::open(path)?;
    if packed.is_dir() {
        let mut index = Vec::new();
        open_regular(&path.join(INDEX_FILE))?.take(MAX_DOCUMENT_BYTES).read_to_end(&mut index)?;
        for alg in fs::read_dir(path.join("blobs"))? {
            let alg = alg?;
            let a = alg.file_name().to_string_lossy().into_owned();
            if !alg.file_type()?.is_dir() {
                continue;
            }
            for f in fs::read_dir(alg.path())? {
                let f = f?;
                if let Some(d) = layout::blob_digest(&format!("blobs/{a}/{}", f.file_name().to_string_lossy())) {
                    sizes.insert(d, f.metadata()?.len());
                }
            }
        }
        return Ok((index, Contents { sizes, source: Source::Dir(path.to_path_buf()) }));
    }
    let mut kept = HashMap::new();
    let mut kept_bytes = 0u64;
    let mut index = None;
    let mut archive = tar::Archive::new(packed.tar_reader(None)?);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let name = entry.path()?.to_string_lossy().into_owned();
        let name = layout::normalize(&name);
        let size = entry.size();
        if name == INDEX_FILE {
            let mut buf = Vec::new();
            (&mut entry).take(MAX_DOCUMENT_BYTES).read_to_end(&mut buf)?;
            index = Some(buf);
        } else if let Some(d) = layout::blob_digest(name) {
            sizes.insert(d, size);
            if size <= MAX_DOCUMENT_BYTES && kept_bytes + size <= MAX_KEPT_BYTES {
                let mut buf = Vec::new();
                (&mut entry).take(size).read_to_end(&mut buf)?;
                if buf.first() == Some(&b'{') {
                    kept_bytes += size;
                    kept.insert(d, buf);
                }
            }
        }
    }
    let index = index.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no index.json"))?;
    Ok((index, Contents { sizes, source: Source::Tar(kept) }))
}

fn platform_of(desc: &Descriptor) -> Option<String> {
    let p = desc.platform.as_ref()?;
    let (os, arch) = (p.get("os")?.as_str()?, p.get("architecture")?.as_str()?);
    Some(match p.get("variant").and_then(|v| v.as_str()) {
        Some(v) => format!("{os}/{arch}/{v}"),
        None => format!("{os}/{arch}"),
    })
}

/// Sum what the bundle holds of a graph.
fn walk(c: &Contents, desc: &Descriptor, seen: &mut HashSet<Digest>, entry: &mut Entry, depth: usize) {
    let Ok(d) = desc.digest.parse::<Digest>() else { return };
    if depth > 8 || !seen.insert(d) {
        return;
    }
    let Some(size) = c.sizes.get(&d) else {
        entry.absent += 1;
        return;
    };
    entry.bytes += size;
    if !media::is_manifest(&desc.media_type) {
        return;
    }
    let Some(doc) = c.doc(&d) else { return };
    let is_index = media::is_index(&desc.media_type);
    for child in doc.manifests.iter() {
        let before = entry.absent;
        walk(c, child, seen, entry, depth + 1);
        if depth == 0 && is_index && entry.absent == before {
            if let Some(p) = platform_of(child) {
                entry.platforms.push(p);
            }
        }
    }
    for blob in doc.config.iter().chain(doc.layers.iter()) {
        walk(c, blob, seen, entry, depth + 1);
    }
}

/// List a bundle (directory or tar).
pub fn list(path: &Path) -> io::Result<Listing> {
    let (index_bytes, contents) = read_contents(path)?;
    let index: Document = serde_json::from_slice(&index_bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("index.json: {e}")))?;
    let mut entries = Vec::new();
    for desc in &index.manifests {
        let kind = if desc.annotation(layout::FACTORY_PATH).is_some() {
            "os-image"
        } else if media::is_index(&desc.media_type) {
            "index"
        } else if desc.artifact_type.is_some() {
            "artifact"
        } else {
            "image"
        };
        let name = desc
            .annotation(layout::FACTORY_PATH)
            .or_else(|| desc.annotation(layout::CONTAINERD_NAME))
            .or_else(|| desc.annotation(layout::REF_NAME))
            .map(str::to_string)
            .or_else(|| desc.annotation(layout::REPOSITORY).map(|r| format!("{r}@{}", desc.digest)))
            .unwrap_or_else(|| desc.digest.clone());
        let mut entry = Entry {
            name,
            kind: kind.to_string(),
            digest: desc.digest.clone(),
            platforms: Vec::new(),
            bytes: 0,
            absent: 0,
        };
        walk(&contents, desc, &mut HashSet::new(), &mut entry, 0);
        entries.push(entry);
    }
    Ok(Listing {
        index_digest: Algorithm::Sha256.digest(&index_bytes).to_string(),
        delta_of: index.annotations.get(layout::SINCE).cloned(),
        entries,
        blobs: contents.sizes.len() as u64,
        bytes: contents.sizes.values().sum(),
        spec: index.annotations.get(layout::SPEC).cloned(),
    })
}
