//! Table tests: for each rule a case that fires, one that does not, and the boundary.

use super::*;
use crate::api::{HeartbeatInterval, QueueConsumerSpec};
use crate::aws::{DeadLetterFacts, Facts, QueueFacts, RedrivePolicy};

const DAY: u64 = 24 * 3600;

fn spec(yaml: &str) -> QueueConsumerSpec {
    let base = "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\nhandler: {http: {}}\n";
    serde_saphyr::from_str(&format!("{base}{yaml}")).expect("test spec parses")
}

/// p99 2s, concurrency 10, batchSize 10, heartbeat on: 20 in flight (10 running, one batch of 10
/// waiting for a slot), budget = 2s × ceil(20 / 10) + 5s = 9s.
fn default_spec() -> QueueConsumerSpec {
    spec("processing: {p99: 2s}")
}

fn queue(vt: u64) -> QueueFacts {
    QueueFacts {
        url: "https://sqs.us-east-1.amazonaws.com/1/q".into(),
        arn: Some("arn:aws:sqs:us-east-1:1:q".into()),
        visibility_timeout: Duration::from_secs(vt),
        retention: Duration::from_secs(4 * DAY),
        fifo: false,
        redrive: Some(RedrivePolicy {
            dead_letter_target_arn: "arn:aws:sqs:us-east-1:1:dlq".into(),
            max_receive_count: 5,
        }),
        visible: Some(0),
        in_flight: Some(0),
        delayed: Some(0),
    }
}

fn dlq(retention_days: u64, fifo: bool) -> DeadLetterFacts {
    let mut q = queue(30);
    q.url = "https://sqs.us-east-1.amazonaws.com/1/dlq".into();
    q.redrive = None;
    q.retention = Duration::from_secs(retention_days * DAY);
    q.fifo = fifo;
    DeadLetterFacts::Found {
        queue: q,
        oldest_age_seconds: None,
    }
}

fn facts(q: QueueFacts) -> Facts {
    Facts {
        queue: q,
        dead_letter: dlq(14, false),
        oldest_age_seconds: None,
    }
}

fn codes_of(spec: &QueueConsumerSpec, facts: Option<&Facts>) -> Vec<String> {
    evaluate(spec, facts)
        .findings
        .into_iter()
        .map(|f| f.code)
        .collect()
}

fn find(spec: &QueueConsumerSpec, facts: Option<&Facts>, code: &str) -> Option<Finding> {
    evaluate(spec, facts)
        .findings
        .into_iter()
        .find(|f| f.code == code)
}

#[test]
fn healthy_setup_has_no_findings() {
    assert_eq!(
        codes_of(&default_spec(), Some(&facts(queue(30)))),
        Vec::<String>::new()
    );
}

#[test]
fn budget_arithmetic() {
    let s = default_spec();
    // 10 slots, the waiting batch of 10 and up to 5 still waiting when the next batch is asked for.
    assert_eq!(in_flight_per_replica(&s), 25);
    assert_eq!(budget(&s), Duration::from_secs(11));
    // Without the heartbeat the worker receives only into free slots: no waiting batch.
    let no_hb = spec("processing: {p99: 2s, heartbeat: {enabled: false}}");
    assert_eq!(in_flight_per_replica(&no_hb), 10);
    assert_eq!(budget(&no_hb), Duration::from_secs(7));
    // FIFO: a message waits behind its group, never in a local batch.
    let fifo: QueueConsumerSpec = serde_saphyr::from_str(
        "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q.fifo}\nhandler: {http: {}}\nprocessing: {p99: 2s}\n",
    )
    .expect("test spec parses");
    assert_eq!(in_flight_per_replica(&fifo), 10);
    assert_eq!(budget(&fifo), Duration::from_secs(7));
    // concurrency 1, batchSize 10: what waits runs one after the other (16 rounds).
    let one = spec("processing: {p99: 2s, concurrency: 1}");
    assert_eq!(in_flight_per_replica(&one), 16);
    assert_eq!(budget(&one), Duration::from_secs(32 + 5));
    let long = spec("processing: {p99: 2m, timeout: 5m}");
    assert_eq!(margin(&long), Duration::from_secs(36));
    assert_eq!(budget(&long), Duration::from_secs(396));
}

#[test]
fn a_declared_mean_of_seconds_means_no_waiting_batch() {
    // #31: C = 1, batch 1, mean 2s, P99 12s: the worker prefetches nothing for handlers this long
    // beside a receive round trip, so one replica holds its one slot and the budget is one P99.
    let slow = spec("processing: {p99: 12s, mean: 2s, concurrency: 1, batchSize: 1, timeout: 30s}");
    assert_eq!(prefetch(&slow), 0);
    assert_eq!(in_flight_per_replica(&slow), 1);
    assert_eq!(budget(&slow), Duration::from_secs(12 + 5));
    // Just under 2s a round trip of 40 ms is more than 2 % of a call: the batch may wait.
    let fast =
        spec("processing: {p99: 5s, mean: 1999ms, concurrency: 1, batchSize: 1, timeout: 30s}");
    assert_eq!(prefetch(&fast), 2);
    // A fixed heartbeat interval shorter than the mean: nothing waits either.
    let beats =
        spec("processing: {p99: 2s, mean: 500ms, heartbeat: {interval: 400ms}, timeout: 30s}");
    assert_eq!(prefetch(&beats), 0);
    // No declared mean: the most the worker may hold.
    assert_eq!(prefetch(&spec("processing: {p99: 12s, timeout: 30s}")), 15);
}

#[test]
fn visibility_timeout_below_budget() {
    let c = codes::VISIBILITY_TIMEOUT_BELOW_BUDGET;
    let no_hb = spec("processing: {p99: 2s, heartbeat: {enabled: false}}");
    // fires: VT 6s < budget 7s, Error without heartbeat
    let f = find(&no_hb, Some(&facts(queue(6))), c).expect("fires");
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.recommendation, "set VisibilityTimeout to at least 7s");
    // Warning with heartbeat
    let hb = spec("processing: {p99: 2s, heartbeat: {interval: 1s}}");
    assert_eq!(
        find(&hb, Some(&facts(queue(6))), c)
            .expect("fires")
            .severity,
        Severity::Warning
    );
    // boundary: VT == budget does not fire
    assert!(find(&no_hb, Some(&facts(queue(7))), c).is_none());
    assert!(find(&no_hb, Some(&facts(queue(30))), c).is_none());
}

