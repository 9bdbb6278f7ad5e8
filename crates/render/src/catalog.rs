//! The golden catalog section of tender's config file, and its rules (G-7, G-8). Pure
//! functions, shared by the renderer and the server.
//!
//! ```yaml
//! imageFactory: https://factory.talos.dev
//! catalog:
//!   dir: ./goldens
//!   images:
//!     - schematic: ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515
//!       version: v1.13.6
//!       # optional: platform (openstack), arch (amd64), format (raw.xz), dir,
//!       # storageClass, storage (the golden DataVolume's size)
//! ```
//!
//! The file as a whole tolerates keys it does not know (the server owns them); the `catalog`
//! section is strict.

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::quantity::{IntOrString, Quantity};
use crate::rules::{check_schematic, check_version, Refusal, Rule};
use crate::Error;

pub const DEFAULT_PLATFORM: &str = "openstack";
pub const DEFAULT_ARCH: &str = "amd64";
pub const DEFAULT_FORMAT: &str = "raw.xz";
pub const DEFAULT_IMAGE_FACTORY: &str = "https://factory.talos.dev";

/// The parts of tender's config file the catalog reads. Other top-level keys are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigFile {
    /// Also read as Cozystack spells it, `imageFactoryURL`.
    #[serde(default, alias = "imageFactoryURL")]
    pub image_factory: Option<String>,
    #[serde(default)]
    pub catalog: Option<CatalogConfig>,
    /// The registries tender mirrors (only their names are read here).
    #[serde(default)]
    pub upstreams: Vec<UpstreamName>,
    /// The signature policy (issue 34), as `tender serve` reads it: `render cozystack` turns the
    /// fallback off for the registries it refuses images of.
    #[serde(default)]
    pub image_verification: Option<tender_verify::policy::RawPolicy>,
}

