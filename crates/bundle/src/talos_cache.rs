//! Talos' own image cache: the files `talosctl images cache-create` writes and a Talos node's
//! image cache registry (`registryd`) reads. The rules are in `docs/talos-image-cache.md`; in
//! short, the *flat* layout is
//!
//! ```text
//! blob/sha256-<hex>                                  configs and layers, shared by all images
//! manifests/<registry>/<repo>/reference/<tag>        the manifest a tag names (an index stays one)
//! manifests/<registry>/<repo>/digest/sha256-<hex>    every manifest of the repository by digest
//! ```
//!
//! (`docker.io` for Docker Hub with its `library/` prefix, `host:port` written `host_port_`),
//! and the *oci* layout (cache-create's default, what `imager --image-cache` takes to build boot
//! media) is an OCI image layout of one image whose single layer is a tar of that flat tree.
//!
//! Like [`crate::BundleWriter`], everything goes to `<dest>.partial` and is renamed into place
//! when finished; every byte is hashed on the way in and a mismatch fails the write.

use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tender_oci::{media, Algorithm, Digest, Hasher};

use crate::layout::{self, Descriptor, Document, INDEX_FILE, LAYOUT_FILE};
use crate::write::Hashing;

/// The directory of blobs in the flat layout (singular, as Talos names it).
pub const BLOB_DIR: &str = "blob";
/// The directory of manifests in the flat layout.
pub const MANIFESTS_DIR: &str = "manifests";
/// The layer that carries the flat tree in the oci layout: an uncompressed tar.
pub const TREE_LAYER_MEDIA: &str = "application/vnd.oci.image.layer.v1.tar";
/// The config of the image in the oci layout.
pub const CONFIG_MEDIA: &str = "application/vnd.oci.image.config.v1+json";

/// Which of the two layouts cache-create writes (`--layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheLayout {
    /// An OCI image layout holding one image whose layer is the flat tree: for `imager
    /// --image-cache DIR`, which puts the tree on the boot media.
    Oci,
    /// The tree the node reads from its `IMAGECACHE` partition (and `talosctl images
    /// cache-serve` serves).
    Flat,
}

impl FromStr for CacheLayout {
    type Err = String;

    fn from_str(s: &str) -> Result<CacheLayout, String> {
        match s {
            "oci" => Ok(CacheLayout::Oci),
            "flat" => Ok(CacheLayout::Flat),
            other => Err(format!("{other:?} is not a Talos image cache layout: oci or flat")),
        }
    }
}

impl fmt::Display for CacheLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheLayout::Oci => "oci",
            CacheLayout::Flat => "flat",
        })
    }
}

/// The registry directory Talos uses for `registry`: Docker Hub as `docker.io`, a port as
/// `_port_` (so the tree fits on vfat).
pub fn registry_dir(registry: &str) -> String {
    let registry = match registry {
        "index.docker.io" | "registry-1.docker.io" => "docker.io",
        other => other,
    };
    // The last colon, as the node finds it in the `ns` it is asked for (so the same rule on
    // both sides, whatever it makes of an IPv6 literal).
    match registry.rfind(':') {
        Some(i) if i > 0 => format!("{}_{}_", &registry[..i], &registry[i + 1..]),
        _ => registry.to_string(),
    }
}

/// `manifests/<registry>/<repository>`: where one repository's manifests live.
pub fn repository_dir(registry: &str, repository: &str) -> String {
    let repository = if registry_dir(registry) == "docker.io" && !repository.contains('/') {
        format!("library/{repository}")
    } else {
        repository.to_string()
    };
    format!("{MANIFESTS_DIR}/{}/{repository}", registry_dir(registry))
}

/// `sha256-<hex>`: a digest as a file name (Talos replaces the colon).
pub fn digest_file(digest: &Digest) -> String {
    format!("{}-{}", digest.algorithm().name(), digest.hex())
}

/// What a finished cache holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheWritten {
    /// Tags written (`reference/<tag>`).
    pub tags: u64,
    /// Manifests written by digest.
    pub manifests: u64,
    pub blobs: u64,
    /// Bytes of the blobs.
    pub bytes: u64,
    /// The oci layout's image manifest (none for flat).
    pub image: Option<Digest>,
}

/// A writer that hashes and counts what passes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Hasher,
    len: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

enum Sink {
    /// Files in the partial directory, synced when finished.
    Flat { unsynced: Vec<PathBuf> },
    /// The flat tree as a tar, hashed while written; the directories already in it.
    Oci { tar: Box<tar::Builder<HashingWriter<BufWriter<File>>>>, tar_path: PathBuf, dirs: HashSet<String> },
}

