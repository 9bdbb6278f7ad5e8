//! The cluster state the builtin rules read: what
//! `kubectl get storageclasses,datavolumes,persistentvolumeclaims -A -o yaml` prints.
//!
//! The input is a `List` (or several YAML documents, each a `List` or a single object); kinds
//! other than StorageClass, DataVolume and PersistentVolumeClaim are ignored, and so are fields
//! tender does not read.

use serde::Deserialize;
use serde_json::Value;

use crate::Error;

/// The objects tender reads from a cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    pub storage_classes: Vec<StorageClass>,
    pub data_volumes: Vec<DataVolume>,
    pub pvcs: Vec<Pvc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageClass {
    pub name: String,
    pub is_default: bool,
    pub created: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataVolume {
    pub namespace: String,
    pub name: String,
    pub annotations: std::collections::BTreeMap<String, String>,
    pub phase: String,
    /// `spec.source.http.url`, if the DataVolume imports over HTTP.
    pub http_url: Option<String>,
    /// `spec.storage.storageClassName` (or `spec.pvc.storageClassName`).
    pub storage_class: Option<String>,
    /// `spec.storage.resources.requests.storage` (or the `spec.pvc` one).
    pub storage: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pvc {
    pub namespace: String,
    pub name: String,
    pub storage_class: Option<String>,
    pub phase: String,
}

/// A `creationTimestamp` (`2024-05-01T10:00:00Z`), ordered by time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    /// (year, month, day, hour, minute, second, nanoseconds)
    parts: (u32, u32, u32, u32, u32, u32, u32),
}

impl Timestamp {
    /// Parse RFC 3339 in UTC, as the API server prints it: `YYYY-MM-DDTHH:MM:SS[.frac]Z`.
    pub fn parse(s: &str) -> Result<Timestamp, String> {
        let bad = || format!("creationTimestamp {s:?} is not YYYY-MM-DDTHH:MM:SSZ");
        let body = s.strip_suffix('Z').ok_or_else(bad)?;
        let (date, time) = body.split_once('T').ok_or_else(bad)?;
        let (time, frac) = match time.split_once('.') {
            Some((t, f)) => (t, f),
            None => (time, ""),
        };
        let nums = |text: &str, sep: char, lens: &[usize]| -> Result<Vec<u32>, String> {
            let parts: Vec<&str> = text.split(sep).collect();
            if parts.len() != lens.len()
                || parts.iter().zip(lens).any(|(p, l)| p.len() != *l || !p.bytes().all(|b| b.is_ascii_digit()))
            {
                return Err(bad());
            }
            parts.iter().map(|p| p.parse::<u32>().map_err(|_| bad())).collect()
        };
        let d = nums(date, '-', &[4, 2, 2])?;
        let t = nums(time, ':', &[2, 2, 2])?;
        if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let nanos = if frac.is_empty() { 0 } else { format!("{frac:0<9}").parse::<u32>().map_err(|_| bad())? };
        Ok(Timestamp { parts: (d[0], d[1], d[2], t[0], t[1], t[2], nanos) })
    }
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawMeta {
    name: String,
    namespace: String,
    annotations: std::collections::BTreeMap<String, String>,
    creation_timestamp: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawObject {
    kind: String,
    metadata: RawMeta,
    spec: Value,
    status: Value,
    items: Option<Vec<Value>>,
}

fn str_at(v: &Value, path: &[&str]) -> Option<String> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str().map(str::to_string)
}

impl ClusterState {
    /// Parse kubectl's YAML output.
    pub fn from_yaml(text: &str) -> Result<ClusterState, Error> {
        let mut state = ClusterState::default();
        for doc in serde_norway::Deserializer::from_str(text) {
            let value = Value::deserialize(doc).map_err(|e| Error::Malformed {
                what: "cluster state".into(),
                message: format!("not YAML kubectl could have printed: {e}"),
            })?;
            if value.is_null() {
                continue;
            }
            state.add(value)?;
        }
        Ok(state)
    }

    fn add(&mut self, value: Value) -> Result<(), Error> {
        let obj: RawObject = serde_json::from_value(value).map_err(|e| Error::Malformed {
            what: "cluster state".into(),
            message: format!("an item is not a Kubernetes object: {e}"),
        })?;
        if let Some(items) = obj.items {
            for item in items {
                self.add(item)?;
            }
            return Ok(());
        }
        let m = obj.metadata;
        match obj.kind.as_str() {
            "StorageClass" => {
                let is_default =
                    ["storageclass.kubernetes.io/is-default-class", "storageclass.beta.kubernetes.io/is-default-class"]
                        .iter()
                        .any(|k| m.annotations.get(*k).is_some_and(|v| v == "true"));
                let created = m
                    .creation_timestamp
                    .as_deref()
                    .map(Timestamp::parse)
                    .transpose()
                    .map_err(|message| Error::Malformed { what: format!("StorageClass {}", m.name), message })?;
                self.storage_classes.push(StorageClass { name: m.name, is_default, created });
            }
            "DataVolume" => {
                let spec = &obj.spec;
                let storage_class = str_at(spec, &["storage", "storageClassName"])
                    .or_else(|| str_at(spec, &["pvc", "storageClassName"]));
                let storage = quantity_at(spec, &["storage", "resources", "requests", "storage"])
                    .or_else(|| quantity_at(spec, &["pvc", "resources", "requests", "storage"]));
                self.data_volumes.push(DataVolume {
                    namespace: m.namespace,
                    name: m.name,
                    annotations: m.annotations,
                    phase: str_at(&obj.status, &["phase"]).unwrap_or_default(),
                    http_url: str_at(spec, &["source", "http", "url"]),
                    storage_class,
                    storage,
                });
            }
            "PersistentVolumeClaim" => self.pvcs.push(Pvc {
                namespace: m.namespace,
                name: m.name,
                storage_class: str_at(&obj.spec, &["storageClassName"]),
                phase: str_at(&obj.status, &["phase"]).unwrap_or_default(),
            }),
            _ => {}
        }
        Ok(())
    }

    /// The cluster default StorageClass as Kubernetes picks it: among classes annotated default
    /// (GA or beta annotation), the newest by `creationTimestamp`, ties broken by name (D-2).
    pub fn default_storage_class(&self) -> Option<&str> {
        self.storage_classes
            .iter()
            .filter(|c| c.is_default)
            .max_by(|a, b| a.created.cmp(&b.created).then_with(|| b.name.cmp(&a.name)))
            .map(|c| c.name.as_str())
    }

    pub fn data_volume(&self, namespace: &str, name: &str) -> Option<&DataVolume> {
        self.data_volumes.iter().find(|d| d.namespace == namespace && d.name == name)
    }

    pub fn pvc(&self, namespace: &str, name: &str) -> Option<&Pvc> {
        self.pvcs.iter().find(|p| p.namespace == namespace && p.name == name)
    }
}

fn quantity_at(v: &Value, path: &[&str]) -> Option<String> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    match cur {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn should_order_timestamps_like_their_fields(
            a in (2000u32..2100, 1u32..13, 1u32..29, 0u32..24, 0u32..60, 0u32..60),
            b in (2000u32..2100, 1u32..13, 1u32..29, 0u32..24, 0u32..60, 0u32..60),
        ) {
            let text = |t: (u32, u32, u32, u32, u32, u32)| format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", t.0, t.1, t.2, t.3, t.4, t.5);
            let (ta, tb) = (Timestamp::parse(&text(a)).unwrap(), Timestamp::parse(&text(b)).unwrap());
            prop_assert_eq!(ta.cmp(&tb), a.cmp(&b));
        }
    }

    #[test]
    fn should_order_timestamps_by_time() {
        let a = Timestamp::parse("2024-01-01T00:00:00Z").unwrap();
        let b = Timestamp::parse("2024-01-01T00:00:00.5Z").unwrap();
        let c = Timestamp::parse("2025-01-01T00:00:00Z").unwrap();
        assert!(a < b && b < c);
        for bad in ["2024-01-01", "2024-01-01T00:00:00+01:00", "2024-1-01T00:00:00Z", ""] {
            assert!(Timestamp::parse(bad).is_err(), "{bad}");
        }
    }
}
