//! tender's configuration, shared by `tender serve` and every command that reads a config file:
//! the file in two stages, serde structs close to the YAML (unknown keys refused), then
//! [`resolve`] into validated [`Settings`] with the command-line [`Overrides`] applied. Every
//! error is a [`ConfigError`] naming the key (or the flag) and the fix. The embedded default is
//! [`DEFAULT_CONFIG`]; `tests/props.rs` holds the loader's properties.
//!
//! Must not depend on: clap (flags arrive as [`Overrides`]), anyhow, an HTTP client or an async
//! runtime. Resolving opens no connection; its only IO is reading the files keys name
//! (passwords, htpasswd, tokens, TLS PEM files), to refuse a bad one at start.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tender_fetch::{Credentials, FetchSettings, StaleLimit, UpstreamSettings};
use url::Url;

/// `maxObjectSize` of an upstream that sets none: larger objects are refused, not stored.
pub const DEFAULT_MAX_OBJECT_SIZE: u64 = 64 << 30;

/// The embedded default, used when no `--config` is given.
pub const DEFAULT_CONFIG: &str = include_str!("default.yaml");

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawConfig {
    pub listen: Option<String>,
    pub data: Option<PathBuf>,
    pub log_format: Option<String>,
    pub default_upstream: Option<String>,
    /// Also read as Cozystack spells it, `imageFactoryURL`.
    #[serde(alias = "imageFactoryURL")]
    pub image_factory: Option<String>,
    #[serde(default)]
    pub upstreams: Vec<RawUpstream>,
    #[serde(default)]
    pub fetch: RawFetch,
    #[serde(default)]
    pub cache: RawCache,
    /// The golden image catalog; validated by the catalog code.
    pub catalog: Option<serde_norway::Value>,
    #[serde(default)]
    pub tls: RawTls,
    #[serde(default)]
    pub auth: RawAuth,
    #[serde(default)]
    pub admin: RawAdmin,
    #[serde(default)]
    pub limits: RawLimits,
    #[serde(default)]
    pub parent: RawParent,
    #[serde(default)]
    pub storage: RawStorage,
    /// Every upstream and the Image Factory offline (`serve --offline`).
    #[serde(default)]
    pub offline: bool,
    /// The signature policy: Talos' `ImageVerificationConfig` rules (docs/signatures.md).
    pub image_verification: Option<tender_verify::RawPolicy>,
}

/// Where committed objects live besides the data directory.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawStorage {
    pub s3: Option<RawS3>,
}

/// A bucket shared by replicas; the data directory becomes a spool and read cache.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawS3 {
    pub endpoint: Option<String>,
    pub bucket: Option<String>,
    pub region: Option<String>,
    pub prefix: Option<String>,
    pub access_key_id_file: Option<PathBuf>,
    pub secret_access_key_file: Option<PathBuf>,
    pub path_style: Option<bool>,
    pub sign_payload: Option<bool>,
    pub chunk_size: Option<String>,
    pub lease: Option<bool>,
    pub lease_ttl: Option<String>,
    pub replica: Option<String>,
    pub request_timeout: Option<String>,
    pub connect_timeout: Option<String>,
    pub retries: Option<u32>,
    pub probe_interval: Option<String>,
    pub max_size: Option<String>,
    pub gc_grace: Option<String>,
    pub index_key_file: Option<PathBuf>,
}

/// Another tender that every upstream request goes to (tiered caches).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawParent {
    #[serde(default)]
    pub urls: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    #[serde(default)]
    pub fallback_to_upstream: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawTls {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
    pub reload_interval: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawAuth {
    pub htpasswd: Option<PathBuf>,
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub anonymous_pull: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawAdmin {
    pub token_file: Option<PathBuf>,
    pub listen: Option<String>,
    pub max_import_size: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawLimits {
    pub max_concurrent_fills: Option<usize>,
    pub max_fills_per_upstream: Option<usize>,
    pub abandoned_fill_grace: Option<String>,
    pub max_client_requests: Option<usize>,
    pub max_connections: Option<usize>,
    pub max_header_bytes: Option<String>,
    pub max_url_bytes: Option<String>,
    pub max_manifest_size: Option<String>,
    pub header_timeout: Option<String>,
    pub handshake_timeout: Option<String>,
    pub max_connections_per_address: Option<usize>,
    pub first_byte_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub send_stall_timeout: Option<String>,
    pub send_buffer: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawUpstream {
    pub name: String,
    pub url: String,
    #[serde(default)]
    pub endpoints: Vec<String>,
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
    pub proxy: Option<String>,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    pub password_env: Option<String>,
    #[serde(default)]
    pub public: bool,
    #[serde(default)]
    pub private: bool,
    #[serde(default)]
    pub range_before_verify: bool,
    pub redirect_hosts: Option<Vec<String>>,
    pub token_realm_hosts: Option<Vec<String>>,
    pub library_prefix: Option<bool>,
    pub max_object_size: Option<String>,
    pub stale_max_age: Option<String>,
    /// Never contacted: what tender holds is served, a miss is a 404 at once.
    #[serde(default)]
    pub offline: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawFetch {
    pub attempts: Option<u32>,
    pub connect_timeout: Option<String>,
    pub first_byte_timeout: Option<String>,
    pub stall_timeout: Option<String>,
    pub fill_deadline: Option<String>,
    pub backoff_base: Option<String>,
    pub backoff_max: Option<String>,
    pub tag_ttl: Option<String>,
    pub stale_max_age: Option<String>,
    pub factory_first_byte_timeout: Option<String>,
    pub factory_range_before_verify: Option<bool>,
    pub max_decoded_size: Option<String>,
    pub metadata_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawCache {
    pub max_size: Option<String>,
    pub scrub_interval: Option<String>,
    pub scrub_rate: Option<String>,
    pub min_free: Option<String>,
    pub gc_interval: Option<String>,
    pub memory: Option<String>,
    pub memory_object_max: Option<String>,
}

/// Command-line values that override the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub data: Option<PathBuf>,
    pub upstreams: Vec<String>,
    pub default_upstream: Option<String>,
    pub log_format: Option<String>,
    pub image_factory: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub auth_htpasswd: Option<PathBuf>,
    pub auth_token_file: Option<PathBuf>,
    pub admin_token_file: Option<PathBuf>,
    pub admin_listen: Option<String>,
    pub parents: Vec<String>,
    pub parent_ca: Option<PathBuf>,
    pub parent_client_cert: Option<PathBuf>,
    pub parent_client_key: Option<PathBuf>,
    pub parent_username: Option<String>,
    pub parent_password_file: Option<PathBuf>,
    /// `--parent-fallback-to-upstream`: `parent.fallbackToUpstream: true`.
    pub parent_fallback_to_upstream: bool,
    /// `--offline`: every upstream and the Image Factory.
    pub offline: bool,
}

/// Tiered caches: the parent tenders (tried in order) and how to reach them.
#[derive(Debug, Clone)]
pub struct ParentSettings {
    pub urls: Vec<Url>,
    pub ca_file: Option<PathBuf>,
    pub client_identity: Option<(PathBuf, PathBuf)>,
    pub credentials: Option<Credentials>,
    /// `parent.fallbackToUpstream`: when no parent answers, a name this tender's own config
    /// also lists goes to that upstream itself (default false: the site's link is not
    /// flooded by surprise).
    pub fallback_to_upstream: bool,
}

/// TLS serving, resolved (`tls:` and the `--tls-*` flags).
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub files: tender_server::tls::TlsFiles,
    pub reload_interval: Duration,
}

/// Client authentication, resolved; the files are read (and checked) here.
#[derive(Clone)]
pub struct AuthSettings {
    pub users: std::collections::HashMap<String, String>,
    pub tokens: Vec<String>,
    pub anonymous_pull: bool,
}

impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("tokens", &self.tokens.len())
            .field("anonymous_pull", &self.anonymous_pull)
            .finish()
    }
}

/// The admin surface, resolved.
#[derive(Clone)]
pub struct AdminSettings {
    pub token: Option<String>,
    pub listen: Option<SocketAddr>,
    /// `admin.maxImportSize`: the largest bundle `POST /api/v1/admin/import` takes.
    pub max_import_size: u64,
}

impl std::fmt::Debug for AdminSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminSettings")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("listen", &self.listen)
            .field("max_import_size", &self.max_import_size)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Everything `serve` needs, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub data: PathBuf,
    pub log_format: LogFormat,
    pub upstreams: Vec<UpstreamSettings>,
    pub default_upstream: Option<String>,
    pub image_factory: Url,
    pub fetch: FetchSettings,
    /// Time to response headers from the Image Factory, which may build an asset first.
    pub factory_first_byte_timeout: Duration,
    pub cache_max_size: Option<u64>,
    /// `cache.minFree`: bytes a fill leaves free on the data directory's file system (None:
    /// the default, 5% of that file system and at most 1 GiB, resolved when serving).
    pub cache_min_free: Option<u64>,
    /// `fetch.factoryRangeBeforeVerify`: the Image Factory's `rangeBeforeVerify`.
    pub factory_range_before_verify: bool,
    /// `cache.scrubInterval`: every object re-hashed this often (zero: off), and
    /// `cache.scrubRate`: at most this many bytes per second (zero: unbounded).
    pub scrub_interval: Duration,
    pub scrub_rate: u64,
    pub gc_interval: Duration,
    /// Small objects kept in memory (`cache.memory`, `cache.memoryObjectMax`).
    pub memory: tender_store::MemoryLimit,
    /// The golden image catalog (`catalog:`), validated; see docs/catalog.md.
    pub catalog: tender_catalog::CatalogSettings,
    pub tls: Option<TlsSettings>,
    pub auth: Option<AuthSettings>,
    pub admin: AdminSettings,
    pub limits: tender_server::limits::Limits,
    /// `--parent`: every upstream request goes to these tenders instead.
    pub parent: Option<ParentSettings>,
    /// `storage.s3`: the bucket shared with other replicas.
    pub storage: Option<tender_bucket::BucketSettings>,
    /// `offline: true` or `--offline`: no upstream, the Image Factory included, is contacted.
    pub offline: bool,
    /// `imageVerification:`, compiled (empty: no policy).
    pub policy: std::sync::Arc<tender_verify::Policy>,
}

/// A configuration error: names the key and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: {key}: {message}")]
pub struct ConfigError {
    pub source_name: String,
    pub key: String,
    pub message: String,
}

/// The source of a value given on the command line, in its errors.
pub const COMMAND_LINE: &str = "command line";

/// An error about a value that came from `flag` when it was given, else from the file's `key`:
/// a bad flag reads as a bad flag, never as an error in the (embedded) config file.
fn origin_err(name: &str, from_flag: bool, flag: &str, key: &str, message: String) -> ConfigError {
    let (source_name, key) = if from_flag { (COMMAND_LINE, flag) } else { (name, key) };
    ConfigError { source_name: source_name.to_string(), key: key.to_string(), message }
}

/// Read the config file (or the embedded default) and parse it.
pub fn read(path: Option<&Path>) -> Result<(String, RawConfig), ConfigError> {
    let (name, text) = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| ConfigError {
                source_name: p.display().to_string(),
                key: "(file)".into(),
                message: format!("cannot read: {e}; check --config"),
            })?;
            (p.display().to_string(), text)
        }
        None => ("embedded default config".to_string(), DEFAULT_CONFIG.to_string()),
    };
    let raw = parse(&name, &text)?;
    Ok((name, raw))
}

