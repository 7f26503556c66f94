//! The worker's SQS calls: receive, batched delete and visibility changes, queue attributes.
//! Every call is counted by action, bounded by a timeout, and its errors classified for backoff and readiness.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageSystemAttributeName, QueueAttributeName,
};
use bytes::Bytes;

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

    pub fn index(&self) -> usize {
        *self as usize
    }
}

/// What kind of failure an SQS call had; decides between backing off and reporting not ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    QueueDoesNotExist,
    InvalidCredentials,
    AccessDenied,
    Throttled,
    ServerError,
    EndpointUnreachable,
    Timeout,
    InvalidReceiptHandle,
    InvalidParameter,
    Other,
}

impl ErrorKind {
    /// CamelCase reason, as in logs and the `reason` metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ErrorKind::QueueDoesNotExist => "QueueDoesNotExist",
            ErrorKind::InvalidCredentials => "InvalidCredentials",
            ErrorKind::AccessDenied => "AccessDenied",
            ErrorKind::Throttled => "Throttled",
            ErrorKind::ServerError => "ServerError",
            ErrorKind::EndpointUnreachable => "EndpointUnreachable",
            ErrorKind::Timeout => "Timeout",
            ErrorKind::InvalidReceiptHandle => "InvalidReceiptHandle",
            ErrorKind::InvalidParameter => "InvalidParameter",
            ErrorKind::Other => "AwsError",
        }
    }

    /// Misconfiguration that retrying will not fix: the worker reports not ready until it clears.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            ErrorKind::QueueDoesNotExist | ErrorKind::InvalidCredentials | ErrorKind::AccessDenied
        )
    }

    /// What an operator should do about it, for the log line.
    pub fn hint(&self) -> &'static str {
        match self {
            ErrorKind::QueueDoesNotExist => {
                "check --queue-url (and --region/--endpoint-url): the queue does not exist"
            }
            ErrorKind::InvalidCredentials => {
                "check the pod's AWS credentials (IRSA role, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
            }
            ErrorKind::AccessDenied => {
                "grant sqs:ReceiveMessage, DeleteMessage, ChangeMessageVisibility and GetQueueAttributes on the queue"
            }
            ErrorKind::Throttled => "SQS is throttling: backing off",
            ErrorKind::ServerError => "SQS returned a server error: backing off",
            ErrorKind::EndpointUnreachable => "cannot reach the SQS endpoint: backing off",
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

fn classify_code(code: &str) -> Option<ErrorKind> {
    Some(match code {
        "AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist" => {
            ErrorKind::QueueDoesNotExist
        }
        "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "UnrecognizedClientException"
        | "ExpiredToken"
        | "InvalidSecurity"
        | "MissingAuthenticationToken"
        | "IncompleteSignature" => ErrorKind::InvalidCredentials,
        "AccessDenied" | "AccessDeniedException" | "KMS.AccessDeniedException" => {
            ErrorKind::AccessDenied
        }
        "Throttling"
        | "ThrottlingException"
        | "RequestThrottled"
        | "OverLimit"
        | "KMS.ThrottlingException" => ErrorKind::Throttled,
        "ReceiptHandleIsInvalid" | "InvalidReceiptHandle" | "MessageNotInflight" => {
            ErrorKind::InvalidReceiptHandle
        }
        "InvalidParameterValue" | "InvalidParameterValueException" => ErrorKind::InvalidParameter,
        "InternalError" | "InternalFailure" | "ServiceUnavailable" => ErrorKind::ServerError,
        _ => return None,
    })
}

fn classify<E>(
    action: Action,
    err: SdkError<E, aws_sdk_sqs::config::http::HttpResponse>,
) -> SqsError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let kind = match &err {
        SdkError::TimeoutError(_) => ErrorKind::Timeout,
        SdkError::DispatchFailure(d) if d.is_timeout() => ErrorKind::Timeout,
        SdkError::DispatchFailure(_) => ErrorKind::EndpointUnreachable,
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            match err.code().and_then(classify_code) {
                Some(kind) => kind,
                None if status == 403 => ErrorKind::AccessDenied,
                None if status == 429 => ErrorKind::Throttled,
                None if status >= 500 => ErrorKind::ServerError,
                None => ErrorKind::Other,
            }
        }
        SdkError::ResponseError(r) => {
            if r.raw().status().as_u16() >= 500 {
                ErrorKind::ServerError
            } else {
                ErrorKind::Other
            }
        }
        _ => ErrorKind::Other,
    };
    SqsError {
        action,
        kind,
        detail: DisplayErrorContext(&err).to_string(),
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
    /// When the receive call returned: the lease started no later than this.
    pub received_at: Instant,
}

