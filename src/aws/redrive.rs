//! Moving a dead-letter queue's messages back to their source ("redrive"), two ways:
//!
//! - SQS's own move task (StartMessageMoveTask, followed with ListMessageMoveTasks), where the endpoint
//!   has it: SQS moves the messages itself, at most one task per queue at a time.
//! - [`move_messages`]: a bounded, rate-limited receive → send → delete loop over the SDK, for endpoints
//!   without move tasks (emulators) and for `qc-operator redrive --queue-url`. It keeps each message's
//!   body, message attributes (string and binary), FIFO group id and X-Ray trace header. A crash, or a
//!   failed delete, between the send and the delete leaves the message in both queues: it is delivered
//!   twice, which at-least-once delivery allows (handlers are idempotent). On FIFO queues the resend
//!   carries a deduplication id derived from the redrive token and the message id, so a repeat of the
//!   same redrive within SQS's 5-minute deduplication window is dropped by SQS.
//!
//! Only this queue's messages are moved (docs/security.md, "Redrive"): a DLQ message's source is its
//! `DeadLetterQueueSourceArn` (set by SQS when a redrive policy moved it) or, for the worker's own
//! dead-letter sends (a plain SendMessage, which SQS does not mark), the [`SOURCE_ATTRIBUTE`]
//! message attribute; a message whose source is another queue is left in the DLQ. A message with
//! neither (sent to the DLQ directly by someone, or by a worker older than the mark) is moved only
//! when ListDeadLetterSourceQueues showed that this queue is the DLQ's only source
//! ([`MoveOptions::move_unmarked`]); otherwise it is left too, and counted as skipped.
//!
//! See docs/operations.md ("Replay the DLQ").

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message,
    MessageSystemAttributeName, MessageSystemAttributeNameForSends, MessageSystemAttributeValue,
    SendMessageBatchRequestEntry,
};
use sha2::{Digest, Sha256};

use crate::aws::classify::{ErrorKind, classify_code};
use crate::aws::facts::is_fifo;
use crate::triage::{
    AUTO_REDRIVE_ATTRIBUTE, MAX_ATTRIBUTES, NOT_A_STRING, Peeked, Selector, reason_key,
};

/// The message attribute with which qc-worker marks its own dead-letter sends: the source queue's ARN.
pub const SOURCE_ATTRIBUTE: &str = "qc-source-arn";
/// The message attribute with which qc-worker gives why it dead-lettered a message (the worker's
/// `dead_letter::REASON_ATTRIBUTE` is this one).
pub const REASON_ATTRIBUTE: &str = "qc-poison-reason";

/// Messages moved per second when nobody says otherwise: well under SQS's per-queue limits and the
/// move task's maximum of 500, so a redrive does not crowd out the consumers' own calls.
pub const DEFAULT_RATE: u32 = 50;
/// The move task's maximum rate (StartMessageMoveTask MaxNumberOfMessagesPerSecond).
pub const MAX_TASK_RATE: u32 = 500;
/// How long a received DLQ message stays hidden while it is being moved.
const RECEIVE_VISIBILITY_SECS: i32 = 60;
/// Long-poll wait of each receive: a receive that finds nothing after this ends the move.
const RECEIVE_WAIT_SECS: i32 = 1;

/// Why a redrive call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RedriveError {
    #[error("{action} on {queue} failed ({code}: {message}){hint}")]
    Call {
        action: &'static str,
        queue: String,
        code: String,
        message: String,
        hint: &'static str,
    },
    #[error(
        "{failed} message(s) could not be sent to {queue} ({detail}); they stay in the dead-letter queue"
    )]
    SendFailed {
        queue: String,
        failed: u64,
        detail: String,
    },
    #[error("ReceiveMessage on {queue} answered a message without a {what}")]
    BadMessage { queue: String, what: &'static str },
    #[error(
        "queue {url} has no redrive policy: there is no dead-letter queue to move messages from"
    )]
    NoDeadLetterQueue { url: String },
    #[error(
        "the redrive policy of {url} names {arn}, which cannot be used ({detail}): fix the policy or create the queue"
    )]
    DeadLetterQueueUnusable {
        url: String,
        arn: String,
        detail: String,
    },
}

