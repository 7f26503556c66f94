//! The redrive step of a reconcile: the annotation `sqs.consumers.dev/redrive-request: TOKEN` asks for one
//! move of the DLQ's messages back to the source queue; `status.deadLetter.redrive` follows it.
//!
//! - A token that differs from `status.deadLetter.redrive.request` starts a move, unless one is running.
//!   A new token while a move runs waits: SQS allows one move task per queue, and two moves of one DLQ
//!   would race for the same messages. It starts at the first reconcile after the running move ends
//!   (`message` says it waits). The same token never starts a second move.
//! - The move is SQS's own task (StartMessageMoveTask, DestinationArn = the source) when the endpoint has
//!   it and the DLQ serves only this source; otherwise the controller's receive → send → delete loop
//!   (`crate::aws::redrive::move_messages`) runs as a background task of this process, which moves only
//!   this source's messages of a shared DLQ. Either way the reconcile never waits for the move.
//! - A move task is followed with ListMessageMoveTasks at each reconcile (every pollInterval) through
//!   its handle kept in status. A controller-run move that a restart interrupted is started again with
//!   the same token (FIFO resends of the same token are deduplicated by SQS for 5 minutes).
//! - Nothing here fails the reconcile: an error becomes state Failed, a `RedriveFailed` Event and the
//!   status message, and scaling goes on.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::task::JoinHandle;

use crate::api::{QueueConsumer, REDRIVE_REQUEST_ANNOTATION, RedriveStatus};
use crate::aws::redrive::{self, MoveOptions, MoveProgress, RedriveError, TaskStart};
use crate::aws::{DeadLetterFacts, Facts};
use crate::sync::lock;

pub const RUNNING: &str = "Running";
pub const COMPLETED: &str = "Completed";
pub const FAILED: &str = "Failed";
pub const METHOD_TASK: &str = "MessageMoveTask";
pub const METHOD_OWN: &str = "ReceiveSendDelete";

/// The request token prefix of an automatic redrive after recovery; the rest is the
/// lastTransitionTime of the HandlerHealthy condition it answers, so each recovery moves once.
pub const AFTER_RECOVERY_PREFIX: &str = "after-recovery:";

pub const REDRIVE_STARTED: &str = "RedriveStarted";
pub const REDRIVE_COMPLETED: &str = "RedriveCompleted";
pub const REDRIVE_FAILED: &str = "RedriveFailed";

type MoveResult = Arc<Mutex<Option<Result<u64, RedriveError>>>>;

/// A move this controller runs itself.
struct Job {
    token: String,
    /// Moved before a restart of this move (counts carried over from status).
    base_moved: u64,
    progress: Arc<MoveProgress>,
    result: MoveResult,
    handle: JoinHandle<()>,
}

/// The moves this process runs, by QueueConsumer key, and the endpoints known to lack move tasks.
#[derive(Default)]
pub struct Redrives {
    jobs: Mutex<HashMap<String, Job>>,
    no_tasks: Mutex<HashSet<Option<String>>>,
}

impl Redrives {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stop a QueueConsumer's move (it is being deleted). Messages already sent stay sent; one in
    /// the middle of its send is sent or not, and stays in the DLQ until its visibility timeout.
    pub fn forget(&self, key: &str) {
        if let Some(job) = lock(&self.jobs).remove(key) {
            job.handle.abort();
        }
    }

    /// Whether a move runs for `key` in this process.
    pub fn running(&self, key: &str) -> bool {
        lock(&self.jobs).contains_key(key)
    }
}

/// An Event the reconcile publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedriveEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// What the step decided: the status block (None: no redrive was ever asked for) and Events.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub status: Option<RedriveStatus>,
    /// The automatic redrive after recovery's block (None: never ran).
    pub after_recovery: Option<RedriveStatus>,
    pub events: Vec<RedriveEvent>,
}

