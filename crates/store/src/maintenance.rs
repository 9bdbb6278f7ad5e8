//! fsck (re-verify every object, quarantine mismatches) and GC (LRU eviction to a cap).

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tender_oci::{Algorithm, Digest};

use crate::layout::{Store, StoreError};

/// What `fsck` found.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsckReport {
    pub checked: u64,
    pub bytes: u64,
    /// Objects whose content does not hash to their name.
    pub corrupt: Vec<String>,
    /// Where corrupt objects were moved (with `repair`).
    pub quarantined: Vec<String>,
    /// Files under objects/ that are not named like a digest.
    pub stray: Vec<String>,
}

/// One object considered by GC.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcCandidate {
    pub digest: Digest,
    pub size: u64,
    #[serde(skip, default = "unix_epoch")]
    pub last_used: SystemTime,
}

fn unix_epoch() -> SystemTime {
    SystemTime::UNIX_EPOCH
}

/// What GC would do or did.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcPlan {
    pub total_bytes: u64,
    pub cap_bytes: Option<u64>,
    pub evict: Vec<GcCandidate>,
    pub evict_bytes: u64,
    /// Objects over the cap that could not be evicted (in use, pinned, goldens, trusted).
    pub protected_bytes: u64,
    pub orphans: Vec<PathBuf>,
    /// Of `evict`: objects a retired release left without a holder (`tender bundle rm`,
    /// `tender tag rm`), freed whatever the cap.
    #[serde(default)]
    pub retired: usize,
    #[serde(default)]
    pub retired_bytes: u64,
    /// Retired objects kept: another bundle, a pin or a tag still holds them (or they are gone).
    #[serde(default)]
    pub retired_kept: Vec<Digest>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcReport {
    pub freed_bytes: u64,
    pub evicted: usize,
    pub orphans_removed: usize,
}

