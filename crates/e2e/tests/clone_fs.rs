//! `tender clone` on real filesystems: loop-mounted XFS with reflinks and ext4 without. These
//! need root, mkfs.xfs, mkfs.ext4, losetup and qemu-img (scripts/test.sh installs them): a
//! machine without them fails the test, naming what is missing.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

#[path = "../../tender/tests/catalog_support/mod.rs"]
mod catalog_support;

use catalog_support::*;

const MIB: u64 = 1 << 20;

/// The images and the mounts; a machine without root or the tools fails the test, naming them.
fn setup(test: &str, fss: &[Fs]) -> (&'static Images, Vec<Mount>) {
    require(test, mount_unavailable());
    let images = images();
    let mounts = fss.iter().map(|fs| Mount::new(*fs).unwrap_or_else(|e| panic!("{test}: {e}"))).collect();
    (images, mounts)
}

#[test]
fn should_reflink_a_raw_clone_on_the_goldens_filesystem() {
    let (images, m) = setup("should_reflink_a_raw_clone_on_the_goldens_filesystem", &[Fs::XfsReflink]);
    let xfs = &m[0];
    let (_f, bed) = synced_bed(images, Some(xfs.path()));
    let golden = bed.golden("v1.13.6");
    let before = xfs.used();
    let disks: Vec<_> = (0..3).map(|i| xfs.path().join(format!("md0-w{i}.raw"))).collect();
    for (i, d) in disks.iter().enumerate() {
        let o = bed.clone_disk("md0", &format!("w{i}"), "64Mi", d, &[]);
        expect_code(&o, 0);
        assert!(stdout(&o).contains("reflink"), "{}", text(&o));
    }
    let grown = xfs.used() - before;
    assert!(grown < IMAGE_SIZE / 8, "3 reflinks of a {IMAGE_SIZE}-byte golden took {grown} bytes");
    for d in &disks {
        qemu_compare(&golden, d, "raw").unwrap();
        assert_eq!(qemu_info(d)["virtual-size"], 64 * MIB);
        assert_eq!(std::fs::metadata(d).unwrap().len(), 64 * MIB);
        assert_eq!(xattr::get(d, "user.tender.golden").unwrap().unwrap(), bed.gold().as_bytes());
        assert_eq!(xattr::get(d, "user.tender.pool").unwrap().unwrap(), b"md0");
    }
    // A clone is its own disk: writing to it leaves the golden and its siblings alone.
    std::fs::OpenOptions::new().write(true).open(&disks[0]).unwrap().set_len(65 * MIB).unwrap();
    std::fs::write(&disks[1], b"scribbled over").unwrap();
    assert_eq!(sha256_file(&golden), images.sha256);
    qemu_compare(&golden, &disks[2], "raw").unwrap();

    let refs = bed.refs();
    assert_eq!(refs.len(), 3);
    assert!(refs.iter().all(|r| r["method"] == "reflink" && r["format"] == "raw" && r["pool"] == "md0"));
    assert_eq!(bed.golden_view("v1.13.6")["clones"], 3);
}

#[test]
fn should_make_a_qcow2_overlay_backed_by_the_golden_on_any_filesystem() {
    let (images, m) =
        setup("should_make_a_qcow2_overlay_backed_by_the_golden_on_any_filesystem", &[Fs::XfsReflink, Fs::Ext4]);
    let (xfs, ext4) = (&m[0], &m[1]);
    let (_f, bed) = synced_bed(images, Some(xfs.path()));
    let golden = bed.golden("v1.13.6");
    for (fs, mount) in [("xfs", xfs), ("ext4", ext4)] {
        let disk = mount.path().join("md1-w0.qcow2");
        let before = mount.used();
        let o = bed.clone_disk("md1", "w0", "20Gi", &disk, &["--format", "qcow2"]);
        expect_code(&o, 0);
        let grown = mount.used() - before;
        assert!(grown < IMAGE_SIZE / 8, "{fs}: an overlay took {grown} bytes");
        qemu_compare(&golden, &disk, "qcow2").unwrap();
        let info = qemu_info(&disk);
        assert_eq!(info["virtual-size"], 20u64 << 30, "{info}");
        assert_eq!(info["format"], "qcow2");
        assert_eq!(info["backing-filename"], golden.to_str().unwrap(), "{info}");
        assert_eq!(info["backing-filename-format"], "raw");
    }
    // qemu opens the golden under its own user (issue 16): the way to it is open, nothing
    // else in the data directory is.
    std::fs::set_permissions(bed.tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let as_nobody = |args: &[&str]| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(args)
            .output()
            .unwrap()
    };
    let o = as_nobody(&["qemu-img", "info", "--output=json", golden.to_str().unwrap()]);
    assert!(o.status.success(), "another user cannot open the golden: {}", String::from_utf8_lossy(&o.stderr));
    for (what, args) in [("list", "ls"), ("read", "cat")] {
        let target = if args == "ls" { bed.data.clone() } else { bed.data.join("tender-data.json") };
        let o = as_nobody(&[args, target.to_str().unwrap()]);
        assert!(!o.status.success(), "another user could {what} {}", target.display());
    }
}

