//! The SQS calls of `spec.queue.manage`: SetQueueAttributes, CreateQueue (with tags) and the new
//! queue's ARN, behind `QueueWriter` so the controller's step can be tested with a double. Thin: what
//! to send is decided in `crate::manage`.

use std::collections::BTreeMap;

use aws_sdk_sqs::types::QueueAttributeName;

use crate::aws::facts::ATTR_ARN;
use crate::aws::sqs::SqsError;
use crate::manage::NewQueue;

/// The writes `queue.manage` makes.
#[async_trait::async_trait]
pub trait QueueWriter: Send + Sync {
    /// SetQueueAttributes(`attributes`) on `url`.
    async fn set_attributes(
        &self,
        url: &str,
        attributes: &BTreeMap<String, String>,
    ) -> Result<(), SqsError>;
    /// CreateQueue with the queue's attributes and tags; its URL.
    async fn create(&self, queue: &NewQueue) -> Result<String, SqsError>;
    /// The QueueArn of the queue at `url` (for a redrive policy naming it).
    async fn arn(&self, url: &str) -> Result<String, SqsError>;
    /// The AWS account the writer's credentials act in (STS GetCallerIdentity): where CreateQueue
    /// would put a queue, whatever account the queue URL names.
    async fn account(&self) -> Result<String, SqsError>;
}

/// Why a write of `queue.manage` failed: the call, the queue, and the SQS error (whose reason is the
/// condition's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error(
        "SetQueueAttributes on {url} failed: {source} (queue.manage needs sqs:SetQueueAttributes on the queue for the operator's role)"
    )]
    SetQueueAttributes { url: String, source: SqsError },
    #[error(
        "CreateQueue {name} failed: {source} (queue.manage: create needs sqs:CreateQueue and sqs:TagQueue for the operator's role)"
    )]
    CreateQueue { name: String, source: SqsError },
    #[error("reading the ARN of the new queue {url} failed: {source}")]
    ReadArn { url: String, source: SqsError },
    #[error(
        "reading which AWS account queue.manage: create would create {name} in failed (sts:GetCallerIdentity, allowed to every identity): {source}; nothing is created until it is known to be the queue's account"
    )]
    CallerAccount { name: String, source: SqsError },
}

impl WriteError {
    /// The CamelCase reason of the SQS failure.
    pub fn reason(&self) -> &'static str {
        match self {
            WriteError::SetQueueAttributes { source, .. }
            | WriteError::CreateQueue { source, .. }
            | WriteError::ReadArn { source, .. }
            | WriteError::CallerAccount { source, .. } => source.reason(),
        }
    }
}

/// `QueueWriter` on the SDK clients (SQS, and STS for the account), of one identity.
pub struct SdkQueueWriter {
    client: aws_sdk_sqs::Client,
    sts: aws_sdk_sts::Client,
}

impl SdkQueueWriter {
    pub fn new(client: aws_sdk_sqs::Client, sts: aws_sdk_sts::Client) -> Self {
        SdkQueueWriter {
            client: super::operator_sqs(client),
            sts: super::operator_sts(sts),
        }
    }
}

#[async_trait::async_trait]
impl QueueWriter for SdkQueueWriter {
    async fn set_attributes(
        &self,
        url: &str,
        attributes: &BTreeMap<String, String>,
    ) -> Result<(), SqsError> {
        let mut call = self.client.set_queue_attributes().queue_url(url);
        for (k, v) in attributes {
            call = call.attributes(QueueAttributeName::from(k.as_str()), v);
        }
        call.send().await.map_err(|e| {
            let missing = e.as_service_error().is_some_and(
                aws_sdk_sqs::operation::set_queue_attributes::SetQueueAttributesError::is_queue_does_not_exist,
            );
            SqsError::from_sdk(url, &e, missing)
        })?;
        Ok(())
    }

    async fn create(&self, queue: &NewQueue) -> Result<String, SqsError> {
        let mut call = self.client.create_queue().queue_name(&queue.name);
        for (k, v) in &queue.attributes {
            call = call.attributes(QueueAttributeName::from(k.as_str()), v);
        }
        for (k, v) in &queue.tags {
            call = call.tags(k, v);
        }
        let out = call
            .send()
            .await
            .map_err(|e| SqsError::from_sdk(&queue.name, &e, false))?;
        out.queue_url.ok_or_else(|| SqsError::BadResponse {
            target: queue.name.clone(),
            detail: "CreateQueue answered without a QueueUrl".to_string(),
        })
    }

    async fn account(&self) -> Result<String, SqsError> {
        let out = self.sts.get_caller_identity().send().await.map_err(|e| {
            use aws_sdk_sts::error::ProvideErrorMetadata as _;
            SqsError::AwsError {
                target: "sts:GetCallerIdentity".to_string(),
                code: e.code().unwrap_or("Unknown").to_string(),
                message: aws_sdk_sts::error::DisplayErrorContext(&e).to_string(),
            }
        })?;
        out.account.ok_or_else(|| SqsError::BadResponse {
            target: "sts:GetCallerIdentity".to_string(),
            detail: "GetCallerIdentity answered without an Account".to_string(),
        })
    }

    async fn arn(&self, url: &str) -> Result<String, SqsError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| SqsError::from_sdk(url, &e, false))?;
        out.attributes
            .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
            .ok_or_else(|| SqsError::BadResponse {
                target: url.to_string(),
                detail: format!("GetQueueAttributes answered without {ATTR_ARN}"),
            })
    }
}

/// Create the DLQ, then the queue with its redrive policy naming the DLQ. The URLs of both.
pub async fn create_with_dead_letter(
    writer: &dyn QueueWriter,
    plan: &crate::manage::CreatePlan,
) -> Result<(String, String), WriteError> {
    let dlq_url = create_dead_letter(writer, &plan.dead_letter).await?;
    let dlq_arn = writer
        .arn(&dlq_url)
        .await
        .map_err(|source| WriteError::ReadArn {
            url: dlq_url.clone(),
            source,
        })?;
    let mut queue = plan.queue.clone();
    queue.attributes.insert(
        crate::aws::facts::ATTR_REDRIVE_POLICY.to_string(),
        crate::manage::redrive_policy_json(&dlq_arn, plan.max_receive_count),
    );
    let url = writer
        .create(&queue)
        .await
        .map_err(|source| WriteError::CreateQueue {
            name: queue.name.clone(),
            source,
        })?;
    Ok((dlq_url, url))
}

/// Create a DLQ; its URL.
pub async fn create_dead_letter(
    writer: &dyn QueueWriter,
    dlq: &NewQueue,
) -> Result<String, WriteError> {
    writer
        .create(dlq)
        .await
        .map_err(|source| WriteError::CreateQueue {
            name: dlq.name.clone(),
            source,
        })
}
