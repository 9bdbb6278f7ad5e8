//! The rules of the Cozystack behaviour spec (§6) that have a renderer form, and the shape checks
//! every rendered value goes through.
//!
//! A [`Refusal`] names the rule, the field, the offending value and the fix. Rendering refuses
//! instead of emitting something that would fail later (or silently do the wrong thing) on the
//! cluster.

use std::fmt;

use crate::url::{has_credentials, parse_http_url};

/// A rule of the spec, named the way the spec names it (`R-6`, `G-7`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Duplicate catalog entries.
    G7,
    /// Catalog schematic / version shape.
    G8,
    /// A catalog entry edited after its golden exists.
    G9,
    /// `osImage.builtin` and `osImage.factory` are mutually exclusive.
    P1,
    /// Builtin, and the golden is absent.
    R1,
    /// Builtin, and the golden import `Failed`.
    R2,
    /// Builtin, and the StorageClasses differ.
    R3,
    /// Builtin, and `diskSize` is smaller than the golden.
    R4,
    /// The Talos / Kubernetes support matrix.
    R5,
    /// The schematic is not lowercase alphanumeric.
    R6,
    /// The version is not `vMAJOR.MINOR.PATCH`.
    R7,
    /// The Image Factory URL is empty (or not a plain http(s) URL).
    R8,
    /// An empty StorageClass resolves to the cluster default.
    D1,
    /// A value interpolated into an image coordinate carries a control character.
    ControlCharacter,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Rule::G7 => "G-7",
            Rule::G8 => "G-8",
            Rule::G9 => "G-9",
            Rule::P1 => "P-1",
            Rule::R1 => "R-1",
            Rule::R2 => "R-2",
            Rule::R3 => "R-3",
            Rule::R4 => "R-4",
            Rule::R5 => "R-5",
            Rule::R6 => "R-6",
            Rule::R7 => "R-7",
            Rule::R8 => "R-8",
            Rule::D1 => "D-1",
            Rule::ControlCharacter => "control characters",
        };
        f.write_str(s)
    }
}

/// Why an input was refused: the rule (when one applies), the field and value, the problem and
/// what the operator can do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub rule: Option<Rule>,
    pub field: String,
    pub value: String,
    pub problem: String,
    pub fix: String,
}

impl Refusal {
    pub fn new(
        rule: Option<Rule>,
        field: impl Into<String>,
        value: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Refusal { rule, field: field.into(), value: value.into(), problem: problem.into(), fix: fix.into() }
    }

    /// A refusal that no rule of the spec names (a malformed host, a duplicate flag, ...).
    pub fn input(
        field: impl Into<String>,
        value: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Refusal::new(None, field, value, problem, fix)
    }

    /// Prefix the field with where it sits (`talos.` + `schematicID`).
    pub fn within(mut self, prefix: &str) -> Self {
        if !prefix.is_empty() {
            self.field = format!("{prefix}{}", self.field);
        }
        self
    }
}

impl std::error::Error for Refusal {}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(rule) = self.rule {
            write!(f, "{rule}: ")?;
        }
        // Debug formatting escapes control characters, so a hostile value cannot rewrite the
        // operator's terminal; long values (PEM blocks) are cut.
        let shown: String = self.value.chars().take(120).collect();
        let cut = if shown.len() < self.value.len() { "…" } else { "" };
        let (field, problem, fix) = (printable(&self.field), printable(&self.problem), printable(&self.fix));
        write!(f, "{field} {shown:?}{cut} {problem}; fix: {fix}")
    }
}

/// `text` with every control character escaped (`\0`, `\n`, `\u{1b}`): the field, problem and
/// fix of a refusal may quote the hostile value too, and must not rewrite the terminal either.
fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return text.into();
    }
    text.chars()
        .map(|c| if c.is_control() { c.escape_debug().to_string() } else { c.to_string() })
        .collect::<String>()
        .into()
}

/// The Cozystack Kubernetes version map (§2.1, `files/versions.yaml`): minor -> patch, newest
/// first. A test keeps it equal to `shared/reference/cozystack/kubernetes-versions.yaml`.
pub const KUBERNETES_VERSIONS: &[(&str, &str)] =
    &[("v1.35", "v1.35.6"), ("v1.34", "v1.34.9"), ("v1.33", "v1.33.13"), ("v1.32", "v1.32.13"), ("v1.31", "v1.31.14")];

/// The Talos -> Kubernetes support matrix (§2.2; Siderolabs' published support matrix per
/// Talos minor). Cozystack lists only v1.13; the two earlier minors are listed too so a pool
/// pinned to an older Talos through `osImage.*` is checked as well. A Talos minor missing here
/// passes (N-3).
pub const TALOS_SUPPORT_MATRIX: &[(&str, &[&str])] = &[
    ("v1.13", &["v1.31", "v1.32", "v1.33", "v1.34", "v1.35", "v1.36"]),
    ("v1.12", &["v1.30", "v1.31", "v1.32", "v1.33", "v1.34", "v1.35"]),
    ("v1.11", &["v1.29", "v1.30", "v1.31", "v1.32", "v1.33", "v1.34"]),
];

