//! Go duration strings (`10s`, `1m30s`, `250ms`), as Multigres parses its flags: the webhook
//! compares the spec's by length of time, and the handlers' own duration flags take the same
//! form. One parser, stricter than Go's where Go accepts oddities (`.5s`, `1.s`), and never a
//! panic on an overflowing value (kube's `Duration` multiplies floats and can).

use std::time::Duration;

/// The longest duration Go represents: `time.Duration` is an int64 of nanoseconds, so
/// `time.ParseDuration` refuses anything longer and a Multigres process given such a flag exits
/// at start.
pub const MAX: Duration = Duration::new(9_223_372_036, 854_775_807);

/// [`MAX`] as Go prints it, for messages.
pub const MAX_TEXT: &str = "2562047h47m16.854775807s";

/// Why a duration string is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a Go duration at all.
    #[error("{0:?} is not a duration such as 10s or 1m30s")]
    Syntax(String),
    /// A duration Go cannot hold.
    #[error(
        "{0:?} is longer than Go's longest duration ({MAX_TEXT}, an int64 of nanoseconds), so \
         Multigres would refuse the flag and not start"
    )]
    TooLong(String),
}

/// Parses a Go duration and refuses one Go cannot hold (longer than [`MAX`]).
pub fn parse_go(text: &str) -> Result<Duration, DurationError> {
    match parse(text) {
        None if is_overflow(text) => Err(DurationError::TooLong(text.to_owned())),
        None => Err(DurationError::Syntax(text.to_owned())),
        Some(d) if d > MAX => Err(DurationError::TooLong(text.to_owned())),
        Some(d) => Ok(d),
    }
}

/// Whether `text` is well-formed but too long even for [`parse`]'s own arithmetic: it parses
/// with every run of digits made `1`.
fn is_overflow(text: &str) -> bool {
    let mut small = String::with_capacity(text.len());
    let mut in_digits = false;
    for c in text.chars() {
        let digit = c.is_ascii_digit();
        if !digit {
            small.push(c);
        } else if !in_digits {
            small.push('1');
        }
        in_digits = digit;
    }
    parse(&small).is_some()
}

/// Parses a Go duration such as `1h2m3.5s` (the CRD pattern already forbids signs). No upper
/// bound but `u64` seconds: [`parse_go`] bounds it as Go does.
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
    fn go_refuses_what_an_int64_of_nanoseconds_cannot_hold() {
        assert_eq!(parse_go(MAX_TEXT), Ok(MAX));
        assert_eq!(parse(MAX_TEXT), Some(MAX));
        assert_eq!(
            parse_go("2562047h"),
            Ok(Duration::from_secs(2_562_047 * 3600))
        );
        for long in [
            "2562047h47m16.854775808s",
            "3000000h",
            "2562048h",
            "99999999999999999999999999999999999999999h",
        ] {
            assert_eq!(
                parse_go(long),
                Err(DurationError::TooLong(long.to_owned())),
                "{long}"
            );
        }
        assert_eq!(
            parse_go("ten seconds"),
            Err(DurationError::Syntax("ten seconds".to_owned()))
        );
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
