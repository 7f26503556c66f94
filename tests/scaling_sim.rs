//! The queue simulator (src/scaling/sim): conservation of messages, draining of removed replicas, start-up
//! delay, determinism, and the behaviours that tell the three policies apart. Counts, never timings.

// Expected values are exact results of deterministic arithmetic (rates, ratios, sample values).
#![allow(clippy::float_cmp)]

use qc::api::{Duration, ScalingSpec};
use qc::scaling::sim::engine::Engine;
use qc::scaling::sim::{self, Msg, Ours, Policy, Scaler, SimConfig, Trace};

/// The benchmark spec with a 15 s pollInterval and a fixed 5 m scaleDownStabilization, which the numbers
/// below are worked out for (the benchmark itself runs the API defaults).
fn cfg() -> SimConfig {
    let spec = sim::load_spec(include_str!("../benches/scaling/spec.yaml")).unwrap();
    let mut cfg = SimConfig::from_spec(&spec, Duration::from_secs(30), 1);
    cfg.scaling.poll_interval = Duration::from_secs(15);
    cfg.scaling.scale_down_stabilization = Duration::from_secs(300).into();
    cfg
}

fn msg(at_ms: u64, service_ms: u32) -> Msg {
    Msg {
        at: at_ms,
        service: service_ms,
    }
}

/// 40 minutes: idle, a ramp to 60/s, a 500-message burst, a slow tail, idle.
fn mixed_trace() -> Trace {
    let per_second = (0..2400u32)
        .map(|s| match s {
            120..600 => (s - 120) / 8,
            600 => 500,
            601..1500 => 5 + s % 7,
            // idle before the ramp and after the tail
            _ => 0,
        })
        .collect();
    Trace::from_counts(per_second)
}

#[test]
fn every_arrival_is_handled_exactly_once_under_every_policy() {
    let cfg = cfg();
    let trace = mixed_trace();
    let msgs = trace.messages(&cfg.service_time(), cfg.seed);
    assert_eq!(msgs.len() as u64, trace.total());
    for policy in Policy::ALL {
        let (o, stats) = sim::run_detailed(&cfg, trace.duration_secs(), &msgs, policy);
        assert_eq!(o.unserved, 0, "{policy:?}");
        assert_eq!(
            stats.waits_ms.len() as u64,
            trace.total(),
            "{policy:?}: started"
        );
        assert_eq!(stats.completed, trace.total(), "{policy:?}: completed");
        assert_eq!(o.messages, trace.total(), "{policy:?}");
        // nothing runs before it arrives, and the per-second clock covered the trace
        assert!(stats.seconds >= trace.duration_secs(), "{policy:?}");
        assert!(o.replica_seconds > 0.0, "{policy:?}");
    }
}

#[test]
fn removed_replicas_finish_their_messages_and_are_paid_until_then() {
    // two replicas of 2 slots, ready at once; four 10 s messages at t=0; scale to zero at 1 s
    let msgs = [
        msg(0, 10_000),
        msg(0, 10_000),
        msg(0, 10_000),
        msg(0, 10_000),
    ];
    let mut e = Engine::new(&msgs, 2, 0, 60_000).recording();
    e.set_target(2);
    e.run_until(1_000);
    assert_eq!(e.in_flight(), 4);
    e.set_target(0);
    assert_eq!(e.existing(), 2, "both drain: they hold messages");
    e.run_until(20_000);
    assert!(e.is_idle());
    assert_eq!(e.existing(), 0);
    let stats = e.stats().unwrap().clone();
    assert_eq!(stats.completed, 4);
    assert_eq!(stats.completed_while_draining, 4);
    assert_eq!(
        e.replica_seconds(),
        20.0,
        "2 replicas × 10 s, not cut at 1 s"
    );
}

