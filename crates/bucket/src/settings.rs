//! What the `storage.s3` configuration resolves to, and the S3 client built from it.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::{ClientOptions, RetryConfig};

use crate::BucketError;

/// The smallest chunk: each chunk is one S3 object and one request, and the progress record
/// lists one sha256 per chunk; smaller chunks cost more requests than they save in latency.
pub const MIN_CHUNK_SIZE: u64 = 5 << 20;
/// The largest chunk: a chunk is read whole into memory, so no record may name a larger one.
pub const MAX_CHUNK_SIZE: u64 = 1 << 30;

/// The piece of a chunk whose sha256 the index records besides the chunk's: a range reads and
/// verifies the sub-chunks that cover it, not the whole chunk (a 1 MiB range of an object in
/// chunks of 8 MiB fetches 1-2 MiB, not 8-16).
pub const SUB_CHUNK_SIZE: u64 = 1 << 20;
/// Sub-chunk hashes one index may record (an object of 64 GiB in pieces of 1 MiB, about 5 MB of
/// index); a larger object's index has none (its ranges read whole chunks), so no index comes
/// near the 16 MiB a record may be.
pub const MAX_SUB_CHUNKS: usize = 1 << 16;

/// Static keys read from files or the environment. `Debug` never shows them.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

#[derive(Debug, Clone)]
pub struct BucketSettings {
    /// `https://s3.example.net` or `http://127.0.0.1:9000`; `None` is AWS itself, by region.
    pub endpoint: Option<String>,
    pub bucket: String,
    pub region: String,
    /// Key prefix inside the bucket (no leading or trailing `/`), so one bucket can hold
    /// several tender fleets.
    pub prefix: String,
    /// `None`: the SDK chain of the environment (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`,
    /// web identity, instance metadata).
    pub credentials: Option<Credentials>,
    /// Path-style requests (`endpoint/bucket/key`), which most S3-compatible servers need.
    pub path_style: bool,
    /// Sign each request's body into its SigV4 signature (`x-amz-content-sha256` = the body's
    /// sha256) instead of `UNSIGNED-PAYLOAD`. Off by default: it costs a sha256 pass over every
    /// chunk here and another in the S3 server, and adds no integrity tender lacks (every chunk
    /// and object is verified against its sha256 when read; responses are never signed).
    pub sign_payload: bool,
    pub chunk_size: u64,
    /// [`SUB_CHUNK_SIZE`] (tests set it smaller); uploads record no sub-chunk hashes unless
    /// it divides `chunk_size` into two pieces or more.
    pub sub_chunk_size: u64,
    /// Take a lease in the bucket before fetching a cold object from upstream (one upstream
    /// fetch in total across replicas); off: at most one per replica.
    pub lease: bool,
    pub lease_ttl: Duration,
    /// This replica's name in leases and indexes.
    pub replica: String,
    /// The most one bucket request may take, its retries included; past it the request fails
    /// and the breaker opens (the client is served from elsewhere).
    pub request_timeout: Duration,
    /// The most a connection to the bucket may take to open.
    pub connect_timeout: Duration,
    /// Retries of a failed request within `request_timeout` (the S3 client's backoff).
    pub retries: usize,
    /// The first wait before probing a bucket that is down; doubled after each failed probe,
    /// up to 16 times this.
    pub probe_interval: Duration,
    /// `tender gc --bucket`'s cap when `--max-size` is not given (`maxSize`).
    pub max_size: Option<u64>,
    /// `tender gc --bucket` keeps objects served (or uploaded) within this (`gcGrace`): a
    /// replica may be reading them right now. Keys nothing names (module `books`) are removed
    /// by the sweep and gc once older than this.
    pub gc_grace: Duration,
    /// The key the replicas share to authenticate the indexes they write
    /// (`storage.s3.indexKeyFile`; module `index`): a replica that verified an object's digest
    /// signs its index, and a reader trusts a signed index's chunk hashes as that digest's, so
    /// it hashes each byte once. `None`: every reader hashes the whole object as well.
    pub index_key: Option<IndexKey>,
}

/// The key the replicas share to sign and check indexes (`storage.s3.indexKeyFile`; the
/// index module signs and checks with it).
#[derive(Clone)]
pub struct IndexKey(Arc<[u8]>);

impl std::fmt::Debug for IndexKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IndexKey(..)")
    }
}

impl IndexKey {
    pub fn new(key: &[u8]) -> IndexKey {
        IndexKey(Arc::from(key))
    }

    /// A fresh HMAC-SHA256 under the key.
    pub(crate) fn mac(&self) -> hmac::Hmac<sha2::Sha256> {
        // HMAC takes a key of any length.
        <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!())
    }
}

impl BucketSettings {
    pub fn new(bucket: &str) -> BucketSettings {
        BucketSettings {
            endpoint: None,
            bucket: bucket.to_string(),
            region: "us-east-1".into(),
            prefix: String::new(),
            credentials: None,
            path_style: true,
            sign_payload: false,
            chunk_size: 8 << 20,
            sub_chunk_size: SUB_CHUNK_SIZE,
            lease: true,
            lease_ttl: Duration::from_secs(30),
            replica: "tender".into(),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            retries: 2,
            probe_interval: Duration::from_secs(5),
            max_size: None,
            gc_grace: Duration::from_secs(600),
            index_key: None,
        }
    }

    /// The sub-chunk size an upload in chunks of `chunk_size` records hashes for, if any.
    pub fn sub_chunks_of(&self, chunk_size: u64) -> Option<u64> {
        let s = self.sub_chunk_size;
        (s > 0 && s < chunk_size && chunk_size.is_multiple_of(s)).then_some(s)
    }

    pub(crate) fn build(&self) -> Result<Arc<AmazonS3>, BucketError> {
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region(&self.region)
            .with_virtual_hosted_style_request(!self.path_style)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_unsigned_payload(!self.sign_payload)
            .with_client_options(
                ClientOptions::new().with_timeout(self.request_timeout).with_connect_timeout(self.connect_timeout),
            )
            .with_retry(RetryConfig {
                max_retries: self.retries,
                retry_timeout: self.request_timeout,
                ..RetryConfig::default()
            });
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
        }
        match &self.credentials {
            Some(c) => {
                b = b.with_access_key_id(&c.access_key_id).with_secret_access_key(&c.secret_access_key);
                if let Some(t) = &c.session_token {
                    b = b.with_token(t);
                }
            }
            None => {
                // The environment's credential chain, as the AWS SDKs read it.
                for (var, key) in [
                    ("AWS_ACCESS_KEY_ID", object_store::aws::AmazonS3ConfigKey::AccessKeyId),
                    ("AWS_SECRET_ACCESS_KEY", object_store::aws::AmazonS3ConfigKey::SecretAccessKey),
                    ("AWS_SESSION_TOKEN", object_store::aws::AmazonS3ConfigKey::Token),
                    ("AWS_WEB_IDENTITY_TOKEN_FILE", object_store::aws::AmazonS3ConfigKey::WebIdentityTokenFile),
                    ("AWS_ROLE_ARN", object_store::aws::AmazonS3ConfigKey::RoleArn),
                ] {
                    if let Ok(v) = std::env::var(var) {
                        b = b.with_config(key, v);
                    }
                }
            }
        }
        let store =
            b.build().map_err(|e| BucketError::Setup { bucket: self.bucket.clone(), message: e.to_string() })?;
        Ok(Arc::new(store))
    }
}
