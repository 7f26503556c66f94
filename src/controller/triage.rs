//! The DLQ triage step of a reconcile: `status.deadLetter.byReason`, the DLQ's messages by
//! `qc-poison-reason`, read by peeking (receive, then ChangeMessageVisibility 0; never a delete) at
//! most every [`INTERVAL`] while the DLQ holds messages. Never while a redrive of this QueueConsumer
//! runs (a peek hides messages for seconds, which could end a move early), and never on a DLQ with a
//! redrive policy of its own (each peek adds one to the receive count that policy counts).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{QueueConsumer, ReasonCount};
use crate::aws::{DeadLetterFacts, Facts};

/// How often the DLQ is peeked at most.
pub const INTERVAL: std::time::Duration = std::time::Duration::from_mins(5);
/// Messages peeked per read.
pub const PEEK: u64 = 100;
/// Reasons kept in status.
pub const TOP: usize = 5;

/// What the step decided (pure): peek the DLQ at this URL, keep what status has, or clear it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Triage {
    Peek { dlq_url: String },
    Keep,
    Clear,
}

/// Whether to peek now: the DLQ was read and holds visible messages, no move runs, the DLQ has no
/// redrive policy of its own, and the last read is older than [`INTERVAL`].
pub fn decide(qc: &QueueConsumer, facts: Option<&Facts>, moving: bool, now: &Time) -> Triage {
    let Some(f) = facts else { return Triage::Keep };
    let DeadLetterFacts::Found { queue, .. } = &f.dead_letter else {
        return Triage::Clear;
    };
    if queue.visible.unwrap_or(0) + queue.in_flight.unwrap_or(0) == 0 {
        return Triage::Clear;
    }
    if moving || queue.redrive.is_some() || queue.visible.unwrap_or(0) == 0 {
        return Triage::Keep;
    }
    let last = qc
        .status
        .as_ref()
        .and_then(|s| s.dead_letter.as_ref())
        .and_then(|d| d.by_reason_sampled_at.as_ref());
    let due = last.is_none_or(|t| {
        std::time::Duration::try_from(now.0.duration_since(t.0)).is_ok_and(|d| d >= INTERVAL)
    });
    if due {
        Triage::Peek {
            dlq_url: queue.url.clone(),
        }
    } else {
        Triage::Keep
    }
}

/// The top reasons of a peek (pure).
pub fn counts(peeked: &[crate::triage::Peeked], now_ms: u64) -> Vec<ReasonCount> {
    crate::triage::summarise(peeked, now_ms, TOP)
        .by_reason
        .into_iter()
        .map(|c| ReasonCount {
            reason: c.key,
            count: i64::try_from(c.count).unwrap_or(i64::MAX),
        })
        .collect()
}

/// Carry out `t`: the new (byReason, sampledAt), or None to leave status as it was. A failed peek
/// leaves it as it was (a log line; the next reconcile tries again).
pub async fn step(
    t: Triage,
    client: Option<&aws_sdk_sqs::Client>,
    now: &Time,
) -> Option<(Vec<ReasonCount>, Option<Time>)> {
    match t {
        Triage::Keep => None,
        Triage::Clear => Some((Vec::new(), None)),
        Triage::Peek { dlq_url } => {
            let client = client?;
            match crate::aws::triage::peek(client, &dlq_url, PEEK).await {
                Ok(p) => Some((
                    counts(&p.messages, crate::aws::redrive::now_ms()),
                    Some(now.clone()),
                )),
                Err(e) => {
                    tracing::info!(queue = %dlq_url, error = %e, "dlq triage: cannot peek at the dead-letter queue; byReason stays as it was");
                    None
                }
            }
        }
    }
}
