//! Image references as people write them (`alpine`, `ghcr.io/siderolabs/kubelet:v1.35.0`).

use std::fmt;

use crate::{Digest, Reference, RepoName, Tag};

/// An image reference as people write it, resolved the way containerd and Docker do:
/// `alpine` is `docker.io/library/alpine:latest`; a first component with a `.` or `:` (or
/// `localhost`) names the registry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    /// The registry host as clients name it, the `ns` value: `docker.io`, `ghcr.io`.
    pub registry: String,
    pub repository: RepoName,
    /// What to ask the registry for: the digest when there is one (as containerd does).
    pub reference: Reference,
    /// A tag written beside a digest (`alpine:3@sha256:...`), kept for display only.
    pub tag_hint: Option<Tag>,
}

impl ImageRef {
    pub fn parse(raw: &str) -> Result<ImageRef, String> {
        let s = raw.trim();
        if s.is_empty() {
            return Err("empty image reference".to_string());
        }
        let bad = |why: String| format!("{s:?} is not an image reference: {why}");
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(d.parse::<Digest>().map_err(|e| bad(e.to_string()))?)),
            None => (s, None),
        };
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let (n, t) = rest.split_at(last_slash + i);
                (n, Some(t[1..].parse::<Tag>().map_err(|e| bad(e.to_string()))?))
            }
            None => (rest, None),
        };
        let (registry, path) = match name.split_once('/') {
            Some((first, path)) if first.contains('.') || first.contains(':') || first == "localhost" => {
                (first.to_ascii_lowercase(), path)
            }
            _ => ("docker.io".to_string(), name),
        };
        if !registry.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']')) {
            return Err(bad(format!("{registry:?} is not a registry host")));
        }
        let registry = match registry.as_str() {
            "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
            _ => registry,
        };
        let mut repository: RepoName = path.parse().map_err(|e: crate::NameError| bad(e.to_string()))?;
        if registry == "docker.io" {
            repository = repository.with_library_prefix();
        }
        let (reference, tag_hint) = match (digest, tag) {
            (Some(d), t) => (Reference::Digest(d), t),
            (None, Some(t)) => (Reference::Tag(t), None),
            (None, None) => (Reference::Tag("latest".parse::<Tag>().map_err(|e| bad(e.to_string()))?), None),
        };
        Ok(ImageRef { registry, repository, reference, tag_hint })
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        match &self.reference {
            Reference::Tag(t) => write!(f, ":{t}"),
            Reference::Digest(d) => match &self.tag_hint {
                Some(t) => write!(f, ":{t}@{d}"),
                None => write!(f, "@{d}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn check(input: &str, expect: &str) {
        assert_eq!(ImageRef::parse(input).unwrap().to_string(), expect, "{input}");
    }

    #[test]
    fn should_resolve_references_like_containerd() {
        check("alpine", "docker.io/library/alpine:latest");
        check("alpine:3", "docker.io/library/alpine:3");
        check("bitnami/redis", "docker.io/bitnami/redis:latest");
        check("docker.io/library/alpine", "docker.io/library/alpine:latest");
        check("index.docker.io/alpine:3", "docker.io/library/alpine:3");
        check("ghcr.io/siderolabs/kubelet:v1.35.0", "ghcr.io/siderolabs/kubelet:v1.35.0");
        check("GHCR.io/siderolabs/kubelet:v1.35.0", "ghcr.io/siderolabs/kubelet:v1.35.0");
        check("localhost/x", "localhost/x:latest");
        check("127.0.0.1:5000/a/b:c", "127.0.0.1:5000/a/b:c");
        check("factory.talos.dev/installer/ce4c98:v1.13.6", "factory.talos.dev/installer/ce4c98:v1.13.6");
        let d = format!("sha256:{}", "a".repeat(64));
        check(&format!("docker.io/library/alpine@{d}"), &format!("docker.io/library/alpine@{d}"));
        check(&format!("alpine:3@{d}"), &format!("docker.io/library/alpine:3@{d}"));
        let r = ImageRef::parse(&format!("alpine:3@{d}")).unwrap();
        assert_eq!(r.reference.to_string(), d, "a digest wins over a tag");
        assert_eq!(ImageRef::parse("alpine").unwrap().reference.to_string(), "latest");
    }

    #[test]
    fn should_refuse_what_is_not_a_reference() {
        for bad in ["", "UPPER/case", "a//b", "ghcr.io/", "alpine:", "alpine@sha256:12", "a b", "ghcr.io/x:a/b", "x@y"]
        {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
