//! `qc-worker invoke`: one message, made up by a handler author (a body and attributes), handed to a
//! local handler exactly as the worker hands a received one (the same `Handler`: CloudEvent headers
//! or the exec environment, the request-head cap, the timeout, the process-group kill), and the
//! answer classified as the worker would classify it. No SQS is involved. With `--batch`, several
//! messages in one batch call (the worker's batch mode), and how the answer was read, per message.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::handler::{BatchVerdict, Handler, QueueContext, Verdict};
use super::sqs::{AttributeValue, Message};

/// The message to send.
#[derive(Clone, Debug, Default)]
pub struct Invocation {
    pub body: Vec<u8>,
    /// (name, value) String attributes.
    pub attributes: Vec<(String, String)>,
    pub message_id: String,
    pub receive_count: u32,
    pub group_id: Option<String>,
}

/// The queue the handler is told the message comes from.
pub fn queue_context(queue_url: Option<&str>) -> QueueContext {
    QueueContext {
        url: queue_url
            .unwrap_or("https://sqs.us-east-1.amazonaws.com/000000000000/invoke")
            .to_string(),
        arn: "arn:aws:sqs:us-east-1:000000000000:invoke".to_string(),
    }
}

/// The message as the worker would have received it.
pub fn message(inv: &Invocation) -> Message {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut attributes: Vec<(String, AttributeValue)> = inv
        .attributes
        .iter()
        .map(|(n, v)| {
            (
                n.clone(),
                AttributeValue {
                    data_type: "String".into(),
                    string: Some(v.clone()),
                    binary: None,
                },
            )
        })
        .collect();
    // SQS returns attributes sorted by name.
    attributes.sort_by(|a, b| a.0.cmp(&b.0));
    Message {
        id: inv.message_id.clone(),
        receipt_handle: "invoke".into(),
        body: Bytes::from(inv.body.clone()),
        receive_count: inv.receive_count.max(1),
        group_id: inv.group_id.clone(),
        deduplication_id: inv.group_id.as_ref().map(|_| inv.message_id.clone()),
        sequence_number: None,
        sent_timestamp: Some(now),
        first_receive_timestamp: Some(now),
        attributes,
        trace_header: None,
        handler_traceparent: None,
        received_at: std::time::Instant::now(),
    }
}

/// What the worker would do with the message after this answer, as one line, and the exit status
/// of `qc-worker invoke` (0 success, 65 poison, 75 retry).
pub fn outcome(verdict: Option<&Verdict>, timeout: Duration) -> (String, u8) {
    match verdict {
        Some(Verdict::Success) => ("success: the worker deletes the message".into(), 0),
        Some(Verdict::Poison(reason)) => (
            format!(
                "poison: {reason}; the worker applies onPoison (default: sends it to the DLQ with this reason)"
            ),
            65,
        ),
        Some(Verdict::Transient {
            reason,
            retry_after,
            cause,
        }) => {
            let when = retry_after.map_or_else(
                || "after the retry backoff (--retry-base, doubled per receive)".to_string(),
                |d| format!("after {} s (Retry-After)", d.as_secs()),
            );
            let breaker = match cause {
                super::handler::Cause::Downstream => {
                    "; counted by the outage breaker as a dependency failure"
                }
                super::handler::Cause::Unavailable => {
                    "; opens the outage breaker at once (the dependency is unavailable)"
                }
                super::handler::Cause::Other => "",
            };
            (format!("retry: {reason}; retried {when}{breaker}"), 75)
        }
        Some(Verdict::Unreachable(reason)) => (
            format!(
                "unreachable: {reason}; the worker pauses receiving until the handler accepts connections"
            ),
            75,
        ),
        None => (
            format!(
                "retry: the handler did not answer within the timeout {}; the call was stopped and the message is retried",
                crate::api::Duration::from_std(timeout)
            ),
            75,
        ),
    }
}

