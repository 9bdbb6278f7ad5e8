//! Responses that make no progress (issue 32 item 2, issue 41 item 5): readers that never read
//! over HTTP/1.1, HTTP/2 streams whose flow-control window stays shut, HTTP/2 connections that
//! never read their socket. Raw sockets and a raw HTTP/2 frame client: no client library that
//! would read or open windows on its own.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use support::h2::*;
use support::*;
use tender_server::limits::Limits;
use tender_server::{Security, Surface};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

/// One heavy test at a time: they measure the process's memory and the host's TCP memory.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn loopback(n: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, n])
}

async fn tender_with(fake: &FakeUpstream, limits: Limits) -> Tender {
    let ups = vec![upstream_settings("ghcr.io", &fake.url())];
    Tender::start_full(ups, None, fast_settings(), Security { limits, ..Security::default() }, None, Surface::All).await
}

/// A cached blob of `len` bytes: its path.
async fn cached_blob(fake: &FakeUpstream, tender: &Tender, len: usize, seed: u64) -> (String, bytes::Bytes) {
    let blob = random_bytes(len, seed);
    let d = fake.add_blob(blob.clone());
    let path = format!("/v2/ghcr.io/a/b/blobs/{d}");
    assert_eq!(get(&tender.url(&path), &[]).await.body.unwrap(), blob);
    tender.wait_idle().await;
    (path, blob)
}

/// A client socket from `ip` with a small receive buffer: the test's own side of each stalled
/// connection holds little, so what the host's TCP memory shows is tender's.
async fn connect_from(ip: IpAddr, to: SocketAddr, recv_buffer: u32) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.set_recv_buffer_size(recv_buffer).unwrap();
    s.bind(SocketAddr::new(ip, 0)).unwrap();
    s.connect(to).await.unwrap()
}

/// `n` HTTP/1.1 GETs of `path` spread over `addrs` that never read a byte of their answers.
async fn stalled_readers(to: SocketAddr, addrs: &[IpAddr], n: usize, path: &str) -> Vec<TcpStream> {
    let mut out = Vec::new();
    for i in 0..n {
        let mut s = connect_from(addrs[i % addrs.len()], to, 16 * 1024).await;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes()).await.unwrap();
        out.push(s);
    }
    out
}

fn refusals(tender: &Tender, limit: &str) -> u64 {
    let text = tender.app.metrics().render();
    let key = format!("tender_limit_refusals_total{{limit=\"{limit}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&key)).map_or(0, |v| v.trim().parse().unwrap())
}

/// Poll `cond` every 50 ms until it holds or `limit` passes; whether it held.
async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the kernel still has `s` established: a socket the server closed or reset is not,
/// and this asks without reading a byte (reading would drain it, and so un-stall the server).
fn established(s: &TcpStream) -> bool {
    let local = s.local_addr().unwrap();
    let IpAddr::V4(ip) = local.ip() else { panic!("IPv4 only") };
    let want = format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), local.port());
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).any(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        cols.get(1) == Some(&want.as_str()) && cols.get(3) == Some(&"01")
    })
}