/// Everything one step needs besides the QueueConsumer.
pub struct StepInputs<'a> {
    pub key: &'a str,
    pub redrives: &'a Redrives,
    /// The SDK client for this QueueConsumer's region and endpoint (None: redrive unavailable).
    pub client: Option<&'a aws_sdk_sqs::Client>,
    pub endpoint: Option<&'a str>,
    /// This reconcile's queue facts (None: the queue could not be read).
    pub facts: Option<&'a Facts>,
    pub now: Time,
    /// Messages per second of an automatic redrive after recovery (the spec's, or its default).
    pub recovery_rate: u32,
}

/// The token the annotation asks for, if any (blank values ask for nothing).
pub fn requested(qc: &QueueConsumer) -> Option<&str> {
    qc.metadata
        .annotations
        .as_ref()?
        .get(REDRIVE_REQUEST_ANNOTATION)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
}

/// The token of the automatic redrive after recovery due now, if any: the spec turns it on and
/// HandlerHealthy has been True for `healthyFor` since its last transition (pure).
pub fn after_recovery_due(qc: &QueueConsumer, now: &Time) -> Option<String> {
    let spec = qc.spec.dead_letter.redrive_after_recovery.as_ref()?;
    if !spec.enabled {
        return None;
    }
    let c = qc
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == crate::api::conditions::HANDLER_HEALTHY)?;
    if c.status != "True" {
        return None;
    }
    let since = now.0.duration_since(c.last_transition_time.0);
    let healthy = std::time::Duration::try_from(since).ok()?;
    (healthy >= spec.healthy_for.as_std())
        .then(|| format!("{AFTER_RECOVERY_PREFIX}{}", c.last_transition_time.0))
}

/// Whether `token` is an automatic redrive after recovery's.
pub fn is_after_recovery(token: &str) -> bool {
    token.starts_with(AFTER_RECOVERY_PREFIX)
}

/// One reconcile's redrive step.
pub async fn step(qc: &QueueConsumer, i: &StepInputs<'_>) -> Outcome {
    let dl = qc.status.as_ref().and_then(|s| s.dead_letter.as_ref());
    let old = dl.and_then(|d| d.redrive.clone());
    let old_auto = dl.and_then(|d| d.redrive_after_recovery.clone());
    // One move of a DLQ at a time: a running redrive after recovery is followed, and a request
    // waits for it.
    if let Some(auto) = old_auto
        .clone()
        .filter(|a| a.state.as_deref() == Some(RUNNING))
    {
        let out = follow(auto, i).await;
        return Outcome {
            status: old,
            after_recovery: out.status,
            events: out.events,
        };
    }
    let want = requested(qc);
    match old {
        Some(old) if old.state.as_deref() == Some(RUNNING) => {
            let mut out = follow(old, i).await;
            if let Some(s) = out.status.as_mut()
                && s.state.as_deref() == Some(RUNNING)
            {
                s.message = match want {
                    Some(w) if Some(w) != s.request.as_deref() => Some(format!(
                        "redrive request {w:?} waits for the running move of request {:?} to end",
                        s.request.as_deref().unwrap_or("")
                    )),
                    _ => s.message.take().filter(|m| !m.contains(" waits for ")),
                };
            }
            out.after_recovery = old_auto;
            out
        }
        old => match want {
            Some(token) if old.as_ref().and_then(|o| o.request.as_deref()) != Some(token) => {
                let mut out = start(token, old, i).await;
                out.after_recovery = old_auto;
                out
            }
            _ => match after_recovery_due(qc, &i.now) {
                Some(token)
                    if old_auto.as_ref().and_then(|o| o.request.as_deref())
                        != Some(token.as_str()) =>
                {
                    let out = start(&token, old_auto, i).await;
                    Outcome {
                        status: old,
                        after_recovery: out.status,
                        events: out.events,
                    }
                }
                _ => Outcome {
                    status: old,
                    after_recovery: old_auto,
                    events: vec![],
                },
            },
        },
    }
}

