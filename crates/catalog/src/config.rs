//! The `catalog` section of tender's config file, resolved for the server and the CLI.
//!
//! Parsing and the shape rules (G-7 duplicates, G-8 schematic / version) are
//! `tender_render::catalog`'s; this adds what a golden on disk needs: absolute directories,
//! the size in bytes, and a format tender can turn into a raw disk image.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tender_render::catalog::{validate, CatalogConfig, GoldenImage};

use crate::asset::{AssetKind, AssetPath, Compression};
use crate::size::parse_bytes;

/// Formats tender imports: raw disk images, plain or compressed.
pub const FORMATS: [&str; 4] = ["raw.xz", "raw.zst", "raw.gz", "raw"];

/// Where a golden's bytes come from. Part of its identity: none of it may change once the
/// golden exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    pub image_factory: String,
    pub schematic: String,
    pub version: String,
    pub platform: String,
    pub arch: String,
    pub format: String,
}

impl Source {
    /// `<platform>-<arch>.<format>`
    pub fn file_name(&self) -> String {
        format!("{}-{}.{}", self.platform, self.arch, self.format)
    }

    /// The factory asset, parsed by the factory's grammar.
    pub fn asset(&self) -> Result<AssetPath, crate::asset::AssetError> {
        AssetPath::new(&self.schematic, &self.version, &self.file_name())
    }

    /// The asset's compression container (None for a plain `raw`).
    pub fn compression(&self) -> Compression {
        self.asset().map(|a| a.compression()).unwrap_or(Compression::None)
    }
}

/// One catalog entry, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Position in `catalog.images`, for messages (`catalog.images[2]`).
    pub index: usize,
    /// The golden's name: `talos-worker-<schematic>-<version>[-<platform>-<arch>]`.
    pub name: String,
    pub source: Source,
    /// Absolute directory holding the golden.
    pub dir: PathBuf,
    pub storage_class: Option<String>,
    /// `storage` as written, and in bytes: the golden's virtual size when larger than the image.
    pub storage: Option<String>,
    pub storage_bytes: Option<u64>,
}

impl Entry {
    /// `catalog.images[<index>]`
    pub fn key(&self) -> String {
        format!("catalog.images[{}]", self.index)
    }

    /// `<dir>/<name>.raw`
    pub fn golden_path(&self) -> PathBuf {
        golden_path(&self.dir, &self.name)
    }
}

pub fn golden_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.raw"))
}

/// The resolved `catalog` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatalogSettings {
    /// Default directory of goldens (`catalog.dir`, else `<data>/goldens`), absolute.
    pub dir: PathBuf,
    pub entries: Vec<Entry>,
}

impl CatalogSettings {
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }
}

/// A `catalog` section that cannot be used: the key and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct ConfigProblem {
    pub key: String,
    pub message: String,
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Resolve the raw `catalog` value of the config file against the data directory and the
/// configured Image Factory URL.
pub fn resolve(
    raw: Option<&serde_norway::Value>,
    data: &Path,
    image_factory: &str,
) -> Result<CatalogSettings, ConfigProblem> {
    let config: CatalogConfig = match raw {
        None | Some(serde_norway::Value::Null) => CatalogConfig::default(),
        Some(v) => serde_norway::from_value(v.clone()).map_err(|e| ConfigProblem {
            key: "catalog".into(),
            message: format!("{e}; see docs/catalog.md for the catalog keys"),
        })?,
    };
    let goldens = validate(&config).map_err(|r| {
        let rule = r.rule.map(|x| format!("{x}: ")).unwrap_or_default();
        ConfigProblem { key: r.field.clone(), message: format!("{rule}{:?} {}; fix: {}", r.value, r.problem, r.fix) }
    })?;
    let dir = match &config.dir {
        Some(d) if !d.trim().is_empty() => absolute(Path::new(d)),
        _ => absolute(&data.join("goldens")),
    };
    let mut entries = Vec::new();
    for (index, g) in goldens.iter().enumerate() {
        entries.push(entry(index, g, &dir, image_factory)?);
    }
    Ok(CatalogSettings { dir, entries })
}

