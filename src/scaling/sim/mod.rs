//! The queue simulator behind `qc-operator simulate` and the scaling benchmark: replays a trace of arrivals
//! against replicas driven by our policy, by KEDA's SQS scaler with the HPA, or by a clairvoyant oracle.
//!
//! Pure and deterministic: inputs are values (spec, trace text, seed), no clock, no I/O; the same inputs
//! give the same numbers on every run. See docs/scaling.md for the model and its limits.

pub mod engine;
pub mod fifo;
pub mod keda;
pub mod oracle;
pub mod report;
pub mod service;
pub mod trace;

use serde::Serialize;

use std::collections::VecDeque;

use super::{History, Sample, Timestamp, decide, objective};
use crate::api::{API_VERSION, Duration, QueueConsumerSpec, ScalingSpec};
use crate::manifest;
use engine::{Engine, Observation, Stats};
use keda::{Keda, KedaConfig};
use service::ServiceTime;
pub use trace::{Msg, Trace};

/// Work left when the trace ends is simulated at most this much longer (then reported as unserved).
pub const TAIL: Duration = Duration::from_secs(6 * 3600);
/// The oracle's planning window.
pub const ORACLE_WINDOW: Duration = Duration::from_secs(5);

/// Why a simulation could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    #[error(
        "trace has no rows: write a header `second,arrivals` and one row per second, e.g. `0,12`"
    )]
    TraceEmpty,
    #[error("trace header is {found:?}: the first line must be `second,arrivals`")]
    TraceHeader { found: String },
    #[error("trace line {line}: {problem}")]
    TraceRow { line: usize, problem: String },
    #[error(
        "trace has {total} messages; the simulator takes at most {max}: simulate a shorter period"
    )]
    TraceTooLarge { total: u64, max: u64 },
    #[error("spec is not valid YAML: {0}")]
    ParseSpec(String),
    #[error("QueueConsumer {name}: {errors}")]
    InvalidManifest { name: String, errors: String },
    #[error("no QueueConsumer ({API_VERSION}) in the spec file")]
    NoQueueConsumer,
    #[error("{field}: {problem}")]
    InvalidSpec {
        field: &'static str,
        problem: String,
    },
}

/// Which scaler drives the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Policy {
    Ours,
    Keda,
    Oracle,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Ours, Policy::Keda, Policy::Oracle];

    pub fn as_str(&self) -> &'static str {
        match self {
            Policy::Ours => "ours",
            Policy::Keda => "keda",
            Policy::Oracle => "oracle",
        }
    }
}

/// Everything a run needs besides the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    pub scaling: ScalingSpec,
    pub p99: Duration,
    pub mean: Option<Duration>,
    pub concurrency: u32,
    pub timeout: Duration,
    /// Pod start-up delay: created → ready to receive.
    pub startup: Duration,
    pub seed: u64,
    pub keda: KedaConfig,
}

impl SimConfig {
    /// The simulation of `spec` with KEDA configured as in the benchmark (same min/max replicas).
    pub fn from_spec(spec: &QueueConsumerSpec, startup: Duration, seed: u64) -> SimConfig {
        SimConfig {
            scaling: spec.scaling.clone(),
            p99: spec.processing.p99,
            mean: spec.processing.mean,
            concurrency: spec.processing.concurrency,
            timeout: spec.processing.timeout,
            startup,
            seed,
            keda: KedaConfig {
                min_replicas: spec.scaling.min_replicas,
                max_replicas: spec.scaling.max_replicas,
                ..KedaConfig::default()
            },
        }
    }

    pub fn service_time(&self) -> ServiceTime {
        ServiceTime::fit(self.p99, self.mean, self.timeout)
    }
}

