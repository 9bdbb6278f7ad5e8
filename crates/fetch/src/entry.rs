//! The one way to an object. Every manifest, blob and Image Factory asset a client gets is
//! opened here, given the route (upstream and repository, from [`Mirror::route`]), the viewer,
//! the client's `Accept` and whether it wants the bytes or only the head. This is the one place
//! that decides, in this order:
//!
//! 1. whether the viewer may see anything of the route's upstream (an upstream with
//!    credentials or marked `private` serves authenticated clients only);
//! 2. provenance: a stored object (here or in the shared bucket) goes to a client of an
//!    upstream only when it is known to exist in that upstream;
//! 3. the representation: which manifest the client's `Accept` allows;
//! 4. size limits: `maxObjectSize` for blobs and assets (a `HEAD` and a `GET` agree), the
//!    manifest limit for manifests;
//! 5. the source: memory or a store file, a fill in progress, the shared bucket, the upstream;
//!    and the cache status that says which (`revalidated` whenever the upstream was asked).
//!
//! The server translates HTTP into an [`Ask`] and an [`Opened`] back into HTTP; it never reaches
//! the store, the bucket or an upstream client itself.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use tender_oci::media::AcceptList;
use tender_oci::{Digest, Reference, RepoName};
pub use tender_store::Stored;

use crate::client::Upstream;
use crate::container::Container;
use crate::error::{FetchError, FetchErrorKind};
use crate::flight::{Claim, Expect, Fill, Flights};
use crate::mirror::{CacheResult, Listing, ListingKind, Mirror, ObjectKind, Provenance};
use crate::route::not_in;
pub use crate::route::Routed;
use crate::shared::SharedObject;
use crate::source::Fallback;

/// Who asks: what the access rules need to know about the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Viewer {
    /// The client presented a valid identity (a user, a token, a client certificate).
    pub authenticated: bool,
}

/// An object of a repository.
#[derive(Debug, Clone)]
pub enum Object {
    Manifest(Reference),
    Blob(Digest),
}

/// A request for an object through a route.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub viewer: Viewer,
    /// The client's `Accept` (manifests).
    pub accept: &'a AcceptList,
    /// Headers only: no fill is started for an object not held; its size comes from the
    /// upstream's own `HEAD`.
    pub head: bool,
    /// A prefetch: the fill it starts goes on when the client leaves.
    pub keep: bool,
}

/// An Image Factory asset: its `/image/...` path (already validated), its fill and trust key,
/// and the container its bytes must form.
#[derive(Debug, Clone)]
pub struct AssetAsk {
    pub path: String,
    pub key: String,
    pub container: Container,
    pub head: bool,
}

/// What is known of an object before its first byte.
#[derive(Debug, Clone)]
pub struct Head {
    /// Its digest (absent while an asset fills and has not verified yet).
    pub digest: Option<Digest>,
    /// A manifest's media type.
    pub media_type: Option<String>,
    /// Its size, when known before the body (a fill's size comes with its first answer).
    pub size: Option<u64>,
    pub cache: CacheResult,
    /// With `CacheResult::Stale`: the age of the tag's last confirmation, in seconds.
    pub stale_age: Option<u64>,
    /// From an upstream whose content goes to authenticated clients only.
    pub private: bool,
    /// An asset: when it was first seen (trusted) here, seconds since the epoch.
    pub first_seen: Option<u64>,
    /// The name the client asked by is confirmed to hold the object (a tag, or a blob the
    /// upstream confirmed in this repository): the served statistics may count it by name.
    pub name_confirmed: bool,
    /// A range of a fill may go out before the object verified (`rangeBeforeVerify`).
    pub range_before_verify: bool,
}

impl Head {
    /// The head of an object through `up` (`None`: an asset with no factory configured, of
    /// which only what is stored can be served).
    fn new(up: Option<&Upstream>) -> Head {
        Head {
            digest: None,
            media_type: None,
            size: None,
            cache: CacheResult::Hit,
            stale_age: None,
            private: up.is_some_and(|u| u.settings().needs_identity()),
            first_seen: None,
            name_confirmed: false,
            range_before_verify: up.is_some_and(|u| u.settings().range_before_verify),
        }
    }
}

/// Where an object's bytes come from.
pub enum Body {
    /// A manifest, verified, in memory.
    Bytes(Bytes),
    /// A committed object: in memory (small) or its file.
    Stored(Stored),
    /// A fill in progress: bytes as they arrive, the last only once the content verified.
    Filling(Arc<Fill>),
    /// Held by the shared bucket, not here: ranges straight from it; a whole body through
    /// [`SharedBody::whole`].
    Shared(Box<SharedBody>),
    /// A `HEAD` of an object not held: no body.
    Empty,
}

