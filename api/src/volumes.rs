//! Volume sizes and auto-grow: quantities read as bytes, and the pure decision of whether a pool
//! pod's claim grows, by how much, or is at its ceiling. The resource-handler acts on it; the
//! webhook checks the same parsing.

use crate::quantity::Quantity;
use crate::v1alpha1::{VolumeAutoGrow, VolumeUsage};

/// What PostgreSQL holds on a pool pod's data volume, in bytes, as one line of two
/// space-separated fields: the data directory's two tablespaces (every database, and the shared
/// catalogs) and the WAL directory. Runs on a replica too; needs the superuser (or
/// `pg_monitor` and `pg_read_all_stats`).
pub const USAGE_SQL: &str = "SELECT (pg_tablespace_size('pg_default') + \
                             pg_tablespace_size('pg_global'))::text || ' ' || \
                             (SELECT coalesce(sum(size), 0) FROM pg_ls_waldir())::text";

/// Default `autoGrow.threshold`: percent of a claim's capacity.
pub const DEFAULT_THRESHOLD: u32 = 80;
/// Default `autoGrow.step`.
pub const DEFAULT_STEP: &str = "50%";
/// Largest percent step: a claim grows at most eleven-fold at once.
pub const MAX_STEP_PERCENT: u32 = 1000;

/// Bytes in a Kubernetes quantity such as `10Gi`, `1.5G` or `1e9`, rounded up; `None` if the
/// text is not a quantity or is below zero.
pub fn parse_bytes(text: &str) -> Option<u128> {
    Quantity::parse(text).ok()?.whole_units_up()
}

/// `bytes` as a quantity: whole MiB (rounded up) when it is at least 1 MiB, e.g. `1536Mi`.
pub fn quantity(bytes: u128) -> String {
    const MIB: u128 = 1 << 20;
    if bytes < MIB {
        return bytes.to_string();
    }
    format!("{}Mi", bytes.div_ceil(MIB))
}

/// How much a claim grows each time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A fixed amount.
    Bytes(u128),
    /// A percent of the claim's current request.
    Percent(u32),
}

impl Step {
    /// Reads `autoGrow.step`; the error says what is allowed.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(percent) = text.strip_suffix('%') {
            return match percent.parse::<u32>() {
                Ok(p) if (1..=MAX_STEP_PERCENT).contains(&p) => Ok(Step::Percent(p)),
                _ => Err(format!(
                    "{text:?} must be a percent from 1% to {MAX_STEP_PERCENT}%, or a size such \
                     as 2Gi"
                )),
            };
        }
        match parse_bytes(text) {
            Some(0) => Err(format!("{text:?} must be positive, such as 2Gi or 50%")),
            Some(bytes) => Ok(Step::Bytes(bytes)),
            None => Err(format!(
                "{text:?} is not a size such as 2Gi or a percent such as 50%"
            )),
        }
    }

    /// What a claim of `requested` bytes grows by (at least one byte).
    fn of(self, requested: u128) -> u128 {
        match self {
            Step::Bytes(bytes) => bytes,
            Step::Percent(p) => (requested * u128::from(p)).div_ceil(100),
        }
        .max(1)
    }
}

/// A pool's `autoGrow`, read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoGrow {
    /// Percent of capacity past which a claim grows.
    pub threshold: u32,
    /// How much it grows.
    pub step: Step,
    /// Bytes it never grows past.
    pub ceiling: u128,
}

impl AutoGrow {
    /// Reads `spec`; the error names the field and what is allowed.
    pub fn of(spec: &VolumeAutoGrow) -> Result<Self, (&'static str, String)> {
        let threshold = match spec.threshold {
            None => DEFAULT_THRESHOLD,
            Some(t) => u32::try_from(t)
                .ok()
                .filter(|t| (50..=95).contains(t))
                .ok_or(("threshold", format!("{t} must be a percent from 50 to 95")))?,
        };
        let step = Step::parse(spec.step.as_deref().unwrap_or(DEFAULT_STEP))
            .map_err(|why| ("step", why))?;
        let ceiling = parse_bytes(&spec.ceiling).filter(|c| *c > 0).ok_or((
            "ceiling",
            format!("{:?} must be a size such as 100Gi", spec.ceiling),
        ))?;
        Ok(Self {
            threshold,
            step,
            ceiling,
        })
    }
}

/// What auto-grow does with one claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth {
    /// Below the threshold, or not measured or bound yet: nothing.
    Room,
    /// A larger size was requested and storage has not given it yet: nothing more until it has.
    Expanding,
    /// Past the threshold: request this many bytes.
    Grow(u128),
    /// Past the threshold at the ceiling: nothing can be done here.
    AtCeiling,
}

/// Whether a claim requesting `requested` bytes, whose storage gave `capacity` (bytes, once
/// bound), grows given the pod's measured `usage`.
pub fn decide(
    auto: &AutoGrow,
    requested: u128,
    capacity: Option<u128>,
    usage: Option<u128>,
) -> Growth {
    let (Some(capacity), Some(used)) = (capacity, usage) else {
        return Growth::Room;
    };
    if capacity < requested {
        return Growth::Expanding;
    }
    if used * 100 < capacity * u128::from(auto.threshold) {
        return Growth::Room;
    }
    if requested >= auto.ceiling {
        return Growth::AtCeiling;
    }
    Growth::Grow((requested + auto.step.of(requested)).min(auto.ceiling))
}

