//! The `Sqs` client: one `aws-sdk-sqs` client per process bound to the worker's queue, its calls
//! (receive, batched delete and visibility changes, queue attributes), each bounded by a timeout,
//! every HTTP request counted by action.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_sqs::config::StalledStreamProtectionConfig;
use aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_sqs::error::BuildError;
use aws_sdk_sqs::error::{BoxError, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::operation::change_message_visibility_batch::ChangeMessageVisibilityBatchOutput;
use aws_sdk_sqs::operation::delete_message_batch::DeleteMessageBatchOutput;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, ChangeMessageVisibilityBatchResultEntry,
    DeleteMessageBatchRequestEntry, DeleteMessageBatchResultEntry, MessageSystemAttributeName,
    QueueAttributeName,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use futures::future::BoxFuture;

use super::errors::{Action, ErrorKind, SqsError, classify, invalid_request};
use super::wire::{Entry, EntryFailure, Message, QueueInfo, batch_failures, parse_queue_info};
use crate::worker::metrics::Metrics;

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
        // Stalled-stream protection off: it wraps every response body in a throughput monitor
        // (a clock read per poll) and adds an interceptor to every request, and each call here is
        // already bounded as a whole (`call`'s timeout; READ_TIMEOUT for the response head).
        let conf = aws_sdk_sqs::config::Builder::from(sdk)
            .timeout_config(timeouts)
            .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
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
        let built = build_entries(action, entries, |_, id, e| {
            DeleteMessageBatchRequestEntry::builder()
                .id(id)
                .receipt_handle(&e.receipt_handle)
                .build()
        })?;
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
        Ok(out.failures(entries.len()))
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
        let built = build_entries(action, entries, |i, id, e| {
            ChangeMessageVisibilityBatchRequestEntry::builder()
                .id(id)
                .receipt_handle(&e.receipt_handle)
                .visibility_timeout(secs[i])
                .build()
        })?;
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
        Ok(out.failures(entries.len()))
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

/// The SDK entries of a batch call, entry `i` built by `build(i, id, entry)` with the id `i`: the
/// answer names entries back by these ids (`batch_failures`).
fn build_entries<T>(
    action: Action,
    entries: &[Entry],
    build: impl Fn(usize, String, &Entry) -> Result<T, BuildError>,
) -> Result<Vec<T>, SqsError> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| build(i, i.to_string(), e).map_err(|err| invalid_request(action, &err)))
        .collect()
}

/// The answer of a batched delete or visibility change: which of its `len` entries failed.
trait BatchAnswer {
    fn failures(&self, len: usize) -> Vec<EntryFailure>;
}

impl BatchAnswer for DeleteMessageBatchOutput {
    fn failures(&self, len: usize) -> Vec<EntryFailure> {
        let successful: Vec<&str> = self
            .successful()
            .iter()
            .map(DeleteMessageBatchResultEntry::id)
            .collect();
        batch_failures(self.failed(), &successful, len)
    }
}

impl BatchAnswer for ChangeMessageVisibilityBatchOutput {
    fn failures(&self, len: usize) -> Vec<EntryFailure> {
        let successful: Vec<&str> = self
            .successful()
            .iter()
            .map(ChangeMessageVisibilityBatchResultEntry::id)
            .collect();
        batch_failures(self.failed(), &successful, len)
    }
}

/// Only the system attributes the worker uses (what its receives ask for).
pub const SYSTEM_ATTRIBUTES: [MessageSystemAttributeName; 7] = [
    MessageSystemAttributeName::AwsTraceHeader,
    MessageSystemAttributeName::ApproximateReceiveCount,
    MessageSystemAttributeName::SentTimestamp,
    MessageSystemAttributeName::ApproximateFirstReceiveTimestamp,
    MessageSystemAttributeName::MessageGroupId,
    MessageSystemAttributeName::MessageDeduplicationId,
    MessageSystemAttributeName::SequenceNumber,
];

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

    /// The worker's calls carry the SDK's user agent with the app name the worker sets
    /// (`app/qc-worker`, what CloudTrail and tests/iam_policy.rs tell the worker's calls by), and
    /// are signed.
    #[tokio::test]
    async fn calls_carry_the_user_agent_with_the_worker_app_name() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = sock.read(&mut buf).await.unwrap();
                assert!(n > 0, "request cut short");
                got.extend_from_slice(&buf[..n]);
            }
            let body = b"{}";
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            sock.write_all(head.as_bytes()).await.unwrap();
            sock.write_all(body).await.unwrap();
            String::from_utf8_lossy(&got).to_ascii_lowercase()
        });
        let sdk = crate::aws::with_app_name(
            aws_types::SdkConfig::builder()
                .behavior_version(aws_config::BehaviorVersion::latest())
                .region(aws_types::region::Region::new("us-east-1"))
                .endpoint_url(format!("http://{addr}"))
                .credentials_provider(
                    aws_credential_types::provider::SharedCredentialsProvider::new(
                        aws_credential_types::Credentials::new(
                            "AKIDTEST", "secret", None, None, "test",
                        ),
                    ),
                )
                .http_client(crate::aws::http_client())
                .build(),
            crate::aws::WORKER_APP_NAME,
        );
        let sqs = Sqs::new(
            &sdk,
            &format!("http://{addr}/000000000000/q"),
            Arc::new(Metrics::default()),
        )
        .unwrap();
        let got = sqs.receive(10, Duration::ZERO).await.unwrap();
        assert!(got.is_empty());
        let head = server.await.unwrap();
        assert!(head.contains("\r\nuser-agent: "), "{head}");
        assert!(head.contains("\r\nx-amz-user-agent: "), "{head}");
        assert!(
            head.contains("\r\nauthorization: aws4-hmac-sha256"),
            "{head}"
        );
        assert!(head.contains(" app/qc-worker"), "{head}");
    }

    #[test]
    fn the_endpoint_is_the_url_before_its_path() {
        assert_eq!(origin("https://h:1/q?x=/"), "https://h:1");
        assert_eq!(origin("http://h"), "http://h");
    }
}
