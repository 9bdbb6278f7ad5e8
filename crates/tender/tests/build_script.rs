//! `crates/tender/build.rs` stamps the binary with its commit and must not make cargo compile it
//! again when nothing changed (issue 39): in a checkout with loose refs and no `packed-refs`,
//! with packed refs and no loose one, and with no `.git` at all, a second build is fresh; a new
//! commit still re-stamps it. The real build script, in a small crate of its own (it needs only
//! std), built by the cargo running this test.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::path::{Path, PathBuf};
use std::process::Command;

const BUILD_RS: &str = include_str!("../build.rs");

struct Stamp {
    _dir: tempfile::TempDir,
    root: PathBuf,
    target: PathBuf,
}

impl Stamp {
    /// The crate, with `git init` and one commit when `git`.
    fn new(git: bool) -> Stamp {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("stamp");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(
            root.join("Cargo.toml"),
            "[package]\nname = \"stamp\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[workspace]\n",
        )
        .unwrap();
        std::fs::write(root.join("build.rs"), BUILD_RS).unwrap();
        std::fs::write(
            root.join("src/main.rs"),
            "fn main() { println!(\"{} {}\", env!(\"TENDER_REVISION\"), env!(\"TENDER_COMMIT_DATE\")); }\n",
        )
        .unwrap();
        let target = dir.path().join("target");
        let s = Stamp { _dir: dir, root, target };
        if git {
            s.git(&["init", "-q"]);
            s.commit("first");
        }
        s
    }

    fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(["-c", "init.defaultBranch=main", "-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(&self.root)
            .output()
            .expect("git runs");
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn commit(&self, message: &str) {
        std::fs::write(self.root.join("NOTES"), message).unwrap();
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "-m", message]);
    }

    /// `cargo build -v`: whether anything ran (the build script or the compiler), and what the
    /// binary says.
    fn build(&self) -> (bool, String) {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args(["build", "-v", "--offline"])
            .arg("--manifest-path")
            .arg(self.root.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", &self.target)
            .env_remove("TENDER_REVISION")
            .env_remove("SOURCE_DATE_EPOCH")
            .env_remove("RUSTC_WRAPPER")
            .output()
            .expect("cargo runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "cargo build: {stderr}");
        // `Running` a build script or rustc: anything but `Fresh`
        let compiled = stderr.lines().any(|l| l.trim_start().starts_with("Running"));
        let bin = Command::new(self.target.join("debug/stamp")).output().unwrap();
        (compiled, String::from_utf8(bin.stdout).unwrap().trim().to_string())
    }

    fn head(&self) -> String {
        self.git(&["rev-parse", "--short=12", "HEAD"])
    }

    fn exists(&self, rel: &str) -> bool {
        Path::new(&self.root).join(rel).exists()
    }
}

#[test]
fn should_build_nothing_twice_with_loose_refs_and_no_packed_refs() {
    let s = Stamp::new(true);
    assert!(!s.exists(".git/packed-refs") && s.exists(".git/refs/heads/main"), "the checkout under test");
    let (compiled, says) = s.build();
    assert!(compiled);
    assert!(says.starts_with(&s.head()), "{says}");
    assert!(!s.build().0, "a second build with no change compiled the crate again");
    s.commit("second");
    let (compiled, says) = s.build();
    assert!(compiled, "a new commit re-stamps the binary");
    assert!(says.starts_with(&s.head()), "{says}");
    assert!(!s.build().0);
}

#[test]
fn should_build_nothing_twice_with_packed_refs_and_see_the_next_commit() {
    let s = Stamp::new(true);
    s.build();
    s.git(&["pack-refs", "--all"]);
    assert!(s.exists(".git/packed-refs") && !s.exists(".git/refs/heads/main"), "the checkout under test");
    s.build();
    assert!(!s.build().0, "a second build with packed refs compiled the crate again");
    // The next commit writes a loose ref into the (watched) refs directory.
    s.commit("second");
    let (compiled, says) = s.build();
    assert!(compiled, "a commit on top of packed refs re-stamps the binary");
    assert!(says.starts_with(&s.head()), "{says}");
    assert!(!s.build().0);
    // and a gc that packs the new ref again changes nothing the binary says
    s.git(&["pack-refs", "--all"]);
    let (_, says) = s.build();
    assert!(says.starts_with(&s.head()), "{says}");
    assert!(!s.build().0);
}

#[test]
fn should_build_nothing_twice_without_git() {
    let s = Stamp::new(false);
    let (compiled, says) = s.build();
    assert!(compiled);
    assert!(says.starts_with("unknown"), "{says}");
    assert!(!s.build().0, "a second build outside a checkout compiled the crate again");
}
