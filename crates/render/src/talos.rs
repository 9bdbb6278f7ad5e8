//! Talos machine-config documents: registry mirrors, TLS and auth in the form a Talos version
//! accepts, plus the install / kubelet patch of a worker pool.
//!
//! Talos 1.12 deprecated `machine.registries` and dropped it from the published schema; from
//! then on the settings are the `RegistryMirrorConfig`, `RegistryAuthConfig` and
//! `RegistryTLSConfig` documents. For 1.11 and older the output is a v1alpha1 patch with
//! `machine.registries.mirrors` and `machine.registries.config`.

use std::fmt;

use serde_json::{json, Map, Value};

use crate::registries::{Auth, Mirror, Routing, Tls};
use crate::rules::Refusal;

/// A Talos release, `vMAJOR.MINOR[.PATCH]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TalosVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: Option<u32>,
}

/// The Cozystack default Talos release.
pub const DEFAULT_TALOS_VERSION: &str = "v1.13.6";

impl TalosVersion {
    pub fn parse(field: &str, value: &str) -> Result<TalosVersion, Refusal> {
        let bad = || {
            Refusal::input(
                field,
                value,
                "is not a Talos version (vMAJOR.MINOR or vMAJOR.MINOR.PATCH)",
                "spell the release like v1.13.6",
            )
        };
        let rest = value.strip_prefix('v').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split('.').collect();
        if !(2..=3).contains(&parts.len())
            || parts.iter().any(|p| p.is_empty() || p.len() > 6 || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad());
        }
        let num = |s: &str| s.parse::<u32>().map_err(|_| bad());
        Ok(TalosVersion {
            major: num(parts[0])?,
            minor: num(parts[1])?,
            patch: parts.get(2).map(|p| num(p)).transpose()?,
        })
    }

    /// From Talos 1.12 on, registries are separate documents.
    pub fn uses_registry_documents(&self) -> bool {
        (self.major, self.minor) >= (1, 12)
    }
}

impl fmt::Display for TalosVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.patch {
            Some(p) => write!(f, "v{}.{}.{p}", self.major, self.minor),
            None => write!(f, "v{}.{}", self.major, self.minor),
        }
    }
}

/// The endpoint URLs Talos tries for a mirror, in order: the mirrors, then the upstream itself
/// unless `skipFallback` (Talos 1.12.x skipped the implicit fallback, siderolabs/talos#12972,
/// so it is listed explicitly). `*` has no single upstream and keeps Talos' implicit fallback.
fn endpoint_urls(m: &Mirror, legacy_override_path: bool) -> Vec<(String, bool)> {
    let mut urls: Vec<(String, bool)> = m.endpoints.iter().map(|e| (e.url.to_string(), e.override_path)).collect();
    if !m.skip_fallback {
        if let Some(up) = m.registry.upstream() {
            // In v1alpha1 overridePath applies to every endpoint of the registry, so the
            // upstream then has to carry its API root itself.
            let up = if legacy_override_path { format!("{up}/v2") } else { up };
            urls.push((up, false));
        }
    }
    urls
}

/// Render the routing as Talos documents for `version`. Empty routing renders nothing.
pub fn registry_documents(routing: &Routing, version: TalosVersion) -> Vec<Value> {
    if routing.is_empty() {
        return Vec::new();
    }
    if version.uses_registry_documents() {
        documents_v1_12(routing)
    } else {
        vec![json!({"machine": {"registries": legacy_registries(routing)}})]
    }
}

fn documents_v1_12(routing: &Routing) -> Vec<Value> {
    let mut docs = Vec::new();
    for m in &routing.mirrors {
        let endpoints: Vec<Value> = endpoint_urls(m, false)
            .into_iter()
            .map(|(url, override_path)| {
                let mut e = Map::new();
                e.insert("url".into(), Value::String(url));
                if override_path {
                    e.insert("overridePath".into(), Value::Bool(true));
                }
                Value::Object(e)
            })
            .collect();
        let mut doc = json!({
            "apiVersion": "v1alpha1",
            "kind": "RegistryMirrorConfig",
            "name": m.registry.talos_name(),
            "endpoints": endpoints,
        });
        if m.skip_fallback {
            doc["skipFallback"] = Value::Bool(true);
        }
        docs.push(doc);
    }
    for (host, cfg) in &routing.configs {
        if let Some(tls) = &cfg.tls {
            let mut doc = json!({"apiVersion": "v1alpha1", "kind": "RegistryTLSConfig", "name": host.to_string()});
            fill_tls(&mut doc, tls, false);
            docs.push(doc);
        }
        if let Some(auth) = &cfg.auth {
            let mut doc = json!({"apiVersion": "v1alpha1", "kind": "RegistryAuthConfig", "name": host.to_string()});
            fill_auth(&mut doc, auth);
            docs.push(doc);
        }
    }
    docs
}

