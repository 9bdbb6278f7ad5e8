//! The Image Factory's `/image/<schematic>/<version>/<asset>` grammar (see peers.md §6, after
//! image-factory's `ParseFromPath`). Anything outside it is refused before any outbound
//! connection.

use std::fmt;

pub const ARCHES: [&str; 2] = ["amd64", "arm64"];
pub const DISK_FORMATS: [&str; 4] = ["raw", "qcow2", "vhd", "ova"];
/// Longest schematic, version or asset name accepted.
const MAX_PART: usize = 128;

/// The compression container of an asset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    None,
    Xz,
    Gz,
    Zst,
    TarGz,
}

impl Compression {
    /// Whether the container carries its own integrity check (CRC or checksum).
    pub fn has_checksum(self) -> bool {
        !matches!(self, Compression::None)
    }
}

/// What an asset is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AssetKind {
    Disk { platform: String, arch: String, secureboot: bool, format: String, compression: Compression },
    Iso { platform: String, arch: String, secureboot: bool },
    Uki { platform: String, arch: String, secureboot: bool },
    Kernel { arch: String },
    Initramfs { arch: String },
    Cmdline { platform: String, arch: String, secureboot: bool },
    Installer { platform: Option<String>, arch: String, secureboot: bool },
}

/// A validated `/image/...` request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AssetPath {
    pub schematic: String,
    pub version: String,
    pub asset: String,
    pub kind: AssetKind,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssetError {
    #[error("schematic {0:?} is not a lowercase alphanumeric schematic ID")]
    Schematic(String),
    #[error("version {0:?} is not a Talos version like v1.13.6")]
    Version(String),
    #[error("{0:?} is not an Image Factory asset name (see the asset grammar in README)")]
    Asset(String),
    #[error("not an /image/<schematic>/<version>/<asset> path")]
    Shape,
}

fn is_word(s: &str) -> bool {
    !s.is_empty() && s.len() <= 32 && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Platforms are lowercase words joined by single hyphens (`digital-ocean`).
fn is_platform(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.split('-').all(is_word)
}

/// `vMAJOR.MINOR.PATCH` with an optional `-prerelease` of alphanumerics and dots.
pub fn valid_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else { return false };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let nums: Vec<&str> = core.split('.').collect();
    let core_ok =
        nums.len() == 3 && nums.iter().all(|n| !n.is_empty() && n.len() <= 9 && n.bytes().all(|b| b.is_ascii_digit()));
    let pre_ok = pre.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 32
            && p.split('.').all(|x| !x.is_empty() && x.bytes().all(|b| b.is_ascii_alphanumeric()))
    });
    core_ok && pre_ok
}

