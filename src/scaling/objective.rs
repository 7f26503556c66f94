//! The dwell objective (`scaling.objective.dwellP99`): from the workers' dwell histogram over a window, the
//! observed P99, the share of messages over the objective and the error budget's burn rate; the verdict of
//! `ObjectiveMet`; and how the scaler sizes and holds replicas for it. Pure: the controller and the simulator
//! feed it the same histogram deltas (docs/scaling.md, "Dwell objective").

use serde::Serialize;

use super::{Decision, Limit, Reason};
use crate::api::{Duration, ScalingSpec};

/// The window of the workers' histograms (the `ProcessingTimeWithinDeclared` rule's and this one's): the last
/// `WINDOW_SCRAPES` scrapes, widened back up to `MAX_SCRAPES` until it holds `MIN_MESSAGES` finished
/// messages.
pub const WINDOW_SCRAPES: usize = 5;
pub const MAX_SCRAPES: usize = 20;
pub const MIN_MESSAGES: u64 = 50;

/// A P99 objective lets 1 % of the messages take longer: the error budget.
pub const BUDGET_PERMILLE: u64 = 10;

/// A histogram as the workers expose it: upper bounds of the finite buckets, cumulative counts per bound,
/// and the total (the `+Inf` bucket).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub bounds: Vec<f64>,
    pub cumulative: Vec<u64>,
    pub count: u64,
}

/// The histogram quantile `q` of cumulative counts (linear interpolation inside the bucket, as
/// Prometheus' `histogram_quantile`); above the last finite bound it answers that bound.
pub fn quantile(q: f64, bounds: &[f64], cumulative: &[u64], total: u64) -> Option<f64> {
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut prev_bound = 0.0;
    let mut prev_count = 0u64;
    for (b, c) in bounds.iter().zip(cumulative) {
        if *c as f64 >= rank {
            let in_bucket = c.saturating_sub(prev_count) as f64;
            if in_bucket == 0.0 {
                return Some(*b);
            }
            // The share of the bucket first: bound times count could overflow to infinity.
            let share = (rank - prev_count as f64) / in_bucket;
            return Some(prev_bound + (b - prev_bound) * share);
        }
        prev_bound = *b;
        prev_count = *c;
    }
    bounds.last().copied()
}

/// How many of the histogram's observations lie above `x`, by the same interpolation as [`quantile`] (so
/// `quantile(q) <= x` exactly when at most `(1 - q) × total` lie above it). Observations beyond the last
/// finite bound count as above any `x` at or past that bound: their values are unknown, and an objective
/// cannot be shown met by them.
pub fn above(h: &Histogram, x: f64) -> f64 {
    let mut prev_bound = 0.0;
    let mut prev_count = 0u64;
    for (b, c) in h.bounds.iter().zip(&h.cumulative) {
        if x < *b {
            let in_bucket = c.saturating_sub(prev_count) as f64;
            let share = if *b > prev_bound {
                ((x - prev_bound) / (b - prev_bound)).clamp(0.0, 1.0)
            } else {
                1.0
            };
            let at_or_below = prev_count as f64 + in_bucket * share;
            return (h.count as f64 - at_or_below).max(0.0);
        }
        prev_bound = *b;
        prev_count = *c;
    }
    h.count.saturating_sub(prev_count) as f64
}

/// What the workers measured of the messages that left the queue in a window, against the objective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Measurement {
    /// The objective it is measured against.
    pub objective: Duration,
    /// Observed dwell P99 (SentTimestamp to deletion), rounded up to the millisecond.
    pub p99: Duration,
    /// Messages that left the queue in the window.
    pub messages: u64,
    /// Of them, those above the objective, in thousandths of a message (an interpolated estimate).
    pub over_milli: u64,
    /// The span of the window.
    pub window: Duration,
}

impl Measurement {
    /// The measurement of a window's dwell histogram (deltas summed over pods). A window in which no
    /// message left the queue measures 0 messages (its P99 reads 0: [`verdict`] says it is too few).
    pub fn of(h: &Histogram, objective: Duration, window: Duration) -> Measurement {
        let p99 = quantile(0.99, &h.bounds, &h.cumulative, h.count).unwrap_or(0.0);
        let over = above(h, objective.as_secs_f64());
        Measurement {
            objective,
            p99: Duration::from_millis((p99 * 1000.0).ceil().max(0.0) as u64),
            messages: h.count,
            over_milli: (over * 1000.0).round() as u64,
            window,
        }
    }

