//! DLQ redrive by receive → send → delete against a real SQS server (moto): every message back in the
//! source with its body, attributes, trace header and FIFO group order; the DLQ empty; `--max` bounds
//! the move; the CLI (`qc-operator redrive --queue-url`) prints how many it moved.

mod common;

use std::collections::BTreeMap;

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{
    MessageAttributeValue, MessageSystemAttributeName, MessageSystemAttributeNameForSends,
    MessageSystemAttributeValue, QueueAttributeName,
};
use std::sync::{Arc, Mutex};

use aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use qc::aws::redrive;

/// Bodies of the SendMessageBatch requests a client sent (what went on the wire).
#[derive(Debug, Clone, Default)]
struct SentBatches(Arc<Mutex<Vec<serde_json::Value>>>);

impl Intercept for SentBatches {
    fn name(&self) -> &'static str {
        "sent-batches"
    }

    fn read_before_transmit(
        &self,
        ctx: &BeforeTransmitInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_sqs::error::BoxError> {
        let req = ctx.request();
        if req.headers().get("x-amz-target") == Some("AmazonSQS.SendMessageBatch")
            && let Some(body) = req.body().bytes()
        {
            self.0.lock().unwrap().push(serde_json::from_slice(body)?);
        }
        Ok(())
    }
}

const TRACE: &str = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";

/// A source queue whose redrive policy sends a message to its DLQ after one receive.
async fn queues(fifo: bool) -> (aws_sdk_sqs::Client, String, String) {
    let sqs = common::sqs_client().await;
    let suffix = if fifo { ".fifo" } else { "" };
    let mut attrs = vec![];
    if fifo {
        attrs.push((QueueAttributeName::FifoQueue, "true".to_string()));
    }
    let dlq = common::create_queue(
        &sqs,
        &format!("{}{suffix}", common::unique_name("rdlq")),
        &attrs,
    )
    .await;
    let dlq_arn = common::queue_arn(&sqs, &dlq).await;
    attrs.push((
        QueueAttributeName::RedrivePolicy,
        format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"1"}}"#),
    ));
    let src = common::create_queue(
        &sqs,
        &format!("{}{suffix}", common::unique_name("rsrc")),
        &attrs,
    )
    .await;
    (sqs, src, dlq)
}

