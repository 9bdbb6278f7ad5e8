//! The OCI distribution error codes. The HTTP layer maps them to statuses.

/// An error code from the distribution spec (plus the reference registry's extras).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BlobUnknown,
    DigestInvalid,
    ManifestUnknown,
    ManifestInvalid,
    NameInvalid,
    NameUnknown,
    SizeInvalid,
    Unauthorized,
    Denied,
    Unsupported,
    TooManyRequests,
    RangeInvalid,
    TagInvalid,
    PaginationNumberInvalid,
    Unavailable,
    Unknown,
}

impl ErrorCode {
    /// The code as it appears in `{"errors":[{"code":...}]}`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BlobUnknown => "BLOB_UNKNOWN",
            ErrorCode::DigestInvalid => "DIGEST_INVALID",
            ErrorCode::ManifestUnknown => "MANIFEST_UNKNOWN",
            ErrorCode::ManifestInvalid => "MANIFEST_INVALID",
            ErrorCode::NameInvalid => "NAME_INVALID",
            ErrorCode::NameUnknown => "NAME_UNKNOWN",
            ErrorCode::SizeInvalid => "SIZE_INVALID",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Denied => "DENIED",
            ErrorCode::Unsupported => "UNSUPPORTED",
            ErrorCode::TooManyRequests => "TOOMANYREQUESTS",
            ErrorCode::RangeInvalid => "RANGE_INVALID",
            ErrorCode::TagInvalid => "TAG_INVALID",
            ErrorCode::PaginationNumberInvalid => "PAGINATION_NUMBER_INVALID",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::Unknown => "UNKNOWN",
        }
    }
}