    /// The share of the window's messages over the objective (0..1).
    pub fn bad_fraction(&self) -> f64 {
        if self.messages == 0 {
            return 0.0;
        }
        self.over_milli as f64 / 1000.0 / self.messages as f64
    }

    /// The error budget's burn rate: the share over the objective divided by the 1 % the objective allows;
    /// above 1 the budget is spent faster than it accrues.
    pub fn burn_rate(&self) -> f64 {
        self.bad_fraction() * 1000.0 / BUDGET_PERMILLE as f64
    }

    /// At most [`RECOVERED_BURN_RATE`] of the budget burnt: 0.75 % of the messages over the objective.
    pub fn recovered(&self) -> bool {
        u128::from(self.over_milli) * 1000 * 4
            <= u128::from(self.messages) * 1000 * u128::from(BUDGET_PERMILLE) * 3
    }

    /// Enough messages for a P99, and more than 1 % of them over the objective.
    pub fn burning(&self) -> bool {
        self.messages >= MIN_MESSAGES
            && u128::from(self.over_milli) * 1000
                > u128::from(self.messages) * 1000 * u128::from(BUDGET_PERMILLE)
    }
}

/// Why there is no verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unmeasured {
    /// No ready worker pod to read.
    NoPods,
    /// Ready pods, none of which answered on /metrics.
    NoAnswer { unreachable: usize },
    /// One scrape of the pods so far (a delta needs two), or their workers expose no dwell histogram.
    NoHistogram,
    /// Fewer messages left the queue in the window than a P99 needs.
    TooFew { messages: u64 },
}

/// `ObjectiveMet`'s verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// At most 1 % of the window's messages over the objective (and, after a miss, at most 0.75 %).
    Met(Measurement),
    /// More than 1 %: the error budget burns faster than it accrues.
    Missed(Measurement),
    /// Missed at the last verdict and within the 1 % again, but not yet below the burn rate a miss must
    /// fall to ([`RECOVERED_BURN_RATE`]): still missed, so a window hovering at the budget does not flip the
    /// condition (and send a Warning and a Normal Event) every poll.
    Recovering(Measurement),
    NoMeasurement(Unmeasured),
}

/// How `ObjectiveMet` stood before this window: the hysteresis of [`verdict`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Before {
    /// False (missed): it turns True only at a burn rate of [`RECOVERED_BURN_RATE`] or less.
    Missed,
    /// True, Unknown, or no condition yet: it turns False above a burn rate of 1.
    NotMissed,
}

/// The burn rate a missed objective must fall to before `ObjectiveMet` is True again: three quarters of the
/// budget (0.75 % of the messages over the objective).
pub const RECOVERED_BURN_RATE: f64 = 0.75;

/// The verdict of a window: `measured` (None: no delta) from `pods` that answered and `unreachable` ones,
/// with the hysteresis of `before`.
pub fn verdict(
    measured: Option<Measurement>,
    pods: usize,
    unreachable: usize,
    before: Before,
) -> Verdict {
    match measured {
        Some(m) if m.messages < MIN_MESSAGES => Verdict::NoMeasurement(Unmeasured::TooFew {
            messages: m.messages,
        }),
        Some(m) if m.burning() => Verdict::Missed(m),
        Some(m) if before == Before::Missed && !m.recovered() => Verdict::Recovering(m),
        Some(m) => Verdict::Met(m),
        None if pods == 0 && unreachable == 0 => Verdict::NoMeasurement(Unmeasured::NoPods),
        None if pods == 0 => Verdict::NoMeasurement(Unmeasured::NoAnswer { unreachable }),
        None => Verdict::NoMeasurement(Unmeasured::NoHistogram),
    }
}

/// The `maxBacklogAge` the scaler sizes the backlog for when the objective is set: the visible backlog must
/// drain within what the objective leaves after a message's handling (dwellP99 − p99), and never later
/// than `maxBacklogAge`. Unchanged without an objective.
pub fn backlog_target(scaling: &ScalingSpec, p99: Duration) -> Duration {
    let age = scaling.max_backlog_age;
    let Some(o) = &scaling.objective else {
        return age;
    };
    let left = o.dwell_p99.saturating_sub(p99);
    // the CRD refuses dwellP99 <= p99; a spec that got past it sizes for the whole objective
    let left = if left.is_zero() { o.dwell_p99 } else { left };
    age.min(left)
}

