//! What upstreams send in words, parsed without any I/O: `WWW-Authenticate` challenges,
//! `Retry-After`, token responses, `Link` headers. Every input is hostile; every number is
//! capped. This file uses only std, serde_json and httpdate, so the fuzz targets compile it in
//! on its own (`fuzz/src/lib.rs`).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// Token lifetime when the token server names none (the distribution spec's default).
pub const DEFAULT_TOKEN_SECS: u64 = 60;
/// Longest a token is reused, whatever the token server says.
pub const MAX_TOKEN_SECS: u64 = 3600;
/// Longest wait an upstream's `Retry-After` can ask for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// What a `WWW-Authenticate` header asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Challenge {
    Bearer { realm: String, service: Option<String>, scope: Option<String> },
    Basic,
}

/// Parse one `WWW-Authenticate` value: Basic, or Bearer with its realm (required), service
/// and scope. Anything else: `None`.
pub fn parse_challenge(value: &str) -> Option<Challenge> {
    let (scheme, rest) = value.trim().split_once(' ').unwrap_or((value.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut params = HashMap::new();
    let mut s = rest.trim();
    while !s.is_empty() {
        let (key, after) = s.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let quoted = after.starts_with('"');
        let (val, tail) = if let Some(q) = after.strip_prefix('"') {
            let (val, tail) = q.split_at(q.find('"')?);
            (val.to_string(), tail.strip_prefix('"').unwrap_or(tail))
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        // A token never holds a quote, and no value holds a control character (RFC 9110 §5.6.2).
        if val.chars().any(char::is_control) || (!quoted && val.contains('"')) {
            return None;
        }
        params.insert(key, val);
        s = tail.trim_start().trim_start_matches(',').trim_start();
    }
    Some(Challenge::Bearer {
        realm: params.remove("realm")?,
        service: params.remove("service"),
        scope: params.remove("scope"),
    })
}

/// `Retry-After` as of `now`: delta-seconds or an HTTP date, capped at [`MAX_RETRY_AFTER`].
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    let wait = match v.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => httpdate::parse_http_date(v).ok()?.duration_since(now).unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// A token response: the token (`token` or `access_token`) and how long to reuse it,
/// `expires_in` clamped to 1 s ..= [`MAX_TOKEN_SECS`] (negative, fractional or huge values are
/// clamped, not refused). The error says what was wrong.
pub fn parse_token_response(body: &[u8]) -> Result<(String, Duration), String> {
    #[derive(serde::Deserialize)]
    struct TokenBody {
        token: Option<String>,
        access_token: Option<String>,
        expires_in: Option<serde_json::Number>,
    }
    let body: TokenBody = serde_json::from_slice(body).map_err(|e| format!("token response: {e}"))?;
    let token = body.token.or(body.access_token).filter(|t| !t.is_empty()).ok_or("token response has no token")?;
    let secs = match body.expires_in {
        None => DEFAULT_TOKEN_SECS,
        Some(n) => n.as_u64().unwrap_or(if n.as_f64().is_some_and(|f| f > 0.0) { MAX_TOKEN_SECS } else { 1 }),
    }
    .clamp(1, MAX_TOKEN_SECS);
    Ok((token, Duration::from_secs(secs)))
}

/// A listing's `Link` header as the client may see it: the repository the upstream was asked
/// for (`/v2/<upstream_repo>/`) becomes the one the client named, and an absolute URL loses
/// its scheme and host (the client asks tender, never the upstream). `None` for a value that
/// is not one `<uri>; params` link to that repository's `/v2/` path.
pub fn rewrite_link(link: &str, upstream_repo: &str, client_repo: &str) -> Option<String> {
    let link = link.trim();
    let rest = link.strip_prefix('<')?;
    let (uri, params) = rest.split_once('>')?;
    let uri = match uri.split_once("://") {
        Some((scheme, after)) if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") => {
            &after[after.find('/')?..]
        }
        Some(_) => return None,
        None => uri,
    };
    if !uri.starts_with("/v2/") || uri.contains(['\r', '\n', '<', '>']) || params.contains(['\r', '\n']) {
        return None;
    }
    let from = format!("/v2/{upstream_repo}/");
    let uri = match uri.strip_prefix(&from) {
        Some(tail) => format!("/v2/{client_repo}/{tail}"),
        None => return None,
    };
    Some(format!("<{uri}>{params}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_rewrite_links_to_the_clients_repository_on_tender_only() {
        let next = |l: &str| rewrite_link(l, "library/alpine", "alpine");
        assert_eq!(
            next(r#"</v2/library/alpine/tags/list?last=3&n=3>; rel="next""#).as_deref(),
            Some(r#"</v2/alpine/tags/list?last=3&n=3>; rel="next""#)
        );
        assert_eq!(
            next(r#"<https://registry.example/v2/library/alpine/tags/list?n=3>; rel="next""#).as_deref(),
            Some(r#"</v2/alpine/tags/list?n=3>; rel="next""#)
        );
        for bad in [
            "",
            "no brackets",
            "</v2/other/repo/tags/list>",
            "<ftp://x/v2/library/alpine/>",
            "</v2/library/alpine/\r\nX: y>",
        ] {
            assert_eq!(next(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn should_refuse_challenges_with_quotes_or_controls_in_values() {
        // Found by the upstream_words fuzz target.
        assert_eq!(parse_challenge("Bearer realm=o\",x=1"), None);
        assert_eq!(parse_challenge("Bearer realm=\"https://a/\u{0}\""), None);
        assert!(parse_challenge("Bearer realm=https://auth.example/token,service=x").is_some());
    }

    #[test]
    fn should_clamp_token_lifetimes() {
        let life = |b: &str| parse_token_response(b.as_bytes()).map(|(_, d)| d.as_secs());
        assert_eq!(life(r#"{"token":"t"}"#), Ok(DEFAULT_TOKEN_SECS));
        assert_eq!(life(r#"{"access_token":"t","expires_in":18446744073709551615}"#), Ok(MAX_TOKEN_SECS));
        assert_eq!(life(r#"{"token":"t","expires_in":1e300}"#), Ok(MAX_TOKEN_SECS));
        assert_eq!(life(r#"{"token":"t","expires_in":-5}"#), Ok(1));
        assert!(life(r#"{"token":""}"#).is_err() && life("[]").is_err());
    }
}
