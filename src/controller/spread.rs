//! Spreading QueueConsumers over their poll interval. Each one has a stable slot in the interval (a
//! hash of its uid), and every requeue lands on that slot, so a thousand QueueConsumers created or
//! restarted together do not all read their queues in the same second ever after. Pure.

use std::time::Duration;

use crate::scaling::Timestamp;

/// FNV-1a: stable across releases and platforms (std's hasher is not promised to be).
fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where in each interval of `interval` the QueueConsumer with `uid` is due, as an offset.
pub fn phase(uid: &str, interval: Duration) -> Duration {
    let ms = u64::try_from(interval.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    Duration::from_millis(fnv1a(uid) % ms)
}

/// How long until the next slot of `uid` from `now_ms` (milliseconds since the epoch), in
/// (0, interval]: on its slot, exactly one interval. A reconcile off its slot (the first one, a
/// watch event's, the one after an error) is followed by the slot's own, so no QueueConsumer goes
/// longer than one interval without a reconcile; the slot's one then costs no AWS call, as the
/// queue's facts of this interval are reused (`same_interval`).
pub fn next_poll(uid: &str, interval: Duration, now_ms: u64) -> Duration {
    let ms = u64::try_from(interval.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let phase = fnv1a(uid) % ms;
    // Milliseconds from now to the next instant t with t ≡ phase (mod interval), in (0, interval].
    let into = (now_ms % ms + ms - phase) % ms;
    Duration::from_millis(ms - into)
}

/// How long after a reconcile that started at `started_ms` and ended at `now_ms` the next one comes: the
/// slot after its start, less the time it took, so a slot that passed while it ran is due at once (it
/// reuses this interval's queue facts: no AWS call). Only when it took less than an interval: a
/// controller whose reconciles take longer (overloaded) goes on to the next slot from now instead of
/// reconciling back to back. Never zero.
pub fn after_reconcile(uid: &str, interval: Duration, started_ms: u64, now_ms: u64) -> Duration {
    let took = Duration::from_millis(now_ms.saturating_sub(started_ms));
    if took < interval {
        next_poll(uid, interval, started_ms)
            .saturating_sub(took)
            .max(Duration::from_millis(1))
    } else {
        next_poll(uid, interval, now_ms)
    }
}

/// Whether two instants fall in the same poll interval counted from the Unix epoch: what is read once
/// per interval (a queue's facts) is read again in the next one. A clock that went back counts as
/// another interval.
pub fn same_interval(read: Timestamp, now: Timestamp, interval: Duration) -> bool {
    let ms = u64::try_from(interval.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    read.as_millis() / ms == now.as_millis() / ms && now.as_millis() >= read.as_millis()
}

/// How much earlier than a full interval a per-interval read counts as due again. Reconciles come
/// back on their slot a little earlier or later than an interval after the last read (the reconcile's
/// own duration, timer granularity): within a tenth of the interval (at most 2 s) the read is due, so
/// that each interval reads once instead of every other interval.
pub fn slack(interval: Duration) -> Duration {
    (interval / 10).min(Duration::from_secs(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Duration = Duration::from_secs(15);

    #[test]
    fn after_a_reconcile_the_slot_counts_from_its_start_unless_it_took_an_interval() {
        let uid = "7d0c2f5e-uid";
        let start = 1_000_000;
        let slot = next_poll(uid, P, start);
        // Quick: the slot after the start, less the time taken.
        assert_eq!(
            after_reconcile(uid, P, start, start + 300),
            slot.saturating_sub(Duration::from_millis(300))
        );
        // The slot passed while it ran: due at once (never zero).
        let past = u64::try_from(slot.as_millis()).unwrap() + 50;
        assert_eq!(
            after_reconcile(uid, P, start, start + past),
            Duration::from_millis(1)
        );
        // It took an interval or more: the next slot from now, not back to back.
        let now = start + 15_000 + 200;
        assert_eq!(after_reconcile(uid, P, start, now), next_poll(uid, P, now));
        assert!(after_reconcile(uid, P, start, now) > Duration::ZERO);
        // A clock that went back counts as no time taken.
        assert_eq!(after_reconcile(uid, P, start, start - 10), slot);
    }

    #[test]
    fn on_its_slot_the_next_poll_is_one_interval_away() {
        let uid = "0d5e6a43-5b5e-4a57-9c8c-2f1f0e4f6c11";
        let slot =
            1_700_000_000_000 - 1_700_000_000_000 % 15_000 + phase(uid, P).as_millis() as u64;
        assert_eq!(next_poll(uid, P, slot), P);
        // A little late: the rest of the interval.
        assert_eq!(
            next_poll(uid, P, slot + 300),
            P.checked_sub(Duration::from_millis(300)).unwrap()
        );
    }

    #[test]
    fn the_next_poll_is_within_one_interval_and_on_the_slot() {
        for (i, now) in (0..2000u64).map(|i| (i, 1_700_000_000_000 + i * 7_919)) {
            let uid = format!("uid-{i}");
            let d = next_poll(&uid, P, now);
            // Never longer than an interval without a reconcile (#18: every QueueConsumer reconciled
            // in every interval, the first steady one included).
            assert!(d > Duration::ZERO && d <= P, "{d:?}");
            let at = now + d.as_millis() as u64;
            assert_eq!(
                u128::from(at % 15_000),
                phase(&uid, P).as_millis(),
                "lands on the slot"
            );
        }
    }

    #[test]
    fn a_thousand_uids_spread_over_the_interval() {
        // Reconciled together (a restart); where do their next reads fall, second by second?
        let now = 1_700_000_000_000u64;
        let mut per_second = [0u32; 15];
        for i in 0..1000 {
            let uid = format!("6f1c{i:04}-aa7e-4d7b-8d29-{:012x}", i * 7_777);
            let at = now + next_poll(&uid, P, now).as_millis() as u64;
            per_second[((at % 15_000) / 1000) as usize] += 1;
        }
        // 66.7 on average; all in one second is what this prevents.
        assert!(
            per_second.iter().all(|n| (35..=100).contains(n)),
            "{per_second:?}"
        );
    }

    #[test]
    fn a_read_counts_for_the_rest_of_its_interval_only() {
        let t = |ms: u64| Timestamp::from_millis(ms);
        let start = 1_700_000_010_000u64; // a multiple of 15 s
        assert!(same_interval(t(start), t(start + 14_999), P));
        assert!(same_interval(t(start + 14_000), t(start + 14_999), P));
        assert!(!same_interval(t(start + 14_999), t(start + 15_000), P));
        assert!(!same_interval(t(start), t(start + 30_000), P));
        // A clock that went back reads again.
        assert!(!same_interval(t(start + 5_000), t(start + 4_000), P));
    }

    #[test]
    fn degenerate_intervals_do_not_panic() {
        assert_eq!(next_poll("x", Duration::ZERO, 5), Duration::from_millis(1));
        assert!(next_poll("x", Duration::from_millis(1), 5) <= Duration::from_millis(2));
    }
}
