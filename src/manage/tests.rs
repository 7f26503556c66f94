//! The planner on its own: the values are the rules' (applying a plan silences the findings it
//! fixed), nothing is ever lowered, peers with other values conflict, and created queues are wired.

use super::*;
use crate::api::QueueConsumerSpec;
use crate::aws::{DeadLetterFacts, Facts, QueueFacts, RedrivePolicy};
use crate::validate::codes;

const DAY: u64 = 24 * 3600;

fn spec(yaml: &str) -> QueueConsumerSpec {
    let base = "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q, manage: attributes}\nhandler: {http: {}}\n";
    serde_saphyr::from_str(&format!("{base}{yaml}")).expect("test spec parses")
}

fn queue(vt: u64, retention_secs: u64, r: Option<u32>) -> QueueFacts {
    QueueFacts {
        url: "https://sqs.us-east-1.amazonaws.com/1/q".into(),
        arn: Some("arn:aws:sqs:us-east-1:1:q".into()),
        visibility_timeout: Duration::from_secs(vt),
        retention: Duration::from_secs(retention_secs),
        fifo: false,
        redrive: r.map(|r| RedrivePolicy {
            dead_letter_target_arn: "arn:aws:sqs:us-east-1:1:dlq".into(),
            max_receive_count: r,
        }),
        visible: Some(0),
        in_flight: Some(0),
        delayed: Some(0),
    }
}

fn codes_on(spec: &QueueConsumerSpec, q: &QueueFacts) -> Vec<String> {
    let facts = Facts {
        queue: q.clone(),
        dead_letter: DeadLetterFacts::None,
        oldest_age_seconds: None,
    };
    validate::evaluate(spec, Some(&facts))
        .findings
        .into_iter()
        .map(|f| f.code)
        .collect()
}

#[test]
fn a_short_visibility_timeout_is_raised_to_the_budget_and_its_findings_go() {
    // p99 2s, heartbeat off: budget = 2s × 1 + 5s = 7s; timeout 30s needs 35s (HandlerTimeoutBeyondVisibility)
    let s = spec("processing: {p99: 2s, heartbeat: {enabled: false}}");
    let q = queue(5, 4 * DAY, Some(5));
    let before = codes_on(&s, &q);
    assert!(before.contains(&codes::VISIBILITY_TIMEOUT_BELOW_BUDGET.to_string()));
    let plan = plan_attributes(&s, &q);
    assert_eq!(
        plan.changes,
        vec![Change {
            attribute: Attribute::VisibilityTimeout,
            from: "5s".into(),
            to: "35s".into()
        }]
    );
    assert_eq!(plan.attributes[ATTR_VISIBILITY_TIMEOUT], "35");
    let after = codes_on(&s, &plan.applied_to(&q));
    for code in [
        codes::VISIBILITY_TIMEOUT_BELOW_BUDGET,
        codes::HANDLER_TIMEOUT_BEYOND_VISIBILITY,
    ] {
        assert!(
            !after.contains(&code.to_string()),
            "{code} still fires: {after:?}"
        );
    }
    // the number is the rules' own: what the findings on the old queue recommend
    let facts = Facts {
        queue: q.clone(),
        dead_letter: DeadLetterFacts::None,
        oldest_age_seconds: None,
    };
    let recommendations: Vec<String> = validate::evaluate(&s, Some(&facts))
        .findings
        .into_iter()
        .map(|f| f.recommendation)
        .collect();
    assert!(
        recommendations
            .iter()
            .any(|r| r.contains("VisibilityTimeout to at least 35s")),
        "{recommendations:?}"
    );
}

