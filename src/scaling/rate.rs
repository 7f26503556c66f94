//! `processing.maxRate` in the pure core: each pod's share of the rate, how it is written for the
//! worker, and the most replicas the rate can keep busy.

use crate::api::Duration;

/// The pod annotation the controller writes each worker pod's share into; the worker reads it
/// through a downward-API file (`render`'s rate volume).
pub const SHARE_ANNOTATION: &str = "sqs.consumers.dev/rate-share";

/// One pod's share: maxRate / replicas (replicas 0 counts as 1).
pub fn share(max_rate: u32, replicas: u32) -> f64 {
    f64::from(max_rate) / f64::from(replicas.max(1))
}

/// How many pods split the rate: the most of the replicas asked for before and after this
/// decision and the pods that still run (a rollout's surge, a scale-down's pods still draining), so
/// the shares of the pods that may start messages add up to maxRate at most. At least 1.
pub fn share_count(current: u32, target: u32, running_pods: usize) -> u32 {
    current
        .max(target)
        .max(u32::try_from(running_pods).unwrap_or(u32::MAX))
        .max(1)
}

/// A share as the worker reads it: messages per second rounded down to the thousandth (so the
/// shares never add up to more than maxRate), at least 0.001.
pub fn share_text(share: f64) -> String {
    let milli = (share * 1000.0).floor().max(1.0) as u64;
    let (whole, frac) = (milli / 1000, milli % 1000);
    if frac == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{frac:03}")
            .trim_end_matches('0')
            .to_string()
    }
}

/// The most replicas maxRate keeps busy: ceil(maxRate × per-message time / message slots), at
/// least 1. One replica starts at most `slots` / `per_message` messages a second (concurrency over
/// the declared mean, else P99: a slower estimate only allows more replicas), so replicas beyond
/// this would wait for their share and drain nothing more.
pub fn replica_cap(max_rate: u32, slots: u32, per_message: Duration) -> u32 {
    let ms = u128::from(per_message.as_millis_u64().max(1));
    let need = u128::from(max_rate).saturating_mul(ms);
    let per = u128::from(slots.max(1)).saturating_mul(1000);
    u32::try_from(need.div_ceil(per)).unwrap_or(u32::MAX).max(1)
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // exact values
mod tests {
    use super::*;

    #[test]
    fn shares_split_the_rate_and_never_add_up_to_more() {
        assert_eq!(share(20, 1), 20.0);
        assert_eq!(share(20, 0), 20.0);
        assert_eq!(share_text(share(20, 3)), "6.666");
        assert_eq!(share_text(share(20, 1)), "20");
        assert_eq!(share_text(share(1, 4)), "0.25");
        assert_eq!(share_text(share(1, 1_000_000)), "0.001");
        for (rate, n) in [(20u32, 3u32), (7, 6), (1_000_000, 7), (1, 3)] {
            let each: f64 = share_text(share(rate, n)).parse().expect("a number");
            assert!(
                each * f64::from(n) <= f64::from(rate) + 1e-9,
                "{rate} over {n}"
            );
        }
    }

    #[test]
    fn the_count_is_the_most_pods_that_may_start_messages() {
        // Scale-up from 1 to 3: the old pod goes down to a third at once.
        assert_eq!(share_count(1, 3, 1), 3);
        // Scale-down from 3 to 1 while two pods still drain: the remaining pod waits for them.
        assert_eq!(share_count(3, 1, 3), 3);
        assert_eq!(share_count(1, 1, 1), 1);
        // A rollout's surge pod counts.
        assert_eq!(share_count(4, 4, 5), 5);
        assert_eq!(share_count(0, 0, 0), 1);
    }

    #[test]
    fn the_cap_is_the_replicas_the_rate_keeps_busy() {
        // 10 slots at 500ms: 20 messages a second a replica.
        assert_eq!(replica_cap(20, 10, Duration::from_millis(500)), 1);
        assert_eq!(replica_cap(21, 10, Duration::from_millis(500)), 2);
        assert_eq!(replica_cap(200, 10, Duration::from_secs(2)), 40);
        // Never 0: one replica for the slowest rate.
        assert_eq!(replica_cap(1, 10_000, Duration::from_millis(1)), 1);
    }
}
