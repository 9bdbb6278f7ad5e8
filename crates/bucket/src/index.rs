//! The index of an object in the bucket: its size, the sha256 of each chunk and, when the
//! chunk size is a multiple of the sub-chunk size, the sha256 of each sub-chunk (so a range
//! reads and verifies only the sub-chunks it needs).
//!
//! Format 3 (bucket format 4) lists the chunks as links of the object's own sha256 instead
//! ([`crate::chain`]): `chunks[i]` is the hash state after chunk `i` (the object's sha256 for
//! the last), `sub_chunks[i]` the states at the piece boundaries inside it, every
//! `sub_chunk_size` bytes. Checking a whole copy then computes the object's digest.
//!
//! With `storage.s3.indexKeyFile`, the replica that wrote an index signs it (`mac`, an
//! HMAC-SHA256 under the key the replicas share, over the digest the index is for and every
//! field that says which bytes are that digest's); a reader with the same key that finds the
//! signature good marks the index [`ChunkIndex::signed`], and then takes chunks verified
//! against it for the digest's bytes without hashing the whole object again.

use std::ops::Range;

use hmac::Mac;
use serde::{Deserialize, Serialize};
use tender_oci::Digest;

use crate::settings::IndexKey;

/// Written after an object's content; its presence makes the object visible to readers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChunkIndex {
    pub format: u32,
    pub size: u64,
    pub chunk_size: u64,
    /// Lowercase hex sha256 of each chunk, in order; the last may be shorter. Format 3: the
    /// hash state after each chunk, and the object's sha256 for the last.
    pub chunks: Vec<String>,
    /// The replica that uploaded it, and when (seconds since the Unix epoch).
    pub uploaded_by: String,
    pub uploaded_at: u64,
    /// A manifest's media type (absent for blobs and assets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// Formats 2 and 3: the content is one object per chunk, `parts/<upload>/<i>`, written by the
    /// upload this names (format 1: one object, `objects/<alg>/<hex>`, read by ranges).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<String>,
    /// Format 2 only, optional (older tenders neither write nor read it, so the index format
    /// stays 2): the size of the sub-chunks `sub_chunks` hashes, a divisor of `chunk_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_chunk_size: Option<u64>,
    /// For each chunk, the lowercase hex sha256 of each of its sub-chunks of `sub_chunk_size`
    /// bytes, in order (the last may be shorter; an empty chunk has one, empty). Format 3: the
    /// hash states at the piece boundaries inside each chunk (one fewer than its pieces).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sub_chunks: Vec<Vec<String>>,
    /// The writer's signature with the replicas' index key ([`ChunkIndex::sign`]), in hex;
    /// absent without a key (older tenders neither write nor read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Set by the reader, never stored: `mac` is good under this replica's key for the digest
    /// the index was read as, so chunks verified against it are that digest's bytes.
    #[serde(skip)]
    pub signed: bool,
}

impl ChunkIndex {
    pub fn new(size: u64, chunk_size: u64, chunks: Vec<String>, replica: &str) -> ChunkIndex {
        ChunkIndex {
            format: 1,
            size,
            chunk_size,
            chunks,
            uploaded_by: replica.to_string(),
            uploaded_at: tender_store::now_secs(),
            media_type: None,
            upload: None,
            sub_chunk_size: None,
            sub_chunks: Vec::new(),
            mac: None,
            signed: false,
        }
    }

    /// The signature of this index as the index of `d` under `key`, in hex.
    pub fn sign(&self, key: &IndexKey, d: &Digest) -> String {
        let mut m = key.mac();
        m.update(&self.signed_bytes(d));
        hex::encode(m.finalize().into_bytes())
    }

    /// Whether `mac` is a good signature of this index as the index of `d` under `key`
    /// (compared in constant time).
    pub fn verify(&self, key: &IndexKey, d: &Digest) -> bool {
        let Some(sig) = self.mac.as_deref().and_then(|m| hex::decode(m).ok()) else { return false };
        let mut m = key.mac();
        m.update(&self.signed_bytes(d));
        m.verify_slice(&sig).is_ok()
    }

    /// What the signature covers: the digest, then every field that says which bytes are the
    /// digest's (variable strings length-prefixed, so no two indexes give the same bytes).
    /// Who wrote it and when are not covered: they say nothing about the bytes.
    fn signed_bytes(&self, d: &Digest) -> Vec<u8> {
        let text = |s: Option<&str>| s.map_or_else(|| "-".to_string(), |s| format!("{}:{s}", s.len()));
        let mut out = format!(
            "tender-index-signature-1\n{d}\n{}\n{}\n{}\n{}\n{}\n{}\n",
            self.format,
            self.size,
            self.chunk_size,
            text(self.upload.as_deref()),
            text(self.media_type.as_deref()),
            self.sub_chunk_size.map_or_else(|| "-".to_string(), |s| s.to_string()),
        );
        for c in &self.chunks {
            out.push_str(c);
            out.push('\n');
        }
        for (i, subs) in self.sub_chunks.iter().enumerate() {
            out.push_str(&format!("{i}:"));
            out.push_str(&subs.join(","));
            out.push('\n');
        }
        out.into_bytes()
    }

