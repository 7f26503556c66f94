use std::collections::HashMap;

use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::api::{Finding, Severity};
use crate::aws::{ObserveError, QueueFacts, SqsError};

/// A rollout that applies (the Deployment itself does not matter to these tests).
fn apply() -> Rollout {
    Rollout::Apply(Box::default())
}

const URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders";
const DLQ_URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders-dlq";

fn qc(enforce: bool) -> QueueConsumer {
    let mut qc: QueueConsumer = serde_json::from_value(json!({
        "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u1", "generation": 4},
        "spec": {"queue": {"url": URL}, "processing": {"p99": "2s"},
                 "handler": {"http": {}}, "validation": {"enforce": enforce},
                 "template": {"spec": {"containers": [{"name": "app", "image": "x"}]}}}
    }))
    .unwrap();
    qc.metadata.generation = Some(4);
    qc
}

fn queue(url: &str, visible: i64) -> QueueFacts {
    let attrs: HashMap<String, String> = [
        ("VisibilityTimeout", "60"),
        ("MessageRetentionPeriod", "345600"),
        ("ApproximateNumberOfMessages", &visible.to_string()),
        ("ApproximateNumberOfMessagesNotVisible", "2"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    QueueFacts::from_attributes(url, &attrs).unwrap()
}

fn facts(dead_letter: DeadLetterFacts) -> Facts {
    Facts {
        queue: queue(URL, 7),
        dead_letter,
        oldest_age_seconds: None,
    }
}

fn dlq(visible: i64, age: Option<i64>) -> DeadLetterFacts {
    DeadLetterFacts::Found {
        queue: queue(DLQ_URL, visible),
        oldest_age_seconds: age,
    }
}

fn at(secs: i64) -> Time {
    Time(Timestamp::from_second(secs).unwrap())
}

fn available_deployment(replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "orders"},
        "spec": {"replicas": replicas, "selector": {}, "template": {}},
        "status": {"replicas": replicas, "updatedReplicas": replicas, "readyReplicas": replicas,
                   "availableReplicas": replicas,
                   "conditions": [{"type": "Available", "status": "True"}]}
    }))
    .unwrap()
}

struct Built {
    status: QueueConsumerStatus,
}

impl Built {
    fn cond(&self, t: &str) -> &Condition {
        self.status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no condition {t}"))
    }
}

/// The status of an applied rollout over queue facts that were read, with no findings.
fn build_read(qc: &QueueConsumer, f: &Facts, deployment: Option<&Deployment>, now: Time) -> Built {
    build_with(
        qc,
        Observation::Read(f),
        &Report::default(),
        apply(),
        deployment,
        now,
    )
}

fn build_with(
    qc: &QueueConsumer,
    obs: Observation<'_>,
    report: &Report,
    rollout: Rollout,
    deployment: Option<&Deployment>,
    now: Time,
) -> Built {
    Built {
        status: build(&StatusInputs {
            qc,
            facts: obs,
            report,
            rollout: &rollout,
            deployment,
            target: None,
            applied: None,
            alarm: AlarmStatus::default(),
            replicas: &ReplicaDecision::Keep,
            scaled_at: None,
            sampled_at: Some(now.clone()),
            redrive: None,
            redrive_after_recovery: None,
            workers: None,
            now,
        }),
    }
}

#[test]
fn conditions_per_dead_letter_state() {
    let q = qc(false);
    let d = available_deployment(2);
    let report = Report::default();
    let cases: [(&str, DeadLetterFacts, &str, &str, &[&str]); 5] = [
        (
            "messages",
            dlq(3, Some(600)),
            "False",
            "MessagesInDeadLetterQueue",
            &["3 message(s)", DLQ_URL, "10m"],
        ),
        (
            "empty",
            dlq(0, None),
            "True",
            "DeadLetterQueueEmpty",
            &[DLQ_URL],
        ),
        (
            "none",
            DeadLetterFacts::None,
            "False",
            "NoDeadLetterQueue",
            &["no redrive policy"],
        ),
        (
            "missing",
            DeadLetterFacts::Missing {
                arn: "arn:aws:sqs:us-east-1:1:gone".into(),
            },
            "False",
            "NoDeadLetterQueue",
            &["arn:aws:sqs:us-east-1:1:gone"],
        ),
        (
            "unreachable",
            DeadLetterFacts::Unreachable {
                arn: "arn:x".into(),
                error: "denied".into(),
            },
            "Unknown",
            "DeadLetterQueueUnreachable",
            &["denied"],
        ),
    ];
    for (name, dl, status, reason, needles) in cases {
        let f = facts(dl);
        let b = build_with(
            &q,
            Observation::Read(&f),
            &report,
            apply(),
            Some(&d),
            at(100),
        );
        let c = b.cond("DeadLetterQueueHealthy");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (status, reason),
            "{name}"
        );
        for n in needles {
            assert!(c.message.contains(n), "{name}: {:?} lacks {n}", c.message);
        }
        assert_eq!(c.observed_generation, Some(4));
        // DLQ health never gates Ready.
        assert_eq!(b.cond("Ready").status, "True", "{name}");
    }
}

#[test]
fn unreachable_queue_holds_and_keeps_last_numbers() {
    let mut q = qc(false);
    let f = facts(dlq(1, None));
    let first = build_read(&q, &f, None, at(100));
    q.status = Some(first.status.clone());
    let err = ObserveError::ReadQueueAttributes {
        url: URL.into(),
        source: SqsError::QueueDoesNotExist { target: URL.into() },
    };
    let d = available_deployment(3);
    let b = build_with(
        &q,
        Observation::Failed(&err),
        &Report::default(),
        Rollout::HeldQueueUnreachable { render: Ok(()) },
        Some(&d),
        at(200),
    );
    let c = b.cond("QueueReachable");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "QueueDoesNotExist")
    );
    assert!(c.message.contains("left as they are"), "{}", c.message);
    assert_eq!(b.cond("Ready").reason, "QueueUnreachable");
    assert_eq!(b.cond("DeadLetterQueueHealthy").status, "Unknown");
    let s = b.cond("ScalingActive");
    assert_eq!(
        (s.status.as_str(), s.reason.as_str()),
        ("False", "MetricsUnavailable")
    );
    assert!(s.message.contains("held at 3"), "{}", s.message);
    assert_eq!(
        b.status.queue, first.status.queue,
        "last known numbers kept"
    );
    assert_eq!(b.status.queue.as_ref().unwrap().sampled_at, Some(at(100)));
    assert_eq!(b.status.dead_letter.as_ref().unwrap().visible, Some(1));
}

#[test]
fn enforce_holds_rollout_and_says_so() {
    let q = qc(true);
    let f = facts(dlq(0, None));
    let report = Report {
        findings: vec![Finding {
            code: "VisibilityTimeoutBelowBudget".into(),
            severity: Severity::Error,
            message: "VT 10s is below the budget 25s".into(),
            recommendation: "set VisibilityTimeout to at least 25s".into(),
        }],
        skipped: vec![],
    };
    let b = build_with(
        &q,
        Observation::Read(&f),
        &report,
        Rollout::HeldByValidation,
        None,
        at(1),
    );
    let c = b.cond("ConfigValid");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "VisibilityTimeoutBelowBudget")
    );
    assert!(c.message.contains("rollout held"), "{}", c.message);
    assert_eq!(b.cond("ScalingActive").reason, "HeldByValidation");
    assert_eq!(b.cond("Ready").reason, "ConfigInvalid");
    assert_eq!(b.status.findings, report.findings);
}

