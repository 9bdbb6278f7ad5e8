//! `tender clone`'s refusals and non-refusals that do not depend on the filesystem (qcow2
//! overlays, and raw disks with --allow-copy), `catalog refs` and `catalog rm` with clones.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

#[path = "../../tender/tests/catalog_support/mod.rs"]
mod catalog_support;

use std::time::Duration;

use catalog_support::*;

fn setup(test: &str) -> &'static Images {
    require(test, missing_tools(&["qemu-img"]));
    images()
}

#[test]
fn should_refuse_a_missing_golden() {
    let images = setup("should_refuse_a_missing_golden");
    let (_f, bed) = synced_bed(images, None);
    let o = bed.run(&[
        "clone",
        &bed.golden_name("v1.99.0"),
        "--pool",
        "md0",
        "--worker",
        "w0",
        "--size",
        "1Gi",
        "--to",
        bed.tmp.path().join("w0.raw").to_str().unwrap(),
    ]);
    expect_code(&o, 1);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("does not exist") && err.contains("tender catalog sync"), "{err}");
    assert!(!bed.tmp.path().join("w0.raw").exists());
    // A golden whose file went away is as missing.
    std::fs::remove_file(bed.golden("v1.13.6")).unwrap();
    let o = bed.clone_disk("md0", "w0", "1Gi", &bed.tmp.path().join("w0.qcow2"), &["--format", "qcow2"]);
    expect_code(&o, 1);
    assert!(String::from_utf8_lossy(&o.stderr).contains("is gone"), "{}", text(&o));
}

#[test]
fn should_refuse_a_failed_golden() {
    let images = setup("should_refuse_a_failed_golden");
    let f = FakeFactory::start();
    f.put("v1.13.6", "openstack-amd64.raw.xz", images.xz.clone());
    f.set_down(true);
    let bed = Bed::new(&f.url());
    bed.config(&[Image { version: "v1.13.6", format: "raw.xz", extra: "" }], "");
    expect_code(&bed.run(&["catalog", "sync"]), 3);
    let disk = bed.tmp.path().join("w0.qcow2");
    let o = bed.clone_disk("md0", "w0", "1Gi", &disk, &["--format", "qcow2"]);
    expect_code(&o, 1);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("failed to import") && err.contains("--retry-failed"), "{err}");
    assert!(!disk.exists());
}

#[test]
fn should_refuse_a_size_smaller_than_the_golden_and_accept_an_equal_one() {
    let images = setup("should_refuse_a_size_smaller_than_the_golden_and_accept_an_equal_one");
    let (_f, bed) = synced_bed(images, None);
    let disk = bed.tmp.path().join("w0.qcow2");
    let o = bed.clone_disk("md0", "w0", "16Mi", &disk, &["--format", "qcow2"]);
    expect_code(&o, 1);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("smaller than golden") && err.contains(&format!("--size {IMAGE_SIZE} or more")), "{err}");
    assert!(!disk.exists());
    let o = bed.clone_disk("md0", "w0", &IMAGE_SIZE.to_string(), &disk, &["--format", "qcow2"]);
    expect_code(&o, 0);
    assert_eq!(qemu_info(&disk)["virtual-size"], IMAGE_SIZE);
    qemu_compare(&bed.golden("v1.13.6"), &disk, "qcow2").unwrap();
}

#[test]
fn should_wait_for_a_golden_still_importing() {
    let images = setup("should_wait_for_a_golden_still_importing");
    let f = FakeFactory::start();
    f.put("v1.13.6", "openstack-amd64.raw.xz", images.xz.clone());
    f.set_drip(Some((32 << 10, Duration::from_millis(20))));
    let bed = Bed::new(&f.url());
    bed.config(&[Image { version: "v1.13.6", format: "raw.xz", extra: "" }], "");
    let disk = bed.tmp.path().join("w0.qcow2");

    // A server imports it: the clone waits, saying so, and then makes the disk.
    let server = bed.serve();
    eventually(Duration::from_secs(20), "the import to start", || f.bytes_sent() > 0);
    let o = bed.clone_disk("md0", "w0", "1Gi", &disk, &["--format", "qcow2", "--wait", "60s"]);
    expect_code(&o, 0);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("waiting for the import") && err.contains("ImportInProgress"), "{}", text(&o));
    qemu_compare(&bed.golden("v1.13.6"), &disk, "qcow2").unwrap();
    server.stop();

    // Configured but not imported, and no server to import it: nothing to wait for.
    bed.config(
        &[
            Image { version: "v1.13.6", format: "raw.xz", extra: "" },
            Image { version: "v1.13.5", format: "raw.xz", extra: "" },
        ],
        "",
    );
    let gold5 = bed.golden_name("v1.13.5");
    let o = bed.run(&[
        "clone",
        &gold5,
        "--pool",
        "md0",
        "--worker",
        "w1",
        "--size",
        "1Gi",
        "--format",
        "qcow2",
        "--to",
        bed.tmp.path().join("w1.qcow2").to_str().unwrap(),
    ]);
    expect_code(&o, 3);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no tender holds"), "{}", text(&o));
}

