//! The status a reconcile writes, computed from what it observed and decided: the conditions of
//! docs/controller.md ("Status"), findings, queue and DLQ blocks. Pure; `lastTransitionTime` moves only when a status flips.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::conditions::{self, reason};
use crate::api::{
    DeadLetterStatus, Duration, QueueConsumer, QueueConsumerStatus, QueueStatus, RedriveStatus,
};
use crate::aws::{DeadLetterFacts, Facts, ObserveError};
use crate::render;
use crate::validate::Report;

use super::apply::Applied;
use super::pipeline::{Observation, ReplicaDecision, Rollout};
use super::target::TargetRead;
use super::workers::{MIN_MESSAGES, Stats, TOLERANCE};
use crate::api::Mode;

/// Offline (`plan` without `--live`), the DLQ is not read: its health is unknown for that reason.
pub const DEAD_LETTER_QUEUE_NOT_READ: &str = "DeadLetterQueueNotRead";
/// A Deployment named like the QueueConsumer exists and is not controlled by it.
pub const DEPLOYMENT_NOT_OWNED: &str = "DeploymentNotOwned";
/// Offline, the queue is not read at all.
pub const QUEUE_NOT_READ: &str = "QueueNotRead";
const OFFLINE: &str = "not read: plan ran offline (use --live or --attributes FILE)";

/// The managed CloudWatch alarm, as far as status is concerned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AlarmStatus {
    pub name: Option<String>,
    pub state: Option<String>,
    /// What this reconcile's alarm step did: the AlarmSynced condition.
    pub sync: AlarmSync,
}

/// The alarm step's outcome.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum AlarmSync {
    /// CloudWatch was not asked (queue unreadable, or `plan` offline): the last condition stays.
    #[default]
    NotChecked,
    /// The alarm exists as planned.
    InSync,
    /// No alarm should exist (alarm off, or no DLQ) and none of ours does.
    NotManaged,
    /// A CloudWatch call (or the finalizer write) failed.
    Failed {
        reason: &'static str,
        message: String,
    },
    /// What CloudWatch last said is too old to go by (and no call failed).
    Unknown {
        reason: &'static str,
        message: String,
    },
}

/// Everything status is computed from.
pub struct StatusInputs<'a> {
    pub qc: &'a QueueConsumer,
    pub facts: Observation<'a>,
    pub report: &'a Report,
    pub rollout: &'a Rollout,
    /// The live Deployment after apply (None when it does not exist, and in scale-only mode).
    pub deployment: Option<&'a Deployment>,
    /// Scale-only mode: the target's `/scale` as read (and written) in this reconcile; None in the
    /// bundled worker's mode and when it was not read (`plan`).
    pub target: Option<&'a TargetRead>,
    /// What this reconcile's apply wrote (None: nothing). A new pod template starts a rollout, which
    /// the Deployment's status cannot show yet.
    pub applied: Option<Applied>,
    pub alarm: AlarmStatus,
    /// The scaling step's answer for the Deployment as it is after apply.
    pub replicas: &'a ReplicaDecision,
    /// When the scaler wrote `spec.replicas` in this reconcile (None when it did not).
    pub scaled_at: Option<Time>,
    /// When the facts were read (the cache may hand out an earlier read).
    pub sampled_at: Option<Time>,
    /// The redrive step's status block (None: no redrive was ever asked for).
    pub redrive: Option<RedriveStatus>,
    /// The automatic redrive after recovery's block (None: never ran).
    pub redrive_after_recovery: Option<RedriveStatus>,
    /// What the worker pods' /metrics said; None when they were not read (`plan`).
    pub workers: Option<&'a Workers>,
    pub now: Time,
}

impl StatusInputs<'_> {
    /// The condition of type `t` in the status the QueueConsumer has now (before this reconcile's).
    fn last_condition(&self, t: &str) -> Option<&Condition> {
        self.qc
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == t))
    }
}

/// The worker pods as the reconcile saw them: the window's statistics and the pods' health.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workers {
    pub stats: Option<Stats>,
    /// Pods that answered, and ready pods that did not, at the last scrape.
    pub pods: usize,
    pub unreachable: usize,
    /// Messages in flight on the pods that answered.
    pub in_flight: i64,
    /// Of the pods that answered, those whose outage breaker is open.
    pub breaker_open: usize,
    /// When the last scrape was made.
    pub sampled_at: Option<Time>,
    /// Pods whose containers crash-loop ("pod/container: restarted N times"), for `RolloutStalled`.
    pub crash_looping: Vec<String>,
    /// This process's scrapes span less than a poll interval (it just started, took over as leader,
    /// or the consumer is new): its window says less than a full one would.
    pub warming_up: bool,
    /// FIFO: the groups the pods hold in all and their reported heads (None: no pod reports groups).
    pub fifo: Option<(u64, Vec<crate::scaling::fifo::GroupHead>)>,
    /// With `scaling.objective`: the dwell measurement over the window (None: no delta yet).
    pub dwell: Option<crate::scaling::objective::Measurement>,
}

impl Workers {
    /// The scaling policy's view of the workers' breakers.
    pub fn downstream(&self) -> crate::scaling::Downstream {
        crate::scaling::Downstream {
            open: u32::try_from(self.breaker_open).unwrap_or(u32::MAX),
            scraped: u32::try_from(self.pods).unwrap_or(u32::MAX),
            fifo_groups: self.fifo.as_ref().map(|(held, _)| *held),
            dwell: self.dwell,
        }
    }
}

/// The status to write. Blocks that cannot be refreshed (queue unreachable) keep their last values,
/// dated by `sampledAt`.
pub fn build(i: &StatusInputs<'_>) -> QueueConsumerStatus {
    let old = i.qc.status.clone().unwrap_or_default();
    let name = i.qc.metadata.name.clone().unwrap_or_default();
    let generation = i.qc.metadata.generation;

    let queue_reachable = queue_reachable(i);
    let config_valid = config_valid(i);
    let dead_letter = dead_letter_healthy(i);
    let scaling = scaling_active(i);
    let ready = ready(i, &queue_reachable, &config_valid, &name);
    let processing = processing_time(i);
    let handler = handler_healthy(i);
    let fifo_groups = fifo_groups_healthy(i);
    let objective = objective_met(i);
    let as_condition = |c: Cond| Condition {
        type_: c.type_.to_string(),
        status: c.status.as_str().to_string(),
        reason: c.reason.to_string(),
        message: c.message,
        observed_generation: generation,
        last_transition_time: i.now.clone(),
    };
    // The optional ones (FIFO groups, scale-only mode) only where they apply.
    let mut fresh = [
        ready,
        queue_reachable,
        config_valid,
        dead_letter,
        scaling,
        processing,
        handler,
    ]
    .into_iter()
    .chain(fifo_groups)
    .chain(scale_only(i))
    .chain(objective)
    .map(as_condition)
    .collect::<Vec<_>>();
    fresh.extend(alarm_synced(i, &old.conditions));
    let conditions = merge_conditions(&old.conditions, fresh);

    let (queue, dead_letter_block) = match i.facts {
        Observation::Read(f) => (
            Some(queue_block(f, i.sampled_at.clone(), old.queue.as_ref())),
            dead_letter_block(f, &i.alarm, old.dead_letter.as_ref()),
        ),
        Observation::Failed(_) | Observation::Offline => {
            let mut dl = old.dead_letter.clone();
            if let Some(d) = dl.as_mut() {
                d.alarm_name = i.alarm.name.clone().or(d.alarm_name.take());
                d.alarm_state = i.alarm.state.clone().or(d.alarm_state.take());
            }
            (old.queue.clone(), dl)
        }
    };

    let dead_letter_block = match (
        dead_letter_block,
        i.redrive.clone(),
        i.redrive_after_recovery.clone(),
    ) {
        (Some(mut d), redrive, auto) => {
            d.redrive = redrive;
            d.redrive_after_recovery = auto;
            Some(d)
        }
        (None, None, None) => None,
        (None, redrive, auto) => Some(DeadLetterStatus {
            redrive,
            redrive_after_recovery: auto,
            ..DeadLetterStatus::default()
        }),
    };

    QueueConsumerStatus {
        observed_generation: generation,
        conditions,
        findings: i.report.findings.clone(),
        queue,
        dead_letter: dead_letter_block,
        observed: match i.workers {
            Some(w) => observed_block(w),
            None => old.observed.clone(),
        },
        objective: match (&i.qc.spec.scaling.objective, i.workers) {
            (None, _) => None,
            (Some(_), Some(w)) => objective_block(w),
            (Some(_), None) => old.objective.clone(),
        },
        replicas: match i.target.and_then(TargetRead::found) {
            Some(t) => Some(t.replicas),
            None => i
                .deployment
                .and_then(|d| d.status.as_ref())
                .and_then(|s| s.replicas)
                .or(i.deployment.map(|_| 0)),
        },
        // The scaler's decision; while replicas are held, what the Deployment asks for.
        desired_replicas: match i.replicas {
            ReplicaDecision::Scale { decision, .. } => {
                Some(i32::try_from(decision.replicas).unwrap_or(i32::MAX))
            }
            ReplicaDecision::Suspended { .. } => Some(0),
            ReplicaDecision::Keep => asked_replicas(i),
        },
        selector: match i.qc.spec.mode() {
            Mode::Worker => Some(render::selector_string(&name)),
            Mode::ScaleOnly(_) => i
                .target
                .and_then(TargetRead::found)
                .and_then(|t| t.selector.clone())
                .or(old.selector),
        },
        last_scale_time: i.scaled_at.clone().or(old.last_scale_time),
        managed: old.managed,
    }
}