#[test]
fn visibility_timeout_below_six_times_mean() {
    let c = codes::VISIBILITY_TIMEOUT_BELOW_SIX_TIMES_MEAN;
    let s = spec("processing: {p99: 2s, mean: 10s, timeout: 30s}");
    let f = find(&s, Some(&facts(queue(59))), c).expect("fires");
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(f.recommendation, "set VisibilityTimeout to at least 1m");
    assert!(
        find(&s, Some(&facts(queue(60))), c).is_none(),
        "boundary 6 × mean"
    );
    // no mean declared: never fires
    assert!(find(&default_spec(), Some(&facts(queue(8))), c).is_none());
}

#[test]
fn visibility_timeout_excessive() {
    let c = codes::VISIBILITY_TIMEOUT_EXCESSIVE;
    let s = default_spec(); // budget 11s: 10× is 110s, so the 15m floor decides
    assert!(
        find(&s, Some(&facts(queue(900))), c).is_none(),
        "boundary: exactly 15m"
    );
    let f = find(&s, Some(&facts(queue(901))), c).expect("fires");
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.recommendation.contains("22s"), "{}", f.recommendation);
    // long work: budget 396s, 10× = 66m; 60m is over 15m but under 10 × budget
    let long = spec("processing: {p99: 2m, timeout: 5m}");
    assert!(find(&long, Some(&facts(queue(3960))), c).is_none());
    assert!(find(&long, Some(&facts(queue(3961))), c).is_some());
}

#[test]
fn processing_beyond_visibility_maximum() {
    let c = codes::PROCESSING_BEYOND_VISIBILITY_MAXIMUM;
    let at = spec("processing: {p99: 1h, timeout: 12h}");
    assert!(find(&at, None, c).is_none(), "boundary: 12h is allowed");
    let over = spec("processing: {p99: 1h, timeout: 12h1s}");
    let f = find(&over, None, c).expect("fires offline");
    assert_eq!(f.severity, Severity::Error);
    assert!(f.message.contains("processing.timeout"), "{}", f.message);
    assert!(find(&default_spec(), None, c).is_none());
}

#[test]
fn heartbeat_interval_too_long() {
    let c = codes::HEARTBEAT_INTERVAL_TOO_LONG;
    // VT 30s, margin 5s: interval must be < 25s
    let at = spec("processing: {p99: 2s, heartbeat: {interval: 25s}}");
    let f = find(&at, Some(&facts(queue(30))), c).expect("boundary fires: interval == VT - M");
    assert_eq!(f.severity, Severity::Error);
    assert!(
        f.recommendation.contains("at most 12s500ms"),
        "{}",
        f.recommendation
    );
    let under = spec("processing: {p99: 2s, heartbeat: {interval: 24s}}");
    assert!(find(&under, Some(&facts(queue(30))), c).is_none());
    // auto = VT/3: fires for a tiny VT where VT/3 >= VT - 5s (VT 7s: 2.33s >= 2s)
    assert_eq!(
        default_spec().processing.heartbeat.interval,
        HeartbeatInterval::Auto
    );
    assert!(find(&default_spec(), Some(&facts(queue(7))), c).is_some());
    assert!(
        find(&default_spec(), Some(&facts(queue(8))), c).is_none(),
        "VT 8s: 2.67s < 3s"
    );
    // heartbeat disabled: rule does not apply
    let off = spec("processing: {p99: 2s, heartbeat: {enabled: false, interval: 1h}}");
    assert!(find(&off, Some(&facts(queue(30))), c).is_none());
}

#[test]
fn handler_timeout_beyond_visibility() {
    let c = codes::HANDLER_TIMEOUT_BEYOND_VISIBILITY;
    let s = spec("processing: {p99: 2s, timeout: 31s, heartbeat: {enabled: false}}");
    let f = find(&s, Some(&facts(queue(30))), c).expect("fires");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.recommendation.contains("at least 36s"),
        "{}",
        f.recommendation
    );
    let at = spec("processing: {p99: 2s, timeout: 30s, heartbeat: {enabled: false}}");
    assert!(
        find(&at, Some(&facts(queue(30))), c).is_none(),
        "boundary: timeout == VT"
    );
    let hb = spec("processing: {p99: 2s, timeout: 31s}");
    assert!(
        find(&hb, Some(&facts(queue(30))), c).is_none(),
        "heartbeat on"
    );
}

#[test]
fn no_redrive_policy() {
    let c = codes::NO_REDRIVE_POLICY;
    let mut q = queue(30);
    q.redrive = None;
    let f = Facts {
        queue: q,
        dead_letter: DeadLetterFacts::None,
        oldest_age_seconds: None,
    };
    let got = find(&default_spec(), Some(&f), c).expect("fires");
    assert_eq!(got.severity, Severity::Error);
    assert!(got.recommendation.contains("maxReceiveCount 5"));
    assert!(find(&default_spec(), Some(&facts(queue(30))), c).is_none());
}

fn with_receive_count(vt: u64, r: u32) -> QueueFacts {
    let mut q = queue(vt);
    if let Some(p) = q.redrive.as_mut() {
        p.max_receive_count = r;
    }
    q
}

#[test]
fn max_receive_count_too_low() {
    let c = codes::MAX_RECEIVE_COUNT_TOO_LOW;
    let s = default_spec();
    assert_eq!(
        find(&s, Some(&facts(with_receive_count(30, 2))), c)
            .expect("fires")
            .severity,
        Severity::Warning
    );
    assert!(
        find(&s, Some(&facts(with_receive_count(30, 3))), c).is_none(),
        "boundary 3"
    );
}

