//! Registry semantics on top of the upstream clients and fills: choosing the upstream
//! (closed-world), tags with a TTL and stale-if-error, manifests verified by digest, blobs
//! through single-flight fills, and the passed-through listings.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::stream::StreamExt;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, LINK, RANGE};
use reqwest::Method;
use tender_oci::media::{self, AcceptList};
use tender_oci::{Algorithm, Digest, Reference, RepoName};
use tender_store::{ListingRecord, ManifestMeta, TagRecord};

use crate::client::Upstream;
use crate::error::{FetchError, FetchErrorKind};
use crate::flight::{Claim, Expect, Flights, Opened, Source};
use crate::records::{Record, WriteErrors};
use crate::route::{not_in, Routed};
use crate::settings::{FetchSettings, StaleLimit};

/// Largest manifest accepted from an upstream, unless `limits.maxManifestSize` says otherwise.
pub use crate::settings::DEFAULT_MAX_MANIFEST_BYTES as MAX_MANIFEST_BYTES;

/// How a request was answered, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheResult {
    Hit,
    /// Served from the store after the upstream confirmed the tag.
    Revalidated,
    Miss,
    /// Served from the store because the upstream is down.
    Stale,
    /// Not cached: passed through.
    Pass,
    /// Served from the bucket shared with other replicas (a HEAD or a range).
    Shared,
}

impl CacheResult {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheResult::Hit => "hit",
            CacheResult::Revalidated => "revalidated",
            CacheResult::Miss => "miss",
            CacheResult::Stale => "stale",
            CacheResult::Pass => "pass",
            CacheResult::Shared => "shared",
        }
    }
}

/// A manifest ready to serve.
#[derive(Debug, Clone)]
pub struct ManifestHit {
    pub digest: Digest,
    pub media_type: String,
    pub bytes: Bytes,
    pub cache: CacheResult,
    /// With `CacheResult::Stale`: the age of the tag's last confirmation, in seconds.
    pub stale_age: Option<u64>,
}

/// Largest tag list or referrers page accepted from an upstream.
pub const MAX_LISTING_BYTES: usize = 8 * 1024 * 1024;

/// A passed-through listing (tags, referrers), ready for the client that asked.
#[derive(Debug, Clone)]
pub struct Listing {
    pub content_type: String,
    /// The upstream's next page as tender's own relative path, `rel="next"`.
    pub link: Option<String>,
    /// The upstream's `OCI-Filters-Applied` (referrers: the filters it applied).
    pub filters_applied: Option<String>,
    pub body: Bytes,
    /// `Pass`, or `Stale` for the last good copy while the upstream is down.
    pub cache: CacheResult,
    /// With `CacheResult::Stale`: the age of the copy, in seconds.
    pub stale_age: Option<u64>,
}

/// Which listing a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListingKind {
    Tags,
    Referrers(Digest),
}

impl ListingKind {
    /// The path after `/v2/<name>/`.
    fn path(&self) -> String {
        match self {
            ListingKind::Tags => "tags/list".to_string(),
            ListingKind::Referrers(d) => format!("referrers/{d}"),
        }
    }
}

/// Why a request names no configured upstream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteRefusal {
    #[error("{0:?} is not a configured upstream")]
    UnknownNamespace(String),
    #[error("no upstream configured for {0:?} and no default upstream")]
    NoDefault(String),
    #[error("{0:?} names a registry that is not a configured upstream")]
    UnknownRegistry(String),
}

/// How an object is known to exist in an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provenance {
    /// Recorded here or in the shared bucket: nobody was asked.
    Recorded,
    /// The upstream confirmed it just now (and it is recorded from now on).
    Confirmed,
    /// The upstream does not have it.
    Absent,
}

/// What a digest names, for the HEAD that asks an upstream whether it holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    Blob,
    Manifest,
}

type ManifestFlight = Shared<BoxFuture<'static, Result<ManifestHit, FetchError>>>;

/// The pull-through mirror over all configured upstreams.
pub struct Mirror {
    upstreams: HashMap<String, Arc<Upstream>>,
    image_factory: Option<Arc<Upstream>>,
    default_upstream: Option<String>,
    flights: Arc<Flights>,
    settings: FetchSettings,
    manifest_flights: Mutex<HashMap<String, ManifestFlight>>,
    /// Manifests refused for their size, remembered for a tag's TTL.
    refusals: Refusals,
    /// Record writes that failed on a request's path (the request was answered anyway).
    write_errors: WriteErrors,
    /// The signature policy and this process's verdicts.
    pub(crate) verification: crate::verdicts::Verification,
}

impl Mirror {
    pub fn new(
        upstreams: Vec<Arc<Upstream>>,
        default_upstream: Option<String>,
        flights: Arc<Flights>,
        settings: FetchSettings,
    ) -> Arc<Mirror> {
        Mirror::build(upstreams, default_upstream, None, flights, settings)
    }

    fn build(
        upstreams: Vec<Arc<Upstream>>,
        default_upstream: Option<String>,
        image_factory: Option<Arc<Upstream>>,
        flights: Arc<Flights>,
        settings: FetchSettings,
    ) -> Arc<Mirror> {
        let upstreams = upstreams.into_iter().map(|u| (u.name().to_ascii_lowercase(), u)).collect();
        let write_errors = WriteErrors::new(flights.metrics().store_write_errors.clone());
        Arc::new(Mirror {
            write_errors,
            upstreams,
            image_factory,
            default_upstream,
            flights,
            settings,
            manifest_flights: Mutex::new(HashMap::new()),
            refusals: Refusals::default(),
            verification: crate::verdicts::Verification::default(),
        })
    }

    pub fn flights(&self) -> &Arc<Flights> {
        &self.flights
    }