/// Sends the message to the handler and returns its classified outcome and exit status.
pub async fn run(handler: &Handler, inv: &Invocation, timeout: Duration) -> (String, u8) {
    let msg = message(inv);
    let deadline = tokio::time::Instant::now() + timeout;
    let verdict = handler.handle(&msg, deadline).await;
    outcome(verdict.as_ref(), timeout)
}

/// The most messages one batch call may hold (`--batch-max-items` 1..100).
pub const MAX_BATCH: usize = 100;

/// The message id `invoke` gives the message at `index` (from 0) when none is named: the first is
/// the single-message default.
pub fn default_message_id(index: usize) -> String {
    format!("00000000-0000-4000-8000-{:012}", index + 1)
}

/// How the answer of a batch call was read, per message, as the worker would read it: one line per
/// message (`ID: deleted: why` or `ID: retried: why`, in batch order), then a summary line, and the
/// exit status (0 when every message is deleted, 75 when any is retried; a batch answer never makes
/// an item poison).
pub fn batch_outcome(
    verdict: Option<&BatchVerdict>,
    ids: &[&str],
    timeout: Duration,
) -> (Vec<String>, u8) {
    let n = ids.len();
    match verdict {
        Some(BatchVerdict::Items { failed }) => {
            let mut lines: Vec<String> = ids
                .iter()
                .enumerate()
                .map(|(at, id)| {
                    if failed.contains(&at) {
                        format!(
                            "{id}: retried: named in batchItemFailures; retried after the retry backoff (--retry-base, doubled per receive), and moved to the DLQ by the redrive policy once it has been received maxReceiveCount times"
                        )
                    } else {
                        format!("{id}: deleted: not named in batchItemFailures")
                    }
                })
                .collect();
            let retried = failed.len();
            let read = if retried == 0 {
                "the answer names no item in batchItemFailures (an empty body, {} or an empty list): every item succeeded".to_string()
            } else {
                format!(
                    "the answer's batchItemFailures names {retried} of the {n} items: those are retried, the rest deleted"
                )
            };
            let breaker = if retried == n {
                "; says nothing of the dependency to the outage breaker (every item listed)"
            } else {
                "; counted by the outage breaker as a success"
            };
            lines.push(format!(
                "batch of {n}: {} deleted, {retried} retried; {read}{breaker}",
                n - retried
            ));
            (lines, if retried == 0 { 0 } else { 75 })
        }
        Some(BatchVerdict::Whole(Verdict::Success)) => {
            let mut lines: Vec<String> = ids
                .iter()
                .map(|id| format!("{id}: deleted: the call succeeded for the whole batch"))
                .collect();
            lines.push(format!("batch of {n}: {n} deleted, 0 retried"));
            (lines, 0)
        }
        whole => {
            // One verdict for every item: a failed call, an unusable answer, a timeout. Poison for
            // the whole batch has already been turned into a retry (`BatchVerdict::whole`).
            let verdict = match whole {
                Some(BatchVerdict::Whole(v)) => Some(v),
                _ => None,
            };
            let (line, _) = outcome(verdict, timeout);
            let why = match verdict {
                Some(
                    Verdict::Poison(reason)
                    | Verdict::Unreachable(reason)
                    | Verdict::Transient { reason, .. },
                ) => reason.clone(),
                _ => format!(
                    "no answer within the timeout {}",
                    crate::api::Duration::from_std(timeout)
                ),
            };
            let mut lines: Vec<String> = ids
                .iter()
                .map(|id| format!("{id}: retried: {why}"))
                .collect();
            lines.push(format!(
                "batch of {n}: 0 deleted, {n} retried; the whole batch: {line}"
            ));
            (lines, 75)
        }
    }
}

