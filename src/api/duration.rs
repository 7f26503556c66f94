//! Duration strings of the API (`30s`, `5m`, `2h`, `1h30m`, `250ms`).
//! The accepted grammar is the integer subset of Go's, so CEL's `duration()` reads the same strings.

use std::fmt;
use std::str::FromStr;

/// Pattern published in the CRD for every duration field.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// A non-negative duration written as a string in manifests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(std::time::Duration);

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration: use a number and a unit, e.g. 30s, 5m, 2h")]
    Empty,
    #[error(
        "invalid duration {0:?}: use whole numbers with units ms, s, m or h, e.g. 30s, 5m, 1h30m"
    )]
    Invalid(String),
    #[error("duration {0:?} is too large")]
    Overflow(String),
}

impl Duration {
    pub const ZERO: Duration = Duration(std::time::Duration::ZERO);

    pub const fn from_secs(secs: u64) -> Self {
        Duration(std::time::Duration::from_secs(secs))
    }

    pub const fn from_millis(ms: u64) -> Self {
        Duration(std::time::Duration::from_millis(ms))
    }

    pub const fn from_std(d: std::time::Duration) -> Self {
        Duration(d)
    }

    pub const fn as_std(&self) -> std::time::Duration {
        self.0
    }

    pub fn as_secs_f64(&self) -> f64 {
        self.0.as_secs_f64()
    }

    pub fn as_millis(&self) -> u128 {
        self.0.as_millis()
    }

    /// Whole milliseconds, saturating at `u64::MAX` (a sum or product that saturated the duration
    /// stays the largest, never wraps to a small one).
    pub fn as_millis_u64(&self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }

    /// Whole seconds, rounded up (SQS takes integer seconds; rounding down would shorten a lease).
    pub fn as_secs_ceil(&self) -> u64 {
        let s = self.0.as_secs();
        if self.0.subsec_nanos() > 0 { s + 1 } else { s }
    }

    pub fn is_zero(&self) -> bool {
        self.0.is_zero()
    }

    pub fn saturating_mul(self, n: u32) -> Self {
        Duration(self.0.saturating_mul(n))
    }

    pub fn saturating_add(self, other: Duration) -> Self {
        Duration(self.0.saturating_add(other.0))
    }

    pub fn saturating_sub(self, other: Duration) -> Self {
        Duration(self.0.saturating_sub(other.0))
    }
}

impl From<std::time::Duration> for Duration {
    fn from(d: std::time::Duration) -> Self {
        Duration(d)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(DurationError::Empty);
        }
        let bytes = s.as_bytes();
        let mut total_ms: u128 = 0;
        let mut overflow = false;
        let mut i = 0;
        while i < bytes.len() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            if start == i {
                return Err(DurationError::Invalid(s.to_string()));
            }
            let digits = &s[start..i];
            let unit_start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            // The unit first: a long number with a unit the grammar lacks ("4000…0d") is invalid,
            // not too large (tests/fuzz.rs, `durations`).
            let factor: u128 = match &s[unit_start..i] {
                "ms" => 1,
                "s" => 1_000,
                "m" => 60_000,
                "h" => 3_600_000,
                _ => return Err(DurationError::Invalid(s.to_string())),
            };
            // Too large is said once the whole text is known to be a duration.
            let Ok(number) = digits.parse::<u128>() else {
                overflow = true;
                continue;
            };
            match number
                .checked_mul(factor)
                .and_then(|v| total_ms.checked_add(v))
            {
                Some(t) => total_ms = t,
                None => overflow = true,
            }
        }
        let ms = u64::try_from(total_ms)
            .ok()
            .filter(|_| !overflow)
            .ok_or_else(|| DurationError::Overflow(s.to_string()))?;
        Ok(Duration::from_millis(ms))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ms = self.0.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        let h = ms / 3_600_000;
        ms %= 3_600_000;
        let m = ms / 60_000;
        ms %= 60_000;
        let s = ms / 1_000;
        ms %= 1_000;
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if m > 0 {
            write!(f, "{m}m")?;
        }
        if s > 0 {
            write!(f, "{s}s")?;
        }
        if ms > 0 {
            write!(f, "{ms}ms")?;
        }
        Ok(())
    }
}

string_form!(Duration, {
    "type": "string",
    "pattern": DURATION_PATTERN,
    "maxLength": 32,
    "description": "A duration: whole numbers with units ms, s, m, h (e.g. 30s, 5m, 1h30m)."
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_saturate_instead_of_wrapping() {
        // A duration that saturated (p99 x rounds) is more milliseconds than u64 holds.
        let huge = Duration::from_secs(u64::MAX);
        assert_eq!(huge.as_millis_u64(), u64::MAX);
        assert_eq!(Duration::from_millis(1500).as_millis_u64(), 1500);
        // auto heartbeats at a third of the visibility timeout stay the largest, never a small wrap.
        assert_eq!(
            crate::api::HeartbeatInterval::Auto.resolve(huge),
            Duration::from_millis(u64::MAX / 3)
        );
    }

    #[test]
    fn parses_units_and_compounds() {
        let cases = [
            ("30s", 30_000),
            ("5m", 300_000),
            ("2h", 7_200_000),
            ("1h30m", 5_400_000),
            ("250ms", 250),
            ("0s", 0),
            ("1m30s500ms", 90_500),
        ];
        for (input, ms) in cases {
            assert_eq!(
                input.parse::<Duration>().unwrap(),
                Duration::from_millis(ms),
                "{input}"
            );
        }
    }

    #[test]
    fn rejects_bad_strings_with_guidance() {
        for bad in ["", "30", "s", "1.5s", "-1s", "10d", "5 m", "1h-3m", "abc"] {
            let err = bad.parse::<Duration>().unwrap_err();
            assert!(err.to_string().contains("duration"), "{bad}: {err}");
        }
        assert!(matches!(
            "99999999999999999999h".parse::<Duration>(),
            Err(DurationError::Overflow(_))
        ));
        // A number too long for any unit, with a unit the grammar lacks: the unit is what is wrong.
        assert!(matches!(
            "400000000000000000000000000000000000000d".parse::<Duration>(),
            Err(DurationError::Invalid(_))
        ));
        assert!(matches!(
            "341000000000000000000000000000000000000ms0d".parse::<Duration>(),
            Err(DurationError::Invalid(_))
        ));
    }

    #[test]
    fn display_round_trips() {
        for ms in [
            0u64, 1, 999, 1000, 59_999, 60_000, 3_600_000, 5_430_250, 43_200_000,
        ] {
            let d = Duration::from_millis(ms);
            assert_eq!(d.to_string().parse::<Duration>().unwrap(), d);
        }
        assert_eq!(Duration::from_secs(90).to_string(), "1m30s");
    }

    #[test]
    fn secs_ceil_rounds_up() {
        assert_eq!(Duration::from_millis(1500).as_secs_ceil(), 2);
        assert_eq!(Duration::from_secs(3).as_secs_ceil(), 3);
    }
}
