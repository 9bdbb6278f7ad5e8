//! The index of an object in the bucket: its size, the sha256 of each chunk and, when the
//! chunk size is a multiple of the sub-chunk size, the sha256 of each sub-chunk (so a range
//! reads and verifies only the sub-chunks it needs).
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
    /// Lowercase hex sha256 of each chunk, in order; the last may be shorter.
    pub chunks: Vec<String>,
    /// The replica that uploaded it, and when (seconds since the Unix epoch).
    pub uploaded_by: String,
    pub uploaded_at: u64,
    /// A manifest's media type (absent for blobs and assets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// Format 2: the content is one object per chunk, `parts/<upload>/<i>`, written by the
    /// upload this names (format 1: one object, `objects/<alg>/<hex>`, read by ranges).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<String>,
    /// Format 2 only, optional (older tenders neither write nor read it, so the index format
    /// stays 2): the size of the sub-chunks `sub_chunks` hashes, a divisor of `chunk_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_chunk_size: Option<u64>,
    /// For each chunk, the lowercase hex sha256 of each of its sub-chunks of `sub_chunk_size`
    /// bytes, in order (the last may be shorter; an empty chunk has one, empty).
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
        match (self.sub_chunk_size, &self.upload) {
            (Some(s), Some(_)) => self.sub_chunks.get(i).map(|h| (s, h.as_slice())),
            _ => None,
        }
    }

    /// A record another replica (or a person) wrote must still describe a readable object.
    pub fn validate(&self) -> Result<(), String> {
        match (self.format, &self.upload) {
            (1, None) => {}
            (2, Some(u)) if is_upload_id(u) => {}
            (2, Some(u)) => return Err(format!("upload id {u:?} is not 32 hex characters")),
            (1 | 2, _) => return Err(format!("index format {} with upload {:?}", self.format, self.upload)),
            (f, _) => return Err(format!("index format {f} is newer than 2; a newer tender wrote it")),
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
        self.validate_sub_chunks()
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
