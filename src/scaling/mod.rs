//! The replica policy: a pure function from the declared scaling spec, P99, concurrency, the queue's recent
//! samples and the current replica count to a decision (replicas, reason, what limited it). No I/O.
//!
//! The controller keeps one [`History`] per QueueConsumer and pushes a [`Sample`] every `pollInterval`; the
//! simulator (`sim`) drives the same function from a simulated queue. See docs/scaling.md.

pub mod fifo;
pub mod objective;
pub mod rate;
pub mod sim;

use std::collections::VecDeque;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;

use crate::api::conditions::reason as condition_reason;
use crate::api::{DEFAULT_STARTUP, Duration, QueueConsumerSpec, ScalingSpec};
use crate::aws::facts::QueueFacts;

/// Upper bound on retained samples whatever the window: a 1s poll interval and a one-hour window fit.
pub const MAX_SAMPLES: usize = 4096;

/// Why a sample could not be taken or kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScalingError {
    #[error("queue attribute {attribute} is missing, so the queue cannot be sampled for scaling")]
    SampleMissingCount { attribute: &'static str },
    #[error(
        "queue attribute {attribute} is negative ({value}), so the queue cannot be sampled for scaling"
    )]
    SampleNegativeCount { attribute: &'static str, value: i64 },
    #[error(
        "sample taken at {at}ms is not newer than the latest sample ({latest}ms): samples must be pushed in time order"
    )]
    PushOutOfOrder { at: u64, latest: u64 },
}

/// Milliseconds since an arbitrary epoch: the Unix epoch in the controller, the start of a run in the simulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Timestamp(u64);

impl Timestamp {
    pub const fn from_millis(ms: u64) -> Self {
        Timestamp(ms)
    }

    pub const fn from_secs(s: u64) -> Self {
        Timestamp(s.saturating_mul(1000))
    }

    /// A Kubernetes `Time` (times before the Unix epoch become the epoch).
    pub fn from_k8s(t: &Time) -> Self {
        Timestamp(u64::try_from(t.0.as_millisecond()).unwrap_or(0))
    }

    pub const fn as_millis(&self) -> u64 {
        self.0
    }

    /// How long after `earlier` this is (zero when it is not after it).
    pub fn since(&self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    pub fn saturating_sub(&self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_sub(duration_ms(d)))
    }

    pub fn saturating_add(&self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration_ms(d)))
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One reading of the queue's approximate counts (GetQueueAttributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// ApproximateNumberOfMessages: receivable now.
    pub visible: u64,
    /// ApproximateNumberOfMessagesNotVisible: received and not yet deleted.
    pub in_flight: u64,
    /// ApproximateNumberOfMessagesDelayed: not receivable yet, so not counted as work (see docs/scaling.md).
    pub delayed: u64,
    /// Messages the consumer's workers deleted since the previous sample, when known (their counters). With
    /// it the arrivals between two samples are counted, not estimated: Δ(visible + in flight) + deleted.
    /// None: the policy estimates the completions by Little's law (in flight / mean).
    pub deleted: Option<u64>,
    /// The age of the oldest visible message (ApproximateAgeOfOldestMessage), when known.
    pub oldest_age: Option<Duration>,
    pub at: Timestamp,
}

impl Sample {
    /// The counts of `facts` at `at`; an error when SQS left one out (the controller then holds replicas).
    pub fn from_facts(facts: &QueueFacts, at: Timestamp) -> Result<Sample, ScalingError> {
        fn count(v: Option<i64>, attribute: &'static str) -> Result<u64, ScalingError> {
            let value = v.ok_or(ScalingError::SampleMissingCount { attribute })?;
            u64::try_from(value).map_err(|_| ScalingError::SampleNegativeCount { attribute, value })
        }
        Ok(Sample {
            visible: count(facts.visible, "ApproximateNumberOfMessages")?,
            in_flight: count(facts.in_flight, "ApproximateNumberOfMessagesNotVisible")?,
            delayed: count(facts.delayed, "ApproximateNumberOfMessagesDelayed").unwrap_or(0),
            deleted: None,
            oldest_age: None,
            at,
        })
    }
}

/// Recent samples of one queue, oldest first, retained for the stabilization window (bounded).
#[derive(Clone, Debug, PartialEq)]
pub struct History {
    samples: VecDeque<Sample>,
    retention: Duration,
    first_at: Option<Timestamp>,
    /// The consumer's pods' measured start-up (creation to Ready), which `scaleDownStabilization: auto`
    /// holds for; None until measured.
    startup: Option<Duration>,
}

impl History {
    /// A history keeping samples no older than `retention` before the latest (and always the last two).
    pub fn new(retention: Duration) -> Self {
        History {
            samples: VecDeque::new(),
            retention,
            first_at: None,
            startup: None,
        }
    }

    /// A history for `spec` whose pods start in `startup` (None: not measured yet), with the retention
    /// of [`retention_for`].
    pub fn for_spec(spec: &ScalingSpec, startup: Option<Duration>) -> Self {
        let mut h = History::new(retention_for(spec, startup));
        h.startup = startup;
        h
    }

    /// The pods' measured start-up, for `scaleDownStabilization: auto` (retention follows on the next
    /// push when the caller also sets it).
    pub fn set_startup(&mut self, startup: Option<Duration>) {
        self.startup = startup;
    }

    pub fn startup(&self) -> Option<Duration> {
        self.startup
    }

    /// Adjust retention after a spec change; samples are kept, pruning happens on the next push.
    pub fn set_retention(&mut self, retention: Duration) {
        self.retention = retention;
    }

    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Record a sample; samples must come in time order.
    pub fn push(&mut self, sample: Sample) -> Result<(), ScalingError> {
        if let Some(latest) = self.samples.back()
            && sample.at <= latest.at
        {
            return Err(ScalingError::PushOutOfOrder {
                at: sample.at.as_millis(),
                latest: latest.at.as_millis(),
            });
        }
        self.first_at.get_or_insert(sample.at);
        self.samples.push_back(sample);
        let cutoff = sample.at.saturating_sub(self.retention);
        while self.samples.len() > 2
            && (self.samples.len() > MAX_SAMPLES
                || self.samples.front().is_some_and(|s| s.at < cutoff))
        {
            self.samples.pop_front();
        }
        Ok(())
    }

    /// Whether a new sample is due at `now`: none yet, or the latest is at least `poll_interval` old
    /// (reconciles triggered by watch events must not sample faster than the spec asks).
    pub fn is_due(&self, now: Timestamp, poll_interval: Duration) -> bool {
        self.latest()
            .is_none_or(|s| s.at.saturating_add(poll_interval) <= now)
    }

    pub fn latest(&self) -> Option<&Sample> {
        self.samples.back()
    }

    /// The sample before the latest one.
    pub fn previous(&self) -> Option<&Sample> {
        self.samples.iter().rev().nth(1)
    }