/// What the workload asks for: the worker Deployment's `spec.replicas`, or the scale target's.
fn asked_replicas(i: &StatusInputs<'_>) -> Option<i32> {
    match i.target.and_then(TargetRead::found) {
        Some(t) => Some(i32::try_from(t.asks).unwrap_or(i32::MAX)),
        None => i.deployment.and_then(|d| d.spec.replicas),
    }
}

/// Scale-only mode's own condition: what runs without the bundled worker, and what does not.
fn scale_only(i: &StatusInputs<'_>) -> Option<Cond> {
    let Mode::ScaleOnly(t) = i.qc.spec.mode() else {
        return None;
    };
    Some(Cond::new(
        conditions::SCALE_ONLY,
        Status::True,
        reason::SCALE_ONLY,
        format!(
            "scale-only mode: {} is scaled through /scale from SQS's visible and in-flight counts only (no worker metrics); the rules, the dead-letter queue conditions, the alarm, redrive, suspend and manage run as usual; without the bundled qc-worker there are no heartbeats (the rules assume none), no outage breaker, no drain or idle-pod choice on scale-in, and no observed P99",
            t.describe()
        ),
    ))
}

/// The status of a condition, as the Kubernetes API conventions spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// One condition as a step of `build` decides it; made a `Condition` with the generation and time.
#[derive(Clone, Debug, PartialEq)]
struct Cond {
    type_: &'static str,
    status: Status,
    reason: &'static str,
    message: String,
}

impl Cond {
    /// The message as tenants may read it: AWS error text without the operator's identity
    /// (`aws::without_principals`).
    fn new(type_: &'static str, status: Status, reason: &'static str, message: String) -> Cond {
        Cond {
            type_,
            status,
            reason,
            message: crate::aws::scrub_principals(message),
        }
    }
}

/// None until CloudWatch was first asked: an unknown alarm on a first reconcile is no news.
fn alarm_synced(i: &StatusInputs<'_>, old: &[Condition]) -> Option<Condition> {
    let t = conditions::ALARM_SYNCED;
    let (status, reason, message) = match &i.alarm.sync {
        AlarmSync::InSync => (
            Status::True,
            reason::ALARM_IN_SYNC,
            format!(
                "CloudWatch alarm {} is in sync",
                i.alarm.name.as_deref().unwrap_or("")
            ),
        ),
        AlarmSync::NotManaged => (
            Status::True,
            reason::ALARM_NOT_MANAGED,
            "no alarm is kept: deadLetter.alarm is false or the queue has no dead-letter queue"
                .to_string(),
        ),
        AlarmSync::Failed { reason, message } => (
            Status::False,
            *reason,
            format!("{message}; retried every poll interval, scaling and status are not held back"),
        ),
        AlarmSync::Unknown { reason, message } => (Status::Unknown, *reason, message.clone()),
        AlarmSync::NotChecked => return old.iter().find(|c| c.type_ == t).cloned(),
    };
    Some(Condition {
        type_: t.to_string(),
        status: status.as_str().to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: i.qc.metadata.generation,
        last_transition_time: i.now.clone(),
    })
}

fn queue_reachable(i: &StatusInputs<'_>) -> Cond {
    match i.facts {
        Observation::Read(f) => Cond::new(
            conditions::QUEUE_REACHABLE,
            Status::True,
            reason::QUEUE_ATTRIBUTES_READ,
            format!("read the attributes of {}", f.queue.url),
        ),
        Observation::Offline => Cond::new(
            conditions::QUEUE_REACHABLE,
            Status::Unknown,
            QUEUE_NOT_READ,
            OFFLINE.to_string(),
        ),
        Observation::Failed(e) if e.is_refusal() => Cond::new(
            conditions::QUEUE_REACHABLE,
            Status::Unknown,
            e.reason(),
            match e {
                ObserveError::EndpointNotAllowed(_) => {
                    "not read: spec.queue.endpoint is not allowed (see ConfigValid)"
                }
                ObserveError::NotAllowedByPolicy(
                    crate::tenancy::TenancyError::NamespaceConsumerCapReached { .. },
                ) => "not read: the namespace has as many QueueConsumers as the operator runs (see ConfigValid)",
                _ => "not read: this operator's tenancy policy refuses the QueueConsumer (see ConfigValid)",
            }
            .to_string(),
        ),
        Observation::Failed(e) => Cond::new(
            conditions::QUEUE_REACHABLE,
            Status::False,
            e.reason(),
            format!(
                "{e}{}; the Deployment and its replicas are left as they are",
                as_role(i.qc, e)
            ),
        ),
    }
}

/// With `spec.aws.roleArn`, a denial or a credentials failure is the role's (or its trust policy's),
/// not the operator's own role that the SQS error names: say which role and ExternalId were used.
fn as_role(qc: &crate::api::QueueConsumer, e: &ObserveError) -> String {
    match crate::aws::identity::of_consumer(qc) {
        // The role is named by its field, not its ARN: condition messages never carry IAM ARNs (#29).
        Some(role) if matches!(e.reason(), "AccessDenied" | "InvalidCredentials") => format!(
            " (the call was made as the role in spec.aws.roleArn, assumed with ExternalId {}: the role's trust policy must let the operator's role assume it with that ExternalId, and the role's policy must allow the call on this queue)",
            role.external_id
        ),
        _ => String::new(),
    }
}

