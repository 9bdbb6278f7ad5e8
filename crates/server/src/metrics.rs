//! HTTP-side metrics. Names are part of tender's interface (README lists them).

use std::collections::HashMap;
use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tender_fetch::FetchMetrics;

use crate::access_info::AccessInfo;

type Labels = Vec<(String, String)>;
/// `tender_cache_requests`' kind, result and prefetch labels (the upstream is looked up by name).
type CacheKey = (&'static str, &'static str, bool);

/// The `method` label: the methods HTTP defines, anything else `other`. A label value never
/// comes from the request as sent, so no client can grow the label set (issue 16, class 2).
pub(crate) fn method_label(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => "other",
    }
}

#[derive(Debug)]
pub struct ServerMetrics {
    /// Per-repository accounting of worker pulls.
    pub served: crate::served::Served,
    requests: Family<Labels, Counter>,
    bytes_served: Family<Labels, Counter>,
    cache: Family<Labels, Counter>,
    duration: Family<Labels, Histogram>,
    limit_refusals: Family<Labels, Counter>,
    /// Requests refused for wrong credentials.
    pub auth_failures: Counter,
    auth_refusals: Family<Labels, Counter>,
    /// TLS handshakes that failed (no or untrusted client certificate, protocol errors).
    pub tls_handshake_failures: Counter,
    /// Body bytes sent straight from the page cache (`sendfile`, plain HTTP/1 connections).
    pub sendfile_bytes: Counter,
    /// The store and its file system, refreshed when `/metrics` is read.
    pub storage: StorageGauges,
    /// Corrupt objects found by `POST /api/v1/admin/fsck` (repaired or not).
    pub fsck_corrupt: Counter,
    /// The background scrub (`cache.scrubInterval`): objects and bytes re-hashed, objects found
    /// corrupt (quarantined, fetched again on the next request).
    pub scrub_objects: Counter,
    pub scrub_bytes: Counter,
    pub scrub_corrupt: Counter,
    /// The fetch layer's counters (bytes received per upstream, for the savings).
    fetch: FetchMetrics,
    registry: Registry,
    /// The request metrics of each (route, method, status), found once: label sets from
    /// closed sets, so bounded.
    handles: Mutex<HashMap<(&'static str, &'static str, u16), RequestHandles>>,
    /// The cache counters of each (kind, result, prefetch) and upstream (configured names).
    cache_handles: Mutex<HashMap<CacheKey, HashMap<String, Counter>>>,
}

#[derive(Debug, Clone)]
struct RequestHandles {
    requests: Counter,
    bytes: Counter,
    duration: Histogram,
}

/// The size of the store and the room left on its file system.
#[derive(Debug, Clone, Default)]
pub struct StorageGauges {
    pub cache_bytes: Gauge,
    pub cache_objects: Gauge,
    pub memory_bytes: Gauge,
    pub memory_objects: Gauge,
    pub data_free: Gauge,
    pub data_capacity: Gauge,
}

impl StorageGauges {
    fn register(&self, r: &mut Registry) {
        r.register("tender_cache_size_bytes", "Bytes of the stored objects", self.cache_bytes.clone());
        r.register("tender_cache_objects", "Stored objects", self.cache_objects.clone());
        r.register(
            "tender_cache_memory_bytes",
            "Bytes of small objects kept in memory (cache.memory)",
            self.memory_bytes.clone(),
        );
        r.register("tender_cache_memory_objects", "Small objects kept in memory", self.memory_objects.clone());
        r.register(
            "tender_data_free_bytes",
            "Bytes available to tender on the data directory's file system",
            self.data_free.clone(),
        );
        r.register(
            "tender_data_capacity_bytes",
            "Size of the data directory's file system",
            self.data_capacity.clone(),
        );
    }

    /// Read the store size (`bytes`, `objects`), what it keeps in memory and statvfs of its
    /// root into the gauges.
    pub fn update(&self, size: tender_fetch::service::StoreSize, mirror: &tender_fetch::Mirror) {
        let g = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.cache_bytes.set(g(size.bytes));
        self.cache_objects.set(g(size.objects as u64));
        let (in_memory, memory_bytes) = mirror.memory_usage();
        self.memory_objects.set(g(in_memory as u64));
        self.memory_bytes.set(g(memory_bytes));
        if let Some(room) = mirror.room() {
            self.data_free.set(g(room.free));
            self.data_capacity.set(g(room.capacity));
        }
    }
}