pub(crate) const IAM_HINT: &str = ": the role needs sqs:ReceiveMessage, sqs:DeleteMessage, sqs:ChangeMessageVisibility and sqs:GetQueueAttributes on the dead-letter queue and sqs:SendMessage on the source (docs/security.md)";
const TASK_IAM_HINT: &str = ": the role needs sqs:StartMessageMoveTask, sqs:ListMessageMoveTasks and sqs:ListDeadLetterSourceQueues on the dead-letter queue (docs/security.md)";

pub(crate) fn call_error<E, R>(
    action: &'static str,
    queue: &str,
    err: &SdkError<E, R>,
    hint: &'static str,
) -> RedriveError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    let (code, message) = match err {
        SdkError::ServiceError(s) => (
            s.err().code().unwrap_or("Unknown").to_string(),
            s.err()
                .message()
                .map_or_else(|| DisplayErrorContext(err).to_string(), str::to_string),
        ),
        _ => (
            "Unreachable".to_string(),
            DisplayErrorContext(err).to_string(),
        ),
    };
    let denied = classify_code(&code) == Some(ErrorKind::AccessDenied);
    RedriveError::Call {
        action,
        queue: queue.to_string(),
        code,
        message,
        hint: if denied { hint } else { "" },
    }
}

impl RedriveError {
    /// CamelCase reason for status and Events.
    pub fn reason(&self) -> &'static str {
        match self {
            RedriveError::Call { .. } => "RedriveCallFailed",
            RedriveError::SendFailed { .. } => "RedriveSendFailed",
            RedriveError::BadMessage { .. } => "RedriveBadMessage",
            RedriveError::NoDeadLetterQueue { .. } => "NoDeadLetterQueue",
            RedriveError::DeadLetterQueueUnusable { .. } => "DeadLetterQueueUnusable",
        }
    }
}

/// Bounds and identity of one move.
#[derive(Clone, Debug)]
pub struct MoveOptions {
    /// Stop after this many messages moved (None: until a receive finds the DLQ empty).
    pub max: Option<u64>,
    /// Messages per second, at least 1.
    pub rate: u32,
    /// The redrive request's token: part of every FIFO deduplication id of this move.
    pub token: String,
    /// The source queue's ARN: a message whose source ([`message_source`]) is another queue (a DLQ
    /// shared by several sources) is left where it is and counted as skipped. None: every message is
    /// moved (the caller names no source).
    pub source_arn: Option<String>,
    /// Move the messages that name no source too: true only when the DLQ is known to serve this
    /// source alone (ListDeadLetterSourceQueues answered just this queue).
    pub move_unmarked: bool,
    /// Which of this source's messages move (reason, time window); the others are left in the DLQ
    /// and made visible again when the move ends. Default: all.
    pub select: Selector,
    /// Add [`AUTO_REDRIVE_ATTRIBUTE`] (= the token) to each resend (an automatic redrive after
    /// recovery), where the message has room for it.
    pub mark: bool,
}

/// The source queue a DLQ message names: SQS's `DeadLetterQueueSourceArn`, else the worker's
/// [`SOURCE_ATTRIBUTE`]; None when it names none.
pub fn message_source(m: &Message) -> Option<&str> {
    m.attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::DeadLetterQueueSourceArn))
        .map(String::as_str)
        .or_else(|| {
            m.message_attributes()
                .and_then(|a| a.get(SOURCE_ATTRIBUTE))
                .and_then(|v| v.string_value())
        })
}

/// Whether a move for `opts` takes a message whose source is `source`.
pub fn is_ours(opts: &MoveOptions, source: Option<&str>) -> bool {
    match (opts.source_arn.as_deref(), source) {
        (None, _) => true,
        (Some(ours), Some(from)) => ours == from,
        (Some(_), None) => opts.move_unmarked,
    }
}

/// Live counters of a move, readable while it runs.
#[derive(Debug, Default)]
pub struct MoveProgress {
    moved: AtomicU64,
    failed: AtomicU64,
    skipped: AtomicU64,
    not_selected: AtomicU64,
}