#[test]
fn transition_time_moves_only_on_a_flip() {
    let mut q = qc(false);
    let d = available_deployment(1);
    let f = facts(dlq(0, None));
    let first = build_read(&q, &f, Some(&d), at(100));
    q.status = Some(first.status.clone());
    let same = build_read(&q, &f, Some(&d), at(200));
    assert!(same_ignoring_time(&first.status, &same.status));
    assert_eq!(
        same.cond("DeadLetterQueueHealthy").last_transition_time,
        at(100)
    );
    assert!(transitions(&first.status.conditions, &same.status.conditions).is_empty());

    let f2 = facts(dlq(5, None));
    let flipped = build_read(&q, &f2, Some(&d), at(300));
    assert!(!same_ignoring_time(&first.status, &flipped.status));
    assert_eq!(
        flipped.cond("DeadLetterQueueHealthy").last_transition_time,
        at(300)
    );
    assert_eq!(flipped.cond("Ready").last_transition_time, at(100));
    let t = transitions(&first.status.conditions, &flipped.status.conditions);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].reason, "MessagesInDeadLetterQueue");
    assert!(t[0].warning);
}

#[test]
fn sampled_at_stays_while_numbers_stay() {
    let mut q = qc(false);
    let f = facts(dlq(0, None));
    let first = build_read(&q, &f, None, at(100));
    q.status = Some(first.status.clone());
    let again = build_read(&q, &f, None, at(200));
    assert_eq!(again.status.queue.unwrap().sampled_at, Some(at(100)));
}

#[test]
fn first_healthy_reconcile_is_no_news() {
    let q = qc(false);
    let d = available_deployment(1);
    let f = facts(dlq(0, None));
    let b = build_read(&q, &f, Some(&d), at(1));
    let t = transitions(&[], &b.status.conditions);
    assert!(t.is_empty(), "{t:?}");
    assert_eq!(b.status.replicas, Some(1));
    assert_eq!(
        b.status.selector.as_deref(),
        Some("app.kubernetes.io/instance=orders,app.kubernetes.io/name=qc-worker")
    );
    assert_eq!(b.status.queue.as_ref().unwrap().visible, Some(7));
    assert_eq!(b.status.queue.as_ref().unwrap().in_flight, Some(2));
}

#[test]
fn ready_needs_an_available_deployment_or_zero_replicas() {
    let q = qc(false);
    let f = facts(dlq(0, None));
    let mut unavailable = available_deployment(2);
    unavailable.status = None;
    let b = build_read(&q, &f, Some(&unavailable), at(1));
    assert_eq!(b.cond("Ready").reason, "DeploymentUnavailable");
    let mut zero = available_deployment(0);
    zero.status = None;
    let b = build_read(&q, &f, Some(&zero), at(1));
    assert_eq!(b.cond("Ready").status, "True");
    assert_eq!(b.cond("ScalingActive").reason, "ScaledToZero");
}

fn scale_decision(
    qc: &QueueConsumer,
    samples: &[(u64, u64)],
    current: u32,
) -> (ReplicaDecision, crate::scaling::Decision) {
    use crate::scaling::{History, Sample, Timestamp, decide_for};
    let mut h = History::new(crate::api::Duration::from_secs(600));
    for (i, (visible, in_flight)) in samples.iter().enumerate() {
        h.push(Sample {
            visible: *visible,
            in_flight: *in_flight,
            delayed: 0,
            deleted: None,
            oldest_age: None,
            at: Timestamp::from_secs(100 + i as u64),
        })
        .unwrap();
    }
    let now = Timestamp::from_secs(100 + samples.len() as u64);
    let decision = decide_for(
        &qc.spec,
        &h,
        current,
        crate::scaling::Downstream::default(),
        now,
    );
    (
        ReplicaDecision::Scale {
            current,
            decision: decision.clone(),
        },
        decision,
    )
}

#[test]
fn scaling_active_and_desired_replicas_follow_the_decision() {
    type Case<'a> = (&'a [(u64, u64)], u32, &'a str, &'a str, i32);
    let mut q = qc(false);
    q.spec.scaling.max_replicas = 4;
    let f = facts(DeadLetterFacts::None);
    let report = Report::default();
    let d = available_deployment(2);
    let build_scale = |replicas: &ReplicaDecision, scaled_at: Option<Time>| {
        build(&StatusInputs {
            qc: &q,
            facts: Observation::Read(&f),
            report: &report,
            rollout: &apply(),
            deployment: Some(&d),
            target: None,
            applied: None,
            alarm: AlarmStatus::default(),
            replicas,
            scaled_at,
            sampled_at: Some(at(100)),
            redrive: None,
            redrive_after_recovery: None,
            workers: None,
            now: at(100),
        })
    };
    let cond = |s: &QueueConsumerStatus| {
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == "ScalingActive")
            .unwrap()
            .clone();
        (c.status, c.reason, c.message)
    };
    // P 2s, C 10, T 60s: 300 visible per replica. Cases: (samples, current, status, reason, desired).
    let cases: [Case; 4] = [
        (&[(600, 20)], 2, "True", "Scaling", 4),
        (&[(6000, 0)], 2, "True", "AtMaxReplicas", 4),
        (&[(0, 0), (0, 0)], 0, "True", "ScaledToZero", 0),
        (&[], 2, "False", "MetricsUnavailable", 2),
    ];
    for (samples, current, status, reason, desired) in cases {
        let (rd, decision) = scale_decision(&q, samples, current);
        let s = build_scale(&rd, None);
        let (st, r, m) = cond(&s);
        assert_eq!(
            (st.as_str(), r.as_str()),
            (status, reason),
            "{samples:?}: {m}"
        );
        assert_eq!(m, decision.to_string());
        assert_eq!(s.desired_replicas, Some(desired), "{samples:?}");
    }
    // lastScaleTime: set when the scaler wrote, kept otherwise.
    let (rd, _) = scale_decision(&q, &[(600, 20)], 2);
    let written = build_scale(&rd, Some(at(100)));
    assert_eq!(written.last_scale_time, Some(at(100)));
    let mut later = q.clone();
    later.status = Some(written);
    let kept = build(&StatusInputs {
        qc: &later,
        facts: Observation::Read(&f),
        report: &report,
        rollout: &apply(),
        deployment: Some(&d),
        target: None,
        applied: None,
        alarm: AlarmStatus::default(),
        replicas: &rd,
        scaled_at: None,
        sampled_at: Some(at(130)),
        redrive: None,
        redrive_after_recovery: None,
        workers: None,
        now: at(130),
    });
    assert_eq!(kept.last_scale_time, Some(at(100)));
}