fn config_valid(i: &StatusInputs<'_>) -> Cond {
    let t = conditions::CONFIG_VALID;
    if let Some(e) = i.rollout.render_error() {
        return Cond::new(t, Status::False, e.reason(), e.to_string());
    }
    if let Observation::Failed(e) = i.facts
        && e.is_refusal()
    {
        return Cond::new(
            t,
            Status::False,
            e.reason(),
            format!("{e}; nothing is rolled out and no AWS call is made"),
        );
    }
    let errors: Vec<_> = i
        .report
        .findings
        .iter()
        .filter(|f| f.severity == crate::api::Severity::Error)
        .collect();
    if let Some(first) = errors.first() {
        let mut message = errors
            .iter()
            .map(|f| format!("{}: {}", f.code, f.message))
            .collect::<Vec<_>>()
            .join("; ");
        if matches!(i.rollout, Rollout::HeldByValidation) {
            message.push_str("; rollout held because validation.enforce is true");
        }
        // Reasons are CamelCase identifiers: a finding code is one.
        return Cond::new(t, Status::False, code_reason(&first.code), message);
    }
    let warnings = i.report.findings.len();
    match i.facts {
        Observation::Failed(_) | Observation::Offline => Cond::new(
            t,
            Status::Unknown,
            if matches!(i.facts, Observation::Offline) {
                QUEUE_NOT_READ
            } else {
                reason::QUEUE_UNREACHABLE
            },
            format!(
                "no Error finding among the rules that need no queue facts; {} rule(s) wait for the queue's attributes",
                i.report.skipped.len()
            ),
        ),
        Observation::Read(_) => Cond::new(
            t,
            Status::True,
            reason::NO_ERRORS,
            if warnings == 0 {
                "no findings".to_string()
            } else {
                format!("no Error finding; {warnings} warning(s) in status.findings")
            },
        ),
    }
}

/// Finding codes are constants (validate::codes); this maps a runtime string back to a static one.
fn code_reason(code: &str) -> &'static str {
    crate::validate::codes::ALL
        .iter()
        .chain(crate::validate::limits::ALL)
        .chain(&[reason::TEMPLATE_INVALID])
        .find(|c| **c == code)
        .copied()
        .unwrap_or("ErrorFinding")
}

fn dead_letter_healthy(i: &StatusInputs<'_>) -> Cond {
    let t = conditions::DEAD_LETTER_QUEUE_HEALTHY;
    let facts = match i.facts {
        Observation::Read(f) => f,
        Observation::Offline => {
            return Cond::new(
                t,
                Status::Unknown,
                DEAD_LETTER_QUEUE_NOT_READ,
                OFFLINE.to_string(),
            );
        }
        Observation::Failed(_) => {
            return Cond::new(
                t,
                Status::Unknown,
                reason::QUEUE_UNREACHABLE,
                "the source queue could not be read, so neither could its redrive policy"
                    .to_string(),
            );
        }
    };
    match &facts.dead_letter {
        DeadLetterFacts::None => Cond::new(
            t,
            Status::False,
            reason::NO_DEAD_LETTER_QUEUE,
            format!(
                "queue {} has no redrive policy: a message that always fails is retried until retention expires",
                facts.queue.url
            ),
        ),
        DeadLetterFacts::Missing { arn } => Cond::new(
            t,
            Status::False,
            reason::NO_DEAD_LETTER_QUEUE,
            format!(
                "the redrive policy names {arn}, which does not exist: create it or fix the policy"
            ),
        ),
        DeadLetterFacts::Unreachable { arn, error } => Cond::new(
            t,
            Status::Unknown,
            reason::DEAD_LETTER_QUEUE_UNREACHABLE,
            format!("dead-letter queue {arn} could not be read: {error}"),
        ),
        DeadLetterFacts::NotRead { arn } => Cond::new(
            t,
            Status::Unknown,
            DEAD_LETTER_QUEUE_NOT_READ,
            format!("dead-letter queue {arn} was not read"),
        ),
        DeadLetterFacts::Found {
            queue,
            oldest_age_seconds,
        } => match queue.visible {
            Some(0) => Cond::new(
                t,
                Status::True,
                reason::DEAD_LETTER_QUEUE_EMPTY,
                format!("dead-letter queue {} is empty", queue.url),
            ),
            Some(n) => {
                let age = oldest_age_seconds
                    .and_then(|s| u64::try_from(s).ok())
                    .map(|s| format!(", the oldest {} old", Duration::from_secs(s)))
                    .unwrap_or_default();
                Cond::new(
                    t,
                    Status::False,
                    reason::MESSAGES_IN_DEAD_LETTER_QUEUE,
                    format!("{n} message(s) in dead-letter queue {}{age}", queue.url),
                )
            }
            None => Cond::new(
                t,
                Status::Unknown,
                DEAD_LETTER_QUEUE_NOT_READ,
                format!("dead-letter queue {} reported no message count", queue.url),
            ),
        },
    }
}

fn scaling_active(i: &StatusInputs<'_>) -> Cond {
    let t = conditions::SCALING_ACTIVE;
    let replicas = asked_replicas(i);
    let held = |what: &str| match replicas {
        Some(r) => format!("{what}: replicas held at {r}"),
        None => format!("{what}: no Deployment yet"),
    };
    if let (Mode::ScaleOnly(target), Some(read)) = (i.qc.spec.mode(), i.target)
        && let Some(why) = read.problem(target, i.qc.metadata.namespace.as_deref().unwrap_or(""))
    {
        return Cond::new(t, Status::False, reason::SCALE_TARGET_UNAVAILABLE, why);
    }
    if let ReplicaDecision::Suspended { current } = i.replicas {
        let message = if *current == 0 {
            "spec.suspend is true: 0 replicas, the scaler is paused; set it to false to resume"
                .to_string()
        } else {
            format!(
                "spec.suspend is true: scaling {current} replica(s) to 0 (pods drain what they hold), the scaler is paused; set it to false to resume"
            )
        };
        return Cond::new(t, Status::False, reason::SUSPENDED, message);
    }
    match i.rollout {
        Rollout::HeldByValidation => Cond::new(
            t,
            Status::False,
            reason::HELD_BY_VALIDATION,
            held("an Error finding and validation.enforce"),
        ),
        Rollout::HeldInvalidSpec(_) => Cond::new(
            t,
            Status::False,
            reason::HELD_BY_VALIDATION,
            held("the spec cannot be rendered"),
        ),
        Rollout::HeldQueueUnreachable { .. } => Cond::new(
            t,
            Status::False,
            reason::METRICS_UNAVAILABLE,
            held("queue depth is unknown"),
        ),
        Rollout::HeldForeignDeployment => Cond::new(
            t,
            Status::False,
            DEPLOYMENT_NOT_OWNED,
            "the Deployment of this name belongs to someone else: nothing is scaled".to_string(),
        ),
        Rollout::Apply(_) | Rollout::ScaleOnly => {
            if let ReplicaDecision::Scale { decision, .. } = i.replicas {
                let reason = decision.condition_reason();
                let status = if reason == reason::METRICS_UNAVAILABLE
                    || reason == reason::DOWNSTREAM_FAILING
                {
                    Status::False
                } else {
                    Status::True
                };
                return Cond::new(t, status, reason, decision.to_string());
            }
            // No scaler ran (`plan`): say what the Deployment asks for.
            let max = i.qc.spec.scaling.max_replicas;
            match replicas {
                None => Cond::new(
                    t,
                    Status::Unknown,
                    reason::SCALING,
                    "replicas not decided yet".to_string(),
                ),
                Some(0) => Cond::new(
                    t,
                    Status::True,
                    reason::SCALED_TO_ZERO,
                    "0 replicas".to_string(),
                ),
                Some(r) if u32::try_from(r).is_ok_and(|r| r >= max) => Cond::new(
                    t,
                    Status::True,
                    reason::AT_MAX_REPLICAS,
                    format!("{r} replicas, the maximum"),
                ),
                Some(r) => Cond::new(t, Status::True, reason::SCALING, format!("{r} replica(s)")),
            }
        }
    }
}

