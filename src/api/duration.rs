//! Duration strings of the API (`30s`, `1.5s`, `5m`, `2h`, `1h30m`, `250ms`).
//! The accepted grammar is a subset of Go's, so CEL's `duration()` reads the same strings to the same value.
//!
//! A duration is one or more terms, each a whole number or a decimal and a unit: `ms`, `s`, `m` or `h`
//! (`90s`, `1m30s`, `1.5s`, `0.5h`, `500ms`). Durations are counted in whole milliseconds, and the
//! grammar keeps every value whole: a decimal has digits on both sides of the point and at most three
//! after it, on `s`, `m` or `h` only (`1.5s`, `0.25h`, `2.125m`), never on `ms`. So nothing is rounded:
//! `1.5ms` or `1.0005s` is refused rather than read as `2ms` or `1s` (CEL would compare it unrounded
//! and disagree with the worker). The decimal digits are read as integers, never as a float.

use std::fmt;
use std::str::FromStr;

/// The terms of a duration, as a regular expression (RE2 and Rust's `regex` read it alike).
macro_rules! duration_terms {
    () => {
        r"([0-9]+(\.[0-9]{1,3})?(h|m|s)|[0-9]+ms)+"
    };
}

/// What a duration field accepts, whole: the CRD checks it with [`duration_rule`].
pub const DURATION_PATTERN: &str = concat!("^", duration_terms!(), "$");

/// What a field that is `auto` or a duration accepts (`heartbeat.interval`, `scaleDownStabilization`).
pub const AUTO_OR_DURATION_PATTERN: &str = concat!("^(auto|", duration_terms!(), ")$");

/// The CRD's `x-kubernetes-validations` for a string field that must match `pattern` (a duration, or
/// `auto` or one): a CEL rule rather than an OpenAPI `pattern`, because the API server words a
/// pattern's refusal as the raw regular expression; this one says the value, the units and examples
/// (the API server puts the field's path before it). `what` completes "is not …", e.g. "a duration".
pub(crate) fn duration_rule(pattern: &str, what: &str) -> serde_json::Value {
    let example = "write a number and a unit (ms, s, m or h), e.g. 30s, 1.5s, 1m30s, 500ms";
    serde_json::json!([{
        "rule": format!("self.matches('{}')", pattern.replace('\\', "\\\\")),
        "messageExpression": format!("'\"' + self + '\" is not {what}: {example}'"),
        "message": format!("must be {what}: {example}"),
        "reason": "FieldValueInvalid"
    }])
}

/// A CEL rule of an object that compares its duration `fields` (`duration(self.p99) <= …`), evaluated
/// only when each of them is a duration: one that is not is refused by its own field's rule, naming the
/// value; `duration()` of it would add a type-conversion error in this rule's name, a second refusal
/// that blames the comparison.
pub(crate) fn when_durations(fields: &[&str], rule: &str) -> String {
    let pattern = DURATION_PATTERN.replace('\\', "\\\\");
    let mut out = String::new();
    for f in fields {
        out.push_str(&format!("!self.{f}.matches('{pattern}') || "));
    }
    out.push('(');
    out.push_str(rule);
    out.push(')');
    out
}

/// Most decimal places a term takes (whole milliseconds on `s`, `m` and `h`).
const MAX_DECIMALS: usize = 3;

