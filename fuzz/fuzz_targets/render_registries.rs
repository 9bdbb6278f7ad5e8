//! `tender render registries`'s inputs (`crates/render/src/registries.rs`) and the host / URL
//! parsers behind them.
//!
//! Input: one flag a line, `name=value` (`\n` in a value is a newline, for PEM files):
//! `mirror=`, `registry=` (repeatable), `ca=`, `client-cert=`, `client-key=`, `username=`,
//! `password=`, `talos-version=`, and the switches `skip-fallback` and `insecure`. Every line
//! is also fed to the `host[:port]` and URL parsers.
//!
//! Properties: `host[:port]`, registries and mirror URLs print back to what parses (one
//! spelling, but for leading zeros in a port), and a URL path has no empty or `..` segment; a refusal names its flag and prints
//! no control character; a valid request renders Talos documents (YAML that parses back, one
//! per registry and the same bytes every time) and containerd files whose paths are exactly
//! `<registry dir>/<file>`, never absolute, never `..`, and whose `hosts.toml` is TOML that
//! names the mirror.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tender_render::containerd::hosts_files;
use tender_render::registries::{parse_http_url, Authority, RegistriesRequest, Registry};
use tender_render::talos::{render_registries, TalosVersion};
use tender_render::Refusal;

fn check_refusal(r: &Refusal) {
    assert!(!r.field.is_empty(), "a refusal names its flag: {r:?}");
    let shown = r.to_string();
    assert!(!shown.chars().any(char::is_control), "a refusal prints a control character: {shown:?}");
}

/// The one other spelling these parsers accept: a port with leading zeros (`:0500` is 500).
fn port_zeros(s: &str) -> bool {
    s.as_bytes().windows(3).any(|w| w[0] == b':' && w[1] == b'0' && w[2].is_ascii_digit())
}

fn check_parsers(s: &str) {
    if let Ok(a) = Authority::parse(s) {
        let printed = a.to_string();
        assert_eq!(Authority::parse(&printed).as_ref(), Ok(&a), "an authority re-parses as itself");
        assert!(printed == s || port_zeros(s), "{s:?} printed as {printed:?}");
        assert!(!a.host.is_empty() && a.port != Some(0));
        assert!(!a.host.split('.').any(|l| l.is_empty() || l == ".."));
    }
    match Registry::parse("--registry", s) {
        Ok(r) => {
            assert_eq!(Registry::parse("--registry", &r.talos_name()).as_ref(), Ok(&r));
            let dir = r.containerd_dir();
            assert!(!dir.is_empty() && dir != "." && dir != ".." && !dir.contains('/'), "{dir:?}");
        }
        Err(r) => check_refusal(&r),
    }
    if let Ok(u) = parse_http_url(s) {
        let printed = u.to_string();
        assert_eq!(parse_http_url(&printed), Ok(u.clone()), "a URL re-parses as itself");
        let same = printed == s || printed == s.strip_suffix('/').unwrap_or(s);
        assert!(same || port_zeros(s), "{s:?} printed as {printed:?}");
        assert!(u.path.is_empty() || u.path.starts_with('/'), "{s:?}: path {:?}", u.path);
        assert!(!u.path.ends_with('/') && !u.path.contains("//"), "{s:?}: path {:?}", u.path);
        assert!(!u.path.split('/').any(|seg| seg == ".."), "{s:?}: path {:?}", u.path);
    }
    if let Ok(v) = TalosVersion::parse("--talos-version", s) {
        assert_eq!(TalosVersion::parse("--talos-version", &v.to_string()), Ok(v));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(text) = tender_fuzz::text(data) else { return };
    let mut req = RegistriesRequest {
        mirror: String::new(),
        more_mirrors: Vec::new(),
        registries: Vec::new(),
        skip_fallback: false,
        ca: None,
        client_cert: None,
        client_key: None,
        insecure_skip_verify: false,
        username: None,
        password: None,
    };
    let mut version = "v1.13.6".to_string();
    for line in text.lines() {
        check_parsers(line);
        let (k, v) = line.split_once('=').unwrap_or((line, ""));
        let v = v.replace("\\n", "\n");
        match k {
            "mirror" => req.mirror = v,
            "more-mirror" => req.more_mirrors.push(v),
            "registry" => req.registries.push(v),
            "ca" => req.ca = Some(v),
            "client-cert" => req.client_cert = Some(v),
            "client-key" => req.client_key = Some(v),
            "username" => req.username = Some(v),
            "password" => req.password = Some(v),
            "talos-version" => version = v,
            "skip-fallback" => req.skip_fallback = true,
            "insecure" => req.insecure_skip_verify = true,
            _ => {}
        }
    }
    let plan = match req.validate() {
        Ok(p) => p,
        Err(r) => return check_refusal(&r),
    };
    assert_eq!(plan.registries.len(), req.registries.len());

    if let Ok(v) = TalosVersion::parse("--talos-version", &version) {
        let out = render_registries(&plan, v).expect("a valid plan renders");
        assert_eq!(render_registries(&plan, v).expect("renders twice"), out, "rendering is deterministic");
        let docs = tender_fuzz::reparse_yaml("talos", &out);
        if v.uses_registry_documents() {
            let mirrors = docs.iter().filter(|d| d["kind"] == "RegistryMirrorConfig").count();
            assert_eq!(mirrors, plan.registries.len(), "one RegistryMirrorConfig per registry");
        } else {
            assert_eq!(docs.len(), 1, "one v1alpha1 patch");
        }
    }

    let files = hosts_files(&plan).expect("a valid plan renders hosts.toml");
    assert_eq!(hosts_files(&plan).expect("renders twice"), files, "rendering is deterministic");
    let hosts: Vec<_> = files.iter().filter(|f| f.path.ends_with("/hosts.toml")).collect();
    assert_eq!(hosts.len(), plan.registries.len(), "one hosts.toml per registry");
    let dirs: Vec<String> = plan.registries.iter().map(Registry::containerd_dir).collect();
    for f in &files {
        let (dir, name) = f.path.split_once('/').expect("<dir>/<file>");
        assert!(dirs.iter().any(|d| d == dir), "{:?} is not under a registry's directory", f.path);
        assert!(!dir.is_empty() && dir != "." && dir != ".." && !dir.contains('\\'), "{:?}", f.path);
        assert!(matches!(name, "hosts.toml" | "ca.crt" | "client.crt" | "client.key"), "{:?}", f.path);
        assert_eq!(name == "client.key" || (name == "hosts.toml" && plan.config.auth.is_some()), f.secret);
        if name == "hosts.toml" {
            let text = std::str::from_utf8(&f.contents).expect("hosts.toml is UTF-8");
            let value: toml::Table =
                toml::from_str(text).unwrap_or_else(|e| panic!("hosts.toml is not TOML: {e}\n{text}"));
            let mirror = plan.mirror.url.to_string();
            let named = value.get("host").and_then(|h| h.get(&mirror)).is_some()
                || value.get("server").and_then(|s| s.as_str()) == Some(&mirror);
            assert!(named, "hosts.toml does not name the mirror {mirror}:\n{text}");
        }
    }
});
