//! The SQS adapter: reads a queue's attributes and its dead-letter queue's behind `QueueReader`, and
//! turns SDK failures into `SqsError`s that carry a condition reason and a fix.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::QueueAttributeName;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;

use crate::aws::classify::{ErrorKind, classify, classify_code};

use crate::aws::facts::{DeadLetterFacts, Facts, FactsError, QueueArn, QueueFacts};
use crate::aws::limit::{LimitConfig, Limiter};

/// Reads what the rules need from SQS. The controller uses `SqsReader`; tests use `StaticReader`.
#[async_trait::async_trait]
pub trait QueueReader: Send + Sync {
    /// GetQueueAttributes(All) for `url`.
    async fn attributes(&self, url: &str) -> Result<HashMap<String, String>, SqsError>;
    /// GetQueueUrl for the queue an ARN names; Ok(None) when that queue does not exist.
    async fn url_for_arn(&self, arn: &QueueArn) -> Result<Option<String>, SqsError>;
}

/// Why an SQS call failed. Values, not SDK errors, so a test double can return them and the
/// controller can keep them in status. `target` is the queue URL or ARN the call was about.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SqsError {
    #[error("queue {target} does not exist: check spec.queue.url and the region")]
    QueueDoesNotExist { target: String },
    #[error(
        "access to queue {target} was denied ({code}: {message}): allow sqs:GetQueueAttributes and \
         sqs:GetQueueUrl on it for the operator's role"
    )]
    AccessDenied {
        target: String,
        code: String,
        message: String,
    },
    #[error(
        "the AWS credentials were rejected or missing reading queue {target} ({detail}): check the \
         operator's IAM role (IRSA or pod identity) or its AWS_* variables"
    )]
    InvalidCredentials { target: String, detail: String },
    #[error(
        "SQS throttled the read of queue {target} ({code}): it is retried on the next reconcile"
    )]
    Throttled { target: String, code: String },
    #[error(
        "could not reach the SQS endpoint reading queue {target} ({detail}): check the region, any \
         endpoint override and the pod's network egress to SQS"
    )]
    EndpointUnreachable { target: String, detail: String },
    #[error(
        "timed out reading queue {target} ({detail}): check the pod's network egress to SQS; the read \
         is retried on the next reconcile"
    )]
    Timeout { target: String, detail: String },
    #[error(
        "queue URL {target} is not valid ({message}): spec.queue.url must look like \
         https://sqs.REGION.amazonaws.com/ACCOUNT/NAME"
    )]
    InvalidQueueUrl { target: String, message: String },
    #[error(
        "could not build the SQS request for queue {target} ({detail}): check the region and the \
         operator's AWS configuration"
    )]
    InvalidConfiguration { target: String, detail: String },
    #[error(
        "SQS answered the read of queue {target} with a response that could not be understood \
         ({detail}): check that the endpoint is SQS"
    )]
    BadResponse { target: String, detail: String },
    #[error(
        "SQS refused the read of queue {target} ({code}: {message}): look the code up in the SQS \
         API reference"
    )]
    AwsError {
        target: String,
        code: String,
        message: String,
    },
}