/// An entry of `upstreams`: its name is the registry host it mirrors.
#[derive(Debug, Clone, Deserialize)]
pub struct UpstreamName {
    pub name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CatalogConfig {
    #[serde(default)]
    pub dir: Option<String>,
    #[serde(default)]
    pub images: Vec<CatalogImage>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CatalogImage {
    /// Also read as Cozystack spells it, `schematicID`.
    #[serde(alias = "schematicID")]
    pub schematic: String,
    pub version: String,
    #[serde(default)]
    pub platform: Option<String>,
    #[serde(default)]
    pub arch: Option<String>,
    #[serde(default)]
    pub format: Option<String>,
    #[serde(default)]
    pub dir: Option<String>,
    #[serde(default)]
    pub storage_class: Option<String>,
    #[serde(default)]
    pub storage: Option<IntOrString>,
}

/// A validated catalog entry.
#[derive(Debug, Clone)]
pub struct GoldenImage {
    pub schematic: String,
    pub version: String,
    pub platform: String,
    pub arch: String,
    pub format: String,
    pub dir: Option<String>,
    /// As written; `None` means the renderer's default, `Some("")` the cluster default.
    pub storage_class: Option<String>,
    pub storage: Option<Quantity>,
}

impl GoldenImage {
    /// `talos-worker-<schematic>-<version>`, suffixed `-<platform>-<arch>` only when either is
    /// not the default (so the default flavor keeps the name pools rebuild, G-2).
    pub fn name(&self) -> String {
        let base = crate::pool::golden_name(&self.schematic, &self.version);
        if self.platform == DEFAULT_PLATFORM && self.arch == DEFAULT_ARCH {
            base
        } else {
            format!("{base}-{}-{}", self.platform, self.arch)
        }
    }

    /// `<platform>-<arch>.<format>`, the Image Factory file name.
    pub fn file_name(&self) -> String {
        format!("{}-{}.{}", self.platform, self.arch, self.format)
    }

    /// `/image/<schematic>/<version>/<file>`, the path under an Image Factory (or tender).
    pub fn factory_path(&self) -> String {
        format!("/image/{}/{}/{}", self.schematic, self.version, self.file_name())
    }
}

/// Parse the config file: unknown top-level keys tolerated, `catalog` strict.
pub fn parse_config(text: &str) -> Result<ConfigFile, Error> {
    serde_norway::from_str::<Option<ConfigFile>>(text)
        .map(Option::unwrap_or_default)
        .map_err(|e| Error::Malformed { what: "config file".into(), message: crate::yaml::humane(&e.to_string()) })
}

fn word(field: &str, value: &str) -> Result<(), Refusal> {
    let ok =
        !value.is_empty() && value.len() <= 32 && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        return Ok(());
    }
    Err(Refusal::input(
        field,
        value,
        "is not lowercase alphanumeric",
        "use the Image Factory's spelling, e.g. openstack, amd64",
    ))
}

/// Validate the entries (G-7, G-8, shapes) and fill in the defaults.
pub fn validate(catalog: &CatalogConfig) -> Result<Vec<GoldenImage>, Refusal> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, e) in catalog.images.iter().enumerate() {
        let at = format!("catalog.images[{i}].");
        check_schematic(Rule::G8, &format!("{at}schematic"), &e.schematic)?;
        check_version(Rule::G8, &format!("{at}version"), &e.version)?;
        let platform = e.platform.clone().unwrap_or_else(|| DEFAULT_PLATFORM.into());
        let arch = e.arch.clone().unwrap_or_else(|| DEFAULT_ARCH.into());
        let format = e.format.clone().unwrap_or_else(|| DEFAULT_FORMAT.into());
        word(&format!("{at}platform"), &platform)?;
        word(&format!("{at}arch"), &arch)?;
        let format_ok = !format.is_empty()
            && format.len() <= 32
            && format
                .split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        if !format_ok {
            return Err(Refusal::input(
                format!("{at}format"),
                &format,
                "is not a file format like raw.xz",
                "use raw.xz, qcow2, ...",
            ));
        }
        if let Some(sc) = &e.storage_class {
            if !sc.is_empty() && !crate::rules::is_dns_subdomain(sc) {
                return Err(Refusal::input(
                    format!("{at}storageClass"),
                    sc,
                    "is not a StorageClass name",
                    "use a DNS-1123 subdomain, or \"\" for the cluster default",
                ));
            }
        }
        let storage = match &e.storage {
            Some(s) => Some(Quantity::parse(&s.0).map_err(|problem| {
                Refusal::input(
                    format!("{at}storage"),
                    &s.0,
                    format!("is not a quantity: it {problem}"),
                    "write it like 6Gi",
                )
            })?),
            None => None,
        };
        if let Some(dir) = &e.dir {
            crate::rules::check_no_control(&format!("{at}dir"), dir)?;
        }
        let golden = GoldenImage {
            schematic: e.schematic.clone(),
            version: e.version.clone(),
            platform: platform.clone(),
            arch: arch.clone(),
            format: String::new(),
            dir: None,
            storage_class: None,
            storage: None,
        }
        .name();
        let longest = if e.schematic.len() >= e.version.len() { "schematic" } else { "version" };
        crate::rules::check_name_length(
            Some(Rule::G8),
            &format!("{at}{longest}"),
            &golden,
            "golden DataVolume name (a DNS-1123 subdomain)",
            crate::rules::DNS_SUBDOMAIN_MAX,
        )?;
        let key = (e.schematic.clone(), e.version.clone(), platform.clone(), arch.clone());
        if !seen.insert(key) {
            return Err(Refusal::new(
                Some(Rule::G7),
                format!("{at}schematic"),
                format!("{} {} {platform}-{arch}", e.schematic, e.version),
                "duplicates an earlier entry; both would render the same golden and the later would silently win",
                "drop the duplicate, or give the flavors distinct (schematic, version, platform, arch)",
            ));
        }
        out.push(GoldenImage {
            schematic: e.schematic.clone(),
            version: e.version.clone(),
            platform,
            arch,
            format,
            dir: e.dir.clone(),
            storage_class: e.storage_class.clone(),
            storage,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    fn entry(schematic: &str, version: &str) -> CatalogImage {
        CatalogImage {
            schematic: schematic.into(),
            version: version.into(),
            platform: None,
            arch: None,
            format: None,
            dir: None,
            storage_class: None,
            storage: None,
        }
    }

    #[test]
    fn should_tolerate_unknown_top_level_keys_but_not_in_catalog() {
        let ok = parse_config("listen: :5000\nimageFactory: https://f\ncatalog:\n  images: []\n").unwrap();
        assert_eq!(ok.image_factory.as_deref(), Some("https://f"));
        assert!(parse_config("catalog:\n  imgaes: []\n").is_err());
        assert!(parse_config("catalog:\n  images:\n  - schematic: a\n    version: v1.0.0\n    colour: red\n").is_err());
        assert!(parse_config("").unwrap().catalog.is_none());
    }

    #[test]
    fn should_suffix_platform_and_arch_only_when_not_default() {
        let mut e = entry("abc", "v1.13.6");
        let g = validate(&CatalogConfig { dir: None, images: vec![e.clone()] }).unwrap();
        assert_eq!(g[0].name(), "talos-worker-abc-v1.13.6");
        assert_eq!(g[0].factory_path(), "/image/abc/v1.13.6/openstack-amd64.raw.xz");
        e.arch = Some("arm64".into());
        let g = validate(&CatalogConfig { dir: None, images: vec![e] }).unwrap();
        assert_eq!(g[0].name(), "talos-worker-abc-v1.13.6-openstack-arm64");
    }

    proptest! {
        #[test]
        fn should_accept_exactly_lowercase_alphanumeric_schematics(s in "\\PC{0,16}") {
            let ok = !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
            let r = validate(&CatalogConfig { dir: None, images: vec![entry(&s, "v1.13.6")] });
            prop_assert_eq!(r.is_ok(), ok);
        }

        #[test]
        fn should_accept_exactly_full_release_versions(v in "v?[0-9.]{0,8}[a-z\\n-]?") {
            let ok = crate::rules::is_release_version(&v);
            let r = validate(&CatalogConfig { dir: None, images: vec![entry("abc", &v)] });
            prop_assert_eq!(r.is_ok(), ok);
        }
    }
}
