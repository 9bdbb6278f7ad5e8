//! The catalog inside `tender serve`: background imports on start and after a SIGHUP reload,
//! `GET /api/v1/catalog`, `POST /api/v1/admin/catalog/sync`, `tender_catalog_goldens`, and
//! `tender catalog sync --server`.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

mod catalog_support;

use std::time::Duration;

use catalog_support::*;

fn phase_of(view: &serde_json::Value, name: &str) -> String {
    view["goldens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == name)
        .map(|g| g["phase"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

fn api(server: &Server) -> serde_json::Value {
    let (status, body) = http("GET", &format!("{}/api/v1/catalog", server.url));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn should_import_in_the_background_and_show_progress_through_the_api() {
    let images = images();
    let f = FakeFactory::start();
    f.put("v1.13.6", "openstack-amd64.raw.xz", images.xz.clone());
    f.put("v1.13.5", "openstack-amd64.raw.zst", images.zst.clone());
    f.put("v1.13.4", "openstack-amd64.raw.gz", images.gz.clone());
    f.set_drip(Some((32 << 10, Duration::from_millis(20))));
    let bed = Bed::new(&f.url());
    bed.config(&[Image { version: "v1.13.6", format: "raw.xz", extra: "" }], "");
    let server = bed.serve();
    let g6 = bed.golden_name("v1.13.6");

    // On start, by itself: ImportInProgress with a percentage, then Succeeded.
    let mut seen_progress = None;
    eventually(Duration::from_secs(30), "the background import", || {
        let v = api(&server);
        let g = &v["goldens"][0];
        if g["phase"] == "ImportInProgress" && g["percent"].as_f64().is_some_and(|p| p > 0.0) {
            seen_progress = g["percent"].as_f64();
        }
        g["phase"] == "Succeeded"
    });
    assert!(seen_progress.is_some(), "progress was visible while importing");
    assert_eq!(sha256_file(&bed.golden("v1.13.6")), images.sha256);
    let (_, metrics) = http("GET", &format!("{}/metrics", server.url));
    assert!(metrics.contains("tender_catalog_goldens{phase=\"Succeeded\"} 1"), "{metrics}");
    assert!(metrics.contains("tender_catalog_goldens{phase=\"Failed\"} 0"), "{metrics}");
    // Issue 20 item 6: one start, one sync, one line (serve started the sync twice).
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert_eq!(log.matches("catalog sync finished").count(), 1, "{log}");

    // A reload that adds an entry imports it.
    f.set_drip(None);
    bed.config(
        &[
            Image { version: "v1.13.6", format: "raw.xz", extra: "" },
            Image { version: "v1.13.5", format: "raw.zst", extra: "" },
        ],
        "",
    );
    server.signal(rustix::process::Signal::HUP);
    let g5 = bed.golden_name("v1.13.5");
    eventually(Duration::from_secs(30), "the import after SIGHUP", || phase_of(&api(&server), &g5) == "Succeeded");
    assert_eq!(f.gets("v1.13.6", "openstack-amd64.raw.xz"), 1, "the first golden is not fetched again");

    // A reload that edits an existing golden is refused; the running catalog stays.
    bed.config(
        &[
            Image { version: "v1.13.6", format: "raw.xz", extra: "storage: 64Mi" },
            Image { version: "v1.13.5", format: "raw.zst", extra: "" },
        ],
        "",
    );
    server.signal(rustix::process::Signal::HUP);
    eventually(Duration::from_secs(10), "the refused reload in the log", || {
        server.log_text().contains("catalog: reload refused")
    });
    assert_eq!(phase_of(&api(&server), &g6), "Succeeded");

    // Through the server: a failed import, then --retry-failed.
    f.set_down(true);
    bed.config(
        &[
            Image { version: "v1.13.6", format: "raw.xz", extra: "" },
            Image { version: "v1.13.5", format: "raw.zst", extra: "" },
            Image { version: "v1.13.4", format: "raw.gz", extra: "" },
        ],
        "",
    );
    server.signal(rustix::process::Signal::HUP);
    let g4 = bed.golden_name("v1.13.4");
    eventually(Duration::from_secs(30), "the failed import", || phase_of(&api(&server), &g4) == "Failed");
    let token = bed.admin_token_file();
    let token = token.to_str().unwrap();
    let o = run(["catalog", "sync", "--server", &server.url]);
    expect_code(&o, 2);
    assert!(text(&o).contains("admin token"), "{}", text(&o));
    let o = run(["catalog", "sync", "--server", &server.url, "--token-file", token]);
    expect_code(&o, 3);
    assert!(stdout(&o).contains(&format!("{g4} Failed")), "{}", text(&o));
    f.set_down(false);
    let o = run(["catalog", "sync", "--server", &server.url, "--retry-failed", "--token-file", token]);
    expect_code(&o, 0);
    for g in [&g6, &g5, &g4] {
        assert!(stdout(&o).contains(&format!("{g} Succeeded")), "{}", text(&o));
    }
    assert_eq!(sha256_file(&bed.golden("v1.13.4")), images.sha256);
    let sync_url = format!("{}/api/v1/admin/catalog/sync", server.url);
    assert_eq!(http("POST", &sync_url).0, 401, "the admin endpoint needs the token");
    let (status, body) = http_as("POST", &sync_url, Some(ADMIN_TOKEN));
    assert_eq!(status, 202, "{body}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["entries"], 3);
    let (_, metrics) = http("GET", &format!("{}/metrics", server.url));
    assert!(metrics.contains("tender_catalog_goldens{phase=\"Succeeded\"} 3"), "{metrics}");
    server.stop();

    let o = run(["catalog", "sync", "--server", "http://127.0.0.1:9"]);
    expect_code(&o, 3);
}