impl SqsError {
    /// The CamelCase condition reason for this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            SqsError::QueueDoesNotExist { .. } => "QueueDoesNotExist",
            SqsError::AccessDenied { .. } => "AccessDenied",
            SqsError::InvalidCredentials { .. } => "InvalidCredentials",
            SqsError::Throttled { .. } => "Throttled",
            SqsError::EndpointUnreachable { .. } => "EndpointUnreachable",
            SqsError::Timeout { .. } => "Timeout",
            SqsError::InvalidQueueUrl { .. } => "InvalidQueueUrl",
            SqsError::InvalidConfiguration { .. } => "InvalidConfiguration",
            SqsError::BadResponse { .. } => "BadResponse",
            SqsError::AwsError { .. } => "AwsError",
        }
    }

    /// Classify a service error by its code (`aws::classify`).
    pub fn from_code(target: &str, code: &str, message: &str) -> SqsError {
        let kind = classify_code(code).unwrap_or(ErrorKind::Other);
        SqsError::of_kind(target, kind, code, message, format!("{code}: {message}"))
    }

    /// Classify any SDK failure (`aws::classify`). `missing` is the operation's typed "queue does not
    /// exist" check, so a code the SDK already mapped is not missed if its text differs.
    pub(crate) fn from_sdk<E>(
        target: &str,
        err: &SdkError<E, HttpResponse>,
        missing: bool,
    ) -> SqsError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        if missing {
            return SqsError::QueueDoesNotExist {
                target: target.to_string(),
            };
        }
        if let SdkError::ServiceError(service) = err {
            let e = service.err();
            if let Some(code) = e.code() {
                return SqsError::from_code(target, code, e.message().unwrap_or(""));
            }
        }
        let detail = DisplayErrorContext(err).to_string();
        SqsError::of_kind(target, classify(err), "Unknown", &detail, detail.clone())
    }

    /// The variant for a kind: `code` and `message` for those that name the service's answer,
    /// `detail` for the others.
    fn of_kind(
        target: &str,
        kind: ErrorKind,
        code: &str,
        message: &str,
        detail: String,
    ) -> SqsError {
        let target = target.to_string();
        match kind {
            ErrorKind::QueueDoesNotExist => SqsError::QueueDoesNotExist { target },
            ErrorKind::AccessDenied => SqsError::AccessDenied {
                target,
                code: code.to_string(),
                message: message.to_string(),
            },
            ErrorKind::InvalidCredentials => SqsError::InvalidCredentials { target, detail },
            ErrorKind::Throttled => SqsError::Throttled {
                target,
                code: code.to_string(),
            },
            ErrorKind::InvalidQueueUrl => SqsError::InvalidQueueUrl {
                target,
                message: message.to_string(),
            },
            ErrorKind::EndpointUnreachable => SqsError::EndpointUnreachable { target, detail },
            ErrorKind::Timeout => SqsError::Timeout { target, detail },
            ErrorKind::InvalidConfiguration => SqsError::InvalidConfiguration { target, detail },
            ErrorKind::BadResponse => SqsError::BadResponse { target, detail },
            ErrorKind::ResourceNotFound
            | ErrorKind::KmsKeyUnusable
            | ErrorKind::ServerError
            | ErrorKind::InvalidReceiptHandle
            | ErrorKind::InvalidParameter
            | ErrorKind::Other => SqsError::AwsError {
                target,
                code: code.to_string(),
                message: message.to_string(),
            },
        }
    }
}

/// The controller's SQS calls per second and in flight by default: GetQueueAttributes and GetQueueUrl
/// have no published per-account quota; at 1,000 queues with dead-letter queues and a 15 s poll the
/// controller makes about 135 calls a second.
pub const DEFAULT_LIMIT: LimitConfig = LimitConfig::new(300.0, 16);

/// How long a dead-letter queue's URL (from GetQueueUrl) is reused. A URL is derived from the account
/// and the name, so it only goes stale when the queue is deleted, which GetQueueAttributes reports.
const URL_TTL: std::time::Duration = std::time::Duration::from_hours(1);

/// `QueueReader` over the AWS SDK. Builds no client itself: the caller decides region, endpoint,
/// retries and timeouts (see `crate::aws::sdk_config`). Calls go through a `Limiter`; queue URLs
/// found by ARN are remembered.
#[derive(Clone, Debug)]
pub struct SqsReader {
    client: aws_sdk_sqs::Client,
    limiter: Arc<Limiter>,
    urls: Arc<Mutex<HashMap<String, (String, tokio::time::Instant)>>>,
}

impl SqsReader {
    /// A reader behind a gate of its own (`DEFAULT_LIMIT`).
    pub fn new(client: aws_sdk_sqs::Client) -> Self {
        Self::with_limiter(client, Arc::new(Limiter::new("sqs", DEFAULT_LIMIT)))
    }

    /// A reader whose calls share `limiter` with other readers.
    pub fn with_limiter(client: aws_sdk_sqs::Client, limiter: Arc<Limiter>) -> Self {
        SqsReader {
            client: super::operator_sqs(client),
            limiter,
            urls: Arc::default(),
        }
    }

    pub fn client(&self) -> &aws_sdk_sqs::Client {
        &self.client
    }

    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    fn urls(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, tokio::time::Instant)>> {
        crate::sync::lock(&self.urls)
    }
}

