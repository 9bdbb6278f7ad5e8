//! The `Range` header: one byte range, resolved against the object's length.

/// What a request's `Range` asks of an object of known length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeAsk {
    /// No usable range: serve the whole object (200). Multiple ranges land here too, which
    /// RFC 9110 allows.
    Full,
    /// Bytes `start..end` (end exclusive): 206.
    Partial { start: u64, end: u64 },
    /// The range cannot be satisfied: 416.
    Unsatisfiable,
}

/// Resolve a `Range` header value against an object of `len` bytes.
pub fn resolve(header: Option<&str>, len: u64) -> RangeAsk {
    let Some(h) = header else {
        return RangeAsk::Full;
    };
    // Another unit is ignored (RFC 9110); several ranges get the whole object, which it allows.
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return RangeAsk::Full;
    };
    if spec.contains(',') {
        return RangeAsk::Full;
    }
    // A byte range that is not one (`bytes=abc`, `bytes=5-2`) cannot be satisfied: 416, as
    // the reference registry answers it.
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeAsk::Unsatisfiable;
    };
    let (a, b) = (a.trim(), b.trim());
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    if a.is_empty() {
        // suffix: the last n bytes
        if !digits(b) {
            return RangeAsk::Unsatisfiable;
        }
        let Ok(n) = b.parse::<u64>() else {
            return RangeAsk::Full;
        };
        if n == 0 || len == 0 {
            return RangeAsk::Unsatisfiable;
        }
        return RangeAsk::Partial { start: len.saturating_sub(n), end: len };
    }
    if !digits(a) || !(b.is_empty() || digits(b)) {
        return RangeAsk::Unsatisfiable;
    }
    let Ok(start) = a.parse::<u64>() else {
        return RangeAsk::Unsatisfiable;
    };
    let last = if b.is_empty() {
        len.saturating_sub(1)
    } else {
        match b.parse::<u64>() {
            Ok(v) => v.min(len.saturating_sub(1)),
            Err(_) => len.saturating_sub(1),
        }
    };
    if !b.is_empty() && b.parse::<u64>().is_ok_and(|v| v < start) {
        return RangeAsk::Unsatisfiable;
    }
    if start >= len {
        return RangeAsk::Unsatisfiable;
    }
    RangeAsk::Partial { start, end: last + 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn should_resolve_range_forms() {
        let cases: &[(Option<&str>, u64, RangeAsk)] = &[
            (None, 10, RangeAsk::Full),
            (Some("bytes=0-0"), 10, RangeAsk::Partial { start: 0, end: 1 }),
            (Some("bytes=2-5"), 10, RangeAsk::Partial { start: 2, end: 6 }),
            (Some("bytes=2-"), 10, RangeAsk::Partial { start: 2, end: 10 }),
            (Some("bytes=-3"), 10, RangeAsk::Partial { start: 7, end: 10 }),
            (Some("bytes=-30"), 10, RangeAsk::Partial { start: 0, end: 10 }),
            (Some("bytes=5-100"), 10, RangeAsk::Partial { start: 5, end: 10 }),
            (Some("bytes=10-"), 10, RangeAsk::Unsatisfiable),
            (Some("bytes=10-20"), 10, RangeAsk::Unsatisfiable),
            (Some("bytes=-0"), 10, RangeAsk::Unsatisfiable),
            (Some("bytes=0-"), 0, RangeAsk::Unsatisfiable),
            (Some("bytes=5-2"), 10, RangeAsk::Unsatisfiable),
            (Some("bytes=0-1,3-4"), 10, RangeAsk::Full),
            (Some("items=0-1"), 10, RangeAsk::Full),
            (Some("bytes=x-1"), 10, RangeAsk::Unsatisfiable),
            (Some("bytes=abc"), 10, RangeAsk::Unsatisfiable),
            (Some("bytes=99999999999999999999999-"), 10, RangeAsk::Unsatisfiable),
        ];
        for (h, len, want) in cases {
            assert_eq!(resolve(*h, *len), *want, "{h:?} of {len}");
        }
    }

    proptest! {
        #[test]
        fn should_only_yield_ranges_inside_the_object(h in "bytes=[0-9]{0,4}-[0-9]{0,4}", len in 0u64..5000) {
            if let RangeAsk::Partial { start, end } = resolve(Some(&h), len) {
                prop_assert!(start < end);
                prop_assert!(end <= len);
            }
        }

        #[test]
        fn should_never_panic_on_any_header(h in "\\PC{0,40}", len in 0u64..u64::MAX) {
            let _ = resolve(Some(&h), len);
        }
    }
}
