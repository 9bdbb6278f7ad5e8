//! A raw HTTP/2 frame client for the tests: no client library that would read, open windows
//! or bound header lists on its own.

use tokio::io::{AsyncRead, AsyncReadExt};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const PING: u8 = 6;
pub const GOAWAY: u8 = 7;
pub const WINDOW_UPDATE: u8 = 8;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A GET's header block: literal fields without indexing, no Huffman (each under 127 bytes).
pub fn get_headers(path: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in [(":method", "GET"), (":scheme", "http"), (":path", path), (":authority", "t")] {
        out.push(0);
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.push(value.len() as u8);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

pub async fn read_frame(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await?;
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok((head[3], head[4], stream, payload))
}

pub const CONTINUATION: u8 = 9;

/// An HPACK integer with an `n`-bit prefix (RFC 7541 5.1), the prefix's other bits `flags`.
fn hpack_int(out: &mut Vec<u8>, flags: u8, n: u32, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128 + 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

/// A header block of literal fields without indexing and without Huffman coding: a GET of
/// `path`, then `extra`.
pub fn header_block(path: &str, extra: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    let base = [(":method", "GET"), (":scheme", "http"), (":path", path), (":authority", "t")];
    let fields = base.iter().map(|(n, v)| (n.to_string(), v.to_string())).chain(extra.iter().cloned());
    for (name, value) in fields {
        out.push(0);
        hpack_int(&mut out, 0, 7, name.len());
        out.extend_from_slice(name.as_bytes());
        hpack_int(&mut out, 0, 7, value.len());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// A request on `stream` carrying `block`: one HEADERS frame and as many CONTINUATION frames
/// as the default frame size (16 KiB) needs; END_STREAM on the HEADERS, END_HEADERS on the last.
pub fn request_frames(stream: u32, block: &[u8]) -> Vec<u8> {
    const MAX: usize = 16_384;
    let chunks: Vec<&[u8]> = block.chunks(MAX).collect();
    let mut out = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let (kind, mut flags) = if i == 0 { (HEADERS, 0x1) } else { (CONTINUATION, 0) };
        if last {
            flags |= 0x4;
        }
        out.extend(frame(kind, flags, stream, chunk));
    }
    out
}