/// A non-negative duration written as a string in manifests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(std::time::Duration);

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error(
        "empty duration: write a number and a unit (ms, s, m or h), e.g. 30s, 1.5s, 1m30s, 500ms"
    )]
    Empty,
    #[error(
        "invalid duration {0:?}: write a number and a unit (ms, s, m or h), e.g. 30s, 1.5s, 1m30s, 500ms"
    )]
    Invalid(String),
    #[error(
        "invalid duration {0:?}: durations count whole milliseconds, so a decimal takes at most 3 places and only on s, m or h, e.g. 1.5s, 0.25h, 1500ms"
    )]
    TooPrecise(String),
    #[error("duration {0:?} is too large: e.g. 30s, 5m, 12h")]
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
        let invalid = || DurationError::Invalid(s.to_string());
        let bytes = s.as_bytes();
        let digits_from = |mut i: usize| {
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            i
        };
        let mut total_ms: u128 = 0;
        let mut overflow = false;
        let mut too_precise = false;
        let mut i = 0;
        while i < bytes.len() {
            let start = i;
            i = digits_from(i);
            if start == i {
                return Err(invalid());
            }
            let whole = &s[start..i];
            // A decimal has digits on both sides of its point (`1.5s`; not `1.s`, `.5s`).
            let fraction = if bytes.get(i) == Some(&b'.') {
                let from = i + 1;
                i = digits_from(from);
                if i == from {
                    return Err(invalid());
                }
                Some(&s[from..i])
            } else {
                None
            };
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
                _ => return Err(invalid()),
            };
            // Finer than a millisecond is said once the whole text is known to be a duration's.
            let fraction_ms = match fraction {
                None => 0,
                Some(f) if factor == 1 || f.len() > MAX_DECIMALS => {
                    too_precise = true;
                    continue;
                }
                // At most three digits, and the factor a multiple of 1000: a whole number of ms.
                Some(f) => {
                    let scale = 10u128.pow(f.len() as u32);
                    f.parse::<u128>().map_or(0, |n| n * factor / scale)
                }
            };
            // Too large is said once the whole text is known to be a duration.
            let Ok(number) = whole.parse::<u128>() else {
                overflow = true;
                continue;
            };
            match number
                .checked_mul(factor)
                .and_then(|v| v.checked_add(fraction_ms))
                .and_then(|v| total_ms.checked_add(v))
            {
                Some(t) => total_ms = t,
                None => overflow = true,
            }
        }
        if too_precise {
            return Err(DurationError::TooPrecise(s.to_string()));
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
    "maxLength": 32,
    "description": "A duration: a number and a unit (ms, s, m or h), or several (e.g. 30s, 1.5s, 1m30s, 500ms); s, m and h take up to 3 decimals.",
    "x-kubernetes-validations": duration_rule(DURATION_PATTERN, "a duration")
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

    /// What users write, each read to the exact millisecond (decimals as integers, never floats).
    #[test]
    fn parses_units_compounds_and_decimals() {
        let cases = [
            ("30s", 30_000),
            ("90s", 90_000),
            ("5m", 300_000),
            ("2h", 7_200_000),
            ("1h30m", 5_400_000),
            ("1m30s", 90_000),
            ("250ms", 250),
            ("500ms", 500),
            ("0s", 0),
            ("0ms", 0),
            ("1m30s500ms", 90_500),
            ("1.5s", 1_500),
            ("0.5s", 500),
            ("0.001s", 1),
            ("0.1s", 100),
            ("0.3s", 300),
            ("2.125s", 2_125),
            ("1.50s", 1_500),
            ("1.500s", 1_500),
            ("00.5s", 500),
            ("1.0s", 1_000),
            ("0.0s", 0),
            ("1.5m", 90_000),
            ("0.001m", 60),
            ("2.125m", 127_500),
            ("0.5h", 1_800_000),
            ("0.25h", 900_000),
            ("0.001h", 3_600),
            ("1.5h30m", 7_200_000),
            ("1h0.5m1.5s", 3_631_500),
            ("1.5s1.5s", 3_000),
            (" 1.5s\t", 1_500),
        ];
        for (input, ms) in cases {
            assert_eq!(
                input.parse::<Duration>(),
                Ok(Duration::from_millis(ms)),
                "{input}"
            );
            assert!(pattern().is_match(input.trim()), "the CRD refuses {input}");
        }
    }

    fn pattern() -> regex::Regex {
        regex::Regex::new(DURATION_PATTERN).unwrap()
    }

    /// Each refusal quotes the text and gives examples, and the CRD's pattern refuses it too.
    #[test]
    fn refuses_what_is_not_a_duration_with_the_value_and_an_example() {
        for bad in [
            "30", "1.5", "s", "ms", "1.s", ".5s", "1,5s", "-1s", "+1s", "1.5.5s", "1..5s", "1.5x",
            "10d", "1us", "1ns", "5 m", "1h 30m", "1h-3m", "abc", "1e3s", "1_000ms", "0x10s",
            "1.5S", "1H", "1s.", "٣s",
        ] {
            let err = bad.parse::<Duration>().unwrap_err();
            assert_eq!(err, DurationError::Invalid(bad.to_string()), "{bad}");
            let m = err.to_string();
            assert!(
                m.contains(&format!("{bad:?}")) && m.contains("e.g. 30s, 1.5s, 1m30s, 500ms"),
                "{bad}: {m}"
            );
            assert!(!pattern().is_match(bad), "the CRD accepts {bad}");
        }
        for blank in ["", "  "] {
            let m = blank.parse::<Duration>().unwrap_err().to_string();
            assert!(m.contains("e.g. 30s, 1.5s"), "{m}");
        }
    }

    /// Finer than a millisecond is refused, not rounded: CEL compares the exact value, the worker
    /// would hold a rounded one, and the two would disagree at the edge (p99 against timeout).
    #[test]
    fn refuses_sub_millisecond_decimals_rather_than_rounding() {
        for bad in [
            "1.5ms", "0.5ms", "1.0ms", "1.0005s", "0.0001s", "1.5000s", "0.0001h", "1s1.5ms",
        ] {
            let err = bad.parse::<Duration>().unwrap_err();
            assert_eq!(err, DurationError::TooPrecise(bad.to_string()), "{bad}");
            let m = err.to_string();
            assert!(
                m.contains(&format!("{bad:?}")) && m.contains("e.g. 1.5s"),
                "{bad}: {m}"
            );
            assert!(!pattern().is_match(bad), "the CRD accepts {bad}");
        }
    }

    #[test]
    fn too_large_is_named_and_the_crd_leaves_it_to_the_parser() {
        for big in [
            "99999999999999999999h",
            "5124095576030.5h",
            "18446744073709551.616s",
            "18446744073709551616ms",
            "18446744073709551615ms1ms",
            "9999999999999999999999999999999999999999999.5s",
        ] {
            let err = big.parse::<Duration>().unwrap_err();
            assert_eq!(err, DurationError::Overflow(big.to_string()), "{big}");
            assert!(err.to_string().contains("e.g."), "{err}");
            assert!(pattern().is_match(big), "{big}");
        }
        // The largest that fits, with a decimal.
        assert_eq!(
            "18446744073709551.615s".parse::<Duration>(),
            Ok(Duration::from_millis(u64::MAX))
        );
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

    /// The rule the CRD carries: the pattern escaped for a CEL string, and a message that quotes
    /// the value and gives examples.
    #[test]
    fn the_crds_rule_quotes_the_value_and_gives_examples() {
        let rule = duration_rule(DURATION_PATTERN, "a duration");
        assert_eq!(
            rule[0]["rule"],
            r"self.matches('^([0-9]+(\\.[0-9]{1,3})?(h|m|s)|[0-9]+ms)+$')"
        );
        assert_eq!(
            rule[0]["messageExpression"],
            r#"'"' + self + '" is not a duration: write a number and a unit (ms, s, m or h), e.g. 30s, 1.5s, 1m30s, 500ms'"#
        );
        assert_eq!(rule[0]["reason"], "FieldValueInvalid");
        assert_eq!(
            when_durations(
                &["p99", "timeout"],
                "duration(self.p99) <= duration(self.timeout)"
            ),
            r"!self.p99.matches('^([0-9]+(\\.[0-9]{1,3})?(h|m|s)|[0-9]+ms)+$') || !self.timeout.matches('^([0-9]+(\\.[0-9]{1,3})?(h|m|s)|[0-9]+ms)+$') || (duration(self.p99) <= duration(self.timeout))"
        );
        let auto = regex::Regex::new(AUTO_OR_DURATION_PATTERN).unwrap();
        for (text, ok) in [
            ("auto", true),
            ("1.5s", true),
            ("autos", false),
            ("1.5", false),
        ] {
            assert_eq!(auto.is_match(text), ok, "{text}");
        }
    }

    #[test]
    fn display_round_trips() {
        for ms in [
            0u64,
            1,
            999,
            1000,
            59_999,
            60_000,
            3_600_000,
            5_430_250,
            43_200_000,
            u64::MAX,
        ] {
            let d = Duration::from_millis(ms);
            assert_eq!(d.to_string().parse::<Duration>().unwrap(), d);
        }
        assert_eq!(Duration::from_secs(90).to_string(), "1m30s");
        // A decimal prints in whole units (one canonical form), which reads back to the same value.
        for (written, printed) in [
            ("1.5s", "1s500ms"),
            ("1.5m", "1m30s"),
            ("0.5h", "30m"),
            ("0.001s", "1ms"),
            ("2.125m", "2m7s500ms"),
        ] {
            let d: Duration = written.parse().unwrap();
            assert_eq!(d.to_string(), printed, "{written}");
            assert_eq!(printed.parse::<Duration>(), Ok(d), "{written}");
        }
    }

    #[test]
    fn secs_ceil_rounds_up() {
        assert_eq!(Duration::from_millis(1500).as_secs_ceil(), 2);
        assert_eq!(Duration::from_secs(3).as_secs_ceil(), 3);
    }
}