fn failed(token: &str, method: Option<&str>, message: String, now: &Time) -> Outcome {
    Outcome {
        status: Some(RedriveStatus {
            request: Some(token.to_string()),
            state: Some(FAILED.into()),
            method: method.map(str::to_string),
            message: Some(message.clone()),
            started_at: Some(now.clone()),
            finished_at: Some(now.clone()),
            ..RedriveStatus::default()
        }),
        after_recovery: None,
        events: vec![RedriveEvent {
            warning: true,
            reason: REDRIVE_FAILED,
            note: format!("redrive {token:?} failed: {message}"),
        }],
    }
}

/// Where the messages go from and to, once the queue and its DLQ were read.
struct Target {
    source_url: String,
    source_arn: String,
    dlq_url: String,
    dlq_arn: String,
    dlq_messages: u64,
}

/// Ok(None): not knowable now (queue or DLQ unreadable): the request waits for a later reconcile.
fn target(facts: Option<&Facts>) -> Result<Option<Target>, String> {
    let Some(f) = facts else { return Ok(None) };
    match &f.dead_letter {
        DeadLetterFacts::None => Err(format!(
            "queue {} has no redrive policy, so there is no dead-letter queue to move messages from",
            f.queue.url
        )),
        DeadLetterFacts::Missing { arn } => Err(format!(
            "the redrive policy of {} names {arn}, which does not exist",
            f.queue.url
        )),
        DeadLetterFacts::Unreachable { .. } | DeadLetterFacts::NotRead { .. } => Ok(None),
        DeadLetterFacts::Found { queue, .. } => {
            let (Some(source_arn), Some(dlq_arn)) = (f.queue.arn.clone(), queue.arn.clone()) else {
                return Err(
                    "SQS reported no QueueArn for the queue or its dead-letter queue".into(),
                );
            };
            let n = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok()).unwrap_or(0);
            Ok(Some(Target {
                source_url: f.queue.url.clone(),
                source_arn,
                dlq_url: queue.url.clone(),
                dlq_arn,
                dlq_messages: n(queue.visible) + n(queue.in_flight),
            }))
        }
    }
}

async fn start(token: &str, old: Option<RedriveStatus>, i: &StepInputs<'_>) -> Outcome {
    let now = &i.now;
    let Some(client) = i.client else {
        return failed(
            token,
            None,
            "this controller has no SQS client for redrive".into(),
            now,
        );
    };
    let t = match target(i.facts) {
        Ok(Some(t)) => t,
        // Unknown for now: the request waits, and the old status stays as it was.
        Ok(None) => {
            return Outcome {
                status: old,
                after_recovery: None,
                events: vec![],
            };
        }
        Err(message) => return failed(token, None, message, now),
    };
    // A redrive after recovery selects messages, which SQS's move task cannot: always the own move.
    let tasks_known_missing = is_after_recovery(token)
        || lock(&i.redrives.no_tasks).contains(&i.endpoint.map(str::to_string));
    let mut why_own = "the endpoint has no message move tasks".to_string();
    // Whether the DLQ serves this source alone; unknown counts as shared (the controller's own move,
    // which checks each message's source and leaves the ones naming none).
    let sole = sole_source(client, &t).await;
    if !tasks_known_missing {
        if sole {
            match redrive::start_task(client, &t.dlq_arn, &t.source_arn, redrive::DEFAULT_RATE)
                .await
            {
                Ok(TaskStart::Started { handle }) => {
                    let mover = format!("SQS move task {handle}");
                    let how = RedriveStatus {
                        method: Some(METHOD_TASK.into()),
                        task_handle: Some(handle),
                        ..RedriveStatus::default()
                    };
                    return started(token, &t, how, &mover, "", i);
                }
                Ok(TaskStart::Unsupported { detail }) => {
                    tracing::info!(endpoint = ?i.endpoint, %detail, "redrive: no message move tasks at this endpoint; moving with receive/send/delete");
                    lock(&i.redrives.no_tasks).insert(i.endpoint.map(str::to_string));
                }
                Err(e) => return failed(token, Some(METHOD_TASK), e.to_string(), now),
            }
        } else {
            why_own = "the dead-letter queue serves other source queues too (or they could not be listed): only this source's messages are moved".into();
        }
    }
    spawn(token, &t, 0, sole, client, i);
    let how = RedriveStatus {
        method: Some(METHOD_OWN.into()),
        failed: Some(0),
        skipped: Some(0),
        not_selected: Some(0),
        ..RedriveStatus::default()
    };
    let why = if is_after_recovery(token) {
        " (after recovery: only messages dead-lettered for a transient cause, never poison)"
            .to_string()
    } else {
        format!(" ({why_own})")
    };
    started(token, &t, how, "the controller", &why, i)
}