impl Store {
    /// Every committed object with its size and LRU time.
    pub fn list_objects(&self) -> Result<Vec<GcCandidate>, StoreError> {
        let mut out = Vec::new();
        for (algorithm, path) in self.object_files()? {
            let Some(digest) = digest_of_path(algorithm, &path) else {
                continue;
            };
            let Ok(meta) = fs::metadata(&path) else {
                continue;
            };
            out.push(GcCandidate {
                digest,
                size: meta.len(),
                last_used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
        Ok(out)
    }

    /// Re-hash every object; with `repair`, move mismatches to `quarantine/`.
    pub fn fsck(&self, repair: bool) -> Result<FsckReport, StoreError> {
        let mut report = FsckReport::default();
        for (algorithm, path) in self.object_files()? {
            let Some(expected) = digest_of_path(algorithm, &path) else {
                report.stray.push(path.display().to_string());
                continue;
            };
            let (actual, len) = hash_file(&path, algorithm).map_err(|e| self.err(e))?;
            report.checked += 1;
            report.bytes += len;
            if actual != expected {
                tracing::warn!(digest = %expected, actual = %actual, "fsck: object does not match its digest");
                report.corrupt.push(expected.to_string());
                if repair {
                    let target = self.quarantine(&expected, &path)?;
                    report.quarantined.push(target.display().to_string());
                }
            }
        }
        Ok(report)
    }

    /// Every file under `objects/<algorithm>/`, for each algorithm (a file elsewhere under
    /// `objects/` is not tender's and is left alone).
    fn object_files(&self) -> Result<Vec<(Algorithm, PathBuf)>, StoreError> {
        let mut out = Vec::new();
        for algorithm in Algorithm::ALL {
            let files = walk_files(&self.objects_dir(algorithm)).map_err(|e| self.err(e))?;
            out.extend(files.into_iter().map(|p| (algorithm, p)));
        }
        Ok(out)
    }

    /// Decide what to evict to get under `cap` (least recently used first), skipping what
    /// `protected` names, and which spool files older than `spool_age` are orphans.
    pub fn gc_plan(
        &self,
        cap: Option<u64>,
        spool_age: Duration,
        protected: &dyn Fn(&Digest) -> bool,
    ) -> Result<GcPlan, StoreError> {
        let mut objects = self.list_objects()?;
        let total: u64 = objects.iter().map(|o| o.size).sum();
        self.room.counted(total);
        let mut plan = GcPlan { total_bytes: total, cap_bytes: cap, ..GcPlan::default() };
        let mut remaining = total;
        let retired = self.retired()?;
        if !retired.is_empty() {
            // A retired release: what nothing else pins, tags or holds goes first, at any size.
            let tagged = self.tagged_objects()?;
            let held: HashSet<Digest> = self.imports()?.iter().flat_map(|r| r.objects()).collect();
            let retired: HashSet<Digest> = retired.into_iter().collect();
            objects.retain(|o| {
                if !retired.contains(&o.digest) {
                    return true;
                }
                if protected(&o.digest) || tagged.contains(&o.digest) || held.contains(&o.digest) {
                    return true;
                }
                remaining -= o.size;
                plan.retired += 1;
                plan.retired_bytes += o.size;
                plan.evict_bytes += o.size;
                plan.evict.push(o.clone());
                false
            });
            let freed: HashSet<Digest> = plan.evict.iter().map(|o| o.digest).collect();
            plan.retired_kept = retired.into_iter().filter(|d| !freed.contains(d)).collect();
            plan.retired_kept.sort();
        }
        if let Some(cap) = cap {
            objects.sort_by_key(|o| o.last_used);
            for o in objects {
                if remaining <= cap {
                    break;
                }
                if protected(&o.digest) {
                    plan.protected_bytes += o.size;
                    continue;
                }
                remaining -= o.size;
                plan.evict_bytes += o.size;
                plan.evict.push(o);
            }
        }
        let now = SystemTime::now();
        if let Ok(entries) = fs::read_dir(self.spool_dir()) {
            for e in entries.flatten() {
                let old = e
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|m| now.duration_since(m).ok())
                    .is_some_and(|age| age >= spool_age);
                if old {
                    plan.orphans.push(e.path());
                }
            }
        }
        Ok(plan)
    }

    /// Carry out a plan made by [`Store::gc_plan`].
    pub fn gc_apply(&self, plan: &GcPlan) -> Result<GcReport, StoreError> {
        let mut report = GcReport::default();
        for (i, o) in plan.evict.iter().enumerate() {
            // Retired objects come first in a plan; one pinned again since (an import) stays.
            if i < plan.retired && self.is_pinned(&o.digest) {
                self.clear_retired(&o.digest)?;
                continue;
            }
            self.remove_object(&o.digest)?;
            if i < plan.retired {
                self.clear_retired(&o.digest)?;
            }
            report.freed_bytes += o.size;
            report.evicted += 1;
        }
        for d in &plan.retired_kept {
            self.clear_retired(d)?;
        }
        for p in &plan.orphans {
            if fs::remove_file(p).is_ok() {
                report.orphans_removed += 1;
            }
        }
        Ok(report)
    }
}

fn walk_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for e in entries {
            let e = e?;
            let ty = e.file_type()?;
            if ty.is_dir() {
                stack.push(e.path());
            } else if ty.is_file() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn digest_of_path(algorithm: Algorithm, path: &Path) -> Option<Digest> {
    Digest::from_hex(algorithm, path.file_name()?.to_str()?).ok()
}

/// The digest and length of a file's content, hashed 1 MiB at a time; `read` hears of each
/// span read (the scrub paces itself with it).
pub(crate) fn hash_file_with(
    path: &Path,
    algorithm: Algorithm,
    read: &mut dyn FnMut(u64),
) -> io::Result<(Digest, u64)> {
    let mut f = File::open(path)?;
    let mut h = algorithm.hasher();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        len += n as u64;
        read(n as u64);
    }
    Ok((h.finalize(), len))
}

fn hash_file(path: &Path, algorithm: Algorithm) -> io::Result<(Digest, u64)> {
    hash_file_with(path, algorithm, &mut |_| {})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use crate::OpenMode;

    #[test]
    fn should_quarantine_corrupt_objects_on_repair() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
        let good = Digest::of(b"good");
        store.put_bytes("k1", b"good", &good).unwrap();
        let bad = Digest::of(b"bad");
        store.put_bytes("k2", b"bad", &bad).unwrap();
        fs::write(store.object_path(&bad), b"evil").unwrap();

        let report = store.fsck(false).unwrap();
        assert_eq!(report.checked, 2);
        assert_eq!(report.corrupt, vec![bad.to_string()]);
        assert!(store.object_len(&bad).is_some(), "fsck without repair changes nothing");

        let report = store.fsck(true).unwrap();
        assert_eq!(report.quarantined.len(), 1);
        assert!(store.object_len(&bad).is_none());
        assert!(store.object_len(&good).is_some());
        assert_eq!(fs::read_dir(dir.path().join("quarantine")).unwrap().count(), 1);
        assert!(store.fsck(false).unwrap().corrupt.is_empty());
    }

    #[test]
    fn should_find_and_quarantine_a_corrupt_sha512_object() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
        let good = Algorithm::Sha512.digest(b"good");
        store.put_bytes("k1", b"good", &good).unwrap();
        let bad = Algorithm::Sha512.digest(b"bad");
        store.put_bytes("k2", b"bad", &bad).unwrap();
        let plain = Digest::of(b"bad");
        store.put_bytes("k3", b"bad", &plain).unwrap();
        fs::write(store.object_path(&bad), b"evil").unwrap();
        // A sha256 name in the sha512 tree is not an object.
        let stray = store.objects_dir(Algorithm::Sha512).join("ab").join(plain.hex());
        fs::create_dir_all(stray.parent().unwrap()).unwrap();
        fs::write(&stray, b"bad").unwrap();

        let report = store.fsck(false).unwrap();
        assert_eq!(report.checked, 3);
        assert_eq!(report.corrupt, vec![bad.to_string()]);
        assert_eq!(report.stray, vec![stray.display().to_string()]);
        let report = store.fsck(true).unwrap();
        assert_eq!(report.quarantined.len(), 1);
        assert!(report.quarantined[0].contains(&format!("sha512-{}.", bad.hex())), "{report:?}");
        assert!(store.object_len(&bad).is_none());
        assert!(store.object_len(&good).is_some() && store.object_len(&plain).is_some());
        assert!(store.fsck(false).unwrap().corrupt.is_empty());
    }

