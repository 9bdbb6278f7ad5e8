//! The books: every key under the prefix, listed once, and what each is for. `tender gc
//! --bucket` counts every byte from them (its cap is on the whole), and the sweep, gc and fsck
//! find in them the *strays*, keys nothing names:
//!
//! - the chunk objects of an upload (`parts/<upload>/`) that no index and no progress record
//!   names: a healed object's first upload (its index now names the second), a killed holder's
//!   after a takeover (the taker's record replaced its record), an upload given up whose abort
//!   did not get through;
//! - probe objects (`leases/.probe-*`) of a start-up check that timed out;
//! - content stored whole (`objects/<alg>/<hex>`, before bucket format 3) without an index.
//!
//! Removing a stray upload is safe because an upload writes its progress record before its
//! first chunk and drops it only after its index is written: chunks listed before the records,
//! and records listed before the indexes, are named by one of them while their upload runs or
//! once it finished. The listing under the prefix is in key order (`index/` before `parts/`
//! before `progress/`), so before removing anything the records and then the indexes are
//! listed again ([`Bucket::remove_strays`]). The sweep and gc remove only strays older than
//! `gcGrace`; a probe also only once older than three of this replica's `requestTimeout` (one
//! younger may belong to a check under way, which would then find no conditional writes).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::ObjectMeta;
use serde::{Deserialize, Serialize};
use tender_oci::{Algorithm, Digest};

use crate::index::is_upload_id;
use crate::lease::now_ms;
use crate::parts::Progress;
use crate::{Bucket, BucketError, ChunkIndex};

/// The chunk objects of one upload, as listed.
#[derive(Debug, Clone, Default)]
pub(crate) struct UploadDir {
    pub bytes: u64,
    pub keys: Vec<ObjectPath>,
    /// When its newest chunk was written (milliseconds since the Unix epoch, the server's clock).
    pub newest: u64,
}

/// Every key under the prefix, sorted by what it is for.
#[derive(Debug, Default)]
pub(crate) struct Books {
    /// Every byte under the prefix.
    pub total: u64,
    /// `parts/<upload>/`: only directories that hold objects (SeaweedFS also lists an emptied
    /// one as a common prefix; a recursive listing does not).
    pub uploads: BTreeMap<String, UploadDir>,
    /// `index/<alg>/<hex>.json` whose name is a digest.
    pub indexes: Vec<(Digest, ObjectMeta)>,
    /// `index/<alg>/<name>.json` whose name is not a digest of `<alg>`.
    pub bad_indexes: Vec<String>,
    /// `objects/<alg>/<hex>`.
    pub whole: Vec<(Digest, ObjectMeta)>,
    /// `known/<alg>/<hex>/…`: bytes by object.
    pub known: HashMap<Digest, u64>,
    /// `progress/…`.
    pub progress: Vec<ObjectMeta>,
    /// `leases/.probe-…`.
    pub probes: Vec<ObjectMeta>,
    pub quarantine: u64,
    /// Everything else but probes: indexes, progress, trust, known, lease, served and upload
    /// records, the format marker, keys tender does not know.
    pub records: u64,
}

/// Index entries the books remember between sweeps (about 250 bytes each, so at most about
/// 32 MB); past it, the indexes of a larger bucket are read again at each sweep.
pub(crate) const NAMES_CACHE: usize = if cfg!(test) { 4 } else { 131_072 };

/// What an index names, as read (cached by the index key's ETag: an index is rewritten in place
/// when an object is healed).
#[derive(Debug, Clone)]
pub(crate) struct IndexEntry {
    version: String,
    pub digest: Digest,
    pub upload: Option<String>,
    pub size: u64,
    pub uploaded_at: u64,
}

/// The uploads something names.
#[derive(Debug, Default)]
pub(crate) struct Names {
    /// The indexes read, in listing order.
    pub indexes: Vec<IndexEntry>,
    pub uploads: HashSet<String>,
    /// Of `uploads`, those a progress record names.
    pub by_progress: HashSet<String>,
    /// Every index was read: none that does not parse might name an upload.
    pub complete: bool,
}

