//! `tender probe`: is a mirror or image cache usable from where this runs?
//!
//! One line on stdout and an exit code: `yes` (0), `no (<reason>): <detail>` (1) or
//! `unknown (<reason>): <detail>` (3). `no` is said only on a definite answer: a refused
//! connection, a 401/403/404, a 200 where a 206 was required, a response that is not a
//! registry's or not a manifest. `unknown` means the question could not be asked: a timeout,
//! DNS, a reset, a 5xx or 429.
//!
//! The caching rule, stated once ([`Verdict::cacheable`]) and applied once ([`run`]): with
//! `--cache FILE`, `yes` and `no` are stored under the question (base URL, images, OS images,
//! credentials' identity) and reused, without asking the server, by any later probe of the
//! same question within `--cache-ttl` (default: forever); `unknown` is never stored, so the
//! next probe asks again.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, ACCEPT, CONTENT_TYPE, LOCATION, RANGE};
use reqwest::{Method, Response, StatusCode};
use serde::{Deserialize, Serialize};
use tender_oci::media::{self, ALL_MANIFESTS};
use tender_oci::Reference;
use url::Url;

use crate::exit::{Context as _, Failure, Result};
use crate::http::{self, ClientArgs, ClientOptions, ImageRef, TenderClient};

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// Base URL of the mirror / image cache, e.g. http://tender.example:5000
    #[arg(value_name = "BASE_URL")]
    pub base: String,
    /// An image that must resolve through the mirror (repeatable), e.g. ghcr.io/siderolabs/kubelet:v1.35.0
    #[arg(long = "image", value_name = "REF")]
    pub images: Vec<String>,
    /// An OS image that must answer a one-byte Range with 206 (repeatable):
    /// /image/<schematic>/<version>/<asset>, or a full URL under BASE_URL
    #[arg(long = "os-image", value_name = "PATH")]
    pub os_images: Vec<String>,
    /// Time allowed for the whole probe
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Remember yes / no answers in this JSON file and reuse them (never unknown)
    #[arg(long, value_name = "FILE")]
    pub cache: Option<PathBuf>,
    /// How long a cached answer is reused [default: forever]
    #[arg(long, value_name = "DURATION", requires = "cache", value_parser = humantime::parse_duration)]
    pub cache_ttl: Option<Duration>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// The answer to "can I use this from here?".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "lowercase")]
pub enum Verdict {
    Yes,
    /// A definite answer: the server said so, or refused the connection.
    No {
        reason: String,
        detail: String,
    },
    /// The question could not be asked.
    Unknown {
        reason: String,
        detail: String,
    },
}

impl Verdict {
    fn no(reason: &str, detail: impl Into<String>) -> Verdict {
        Verdict::No { reason: reason.to_string(), detail: detail.into() }
    }

    fn unknown(reason: &str, detail: impl Into<String>) -> Verdict {
        Verdict::Unknown { reason: reason.to_string(), detail: detail.into() }
    }

    /// The one line printed.
    pub fn line(&self) -> String {
        match self {
            Verdict::Yes => "yes".to_string(),
            Verdict::No { reason, detail } => format!("no ({reason}): {detail}"),
            Verdict::Unknown { reason, detail } => format!("unknown ({reason}): {detail}"),
        }
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            Verdict::Yes => 0,
            Verdict::No { .. } => 1,
            Verdict::Unknown { .. } => 3,
        }
    }

    /// The caching rule: a definite answer may be reused; "could not ask" never is.
    pub fn cacheable(&self) -> bool {
        !matches!(self, Verdict::Unknown { .. })
    }
}

/// What a probe asks, normalised so the same question always has the same key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Question {
    url: String,
    images: Vec<String>,
    os_images: Vec<String>,
    /// Who asks (`none`, `basic <user>`, `bearer`): credentials change the answer.
    auth: String,
}

impl Question {
    fn key(&self) -> String {
        format!(
            "{} images={} os-images={} auth={}",
            self.url,
            self.images.join(","),
            self.os_images.join(","),
            self.auth
        )
    }
}