    pub fn samples(&self) -> impl DoubleEndedIterator<Item = &Sample> + ExactSizeIterator {
        self.samples.iter()
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Whether sampling began at least `window` before `now` (a fresh history, e.g. after a controller
    /// restart, must not scale down on a few readings).
    pub fn covers(&self, now: Timestamp, window: Duration) -> bool {
        self.first_at
            .is_some_and(|first| first.saturating_add(window) <= now)
    }
}

/// What [`History::for_spec`] retains: the stabilization window in force (`auto`: `startup`, see
/// [`ScalingSpec::scale_down_stabilization`]), plus maxBacklogAge before it (the in-flight term of its
/// oldest sample averages that span), plus one poll interval of slack.
pub fn retention_for(spec: &ScalingSpec, startup: Option<Duration>) -> Duration {
    spec.scale_down_stabilization
        .window(startup)
        .saturating_add(spec.max_backlog_age)
        .saturating_add(poll_interval(spec))
}

fn poll_interval(spec: &ScalingSpec) -> Duration {
    spec.poll_interval.max(Duration::from_secs(1))
}

/// [`measured_startup`] looks at the most recently created pods, this many.
pub const STARTUP_PODS: usize = 10;
/// A measured start-up above this is taken as this (an image pull stuck for an hour must not make
/// `auto` hold idle replicas for an hour, nor the history grow past [`MAX_SAMPLES`]).
pub const MAX_STARTUP: Duration = Duration::from_secs(600);

/// The pods' start-up that `scaleDownStabilization: auto` holds for, from (created, became Ready) pairs of
/// the consumer's worker pods: the median over the [`STARTUP_PODS`] most recently created (the upper
/// median of an even count), capped at [`MAX_STARTUP`]. A median, because one pod that waited for a node
/// or crash-looped before Ready must not set the hold of all; the most recent, because start-ups change
/// with images and nodes. None without a pod that became Ready (`auto` then holds 30s). Pairs where
/// Ready is not after creation count as zero.
pub fn measured_startup(pods: &[(Timestamp, Timestamp)]) -> Option<Duration> {
    let mut recent: Vec<&(Timestamp, Timestamp)> = pods.iter().collect();
    recent.sort_by_key(|(created, _)| std::cmp::Reverse(*created));
    recent.truncate(STARTUP_PODS);
    let mut took: Vec<Duration> = recent
        .iter()
        .map(|(created, ready)| ready.since(*created))
        .collect();
    took.sort();
    took.get(took.len() / 2).map(|d| (*d).min(MAX_STARTUP))
}

/// Percent: a scale-down goes only as low as leaves the remaining replicas this busy with the measured
/// load (scale-up still happens at full use). The band between the two is what keeps a load at the edge of
/// a replica from adding and removing it on every wobble (docs/scaling.md, "Damping churn").
pub const SCALE_DOWN_UTILIZATION: u32 = 90;

/// A scale-up by more replicas than this never waits for the next poll ([`Limit::Deferred`]): a step that
/// large comes with a backlog that needs the whole of maxBacklogAge to drain (a burst), not a load edging
/// past a replica.
pub const DEFER_MAX_STEP: u32 = 3;

/// The ramp lead reads the counted arrivals of this many consecutive poll intervals: it needs the rate to
/// have risen at each of the `RAMP_INTERVALS - 1` polls between them (docs/scaling.md, "Calm on ramps").
pub const RAMP_INTERVALS: usize = 4;

/// A sample older than this many poll intervals is stale: the policy holds rather than act on it.
pub const STALE_AFTER_POLLS: u32 = 3;

/// The workers' outage breakers at their last scrape: an input of the policy, so the hold it causes is
/// as pure as the rest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Downstream {
    /// Workers reporting their breaker open (intake paused: the handler's dependency is failing).
    pub open: u32,
    /// Workers whose /metrics answered.
    pub scraped: u32,
    /// FIFO: the message groups the scraped workers hold in all (None: they report none).
    pub fifo_groups: Option<u64>,
    /// With `scaling.objective`: the workers' dwell measurement over their window (None: not enough
    /// scrapes yet, or no objective).
    pub dwell: Option<objective::Measurement>,
}

impl Downstream {
    /// More than half of the scraped workers are open: the backlog grows because the dependency fails,
    /// not for want of replicas, so replicas are held (no scale-out feeding the failing dependency, no
    /// scale-in of the pods holding the paused messages).
    pub fn failing(&self) -> bool {
        u64::from(self.open) * 2 > u64::from(self.scraped)
    }
}

/// What the scaler is doing, in words an Event or condition message can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Reason {
    /// No sample yet, or the latest one is stale: replicas are held.
    MetricsUnavailable,
    /// From zero: the backlog exceeded `activationBacklog` on two consecutive samples.
    Activate,
    /// Raised at once to the recommendation.
    ScaleUp,
    /// Lowered, to the highest recommendation of the stabilization window.
    ScaleDown,
    /// Unchanged.
    Hold,
    /// Held: most workers report their outage breaker open ([`Downstream::failing`]).
    DownstreamFailing,
}

impl Reason {
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::MetricsUnavailable => "MetricsUnavailable",
            Reason::Activate => "Activate",
            Reason::ScaleUp => "ScaleUp",
            Reason::ScaleDown => "ScaleDown",
            Reason::Hold => "Hold",
            Reason::DownstreamFailing => "DownstreamFailing",
        }
    }
}

/// What kept the decision from the plain recommendation of the latest sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Limit {
    MinReplicas,
    MaxReplicas,
    /// A higher recommendation within `scaleDownStabilization` holds replicas up.
    Stabilization,
    /// Sampling began less than `scaleDownStabilization` ago: no scale-down yet.
    ShortHistory,
    /// Never below the replicas the current in-flight messages need.
    InFlight,
    /// At zero, waiting for the backlog to exceed `activationBacklog` on two consecutive samples.
    Activation,
    /// With a declared mean: a backlog waits and some replicas are not busy yet, i.e. still starting
    /// (a ready slot takes a visible message at once); they are what will drain it, so none is removed.
    Starting,
    /// The oldest visible message has less than a start-up plus P left before maxBacklogAge: a replica let
    /// go now could not come back in time.
    OldestAge,
    /// `processing.maxRate`: no more replicas than the rate keeps busy ([`rate::replica_cap`]).
    MaxRate,
    /// FIFO: no more replicas than the active message groups keep busy ([`fifo::replica_cap`]).
    MessageGroups,
    /// A scale-up of at most [`DEFER_MAX_STEP`] replicas waits for the next poll: the visible backlog is
    /// younger than maxBacklogAge less a poll, a start-up and P, so replicas asked for a poll later are still
    /// in time for it.
    Deferred,
    /// `scaling.objective`: more than 1 % of the workers' recent messages stayed longer than dwellP99 and
    /// messages wait: no replica is removed and no scale-up deferred ([`objective::with_objective`]).
    Objective,
}