/// A message attribute: string and number types carry `string`, binary ones `binary`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttributeValue {
    pub data_type: String,
    pub string: Option<String>,
    pub binary: Option<Vec<u8>>,
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
        let sys = m.attributes.unwrap_or_default();
        let get = |k: MessageSystemAttributeName| sys.get(&k).cloned();
        let mut attributes: Vec<(String, AttributeValue)> = m
            .message_attributes
            .unwrap_or_default()
            .into_iter()
            .map(|(name, v)| {
                let value = AttributeValue {
                    data_type: v.data_type,
                    string: v.string_value,
                    binary: v.binary_value.map(|b| b.into_inner()),
                };
                (name, value)
            })
            .collect();
        attributes.sort_by(|a, b| a.0.cmp(&b.0));
        Some(Message {
            id,
            receipt_handle,
            body: Bytes::from(m.body.unwrap_or_default().into_bytes()),
            receive_count: get(MessageSystemAttributeName::ApproximateReceiveCount)
                .and_then(|c| c.parse().ok())
                .unwrap_or(1),
            group_id: get(MessageSystemAttributeName::MessageGroupId),
            deduplication_id: get(MessageSystemAttributeName::MessageDeduplicationId),
            sequence_number: get(MessageSystemAttributeName::SequenceNumber),
            sent_timestamp: get(MessageSystemAttributeName::SentTimestamp)
                .and_then(|t| t.parse().ok()),
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

/// The SDK client bound to one queue, counting each request.
#[derive(Clone)]
pub struct Sqs {
    client: aws_sdk_sqs::Client,
    url: Arc<str>,
    metrics: Arc<Metrics>,
}

/// Bound on calls other than the long poll: SDK retries are off, so a hung connection must not block.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl Sqs {
    pub fn new(client: aws_sdk_sqs::Client, url: &str, metrics: Arc<Metrics>) -> Self {
        Sqs {
            client,
            url: url.into(),
            metrics,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Counts, bounds and logs one call. SDK futures are ~12 KiB: callers box them where they are
    /// made, so every future that makes a call (and each per-message task) stays small to move.
    async fn call<T>(
        &self,
        action: Action,
        timeout: Duration,
        fut: futures::future::BoxFuture<'_, Result<T, SqsError>>,
    ) -> Result<T, SqsError> {
        self.metrics.sqs_requests[action.index()].inc();
        let result = match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(SqsError {
                action,
                kind: ErrorKind::Timeout,
                detail: format!("no answer within {}s", timeout.as_secs()),
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
                        .map_err(|e| classify(action, e))
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

    pub async fn receive(&self, max: u32, wait: Duration) -> Result<Vec<Message>, SqsError> {
        let action = Action::ReceiveMessage;
        let wait_secs = i32::try_from(wait.as_secs().min(20)).unwrap_or(20);
        let out = self
            .call(
                action,
                wait + CALL_TIMEOUT,
                Box::pin(async move {
                    self.client
                        .receive_message()
                        .queue_url(&*self.url)
                        .max_number_of_messages(i32::try_from(max.clamp(1, 10)).unwrap_or(10))
                        .wait_time_seconds(wait_secs)
                        // Only what the worker uses: less to send and to parse than All.
                        .message_system_attribute_names(
                            MessageSystemAttributeName::ApproximateReceiveCount,
                        )
                        .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
                        .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
                        .message_system_attribute_names(
                            MessageSystemAttributeName::MessageDeduplicationId,
                        )
                        .message_system_attribute_names(MessageSystemAttributeName::SequenceNumber)
                        .message_attribute_names("All")
                        .send()
                        .await
                        .map_err(|e| classify(action, e))
                }),
            )
            .await?;
        let now = Instant::now();
        let mut messages = Vec::new();
        for m in out.messages.unwrap_or_default() {
            match Message::from_sdk(m, now) {
                Some(msg) => messages.push(msg),
                None => tracing::warn!("received a message without id or receipt handle; ignored"),
            }
        }
        Ok(messages)
    }

    /// DeleteMessageBatch (≤ 10 entries); Ok carries the entries that failed.
    pub async fn delete_batch(&self, entries: &[Entry]) -> Result<Vec<EntryFailure>, SqsError> {
        let action = Action::DeleteMessageBatch;
        let mut req = self.client.delete_message_batch().queue_url(&*self.url);
        for (i, e) in entries.iter().enumerate() {
            let entry = DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(&e.receipt_handle)
                .build()
                .map_err(|err| SqsError {
                    action,
                    kind: ErrorKind::Other,
                    detail: err.to_string(),
                })?;
            req = req.entries(entry);
        }
        let out = self
            .call(
                action,
                CALL_TIMEOUT,
                Box::pin(async move { req.send().await.map_err(|e| classify(action, e)) }),
            )
            .await?;
        Ok(batch_failures(out.failed(), entries.len()))
    }

    /// ChangeMessageVisibilityBatch (≤ 10 entries) to `secs`; Ok carries the entries that failed.
    pub async fn change_visibility_batch(
        &self,
        entries: &[Entry],
        secs: i32,
    ) -> Result<Vec<EntryFailure>, SqsError> {
        let action = Action::ChangeMessageVisibilityBatch;
        let mut req = self
            .client
            .change_message_visibility_batch()
            .queue_url(&*self.url);
        for (i, e) in entries.iter().enumerate() {
            let entry = ChangeMessageVisibilityBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(&e.receipt_handle)
                .visibility_timeout(secs)
                .build()
                .map_err(|err| SqsError {
                    action,
                    kind: ErrorKind::Other,
                    detail: err.to_string(),
                })?;
            req = req.entries(entry);
        }
        let out = self
            .call(
                action,
                CALL_TIMEOUT,
                Box::pin(async move { req.send().await.map_err(|e| classify(action, e)) }),
            )
            .await?;
        Ok(batch_failures(out.failed(), entries.len()))
    }

    pub async fn change_visibility(&self, receipt_handle: &str, secs: i32) -> Result<(), SqsError> {
        let action = Action::ChangeMessageVisibility;
        self.call(
            action,
            CALL_TIMEOUT,
            Box::pin(async move {
                self.client
                    .change_message_visibility()
                    .queue_url(&*self.url)
                    .receipt_handle(receipt_handle)
                    .visibility_timeout(secs)
                    .send()
                    .await
                    .map(|_| ())
                    .map_err(|e| classify(action, e))
            }),
        )
        .await
    }
}

fn batch_failures(
    failed: &[aws_sdk_sqs::types::BatchResultErrorEntry],
    len: usize,
) -> Vec<EntryFailure> {
    failed
        .iter()
        .filter_map(|f| {
            let index: usize = f.id().parse().ok()?;
            (index < len).then(|| EntryFailure {
                index,
                code: f.code().to_string(),
                sender_fault: f.sender_fault(),
                message: f.message().unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// Reads what the worker needs from GetQueueAttributes(All).
pub fn parse_queue_info(attrs: &HashMap<String, String>) -> Result<QueueInfo, String> {
    let vt = attrs
        .get("VisibilityTimeout")
        .ok_or("GetQueueAttributes returned no VisibilityTimeout")?;
    let vt: u64 = vt
        .parse()
        .map_err(|_| format!("VisibilityTimeout {vt:?} is not a whole number of seconds"))?;
    let max_receive_count = attrs.get("RedrivePolicy").and_then(|p| {
        let v: serde_json::Value = serde_json::from_str(p).ok()?;
        match v.get("maxReceiveCount")? {
            serde_json::Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            serde_json::Value::String(s) => s.parse().ok(),
            _ => None,
        }
    });
    Ok(QueueInfo {
        visibility_timeout: Duration::from_secs(vt),
        arn: attrs.get("QueueArn").cloned().unwrap_or_default(),
        fifo: attrs.get("FifoQueue").is_some_and(|v| v == "true"),
        max_receive_count,
    })
}

/// The region in an SQS URL (`https://sqs.eu-west-1.amazonaws.com/...` or the legacy
/// `https://eu-west-1.queue.amazonaws.com/...`); None for other hosts such as local emulators.
pub fn region_from_url(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split(['/', ':']).next()?;
    let labels: Vec<&str> = host.split('.').collect();
    match labels.as_slice() {
        ["sqs", region, "amazonaws", ..] => Some((*region).to_string()),
        [region, "queue", "amazonaws", ..] => Some((*region).to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_comes_from_aws_hosts_only() {
        assert_eq!(
            region_from_url("https://sqs.eu-west-1.amazonaws.com/1/q").as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(
            region_from_url("https://us-east-2.queue.amazonaws.com/1/q").as_deref(),
            Some("us-east-2")
        );
        assert_eq!(
            region_from_url("https://sqs.cn-north-1.amazonaws.com.cn/1/q").as_deref(),
            Some("cn-north-1")
        );
        assert_eq!(region_from_url("http://127.0.0.1:4566/000/q"), None);
    }

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
        assert_eq!(
            classify_code("AWS.SimpleQueueService.NonExistentQueue"),
            Some(ErrorKind::QueueDoesNotExist)
        );
        assert_eq!(
            classify_code("InvalidClientTokenId"),
            Some(ErrorKind::InvalidCredentials)
        );
        assert_eq!(
            classify_code("RequestThrottled"),
            Some(ErrorKind::Throttled)
        );
        assert!(ErrorKind::AccessDenied.is_configuration());
        assert!(!ErrorKind::Throttled.is_configuration());
        assert_eq!(classify_code("SomethingNew"), None);
    }
}