    /// The index of content written as chunk objects by `upload` (format 2).
    pub fn of_parts(size: u64, chunk_size: u64, chunks: Vec<String>, replica: &str, upload: &str) -> ChunkIndex {
        ChunkIndex { format: 2, upload: Some(upload.to_string()), ..ChunkIndex::new(size, chunk_size, chunks, replica) }
    }

    /// The index of content written as chunk objects by `upload` in chain form (format 3):
    /// `ends[i]` the state after chunk `i` (the object's sha256 for the last), `interior[i]`
    /// the states at its piece boundaries, every `piece` bytes.
    pub fn of_chain(
        size: u64,
        chunk_size: u64,
        piece: u64,
        ends: Vec<String>,
        interior: Vec<Vec<String>>,
        replica: &str,
        upload: &str,
    ) -> ChunkIndex {
        ChunkIndex {
            format: 3,
            sub_chunk_size: Some(piece),
            sub_chunks: interior,
            ..ChunkIndex::of_parts(size, chunk_size, ends, replica, upload)
        }
    }

    /// Whether the chunks are links of the object's chain (format 3).
    pub fn is_chain(&self) -> bool {
        self.format == 3
    }

    /// How chunk `i` of the object `d` is checked. For the last chunk of a chain the end is
    /// `d` itself, not what the index says.
    pub fn check_of(&self, i: usize, d: &Digest) -> Option<crate::chain::ChunkCheck> {
        use crate::chain::{ChunkCheck, Link};
        if !self.is_chain() {
            return self.chunks.get(i).map(|c| ChunkCheck::Sha256(c.clone()));
        }
        let start = if i == 0 { crate::chain::START } else { crate::chain::state_of(self.chunks.get(i - 1)?)? };
        let last = i + 1 == self.chunks.len();
        Some(ChunkCheck::Chain(Link {
            start,
            at: self.chunk_range(i).start,
            last,
            end: if last { d.hex() } else { self.chunks.get(i)?.clone() },
            piece: self.sub_chunk_size?,
            interior: Some(self.sub_chunks.get(i)?.clone()),
        }))
    }

    /// Format 3: the states a range of pieces `a..b` of chunk `i` is checked with (the state
    /// before piece `a`, and the state after each piece up to `b`, the chunk's end included
    /// unless it is the object's last), and the piece size.
    pub fn piece_states(&self, i: usize, a: usize, b: usize) -> Option<(u64, crate::chain::State, Vec<String>)> {
        if !self.is_chain() || a >= b {
            return None;
        }
        let subs = self.sub_chunks.get(i)?;
        let start = match a {
            0 if i == 0 => crate::chain::START,
            0 => crate::chain::state_of(self.chunks.get(i - 1)?)?,
            a => crate::chain::state_of(subs.get(a - 1)?)?,
        };
        // Boundary k (after piece k): inside the chunk for k < subs.len(), its end after.
        let ends = (a..b).filter_map(|k| subs.get(k).or_else(|| (k == subs.len()).then(|| &self.chunks[i]))).cloned();
        Some((self.sub_chunk_size?, start, ends.collect()))
    }

    /// How many chunks an object of `size` has (an empty object has one, empty).
    pub fn chunk_count(size: u64, chunk_size: u64) -> usize {
        if size == 0 {
            1
        } else {
            size.div_ceil(chunk_size) as usize
        }
    }

    /// The byte range of chunk `i`.
    pub fn chunk_range(&self, i: usize) -> Range<u64> {
        let start = (i as u64).saturating_mul(self.chunk_size);
        start..start.saturating_add(self.chunk_size).min(self.size)
    }

    /// Record the sub-chunk hashes of every chunk (`subs[i]`: chunk `i`'s), or none when they
    /// do not describe the chunks (then ranges read whole chunks).
    pub fn with_sub_chunks(mut self, sub_chunk_size: u64, subs: Vec<Vec<String>>) -> ChunkIndex {
        self.sub_chunk_size = Some(sub_chunk_size);
        self.sub_chunks = subs;
        if let Err(m) = self.validate_sub_chunks() {
            debug_assert!(false, "sub-chunk hashes unlike the chunks: {m}");
            tracing::warn!(error = %m, "sub-chunk hashes left out of an index; ranges of it read whole chunks");
            self.sub_chunk_size = None;
            self.sub_chunks = Vec::new();
        }
        self
    }

    /// Chunk `i`'s sub-chunk size and hashes, when the index records them (format 2).
    pub fn sub_hashes(&self, i: usize) -> Option<(u64, &[String])> {
        if self.is_chain() {
            return None;
        }
        match (self.sub_chunk_size, &self.upload) {
            (Some(s), Some(_)) => self.sub_chunks.get(i).map(|h| (s, h.as_slice())),
            _ => None,
        }
    }