fn ready(i: &StatusInputs<'_>, queue: &Cond, config: &Cond, name: &str) -> Cond {
    let t = conditions::READY;
    if queue.status == Status::False {
        return Cond::new(
            t,
            Status::False,
            reason::QUEUE_UNREACHABLE,
            queue.message.clone(),
        );
    }
    if config.status == Status::False {
        // A tenancy refusal is its own reason: what to fix is not in the spec's settings alone.
        let why = match i.facts {
            Observation::Failed(e @ ObserveError::NotAllowedByPolicy(_)) => e.reason(),
            _ => reason::CONFIG_INVALID,
        };
        return Cond::new(t, Status::False, why, config.message.clone());
    }
    if matches!(i.rollout, Rollout::HeldForeignDeployment) {
        return Cond::new(
            t,
            Status::False,
            DEPLOYMENT_NOT_OWNED,
            format!(
                "Deployment {name} exists and is not controlled by this QueueConsumer: it is left alone; rename the QueueConsumer or delete that Deployment"
            ),
        );
    }
    if let Mode::ScaleOnly(target) = i.qc.spec.mode() {
        let ns = i.qc.metadata.namespace.as_deref().unwrap_or("");
        return match i.target {
            None => Cond::new(
                t,
                Status::Unknown,
                reason::SCALE_ONLY,
                format!(
                    "{} was not read (plan reads nothing from the cluster)",
                    target.describe()
                ),
            ),
            Some(read) => match read.found() {
                None => Cond::new(
                    t,
                    Status::False,
                    reason::SCALE_TARGET_UNAVAILABLE,
                    read.problem(target, ns).unwrap_or_default(),
                ),
                Some(s) => Cond::new(
                    t,
                    Status::True,
                    reason::SCALE_ONLY,
                    format!(
                        "{} asks for {} replica(s), {} running; scale-only mode: whether its pods are ready is for its own controller to report",
                        target.describe(),
                        s.asks,
                        s.replicas
                    ),
                ),
            },
        };
    }
    if let Some(d) = i.deployment {
        let new_template = matches!(i.applied, Some(Applied::Updated { new_template: true }));
        // A new template starts a new rollout: the Deployment's Progressing condition and the
        // crash-looping pods are the last template's until the Deployment controller acts on it.
        let stalled = if new_template {
            None
        } else {
            rollout_stalled(d, i.workers)
        };
        // The Deployment controller cannot create pods (Pod Security admission, quota, a webhook): the
        // most useful thing Ready can say, since no rollout or replica will come before it is fixed.
        if let Some(why) = replica_failure(d) {
            return Cond::new(
                t,
                Status::False,
                reason::REPLICA_FAILURE,
                format!("Deployment {name} cannot create its pods: {why}"),
            );
        }
        if let Some(why) = stalled {
            return Cond::new(
                t,
                Status::False,
                reason::ROLLOUT_STALLED,
                format!("the rollout of Deployment {name} is stalled: {why}"),
            );
        }
        let was_rolling_out = i.last_condition(t).is_some_and(|c| {
            c.reason == reason::ROLLING_OUT || c.reason == reason::ROLLOUT_STALLED
        });
        if let Some(why) = rolling_out(d, new_template, was_rolling_out) {
            return Cond::new(
                t,
                Status::False,
                reason::ROLLING_OUT,
                format!("Deployment {name} is rolling out: {why}"),
            );
        }
    }
    match i.deployment {
        None => Cond::new(
            t,
            Status::False,
            reason::DEPLOYMENT_UNAVAILABLE,
            format!("Deployment {name} does not exist yet"),
        ),
        Some(d) if deployment_available(d) => {
            let want = d.spec.replicas.unwrap_or(0);
            let ready = d
                .status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0);
            Cond::new(
                t,
                Status::True,
                reason::AVAILABLE,
                format!("Deployment {name} is available ({ready}/{want} replicas ready)"),
            )
        }
        Some(_) => Cond::new(
            t,
            Status::False,
            reason::DEPLOYMENT_UNAVAILABLE,
            format!("Deployment {name} has no available replica yet"),
        ),
    }
}

/// How far a rollout of a new pod template is from done, while it is not (docs/controller.md, "Ready
/// follows the rollout"). A change of replicas alone (the scaler's write) is no rollout: the pods that
/// serve keep serving, and new ones join, all of the current template. So the Deployment's status is
/// read for a template change only: the one this reconcile applied (`new_template`; the status cannot
/// show it yet), pods of an older template still running, or, once `RollingOut` or `RolloutStalled`
/// was reported (`was_rolling_out`), until the Deployment controller has observed the latest
/// generation and every replica runs the new template and is available. Scaled to zero, there is
/// nothing to roll out.
fn rolling_out(d: &Deployment, new_template: bool, was_rolling_out: bool) -> Option<String> {
    let want = d.spec.replicas.unwrap_or(1);
    if want <= 0 {
        return None;
    }
    if new_template {
        return Some(format!(
            "a new pod template was applied just now; waiting for the Deployment controller to replace the pods ({want} replica(s))"
        ));
    }
    let s = d.status.clone().unwrap_or_default();
    let n = |v: Option<i32>| v.unwrap_or(0);
    let (total, updated, available) = (
        n(s.replicas),
        n(s.updated_replicas),
        n(s.available_replicas),
    );
    let old = total - updated;
    if old > 0 {
        return Some(format!(
            "{updated} of {want} replica(s) run the current pod template, {old} pod(s) of an older one still running"
        ));
    }
    if !was_rolling_out {
        return None;
    }
    let generation = d.metadata.generation.unwrap_or(0);
    if s.observed_generation.unwrap_or(0) < generation {
        return Some(format!(
            "waiting for the Deployment controller to observe generation {generation}"
        ));
    }
    (updated < want || available < want).then(|| {
        format!(
            "{updated} of {want} replica(s) run the current pod template, {available} available"
        )
    })
}

/// The Deployment's ReplicaFailure condition (copied from its ReplicaSet: pods refused at creation), as
/// "Reason: message".
fn replica_failure(d: &Deployment) -> Option<String> {
    d.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| {
            c.type_.as_deref() == Some("ReplicaFailure") && c.status.as_deref() == Some("True")
        })
        .map(|c| {
            format!(
                "{}: {}",
                c.reason.as_deref().unwrap_or("ReplicaFailure"),
                c.message.as_deref().unwrap_or("no message")
            )
        })
}

/// Why the rollout is stuck, if it is: the Deployment controller gave up waiting for progress
/// (Progressing=False, ProgressDeadlineExceeded), or pods crash-loop.
fn rollout_stalled(d: &Deployment, workers: Option<&Workers>) -> Option<String> {
    let deadline = d
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| {
            c.type_.as_deref() == Some("Progressing")
                && c.status.as_deref() == Some("False")
                && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
        })
        .map(|c| {
            format!(
                "progress deadline exceeded ({})",
                c.message.as_deref().unwrap_or("no message")
            )
        });
    let crash = workers
        .filter(|w| !w.crash_looping.is_empty())
        .map(|w| format!("pods crash-loop: {}", w.crash_looping.join(", ")));
    match (deadline, crash) {
        (None, None) => None,
        (Some(a), None) | (None, Some(a)) => Some(a),
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
    }
}