#[test]
fn conditions_only_other_managers_own_are_foreign() {
    let meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
        serde_json::from_value(json!({"managedFields": [
            {"manager": "qc-operator", "operation": "Apply", "subresource": "status",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {
                "k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}},
                "k:{\"type\":\"Shared\"}": {".": {}}}}}},
            {"manager": "checker", "operation": "Apply", "subresource": "status",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {
                "k:{\"type\":\"ExternalCheck\"}": {".": {}},
                "k:{\"type\":\"Shared\"}": {"f:message": {}}}}}},
            {"manager": "kubectl", "operation": "Update",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:queue": {}}}}
        ]}))
        .unwrap();
    let foreign: Vec<String> = foreign_condition_types(&meta, "qc-operator")
        .into_iter()
        .collect();
    assert_eq!(foreign, ["ExternalCheck"]);
    // Without managedFields (an object read from elsewhere) nothing is foreign.
    assert!(
        foreign_condition_types(
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::default(),
            "qc-operator"
        )
        .is_empty()
    );
}

#[test]
fn a_window_that_moved_by_the_scrapes_jitter_is_no_reason_to_write() {
    let observed = |window_ms: u64, rate: f64| QueueConsumerStatus {
        observed: Some(crate::api::ObservedStatus {
            messages_per_second: Some(rate),
            pods: Some(1),
            window: Some(std::time::Duration::from_millis(window_ms).into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(same_ignoring_time(
        &observed(60_012, 0.0),
        &observed(59_987, 0.0)
    ));
    assert!(!same_ignoring_time(
        &observed(60_012, 0.0),
        &observed(60_012, 2.5)
    ));
}

/// What the pods said at one scrape of a steady busy consumer: P99 about 1.5 s, mean about 0.8 s,
/// about 40 messages a second, 10 in flight, moving a little at every scrape.
fn busy(p99: f64, mean: f64, rate: f64, in_flight: i64, at_secs: i64) -> Workers {
    Workers {
        stats: Some(Stats {
            p99_seconds: Some(p99),
            mean_seconds: Some(mean),
            messages_per_second: rate,
            messages: (rate * 60.0) as u64,
            window: Duration::from_secs(60),
        }),
        pods: 2,
        unreachable: 0,
        in_flight,
        breaker_open: 0,
        sampled_at: Some(at(at_secs)),
        crash_looping: vec![],
        warming_up: false,
        fifo: None,
        dwell: None,
    }
}

/// The status built for an available Deployment over an idle queue whose pods said `w` at
/// `now_secs`.
fn running(q: &QueueConsumer, w: &Workers, now_secs: i64) -> QueueConsumerStatus {
    let f = facts(dlq(0, None));
    let d = available_deployment(2);
    let report = Report::default();
    build(&StatusInputs {
        qc: q,
        facts: Observation::Read(&f),
        report: &report,
        rollout: &apply(),
        deployment: Some(&d),
        target: None,
        applied: None,
        alarm: AlarmStatus::default(),
        replicas: &ReplicaDecision::Keep,
        scaled_at: None,
        sampled_at: Some(at(now_secs)),
        redrive: None,
        redrive_after_recovery: None,
        workers: Some(w),
        now: at(now_secs),
    })
}

/// One reconcile's status step as `reconcile` runs it: the dead-band on what the pods said, then
/// build; the status goes back onto the object when it differs (ignoring time), as the write does.
/// Returns whether it would have been written.
fn reconcile_status(q: &mut QueueConsumer, w: Workers, now_secs: i64) -> bool {
    let w = dead_band(q, w);
    let new = running(q, &w, now_secs);
    let old = q.status.clone().unwrap_or_default();
    let write = !same_ignoring_time(&old, &new);
    if write {
        q.status = Some(new);
    }
    write
}

#[test]
fn a_restarted_controller_keeps_the_observed_numbers_until_it_has_scraped_an_interval() {
    // Status as the previous controller process left it: a full window, the verdict True.
    let mut q = qc(false);
    assert!(reconcile_status(&mut q, busy(1.52, 0.81, 40.2, 10, 0), 0));
    let before = q.status.clone().unwrap();
    // This process's first scrape (no rate yet), then its warm-up scrape 5 s later (a rate over a
    // few seconds): neither flips the condition to NoObservations nor rewrites the numbers.
    let first = Workers {
        stats: None,
        warming_up: true,
        ..busy(0.0, 0.0, 0.0, 12, 20)
    };
    assert!(
        !reconcile_status(&mut q, first, 20),
        "the first scrape after a restart wrote status"
    );
    let warm = Workers {
        stats: Some(Stats {
            p99_seconds: Some(0.9),
            mean_seconds: Some(0.5),
            messages_per_second: 12.0,
            messages: 12,
            window: Duration::from_secs(5),
        }),
        warming_up: true,
        ..busy(0.0, 0.0, 0.0, 12, 25)
    };
    assert!(!reconcile_status(&mut q, warm, 25));
    assert_eq!(q.status.as_ref(), Some(&before));
    // A pod that went away shows at once, warming up or not.
    let fewer = Workers {
        stats: None,
        pods: 1,
        warming_up: true,
        ..busy(0.0, 0.0, 0.0, 5, 30)
    };
    assert!(reconcile_status(&mut q.clone(), fewer, 30));
    // Numbers older than the refresh are not held: the truth (no window yet) is written.
    let late = Workers {
        stats: None,
        warming_up: true,
        ..busy(0.0, 0.0, 0.0, 10, 400)
    };
    assert!(reconcile_status(&mut q, late, 400));
}

#[test]
fn a_steady_busy_consumer_is_not_rewritten_but_a_real_change_is() {
    let mut q = qc(false);
    // First sight: written.
    assert!(reconcile_status(&mut q, busy(1.52, 0.81, 40.2, 10, 0), 0));
    let first = q.status.clone().unwrap();
    assert_eq!(
        first.observed.as_ref().unwrap().p99_seconds,
        Some(1.52),
        "{first:?}"
    );
    // Ten poll intervals of the same load, every number moving by up to ~10 %: nothing written.
    let jitter = [
        (1.47, 0.83, 38.9, 9),
        (1.61, 0.79, 42.5, 11),
        (1.55, 0.84, 41.0, 10),
        (1.44, 0.77, 37.4, 8),
        (1.58, 0.82, 43.1, 11),
        (1.50, 0.80, 39.6, 10),
        (1.63, 0.86, 40.8, 12),
        (1.49, 0.78, 41.7, 9),
        (1.53, 0.81, 38.2, 10),
        (1.57, 0.83, 42.0, 11),
    ];
    for (k, (p99, mean, rate, in_flight)) in jitter.into_iter().enumerate() {
        let t = 15 * (i64::try_from(k).unwrap() + 1);
        assert!(
            !reconcile_status(&mut q, busy(p99, mean, rate, in_flight, t), t),
            "interval {k}: a steady consumer's jitter wrote status"
        );
    }
    assert_eq!(q.status.as_ref(), Some(&first));
    // Without the dead-band every one of these scrapes was a write.
    let raw = busy(1.47, 0.83, 38.9, 9, 15);
    let mut shown = first.clone();
    shown.observed = observed_block(&raw);
    assert!(!same_ignoring_time(&first, &shown));

    // A real change of throughput (twice the rate): written at once.
    assert!(reconcile_status(
        &mut q,
        busy(1.55, 0.8, 80.0, 20, 165),
        165
    ));
    assert_eq!(
        q.status
            .as_ref()
            .unwrap()
            .observed
            .as_ref()
            .unwrap()
            .messages_per_second,
        Some(80.0)
    );
    // The handler slows past 1.2 x the declared 2s: the condition flips and the new P99 shows.
    assert!(reconcile_status(&mut q, busy(2.9, 1.4, 80.0, 20, 180), 180));
    let s = q.status.clone().unwrap();
    assert_eq!(s.observed.as_ref().unwrap().p99_seconds, Some(2.9));
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == "ProcessingTimeWithinDeclared")
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "ObservedP99AboveDeclared")
    );
    // A flip back shows even when the number moved by less than the band: status says 2.9 s; 2.45 s
    // (still above 1.2 x 2s) is within 20 % of it and not written, 2.38 s is too, but it is within
    // 1.2 x 2s, so the condition flips and the new numbers go out with it.
    assert!(!reconcile_status(
        &mut q,
        busy(2.45, 1.4, 80.0, 20, 195),
        195
    ));
    assert!(reconcile_status(
        &mut q,
        busy(2.38, 1.4, 80.0, 20, 210),
        210
    ));
    let s = q.status.clone().unwrap();
    assert_eq!(s.observed.as_ref().unwrap().p99_seconds, Some(2.38));
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == "ProcessingTimeWithinDeclared")
        .unwrap();
    assert_eq!(c.status, "True");
    // A pod more: written.
    let mut more = busy(2.38, 1.4, 80.0, 20, 225);
    more.pods = 3;
    assert!(reconcile_status(&mut q, more, 225));
    // Inside the band but older than OBSERVED_REFRESH: refreshed once, then quiet again.
    let mut later = busy(2.3, 1.4, 81.0, 20, 225 + 300);
    later.pods = 3;
    assert!(reconcile_status(&mut q, later.clone(), 525));
    later.sampled_at = Some(at(540));
    assert!(!reconcile_status(&mut q, later, 540));
}