/// The settings of a command that works on a data directory: the config file (or the embedded
/// default) with only `--data` applied.
pub fn load(path: Option<&Path>, data: Option<PathBuf>) -> Result<Settings, ConfigError> {
    let (name, raw) = read(path)?;
    resolve(&name, raw, &Overrides { data, ..Overrides::default() })
}

/// Parse a config file's text; `name` says where it came from in errors.
pub fn parse(name: &str, text: &str) -> Result<RawConfig, ConfigError> {
    if text.trim().is_empty() {
        return Ok(RawConfig::default());
    }
    serde_norway::from_str(text).map_err(|e| {
        // serde_norway leaves the position out at line 1 column 1 (and has none for some
        // errors), and a file that is not a mapping is refused naming a Rust type: always say
        // where, and what was expected.
        let mut msg = e.to_string().replace("struct RawConfig", "a mapping of config keys (listen, upstreams, ...)");
        if !msg.contains(" at line ") {
            match e.location() {
                Some(l) => msg.push_str(&format!(" at line {} column {}", l.line(), l.column())),
                None => msg.push_str(" at the top level of the file"),
            }
        }
        // serde names the unknown or mistyped key; say what to do about it.
        let fix = if msg.contains("unknown field") {
            "; remove it or fix its spelling (see README, Configuration)"
        } else {
            "; see README, Configuration"
        };
        ConfigError { source_name: name.to_string(), key: "(yaml)".into(), message: format!("{msg}{fix}") }
    })
}

/// `staleMaxAge`: `never` or a duration.
fn stale_limit(name: &str, key: &str, v: &Option<String>) -> Result<Option<StaleLimit>, ConfigError> {
    match v.as_deref().map(str::trim) {
        None => Ok(None),
        Some("never") => Ok(Some(StaleLimit::Never)),
        Some(s) => humantime::parse_duration(s).map(|d| Some(StaleLimit::Max(d))).map_err(|e| ConfigError {
            source_name: name.to_string(),
            key: key.to_string(),
            message: format!("{s:?} is neither never nor a duration ({e}); write never, or a limit like 168h"),
        }),
    }
}

fn duration(name: &str, key: &str, v: &Option<String>, default: Duration) -> Result<Duration, ConfigError> {
    match v {
        None => Ok(default),
        Some(s) => humantime::parse_duration(s.trim()).map_err(|e| ConfigError {
            source_name: name.to_string(),
            key: key.to_string(),
            message: format!("{s:?} is not a duration ({e}); write it like 30s, 5m, 1h or 168h"),
        }),
    }
}

/// The largest `cache.memoryObjectMax`: an object is read whole, and verified, per request
/// when it is not in memory.
const MAX_MEMORY_OBJECT: u64 = 16 << 20;

/// Parse a size: plain bytes, or with K/M/G/T (powers of 1000) or Ki/Mi/Gi/Ti (powers of 1024).
/// `limits.maxManifestSize` bounds (a manifest is held in memory whole). The spec asks a
/// registry to take manifests of at least 4 MiB: below that, some images will not pull.
const MIN_MANIFEST_SIZE: usize = 16 << 10;
const MAX_MANIFEST_SIZE: usize = 256 << 20;

pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        "Ki" | "KiB" => 1 << 10,
        "Mi" | "MiB" => 1 << 20,
        "Gi" | "GiB" => 1 << 30,
        "Ti" | "TiB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

