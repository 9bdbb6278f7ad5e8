//! tender-render: Talos, containerd and Kubernetes output for tender.
//!
//! Pure functions from typed input to bytes: no IO, no clock, no environment. The same input
//! renders the same bytes. Every object is built as data and serialised (YAML, TOML); nothing
//! is a text template, so a hostile value comes out as a literal string or is refused.
//!
//! - [`registries`]: typed registry routing (hosts, mirror URLs, TLS, auth), shared by
//! - [`talos`]: `RegistryMirrorConfig` / `RegistryAuthConfig` / `RegistryTLSConfig` documents
//!   (Talos 1.12 and later) or a v1alpha1 `machine.registries` patch (1.11 and older), and
//! - [`containerd`]: `hosts.toml` files;
//! - [`pool`]: a Cozystack `KubernetesNodes`-shaped pool file, validated against the rules;
//! - [`k8s`]: the KubevirtMachineTemplate, MachineDeployment, MachineHealthCheck and
//!   TalosConfigTemplate of a pool;
//! - [`clone`]: the builtin (golden clone) rules R-1..R-4, N-1..N-4, D-1..D-5, A-1;
//! - [`catalog`]: the golden catalog config and its rules G-7, G-8 (shared with the server);
//! - [`chart_fails`]: the `fail` checks of Cozystack's charts, for `check cozystack`;
//! - [`golden`]: the golden DataVolumes of the catalog, and G-9;
//! - [`state`]: the cluster state as kubectl prints it;
//! - [`cozystack`]: patches and values in Cozystack's own keys, and the rules checked on them;
//! - [`target`]: which Cozystack: the values schemas tender carries (or one from a file), and
//!   which keys each can take;
//! - [`verification`]: tender's signature policy in the output: no upstream fallback for the
//!   registries a refusing rule covers, and the rules as Talos' `ImageVerificationConfig`;
//! - [`rules`], [`quantity`], [`hash`]: rule ids and shape checks, quantities, canonical data;
//! - `url`: the http(s) URL and `host[:port]` grammar (its items are re-exported by [`registries`]);
//! - [`yaml`]: YAML output that YAML 1.1 and 1.2 readers parse the same, and the 1.1 resolver;
//! - [`kubectl_yaml`]: YAML read as kubectl and Helm read it (go-yaml v2), for `check cozystack`;
//! - [`nesting`]: how deeply a YAML text nests, found in one linear pass before it is parsed.

pub mod catalog;
pub mod chart_fails;
pub mod clone;
pub mod containerd;
pub mod cozystack;
pub mod golden;
pub mod hash;
pub mod k8s;
pub mod kubectl_yaml;
pub mod nesting;
pub mod pool;
pub mod quantity;
pub mod registries;
pub mod rules;
pub mod state;
pub mod talos;
pub mod target;
mod url;
pub mod verification;
pub mod yaml;

pub use rules::{Refusal, Rule};

/// Why rendering did not produce output.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The input is not the expected shape: not YAML, an unknown key, a wrong type.
    #[error("{what}: {message}")]
    Malformed { what: String, message: String },
    /// The input is well-formed, and a rule refuses it.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// `osImage.builtin` is checked against the cluster state, and none was given.
    #[error("osImage.builtin is checked against the cluster state (rules R-1 to R-4, D-1 to D-5), and none was given")]
    MissingClusterState,
    /// The cluster state lacks what a rule needs: the kind that is missing and the `kubectl get`
    /// that provides it. Said, never guessed.
    #[error("the cluster state has no {kind} {what}, which {why}; add the output of `{command}` to --cluster-state")]
    IncompleteState { kind: String, what: String, why: String, command: String },
    /// Serialising the output failed (a bug: the output is built from valid data).
    #[error("could not serialise {what}: {message}")]
    Serialise { what: String, message: String },
}
