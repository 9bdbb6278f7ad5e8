//! Typed, validated registry routing: which registries go through which mirror endpoints, and
//! the TLS / auth settings of each endpoint host.
//!
//! Both `tender render registries` and a pool's `talos.registryMirrors` / `talos.registryConfig`
//! end up as a [`Routing`], which the Talos and containerd renderers turn into bytes.

use std::collections::BTreeMap;
use std::fmt;

use crate::rules::{check_no_control, Refusal};
// The URL grammar lives in `url` and the credentials check in `rules` (R-8 checks the factory URL
// with both, and `rules` sits below this module); re-exported under the paths they had here.
pub use crate::rules::check_no_credentials;
pub use crate::url::{has_credentials, parse_http_url, Authority, HttpUrl};

/// A registry a mirror serves: one host, or every registry (`*` in Talos, `_default` in
/// containerd).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Registry {
    All,
    Host(Authority),
}

impl Registry {
    pub fn parse(field: &str, value: &str) -> Result<Registry, Refusal> {
        if value == "*" {
            return Ok(Registry::All);
        }
        Authority::parse(value).map(Registry::Host).map_err(|problem| {
            Refusal::input(
                field,
                value,
                format!("is not a registry host: {problem}"),
                "give a registry host such as ghcr.io or registry.example:5000, or '*' for all",
            )
        })
    }

    /// The name Talos uses (`*` for all).
    pub fn talos_name(&self) -> String {
        match self {
            Registry::All => "*".into(),
            Registry::Host(a) => a.to_string(),
        }
    }

    /// The directory containerd looks up under its `config_path`.
    pub fn containerd_dir(&self) -> String {
        match self {
            Registry::All => "_default".into(),
            Registry::Host(a) => a.to_string(),
        }
    }

    /// The registry's own endpoint, listed after the mirror so a dead mirror falls back to it
    /// (`docker.io` is served from `registry-1.docker.io`). None for `*`.
    pub fn upstream(&self) -> Option<String> {
        match self {
            Registry::All => None,
            Registry::Host(a) if a.host == "docker.io" && a.port.is_none() => {
                Some("https://registry-1.docker.io".into())
            }
            Registry::Host(a) => Some(format!("https://{a}")),
        }
    }
}

impl fmt::Display for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.talos_name())
    }
}

/// One mirror endpoint of a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub url: HttpUrl,
    /// Use the URL path as the API root (no `/v2` appended).
    pub override_path: bool,
}

/// Where one registry's pulls go: its mirror endpoints in order, and whether the upstream
/// itself is tried after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    pub registry: Registry,
    pub endpoints: Vec<Endpoint>,
    pub skip_fallback: bool,
}

/// TLS settings for an endpoint host. Certificates and keys are PEM text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    pub ca: Option<String>,
    pub client: Option<ClientIdentity>,
    pub insecure_skip_verify: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub crt: String,
    pub key: String,
}

/// Credentials for an endpoint host, as in `.docker/config.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Auth {
    pub username: Option<String>,
    pub password: Option<String>,
    pub auth: Option<String>,
    pub identity_token: Option<String>,
}

/// TLS and auth of one endpoint host (`host[:port]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointConfig {
    pub tls: Option<Tls>,
    pub auth: Option<Auth>,
}

/// The whole routing: mirrors sorted by registry, configs keyed by endpoint host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routing {
    pub mirrors: Vec<Mirror>,
    pub configs: BTreeMap<Authority, EndpointConfig>,
}

impl Routing {
    pub fn is_empty(&self) -> bool {
        self.mirrors.is_empty() && self.configs.is_empty()
    }
}

/// Check a PEM block: it must look like PEM and carry no control characters but line breaks.
pub fn check_pem(field: &str, value: &str, kind: &str) -> Result<(), Refusal> {
    let bad_control = value.chars().any(|c| c.is_control() && c != '\n' && c != '\r');
    if bad_control || !value.contains("-----BEGIN ") || !value.contains("-----END ") {
        return Err(Refusal::input(
            field,
            value,
            format!("is not a PEM-encoded {kind}"),
            format!("give the {kind} as PEM text (-----BEGIN ...-----)"),
        ));
    }
    Ok(())
}