/// GetQueueAttributes' answer keyed by attribute name (`VisibilityTimeout`, `RedrivePolicy`, ...).
pub fn attribute_map(
    attributes: Option<impl IntoIterator<Item = (aws_sdk_sqs::types::QueueAttributeName, String)>>,
) -> HashMap<String, String> {
    attributes
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.as_str().to_string(), v))
        .collect()
}

fn throttled(e: &SqsError) -> bool {
    matches!(e, SqsError::Throttled { .. })
}

#[async_trait::async_trait]
impl QueueReader for SqsReader {
    async fn attributes(&self, url: &str) -> Result<HashMap<String, String>, SqsError> {
        let out = self
            .limiter
            .run("GetQueueAttributes", throttled, || async {
                self.client
                    .get_queue_attributes()
                    .queue_url(url)
                    .attribute_names(QueueAttributeName::All)
                    .send()
                    .await
                    .map_err(|e| {
                        let missing = e
                            .as_service_error()
                            .is_some_and(aws_sdk_sqs::operation::get_queue_attributes::GetQueueAttributesError::is_queue_does_not_exist);
                        SqsError::from_sdk(url, &e, missing)
                    })
            })
            .await;
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                if matches!(e, SqsError::QueueDoesNotExist { .. }) {
                    self.urls().retain(|_, (u, _)| u != url);
                }
                return Err(e);
            }
        };
        Ok(attribute_map(out.attributes))
    }

    async fn url_for_arn(&self, arn: &QueueArn) -> Result<Option<String>, SqsError> {
        let target = arn.to_string();
        if let Some((url, at)) = self.urls().get(&target)
            && at.elapsed() < URL_TTL
        {
            return Ok(Some(url.clone()));
        }
        let res = self
            .limiter
            .run("GetQueueUrl", throttled, || async {
                self.client
                    .get_queue_url()
                    .queue_name(&arn.name)
                    .queue_owner_aws_account_id(&arn.account)
                    .send()
                    .await
                    .map_err(|e| {
                        let missing = e
                            .as_service_error()
                            .is_some_and(aws_sdk_sqs::operation::get_queue_url::GetQueueUrlError::is_queue_does_not_exist);
                        SqsError::from_sdk(&target, &e, missing)
                    })
            })
            .await;
        match res {
            Ok(out) => {
                if let Some(url) = &out.queue_url {
                    self.urls()
                        .insert(target, (url.clone(), tokio::time::Instant::now()));
                }
                Ok(out.queue_url)
            }
            Err(SqsError::QueueDoesNotExist { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }
}

/// Why `observe` could not produce facts about the source queue.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ObserveError {
    #[error("{source}")]
    ReadQueueAttributes { url: String, source: SqsError },
    #[error(
        "queue {url} returned attributes the operator cannot read: {source}: check that the endpoint \
         is SQS"
    )]
    ParseAttributes { url: String, source: FactsError },
    /// Nothing was sent: the operator does not allow the spec's endpoint.
    #[error("{0}")]
    EndpointNotAllowed(#[source] super::endpoints::EndpointError),
    /// Nothing was sent: the operator's tenancy policy refuses this QueueConsumer.
    #[error("{0}")]
    NotAllowedByPolicy(#[source] crate::tenancy::TenancyError),
}

impl ObserveError {
    /// The CamelCase condition reason: the SQS failure's own reason, or `InvalidQueueAttributes`.
    pub fn reason(&self) -> &'static str {
        match self {
            ObserveError::ReadQueueAttributes { source, .. } => source.reason(),
            ObserveError::ParseAttributes { .. } => "InvalidQueueAttributes",
            ObserveError::EndpointNotAllowed(e) => e.reason(),
            ObserveError::NotAllowedByPolicy(e) => e.reason(),
        }
    }

    /// The operator refused the QueueConsumer (its endpoint or its tenancy policy): nothing was sent,
    /// and only a change of the spec or of the operator's configuration helps.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            ObserveError::EndpointNotAllowed(_) | ObserveError::NotAllowedByPolicy(_)
        )
    }
}

/// Read the facts of the queue at `url` and of its dead-letter queue. At most three calls: the
/// source's attributes, then (only with a redrive policy) the DLQ's URL and attributes. A DLQ
/// problem never fails the observation: it is reported in `DeadLetterFacts` for the rules.
pub async fn observe(reader: &dyn QueueReader, url: &str) -> Result<Facts, ObserveError> {
    observe_with(reader, url, &|_| Ok(())).await
}

