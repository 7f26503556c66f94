//! `scaling.objective.dwellP99` in the simulator, on traces the policy was never tuned on: generated here
//! from a seed in the shapes docs/scaling.md describes (a step, bursts, spikes, a daily wave), not the
//! committed benchmark traces. Each is run with and without the objective; the table (printed, `--nocapture`)
//! gives replica-seconds and the dwell P99, and the assertions say what the objective must buy and what it
//! may cost. Counts and ratios of a deterministic simulation, never timings.

use qc::api::{Duration, ObjectiveSpec};
use qc::scaling::sim::{self, Outcome, Policy, SimConfig, Trace};

/// A small deterministic generator (SplitMix64): the traces are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// About Poisson(rate): the integer part plus one more with the fractional part's probability, and
    /// ±10 % noise per second.
    fn arrivals(&mut self, rate: f64) -> u32 {
        let r = (rate * (0.9 + 0.2 * self.unit())).max(0.0);
        r.floor() as u32 + u32::from(self.unit() < r.fract())
    }
}

/// The traces: (name, per-second arrivals). Seed 46 (the number), never tuned.
fn hidden_traces() -> Vec<(&'static str, Vec<u32>)> {
    let mut rng = Rng(46);
    // 10/s for 10 min, 60/s for 15 min, 10/s for 10 min, idle 5 min
    let step = (0..2400)
        .map(|s| match s {
            600..1500 => rng.arrivals(60.0),
            0..2100 => rng.arrivals(10.0),
            _ => 0,
        })
        .collect();
    // 6/s for 50 min with 800 messages over 5 s at 12, 27 and 42 min, idle 5 min
    let bursts = (0..3300)
        .map(|s| match s {
            720..725 | 1620..1625 | 2520..2525 => 160 + rng.arrivals(6.0),
            0..3000 => rng.arrivals(6.0),
            _ => 0,
        })
        .collect();
    // 15/s with spikes of 2-5x lasting 20-50 s, every 3-7 min, 50 min, idle 5 min
    let mut spiky = Vec::with_capacity(3300);
    let mut next_spike = 120;
    while spiky.len() < 3000 {
        let s = spiky.len();
        if s == next_spike {
            let factor = 2.0 + 3.0 * rng.unit();
            let length = 20 + (rng.unit() * 30.0) as usize;
            for _ in 0..length.min(3000 - s) {
                spiky.push(rng.arrivals(15.0 * factor));
            }
            next_spike = spiky.len() + 180 + (rng.unit() * 240.0) as usize;
        } else {
            spiky.push(rng.arrivals(15.0));
        }
    }
    spiky.resize(3300, 0);
    // a day compressed into an hour: 3/s at its ends, 45/s in its middle
    let wave = (0..3600)
        .map(|s| {
            let phase = f64::from(s) / 3600.0 * std::f64::consts::TAU;
            rng.arrivals(24.0 - 21.0 * phase.cos())
        })
        .collect();
    vec![
        ("step", step),
        ("bursts", bursts),
        ("spiky", spiky),
        ("wave", wave),
    ]
}

/// The benchmark's spec (p99 2s, mean 800ms, concurrency 10, replicas 0..30, maxBacklogAge 60s, API
/// defaults otherwise), at least one replica (an objective below what a start from zero takes needs one:
/// `check`'s ObjectiveBelowActivation), with the objective or without.
fn cfg(objective: Option<u64>) -> SimConfig {
    let spec = sim::load_spec(include_str!("../benches/scaling/spec.yaml")).unwrap();
    let mut cfg = SimConfig::from_spec(&spec, Duration::from_secs(30), 1);
    cfg.scaling.min_replicas = 1;
    cfg.keda.min_replicas = 1;
    cfg.scaling.objective = objective.map(|s| ObjectiveSpec {
        dwell_p99: Duration::from_secs(s),
    });
    cfg
}

fn run(objective: Option<u64>, counts: &[u32]) -> Outcome {
    let trace = Trace::from_counts(counts.to_vec());
    sim::run(&cfg(objective), &trace, Policy::Ours)
}

/// Without the objective but with maxBacklogAge lowered to what it leaves after the handling
/// (objective − p99): the feed-forward half alone, without the workers' measurement.
fn run_backlog_only(objective: u64, counts: &[u32]) -> Outcome {
    let mut cfg = cfg(None);
    cfg.scaling.max_backlog_age = Duration::from_secs(objective - 2);
    sim::run(&cfg, &Trace::from_counts(counts.to_vec()), Policy::Ours)
}

/// What reacting costs a message that arrives as the load outgrows the replicas: up to a poll before the
/// growth is seen, a pod's start-up before new replicas take messages, and its own handling at P99
/// (15s + 30s + 2s). A P99 objective below it is met only where less than 1 % of the messages arrive in
/// such growth; otherwise only standing replicas (minReplicas) can meet it.
const REACTION: f64 = 47.0;

const OBJECTIVES: [u64; 3] = [45, 30, 20];

