//! Content digests: `sha256:<64 lowercase hex>` and `sha512:<128 lowercase hex>`, the two
//! algorithms OCI registries use and tender verifies. Any other algorithm is refused.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha512};

/// A digest algorithm tender verifies and stores (each in its own tree, named by [`Algorithm::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    Sha256,
    Sha512,
}

impl Algorithm {
    /// Every algorithm, in the order stores are walked.
    pub const ALL: [Algorithm; 2] = [Algorithm::Sha256, Algorithm::Sha512];

    /// The name in a digest string and in store paths (`sha256`, `sha512`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
        }
    }

    /// Length of a digest in bytes.
    pub fn byte_len(self) -> usize {
        match self {
            Algorithm::Sha256 => 32,
            Algorithm::Sha512 => 64,
        }
    }

    /// Length of a digest in hex characters.
    pub fn hex_len(self) -> usize {
        self.byte_len() * 2
    }

    /// An incremental hasher of this algorithm.
    pub fn hasher(self) -> Hasher {
        Hasher::new(self)
    }

    /// The digest of `bytes` with this algorithm.
    pub fn digest(self, bytes: &[u8]) -> Digest {
        let mut h = self.hasher();
        h.update(bytes);
        h.finalize()
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| DigestError::UnsupportedAlgorithm(s.to_string()))
    }
}

/// A validated content digest. The bytes past the algorithm's length are always zero, so the
/// derived comparisons are those of (algorithm, digest).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    algorithm: Algorithm,
    bytes: [u8; 64],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("digest {0:?} has no algorithm prefix (expected sha256:<64 hex> or sha512:<128 hex>)")]
    NoAlgorithm(String),
    #[error("digest algorithm {0:?} is not supported (tender verifies sha256 and sha512)")]
    UnsupportedAlgorithm(String),
    #[error("digest {hex:?} is not {} lowercase hex characters after {algorithm}:", algorithm.hex_len())]
    BadHex { algorithm: Algorithm, hex: String },
}

impl Digest {
    /// The sha256 of `bytes` (the algorithm of tags, trust records and anything tender names).
    pub fn of(bytes: &[u8]) -> Digest {
        Algorithm::Sha256.digest(bytes)
    }

    /// A digest from its raw bytes; `None` unless there are exactly as many as `algorithm` makes.
    pub fn from_bytes(algorithm: Algorithm, raw: &[u8]) -> Option<Digest> {
        if raw.len() != algorithm.byte_len() {
            return None;
        }
        let mut bytes = [0u8; 64];
        bytes[..raw.len()].copy_from_slice(raw);
        Some(Digest { algorithm, bytes })
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The raw digest (32 or 64 bytes).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.algorithm.byte_len()]
    }

    /// The hex characters without the algorithm.
    pub fn hex(&self) -> String {
        self.hex_in(&mut [0u8; 128]).to_string()
    }

    /// The hex characters without the algorithm, written into `buf` (no allocation).
    pub fn hex_in<'a>(&self, buf: &'a mut [u8; 128]) -> &'a str {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let raw = self.as_bytes();
        for (pair, b) in buf.chunks_exact_mut(2).zip(raw) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0x0f)];
        }
        // Only ASCII hex digits were written.
        std::str::from_utf8(&buf[..raw.len() * 2]).unwrap_or_default()
    }

    /// Parse the lowercase hex of an `algorithm` digest (no prefix), as store paths hold it.
    pub fn from_hex(algorithm: Algorithm, hex_str: &str) -> Result<Digest, DigestError> {
        let bad = || DigestError::BadHex { algorithm, hex: hex_str.to_string() };
        if hex_str.len() != algorithm.hex_len()
            || !hex_str.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad());
        }
        // Checked above: only `0-9a-f`, two for each byte.
        let nibble = |c: u8| if c <= b'9' { c - b'0' } else { c - b'a' + 10 };
        let mut bytes = [0u8; 64];
        for (b, pair) in bytes.iter_mut().zip(hex_str.as_bytes().chunks_exact(2)) {
            *b = (nibble(pair[0]) << 4) | nibble(pair[1]);
        }
        Ok(Digest { algorithm, bytes })
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((alg, hex_str)) = s.split_once(':') else {
            return Err(DigestError::NoAlgorithm(s.to_string()));
        };
        Digest::from_hex(alg.parse()?, hex_str)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.algorithm.name())?;
        f.write_str(":")?;
        f.write_str(self.hex_in(&mut [0u8; 128]))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Hashes bytes as they come with one algorithm: what a fill, a spool file or a re-check
/// computes to compare with the digest asked for.
#[derive(Debug, Clone)]
pub struct Hasher(Inner);

#[derive(Debug, Clone)]
enum Inner {
    Sha256(crate::chain::Chain),
    Sha512(Sha512),
}

