//! Compression containers and their own integrity checks: xz (CRC32/CRC64/SHA-256 per block),
//! gzip (CRC32 and length per member), zstd (the optional content checksum, and frame
//! structure). Used to establish that an asset with no published checksum arrived whole.
//!
//! An asset is hostile input until it verified, and a small one can decompress into a huge
//! one: every decoder runs with a memory limit (xz: [`XZ_MEMLIMIT`]; zstd: windows up to
//! 2^[`ZSTD_WINDOW_LOG_MAX`]; gzip needs 32 KiB), and a check stops at an absolute decoded
//! size (`fetch.maxDecodedSize`). There is no ratio cap: sparse raw disks legitimately
//! decompress 1000:1.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use bytes::Bytes;

/// Most memory the xz decoder may use (dictionary included); streams that need more fail.
pub const XZ_MEMLIMIT: u64 = 256 << 20;
/// Largest zstd window accepted: 2^27 = 128 MiB (zstd's own default limit, set explicitly).
pub const ZSTD_WINDOW_LOG_MAX: u32 = 27;
/// Default absolute cap on an asset's decompressed size (`fetch.maxDecodedSize`).
pub const DEFAULT_MAX_DECODED: u64 = 64 << 30;

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
        self.buf_decoder(BufReader::with_capacity(1 << 20, r))
    }

    /// [`Container::decoder`] over a reader that already buffers: the decoder reads its input
    /// in place, with no copy into a buffer of its own.
    fn buf_decoder<'a, R: BufRead + 'a>(self, r: R) -> io::Result<Box<dyn Read + 'a>> {
        Ok(match self {
            Container::None => Box::new(r),
            Container::Xz => {
                let stream = liblzma::stream::Stream::new_stream_decoder(XZ_MEMLIMIT, liblzma::stream::CONCATENATED)
                    .map_err(io::Error::other)?;
                Box::new(liblzma::bufread::XzDecoder::new_stream(r, stream))
            }
            Container::Gz => Box::new(flate2::bufread::MultiGzDecoder::new(r)),
            Container::Zst => {
                let mut d = zstd::stream::read::Decoder::with_buffer(r)?;
                d.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
                Box::new(d)
            }
        })
    }
}

/// Decode the whole file, which fails on any integrity error or truncation, or once more
/// than `max_decoded` bytes came out.
pub fn check(path: &Path, c: Container, max_decoded: u64) -> io::Result<u64> {
    drain(c.decoder(File::open(path)?)?, max_decoded)
}

/// Read a decoder to its end; the decompressed size. Fails beyond `max` bytes.
fn drain(mut d: Box<dyn Read + '_>, max: u64) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = d.read(&mut buf)?;
        if k == 0 {
            return Ok(n);
        }
        n = n.saturating_add(k as u64);
        if n > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("decompresses to more than {max} bytes (fetch.maxDecodedSize)"),
            ));
        }
    }
}

/// Chunks in flight to a [`StreamCheck`]'s decoder (each at most a few hundred KiB).
const CHECK_QUEUE: usize = 64;

/// The container check of a fill, run while the bytes arrive: a blocking task decodes every
/// byte the fill appends, so the verdict is ready when the last byte is in (a check after the
/// download would decompress the whole asset before the last byte may go out).
#[derive(Debug)]
pub struct StreamCheck {
    container: Container,
    tx: Option<tokio::sync::mpsc::Sender<Bytes>>,
    task: Option<tokio::task::JoinHandle<io::Result<u64>>>,
}

/// The receiving end as a `Read`: EOF when the sender is dropped.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = out.len().min(self.fill_buf()?.len());
        out[..n].copy_from_slice(&self.cur[..n]);
        self.consume(n);
        Ok(n)
    }
}

/// The received chunks are the buffer: the decoder reads them where they are.
impl BufRead for ChannelReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => break,
            }
        }
        Ok(&self.cur)
    }

    fn consume(&mut self, n: usize) {
        self.cur = self.cur.slice(n.min(self.cur.len())..);
    }
}

