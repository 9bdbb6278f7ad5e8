//! SHA-256 as a chain of compression states: the state after every whole 64-byte block is the
//! hash so far, and anyone who holds the state at an offset can go on from there. A shared
//! bucket's index records the state at every piece boundary of an object, so a piece read
//! alone is checked from the state before it to the state after it, and an object read from
//! its first byte is hashed once, piece by piece, into its own digest.

use sha2::digest::generic_array::{typenum::U64, GenericArray};

/// The compression state: eight big-endian words.
pub type State = [u32; 8];

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
pub const IV: State =
    [0x6a09_e667, 0xbb67_ae85, 0x3c6e_f372, 0xa54f_f53a, 0x510e_527f, 0x9b05_688c, 0x1f83_d9ab, 0x5be0_cd19];

/// Blocks compressed per call (copied into an array of blocks first: 4 KiB, in cache).
const BATCH: usize = 64;

/// SHA-256 of bytes as they come, whose state can be read at any block boundary and resumed
/// from.
#[derive(Debug, Clone)]
pub struct Chain {
    state: State,
    /// Bytes compressed into `state` (a multiple of 64).
    done: u64,
    buf: [u8; 64],
    buffered: usize,
}

impl Default for Chain {
    fn default() -> Chain {
        Chain::new()
    }
}

impl Chain {
    pub fn new() -> Chain {
        Chain { state: IV, done: 0, buf: [0; 64], buffered: 0 }
    }

    /// Go on from `state`, the state after the first `len` bytes of a message (`len` a
    /// multiple of 64; `None` otherwise).
    pub fn resume(state: State, len: u64) -> Option<Chain> {
        len.is_multiple_of(64).then_some(Chain { state, done: len, buf: [0; 64], buffered: 0 })
    }

    /// Bytes hashed so far.
    pub fn len(&self) -> u64 {
        self.done.saturating_add(self.buffered as u64)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The state, when the bytes hashed so far end on a block boundary.
    pub fn state(&self) -> Option<State> {
        (self.buffered == 0).then_some(self.state)
    }

    pub fn update(&mut self, mut data: &[u8]) {
        if self.buffered > 0 {
            let n = (64 - self.buffered).min(data.len());
            self.buf[self.buffered..self.buffered + n].copy_from_slice(&data[..n]);
            self.buffered += n;
            data = &data[n..];
            if self.buffered < 64 {
                return;
            }
            let block = self.buf;
            compress(&mut self.state, &block);
            self.done = self.done.saturating_add(64);
            self.buffered = 0;
        }
        let whole = data.len() - data.len() % 64;
        compress(&mut self.state, &data[..whole]);
        self.done = self.done.saturating_add(whole as u64);
        let rest = &data[whole..];
        self.buf[..rest.len()].copy_from_slice(rest);
        self.buffered = rest.len();
    }

    /// The hash of everything hashed (padding with the message's length, FIPS 180-4, 5.1.1).
    pub fn finalize(mut self) -> [u8; 32] {
        let bits = self.len().wrapping_mul(8);
        let mut tail = [0u8; 128];
        tail[..self.buffered].copy_from_slice(&self.buf[..self.buffered]);
        tail[self.buffered] = 0x80;
        let n = if self.buffered < 56 { 64 } else { 128 };
        tail[n - 8..n].copy_from_slice(&bits.to_be_bytes());
        compress(&mut self.state, &tail[..n]);
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        out
    }
}

/// Compress whole blocks (`data.len()` a multiple of 64) into `state`.
fn compress(state: &mut State, data: &[u8]) {
    let mut blocks = [GenericArray::<u8, U64>::default(); BATCH];
    for batch in data.chunks(64 * BATCH) {
        let n = batch.len() / 64;
        for (b, src) in blocks.iter_mut().zip(batch.chunks_exact(64)) {
            b.copy_from_slice(src);
        }
        sha2::compress256(state, &blocks[..n]);
    }
}

/// A state as 64 lowercase hex characters (its words big-endian, as the hash prints them).
pub fn state_hex(s: &State) -> String {
    let mut out = String::with_capacity(64);
    for w in s {
        out.push_str(&format!("{w:08x}"));
    }
    out
}

/// A state from 64 hex characters (`None` when it is not that).
pub fn parse_state(h: &str) -> Option<State> {
    if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut s = [0u32; 8];
    for (i, w) in s.iter_mut().enumerate() {
        *w = u32::from_str_radix(h.get(i * 8..i * 8 + 8)?, 16).ok()?;
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;
    use sha2::{Digest as _, Sha256};

    #[test]
    fn should_hash_like_sha256_at_the_padding_edges() {
        for n in [0usize, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 4095, 4096, 64 * BATCH + 1, 300_000] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
            let mut c = Chain::new();
            c.update(&data);
            assert_eq!(c.finalize(), <[u8; 32]>::from(Sha256::digest(&data)), "{n} bytes");
        }
    }

    #[test]
    fn should_resume_from_a_recorded_state() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        let mut c = Chain::new();
        c.update(&data[..4096]);
        let s = c.state().unwrap();
        assert_eq!(parse_state(&state_hex(&s)), Some(s));
        let mut r = Chain::resume(s, 4096).unwrap();
        r.update(&data[4096..]);
        assert_eq!(r.finalize(), <[u8; 32]>::from(Sha256::digest(&data)));
        assert!(Chain::resume(s, 4095).is_none(), "a state lies on a block boundary");
        c.update(b"x");
        assert!(c.state().is_none(), "no state inside a block");
        assert_eq!(parse_state(&"0".repeat(63)), None);
        assert_eq!(parse_state(&"g".repeat(64)), None);
        assert_eq!(state_hex(&IV), "6a09e667bb67ae853c6ef372a54ff53a510e527f9b05688c1f83d9ab5be0cd19");
    }

    proptest! {
        #[test]
        fn should_hash_any_split_like_at_once(data in proptest::collection::vec(any::<u8>(), 0..3000), cuts in proptest::collection::vec(0usize..3000, 0..6)) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(data.len())).collect();
            cuts.sort_unstable();
            let mut c = Chain::new();
            let mut at = 0;
            for cut in cuts {
                c.update(&data[at..cut]);
                at = cut;
            }
            c.update(&data[at..]);
            prop_assert_eq!(c.len(), data.len() as u64);
            prop_assert_eq!(c.finalize(), <[u8; 32]>::from(Sha256::digest(&data)));
        }
    }
}
