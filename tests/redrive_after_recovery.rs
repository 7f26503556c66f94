//! The automatic redrive after recovery (`spec.deadLetter.redriveAfterRecovery`), the controller's
//! redrive step against a real SQS server (moto): nothing before HandlerHealthy has been True for
//! `healthyFor`; then one move of only the messages dead-lettered for a transient cause (the redrive
//! policy's, no `qc-poison-reason`), never poison, an Event with the counts; once per recovery; and a
//! message it moved that fails again is never moved automatically a second time.

mod common;

use std::collections::BTreeMap;

use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use qc::api::QueueConsumer;
use qc::aws::redrive::{REASON_ATTRIBUTE, SOURCE_ATTRIBUTE};
use qc::controller::redrive::{self, Outcome, Redrives, StepInputs};
use serde_json::json;

fn attr(v: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(v)
        .build()
        .unwrap()
}

/// A QueueConsumer on `url` with the redrive after recovery on (healthyFor 10m), whose HandlerHealthy
/// condition is `status` since `since` ago, and `after_recovery` as its last automatic redrive.
fn consumer(
    url: &str,
    status: &str,
    at: Timestamp,
    after_recovery: Option<&Outcome>,
) -> QueueConsumer {
    let mut dead_letter = json!({});
    if let Some(o) = after_recovery {
        dead_letter["redriveAfterRecovery"] = serde_json::to_value(&o.after_recovery).unwrap();
    }
    serde_json::from_value(json!({
        "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u1"},
        "spec": {
            "queue": {"url": url},
            "processing": {"p99": "1s"},
            "handler": {"http": {}},
            "deadLetter": {"alarm": false, "redriveAfterRecovery": {"enabled": true, "healthyFor": "10m", "rate": 500}}
        },
        "status": {
            "conditions": [{
                "type": "HandlerHealthy", "status": status, "reason": "HandlerResponding",
                "message": "", "lastTransitionTime": at.to_string()
            }],
            "deadLetter": dead_letter
        }
    }))
    .unwrap()
}

async fn step(sqs: &aws_sdk_sqs::Client, redrives: &Redrives, qc: &QueueConsumer) -> Outcome {
    let reader = qc::aws::sqs::SqsReader::new(sqs.clone());
    let facts = qc::aws::sqs::observe(&reader, &qc.spec.queue.url)
        .await
        .unwrap();
    let client = qc::aws::operator_sqs(sqs.clone());
    redrive::step(
        qc,
        &StepInputs {
            key: "shop/orders",
            redrives,
            client: Some(&client),
            endpoint: Some(&common::sqs_endpoint()),
            facts: Some(&facts),
            now: Time(Timestamp::now()),
            recovery_rate: 500,
        },
    )
    .await
}

