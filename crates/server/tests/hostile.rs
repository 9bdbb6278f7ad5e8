//! Hostile clients and hostile upstreams (issue 16): one test per class of hole, each against
//! real listeners on 127.0.0.1. SECURITY.md names the guarantee each test holds.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;

use support::*;
use tender_server::limits::Limits;
use tender_server::{Security, Surface};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The tests measure the process's memory and time: they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This process's resident set, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

async fn secured(fake: &FakeUpstream, security: Security) -> Tender {
    let ups = vec![upstream_settings("ghcr.io", &fake.url())];
    Tender::start_full(ups, None, fast_settings(), security, None, Surface::All).await
}

async fn metrics_text(tender: &Tender) -> String {
    String::from_utf8_lossy(&get(&tender.url("/metrics"), &[]).await.body.unwrap()).into_owned()
}

/// Send one raw request head and read the answer until the server closes or 5 s pass.
async fn raw(addr: SocketAddr, head: &[u8]) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(head).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    out
}

/// Class 2: a label value never comes from the request. 2,000 requests with distinct 60 KB
/// methods (answered 404, 405 or 401) leave `/metrics` and the process's memory flat.
#[tokio::test]
async fn should_keep_metrics_and_memory_flat_under_distinct_long_methods() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let tender = secured(&fake, Security::default()).await;
    let paths = ["/v2/", "/healthz", "/nope", "/v2/ghcr.io/a/b/manifests/x"];
    let method = |i: usize| format!("M{i:05}{}", "X".repeat(60 * 1024));
    // Warm up: every route and the `other` method once.
    for (i, p) in paths.iter().enumerate() {
        raw(tender.addr, format!("{} {p} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", method(i)).as_bytes())
            .await;
    }
    let before_metrics = metrics_text(&tender).await.len();
    let before_rss = rss();
    let sent = futures::stream::iter(0..2000usize)
        .map(|i| {
            let head = format!(
                "{} {} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                method(i + 100),
                paths[i % paths.len()]
            );
            let addr = tender.addr;
            async move { !raw(addr, head.as_bytes()).await.is_empty() }
        })
        .buffer_unordered(8)
        .filter(|answered| futures::future::ready(*answered))
        .count()
        .await;
    assert!(sent > 1900, "only {sent} of 2000 requests were answered");
    let text = metrics_text(&tender).await;
    let after_rss = rss();
    let grown = text.len().saturating_sub(before_metrics);
    eprintln!(
        "/metrics {} -> {} bytes; RSS {} -> {} MiB",
        before_metrics,
        text.len(),
        before_rss >> 20,
        after_rss >> 20
    );
    assert!(grown < 16 * 1024, "/metrics grew by {grown} bytes");
    assert!(!text.contains("XXXXXXXX"), "a method reached a label");
    assert!(after_rss.saturating_sub(before_rss) < 24 << 20, "RSS grew from {before_rss} to {after_rss}");
}

/// Silent sockets from `addrs`, `per_addr` each, re-opened as soon as tender closes one, on a
/// thread of their own (as an attacker is a process of its own) until `Attack` is dropped.
struct Attack {
    opened: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Attack {
    fn start(target: SocketAddr, addrs: &[IpAddr], per_addr: usize) -> Attack {
        let opened = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addrs, counter) = (addrs.to_vec(), opened.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                for ip in addrs {
                    for _ in 0..per_addr {
                        tokio::spawn(silent_socket(target, ip, counter.clone()));
                    }
                }
                let _ = stopped.await;
            });
        });
        Attack { opened, stop: Some(stop), thread: Some(thread) }
    }

    fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }
}

impl Drop for Attack {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn silent_socket(target: SocketAddr, ip: IpAddr, opened: Arc<AtomicU64>) {
    loop {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::new(ip, 0)).unwrap();
        let Ok(mut s) = sock.connect(target).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        let mut buf = [0u8; 64];
        // Never send a byte; wait for tender to close.
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    }
}

/// A client that opens a new connection for every request and gives up after 1 s.
fn impatient() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().pool_max_idle_per_host(0).timeout(Duration::from_secs(1)).build().unwrap()
}

/// An honest client on a thread of its own: `/healthz`, then a pull (manifest by tag, then
/// its layer), each within 1 s. How long each took.
async fn honest_round(base: String, layer: bytes::Bytes, layer_digest: String) -> Vec<Duration> {
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(honest(&base, &layer, &layer_digest))
    });
    tokio::task::spawn_blocking(move || thread.join().unwrap()).await.unwrap()
}

async fn honest(base: &str, layer: &bytes::Bytes, layer_digest: &str) -> Vec<Duration> {
    let c = impatient();
    let mut took = Vec::new();
    let t = Instant::now();
    let r = c.get(format!("{base}/healthz")).send().await.expect("healthz answered within 1 s");
    assert_eq!(r.status(), 200);
    took.push(t.elapsed());
    let t = Instant::now();
    let r = c
        .get(format!("{base}/v2/ghcr.io/team/app/manifests/v1"))
        .header("accept", "application/vnd.oci.image.manifest.v1+json")
        .send()
        .await
        .expect("manifest answered within 1 s");
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let r = c.get(format!("{base}/v2/ghcr.io/team/app/blobs/{layer_digest}")).send().await.expect("layer");
    assert_eq!(r.status(), 200);
    assert_eq!(sha(&r.bytes().await.expect("layer body within 1 s")), sha(layer));
    took.push(t.elapsed());
    took
}

