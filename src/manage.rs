//! `spec.queue.manage`: what the controller would change on a queue, decided from the spec and the
//! queue's facts alone (pure; the SQS calls are `aws::manage`, the orchestration `controller::manage`).
//!
//! The values are the rules' own (`validate`): the least VisibilityTimeout none of the VT rules fires
//! at, a maxReceiveCount of at least 3 (and one spanning `outageTolerance` with the breaker off), a
//! retention that outlives the retry window. Every change only ever raises a setting: a lower VT
//! under running workers can let a lease lapse mid-message (double handling), a lower maxReceiveCount
//! dead-letters messages earlier than the queue's owner set, a lower retention deletes messages.

use std::collections::BTreeMap;

use crate::api::{Duration, QueueConsumerSpec};
use crate::aws::facts::{
    ATTR_FIFO, ATTR_REDRIVE_POLICY, ATTR_RETENTION, ATTR_VISIBILITY_TIMEOUT, QueueFacts,
    RedrivePolicy, is_fifo,
};
use crate::validate::{self, DEAD_LETTER_RETENTION_MINIMUM, VISIBILITY_MAXIMUM};

/// SQS's default retention, which a queue the controller creates starts from.
const DEFAULT_RETENTION: Duration = Duration::from_secs(4 * 24 * 3600);
/// SQS's longest queue name (with `.fifo`).
const MAX_QUEUE_NAME: usize = 80;
/// Tag naming the QueueConsumer (`NAMESPACE/NAME`) on the queues it creates.
pub const TAG_QUEUE_CONSUMER: &str = "sqs.consumers.dev/queueconsumer";
/// Tag naming the operator on the queues it creates.
pub const TAG_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Attribute turning on SSE-SQS (server-side encryption with SQS-owned keys).
pub const ATTR_SSE: &str = "SqsManagedSseEnabled";

/// A setting `queue.manage` may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Attribute {
    VisibilityTimeout,
    MaxReceiveCount,
    MessageRetentionPeriod,
}

impl Attribute {
    pub fn as_str(self) -> &'static str {
        match self {
            Attribute::VisibilityTimeout => "VisibilityTimeout",
            Attribute::MaxReceiveCount => "MaxReceiveCount",
            Attribute::MessageRetentionPeriod => "MessageRetentionPeriod",
        }
    }
}

/// One setting raised, from what to what (as status and Events show it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub attribute: Attribute,
    pub from: String,
    pub to: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} from {} to {}",
            self.attribute.as_str(),
            self.from,
            self.to
        )
    }
}

/// The settings a QueueConsumer wants its queue to have, given what the queue has now: each at least
/// the queue's current value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Targets {
    pub visibility_timeout: Duration,
    /// None: the queue has no redrive policy (only `create` adds one).
    pub max_receive_count: Option<u32>,
    pub retention: Duration,
}

/// What the rules want of `q` for `spec`, never below what `q` has.
pub fn targets(spec: &QueueConsumerSpec, q: &QueueFacts) -> Targets {
    let vt = q
        .visibility_timeout
        .max(validate::visibility_timeout_needed(spec));
    let max_receive_count = q
        .redrive
        .as_ref()
        .map(|r| receive_count(spec, vt, r.max_receive_count));
    let mut retention = q.retention;
    if let Some(r) = max_receive_count {
        let window = validate::retry_window(spec, vt, r);
        if window > retention {
            retention = retention.max(validate::retention_covering(window));
        }
    }
    if let Some(hold) = validate::outage_hold(spec)
        && hold >= retention
    {
        retention = retention.max(validate::retention_covering(hold));
    }
    Targets {
        visibility_timeout: vt,
        max_receive_count,
        retention,
    }
}

/// maxReceiveCount: at least 3 (MaxReceiveCountTooLow) and, with the breaker off, enough to span
/// `outageTolerance`, but only as far as the retry window still fits SQS's longest retention (a window
/// past it loses messages silently, worse than an early dead-letter); never below `current`.
fn receive_count(spec: &QueueConsumerSpec, vt: Duration, current: u32) -> u32 {
    let mut want = current.max(validate::MIN_RECEIVE_COUNT);
    if let Some(outage) = validate::receive_count_for_outage(spec, vt)
        && outage > want
    {
        let fits = |r: u32| validate::retry_window(spec, vt, r) <= DEAD_LETTER_RETENTION_MINIMUM;
        want = (want..=outage).rev().find(|&r| fits(r)).unwrap_or(want);
    }
    want
}

