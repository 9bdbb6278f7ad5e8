//! A request's route: the configured upstream and the repository a client's name reaches
//! (`Mirror::routed`), as the one way to an object takes it.

use std::sync::Arc;

use tender_oci::{Digest, RepoName};

use crate::client::Upstream;
use crate::error::{FetchError, FetchErrorKind};

/// The upstream and repository a client's name routes to (`Mirror::routed`). Only the
/// names are visible outside `fetch`.
#[derive(Clone)]
pub struct Routed {
    pub(crate) up: Arc<Upstream>,
    pub(crate) repo: RepoName,
}

impl Routed {
    /// The upstream's configured name (`ghcr.io`).
    pub fn upstream(&self) -> &str {
        self.up.name()
    }

    /// The repository as the upstream knows it (`library/alpine` on Docker Hub).
    pub fn repository(&self) -> &RepoName {
        &self.repo
    }

    /// Whether what this upstream serves goes to authenticated clients only.
    pub fn needs_identity(&self) -> bool {
        self.up.settings().needs_identity()
    }
}

impl std::fmt::Debug for Routed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.up.name(), self.repo)
    }
}

/// The upstream's own answer to a digest it does not hold.
pub(crate) fn not_in(up: &Upstream, repo: &RepoName, d: &Digest) -> FetchError {
    FetchError::new(FetchErrorKind::NotFound, up.name(), format!("{repo}@{d} is unknown to {}", up.name()))
        .with_status(404)
}
