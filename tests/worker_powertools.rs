//! #48 against moto with the real `qc-worker`: `--schema-file` (handler.schema) and `--filter`
//! (spec.filter.patterns) decide before any handler call; what they let through is handled as usual.

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::time::Duration;

use support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;

const ORDER_SCHEMA: &str = r#"{
    "type": "object",
    "required": ["orderId", "amount"],
    "properties": {"orderId": {"type": "string"}, "amount": {"type": "number", "minimum": 0}}
}"#;

/// Every body the handler saw, from single calls and from batch calls (a JSON array of
/// structured CloudEvents whose `data` is the body).
fn bodies_seen(h: &HttpHandler) -> Vec<String> {
    let mut out = Vec::new();
    for c in h.calls() {
        let text = String::from_utf8_lossy(&c.body).to_string();
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Array(events)) => {
                for e in events {
                    let data = e.get("data").cloned().unwrap_or_default();
                    out.push(match data {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    });
                }
            }
            _ => out.push(text),
        }
    }
    out
}

/// The orderId of each body (JSON; a batch call re-encodes the JSON it carries), or the body itself.
fn order_ids(bodies: &[String]) -> Vec<String> {
    bodies
        .iter()
        .map(|b| {
            serde_json::from_str::<serde_json::Value>(b)
                .ok()
                .and_then(|v| v.get("orderId")?.as_str().map(str::to_string))
                .unwrap_or_else(|| b.clone())
        })
        .collect()
}