/// The `--cache` file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheFile {
    format: u32,
    answers: BTreeMap<String, CachedAnswer>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CachedAnswer {
    question: Question,
    verdict: Verdict,
    /// Seconds since the Unix epoch.
    stored_at: u64,
}

const CACHE_FORMAT: u32 = 1;

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Read the cache file; a missing one is empty, an unreadable or foreign one is ignored (and
/// replaced on the next store) with a warning.
fn cache_read(path: &Path) -> CacheFile {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return CacheFile::default(),
        Err(e) => {
            eprintln!("tender probe: ignoring the cache {}: {e}", path.display());
            return CacheFile::default();
        }
    };
    match serde_json::from_slice::<CacheFile>(&bytes) {
        Ok(f) if f.format == CACHE_FORMAT => f,
        Ok(f) => {
            eprintln!("tender probe: ignoring the cache {}: format {} is not {CACHE_FORMAT}", path.display(), f.format);
            CacheFile::default()
        }
        Err(e) => {
            eprintln!("tender probe: ignoring the cache {}: not a probe cache ({e})", path.display());
            CacheFile::default()
        }
    }
}

fn cache_lookup(path: &Path, q: &Question, ttl: Option<Duration>, now: u64) -> Option<Verdict> {
    let file = cache_read(path);
    let hit = file.answers.get(&q.key())?;
    if hit.question != *q || !hit.verdict.cacheable() {
        return None;
    }
    let age = now.saturating_sub(hit.stored_at);
    if ttl.is_some_and(|t| age > t.as_secs()) {
        return None;
    }
    Some(hit.verdict.clone())
}

/// Store an answer: read, update, write a temp file beside it, fsync, rename.
fn cache_store(path: &Path, q: &Question, v: &Verdict, now: u64) -> Result<()> {
    let mut file = cache_read(path);
    file.format = CACHE_FORMAT;
    file.answers.insert(q.key(), CachedAnswer { question: q.clone(), verdict: v.clone(), stored_at: now });
    let bytes = serde_json::to_vec_pretty(&file).context("encoding the probe cache")?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("probe-cache");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("writing the probe cache {}", path.display()))
}

/// An OS image argument as a path under the base: `/image/...`, or a full URL under the base.
fn os_image_path(base: &Url, raw: &str) -> Result<String> {
    let raw = raw.trim();
    if raw.starts_with("http://") || raw.starts_with("https://") {
        let u = Url::parse(raw).map_err(|e| Failure::usage(format!("--os-image {raw:?} is not a URL: {e}")))?;
        let prefix = base.path().trim_end_matches('/');
        let same_origin = u.scheme() == base.scheme()
            && u.host_str() == base.host_str()
            && u.port_or_known_default() == base.port_or_known_default();
        return match u.path().strip_prefix(prefix) {
            Some(rest) if same_origin && rest.starts_with('/') => Ok(match u.query() {
                Some(q) => format!("{rest}?{q}"),
                None => rest.to_string(),
            }),
            _ => Err(Failure::usage(format!("--os-image {raw:?} is not under the probed base URL {base}"))),
        };
    }
    if !raw.starts_with('/') || raw.len() < 2 {
        return Err(Failure::usage(format!(
            "--os-image {raw:?}: expected a path like /image/<schematic>/<version>/openstack-amd64.raw.xz or a URL"
        )));
    }
    Ok(raw.to_string())
}

