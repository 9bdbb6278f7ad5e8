//! `tender catalog sync / ls / rm / trust` end to end: the real binary against a fake Image
//! Factory that serves no ranges and answers slowly on a cold asset, with real disk images.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod catalog_support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use catalog_support::*;

const XZ: &str = "openstack-amd64.raw.xz";
const ZST: &str = "openstack-amd64.raw.zst";
const GZ: &str = "openstack-amd64.raw.gz";

fn factory_with(images: &Images) -> FakeFactory {
    let f = FakeFactory::start();
    f.put("v1.13.6", XZ, images.xz.clone());
    f.put("v1.13.5", ZST, images.zst.clone());
    f.put("v1.13.4", GZ, images.gz.clone());
    f
}

fn three() -> Vec<Image<'static>> {
    vec![
        Image { version: "v1.13.6", format: "raw.xz", extra: "" },
        Image { version: "v1.13.5", format: "raw.zst", extra: "" },
        Image { version: "v1.13.4", format: "raw.gz", extra: "storage: 48Mi" },
    ]
}

#[test]
fn should_import_every_entry_once_into_a_sparse_raw_golden() {
    let images = images();
    let f = factory_with(images);
    let bed = Bed::new(&f.url());
    bed.config(&three(), "");

    let o = bed.run(&["catalog", "sync"]);
    expect_code(&o, 0);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("decompress"), "plain progress lines off a terminal: {}", text(&o));
    let total = err.lines().rfind(|l| l.starts_with("catalog sync: ")).unwrap_or_default();
    assert!(total.starts_with("catalog sync: 3/3 objects, "), "a last line for the whole sync: {err}");
    for v in ["v1.13.6", "v1.13.5"] {
        let g = bed.golden(v);
        assert_eq!(sha256_file(&g), images.sha256, "{v}: the golden is the original disk image byte for byte");
        assert!(allocated(&g) < IMAGE_SIZE / 2, "{v}: sparse: {} bytes allocated of {IMAGE_SIZE}", allocated(&g));
        assert_eq!(std::fs::metadata(&g).unwrap().permissions().mode() & 0o222, 0, "{v}: read-only");
    }
    // storage: 48Mi makes the golden 48 MiB: the image, then zeros (as holes).
    let g = bed.golden("v1.13.4");
    let mut want = images.raw.clone();
    want.resize(48 << 20, 0);
    assert_eq!(sha256_file(&g), sha256_hex(&want));
    assert!(allocated(&g) < IMAGE_SIZE / 2);
    for (v, a) in [("v1.13.6", XZ), ("v1.13.5", ZST), ("v1.13.4", GZ)] {
        assert_eq!(f.gets(v, a), 1, "{a}: fetched once");
    }
    assert_eq!(f.state.ranges_seen.load(std::sync::atomic::Ordering::SeqCst), 0);

    let ls = bed.ls();
    let gs = ls["goldens"].as_array().unwrap();
    assert_eq!(gs.len(), 3);
    for g in gs {
        assert_eq!(g["phase"], "Succeeded", "{g}");
        assert_eq!(g["clones"], 0);
        assert!(g["entry"].as_str().unwrap().starts_with("catalog.images["));
    }
    let v6 = bed.golden_view("v1.13.6");
    assert_eq!(v6["virtualSize"], IMAGE_SIZE);
    assert_eq!(v6["sha256"], images.sha256.as_str());
    assert_eq!(bed.golden_view("v1.13.4")["virtualSize"], 48u64 << 20);
    let table = stdout(&bed.run(&["catalog", "ls"]));
    assert!(table.starts_with("NAME") && table.matches("Succeeded").count() == 3, "{table}");

    // Idempotent: a second sync fetches nothing and changes nothing.
    let before = std::fs::metadata(bed.golden("v1.13.6")).unwrap().modified().unwrap();
    let o = bed.run(&["catalog", "sync", "--quiet"]);
    expect_code(&o, 0);
    assert_eq!(String::from_utf8_lossy(&o.stderr), "", "--quiet");
    assert_eq!(stdout(&o).matches("already imported").count(), 3, "{}", text(&o));
    assert_eq!(f.total_gets(), 3);
    assert_eq!(std::fs::metadata(bed.golden("v1.13.6")).unwrap().modified().unwrap(), before);
}