pub fn valid_schematic(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Split `<platform>-<arch>[-secureboot]` from the end.
fn platform_arch(s: &str) -> Option<(String, String, bool)> {
    let (s, secureboot) = match s.strip_suffix("-secureboot") {
        Some(rest) => (rest, true),
        None => (s, false),
    };
    let (platform, arch) = s.rsplit_once('-')?;
    (ARCHES.contains(&arch) && is_platform(platform)).then(|| (platform.to_string(), arch.to_string(), secureboot))
}

fn arch_secureboot(s: &str) -> Option<(String, bool)> {
    let (s, secureboot) = match s.strip_suffix("-secureboot") {
        Some(rest) => (rest, true),
        None => (s, false),
    };
    ARCHES.contains(&s).then(|| (s.to_string(), secureboot))
}

/// Parse one asset name.
pub fn parse_asset(a: &str) -> Option<AssetKind> {
    if a.len() > MAX_PART {
        return None;
    }
    if let Some(arch) = a.strip_prefix("kernel-") {
        return ARCHES.contains(&arch).then(|| AssetKind::Kernel { arch: arch.to_string() });
    }
    if let Some(arch) = a.strip_prefix("initramfs-").and_then(|r| r.strip_suffix(".xz")) {
        return ARCHES.contains(&arch).then(|| AssetKind::Initramfs { arch: arch.to_string() });
    }
    if let Some(rest) = a.strip_prefix("cmdline-") {
        let (platform, arch, secureboot) = platform_arch(rest)?;
        return Some(AssetKind::Cmdline { platform, arch, secureboot });
    }
    if let Some(rest) = a.strip_suffix(".tar") {
        if let Some(r) = rest.strip_prefix("installer-") {
            let (arch, secureboot) = arch_secureboot(r)?;
            return Some(AssetKind::Installer { platform: None, arch, secureboot });
        }
        if let Some((platform, r)) = rest.split_once("-installer-") {
            let (arch, secureboot) = arch_secureboot(r)?;
            return is_platform(platform).then(|| AssetKind::Installer {
                platform: Some(platform.to_string()),
                arch,
                secureboot,
            });
        }
        return None;
    }
    if let Some(rest) = a.strip_suffix(".iso") {
        let (platform, arch, secureboot) = platform_arch(rest)?;
        return Some(AssetKind::Iso { platform, arch, secureboot });
    }
    if let Some(rest) = a.strip_suffix("-uki.efi") {
        let (platform, arch, secureboot) = platform_arch(rest)?;
        return Some(AssetKind::Uki { platform, arch, secureboot });
    }
    // disk images: <platform>-<arch>[-secureboot].<disk>[<compression>]
    let (stem, ext) = a.split_once('.')?;
    let (platform, arch, secureboot) = platform_arch(stem)?;
    let (format, compression) = match ext.split_once('.') {
        None => (ext, Compression::None),
        Some((f, "xz")) => (f, Compression::Xz),
        Some((f, "gz")) => (f, Compression::Gz),
        Some((f, "zst")) => (f, Compression::Zst),
        Some((f, "tar.gz")) => (f, Compression::TarGz),
        Some(_) => return None,
    };
    DISK_FORMATS.contains(&format).then(|| AssetKind::Disk {
        platform,
        arch,
        secureboot,
        format: format.to_string(),
        compression,
    })
}

impl AssetPath {
    /// Parse the three path parts of `/image/<schematic>/<version>/<asset>`.
    pub fn new(schematic: &str, version: &str, asset: &str) -> Result<AssetPath, AssetError> {
        if !valid_schematic(schematic) {
            return Err(AssetError::Schematic(schematic.to_string()));
        }
        if !valid_version(version) {
            return Err(AssetError::Version(version.to_string()));
        }
        let kind = parse_asset(asset).ok_or_else(|| AssetError::Asset(asset.to_string()))?;
        Ok(AssetPath { schematic: schematic.to_string(), version: version.to_string(), asset: asset.to_string(), kind })
    }

    /// Parse a raw request path `/image/<schematic>/<version>/<asset>` (percent signs are
    /// never valid, so nothing encoded gets through).
    pub fn parse(path: &str) -> Result<AssetPath, AssetError> {
        let rest = path.strip_prefix("/image/").ok_or(AssetError::Shape)?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [s, v, a] => AssetPath::new(s, v, a),
            _ => Err(AssetError::Shape),
        }
    }

    /// The compression container, for disk images; `.xz` initramfs too.
    pub fn compression(&self) -> Compression {
        match &self.kind {
            AssetKind::Disk { compression, .. } => *compression,
            AssetKind::Initramfs { .. } => Compression::Xz,
            _ => Compression::None,
        }
    }

    /// The upstream path.
    pub fn path(&self) -> String {
        format!("/image/{}/{}/{}", self.schematic, self.version, self.asset)
    }

    /// The key of this asset's fill and trust record.
    pub fn key(&self) -> String {
        format!("image:{}/{}/{}", self.schematic, self.version, self.asset)
    }
}

impl fmt::Display for AssetPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.schematic, self.version, self.asset)
    }
}