impl ServerMetrics {
    pub fn new(fetch: &FetchMetrics) -> ServerMetrics {
        let mut registry = Registry::default();
        let requests = Family::<Labels, Counter>::default();
        let bytes_served = Family::<Labels, Counter>::default();
        let cache = Family::<Labels, Counter>::default();
        let duration =
            Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 4.0, 10)));
        registry.register("tender_http_requests", "HTTP requests by route, method and status", requests.clone());
        registry.register("tender_http_response_bytes", "Body bytes sent to clients by route", bytes_served.clone());
        registry.register("tender_cache_requests", "Manifest and blob requests by cache result", cache.clone());
        registry.register(
            "tender_http_request_duration_seconds",
            "Time to serve a request, body included",
            duration.clone(),
        );
        let limit_refusals = Family::<Labels, Counter>::default();
        registry.register(
            "tender_limit_refusals",
            "Requests or connections refused by a limit (url, client_requests, connections, connections_per_address, evicted, first_byte_timeout, handshake_timeout, headers, header_timeout, idle_timeout, send_stall, accept)",
            limit_refusals.clone(),
        );
        let auth_failures = Counter::default();
        registry.register("tender_auth_failures", "Requests refused for wrong credentials", auth_failures.clone());
        let auth_refusals = Family::<Labels, Counter>::default();
        registry.register(
            "tender_auth_refusals",
            "Requests refused by client authentication, by reason (no_credentials, bad_credentials, malformed, rate_limited, busy)",
            auth_refusals.clone(),
        );
        let tls_handshake_failures = Counter::default();
        registry.register(
            "tender_tls_handshake_failures",
            "TLS handshakes that failed",
            tls_handshake_failures.clone(),
        );
        let sendfile_bytes = Counter::default();
        registry.register(
            "tender_http_sendfile_bytes",
            "Body bytes sent straight from the page cache with sendfile (plain HTTP/1 connections)",
            sendfile_bytes.clone(),
        );
        let storage = StorageGauges::default();
        storage.register(&mut registry);
        let fsck_corrupt = Counter::default();
        registry.register(
            "tender_fsck_corrupt_objects",
            "Corrupt objects found by fsck through the server (POST /api/v1/admin/fsck)",
            fsck_corrupt.clone(),
        );
        let (scrub_objects, scrub_bytes, scrub_corrupt) = (Counter::default(), Counter::default(), Counter::default());
        registry.register(
            "tender_scrub_objects",
            "Stored objects re-hashed by the background scrub",
            scrub_objects.clone(),
        );
        registry.register("tender_scrub_bytes", "Bytes re-hashed by the background scrub", scrub_bytes.clone());
        registry.register(
            "tender_scrub_corrupt_objects",
            "Stored objects the background scrub found corrupt (quarantined, fetched again on the next request)",
            scrub_corrupt.clone(),
        );
        fetch.register(&mut registry);
        ServerMetrics {
            storage,
            fsck_corrupt,
            scrub_objects,
            scrub_bytes,
            scrub_corrupt,
            served: crate::served::Served::default(),
            requests,
            bytes_served,
            cache,
            duration,
            limit_refusals,
            auth_failures,
            auth_refusals,
            tls_handshake_failures,
            sendfile_bytes,
            fetch: fetch.clone(),
            registry,
            handles: Mutex::default(),
            cache_handles: Mutex::default(),
        }
    }

    pub fn fetch(&self) -> &FetchMetrics {
        &self.fetch
    }

    /// Like [`ServerMetrics::new`], and `hook` registers more (the catalog's metrics).
    pub fn with_hook(fetch: &FetchMetrics, hook: impl FnOnce(&mut Registry)) -> ServerMetrics {
        let mut m = ServerMetrics::new(fetch);
        hook(&mut m.registry);
        m
    }

    pub(crate) fn observe(&self, info: &AccessInfo, method: &str, status: u16, bytes: u64, secs: f64, prefetch: bool) {
        let route = if info.route.is_empty() { "other" } else { info.route };
        let method = method_label(method);
        let handles = {
            let mut h = self.handles.lock().unwrap_or_else(|p| p.into_inner());
            h.entry((route, method, status))
                .or_insert_with(|| RequestHandles {
                    requests: self
                        .requests
                        .get_or_create(&vec![
                            ("route".to_string(), route.to_string()),
                            ("method".to_string(), method.to_string()),
                            ("status".to_string(), status.to_string()),
                        ])
                        .clone(),
                    bytes: self.bytes_served.get_or_create(&vec![("route".to_string(), route.to_string())]).clone(),
                    duration: self.duration.get_or_create(&vec![("route".to_string(), route.to_string())]).clone(),
                })
                .clone()
        };
        handles.requests.inc();
        handles.bytes.inc_by(bytes);
        handles.duration.observe(secs);
        // Only answers that served something: a 304 or an error says nothing about demand.
        if !prefetch && (200..300).contains(&status) {
            if let Some(repo) = &info.repository {
                // A name from a request enters the statistics only once its upstream (or an
                // import's tag) confirmed the repository: an answer that asked the upstream, one
                // by tag, an OS image (its path is the object's). A hit of a blob or a manifest
                // by digest under a made-up name confirms nothing.
                let confirmed = info.confirmed
                    || route == "image"
                    || matches!(info.cache, Some("miss" | "revalidated" | "pass" | "shared"));
                self.served.record(repo, route, bytes, info.cache, tender_fetch::service::now_secs(), confirmed);
            }
        }
        if let Some(result) = info.cache {
            let upstream = info.upstream.as_deref().unwrap_or_default();
            let mut h = self.cache_handles.lock().unwrap_or_else(|p| p.into_inner());
            let by_upstream = h.entry((route, result, prefetch)).or_default();
            match by_upstream.get(upstream) {
                Some(c) => {
                    c.inc();
                }
                None => {
                    let c = self
                        .cache
                        .get_or_create(&vec![
                            ("kind".to_string(), route.to_string()),
                            ("result".to_string(), result.to_string()),
                            ("upstream".to_string(), upstream.to_string()),
                            ("prefetch".to_string(), prefetch.to_string()),
                        ])
                        .clone();
                    c.inc();
                    by_upstream.insert(upstream.to_string(), c);
                }
            }
        }
    }

    /// Count a request refused by client authentication (a reason from a closed set).
    pub fn auth_refusal(&self, reason: &'static str) {
        self.auth_refusals.get_or_create(&vec![("reason".to_string(), reason.to_string())]).inc();
    }

    /// Count a refusal by the named limit (a name from a closed set, never from a request).
    pub fn limit_refusal(&self, limit: &str) {
        self.limit_refusals.get_or_create(&vec![("limit".to_string(), limit.to_string())]).inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
