//! Kubernetes resource quantities (`20Gi`, `6144Mi`, `1.5G`, `5e9`), compared exactly.
//!
//! Only non-negative quantities are accepted: every quantity tender reads is a size.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Deserializer};

/// A parsed quantity: the text as written plus its exact value, `digits * 2^pow2 * 10^pow10`.
#[derive(Debug, Clone)]
pub struct Quantity {
    text: String,
    digits: u128,
    pow2: u32,
    pow10: i32,
}

impl Quantity {
    /// Parse `<number><suffix>` where the suffix is one of `Ki Mi Gi Ti Pi Ei`, `m k M G T P E`,
    /// an `e`/`E` exponent, or nothing.
    pub fn parse(text: &str) -> Result<Quantity, String> {
        let s = text.strip_prefix('+').unwrap_or(text);
        if s.starts_with('-') {
            return Err("is negative".into());
        }
        let num_len = s.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
        let (number, suffix) = s.split_at(num_len);
        let (int_part, frac_part) = match number.split_once('.') {
            Some((i, f)) => (i, f),
            None => (number, ""),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err("has no number".into());
        }
        if frac_part.contains('.') {
            return Err("has two decimal points".into());
        }
        let all_digits = format!("{int_part}{frac_part}");
        let digits: u128 = if all_digits.is_empty() {
            0
        } else {
            all_digits
                .trim_start_matches('0')
                .chars()
                .try_fold(0u128, |acc, c| {
                    let d = u128::from(c.to_digit(10).unwrap_or(0));
                    acc.checked_mul(10).and_then(|v| v.checked_add(d))
                })
                .ok_or("is too large")?
        };
        let frac_len = i32::try_from(frac_part.len()).map_err(|_| "is too long")?;
        let (pow2, suffix_pow10): (u32, i32) = match suffix {
            "" => (0, 0),
            "Ki" => (10, 0),
            "Mi" => (20, 0),
            "Gi" => (30, 0),
            "Ti" => (40, 0),
            "Pi" => (50, 0),
            "Ei" => (60, 0),
            "m" => (0, -3),
            "k" => (0, 3),
            "M" => (0, 6),
            "G" => (0, 9),
            "T" => (0, 12),
            "P" => (0, 15),
            "E" => (0, 18),
            other => {
                let exp = other
                    .strip_prefix('e')
                    .or_else(|| other.strip_prefix('E'))
                    .ok_or_else(|| format!("has an unknown suffix {other:?}"))?;
                let unsigned = exp.strip_prefix('+').or_else(|| exp.strip_prefix('-')).unwrap_or(exp);
                if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) || unsigned.len() > 3 {
                    return Err(format!("has a malformed exponent {other:?}"));
                }
                let e: i32 = exp.parse().map_err(|_| format!("has a malformed exponent {other:?}"))?;
                (0, e)
            }
        };
        Ok(Quantity { text: text.to_string(), digits, pow2, pow10: suffix_pow10 - frac_len })
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn is_zero(&self) -> bool {
        self.digits == 0
    }

    /// Exact comparison; `None` when a value is too large to compare.
    pub fn compare(&self, other: &Quantity) -> Option<Ordering> {
        let low = self.pow10.min(other.pow10);
        let a = scaled(self, low)?;
        let b = scaled(other, low)?;
        Some(a.cmp(&b))
    }
}

/// `digits * 2^pow2 * 10^(pow10 - low)`, an integer because `pow10 >= low`.
fn scaled(q: &Quantity, low: i32) -> Option<u128> {
    let shift = u32::try_from(q.pow10 - low).ok()?;
    let v = q.digits.checked_mul(1u128.checked_shl(q.pow2)?)?;
    v.checked_mul(10u128.checked_pow(shift)?)
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq for Quantity {
    /// Equal values; the same exact value is equal even when it is too large to compare.
    fn eq(&self, other: &Self) -> bool {
        (self.digits, self.pow2, self.pow10) == (other.digits, other.pow2, other.pow10)
            || self.compare(other) == Some(Ordering::Equal)
    }
}

/// A value that YAML may give as an integer or a string (`x-kubernetes-int-or-string`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntOrString(pub String);

impl<'de> Deserialize<'de> for IntOrString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// A visitor, not an untagged enum: a wrong type then reads "expected an integer or a
        /// string" at its key, not serde's "no variant of untagged enum".
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = IntOrString;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer or a string (int-or-string, e.g. 2 or 20Gi)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<IntOrString, E> {
                Ok(IntOrString(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<IntOrString, E> {
                Ok(IntOrString(v.to_string()))
            }
            // A fractional number (`cpu: 2.5`) is kept as its text, so the field's own check
            // says what is wrong with it.
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<IntOrString, E> {
                Ok(IntOrString(v.to_string()))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<IntOrString, E> {
                Ok(IntOrString(v.to_string()))
            }
        }
        d.deserialize_any(Visit)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn should_compare_quantities_across_suffixes() {
        for (a, b, want) in [
            ("20Gi", "6Gi", Ordering::Greater),
            ("6Gi", "6144Mi", Ordering::Equal),
            ("6G", "6Gi", Ordering::Less),
            ("1.5Gi", "1536Mi", Ordering::Equal),
            ("5e9", "5G", Ordering::Equal),
            ("500m", "1", Ordering::Less),
            (".5", "500m", Ordering::Equal),
            ("0", "0Gi", Ordering::Equal),
            ("1Ei", "1E", Ordering::Greater),
        ] {
            assert_eq!(q(a).compare(&q(b)), Some(want), "{a} vs {b}");
        }
    }

    /// Found by the `render_catalog` fuzz target: a quantity too large to scale compared as
    /// unequal to itself, so G-9 refused an unchanged golden.
    #[test]
    fn should_equal_itself_however_large() {
        let big = "77777777777777777777777777757755555155Gi";
        assert_eq!(q(big).compare(&q(big)), None, "too large to scale");
        assert!(q(big) == q(big));
        assert!(q(big) != q("1Gi"));
    }

    #[test]
    fn should_refuse_malformed_quantities() {
        for bad in ["", "-1Gi", "Gi", "1.2.3", "1Gb", "1e", "1e+", "1 Gi", "$(id)", "1Gi\n"] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn should_order_binary_quantities_like_their_byte_counts(a in 0u64..1_000_000, b in 0u64..1_000_000) {
            let qa = q(&format!("{a}Mi"));
            let qb = q(&format!("{}Ki", b));
            prop_assert_eq!(qa.compare(&qb), Some((u128::from(a) * 1024).cmp(&u128::from(b))));
        }

        #[test]
        fn should_never_panic_on_any_text(s in "\\PC{0,12}") {
            let _ = Quantity::parse(&s);
        }
    }
}