    pub fn upstream_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.upstreams.values().map(|u| u.name().to_string()).collect();
        v.sort();
        v
    }

    pub fn upstream(&self, name: &str) -> Option<&Arc<Upstream>> {
        self.upstreams.get(&name.to_ascii_lowercase())
    }

    /// Ask the upstream (or the Image Factory) named `name` now and return its new health;
    /// `None` for a name that is not configured.
    pub async fn probe(&self, name: &str) -> Option<crate::health::Health> {
        if let Some(up) = self.upstream(name) {
            return Some(up.probe("/v2/").await);
        }
        match &self.image_factory {
            Some(f) if f.name().eq_ignore_ascii_case(name) => Some(f.probe("/").await),
            _ => None,
        }
    }

    /// [`Mirror::route`], as the route the one way to an object ([`Mirror::open`]) takes.
    pub fn routed(&self, ns: Option<&str>, name: &RepoName) -> Result<Routed, RouteRefusal> {
        self.route(ns, name).map(|(up, repo)| Routed { up, repo })
    }

    /// Choose the upstream for a request: a path prefix naming a configured upstream, else
    /// `ns`, else the default. Returns the upstream and the name to ask it for. The prefix wins
    /// over `ns` because containerd with a path-routed mirror (`override_path`) sends both, and
    /// the prefix is the one the operator wrote; `ns` is what containerd adds for the registry.
    pub fn route(&self, ns: Option<&str>, name: &RepoName) -> Result<(Arc<Upstream>, RepoName), RouteRefusal> {
        let finish = |up: &Arc<Upstream>, n: RepoName| {
            let n = if up.settings().library_prefix { n.with_library_prefix() } else { n };
            (up.clone(), n)
        };
        if let Some((first, rest)) = name.strip_first() {
            if let Some(up) = self.upstream(first) {
                return Ok(finish(up, rest));
            }
        }
        if let Some(ns) = ns {
            return match self.upstream(ns) {
                Some(up) => Ok(finish(up, name.clone())),
                None => Err(RouteRefusal::UnknownNamespace(ns.to_string())),
            };
        }
        if let Some((first, rest)) = name.strip_first() {
            if let Some(up) = self.upstream(first) {
                return Ok(finish(up, rest));
            }
            // Docker Hub names never have a host-like first component: such a name is meant
            // for a registry that is not configured, and is never asked of docker.io.
            let hub_default = self.default_upstream.as_deref().is_some_and(|d| d.eq_ignore_ascii_case("docker.io"));
            if hub_default && (first.contains('.') || first.contains(':') || first == "localhost") {
                return Err(RouteRefusal::UnknownRegistry(first.to_string()));
            }
        }
        match self.default_upstream.as_deref().and_then(|d| self.upstream(d)) {
            Some(up) => Ok(finish(up, name.clone())),
            None => Err(RouteRefusal::NoDefault(name.to_string())),
        }
    }

    /// A manifest by tag or digest, for a client that accepts `accept`. A tag is always
    /// resolved to its true target (the upstream is asked with every image manifest type, and
    /// with the client's own further types, so artifacts of custom types reach it); the client
    /// gets the manifest only when its `Accept` lists the manifest's type (or is open), as
    /// distribution answers: 404 `MANIFEST_UNKNOWN` otherwise. The one exception is
    /// distribution's too: a Docker manifest list asked for by tag by a client that cannot take
    /// it gets the entry distribution would give it (linux/amd64, else the first), chosen from
    /// the stored list, so one client's Accept never changes what the tag means for the others,
    /// and the choice works with the upstream down.
    pub async fn manifest(
        self: &Arc<Self>,
        up: &Arc<Upstream>,
        repo: &RepoName,
        reference: &Reference,
        accept: &AcceptList,
    ) -> Result<ManifestHit, FetchError> {
        let extra = extra_types(accept);
        // A denying rule answers before anything is asked; a verifying one before anything
        // is served (a stored manifest without a verdict under the rule in force verifies now).
        let rule = self.rule_for(up, repo, reference)?;
        let hit = self.resolve(up, repo, reference, &extra, false).await?;
        if let Some(rule) = &rule {
            self.vet(up, repo, rule, &hit.digest, &hit.media_type, &hit.bytes).await?;
        }
        if accept.accepts(&hit.media_type) {
            return Ok(hit);
        }
        let list_by_tag =
            matches!(reference, Reference::Tag(_)) && hit.media_type.eq_ignore_ascii_case(media::DOCKER_LIST);
        if !list_by_tag {
            return Err(not_acceptable(up, repo, reference, &hit.media_type));
        }
        let Some(entry) = media::default_platform(&hit.bytes) else {
            return Err(FetchError::new(
                FetchErrorKind::NotFound,
                up.name(),
                format!(
                    "{repo}:{reference} is an index ({}) with no manifest for a client that does not accept it",
                    hit.media_type
                ),
            )
            .with_status(404));
        };
        let mut chosen = self.resolve(up, repo, &Reference::Digest(entry), &extra, false).await?;
        if let Some(rule) = &rule {
            self.vet(up, repo, rule, &chosen.digest, &chosen.media_type, &chosen.bytes).await?;
        }
        if !accept.accepts(&chosen.media_type) {
            return Err(not_acceptable(up, repo, reference, &chosen.media_type));
        }
        if hit.cache == CacheResult::Stale {
            chosen.cache = CacheResult::Stale;
            chosen.stale_age = hit.stale_age;
        }
        Ok(chosen)
    }

    /// A manifest by tag (its true target) or digest, whatever its media type. `material`:
    /// fetched as signature material (a referrer holding a Sigstore bundle), which the
    /// signature policy does not gate: it is verified by what it says.
    pub(crate) async fn resolve(
        self: &Arc<Self>,
        up: &Arc<Upstream>,
        repo: &RepoName,
        reference: &Reference,
        extra: &[String],
        material: bool,
    ) -> Result<ManifestHit, FetchError> {
        let store = self.flights.store();
        match reference {
            Reference::Digest(d) => {
                if let Some(mut hit) = self.stored_manifest(d, CacheResult::Hit)? {
                    // Stored, perhaps for another upstream: served only if known in this one.
                    match self.provenance(up, repo, d, ObjectKind::Manifest).await? {
                        Provenance::Recorded => return Ok(hit),
                        Provenance::Confirmed => {
                            hit.cache = CacheResult::Revalidated;
                            return Ok(hit);
                        }
                        Provenance::Absent => return Err(not_in(up, repo, d)),
                    }
                }
            }
            Reference::Tag(t) => {
                let record = store.tag_get(up.name(), repo.as_str(), t.as_str()).map_err(|e| local(up, e))?;
                if let Some(r) = &record {
                    // An imported tag is authoritative: never asked of the upstream.
                    if r.imported || r.age_secs() < self.settings.tag_ttl.as_secs() {
                        if let Some(hit) = self.stored_known_manifest(up, &r.digest, CacheResult::Hit)? {
                            return Ok(hit);
                        }
                    }
                }
            }
        }
        let key = format!("{}\0{}\0{}", up.name(), repo, reference);
        if let Some(e) = self.refusals.get(&key) {
            return Err(e);
        }
        // Clients asking with different further types ask the upstream differently.
        let key = if extra.is_empty() { key } else { format!("{key}\0{}", extra.join(",")) };
        let key = if material { format!("{key}\0material") } else { key };
        let flight = {
            let mut flights = self
                .manifest_flights
                .lock()
                .map_err(|_| FetchError::new(FetchErrorKind::Local, up.name(), "manifest flights poisoned"))?;
            flights
                .entry(key.clone())
                .or_insert_with(|| {
                    let (me, up, repo, reference) = (self.clone(), up.clone(), repo.clone(), reference.clone());
                    let extra = extra.to_vec();
                    async move {
                        // A fetch that panics is an error for its waiters, never a flight that
                        // panics again for everyone who joins it later.
                        let name = up.name().to_string();
                        std::panic::AssertUnwindSafe(me.fetch_manifest(&up, &repo, &reference, &extra, material))
                            .catch_unwind()
                            .await
                            .unwrap_or_else(|_| {
                                tracing::error!(upstream = %name, "manifest fetch panicked");
                                Err(FetchError::new(FetchErrorKind::Local, &name, "manifest fetch failed unexpectedly"))
                            })
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        // The flight leaves the map when this waiter is done or dropped (a client that went away).
        let _leave = LeaveFlight { mirror: self, key: &key };
        let result = flight.await;
        if let Err(e) = &result {
            if e.kind == FetchErrorKind::TooLarge {
                // Refused for its size: not fetched again on every request, for a tag's TTL.
                let key = format!("{}\0{}\0{}", up.name(), repo, reference);
                self.refusals.put(key, e.clone(), self.settings.tag_ttl);
            }
        }
        result
    }

    /// Whether a client of `up` may have the stored object `digest`: it is known to exist in
    /// `up` (recorded here or, with a shared bucket, by any replica), or `up` confirms it now
    /// with a HEAD by digest in `repo` (then recorded). `Ok(false)`: `up` does not have it (404).
    /// Any other failure is an error: an object not known in `up` is never served on a guess.
    pub async fn known_in(
        &self,
        up: &Arc<Upstream>,
        repo: &RepoName,
        digest: &Digest,
        kind: ObjectKind,
    ) -> Result<bool, FetchError> {
        Ok(self.provenance(up, repo, digest, kind).await? != Provenance::Absent)
    }

    /// [`Mirror::known_in`], saying how it is known: recorded, or confirmed by `up` just now.
    pub(crate) async fn provenance(
        &self,
        up: &Arc<Upstream>,
        repo: &RepoName,
        digest: &Digest,
        kind: ObjectKind,
    ) -> Result<Provenance, FetchError> {
        let store = self.flights.store();
        if store.is_known_in(digest, up.name()).map_err(|e| local(up, e))? {
            return Ok(Provenance::Recorded);
        }
        if let Some(bucket) = self.flights.shared() {
            match bucket.is_known(digest, up.name()).await {
                Ok(true) => {
                    self.write_errors.keep_going(Record::Known, store.record_known(digest, up.name()));
                    return Ok(Provenance::Recorded);
                }
                Ok(false) => {}
                // The breaker is open: said once when it opened, not again per request.
                Err(e) if e.is_down() => {
                    tracing::debug!(%digest, error = %e, "shared bucket down; asking the upstream")
                }
                Err(e) => tracing::warn!(%digest, upstream = %up.name(), error = %e,
                    "shared bucket: known-upstream record unreadable; asking the upstream"),
            }
        }
        let (path, mut headers) = match kind {
            ObjectKind::Blob => (format!("/v2/{repo}/blobs/{digest}"), HeaderMap::new()),
            ObjectKind::Manifest => (format!("/v2/{repo}/manifests/{digest}"), HeaderMap::new()),
        };
        if kind == ObjectKind::Manifest {
            if let Ok(v) = HeaderValue::from_str(&media::ALL_MANIFESTS.join(", ")) {
                headers.insert(ACCEPT, v);
            }
        }
        let resp = match up.request(Method::HEAD, &path, headers, Some(&format!("repository:{repo}:pull"))).await {
            Ok(r) => r,
            Err(e) if e.kind == FetchErrorKind::NotFound => return Ok(Provenance::Absent),
            Err(e) => return Err(e),
        };
        // Absent on some CDN-redirected blob HEADs (Docker Hub); when present it must name the
        // digest asked for. A digest of another algorithm says nothing either way (docker-registry
        // names an object asked for by sha512 with its sha256).
        if let Some(v) = resp.headers().get("docker-content-digest") {
            let named = v.to_str().ok().and_then(|v| v.parse::<Digest>().ok());
            if named.is_none_or(|n| n.algorithm() == digest.algorithm() && n != *digest) {
                let e = FetchError::new(
                    FetchErrorKind::Corrupt,
                    up.name(),
                    format!("HEAD {path} answered with Docker-Content-Digest {v:?}; not served through this upstream"),
                );
                up.record_error(&e);
                return Err(e);
            }
        }
        tracing::info!(%digest, upstream = %up.name(), %repo, "stored object confirmed by the upstream; now known there");
        self.remember_known(up, digest)?;
        Ok(Provenance::Confirmed)
    }

    /// Record that `digest` exists in `up`, here and (off the response path) in the bucket.
    fn remember_known(&self, up: &Upstream, digest: &Digest) -> Result<(), FetchError> {
        self.write_errors.keep_going(Record::Known, self.flights.store().record_known(digest, up.name()));
        if let Some(bucket) = self.flights.shared() {
            let (bucket, digest, name) = (bucket.clone(), *digest, up.name().to_string());
            tokio::spawn(async move {
                if let Err(e) = bucket.put_known(&digest, &name).await {
                    tracing::warn!(%digest, upstream = %name, error = %e, "known-upstream record not written to the bucket");
                }
            });
        }
        Ok(())
    }

    /// A stored manifest that is known in `up` (no question to anyone).
    fn stored_known_manifest(
        &self,
        up: &Upstream,
        digest: &Digest,
        cache: CacheResult,
    ) -> Result<Option<ManifestHit>, FetchError> {
        if !self.flights.store().is_known_in(digest, up.name()).map_err(|e| local(up, e))? {
            return Ok(None);
        }
        self.stored_manifest(digest, cache)
    }

    fn stored_manifest(&self, digest: &Digest, cache: CacheResult) -> Result<Option<ManifestHit>, FetchError> {
        let store = self.flights.store();
        let local = |e: tender_store::StoreError| FetchError::store("store", &e);
        let Some(meta) = store.meta_get(digest).map_err(local)? else {
            return Ok(None);
        };
        let Some(bytes) = store.read_small(digest).map_err(local)? else {
            return Ok(None);
        };
        Ok(Some(ManifestHit { digest: *digest, media_type: meta.media_type, bytes, cache, stale_age: None }))
    }

    async fn fetch_manifest(
        self: &Arc<Self>,
        up: &Arc<Upstream>,
        repo: &RepoName,
        reference: &Reference,
        extra: &[String],
        material: bool,
    ) -> Result<ManifestHit, FetchError> {
        let store = self.flights.store();
        let record = match reference {
            Reference::Tag(t) => store.tag_get(up.name(), repo.as_str(), t.as_str()).map_err(|e| local(up, e))?,
            Reference::Digest(_) => None,
        };
        // By digest, another replica may have put it in the shared bucket, or be fetching it
        // now under the fill lease a blob would take (`<upstream>@<digest>`): wait for it.
        let mut lease = None;
        if let (Reference::Digest(d), Some(bucket)) = (reference, self.flights.shared()) {
            match self.manifest_lease(up, d, bucket).await? {
                Ok(hit) => return Ok(hit),
                Err(l) => lease = l,
            }
        }
        let fetched = self.upstream_manifest(up, repo, reference, record, extra, material).await;
        if let Some(bucket) = self.flights.shared() {
            match &fetched {
                // Fetched just now: off the response path, into the bucket; then its known
                // record, then the lease goes (a waiter finds the manifest usable).
                Ok(hit) if hit.cache == CacheResult::Miss => {
                    let (bucket, path, mt) = (bucket.clone(), store.object_path(&hit.digest), hit.media_type.clone());
                    let (digest, name) = (hit.digest, up.name().to_string());
                    tokio::spawn(async move {
                        let key = lease.as_ref().map(tender_bucket::Lease::key);
                        let up = match bucket.upload_leased(&digest, &path, Some(&mt), key).await {
                            Ok(_) if lease.is_some() => bucket.put_known(&digest, &name).await,
                            r => r.map(|_| ()),
                        };
                        if let Err(e) = up {
                            tracing::warn!(%digest, error = %e, "manifest upload to the shared bucket failed");
                        }
                        if let Some(l) = lease {
                            l.release().await;
                        }
                    });
                }
                _ => {
                    if let Some(l) = lease {
                        tokio::spawn(l.release());
                    }
                }
            }
        }
        fetched
    }

    /// The manifest `d` from the shared bucket if it is there (and known in `up`); else, with
    /// leases on, wait while another replica fetches it (bounded by 2 x `leaseTtl`) and take
    /// the lease to fetch it ourselves. `Err(lease)`: ask the upstream, holding `lease` if one
    /// was won. A bucket that is down or fails never blocks: the upstream is asked.
    async fn manifest_lease(
        &self,
        up: &Arc<Upstream>,
        d: &Digest,
        bucket: &Arc<tender_bucket::Bucket>,
    ) -> Result<Result<ManifestHit, Option<tender_bucket::Lease>>, FetchError> {
        let deadline = crate::later(bucket.settings().lease_ttl.saturating_mul(2));
        let key = Flights::blob_key(up.name(), d);
        let mut waited = false;
        loop {
            if let Some(hit) = self.bucket_manifest(up, d, bucket).await? {
                return Ok(Ok(hit));
            }
            if !bucket.lease_enabled() {
                return Ok(Err(None));
            }
            match bucket.lease(&key).await {
                Ok(tender_bucket::LeaseOutcome::Won(lease)) => {
                    // The holder may have finished between our look and our lease.
                    if waited {
                        if let Some(hit) = self.bucket_manifest(up, d, bucket).await? {
                            lease.release().await;
                            return Ok(Ok(hit));
                        }
                    }
                    return Ok(Err(Some(lease)));
                }
                Ok(tender_bucket::LeaseOutcome::Held { owner, retry_in }) => {
                    if !waited {
                        tracing::info!(digest = %d, %owner, "another replica fetches this manifest; waiting for it in the bucket");
                    }
                    waited = true;
                    let pause = retry_in.max(std::time::Duration::from_millis(25));
                    if crate::later(pause) >= deadline {
                        tracing::warn!(digest = %d, %owner, "waited for another replica's manifest fetch too long; asking the upstream");
                        return Ok(Err(None));
                    }
                    tokio::time::sleep(pause).await;
                }
                Err(e) => {
                    if !e.is_down() {
                        tracing::warn!(digest = %d, error = %e, "manifest lease unavailable; asking the upstream");
                    }
                    return Ok(Err(None));
                }
            }
        }
    }

    /// The manifest `d` from the shared bucket, verified, if it is there and known in `up`.
    async fn bucket_manifest(
        &self,
        up: &Arc<Upstream>,
        d: &Digest,
        bucket: &Arc<tender_bucket::Bucket>,
    ) -> Result<Option<ManifestHit>, FetchError> {
        let store = self.flights.store();
        match bucket.is_known(d, up.name()).await {
            Ok(true) => {}
            Ok(false) => return Ok(None),
            Err(e) => {
                if !e.is_down() {
                    tracing::warn!(digest = %d, error = %e, "shared bucket: known-upstream record unreadable");
                }
                return Ok(None);
            }
        }
        match bucket.read_small(d, self.settings.max_manifest_size as u64).await {
            Ok(Some((body, index))) => {
                if let Some(media_type) = index.media_type.clone() {
                    store.put_bytes(&format!("manifest:{d}"), &body, d).map_err(|e| local(up, e))?;
                    store
                        .meta_put(d, &ManifestMeta { media_type: media_type.clone(), size: body.len() as u64 })
                        .map_err(|e| local(up, e))?;
                    store.record_known(d, up.name()).map_err(|e| local(up, e))?;
                    return Ok(Some(ManifestHit {
                        digest: *d,
                        media_type,
                        bytes: body,
                        cache: CacheResult::Shared,
                        stale_age: None,
                    }));
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(digest = %d, error = %e, "manifest from the shared bucket refused; asking the upstream")
            }
        }
        Ok(None)
    }

    /// The manifest from the upstream (a tag revalidated with `HEAD` when we hold its target).
    async fn upstream_manifest(
        self: &Arc<Self>,
        up: &Arc<Upstream>,
        repo: &RepoName,
        reference: &Reference,
        record: Option<TagRecord>,
        extra: &[String],
        material: bool,
    ) -> Result<ManifestHit, FetchError> {
        let store = self.flights.store();
        let path = format!("/v2/{repo}/manifests/{reference}");
        let scope = format!("repository:{repo}:pull");
        // Always every image type: the answer is the tag's true target, never one narrowed to a
        // client's Accept (a narrowed answer would become the tag's record for everyone); then
        // the client's further types, for artifacts an upstream serves only to those who ask.
        let mut headers = HeaderMap::new();
        let types: Vec<&str> = media::ALL_MANIFESTS.iter().copied().chain(extra.iter().map(String::as_str)).collect();
        if let Ok(v) = HeaderValue::from_str(&types.join(", ")) {
            headers.insert(ACCEPT, v);
        }
        // A tag we hold: ask with HEAD (cheap, not rate-limited by Docker Hub) whether it moved.
        if let (Some(r), Reference::Tag(_)) = (&record, reference) {
            if store.object_len(&r.digest).is_some() {
                match up.request(Method::HEAD, &path, headers.clone(), Some(&scope)).await {
                    Ok(resp) => {
                        let same = resp
                            .headers()
                            .get("docker-content-digest")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<Digest>().ok())
                            .is_some_and(|d| d == r.digest);
                        if same {
                            let mut fresh = r.clone();
                            fresh.fetched_at = tender_store_now();
                            self.write_errors.keep_going(Record::Tag, store.tag_put(&fresh));
                            // The upstream just named this digest for the tag: known there.
                            self.remember_known(up, &r.digest)?;
                            if let Some(hit) = self.stored_manifest(&r.digest, CacheResult::Revalidated)? {
                                return Ok(hit);
                            }
                        }
                    }
                    Err(e) => return self.stale_or(up, e, record.as_ref()),
                }
            }
        }
        let resp = match up.request(Method::GET, &path, headers, Some(&scope)).await {
            Ok(r) => r,
            Err(e) => return self.stale_or(up, e, record.as_ref()),
        };
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_string())
            .filter(|v| !v.is_empty() && v != "application/octet-stream" && v != "text/plain");
        let announced = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<Digest>().ok());
        // A body that stalls or never ends is the upstream being down: the last known digest.
        let limit = self.settings.max_manifest_size;
        let body = match up.read_small(resp, limit, "manifest").await {
            Ok(b) => b,
            Err(mut e) if e.kind == FetchErrorKind::TooLarge => {
                e.message = format!("{repo}:{reference}: {} (limits.maxManifestSize)", e.message);
                return Err(e);
            }
            Err(e) => return self.stale_or(up, e, record.as_ref()),
        };
        // By digest, the digest asked for is the one verified (whatever the upstream announces:
        // docker-registry names a manifest asked for by sha512 with its sha256). By tag, the
        // upstream's announced digest, in its algorithm; sha256 when it announces none.
        let expected = match reference {
            Reference::Digest(d) => Some(*d),
            Reference::Tag(_) => announced,
        };
        let digest = expected.map_or(Algorithm::Sha256, |d| d.algorithm()).digest(&body);
        if let Some(want) = expected {
            if want != digest {
                let e = FetchError::new(
                    FetchErrorKind::Corrupt,
                    up.name(),
                    format!("manifest {repo}:{reference} is {digest}, expected {want}"),
                );
                up.record_error(&e);
                return Err(e);
            }
        }
        let media_type = media::verified_media_type(content_type.as_deref(), &body).ok_or_else(|| {
            FetchError::new(
                FetchErrorKind::Corrupt,
                up.name(),
                "manifest is not JSON or declares a media type that is not a manifest's",
            )
        })?;
        // The signature policy, before anything is committed: a manifest that does not verify
        // is neither stored nor recorded for its tag.
        if let Some(rule) = if material { None } else { self.rule_for(up, repo, reference)? } {
            self.vet(up, repo, &rule, &digest, &media_type, &body).await?;
        }
        let key = format!("manifest:{digest}");
        // Verified in memory: answered from these bytes even when the disk cannot keep them.
        let kept = store.put_bytes(&key, &body, &digest).map(|_| ());
        let stored = kept.is_ok();
        self.write_errors.keep_going(Record::Manifest, kept);
        if stored {
            let meta = ManifestMeta { media_type: media_type.clone(), size: body.len() as u64 };
            self.write_errors.keep_going(Record::Meta, store.meta_put(&digest, &meta));
        }
        self.remember_known(up, &digest)?;
        if let (Reference::Tag(t), true) = (reference, stored) {
            let written = store.tag_put(&TagRecord {
                upstream: up.name().to_string(),
                repository: repo.to_string(),
                tag: t.to_string(),
                digest,
                media_type: media_type.clone(),
                size: body.len() as u64,
                fetched_at: tender_store_now(),
                imported: false,
            });
            self.write_errors.keep_going(Record::Tag, written);
        }
        Ok(ManifestHit { digest, media_type, bytes: body, cache: CacheResult::Miss, stale_age: None })
    }

    /// `staleMaxAge` for `up`: its own, else the global one.
    pub fn stale_limit(&self, up: &Upstream) -> StaleLimit {
        up.settings().stale_max_age.unwrap_or(self.settings.stale_max_age)
    }

    /// Serve the last known mapping of a tag when the upstream is unreachable (DNS, connect,
    /// TLS, timeout, 5xx, 429; an upstream that answered wins), within `staleMaxAge` (and only a
    /// manifest known in that upstream). A refusal by the limit says so.
    fn stale_or(&self, up: &Upstream, e: FetchError, record: Option<&TagRecord>) -> Result<ManifestHit, FetchError> {
        let Some(r) = record.filter(|_| e.is_unreachable()) else {
            return Err(e);
        };
        let (age, limit) = (r.age_secs(), self.stale_limit(up));
        // An upstream configured offline is never asked: its last mapping is the answer, at any
        // age, and nothing about it is stale.
        let offline = e.kind == FetchErrorKind::Offline;
        if !offline && !limit.allows(age) {
            let mut e = e;
            e.message = format!(
                "{}; the last known digest of {}:{} is {age}s old, older than staleMaxAge ({limit})",
                e.message, r.repository, r.tag
            );
            return Err(e);
        }
        let known = self.flights.store().is_known_in(&r.digest, &r.upstream).unwrap_or(false);
        if let Some(mut hit) = known.then(|| self.stored_manifest(&r.digest, CacheResult::Stale)).transpose()?.flatten()
        {
            if !offline {
                tracing::warn!(upstream = %e.upstream, repository = %r.repository, tag = %r.tag, age_secs = age,
                    error = %e, "upstream unreachable: serving the last known digest");
                hit.stale_age = Some(age);
                up.record_stale();
            }
            return Ok(hit);
        }
        Err(e)
    }

    /// Join or start the fill of a blob, or find it stored.
    pub fn blob(&self, up: &Arc<Upstream>, repo: &RepoName, digest: &Digest) -> Result<Claim, FetchError> {
        let source = Arc::new(PathSource {
            upstream: up.clone(),
            path: format!("/v2/{repo}/blobs/{digest}"),
            scope: Some(format!("repository:{repo}:pull")),
        });
        self.flights.claim(&Flights::blob_key(up.name(), digest), Expect::Digest(*digest), source)
    }

    /// Size of a blob we do not hold, from the upstream (HEAD).
    pub async fn blob_size(
        &self,
        up: &Arc<Upstream>,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<u64>, FetchError> {
        let path = format!("/v2/{repo}/blobs/{digest}");
        let resp = up.request(Method::HEAD, &path, HeaderMap::new(), Some(&format!("repository:{repo}:pull"))).await?;
        Ok(resp.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()))
    }

    /// Pass a listing (tag list, referrers) through: every query parameter but `ns` goes to the
    /// upstream (`n`, `last`, the opaque ones of its `Link`); its `Link` comes back as tender's
    /// own path for `client_name` (with `ns` when the client used it) and a tag list's `name` is
    /// `client_name`. The last good answer is kept per upstream and request, and served (stale)
    /// while the upstream is down.
    pub async fn listing(
        &self,
        up: &Arc<Upstream>,
        repo: &RepoName,
        kind: &ListingKind,
        query: &[(String, String)],
        client_name: &RepoName,
        ns: Option<&str>,
    ) -> Result<Listing, FetchError> {
        let mut request = format!("/v2/{repo}/{}", kind.path());
        let q = {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            for (k, v) in query.iter().filter(|(k, _)| k != "ns") {
                q.append_pair(k, v);
            }
            q.finish()
        };
        if !q.is_empty() {
            request.push('?');
            request.push_str(&q);
        }
        let store = self.flights.store();
        let scope = format!("repository:{repo}:pull");
        let fetched = async {
            let resp = up.request(Method::GET, &request, HeaderMap::new(), Some(&scope)).await?;
            let header = |n: &str| resp.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
            let (content_type, link, filters_applied) =
                (header(CONTENT_TYPE.as_str()), header(LINK.as_str()), header("oci-filters-applied"));
            if resp.content_length().is_some_and(|l| l > MAX_LISTING_BYTES as u64) {
                return Err(FetchError::new(FetchErrorKind::Corrupt, up.name(), "listing larger than 8 MiB"));
            }
            let body = up.read_small(resp, MAX_LISTING_BYTES, "listing").await?;
            Ok((content_type.unwrap_or_else(|| "application/json".to_string()), link, filters_applied, body))
        }
        .await;
        let mut stale_age = None;
        let (content_type, link, filters_applied, body, cache) = match fetched {
            Ok((content_type, link, filters_applied, body)) => {
                if let Ok(text) = std::str::from_utf8(&body) {
                    let record = ListingRecord {
                        upstream: up.name().to_string(),
                        request: request.clone(),
                        content_type: content_type.clone(),
                        link: link.clone(),
                        filters_applied: filters_applied.clone(),
                        body: text.to_string(),
                        not_found: false,
                        fetched_at: tender_store_now(),
                    };
                    self.write_errors.keep_going(Record::Listing, store.listing_put(&record));
                }
                (content_type, link, filters_applied, body, CacheResult::Pass)
            }
            Err(e) if e.kind == FetchErrorKind::NotFound => {
                let record = ListingRecord {
                    upstream: up.name().to_string(),
                    request: request.clone(),
                    content_type: String::new(),
                    link: None,
                    filters_applied: None,
                    body: String::new(),
                    not_found: true,
                    fetched_at: tender_store_now(),
                };
                self.write_errors.keep_going(Record::Listing, store.listing_put(&record));
                return Err(e);
            }
            Err(e) if e.is_unreachable() => {
                // Tags imported bundles registered answer for an upstream that cannot.
                let imported = match kind {
                    ListingKind::Tags => {
                        crate::imported_tags::imported(store, up.name(), repo.as_str()).map_err(|e| local(up, e))?
                    }
                    ListingKind::Referrers(_) => Vec::new(),
                };
                let from_imports = || {
                    let (body, link) = crate::imported_tags::page(&imported, query, client_name, ns);
                    let cache = CacheResult::Stale;
                    Listing {
                        content_type: "application/json".into(),
                        link,
                        filters_applied: None,
                        body,
                        cache,
                        stale_age: None,
                    }
                };
                let Some(r) = store.listing_get(up.name(), &request).map_err(|e| local(up, e))? else {
                    if !imported.is_empty() {
                        return Ok(from_imports());
                    }
                    return Err(e);
                };
                let (age, limit) = (r.age_secs(), self.stale_limit(up));
                let offline = e.kind == FetchErrorKind::Offline;
                if !imported.is_empty() && (r.not_found || (!offline && !limit.allows(age))) {
                    return Ok(from_imports());
                }
                if !offline && !limit.allows(age) {
                    let mut e = e;
                    e.message =
                        format!("{}; the last good answer is {age}s old, older than staleMaxAge ({limit})", e.message);
                    return Err(e);
                }
                if !offline {
                    tracing::warn!(upstream = %up.name(), %request, age_secs = age, error = %e,
                        "upstream unreachable: serving the last good listing");
                    up.record_stale();
                }
                if r.not_found {
                    return Err(FetchError::new(
                        FetchErrorKind::NotFound,
                        up.name(),
                        format!("{request}: 404 when {} last answered", up.name()),
                    )
                    .with_status(404));
                }
                stale_age = (!offline).then_some(age);
                let body = Bytes::from(r.body);
                let body = if imported.is_empty() { body } else { crate::imported_tags::merge(body, &imported, query) };
                (r.content_type, r.link, r.filters_applied, body, CacheResult::Stale)
            }
            Err(e) => return Err(e),
        };
        let body = match kind {
            ListingKind::Tags => rename_tag_list(body, client_name),
            ListingKind::Referrers(_) => body,
        };
        let link = link.and_then(|l| rewrite_link(&l, client_name, &kind.path(), ns));
        Ok(Listing { content_type, link, filters_applied, body, cache, stale_age })
    }
}

/// A tag list whose `name` is the one the client asked for (anything else passes unchanged).
fn rename_tag_list(body: Bytes, client_name: &RepoName) -> Bytes {
    let Ok(serde_json::Value::Object(mut list)) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return body;
    };
    if !list.contains_key("name") {
        return body;
    }
    list.insert("name".to_string(), serde_json::Value::String(client_name.to_string()));
    serde_json::to_vec(&list).map(Bytes::from).unwrap_or(body)
}