// ---- the status write of a busy queue's counts (COUNTS_REFRESH) ----

fn ms(secs: u64) -> crate::scaling::Timestamp {
    crate::scaling::Timestamp::from_secs(secs)
}

/// A consumer held at 2 replicas (min = max = 2), so its desired replicas stay while its counts move.
fn held_at_two() -> QueueConsumer {
    let mut q = qc(false);
    q.spec.scaling.min_replicas = 2;
    q.spec.scaling.max_replicas = 2;
    q
}

/// The status a reconcile at `secs` builds over `visible` messages in the queue and `dlq_visible` in
/// its DLQ, through the scaler and the Deployment, so that condition messages quote the counts.
fn counted(q: &QueueConsumer, visible: u64, dlq_visible: i64, secs: i64) -> QueueConsumerStatus {
    let mut f = facts(dlq(dlq_visible, Some(dlq_visible * 10)));
    f.queue = queue(URL, i64::try_from(visible).unwrap());
    let (rd, _) = scale_decision(q, &[(visible, 2)], 2);
    let d = available_deployment(2);
    build(&StatusInputs {
        qc: q,
        facts: Observation::Read(&f),
        report: &Report::default(),
        rollout: &apply(),
        deployment: Some(&d),
        target: None,
        applied: None,
        alarm: AlarmStatus::default(),
        replicas: &rd,
        scaled_at: None,
        sampled_at: Some(at(secs)),
        redrive: None,
        redrive_after_recovery: None,
        workers: None,
        now: at(secs),
    })
}

fn message(s: &QueueConsumerStatus, t: &str) -> String {
    s.conditions
        .iter()
        .find(|c| c.type_ == t)
        .unwrap()
        .message
        .clone()
}

/// Written at 100 with 1,000 visible and 3 in the DLQ; at 130 the queue has 1,400 and the DLQ 5.
fn written_and_busier() -> (QueueConsumer, QueueConsumerStatus, QueueConsumerStatus) {
    let mut q = held_at_two();
    let written = counted(&q, 1000, 3, 100);
    q.status = Some(written.clone());
    let fresh = counted(&q, 1400, 5, 130);
    (q, written, fresh)
}

#[test]
fn busy_counts_are_held_for_a_minute_then_written() {
    let (q, written, fresh) = written_and_busier();
    // The counts did move, in status.queue, status.deadLetter and the conditions' messages, and
    // nothing else did.
    assert_ne!(fresh.queue.as_ref().unwrap().visible, Some(1000));
    assert_ne!(fresh.dead_letter.as_ref().unwrap().visible, Some(3));
    for t in ["ScalingActive", "DeadLetterQueueHealthy"] {
        assert_ne!(message(&written, t), message(&fresh, t), "{t}");
    }
    assert_eq!(fresh.desired_replicas, written.desired_replicas);
    let decide = |written_at: Option<u64>, now: u64| {
        status_write(
            &written,
            &fresh,
            written_at.map(ms),
            ms(now),
            COUNTS_REFRESH,
        )
    };
    assert_eq!(decide(Some(100), 130), StatusWrite::Hold);
    assert_eq!(decide(Some(100), 159), StatusWrite::Hold);
    assert_eq!(
        decide(Some(100), 160),
        StatusWrite::Write(WriteCause::Counts),
        "a minute later"
    );
    assert_eq!(
        decide(None, 130),
        StatusWrite::Write(WriteCause::Counts),
        "not known when"
    );
    assert_eq!(
        decide(Some(131), 130),
        StatusWrite::Write(WriteCause::Counts),
        "the clock went back"
    );
    // The same counts again (only their times move): nothing to write, however old.
    let same = counted(&q, 1000, 3, 400);
    assert_eq!(
        status_write(&written, &same, Some(ms(100)), ms(400), COUNTS_REFRESH),
        StatusWrite::Unchanged
    );
}

