//! YAML that every reader parses the same.
//!
//! kubectl, Helm and Flux read YAML 1.1-ish (go-yaml); PyYAML and Ansible read YAML 1.1; serde
//! and most newer libraries read YAML 1.2. They agree on quoted scalars and disagree on plain
//! ones: `on`, `no`, `y` are booleans in 1.1 and strings in 1.2, `0000:07:00.0` is the base-60
//! float `420.0` in 1.1, `0o17` is an integer only in 1.2. So a string is written plain only when
//! every one of those readers takes it for that same string ([`plain_is_safe`]); otherwise it is
//! quoted (single quotes, or double quotes with escapes when it holds a character that must be
//! escaped), or written as a literal block when it spans lines.
//!
//! [`resolve_yaml11`] is the YAML 1.1 implicit-type resolution, written from the type regexes
//! at yaml.org/type (bool, int, float, null, timestamp, merge, value); [`resolve_yaml12`] is the
//! YAML 1.2 core schema. [`plain_scalars`] lists the plain scalars of text this module wrote, so
//! tests and fuzz targets can check what a 1.1 reader would make of them.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

/// What a plain scalar resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Implicit {
    Null,
    Bool,
    Int,
    Float,
    /// YAML 1.1 only.
    Timestamp,
    /// `<<`, YAML 1.1 only.
    Merge,
    /// `=`, YAML 1.1 only.
    Value,
    Str,
}

fn anchored(pattern: &str) -> Option<Regex> {
    Regex::new(&format!("^(?:{pattern})$")).ok()
}

/// yaml.org/type/bool.html
static BOOL_11: LazyLock<Option<Regex>> =
    LazyLock::new(|| anchored("y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF"));
