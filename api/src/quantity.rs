//! Kubernetes resource quantities (`500m`, `10Gi`, `1.5G`, `1e3`) parsed to exact values, so
//! limits, requests and volume sizes compare by amount rather than by spelling (`1Gi` equals
//! `1024Mi`). The one parser of the operator: the webhook judges quantities with it, the
//! handlers size volumes and PostgreSQL memory from it. No maintained crate parses
//! k8s-openapi 0.29's `Quantity`.

use std::fmt;

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string does not follow the quantity grammar.
    #[error(
        "{0:?} is not a quantity (expected a number with an optional suffix such as 500m, 10Gi or 1e3)"
    )]
    Syntax(String),
    /// The amount does not fit the range this server compares.
    #[error("{0:?} is out of range")]
    Range(String),
}

/// An amount in units of 10⁻⁹ (the finest precision Kubernetes keeps), rounded up as Kubernetes
/// rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

impl Quantity {
    /// Parses a quantity as the Kubernetes API server accepts it.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let syntax = || QuantityError::Syntax(text.to_owned());
        let range = || QuantityError::Range(text.to_owned());
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(syntax());
        }
        let digits = format!("{whole}{fraction}");
        let mantissa: i128 = digits.parse().map_err(|_| range())?;
        let scale = i32::try_from(fraction.len()).map_err(|_| range())?;
        let (base2, base10) = match suffix {
            "Ki" => (10, 0),
            "Mi" => (20, 0),
            "Gi" => (30, 0),
            "Ti" => (40, 0),
            "Pi" => (50, 0),
            "Ei" => (60, 0),
            "n" => (0, -9),
            "u" => (0, -6),
            "m" => (0, -3),
            "" => (0, 0),
            "k" => (0, 3),
            "M" => (0, 6),
            "G" => (0, 9),
            "T" => (0, 12),
            "P" => (0, 15),
            "E" => (0, 18),
            exponent => {
                let digits = exponent
                    .strip_prefix(['e', 'E'])
                    .filter(|d| !d.is_empty())
                    .ok_or_else(syntax)?;
                let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
                if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(syntax());
                }
                (0, digits.parse::<i32>().map_err(|_| range())?)
            }
        };
        // value = mantissa × 2^base2 × 10^(base10 - scale); in nano units: × 10^9. Checked: the
        // exponent and the fraction's length are the user's (`1.5e-2147483648`).
        let power = base10
            .checked_sub(scale)
            .and_then(|p| p.checked_add(9))
            .ok_or_else(range)?;
        let mut value = mantissa
            .checked_mul(1i128.checked_shl(base2).ok_or_else(range)?)
            .ok_or_else(range)?;
        if power >= 0 {
            let factor = 10i128.checked_pow(power.unsigned_abs()).ok_or_else(range)?;
            value = value.checked_mul(factor).ok_or_else(range)?;
        } else {
            let divisor = 10i128.checked_pow(power.unsigned_abs()).ok_or_else(range)?;
            value = value.div_euclid(divisor) + i128::from(value.rem_euclid(divisor) != 0);
        }
        Ok(Self {
            nanos: if negative { -value } else { value },
        })
    }

    /// Whether the amount is below zero.
    pub fn is_negative(self) -> bool {
        self.nanos < 0
    }

    /// Whether the amount is a whole number (of bytes, for a size): `1m` is a thousandth.
    pub fn is_whole(self) -> bool {
        self.nanos % 1_000_000_000 == 0
    }

    /// The amount as a float (of bytes, for a size), for comparing with values measured in
    /// other units.
    pub fn to_f64(self) -> f64 {
        self.nanos as f64 / 1e9
    }

    /// Whether the amount is zero.
    pub fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// The amount in whole units (bytes, for a size), rounded up; `None` below zero.
    pub fn whole_units_up(self) -> Option<u128> {
        let nanos = u128::try_from(self.nanos).ok()?;
        Some(nanos.div_ceil(1_000_000_000))
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whole = self.nanos / 1_000_000_000;
        let fraction = (self.nanos % 1_000_000_000).unsigned_abs();
        if fraction == 0 {
            write!(f, "{whole}")
        } else {
            let digits = format!("{fraction:09}");
            write!(f, "{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::*;

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn binary_and_decimal_suffixes_compare_by_amount() {
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1k"), q("1000"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("1E-3"), q("1m"));
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q(".5Gi"), q("512Mi"));
        assert_eq!(q("2."), q("2"));
        assert_eq!(q("+3"), q("3"));
        assert!(q("1G") < q("1Gi"));
        assert!(q("100m") < q("1"));
        assert!(q("1n") < q("1u"));
        assert!(q("10Gi") > q("9999Mi"));
        assert_eq!(q("512Mi").cmp(&q("0.5Gi")), Ordering::Equal);
    }

    #[test]
    fn whole_units_round_up_and_refuse_negatives() {
        assert_eq!(q("1500m").whole_units_up(), Some(2));
        assert_eq!(q("1.5Gi").whole_units_up(), Some(3 << 29));
        assert_eq!(q("0").whole_units_up(), Some(0));
        assert_eq!(q("-1").whole_units_up(), None);
    }

    #[test]
    fn sub_nano_fractions_round_up() {
        assert_eq!(q("0.1n"), q("1n"));
        assert!(q("1.5n") > q("1n"));
    }

    #[test]
    fn signs_and_zero() {
        assert!(q("-1").is_negative());
        assert!(!q("1").is_negative());
        assert!(q("0Gi").is_zero());
        assert!(q("1Gi").is_whole() && q("1.5k").is_whole());
        assert!(!q("1m").is_whole() && !q("1.5").is_whole());
        assert_eq!(q("1500m").to_string(), "1.5");
        assert_eq!(q("2Ki").to_string(), "2048");
    }

    #[test]
    fn malformed_quantities_are_refused() {
        for bad in [
            "", "Gi", "10 Gi", "10GB", "1.2.3", "ten", "1e", "1e+", "1ee3", "10gi", "1Gi ", ".",
            "--1",
        ] {
            assert!(
                matches!(Quantity::parse(bad), Err(QuantityError::Syntax(_))),
                "{bad:?} parsed"
            );
        }
        assert!(matches!(
            Quantity::parse("99999999999999999999999999Ei"),
            Err(QuantityError::Range(_))
        ));
    }

    #[test]
    fn extreme_exponents_are_out_of_range_not_a_panic() {
        for extreme in [
            "1.5e-2147483648",
            "1e-2147483648",
            "1e2147483647",
            "1.5e2147483647",
            "-1.5e-2147483648",
        ] {
            assert_eq!(
                Quantity::parse(extreme),
                Err(QuantityError::Range(extreme.to_owned())),
                "{extreme:?}"
            );
        }
    }
}