#[test]
fn what_readers_must_see_is_written_at_once() {
    type Change = (&'static str, WriteCause, fn(&mut QueueConsumerStatus));
    let (_, written, fresh) = written_and_busier();
    let decide = |old: &QueueConsumerStatus, new: &QueueConsumerStatus| {
        status_write(old, new, Some(ms(100)), ms(110), COUNTS_REFRESH)
    };
    assert_eq!(decide(&written, &fresh), StatusWrite::Hold, "the baseline");
    let changes: [Change; 11] = [
        ("the queue empties", WriteCause::Queue, |s| {
            s.queue.as_mut().unwrap().visible = Some(0);
        }),
        ("nothing left in flight", WriteCause::Queue, |s| {
            s.queue.as_mut().unwrap().in_flight = Some(0);
        }),
        ("the DLQ empties", WriteCause::Queue, |s| {
            s.dead_letter.as_mut().unwrap().visible = Some(0);
        }),
        ("a condition's status", WriteCause::Conditions, |s| {
            s.conditions[0].status = "False".into();
        }),
        ("a condition's reason", WriteCause::Conditions, |s| {
            s.conditions[0].reason = "Other".into();
        }),
        ("a message's words", WriteCause::Conditions, |s| {
            s.conditions[0].message.push_str(", and more");
        }),
        ("the desired replicas", WriteCause::Replicas, |s| {
            s.desired_replicas = Some(3);
        }),
        ("the current replicas", WriteCause::Replicas, |s| {
            s.replicas = Some(1);
        }),
        ("observedGeneration", WriteCause::Generation, |s| {
            s.observed_generation = Some(5);
        }),
        ("a finding", WriteCause::Findings, |s| {
            s.findings.push(Finding {
                code: "SomeRule".into(),
                severity: Severity::Warning,
                message: "m".into(),
                recommendation: "r".into(),
            });
        }),
        ("the visibility timeout", WriteCause::Queue, |s| {
            s.queue.as_mut().unwrap().visibility_timeout =
                Some(crate::api::Duration::from_secs(61));
        }),
    ];
    for (what, cause, change) in changes {
        let mut new = fresh.clone();
        change(&mut new);
        assert_eq!(decide(&written, &new), StatusWrite::Write(cause), "{what}");
    }
    // Two parts at once: the first in the order of WriteCause names the write.
    let mut both = fresh.clone();
    both.desired_replicas = Some(3);
    both.conditions[0].status = "False".into();
    assert_eq!(
        decide(&written, &both),
        StatusWrite::Write(WriteCause::Conditions)
    );
    // And the other way: a queue that fills again.
    let mut empty = written.clone();
    empty.queue.as_mut().unwrap().visible = Some(0);
    assert_eq!(
        decide(&empty, &fresh),
        StatusWrite::Write(WriteCause::Queue),
        "the queue fills"
    );
}

#[test]
fn numbers_in_messages_are_masked() {
    assert_eq!(
        numbers_masked("12 visible (0 new), the oldest 2m05s old; 1.5/s"),
        "# visible (# new), the oldest # old; #.#/s"
    );
    // An age is one number whatever its units, so crossing a minute or an hour is not news; a word
    // after digits stays a word.
    for age in ["30s", "59s", "1m0s", "1m10s", "2h", "1h0m5s", "500ms", "7"] {
        assert_eq!(
            numbers_masked(&format!("the oldest {age} old")),
            "the oldest # old"
        );
    }
    assert_eq!(
        numbers_masked("3 messages, 10seconds, 2d"),
        "# messages, #seconds, #"
    );
    assert_eq!(numbers_masked("s3 1mx"), "s# #mx");
    assert_eq!(numbers_masked("no numbers"), "no numbers");
}

/// Ages are not counts: one going to 0 while messages stay visible is held like any other age, and
/// `ScalingActive`'s "new" messages, which go to 0 and back on a busy queue, with it.
#[test]
fn an_age_or_a_derived_number_going_to_zero_is_held() {
    let (_, written, fresh) = written_and_busier();
    let mut new = fresh.clone();
    new.queue.as_mut().unwrap().oldest_age_seconds = Some(0);
    new.dead_letter.as_mut().unwrap().oldest_age_seconds = Some(0);
    for c in &mut new.conditions {
        if c.type_ == "ScalingActive" {
            c.message = c.message.replace("visible", "visible (0 new)");
        }
    }
    let mut old = written.clone();
    old.queue.as_mut().unwrap().oldest_age_seconds = Some(30);
    for c in &mut old.conditions {
        if c.type_ == "ScalingActive" {
            c.message = c.message.replace("visible", "visible (7 new)");
        }
    }
    assert!(message(&new, "ScalingActive").contains("(0 new)"));
    assert!(message(&old, "ScalingActive").contains("(7 new)"));
    assert_eq!(
        status_write(&old, &new, Some(ms(100)), ms(110), COUNTS_REFRESH),
        StatusWrite::Hold
    );
    // An age that appears or goes is written.
    new.queue.as_mut().unwrap().oldest_age_seconds = None;
    assert_eq!(
        status_write(&old, &new, Some(ms(100)), ms(110), COUNTS_REFRESH),
        StatusWrite::Write(WriteCause::Queue)
    );
}

/// A held status is not written, so the next build still compares against the written one: the
/// write a minute later keeps the conditions' lastTransitionTime and makes no transition (no Event).
#[test]
fn a_held_write_keeps_transition_times_and_events() {
    let (mut q, written, _) = written_and_busier();
    q.status = Some(written.clone());
    let later = counted(&q, 1800, 7, 170);
    assert_eq!(
        status_write(&written, &later, Some(ms(100)), ms(170), COUNTS_REFRESH),
        StatusWrite::Write(WriteCause::Counts)
    );
    assert!(transitions(&written.conditions, &later.conditions).is_empty());
    for c in &later.conditions {
        let before = written
            .conditions
            .iter()
            .find(|o| o.type_ == c.type_)
            .unwrap();
        assert_eq!(
            c.last_transition_time, before.last_transition_time,
            "{}",
            c.type_
        );
    }
}

/// The status of a running consumer whose pods said `w` at the last scrape.
fn with_workers(w: &Workers) -> Built {
    Built {
        status: running(&qc(false), w, 100),
    }
}

fn pods(answered: usize, unreachable: usize, open: usize) -> Workers {
    Workers {
        pods: answered,
        unreachable,
        breaker_open: open,
        sampled_at: Some(at(100)),
        ..Workers::default()
    }
}

#[test]
fn handler_healthy_is_the_share_of_workers_whose_breaker_is_open() {
    let plan = build_read(&qc(false), &facts(dlq(0, None)), None, at(100));
    let c = plan.cond(conditions::HANDLER_HEALTHY);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("Unknown", reason::NO_OBSERVATIONS)
    );
    for (w, status, reason, words) in [
        (
            pods(0, 0, 0),
            "Unknown",
            reason::NO_OBSERVATIONS,
            "no ready worker pod",
        ),
        (
            pods(0, 2, 0),
            "Unknown",
            reason::NO_OBSERVATIONS,
            "none of the 2 ready",
        ),
        (
            pods(3, 0, 0),
            "True",
            reason::HANDLER_RESPONDING,
            "no outage breaker open on the 3",
        ),
        (
            pods(3, 0, 1),
            "False",
            reason::DOWNSTREAM_FAILING,
            "1 of 3 workers paused intake",
        ),
        (
            pods(3, 0, 2),
            "False",
            reason::DOWNSTREAM_FAILING,
            "2 of 3 workers paused intake",
        ),
    ] {
        let b = with_workers(&w);
        let c = b.cond(conditions::HANDLER_HEALTHY);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (status, reason),
            "{w:?}: {}",
            c.message
        );
        assert!(c.message.contains(words), "{w:?}: {}", c.message);
        // Only more than half open holds the scaler, and the message says so only then.
        assert_eq!(
            c.message.contains("scaling holds"),
            w.breaker_open * 2 > w.pods && w.pods > 0,
            "{w:?}: {}",
            c.message
        );
        // HandlerHealthy never gates Ready: the consumer runs as asked; its dependency does not.
        assert_eq!(b.cond(conditions::READY).status, "True", "{w:?}");
        assert_eq!(
            b.status.observed.as_ref().and_then(|o| o.breaker_open),
            (w.breaker_open > 0).then(|| i32::try_from(w.breaker_open).unwrap())
        );
    }
}

