//! `--s3-payloads` (#32 item 3) against moto's S3 and SQS: messages of the Amazon SQS Extended
//! Client, whose body points at an S3 object, reach the handler with the object's bytes; a missing
//! object is poison (the pointer goes to the DLQ with the reason); S3 unreachable is a retry, never
//! a handler call with the pointer.

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::time::Duration;

use aws_sdk_sqs::types::MessageAttributeValue;
use support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;
const CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";

async fn s3() -> aws_sdk_s3::Client {
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&common::sqs_endpoint())).await;
    aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&conf)
            .force_path_style(true)
            .build(),
    )
}

async fn bucket(s3: &aws_sdk_s3::Client) -> String {
    let name = common::unique_name("payloads").to_lowercase();
    s3.create_bucket().bucket(&name).send().await.unwrap();
    name
}

/// Sends what the Extended Client sends for a payload in `bucket`/`key` of `size` bytes.
async fn send_pointer(q: &TestQueue, bucket: &str, key: &str, size: usize) {
    let body = format!(r#"["{CLASS}",{{"s3BucketName":"{bucket}","s3Key":"{key}"}}]"#);
    q.client
        .send_message()
        .queue_url(&q.url)
        .message_body(body)
        .message_attributes(
            "ExtendedPayloadSize",
            MessageAttributeValue::builder()
                .data_type("Number")
                .string_value(size.to_string())
                .build()
                .unwrap(),
        )
        .message_attributes(
            "tenant",
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value("t-7")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
}

/// A 300 KiB payload (over SQS's 256 KiB) reaches the handler as the body, with the message's own
/// attributes but not the size attribute; with --s3-delete-after the object is deleted once the
/// message is; a plain message on the same queue is handled as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pointer_reaches_the_handler_as_its_payload_and_the_object_is_deleted_after() {
    let q = TestQueue::new("s3-ok", 30, 3, false).await;
    let s3 = s3().await;
    let b = bucket(&s3).await;
    let payload: String = (0..300 * 1024)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    s3.put_object()
        .bucket(&b)
        .key("orders/1.json")
        .body(payload.clone().into_bytes().into())
        .send()
        .await
        .unwrap();
    send_pointer(&q, &b, "orders/1.json", payload.len()).await;
    q.send_one("plain").await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w =
        Worker::start(&q.args(&["--http-url", &h.url, "--s3-payloads", "--s3-delete-after"]));
    eventually(SECS(30), "both handled and deleted", || q.is_empty()).await;
    let calls = h.calls();
    assert_eq!(calls.len(), 2, "each once");
    let big = calls
        .iter()
        .find(|c| c.body.len() > 1000)
        .expect("the payload");
    assert_eq!(big.body, payload.as_bytes(), "the object's bytes");
    assert_eq!(
        big.headers
            .get("x-sqs-attribute-tenant")
            .map(String::as_str),
        Some("t-7")
    );
    assert!(
        !big.headers
            .contains_key("x-sqs-attribute-extendedpayloadsize"),
        "the size attribute is the client's, not the handler's"
    );
    assert!(calls.iter().any(|c| c.body == b"plain"));
    eventually(SECS(10), "the object deleted", || async {
        s3.head_object()
            .bucket(&b)
            .key("orders/1.json")
            .send()
            .await
            .is_err()
    })
    .await;
    w.stop().await;
}

/// An object that does not exist is poison: no handler call, and the pointer (as sent) goes to the
/// DLQ with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_object_is_poison_and_the_pointer_reaches_the_dlq() {
    let q = TestQueue::new("s3-missing", 30, 3, false).await;
    let s3 = s3().await;
    let b = bucket(&s3).await;
    send_pointer(&q, &b, "gone.json", 400_000).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w = Worker::start(&q.args(&["--http-url", &h.url, "--s3-payloads"]));
    eventually(SECS(30), "dead-lettered", || async {
        q.dlq_visible().await == 1
    })
    .await;
    assert!(h.calls().is_empty(), "the handler never saw the pointer");
    let got = drain_dlq(&q).await;
    assert_eq!(got.len(), 1);
    let (body, attrs, _) = &got[0];
    assert!(body.contains(CLASS) && body.contains("gone.json"), "{body}");
    let reason = attrs.get("qc-poison-reason").cloned().unwrap_or_default();
    assert!(reason.contains("does not exist"), "{attrs:?}");
    w.stop().await;
}

/// S3 unreachable (its endpoint refuses connections): a retry, never a handler call with the
/// pointer, and the message stays on the queue (not in the DLQ).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_unreachable_is_a_retry_not_a_call_or_poison() {
    let q = TestQueue::new("s3-down", 30, 10, false).await;
    send_pointer(&q, "somebucket", "k.json", 400_000).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    // SQS through moto, S3 at a port nobody listens on.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let args = q.args(&[
        "--http-url",
        &h.url,
        "--s3-payloads",
        "--retry-base",
        "1s",
        "--retry-max",
        "1s",
    ]);
    let mut cut = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--endpoint-url" {
            it.next();
        } else {
            cut.push(a);
        }
    }
    let mut w = Worker::start_with_env(
        std::sync::Arc::new(tempfile::tempdir().unwrap()),
        &cut,
        &[
            ("AWS_ENDPOINT_URL_SQS", &common::sqs_endpoint()),
            ("AWS_ENDPOINT_URL_S3", &dead),
            ("AWS_MAX_ATTEMPTS", "1"),
        ],
    );
    eventually(SECS(30), "two failed fetches", || async {
        w.metric("qc_worker_messages_processed_total{outcome=\"transient\"}")
            .await
            .unwrap_or(0.0)
            >= 2.0
    })
    .await;
    assert!(h.calls().is_empty(), "no call without the payload");
    assert_eq!(q.dlq_visible().await, 0);
    let (visible, in_flight, _) = q.counts().await;
    assert_eq!(visible + in_flight, 1, "the message stays on the queue");
    w.stop().await;
}
