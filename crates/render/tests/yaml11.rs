//! Issue 22, item 1: YAML every reader parses the same. A generator draws every YAML 1.1
//! implicit form (booleans in any case, nulls, integers in every base including base 60,
//! floats, `.inf` / `.nan`, timestamps, `<<`, `=`) into every string field; the output, read
//! by the YAML 1.1 resolver (`tender_render::yaml`) and by a YAML 1.2 parser (serde_norway),
//! gives back the same strings.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use common::*;
use proptest::prelude::*;
use serde_json::{json, Value};
use tender_render::catalog::parse_config;
use tender_render::golden::render_catalog;
use tender_render::yaml::{check_readers_agree, plain_scalars, resolve_yaml11, to_string, Implicit};

/// Every YAML 1.1 implicit form, and the YAML 1.2 and go-yaml ones beside them.
fn implicit_form() -> impl Strategy<Value = String> {
    let fixed = prop::sample::select(vec![
        "y",
        "Y",
        "yes",
        "Yes",
        "YES",
        "n",
        "N",
        "no",
        "No",
        "NO",
        "true",
        "True",
        "TRUE",
        "false",
        "False",
        "FALSE",
        "on",
        "On",
        "ON",
        "off",
        "Off",
        "OFF",
        "~",
        "null",
        "Null",
        "NULL",
        ".inf",
        ".Inf",
        "-.INF",
        "+.inf",
        ".nan",
        ".NaN",
        ".NAN",
        "<<",
        "=",
        "0000:07:00.0",
        "190:20:30",
        "0o17",
        "1e3",
        "0x1p-2",
        "Infinity",
        "2001-12-14",
        "2001-12-14t21:59:43.10-05:00",
        "2001-12-14 21:59:43.10 -5",
        "1.13",
        "0",
        "-0",
        "+12",
    ])
    .prop_map(str::to_string);
    prop_oneof![
        fixed,
        "[-+]?0b[01_]{1,6}",
        "[-+]?0[0-7_]{1,6}",
        "[-+]?[1-9][0-9_]{0,6}",
        "[-+]?0x[0-9a-fA-F_]{1,6}",
        "[-+]?[1-9][0-9_]{0,2}(:[0-5]?[0-9]){1,3}",
        "[-+]?[0-9][0-9_]{0,3}\\.[0-9._]{0,4}([eE][-+][0-9]{1,2})?",
        "[-+]?\\.[0-9]{1,3}",
        "[-+]?[0-9]{1,3}(:[0-5]?[0-9]){1,2}\\.[0-9_]{0,3}",
        "[0-9]{4}-[0-9]{2}-[0-9]{2}",
        "[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt]|[ \t]{1,2})[0-9]{1,2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{0,3})?([ \t]?Z|[-+][0-9]{1,2}(:[0-9]{2})?)?",
        "[0-9]{1,4}e[0-9]{1,2}",
    ]
}

/// Every string leaf of a parsed document.
fn leaves(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| leaves(x, out)),
        Value::Object(m) => m.iter().for_each(|(k, x)| {
            out.push(k.clone());
            leaves(x, out)
        }),
        _ => {}
    }
}

/// How many plain scalars of `text` equal `value` and read as something other than a string.
fn bare(text: &str, value: &str) -> usize {
    plain_scalars(text).iter().filter(|p| *p == value && resolve_yaml11(p) != Implicit::Str).count()
}

/// The rendered text reads the same to both readers, and carries `value` as a string. `baseline`
/// is the same render with a neutral value in its place: scalars it has too (`maxUnavailable: 1`
/// when the value is "1") are tender's own numbers, not the value left bare.
fn assert_same_to_every_reader(text: &str, value: &str, baseline: &str) {
    check_readers_agree(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(bare(text, value) <= bare(baseline, value), "{value:?} bare:\n{text}");
    let mut all = Vec::new();
    docs(text).iter().for_each(|d| leaves(d, &mut all));
    assert!(all.iter().any(|s| s == value || s.contains(value)), "{value:?} not read back as a string:\n{text}");
}

/// The pool fields that hold a free string or a name, as (path, how to place the value).
const POOL_FIELDS: &[&str] = &["cluster", "namespace", "pool", "storageClass", "instanceType", "gpus", "roles"];

fn pool_with(field: &str, value: &str) -> Value {
    let mut v = json!({"cluster": "kubernetes-test", "namespace": "tenant-test", "pool": "md0"});
    match field {
        "gpus" => v["gpus"] = json!([{"name": value}]),
        "roles" => v["roles"] = json!([value]),
        f => v[f] = json!(value),
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn should_read_back_every_yaml11_form_from_every_pool_field(value in implicit_form(), field in prop::sample::select(POOL_FIELDS)) {
        let yaml = serde_norway::to_string(&pool_with(field, &value)).unwrap();
        let Ok(pool) = tender_render::pool::parse(&yaml).and_then(|f| f.validate().map_err(Into::into)) else {
            return Ok(()); // not a valid value for that field: refused, nothing rendered
        };
        let render = |pool: &tender_render::pool::Pool| {
            tender_render::k8s::render_pool(pool, None, false, tender_render::k8s::PoolFormat::Manifests).unwrap().text
        };
        let neutral = serde_norway::to_string(&pool_with(field, "neutral")).unwrap();
        let baseline = render(&tender_render::pool::parse(&neutral).unwrap().validate().unwrap());
        assert_same_to_every_reader(&render(&pool), &value, &baseline);
    }

    #[test]
    fn should_read_back_every_yaml11_form_from_catalog_schematics(value in implicit_form()) {
        let schematic: String = value.chars().filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit()).collect();
        prop_assume!(!schematic.is_empty());
        let config = parse_config(&format!("catalog:\n  images:\n  - schematic: '{schematic}'\n    version: v1.13.6\n")).unwrap();
        let out = render_catalog(&config, None, None).unwrap();
        let neutral = parse_config("catalog:\n  images:\n  - schematic: 'neutral'\n    version: v1.13.6\n").unwrap();
        let baseline = render_catalog(&neutral, None, None).unwrap();
        assert_same_to_every_reader(&out, &schematic, &baseline);
    }

    #[test]
    fn should_write_any_document_both_readers_read_back_unchanged(
        keys in prop::collection::vec(prop_oneof![implicit_form(), "\\PC{0,8}"], 1..6),
        values in prop::collection::vec(prop_oneof![implicit_form(), "\\PC{0,8}", "[a-z \n]{0,12}", any::<String>()], 1..6),
    ) {
        let mut map = serde_json::Map::new();
        for (k, v) in keys.iter().zip(values.iter().cycle()) {
            map.insert(k.clone(), json!([v, {"k": v}, [v]]));
        }
        let doc = Value::Object(map);
        let text = to_string(&doc);
        check_readers_agree(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let back: Value = serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        prop_assert_eq!(back, doc, "{}", text);
    }
}

#[test]
fn should_keep_every_machine_template_name_pinned() {
    // The KMT name hashes the canonical JSON, never the YAML text: quoting cannot move it.
    assert_eq!(render(&pool_yaml(""), None).kmt_name.as_deref(), Some("kubernetes-test-md0-da9ead"));
    assert_eq!(
        render(&pool_yaml(BUILTIN), Some(&healthy().build())).kmt_name.as_deref(),
        Some("kubernetes-test-md0-a3ca20")
    );
}