/// `observe`, reading the DLQ only when `dead_letter_allowed(its ARN)` says so; a refused one is
/// `DeadLetterFacts::Unreachable` with the refusal, and gets no call.
pub async fn observe_with(
    reader: &dyn QueueReader,
    url: &str,
    dead_letter_allowed: &(dyn Fn(&str) -> Result<(), String> + Sync),
) -> Result<Facts, ObserveError> {
    let attrs =
        reader
            .attributes(url)
            .await
            .map_err(|source| ObserveError::ReadQueueAttributes {
                url: url.to_string(),
                source,
            })?;
    let queue = QueueFacts::from_attributes(url, &attrs).map_err(|source| {
        ObserveError::ParseAttributes {
            url: url.to_string(),
            source,
        }
    })?;
    let dead_letter = match &queue.redrive {
        None => DeadLetterFacts::None,
        Some(policy) => match dead_letter_allowed(&policy.dead_letter_target_arn) {
            Ok(()) => observe_dead_letter(reader, &policy.dead_letter_target_arn).await,
            Err(error) => DeadLetterFacts::Unreachable {
                arn: policy.dead_letter_target_arn.clone(),
                error,
            },
        },
    };
    Ok(Facts {
        queue,
        dead_letter,
        oldest_age_seconds: None,
    })
}

async fn observe_dead_letter(reader: &dyn QueueReader, arn: &str) -> DeadLetterFacts {
    let missing = || DeadLetterFacts::Missing {
        arn: arn.to_string(),
    };
    let unreachable = |error: String| DeadLetterFacts::Unreachable {
        arn: arn.to_string(),
        error,
    };
    // SQS rejects a redrive policy whose target is not a queue ARN, so no queue can be behind it.
    let Some(parsed) = QueueArn::parse(arn) else {
        return missing();
    };
    let dlq_url = match reader.url_for_arn(&parsed).await {
        Ok(Some(u)) => u,
        Ok(None) => return missing(),
        Err(e) => return unreachable(e.to_string()),
    };
    let attrs = match reader.attributes(&dlq_url).await {
        Ok(a) => a,
        // Deleted between the two calls, or a stale URL cache in the server.
        Err(SqsError::QueueDoesNotExist { .. }) => return missing(),
        Err(e) => return unreachable(e.to_string()),
    };
    match QueueFacts::from_attributes(&dlq_url, &attrs) {
        Ok(queue) => DeadLetterFacts::Found {
            queue,
            oldest_age_seconds: None,
        },
        Err(e) => unreachable(format!(
            "dead-letter queue {dlq_url} returned attributes the operator cannot read: {e}"
        )),
    }
}

/// An in-memory `QueueReader` for tests (here and in the controller): queues by URL, ARNs to URLs,
/// and per-URL or per-ARN failures. Unknown URLs answer QueueDoesNotExist, unknown ARNs `None`,
/// as SQS does. It records every call so tests can count them.
#[derive(Debug, Default)]
pub struct StaticReader {
    queues: HashMap<String, HashMap<String, String>>,
    arns: HashMap<String, String>,
    failures: HashMap<String, SqsError>,
    calls: Mutex<Vec<String>>,
}

impl StaticReader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a queue; its `QueueArn` attribute, if present, also resolves to `url`.
    pub fn with_queue<K, V>(mut self, url: &str, attrs: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        let attrs: HashMap<String, String> = attrs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        if let Some(arn) = attrs.get(crate::aws::facts::ATTR_ARN) {
            self.arns.insert(arn.clone(), url.to_string());
        }
        self.queues.insert(url.to_string(), attrs);
        self
    }

    /// Make `arn` resolve to `url` (which need not be a known queue: a stale mapping).
    pub fn with_arn(mut self, arn: &str, url: &str) -> Self {
        self.arns.insert(arn.to_string(), url.to_string());
        self
    }

    /// Make every call about `url_or_arn` fail with `err`.
    pub fn failing(mut self, url_or_arn: &str, err: SqsError) -> Self {
        self.failures.insert(url_or_arn.to_string(), err);
        self
    }

    /// Calls made so far, as `GetQueueAttributes URL` / `GetQueueUrl ARN`.
    pub fn calls(&self) -> Vec<String> {
        crate::sync::lock(&self.calls).clone()
    }

    fn record(&self, call: String) {
        crate::sync::lock(&self.calls).push(call);
    }
}

