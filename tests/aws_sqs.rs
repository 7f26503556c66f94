//! The SQS adapter against a real moto server: facts of real queues and DLQs, missing queues,
//! a deleted DLQ, a closed endpoint and refused credentials.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration as StdDuration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_sqs::types::QueueAttributeName;
use qc::api::Duration;
use qc::aws::{DeadLetterFacts, ObserveError, QueueArn, QueueReader, SqsReader, observe};

/// Counts HTTP attempts, so a test can assert how many requests `observe` sends.
#[derive(Debug, Clone, Default)]
struct Requests(Arc<AtomicUsize>);

impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "count-requests"
    }

    fn read_before_transmit(
        &self,
        _ctx: &BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_sqs::error::BoxError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl Requests {
    fn take(&self) -> usize {
        self.0.swap(0, Ordering::SeqCst)
    }
}

async fn counting_client() -> (Client, Requests) {
    let base = common::sqs_client().await;
    let requests = Requests::default();
    let conf = base
        .config()
        .to_builder()
        .interceptor(requests.clone())
        .build();
    (Client::from_conf(conf), requests)
}

fn redrive(arn: &str, count: &str) -> (QueueAttributeName, String) {
    (
        QueueAttributeName::RedrivePolicy,
        format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":{count}}}"#),
    )
}

#[tokio::test]
async fn observes_a_standard_queue_and_its_dlq() {
    let (client, requests) = counting_client().await;
    let dlq = common::create_queue(
        &client,
        &common::unique_name("qc-dlq"),
        &[(QueueAttributeName::MessageRetentionPeriod, "1209600".into())],
    )
    .await;
    let dlq_arn = common::queue_arn(&client, &dlq).await;
    // maxReceiveCount as a JSON string, as some servers echo it.
    let src = common::create_queue(
        &client,
        &common::unique_name("qc-src"),
        &[
            (QueueAttributeName::VisibilityTimeout, "45".into()),
            (QueueAttributeName::MessageRetentionPeriod, "86400".into()),
            redrive(&dlq_arn, r#""4""#),
        ],
    )
    .await;
    for i in 0..3 {
        client
            .send_message()
            .queue_url(&src)
            .message_body(format!("m{i}"))
            .send()
            .await
            .unwrap();
    }
    for i in 0..2 {
        client
            .send_message()
            .queue_url(&src)
            .message_body(format!("later{i}"))
            .delay_seconds(600)
            .send()
            .await
            .unwrap();
    }
    let got = client
        .receive_message()
        .queue_url(&src)
        .max_number_of_messages(1)
        .send()
        .await
        .unwrap();
    assert_eq!(got.messages.unwrap_or_default().len(), 1);
    client
        .send_message()
        .queue_url(&dlq)
        .message_body("dead")
        .send()
        .await
        .unwrap();

    requests.take();
    let facts = observe(&SqsReader::new(client.clone()), &src)
        .await
        .unwrap();
    // Source attributes, DLQ URL, DLQ attributes: nothing more.
    assert_eq!(requests.take(), 3);

    let q = &facts.queue;
    assert_eq!(q.url, src);
    assert!(
        q.arn
            .as_deref()
            .unwrap()
            .ends_with(src.rsplit('/').next().unwrap())
    );
    assert_eq!(q.visibility_timeout, Duration::from_secs(45));
    assert_eq!(q.retention, Duration::from_secs(86400));
    assert!(!q.fifo);
    let policy = q.redrive.as_ref().unwrap();
    assert_eq!(policy.dead_letter_target_arn, dlq_arn);
    assert_eq!(policy.max_receive_count, 4);
    assert_eq!(q.visible, Some(2));
    assert_eq!(q.in_flight, Some(1));
    assert_eq!(q.delayed, Some(2));

    match &facts.dead_letter {
        DeadLetterFacts::Found {
            queue,
            oldest_age_seconds,
        } => {
            assert_eq!(queue.url, dlq);
            assert_eq!(queue.arn.as_deref(), Some(dlq_arn.as_str()));
            assert_eq!(queue.retention, Duration::from_secs(1_209_600));
            assert_eq!(queue.visibility_timeout, Duration::from_secs(30));
            assert!(!queue.fifo);
            assert_eq!(queue.redrive, None);
            assert_eq!(queue.visible, Some(1));
            assert_eq!(queue.in_flight, Some(0));
            assert_eq!(*oldest_age_seconds, None);
        }
        other => panic!("expected Found, got {other:?}"),
    }
}

#[tokio::test]
async fn observes_a_fifo_pair_without_redrive_on_the_dlq() {
    let (client, requests) = counting_client().await;
    let fifo = || (QueueAttributeName::FifoQueue, "true".to_string());
    let dlq = common::create_queue(
        &client,
        &format!("{}.fifo", common::unique_name("qc-dlq")),
        &[fifo()],
    )
    .await;
    let dlq_arn = common::queue_arn(&client, &dlq).await;
    // maxReceiveCount as a JSON number this time.
    let src = common::create_queue(
        &client,
        &format!("{}.fifo", common::unique_name("qc-src")),
        &[
            fifo(),
            (QueueAttributeName::ContentBasedDeduplication, "true".into()),
            (QueueAttributeName::VisibilityTimeout, "120".into()),
            redrive(&dlq_arn, "7"),
        ],
    )
    .await;
    for i in 0..2 {
        client
            .send_message()
            .queue_url(&src)
            .message_group_id("g")
            .message_body(format!("m{i}"))
            .send()
            .await
            .unwrap();
    }
    requests.take();
    let facts = observe(&SqsReader::new(client), &src).await.unwrap();
    assert_eq!(requests.take(), 3);
    assert!(facts.queue.fifo);
    assert_eq!(facts.queue.visibility_timeout, Duration::from_secs(120));
    assert_eq!(facts.queue.redrive.as_ref().unwrap().max_receive_count, 7);
    assert_eq!(facts.queue.visible, Some(2));
    match facts.dead_letter {
        DeadLetterFacts::Found { queue, .. } => {
            assert!(queue.fifo);
            assert_eq!(queue.url, dlq);
            assert_eq!(queue.visible, Some(0));
        }
        other => panic!("expected Found, got {other:?}"),
    }
}

#[tokio::test]
async fn queue_without_redrive_needs_one_request() {
    let (client, requests) = counting_client().await;
    let src = common::create_queue(&client, &common::unique_name("qc-plain"), &[]).await;
    requests.take();
    let facts = observe(&SqsReader::new(client), &src).await.unwrap();
    assert_eq!(requests.take(), 1);
    assert_eq!(facts.dead_letter, DeadLetterFacts::None);
    // SQS defaults when created without attributes.
    assert_eq!(facts.queue.visibility_timeout, Duration::from_secs(30));
    assert_eq!(facts.queue.retention, Duration::from_secs(345_600));
    assert_eq!(facts.queue.visible, Some(0));
}

#[tokio::test]
async fn missing_source_queue_is_queue_does_not_exist() {
    let (client, requests) = counting_client().await;
    let url = format!(
        "{}/123456789012/{}",
        common::sqs_endpoint(),
        common::unique_name("qc-nothere")
    );
    requests.take();
    let err = observe(&SqsReader::new(client), &url).await.unwrap_err();
    // Not retried: a missing queue is not transient.
    assert_eq!(requests.take(), 1);
    assert_eq!(err.reason(), "QueueDoesNotExist");
    match &err {
        ObserveError::ReadQueueAttributes { url: u, source } => {
            assert_eq!(u, &url);
            assert_eq!(source.reason(), "QueueDoesNotExist");
        }
        other => panic!("expected ReadQueueAttributes, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&url) && msg.contains("spec.queue.url"),
        "{msg}"
    );
}

#[tokio::test]
async fn deleted_dlq_is_missing() {
    let client = common::sqs_client().await;
    let dlq = common::create_queue(&client, &common::unique_name("qc-gone"), &[]).await;
    let dlq_arn = common::queue_arn(&client, &dlq).await;
    let src = common::create_queue(&client, &common::unique_name("qc-orphan"), &[]).await;
    client
        .set_queue_attributes()
        .queue_url(&src)
        .attributes(QueueAttributeName::RedrivePolicy, redrive(&dlq_arn, "3").1)
        .send()
        .await
        .unwrap();
    client.delete_queue().queue_url(&dlq).send().await.unwrap();

    let facts = observe(&SqsReader::new(client), &src).await.unwrap();
    assert_eq!(facts.queue.redrive.unwrap().max_receive_count, 3);
    assert_eq!(facts.dead_letter, DeadLetterFacts::Missing { arn: dlq_arn });
}

#[tokio::test]
async fn url_for_arn_resolves_or_says_none() {
    let client = common::sqs_client().await;
    let url = common::create_queue(&client, &common::unique_name("qc-byarn"), &[]).await;
    let arn = common::queue_arn(&client, &url).await;
    let reader = SqsReader::new(client);
    let parsed = QueueArn::parse(&arn).unwrap();
    assert_eq!(
        reader.url_for_arn(&parsed).await.unwrap().as_deref(),
        Some(url.as_str())
    );
    let absent = QueueArn {
        name: common::unique_name("qc-absent"),
        ..parsed
    };
    assert_eq!(reader.url_for_arn(&absent).await.unwrap(), None);
    let attrs: HashMap<String, String> = reader.attributes(&url).await.unwrap();
    assert_eq!(attrs.get("QueueArn"), Some(&arn));
}

/// A loopback port nothing listens on: bound, then released.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn closed_endpoint_is_unreachable_and_returns() {
    let conf = qc::aws::sdk_config(
        Some("us-east-1"),
        Some(&format!("http://127.0.0.1:{}", closed_port())),
    )
    .await;
    let conf = aws_sdk_sqs::config::Builder::from(&conf)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(StdDuration::from_secs(5))
                .operation_timeout(StdDuration::from_secs(20))
                .build(),
        )
        .build();
    let reader = SqsReader::new(Client::from_conf(conf));
    let url = "https://sqs.us-east-1.amazonaws.com/123456789012/qc-unreachable";
    let err = tokio::time::timeout(StdDuration::from_mins(1), observe(&reader, url))
        .await
        .expect("observe must return, not hang, on a closed endpoint")
        .unwrap_err();
    assert_eq!(err.reason(), "EndpointUnreachable", "{err}");
    let msg = err.to_string();
    assert!(msg.contains(url) && msg.contains("egress"), "{msg}");
}

/// Credentials that cannot be loaded, as when no IAM role is bound.
#[derive(Debug)]
struct NoCredentials;

impl aws_sdk_sqs::config::ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            aws_credential_types::provider::error::CredentialsError::not_loaded(
                "no credentials in this test",
            ),
        ))
    }
}

#[tokio::test]
async fn missing_credentials_are_invalid_credentials() {
    let base = common::sqs_client().await;
    let conf = base
        .config()
        .to_builder()
        .credentials_provider(NoCredentials)
        .retry_config(RetryConfig::disabled())
        .build();
    let url = common::create_queue(&base, &common::unique_name("qc-creds"), &[]).await;
    let err = observe(&SqsReader::new(Client::from_conf(conf)), &url)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "InvalidCredentials", "{err}");
    assert!(err.to_string().contains("IAM role"), "{err}");
}