/// Check a credential string: no control characters (a newline would split a header).
pub fn check_secret_text(field: &str, value: &str) -> Result<(), Refusal> {
    if value.chars().any(char::is_control) {
        // Do not echo a secret back.
        return Err(Refusal::input(
            field,
            "<redacted>",
            "carries a control character (newline, tab, ...)",
            "remove the control characters (a trailing newline of a password file is already stripped)",
        ));
    }
    Ok(())
}

/// What `tender render registries` was asked for, after the CLI read the files.
#[derive(Debug, Clone, Default)]
pub struct RegistriesRequest {
    pub mirror: String,
    /// Further mirrors, tried in order after `mirror` (`--mirror` repeated: a node's rack
    /// tender first, then its parent). The TLS and auth settings apply to every mirror.
    pub more_mirrors: Vec<String>,
    pub registries: Vec<String>,
    pub skip_fallback: bool,
    pub ca: Option<String>,
    pub client_cert: Option<String>,
    pub client_key: Option<String>,
    pub insecure_skip_verify: bool,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// A validated registries request: one mirror (or several, in order) for several registries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorPlan {
    pub mirror: Endpoint,
    /// The mirrors tried after `mirror`, in order.
    pub more: Vec<Endpoint>,
    pub registries: Vec<Registry>,
    /// `--skip-fallback`: no registry falls back to its upstream.
    pub skip_fallback: bool,
    /// Registries that do not fall back to their upstream whatever `skip_fallback` says, each
    /// with the reason the output states (a signature policy refuses some of their images; the `verification` module fills it in).
    pub no_fallback: BTreeMap<Registry, String>,
    pub config: EndpointConfig,
}

impl RegistriesRequest {
    /// Validate hosts, the URL, duplicates and the TLS / auth combination.
    pub fn validate(&self) -> Result<MirrorPlan, Refusal> {
        let url = mirror_url(&self.mirror)?;
        let mut more: Vec<Endpoint> = Vec::new();
        for m in &self.more_mirrors {
            let u = mirror_url(m)?;
            check_new_mirror(m, &u, std::iter::once(&url).chain(more.iter().map(|e| &e.url)))?;
            more.push(Endpoint { override_path: !u.path.is_empty(), url: u });
        }
        if self.registries.is_empty() {
            return Err(Refusal::input(
                "--registry",
                "",
                "is missing",
                "name at least one registry to route, e.g. --registry ghcr.io, or --registry '*' for all",
            ));
        }
        let mut registries: Vec<Registry> = Vec::new();
        for value in &self.registries {
            let r = Registry::parse("--registry", value)?;
            if registries.contains(&r) {
                return Err(Refusal::input("--registry", value, "is given twice", "name each registry once"));
            }
            if r == Registry::Host(url.authority.clone())
                || more.iter().any(|e| r == Registry::Host(e.url.authority.clone()))
            {
                return Err(Refusal::input(
                    "--registry",
                    value,
                    "is the mirror itself; routing a registry through itself loops",
                    "drop it from --registry",
                ));
            }
            registries.push(r);
        }
        registries.sort();
        let client = match (&self.client_cert, &self.client_key) {
            (Some(crt), Some(key)) => {
                check_pem("--client-cert", crt, "certificate")?;
                check_pem("--client-key", key, "private key")?;
                Some(ClientIdentity { crt: crt.clone(), key: key.clone() })
            }
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Err(Refusal::input(
                    "--client-cert/--client-key",
                    "",
                    "are given one without the other",
                    "give both --client-cert and --client-key, or neither",
                ))
            }
        };
        if let Some(ca) = &self.ca {
            check_pem("--ca", ca, "CA certificate")?;
        }
        let wants_tls = self.ca.is_some() || client.is_some() || self.insecure_skip_verify;
        if wants_tls && !url.https && !more.iter().any(|e| e.url.https) {
            return Err(Refusal::input(
                "--mirror",
                &self.mirror,
                "is plain http://, so --ca, --client-cert and --insecure-skip-verify would have no effect",
                "use an https:// mirror URL, or drop the TLS options",
            ));
        }
        let tls =
            wants_tls.then(|| Tls { ca: self.ca.clone(), client, insecure_skip_verify: self.insecure_skip_verify });
        let auth = match (&self.username, &self.password) {
            (Some(u), Some(p)) => {
                check_secret_text("--username", u)?;
                if u.contains(':') || u.is_empty() {
                    return Err(Refusal::input(
                        "--username",
                        u,
                        "is empty or holds ':', which basic authentication cannot carry",
                        "use the registry user name as issued",
                    ));
                }
                check_secret_text("--password-file", p)?;
                Some(Auth { username: Some(u.clone()), password: Some(p.clone()), ..Auth::default() })
            }
            (None, None) => None,
            _ => {
                return Err(Refusal::input(
                    "--username/--password-file",
                    "",
                    "are given one without the other",
                    "give both --username and --password-file, or neither",
                ))
            }
        };
        let override_path = !url.path.is_empty();
        Ok(MirrorPlan {
            mirror: Endpoint { url, override_path },
            more,
            registries,
            skip_fallback: self.skip_fallback,
            no_fallback: BTreeMap::new(),
            config: EndpointConfig { tls, auth },
        })
    }
}