/// Map a Kubernetes minor (`v1.35`) to its full patch (`v1.35.6`).
pub fn kubernetes_patch(field: &str, minor: &str) -> Result<&'static str, Refusal> {
    KUBERNETES_VERSIONS.iter().find(|(m, _)| *m == minor).map(|(_, p)| *p).ok_or_else(|| {
        let allowed: Vec<&str> = KUBERNETES_VERSIONS.iter().map(|(m, _)| *m).collect();
        Refusal::input(
            field,
            minor,
            "is not a supported Kubernetes version",
            format!("use one of [{}]", allowed.join(", ")),
        )
    })
}

/// refuse a Talos release the matrix lists with a Kubernetes minor outside its window.
/// The Talos minor is the leading `vX.Y` of the release; an unlisted minor passes (N-3).
pub fn check_support_matrix(talos_field: &str, talos_version: &str, kubernetes_minor: &str) -> Result<(), Refusal> {
    let Some(minor) = leading_minor(talos_version) else {
        return Ok(());
    };
    let Some((_, supported)) = TALOS_SUPPORT_MATRIX.iter().find(|(m, _)| *m == minor) else {
        return Ok(());
    };
    if supported.contains(&kubernetes_minor) {
        return Ok(());
    }
    Err(Refusal::new(
        Some(Rule::R5),
        talos_field,
        talos_version,
        format!("does not support Kubernetes {kubernetes_minor}; Talos {minor} supports [{}]", supported.join(", ")),
        "bump kubernetesVersion, or pick a Talos release whose window includes it",
    ))
}

/// The leading `^v[0-9]+\.[0-9]+` of a version, if any.
pub fn leading_minor(version: &str) -> Option<&str> {
    let rest = version.strip_prefix('v')?;
    let major_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    if major_len == 0 || rest.as_bytes().get(major_len) != Some(&b'.') {
        return None;
    }
    let after = &rest[major_len + 1..];
    let minor_len = after.bytes().take_while(u8::is_ascii_digit).count();
    if minor_len == 0 {
        return None;
    }
    Some(&version[..1 + major_len + 1 + minor_len])
}

/// R-6 (and G-8): a schematic ID is plain lowercase alphanumeric, because it is interpolated
/// into a DataVolume name and an image URL.
pub fn check_schematic(rule: Rule, field: &str, value: &str) -> Result<(), Refusal> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return Ok(());
    }
    Err(Refusal::new(
        Some(rule),
        field,
        value,
        "is not lowercase alphanumeric ([a-z0-9]+); it is interpolated into a DataVolume name and an image URL",
        "use the schematic ID the Image Factory returned (64 lowercase hex characters)",
    ))
}

/// R-7 (and G-8): a Talos version is exactly `vMAJOR.MINOR.PATCH`.
pub fn check_version(rule: Rule, field: &str, value: &str) -> Result<(), Refusal> {
    if is_release_version(value) {
        return Ok(());
    }
    Err(Refusal::new(
        Some(rule),
        field,
        value,
        "is not a vMAJOR.MINOR.PATCH Talos release (each number at most 6 digits); no image exists at a version like that",
        "spell the full release, e.g. v1.13.6",
    ))
}

