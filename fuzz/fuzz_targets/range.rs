//! The `Range` header resolver (`crates/server/src/range.rs`, `resolve(header, len)`).
//!
//! Input: 8 bytes of object length (little endian; a first byte with the high bit clear keeps
//! the length small, so short objects are hit often), then the header value.
//!
//! Properties: a partial range is non-empty and lies inside the object; the canonical spelling
//! of a resolved range (`bytes=S-E`) resolves to the same range; `bytes=A-B` and `bytes=-N`
//! with plain numbers resolve as RFC 9110 says (first-pos, last-pos clamped to the end, the
//! last N bytes); a range that starts at or past the end, or ends before it starts, is
//! unsatisfiable; an empty object has
//! no partial range; no header, another unit or several ranges mean the whole object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tender_fuzz::range::{resolve, RangeAsk};

fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn check(header: &str, len: u64) {
    assert_eq!(resolve(None, len), RangeAsk::Full);
    let got = resolve(Some(header), len);
    assert_eq!(resolve(Some(header), len), got, "deterministic");
    if let RangeAsk::Partial { start, end } = got {
        assert!(start < end, "{header:?} of {len}: empty range {start}..{end}");
        assert!(end <= len, "{header:?} of {len}: {start}..{end} ends past the object");
        let canonical = format!("bytes={start}-{}", end - 1);
        assert_eq!(resolve(Some(&canonical), len), got, "{header:?} of {len}: canonical {canonical:?}");
        let suffix = format!("bytes=-{}", end - start);
        if end == len {
            assert_eq!(resolve(Some(&suffix), len), got, "{header:?} of {len}: as a suffix {suffix:?}");
        }
    }
    if len == 0 {
        assert!(!matches!(got, RangeAsk::Partial { .. }), "{header:?}: a partial range of an empty object");
    }
    let Some(spec) = header.strip_prefix("bytes=") else {
        if !header.trim().starts_with("bytes=") {
            assert_eq!(got, RangeAsk::Full, "{header:?}: not a bytes range");
        }
        return;
    };
    if spec.contains(',') {
        assert_eq!(got, RangeAsk::Full, "{header:?}: several ranges are served whole");
        return;
    }
    // The plain forms, exactly: digits, one dash, digits.
    let Some((a, b)) = spec.split_once('-') else { return };
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(first), Ok(last)) if digits(a) && digits(b) => {
            // A reversed range is no range: 416, as the reference registry answers it.
            let want = if last < first || first >= len {
                RangeAsk::Unsatisfiable
            } else {
                RangeAsk::Partial { start: first, end: last.min(len - 1) + 1 }
            };
            assert_eq!(got, want, "{header:?} of {len}");
        }
        (Ok(first), _) if digits(a) && b.is_empty() => {
            let want =
                if first >= len { RangeAsk::Unsatisfiable } else { RangeAsk::Partial { start: first, end: len } };
            assert_eq!(got, want, "{header:?} of {len}");
        }
        (_, Ok(n)) if a.is_empty() && digits(b) => {
            let want = if n == 0 || len == 0 {
                RangeAsk::Unsatisfiable
            } else {
                RangeAsk::Partial { start: len - n.min(len), end: len }
            };
            assert_eq!(got, want, "{header:?} of {len}");
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (n, rest) = data.split_at(8);
    let mut raw = [0u8; 8];
    raw.copy_from_slice(n);
    let len = if raw[0] & 0x80 == 0 { u64::from(raw[1]) | (u64::from(raw[2]) << 8) } else { u64::from_le_bytes(raw) };
    let Some(header) = tender_fuzz::text(rest) else { return };
    check(header, len);
});