/// Keys nothing names, found under the prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stray {
    /// Under the prefix: `parts/<upload>`, `leases/.probe-…` or `objects/<alg>/<hex>`.
    pub key: String,
    pub objects: u64,
    pub bytes: u64,
    /// Seconds since its newest object was written.
    pub age_secs: u64,
    /// Removed (by the sweep, gc, or fsck with `--repair`).
    pub removed: bool,
}

/// What a stray is, for its removal.
#[derive(Debug, Clone)]
pub(crate) enum StrayKind {
    Upload(String),
    Probe(ObjectPath),
    Whole(Digest, ObjectPath),
}

#[derive(Debug, Clone)]
pub(crate) struct Found {
    pub stray: Stray,
    pub kind: StrayKind,
}

fn millis(m: &ObjectMeta) -> u64 {
    u64::try_from(m.last_modified.timestamp_millis()).unwrap_or(0)
}

fn version(m: &ObjectMeta) -> String {
    format!("{:?}/{}/{}", m.e_tag, m.last_modified.timestamp_millis(), m.size)
}

/// The milliseconds of a duration, saturated.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Books {
    /// Sort one key (relative to the prefix) into the books.
    fn add(&mut self, rel: &str, m: ObjectMeta) {
        self.total = self.total.saturating_add(m.size);
        let parts: Vec<&str> = rel.split('/').collect();
        match parts.as_slice() {
            ["parts", upload, _] => {
                let dir = self.uploads.entry((*upload).to_string()).or_default();
                dir.bytes = dir.bytes.saturating_add(m.size);
                dir.newest = dir.newest.max(millis(&m));
                dir.keys.push(m.location);
            }
            ["index", alg, name] => {
                self.records = self.records.saturating_add(m.size);
                let digest = name
                    .strip_suffix(".json")
                    .and_then(|hex| Algorithm::ALL.into_iter().find(|a| a.to_string() == *alg).map(|a| (a, hex)))
                    .and_then(|(a, hex)| Digest::from_hex(a, hex).ok());
                match digest {
                    Some(d) => self.indexes.push((d, m)),
                    None => self.bad_indexes.push(format!("{alg}:{}", name.strip_suffix(".json").unwrap_or(name))),
                }
            }
            ["objects", alg, hex] => {
                match Algorithm::ALL
                    .into_iter()
                    .find(|a| a.to_string() == *alg)
                    .and_then(|a| Digest::from_hex(a, hex).ok())
                {
                    Some(d) => self.whole.push((d, m)),
                    None => self.records = self.records.saturating_add(m.size),
                }
            }
            ["known", alg, hex, _] => {
                self.records = self.records.saturating_add(m.size);
                if let Some(d) = Algorithm::ALL
                    .into_iter()
                    .find(|a| a.to_string() == *alg)
                    .and_then(|a| Digest::from_hex(a, hex).ok())
                {
                    let e = self.known.entry(d).or_default();
                    *e = e.saturating_add(m.size);
                }
            }
            ["progress", _] => {
                self.records = self.records.saturating_add(m.size);
                self.progress.push(m);
            }
            ["leases", name] if name.starts_with(".probe-") => self.probes.push(m),
            ["quarantine", ..] => self.quarantine = self.quarantine.saturating_add(m.size),
            _ => self.records = self.records.saturating_add(m.size),
        }
    }

    /// The bytes an indexed object takes: its content as listed, its index and known records.
    pub fn footprint(&self, e: &IndexEntry, index_bytes: u64) -> u64 {
        let content = match &e.upload {
            Some(u) => self.uploads.get(u).map_or(0, |d| d.bytes),
            None => self.whole.iter().find(|(d, _)| *d == e.digest).map_or(0, |(_, m)| m.size),
        };
        content.saturating_add(index_bytes).saturating_add(self.known.get(&e.digest).copied().unwrap_or(0))
    }

    /// The strays at `now` (milliseconds): uploads nothing in `names` names and unindexed
    /// content older than `min_age` (`None`: of any age), probes older than `probe_age`.
    pub fn strays(&self, names: &Names, now: u64, min_age: Option<Duration>, probe_age: Duration) -> Vec<Found> {
        let old = |t: u64, age: Duration| now.saturating_sub(t) >= ms(age);
        let old_enough = |t: u64| min_age.is_none_or(|a| old(t, a));
        let mut out = Vec::new();
        let indexed: HashSet<Digest> = self.indexes.iter().map(|(d, _)| *d).collect();
        for (d, m) in &self.whole {
            if indexed.contains(d) || !old_enough(millis(m)) {
                continue;
            }
            out.push(Found {
                stray: Stray {
                    key: format!("objects/{}/{}", d.algorithm(), d.hex()),
                    objects: 1,
                    bytes: m.size,
                    age_secs: now.saturating_sub(millis(m)) / 1000,
                    removed: false,
                },
                kind: StrayKind::Whole(*d, m.location.clone()),
            });
        }
        if names.complete {
            for (upload, dir) in &self.uploads {
                if names.uploads.contains(upload) || !is_upload_id(upload) || !old_enough(dir.newest) {
                    continue;
                }
                out.push(Found {
                    stray: Stray {
                        key: format!("parts/{upload}"),
                        objects: dir.keys.len() as u64,
                        bytes: dir.bytes,
                        age_secs: now.saturating_sub(dir.newest) / 1000,
                        removed: false,
                    },
                    kind: StrayKind::Upload(upload.clone()),
                });
            }
        }
        for m in &self.probes {
            if !old(millis(m), probe_age) {
                continue;
            }
            let name = m.location.filename().unwrap_or_default();
            out.push(Found {
                stray: Stray {
                    key: format!("leases/{name}"),
                    objects: 1,
                    bytes: m.size,
                    age_secs: now.saturating_sub(millis(m)) / 1000,
                    removed: false,
                },
                kind: StrayKind::Probe(m.location.clone()),
            });
        }
        out
    }
}

