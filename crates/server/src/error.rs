//! Every error a request can end in, mapped to a status and an OCI error body in one place.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tender_fetch::{FetchError, FetchErrorKind};
use tender_oci::ErrorCode;

/// What the registry API answers when it cannot serve a request.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub retry_after: Option<u64>,
    /// Overrides the code's usual status (416 needs a Content-Range, for instance).
    pub content_range: Option<String>,
    /// `507 Insufficient Storage`: the data directory is full.
    pub insufficient_storage: bool,
}

/// What kind of object a request was about, to pick the right "unknown" code.
#[derive(Debug, Clone, Copy)]
pub enum Subject {
    Manifest,
    Blob,
    Repository,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { code, message: message.into(), retry_after: None, content_range: None, insufficient_storage: false }
    }

    /// Map a fetch failure: "not there" is a real 404 so containerd falls back to its next host.
    pub fn from_fetch(e: &FetchError, subject: Subject) -> ApiError {
        let unknown = match subject {
            Subject::Manifest => ErrorCode::ManifestUnknown,
            Subject::Blob => ErrorCode::BlobUnknown,
            Subject::Repository => ErrorCode::NameUnknown,
        };
        let mut out = match e.kind {
            FetchErrorKind::NotFound | FetchErrorKind::Offline => ApiError::new(unknown, e.to_string()),
            // Registries answer 401/403 for repositories that do not exist as well.
            FetchErrorKind::Unauthorized => {
                ApiError::new(unknown, format!("{e} (the repository may not exist, or the upstream needs credentials)"))
            }
            FetchErrorKind::TooManyRequests => ApiError::new(ErrorCode::TooManyRequests, e.to_string()),
            FetchErrorKind::Connect
            | FetchErrorKind::Timeout
            | FetchErrorKind::Body
            | FetchErrorKind::Status
            | FetchErrorKind::Refused => ApiError::new(ErrorCode::Unavailable, e.to_string()),
            FetchErrorKind::Unverifiable => ApiError::new(ErrorCode::Unknown, e.to_string()),
            FetchErrorKind::TooLarge => ApiError::new(ErrorCode::Denied, e.to_string()),
            FetchErrorKind::Corrupt => ApiError::new(ErrorCode::Unknown, format!("upstream sent wrong content: {e}")),
            // tender's own side: not a bad gateway (the upstream did nothing wrong).
            FetchErrorKind::Local => ApiError::new(ErrorCode::Unavailable, e.to_string()),
            FetchErrorKind::NoSpace => {
                ApiError { insufficient_storage: true, ..ApiError::new(ErrorCode::Unavailable, e.to_string()) }
            }
        };
        out.retry_after = e.retry_after.map(|d| d.as_secs().max(1));
        out
    }

    pub fn status(&self) -> StatusCode {
        if self.content_range.is_some() {
            return StatusCode::RANGE_NOT_SATISFIABLE;
        }
        if self.insufficient_storage {
            return StatusCode::INSUFFICIENT_STORAGE;
        }
        match self.code {
            ErrorCode::BlobUnknown | ErrorCode::ManifestUnknown | ErrorCode::NameUnknown => StatusCode::NOT_FOUND,
            ErrorCode::DigestInvalid
            | ErrorCode::ManifestInvalid
            | ErrorCode::NameInvalid
            | ErrorCode::SizeInvalid
            | ErrorCode::TagInvalid
            | ErrorCode::PaginationNumberInvalid => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Denied => StatusCode::FORBIDDEN,
            ErrorCode::Unsupported => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::RangeInvalid => StatusCode::RANGE_NOT_SATISFIABLE,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unknown => StatusCode::BAD_GATEWAY,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = serde_json::json!({
            "errors": [{ "code": self.code.as_str(), "message": self.message, "detail": null }]
        });
        let mut resp = (status, axum::Json(body)).into_response();
        let h = resp.headers_mut();
        h.insert("docker-distribution-api-version", HeaderValue::from_static("registry/2.0"));
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                h.insert("retry-after", v);
            }
        }
        if let Some(cr) = &self.content_range {
            if let Ok(v) = HeaderValue::from_str(cr) {
                h.insert("content-range", v);
            }
        }
        resp.extensions_mut().insert(crate::access::ErrorCodeSeen(self.code.as_str()));
        resp
    }
}
