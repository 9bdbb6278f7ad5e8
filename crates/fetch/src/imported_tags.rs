//! A tag list answered from the tags imported bundles registered (authoritative, `imported`)
//! while the upstream is offline or down: `skopeo list-tags` works at a site with no egress.

use bytes::Bytes;
use tender_oci::RepoName;
use tender_store::{Store, StoreError};

/// Largest page of a tag list answered here.
const MAX_PAGE: usize = 1000;

/// The imported tags of `upstream`/`repository` that still stand (a later pull or `tag rm`
/// may have replaced or removed one), sorted.
pub fn imported(store: &Store, upstream: &str, repository: &str) -> Result<Vec<String>, StoreError> {
    let mut tags = Vec::new();
    for r in store.imports()? {
        for e in r.entries {
            let (Some(u), Some(repo), Some(tag)) = (e.upstream, e.repository, e.tag) else { continue };
            if u == upstream
                && repo == repository
                && !tags.contains(&tag)
                && store.tag_get(upstream, repository, &tag)?.is_some_and(|t| t.imported)
            {
                tags.push(tag);
            }
        }
    }
    tags.sort();
    Ok(tags)
}

/// The page the client asked for (`n`, `last`) of `tags` (sorted), as a distribution tag list
/// named `client_name`, with the `Link` to the next page (`ns` kept when the client used it).
pub fn page(
    tags: &[String],
    query: &[(String, String)],
    client_name: &RepoName,
    ns: Option<&str>,
) -> (Bytes, Option<String>) {
    let get = |k: &str| query.iter().find(|(q, _)| q == k).map(|(_, v)| v.as_str());
    let n = get("n").and_then(|v| v.parse::<usize>().ok()).unwrap_or(MAX_PAGE).min(MAX_PAGE);
    let last = get("last");
    let rest: Vec<&String> = tags.iter().filter(|t| last.is_none_or(|l| t.as_str() > l)).collect();
    let page: Vec<&String> = rest.iter().take(n).copied().collect();
    let link = (rest.len() > page.len() && !page.is_empty()).then(|| {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        q.append_pair("n", &n.to_string());
        if let Some(l) = page.last() {
            q.append_pair("last", l);
        }
        if let Some(ns) = ns {
            q.append_pair("ns", ns);
        }
        format!("</v2/{client_name}/tags/list?{}>; rel=\"next\"", q.finish())
    });
    let body = serde_json::json!({ "name": client_name.to_string(), "tags": page });
    (Bytes::from(body.to_string()), link)
}

/// A stale tag list (the upstream's last answer) with the imported tags it lacks, within the
/// page the client asked for.
pub fn merge(body: Bytes, tags: &[String], query: &[(String, String)]) -> Bytes {
    let Ok(serde_json::Value::Object(mut list)) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return body;
    };
    let last = query.iter().find(|(k, _)| k == "last").map(|(_, v)| v.as_str());
    let n = query.iter().find(|(k, _)| k == "n").and_then(|(_, v)| v.parse::<usize>().ok());
    let mut have: Vec<String> = list
        .get("tags")
        .and_then(|t| t.as_array())
        .map(|a| a.iter().filter_map(|t| t.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    have.extend(tags.iter().filter(|t| last.is_none_or(|l| t.as_str() > l)).cloned());
    have.sort();
    have.dedup();
    if let Some(n) = n {
        have.truncate(n);
    }
    list.insert("tags".into(), serde_json::Value::from(have));
    serde_json::to_vec(&list).map(Bytes::from).unwrap_or(body)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn should_page_imported_tags_with_a_link_to_the_next_page() {
        let tags: Vec<String> = ["v1", "v2", "v3"].map(String::from).to_vec();
        let name: RepoName = "ghcr.io/a/b".parse().unwrap();
        let (body, link) = page(&tags, &q(&[("n", "2")]), &name, Some("ghcr.io"));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, serde_json::json!({"name": "ghcr.io/a/b", "tags": ["v1", "v2"]}));
        assert_eq!(link.as_deref(), Some("</v2/ghcr.io/a/b/tags/list?n=2&last=v2&ns=ghcr.io>; rel=\"next\""));
        let (body, link) = page(&tags, &q(&[("n", "2"), ("last", "v2")]), &name, None);
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&body).unwrap()["tags"], serde_json::json!(["v3"]));
        assert!(link.is_none());
    }

    #[test]
    fn should_merge_imported_tags_into_a_stale_list() {
        let body = Bytes::from_static(br#"{"name":"a/b","tags":["v1","v4"]}"#);
        let merged = merge(body, &["v2".into(), "v4".into()], &q(&[]));
        let v: serde_json::Value = serde_json::from_slice(&merged).unwrap();
        assert_eq!(v["tags"], serde_json::json!(["v1", "v2", "v4"]));
    }
}
