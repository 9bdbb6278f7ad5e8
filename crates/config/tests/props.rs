//! Properties of the config loader (this crate's `parse` and `resolve`), with proptest, run by
//! `cargo test` like any test. See docs/fuzzing.md.
//!
//! - arbitrary YAML-ish text, and the embedded default cut short or with a line dropped,
//!   doubled or re-indented, never panics, and every error names a config key, or is a YAML
//!   error that gives a position (line and column);
//! - a valid config, generated key by key, resolves, and the settings say what the file said
//!   (durations, sizes, URLs and names checked against values written here, not re-derived
//!   with the loader's own helpers);
//! - one structured mutation of a valid config (a bad value, an unknown key, a wrong type, a
//!   missing or duplicated entry) is refused naming exactly the key it broke.
//!
//! No generated value makes the loader resolve a host name: listen addresses are IP literals,
//! or have no port at all (refused before any lookup).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};

use tender_config::{parse, resolve, ConfigError, LogFormat, Overrides, Settings};

/// Cases per property: enough to walk every key and mutation, and well under a second each.
/// `PROPTEST_CASES` raises it for a long run (docs/fuzzing.md).
const CASES: u32 = 256;

fn runner() -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(CASES);
    TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() })
}

fn load(text: &str, o: &Overrides) -> Result<Settings, ConfigError> {
    parse("t.yaml", text).and_then(|raw| resolve("t.yaml", raw, o))
}

/// Whether `key` is a path into the config file (or a flag), as the loader reports keys.
fn is_config_key(key: &str) -> bool {
    let sections = ["fetch.", "cache.", "tls.", "auth.", "admin.", "limits.", "catalog"];
    let top = ["listen", "data", "logFormat", "defaultUpstream", "imageFactory"];
    top.contains(&key)
        || sections.iter().any(|s| key.starts_with(s))
        || key.starts_with("upstreams[")
        || key.starts_with("--")
        || key.starts_with("tls-")
}

/// A YAML error must say where: `at line L column C`, or `at the top level of the file` for
/// the few errors serde_norway places nowhere.
fn has_position(message: &str) -> bool {
    (message.contains(" at line ") && message.contains(" column ")) || message.contains("at the top level of the file")
}

fn check_error(e: &ConfigError) -> Result<(), TestCaseError> {
    prop_assert!(!e.message.is_empty(), "{e}");
    if e.key == "(yaml)" {
        prop_assert!(has_position(&e.message), "a YAML error without a position: {e}");
    } else {
        prop_assert!(is_config_key(&e.key), "the error names no config key: {e}");
    }
    Ok(())
}

// ---- arbitrary YAML-ish text ----------------------------------------------------------------

const KEYS: &[&str] = &[
    "listen",
    "data",
    "logFormat",
    "defaultUpstream",
    "imageFactory",
    "upstreams",
    "name",
    "url",
    "endpoints",
    "caFile",
    "insecureSkipVerify",
    "proxy",
    "username",
    "passwordEnv",
    "public",
    "redirectHosts",
    "libraryPrefix",
    "maxObjectSize",
    "fetch",
    "attempts",
    "connectTimeout",
    "stallTimeout",
    "tagTtl",
    "cache",
    "maxSize",
    "gcInterval",
    "memory",
    "memoryObjectMax",
    "catalog",
    "images",
    "schematic",
    "version",
    "limits",
    "maxConnections",
    "maxHeaderBytes",
    "auth",
    "anonymousPull",
    "admin",
    "tls",
    "bogus",
];

const VALUES: &[&str] = &[
    "",
    "~",
    "null",
    "0",
    "1",
    "-1",
    "18446744073709551616",
    "true",
    "yes",
    "1.5",
    "5m",
    "soon",
    "500Gi",
    "lots",
    "text",
    "json",
    "xml",
    "docker.io",
    "ghcr.io",
    "Ghcr.IO",
    "a io",
    "https://ghcr.io",
    "http://127.0.0.1:5001",
    "ftp://x",
    "https://u:p@h",
    "https://h?q=1",
    "not a url",
    "127.0.0.1:5000",
    "nowhere",
    "[]",
    "{}",
    "[a, b]",
    "{a: 1}",
    "'quoted'",
    "\"dq\\n\"",
    "&anchor x",
    "*anchor",
    "!!binary aGk=",
    "!tag x",
    "|",
    ">-",
    "- x",
    "? complex",
    "%YAML 1.2",
    "---",
    "...",
    "#comment",
    "\t",
    "\u{0}",
    "ä",
    "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515",
    "v1.13.6",
];