/// The result of one policy on one trace (JSON keys are part of the CLI's contract).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub policy: Policy,
    /// Replica-seconds paid: starting, ready and draining replicas.
    pub replica_seconds: f64,
    pub p99_wait_seconds: f64,
    pub max_wait_seconds: f64,
    /// P99 of the dwell (arrival to deletion: the wait plus the handling), what `scaling.objective` bounds.
    pub p99_dwell_seconds: f64,
    /// Share of simulated seconds at which the oldest waiting message was older than maxBacklogAge.
    pub over_target_share: f64,
    pub scale_events: u32,
    pub messages: u64,
    /// Messages never handled (only when replicas never came, e.g. a backlog below activationBacklog).
    pub unserved: u64,
    pub simulated_seconds: u64,
    pub max_backlog_age_seconds: f64,
    /// The oracle's winning plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
}

/// Something that sets the Deployment's replicas from what it observes.
pub trait Scaler {
    /// When it next wants to look (ms); must move forward after each tick.
    fn next_tick(&self) -> u64;
    /// Observe at `now` and answer the replica count.
    fn tick(&mut self, now: u64, obs: Observation, current: u32) -> u32;
    /// The workers' cumulative dwell histogram, given just before each `tick` (as the controller scrapes
    /// the pods once per poll). Only a scaler with a dwell objective reads it.
    fn see_dwell(&mut self, _cumulative: crate::scaling::objective::Histogram) {}
}

/// Our policy as the controller runs it: one sample per pollInterval into a History, then `decide`.
pub struct Ours {
    scaling: ScalingSpec,
    p99: Duration,
    mean: Option<Duration>,
    concurrency: u32,
    history: History,
    next: u64,
    poll_ms: u64,
    /// The engine's deleted count at the previous sample.
    deleted: u64,
    /// With `scaling.objective`: the dwell histograms of the last scrapes (time, cumulative), newest last.
    dwell: VecDeque<(u64, crate::scaling::objective::Histogram)>,
}

impl Ours {
    pub fn new(cfg: &SimConfig) -> Ours {
        Ours {
            scaling: cfg.scaling.clone(),
            p99: cfg.p99,
            mean: cfg.mean,
            concurrency: cfg.concurrency,
            history: History::for_spec(&cfg.scaling, Some(cfg.startup)),
            next: 0,
            poll_ms: u64::try_from(cfg.scaling.poll_interval.as_millis())
                .unwrap_or(u64::MAX)
                .max(1000),
            deleted: 0,
            dwell: VecDeque::new(),
        }
    }

    /// The objective's measurement as the controller takes it from its scrapes: the last
    /// `WINDOW_SCRAPES`, widened up to `MAX_SCRAPES` until `MIN_MESSAGES` left the queue in it.
    fn dwell_measurement(&self) -> Option<objective::Measurement> {
        let o = self.scaling.objective.as_ref()?;
        let (newest_at, newest) = self.dwell.back()?;
        let mut best = None;
        for n in objective::WINDOW_SCRAPES..=objective::MAX_SCRAPES {
            let from = self.dwell.len().saturating_sub(n);
            let (at, base) = &self.dwell[from];
            if from + 1 < self.dwell.len() {
                let delta = objective::Histogram {
                    bounds: newest.bounds.clone(),
                    cumulative: newest
                        .cumulative
                        .iter()
                        .zip(&base.cumulative)
                        .map(|(n, b)| n - b)
                        .collect(),
                    count: newest.count - base.count,
                };
                let window =
                    Duration::from_millis((newest_at - at).saturating_add(500) / 1000 * 1000);
                best = Some(objective::Measurement::of(&delta, o.dwell_p99, window));
            }
            if best.is_some_and(|m: objective::Measurement| m.messages >= objective::MIN_MESSAGES)
                || from == 0
            {
                break;
            }
        }
        best
    }
}

impl Scaler for Ours {
    fn next_tick(&self) -> u64 {
        self.next
    }