/// An upstream's `Link: <URL>; rel="next"` (relative like distribution, or absolute with an
/// opaque token like Quay) as tender's own relative path for `client_name`: only the query
/// survives (without any `ns`), `ns` is added back when the client used it. `None` for a
/// header that is not a next link.
fn rewrite_link(link: &str, client_name: &RepoName, what: &str, ns: Option<&str>) -> Option<String> {
    let (target, params) = link.trim().strip_prefix('<')?.split_once('>')?;
    let rel_next = params.split(';').any(|p| {
        let p = p.trim();
        p.strip_prefix("rel=").is_some_and(|v| v.trim_matches('"').split_whitespace().any(|r| r == "next"))
    });
    if !rel_next {
        return None;
    }
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()).filter(|(k, _)| k != "ns") {
        out.append_pair(&k, &v);
    }
    if let Some(ns) = ns {
        out.append_pair("ns", ns);
    }
    let q = out.finish();
    let sep = if q.is_empty() { "" } else { "?" };
    Some(format!("</v2/{client_name}/{what}{sep}{q}>; rel=\"next\""))
}

/// The client's further manifest types (beyond the four image types), to ask the upstream
/// with: registry types only, at most 16.
fn extra_types(accept: &AcceptList) -> Vec<String> {
    let mut out: Vec<String> = accept
        .types()
        .iter()
        .filter(|t| !media::is_manifest(t) && media::is_manifest_like(t) && t.len() <= 255)
        .take(16)
        .cloned()
        .collect();
    out.sort();
    out
}

