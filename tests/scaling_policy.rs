//! Table tests of the replica policy (src/scaling): one table per clause of the policy (docs/scaling.md, "The algorithm").

// Expected values are exact results of deterministic arithmetic (rates, ratios, sample values).
#![allow(clippy::float_cmp)]

use qc::api::{Duration, ScalingSpec, Stabilization};
use qc::scaling::{
    DEFER_MAX_STEP, Decision, History, Limit, MAX_SAMPLES, MAX_STARTUP, Reason, Sample,
    ScalingError, Timestamp, decide, decide_with_waiting, measured_startup,
};

const P99: Duration = Duration::from_secs(2);
const C: u32 = 10;
// C × maxBacklogAge / P = 10 × 60 / 2 = 300 visible messages per replica

/// The tables below are worked out for a fixed 5 m window (the `auto` window has its own tests).
fn spec() -> ScalingSpec {
    ScalingSpec {
        min_replicas: 0,
        max_replicas: 20,
        poll_interval: Duration::from_secs(15),
        scale_down_stabilization: Duration::from_secs(300).into(),
        ..ScalingSpec::default()
    }
}

fn sample(at_s: u64, visible: u64, in_flight: u64) -> Sample {
    Sample {
        visible,
        in_flight,
        delayed: 0,
        deleted: None,
        oldest_age: None,
        at: Timestamp::from_secs(at_s),
    }
}

/// (seconds, visible, inFlight)
type Reading = (u64, u64, u64);

/// A history of readings, and a decision at the last one's time.
fn decide_on(spec: &ScalingSpec, samples: &[Reading], current: u32) -> Decision {
    let mut h = History::for_spec(spec, None);
    for &(t, v, f) in samples {
        h.push(sample(t, v, f)).unwrap();
    }
    let now = Timestamp::from_secs(samples.last().map_or(0, |s| s.0));
    decide(spec, P99, None, C, &h, current, now)
}

/// Samples every 15 s from t=0 to `until` with no traffic, so the stabilization window is covered.
fn quiet_until(until: u64) -> Vec<Reading> {
    (0..until).step_by(15).map(|t| (t, 0, 0)).collect()
}

#[test]
fn desired_is_in_flight_replicas_plus_backlog_replicas() {
    // (visible, inFlight, scaleOnInFlight) → replicas, scaling up from 1
    let cases = [
        (0, 25, true, 3),    // ceil(25/10)
        (300, 0, true, 1),   // 300 visible drain within 60s on one replica
        (301, 0, true, 2),   // one more message needs another
        (600, 20, true, 4),  // 2 + 2
        (1, 1, true, 1),     // the in-flight replica's 9 free slots take the visible one
        (180, 64, true, 7),  // 7 for 64 in flight; its 6 free slots drain 6 × 60 / 2 = 180 in time
        (181, 64, true, 8),  // one more needs another replica
        (180, 64, false, 1), // no in-flight term, no free slots to credit
        (600, 25, false, 2),
        (3000, 0, true, 10),
    ];
    for (visible, in_flight, on_in_flight, want) in cases {
        let s = ScalingSpec {
            scale_on_in_flight: on_in_flight,
            ..spec()
        };
        let d = decide_on(&s, &[(0, visible, in_flight)], 1);
        assert_eq!(
            d.replicas, want,
            "visible {visible}, inFlight {in_flight}, scaleOnInFlight {on_in_flight}: {d}"
        );
        assert_eq!(
            d.reason,
            if want > 1 {
                Reason::ScaleUp
            } else {
                Reason::Hold
            }
        );
        let t = d.terms.unwrap();
        assert_eq!(t.backlog_per_replica, 300.0);
    }
}

#[test]
fn backlog_term_follows_p99_concurrency_and_max_backlog_age() {
    // 900 visible: per replica C × age / P
    let cases = [
        (Duration::from_secs(2), 10, Duration::from_secs(60), 3), // 300 each
        (Duration::from_secs(4), 10, Duration::from_secs(60), 6), // 150 each
        (Duration::from_secs(2), 20, Duration::from_secs(60), 2), // 600 each
        (Duration::from_secs(2), 10, Duration::from_secs(30), 6), // 150 each
        (Duration::from_millis(250), 1, Duration::from_secs(60), 4), // 240 each
    ];
    for (p99, c, age, want) in cases {
        let s = ScalingSpec {
            max_backlog_age: age,
            ..spec()
        };
        let mut h = History::for_spec(&s, None);
        h.push(sample(0, 900, 0)).unwrap();
        let d = decide(&s, p99, None, c, &h, 1, Timestamp::from_secs(0));
        assert_eq!(d.replicas, want, "p99 {p99}, C {c}, age {age}: {d}");
    }
}

#[test]
fn clamped_to_min_and_max_replicas() {
    let cases = [
        // (min, max, visible, inFlight, current) → (replicas, limited by, condition reason)
        (2, 20, 0, 0, 2, 2, Some(Limit::MinReplicas), "Scaling"),
        (
            0,
            5,
            3000,
            0,
            1,
            5,
            Some(Limit::MaxReplicas),
            "AtMaxReplicas",
        ),
        (
            0,
            5,
            3000,
            0,
            5,
            5,
            Some(Limit::MaxReplicas),
            "AtMaxReplicas",
        ),
        (3, 20, 0, 0, 0, 3, Some(Limit::MinReplicas), "Scaling"),
        (0, 20, 600, 0, 1, 2, None, "Scaling"),
    ];
    for (min, max, visible, in_flight, current, want, limit, reason) in cases {
        let s = ScalingSpec {
            min_replicas: min,
            max_replicas: max,
            ..spec()
        };
        let d = decide_on(&s, &[(0, visible, in_flight)], current);
        assert_eq!(d.replicas, want, "min {min} max {max}: {d}");
        assert_eq!(d.limited_by, limit, "min {min} max {max}: {d}");
        assert_eq!(d.condition_reason(), reason, "min {min} max {max}: {d}");
    }
}