impl Hasher {
    pub fn new(algorithm: Algorithm) -> Hasher {
        Hasher(match algorithm {
            Algorithm::Sha256 => Inner::Sha256(crate::chain::Chain::new()),
            Algorithm::Sha512 => Inner::Sha512(Sha512::new()),
        })
    }

    pub fn algorithm(&self) -> Algorithm {
        match self.0 {
            Inner::Sha256(_) => Algorithm::Sha256,
            Inner::Sha512(_) => Algorithm::Sha512,
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match &mut self.0 {
            Inner::Sha256(h) => h.update(bytes),
            Inner::Sha512(h) => h.update(bytes),
        }
    }

    /// A sha256 hasher's chain state ([`crate::chain`]), when what it hashed ends on a block
    /// boundary.
    pub fn chain_state(&self) -> Option<crate::chain::State> {
        match &self.0 {
            Inner::Sha256(h) => h.state(),
            Inner::Sha512(_) => None,
        }
    }

    /// The digest of everything hashed.
    pub fn finalize(self) -> Digest {
        let mut bytes = [0u8; 64];
        let algorithm = self.algorithm();
        match self.0 {
            Inner::Sha256(h) => bytes[..32].copy_from_slice(&h.finalize()),
            Inner::Sha512(h) => bytes.copy_from_slice(&h.finalize()),
        }
        Digest { algorithm, bytes }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn should_round_trip_known_digests() {
        let d = Digest::of(b"");
        assert_eq!(d.to_string(), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        let d = Algorithm::Sha512.digest(b"");
        assert_eq!(
            d.to_string(),
            "sha512:cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce\
             47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e"
        );
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        assert_eq!((d.algorithm(), d.as_bytes().len(), d.hex().len()), (Algorithm::Sha512, 64, 128));
    }

    #[test]
    fn should_hash_incrementally_like_at_once() {
        for alg in Algorithm::ALL {
            let mut h = alg.hasher();
            h.update(b"hello ");
            let partial = h.clone().finalize();
            h.update(b"world");
            assert_eq!(h.finalize(), alg.digest(b"hello world"));
            assert_eq!(partial, alg.digest(b"hello "));
        }
    }

    #[test]
    fn should_never_equal_across_algorithms() {
        let a = Digest::from_bytes(Algorithm::Sha256, &[0; 32]).unwrap();
        let b = Digest::from_bytes(Algorithm::Sha512, &[0; 64]).unwrap();
        assert_ne!(a, b);
        assert!(Digest::from_bytes(Algorithm::Sha512, &[0; 32]).is_none());
    }

    #[test]
    fn should_refuse_malformed_digests() {
        let z64 = "0".repeat(64);
        let z128 = "0".repeat(128);
        for bad in [
            "".to_string(),
            "sha256".into(),
            "sha256:".into(),
            "sha512:abcd".into(),
            "md5:d41d8cd98f00b204e9800998ecf8427e".into(),
            format!("blake3:{z64}"),
            format!("SHA256:{z64}"),
            format!("sha512:{z64}"),
            format!("sha256:{z128}"),
            format!("sha512:{}", "A".repeat(128)),
            format!("sha512:{z128}0"),
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855".into(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85".into(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855a".into(),
            "sha256:../../../../etc/passwd00000000000000000000000000000000000000000".into(),
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad:?} must be refused");
        }
        let e = format!("blake3:{z64}").parse::<Digest>().unwrap_err().to_string();
        assert!(e.contains("\"blake3\" is not supported") && e.contains("sha256 and sha512"), "{e}");
        let e = format!("sha512:{z64}").parse::<Digest>().unwrap_err().to_string();
        assert!(e.contains("not 128 lowercase hex characters after sha512:"), "{e}");
    }

    proptest! {
        #[test]
        fn should_parse_only_what_it_prints(s in "\\PC{0,140}") {
            if let Ok(d) = s.parse::<Digest>() {
                prop_assert_eq!(d.to_string(), s);
            }
        }

        #[test]
        fn should_accept_every_lowercase_hex(bytes in proptest::array::uniform32(any::<u8>())) {
            let d = Digest::from_bytes(Algorithm::Sha256, &bytes).unwrap();
            prop_assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        }

        #[test]
        fn should_accept_every_lowercase_sha512_hex(bytes in proptest::collection::vec(any::<u8>(), 64)) {
            let d = Digest::from_bytes(Algorithm::Sha512, &bytes).unwrap();
            prop_assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
            prop_assert_eq!(Digest::from_hex(Algorithm::Sha512, &d.hex()).unwrap(), d);
            prop_assert_eq!(d.as_bytes(), &bytes[..]);
        }
    }
}
