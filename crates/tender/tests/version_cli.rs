//! `tender --version` names the commit the binary was built from and that commit's date (from
//! git in a checkout), `tender completions` and `tender man` print what their shells and `man`
//! read.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::process::Command;

fn tender(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tender")).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(env!("CARGO_MANIFEST_DIR")).env("TZ", "UTC").output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn should_print_the_commit_and_its_date_in_the_version() {
    let (code, out) = tender(&["--version"]);
    assert_eq!(code, 0);
    let out = out.trim();
    assert!(out.starts_with(&format!("tender {} (", env!("CARGO_PKG_VERSION"))), "{out}");
    match (
        git(&["rev-parse", "--short=12", "HEAD"]),
        git(&["log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%d"]),
    ) {
        (Some(rev), Some(date)) => {
            assert_eq!(out, format!("tender {} ({rev} {date})", env!("CARGO_PKG_VERSION")));
        }
        _ => assert!(out.ends_with(')'), "{out}"),
    }
}

#[test]
fn should_print_completions_and_a_man_page() {
    let (code, bash) = tender(&["completions", "bash"]);
    assert_eq!(code, 0);
    assert!(bash.contains("complete") && bash.contains("prefetch") && bash.contains("--image-factory"), "{bash:.200}");
    let (code, zsh) = tender(&["completions", "zsh"]);
    assert_eq!(code, 0);
    assert!(zsh.starts_with("#compdef tender"), "{zsh:.200}");
    let (code, _) = tender(&["completions", "tcsh"]);
    assert_eq!(code, 2, "an unknown shell is a usage error");
    let (code, man) = tender(&["man"]);
    assert_eq!(code, 0);
    assert!(man.contains(".TH tender 1") && man.contains("serve"), "{man:.300}");
}

/// Issue 35 (6): `tender completions bash | head` ends quietly when `head` stops reading (the
/// script is larger than a pipe's buffer, so the write meets the closed pipe).
#[test]
fn should_end_quietly_when_the_reader_stops_reading() {
    use std::io::Read as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_tender"))
        .args(["completions", "bash"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}