/// An object, opened: its head and where its bytes come from.
pub struct Opened {
    pub head: Head,
    pub body: Body,
}

type ClaimFn = Arc<dyn Fn() -> Result<Claim, FetchError> + Send + Sync>;

/// An object this replica does not hold but the shared bucket does.
pub struct SharedBody {
    flights: Arc<Flights>,
    found: SharedObject,
    /// The claim a miss would make: a fill (from the bucket or the upstream) or the local copy.
    claim: ClaimFn,
    /// The head a whole body gets: a fill's (an asset's digest is unknown until it verified).
    whole_head: Head,
    keep: bool,
}

impl SharedBody {
    pub fn size(&self) -> u64 {
        self.found.index.size
    }

    /// Bytes `start..end`, each chunk verified before a byte of it goes out; should the bucket
    /// fail, the rest comes from the local copy or the upstream at the same byte.
    pub fn range(&self, start: u64, end: u64) -> BoxStream<'static, io::Result<Bytes>> {
        let claim = self.claim.clone();
        let fallback = Fallback { store: self.flights.store().clone(), claim: Box::new(move || claim()) };
        self.flights.shared_range(&self.found, start, end, fallback)
    }

    /// The whole object: filled into the local store (from the bucket, or the upstream should
    /// the bucket fail), streamed as it arrives.
    pub fn whole(self) -> Result<Opened, FetchError> {
        let SharedBody { flights, claim, whole_head, keep, .. } = self;
        opened_claim(&flights, claim()?, whole_head, keep, None)
    }
}

/// An opened claim: the stored object (a hit), or the fill (its miss, or a hit once verified).
fn opened_claim(
    flights: &Flights,
    claim: Claim,
    mut head: Head,
    keep: bool,
    stored_cache: Option<CacheResult>,
) -> Result<Opened, FetchError> {
    match claim {
        Claim::Stored(digest) => {
            let object = flights
                .store()
                .open_stored(&digest)
                .map_err(|e| FetchError::store("store", &e))?
                .ok_or_else(|| FetchError::new(FetchErrorKind::Local, "store", format!("{digest} vanished")))?;
            head.digest = Some(digest);
            head.size = Some(object.len());
            head.cache = stored_cache.unwrap_or(CacheResult::Hit);
            Ok(Opened { head, body: Body::Stored(object) })
        }
        Claim::Filling(fill) => {
            if keep {
                fill.keep();
            }
            // A fill whose content already verified (its commit is under way) holds every byte:
            // for this request it is as good as stored. The request that started the fill is its
            // miss, however fast a small fill verified.
            let hit = !fill.take_start() && fill.is_verified();
            head.cache = if hit { CacheResult::Hit } else { CacheResult::Miss };
            Ok(Opened { head, body: Body::Filling(fill) })
        }
    }
}

/// `size` is within `up`'s `maxObjectSize`.
pub(crate) fn within_limit(up: &Upstream, size: Option<u64>) -> Result<(), FetchError> {
    match (size, up.settings().max_object_size) {
        (Some(n), Some(max)) if n > max => Err(too_large(up.name(), n, max)),
        _ => Ok(()),
    }
}

/// The refusal of an object over an upstream's `maxObjectSize`.
pub(crate) fn too_large(upstream: &str, size: u64, max: u64) -> FetchError {
    FetchError::new(
        FetchErrorKind::TooLarge,
        upstream,
        format!("object of {size} bytes or more is over this upstream's maxObjectSize of {max} bytes"),
    )
}

impl Mirror {
    /// Open `object` of `route` for `ask`: the one way to a manifest or a blob.
    pub async fn open(self: &Arc<Self>, route: &Routed, object: &Object, ask: Ask<'_>) -> Result<Opened, FetchError> {
        self.admit(route, ask.viewer)?;
        match object {
            Object::Manifest(reference) => self.open_manifest(route, reference, ask.accept).await,
            Object::Blob(digest) => self.open_blob(route, *digest, ask).await,
        }
    }

    /// Whether `viewer` may see anything of `route`'s upstream: its content goes to
    /// authenticated clients only when it has credentials or is `private` (and not `public`).
    pub fn admit(&self, route: &Routed, viewer: Viewer) -> Result<(), FetchError> {
        if route.needs_identity() && !viewer.authenticated {
            return Err(FetchError::new(
                FetchErrorKind::Unauthenticated,
                route.upstream(),
                format!("{} is served to authenticated clients only", route.upstream()),
            ));
        }
        Ok(())
    }

