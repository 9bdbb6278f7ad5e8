//! What a handler says about its response for the access log and the HTTP metrics
//! ([`AccessInfo`], set on the response), below both: the access log (`access`) reads it when
//! the body ends and hands it to the metrics.

/// Set by handlers on their response: what the access log and metrics should say.
#[derive(Debug, Clone, Default)]
pub struct AccessInfo {
    pub route: &'static str,
    pub upstream: Option<String>,
    pub cache: Option<&'static str>,
    pub digest: Option<tender_oci::Digest>,
    /// `<upstream>/<repository>` for registry requests (`image-factory/<schematic>/<version>/<asset>`
    /// for OS images), for the served statistics.
    pub repository: Option<String>,
    /// Keep what this request fetched out of eviction (a prefetch with `X-Tender-Pin: 1`).
    pub pin: bool,
    /// The repository was vouched for on this request: a tag of it answered (a tag record, its
    /// upstream's or an import's), or its upstream confirmed the object in it. For the served
    /// statistics, which take new names only when confirmed.
    pub confirmed: bool,
}