async fn count(sqs: &aws_sdk_sqs::Client, url: &str) -> (i64, i64) {
    let a = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap();
    let n = |k: QueueAttributeName| a.get(&k).unwrap().parse::<i64>().unwrap();
    (
        n(QueueAttributeName::ApproximateNumberOfMessages),
        n(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
    )
}

/// Send `n` messages to `url` (group `g{i % groups}` on FIFO), each with a string and a binary
/// attribute and an X-Ray header.
async fn send(sqs: &aws_sdk_sqs::Client, url: &str, n: usize, groups: usize) {
    for i in 0..n {
        let mut req = sqs
            .send_message()
            .queue_url(url)
            .message_body(format!("order {i} \"ünïcode\""))
            .message_attributes(
                "kind",
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(format!("k{i}"))
                    .build()
                    .unwrap(),
            )
            .message_attributes(
                "blob",
                MessageAttributeValue::builder()
                    .data_type("Binary")
                    .binary_value(Blob::new(vec![0u8, 255, i as u8]))
                    .build()
                    .unwrap(),
            )
            .message_system_attributes(
                MessageSystemAttributeNameForSends::AwsTraceHeader,
                MessageSystemAttributeValue::builder()
                    .data_type("String")
                    .string_value(TRACE)
                    .build()
                    .unwrap(),
            );
        if groups > 0 {
            req = req
                .message_group_id(format!("g{}", i % groups))
                .message_deduplication_id(format!("d{i}"));
        }
        req.send().await.unwrap();
    }
}

/// Send `n` messages to the source and receive them with visibility 0 until SQS (its redrive policy)
/// has moved all of them to the DLQ.
async fn dead_letter(sqs: &aws_sdk_sqs::Client, src: &str, dlq: &str, n: usize) {
    send(sqs, src, n, 0).await;
    receive_until_dead_lettered(sqs, src, dlq, i64::try_from(n).unwrap()).await;
}

/// Receives from `src` with visibility 0 (each receive counts towards its redrive policy) until the
/// DLQ holds `dlq_total` (bounded).
async fn receive_until_dead_lettered(
    sqs: &aws_sdk_sqs::Client,
    src: &str,
    dlq: &str,
    dlq_total: i64,
) {
    for _ in 0..50 {
        if count(sqs, dlq).await.0 == dlq_total {
            return;
        }
        sqs.receive_message()
            .queue_url(src)
            .max_number_of_messages(10)
            .visibility_timeout(0)
            .send()
            .await
            .unwrap();
    }
    panic!(
        "the messages did not reach the DLQ: {:?}",
        count(sqs, dlq).await
    );
}

/// Everything receivable from `url`, in receive order, deleting as it goes (bounded).
async fn drain(sqs: &aws_sdk_sqs::Client, url: &str) -> Vec<aws_sdk_sqs::types::Message> {
    let mut out = vec![];
    let mut empty = 0;
    for _ in 0..100 {
        let got = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(30)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
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
            sqs.delete_message()
                .queue_url(url)
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
        out.extend(got);
    }
    out
}

fn body_index(m: &aws_sdk_sqs::types::Message) -> usize {
    m.body()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn standard_dlq_of_25_goes_back_whole_with_attributes() {
    let (sqs, src, dlq) = queues(false).await;
    dead_letter(&sqs, &src, &dlq, 25).await;
    let sent = SentBatches::default();
    let watched =
        aws_sdk_sqs::Client::from_conf(sqs.config().to_builder().interceptor(sent.clone()).build());
    let done = redrive::redrive_queue(
        &qc::aws::operator_sqs(watched.clone()),
        &src,
        None,
        1000,
        "t1",
    )
    .await
    .unwrap();
    assert_eq!(done.moved, 25);
    assert_eq!(done.route.dlq_url, dlq);
    assert_eq!(count(&sqs, &dlq).await, (0, 0), "the DLQ is empty");
    let back = drain(&sqs, &src).await;
    let mut seen: Vec<usize> = back.iter().map(body_index).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..25).collect::<Vec<_>>(), "each message once");
    for m in &back {
        let i = body_index(m);
        assert_eq!(m.body().unwrap(), format!("order {i} \"ünïcode\""));
        let attrs = m.message_attributes().unwrap();
        assert_eq!(attrs["kind"].string_value(), Some(format!("k{i}").as_str()));
        assert_eq!(attrs["blob"].data_type(), "Binary");
        assert_eq!(
            attrs["blob"].binary_value().unwrap().as_ref(),
            &[0u8, 255, i as u8]
        );
    }
    // The X-Ray header goes out with every resend. moto drops MessageSystemAttributes of
    // SendMessageBatch entries (SQS keeps them), so this is checked on the wire.
    let batches = sent.0.lock().unwrap().clone();
    let entries: Vec<&serde_json::Value> = batches
        .iter()
        .flat_map(|b| b["Entries"].as_array().unwrap())
        .collect();
    assert_eq!(entries.len(), 25);
    for e in entries {
        assert_eq!(
            e["MessageSystemAttributes"]["AWSTraceHeader"],
            serde_json::json!({"DataType": "String", "StringValue": TRACE}),
            "{e}"
        );
    }
}

#[tokio::test]
async fn fifo_dlq_of_12_in_3_groups_goes_back_in_group_order() {
    // Dead-lettered by direct sends, in order, as the worker's onPoison deadLetter does: moto's own
    // dead-lettering of FIFO messages does not keep their group order (it moved 7, 8, 9, 0, 3, ...).
    let (sqs, src, dlq) = queues(true).await;
    send(&sqs, &dlq, 12, 3).await;
    let done = redrive::redrive_queue(&qc::aws::operator_sqs(sqs.clone()), &src, None, 1000, "t1")
        .await
        .unwrap();
    assert_eq!(done.moved, 12);
    assert_eq!(count(&sqs, &dlq).await, (0, 0), "the DLQ is empty");
    let back = drain(&sqs, &src).await;
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for m in &back {
        let g = m
            .attributes()
            .unwrap()
            .get(&MessageSystemAttributeName::MessageGroupId)
            .unwrap()
            .clone();
        groups.entry(g).or_default().push(body_index(m));
    }
    let want: BTreeMap<String, Vec<usize>> = (0..3)
        .map(|g| (format!("g{g}"), (0..12).filter(|i| i % 3 == g).collect()))
        .collect();
    assert_eq!(groups, want, "all back, in order within each group");
}