#[test]
fn handler_healthy_events_speak_of_the_dependency_only() {
    let healthy = with_workers(&pods(3, 0, 0)).status.conditions;
    let failing = with_workers(&pods(3, 0, 2)).status.conditions;
    let unknown = with_workers(&pods(0, 0, 0)).status.conditions;
    let events = |old: &[Condition], new: &[Condition]| -> Vec<(String, bool)> {
        transitions(old, new)
            .into_iter()
            .filter(|t| t.type_ == conditions::HANDLER_HEALTHY)
            .map(|t| (t.reason, t.warning))
            .collect()
    };
    let warn = vec![(reason::DOWNSTREAM_FAILING.to_string(), true)];
    assert_eq!(events(&healthy, &failing), warn);
    assert_eq!(events(&unknown, &failing), warn);
    assert_eq!(
        events(&[], &failing),
        warn,
        "a first reconcile that finds it open"
    );
    assert_eq!(
        events(&failing, &healthy),
        vec![(reason::DOWNSTREAM_RECOVERED.to_string(), false)]
    );
    // Pods starting, scaled to zero, or the first healthy reconcile: no news.
    assert!(events(&healthy, &unknown).is_empty());
    assert!(events(&unknown, &healthy).is_empty());
    assert!(events(&[], &healthy).is_empty());
    assert!(events(&failing, &failing).is_empty());
}

/// #29 item 6: a condition's message never carries the operator's own AWS identity, which an
/// AccessDenied answer names; the queue's ARN stays.
#[test]
fn condition_messages_hide_the_operators_identity() {
    let c = Cond::new(
        conditions::QUEUE_REACHABLE,
        Status::False,
        "AccessDenied",
        "User: arn:aws:sts::111122223333:assumed-role/qc-operator/s is not authorized to perform: sqs:GetQueueAttributes on resource: arn:aws:sqs:us-east-1:444455556666:orders".into(),
    );
    assert!(!c.message.contains("111122223333"), "{}", c.message);
    assert!(
        c.message
            .contains("arn:aws:sqs:us-east-1:444455556666:orders")
    );
}

#[test]
fn a_denial_with_a_role_names_the_role_and_its_external_id() {
    let mut q = qc(false);
    let err = ObserveError::ReadQueueAttributes {
        url: URL.into(),
        source: SqsError::AccessDenied {
            target: URL.into(),
            code: "AccessDenied".into(),
            message: "not authorized".into(),
        },
    };
    let build = |q: &QueueConsumer| {
        build_with(
            q,
            Observation::Failed(&err),
            &Report::default(),
            Rollout::HeldQueueUnreachable { render: Ok(()) },
            None,
            at(200),
        )
        .cond("QueueReachable")
        .message
        .clone()
    };
    assert!(!build(&q).contains("roleArn"), "no role, no hint");
    q.spec.aws.role_arn = Some("arn:aws:iam::123456789012:role/qc-shop-orders".into());
    let m = build(&q);
    assert!(
        m.contains("the role in spec.aws.roleArn") && m.contains("ExternalId qc:shop"),
        "{m}"
    );
}

/// A Deployment as the Deployment controller reports it: `generation` of its spec, `observed` by the
/// controller, `total` pods of which `updated` run the current template and `available` serve.
fn rolling(
    want: i32,
    generation: i64,
    observed: i64,
    (total, updated, available): (i32, i32, i32),
) -> Deployment {
    let minimum = available >= want - want / 4;
    serde_json::from_value(json!({
        "metadata": {"name": "orders", "generation": generation},
        "spec": {"replicas": want, "selector": {}, "template": {}},
        "status": {"observedGeneration": observed, "replicas": total, "updatedReplicas": updated,
                   "readyReplicas": available, "availableReplicas": available,
                   "conditions": [
                       {"type": "Available", "status": if minimum { "True" } else { "False" },
                        "reason": if minimum { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }},
                       {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}]}
    }))
    .unwrap()
}

/// One reconcile's status over `d`, after the last one's (`q.status`), then kept as the next one's.
fn next_ready(q: &mut QueueConsumer, d: &Deployment, applied: Option<Applied>) -> Condition {
    let f = facts(dlq(0, None));
    let status = build(&StatusInputs {
        qc: q,
        facts: Observation::Read(&f),
        report: &Report::default(),
        rollout: &apply(),
        deployment: Some(d),
        target: None,
        applied,
        alarm: AlarmStatus::default(),
        replicas: &ReplicaDecision::Keep,
        scaled_at: None,
        sampled_at: None,
        redrive: None,
        redrive_after_recovery: None,
        workers: None,
        now: at(1),
    });
    q.status = Some(status.clone());
    status
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap()
}

const NEW_TEMPLATE: Option<Applied> = Some(Applied::Updated { new_template: true });

#[test]
fn a_new_pod_template_is_not_ready_until_every_replica_runs_it_and_is_available() {
    let mut q = qc(false);
    let r = next_ready(&mut q, &rolling(3, 5, 5, (3, 3, 3)), None);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("True", "Available")
    );

    // The spec changed the template: applied as generation 6, which the status cannot show yet.
    let before = q.status.clone().unwrap().conditions;
    let r = next_ready(&mut q, &rolling(3, 6, 5, (3, 3, 3)), NEW_TEMPLATE);
    // Expected news: a Normal Event, not a Warning.
    let t = transitions(&before, &q.status.clone().unwrap().conditions);
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!((t[0].reason.as_str(), t[0].warning), ("RollingOut", false));
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("False", "RollingOut")
    );
    assert!(
        r.message.contains("Deployment orders is rolling out"),
        "{}",
        r.message
    );
    // The next reconcile before the Deployment controller has looked: the counts are the old
    // generation's (all "updated"), so they say nothing; still rolling out.
    let r = next_ready(&mut q, &rolling(3, 6, 5, (3, 3, 3)), None);
    assert_eq!(r.reason, "RollingOut");
    assert!(r.message.contains("observe generation 6"), "{}", r.message);
    // Observed: one new pod surged, three old ones serve.
    let r = next_ready(&mut q, &rolling(3, 6, 6, (4, 1, 3)), None);
    assert_eq!(r.reason, "RollingOut");
    assert!(
        r.message
            .contains("1 of 3 replica(s) run the current pod template, 3 pod(s) of an older one"),
        "{}",
        r.message
    );
    // The old pods are gone but the last new one is not available yet.
    let r = next_ready(&mut q, &rolling(3, 6, 6, (3, 3, 2)), None);
    assert_eq!(r.reason, "RollingOut");
    assert!(
        r.message
            .contains("3 of 3 replica(s) run the current pod template, 2 available"),
        "{}",
        r.message
    );
    // Done.
    let r = next_ready(&mut q, &rolling(3, 6, 6, (3, 3, 3)), None);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("True", "Available")
    );
}

