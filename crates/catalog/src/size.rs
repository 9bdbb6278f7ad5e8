//! Sizes in bytes: parsed from `20Gi`-style quantities, shown as `20.0 GiB`.

/// Parse a whole number of bytes: plain digits, or digits with a unit: `Ki Mi Gi Ti Pi` (powers
/// of 1024), `k K M G T P` (powers of 1000), optionally followed by `B` (`20GiB`, `5GB`).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return None;
    }
    let n: u64 = num.parse().ok()?;
    let unit = unit.trim();
    let unit = unit.strip_suffix('B').unwrap_or(unit);
    let mult: u64 = match unit {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// `1.5 GiB`, `512 B`
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", UNITS[i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn should_parse_sizes_with_units() {
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("20Gi"), Some(20 << 30));
        assert_eq!(parse_bytes("20GiB"), Some(20 << 30));
        assert_eq!(parse_bytes("6144Mi"), Some(6 << 30));
        assert_eq!(parse_bytes("5G"), Some(5_000_000_000));
        assert_eq!(parse_bytes("64k"), Some(64_000));
        for bad in ["", "Gi", "1.5Gi", "-1", "1Xi", "99999999999Ti", "1 0"] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn should_show_sizes_for_people() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(32 << 20), "32.0 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }

    proptest! {
        #[test]
        fn should_round_trip_mebibytes(n in 0u64..1_000_000) {
            prop_assert_eq!(parse_bytes(&format!("{n}Mi")), Some(n << 20));
        }
    }
}