#[test]
fn activation_from_zero_needs_two_consecutive_samples_above_the_threshold() {
    let cases: [(u32, &[Reading], u32); 9] = [
        (0, &[(0, 5, 0)], 0),                         // one sample is not enough
        (0, &[(0, 5, 0), (15, 5, 0)], 1),             // two: activate with the recommendation
        (0, &[(0, 5, 0), (15, 0, 0)], 0),             // jitter: gone on the second
        (0, &[(0, 0, 0), (15, 5, 0)], 0),             // only the latest
        (0, &[(0, 5, 0), (15, 0, 0), (30, 5, 0)], 0), // not consecutive
        (0, &[(0, 3000, 0), (15, 3000, 0)], 10), // activation goes straight to the recommendation
        (10, &[(0, 10, 0), (15, 10, 0)], 0),     // visible must exceed activationBacklog
        (10, &[(0, 11, 0), (15, 11, 0)], 1),
        (0, &[(0, 0, 50), (15, 0, 50)], 0), // in flight elsewhere does not activate
    ];
    for (activation, samples, want) in cases {
        let s = ScalingSpec {
            activation_backlog: activation,
            ..spec()
        };
        let d = decide_on(&s, samples, 0);
        assert_eq!(
            d.replicas, want,
            "activationBacklog {activation}, {samples:?}: {d}"
        );
        if want > 0 {
            assert_eq!(d.reason, Reason::Activate);
        } else {
            assert_eq!(d.condition_reason(), "ScaledToZero");
            let something = samples.last().is_some_and(|s| s.1 > 0 || s.2 > 0);
            assert_eq!(
                d.limited_by,
                something.then_some(Limit::Activation),
                "{samples:?}"
            );
        }
    }
}

#[test]
fn scale_up_is_immediate_even_inside_a_stabilization_window() {
    // a scale-down happened at 300 s; a surge 15 s later goes up at once
    let mut samples = quiet_until(300);
    samples.push((300, 0, 10));
    samples.push((315, 2400, 40));
    let d = decide_on(&spec(), &samples, 1);
    // in-flight term: mean of (255, 315] = (0 + 0 + 10 + 40) / 4 = 12.5 → 2, leaving 7.5 slots that drain
    // 225 in time; backlog term ceil((2400 - 225) / 300) = 8
    assert_eq!(d.replicas, 2 + 8);
    assert_eq!(d.reason, Reason::ScaleUp);
}

#[test]
fn scale_down_only_to_the_highest_recommendation_of_the_window() {
    // window 5 m; (t, visible, inFlight) with recommendations 9, 8, 5, 2 (in flight a multiple of 9, so
    // the scale-down band, ceil(inFlight / (C × 0.9)), is the recommendation too)
    let base = [(0, 0, 81), (300, 0, 72), (400, 0, 45), (590, 0, 18)];
    let cases = [
        // (extra samples, current) → (replicas, limited by)
        (vec![], 10, 8, Some(Limit::Stabilization)), // at 590 the window [290, 590] still holds 8
        (vec![(705, 0, 18)], 8, 2, None),            // at 705 the window [405, 705] holds 2 and 2
        (vec![(650, 0, 18)], 8, 5, Some(Limit::Stabilization)), // [350, 650]: 5 at 400
        (vec![], 6, 6, Some(Limit::Stabilization)), // never above current: the window only holds up
    ];
    for (extra, current, want, limit) in cases {
        let mut samples = base.to_vec();
        samples.extend(extra.iter().copied());
        let d = decide_on(&spec(), &samples, current);
        assert_eq!(d.replicas, want, "{samples:?} from {current}: {d}");
        assert_eq!(d.limited_by, limit, "{samples:?} from {current}: {d}");
        assert_eq!(
            d.reason,
            if want < current {
                Reason::ScaleDown
            } else {
                Reason::Hold
            }
        );
    }
}

/// (name, inFlight at second t, replicas, limited by)
type Case<'a> = (&'a str, &'a dyn Fn(u64) -> u64, u32, Option<Limit>);

#[test]
fn the_in_flight_term_is_the_mean_of_max_backlog_age_never_above_the_reading() {
    // 10 min of samples every 15 s; in flight alternates 34 / 46 (mean 40) or is steady; from 6 replicas
    let run = |readings: &dyn Fn(u64) -> u64, current: u32| {
        let samples: Vec<Reading> = (0..=600).step_by(15).map(|t| (t, 0, readings(t))).collect();
        decide_on(&spec(), &samples, current)
    };
    let cases: [Case<'_>; 5] = [
        // a scale-down keeps the load at 90 %: the highest raw reading would hold ceil(46 / 9) = 6; the
        // mean of 4 samples is 40 → ceil(40 / 9) = 5
        (
            "alternating, last 34",
            &|t| if t % 30 == 0 { 34 } else { 46 },
            5,
            Some(Limit::Stabilization),
        ),
        // the floor (ceil(46 / 10) = 5) would hold what is in flight now; the band holds as much
        (
            "alternating, last 46",
            &|t| if t % 30 == 0 { 46 } else { 34 },
            5,
            Some(Limit::Stabilization),
        ),
        // 46 on 5 replicas is 92 % busy: the band keeps 6
        ("steady 46", &|_| 46, 6, Some(Limit::Stabilization)),
        ("steady 45", &|_| 45, 5, None),
        // a reading below the mean counts as itself: 0 in flight needs no replica for in-flight; the
        // window still holds the busy samples (46 at 90 %: 6)
        (
            "last 60 s quiet",
            &|t| if t > 540 { 0 } else { 46 },
            6,
            Some(Limit::Stabilization),
        ),
    ];
    for (name, readings, want, limit) in cases {
        let d = run(readings, 6);
        assert_eq!(d.replicas, want, "{name}: {d}");
        assert_eq!(d.limited_by, limit, "{name}: {d}");
    }
    // the mean a sample sees: (34 + 46 + 34 + 46) / 4 with the latest at 34 → min(34, 40) = 34
    let d = run(&|t| if t % 30 == 0 { 34 } else { 46 }, 6);
    assert_eq!(d.terms.unwrap().in_flight_mean, 34.0);
    let d = run(&|t| if t % 30 == 0 { 46 } else { 34 }, 6);
    assert_eq!(d.terms.unwrap().in_flight_mean, 40.0);
}

#[test]
fn no_scale_down_before_sampling_covers_the_window() {
    // a controller restart: 100 s of samples, recommendation 1, 10 replicas running
    let samples: Vec<_> = (0..=100).step_by(15).map(|t| (t, 0, 10)).collect();
    let d = decide_on(&spec(), &samples, 10);
    assert_eq!(d.replicas, 10);
    assert_eq!(d.limited_by, Some(Limit::ShortHistory));
    // scale-up is not held back by a short history
    let d = decide_on(&spec(), &[(0, 0, 150)], 10);
    assert_eq!(d.replicas, 15);
}