#[test]
fn a_scale_write_alone_keeps_ready_true() {
    let mut q = qc(false);
    let r = next_ready(&mut q, &rolling(2, 3, 3, (2, 2, 2)), None);
    assert_eq!(r.status, "True");
    // The scaler wrote 5 replicas (generation 4) in this reconcile: not yet observed.
    let r = next_ready(&mut q, &rolling(5, 4, 3, (2, 2, 2)), None);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("True", "Available"),
        "{}",
        r.message
    );
    // Observed: 5 pods of the current template, 2 available; the Deployment's own Available
    // condition is False (MinimumReplicasUnavailable) until 4 are.
    let d = rolling(5, 4, 4, (5, 5, 2));
    assert!(
        d.status.as_ref().unwrap().conditions.as_ref().unwrap()[0]
            .status
            .as_deref()
            == Some("False")
    );
    let r = next_ready(&mut q, &d, None);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("True", "Available"),
        "{}",
        r.message
    );
    // An apply that changed no template (a label, the progress deadline) is no rollout either.
    let r = next_ready(
        &mut q,
        &rolling(5, 5, 4, (5, 5, 5)),
        Some(Applied::Updated {
            new_template: false,
        }),
    );
    assert_eq!(r.status, "True");
    // A scale-down: pods of the current template go away.
    let r = next_ready(&mut q, &rolling(1, 6, 6, (1, 1, 1)), None);
    assert_eq!(r.status, "True");
    // A new template while scaled to zero replaces no pod.
    let r = next_ready(&mut q, &rolling(0, 7, 6, (0, 0, 0)), NEW_TEMPLATE);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("True", "Available")
    );
}

#[test]
fn a_stalled_rollout_is_not_ready_with_the_deployments_message() {
    let mut q = qc(false);
    let mut d = rolling(3, 6, 6, (4, 1, 3));
    d.status.as_mut().unwrap().conditions.as_mut().unwrap()[1] = serde_json::from_value(json!({
        "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
        "message": "ReplicaSet \"orders-7d9f\" has timed out progressing."}))
    .unwrap();
    let r = next_ready(&mut q, &d, None);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("False", "RolloutStalled")
    );
    assert!(
        r.message
            .contains("ReplicaSet \"orders-7d9f\" has timed out progressing."),
        "{}",
        r.message
    );
    // A fixed template applied over the stalled rollout starts a new one: rolling out, not stalled
    // (the deadline is the last template's).
    d.metadata.generation = Some(7);
    let r = next_ready(&mut q, &d, NEW_TEMPLATE);
    assert_eq!(r.reason, "RollingOut");
}

/// Scale-only mode: the same QueueConsumer with `scaleTargetRef` in place of handler and template.
fn scale_only_qc() -> QueueConsumer {
    let mut q = qc(false);
    q.spec.handler = crate::api::HandlerSpec::default();
    q.spec.template = k8s_openapi::api::core::v1::PodTemplateSpec::default();
    q.spec.scale_target_ref = Some(crate::api::ScaleTargetRef {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: "legacy-orders".into(),
    });
    assert_eq!(q.spec.mode_conflict(), None);
    q
}

fn build_scale_only(
    q: &QueueConsumer,
    target: Option<&TargetRead>,
    replicas: &ReplicaDecision,
) -> Built {
    let f = facts(dlq(0, None));
    Built {
        status: build(&StatusInputs {
            qc: q,
            facts: Observation::Read(&f),
            report: &Report::default(),
            rollout: &Rollout::ScaleOnly,
            deployment: None,
            target,
            applied: None,
            alarm: AlarmStatus::default(),
            replicas,
            scaled_at: None,
            sampled_at: Some(at(100)),
            redrive: None,
            redrive_after_recovery: None,
            workers: Some(&Workers::default()),
            now: at(100),
        }),
    }
}

#[test]
fn scale_only_says_so_and_reports_the_target() {
    use crate::controller::target::TargetScale;
    let q = scale_only_qc();
    let found = TargetRead::Found(TargetScale {
        asks: 3,
        replicas: 2,
        selector: Some("app=legacy-orders".into()),
    });
    let (decision, _) = scale_decision(&q, &[(900, 0)], 3);
    let b = build_scale_only(&q, Some(&found), &decision);
    let so = b.cond(conditions::SCALE_ONLY);
    assert_eq!(
        (so.status.as_str(), so.reason.as_str()),
        ("True", "ScaleOnly")
    );
    for off in [
        "Deployment/legacy-orders",
        "no heartbeats",
        "no outage breaker",
        "no observed P99",
        "SQS's visible and in-flight counts only",
    ] {
        assert!(so.message.contains(off), "{off}: {}", so.message);
    }
    let ready = b.cond(conditions::READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "ScaleOnly"),
        "{ready:?}"
    );
    assert!(
        ready.message.contains("asks for 3 replica(s), 2 running"),
        "{}",
        ready.message
    );
    for t in [
        conditions::HANDLER_HEALTHY,
        conditions::PROCESSING_TIME_WITHIN_DECLARED,
    ] {
        let c = b.cond(t);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("Unknown", "ScaleOnly"),
            "{c:?}"
        );
    }
    // The scaler's decision drives ScalingActive as for the bundled worker.
    assert_eq!(b.cond(conditions::SCALING_ACTIVE).status, "True");
    assert_eq!(b.status.replicas, Some(2));
    assert_eq!(b.status.selector.as_deref(), Some("app=legacy-orders"));
    assert!(b.status.desired_replicas.is_some());

    // Held: what the target asks for, not a Deployment of ours.
    let b = build_scale_only(&q, Some(&found), &ReplicaDecision::Keep);
    assert_eq!(b.status.desired_replicas, Some(3));

    // A missing target: Ready and ScalingActive say which and what to do; the selector stays.
    let b = build_scale_only(&q, Some(&TargetRead::NotFound), &ReplicaDecision::Keep);
    for t in [conditions::READY, conditions::SCALING_ACTIVE] {
        let c = b.cond(t);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "ScaleTargetUnavailable"),
            "{c:?}"
        );
        assert!(
            c.message
                .contains("Deployment/legacy-orders (apps/v1) does not exist in namespace shop"),
            "{}",
            c.message
        );
    }
    assert_eq!(b.status.replicas, None);

    // The bundled worker's mode has no ScaleOnly condition.
    let worker = build_read(&qc(false), &facts(dlq(0, None)), None, at(100));
    assert!(
        worker
            .status
            .conditions
            .iter()
            .all(|c| c.type_ != conditions::SCALE_ONLY)
    );
}

/// (measurement, pods, unreachable, status, reason, words of the message)
type ObjectiveRow<'a> = (
    Option<crate::scaling::objective::Measurement>,
    usize,
    usize,
    &'a str,
    &'a str,
    &'a [&'a str],
);

fn with_objective(dwell_p99: &str) -> QueueConsumer {
    let mut q = qc(false);
    q.spec.scaling.objective = Some(crate::api::ObjectiveSpec {
        dwell_p99: dwell_p99.parse().unwrap(),
    });
    q
}

