//! The shapes of SQS's answers as the worker uses them: a received message, a batch entry and its
//! failure, the queue's attributes; and the rules that read them (which batch entries an answer
//! confirms, what GetQueueAttributes says).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::MessageSystemAttributeName;
use bytes::Bytes;

/// A received message, with what the handlers and the idempotency key need.
#[derive(Clone, Debug)]
pub struct Message {
    pub id: String,
    pub receipt_handle: String,
    pub body: Bytes,
    pub receive_count: u32,
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
    pub sequence_number: Option<String>,
    /// Milliseconds since the epoch.
    pub sent_timestamp: Option<u64>,
    /// When SQS first delivered the message, milliseconds since the epoch
    /// (`ApproximateFirstReceiveTimestamp`): the outage breaker asks whether the handler succeeded
    /// since a redelivered message first failed.
    pub first_receive_timestamp: Option<u64>,
    pub attributes: Vec<(String, AttributeValue)>,
    /// The X-Ray trace header SQS keeps for the message (`AWSTraceHeader` system attribute).
    pub trace_header: Option<String>,
    /// Tracing on: the `traceparent` of the worker's `qc.handle` span for the call under way
    /// (`worker::spans`), given to the handler instead of the producer's so its spans nest under the
    /// worker's. Never sent anywhere else (not an attribute: a DLQ copy does not carry it).
    pub handler_traceparent: Option<String>,
    /// When the worker counts the lease from (`lease_start`): the receive's start, or shortly before
    /// its answer after a long poll; never after SQS started the lease unless the answer took longer
    /// than `RECEIVE_LAG` to be read.
    pub received_at: Instant,
}

/// A message attribute: string and number types carry `string`, binary ones `binary`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttributeValue {
    pub data_type: String,
    pub string: Option<String>,
    pub binary: Option<Vec<u8>>,
}

#[cfg(test)]
impl Message {
    /// A message as SQS would first deliver it, with `body` and nothing else: unit tests change the
    /// fields they are about with `..Message::test(body)`.
    pub fn test(body: &'static [u8]) -> Message {
        Message {
            id: "m-1".into(),
            receipt_handle: "rh".into(),
            body: Bytes::from_static(body),
            receive_count: 1,
            group_id: None,
            deduplication_id: None,
            sequence_number: None,
            sent_timestamp: None,
            first_receive_timestamp: None,
            attributes: Vec::new(),
            trace_header: None,
            handler_traceparent: None,
            received_at: Instant::now(),
        }
    }
}

#[cfg(test)]
impl AttributeValue {
    /// A `String` message attribute.
    pub fn string<S: Into<String>>(s: S) -> AttributeValue {
        AttributeValue {
            data_type: "String".into(),
            string: Some(s.into()),
            binary: None,
        }
    }
}

impl Message {
    pub fn attribute(&self, name: &str) -> Option<&AttributeValue> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    pub(super) fn from_sdk(
        m: aws_sdk_sqs::types::Message,
        received_at: Instant,
    ) -> Option<Message> {
        let id = m.message_id?;
        let receipt_handle = m.receipt_handle?;
        let mut sys = m.attributes.unwrap_or_default();
        let mut take = |k: MessageSystemAttributeName| sys.remove(&k);
        let mut attributes: Vec<(String, AttributeValue)> = m
            .message_attributes
            .unwrap_or_default()
            .into_iter()
            .map(|(name, v)| {
                let value = AttributeValue {
                    data_type: v.data_type,
                    string: v.string_value,
                    binary: v
                        .binary_value
                        .map(aws_sdk_sqs::primitives::Blob::into_inner),
                };
                (name, value)
            })
            .collect();
        attributes.sort_by(|a, b| a.0.cmp(&b.0));
        Some(Message {
            receive_count: take(MessageSystemAttributeName::ApproximateReceiveCount)
                .and_then(|c| c.parse().ok())
                .unwrap_or(1),
            group_id: take(MessageSystemAttributeName::MessageGroupId),
            deduplication_id: take(MessageSystemAttributeName::MessageDeduplicationId),
            sequence_number: take(MessageSystemAttributeName::SequenceNumber),
            sent_timestamp: take(MessageSystemAttributeName::SentTimestamp)
                .and_then(|t| t.parse().ok()),
            first_receive_timestamp: take(
                MessageSystemAttributeName::ApproximateFirstReceiveTimestamp,
            )
            .and_then(|t| t.parse().ok()),
            trace_header: take(MessageSystemAttributeName::AwsTraceHeader),
            handler_traceparent: None,
            id,
            receipt_handle,
            body: Bytes::from(m.body.unwrap_or_default().into_bytes()),
            attributes,
            received_at,
        })
    }
}

/// One entry of a batched delete or visibility change.
#[derive(Clone, Debug)]
pub struct Entry {
    pub message_id: String,
    pub receipt_handle: String,
    /// The message's lease runs at least until then (None: unknown): a delete must go out before.
    pub lease_until: Option<Instant>,
}

/// Per-entry failure of a batch call.
#[derive(Clone, Debug)]
pub struct EntryFailure {
    pub index: usize,
    pub code: String,
    pub sender_fault: bool,
    pub message: String,
}