/// The `ProcessingTimeWithinDeclared` condition: the rule of `workers` (docs/operations.md).
fn processing_time(i: &StatusInputs<'_>) -> Cond {
    let t = conditions::PROCESSING_TIME_WITHIN_DECLARED;
    let declared = i.qc.spec.processing.p99;
    if let Mode::ScaleOnly(target) = i.qc.spec.mode() {
        return Cond::new(
            t,
            Status::Unknown,
            reason::SCALE_ONLY,
            format!(
                "scale-only mode: {}'s consumer reports no processing times; the rules use the declared p99 {declared}",
                target.describe()
            ),
        );
    }
    let Some(w) = i.workers else {
        return Cond::new(
            t,
            Status::Unknown,
            reason::NO_OBSERVATIONS,
            "the worker pods were not read (plan reads no pod)".to_string(),
        );
    };
    let Some(stats) = &w.stats else {
        let why = if w.pods == 0 && w.unreachable == 0 {
            "no ready worker pod to read".to_string()
        } else if w.pods == 0 {
            format!(
                "none of the {} ready worker pod(s) answered on /metrics",
                w.unreachable
            )
        } else {
            "waiting for a second scrape of the worker pods".to_string()
        };
        return Cond::new(t, Status::Unknown, reason::NO_OBSERVATIONS, why);
    };
    let (Some(p99), true) = (stats.p99_seconds, stats.messages >= MIN_MESSAGES) else {
        return Cond::new(
            t,
            Status::Unknown,
            reason::NO_OBSERVATIONS,
            // The window is in status.observed; here it would change the message (and so write
            // status) at every scrape while it widens over an idle consumer.
            format!(
                "{} message(s) finished in the observed window (status.observed.window); the rule needs at least {MIN_MESSAGES}",
                stats.messages
            ),
        );
    };
    let seen = format!(
        "observed P99 {} (mean {}, {} messages over {} from {} pod(s))",
        seconds(p99),
        stats.mean_seconds.map_or_else(|| "-".into(), seconds),
        stats.messages,
        stats.window,
        w.pods
    );
    let percent = ((TOLERANCE - 1.0) * 100.0).round();
    if let Some(observed) = observed_p99_above_declared(&i.qc.spec, w) {
        let mut spec = i.qc.spec.clone();
        spec.processing.p99 = observed;
        let needs = crate::validate::budget(&spec);
        let has = i
            .facts
            .facts()
            .map(|f| format!(" (the queue has {})", f.queue.visibility_timeout))
            .unwrap_or_default();
        Cond::new(
            t,
            Status::False,
            reason::OBSERVED_P99_ABOVE_DECLARED,
            format!(
                "{seen} is more than {percent}% above the declared p99 {declared}: with it the VisibilityTimeout needs at least {needs}{has}; raise processing.p99 or speed up the handler"
            ),
        )
    } else {
        Cond::new(
            t,
            Status::True,
            reason::OBSERVED_P99_WITHIN_DECLARED,
            format!("{seen} is within {percent}% of the declared p99 {declared}"),
        )
    }
}

/// The `ObjectiveMet` condition, present only with `scaling.objective` (docs/controller.md): the verdict
/// of `scaling::objective` on the workers' dwell measurement, with the figures.
fn objective_met(i: &StatusInputs<'_>) -> Option<Cond> {
    use crate::scaling::objective::{self, Before, MIN_MESSAGES, Unmeasured, Verdict};
    let o = i.qc.spec.scaling.objective.as_ref()?;
    let t = conditions::OBJECTIVE_MET;
    let before = match i.last_condition(t) {
        Some(c) if c.status == "False" => Before::Missed,
        _ => Before::NotMissed,
    };
    let objective = o.dwell_p99;
    let Some(w) = i.workers else {
        return Some(Cond::new(
            t,
            Status::Unknown,
            reason::NO_MEASUREMENT,
            "the worker pods were not read (plan reads no pod)".to_string(),
        ));
    };
    let figures = |m: &objective::Measurement| {
        format!(
            "observed dwell P99 {} against the objective {objective}: {:.1} % of {} messages over it, error budget burn rate {:.2} (over {} from {} pod(s))",
            m.p99,
            m.bad_fraction() * 100.0,
            m.messages,
            m.burn_rate(),
            m.window,
            w.pods
        )
    };
    Some(match objective::verdict(w.dwell, w.pods, w.unreachable, before) {
        Verdict::Met(m) => Cond::new(
            t,
            Status::True,
            reason::OBJECTIVE_MET,
            format!("{}: within the 1 % a P99 allows", figures(&m)),
        ),
        Verdict::Missed(m) => Cond::new(
            t,
            Status::False,
            reason::DWELL_ABOVE_OBJECTIVE,
            format!(
                "{}: more than the 1 % a P99 allows; while messages wait the scaler removes no replica and defers no scale-up (ScalingActive says limited by Objective); a miss that outlasts the burst that caused it wants more standing replicas (minReplicas) or a faster handler",
                figures(&m)
            ),
        ),
        Verdict::Recovering(m) => Cond::new(
            t,
            Status::False,
            reason::DWELL_ABOVE_OBJECTIVE,
            format!(
                "{}: within the 1 % a P99 allows again, and False until the burn rate falls to {} or below (so a window hovering at the budget does not flip this condition every poll)",
                figures(&m),
                objective::RECOVERED_BURN_RATE
            ),
        ),
        Verdict::NoMeasurement(why) => Cond::new(
            t,
            Status::Unknown,
            reason::NO_MEASUREMENT,
            match why {
                Unmeasured::NoPods => "no ready worker pod to read".to_string(),
                Unmeasured::NoAnswer { unreachable } => format!(
                    "none of the {unreachable} ready worker pod(s) answered on /metrics"
                ),
                Unmeasured::NoHistogram => "waiting for a second scrape of the worker pods (a window needs two), or the workers expose no qc_worker_message_dwell_seconds".to_string(),
                Unmeasured::TooFew { messages } => format!(
                    "{messages} message(s) left the queue in the observed window (status.objective.window); a P99 needs at least {MIN_MESSAGES}"
                ),
            },
        ),
    })
}

/// `status.objective` from the workers' dwell measurement (None before a first delta).
fn objective_block(w: &Workers) -> Option<crate::api::ObjectiveStatus> {
    let m = w.dwell?;
    Some(crate::api::ObjectiveStatus {
        // no message in the window: no P99 to show
        dwell_p99_seconds: (m.messages > 0).then(|| round3(m.p99.as_secs_f64())),
        over_objective: Some((m.bad_fraction() * 10_000.0).round() / 10_000.0),
        burn_rate: Some((m.burn_rate() * 100.0).round() / 100.0),
        messages: Some(i64::try_from(m.messages).unwrap_or(i64::MAX)),
        window: Some(m.window),
        sampled_at: w.sampled_at.clone(),
    })
}

