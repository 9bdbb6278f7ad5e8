//! The builtin path: a pool whose worker disks CSI-clone the golden
//! `cozy-public/talos-worker-<schematic>-<version>`. Checked against the cluster state so a clone
//! that would fail, or silently degrade into a host-assisted copy, is refused at render time.
//!
//! - a pool has *already cloned* when a DataVolume in its namespace carries the pool
//!   annotation exactly `<cluster>/<pool>` (never a name prefix: `md0-gpu` disks start with
//!   `md0`), the golden annotation naming this golden, and phase `Succeeded`.
//! - R-1 / R-2 (absent / `Failed` golden) apply only to a pool that has not cloned (N-2); a
//!   golden mid-import passes (N-1).
//! - the effective classes must match. An empty class resolves to the cluster default (D-1;
//!   newest default wins, D-2); a golden with no declared class reads its PVC's class (D-3); a
//!   pool that already cloned reads its own PVCs' class (D-4), so moving the cluster default
//!   later does not fail it (N-4).
//! - the worker disk may not be smaller than the golden.
//! - D-5: the class the check used is the class written onto the worker disk.

use std::collections::BTreeSet;

use crate::pool::Pool;
use crate::quantity::Quantity;
use crate::rules::{Refusal, Rule};
use crate::state::ClusterState;
use crate::Error;

pub const CATALOG_NAMESPACE: &str = "cozy-public";
pub const GOLDEN_ANNOTATION: &str = "kubernetes-worker-image.cozystack.io/golden";
pub const POOL_ANNOTATION: &str = "kubernetes-worker-image.cozystack.io/pool";

/// What the checks found: the class to write onto the worker disk (D-5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneCheck {
    pub storage_class: String,
    pub already_cloned: bool,
}

