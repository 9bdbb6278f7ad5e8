//! Every error a request can end in, mapped to a status and an OCI error body in one place.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tender_fetch::{FetchError, FetchErrorKind};
use tender_oci::ErrorCode;

/// What the registry API answers when it cannot serve a request: a status, and (except for a
/// 416, which carries only its `Content-Range`) an OCI error body whose code is one of the
/// spec's fourteen. Failures the spec has no code for (an upstream down, tender's own disk)
/// keep their 5xx status and carry the code of what could not be served (`BLOB_UNKNOWN`,
/// `MANIFEST_UNKNOWN`, `NAME_UNKNOWN`), with the cause in the message.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub retry_after: Option<u64>,
    /// A 416's `Content-Range` (`bytes */<total>`): the answer has no body.
    pub content_range: Option<String>,
    pub status: StatusCode,
}

/// The OCI error code of an error response, set on it for the access log (`access`).
#[derive(Debug, Clone, Copy)]
pub struct ErrorCodeSeen(pub &'static str);

/// What kind of object a request was about, to pick the right "unknown" code.
#[derive(Debug, Clone, Copy)]
pub enum Subject {
    Manifest,
    Blob,
    Repository,
}

impl Subject {
    /// The code for "this could not be served".
    pub fn unknown(self) -> ErrorCode {
        match self {
            Subject::Manifest => ErrorCode::ManifestUnknown,
            Subject::Blob => ErrorCode::BlobUnknown,
            Subject::Repository => ErrorCode::NameUnknown,
        }
    }
}

impl ApiError {
    /// An error with the code's usual status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        let status = match code {
            ErrorCode::BlobUnknown
            | ErrorCode::ManifestUnknown
            | ErrorCode::NameUnknown
            | ErrorCode::BlobUploadUnknown
            | ErrorCode::ManifestBlobUnknown => StatusCode::NOT_FOUND,
            ErrorCode::DigestInvalid
            | ErrorCode::ManifestInvalid
            | ErrorCode::NameInvalid
            | ErrorCode::SizeInvalid
            | ErrorCode::BlobUploadInvalid => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Denied => StatusCode::FORBIDDEN,
            ErrorCode::Unsupported => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
        };
        ApiError { code, message: message.into(), retry_after: None, content_range: None, status }
    }

    /// An error with another status than the code's usual one (a 5xx: the code says what
    /// could not be served).
    pub fn with_status(mut self, status: StatusCode) -> ApiError {
        self.status = status;
        self
    }

    /// tender failed to build an answer (never expected).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorCode::NameUnknown, message).with_status(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// 416: the range cannot be satisfied for an object of `total` bytes.
    pub fn unsatisfiable(total: u64) -> ApiError {
        let mut e = ApiError::new(ErrorCode::SizeInvalid, format!("range not satisfiable for {total} bytes"))
            .with_status(StatusCode::RANGE_NOT_SATISFIABLE);
        e.content_range = Some(format!("bytes */{total}"));
        e
    }

    /// Map a fetch failure: "not there" is a real 404 so containerd falls back to its next host.
    pub fn from_fetch(e: &FetchError, subject: Subject) -> ApiError {
        let unknown = subject.unknown();
        let mut out = match e.kind {
            FetchErrorKind::NotFound | FetchErrorKind::Offline => ApiError::new(unknown, e.to_string()),
            // Registries answer 401/403 for repositories that do not exist as well.
            FetchErrorKind::Unauthorized => {
                ApiError::new(unknown, format!("{e} (the repository may not exist, or the upstream needs credentials)"))
            }
            FetchErrorKind::Unauthenticated => ApiError::new(ErrorCode::Unauthorized, e.message.clone()),
            FetchErrorKind::TooManyRequests => ApiError::new(ErrorCode::TooManyRequests, e.to_string()),
            FetchErrorKind::Connect
            | FetchErrorKind::Timeout
            | FetchErrorKind::Body
            | FetchErrorKind::Status
            | FetchErrorKind::Refused => {
                ApiError::new(unknown, e.to_string()).with_status(StatusCode::SERVICE_UNAVAILABLE)
            }
            FetchErrorKind::Unverifiable => ApiError::new(unknown, e.to_string()).with_status(StatusCode::BAD_GATEWAY),
            FetchErrorKind::TooLarge | FetchErrorKind::Unverified => ApiError::new(ErrorCode::Denied, e.to_string()),
            FetchErrorKind::Corrupt => {
                ApiError::new(unknown, format!("upstream sent wrong content: {e}")).with_status(StatusCode::BAD_GATEWAY)
            }
            // tender's own side: not a bad gateway (the upstream did nothing wrong).
            FetchErrorKind::Local => ApiError::new(unknown, e.to_string()).with_status(StatusCode::SERVICE_UNAVAILABLE),
            FetchErrorKind::NoSpace => {
                ApiError::new(unknown, e.to_string()).with_status(StatusCode::INSUFFICIENT_STORAGE)
            }
        };
        out.retry_after = e.retry_after.map(|d| d.as_secs().max(1));
        out
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut resp = if self.content_range.is_some() {
            // A 416 says everything in its status and Content-Range, as the reference registry
            // answers it: no error body (no spec code is about ranges).
            (status, [(axum::http::header::CONTENT_LENGTH, "0")]).into_response()
        } else {
            let body = serde_json::json!({
                "errors": [{ "code": self.code.as_str(), "message": self.message, "detail": null }]
            });
            (status, axum::Json(body)).into_response()
        };
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
        resp.extensions_mut().insert(ErrorCodeSeen(self.code.as_str()));
        resp
    }
}