/// The SetQueueAttributes a QueueConsumer's queue needs: the changes (empty: in sync) and the targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttributePlan {
    pub targets: Targets,
    pub changes: Vec<Change>,
    /// The attributes to send (only those that change).
    pub attributes: BTreeMap<String, String>,
}

impl AttributePlan {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// `q` as it is once the plan is applied.
    pub fn applied_to(&self, q: &QueueFacts) -> QueueFacts {
        let mut q = q.clone();
        q.visibility_timeout = self.targets.visibility_timeout;
        q.retention = self.targets.retention;
        if let (Some(r), Some(policy)) = (self.targets.max_receive_count, q.redrive.as_mut()) {
            policy.max_receive_count = r;
        }
        q
    }
}

/// Whole seconds, as SQS attributes are written.
fn seconds(d: Duration) -> String {
    d.as_secs_ceil().to_string()
}

/// The RedrivePolicy attribute's JSON.
pub fn redrive_policy_json(dead_letter_arn: &str, max_receive_count: u32) -> String {
    serde_json::json!({
        "deadLetterTargetArn": dead_letter_arn,
        "maxReceiveCount": max_receive_count,
    })
    .to_string()
}

/// What `spec` would change on `q`.
pub fn plan_attributes(spec: &QueueConsumerSpec, q: &QueueFacts) -> AttributePlan {
    let targets = targets(spec, q);
    let mut changes = Vec::new();
    let mut attributes = BTreeMap::new();
    if targets.visibility_timeout != q.visibility_timeout {
        changes.push(Change {
            attribute: Attribute::VisibilityTimeout,
            from: q.visibility_timeout.to_string(),
            to: targets.visibility_timeout.to_string(),
        });
        attributes.insert(
            ATTR_VISIBILITY_TIMEOUT.to_string(),
            seconds(targets.visibility_timeout),
        );
    }
    if let (Some(policy), Some(r)) = (&q.redrive, targets.max_receive_count)
        && r != policy.max_receive_count
    {
        changes.push(Change {
            attribute: Attribute::MaxReceiveCount,
            from: policy.max_receive_count.to_string(),
            to: r.to_string(),
        });
        attributes.insert(
            ATTR_REDRIVE_POLICY.to_string(),
            redrive_policy_json(&policy.dead_letter_target_arn, r),
        );
    }
    if targets.retention != q.retention {
        changes.push(Change {
            attribute: Attribute::MessageRetentionPeriod,
            from: q.retention.to_string(),
            to: targets.retention.to_string(),
        });
        attributes.insert(ATTR_RETENTION.to_string(), seconds(targets.retention));
    }
    AttributePlan {
        targets,
        changes,
        attributes,
    }
}

/// Another QueueConsumer that manages the same queue: its label for messages and its spec.
pub struct Peer<'a> {
    /// `NAMESPACE/NAME`, or a neutral phrase for one in another namespace.
    pub label: String,
    pub spec: &'a QueueConsumerSpec,
}

/// What the controller does about the queue's settings in one reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// `spec.suspend`: the queue is not touched.
    Suspended,
    /// The queue already has what the rules want.
    InSync(AttributePlan),
    /// SetQueueAttributes with these changes.
    Update(AttributePlan),
    /// Another QueueConsumer manages the queue and wants other values: nothing is changed.
    Conflict { with: Vec<String>, mine: Targets },
}