/// A manifest the client's `Accept` does not list: what distribution answers.
fn not_acceptable(up: &Upstream, repo: &RepoName, reference: &Reference, media_type: &str) -> FetchError {
    FetchError::new(
        FetchErrorKind::NotFound,
        up.name(),
        format!("{repo}:{reference} is a {media_type}, which the client's Accept does not list"),
    )
    .with_status(404)
}

/// Errors remembered per key until they expire (bounded: when full, expired entries go, then
/// everything).
#[derive(Default)]
struct Refusals(Mutex<HashMap<String, (std::time::Instant, FetchError)>>);

impl Refusals {
    const MAX: usize = 4096;

    fn get(&self, key: &str) -> Option<FetchError> {
        let map = self.0.lock().ok()?;
        let (until, e) = map.get(key)?;
        (std::time::Instant::now() < *until).then(|| e.clone())
    }

    fn put(&self, key: String, e: FetchError, ttl: std::time::Duration) {
        let Ok(mut map) = self.0.lock() else { return };
        if map.len() >= Self::MAX {
            let now = std::time::Instant::now();
            map.retain(|_, (until, _)| *until > now);
            if map.len() >= Self::MAX {
                map.clear();
            }
        }
        map.insert(key, (crate::later(ttl), e));
    }
}

/// Removes a manifest flight from the map when its waiter ends, however it ends.
struct LeaveFlight<'a> {
    mirror: &'a Mirror,
    key: &'a str,
}