#[test]
fn should_refuse_raw_clone_across_filesystems() {
    let (images, m) = setup("should_refuse_raw_clone_across_filesystems", &[Fs::XfsReflink, Fs::Ext4]);
    let (xfs, ext4) = (&m[0], &m[1]);
    let (_f, bed) = synced_bed(images, Some(xfs.path()));
    let before = listing(ext4.path());
    let o = bed.clone_disk("md0", "w0", "64Mi", &ext4.path().join("w0.raw"), &[]);
    expect_code(&o, 1);
    let err = String::from_utf8_lossy(&o.stderr);
    for want in ["another filesystem", "not a copy-on-write clone", "--format qcow2", "--allow-copy", &bed.gold()] {
        assert!(err.contains(want), "{err:?} should say {want:?}");
    }
    assert_eq!(listing(ext4.path()), before, "a refusal creates nothing");
    assert!(bed.refs().is_empty());
}

#[test]
fn should_refuse_raw_clone_without_reflink_support() {
    let (images, m) = setup("should_refuse_raw_clone_without_reflink_support", &[Fs::Ext4]);
    let ext4 = &m[0];
    let (_f, bed) = synced_bed(images, Some(ext4.path()));
    let dir = bed.data.join("goldens");
    let before = listing(&dir);
    let o = bed.clone_disk("md0", "w0", "64Mi", &dir.join("w0.raw"), &[]);
    expect_code(&o, 1);
    let err = String::from_utf8_lossy(&o.stderr);
    for want in ["has no reflinks", "EOPNOTSUPP", "--format qcow2", "--allow-copy"] {
        assert!(err.contains(want), "{err:?} should say {want:?}");
    }
    assert_eq!(listing(&dir), before, "a refusal creates nothing, not even the probe's files");
}

#[test]
fn should_copy_a_raw_disk_only_with_allow_copy() {
    let (images, m) = setup("should_copy_a_raw_disk_only_with_allow_copy", &[Fs::XfsReflink, Fs::Ext4]);
    let (xfs, ext4) = (&m[0], &m[1]);
    let (_f, bed) = synced_bed(images, Some(xfs.path()));
    let disk = ext4.path().join("w0.raw");
    let o = bed.clone_disk("md0", "w0", "48Mi", &disk, &["--allow-copy"]);
    expect_code(&o, 0);
    assert!(stdout(&o).contains("copy"), "{}", text(&o));
    qemu_compare(&bed.golden("v1.13.6"), &disk, "raw").unwrap();
    assert_eq!(qemu_info(&disk)["virtual-size"], 48 * MIB);
    assert!(allocated(&disk) < IMAGE_SIZE / 2, "the copy is sparse too");
    assert_eq!(bed.refs()[0]["method"], "copy");
}

#[test]
fn should_print_the_plan_on_dry_run_and_create_nothing() {
    let (images, m) = setup("should_print_the_plan_on_dry_run_and_create_nothing", &[Fs::XfsReflink, Fs::Ext4]);
    let (xfs, ext4) = (&m[0], &m[1]);
    let (_f, bed) = synced_bed(images, Some(xfs.path()));
    let (xb, eb) = (listing(xfs.path()), listing(ext4.path()));
    let o = bed.clone_disk("md0", "w0", "64Mi", &xfs.path().join("w0.raw"), &["--dry-run"]);
    expect_code(&o, 0);
    assert!(stdout(&o).contains("would make reflink"), "{}", text(&o));
    let o = bed.clone_disk("md0", "w0", "64Mi", &ext4.path().join("w0.qcow2"), &["--dry-run", "--format", "qcow2"]);
    expect_code(&o, 0);
    assert!(stdout(&o).contains("would make qcow2 overlay"), "{}", text(&o));
    let o = bed.clone_disk("md0", "w0", "64Mi", &ext4.path().join("w0.raw"), &["--dry-run"]);
    expect_code(&o, 1);
    assert!(String::from_utf8_lossy(&o.stderr).contains("would refuse: "), "{}", text(&o));
    let o = bed.clone_disk("md0", "w0", "64Mi", &ext4.path().join("w0.raw"), &["--dry-run", "--allow-copy"]);
    expect_code(&o, 0);
    assert!(stdout(&o).contains("would make full sparse copy"), "{}", text(&o));
    assert_eq!((listing(xfs.path()), listing(ext4.path())), (xb, eb), "a dry run creates nothing");
    assert!(bed.refs().is_empty());
}
