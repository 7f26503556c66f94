//! The worker's SQS calls through `aws-sdk-sqs`: receive, batched delete and visibility changes, queue
//! attributes. One client per process, built from the shared aws-config loader (credentials chain,
//! standard retries honouring `AWS_RETRY_MODE`/`AWS_MAX_ATTEMPTS`, proxies from the environment).
//! Every HTTP request is counted by action, every call bounded by a timeout, and its errors
//! classified for backoff and readiness.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_sqs::error::{BoxError, DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageSystemAttributeName, QueueAttributeName,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use bytes::Bytes;
use futures::future::BoxFuture;

use super::metrics::Metrics;

/// The SQS actions the worker uses; metrics are labelled with these names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    ReceiveMessage,
    DeleteMessageBatch,
    ChangeMessageVisibility,
    ChangeMessageVisibilityBatch,
    GetQueueAttributes,
}

impl Action {
    pub const ALL: [Action; 5] = [
        Action::ReceiveMessage,
        Action::DeleteMessageBatch,
        Action::ChangeMessageVisibility,
        Action::ChangeMessageVisibilityBatch,
        Action::GetQueueAttributes,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Action::ReceiveMessage => "ReceiveMessage",
            Action::DeleteMessageBatch => "DeleteMessageBatch",
            Action::ChangeMessageVisibility => "ChangeMessageVisibility",
            Action::ChangeMessageVisibilityBatch => "ChangeMessageVisibilityBatch",
            Action::GetQueueAttributes => "GetQueueAttributes",
        }
    }

    /// The action of an SDK operation name; None for operations the worker does not call.
    pub fn from_operation(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == name)
    }

    pub fn index(&self) -> usize {
        *self as usize
    }
}

pub use crate::aws::classify::{ErrorKind, classify_code};

impl SqsError {
    /// What an operator should do about it, for the log line and `/readyz`.
    pub fn hint(&self) -> &'static str {
        match self.kind {
            ErrorKind::QueueDoesNotExist => {
                "check --queue-url (and --region/--endpoint-url): the queue does not exist"
            }
            ErrorKind::InvalidCredentials => {
                "check the pod's AWS credentials (IRSA role, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
            }
            ErrorKind::AccessDenied => {
                "grant sqs:ReceiveMessage, DeleteMessage, ChangeMessageVisibility and GetQueueAttributes on the queue (and kms:Decrypt on its key if it is encrypted with a customer managed key)"
            }
            ErrorKind::KmsKeyUnusable => {
                "the queue's KMS key is disabled, deleted or not usable: enable the key or change the queue's encryption"
            }
            ErrorKind::Throttled => "SQS is throttling: backing off",
            ErrorKind::ServerError => "SQS returned a server error: backing off",
            ErrorKind::EndpointUnreachable => {
                "cannot reach the SQS endpoint (check egress, HTTPS_PROXY/NO_PROXY): backing off"
            }
            ErrorKind::Timeout => "the SQS call timed out: backing off",
            _ => "backing off",
        }
    }
}

/// One failed SQS call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{action} failed ({reason}): {detail}", action = action.as_str(), reason = kind.reason())]
pub struct SqsError {
    pub action: Action,
    pub kind: ErrorKind,
    pub detail: String,
}