#[test]
fn retry_window_beyond_retention() {
    let c = codes::RETRY_WINDOW_BEYOND_RETENTION;
    let s = default_spec(); // backoff 5s, 10s, 20s, 40s, 80s... below VT 1h: window = R × VT
    let mut q = with_receive_count(3600, 5);
    q.retention = Duration::from_secs(5 * 3600);
    assert!(
        find(&s, Some(&facts(q.clone())), c).is_none(),
        "boundary: window == retention"
    );
    q.retention = Duration::from_secs(5 * 3600 - 1);
    let f = find(&s, Some(&facts(q.clone())), c).expect("fires");
    assert_eq!(f.severity, Severity::Error);
    assert!(
        f.recommendation
            .starts_with("lower maxReceiveCount to 4 or set MessageRetentionPeriod to at least 6h"),
        "{}",
        f.recommendation
    );
    // backoff counts: VT 30s but backoff max 2h with base 1h → window 1h + 2h + 2h
    let slow = spec("processing: {p99: 2s, retryBackoff: {base: 1h, max: 2h}}");
    let mut q2 = with_receive_count(30, 3);
    q2.retention = Duration::from_secs(5 * 3600 - 1);
    assert!(find(&slow, Some(&facts(q2.clone())), c).is_some());
    q2.retention = Duration::from_secs(5 * 3600);
    assert!(find(&slow, Some(&facts(q2)), c).is_none());
}

#[test]
fn retry_window_below_outage_tolerance() {
    let c = codes::RETRY_WINDOW_BELOW_OUTAGE_TOLERANCE;
    // VT 60s, R 5, backoff 5s..80s: window 4 × 60s + 80s = 5m20s
    let q = with_receive_count(60, 5);
    assert_eq!(
        retry_window(&default_spec(), q.visibility_timeout, 5),
        Duration::from_secs(320)
    );
    let at = spec("processing: {p99: 2s, outageTolerance: 5m20s, breaker: {enabled: false}}");
    assert!(
        find(&at, Some(&facts(q.clone())), c).is_none(),
        "boundary: window == tolerance"
    );
    let just_over =
        spec("processing: {p99: 2s, outageTolerance: 5m21s, breaker: {enabled: false}}");
    assert!(find(&just_over, Some(&facts(q)), c).is_some());
    let held = spec("processing: {p99: 2s, outageTolerance: 1h}");
    assert!(
        find(&held, Some(&facts(with_receive_count(60, 5))), c).is_none(),
        "with the breaker on, an outage holds messages instead of burning receives"
    );
    let over = spec("processing: {p99: 2s, outageTolerance: 1h, breaker: {enabled: false}}");
    let f = find(&over, Some(&facts(with_receive_count(60, 5))), c).expect("fires");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.recommendation.contains("maxReceiveCount to at least 60"),
        "{}",
        f.recommendation
    );
    assert!(
        find(&default_spec(), Some(&facts(with_receive_count(60, 5))), c).is_none(),
        "not declared"
    );
}

#[test]
fn breaker_disabled_on_a_queue_with_a_dlq() {
    let c = codes::BREAKER_DISABLED;
    let off = spec("processing: {p99: 2s, breaker: {enabled: false}}");
    // VT 60s, R 5: the retry window 5m20s is what an outage may last before good messages go.
    let f = find(&off, Some(&facts(with_receive_count(60, 5))), c).expect("fires");
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.message.contains("after 5 receives"), "{}", f.message);
    assert!(f.message.contains("5m20s"), "{}", f.message);
    assert!(
        f.recommendation
            .contains("set processing.breaker.enabled to true"),
        "{}",
        f.recommendation
    );
    // On (the default), or no redrive policy (NoRedrivePolicy says what matters there): silent.
    assert!(find(&default_spec(), Some(&facts(with_receive_count(60, 5))), c).is_none());
    let mut no_dlq = queue(60);
    no_dlq.redrive = None;
    assert!(find(&off, Some(&facts(no_dlq)), c).is_none());
    // Offline it needs the queue's facts: skipped, and named.
    let report = evaluate(&off, None);
    assert!(report.findings.iter().all(|f| f.code != c));
    assert!(report.skipped.iter().any(|s| s.code == c));
}

#[test]
fn dead_letter_retention_too_short() {
    let c = codes::DEAD_LETTER_RETENTION_TOO_SHORT;
    let s = default_spec();
    let mut f = facts(queue(30));
    f.dead_letter = dlq(13, false);
    assert_eq!(
        find(&s, Some(&f), c).expect("fires below 14 days").severity,
        Severity::Warning
    );
    f.dead_letter = dlq(14, false);
    assert!(find(&s, Some(&f), c).is_none(), "boundary: 14 days");
    // shorter than the source's retention (which can only be at most 14 days on SQS; facts may say more)
    let mut long_src = queue(30);
    long_src.retention = Duration::from_secs(15 * DAY);
    let f2 = Facts {
        queue: long_src,
        dead_letter: dlq(14, false),
        oldest_age_seconds: None,
    };
    assert!(
        find(&s, Some(&f2), c)
            .expect("fires")
            .message
            .contains("shorter than the source")
    );
}

#[test]
fn dead_letter_queue_type_mismatch() {
    let c = codes::DEAD_LETTER_QUEUE_TYPE_MISMATCH;
    let s = default_spec();
    let mut fifo_src = queue(30);
    fifo_src.fifo = true;
    let f = Facts {
        queue: fifo_src.clone(),
        dead_letter: dlq(14, false),
        oldest_age_seconds: None,
    };
    assert_eq!(
        find(&s, Some(&f), c).expect("FIFO -> standard").severity,
        Severity::Error
    );
    let f = Facts {
        queue: queue(30),
        dead_letter: dlq(14, true),
        oldest_age_seconds: None,
    };
    assert!(
        find(&s, Some(&f), c)
            .expect("standard -> FIFO")
            .message
            .contains("standard queue redrives to a FIFO")
    );
    let f = Facts {
        queue: fifo_src,
        dead_letter: dlq(14, true),
        oldest_age_seconds: None,
    };
    assert!(find(&s, Some(&f), c).is_none());
}