impl Drop for LeaveFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut flights) = self.mirror.manifest_flights.lock() {
            flights.remove(self.key);
        }
    }
}

fn tender_store_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn local(up: &Upstream, e: tender_store::StoreError) -> FetchError {
    FetchError::store(up.name(), &e)
}

/// An upstream path as a fill source: a registry blob, or an Image Factory asset.
struct PathSource {
    upstream: Arc<Upstream>,
    path: String,
    scope: Option<String>,
}

impl Source for PathSource {
    fn upstream(&self) -> &str {
        self.upstream.name()
    }

    fn max_size(&self) -> Option<u64> {
        self.upstream.settings().max_object_size
    }

    fn path(&self) -> &str {
        &self.path
    }

    fn open(&self, offset: u64) -> BoxFuture<'static, Result<Opened, FetchError>> {
        let (up, path, scope) = (self.upstream.clone(), self.path.clone(), self.scope.clone());
        async move {
            let mut headers = HeaderMap::new();
            if offset > 0 {
                if let Ok(v) = HeaderValue::from_str(&format!("bytes={offset}-")) {
                    headers.insert(RANGE, v);
                }
            }
            let resp = up.request(Method::GET, &path, headers, scope.as_deref()).await?;
            opened_from(&up, resp, offset)
        }
        .boxed()
    }
}