/// Class 3: silent connections cannot lock anyone out. The connection cap is held by sockets
/// that never send a byte, re-opened as soon as they are closed, from one address and then
/// from 20 loopback addresses: `/healthz` and a pull still succeed within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_serve_healthz_and_a_pull_while_silent_sockets_hold_the_connection_cap() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let layer = random_bytes(256 * 1024, 31);
    let ld = fake.add_blob(layer.clone());
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{ld}","size":{}}},"layers":[]}}"#,
        layer.len()
    );
    fake.add_manifest("team/app", "v1", "application/vnd.oci.image.manifest.v1+json", manifest.as_bytes());
    let limits = Limits { max_connections: 200, ..Limits::default() };
    let tender = secured(&fake, Security { limits, ..Security::default() }).await;
    let mut worst = Duration::ZERO;
    for addrs in [vec![loopback(1)], (2..22).map(loopback).collect::<Vec<_>>()] {
        let attack = Attack::start(tender.addr, &addrs, 260usize.div_ceil(addrs.len()));
        // The cap is held, and contested: more sockets were opened than it allows, twice over.
        let deadline = Instant::now() + Duration::from_secs(20);
        while attack.opened() < 600 {
            if Instant::now() > deadline {
                let m = tender.app.metrics().render();
                let refusals: Vec<&str> = m.lines().filter(|l| l.starts_with("tender_limit_refusals_total")).collect();
                panic!("the silent sockets never got going: {} opened; {refusals:?}", attack.opened());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for _ in 0..3 {
            for d in honest_round(format!("http://{}", tender.addr), layer.clone(), ld.clone()).await {
                worst = worst.max(d);
            }
        }
        eprintln!("{} address(es): {} silent sockets opened", addrs.len(), attack.opened());
    }
    eprintln!("slowest honest request: {worst:?}");
    assert!(worst < Duration::from_secs(1));
}

fn loopback(n: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, n])
}

/// Read until the server closes the connection; how long that took (None: not within `limit`).
async fn closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
}

/// Class 3, the deadlines: a socket that never sends a byte is closed after the first-byte
/// timeout, one that stops halfway through its head after the header timeout (from the
/// connection's start), a keep-alive connection with nothing in progress after the idle time.
#[tokio::test]
async fn should_close_silent_half_sent_and_idle_connections_at_their_deadlines() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let limits = Limits {
        first_byte_timeout: Duration::from_millis(300),
        header_timeout: Duration::from_millis(800),
        idle_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let tender = secured(&fake, Security { limits, ..Security::default() }).await;
    let mut silent = tokio::net::TcpStream::connect(tender.addr).await.unwrap();
    let mut half = tokio::net::TcpStream::connect(tender.addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n").await.unwrap();
    let mut idle = tokio::net::TcpStream::connect(tender.addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").await.unwrap();
    let mut h2 = tokio::net::TcpStream::connect(tender.addr).await.unwrap();
    // The HTTP/2 preface and nothing more: protocol detection does not wait forever.
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    // Half the preface and nothing more: neither HTTP/1 nor HTTP/2 yet; closed at the
    // first-byte deadline like a silent socket.
    let mut part = tokio::net::TcpStream::connect(tender.addr).await.unwrap();
    part.write_all(b"PRI * HT").await.unwrap();
    let silent = closed_within(&mut silent, Duration::from_secs(5)).await.expect("silent socket closed");
    let half = closed_within(&mut half, Duration::from_secs(5)).await.expect("half-sent head closed");
    let idle = closed_within(&mut idle, Duration::from_secs(5)).await.expect("idle keep-alive closed");
    let h2 = closed_within(&mut h2, Duration::from_secs(5)).await.expect("HTTP/2 without a request closed");
    let part = closed_within(&mut part, Duration::from_secs(5)).await.expect("half a preface closed");
    eprintln!("closed after: silent {silent:?}, half {half:?}, idle {idle:?}, h2 {h2:?}, part {part:?}");
    assert!(silent < Duration::from_secs(2) && half < Duration::from_secs(3) && idle < Duration::from_secs(3));
    assert!(part < Duration::from_secs(2));
    let text = metrics_text(&tender).await;
    assert!(text.contains("tender_limit_refusals_total{limit=\"first_byte_timeout\"} 2"), "{text}");
}

/// A registry that lies with numbers, words and sizes, one behaviour per test.
mod liar {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use axum::body::Body;
    use axum::extract::{Request, State};
    use axum::http::{header, StatusCode};
    use axum::response::{IntoResponse, Response};

    #[derive(Default)]
    pub struct Liar {
        /// The token endpoint's whole answer.
        pub token_body: Mutex<String>,
        /// Where the 401 challenge sends the client for a token (default: this server).
        pub realm: Mutex<Option<String>>,
        /// The next this many blob GETs answer 429 with this Retry-After.
        pub too_many: Mutex<Option<(u64, String)>>,
        /// Manifests: (repo, reference) -> body, served as an OCI manifest.
        pub manifests: Mutex<Vec<(String, String, bytes::Bytes)>>,
        pub blobs: Mutex<Vec<(String, bytes::Bytes)>>,
        pub authorizations: Mutex<Vec<(String, String)>>,
        /// Image Factory assets by path, served without authentication.
        pub assets: Mutex<Vec<(String, bytes::Bytes)>>,
        /// Manifest GETs send their headers and a few bytes, then nothing, for ever.
        pub wedge_manifests: std::sync::atomic::AtomicBool,
        /// Manifest HEADs announce this digest (a tag that moved).
        pub head_digest: Mutex<Option<String>>,
        /// The token endpoint's body never ends.
        pub endless_token: std::sync::atomic::AtomicBool,
        /// The Content-Type manifests are sent with (default: the OCI manifest type).
        pub manifest_content_type: Mutex<Option<String>>,
        /// Blobs go out as a stream without a Content-Length (the end is the end of the body).
        pub unsized_blobs: std::sync::atomic::AtomicBool,
        pub requests: AtomicU64,
    }

    pub async fn start() -> (SocketAddr, Arc<Liar>) {
        start_on([127, 0, 0, 1]).await
    }

    pub async fn start_on(ip: [u8; 4]) -> (SocketAddr, Arc<Liar>) {
        let state = Arc::new(Liar {
            token_body: Mutex::new(r#"{"token":"t0ken","expires_in":300}"#.to_string()),
            ..Liar::default()
        });
        let listener = tokio::net::TcpListener::bind(SocketAddr::from((ip, 0))).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(handle).with_state(state.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (addr, state)
    }

    async fn handle(State(s): State<Arc<Liar>>, req: Request) -> Response {
        s.requests.fetch_add(1, Ordering::SeqCst);
        let path = req.uri().path().to_string();
        let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        if let Some(a) = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
            s.authorizations.lock().unwrap().push((host.clone(), a.to_string()));
        }
        if let Some(b) = s.assets.lock().unwrap().iter().find(|(p, _)| *p == path).map(|(_, b)| b.clone()) {
            return b.into_response();
        }
        if path == "/token" && s.endless_token.load(Ordering::SeqCst) {
            let chunk = bytes::Bytes::from(vec![b' '; 64 * 1024]);
            let endless = futures::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
            return ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(endless)).into_response();
        }
        if path == "/token" {
            return ([(header::CONTENT_TYPE, "application/json")], s.token_body.lock().unwrap().clone())
                .into_response();
        }
        let authorized = req.headers().get(header::AUTHORIZATION).is_some_and(|v| v.as_bytes().starts_with(b"Bearer "));
        if !authorized {
            let realm = s.realm.lock().unwrap().clone().unwrap_or_else(|| format!("http://{host}/token"));
            return Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header(header::WWW_AUTHENTICATE, format!(r#"Bearer realm="{realm}",service="liar""#))
                .body(Body::empty())
                .unwrap();
        }
        if let Some((repo, reference)) = path.strip_prefix("/v2/").and_then(|p| p.rsplit_once("/manifests/")) {
            let found = s
                .manifests
                .lock()
                .unwrap()
                .iter()
                .find(|(r, t, _)| r == repo && t == reference)
                .map(|(_, _, b)| b.clone());
            if req.method() == axum::http::Method::HEAD {
                if let Some(d) = s.head_digest.lock().unwrap().clone() {
                    return Response::builder()
                        .header(header::CONTENT_TYPE, "application/vnd.oci.image.manifest.v1+json")
                        .header("docker-content-digest", d)
                        .body(Body::empty())
                        .unwrap();
                }
            }
            if s.wedge_manifests.load(Ordering::SeqCst) {
                let first = futures::stream::once(async { Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"{")) });
                let never = futures::stream::pending();
                return Response::builder()
                    .header(header::CONTENT_TYPE, "application/vnd.oci.image.manifest.v1+json")
                    .body(Body::from_stream(futures::StreamExt::chain(first, never)))
                    .unwrap();
            }
            let ct = s
                .manifest_content_type
                .lock()
                .unwrap()
                .clone()
                .unwrap_or_else(|| "application/vnd.oci.image.manifest.v1+json".to_string());
            return match found {
                Some(b) => Response::builder()
                    .header(header::CONTENT_TYPE, ct)
                    .header(
                        "docker-content-digest",
                        format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&b))),
                    )
                    .body(Body::from(b))
                    .unwrap(),
                None => StatusCode::NOT_FOUND.into_response(),
            };
        }
        if let Some((_, digest)) = path.strip_prefix("/v2/").and_then(|p| p.rsplit_once("/blobs/")) {
            {
                let mut t = s.too_many.lock().unwrap();
                if let Some((n, after)) = t.as_mut() {
                    if *n > 0 {
                        *n -= 1;
                        return Response::builder()
                            .status(StatusCode::TOO_MANY_REQUESTS)
                            .header(header::RETRY_AFTER, after.clone())
                            .body(Body::empty())
                            .unwrap();
                    }
                }
            }
            let found = s.blobs.lock().unwrap().iter().find(|(d, _)| d == digest).map(|(_, b)| b.clone());
            return match found {
                Some(b) if s.unsized_blobs.load(Ordering::SeqCst) => {
                    let pieces: Vec<_> =
                        b.chunks(4096).map(|c| Ok::<_, std::io::Error>(bytes::Bytes::copy_from_slice(c))).collect();
                    Body::from_stream(futures::stream::iter(pieces)).into_response()
                }
                Some(b) => b.into_response(),
                None => StatusCode::NOT_FOUND.into_response(),
            };
        }
        StatusCode::NOT_FOUND.into_response()
    }
}

