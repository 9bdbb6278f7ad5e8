//! Where things are: the workspace, the test bed scripts, the binary under test.

use std::path::PathBuf;

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .and_then(|p| p.parent())
        .map(PathBuf::from)
        .expect("crates/e2e sits two levels below the workspace root")
}

/// The test bed scripts: `<workspace root>/scripts/testbed` (or `TENDER_HARNESS`, another
/// directory with the same scripts).
pub fn harness_dir() -> PathBuf {
    let dir = match std::env::var_os("TENDER_HARNESS") {
        Some(d) => PathBuf::from(d),
        None => workspace_root().join("scripts/testbed"),
    };
    assert!(
        dir.join("upstream.sh").is_file() && dir.join("mkimages.sh").is_file(),
        "the test bed is missing: expected upstream.sh and mkimages.sh in {} \
         (scripts/testbed of the repository, or the directory TENDER_HARNESS names)",
        dir.display()
    );
    dir
}

/// One test bed script, checked to exist.
pub fn harness_script(name: &str) -> PathBuf {
    let p = harness_dir().join(name);
    assert!(p.is_file(), "harness script {} is missing", p.display());
    p
}

/// The binary under test: `TENDER_BIN`, else `<target dir>/debug/tender`.
pub fn tender_bin() -> PathBuf {
    let bin = match std::env::var_os("TENDER_BIN") {
        Some(b) => PathBuf::from(b),
        None => {
            let target = std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .map(|t| if t.is_absolute() { t } else { workspace_root().join(t) })
                .unwrap_or_else(|| workspace_root().join("target"));
            target.join("debug/tender")
        }
    };
    assert!(
        bin.is_file(),
        "the tender binary is missing at {}: run cargo build --bin tender first (or set TENDER_BIN)",
        bin.display()
    );
    bin
}
