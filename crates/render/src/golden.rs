//! The golden DataVolumes of the catalog, for `cozy-public` (G-1, G-2, G-3, G-10), and G-9.

use serde_json::{json, Value};

use crate::catalog::{validate, ConfigFile, GoldenImage, DEFAULT_IMAGE_FACTORY};
use crate::clone::CATALOG_NAMESPACE;
use crate::hash::yaml_documents;
use crate::pool::defaults;
use crate::quantity::Quantity;
use crate::rules::{check_factory_url, Refusal, Rule};
use crate::state::ClusterState;
use crate::Error;

/// The golden's size when the entry names none: the Talos 1.13 openstack raw is about 4.15 GiB.
pub const DEFAULT_GOLDEN_STORAGE: &str = "6Gi";

/// Formats CDI imports over HTTP (CDI converts xz and gzip, and reads raw, qcow2, vmdk, vdi,
/// vhd, vhdx and iso images). CDI has no zstd support, so `.zst` is refused.
const CDI_FORMATS: &[&str] =
    &["raw", "raw.xz", "raw.gz", "qcow2", "qcow2.xz", "qcow2.gz", "vmdk", "vdi", "vhd", "vhd.xz", "vhdx", "iso"];

/// Refuse a format CDI cannot import.
fn check_cdi_format(i: usize, g: &GoldenImage) -> Result<(), Refusal> {
    if CDI_FORMATS.contains(&g.format.as_str()) {
        return Ok(());
    }
    let problem = if g.format.split('.').any(|p| p == "zst" || p == "zstd") {
        "is zstd-compressed, which CDI cannot import".to_string()
    } else {
        "is not a disk image format CDI imports".to_string()
    };
    Err(Refusal::input(
        format!("catalog.images[{i}].format"),
        &g.format,
        problem,
        format!("use one of [{}], e.g. raw.xz", CDI_FORMATS.join(", ")),
    ))
}

/// The rendered spec fields G-9 compares with a live golden.
struct GoldenSpec {
    url: String,
    storage: Quantity,
    storage_class: String,
}

fn spec_of(g: &GoldenImage, source: &str) -> Result<GoldenSpec, Refusal> {
    let storage = match &g.storage {
        Some(q) => q.clone(),
        None => Quantity::parse(DEFAULT_GOLDEN_STORAGE)
            .map_err(|p| Refusal::input("storage", DEFAULT_GOLDEN_STORAGE, p, "report this as a bug"))?,
    };
    let storage_class = g.storage_class.clone().unwrap_or_else(|| defaults::STORAGE_CLASS.into());
    Ok(GoldenSpec { url: format!("{source}{}", g.factory_path()), storage, storage_class })
}

/// G-9: an entry whose golden already exists cannot change its URL, size or class (a
/// DataVolume spec cannot be patched in place).
fn check_unchanged(i: usize, g: &GoldenImage, spec: &GoldenSpec, state: &ClusterState) -> Result<(), Refusal> {
    let name = g.name();
    let Some(live) = state.data_volume(CATALOG_NAMESPACE, &name) else {
        return Ok(());
    };
    let mut drift = Vec::new();
    if let Some(url) = &live.http_url {
        if *url != spec.url {
            drift.push(format!("source URL {url:?} -> {:?}", spec.url));
        }
    }
    if let Some(s) = &live.storage {
        let same = Quantity::parse(s).map(|q| q == spec.storage).unwrap_or(false);
        if !same {
            drift.push(format!("storage {s:?} -> {:?}", spec.storage.as_str()));
        }
    }
    let live_class = live.storage_class.clone().unwrap_or_default();
    if live_class != spec.storage_class {
        drift.push(format!("storageClass {live_class:?} -> {:?}", spec.storage_class));
    }
    if drift.is_empty() {
        return Ok(());
    }
    Err(Refusal::new(
        Some(Rule::G9),
        format!("catalog.images[{i}]"),
        name,
        format!("changes a golden that already exists ({}); a DataVolume spec cannot be patched in place", drift.join(", ")),
        "add a new entry (another version or flavor), move the pools onto it, then retire this one; or keep the old values",
    ))
}

/// Build one golden DataVolume.
pub fn golden_data_volume(g: &GoldenImage, source: &str) -> Result<Value, Refusal> {
    let spec = spec_of(g, source)?;
    let mut storage = json!({"resources": {"requests": {"storage": spec.storage.as_str()}}});
    if !spec.storage_class.is_empty() {
        storage["storageClassName"] = Value::String(spec.storage_class);
    }
    Ok(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {
            "name": g.name(),
            "namespace": CATALOG_NAMESPACE,
            "annotations": {
                // Dropping an entry stops managing the golden instead of deleting a clone source.
                "helm.sh/resource-policy": "keep",
                // Import now, not at the first consumer: pools clone it later.
                "cdi.kubevirt.io/storage.bind.immediate.requested": "true",
                "kubernetes-worker-image.cozystack.io/schematic-id": g.schematic,
                "kubernetes-worker-image.cozystack.io/talos-version": g.version,
            },
            "labels": {"app.kubernetes.io/managed-by": "tender"},
        },
        "spec": {
            "contentType": "kubevirt",
            "source": {"http": {"url": spec.url}},
            "storage": storage,
        },
    }))
}

/// Render the catalog's goldens. `source_url` (a tender) wins over the config's
/// `imageFactory`, which wins over the public factory. With `state`, G-9 is checked.
pub fn render_catalog(
    config: &ConfigFile,
    source_url: Option<&str>,
    state: Option<&ClusterState>,
) -> Result<String, Error> {
    let (field, raw) = match (source_url, &config.image_factory) {
        (Some(s), _) => ("--source-url", s.to_string()),
        (None, Some(f)) => ("imageFactory", f.clone()),
        (None, None) => ("imageFactory", DEFAULT_IMAGE_FACTORY.to_string()),
    };
    let source = check_factory_url(field, &raw)?;
    let Some(catalog) = &config.catalog else {
        return Err(Error::Malformed { what: "config file".into(), message: "has no catalog section".into() });
    };
    let images = validate(catalog)?;
    let mut docs = Vec::new();
    for (i, g) in images.iter().enumerate() {
        check_cdi_format(i, g)?;
        if let Some(state) = state {
            check_unchanged(i, g, &spec_of(g, &source)?, state)?;
        }
        docs.push(golden_data_volume(g, &source)?);
    }
    yaml_documents(&docs)
}