async fn in_front_of_liar(addr: SocketAddr) -> Tender {
    let ups = vec![upstream_settings("liar.example", &format!("http://{addr}"))];
    Tender::start_full(ups, None, fast_settings(), Security::default(), None, Surface::All).await
}

/// Class 7: numbers from an upstream never panic tender. A token that lives for u64::MAX
/// seconds and a `Retry-After` of u64::MAX seconds are capped; the manifest is served, twice
/// (a fetch that failed leaves nothing behind that wedges the next); the 429 reaches the
/// client with a `Retry-After` of at most 5 minutes, and the blob is served once the upstream
/// relents.
#[tokio::test]
async fn should_survive_absurd_numbers_from_an_upstream() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (addr, liar) = liar::start().await;
    *liar.token_body.lock().unwrap() = format!(r#"{{"token":"t0ken","expires_in":{}}}"#, u64::MAX);
    let manifest = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":1},"layers":[]}"#;
    liar.manifests.lock().unwrap().push(("a/b".into(), "v1".into(), bytes::Bytes::from_static(manifest)));
    let blob = random_bytes(10_000, 71);
    let bd = sha(&blob);
    liar.blobs.lock().unwrap().push((bd.clone(), blob.clone()));
    *liar.too_many.lock().unwrap() = Some((1, u64::MAX.to_string()));
    let tender = in_front_of_liar(addr).await;
    for round in 0..2 {
        let got = get(&tender.url("/v2/liar.example/a/b/manifests/v1"), &[]).await;
        assert_eq!(got.status, 200, "round {round}: {:?}", got.body);
    }
    let r = client().get(tender.url(&format!("/v2/liar.example/a/b/blobs/{bd}"))).send().await.expect("an answer");
    assert_eq!(r.status(), 429);
    let after: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(after <= 300, "Retry-After {after}");
    let got = get(&tender.url(&format!("/v2/liar.example/a/b/blobs/{bd}")), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(&got.body.unwrap()), bd);
}