#[test]
fn never_below_the_replicas_the_in_flight_messages_need() {
    let no_in_flight_term = ScalingSpec {
        scale_on_in_flight: false,
        ..spec()
    };
    let cases = [
        // (inFlight, current) → replicas
        (42, 5, 5),
        (31, 5, 4),
        (0, 5, 0),
        (42, 3, 3), // the floor never scales up
    ];
    for (in_flight, current, want) in cases {
        let mut samples = quiet_until(600);
        samples.push((600, 0, in_flight));
        let d = decide_on(&no_in_flight_term, &samples, current);
        assert_eq!(d.replicas, want, "inFlight {in_flight} from {current}: {d}");
        if want > 0 && want == current.min(in_flight.div_ceil(10) as u32) && in_flight > 0 {
            assert_eq!(d.limited_by, Some(Limit::InFlight), "{d}");
        }
    }
}

#[test]
fn max_replicas_wins_over_the_in_flight_floor() {
    // the user lowered maxReplicas to relieve a dependency while 10 replicas are busy
    let s = ScalingSpec {
        max_replicas: 4,
        ..spec()
    };
    let mut samples = quiet_until(600);
    samples.push((600, 0, 100));
    let d = decide_on(&s, &samples, 10);
    assert_eq!(d.replicas, 4);
    assert_eq!(d.limited_by, Some(Limit::MaxReplicas));
    assert_eq!(d.condition_reason(), "AtMaxReplicas");
}

#[test]
fn to_zero_only_a_full_window_after_the_last_work() {
    // sampling since 0 (quiet), one message in flight at 300, quiet after; 5 m window
    let mut samples = quiet_until(300);
    samples.push((300, 0, 1));
    samples.extend((315..=600).step_by(15).map(|t| (t, 0, 0)));
    let at_585 = &samples[..samples.len() - 1];
    let d = decide_on(&spec(), at_585, 1);
    assert_eq!(
        d.replicas, 1,
        "at 585 s the window (285, 585] still holds the sample at 300: {d}"
    );
    assert_eq!(d.limited_by, Some(Limit::Stabilization));
    // at 600 s the window (300, 600] has only quiet samples: zero right at the window's end
    let d = decide_on(&spec(), &samples, 1);
    assert_eq!(d.replicas, 0, "{d}");
    assert_eq!(d.reason, Reason::ScaleDown);
    assert_eq!(d.condition_reason(), "ScaledToZero");
    // a visible message keeps one replica even when nothing is in flight
    samples.push((615, 1, 0));
    let d = decide_on(&spec(), &samples, 1);
    assert_eq!(d.replicas, 1);
}

#[test]
fn auto_holds_for_the_measured_start_up_and_30s_until_measured() {
    // one message in flight at 300 s, quiet after, samples every 5 s; `auto` window
    let s = ScalingSpec {
        poll_interval: Duration::from_secs(5),
        scale_down_stabilization: Stabilization::Auto,
        ..spec()
    };
    assert_eq!(
        ScalingSpec::default().scale_down_stabilization,
        Stabilization::Auto
    );
    let mut samples: Vec<Reading> = (0..300).step_by(5).map(|t| (t, 0, 0)).collect();
    samples.push((300, 0, 1));
    samples.extend((305..=400).step_by(5).map(|t| (t, 0, 0)));
    // (measured start-up, last time still held at 1, first time at 0)
    for (startup, held_until, zero_at) in [(None, 325, 330), (Some(45), 340, 345)] {
        let startup = startup.map(Duration::from_secs);
        let at = |t: u64| {
            let mut h = History::for_spec(&s, startup);
            for &(ts, v, f) in samples.iter().take_while(|r| r.0 <= t) {
                h.push(sample(ts, v, f)).unwrap();
            }
            decide(&s, P99, None, C, &h, 1, Timestamp::from_secs(t))
        };
        let held = at(held_until);
        assert_eq!(held.replicas, 1, "{startup:?} at {held_until}: {held}");
        assert_eq!(held.limited_by, Some(Limit::Stabilization), "{held}");
        let gone = at(zero_at);
        assert_eq!(gone.replicas, 0, "{startup:?} at {zero_at}: {gone}");
    }
    // a duration still overrides whatever was measured
    let fixed = ScalingSpec {
        scale_down_stabilization: Duration::from_secs(10).into(),
        ..s.clone()
    };
    let mut h = History::for_spec(&fixed, Some(Duration::from_secs(45)));
    for &(t, v, f) in samples.iter().take_while(|r| r.0 <= 310) {
        h.push(sample(t, v, f)).unwrap();
    }
    let d = decide(&fixed, P99, None, C, &h, 1, Timestamp::from_secs(310));
    assert_eq!(d.replicas, 0, "{d}");
}

#[test]
fn measured_start_up_is_the_median_of_the_recent_pods() {
    let pod = |created: u64, took: u64| {
        (
            Timestamp::from_secs(created),
            Timestamp::from_secs(created + took),
        )
    };
    assert_eq!(measured_startup(&[]), None);
    assert_eq!(
        measured_startup(&[pod(0, 12)]),
        Some(Duration::from_secs(12))
    );
    // one pod that waited for a node does not set the hold of all
    let d = measured_startup(&[pod(0, 10), pod(5, 400), pod(9, 12)]);
    assert_eq!(d, Some(Duration::from_secs(12)));
    // only the 10 most recently created count: 20 old slow pods, then 10 fast new ones
    let mut pods: Vec<_> = (0..20).map(|i| pod(i, 90)).collect();
    pods.extend((100..110).map(|i| pod(i, 8)));
    pods.reverse();
    assert_eq!(measured_startup(&pods), Some(Duration::from_secs(8)));
    // capped, and a Ready before creation (clock skew) counts as zero
    assert_eq!(measured_startup(&[pod(0, 7200)]), Some(MAX_STARTUP));
    let skewed = (Timestamp::from_secs(10), Timestamp::from_secs(5));
    assert_eq!(measured_startup(&[skewed]), Some(Duration::ZERO));
}

#[test]
fn missing_or_stale_samples_hold_the_current_replicas() {
    let s = spec();
    let empty = History::for_spec(&s, None);
    let d = decide(&s, P99, None, C, &empty, 7, Timestamp::from_secs(100));
    assert_eq!((d.replicas, d.reason), (7, Reason::MetricsUnavailable));
    assert_eq!(d.condition_reason(), "MetricsUnavailable");

    let mut h = History::for_spec(&s, None);
    h.push(sample(0, 0, 0)).unwrap();
    // 3 poll intervals (45 s) old is still usable; older is stale
    let fresh = decide(&s, P99, None, C, &h, 7, Timestamp::from_secs(45));
    assert_eq!(fresh.reason, Reason::Hold);
    let stale = decide(&s, P99, None, C, &h, 7, Timestamp::from_secs(46));
    assert_eq!(
        (stale.replicas, stale.reason),
        (7, Reason::MetricsUnavailable)
    );
}