#[test]
fn dead_letter_queue_missing() {
    let c = codes::DEAD_LETTER_QUEUE_MISSING;
    let s = default_spec();
    let f = Facts {
        queue: queue(30),
        dead_letter: DeadLetterFacts::Missing {
            arn: "arn:aws:sqs:us-east-1:1:dlq".into(),
        },
        oldest_age_seconds: None,
    };
    let got = find(&s, Some(&f), c).expect("fires");
    assert_eq!(got.severity, Severity::Error);
    assert!(got.recommendation.contains("arn:aws:sqs:us-east-1:1:dlq"));
    assert!(find(&s, Some(&facts(queue(30))), c).is_none());
}

#[test]
fn in_flight_ceiling_reachable() {
    let c = codes::IN_FLIGHT_CEILING_REACHABLE;
    // 100 running + up to one message a slot held ahead (a waiting batch of 10 and 90 still
    // waiting or on their way when the next receive goes out) = 200 per replica; 600 × 200 = 120,000.
    let at = spec("processing: {p99: 2s, concurrency: 100}\nscaling: {maxReplicas: 600}");
    assert!(find(&at, None, c).is_none(), "boundary: exactly 120,000");
    let over = spec("processing: {p99: 2s, concurrency: 100}\nscaling: {maxReplicas: 601}");
    let f = find(&over, None, c).expect("fires offline");
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.recommendation,
        "set scaling.maxReplicas to at most 600, or lower processing.concurrency"
    );
    // C = 10: 10 + 15 = 25 per replica, 4800 × 25 = 120,000.
    let ten = spec("processing: {p99: 2s, concurrency: 10}\nscaling: {maxReplicas: 4801}");
    assert_eq!(
        find(&ten, None, c).expect("fires offline").recommendation,
        "set scaling.maxReplicas to at most 4800, or lower processing.concurrency"
    );
    // Without the heartbeat nothing waits: exactly 120,000 at 1200 replicas.
    let no_hb = spec(
        "processing: {p99: 2s, concurrency: 100, heartbeat: {enabled: false}}\nscaling: {maxReplicas: 1200}",
    );
    assert!(find(&no_hb, None, c).is_none(), "boundary: exactly 120,000");
}

#[test]
fn short_polling() {
    let c = codes::SHORT_POLLING;
    let f = find(&spec("processing: {p99: 2s, waitTime: 0s}"), None, c).expect("fires");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        find(&spec("processing: {p99: 2s, waitTime: 1s}"), None, c).is_none(),
        "boundary: 1s is long polling"
    );
}

#[test]
fn poison_deleted() {
    let c = codes::POISON_DELETED;
    let f = find(&spec("processing: {p99: 2s, onPoison: delete}"), None, c).expect("fires");
    assert_eq!(f.severity, Severity::Warning);
    for quiet in ["deadLetter", "leave"] {
        let s = spec(&format!("processing: {{p99: 2s, onPoison: {quiet}}}"));
        assert!(find(&s, None, c).is_none(), "{quiet}");
    }
    assert!(
        find(&spec("processing: {p99: 2s}"), None, c).is_none(),
        "the default keeps poison"
    );
}

/// #40 item 7: under `unwrapSns: "on"` a message that is no notification is poison, so with
/// `onPoison: delete` switching raw delivery on deletes every message. Refused (an Error) by name.
#[test]
fn unwrap_sns_on_with_poison_deleted() {
    use crate::api::UnwrapSns;
    let c = codes::UNWRAP_SNS_POISON_DELETED;
    let with = |on_poison: &str, unwrap: UnwrapSns| {
        let mut s = spec(&format!("processing: {{p99: 2s{on_poison}}}"));
        s.handler.unwrap_sns = unwrap;
        s
    };
    let s = with(", onPoison: delete", UnwrapSns::On);
    let f = find(&s, None, c).expect("fires offline");
    assert_eq!(f.severity, Severity::Error);
    for field in [
        "handler.unwrapSns",
        "processing.onPoison",
        "raw message delivery",
    ] {
        assert!(f.message.contains(field), "{field}: {}", f.message);
    }
    assert!(
        f.recommendation.contains("\"auto\""),
        "{}",
        f.recommendation
    );
    assert!(
        f.recommendation.contains("deadLetter"),
        "{}",
        f.recommendation
    );
    assert!(evaluate(&s, None).has_errors());
    for (on_poison, unwrap) in [
        (", onPoison: delete", UnwrapSns::Auto),
        (", onPoison: delete", UnwrapSns::Off),
        (", onPoison: deadLetter", UnwrapSns::On),
        (", onPoison: leave", UnwrapSns::On),
        ("", UnwrapSns::On),
    ] {
        assert!(
            find(&with(on_poison, unwrap), None, c).is_none(),
            "{on_poison} {unwrap:?}"
        );
    }
}

#[test]
fn queue_region_contradicting_the_url() {
    let c = codes::QUEUE_REGION_CONTRADICTS_URL;
    let mut s = default_spec();
    s.queue.region = Some("eu-west-1".into());
    let f = find(&s, None, c).expect("fires offline");
    assert_eq!(f.severity, Severity::Error);
    assert!(
        f.message.contains("eu-west-1") && f.message.contains("us-east-1"),
        "{}",
        f.message
    );
    assert!(
        f.recommendation.contains("queue.region"),
        "{}",
        f.recommendation
    );
    s.queue.region = Some("us-east-1".into());
    assert!(find(&s, None, c).is_none(), "the same region");
    s.queue.region = None;
    assert!(find(&s, None, c).is_none(), "the region from the URL");
    // An emulator's URL names no region: any region picks the queue there.
    s.queue.url = "http://localhost:4566/000000000000/q".into();
    s.queue.region = Some("eu-west-1".into());
    assert!(find(&s, None, c).is_none(), "no region in the URL");
}