fn valid_upstream_name(n: &str) -> bool {
    let (host, port) = match n.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (n, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    host_ok && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
}

fn http_url(name: &str, key: &str, s: &str) -> Result<Url, ConfigError> {
    let err = |m: String| ConfigError { source_name: name.to_string(), key: key.to_string(), message: m };
    let u =
        Url::parse(s.trim()).map_err(|e| err(format!("{s:?} is not a URL ({e}); write it like https://ghcr.io")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(err(format!("{s:?} is not an http(s) URL; write it like https://ghcr.io")));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(err(format!("{s:?} has no host")));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(err(format!("{s:?} carries credentials; use username and passwordFile instead")));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(err(format!("{s:?} has a query or fragment; give the registry's base URL only")));
    }
    Ok(u)
}

/// Apply the flags to the file and validate everything.
pub fn resolve(name: &str, mut raw: RawConfig, o: &Overrides) -> Result<Settings, ConfigError> {
    let err = |key: &str, m: String| ConfigError { source_name: name.to_string(), key: key.to_string(), message: m };

    // --upstream NAME=URL adds an upstream or replaces its URL.
    for (i, spec) in o.upstreams.iter().enumerate() {
        let key = format!("--upstream[{i}]");
        let Some((n, u)) = spec.split_once('=') else {
            return Err(origin_err(
                name,
                true,
                &key,
                &key,
                format!("{spec:?} is not NAME=URL; write it like ghcr.io=http://127.0.0.1:5001"),
            ));
        };
        let n = n.trim().to_ascii_lowercase();
        match raw.upstreams.iter_mut().find(|x| x.name.eq_ignore_ascii_case(&n)) {
            Some(existing) => existing.url = u.trim().to_string(),
            None => raw.upstreams.push(RawUpstream { name: n, url: u.trim().to_string(), ..RawUpstream::default() }),
        }
    }

    let listen_s = o.listen.clone().or(raw.listen.clone()).unwrap_or_else(|| "127.0.0.1:5000".to_string());
    let listen = listen_s.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
        let m = format!("{listen_s:?} is not an address; use HOST:PORT such as 127.0.0.1:5000");
        origin_err(name, o.listen.is_some(), "--listen", "listen", m)
    })?;
    let data = o.data.clone().or(raw.data.clone()).unwrap_or_else(|| PathBuf::from("./tender-data"));
    let log_format = match o.log_format.as_deref().or(raw.log_format.as_deref()).unwrap_or("text") {
        "text" => LogFormat::Text,
        "json" => LogFormat::Json,
        other => {
            let m = format!("{other:?} is not a log format; use text or json");
            return Err(origin_err(name, o.log_format.is_some(), "--log-format", "logFormat", m));
        }
    };

    let auth = resolve_auth(name, &raw.auth, o)?;
    let mut upstreams: Vec<UpstreamSettings> = Vec::new();
    for (i, u) in raw.upstreams.iter().enumerate() {
        let key = |k: &str| format!("upstreams[{i}].{k}");
        let uname = u.name.trim().to_ascii_lowercase();
        if !valid_upstream_name(&uname) {
            return Err(err(
                &key("name"),
                format!("{:?} is not a registry host name; use the host clients pull from, like ghcr.io or registry.local:5000", u.name),
            ));
        }
        if upstreams.iter().any(|x| x.name == uname) {
            return Err(err(&key("name"), format!("{uname:?} is configured twice; keep one entry per upstream")));
        }
        let url = http_url(name, &key("url"), &u.url)?;
        let mut endpoints = Vec::new();
        for (j, e) in u.endpoints.iter().enumerate() {
            endpoints.push(http_url(name, &format!("upstreams[{i}].endpoints[{j}]"), e)?);
        }
        endpoints.push(url);
        let proxy = match &u.proxy {
            Some(p) => Some(http_url(name, &key("proxy"), p)?),
            None => None,
        };
        if let Some(ca) = &u.ca_file {
            if !ca.is_file() {
                return Err(err(&key("caFile"), format!("{} is not a readable file", ca.display())));
            }
        }
        let credentials = match (&u.username, &u.password_file, &u.password_env) {
            (None, None, None) => None,
            (Some(user), Some(file), None) => {
                tender_server::auth::warn_if_exposed(file, &key("passwordFile"));
                let p = std::fs::read_to_string(file)
                    .map_err(|e| err(&key("passwordFile"), format!("{}: {e}", file.display())))?;
                Some(Credentials { username: user.clone(), password: p.trim_end_matches(['\n', '\r']).to_string() })
            }
            (Some(user), None, Some(var)) => {
                let p = std::env::var(var)
                    .map_err(|_| err(&key("passwordEnv"), format!("environment variable {var} is not set")))?;
                Some(Credentials { username: user.clone(), password: p })
            }
            (Some(_), Some(_), Some(_)) => {
                return Err(err(&key("passwordFile"), "set passwordFile or passwordEnv, not both".into()))
            }
            (Some(_), None, None) => {
                return Err(err(&key("username"), "has no password; add passwordFile or passwordEnv".into()))
            }
            (None, _, _) => {
                return Err(err(&key("username"), "a password is set without a username; add username".into()))
            }
        };
        if u.private && u.public {
            return Err(err(&key("private"), format!("{uname}: private and public contradict each other; keep one")));
        }
        if u.private && auth.is_none() {
            return Err(err(
                &key("private"),
                format!(
                    "{uname} is private: its content goes only to authenticated clients, and no client can \
                     authenticate; turn on client authentication (auth.htpasswd / auth.tokenFile, \
                     --auth-htpasswd / --auth-token-file)"
                ),
            ));
        }
        if credentials.is_some() && !u.public && auth.is_none() {
            return Err(err(
                &key("public"),
                format!(
                    "{uname} has credentials, and a pull-through cache hands its content to everyone who reaches tender; \
                     turn on client authentication (auth.htpasswd / auth.tokenFile, --auth-htpasswd / --auth-token-file) \
                     so only authenticated clients get it, or set public: true to accept that"
                ),
            ));
        }
        let max_object_size = match &u.max_object_size {
            None => Some(DEFAULT_MAX_OBJECT_SIZE),
            Some(s) => Some(parse_size(s).ok_or_else(|| {
                err(&key("maxObjectSize"), format!("{s:?} is not a size; write it like 20Gi, 500M or 1073741824"))
            })?),
        };
        upstreams.push(UpstreamSettings {
            library_prefix: u.library_prefix.unwrap_or(uname == "docker.io"),
            name: uname,
            endpoints,
            ca_file: u.ca_file.clone(),
            insecure_skip_verify: u.insecure_skip_verify,
            proxy,
            credentials,
            public: u.public,
            private: u.private,
            range_before_verify: u.range_before_verify,
            redirect_hosts: u.redirect_hosts.clone(),
            token_realm_hosts: u.token_realm_hosts.clone().unwrap_or_default(),
            max_object_size,
            stale_max_age: stale_limit(name, &key("staleMaxAge"), &u.stale_max_age)?,
            ns_param: None,
            fallback: None,
            client_identity: None,
            offline: u.offline || raw.offline || o.offline,
        });
    }

    let default_upstream = o.default_upstream.clone().or(raw.default_upstream.clone()).map(|d| d.to_ascii_lowercase());
    if let Some(d) = &default_upstream {
        if !upstreams.iter().any(|u| &u.name == d) {
            let names: Vec<&str> = upstreams.iter().map(|u| u.name.as_str()).collect();
            let m = format!("{d:?} is not a configured upstream; use one of {names:?} or add it under upstreams");
            return Err(origin_err(name, o.default_upstream.is_some(), "--default-upstream", "defaultUpstream", m));
        }
    }

    let factory_s =
        o.image_factory.clone().or(raw.image_factory.clone()).unwrap_or_else(|| "https://factory.talos.dev".into());
    let image_factory = match o.image_factory {
        Some(_) => http_url(COMMAND_LINE, "--image-factory", &factory_s)?,
        None => http_url(name, "imageFactory", &factory_s)?,
    };

    let d = FetchSettings::default();
    let f = &raw.fetch;
    let fetch = FetchSettings {
        attempts: match f.attempts {
            Some(0) => return Err(err("fetch.attempts", "must be at least 1".into())),
            Some(n) => n,
            None => d.attempts,
        },
        connect_timeout: duration(name, "fetch.connectTimeout", &f.connect_timeout, d.connect_timeout)?,
        first_byte_timeout: duration(name, "fetch.firstByteTimeout", &f.first_byte_timeout, d.first_byte_timeout)?,
        stall_timeout: duration(name, "fetch.stallTimeout", &f.stall_timeout, d.stall_timeout)?,
        fill_deadline: duration(name, "fetch.fillDeadline", &f.fill_deadline, d.fill_deadline)?,
        backoff_base: duration(name, "fetch.backoffBase", &f.backoff_base, d.backoff_base)?,
        backoff_max: duration(name, "fetch.backoffMax", &f.backoff_max, d.backoff_max)?,
        tag_ttl: duration(name, "fetch.tagTtl", &f.tag_ttl, d.tag_ttl)?,
        stale_max_age: stale_limit(name, "fetch.staleMaxAge", &f.stale_max_age)?.unwrap_or(d.stale_max_age),
        max_concurrent_fills: match raw.limits.max_concurrent_fills {
            Some(0) => return Err(err("limits.maxConcurrentFills", "must be at least 1".into())),
            Some(n) => Some(n),
            None => d.max_concurrent_fills,
        },
        max_fills_per_upstream: match raw.limits.max_fills_per_upstream {
            Some(0) => return Err(err("limits.maxFillsPerUpstream", "must be at least 1".into())),
            Some(n) => Some(n),
            None => d.max_fills_per_upstream,
        },
        abandoned_fill_grace: duration(
            name,
            "limits.abandonedFillGrace",
            &raw.limits.abandoned_fill_grace,
            d.abandoned_fill_grace,
        )?,
        metadata_timeout: duration(name, "fetch.metadataTimeout", &f.metadata_timeout, d.metadata_timeout)?,
        max_manifest_size: match &raw.limits.max_manifest_size {
            None => d.max_manifest_size,
            Some(s) => match parse_size(s).and_then(|n| usize::try_from(n).ok()) {
                Some(n) if (MIN_MANIFEST_SIZE..=MAX_MANIFEST_SIZE).contains(&n) => n,
                Some(_) => {
                    return Err(err(
                        "limits.maxManifestSize",
                        format!(
                            "{s:?} is out of range: 16Ki to 256Mi (the distribution spec asks a registry to take 4Mi)"
                        ),
                    ))
                }
                None => return Err(err("limits.maxManifestSize", format!("{s:?} is not a size; write it like 8Mi"))),
            },
        },
        max_decoded_size: match &f.max_decoded_size {
            None => d.max_decoded_size,
            Some(s) => match parse_size(s) {
                Some(n) if n > 0 => n,
                _ => {
                    return Err(err("fetch.maxDecodedSize", format!("{s:?} is not a size above 0; write it like 64Gi")))
                }
            },
        },
    };
    let fetch = clamp_fills_per_upstream(fetch);
    let cache_max_size = match &raw.cache.max_size {
        None => None,
        Some(s) => Some(parse_size(s).ok_or_else(|| {
            err("cache.maxSize", format!("{s:?} is not a size; write it like 500Gi, 100G or 1073741824"))
        })?),
    };
    let cache_min_free = match &raw.cache.min_free {
        None => None,
        Some(s) => Some(parse_size(s).ok_or_else(|| {
            err("cache.minFree", format!("{s:?} is not a size; write it like 1Gi, 500M or 0 (no floor)"))
        })?),
    };
    let factory_first_byte_timeout =
        duration(name, "fetch.factoryFirstByteTimeout", &f.factory_first_byte_timeout, Duration::from_secs(600))?;
    let gc_interval = duration(name, "cache.gcInterval", &raw.cache.gc_interval, Duration::from_secs(300))?;
    let scrub_interval = duration(name, "cache.scrubInterval", &raw.cache.scrub_interval, Duration::from_secs(86_400))?;
    let scrub_rate = match &raw.cache.scrub_rate {
        None => 32 << 20,
        Some(s) => parse_size(s).ok_or_else(|| {
            err("cache.scrubRate", format!("{s:?} is not a size per second; write it like 32Mi, or 0 for no bound"))
        })?,
    };
    let memory = {
        let d = tender_store::MemoryLimit::default();
        let size = |key: &str, v: &Option<String>, default: u64| match v {
            None => Ok(default),
            Some(s) => parse_size(s)
                .ok_or_else(|| err(key, format!("{s:?} is not a size; write it like 64Mi, 0 (off) or 65536"))),
        };
        let limit = tender_store::MemoryLimit {
            bytes: size("cache.memory", &raw.cache.memory, d.bytes)?,
            max_object: size("cache.memoryObjectMax", &raw.cache.memory_object_max, d.max_object)?,
        };
        if limit.max_object > MAX_MEMORY_OBJECT {
            return Err(err(
                "cache.memoryObjectMax",
                format!("{} bytes is over the limit of {MAX_MEMORY_OBJECT} (16Mi): larger objects are sent from their files", limit.max_object),
            ));
        }
        limit
    };
    let catalog = tender_catalog::config::resolve(raw.catalog.as_ref(), &data, image_factory.as_str())
        .map_err(|p| err(&p.key, p.message))?;
    let tls = resolve_tls(name, &raw.tls, o)?;
    let admin = resolve_admin(name, &raw.admin, o)?;
    let limits = resolve_limits(name, &raw.limits)?;
    let parent = resolve_parent(name, &raw.parent, o)?;
    let storage = match &raw.storage.s3 {
        Some(s3) => Some(resolve_s3(name, s3)?),
        None => None,
    };
    let policy = std::sync::Arc::new(resolve_policy(name, raw.image_verification.as_ref())?);
    Ok(Settings {
        policy,
        offline: raw.offline || o.offline,
        parent,
        storage,
        tls,
        auth,
        admin,
        limits,
        listen,
        data,
        log_format,
        upstreams,
        default_upstream,
        image_factory,
        fetch,
        factory_first_byte_timeout,
        cache_max_size,
        cache_min_free,
        factory_range_before_verify: f.factory_range_before_verify.unwrap_or(false),
        scrub_interval,
        scrub_rate,
        memory,
        gc_interval,
        catalog,
    })
}

