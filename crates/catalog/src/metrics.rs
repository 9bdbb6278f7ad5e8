//! Catalog metrics. Names are part of tender's interface (README lists them).

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::record::Phase;

type Labels = Vec<(String, String)>;

/// `tender_catalog_goldens{phase}`: goldens by phase (every phase always present).
#[derive(Debug, Clone, Default)]
pub struct CatalogMetrics {
    goldens: Family<Labels, Gauge>,
}

impl CatalogMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register("tender_catalog_goldens", "Goldens in the catalog by phase", self.goldens.clone());
        self.set(&[]);
    }

    /// Publish the phase of every golden.
    pub fn set(&self, phases: &[Phase]) {
        for p in Phase::ALL {
            let n = phases.iter().filter(|x| **x == p).count() as i64;
            self.goldens.get_or_create(&vec![("phase".to_string(), p.as_str().to_string())]).set(n);
        }
    }
}
