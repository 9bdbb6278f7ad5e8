//! Bundles into a running tender's mirror: names route the way a client's pull of them
//! would, and the objects go into the mirror's store. The server's import endpoint calls
//! [`import_into`] and never sees the store.

use std::io::Read;

use tender_fetch::Mirror;
use tender_oci::{ImageRef, RepoName};

use crate::import::{import_tar, ImportError, ImportOptions, ImportReport, Router};

/// Names route the way a client's request would: the upstream a pull of the name reaches.
pub struct Routes<'a>(pub &'a Mirror);

impl Router for Routes<'_> {
    fn route(&self, image: &ImageRef) -> Result<(String, RepoName), String> {
        self.0
            .route(Some(&image.registry), &image.repository)
            .map(|(up, repo)| (up.name().to_string(), repo))
            .map_err(|e| e.to_string())
    }

    fn is_private(&self, upstream: &str) -> bool {
        self.0.upstream(upstream).is_some_and(|u| u.settings().needs_identity())
    }

    fn policy(&self) -> Option<std::sync::Arc<tender_verify::Policy>> {
        Some(self.0.policy()).filter(|p| !p.is_empty())
    }
}

/// Verify and register a bundle read from `reader` (a tar) into `mirror`'s store, all or
/// nothing, with the rules of `tender import`. Blocking: call it off the async threads.
pub fn import_into(
    reader: &mut dyn Read,
    mirror: &Mirror,
    options: &ImportOptions,
) -> Result<ImportReport, ImportError> {
    import_tar(reader, mirror.flights().store(), &Routes(mirror), options)
}