/// yaml.org/type/int.html (base 2, 8, 10, 16 and 60).
static INT_11: LazyLock<Option<Regex>> = LazyLock::new(|| {
    anchored(
        r"[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+",
    )
});
/// yaml.org/type/float.html; the fraction also takes `_`, as PyYAML's does.
static FLOAT_11: LazyLock<Option<Regex>> = LazyLock::new(|| {
    anchored(
        r"[-+]?(?:[0-9][0-9_]*)?\.[0-9._]*(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)",
    )
});
/// yaml.org/type/null.html (the empty string is checked separately).
static NULL_11: LazyLock<Option<Regex>> = LazyLock::new(|| anchored("~|null|Null|NULL"));
/// yaml.org/type/timestamp.html; blanks may precede any zone, as in the page's own example
/// `2001-12-14 21:59:43.10 -5` (and PyYAML).
static TIMESTAMP_11: LazyLock<Option<Regex>> = LazyLock::new(|| {
    anchored(
        r"[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]|[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?(?:[Tt]|[ \t]+)[0-9][0-9]?:[0-9][0-9]:[0-9][0-9](?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?",
    )
});
/// YAML 1.2 core schema (yaml.org/spec/1.2.2, 10.3.2).
static BOOL_12: LazyLock<Option<Regex>> = LazyLock::new(|| anchored("true|True|TRUE|false|False|FALSE"));
static INT_12: LazyLock<Option<Regex>> = LazyLock::new(|| anchored(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+"));
static FLOAT_12: LazyLock<Option<Regex>> = LazyLock::new(|| {
    anchored(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")
});
/// What Go's strconv (go-yaml, so kubectl and Helm) may read as a number beyond both schemas:
/// underscores, `0o`/`0b` prefixes, hex floats, exponents without a dot.
static NUMERIC_LOOKING: LazyLock<Option<Regex>> = LazyLock::new(|| {
    anchored(r"[-+.]?[0-9][0-9a-fA-FxXoObBpP_.:+-]*|[-+]?\.?(?:inf|Inf|INF|infinity|Infinity|nan|NaN)")
});

/// Whether `re` matches all of `s`; a pattern that failed to compile matches everything, so a
/// broken pattern can only make the output quote more.
fn hit(re: &LazyLock<Option<Regex>>, s: &str) -> bool {
    re.as_ref().is_none_or(|r| r.is_match(s))
}

/// The type a YAML 1.1 reader gives the plain scalar `s`.
pub fn resolve_yaml11(s: &str) -> Implicit {
    if s.is_empty() || hit(&NULL_11, s) {
        Implicit::Null
    } else if hit(&BOOL_11, s) {
        Implicit::Bool
    } else if hit(&INT_11, s) {
        Implicit::Int
    } else if hit(&FLOAT_11, s) {
        Implicit::Float
    } else if hit(&TIMESTAMP_11, s) {
        Implicit::Timestamp
    } else if s == "<<" {
        Implicit::Merge
    } else if s == "=" {
        Implicit::Value
    } else {
        Implicit::Str
    }
}

/// The type a YAML 1.2 (core schema) reader gives the plain scalar `s`.
pub fn resolve_yaml12(s: &str) -> Implicit {
    if s.is_empty() || hit(&NULL_11, s) {
        Implicit::Null
    } else if hit(&BOOL_12, s) {
        Implicit::Bool
    } else if hit(&INT_12, s) {
        Implicit::Int
    } else if hit(&FLOAT_12, s) {
        Implicit::Float
    } else {
        Implicit::Str
    }
}

/// YAML's printable set (c-printable), less the characters YAML 1.1 takes as line breaks
/// (NEL, LS, PS) and the byte-order mark.
fn is_printable(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' '..='~' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
        && !matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}')
}

/// Whether `s` may be written as a plain scalar: every reader (YAML 1.1, 1.2, go-yaml) takes it
/// for this same string, and it cannot be mistaken for YAML syntax.
pub fn plain_is_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    let syntax_free = s.chars().all(|c| is_printable(c) && !matches!(c, '\t' | '\n' | '\r'))
        && !first.is_whitespace()
        && !s.ends_with(char::is_whitespace)
        && !"-?:,[]{}#&*!|>'\"%@`".contains(first)
        && !s.contains(": ")
        && !s.contains(" #")
        && !s.ends_with(':')
        && !s.starts_with("...");
    syntax_free && resolve_yaml11(s) == Implicit::Str && resolve_yaml12(s) == Implicit::Str && !hit(&NUMERIC_LOOKING, s)
}

/// A multi-line string a literal block (`|`) carries exactly: printable, no carriage return,
/// a first line that starts with neither a space nor a tab (it sets the indentation) and no
/// line of spaces only (a block would read it as empty).
fn literal_is_safe(s: &str) -> bool {
    s.contains('\n')
        && s.chars().all(|c| is_printable(c) && c != '\r')
        && s.lines().next().is_some_and(|l| !l.is_empty() && !l.starts_with([' ', '\t']))
        && s.split('\n').all(|l| l.is_empty() || !l.chars().all(|c| c == ' ' || c == '\t'))
}

fn single_quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c if (c as u32) < 0x100 && !(' '..='~').contains(&c) && !('\u{a0}'..='\u{ff}').contains(&c) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if !is_printable(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A scalar on one line (keys, and values that cannot be a literal block).
fn inline_scalar(s: &str) -> String {
    if plain_is_safe(s) {
        s.to_string()
    } else if s.chars().all(|c| is_printable(c) && !matches!(c, '\t' | '\n' | '\r')) {
        single_quoted(s)
    } else {
        double_quoted(s)
    }
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

/// A scalar value after `key:` or `-`, the space before it already written; a literal block's
/// lines are indented by `indent`.
fn scalar(out: &mut String, v: &Value, indent: usize) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let text = n.to_string();
            // `1e20` is a string to a YAML 1.1 reader; `1.0e20` is a float to all.
            if (text.contains('e') || text.contains('E')) && !text.contains('.') {
                let at = text.find(['e', 'E']).unwrap_or(text.len());
                out.push_str(&format!("{}.0{}", &text[..at], &text[at..]));
            } else {
                out.push_str(&text);
            }
        }
        Value::String(s) if indent > 0 && literal_is_safe(s) => {
            let (chomp, body) = if !s.ends_with('\n') {
                ("-", s.as_str())
            } else if s.ends_with("\n\n") {
                ("+", &s[..s.len() - 1])
            } else {
                ("", &s[..s.len() - 1])
            };
            out.push('|');
            out.push_str(chomp);
            for line in body.split('\n') {
                out.push('\n');
                if !line.is_empty() {
                    pad(out, indent);
                    out.push_str(line);
                }
            }
        }
        Value::String(s) => out.push_str(&inline_scalar(s)),
        Value::Array(_) => out.push_str("[]"),
        Value::Object(_) => out.push_str("{}"),
    }
}