#[async_trait::async_trait]
impl QueueReader for StaticReader {
    async fn attributes(&self, url: &str) -> Result<HashMap<String, String>, SqsError> {
        self.record(format!("GetQueueAttributes {url}"));
        if let Some(e) = self.failures.get(url) {
            return Err(e.clone());
        }
        self.queues
            .get(url)
            .cloned()
            .ok_or_else(|| SqsError::QueueDoesNotExist {
                target: url.to_string(),
            })
    }

    async fn url_for_arn(&self, arn: &QueueArn) -> Result<Option<String>, SqsError> {
        let arn = arn.to_string();
        self.record(format!("GetQueueUrl {arn}"));
        if let Some(e) = self.failures.get(&arn) {
            return Err(e.clone());
        }
        Ok(self.arns.get(&arn).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Duration;

    const SRC: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders";
    const DLQ: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders-dlq";
    const DLQ_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders-dlq";

    fn source(redrive_arn: Option<&str>) -> Vec<(String, String)> {
        let mut a = vec![
            (
                "QueueArn".into(),
                "arn:aws:sqs:us-east-1:123456789012:orders".into(),
            ),
            ("VisibilityTimeout".into(), "60".into()),
            ("MessageRetentionPeriod".into(), "86400".into()),
            ("ApproximateNumberOfMessages".into(), "4".into()),
            ("ApproximateNumberOfMessagesNotVisible".into(), "1".into()),
            ("ApproximateNumberOfMessagesDelayed".into(), "0".into()),
        ];
        if let Some(arn) = redrive_arn {
            a.push((
                "RedrivePolicy".into(),
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"5"}}"#),
            ));
        }
        a
    }

    fn dlq() -> Vec<(&'static str, &'static str)> {
        vec![
            ("QueueArn", DLQ_ARN),
            ("VisibilityTimeout", "30"),
            ("MessageRetentionPeriod", "1209600"),
            ("ApproximateNumberOfMessages", "2"),
        ]
    }

    #[tokio::test]
    async fn no_redrive_reads_only_the_source() {
        let r = StaticReader::new().with_queue(SRC, source(None));
        let f = observe(&r, SRC).await.unwrap();
        assert_eq!(f.dead_letter, DeadLetterFacts::None);
        assert_eq!(f.queue.visibility_timeout, Duration::from_secs(60));
        assert_eq!(f.queue.retention, Duration::from_secs(86400));
        assert_eq!(
            (f.queue.visible, f.queue.in_flight, f.queue.delayed),
            (Some(4), Some(1), Some(0))
        );
        assert_eq!(r.calls(), vec![format!("GetQueueAttributes {SRC}")]);
    }

    #[tokio::test]
    async fn found_dlq_takes_three_calls() {
        let r = StaticReader::new()
            .with_queue(SRC, source(Some(DLQ_ARN)))
            .with_queue(DLQ, dlq());
        let f = observe(&r, SRC).await.unwrap();
        assert_eq!(f.queue.redrive.as_ref().unwrap().max_receive_count, 5);
        match f.dead_letter {
            DeadLetterFacts::Found {
                queue,
                oldest_age_seconds,
            } => {
                assert_eq!(queue.url, DLQ);
                assert_eq!(queue.retention, Duration::from_secs(1_209_600));
                assert_eq!(queue.visible, Some(2));
                assert_eq!(oldest_age_seconds, None);
            }
            other => panic!("expected Found, got {other:?}"),
        }
        assert_eq!(
            r.calls(),
            vec![
                format!("GetQueueAttributes {SRC}"),
                format!("GetQueueUrl {DLQ_ARN}"),
                format!("GetQueueAttributes {DLQ}"),
            ]
        );
    }

    fn missing(arn: &str) -> DeadLetterFacts {
        DeadLetterFacts::Missing { arn: arn.into() }
    }

    #[tokio::test]
    async fn unknown_arn_is_missing() {
        let r = StaticReader::new().with_queue(SRC, source(Some(DLQ_ARN)));
        assert_eq!(
            observe(&r, SRC).await.unwrap().dead_letter,
            missing(DLQ_ARN)
        );
    }

