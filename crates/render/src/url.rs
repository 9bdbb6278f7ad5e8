//! The http(s) URL and `host[:port]` grammar that registry mirrors, endpoints and the Image
//! Factory URL are written in. Problems come back as text: the caller words the refusal (see
//! `rules::check_factory_url`, `registries`).

use std::fmt;

/// `host[:port]`: a lowercase DNS name, an IPv4 address or a bracketed IPv6 address (`[::1]`),
/// and an optional port 1..=65535.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Authority {
    pub host: String,
    pub port: Option<u16>,
}

impl Authority {
    pub fn parse(value: &str) -> Result<Authority, String> {
        if let Some(rest) = value.strip_prefix('[') {
            return Authority::parse_ipv6(rest);
        }
        let (host, port) = match value.rsplit_once(':') {
            Some((h, p)) => (h, Some(parse_port(p)?)),
            None => (value, None),
        };
        if host.is_empty() || host.len() > 253 {
            return Err("the host is empty or longer than 253 characters".into());
        }
        let labels_ok = host.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b.first().is_some_and(u8::is_ascii_alphanumeric)
                && b.last().is_some_and(u8::is_ascii_alphanumeric)
        });
        if !labels_ok {
            return Err(
                "the host must be lowercase letters, digits, '-' and '.' (a DNS name or IPv4 address), or an IPv6 address in brackets ([::1])".into(),
            );
        }
        Ok(Authority { host: host.to_string(), port })
    }

    /// `[v6addr]` or `[v6addr]:port`, after the `[`. The host keeps its brackets (it is written
    /// into URLs and registry names as is), and the address is written in its canonical form.
    fn parse_ipv6(rest: &str) -> Result<Authority, String> {
        let Some((addr, after)) = rest.split_once(']') else {
            return Err("an IPv6 host needs its closing ']' ([::1]:5000)".into());
        };
        let ip: core::net::Ipv6Addr = addr.parse().map_err(|_| format!("[{addr}] is not an IPv6 address"))?;
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(parse_port(p)?),
                None => return Err(format!("{after:?} after the IPv6 address is not :port")),
            },
        };
        Ok(Authority { host: format!("[{ip}]"), port })
    }
}

fn parse_port(p: &str) -> Result<u16, String> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port {p:?} is not a number"));
    }
    let port: u16 = p.parse().map_err(|_| format!("port {p} is out of range"))?;
    if port == 0 {
        return Err("port 0 is not a port".into());
    }
    Ok(port)
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

/// An `http://` or `https://` URL with no credentials, query or fragment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HttpUrl {
    pub https: bool,
    pub authority: Authority,
    /// The path without a trailing `/`; empty when the URL has none.
    pub path: String,
}

impl fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.path)
    }
}

/// Whether a URL carries credentials (`scheme://user:password@host`).
pub fn has_credentials(value: &str) -> bool {
    let rest = value.split_once("://").map_or(value, |(_, r)| r);
    rest.split(['/', '?', '#']).next().is_some_and(|authority| authority.contains('@'))
}

/// Parse a plain http(s) URL. The path may hold `[A-Za-z0-9._~/%-]` only.
pub fn parse_http_url(value: &str) -> Result<HttpUrl, String> {
    if has_credentials(value) {
        return Err("the URL carries credentials (user:password@); give them as registry auth instead".into());
    }
    let (https, rest) = if let Some(r) = value.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = value.strip_prefix("http://") {
        (false, r)
    } else {
        return Err("the scheme must be http:// or https://".into());
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = Authority::parse(authority)?;
    // `//` is checked before the one trailing `/` goes, so `https://m//` cannot leave the path `/`.
    let empty_segment = path.contains("//");
    let path = path.strip_suffix('/').unwrap_or(path);
    if !path.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'/' | b'%' | b'-')) {
        return Err("the path may only hold letters, digits and . _ ~ / % -".into());
    }
    if empty_segment || path.split('/').any(|seg| seg == "..") {
        return Err("the path has an empty or '..' segment".into());
    }
    Ok(HttpUrl { https, authority, path: path.to_string() })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn should_parse_plain_http_urls_only() {
        let u = parse_http_url("https://tender.example:5000/").unwrap();
        assert_eq!(u.to_string(), "https://tender.example:5000");
        assert_eq!(parse_http_url("http://m/v2/ghcr/").unwrap().path, "/v2/ghcr");
        for bad in [
            "",
            "ftp://m",
            "https://",
            "https://u:p@m",
            "https://m?x=1",
            "https://m#f",
            "https://m/$(id)",
            "https://m/`id`",
            "https://m/a\nEOF",
            "https://m/a b",
            "https://m/../etc",
            "https://m//x",
            "https://m/\"q\"",
            "https://m/a\\b",
        ] {
            assert!(parse_http_url(bad).is_err(), "{bad:?}");
        }
    }

    /// Issue 33: `http://[::1]:5000` was refused as a bad host.
    #[test]
    fn should_accept_a_bracketed_ipv6_host() {
        for (url, shown) in [
            ("http://[::1]:5000", "http://[::1]:5000"),
            ("https://[fd00::0:1]/", "https://[fd00::1]"),
            ("http://[2001:db8::5]:80/v2", "http://[2001:db8::5]:80/v2"),
        ] {
            assert_eq!(parse_http_url(url).unwrap().to_string(), shown);
        }
        for bad in [
            "http://[::1",
            "http://[zz::1]:5000",
            "http://[::1]x:5000",
            "http://::1:5000",
            "http://[::1]:0",
            "http://[]",
        ] {
            assert!(parse_http_url(bad).is_err(), "{bad:?}");
        }
    }

    /// Found by the `render_registries` fuzz target: `https://m//` parsed to the path `/`, which
    /// printed as `https://m/` (another URL) and made the mirror an `overridePath` API root.
    #[test]
    fn should_refuse_a_url_whose_path_is_only_slashes() {
        for bad in ["https://m//", "http://m:5000//", "https://m///", "https://m/v2//"] {
            assert!(parse_http_url(bad).is_err(), "{bad:?}");
        }
        let u = parse_http_url("https://m/").unwrap();
        assert_eq!((u.path.as_str(), u.to_string().as_str()), ("", "https://m"));
    }

    proptest! {
        #[test]
        fn should_round_trip_valid_authorities(host in "[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?(\\.[a-z0-9]{1,6}){0,3}", port in proptest::option::of(1u16..)) {
            let text = match port { Some(p) => format!("{host}:{p}"), None => host.clone() };
            let a = Authority::parse(&text).unwrap();
            prop_assert_eq!(a.to_string(), text);
        }

        #[test]
        fn should_never_accept_a_url_with_shell_or_yaml_metacharacters(prefix in "[a-z]{1,5}", bad in "[$`\\\\\"' \n\r\t;|&<>{}]", suffix in "[a-z]{0,5}") {
            let url = format!("https://m.example/{prefix}{bad}{suffix}");
            prop_assert!(parse_http_url(&url).is_err());
        }
    }
}