/// Interpret a (possibly ranged) GET response as a fill transfer.
pub(crate) fn opened_from(up: &Arc<Upstream>, resp: reqwest::Response, offset: u64) -> Result<Opened, FetchError> {
    let name = up.name().to_string();
    let (partial, total) = if resp.status() == reqwest::StatusCode::PARTIAL_CONTENT {
        let cr = resp.headers().get(CONTENT_RANGE).and_then(|v| v.to_str().ok()).unwrap_or("");
        match parse_content_range(cr) {
            Some((start, total)) if start == offset => (true, total),
            _ => {
                return Err(FetchError::new(
                    FetchErrorKind::Body,
                    &name,
                    format!("206 with Content-Range {cr:?} does not start at {offset}"),
                ))
            }
        }
    } else {
        (false, resp.content_length())
    };
    let err_name = name.clone();
    let body = resp.bytes_stream().map(move |r| r.map_err(|e| FetchError::from_reqwest(&err_name, &e))).boxed();
    Ok(Opened { partial, total, body, vouch: None })
}

/// `bytes <start>-<end>/<total|*>` -> (start, total).
fn parse_content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, _end) = range.split_once('-')?;
    let total = if total.trim() == "*" { None } else { Some(total.trim().parse().ok()?) };
    Some((start.trim().parse().ok()?, total))
}