#[test]
fn a_draining_replica_takes_no_new_messages() {
    // one replica, one slot; a second message arrives while it drains: it waits for the new replica
    let msgs = [msg(0, 5_000), msg(1_000, 1_000)];
    let mut e = Engine::new(&msgs, 1, 10_000, 60_000).recording();
    e.prestart(1);
    e.run_until(500);
    e.set_target(0);
    e.set_target(1); // a new pod, ready after the 10 s start-up
    e.run_until(30_000);
    let stats = e.stats().unwrap();
    assert_eq!(
        stats.waits_ms,
        vec![0, 9_500],
        "started at 10.5 s by the new replica"
    );
    assert_eq!(stats.completed_while_draining, 1);
}

#[test]
fn replicas_start_after_the_start_up_delay_and_not_ready_ones_go_first() {
    let msgs = [msg(0, 1_000)];
    let mut e = Engine::new(&msgs, 10, 30_000, 60_000).recording();
    e.set_target(1);
    e.run_until(29_999);
    assert_eq!(e.observe().ready, 0);
    assert_eq!(e.waiting(), 1);
    e.run_until(40_000);
    assert_eq!(e.stats().unwrap().waits_ms, vec![30_000]);

    // scaling in removes the starting replica, not the busy ready one
    let msgs = [msg(0, 20_000)];
    let mut e = Engine::new(&msgs, 10, 5_000, 60_000).recording();
    e.prestart(1);
    e.run_until(100);
    e.set_target(2);
    e.set_target(1);
    assert_eq!(e.existing(), 1);
    assert_eq!(e.in_flight(), 1);
}

#[test]
fn same_seed_same_numbers_different_seed_different_traffic() {
    let trace = mixed_trace();
    let a = sim::run_all(&cfg(), &trace, &[Policy::Ours, Policy::Keda]);
    let b = sim::run_all(&cfg(), &trace, &[Policy::Ours, Policy::Keda]);
    assert_eq!(a, b);
    let other = SimConfig { seed: 2, ..cfg() };
    let c = sim::run_all(&other, &trace, &[Policy::Ours]);
    assert_ne!(a[0], c[0]);
}

#[test]
fn a_lone_message_ours_activates_on_the_second_sample_keda_on_its_first_poll() {
    // one message at 16 s, 1 s of work; ours samples every 15 s, KEDA polls every 30 s; start-up 30 s
    let cfg = cfg();
    let msgs = [msg(16_000, 1_000)];
    let ours = sim::run_messages(&cfg, 1200, &msgs, Policy::Ours);
    let keda = sim::run_messages(&cfg, 1200, &msgs, Policy::Keda);
    let oracle = sim::run_messages(&cfg, 1200, &msgs, Policy::Oracle);
    // ours: seen at 30 and 45 s, replica ready at 75 s
    assert_eq!(ours.max_wait_seconds, 59.0);
    // keda: seen at the 30 s poll, ready at 60 s
    assert_eq!(keda.max_wait_seconds, 44.0);
    // ours: up from 45 s; the last sample with work is at 75 s; zero at 375 s, right at the window's end
    assert_eq!(ours.replica_seconds, 330.0);
    // keda: up from 30 s; last active poll at 60 s; zero at the first poll past 60 + 300 s
    assert_eq!(keda.replica_seconds, 360.0);
    assert_eq!((ours.scale_events, keda.scale_events), (2, 2));
    // the oracle starts a replica just in time and stops it right after
    assert!(oracle.max_wait_seconds <= 60.0);
    assert!(oracle.replica_seconds <= 40.0, "{}", oracle.replica_seconds);
}

#[test]
fn keda_with_queue_length_5_runs_about_twice_the_replicas_ours_needs_at_steady_load() {
    // 20 minutes at 50/s with C = 10 (~40 in flight): ours ≈ ceil(40/10), KEDA ≈ ceil(40/5); the start
    // from zero (~3000 queued before a replica is ready) widens it: with the declared mean, ours drains
    // that backlog at the mean, KEDA at 5 messages per pod
    let cfg = cfg();
    let trace = Trace::from_counts(vec![50; 1200]);
    let out = sim::run_all(&cfg, &trace, &[Policy::Ours, Policy::Keda]);
    let (ours, keda) = (&out[0], &out[1]);
    let ratio = keda.replica_seconds / ours.replica_seconds;
    assert!((1.5..3.0).contains(&ratio), "keda/ours {ratio}");
    assert_eq!(ours.over_target_share, 0.0);
}