/// A Talos image cache being written.
pub struct TalosCacheWriter {
    sink: Sink,
    dest: PathBuf,
    partial: PathBuf,
    /// Platforms (`os/arch[/variant]`) the oci layout's index names its image for.
    platforms: Vec<String>,
    /// Paths written so far in the flat tree.
    written: HashSet<String>,
    summary: CacheWritten,
}

fn mismatch(digest: &Digest, got: &Digest) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{digest}: the content read hashes to {got}"))
}

fn sha256_only(digest: &Digest) -> io::Result<()> {
    if digest.algorithm() == Algorithm::Sha256 {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{digest}: Talos' image cache holds sha256 content only; leave this image out of --talos-image-cache"),
    ))
}

fn tree_header(size: u64, mode: u32, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(mode);
    h.set_entry_type(kind);
    h.set_mtime(0);
    h
}

impl TalosCacheWriter {
    /// Start a cache at `dest` (which must not exist). `platforms`: what the oci layout's index
    /// names the image for (one entry each, all the same image, so `imager` finds it for any of
    /// them); the flat layout ignores them.
    pub fn create(dest: &Path, layout: CacheLayout, platforms: &[String]) -> io::Result<TalosCacheWriter> {
        if fs::symlink_metadata(dest).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists; name a new path", dest.display()),
            ));
        }
        let mut name = dest.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        name.push(".partial");
        let partial = dest.with_file_name(name);
        if fs::symlink_metadata(&partial).is_ok_and(|m| m.is_dir()) {
            fs::remove_dir_all(&partial)?;
        } else if fs::symlink_metadata(&partial).is_ok() {
            fs::remove_file(&partial)?;
        }
        fs::create_dir_all(&partial)?;
        let sink = match layout {
            CacheLayout::Flat => Sink::Flat { unsynced: Vec::new() },
            CacheLayout::Oci => {
                fs::create_dir_all(partial.join("blobs/sha256"))?;
                let tar_path = partial.join("blobs/sha256/tree.tar.partial");
                let file = BufWriter::with_capacity(1 << 20, File::create(&tar_path)?);
                let hashing = HashingWriter { inner: file, hasher: Algorithm::Sha256.hasher(), len: 0 };
                let mut tar = tar::Builder::new(hashing);
                tar.mode(tar::HeaderMode::Deterministic);
                Sink::Oci { tar: Box::new(tar), tar_path, dirs: HashSet::new() }
            }
        };
        let platforms = if platforms.is_empty() { vec!["linux/amd64".to_string()] } else { platforms.to_vec() };
        Ok(TalosCacheWriter {
            sink,
            dest: dest.to_path_buf(),
            partial,
            platforms,
            written: HashSet::new(),
            summary: CacheWritten::default(),
        })
    }

    /// Whether the cache still needs blob `digest`.
    pub fn wants_blob(&self, digest: &Digest) -> bool {
        !self.written.contains(&format!("{BLOB_DIR}/{}", digest_file(digest)))
    }

    /// Put one file of the flat tree: `size` bytes from `reader`.
    fn put(&mut self, path: &str, size: u64, reader: &mut dyn Read) -> io::Result<()> {
        match &mut self.sink {
            Sink::Flat { unsynced } => {
                let full = self.partial.join(path);
                if let Some(dir) = full.parent() {
                    fs::create_dir_all(dir)?;
                }
                let mut f = File::create(&full)?;
                io::copy(&mut reader.take(size), &mut f)?;
                unsynced.push(full);
            }
            Sink::Oci { tar, dirs, .. } => {
                // Each directory before what it holds, as cache-create's tar has them.
                let mut at = 0;
                while let Some(i) = path[at..].find('/') {
                    let dir = &path[..at + i];
                    if dirs.insert(dir.to_string()) {
                        let mut h = tree_header(0, 0o755, tar::EntryType::Directory);
                        tar.append_data(&mut h, format!("{dir}/"), io::empty())?;
                    }
                    at += i + 1;
                }
                let mut h = tree_header(size, 0o644, tar::EntryType::Regular);
                tar.append_data(&mut h, path, reader.take(size))?;
            }
        }
        self.written.insert(path.to_string());
        Ok(())
    }

    /// One manifest of `registry/repository`, by digest, and under `tag` when given (a tag names
    /// the manifest it resolves to: an index stays an index). Checked against its digest.
    pub fn add_manifest(
        &mut self,
        registry: &str,
        repository: &str,
        tag: Option<&str>,
        digest: &Digest,
        bytes: &[u8],
    ) -> io::Result<()> {
        sha256_only(digest)?;
        let got = digest.algorithm().digest(bytes);
        if got != *digest {
            return Err(mismatch(digest, &got));
        }
        let repo = repository_dir(registry, repository);
        let by_digest = format!("{repo}/digest/{}", digest_file(digest));
        if !self.written.contains(&by_digest) {
            self.put(&by_digest, bytes.len() as u64, &mut &bytes[..])?;
            self.summary.manifests += 1;
        }
        if let Some(tag) = tag {
            let by_tag = format!("{repo}/reference/{tag}");
            if !self.written.contains(&by_tag) {
                self.put(&by_tag, bytes.len() as u64, &mut &bytes[..])?;
                self.summary.tags += 1;
            }
        }
        Ok(())
    }

    /// A blob (config or layer) of `size` bytes read from `reader`, hashed on the way: a body
    /// that is not `digest` fails the write (nothing is renamed into place).
    pub fn add_blob(&mut self, digest: &Digest, size: u64, reader: &mut dyn Read) -> io::Result<()> {
        sha256_only(digest)?;
        if !self.wants_blob(digest) {
            return Ok(());
        }
        let mut hashing = Hashing { inner: reader, hasher: digest.algorithm().hasher(), len: 0 };
        self.put(&format!("{BLOB_DIR}/{}", digest_file(digest)), size, &mut hashing)?;
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
        self.summary.blobs += 1;
        self.summary.bytes += len;
        Ok(())
    }

    /// Finish the layout, make it durable and rename it into place.
    pub fn finish(mut self) -> io::Result<CacheWritten> {
        let mut synced: Vec<PathBuf> = Vec::new();
        match self.sink {
            Sink::Flat { unsynced } => {
                for path in &unsynced {
                    File::open(path)?.sync_all()?;
                }
                synced.extend(unsynced.iter().filter_map(|p| p.parent().map(Path::to_path_buf)));
            }
            Sink::Oci { tar, tar_path, .. } => {
                let mut hashing = tar.into_inner()?;
                hashing.flush()?;
                let (tree, tree_len) = (hashing.hasher.finalize(), hashing.len);
                let file = hashing.inner.into_inner().map_err(|e| e.into_error())?;
                file.sync_all()?;
                drop(file);
                let blobs = self.partial.join("blobs/sha256");
                fs::rename(&tar_path, blobs.join(tree.hex()))?;
                let (os, arch, variant) = split_platform(self.platforms.first().map_or("linux/amd64", String::as_str));
                let mut config = serde_json::json!({
                    "architecture": arch,
                    "os": os,
                    "rootfs": { "type": "layers", "diff_ids": [tree.to_string()] },
                    "config": {},
                });
                if let Some(v) = variant {
                    config["variant"] = v.into();
                }
                let config = serde_json::to_vec(&config).map_err(io::Error::other)?;
                let config_digest = Algorithm::Sha256.digest(&config);
                let manifest = serde_json::to_vec(&serde_json::json!({
                    "schemaVersion": 2,
                    "mediaType": media::OCI_MANIFEST,
                    "config": Descriptor::new(CONFIG_MEDIA, &config_digest, config.len() as u64),
                    "layers": [Descriptor::new(TREE_LAYER_MEDIA, &tree, tree_len)],
                }))
                .map_err(io::Error::other)?;
                let manifest_digest = Algorithm::Sha256.digest(&manifest);
                let mut entries = Vec::new();
                for p in &self.platforms {
                    let (os, arch, variant) = split_platform(p);
                    let mut platform = serde_json::json!({ "architecture": arch, "os": os });
                    if let Some(v) = variant {
                        platform["variant"] = v.into();
                    }
                    let mut entry = Descriptor::new(media::OCI_MANIFEST, &manifest_digest, manifest.len() as u64);
                    entry.platform = Some(platform);
                    entries.push(entry);
                }
                let index = serde_json::to_vec_pretty(&Document::index(entries, Default::default()))
                    .map_err(io::Error::other)?;
                for (name, bytes) in [
                    (blobs.join(config_digest.hex()), &config[..]),
                    (blobs.join(manifest_digest.hex()), &manifest[..]),
                    (self.partial.join(LAYOUT_FILE), &layout::layout_file()[..]),
                    (self.partial.join(INDEX_FILE), &index[..]),
                ] {
                    let mut f = File::create(&name)?;
                    f.write_all(bytes)?;
                    f.sync_all()?;
                }
                synced.extend([blobs.clone(), self.partial.join("blobs")]);
                self.summary.image = Some(manifest_digest);
            }
        }
        synced.push(self.partial.clone());
        synced.sort();
        synced.dedup();
        for dir in synced {
            File::open(&dir)?.sync_all()?;
        }
        fs::rename(&self.partial, &self.dest)?;
        if let Some(parent) = self.dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(parent)?.sync_all()?;
        }
        Ok(self.summary)
    }
}