#[tokio::test]
async fn a_fifo_move_interrupted_after_its_send_does_not_duplicate_when_run_again() {
    // Play the crash: a move with token t1 sent one message to the source and died before deleting it
    // from the DLQ. Running t1 again resends it with the same deduplication id, which SQS drops.
    let (sqs, src, dlq) = queues(true).await;
    send(&sqs, &dlq, 3, 1).await;
    let first = sqs
        .receive_message()
        .queue_url(&dlq)
        .max_number_of_messages(1)
        .visibility_timeout(0)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap()
        .remove(0);
    sqs.send_message()
        .queue_url(&src)
        .message_body(first.body().unwrap())
        .message_group_id("g0")
        .message_deduplication_id(redrive::deduplication_id("t1", first.message_id().unwrap()))
        .send()
        .await
        .unwrap();
    let done = redrive::redrive_queue(&qc::aws::operator_sqs(sqs.clone()), &src, None, 1000, "t1")
        .await
        .unwrap();
    assert_eq!(done.moved, 3);
    assert_eq!(count(&sqs, &dlq).await, (0, 0));
    let back: Vec<usize> = drain(&sqs, &src).await.iter().map(body_index).collect();
    assert_eq!(back, [0, 1, 2], "one copy each, in order");
}

#[tokio::test]
async fn max_bounds_the_move_and_the_cli_prints_the_count() {
    let (sqs, src, dlq) = queues(false).await;
    dead_letter(&sqs, &src, &dlq, 12).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args([
            "redrive",
            "--queue-url",
            &src,
            "--endpoint-url",
            &common::sqs_endpoint(),
            "--region",
            "us-east-1",
            "--max",
            "5",
            "--rate",
            "1000",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("moved 5 message(s) from {dlq} to {src}")),
        "{stdout}"
    );
    assert_eq!(count(&sqs, &dlq).await.0, 7);
    assert_eq!(count(&sqs, &src).await.0, 5);

    // The rest, without --max.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args([
            "redrive",
            "--queue-url",
            &src,
            "--endpoint-url",
            &common::sqs_endpoint(),
            "--rate",
            "1000",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("moved 7 message(s)"), "{stdout}");
    assert_eq!(count(&sqs, &dlq).await, (0, 0));
}