    fn tick(&mut self, now: u64, obs: Observation, current: u32) -> u32 {
        self.next = now + self.poll_ms;
        let at = Timestamp::from_millis(now);
        let sample = Sample {
            visible: obs.visible,
            in_flight: obs.in_flight,
            delayed: 0,
            deleted: Some(obs.deleted.saturating_sub(self.deleted)),
            // with an objective the controller reads no CloudWatch age: the workers measure it
            oldest_age: self
                .scaling
                .objective
                .is_none()
                .then(|| Duration::from_millis(obs.oldest_age_ms)),
            at,
        };
        self.deleted = obs.deleted;
        if self.history.push(sample).is_err() {
            return current;
        }
        let mut scaling = self.scaling.clone();
        scaling.max_backlog_age = objective::backlog_target(&self.scaling, self.p99);
        let d = decide(
            &scaling,
            self.p99,
            self.mean,
            self.concurrency,
            &self.history,
            current,
            at,
        );
        objective::with_objective(
            &self.scaling,
            d,
            current,
            self.dwell_measurement(),
            obs.visible,
        )
        .replicas
    }

    fn see_dwell(&mut self, cumulative: objective::Histogram) {
        if self.scaling.objective.is_none() {
            return;
        }
        // called just before the tick at `next`
        self.dwell.push_back((self.next, cumulative));
        while self.dwell.len() > objective::MAX_SCRAPES {
            self.dwell.pop_front();
        }
    }
}

/// A fixed schedule of replica counts (the oracle's plan).
pub struct Scheduled {
    changes: Vec<(u64, u32)>,
    next: usize,
}

impl Scaler for Scheduled {
    fn next_tick(&self) -> u64 {
        self.changes.get(self.next).map_or(u64::MAX, |c| c.0)
    }

    fn tick(&mut self, now: u64, _obs: Observation, current: u32) -> u32 {
        let mut replicas = current;
        while let Some(&(at, n)) = self.changes.get(self.next) {
            if at > now {
                break;
            }
            replicas = n;
            self.next += 1;
        }
        replicas
    }
}

/// Run one policy over a trace.
pub fn run(cfg: &SimConfig, trace: &Trace, policy: Policy) -> Outcome {
    let msgs = trace.messages(&cfg.service_time(), cfg.seed);
    run_messages(cfg, trace.duration_secs(), &msgs, policy)
}

/// Run several policies over one trace (the messages are generated once and shared).
pub fn run_all(cfg: &SimConfig, trace: &Trace, policies: &[Policy]) -> Vec<Outcome> {
    let msgs = trace.messages(&cfg.service_time(), cfg.seed);
    policies
        .iter()
        .map(|&p| run_messages(cfg, trace.duration_secs(), &msgs, p))
        .collect()
}

/// Run several policies over one named trace, with the work bound the table compares against.
pub fn run_trace(
    cfg: &SimConfig,
    name: &str,
    trace: &Trace,
    policies: &[Policy],
) -> report::TraceResult {
    let msgs = trace.messages(&cfg.service_time(), cfg.seed);
    report::TraceResult {
        trace: name.to_string(),
        work_replica_seconds: work_replica_seconds(&msgs, cfg.concurrency),
        outcomes: policies
            .iter()
            .map(|&p| run_messages(cfg, trace.duration_secs(), &msgs, p))
            .collect(),
    }
}

/// Handling time divided by the slots of a replica: what every slot busy all the time, with no start-up,
/// would cost. No schedule pays less.
pub fn work_replica_seconds(msgs: &[Msg], concurrency: u32) -> f64 {
    msgs.iter().map(|m| f64::from(m.service)).sum::<f64>() / 1000.0 / f64::from(concurrency.max(1))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Run one policy over pre-generated messages in a trace of `seconds`.
pub fn run_messages(cfg: &SimConfig, seconds: u64, msgs: &[Msg], policy: Policy) -> Outcome {
    run_detailed(cfg, seconds, msgs, policy).0
}

/// As [`run_messages`], with the engine's per-message and per-second measurements (for tests and tools).
pub fn run_detailed(
    cfg: &SimConfig,
    seconds: u64,
    msgs: &[Msg],
    policy: Policy,
) -> (Outcome, Stats) {
    let horizon = seconds * 1000;
    match policy {
        Policy::Ours => {
            let engine = drive(cfg, msgs, horizon, 0, &mut Ours::new(cfg));
            outcome(policy, engine, None)
        }
        Policy::Keda => {
            let engine = drive(cfg, msgs, horizon, 0, &mut Keda::new(cfg.keda.clone()));
            outcome(policy, engine, None)
        }
        Policy::Oracle => oracle(cfg, msgs, horizon),
    }
}

/// Drive the engine with `scaler` to the end of the trace and until the work is done (or the tail ends).
fn drive<'a>(
    cfg: &SimConfig,
    msgs: &'a [Msg],
    horizon: u64,
    prestart: u32,
    scaler: &mut dyn Scaler,
) -> Engine<'a> {
    let mut engine = Engine::new(
        msgs,
        cfg.concurrency,
        ms(cfg.startup),
        ms(cfg.scaling.max_backlog_age),
    )
    .recording();
    engine.prestart(prestart);
    let cap = horizon + ms(TAIL);
    loop {
        let now = engine.now();
        if (now >= horizon && engine.is_idle()) || now >= cap {
            break;
        }
        let tick = scaler.next_tick();
        let until = if now < horizon {
            tick.min(horizon)
        } else {
            tick.min(now + 1000)
        }
        .min(cap);
        engine.run_until(until);
        if until == tick {
            scaler.see_dwell(engine.dwell_histogram());
            let n = scaler.tick(until, engine.observe(), engine.target());
            engine.set_target(n);
        }
    }
    engine
}