    async fn open_manifest(
        self: &Arc<Self>,
        route: &Routed,
        reference: &Reference,
        accept: &AcceptList,
    ) -> Result<Opened, FetchError> {
        let hit = self.manifest(&route.up, &route.repo, reference, accept).await?;
        let mut head = Head::new(Some(&route.up));
        head.digest = Some(hit.digest);
        head.media_type = Some(hit.media_type);
        head.size = Some(hit.bytes.len() as u64);
        head.cache = hit.cache;
        head.stale_age = hit.stale_age;
        head.name_confirmed = matches!(reference, Reference::Tag(_));
        Ok(Opened { head, body: Body::Bytes(hit.bytes) })
    }

    async fn open_blob(self: &Arc<Self>, route: &Routed, digest: Digest, ask: Ask<'_>) -> Result<Opened, FetchError> {
        let (up, repo) = (&route.up, &route.repo);
        let store = self.flights().store();
        let mut head = Head::new(Some(up));
        head.digest = Some(digest);
        let here = store.open_stored(&digest).map_err(|e| FetchError::store(up.name(), &e))?;
        // Not known in `up` yet: the provenance check asks the upstream, in this repository.
        head.name_confirmed = !store.is_known_in(&digest, up.name()).unwrap_or(true);
        let shared = if here.is_some() { None } else { self.flights().shared_lookup(&Expect::Digest(digest)).await };
        // Stored here or in the bucket (perhaps for another upstream): nothing of it, not even a
        // 304, goes to a client of `up` unless the blob is known to exist in `up`.
        let mut asked = false;
        if here.is_some() || shared.is_some() {
            match self.provenance(up, repo, &digest, ObjectKind::Blob).await? {
                Provenance::Recorded => {}
                Provenance::Confirmed => asked = true,
                Provenance::Absent => return Err(not_in(up, repo, &digest)),
            }
        }
        if let Some(object) = here {
            within_limit(up, Some(object.len()))?;
            head.size = Some(object.len());
            head.cache = if asked { CacheResult::Revalidated } else { CacheResult::Hit };
            return Ok(Opened { head, body: Body::Stored(object) });
        }
        let claim: ClaimFn = {
            let (me, up, repo) = (self.clone(), up.clone(), repo.clone());
            Arc::new(move || me.blob(&up, &repo, &digest))
        };
        if let Some(found) = shared {
            within_limit(up, Some(found.index.size))?;
            let mut whole_head = head.clone();
            whole_head.cache = CacheResult::Miss;
            head.size = Some(found.index.size);
            head.cache = CacheResult::Shared;
            let body = SharedBody { flights: self.flights().clone(), found, claim, whole_head, keep: ask.keep };
            return Ok(Opened { head, body: Body::Shared(Box::new(body)) });
        }
        if ask.head {
            head.cache = CacheResult::Pass;
            head.size = self.blob_size(up, repo, &digest).await?;
            within_limit(up, head.size)?;
            return Ok(Opened { head, body: Body::Empty });
        }
        let claim = claim()?;
        let mut stored_cache = None;
        if let Claim::Stored(_) = &claim {
            // Committed since the look above, by this upstream's fill or another's.
            stored_cache = Some(match self.provenance(up, repo, &digest, ObjectKind::Blob).await? {
                Provenance::Recorded => CacheResult::Hit,
                Provenance::Confirmed => CacheResult::Revalidated,
                Provenance::Absent => return Err(not_in(up, repo, &digest)),
            });
        }
        let opened = opened_claim(self.flights(), claim, head, ask.keep, stored_cache)?;
        within_limit(up, opened.head.size)?;
        Ok(opened)
    }