/// A client whose connections come from `ip` (127.0.0.0/8).
fn client_from(ip: IpAddr) -> reqwest::Client {
    reqwest::Client::builder().no_proxy().local_address(ip).timeout(Duration::from_secs(30)).build().unwrap()
}

/// Class 13: login cost is not a weapon. An unknown user costs the same bcrypt as a wrong
/// password; an address that keeps failing is refused (429) without bcrypt, while a
/// credential already verified still passes from it; a flood of wrong passwords from many
/// addresses is refused at the bcrypt queue's limit instead of queueing without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_bound_the_cost_of_failed_logins() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let users = std::collections::HashMap::from([("worker".to_string(), bcrypt::hash("s3cret", 9).unwrap())]);
    let auth = tender_server::auth::ClientAuth::new(users, &[], false);
    let security = Security { auth: std::sync::RwLock::new(Some(Arc::new(auth))), ..Security::default() };
    let tender = secured(&fake, security).await;
    let url = tender.url("/v2/");
    let timed = |c: reqwest::Client, user: &'static str, pass: &'static str| {
        let url = url.clone();
        async move {
            let t = Instant::now();
            let status = c.get(&url).basic_auth(user, Some(pass)).send().await.unwrap().status().as_u16();
            (status, t.elapsed())
        }
    };
    // An unknown user takes as long as a wrong password (medians of 5, from fresh addresses).
    let mut wrong = Vec::new();
    let mut unknown = Vec::new();
    for _ in 0..5 {
        let (s, d) = timed(client_from(loopback(2)), "worker", "guess").await;
        assert_eq!(s, 401);
        wrong.push(d);
        let (s, d) = timed(client_from(loopback(3)), "mallory", "guess").await;
        assert_eq!(s, 401);
        unknown.push(d);
    }
    wrong.sort();
    unknown.sort();
    eprintln!("median wrong password {:?}, unknown user {:?}", wrong[2], unknown[2]);
    assert!(unknown[2] * 2 >= wrong[2], "unknown user {:?} vs wrong password {:?}", unknown[2], wrong[2]);

    // The right password once, from another address: verified and remembered.
    assert_eq!(timed(client_from(loopback(5)), "worker", "s3cret").await.0, 200);
    // One address keeps guessing: refused without bcrypt after a few, with a Retry-After.
    let guesser = client_from(loopback(4));
    let mut statuses = Vec::new();
    for _ in 0..30 {
        let r = guesser.get(&url).basic_auth("worker", Some("guess")).send().await.unwrap();
        if r.status() == 429 {
            assert!(r.headers().contains_key("retry-after"));
        }
        statuses.push(r.status().as_u16());
    }
    assert!(statuses.contains(&429), "never rate-limited: {statuses:?}");
    // The verified credential passes from the limited address.
    assert_eq!(timed(guesser.clone(), "worker", "s3cret").await.0, 200);

    // A flood of wrong passwords from 20 addresses at once: bounded, never an endless queue.
    let started = Instant::now();
    let flood = (10..30)
        .flat_map(|n| (0..8).map(move |_| n))
        .map(|n| {
            let (c, url) = (client_from(loopback(n)), url.clone());
            tokio::spawn(async move { c.get(&url).basic_auth("worker", Some("flood")).send().await.unwrap().status() })
        })
        .collect::<Vec<_>>();
    let mut busy = 0;
    for f in flood {
        if f.await.unwrap() == 429 {
            busy += 1;
        }
    }
    eprintln!("flood of 160: {busy} refused at the queue or rate limit, {:?}", started.elapsed());
    assert!(busy > 0, "the bcrypt queue never refused");
    let text = tender.app.metrics().render();
    assert!(text.contains("tender_auth_refusals_total{reason=\"rate_limited\"}"), "{text}");
}

