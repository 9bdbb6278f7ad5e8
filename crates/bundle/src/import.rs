//! Importing a bundle into a store, in three phases:
//!
//! 1. **Content.** Every blob is hashed while it is read (a directory's files, or a tar's members
//!    as they stream by) and committed under its digest only if it matches; one that does not
//!    refuses the bundle. Committing early is harmless: an object nobody knows in an upstream,
//!    with no tag, trust record or pin, is served to no one.
//! 2. **Verification.** `index.json` is walked: every image manifest's config and layers, and at
//!    least one manifest of every index, must be in the bundle, or (a delta relies on what an
//!    earlier import stored) already known in the upstream the entry's name routes to (for an OS
//!    image: already trusted under the same asset path). An object the bundle does not carry is
//!    never granted to a new upstream, and the refusal reads the same whether this store holds it
//!    or not (no size, no "stored"). Names must route to a configured upstream; an OS image's
//!    trust record may not contradict one this store already holds.
//! 3. **Registration**, only when the whole bundle verified: manifest records, the upstream each
//!    object is known in, pins, then the tags (authoritative: `imported`) and trust records.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::Path;
use std::sync::mpsc;

use serde::{Deserialize, Serialize};
use tender_catalog::asset::AssetPath;
use tender_oci::{media, Algorithm, Digest, ImageRef, Reference, RepoName};
use tender_store::{ManifestMeta, Store, StoreError, TagRecord, TrustRecord};

use crate::layout::{self, Descriptor, Document, INDEX_FILE, LAYOUT_FILE, MAX_DOCUMENT_BYTES};