/// Issue 32 (2): with `maxConnections: 50` and `sendStallTimeout: 5s`, 50 readers that never
/// read a cached 8 MiB blob, from one address and then from 10: `/healthz` and a normal pull
/// succeed within 10 s of the readers' start (a stalled connection gives way first at the cap),
/// and every stalled reader is closed (reset) and counted as `send_stall` or `evicted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_close_stalled_readers_and_keep_serving_at_the_connection_cap() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let limits = Limits { max_connections: 50, send_stall_timeout: Duration::from_secs(5), ..Limits::default() };
    let tender = tender_with(&fake, limits).await;
    let (path, blob) = cached_blob(&fake, &tender, 8 << 20, 41).await;
    for addrs in [vec![loopback(1)], (2..12).map(loopback).collect::<Vec<_>>()] {
        let before = refusals(&tender, "send_stall") + refusals(&tender, "evicted");
        let started = Instant::now();
        let readers = stalled_readers(tender.addr, &addrs, 50, &path).await;
        let mut healthy = false;
        while started.elapsed() < Duration::from_secs(10) {
            let ok = client().get(tender.url("/healthz")).timeout(Duration::from_secs(2)).send().await;
            if ok.is_ok_and(|r| r.status() == 200) {
                healthy = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(healthy, "{} address(es): /healthz failed for 10 s", addrs.len());
        let mut pulled = None;
        while started.elapsed() < Duration::from_secs(10) && pulled.is_none() {
            let got = get(&tender.url(&path), &[]).await;
            pulled = got.body.ok().filter(|b| got.status == 200 && *b == blob);
        }
        assert!(pulled.is_some(), "{} address(es): no whole pull within 10 s", addrs.len());
        eprintln!("{} address(es): /healthz and a pull after {:?}", addrs.len(), started.elapsed());
        let closed = eventually(Duration::from_secs(15), || {
            refusals(&tender, "send_stall") + refusals(&tender, "evicted") >= before + 50
        })
        .await;
        assert!(closed, "stalled readers still open after 15 s: {}", tender.app.metrics().render());
        let gone = eventually(Duration::from_secs(5), || !readers.iter().any(established)).await;
        let open = readers.iter().filter(|r| established(r)).count();
        assert!(gone, "{open} stalled readers' connections stayed open: {}", tender.app.metrics().render());
        eprintln!("{} address(es): every stalled reader closed after {:?}", addrs.len(), started.elapsed());
    }
}

/// Memory a stalled reader pins in the kernel is bounded by `limits.sendBuffer` (256 KiB as the
/// kernel counts it): 300 readers of an 8 MiB blob that never read add less than 128 MiB to the
/// host's TCP memory (`/proc/net/sockstat`, in pages), both ends of each connection included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_cap_what_stalled_readers_pin_in_the_kernel() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let limits = Limits { send_stall_timeout: Duration::from_secs(60), ..Limits::default() };
    let tender = tender_with(&fake, limits).await;
    let (path, _) = cached_blob(&fake, &tender, 8 << 20, 42).await;
    let tcp_pages = || {
        let s = std::fs::read_to_string("/proc/net/sockstat").unwrap();
        let line = s.lines().find(|l| l.starts_with("TCP:")).unwrap().to_string();
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w == "mem" {
                return words.next().unwrap().parse::<u64>().unwrap();
            }
        }
        panic!("no TCP mem in {line}");
    };
    let base = tcp_pages();
    let addrs: Vec<IpAddr> = (1..5).map(loopback).collect();
    let readers = stalled_readers(tender.addr, &addrs, 300, &path).await;
    // until the sockets are full: the figure stops growing (bounded)
    let (mut peak, mut steady_since) = (tcp_pages(), Instant::now());
    let started = Instant::now();
    while steady_since.elapsed() < Duration::from_secs(1) && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = tcp_pages();
        if now > peak {
            peak = now;
            steady_since = Instant::now();
        }
    }
    let added = peak.saturating_sub(base) * 4096;
    eprintln!("300 stalled readers: +{} MiB of TCP memory", added >> 20);
    assert!(added < 128 << 20, "300 stalled readers pinned {} MiB", added >> 20);
    drop(readers);
}

// ---- a raw HTTP/2 client --------------------------------------------------------------------

/// Open an h2c connection with `window` as every stream's initial window and `n` GETs of
/// `path` on it.
async fn h2_streams(to: SocketAddr, path: &str, n: u32, window: u32) -> TcpStream {
    let mut s = connect_from(loopback(1), to, 64 * 1024).await;
    let mut out = PREFACE.to_vec();
    let mut settings = vec![0, 4];
    settings.extend_from_slice(&window.to_be_bytes());
    out.extend(frame(SETTINGS, 0, 0, &settings));
    if window > 65_535 {
        out.extend(frame(WINDOW_UPDATE, 0, 0, &(0x7fff_ffff - 65_535u32).to_be_bytes()));
    }
    let block = get_headers(path);
    for i in 0..n {
        out.extend(frame(HEADERS, 0x1 | 0x4, 2 * i + 1, &block));
    }
    s.write_all(&out).await.unwrap();
    s
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb = s.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
    kb.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
}

