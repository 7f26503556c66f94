//! `spec.queue.manage` in the reconcile: after the queue is read and before the rules run, raise its
//! settings to what the rules recommend (or create it), so the findings it fixed are gone from the
//! status written in the same reconcile. Decisions are `crate::manage`'s; this step makes the calls
//! and says what it did as a condition, status changes and Events.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

use crate::api::conditions::{QUEUE_MANAGED, reason};
use crate::api::{AttributeChange, ManagedStatus, QueueConsumer, QueueManage};
use crate::aws::manage::{QueueWriter, WriteError, create_dead_letter, create_with_dead_letter};
use crate::aws::{Facts, ObserveError, QueueId, RedrivePolicy, SqsError};
use crate::manage::{self, Decision, Peer};

use super::status::Status;

/// Event reason when a write failed.
pub const QUEUE_UPDATE_FAILED: &str = "QueueUpdateFailed";

/// One Event of the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManageEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// The QueueManaged condition the step decided.
#[derive(Clone, Debug, PartialEq)]
pub struct ManagedCondition {
    pub status: Status,
    pub reason: &'static str,
    pub message: String,
}

/// What the step did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// QueueManaged; None with `manage: off`.
    pub condition: Option<ManagedCondition>,
    /// What was changed in this reconcile.
    pub changes: Vec<AttributeChange>,
    pub events: Vec<ManageEvent>,
    /// The queue was changed or created: read it again before the rules run.
    pub reread: bool,
}

impl Outcome {
    fn condition(status: Status, reason: &'static str, message: String) -> Outcome {
        Outcome {
            condition: Some(ManagedCondition {
                status,
                reason,
                message,
            }),
            ..Outcome::default()
        }
    }

    /// The tenancy policy's rule allows less than `spec.queue.manage` asks for: nothing is changed.
    pub fn not_allowed(e: &crate::tenancy::TenancyError) -> Outcome {
        Outcome::condition(Status::False, e.reason(), e.to_string())
    }

    /// Refused before any write: QueueManaged False (its transition is the one Warning Event).
    fn refused(reason: &'static str, message: String) -> Outcome {
        Outcome::condition(Status::False, reason, message)
    }

    fn failed(e: &WriteError) -> Outcome {
        let mut o = Outcome::condition(Status::False, e.reason(), e.to_string());
        o.events.push(ManageEvent {
            warning: true,
            reason: QUEUE_UPDATE_FAILED,
            note: e.to_string(),
        });
        o
    }
}

/// The QueueConsumers of `all` that manage the same queue as `qc` (same endpoint and queue, neither
/// off nor suspended nor being deleted), labelled for `qc`'s messages: `NAMESPACE/NAME` within its
/// namespace, and without a name outside it (a tenant does not learn another's names).
pub fn peers<'a>(qc: &QueueConsumer, all: &'a [QueueConsumer]) -> Vec<Peer<'a>> {
    let id = |q: &QueueConsumer| {
        (
            q.spec.queue.endpoint.clone(),
            QueueId::of(crate::render::region(&q.spec).as_deref(), &q.spec.queue.url),
        )
    };
    let mine = id(qc);
    let ns = qc.namespace().unwrap_or_default();
    all.iter()
        .filter(|o| o.metadata.uid != qc.metadata.uid || o.metadata.uid.is_none())
        .filter(|o| !(o.namespace() == qc.namespace() && o.name_any() == qc.name_any()))
        .filter(|o| {
            !o.spec.queue.manage.is_off()
                && !o.spec.suspend
                && o.metadata.deletion_timestamp.is_none()
                && id(o) == mine
        })
        .map(|o| Peer {
            label: if o.namespace().unwrap_or_default() == ns {
                format!("{ns}/{}", o.name_any())
            } else {
                "a QueueConsumer in another namespace".to_string()
            },
            spec: &o.spec,
        })
        .collect()
}

