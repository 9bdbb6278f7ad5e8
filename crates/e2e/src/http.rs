//! A small blocking HTTP/1.1 client: enough to talk to tender without pulling a second HTTP
//! stack into the workspace. Keep-alive connections (to prove a connection survives a reload),
//! `Content-Length`, chunked and close-delimited bodies, and bodies streamed to a sink.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Longest wait for any read or write on a test connection.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// A response's status line and headers.
#[derive(Debug, Clone)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// A whole response.
#[derive(Debug, Clone)]
pub struct Response {
    pub head: Head,
    pub body: Vec<u8>,
}

impl Response {
    pub fn status(&self) -> u16 {
        self.head.status
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One client connection, reused for as many requests as the server allows.
pub struct Conn {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Conn { addr, reader: BufReader::with_capacity(256 * 1024, stream) })
    }

    /// Send a request and collect the whole body.
    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)]) -> io::Result<Response> {
        let mut body = Vec::new();
        let head = self.request_to(method, path, headers, &mut |b| body.extend_from_slice(b))?;
        Ok(Response { head, body })
    }

    /// Send a request and hand the body to `sink` as it arrives. A body that ends early is an
    /// `UnexpectedEof` error (after `sink` saw what did arrive).
    pub fn request_to(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        sink: &mut dyn FnMut(&[u8]),
    ) -> io::Result<Head> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: tender-e2e\r\n", self.addr);
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        self.reader.get_mut().write_all(req.as_bytes())?;
        let head = read_head(&mut self.reader)?;
        let no_body = method == "HEAD" || head.status == 204 || head.status == 304 || head.status < 200;
        if no_body {
            return Ok(head);
        }
        let chunked = head.header("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        if chunked {
            read_chunked(&mut self.reader, sink)?;
        } else if let Some(len) = head.header("content-length") {
            let len: u64 = len.trim().parse().map_err(|_| bad(format!("bad Content-Length {len:?}")))?;
            read_exact_to(&mut self.reader, len, sink)?;
        } else {
            read_to_end(&mut self.reader, sink)?;
        }
        Ok(head)
    }
}

/// One request on a fresh connection.
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> io::Result<Response> {
    Conn::open(addr)?.request(method, path, headers)
}

/// `GET` on a fresh connection.
pub fn get(addr: SocketAddr, path: &str) -> io::Result<Response> {
    request(addr, "GET", path, &[])
}

fn bad(m: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, m)
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before a full response head"));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn read_head(r: &mut impl BufRead) -> io::Result<Head> {
    let status_line = read_line(r)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(r)?;
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').ok_or_else(|| bad(format!("bad header line {line:?}")))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    Ok(Head { status, headers })
}

fn read_exact_to(r: &mut impl Read, mut len: u64, sink: &mut dyn FnMut(&[u8])) -> io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    while len > 0 {
        let want = buf.len().min(usize::try_from(len).unwrap_or(usize::MAX));
        let n = r.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("body ended {len} bytes short")));
        }
        sink(&buf[..n]);
        len -= n as u64;
    }
    Ok(())
}

fn read_to_end(r: &mut impl Read, sink: &mut dyn FnMut(&[u8])) -> io::Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        sink(&buf[..n]);
    }
}

fn read_chunked(r: &mut impl BufRead, sink: &mut dyn FnMut(&[u8])) -> io::Result<()> {
    loop {
        let line = read_line(r)?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = u64::from_str_radix(size, 16).map_err(|_| bad(format!("bad chunk size {line:?}")))?;
        if size == 0 {
            // trailers, then the empty line
            while !read_line(r)?.is_empty() {}
            return Ok(());
        }
        read_exact_to(r, size, sink)?;
        if !read_line(r)?.is_empty() {
            return Err(bad("chunk not followed by CRLF".into()));
        }
    }
}