impl MoveProgress {
    pub fn moved(&self) -> u64 {
        self.moved.load(Ordering::Relaxed)
    }
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
    /// This source's messages the selection left in the DLQ.
    pub fn not_selected(&self) -> u64 {
        self.not_selected.load(Ordering::Relaxed)
    }
}

/// The deduplication id of a FIFO resend: stable for one (token, message), unique across tokens, so a
/// second redrive of a message that came back to the DLQ is not dropped as a duplicate of the first.
pub fn deduplication_id(token: &str, message_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(token.as_bytes());
    h.update([0u8]);
    h.update(message_id.as_bytes());
    format!("qc-redrive-{}", hex::encode(h.finalize()))
}

/// Move the messages of `dlq_url` to `dest_url`: receive (up to 10), send as a batch, delete what was
/// sent, at most `rate` per second, until a receive finds nothing new or `max` were moved. Counters go
/// to `progress` as the move goes. The first send failure ends the move after deleting what was sent
/// (the rest stays in the DLQ); a failed delete leaves a message in both queues, and it is deleted,
/// not sent again, if this move receives it again.
pub async fn move_messages(
    client: &aws_sdk_sqs::Client,
    dlq_url: &str,
    dest_url: &str,
    opts: &MoveOptions,
    progress: &MoveProgress,
) -> Result<u64, RedriveError> {
    // Messages of this source the selection left: made visible again however the move ends.
    let mut unselected: HashMap<String, String> = HashMap::new();
    let result = move_loop(client, dlq_url, dest_url, opts, progress, &mut unselected).await;
    let receipts: Vec<String> = unselected.into_values().collect();
    let not_released = release(client, dlq_url, &receipts).await;
    if not_released > 0 {
        tracing::info!(
            queue = dlq_url,
            not_released,
            "redrive: messages not selected could not be made visible at once; they are visible again after the move's receive visibility timeout"
        );
    }
    result
}

