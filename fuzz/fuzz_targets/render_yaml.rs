//! `tender_render::yaml` (issue 22): the YAML writer every render goes through, and the YAML 1.1
//! resolver the tests and the other render targets check its output with.
//!
//! Input: any YAML document (read with serde_norway into JSON data), or, when that fails, the
//! text itself as one string value under a few keys.
//!
//! Properties: no panic; what the writer prints parses back (YAML 1.2, serde_norway) into
//! exactly the data it was given (keys over 1,024 bytes as explicit keys, issue 41); every plain
//! scalar in it is typed alike by the YAML 1.1 resolver and the YAML 1.2 core schema; a string
//! written plain is one `plain_is_safe` accepts; the same data prints the same bytes.
//! `tender_render::nesting::depth` (the pre-scan of `check cozystack`, issue 32) never counts
//! less than the nesting of the data serde_norway reads, from the input (without aliases,
//! which the scan does not expand) and from the writer's output.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use tender_render::nesting::depth;
use tender_render::yaml::{check_readers_agree, plain_is_safe, resolve_yaml11, to_string, Implicit};

/// Floats print in a form YAML readers may round differently; the writer is only ever given
/// integers by the renderers, so floats are dropped from the fuzzed data.
fn without_floats(v: Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => Value::Null,
        Value::Array(a) => Value::Array(a.into_iter().map(without_floats).collect()),
        Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, without_floats(v))).collect()),
        other => other,
    }
}

/// How many collections deep the data nests.
fn data_depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(data_depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(data_depth).max().unwrap_or(0),
        _ => 0,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(text) = tender_fuzz::text(data) else { return };
    let scanned = depth(text, usize::MAX);
    let doc = match serde_norway::from_str::<Value>(text) {
        Ok(v) => {
            if !text.contains('*') {
                assert!(scanned >= data_depth(&v), "the scan counts {scanned} levels, the data {}", data_depth(&v));
            }
            without_floats(v)
        }
        Err(_) => json!({text: [text, {"k": text}], "s": text}),
    };
    let out = to_string(&doc);
    assert!(depth(&out, usize::MAX) >= data_depth(&doc), "the scan under-counts the output:\n{out}");
    assert_eq!(out, to_string(&doc), "deterministic");
    if let Err(e) = check_readers_agree(&out) {
        panic!("{e}\n{out}");
    }
    let back: Value = serde_norway::from_str(&out).unwrap_or_else(|e| panic!("does not parse back: {e}\n{out}"));
    assert_eq!(back, doc, "parses back into the same data:\n{out}");
    if let Value::String(s) = &doc {
        if plain_is_safe(s) {
            assert_eq!(resolve_yaml11(s), Implicit::Str);
        }
    }
});
