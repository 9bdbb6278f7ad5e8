//! What each imported bundle brought and holds (`imports/<alg>/<hex>.json`, named by the
//! bundle's index digest), and how a release is retired: `tender bundle rm` or `tender tag rm`
//! releases the pins the bundle's entries hold, marks what no longer has a holder as retired
//! (`retired/<alg>/<hex>`), and the next gc frees every retired object that nothing pins, no
//! tag reaches and no other bundle holds.
//!
//! A pin written by an import has the reason `bundle`; only such pins are released (a pin of
//! `tender prefetch --pin`, or of an import before import records, stays until unpinned).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;
use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tender_oci::{Algorithm, Digest};

use crate::fsutil::write_atomic;
use crate::layout::{Store, StoreError};
use crate::types::TagRecord;

/// The pin reason of objects an import pinned: released when no bundle holds them any more.
pub const BUNDLE_PIN: &str = "bundle";

/// Deepest nesting of indexes followed when walking from a tag.
const MAX_DEPTH: usize = 4;
/// Largest manifest read when walking from a tag.
const MAX_MANIFEST: u64 = 8 << 20;

/// One imported bundle: when, by whom, what it named, and the objects each entry holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportRecord {
    /// The bundle's `index.json` digest (what `export` printed and `bundle rm` names).
    pub index: Digest,
    /// Seconds since the Unix epoch.
    pub imported_at: u64,
    /// Who imported it: `admin token` through a server, `user <name>` with --data.
    pub identity: String,
    /// The file or directory it was read from, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// A delta: the index digest of the bundle it builds on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_of: Option<String>,
    /// Whether its objects were pinned (`--no-pin`: false).
    pub pinned: bool,
    /// Blobs and bytes carried in the bundle itself.
    pub blobs: u64,
    pub bytes: u64,
    /// The bundle's declared content (`export --spec`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Digest>,
    pub entries: Vec<ImportEntry>,
    /// Every object of each entry's graph (itself included), by the entry's digest: entries
    /// naming the same manifest share one list.
    pub graphs: BTreeMap<Digest, Vec<Digest>>,
}

/// One `index.json` entry of an imported bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportEntry {
    /// `image`, `asset` (an OS image) or `unnamed` (a referrer by digest, or no name).
    pub kind: String,
    /// The image reference or the asset's Image Factory path; the digest when unnamed.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    pub digest: Digest,
}

impl ImportRecord {
    /// Every object some entry holds.
    pub fn objects(&self) -> HashSet<Digest> {
        self.graphs.values().flatten().copied().collect()
    }

    /// The objects `entries` hold.
    fn objects_of<'a>(&'a self, entries: impl Iterator<Item = &'a ImportEntry>) -> BTreeSet<Digest> {
        entries.filter_map(|e| self.graphs.get(&e.digest)).flatten().copied().collect()
    }

    /// Drop the graphs no entry names any more.
    fn prune(&mut self) {
        let named: HashSet<Digest> = self.entries.iter().map(|e| e.digest).collect();
        self.graphs.retain(|d, _| named.contains(d));
    }
}

/// A tag `tender prefetch --pin` pinned: its objects (pin reason `prefetch`) are held until
/// `tender tag rm` releases it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TagPin {
    pub upstream: String,
    pub repository: String,
    pub tag: String,
    /// What the tag pointed to when it was pinned.
    pub digest: Digest,
    pub pinned_at: u64,
}

/// The pin reason of what `prefetch --pin` pinned.
pub const PREFETCH_PIN: &str = "prefetch";

/// What retiring released: the entries dropped and the objects left without a holder.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Released {
    pub entries: Vec<String>,
    /// Objects no bundle holds any more and whose bundle pin was released: retired, freed by
    /// the next gc unless a tag reaches them.
    pub retired: Vec<Digest>,
    /// Bytes of the retired objects present in the store.
    pub retired_bytes: u64,
    /// Objects still held by another bundle (or pinned otherwise).
    pub still_held: usize,
}

impl Store {
    fn imports_dir(&self, algorithm: Algorithm) -> PathBuf {
        self.root().join("imports").join(algorithm.name())
    }

    fn import_path(&self, index: &Digest) -> PathBuf {
        self.imports_dir(index.algorithm()).join(format!("{}.json", index.hex()))
    }

    fn retired_path(&self, digest: &Digest) -> PathBuf {
        self.root().join("retired").join(digest.algorithm().name()).join(digest.hex())
    }