#[test]
fn offline_skips_exactly_the_rules_that_need_facts() {
    let r = evaluate(&default_spec(), None);
    let skipped: Vec<_> = r.skipped.iter().map(|s| s.code).collect();
    let mut expected: Vec<&str> = codes::QUEUE_RULES
        .iter()
        .chain(codes::DEAD_LETTER_RULES)
        .copied()
        .collect();
    assert_eq!(skipped, expected);
    // every code is offline or skipped, none twice
    expected.extend(codes::OFFLINE_RULES);
    expected.sort_unstable();
    let mut all = codes::ALL.to_vec();
    all.sort_unstable();
    assert_eq!(expected, all);
}

#[test]
fn unread_dead_letter_queue_skips_its_rules() {
    let f = Facts {
        queue: queue(30),
        dead_letter: DeadLetterFacts::NotRead {
            arn: "arn:aws:sqs:us-east-1:1:dlq".into(),
        },
        oldest_age_seconds: None,
    };
    let r = evaluate(&default_spec(), Some(&f));
    assert_eq!(
        r.skipped.iter().map(|s| s.code).collect::<Vec<_>>(),
        codes::DEAD_LETTER_RULES
    );
    assert!(r.findings.is_empty());
}

#[test]
fn backoff_doubles_and_caps() {
    let s = spec("processing: {p99: 2s, retryBackoff: {base: 5s, max: 15m}}");
    assert_eq!(backoff(&s, 1), Duration::from_secs(5));
    assert_eq!(backoff(&s, 2), Duration::from_secs(10));
    assert_eq!(backoff(&s, 8), Duration::from_secs(640));
    assert_eq!(backoff(&s, 9), Duration::from_secs(900));
    assert_eq!(backoff(&s, 500), Duration::from_secs(900));
    let huge = spec("processing: {p99: 2s, retryBackoff: {base: 1h, max: 100h}}");
    assert_eq!(backoff(&huge, 10), VISIBILITY_MAXIMUM);
}

#[test]
fn outage_hold_beyond_retention() {
    let c = codes::OUTAGE_HOLD_BEYOND_RETENTION;
    let mut q = with_receive_count(60, 5);
    // The default retention (4 days) outlives the worker's default hold (1 h); so does 2 h.
    assert!(find(&default_spec(), Some(&facts(q.clone())), c).is_none());
    q.retention = Duration::from_secs(2 * 3600);
    assert!(find(&default_spec(), Some(&facts(q.clone())), c).is_none());
    q.retention = Duration::from_secs(3600);
    let f = find(&default_spec(), Some(&facts(q.clone())), c).expect("1 h hold, 1 h retention");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.message.contains("no processing.outageTolerance"),
        "{}",
        f.message
    );
    assert!(
        f.recommendation
            .contains("set processing.outageTolerance below 1h"),
        "{}",
        f.recommendation
    );
    let short = spec("processing: {p99: 2s, outageTolerance: 59m}");
    assert!(
        find(&short, Some(&facts(q.clone())), c).is_none(),
        "a tolerance below retention"
    );
    let long = spec("processing: {p99: 2s, outageTolerance: 1h}");
    assert!(
        find(&long, Some(&facts(q.clone())), c).is_some(),
        "boundary: hold == retention"
    );
    let off = spec("processing: {p99: 2s, breaker: {enabled: false}}");
    assert!(
        find(&off, Some(&facts(q)), c).is_none(),
        "nothing is held with the breaker off"
    );
}

#[test]
fn alarm_action_in_another_region() {
    let c = codes::ALARM_ACTION_IN_ANOTHER_REGION;
    let mut s = default_spec();
    let here = "arn:aws:sns:us-east-1:123456789012:oncall".to_string();
    let there = "arn:aws:sns:eu-west-1:123456789012:oncall".to_string();
    s.dead_letter.alarm_actions = vec![here.clone()];
    assert!(find(&s, None, c).is_none(), "the queue's region");
    s.dead_letter.alarm_actions = vec![here, there.clone()];
    let f = find(&s, None, c).expect("fires offline");
    assert_eq!(f.severity, Severity::Error);
    assert!(
        f.message.contains(&there) && f.message.contains("us-east-1"),
        "{}",
        f.message
    );
    assert!(
        f.recommendation.contains("us-east-1"),
        "{}",
        f.recommendation
    );
    // The region given beside an emulator's URL is the alarm's.
    s.queue.url = "http://localhost:4566/000000000000/q".into();
    s.queue.region = Some("eu-west-1".into());
    s.dead_letter.alarm_actions = vec![there];
    assert!(find(&s, None, c).is_none());
}

#[test]
fn batch_mode_budgets_one_call_after_the_batch_fills() {
    // #32: 4 calls of up to 20 messages; a message waits up to maxWait for its batch, then one
    // call (p99 is a whole call's). A mean of 2s or more: the worker receives nothing ahead.
    let s: QueueConsumerSpec = serde_saphyr::from_str(
        "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\nhandler: {http: {}, batch: {maxItems: 20, maxWait: 3s}}\nprocessing: {p99: 10s, mean: 2s, concurrency: 4}\n",
    )
    .expect("test spec parses");
    assert_eq!(prefetch(&s), 0);
    assert_eq!(in_flight_per_replica(&s), 80);
    assert_eq!(message_slots(&s), 80);
    assert_eq!(budget(&s), Duration::from_secs(3 + 10 + 5));
    let low = codes_of(&s, Some(&facts(queue(15))));
    assert!(
        low.contains(&codes::VISIBILITY_TIMEOUT_BELOW_BUDGET.to_string()),
        "{low:?}"
    );
    assert!(codes_of(&s, Some(&facts(queue(18)))).is_empty());
    // Defaults: 10 items, 1s, 10 calls, no mean declared: up to half the calls' worth (5 × 10) may
    // be received ahead and wait for a running call (p99 2s) before their own.
    let d: QueueConsumerSpec = serde_saphyr::from_str(
        "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\nhandler: {http: {}, batch: {}}\nprocessing: {p99: 2s}\n",
    )
    .expect("test spec parses");
    assert_eq!(prefetch(&d), 50);
    assert_eq!(in_flight_per_replica(&d), 150);
    assert_eq!(message_slots(&d), 100);
    assert_eq!(budget(&d), Duration::from_secs(2 + 2 + 5));
    // maxWait longer than a call: the wait for the batch to fill is the longer one.
    let mut long_wait = d.clone();
    if let Some(b) = long_wait.handler.batch.as_mut() {
        b.max_wait = Duration::from_secs(4);
    }
    assert_eq!(budget(&long_wait), Duration::from_secs(4 + 2 + 5));
    // Nothing ahead on a FIFO queue or without heartbeats.
    let mut fifo = d.clone();
    fifo.queue.url = "https://sqs.us-east-1.amazonaws.com/1/q.fifo".into();
    assert_eq!(prefetch(&fifo), 0);
    assert_eq!(budget(&fifo), Duration::from_secs(1 + 2 + 5));
    let mut no_hb = d.clone();
    no_hb.processing.heartbeat.enabled = false;
    assert_eq!(prefetch(&no_hb), 0);
    assert_eq!(in_flight_per_replica(&no_hb), 100);
    // One call: one call's worth ahead.
    let mut one = d.clone();
    one.processing.concurrency = 1;
    assert_eq!(prefetch(&one), 10);
}