#[test]
fn should_resume_after_kill_9_mid_import() {
    let images = images();
    let f = factory_with(images);
    f.set_drip(Some((32 << 10, Duration::from_millis(25))));
    let bed = Bed::new(&f.url());
    bed.config(&three()[..1], "");

    let mut child = command(["catalog", "sync", "--config"])
        .arg(&bed.config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(20), "the download to be under way", || f.bytes_sent() > (512 << 10));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!bed.golden("v1.13.6").exists(), "nothing visible after a crash");
    assert_eq!(bed.golden_view("v1.13.6")["phase"], "ImportInProgress");
    // As if the crash had also hit a decompression: its temp file is left beside the golden.
    let stale = bed.data.join("goldens").join(format!(".{}.raw.tmp-1-0", bed.golden_name("v1.13.6")));
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    std::fs::write(&stale, b"half a golden").unwrap();

    f.set_drip(None);
    let o = bed.run(&["catalog", "sync"]);
    expect_code(&o, 0);
    assert_eq!(sha256_file(&bed.golden("v1.13.6")), images.sha256, "the resumed golden is right");
    assert!(!stale.exists(), "the interrupted decompression's temp file is gone");
    assert_eq!(f.gets("v1.13.6", XZ), 2, "one interrupted transfer, one resumed");
    assert_eq!(bed.golden_view("v1.13.6")["phase"], "Succeeded");
}

#[test]
fn should_fail_after_its_attempts_and_try_again_with_retry_failed() {
    let images = images();
    let f = factory_with(images);
    f.set_down(true);
    let bed = Bed::new(&f.url());
    bed.config(&three()[..1], "");

    let o = bed.run(&["catalog", "sync"]);
    expect_code(&o, 3); // the factory could not be reached: transient
    assert!(stdout(&o).contains("Failed"), "{}", text(&o));
    let v = bed.golden_view("v1.13.6");
    assert_eq!(v["phase"], "Failed");
    assert_eq!(v["attempts"], 3);
    assert!(v["reason"].as_str().unwrap().contains("attempt 3 of 3"), "{v}");
    assert!(stdout(&bed.run(&["catalog", "ls"])).contains("reason:"));
    let gets = f.total_gets();
    assert_eq!(gets, 6, "3 catalog attempts of 2 fetch attempts each");

    // A Failed golden stays Failed until asked.
    f.set_down(false);
    let o = bed.run(&["catalog", "sync"]);
    expect_code(&o, 3);
    assert!(stdout(&o).contains("--retry-failed"), "{}", text(&o));
    assert_eq!(f.total_gets(), gets);

    let o = bed.run(&["catalog", "sync", "--retry-failed"]);
    expect_code(&o, 0);
    assert_eq!(bed.golden_view("v1.13.6")["phase"], "Succeeded");
    assert_eq!(sha256_file(&bed.golden("v1.13.6")), images.sha256);
}

#[test]
fn should_fail_without_retrying_when_storage_is_smaller_than_the_image() {
    let images = images();
    let f = factory_with(images);
    let bed = Bed::new(&f.url());
    bed.config(&[Image { version: "v1.13.6", format: "raw.xz", extra: "storage: 16Mi" }], "");
    let o = bed.run(&["catalog", "sync"]);
    expect_code(&o, 1);
    let v = bed.golden_view("v1.13.6");
    assert_eq!(v["phase"], "Failed");
    assert_eq!(v["attempts"], 1, "a size problem is not retried");
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.contains("larger than storage 16Mi") && reason.contains("catalog.images[0].storage"), "{reason}");
    assert!(!bed.golden("v1.13.6").exists());
    // Not imported yet, so the entry may change, and the fix is tried at once.
    bed.config(&[Image { version: "v1.13.6", format: "raw.xz", extra: "storage: 32Mi" }], "");
    expect_code(&bed.run(&["catalog", "sync"]), 0);
    assert_eq!(sha256_file(&bed.golden("v1.13.6")), images.sha256);
}