#[test]
fn should_leave_an_existing_raw_disk_untouched_even_after_the_golden_is_gone() {
    let images = setup("should_leave_an_existing_raw_disk_untouched_even_after_the_golden_is_gone");
    let (_f, bed) = synced_bed(images, None);
    let disk = bed.tmp.path().join("md0-w0.raw");
    expect_code(&bed.clone_disk("md0", "w0", "64Mi", &disk, &["--allow-copy"]), 0);
    let mtime = std::fs::metadata(&disk).unwrap().modified().unwrap();

    let o = bed.clone_disk("md0", "w0", "64Mi", &disk, &["--allow-copy"]);
    expect_code(&o, 0);
    assert!(stdout(&o).contains("left untouched"), "{}", text(&o));
    // The pool is its exact name: md0-gpu is not md0.
    let o = bed.clone_disk("md0-gpu", "w0", "64Mi", &disk, &["--allow-copy"]);
    expect_code(&o, 1);
    assert!(String::from_utf8_lossy(&o.stderr).contains("for pool md0"), "{}", text(&o));
    let o = bed.clone_disk("md", "w0", "64Mi", &disk, &["--allow-copy"]);
    expect_code(&o, 1);

    expect_code(&bed.run(&["catalog", "rm", &bed.gold(), "--force"]), 0);
    let o = bed.clone_disk("md0", "w0", "64Mi", &disk, &["--allow-copy"]);
    expect_code(&o, 0);
    assert!(stdout(&o).contains("left untouched"), "{}", text(&o));
    assert_eq!(std::fs::metadata(&disk).unwrap().modified().unwrap(), mtime);
    // An unknown file is never taken over.
    let stranger = bed.tmp.path().join("stranger.raw");
    std::fs::write(&stranger, b"x").unwrap();
    let o = bed.clone_disk("md0", "w1", "64Mi", &stranger, &["--allow-copy"]);
    expect_code(&o, 1);
    assert!(String::from_utf8_lossy(&o.stderr).contains("tender has no record of it"), "{}", text(&o));
}

#[test]
fn should_fail_a_qcow2_overlay_whose_golden_is_gone() {
    let images = setup("should_fail_a_qcow2_overlay_whose_golden_is_gone");
    let (_f, bed) = synced_bed(images, None);
    let disk = bed.tmp.path().join("md0-w0.qcow2");
    expect_code(&bed.clone_disk("md0", "w0", "1Gi", &disk, &["--format", "qcow2"]), 0);
    let o = bed.clone_disk("md0", "w0", "1Gi", &disk, &["--format", "qcow2"]);
    expect_code(&o, 0);
    assert!(stdout(&o).contains("left untouched"), "{}", text(&o));
    std::fs::remove_file(bed.golden("v1.13.6")).unwrap();
    let o = bed.clone_disk("md0", "w0", "1Gi", &disk, &["--format", "qcow2"]);
    expect_code(&o, 1);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("qcow2 overlay") && err.contains("is gone") && err.contains("cannot be read"), "{err}");
}

#[test]
fn should_refuse_rm_while_clones_depend_on_the_golden() {
    let images = setup("should_refuse_rm_while_clones_depend_on_the_golden");
    let (_f, bed) = synced_bed(images, None);
    let overlay = bed.tmp.path().join("md0-w0.qcow2");
    let raw = bed.tmp.path().join("md1-w0.raw");
    expect_code(&bed.clone_disk("md0", "w0", "1Gi", &overlay, &["--format", "qcow2"]), 0);
    expect_code(&bed.clone_disk("md1", "w0", "64Mi", &raw, &["--allow-copy"]), 0);
    assert_eq!(bed.golden_view("v1.13.6")["clones"], 2);

    for force in [false, true] {
        let mut args = vec!["catalog", "rm"];
        let gold = bed.gold();
        args.push(&gold);
        if force {
            args.push("--force");
        }
        let o = bed.run(&args);
        expect_code(&o, 1);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("qcow2 overlay") && err.contains(overlay.to_str().unwrap()), "force={force}: {err}");
        assert!(bed.golden("v1.13.6").exists());
    }

    // The overlay goes away: refs flags it, --prune forgets it.
    std::fs::remove_file(&overlay).unwrap();
    let o = bed.run(&["catalog", "refs", &bed.gold()]);
    expect_code(&o, 0);
    assert!(stdout(&o).contains("MISSING") && stdout(&o).contains("present"), "{}", text(&o));
    let refs = bed.refs();
    assert_eq!(refs.iter().filter(|r| r["exists"] == false).count(), 1);
    expect_code(&bed.run(&["catalog", "refs", &bed.gold(), "--prune"]), 0);
    assert_eq!(bed.refs().len(), 1);

    // Only a raw clone left: rm names it and asks for --force.
    let o = bed.run(&["catalog", "rm", &bed.gold()]);
    expect_code(&o, 1);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("raw clone") && err.contains(raw.to_str().unwrap()) && err.contains("--force"), "{err}");
    let o = bed.run(&["catalog", "rm", &bed.gold(), "--force"]);
    expect_code(&o, 0);
    assert!(!bed.golden("v1.13.6").exists());
    assert!(raw.exists(), "the raw clone stays");
}