/// Issue 32 (5): a login flood does not lock real users out. 60 addresses keep sending
/// unknown users and wrong passwords, four at a time each, for as long as the test runs; a user
/// who logged in before the flood logs in 24 times over 30 s, each time after a reload (SIGHUP:
/// nothing verified is remembered, so every login runs bcrypt), and every login succeeds. A busy
/// refusal counts against its address, each address has a bounded share of the queue, and a
/// user who logged in within the hour has a lane of its own. Before: the real user got 429s.
#[tokio::test]
async fn should_let_real_users_log_in_during_a_login_flood() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let users = std::collections::HashMap::from([("worker".to_string(), bcrypt::hash("s3cret", 10).unwrap())]);
    let auth = tender_server::auth::ClientAuth::new(users.clone(), &[], false);
    let security = Security { auth: std::sync::RwLock::new(Some(Arc::new(auth))), ..Security::default() };
    let tender = secured(&fake, security).await;
    let url = tender.url("/v2/");
    let real = client_from(loopback(250));
    let login = |c: &reqwest::Client| c.get(&url).basic_auth("worker", Some("s3cret")).send();
    assert_eq!(login(&real).await.unwrap().status(), 200, "logged in before the flood");

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood: Vec<_> = (10..70u8)
        .flat_map(|n| (0..4).map(move |i| (n, i)))
        .map(|(n, i)| {
            let (c, url, stop) = (client_from(loopback(n)), url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut sent = 0u32;
                while !stop.load(Ordering::SeqCst) && sent < 100_000 {
                    let user = if i % 2 == 0 { "mallory" } else { "worker" };
                    if let Ok(r) = c.get(&url).basic_auth(user, Some("flood")).send().await {
                        let _ = r.bytes().await;
                    }
                    sent += 1;
                }
                sent
            })
        })
        .collect();
    let mut refused = Vec::new();
    for i in 0..24 {
        tokio::time::sleep(Duration::from_millis(1250)).await;
        // A reload: nothing verified is remembered, who logged in lately is.
        let old = tender.app.security().auth().unwrap();
        let fresh = Arc::new(tender_server::auth::ClientAuth::new(users.clone(), &[], false));
        fresh.inherit(&old);
        tender.app.security().set_auth(Some(fresh));
        let status = login(&real).await.unwrap().status();
        if status != 200 {
            refused.push((i, status.as_u16()));
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut sent = 0;
    for f in flood {
        sent += f.await.unwrap();
    }
    eprintln!("flood: {sent} requests from 60 addresses; real user refused: {refused:?}");
    assert!(refused.is_empty(), "the real user was refused during the flood: {refused:?}");
    let text = tender.app.metrics().render();
    assert!(text.contains("tender_auth_refusals_total{reason=\"busy\"}"), "the flood kept the queue busy: {text}");
}

/// Issue 32 (11): a short range asked during the first fetch of a blob is not answered with
/// bytes that have not verified. The liar sends other bytes (with a length) under a digest; a
/// client asks for its first 1,000 bytes while the fill runs: with the default
/// (`rangeBeforeVerify: false`) not one byte of the lie reaches it (the range waits for the
/// verdict, which fails); an upstream marked `rangeBeforeVerify: true` is trusted with exactly
/// that, and its honest blob's range arrives before the fill ends.
#[tokio::test]
async fn should_hold_a_range_of_an_unverified_fill_until_it_verified() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (addr, liar) = liar::start().await;
    let lie = random_bytes(300_000, 84);
    let claimed = sha(&random_bytes(300_000, 85));
    let honest = random_bytes(300_000, 86);
    let hd = sha(&honest);
    liar.blobs.lock().unwrap().extend([(claimed.clone(), lie.clone()), (hd.clone(), honest.clone())]);
    let mut trusted = upstream_settings("trusted.example", &format!("http://{addr}"));
    trusted.range_before_verify = true;
    let ups = vec![upstream_settings("liar.example", &format!("http://{addr}")), trusted];
    let tender = Tender::start_full(ups, None, fast_settings(), Security::default(), None, Surface::All).await;
    let range = |up: &str, d: &str| {
        client().get(tender.url(&format!("/v2/{up}/a/b/blobs/{d}"))).header("range", "bytes=0-999").send()
    };
    let r = range("liar.example", &claimed).await.unwrap();
    let got = match r.status().as_u16() {
        206 => r.bytes().await.map(|b| b.to_vec()).unwrap_or_default(),
        _ => Vec::new(),
    };
    assert!(got.is_empty() || got[..] != lie[..got.len()], "unverified bytes of a lie went out as a range");
    assert!(got.len() < 1000 || got[..] != lie[..1000], "a complete range of the lie was served");
    // A range to the end (a child tier resuming) streams, but never arrives whole: its final
    // byte waits for the verdict, as a full body's does (issue 38).
    let claimed2 = sha(&random_bytes(300_000, 88));
    liar.blobs.lock().unwrap().push((claimed2.clone(), lie.clone()));
    let r = client()
        .get(tender.url(&format!("/v2/liar.example/a/b/blobs/{claimed2}")))
        .header("range", "bytes=1000-")
        .send()
        .await
        .unwrap();
    let whole = match r.status().as_u16() {
        206 => r.bytes().await.is_ok_and(|b| b.len() == lie.len() - 1000),
        _ => false,
    };
    assert!(!whole, "a range to the end of a lie arrived complete");
    // Trusted: the range is the upstream's bytes as they come (the honest blob's first 1,000).
    let r = range("trusted.example", &hd).await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(r.bytes().await.unwrap().to_vec(), honest[..1000].to_vec());
    // And by default an honest blob's range arrives once it verified, whole.
    let honest2 = random_bytes(300_000, 87);
    let hd2 = sha(&honest2);
    liar.blobs.lock().unwrap().push((hd2.clone(), honest2.clone()));
    let r = range("liar.example", &hd2).await.unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(r.bytes().await.unwrap().to_vec(), honest2[..1000].to_vec());
    // And an honest one's range to the end arrives whole.
    let honest3 = random_bytes(300_000, 89);
    let hd3 = sha(&honest3);
    liar.blobs.lock().unwrap().push((hd3.clone(), honest3.clone()));
    let r = client()
        .get(tender.url(&format!("/v2/liar.example/a/b/blobs/{hd3}")))
        .header("range", "bytes=1000-")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(r.bytes().await.unwrap().to_vec(), honest3[1000..].to_vec());
}

const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";

/// An xz stream whose header asks for a `dict` byte dictionary, around a little data.
fn xz_with_dictionary(dict: u32, data: &[u8]) -> bytes::Bytes {
    use std::io::Write as _;
    let mut opts = liblzma::stream::LzmaOptions::new_preset(1).unwrap();
    opts.dict_size(dict);
    let mut filters = liblzma::stream::Filters::new();
    filters.lzma2(&opts);
    let stream = liblzma::stream::Stream::new_stream_encoder(&filters, liblzma::stream::Check::Crc64).unwrap();
    let mut e = liblzma::write::XzEncoder::new_stream(Vec::new(), stream);
    e.write_all(data).unwrap();
    bytes::Bytes::from(e.finish().unwrap())
}

/// `n` zero bytes, gzip-compressed (about 1000:1).
fn gzip_zeros(n: usize) -> bytes::Bytes {
    use std::io::Write as _;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..n >> 20 {
        e.write_all(&zeros).unwrap();
    }
    bytes::Bytes::from(e.finish().unwrap())
}

/// A zstd frame that declares a 2^30 byte window.
fn zstd_with_window_log(log: u32, data: &[u8]) -> bytes::Bytes {
    use std::io::Write as _;
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    e.include_checksum(true).unwrap();
    e.window_log(log).unwrap();
    e.long_distance_matching(true).unwrap();
    e.write_all(data).unwrap();
    bytes::Bytes::from(e.finish().unwrap())
}