impl Bucket {
    /// The age past which a probe object is a stray (see the module's comment).
    pub(crate) fn probe_age(&self) -> Duration {
        self.settings.gc_grace.max(self.settings.request_timeout.saturating_mul(3))
    }

    /// List under `dir` (relative to the prefix; `None`: the whole prefix). `gated`: refused
    /// while the breaker is open.
    pub(crate) async fn list_metas(&self, dir: Option<&str>, gated: bool) -> Result<Vec<ObjectMeta>, BucketError> {
        let p = match dir {
            Some(d) => self.path(d),
            None if self.settings.prefix.is_empty() => ObjectPath::default(),
            None => ObjectPath::from(self.settings.prefix.as_str()),
        };
        let prefix = (!p.as_ref().is_empty()).then_some(&p);
        let fut = self.store.list(prefix).try_collect::<Vec<_>>();
        let listed = if gated { self.call("list", &p, fut).await? } else { self.timed("list", &p, fut).await? };
        listed.map_err(|e| self.store_err("list", &p, e))
    }

    /// Every key under the prefix, in one listing.
    pub(crate) async fn books(&self, gated: bool) -> Result<Books, BucketError> {
        let strip = if self.settings.prefix.is_empty() { String::new() } else { format!("{}/", self.settings.prefix) };
        let mut books = Books::default();
        for m in self.list_metas(None, gated).await? {
            let rel = m.location.as_ref().strip_prefix(strip.as_str()).unwrap_or(m.location.as_ref()).to_string();
            books.add(&rel, m);
        }
        Ok(books)
    }