impl Limit {
    pub fn as_str(&self) -> &'static str {
        match self {
            Limit::MinReplicas => "MinReplicas",
            Limit::MaxReplicas => "MaxReplicas",
            Limit::Stabilization => "Stabilization",
            Limit::ShortHistory => "ShortHistory",
            Limit::InFlight => "InFlight",
            Limit::Activation => "Activation",
            Limit::Starting => "Starting",
            Limit::OldestAge => "OldestAge",
            Limit::MaxRate => "MaxRate",
            Limit::MessageGroups => "MessageGroups",
            Limit::Deferred => "Deferred",
            Limit::Objective => "Objective",
        }
    }
}

/// The numbers behind a decision (for messages, status and tests).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Terms {
    pub visible: u64,
    /// Of `visible`, how many are new since the previous sample (with a declared mean; else 0).
    pub new_visible: u64,
    pub in_flight: u64,
    /// The in-flight term's input: the lowest of this sample's in-flight count, the mean of the samples
    /// within maxBacklogAge up to this one and, with a declared mean while a backlog waits, the arrivals'
    /// share (in flight + mean × growth per unit time).
    pub in_flight_mean: f64,
    /// ceil(that / C): replicas busy with the messages in flight.
    pub in_flight_replicas: u32,
    /// Replicas that drain the visible backlog in time, after the slots the in-flight term's rounding left
    /// free: ceil(visible / (C × maxBacklogAge / P)), or with a declared mean
    /// ceil(new / (C × maxBacklogAge / P) + seen / (C × (maxBacklogAge − P) / mean)).
    pub backlog_replicas: u32,
    /// C × maxBacklogAge / P: messages one replica drains within maxBacklogAge at the declared P99.
    pub backlog_per_replica: f64,
    /// C × (maxBacklogAge − P) / mean: the same for messages already seen, with a declared mean.
    pub seen_backlog_per_replica: Option<f64>,
    /// Highest recommendation of the stabilization window (samples newer than now − window, and the latest),
    /// when a scale-down consulted it.
    pub window_max: Option<u32>,
    /// Replicas a scale-up added for a rising ramp of arrivals (the ramp lead), or a scale-down kept for it,
    /// when it added or kept any.
    pub ramp_replicas: Option<u32>,
}

/// The policy's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub replicas: u32,
    /// The latest sample's recommendation, clamped to [minReplicas, maxReplicas], before stabilization.
    pub recommended: u32,
    pub reason: Reason,
    pub limited_by: Option<Limit>,
    /// None when no usable sample was available.
    pub terms: Option<Terms>,
}

impl Decision {
    /// The `ScalingActive` condition reason for this decision (HeldByValidation is the controller's).
    pub fn condition_reason(&self) -> &'static str {
        if self.reason == Reason::MetricsUnavailable {
            condition_reason::METRICS_UNAVAILABLE
        } else if self.reason == Reason::DownstreamFailing {
            condition_reason::DOWNSTREAM_FAILING
        } else if self.replicas == 0 {
            condition_reason::SCALED_TO_ZERO
        } else if self.limited_by == Some(Limit::MaxReplicas) {
            condition_reason::AT_MAX_REPLICAS
        } else if self.limited_by == Some(Limit::MaxRate) {
            condition_reason::AT_MAX_RATE
        } else {
            condition_reason::SCALING
        }
    }

    /// Whether the decision changes the replica count.
    pub fn changes(&self, current: u32) -> bool {
        self.replicas != current
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.reason == Reason::DownstreamFailing {
            return write!(
                f,
                "holding {} replicas: most workers report their outage breaker open (HandlerHealthy), the handler's dependency is failing; the queue alone would ask for {}; scaling resumes when they close",
                self.replicas, self.recommended
            );
        }
        let Some(t) = &self.terms else {
            return write!(
                f,
                "holding {} replicas: no recent queue sample",
                self.replicas
            );
        };
        write!(
            f,
            "{} replicas ({}): {} in flight (mean {:.1}) need {}, ",
            self.replicas,
            self.reason.as_str(),
            t.in_flight,
            t.in_flight_mean,
            t.in_flight_replicas,
        )?;
        match t.seen_backlog_per_replica {
            None => write!(
                f,
                "{} visible need {} (a replica drains {:.0} within maxBacklogAge)",
                t.visible, t.backlog_replicas, t.backlog_per_replica
            )?,
            Some(seen) => write!(
                f,
                "{} visible ({} new) need {} (a replica drains {:.0} new or {:.0} seen within maxBacklogAge)",
                t.visible, t.new_visible, t.backlog_replicas, t.backlog_per_replica, seen
            )?,
        }
        if let Some(w) = t.window_max {
            write!(f, "; stabilization window peak {w}")?;
        }
        if let Some(r) = t.ramp_replicas {
            write!(f, "; {r} more for the rising arrivals")?;
        }
        if let Some(l) = self.limited_by {
            write!(f, "; limited by {}", l.as_str())?;
        }
        Ok(())
    }
}

/// The policy for a whole QueueConsumer spec, with its workers' breakers: while most are open
/// ([`Downstream::failing`]) replicas are held at `current` (within [minReplicas, maxReplicas], which
/// the user may change during the incident), whatever the growing backlog asks for.
pub fn decide_for(
    spec: &QueueConsumerSpec,
    history: &History,
    current: u32,
    downstream: Downstream,
    now: Timestamp,
) -> Decision {
    // with an objective, the backlog drains within what it leaves after the handling
    let mut scaling = spec.scaling.clone();
    scaling.max_backlog_age = objective::backlog_target(&spec.scaling, spec.processing.p99);
    let queue = decide_with_waiting(
        &scaling,
        spec.processing.p99,
        spec.processing.mean,
        crate::validate::message_slots(spec),
        crate::validate::prefetch(spec),
        history,
        current,
        now,
    );
    if !downstream.failing() {
        let groups = if crate::aws::facts::is_fifo(&spec.queue.url) {
            fifo::cap_groups(
                spec.scaling.message_groups,
                downstream.fifo_groups,
                current,
                crate::validate::message_slots(spec),
            )
        } else {
            None
        };
        let visible = history.latest().map_or(0, |s| s.visible);
        let d = objective::with_objective(&spec.scaling, queue, current, downstream.dwell, visible);
        return with_group_cap(spec, with_rate_cap(spec, d, current), current, groups);
    }
    let min = spec.scaling.min_replicas.min(spec.scaling.max_replicas);
    let replicas = current.clamp(min, spec.scaling.max_replicas);
    Decision {
        replicas,
        recommended: queue.recommended,
        reason: Reason::DownstreamFailing,
        limited_by: match replicas.cmp(&current) {
            std::cmp::Ordering::Greater => Some(Limit::MinReplicas),
            std::cmp::Ordering::Less => Some(Limit::MaxReplicas),
            std::cmp::Ordering::Equal => None,
        },
        terms: queue.terms,
    }
}

