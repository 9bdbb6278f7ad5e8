//! The upstream: Debian's `docker-registry` (distribution 2.8) started by the test bed
//! (`scripts/testbed/upstream.sh`), filled with the synthetic images of `mkimages.sh`, its access
//! log summed by `upstream-bytes.sh`.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::digest::hex_of;
use crate::paths::harness_script;
use crate::proc::{self, cmd, need};

/// A port nobody listened on a moment ago (bind port 0, read it, release it). Callers that
/// can lose the race retry with another.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    l.local_addr().expect("local address of a bound socket").port()
}

/// A running `docker-registry`, stopped (through the test bed) when dropped.
pub struct Registry {
    dir: PathBuf,
    pub port: u16,
}

impl Registry {
    /// Start an empty registry with its storage and access log under `dir`.
    pub fn start(dir: &Path) -> Registry {
        need(&["docker-registry", "curl"]);
        let script = harness_script("upstream.sh");
        let mut last = String::new();
        for _ in 0..3 {
            let port = free_port();
            let out = proc::output(&mut cmd(&script, ["start".as_ref(), dir.as_os_str(), port.to_string().as_ref()]));
            if out.status.success() {
                return Registry { dir: dir.to_path_buf(), port };
            }
            last = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            // a lost port race: stop whatever half-started, try another port
            let _ = proc::output(&mut cmd(&script, ["stop".as_ref(), dir.as_os_str()]));
        }
        panic!("docker-registry did not start in {}:\n{last}", dir.display());
    }

    /// `127.0.0.1:PORT`
    pub fn hostport(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The registry's access log summed by the test bed's `upstream-bytes.sh`.
    pub fn stats(&self) -> UpstreamStats {
        let out = proc::run(&mut cmd(harness_script("upstream-bytes.sh"), [&self.dir]));
        UpstreamStats::parse(&out)
    }

    /// The length of the access log now: pass it to [`Registry::requests_since`].
    pub fn log_len(&self) -> u64 {
        std::fs::metadata(self.dir.join("access.log")).map(|m| m.len()).unwrap_or(0)
    }

    /// The request lines (`GET /v2/...`, `HEAD /v2/...`) the registry logged after `offset`,
    /// once its log stopped growing (it writes a line after the response went out).
    pub fn requests_since(&self, offset: u64) -> Vec<String> {
        let mut last = u64::MAX;
        crate::poll_until("the registry's access log to settle", std::time::Duration::from_secs(5), || {
            let now = self.log_len();
            let settled = now == last;
            last = now;
            settled.then_some(())
        });
        let text = std::fs::read(self.dir.join("access.log")).expect("the registry's access log");
        let text =
            String::from_utf8_lossy(text.get(usize::try_from(offset).unwrap_or(usize::MAX)..).unwrap_or_default());
        text.lines()
            .filter_map(|l| {
                let start = l.find("\"GET ").or_else(|| l.find("\"HEAD "))?;
                let rest = &l[start + 1..];
                Some(rest[..rest.find(" HTTP/")?].to_string())
            })
            .collect()
    }

    /// The digest the registry announces for `repo:reference` with the given Accept header.
    pub fn manifest_digest(&self, repo: &str, reference: &str, accept: &str) -> String {
        let addr = self.hostport().parse().expect("loopback address");
        let r = crate::http::request(addr, "HEAD", &format!("/v2/{repo}/manifests/{reference}"), &[("Accept", accept)])
            .unwrap_or_else(|e| panic!("HEAD {repo}:{reference} on the upstream: {e}"));
        assert_eq!(r.status(), 200, "HEAD {repo}:{reference} on the upstream");
        r.header("docker-content-digest").expect("the upstream sends Docker-Content-Digest").to_string()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = proc::output(&mut cmd(harness_script("upstream.sh"), ["stop".as_ref(), self.dir.as_os_str()]));
    }
}

/// What the upstream served, from its access log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamStats {
    pub requests: u64,
    pub blob_gets: u64,
    pub manifest_gets: u64,
    pub manifest_heads: u64,
    /// Blob GETs per digest.
    pub blob_gets_by_digest: BTreeMap<String, u64>,
}

