//! Compression containers and their own integrity checks: xz (CRC32/CRC64/SHA-256 per block),
//! gzip (CRC32 and length per member), zstd (the optional content checksum, and frame
//! structure). Used to establish that an asset with no published checksum arrived whole.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use bytes::Bytes;

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
            Container::Xz => Box::new(liblzma::bufread::XzDecoder::new_multi_decoder(r)),
            Container::Gz => Box::new(flate2::bufread::MultiGzDecoder::new(r)),
            Container::Zst => Box::new(zstd::stream::read::Decoder::with_buffer(r)?),
        })
    }
}

/// Decode the whole file, which fails on any integrity error or truncation.
pub fn check(path: &Path, c: Container) -> io::Result<u64> {
    drain(c.decoder(File::open(path)?)?)
}

/// Read a decoder to its end; the decompressed size.
fn drain(mut d: Box<dyn Read + '_>) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = d.read(&mut buf)?;
        if k == 0 {
            return Ok(n);
        }
        n = n.saturating_add(k as u64);
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
    pub fn start(container: Container, prefix: Option<(File, u64)>) -> StreamCheck {
        let (tx, rx) = tokio::sync::mpsc::channel(CHECK_QUEUE);
        let task = tokio::task::spawn_blocking(move || {
            let fed = ChannelReader { rx, cur: Bytes::new() };
            match prefix {
                Some((f, len)) => drain(container.buf_decoder(BufReader::new(f.take(len)).chain(fed))?),
                None => drain(container.buf_decoder(fed)?),
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
        let mut check = StreamCheck::start(c, (prefix > 0).then(|| (File::open(&p).unwrap(), prefix as u64)));
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
