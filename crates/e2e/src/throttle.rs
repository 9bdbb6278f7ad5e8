//! A TCP proxy on 127.0.0.1 in front of one server, each of whose directions can be throttled
//! at any moment ([`Throttle::set_upload_rate`], [`Throttle::set_download_rate`]): a bucket that answers small requests
//! at once but cannot take a large body within a request timeout (a slow or saturated link from
//! one replica), while every other replica reaches the server directly.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

struct Shared {
    target: SocketAddr,
    /// Bytes per second from client to server, 0 for no limit.
    upload_rate: AtomicU64,
    /// Bytes per second from server to client, 0 for no limit.
    download_rate: AtomicU64,
    stop: AtomicBool,
}

/// The proxy; stops accepting when dropped (connections under way end with their peers).
pub struct Throttle {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Throttle {
    /// Forward every connection to `target`, unthrottled until told otherwise.
    pub fn start(target: SocketAddr) -> Throttle {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let shared = Arc::new(Shared {
            target,
            upload_rate: AtomicU64::new(0),
            download_rate: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect_timeout(&s.target, Duration::from_secs(5)) else { continue };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                let (up, down) = (s.clone(), s.clone());
                std::thread::spawn(move || pipe(client, server, &up.upload_rate));
                std::thread::spawn(move || pipe(s2, c2, &down.download_rate));
            }
        });
        Throttle { addr, shared, thread: Some(thread) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Throttle what the server sends from now on (connections under way included) to about
    /// `bytes_per_sec`; 0 lifts the limit.
    pub fn set_download_rate(&self, bytes_per_sec: u64) {
        self.shared.download_rate.store(bytes_per_sec, Ordering::SeqCst);
    }

    /// Throttle what clients send from now on (connections under way included) to about
    /// `bytes_per_sec`; 0 lifts the limit.
    pub fn set_upload_rate(&self, bytes_per_sec: u64) {
        self.shared.upload_rate.store(bytes_per_sec, Ordering::SeqCst);
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Copy `from` to `to` until either ends, paced by `limit` (bytes per second, 0 for none).
fn pipe(mut from: TcpStream, mut to: TcpStream, limit: &AtomicU64) {
    let mut buf = vec![0u8; 16 << 10];
    loop {
        // Throttled, read at most a tenth of a second's worth at a time.
        let rate = limit.load(Ordering::SeqCst);
        let want =
            if rate == 0 { buf.len() } else { usize::try_from(rate / 10).unwrap_or(buf.len()).clamp(1, buf.len()) };
        let n = match from.read(&mut buf[..want]) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let began = Instant::now();
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if rate > 0 {
            let due = Duration::from_secs_f64(n as f64 / rate as f64);
            if let Some(left) = due.checked_sub(began.elapsed()) {
                std::thread::sleep(left);
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