/// `imageVerification:`: the rules compiled, the trusted root read and parsed.
fn resolve_policy(name: &str, raw: Option<&tender_verify::RawPolicy>) -> Result<tender_verify::Policy, ConfigError> {
    let err = |key: &str, m: String| ConfigError { source_name: name.to_string(), key: key.to_string(), message: m };
    let Some(raw) = raw else { return Ok(tender_verify::Policy::default()) };
    let root = match &raw.trusted_root {
        Some(path) => {
            let key = "imageVerification.trustedRoot";
            let meta = std::fs::metadata(path).map_err(|e| err(key, format!("cannot read {path}: {e}")))?;
            if meta.len() > tender_verify::root::MAX_TRUSTED_ROOT as u64 {
                return Err(err(key, format!("{path} is larger than {} bytes", tender_verify::root::MAX_TRUSTED_ROOT)));
            }
            Some(std::fs::read(path).map_err(|e| err(key, format!("cannot read {path}: {e}")))?)
        }
        None => None,
    };
    tender_verify::Policy::compile(raw, root.as_deref()).map_err(|e| err(&e.key, e.problem))
}

fn resolve_tls(name: &str, raw: &RawTls, o: &Overrides) -> Result<Option<TlsSettings>, ConfigError> {
    let err = |key: &str, m: String| ConfigError { source_name: name.to_string(), key: key.to_string(), message: m };
    let cert = o.tls_cert.clone().or(raw.cert.clone());
    let key = o.tls_key.clone().or(raw.key.clone());
    let client_ca = o.tls_client_ca.clone().or(raw.client_ca.clone());
    let (cert, key) = match (cert, key) {
        (None, None) if client_ca.is_none() => return Ok(None),
        (Some(c), Some(k)) => (c, k),
        (None, _) => {
            return Err(err("tls.cert", "is missing; give --tls-cert with --tls-key (and --tls-client-ca)".into()))
        }
        (_, None) => return Err(err("tls.key", "is missing; give --tls-key with --tls-cert".into())),
    };
    let reload_interval = duration(name, "tls.reloadInterval", &raw.reload_interval, Duration::from_secs(10))?;
    let files = tender_server::tls::TlsFiles { cert, key, client_ca };
    // Fail at start, naming the file, rather than at the first handshake.
    tender_server::tls::build(&files).map_err(|e| {
        let from_flag = match e.flag {
            "--tls-cert" => o.tls_cert.is_some(),
            "--tls-key" => o.tls_key.is_some(),
            _ => o.tls_client_ca.is_some(),
        };
        let key = match e.flag {
            "--tls-cert" => "tls.cert",
            "--tls-key" => "tls.key",
            _ => "tls.clientCa",
        };
        origin_err(name, from_flag, e.flag, key, e.to_string())
    })?;
    Ok(Some(TlsSettings { files, reload_interval }))
}

fn resolve_auth(name: &str, raw: &RawAuth, o: &Overrides) -> Result<Option<AuthSettings>, ConfigError> {
    let err = |key: &str, m: String| ConfigError { source_name: name.to_string(), key: key.to_string(), message: m };
    let htpasswd = o.auth_htpasswd.clone().or(raw.htpasswd.clone());
    let token_file = o.auth_token_file.clone().or(raw.token_file.clone());
    if htpasswd.is_none() && token_file.is_none() {
        if raw.anonymous_pull {
            return Err(err("auth.anonymousPull", "means nothing without auth.htpasswd or auth.tokenFile".into()));
        }
        return Ok(None);
    }
    let users = match &htpasswd {
        Some(p) => tender_server::auth::read_htpasswd(p).map_err(|e| {
            origin_err(name, o.auth_htpasswd.is_some(), "--auth-htpasswd", "auth.htpasswd", e.to_string())
        })?,
        None => std::collections::HashMap::new(),
    };
    let tokens = match &token_file {
        Some(p) => tender_server::auth::read_tokens(p).map_err(|e| {
            origin_err(name, o.auth_token_file.is_some(), "--auth-token-file", "auth.tokenFile", e.to_string())
        })?,
        None => Vec::new(),
    };
    Ok(Some(AuthSettings { users, tokens, anonymous_pull: raw.anonymous_pull }))
}

