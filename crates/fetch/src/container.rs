//! Compression containers and their own integrity checks: xz (CRC32/CRC64/SHA-256 per block),
//! gzip (CRC32 and length per member), zstd (the optional content checksum, and frame
//! structure). Used to establish that an asset with no published checksum arrived whole.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    None,
    Xz,
    Gz,
    Zst,
}

impl Container {
    pub fn has_checksum(self) -> bool {
        !matches!(self, Container::None)
    }

    /// A reader of the decompressed content of `r`.
    pub fn decoder<'a, R: Read + 'a>(self, r: R) -> io::Result<Box<dyn Read + 'a>> {
        Ok(match self {
            Container::None => Box::new(r),
            Container::Xz => {
                Box::new(liblzma::read::XzDecoder::new_multi_decoder(BufReader::with_capacity(1 << 20, r)))
            }
            Container::Gz => Box::new(flate2::read::MultiGzDecoder::new(BufReader::with_capacity(1 << 20, r))),
            Container::Zst => Box::new(zstd::stream::read::Decoder::new(r)?),
        })
    }
}

/// Decode the whole file, which fails on any integrity error or truncation.
pub fn check(path: &Path, c: Container) -> io::Result<u64> {
    let mut d = c.decoder(File::open(path)?)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = d.read(&mut buf)?;
        if k == 0 {
            return Ok(n);
        }
        n += k as u64;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use std::io::Write;

    fn compress(c: Container, data: &[u8]) -> Vec<u8> {
        match c {
            Container::Xz => {
                let mut e = liblzma::write::XzEncoder::new(Vec::new(), 1);
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Container::Gz => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Container::Zst => {
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
                e.include_checksum(true).unwrap();
                e.write_all(data).unwrap();
                e.finish().unwrap()
            }
            Container::None => data.to_vec(),
        }
    }

    #[test]
    fn should_accept_whole_containers_and_refuse_damaged_or_truncated_ones() {
        let data: Vec<u8> = (0..200_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        let dir = tempfile::tempdir().unwrap();
        for c in [Container::Xz, Container::Gz, Container::Zst] {
            let good = compress(c, &data);
            let p = dir.path().join("x");
            std::fs::write(&p, &good).unwrap();
            assert_eq!(check(&p, c).unwrap(), data.len() as u64, "{c:?}");

            std::fs::write(&p, &good[..good.len() - 7]).unwrap();
            assert!(check(&p, c).is_err(), "{c:?}: truncated must fail");

            let mut bad = good.clone();
            let mid = bad.len() / 2;
            bad[mid] ^= 0x55;
            std::fs::write(&p, &bad).unwrap();
            assert!(check(&p, c).is_err(), "{c:?}: a flipped byte must fail");
        }
    }
}