/// Step until the automatic move is no longer Running (bounded).
async fn until_done(
    sqs: &aws_sdk_sqs::Client,
    redrives: &Redrives,
    url: &str,
    at: Timestamp,
    mut out: Outcome,
) -> Outcome {
    let mut events = out.events.clone();
    for _ in 0..100 {
        let state = out.after_recovery.as_ref().and_then(|s| s.state.clone());
        if state.as_deref() != Some(redrive::RUNNING) {
            out.events = events;
            return out;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        out = step(sqs, redrives, &consumer(url, "True", at, Some(&out))).await;
        events.extend(out.events.clone());
    }
    panic!(
        "the redrive after recovery did not end: {:?}",
        out.after_recovery
    );
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

/// Receive `src` with visibility 0 until its redrive policy (maxReceiveCount 1) moved `n` more
/// messages to `dlq`: the transient failures of an outage.
async fn fail_through(sqs: &aws_sdk_sqs::Client, src: &str, dlq: &str, dlq_total: u64) {
    for _ in 0..60 {
        let (v, f) = count(sqs, dlq).await;
        if v + f == dlq_total {
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

/// Bodies of `url` and whether each carries the auto-redrive mark, deleting as it goes.
async fn drain(sqs: &aws_sdk_sqs::Client, url: &str) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    let mut empty = 0;
    for _ in 0..50 {
        let got = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(60)
            .message_attribute_names("All")
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
            let marked = m
                .message_attributes()
                .is_some_and(|a| a.contains_key(qc::triage::AUTO_REDRIVE_ATTRIBUTE));
            assert!(out.insert(m.body().unwrap().to_string(), marked).is_none());
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

#[tokio::test]
async fn after_recovery_only_transient_dead_letters_move_once_and_never_poison() {
    let sqs = common::sqs_client().await;
    let dlq = common::create_queue(&sqs, &common::unique_name("ardlq"), &[]).await;
    let dlq_arn = common::queue_arn(&sqs, &dlq).await;
    let src = common::create_queue(
        &sqs,
        &common::unique_name("arsrc"),
        &[(
            QueueAttributeName::RedrivePolicy,
            format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"1"}}"#),
        )],
    )
    .await;
    let src_arn = common::queue_arn(&sqs, &src).await;
    // The outage: three messages fail through the redrive policy (no reason attached).
    for i in 0..3 {
        sqs.send_message()
            .queue_url(&src)
            .message_body(format!("transient-{i}"))
            .send()
            .await
            .unwrap();
    }
    fail_through(&sqs, &src, &dlq, 3).await;
    // Poison the worker dead-lettered (reason attached), a forged empty reason, one with ten
    // attributes (maybe poison whose reason had no room), one an earlier automatic redrive moved.
    for i in 0..2 {
        sqs.send_message()
            .queue_url(&dlq)
            .message_body(format!("poison-{i}"))
            .message_attributes(SOURCE_ATTRIBUTE, attr(&src_arn))
            .message_attributes(REASON_ATTRIBUTE, attr("handler answered HTTP 422"))
            .send()
            .await
            .unwrap();
    }
    sqs.send_message()
        .queue_url(&dlq)
        .message_body("empty-reason")
        .message_attributes(REASON_ATTRIBUTE, attr(" "))
        .send()
        .await
        .unwrap();
    let mut full = sqs
        .send_message()
        .queue_url(&dlq)
        .message_body("ten-attributes");
    for k in 0..10 {
        full = full.message_attributes(format!("a{k}"), attr("x"));
    }
    full.send().await.unwrap();
    sqs.send_message()
        .queue_url(&dlq)
        .message_body("moved-before")
        .message_attributes(
            qc::triage::AUTO_REDRIVE_ATTRIBUTE,
            attr("after-recovery:earlier"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(count(&sqs, &dlq).await, (8, 0));

    let redrives = Redrives::new();
    // Not yet: unhealthy, or healthy for less than healthyFor.
    for (status, since) in [
        ("False", SignedDuration::from_mins(30)),
        ("True", SignedDuration::from_mins(5)),
    ] {
        let at = Timestamp::now().checked_sub(since).unwrap();
        let out = step(&sqs, &redrives, &consumer(&src, status, at, None)).await;
        assert_eq!(out.after_recovery, None, "{status} for {since}");
        assert!(out.events.is_empty());
    }
    assert_eq!(count(&sqs, &dlq).await, (8, 0));

    // Healthy for 11 minutes: one move of the transient ones.
    let since = Timestamp::now()
        .checked_sub(SignedDuration::from_mins(11))
        .unwrap();
    let first = step(&sqs, &redrives, &consumer(&src, "True", since, None)).await;
    let token = first
        .after_recovery
        .as_ref()
        .unwrap()
        .request
        .clone()
        .unwrap();
    assert!(redrive::is_after_recovery(&token), "{token}");
    assert_eq!(first.events[0].reason, redrive::REDRIVE_STARTED);
    assert!(
        first.events[0].note.contains("never poison"),
        "{:?}",
        first.events
    );
    let done = until_done(&sqs, &redrives, &src, since, first).await;
    let s = done.after_recovery.clone().unwrap();
    assert_eq!(s.state.as_deref(), Some(redrive::COMPLETED), "{s:?}");
    assert_eq!((s.moved, s.not_selected), (Some(3), Some(5)), "{s:?}");
    let completed: Vec<_> = done
        .events
        .iter()
        .filter(|e| e.reason == redrive::REDRIVE_COMPLETED)
        .collect();
    assert_eq!(completed.len(), 1, "{:?}", done.events);
    assert!(
        completed[0].note.contains("moved 3 message(s)")
            && completed[0]
                .note
                .contains("5 poison or already redriven message(s) left"),
        "{}",
        completed[0].note
    );
    assert_eq!(
        count(&sqs, &dlq).await,
        (5, 0),
        "the rest visible again at once, none deleted"
    );
    assert_eq!(count(&sqs, &src).await.0, 3);

    // Once per recovery: the same transition starts nothing again.
    let again = step(&sqs, &redrives, &consumer(&src, "True", since, Some(&done))).await;
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(
        again.after_recovery.as_ref().unwrap().request.as_deref(),
        Some(token.as_str())
    );

    // They fail again (another outage) and come back; a later recovery does not move them twice.
    fail_through(&sqs, &src, &dlq, 8).await;
    let later = Timestamp::now()
        .checked_sub(SignedDuration::from_mins(10) + SignedDuration::from_secs(30))
        .unwrap();
    let second = step(&sqs, &redrives, &consumer(&src, "True", later, Some(&done))).await;
    assert_ne!(
        second.after_recovery.as_ref().unwrap().request.as_deref(),
        Some(token.as_str())
    );
    let done2 = until_done(&sqs, &redrives, &src, later, second).await;
    let s2 = done2.after_recovery.unwrap();
    assert_eq!((s2.moved, s2.not_selected), (Some(0), Some(8)), "{s2:?}");
    assert_eq!(count(&sqs, &src).await, (0, 0));
    let left = drain(&sqs, &dlq).await;
    assert_eq!(left.len(), 8, "{left:?}");
    for i in 0..3 {
        assert_eq!(left.get(&format!("transient-{i}")), Some(&true), "{left:?}");
    }
}
