//! `imageVerification:` in tender's config: Talos' `ImageVerificationConfig` rules (ordered,
//! first match applies), plus `publicKey.key` and a pinned `trustedRoot`. Compiled once at
//! start; a rule that cannot work is refused with its key named.

use regex::Regex;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::keys::PublicKey;
use crate::root::TrustedRoot;

/// The most rules a policy holds.
pub const MAX_RULES: usize = 1024;

/// `imageVerification:` as written. The Talos document's `apiVersion` and `kind` may be kept
/// when a Talos rule file is pasted in whole.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A Sigstore `trusted_root.json` (Fulcio chains, Rekor and CT log keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_root: Option<String>,
    #[serde(default)]
    pub rules: Vec<RawRule>,
}

/// One rule, with exactly the fields of Talos' `ImageVerificationRuleV1Alpha1` (and `key`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawRule {
    pub image: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deny: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless: Option<RawKeyless>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<RawPublicKey>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawKeyless {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject_regex: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RawPublicKey {
    /// Talos' field: a PEM certificate, or a bare PEM public key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// tender's: a PEM public key as `cosign generate-key-pair` writes `cosign.pub`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A refused policy: the config key and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct PolicyError {
    pub key: String,
    pub problem: String,
}

fn refuse(key: impl Into<String>, problem: impl Into<String>) -> PolicyError {
    PolicyError { key: key.into(), problem: problem.into() }
}

/// What a rule does with the images it matches.
#[derive(Clone, Debug)]
pub enum Action {
    /// Served as today, unverified.
    Skip,
    /// Refused without asking the upstream.
    Deny,
    /// A signature by this key.
    Key(PublicKey),
    /// A Fulcio certificate for this identity, verified against the trusted root.
    Keyless { issuer: String, subject: Option<String>, subject_regex: Option<Regex> },
}

/// A compiled rule.
#[derive(Clone, Debug)]
pub struct Rule {
    /// Its place in `rules` (0-based).
    pub index: usize,
    /// Its `image` pattern as written.
    pub image: String,
    pub action: Action,
    /// `sha256:<hex>` of the rule as written (and the trusted root, for keyless): a stored
    /// verdict holds for this fingerprint only, so a changed rule verifies again.
    pub fingerprint: String,
    glob: Glob,
}

impl Rule {
    /// `rules[2] (ghcr.io/org/*)`: how refusals and verdicts name the rule.
    pub fn name(&self) -> String {
        format!("imageVerification.rules[{}] ({})", self.index, self.image)
    }

    pub fn verifies(&self) -> bool {
        matches!(self.action, Action::Key(_) | Action::Keyless { .. })
    }
}

/// A compiled policy.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub rules: Vec<Rule>,
    pub trusted_root: Option<TrustedRoot>,
    /// The policy as given, for `render` to write back as Talos' document.
    pub raw: RawPolicy,
}