/// The `FifoGroupsHealthy` condition (FIFO queues whose workers report their groups): False naming
/// the stuck groups (a head that failed 3 times in a row, or older than 5 minutes) and the hot ones;
/// absent on a standard queue or before a worker reported (a first False is an Event).
fn fifo_groups_healthy(i: &StatusInputs<'_>) -> Option<Cond> {
    use crate::scaling::fifo::{self, Stuck};
    if !crate::aws::facts::is_fifo(&i.qc.spec.queue.url) {
        return None;
    }
    let (held, heads) = i.workers?.fifo.as_ref()?;
    let h = fifo::classify(heads, fifo::Thresholds::default());
    let hot = if h.hot.is_empty() {
        String::new()
    } else {
        format!(
            "; hot: {}",
            h.hot
                .iter()
                .map(|(g, pct)| format!("group {g:?} holds {pct}% of the held messages"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    if h.stuck.is_empty() {
        return Some(Cond::new(
            conditions::FIFO_GROUPS_HEALTHY,
            Status::True,
            reason::NO_STUCK_GROUPS,
            format!("{held} message group(s) held by the workers, none stuck{hot}"),
        ));
    }
    let stuck = h
        .stuck
        .iter()
        .map(|(g, why)| match why {
            Stuck::HeadFailing { failures, age } => format!(
                "group {g:?}: its head failed {failures} times in a row ({}s old)",
                age.as_secs()
            ),
            Stuck::HeadOld { age } => format!("group {g:?}: its head is {}s old", age.as_secs()),
        })
        .collect::<Vec<_>>()
        .join(", ");
    Some(Cond::new(
        conditions::FIFO_GROUPS_HEALTHY,
        Status::False,
        reason::GROUP_STUCK,
        format!(
            "stuck FIFO message groups hold back every later message of their group: {stuck}{hot}; see the handler's log for the head's failure (docs/operations.md, \"A stuck FIFO group\")"
        ),
    ))
}

/// The `HandlerHealthy` condition: the share of scraped workers whose outage breaker is open. It does not
/// gate Ready (the consumer is running as asked; its handler's dependency is not).
fn handler_healthy(i: &StatusInputs<'_>) -> Cond {
    let t = conditions::HANDLER_HEALTHY;
    if let Mode::ScaleOnly(target) = i.qc.spec.mode() {
        return Cond::new(
            t,
            Status::Unknown,
            reason::SCALE_ONLY,
            format!(
                "scale-only mode: {}'s consumer has no outage breaker of ours and reports no handler outcomes",
                target.describe()
            ),
        );
    }
    let Some(w) = i.workers else {
        return Cond::new(
            t,
            Status::Unknown,
            reason::NO_OBSERVATIONS,
            "the worker pods were not read (plan reads no pod)".to_string(),
        );
    };
    if w.pods == 0 {
        let why = if w.unreachable == 0 {
            "no ready worker pod to read".to_string()
        } else {
            format!(
                "none of the {} ready worker pod(s) answered on /metrics",
                w.unreachable
            )
        };
        return Cond::new(t, Status::Unknown, reason::NO_OBSERVATIONS, why);
    }
    if w.breaker_open == 0 {
        return Cond::new(
            t,
            Status::True,
            reason::HANDLER_RESPONDING,
            format!("no outage breaker open on the {} worker(s) scraped", w.pods),
        );
    }
    let hold = if w.downstream().failing() {
        "; scaling holds the replicas until they close"
    } else {
        ""
    };
    Cond::new(
        t,
        Status::False,
        reason::DOWNSTREAM_FAILING,
        format!(
            "{} of {} workers paused intake: the handler's dependency is failing (breaker open){hold}",
            w.breaker_open, w.pods
        ),
    )
}

/// The observed P99 when the rule says it is above the declared one (enough messages, more than
/// `TOLERANCE` times the declared p99); the rules then run again with it.
pub fn observed_p99_above_declared(
    spec: &crate::api::QueueConsumerSpec,
    w: &Workers,
) -> Option<Duration> {
    let s = w.stats.as_ref().filter(|s| s.messages >= MIN_MESSAGES)?;
    let p99 = s.p99_seconds?;
    (p99 > spec.processing.p99.as_secs_f64() * TOLERANCE).then(|| observed_p99(p99))
}

/// An observed P99 as a spec duration, rounded up to the millisecond.
pub fn observed_p99(seconds: f64) -> Duration {
    Duration::from_millis((seconds * 1000.0).ceil().max(1.0) as u64)
}

fn seconds(s: f64) -> String {
    observed_p99(s).to_string()
}

/// The dead-band of `status.observed`: a value within this fraction of the one in status (or within
/// [`observed_close`]'s small absolute floors) is not news, so a steady busy consumer, whose P99, mean,
/// rate and in-flight count move a little at every scrape, is not rewritten every poll interval.
pub const OBSERVED_DEAD_BAND: f64 = 0.2;
/// Values inside the dead-band are still refreshed when the ones in status are older than this.
pub const OBSERVED_REFRESH: std::time::Duration = std::time::Duration::from_mins(5);

/// What `ProcessingTimeWithinDeclared` says of these workers: True, False or Unknown.
fn processing_verdict(spec: &crate::api::QueueConsumerSpec, w: &Workers) -> Status {
    match &w.stats {
        Some(s) if s.p99_seconds.is_some() && s.messages >= MIN_MESSAGES => {
            if observed_p99_above_declared(spec, w).is_some() {
                Status::False
            } else {
                Status::True
            }
        }
        _ => Status::Unknown,
    }
}

fn close(a: Option<f64>, b: Option<f64>, floor: f64) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            (a - b).abs() <= (OBSERVED_DEAD_BAND * a.abs().max(b.abs())).max(floor)
        }
        _ => false,
    }
}

/// Whether `fresh` says nothing new against `old`: the same pods answered (and did not), and every
/// number is within the dead-band (P99 and mean within 20 % or 1 ms, rate within 20 % or 0.01/s,
/// messages and in flight within 20 % or 1).
pub fn observed_close(
    old: &crate::api::ObservedStatus,
    fresh: &crate::api::ObservedStatus,
) -> bool {
    let n = |v: Option<i64>| v.map(|v| v as f64);
    old.pods == fresh.pods
        && old.pods_unreachable == fresh.pods_unreachable
        && old.breaker_open == fresh.breaker_open
        && close(old.p99_seconds, fresh.p99_seconds, 0.001)
        && close(old.mean_seconds, fresh.mean_seconds, 0.001)
        && close(old.messages_per_second, fresh.messages_per_second, 0.01)
        && close(n(old.messages), n(fresh.messages), 1.0)
        && close(n(old.in_flight), n(fresh.in_flight), 1.0)
}

/// The workers as status shows them. When what was just scraped is within the dead-band of what
/// status already says (`observed_close`), the verdict of `ProcessingTimeWithinDeclared` is the same
/// and status's numbers are younger than [`OBSERVED_REFRESH`], the numbers (and their `sampledAt`)
/// stay as status has them: the observed block, the condition's message and the rules run with the
/// observed P99 then say exactly what they said, and nothing is written. A verdict that flips, a pod
/// that comes or goes, or a number that moves by more than the band shows at once. Pure.
pub fn dead_band(qc: &QueueConsumer, mut w: Workers) -> Workers {
    let Some(status) = qc.status.as_ref() else {
        return w;
    };
    let (Some(old), Some(fresh)) = (status.observed.as_ref(), observed_block(&w)) else {
        return w;
    };
    let old_verdict = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::PROCESSING_TIME_WITHIN_DECLARED)
        .map(|c| c.status.as_str());
    let refresh_due = match (&old.sampled_at, &fresh.sampled_at) {
        (Some(a), Some(b)) => {
            b.0.as_second().saturating_sub(a.0.as_second())
                >= i64::try_from(OBSERVED_REFRESH.as_secs()).unwrap_or(i64::MAX)
        }
        _ => true,
    };
    // A window this process has only begun (a restart, a new leader) says less than the one in
    // status, written before it: the numbers in status stand until this process has scraped for a
    // poll interval, so that a restart does not flip every consumer to NoObservations and back (two
    // status writes and two Events each). Pods that came or went still show at once.
    if w.warming_up
        && !refresh_due
        && old.pods == fresh.pods
        && old.pods_unreachable == fresh.pods_unreachable
        && let Some(window) = old.window
    {
        w.stats = Some(Stats {
            p99_seconds: old.p99_seconds,
            mean_seconds: old.mean_seconds,
            messages_per_second: old.messages_per_second.unwrap_or(0.0),
            messages: old
                .messages
                .and_then(|m| u64::try_from(m).ok())
                .unwrap_or(0),
            window,
        });
        if let Some(f) = old.in_flight {
            w.in_flight = f;
        }
        w.sampled_at.clone_from(&old.sampled_at);
        return w;
    }
    if refresh_due
        || old_verdict != Some(processing_verdict(&qc.spec, &w).as_str())
        || !observed_close(old, &fresh)
        || old.window.is_some() != w.stats.is_some()
    {
        return w;
    }
    if let (Some(s), Some(window)) = (w.stats.as_mut(), old.window) {
        s.p99_seconds = old.p99_seconds;
        s.mean_seconds = old.mean_seconds;
        s.messages_per_second = old.messages_per_second.unwrap_or(s.messages_per_second);
        s.messages = old
            .messages
            .and_then(|m| u64::try_from(m).ok())
            .unwrap_or(s.messages);
        s.window = window;
    }
    if let Some(f) = old.in_flight {
        w.in_flight = f;
    }
    w.sampled_at.clone_from(&old.sampled_at);
    w
}

/// Rounded so that noise below a millisecond does not rewrite status.
fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[allow(clippy::unnecessary_wraps)] // the block status carries is optional
fn observed_block(w: &Workers) -> Option<crate::api::ObservedStatus> {
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    Some(crate::api::ObservedStatus {
        p99_seconds: w.stats.as_ref().and_then(|s| s.p99_seconds).map(round3),
        mean_seconds: w.stats.as_ref().and_then(|s| s.mean_seconds).map(round3),
        messages_per_second: w.stats.as_ref().map(|s| round3(s.messages_per_second)),
        messages: w
            .stats
            .as_ref()
            .map(|s| i64::try_from(s.messages).unwrap_or(i64::MAX)),
        in_flight: (w.pods > 0).then_some(w.in_flight),
        pods: Some(count(w.pods)),
        pods_unreachable: (w.unreachable > 0).then(|| count(w.unreachable)),
        breaker_open: (w.breaker_open > 0).then(|| count(w.breaker_open)),
        window: w.stats.as_ref().map(|s| s.window),
        sampled_at: w.sampled_at.clone(),
    })
}