fn resolve_admin(name: &str, raw: &RawAdmin, o: &Overrides) -> Result<AdminSettings, ConfigError> {
    let flag = o.admin_token_file.is_some();
    let err = |key: &str, m: String| origin_err(name, flag, "--admin-token-file", key, m);
    let token = match o.admin_token_file.clone().or(raw.token_file.clone()) {
        None => None,
        Some(p) => {
            let mut t = tender_server::auth::read_tokens(&p).map_err(|e| err("admin.tokenFile", e.to_string()))?;
            if t.len() != 1 {
                return Err(err(
                    "admin.tokenFile",
                    format!("{}: holds {} tokens; keep exactly one", p.display(), t.len()),
                ));
            }
            t.pop()
        }
    };
    let listen = match o.admin_listen.clone().or(raw.listen.clone()) {
        None => None,
        Some(s) => Some(s.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
            let m = format!("{s:?} is not an address; use HOST:PORT such as 127.0.0.1:5001");
            origin_err(name, o.admin_listen.is_some(), "--admin-listen", "admin.listen", m)
        })?),
    };
    let max_import_size = match &raw.max_import_size {
        None => DEFAULT_MAX_IMPORT_SIZE,
        Some(s) => parse_size(s).filter(|n| *n > 0).ok_or_else(|| {
            origin_err(name, false, "", "admin.maxImportSize", format!("{s:?} is not a size like 64GiB"))
        })?,
    };
    Ok(AdminSettings { token, listen, max_import_size })
}

/// `admin.maxImportSize` unless set: a Talos release with its images is a few GiB.
pub const DEFAULT_MAX_IMPORT_SIZE: u64 = 64 << 30;

fn resolve_parent(name: &str, raw: &RawParent, o: &Overrides) -> Result<Option<ParentSettings>, ConfigError> {
    let err = |key: &str, m: String| ConfigError { source_name: name.to_string(), key: key.to_string(), message: m };
    let (key, list) = if o.parents.is_empty() { ("parent.urls", &raw.urls) } else { ("--parent", &o.parents) };
    if list.is_empty() {
        return Ok(None);
    }
    let mut urls = Vec::new();
    let source = if o.parents.is_empty() { name } else { COMMAND_LINE };
    for (i, u) in list.iter().enumerate() {
        urls.push(http_url(source, &format!("{key}[{i}]"), u)?);
    }
    let ca_file = o.parent_ca.clone().or(raw.ca_file.clone());
    if let Some(ca) = &ca_file {
        if !ca.is_file() {
            let m = format!("{} is not a readable file", ca.display());
            return Err(origin_err(name, o.parent_ca.is_some(), "--parent-ca", "parent.caFile", m));
        }
    }
    let client_identity = match (
        o.parent_client_cert.clone().or(raw.client_cert.clone()),
        o.parent_client_key.clone().or(raw.client_key.clone()),
    ) {
        (None, None) => None,
        (Some(c), Some(k)) => Some((c, k)),
        (Some(_), None) => return Err(err("parent.clientKey", "is missing; give it with parent.clientCert".into())),
        (None, Some(_)) => return Err(err("parent.clientCert", "is missing; give it with parent.clientKey".into())),
    };
    let credentials = match (
        o.parent_username.clone().or(raw.username.clone()),
        o.parent_password_file.clone().or(raw.password_file.clone()),
    ) {
        (None, None) => None,
        (Some(user), Some(file)) => {
            tender_server::auth::warn_if_exposed(&file, "parent.passwordFile");
            let p = std::fs::read_to_string(&file).map_err(|e| {
                let m = format!("{}: {e}", file.display());
                origin_err(name, o.parent_password_file.is_some(), "--parent-password-file", "parent.passwordFile", m)
            })?;
            Some(Credentials { username: user, password: p.trim_end_matches(['\n', '\r']).to_string() })
        }
        (Some(_), None) => return Err(err("parent.passwordFile", "is missing; give it with parent.username".into())),
        (None, Some(_)) => return Err(err("parent.username", "is missing; give it with parent.passwordFile".into())),
    };
    let fallback_to_upstream = o.parent_fallback_to_upstream || raw.fallback_to_upstream;
    Ok(Some(ParentSettings { urls, ca_file, client_identity, credentials, fallback_to_upstream }))
}

fn resolve_s3(name: &str, raw: &RawS3) -> Result<tender_bucket::BucketSettings, ConfigError> {
    let err = |key: &str, m: String| ConfigError { source_name: name.to_string(), key: key.to_string(), message: m };
    let bucket = match raw.bucket.as_deref().map(str::trim) {
        Some(b) if !b.is_empty() => b,
        _ => return Err(err("storage.s3.bucket", "is missing; name the bucket the replicas share".into())),
    };
    if bucket.len() < 3
        || bucket.len() > 63
        || !bucket.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
    {
        return Err(err("storage.s3.bucket", format!("{bucket:?} is not an S3 bucket name (3-63 of a-z 0-9 . -)")));
    }
    let mut s = tender_bucket::BucketSettings::new(bucket);
    if let Some(e) = &raw.endpoint {
        let u = http_url(name, "storage.s3.endpoint", e)?;
        if u.scheme() == "http" && !u.host_str().is_some_and(is_loopback_host) {
            tracing::warn!(
                "storage.s3.endpoint {e} is plain http: credentials are signed, but objects travel unencrypted"
            );
        }
        s.endpoint = Some(e.trim_end_matches('/').to_string());
    }
    if let Some(r) = &raw.region {
        s.region = r.clone();
    }
    if let Some(p) = &raw.prefix {
        let p = p.trim_matches('/');
        if p.split('/').any(|c| c.is_empty() || c == "." || c == "..") && !p.is_empty() {
            return Err(err("storage.s3.prefix", format!("{p:?} has an empty, . or .. component")));
        }
        s.prefix = p.to_string();
    }
    let read = |key: &str, f: &PathBuf| {
        tender_server::auth::warn_if_exposed(f, key);
        std::fs::read_to_string(f).map(|v| v.trim().to_string()).map_err(|e| err(key, format!("{}: {e}", f.display())))
    };
    s.credentials = match (&raw.access_key_id_file, &raw.secret_access_key_file) {
        (None, None) => None,
        (Some(a), Some(k)) => Some(tender_bucket::Credentials {
            access_key_id: read("storage.s3.accessKeyIdFile", a)?,
            secret_access_key: read("storage.s3.secretAccessKeyFile", k)?,
            session_token: None,
        }),
        (Some(_), None) => {
            return Err(err("storage.s3.secretAccessKeyFile", "is missing; give it with accessKeyIdFile".into()))
        }
        (None, Some(_)) => {
            return Err(err("storage.s3.accessKeyIdFile", "is missing; give it with secretAccessKeyFile".into()))
        }
    };
    if let Some(v) = raw.path_style {
        s.path_style = v;
    }
    if let Some(v) = raw.sign_payload {
        s.sign_payload = v;
    }
    if let Some(c) = &raw.chunk_size {
        s.chunk_size = match parse_size(c) {
            Some(n) if (tender_bucket::MIN_CHUNK_SIZE..=tender_bucket::MAX_CHUNK_SIZE).contains(&n) => n,
            _ => {
                return Err(err(
                    "storage.s3.chunkSize",
                    format!("{c:?} is not a size from 5Mi to 1Gi; write it like 8Mi"),
                ))
            }
        };
    }
    if let Some(l) = raw.lease {
        s.lease = l;
    }
    s.lease_ttl = duration(name, "storage.s3.leaseTtl", &raw.lease_ttl, s.lease_ttl)?;
    if s.lease_ttl < Duration::from_secs(3) {
        return Err(err("storage.s3.leaseTtl", "must be at least 3s (the holder renews every third of it)".into()));
    }
    s.request_timeout = duration(name, "storage.s3.requestTimeout", &raw.request_timeout, s.request_timeout)?;
    // The default never outlasts a shorter requestTimeout; a configured one may not.
    s.connect_timeout = duration(name, "storage.s3.connectTimeout", &raw.connect_timeout, s.connect_timeout)?;
    if raw.connect_timeout.is_none() {
        s.connect_timeout = s.connect_timeout.min(s.request_timeout);
    } else if s.connect_timeout > s.request_timeout {
        return Err(err("storage.s3.connectTimeout", "must not be longer than storage.s3.requestTimeout".into()));
    }
    if let Some(r) = raw.retries {
        if r > 10 {
            return Err(err(
                "storage.s3.retries",
                format!("{r} is more than 10; each retry waits within requestTimeout"),
            ));
        }
        s.retries = r as usize;
    }
    s.probe_interval = duration(name, "storage.s3.probeInterval", &raw.probe_interval, s.probe_interval)?;
    if s.probe_interval < Duration::from_millis(100) {
        return Err(err("storage.s3.probeInterval", "must be at least 100ms".into()));
    }
    if let Some(m) = &raw.max_size {
        s.max_size = Some(parse_size(m).ok_or_else(|| {
            err("storage.s3.maxSize", format!("{m:?} is not a size; write it like 500Gi, 100G or 1073741824"))
        })?);
    }
    s.gc_grace = duration(name, "storage.s3.gcGrace", &raw.gc_grace, s.gc_grace)?;
    if let Some(f) = &raw.index_key_file {
        let key = read("storage.s3.indexKeyFile", f)?;
        if key.len() < 32 {
            return Err(err(
                "storage.s3.indexKeyFile",
                format!(
                    "{}: the key is {} characters; give at least 32 (e.g. `openssl rand -hex 32`), the same on every replica",
                    f.display(),
                    key.len()
                ),
            ));
        }
        s.index_key = Some(tender_bucket::IndexKey::new(key.as_bytes()));
    }
    s.replica = match &raw.replica {
        Some(r) => r.clone(),
        None => std::env::var("HOSTNAME")
            .ok()
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| format!("tender-{}", std::process::id())),
    };
    Ok(s)
}