fn sorted_unique(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

pub fn run(args: ProbeArgs) -> Result<ExitCode> {
    let base = http::parse_base_url(&args.base)?;
    let mut images = Vec::new();
    for raw in &args.images {
        images.push(ImageRef::parse(raw).map_err(|e| Failure::usage(format!("--image: {e}")))?);
    }
    images.sort_by_key(|i| i.to_string());
    images.dedup();
    let mut os_images = Vec::new();
    for raw in &args.os_images {
        os_images.push(os_image_path(&base, raw)?);
    }
    let os_images = sorted_unique(os_images);
    let question = Question {
        url: base.to_string(),
        images: images.iter().map(ToString::to_string).collect(),
        os_images: os_images.clone(),
        auth: args.client.identity(),
    };

    if let Some(path) = &args.cache {
        if let Some(v) = cache_lookup(path, &question, args.cache_ttl, now_secs()) {
            println!("{}", v.line());
            return Ok(ExitCode::from(v.exit_code()));
        }
    }

    let client = args.client.client(&ClientOptions {
        user_agent: concat!("tender-probe/", env!("CARGO_PKG_VERSION")),
        headers: &[],
        connect_timeout: args.timeout,
        read_timeout: None,
        admin: false,
    })?;
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let prober = Prober { client, base, timeout: args.timeout };
    let verdict = runtime.block_on(async {
        let deadline = tokio::time::Instant::now() + args.timeout;
        prober.probe(&images, &os_images, deadline).await
    });

    if let Some(path) = &args.cache {
        if verdict.cacheable() {
            if let Err(e) = cache_store(path, &question, &verdict, now_secs()) {
                eprintln!("tender probe: {e:#}");
            }
        }
    }
    println!("{}", verdict.line());
    Ok(ExitCode::from(verdict.exit_code()))
}

struct Prober {
    client: TenderClient,
    base: Url,
    timeout: Duration,
}

impl Prober {
    /// `/v2/` first (nothing else means anything if this is not a registry), then every image
    /// and OS image. A definite `no` ends the probe; an `unknown` is kept while the rest are
    /// asked, since a later definite `no` is still the better answer.
    async fn probe(&self, images: &[ImageRef], os_images: &[String], deadline: tokio::time::Instant) -> Verdict {
        let base = self.registry(deadline).await;
        if base != Verdict::Yes {
            return base;
        }
        let mut unknown = None;
        for img in images {
            match self.image(img, deadline).await {
                Verdict::Yes => {}
                no @ Verdict::No { .. } => return no,
                u @ Verdict::Unknown { .. } => {
                    unknown.get_or_insert(u);
                }
            }
        }
        for path in os_images {
            match self.os_image(path, deadline).await {
                Verdict::Yes => {}
                no @ Verdict::No { .. } => return no,
                u @ Verdict::Unknown { .. } => {
                    unknown.get_or_insert(u);
                }
            }
        }
        unknown.unwrap_or(Verdict::Yes)
    }

    async fn send(
        &self,
        what: &str,
        method: Method,
        url: Url,
        headers: HeaderMap,
        deadline: tokio::time::Instant,
    ) -> Result<Response, Verdict> {
        let fut = self.client.request(method, url).headers(headers).send();
        match tokio::time::timeout_at(deadline, fut).await {
            Err(_) => Err(Verdict::unknown(
                "timeout",
                format!("{what}: no answer within {}", humantime::format_duration(self.timeout)),
            )),
            Ok(Err(e)) => Err(transport_verdict(what, &e)),
            Ok(Ok(resp)) => Ok(resp),
        }
    }

    /// `GET /v2/`: a registry answers 200 (or 401) with `Docker-Distribution-API-Version:
    /// registry/2.0` or a JSON body.
    async fn registry(&self, deadline: tokio::time::Instant) -> Verdict {
        let url = http::join(&self.base, "/v2/");
        let what = format!("GET {url}");
        let resp = match self.send(&what, Method::GET, url, HeaderMap::new(), deadline).await {
            Ok(r) => r,
            Err(v) => return v,
        };
        let status = resp.status();
        if status != StatusCode::OK {
            if status == StatusCode::NOT_FOUND {
                return Verdict::no("not a registry", format!("{what} answered 404"));
            }
            return status_verdict(&what, &resp);
        }
        let api_header = resp
            .headers()
            .get("docker-distribution-api-version")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("registry/2.0"));
        let content_type = header_str(&resp, CONTENT_TYPE).to_string();
        if api_header {
            return Verdict::Yes;
        }
        let body = match tokio::time::timeout_at(deadline, read_limited(resp, 64 * 1024)).await {
            Err(_) => return Verdict::unknown("timeout", format!("{what}: the body did not arrive in time")),
            Ok(Err(e)) => return transport_verdict(&what, &e),
            Ok(Ok(b)) => b,
        };
        if serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&body).is_ok() {
            return Verdict::Yes;
        }
        let ct = if content_type.is_empty() { "no Content-Type".to_string() } else { content_type };
        Verdict::no(
            "not a registry",
            format!("{what} answered 200 ({ct}) without Docker-Distribution-API-Version or a JSON body"),
        )
    }

    /// `HEAD /v2/<repo>/manifests/<ref>?ns=<registry>` must answer 200 with a manifest type.
    async fn image(&self, img: &ImageRef, deadline: tokio::time::Instant) -> Verdict {
        let url =
            http::join(&self.base, &format!("/v2/{}/manifests/{}?ns={}", img.repository, img.reference, img.registry));
        let what = format!("{img}: HEAD {url}");
        let mut headers = HeaderMap::new();
        if let Ok(v) = ALL_MANIFESTS.join(", ").parse() {
            headers.insert(ACCEPT, v);
        }
        let resp = match self.send(&what, Method::HEAD, url, headers, deadline).await {
            Ok(r) => r,
            Err(v) => return v,
        };
        if resp.status() != StatusCode::OK {
            return status_verdict(&what, &resp);
        }
        let ct = header_str(&resp, CONTENT_TYPE).split(';').next().unwrap_or("").trim().to_string();
        if !media::is_manifest(&ct) {
            let ct = if ct.is_empty() { "no Content-Type".to_string() } else { ct };
            return Verdict::no("not a manifest", format!("{what} answered 200 with {ct}"));
        }
        if let Reference::Digest(want) = &img.reference {
            let got = header_str(&resp, "docker-content-digest").trim();
            if !got.is_empty() && got != want.to_string() {
                return Verdict::no("wrong digest", format!("{what} answered Docker-Content-Digest {got}"));
            }
        }
        Verdict::Yes
    }

    /// `GET <path>` with `Range: bytes=0-0` must answer 206.
    async fn os_image(&self, path: &str, deadline: tokio::time::Instant) -> Verdict {
        let url = http::join(&self.base, path);
        let what = format!("GET {url} (Range: bytes=0-0)");
        let mut headers = HeaderMap::new();
        headers.insert(RANGE, reqwest::header::HeaderValue::from_static("bytes=0-0"));
        let resp = match self.send(&what, Method::GET, url, headers, deadline).await {
            Ok(r) => r,
            Err(v) => return v,
        };
        match resp.status() {
            StatusCode::PARTIAL_CONTENT => Verdict::Yes,
            // Dropping the response closes the connection: a whole OS image is never read.
            StatusCode::OK => Verdict::no("no range support", format!("{what} answered 200; a 206 is required")),
            StatusCode::RANGE_NOT_SATISFIABLE => Verdict::no("range not satisfiable", format!("{what} answered 416")),
            _ => status_verdict(&what, &resp),
        }
    }
}