#[test]
fn pod_settings_the_restricted_standard_forbids_are_named() {
    // #29 item 4: privileged, root, host namespaces and paths, Unconfined seccomp/AppArmor.
    let s = spec(
        "template:\n  spec:\n    hostPID: true\n    securityContext: {runAsUser: 0, seccompProfile: {type: Unconfined}}\n    volumes: [{name: logs, hostPath: {path: /var/log}}]\n    initContainers: [{name: setup, image: x, securityContext: {appArmorProfile: {type: Unconfined}}}]\n    containers:\n      - {name: app, image: x, securityContext: {privileged: true, runAsUser: 0}}\n      - {name: side, image: x, securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}}\nprocessing: {p99: 2s}\n",
    );
    let report = evaluate(&s, None);
    let f = report
        .findings
        .iter()
        .find(|f| f.code == codes::POD_NOT_RESTRICTED)
        .expect("a PodNotRestricted finding");
    assert_eq!(f.severity, Severity::Warning);
    for named in [
        "template.spec.hostPID: true",
        "template.spec.securityContext.runAsUser: 0",
        "template.spec.securityContext.seccompProfile: Unconfined",
        "template.spec.volumes[logs]: hostPath",
        "template.spec.initContainers[setup].securityContext.appArmorProfile: Unconfined",
        "template.spec.containers[app].securityContext.privileged: true",
        "template.spec.containers[app].securityContext.runAsUser: 0",
    ] {
        assert!(f.message.contains(named), "{named} missing: {}", f.message);
    }
    // side sets runAsNonRoot and seccomp itself; what it leaves out is named (issue 42, F2).
    assert!(
        f.message.contains(
            "template.spec.containers[side].securityContext.allowPrivilegeEscalation: not false"
        ),
        "{}",
        f.message
    );
    assert!(
        !f.message.contains("[side].securityContext.runAsNonRoot"),
        "{}",
        f.message
    );
    assert!(
        !f.message.contains("[side].securityContext.seccompProfile"),
        "{}",
        f.message
    );
}

#[test]
fn the_http_layout_s_containers_must_state_what_restricted_asks_for() {
    // Issue 42, F2: the http layout leaves the user's containers as written, so a plain one is refused
    // by a namespace enforcing restricted, and each missing field is named.
    let plain =
        spec("template: {spec: {containers: [{name: app, image: x}]}}\nprocessing: {p99: 2s}\n");
    let report = evaluate(&plain, None);
    let f = report
        .findings
        .iter()
        .find(|f| f.code == codes::POD_NOT_RESTRICTED)
        .expect("a PodNotRestricted finding");
    for named in [
        "containers[app].securityContext.allowPrivilegeEscalation: not false",
        "containers[app].securityContext.capabilities.drop: without ALL",
        "containers[app].securityContext.runAsNonRoot: not true",
        "containers[app].securityContext.seccompProfile: unset",
    ] {
        assert!(f.message.contains(named), "{named} missing: {}", f.message);
    }
    // Stated at the pod level, runAsNonRoot and seccomp count for every container.
    let stated = spec(
        "template:\n  spec:\n    securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}\n    containers: [{name: app, image: x, securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}}]\nprocessing: {p99: 2s}\n",
    );
    assert!(
        !evaluate(&stated, None)
            .findings
            .iter()
            .any(|f| f.code == codes::POD_NOT_RESTRICTED)
    );
    // The exec layout: render fills the handler container's fields; a sidecar is the user's.
    let exec: QueueConsumerSpec = serde_saphyr::from_str(
        "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\nhandler: {exec: {command: [/h]}}\ntemplate: {spec: {containers: [{name: app, image: x}, {name: side, image: y}]}}\nprocessing: {p99: 2s}\n",
    )
    .expect("test spec parses");
    let f = evaluate(&exec, None)
        .findings
        .into_iter()
        .find(|f| f.code == codes::POD_NOT_RESTRICTED)
        .expect("the sidecar's finding");
    assert!(!f.message.contains("[app]"), "{}", f.message);
    assert!(
        f.message
            .contains("containers[side].securityContext.allowPrivilegeEscalation"),
        "{}",
        f.message
    );
}

#[test]
fn max_rate_below_backlog_fires_on_a_backlog_the_rate_cannot_drain_in_time() {
    // 20/s × 1m drains 1200.
    let s = spec("processing: {p99: 2s, maxRate: 20}\nscaling: {maxBacklogAge: 1m}");
    let mut q = queue(30);
    q.visible = Some(1200);
    assert!(
        !codes_of(&s, Some(&facts(q.clone()))).contains(&codes::MAX_RATE_BELOW_BACKLOG.to_string())
    );
    q.visible = Some(4987);
    let report = evaluate(&s, Some(&facts(q)));
    let f = report
        .findings
        .iter()
        .find(|f| f.code == codes::MAX_RATE_BELOW_BACKLOG)
        .expect("fires");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.message.contains("about 5000 messages takes 250s"),
        "{}",
        f.message
    );
    assert!(
        f.message.contains("processing.maxRate 20/s"),
        "{}",
        f.message
    );
    assert!(
        f.recommendation.contains(
            "raise processing.maxRate to at least 84, or scaling.maxBacklogAge to at least 250s"
        ),
        "{}",
        f.recommendation
    );
}

