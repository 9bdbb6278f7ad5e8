//! Shared pieces of the fuzz targets (see docs/fuzzing.md).
//!
//! The Range resolver and the Image Factory asset grammar are compiled here from their own
//! source files rather than through `tender-server` and `tender-catalog`: those crates link the
//! whole HTTP and fetch stack (axum, reqwest, rustls, tokio), which would make the instrumented
//! fuzz build several times longer for two self-contained files. Both files use nothing from
//! their crate; if one ever does, this crate stops compiling and says so.

#[path = "../../crates/server/src/range.rs"]
pub mod range;

#[path = "../../crates/catalog/src/asset.rs"]
pub mod asset;

/// What upstreams send in words (`WWW-Authenticate`, `Retry-After`, token responses, `Link`),
/// from `tender-fetch`, which links reqwest and tokio.
#[path = "../../crates/fetch/src/wire.rs"]
pub mod wire;

/// The fuzzer's bytes as text, or `None` when they are not UTF-8 (every parser here takes
/// `&str`; HTTP layers hand them nothing else).
pub fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// Parse multi-document YAML output back; panics (a finding) when tender printed something a
/// YAML reader refuses, or a plain scalar that a YAML 1.1 reader (PyYAML, Ansible, go-yaml)
/// types differently from a YAML 1.2 one (issue 22).
pub fn reparse_yaml(what: &str, text: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    if let Err(e) = tender_render::yaml::check_readers_agree(text) {
        panic!("{what}: YAML 1.1 and 1.2 readers disagree: {e}\n{text}");
    }
    serde_norway::Deserializer::from_str(text)
        .map(|d| {
            serde_json::Value::deserialize(d)
                .unwrap_or_else(|e| panic!("{what}: rendered YAML does not parse: {e}\n{text}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}