/// The longest key written as an implicit key (`key: value`), in bytes as written (quotes and
/// escapes included). YAML limits an implicit key to 1,024 characters, and readers refuse a
/// longer one ("mapping values are not allowed"): PyYAML and go-yaml count characters,
/// serde_norway (libyaml's port) bytes. A longer key is written as an explicit key, `? key`
/// on its own line and `: value` under it.
pub const MAX_IMPLICIT_KEY: usize = 1024;

fn is_block(v: &Value) -> bool {
    match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
        _ => false,
    }
}

/// A non-empty mapping or sequence at `indent`; with `inline_first` its first line continues
/// the line already started (after `- `).
fn block(out: &mut String, v: &Value, indent: usize, inline_first: bool) {
    let mut first = inline_first;
    let mut line = |out: &mut String| {
        if !std::mem::take(&mut first) {
            pad(out, indent);
        }
    };
    match v {
        Value::Object(m) => {
            for (k, val) in m {
                line(out);
                let key = inline_scalar(k);
                if key.len() > MAX_IMPLICIT_KEY {
                    // `? key`, then `:` under the `?`, the value as it would follow `- `.
                    out.push_str("? ");
                    out.push_str(&key);
                    out.push('\n');
                    pad(out, indent);
                    out.push(':');
                    if is_block(val) {
                        out.push('\n');
                        block(out, val, indent + 2, false);
                    } else {
                        out.push(' ');
                        scalar(out, val, indent + 2);
                        out.push('\n');
                    }
                    continue;
                }
                out.push_str(&key);
                out.push(':');
                match val {
                    Value::Object(_) if is_block(val) => {
                        out.push('\n');
                        block(out, val, indent + 2, false);
                    }
                    Value::Array(_) if is_block(val) => {
                        out.push('\n');
                        block(out, val, indent, false);
                    }
                    _ => {
                        out.push(' ');
                        scalar(out, val, indent + 2);
                        out.push('\n');
                    }
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                line(out);
                out.push_str("- ");
                if is_block(item) {
                    block(out, item, indent + 2, true);
                } else {
                    scalar(out, item, indent + 2);
                    out.push('\n');
                }
            }
        }
        other => {
            line(out);
            scalar(out, other, 0);
            out.push('\n');
        }
    }
}

/// One YAML document (no `---`), block style, keys in the value's order.
pub fn to_string(v: &Value) -> String {
    let mut out = String::new();
    if is_block(v) {
        block(&mut out, v, 0, false);
    } else {
        scalar(&mut out, v, 0);
        out.push('\n');
    }
    out
}

/// Read one quoted scalar at the start of `s`: (its text, the rest after it).
fn quoted(s: &str) -> Option<(String, &str)> {
    let mut chars = s.char_indices();
    let (_, q) = chars.next()?;
    let mut text = String::new();
    let mut escaped = false;
    while let Some((i, c)) = chars.next() {
        if q == '\'' {
            if c == '\'' {
                if s[i + 1..].starts_with('\'') {
                    text.push('\'');
                    chars.next();
                    continue;
                }
                return Some((text, &s[i + 1..]));
            }
            text.push(c);
        } else if escaped {
            escaped = false;
            text.push(c);
        } else if c == '\\' {
            escaped = true;
        } else if c == '"' {
            return Some((text, &s[i + 1..]));
        } else {
            text.push(c);
        }
    }
    None
}

/// The plain scalars (keys and values) of YAML text in the block style [`to_string`] writes,
/// in order, explicit keys (`? key` / `: value`) included. Literal block contents, quoted
/// scalars and `{}` / `[]` are not plain and are left out. A reader of what this module writes,
/// not a general YAML parser.
pub fn plain_scalars(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Inside a literal block: the column of the key or dash that opened it.
    let mut literal_owner: Option<usize> = None;
    for raw in text.lines() {
        let indent = raw.len() - raw.trim_start_matches(' ').len();
        if let Some(owner) = literal_owner {
            if raw.is_empty() || indent > owner {
                continue;
            }
            literal_owner = None;
        }
        if raw == "---" || raw.trim().is_empty() || raw.trim_start().starts_with('#') {
            continue;
        }
        let mut rest = &raw[indent..];
        let mut column = indent;
        let mut dash = None;
        while let Some(after) = rest.strip_prefix("- ").or(if rest == "-" { Some("") } else { None }) {
            dash = Some(column);
            column += rest.len() - after.len();
            rest = after;
        }
        if rest.is_empty() {
            continue;
        }
        // A key, then `:`; or a lone scalar (a sequence item).
        // The column a literal block's lines must go deeper than: its key's, or its dash's.
        let mut owner = column;
        let value = if let Some(key) = rest.strip_prefix("? ") {
            // An explicit key: the one scalar on its line; its value follows on a `:` line.
            if !key.starts_with(['\'', '"']) {
                out.push(key.to_string());
            }
            continue;
        } else if rest == ":" {
            ""
        } else if let Some(v) = rest.strip_prefix(": ") {
            v
        } else {
            match rest.chars().next() {
                Some('\'' | '"') => match quoted(rest) {
                    Some((_, after)) if after.starts_with(':') => after[1..].strip_prefix(' ').unwrap_or(""),
                    _ => continue,
                },
                _ => match rest.find(": ") {
                    Some(i) => {
                        out.push(rest[..i].to_string());
                        &rest[i + 2..]
                    }
                    None if rest.ends_with(':') => {
                        out.push(rest[..rest.len() - 1].to_string());
                        ""
                    }
                    None => {
                        owner = dash.unwrap_or(column);
                        rest
                    }
                },
            }
        };
        match value {
            "" | "{}" | "[]" => {}
            v if v.starts_with('|') => literal_owner = Some(owner),
            v if v.starts_with(['\'', '"']) => {}
            v => out.push(v.to_string()),
        }
    }
    out
}

/// Check that a YAML 1.1 reader and a YAML 1.2 reader type every plain scalar of `text` (as
/// [`to_string`] writes it) alike: a string for both, or the same kind of non-string for both.
/// Quoted scalars are strings to both already. Returns the first scalar they disagree on.
pub fn check_readers_agree(text: &str) -> Result<(), String> {
    for s in plain_scalars(text) {
        let (v11, v12) = (resolve_yaml11(&s), resolve_yaml12(&s));
        if v11 != v12 {
            return Err(format!("plain scalar {s:?} reads as {v11:?} in YAML 1.1 and {v12:?} in YAML 1.2"));
        }
        if v11 == Implicit::Str && !plain_is_safe(&s) {
            return Err(format!("plain scalar {s:?} is not safe to write plain"));
        }
    }
    Ok(())
}

/// A serde error message without Rust's type names (`u32`, `struct TalosValues`, `untagged enum
/// Raw`): the kinds an operator writes in YAML instead (issue 33, item 6).
pub fn humane(message: &str) -> String {
    static RULES: LazyLock<Vec<(regex::Regex, &'static str)>> = LazyLock::new(|| {
        [
            (r"data did not match any variant of untagged enum \w+", "the value has the wrong type"),
            (r"expected struct \w+", "expected a mapping"),
            (r"expected enum \w+", "expected one of the values it takes"),
            (r"expected (?:u8|u16|u32|u64|u128|usize|i8|i16|i32|i64|i128|isize)\b", "expected an integer"),
            (r"expected (?:f32|f64)\b", "expected a number"),
            (r"expected a (?:borrowed )?string", "expected a string"),
            (r"expected a sequence", "expected a list"),
            (r"expected a map\b", "expected a mapping"),
            (r"invalid type: sequence", "invalid type: list"),
            (r"invalid type: map\b", "invalid type: mapping"),
            (r"\b(?:struct|enum|variant) ([A-Z]\w*)", "a value"),
        ]
        .into_iter()
        .filter_map(|(re, to)| regex::Regex::new(re).ok().map(|r| (r, to)))
        .collect()
    });
    let mut out = message.to_string();
    for (re, to) in RULES.iter() {
        out = re.replace_all(&out, *to).into_owned();
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use serde_json::json;

    #[test]
    fn should_resolve_the_yaml11_forms() {
        for (s, want) in [
            ("y", Implicit::Bool),
            ("Off", Implicit::Bool),
            ("~", Implicit::Null),
            ("", Implicit::Null),
            ("0b101", Implicit::Int),
            ("0777", Implicit::Int),
            ("0x1F", Implicit::Int),
            ("1_000", Implicit::Int),
            ("190:20:30", Implicit::Int),
            ("0000:07:00.0", Implicit::Float),
            ("1.5", Implicit::Float),
            (".inf", Implicit::Float),
            ("-.Inf", Implicit::Float),
            (".NaN", Implicit::Float),
            ("2001-12-14", Implicit::Timestamp),
            ("2001-12-14t21:59:43.10-05:00", Implicit::Timestamp),
            ("2001-12-14 21:59:43.10 -5", Implicit::Timestamp),
            ("<<", Implicit::Merge),
            ("=", Implicit::Value),
            ("1e3", Implicit::Str),
            ("0o17", Implicit::Str),
            ("u1.medium", Implicit::Str),
            ("v1.13.6", Implicit::Str),
        ] {
            assert_eq!(resolve_yaml11(s), want, "{s:?}");
        }
        assert_eq!(resolve_yaml12("0o17"), Implicit::Int);
        assert_eq!(resolve_yaml12("1e3"), Implicit::Float);
        assert_eq!(resolve_yaml12("on"), Implicit::Str);
    }

    #[test]
    fn should_write_plain_only_what_every_reader_reads_as_the_same_string() {
        for s in ["replicated", "u1.medium", "v1.13.6", "20Gi", "http://m:5000/x", "a#b", "tenant-test", "50%"] {
            assert!(plain_is_safe(s), "{s}");
        }
        for s in [
            "on",
            "NO",
            "y",
            "~",
            "null",
            "0000:07:00.0",
            "0x1f",
            "1e3",
            "0o7",
            "1_0",
            ".inf",
            "<<",
            "=",
            "*",
            "- x",
            "a: b",
            "a #b",
            " x",
            "x ",
            "2001-12-14",
            "",
            "a\tb",
            "x:",
            "0x1p-2",
            "10",
        ] {
            assert!(!plain_is_safe(s), "{s:?}");
        }
    }

    #[test]
    fn should_write_literal_blocks_that_keep_their_bytes() {
        let v = json!({"a": ["x\n", "x\ny", "x\n\n", "  lead\n", "x\n  \ny"], "b": "c"});
        let text = to_string(&v);
        let back: Value = serde_norway::from_str(&text).unwrap();
        assert_eq!(back, v, "{text}");
        assert_eq!(plain_scalars(&text), ["a", "b", "c"], "{text}");
    }
}