/// Run R-1..R-4 for `pool` cloning `golden`, and resolve the worker disk's class. A state
/// that lacks what a rule needs (no StorageClass at all, a Succeeded golden or a cloned disk
/// without its PVC) is [`Error::IncompleteState`]: said, never guessed.
pub fn check(pool: &Pool, golden: &str, state: &ClusterState) -> Result<CloneCheck, Error> {
    if state.storage_classes.is_empty() {
        return Err(Error::IncompleteState {
            kind: "StorageClass".into(),
            what: "at all".into(),
            why: "D-1 and R-3 need to resolve empty classes to the cluster default".into(),
            command: "kubectl get storageclasses -o yaml".into(),
        });
    }
    let annotation = pool.annotation();
    let cloned: Vec<&str> = state
        .data_volumes
        .iter()
        .filter(|d| {
            d.namespace == pool.namespace
                && d.annotations.get(POOL_ANNOTATION).is_some_and(|v| *v == annotation)
                && d.annotations.get(GOLDEN_ANNOTATION).is_some_and(|v| v == golden)
                && d.phase == "Succeeded"
        })
        .map(|d| d.name.as_str())
        .collect();
    if let Some(name) = cloned.iter().find(|name| state.pvc(&pool.namespace, name).is_none()) {
        return Err(Error::IncompleteState {
            kind: "PersistentVolumeClaim".into(),
            what: format!("{}/{name}", pool.namespace),
            why: "this pool's cloned disks are read for their bound class (D-4, N-4)".into(),
            command: format!("kubectl get persistentvolumeclaims -n {} -o yaml", pool.namespace),
        });
    }
    let already_cloned = !cloned.is_empty();
    let default_class = state.default_storage_class();

    let golden_dv = state.data_volume(CATALOG_NAMESPACE, golden);
    match golden_dv {
        None if !already_cloned => {
            return Err(Error::from(Refusal::new(
                Some(Rule::R1),
                "osImage.builtin",
                golden,
                format!("names a golden DataVolume that does not exist in {CATALOG_NAMESPACE}"),
                "add the (schematic, version) to the catalog and apply `tender render catalog`, or use osImage.factory",
            )))
        }
        Some(dv) if dv.phase == "Failed" && !already_cloned => {
            return Err(Error::from(Refusal::new(
                Some(Rule::R2),
                "osImage.builtin",
                golden,
                format!("names a golden whose import failed (phase Failed) in {CATALOG_NAMESPACE}; cloning it would block the workers forever"),
                format!("check the importer in {CATALOG_NAMESPACE}, then delete the DataVolume so the catalog re-imports it"),
            )))
        }
        _ => {}
    }

    // The pool's effective class: the configured class; if that is empty, its own disks' class
    // once it has cloned (D-4, N-4), else the cluster default (D-1).
    let own: BTreeSet<&str> = cloned
        .iter()
        .filter_map(|name| state.pvc(&pool.namespace, name))
        .filter_map(|p| p.storage_class.as_deref())
        .filter(|c| !c.is_empty())
        .collect();
    let (pool_class, pool_origin) = if !pool.storage_class.is_empty() {
        (pool.storage_class.clone(), "storageClass")
    } else if own.len() > 1 {
        return Err(Error::from(Refusal::new(
            Some(Rule::R3),
            "storageClass",
            own.iter().copied().collect::<Vec<_>>().join(", "),
            "is empty, and this pool's cloned disks are bound on different StorageClasses",
            "set storageClass explicitly to the golden's class",
        )));
    } else if let Some(c) = own.first() {
        (c.to_string(), "resolved from the class of this pool's own bound disks (D-4)")
    } else if let Some(d) = default_class {
        (d.to_string(), "resolved from the cluster default StorageClass (D-1)")
    } else {
        return Err(Error::from(Refusal::new(
            Some(Rule::D1),
            "storageClass",
            "",
            "is empty and the cluster has no default StorageClass, so the clone's class cannot be known",
            "set storageClass to the golden's class",
        )));
    };

    if let Some(dv) = golden_dv.filter(|d| d.phase != "Failed") {
        // The golden's class: declared, else its PVC's (D-3), else the cluster default (D-1).
        let declared = dv.storage_class.clone().filter(|c| !c.is_empty());
        if declared.is_none() && dv.phase == "Succeeded" && state.pvc(CATALOG_NAMESPACE, golden).is_none() {
            return Err(Error::IncompleteState {
                kind: "PersistentVolumeClaim".into(),
                what: format!("{CATALOG_NAMESPACE}/{golden}"),
                why: "a Succeeded golden that declares no class is read for its PVC's bound class (D-3)".into(),
                command: format!("kubectl get persistentvolumeclaims -n {CATALOG_NAMESPACE} -o yaml"),
            });
        }
        let from_pvc =
            state.pvc(CATALOG_NAMESPACE, golden).and_then(|p| p.storage_class.clone()).filter(|c| !c.is_empty());
        let golden_class = declared.or(from_pvc).or_else(|| default_class.map(str::to_string));
        if let Some(gc) = golden_class {
            if gc != pool_class {
                return Err(Error::from(Refusal::new(
                    Some(Rule::R3),
                    "storageClass",
                    &pool_class,
                    format!(
                        "({pool_origin}) differs from the class {gc:?} of golden {golden}; CDI cannot CSI-clone across StorageClasses and would fall back to a host-assisted copy over the pod network"
                    ),
                    format!("set the catalog entry's storageClass to {pool_class:?}, or this pool's storageClass to {gc:?}, or use osImage.factory"),
                )));
            }
        }
        if let Some(storage) = &dv.storage {
            let golden_size = Quantity::parse(storage).map_err(|problem| {
                Refusal::new(
                    Some(Rule::R4),
                    format!("{CATALOG_NAMESPACE}/{golden} spec.storage"),
                    storage,
                    format!("is not a quantity: it {problem}"),
                    "fix the golden DataVolume",
                )
            })?;
            if pool.disk_size.compare(&golden_size) == Some(std::cmp::Ordering::Less) {
                return Err(Error::from(Refusal::new(
                    Some(Rule::R4),
                    "diskSize",
                    pool.disk_size.as_str(),
                    format!(
                        "is smaller than golden {golden} ({storage}); a clone target cannot be smaller than its source"
                    ),
                    format!("raise diskSize to at least {storage}"),
                )));
            }
        }
    }
    Ok(CloneCheck { storage_class: pool_class, already_cloned })
}
