//! The OCI distribution error codes. The HTTP layer maps them to statuses.

/// An error code of the distribution spec: exactly its fourteen, so that no error body ever
/// carries a code a client cannot know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BlobUnknown,
    BlobUploadInvalid,
    BlobUploadUnknown,
    DigestInvalid,
    ManifestBlobUnknown,
    ManifestInvalid,
    ManifestUnknown,
    NameInvalid,
    NameUnknown,
    SizeInvalid,
    Unauthorized,
    Denied,
    Unsupported,
    TooManyRequests,
}

impl ErrorCode {
    /// Every code, in the spec's order.
    pub const ALL: [ErrorCode; 14] = [
        ErrorCode::BlobUnknown,
        ErrorCode::BlobUploadInvalid,
        ErrorCode::BlobUploadUnknown,
        ErrorCode::DigestInvalid,
        ErrorCode::ManifestBlobUnknown,
        ErrorCode::ManifestInvalid,
        ErrorCode::ManifestUnknown,
        ErrorCode::NameInvalid,
        ErrorCode::NameUnknown,
        ErrorCode::SizeInvalid,
        ErrorCode::Unauthorized,
        ErrorCode::Denied,
        ErrorCode::Unsupported,
        ErrorCode::TooManyRequests,
    ];

    /// The code as it appears in `{"errors":[{"code":...}]}`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BlobUnknown => "BLOB_UNKNOWN",
            ErrorCode::BlobUploadInvalid => "BLOB_UPLOAD_INVALID",
            ErrorCode::BlobUploadUnknown => "BLOB_UPLOAD_UNKNOWN",
            ErrorCode::DigestInvalid => "DIGEST_INVALID",
            ErrorCode::ManifestBlobUnknown => "MANIFEST_BLOB_UNKNOWN",
            ErrorCode::ManifestInvalid => "MANIFEST_INVALID",
            ErrorCode::ManifestUnknown => "MANIFEST_UNKNOWN",
            ErrorCode::NameInvalid => "NAME_INVALID",
            ErrorCode::NameUnknown => "NAME_UNKNOWN",
            ErrorCode::SizeInvalid => "SIZE_INVALID",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Denied => "DENIED",
            ErrorCode::Unsupported => "UNSUPPORTED",
            ErrorCode::TooManyRequests => "TOOMANYREQUESTS",
        }
    }
}
