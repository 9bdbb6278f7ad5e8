//! Chunks checked as links of the object's own sha256 (index format 3, bucket format 4).
//!
//! SHA-256 compresses 64-byte blocks into a running state ([`tender_oci::chain`]). An upload in
//! chain form lists, for each chunk, the state after it (for the last chunk: the object's
//! sha256), and for each piece boundary inside a chunk the state there. A chunk is checked by
//! compressing its bytes from the state before it (the previous chunk's entry, or SHA-256's
//! initial state for the first) and comparing where it ends. So:
//!
//! - one pass of sha256 per byte both writes the index (the fill's own hashing of the object
//!   gives the states) and checks a copy (the states a copy reaches are the object's own);
//! - a copy from the first byte to the last whose every chunk matched has computed the
//!   object's sha256 itself: the last chunk ends in the digest asked for, whoever wrote the
//!   index. Nothing read from the bucket is trusted for a whole copy, with or without
//!   `storage.s3.indexKeyFile`;
//! - a piece read alone starts from a state the index gives: it is checked against the
//!   index, as a sub-chunk hash of format 2 is (the trust model in SECURITY.md).

/// The state a chain entry names (64 hex characters).
pub use tender_oci::chain::parse_state as state_of;
use tender_oci::chain::state_hex;
/// SHA-256's initial state: where the first chunk starts.
pub use tender_oci::chain::IV as START;
pub use tender_oci::chain::{Chain, State};
use tender_oci::Digest;

/// How a chunk is checked: against its sha256 (index format 2, or a record of such an upload),
/// or as a link of the object's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkCheck {
    Sha256(String),
    Chain(Link),
}

/// Chunk `i` as a link of the chain: where it starts and ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The state before the chunk, at byte `at` of the object.
    pub start: State,
    pub at: u64,
    /// The chunk is the object's last: it ends in the object's sha256 (`end`, hex).
    pub last: bool,
    /// The state after the chunk (hex), or the object's sha256 for the last.
    pub end: String,
    /// The size of the pieces whose boundaries `interior` lists.
    pub piece: u64,
    /// The states at the piece boundaries inside the chunk, when the index lists them (a
    /// progress record does not: followers read whole chunks).
    pub interior: Option<Vec<String>>,
}

/// What a chunk's bytes hash to as a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashed {
    /// The entry for the chunk: the state after it (hex), or the object's sha256 for the last.
    pub end: String,
    /// The state after it (none for the last chunk).
    pub end_state: Option<State>,
    /// The states at the piece boundaries inside the chunk (hex).
    pub interior: Vec<String>,
}

/// Hash a chunk from `start` (the state at byte `at`; a multiple of 64), in pieces of `piece`
/// bytes (a multiple of 64): the state at every piece boundary inside it, and where it ends.
pub fn hash_link(start: State, at: u64, bytes: &[u8], piece: u64, last: bool) -> Option<Hashed> {
    let step = usize::try_from(piece).ok().filter(|p| *p > 0 && p.is_multiple_of(64))?;
    let mut c = Chain::resume(start, at)?;
    let mut interior = Vec::new();
    let pieces = bytes.len().div_ceil(step).max(1);
    for (k, p) in bytes.chunks(step).enumerate() {
        c.update(p);
        if k + 1 < pieces {
            interior.push(state_hex(&c.state()?));
        }
    }
    if last {
        return Some(Hashed { end: hex::encode(c.finalize()), end_state: None, interior });
    }
    let s = c.state()?;
    Some(Hashed { end: state_hex(&s), end_state: Some(s), interior })
}

/// Check a chunk's bytes as the link `l`: `Ok(state after it)` (none for the last), or why not.
pub fn check_link(l: &Link, bytes: &[u8]) -> Result<Option<State>, String> {
    let Some(h) = hash_link(l.start, l.at, bytes, l.piece, l.last) else {
        return Err(format!("a chunk of {} bytes at {} does not end on a block boundary", bytes.len(), l.at));
    };
    if h.end != l.end {
        return Err(format!("hashes to {} where its record says {}", h.end, l.end));
    }
    if let Some(want) = &l.interior {
        if let Some(k) = h.interior.iter().zip(want).position(|(g, w)| g != w) {
            return Err(format!("piece {k} ends in state {} where its index says {}", h.interior[k], want[k]));
        }
        if h.interior.len() != want.len() {
            return Err(format!("{} piece states where its index lists {}", h.interior.len(), want.len()));
        }
    }
    Ok(h.end_state)
}