/// `processing.maxRate` caps the decision at the replicas the rate keeps busy
/// ([`rate::replica_cap`], at least minReplicas: the user's floor wins); the reason follows the
/// capped count.
fn with_rate_cap(spec: &QueueConsumerSpec, mut d: Decision, current: u32) -> Decision {
    let Some(max_rate) = spec.processing.max_rate else {
        return d;
    };
    let per_message = spec.processing.mean.unwrap_or(spec.processing.p99);
    let cap = rate::replica_cap(max_rate, crate::validate::message_slots(spec), per_message)
        .max(spec.scaling.min_replicas.min(spec.scaling.max_replicas));
    if d.replicas <= cap || d.reason == Reason::MetricsUnavailable {
        return d;
    }
    d.replicas = cap;
    d.limited_by = Some(Limit::MaxRate);
    d.reason = match cap.cmp(&current) {
        std::cmp::Ordering::Greater if current == 0 => Reason::Activate,
        std::cmp::Ordering::Greater => Reason::ScaleUp,
        std::cmp::Ordering::Less => Reason::ScaleDown,
        std::cmp::Ordering::Equal => Reason::Hold,
    };
    d
}

/// FIFO: caps the decision at the replicas `groups` active message groups keep busy
/// ([`fifo::replica_cap`], at least minReplicas: the user's floor wins); None: no cap.
pub fn with_group_cap(
    spec: &QueueConsumerSpec,
    mut d: Decision,
    current: u32,
    groups: Option<u32>,
) -> Decision {
    let Some(groups) = groups else {
        return d;
    };
    let cap = fifo::replica_cap(groups, crate::validate::message_slots(spec))
        .max(spec.scaling.min_replicas.min(spec.scaling.max_replicas));
    if d.replicas <= cap || d.reason == Reason::MetricsUnavailable {
        return d;
    }
    d.replicas = cap;
    d.limited_by = Some(Limit::MessageGroups);
    d.reason = match cap.cmp(&current) {
        std::cmp::Ordering::Greater if current == 0 => Reason::Activate,
        std::cmp::Ordering::Greater => Reason::ScaleUp,
        std::cmp::Ordering::Less => Reason::ScaleDown,
        std::cmp::Ordering::Equal => Reason::Hold,
    };
    d
}

/// Replicas for a queue consumer (docs/scaling.md, "The algorithm"):
///
/// desired = ceil(inFlight / C) (if `scaleOnInFlight`) + ceil(visible / (C × maxBacklogAge / P)), clamped
/// to [min, max]; from zero only when visible > `activationBacklog` on the latest two samples; up at once;
/// down only to the highest recommendation of the stabilization window, and never below ceil(inFlight / C)
/// (maxReplicas still wins); no action on a missing or stale sample. The window holds the samples newer than
/// now − window (and the latest), so a scale-down to zero lands one window after the last busy sample. A
/// recommendation's in-flight term is the mean of maxBacklogAge of samples, see `Model::recommend`.
///
/// With a declared `mean` (and maxBacklogAge > P) the backlog term is refined (docs/scaling.md, "With a
/// declared mean"): messages already seen at the previous sample drain at the mean within
/// maxBacklogAge − P, new ones keep P over maxBacklogAge; while a backlog waits the in-flight term takes
/// the arrivals' share; and replicas still starting while a backlog waits are not removed
/// ([`Limit::Starting`]). Without a mean the formula above applies exactly.
///
/// With the workers' deleted count (counted arrivals, docs/scaling.md "Calm on ramps"), a scale-up of at
/// most [`DEFER_MAX_STEP`] replicas waits for the next poll while the visible backlog is young enough for
/// the replicas that poll would ask for ([`Limit::Deferred`]); after the arrival rate rose at each of the
/// last polls, a scale-up adds that rise continued for a poll and a start-up plus the economic step
/// √(2 · start-up · slope) (`Terms::ramp_replicas`), and a scale-down goes no lower than such a scale-up
/// would ask for.
pub fn decide(
    spec: &ScalingSpec,
    p99: Duration,
    mean: Option<Duration>,
    concurrency: u32,
    history: &History,
    current: u32,
    now: Timestamp,
) -> Decision {
    decide_with_waiting(spec, p99, mean, concurrency, 0, history, current, now)
}