/// The scaler's answer with the workers' measurement of the objective (docs/scaling.md, "Dwell objective"):
/// while the objective burns (more than 1 % of the window's messages over it) and messages wait in the queue,
/// no replica is removed and a scale-up is not deferred (the recommendation is taken at once: the backlog is
/// not young enough to wait a poll). It stands where the CloudWatch oldest-age guard stands without an
/// objective ([`Limit::OldestAge`]), with the workers' own measurement. Once nothing waits, the burn is
/// history (the window trails by up to four polls) and the queue's decision stands. Multiplying the
/// recommendation by the observed P99 over the objective was tried and not kept: on the simulator's traces it
/// paid up to 21 % more replica-seconds for the same dwell P99, the measurement arriving after the surge that
/// caused it (docs/scaling.md). `visible` is the latest sample's.
pub fn with_objective(
    scaling: &ScalingSpec,
    mut d: Decision,
    current: u32,
    measured: Option<Measurement>,
    visible: u64,
) -> Decision {
    let (Some(_), Some(m)) = (&scaling.objective, measured) else {
        return d;
    };
    if !m.burning()
        || visible == 0
        || d.reason == Reason::MetricsUnavailable
        || d.reason == Reason::DownstreamFailing
    {
        return d;
    }
    let target = d
        .replicas
        .max(current.min(scaling.max_replicas))
        .max(d.recommended.min(scaling.max_replicas));
    if target == d.replicas {
        return d;
    }
    d.replicas = target;
    d.limited_by = Some(Limit::Objective);
    d.reason = match target.cmp(&current) {
        std::cmp::Ordering::Greater if current == 0 => Reason::Activate,
        std::cmp::Ordering::Greater => Reason::ScaleUp,
        std::cmp::Ordering::Less => Reason::ScaleDown,
        std::cmp::Ordering::Equal => Reason::Hold,
    };
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(bounds: &[f64], cumulative: &[u64], count: u64) -> Histogram {
        Histogram {
            bounds: bounds.to_vec(),
            cumulative: cumulative.to_vec(),
            count,
        }
    }

    #[test]
    fn above_is_the_inverse_of_quantile() {
        // 100 messages: 90 within 1s, 10 in (1s, 5s]
        let x = h(&[1.0, 5.0], &[90, 100], 100);
        for (at, want) in [
            (0.5, 55.0),
            (1.0, 10.0),
            (3.0, 5.0),
            (4.6, 1.0),
            (5.0, 0.0),
            (9.0, 0.0),
        ] {
            assert!(
                (above(&x, at) - want).abs() < 1e-9,
                "{at}: {}",
                above(&x, at)
            );
        }
        let p99 = quantile(0.99, &x.bounds, &x.cumulative, x.count).unwrap();
        assert!((above(&x, p99) - 1.0).abs() < 1e-9, "{p99}");
        // beyond the last finite bound: unknown values, counted over
        let inf = h(&[1.0, 5.0], &[90, 95], 100);
        // exact: whole counts, no interpolation
        assert!((above(&inf, 5.0) - 5.0).abs() < 1e-12);
        assert!((above(&inf, 60.0) - 5.0).abs() < 1e-12);
        assert!(above(&h(&[], &[], 0), 1.0).abs() < 1e-12);
    }

    fn measured(cumulative: &[u64], count: u64, objective_s: u64) -> Measurement {
        Measurement::of(
            &h(&[1.0, 5.0, 10.0, 30.0], cumulative, count),
            Duration::from_secs(objective_s),
            Duration::from_secs(60),
        )
    }

    #[test]
    fn the_verdict_by_the_share_over_the_objective() {
        // (cumulative at 1/5/10/30 s, total, objective, verdict, burn rate)
        let rows: &[(&[u64], u64, u64, &str, f64)] = &[
            // all within 5s against 10s: met, no burn
            (&[50, 100, 100, 100], 100, 10, "met", 0.0),
            // 2 of 100 above 10s: 2 % over, burning twice as fast as allowed
            (&[50, 90, 98, 100], 100, 10, "missed", 2.0),
            // exactly 1 of 100 over: the budget, not more
            (&[50, 90, 99, 100], 100, 10, "met", 1.0),
            // 50 of 100 above 10s: burn 50
            (&[10, 20, 50, 100], 100, 10, "missed", 50.0),
            // too few messages for a P99, however slow
            (&[0, 0, 0, 49], 49, 10, "too few", 100.0),
        ];
        for (cum, count, objective, want, burn) in rows {
            let m = measured(cum, *count, *objective);
            let got = label(verdict(Some(m), 2, 0, Before::NotMissed));
            assert_eq!(got, *want, "{cum:?}: {m:?}");
            assert!(
                (m.burn_rate() - burn).abs() < 1e-6,
                "{cum:?}: {}",
                m.burn_rate()
            );
        }
        // the P99 and the verdict agree
        let m = measured(&[50, 90, 98, 100], 100, 10);
        assert!(m.p99 > Duration::from_secs(10), "{m:?}");
        let m = measured(&[50, 100, 100, 100], 100, 10);
        assert!(m.p99 <= Duration::from_secs(5), "{m:?}");
    }

    /// A verdict's kind, for table tests.
    fn label(v: Verdict) -> &'static str {
        match v {
            Verdict::Met(_) => "met",
            Verdict::Missed(_) => "missed",
            Verdict::Recovering(_) => "recovering",
            Verdict::NoMeasurement(Unmeasured::TooFew { .. }) => "too few",
            Verdict::NoMeasurement(_) => "none",
        }
    }

    #[test]
    fn a_miss_turns_met_only_below_three_quarters_of_the_budget() {
        // (cumulative counts at 1, 5, 10, 30 s, of 1000 messages, objective 10 s): how many over it
        let of = |over: u64| measured(&[500, 900, 1000 - over, 1000], 1000, 10);
        let rows: &[(u64, Before, &str)] = &[
            // 1.1 %: missed whatever came before
            (11, Before::NotMissed, "missed"),
            (11, Before::Missed, "missed"),
            // exactly the budget (1 %): met from met, still missed from a miss
            (10, Before::NotMissed, "met"),
            (10, Before::Missed, "recovering"),
            // 0.8 %: the same
            (8, Before::NotMissed, "met"),
            (8, Before::Missed, "recovering"),
            // 0.75 %, three quarters of the budget: met again
            (7, Before::Missed, "met"),
            (0, Before::Missed, "met"),
        ];
        for (over, before, want) in rows {
            let m = of(*over);
            let got = label(verdict(Some(m), 1, 0, *before));
            assert_eq!(got, *want, "{over} of 1000 over, {before:?}: {m:?}");
        }
        // 7.5 of 1000 (interpolated thousandths): exactly three quarters counts as recovered
        let m = Measurement {
            objective: Duration::from_secs(10),
            p99: Duration::from_secs(9),
            messages: 1000,
            over_milli: 7500,
            window: Duration::from_secs(60),
        };
        assert!(m.recovered() && !m.burning(), "{m:?}");
        assert!(
            !Measurement {
                over_milli: 7501,
                ..m
            }
            .recovered()
        );
        // too few messages says so, before or after a miss
        assert!(matches!(
            verdict(
                Some(Measurement { messages: 10, ..m }),
                1,
                0,
                Before::Missed
            ),
            Verdict::NoMeasurement(Unmeasured::TooFew { messages: 10 })
        ));
    }

    #[test]
    fn no_measurement_says_why() {
        assert_eq!(
            verdict(None, 0, 0, Before::NotMissed),
            Verdict::NoMeasurement(Unmeasured::NoPods)
        );
        assert_eq!(
            verdict(None, 0, 3, Before::NotMissed),
            Verdict::NoMeasurement(Unmeasured::NoAnswer { unreachable: 3 })
        );
        assert_eq!(
            verdict(None, 2, 1, Before::NotMissed),
            Verdict::NoMeasurement(Unmeasured::NoHistogram)
        );
        // a window in which no message left the queue: too few, not "no histogram"
        let empty = Measurement::of(&h(&[1.0], &[0], 0), Duration::from_secs(1), Duration::ZERO);
        assert_eq!(
            verdict(Some(empty), 1, 0, Before::NotMissed),
            Verdict::NoMeasurement(Unmeasured::TooFew { messages: 0 })
        );
    }

    fn spec(
        objective: Option<&str>,
        p99: &str,
        max_backlog_age: &str,
    ) -> crate::api::QueueConsumerSpec {
        let objective =
            objective.map_or(String::new(), |o| format!(", objective: {{dwellP99: {o}}}"));
        serde_saphyr::from_str(&format!(
            "queue: {{url: https://sqs.us-east-1.amazonaws.com/1/q}}\nhandler: {{http: {{}}}}\nprocessing: {{p99: {p99}}}\nscaling: {{maxReplicas: 20, maxBacklogAge: {max_backlog_age}{objective}}}\n"
        ))
        .unwrap()
    }

    #[test]
    fn the_backlog_target_is_what_the_objective_leaves_after_handling() {
        for (objective, p99, age, want) in [
            (None, "2s", "60s", 60),
            (Some("30s"), "2s", "60s", 28),
            (Some("2m"), "2s", "60s", 60),
            (Some("62s"), "2s", "60s", 60),
            (Some("10s"), "10s", "60s", 10),
        ] {
            assert_eq!(
                backlog_target(&spec(objective, p99, age).scaling, p99.parse().unwrap()),
                Duration::from_secs(want),
                "{objective:?} {p99} {age}"
            );
        }
    }

    fn decision(replicas: u32, recommended: u32, reason: Reason) -> Decision {
        Decision {
            replicas,
            recommended,
            reason,
            limited_by: None,
            terms: None,
        }
    }

    #[test]
    fn a_burning_objective_with_messages_waiting_holds_and_takes_the_recommendation_at_once() {
        let s = spec(Some("20s"), "2s", "60s");
        // burning: 10 of 100 over 20s
        let burning = Measurement {
            objective: Duration::from_secs(20),
            p99: Duration::from_secs(30),
            messages: 100,
            over_milli: 10_000,
            window: Duration::from_secs(60),
        };
        // 0.5 of 100 over: within the budget
        let met = Measurement {
            p99: Duration::from_secs(12),
            over_milli: 500,
            ..burning
        };
        let few = Measurement {
            messages: 49,
            over_milli: 49_000,
            ..burning
        };
        // (decision, current, measurement, visible) -> (replicas, reason, limited by objective)
        let rows = [
            // met: the queue's decision stands, down or up
            (
                decision(2, 2, Reason::ScaleDown),
                4,
                Some(met),
                100,
                (2, Reason::ScaleDown, false),
            ),
            (
                decision(6, 6, Reason::ScaleUp),
                4,
                Some(met),
                100,
                (6, Reason::ScaleUp, false),
            ),
            // burning with messages waiting: no scale-in
            (
                decision(2, 2, Reason::ScaleDown),
                4,
                Some(burning),
                100,
                (4, Reason::Hold, true),
            ),
            // ... and a deferred scale-up goes at once
            (
                decision(4, 6, Reason::Hold),
                4,
                Some(burning),
                100,
                (6, Reason::ScaleUp, true),
            ),
            // ... from zero too, within maxReplicas
            (
                decision(0, 3, Reason::Hold),
                0,
                Some(burning),
                100,
                (3, Reason::Activate, true),
            ),
            (
                decision(4, 30, Reason::Hold),
                4,
                Some(burning),
                100,
                (20, Reason::ScaleUp, true),
            ),
            // a scale-up the queue asked for stands as it is
            (
                decision(8, 8, Reason::ScaleUp),
                4,
                Some(burning),
                100,
                (8, Reason::ScaleUp, false),
            ),
            // burning, nothing waits: the burn is history, the queue's decision stands
            (
                decision(2, 2, Reason::ScaleDown),
                4,
                Some(burning),
                0,
                (2, Reason::ScaleDown, false),
            ),
            // too few messages to burn
            (
                decision(2, 2, Reason::ScaleDown),
                4,
                Some(few),
                100,
                (2, Reason::ScaleDown, false),
            ),
            // no measurement: the queue's decision
            (
                decision(2, 2, Reason::ScaleDown),
                4,
                None,
                100,
                (2, Reason::ScaleDown, false),
            ),
            // held for a failing dependency or stale samples: untouched
            (
                decision(4, 9, Reason::DownstreamFailing),
                4,
                Some(burning),
                100,
                (4, Reason::DownstreamFailing, false),
            ),
            (
                decision(4, 4, Reason::MetricsUnavailable),
                4,
                Some(burning),
                100,
                (4, Reason::MetricsUnavailable, false),
            ),
        ];
        for (d, current, m, visible, (replicas, reason, limited)) in rows {
            let got = with_objective(&s.scaling, d.clone(), current, m, visible);
            assert_eq!(
                (
                    got.replicas,
                    got.reason,
                    got.limited_by == Some(Limit::Objective)
                ),
                (replicas, reason, limited),
                "{d:?} current {current} {m:?} visible {visible}"
            );
        }
        // without an objective in the spec, a measurement changes nothing
        let plain = spec(None, "2s", "60s");
        let d = decision(2, 2, Reason::ScaleDown);
        assert_eq!(
            with_objective(&plain.scaling, d.clone(), 4, Some(burning), 100),
            d
        );
    }
}
