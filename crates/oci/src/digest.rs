//! `sha256:<64 lowercase hex>` digests, the only algorithm tender stores.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// A validated sha256 content digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("digest {0:?} has no algorithm prefix (expected sha256:<64 hex>)")]
    NoAlgorithm(String),
    #[error("digest algorithm {0:?} is not supported (tender stores sha256 only)")]
    UnsupportedAlgorithm(String),
    #[error("digest {0:?} is not 64 lowercase hex characters after sha256:")]
    BadHex(String),
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    pub fn from_bytes(bytes: [u8; 32]) -> Digest {
        Digest(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 hex characters without the algorithm.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parse 64 lowercase hex characters (no algorithm prefix).
    pub fn from_hex(hex_str: &str) -> Result<Digest, DigestError> {
        if hex_str.len() != 64 || !hex_str.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(DigestError::BadHex(hex_str.to_string()));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_str, &mut out).map_err(|_| DigestError::BadHex(hex_str.to_string()))?;
        Ok(Digest(out))
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((alg, hex_str)) = s.split_once(':') else {
            return Err(DigestError::NoAlgorithm(s.to_string()));
        };
        if alg != "sha256" {
            return Err(DigestError::UnsupportedAlgorithm(alg.to_string()));
        }
        Digest::from_hex(hex_str)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn should_round_trip_known_digest() {
        let d = Digest::of(b"");
        assert_eq!(d.to_string(), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
    }

    #[test]
    fn should_refuse_malformed_digests() {
        for bad in [
            "",
            "sha256",
            "sha256:",
            "sha512:abcd",
            "md5:d41d8cd98f00b204e9800998ecf8427e",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85",
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855a",
            "sha256:../../../../etc/passwd00000000000000000000000000000000000000000",
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad:?} must be refused");
        }
    }

    proptest! {
        #[test]
        fn should_parse_only_what_it_prints(s in "\\PC{0,80}") {
            if let Ok(d) = s.parse::<Digest>() {
                prop_assert_eq!(d.to_string(), s);
            }
        }

        #[test]
        fn should_accept_every_lowercase_hex(bytes in proptest::array::uniform32(any::<u8>())) {
            let d = Digest::from_bytes(bytes);
            prop_assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        }
    }
}