/// Issue 41 (5): 2 connections × 100 streams with SETTINGS_INITIAL_WINDOW_SIZE=0, answering
/// PINGs and SETTINGS and never sending WINDOW_UPDATE: with `sendStallTimeout: 5s` every
/// stream is reset within 15 s, no DATA is sent, and tender's memory grows by at most 48 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_reset_http2_streams_whose_window_stays_shut() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let limits = Limits { send_stall_timeout: Duration::from_secs(5), ..Limits::default() };
    let tender = tender_with(&fake, limits).await;
    let (path, _) = cached_blob(&fake, &tender, 8 << 20, 43).await;
    let base = rss_bytes();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let mut s = h2_streams(tender.addr, &path, 100, 0).await;
        tasks.push(tokio::spawn(async move {
            let mut reset = HashSet::new();
            let mut data = 0usize;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
            while reset.len() < 100 {
                let Ok(Ok((kind, flags, stream, payload))) =
                    tokio::time::timeout_at(deadline, read_frame(&mut s)).await
                else {
                    break;
                };
                match kind {
                    SETTINGS if flags & 1 == 0 => s.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap(),
                    PING if flags & 1 == 0 => s.write_all(&frame(PING, 1, 0, &payload)).await.unwrap(),
                    RST_STREAM => {
                        reset.insert(stream);
                    }
                    DATA => data += payload.len(),
                    GOAWAY => break,
                    _ => {}
                }
            }
            (reset.len(), data)
        }));
    }
    let mut peak = 0;
    while !tasks.iter().all(|t| t.is_finished()) && started.elapsed() < Duration::from_secs(16) {
        peak = peak.max(rss_bytes());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in tasks {
        let (reset, data) = t.await.unwrap();
        assert_eq!(reset, 100, "streams reset within 15 s");
        assert_eq!(data, 0, "DATA went to streams with a shut window");
    }
    let grown = peak.saturating_sub(base);
    eprintln!("200 zero-window streams reset after {:?}; tender grew by {} KiB", started.elapsed(), grown >> 10);
    assert!(grown <= 48 << 20, "grew by {} MiB", grown >> 20);
    assert!(refusals(&tender, "send_stall") >= 200);
    assert_eq!(get(&tender.url("/healthz"), &[]).await.status, 200);
}

/// Issue 41 (5): 2 connections × 100 streams that open the largest windows and never read the
/// socket are closed within 20 s (`sendStallTimeout: 5s`), and tender grows by at most 96 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_close_http2_connections_that_never_read() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let limits = Limits { send_stall_timeout: Duration::from_secs(5), ..Limits::default() };
    let tender = tender_with(&fake, limits).await;
    let (path, _) = cached_blob(&fake, &tender, 8 << 20, 44).await;
    let base = rss_bytes();
    let before = refusals(&tender, "send_stall");
    let started = Instant::now();
    let mut conns = Vec::new();
    for _ in 0..2 {
        conns.push(h2_streams(tender.addr, &path, 100, 0x7fff_ffff).await);
    }
    let mut peak = 0;
    let closed = eventually(Duration::from_secs(20), || {
        peak = peak.max(rss_bytes());
        !conns.iter().any(established)
    })
    .await;
    assert!(closed, "connections that never read still open after 20 s");
    assert!(refusals(&tender, "send_stall") >= before + 2);
    let grown = peak.saturating_sub(base);
    eprintln!("2 never-reading connections closed after {:?}; tender grew by {} KiB", started.elapsed(), grown >> 10);
    assert!(grown <= 96 << 20, "grew by {} MiB", grown >> 20);
    assert_eq!(get(&tender.url("/healthz"), &[]).await.status, 200);
}

/// Issue 41 (7): an HTTP/2 connection that tender closes by its own deadline hears why first.
/// A client sends the preface and its SETTINGS and never a request: at `headerTimeout` it gets
/// a GOAWAY, and then the connection closes (before: closed without a word).
#[tokio::test]
async fn should_send_goaway_before_closing_a_silent_http2_connection() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let limits = Limits { header_timeout: Duration::from_secs(1), ..Limits::default() };
    let tender = tender_with(&fake, limits).await;
    let mut s = connect_from(loopback(1), tender.addr, 64 * 1024).await;
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    s.write_all(&out).await.unwrap();
    let started = std::time::Instant::now();
    let mut kinds = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match read_frame(&mut s).await {
                Ok((kind, flags, _, _)) => {
                    kinds.push(kind);
                    if kind == SETTINGS && flags & 1 == 0 {
                        // Acknowledge tender's SETTINGS, as a well-behaved peer would.
                        s.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap();
                    }
                }
                Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the silent connection was never closed: {kinds:?}");
    assert!(kinds.contains(&GOAWAY), "closed without a GOAWAY: frames {kinds:?}");
    assert!(started.elapsed() >= Duration::from_millis(900), "closed before headerTimeout");
    assert_eq!(refusals(&tender, "header_timeout"), 1);
}