/// A move that just started: `how` (its method and counts) running from `now`, nothing moved yet,
/// and a RedriveStarted Event saying who moves the messages (`mover`), where, and how fast.
fn started(
    token: &str,
    t: &Target,
    how: RedriveStatus,
    mover: &str,
    why: &str,
    i: &StepInputs<'_>,
) -> Outcome {
    let now = &i.now;
    let rate = if is_after_recovery(token) {
        i.recovery_rate
    } else {
        redrive::DEFAULT_RATE
    };
    let note = format!(
        "{mover} moves the messages of {} back to {} at up to {rate} per second{why}",
        t.dlq_url, t.source_url,
    );
    Outcome {
        status: Some(RedriveStatus {
            request: Some(token.to_string()),
            state: Some(RUNNING.into()),
            moved: Some(0),
            started_at: Some(now.clone()),
            ..how
        }),
        after_recovery: None,
        events: vec![RedriveEvent {
            warning: false,
            reason: REDRIVE_STARTED,
            note: format!("redrive {token:?}: {note}"),
        }],
    }
}

/// Whether ListDeadLetterSourceQueues shows the DLQ serving this source alone (false when unknown).
async fn sole_source(client: &aws_sdk_sqs::Client, t: &Target) -> bool {
    match redrive::dead_letter_sources(client, &t.dlq_url).await {
        Ok(sources) => redrive::sole_source(&sources, &t.source_url),
        Err(e) => {
            tracing::info!(error = %e, "redrive: dead-letter sources unknown; moving with receive/send/delete, messages naming no source stay");
            false
        }
    }
}

/// The controller's own move; `sole`: the DLQ serves this source alone, so messages naming no
/// source are this queue's too and move with the rest.
fn spawn(
    token: &str,
    t: &Target,
    base_moved: u64,
    sole: bool,
    client: &aws_sdk_sqs::Client,
    i: &StepInputs,
) {
    let progress = Arc::new(MoveProgress::default());
    let result: MoveResult = Arc::new(Mutex::new(None));
    let auto = is_after_recovery(token);
    let opts = MoveOptions {
        max: Some(redrive::default_max(t.dlq_messages)),
        rate: if auto {
            i.recovery_rate.max(1)
        } else {
            redrive::DEFAULT_RATE
        },
        token: token.to_string(),
        source_arn: Some(t.source_arn.clone()),
        move_unmarked: sole,
        // After recovery: only what failed for a transient cause, each moved automatically once.
        select: crate::triage::Selector {
            transient_only: auto,
            ..crate::triage::Selector::default()
        },
        mark: auto,
    };
    let handle = {
        let (client, dlq, src) = (client.clone(), t.dlq_url.clone(), t.source_url.clone());
        let (progress, result) = (progress.clone(), result.clone());
        tokio::spawn(async move {
            let r = redrive::move_messages(&client, &dlq, &src, &opts, &progress).await;
            *lock(&result) = Some(r);
        })
    };
    let job = Job {
        token: token.to_string(),
        base_moved,
        progress,
        result,
        handle,
    };
    if let Some(previous) = lock(&i.redrives.jobs).insert(i.key.to_string(), job) {
        previous.handle.abort();
    }
}