#[test]
fn the_visibility_timeout_needed_silences_every_vt_rule_for_many_specs() {
    for yaml in [
        "processing: {p99: 2s}",
        "processing: {p99: 100ms}",
        "processing: {p99: 2s, mean: 1s}",
        "processing: {p99: 10m, timeout: 20m, concurrency: 1, batchSize: 10}",
        "processing: {p99: 2s, heartbeat: {enabled: true, interval: 40s}}",
        "processing: {p99: 3s, timeout: 90s, heartbeat: {enabled: false}}",
    ] {
        let s = spec(yaml);
        let q = queue(1, 14 * DAY, Some(5));
        let after = codes_on(&s, &plan_attributes(&s, &q).applied_to(&q));
        for code in [
            codes::VISIBILITY_TIMEOUT_BELOW_BUDGET,
            codes::VISIBILITY_TIMEOUT_BELOW_SIX_TIMES_MEAN,
            codes::HEARTBEAT_INTERVAL_TOO_LONG,
            codes::HANDLER_TIMEOUT_BEYOND_VISIBILITY,
        ] {
            assert!(
                !after.contains(&code.to_string()),
                "{yaml}: {code} still fires"
            );
        }
    }
}

#[test]
fn nothing_is_ever_lowered() {
    // VT 12h (excessive), R 50, retention 14 days: the rules would be happy with less; nothing changes
    let s = spec("processing: {p99: 2s}");
    let q = queue(12 * 3600, 14 * DAY, Some(50));
    let plan = plan_attributes(&s, &q);
    assert!(plan.is_empty(), "{:?}", plan.changes);
    assert!(codes_on(&s, &q).contains(&codes::VISIBILITY_TIMEOUT_EXCESSIVE.to_string()));
    assert_eq!(decide(&s, &q, &[]), Decision::InSync(plan));
}

#[test]
fn a_low_receive_count_is_raised_to_three_and_retention_follows_the_retry_window() {
    // VT 1h, R 1, retention 2h: R → 3, window 3h > 2h → retention 4h (window + 1h); the breaker is
    // off here, else its hold of up to 12h would ask for 13h
    let s = spec("processing: {p99: 2s, breaker: {enabled: false}}");
    let q = queue(3600, 2 * 3600, Some(1));
    let before = codes_on(&s, &q);
    assert!(before.contains(&codes::MAX_RECEIVE_COUNT_TOO_LOW.to_string()));
    let plan = plan_attributes(&s, &q);
    let changed: Vec<_> = plan.changes.iter().map(ToString::to_string).collect();
    assert_eq!(
        changed,
        vec![
            "MaxReceiveCount from 1 to 3".to_string(),
            "MessageRetentionPeriod from 2h to 4h".to_string()
        ]
    );
    assert_eq!(
        plan.attributes[ATTR_REDRIVE_POLICY],
        r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:dlq","maxReceiveCount":3}"#
    );
    assert_eq!(plan.attributes[ATTR_RETENTION], "14400");
    let after = codes_on(&s, &plan.applied_to(&q));
    for code in [
        codes::MAX_RECEIVE_COUNT_TOO_LOW,
        codes::RETRY_WINDOW_BEYOND_RETENTION,
    ] {
        assert!(!after.contains(&code.to_string()), "{code}: {after:?}");
    }
}

#[test]
fn retention_is_never_lowered_and_never_raised_past_fourteen_days() {
    // R 900 × VT 12h is far beyond 14 days: retention goes to 14 days, R stays (lowering it would
    // dead-letter messages earlier than the owner set), and the finding stays for a person to decide
    let s = spec("processing: {p99: 2s}");
    let q = queue(12 * 3600, 10 * DAY, Some(900));
    let plan = plan_attributes(&s, &q);
    assert_eq!(plan.targets.retention, Duration::from_secs(14 * DAY));
    assert_eq!(plan.targets.max_receive_count, Some(900));
    assert!(
        codes_on(&s, &plan.applied_to(&q))
            .contains(&codes::RETRY_WINDOW_BEYOND_RETENTION.to_string())
    );
    // a retention already at 14 days with nothing else wrong: nothing to do
    let q = queue(30, 14 * DAY, Some(5));
    assert!(plan_attributes(&s, &q).is_empty());
}

