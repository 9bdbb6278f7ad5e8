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

use crate::registries::{Endpoint, EndpointConfig, MirrorPlan};
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
    /// Always written, empty with `--skip-fallback` and one mirror (containerd 1.6 needs the
    /// table). In the order containerd tries them: the file's order, not sorted.
    host: Hosts,
}

/// `[host."<url>"]` tables in the order given.
struct Hosts(Vec<(String, HostSettings)>);

impl Serialize for Hosts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

fn settings(mirror: &Endpoint, cfg: &EndpointConfig) -> HostSettings {
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
    if mirror.override_path {
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
        let mirrors: Vec<&Endpoint> = plan.mirrors().collect();
        let host = |m: &[&Endpoint]| Hosts(m.iter().map(|e| (e.url.to_string(), settings(e, &plan.config))).collect());
        let file = match mirrors.split_last() {
            // containerd appends `server` as the last host: the last mirror, so nothing follows it.
            Some((last, before)) if plan.skips_fallback(registry) => {
                HostsFile { server: Some(last.url.to_string()), root: settings(last, &plan.config), host: host(before) }
            }
            _ => HostsFile { server: registry.upstream(), root: HostSettings::default(), host: host(&mirrors) },
        };
        let mut text = match plan.no_fallback.get(registry) {
            // Why the upstream is not listed, for whoever reads the file on the node.
            Some(why) => {
                let upstream = registry.upstream().unwrap_or_else(|| "each registry itself".into());
                comment(&format!(
                    "no fallback to {upstream}: {why} (a node that fell back would pull what tender refuses straight from the registry)"
                ))
            }
            None => String::new(),
        };
        text.push_str(
            &toml::to_string(&file)
                .map_err(|e| Error::Serialise { what: "hosts.toml".into(), message: e.to_string() })?,
        );
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

/// `why` as a `#` comment line, its first letter capitalised. A control character (none
/// reaches here: rule patterns and registry names refuse them) is escaped, so the comment
/// cannot end early.
fn comment(why: &str) -> String {
    let mut out = String::from("# ");
    for (i, c) in why.chars().enumerate() {
        match c {
            c if c.is_control() => out.extend(c.escape_debug()),
            c if i == 0 => out.extend(c.to_uppercase()),
            c => out.push(c),
        }
    }
    out.push('\n');
    out
}

fn pem_bytes(pem: &str) -> Vec<u8> {
    let mut s = pem.to_string();
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s.into_bytes()
}

/// The containerd release on the nodes, as far as its registry configuration differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerdVersion {
    /// 1.6 and 1.7: config version 2, the CRI plugin `io.containerd.grpc.v1.cri`.
    V1,
    /// 2.0: config version 3, images in `io.containerd.cri.v1.images`.
    V2_0,
    /// 2.1 and later: CRI pulls go through the transfer service, which ignores `hosts.toml`
    /// unless `use_local_image_pull = true`.
    V2_1,
}

impl ContainerdVersion {
    /// `1.7`, `v2.1.3`, `2.0`: 1.6 and later, major 1 or 2.
    pub fn parse(field: &str, value: &str) -> Result<ContainerdVersion, crate::Refusal> {
        let bad = |why: &str| {
            crate::Refusal::input(field, value, why, "spell the release like 1.7 or 2.1 (containerd --version)")
        };
        let rest = value.strip_prefix('v').unwrap_or(value);
        let parts: Vec<&str> = rest.split('.').collect();
        if !(2..=3).contains(&parts.len())
            || parts.iter().any(|p| p.is_empty() || p.len() > 6 || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(bad("is not a containerd version (MAJOR.MINOR or MAJOR.MINOR.PATCH)"));
        }
        let number = |p: &str| p.parse::<u32>().map_err(|_| bad("is not a containerd version"));
        match (number(parts[0])?, number(parts[1])?) {
            (1, minor) if minor >= 6 => Ok(ContainerdVersion::V1),
            (2, 0) => Ok(ContainerdVersion::V2_0),
            (2, _) => Ok(ContainerdVersion::V2_1),
            _ => Err(bad("is not a containerd release tender renders for (1.6 and later, up to 2.x)")),
        }
    }
}

/// The `config.toml` drop-in that makes the CRI plugin of `version` read the `hosts.toml` files
/// under `config_path` (import it from `/etc/containerd/config.toml` with `imports`). From
/// containerd 2.1 it also sets `use_local_image_pull = true`: without it, CRI image pulls go
/// through the transfer service, which ignores `hosts.toml`, and no request reaches the mirror.
pub fn config_dropin(version: ContainerdVersion, config_path: &str) -> String {
    let path = toml::Value::String(config_path.to_string()).to_string();
    match version {
        ContainerdVersion::V1 => format!(
            "# containerd 1.6 / 1.7: import from /etc/containerd/config.toml (imports = [\"<this file>\"])\n\
             version = 2\n\n\
             [plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = {path}\n"
        ),
        ContainerdVersion::V2_0 => format!(
            "# containerd 2.0: import from /etc/containerd/config.toml (imports = [\"<this file>\"])\n\
             version = 3\n\n\
             [plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = {path}\n"
        ),
        ContainerdVersion::V2_1 => format!(
            "# containerd 2.1 and later: import from /etc/containerd/config.toml (imports = [\"<this file>\"]).\n\
             # Without use_local_image_pull, CRI pulls use the transfer service, which ignores hosts.toml.\n\
             version = 3\n\n\
             [plugins.\"io.containerd.cri.v1.images\"]\n  use_local_image_pull = true\n\n\
             [plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = {path}\n"
        ),
    }
}

#[cfg(test)]
mod dropin_tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_parse_containerd_versions_and_refuse_the_rest() {
        let cases = [
            ("1.6", Some(ContainerdVersion::V1)),
            ("v1.7.27", Some(ContainerdVersion::V1)),
            ("2.0", Some(ContainerdVersion::V2_0)),
            ("2.0.5", Some(ContainerdVersion::V2_0)),
            ("2.1", Some(ContainerdVersion::V2_1)),
            ("v2.2.0", Some(ContainerdVersion::V2_1)),
            ("1.5", None),
            ("3.0", None),
            ("2", None),
            ("2.x", None),
            ("", None),
            ("99999999999.1", None),
            ("2.1.1.1", None),
        ];
        for (value, want) in cases {
            assert_eq!(ContainerdVersion::parse("--containerd-version", value).ok(), want, "{value}");
        }
    }

    #[test]
    fn should_render_the_drop_in_each_version_needs() {
        let v1 = config_dropin(ContainerdVersion::V1, "/etc/containerd/certs.d");
        assert!(v1.contains("version = 2\n") && v1.contains("[plugins.\"io.containerd.grpc.v1.cri\".registry]"));
        assert!(!v1.contains("use_local_image_pull"));
        let v20 = config_dropin(ContainerdVersion::V2_0, "/etc/containerd/certs.d");
        assert!(v20.contains("version = 3\n") && v20.contains("[plugins.\"io.containerd.cri.v1.images\".registry]"));
        assert!(!v20.contains("use_local_image_pull"));
        let v21 = config_dropin(ContainerdVersion::V2_1, "/etc/containerd/certs.d");
        assert!(v21.contains("use_local_image_pull = true"));
        for text in [&v1, &v20, &v21] {
            let parsed: toml::Value = toml::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
            let plugins = &parsed["plugins"];
            let registry = plugins
                .get("io.containerd.grpc.v1.cri")
                .or(plugins.get("io.containerd.cri.v1.images"))
                .and_then(|p| p.get("registry"))
                .unwrap_or_else(|| panic!("a registry table: {text}"));
            assert_eq!(registry["config_path"].as_str(), Some("/etc/containerd/certs.d"));
        }
        // a path that needs quoting stays one TOML string
        let odd = config_dropin(ContainerdVersion::V2_1, "/tmp/a \"b\"\\c");
        let parsed: toml::Value = toml::from_str(&odd).unwrap();
        assert_eq!(
            parsed["plugins"]["io.containerd.cri.v1.images"]["registry"]["config_path"].as_str(),
            Some("/tmp/a \"b\"\\c")
        );
    }
}
