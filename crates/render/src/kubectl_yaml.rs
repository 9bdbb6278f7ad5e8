//! Read YAML as kubectl and Helm read it (issue 33, item 3).
//!
//! Both parse with sigs.k8s.io/yaml, that is go-yaml v2 (YAML 1.1-ish), then convert to JSON.
//! serde_norway follows YAML 1.2 instead, so the same text can carry other values: `yes`, `on`,
//! `y`, `off`, `n` are booleans to kubectl and strings to serde; `0777` is the octal integer 511
//! (and `08` the number 8); `1_000` is 1000; keys resolve too (`on:` becomes the key `"true"`).
//! What go-yaml v2 does **not** do, although YAML 1.1 says so: base 60 (`1:30` stays a string) and
//! timestamps (`2001-12-14` stays a string once converted to JSON). Checked against the real Helm
//! v4 (testdata/cozystack/corpus/, the differential test in crates/e2e t23).
//!
//! How: serde_norway parses and resolves the YAML 1.2 forms, which agree with go-yaml's where
//! serde gives a non-string; a plain scalar serde gives as a string is resolved again with
//! go-yaml v2's rules ([`resolve_go_yaml`]). A scalar is plain when serde lends it from the text
//! and no quote encloses it there, nor a tag (`!!str yes`) precedes it.

use std::sync::LazyLock;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// What a plain scalar is to go-yaml v2, as it reaches JSON.
#[derive(Debug, Clone, PartialEq)]
pub enum GoScalar {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str,
}

static GO_FLOAT: LazyLock<Option<regex::Regex>> =
    LazyLock::new(|| regex::Regex::new(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$").ok());

/// go-yaml v2's `resolve` for a plain scalar (resolve.go): its bool and null tables, then Go's
/// `strconv.ParseInt(s, 0, 64)` (bases 2, 8, 16 and 10 by prefix, `_` removed first), then a
/// float of the YAML form. Timestamps and base 60 are left as strings.
pub fn resolve_go_yaml(s: &str) -> GoScalar {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return GoScalar::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return GoScalar::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return GoScalar::Bool(false)
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return GoScalar::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return GoScalar::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return GoScalar::Float(f64::NAN),
        _ => {}
    }
    let first = s.as_bytes()[0];
    if !(first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'.')) {
        return GoScalar::Str;
    }
    let plain: String = s.chars().filter(|&c| c != '_').collect();
    if let Some(v) = go_parse_int(&plain) {
        return v;
    }
    if GO_FLOAT.as_ref().is_some_and(|r| r.is_match(&plain)) {
        if let Ok(f) = plain.parse::<f64>() {
            return GoScalar::Float(f);
        }
    }
    GoScalar::Str
}