#[test]
fn a_shorter_stabilization_window_scales_in_sooner_and_costs_less() {
    // the same spec with a 1 m window scales in sooner than with the default 5 m
    let trace = mixed_trace();
    let five = sim::run(&cfg(), &trace, Policy::Ours);
    let one_minute = SimConfig {
        scaling: ScalingSpec {
            scale_down_stabilization: Duration::from_secs(60).into(),
            ..cfg().scaling
        },
        ..cfg()
    };
    let one = sim::run(&one_minute, &trace, Policy::Ours);
    assert!(one.replica_seconds < five.replica_seconds);
    // about as many scale events: the 5 m window's scale-down lands on the tail (5 + s % 7 a second, whose
    // 15 s counts rise by one at six polls of seven) while its rate rose at each of the last three polls,
    // and a scale-down goes no lower than a scale-up there would ask for (docs/scaling.md, "Calm on
    // ramps"), so it takes two steps (5 events against 4)
    assert!(one.scale_events + 1 >= five.scale_events);
}

#[test]
fn the_oracle_is_a_lower_reference_bounded_below_by_the_work() {
    let cfg = cfg();
    let trace = mixed_trace();
    let msgs = trace.messages(&cfg.service_time(), cfg.seed);
    let out: Vec<_> = Policy::ALL
        .iter()
        .map(|&p| sim::run_messages(&cfg, trace.duration_secs(), &msgs, p))
        .collect();
    let (ours, keda, oracle) = (&out[0], &out[1], &out[2]);
    // handling time divided by the slots of a replica: no schedule can pay less
    let work = msgs.iter().map(|m| f64::from(m.service)).sum::<f64>() / 1000.0 / 10.0;
    assert!(
        oracle.replica_seconds >= work,
        "{} < {work}",
        oracle.replica_seconds
    );
    assert!(oracle.replica_seconds <= ours.replica_seconds);
    assert!(oracle.replica_seconds <= keda.replica_seconds);
    assert!(
        oracle.max_wait_seconds <= 60.0,
        "{}",
        oracle.max_wait_seconds
    );
    assert_eq!(oracle.over_target_share, 0.0);
    assert!(oracle.plan.is_some());
}

#[test]
fn ours_never_scales_below_the_in_flight_replicas_even_with_no_window() {
    // long messages keep replicas busy after arrivals stop; with a zero window only the floor holds them
    let cfg = SimConfig {
        scaling: ScalingSpec {
            scale_down_stabilization: Duration::from_secs(0).into(),
            scale_on_in_flight: false,
            ..cfg().scaling
        },
        ..cfg()
    };
    let msgs: Vec<Msg> = (0..400).map(|i| msg(1_000 + i * 10, 40_000)).collect();
    let mut e = Engine::new(&msgs, 10, 30_000, 60_000).recording();
    let mut ours = Ours::new(&cfg);
    let mut floors_held = 0;
    while !(e.is_idle() && e.now() > 10_000) {
        let t = ours.next_tick();
        e.run_until(t);
        let obs = e.observe();
        let n = ours.tick(t, obs, e.target());
        let floor = e.target().min(obs.in_flight.div_ceil(10) as u32);
        assert!(
            n >= floor,
            "at {t} ms: {n} replicas for {} in flight",
            obs.in_flight
        );
        if obs.visible == 0 && obs.in_flight > 0 && n == floor && n > 0 {
            floors_held += 1;
        }
        e.set_target(n);
    }
    assert!(floors_held > 0, "the scenario must exercise the floor");
    assert_eq!(e.stats().unwrap().completed, 400);
}

