//! The status page at `/`: plain HTML that works without JavaScript — upstreams and their
//! health, catalog goldens, cache size and hit rate, the most-served repositories.

use std::fmt::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use tender_fetch::service::{now_secs, BucketStatus, BucketView, StoreSize};

use crate::AppState;

/// Escape text for HTML element content and attribute values.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// The status page reloads itself this often (no JavaScript).
const REFRESH_SECS: u64 = 10;

/// `at` (Unix seconds) as an age: `42 s ago`, `5 min ago`, `3 h ago`, `2 d ago`.
fn ago(now: u64, at: u64) -> String {
    let s = now.saturating_sub(at);
    match s {
        0..120 => format!("{s} s ago"),
        120..7200 => format!("{} min ago", s / 60),
        7200..172_800 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// Store size, recomputed at most every 30 s (it walks the object tree).
#[derive(Debug, Default)]
pub struct SizeCache {
    last: std::sync::Mutex<Option<(Instant, StoreSize)>>,
}

impl SizeCache {
    pub fn get(&self, mirror: &tender_fetch::Mirror) -> StoreSize {
        if let Ok(mut last) = self.last.lock() {
            if let Some((at, size)) = *last {
                if at.elapsed() < Duration::from_secs(30) {
                    return size;
                }
            }
            let size = mirror.store_size();
            *last = Some((Instant::now(), size));
            return size;
        }
        StoreSize::default()
    }
}

pub async fn page(
    State(app): State<Arc<AppState>>,
    identity: Option<axum::Extension<crate::auth::Identity>>,
) -> impl IntoResponse {
    let viewer = crate::Viewer::of(&app, identity.as_deref());
    let mirror = app.mirror();
    let (bytes, objects, catalog, imports) = {
        let app = app.clone();
        tokio::task::spawn_blocking(move || {
            let size = app.sizes.get(&app.mirror());
            (size.bytes, size.objects, app.catalog_html(), crate::inventory::imports_of(&app, viewer))
        })
        .await
        .unwrap_or((0, 0, None, Vec::new()))
    };
    app.tick_savings();
    let served = &app.metrics().served;
    let mut all = served.snapshot();
    all.retain(|repo, _| viewer.sees_repository(&mirror, repo));
    let (hits, misses) = all.values().fold((0u64, 0u64), |(h, m), r| (h + r.hits, m + r.misses));
    let rate = if hits + misses == 0 {
        "—".to_string()
    } else {
        format!("{:.1}%", 100.0 * hits as f64 / (hits + misses) as f64)
    };

    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>tender</title>\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <style>body{{font-family:system-ui,sans-serif;margin:2rem;max-width:70rem;color:#1b1b1b}}\
         table{{border-collapse:collapse;margin:0 0 2rem}}th,td{{padding:.3rem .8rem;border-bottom:1px solid #ddd;text-align:left}}\
         .up{{color:#17692b;font-weight:600}}.cause{{color:#b3261e}}.down{{color:#b3261e;font-weight:600}}.unknown{{color:#666}}\
         .num{{text-align:right;font-variant-numeric:tabular-nums}}</style></head><body>\
         <h1>tender {}</h1><p>Every artifact crosses the network once; this node serves the fleet.</p>",
        env!("CARGO_PKG_VERSION")
    );
    let health = crate::health_of(&app, viewer);
    let data = mirror.data_directory();
    let data_state = match (data["state"].as_str(), data["freeBytes"].as_u64(), data["sizeBytes"].as_u64()) {
        (Some(state), Some(free), Some(size)) => format!("{state}: {} free of {}", human(free), human(size)),
        (state, _, _) => state.unwrap_or("unknown").to_string(),
    };
    let data_class = match data["state"].as_str() {
        Some("ok") => "up",
        Some("low" | "full") => "down",
        _ => "unknown",
    };
    let stale: u64 = health.iter().map(|u| u.stale_served).sum();
    let _ = write!(
        h,
        "<h2>Cache</h2><table id=\"cache\"><tr><th>objects</th><td class=\"num\">{objects}</td></tr>\
         <tr><th>size</th><td class=\"num\">{}</td></tr><tr><th>hit rate (workers)</th><td class=\"num\" id=\"hit-rate\">{rate}</td></tr>\
         <tr><th>fills in progress</th><td class=\"num\">{}</td></tr>\
         <tr><th>stale answers (upstream unreachable)</th><td class=\"num\" id=\"stale-served\">{stale}</td></tr>\
         <tr><th>data directory</th><td id=\"data-directory\" class=\"{data_class}\">{data_state}</td></tr></table>",
        human(bytes),
        mirror.fills_in_progress()
    );
    h.push_str(&savings_section(&served.savings(), &all, viewer, &mirror, now_secs()));
    h.push_str(
        "<h2>Upstreams</h2><table id=\"upstreams\"><tr><th>name</th><th>endpoints</th><th>health</th>\
         <th>last success</th><th>last error</th></tr>",
    );
    let now = now_secs();
    for u in health {
        let class = u.state.as_str();
        let word = match u.state {
            tender_fetch::health::State::Unknown => "not asked yet",
            s => s.as_str(),
        };
        let endpoints: Vec<String> = match (viewer, mirror.upstream(&u.name).or(mirror.image_factory())) {
            (crate::Viewer::All, Some(up)) => up.settings().endpoints.iter().map(|e| esc(e.as_str())).collect(),
            (crate::Viewer::All, None) => Vec::new(),
            (crate::Viewer::Anonymous, _) => vec!["(shown to authenticated clients)".to_string()],
        };
        let success = u.last_success.map_or_else(|| "never".to_string(), |t| ago(now, t));
        let error = match &u.last_error {
            Some(e) => {
                let status = e.status.map(|s| format!(" {s}")).unwrap_or_default();
                format!("<span class=\"cause\">{}{status}</span> {}: {}", e.cause, ago(now, e.at), esc(&e.message))
            }
            None => "—".to_string(),
        };
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td class=\"{class}\">{word}</td><td>{success}</td><td>{error}</td></tr>",
            esc(&u.name),
            endpoints.join("<br>")
        );
    }
    h.push_str("</table>");
    if let Some(b) = mirror.bucket() {
        h.push_str(&bucket_section(&b, viewer));
    }
    let fills = crate::fills_of(&app, viewer);
    h.push_str(&fills_section(&fills, now));
    h.push_str(&verifications_section(&fills, now));
    h.push_str(&imports_section(&imports, now));
    if let Some(c) = catalog {
        h.push_str(&c);
    }
    h.push_str(
        "<h2>Most-served repositories and OS images</h2><table id=\"served\"><tr><th>repository</th><th class=\"num\">manifests</th>\
         <th class=\"num\">blobs</th><th class=\"num\">bytes</th><th class=\"num\">hits</th><th class=\"num\">misses</th></tr>",
    );
    let top = served.top_where(20, |repo| viewer.sees_repository(&mirror, repo));
    if top.is_empty() {
        h.push_str("<tr><td colspan=\"6\">nothing served to workers yet</td></tr>");
    }
    for (repo, r) in top {
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&repo),
            r.manifest_requests,
            r.blob_requests,
            human(r.bytes),
            r.hits,
            r.misses
        );
    }
    h.push_str(
        "</table><p><a href=\"/metrics\">metrics</a> · <a href=\"/api/v1/served\">served (JSON)</a> · <a href=\"/api/v1/fills\">fills (JSON)</a> · \
         <a href=\"/readyz\">readiness</a></p></body></html>",
    );
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], h)
}

/// The shared bucket: up, or down with its cause (and, for a viewer who sees everything, the
/// error), as `tender_bucket_up` and `tender_bucket_down_cause` show it.
fn bucket_section(b: &BucketView, viewer: crate::Viewer) -> String {
    let (class, word, detail) = match &b.status {
        BucketStatus::Up { leases, leases_configured, slow } => {
            let leases = if *leases {
                "fill leases on"
            } else if *leases_configured {
                "fill leases off: the server has no conditional writes"
            } else {
                "fill leases off (lease: false)"
            };
            if *slow {
                ("down", "degraded (slow)".to_string(), format!("{leases}; chunks keep failing for slow"))
            } else {
                ("up", "up".to_string(), leases.to_string())
            }
        }
        BucketStatus::Down { cause, message, since } => {
            let secs = since.elapsed().map(|d| d.as_secs()).unwrap_or(0);
            let message = match viewer {
                crate::Viewer::All => esc(message),
                crate::Viewer::Anonymous => "(shown to authenticated clients)".to_string(),
            };
            let detail =
                format!("<span class=\"cause\">{cause}</span> for {secs} s, probed in the background: {message}");
            ("down", "down".to_string(), detail)
        }
    };
    format!(
        "<h2>Shared bucket</h2><table id=\"bucket\"><tr><th>bucket</th><th>state</th><th>detail</th></tr>\
         <tr><td>{}</td><td class=\"{class}\">{word}</td><td>{detail}</td></tr></table>",
        esc(&b.name)
    )
}

/// Bytes fetched from each upstream against bytes served to workers from it, the saving, and
/// (for a viewer who sees every upstream) the last 24 hours as a chart.
fn savings_section(
    savings: &crate::savings::Savings,
    served: &std::collections::BTreeMap<String, crate::served::RepoServed>,
    viewer: crate::Viewer,
    mirror: &tender_fetch::Mirror,
    now: u64,
) -> String {
    use crate::savings::{chart, ratio};
    let mut per: std::collections::BTreeMap<String, (u64, u64)> = std::collections::BTreeMap::new();
    for (up, n) in &savings.fetched {
        per.entry(up.clone()).or_default().0 = *n;
    }
    for (repo, r) in served {
        let up = repo.split_once('/').map_or(repo.as_str(), |(u, _)| u);
        let e = per.entry(up.to_string()).or_default();
        e.1 = e.1.saturating_add(r.bytes);
    }
    let factory = mirror.image_factory().map(|f| f.name().to_string());
    per.retain(|up, _| viewer.sees_upstream(mirror, up) || factory.as_deref() == Some(up.as_str()));
    let mut h = String::from(
        "<h2>What tender saved</h2><table id=\"savings\"><tr><th>upstream</th><th class=\"num\">fetched upstream</th>\
         <th class=\"num\">served to workers</th><th class=\"num\">saved</th><th class=\"num\">served / fetched</th></tr>",
    );
    let (mut tf, mut ts) = (0u64, 0u64);
    for (up, (f, sv)) in &per {
        tf = tf.saturating_add(*f);
        ts = ts.saturating_add(*sv);
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(up),
            human(*f),
            human(*sv),
            human(sv.saturating_sub(*f)),
            ratio(*f, *sv)
        );
    }
    let _ = write!(
        h,
        "<tr id=\"savings-total\"><th>total</th><th class=\"num\">{}</th><th class=\"num\">{}</th><th class=\"num\">{}</th><th class=\"num\">{}</th></tr></table>",
        human(tf),
        human(ts),
        human(ts.saturating_sub(tf)),
        ratio(tf, ts)
    );
    if viewer == crate::Viewer::All {
        h.push_str(
            "<p>Last 24 hours, per 15 minutes: <span style=\"color:#1f4e79\">■ fetched upstream</span> \
                    <span style=\"color:#8ab6e0\">■ served to workers</span></p>",
        );
        h.push_str(&chart(&savings.buckets, now, human));
    }
    h
}

/// The object a fill is for, short: `sha256:0123456789ab…`, or the asset path.
fn short_object(o: &str) -> String {
    match o.split_once(':') {
        Some((alg, hex)) if hex.len() > 12 && !o.starts_with('/') => format!("{alg}:{}…", &hex[..12]),
        _ => o.to_string(),
    }
}

/// Fills in progress (bytes, rate, ETA, retries, clients) and those that ended in the last hour.
pub(crate) fn fills_section(view: &tender_fetch::fills::FillsView, now: u64) -> String {
    let mut h = String::from(
        "<h2>Fills</h2><table id=\"fills\"><tr><th>upstream</th><th>object</th><th class=\"num\">bytes</th>\
         <th class=\"num\">rate</th><th class=\"num\">ETA</th><th class=\"num\">retries</th>\
         <th class=\"num\">clients</th><th>started</th><th>id</th></tr>",
    );
    if view.active.is_empty() {
        h.push_str("<tr><td colspan=\"9\">no fill in progress</td></tr>");
    }
    for f in &view.active {
        let of = f.total.map(|t| format!(" of {}", human(t))).unwrap_or_default();
        let eta = f.eta_seconds.map_or_else(|| "—".to_string(), |s| format!("{s}s"));
        let _ = write!(
            h,
            "<tr class=\"fill\"><td>{}</td><td title=\"{}\">{}</td><td class=\"num\">{}{of}</td>\
             <td class=\"num\">{}/s</td><td class=\"num\">{eta}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td><td><code>{}</code></td></tr>",
            esc(&f.upstream),
            esc(&f.path),
            esc(&short_object(&f.object)),
            human(f.bytes),
            human(f.rate),
            f.retries,
            f.clients,
            ago(now, f.started_at),
            esc(&f.id),
        );
    }
    h.push_str("</table>");
    if !view.ended.is_empty() {
        h.push_str(
            "<h3>Ended in the last hour</h3><table id=\"fills-ended\"><tr><th>upstream</th><th>object</th>\
             <th>outcome</th><th class=\"num\">bytes</th><th class=\"num\">seconds</th>\
             <th class=\"num\">retries</th><th class=\"num\">clients</th><th>ended</th></tr>",
        );
        for e in view.ended.iter().take(20) {
            let class = if e.outcome == "committed" { "up" } else { "cause" };
            let why = e.error.as_deref().map(|m| format!(": {}", esc(m))).unwrap_or_default();
            let _ = write!(
                h,
                "<tr><td>{}</td><td title=\"{}\">{}</td><td><span class=\"{class}\">{}</span>{why}</td>\
                 <td class=\"num\">{}</td><td class=\"num\">{:.1}</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{}</td><td>{}</td></tr>",
                esc(&e.upstream),
                esc(&e.path),
                esc(&short_object(&e.object)),
                e.outcome,
                human(e.bytes),
                e.seconds,
                e.retries,
                e.served,
                ago(now, e.ended_at),
            );
        }
        h.push_str("</table>");
    }
    h
}

/// The signature policy's decisions of the last hour: what verified (whose signature, when)
/// and what was refused, and why.
pub(crate) fn verifications_section(view: &tender_fetch::fills::FillsView, now: u64) -> String {
    if view.verifications.is_empty() {
        return String::new();
    }
    let mut h = String::from(
        "<h2>Signature policy</h2><table id=\"verifications\"><tr><th>image</th><th>digest</th><th>result</th>\
         <th>signed by</th><th>rule</th><th>when</th></tr>",
    );
    for v in view.verifications.iter().take(20) {
        let class = if v.result == "verified" { "up" } else { "cause" };
        let by = match (&v.identity, &v.issuer) {
            (Some(i), Some(iss)) => format!("{} ({})", esc(i), esc(iss)),
            (Some(i), None) => esc(i),
            _ => v.reason.as_deref().map(esc).unwrap_or_default(),
        };
        let digest = v.digest.as_deref().map(short_object).unwrap_or_default();
        let _ = write!(
            h,
            "<tr><td>{}</td><td><code>{}</code></td><td><span class=\"{class}\">{}</span></td><td>{by}</td>\
             <td>{}</td><td>{}</td></tr>",
            esc(&v.image),
            esc(&digest),
            esc(&v.result),
            esc(&v.rule),
            ago(now, v.at),
        );
    }
    h.push_str("</table>");
    h
}

/// The imported bundles, newest first: index, when, by whom, what they named.
pub(crate) fn imports_section(imports: &[crate::inventory::ImportView], now: u64) -> String {
    if imports.is_empty() {
        return String::new();
    }
    let mut h = String::from(
        "<h2>Imported bundles</h2><table id=\"imports\"><tr><th>index</th><th>imported</th><th>by</th>\
         <th class=\"num\">blobs</th><th class=\"num\">bytes</th><th>names</th></tr>",
    );
    for i in imports.iter().rev().take(50) {
        let mut names: Vec<String> = i.names.iter().take(8).map(|n| esc(n)).collect();
        if i.names.len() > 8 {
            names.push(format!("… {} more", i.names.len() - 8));
        }
        if i.hidden > 0 {
            names.push(format!("{} private", i.hidden));
        }
        let delta = i
            .delta_of
            .as_deref()
            .map(|d| format!("<br>delta on <code>{}</code>", esc(&short_object(d))))
            .unwrap_or_default();
        let _ = write!(
            h,
            "<tr><td><code>{}</code>{delta}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            esc(&short_object(&i.index.to_string())),
            ago(now, i.imported_at),
            esc(&i.identity),
            i.blobs,
            human(i.bytes),
            names.join("<br>"),
        );
    }
    h.push_str("</table>");
    h
}

/// The goldens and their phases.
pub(crate) fn catalog_section(view: &tender_catalog::CatalogView) -> String {
    let mut h = String::from(
        "<h2>Catalog</h2><table id=\"catalog\"><tr><th>golden</th><th>phase</th><th class=\"num\">virtual size</th>\
         <th class=\"num\">clones</th><th>sha256</th></tr>",
    );
    if view.goldens.is_empty() {
        h.push_str("<tr><td colspan=\"5\">no goldens configured</td></tr>");
    }
    for g in &view.goldens {
        let mut phase = g.phase.to_string();
        if let Some(p) = g.percent {
            phase.push_str(&format!(" {p:.0}%"));
        }
        if let Some(r) = &g.reason {
            phase.push_str(&format!(": {r}"));
        }
        let class = match phase.split(&[' ', ':'][..]).next().unwrap_or("") {
            "Succeeded" => "up",
            "Failed" => "down",
            _ => "unknown",
        };
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"{class}\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td><code>{}</code></td></tr>",
            esc(&g.name),
            esc(&phase),
            g.virtual_size.map(human).unwrap_or_default(),
            g.clones,
            esc(g.sha256.as_deref().map(|s| &s[..s.len().min(16)]).unwrap_or("")),
        );
    }
    h.push_str("</table>");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_escape_html() {
        assert_eq!(esc("<script>alert('x')</script>&\""), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;");
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.5 KiB");
    }
}
