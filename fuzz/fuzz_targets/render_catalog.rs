//! `tender render catalog`'s inputs (`crates/render/src/catalog.rs`, `golden.rs`): tender's
//! config file (its `catalog` section), optionally a `--source-url` on a first line
//! `#source=URL`, and a cluster state after a line `#state`.
//!
//! Properties: parsing and validation never panic; a refusal names a field under `catalog` (or
//! the source flag) and prints no control character; a valid catalog renders one DataVolume per
//! entry, in order, named as the entry says, importing from `<source>/image/<schematic>/
//! <version>/<platform>-<arch>.<format>`, the same bytes every time; the rendered DataVolumes,
//! read back as the cluster state, pass the "a golden never changes" rule (G-9) and render the
//! same bytes again; storage quantities keep their spelling and compare equal to themselves.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::cmp::Ordering;
use tender_render::catalog::{parse_config, validate};
use tender_render::golden::render_catalog;
use tender_render::quantity::Quantity;
use tender_render::rules::check_factory_url;
use tender_render::state::ClusterState;
use tender_render::{Error, Refusal};

fn check_refusal(r: &Refusal) {
    assert!(!r.field.is_empty(), "a refusal names its field: {r:?}");
    let shown = r.to_string();
    assert!(!shown.chars().any(char::is_control), "a refusal prints a control character: {shown:?}");
}

fn check_error(e: &Error) {
    match e {
        Error::Refused(r) => check_refusal(r),
        Error::Serialise { .. } => panic!("serialising valid data failed: {e}"),
        Error::Malformed { .. } | Error::MissingClusterState | Error::IncompleteState { .. } => {}
    }
}

fn check_quantity(s: &str) {
    let Ok(q) = Quantity::parse(s) else { return };
    assert_eq!(q.as_str(), s);
    assert_eq!(q.to_string(), s);
    if let Some(o) = q.compare(&q) {
        assert_eq!(o, Ordering::Equal);
    }
    let again = Quantity::parse(s).expect("parses twice");
    assert!(q == again);
}

fuzz_target!(|data: &[u8]| {
    let Some(text) = tender_fuzz::text(data) else { return };
    let (source, rest) = match text.strip_prefix("#source=").and_then(|t| t.split_once('\n')) {
        Some((s, rest)) => (Some(s), rest),
        None => (None, text),
    };
    let (config_text, state_text) = match rest.split_once("\n#state\n") {
        Some((c, s)) => (c, Some(s)),
        None => (rest, None),
    };
    for line in config_text.lines() {
        check_quantity(line.trim_start().strip_prefix("storage: ").unwrap_or(line));
    }
    let state = match state_text.map(ClusterState::from_yaml) {
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => return check_error(&e),
        None => None,
    };
    let config = match parse_config(config_text) {
        Ok(c) => c,
        Err(e) => return check_error(&e),
    };
    let goldens = match config.catalog.as_ref().map(validate) {
        Some(Ok(g)) => g,
        Some(Err(r)) => {
            assert!(r.field.starts_with("catalog."), "{r:?}");
            return check_refusal(&r);
        }
        None => {
            assert!(render_catalog(&config, source, state.as_ref()).is_err(), "no catalog section, nothing to render");
            return;
        }
    };
    for g in &goldens {
        if let Some(q) = &g.storage {
            check_quantity(q.as_str());
        }
    }
    let out = match render_catalog(&config, source, state.as_ref()) {
        Ok(out) => out,
        Err(e) => return check_error(&e),
    };
    assert_eq!(render_catalog(&config, source, state.as_ref()).expect("renders twice"), out, "deterministic");
    let docs = tender_fuzz::reparse_yaml("catalog", &out);
    assert_eq!(docs.len(), goldens.len(), "one DataVolume per entry");
    let base = match (source, &config.image_factory) {
        (Some(s), _) => s,
        (None, Some(f)) => f.as_str(),
        (None, None) => "https://factory.talos.dev",
    };
    let base = check_factory_url("source", base).expect("the source URL was accepted");
    assert!(!base.ends_with('/'), "{base:?}");
    for (d, g) in docs.iter().zip(&goldens) {
        assert_eq!(d["kind"], "DataVolume");
        assert_eq!(d["metadata"]["name"].as_str(), Some(g.name().as_str()));
        assert_eq!(d["metadata"]["namespace"], "cozy-public");
        let url = d["spec"]["source"]["http"]["url"].as_str().expect("an http source");
        assert_eq!(url, format!("{base}{}", g.factory_path()), "the import URL");
        assert!(!url.contains("/../") && !url.contains("/./"), "{url}");
        if let Some(q) = &g.storage {
            assert_eq!(d["spec"]["storage"]["resources"]["requests"]["storage"].as_str(), Some(q.as_str()));
        }
    }
    // Apply, then render again: the goldens now exist exactly as rendered, and G-9 passes.
    let applied = ClusterState::from_yaml(&out).expect("rendered DataVolumes read back as a cluster state");
    let again = render_catalog(&config, source, Some(&applied))
        .unwrap_or_else(|e| panic!("the rendered goldens fail their own G-9 check: {e}\n{out}"));
    assert_eq!(again, out);
});