impl Policy {
    /// Compile `raw`; `trusted_root` is the file `raw.trusted_root` names, already read.
    pub fn compile(raw: &RawPolicy, trusted_root: Option<&[u8]>) -> Result<Policy, PolicyError> {
        if let Some(v) = &raw.api_version {
            if v != "v1alpha1" {
                return Err(refuse("imageVerification.apiVersion", format!("{v:?} is not v1alpha1")));
            }
        }
        if let Some(k) = &raw.kind {
            if k != "ImageVerificationConfig" {
                return Err(refuse("imageVerification.kind", format!("{k:?} is not ImageVerificationConfig")));
            }
        }
        if raw.rules.len() > MAX_RULES {
            return Err(refuse("imageVerification.rules", format!("{} rules (at most {MAX_RULES})", raw.rules.len())));
        }
        let root = match (&raw.trusted_root, trusted_root) {
            (Some(_), Some(bytes)) => {
                Some(TrustedRoot::parse(bytes).map_err(|e| refuse("imageVerification.trustedRoot", e))?)
            }
            _ => None,
        };
        let mut rules = Vec::with_capacity(raw.rules.len());
        for (index, r) in raw.rules.iter().enumerate() {
            let key = |k: &str| format!("imageVerification.rules[{index}].{k}");
            let glob = Glob::parse(&r.image).map_err(|e| refuse(key("image"), e))?;
            let set = usize::from(r.skip)
                + usize::from(r.deny)
                + usize::from(r.keyless.is_some())
                + usize::from(r.public_key.is_some());
            if set != 1 {
                return Err(refuse(
                    format!("imageVerification.rules[{index}]"),
                    "give exactly one of skip, deny, keyless and publicKey",
                ));
            }
            let action = if r.skip {
                Action::Skip
            } else if r.deny {
                Action::Deny
            } else if let Some(k) = &r.keyless {
                let issuer = k.issuer.clone().filter(|i| !i.is_empty()).ok_or_else(|| {
                    refuse(key("keyless.issuer"), "keyless needs the OIDC issuer (https://accounts.google.com, https://token.actions.githubusercontent.com)")
                })?;
                let subject = k.subject.clone().filter(|s| !s.is_empty());
                let subject_regex =
                    match k.subject_regex.as_deref().filter(|s| !s.is_empty()) {
                        Some(re) => Some(Regex::new(re).map_err(|e| {
                            refuse(key("keyless.subjectRegex"), format!("not a regular expression: {e}"))
                        })?),
                        None => None,
                    };
                if subject.is_none() && subject_regex.is_none() {
                    return Err(refuse(
                        key("keyless"),
                        "keyless needs subject or subjectRegex (the signer's identity)",
                    ));
                }
                if root.is_none() {
                    return Err(refuse(
                        "imageVerification.trustedRoot",
                        format!("rules[{index}] is keyless: name a Sigstore trusted_root.json to verify it offline"),
                    ));
                }
                Action::Keyless { issuer, subject, subject_regex }
            } else {
                let pk = r.public_key.as_ref().ok_or_else(|| refuse(key("publicKey"), "empty"))?;
                let (field, pem) = match (&pk.certificate, &pk.key) {
                    (Some(c), None) => ("publicKey.certificate", c),
                    (None, Some(k)) => ("publicKey.key", k),
                    _ => return Err(refuse(key("publicKey"), "give one of certificate and key")),
                };
                Action::Key(PublicKey::from_pem(pem).map_err(|e| refuse(key(field), e))?)
            };
            let mut h = Sha256::new();
            h.update(serde_json::to_vec(r).unwrap_or_default());
            if matches!(action, Action::Keyless { .. }) {
                if let Some(root) = &root {
                    h.update(root.digest.as_bytes());
                }
            }
            let fingerprint = format!("sha256:{}", hex::encode(h.finalize()));
            rules.push(Rule { index, image: r.image.clone(), action, fingerprint, glob });
        }
        Ok(Policy { rules, trusted_root: root, raw: raw.clone() })
    }

    /// The first rule matching `image` (a normalised `registry/repository`), if any. A Docker
    /// Hub image matches as `docker.io/...` and as `index.docker.io/...` (Talos v1.13 matches
    /// the latter; its later docs the former): a rule written either way applies.
    pub fn rule_for(&self, image: &str) -> Option<&Rule> {
        let index = image.strip_prefix("docker.io/").map(|rest| format!("index.docker.io/{rest}"));
        self.rules.iter().find(|r| r.glob.matches(image) || index.as_deref().is_some_and(|i| r.glob.matches(i)))
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// The name rules match: `registry/repository`, lowercased registry, Docker Hub as `docker.io`
/// with its `library/` prefix (as Talos and containerd normalise a reference).
pub fn normalise(registry: &str, repository: &str) -> String {
    let registry = registry.to_ascii_lowercase();
    let registry = match registry.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io",
        r => r,
    };
    if registry == "docker.io" && !repository.contains('/') {
        return format!("docker.io/library/{repository}");
    }
    format!("{registry}/{repository}")
}

/// An `image` pattern as Talos matches it (ryanuber/go-glob): `*` is any run of characters,
/// `/` included; everything else is literal. Matched against the whole normalised name.
#[derive(Clone, Debug)]
struct Glob {
    re: Regex,
}

impl Glob {
    fn parse(pattern: &str) -> Result<Glob, String> {
        if pattern.is_empty() {
            return Err("an empty image pattern".into());
        }
        if pattern.len() > 1024 {
            return Err("an image pattern longer than 1024 characters".into());
        }
        if pattern.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(format!("{pattern:?} holds a space or control character"));
        }
        let parts: Vec<String> = pattern.split('*').map(regex::escape).collect();
        let re = Regex::new(&format!("^{}$", parts.join(".*"))).map_err(|e| format!("{pattern:?}: {e}"))?;
        Ok(Glob { re })
    }

