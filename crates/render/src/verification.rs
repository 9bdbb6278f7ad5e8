//! tender's signature policy (`imageVerification:`, issue 34) in the rendered output: no
//! fallback around a refusal, and the policy for Talos nodes.
//!
//! - tender refuses (403) an image a `keyless`, `publicKey` or `deny` rule covers when it does
//!   not verify. containerd takes any error of a host as a reason to try the next one, and the
//!   upstream is listed last, so a node would pull the refused image straight from the
//!   registry. [`guard`] turns the fallback off for every namespace such a rule could match
//!   (Talos `skipFallback`, containerd `hosts.toml` with the mirror alone), and says why.
//! - [`ImageVerification::talos_document`] writes the same rules as Talos'
//!   `ImageVerificationConfig` (Talos 1.13 and later), so the nodes check signatures too.
//!
//! The policy is read with tender-verify's own types (the syntax tender serves by) and checked
//! the way `tender serve` checks it, but for the trusted root: Talos nodes have their own, and
//! rendering reads no file.

use serde::Deserialize;
use serde_json::{json, Map, Value};
use tender_verify::policy::{RawPolicy, RawRule};

use crate::registries::{MirrorPlan, Registry};
use crate::talos::{registry_documents, TalosVersion};
use crate::Error;

/// The names Docker Hub goes by; tender and Talos take them for one registry.
const DOCKER_HUB: &[&str] = &["docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"];

/// The registry name Talos 1.13 matches Docker Hub images by (go-containerregistry rewrites
/// `docker.io` to it); later Talos releases match `docker.io` and `index.docker.io` alike.
const TALOS_DOCKER_HUB: &str = "index.docker.io";

/// A checked signature policy, its rules in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageVerification {
    raw: RawPolicy,
}

/// `text` with its control characters escaped: a value quoted into a message or a comment.
fn printable(text: &str) -> String {
    text.chars().flat_map(|c| if c.is_control() { c.escape_debug().collect() } else { vec![c] }).collect()
}

fn malformed(what: &str, message: String) -> Error {
    Error::Malformed { what: printable(what), message: printable(&message) }
}

/// Only the key the policy lives under; the rest of tender's config is the server's.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigPart {
    #[serde(default)]
    image_verification: Option<RawPolicy>,
}

impl ImageVerification {
    /// `--config FILE`: tender's config (its `imageVerification:`), or a Talos
    /// `ImageVerificationConfig` document (`kind: ImageVerificationConfig` at the top). `None`
    /// when the file holds no policy. `what` names the file in refusals.
    pub fn read(what: &str, text: &str) -> Result<Option<ImageVerification>, Error> {
        let yaml = |e: serde_norway::Error| malformed(what, crate::yaml::humane(&e.to_string()));
        let doc: Value = serde_norway::from_str::<Option<Value>>(text).map_err(yaml)?.unwrap_or(Value::Null);
        let raw = if doc.get("kind").and_then(Value::as_str) == Some("ImageVerificationConfig") {
            Some(serde_norway::from_str::<RawPolicy>(text).map_err(yaml)?)
        } else if doc.is_null() {
            None
        } else {
            serde_norway::from_str::<ConfigPart>(text).map_err(yaml)?.image_verification
        };
        raw.map(|r| ImageVerification::new(r).map_err(|e| malformed(what, e.to_string()))).transpose()
    }

    /// Check `raw` as `tender serve` does (`tender_verify::Policy::compile`): a refusal names
    /// the key. Keyless rules are checked here, field by field with compile's words, because
    /// compile also wants the trusted root for them, which rendering neither needs nor reads.
    pub fn new(raw: RawPolicy) -> Result<ImageVerification, Error> {
        let bad = |key: String, problem: &str| Error::Malformed { what: key, message: problem.to_string() };
        let mut shadow = raw.clone();
        shadow.trusted_root = None;
        for (i, rule) in shadow.rules.iter_mut().enumerate() {
            let Some(k) = &rule.keyless else { continue };
            if rule.skip || rule.deny || rule.public_key.is_some() {
                continue; // compile refuses it as it is
            }
            let key = |k: &str| format!("imageVerification.rules[{i}].{k}");
            if k.issuer.as_deref().is_none_or(str::is_empty) {
                return Err(bad(
                    key("keyless.issuer"),
                    "keyless needs the OIDC issuer (https://accounts.google.com, https://token.actions.githubusercontent.com)",
                ));
            }
            let subject = k.subject.as_deref().filter(|s| !s.is_empty());
            let regex = k.subject_regex.as_deref().filter(|s| !s.is_empty());
            if let Some(re) = regex {
                regex::Regex::new(re).map_err(|e| Error::Malformed {
                    what: key("keyless.subjectRegex"),
                    message: printable(&format!("not a regular expression: {e}")),
                })?;
            }
            if subject.is_none() && regex.is_none() {
                return Err(bad(key("keyless"), "keyless needs subject or subjectRegex (the signer's identity)"));
            }
            *rule = RawRule { image: rule.image.clone(), skip: true, ..RawRule::default() };
        }
        tender_verify::Policy::compile(&shadow, None)
            .map_err(|e| Error::Malformed { what: printable(&e.key), message: printable(&e.problem) })?;
        Ok(ImageVerification { raw })
    }