/// A body that is not JSON or does not match the schema reaches the DLQ with the first validation
/// error as its reason and never the handler; valid ones are handled once. In single and in batch mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_fail_the_schema_are_dead_lettered_with_the_reason_before_any_call() {
    for batch in [false, true] {
        let q = TestQueue::new("schema", 30, 3, false).await;
        let dir = tempfile::tempdir().unwrap();
        let schema = dir.path().join("schema.json");
        std::fs::write(&schema, ORDER_SCHEMA).unwrap();
        let good = [
            r#"{"orderId":"o-1","amount":1}"#,
            r#"{"orderId":"o-2","amount":0}"#,
            r#"{"orderId":"o-3","amount":2.5}"#,
        ];
        for b in good {
            q.send_one(b).await;
        }
        q.send_one(r#"{"amount":1}"#).await;
        q.send_one(r#"{"orderId":"o-9","amount":-4}"#).await;
        q.send_one("not json").await;
        let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
        let mut extra = vec![
            "--schema-file",
            schema.to_str().unwrap(),
            "--http-url",
            &h.url,
        ];
        if batch {
            extra.extend(["--batch-max-items", "10", "--batch-max-wait", "200ms"]);
        }
        let mut w = Worker::start(&q.args(&extra));
        eventually(SECS(30), "the source drained", || q.is_empty()).await;
        eventually(SECS(30), "three in the DLQ", || async {
            q.dlq_visible().await == 3
        })
        .await;
        assert_eq!(
            w.metric("qc_worker_messages_processed_total{outcome=\"poison\"}")
                .await,
            Some(3.0),
            "batch {batch}"
        );
        w.stop().await;

        let mut seen = order_ids(&bodies_seen(&h));
        seen.sort();
        assert_eq!(
            seen,
            ["o-1", "o-2", "o-3"],
            "batch {batch}: only valid bodies, once each"
        );
        let mut dlq = drain_dlq(&q).await;
        dlq.sort_by(|a, b| a.0.cmp(&b.0));
        let reasons: Vec<(String, String)> = dlq
            .iter()
            .map(|(body, attrs, _)| {
                (
                    body.clone(),
                    attrs.get("qc-poison-reason").cloned().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(reasons.len(), 3, "batch {batch}: {reasons:?}");
        let want = [
            (r#"{"amount":1}"#, ["at /:", "orderId"]),
            (
                r#"{"orderId":"o-9","amount":-4}"#,
                ["at /amount:", "minimum"],
            ),
            ("not json", ["not JSON", "handler.schema"]),
        ];
        for (body, needles) in want {
            let (_, reason) = reasons
                .iter()
                .find(|(b, _)| b == body)
                .unwrap_or_else(|| panic!("batch {batch}: {body} not in the DLQ: {reasons:?}"));
            for n in needles {
                assert!(
                    reason.contains(n),
                    "batch {batch}: {body}: {reason:?} lacks {n:?}"
                );
            }
        }
    }
}

/// A schema file that is missing, not JSON, or does not compile (a remote `$ref`, never fetched)
/// stops the worker at start, naming the flag and the file, before any receive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_that_cannot_be_used_stops_the_worker_before_any_receive() {
    let q = TestQueue::new("schema-bad", 30, 3, false).await;
    q.send_one(r#"{"orderId":"o-1","amount":1}"#).await;
    let dir = tempfile::tempdir().unwrap();
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let cases = [
        ("missing.json", None, "No such file"),
        ("broken.json", Some("{type: object"), "not JSON"),
        (
            "remote.json",
            Some(r#"{"$ref": "https://example.invalid/order.json"}"#),
            "does not compile",
        ),
    ];
    for (name, text, needle) in cases {
        let path = dir.path().join(name);
        if let Some(t) = text {
            std::fs::write(&path, t).unwrap();
        }
        let mut w = Worker::start(&q.args(&[
            "--schema-file",
            path.to_str().unwrap(),
            "--http-url",
            &h.url,
        ]));
        let status = w.wait_exit(SECS(20)).await;
        assert!(!status.success(), "{name}: {status:?}");
        let log = w.log_text();
        assert!(log.contains("--schema-file"), "{name}: {log}");
        assert!(log.contains(name), "{name}: {log}");
        assert!(log.contains(needle), "{name}: {log}");
    }
    assert!(h.calls().is_empty());
    let (visible, in_flight, _) = q.counts().await;
    assert_eq!((visible, in_flight), (1, 0), "never received");
}

async fn send_with_attribute(q: &TestQueue, body: &str, name: &str, value: &str) {
    q.client
        .send_message()
        .queue_url(&q.url)
        .message_body(body)
        .message_attributes(
            name,
            aws_sdk_sqs::types::MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
}

/// Two patterns (OR): orders by body, anything marked high priority by attribute. What matches
/// neither (refunds, a plain-text body) is deleted without a call, counted, logged at debug; what
/// matches one is handled once. In single and in batch mode. Nothing reaches the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_no_pattern_matches_are_deleted_without_a_call_and_counted() {
    for batch in [false, true] {
        let q = TestQueue::new("filter", 30, 3, false).await;
        for i in 0..4 {
            q.send_one(&format!(r#"{{"type":"order","orderId":"o-{i}"}}"#))
                .await;
        }
        for i in 0..3 {
            q.send_one(&format!(r#"{{"type":"refund","orderId":"r-{i}"}}"#))
                .await;
        }
        q.send_one("type=order").await;
        send_with_attribute(
            &q,
            r#"{"type":"refund","orderId":"r-high"}"#,
            "priority",
            "high",
        )
        .await;
        send_with_attribute(
            &q,
            r#"{"type":"refund","orderId":"r-low"}"#,
            "priority",
            "low",
        )
        .await;
        let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
        let mut extra = vec![
            "--filter",
            r#"{"body": {"type": ["order"]}}"#,
            "--filter",
            r#"{"messageAttributes": {"priority": {"stringValue": ["high"]}}}"#,
            "--http-url",
            &h.url,
        ];
        if batch {
            extra.extend(["--batch-max-items", "10", "--batch-max-wait", "200ms"]);
        }
        let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
        let mut w = Worker::start_with_env(dir, &q.args(&extra), &[("RUST_LOG", "qc=debug")]);
        eventually(SECS(30), "the source drained", || q.is_empty()).await;
        eventually(SECS(10), "five filtered", || async {
            w.metric("qc_worker_messages_filtered_total").await == Some(5.0)
        })
        .await;
        assert_eq!(
            w.metric("qc_worker_messages_processed_total{outcome=\"success\"}")
                .await,
            Some(5.0),
            "batch {batch}"
        );
        w.stop().await;
        let mut seen = order_ids(&bodies_seen(&h));
        seen.sort();
        assert_eq!(
            seen,
            ["o-0", "o-1", "o-2", "o-3", "r-high"],
            "batch {batch}: the matching ones, once each"
        );
        assert_eq!(q.dlq_visible().await, 0);
        let logged = w.log_lines(
            "no filter pattern matches the message; deleting it without calling the handler",
        );
        assert_eq!(logged.len(), 5, "batch {batch}");
        assert!(logged.iter().all(|l| l["level"] == "DEBUG"), "{logged:?}");
    }
}

/// A filter error never deletes: a body the filter cannot read (nested deeper than the JSON parser
/// goes) is handed to the handler, and a matching message the handler fails is retried, not deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_filter_cannot_read_is_handled_never_deleted_unread() {
    let q = TestQueue::new("filter-safe", 30, 3, false).await;
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    q.send_one(&deep).await;
    q.send_one(r#"{"type":"order","orderId":"fails-once"}"#)
        .await;
    let h = HttpHandler::start(|c| {
        if c.receive_count == 1 && String::from_utf8_lossy(&c.body).contains("fails-once") {
            Reply::status(500)
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    let mut w = Worker::start(&q.args(&[
        "--filter",
        r#"{"body": {"type": ["order"]}}"#,
        "--retry-base",
        "1s",
        "--http-url",
        &h.url,
    ]));
    eventually(SECS(30), "the source drained", || q.is_empty()).await;
    assert_eq!(
        w.metric("qc_worker_messages_filtered_total").await,
        Some(0.0)
    );
    w.stop().await;
    let bodies: Vec<String> = h
        .calls()
        .iter()
        .map(|c| String::from_utf8_lossy(&c.body).to_string())
        .collect();
    assert_eq!(
        bodies.iter().filter(|b| **b == deep).count(),
        1,
        "the deep body handled once"
    );
    assert_eq!(
        bodies.iter().filter(|b| b.contains("fails-once")).count(),
        2,
        "failed, retried, handled"
    );
    assert!(
        !w.log_lines(
            "the filter cannot read the message; handing it to the handler rather than deleting it"
        )
        .is_empty()
    );
}

/// The DynamoDB store compares payloads: a key reused for a different body is poison with the
/// reason (to the DLQ), while a true duplicate (same key, same body) is deleted as one. Beside it, a
/// slow call has its claim renewed (UpdateItem) and a failed one gives its claim back (DeleteItem)
/// and is handled on its next delivery: every call the worker makes to the table, against moto.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_store_a_reused_key_with_another_payload_is_poison_with_a_reason() {
    // A 3s visibility timeout: heartbeats, and so claim renewals, every second.
    let q = TestQueue::new("ddb-hash", 3, 5, false).await;
    let table = common::dynamodb_table(&common::dynamodb_endpoint(), "id").await;
    let h = HttpHandler::start(|c| {
        let body = String::from_utf8_lossy(&c.body).to_string();
        if body.contains("fails-once") && c.receive_count == 1 {
            Reply::status(500)
        } else if body.contains("slow") {
            Reply::ok(Duration::from_millis(2500))
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    let mut w = Worker::start(&q.args(&[
        "--idempotency-store",
        "dynamodb",
        "--dynamodb-table",
        &table,
        "--idempotency-key",
        "jsonPointer:/orderId",
        "--retry-base",
        "1s",
        "--http-url",
        &h.url,
    ]));
    q.send_one(r#"{"orderId":"o-1","amount":1}"#).await;
    q.send_one(r#"{"orderId":"o-slow","slow":true}"#).await;
    q.send_one(r#"{"orderId":"o-f","fails-once":true}"#).await;
    eventually(SECS(30), "the first three handled", || async {
        h.finished_calls() == 4 && q.is_empty().await
    })
    .await;
    q.send_one(r#"{"orderId":"o-1","amount":1}"#).await;
    q.send_one(r#"{"orderId":"o-1","amount":2}"#).await;
    eventually(SECS(30), "the source drained", || q.is_empty()).await;
    eventually(SECS(30), "one in the DLQ", || async {
        q.dlq_visible().await == 1
    })
    .await;
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"duplicate\"}")
            .await,
        Some(1.0)
    );
    w.stop().await;
    let calls = calls_by_order(&h);
    assert_eq!(calls.get("o-1"), Some(&1), "{calls:?}");
    assert_eq!(calls.get("o-slow"), Some(&1), "{calls:?}");
    assert_eq!(
        calls.get("o-f"),
        Some(&2),
        "failed, then handled: {calls:?}"
    );
    let dlq = drain_dlq(&q).await;
    assert_eq!(dlq[0].0, r#"{"orderId":"o-1","amount":2}"#);
    let reason = dlq[0]
        .1
        .get("qc-poison-reason")
        .cloned()
        .unwrap_or_default();
    assert!(
        reason.contains("o-1") && reason.contains("another payload"),
        "{reason}"
    );
}

/// DynamoDB's answers lost mid-claim (the conditional write lands, the worker never hears): no
/// message is deleted without a call, none is handled twice. The claims count as a store outage
/// (retried, receiving paused); when answers flow again, the marks left behind are waited out and
/// each message is handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_answers_lost_mid_claim_neither_delete_nor_double_handle() {
    // A 3s visibility timeout: a receive in flight when the proxy switches is cut, and its messages
    // come back soon.
    let q = TestQueue::new("ddb-lost", 3, 10, false).await;
    let table = common::dynamodb_table(&common::dynamodb_endpoint(), "id").await;
    let proxy = FaultProxy::start().await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let mut w = Worker::start_with_env(
        dir,
        &q.args_via(
            &proxy.endpoint,
            &[
                "--idempotency-store",
                "dynamodb",
                "--dynamodb-table",
                &table,
                "--idempotency-key",
                "jsonPointer:/orderId",
                "--timeout",
                "2s",
                "--retry-base",
                "1s",
                "--http-url",
                &h.url,
            ],
        ),
        &[],
    );
    w.wait_ready(SECS(30)).await;
    proxy.set(Fault::DropDynamoDbAnswers).await;
    let bodies: Vec<String> = (0..5)
        .map(|i| format!(r#"{{"orderId":"o-{i}"}}"#))
        .collect();
    q.send_all(&bodies, |_| String::new()).await;
    eventually(SECS(30), "claims failed: unready", || async {
        matches!(w.get("/readyz").await, Some((503, _)))
    })
    .await;
    assert!(h.calls().is_empty(), "no call without an answered claim");
    let (visible, in_flight, _) = q.counts().await;
    assert_eq!(visible + in_flight, 5, "nothing deleted");
    proxy.set(Fault::Forward).await;
    eventually(SECS(90), "the source drained", || q.is_empty()).await;
    w.stop().await;
    h.assert_each_handled_once(&bodies);
    assert_eq!(q.dlq_visible().await, 0);
}
