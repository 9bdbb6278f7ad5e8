//! containerd `hosts.toml` files (containerd `docs/hosts.md`), one directory per registry under
//! containerd's `config_path` (e.g. `/etc/containerd/certs.d`).
//!
//! The normal form tries the mirror first and the upstream (`server`) last:
//!
//! ```toml
//! server = "https://ghcr.io"
//!
//! [host."https://tender.example:5000"]
//! capabilities = ["pull", "resolve"]
//! ca = "ca.crt"
//! ```
//!
//! containerd always appends the `server` entry as the last host and, when `server` is absent,
//! fills it with the registry itself. So "skip fallback" cannot be written as "no server": it is
//! written as `server = "<mirror>"` with the mirror's settings at the top level, which leaves the
//! mirror as the only host. An empty `[host]` table follows: containerd 1.6 refuses a hosts.toml
//! without a `host` tree ("invalid `host` tree") and then falls back to the registry itself, the
//! very thing `--skip-fallback` must prevent; an empty tree satisfies it without listing the
//! mirror a second time (which made containerd ask tender twice for every miss). Relative paths
//! (`ca.crt`) resolve against the host directory.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::registries::{EndpointConfig, MirrorPlan};
use crate::talos::base64;
use crate::Error;

/// One file to write, relative to the output directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFile {
    /// `<host>/hosts.toml`, `<host>/ca.crt`, ...
    pub path: String,
    pub contents: Vec<u8>,
    /// Holds a credential or private key: write it readable by the owner only.
    pub secret: bool,
}

#[derive(Serialize, Default)]
struct HostSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    capabilities: Option<Vec<&'static str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client: Option<Vec<[&'static str; 2]>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    skip_verify: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    override_path: Option<bool>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    header: BTreeMap<&'static str, String>,
}

#[derive(Serialize)]
struct HostsFile {
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<String>,
    #[serde(flatten)]
    root: HostSettings,
    /// Always written, empty with `--skip-fallback` (containerd 1.6 needs the table).
    host: BTreeMap<String, HostSettings>,
}

fn settings(plan: &MirrorPlan, cfg: &EndpointConfig) -> HostSettings {
    let mut s = HostSettings { capabilities: Some(vec!["pull", "resolve"]), ..HostSettings::default() };
    if let Some(tls) = &cfg.tls {
        if tls.ca.is_some() {
            s.ca = Some("ca.crt");
        }
        if tls.client.is_some() {
            s.client = Some(vec![["client.crt", "client.key"]]);
        }
        if tls.insecure_skip_verify {
            s.skip_verify = Some(true);
        }
    }
    if plan.mirror.override_path {
        s.override_path = Some(true);
    }
    if let Some(auth) = &cfg.auth {
        if let (Some(u), Some(p)) = (&auth.username, &auth.password) {
            s.header.insert("Authorization", format!("Basic {}", base64(format!("{u}:{p}").as_bytes())));
        }
    }
    s
}

/// Render `<dir>/hosts.toml` (and `ca.crt`, `client.crt`, `client.key`) for every registry of
/// the plan, in registry order.
pub fn hosts_files(plan: &MirrorPlan) -> Result<Vec<OutputFile>, Error> {
    let mut files = Vec::new();
    for registry in &plan.registries {
        let dir = registry.containerd_dir();
        let mirror_settings = settings(plan, &plan.config);
        let file = if plan.skip_fallback {
            HostsFile { server: Some(plan.mirror.url.to_string()), root: mirror_settings, host: BTreeMap::new() }
        } else {
            HostsFile {
                server: registry.upstream(),
                root: HostSettings::default(),
                host: BTreeMap::from([(plan.mirror.url.to_string(), mirror_settings)]),
            }
        };
        let text = toml::to_string(&file)
            .map_err(|e| Error::Serialise { what: "hosts.toml".into(), message: e.to_string() })?;
        let secret = plan.config.auth.is_some();
        files.push(OutputFile { path: format!("{dir}/hosts.toml"), contents: text.into_bytes(), secret });
        if let Some(tls) = &plan.config.tls {
            if let Some(ca) = &tls.ca {
                files.push(OutputFile { path: format!("{dir}/ca.crt"), contents: pem_bytes(ca), secret: false });
            }
            if let Some(c) = &tls.client {
                files.push(OutputFile {
                    path: format!("{dir}/client.crt"),
                    contents: pem_bytes(&c.crt),
                    secret: false,
                });
                files.push(OutputFile { path: format!("{dir}/client.key"), contents: pem_bytes(&c.key), secret: true });
            }
        }
    }
    Ok(files)
}

fn pem_bytes(pem: &str) -> Vec<u8> {
    let mut s = pem.to_string();
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s.into_bytes()
}
