//! The Image Factory-compatible endpoint: `GET|HEAD /image/<schematic>/<version>/<asset>`.
//! Assets outside the factory's grammar are refused before any outbound connection; the rest
//! are fetched once, trusted on first use, and served with ranges and validators.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use tender_catalog::asset::{safe_filename, AssetPath};
use tender_fetch::{AssetAsk, Head};
use tender_oci::ErrorCode;

use crate::access::AccessInfo;
use crate::error::{ApiError, Subject};
use crate::object::{self, Describe};
use crate::AppState;

pub async fn handle(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let mut info = AccessInfo { route: "image", upstream: Some("image-factory".into()), ..AccessInfo::default() };
    let (parts, _body) = req.into_parts();
    let result = serve(&app, &parts, &mut info).await;
    if result.is_ok() {
        crate::registry::note_served(&app, &info);
    }
    let mut resp = result.unwrap_or_else(IntoResponse::into_response);
    resp.extensions_mut().insert(info);
    resp
}

async fn serve(app: &Arc<AppState>, req: &Parts, info: &mut AccessInfo) -> Result<Response, ApiError> {
    let (method, uri) = (&req.method, &req.uri);
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
    let ask = AssetAsk {
        path: asset.path(),
        key: asset.key(),
        container: asset.compression().container(),
        head: method == Method::HEAD,
    };
    let opened = app.mirror().open_asset(&ask).await.map_err(|e| ApiError::from_fetch(&e, Subject::Blob))?;
    let filename = filename.unwrap_or_else(|| asset.asset.clone());
    let describe = |head: &Head| Describe {
        content_type: "application/octet-stream".into(),
        filename: Some(filename.clone()),
        etag_digest: head.digest,
        last_modified: head.first_seen.map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s)),
        ..Describe::default()
    };
    object::respond(opened, describe, req, Subject::Blob, info).await
}