fn header_str<K: reqwest::header::AsHeaderName>(resp: &Response, name: K) -> &str {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

async fn read_limited(mut resp: Response, limit: usize) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = limit.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// A non-success status: 401/403/404/other 4xx and redirects are definite; 5xx, 408 and 429
/// mean the question could not be answered now.
fn status_verdict(what: &str, resp: &Response) -> Verdict {
    let status = resp.status();
    let code = status.as_u16();
    match code {
        401 => Verdict::no(
            "unauthorized",
            format!("{what} answered 401; give credentials with --username/--password-file or --token-file"),
        ),
        403 => Verdict::no("forbidden", format!("{what} answered 403")),
        404 => Verdict::no("not found", format!("{what} answered 404")),
        408 | 429 => Verdict::unknown("busy", format!("{what} answered {code}")),
        500..=599 => Verdict::unknown("server error", format!("{what} answered {code}")),
        300..=399 => {
            let to = header_str(resp, LOCATION);
            Verdict::no("redirect", format!("{what} answered {code} to {to:?}; probe the final URL"))
        }
        _ => Verdict::no("refused", format!("{what} answered {code}")),
    }
}

/// A failure below HTTP: a refused connection and a TLS failure (an untrusted certificate, a
/// client certificate refused) are definite answers; timeouts, DNS, resets and anything else
/// mean the question could not be asked.
fn transport_verdict(what: &str, e: &reqwest::Error) -> Verdict {
    let mut chain = e.to_string();
    let mut kinds = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        chain.push_str(": ");
        chain.push_str(&s.to_string());
        // An io::Error wrapping another (hyper-rustls wraps tokio-rustls's InvalidData in
        // Other) hides the inner one from source(): look inside.
        let mut io = s.downcast_ref::<std::io::Error>();
        while let Some(e) = io {
            kinds.push(e.kind());
            io = e.get_ref().and_then(|inner| inner.downcast_ref::<std::io::Error>());
        }
        source = s.source();
    }
    use std::io::ErrorKind as K;
    let has = |k: K| kinds.contains(&k);
    let detail = format!("{what}: {chain}");
    if e.is_timeout() || has(K::TimedOut) {
        Verdict::unknown("timeout", detail)
    } else if has(K::ConnectionRefused) {
        Verdict::no("connection refused", detail)
    } else if has(K::InvalidData) {
        // tokio-rustls reports every TLS failure as InvalidData
        Verdict::no("tls", detail)
    } else if has(K::ConnectionReset) || has(K::ConnectionAborted) || has(K::BrokenPipe) || has(K::UnexpectedEof) {
        Verdict::unknown("connection reset", detail)
    } else if e.is_connect() {
        Verdict::unknown("cannot connect", detail)
    } else {
        Verdict::unknown("transport error", detail)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn q(url: &str) -> Question {
        Question { url: url.into(), images: vec![], os_images: vec![], auth: "none".into() }
    }

    #[test]
    fn should_cache_only_definite_answers() {
        assert!(Verdict::Yes.cacheable());
        assert!(Verdict::no("not found", "x").cacheable());
        assert!(!Verdict::unknown("timeout", "x").cacheable());
    }

    #[test]
    fn should_print_one_line_per_verdict() {
        assert_eq!(Verdict::Yes.line(), "yes");
        assert_eq!(Verdict::no("not a registry", "d").line(), "no (not a registry): d");
        assert_eq!(Verdict::unknown("timeout", "d").line(), "unknown (timeout): d");
        assert_eq!([Verdict::Yes.exit_code(), Verdict::no("a", "b").exit_code()], [0, 1]);
        assert_eq!(Verdict::unknown("a", "b").exit_code(), 3);
    }

    #[test]
    fn should_reuse_within_ttl_and_not_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        let question = q("http://a:5000");
        cache_store(&path, &question, &Verdict::Yes, 1000).unwrap();
        assert_eq!(cache_lookup(&path, &question, None, 1_000_000), Some(Verdict::Yes), "no TTL: forever");
        assert_eq!(cache_lookup(&path, &question, Some(Duration::from_secs(60)), 1060), Some(Verdict::Yes));
        assert_eq!(cache_lookup(&path, &question, Some(Duration::from_secs(60)), 1061), None);
        assert_eq!(cache_lookup(&path, &q("http://b:5000"), None, 1000), None, "another question");
    }

    #[test]
    fn should_ignore_a_corrupt_cache_and_replace_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        std::fs::write(&path, b"{not json").unwrap();
        assert_eq!(cache_lookup(&path, &q("http://a"), None, 1), None);
        cache_store(&path, &q("http://a"), &Verdict::no("not found", "x"), 1).unwrap();
        assert_eq!(cache_lookup(&path, &q("http://a"), None, 1), Some(Verdict::no("not found", "x")));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temp file left behind");
    }

    #[test]
    fn should_take_os_images_as_paths_or_urls_under_the_base() {
        let base = http::parse_base_url("http://h:5000/c").unwrap();
        assert_eq!(os_image_path(&base, "/image/s/v1/a.raw.xz").unwrap(), "/image/s/v1/a.raw.xz");
        assert_eq!(os_image_path(&base, "http://h:5000/c/image/s/v1/a.raw.xz").unwrap(), "/image/s/v1/a.raw.xz");
        assert!(os_image_path(&base, "http://other:5000/c/image/s").is_err());
        assert!(os_image_path(&base, "http://h:5000/image/s").is_err());
        assert!(os_image_path(&base, "image/s").is_err());
    }
}