/// `^v[0-9]{1,6}\.[0-9]{1,6}\.[0-9]{1,6}$`: the numbers are bounded so that every version
/// this accepts also parses as a `TalosVersion` (talos.rs, which bounds them alike; an
/// over-long one gets this rule's message, not a parse error).
pub fn is_release_version(value: &str) -> bool {
    let Some(rest) = value.strip_prefix('v') else {
        return false;
    };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.len() <= 6 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// the Image Factory URL is a plain http(s) URL (one trailing `/` stripped). Empty used to
/// render a scheme-less `/image/...` source. Returns the URL without a trailing slash.
pub fn check_factory_url(field: &str, value: &str) -> Result<String, Refusal> {
    let trimmed = value.strip_suffix('/').unwrap_or(value);
    check_no_credentials(field, value).map_err(|mut r| {
        r.rule = Some(Rule::R8);
        r
    })?;
    if trimmed.is_empty() {
        return Err(Refusal::new(
            Some(Rule::R8),
            field,
            value,
            "is empty; the disk source would be the scheme-less path /image/...",
            "set it to the Image Factory (or tender) base URL, e.g. https://factory.talos.dev",
        ));
    }
    match parse_http_url(trimmed) {
        Ok(url) => Ok(url.to_string()),
        Err(problem) => Err(Refusal::new(
            Some(Rule::R8),
            field,
            value,
            format!("is not a plain http(s) URL: {problem}"),
            "use scheme://host[:port][/path] with no query, credentials or special characters",
        )),
    }
}

/// Refuse control characters in an image coordinate (installer repository, URLs, names).
pub fn check_no_control(field: &str, value: &str) -> Result<(), Refusal> {
    if value.chars().any(char::is_control) {
        return Err(Refusal::new(
            Some(Rule::ControlCharacter),
            field,
            value,
            "carries a control character (newline, tab, ...); it would end up inside an image coordinate",
            "remove the control characters",
        ));
    }
    Ok(())
}

/// Refuse credentials in a URL as credentials (not as a bad port or host), without echoing
/// them: a URL is written into machine config, manifests and logs.
pub fn check_no_credentials(field: &str, value: &str) -> Result<(), Refusal> {
    if !has_credentials(value) {
        return Ok(());
    }
    let (scheme, rest) = value.split_once("://").unwrap_or(("", value));
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    Err(Refusal::input(
        field,
        format!("{scheme}://<redacted>@{host}"),
        "carries credentials (user:password@); a URL is written into machine configs, manifests and logs",
        "drop them from the URL and give them as registry auth (talos.registryConfig.<host>.auth, or render registries --username/--password-file)",
    ))
}

/// The length limits of the names tender generates (docs/render.md, "Names and their limits").
pub const DNS_SUBDOMAIN_MAX: usize = 253;
pub const LABEL_VALUE_MAX: usize = 63;

/// Refuse a generated name longer than its kind allows, naming the input field it grows from,
/// the name, its length and the limit.
pub fn check_name_length(rule: Option<Rule>, field: &str, name: &str, what: &str, limit: usize) -> Result<(), Refusal> {
    if name.len() <= limit {
        return Ok(());
    }
    Err(Refusal::new(
        rule,
        field,
        name,
        format!("makes the {what} {} characters long; Kubernetes allows at most {limit}", name.len()),
        format!("shorten {field} so the {what} stays within {limit} characters"),
    ))
}

/// A DNS-1123 label: 1..=63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A Kubernetes label name (the part after an optional prefix): 1..=63 of `[A-Za-z0-9._-]`,
/// starting and ending alphanumeric.
pub fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A duration the autoscaler and MachineHealthCheck read without rejecting bad values:
/// `^[1-9][0-9]{0,4}[smh]([0-9]{1,5}[smh]){0,2}$` (whole s/m/h, positive first segment).
pub fn is_positive_duration(s: &str) -> bool {
    let mut segments = Vec::new();
    let mut digits = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else if matches!(c, 's' | 'm' | 'h') {
            if digits.is_empty() {
                return false;
            }
            segments.push(std::mem::take(&mut digits));
        } else {
            return false;
        }
    }
    if !digits.is_empty() || segments.is_empty() || segments.len() > 3 {
        return false;
    }
    let first = &segments[0];
    first.len() <= 5 && !first.starts_with('0') && segments[1..].iter().all(|d| d.len() <= 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_take_the_leading_minor() {
        for (input, want) in [
            ("v1.13.6", Some("v1.13")),
            ("v1.13", Some("v1.13")),
            ("v1.13-rc", Some("v1.13")),
            ("1.13.6", None),
            ("v1", None),
            ("v1.", None),
            ("", None),
        ] {
            assert_eq!(leading_minor(input), want, "{input}");
        }
    }

    #[test]
    fn should_accept_positive_durations_only() {
        for ok in ["30m", "1h30m", "20m0s", "1h0m0s", "5m", "99999s"] {
            assert!(is_positive_duration(ok), "{ok}");
        }
        for bad in ["", "0m", "30", "-5m", "1.5h", "1d", "1h1m1s1s", "m", "100000s", "05m"] {
            assert!(!is_positive_duration(bad), "{bad}");
        }
    }

    #[test]
    fn should_print_no_control_character_in_a_refusal() {
        // The fuzz target render_registries found a NUL quoted in the problem text.
        let r = Refusal::input("--registry\u{1b}", "[a\0]", "[a\0] is not an IPv6 address", "fix\n it");
        let text = r.to_string();
        assert!(!text.chars().any(char::is_control), "{text:?}");
        assert!(text.contains("[a\\0] is not an IPv6 address"), "{text}");
    }

    #[test]
    fn should_name_the_rule_value_and_fix_in_a_refusal() {
        let r = check_schematic(Rule::R6, "talos.schematicID", "ABC").err();
        let text = r.map(|r| r.to_string()).unwrap_or_default();
        assert!(text.starts_with("R-6: talos.schematicID \"ABC\""), "{text}");
        assert!(text.contains("fix:"), "{text}");
    }
}