fn dwell(p99_s: u64, messages: u64, over: u64) -> crate::scaling::objective::Measurement {
    crate::scaling::objective::Measurement {
        objective: Duration::from_secs(20),
        p99: Duration::from_secs(p99_s),
        messages,
        over_milli: over * 1000,
        window: Duration::from_secs(60),
    }
}

fn objective_condition(s: &QueueConsumerStatus) -> Option<&Condition> {
    s.conditions
        .iter()
        .find(|c| c.type_ == conditions::OBJECTIVE_MET)
}

#[test]
fn objective_met_says_the_verdict_with_the_figures() {
    // no objective: no condition, no block
    let s = running(&qc(false), &busy(1.5, 0.8, 40.0, 10, 0), 0);
    assert!(objective_condition(&s).is_none());
    assert!(s.objective.is_none());
    // (measurement, pods, unreachable) -> (status, reason, words of the message)
    let rows: [ObjectiveRow; 7] = [
        (
            Some(dwell(12, 400, 2)),
            2,
            0,
            "True",
            reason::OBJECTIVE_MET,
            &[
                "observed dwell P99 12s against the objective 20s",
                "0.5 % of 400 messages",
                "burn rate 0.50",
            ],
        ),
        (
            Some(dwell(45, 400, 40)),
            2,
            0,
            "False",
            reason::DWELL_ABOVE_OBJECTIVE,
            &[
                "observed dwell P99 45s",
                "10.0 % of 400",
                "burn rate 10.00",
                "limited by Objective",
            ],
        ),
        (
            Some(dwell(45, 30, 30)),
            2,
            0,
            "Unknown",
            reason::NO_MEASUREMENT,
            &["30 message(s)", "at least 50"],
        ),
        (
            Some(dwell(0, 0, 0)),
            2,
            0,
            "Unknown",
            reason::NO_MEASUREMENT,
            &["0 message(s) left the queue"],
        ),
        (
            None,
            0,
            0,
            "Unknown",
            reason::NO_MEASUREMENT,
            &["no ready worker pod"],
        ),
        (
            None,
            0,
            2,
            "Unknown",
            reason::NO_MEASUREMENT,
            &["none of the 2 ready worker pod(s) answered"],
        ),
        (
            None,
            2,
            0,
            "Unknown",
            reason::NO_MEASUREMENT,
            &["second scrape"],
        ),
    ];
    let q = with_objective("20s");
    for (m, pods, unreachable, status, why, words) in rows {
        let w = Workers {
            dwell: m,
            pods,
            unreachable,
            ..busy(1.5, 0.8, 40.0, 10, 0)
        };
        let s = running(&q, &w, 0);
        let c = objective_condition(&s).expect("ObjectiveMet with an objective");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            (status, why),
            "{m:?}: {}",
            c.message
        );
        for word in words {
            assert!(c.message.contains(word), "{word:?} not in {}", c.message);
        }
        let block = s.objective.as_ref();
        assert_eq!(block.is_some(), m.is_some(), "{block:?}");
        if let (Some(b), Some(m)) = (block, m) {
            let p99 = (m.messages > 0).then(|| m.p99.as_secs_f64());
            assert_eq!(b.dwell_p99_seconds, p99, "{b:?}");
            assert_eq!(b.burn_rate, Some((m.burn_rate() * 100.0).round() / 100.0));
            assert_eq!(b.messages, Some(i64::try_from(m.messages).unwrap()));
            assert_eq!(b.window, Some(Duration::from_secs(60)));
        }
    }
}

#[test]
fn objective_met_turns_true_again_only_below_three_quarters_of_the_budget() {
    let w = |m| Workers {
        dwell: Some(m),
        ..busy(1.5, 0.8, 40.0, 10, 0)
    };
    // 0.9 % over: met from nothing, still False after a miss; 0.5 %: met again
    let hovering = dwell(19, 1000, 9);
    let fresh = running(&with_objective("20s"), &w(hovering), 0);
    assert_eq!(objective_condition(&fresh).unwrap().status, "True");
    let mut q = with_objective("20s");
    q.status = Some(running(&q, &w(dwell(45, 400, 40)), 0));
    assert_eq!(
        objective_condition(q.status.as_ref().unwrap())
            .unwrap()
            .status,
        "False"
    );
    let still = running(&q, &w(hovering), 15);
    let c = objective_condition(&still).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", reason::DWELL_ABOVE_OBJECTIVE),
        "{}",
        c.message
    );
    assert!(
        c.message.contains("0.9 % of 1000") && c.message.contains("falls to 0.75 or below"),
        "{}",
        c.message
    );
    let again = running(&q, &w(dwell(12, 1000, 5)), 30);
    let c = objective_condition(&again).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", reason::OBJECTIVE_MET),
        "{}",
        c.message
    );
}

#[test]
fn objective_met_events_only_on_a_burn_and_its_end() {
    let q = with_objective("20s");
    let w = |m| Workers {
        dwell: m,
        ..busy(1.5, 0.8, 40.0, 10, 0)
    };
    let met = running(&q, &w(Some(dwell(12, 400, 2))), 0);
    let missed = running(&q, &w(Some(dwell(45, 400, 40))), 15);
    let unknown = running(&q, &w(Some(dwell(45, 10, 10))), 30);
    let of = |old: &QueueConsumerStatus, new: &QueueConsumerStatus| {
        transitions(&old.conditions, &new.conditions)
            .into_iter()
            .filter(|t| t.type_ == conditions::OBJECTIVE_MET)
            .map(|t| (t.reason, t.warning))
            .collect::<Vec<_>>()
    };
    let none = QueueConsumerStatus::default();
    assert_eq!(
        of(&met, &missed),
        [(reason::DWELL_ABOVE_OBJECTIVE.to_string(), true)]
    );
    assert_eq!(
        of(&missed, &met),
        [(reason::OBJECTIVE_MET.to_string(), false)]
    );
    assert_eq!(
        of(&none, &missed),
        [(reason::DWELL_ABOVE_OBJECTIVE.to_string(), true)]
    );
    // a lull (too few messages) and a first measurement are no news
    assert!(of(&met, &unknown).is_empty());
    assert!(of(&missed, &unknown).is_empty());
    assert!(of(&unknown, &met).is_empty());
    assert!(of(&none, &met).is_empty());
    assert!(of(&none, &unknown).is_empty());
    // new figures with the same verdict are counts: held for the refresh, not written at once
    let later = running(&q, &w(Some(dwell(14, 500, 3))), 45);
    assert_eq!(
        status_write(
            &met,
            &later,
            Some(crate::scaling::Timestamp::from_millis(0)),
            crate::scaling::Timestamp::from_millis(45_000),
            COUNTS_REFRESH
        ),
        StatusWrite::Hold
    );
    assert_eq!(
        status_write(
            &met,
            &missed,
            Some(crate::scaling::Timestamp::from_millis(0)),
            crate::scaling::Timestamp::from_millis(15_000),
            COUNTS_REFRESH
        ),
        StatusWrite::Write(WriteCause::Conditions)
    );
}