/// Sends the messages to the handler as one batch call and returns how its answer was read (the
/// lines of [`batch_outcome`]) and the exit status.
pub async fn run_batch(
    handler: &Handler,
    invs: &[Invocation],
    timeout: Duration,
) -> (Vec<String>, u8) {
    let msgs: Vec<Message> = invs.iter().map(message).collect();
    let refs: Vec<&Message> = msgs.iter().collect();
    let ids: Vec<&str> = msgs.iter().map(|m| m.id.as_str()).collect();
    let deadline = tokio::time::Instant::now() + timeout;
    let verdict = handler.handle_batch(&refs, deadline).await;
    batch_outcome(verdict.as_ref(), &ids, timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_answer_is_read_per_message() {
        let t = Duration::from_secs(30);
        let ids = ["a", "b", "c"];
        let (lines, code) = batch_outcome(Some(&BatchVerdict::Items { failed: vec![1] }), &ids, t);
        assert_eq!(code, 75);
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(lines[0].starts_with("a: deleted"), "{lines:?}");
        assert!(
            lines[1].starts_with("b: retried: named in batchItemFailures"),
            "{lines:?}"
        );
        assert!(lines[2].starts_with("c: deleted"), "{lines:?}");
        assert!(
            lines[3].starts_with("batch of 3: 2 deleted, 1 retried"),
            "{lines:?}"
        );

        let (lines, code) = batch_outcome(Some(&BatchVerdict::Items { failed: vec![] }), &ids, t);
        assert_eq!(code, 0);
        assert!(
            lines.iter().take(3).all(|l| l.contains(": deleted:")),
            "{lines:?}"
        );
        assert!(lines[3].contains("every item succeeded"), "{lines:?}");

        // 422 for the whole batch retries every item, never dead-letters them.
        let whole = BatchVerdict::whole(Verdict::Poison("handler answered HTTP 422".into()));
        let (lines, code) = batch_outcome(Some(&whole), &ids, t);
        assert_eq!(code, 75);
        assert!(
            lines.iter().take(3).all(|l| l.contains(": retried:")),
            "{lines:?}"
        );
        assert!(
            lines[3].contains("HTTP 422 for the whole batch: every item is retried"),
            "{lines:?}"
        );

        let (lines, code) = batch_outcome(None, &ids, t);
        assert_eq!(code, 75);
        assert!(lines[3].contains("within the timeout 30s"), "{lines:?}");
    }

    #[test]
    fn default_ids_count_from_the_single_default() {
        assert_eq!(
            default_message_id(0),
            "00000000-0000-4000-8000-000000000001"
        );
        assert_eq!(
            default_message_id(11),
            "00000000-0000-4000-8000-000000000012"
        );
    }

    #[test]
    fn outcomes_name_what_the_worker_does_and_map_to_exit_codes() {
        let t = Duration::from_secs(30);
        assert_eq!(outcome(Some(&Verdict::Success), t).1, 0);
        let (line, code) = outcome(Some(&Verdict::Poison("HTTP 422".into())), t);
        assert_eq!(code, 65);
        assert!(line.starts_with("poison: HTTP 422"), "{line}");
        let (line, code) = outcome(
            Some(&Verdict::Transient {
                reason: "HTTP 429".into(),
                retry_after: Some(Duration::from_secs(7)),
                cause: super::super::handler::Cause::Downstream,
            }),
            t,
        );
        assert_eq!(code, 75);
        assert!(line.contains("after 7 s (Retry-After)"), "{line}");
        let (line, code) = outcome(None, t);
        assert_eq!(code, 75);
        assert!(line.contains("within the timeout 30s"), "{line}");
    }

    #[test]
    fn the_message_is_shaped_as_a_received_one() {
        let m = message(&Invocation {
            body: b"{}".to_vec(),
            attributes: vec![("b".into(), "2".into()), ("a".into(), "1".into())],
            message_id: "m-1".into(),
            receive_count: 0,
            group_id: Some("g".into()),
        });
        let names: Vec<&str> = m.attributes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b"], "sorted as SQS returns them");
        assert_eq!(m.receive_count, 1);
        assert_eq!(m.deduplication_id.as_deref(), Some("m-1"));
    }
}
