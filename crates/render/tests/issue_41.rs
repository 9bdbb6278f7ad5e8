//! Regressions pinned by issue 41 (item 8): a mapping key longer than a YAML reader takes as
//! an implicit key (1,024 characters for PyYAML and go-yaml, 1,024 bytes for serde_norway) is
//! written as an explicit key (`? key` / `: value`), so every document the writer prints parses
//! back to the data it was given.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use serde_json::{json, Value};
use tender_render::yaml::{check_readers_agree, plain_scalars, to_string};

/// Written, parsed back (YAML 1.2, serde_norway), and typed alike by both resolvers.
fn round_trip(doc: &Value) -> String {
    let text = to_string(doc);
    let back: Value = serde_norway::from_str(&text).unwrap_or_else(|e| panic!("does not parse back: {e}\n{text:.400}"));
    assert_eq!(&back, doc, "parses back into other data:\n{text:.400}");
    check_readers_agree(&text).unwrap_or_else(|e| panic!("{e:.400}\n{text:.400}"));
    assert_eq!(text, to_string(doc), "deterministic");
    text
}

#[test]
fn issue_41_should_write_a_key_over_1024_characters_as_an_explicit_key() {
    let keys = [
        "k".repeat(1100),
        "k".repeat(1025),
        // 1,025 bytes written with its quotes (a reader counts those too), 1,022 without.
        format!("'{}", "k".repeat(1021)),
        "é".repeat(1100),
        // 513 characters, 1,026 bytes: serde_norway counts bytes.
        "é".repeat(513),
        format!("on {}", "y".repeat(1100)),
        format!("a\nb{}", "c".repeat(1100)),
        format!("{}: x", "k".repeat(1100)),
    ];
    for key in &keys {
        for doc in [
            json!({key: "v"}),
            json!({key: "x\ny\n"}),
            json!({key: {"a": 1, key: null}}),
            json!({key: ["x", {"b": 2}, []]}),
            json!({"a": 1, key: {}, "b": [1, 2]}),
            json!([{key: "x"}, {"c": {key: [{key: "z"}]}}]),
            json!({"outer": {key: {key: [key]}}}),
        ] {
            round_trip(&doc);
        }
        let text = round_trip(&json!({key: "v"}));
        assert!(text.starts_with("? "), "{text:.100}");
    }
}

#[test]
fn issue_41_should_keep_a_key_of_1024_bytes_implicit() {
    for key in ["k".repeat(1024), "é".repeat(512), format!("'{}", "k".repeat(1020))] {
        let text = round_trip(&json!({"a": {key.as_str(): "v"}}));
        assert!(!text.contains("? "), "{text:.100}");
    }
}

#[test]
fn issue_41_should_list_the_plain_scalars_of_explicit_keys() {
    let key = "k".repeat(1100);
    let text = round_trip(&json!({"a": [{key.as_str(): "v", "b": "x\ny"}], key.as_str(): {"c": "d"}}));
    assert_eq!(plain_scalars(&text), ["a", "b", key.as_str(), "v", key.as_str(), "c", "d"], "{text:.400}");
}
