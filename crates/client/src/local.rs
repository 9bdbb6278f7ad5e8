//! A tender's configuration and data directory, worked on in-process: where a command finds them
//! (`--config`, `--data`), and the mirror over a store, built exactly as `tender serve` builds
//! its own (the fetch layer, every configured upstream and the Image Factory).

use std::path::PathBuf;
use std::sync::Arc;

use tender_config::Settings;
use tender_fetch::{FetchMetrics, FetchSettings, Flights, Mirror, Upstream, UpstreamSettings};
use tender_store::Store;

use crate::exit::{Failure, Result};

/// The upstream name of the Image Factory in logs and metrics.
pub const IMAGE_FACTORY: &str = "image-factory";

/// Where the config and the data directory are.
#[derive(Debug, Clone, clap::Args)]
pub struct Location {
    /// Config file with the catalog section (default: the embedded default config)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory [default: from --config, else ./tender-data]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
}

impl Location {
    /// Read and validate the config (a bad catalog entry is a config error naming its key).
    pub fn settings(&self) -> Result<Settings> {
        settings(self.config.as_deref(), self.data.clone())
    }
}

/// The settings of a command that works on a data directory (only `--data` applied); a bad
/// config is a usage error.
pub fn settings(config: Option<&std::path::Path>, data: Option<PathBuf>) -> Result<Settings> {
    tender_config::load(config, data).map_err(|e| Failure::usage(e.to_string()))
}

/// The mirror over `store`, as `tender serve` builds it.
pub fn mirror(settings: &Settings, store: Arc<Store>) -> Result<Arc<Mirror>> {
    let metrics = FetchMetrics::default();
    let flights = Flights::new(store, settings.fetch.clone(), metrics.clone());
    build_mirror(settings, flights, &metrics)
}

/// Every configured upstream and the Image Factory (or the parents, with `--parent`) over
/// `flights`. An upstream that cannot be built is a usage error naming it.
pub fn build_mirror(settings: &Settings, flights: Arc<Flights>, metrics: &FetchMetrics) -> Result<Arc<Mirror>> {
    let mut upstreams = Vec::new();
    for u in &settings.upstreams {
        let up = Upstream::new(u.clone(), settings.fetch.clone(), metrics.clone())
            .map_err(|e| Failure::usage(format!("upstream {}: {}", u.name, e.message)))?;
        upstreams.push(Arc::new(up));
    }
    let factory_fetch = FetchSettings {
        first_byte_timeout: settings.factory_first_byte_timeout.max(settings.fetch.first_byte_timeout),
        ..settings.fetch.clone()
    };
    let parent = settings.parent.as_ref();
    let factory = UpstreamSettings {
        name: IMAGE_FACTORY.to_string(),
        endpoints: parent.map_or_else(|| vec![settings.image_factory.clone()], |p| p.urls.clone()),
        ca_file: parent.and_then(|p| p.ca_file.clone()),
        insecure_skip_verify: false,
        proxy: None,
        credentials: parent.and_then(|p| p.credentials.clone()),
        public: true,
        private: false,
        range_before_verify: settings.factory_range_before_verify,
        redirect_hosts: None,
        token_realm_hosts: Vec::new(),
        library_prefix: false,
        max_object_size: None,
        stale_max_age: None,
        ns_param: None,
        client_identity: parent.and_then(|p| p.client_identity.clone()),
        offline: settings.offline,
        fallback: None,
    };
    let factory = match parent {
        // parent.fallbackToUpstream: the Image Factory itself when no parent answers.
        Some(p) if p.fallback_to_upstream && !settings.offline => UpstreamSettings {
            fallback: Some(Box::new(UpstreamSettings {
                endpoints: vec![settings.image_factory.clone()],
                ca_file: None,
                credentials: None,
                client_identity: None,
                ..factory.clone()
            })),
            ..factory
        },
        _ => factory,
    };
    let factory = Upstream::new(factory, factory_fetch, metrics.clone())
        .map_err(|e| Failure::usage(format!("imageFactory: {}", e.message)))?;
    let mirror = Mirror::with_image_factory(
        upstreams,
        settings.default_upstream.clone(),
        Arc::new(factory),
        flights,
        settings.fetch.clone(),
    );
    mirror.set_policy(settings.policy.clone());
    Ok(mirror)
}