/// The benchmark's fast sawtooth without its noise, at the API defaults (15 s poll, `auto` window): 5/s
/// climbing to 60/s over 5 min then back at once, twelve times. Following each climb one replica at a
/// time cost about five scale events a climb; the ramp lead takes it in about one step, at under a third
/// of KEDA's replica-seconds (KEDA holds its peak through every drop).
#[test]
fn on_a_sawtooth_ours_climbs_in_few_steps_and_still_costs_less_than_keda() {
    let spec = sim::load_spec(include_str!("../benches/scaling/spec.yaml")).unwrap();
    let cfg = SimConfig::from_spec(&spec, Duration::from_secs(30), 1);
    let per_second = (0..12 * 300 + 600u32)
        .map(|s| {
            if s < 3600 {
                5 + 55 * (s % 300) / 300
            } else {
                0
            }
        })
        .collect();
    let trace = Trace::from_counts(per_second);
    let msgs = trace.messages(&cfg.service_time(), cfg.seed);
    let ours = sim::run_messages(&cfg, trace.duration_secs(), &msgs, Policy::Ours);
    let keda = sim::run_messages(&cfg, trace.duration_secs(), &msgs, Policy::Keda);
    // 25 events: one down and about one up a climb, with the lead's economic step and no scale-down while
    // the ramp rises; 36 with a lead of a poll and a start-up only, 59 without a lead (61 with neither
    // rule of "Calm on ramps")
    assert!(ours.scale_events <= 30, "{ours:?}");
    assert!(
        ours.replica_seconds < keda.replica_seconds / 3.0,
        "{ours:?} {keda:?}"
    );
    assert_eq!(ours.over_target_share, 0.0, "{ours:?}");
}

/// A FIFO trace with 2 hot groups (each sent three times what one handler can do: 30/s at 100 ms) and 3
/// cold ones, one replica slot each (concurrency 1): the backlog grows whatever the replicas, because
/// a group's messages go one at a time. Without the message-group cap our policy scales towards
/// maxReplicas for a backlog no replica can drain; with it, never beyond the replicas the active
/// groups can use, every message is still served, and it costs less.
#[test]
fn a_fifo_trace_with_two_hot_groups_gets_no_more_replicas_than_the_groups_can_use() {
    use qc::scaling::sim::fifo::{hot_groups_trace, run_fifo};
    let mut cfg = cfg();
    cfg.concurrency = 1;
    cfg.p99 = Duration::from_millis(100);
    cfg.mean = Some(Duration::from_millis(100));
    cfg.scaling.max_replicas = 20;
    cfg.scaling.max_backlog_age = Duration::from_secs(60);
    let msgs = hot_groups_trace(300, 2, 30, 3, 20, 100);
    let capped = run_fifo(&cfg, &msgs, 300, true);
    let free = run_fifo(&cfg, &msgs, 300, false);
    eprintln!("capped: {capped:?}\nuncapped: {free:?}");
    assert_eq!(capped.unserved, 0, "{capped:?}");
    assert_eq!(free.unserved, 0, "{free:?}");
    assert_eq!(capped.served, msgs.len() as u64);
    // The bound: at most the cap of the most groups ever active (5 groups, concurrency 1: 7).
    assert!(capped.max_active_groups <= 5, "{capped:?}");
    assert!(
        capped.max_replicas <= capped.group_cap,
        "{} replicas for {} active groups (cap {})",
        capped.max_replicas,
        capped.max_active_groups,
        capped.group_cap
    );
    assert!(
        free.max_replicas > capped.group_cap,
        "the uncapped policy asks for replicas the groups cannot use: {free:?}"
    );
    assert!(
        capped.replica_seconds < free.replica_seconds,
        "{} vs {}",
        capped.replica_seconds,
        free.replica_seconds
    );
    // The groups, not the replicas, set how long messages wait: the cap costs no wait.
    assert!(
        capped.max_wait_ms <= free.max_wait_ms + 1000,
        "{} vs {}",
        capped.max_wait_ms,
        free.max_wait_ms
    );
}