fn oracle(cfg: &SimConfig, msgs: &[Msg], horizon: u64) -> (Outcome, Stats) {
    let params = oracle::Params {
        concurrency: cfg.concurrency,
        startup_ms: ms(cfg.startup),
        target_ms: ms(cfg.scaling.max_backlog_age),
        max_replicas: cfg.scaling.max_replicas.max(1),
        window_ms: ms(ORACLE_WINDOW),
        horizon_ms: horizon,
        tail_ms: ms(TAIL),
    };
    let mut plans = oracle::candidates(msgs, &params);
    plans.push(oracle::constant(min_constant(msgs, horizon, &params)));
    let target_s = params.target_ms as f64 / 1000.0;
    let meets = |o: &Outcome| o.unserved == 0 && o.max_wait_seconds <= target_s;
    // cheapest plan that keeps every wait within the target; failing that, the one with the shortest wait
    let better = |o: &Outcome, b: &Outcome| match (meets(o), meets(b)) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => o.replica_seconds < b.replica_seconds,
        (false, false) => o.max_wait_seconds < b.max_wait_seconds,
    };
    let mut best: Option<(Outcome, Stats)> = None;
    for plan in plans {
        let mut scaler = Scheduled {
            changes: plan.changes,
            next: 0,
        };
        let engine = drive(cfg, msgs, horizon, plan.initial, &mut scaler);
        let run = outcome(Policy::Oracle, engine, Some(plan.label));
        if best.as_ref().is_none_or(|b| better(&run.0, &b.0)) {
            best = Some(run);
        }
    }
    // candidates is never empty; the fallback only satisfies the type
    best.unwrap_or_else(|| outcome(Policy::Oracle, Engine::new(msgs, 1, 0, 0).recording(), None))
}