/// One reconcile's work on the queue's settings. `observed` is the read made this reconcile; `writer`
/// None means the operator has no SQS client to write with (test doubles); `peers` None means the
/// other QueueConsumers could not be listed, so a conflict cannot be ruled out and nothing is changed.
/// A DLQ the step would create is checked with `dead_letter_allowed` (the namespace's tenancy rule)
/// first, as the DLQ of an existing redrive policy is before it is read.
pub async fn step(
    qc: &QueueConsumer,
    observed: Result<&Facts, &ObserveError>,
    writer: Option<&dyn QueueWriter>,
    peers: Option<&[Peer<'_>]>,
    dead_letter_allowed: &(dyn Fn(&str) -> Result<(), String> + Sync),
) -> Outcome {
    let mode = qc.spec.queue.manage;
    if mode.is_off() {
        return Outcome::default();
    }
    if qc.spec.suspend {
        return Outcome::condition(
            Status::Unknown,
            reason::SUSPENDED,
            "spec.suspend is true: the queue's settings are not touched".to_string(),
        );
    }
    let Some(peers) = peers else {
        return Outcome::condition(
            Status::Unknown,
            reason::QUEUE_NOT_READ,
            "the other QueueConsumers could not be listed, so a conflict over this queue cannot be ruled out: nothing is changed until they can".to_string(),
        );
    };
    let facts = match observed {
        Ok(f) => f,
        Err(ObserveError::ReadQueueAttributes {
            source: SqsError::QueueDoesNotExist { .. },
            ..
        }) if mode == QueueManage::Create => {
            let with = manage::create_conflicts(&qc.spec, peers);
            if !with.is_empty() {
                return Outcome::condition(
                    Status::False,
                    reason::MANAGE_CONFLICT,
                    format!(
                        "{} would create queue {} with other settings than this QueueConsumer: nothing is created until they agree; declare the same processing settings, or set queue.manage: off on all but one",
                        with.join(", "),
                        qc.spec.queue.url
                    ),
                );
            }
            return create(qc, writer, dead_letter_allowed).await;
        }
        Err(e) => {
            return Outcome::condition(
                Status::Unknown,
                reason::QUEUE_NOT_READ,
                format!("the queue could not be read, so nothing is changed: {e}"),
            );
        }
    };
    let q = &facts.queue;
    let decision = manage::decide(&qc.spec, q, peers);
    if let Decision::Conflict { with, mine } = &decision {
        return Outcome::condition(
            Status::False,
            reason::MANAGE_CONFLICT,
            format!(
                "{} also manage{} queue {} with queue.manage and want{} other settings than this one (VisibilityTimeout {}, MessageRetentionPeriod {}{}): nothing is changed until they agree; declare the same processing settings, or set queue.manage: off on all but one",
                with.join(", "),
                if with.len() == 1 { "s" } else { "" },
                q.url,
                if with.len() == 1 { "s" } else { "" },
                mine.visibility_timeout,
                mine.retention,
                mine.max_receive_count
                    .map(|r| format!(", maxReceiveCount {r}"))
                    .unwrap_or_default(),
            ),
        );
    }
    let Some(writer) = writer else {
        return Outcome::condition(
            Status::False,
            reason::QUEUE_WRITER_UNAVAILABLE,
            "this operator has no SQS client to change queues with".to_string(),
        );
    };
    let mut out = Outcome::default();
    // `create` on a queue without a redrive policy: its DLQ first, then the policy with the rest.
    let mut q = q.clone();
    let mut attributes = std::collections::BTreeMap::new();
    let adds_policy = mode == QueueManage::Create && q.redrive.is_none();
    let deferred = adds_policy
        .then(|| manage::redrive_policy_deferred(&q, manage::added_receive_count(&qc.spec, &q)))
        .flatten();
    if adds_policy && deferred.is_none() {
        let ns = qc.namespace().unwrap_or_default();
        let (dlq, r) = match manage::plan_dead_letter(&qc.spec, &q, &ns, &qc.name_any()) {
            Ok(p) => p,
            Err(e) => {
                return Outcome::condition(
                    Status::False,
                    reason::INVALID_QUEUE_NAME,
                    e.to_string(),
                );
            }
        };
        if let Err(e) = dead_letter_allowed(&dead_letter_arn(qc, &dlq.name)) {
            return Outcome::condition(Status::False, reason::DEAD_LETTER_QUEUE_NOT_ALLOWED, e);
        }
        let dlq_url = match create_dead_letter(writer, &dlq).await {
            Ok(u) => u,
            Err(e) => return Outcome::failed(&e),
        };
        let arn = match writer.arn(&dlq_url).await {
            Ok(a) => a,
            Err(source) => {
                return Outcome::failed(&WriteError::ReadArn {
                    url: dlq_url,
                    source,
                });
            }
        };
        out.changes.push(created(&dlq_url));
        out.events.push(ManageEvent {
            warning: false,
            reason: reason::QUEUE_CREATED,
            note: format!("created dead-letter queue {dlq_url} for queue {}", q.url),
        });
        attributes.insert(
            crate::aws::facts::ATTR_REDRIVE_POLICY.to_string(),
            manage::redrive_policy_json(&arn, r),
        );
        out.changes.push(AttributeChange {
            queue: q.url.clone(),
            attribute: "RedrivePolicy".to_string(),
            from: String::new(),
            to: format!("deadLetterTargetArn {arn}, maxReceiveCount {r}"),
        });
        q.redrive = Some(RedrivePolicy {
            dead_letter_target_arn: arn,
            max_receive_count: r,
        });
    }
    let plan = manage::plan_attributes(&qc.spec, &q);
    attributes.extend(plan.attributes.clone());
    if attributes.is_empty() {
        if let Some(why) = deferred {
            return Outcome::refused(reason::REDRIVE_POLICY_DEFERRED, why);
        }
        return Outcome::condition(Status::True, reason::QUEUE_IN_SYNC, in_sync_message(&plan));
    }
    if let Err(source) = writer.set_attributes(&q.url, &attributes).await {
        let mut failed = Outcome::failed(&WriteError::SetQueueAttributes {
            url: q.url.clone(),
            source,
        });
        // a DLQ made before the failure is still news
        failed.changes = out.changes;
        failed.events.splice(0..0, out.events);
        return failed;
    }
    let what: Vec<String> = plan.changes.iter().map(ToString::to_string).collect();
    out.changes
        .extend(plan.changes.iter().map(|c| AttributeChange {
            queue: q.url.clone(),
            attribute: c.attribute.as_str().to_string(),
            from: c.from.clone(),
            to: c.to.clone(),
        }));
    let note = if what.is_empty() {
        format!("set the redrive policy of queue {}", q.url)
    } else {
        format!("raised {} on queue {}", what.join(", "), q.url)
    };
    out.events.push(ManageEvent {
        warning: false,
        reason: reason::QUEUE_ATTRIBUTES_UPDATED,
        note: note.clone(),
    });
    out.condition = Some(match deferred {
        // the other settings are raised meanwhile: a longer visibility timeout is safe at any time
        Some(why) => ManagedCondition {
            status: Status::False,
            reason: reason::REDRIVE_POLICY_DEFERRED,
            message: format!("{note}; {why}"),
        },
        None => ManagedCondition {
            status: Status::True,
            reason: reason::QUEUE_ATTRIBUTES_UPDATED,
            message: format!("{note} (queue.manage: {})", mode.as_str()),
        },
    });
    out.reread = true;
    out
}

/// `create` on a missing queue: the DLQ, then the queue wired to it.
async fn create(
    qc: &QueueConsumer,
    writer: Option<&dyn QueueWriter>,
    dead_letter_allowed: &(dyn Fn(&str) -> Result<(), String> + Sync),
) -> Outcome {
    let ns = qc.namespace().unwrap_or_default();
    let plan = match manage::plan_create(&qc.spec, &ns, &qc.name_any()) {
        Ok(p) => p,
        Err(e) => {
            return Outcome::condition(Status::False, reason::INVALID_QUEUE_NAME, e.to_string());
        }
    };
    if let Err(e) = dead_letter_allowed(&dead_letter_arn(qc, &plan.dead_letter.name)) {
        return Outcome::condition(Status::False, reason::DEAD_LETTER_QUEUE_NOT_ALLOWED, e);
    }
    let Some(writer) = writer else {
        return Outcome::condition(
            Status::False,
            reason::QUEUE_WRITER_UNAVAILABLE,
            "this operator has no SQS client to create queues with".to_string(),
        );
    };
    // CreateQueue makes the queue in the account of the credentials, not the one the URL names (and
    // the tenancy policy checked): a URL of another account would get a queue in the operator's own.
    let wanted = QueueId::of(None, &qc.spec.queue.url).account;
    match writer.account().await {
        Ok(acting) if acting == wanted => {}
        Ok(_) => {
            return Outcome::refused(
                reason::QUEUE_IN_ANOTHER_ACCOUNT,
                format!(
                    "spec.queue.url names a queue of AWS account {wanted}, but this QueueConsumer's calls act in another account, where CreateQueue would put it: nothing is created; set spec.aws.roleArn to a role in account {wanted} (allowed by the operator's tenancy policy), or create the queue there yourself"
                ),
            );
        }
        Err(source) => {
            return Outcome::failed(&WriteError::CallerAccount {
                name: plan.queue.name.clone(),
                source,
            });
        }
    }
    let (dlq_url, url) = match create_with_dead_letter(writer, &plan).await {
        Ok(u) => u,
        Err(e) => return Outcome::failed(&e),
    };
    let mut note = format!(
        "created queue {url} (VisibilityTimeout {}s, MessageRetentionPeriod {}s, maxReceiveCount {}) and its dead-letter queue {dlq_url}, SSE-SQS on; both are kept when this QueueConsumer is deleted",
        plan.queue.attributes[crate::aws::facts::ATTR_VISIBILITY_TIMEOUT],
        plan.queue.attributes[crate::aws::facts::ATTR_RETENTION],
        plan.max_receive_count,
    );
    if url.trim_end_matches('/') != qc.spec.queue.url.trim_end_matches('/') {
        note.push_str(&format!(
            "; SQS gave it the URL {url}, not spec.queue.url {}: check the account and region",
            qc.spec.queue.url
        ));
    }
    Outcome {
        condition: Some(ManagedCondition {
            status: Status::True,
            reason: reason::QUEUE_CREATED,
            message: note.clone(),
        }),
        changes: vec![created(&dlq_url), created(&url)],
        events: vec![ManageEvent {
            warning: false,
            reason: reason::QUEUE_CREATED,
            note,
        }],
        reread: true,
    }
}

/// The ARN of the DLQ named `name` beside the QueueConsumer's queue (same account and region).
fn dead_letter_arn(qc: &QueueConsumer, name: &str) -> String {
    let mut id = QueueId::of(
        crate::render::region(&qc.spec).as_deref(),
        &qc.spec.queue.url,
    );
    id.name = name.to_string();
    crate::tenancy::queue_arn(&id)
}

fn created(url: &str) -> AttributeChange {
    AttributeChange {
        queue: url.to_string(),
        attribute: "Queue".to_string(),
        from: String::new(),
        to: "created".to_string(),
    }
}

fn in_sync_message(plan: &manage::AttributePlan) -> String {
    let t = &plan.targets;
    let mut m = format!(
        "VisibilityTimeout {} and MessageRetentionPeriod {}",
        t.visibility_timeout, t.retention
    );
    match t.max_receive_count {
        Some(r) => m.push_str(&format!(", maxReceiveCount {r}")),
        None => m.push_str(
            "; the queue has no redrive policy, which queue.manage: attributes does not add (create does)",
        ),
    }
    m.push_str(" are what the rules ask for, or more (the controller never lowers them)");
    m
}

/// The QueueManaged condition and the `status.managed` block after this step, from the old status.
pub fn apply_to_status(
    outcome: &Outcome,
    mode: QueueManage,
    old: &crate::api::QueueConsumerStatus,
    new: &mut crate::api::QueueConsumerStatus,
    generation: Option<i64>,
    now: &Time,
) {
    new.conditions.retain(|c| c.type_ != QUEUE_MANAGED);
    if mode.is_off() {
        new.managed = None;
        return;
    }
    if let Some(c) = &outcome.condition {
        let fresh = Condition {
            type_: QUEUE_MANAGED.to_string(),
            status: c.status.as_str().to_string(),
            reason: c.reason.to_string(),
            message: crate::aws::scrub_principals(c.message.clone()),
            observed_generation: generation,
            last_transition_time: now.clone(),
        };
        new.conditions.extend(super::status::merge_conditions(
            &old.conditions,
            vec![fresh],
        ));
    }
    if outcome.changes.is_empty() {
        new.managed.clone_from(&old.managed);
    } else {
        new.managed = Some(ManagedStatus {
            last_changes: outcome.changes.clone(),
            last_change_time: Some(now.clone()),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(ns: &str, name: &str, url: &str, manage: &str, suspend: bool) -> QueueConsumer {
        let yaml = format!(
            "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {{name: {name}, namespace: {ns}, uid: {ns}-{name}}}\nspec:\n  queue: {{url: {url}, manage: {manage}}}\n  processing: {{p99: 2s}}\n  handler: {{http: {{}}}}\n  suspend: {suspend}\n"
        );
        serde_saphyr::from_str(&yaml).expect("test consumer parses")
    }

    #[test]
    fn peers_are_other_managing_consumers_of_the_same_queue_named_only_within_the_namespace() {
        let url = "https://sqs.us-east-1.amazonaws.com/1/q";
        let me = consumer("shop", "a", url, "attributes", false);
        let all = vec![
            me.clone(),
            consumer("shop", "b", url, "attributes", false),
            consumer("other", "c", url, "create", false),
            consumer("shop", "off", url, "off", false),
            consumer("shop", "paused", url, "attributes", true),
            consumer(
                "shop",
                "elsewhere",
                "https://sqs.us-east-1.amazonaws.com/1/r",
                "attributes",
                false,
            ),
        ];
        let labels: Vec<String> = peers(&me, &all).into_iter().map(|p| p.label).collect();
        assert_eq!(
            labels,
            vec![
                "shop/b".to_string(),
                "a QueueConsumer in another namespace".to_string()
            ]
        );
    }

    #[tokio::test]
    async fn off_does_nothing_and_suspended_or_unlisted_peers_change_nothing() {
        let url = "https://sqs.us-east-1.amazonaws.com/1/q";
        let off = consumer("shop", "a", url, "off", false);
        let err = ObserveError::ReadQueueAttributes {
            url: url.to_string(),
            source: SqsError::QueueDoesNotExist {
                target: url.to_string(),
            },
        };
        assert_eq!(
            step(&off, Err(&err), None, Some(&[]), &|_| Ok(())).await,
            Outcome::default()
        );
        let paused = consumer("shop", "a", url, "create", true);
        let o = step(&paused, Err(&err), None, Some(&[]), &|_| Ok(())).await;
        assert_eq!(o.condition.map(|c| c.reason), Some(reason::SUSPENDED));
        let on = consumer("shop", "a", url, "create", false);
        let o = step(&on, Err(&err), None, None, &|_| Ok(())).await;
        assert_eq!(o.condition.map(|c| c.status), Some(Status::Unknown));
        assert!(o.changes.is_empty());
    }
}
