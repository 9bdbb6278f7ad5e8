//! `tender export --spec bundle.yaml`: a bundle declared in a file. The file says what the
//! bundle carries (images, the platforms exported of each index, Talos releases as
//! `talos/kubernetes/schematic` sets, Image Factory OS images, OCI Helm charts); it becomes
//! `tender prefetch`'s selection, and its text is kept in the bundle's `index.json` (covered by
//! the index digest, so by a bundle signature too), where `tender bundle ls` shows it.

use std::path::Path;

use serde::Deserialize;

use crate::exit::{Failure, Result};
use crate::prefetch::{PrefetchArgs, DEFAULT_INSTALLER_REPOSITORY, DEFAULT_SCHEMATIC};

/// Largest spec file read (it is kept in `index.json`).
pub const MAX_SPEC_BYTES: u64 = 256 * 1024;

/// What a bundle carries.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BundleSpec {
    /// `tender.dev/v1alpha1`, when given.
    #[serde(default)]
    pub api_version: Option<String>,
    /// `Bundle`, when given.
    #[serde(default)]
    pub kind: Option<String>,
    /// A name for people (`release-v1.12`).
    #[serde(default)]
    pub name: Option<String>,
    /// The platforms exported of every multi-platform image (default: linux/amd64).
    #[serde(default)]
    pub platforms: Vec<String>,
    /// Image references.
    #[serde(default)]
    pub images: Vec<String>,
    /// Talos releases: each the installer, the kubelet and the OS image of one set.
    #[serde(default)]
    pub talos: Vec<TalosSet>,
    /// Image Factory paths, `/image/<schematic>/<version>/<asset>`.
    #[serde(default)]
    pub os_images: Vec<String>,
    /// OCI Helm charts, `oci://ghcr.io/org/charts/name:1.2.3` (or without `oci://`).
    #[serde(default)]
    pub charts: Vec<String>,
}

/// One Talos release: what `tender prefetch --talos V --kubernetes K --schematic S` selects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TalosSet {
    pub version: String,
    #[serde(default)]
    pub kubernetes: Option<String>,
    #[serde(default)]
    pub schematic: Option<String>,
    /// The OS image's platform (`openstack`, `nocloud`, `metal`); default `openstack`.
    #[serde(default)]
    pub platform: Option<String>,
    #[serde(default)]
    pub arch: Option<String>,
    /// The OS image's format (`raw.xz`, `qcow2`); default `raw.xz`.
    #[serde(default)]
    pub format: Option<String>,
}

/// Read a spec: its text (as kept in the bundle) and its content.
pub fn read(path: &Path) -> Result<(String, BundleSpec)> {
    let shown = path.display();
    let len = std::fs::metadata(path).map_err(|e| Failure::usage(format!("--spec {shown}: {e}")))?.len();
    if len > MAX_SPEC_BYTES {
        return Err(Failure::usage(format!("--spec {shown}: larger than {MAX_SPEC_BYTES} bytes")));
    }
    let text = std::fs::read_to_string(path).map_err(|e| Failure::usage(format!("--spec {shown}: {e}")))?;
    let spec = parse(&text).map_err(|e| Failure::usage(format!("--spec {shown}: {e}")))?;
    Ok((text, spec))
}

/// Parse and check a spec.
pub fn parse(text: &str) -> std::result::Result<BundleSpec, String> {
    let spec: BundleSpec = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    if let Some(k) = spec.kind.as_deref().filter(|k| *k != "Bundle") {
        return Err(format!("kind: {k:?}, expected Bundle"));
    }
    if spec.images.is_empty() && spec.talos.is_empty() && spec.os_images.is_empty() && spec.charts.is_empty() {
        return Err("it declares nothing: list images, talos, osImages or charts".into());
    }
    Ok(spec)
}

/// The spec as `tender prefetch`'s selection: added to what the command line names.
pub fn apply(spec: &BundleSpec, select: &mut PrefetchArgs) -> Result<()> {
    select.images.extend(spec.images.iter().cloned());
    for chart in &spec.charts {
        select.images.push(chart.strip_prefix("oci://").unwrap_or(chart).to_string());
    }
    select.os_images.extend(spec.os_images.iter().cloned());
    if !spec.platforms.is_empty() {
        select.platforms = spec.platforms.clone();
    }
    for (n, set) in spec.talos.iter().enumerate() {
        let mut one = select.preset_only();
        one.talos = Some(set.version.clone());
        one.kubernetes = set.kubernetes.clone();
        one.schematic = set.schematic.clone().unwrap_or_else(|| DEFAULT_SCHEMATIC.to_string());
        one.installer_repository = DEFAULT_INSTALLER_REPOSITORY.to_string();
        if let Some(p) = &set.platform {
            one.os_platform = p.clone();
        }
        one.arch = set.arch.clone().or(one.arch);
        if let Some(f) = &set.format {
            one.format = f.clone();
        }
        if set.version.is_empty() {
            return Err(Failure::usage(format!("--spec: talos[{n}]: no version")));
        }
        select.talos_sets.push(one);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    #[test]
    fn should_read_a_spec_and_refuse_unknown_keys_and_empty_ones() {
        let s = parse(
            "kind: Bundle\nname: r1\nplatforms: [linux/amd64, linux/arm64]\nimages: [alpine:3.20]\n\
             talos:\n- {version: v1.12.0, kubernetes: v1.35.0}\ncharts: [oci://ghcr.io/a/charts/b:1.0.0]\n",
        )
        .unwrap();
        assert_eq!(s.name.as_deref(), Some("r1"));
        assert_eq!(s.talos[0].kubernetes.as_deref(), Some("v1.35.0"));
        assert!(parse("images: [a]\nimagez: [b]\n").unwrap_err().contains("imagez"));
        assert!(parse("name: x\n").unwrap_err().contains("declares nothing"));
        assert!(parse("kind: Pod\nimages: [a]\n").unwrap_err().contains("Bundle"));
    }
}