#[test]
fn max_rate_below_backlog_offline_uses_the_activation_backlog() {
    let fires = |yaml: &str| {
        codes_of(&spec(yaml), None).contains(&codes::MAX_RATE_BELOW_BACKLOG.to_string())
    };
    assert!(!fires(
        "processing: {p99: 2s, maxRate: 1}\nscaling: {maxBacklogAge: 1m, activationBacklog: 60}"
    ));
    assert!(fires(
        "processing: {p99: 2s, maxRate: 1}\nscaling: {maxBacklogAge: 1m, activationBacklog: 61}"
    ));
    // No maxRate: never.
    assert!(!fires(
        "processing: {p99: 2s}\nscaling: {activationBacklog: 100000}"
    ));
}

#[test]
fn two_digits_up_rounds_up() {
    assert_eq!(two_digits_up(7), 7);
    assert_eq!(two_digits_up(99), 99);
    assert_eq!(two_digits_up(100), 100);
    assert_eq!(two_digits_up(1201), 1300);
    assert_eq!(two_digits_up(4987), 5000);
}

#[test]
fn filter_pattern_invalid_names_the_pattern_and_the_position() {
    let c = codes::FILTER_PATTERN_INVALID;
    let ok =
        spec("processing: {p99: 2s}\nfilter: {patterns: ['{\"body\": {\"type\": [\"order\"]}}']}");
    assert!(!codes_of(&ok, None).contains(&c.to_string()));
    let bad = spec(
        "processing: {p99: 2s}\nfilter: {patterns: ['{\"body\": [\"x\"]}', '{\"body\": {\"n\": [{\"numeric\": [\">\", 5, \"<\", 1]}]}}']}",
    );
    let r = evaluate(&bad, None);
    let f = r
        .findings
        .iter()
        .find(|f| f.code == c)
        .expect("the finding");
    assert_eq!(f.severity, Severity::Error);
    assert!(
        f.message
            .contains("filter.patterns[1] at body.n[0].numeric"),
        "{}",
        f.message
    );
    assert!(has_errors(&r.findings));
}

#[test]
fn filter_on_backlog_only_with_a_filter_and_messages_waiting() {
    let with = spec("processing: {p99: 2s}\nfilter: {patterns: ['{\"body\": [\"x\"]}']}");
    let mut q = queue(30);
    assert_eq!(filter_on_backlog(&with, &q), None, "empty queue");
    q.delayed = Some(3);
    q.in_flight = Some(2);
    let f = filter_on_backlog(&with, &q).expect("a backlog");
    assert_eq!(f.code, codes::FILTER_ON_BACKLOG);
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.message.contains("about 5 message"), "{}", f.message);
    assert_eq!(filter_on_backlog(&default_spec(), &q), None, "no filter");
}

fn fifo_spec(yaml: &str) -> QueueConsumerSpec {
    let base =
        "queue: {url: https://sqs.us-east-1.amazonaws.com/1/orders.fifo}\nhandler: {http: {}}\n";
    serde_saphyr::from_str(&format!("{base}{yaml}")).expect("test spec parses")
}

#[test]
fn fifo_parallelism_above_the_declared_groups_warns_with_the_cap() {
    // 8 groups: 10 useful slots; concurrency 2 → 5 replicas.
    let s = fifo_spec(
        "processing: {p99: 2s, concurrency: 2}\nscaling: {maxReplicas: 20, messageGroups: 8}",
    );
    let r = evaluate(&s, None);
    let f = r
        .findings
        .iter()
        .find(|f| f.code == codes::FIFO_PARALLELISM_ABOVE_GROUPS)
        .expect("finding");
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.message.contains("20 × 2 message slots = 40"),
        "{}",
        f.message
    );
    assert!(f.message.contains("keep at most 10 busy"), "{}", f.message);
    assert!(
        f.recommendation.contains("lower scaling.maxReplicas to 5"),
        "{}",
        f.recommendation
    );
    // At the cap: quiet; no declared groups: quiet; a standard queue: quiet.
    let quiet = |s: &QueueConsumerSpec| {
        !codes_of(s, None).contains(&codes::FIFO_PARALLELISM_ABOVE_GROUPS.to_string())
    };
    assert!(quiet(&fifo_spec(
        "processing: {p99: 2s, concurrency: 2}\nscaling: {maxReplicas: 5, messageGroups: 8}"
    )));
    assert!(quiet(&fifo_spec(
        "processing: {p99: 2s, concurrency: 2}\nscaling: {maxReplicas: 20}"
    )));
    assert!(quiet(&spec(
        "processing: {p99: 2s, concurrency: 2}\nscaling: {maxReplicas: 20, messageGroups: 8}"
    )));
}

#[test]
fn a_max_rate_above_the_fifo_limit_warns() {
    let fires = |s: &QueueConsumerSpec| {
        codes_of(s, None).contains(&codes::FIFO_RATE_ABOVE_LIMIT.to_string())
    };
    assert!(!fires(&fifo_spec("processing: {p99: 2s, maxRate: 3000}")));
    assert!(fires(&fifo_spec("processing: {p99: 2s, maxRate: 3001}")));
    let small = fifo_spec("processing: {p99: 2s, maxRate: 400, batchSize: 1}");
    let f = evaluate(&small, None)
        .findings
        .into_iter()
        .find(|f| f.code == codes::FIFO_RATE_ABOVE_LIMIT)
        .expect("finding");
    assert!(f.message.contains("= 300 messages/s"), "{}", f.message);
    assert!(
        f.recommendation
            .contains("raise processing.batchSize to 10"),
        "{}",
        f.recommendation
    );
    assert!(
        !fires(&spec("processing: {p99: 2s, maxRate: 9000}")),
        "standard queues have no such limit"
    );
}