/// The decision for `spec` on `q`, with the peers that manage the same queue (neither suspended nor
/// off). Two QueueConsumers conflict when their targets differ and either would change the queue:
/// each raising to its own would have the queue's settings depend on who reconciled last, so neither
/// changes it (both see the same facts, so both decide so).
pub fn decide(spec: &QueueConsumerSpec, q: &QueueFacts, peers: &[Peer<'_>]) -> Decision {
    if spec.suspend {
        return Decision::Suspended;
    }
    let plan = plan_attributes(spec, q);
    let with: Vec<String> = peers
        .iter()
        .filter(|p| {
            let theirs = plan_attributes(p.spec, q);
            theirs.targets != plan.targets && !(plan.is_empty() && theirs.is_empty())
        })
        .map(|p| p.label.clone())
        .collect();
    if !with.is_empty() {
        return Decision::Conflict {
            with,
            mine: plan.targets,
        };
    }
    if plan.is_empty() {
        Decision::InSync(plan)
    } else {
        Decision::Update(plan)
    }
}

/// Why a queue cannot be created from a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManageError {
    #[error(
        "spec.queue.url {url} ends in no queue name SQS accepts ({why}): with queue.manage: create the URL's last segment is the queue's name, 1 to 80 letters, digits, '-' or '_' (FIFO: ending in .fifo)"
    )]
    InvalidQueueName { url: String, why: String },
}

/// A queue to create: its name, attributes and tags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewQueue {
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
}

/// `queue.manage: create` for a missing queue: its DLQ first (so the queue is created with its
/// redrive policy and never runs without one), then the queue. The redrive policy's maxReceiveCount
/// is `max_receive_count`; the DLQ's ARN is known only once it exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatePlan {
    pub dead_letter: NewQueue,
    pub queue: NewQueue,
    pub max_receive_count: u32,
}

/// The queue's name from its URL, checked as SQS checks it.
pub fn queue_name(url: &str) -> Result<String, ManageError> {
    let name = crate::aws::facts::queue_name_from_url(url);
    let invalid = |why: &str| ManageError::InvalidQueueName {
        url: url.to_string(),
        why: why.to_string(),
    };
    if url.trim_end().ends_with('/') || crate::aws::QueueId::of(None, url).account.is_empty() {
        return Err(invalid("it does not end in /ACCOUNT/NAME"));
    }
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    if base.is_empty() {
        return Err(invalid("it is empty"));
    }
    if name.len() > MAX_QUEUE_NAME {
        return Err(invalid("longer than 80 characters"));
    }
    if !base
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(invalid(
            "it has characters other than letters, digits, - and _",
        ));
    }
    Ok(name.to_string())
}

/// The name of the DLQ `create` makes for queue `name`: `NAME-dlq`, `NAME-dlq.fifo` for FIFO.
pub fn dead_letter_name(name: &str) -> String {
    match name.strip_suffix(".fifo") {
        Some(base) => format!("{base}-dlq.fifo"),
        None => format!("{name}-dlq"),
    }
}

/// The tags of a queue created for QueueConsumer `namespace/name`.
pub fn tags(namespace: &str, name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            TAG_QUEUE_CONSUMER.to_string(),
            format!("{namespace}/{name}"),
        ),
        (TAG_MANAGED_BY.to_string(), "qc-operator".to_string()),
    ])
}

/// A new queue's attributes: FIFO by name, SSE-SQS on.
fn base_attributes(name: &str) -> BTreeMap<String, String> {
    let mut a = BTreeMap::from([(ATTR_SSE.to_string(), "true".to_string())]);
    if is_fifo(name) {
        a.insert(ATTR_FIFO.to_string(), "true".to_string());
    }
    a
}

/// The queue as SQS would create it before the controller's settings, with a redrive policy of the
/// recommended count: what [`targets`] raises from.
fn fresh_queue(url: &str) -> QueueFacts {
    QueueFacts {
        url: url.to_string(),
        arn: None,
        visibility_timeout: Duration::ZERO,
        retention: DEFAULT_RETENTION,
        fifo: is_fifo(url),
        redrive: Some(RedrivePolicy {
            dead_letter_target_arn: String::new(),
            max_receive_count: validate::RECOMMENDED_RECEIVE_COUNT,
        }),
        visible: None,
        in_flight: None,
        delayed: None,
    }
}