/// The Image Factory side: OS image assets through the same fills.
impl Mirror {
    /// A mirror that also serves `/image/...` assets from `image_factory`.
    pub fn with_image_factory(
        upstreams: Vec<Arc<Upstream>>,
        default_upstream: Option<String>,
        image_factory: Arc<Upstream>,
        flights: Arc<Flights>,
        settings: FetchSettings,
    ) -> Arc<Mirror> {
        Mirror::build(upstreams, default_upstream, Some(image_factory), flights, settings)
    }

    /// The upstream for names that carry neither `ns` nor a configured prefix.
    pub fn default_upstream(&self) -> Option<&str> {
        self.default_upstream.as_deref()
    }

    pub fn image_factory(&self) -> Option<&Arc<Upstream>> {
        self.image_factory.as_ref()
    }

    fn factory(&self) -> Result<Arc<Upstream>, FetchError> {
        self.image_factory
            .clone()
            .ok_or_else(|| FetchError::new(FetchErrorKind::NotFound, "image-factory", "no Image Factory configured"))
    }

    /// Join or start the fill of an Image Factory asset (`path` is `/image/...`, already
    /// validated; `key` its fill and trust key), or find it stored and trusted.
    pub fn asset(&self, path: &str, key: &str, container: crate::container::Container) -> Result<Claim, FetchError> {
        let source = Arc::new(PathSource { upstream: self.factory()?, path: path.to_string(), scope: None });
        self.flights.claim(key, Expect::Tofu { key: key.to_string(), container }, source)
    }