#[test]
fn should_refuse_an_edit_of_an_existing_golden() {
    let images = images();
    let f = factory_with(images);
    let bed = Bed::new(&f.url());
    bed.config(&[Image { version: "v1.13.6", format: "raw.xz", extra: "storage: 32Mi\nstorageClass: replicated" }], "");
    expect_code(&bed.run(&["catalog", "sync"]), 0);

    let other_dir = format!("dir: {}", bed.tmp.path().join("elsewhere").display());
    let edits: Vec<(String, String, &str)> = vec![
        ("storage: 64Mi\nstorageClass: replicated".into(), String::new(), "storage \"32Mi\" -> \"64Mi\""),
        ("storage: 32Mi\nstorageClass: local".into(), String::new(), "storageClass \"replicated\" -> \"local\""),
        (format!("storage: 32Mi\nstorageClass: replicated\n{other_dir}"), String::new(), "dir "),
        ("storage: 32Mi\nstorageClass: replicated".into(), "format".into(), "format \"raw.xz\" -> \"raw.zst\""),
    ];
    for (extra, what, change) in &edits {
        let format = if what == "format" { "raw.zst" } else { "raw.xz" };
        bed.config(&[Image { version: "v1.13.6", format, extra }], "");
        let o = bed.run(&["catalog", "sync"]);
        expect_code(&o, 2);
        let err = String::from_utf8_lossy(&o.stderr);
        for want in ["catalog.images[0]", &bed.golden_name("v1.13.6"), change, "add a new entry", "tender catalog rm"] {
            assert!(err.contains(want), "{change}: {err:?} should say {want:?}");
        }
    }
    // The same size written otherwise is no edit; another factory URL is.
    bed.config(
        &[Image { version: "v1.13.6", format: "raw.xz", extra: "storage: 33554432\nstorageClass: replicated" }],
        "",
    );
    expect_code(&bed.run(&["catalog", "sync"]), 0);
    let moved = format!("{}/mirror", f.url());
    let y = std::fs::read_to_string(&bed.config).unwrap().replace(&f.url(), &moved);
    std::fs::write(&bed.config, y).unwrap();
    let o = bed.run(&["catalog", "sync"]);
    expect_code(&o, 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("imageFactory"), "{}", text(&o));
    // A server refuses to start on it, too (exit 2), naming the entry.
    let o = run(["serve", "--listen", "127.0.0.1:0", "--config", bed.config.to_str().unwrap()]);
    expect_code(&o, 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("catalog.images[0]"), "{}", text(&o));
    // Removing the golden explicitly lets the edit through.
    bed.config(&[Image { version: "v1.13.6", format: "raw.zst", extra: "storage: 32Mi" }], "");
    f.put("v1.13.6", ZST, images.zst.clone());
    expect_code(&bed.run(&["catalog", "rm", &bed.golden_name("v1.13.6")]), 0);
    expect_code(&bed.run(&["catalog", "sync"]), 0);
    assert_eq!(bed.golden_view("v1.13.6")["source"]["format"], "raw.zst");
}

#[test]
fn should_refuse_bad_entries_as_config_errors_naming_the_key() {
    let bed = Bed::new("http://127.0.0.1:9");
    let cases = [
        (
            format!("catalog:\n  images:\n    - schematic: {SCHEMATIC}\n      version: v1.13.6\n    - schematic: {SCHEMATIC}\n      version: v1.13.6\n"),
            "catalog.images[1].schematic",
        ),
        (format!("catalog:\n  images:\n    - schematic: {SCHEMATIC}\n      version: v1.13\n"), "catalog.images[0].version"),
        ("catalog:\n  images:\n    - schematic: ABC\n      version: v1.13.6\n".to_string(), "catalog.images[0].schematic"),
        (
            format!("catalog:\n  images:\n    - schematic: {SCHEMATIC}\n      version: v1.13.6\n      format: qcow2\n"),
            "catalog.images[0].format",
        ),
        ("catalog:\n  imagez: []\n".to_string(), "catalog"),
    ];
    for (yaml, key) in cases {
        std::fs::write(&bed.config, format!("upstreams: []\ndata: {}\n{yaml}", bed.data.display())).unwrap();
        for args in [&["catalog", "sync"][..], &["catalog", "ls"], &["serve", "--listen", "127.0.0.1:0"]] {
            let o = bed.run(args);
            expect_code(&o, 2);
            assert!(String::from_utf8_lossy(&o.stderr).contains(key), "{args:?} {key}: {}", text(&o));
        }
    }
}