/// [`decide`] for workers that may each hold `waiting` received messages beyond their `concurrency`
/// slots (the batch a worker with heartbeats receives before slots free up; `validate::prefetch`).
/// In flight above what the current replicas can run, up to `waiting` per replica, sits in those
/// local batches: it is backlog the replicas work through next, not load that needs replicas of its
/// own, so it counts as (seen) visible backlog. Without this a saturated fleet holding C + batchSize
/// messages per replica read as needing twice its replicas, and every scale-up made the next look
/// bigger (docs/scaling.md, "The waiting batch").
#[allow(clippy::too_many_arguments)]
pub fn decide_with_waiting(
    spec: &ScalingSpec,
    p99: Duration,
    mean: Option<Duration>,
    concurrency: u32,
    waiting: u32,
    history: &History,
    current: u32,
    now: Timestamp,
) -> Decision {
    let hold = |reason, limited_by, terms| Decision {
        replicas: current,
        recommended: current,
        reason,
        limited_by,
        terms,
    };
    let Some(latest) = history.latest() else {
        return hold(Reason::MetricsUnavailable, None, None);
    };
    let stale_after = poll_interval(spec).saturating_mul(STALE_AFTER_POLLS);
    if now.since(latest.at) > stale_after {
        return hold(Reason::MetricsUnavailable, None, None);
    }

    let model = Model::new(spec, p99, mean, concurrency);
    let running = u64::from(current).saturating_mul(model.concurrency);
    let held = u64::from(current).saturating_mul(u64::from(waiting));
    let owned: Vec<Sample> = history
        .samples()
        .map(|s| {
            let mut s = *s;
            let local = s.in_flight.saturating_sub(running).min(held);
            s.in_flight -= local;
            s.visible = s.visible.saturating_add(local);
            s
        })
        .collect();
    let samples: Vec<&Sample> = owned.iter().collect();
    let rec = model.recommend(&samples, samples.len() - 1);
    let mut terms = rec.terms;

    if current == 0 && model.min == 0 {
        let over = |s: &Sample| s.visible > u64::from(spec.activation_backlog);
        let activated = over(latest) && history.previous().is_some_and(over);
        if !activated {
            let waiting = rec.raw > 0;
            return Decision {
                replicas: 0,
                recommended: rec.clamped,
                reason: Reason::Hold,
                limited_by: waiting.then_some(Limit::Activation),
                terms: Some(terms),
            };
        }
        let replicas = rec.clamped.max(1).min(model.max);
        return Decision {
            replicas,
            recommended: rec.clamped,
            reason: if replicas > 0 {
                Reason::Activate
            } else {
                Reason::Hold
            },
            limited_by: rec.limit.or((replicas == 0).then_some(Limit::MaxReplicas)),
            terms: Some(terms),
        };
    }

    if rec.clamped >= current {
        let startup = history.startup().unwrap_or(DEFAULT_STARTUP);
        if rec.clamped > current
            && rec.clamped - current <= DEFER_MAX_STEP
            && current >= model.min
            && model.can_defer(&samples, spec, startup)
        {
            return Decision {
                replicas: current,
                recommended: rec.clamped,
                reason: Reason::Hold,
                limited_by: Some(Limit::Deferred),
                terms: Some(terms),
            };
        }
        let mut replicas = rec.clamped;
        if replicas > current {
            let lead = model.ramp_lead(&samples, poll_interval(spec), startup);
            let led = replicas.saturating_add(lead).min(model.max);
            if led > replicas {
                terms.ramp_replicas = Some(led - replicas);
                replicas = led;
            }
        }
        let reason = if replicas > current {
            Reason::ScaleUp
        } else {
            Reason::Hold
        };
        return Decision {
            replicas,
            recommended: rec.clamped,
            reason,
            limited_by: rec.limit,
            terms: Some(terms),
        };
    }

    // Scale-down path: the recommendation is below what runs now.
    let window = spec.scale_down_stabilization.window(history.startup());
    let since = now.saturating_sub(window);
    let mut limited_by = rec.limit;
    let mut target = if history.covers(now, window) {
        let window_max = (0..samples.len())
            .filter(|&i| samples[i].at > since)
            .map(|i| model.recommend(&samples, i).keep)
            .max()
            .unwrap_or(rec.keep)
            .max(rec.keep);
        terms.window_max = Some(window_max);
        if window_max > rec.clamped {
            limited_by = Some(Limit::Stabilization);
        }
        window_max.min(current)
    } else {
        limited_by = Some(Limit::ShortHistory);
        current
    };
    // on a ramp that still rises, a scale-down would take back what the lead asked for and the next poll
    // would ask for it again: go no lower than the scale-down's own sizing plus the lead
    if target < current {
        let startup = history.startup().unwrap_or(DEFAULT_STARTUP);
        let lead = model.ramp_lead(&samples, poll_interval(spec), startup);
        let keep = rec.keep.saturating_add(lead).min(current);
        if lead > 0 && keep > target {
            target = keep;
            terms.ramp_replicas = Some(lead);
        }
    }
    // with a mean, new messages are sized for a start-up and seen ones are not: keep the replicas asked for
    // until they are busy, or the sizing would shrink before they could help
    if model.mean_ms.is_some()
        && target < current
        && latest.visible > 0
        && latest.in_flight < u64::from(current).saturating_mul(model.concurrency)
    {
        target = current;
        limited_by = Some(Limit::Starting);
    }
    // a replica let go comes back only after a start-up: not while the oldest visible message has less than
    // a start-up plus P left before maxBacklogAge
    if target < current
        && latest.visible > 0
        && latest.oldest_age.is_some_and(|age| {
            age.saturating_add(history.startup().unwrap_or(DEFAULT_STARTUP))
                .saturating_add(p99)
                > spec.max_backlog_age
        })
    {
        target = current;
        limited_by = Some(Limit::OldestAge);
    }
    let floor = current.min(saturate_u32(
        latest.in_flight.div_ceil(u64::from(concurrency.max(1))),
    ));
    if target < floor {
        target = floor;
        limited_by = Some(Limit::InFlight);
    }
    if target > model.max {
        target = model.max;
        limited_by = Some(Limit::MaxReplicas);
    }
    Decision {
        replicas: target,
        recommended: rec.clamped,
        reason: if target < current {
            Reason::ScaleDown
        } else {
            Reason::Hold
        },
        limited_by,
        terms: Some(terms),
    }
}

/// The spec's numbers, guarded against values the CRD rejects (the pure core must not divide by zero).
struct Model {
    min: u32,
    max: u32,
    concurrency: u64,
    /// P and maxBacklogAge in milliseconds: the backlog term is computed in integers, exactly.
    p99_ms: u128,
    age_ms: u128,
    /// The declared mean, when it refines the sizing (declared and maxBacklogAge > P); None: the base
    /// formula exactly.
    mean_ms: Option<u128>,
    /// What a seen message costs a slot, and the time the seen backlog has to drain: mean and
    /// maxBacklogAge − P with a mean, else P and maxBacklogAge.
    seen_drain_ms: u128,
    seen_budget_ms: u128,
    scale_on_in_flight: bool,
    /// The in-flight term averages the samples of this span (maxBacklogAge).
    smooth_ms: u64,
}

struct Recommendation {
    raw: u64,
    clamped: u32,
    /// What a scale-down may go to from this sample: the recommendation with the arrivals' load sized at
    /// [`SCALE_DOWN_UTILIZATION`] (never below `clamped`).
    keep: u32,
    limit: Option<Limit>,
    terms: Terms,
}

impl Model {
    fn new(spec: &ScalingSpec, p99: Duration, mean: Option<Duration>, concurrency: u32) -> Model {
        let c = concurrency.max(1);
        let p99_ms = p99.as_millis().max(1);
        let age_ms = spec.max_backlog_age.as_millis().max(1);
        // with maxBacklogAge ≤ P there is no time left after the tail allowance: the base formula
        let mean_ms = mean
            .map(|m| m.as_millis().max(1))
            .filter(|_| age_ms > p99_ms);
        let (seen_drain_ms, seen_budget_ms) = match mean_ms {
            Some(m) => (m, age_ms - p99_ms),
            None => (p99_ms, age_ms),
        };
        Model {
            min: spec.min_replicas.min(spec.max_replicas),
            max: spec.max_replicas,
            concurrency: u64::from(c),
            p99_ms,
            age_ms,
            mean_ms,
            seen_drain_ms,
            seen_budget_ms,
            scale_on_in_flight: spec.scale_on_in_flight,
            smooth_ms: u64::try_from(age_ms).unwrap_or(u64::MAX),
        }
    }

    /// Messages one replica drains within maxBacklogAge: (new, seen) in the Display's terms.
    fn per_replica(&self) -> (f64, Option<f64>) {
        let c = self.concurrency as f64;
        let new = c * self.age_ms as f64 / self.p99_ms as f64;
        let seen = self
            .mean_ms
            .map(|_| c * self.seen_budget_ms as f64 / self.seen_drain_ms as f64);
        (new, seen)
    }

