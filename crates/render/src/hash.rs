//! Output as data: canonical JSON, content-hash names and multi-document YAML.
//!
//! Every object is built as a `serde_json::Value` and serialised; nothing is a text template.
//! Key order is fixed here (sorted, recursively) so the bytes do not depend on whether some other
//! crate in the build turned on `serde_json/preserve_order`.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::Error;

/// The value with every object's keys in sorted order, recursively.
pub fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                if let Some(v) = map.get(k) {
                    out.insert(k.clone(), sorted(v));
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// Canonical JSON: keys sorted by their UTF-8 bytes, no whitespace, strings escaped the way
/// serde_json escapes them. Written out by hand so its definition does not depend on the
/// map type serde_json was built with.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The first 6 hex characters of the SHA-256 of the canonical JSON of `value`.
pub fn hash6(value: &Value) -> String {
    let digest = Sha256::digest(canonical_json(value).as_bytes());
    let mut hex = hex::encode(digest);
    hex.truncate(6);
    hex
}

/// Serialise documents as multi-document YAML: each document sorted, separated by `---`.
pub fn yaml_documents(docs: &[Value]) -> Result<String, Error> {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&yaml_one(doc)?);
    }
    Ok(out)
}

/// Serialise one document (keys sorted), without a leading `---`, in YAML that YAML 1.1 and
/// 1.2 readers parse the same ([`crate::yaml`]).
pub fn yaml_one(doc: &Value) -> Result<String, Error> {
    Ok(crate::yaml::to_string(&sorted(doc)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn should_sort_keys_and_drop_whitespace_in_canonical_json() {
        let v = json!({"b": [1, {"z": "x", "a": null}], "a": "q\"\n"});
        assert_eq!(canonical_json(&v), r#"{"a":"q\"\n","b":[1,{"a":null,"z":"x"}]}"#);
    }

    #[test]
    fn should_hash_data_not_text() {
        let a = json!({"x": 1, "y": [true]});
        let b: Value = serde_json::from_str("{ \"y\" : [ true ] ,\n \"x\" : 1 }").unwrap_or_default();
        assert_eq!(hash6(&a), hash6(&b));
        assert_eq!(hash6(&a).len(), 6);
    }
}