    fn tag_pin_path(&self, upstream: &str, repository: &str, tag: &str) -> PathBuf {
        let mut h = Sha256::new();
        for part in [upstream, repository, tag] {
            h.update(part.as_bytes());
            h.update([0u8]);
        }
        self.root().join("pins").join("tags").join(format!("{}.json", hex::encode(h.finalize())))
    }

    /// `tender prefetch --pin IMAGE:TAG`: the tag holds its objects (pinned one by one with the
    /// reason `prefetch`) until `tender tag rm` releases it.
    pub fn pin_tag(&self, upstream: &str, repository: &str, tag: &str, digest: &Digest) -> Result<(), StoreError> {
        let pin = TagPin {
            upstream: upstream.into(),
            repository: repository.into(),
            tag: tag.into(),
            digest: *digest,
            pinned_at: crate::types::now_secs(),
        };
        let bytes = serde_json::to_vec(&pin).map_err(|e| self.err(io::Error::other(e)))?;
        write_atomic(&self.tag_pin_path(upstream, repository, tag), &bytes).map_err(|e| self.err(e))
    }

    /// Every pinned tag.
    pub fn tag_pins(&self) -> Result<Vec<TagPin>, StoreError> {
        let entries = match fs::read_dir(self.root().join("pins").join("tags")) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.err(e)),
        };
        let mut out: Vec<TagPin> = entries
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".json") && !n.starts_with('.')))
            .filter_map(|e| serde_json::from_slice(&fs::read(e.path()).ok()?).ok())
            .collect();
        out.sort_by(|a, b| (&a.upstream, &a.repository, &a.tag).cmp(&(&b.upstream, &b.repository, &b.tag)));
        Ok(out)
    }

    /// Every object some pinned tag's graph reaches.
    fn tag_pinned_objects(&self, except: Option<&TagPin>) -> Result<HashSet<Digest>, StoreError> {
        let mut out = HashSet::new();
        for p in self.tag_pins()? {
            if except.is_some_and(|x| x.upstream == p.upstream && x.repository == p.repository && x.tag == p.tag) {
                continue;
            }
            out.extend(self.graph_of(&p.digest));
        }
        Ok(out)
    }

    /// Record an imported bundle (a second import of the same bundle replaces the record).
    pub fn import_put(&self, record: &ImportRecord) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(record).map_err(|e| self.err(io::Error::other(e)))?;
        write_atomic(&self.import_path(&record.index), &bytes).map_err(|e| self.err(e))?;
        // Held again: no longer retired.
        let retired = self.retired()?;
        if !retired.is_empty() {
            let objects = record.objects();
            for d in retired.iter().filter(|d| objects.contains(d)) {
                self.unretire(d)?;
            }
        }
        Ok(())
    }

    pub fn import_get(&self, index: &Digest) -> Result<Option<ImportRecord>, StoreError> {
        match fs::read(self.import_path(index)) {
            Ok(b) => Ok(serde_json::from_slice(&b).ok()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Every import record, oldest first.
    pub fn imports(&self) -> Result<Vec<ImportRecord>, StoreError> {
        let mut out: Vec<ImportRecord> = Vec::new();
        for algorithm in Algorithm::ALL {
            let entries = match fs::read_dir(self.imports_dir(algorithm)) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.err(e)),
            };
            for e in entries.flatten() {
                if !e.file_name().to_str().is_some_and(|n| n.ends_with(".json")) {
                    continue;
                }
                let bytes = fs::read(e.path()).map_err(|e| self.err(e))?;
                // A record that does not parse is skipped, and said so: what it held is no
                // longer counted as held (its pins stay until unpinned).
                match serde_json::from_slice::<ImportRecord>(&bytes) {
                    Ok(r) => out.push(r),
                    Err(err) => {
                        tracing::warn!(path = %e.path().display(), error = %err, "an import record does not parse")
                    }
                }
            }
        }
        out.sort_by_key(|r| (r.imported_at, r.index));
        Ok(out)
    }

    /// `tender bundle rm`: forget the bundle `index`, release the pins only it held, drop the
    /// tags it registered that still point where it put them (unless another bundle registered
    /// the same), and mark what nothing holds any more as retired. `None`: no such import.
    pub fn import_remove(&self, index: &Digest, dry_run: bool) -> Result<Option<Released>, StoreError> {
        let Some(record) = self.import_get(index)? else {
            return Ok(None);
        };
        let others: Vec<ImportRecord> = self.imports()?.into_iter().filter(|r| r.index != *index).collect();
        let names = record.entries.iter().map(|e| e.name.clone()).collect();
        let mut held: HashSet<Digest> = others.iter().flat_map(|r| r.objects()).collect();
        held.extend(self.tag_pinned_objects(None)?);
        let mine = record.objects_of(record.entries.iter());
        let released = self.release(mine, &held, &[BUNDLE_PIN], names, dry_run)?;
        if !dry_run {
            for e in &record.entries {
                let (Some(up), Some(repo), Some(tag)) = (&e.upstream, &e.repository, &e.tag) else { continue };
                let theirs = others.iter().flat_map(|r| &r.entries).any(|o| {
                    o.upstream.as_ref() == Some(up)
                        && o.repository.as_ref() == Some(repo)
                        && o.tag.as_ref() == Some(tag)
                });
                let still_ours =
                    self.tag_get(up, repo, tag)?.is_some_and(|t: TagRecord| t.imported && t.digest == e.digest);
                if still_ours && !theirs {
                    self.tag_remove(up, repo, tag)?;
                }
            }
            match fs::remove_file(self.import_path(index)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        Ok(Some(released))
    }

    /// `tender tag rm`: every bundle entry registered under the tag lets go of its objects (an
    /// entry-less record is dropped), and so does a tag `prefetch --pin` pinned; returns what
    /// was released.
    pub fn import_release_tag(&self, upstream: &str, repository: &str, tag: &str) -> Result<Released, StoreError> {
        let records = self.imports()?;
        let is_it = |e: &ImportEntry| {
            e.upstream.as_deref() == Some(upstream)
                && e.repository.as_deref() == Some(repository)
                && e.tag.as_deref() == Some(tag)
        };
        let mut names = Vec::new();
        let mut mine = BTreeSet::new();
        let mut kept = Vec::new();
        for mut r in records {
            let (gone, stay): (Vec<ImportEntry>, Vec<ImportEntry>) = r.entries.drain(..).partition(|e| is_it(e));
            names.extend(gone.iter().map(|e| format!("{} (bundle {})", e.name, r.index)));
            mine.extend(r.objects_of(gone.iter()));
            let changed = !gone.is_empty();
            r.entries = stay;
            if changed {
                r.prune();
            }
            kept.push((r, changed));
        }
        // A tag `prefetch --pin` pinned lets go of its graph too.
        let pinned =
            self.tag_pins()?.into_iter().find(|p| p.upstream == upstream && p.repository == repository && p.tag == tag);
        // Its graph's `prefetch` pins are the tag's to release; a bundle entry's objects only
        // their `bundle` pins (a `prefetch` pin there is another holder's: a digest, an older pin).
        let mut prefetched = BTreeSet::new();
        if let Some(p) = &pinned {
            names.push(format!("{upstream}/{repository}:{tag} (pinned by prefetch)"));
            prefetched.extend(self.graph_of(&p.digest));
        }
        if names.is_empty() {
            return Ok(Released::default());
        }
        let mut held: HashSet<Digest> = kept.iter().flat_map(|(r, _)| r.objects()).collect();
        held.extend(self.tag_pinned_objects(pinned.as_ref())?);
        let mine: BTreeSet<Digest> = mine.difference(&prefetched).copied().collect();
        let mut released = self.release(mine, &held, &[BUNDLE_PIN], names, false)?;
        let more = self.release(prefetched, &held, &[BUNDLE_PIN, PREFETCH_PIN], Vec::new(), false)?;
        released.retired.extend(more.retired);
        released.retired_bytes += more.retired_bytes;
        released.still_held += more.still_held;
        if pinned.is_some() {
            match fs::remove_file(self.tag_pin_path(upstream, repository, tag)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        for (r, changed) in kept {
            if !changed {
                continue;
            }
            if r.entries.is_empty() {
                match fs::remove_file(self.import_path(&r.index)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(self.err(e)),
                }
            } else {
                let bytes = serde_json::to_vec(&r).map_err(|e| self.err(io::Error::other(e)))?;
                write_atomic(&self.import_path(&r.index), &bytes).map_err(|e| self.err(e))?;
            }
        }
        Ok(released)
    }

    /// Release the objects (`mine`) that nothing in `held` holds and whose pin (if any) has a
    /// `releasable` reason: their pins go, and they are marked retired.
    fn release(
        &self,
        mine: BTreeSet<Digest>,
        held: &HashSet<Digest>,
        releasable: &[&str],
        names: Vec<String>,
        dry_run: bool,
    ) -> Result<Released, StoreError> {
        let mut out = Released { entries: names, ..Released::default() };
        for d in mine {
            if held.contains(&d) {
                out.still_held += 1;
                continue;
            }
            match self.pin_reason(&d)? {
                Some(reason) if !releasable.contains(&reason.as_str()) => {
                    out.still_held += 1;
                    continue;
                }
                Some(_) if !dry_run => {
                    self.unpin(&d)?;
                }
                _ => {}
            }
            if !dry_run {
                write_atomic(&self.retired_path(&d), b"").map_err(|e| self.err(e))?;
            }
            out.retired_bytes += self.object_len(&d).unwrap_or(0);
            out.retired.push(d);
        }
        Ok(out)
    }

    fn unretire(&self, digest: &Digest) -> Result<(), StoreError> {
        match fs::remove_file(self.retired_path(digest)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Objects marked retired (by `bundle rm` or `tag rm`), present or not.
    pub fn retired(&self) -> Result<Vec<Digest>, StoreError> {
        let mut out = Vec::new();
        for algorithm in Algorithm::ALL {
            let entries = match fs::read_dir(self.root().join("retired").join(algorithm.name())) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.err(e)),
            };
            out.extend(entries.flatten().filter_map(|e| Digest::from_hex(algorithm, e.file_name().to_str()?).ok()));
        }
        out.sort();
        Ok(out)
    }

    /// Forget that `digest` was retired (gc kept it: shared, pinned or tagged; or freed it).
    pub fn clear_retired(&self, digest: &Digest) -> Result<(), StoreError> {
        self.unretire(digest)
    }

    /// Why `digest` is pinned, if it is (`None` also for a pin file that does not parse).
    pub fn pin_reason(&self, digest: &Digest) -> Result<Option<String>, StoreError> {
        let path = self.pin_path(digest);
        match fs::read(&path) {
            Ok(b) => {
                let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_default();
                Ok(Some(v["reason"].as_str().unwrap_or("").to_string()))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Every tag record in the store (imported and pulled).
    pub fn tag_records(&self) -> Result<Vec<TagRecord>, StoreError> {
        let mut out = Vec::new();
        let dir = self.root().join("tags");
        let shards = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(self.err(e)),
        };
        for shard in shards.flatten() {
            let Ok(files) = fs::read_dir(shard.path()) else { continue };
            for f in files.flatten() {
                if !f.file_name().to_str().is_some_and(|n| n.ends_with(".json") && !n.starts_with('.')) {
                    continue;
                }
                if let Ok(b) = fs::read(f.path()) {
                    if let Ok(r) = serde_json::from_slice::<TagRecord>(&b) {
                        out.push(r);
                    }
                }
            }
        }
        out.sort_by(|a, b| (&a.upstream, &a.repository, &a.tag).cmp(&(&b.upstream, &b.repository, &b.tag)));
        Ok(out)
    }

    /// Every object of the manifest `root`'s graph that the store holds (itself included):
    /// index children, configs, layers, as far as they are present.
    pub fn graph_of(&self, root: &Digest) -> Vec<Digest> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        self.walk_graph(root, 0, &mut seen, &mut out);
        out
    }

    fn walk_graph(&self, d: &Digest, depth: usize, seen: &mut HashSet<Digest>, out: &mut Vec<Digest>) {
        if !seen.insert(*d) {
            return;
        }
        let Some(len) = self.object_len(d) else { return };
        out.push(*d);
        if depth > MAX_DEPTH || len > MAX_MANIFEST || self.meta_get(d).ok().flatten().is_none() {
            return;
        }
        let Ok(Some(bytes)) = self.read_object(d) else { return };
        let Ok(doc) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return };
        let mut children = Vec::new();
        for key in ["manifests", "layers"] {
            if let Some(list) = doc[key].as_array() {
                children.extend(list.iter().filter_map(|c| c["digest"].as_str()));
            }
        }
        children.extend(doc["config"]["digest"].as_str());
        for c in children {
            if let Ok(c) = c.parse::<Digest>() {
                self.walk_graph(&c, depth + 1, seen, out);
            }
        }
    }

    /// Every object some tag record reaches.
    pub fn tagged_objects(&self) -> Result<HashSet<Digest>, StoreError> {
        let mut out = HashSet::new();
        for t in self.tag_records()? {
            if !out.contains(&t.digest) {
                out.extend(self.graph_of(&t.digest));
            }
        }
        Ok(out)
    }
}