#[test]
fn history_is_ordered_and_bounded_by_the_window() {
    let s = spec(); // 5 m window, 1 m maxBacklogAge (the in-flight mean's span), 15 s poll: 375 s
    let mut h = History::for_spec(&s, None);
    assert_eq!(h.retention(), Duration::from_secs(375));
    for i in 0..1000 {
        h.push(sample(i * 15, i, 0)).unwrap();
    }
    assert!(h.len() <= 375 / 15 + 2, "{} samples kept", h.len());
    assert_eq!(h.latest().unwrap().visible, 999);
    assert_eq!(h.previous().unwrap().visible, 998);
    assert!(h.covers(Timestamp::from_secs(999 * 15), Duration::from_secs(300)));
    assert!(!History::for_spec(&s, None).covers(Timestamp::from_secs(999), Duration::ZERO));
    let err = h.push(sample(999 * 15, 0, 0)).unwrap_err();
    assert!(matches!(err, ScalingError::PushOutOfOrder { .. }));
    assert!(err.to_string().contains("time order"));

    // one sample per poll interval, however often the controller reconciles
    let poll = Duration::from_secs(15);
    assert!(h.is_due(Timestamp::from_secs(999 * 15 + 15), poll));
    assert!(!h.is_due(Timestamp::from_secs(999 * 15 + 14), poll));
    assert!(History::for_spec(&s, None).is_due(Timestamp::from_secs(0), poll));

    // even a tiny poll interval with a long window stays under the hard cap
    let mut h = History::new(Duration::from_secs(24 * 3600));
    for i in 0..(MAX_SAMPLES as u64 + 500) {
        h.push(Sample {
            at: Timestamp::from_millis(i),
            ..sample(0, 0, 0)
        })
        .unwrap();
    }
    assert_eq!(h.len(), MAX_SAMPLES);

    // a retention shorter than the poll interval still keeps the two samples activation needs
    let mut h = History::new(Duration::from_secs(1));
    h.push(sample(0, 5, 0)).unwrap();
    h.push(sample(15, 5, 0)).unwrap();
    h.push(sample(30, 5, 0)).unwrap();
    assert_eq!(h.len(), 2);
}

#[test]
fn samples_come_from_queue_facts_and_say_which_count_is_missing() {
    let facts = qc::aws::facts::QueueFacts {
        url: "https://sqs.us-east-1.amazonaws.com/1/q".into(),
        arn: None,
        visibility_timeout: Duration::from_secs(30),
        retention: Duration::from_secs(345_600),
        fifo: false,
        redrive: None,
        visible: Some(12),
        in_flight: Some(3),
        delayed: None,
    };
    let s = Sample::from_facts(&facts, Timestamp::from_secs(9)).unwrap();
    assert_eq!((s.visible, s.in_flight, s.delayed), (12, 3, 0));
    let err = Sample::from_facts(
        &qc::aws::facts::QueueFacts {
            in_flight: None,
            ..facts.clone()
        },
        Timestamp::from_secs(9),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("ApproximateNumberOfMessagesNotVisible")
    );
    let err = Sample::from_facts(
        &qc::aws::facts::QueueFacts {
            visible: Some(-1),
            ..facts
        },
        Timestamp::from_secs(9),
    )
    .unwrap_err();
    assert!(err.to_string().contains("negative"));
}

#[test]
fn decision_message_carries_the_numbers() {
    let d = decide_on(&spec(), &[(0, 600, 20)], 1);
    let text = d.to_string();
    for needle in [
        "4 replicas",
        "20 in flight (mean 20.0) need 2",
        "600 visible need 2",
        "300",
    ] {
        assert!(text.contains(needle), "{text}");
    }
}

const MEAN: Option<Duration> = Some(Duration::from_millis(800));

/// Like `decide_on`, with a declared mean (or none) and a spec of its own.
fn decide_with(
    spec: &ScalingSpec,
    mean: Option<Duration>,
    samples: &[Reading],
    current: u32,
) -> Decision {
    let mut h = History::for_spec(spec, None);
    for &(t, v, f) in samples {
        h.push(sample(t, v, f)).unwrap();
    }
    let now = Timestamp::from_secs(samples.last().map_or(0, |s| s.0));
    decide(spec, P99, mean, C, &h, current, now)
}

#[test]
fn with_a_declared_mean_seen_backlog_drains_at_the_mean_and_new_backlog_at_p99() {
    // P 2s, mean 0.8s, C 10, T 60s: a replica drains 10 × 60 / 2 = 300 new messages, or
    // 10 × (60 − 2) / 0.8 = 725 seen ones, within maxBacklogAge. (previous visible, visible) → replicas
    // from 1, nothing in flight; the previous sample is 5 s earlier.
    let cases = [
        (None, 725, 725, 3),    // no mean: the base formula exactly, ceil(725 / 300)
        (MEAN, 725, 725, 1),    // all seen: 725 / 725
        (MEAN, 726, 726, 2),    // one more seen message needs another replica
        (MEAN, 0, 725, 3),      // all new: P sizing, as the base formula
        (MEAN, 0, 300, 1),      // new boundary
        (MEAN, 0, 301, 2),      //
        (MEAN, 725, 1025, 2),   // 725 seen + 300 new = 1 + 1
        (MEAN, 725, 1026, 3),   // one more new message
        (MEAN, 2000, 725, 1),   // a shrinking backlog is all seen
        (MEAN, 3000, 2900, 4),  // 2900 / 725
        (None, 3000, 2900, 10), // base formula: 2900 / 300
    ];
    for (mean, before, visible, want) in cases {
        let d = decide_with(&spec(), mean, &[(0, before, 0), (5, visible, 0)], 1);
        assert_eq!(d.replicas, want, "mean {mean:?}, {before} → {visible}: {d}");
        let t = d.terms.unwrap();
        assert_eq!(t.backlog_per_replica, 300.0);
        assert_eq!(t.seen_backlog_per_replica, mean.map(|_| 725.0));
        let new = if mean.is_some() {
            visible.saturating_sub(before)
        } else {
            0
        };
        assert_eq!(t.new_visible, new);
    }
    // the first sample has nothing before it: everything is new
    let d = decide_with(&spec(), MEAN, &[(0, 725, 0)], 1);
    assert_eq!((d.replicas, d.terms.unwrap().new_visible), (3, 725));
    let text = decide_with(&spec(), MEAN, &[(0, 725, 0), (5, 1025, 0)], 1).to_string();
    assert!(
        text.contains("1025 visible (300 new) need 2 (a replica drains 300 new or 725 seen"),
        "{text}"
    );
}

