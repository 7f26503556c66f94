//! Delays, as pure functions: the visibility a transient failure gets for its receive count, and the
//! jittered wait after a failing SQS call. No clocks, no I/O: callers pass the random fraction in.

use std::time::Duration;

/// SQS refuses visibility timeouts above 12 hours.
pub const VISIBILITY_MAX: Duration = Duration::from_hours(12);

/// Kept clear of SQS's 12 hours of visibility since the receive: the receive's own latency and the
/// rounding up to whole seconds.
pub const TWELVE_HOURS_SLACK: Duration = Duration::from_mins(1);

/// What is left of a visibility change `wanted`, made `since_receipt` after the receive: SQS refuses
/// a change that would end more than 12 hours after the receive (it does not shorten it, and the
/// message then reappears only when its current visibility ends), so `wanted` is cut to what is
/// left, with `TWELVE_HOURS_SLACK` to spare.
pub fn within_twelve_hours(wanted: Duration, since_receipt: Duration) -> Duration {
    wanted.min(
        VISIBILITY_MAX
            .saturating_sub(since_receipt)
            .saturating_sub(TWELVE_HOURS_SLACK),
    )
}

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
    fn a_visibility_change_ends_within_twelve_hours_of_the_receive() {
        let h = Duration::from_hours;
        // Early on, the change is made as asked.
        assert_eq!(within_twelve_hours(S(900), S(10)), S(900));
        assert_eq!(within_twelve_hours(h(11), h(0)), h(11));
        // Late, cut to what is left, a minute to spare: 11 h 50 m in, 10 m left, 9 m granted.
        let late = h(11) + Duration::from_mins(50);
        assert_eq!(within_twelve_hours(S(900), late), S(540));
        assert!(late + within_twelve_hours(h(12), late) + TWELVE_HOURS_SLACK <= VISIBILITY_MAX);
        // Nothing left: visible again at once, never a change SQS refuses.
        assert_eq!(
            within_twelve_hours(S(900), S(12 * 3600 - 30)),
            Duration::ZERO
        );
        assert_eq!(within_twelve_hours(S(900), h(13)), Duration::ZERO);
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
