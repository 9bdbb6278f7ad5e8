//! The index of an object in the bucket: its size and the sha256 of each chunk.

use std::ops::Range;

use serde::{Deserialize, Serialize};

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
        }
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
        let start = i as u64 * self.chunk_size;
        start..(start + self.chunk_size).min(self.size)
    }

    /// A record another replica (or a person) wrote must still describe a readable object.
    pub fn validate(&self) -> Result<(), String> {
        if self.format != 1 {
            return Err(format!("index format {} is not 1; a newer tender wrote it", self.format));
        }
        if self.chunk_size == 0 {
            return Err("chunk size is 0".into());
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
        Ok(())
    }
}