#[tokio::test]
async fn a_queue_without_a_dlq_is_a_clear_error() {
    let sqs = common::sqs_client().await;
    let src = common::create_queue(&sqs, &common::unique_name("nodlq"), &[]).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args([
            "redrive",
            "--queue-url",
            &src,
            "--endpoint-url",
            &common::sqs_endpoint(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has no redrive policy"), "{stderr}");
    // Bad target: exit 2 and the expected form.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args(["redrive", "orders"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NAMESPACE/NAME"));
}

/// Send `body` straight to the DLQ, marked with `qc-source-arn` = `source` (as qc-worker marks its
/// dead-letter sends) or unmarked.
async fn send_to_dlq(sqs: &aws_sdk_sqs::Client, dlq: &str, body: &str, source: Option<&str>) {
    let mut req = sqs.send_message().queue_url(dlq).message_body(body);
    if let Some(arn) = source {
        req = req.message_attributes(
            redrive::SOURCE_ATTRIBUTE,
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(arn)
                .build()
                .unwrap(),
        );
    }
    req.send().await.unwrap();
}

/// Send `bodies` to `src` and receive them with visibility 0 until its redrive policy has moved them
/// (the DLQ then holds `dlq_total`).
async fn dead_letter_bodies(
    sqs: &aws_sdk_sqs::Client,
    src: &str,
    dlq: &str,
    bodies: &[&str],
    dlq_total: i64,
) {
    for b in bodies {
        sqs.send_message()
            .queue_url(src)
            .message_body(*b)
            .send()
            .await
            .unwrap();
    }
    receive_until_dead_lettered(sqs, src, dlq, dlq_total).await;
}

fn sorted_bodies(ms: &[aws_sdk_sqs::types::Message]) -> Vec<String> {
    let mut b: Vec<String> = ms.iter().map(|m| m.body().unwrap().to_string()).collect();
    b.sort();
    b
}

/// Two queues, ours and another team's, share one DLQ. The DLQ holds worker dead-letter sends marked
/// with each source, messages each redrive policy moved and one sent to it directly. A redrive of
/// ours moves only what names our queue; the rest stays in the DLQ. (moto does not set
/// DeadLetterQueueSourceArn on what a redrive policy moves, as SQS does, so here those messages name
/// no source: in a shared DLQ they stay too.)
#[tokio::test]
async fn a_shared_dlq_holding_another_queues_messages_is_not_redriven_into_ours() {
    let sqs = common::sqs_client().await;
    let dlq = common::create_queue(&sqs, &common::unique_name("shdlq"), &[]).await;
    let dlq_arn = common::queue_arn(&sqs, &dlq).await;
    let policy = vec![(
        QueueAttributeName::RedrivePolicy,
        format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"1"}}"#),
    )];
    let ours = common::create_queue(&sqs, &common::unique_name("ours"), &policy).await;
    let theirs = common::create_queue(&sqs, &common::unique_name("theirs"), &policy).await;
    let (ours_arn, theirs_arn) = (
        common::queue_arn(&sqs, &ours).await,
        common::queue_arn(&sqs, &theirs).await,
    );
    dead_letter_bodies(&sqs, &ours, &dlq, &["ours-policy"], 1).await;
    dead_letter_bodies(&sqs, &theirs, &dlq, &["theirs-policy"], 2).await;
    send_to_dlq(&sqs, &dlq, "ours-worker-1", Some(&ours_arn)).await;
    send_to_dlq(&sqs, &dlq, "ours-worker-2", Some(&ours_arn)).await;
    send_to_dlq(&sqs, &dlq, "theirs-worker", Some(&theirs_arn)).await;
    send_to_dlq(&sqs, &dlq, "unmarked", None).await;

    let done = redrive::redrive_queue(
        &qc::aws::operator_sqs(sqs.clone()),
        &ours,
        None,
        1000,
        "shared",
    )
    .await
    .unwrap();
    assert_eq!((done.moved, done.skipped), (2, 4), "{done:?}");
    assert_eq!(
        sorted_bodies(&drain(&sqs, &ours).await),
        ["ours-worker-1", "ours-worker-2"]
    );
    // The four left are hidden for the move's receive visibility, not gone.
    assert_eq!(
        count(&sqs, &dlq).await,
        (0, 4),
        "the other queue's messages, and those naming no source, stay in the shared DLQ"
    );
    assert!(drain(&sqs, &theirs).await.is_empty());
}

/// A DLQ that serves only our queue: a message naming no source (a direct send, or a worker older
/// than the mark) is ours too and goes back; one marked with another queue does not.
#[tokio::test]
async fn a_dlq_of_ours_alone_moves_unmarked_messages_but_not_marked_foreign_ones() {
    let (sqs, src, dlq) = queues(false).await;
    send_to_dlq(&sqs, &dlq, "unmarked", None).await;
    send_to_dlq(
        &sqs,
        &dlq,
        "foreign",
        Some("arn:aws:sqs:us-east-1:999999999999:team-b-orders"),
    )
    .await;
    let done = redrive::redrive_queue(
        &qc::aws::operator_sqs(sqs.clone()),
        &src,
        None,
        1000,
        "sole",
    )
    .await
    .unwrap();
    assert_eq!((done.moved, done.skipped), (1, 1), "{done:?}");
    assert_eq!(sorted_bodies(&drain(&sqs, &src).await), ["unmarked"]);
    assert_eq!(count(&sqs, &dlq).await, (0, 1), "the foreign one stays");
}