async fn move_loop(
    client: &aws_sdk_sqs::Client,
    dlq_url: &str,
    dest_url: &str,
    opts: &MoveOptions,
    progress: &MoveProgress,
    unselected: &mut HashMap<String, String>,
) -> Result<u64, RedriveError> {
    let fifo = is_fifo(dest_url);
    let rate = f64::from(opts.rate.max(1));
    let started = Instant::now();
    // DLQ message ids this move sent (their delete may have failed) or left for another source.
    let mut sent: HashSet<String> = HashSet::new();
    let mut skipped: HashSet<String> = HashSet::new();
    loop {
        let moved = progress.moved();
        let want = match opts.max {
            Some(max) if moved >= max => break,
            Some(max) => (max - moved).min(10),
            None => 10,
        };
        let received = client
            .receive_message()
            .queue_url(dlq_url)
            .max_number_of_messages(i32::try_from(want).unwrap_or(10))
            .wait_time_seconds(RECEIVE_WAIT_SECS)
            .visibility_timeout(RECEIVE_VISIBILITY_SECS)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| call_error("ReceiveMessage", dlq_url, &e, IAM_HINT))?;
        let messages = received.messages.unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        let mut fresh = false;
        let mut to_send: Vec<(String, &Message)> = Vec::new();
        let mut to_delete: Vec<(String, String)> = Vec::new(); // (message id, receipt handle)
        for m in &messages {
            let id = m.message_id().ok_or_else(|| RedriveError::BadMessage {
                queue: dlq_url.to_string(),
                what: "MessageId",
            })?;
            let receipt = m.receipt_handle().ok_or_else(|| RedriveError::BadMessage {
                queue: dlq_url.to_string(),
                what: "ReceiptHandle",
            })?;
            if sent.contains(id) {
                // Sent earlier in this move, its delete failed: delete it now, do not send it twice.
                fresh = true;
                to_delete.push((id.to_string(), receipt.to_string()));
                continue;
            }
            if !is_ours(opts, message_source(m)) {
                // Another source's message in a shared DLQ, or one naming no source in a DLQ not
                // known to be this queue's alone: left alone (it is visible again after the
                // receive's visibility timeout).
                if skipped.insert(id.to_string()) {
                    fresh = true;
                    progress.skipped.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            if !opts.select.is_all() {
                let now_ms = now_ms();
                let selected = peeked(m).is_some_and(|p| opts.select.selects(&p, now_ms));
                if !selected {
                    // Kept hidden (so later receives reach the rest) until the move ends.
                    if unselected
                        .insert(id.to_string(), receipt.to_string())
                        .is_none()
                    {
                        fresh = true;
                        progress.not_selected.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
            }
            fresh = true;
            to_send.push((id.to_string(), m));
        }
        if !fresh {
            // Only messages already left for another source came back: nothing more to move.
            break;
        }
        let mut send_error = None;
        if !to_send.is_empty() {
            let entries = to_send
                .iter()
                .enumerate()
                .map(|(i, (id, m))| entry(i, id, m, fifo, &opts.token, opts.mark))
                .collect::<Result<Vec<_>, _>>()?;
            let out = client
                .send_message_batch()
                .queue_url(dest_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| call_error("SendMessageBatch", dest_url, &e, IAM_HINT))?;
            for ok in out.successful() {
                if let Some((id, m)) = ok.id().parse::<usize>().ok().and_then(|i| to_send.get(i)) {
                    sent.insert(id.clone());
                    if let Some(r) = m.receipt_handle() {
                        to_delete.push((id.clone(), r.to_string()));
                    }
                }
            }
            if !out.failed().is_empty() {
                let n = out.failed().len() as u64;
                progress.failed.fetch_add(n, Ordering::Relaxed);
                let detail = out
                    .failed()
                    .iter()
                    .map(|f| format!("{}: {}", f.code(), f.message().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join("; ");
                send_error = Some(RedriveError::SendFailed {
                    queue: dest_url.to_string(),
                    failed: n,
                    detail,
                });
            }
        }
        let newly_moved = to_delete
            .iter()
            .filter(|(id, _)| to_send.iter().any(|(s, _)| s == id))
            .count() as u64;
        delete(client, dlq_url, &to_delete).await;
        progress.moved.fetch_add(newly_moved, Ordering::Relaxed);
        if let Some(e) = send_error {
            return Err(e);
        }
        // Rate limit: the n-th message no earlier than n / rate seconds after the start.
        let due = Duration::from_secs_f64(progress.moved() as f64 / rate);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    Ok(progress.moved())
}

/// Milliseconds since the epoch, now (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What triage needs of a received DLQ message: its id, reason key, named source, SentTimestamp and
/// receive count. None without a MessageId.
pub fn peeked(m: &Message) -> Option<Peeked> {
    let system = m.attributes();
    let number = |k: MessageSystemAttributeName| {
        system
            .and_then(|a| a.get(&k))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let attrs = m.message_attributes();
    let reason = match attrs.and_then(|a| a.get(REASON_ATTRIBUTE)) {
        None => reason_key(None),
        Some(v) => match v.string_value() {
            Some(s) => reason_key(Some(s)),
            None => NOT_A_STRING.to_string(),
        },
    };
    Some(Peeked {
        id: m.message_id()?.to_string(),
        reason,
        source: message_source(m).map(str::to_string),
        sent_at_ms: number(MessageSystemAttributeName::SentTimestamp),
        receive_count: number(MessageSystemAttributeName::ApproximateReceiveCount)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        reason_attribute: attrs.is_some_and(|a| a.contains_key(REASON_ATTRIBUTE)),
        auto_redriven: attrs.is_some_and(|a| a.contains_key(AUTO_REDRIVE_ATTRIBUTE)),
        attributes: attrs.map_or(0, HashMap::len),
    })
}

/// Make the messages of `receipts` visible again at once (ChangeMessageVisibilityBatch, visibility
/// 0), ten per call. Returns how many could not be released: they become visible again by
/// themselves when the visibility of their receive ends. Never deletes.
pub async fn release(client: &aws_sdk_sqs::Client, url: &str, receipts: &[String]) -> u64 {
    let mut failed = 0u64;
    for chunk in receipts.chunks(10) {
        let entries = chunk
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(r)
                    .visibility_timeout(0)
                    .build()
                    .ok()
            })
            .collect::<Vec<_>>();
        let n = chunk.len() as u64;
        match client
            .change_message_visibility_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(out) => failed += out.failed().len() as u64,
            Err(e) => {
                tracing::info!(queue = url, error = %DisplayErrorContext(&e), "could not release peeked messages; they are visible again when their receive's visibility ends");
                failed += n;
            }
        }
    }
    failed
}

/// The resend of one DLQ message: body, message attributes, FIFO group (and a deduplication id),
/// and the X-Ray trace header.
fn entry(
    i: usize,
    id: &str,
    m: &Message,
    fifo: bool,
    token: &str,
    mark: bool,
) -> Result<SendMessageBatchRequestEntry, RedriveError> {
    let system = m.attributes();
    let mut attributes = m.message_attributes().cloned();
    if mark && attributes.as_ref().map_or(0, HashMap::len) < MAX_ATTRIBUTES {
        let v = aws_sdk_sqs::types::MessageAttributeValue::builder()
            .data_type("String")
            .string_value(token)
            .build()
            .map_err(|_| RedriveError::BadMessage {
                queue: String::new(),
                what: "auto-redrive mark",
            })?;
        attributes
            .get_or_insert_with(HashMap::new)
            .insert(AUTO_REDRIVE_ATTRIBUTE.to_string(), v);
    }
    let mut b = SendMessageBatchRequestEntry::builder()
        .id(i.to_string())
        .message_body(m.body().unwrap_or_default())
        .set_message_attributes(attributes);
    if fifo {
        let group = system
            .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
            .cloned()
            .unwrap_or_default();
        b = b
            .message_group_id(group)
            .message_deduplication_id(deduplication_id(token, id));
    }
    if let Some(trace) = system.and_then(|a| a.get(&MessageSystemAttributeName::AwsTraceHeader)) {
        let value = MessageSystemAttributeValue::builder()
            .data_type("String")
            .string_value(trace)
            .build()
            .map_err(|_| RedriveError::BadMessage {
                queue: String::new(),
                what: "AWSTraceHeader",
            })?;
        b = b.message_system_attributes(MessageSystemAttributeNameForSends::AwsTraceHeader, value);
    }
    b.build().map_err(|_| RedriveError::BadMessage {
        queue: String::new(),
        what: "body",
    })
}

/// Delete what was moved. A failed delete is only logged: the message is still in the DLQ and, if this
/// move receives it again, deleted without a second send.
async fn delete(client: &aws_sdk_sqs::Client, dlq_url: &str, done: &[(String, String)]) {
    if done.is_empty() {
        return;
    }
    let entries = done
        .iter()
        .enumerate()
        .filter_map(|(i, (_, r))| {
            DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(r)
                .build()
                .ok()
        })
        .collect::<Vec<_>>();
    match client
        .delete_message_batch()
        .queue_url(dlq_url)
        .set_entries(Some(entries))
        .send()
        .await
    {
        Ok(out) if out.failed().is_empty() => {}
        Ok(out) => {
            tracing::warn!(
                queue = dlq_url,
                failed = out.failed().len(),
                "redrive: moved messages not deleted from the dead-letter queue; they may be delivered twice"
            );
        }
        Err(e) => {
            tracing::warn!(queue = dlq_url, error = %DisplayErrorContext(&e), "redrive: moved messages not deleted from the dead-letter queue; they may be delivered twice");
        }
    }
}

/// The dead-letter queue of the source at `url`: its URL and ARN, the source's ARN, and how many
/// messages it holds (visible plus in flight, approximate).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub source_url: String,
    pub source_arn: String,
    pub dlq_url: String,
    pub dlq_arn: String,
    pub dlq_messages: u64,
    /// The DLQ's own redrive policy's maxReceiveCount, if it has one: every receive of a peek or a
    /// move counts towards it, and at that count SQS moves the message on to the DLQ's DLQ.
    pub dlq_max_receive_count: Option<u32>,
}

/// Find the DLQ of `source_url` from its redrive policy.
pub async fn route(client: &aws_sdk_sqs::Client, source_url: &str) -> Result<Route, RedriveError> {
    let attrs = attributes(client, source_url).await?;
    let source_arn = attrs.get("QueueArn").cloned().unwrap_or_default();
    let policy = attrs
        .get("RedrivePolicy")
        .and_then(|p| crate::aws::facts::parse_redrive_policy(p).ok())
        .ok_or_else(|| RedriveError::NoDeadLetterQueue {
            url: source_url.to_string(),
        })?;
    let arn = policy.dead_letter_target_arn;
    let unusable = |detail: String| RedriveError::DeadLetterQueueUnusable {
        url: source_url.to_string(),
        arn: arn.clone(),
        detail,
    };
    let parsed =
        crate::aws::QueueArn::parse(&arn).ok_or_else(|| unusable("not a queue ARN".into()))?;
    let dlq_url = client
        .get_queue_url()
        .queue_name(&parsed.name)
        .queue_owner_aws_account_id(&parsed.account)
        .send()
        .await
        .map_err(|e| unusable(DisplayErrorContext(&e).to_string()))?
        .queue_url
        .ok_or_else(|| unusable("GetQueueUrl answered no URL".into()))?;
    let dlq = attributes(client, &dlq_url).await?;
    let count = |k: &str| dlq.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok(Route {
        source_url: source_url.to_string(),
        source_arn,
        dlq_url,
        dlq_arn: arn.clone(),
        dlq_messages: count("ApproximateNumberOfMessages")
            + count("ApproximateNumberOfMessagesNotVisible"),
        dlq_max_receive_count: dlq
            .get("RedrivePolicy")
            .and_then(|p| crate::aws::facts::parse_redrive_policy(p).ok())
            .map(|p| p.max_receive_count),
    })
}

async fn attributes(
    client: &aws_sdk_sqs::Client,
    url: &str,
) -> Result<HashMap<String, String>, RedriveError> {
    let out = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
        .send()
        .await
        .map_err(|e| call_error("GetQueueAttributes", url, &e, IAM_HINT))?;
    Ok(super::sqs::attribute_map(out.attributes))
}

/// The bound of one move when nobody gave one: twice what the DLQ held at the start, plus 100. It ends
/// a move that a steady stream of new failures (or messages that fail again and come back) would
/// otherwise keep going; a receive that finds the DLQ empty ends it first in the normal case.
pub fn default_max(dlq_messages: u64) -> u64 {
    dlq_messages.saturating_mul(2).saturating_add(100)
}

/// What a direct move did (`qc-operator redrive --queue-url`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectMove {
    pub route: Route,
    pub moved: u64,
    pub skipped: u64,
    /// This source's messages the selection left in the DLQ.
    pub not_selected: u64,
}

/// Move the DLQ's messages of the source at `source_url` back to it, now, with the same loop the
/// controller runs ([`move_messages`]). `max` None: bounded by [`default_max`].
pub async fn redrive_queue(
    client: &aws_sdk_sqs::Client,
    source_url: &str,
    max: Option<u64>,
    rate: u32,
    token: &str,
) -> Result<DirectMove, RedriveError> {
    redrive_selected(client, source_url, max, rate, token, &Selector::default()).await
}

/// [`redrive_queue`], moving only the messages `select` takes; the others stay in the DLQ (made
/// visible again when the move ends) and are counted in [`DirectMove::not_selected`].
pub async fn redrive_selected(
    client: &aws_sdk_sqs::Client,
    source_url: &str,
    max: Option<u64>,
    rate: u32,
    token: &str,
    select: &Selector,
) -> Result<DirectMove, RedriveError> {
    let route = route(client, source_url).await?;
    // Unknown sources (the call failed): treated as shared, so unmarked messages stay.
    let move_unmarked = match dead_letter_sources(client, &route.dlq_url).await {
        Ok(sources) => sole_source(&sources, source_url),
        Err(e) => {
            tracing::info!(error = %e, "redrive: dead-letter sources unknown; messages naming no source stay in the DLQ");
            false
        }
    };
    let opts = MoveOptions {
        max: Some(max.unwrap_or_else(|| default_max(route.dlq_messages))),
        rate,
        token: token.to_string(),
        source_arn: Some(route.source_arn.clone()).filter(|a| !a.is_empty()),
        move_unmarked,
        select: select.clone(),
        mark: false,
    };
    let progress = MoveProgress::default();
    let moved = move_messages(client, &route.dlq_url, source_url, &opts, &progress).await?;
    Ok(DirectMove {
        route,
        moved,
        skipped: progress.skipped(),
        not_selected: progress.not_selected(),
    })
}

/// What StartMessageMoveTask answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskStart {
    Started {
        handle: String,
    },
    /// The endpoint has no move tasks (an emulator): move with [`move_messages`] instead.
    Unsupported {
        detail: String,
    },
}

/// Start SQS's move task from `dlq_arn` to `dest_arn` at `rate` messages per second.
pub async fn start_task(
    client: &aws_sdk_sqs::Client,
    dlq_arn: &str,
    dest_arn: &str,
    rate: u32,
) -> Result<TaskStart, RedriveError> {
    let res = client
        .start_message_move_task()
        .source_arn(dlq_arn)
        .destination_arn(dest_arn)
        .max_number_of_messages_per_second(i32::try_from(rate.clamp(1, MAX_TASK_RATE)).unwrap_or(1))
        .send()
        .await;
    match res {
        Ok(out) => match out.task_handle {
            Some(handle) => Ok(TaskStart::Started { handle }),
            None => Err(RedriveError::Call {
                action: "StartMessageMoveTask",
                queue: dlq_arn.to_string(),
                code: "NoTaskHandle".into(),
                message: "the answer had no TaskHandle".into(),
                hint: "",
            }),
        },
        Err(e) if unsupported(&e) => Ok(TaskStart::Unsupported {
            detail: DisplayErrorContext(&e).to_string(),
        }),
        Err(e) => Err(call_error(
            "StartMessageMoveTask",
            dlq_arn,
            &e,
            TASK_IAM_HINT,
        )),
    }
}

/// The endpoint does not know the operation: 404/501, an unknown-operation code, an emulator's "not
/// implemented", or an answer that is no SQS error at all (moto answers an HTML 500 page). An SQS error
/// with a code (access denied, a task already running, throttling) is a real failure.
fn unsupported(
    err: &SdkError<
        aws_sdk_sqs::operation::start_message_move_task::StartMessageMoveTaskError,
        aws_sdk_sqs::config::http::HttpResponse,
    >,
) -> bool {
    const CODES: [&str; 6] = [
        "UnsupportedOperation",
        "AWS.SimpleQueueService.UnsupportedOperation",
        "InvalidAction",
        "UnknownOperationException",
        "UnknownOperation",
        "NotImplemented",
    ];
    if let SdkError::ServiceError(s) = err {
        match s.err().code() {
            Some(c) if CODES.contains(&c) => return true,
            Some(_) => return false,
            None => {}
        }
        let status = s.raw().status().as_u16();
        if status == 404 || status == 501 {
            return true;
        }
        let body = s.raw().body().bytes().unwrap_or_default();
        let body = String::from_utf8_lossy(body).to_ascii_lowercase();
        // No error code: not an SQS error document (SQS always names its error).
        return body.contains("not implemented")
            || body.contains("not been implemented")
            || !body.trim_start().starts_with('{');
    }
    false
}

/// A move task as ListMessageMoveTasks reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskProgress {
    /// RUNNING, COMPLETED, CANCELLING, CANCELLED or FAILED.
    pub status: String,
    pub moved: u64,
    pub to_move: Option<u64>,
    pub failure_reason: Option<String>,
}