    /// Whether a scale-up may wait for the next poll (docs/scaling.md, "Calm on ramps"): the visible
    /// backlog is younger than maxBacklogAge less a poll, a start-up and P, so the replicas the next poll
    /// asks for are still in time for it. The backlog's age is read from the counted arrivals of the last
    /// interval (the visible messages are the latest ones: visible / arrival rate), and from CloudWatch's
    /// oldest age when the sample has one (whichever is older: CloudWatch's lags, so it alone could say a
    /// backlog is young when it is not). Without a counted arrivals figure nothing waits.
    fn can_defer(&self, samples: &[&Sample], spec: &ScalingSpec, startup: Duration) -> bool {
        let [.., prev, latest] = samples else {
            return false;
        };
        let spare = spec
            .max_backlog_age
            .as_millis()
            .saturating_sub(poll_interval(spec).as_millis())
            .saturating_sub(startup.as_millis())
            .saturating_sub(self.p99_ms);
        if spare == 0 || latest.oldest_age.is_some_and(|age| age.as_millis() > spare) {
            return false;
        }
        let Some((arrived, dt)) = arrivals(prev, latest) else {
            return false;
        };
        // visible / (arrived / dt) ≤ spare, in integers
        u128::from(latest.visible) * u128::from(dt) <= u128::from(arrived) * spare
    }

    /// Replicas a scale-up adds for a ramp (docs/scaling.md, "Calm on ramps"): when the arrival rate rose
    /// at each of the last [`RAMP_INTERVALS`] − 1 polls, the smallest of those rises per poll is the ramp's
    /// slope, at the mean's (else P's) slots per message. The lead is that slope continued for a poll and
    /// a start-up (until the replicas the next poll could ask for are ready), plus the economic step on
    /// top: with a scale event priced at one start-up S of a replica (what `auto` prices an idle hold at)
    /// and a replica added x seconds before the ramp needs it costing x replica-seconds, steps of
    /// √(2 · S · slope) replicas (the economic order quantity) cost least per second of ramp. A spike rises
    /// once and a steady load wobbles, so neither rises at every poll; 0 without counted arrivals.
    fn ramp_lead(&self, samples: &[&Sample], poll: Duration, startup: Duration) -> u32 {
        if samples.len() <= RAMP_INTERVALS {
            return 0;
        }
        // arrival rates in messages per 1000 s, oldest first
        let mut rates = Vec::with_capacity(RAMP_INTERVALS);
        let mut last_dt = 1u64;
        for w in samples[samples.len() - RAMP_INTERVALS - 1..].windows(2) {
            let Some((arrived, dt)) = arrivals(w[0], w[1]) else {
                return 0;
            };
            rates.push(u128::from(arrived) * 1_000_000 / u128::from(dt));
            last_dt = dt;
        }
        let rise = rates
            .windows(2)
            .map(|r| r[1].saturating_sub(r[0]))
            .min()
            .unwrap_or(0);
        if rise == 0 {
            return 0;
        }
        // slots = rise per poll × (ahead / poll) × seconds per message; the rates' unit and the ms of the
        // mean make the numerator a million × last_dt times the slots
        let ahead_ms = poll.as_millis().saturating_add(startup.as_millis());
        let slots_x = rise
            .saturating_mul(ahead_ms)
            .saturating_mul(self.seen_drain_ms);
        // the economic step in slots: √(2 · S · slope · C), the slope in slots per second being
        // rise × mean / (last_dt × 1000) in these units; scaled like slots_x, √(2 · S_ms · rise · mean_ms
        // · C · last_dt · 10⁶)
        let step_x = 2u128
            .saturating_mul(startup.as_millis())
            .saturating_mul(rise)
            .saturating_mul(self.seen_drain_ms)
            .saturating_mul(u128::from(self.concurrency))
            .saturating_mul(u128::from(last_dt))
            .saturating_mul(1_000_000)
            .isqrt();
        let per_replica = u128::from(last_dt) * u128::from(self.concurrency) * 1_000_000;
        u32::try_from(slots_x.saturating_add(step_x).div_ceil(per_replica)).unwrap_or(u32::MAX)
    }

    /// The recommendation of `samples[i]`. Refinements inside the base formula, all pure functions of the
    /// samples (docs/scaling.md, "Recommendation"): the in-flight term uses the mean in-flight count of
    /// the samples within maxBacklogAge up to this one, because one reading of a busy queue jitters by
    /// ±√n and the window's highest reading would otherwise hold one or two replicas too many; the
    /// backlog term first fills the slots that rounding the in-flight term up left free, so a handful of
    /// messages caught waiting at the sample instant does not start a replica the rounding already paid
    /// for. With a declared mean, two more: while a backlog waits, the in-flight count measures the
    /// replicas' capacity rather than the arrivals, so the term takes the arrivals' share by Little's law
    /// (in flight + mean × growth of visible + in flight per unit time); and visible messages already seen
    /// at the previous sample drain at the mean within maxBacklogAge − P, while those new since then keep
    /// the base formula's P sizing (their replicas still have a whole start-up ahead).
    fn recommend(&self, samples: &[&Sample], i: usize) -> Recommendation {
        let s = samples[i];
        let prev = i.checked_sub(1).map(|j| samples[j]);
        let from = s.at.as_millis().saturating_sub(self.smooth_ms);
        let (mut sum, mut n) = (0u128, 0u128);
        for x in samples[..=i].iter().rev() {
            if n > 0 && x.at.as_millis() <= from {
                break;
            }
            sum += u128::from(x.in_flight);
            n += 1;
        }
        // the mean only ever lowers a reading (a sample with nothing in flight stays at 0, so the scale-down
        // to zero is not delayed); work as n × messages to stay in integers
        let own = u128::from(s.in_flight) * n;
        if own < sum {
            sum = own;
        }
        // the slots the arrivals since the previous sample keep busy, λ × mean, as (slots × dt, dt): arrivals
        // are Δ(visible + in flight) + deleted; without a deleted count, completions × mean is estimated
        // as in flight (Little's law)
        let load = match (self.mean_ms, prev) {
            (Some(mean_ms), Some(p)) => {
                let dt = u128::from(s.at.as_millis().saturating_sub(p.at.as_millis()).max(1));
                let work =
                    |x: &Sample| i128::from(x.visible).saturating_add(i128::from(x.in_flight));
                let growth = work(s).saturating_sub(work(p));
                let mean = i128::try_from(mean_ms).unwrap_or(i128::MAX);
                let x = match s.deleted {
                    Some(d) => mean.saturating_mul(growth.saturating_add(i128::from(d))),
                    None => i128::from(s.in_flight)
                        .saturating_mul(i128::try_from(dt).unwrap_or(i128::MAX))
                        .saturating_add(mean.saturating_mul(growth)),
                };
                Some((u128::try_from(x.max(0)).unwrap_or(0), dt))
            }
            _ => None,
        };
        if let Some((load_x_dt, dt)) = load
            && s.visible > 0
        {
            // while a backlog waits, in flight measures the ready capacity, not the arrivals: take the
            // arrivals' share; like the mean, it only lowers the term (a growing backlog is the backlog
            // term's job)
            let arrivals_n = load_x_dt.saturating_mul(n).div_ceil(dt);
            if arrivals_n < sum {
                sum = arrivals_n;
            }
        }
        let c = u128::from(self.concurrency);
        let in_flight_replicas_u = sum.div_ceil(n * c);
        let in_flight_replicas = u64::try_from(in_flight_replicas_u).unwrap_or(u64::MAX);
        // n × the slots left free by rounding the in-flight term up; the backlog term is credited with what
        // those slots handle within its time
        let slack_n = if self.scale_on_in_flight {
            in_flight_replicas_u * c * n - sum
        } else {
            0
        };
        // slot-time in units of 1 / (seen budget × age): a new message costs P over maxBacklogAge, a seen
        // one its drain time over its budget (the same P over maxBacklogAge without a mean)
        let new_visible = match (self.mean_ms, prev) {
            (None, _) => 0,
            (Some(_), None) => s.visible,
            (Some(_), Some(p)) => s.visible.saturating_sub(p.visible),
        };
        let seen_visible = s.visible - new_visible;
        let den = self.seen_budget_ms * self.age_ms;
        let need = u128::from(seen_visible)
            .saturating_mul(self.seen_drain_ms * self.age_ms)
            .saturating_add(
                u128::from(new_visible).saturating_mul(self.p99_ms * self.seen_budget_ms),
            )
            .saturating_mul(n)
            .saturating_sub(slack_n.saturating_mul(den));
        let backlog_replicas = u64::try_from(need.div_ceil(c * den * n)).unwrap_or(u64::MAX);
        let raw = if self.scale_on_in_flight {
            in_flight_replicas
        } else {
            0
        }
        .saturating_add(backlog_replicas);
        let (clamped, limit) = if raw > u64::from(self.max) {
            (self.max, Some(Limit::MaxReplicas))
        } else if raw < u64::from(self.min) {
            (self.min, Some(Limit::MinReplicas))
        } else {
            (u32::try_from(raw).unwrap_or(self.max), None)
        };
        // scale-down: the load (the arrivals' λ × mean, else the in-flight term's input) at
        // SCALE_DOWN_UTILIZATION, so a load at the edge of a replica does not flap across it
        let keep_in_flight = if !self.scale_on_in_flight || (s.in_flight == 0 && s.visible == 0) {
            0
        } else {
            let (x, d) = load.unwrap_or((sum, n));
            u64::try_from(
                x.saturating_mul(100)
                    .div_ceil(d * c * u128::from(SCALE_DOWN_UTILIZATION)),
            )
            .unwrap_or(u64::MAX)
        };
        let keep_raw = keep_in_flight.saturating_add(backlog_replicas).max(raw);
        let keep = u32::try_from(keep_raw.clamp(u64::from(self.min), u64::from(self.max)))
            .unwrap_or(self.max);
        let (per_new, per_seen) = self.per_replica();
        Recommendation {
            raw,
            clamped,
            keep: keep.max(clamped),
            limit,
            terms: Terms {
                visible: s.visible,
                new_visible,
                in_flight: s.in_flight,
                in_flight_mean: sum as f64 / n as f64,
                in_flight_replicas: saturate_u32(in_flight_replicas),
                backlog_replicas: saturate_u32(backlog_replicas),
                backlog_per_replica: per_new,
                seen_backlog_per_replica: per_seen,
                window_max: None,
                ramp_replicas: None,
            },
        }
    }
}