#[test]
fn should_keep_a_dropped_entrys_golden_and_rm_deletes_it() {
    let images = images();
    let f = factory_with(images);
    let bed = Bed::new(&f.url());
    bed.config(&three()[..2], "");
    expect_code(&bed.run(&["catalog", "sync"]), 0);

    bed.config(&three()[..1], "");
    expect_code(&bed.run(&["catalog", "sync"]), 0);
    let dropped = bed.golden_view("v1.13.5");
    assert_eq!(dropped["phase"], "Succeeded");
    assert!(dropped["entry"].is_null(), "no longer managed: {dropped}");
    assert!(bed.golden("v1.13.5").exists(), "dropping an entry keeps its golden");
    assert!(stdout(&bed.run(&["catalog", "ls"])).contains("(not managed)"));

    let o = bed.run(&["catalog", "rm", &bed.golden_name("v1.13.5")]);
    expect_code(&o, 0);
    assert!(!bed.golden("v1.13.5").exists());
    assert!(bed.golden_view("v1.13.5").is_null());
    let o = bed.run(&["catalog", "rm", &bed.golden_name("v1.13.5")]);
    expect_code(&o, 1);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no golden named"), "{}", text(&o));
    // A golden still in the config is removed too, with a note that the next sync brings it back.
    let o = bed.run(&["catalog", "rm", &bed.golden_name("v1.13.6")]);
    expect_code(&o, 0);
    assert!(String::from_utf8_lossy(&o.stderr).contains("next sync imports it again"), "{}", text(&o));
}

#[test]
fn should_reset_a_trust_record_and_nothing_else() {
    let images = images();
    let f = factory_with(images);
    let bed = Bed::new(&f.url());
    bed.config(&three()[..1], "");
    expect_code(&bed.run(&["catalog", "sync"]), 0);
    let asset = format!("{SCHEMATIC}/v1.13.6/{XZ}");
    let o = bed.run(&["catalog", "trust", "--reset", &asset]);
    expect_code(&o, 0);
    assert!(bed.golden("v1.13.6").exists(), "the golden stays");
    assert_eq!(std::fs::read_dir(bed.data.join("objects/sha256")).unwrap().count(), 1, "the asset stays");
    let o = bed.run(&["catalog", "trust", "--reset", &asset]);
    expect_code(&o, 1);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no trust record"), "{}", text(&o));
    expect_code(&bed.run(&["catalog", "trust", "--reset", "not/an/asset.iso9"]), 2);
}

#[test]
fn should_refuse_to_touch_a_directory_a_server_holds() {
    let images = images();
    let f = factory_with(images);
    let bed = Bed::new(&f.url());
    bed.config(&three()[..1], "");
    let server = bed.serve();
    let name = bed.golden_name("v1.13.6");
    let asset = format!("{SCHEMATIC}/v1.13.6/{XZ}");
    for args in [&["catalog", "sync"][..], &["catalog", "rm", &name], &["catalog", "trust", "--reset", &asset]] {
        let o = bed.run(args);
        expect_code(&o, 1);
        assert!(String::from_utf8_lossy(&o.stderr).contains("held by a running tender"), "{args:?}: {}", text(&o));
    }
    let o = bed.run(&["catalog", "sync"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--server"), "{}", text(&o));
    // ls only reads: it works beside the server.
    eventually(Duration::from_secs(20), "the server's background import", || {
        bed.golden_view("v1.13.6")["phase"] == "Succeeded"
    });
    server.stop();
}