/// What the worker needs from a queue at start.
#[derive(Clone, Debug)]
pub struct QueueInfo {
    pub visibility_timeout: Duration,
    pub arn: String,
    pub fifo: bool,
    pub max_receive_count: Option<u32>,
}

/// The code of an entry a batch answer listed neither as successful nor as failed.
pub const NO_ANSWER: &str = "NoAnswerForEntry";

/// The entries of a batch call that did not succeed, at most one per entry, in entry order. An entry
/// succeeded only if the answer lists it as successful and not as failed; one the answer does not
/// account for (an empty 200, a `Failed` list naming unknown ids) failed with `NO_ANSWER` and is
/// retried, never taken as done. Ids that name no entry, and repeats, are ignored.
pub fn batch_failures(
    failed: &[aws_sdk_sqs::types::BatchResultErrorEntry],
    successful: &[&str],
    len: usize,
) -> Vec<EntryFailure> {
    let index = |id: &str| id.parse::<usize>().ok().filter(|i| *i < len);
    let mut out: Vec<Option<EntryFailure>> = vec![None; len];
    for f in failed {
        if let Some(i) = index(f.id())
            && out[i].is_none()
        {
            out[i] = Some(EntryFailure {
                index: i,
                code: f.code().to_string(),
                sender_fault: f.sender_fault(),
                message: f.message().unwrap_or_default().to_string(),
            });
        }
    }
    let mut succeeded = vec![false; len];
    for id in successful {
        if let Some(i) = index(id) {
            succeeded[i] = true;
        }
    }
    for (i, slot) in out.iter_mut().enumerate() {
        if slot.is_none() && !succeeded[i] {
            *slot = Some(EntryFailure {
                index: i,
                code: NO_ANSWER.to_string(),
                sender_fault: false,
                message: "the answer listed this entry neither as successful nor as failed".into(),
            });
        }
    }
    out.into_iter().flatten().collect()
}

/// Reads what the worker needs from GetQueueAttributes(All).
pub fn parse_queue_info<S: std::hash::BuildHasher>(
    attrs: &HashMap<String, String, S>,
) -> Result<QueueInfo, String> {
    let vt = attrs
        .get("VisibilityTimeout")
        .ok_or("GetQueueAttributes returned no VisibilityTimeout")?;
    let vt: u64 = vt
        .parse()
        .map_err(|_| format!("VisibilityTimeout {vt:?} is not a whole number of seconds"))?;
    let max_receive_count = attrs
        .get(crate::aws::facts::ATTR_REDRIVE_POLICY)
        .and_then(|p| crate::aws::facts::parse_redrive_policy(p).ok())
        .map(|p| p.max_receive_count);
    Ok(QueueInfo {
        visibility_timeout: Duration::from_secs(vt),
        arn: attrs.get("QueueArn").cloned().unwrap_or_default(),
        fifo: attrs.get("FifoQueue").is_some_and(|v| v == "true"),
        max_receive_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_info_reads_vt_fifo_and_redrive() {
        let attrs: HashMap<String, String> = [
            ("VisibilityTimeout", "45"),
            ("QueueArn", "arn:aws:sqs:us-east-1:1:q.fifo"),
            ("FifoQueue", "true"),
            (
                "RedrivePolicy",
                r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:d.fifo","maxReceiveCount":"4"}"#,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let info = parse_queue_info(&attrs).unwrap();
        assert_eq!(info.visibility_timeout, Duration::from_secs(45));
        assert!(info.fifo);
        assert_eq!(info.max_receive_count, Some(4));
        let bad: HashMap<String, String> =
            [("VisibilityTimeout".to_string(), "x".to_string())].into();
        assert!(
            parse_queue_info(&bad)
                .unwrap_err()
                .contains("VisibilityTimeout")
        );
    }

    #[test]
    fn batch_answers_count_only_entries_they_confirm() {
        use aws_sdk_sqs::types::BatchResultErrorEntry;
        let failed = |id: &str| {
            BatchResultErrorEntry::builder()
                .id(id)
                .code("InternalError")
                .sender_fault(false)
                .build()
                .unwrap()
        };
        let codes = |f: Vec<EntryFailure>| -> Vec<(usize, String)> {
            f.into_iter().map(|f| (f.index, f.code)).collect()
        };
        // All confirmed.
        assert!(batch_failures(&[], &["0", "1"], 2).is_empty());
        // An empty 200: nothing confirmed, every entry to retry.
        assert_eq!(
            codes(batch_failures(&[], &[], 2)),
            vec![(0, NO_ANSWER.into()), (1, NO_ANSWER.into())]
        );
        // Repeated and unknown ids: one failure per entry, none past the batch, no entry lost.
        let f = [
            failed("1"),
            failed("1"),
            failed("7"),
            failed("x"),
            failed("-1"),
        ];
        assert_eq!(
            codes(batch_failures(&f, &["0"], 3)),
            vec![(1, "InternalError".into()), (2, NO_ANSWER.into())]
        );
        // Listed both ways: failed wins (a retried delete or release is harmless).
        assert_eq!(codes(batch_failures(&[failed("0")], &["0"], 1)).len(), 1);
    }
}