/// A `?filename=` value made safe for `Content-Disposition`: a plain file name, or none.
pub fn safe_filename(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    ok.then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    const S: &str = "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515";

    /// The contract: peers.md §6's grammar, one row per form.
    #[test]
    fn should_accept_exactly_the_factory_grammar() {
        let accepted = [
            "openstack-amd64.raw.xz",
            "openstack-amd64.raw",
            "metal-arm64.raw.gz",
            "metal-amd64.raw.zst",
            "gcp-amd64.raw.tar.gz",
            "azure-amd64.vhd.xz",
            "exoscale-amd64.qcow2.xz",
            "nocloud-amd64.qcow2",
            "vmware-amd64.ova",
            "digital-ocean-amd64.raw.gz",
            "metal-amd64-secureboot.raw.xz",
            "metal-amd64.iso",
            "metal-amd64-secureboot.iso",
            "metal-amd64-uki.efi",
            "metal-amd64-secureboot-uki.efi",
            "kernel-amd64",
            "kernel-arm64",
            "initramfs-amd64.xz",
            "cmdline-metal-amd64",
            "cmdline-metal-amd64-secureboot",
            "installer-amd64.tar",
            "installer-arm64-secureboot.tar",
            "metal-installer-amd64.tar",
            "metal-installer-amd64-secureboot.tar",
        ];
        for a in accepted {
            assert!(AssetPath::new(S, "v1.13.6", a).is_ok(), "{a} must be accepted");
        }
        let refused = [
            "",
            "openstack-amd64",
            "openstack-x86.raw.xz",
            "openstack-amd64.raw.bz2",
            "openstack-amd64.img",
            "openstack-amd64.raw.xz.sha256",
            "openstack-amd64.raw.xz.sigstore.json",
            "OpenStack-amd64.raw.xz",
            "../amd64.raw.xz",
            "..",
            "openstack-amd64.raw%2exz",
            "openstack--amd64.raw.xz",
            "-amd64.raw.xz",
            "kernel-riscv64",
            "initramfs-amd64",
            "installer-amd64",
            "metal-amd64.iso.xz",
            "openstack-amd64.raw.xz\n",
            "openstack-amd64.raw.xz ",
        ];
        for a in refused {
            assert!(AssetPath::new(S, "v1.13.6", a).is_err(), "{a:?} must be refused");
        }
        let long = format!("{}-amd64.raw.xz", "a".repeat(200));
        assert!(AssetPath::new(S, "v1.13.6", &long).is_err());
    }

    #[test]
    fn should_validate_schematics_and_versions() {
        for v in ["v1.13.6", "v1.10.0", "v1.13.0-beta.1", "v1.13.0-alpha.2", "v10.20.30"] {
            assert!(valid_version(v), "{v}");
        }
        for v in ["1.13.6", "v1.13", "v1.13.6.1", "v1.13.x", "v1.13.6-", "v1..6", "latest", "v1.13.6/../x"] {
            assert!(!valid_version(v), "{v}");
        }
        assert!(valid_schematic(S));
        for s in ["", "ABC", "a/b", "..", &"a".repeat(65), "a-b"] {
            assert!(!valid_schematic(s), "{s}");
        }
    }

    #[test]
    fn should_parse_paths_and_refuse_hostile_ones() {
        let p = AssetPath::parse(&format!("/image/{S}/v1.13.6/openstack-amd64.raw.xz")).expect("valid");
        assert_eq!(p.compression(), Compression::Xz);
        assert_eq!(p.path(), format!("/image/{S}/v1.13.6/openstack-amd64.raw.xz"));
        for bad in [
            "/image/",
            "/image/a/v1.0.0",
            "/image/a/v1.0.0/openstack-amd64.raw.xz/extra",
            "/image/../v1.0.0/openstack-amd64.raw.xz",
            "/image/a/..%2f..%2fetc/openstack-amd64.raw.xz",
            "/image/a%2fb/v1.0.0/openstack-amd64.raw.xz",
            "/image/a//v1.0.0/openstack-amd64.raw.xz",
            "/images/a/v1.0.0/openstack-amd64.raw.xz",
        ] {
            assert!(AssetPath::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn should_sanitise_download_file_names() {
        assert_eq!(safe_filename("talos.raw.xz").as_deref(), Some("talos.raw.xz"));
        for bad in ["", "..", "a/b", "a\"b", "a\r\nSet-Cookie: x", "ä"] {
            assert_eq!(safe_filename(bad), None, "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn should_never_accept_separators_or_dots_alone(s in "[a-z0-9./%-]{0,40}", v in "v[0-9.]{0,8}", a in "[a-z0-9./%-]{0,40}") {
            if let Ok(p) = AssetPath::new(&s, &v, &a) {
                for part in [&p.schematic, &p.version, &p.asset] {
                    prop_assert!(!part.contains('/') && !part.contains('%') && part.as_str() != ".." && part.as_str() != ".");
                }
            }
        }
    }
}
