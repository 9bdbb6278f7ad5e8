//! Repository names, tags, digests and references (`crates/oci`).
//!
//! Properties: whatever parses prints back to exactly the input (one spelling per value); a
//! digest is `sha256:` and 64 or `sha512:` and 128 lowercase hex digits, and its hex and bytes
//! round-trip with its algorithm; a name's components
//! are never empty, `.`, `..` or percent-encoded, and stay inside `[a-z0-9._-]`; a tag stays
//! inside its grammar; derived names (`library/` prefix, first component stripped) still parse.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tender_oci::name::{MAX_NAME_LEN, MAX_TAG_LEN};
use tender_oci::{Digest, Reference, RepoName, Tag};

fn check_digest(s: &str) {
    let Ok(d) = s.parse::<Digest>() else { return };
    assert_eq!(d.to_string(), s, "a digest prints as it was written");
    let (alg, hex) = s.split_once(':').expect("an algorithm prefix");
    let algorithm = d.algorithm();
    assert_eq!(alg, algorithm.name());
    assert_eq!(hex.len(), algorithm.hex_len());
    assert!(matches!((alg, hex.len()), ("sha256", 64) | ("sha512", 128)), "{s:?}");
    assert!(hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{s:?}: lowercase hex only");
    assert_eq!(d.hex(), hex);
    assert_eq!(Digest::from_hex(algorithm, &d.hex()), Ok(d));
    assert_eq!(Digest::from_bytes(algorithm, d.as_bytes()), Some(d));
    let json = serde_json::to_string(&d).expect("serialise");
    assert_eq!(serde_json::from_str::<Digest>(&json).expect("deserialise"), d);
}

fn check_name(s: &str) {
    let Ok(n) = s.parse::<RepoName>() else { return };
    assert_eq!(n.as_str(), s);
    assert_eq!(n.to_string(), s);
    assert!(!s.is_empty() && s.len() <= MAX_NAME_LEN);
    for c in n.components() {
        assert!(!c.is_empty() && c != "." && c != "..", "{s:?}: component {c:?}");
        assert!(
            c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')),
            "{s:?}: component {c:?} leaves the grammar"
        );
        let first = c.as_bytes()[0];
        let last = c.as_bytes()[c.len() - 1];
        assert!(first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric(), "{s:?}: separator at an edge");
    }
    if let Some((first, rest)) = n.strip_first() {
        assert_eq!(format!("{first}/{rest}"), s);
        assert_eq!(rest.as_str().parse::<RepoName>().as_ref(), Ok(&rest));
    }
    let prefixed = n.clone().with_library_prefix();
    if s.contains('/') {
        assert_eq!(prefixed, n);
    } else {
        assert_eq!(prefixed.as_str(), format!("library/{s}"));
        if prefixed.as_str().len() <= MAX_NAME_LEN {
            assert_eq!(prefixed.as_str().parse::<RepoName>().as_ref(), Ok(&prefixed));
        }
    }
}

fn check_tag(s: &str) {
    let Ok(t) = s.parse::<Tag>() else { return };
    assert_eq!(t.as_str(), s);
    assert!(!s.is_empty() && s.len() <= MAX_TAG_LEN);
    assert!(s.as_bytes()[0] != b'.' && s.as_bytes()[0] != b'-', "{s:?}");
    assert!(s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')), "{s:?}");
}

fn check_reference(s: &str) {
    let Ok(r) = s.parse::<Reference>() else { return };
    assert_eq!(r.to_string(), s);
    match &r {
        Reference::Tag(t) => assert_eq!(s.parse::<Tag>().as_ref(), Ok(t)),
        Reference::Digest(d) => assert_eq!(s.parse::<Digest>().as_ref(), Ok(d)),
    }
    assert!(r.to_string().parse::<Reference>() == Ok(r));
}

fuzz_target!(|data: &[u8]| {
    let Some(s) = tender_fuzz::text(data) else { return };
    check_digest(s);
    check_name(s);
    check_tag(s);
    check_reference(s);
    // A digest is also tried behind the prefix, so the fuzzer does not have to find it.
    check_digest(&format!("sha256:{s}"));
});
