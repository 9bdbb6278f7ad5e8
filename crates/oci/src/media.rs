//! Manifest media types and the client's `Accept` list.

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker image manifest schema 1, signed (it never carries a `mediaType` field).
pub const DOCKER_SCHEMA1_SIGNED: &str = "application/vnd.docker.distribution.manifest.v1+prettyjws";

/// Every manifest type tender understands, in the order it asks an upstream for them.
pub const ALL_MANIFESTS: [&str; 4] = [OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST];

/// The media types a client accepts, parsed from its `Accept` headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcceptList {
    types: Vec<String>,
    wildcard: bool,
}

impl AcceptList {
    /// Parse the values of every `Accept` header (comma-separated, parameters ignored).
    pub fn parse<'a>(headers: impl IntoIterator<Item = &'a str>) -> AcceptList {
        let mut out = AcceptList::default();
        for header in headers {
            for item in header.split(',') {
                let ty = item.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
                if ty.is_empty() {
                    continue;
                }
                if ty == "*/*" || ty == "application/*" {
                    out.wildcard = true;
                } else if !out.types.contains(&ty) {
                    out.types.push(ty);
                }
            }
        }
        out
    }

    /// True when the client named no types (or a wildcard): anything goes.
    pub fn is_open(&self) -> bool {
        self.wildcard || self.types.is_empty()
    }

    /// The types the client named (lower case, without parameters; wildcards not included).
    pub fn types(&self) -> &[String] {
        &self.types
    }

    /// Whether a manifest of `media_type` may be returned to this client.
    pub fn accepts(&self, media_type: &str) -> bool {
        self.is_open() || self.types.iter().any(|t| t.eq_ignore_ascii_case(media_type))
    }
}

/// Whether `media_type` is one of the manifest types tender serves.
pub fn is_manifest(media_type: &str) -> bool {
    ALL_MANIFESTS.iter().any(|m| m.eq_ignore_ascii_case(media_type))
}

/// Whether `media_type` is an index (OCI image index or Docker manifest list).
pub fn is_index(media_type: &str) -> bool {
    media_type.eq_ignore_ascii_case(OCI_INDEX) || media_type.eq_ignore_ascii_case(DOCKER_LIST)
}

/// The entry of an index that a client which cannot take the index gets, chosen the way
/// distribution chooses it: linux/amd64, else the first entry. `None` for an empty or
/// unreadable index (or an entry without a valid digest).
pub fn default_platform(index: &[u8]) -> Option<crate::Digest> {
    #[derive(serde::Deserialize)]
    struct Platform {
        os: Option<String>,
        architecture: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        digest: String,
        platform: Option<Platform>,
    }
    #[derive(serde::Deserialize)]
    struct Index {
        manifests: Vec<Entry>,
    }
    let index: Index = serde_json::from_slice(index).ok()?;
    let linux_amd64 = |e: &&Entry| {
        e.platform
            .as_ref()
            .is_some_and(|p| p.os.as_deref() == Some("linux") && p.architecture.as_deref() == Some("amd64"))
    };
    let entry = index.manifests.iter().find(linux_amd64).or(index.manifests.first())?;
    entry.digest.parse().ok()
}

/// The digests an index lists (those that parse), in order; empty for anything else.
pub fn index_children(index: &[u8]) -> Vec<crate::Digest> {
    #[derive(serde::Deserialize)]
    struct Entry {
        digest: String,
    }
    #[derive(serde::Deserialize)]
    struct Index {
        manifests: Vec<Entry>,
    }
    serde_json::from_slice::<Index>(index)
        .map(|i| i.manifests.iter().filter_map(|e| e.digest.parse().ok()).collect())
        .unwrap_or_default()
}

/// The media type a manifest declares in its own `mediaType` field, if any.
pub fn declared_media_type(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
    }
    let probe: Probe = serde_json::from_slice(body).ok()?;
    match probe.media_type {
        Some(m) => Some(m),
        None if probe.manifests.is_some() => Some(OCI_INDEX.to_string()),
        None => Some(OCI_MANIFEST.to_string()),
    }
}

/// Whether `media_type` may name a manifest tender stores and serves: the four it knows, and
/// other registry types (`application/vnd.…+json`, schema 1's `+prettyjws`), never a type a
/// browser would render.
pub fn is_manifest_like(media_type: &str) -> bool {
    let t = media_type.to_ascii_lowercase();
    is_manifest(&t) || (t.starts_with("application/vnd.") && (t.ends_with("+json") || t.ends_with("+prettyjws")))
}

