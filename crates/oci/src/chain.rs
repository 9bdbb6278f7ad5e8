//! SHA-256 as a chain of compression states: the state after every whole 64-byte block is the
//! hash so far, and anyone who holds the state at an offset can go on from there. A shared
//! bucket's index records the state at every piece boundary of an object, so a piece read
//! alone is checked from the state before it to the state after it, and an object read from
//! its first byte is hashed once, piece by piece, into its own digest.

use sha2::digest::block_buffer::{BlockBuffer, Eager};
use sha2::digest::generic_array::typenum::U64;

/// The compression state: eight big-endian words.
pub type State = [u32; 8];

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
pub const IV: State =
    [0x6a09_e667, 0xbb67_ae85, 0x3c6e_f372, 0xa54f_f53a, 0x510e_527f, 0x9b05_688c, 0x1f83_d9ab, 0x5be0_cd19];

/// SHA-256 of bytes as they come, whose state can be read at any block boundary and resumed
/// from. As fast as `sha2::Sha256`: whole blocks are compressed straight from the input
/// (the block buffer sha2 itself uses), only a partial block is copied.
#[derive(Debug, Clone)]
pub struct Chain {
    state: State,
    /// Bytes compressed into `state` (a multiple of 64).
    done: u64,
    buf: BlockBuffer<U64, Eager>,
}

impl Default for Chain {
    fn default() -> Chain {
        Chain::new()
    }
}

impl Chain {
    pub fn new() -> Chain {
        Chain { state: IV, done: 0, buf: BlockBuffer::default() }
    }

    /// Go on from `state`, the state after the first `len` bytes of a message (`len` a
    /// multiple of 64; `None` otherwise).
    pub fn resume(state: State, len: u64) -> Option<Chain> {
        len.is_multiple_of(64).then_some(Chain { state, done: len, buf: BlockBuffer::default() })
    }

    /// Bytes hashed so far.
    pub fn len(&self) -> u64 {
        self.done.saturating_add(self.buf.get_pos() as u64)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The state, when the bytes hashed so far end on a block boundary.
    pub fn state(&self) -> Option<State> {
        (self.buf.get_pos() == 0).then_some(self.state)
    }

    pub fn update(&mut self, data: &[u8]) {
        let (state, done) = (&mut self.state, &mut self.done);
        self.buf.digest_blocks(data, |blocks| {
            sha2::compress256(state, blocks);
            *done = done.saturating_add(64 * blocks.len() as u64);
        });
    }

    /// The hash of everything hashed (padding with the message's length, FIPS 180-4, 5.1.1).
    pub fn finalize(mut self) -> [u8; 32] {
        let bits = self.len().wrapping_mul(8);
        let state = &mut self.state;
        self.buf.len64_padding_be(bits, |b| sha2::compress256(state, std::slice::from_ref(b)));
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        out
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
        for n in [0usize, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 4095, 4096, 4097, 300_000] {
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
