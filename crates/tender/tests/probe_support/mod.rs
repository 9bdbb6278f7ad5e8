//! A tiny HTTP/1.1 server on 127.0.0.1 whose every answer the test decides (respond, hang,
//! close), recording what it was asked. Shared by the probe and prefetch tests.

#![allow(dead_code, reason = "each test binary uses a part")]
#![allow(clippy::unwrap_used, reason = "tests")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl Req {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

pub enum Reply {
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Accept, read the request, never answer.
    Hang,
    /// Close the connection without a response.
    Close,
}

pub fn respond(status: u16, headers: &[(&str, &str)], body: impl Into<Vec<u8>>) -> Reply {
    Reply::Respond {
        status,
        headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        body: body.into(),
    }
}

pub type Handler = dyn Fn(&Req) -> Reply + Send + Sync;

pub struct Fake {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    pub seen: Arc<Mutex<Vec<Req>>>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Fake {
    pub fn start(handler: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handler: Arc<Handler> = Arc::new(handler);
        let hits = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s, st) = (hits.clone(), seen.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (handler, h, s) = (handler.clone(), h.clone(), s.clone());
                std::thread::spawn(move || serve_conn(conn, &*handler, &h, &s));
            }
        });
        Fake { addr, hits, seen, stop, accept: Some(accept) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Req> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        // Stop accepting: the listener closes, so the port refuses connections afterwards.
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn serve_conn(conn: TcpStream, handler: &Handler, hits: &AtomicUsize, seen: &Mutex<Vec<Req>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.trim_end().split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let req = Req { method, path, headers };
    hits.fetch_add(1, Ordering::SeqCst);
    seen.lock().unwrap().push(req.clone());
    let mut conn = conn;
    match handler(&req) {
        Reply::Respond { status, headers, body } => {
            let mut head = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let _ = conn.write_all(head.as_bytes());
            if req.method != "HEAD" {
                let _ = conn.write_all(&body);
            }
            let _ = conn.flush();
        }
        Reply::Hang => {
            std::thread::sleep(Duration::from_secs(60));
        }
        Reply::Close => {}
    }
}

/// The real `tender serve` in front of a fake upstream (registry and Image Factory).
pub struct Tender {
    pub child: Child,
    pub url: String,
    pub dir: tempfile::TempDir,
}

impl Tender {
    pub fn start(upstream: &str) -> Tender {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("tender.yaml");
        std::fs::write(
            &config,
            format!(
                "listen: 127.0.0.1:0\ndata: {}\ndefaultUpstream: ghcr.io\nimageFactory: {upstream}\n\
                 upstreams:\n  - name: ghcr.io\n    url: {upstream}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let log = dir.path().join("tender.log");
        let child = Command::new(env!("CARGO_BIN_EXE_tender"))
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut t = Tender { child, url: String::new(), dir };
        t.url = wait_for_listen(&log, &mut t.child);
        t
    }
}

impl Drop for Tender {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("tender.log")).unwrap_or_default();
            eprintln!("--- tender log ---\n{log}");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_for_listen(log: &Path, child: &mut Child) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(log) {
            let _ = f.read_to_string(&mut text);
        }
        if let Some(rest) = text.split("tender serving on ").nth(1) {
            return rest.split_whitespace().next().unwrap().trim_end_matches('"').to_string();
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("tender serve exited with {status}:\n{text}");
        }
        assert!(Instant::now() < until, "tender serve did not start:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
