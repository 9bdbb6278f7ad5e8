//! Repository names, tags and references, validated against the distribution grammar before
//! anything touches a disk or a network.

use std::fmt;
use std::str::FromStr;

use crate::digest::{Digest, DigestError};

/// Longest repository name the distribution reference accepts.
pub const MAX_NAME_LEN: usize = 255;
/// Longest tag.
pub const MAX_TAG_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("repository name is empty")]
    Empty,
    #[error("repository name is longer than {MAX_NAME_LEN} characters")]
    TooLong,
    #[error("repository name {0:?} does not match [a-z0-9]+((.|_|__|-+)[a-z0-9]+)*(/...)*")]
    Grammar(String),
    #[error("tag {0:?} does not match [a-zA-Z0-9_][a-zA-Z0-9._-]{{0,127}}")]
    Tag(String),
    #[error(transparent)]
    Digest(#[from] DigestError),
}

/// A repository name such as `siderolabs/kubelet`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoName(String);

impl RepoName {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path components (`["siderolabs", "kubelet"]`).
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// This name without its first component, if it has more than one.
    pub fn strip_first(&self) -> Option<(&str, RepoName)> {
        let (first, rest) = self.0.split_once('/')?;
        Some((first, RepoName(rest.to_string())))
    }

    /// `library/<name>` for a one-component name, as Docker Hub wants it; otherwise unchanged.
    pub fn with_library_prefix(self) -> RepoName {
        if self.0.contains('/') {
            self
        } else {
            RepoName(format!("library/{}", self.0))
        }
    }
}

fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // a separator run: ".", "_", "__", or one or more "-"
        let start = i;
        match b[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < b.len() && b[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < b.len() && b[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
        if i == start || i >= b.len() || !alnum(b[i]) {
            return false;
        }
    }
    true
}

impl FromStr for RepoName {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Err(NameError::Empty);
        }
        if s.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong);
        }
        if s.split('/').all(valid_component) {
            Ok(RepoName(s.to_string()))
        } else {
            Err(NameError::Grammar(s.to_string()))
        }
    }
}

impl fmt::Display for RepoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RepoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// A tag such as `v1.33.1`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(String);

impl Tag {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Tag {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let b = s.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= MAX_TAG_LEN
            && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
            && b.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
        if ok {
            Ok(Tag(s.to_string()))
        } else {
            Err(NameError::Tag(s.to_string()))
        }
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// What a manifest request names: a tag or a digest.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Reference {
    Tag(Tag),
    Digest(Digest),
}

impl FromStr for Reference {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.contains(':') {
            Ok(Reference::Digest(s.parse()?))
        } else {
            Ok(Reference::Tag(s.parse()?))
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reference::Tag(t) => fmt::Display::fmt(t, f),
            Reference::Digest(d) => fmt::Display::fmt(d, f),
        }
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn should_accept_valid_names() {
        for ok in [
            "a",
            "library/alpine",
            "siderolabs/kubelet",
            "ghcr.io/siderolabs/kubelet",
            "a__b",
            "a---b",
            "a.b_c-d/e0",
            "registry.k8s.io/pause",
        ] {
            assert!(ok.parse::<RepoName>().is_ok(), "{ok:?} must be accepted");
        }
    }

    #[test]
    fn should_refuse_invalid_names() {
        for bad in [
            "", "A", "a/", "/a", "a//b", "..", "../etc", "a/../b", "a/./b", "a___b", "a.-b", "-a", "a-", "a%2fb",
            "a b", "a\nb", "a\\b", "ä",
        ] {
            assert!(bad.parse::<RepoName>().is_err(), "{bad:?} must be refused");
        }
        assert!("a".repeat(256).parse::<RepoName>().is_err());
        assert!("a".repeat(255).parse::<RepoName>().is_ok());
    }

    #[test]
    fn should_validate_tags() {
        assert!("v1.33.1".parse::<Tag>().is_ok());
        assert!("_x".parse::<Tag>().is_ok());
        assert!("latest".parse::<Tag>().is_ok());
        for bad in ["", ".x", "-x", "a/b", "a:b", "..", &"a".repeat(129)] {
            assert!(bad.parse::<Tag>().is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn should_add_library_prefix_only_to_single_component() {
        let n: RepoName = "alpine".parse().unwrap();
        assert_eq!(n.with_library_prefix().as_str(), "library/alpine");
        let n: RepoName = "bitnami/redis".parse().unwrap();
        assert_eq!(n.with_library_prefix().as_str(), "bitnami/redis");
    }

    proptest! {
        #[test]
        fn should_never_accept_a_name_that_escapes_a_directory(s in "[a-z0-9./_%-]{1,40}") {
            if let Ok(n) = s.parse::<RepoName>() {
                for c in n.components() {
                    prop_assert!(c != "." && c != ".." && !c.is_empty());
                    prop_assert!(!c.contains('%'));
                }
            }
        }

        #[test]
        fn should_accept_generated_grammar_names(
            parts in proptest::collection::vec("[a-z0-9]{1,5}((\\.|_|__|-{1,3})[a-z0-9]{1,5}){0,3}", 1..5)
        ) {
            let s = parts.join("/");
            prop_assume!(s.len() <= MAX_NAME_LEN);
            prop_assert!(s.parse::<RepoName>().is_ok(), "{}", s);
        }
    }
}
