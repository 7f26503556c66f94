//! DLQ triage against a real SQS server (moto) and real processes: `qc-operator dlq` counts exactly
//! what the worker dead-lettered, by reason, and consumes nothing; `qc-operator redrive --reason`
//! moves only the chosen reason (and `--dry-run` nothing); forged attributes never move a message
//! into another queue; a flaky network (failed release, failed delete, failed send) duplicates at
//! worst, never loses.

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use qc::aws::redrive::{REASON_ATTRIBUTE, SOURCE_ATTRIBUTE};
use support::*;

fn string_attr(v: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(v)
        .build()
        .unwrap()
}

/// Send `body` straight to `dlq` as the worker's dead-letter send does: `qc-source-arn` = `source`
/// and `qc-poison-reason` = `reason` (each when given).
async fn to_dlq(
    sqs: &aws_sdk_sqs::Client,
    dlq: &str,
    body: &str,
    source: Option<&str>,
    reason: Option<&str>,
) {
    let mut req = sqs.send_message().queue_url(dlq).message_body(body);
    if let Some(s) = source {
        req = req.message_attributes(SOURCE_ATTRIBUTE, string_attr(s));
    }
    if let Some(r) = reason {
        req = req.message_attributes(REASON_ATTRIBUTE, string_attr(r));
    }
    req.send().await.unwrap();
}