/// Classifies an SDK failure (after the SDK's own retries): the service's error code first, then
/// the HTTP status; transport failures by their kind.
fn classify<E>(
    action: Action,
    endpoint: Option<&str>,
    err: SdkError<E, aws_sdk_sqs::config::http::HttpResponse>,
) -> SqsError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let kind = crate::aws::classify::classify(&err);
    let mut detail = DisplayErrorContext(&err).to_string();
    // A transport failure names where it was going: a proxy, a private endpoint or a certificate.
    if let (SdkError::DispatchFailure(_) | SdkError::TimeoutError(_), Some(endpoint)) =
        (&err, endpoint)
    {
        detail = format!("{endpoint}: {detail}");
    }
    SqsError {
        action,
        kind,
        detail,
    }
}

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
    pub attributes: Vec<(String, AttributeValue)>,
    /// The X-Ray trace header SQS keeps for the message (`AWSTraceHeader` system attribute).
    pub trace_header: Option<String>,
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
            attributes: Vec::new(),
            trace_header: None,
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

    fn from_sdk(m: aws_sdk_sqs::types::Message, received_at: Instant) -> Option<Message> {
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
            trace_header: take(MessageSystemAttributeName::AwsTraceHeader),
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

/// The SDK client bound to one queue; cheap to clone (one client, one connection pool per process).
#[derive(Clone)]
pub struct Sqs {
    client: aws_sdk_sqs::Client,
    url: Arc<str>,
    metrics: Arc<Metrics>,
    /// Scheme and authority of the endpoint the SDK resolved, once a request was sent (for errors).
    endpoint: Arc<OnceLock<String>>,
}

/// Bound on a call other than the long poll, the SDK's retries included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest long poll SQS allows.
const MAX_WAIT: Duration = Duration::from_secs(20);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// No response head within this is a dead connection; above the longest long poll.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

impl Sqs {
    /// The worker's SQS client for `url`, from the shared SDK configuration: its endpoint
    /// (`--endpoint-url`, `AWS_ENDPOINT_URL_SQS`, the profile, else the regional one), credentials,
    /// retry mode and HTTP client; connect and read timeouts set here. Every HTTP request (retries
    /// included) is counted by action.
    pub fn new(
        sdk: &aws_types::SdkConfig,
        url: &str,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        if sdk.region().is_none() {
            return Err(
                "no AWS region: pass --region, use an SQS queue URL, or set AWS_REGION".into(),
            );
        }
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build();
        let endpoint = Arc::new(OnceLock::new());
        let conf = aws_sdk_sqs::config::Builder::from(sdk)
            .timeout_config(timeouts)
            .interceptor(CountRequests {
                metrics: metrics.clone(),
                endpoint: endpoint.clone(),
            })
            .build();
        Ok(Sqs {
            client: aws_sdk_sqs::Client::from_conf(conf),
            url: url.into(),
            metrics,
            endpoint,
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The SDK client (its timeouts, retries and request counting), for calls to other queues
    /// (the DLQ of `--on-poison dead-letter`).
    pub fn client(&self) -> aws_sdk_sqs::Client {
        self.client.clone()
    }

    fn classify<E>(
        &self,
        action: Action,
        err: SdkError<E, aws_sdk_sqs::config::http::HttpResponse>,
    ) -> SqsError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        classify(action, self.endpoint.get().map(String::as_str), err)
    }

    /// Bounds and logs one call. SDK futures are large (~10 KiB): callers box them where they are
    /// made, so each per-message task stays small to spawn.
    async fn call<T>(
        &self,
        action: Action,
        timeout: Duration,
        fut: BoxFuture<'_, Result<T, SqsError>>,
    ) -> Result<T, SqsError> {
        let result = match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(SqsError {
                action,
                kind: ErrorKind::Timeout,
                detail: format!(
                    "no answer within {}",
                    crate::api::Duration::from_std(timeout)
                ),
            }),
        };
        if let Err(e) = &result {
            self.metrics.sqs_errors[action.index()].inc();
            tracing::debug!(action = action.as_str(), reason = e.kind.reason(), error = %e.detail, "sqs call failed");
        }
        result
    }

    pub async fn queue_info(&self) -> Result<QueueInfo, SqsError> {
        let action = Action::GetQueueAttributes;
        let out = self
            .call(
                action,
                CALL_TIMEOUT,
                Box::pin(async move {
                    self.client
                        .get_queue_attributes()
                        .queue_url(&*self.url)
                        .attribute_names(QueueAttributeName::All)
                        .send()
                        .await
                        .map_err(|e| self.classify(action, e))
                }),
            )
            .await?;
        let attrs: HashMap<String, String> = out
            .attributes
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.as_str().to_string(), v))
            .collect();
        parse_queue_info(&attrs).map_err(|detail| SqsError {
            action,
            kind: ErrorKind::Other,
            detail,
        })
    }

    /// ReceiveMessage of up to `max` (1-10) messages, long polling up to `wait` (at most 20s).
    pub async fn receive(&self, max: u32, wait: Duration) -> Result<Vec<Message>, SqsError> {
        let action = Action::ReceiveMessage;
        let wait = wait.min(MAX_WAIT);
        let wait_secs = i32::try_from(wait.as_secs()).unwrap_or(20);
        let max = i32::try_from(max.clamp(1, 10)).unwrap_or(10);
        let sent = Instant::now();
        let out = self
            .call(
                action,
                wait + CALL_TIMEOUT,
                Box::pin(async move {
                    let mut req = self
                        .client
                        .receive_message()
                        .queue_url(&*self.url)
                        .max_number_of_messages(max)
                        .wait_time_seconds(wait_secs)
                        .message_attribute_names("All");
                    // Only what the worker uses: less to send and to parse than All.
                    for name in SYSTEM_ATTRIBUTES {
                        req = req.message_system_attribute_names(name);
                    }
                    req.send().await.map_err(|e| self.classify(action, e))
                }),
            )
            .await?;
        let received_at = lease_start(sent, Instant::now());
        let mut messages = Vec::new();
        for m in out.messages.unwrap_or_default() {
            if let Some(msg) = Message::from_sdk(m, received_at) {
                messages.push(msg);
            } else {
                tracing::warn!("received a message without id or receipt handle; ignored");
            }
        }
        Ok(messages)
    }

    /// DeleteMessageBatch (≤ 10 entries); Ok carries the entries that failed.
    pub async fn delete_batch(&self, entries: &[Entry]) -> Result<Vec<EntryFailure>, SqsError> {
        let action = Action::DeleteMessageBatch;
        let built: Result<Vec<_>, _> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(&e.receipt_handle)
                    .build()
            })
            .collect();
        let built = built.map_err(|e| invalid_request(action, &e))?;
        let out = self
            .call(
                action,
                CALL_TIMEOUT,
                Box::pin(async move {
                    self.client
                        .delete_message_batch()
                        .queue_url(&*self.url)
                        .set_entries(Some(built))
                        .send()
                        .await
                        .map_err(|e| self.classify(action, e))
                }),
            )
            .await?;
        let successful: Vec<&str> = out
            .successful()
            .iter()
            .map(aws_sdk_sqs::types::DeleteMessageBatchResultEntry::id)
            .collect();
        Ok(batch_failures(out.failed(), &successful, entries.len()))
    }

    /// ChangeMessageVisibilityBatch (≤ 10 entries) to `secs`; Ok carries the entries that failed.
    pub async fn change_visibility_batch(
        &self,
        entries: &[Entry],
        secs: i32,
    ) -> Result<Vec<EntryFailure>, SqsError> {
        self.change_visibility_batch_within(entries, &vec![secs; entries.len()], CALL_TIMEOUT)
            .await
    }

    /// ChangeMessageVisibilityBatch, entry `i` to `secs[i]` (one value per entry), given up after
    /// `limit` (at most the usual call bound): a batch of heartbeats is given up when the earliest
    /// member's lease has only its margin left.
    pub async fn change_visibility_batch_within(
        &self,
        entries: &[Entry],
        secs: &[i32],
        limit: Duration,
    ) -> Result<Vec<EntryFailure>, SqsError> {
        let action = Action::ChangeMessageVisibilityBatch;
        if secs.len() != entries.len() {
            return Err(SqsError {
                action,
                kind: ErrorKind::Other,
                detail: format!(
                    "{} visibility values for {} entries (a bug)",
                    secs.len(),
                    entries.len()
                ),
            });
        }
        let built: Result<Vec<_>, _> = entries
            .iter()
            .zip(secs)
            .enumerate()
            .map(|(i, (e, &secs))| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(&e.receipt_handle)
                    .visibility_timeout(secs)
                    .build()
            })
            .collect();
        let built = built.map_err(|e| invalid_request(action, &e))?;
        let out = self
            .call(
                action,
                limit.min(CALL_TIMEOUT),
                Box::pin(async move {
                    self.client
                        .change_message_visibility_batch()
                        .queue_url(&*self.url)
                        .set_entries(Some(built))
                        .send()
                        .await
                        .map_err(|e| self.classify(action, e))
                }),
            )
            .await?;
        let successful: Vec<&str> = out
            .successful()
            .iter()
            .map(aws_sdk_sqs::types::ChangeMessageVisibilityBatchResultEntry::id)
            .collect();
        Ok(batch_failures(out.failed(), &successful, entries.len()))
    }

    pub async fn change_visibility(&self, receipt_handle: &str, secs: i32) -> Result<(), SqsError> {
        self.change_visibility_within(receipt_handle, secs, CALL_TIMEOUT)
            .await
    }

    /// ChangeMessageVisibility given up after `limit` (at most the usual call bound): a heartbeat's
    /// deadline is the time its lease has left.
    pub async fn change_visibility_within(
        &self,
        receipt_handle: &str,
        secs: i32,
        limit: Duration,
    ) -> Result<(), SqsError> {
        let action = Action::ChangeMessageVisibility;
        self.call(
            action,
            limit.min(CALL_TIMEOUT),
            Box::pin(async move {
                self.client
                    .change_message_visibility()
                    .queue_url(&*self.url)
                    .receipt_handle(receipt_handle)
                    .visibility_timeout(secs)
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| self.classify(action, e))
            }),
        )
        .await
    }
}