/// Serving: at least one replica available, or scaled to zero on purpose. Not the Deployment's own
/// `Available` condition alone: that one measures availability against `spec.replicas`, so it goes
/// False during any large enough scale-up (5 asked, 2 available) while the 2 still consume.
pub fn deployment_available(d: &Deployment) -> bool {
    if d.spec.replicas == Some(0) {
        return true;
    }
    let Some(s) = d.status.as_ref() else {
        return false;
    };
    s.available_replicas.unwrap_or(0) > 0
        || s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True"))
}

fn queue_block(f: &Facts, sampled_at: Option<Time>, old: Option<&QueueStatus>) -> QueueStatus {
    let q = &f.queue;
    let mut block = QueueStatus {
        visible: q.visible,
        in_flight: q.in_flight,
        delayed: q.delayed,
        oldest_age_seconds: f.oldest_age_seconds,
        visibility_timeout: Some(q.visibility_timeout),
        max_receive_count: q.redrive.as_ref().map(|r| r.max_receive_count),
        retention: Some(q.retention),
        dead_letter_url: match &f.dead_letter {
            DeadLetterFacts::Found { queue, .. } => Some(queue.url.clone()),
            _ => None,
        },
        sampled_at,
    };
    // sampledAt dates the numbers: unchanged numbers keep their date, so an idle queue is not
    // rewritten every poll interval.
    if let Some(old) = old
        && same_queue_numbers(old, &block)
    {
        block.sampled_at.clone_from(&old.sampled_at);
    }
    block
}

fn same_queue_numbers(a: &QueueStatus, b: &QueueStatus) -> bool {
    QueueStatus {
        sampled_at: None,
        ..a.clone()
    } == QueueStatus {
        sampled_at: None,
        ..b.clone()
    }
}

fn dead_letter_block(
    f: &Facts,
    alarm: &AlarmStatus,
    old: Option<&DeadLetterStatus>,
) -> Option<DeadLetterStatus> {
    match &f.dead_letter {
        DeadLetterFacts::Found {
            queue,
            oldest_age_seconds,
        } => Some(DeadLetterStatus {
            url: Some(queue.url.clone()),
            visible: queue.visible,
            oldest_age_seconds: *oldest_age_seconds,
            retention: Some(queue.retention),
            alarm_name: alarm.name.clone(),
            alarm_state: alarm.state.clone(),
            redrive: None,
            redrive_after_recovery: None,
            by_reason: old.map(|d| d.by_reason.clone()).unwrap_or_default(),
            by_reason_sampled_at: old.and_then(|d| d.by_reason_sampled_at.clone()),
        }),
        // Unreachable: the last known values stay, with the alarm as it is now.
        DeadLetterFacts::Unreachable { .. } => old.cloned().map(|mut d| {
            d.alarm_name = alarm.name.clone().or(d.alarm_name);
            d.alarm_state = alarm.state.clone().or(d.alarm_state);
            d
        }),
        DeadLetterFacts::None
        | DeadLetterFacts::Missing { .. }
        | DeadLetterFacts::NotRead { .. } => (alarm.name.is_some()).then(|| DeadLetterStatus {
            alarm_name: alarm.name.clone(),
            alarm_state: alarm.state.clone(),
            ..DeadLetterStatus::default()
        }),
    }
}

/// New conditions keep the old `lastTransitionTime` when their status did not change.
pub fn merge_conditions(old: &[Condition], fresh: Vec<Condition>) -> Vec<Condition> {
    fresh
        .into_iter()
        .map(|mut c| {
            if let Some(o) = old.iter().find(|o| o.type_ == c.type_)
                && o.status == c.status
            {
                c.last_transition_time = o.last_transition_time.clone();
            }
            c
        })
        .collect()
}

/// Condition types that only other field managers own, per the object's managedFields.
/// `status.conditions` is a list-map keyed by `type`, so another tool may keep conditions of its own on
/// a QueueConsumer's status, and server-side apply leaves them alone. They are not the controller's to
/// compare (it would write status at every reconcile) nor to remove. A type `manager` owns as well
/// stays the controller's.
pub fn foreign_condition_types(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    manager: &str,
) -> std::collections::BTreeSet<String> {
    let mut ours = std::collections::BTreeSet::new();
    let mut theirs = std::collections::BTreeSet::new();
    for entry in meta.managed_fields.iter().flatten() {
        let Some(fields) = entry.fields_v1.as_ref() else {
            continue;
        };
        let types = fields
            .0
            .get("f:status")
            .and_then(|s| s.get("f:conditions"))
            .and_then(serde_json::Value::as_object)
            .into_iter()
            .flat_map(|m| m.keys())
            .filter_map(|k| k.strip_prefix("k:"))
            .filter_map(|k| serde_json::from_str::<serde_json::Value>(k).ok())
            .filter_map(|k| k.get("type").and_then(|t| t.as_str()).map(str::to_string));
        if entry.manager.as_deref() == Some(manager) {
            ours.extend(types);
        } else {
            theirs.extend(types);
        }
    }
    theirs.difference(&ours).cloned().collect()
}

/// Equal but for timestamps (condition transition times, sampledAt): such a status is not rewritten.
pub fn same_ignoring_time(a: &QueueConsumerStatus, b: &QueueConsumerStatus) -> bool {
    normalized(a) == normalized(b)
}

fn normalized(s: &QueueConsumerStatus) -> QueueConsumerStatus {
    let epoch = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let mut s = s.clone();
    for c in &mut s.conditions {
        c.last_transition_time = epoch.clone();
    }
    s.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    if let Some(q) = s.queue.as_mut() {
        q.sampled_at = None;
    }
    // The window's span moves by the scrapes' jitter (milliseconds) every poll: like sampledAt, it
    // dates the numbers and is refreshed with them, never a reason to write on its own (it was one
    // status write per QueueConsumer with workers per interval).
    if let Some(o) = s.observed.as_mut() {
        o.sampled_at = None;
        o.window = None;
    }
    if let Some(o) = s.objective.as_mut() {
        o.sampled_at = None;
        o.window = None;
    }
    s
}

/// The counts of a busy queue (`status.queue`'s visible, in flight, delayed and oldest age, the same of
/// `status.deadLetter`, and the numbers quoted in condition messages) are written at most this often
/// when nothing else in status changed (docs/decisions.md "Busy queues: status counts written at most
/// once a minute").
pub const COUNTS_REFRESH: std::time::Duration = std::time::Duration::from_mins(1);

/// What a reconcile does with the status it built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusWrite {
    /// Equal but for timestamps: nothing to write.
    Unchanged,
    /// Something a reader must see at once changed, or the counts in status are due for a refresh:
    /// the cause says which.
    Write(WriteCause),
    /// Only counts moved (none emptied or filled) and the ones in status are younger than the
    /// refresh: status stays as written. The metrics carry the fresh counts.
    Hold,
}

/// Whether `fresh` is written over `old`, the status as last written. `counts_written_at` is when the
/// counts in `old` were written (None: not known, so they are due), `refresh` how long they stand
/// ([`COUNTS_REFRESH`]). Written at once when anything but the counts differs: a condition's status,
/// reason or any other text of its message, the desired or current replicas, observedGeneration,
/// findings, `status.observed` (which has its own dead-band), and a count that goes to zero or from
/// zero (the emptiness of a queue is news, its depth is not). A clock that went back writes. Pure.
pub fn status_write(
    old: &QueueConsumerStatus,
    fresh: &QueueConsumerStatus,
    counts_written_at: Option<crate::scaling::Timestamp>,
    now: crate::scaling::Timestamp,
    refresh: std::time::Duration,
) -> StatusWrite {
    let (old, fresh) = (normalized(old), normalized(fresh));
    if old == fresh {
        return StatusWrite::Unchanged;
    }
    if let Some(cause) = news(&without_counts(&old), &without_counts(&fresh)) {
        return StatusWrite::Write(cause);
    }
    match counts_written_at {
        Some(at) if at <= now && now.since(at).as_std() < refresh => StatusWrite::Hold,
        _ => StatusWrite::Write(WriteCause::Counts),
    }
}