impl StreamCheck {
    /// Start checking. `prefix`: a file whose first `len` bytes arrived before (a spool file
    /// resumed after a crash); they are decoded first.
    pub fn start(container: Container, prefix: Option<(File, u64)>, max_decoded: u64) -> StreamCheck {
        let (tx, rx) = tokio::sync::mpsc::channel(CHECK_QUEUE);
        let task = tokio::task::spawn_blocking(move || {
            let fed = ChannelReader { rx, cur: Bytes::new() };
            match prefix {
                Some((f, len)) => drain(container.buf_decoder(BufReader::new(f.take(len)).chain(fed))?, max_decoded),
                None => drain(container.buf_decoder(fed)?, max_decoded),
            }
        });
        StreamCheck { container, tx: Some(tx), task: Some(task) }
    }

    pub fn container(&self) -> Container {
        self.container
    }

    /// The next bytes of the object. An error: the container is already known to be bad.
    pub async fn feed(&mut self, bytes: Bytes) -> io::Result<()> {
        let sent = match &self.tx {
            Some(tx) => tx.send(bytes).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The decoder stopped before its input ended: it failed, or the container ended with
        // bytes after it.
        match self.finish_inner().await {
            Err(e) => Err(e),
            Ok(_) => Err(io::Error::new(io::ErrorKind::InvalidData, "bytes after the end of the container")),
        }
    }

    async fn finish_inner(&mut self) -> io::Result<u64> {
        self.tx = None;
        match self.task.take() {
            Some(t) => t.await.unwrap_or_else(|e| Err(io::Error::other(e))),
            None => Err(io::Error::other("container check already finished")),
        }
    }

    /// Every byte is in: the verdict (the decompressed size, or the integrity error).
    pub async fn finish(mut self) -> io::Result<u64> {
        self.finish_inner().await
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

    /// Feed `bytes` in pieces of `step` after a prefix of `prefix` bytes from a file.
    async fn stream(c: Container, bytes: &[u8], prefix: usize, step: usize) -> io::Result<u64> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("prefix");
        std::fs::write(&p, &bytes[..prefix]).unwrap();
        let mut check =
            StreamCheck::start(c, (prefix > 0).then(|| (File::open(&p).unwrap(), prefix as u64)), DEFAULT_MAX_DECODED);
        for piece in bytes[prefix..].chunks(step) {
            check.feed(Bytes::copy_from_slice(piece)).await?;
        }
        check.finish().await
    }

    #[tokio::test]
    async fn should_check_a_container_while_it_streams_in_any_pieces() {
        let data: Vec<u8> = (0..300_000u32).flat_map(|i| (i % 253).to_le_bytes()).collect();
        for c in [Container::Xz, Container::Gz, Container::Zst] {
            let good = compress(c, &data);
            for (prefix, step) in [(0, 1 << 20), (0, 4099), (good.len() / 3, 65536), (good.len(), 7)] {
                assert_eq!(stream(c, &good, prefix, step).await.unwrap(), data.len() as u64, "{c:?} {prefix} {step}");
            }
            assert!(stream(c, &good[..good.len() - 7], 0, 8192).await.is_err(), "{c:?}: truncated must fail");
            let mut bad = good.clone();
            let mid = bad.len() / 2;
            bad[mid] ^= 0x55;
            assert!(stream(c, &bad, 0, 8192).await.is_err(), "{c:?}: a flipped byte must fail");
            let mut trailing = good.clone();
            trailing.extend_from_slice(b"garbage after the end");
            assert!(stream(c, &trailing, 0, 8192).await.is_err(), "{c:?}: trailing bytes must fail");
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
            assert_eq!(check(&p, c, DEFAULT_MAX_DECODED).unwrap(), data.len() as u64, "{c:?}");

            std::fs::write(&p, &good[..good.len() - 7]).unwrap();
            assert!(check(&p, c, DEFAULT_MAX_DECODED).is_err(), "{c:?}: truncated must fail");

            let mut bad = good.clone();
            let mid = bad.len() / 2;
            bad[mid] ^= 0x55;
            std::fs::write(&p, &bad).unwrap();
            assert!(check(&p, c, DEFAULT_MAX_DECODED).is_err(), "{c:?}: a flipped byte must fail");
        }
    }
}