/// Class 8: decompression bombs. The container check of an asset runs with decoder memory
/// limits and an absolute decoded-size cap: an xz stream asking for a 768 MiB dictionary, a
/// zstd frame with a 1 GiB window and a gzip that decompresses past the cap are refused, not
/// stored, two at a time with RSS under 512 MiB; an honest asset next to them is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_refuse_decompression_bombs_within_bounded_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (addr, liar) = liar::start().await;
    let data = random_bytes(64 * 1024, 81);
    let honest = xz_with_dictionary(1 << 20, &data);
    let bombs = [
        ("metal-amd64.raw.xz", xz_with_dictionary(768 << 20, &data)),
        ("metal-arm64.raw.zst", zstd_with_window_log(30, &data)),
        ("metal-amd64.raw.gz", gzip_zeros(96 << 20)),
    ];
    let path = |asset: &str| format!("/image/{SCHEMATIC}/v1.13.6/{asset}");
    for (asset, body) in &bombs {
        liar.assets.lock().unwrap().push((path(asset), body.clone()));
    }
    liar.assets.lock().unwrap().push((path("openstack-amd64.raw.xz"), honest.clone()));
    let settings = tender_fetch::FetchSettings { max_decoded_size: 64 << 20, attempts: 1, ..fast_settings() };
    let tender = Tender::start_with_factory(vec![], Some(format!("http://{addr}")), settings).await;
    let before = rss();
    for pair in bombs.chunks(2) {
        let asks = pair
            .iter()
            .map(|(asset, _)| {
                let url = tender.url(&path(asset));
                tokio::spawn(async move { get(&url, &[]).await })
            })
            .collect::<Vec<_>>();
        for (ask, (asset, _)) in asks.into_iter().zip(pair) {
            let got = ask.await.unwrap();
            let whole = got.status == 200 && got.body.is_ok();
            assert!(!whole, "{asset}: a bomb was served whole");
        }
    }
    tender.wait_idle().await;
    let after = rss();
    eprintln!("RSS {} -> {} MiB", before >> 20, after >> 20);
    assert!(after < 512 << 20, "RSS {after}");
    assert!(tender.store.list_objects().unwrap().is_empty(), "a bomb was stored");
    let got = get(&tender.url(&path("openstack-amd64.raw.xz")), &[]).await;
    assert_eq!(got.status, 200);
    assert_eq!(sha(&got.body.unwrap()), sha(&honest));
}

/// Class 5: upstream credentials go only to the upstream's own hosts and to its
/// `tokenRealmHosts`. A registry whose challenge names a token realm on another host gets its
/// token asked for without credentials; listed in `tokenRealmHosts`, the realm gets them.
#[tokio::test]
async fn should_send_upstream_credentials_only_to_its_own_hosts_and_token_realm_hosts() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (up_addr, registry) = liar::start().await;
    let (realm_addr, realm) = liar::start_on([127, 0, 0, 7]).await;
    *registry.realm.lock().unwrap() = Some(format!("http://{realm_addr}/token"));
    let blob = random_bytes(4096, 51);
    let bd = sha(&blob);
    registry.blobs.lock().unwrap().push((bd.clone(), blob));
    let mut up = upstream_settings("private.example", &format!("http://{up_addr}"));
    up.credentials = Some(tender_fetch::Credentials { username: "robot".into(), password: "upstream-secret".into() });
    up.public = true;
    let tender = Tender::start(vec![up.clone()], fast_settings()).await;
    let got = get(&tender.url(&format!("/v2/private.example/a/b/blobs/{bd}")), &[]).await;
    assert_eq!(got.status, 200, "the token is fetched without credentials: {:?}", got.body);
    let sent: Vec<_> = realm.authorizations.lock().unwrap().clone();
    assert!(sent.is_empty(), "credentials went to a foreign token realm: {sent:?}");

    // Listed: the realm gets them.
    up.token_realm_hosts = vec!["127.0.0.7".into()];
    let tender = Tender::start(vec![up], fast_settings()).await;
    let got = get(&tender.url(&format!("/v2/private.example/a/b/blobs/{bd}")), &[]).await;
    assert_eq!(got.status, 200);
    let sent: Vec<_> = realm.authorizations.lock().unwrap().clone();
    assert!(sent.iter().any(|(_, a)| a.starts_with("Basic ")), "{sent:?}");
}

/// Class 6: upstream bodies are bounded in size and time. A tag whose upstream sends headers
/// and then nothing is served stale (as when the upstream is down), to every client waiting
/// for it, within the stall timeout; a token response that never ends is cut off at its size
/// cap, and the request fails instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn should_bound_upstream_bodies_in_size_and_time() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (addr, liar) = liar::start().await;
    let manifest = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","size":1},"layers":[]}"#;
    liar.manifests.lock().unwrap().push(("a/b".into(), "v1".into(), bytes::Bytes::from_static(manifest)));
    let settings = tender_fetch::FetchSettings { tag_ttl: Duration::ZERO, ..fast_settings() };
    let ups = vec![upstream_settings("liar.example", &format!("http://{addr}"))];
    let tender = Tender::start_full(ups, None, settings, Security::default(), None, Surface::All).await;
    let url = tender.url("/v2/liar.example/a/b/manifests/v1");
    assert_eq!(get(&url, &[]).await.status, 200);
    // The tag moves, and the new manifest's body never comes.
    *liar.head_digest.lock().unwrap() = Some(format!("sha256:{}", "2".repeat(64)));
    liar.wedge_manifests.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let waiting = (0..4)
        .map(|_| {
            let c = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(20)).build().unwrap();
            let url = url.clone();
            tokio::spawn(async move {
                let r = c.get(&url).send().await.map_err(|e| e.to_string())?;
                let status = r.status().as_u16();
                let body = r.bytes().await.map_err(|e| e.to_string())?;
                Ok::<_, String>((status, body))
            })
        })
        .collect::<Vec<_>>();
    for w in waiting {
        let (status, body) = w.await.unwrap().expect("answered before the client gave up");
        assert_eq!(status, 200);
        assert_eq!(&body[..], &manifest[..], "the last known manifest, served stale");
    }
    let stale_after = started.elapsed();
    eprintln!("wedged tag served stale to 4 clients after {stale_after:?}");
    assert!(stale_after < Duration::from_secs(10));

    // A token response that never ends.
    liar.endless_token.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let c = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(20)).build().unwrap();
    let r = c.get(tender.url("/v2/liar.example/c/d/manifests/v1")).send().await.expect("answered");
    eprintln!("endless token response: {} after {:?}", r.status(), started.elapsed());
    assert!(r.status().is_client_error() || r.status().is_server_error());
}