/// Refuse a repeated `--mirror` (`value`, parsed as `url`) whose host one of `before` has.
pub(crate) fn check_new_mirror<'a>(
    value: &str,
    url: &HttpUrl,
    mut before: impl Iterator<Item = &'a HttpUrl>,
) -> Result<(), Refusal> {
    if before.any(|b| b.authority == url.authority) {
        return Err(Refusal::input(
            "--mirror",
            value,
            "names a mirror host given before",
            "give each mirror once, in the order they should be tried",
        ));
    }
    Ok(())
}

/// Check one `--mirror` value: a plain http(s) URL without credentials.
fn mirror_url(mirror: &str) -> Result<HttpUrl, Refusal> {
    check_no_control("--mirror", mirror)?;
    check_no_credentials("--mirror", mirror)?;
    parse_http_url(mirror).map_err(|problem| {
        Refusal::input(
            "--mirror",
            mirror,
            format!("is not a plain http(s) URL: {problem}"),
            "give the mirror as http(s)://host[:port][/path], e.g. http://tender.kube-system.svc:5000",
        )
    })
}

impl MirrorPlan {
    /// Every mirror, in the order the nodes try them.
    pub fn mirrors(&self) -> impl Iterator<Item = &Endpoint> {
        std::iter::once(&self.mirror).chain(&self.more)
    }

    /// Whether `registry` is routed to the mirror alone, without its upstream after it.
    pub fn skips_fallback(&self, registry: &Registry) -> bool {
        self.skip_fallback || self.no_fallback.contains_key(registry)
    }

    /// The same plan as a [`Routing`], for the Talos renderer.
    pub fn routing(&self) -> Routing {
        let mirrors = self
            .registries
            .iter()
            .map(|r| Mirror {
                registry: r.clone(),
                endpoints: self.mirrors().cloned().collect(),
                skip_fallback: self.skips_fallback(r),
            })
            .collect();
        let mut configs = BTreeMap::new();
        if self.config.tls.is_some() || self.config.auth.is_some() {
            for m in self.mirrors() {
                configs.insert(m.url.authority.clone(), self.config.clone());
            }
        }
        Routing { mirrors, configs }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_parse_registry_hosts_and_refuse_the_rest() {
        for ok in ["ghcr.io", "docker.io", "registry.example:5000", "10.0.0.1:443", "localhost", "*"] {
            assert!(Registry::parse("r", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "GHCR.io",
            "ghcr.io:",
            "ghcr.io:0",
            "ghcr.io:65536",
            "-a.io",
            "a..io",
            "a/b",
            "$(id)",
            "`id`",
            "a\nb",
            "https://ghcr.io",
            "a b",
            "ghcr.io/",
            "*.io",
        ] {
            assert!(Registry::parse("r", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn should_refuse_duplicate_registries() {
        let req = RegistriesRequest {
            mirror: "http://m:5000".into(),
            more_mirrors: Vec::new(),
            registries: vec!["ghcr.io".into(), "ghcr.io".into()],
            skip_fallback: false,
            ca: None,
            client_cert: None,
            client_key: None,
            insecure_skip_verify: false,
            username: None,
            password: None,
        };
        let err = req.validate().unwrap_err().to_string();
        assert!(err.contains("given twice"), "{err}");
    }
}