/// Where an image name is served from: the upstream a client's request for it routes to.
pub trait Router {
    /// `(upstream name, repository in that upstream)`, or why the name has no upstream.
    fn route(&self, image: &ImageRef) -> Result<(String, RepoName), String>;
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
    /// another thread, so the next blob is read and hashed meanwhile).
    commits: mpsc::SyncSender<Pending>,
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

impl<'a> Intake<'a> {
    fn new(store: &'a Store, max_bytes: Option<u64>, commits: mpsc::SyncSender<Pending>) -> Intake<'a> {
        Intake {
            store,
            commits,
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
        let mut buf = vec![0u8; 1 << 20];
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
        self.commits.send(Pending { spool, digest: *digest }).map_err(|_| io::Error::other("the committer stopped"))?;
        self.verified.insert(*digest, size);
        self.new_blobs += 1;
        Ok(())
    }
}

/// A new blob, written and hashed, to be made durable and committed under `digest`.
struct Pending {
    spool: tender_store::SpoolWriter,
    digest: Digest,
}

/// Blobs in flight to the committer, at most: the reader runs this far ahead of the fsyncs.
const COMMIT_QUEUE: usize = 4;

/// Make each pending blob durable and commit it; a blob whose bytes are not its digest refuses
/// the bundle (it is removed, never visible).
fn commit_all(store: &Store, pending: mpsc::Receiver<Pending>) -> Result<(), ImportError> {
    let mut first_error = None;
    for Pending { spool, digest } in pending {
        if first_error.is_some() {
            spool.discard();
            continue;
        }
        let result = spool.seal().map_err(ImportError::Io).and_then(|sealed| match store.commit(sealed, &digest) {
            Ok(_) => Ok(()),
            Err(StoreError::DigestMismatch { actual, .. }) => {
                Err(refused(format!("{}: its content hashes to {actual}", layout::blob_path(&digest))))
            }
            Err(e) => Err(e.into()),
        });
        if let Err(e) = result {
            first_error = Some(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Run phase 1 with `read` feeding an intake while another thread commits, then phases 2 and 3.
fn import_with(
    store: &Store,
    router: &dyn Router,
    options: &ImportOptions,
    read: impl FnOnce(&mut Intake<'_>) -> Result<(), ImportError>,
) -> Result<ImportReport, ImportError> {
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::sync_channel(COMMIT_QUEUE);
        let committer = scope.spawn(move || commit_all(store, rx));
        let mut intake = Intake::new(store, options.max_bytes, tx);
        let read_result = read(&mut intake);
        let Intake { store, commits, verified, new_blobs, index, layout, ignored, .. } = intake;
        drop(commits);
        let committed = committer.join().unwrap_or_else(|_| Err(io::Error::other("the committer panicked").into()));
        // A wrong digest found by the committer explains a reader error that followed it.
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

/// Phase 1 over a directory layout.
fn read_dir(dir: &Path, intake: &mut Intake<'_>) -> Result<(), ImportError> {
    for name in [LAYOUT_FILE, INDEX_FILE] {
        match File::open(dir.join(name)) {
            Ok(mut f) => {
                let len = f.metadata()?.len();
                intake.member(name, len, &mut f)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    let blobs = match fs::read_dir(dir.join("blobs")) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut files = Vec::new();
    for alg in blobs {
        let alg = alg?;
        if !alg.file_type()?.is_dir() {
            continue;
        }
        let a = alg.file_name().to_string_lossy().into_owned();
        for f in fs::read_dir(alg.path())? {
            let f = f?;
            files.push((format!("blobs/{a}/{}", f.file_name().to_string_lossy()), f.path()));
        }
    }
    files.sort();
    for (name, path) in files {
        let mut f = File::open(&path)?;
        let meta = f.metadata()?;
        if !meta.is_file() {
            continue;
        }
        intake.member(&name, meta.len(), &mut f)?;
    }
    Ok(())
}

/// Phase 1 over a tar stream. A member cut short, a damaged header or a read error refuses
/// the bundle.
fn read_tar(reader: &mut dyn Read, intake: &mut Intake<'_>) -> Result<(), ImportError> {
    let damaged = |e: io::Error| refused(format!("the tar is truncated or damaged: {e}"));
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(damaged)? {
        let mut entry = entry.map_err(damaged)?;
        if !matches!(entry.header().entry_type(), tar::EntryType::Regular | tar::EntryType::Continuous) {
            continue;
        }
        let name = entry.path().map_err(damaged)?.to_string_lossy().into_owned();
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
    /// Stored manifests of the graph: digest, media type, size.
    manifests: Vec<(Digest, String, u64)>,
    /// Every stored object of the graph (manifests and blobs).
    objects: Vec<Digest>,
    what: Kind,
}

enum Kind {
    Image { name: String, upstream: String, repository: RepoName, tag: Option<String> },
    Asset { asset: AssetPath, layer: Digest, size: u64 },
    Unnamed,
}

/// Phase 2 state: what is available, by digest.
struct Verifier<'a> {
    store: &'a Store,
    verified: &'a HashMap<Digest, u64>,
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

/// Deepest nesting of indexes walked.
const MAX_DEPTH: usize = 8;

impl Verifier<'_> {
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

    /// Walk a descriptor's graph into `planned`. `Ok(false)`: absent and not required.
    fn walk(
        &self,
        desc: &Descriptor,
        required: bool,
        context: &str,
        planned: &mut (Vec<(Digest, String, u64)>, Vec<Digest>),
        depth: usize,
        scope: Scope<'_>,
    ) -> Result<bool, ImportError> {
        if depth > MAX_DEPTH {
            return Err(refused(format!("{context}: indexes nested deeper than {MAX_DEPTH}")));
        }
        let d: Digest =
            desc.digest.parse().map_err(|e| refused(format!("{context}: bad digest {:?}: {e}", desc.digest)))?;
        if !self.available(&d, desc.size, context, scope)? {
            if required {
                return Err(missing(context, &desc.media_type, &d, scope));
            }
            return Ok(false);
        }
        if !planned.1.contains(&d) {
            planned.1.push(d);
        }
        if !media::is_manifest(&desc.media_type) {
            return Ok(true);
        }
        if planned.0.iter().any(|(m, _, _)| *m == d) {
            return Ok(true);
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
        planned.0.push((d, media_type.clone(), desc.size));
        let inner = format!("{context} > {d}");
        if media::is_index(&media_type) {
            let mut present = 0;
            for child in &doc.manifests {
                if self.walk(child, false, &inner, planned, depth + 1, scope)? {
                    present += 1;
                }
            }
            if present == 0 && !doc.manifests.is_empty() {
                return Err(refused(format!(
                    "{inner}: none of the index's manifests is there: not in the bundle{}",
                    delta_hint(scope)
                )));
            }
        } else {
            if let Some(config) = &doc.config {
                self.walk(config, true, &inner, planned, depth + 1, scope)?;
            }
            for layer in &doc.layers {
                // A non-distributable layer (with `urls`) may be absent, as registries allow.
                self.walk(layer, layer.urls.is_empty(), &inner, planned, depth + 1, scope)?;
            }
        }
        Ok(true)
    }
}

/// The refusal for content a descriptor needs and the bundle does not provide: the same words
/// whether or not this store holds it.
fn missing(context: &str, media_type: &str, d: &Digest, scope: Scope<'_>) -> ImportError {
    let what = if media_type.is_empty() { "content" } else { media_type };
    refused(format!("{context}: {what} {d} is referenced but not in the bundle{}", delta_hint(scope)))
}

fn delta_hint(scope: Scope<'_>) -> String {
    match scope {
        Scope::Upstream(upstream) => {
            format!(" (a delta may leave out only what an earlier bundle imported into {upstream})")
        }
        Scope::TrustedAsset | Scope::Carried => String::new(),
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
fn plan(
    intake: &Read1<'_>,
    router: &dyn Router,
    options: &ImportOptions,
) -> Result<(Document, Digest, Vec<Planned>), ImportError> {
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
    let verifier = Verifier { store: intake.store, verified: &intake.verified };
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
        let mut graph = (Vec::new(), Vec::new());
        verifier.walk(entry, true, &context, &mut graph, 0, scope)?;
        let Some((_, media_type, _)) = graph.0.iter().find(|(d, _, _)| *d == digest).cloned() else {
            return Err(refused(format!("{context}: the entry {digest} is not a manifest")));
        };
        let what = match (what, asset) {
            (Some(what), _) => what,
            (None, Some(asset)) => asset_kind(intake.store, &verifier, asset, entry, &digest, scope)?,
            (None, None) => Kind::Unnamed,
        };
        out.push(Planned { entry: entry.clone(), digest, media_type, manifests: graph.0, objects: graph.1, what });
    }
    Ok((index, index_digest, out))
}

/// An OS image entry: one layer, the asset; its trust record may not contradict this store's.
fn asset_kind(
    store: &Store,
    verifier: &Verifier<'_>,
    asset: AssetPath,
    entry: &Descriptor,
    digest: &Digest,
    scope: Scope<'_>,
) -> Result<Kind, ImportError> {
    let path = &asset.path();
    let bytes = store.read_object(digest)?.ok_or_else(|| refused(format!("{path}: {digest} vanished")))?;
    let doc: Document = serde_json::from_slice(&bytes).map_err(|e| refused(format!("{path}: {e}")))?;
    let [layer] = doc.layers.as_slice() else {
        return Err(refused(format!("{path}: an OS image manifest has exactly one layer")));
    };
    let layer_digest: Digest = layer.digest.parse().map_err(|e| refused(format!("{path}: {e}")))?;
    if layer_digest.algorithm() != Algorithm::Sha256 {
        return Err(refused(format!("{path}: an OS image is addressed by sha256")));
    }
    if !verifier.available(&layer_digest, layer.size, path, scope)? {
        return Err(missing(path, &layer.media_type, &layer_digest, scope));
    }
    if let Some(trust) =
        entry.annotation(layout::TRUST_SHA256).or_else(|| doc.annotations.get(layout::TRUST_SHA256).map(String::as_str))
    {
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

/// Phase 3: make the verified bundle visible.
fn register(
    store: &Store,
    planned: &[Planned],
    options: &ImportOptions,
    report: &mut ImportReport,
) -> Result<(), ImportError> {
    let now = tender_store::now_secs();
    for p in planned {
        for (d, media_type, size) in &p.manifests {
            store.meta_put(d, &ManifestMeta { media_type: media_type.clone(), size: *size })?;
        }
        if options.pin {
            for d in &p.objects {
                store.pin(d, "import")?;
            }
        }
        match &p.what {
            Kind::Image { name, upstream, repository, tag } => {
                for d in &p.objects {
                    store.record_known(d, upstream)?;
                }
                if let Some(tag) = tag {
                    store.tag_put(&TagRecord {
                        upstream: upstream.clone(),
                        repository: repository.to_string(),
                        tag: tag.clone(),
                        digest: p.digest,
                        media_type: p.media_type.clone(),
                        size: p.entry.size,
                        fetched_at: now,
                        imported: true,
                    })?;
                }
                report.images.push(ImportedImage {
                    name: name.clone(),
                    upstream: upstream.clone(),
                    digest: p.digest.to_string(),
                    media_type: p.media_type.clone(),
                    objects: p.objects.len(),
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
    let (index, index_digest, planned) = plan(&intake, router, options)?;
    let mut report = ImportReport {
        index_digest: index_digest.to_string(),
        delta_of: index.annotations.get(layout::SINCE).cloned(),
        blobs: intake.verified.len() as u64,
        new_blobs: intake.new_blobs,
        bytes: intake.verified.values().sum(),
        ignored: intake.ignored.clone(),
        ..ImportReport::default()
    };
    register(intake.store, &planned, options, &mut report)?;
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

/// Import a bundle at `path`: a directory, or a tar file.
pub fn import_path(
    path: &Path,
    store: &Store,
    router: &dyn Router,
    options: &ImportOptions,
) -> Result<ImportReport, ImportError> {
    if path.is_dir() {
        import_dir(path, store, router, options)
    } else {
        let mut f = io::BufReader::with_capacity(1 << 20, File::open(path)?);
        import_tar(&mut f, store, router, options)
    }
}
