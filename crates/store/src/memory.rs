//! What a hit reads, kept in memory: small committed objects (their bytes verified against
//! their digest when read from disk), manifest media types and tag records. Bounded (objects
//! by bytes, records by count) and written through: every change to a record or an object
//! goes through the `Store`, which updates or drops the copy here. Only the process
//! that holds the directory's lock keeps one, so no other writer can make it stale.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use tender_oci::Digest;

use crate::types::{ManifestMeta, TagRecord};

/// Bookkeeping a cached object costs beyond its bytes (entry, key, counters), for the budget.
const ENTRY_OVERHEAD: u64 = 160;
/// Records (tags, manifest media types) kept, each.
const RECORDS: usize = 16_384;

/// How much memory a store may use for small objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes of object content in all (0: no object is kept in memory).
    pub bytes: u64,
    /// The largest object kept, and read whole (verified) instead of sent from its file.
    pub max_object: u64,
}

impl Default for MemoryLimit {
    fn default() -> MemoryLimit {
        MemoryLimit { bytes: 64 << 20, max_object: 64 << 10 }
    }
}

#[derive(Clone)]
pub(crate) struct CachedObject {
    pub(crate) bytes: Bytes,
    /// The object's mtime (its LRU clock on disk) as last set or seen, in seconds.
    pub(crate) touched: Arc<AtomicU64>,
}

#[derive(Clone)]
struct ByLength;

impl Weighter<Digest, CachedObject> for ByLength {
    fn weight(&self, _: &Digest, v: &CachedObject) -> u64 {
        v.bytes.len() as u64 + ENTRY_OVERHEAD
    }
}

pub(crate) struct Memory {
    pub(crate) limit: MemoryLimit,
    objects: Option<Cache<Digest, CachedObject, ByLength>>,
    tags: Cache<String, TagRecord>,
    meta: Cache<Digest, ManifestMeta>,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("limit", &self.limit)
            .field("objects", &self.objects.as_ref().map_or(0, Cache::len))
            .field("object_bytes", &self.objects.as_ref().map_or(0, Cache::weight))
            .finish()
    }
}

impl Memory {
    pub(crate) fn new(limit: MemoryLimit) -> Memory {
        let objects = (limit.bytes > 0 && limit.max_object > 0).then(|| {
            // quick_cache sizes its tables by the expected count: objects of a few KiB.
            let estimated = usize::try_from(limit.bytes / 4096).unwrap_or(usize::MAX).clamp(16, 1 << 20);
            Cache::with_weighter(estimated, limit.bytes, ByLength)
        });
        Memory { limit, objects, tags: Cache::new(RECORDS), meta: Cache::new(RECORDS) }
    }

    pub(crate) fn object(&self, d: &Digest) -> Option<CachedObject> {
        self.objects.as_ref()?.get(d)
    }

    /// Keep a verified object's bytes (only when it fits the per-object limit).
    pub(crate) fn keep_object(&self, d: &Digest, bytes: Bytes, touched: u64) {
        if let Some(c) = &self.objects {
            if bytes.len() as u64 <= self.limit.max_object {
                c.insert(*d, CachedObject { bytes, touched: Arc::new(AtomicU64::new(touched)) });
            }
        }
    }

    /// Forget an object and its manifest record (removed, quarantined).
    pub(crate) fn forget_object(&self, d: &Digest) {
        if let Some(c) = &self.objects {
            c.remove(d);
        }
        self.meta.remove(d);
    }

    pub(crate) fn tag_key(upstream: &str, repository: &str, tag: &str) -> String {
        let mut k = String::with_capacity(upstream.len() + repository.len() + tag.len() + 2);
        for (i, part) in [upstream, repository, tag].into_iter().enumerate() {
            if i > 0 {
                k.push('\0');
            }
            k.push_str(part);
        }
        k
    }

    pub(crate) fn tag(&self, key: &str) -> Option<TagRecord> {
        self.tags.get(key)
    }

    pub(crate) fn keep_tag(&self, key: String, record: TagRecord) {
        self.tags.insert(key, record);
    }

    pub(crate) fn forget_tag(&self, key: &str) {
        self.tags.remove(key);
    }

    pub(crate) fn meta(&self, d: &Digest) -> Option<ManifestMeta> {
        self.meta.get(d)
    }