/// The task `handle` on `dlq_arn`, if SQS still lists it (it lists the most recent tasks).
pub async fn task_progress(
    client: &aws_sdk_sqs::Client,
    dlq_arn: &str,
    handle: &str,
) -> Result<Option<TaskProgress>, RedriveError> {
    let out = client
        .list_message_move_tasks()
        .source_arn(dlq_arn)
        .max_results(10)
        .send()
        .await
        .map_err(|e| call_error("ListMessageMoveTasks", dlq_arn, &e, TASK_IAM_HINT))?;
    Ok(out
        .results()
        .iter()
        .find(|t| t.task_handle() == Some(handle))
        .map(|t| TaskProgress {
            status: t.status().unwrap_or("UNKNOWN").to_string(),
            moved: u64::try_from(t.approximate_number_of_messages_moved()).unwrap_or(0),
            to_move: t
                .approximate_number_of_messages_to_move()
                .and_then(|n| u64::try_from(n).ok()),
            failure_reason: t.failure_reason().map(str::to_string),
        }))
}

/// Whether `sources` (ListDeadLetterSourceQueues' answer) is `source_url` alone. URLs are compared by
/// path (account and name): an endpoint may answer another host for the same queue.
pub fn sole_source(sources: &[String], source_url: &str) -> bool {
    !sources.is_empty()
        && sources
            .iter()
            .all(|s| queue_path(s) == queue_path(source_url))
}

