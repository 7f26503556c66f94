//! Delays, as pure functions: the visibility a transient failure gets for its receive count, and the
//! jittered wait after a failing SQS call. No clocks, no I/O: callers pass the random fraction in.

use std::time::Duration;

/// SQS refuses visibility timeouts above 12 hours.
pub const VISIBILITY_MAX: Duration = Duration::from_hours(12);

/// Visibility for a message that failed transiently on its `receive_count`-th receive:
/// `base * 2^(receive_count - 1)`, capped at `max`, capped again at 12 h.
pub fn retry_delay(base: Duration, max: Duration, receive_count: u32) -> Duration {
    let exponent = receive_count.saturating_sub(1).min(40);
    let factor = 1u64 << exponent;
    let raw = base
        .checked_mul(u32::try_from(factor).unwrap_or(u32::MAX))
        .unwrap_or(Duration::MAX);
    raw.min(max).min(VISIBILITY_MAX)
}

/// Whole seconds for ChangeMessageVisibility, rounded up so a delay is never shortened.
pub fn visibility_secs(d: Duration) -> i32 {
    let d = d.min(VISIBILITY_MAX);
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// Wait after the `attempt`-th consecutive failure of an SQS call (attempt starts at 1): "full jitter"
/// over an exponential ceiling from 200 ms to 20 s, so a fleet of workers does not retry in lockstep.
/// `unit` is a random number in [0, 1).
pub fn error_backoff(attempt: u32, unit: f64) -> Duration {
    let ceiling_ms = (200u64 << attempt.saturating_sub(1).min(10)).min(20_000);
    // At least a quarter of the ceiling, so a throttled worker really slows down.
    let ms = ceiling_ms as f64 * (0.25 + 0.75 * unit.clamp(0.0, 1.0));
    Duration::from_millis(ms as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn retry_delay_doubles_per_receive_and_is_capped() {
        let cases = [
            (S(5), S(900), 0, S(5)),
            (S(5), S(900), 1, S(5)),
            (S(5), S(900), 2, S(10)),
            (S(5), S(900), 3, S(20)),
            (S(5), S(900), 8, S(640)),
            (S(5), S(900), 9, S(900)),
            (S(5), S(900), 1000, S(900)),
            (S(0), S(900), 7, S(0)),
            (S(3600), S(48 * 3600), 5, VISIBILITY_MAX),
            (S(1), Duration::MAX, u32::MAX, VISIBILITY_MAX),
        ];
        for (base, max, count, want) in cases {
            assert_eq!(
                retry_delay(base, max, count),
                want,
                "{base:?} {max:?} {count}"
            );
        }
    }

    #[test]
    fn visibility_secs_rounds_up_and_caps() {
        assert_eq!(visibility_secs(Duration::from_millis(1500)), 2);
        assert_eq!(visibility_secs(Duration::ZERO), 0);
        assert_eq!(visibility_secs(Duration::from_secs(99_999)), 43_200);
    }

    #[test]
    fn error_backoff_grows_with_jitter_inside_bounds() {
        for attempt in 1..20 {
            let lo = error_backoff(attempt, 0.0);
            let hi = error_backoff(attempt, 0.999);
            assert!(lo <= hi);
            assert!(lo >= Duration::from_millis(50), "{attempt}: {lo:?}");
            assert!(hi <= Duration::from_secs(20), "{attempt}: {hi:?}");
        }
        assert!(error_backoff(1, 0.5) < error_backoff(5, 0.5));
        assert_eq!(error_backoff(30, 1.0), Duration::from_secs(20));
    }
}