/// `strconv.ParseInt(s, 0, 64)`, else `ParseUint(s, 0, 64)`: a sign, then `0x`/`0X`, `0o`/`0O`,
/// `0b`/`0B` or a leading `0` (octal) picks the base.
fn go_parse_int(s: &str) -> Option<GoScalar> {
    let (negative, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(r) = lower.strip_prefix("0x") {
        (16, r)
    } else if let Some(r) = lower.strip_prefix("0o") {
        (8, r)
    } else if let Some(r) = lower.strip_prefix("0b") {
        (2, r)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if digits.is_empty() || digits.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = u64::from_str_radix(digits, radix).ok()?;
    if negative {
        let v = i64::try_from(magnitude).ok().map(|m| -m).or((magnitude == 1u64 << 63).then_some(i64::MIN))?;
        Some(GoScalar::Int(v))
    } else {
        Some(i64::try_from(magnitude).map_or(GoScalar::Uint(magnitude), GoScalar::Int))
    }
}

fn json_of(v: GoScalar, text: &str) -> Result<Value, String> {
    Ok(match v {
        GoScalar::Null => Value::Null,
        GoScalar::Bool(b) => Value::Bool(b),
        GoScalar::Int(i) => Value::from(i),
        GoScalar::Uint(u) => Value::from(u),
        GoScalar::Float(f) => Value::Number(Number::from_f64(f).ok_or_else(|| {
            format!("the plain value {text:?} is a non-finite number to kubectl and Helm, which cannot convert it to JSON and refuse the file")
        })?),
        GoScalar::Str => Value::String(text.to_string()),
    })
}

/// A map key as sigs.k8s.io/yaml writes it into JSON: resolved, then printed.
fn key_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

/// The text, read as kubectl and Helm read it, as JSON. `Err` carries the reader's message.
pub fn from_str(text: &str) -> Result<Value, String> {
    let de = serde_norway::Deserializer::from_str(text);
    Node { text }.deserialize(de).map_err(|e| e.to_string())
}

#[derive(Clone, Copy)]
struct Node<'a> {
    text: &'a str,
}

impl Node<'_> {
    /// Whether the borrowed `s` is a plain scalar of the text: not enclosed in quotes there and
    /// not after a tag.
    fn is_plain(&self, s: &str) -> bool {
        let base = self.text.as_ptr() as usize;
        let at = s.as_ptr() as usize;
        if at < base || at + s.len() > base + self.text.len() {
            return false;
        }
        let (start, end) = (at - base, at - base + s.len());
        let bytes = self.text.as_bytes();
        if start > 0 && end < bytes.len() && matches!(bytes[start - 1], b'\'' | b'"') && bytes[end] == bytes[start - 1]
        {
            return false;
        }
        // A tag before the scalar (`!!str yes`, `!foo yes`): the explicit type stands.
        let before = self.text[..start].trim_end_matches([' ', '\t']);
        let token = before.rsplit([' ', '\t', '\n', ':', ',', '[', '{', '-']).next().unwrap_or("");
        !token.starts_with('!')
    }

    fn scalar<E: serde::de::Error>(&self, s: &str, plain: bool) -> Result<Value, E> {
        if plain {
            json_of(resolve_go_yaml(s), s).map_err(E::custom)
        } else {
            Ok(Value::String(s.to_string()))
        }
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_i128<E: serde::de::Error>(self, v: i128) -> Result<Value, E> {
        Err(E::custom(format!("the integer {v} does not fit 64 bits; kubectl and Helm refuse it")))
    }
    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<Value, E> {
        Err(E::custom(format!("the integer {v} does not fit 64 bits; kubectl and Helm refuse it")))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        json_of(GoScalar::Float(v), &v.to_string()).map_err(E::custom)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Value, E> {
        let plain = self.is_plain(v);
        self.scalar(v, plain)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        // Not lent from the text: a quoted scalar with escapes, a block scalar, or a plain one
        // folded over lines (a space in it: none of go-yaml's non-string forms has one).
        Ok(Value::String(v.to_string()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(self)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key_seed(self)? {
            let v = map.next_value_seed(self)?;
            out.insert(key_string(&k), v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use serde_json::json;

    /// What Helm v4.1.4 gave for the same file (a chart printing `toJson .Values`).
    #[test]
    fn should_read_as_helm_reads() {
        let text = "a: yes\nb: on\nc: off\nd: 0777\ne: 1:30\nf: 1_000\ng: 0X1F\nh: 08\ni: 0o17\nj: 2001-12-14\nk: 'yes'\nl: y\nm: -017\nn: 1e3\no: !!str yes\np: 0b101\nq: 1_0.5\ns: ~\non: 1\nt: 09.5\nu: 0x_1F\nv: 1:30.5\nw: 190:20:30\nx: 12e\nz: +0777\nquoted: \"0777\"\nblock: |\n  yes\n";
        let v = from_str(text).unwrap();
        let want = json!({"a":true,"b":true,"c":false,"d":511,"e":"1:30","f":1000,"false":1000.0,"g":31,"h":8.0,"i":15,"j":"2001-12-14","k":"yes","l":true,"m":-15,"o":"yes","p":5,"q":10.5,"s":null,"t":9.5,"true":1,"u":31,"v":"1:30.5","w":"190:20:30","x":"12e","z":511,"quoted":"0777","block":"yes\n"});
        assert_eq!(v, want);
    }

    #[test]
    fn should_refuse_what_json_cannot_carry() {
        assert!(from_str("a: .inf\n").unwrap_err().contains("non-finite"));
        assert!(from_str("a: [1, {b: .nan}]\n").is_err());
    }

    #[test]
    fn should_keep_flow_and_nested_forms() {
        let v = from_str("a: [yes, 'no', \"on\", 010]\nb: {c: off, 'd': 1:30}\n- x\n").map(|_| ());
        assert!(v.is_err(), "not YAML");
        let v = from_str("a: [yes, 'no', \"on\", 010]\nb: {c: off, 'd': 1:30}\n").unwrap();
        assert_eq!(v, json!({"a": [true, "no", "on", 8], "b": {"c": false, "d": "1:30"}}));
    }
}