impl UpstreamStats {
    /// Parse `upstream-bytes.sh` output: `key=value ...`, then `  sha256:... gets=N bytes=M`.
    pub fn parse(text: &str) -> UpstreamStats {
        let mut s = UpstreamStats::default();
        let mut lines = text.lines();
        let summary = lines.next().unwrap_or_default();
        for kv in summary.split_whitespace() {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let v: u64 = v.parse().unwrap_or(0);
            match k {
                "requests" => s.requests = v,
                "blob_gets" => s.blob_gets = v,
                "manifest_gets" => s.manifest_gets = v,
                "manifest_heads" => s.manifest_heads = v,
                _ => {}
            }
        }
        for l in lines {
            let mut parts = l.split_whitespace();
            let (Some(d), Some(g)) = (parts.next(), parts.next()) else {
                continue;
            };
            if let Some(n) = g.strip_prefix("gets=").and_then(|n| n.parse().ok()) {
                s.blob_gets_by_digest.insert(d.to_string(), n);
            }
        }
        s
    }
}

/// Layer sizes for `mkimages.sh` (MiB, space-separated; empty skips the image).
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub kubelet: &'static str,
    pub installer: &'static str,
    pub big_mb: u32,
}

impl Sizes {
    /// Small images: a test pulls them in a second or two.
    pub const SMALL: Sizes = Sizes { kubelet: "3 1", installer: "2", big_mb: 0 };
    /// Only the kubelet index.
    pub const KUBELET: Sizes = Sizes { kubelet: "1", installer: "", big_mb: 0 };
}

/// The synthetic images `mkimages.sh` built and pushed: its OCI layout and `images.env`.
pub struct Images {
    pub work: PathBuf,
    pub env: BTreeMap<String, String>,
}

impl Images {
    /// Build the images in `work` and push them to `registry` with skopeo.
    pub fn push(registry: &Registry, work: &Path, sizes: Sizes) -> Images {
        need(&["skopeo", "jq", "openssl", "curl", "tar", "gzip"]);
        let mut c = cmd(harness_script("mkimages.sh"), [registry.hostport()]);
        c.env("WORK", work)
            .env("KUBELET_LAYERS_MB", sizes.kubelet)
            .env("INSTALLER_LAYERS_MB", sizes.installer)
            .env("BIG_MB", sizes.big_mb.to_string());
        proc::run(&mut c);
        let text = std::fs::read_to_string(work.join("images.env")).expect("mkimages.sh writes images.env");
        let env = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Images { work: work.to_path_buf(), env }
    }

    /// A value from `images.env` (`KUBELET_INDEX`, `INSTALLER_MANIFEST`, ...).
    pub fn var(&self, key: &str) -> &str {
        self.env.get(key).unwrap_or_else(|| panic!("images.env has no {key}: {:?}", self.env))
    }

    /// The OCI layout the images were pushed from.
    pub fn layout(&self) -> PathBuf {
        self.work.join("layout")
    }

    /// A blob of the source layout.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.layout().join("blobs/sha256").join(hex_of(digest))
    }

    /// A manifest of the source layout, parsed.
    pub fn manifest(&self, digest: &str) -> Value {
        let bytes = std::fs::read(self.blob_path(digest)).unwrap_or_else(|e| panic!("{digest} in the layout: {e}"));
        serde_json::from_slice(&bytes).expect("manifests are JSON")
    }

    /// The config and layer digests of an image manifest, in order.
    pub fn config_and_layers(&self, manifest: &str) -> Vec<String> {
        let m = self.manifest(manifest);
        let mut out = vec![m["config"]["digest"].as_str().expect("config digest").to_string()];
        for l in m["layers"].as_array().expect("layers") {
            out.push(l["digest"].as_str().expect("layer digest").to_string());
        }
        out
    }
}