    pub fn rules(&self) -> &[RawRule] {
        &self.raw.rules
    }

    pub fn is_empty(&self) -> bool {
        self.raw.rules.is_empty()
    }

    /// The rules that refuse images (keyless, publicKey, deny; never skip) and could match an
    /// image of `registry`, by index. `named` is every registry rendered by its own name: `*`
    /// (containerd's `_default`) carries the images of every other registry.
    pub fn refusing_rules(&self, registry: &Registry, named: &[Registry]) -> Vec<usize> {
        let refuses = |r: &RawRule| !r.skip && (r.deny || r.keyless.is_some() || r.public_key.is_some());
        let named: Vec<String> = named
            .iter()
            .filter_map(|r| match r {
                Registry::Host(a) => Some(hub(&a.to_string()).to_string()),
                Registry::All => None,
            })
            .collect();
        self.raw
            .rules
            .iter()
            .enumerate()
            .filter(|(_, r)| refuses(r))
            .filter(|(_, r)| match registry {
                Registry::Host(a) => could_match(&r.image, &a.to_string()),
                Registry::All => fixed_registry(&r.image).is_none_or(|reg| !named.iter().any(|n| n == hub(reg))),
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Why `registry` must not fall back, naming the first rule that refuses its images; `None`
    /// when no rule does.
    pub fn fallback_reason(&self, registry: &Registry, named: &[Registry]) -> Option<String> {
        let rules = self.refusing_rules(registry, named);
        let first = *rules.first()?;
        let r = &self.raw.rules[first];
        let verb = if r.deny { "denies" } else { "verifies" };
        let whose = match registry {
            Registry::All => "registries not named on their own".to_string(),
            Registry::Host(a) => a.to_string(),
        };
        let more = match rules.len() - 1 {
            0 => String::new(),
            1 => " (and 1 more rule)".to_string(),
            n => format!(" (and {n} more rules)"),
        };
        Some(printable(&format!("imageVerification.rules[{first}] ({}) {verb} images of {whose}{more}", r.image)))
    }

    /// The rules as Talos' `ImageVerificationConfig` v1alpha1 (the fields of Talos v1.13's
    /// `ImageVerificationRuleV1Alpha1`, in order), with the comments that say what changed on
    /// the way: tender's `publicKey.key` goes into `certificate` (Talos takes a bare public key
    /// there), `trustedRoot` stays with tender, and Docker Hub is named as Talos 1.13 matches it.
    pub fn talos_document(&self) -> (Value, Vec<String>) {
        let mut notes = vec![
            "tender's imageVerification for the nodes themselves (Talos 1.13 and later): the same rules, in order, first match applies".to_string(),
        ];
        let mut rules = Vec::new();
        for (i, r) in self.raw.rules.iter().enumerate() {
            let mut rule = Map::new();
            let image = match r.image.strip_prefix("docker.io/") {
                Some(rest) => {
                    let image = format!("{TALOS_DOCKER_HUB}/{rest}");
                    notes.push(printable(&format!(
                        "rules[{i}] {} is written as {image}: Talos 1.13 matches Docker Hub images as {TALOS_DOCKER_HUB}/..., later releases either way",
                        r.image
                    )));
                    image
                }
                None => r.image.clone(),
            };
            rule.insert("image".into(), json!(image));
            if r.skip {
                rule.insert("skip".into(), json!(true));
            }
            if r.deny {
                rule.insert("deny".into(), json!(true));
            }
            if let Some(k) = &r.keyless {
                let mut keyless = Map::new();
                for (name, v) in [("issuer", &k.issuer), ("subject", &k.subject), ("subjectRegex", &k.subject_regex)] {
                    if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                        keyless.insert(name.into(), json!(v));
                    }
                }
                rule.insert("keyless".into(), Value::Object(keyless));
            }
            if let Some(p) = &r.public_key {
                if p.key.is_some() {
                    notes.push(format!(
                        "rules[{i}] publicKey.key (tender's) is written as publicKey.certificate, which also takes a bare PEM public key"
                    ));
                }
                if let Some(pem) = p.certificate.as_ref().or(p.key.as_ref()) {
                    rule.insert("publicKey".into(), json!({"certificate": pem}));
                }
            }
            rules.push(Value::Object(rule));
        }
        if self.raw.trusted_root.is_some() {
            notes.push(
                "trustedRoot is not written: it is tender's, for verifying offline; Talos nodes fetch Sigstore's trust root themselves over TUF".into(),
            );
        }
        if self.has_keyless() {
            notes.push(
                "keyless rules need the nodes to reach Sigstore's TUF repository (tuf-repo-cdn.sigstore.dev)".into(),
            );
        }
        (json!({"apiVersion": "v1alpha1", "kind": "ImageVerificationConfig", "rules": rules}), notes)
    }

    fn has_keyless(&self) -> bool {
        self.raw.rules.iter().any(|r| r.keyless.is_some())
    }
}

/// Docker Hub by any of its names is `docker.io`.
fn hub(registry: &str) -> &str {
    if DOCKER_HUB.contains(&registry) {
        "docker.io"
    } else {
        registry
    }
}

/// Whether the glob `pattern` (Talos': only `*` is special, and it crosses `/`) matches some
/// image of `registry` (`<registry>/<repository>`): its text before the first `*` starts with
/// `<registry>/`, or is itself a start of it (`*` fills in the rest). Docker Hub by any name.
fn could_match(pattern: &str, registry: &str) -> bool {
    let names: Vec<&str> = if hub(registry) == "docker.io" { DOCKER_HUB.to_vec() } else { vec![registry] };
    names.iter().any(|name| {
        let want = format!("{name}/");
        match pattern.split_once('*') {
            None => pattern.starts_with(&want),
            Some((head, _)) => head.starts_with(&want) || want.starts_with(head),
        }
    })
}

/// The one registry every image `pattern` matches belongs to, when its text before the first
/// `*` names it (`ghcr.io/org/*`: `ghcr.io`); `None` when a `*` comes before the first `/`.
fn fixed_registry(pattern: &str) -> Option<&str> {
    let head = pattern.split_once('*').map_or(pattern, |(h, _)| h);
    head.split_once('/').map(|(registry, _)| registry)
}

/// Turn the upstream fallback off for every registry of `plan` that a refusing rule covers
/// (`plan.no_fallback`); one note per registry says which rule and why.
pub fn guard(plan: &mut MirrorPlan, policy: &ImageVerification) -> Vec<String> {
    let mut notes = Vec::new();
    for registry in &plan.registries {
        if let Some(why) = policy.fallback_reason(registry, &plan.registries) {
            let upstream = registry.upstream().unwrap_or_else(|| "each registry itself".into());
            notes.push(format!(
                "{registry}: no fallback to {upstream}: {why}, and a node that fell back would pull what tender refuses straight from the registry"
            ));
            plan.no_fallback.insert(registry.clone(), why);
        }
    }
    notes
}

/// `render registries --format talos` with the policy: the registry documents (with
/// `skipFallback` where [`guard`] put it, and the reason as a comment), then the policy as an
/// `ImageVerificationConfig` document for Talos 1.13 and later, unless `node_policy` is off.
pub struct TalosOutput {
    pub text: String,
    /// For standard error: what the output cannot say, and what the nodes need.
    pub notes: Vec<String>,
}

pub fn render_talos(
    plan: &MirrorPlan,
    version: TalosVersion,
    policy: Option<&ImageVerification>,
    node_policy: bool,
) -> Result<TalosOutput, Error> {
    let mut notes = Vec::new();
    let mut docs: Vec<(Vec<String>, Value)> = Vec::new();
    for doc in registry_documents(&plan.routing(), version) {
        let mut comments = Vec::new();
        if version.uses_registry_documents() {
            let name = doc.get("name").and_then(Value::as_str);
            if let Some((_, why)) = plan.no_fallback.iter().find(|(r, _)| Some(r.talos_name().as_str()) == name) {
                comments.push(format!(
                    "skipFallback: {why} (a node that fell back would pull what tender refuses straight from the registry)"
                ));
            }
        } else {
            for (registry, why) in &plan.no_fallback {
                comments.push(format!("skipFallback on {registry}: {why}"));
            }
        }
        docs.push((comments, doc));
    }
    let mut text = String::new();
    if let Some(policy) = policy.filter(|p| !p.is_empty() && node_policy) {
        if (version.major, version.minor) >= (1, 13) {
            let (doc, comments) = policy.talos_document();
            docs.push((comments, doc));
            if policy.has_keyless() {
                notes.push(
                    "keyless rules of the ImageVerificationConfig need the nodes to reach Sigstore's TUF repository (tuf-repo-cdn.sigstore.dev) for its trust root; where they cannot, pass --no-node-policy (tender still verifies, and the fallback stays off)".to_string(),
                );
            }
        } else {
            let note = format!(
                "Talos {version} cannot express the image verification policy (ImageVerificationConfig is Talos 1.13 and later): the nodes do not check signatures themselves; tender does, and the namespaces it refuses images of do not fall back"
            );
            text.push_str(&format!("# {note}\n"));
            notes.push(note);
        }
    }
    for (comments, doc) in &docs {
        text.push_str("---\n");
        for c in comments {
            text.push_str(&format!("# {}\n", printable(c)));
        }
        text.push_str(&crate::hash::yaml_one(doc)?);
    }
    Ok(TalosOutput { text, notes })
}