/// Messages sent between two samples, counted: Δ(visible + in flight) + the workers' deletes, with the
/// interval in ms; None without a deleted count or when the samples are not in time order.
fn arrivals(prev: &Sample, s: &Sample) -> Option<(u64, u64)> {
    let deleted = s.deleted?;
    let dt = s.at.as_millis().checked_sub(prev.at.as_millis())?;
    if dt == 0 {
        return None;
    }
    let work = |x: &Sample| i128::from(x.visible) + i128::from(x.in_flight);
    let arrived = (work(s) - work(prev) + i128::from(deleted)).max(0);
    Some((u64::try_from(arrived).unwrap_or(u64::MAX), dt))
}

fn saturate_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod rate_cap_tests {
    use super::*;

    fn spec(yaml: &str) -> QueueConsumerSpec {
        let handler = if yaml.contains("handler:") {
            ""
        } else {
            "handler: {http: {}}\n"
        };
        let base = "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\n";
        serde_saphyr::from_str(&format!("{base}{handler}{yaml}")).expect("test spec parses")
    }

    fn busy(visible: u64) -> (History, Timestamp) {
        let mut h = History::new(Duration::from_secs(600));
        for t in [0u64, 15] {
            h.push(Sample {
                visible,
                in_flight: 0,
                delayed: 0,
                deleted: None,
                oldest_age: None,
                at: Timestamp::from_secs(t),
            })
            .expect("in order");
        }
        (h, Timestamp::from_secs(15))
    }

    #[test]
    fn the_rate_caps_replicas_at_what_it_keeps_busy() {
        // 10 slots at a mean of 1s: 10/s a replica, so 30/s keeps 3 busy; the backlog alone asks for 20.
        let s = spec(
            "processing: {p99: 2s, mean: 1s, maxRate: 30}\nscaling: {maxReplicas: 20, maxBacklogAge: 10s}",
        );
        let (h, now) = busy(100_000);
        let up = decide_for(&s, &h, 1, Downstream::default(), now);
        assert_eq!(up.replicas, 3);
        assert_eq!(up.limited_by, Some(Limit::MaxRate));
        assert_eq!(up.reason, Reason::ScaleUp);
        assert_eq!(up.condition_reason(), "AtMaxRate");
        // Above the cap (maxRate lowered): down to it.
        let down = decide_for(&s, &h, 8, Downstream::default(), now);
        assert_eq!((down.replicas, down.reason), (3, Reason::ScaleDown));
        // At the cap: held.
        let held = decide_for(&s, &h, 3, Downstream::default(), now);
        assert_eq!((held.replicas, held.reason), (3, Reason::Hold));
        // Without maxRate the backlog's answer stands.
        let free =
            spec("processing: {p99: 2s, mean: 1s}\nscaling: {maxReplicas: 20, maxBacklogAge: 10s}");
        assert_eq!(
            decide_for(&free, &h, 1, Downstream::default(), now).replicas,
            20
        );
    }

    #[test]
    fn on_a_fifo_queue_the_declared_groups_cap_replicas() {
        // 8 groups, 2 slots a replica: 10 useful slots, 5 replicas; the backlog alone asks for 20.
        let fifo = |extra: &str| {
            let base =
                "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q.fifo}\nhandler: {http: {}}\n";
            serde_saphyr::from_str::<QueueConsumerSpec>(&format!(
                "{base}processing: {{p99: 2s, mean: 1s, concurrency: 2}}\nscaling: {{maxReplicas: 20, maxBacklogAge: 10s{extra}}}"
            ))
            .expect("test spec parses")
        };
        let (h, now) = busy(100_000);
        let d = decide_for(
            &fifo(", messageGroups: 8"),
            &h,
            1,
            Downstream::default(),
            now,
        );
        assert_eq!((d.replicas, d.limited_by), (5, Some(Limit::MessageGroups)));
        assert_eq!(d.reason, Reason::ScaleUp);
        assert!(d.to_string().contains("limited by MessageGroups"), "{d}");
        assert_eq!(
            decide_for(&fifo(""), &h, 1, Downstream::default(), now).replicas,
            20,
            "no declared groups: no cap"
        );
        // A standard queue ignores messageGroups.
        let standard = spec(
            "processing: {p99: 2s, mean: 1s, concurrency: 2}\nscaling: {maxReplicas: 20, maxBacklogAge: 10s, messageGroups: 8}",
        );
        assert_eq!(
            decide_for(&standard, &h, 1, Downstream::default(), now).replicas,
            20
        );
    }

    #[test]
    fn min_replicas_wins_over_the_rate_cap() {
        let s = spec(
            "processing: {p99: 1s, maxRate: 1}\nscaling: {minReplicas: 4, maxReplicas: 20, maxBacklogAge: 10s}",
        );
        let (h, now) = busy(100_000);
        let d = decide_for(&s, &h, 4, Downstream::default(), now);
        assert_eq!(d.replicas, 4);
    }

    #[test]
    fn batch_mode_counts_messages_per_call() {
        // 2 calls × 10 items at P99 2s: 10 messages/s a replica; 25/s keeps 3.
        let s = spec(
            "processing: {p99: 2s, concurrency: 2, maxRate: 25}\nhandler: {http: {}, batch: {maxItems: 10}}\nscaling: {maxReplicas: 50, maxBacklogAge: 10s}",
        );
        let (h, now) = busy(100_000);
        assert_eq!(
            decide_for(&s, &h, 1, Downstream::default(), now).replicas,
            3
        );
    }
}

