//! Go duration strings (`10s`, `1m30s`, `250ms`), as Multigres parses its flags: the webhook
//! compares the spec's by length of time, and the handlers' own duration flags take the same
//! form. One parser, stricter than Go's where Go accepts oddities (`.5s`, `1.s`), and never a
//! panic on an overflowing value (kube's `Duration` multiplies floats and can).

use std::time::Duration;

/// Parses a Go duration such as `1h2m3.5s` (the CRD pattern already forbids signs).
pub fn parse(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&end| end > 0)?;
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let (whole, fraction) = match number.split_once('.') {
            Some((_, fraction)) if fraction.is_empty() || fraction.contains('.') => {
                return None;
            }
            Some(split) => split,
            None => (number, ""),
        };
        if whole.is_empty() {
            return None;
        }
        let whole: u128 = whole.parse().ok()?;
        let mut nanos = whole.checked_mul(unit_nanos)?;
        let mut scale = unit_nanos;
        for digit in fraction.bytes() {
            scale /= 10;
            nanos = nanos.checked_add(u128::from(digit - b'0') * scale)?;
        }
        total = total.checked_add(nanos)?;
        rest = next;
    }
    let secs = u64::try_from(total / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (total % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("2us"), Some(Duration::from_micros(2)));
        assert_eq!(parse("3µs"), Some(Duration::from_micros(3)));
        assert_eq!(parse("7ns"), Some(Duration::from_nanos(7)));
        assert_eq!(parse("0s"), Some(Duration::ZERO));
        assert_eq!(parse("0"), Some(Duration::ZERO));
    }

    #[test]
    fn malformed_durations() {
        for bad in [
            "",
            "10",
            "s",
            "ten seconds",
            "1d",
            "1.s",
            ".5s",
            "1..5s",
            "-1s",
            "1s2",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