/// Longest a receive's answer is taken to have travelled (and waited for the worker) after SQS
/// started the messages' lease, when the receive long-polled before answering.
pub const RECEIVE_LAG: Duration = Duration::from_millis(500);

/// When the leases of a receive sent at `sent` and answered at `returned` started, as the worker
/// counts them: SQS starts a lease before it answers, so the answer's arrival is too late (a worker
/// slow to read the answer, on a loaded machine, would count a lease that has already partly run
/// out). A receive answered within `RECEIVE_LAG` counts from when it was sent (the earliest the
/// lease can have started); one that long-polled longer counts from `RECEIVE_LAG` before its answer.
pub fn lease_start(sent: Instant, returned: Instant) -> Instant {
    match returned.checked_sub(RECEIVE_LAG) {
        Some(t) if t > sent => t,
        _ => sent,
    }
}

/// Only the system attributes the worker uses.
const SYSTEM_ATTRIBUTES: [MessageSystemAttributeName; 6] = [
    MessageSystemAttributeName::AwsTraceHeader,
    MessageSystemAttributeName::ApproximateReceiveCount,
    MessageSystemAttributeName::SentTimestamp,
    MessageSystemAttributeName::MessageGroupId,
    MessageSystemAttributeName::MessageDeduplicationId,
    MessageSystemAttributeName::SequenceNumber,
];

