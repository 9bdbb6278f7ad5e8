//! Stamps the binary with the commit it was built from, for `tender --version`: its short hash
//! and its date, from git when the source is a checkout, else from `TENDER_REVISION` and
//! `SOURCE_DATE_EPOCH` (a source tree without `.git`, as in a container build). Never the wall
//! clock: the same commit must give the same binary.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TENDER_REVISION");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let git = git_dir(&manifest);
    if git.is_some() {
        for path in watched(&manifest) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    let from_git = git.as_ref().and_then(|_| {
        let rev = git_out(&manifest, &["rev-parse", "--short=12", "HEAD"])?;
        let epoch = git_out(&manifest, &["log", "-1", "--format=%ct", "HEAD"])?.parse::<i64>().ok()?;
        Some((rev, epoch))
    });
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let (revision, epoch) = match from_git {
        Some((rev, epoch)) => (rev, Some(epoch)),
        None => (
            env("TENDER_REVISION").unwrap_or_else(|| "unknown".into()),
            env("SOURCE_DATE_EPOCH").and_then(|e| e.trim().parse::<i64>().ok()),
        ),
    };
    let date = epoch.map(civil_date).unwrap_or_else(|| "unknown date".into());
    println!("cargo:rustc-env=TENDER_REVISION={}", revision.chars().take(40).collect::<String>());
    println!("cargo:rustc-env=TENDER_COMMIT_DATE={date}");
}

/// What a new commit or checkout changes: HEAD, the branch's ref (a loose file, or a line of
/// packed-refs) and, while the ref is packed, the directory a new loose ref will appear in.
/// Only paths that exist: cargo re-runs a build script on every build while a path it watches
/// is missing, and then compiles the binary again (issue 39). Paths come from `git rev-parse
/// --git-path`, so a linked worktree's HEAD and its common refs are both found.
fn watched(manifest: &Path) -> Vec<PathBuf> {
    let git_path = |p: &str| git_out(manifest, &["rev-parse", "--git-path", p]).map(|r| manifest.join(r));
    let mut paths = Vec::new();
    let mut add = |p: Option<PathBuf>| {
        if let Some(p) = p.filter(|p| p.exists()) {
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
    };
    add(git_path("HEAD"));
    add(git_path("packed-refs"));
    if let Some(branch) = git_out(manifest, &["symbolic-ref", "-q", "HEAD"]) {
        match git_path(&branch) {
            Some(loose) if loose.exists() => add(Some(loose)),
            // Packed (or a branch with no commit yet): the nearest existing directory of the
            // ref's path, where the next commit writes the loose ref.
            Some(loose) => add(loose.ancestors().skip(1).find(|d| d.is_dir()).map(Path::to_path_buf)),
            None => {}
        }
    }
    paths
}

/// The checkout's git directory, when the source is one and git is installed.
fn git_dir(manifest: &Path) -> Option<PathBuf> {
    let d = PathBuf::from(git_out(manifest, &["rev-parse", "--absolute-git-dir"])?);
    d.is_dir().then_some(d)
}

fn git_out(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(dir).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// `YYYY-MM-DD` (UTC) of a Unix time: days to a proleptic Gregorian date (Howard Hinnant's
/// civil_from_days).
fn civil_date(epoch: i64) -> String {
    let z = epoch.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
