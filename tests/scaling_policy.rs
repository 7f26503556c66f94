//! Table tests of the replica policy (src/scaling): one table per clause of DESIGN "Scaling".
#![allow(clippy::unwrap_used)]

use qc::api::{Duration, ScalingSpec};
use qc::scaling::{
    Decision, History, Limit, MAX_SAMPLES, Reason, Sample, ScalingError, Timestamp, decide,
};

const P99: Duration = Duration::from_secs(2);
const C: u32 = 10;
// C × maxBacklogAge / P = 10 × 60 / 2 = 300 visible messages per replica

fn spec() -> ScalingSpec {
    ScalingSpec {
        min_replicas: 0,
        max_replicas: 20,
        ..ScalingSpec::default()
    }
}

fn sample(at_s: u64, visible: u64, in_flight: u64) -> Sample {
    Sample {
        visible,
        in_flight,
        delayed: 0,
        at: Timestamp::from_secs(at_s),
    }
}

/// (seconds, visible, inFlight)
type Reading = (u64, u64, u64);

/// A history of readings, and a decision at the last one's time.
fn decide_on(spec: &ScalingSpec, samples: &[Reading], current: u32) -> Decision {
    let mut h = History::for_spec(spec);
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
        let mut h = History::for_spec(&s);
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
    // window 5 m; (t, visible, inFlight) with recommendations 9, 8, 5, 2
    let base = [(0, 0, 90), (300, 0, 80), (400, 0, 50), (590, 0, 20)];
    let cases = [
        // (extra samples, current) → (replicas, limited by)
        (vec![], 10, 8, Some(Limit::Stabilization)), // at 590 the window [290, 590] still holds 8
        (vec![(705, 0, 20)], 8, 2, None),            // at 705 the window [405, 705] holds 2 and 2
        (vec![(650, 0, 20)], 8, 5, Some(Limit::Stabilization)), // [350, 650]: 5 at 400
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
    let cases: [Case<'_>; 4] = [
        // the highest raw reading would hold ceil(46 / 10) = 5; the mean of 4 samples is 40 → 4
        (
            "alternating, last 34",
            &|t| if t % 30 == 0 { 34 } else { 46 },
            4,
            None,
        ),
        // the floor still holds what is in flight now
        (
            "alternating, last 46",
            &|t| if t % 30 == 0 { 46 } else { 34 },
            5,
            Some(Limit::InFlight),
        ),
        ("steady 46", &|_| 46, 5, None),
        // a reading below the mean counts as itself: 0 in flight needs no replica for in-flight
        (
            "last 60 s quiet",
            &|t| if t > 540 { 0 } else { 46 },
            5,
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
fn missing_or_stale_samples_hold_the_current_replicas() {
    let s = spec();
    let empty = History::for_spec(&s);
    let d = decide(&s, P99, None, C, &empty, 7, Timestamp::from_secs(100));
    assert_eq!((d.replicas, d.reason), (7, Reason::MetricsUnavailable));
    assert_eq!(d.condition_reason(), "MetricsUnavailable");

    let mut h = History::for_spec(&s);
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
    let mut h = History::for_spec(&s);
    assert_eq!(h.retention(), Duration::from_secs(375));
    for i in 0..1000 {
        h.push(sample(i * 15, i, 0)).unwrap();
    }
    assert!(h.len() <= 375 / 15 + 2, "{} samples kept", h.len());
    assert_eq!(h.latest().unwrap().visible, 999);
    assert_eq!(h.previous().unwrap().visible, 998);
    assert!(h.covers(Timestamp::from_secs(999 * 15), Duration::from_secs(300)));
    assert!(!History::for_spec(&s).covers(Timestamp::from_secs(999), Duration::ZERO));
    let err = h.push(sample(999 * 15, 0, 0)).unwrap_err();
    assert!(matches!(err, ScalingError::PushOutOfOrder { .. }));
    assert!(err.to_string().contains("time order"));

    // one sample per poll interval, however often the controller reconciles
    let poll = Duration::from_secs(15);
    assert!(h.is_due(Timestamp::from_secs(999 * 15 + 15), poll));
    assert!(!h.is_due(Timestamp::from_secs(999 * 15 + 14), poll));
    assert!(History::for_spec(&s).is_due(Timestamp::from_secs(0), poll));

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