fn yaml_line() -> impl Strategy<Value = String> {
    (
        0usize..4,
        prop::sample::select(KEYS),
        prop_oneof![
            3 => prop::sample::select(VALUES).prop_map(str::to_string),
            1 => "\\PC{0,16}",
        ],
        prop::sample::select(&["", "- ", "  ", "-"][..]),
    )
        .prop_map(|(indent, key, value, lead)| format!("{}{lead}{key}: {value}", "  ".repeat(indent)))
}

fn yaml_ish() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(yaml_line(), 0..12).prop_map(|l| l.join("\n")),
        1 => "\\PC{0,120}",
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

#[test]
fn should_never_panic_and_name_a_key_or_a_position_for_any_text() {
    // Listen addresses come from the flags: a random `name:port` in the file would otherwise
    // become a DNS lookup.
    let o = Overrides {
        listen: Some("127.0.0.1:0".into()),
        admin_listen: Some("127.0.0.1:0".into()),
        ..Overrides::default()
    };
    runner()
        .run(&yaml_ish(), |text| match load(&text, &o) {
            Ok(_) => Ok(()),
            Err(e) => check_error(&e),
        })
        .unwrap();
}

/// The embedded default, cut short at any byte, with a line dropped, doubled or re-indented:
/// it either still resolves or is refused naming a key or a position.
#[test]
fn should_resolve_or_name_the_problem_for_any_edit_of_the_default() {
    let o = Overrides { listen: Some("127.0.0.1:0".into()), ..Overrides::default() };
    let lines: Vec<&str> = tender_config::DEFAULT_CONFIG.lines().collect();
    let edit = (0..lines.len(), 0usize..4, 0..=tender_config::DEFAULT_CONFIG.len());
    runner()
        .run(&edit, |(i, kind, cut)| {
            let mut edited: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            match kind {
                0 => {
                    edited.remove(i);
                }
                1 => edited.insert(i, lines[i].to_string()),
                2 => edited[i] = format!("  {}", lines[i]),
                _ => {}
            }
            let mut text = edited.join("\n");
            if kind == 3 {
                let cut = (0..=cut.min(text.len())).rev().find(|&c| text.is_char_boundary(c)).unwrap_or(0);
                text.truncate(cut);
            }
            match load(&text, &o) {
                Ok(_) => Ok(()),
                Err(e) => check_error(&e),
            }
        })
        .unwrap();
}

// ---- valid configs, and what they say -------------------------------------------------------

const DURATIONS: &[(&str, Duration)] = &[
    ("250ms", Duration::from_millis(250)),
    ("30s", Duration::from_secs(30)),
    ("5m", Duration::from_secs(300)),
    ("1h", Duration::from_secs(3600)),
    ("168h", Duration::from_secs(168 * 3600)),
    ("1h 30m", Duration::from_secs(5400)),
    ("2days", Duration::from_secs(2 * 86400)),
];

const SIZES: &[(&str, u64)] = &[
    ("1073741824", 1 << 30),
    ("500Gi", 500 << 30),
    ("100G", 100_000_000_000),
    ("64Ki", 64 << 10),
    ("8192", 8192),
    ("20 GiB", 20 << 30),
    ("5M", 5_000_000),
    ("3Ti", 3 << 40),
];

const HOSTS: &[&str] = &["docker.io", "ghcr.io", "registry.k8s.io", "quay.io", "registry.local:5000", "r-1.example"];

const LISTEN: &[(&str, &str)] =
    &[("127.0.0.1:5000", "127.0.0.1:5000"), ("0.0.0.0:0", "0.0.0.0:0"), ("[::1]:5001", "[::1]:5001")];