    /// A record another replica (or a person) wrote must still describe a readable object.
    pub fn validate(&self) -> Result<(), String> {
        match (self.format, &self.upload) {
            (1, None) => {}
            (2 | 3, Some(u)) if is_upload_id(u) => {}
            (2 | 3, Some(u)) => return Err(format!("upload id {u:?} is not 32 hex characters")),
            (1..=3, _) => return Err(format!("index format {} with upload {:?}", self.format, self.upload)),
            (f, _) => return Err(format!("index format {f} is newer than 3; a newer tender wrote it")),
        }
        if self.chunk_size == 0 || self.chunk_size > crate::MAX_CHUNK_SIZE {
            return Err(format!("chunk size {} is not within 1..={}", self.chunk_size, crate::MAX_CHUNK_SIZE));
        }
        let want = ChunkIndex::chunk_count(self.size, self.chunk_size);
        if self.chunks.len() != want {
            return Err(format!(
                "{} chunk digests for {} bytes in chunks of {}",
                self.chunks.len(),
                self.size,
                self.chunk_size
            ));
        }
        if let Some(bad) = self.chunks.iter().find(|c| c.len() != 64 || !c.bytes().all(|b| b.is_ascii_hexdigit())) {
            return Err(format!("chunk digest {bad:?} is not 64 hex characters"));
        }
        if self.is_chain() {
            return self.validate_chain();
        }
        self.validate_sub_chunks()
    }

    /// [`ChunkIndex::validate`], and the index is `d`'s: a chain ends in `d` (a chain copied
    /// under another digest would name another object's sha256).
    pub fn validate_for(&self, d: &Digest) -> Result<(), String> {
        self.validate()?;
        if self.is_chain() && self.chunks.last().is_none_or(|l| *l != d.hex()) {
            return Err(format!("the chain ends in {:?}, not in {d}", self.chunks.last()));
        }
        Ok(())
    }

    /// Format 3: the piece states describe the chunks (checked after the chunks).
    fn validate_chain(&self) -> Result<(), String> {
        let p = self.sub_chunk_size.unwrap_or(0);
        if p == 0 || !p.is_multiple_of(64) || p > self.chunk_size || !self.chunk_size.is_multiple_of(p) {
            return Err(format!("piece size {p} is not whole blocks dividing the chunk size {}", self.chunk_size));
        }
        if self.sub_chunks.len() != self.chunks.len() {
            return Err(format!("piece states for {} of {} chunks", self.sub_chunks.len(), self.chunks.len()));
        }
        for (i, subs) in self.sub_chunks.iter().enumerate() {
            let r = self.chunk_range(i);
            let want = ChunkIndex::chunk_count(r.end - r.start, p) - 1;
            if subs.len() != want {
                return Err(format!(
                    "{} piece states for chunk {i} of {} bytes in pieces of {p}",
                    subs.len(),
                    r.end - r.start
                ));
            }
            if let Some(bad) = subs.iter().find(|c| crate::chain::state_of(c).is_none()) {
                return Err(format!("piece state {bad:?} is not 64 hex characters"));
            }
        }
        Ok(())
    }

    /// The sub-chunk hashes, if any, must describe the chunks (checked after the chunks).
    fn validate_sub_chunks(&self) -> Result<(), String> {
        let Some(s) = self.sub_chunk_size else {
            if self.sub_chunks.is_empty() {
                return Ok(());
            }
            return Err("sub-chunk digests without a sub-chunk size".into());
        };
        if self.upload.is_none() {
            return Err("sub-chunk digests in an index of format 1".into());
        }
        if s == 0 || s >= self.chunk_size || !self.chunk_size.is_multiple_of(s) {
            return Err(format!("sub-chunk size {s} does not divide the chunk size {} into pieces", self.chunk_size));
        }
        if self.sub_chunks.len() != self.chunks.len() {
            return Err(format!("sub-chunk digests for {} of {} chunks", self.sub_chunks.len(), self.chunks.len()));
        }
        for (i, subs) in self.sub_chunks.iter().enumerate() {
            let r = self.chunk_range(i);
            let want = ChunkIndex::chunk_count(r.end - r.start, s);
            if subs.len() != want {
                return Err(format!(
                    "{} sub-chunk digests for chunk {i} of {} bytes in pieces of {s}",
                    subs.len(),
                    r.end - r.start
                ));
            }
            if let Some(bad) = subs.iter().find(|c| c.len() != 64 || !c.bytes().all(|b| b.is_ascii_hexdigit())) {
                return Err(format!("sub-chunk digest {bad:?} is not 64 hex characters"));
            }
        }
        Ok(())
    }
}

/// Whether `s` is an upload id as tender makes them: 32 lowercase hex characters (so it is a
/// safe object-name segment).
pub fn is_upload_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A fresh upload id.
pub fn new_upload_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}