/// Scale-only mode: the user's own consumer holds the messages. No heartbeat of ours extends their
/// visibility, so the budget is the one without it (an Error, not the heartbeat's Warning), and the
/// bundled worker's own settings raise nothing.
#[test]
fn scale_only_assumes_no_heartbeat_and_skips_the_workers_own_rules() {
    let scale_only = |yaml: &str| -> QueueConsumerSpec {
        let base = "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\nscaleTargetRef: {name: legacy}\n";
        serde_saphyr::from_str(&format!("{base}{yaml}")).expect("test spec parses")
    };
    let c = codes::VISIBILITY_TIMEOUT_BELOW_BUDGET;
    let hb = "processing: {p99: 2s, heartbeat: {interval: 1s}}";
    assert_eq!(
        find(&spec(hb), Some(&facts(queue(6))), c)
            .expect("fires")
            .severity,
        Severity::Warning
    );
    let so = scale_only(hb);
    assert_eq!(so.mode_conflict(), None);
    assert_eq!(
        find(&so, Some(&facts(queue(6))), c)
            .expect("fires")
            .severity,
        Severity::Error,
        "scale-only: no heartbeat"
    );
    // The breaker off is the bundled worker's setting: BreakerDisabled fires only there.
    let off = "processing: {p99: 2s, breaker: {enabled: false}}";
    let dlq = facts(with_receive_count(60, 5));
    assert!(find(&spec(off), Some(&dlq), codes::BREAKER_DISABLED).is_some());
    assert!(find(&scale_only(off), Some(&dlq), codes::BREAKER_DISABLED).is_none());
    // The queue's own rules still run: no redrive policy is found in both modes.
    let mut no_dlq = queue(60);
    no_dlq.redrive = None;
    assert!(
        find(
            &scale_only("processing: {p99: 2s}"),
            Some(&facts(no_dlq)),
            codes::NO_REDRIVE_POLICY
        )
        .is_some()
    );
}

#[test]
fn the_modes_conflict_is_named_with_its_fields() {
    let neither: QueueConsumerSpec = serde_saphyr::from_str(
        "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\nprocessing: {p99: 2s}\n",
    )
    .expect("parses");
    let (field, message, fix) = neither.mode_conflict().expect("neither mode");
    assert_eq!(field, "spec.handler");
    assert!(
        message.contains("neither handler nor scaleTargetRef"),
        "{message}"
    );
    assert!(fix.contains("scaleTargetRef"), "{fix}");
    let both: QueueConsumerSpec = serde_saphyr::from_str(
        "queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\nprocessing: {p99: 2s}\nhandler: {http: {}}\nscaleTargetRef: {kind: StatefulSet, name: legacy}\nfilter: {patterns: ['{}']}\nidempotency: {store: memory}\n",
    )
    .expect("parses");
    let (field, message, _) = both.mode_conflict().expect("both modes");
    assert_eq!(field, "spec.scaleTargetRef");
    assert!(
        message.contains("StatefulSet/legacy")
            && message.contains("handler, filter, idempotency.store"),
        "{message}"
    );
    assert_eq!(spec("processing: {p99: 2s}").mode_conflict(), None);
}

/// `check`'s own reading of the CRD's patterns for `scaleTargetRef` (its CEL validator runs none).
#[test]
fn scale_target_ref_fields_are_checked_as_the_crd_patterns_do() {
    let t = |api_version: &str, kind: &str, name: &str| crate::api::ScaleTargetRef {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
    };
    for ok in [
        t("apps/v1", "Deployment", "orders"),
        t("argoproj.io/v1alpha1", "Rollout", "orders.canary-2"),
        t("v1", "ReplicationController", "a"),
        t("example.org/v2beta3", "Consumer", "x"),
    ] {
        assert_eq!(ok.errors(), vec![], "{ok:?}");
    }
    for (bad, field) in [
        (
            t("apps/v1", "Deployment", "Bad_Name"),
            "spec.scaleTargetRef.name",
        ),
        (t("apps/v1", "Deployment", ""), "spec.scaleTargetRef.name"),
        (t("apps/v1", "Deployment", "-x"), "spec.scaleTargetRef.name"),
        (t("apps/v1", "deployment", "x"), "spec.scaleTargetRef.kind"),
        (t("apps/v1", "Deploy-ment", "x"), "spec.scaleTargetRef.kind"),
        (
            t("apps/1", "Deployment", "x"),
            "spec.scaleTargetRef.apiVersion",
        ),
        (
            t("apps/v1gamma1", "Deployment", "x"),
            "spec.scaleTargetRef.apiVersion",
        ),
        (
            t("apps/valpha", "Deployment", "x"),
            "spec.scaleTargetRef.apiVersion",
        ),
        (
            t("Apps/v1", "Deployment", "x"),
            "spec.scaleTargetRef.apiVersion",
        ),
    ] {
        let errors = bad.errors();
        assert!(
            errors.len() == 1 && errors[0].0 == field && errors[0].1.contains("e.g."),
            "{bad:?}: {errors:?}"
        );
    }
}

#[test]
fn an_objective_shorter_than_a_start_from_zero_is_a_warning() {
    let c = codes::OBJECTIVE_BELOW_ACTIVATION;
    // dwell from zero at these settings: 2 × 15s + 30s + 2s = 62s
    for (scaling, fires) in [
        ("{objective: {dwellP99: 61s}}", true),
        ("{objective: {dwellP99: 62s}}", false),
        ("{objective: {dwellP99: 10s}, minReplicas: 1}", false),
        ("{objective: {dwellP99: 40s}, pollInterval: 2s}", false),
        ("{objective: {dwellP99: 30s}, pollInterval: 2s}", true),
        ("{}", false),
    ] {
        let s = spec(&format!("processing: {{p99: 2s}}\nscaling: {scaling}"));
        let f = find(&s, None, c);
        assert_eq!(f.is_some(), fires, "{scaling}: {f:?}");
        if let Some(f) = f {
            assert_eq!(f.severity, Severity::Warning);
            assert!(
                f.recommendation.contains("minReplicas to 1")
                    && f.recommendation.contains("dwellP99 to at least"),
                "{}",
                f.recommendation
            );
        }
    }
}
