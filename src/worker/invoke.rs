//! `qc-worker invoke`: one message, made up by a handler author (a body and attributes), handed to a
//! local handler exactly as the worker hands a received one (the same `Handler`: CloudEvent headers
//! or the exec environment, the request-head cap, the timeout, the process-group kill), and the
//! answer classified as the worker would classify it. No SQS is involved.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::handler::{Handler, QueueContext, Verdict};
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

#[cfg(test)]
mod tests {
    use super::*;

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