#[test]
fn with_a_declared_mean_the_tail_allowance_needs_max_backlog_age_above_p99() {
    // 60 visible, seen at the previous sample too; (maxBacklogAge, mean) → replicas
    let cases = [
        (Duration::from_secs(2), MEAN, 6), // T = P: no time after the tail, base formula: 60 / (10 × 2 / 2)
        (Duration::from_secs(2), None, 6),
        (Duration::from_millis(1999), MEAN, 7), // T < P: base formula, 60 × 2 / (10 × 1.999) = 6.003
        (Duration::from_secs(3), MEAN, 5),      // 1 s after the tail: 60 × 0.8 / (10 × 1) = 4.8
        (Duration::from_secs(3), None, 4), // base formula: 60 × 2 / (10 × 3) = 4; the tail costs here
    ];
    for (age, mean, want) in cases {
        let s = ScalingSpec {
            max_backlog_age: age,
            ..spec()
        };
        let d = decide_with(&s, mean, &[(0, 60, 0), (5, 60, 0)], 1);
        assert_eq!(d.replicas, want, "maxBacklogAge {age}, mean {mean:?}: {d}");
        let mean_used = d.terms.unwrap().seen_backlog_per_replica.is_some();
        assert_eq!(mean_used, mean.is_some() && age > P99, "{d}");
    }
}

#[test]
fn with_a_declared_mean_the_in_flight_term_takes_the_arrivals_share_while_a_backlog_waits() {
    // samples 5 s apart, 100 in flight at both; (mean, previous visible, visible) → (replicas, in-flight
    // term's input) from 1
    let cases = [
        // draining 60/s: arrivals × mean = 100 + 0.8 × (−300 / 5) = 52 → 6 replicas, whose 8 free slots
        // drain 8 × 58 / 0.8 = 580 of the 700 seen; the other 120 need one more
        (MEAN, 1000, 700, 7, 52.0),
        (None, 1000, 700, 13, 100.0), // base formula: 10 + ceil(700 / 300)
        // growing: the arrivals exceed what is in flight, the in-flight term keeps the reading; 700 seen
        // (9.7 slots) + 300 new (10 slots) → 2
        (MEAN, 700, 1000, 12, 100.0),
        // draining faster than anything arrives: 100 − 0.8 × 200 < 0 → 0; 1000 seen → 2
        (MEAN, 2000, 1000, 2, 0.0),
        // nothing visible now: the count is the arrivals' (no backlog to saturate the slots)
        (MEAN, 1000, 0, 10, 100.0),
    ];
    for (mean, before, visible, want, input) in cases {
        let d = decide_with(&spec(), mean, &[(0, before, 100), (5, visible, 100)], 1);
        assert_eq!(d.replicas, want, "mean {mean:?}, {before} → {visible}: {d}");
        assert_eq!(d.terms.unwrap().in_flight_mean, input, "{d}");
    }
    // scaling down, the in-flight floor still holds the replicas that are busy now
    let s = ScalingSpec {
        scale_down_stabilization: Duration::from_secs(0).into(),
        ..spec()
    };
    let d = decide_with(&s, MEAN, &[(0, 2000, 100), (5, 1000, 100)], 10);
    assert_eq!(
        (d.replicas, d.limited_by),
        (10, Some(Limit::InFlight)),
        "{d}"
    );
}

#[test]
fn with_a_declared_mean_starting_replicas_stay_while_a_backlog_waits() {
    // a burst: 3000 new at t=5 scales 2 → 11 (1 for 10 in flight + 3000 / 300); at t=10 the backlog is
    // seen and needs 5 — but 10 of the 11 replicas are not busy yet (10 in flight < 11 × 10): still
    // starting, so none goes. Window 0 s, so only this rule holds them. (mean, t=10 reading, current)
    let s = ScalingSpec {
        scale_down_stabilization: Duration::from_secs(0).into(),
        ..spec()
    };
    let burst = |mean, visible, in_flight, current| {
        decide_with(
            &s,
            mean,
            &[(0, 0, 10), (5, 3000, 10), (10, visible, in_flight)],
            current,
        )
    };
    let d = decide_with(&s, MEAN, &[(0, 0, 10), (5, 3000, 10)], 2);
    assert_eq!((d.replicas, d.reason), (11, Reason::ScaleUp), "{d}");
    let cases = [
        // the recommendation is 5 (see below): without the rule it would go there
        (MEAN, 2990, 10, 11, 11, Some(Limit::Starting)),
        // half of them busy: the band's load alone holds them (λ × mean = 50 + 0.8 × 30 / 5 = 54.8 slots
        // → 7, + 5 for the backlog); the rule below would too
        (MEAN, 2990, 50, 11, 11, Some(Limit::Stabilization)),
        // nothing visible: nothing to wait for; the floor holds the 3 busy ones
        (MEAN, 0, 30, 11, 3, Some(Limit::InFlight)),
        // every slot busy: nothing is starting (the floor then holds them all)
        (MEAN, 2000, 110, 11, 11, Some(Limit::InFlight)),
        // no mean: the base formula has no such rule; 600 visible need 2, 10 in flight 1, but 2 at 90 % (the band)
        (None, 600, 10, 11, 4, Some(Limit::Stabilization)),
        (MEAN, 600, 10, 11, 11, Some(Limit::Starting)),
    ];
    for (mean, visible, in_flight, current, want, limit) in cases {
        let d = burst(mean, visible, in_flight, current);
        assert_eq!(
            (d.replicas, d.limited_by),
            (want, limit),
            "mean {mean:?}, {visible} visible, {in_flight} in flight: {d}"
        );
    }
    assert_eq!(burst(MEAN, 2990, 10, 11).recommended, 5);
}

/// A sample with the workers' deleted count since the previous one and the oldest message's age.
fn counted(at_s: u64, visible: u64, in_flight: u64, deleted: Option<u64>, age_s: u64) -> Sample {
    Sample {
        deleted,
        oldest_age: Some(Duration::from_secs(age_s)),
        ..sample(at_s, visible, in_flight)
    }
}