#[allow(clippy::unnecessary_wraps)] // fits the status block's optional counts
fn count(n: u64) -> Option<i64> {
    Some(i64::try_from(n).unwrap_or(i64::MAX))
}

/// A running move: its progress, or how it ended.
async fn follow(mut s: RedriveStatus, i: &StepInputs<'_>) -> Outcome {
    let token = s.request.clone().unwrap_or_default();
    let mut events = vec![];
    if s.method.as_deref() == Some(METHOD_TASK) {
        let (Some(client), Some(handle)) = (i.client, s.task_handle.clone()) else {
            return Outcome {
                status: Some(s),
                after_recovery: None,
                events,
            };
        };
        let Ok(Some(t)) = target(i.facts) else {
            // The DLQ's ARN is unknown this time: look again at the next reconcile.
            return Outcome {
                status: Some(s),
                after_recovery: None,
                events,
            };
        };
        match redrive::task_progress(client, &t.dlq_arn, &handle).await {
            Ok(Some(p)) => {
                s.moved = count(p.moved);
                match p.status.as_str() {
                    "RUNNING" | "CANCELLING" => {
                        s.message = p.to_move.map(|n| format!("{} of about {n} moved", p.moved));
                    }
                    "COMPLETED" => {
                        s.state = Some(COMPLETED.into());
                        s.finished_at = Some(i.now.clone());
                        s.message = None;
                        events.push(RedriveEvent {
                            warning: false,
                            reason: REDRIVE_COMPLETED,
                            note: format!(
                                "redrive {token:?}: SQS move task {handle} moved {} message(s) back to {}",
                                p.moved, t.source_url
                            ),
                        });
                    }
                    other => {
                        let why = p
                            .failure_reason
                            .unwrap_or_else(|| format!("the task is {other}"));
                        s.state = Some(FAILED.into());
                        s.finished_at = Some(i.now.clone());
                        s.message = Some(format!("SQS move task {handle} ended {other}: {why}"));
                        events.push(RedriveEvent {
                            warning: true,
                            reason: REDRIVE_FAILED,
                            note: format!(
                                "redrive {token:?} failed after {} message(s): SQS move task {handle} ended {other}: {why}",
                                p.moved
                            ),
                        });
                    }
                }
            }
            Ok(None) => {
                s.state = Some(FAILED.into());
                s.finished_at = Some(i.now.clone());
                let m = format!(
                    "SQS no longer lists move task {handle}: its outcome is unknown; check the DLQ and ask again with a new token if messages remain"
                );
                s.message = Some(m.clone());
                events.push(RedriveEvent {
                    warning: true,
                    reason: REDRIVE_FAILED,
                    note: format!("redrive {token:?}: {m}"),
                });
            }
            // Progress unknown this time (throttled, network): the task goes on; look again later.
            Err(e) => s.message = Some(format!("progress not read: {e}")),
        }
        return Outcome {
            status: Some(s),
            after_recovery: None,
            events,
        };
    }

    // The controller's own move.
    let finished = {
        let jobs = lock(&i.redrives.jobs);
        match jobs.get(i.key) {
            Some(job) if job.token == token => {
                let moved = job.base_moved + job.progress.moved();
                s.moved = count(moved);
                s.failed = count(job.progress.failed());
                s.skipped = count(job.progress.skipped());
                s.not_selected = count(job.progress.not_selected());
                lock(&job.result).take().map(|r| (r, moved))
            }
            _ => None,
        }
    };
    match finished {
        Some((result, moved)) => {
            lock(&i.redrives.jobs).remove(i.key);
            s.finished_at = Some(i.now.clone());
            match result {
                Ok(_) => {
                    s.state = Some(COMPLETED.into());
                    s.message = None;
                    let skipped = s.skipped.unwrap_or(0);
                    let mut extra = if skipped > 0 {
                        format!(
                            "; {skipped} message(s) of other source queues left in the dead-letter queue"
                        )
                    } else {
                        String::new()
                    };
                    let not_selected = s.not_selected.unwrap_or(0);
                    if is_after_recovery(&token) {
                        extra.push_str(&format!(
                            "; {not_selected} poison or already redriven message(s) left in the dead-letter queue"
                        ));
                    }
                    events.push(RedriveEvent {
                        warning: false,
                        reason: REDRIVE_COMPLETED,
                        note: format!(
                            "redrive {token:?}: moved {moved} message(s) back to the source queue{extra}"
                        ),
                    });
                }
                Err(e) => {
                    s.state = Some(FAILED.into());
                    s.message = Some(e.to_string());
                    events.push(RedriveEvent {
                        warning: true,
                        reason: REDRIVE_FAILED,
                        note: format!("redrive {token:?} failed after {moved} message(s): {e}"),
                    });
                }
            }
        }
        None if !i.redrives.running(i.key) => {
            // Running in status, but not in this process: the controller restarted. Start it again.
            match (i.client, target(i.facts)) {
                (Some(client), Ok(Some(t))) => {
                    let base = s.moved.and_then(|m| u64::try_from(m).ok()).unwrap_or(0);
                    let sole = sole_source(client, &t).await;
                    spawn(&token, &t, base, sole, client, i);
                    s.message = Some(
                        "the move was interrupted (controller restart) and started again".into(),
                    );
                }
                (_, Err(m)) => {
                    s.state = Some(FAILED.into());
                    s.finished_at = Some(i.now.clone());
                    s.message = Some(m.clone());
                    events.push(RedriveEvent {
                        warning: true,
                        reason: REDRIVE_FAILED,
                        note: format!("redrive {token:?} failed: {m}"),
                    });
                }
                // Queue unreadable now: try again at the next reconcile.
                _ => {}
            }
        }
        None => {}
    }
    Outcome {
        status: Some(s),
        after_recovery: None,
        events,
    }
}

