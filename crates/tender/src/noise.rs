//! The HTTP libraries' own warnings, bounded (issue 41): hyper, h2 and rustls log a WARN line
//! for protocol errors a peer causes (each rapid-reset connection, each malformed frame), so a
//! hostile client could write megabytes of log a second. Each of their WARN and ERROR call sites
//! is let through at most once a minute; tender's own lines and every lower level are untouched
//! (the `TENDER_LOG` filter still decides those).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::subscriber::Interest;
use tracing::{Level, Metadata};
use tracing_subscriber::filter::{dynamic_filter_fn, DynFilterFn};
use tracing_subscriber::layer::Context;

/// How often one library call site may log, at most.
pub const EVERY: Duration = Duration::from_secs(60);

/// Targets whose warnings come from peers' behaviour rather than tender's.
const LIBRARIES: [&str; 4] = ["h2", "hyper", "hyper_util", "rustls"];

fn is_library(target: &str) -> bool {
    LIBRARIES.iter().any(|l| target == *l || target.strip_prefix(l).is_some_and(|rest| rest.starts_with("::")))
}

/// How the filter answers for a call site when it is registered.
type CallsiteInterest = fn(&'static Metadata<'static>) -> Interest;

/// Whether the filter has a say on this call site: a library's WARN or ERROR event.
fn watched(m: &Metadata<'_>) -> bool {
    m.is_event() && *m.level() <= Level::WARN && is_library(m.target())
}

/// The filter, as a layer of the logging subscriber. Decided per event (never cached per call
/// site) for the call sites it watches; every other call site is always let through.
pub fn library_noise<S>() -> DynFilterFn<S, impl Fn(&Metadata<'_>, &Context<'_, S>) -> bool, CallsiteInterest>
where
    S: tracing::Subscriber,
{
    let last: Mutex<HashMap<Identifier, Instant>> = Mutex::new(HashMap::new());
    let interest: CallsiteInterest = |m| if watched(m) { Interest::sometimes() } else { Interest::always() };
    dynamic_filter_fn(move |m: &Metadata<'_>, _: &Context<'_, S>| {
        if !watched(m) {
            return true;
        }
        let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match last.get(&m.callsite()) {
            Some(t) if now.duration_since(*t) < EVERY => false,
            _ => {
                last.insert(m.callsite(), now);
                true
            }
        }
    })
    .with_callsite_filter(interest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tracing_subscriber::layer::SubscriberExt as _;

    struct Count(Arc<AtomicUsize>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Count {
        fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// 1,000 warnings from one h2 call site (a rapid-reset flood) are one line; tender's own
    /// warnings and the libraries' debug lines all pass.
    #[test]
    fn should_let_each_library_warning_through_once_a_minute() {
        let n = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry().with(library_noise()).with(Count(n.clone()));
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..1000 {
                tracing::warn!(target: "h2::proto::connection", "connection error: ENHANCE_YOUR_CALM");
            }
            assert_eq!(n.load(Ordering::Relaxed), 1, "one line for a thousand");
            tracing::warn!(target: "h2::codec", "another kind");
            assert_eq!(n.load(Ordering::Relaxed), 2, "each call site has its own minute");
            for _ in 0..10 {
                tracing::warn!(target: "tender::serve", "tender's own");
                tracing::debug!(target: "hyper::proto", "debug");
            }
            assert_eq!(n.load(Ordering::Relaxed), 22);
        });
        assert!(is_library("hyper_util::server") && is_library("rustls") && !is_library("hyperlink"));
    }
}