fn decide_samples(
    spec: &ScalingSpec,
    mean: Option<Duration>,
    samples: &[Sample],
    current: u32,
) -> Decision {
    let mut h = History::for_spec(spec, None);
    for s in samples {
        h.push(*s).unwrap();
    }
    let now = samples.last().map_or(Timestamp::from_secs(0), |s| s.at);
    decide(spec, P99, mean, C, &h, current, now)
}

#[test]
fn scale_down_leaves_the_remaining_replicas_at_most_90_percent_busy() {
    // no mean: the load is the in-flight term's input; steady in flight for 10 min, window 5 m.
    // (in flight, current) → replicas: up at full use, down only to ceil(load / (C × 0.9))
    let cases = [
        (40, 4, 4), // 40 on 4 replicas: full, the recommendation is 4, no scale-up
        (41, 4, 5), // one more: scale-up at once, at full use
        (40, 5, 5), // but from 5, 4 would be 100 % busy: held (4 × 9 = 36 < 40)
        (36, 5, 4), // 36 fit 4 replicas at 90 %
        (37, 5, 5),
        (40, 8, 5), // a real drop still goes down, to 5
        (0, 3, 0),  // nothing: no headroom on nothing
    ];
    for (in_flight, current, want) in cases {
        let samples: Vec<Reading> = (0..=600).step_by(15).map(|t| (t, 0, in_flight)).collect();
        let d = decide_on(&spec(), &samples, current);
        assert_eq!(
            d.replicas, want,
            "{in_flight} in flight from {current}: {d}"
        );
        assert_eq!(d.recommended, in_flight.div_ceil(10) as u32, "{d}");
    }
}

#[test]
fn with_a_declared_mean_the_arrivals_are_counted_from_the_deleted_messages() {
    // mean 0.8 s, samples 15 s apart, nothing visible, 40 in flight at both, window 0 s (only the band
    // holds). Arrivals = Δ(visible + in flight) + deleted: λ × mean slots are busy; scale-down to
    // ceil(λ × mean / (C × 0.9)). (deleted since the previous sample, current) → replicas
    let s = ScalingSpec {
        scale_down_stabilization: Duration::from_secs(0).into(),
        ..spec()
    };
    let cases = [
        (Some(750), 8, 5), // 50/s × 0.8 = 40 slots → 40 / 9 → 5
        (Some(600), 8, 4), // 40/s → 32 slots → 4 (the floor: 40 in flight need 4)
        (Some(0), 8, 4),   // nothing finished: λ = 0; the in-flight floor holds 4
        (None, 8, 5),      // unknown: Little's law, in flight / mean = 50/s → 5
    ];
    for (deleted, current, want) in cases {
        let samples = [
            counted(0, 0, 40, deleted, 0),
            counted(15, 0, 40, deleted, 0),
        ];
        let d = decide_samples(&s, MEAN, &samples, current);
        assert_eq!(d.replicas, want, "deleted {deleted:?} from {current}: {d}");
    }
    // while a backlog waits, the in-flight term takes the counted arrivals' share: 1000 → 700 visible,
    // 100 in flight, 200 deleted in 5 s: arrivals −300 + 200 < 0 → 0; 700 seen need 1
    let d = decide_samples(
        &s,
        MEAN,
        &[
            counted(0, 1000, 100, Some(200), 5),
            counted(5, 700, 100, Some(200), 5),
        ],
        1,
    );
    assert_eq!(
        (d.replicas, d.terms.unwrap().in_flight_mean),
        (1, 0.0),
        "{d}"
    );
}

