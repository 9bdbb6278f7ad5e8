//! Writing raw disk images sparsely: all-zero blocks are never written (the file gets holes
//! there), so a 6 GiB golden whose image holds 1 GiB of data takes about 1 GiB on disk.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use sha2::{Digest as _, Sha256};

/// The hole granularity: the page / filesystem block size of every filesystem we care about.
pub const BLOCK: usize = 4096;
const BUF: usize = 1 << 20;

/// What [`write_sparse`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Length of the file (the image, or `min_len` when that is larger).
    pub len: u64,
    /// Bytes that came from the reader.
    pub content_len: u64,
    /// sha256 of the whole file, holes and any zero extension included (hex).
    pub sha256: String,
}

static ZEROS: [u8; BLOCK] = [0; BLOCK];

fn is_zero(b: &[u8]) -> bool {
    // Slice equality on bytes is a memcmp: fast even in unoptimised builds.
    b.chunks(BLOCK).all(|c| c == &ZEROS[..c.len()])
}

/// Fill `buf` from `r` as far as it goes; returns how many bytes were read (short only at EOF).
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Copy `r` into the empty file `out` skipping all-zero blocks, extend it to `min_len` when
/// that is larger, and hash every byte. `on_block` is called after each buffer (for progress).
/// The file is not synced; the caller does that before renaming it into place.
pub fn write_sparse(
    r: &mut dyn Read,
    out: &File,
    min_len: Option<u64>,
    on_block: &mut dyn FnMut(u64),
) -> io::Result<Written> {
    let mut buf = vec![0u8; BUF];
    let mut hash = Sha256::new();
    let mut pos = 0u64;
    loop {
        let n = read_full(r, &mut buf)?;
        if n == 0 {
            break;
        }
        let data = &buf[..n];
        hash.update(data);
        // Write each maximal run of non-zero blocks with one call.
        let mut run: Option<usize> = None;
        let mut i = 0;
        while i < n {
            let end = (i + BLOCK).min(n);
            let zero = is_zero(&data[i..end]);
            match (zero, run) {
                (false, None) => run = Some(i),
                (true, Some(start)) => {
                    out.write_all_at(&data[start..i], pos + start as u64)?;
                    run = None;
                }
                _ => {}
            }
            i = end;
        }
        if let Some(start) = run {
            out.write_all_at(&data[start..n], pos + start as u64)?;
        }
        pos += n as u64;
        on_block(pos);
    }
    let content_len = pos;
    let len = min_len.map_or(pos, |m| m.max(pos));
    if len > pos {
        let zeros = vec![0u8; BUF];
        let mut left = len - pos;
        while left > 0 {
            let k = left.min(BUF as u64) as usize;
            hash.update(&zeros[..k]);
            left -= k as u64;
        }
    }
    out.set_len(len)?;
    Ok(Written { len, content_len, sha256: hex::encode(hash.finalize()) })
}

/// Bytes the file takes on disk.
pub fn allocated(f: &File) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(f.metadata()?.blocks() * 512)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn image() -> Vec<u8> {
        // 8 MiB: data, a 3 MiB hole, data that is not block-aligned, a hole up to the end.
        let mut v = vec![0u8; 8 << 20];
        for (i, b) in v[..1 << 20].iter_mut().enumerate() {
            *b = (i % 251) as u8 | 1;
        }
        for b in &mut v[(4 << 20) + 100..(5 << 20) + 7] {
            *b = 0xAB;
        }
        v
    }

    #[test]
    fn should_write_the_same_bytes_with_holes() {
        let dir = tempfile::tempdir().unwrap();
        let img = image();
        let p = dir.path().join("g.raw");
        let f = File::create(&p).unwrap();
        let mut calls = 0;
        let w = write_sparse(&mut &img[..], &f, None, &mut |_| calls += 1).unwrap();
        f.sync_all().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), img);
        assert_eq!(w.len, img.len() as u64);
        assert_eq!(w.sha256, hex::encode(Sha256::digest(&img)));
        assert!(calls >= 8);
        let used = allocated(&f).unwrap();
        assert!(used < (3 << 20), "only the data blocks are allocated: {used}");
    }

    #[test]
    fn should_extend_to_the_minimum_length_and_hash_the_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let img = image();
        let p = dir.path().join("g.raw");
        let f = File::create(&p).unwrap();
        let w = write_sparse(&mut &img[..], &f, Some(16 << 20), &mut |_| {}).unwrap();
        let mut want = img.clone();
        want.resize(16 << 20, 0);
        assert_eq!(w.len, 16 << 20);
        assert_eq!(w.content_len, img.len() as u64);
        assert_eq!(w.sha256, hex::encode(Sha256::digest(&want)));
        assert_eq!(std::fs::read(&p).unwrap(), want);
    }

    #[test]
    fn should_read_through_short_reads() {
        struct Trickle<'a>(&'a [u8]);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(self.0.len()).min(777);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let img = image();
        let p = dir.path().join("g.raw");
        let f = File::create(&p).unwrap();
        write_sparse(&mut Trickle(&img), &f, None, &mut |_| {}).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), img);
    }
}
