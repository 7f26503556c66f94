//! Shared helpers of the integration tests: the real servers started by `scripts/test`.
#![allow(dead_code)]

pub mod cluster;
pub mod fixture;
pub mod fuzz;
pub mod k8s;
pub mod node;

use std::sync::atomic::{AtomicU32, Ordering};

/// The moto server's URL, exported by `scripts/test` as QC_TEST_SQS_ENDPOINT.
pub fn sqs_endpoint() -> String {
    std::env::var("QC_TEST_SQS_ENDPOINT").expect(
        "QC_TEST_SQS_ENDPOINT is not set: run `bash scripts/test`, or start `moto_server -H 127.0.0.1 -p PORT` \
         and export QC_TEST_SQS_ENDPOINT=http://127.0.0.1:PORT AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1",
    )
}

/// The redis server's URL, exported by `scripts/test` as QC_TEST_REDIS_URL.
pub fn redis_url() -> String {
    std::env::var("QC_TEST_REDIS_URL")
        .expect("QC_TEST_REDIS_URL is not set: run `bash scripts/test`, or start redis-server and export QC_TEST_REDIS_URL=redis://127.0.0.1:PORT")
}

/// moto's DynamoDB, exported by `scripts/test` as QC_TEST_DYNAMODB_ENDPOINT (the moto server that
/// serves SQS serves DynamoDB too).
pub fn dynamodb_endpoint() -> String {
    std::env::var("QC_TEST_DYNAMODB_ENDPOINT").expect(
        "QC_TEST_DYNAMODB_ENDPOINT is not set: run `bash scripts/test`, or export it as the moto server's URL (the one of QC_TEST_SQS_ENDPOINT)",
    )
}

/// A fresh DynamoDB table on `endpoint` with a String partition key `key_attribute`, as the
/// idempotency store needs.
pub async fn dynamodb_table(endpoint: &str, key_attribute: &str) -> String {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(endpoint)).await;
    let client = aws_sdk_dynamodb::Client::new(&conf);
    let name = unique_name("idem");
    client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(key_attribute)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(key_attribute)
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    name
}

/// An SDK client for the test server, with dummy credentials.
pub async fn sqs_client() -> aws_sdk_sqs::Client {
    assert!(
        std::env::var("AWS_ACCESS_KEY_ID").is_ok(),
        "AWS_ACCESS_KEY_ID is not set: run `bash scripts/test` (it exports dummy keys for moto)"
    );
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&sqs_endpoint())).await;
    aws_sdk_sqs::Client::new(&conf)
}

/// A queue name no other test (or earlier run against the same server) uses.
pub fn unique_name(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

/// Creates a queue on the test server with these attributes and returns its URL.
pub async fn create_queue(
    client: &aws_sdk_sqs::Client,
    name: &str,
    attributes: &[(aws_sdk_sqs::types::QueueAttributeName, String)],
) -> String {
    let mut req = client.create_queue().queue_name(name);
    for (k, v) in attributes {
        req = req.attributes(k.clone(), v);
    }
    let out = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("create queue {name}: {e:?}"));
    out.queue_url.expect("CreateQueue answered without a URL")
}

/// The ARN of a queue on the test server.
pub async fn queue_arn(client: &aws_sdk_sqs::Client, url: &str) -> String {
    use aws_sdk_sqs::types::QueueAttributeName;
    let out = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap_or_else(|e| panic!("queue ARN of {url}: {e:?}"));
    out.attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
        .expect("GetQueueAttributes answered without QueueArn")
}

/// Sends `n` messages `{prefix} {i}` (i from 0) to `url`, ten a SendMessageBatch.
pub async fn send_numbered(client: &aws_sdk_sqs::Client, url: &str, prefix: &str, n: usize) {
    use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
    for chunk in (0..n).collect::<Vec<_>>().chunks(10) {
        let entries = chunk
            .iter()
            .map(|i| {
                SendMessageBatchRequestEntry::builder()
                    .id(format!("m{i}"))
                    .message_body(format!("{prefix} {i}"))
                    .build()
                    .unwrap()
            })
            .collect::<Vec<_>>();
        client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
            .unwrap();
    }
}

/// Puts a queue's ApproximateAgeOfOldestMessage (seconds) into CloudWatch's `AWS/SQS` namespace, as
/// SQS publishes it (moto keeps what is put there).
pub async fn put_oldest_age(cw: &aws_sdk_cloudwatch::Client, queue_name: &str, seconds: f64) {
    use aws_sdk_cloudwatch::types::{Dimension, MetricDatum, StandardUnit};
    cw.put_metric_data()
        .namespace("AWS/SQS")
        .metric_data(
            MetricDatum::builder()
                .metric_name("ApproximateAgeOfOldestMessage")
                .dimensions(
                    Dimension::builder()
                        .name("QueueName")
                        .value(queue_name)
                        .build(),
                )
                .value(seconds)
                .unit(StandardUnit::Seconds)
                .build(),
        )
        .send()
        .await
        .unwrap();
}

/// A TCP forwarder to the test server that counts the connections made to it and keeps what clients
/// sent: the endpoint of a QueueConsumer whose AWS traffic a test counts (zero: nothing of it reached
/// AWS) or reads (which credentials signed its requests).
pub struct CountingProxy {
    pub endpoint: String,
    pub connections: std::sync::Arc<AtomicU32>,
    sent: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl CountingProxy {
    pub fn count(&self) -> u32 {
        self.connections.load(Ordering::SeqCst)
    }

    /// Everything clients sent through it so far (request heads and bodies), as text.
    pub fn sent(&self) -> String {
        String::from_utf8_lossy(&self.sent.lock().unwrap()).into_owned()
    }
}

/// A [`CountingProxy`] in front of `to` (`http://HOST:PORT`, such as [`sqs_endpoint`]).
pub async fn counting_proxy(to: &str) -> CountingProxy {
    let target = to
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", l.local_addr().unwrap());
    let connections = std::sync::Arc::new(AtomicU32::new(0));
    let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (count, kept) = (connections.clone(), sent.clone());
    tokio::spawn(async move {
        while let Ok((inbound, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let (target, kept) = (target.clone(), kept.clone());
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                let (mut in_read, mut in_write) = inbound.into_split();
                let (mut out_read, mut out_write) = outbound.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut out_read, &mut in_write).await;
                });
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = in_read.read(&mut buf).await {
                    if n == 0 || out_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    kept.lock().unwrap().extend_from_slice(&buf[..n]);
                }
                let _ = out_write.shutdown().await;
            });
        }
    });
    CountingProxy {
        endpoint,
        connections,
        sent,
    }
}

/// A moto server of a test's own (beside the shared one `scripts/test` starts), on a free loopback
/// port, stopped when dropped: `args` follow `-H 127.0.0.1 -p PORT` (a TLS certificate), `env` is its
/// environment (IAM enforcement). Returned once it listens.
pub struct OwnMoto {
    pub port: u16,
    child: std::process::Child,
}

impl OwnMoto {
    pub fn start(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> OwnMoto {
        let bin = std::env::var("QC_TEST_MOTO_SERVER").expect(
            "QC_TEST_MOTO_SERVER is not set: run `bash scripts/test`, or export it as the path of moto_server",
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("moto_server starts");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "moto did not listen");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        OwnMoto { port, child }
    }
}

impl Drop for OwnMoto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