/// `qc-operator redrive NAMESPACE/NAME`: set the annotation to `token`; the controller does the rest.
pub async fn request(
    client: kube::Client,
    namespace: &str,
    name: &str,
    token: &str,
) -> Result<(), kube::Error> {
    use kube::api::{Api, Patch, PatchParams};
    let qcs: Api<QueueConsumer> = Api::namespaced(client, namespace);
    let patch =
        serde_json::json!({"metadata": {"annotations": {REDRIVE_REQUEST_ANNOTATION: token}}});
    qcs.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The source queue of the QueueConsumer `namespace/name`: its URL and region, for the CLI's own
/// calls (`qc-operator dlq NS/NAME`). `spec.queue.endpoint` is not returned: the CLI signs with the
/// caller's credentials and never sends them where a tenant's spec points (`--endpoint-url` is the
/// caller's own choice).
pub async fn queue_of(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> Result<(String, Option<String>), kube::Error> {
    let qcs: kube::Api<QueueConsumer> = kube::Api::namespaced(client, namespace);
    let qc = qcs.get(name).await?;
    Ok((qc.spec.queue.url, qc.spec.queue.region))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_paths_ignore_the_host() {
        assert_eq!(
            redrive::queue_path("http://127.0.0.1:5000/123456789012/orders"),
            redrive::queue_path("https://sqs.us-east-1.amazonaws.com/123456789012/orders/")
        );
        assert_ne!(
            redrive::queue_path("https://sqs.us-east-1.amazonaws.com/1/orders"),
            redrive::queue_path("https://sqs.us-east-1.amazonaws.com/1/payments")
        );
    }
}
