//! `scaling.scaleDownStabilization`: `auto` (the default) or a duration.
//!
//! `auto` holds an idle replica about as long as starting one again costs: the pods' measured start-up
//! (creation → Ready), the ski-rental break-even; [`DEFAULT_STARTUP`] until a start-up was measured.
//! A duration overrides it. See docs/scaling.md "The stabilization window".

use std::fmt;
use std::str::FromStr;

use super::Duration;

/// The hold `auto` uses until the consumer's pods' start-up has been measured.
pub const DEFAULT_STARTUP: Duration = Duration::from_secs(30);

/// What the CRD accepts: `auto` or a duration of [`super::DURATION_PATTERN`]'s grammar.
pub const STABILIZATION_PATTERN: &str = super::AUTO_OR_DURATION_PATTERN;

/// How long the scale-down rule looks back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Stabilization {
    /// The pods' measured start-up (30s until measured).
    #[default]
    Auto,
    /// A fixed window.
    Fixed(Duration),
}

/// Why a `scaleDownStabilization` string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StabilizationError {
    #[error(
        "invalid scaleDownStabilization {value:?}: use `auto` (hold about one measured pod start-up) or a duration such as 30s, 5m ({source})"
    )]
    Invalid {
        value: String,
        source: super::DurationError,
    },
}

impl Stabilization {
    /// The window in force: a fixed one as written; `auto` is the measured start-up (`startup`), or
    /// [`DEFAULT_STARTUP`] while none was measured.
    pub fn window(&self, startup: Option<Duration>) -> Duration {
        match self {
            Stabilization::Auto => startup.unwrap_or(DEFAULT_STARTUP),
            Stabilization::Fixed(d) => *d,
        }
    }

    pub fn is_auto(&self) -> bool {
        matches!(self, Stabilization::Auto)
    }
}

impl From<Duration> for Stabilization {
    fn from(d: Duration) -> Self {
        Stabilization::Fixed(d)
    }
}

impl FromStr for Stabilization {
    type Err = StabilizationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim() == "auto" {
            return Ok(Stabilization::Auto);
        }
        s.parse::<Duration>()
            .map(Stabilization::Fixed)
            .map_err(|source| StabilizationError::Invalid {
                value: s.to_string(),
                source,
            })
    }
}

impl fmt::Display for Stabilization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stabilization::Auto => f.write_str("auto"),
            Stabilization::Fixed(d) => d.fmt(f),
        }
    }
}

string_form!(Stabilization, {
    "type": "string",
    "maxLength": 32,
    "description": "`auto` (hold an idle replica about as long as one pod start-up, measured from the consumer's pods; 30s until measured) or a duration (e.g. 0s, 90s, 1.5m, 5m).",
    "x-kubernetes-validations": super::duration::duration_rule(STABILIZATION_PATTERN, "auto or a duration")
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_or_a_duration_round_trips() {
        for (text, value) in [
            ("auto", Stabilization::Auto),
            ("0s", Stabilization::Fixed(Duration::ZERO)),
            ("5m", Stabilization::Fixed(Duration::from_secs(300))),
            ("1m30s", Stabilization::Fixed(Duration::from_secs(90))),
        ] {
            assert_eq!(text.parse::<Stabilization>().unwrap(), value, "{text}");
            assert_eq!(value.to_string(), text);
            let json = serde_json::to_value(value).unwrap();
            assert_eq!(json, serde_json::json!(text));
            assert_eq!(
                serde_json::from_value::<Stabilization>(json).unwrap(),
                value
            );
        }
    }

    #[test]
    fn a_bad_value_names_both_forms() {
        for bad in ["", "Auto", "automatic", "5 minutes", "-1s"] {
            let e = bad.parse::<Stabilization>().unwrap_err().to_string();
            assert!(
                e.contains("use `auto`") && e.contains("30s, 5m"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn auto_is_the_measured_start_up_or_30s() {
        let fixed = Stabilization::Fixed(Duration::from_secs(10));
        assert_eq!(
            fixed.window(Some(Duration::from_secs(45))),
            Duration::from_secs(10)
        );
        assert_eq!(Stabilization::Auto.window(None), Duration::from_secs(30));
        assert_eq!(
            Stabilization::Auto.window(Some(Duration::from_secs(45))),
            Duration::from_secs(45)
        );
    }
}
