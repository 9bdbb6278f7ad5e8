//! The `/v2/...` route parser (`tender_oci::Route::parse`), fed the raw request path.
//!
//! Properties: a parsed route prints back to exactly the path it came from (so no two spellings
//! reach the same route, and nothing was decoded or normalised on the way); its name is a valid
//! repository name whose components are never `.`, `..` or percent-encoded; an upload path is
//! never a route; anything outside `/v2` is not found.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tender_oci::{Route, RouteError, RouteKind};

fn print(r: &Route) -> String {
    let name = r.name.as_ref().map(|n| n.as_str()).unwrap_or("");
    match &r.kind {
        RouteKind::Base => "/v2/".to_string(),
        RouteKind::Manifest(re) => format!("/v2/{name}/manifests/{re}"),
        RouteKind::Blob(d) => format!("/v2/{name}/blobs/{d}"),
        RouteKind::TagsList => format!("/v2/{name}/tags/list"),
        RouteKind::Referrers(d) => format!("/v2/{name}/referrers/{d}"),
    }
}

fn check(path: &str) {
    match Route::parse(path) {
        Ok(r) => {
            assert!(path.starts_with("/v2"), "{path:?} parsed outside /v2");
            assert!(!path.contains('%'), "{path:?}: a percent sign reached a route");
            let printed = print(&r);
            if r.kind == RouteKind::Base {
                assert!(r.name.is_none());
                assert!(path == "/v2/" || path == "/v2", "{path:?} is not the base route");
            } else {
                assert_eq!(printed, path, "a route prints as the path it came from");
                let name = r.name.as_ref().expect("every route but the base has a name");
                for c in name.components() {
                    assert!(!c.is_empty() && c != "." && c != "..", "{path:?}: component {c:?}");
                }
                assert_eq!(name.as_str().parse().as_ref(), Ok(name));
            }
            assert_eq!(Route::parse(&printed), Ok(r), "the printed route parses to the same route");
        }
        Err(RouteError::NotFound(p)) => assert_eq!(p, path),
        Err(_) => assert!(path.starts_with("/v2/"), "{path:?} is not a /v2/ path, so it can only be not found"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(s) = tender_fuzz::text(data) else { return };
    check(s);
    // Most inputs are meant as the part after /v2/: spare the fuzzer finding the prefix.
    check(&format!("/v2/{s}"));
});