/// A queue URL's path (account and name), without the host: an endpoint may answer another host
/// for the same queue.
pub fn queue_path(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split_once('/')
        .map_or("", |(_, p)| p)
        .trim_end_matches('/')
        .to_string()
}

/// The source queues whose redrive policy names the DLQ at `dlq_url` (their URLs).
pub async fn dead_letter_sources(
    client: &aws_sdk_sqs::Client,
    dlq_url: &str,
) -> Result<Vec<String>, RedriveError> {
    let out = client
        .list_dead_letter_source_queues()
        .queue_url(dlq_url)
        .send()
        .await
        .map_err(|e| call_error("ListDeadLetterSourceQueues", dlq_url, &e, TASK_IAM_HINT))?;
    Ok(out.queue_urls().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deduplication_ids_are_stable_per_token_and_message() {
        let a = deduplication_id("t1", "m1");
        assert_eq!(a, deduplication_id("t1", "m1"));
        assert_ne!(a, deduplication_id("t2", "m1"));
        assert_ne!(a, deduplication_id("t1", "m2"));
        // No ambiguity from concatenation.
        assert_ne!(deduplication_id("ab", "c"), deduplication_id("a", "bc"));
        // SQS: at most 128 characters of alphanumerics and punctuation.
        assert!(a.len() <= 128);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }

    fn opts(source_arn: Option<&str>, move_unmarked: bool) -> MoveOptions {
        MoveOptions {
            max: None,
            rate: 1,
            token: "t".into(),
            source_arn: source_arn.map(str::to_string),
            move_unmarked,
            select: Selector::default(),
            mark: false,
        }
    }

    #[test]
    fn only_messages_naming_this_source_move_and_unmarked_ones_only_from_a_sole_source_dlq() {
        let ours = "arn:aws:sqs:us-east-1:1:orders";
        let theirs = "arn:aws:sqs:us-east-1:2:orders";
        for sole in [false, true] {
            assert!(is_ours(&opts(Some(ours), sole), Some(ours)));
            assert!(!is_ours(&opts(Some(ours), sole), Some(theirs)));
            assert_eq!(is_ours(&opts(Some(ours), sole), None), sole);
        }
        assert!(is_ours(&opts(None, false), Some(theirs)));
    }

    #[test]
    fn sole_source_compares_paths_and_needs_an_answer() {
        let src = "http://127.0.0.1:5000/1/orders";
        assert!(sole_source(
            &["https://sqs.us-east-1.amazonaws.com/1/orders".into()],
            src
        ));
        assert!(!sole_source(&[], src));
        assert!(!sole_source(
            &[src.into(), "http://127.0.0.1:5000/2/orders".into()],
            src
        ));
    }

    #[test]
    fn fifo_by_name() {
        assert!(is_fifo("https://sqs.us-east-1.amazonaws.com/1/orders.fifo"));
        assert!(!is_fifo("https://sqs.us-east-1.amazonaws.com/1/orders"));
    }

    #[test]
    fn default_max_bounds_a_fed_dlq() {
        assert_eq!(default_max(0), 100);
        assert_eq!(default_max(25), 150);
        assert_eq!(default_max(u64::MAX), u64::MAX);
    }
}