/// (visible, in flight) of `url`.
async fn count(sqs: &aws_sdk_sqs::Client, url: &str) -> (u64, u64) {
    let a = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap();
    let n = |k: QueueAttributeName| a.get(&k).unwrap().parse::<u64>().unwrap();
    (
        n(QueueAttributeName::ApproximateNumberOfMessages),
        n(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    )
}

/// Every message of `url` (body → receive count), deleting as it goes (bounded).
async fn drain(sqs: &aws_sdk_sqs::Client, url: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut empty = 0;
    for _ in 0..50 {
        let got = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(60)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
        if got.is_empty() {
            empty += 1;
            if empty == 2 {
                break;
            }
            continue;
        }
        for m in &got {
            let rc = m
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let prev = out.insert(m.body().unwrap().to_string(), rc);
            assert!(prev.is_none(), "{:?} received twice", m.body());
            sqs.delete_message()
                .queue_url(url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
    out
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `qc-operator dlq --queue-url URL --output json` against `endpoint`: the summary's reason counts.
fn summary(url: &str, endpoint: &str) -> serde_json::Value {
    let (code, stdout, stderr) = cli(&[
        "dlq",
        "--queue-url",
        url,
        "--endpoint-url",
        endpoint,
        "--region",
        "us-east-1",
        "--output",
        "json",
    ]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn by_reason(doc: &serde_json::Value) -> BTreeMap<String, u64> {
    doc["summary"]["byReason"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["key"].as_str().unwrap().to_string(),
                c["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The real worker dead-letters 5 messages its handler answered 422 and 3 it answered 400; the
/// redrive policy's kind (no reason) is added as 2 marked sends. The summary counts them exactly,
/// twice in a row, and after it every message is still in the DLQ and visible: nothing consumed.
/// Each peek added one to the DLQ receive count (the documented cost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_counts_what_the_worker_dead_lettered_exactly_and_consumes_nothing() {
    let q = TestQueue::new("triage", 30, 5, false).await;
    let h = HttpHandler::start(|c| {
        if c.body.starts_with(b"bad422") {
            Reply::status(422)
        } else if c.body.starts_with(b"bad400") {
            Reply::status(400)
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    let mut bodies: Vec<String> = (0..5).map(|i| format!("bad422-{i}")).collect();
    bodies.extend((0..3).map(|i| format!("bad400-{i}")));
    bodies.extend((0..4).map(|i| format!("good-{i}")));
    q.send_all(&bodies, |_| String::new()).await;
    let mut w = Worker::start(&q.args(&["--http-url", &h.url]));
    eventually(Duration::from_mins(1), "source queue empty", || {
        q.is_empty()
    })
    .await;
    w.stop().await;
    let source_arn = common::queue_arn(&q.client, &q.url).await;
    for i in 0..2 {
        to_dlq(
            &q.client,
            &q.dlq_url,
            &format!("policy-{i}"),
            Some(&source_arn),
            None,
        )
        .await;
    }
    assert_eq!(count(&q.client, &q.dlq_url).await, (10, 0));

    let endpoint = common::sqs_endpoint();
    for _ in 0..2 {
        let doc = summary(&q.url, &endpoint);
        assert_eq!(doc["summary"]["total"], 10, "{doc}");
        assert_eq!(doc["complete"], true, "{doc}");
        assert_eq!(doc["notReleased"], 0, "{doc}");
        assert_eq!(
            by_reason(&doc),
            BTreeMap::from([
                ("handler answered HTTP 422".to_string(), 5),
                ("handler answered HTTP 400".to_string(), 3),
                ("(none)".to_string(), 2),
            ]),
            "{doc}"
        );
        assert_eq!(doc["summary"]["bySource"][0]["key"], source_arn.as_str());
        assert_eq!(doc["summary"]["bySource"][0]["count"], 10);
        assert_eq!(doc["summary"]["ages"]["under1h"], 10);
        assert_eq!(
            count(&q.client, &q.dlq_url).await,
            (10, 0),
            "released at once: all visible, none in flight, none deleted"
        );
    }
    // The text form says what it cost.
    let (code, text, _) = cli(&["dlq", "--queue-url", &q.url, "--endpoint-url", &endpoint]);
    assert_eq!(code, 0);
    assert!(text.contains("10 message(s) peeked"), "{text}");
    assert!(text.contains("nothing was consumed"), "{text}");
    let left = drain(&q.client, &q.dlq_url).await;
    assert_eq!(left.len(), 10, "{left:?}");
    assert!(
        left.values().all(|rc| *rc == 4),
        "three peeks and this receive, one each: {left:?}"
    );
}

/// A DLQ of our queue alone with three reasons. `--dry-run --reason A` lists the 4 of A and moves
/// nothing; `--reason A` moves exactly them; the others are visible again at once, still in the DLQ.
#[tokio::test]
async fn a_selective_redrive_moves_only_the_chosen_reason_and_a_dry_run_nothing() {
    let q = TestQueue::new("selrd", 30, 5, false).await;
    let arn = common::queue_arn(&q.client, &q.url).await;
    for i in 0..4 {
        to_dlq(
            &q.client,
            &q.dlq_url,
            &format!("a-{i}"),
            Some(&arn),
            Some("handler answered HTTP 422"),
        )
        .await;
    }
    for i in 0..3 {
        to_dlq(
            &q.client,
            &q.dlq_url,
            &format!("b-{i}"),
            Some(&arn),
            Some("S3 payload missing"),
        )
        .await;
    }
    for i in 0..2 {
        to_dlq(&q.client, &q.dlq_url, &format!("n-{i}"), Some(&arn), None).await;
    }
    let endpoint = common::sqs_endpoint();
    let base = [
        "redrive",
        "--queue-url",
        &q.url,
        "--endpoint-url",
        &endpoint,
        "--rate",
        "1000",
        "--reason",
        "handler answered HTTP 422",
    ];
    let mut dry = base.to_vec();
    dry.push("--dry-run");
    let (code, out, err) = cli(&dry);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("dry run: would move 4 message(s)"), "{out}");
    assert!(
        out.contains("5 of this queue not selected, 0 of other source queues"),
        "{out}"
    );
    assert_eq!(
        out.matches("reason handler answered HTTP 422").count(),
        4,
        "{out}"
    );
    assert_eq!(
        count(&q.client, &q.dlq_url).await,
        (9, 0),
        "a dry run moves nothing"
    );
    assert_eq!(count(&q.client, &q.url).await, (0, 0));

    let (code, out, err) = cli(&base);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("moved 4 message(s)"), "{out}");
    assert!(
        out.contains("(5 message(s) not selected left in it)"),
        "{out}"
    );
    assert_eq!(
        count(&q.client, &q.dlq_url).await,
        (5, 0),
        "the rest are visible again at once"
    );
    let back: Vec<String> = drain(&q.client, &q.url).await.into_keys().collect();
    assert_eq!(back, ["a-0", "a-1", "a-2", "a-3"]);

    // (none) selects the redrive policy's kind; two reasons may be given.
    let (code, out, err) = cli(&[
        "redrive",
        "--queue-url",
        &q.url,
        "--endpoint-url",
        &endpoint,
        "--rate",
        "1000",
        "--reason",
        "(none)",
        "--reason",
        "S3 payload missing",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("moved 5 message(s)"), "{out}");
    assert_eq!(count(&q.client, &q.dlq_url).await, (0, 0));
}

/// `--older-than` selects by SentTimestamp: of messages sent before and after a pause, only the
/// earlier ones move.
#[tokio::test]
async fn a_time_window_moves_only_messages_sent_within_it() {
    let q = TestQueue::new("winrd", 30, 5, false).await;
    let arn = common::queue_arn(&q.client, &q.url).await;
    for i in 0..3 {
        to_dlq(
            &q.client,
            &q.dlq_url,
            &format!("old-{i}"),
            Some(&arn),
            Some("r"),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    for i in 0..2 {
        to_dlq(
            &q.client,
            &q.dlq_url,
            &format!("new-{i}"),
            Some(&arn),
            Some("r"),
        )
        .await;
    }
    let endpoint = common::sqs_endpoint();
    let (code, out, err) = cli(&[
        "redrive",
        "--queue-url",
        &q.url,
        "--endpoint-url",
        &endpoint,
        "--rate",
        "1000",
        "--older-than",
        "3s",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("moved 3 message(s)"), "{out}");
    let back: Vec<String> = drain(&q.client, &q.url).await.into_keys().collect();
    assert_eq!(back, ["old-0", "old-1", "old-2"]);
    assert_eq!(count(&q.client, &q.dlq_url).await, (2, 0));

    // An impossible window is refused, naming the flags.
    let (code, _, err) = cli(&[
        "redrive",
        "--queue-url",
        &q.url,
        "--newer-than",
        "1m",
        "--older-than",
        "1h",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--newer-than") && err.contains("widen"),
        "{err}"
    );
    // Selection without --queue-url says what it needs.
    let (code, _, err) = cli(&["redrive", "shop/orders", "--reason", "x"]);
    assert_eq!(code, 2);
    assert!(err.contains("--queue-url"), "{err}");
}

/// Anyone who can send to the DLQ can write any attribute. A message whose (forged) source is
/// another tenant's queue is never moved, neither to that queue nor to ours, whatever its reason; a
/// forged reason is shown escaped (never a terminal escape sequence) and a binary one as
/// `(not a string)`.
#[tokio::test]
async fn forged_attributes_never_move_a_message_across_queues_and_are_printed_escaped() {
    let sqs = common::sqs_client().await;
    let dlq = common::create_queue(&sqs, &common::unique_name("fdlq"), &[]).await;
    let dlq_arn = common::queue_arn(&sqs, &dlq).await;
    let policy = vec![(
        QueueAttributeName::RedrivePolicy,
        format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"3"}}"#),
    )];
    let ours = common::create_queue(&sqs, &common::unique_name("fours"), &policy).await;
    let theirs = common::create_queue(&sqs, &common::unique_name("ftheirs"), &policy).await;
    let ours_arn = common::queue_arn(&sqs, &ours).await;
    let theirs_arn = common::queue_arn(&sqs, &theirs).await;
    let reason = "handler answered HTTP 422";
    to_dlq(&sqs, &dlq, "ours", Some(&ours_arn), Some(reason)).await;
    to_dlq(&sqs, &dlq, "theirs", Some(&theirs_arn), Some(reason)).await;
    to_dlq(
        &sqs,
        &dlq,
        "other-account",
        Some("arn:aws:sqs:us-east-1:999999999999:victim"),
        Some(reason),
    )
    .await;
    to_dlq(&sqs, &dlq, "unmarked", None, Some(reason)).await;
    to_dlq(
        &sqs,
        &dlq,
        "escape",
        Some(&ours_arn),
        Some("x\u{1b}]0;pwned\u{7}\u{1b}[2J"),
    )
    .await;
    sqs.send_message()
        .queue_url(&dlq)
        .message_body("binary")
        .message_attributes(SOURCE_ATTRIBUTE, string_attr(&ours_arn))
        .message_attributes(
            REASON_ATTRIBUTE,
            MessageAttributeValue::builder()
                .data_type("Binary")
                .binary_value(Blob::new(vec![0x1b, b'[', b'2', b'J']))
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();

    let endpoint = common::sqs_endpoint();
    let (code, text, err) = cli(&["dlq", "--queue-url", &ours, "--endpoint-url", &endpoint]);
    assert_eq!(code, 0, "{text}{err}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert!(text.contains("x\\u{1b}]0;pwned\\u{7}\\u{1b}[2J"), "{text}");
    assert!(text.contains("(not a string)"), "{text}");
    assert!(text.contains("6 message(s) peeked"), "{text}");
    assert!(
        text.contains(&theirs_arn),
        "the summary names each source: {text}"
    );

    let (code, out, err) = cli(&[
        "redrive",
        "--queue-url",
        &ours,
        "--endpoint-url",
        &endpoint,
        "--rate",
        "1000",
        "--reason",
        reason,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("moved 1 message(s)"), "{out}");
    let back: Vec<String> = drain(&sqs, &ours).await.into_keys().collect();
    assert_eq!(back, ["ours"]);
    assert!(
        drain(&sqs, &theirs).await.is_empty(),
        "nothing reaches another queue"
    );
    // Everything else is still in the DLQ (the other sources' messages held for the move's receive
    // visibility, the unselected ones visible again).
    let (visible, in_flight) = count(&sqs, &dlq).await;
    assert_eq!(visible + in_flight, 5, "({visible}, {in_flight})");
}

/// A client for moto through `proxy`.
async fn client_via(proxy: &FaultProxy) -> aws_sdk_sqs::Client {
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&proxy.endpoint)).await;
    qc::aws::operator_sqs(aws_sdk_sqs::Client::new(&conf))
}

/// A flaky network under each step: the release of a peek fails (the messages stay in the DLQ,
/// hidden for the peek's 30 s: nothing deleted); the delete of a selective redrive fails (sent
/// messages stay in the DLQ too: a duplicate, never a loss); the send fails (nothing deleted,
/// nothing moved).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_network_duplicates_at_worst_and_never_loses() {
    let proxy = FaultProxy::start().await;
    let via = client_via(&proxy).await;

    // Release fails.
    let q = TestQueue::new("flaky1", 30, 5, false).await;
    let arn = common::queue_arn(&q.client, &q.url).await;
    for i in 0..4 {
        to_dlq(
            &q.client,
            &q.dlq_url,
            &format!("m-{i}"),
            Some(&arn),
            Some("r"),
        )
        .await;
    }
    proxy
        .set(Fault::FailAction(
            "ChangeMessageVisibility",
            500,
            "InternalError",
        ))
        .await;
    let (_, peek) = qc::aws::triage::peek_source(&via, &q.url, 100)
        .await
        .unwrap();
    assert_eq!(peek.messages.len(), 4);
    assert_eq!(peek.not_released, 4);
    assert_eq!(
        count(&q.client, &q.dlq_url).await,
        (0, 4),
        "hidden for the peek's short visibility, never deleted"
    );

    // Delete fails: sent, and still in the DLQ.
    proxy
        .set(Fault::FailAction("DeleteMessage", 500, "InternalError"))
        .await;
    let q = TestQueue::new("flaky2", 30, 5, false).await;
    let arn = common::queue_arn(&q.client, &q.url).await;
    for i in 0..3 {
        to_dlq(
            &q.client,
            &q.dlq_url,
            &format!("a-{i}"),
            Some(&arn),
            Some("A"),
        )
        .await;
    }
    to_dlq(&q.client, &q.dlq_url, "b-0", Some(&arn), Some("B")).await;
    let select = qc::triage::Selector {
        reasons: vec!["A".into()],
        ..Default::default()
    };
    let done = qc::aws::redrive::redrive_selected(&via, &q.url, None, 1000, "t", &select)
        .await
        .unwrap();
    assert_eq!((done.moved, done.not_selected), (3, 1), "{done:?}");
    let (visible, in_flight) = count(&q.client, &q.dlq_url).await;
    assert_eq!(
        (visible, visible + in_flight),
        (1, 4),
        "B released at once; the three sent but not deleted stay"
    );
    let back: Vec<String> = drain(&q.client, &q.url).await.into_keys().collect();
    assert_eq!(back, ["a-0", "a-1", "a-2"]);

    // Send fails: nothing deleted, nothing moved, all visible again at once except none hidden.
    proxy
        .set(Fault::FailAction("SendMessage", 500, "InternalError"))
        .await;
    let q = TestQueue::new("flaky3", 30, 5, false).await;
    let arn = common::queue_arn(&q.client, &q.url).await;
    for i in 0..3 {
        to_dlq(
            &q.client,
            &q.dlq_url,
            &format!("a-{i}"),
            Some(&arn),
            Some("A"),
        )
        .await;
    }
    to_dlq(&q.client, &q.dlq_url, "b-0", Some(&arn), Some("B")).await;
    let err = qc::aws::redrive::redrive_selected(&via, &q.url, None, 1000, "t", &select)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("SendMessageBatch"), "{err}");
    let (visible, in_flight) = count(&q.client, &q.dlq_url).await;
    assert_eq!(visible + in_flight, 4, "({visible}, {in_flight})");
    assert_eq!(
        visible, 1,
        "the unselected one is released even when the move fails"
    );
    assert!(drain(&q.client, &q.url).await.is_empty());
    proxy.set(Fault::Forward).await;
}
