//! What a fill is asked for: where its bytes come from (a [`Source`], which hands out an
//! [`Opened`] transfer) and how it knows they are right ([`Expect`]). Both the fill registry
//! (`flight`) and the shared bucket's sources (`shared`) build on these; they use neither.

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tender_oci::{Algorithm, Digest};
use tender_store::Store;

use crate::container::Container;
use crate::error::FetchError;

/// A transfer opened by a [`Source`].
pub struct Opened {
    /// The upstream honoured our `Range: bytes=<offset>-` (206 from that offset).
    pub partial: bool,
    /// The whole object's length, when the upstream says it.
    pub total: Option<u64>,
    pub body: BoxStream<'static, Result<Bytes, FetchError>>,
    /// Set by a source that proves the object's digest once its body, opened at the first
    /// byte, ended (a shared bucket's signed index): the fill then writes the bytes without
    /// hashing them again (see [`tender_store::Vouch`]).
    pub vouch: Option<tender_store::Vouch>,
}

/// Where a fill gets its bytes: opens the object at an offset (0, or a resume point).
pub trait Source: Send + Sync + 'static {
    fn upstream(&self) -> &str;
    fn open(&self, offset: u64) -> BoxFuture<'static, Result<Opened, FetchError>>;
    /// Largest object this source may deliver (the upstream's `maxObjectSize`).
    fn max_size(&self) -> Option<u64> {
        None
    }
    /// The upstream path fetched, for operators (`/v2/<repo>/blobs/<digest>`, `/image/…`).
    fn path(&self) -> &str {
        ""
    }
}

/// How a fill knows its bytes are right.
#[derive(Debug, Clone)]
pub enum Expect {
    /// A content-addressed object: its digest (sha256 or sha512, the one asked for) must match.
    Digest(Digest),
    /// An asset with no published checksum (Image Factory): complete by its announced
    /// length or its container's own check, then its sha256 is trusted on first use; a later
    /// fetch with other bytes is refused.
    Tofu { key: String, container: Container },
}

impl Expect {
    /// What the fill stores: the digest, or the asset key (GC protects it while the fill runs).
    pub(crate) fn object(&self) -> String {
        match self {
            Expect::Digest(d) => d.to_string(),
            Expect::Tofu { key, .. } => key.clone(),
        }
    }

    /// The algorithm the fill hashes with: the digest's own, sha256 for a trusted asset.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Expect::Digest(d) => d.algorithm(),
            Expect::Tofu { .. } => Algorithm::Sha256,
        }
    }

    /// The stored object this expectation is already met by, if any.
    pub(crate) fn stored(&self, store: &Store) -> Option<Digest> {
        match self {
            Expect::Digest(d) => store.object_len(d).map(|_| *d),
            Expect::Tofu { key, .. } => {
                let t = store.trust_get(key).ok()??;
                store.object_len(&t.digest).map(|_| t.digest)
            }
        }
    }
}