/// A batch entry the SDK refused to build (a required field missing): a bug, not an SQS answer.
fn invalid_request(action: Action, e: &dyn std::error::Error) -> SqsError {
    SqsError {
        action,
        kind: ErrorKind::InvalidParameter,
        detail: e.to_string(),
    }
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

/// Counts every HTTP request the SDK sends (first attempts and retries) by action: what SQS bills.
/// Notes the endpoint of the first one.
struct CountRequests {
    metrics: Arc<Metrics>,
    endpoint: Arc<OnceLock<String>>,
}

impl std::fmt::Debug for CountRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CountRequests")
    }
}

impl Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "CountRequests"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(action) = cfg
            .load::<Metadata>()
            .and_then(|m| Action::from_operation(m.name()))
        {
            self.metrics.sqs_requests[action.index()].inc();
        }
        if self.endpoint.get().is_none() {
            let _ = self
                .endpoint
                .set(origin(context.request().uri()).to_string());
        }
        Ok(())
    }
}

/// `https://host:port` of a URL (everything before the path).
fn origin(url: &str) -> &str {
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..].find('/') {
        Some(i) => &url[..start + i],
        None => url,
    }
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
    fn a_lease_counts_from_the_receive_not_from_reading_its_answer() {
        let ms = Duration::from_millis;
        let sent = Instant::now();
        // Answered at once, read 400 ms late (a loaded worker): counted from the send.
        assert_eq!(lease_start(sent, sent + ms(400)), sent);
        assert_eq!(lease_start(sent, sent), sent);
        // Long-polled 15 s before a message came: from shortly before the answer, not the send.
        assert_eq!(lease_start(sent, sent + ms(15_000)), sent + ms(14_500));
    }
    use aws_sdk_sqs::error::ConnectorError;
    use aws_sdk_sqs::error::ErrorMetadata;
    use aws_sdk_sqs::operation::receive_message::ReceiveMessageError;
    use aws_smithy_types::body::SdkBody;

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
    fn error_codes_map_to_kinds() {
        for (code, kind) in [
            (
                "AWS.SimpleQueueService.NonExistentQueue",
                ErrorKind::QueueDoesNotExist,
            ),
            ("QueueDoesNotExist", ErrorKind::QueueDoesNotExist),
            ("InvalidClientTokenId", ErrorKind::InvalidCredentials),
            ("SignatureDoesNotMatch", ErrorKind::InvalidCredentials),
            ("KMS.AccessDeniedException", ErrorKind::AccessDenied),
            ("KMS.DisabledException", ErrorKind::KmsKeyUnusable),
            ("KMS.NotFoundException", ErrorKind::KmsKeyUnusable),
            ("KMS.OptInRequired", ErrorKind::KmsKeyUnusable),
            ("KMS.ThrottlingException", ErrorKind::Throttled),
            ("RequestThrottled", ErrorKind::Throttled),
            ("ThrottlingException", ErrorKind::Throttled),
            ("ReceiptHandleIsInvalid", ErrorKind::InvalidReceiptHandle),
            ("MessageNotInflight", ErrorKind::InvalidReceiptHandle),
        ] {
            assert_eq!(classify_code(code), Some(kind), "{code}");
        }
        assert!(ErrorKind::AccessDenied.is_configuration());
        assert!(ErrorKind::KmsKeyUnusable.is_configuration());
        assert!(!ErrorKind::Throttled.is_configuration());
        assert_eq!(classify_code("SomethingNew"), None);
    }

    fn service_error(status: u16, code: Option<&str>) -> SqsError {
        let mut meta = ErrorMetadata::builder().message("from the test");
        if let Some(code) = code {
            meta = meta.code(code);
        }
        let raw = aws_sdk_sqs::config::http::HttpResponse::new(
            status.try_into().unwrap(),
            SdkBody::empty(),
        );
        classify(
            Action::ReceiveMessage,
            Some("https://sqs.test"),
            SdkError::service_error(ReceiveMessageError::generic(meta.build()), raw),
        )
    }

    #[test]
    fn sdk_errors_are_classified_by_code_then_status() {
        let e = service_error(400, Some("KMS.DisabledException"));
        assert_eq!(e.kind, ErrorKind::KmsKeyUnusable);
        assert!(e.detail.contains("KMS.DisabledException"), "{}", e.detail);
        assert!(!e.detail.contains("sqs.test"), "{}", e.detail);
        assert_eq!(
            service_error(400, Some("KMS.ThrottlingException")).kind,
            ErrorKind::Throttled
        );
        assert_eq!(service_error(403, None).kind, ErrorKind::AccessDenied);
        assert_eq!(service_error(429, None).kind, ErrorKind::Throttled);
        assert_eq!(service_error(503, None).kind, ErrorKind::ServerError);
        assert_eq!(service_error(400, Some("Novel")).kind, ErrorKind::Other);

        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let refused: SdkError<ReceiveMessageError, aws_sdk_sqs::config::http::HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io(io.into()));
        let e = classify(Action::ReceiveMessage, Some("https://sqs.test"), refused);
        assert_eq!(e.kind, ErrorKind::EndpointUnreachable);
        assert!(
            e.detail.starts_with("https://sqs.test: ") && e.detail.contains("refused"),
            "{}",
            e.detail
        );
        let slow: SdkError<ReceiveMessageError, aws_sdk_sqs::config::http::HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::timeout("slow".into()));
        assert_eq!(
            classify(Action::ReceiveMessage, None, slow).kind,
            ErrorKind::Timeout
        );
        assert_eq!(origin("https://h:1/q?x=/"), "https://h:1");
        assert_eq!(origin("http://h"), "http://h");
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

    #[test]
    fn operations_map_to_actions() {
        for a in Action::ALL {
            assert_eq!(Action::from_operation(a.as_str()), Some(a));
        }
        assert_eq!(Action::from_operation("SendMessage"), None);
    }
}
