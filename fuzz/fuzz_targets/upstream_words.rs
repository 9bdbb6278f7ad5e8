//! What an upstream sends in words (`crates/fetch/src/wire.rs`) and its manifest bodies
//! (`tender_oci::media::verified_media_type`): hostile input, parsed without panicking.
//!
//! Properties: a `Retry-After` is at most 5 minutes; a token lifetime is within 1 s ..= 1 h and
//! a token is never empty; a Bearer challenge comes with a realm; a rewritten `Link` points at
//! the client's repository on tender (a relative `/v2/` path) and cannot split a header; a
//! manifest is never served as a type a browser would render.
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use tender_fuzz::wire::{
    parse_challenge, parse_retry_after, parse_token_response, rewrite_link, Challenge, MAX_RETRY_AFTER,
    MAX_TOKEN_SECS,
};

fuzz_target!(|data: &[u8]| {
    if let Some(m) = tender_oci::media::verified_media_type(None, data) {
        assert!(tender_oci::media::is_manifest_like(&m), "{m:?}");
    }
    if let Ok((token, life)) = parse_token_response(data) {
        assert!(!token.is_empty());
        assert!(life >= Duration::from_secs(1) && life <= Duration::from_secs(MAX_TOKEN_SECS), "{life:?}");
    }
    let Some(s) = tender_fuzz::text(data) else { return };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    if let Some(wait) = parse_retry_after(s, now) {
        assert!(wait <= MAX_RETRY_AFTER, "{s:?}: {wait:?}");
    }
    if let Some(Challenge::Bearer { realm, .. }) = parse_challenge(s) {
        assert!(!realm.contains('"'), "{s:?}: realm {realm:?}");
    }
    if let Some(l) = rewrite_link(s, "library/alpine", "alpine") {
        assert!(l.starts_with("</v2/alpine/"), "{s:?} -> {l:?}");
        assert!(!l.contains(['\r', '\n']), "{s:?} -> {l:?}");
    }
    if let Some(m) = tender_oci::media::verified_media_type(Some(s), b"{}") {
        assert!(tender_oci::media::is_manifest_like(&m), "{s:?}: {m:?}");
    }
});
