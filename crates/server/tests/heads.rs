//! `limits.maxHeaderBytes` at its documented size, over HTTP/1.1 and HTTP/2 (issue 37, issue 41
//! item 6): a request head over the limit is refused with 431 and counted
//! (`tender_limit_refusals_total{limit="headers"}`) and access-logged whichever protocol carried
//! it, and a connection that keeps sending such heads is sent away.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod support;

use std::time::Duration;

use support::h2::*;
use support::*;
use tender_server::limits::Limits;
use tender_server::{Security, Surface};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn tender_with(fake: &FakeUpstream, limits: Limits) -> Tender {
    let ups = vec![upstream_settings("ghcr.io", &fake.url())];
    Tender::start_full(ups, None, fast_settings(), Security { limits, ..Security::default() }, None, Surface::All).await
}

fn refusals(tender: &Tender, limit: &str) -> u64 {
    let text = tender.app.metrics().render();
    let key = format!("tender_limit_refusals_total{{limit=\"{limit}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&key)).map_or(0, |v| v.trim().parse().unwrap())
}

/// An HTTP/1.1 GET of `/v2/` whose head (request line, headers, the blank line) is `size`
/// bytes; the status line of the answer and whether the connection then closed.
async fn h1_head_of(tender: &Tender, size: usize) -> (String, bool) {
    let start = "GET /v2/ HTTP/1.1\r\nHost: t\r\n";
    let filler = size - start.len() - "X-Fill: \r\n\r\n".len();
    let head = format!("{start}X-Fill: {}\r\n\r\n", "a".repeat(filler));
    assert_eq!(head.len(), size);
    let mut s = tokio::net::TcpStream::connect(tender.addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            // Still open: a keep-alive answer.
            Err(_) => break false,
        }
        if out.windows(4).any(|w| w == b"\r\n\r\n") && !out.starts_with(b"HTTP/1.1 431") {
            break false;
        }
    };
    let text = String::from_utf8_lossy(&out);
    (text.lines().next().unwrap_or("").to_string(), closed)
}

#[tokio::test]
async fn should_refuse_an_http1_head_over_max_header_bytes_at_that_size() {
    let fake = FakeUpstream::start().await;
    let tender = tender_with(&fake, Limits { max_header_bytes: 64 * 1024, ..Limits::default() }).await;
    let (under, _) = h1_head_of(&tender, 64 * 1024).await;
    assert!(under.starts_with("HTTP/1.1 200"), "a head of exactly the limit passes: {under}");
    for size in [64 * 1024 + 1, 100_000] {
        let (over, closed) = h1_head_of(&tender, size).await;
        assert!(over.starts_with("HTTP/1.1 431"), "a head of {size} bytes: {over}");
        assert!(closed, "the connection of a {size}-byte head is closed");
    }
    assert_eq!(refusals(&tender, "headers"), 2);
}

/// Send requests of 1,000 headers of 100 bytes (110 KB of head, over a 64 KiB limit) one after
/// another on one HTTP/2 connection; return how many got an answer (HEADERS or RST_STREAM for
/// their stream) and whether a GOAWAY came and the connection closed.
async fn h2_flood(tender: &Tender, requests: u32) -> (u32, bool, bool) {
    let mut s = tokio::net::TcpStream::connect(tender.addr).await.unwrap();
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    s.write_all(&out).await.unwrap();
    let extra: Vec<(String, String)> = (0..1000).map(|i| (format!("x-h{i:04}"), "v".repeat(100))).collect();
    let block = header_block("/v2/", &extra);
    let (mut answered, mut goaway) = (0u32, false);
    for i in 0..requests {
        let stream = 2 * i + 1;
        if s.write_all(&request_frames(stream, &block)).await.is_err() {
            break;
        }
        // Read until this stream is answered, a GOAWAY comes, or the connection ends.
        let done = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match read_frame(&mut s).await {
                    Ok((SETTINGS, flags, _, _)) if flags & 1 == 0 => {
                        let _ = s.write_all(&frame(SETTINGS, 1, 0, &[])).await;
                    }
                    Ok((GOAWAY, _, _, _)) => return Some(true),
                    Ok((HEADERS | RST_STREAM, _, id, _)) if id == stream => return Some(false),
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
        })
        .await
        .expect("the server answers or sends the connection away");
        match done {
            Some(false) => answered += 1,
            Some(true) => {
                goaway = true;
                break;
            }
            None => break,
        }
    }
    // After a GOAWAY the connection ends (bounded: the server closes it).
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await.is_ok();
    (answered, goaway, closed)
}

#[tokio::test]
async fn should_count_http2_heads_over_the_limit_and_send_a_flooding_connection_away() {
    let fake = FakeUpstream::start().await;
    let tender = tender_with(&fake, Limits { max_header_bytes: 64 * 1024, ..Limits::default() }).await;
    let (answered, goaway, closed) = h2_flood(&tender, 50).await;
    assert!(goaway, "no GOAWAY after {answered} over-limit heads");
    assert!(closed, "the connection stayed open after its GOAWAY");
    assert!((1..=3).contains(&answered), "{answered} over-limit heads answered before the GOAWAY");
    // Every one of them was refused and counted as a header refusal; the request sent while
    // the GOAWAY was on its way is counted too (it was refused, its answer came after).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while refusals(&tender, "headers") < u64::from(answered) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let counted = refusals(&tender, "headers");
    assert!(
        (u64::from(answered)..=u64::from(answered) + 1).contains(&counted),
        "{counted} counted, {answered} answered"
    );
}