/// Class 12: anonymous clients learn nothing they may not pull. With client authentication
/// and `anonymousPull`, the status page and `/api/v1/served` show an anonymous client neither
/// the private upstream nor its repositories nor any upstream URL; `/metrics` needs an
/// identity; error bodies name upstreams, never their URLs.
#[tokio::test]
async fn should_show_anonymous_clients_only_what_they_may_pull() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let d = fake.add_blob(random_bytes(1000, 91));
    let mut private = upstream_settings("private.example", &fake.url());
    private.credentials = Some(tender_fetch::Credentials { username: "robot".into(), password: "pw".into() });
    // An upstream that is down: its errors carry the URL tender could not reach.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let down = upstream_settings("down.example", &format!("http://{closed}"));
    let users = std::collections::HashMap::from([("worker".to_string(), bcrypt::hash("s3cret", 4).unwrap())]);
    let auth = tender_server::auth::ClientAuth::new(users, &[], true);
    let security = Security { auth: std::sync::RwLock::new(Some(Arc::new(auth))), ..Security::default() };
    let ups = vec![upstream_settings("ghcr.io", &fake.url()), private, down];
    let tender = Tender::start_full(ups, None, fast_settings(), security, None, Surface::All).await;
    let authed = client()
        .get(tender.url(&format!("/v2/private.example/team/secret-app/blobs/{d}")))
        .basic_auth("worker", Some("s3cret"))
        .send()
        .await
        .unwrap();
    assert_eq!(authed.status(), 200);
    authed.bytes().await.unwrap();
    assert_eq!(get(&tender.url(&format!("/v2/ghcr.io/team/public-app/blobs/{d}")), &[]).await.status, 200);
    let fake_addr = fake.addr.to_string();
    let secrets = ["private.example", "secret-app", fake_addr.as_str()];
    for path in ["/", "/api/v1/served"] {
        let got = get(&tender.url(path), &[]).await;
        assert_eq!(got.status, 200, "{path}");
        let text = String::from_utf8_lossy(&got.body.unwrap()).into_owned();
        assert!(text.contains("public-app"), "{path} shows what anonymous clients pull: {text}");
        for s in secrets {
            assert!(!text.contains(s), "{path} shows {s} to an anonymous client: {text}");
        }
    }
    assert_eq!(get(&tender.url("/metrics"), &[]).await.status, 401, "/metrics needs an identity");
    let as_worker = client().get(tender.url("/")).basic_auth("worker", Some("s3cret")).send().await.unwrap();
    assert!(as_worker.text().await.unwrap().contains("secret-app"), "an authenticated client sees everything");
    let err = get(&tender.url("/v2/down.example/a/b/manifests/v1"), &[]).await;
    assert!(err.status >= 500, "{err:?}");
    let text = String::from_utf8_lossy(&err.body.unwrap()).into_owned();
    assert!(text.contains("down.example") && !text.contains(&closed.to_string()), "{text}");
}

