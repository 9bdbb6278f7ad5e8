//! The docs match the binary: every `tender …` line in a fenced code block of README.md and
//! docs/*.md (also after `-- ` in `kubectl exec … -- tender …`) parses with the current CLI,
//! every synopsis in README's command table parses with its `[…]` and `|` expanded, and every
//! fenced YAML block that is a tender config parses with the config's own (deny-unknown-keys)
//! parser.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, reason = "tests")]

use std::path::{Path, PathBuf};

use clap::Parser as _;

use crate::Cli;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every docs/*.md, with their text.
fn documents() -> Vec<(String, String)> {
    let mut paths = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let name = p.strip_prefix(repo()).unwrap_or(&p).display().to_string();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// A fenced code block: its info string, first line number and lines.
struct Block {
    info: String,
    line: usize,
    lines: Vec<String>,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if let Some(info) = t.strip_prefix("```") {
            match open.take() {
                Some(b) => out.push(b),
                None => open = Some(Block { info: info.trim().to_string(), line: i + 2, lines: Vec::new() }),
            }
        } else if let Some(b) = open.as_mut() {
            b.lines.push(line.to_string());
        }
    }
    out
}

/// Sample values for the placeholders the docs use.
fn sample(placeholder: &str) -> String {
    let p = placeholder.trim_matches(|c| c == '<' || c == '>').to_ascii_lowercase();
    match p.as_str() {
        "golden" => "talos-worker-abc-v1.13.6".into(),
        "schematic" | "schematicid" | "id" => "ce4c980550dd2ab1b17bbf2b08801c7eb59418eafe8f279833297925d67c7515".into(),
        "version" => "v1.13.6".into(),
        "asset" => "openstack-amd64.raw.xz".into(),
        "base-url" | "url" | "mirror" => "http://127.0.0.1:5000".into(),
        "shell" => "bash".into(),
        _ => format!("sample-{}", p.replace(|c: char| !c.is_ascii_alphanumeric(), "-")),
    }
}

/// Replace `<placeholder>`s (also inside words, as in `<schematic>/<version>/<asset>`).
fn fill(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find('<') {
        let Some(len) = rest[start..].find('>') else { break };
        out.push_str(&rest[..start]);
        out.push_str(&sample(&rest[start..=start + len]));
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    out
}

/// Split a shell command line into words: '…' and "…" quoting, backslash escapes; stops at an
/// unquoted `|`, `&`, `;`, `>`, `<` or `#` (a pipe, redirect or comment ends tender's part).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut has = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                has = true;
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                    cur.push(d);
                }
            }
            '"' => {
                has = true;
                while let Some(d) = chars.next() {
                    match d {
                        '"' => break,
                        '\\' => cur.extend(chars.next()),
                        _ => cur.push(d),
                    }
                }
            }
            '\\' => {
                has = true;
                cur.extend(chars.next());
            }
            '|' | '&' | ';' | '>' | '#' => break,
            // process substitution `<(cmd …)`: a file name to tender
            '<' if chars.peek() == Some(&'(') => {
                for d in chars.by_ref() {
                    if d == ')' {
                        break;
                    }
                }
                cur.push_str("/dev/fd/63");
                has = true;
            }
            c if c.is_whitespace() => {
                if has {
                    out.push(std::mem::take(&mut cur));
                    has = false;
                }
            }
            c => {
                has = true;
                cur.push(c);
            }
        }
    }
    if has {
        out.push(cur);
    }
    out
}

/// The `tender …` command lines of a code block (continuation lines joined).
fn tender_lines(b: &Block) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.lines.len() {
        let first = i;
        let mut line = b.lines[i].trim().to_string();
        while line.ends_with('\\') && i + 1 < b.lines.len() {
            line.pop();
            i += 1;
            line.push(' ');
            line.push_str(b.lines[i].trim());
        }
        i += 1;
        let line = line.strip_prefix("$ ").unwrap_or(&line).to_string();
        let cmd = if line.starts_with("tender ") {
            Some(line.as_str())
        } else {
            line.find(" -- tender ").map(|at| &line[at + 4..])
        };
        if let Some(cmd) = cmd {
            out.push((b.line + first, cmd.to_string()));
        }
    }
    out
}

/// Whether clap accepts `args` (help and version requests count as accepted).
fn parses(args: &[String]) -> Result<(), String> {
    match Cli::try_parse_from(args) {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) => {
            Ok(())
        }
        Err(e) => Err(e.render().to_string()),
    }
}

#[test]
fn should_parse_every_tender_command_line_in_the_docs() {
    let mut failures = Vec::new();
    let mut seen = 0;
    for (doc, text) in documents() {
        for b in blocks(&text) {
            for (line, cmd) in tender_lines(&b) {
                seen += 1;
                // a synopsis (`[--flag VALUE]` groups) is checked in every expansion
                let variants =
                    if cmd.contains(" [-") || cmd.contains(" (-") { expand(&cmd) } else { vec![cmd.clone()] };
                for v in variants {
                    let args: Vec<String> = words(&fill(&v)).iter().map(|w| table_value(w)).collect();
                    if let Err(e) = parses(&args) {
                        failures.push(format!("{doc}:{line}: {cmd}\n  as: {}\n{e}", args.join(" ")));
                    }
                }
            }
        }
    }
    assert!(seen >= 10, "only {seen} tender command lines found: is the scan broken?");
    assert!(
        failures.is_empty(),
        "{} command lines in the docs do not parse:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Expand a synopsis: every optional group `[…]` is left out in one variant and put in, with
/// each of its `a|b` alternatives in turn, in the others; `…` (repeat) marks are dropped.
fn expand(synopsis: &str) -> Vec<String> {
    let s = synopsis.replace('…', "").replace("...", "").replace("\\|", "|");
    // the innermost group first: the first closing bracket closes the last opener before it;
    // `[…]` may be left out, `(a | b)` must take one of its alternatives
    if let Some(end) = s.find([']', ')']) {
        let (open, optional) = if s[end..].starts_with(']') { ('[', true) } else { ('(', false) };
        let start = s[..end].rfind(open).expect("balanced brackets in a synopsis");
        let (before, inner, after) = (&s[..start], &s[start + 1..end], &s[end + 1..]);
        let mut variants: Vec<String> = alternatives(inner).iter().map(|alt| format!("{before}{alt}{after}")).collect();
        if optional {
            variants.push(format!("{before}{after}"));
        }
        let mut out: Vec<String> = variants.iter().flat_map(|v| expand(v)).collect();
        out.sort();
        out.dedup();
        return out;
    }
    // a value alternative like `text|json` or `raw|qcow2`: one variant each
    if let Some(word) = s.split_whitespace().find(|w| w.contains('|')) {
        return word.split('|').flat_map(|alt| expand(&s.replacen(word, alt, 1))).collect();
    }
    vec![s.split_whitespace().collect::<Vec<_>>().join(" ")]
}

/// `--server URL | --data DIR` -> ["--server URL", "--data DIR"]; `--output table|json` -> itself
/// (value alternatives are expanded later, word by word).
fn alternatives(inner: &str) -> Vec<String> {
    if inner.contains(" | ") {
        inner.split(" | ").map(|a| a.trim().to_string()).collect()
    } else {
        vec![inner.to_string()]
    }
}

/// Sample values for the upper-case placeholders of the command table.
fn table_value(w: &str) -> String {
    match w {
        "FILE" | "ADMIN_TOKEN" => "/tmp/sample-file".into(),
        "DIR" => "/tmp/sample-dir".into(),
        "ADDR" => "127.0.0.1:5000".into(),
        "URL" => "http://127.0.0.1:5000".into(),
        "NAME=URL" => "ghcr.io=http://127.0.0.1:5001".into(),
        "SIZE" => "10Gi".into(),
        "PATH" => "/tmp/sample-path".into(),
        "D" | "DURATION" => "5m".into(),
        "BASE_URL" => "http://127.0.0.1:5000".into(),
        "HOST" => "ghcr.io".into(),
        "V" => "v1.13.6".into(),
        "ID" => sample("schematic"),
        "REF" | "IMAGE" => "ghcr.io/siderolabs/kubelet:v1.35.0".into(),
        "R" => "ghcr.io/siderolabs/kubelet".into(),
        "DIGEST" | "INDEX_DIGEST" => format!("sha256:{}", "0".repeat(64)),
        "P" | "W" | "NAME" | "USER" => "sample".into(),
        _ => w.into(),
    }
}

#[test]
fn should_parse_every_synopsis_of_the_command_table() {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut failures = Vec::new();
    let mut seen = 0;
    for line in text.lines().filter(|l| l.starts_with("| `tender ")) {
        let cell = line.trim_start_matches("| ").split(" | ").next().unwrap();
        if cell.trim_end().ends_with(" …`") {
            continue; // `tender render …`: a pointer to the command's own page
        }
        // a cell may hold several synopses: `tender catalog ls …`, `catalog rm …`
        for code in cell.split('`').skip(1).step_by(2) {
            let code = code.trim().trim_end_matches('…').trim();
            if code.is_empty() {
                continue;
            }
            let full = if code.starts_with("tender ") { code.to_string() } else { format!("tender {code}") };
            for variant in expand(&full) {
                seen += 1;
                let args: Vec<String> = words(&fill(&variant)).iter().map(|w| table_value(w)).collect();
                if let Err(e) = parses(&args) {
                    failures.push(format!("{full}\n  as: {}\n{e}", args.join(" ")));
                }
            }
        }
    }
    assert!(seen >= 30, "only {seen} synopsis variants found: is the scan broken?");
    assert!(failures.is_empty(), "{} synopsis variants do not parse:\n\n{}", failures.len(), failures.join("\n"));
}

/// Top-level keys that mark a YAML block as a tender config file (Kubernetes manifests, Talos
/// machine configs and render inputs have other first keys).
const CONFIG_KEYS: &[&str] = &[
    "listen",
    "data",
    "logFormat",
    "defaultUpstream",
    "imageFactory",
    "upstreams",
    "fetch",
    "cache",
    "catalog",
    "tls",
    "auth",
    "admin",
    "limits",
    "parent",
    "storage",
    "imageVerification",
];

#[test]
fn should_know_every_config_key_of_the_docs_yaml() {
    let mut failures = Vec::new();
    let mut seen = 0;
    for (doc, text) in documents() {
        for b in blocks(&text).into_iter().filter(|b| b.info == "yaml" || b.info == "yml") {
            let yaml = fill(&b.lines.join("\n"));
            let Ok(serde_norway::Value::Mapping(m)) = serde_norway::from_str::<serde_norway::Value>(&yaml) else {
                continue;
            };
            let keys: Vec<&str> = m.keys().filter_map(|k| k.as_str()).collect();
            if keys.iter().any(|k| ["apiVersion", "machine", "cluster"].contains(k))
                || !keys.iter().any(|k| CONFIG_KEYS.contains(k))
            {
                continue;
            }
            seen += 1;
            let name = format!("{doc}:{}", b.line);
            match tender_config::parse(&name, &yaml) {
                Err(e) => failures.push(format!("{name}: {e}")),
                Ok(raw) if raw.catalog.is_some() => {
                    if let Err(e) = tender_config::resolve(&name, raw, &tender_config::Overrides::default()) {
                        if e.to_string().contains("catalog") {
                            failures.push(format!("{name}: {e}"));
                        }
                    }
                }
                Ok(_) => {}
            }
        }
    }
    assert!(seen >= 3, "only {seen} config blocks found: is the scan broken?");
    assert!(failures.is_empty(), "config blocks in the docs that tender refuses:\n{}", failures.join("\n"));
}

#[test]
fn should_expand_synopses_and_split_words_like_a_shell() {
    let v = expand("tender x [--a A] [--b b1|b2]");
    assert_eq!(v.len(), 6, "{v:?}");
    assert!(v.contains(&"tender x".to_string()), "{v:?}");
    assert!(v.iter().any(|s| s.split_whitespace().eq(["tender", "x", "--a", "A", "--b", "b2"])), "{v:?}");
    assert!(v.iter().any(|s| s.split_whitespace().eq(["tender", "x", "--b", "b1"])), "{v:?}");
    let v = expand("tender z (--server URL | --data DIR)");
    assert_eq!(v, ["tender z --data DIR", "tender z --server URL"]);
    let v = expand("tender y [--server URL | --data DIR]");
    assert!(v.iter().any(|s| s.split_whitespace().eq(["tender", "y", "--data", "DIR"])), "{v:?}");
    assert_eq!(words("tender a 'b c' \"d\\\"e\" f\\ g | jq"), ["tender", "a", "b c", "d\"e", "f g"]);
    assert_eq!(words("tender x --f <(kubectl get y -o yaml) | k"), ["tender", "x", "--f", "/dev/fd/63"]);
    assert_eq!(fill("trust --reset <schematic>/<version>"), format!("trust --reset {}/v1.13.6", sample("schematic")));
}
