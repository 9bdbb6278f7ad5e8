//! The Image Factory asset grammar (`crates/catalog/src/asset.rs`), as `/image/...` requests
//! reach it (`crates/server/src/image.rs` parses `uri.path()` with `AssetPath::parse` and the
//! `?filename=` value with `safe_filename`).
//!
//! Properties: a parsed path prints back to exactly the request path (and its three parts,
//! key and display agree with it); no part is empty, `.`, `..`, or holds a `/`, `%`, `\` or a
//! control character; the asset name is printed back from its parsed kind alone, so the
//! grammar is unambiguous (one name, one meaning); the compression follows the kind;
//! `AssetPath::new` on the parts agrees with `parse`. A download file name that passes is a
//! plain ASCII name that cannot leave a `Content-Disposition` header or a directory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tender_fuzz::asset::{parse_asset, safe_filename, AssetKind, AssetPath, Compression};

fn sb(secureboot: bool) -> &'static str {
    if secureboot {
        "-secureboot"
    } else {
        ""
    }
}

/// The asset name a kind stands for, printed independently of the parser.
fn print_kind(kind: &AssetKind) -> String {
    match kind {
        AssetKind::Disk { platform, arch, secureboot, format, compression } => {
            let ext = match compression {
                Compression::None => "",
                Compression::Xz => ".xz",
                Compression::Gz => ".gz",
                Compression::Zst => ".zst",
                Compression::TarGz => ".tar.gz",
            };
            format!("{platform}-{arch}{}.{format}{ext}", sb(*secureboot))
        }
        AssetKind::Iso { platform, arch, secureboot } => format!("{platform}-{arch}{}.iso", sb(*secureboot)),
        AssetKind::Uki { platform, arch, secureboot } => format!("{platform}-{arch}{}-uki.efi", sb(*secureboot)),
        AssetKind::Kernel { arch } => format!("kernel-{arch}"),
        AssetKind::Initramfs { arch } => format!("initramfs-{arch}.xz"),
        AssetKind::Cmdline { platform, arch, secureboot } => format!("cmdline-{platform}-{arch}{}", sb(*secureboot)),
        AssetKind::Installer { platform: None, arch, secureboot } => format!("installer-{arch}{}.tar", sb(*secureboot)),
        AssetKind::Installer { platform: Some(p), arch, secureboot } => {
            format!("{p}-installer-{arch}{}.tar", sb(*secureboot))
        }
    }
}

fn plain_part(path: &str, part: &str) {
    assert!(!part.is_empty() && part != "." && part != "..", "{path:?}: part {part:?}");
    assert!(
        !part.bytes().any(|b| matches!(b, b'/' | b'%' | b'\\') || b.is_ascii_control() || !b.is_ascii()),
        "{path:?}: part {part:?} holds a separator, an escape or a control character"
    );
}

fn check_path(path: &str) {
    let Ok(p) = AssetPath::parse(path) else { return };
    assert_eq!(p.path(), path, "a parsed path prints as the request path");
    assert_eq!(format!("/image/{p}"), path);
    assert_eq!(p.key(), format!("image:{p}"));
    for part in [&p.schematic, &p.version, &p.asset] {
        plain_part(path, part);
    }
    assert_eq!(AssetPath::new(&p.schematic, &p.version, &p.asset).as_ref(), Ok(&p));
    assert_eq!(parse_asset(&p.asset).as_ref(), Some(&p.kind));
    assert_eq!(print_kind(&p.kind), p.asset, "{path:?}: the asset name is its kind, printed");
    let want = match &p.kind {
        AssetKind::Disk { compression, .. } => *compression,
        AssetKind::Initramfs { .. } => Compression::Xz,
        _ => Compression::None,
    };
    assert_eq!(p.compression(), want);
    let (AssetKind::Disk { arch, .. }
    | AssetKind::Iso { arch, .. }
    | AssetKind::Uki { arch, .. }
    | AssetKind::Kernel { arch }
    | AssetKind::Initramfs { arch }
    | AssetKind::Cmdline { arch, .. }
    | AssetKind::Installer { arch, .. }) = &p.kind;
    assert!(arch == "amd64" || arch == "arm64", "{path:?}: arch {arch:?}");
}

fn check_asset(a: &str) {
    if let Some(kind) = parse_asset(a) {
        assert_eq!(print_kind(&kind), a, "the asset name is its kind, printed");
        plain_part(a, a);
    }
}

fn check_filename(name: &str) {
    let Some(f) = safe_filename(name) else { return };
    assert_eq!(f, name);
    assert!(!f.is_empty() && f.len() <= 255 && f != "." && f != "..");
    assert!(f.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')), "{f:?}");
}

fuzz_target!(|data: &[u8]| {
    let Some(s) = tender_fuzz::text(data) else { return };
    check_path(s);
    check_asset(s);
    check_filename(s);
    // Spare the fuzzer finding a valid schematic and version: try the input as the asset part
    // and as the tail after a valid schematic.
    check_path(&format!("/image/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba/v1.13.6/{s}"));
    check_path(&format!("/image/{s}"));
});