/// `os/arch[/variant]` into its parts.
fn split_platform(p: &str) -> (&str, &str, Option<&str>) {
    let mut parts = p.splitn(3, '/');
    let os = parts.next().unwrap_or("linux");
    let arch = parts.next().unwrap_or("amd64");
    (os, arch, parts.next())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn check(registry: &str, repository: &str, expect: &str) {
        assert_eq!(repository_dir(registry, repository), expect, "{registry} {repository}");
    }

    #[test]
    fn should_name_repositories_as_talos_does() {
        check("ghcr.io", "siderolabs/kubelet", "manifests/ghcr.io/siderolabs/kubelet");
        check("docker.io", "library/alpine", "manifests/docker.io/library/alpine");
        check("index.docker.io", "alpine", "manifests/docker.io/library/alpine");
        check("registry-1.docker.io", "bitnami/redis", "manifests/docker.io/bitnami/redis");
        check("127.0.0.1:5000", "e2e/app", "manifests/127.0.0.1_5000_/e2e/app");
        check("registry.k8s.io", "pause", "manifests/registry.k8s.io/pause");
        check("[::1]:5000", "x", "manifests/[::1]_5000_/x");
    }

    #[test]
    fn should_refuse_a_manifest_that_is_not_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = TalosCacheWriter::create(&dir.path().join("c"), CacheLayout::Flat, &[]).unwrap();
        let wrong = Algorithm::Sha256.digest(b"other");
        let err = w.add_manifest("ghcr.io", "a/b", Some("v1"), &wrong, b"{}").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let err = w.add_blob(&wrong, 5, &mut &b"bytes"[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(!dir.path().join("c").exists(), "nothing in place before finish");
    }

    #[test]
    fn should_write_the_same_tree_in_both_layouts() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = br#"{"schemaVersion":2}"#;
        let md = Algorithm::Sha256.digest(manifest);
        let blob = b"layer bytes";
        let bd = Algorithm::Sha256.digest(blob);
        let platforms = ["linux/amd64".to_string(), "linux/arm64/v8".to_string()];
        for layout in [CacheLayout::Flat, CacheLayout::Oci] {
            let dest = dir.path().join(layout.to_string());
            let mut w = TalosCacheWriter::create(&dest, layout, &platforms).unwrap();
            w.add_manifest("docker.io", "library/alpine", Some("3"), &md, manifest).unwrap();
            w.add_blob(&bd, blob.len() as u64, &mut &blob[..]).unwrap();
            w.add_blob(&bd, blob.len() as u64, &mut &blob[..]).unwrap();
            let done = w.finish().unwrap();
            assert_eq!((done.tags, done.manifests, done.blobs), (1, 1, 1));
            let tree = match layout {
                CacheLayout::Flat => dest.clone(),
                CacheLayout::Oci => {
                    let index: serde_json::Value =
                        serde_json::from_slice(&fs::read(dest.join("index.json")).unwrap()).unwrap();
                    let entries = index["manifests"].as_array().unwrap();
                    assert_eq!(entries.len(), 2, "{index}");
                    assert_eq!(entries[1]["platform"]["variant"], "v8");
                    let m = entries[0]["digest"].as_str().unwrap().strip_prefix("sha256:").unwrap();
                    let m: serde_json::Value =
                        serde_json::from_slice(&fs::read(dest.join("blobs/sha256").join(m)).unwrap()).unwrap();
                    let layer = m["layers"][0]["digest"].as_str().unwrap().strip_prefix("sha256:").unwrap();
                    let out = dir.path().join("unpacked");
                    let mut ar = tar::Archive::new(File::open(dest.join("blobs/sha256").join(layer)).unwrap());
                    ar.unpack(&out).unwrap();
                    out
                }
            };
            let tag = tree.join("manifests/docker.io/library/alpine/reference/3");
            assert_eq!(fs::read(tag).unwrap(), manifest);
            let by_digest = tree.join("manifests/docker.io/library/alpine/digest").join(digest_file(&md));
            assert_eq!(fs::read(by_digest).unwrap(), manifest);
            assert_eq!(fs::read(tree.join("blob").join(digest_file(&bd))).unwrap(), blob);
        }
    }
}