/// The queues `create` makes for `spec` (QueueConsumer `namespace/consumer`) when its queue is missing.
pub fn plan_create(
    spec: &QueueConsumerSpec,
    namespace: &str,
    consumer: &str,
) -> Result<CreatePlan, ManageError> {
    let name = queue_name(&spec.queue.url)?;
    let dlq = dead_letter_name(&name);
    if dlq.len() > MAX_QUEUE_NAME {
        return Err(ManageError::InvalidQueueName {
            url: spec.queue.url.clone(),
            why: format!("its dead-letter queue's name {dlq} would be longer than 80 characters"),
        });
    }
    let t = targets(spec, &fresh_queue(&spec.queue.url));
    let mut queue_attributes = base_attributes(&name);
    queue_attributes.insert(
        ATTR_VISIBILITY_TIMEOUT.to_string(),
        seconds(t.visibility_timeout.min(VISIBILITY_MAXIMUM)),
    );
    queue_attributes.insert(ATTR_RETENTION.to_string(), seconds(t.retention));
    let mut dead_letter_attributes = base_attributes(&dlq);
    dead_letter_attributes.insert(
        ATTR_RETENTION.to_string(),
        seconds(DEAD_LETTER_RETENTION_MINIMUM),
    );
    let tags = tags(namespace, consumer);
    Ok(CreatePlan {
        dead_letter: NewQueue {
            name: dlq,
            attributes: dead_letter_attributes,
            tags: tags.clone(),
        },
        queue: NewQueue {
            name,
            attributes: queue_attributes,
            tags,
        },
        max_receive_count: t
            .max_receive_count
            .unwrap_or(validate::RECOMMENDED_RECEIVE_COUNT),
    })
}

/// The peers that would create the missing queue with other settings than `spec` (the same check as
/// [`decide`]'s, on the queue as it would be created): then nobody creates it.
pub fn create_conflicts(spec: &QueueConsumerSpec, peers: &[Peer<'_>]) -> Vec<String> {
    let mine = targets(spec, &fresh_queue(&spec.queue.url));
    peers
        .iter()
        .filter(|p| targets(p.spec, &fresh_queue(&spec.queue.url)) != mine)
        .map(|p| p.label.clone())
        .collect()
}

/// Why `create` must not give `q` (a live queue without a redrive policy) one now, if so. SQS moves a
/// message to the DLQ at the receive that takes its receive count past maxReceiveCount, counting the
/// receives made before the policy existed: on a queue whose consumer has been retrying, messages
/// already received `max_receive_count` times would be dead-lettered on their next receive with no
/// handler call. The receive counts of a backlog cannot be read without receiving it, so the policy
/// waits for a queue that holds nothing (visible, in flight or delayed), as its counts say; unknown
/// counts wait too. The message names the queue, what it holds and the two ways on.
pub fn redrive_policy_deferred(q: &QueueFacts, max_receive_count: u32) -> Option<String> {
    let held = match (q.visible, q.in_flight, q.delayed) {
        (Some(v), Some(f), Some(d)) => Some((v, f, d)),
        _ => None,
    };
    let what = match held {
        Some((0, 0, 0)) => return None,
        Some((v, f, d)) => format!("holds {v} visible, {f} in flight and {d} delayed messages"),
        None => "holds an unknown number of messages (its counts were not read)".to_string(),
    };
    Some(format!(
        "queue {} has no redrive policy and {what}: a policy set now would send any of them already received more than {max_receive_count} times to the dead-letter queue at their next receive, unhandled. It (and its dead-letter queue) is set once the queue is empty; to set it now, accepting that, set the RedrivePolicy yourself",
        q.url
    ))
}

/// `create` for an existing queue without a redrive policy: its DLQ, and the policy to set.
pub fn plan_dead_letter(
    spec: &QueueConsumerSpec,
    q: &QueueFacts,
    namespace: &str,
    consumer: &str,
) -> Result<(NewQueue, u32), ManageError> {
    let plan = plan_create(spec, namespace, consumer)?;
    Ok((plan.dead_letter, added_receive_count(spec, q)))
}

/// The maxReceiveCount of the redrive policy `create` adds to `q`, a queue without one.
pub fn added_receive_count(spec: &QueueConsumerSpec, q: &QueueFacts) -> u32 {
    let mut with_policy = q.clone();
    with_policy.redrive = Some(RedrivePolicy {
        dead_letter_target_arn: String::new(),
        max_receive_count: validate::RECOMMENDED_RECEIVE_COUNT,
    });
    targets(spec, &with_policy)
        .max_receive_count
        .unwrap_or(validate::RECOMMENDED_RECEIVE_COUNT)
}

#[cfg(test)]
mod tests;