#[test]
fn the_breaker_hold_raises_a_short_retention() {
    // breaker on, outageTolerance 2h, retention 1h: OutageHoldBeyondRetention → retention 3h
    let s = spec("processing: {p99: 2s, outageTolerance: 2h}");
    let q = queue(30, 3600, Some(5));
    assert!(codes_on(&s, &q).contains(&codes::OUTAGE_HOLD_BEYOND_RETENTION.to_string()));
    let plan = plan_attributes(&s, &q);
    assert_eq!(plan.targets.retention, Duration::from_secs(3 * 3600));
    assert!(
        !codes_on(&s, &plan.applied_to(&q))
            .contains(&codes::OUTAGE_HOLD_BEYOND_RETENTION.to_string())
    );
}

#[test]
fn with_the_breaker_off_the_receive_count_spans_the_outage_tolerance() {
    let s = spec(
        "processing: {p99: 2s, outageTolerance: 1h, breaker: {enabled: false}, retryBackoff: {base: 5s, max: 1m}}",
    );
    let q = queue(30, 4 * DAY, Some(5));
    assert!(codes_on(&s, &q).contains(&codes::RETRY_WINDOW_BELOW_OUTAGE_TOLERANCE.to_string()));
    let plan = plan_attributes(&s, &q);
    let r = plan.targets.max_receive_count.expect("has a policy");
    assert!(r > 5);
    let after = plan.applied_to(&q);
    assert!(
        !codes_on(&s, &after).contains(&codes::RETRY_WINDOW_BELOW_OUTAGE_TOLERANCE.to_string())
    );
    // the least that does it
    let mut one_less = after.clone();
    if let Some(p) = one_less.redrive.as_mut() {
        p.max_receive_count = r - 1;
    }
    assert!(
        codes_on(&s, &one_less).contains(&codes::RETRY_WINDOW_BELOW_OUTAGE_TOLERANCE.to_string())
    );
}

#[test]
fn a_queue_without_redrive_policy_gets_no_receive_count_under_attributes() {
    let s = spec("processing: {p99: 2s}");
    let q = queue(30, 4 * DAY, None);
    let plan = plan_attributes(&s, &q);
    assert!(plan.is_empty());
    assert_eq!(plan.targets.max_receive_count, None);
}

#[test]
fn suspended_touches_nothing() {
    let s = spec("processing: {p99: 2s, heartbeat: {enabled: false}}\nsuspend: true");
    assert_eq!(
        decide(&s, &queue(5, 4 * DAY, Some(5)), &[]),
        Decision::Suspended
    );
}