    #[tokio::test]
    async fn unparseable_arn_is_missing_without_a_call() {
        let r = StaticReader::new().with_queue(SRC, source(Some("not-an-arn")));
        assert_eq!(
            observe(&r, SRC).await.unwrap().dead_letter,
            missing("not-an-arn")
        );
        assert_eq!(r.calls().len(), 1);
    }

    #[tokio::test]
    async fn stale_url_for_a_deleted_dlq_is_missing() {
        let r = StaticReader::new()
            .with_queue(SRC, source(Some(DLQ_ARN)))
            .with_arn(DLQ_ARN, DLQ);
        assert_eq!(
            observe(&r, SRC).await.unwrap().dead_letter,
            missing(DLQ_ARN)
        );
    }

    #[tokio::test]
    async fn dlq_errors_are_unreachable_with_the_message() {
        let denied = SqsError::AccessDenied {
            target: DLQ.into(),
            code: "AccessDenied".into(),
            message: "not authorized".into(),
        };
        let timeout = SqsError::Timeout {
            target: DLQ_ARN.into(),
            detail: "connect timeout".into(),
        };
        for (key, err) in [(DLQ, denied), (DLQ_ARN, timeout)] {
            let r = StaticReader::new()
                .with_queue(SRC, source(Some(DLQ_ARN)))
                .with_queue(DLQ, dlq())
                .failing(key, err.clone());
            let f = observe(&r, SRC).await.unwrap();
            assert_eq!(
                f.dead_letter,
                DeadLetterFacts::Unreachable {
                    arn: DLQ_ARN.into(),
                    error: err.to_string()
                }
            );
        }
    }

    #[tokio::test]
    async fn unreadable_dlq_attributes_are_unreachable() {
        let r = StaticReader::new()
            .with_queue(SRC, source(Some(DLQ_ARN)))
            .with_queue(DLQ, [("QueueArn", DLQ_ARN), ("VisibilityTimeout", "soon")]);
        match observe(&r, SRC).await.unwrap().dead_letter {
            DeadLetterFacts::Unreachable { arn, error } => {
                assert_eq!(arn, DLQ_ARN);
                assert!(error.contains("VisibilityTimeout"), "{error}");
            }
            other => panic!("expected Unreachable, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn source_errors_fail_the_observation() {
        let r = StaticReader::new();
        let e = observe(&r, SRC).await.unwrap_err();
        assert_eq!(e.reason(), "QueueDoesNotExist");
        assert!(e.to_string().contains(SRC), "{e}");
        assert!(e.to_string().contains("spec.queue.url"), "{e}");

        let r = StaticReader::new().with_queue(SRC, [("VisibilityTimeout", "-1")]);
        let e = observe(&r, SRC).await.unwrap_err();
        assert_eq!(e.reason(), "InvalidQueueAttributes");
        assert!(matches!(e, ObserveError::ParseAttributes { .. }));
        assert!(e.to_string().contains("VisibilityTimeout"), "{e}");
    }

    #[test]
    fn codes_map_to_reasons() {
        for (code, reason) in [
            ("QueueDoesNotExist", "QueueDoesNotExist"),
            (
                "AWS.SimpleQueueService.NonExistentQueue",
                "QueueDoesNotExist",
            ),
            ("AccessDenied", "AccessDenied"),
            ("AccessDeniedException", "AccessDenied"),
            ("KMS.AccessDeniedException", "AccessDenied"),
            ("InvalidClientTokenId", "InvalidCredentials"),
            ("UnrecognizedClientException", "InvalidCredentials"),
            ("SignatureDoesNotMatch", "InvalidCredentials"),
            ("ExpiredToken", "InvalidCredentials"),
            ("RequestThrottled", "Throttled"),
            ("ThrottlingException", "Throttled"),
            ("InvalidAddress", "InvalidQueueUrl"),
            ("KMS.ThrottlingException", "Throttled"),
            ("RequestLimitExceeded", "Throttled"),
            ("KMS.DisabledException", "AwsError"),
            ("SomethingNew", "AwsError"),
        ] {
            let e = SqsError::from_code(SRC, code, "msg");
            assert_eq!(e.reason(), reason, "{code}");
            assert!(e.to_string().contains(SRC), "{e}");
        }
        let e = SqsError::from_code(SRC, "SomethingNew", "the message");
        assert!(e.to_string().contains("SomethingNew: the message"), "{e}");
    }
}