#[test]
fn no_scale_down_while_the_oldest_message_could_not_wait_for_a_replica_to_come_back() {
    // T 60 s, P 2 s, start-up 30 s (auto, unmeasured): a replica let go comes back in 30 s, so not while
    // the oldest visible message is older than 60 − 30 − 2 = 28 s. Window 0 s; from 6, 5 in flight (1
    // replica, whose 5 free slots take the 50 visible in time). (oldest age, visible) → (replicas, limited by)
    let s = ScalingSpec {
        scale_down_stabilization: Duration::from_secs(0).into(),
        ..spec()
    };
    let cases = [
        (20, 50, 1, None),
        (28, 50, 1, None),
        (29, 50, 6, Some(Limit::OldestAge)),
        (59, 50, 6, Some(Limit::OldestAge)),
        (40, 0, 1, None), // nothing visible: the age is of no message (a stale CloudWatch reading)
    ];
    for (age, visible, want, limit) in cases {
        let samples = [
            counted(0, visible, 5, None, age),
            counted(15, visible, 5, None, age),
        ];
        let d = decide_samples(&s, None, &samples, 6);
        assert_eq!(
            (d.replicas, d.limited_by),
            (want, limit),
            "oldest {age} s, {visible} visible: {d}"
        );
    }
    // scale-up is never held
    let d = decide_samples(
        &s,
        None,
        &[
            counted(0, 3000, 10, None, 50),
            counted(15, 3000, 10, None, 50),
        ],
        6,
    );
    assert_eq!((d.replicas, d.reason), (11, Reason::ScaleUp), "{d}");
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn reading() -> impl Strategy<Value = (u64, u64, Option<u64>, u64)> {
        (
            0u64..5000,
            0u64..400,
            proptest::option::of(0u64..3000),
            0u64..120,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the samples, deleted counts and ages: the decision is a pure function, never below
        /// what holds the in-flight messages (unless maxReplicas is lower), takes a higher recommendation
        /// at once, and leaves zero only on two samples above the activation backlog.
        #[test]
        fn the_guarantees_hold_with_every_new_input(
            readings in proptest::collection::vec(reading(), 1..12),
            poll in 1u64..30,
            current in 0u32..25,
            mean in proptest::option::of(100u64..2000),
            window in 0u64..120,
        ) {
            let s = ScalingSpec {
                max_replicas: 20,
                scale_down_stabilization: Duration::from_secs(window).into(),
                ..spec()
            };
            let mean = mean.map(Duration::from_millis);
            let samples: Vec<Sample> = readings
                .iter()
                .enumerate()
                .map(|(i, &(v, f, d, age))| counted(i as u64 * poll, v, f, d, age))
                .collect();
            let d = decide_samples(&s, mean, &samples, current);
            prop_assert_eq!(&d, &decide_samples(&s, mean, &samples, current));
            let last = samples.last().unwrap();
            let busy = u32::try_from(last.in_flight.div_ceil(u64::from(C))).unwrap();
            if current > 0 {
                prop_assert!(d.replicas >= current.min(busy).min(s.max_replicas), "{}", d);
                if d.recommended > current {
                    if d.limited_by == Some(Limit::Deferred) {
                        // a small step waits one poll (docs/scaling.md, "Calm on ramps")
                        prop_assert_eq!(d.replicas, current);
                        prop_assert!(d.recommended - current <= DEFER_MAX_STEP, "{}", d);
                        prop_assert_eq!(d.reason, Reason::Hold);
                    } else {
                        // at once, plus the ramp lead if any
                        let lead = d.terms.and_then(|t| t.ramp_replicas).unwrap_or(0);
                        prop_assert_eq!(d.replicas, d.recommended + lead);
                        prop_assert_eq!(d.reason, Reason::ScaleUp);
                    }
                }
                if d.replicas < current {
                    prop_assert!(d.replicas >= d.recommended, "{}", d);
                }
            } else {
                let over = |x: &Sample| x.visible > 0;
                let two = samples.len() >= 2 && over(last) && over(&samples[samples.len() - 2]);
                prop_assert_eq!(d.replicas > 0, two, "{}", d);
            }
            prop_assert!(d.replicas <= s.max_replicas);
        }
    }
}

/// Workers with heartbeats hold one batch (here 10) beyond their C slots while a backlog lasts. A
/// saturated fleet then shows C + 10 in flight per replica; read as load, that asked for twice the
/// replicas, and each scale-up's new batches asked for more again, until maxReplicas.
#[test]
fn a_waiting_batch_per_replica_is_backlog_not_load() {
    let s = spec();
    let decide_held = |readings: &[Reading], current: u32, waiting: u32| {
        let mut h = History::for_spec(&s, None);
        for &(t, v, f) in readings {
            h.push(sample(t, v, f)).unwrap();
        }
        let now = Timestamp::from_secs(readings.last().map_or(0, |r| r.0));
        decide_with_waiting(&s, P99, None, C, waiting, &h, current, now)
    };
    // 5 replicas running 10 each and holding 10 each waiting, nothing visible, for a minute.
    let saturated: Vec<Reading> = (0..=60).step_by(15).map(|t| (t, 0, 100)).collect();
    let without = decide_held(&saturated, 5, 0);
    assert_eq!(without.replicas, 10, "counted as load: {without}");
    let with = decide_held(&saturated, 5, 10);
    // 50 running need the 5 replicas; the 50 waiting are backlog: a fleet holding waiting batches is at
    // capacity, so the base formula's backlog term asks for one more replica (ceil(50 / 300)), not five more
    assert_eq!(with.replicas, 6, "{with}");
    let t = with.terms.unwrap();
    assert_eq!((t.in_flight_replicas, t.backlog_replicas), (5, 1), "{with}");
    // A backlog on top: 50 waiting + 1000 visible = 1050 backlog → 4 replicas' worth (300 each).
    let busy: Vec<Reading> = (0..=60).step_by(15).map(|t| (t, 1000, 100)).collect();
    let d = decide_held(&busy, 5, 10);
    assert_eq!(d.replicas, 5 + 4, "{d}");
    // Only up to `waiting` per replica is taken as local: in flight beyond that (a crashed pod's
    // leases, another consumer's messages) stays in the in-flight term as before.
    let beyond: Vec<Reading> = (0..=60).step_by(15).map(|t| (t, 0, 130)).collect();
    assert_eq!(
        decide_held(&beyond, 5, 10).replicas,
        8 + 1,
        "ceil((130 − 50) / 10) = 8 for the in-flight term, 1 for the 50 waiting"
    );
    // A fleet that is not saturated holds nothing waiting: unchanged.
    let light: Vec<Reading> = (0..=60).step_by(15).map(|t| (t, 0, 30)).collect();
    assert_eq!(
        decide_held(&light, 5, 10).replicas,
        decide_held(&light, 5, 0).replicas
    );
}

/// While more than half of the scraped workers report their outage breaker open, the policy holds the
/// replicas it has (inside [minReplicas, maxReplicas]) whatever the growing backlog asks for, and says
/// so; half or fewer open, or none scraped, it decides from the queue as always.
#[test]
fn most_breakers_open_hold_replicas_against_the_growing_backlog() {
    use qc::scaling::{Downstream, decide_for};
    let manifest = "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {name: x}\nspec:\n  queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\n  handler: {http: {}}\n  processing: {p99: 2s}\n  scaling: {minReplicas: 2, maxReplicas: 6, pollInterval: 15s}\n";
    let qc::manifest::Document::Valid(qc) = qc::manifest::load_str(manifest).unwrap().remove(0)
    else {
        panic!("the manifest is valid")
    };
    let mut h = History::for_spec(&qc.spec.scaling, None);
    // A backlog that grows fast enough to ask for maxReplicas.
    let mut t = 0;
    for v in [
        0u64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5_000, 10_000,
    ] {
        h.push(sample(t, v, 0)).unwrap();
        t += 15;
    }
    let now = Timestamp::from_secs(t - 15);
    let open = |open, scraped| Downstream {
        open,
        scraped,
        fifo_groups: None,
        dwell: None,
    };
    let free = decide_for(&qc.spec, &h, 3, Downstream::default(), now);
    assert_eq!((free.replicas, free.reason), (6, Reason::ScaleUp), "{free}");
    for d in [open(0, 3), open(1, 3), open(1, 2), open(0, 0)] {
        assert_eq!(decide_for(&qc.spec, &h, 3, d, now), free, "{d:?}");
    }
    for (d, current, held, limit) in [
        (open(2, 3), 3, 3, None),
        (open(3, 3), 3, 3, None),
        (open(2, 3), 1, 2, Some(Limit::MinReplicas)),
        (open(2, 3), 9, 6, Some(Limit::MaxReplicas)),
    ] {
        let dec = decide_for(&qc.spec, &h, current, d, now);
        assert_eq!(
            (dec.replicas, dec.reason, dec.limited_by),
            (held, Reason::DownstreamFailing, limit),
            "{d:?} at {current}: {dec}"
        );
        assert_eq!(
            dec.recommended, free.recommended,
            "what the queue alone asks for is kept"
        );
        assert_eq!(dec.condition_reason(), "DownstreamFailing");
        let words = dec.to_string();
        assert!(
            words.contains(&format!("holding {held} replicas"))
                && words.contains("outage breaker open"),
            "{words}"
        );
    }
}

/// T 60 s, P 2 s, poll 15 s, start-up 30 s (auto, unmeasured): a scale-up of at most three replicas waits
/// for the next poll while the visible backlog is at most 60 − 15 − 30 − 2 = 13 s old, read as visible /
/// the last interval's counted arrival rate (Δ(visible + in flight) + deleted), or CloudWatch's oldest age
/// when that is older. From 1 replica with 10 in flight at both samples, 15 s apart.
#[test]
fn a_small_scale_up_waits_a_poll_while_the_backlog_is_young() {
    // (visible, deleted, CloudWatch age s, minReplicas) → (replicas, limited by)
    let cases = [
        // 260 + 40 arrived in 15 s (20/s): the 260 visible are 13 s of arrivals; 2 asked (+1): waits
        (260, Some(40), 0, 0, 1, Some(Limit::Deferred)),
        // 261 visible of 300 arrivals: 13.05 s, too old to wait
        (261, Some(39), 0, 0, 2, None),
        // CloudWatch says the oldest is 14 s old: it lags, but an older reading is believed
        (260, Some(40), 14, 0, 2, None),
        // without the workers' deleted count the arrivals are not counted: nothing waits
        (260, None, 0, 0, 2, None),
        // 900 visible need 3 more (4 in all, +3) and are 1.35 s of arrivals: the largest step that waits
        (900, Some(9100), 0, 0, 1, Some(Limit::Deferred)),
        // 1200 visible need 4 more (+4): a step that large is a burst, taken at once however young
        (1200, Some(10_000), 0, 0, 5, None),
        // below minReplicas (raised by the user): taken at once
        (260, Some(40), 0, 3, 3, Some(Limit::MinReplicas)),
    ];
    for (visible, deleted, age, min, want, limit) in cases {
        let s = ScalingSpec {
            min_replicas: min,
            ..spec()
        };
        let samples = [
            counted(0, 0, 10, Some(0), 0),
            counted(15, visible, 10, deleted, age),
        ];
        let d = decide_samples(&s, None, &samples, 1);
        assert_eq!(
            (d.replicas, d.limited_by),
            (want, limit),
            "{visible} visible, {deleted:?} deleted, CloudWatch age {age} s, min {min}: {d}"
        );
        if limit == Some(Limit::Deferred) {
            assert_eq!(d.reason, Reason::Hold, "{d}");
            assert!(d.recommended > 1, "{d}");
            assert!(d.to_string().contains("limited by Deferred"), "{d}");
        }
    }
    // a poll later the same backlog has doubled with the same 20/s arrivals: 26 s old, no longer waits
    let samples = [
        counted(0, 0, 10, Some(0), 0),
        counted(15, 260, 10, Some(40), 0),
        counted(30, 520, 10, Some(40), 0),
    ];
    let d = decide_samples(&spec(), None, &samples, 1);
    assert_eq!((d.replicas, d.reason), (3, Reason::ScaleUp), "{d}");
}

/// Five samples 15 s apart, nothing visible, 20 in flight then 30 (2 replicas → the in-flight mean 22.5
/// asks for 3); the workers' deletes set the arrival rate of each interval. CloudWatch's age of 20 s (a stale
/// reading: nothing is visible) keeps the +1 from waiting, so the scale-up happens and the lead shows.
/// When the rate rose at each of the last three polls, the smallest rise continues for a poll plus a start-up
/// (45 s, three polls) at P (2 s) per message, plus the economic step √(2 · start-up · slope · C) slots
/// (docs/scaling.md, "Calm on ramps"): rates 10, 11, 12, 13/s rise 1/s a poll (0.13 slots/s), so 3/s
/// more, 6 slots, and a step of √80 = 8.9 slots: 14.9 slots, two replicas more.
#[test]
fn a_scale_up_on_a_rising_ramp_adds_the_rise_for_a_poll_and_a_start_up_and_the_economic_step() {
    // deletes in each interval (the last also has the 10 more in flight as arrivals) → (replicas, lead)
    let cases = [
        ([150, 165, 180, 185], 5, Some(2)), // 10, 11, 12, 13/s
        ([150, 195, 240, 275], 7, Some(4)), // 10, 13, 16, 19/s: 9/s more, 18 slots, + √240 = 15.5
        ([150, 300, 300, 290], 3, None),    // 10, 20, 20, 20/s: a step, then flat (a spike's shape)
        ([150, 165, 180, 160], 3, None),    // 10, 11, 12, 11.3/s: the last poll fell
        ([150, 120, 180, 185], 3, None),    // 10, 8, 12, 13/s: not a rise at every poll
    ];
    for (deletes, want, lead) in cases {
        let mut samples = vec![counted(0, 0, 20, Some(0), 20)];
        for (i, d) in deletes.iter().enumerate() {
            let in_flight = if i == 3 { 30 } else { 20 };
            samples.push(counted(15 * (i as u64 + 1), 0, in_flight, Some(*d), 20));
        }
        let d = decide_samples(&spec(), None, &samples, 2);
        assert_eq!(d.recommended, 3, "{deletes:?}: {d}");
        assert_eq!(
            (d.replicas, d.terms.unwrap().ramp_replicas),
            (want, lead),
            "{deletes:?}: {d}"
        );
        if let Some(n) = lead {
            assert!(
                d.to_string()
                    .contains(&format!("{n} more for the rising arrivals")),
                "{d}"
            );
        }
    }
    // a missing deleted count in any of the intervals: the rise is unknown, no lead
    let mut samples = vec![counted(0, 0, 20, Some(0), 20)];
    for (i, d) in [Some(150), None, Some(180), Some(185)].iter().enumerate() {
        let in_flight = if i == 3 { 30 } else { 20 };
        samples.push(counted(15 * (i as u64 + 1), 0, in_flight, *d, 20));
    }
    let d = decide_samples(&spec(), None, &samples, 2);
    assert_eq!(d.replicas, 3, "{d}");
    // the lead never goes past maxReplicas
    let s = ScalingSpec {
        max_replicas: 3,
        ..spec()
    };
    let mut samples = vec![counted(0, 0, 20, Some(0), 20)];
    for (i, d) in [150, 195, 240, 275].iter().enumerate() {
        let in_flight = if i == 3 { 30 } else { 20 };
        samples.push(counted(15 * (i as u64 + 1), 0, in_flight, Some(*d), 20));
    }
    let d = decide_samples(&s, None, &samples, 2);
    assert_eq!(d.replicas, 3, "{d}");
}
