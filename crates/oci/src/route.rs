//! The pull API's paths (everything after `/v2/`) parsed into a typed route.

use crate::digest::Digest;
use crate::name::{NameError, Reference, RepoName};

/// What a `/v2/...` request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteKind {
    /// `GET /v2/`
    Base,
    Manifest(Reference),
    Blob(Digest),
    TagsList,
    Referrers(Digest),
}

/// A parsed `/v2/<name>/...` request: the repository name as sent, and what it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// `None` only for [`RouteKind::Base`].
    pub name: Option<RepoName>,
    pub kind: RouteKind,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("no such endpoint: {0}")]
    NotFound(String),
    #[error("pushing, deleting and uploading are not supported by a pull-through mirror")]
    Unsupported,
    #[error("invalid repository name: {0}")]
    Name(NameError),
    #[error("invalid reference: {0}")]
    Reference(NameError),
    #[error("invalid digest: {0}")]
    Digest(crate::digest::DigestError),
}

impl Route {
    /// Parse the raw (still percent-encoded) path of a request, starting with `/v2/`.
    /// Percent signs never appear in valid names, tags or digests, so encoded slashes and
    /// dots are refused by the grammar rather than decoded.
    pub fn parse(path: &str) -> Result<Route, RouteError> {
        let rest = path
            .strip_prefix("/v2/")
            .or_else(|| if path == "/v2" { Some("") } else { None })
            .ok_or_else(|| RouteError::NotFound(path.to_string()))?;
        if rest.is_empty() {
            return Ok(Route { name: None, kind: RouteKind::Base });
        }
        let name = |s: &str| s.parse::<RepoName>().map_err(RouteError::Name);
        if let Some(n) = rest.strip_suffix("/tags/list") {
            return Ok(Route { name: Some(name(n)?), kind: RouteKind::TagsList });
        }
        if rest.contains("/blobs/uploads") {
            return Err(RouteError::Unsupported);
        }
        if let Some((n, r)) = rest.rsplit_once("/manifests/") {
            let reference = r.parse::<Reference>().map_err(RouteError::Reference)?;
            return Ok(Route { name: Some(name(n)?), kind: RouteKind::Manifest(reference) });
        }
        if let Some((n, d)) = rest.rsplit_once("/blobs/") {
            let digest = d.parse::<Digest>().map_err(RouteError::Digest)?;
            return Ok(Route { name: Some(name(n)?), kind: RouteKind::Blob(digest) });
        }
        if let Some((n, d)) = rest.rsplit_once("/referrers/") {
            let digest = d.parse::<Digest>().map_err(RouteError::Digest)?;
            return Ok(Route { name: Some(name(n)?), kind: RouteKind::Referrers(digest) });
        }
        Err(RouteError::NotFound(path.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn check(path: &str, expect: Result<(&str, &str), &str>) {
        let got = Route::parse(path);
        match (got, expect) {
            (Ok(r), Ok((name, kind))) => {
                assert_eq!(r.name.as_ref().map(|n| n.as_str()).unwrap_or(""), name, "{path}");
                let k = match r.kind {
                    RouteKind::Base => "base".to_string(),
                    RouteKind::Manifest(re) => format!("manifest {re}"),
                    RouteKind::Blob(d) => format!("blob {d}"),
                    RouteKind::TagsList => "tags".to_string(),
                    RouteKind::Referrers(d) => format!("referrers {d}"),
                };
                assert_eq!(k, kind, "{path}");
            }
            (Err(e), Err(want)) => {
                let got = match e {
                    RouteError::NotFound(_) => "notfound",
                    RouteError::Unsupported => "unsupported",
                    RouteError::Name(_) => "name",
                    RouteError::Reference(_) => "reference",
                    RouteError::Digest(_) => "digest",
                };
                assert_eq!(got, want, "{path}");
            }
            (got, want) => panic!("{path}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn should_parse_pull_api_paths() {
        check("/v2/", Ok(("", "base")));
        check("/v2", Ok(("", "base")));
        check("/v2/library/alpine/manifests/3.20", Ok(("library/alpine", "manifest 3.20")));
        check(&format!("/v2/a/manifests/{D}"), Ok(("a", &format!("manifest {D}"))));
        check(
            &format!("/v2/ghcr.io/siderolabs/kubelet/blobs/{D}"),
            Ok(("ghcr.io/siderolabs/kubelet", &format!("blob {D}"))),
        );
        check("/v2/a/b/tags/list", Ok(("a/b", "tags")));
        check(&format!("/v2/a/referrers/{D}"), Ok(("a", &format!("referrers {D}"))));
        // a repository may itself be called "manifests"
        check("/v2/x/manifests/manifests/latest", Ok(("x/manifests", "manifest latest")));
    }

    #[test]
    fn should_refuse_hostile_paths() {
        check("/v2/../etc/passwd/manifests/latest", Err("name"));
        check("/v2/a%2f..%2fb/manifests/latest", Err("name"));
        check("/v2/a/manifests/..", Err("reference"));
        check("/v2/a/manifests/sha256:..%2f..", Err("reference"));
        check("/v2/a/blobs/sha256:abc", Err("digest"));
        check("/v2/a/blobs/../../x", Err("digest"));
        check("/v2/a/blobs/uploads/", Err("unsupported"));
        check("/v2/a/whatever", Err("notfound"));
        check("/v3/a/manifests/x", Err("notfound"));
        check("/v2/A/manifests/x", Err("name"));
    }

    proptest! {
        #[test]
        fn should_never_panic_and_never_yield_dot_components(s in "/v2/[a-z0-9./:%_-]{0,60}") {
            if let Ok(r) = Route::parse(&s) {
                if let Some(n) = r.name {
                    for c in n.components() {
                        prop_assert!(c != ".." && c != ".");
                    }
                }
            }
        }
    }
}