    pub(crate) fn keep_meta(&self, d: &Digest, meta: ManifestMeta) {
        self.meta.insert(*d, meta);
    }

    pub(crate) fn forget_meta(&self, d: &Digest) {
        self.meta.remove(d);
    }

    /// Objects held and their bytes (the status page, metrics).
    pub(crate) fn usage(&self) -> (usize, u64) {
        self.objects.as_ref().map_or((0, 0), |c| (c.len(), c.weight()))
    }
}

impl CachedObject {
    /// Whether the on-disk LRU clock is due a refresh at `now` (seconds), claiming it if so.
    pub(crate) fn claim_touch(&self, now: u64, every: u64) -> bool {
        let last = self.touched.load(Ordering::Relaxed);
        now.saturating_sub(last) > every
            && self.touched.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use std::fs;

    use tender_oci::Digest;

    use crate::{MemoryLimit, OpenMode, Store, Stored, TagRecord};

    fn store(dir: &std::path::Path, limit: MemoryLimit) -> Store {
        Store::open(dir, OpenMode::Exclusive).unwrap().with_memory(limit)
    }

    fn put(s: &Store, bytes: &[u8]) -> Digest {
        let d = Digest::of(bytes);
        s.put_bytes("test", bytes, &d).unwrap();
        d
    }

    fn bytes_of(o: Option<Stored>) -> Option<Vec<u8>> {
        match o? {
            Stored::Memory(b) => Some(b.to_vec()),
            Stored::File { .. } => panic!("a small object came as its file"),
        }
    }

    #[test]
    fn should_serve_the_verified_bytes_of_a_small_object_from_memory() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), MemoryLimit::default());
        let d = put(&s, b"small blob");
        assert_eq!(bytes_of(s.open_stored(&d).unwrap()).unwrap(), b"small blob");
        assert_eq!(s.memory_usage().0, 1);
        // Rot on disk after the read: memory still holds the bytes that verified.
        fs::write(s.object_path(&d), b"rotten bits").unwrap();
        assert_eq!(bytes_of(s.open_stored(&d).unwrap()).unwrap(), b"small blob");
        // Removal forgets the copy in memory.
        s.remove_object(&d).unwrap();
        assert!(s.open_stored(&d).unwrap().is_none());
        assert_eq!(s.memory_usage(), (0, 0));
    }

    #[test]
    fn should_quarantine_a_small_object_that_fails_its_digest_instead_of_serving_it() {
        let dir = tempfile::tempdir().unwrap();
        // Nothing kept in memory: every read comes from disk, and is checked.
        let s = store(dir.path(), MemoryLimit { bytes: 0, ..MemoryLimit::default() });
        let d = put(&s, b"small blob");
        assert_eq!(bytes_of(s.open_stored(&d).unwrap()).unwrap(), b"small blob");
        assert_eq!(s.memory_usage(), (0, 0));
        fs::write(s.object_path(&d), b"rotten bits").unwrap();
        assert!(s.open_stored(&d).unwrap().is_none(), "a small object that fails its digest is never served");
        assert!(!s.object_path(&d).exists());
        let moved: Vec<_> = fs::read_dir(dir.path().join("quarantine")).unwrap().flatten().collect();
        assert_eq!(moved.len(), 1);
        assert!(moved[0].file_name().to_string_lossy().starts_with(&d.hex()));
        assert!(s.read_small(&d).unwrap().is_none());
    }

    #[test]
    fn should_leave_a_small_object_the_page_cache_lacks_to_the_file_path() {
        // On a disk file system (tmpfs has no RWF_NOWAIT and counts as cached).
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        // Written and dropped from the page cache on one CPU: pages still in another CPU's
        // LRU batch are not dropped (the kernel drains only the local one).
        let mut cpus = rustix::thread::sched_getaffinity(None).unwrap();
        let first = (0..rustix::thread::CpuSet::MAX_CPU).find(|&c| cpus.is_set(c)).unwrap();
        cpus = rustix::thread::CpuSet::new();
        cpus.set(first);
        rustix::thread::sched_setaffinity(None, &cpus).unwrap();
        let s = store(dir.path(), MemoryLimit::default());
        let d = put(&s, &[5u8; 20_000]);
        let f = fs::File::open(s.object_path(&d)).unwrap();
        // The kernel drops only clean pages, and not always at the first asking (writeback,
        // readahead): asked again until the object's pages are out, a bounded number of times.
        let mut out_of_cache = false;
        for _ in 0..100 {
            f.sync_all().unwrap();
            rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
            match s.open_stored(&d).unwrap().unwrap() {
                // Not read on the async threads: the file path reads it where blocking is allowed.
                Stored::File { len, .. } => {
                    assert_eq!(len, 20_000);
                    out_of_cache = true;
                    break;
                }
                // Its pages were still cached, so it was read and kept: forget it, try again.
                Stored::Memory(_) => s.memory.forget_object(&d),
            }
        }
        assert!(out_of_cache, "an object out of the page cache was read inline (or its pages never left)");
        assert_eq!(s.memory_usage().0, 0);
        // Once its pages are in, it is read, verified and kept.
        assert_eq!(fs::read(s.object_path(&d)).unwrap().len(), 20_000);
        assert_eq!(bytes_of(s.open_stored(&d).unwrap()).unwrap(), vec![5u8; 20_000]);
        assert_eq!(s.memory_usage().0, 1);
    }

    #[test]
    fn should_send_an_object_over_the_per_object_limit_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), MemoryLimit { bytes: 1 << 20, max_object: 16 });
        let d = put(&s, b"seventeen bytes!!");
        match s.open_stored(&d).unwrap().unwrap() {
            Stored::File { len, .. } => assert_eq!(len, 17),
            Stored::Memory(_) => panic!("an object over memoryObjectMax came from memory"),
        }
        assert_eq!(s.memory_usage(), (0, 0));
        assert_eq!(s.read_small(&d).unwrap().unwrap().as_ref(), b"seventeen bytes!!");
    }

    #[test]
    fn should_keep_the_objects_in_memory_within_their_budget() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), MemoryLimit { bytes: 64 << 10, max_object: 4096 });
        let digests: Vec<_> = (0..200u32).map(|i| put(&s, &vec![i as u8; 2000 + i as usize])).collect();
        for (i, d) in digests.iter().enumerate() {
            // An object whose pages the kernel would not hand over without blocking (writeback,
            // a busy CI disk) comes as its file: what matters here is what memory keeps.
            let bytes = match s.open_stored(d).unwrap().unwrap() {
                Stored::Memory(b) => b.to_vec(),
                Stored::File { mut file, .. } => {
                    let mut v = Vec::new();
                    std::io::Read::read_to_end(&mut file, &mut v).unwrap();
                    v
                }
            };
            assert_eq!(bytes, vec![i as u8; 2000 + i]);
        }
        let (n, bytes) = s.memory_usage();
        assert!(bytes <= 64 << 10, "{bytes} bytes in memory over a budget of 64 KiB");
        assert!(n > 0 && n < 200, "{n} objects kept");
    }

    #[test]
    fn should_write_tag_and_manifest_records_through_to_memory() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), MemoryLimit::default());
        let rec = |d: Digest| TagRecord {
            upstream: "up".into(),
            repository: "r".into(),
            tag: "v1".into(),
            digest: d,
            media_type: "m".into(),
            size: 1,
            fetched_at: 5,
            imported: false,
        };
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        s.tag_put(&rec(a)).unwrap();
        assert_eq!(s.tag_get("up", "r", "v1").unwrap().unwrap().digest, a);
        s.tag_put(&rec(b)).unwrap();
        assert_eq!(s.tag_get("up", "r", "v1").unwrap().unwrap().digest, b);
        assert!(s.tag_remove("up", "r", "v1").unwrap());
        assert!(s.tag_get("up", "r", "v1").unwrap().is_none());
        assert!(s.tag_get("up", "r", "v2").unwrap().is_none());
        let meta = crate::ManifestMeta { media_type: "x".into(), size: 3 };
        s.meta_put(&a, &meta).unwrap();
        assert_eq!(s.meta_get(&a).unwrap().unwrap(), meta);
        s.meta_put(&a, &crate::ManifestMeta { media_type: "y".into(), size: 3 }).unwrap();
        assert_eq!(s.meta_get(&a).unwrap().unwrap().media_type, "y");
    }
}