/// The fewest constant replicas (ready from t=0) that keep every wait within the target.
fn min_constant(msgs: &[Msg], horizon: u64, p: &oracle::Params) -> u32 {
    let meets = |n: u32| {
        let mut e = Engine::new(msgs, p.concurrency, 0, p.target_ms);
        e.with_deadline(p.target_ms);
        e.prestart(n);
        e.run_until(horizon);
        while !e.violated() && !e.is_idle() && e.now() < horizon + p.tail_ms {
            let t = e.now() + 60_000;
            e.run_until(t);
        }
        !e.violated() && e.is_idle()
    };
    let (mut lo, mut hi) = (0u32, p.max_replicas);
    if !meets(hi) {
        return hi;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if meets(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

fn outcome(policy: Policy, engine: Engine<'_>, plan: Option<String>) -> (Outcome, Stats) {
    let replica_seconds = engine.replica_seconds();
    let scale_events = engine.scale_events();
    let unserved = engine.unserved();
    let stats = engine.into_stats().unwrap_or_default();
    let o = summarize(
        policy,
        replica_seconds,
        scale_events,
        unserved,
        &stats,
        plan,
    );
    (o, stats)
}

/// The nearest-rank 99th percentile (0 of nothing).
fn percentile_99(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let rank = (v.len() * 99).div_ceil(100).max(1) - 1;
    *v.select_nth_unstable(rank).1
}

fn summarize(
    policy: Policy,
    replica_seconds: f64,
    scale_events: u32,
    unserved: u64,
    stats: &Stats,
    plan: Option<String>,
) -> Outcome {
    let p99 = percentile_99(stats.waits_ms.clone());
    let max = stats.waits_ms.iter().copied().max().unwrap_or(0);
    Outcome {
        policy,
        replica_seconds,
        p99_wait_seconds: p99 as f64 / 1000.0,
        max_wait_seconds: max as f64 / 1000.0,
        p99_dwell_seconds: percentile_99(stats.dwells_ms.clone()) as f64 / 1000.0,
        over_target_share: if stats.seconds == 0 {
            0.0
        } else {
            stats.over_target_seconds as f64 / stats.seconds as f64
        },
        scale_events,
        messages: stats.waits_ms.len() as u64 + unserved,
        unserved,
        simulated_seconds: stats.seconds,
        max_backlog_age_seconds: stats.max_backlog_age_ms as f64 / 1000.0,
        plan,
    }
}

/// The first QueueConsumer of a manifest for `simulate --spec`, checked as the API server would
/// (schema and CEL rules, `qc::manifest`) and for what the simulation itself needs (`check_spec`).
pub fn load_spec(yaml: &str) -> Result<QueueConsumerSpec, SimError> {
    for doc in manifest::load_str(yaml).map_err(SimError::ParseSpec)? {
        match doc {
            manifest::Document::Valid(qc) => {
                check_spec(&qc.spec)?;
                return Ok(qc.spec);
            }
            manifest::Document::Invalid { name, errors } => {
                let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
                return Err(SimError::InvalidManifest {
                    name,
                    errors: errors.join("; "),
                });
            }
            manifest::Document::Other { .. } => {}
        }
    }
    Err(SimError::NoQueueConsumer)
}

/// The fields the simulator divides by or compares, with the fix in each message.
pub fn check_spec(spec: &QueueConsumerSpec) -> Result<(), SimError> {
    let invalid = |field, problem: String| Err(SimError::InvalidSpec { field, problem });
    let p = &spec.processing;
    let s = &spec.scaling;
    if p.p99.is_zero() {
        return invalid(
            "spec.processing.p99",
            "must be greater than 0s: declare the P99 time to handle one message, e.g. 2s".into(),
        );
    }
    if p.p99 > p.timeout {
        return invalid(
            "spec.processing.p99",
            format!(
                "{} exceeds processing.timeout {}: raise timeout or lower p99",
                p.p99, p.timeout
            ),
        );
    }
    if let Some(m) = p.mean
        && (m.is_zero() || m > p.p99)
    {
        return invalid(
            "spec.processing.mean",
            format!(
                "{m} must be greater than 0s and at most p99 {}: declare the mean handling time or remove it",
                p.p99
            ),
        );
    }
    if p.concurrency == 0 {
        return invalid("spec.processing.concurrency", "must be at least 1".into());
    }
    if s.max_replicas == 0 {
        return invalid("spec.scaling.maxReplicas", "must be at least 1".into());
    }
    if s.min_replicas > s.max_replicas {
        return invalid(
            "spec.scaling.minReplicas",
            format!(
                "{} exceeds maxReplicas {}: lower minReplicas or raise maxReplicas",
                s.min_replicas, s.max_replicas
            ),
        );
    }
    if s.max_backlog_age.is_zero() {
        return invalid(
            "spec.scaling.maxBacklogAge",
            "must be greater than 0s, e.g. 60s".into(),
        );
    }
    if s.poll_interval < Duration::from_secs(1) {
        return invalid(
            "spec.scaling.pollInterval",
            format!("{} is below 1s: use at least 1s, e.g. 15s", s.poll_interval),
        );
    }
    Ok(())
}