/// The usage `volumes` publish for `pod`: data and WAL bytes.
pub fn used_by(volumes: &[VolumeUsage], pod: &str) -> Option<u128> {
    volumes
        .iter()
        .find(|v| v.pod == pod)
        .and_then(|v| u128::try_from(v.used_bytes()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u128 = 1 << 20;
    const GIB: u128 = 1 << 30;

    #[test]
    fn quantities_parse_to_bytes() {
        assert_eq!(parse_bytes("1Gi"), Some(GIB));
        assert_eq!(parse_bytes("1024Mi"), parse_bytes("1Gi"));
        assert_eq!(parse_bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_bytes("10G"), Some(10_000_000_000));
        assert_eq!(parse_bytes("1e3"), Some(1000));
        assert_eq!(parse_bytes("1500m"), Some(2));
        assert_eq!(parse_bytes("12345"), Some(12345));
        assert_eq!(parse_bytes("Gi"), None);
        assert_eq!(parse_bytes("1Qi"), None);
        assert_eq!(quantity(1536 * MIB), "1536Mi");
        assert_eq!(quantity(MIB + 1), "2Mi");
        assert_eq!(quantity(512), "512");
    }

    #[test]
    fn steps_are_positive_sizes_or_percents() {
        assert_eq!(Step::parse("50%"), Ok(Step::Percent(50)));
        assert_eq!(Step::parse("2Gi"), Ok(Step::Bytes(2 * GIB)));
        for bad in ["0%", "0", "0Gi", "1001%", "-1Gi", "lots", "5.5%"] {
            assert!(Step::parse(bad).is_err(), "{bad}");
        }
        assert!(Step::parse("0Gi").unwrap_err().contains("must be positive"));
    }

    fn auto(step: Step, ceiling: u128) -> AutoGrow {
        AutoGrow {
            threshold: 80,
            step,
            ceiling,
        }
    }

    #[test]
    fn a_claim_past_its_threshold_grows_by_the_step_never_past_the_ceiling() {
        let half = auto(Step::Percent(50), 3 * GIB);
        // Below 80 %: nothing; not measured or not bound: nothing.
        assert_eq!(
            decide(&half, GIB, Some(GIB), Some(GIB * 79 / 100)),
            Growth::Room
        );
        assert_eq!(decide(&half, GIB, None, Some(GIB)), Growth::Room);
        assert_eq!(decide(&half, GIB, Some(GIB), None), Growth::Room);
        // At 80 %: +50 %.
        assert_eq!(
            decide(&half, GIB, Some(GIB), Some(GIB * 8 / 10 + 1)),
            Growth::Grow(GIB * 3 / 2)
        );
        // Requested, not given yet: wait, whatever the usage.
        assert_eq!(
            decide(&half, GIB * 3 / 2, Some(GIB), Some(GIB)),
            Growth::Expanding
        );
        // The step is cut at the ceiling, then the ceiling holds.
        assert_eq!(
            decide(&half, 2560 * MIB, Some(2560 * MIB), Some(2500 * MIB)),
            Growth::Grow(3 * GIB)
        );
        assert_eq!(
            decide(&half, 3 * GIB, Some(3 * GIB), Some(3 * GIB - 1)),
            Growth::AtCeiling
        );
        let fixed = auto(Step::Bytes(256 * MIB), 2 * GIB);
        assert_eq!(
            decide(&fixed, GIB, Some(GIB), Some(GIB)),
            Growth::Grow(GIB + 256 * MIB)
        );
        // Storage that gave more than asked: the threshold is of what it gave.
        assert_eq!(decide(&fixed, GIB, Some(2 * GIB), Some(GIB)), Growth::Room);
    }

    #[test]
    fn the_spec_is_read_with_defaults_and_each_error_names_its_field() {
        let spec = VolumeAutoGrow {
            ceiling: "10Gi".into(),
            ..Default::default()
        };
        assert_eq!(
            AutoGrow::of(&spec),
            Ok(AutoGrow {
                threshold: 80,
                step: Step::Percent(50),
                ceiling: 10 * GIB
            })
        );
        let bad_step = VolumeAutoGrow {
            step: Some("0Mi".into()),
            ..spec.clone()
        };
        assert_eq!(AutoGrow::of(&bad_step).unwrap_err().0, "step");
        let bad_ceiling = VolumeAutoGrow {
            ceiling: "0".into(),
            ..spec.clone()
        };
        assert_eq!(AutoGrow::of(&bad_ceiling).unwrap_err().0, "ceiling");
        let bad_threshold = VolumeAutoGrow {
            threshold: Some(99),
            ..spec
        };
        assert_eq!(AutoGrow::of(&bad_threshold).unwrap_err().0, "threshold");
    }
}