fn is_loopback_host(h: &str) -> bool {
    h == "localhost" || h.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn resolve_limits(name: &str, raw: &RawLimits) -> Result<tender_server::limits::Limits, ConfigError> {
    let err = |key: &str, m: String| ConfigError { source_name: name.to_string(), key: key.to_string(), message: m };
    let d = tender_server::limits::Limits::default();
    let count = |key: &str, v: Option<usize>, default: usize| match v {
        Some(0) => Err(err(key, "must be at least 1".into())),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let bytes = |key: &str, v: &Option<String>, default: usize, min: usize| match v {
        None => Ok(default),
        Some(s) => match parse_size(s).and_then(|n| usize::try_from(n).ok()) {
            Some(n) if n >= min => Ok(n),
            Some(_) => Err(err(key, format!("{s:?} is too small; at least {min} bytes"))),
            None => Err(err(key, format!("{s:?} is not a size; write it like 64Ki or 8192"))),
        },
    };
    Ok(tender_server::limits::Limits {
        max_url_bytes: bytes("limits.maxUrlBytes", &raw.max_url_bytes, d.max_url_bytes, 256)?,
        max_header_bytes: bytes("limits.maxHeaderBytes", &raw.max_header_bytes, d.max_header_bytes, 8192)?,
        header_timeout: duration(name, "limits.headerTimeout", &raw.header_timeout, d.header_timeout)?,
        handshake_timeout: duration(name, "limits.handshakeTimeout", &raw.handshake_timeout, d.handshake_timeout)?,
        max_client_requests: count("limits.maxClientRequests", raw.max_client_requests, d.max_client_requests)?,
        max_connections: count("limits.maxConnections", raw.max_connections, d.max_connections)?,
        max_connections_per_address: count(
            "limits.maxConnectionsPerAddress",
            raw.max_connections_per_address,
            d.max_connections_per_address,
        )?,
        first_byte_timeout: duration(name, "limits.firstByteTimeout", &raw.first_byte_timeout, d.first_byte_timeout)?,
        idle_timeout: duration(name, "limits.idleTimeout", &raw.idle_timeout, d.idle_timeout)?,
        send_stall_timeout: match duration(
            name,
            "limits.sendStallTimeout",
            &raw.send_stall_timeout,
            d.send_stall_timeout,
        )? {
            t if t < Duration::from_secs(1) => {
                return Err(err(
                    "limits.sendStallTimeout",
                    "must be at least 1s (a busy link pauses for longer)".into(),
                ))
            }
            t => t,
        },
        send_buffer: match &raw.send_buffer {
            // 0: the system's default
            Some(s) if s.trim() == "0" => 0,
            v => bytes("limits.sendBuffer", v, d.send_buffer, 4096)?,
        },
    })
}

/// `maxFillsPerUpstream` exists so that one upstream never holds every fill slot: at or above
/// `maxConcurrentFills` it would, so it is clamped to half of that (at least 1), with a warning.
fn clamp_fills_per_upstream(mut fetch: FetchSettings) -> FetchSettings {
    if let (Some(all), Some(per)) = (fetch.max_concurrent_fills, fetch.max_fills_per_upstream) {
        if per >= all && all > 1 {
            let clamped = (all / 2).max(1);
            tracing::warn!(
                max_fills_per_upstream = per,
                max_concurrent_fills = all,
                clamped,
                "limits.maxFillsPerUpstream is at or above limits.maxConcurrentFills, so one upstream could take \
                 every fill slot: using half of maxConcurrentFills instead"
            );
            fetch.max_fills_per_upstream = Some(clamped);
        }
    }
    fetch
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    /// Issue 32 (9): one upstream never holds every fill slot, however the limits are set.
    #[test]
    fn should_clamp_fills_per_upstream_below_the_global_fill_cap() {
        let load = |limits: &str| {
            let yaml = format!("upstreams:\n  - name: ghcr.io\n    url: https://ghcr.io\nlimits:\n{limits}");
            resolve("t.yaml", parse("t.yaml", &yaml).unwrap(), &Overrides::default()).unwrap().fetch
        };
        let f = load("  maxConcurrentFills: 8\n  maxFillsPerUpstream: 8\n");
        assert_eq!((f.max_concurrent_fills, f.max_fills_per_upstream), (Some(8), Some(4)));
        let f = load("  maxConcurrentFills: 8\n  maxFillsPerUpstream: 100\n");
        assert_eq!(f.max_fills_per_upstream, Some(4));
        let f = load("  maxConcurrentFills: 8\n  maxFillsPerUpstream: 7\n");
        assert_eq!(f.max_fills_per_upstream, Some(7), "below the global cap: as configured");
        let f = load("  maxConcurrentFills: 1\n  maxFillsPerUpstream: 1\n");
        assert_eq!(f.max_fills_per_upstream, Some(1), "one slot in all: nothing to share");
    }

    fn check_err(yaml: &str, o: &Overrides, want: &[&str]) {
        let e = parse("t.yaml", yaml).and_then(|raw| resolve("t.yaml", raw, o)).expect_err("must fail");
        let msg = e.to_string();
        for w in want {
            assert!(msg.contains(w), "{msg:?} should contain {w:?}");
        }
    }

    /// Issue 34 (1): a Talos rule file pastes in unchanged; a rule that cannot work is refused
    /// at start with its key named.
    #[test]
    fn should_read_talos_image_verification_rules_and_refuse_bad_ones() {
        let talos = "imageVerification:\n  apiVersion: v1alpha1\n  kind: ImageVerificationConfig\n  rules:\n    - image: registry.k8s.io/*\n      skip: true\n    - image: '*'\n      deny: true\n";
        let s = resolve("t.yaml", parse("t.yaml", talos).unwrap(), &Overrides::default()).unwrap();
        assert_eq!(s.policy.rules.len(), 2);
        assert!(s.policy.rule_for("registry.k8s.io/pause").is_some_and(|r| r.index == 0));
        let none = Overrides::default();
        let rules = |r: &str| format!("imageVerification:\n  rules:\n{r}");
        check_err(&rules("    - image: x\n      colour: red\n"), &none, &["unknown field `colour`"]);
        check_err(&rules("    - image: x\n"), &none, &["imageVerification.rules[0]", "exactly one of"]);
        check_err(
            &rules("    - image: x\n      publicKey:\n        key: nope\n"),
            &none,
            &["imageVerification.rules[0].publicKey.key", "PEM"],
        );
        check_err(
            &rules(
                "    - image: x\n      keyless:\n        issuer: https://accounts.google.com\n        subject: a@b\n",
            ),
            &none,
            &["imageVerification.trustedRoot", "trusted_root.json"],
        );
        check_err(
            "imageVerification:\n  trustedRoot: /nonexistent/trusted_root.json\n",
            &none,
            &["imageVerification.trustedRoot", "cannot read"],
        );
        check_err(
            &rules("    - image: x\n      keyless:\n        issuer: i\n        subjectRegex: '('\n"),
            &none,
            &["imageVerification.rules[0].keyless.subjectRegex"],
        );
    }

    /// Issue 34 (6): the commented signature policy in the embedded default works as written
    /// once uncommented (with a real trusted root in place of its path).
    #[test]
    fn should_compile_the_default_configs_commented_signature_policy() {
        let block: Vec<&str> = DEFAULT_CONFIG
            .lines()
            .skip_while(|l| !l.starts_with("# imageVerification:"))
            .map_while(|l| l.strip_prefix("# "))
            .collect();
        assert!(block.len() > 5, "the commented example is gone");
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/sigstore/trusted_root.json");
        let yaml = block.join("\n").replace("/etc/tender/trusted_root.json", root);
        let s = resolve("t.yaml", parse("t.yaml", &yaml).unwrap(), &Overrides::default()).unwrap();
        let installer = s.policy.rule_for(
            "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba",
        );
        assert!(installer.is_some_and(|r| r.verifies()));
        assert!(s.policy.rule_for("ghcr.io/siderolabs/kubelet").is_some_and(|r| r.index == 0));
    }

    #[test]
    fn should_resolve_the_embedded_default() {
        let (name, raw) = read(None).unwrap();
        let s = resolve(&name, raw, &Overrides::default()).unwrap();
        let names: Vec<&str> = s.upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["docker.io", "ghcr.io", "registry.k8s.io", "quay.io", "factory.talos.dev"]);
        assert_eq!(s.upstreams[0].endpoints[0].as_str(), "https://registry-1.docker.io/");
        assert!(s.upstreams[0].library_prefix);
        assert!(!s.upstreams[1].library_prefix);
        assert_eq!(s.default_upstream.as_deref(), Some("docker.io"));
        assert_eq!(s.listen.to_string(), "127.0.0.1:5000");
        assert_eq!(s.image_factory.as_str(), "https://factory.talos.dev/");
    }

    #[test]
    fn should_cap_every_upstream_at_64_gib_unless_it_says_otherwise() {
        let yaml = "upstreams:\n  - name: ghcr.io\n    url: https://ghcr.io\n  - name: quay.io\n    url: https://quay.io\n    maxObjectSize: 1Ti\n";
        let s = resolve("t", parse("t", yaml).unwrap(), &Overrides::default()).unwrap();
        let sizes: Vec<Option<u64>> = s.upstreams.iter().map(|u| u.max_object_size).collect();
        assert_eq!(sizes, [Some(64 << 30), Some(1 << 40)]);
    }

    #[test]
    fn should_let_flags_add_and_replace_upstreams() {
        let (name, raw) = read(None).unwrap();
        let o = Overrides {
            upstreams: vec!["ghcr.io=http://127.0.0.1:5001".into(), "registry.local:5000=http://127.0.0.1:5002".into()],
            default_upstream: Some("ghcr.io".into()),
            listen: Some("127.0.0.1:0".into()),
            ..Overrides::default()
        };
        let s = resolve(&name, raw, &o).unwrap();
        let ghcr = s.upstreams.iter().find(|u| u.name == "ghcr.io").unwrap();
        assert_eq!(ghcr.endpoints.len(), 1);
        assert_eq!(ghcr.endpoints[0].as_str(), "http://127.0.0.1:5001/");
        assert!(s.upstreams.iter().any(|u| u.name == "registry.local:5000"));
        assert_eq!(s.default_upstream.as_deref(), Some("ghcr.io"));
    }

    #[test]
    fn should_name_the_key_and_fix_for_bad_config() {
        let none = Overrides::default();
        check_err("listen: 1.2.3.4:5000\nbogus: 1\n", &none, &["unknown field `bogus`", "remove it"]);
        check_err(
            "upstreams:\n  - name: a.io\n    url: https://a.io\n    colour: red\n",
            &none,
            &["unknown field `colour`"],
        );
        check_err(
            "upstreams:\n  - name: a.io\n    url: ftp://a.io\n",
            &none,
            &["upstreams[0].url", "not an http(s) URL"],
        );
        check_err("upstreams:\n  - name: a.io\n    url: not a url\n", &none, &["upstreams[0].url", "not a URL"]);
        check_err(
            "upstreams:\n  - name: a.io\n    url: https://a.io\n  - name: A.io\n    url: https://b.io\n",
            &none,
            &["upstreams[1].name", "configured twice"],
        );
        check_err(
            "upstreams:\n  - name: 'a io'\n    url: https://a.io\n",
            &none,
            &["upstreams[0].name", "not a registry host name"],
        );
        check_err("defaultUpstream: nope.io\n", &none, &["defaultUpstream", "not a configured upstream"]);
        check_err("fetch:\n  stallTimeout: soon\n", &none, &["fetch.stallTimeout", "not a duration"]);
        check_err("cache:\n  maxSize: lots\n", &none, &["cache.maxSize", "not a size"]);
        check_err("listen: nowhere\n", &none, &["listen", "HOST:PORT"]);
        check_err("logFormat: xml\n", &none, &["logFormat", "text or json"]);
        check_err(
            "upstreams:\n  - name: a.io\n    url: https://a.io\n    username: u\n",
            &none,
            &["upstreams[0].username", "no password"],
        );
        check_err("", &Overrides { upstreams: vec!["nourl".into()], ..none.clone() }, &["--upstream[0]", "NAME=URL"]);
    }

    /// Issue 20 item 6: a bad flag read as an error in "the embedded default config".
    #[test]
    fn should_report_flag_errors_as_flag_errors() {
        let none = Overrides::default();
        let cases: [(Overrides, &str); 6] = [
            (Overrides { listen: Some("nowhere".into()), ..none.clone() }, "--listen"),
            (Overrides { upstreams: vec!["nourl".into()], ..none.clone() }, "--upstream[0]"),
            (Overrides { log_format: Some("xml".into()), ..none.clone() }, "--log-format"),
            (Overrides { default_upstream: Some("nope.io".into()), ..none.clone() }, "--default-upstream"),
            (Overrides { image_factory: Some("ftp://x".into()), ..none.clone() }, "--image-factory"),
            (Overrides { admin_listen: Some("nowhere".into()), ..none.clone() }, "--admin-listen"),
        ];
        for (o, flag) in cases {
            let (name, raw) = read(None).unwrap();
            let e = resolve(&name, raw, &o).expect_err(flag).to_string();
            assert!(e.starts_with(&format!("command line: {flag}: ")), "{e}");
            assert!(!e.contains("embedded default config"), "{e}");
        }
        // The same values from the file name the file and its key.
        check_err("listen: nowhere\n", &none, &["t.yaml: listen: "]);
    }

    /// Found by config_props: a file that is a list or a scalar was refused as "invalid type:
    /// sequence, expected struct RawConfig", with no key, no position and a Rust type name; an
    /// error on line 1 column 1 (`bogus: 1` as the first line) had no position either.
    #[test]
    fn should_say_where_every_yaml_error_is() {
        for text in ["- listen: 127.0.0.1:5000\n", "just text\n", "1\n", "[\n"] {
            let e = parse("t.yaml", text).expect_err("not a mapping");
            assert!(e.message.contains("expected a mapping of config keys"), "{text:?}: {e}");
            assert!(e.message.contains(" at line 1 column 1"), "{text:?}: {e}");
            assert!(!e.message.contains("RawConfig"), "{text:?}: {e}");
        }
        let e = parse("t.yaml", "bogus: 1\n").expect_err("unknown key");
        assert!(e.message.contains("unknown field `bogus`") && e.message.contains(" at line 1 column 1"), "{e}");
        let e = parse("t.yaml", "listen: a\nlisten: b\n").expect_err("duplicate key");
        assert!(e.message.contains("duplicate field `listen`") && e.message.contains(" at line "), "{e}");
    }

    #[test]
    fn should_refuse_credentials_without_public() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "secret\n").unwrap();
        let yaml = format!(
            "upstreams:\n  - name: a.io\n    url: https://a.io\n    username: u\n    passwordFile: {}\n",
            pw.display()
        );
        check_err(&yaml, &Overrides::default(), &["upstreams[0].public", "public: true"]);
        let ok = format!("{yaml}    public: true\n");
        let s = resolve("t", parse("t", &ok).unwrap(), &Overrides::default()).unwrap();
        let c = s.upstreams[0].credentials.as_ref().unwrap();
        assert_eq!(c.password, "secret");
        assert!(!format!("{c:?}").contains("secret"), "passwords never reach logs");
    }

    /// Issue 32 (3): `private: true` needs no credentials, and a tender that serves a private
    /// upstream without client authentication refuses to start.
    #[test]
    fn should_take_private_upstreams_only_with_client_authentication() {
        let yaml = "upstreams:\n  - name: a.io\n    url: https://a.io\n    offline: true\n    private: true\n";
        check_err(yaml, &Overrides::default(), &["upstreams[0].private", "client authentication"]);
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "0123456789abcdef0123456789abcdef\n").unwrap();
        let ok = format!("{yaml}auth:\n  tokenFile: {}\n", tokens.display());
        let s = resolve("t", parse("t", &ok).unwrap(), &Overrides::default()).unwrap();
        assert!(s.upstreams[0].private && s.upstreams[0].credentials.is_none());
        assert!(s.upstreams[0].needs_identity(), "served to authenticated clients only");
        let both = ok.replace("    private: true\n", "    private: true\n    public: true\n");
        check_err(&both, &Overrides::default(), &["upstreams[0].private", "contradict"]);
    }

    #[test]
    fn should_default_stale_max_age_to_never_and_let_an_upstream_override_it() {
        let yaml = "fetch:\n  staleMaxAge: 2h\nupstreams:\n  - name: a.io\n    url: https://a.io\n    staleMaxAge: never\n  - name: b.io\n    url: https://b.io\n";
        let s = resolve("t", parse("t", yaml).unwrap(), &Overrides::default()).unwrap();
        assert_eq!(s.fetch.stale_max_age, StaleLimit::Max(Duration::from_secs(7200)));
        assert_eq!(s.upstreams[0].stale_max_age, Some(StaleLimit::Never));
        assert_eq!(s.upstreams[1].stale_max_age, None);
        let (name, raw) = read(None).unwrap();
        assert_eq!(resolve(&name, raw, &Overrides::default()).unwrap().fetch.stale_max_age, StaleLimit::Never);
        check_err("fetch:\n  staleMaxAge: forever\n", &Overrides::default(), &["fetch.staleMaxAge", "never"]);
    }

    #[test]
    fn should_take_offline_per_upstream_for_all_and_from_the_flag() {
        let yaml = "upstreams:\n  - name: a.io\n    url: https://a.io\n    offline: true\n  - name: b.io\n    url: https://b.io\n";
        let s = resolve("t", parse("t", yaml).unwrap(), &Overrides::default()).unwrap();
        assert!(s.upstreams[0].offline && !s.upstreams[1].offline && !s.offline);
        let all = format!("offline: true\n{yaml}");
        let s = resolve("t", parse("t", &all).unwrap(), &Overrides::default()).unwrap();
        assert!(s.upstreams.iter().all(|u| u.offline) && s.offline);
        let s = resolve("t", parse("t", yaml).unwrap(), &Overrides { offline: true, ..Overrides::default() }).unwrap();
        assert!(s.upstreams.iter().all(|u| u.offline) && s.offline, "--offline");
    }

    /// Issue 19: the bucket's deadlines, retries and probe interval.
    #[test]
    fn should_resolve_the_bucket_breaker_keys_with_defaults_bounded_by_the_request_timeout() {
        let base = "storage:\n  s3:\n    endpoint: http://127.0.0.1:9000\n    bucket: fleet\n    replica: r\n";
        let load = |extra: &str| {
            let yaml = format!("{base}{extra}");
            resolve("t", parse("t", &yaml).unwrap(), &Overrides::default()).unwrap().storage.unwrap()
        };
        let s = load("");
        assert_eq!(
            (s.request_timeout, s.connect_timeout, s.retries, s.probe_interval),
            (Duration::from_secs(10), Duration::from_secs(5), 2, Duration::from_secs(5))
        );
        assert!(!s.sign_payload, "bodies go unsigned unless asked");
        assert!(load("    signPayload: true\n").sign_payload);
        let s = load("    requestTimeout: 2s\n    retries: 0\n    probeInterval: 500ms\n");
        assert_eq!(
            (s.request_timeout, s.connect_timeout, s.retries, s.probe_interval),
            (Duration::from_secs(2), Duration::from_secs(2), 0, Duration::from_millis(500)),
            "the default connect timeout never outlasts the request timeout"
        );
        let none = Overrides::default();
        check_err(
            &format!("{base}    requestTimeout: 2s\n    connectTimeout: 3s\n"),
            &none,
            &["storage.s3.connectTimeout"],
        );
        check_err(&format!("{base}    retries: 11\n"), &none, &["storage.s3.retries"]);
        check_err(&format!("{base}    probeInterval: 10ms\n"), &none, &["storage.s3.probeInterval"]);
        check_err(&format!("{base}    probeInterval: often\n"), &none, &["storage.s3.probeInterval", "not a duration"]);
    }

    /// Issue 19: `tender gc --bucket`'s cap and grace.
    #[test]
    fn should_resolve_the_bucket_size_cap_and_gc_grace() {
        let base = "storage:\n  s3:\n    endpoint: http://127.0.0.1:9000\n    bucket: fleet\n    replica: r\n";
        let load = |extra: &str| {
            let yaml = format!("{base}{extra}");
            resolve("t", parse("t", &yaml).unwrap(), &Overrides::default()).unwrap().storage.unwrap()
        };
        let s = load("");
        assert_eq!((s.max_size, s.gc_grace), (None, Duration::from_secs(600)));
        let s = load("    maxSize: 2Ti\n    gcGrace: 0s\n");
        assert_eq!((s.max_size, s.gc_grace), (Some(2 << 40), Duration::ZERO));
        let none = Overrides::default();
        check_err(&format!("{base}    maxSize: lots\n"), &none, &["storage.s3.maxSize", "not a size"]);
        check_err(&format!("{base}    gcGrace: soon\n"), &none, &["storage.s3.gcGrace", "not a duration"]);
    }

    /// Issue 36: `storage.s3.indexKeyFile`, a key of 32 characters or more, read from its file.
    #[test]
    fn should_read_the_index_key_and_refuse_a_short_one() {
        let dir = tempfile::tempdir().unwrap();
        let (good, short) = (dir.path().join("good"), dir.path().join("short"));
        std::fs::write(&good, format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::write(&short, "secret\n").unwrap();
        let base = "storage:\n  s3:\n    endpoint: http://127.0.0.1:9000\n    bucket: fleet\n    replica: r\n";
        let load = |extra: &str| {
            let yaml = format!("{base}{extra}");
            resolve("t", parse("t", &yaml).unwrap(), &Overrides::default()).unwrap().storage.unwrap()
        };
        assert!(load("").index_key.is_none());
        let s = load(&format!("    indexKeyFile: {}\n", good.display()));
        assert!(s.index_key.is_some());
        assert_eq!(format!("{:?}", s.index_key), "Some(IndexKey(..))", "never printed");
        let none = Overrides::default();
        check_err(
            &format!("{base}    indexKeyFile: {}\n", short.display()),
            &none,
            &["storage.s3.indexKeyFile", "6 characters", "at least 32"],
        );
        check_err(
            &format!("{base}    indexKeyFile: {}\n", dir.path().join("absent").display()),
            &none,
            &["storage.s3.indexKeyFile", "absent"],
        );
    }

    #[test]
    fn should_parse_sizes() {
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("2Gi"), Some(2 << 30));
        assert_eq!(parse_size("20Gi"), Some(20 << 30));
        assert_eq!(parse_size("5G"), Some(5_000_000_000));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("1Xi"), None);
        assert_eq!(parse_size("99999999999Ti"), None);
    }
}
