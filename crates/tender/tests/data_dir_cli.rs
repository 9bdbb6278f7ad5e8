//! Issue 16, low item: `tender serve` keeps its data directory to itself. Files it creates are
//! 0600 whatever the umask it was started with, what an older tender left readable is closed,
//! and the default golden directory stays reachable (traverse only) for qemu, which reads
//! goldens under its own user.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

mod probe_support;
use probe_support::{respond, Fake, Tender};

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn should_keep_the_data_directory_to_itself_but_the_way_to_its_goldens() {
    let upstream = Fake::start(|_| respond(404, &[], ""));
    let tender = Tender::start(&upstream.url());
    let data = tender.dir.path().join("data");
    assert_eq!(mode(&data), 0o711, "others may only pass through, to the goldens");
    assert_eq!(mode(&data.join("goldens")), 0o755, "qemu opens goldens by path");
    let mut private = 0;
    for entry in std::fs::read_dir(&data).unwrap() {
        let p = entry.unwrap().path();
        if p.file_name().unwrap() == "goldens" {
            continue;
        }
        let m = mode(&p);
        assert_eq!(m & 0o077, 0, "{} is {m:o}", p.display());
        private += 1;
    }
    assert!(private >= 2, "the store's own files and directories were looked at");
}