fn legacy_registries(routing: &Routing) -> Value {
    let mut mirrors = Map::new();
    for m in &routing.mirrors {
        let override_path = m.endpoints.iter().any(|e| e.override_path);
        let urls: Vec<Value> = endpoint_urls(m, override_path).into_iter().map(|(u, _)| Value::String(u)).collect();
        let mut entry = json!({ "endpoints": urls });
        if override_path {
            entry["overridePath"] = Value::Bool(true);
        }
        if m.skip_fallback {
            entry["skipFallback"] = Value::Bool(true);
        }
        mirrors.insert(m.registry.talos_name(), entry);
    }
    let mut config = Map::new();
    for (host, cfg) in &routing.configs {
        let mut entry = json!({});
        if let Some(tls) = &cfg.tls {
            let mut t = json!({});
            fill_tls(&mut t, tls, true);
            entry["tls"] = t;
        }
        if let Some(auth) = &cfg.auth {
            let mut a = json!({});
            fill_auth(&mut a, auth);
            entry["auth"] = a;
        }
        config.insert(host.to_string(), entry);
    }
    let mut out = Map::new();
    if !mirrors.is_empty() {
        out.insert("mirrors".into(), Value::Object(mirrors));
    }
    if !config.is_empty() {
        out.insert("config".into(), Value::Object(config));
    }
    Value::Object(out)
}

/// TLS fields; v1alpha1 wants certificates base64-encoded, the 1.12 documents want PEM.
fn fill_tls(doc: &mut Value, tls: &Tls, base64_pem: bool) {
    let enc = |pem: &str| {
        if base64_pem {
            base64(pem.as_bytes())
        } else {
            pem.to_string()
        }
    };
    if let Some(ca) = &tls.ca {
        doc["ca"] = Value::String(enc(ca));
    }
    if let Some(c) = &tls.client {
        doc["clientIdentity"] = json!({"crt": enc(&c.crt), "key": enc(&c.key)});
    }
    if tls.insecure_skip_verify {
        doc["insecureSkipVerify"] = Value::Bool(true);
    }
}

fn fill_auth(doc: &mut Value, auth: &Auth) {
    for (key, value) in [
        ("username", &auth.username),
        ("password", &auth.password),
        ("auth", &auth.auth),
        ("identityToken", &auth.identity_token),
    ] {
        if let Some(v) = value {
            doc[key] = Value::String(v.clone());
        }
    }
}

/// The worker pool's own v1alpha1 patch: install image and disk, kubelet image.
pub fn install_patch(installer_image: &str, kubelet_image: &str) -> Value {
    json!({
        "machine": {
            "install": {"disk": "/dev/vda", "image": installer_image, "wipe": false},
            "kubelet": {"image": kubelet_image},
        }
    })
}

/// The Talos patches of a worker pool, each one document: the install / kubelet patch (with
/// `machine.registries` merged in for Talos 1.11 and older), then the registry documents.
pub fn pool_patches(
    installer_image: &str,
    kubelet_image: &str,
    routing: &Routing,
    version: TalosVersion,
) -> Vec<Value> {
    let mut base = install_patch(installer_image, kubelet_image);
    let registries = registry_documents(routing, version);
    if version.uses_registry_documents() {
        let mut out = vec![base];
        out.extend(registries);
        out
    } else {
        if let Some(reg) = registries.first().and_then(|d| d.get("machine")).and_then(|m| m.get("registries")) {
            base["machine"]["registries"] = reg.clone();
        }
        vec![base]
    }
}

/// Standard base64 (RFC 4648, with padding).
pub fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `tender render registries --format talos`: the documents for `version`.
pub fn render_registries(plan: &crate::registries::MirrorPlan, version: TalosVersion) -> Result<String, crate::Error> {
    crate::hash::yaml_documents(&registry_documents(&plan.routing(), version))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn should_round_trip_talos_versions(major in 0u32..100, minor in 0u32..100, patch in proptest::option::of(0u32..1000)) {
            let text = match patch { Some(p) => format!("v{major}.{minor}.{p}"), None => format!("v{major}.{minor}") };
            let v = TalosVersion::parse("v", &text).unwrap();
            prop_assert_eq!(v.to_string(), text);
            prop_assert_eq!(v.uses_registry_documents(), (major, minor) >= (1, 12));
        }

        #[test]
        fn should_never_panic_parsing_a_talos_version(s in "\\PC{0,12}") {
            let _ = TalosVersion::parse("v", &s);
        }
    }

    #[test]
    fn should_encode_the_rfc4648_base64_vectors() {
        for (input, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), want, "{input}");
        }
    }

    #[test]
    fn should_switch_to_documents_at_talos_1_12() {
        for (v, docs) in [("v1.11.6", false), ("v1.12", true), ("v1.13.6", true), ("v1.9.0", false), ("v2.0.0", true)] {
            assert_eq!(TalosVersion::parse("v", v).unwrap().uses_registry_documents(), docs, "{v}");
        }
        for bad in ["1.13.6", "v1", "v1.13.6.1", "v1.x.0", "v1.13.6\n", ""] {
            assert!(TalosVersion::parse("v", bad).is_err(), "{bad:?}");
        }
    }
}