    /// Size of an asset we do not hold, from the factory (HEAD; the factory may build it first).
    pub async fn asset_size(&self, path: &str) -> Result<Option<u64>, FetchError> {
        let resp = self.factory()?.request(Method::HEAD, path, HeaderMap::new(), None).await?;
        Ok(resp.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_rewrite_next_links_to_tenders_own_path() {
        let name: RepoName = "ghcr.io/a/b".parse().unwrap();
        let cases = [
            (r#"</v2/a/b/tags/list?n=3&last=v2>; rel="next""#, None, Some("</v2/ghcr.io/a/b/tags/list?n=3&last=v2>")),
            (
                r#"<https://quay.io/v2/a/b/tags/list?next_page=t%2Bk&n=3>; rel="next""#,
                Some("quay.io"),
                Some("</v2/ghcr.io/a/b/tags/list?next_page=t%2Bk&n=3&ns=quay.io>"),
            ),
            (r#"</v2/a/b/tags/list?ns=evil&last=x>; rel="next""#, None, Some("</v2/ghcr.io/a/b/tags/list?last=x>")),
            (r#"</v2/a/b/tags/list>; rel="prev""#, None, None),
            ("garbage", None, None),
            ("<unterminated", None, None),
            (r#"<http://x/?a=%ZZ\r\n>; rel=next"#, None, Some("</v2/ghcr.io/a/b/tags/list?a=%25ZZ%5Cr%5Cn>")),
        ];
        for (link, ns, want) in cases {
            let want = want.map(|w| format!("{w}; rel=\"next\""));
            assert_eq!(rewrite_link(link, &name, "tags/list", ns), want, "{link}");
        }
    }

    #[test]
    fn should_name_a_tag_list_as_the_client_asked() {
        let name: RepoName = "alpine".parse().unwrap();
        let out = rename_tag_list(Bytes::from_static(br#"{"name":"library/alpine","tags":["3"]}"#), &name);
        assert_eq!(out.as_ref(), br#"{"name":"alpine","tags":["3"]}"#);
        for other in [&b"not json"[..], b"[1]", br#"{"tags":[]}"#] {
            assert_eq!(rename_tag_list(Bytes::copy_from_slice(other), &name).as_ref(), other);
        }
    }

    #[test]
    fn should_parse_content_range() {
        assert_eq!(parse_content_range("bytes 100-199/1000"), Some((100, Some(1000))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(parse_content_range("bytes */1000"), None);
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }
}