#[test]
fn two_consumers_wanting_different_values_conflict_and_equal_ones_do_not() {
    let a = spec("processing: {p99: 2s, heartbeat: {enabled: false}}");
    let b = spec("processing: {p99: 20s, timeout: 60s, heartbeat: {enabled: false}}");
    let q = queue(5, 4 * DAY, Some(5));
    let peer = |spec| Peer {
        label: "shop/other".into(),
        spec,
    };
    match decide(&a, &q, &[peer(&b)]) {
        Decision::Conflict { with, .. } => assert_eq!(with, vec!["shop/other".to_string()]),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(matches!(
        decide(&b, &q, &[peer(&a)]),
        Decision::Conflict { .. }
    ));
    // the same values: no conflict, both would set the same
    let same = a.clone();
    assert!(matches!(
        decide(&a, &q, &[peer(&same)]),
        Decision::Update(_)
    ));
    // a queue that already satisfies both, with the same targets: in sync
    let fine = queue(3600, 4 * DAY, Some(5));
    let c = spec("processing: {p99: 2s}");
    let same = c.clone();
    assert!(matches!(
        decide(&c, &fine, &[peer(&same)]),
        Decision::InSync(_)
    ));
}

#[test]
fn create_plans_a_dead_letter_queue_of_the_same_type_with_sse_and_tags() {
    let s = spec("processing: {p99: 2s, heartbeat: {enabled: false}}");
    let plan = plan_create(&s, "shop", "orders").expect("plan");
    assert_eq!(plan.queue.name, "q");
    assert_eq!(plan.dead_letter.name, "q-dlq");
    assert_eq!(plan.queue.attributes[ATTR_VISIBILITY_TIMEOUT], "35");
    assert_eq!(plan.queue.attributes[ATTR_RETENTION], (4 * DAY).to_string());
    assert_eq!(plan.queue.attributes[ATTR_SSE], "true");
    assert!(!plan.queue.attributes.contains_key(ATTR_FIFO));
    assert_eq!(
        plan.dead_letter.attributes[ATTR_RETENTION],
        (14 * DAY).to_string()
    );
    assert_eq!(plan.max_receive_count, 5);
    assert_eq!(plan.queue.tags[TAG_QUEUE_CONSUMER], "shop/orders");

    let mut fifo = s.clone();
    fifo.queue.url = "https://sqs.us-east-1.amazonaws.com/1/orders.fifo".into();
    let plan = plan_create(&fifo, "shop", "orders").expect("plan");
    assert_eq!(plan.dead_letter.name, "orders-dlq.fifo");
    assert_eq!(plan.queue.attributes[ATTR_FIFO], "true");
    assert_eq!(plan.dead_letter.attributes[ATTR_FIFO], "true");
}

#[test]
fn create_refuses_a_url_without_a_valid_queue_name_naming_the_field() {
    let mut s = spec("processing: {p99: 2s}");
    for url in [
        "https://sqs.us-east-1.amazonaws.com/1/",
        "https://sqs.us-east-1.amazonaws.com/1/bad%20name",
        &format!("https://sqs.us-east-1.amazonaws.com/1/{}", "x".repeat(77)),
    ] {
        s.queue.url = url.to_string();
        let err = plan_create(&s, "shop", "orders")
            .expect_err(url)
            .to_string();
        assert!(err.contains("spec.queue.url"), "{err}");
    }
}

#[test]
fn two_consumers_creating_one_queue_with_other_settings_conflict() {
    let a = spec("processing: {p99: 2s, heartbeat: {enabled: false}}");
    let b = spec("processing: {p99: 20s, timeout: 60s, heartbeat: {enabled: false}}");
    let peer = |spec| Peer {
        label: "shop/other".into(),
        spec,
    };
    assert_eq!(
        create_conflicts(&a, &[peer(&b)]),
        vec!["shop/other".to_string()]
    );
    let same = a.clone();
    assert!(create_conflicts(&a, &[peer(&same)]).is_empty());
}

#[test]
fn a_redrive_policy_waits_for_an_empty_queue() {
    let mut q = queue(30, 4 * 24 * 3600, None);
    let counts = |v, f, d| (Some(v), Some(f), Some(d));
    assert_eq!(redrive_policy_deferred(&q, 5), None, "an empty queue");
    for (visible, in_flight, delayed) in [counts(1, 0, 0), counts(0, 3, 0), counts(0, 0, 2)] {
        (q.visible, q.in_flight, q.delayed) = (visible, in_flight, delayed);
        let why = redrive_policy_deferred(&q, 5).expect("deferred");
        assert!(
            why.contains(&format!(
                "holds {} visible, {} in flight and {} delayed messages",
                visible.unwrap(),
                in_flight.unwrap(),
                delayed.unwrap()
            )) && why.contains("more than 5 times")
                && why.contains("set the RedrivePolicy yourself"),
            "{why}"
        );
    }
    // Counts not read: no guess.
    q.in_flight = None;
    (q.visible, q.delayed) = (Some(0), Some(0));
    let why = redrive_policy_deferred(&q, 5).expect("deferred");
    assert!(why.contains("an unknown number"), "{why}");
}
