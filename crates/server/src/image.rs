//! The Image Factory-compatible endpoint: `GET|HEAD /image/<schematic>/<version>/<asset>`.
//! Assets outside the factory's grammar are refused before any outbound connection; the rest
//! are fetched once, trusted on first use, and served with ranges and validators.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, Version};
use axum::response::{IntoResponse, Response};
use tender_catalog::asset::{safe_filename, AssetPath, Compression};
use tender_fetch::flight::{Claim, Expect};
use tender_fetch::mirror::CacheResult;
use tender_fetch::Container;
use tender_oci::ErrorCode;

use crate::access::AccessInfo;
use crate::error::{ApiError, Subject};
use crate::object::{self, Describe};
use crate::AppState;

fn container(c: Compression) -> Container {
    match c {
        Compression::None => Container::None,
        Compression::Xz => Container::Xz,
        Compression::Gz | Compression::TarGz => Container::Gz,
        Compression::Zst => Container::Zst,
    }
}

pub async fn handle(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let mut info = AccessInfo { route: "image", upstream: Some("image-factory".into()), ..AccessInfo::default() };
    let result = serve(&app, req.method(), req.uri(), req.headers(), req.version(), &mut info).await;
    if result.is_ok() {
        crate::registry::note_served(&app, &info);
    }
    let mut resp = result.unwrap_or_else(IntoResponse::into_response);
    resp.extensions_mut().insert(info);
    resp
}

async fn serve(
    app: &Arc<AppState>,
    method: &Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    version: Version,
    info: &mut AccessInfo,
) -> Result<Response, ApiError> {
    if method != Method::GET && method != Method::HEAD {
        return Err(ApiError::new(ErrorCode::Unsupported, "only GET and HEAD"));
    }
    let asset = AssetPath::parse(uri.path()).map_err(|e| ApiError::new(ErrorCode::NameUnknown, e.to_string()))?;
    // Counted in the served statistics as `image-factory/<schematic>/<version>/<asset>`.
    info.repository = Some(format!("{}/{asset}", info.upstream.as_deref().unwrap_or("image-factory")));
    let filename =
        match url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).find(|(k, _)| k == "filename") {
            Some((_, v)) => Some(safe_filename(&v).ok_or_else(|| {
                ApiError::new(ErrorCode::NameInvalid, format!("filename {v:?} is not a plain file name"))
            })?),
            None => None,
        };
    let head = method == Method::HEAD;
    let mirror = app.mirror();
    let store = mirror.flights().store().clone();
    let local = |e: tender_store::StoreError| ApiError::new(ErrorCode::Unknown, e.to_string());
    let key = asset.key();
    let mut describe = Describe {
        content_type: "application/octet-stream".into(),
        filename: Some(filename.unwrap_or_else(|| asset.asset.clone())),
        ..Describe::default()
    };
    // A trusted asset that is stored: a hit.
    let stored = |describe: &mut Describe, info: &mut AccessInfo| -> Result<Option<Response>, ApiError> {
        let Some(t) = store.trust_get(&key).map_err(local)? else { return Ok(None) };
        let Some(object) = store.open_stored(&t.digest).map_err(local)? else { return Ok(None) };
        info.cache = Some(CacheResult::Hit.as_str());
        info.digest = Some(t.digest);
        describe.etag_digest = Some(t.digest);
        describe.last_modified = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(t.first_seen));
        object::stored(object, t.digest, describe, headers, head).map(Some)
    };
    if let Some(resp) = stored(&mut describe, info)? {
        return Ok(resp);
    }
    {
        let expect = Expect::Tofu { key: key.clone(), container: container(asset.compression()) };
        if let Some(found) = mirror.flights().shared_lookup(&expect).await {
            describe.etag_digest = Some(found.digest);
            if let Some(t) = &found.trust {
                describe.last_modified = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(t.first_seen));
            }
            let (m, path, k, c) = (mirror.clone(), asset.path(), key.clone(), container(asset.compression()));
            let fallback = object::Fallback { store: store.clone(), claim: Box::new(move || m.asset(&path, &k, c)) };
            if let Some(resp) = object::shared(mirror.flights(), &found, &describe, headers, head, fallback) {
                info.cache = Some(CacheResult::Shared.as_str());
                info.digest = Some(found.digest);
                return resp;
            }
            describe.etag_digest = None;
            describe.last_modified = None;
        }
    }
    if head {
        // Clients of a fill get their last byte once the content verified, before the commit
        // (fsync, rename, trust record) ends: a HEAD right after such a GET waits for that commit
        // and answers as a hit, with validators, rather than asking the factory.
        if let Some(fill) = mirror.flights().filling(&key).filter(|f| f.is_verified()) {
            if fill.committed().await.is_some() {
                if let Some(resp) = stored(&mut describe, info)? {
                    return Ok(resp);
                }
            }
        }
        info.cache = Some(CacheResult::Pass.as_str());
        let size = mirror.asset_size(&asset.path()).await.map_err(|e| ApiError::from_fetch(&e, Subject::Blob))?;
        return object::head(&describe, size);
    }
    match mirror
        .asset(&asset.path(), &key, container(asset.compression()))
        .map_err(|e| ApiError::from_fetch(&e, Subject::Blob))?
    {
        Claim::Stored(digest) => {
            info.cache = Some(CacheResult::Hit.as_str());
            let object = store
                .open_stored(&digest)
                .map_err(local)?
                .ok_or_else(|| ApiError::new(ErrorCode::BlobUnknown, "asset vanished"))?;
            describe.etag_digest = Some(digest);
            if let Some(t) = store.trust_get(&key).map_err(local)? {
                describe.last_modified = Some(SystemTime::UNIX_EPOCH + Duration::from_secs(t.first_seen));
            }
            object::stored(object, digest, &describe, headers, head)
        }
        Claim::Filling(fill) => {
            // A fill whose content already verified (its commit is under way) holds every byte:
            // for this request it is as good as stored.
            // The request that started the fill is its miss, however fast a small fill verified.
            let hit = !fill.take_start() && fill.is_verified();
            info.cache = Some(if hit { CacheResult::Hit } else { CacheResult::Miss }.as_str());
            let trusted = mirror.image_factory().is_some_and(|f| f.settings().range_before_verify);
            object::filling(fill, &describe, headers, version, Subject::Blob, trusted).await
        }
    }
}