fn entry(index: usize, g: &GoldenImage, default_dir: &Path, image_factory: &str) -> Result<Entry, ConfigProblem> {
    let at = |k: &str| format!("catalog.images[{index}].{k}");
    let source = Source {
        image_factory: image_factory.to_string(),
        schematic: g.schematic.clone(),
        version: g.version.clone(),
        platform: g.platform.clone(),
        arch: g.arch.clone(),
        format: g.format.clone(),
    };
    if !FORMATS.contains(&g.format.as_str()) {
        return Err(ConfigProblem {
            key: at("format"),
            message: format!(
                "{:?} is not a format tender turns into a raw golden disk; fix: use one of {}",
                g.format,
                FORMATS.join(", ")
            ),
        });
    }
    if !crate::asset::ARCHES.contains(&g.arch.as_str()) {
        return Err(ConfigProblem {
            key: at("arch"),
            message: format!("{:?} is not an architecture the Image Factory builds; fix: use amd64 or arm64", g.arch),
        });
    }
    match source.asset() {
        Ok(AssetPath { kind: AssetKind::Disk { .. }, .. }) => {}
        _ => {
            return Err(ConfigProblem {
                key: at("platform"),
                message: format!(
                    "{:?} is not an Image Factory disk image; fix: use a platform and arch the factory builds, like openstack and amd64",
                    source.file_name()
                ),
            })
        }
    }
    let dir = match &g.dir {
        Some(d) if !d.trim().is_empty() => absolute(Path::new(d)),
        _ => default_dir.to_path_buf(),
    };
    let storage = g.storage.as_ref().map(|q| q.as_str().to_string());
    let storage_bytes = match &storage {
        Some(s) => Some(parse_bytes(s).ok_or_else(|| ConfigProblem {
            key: at("storage"),
            message: format!("{s:?} is not a whole number of bytes; fix: write it like 6Gi, 6144Mi or 6442450944"),
        })?),
        None => None,
    };
    Ok(Entry { index, name: g.name(), source, dir, storage_class: g.storage_class.clone(), storage, storage_bytes })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    const S: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";

    fn check(yaml: &str) -> Result<CatalogSettings, ConfigProblem> {
        let v: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
        resolve(Some(&v), Path::new("/data"), "https://factory.talos.dev/")
    }

    #[test]
    fn should_default_dir_under_data_and_fill_defaults() {
        let c = check(&format!("images:\n  - schematic: {S}\n    version: v1.13.6\n")).unwrap();
        assert_eq!(c.dir, Path::new("/data/goldens"));
        let e = &c.entries[0];
        assert_eq!(e.name, format!("talos-worker-{S}-v1.13.6"));
        assert_eq!(e.golden_path(), Path::new(&format!("/data/goldens/talos-worker-{S}-v1.13.6.raw")));
        assert_eq!(e.source.file_name(), "openstack-amd64.raw.xz");
        assert_eq!(e.source.compression(), Compression::Xz);
        assert_eq!(e.key(), "catalog.images[0]");
    }

    #[test]
    fn should_name_the_key_and_fix_of_a_bad_entry() {
        let cases = [
            (format!("images:\n  - schematic: {S}\n    version: v1.13\n"), "catalog.images[0].version"),
            (
                format!(
                    "images:\n  - schematic: {S}\n    version: v1.13.6\n  - schematic: {S}\n    version: v1.13.6\n"
                ),
                "catalog.images[1].schematic",
            ),
            (
                format!("images:\n  - schematic: {S}\n    version: v1.13.6\n    format: qcow2\n"),
                "catalog.images[0].format",
            ),
            (
                format!("images:\n  - schematic: {S}\n    version: v1.13.6\n    format: raw.tar.gz\n"),
                "catalog.images[0].format",
            ),
            (
                format!("images:\n  - schematic: {S}\n    version: v1.13.6\n    storage: 1.5Gi\n"),
                "catalog.images[0].storage",
            ),
            (format!("images:\n  - schematic: {S}\n    version: v1.13.6\n    arch: x86\n"), "catalog.images[0].arch"),
            ("images:\n  - schematic: a\n    version: v1.0.0\n    colour: red\n".to_string(), "catalog"),
        ];
        for (yaml, key) in cases {
            let e = check(&yaml).expect_err(&yaml);
            assert_eq!(e.key, key, "{yaml}: {e}");
            assert!(e.message.contains("fix") || e.message.contains("see docs"), "{e}");
        }
    }

    #[test]
    fn should_resolve_storage_and_dirs() {
        let c = check(&format!(
            "dir: /goldens\nimages:\n  - schematic: {S}\n    version: v1.13.6\n    storage: 6Gi\n    storageClass: replicated\n  - schematic: {S}\n    version: v1.13.5\n    dir: /elsewhere\n    format: raw.zst\n"
        ))
        .unwrap();
        assert_eq!(c.entries[0].storage_bytes, Some(6 << 30));
        assert_eq!(c.entries[0].dir, Path::new("/goldens"));
        assert_eq!(c.entries[1].dir, Path::new("/elsewhere"));
        assert_eq!(c.entries[1].source.compression(), Compression::Zst);
        assert!(check("").unwrap().entries.is_empty());
    }
}