    /// Open an Image Factory asset: the one way to an OS image. Trusted on first use: a stored
    /// asset is served by its trust record, with no question to the factory.
    pub async fn open_asset(self: &Arc<Self>, ask: &AssetAsk) -> Result<Opened, FetchError> {
        let factory = self.image_factory().cloned();
        let base = || {
            let mut head = Head::new(factory.as_deref());
            head.cache = CacheResult::Hit;
            head
        };
        if let Some(opened) = self.stored_asset(&ask.key, base())? {
            return Ok(opened);
        }
        let claim: ClaimFn = {
            let (me, path, key, container) = (self.clone(), ask.path.clone(), ask.key.clone(), ask.container);
            Arc::new(move || me.asset(&path, &key, container))
        };
        let expect = Expect::Tofu { key: ask.key.clone(), container: ask.container };
        if let Some(found) = self.flights().shared_lookup(&expect).await {
            if let Some(f) = &factory {
                within_limit(f, Some(found.index.size))?;
            }
            let mut whole_head = base();
            whole_head.cache = CacheResult::Miss;
            let mut head = base();
            head.digest = Some(found.digest);
            head.first_seen = found.trust.as_ref().map(|t| t.first_seen);
            head.size = Some(found.index.size);
            head.cache = CacheResult::Shared;
            let body = SharedBody { flights: self.flights().clone(), found, claim, whole_head, keep: false };
            return Ok(Opened { head, body: Body::Shared(Box::new(body)) });
        }
        if ask.head {
            // Clients of a fill get their last byte once the content verified, before the commit
            // (fsync, rename, trust record) ends: a HEAD right after such a GET waits for that
            // commit and answers as a hit, with validators, rather than asking the factory.
            if let Some(fill) = self.flights().filling(&ask.key).filter(|f| f.is_verified()) {
                if fill.committed().await.is_some() {
                    if let Some(opened) = self.stored_asset(&ask.key, base())? {
                        return Ok(opened);
                    }
                }
            }
            let mut head = base();
            head.cache = CacheResult::Pass;
            head.size = self.asset_size(&ask.path).await?;
            if let Some(f) = &factory {
                within_limit(f, head.size)?;
            }
            return Ok(Opened { head, body: Body::Empty });
        }
        let claim = claim()?;
        let stored = matches!(claim, Claim::Stored(_));
        let mut opened = opened_claim(self.flights(), claim, base(), false, None)?;
        if stored {
            opened.head.first_seen = self.trusted_since(&ask.key)?;
        }
        if let Some(f) = &factory {
            within_limit(f, opened.head.size)?;
        }
        Ok(opened)
    }

    /// A trusted asset that is stored: a hit.
    fn stored_asset(&self, key: &str, mut head: Head) -> Result<Option<Opened>, FetchError> {
        let store = self.flights().store();
        let local = |e: tender_store::StoreError| FetchError::store("image-factory", &e);
        let Some(t) = store.trust_get(key).map_err(local)? else { return Ok(None) };
        let Some(object) = store.open_stored(&t.digest).map_err(local)? else { return Ok(None) };
        if let Some(f) = self.image_factory() {
            within_limit(f, Some(object.len()))?;
        }
        head.digest = Some(t.digest);
        head.first_seen = Some(t.first_seen);
        head.size = Some(object.len());
        Ok(Some(Opened { head, body: Body::Stored(object) }))
    }

    fn trusted_since(&self, key: &str) -> Result<Option<u64>, FetchError> {
        let t = self.flights().store().trust_get(key).map_err(|e| FetchError::store("image-factory", &e))?;
        Ok(t.map(|t| t.first_seen))
    }

    /// A listing (tag list, referrers) of `route`, for `viewer`: the same admission as an
    /// object's, then [`Mirror::listing`].
    pub async fn list(
        &self,
        route: &Routed,
        viewer: Viewer,
        kind: &ListingKind,
        query: &[(String, String)],
        client_name: &RepoName,
        ns: Option<&str>,
    ) -> Result<Listing, FetchError> {
        self.admit(route, viewer)?;
        self.listing(&route.up, &route.repo, kind, query, client_name, ns).await
    }

    /// Pin `digest` against eviction for `reason` (a prefetch that asked for it).
    pub fn pin(&self, digest: &Digest, reason: &str) -> Result<(), FetchError> {
        self.flights().store().pin(digest, reason).map_err(|e| FetchError::store("store", &e))
    }

    /// `prefetch --pin` of a tag: the tag holds what it was pinned with until `tag rm`.
    pub fn pin_tag(&self, upstream: &str, repository: &str, tag: &str, digest: &Digest) -> Result<(), FetchError> {
        self.flights().store().pin_tag(upstream, repository, tag, digest).map_err(|e| FetchError::store("store", &e))
    }

    /// Note for the shared bucket's size cap (`tender gc --bucket`) that this replica served
    /// `digest` (a map insert; the records are flushed in batches). No bucket: nothing to do.
    pub fn note_served(&self, digest: &Digest) {
        if let Some(bucket) = self.flights().shared() {
            bucket.note_served(digest);
        }
    }
}
