//! What the data directory holds, image by image (`tender images`, `GET /api/v1/admin/images`):
//! every tag record (imported or pulled) and every imported entry without a tag, with its
//! platforms, its size on disk, whether it is pinned, where it came from, when it was last
//! served and its signature verdict.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};
use tender_oci::Digest;

use crate::imports::ImportRecord;
use crate::layout::{Store, StoreError};

/// One image (or OS image) the store holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryItem {
    /// `upstream/repository:tag`, `upstream/repository@digest`, or an OS image's path.
    pub name: String,
    /// `image` or `os-image`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    pub digest: Digest,
    /// `os/arch[/variant]` of each platform held (of an index: only the children present).
    pub platforms: Vec<String>,
    /// Objects of the image's graph, and of them held here.
    pub objects: usize,
    pub present: usize,
    /// Bytes on disk of the objects held.
    pub size: u64,
    /// Every object held is pinned.
    pub pinned: bool,
    /// `bundle` (imported) or `pulled`.
    pub source: String,
    /// The bundle it came in (the latest, when several carried it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<Digest>,
    /// When it was imported, or when the upstream last confirmed the tag; seconds since the epoch.
    pub since: u64,
    /// The newest use time among its objects (a read touches an object), seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_served: Option<u64>,
    /// The signature verdict of its manifest, where one was recorded: `key`, `keyless`, `parent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
}

impl Store {
    /// Every image and imported OS image the store holds, by name.
    pub fn inventory(&self) -> Result<Vec<InventoryItem>, StoreError> {
        let imports = self.imports()?;
        // (upstream, repository, tag) and digest -> the newest bundle that carried it.
        let mut from_bundle: HashMap<(String, String, String), (Digest, u64)> = HashMap::new();
        for r in &imports {
            for e in &r.entries {
                if let (Some(u), Some(repo), Some(t)) = (&e.upstream, &e.repository, &e.tag) {
                    from_bundle.insert((u.clone(), repo.clone(), t.clone()), (r.index, r.imported_at));
                }
            }
        }
        let mut out = Vec::new();
        let mut seen: HashSet<(String, Digest)> = HashSet::new();
        for t in self.tag_records()? {
            let name = format!("{}/{}:{}", t.upstream, t.repository, t.tag);
            let bundle = from_bundle.get(&(t.upstream.clone(), t.repository.clone(), t.tag.clone()));
            let (source, bundle, since) = match bundle {
                Some((index, at)) if t.imported => ("bundle", Some(*index), *at),
                _ if t.imported => ("bundle", None, t.fetched_at),
                _ => ("pulled", None, t.fetched_at),
            };
            seen.insert((format!("{}/{}", t.upstream, t.repository), t.digest));
            out.push(self.item(name, "image", Some(t.upstream.clone()), t.digest, source, bundle, since));
        }
        for r in &imports {
            out.extend(self.untagged(r, &seen));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The entries of an import that no tag record names: images by digest, OS images.
    fn untagged(&self, r: &ImportRecord, seen: &HashSet<(String, Digest)>) -> Vec<InventoryItem> {
        let mut out = Vec::new();
        for e in &r.entries {
            match (e.kind.as_str(), &e.upstream, &e.repository, &e.tag) {
                ("image", Some(u), Some(repo), None) if !seen.contains(&(format!("{u}/{repo}"), e.digest)) => {
                    let name = format!("{u}/{repo}@{}", e.digest);
                    out.push(self.item(
                        name,
                        "image",
                        Some(u.clone()),
                        e.digest,
                        "bundle",
                        Some(r.index),
                        r.imported_at,
                    ));
                }
                ("asset", ..) => {
                    out.push(self.item(
                        e.name.clone(),
                        "os-image",
                        None,
                        e.digest,
                        "bundle",
                        Some(r.index),
                        r.imported_at,
                    ));
                }
                _ => {}
            }
        }
        out
    }

    #[allow(clippy::too_many_arguments, reason = "one row's fields")]
    fn item(
        &self,
        name: String,
        kind: &str,
        upstream: Option<String>,
        digest: Digest,
        source: &str,
        bundle: Option<Digest>,
        since: u64,
    ) -> InventoryItem {
        let graph = self.graph_of(&digest);
        let mut size = 0;
        let mut pinned = !graph.is_empty();
        let mut last_served = None;
        for d in &graph {
            let path = self.object_path(d);
            if let Ok(meta) = fs::metadata(&path) {
                size += meta.len();
                let used = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map(|t| t.as_secs());
                last_served = last_served.max(used);
            }
            pinned &= self.is_pinned(d);
        }
        let verdict = self.verdict_get(&digest).ok().flatten();
        InventoryItem {
            name,
            kind: kind.to_string(),
            upstream,
            digest,
            platforms: self.platforms(&digest, &graph),
            objects: self.declared_objects(&digest).max(graph.len()),
            present: graph.len(),
            size,
            pinned,
            source: source.to_string(),
            bundle,
            since,
            last_served,
            verdict: verdict.as_ref().map(|v| v.method.clone()),
            signer: verdict.map(|v| v.identity),
        }
    }

    /// The platforms of a manifest: of an index, each child held; of an image, its config's.
    fn platforms(&self, digest: &Digest, graph: &[Digest]) -> Vec<String> {
        let Some(doc) = self.small_json(digest) else { return Vec::new() };
        let held: HashSet<&Digest> = graph.iter().collect();
        let mut out = Vec::new();
        if let Some(children) = doc["manifests"].as_array() {
            for c in children {
                let held_child =
                    c["digest"].as_str().and_then(|d| d.parse::<Digest>().ok()).is_some_and(|d| held.contains(&d));
                if let (true, Some(p)) = (held_child, platform_of(&c["platform"])) {
                    out.push(p);
                }
            }
        } else if let Some(config) = doc["config"]["digest"].as_str().and_then(|d| d.parse::<Digest>().ok()) {
            if let Some(p) = self.small_json(&config).and_then(|c| platform_of(&c)) {
                out.push(p);
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Descriptors one level below a manifest, plus itself: what a complete image holds at least.
    fn declared_objects(&self, digest: &Digest) -> usize {
        let Some(doc) = self.small_json(digest) else { return 1 };
        let n = |k: &str| doc[k].as_array().map_or(0, Vec::len);
        1 + n("manifests") + n("layers") + usize::from(doc["config"].is_object())
    }

    /// A stored JSON document of at most 1 MiB.
    fn small_json(&self, digest: &Digest) -> Option<serde_json::Value> {
        if self.object_len(digest)? > 1 << 20 {
            return None;
        }
        serde_json::from_slice(&self.read_object(digest).ok()??).ok()
    }
}

/// `os/arch[/variant]` of a platform object (an index entry's `platform`, or an image config).
fn platform_of(p: &serde_json::Value) -> Option<String> {
    let (os, arch) = (p["os"].as_str()?, p["architecture"].as_str()?);
    Some(match p["variant"].as_str() {
        Some(v) if !v.is_empty() => format!("{os}/{arch}/{v}"),
        _ => format!("{os}/{arch}"),
    })
}