    /// Read what the listed indexes and progress records name. An index already read at the
    /// same ETag is not read again.
    pub(crate) async fn names(
        &self,
        indexes: &[(Digest, ObjectMeta)],
        progress: &[ObjectMeta],
        gated: bool,
    ) -> Result<Names, BucketError> {
        let mut names = Names { complete: true, ..Names::default() };
        // Records first: see the module's comment.
        for m in progress {
            match self.get_json_via::<Progress>(&m.location, gated).await {
                Ok(Some(r)) => {
                    names.uploads.insert(r.upload.clone());
                    names.by_progress.insert(r.upload);
                }
                Ok(None) => {}
                Err(e) if e.is_corrupt() => {
                    tracing::debug!(record = %m.location, error = %e, "upload progress record unreadable; names no upload")
                }
                Err(e) => return Err(e),
            }
        }
        let mut seen = HashSet::new();
        for (d, m) in indexes {
            seen.insert(m.location.to_string());
            let v = version(m);
            let cached =
                self.names.lock().ok().and_then(|c| c.get(m.location.as_ref()).filter(|e| e.version == v).cloned());
            let entry = match cached {
                Some(e) => e,
                None => match self.get_json_via::<ChunkIndex>(&m.location, gated).await {
                    Ok(Some(i)) => {
                        let e = IndexEntry {
                            version: v,
                            digest: *d,
                            upload: i.upload.clone(),
                            size: i.size,
                            uploaded_at: i.uploaded_at,
                        };
                        if let Ok(mut c) = self.names.lock() {
                            if c.len() < NAMES_CACHE || c.contains_key(m.location.as_ref()) {
                                c.insert(m.location.to_string(), e.clone());
                            }
                        }
                        e
                    }
                    Ok(None) => continue,
                    Err(e) if e.is_corrupt() => {
                        tracing::warn!(bucket = %self.settings.bucket, digest = %d, error = %e,
                            "index unreadable; chunks nothing else names are kept until tender fsck --bucket --repair");
                        names.complete = false;
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            names.uploads.extend(entry.upload.clone());
            names.indexes.push(entry);
        }
        if let Ok(mut c) = self.names.lock() {
            c.retain(|k, _| seen.contains(k));
        }
        Ok(names)
    }

    /// What the progress records and then the indexes name, listed now (after the books: see
    /// the module's comment), and the objects indexed.
    pub(crate) async fn fresh_names(&self, gated: bool) -> Result<(Names, HashSet<Digest>), BucketError> {
        let progress = self.list_metas(Some("progress"), gated).await?;
        let mut indexes = Vec::new();
        for algorithm in Algorithm::ALL {
            for m in self.list_metas(Some(&format!("index/{algorithm}")), gated).await? {
                let hex = m.location.filename().and_then(|f| f.strip_suffix(".json")).unwrap_or_default();
                if let Ok(d) = Digest::from_hex(algorithm, hex) {
                    indexes.push((d, m));
                }
            }
        }
        let names = self.names(&indexes, &progress, gated).await?;
        Ok((names, indexes.iter().map(|(d, _)| *d).collect()))
    }

    /// Remove `found` strays that are strays still: the progress records and then the indexes
    /// are listed and read again first (an index or record written since the books were taken
    /// names its upload). Returns them, `removed` set on those removed.
    pub(crate) async fn remove_strays(&self, found: Vec<Found>, gated: bool) -> Result<Vec<Stray>, BucketError> {
        if found.is_empty() {
            return Ok(Vec::new());
        }
        let (names, indexed) = self.fresh_names(gated).await?;
        let mut out = Vec::new();
        for Found { mut stray, kind } in found {
            match &kind {
                StrayKind::Upload(u) => {
                    if names.complete && !names.uploads.contains(u) {
                        self.remove_parts(u, gated).await?;
                        stray.removed = true;
                    }
                }
                StrayKind::Probe(p) => {
                    self.delete_quietly(p).await?;
                    stray.removed = true;
                }
                StrayKind::Whole(d, p) => {
                    if !indexed.contains(d) {
                        self.delete_quietly(p).await?;
                        stray.removed = true;
                    }
                }
            }
            if stray.removed {
                self.metrics.strays_removed.inc();
                tracing::info!(bucket = %self.settings.bucket, key = %stray.key, objects = stray.objects,
                    bytes = stray.bytes, age_secs = stray.age_secs, "removed keys nothing in the bucket names");
            }
            out.push(stray);
        }
        Ok(out)
    }

    /// The background sweep's second half: remove the strays older than `gcGrace` (see the
    /// module's comment).
    pub(crate) async fn sweep_strays(&self) -> Result<Vec<Stray>, BucketError> {
        let books = self.books(true).await?;
        let names = self.names(&books.indexes, &books.progress, true).await?;
        let found = books.strays(&names, now_ms(), Some(self.settings.gc_grace), self.probe_age());
        self.remove_strays(found, true).await
    }
}