/// The media type a manifest body is stored and served as, once its digest verified: the
/// type it declares (`mediaType`), else the upstream's Content-Type if that names a manifest,
/// else the OCI type its structure says. `None`: not JSON, or it declares a type that is not a
/// manifest's. The upstream's Content-Type alone never decides.
///
/// A body without `mediaType` must have the structure of an index (a `manifests` array), an
/// image manifest (a `config` object and a `layers` array) or a schema 1 manifest
/// (`schemaVersion` 1 and an `fsLayers` array): any other JSON (`{}`, a JSON document an
/// upstream serves by mistake or on purpose) is not a manifest (issue 32).
pub fn verified_media_type(upstream: Option<&str>, body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        #[serde(rename = "schemaVersion")]
        schema_version: Option<serde_json::Value>,
        manifests: Option<serde_json::Value>,
        config: Option<serde_json::Value>,
        layers: Option<serde_json::Value>,
        #[serde(rename = "fsLayers")]
        fs_layers: Option<serde_json::Value>,
    }
    let probe: Probe = serde_json::from_slice(body).ok()?;
    if let Some(m) = probe.media_type {
        return is_manifest_like(&m).then_some(m);
    }
    let is_array = |v: &Option<serde_json::Value>| v.as_ref().is_some_and(serde_json::Value::is_array);
    let structural = if is_array(&probe.manifests) {
        OCI_INDEX
    } else if probe.config.as_ref().is_some_and(serde_json::Value::is_object) && is_array(&probe.layers) {
        OCI_MANIFEST
    } else if probe.schema_version.as_ref().and_then(serde_json::Value::as_u64) == Some(1) && is_array(&probe.fs_layers)
    {
        DOCKER_SCHEMA1_SIGNED
    } else {
        return None;
    };
    match upstream.filter(|t| is_manifest_like(t)) {
        Some(t) => Some(t.to_string()),
        None => Some(structural.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_take_the_declared_manifest_type_never_a_renderable_one() {
        let oci = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}"#;
        assert_eq!(verified_media_type(Some("text/html"), oci).as_deref(), Some(OCI_MANIFEST));
        assert_eq!(verified_media_type(None, br#"{"mediaType":"text/html"}"#), None);
        let bare = br#"{"schemaVersion":2,"config":{"digest":"sha256:00","size":2},"layers":[]}"#;
        assert_eq!(verified_media_type(Some("text/html"), bare).as_deref(), Some(OCI_MANIFEST));
        assert_eq!(verified_media_type(Some(DOCKER_LIST), br#"{"manifests":[]}"#).as_deref(), Some(DOCKER_LIST));
        assert_eq!(verified_media_type(None, br#"{"manifests":[]}"#).as_deref(), Some(OCI_INDEX));
        assert_eq!(verified_media_type(Some(OCI_MANIFEST), b"<html>"), None);
        assert!(is_manifest_like("application/vnd.docker.distribution.manifest.v1+prettyjws"));
        assert!(!is_manifest_like("application/javascript") && !is_manifest_like("image/svg+xml"));
    }

    /// Issue 32 (10): JSON without `mediaType` is a manifest only with a manifest's structure.
    #[test]
    fn should_refuse_json_without_media_type_or_manifest_structure() {
        for body in [&br#"{}"#[..], br#"{"layers":[]}"#, br#"{"config":{}}"#, br#"{"hello":"world"}"#, br#"[1,2]"#] {
            assert_eq!(verified_media_type(None, body), None, "{}", String::from_utf8_lossy(body));
            assert_eq!(verified_media_type(Some(OCI_MANIFEST), body), None, "the Content-Type alone never decides");
        }
        let v1 = br#"{"schemaVersion":1,"name":"a","tag":"b","fsLayers":[]}"#;
        assert_eq!(verified_media_type(None, v1).as_deref(), Some(DOCKER_SCHEMA1_SIGNED));
        assert_eq!(verified_media_type(Some(DOCKER_LIST), br#"{"manifests":[]}"#).as_deref(), Some(DOCKER_LIST));
    }

    #[test]
    fn should_accept_anything_without_accept_header() {
        let a = AcceptList::parse([]);
        assert!(a.accepts(OCI_INDEX));
    }

    #[test]
    fn should_parse_comma_lists_and_parameters() {
        let a = AcceptList::parse([
            "application/vnd.docker.distribution.manifest.v2+json; q=0.9, application/vnd.oci.image.manifest.v1+json",
            "application/json",
        ]);
        assert!(a.accepts(DOCKER_MANIFEST));
        assert!(a.accepts(OCI_MANIFEST));
        assert!(!a.accepts(OCI_INDEX));
    }

    #[test]
    fn should_pick_linux_amd64_else_the_first_entry() {
        let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let entry = |c: char, os: &str, arch: &str| {
            format!(r#"{{"digest":"{}","platform":{{"os":"{os}","architecture":"{arch}"}}}}"#, d(c))
        };
        let index = |entries: &[String]| format!(r#"{{"manifests":[{}]}}"#, entries.join(","));
        let cases = [
            (index(&[entry('1', "linux", "arm64"), entry('2', "linux", "amd64")]), Some(d('2'))),
            (index(&[entry('1', "linux", "arm64"), entry('2', "windows", "amd64")]), Some(d('1'))),
            (index(&[]), None),
            ("{\"manifests\":[{\"digest\":\"md5:x\"}]}".to_string(), None),
            ("not json".to_string(), None),
        ];
        for (body, want) in cases {
            assert_eq!(default_platform(body.as_bytes()).map(|d| d.to_string()), want, "{body}");
        }
    }

    #[test]
    fn should_treat_wildcard_as_open() {
        let a = AcceptList::parse(["*/*"]);
        assert!(a.accepts(DOCKER_LIST));
    }

    #[test]
    fn should_infer_media_type_from_body() {
        assert_eq!(declared_media_type(br#"{"schemaVersion":2,"manifests":[]}"#).as_deref(), Some(OCI_INDEX));
        assert_eq!(declared_media_type(br#"{"schemaVersion":2,"layers":[]}"#).as_deref(), Some(OCI_MANIFEST));
        assert_eq!(
            declared_media_type(format!(r#"{{"mediaType":"{DOCKER_LIST}"}}"#).as_bytes()).as_deref(),
            Some(DOCKER_LIST)
        );
        assert_eq!(declared_media_type(b"<html>"), None);
    }
}
