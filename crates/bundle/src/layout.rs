//! The OCI image layout as bundles use it: `oci-layout`, `index.json`, `blobs/<alg>/<hex>`, and
//! the annotations tender writes and reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tender_oci::{media, Digest};

pub const LAYOUT_FILE: &str = "oci-layout";
pub const INDEX_FILE: &str = "index.json";
pub const LAYOUT_VERSION: &str = "1.0.0";

/// The full image name of an entry (`ghcr.io/siderolabs/kubelet:v1.35.0`); skopeo writes a
/// bare tag here, containerd and tender the full name.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// containerd's name annotation (`ctr images export` / `import`): a full name, preferred.
pub const CONTAINERD_NAME: &str = "io.containerd.image.name";
pub const TITLE: &str = "org.opencontainers.image.title";
pub const CREATED: &str = "org.opencontainers.image.created";
/// `registry/repository` of an entry that has no tag (a referrer found by the referrers API).
pub const REPOSITORY: &str = "dev.tender.repository";
/// The platforms exported of a multi-arch index, comma-separated.
pub const PLATFORMS: &str = "dev.tender.platforms";
/// An OS image asset's Image Factory path, `/image/<schematic>/<version>/<asset>`.
pub const FACTORY_PATH: &str = "dev.tender.image-factory.path";
/// The sha256 of an asset's trust record (its first verified fetch).
pub const TRUST_SHA256: &str = "dev.tender.trust.sha256";
/// On an entry: `true` when the image came from an upstream whose content goes only to
/// authenticated clients (credentials, or `private`); `import` registers it only under an
/// upstream that is private at its site too, unless told `--allow-public`.
pub const PRIVATE: &str = "dev.tender.private";
/// On a delta's index: the index digest of the bundle it builds on.
pub const SINCE: &str = "dev.tender.bundle.since";
/// On a bundle's index: the text of the spec it was exported from (`export --spec`).
pub const SPEC: &str = "dev.tender.bundle.spec";
/// `artifactType` of an OS image asset's manifest.
pub const OS_IMAGE_ARTIFACT: &str = "application/vnd.dev.tender.os-image.v1";
/// The empty config of an artifact manifest, and its content.
pub const EMPTY_MEDIA: &str = "application/vnd.oci.empty.v1+json";
pub const EMPTY_JSON: &[u8] = b"{}";
/// Media type of an asset layer.
pub const ASSET_LAYER_MEDIA: &str = "application/octet-stream";

/// Largest `index.json` or manifest read.
pub const MAX_DOCUMENT_BYTES: u64 = 8 * 1024 * 1024;

/// An OCI content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<serde_json::Value>,
    /// Where a non-distributable layer may be fetched; such a layer may be absent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
}

impl Descriptor {
    pub fn new(media_type: &str, digest: &Digest, size: u64) -> Descriptor {
        Descriptor {
            media_type: media_type.to_string(),
            digest: digest.to_string(),
            size,
            artifact_type: None,
            annotations: BTreeMap::new(),
            platform: None,
            urls: Vec::new(),
        }
    }

    pub fn with(mut self, key: &str, value: impl Into<String>) -> Descriptor {
        self.annotations.insert(key.to_string(), value.into());
        self
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// `index.json`, and any image index or manifest read to walk it: the fields a walk needs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Document {
    #[serde(default)]
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Document {
    /// A bundle's top index.
    pub fn index(manifests: Vec<Descriptor>, annotations: BTreeMap<String, String>) -> Document {
        Document {
            schema_version: 2,
            media_type: Some(media::OCI_INDEX.to_string()),
            manifests,
            annotations,
            ..Document::default()
        }
    }
}

/// The `oci-layout` file's content.
pub fn layout_file() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "imageLayoutVersion": LAYOUT_VERSION })).unwrap_or_default()
}

/// Whether an `oci-layout` file names a layout version this reader knows (1.x).
pub fn layout_version_ok(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v.get("imageLayoutVersion").and_then(|s| s.as_str()).map(|s| s.starts_with("1.")))
        .unwrap_or(false)
}

/// `blobs/<alg>/<hex>` → its digest (a path that is not a blob's: `None`).
pub fn blob_digest(path: &str) -> Option<Digest> {
    let rest = path.strip_prefix("blobs/")?;
    let (alg, hex) = rest.split_once('/')?;
    format!("{alg}:{hex}").parse().ok()
}

/// The layout path of a blob.
pub fn blob_path(digest: &Digest) -> String {
    format!("blobs/{}/{}", digest.algorithm().name(), digest.hex())
}

/// A tar or layout member name as written by any tool: `./index.json` → `index.json`.
pub fn normalize(name: &str) -> &str {
    let mut n = name;
    while let Some(rest) = n.strip_prefix("./") {
        n = rest;
    }
    n.trim_start_matches('/')
}