    fn matches(&self, name: &str) -> bool {
        self.re.is_match(name)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn rule(image: &str) -> RawRule {
        RawRule { image: image.into(), skip: true, ..RawRule::default() }
    }

    #[test]
    fn should_normalise_as_talos_does() {
        assert_eq!(normalise("docker.io", "alpine"), "docker.io/library/alpine");
        assert_eq!(normalise("registry-1.docker.io", "library/alpine"), "docker.io/library/alpine");
        assert_eq!(normalise("GHCR.io", "org/app"), "ghcr.io/org/app");
    }

    #[test]
    fn should_match_first_rule_in_order() {
        let raw = RawPolicy {
            rules: vec![rule("ghcr.io/org/*"), RawRule { deny: true, skip: false, ..rule("*") }],
            ..Default::default()
        };
        let p = Policy::compile(&raw, None).unwrap();
        assert_eq!(p.rule_for("ghcr.io/org/a/b").unwrap().index, 0);
        assert_eq!(p.rule_for("ghcr.io/other/a").unwrap().index, 1);
        let g = Glob::parse("factory.talos.dev/*").unwrap();
        assert!(g.matches("factory.talos.dev/metal-installer/376567988ad3"), "'*' crosses '/' as in Talos");
        assert!(!g.matches("factory.talos.dev"));
        let g = Glob::parse("ghcr.io/a?c[1].*").unwrap();
        assert!(g.matches("ghcr.io/a?c[1].x/y"), "only '*' is special");
        assert!(!g.matches("ghcr.io/abc1.x"));
        let hub =
            Policy::compile(&RawPolicy { rules: vec![rule("index.docker.io/library/*")], ..Default::default() }, None)
                .unwrap();
        assert!(hub.rule_for("docker.io/library/alpine").is_some(), "a Talos v1.13 rule for Docker Hub");
        assert!(hub.rule_for("ghcr.io/library/alpine").is_none());
    }

    #[test]
    fn should_refuse_a_rule_that_cannot_work_naming_its_key() {
        let cases: Vec<(RawPolicy, &str)> = vec![
            (
                RawPolicy { rules: vec![RawRule { skip: false, ..rule("x") }], ..Default::default() },
                "imageVerification.rules[0]",
            ),
            (
                RawPolicy { rules: vec![RawRule { deny: true, ..rule("x") }], ..Default::default() },
                "imageVerification.rules[0]",
            ),
            (RawPolicy { rules: vec![rule("ghcr.io/a b")], ..Default::default() }, "imageVerification.rules[0].image"),
            (RawPolicy { rules: vec![rule("")], ..Default::default() }, "imageVerification.rules[0].image"),
            (
                RawPolicy {
                    rules: vec![RawRule {
                        skip: false,
                        keyless: Some(RawKeyless {
                            issuer: Some("https://i".into()),
                            subject: Some("s".into()),
                            subject_regex: None,
                        }),
                        ..rule("x")
                    }],
                    ..Default::default()
                },
                "imageVerification.trustedRoot",
            ),
            (
                RawPolicy {
                    rules: vec![RawRule {
                        skip: false,
                        keyless: Some(RawKeyless { issuer: None, subject: Some("s".into()), subject_regex: None }),
                        ..rule("x")
                    }],
                    ..Default::default()
                },
                "imageVerification.rules[0].keyless.issuer",
            ),
            (
                RawPolicy {
                    rules: vec![RawRule {
                        skip: false,
                        public_key: Some(RawPublicKey { certificate: Some("not pem".into()), key: None }),
                        ..rule("x")
                    }],
                    ..Default::default()
                },
                "imageVerification.rules[0].publicKey.certificate",
            ),
            (RawPolicy { kind: Some("KubeletConfig".into()), ..Default::default() }, "imageVerification.kind"),
        ];
        for (raw, key) in cases {
            let e = Policy::compile(&raw, None).unwrap_err();
            assert_eq!(e.key, key, "{e}");
        }
    }
}
