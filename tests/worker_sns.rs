//! `--unwrap-sns` (#32 item 2) against moto: a real SNS topic with a real SQS subscription (raw
//! message delivery off), so the envelopes are the ones SNS writes, not ones the test made up.

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::time::Duration;

use aws_sdk_sns::types::MessageAttributeValue;
use support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// A topic that delivers to `q` through an SQS subscription (not raw: SNS wraps every message).
async fn topic_for(q: &TestQueue) -> (aws_sdk_sns::Client, String) {
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&common::sqs_endpoint())).await;
    let sns = aws_sdk_sns::Client::new(&conf);
    let topic = sns
        .create_topic()
        .name(common::unique_name("orders"))
        .send()
        .await
        .unwrap()
        .topic_arn
        .unwrap();
    sns.subscribe()
        .topic_arn(&topic)
        .protocol("sqs")
        .endpoint(common::queue_arn(&q.client, &q.url).await)
        .send()
        .await
        .unwrap();
    (sns, topic)
}

async fn publish(sns: &aws_sdk_sns::Client, topic: &str, body: &str, tenant: &str) {
    sns.publish()
        .topic_arn(topic)
        .message(body)
        .message_attributes(
            "tenant",
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(tenant)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
}

/// `auto`: each notification reaches the handler as what was published (body and attributes); a
/// message sent to the queue directly, not through the topic, reaches it as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_reach_the_handler_unwrapped_and_other_messages_as_sent() {
    let q = TestQueue::new("sns-auto", 30, 3, false).await;
    let (sns, topic) = topic_for(&q).await;
    for i in 0..3 {
        publish(
            &sns,
            &topic,
            &format!("{{\"orderId\":\"o-{i}\"}}"),
            &format!("t-{i}"),
        )
        .await;
    }
    q.send_one(r#"{"orderId":"direct"}"#).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w = Worker::start(&q.args(&["--unwrap-sns", "auto", "--http-url", &h.url]));
    eventually(SECS(30), "four handled", || async {
        h.finished_calls() == 4
    })
    .await;
    eventually(SECS(30), "the queue drained", || q.is_empty()).await;

    let bodies: Vec<String> = h.counts_by_body().into_keys().collect();
    for want in [
        r#"{"orderId":"o-0"}"#,
        r#"{"orderId":"o-1"}"#,
        r#"{"orderId":"o-2"}"#,
        r#"{"orderId":"direct"}"#,
    ] {
        assert!(bodies.iter().any(|b| b == want), "{want} among {bodies:?}");
    }
    for c in h.calls() {
        let body = String::from_utf8_lossy(&c.body).to_string();
        assert!(
            !body.contains("TopicArn"),
            "an envelope reached the handler: {body}"
        );
        if let Some(i) = body.strip_prefix(r#"{"orderId":"o-"#) {
            let i = &i[..1];
            assert_eq!(
                c.headers.get("x-sqs-attribute-tenant").map(String::as_str),
                Some(format!("t-{i}").as_str()),
                "the notification's attribute, as a message attribute"
            );
        }
    }
    assert_eq!(q.dlq_visible().await, 0);
    w.stop().await;
}

/// `on`: every message must be a notification. One that is not (sent to the queue directly) is
/// poison: it reaches the DLQ as it was, with the reason, and never the handler; the notification
/// beside it is handled unwrapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_unwrap_on_a_message_that_is_no_notification_is_dead_lettered_with_the_reason() {
    let q = TestQueue::new("sns-on", 30, 3, false).await;
    let (sns, topic) = topic_for(&q).await;
    publish(&sns, &topic, "published", "acme").await;
    q.send_one("not an envelope").await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w = Worker::start(&q.args(&["--unwrap-sns", "on", "--http-url", &h.url]));
    eventually(SECS(30), "the source drained", || q.is_empty()).await;
    eventually(SECS(30), "one in the DLQ", || async {
        q.dlq_visible().await == 1
    })
    .await;
    w.stop().await;

    let calls = h.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].body, b"published");
    let dlq = drain_dlq(&q).await;
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    let (body, attrs, _) = &dlq[0];
    assert_eq!(body, "not an envelope");
    let reason = attrs.get("qc-poison-reason").expect("a reason");
    assert!(reason.contains("not an SNS notification"), "{reason}");
}

/// #40: a notification whose attribute holds a NUL byte cannot be handed to an exec handler (no
/// process environment carries one). That is the message's fault: poison, to the DLQ with the
/// reason, and the outage breaker never hears of it. Before, the failed process start counted as a
/// dependency failure: 20 such messages opened the breaker and 0 of the 60 normal ones beside them
/// were handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_byte_attributes_are_poison_and_never_stop_the_other_messages() {
    let q = TestQueue::new("sns-nul", 30, 3, false).await;
    let (sns, topic) = topic_for(&q).await;
    for i in 0..20 {
        publish(&sns, &topic, &format!("forged {i}"), "a\u{0}b").await;
    }
    for i in 0..60 {
        publish(&sns, &topic, &format!("normal {i}"), "acme").await;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let handler = script(
        dir.path(),
        "handle.sh",
        &format!("cat > {}/\"$QC_MESSAGE_ID\"", out.display()),
    );
    let handled = || {
        std::fs::read_dir(&out)
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .collect::<Vec<String>>()
    };
    let mut w = Worker::start(&q.args(&[
        "--unwrap-sns",
        "on",
        "--concurrency",
        "10",
        "--exec",
        "--",
        handler.to_str().unwrap(),
    ]));
    eventually(SECS(45), "the 60 normal messages handled", || async {
        handled().len() >= 60
    })
    .await;
    eventually(SECS(30), "the 20 forged ones in the DLQ", || async {
        q.dlq_visible().await == 20
    })
    .await;
    eventually(SECS(30), "the source drained", || q.is_empty()).await;
    let mut bodies = handled();
    bodies.sort();
    let mut want: Vec<String> = (0..60).map(|i| format!("normal {i}")).collect();
    want.sort();
    assert_eq!(bodies, want, "each normal message once, no forged one");
    assert_eq!(
        w.metric("qc_worker_breaker_transitions_total{to=\"open\"}")
            .await,
        Some(0.0),
        "the breaker never opened"
    );
    w.stop().await;
    let dlq = drain_dlq(&q).await;
    assert_eq!(dlq.len(), 20);
    for (body, attrs, _) in &dlq {
        assert!(body.contains("forged"), "{body}");
        let reason = attrs.get("qc-poison-reason").expect("a reason");
        assert!(
            reason.contains("tenant") && reason.contains("NUL"),
            "{reason}"
        );
    }
}