#[test]
fn with_the_objective_the_dwell_p99_stays_within_it_on_traces_never_tuned_on() {
    let traces = hidden_traces();
    let mut table = String::from(
        "| trace | objective | replica-seconds | × without | dwell P99 | within | max wait | scale events |\n|---|---|---:|---:|---:|---|---:|---:|\n",
    );
    let mut misses = Vec::new();
    for (name, counts) in &traces {
        let without = run(None, counts);
        assert_eq!(without.unserved, 0, "{name}: {without:?}");
        table.push_str(&format!(
            "| {name} | none (maxBacklogAge 60s) | {:.0} | 1.00 | {:.1}s | | {:.1}s | {} |\n",
            without.replica_seconds,
            without.p99_dwell_seconds,
            without.max_wait_seconds,
            without.scale_events
        ));
        for objective in OBJECTIVES {
            let with = run(Some(objective), counts);
            assert_eq!(with.unserved, 0, "{name} {objective}s: {with:?}");
            let within = with.p99_dwell_seconds <= objective as f64;
            table.push_str(&format!(
                "| {name} | {objective}s | {:.0} | {:.2} | {:.1}s | {} | {:.1}s | {} |\n",
                with.replica_seconds,
                with.replica_seconds / without.replica_seconds,
                with.p99_dwell_seconds,
                if within { "yes" } else { "**no**" },
                with.max_wait_seconds,
                with.scale_events
            ));
            if !within {
                misses.push(format!(
                    "{name} at {objective}s: {:.1}s",
                    with.p99_dwell_seconds
                ));
            }
            let alone = run_backlog_only(objective, counts);
            table.push_str(&format!(
                "| {name} | none, maxBacklogAge {}s | {:.0} | {:.2} | {:.1}s | {} | {:.1}s | {} |\n",
                objective - 2,
                alone.replica_seconds,
                alone.replica_seconds / without.replica_seconds,
                alone.p99_dwell_seconds,
                if alone.p99_dwell_seconds <= objective as f64 { "yes" } else { "no" },
                alone.max_wait_seconds,
                alone.scale_events
            ));
            // a miss is never by more than reacting takes
            assert!(
                with.p99_dwell_seconds <= (objective as f64).max(REACTION),
                "{name} {objective}s: {with:?}"
            );
            // an objective at or above what reacting takes is met on every trace
            if objective as f64 >= REACTION - 2.0 {
                assert!(within, "{name} {objective}s: {with:?}");
            }
            // the objective never makes the dwell worse than without it, and costs replicas only
            assert!(
                with.p99_dwell_seconds <= without.p99_dwell_seconds,
                "{name} {objective}s: {with:?} against {without:?}"
            );
            assert!(
                with.replica_seconds >= without.replica_seconds * 0.99,
                "{name} {objective}s: {with:?} against {without:?}"
            );
        }
    }
    println!("{table}");
    println!("misses: {misses:?}");
}

/// The handler is slower than declared (the spec says p99 2s, mean 800ms; the messages take p99 4s, mean
/// 1.6s): the backlog term sizes for the declared times and under-provisions, which only the workers'
/// measurement can see. The measured guard never makes it worse than the feed-forward alone, and never
/// costs more than 1 % beside it (the table says by how much the objective is missed, and
/// docs/scaling.md why).
#[test]
fn a_handler_slower_than_declared_shows_what_the_measurement_can_and_cannot_do() {
    let declared = |objective| cfg(objective);
    let mut slow = cfg(None);
    slow.p99 = Duration::from_secs(4);
    slow.mean = Some(Duration::from_millis(1600));
    slow.timeout = Duration::from_secs(30);
    let mut table = String::from(
        "| trace (handler 2x slower than declared) | scaler | replica-seconds | dwell P99 | within |\n|---|---|---:|---:|---|\n",
    );
    for (name, counts) in hidden_traces() {
        let trace = Trace::from_counts(counts);
        let msgs = trace.messages(&slow.service_time(), 1);
        let seconds = trace.duration_secs();
        let objective = 30;
        let with = sim::run_messages(&declared(Some(objective)), seconds, &msgs, Policy::Ours);
        let mut alone_cfg = declared(None);
        alone_cfg.scaling.max_backlog_age = Duration::from_secs(objective - 2);
        let alone = sim::run_messages(&alone_cfg, seconds, &msgs, Policy::Ours);
        for (scaler, o) in [
            ("objective 30s", &with),
            ("none, maxBacklogAge 28s", &alone),
        ] {
            table.push_str(&format!(
                "| {name} | {scaler} | {:.0} | {:.1}s | {} |\n",
                o.replica_seconds,
                o.p99_dwell_seconds,
                if o.p99_dwell_seconds <= objective as f64 {
                    "yes"
                } else {
                    "no"
                }
            ));
        }
        assert!(
            with.p99_dwell_seconds <= alone.p99_dwell_seconds,
            "{name}: {with:?} against {alone:?}"
        );
        assert!(
            with.replica_seconds <= alone.replica_seconds * 1.01,
            "{name}: {with:?} against {alone:?}"
        );
    }
    println!("{table}");
}