/// Check consecutive pieces read alone: `bytes` starts at byte `at` of the object from state
/// `start` and ends at a piece boundary listed in `ends` (hex, one per piece boundary the
/// bytes cross, in order), or, with `last` (the object's sha256 asked for), at the object's end.
pub fn check_pieces(
    start: State,
    at: u64,
    bytes: &[u8],
    piece: u64,
    ends: &[String],
    last: Option<&Digest>,
) -> Result<(), String> {
    let step = usize::try_from(piece).ok().filter(|p| *p > 0 && p.is_multiple_of(64)).ok_or("bad piece size")?;
    let mut c = Chain::resume(start, at).ok_or("a piece that does not start on a block boundary")?;
    let pieces = bytes.len().div_ceil(step).max(1);
    for (k, p) in bytes.chunks(step).enumerate() {
        c.update(p);
        if k + 1 == pieces {
            if let Some(d) = last {
                let got = hex::encode(c.clone().finalize());
                return if got == d.hex() {
                    Ok(())
                } else {
                    Err(format!("the object's last piece ends in {got}, not {}", d.hex()))
                };
            }
        }
        let got = c.state().map(|s| state_hex(&s)).ok_or("a piece that does not end on a block boundary")?;
        match ends.get(k) {
            Some(want) if *want == got => {}
            Some(want) => return Err(format!("piece {k} ends in state {got} where its index says {want}")),
            None => return Err(format!("piece {k} has no state in its index")),
        }
    }
    Ok(())
}

/// What the caller already hashed of a chunk it hands to `PartUpload::put_chunk_with` (the
/// fill's spool hashes the object as it writes it): the hash state at every piece boundary in
/// the chunk, its end included unless it is the object's end, and for the object's last chunk
/// the object's digest.
#[derive(Debug, Clone, Default)]
pub struct Known {
    pub states: Vec<tender_oci::chain::State>,
    pub digest: Option<Digest>,
}

/// Hash the next chunk of an object of `total` bytes into `c` (the object's hash so far, at
/// a chunk boundary), noting the state at every piece boundary but the object's end: what
/// `PartUpload::put_chunk_with` takes, and the chunk's entry (the state after it, or
/// the object's sha256 at its end).
pub fn hash_known(c: &mut Chain, bytes: &[u8], piece: u64, total: u64) -> (Known, String) {
    let step = usize::try_from(piece).unwrap_or(usize::MAX).max(1);
    let mut states = Vec::with_capacity(bytes.len().div_ceil(step));
    for p in bytes.chunks(step) {
        c.update(p);
        if c.len() < total && c.len().is_multiple_of(piece) {
            if let Some(s) = c.state() {
                states.push(s);
            }
        }
    }
    if c.len() >= total {
        let Some(d) = Digest::from_bytes(tender_oci::Algorithm::Sha256, &c.clone().finalize()) else {
            return (Known { states, digest: None }, String::new());
        };
        let entry = d.hex();
        return (Known { states, digest: Some(d) }, entry);
    }
    let entry = c.state().map(|s| state_hex(&s)).unwrap_or_default();
    (Known { states, digest: None }, entry)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn object(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn should_link_chunks_into_the_objects_own_sha256() {
        let data = object(10 * 1024 + 100);
        let d = Digest::of(&data);
        let (cs, piece) = (4096usize, 1024u64);
        let mut start = START;
        let mut entries = Vec::new();
        for (i, c) in data.chunks(cs).enumerate() {
            let last = (i + 1) * cs >= data.len();
            let h = hash_link(start, (i * cs) as u64, c, piece, last).unwrap();
            assert_eq!(h.interior.len(), c.len().div_ceil(1024) - 1);
            let l = Link {
                start,
                at: (i * cs) as u64,
                last,
                end: h.end.clone(),
                piece,
                interior: Some(h.interior.clone()),
            };
            assert_eq!(check_link(&l, c).unwrap(), h.end_state);
            let mut bad = c.to_vec();
            bad[c.len() / 2] ^= 1;
            assert!(check_link(&l, &bad).is_err(), "a flipped byte in chunk {i}");
            if let Some(s) = h.end_state {
                start = s;
            }
            entries.push(h);
        }
        assert_eq!(entries.last().unwrap().end, d.hex(), "the last chunk ends in the object's sha256");
        // A piece read alone, from the state the index gives.
        let p1 = &data[4096 + 1024..4096 + 2048];
        let s = state_of(&entries[1].interior[0]).unwrap();
        check_pieces(s, 5120, p1, piece, &entries[1].interior[1..2], None).unwrap();
        assert!(check_pieces(s, 5120, &data[0..1024], piece, &entries[1].interior[1..2], None).is_err());
        let tail = &data[8192 + 1024..];
        let s = state_of(&entries[2].interior[0]).unwrap();
        let ends = &entries[2].interior[1..];
        check_pieces(s, 9216, tail, piece, ends, Some(&d)).unwrap();
        assert!(check_pieces(s, 9216, tail, piece, ends, Some(&Digest::of(b"other"))).is_err());
        assert!(check_pieces(s, 9216, &tail[..1024], piece, &[], None).is_err(), "no state to end in");
    }

    #[test]
    fn should_hash_an_empty_object_to_its_digest() {
        let h = hash_link(START, 0, b"", 1024, true).unwrap();
        assert_eq!(h.end, Digest::of(b"").hex());
        assert!(h.interior.is_empty());
        assert!(hash_link(START, 0, b"", 1000, true).is_none(), "pieces are whole blocks");
        assert!(hash_link(START, 3, b"", 1024, true).is_none(), "a link starts on a block boundary");
    }
}