/// Why a status is written: the first part of it, in this order, that differs from the status as last
/// written (counts masked, [`without_counts`]), or `Counts` when only counts moved and they were due.
/// `qc_status_writes_total{cause}` counts them, so a steady stream of writes names its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WriteCause {
    /// `observedGeneration`: the spec changed (or no status was written yet).
    Generation,
    /// A condition's status, reason or message (its numbers aside), or a condition came or went.
    Conditions,
    /// `replicas`, `desiredReplicas`, the selector or `lastScaleTime`.
    Replicas,
    /// `findings` of the rules.
    Findings,
    /// `status.queue` or `status.deadLetter`: a queue emptied or filled, or a field other than a count.
    Queue,
    /// `status.observed`: the workers' measurement (it has its own dead-band).
    Observed,
    /// `status.objective`: the dwell objective's verdict or settings.
    Objective,
    /// `status.managed` and the attribute changes of `manage`.
    Managed,
    /// Only counts moved, and those in status were older than the refresh ([`COUNTS_REFRESH`]).
    Counts,
}

impl WriteCause {
    /// The value of the metric's `cause` label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Generation => "generation",
            Self::Conditions => "conditions",
            Self::Replicas => "replicas",
            Self::Findings => "findings",
            Self::Queue => "queue",
            Self::Observed => "observed",
            Self::Objective => "objective",
            Self::Managed => "managed",
            Self::Counts => "counts",
        }
    }
}

/// The first part that differs between two masked statuses, None when they are equal. A field added to
/// the status and missed here is still written (as `Managed`, the last part compared), never held.
fn news(old: &QueueConsumerStatus, fresh: &QueueConsumerStatus) -> Option<WriteCause> {
    if old == fresh {
        return None;
    }
    let parts = [
        (
            WriteCause::Generation,
            old.observed_generation == fresh.observed_generation,
        ),
        (WriteCause::Conditions, old.conditions == fresh.conditions),
        (
            WriteCause::Replicas,
            (
                old.replicas,
                old.desired_replicas,
                &old.selector,
                &old.last_scale_time,
            ) == (
                fresh.replicas,
                fresh.desired_replicas,
                &fresh.selector,
                &fresh.last_scale_time,
            ),
        ),
        (WriteCause::Findings, old.findings == fresh.findings),
        (
            WriteCause::Queue,
            (&old.queue, &old.dead_letter) == (&fresh.queue, &fresh.dead_letter),
        ),
        (WriteCause::Observed, old.observed == fresh.observed),
        (WriteCause::Objective, old.objective == fresh.objective),
    ];
    Some(
        parts
            .into_iter()
            .find(|(_, same)| !same)
            .map_or(WriteCause::Managed, |(cause, _)| cause),
    )
}

/// A normalized status with each count replaced by its emptiness (0 stays 0, any other count is 1),
/// each age by whether there is one, and each number in a condition's message by `#`: what remains is
/// what is written at once. An age going to 0 is not news (the visible count says whether the queue is
/// empty), and neither is a number in a message: every one of them is a count or age of the queue or
/// DLQ, a replica count, or an observed figure that status carries in a field of its own (compared here),
/// or one derived from them, like `ScalingActive`'s "new" messages, which goes to 0 and back at every poll
/// on a busy queue.
fn without_counts(s: &QueueConsumerStatus) -> QueueConsumerStatus {
    let empty = |v: &mut Option<i64>| *v = v.map(i64::signum);
    let some = |v: &mut Option<i64>| *v = v.map(|_| 1);
    let mut s = s.clone();
    if let Some(q) = s.queue.as_mut() {
        empty(&mut q.visible);
        empty(&mut q.in_flight);
        empty(&mut q.delayed);
        some(&mut q.oldest_age_seconds);
    }
    if let Some(d) = s.dead_letter.as_mut() {
        empty(&mut d.visible);
        some(&mut d.oldest_age_seconds);
    }
    // The objective's figures are counts too: its verdict (ObjectiveMet's status) is written at once.
    if let Some(o) = s.objective.as_mut() {
        let some = |v: &mut Option<f64>| *v = v.map(|_| 1.0);
        some(&mut o.dwell_p99_seconds);
        some(&mut o.over_objective);
        some(&mut o.burn_rate);
        o.messages = o.messages.map(|_| 1);
    }
    for c in &mut s.conditions {
        c.message = numbers_masked(&c.message);
    }
    s
}

/// Each number as `#`, a duration with its units included: "12 visible, 0 in flight, the oldest 2m5s old"
/// reads "# visible, # in flight, the oldest # old". An age crossing a unit ("59s" to "1m0s") is no more
/// news than one that does not.
fn numbers_masked(message: &str) -> String {
    let chars: Vec<char> = message.chars().collect();
    let mut out = String::with_capacity(message.len());
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_ascii_digit() {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        out.push('#');
        loop {
            while chars.get(i).is_some_and(char::is_ascii_digit) {
                i += 1;
            }
            // A unit (d, h, m, s, ms) right after the digits belongs to the number when a word does not
            // go on after it: "1m10s", "500ms", "30s" but not "3 messages" or "10seconds".
            let unit = chars[i..]
                .iter()
                .take_while(|c| matches!(c, 'd' | 'h' | 'm' | 's'))
                .count();
            let after = chars.get(i + unit);
            if (1..=2).contains(&unit) && !after.is_some_and(|c| c.is_alphabetic()) {
                i += unit;
                if after.is_some_and(char::is_ascii_digit) {
                    continue;
                }
            }
            break;
        }
    }
    out
}

/// A condition that changed status, for an Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    /// False or Unknown: something got worse.
    pub warning: bool,
}

/// Conditions whose status changed. A condition seen for the first time counts only when it is not
/// True and not merely waiting for its first observation: a healthy first reconcile is no news.
///
/// `HandlerHealthy` speaks of its dependency only: a Warning `DownstreamFailing` when it turns False, a
/// Normal `DownstreamRecovered` when it goes from False to True. Its Unknown (no worker scraped: scaled to
/// zero, pods starting) is no news either way.
pub fn transitions(old: &[Condition], new: &[Condition]) -> Vec<Transition> {
    let f = Status::False.as_str();
    new.iter()
        .filter_map(|c| {
            let before = old.iter().find(|o| o.type_ == c.type_);
            let changed = match before {
                Some(o) => o.status != c.status,
                None => c.status != Status::True.as_str() && c.reason != reason::NO_OBSERVATIONS,
            };
            if !changed {
                return None;
            }
            // ObjectiveMet speaks of the objective only: a Warning when it turns False, a Normal when it
            // is met again; Unknown (too few messages, a lull) is no news either way.
            if c.type_ == conditions::OBJECTIVE_MET
                && c.status != f
                && before.is_none_or(|o| o.status != f || c.status != Status::True.as_str())
            {
                return None;
            }
            let reason = if c.type_ == conditions::HANDLER_HEALTHY {
                match (before.map(|o| o.status.as_str()), c.status.as_str()) {
                    (_, s) if s == f => reason::DOWNSTREAM_FAILING,
                    (Some(o), s) if o == f && s == Status::True.as_str() => {
                        reason::DOWNSTREAM_RECOVERED
                    }
                    _ => return None,
                }
                .to_string()
            } else {
                c.reason.clone()
            };
            Some(Transition {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason,
                message: c.message.clone(),
                // A rollout after a spec change is expected news, not a warning; a stalled one is.
                warning: c.status != Status::True.as_str() && c.reason != reason::ROLLING_OUT,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