#[cfg(test)]
mod ramp_tests {
    use super::*;

    fn spec() -> ScalingSpec {
        ScalingSpec {
            max_replicas: 20,
            ..ScalingSpec::default()
        }
    }

    /// Five samples 15 s apart with `in_flight` in flight and nothing visible, whose workers deleted
    /// `deletes` in the four intervals: the counted arrival rates are deletes / 15 s.
    fn ramp(deletes: [u64; 4], in_flight: u64) -> Vec<Sample> {
        let mut samples = vec![Sample {
            visible: 0,
            in_flight,
            delayed: 0,
            deleted: Some(0),
            oldest_age: None,
            at: Timestamp::from_secs(0),
        }];
        for (i, d) in deletes.iter().enumerate() {
            samples.push(Sample {
                deleted: Some(*d),
                at: Timestamp::from_secs(15 * (i as u64 + 1)),
                ..samples[0]
            });
        }
        samples
    }

    fn lead(mean: Option<Duration>, deletes: [u64; 4], startup: Duration) -> u32 {
        let model = Model::new(&spec(), Duration::from_secs(2), mean, 10);
        let samples = ramp(deletes, 20);
        let refs: Vec<&Sample> = samples.iter().collect();
        model.ramp_lead(&refs, Duration::from_secs(15), startup)
    }

    /// A ramp rising r msg/s a poll needs slope = r / 15 s × mean slots more each second. The lead is that
    /// slope continued for a poll and a start-up, plus the economic step √(2 · S · slope · C) slots (a scale
    /// event priced at one start-up S of a replica, a replica added early at its idle seconds): the step
    /// grows as the square root of the slope, so a steeper ramp takes fewer, larger steps.
    #[test]
    fn the_ramp_lead_adds_the_economic_step_to_a_poll_and_a_start_up_of_the_rise() {
        let mean = Some(Duration::from_millis(800));
        let s30 = Duration::from_secs(30);
        // rise (msg/s a poll) → deletes; slope 0.16 slots/s: 0.16 × 45 = 7.2 slots, + √(2 · 30 · 0.16 · 10)
        // = 9.8: 17 slots, 2 replicas (the rise alone: 1)
        assert_eq!(lead(mean, [150, 195, 240, 285], s30), 2);
        // four times as steep, 0.64 slots/s: 28.8 + √384 = 19.6: 48.4 slots, 5 replicas (the rise alone: 3)
        assert_eq!(lead(mean, [150, 330, 510, 690], s30), 5);
        // a 60 s start-up: the slope runs 75 s (12 slots) and an event costs twice as much, √192 = 13.9:
        // 25.9 slots, 3 replicas
        assert_eq!(lead(mean, [150, 195, 240, 285], Duration::from_secs(60)), 3);
        // without a mean, P (2 s) per message: 0.4 slots/s, 18 + √240 = 15.5: 33.5 slots, 4 replicas
        assert_eq!(lead(None, [150, 195, 240, 285], s30), 4);
        // a flat rate, a step then flat (a spike), a fall at the last poll: no ramp, no lead
        assert_eq!(lead(mean, [285, 285, 285, 285], s30), 0);
        assert_eq!(lead(mean, [150, 300, 300, 300], s30), 0);
        assert_eq!(lead(mean, [150, 195, 240, 200], s30), 0);
    }

    /// 9 replicas with 20 in flight and nothing visible (P 2 s, no mean, C 10): the in-flight term asks for
    /// 2, the band for ceil(20 / 9) = 3. With flat arrivals that is where the scale-down goes; with arrivals
    /// rising 3/s at each poll, replicas the lead would ask for again (4: 18 slots for the rise over a poll
    /// and a start-up, 15.5 for the economic step) are kept: down to 3 + 4 = 7, not 3.
    #[test]
    fn no_scale_down_below_the_ramp_lead_while_the_arrivals_still_rise() {
        let s = spec();
        let decide_on = |deletes: [u64; 4], current: u32| {
            let mut h = History::new(Duration::from_secs(600));
            for sample in ramp(deletes, 20) {
                h.push(sample).expect("in order");
            }
            decide(
                &s,
                Duration::from_secs(2),
                None,
                10,
                &h,
                current,
                Timestamp::from_secs(60),
            )
        };
        let flat = decide_on([285, 285, 285, 285], 9);
        assert_eq!(
            (flat.replicas, flat.reason),
            (3, Reason::ScaleDown),
            "{flat}"
        );
        assert_eq!(flat.terms.and_then(|t| t.ramp_replicas), None, "{flat}");

        let rising = decide_on([150, 195, 240, 285], 9);
        assert_eq!(
            (rising.replicas, rising.reason),
            (7, Reason::ScaleDown),
            "{rising}"
        );
        assert_eq!(rising.terms.and_then(|t| t.ramp_replicas), Some(4));
        assert!(
            rising
                .to_string()
                .contains("4 more for the rising arrivals"),
            "{rising}"
        );
        // at or below what the lead keeps, a rising ramp holds
        let held = decide_on([150, 195, 240, 285], 6);
        assert_eq!((held.replicas, held.reason), (6, Reason::Hold), "{held}");
    }
}