    #[test]
    fn should_evict_sha512_objects_in_lru_order_with_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
        let mut digests = Vec::new();
        for (i, body) in [b"aaaa", b"bbbb", b"cccc"].iter().enumerate() {
            let alg = if i == 1 { Algorithm::Sha256 } else { Algorithm::Sha512 };
            let d = alg.digest(*body);
            store.put_bytes(&format!("k{i}"), *body, &d).unwrap();
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + i as u64);
            File::options().write(true).open(store.object_path(&d)).unwrap().set_modified(t).unwrap();
            digests.push(d);
        }
        store.pin(&digests[0], "test").unwrap();
        let plan = store.gc_plan(Some(4), Duration::from_secs(3600), &|d| store.is_pinned(d)).unwrap();
        assert_eq!(plan.total_bytes, 12);
        let evicted: Vec<Digest> = plan.evict.iter().map(|c| c.digest).collect();
        assert_eq!(evicted, vec![digests[1], digests[2]], "the pinned sha512 object stays");
        store.gc_apply(&plan).unwrap();
        assert!(store.object_len(&digests[0]).is_some());
        assert!(store.object_len(&digests[2]).is_none());
    }

    #[test]
    fn should_evict_least_recently_used_first_and_skip_protected() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), OpenMode::Exclusive).unwrap();
        let mut digests = Vec::new();
        for (i, body) in [b"aaaa", b"bbbb", b"cccc", b"dddd"].iter().enumerate() {
            let d = Digest::of(*body);
            store.put_bytes(&format!("k{i}"), *body, &d).unwrap();
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + i as u64);
            File::options().write(true).open(store.object_path(&d)).unwrap().set_modified(t).unwrap();
            digests.push(d);
        }
        let protected = digests[0];
        let plan = store.gc_plan(Some(8), Duration::from_secs(3600), &|d| *d == protected).unwrap();
        let evicted: Vec<Digest> = plan.evict.iter().map(|c| c.digest).collect();
        assert_eq!(evicted, vec![digests[1], digests[2]]);
        assert_eq!(plan.protected_bytes, 4);
        let report = store.gc_apply(&plan).unwrap();
        assert_eq!(report.freed_bytes, 8);
        assert!(store.object_len(&digests[0]).is_some());
        assert!(store.object_len(&digests[3]).is_some());
    }
}