/// Class 11: anonymous clients can neither pin nor pollute the statistics. With client
/// authentication configured, `X-Tender-Prefetch` and `X-Tender-Pin` from an anonymous client
/// are ignored (its pull counts as a pull and pins nothing), an authenticated one's are
/// honoured; served statistics count only repositories that answered 2xx, and hold at most
/// a fixed number of entries however many names are asked for.
#[tokio::test]
async fn should_let_only_authenticated_clients_pin_and_keep_served_statistics_bounded() {
    let _one = ONE_AT_A_TIME.lock().await;
    let fake = FakeUpstream::start().await;
    let a = fake.add_blob(random_bytes(1000, 111));
    let b = fake.add_blob(random_bytes(1000, 112));
    let users = std::collections::HashMap::from([("worker".to_string(), bcrypt::hash("s3cret", 4).unwrap())]);
    let auth = tender_server::auth::ClientAuth::new(users, &[], true);
    let security = Security { auth: std::sync::RwLock::new(Some(Arc::new(auth))), ..Security::default() };
    let tender = secured(&fake, security).await;
    let pin = [("x-tender-prefetch", "1"), ("x-tender-pin", "1")];
    assert_eq!(get(&tender.url(&format!("/v2/ghcr.io/anon/app/blobs/{a}")), &pin).await.status, 200);
    assert!(!tender.store.is_pinned(&a.parse().unwrap()), "an anonymous client pinned an object");
    let served = tender.app.metrics().served.get("ghcr.io/anon/app");
    assert!(served.served, "an anonymous prefetch counts as a pull");
    let r = client()
        .get(tender.url(&format!("/v2/ghcr.io/ops/app/blobs/{b}")))
        .basic_auth("worker", Some("s3cret"))
        .header("x-tender-prefetch", "1")
        .header("x-tender-pin", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    assert!(tender.store.is_pinned(&b.parse().unwrap()), "an authenticated prefetch pins");
    // Not-modified and not-found answers are not counted.
    let etag = format!("\"{a}\"");
    let c = client();
    let r = c
        .get(tender.url(&format!("/v2/ghcr.io/etag/app/blobs/{a}")))
        .header("if-none-match", etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    let missing = format!("sha256:{}", "4".repeat(64));
    assert_eq!(get(&tender.url(&format!("/v2/ghcr.io/nope/app/blobs/{missing}")), &[]).await.status, 404);
    // Distinct names for a blob every repository name answers: the entries stop at the cap.
    let names = futures::stream::iter(0..(tender_server::served::MAX_REPOSITORIES + 100))
        .map(|i| {
            let (c, url) = (c.clone(), tender.url(&format!("/v2/ghcr.io/junk/n{i}/blobs/{a}")));
            async move {
                let r = c.get(&url).send().await.unwrap();
                let status = r.status().as_u16();
                r.bytes().await.unwrap();
                status
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    assert!(names.iter().all(|s| *s == 200));
    let all = tender.app.metrics().served.snapshot();
    assert!(!all.contains_key("ghcr.io/etag/app") && !all.contains_key("ghcr.io/nope/app"), "{:?}", all.keys());
    assert!(all.len() <= tender_server::served::MAX_REPOSITORIES, "{} entries", all.len());
    // Issue 32 (8): hits under made-up names confirm nothing and take no place, so a
    // repository its upstream confirms after the flood is still counted.
    assert!(!all.keys().any(|k| k.starts_with("ghcr.io/junk/")), "{} made-up names counted", all.len());
    let fresh = fake.add_blob(random_bytes(1000, 113));
    assert_eq!(get(&tender.url(&format!("/v2/ghcr.io/real/app/blobs/{fresh}")), &[]).await.status, 200);
    assert!(tender.app.metrics().served.get("ghcr.io/real/app").served, "a confirmed repository is counted");
}

/// Low: a manifest is served with the media type it was verified as, never the upstream's
/// Content-Type, and with `X-Content-Type-Options: nosniff`; a body that declares a type that
/// is not a manifest's is refused.
#[tokio::test]
async fn should_serve_manifests_with_their_verified_media_type_only() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (addr, liar) = liar::start().await;
    *liar.manifest_content_type.lock().unwrap() = Some("text/html; charset=utf-8".into());
    let manifest = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:3333333333333333333333333333333333333333333333333333333333333333","size":1},"layers":[]}"#;
    let html = br#"{"schemaVersion":2,"mediaType":"text/html","layers":[],"x":"<script>alert(1)</script>"}"#;
    liar.manifests.lock().unwrap().push(("a/b".into(), "v1".into(), bytes::Bytes::from_static(manifest)));
    liar.manifests.lock().unwrap().push(("a/b".into(), "html".into(), bytes::Bytes::from_static(html)));
    let tender = in_front_of_liar(addr).await;
    let r = client().get(tender.url("/v2/liar.example/a/b/manifests/v1")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(r.headers().get("x-content-type-options").map(|v| v.to_str().unwrap()), Some("nosniff"));
    let r = client().get(tender.url("/v2/liar.example/a/b/manifests/html")).send().await.unwrap();
    assert!(r.status().is_server_error(), "a text/html manifest was served: {}", r.status());
    // Issue 32 (10): JSON without `mediaType` is a manifest only with a manifest's or an index's
    // structure, whatever Content-Type the upstream gives it.
    *liar.manifest_content_type.lock().unwrap() = Some("application/vnd.oci.image.manifest.v1+json".into());
    let shapeless = br#"{"schemaVersion":2,"hello":"<b>world</b>"}"#;
    liar.manifests.lock().unwrap().push(("a/b".into(), "shapeless".into(), bytes::Bytes::from_static(shapeless)));
    let r = client().get(tender.url("/v2/liar.example/a/b/manifests/shapeless")).send().await.unwrap();
    assert!(r.status().is_server_error(), "JSON without a manifest's structure was served: {}", r.status());
}

/// Low item: a body whose upstream sent no length is never delivered complete before it
/// verified. An HTTP/1.1 client gets it chunked, and the closing chunk only after the
/// verdict; an HTTP/1.0 client, whose body ends where the connection closes (a cut reads as
/// the end), gets the object only once it verified, with its length.
#[tokio::test]
async fn should_never_end_an_unsized_body_before_it_verified() {
    let _one = ONE_AT_A_TIME.lock().await;
    let (addr, liar) = liar::start().await;
    liar.unsized_blobs.store(true, Ordering::SeqCst);
    let honest = random_bytes(300_000, 81);
    let hd = sha(&honest);
    let lie = random_bytes(300_000, 82);
    let claimed = sha(&random_bytes(300_000, 83));
    liar.blobs.lock().unwrap().extend([(hd.clone(), honest.clone()), (claimed.clone(), lie.clone())]);
    let tender = in_front_of_liar(addr).await;
    let taddr = tender.addr;
    let ask = |digest: &str, version: &str| {
        format!("GET /v2/liar.example/a/b/blobs/{digest} {version}\r\nHost: tender\r\nConnection: close\r\n\r\n")
    };

    let out = raw(taddr, ask(&claimed, "HTTP/1.0").as_bytes()).await;
    let text = String::from_utf8_lossy(&out);
    assert!(!text.starts_with("HTTP/1.0 200") && !text.starts_with("HTTP/1.1 200"), "{}", &text[..text.len().min(300)]);
    assert!(!out.windows(4096).any(|w| lie.windows(4096).next() == Some(w)), "a byte of the lie went out");

    let out = raw(taddr, ask(&claimed, "HTTP/1.1").as_bytes()).await;
    let text = String::from_utf8_lossy(&out);
    assert!(!text.starts_with("HTTP/1.1 200") || !out.ends_with(b"\r\n0\r\n\r\n"), "a chunked lie ended cleanly");

    let out = raw(taddr, ask(&hd, "HTTP/1.0").as_bytes()).await;
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
    let head = String::from_utf8_lossy(&out[..split]).to_ascii_lowercase();
    assert!(head.starts_with("http/1.0 200") || head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains(&format!("content-length: {}", honest.len())), "{head}");
    assert_eq!(sha(&out[split..]), hd);
}