const FETCH_DURATIONS: &[&str] = &[
    "connectTimeout",
    "firstByteTimeout",
    "stallTimeout",
    "fillDeadline",
    "backoffBase",
    "backoffMax",
    "tagTtl",
    "staleMaxAge",
    "factoryFirstByteTimeout",
];

/// One upstream as generated: what is written, and what the settings must say.
#[derive(Debug, Clone)]
struct Up {
    name: String,
    url: String,
    endpoints: Vec<String>,
    proxy: Option<String>,
    library_prefix: Option<bool>,
    max_object_size: Option<(&'static str, u64)>,
    /// username, and whether the password comes from a file (else the environment)
    credentials: Option<(String, bool)>,
    redirect_hosts: Option<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Model {
    listen: Option<(&'static str, &'static str)>,
    data: Option<String>,
    log_format: Option<&'static str>,
    upstreams: Vec<Up>,
    /// index into upstreams; written in upper case when the bool is set
    default_upstream: Option<(usize, bool)>,
    image_factory: Option<String>,
    attempts: Option<u32>,
    fetch: Vec<(&'static str, (&'static str, Duration))>,
    max_size: Option<(&'static str, u64)>,
    gc_interval: Option<(&'static str, Duration)>,
    max_connections: Option<usize>,
    max_header_bytes: Option<(&'static str, u64)>,
    catalog: bool,
}

/// An http(s) URL; no label has `--` (an `xn--` label would have to be valid punycode).
fn url() -> impl Strategy<Value = String> {
    (
        prop::bool::ANY,
        "[a-z][a-z0-9]{0,4}(-[a-z0-9]{1,4})?(\\.[a-z]{2,5}){1,2}",
        prop::option::of(1u16..),
        "(/[a-z0-9]{1,6}){0,2}",
    )
        .prop_map(|(https, host, port, path)| {
            let scheme = if https { "https" } else { "http" };
            match port {
                Some(p) => format!("{scheme}://{host}:{p}{path}"),
                None => format!("{scheme}://{host}{path}"),
            }
        })
}

fn upstream(name: String) -> impl Strategy<Value = Up> {
    (
        url(),
        prop::collection::vec(url(), 0..3),
        prop::option::of(url()),
        prop::option::of(prop::bool::ANY),
        prop::option::of(prop::sample::select(SIZES)),
        prop::option::of(("[a-z]{1,8}", prop::bool::ANY)),
        prop::option::of(prop::collection::vec("(\\*\\.)?[a-z]{1,8}\\.[a-z]{2,4}", 0..3)),
    )
        .prop_map(move |(url, endpoints, proxy, library_prefix, max_object_size, credentials, redirect_hosts)| {
            Up {
                name: name.clone(),
                url,
                endpoints,
                proxy,
                library_prefix,
                max_object_size,
                credentials,
                redirect_hosts,
            }
        })
}

fn model() -> impl Strategy<Value = Model> {
    let upstreams = prop::sample::subsequence(HOSTS, 1..=HOSTS.len())
        .prop_shuffle()
        .prop_flat_map(|names| names.into_iter().map(|n| upstream(n.to_string())).collect::<Vec<_>>());
    let fetch = prop::sample::subsequence(FETCH_DURATIONS, 0..=FETCH_DURATIONS.len())
        .prop_flat_map(|keys| keys.into_iter().map(|k| (Just(k), prop::sample::select(DURATIONS))).collect::<Vec<_>>());
    (
        (
            prop::option::of(prop::sample::select(LISTEN)),
            prop::option::of("[a-z][a-z0-9/_-]{0,12}"),
            prop::option::of(prop::sample::select(&["text", "json"][..])),
            upstreams,
            prop::option::of((any::<prop::sample::Index>(), prop::bool::ANY)),
            prop::option::of(url()),
        ),
        (
            prop::option::of(1u32..20),
            fetch,
            prop::option::of(prop::sample::select(SIZES)),
            prop::option::of(prop::sample::select(DURATIONS)),
            prop::option::of(1usize..100_000),
            prop::option::of(prop::sample::select(&SIZES[..5])),
            prop::bool::ANY,
        ),
    )
        .prop_map(
            |(
                (listen, data, log_format, upstreams, default_upstream, image_factory),
                (attempts, fetch, max_size, gc_interval, max_connections, max_header_bytes, catalog),
            )| {
                let default_upstream = default_upstream.map(|(i, upper)| (i.index(upstreams.len()), upper));
                Model {
                    listen,
                    data,
                    log_format,
                    upstreams,
                    default_upstream,
                    image_factory,
                    attempts,
                    fetch,
                    max_size,
                    gc_interval,
                    max_connections,
                    max_header_bytes,
                    catalog,
                }
            },
        )
}

const SCHEMATIC: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";

/// The config file a model stands for, as a YAML value.
fn to_value(m: &Model, password_file: &Path) -> Value {
    let mut top = Map::new();
    if let Some((l, _)) = m.listen {
        top.insert("listen".into(), json!(l));
    }
    if let Some(d) = &m.data {
        top.insert("data".into(), json!(d));
    }
    if let Some(f) = m.log_format {
        top.insert("logFormat".into(), json!(f));
    }
    let ups: Vec<Value> = m
        .upstreams
        .iter()
        .map(|u| {
            let mut o = Map::new();
            o.insert("name".into(), json!(u.name));
            o.insert("url".into(), json!(u.url));
            if !u.endpoints.is_empty() {
                o.insert("endpoints".into(), json!(u.endpoints));
            }
            if let Some(p) = &u.proxy {
                o.insert("proxy".into(), json!(p));
            }
            if let Some(l) = u.library_prefix {
                o.insert("libraryPrefix".into(), json!(l));
            }
            if let Some((s, _)) = u.max_object_size {
                o.insert("maxObjectSize".into(), json!(s));
            }
            if let Some((user, from_file)) = &u.credentials {
                o.insert("username".into(), json!(user));
                if *from_file {
                    o.insert("passwordFile".into(), json!(password_file));
                } else {
                    o.insert("passwordEnv".into(), json!("PATH"));
                }
                o.insert("public".into(), json!(true));
            }
            if let Some(r) = &u.redirect_hosts {
                o.insert("redirectHosts".into(), json!(r));
            }
            Value::Object(o)
        })
        .collect();
    top.insert("upstreams".into(), Value::Array(ups));
    if let Some((i, upper)) = m.default_upstream {
        let n = &m.upstreams[i].name;
        top.insert("defaultUpstream".into(), json!(if upper { n.to_ascii_uppercase() } else { n.clone() }));
    }
    if let Some(f) = &m.image_factory {
        top.insert("imageFactory".into(), json!(f));
    }
    let mut fetch = Map::new();
    if let Some(a) = m.attempts {
        fetch.insert("attempts".into(), json!(a));
    }
    for (k, (text, _)) in &m.fetch {
        fetch.insert((*k).into(), json!(text));
    }
    top.insert("fetch".into(), Value::Object(fetch));
    let mut cache = Map::new();
    if let Some((s, _)) = m.max_size {
        cache.insert("maxSize".into(), json!(s));
    }
    if let Some((s, _)) = m.gc_interval {
        cache.insert("gcInterval".into(), json!(s));
    }
    top.insert("cache".into(), Value::Object(cache));
    let mut limits = Map::new();
    if let Some(n) = m.max_connections {
        limits.insert("maxConnections".into(), json!(n));
    }
    if let Some((s, _)) = m.max_header_bytes {
        limits.insert("maxHeaderBytes".into(), json!(s));
    }
    top.insert("limits".into(), Value::Object(limits));
    if m.catalog {
        top.insert(
            "catalog".into(),
            json!({"dir": "/goldens", "images": [{"schematic": SCHEMATIC, "version": "v1.13.6"}]}),
        );
    }
    Value::Object(top)
}

fn yaml(v: &Value) -> String {
    serde_norway::to_string(v).unwrap()
}

fn parsed_url(s: &str) -> url::Url {
    url::Url::parse(s).unwrap()
}

/// The settings say what the model said.
fn check_settings(m: &Model, s: &Settings) -> Result<(), TestCaseError> {
    let listen = m.listen.map_or("127.0.0.1:5000", |(_, want)| want);
    prop_assert_eq!(s.listen.to_string(), listen);
    prop_assert_eq!(s.data.to_str(), Some(m.data.as_deref().unwrap_or("./tender-data")));
    let log = if m.log_format == Some("json") { LogFormat::Json } else { LogFormat::Text };
    prop_assert_eq!(s.log_format, log);
    prop_assert_eq!(s.upstreams.len(), m.upstreams.len());
    for (u, got) in m.upstreams.iter().zip(&s.upstreams) {
        prop_assert_eq!(&got.name, &u.name);
        let mut want: Vec<url::Url> = u.endpoints.iter().map(|e| parsed_url(e)).collect();
        want.push(parsed_url(&u.url));
        prop_assert_eq!(&got.endpoints, &want, "endpoints first, the upstream's own URL last");
        prop_assert_eq!(got.proxy.clone(), u.proxy.as_deref().map(parsed_url));
        prop_assert_eq!(got.library_prefix, u.library_prefix.unwrap_or(u.name == "docker.io"));
        prop_assert_eq!(
            got.max_object_size,
            Some(u.max_object_size.map_or(tender_config::DEFAULT_MAX_OBJECT_SIZE, |(_, n)| n))
        );
        prop_assert_eq!(&got.redirect_hosts, &u.redirect_hosts);
        match (&u.credentials, &got.credentials) {
            (None, None) => {}
            (Some((user, from_file)), Some(c)) => {
                prop_assert_eq!(&c.username, user);
                let want = if *from_file { "secret".to_string() } else { std::env::var("PATH").unwrap() };
                prop_assert_eq!(&c.password, &want);
                prop_assert!(got.public);
            }
            (want, got) => prop_assert!(false, "credentials {:?} resolved to {:?}", want, got),
        }
    }
    prop_assert_eq!(s.default_upstream.clone(), m.default_upstream.map(|(i, _)| m.upstreams[i].name.clone()));
    let factory = m.image_factory.as_deref().unwrap_or("https://factory.talos.dev");
    prop_assert_eq!(s.image_factory.clone(), parsed_url(factory));
    prop_assert_eq!(s.fetch.attempts, m.attempts.unwrap_or(5));
    let fetch_of =
        |key: &str, default: Duration| m.fetch.iter().find(|(k, _)| *k == key).map_or(default, |(_, (_, d))| *d);
    prop_assert_eq!(s.fetch.connect_timeout, fetch_of("connectTimeout", Duration::from_secs(10)));
    prop_assert_eq!(s.fetch.first_byte_timeout, fetch_of("firstByteTimeout", Duration::from_secs(30)));
    prop_assert_eq!(s.fetch.stall_timeout, fetch_of("stallTimeout", Duration::from_secs(30)));
    prop_assert_eq!(s.fetch.fill_deadline, fetch_of("fillDeadline", Duration::from_secs(3600)));
    prop_assert_eq!(s.fetch.backoff_base, fetch_of("backoffBase", Duration::from_millis(250)));
    prop_assert_eq!(s.fetch.backoff_max, fetch_of("backoffMax", Duration::from_secs(10)));
    prop_assert_eq!(s.fetch.tag_ttl, fetch_of("tagTtl", Duration::from_secs(300)));
    let stale = m.fetch.iter().find(|(k, _)| *k == "staleMaxAge").map(|(_, (_, d))| *d);
    prop_assert_eq!(
        s.fetch.stale_max_age,
        stale.map_or(tender_fetch::StaleLimit::Never, tender_fetch::StaleLimit::Max)
    );
    prop_assert_eq!(s.factory_first_byte_timeout, fetch_of("factoryFirstByteTimeout", Duration::from_secs(600)));
    prop_assert_eq!(s.cache_max_size, m.max_size.map(|(_, n)| n));
    prop_assert_eq!(s.gc_interval, m.gc_interval.map_or(Duration::from_secs(300), |(_, d)| d));
    prop_assert_eq!(s.limits.max_connections, m.max_connections.unwrap_or(10_000));
    prop_assert_eq!(s.limits.max_header_bytes as u64, m.max_header_bytes.map_or(64 * 1024, |(_, n)| n));
    if m.catalog {
        prop_assert_eq!(s.catalog.entries.len(), 1);
        prop_assert_eq!(&s.catalog.entries[0].source.schematic, SCHEMATIC);
        prop_assert_eq!(s.catalog.dir.to_str(), Some("/goldens"));
    } else {
        prop_assert!(s.catalog.entries.is_empty());
    }
    Ok(())
}

fn password_file() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "secret\n").unwrap();
    (dir, pw)
}

#[test]
fn should_resolve_valid_configs_to_what_they_say() {
    let (_dir, pw) = password_file();
    runner()
        .run(&model(), |m| {
            let text = yaml(&to_value(&m, &pw));
            match load(&text, &Overrides::default()) {
                Ok(s) => check_settings(&m, &s),
                Err(e) => Err(TestCaseError::fail(format!("a valid config was refused: {e}\n{text}"))),
            }
        })
        .unwrap();
}

// ---- one mutation of a valid config ---------------------------------------------------------

#[derive(Debug, Clone)]
enum Mutation {
    /// Set the value at a path (object keys and array indexes) to something invalid there.
    Bad { path: Vec<String>, value: Value, key: String },
    /// Add a key the loader does not know, inside the object at a path.
    Unknown { path: Vec<String>, name: String },
    /// Give a key a value of the wrong type.
    WrongType { path: Vec<String>, value: Value },
    /// Drop a required key of an upstream.
    Missing { upstream: usize, field: &'static str },
}

fn p(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// Every key a mutation can break in a given model, with a value that breaks it.
fn mutations(m: &Model) -> Vec<Mutation> {
    let bad = |path: Vec<String>, value: Value, key: &str| Mutation::Bad { path, value, key: key.to_string() };
    let mut out = vec![
        bad(p(&["listen"]), json!("nowhere"), "listen"),
        bad(p(&["listen"]), json!("127.0.0.1:99999"), "listen"),
        bad(p(&["logFormat"]), json!("xml"), "logFormat"),
        bad(p(&["defaultUpstream"]), json!("nope.example"), "defaultUpstream"),
        bad(p(&["imageFactory"]), json!("ftp://factory"), "imageFactory"),
        bad(p(&["imageFactory"]), json!("https://u:p@factory"), "imageFactory"),
        bad(p(&["fetch", "attempts"]), json!(0), "fetch.attempts"),
        bad(p(&["cache", "maxSize"]), json!("lots"), "cache.maxSize"),
        bad(p(&["cache", "gcInterval"]), json!("soon"), "cache.gcInterval"),
        bad(p(&["limits", "maxConnections"]), json!(0), "limits.maxConnections"),
        bad(p(&["limits", "maxHeaderBytes"]), json!("10"), "limits.maxHeaderBytes"),
        bad(p(&["limits", "maxConcurrentFills"]), json!(0), "limits.maxConcurrentFills"),
        bad(p(&["auth", "anonymousPull"]), json!(true), "auth.anonymousPull"),
        bad(
            p(&["catalog"]),
            json!({"images": [{"schematic": "NOPE", "version": "v1.13.6"}]}),
            "catalog.images[0].schematic",
        ),
        bad(p(&["catalog"]), json!({"images": [{"schematic": "abc", "version": "1.13"}]}), "catalog.images[0].version"),
    ];
    for k in FETCH_DURATIONS {
        out.push(bad(p(&["fetch", k]), json!("soon"), &format!("fetch.{k}")));
    }
    for (i, u) in m.upstreams.iter().enumerate() {
        let at = |k: &str| vec!["upstreams".to_string(), i.to_string(), k.to_string()];
        let key = |k: &str| format!("upstreams[{i}].{k}");
        out.push(bad(at("name"), json!("not a host"), &key("name")));
        out.push(bad(at("name"), json!("host:0"), &key("name")));
        out.push(bad(at("url"), json!("ftp://x.example"), &key("url")));
        out.push(bad(at("url"), json!("https://x.example/?q=1"), &key("url")));
        out.push(bad(at("proxy"), json!("socks://p"), &key("proxy")));
        out.push(bad(at("maxObjectSize"), json!("huge"), &key("maxObjectSize")));
        out.push(bad(at("caFile"), json!("/nonexistent/ca.pem"), &key("caFile")));
        if !u.endpoints.is_empty() {
            let j = u.endpoints.len() - 1;
            out.push(Mutation::Bad {
                path: vec!["upstreams".into(), i.to_string(), "endpoints".into(), j.to_string()],
                value: json!("mailto:x"),
                key: format!("upstreams[{i}].endpoints[{j}]"),
            });
        }
        if u.credentials.is_none() {
            out.push(bad(at("username"), json!("robot"), &key("username")));
            out.push(bad(at("passwordEnv"), json!("PATH"), &key("username")));
        } else {
            out.push(bad(at("public"), json!(false), &key("public")));
        }
        out.push(Mutation::Unknown { path: p(&["upstreams", &i.to_string()]), name: "colour".into() });
        out.push(Mutation::WrongType { path: at("url"), value: json!(["https://a.example"]) });
        out.push(Mutation::WrongType { path: at("endpoints"), value: json!("https://a.example") });
        out.push(Mutation::WrongType { path: at("libraryPrefix"), value: json!("sometimes") });
        out.push(Mutation::Missing { upstream: i, field: "url" });
        out.push(Mutation::Missing { upstream: i, field: "name" });
    }
    for section in [&[][..], &["fetch"][..], &["cache"][..], &["limits"][..]] {
        out.push(Mutation::Unknown { path: p(section), name: "bogusKey".into() });
    }
    out.push(Mutation::WrongType { path: p(&["listen"]), value: json!({"host": "127.0.0.1"}) });
    out.push(Mutation::WrongType { path: p(&["fetch", "attempts"]), value: json!("three") });
    out.push(Mutation::WrongType { path: p(&["upstreams"]), value: json!({"name": "a"}) });
    out
}

/// The object at `path`, created as needed.
fn at<'a>(v: &'a mut Value, path: &[String]) -> &'a mut Value {
    let mut cur = v;
    for part in path {
        cur = match cur {
            Value::Array(a) => &mut a[part.parse::<usize>().unwrap()],
            other => {
                if other.get(part.as_str()).is_none() {
                    other[part.as_str()] = json!({});
                }
                &mut other[part.as_str()]
            }
        };
    }
    cur
}

fn apply(v: &mut Value, m: &Mutation) {
    match m {
        Mutation::Bad { path, value, .. } | Mutation::WrongType { path, value } => *at(v, path) = value.clone(),
        Mutation::Unknown { path, name } => {
            at(v, path)[name.as_str()] = json!("x");
        }
        Mutation::Missing { upstream, field } => {
            if let Value::Object(o) = &mut v["upstreams"][*upstream] {
                o.remove(*field);
            }
        }
    }
}

#[test]
fn should_refuse_one_broken_key_naming_it() {
    let (_dir, pw) = password_file();
    let strategy = model().prop_flat_map(|m| {
        let all = mutations(&m);
        (Just(m), prop::sample::select(all))
    });
    runner()
        .run(&strategy, |(m, mutation)| {
            let mut v = to_value(&m, &pw);
            apply(&mut v, &mutation);
            let text = yaml(&v);
            let e = match load(&text, &Overrides::default()) {
                Ok(_) => return Err(TestCaseError::fail(format!("{mutation:?} was accepted:\n{text}"))),
                Err(e) => e,
            };
            check_error(&e)?;
            match &mutation {
                Mutation::Bad { key, .. } => prop_assert_eq!(&e.key, key, "{}\n{}", e, text),
                Mutation::Unknown { name, .. } => {
                    prop_assert_eq!(e.key.as_str(), "(yaml)");
                    let want = format!("unknown field `{name}`");
                    prop_assert!(e.message.contains(&want), "{}", e);
                }
                Mutation::WrongType { .. } => {
                    prop_assert_eq!(e.key.as_str(), "(yaml)");
                    prop_assert!(e.message.contains("invalid type"), "{}", e);
                }
                Mutation::Missing { field, .. } => {
                    prop_assert_eq!(e.key.as_str(), "(yaml)");
                    let want = format!("missing field `{field}`");
                    prop_assert!(e.message.contains(&want), "{}", e);
                }
            }
            Ok(())
        })
        .unwrap();
}
