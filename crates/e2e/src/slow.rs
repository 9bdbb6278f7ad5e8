//! A throttled upstream that serves blobs: `GET|HEAD /v2/<repo>/blobs/<digest>` with
//! `Content-Length` (and manifests by digest, with their media type, the same way), `Range: bytes=N-` answered `206` with `Content-Range`, and every request
//! logged with its `Range`. Anything else is a 404. One request per connection.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Deterministic, incompressible bytes (xorshift64*), to serve as a blob.
pub fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// One request the server saw.
#[derive(Debug, Clone)]
pub struct Hit {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub status: u16,
    /// Body bytes written (so far, while the response is in progress).
    pub sent: u64,
}

impl Hit {
    /// `N` of a `Range: bytes=N-` request.
    pub fn range_start(&self) -> Option<u64> {
        self.range.as_deref()?.trim().strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok()
    }
}

struct Shared {
    /// `/v2/<repo>/blobs/<digest>` (or `/manifests/<digest>`) -> content and its media type
    blobs: HashMap<String, (Arc<Vec<u8>>, String)>,
    /// The rate of each response, read when it begins ([`SlowBlobServer::set_rate`]).
    bytes_per_sec: AtomicU64,
    stop: AtomicBool,
    hits: Mutex<Vec<Hit>>,
}

/// The server; stops accepting and ends its transfers when dropped.
pub struct SlowBlobServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl SlowBlobServer {
    /// Serve `blob` as `/v2/<repo>/blobs/<digest>` at about `bytes_per_sec` per connection.
    pub fn start(repo: &str, digest: &str, blob: Arc<Vec<u8>>, bytes_per_sec: u64) -> SlowBlobServer {
        SlowBlobServer::start_many(repo, vec![(digest.to_string(), blob)], bytes_per_sec)
    }

    /// Serve each `(digest, content)` as `/v2/<repo>/blobs/<digest>`.
    pub fn start_many(repo: &str, blobs: Vec<(String, Arc<Vec<u8>>)>, bytes_per_sec: u64) -> SlowBlobServer {
        let objects = blobs
            .into_iter()
            .map(|(d, b)| (format!("/v2/{repo}/blobs/{d}"), b, "application/octet-stream".to_string()))
            .collect();
        SlowBlobServer::start_objects(objects, bytes_per_sec)
    }

    /// Serve each `(path, content, media type)`: blobs and manifests by digest alike.
    pub fn start_objects(objects: Vec<(String, Arc<Vec<u8>>, String)>, bytes_per_sec: u64) -> SlowBlobServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let shared = Arc::new(Shared {
            blobs: objects.into_iter().map(|(p, b, t)| (p, (b, t))).collect(),
            bytes_per_sec: AtomicU64::new(bytes_per_sec.max(1)),
            stop: AtomicBool::new(false),
            hits: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(&s, conn));
            }
        });
        SlowBlobServer { addr, shared, thread: Some(thread) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serve responses that begin from now on at `bytes_per_sec`; those under way keep theirs
    /// (one replica's slow path to the upstream, while the upstream itself is fast).
    pub fn set_rate(&self, bytes_per_sec: u64) {
        self.shared.bytes_per_sec.store(bytes_per_sec.max(1), Ordering::SeqCst);
    }

    /// Every request so far.
    pub fn hits(&self) -> Vec<Hit> {
        self.shared.hits.lock().map(|h| h.clone()).unwrap_or_default()
    }
}

impl Drop for SlowBlobServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // wake the accept loop so it sees the flag
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(s: &Shared, conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            }
        }
    }
    let mut hit = Hit { method: method.clone(), path: path.clone(), range: range.clone(), status: 200, sent: 0 };
    let mut conn = conn;
    let (blob, media_type) = match s.blobs.get(&path) {
        Some(b) if method == "GET" || method == "HEAD" => b.clone(),
        _ => {
            hit.status = 404;
            record(s, hit);
            let body = r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}"#;
            let _ = write!(
                conn,
                "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            return;
        }
    };
    let len = blob.len() as u64;
    let start = match hit.range_start() {
        Some(n) if n < len => n,
        Some(_) => {
            hit.status = 416;
            record(s, hit);
            let _ = write!(conn, "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            return;
        }
        None => 0,
    };
    let head = if start > 0 {
        hit.status = 206;
        format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Type: {media_type}\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{}/{len}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n",
            len - start,
            len - 1
        )
    } else {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {media_type}\r\nContent-Length: {len}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n"
        )
    };
    let idx = record(s, hit);
    if conn.write_all(head.as_bytes()).is_err() || method == "HEAD" {
        return;
    }
    let rate = s.bytes_per_sec.load(Ordering::SeqCst);
    let began = Instant::now();
    let mut pos = start;
    let mut sent = 0u64;
    while pos < len && !s.stop.load(Ordering::SeqCst) {
        let end = (pos + 64 * 1024).min(len);
        if conn.write_all(&blob[pos as usize..end as usize]).is_err() {
            break;
        }
        sent += end - pos;
        pos = end;
        if let Ok(mut h) = s.hits.lock() {
            h[idx].sent = sent;
        }
        // throttle: not ahead of bytes_per_sec since this response began
        let due = Duration::from_secs_f64(sent as f64 / rate as f64);
        if let Some(ahead) = due.checked_sub(began.elapsed()) {
            std::thread::sleep(ahead);
        }
    }
}

fn record(s: &Shared, hit: Hit) -> usize {
    let mut h = s.hits.lock().unwrap_or_else(|p| p.into_inner());
    h.push(hit);
    h.len() - 1
}
