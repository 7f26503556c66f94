//! The controller's safety promises against the in-memory Kubernetes API and moto: a failing step never
//! slows another, a tenant-chosen endpoint gets no request unless the operator allows it, a silent
//! endpoint cannot hang a reconcile, and the DLQ alarm deleted is always this object's own.

mod common;
mod fake_kube;

use common::fixture::consumer;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use fake_kube::aws::{NoAlarms, TEST_WORKER_IMAGE, context};
use fake_kube::{DEPLOYMENTS, EVENTS, FakeKube, QUEUE_CONSUMERS, Recorded};
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::controller::Action;
use qc::api::QueueConsumer;
use qc::aws::SqsReader;
use qc::aws::cloudwatch::{Alarms, CloudWatchAlarms, dead_letter_alarm};
use qc::aws::endpoints::AllowedEndpoints;
use qc::controller::observe::{AwsClients, AwsProvider, AwsTarget, SdkProvider};
use qc::controller::{Context, reconcile};
use qc::render::RenderOptions;
use serde_json::{Value, json};

const NS: &str = "shop";

async fn moto() -> (aws_sdk_sqs::Client, aws_sdk_cloudwatch::Client) {
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&common::sqs_endpoint())).await;
    (
        aws_sdk_sqs::Client::new(&conf),
        aws_sdk_cloudwatch::Client::new(&conf),
    )
}

/// A source queue with a DLQ on moto; returns (source URL, DLQ URL).
async fn queues(sqs: &aws_sdk_sqs::Client) -> (String, String) {
    let dlq = common::create_queue(
        sqs,
        &common::unique_name("dlq"),
        &[(QueueAttributeName::MessageRetentionPeriod, "1209600".into())],
    )
    .await;
    let arn = common::queue_arn(sqs, &dlq).await;
    let url = common::create_queue(
        sqs,
        &common::unique_name("src"),
        &[
            (QueueAttributeName::VisibilityTimeout, "60".into()),
            (
                QueueAttributeName::RedrivePolicy,
                json!({"deadLetterTargetArn": arn, "maxReceiveCount": 5}).to_string(),
            ),
        ],
    )
    .await;
    (url, dlq)
}

fn manifest(name: &str, url: &str, endpoint: &str, alarm: bool) -> Value {
    consumer(name)
        .namespace(NS)
        .queue_url(url)
        .endpoint(endpoint)
        .timeout("10s")
        .wait_time("1s")
        .concurrency(1)
        .image("shop/orders:1")
        .scaling(json!({"pollInterval": "1s", "minReplicas": 0, "maxReplicas": 10, "maxBacklogAge": "10s"}))
        .alarm(alarm)
        .json()
}

fn qc(fake: &FakeKube, name: &str) -> QueueConsumer {
    serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, name).unwrap()).unwrap()
}

async fn run_once(
    fake: &FakeKube,
    ctx: &Arc<Context>,
    name: &str,
) -> Result<Action, qc::controller::Error> {
    reconcile(Arc::new(qc(fake, name)), ctx.clone()).await
}

fn replicas(fake: &FakeKube, name: &str) -> Option<i32> {
    let d: Deployment = serde_json::from_value(fake.get(DEPLOYMENTS, NS, name)?).unwrap();
    d.spec.replicas
}

fn event_reasons(reqs: &[Recorded]) -> Vec<String> {
    reqs.iter()
        .filter(|r| r.method == "POST" && r.targets(EVENTS))
        .filter_map(|r| r.body.as_ref()?["reason"].as_str().map(str::to_string))
        .collect()
}

/// A requeue on this QueueConsumer's slot of its 1s poll interval (polls are spread: within one
/// interval from now), never an error backoff.
fn is_poll(a: &Action) -> bool {
    (1..=1000).any(|ms| *a == Action::requeue(Duration::from_millis(ms)))
}

/// A port on loopback that refuses connections (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A listener that accepts connections, counts them, and never answers.
struct Silent {
    endpoint: String,
    accepted: Arc<AtomicU32>,
}

async fn silent_listener() -> Silent {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", l.local_addr().unwrap());
    let accepted = Arc::new(AtomicU32::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    Silent { endpoint, accepted }
}

#[tokio::test]
async fn cloudwatch_unreachable_never_slows_scaling() {
    let (sqs, _) = moto().await;
    let (url, _dlq) = queues(&sqs).await;
    // CloudWatch at a port nobody listens on: every alarm call fails.
    let conf = qc::aws::controller_sdk_config(
        Some("us-east-1"),
        Some(&format!("http://127.0.0.1:{}", closed_port())),
    )
    .await;
    let fake = FakeKube::new();
    let ctx = context(
        &fake,
        Arc::new(SqsReader::new(sqs.clone())),
        Arc::new(CloudWatchAlarms::new(aws_sdk_cloudwatch::Client::new(
            &conf,
        ))),
        None,
    );
    fake.create(
        QUEUE_CONSUMERS,
        manifest("orders", &url, &common::sqs_endpoint(), true),
    );

    // The alarm step fails; the reconcile does not, and comes back after the poll interval.
    let a = run_once(&fake, &ctx, "orders").await.unwrap();
    assert!(is_poll(&a), "{a:?}");
    let alarm = fake_kube::condition_of(qc(&fake, "orders"), "AlarmSynced");
    assert_eq!(
        (alarm.status.as_str(), alarm.reason.as_str()),
        ("False", "EndpointUnreachable"),
        "{alarm:?}"
    );
    assert!(
        alarm
            .message
            .contains("scaling and status are not held back"),
        "{}",
        alarm.message
    );
    assert!(
        event_reasons(&fake.requests()).contains(&"EndpointUnreachable".to_string()),
        "a Warning Event names the CloudWatch failure"
    );
    assert!(
        ctx.metrics
            .render()
            .contains("qc_reconcile_errors_total{reason=\"EndpointUnreachable\"} 1"),
        "{}",
        ctx.metrics.render()
    );
    assert_eq!(
        replicas(&fake, "orders"),
        Some(0),
        "idle queue: scaled to zero"
    );

    // Queue depth rises: within two polls the replicas follow, CloudWatch still down.
    for i in 0..40 {
        sqs.send_message()
            .queue_url(&url)
            .message_body(format!("m{i}"))
            .send()
            .await
            .unwrap();
    }
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let a = run_once(&fake, &ctx, "orders").await.unwrap();
        assert!(is_poll(&a), "{a:?}");
    }
    let n = replicas(&fake, "orders").unwrap();
    assert!(n >= 4, "40 visible at 10 per replica: {n} replicas");
    let status = qc(&fake, "orders").status.unwrap();
    assert_eq!(status.queue.unwrap().visible, Some(40));
    assert_eq!(
        fake_kube::condition_of(qc(&fake, "orders"), "AlarmSynced").status,
        "False"
    );
}

#[tokio::test]
async fn a_failed_status_write_retries_at_the_poll_interval() {
    let (sqs, _) = moto().await;
    let (url, _dlq) = queues(&sqs).await;
    let fake = FakeKube::new();
    let ctx = context(
        &fake,
        Arc::new(SqsReader::new(sqs)),
        Arc::new(NoAlarms),
        None,
    );
    fake.create(
        QUEUE_CONSUMERS,
        manifest("orders", &url, &common::sqs_endpoint(), false),
    );
    fake.fail("PATCH", "/status", 500, "InternalError", 1);
    let a = run_once(&fake, &ctx, "orders").await.unwrap();
    assert!(
        is_poll(&a),
        "no error backoff for a report that could not be written: {a:?}"
    );
    assert!(
        event_reasons(&fake.requests()).contains(&"WriteStatusFailed".to_string()),
        "{:?}",
        event_reasons(&fake.requests())
    );
    assert!(
        replicas(&fake, "orders").is_some(),
        "the Deployment still went out"
    );
    // The next poll writes it.
    let a = run_once(&fake, &ctx, "orders").await.unwrap();
    assert!(is_poll(&a), "{a:?}");
    assert!(qc(&fake, "orders").status.is_some());
}

/// Records the endpoints clients were asked for, and hands out the real SDK's.
#[derive(Default)]
struct Recording {
    asked: std::sync::Mutex<Vec<Option<String>>>,
    sdk: SdkProvider,
}

#[async_trait::async_trait]
impl AwsProvider for Recording {
    async fn clients(&self, target: &AwsTarget) -> AwsClients {
        self.asked.lock().unwrap().push(target.endpoint.clone());
        self.sdk.clients(target).await
    }
}

fn sdk_context(fake: &FakeKube, allowed: &[&str]) -> (Arc<Context>, Arc<Recording>) {
    let provider = Arc::new(Recording::default());
    let mut ctx = Context::new(
        fake.client(),
        provider.clone(),
        RenderOptions {
            worker_image: TEST_WORKER_IMAGE.into(),
            ..Default::default()
        },
        None,
    );
    ctx.endpoints = AllowedEndpoints::parse(allowed).unwrap();
    (Arc::new(ctx), provider)
}

#[tokio::test]
async fn an_endpoint_the_operator_did_not_allow_gets_no_request() {
    let silent = silent_listener().await;
    let fake = FakeKube::new();
    let (ctx, provider) = sdk_context(&fake, &[]);
    for (name, endpoint) in [
        ("tenant", silent.endpoint.as_str()),
        ("metadata", "http://169.254.169.254"),
    ] {
        let url = format!("{endpoint}/123456789012/orders");
        fake.create(QUEUE_CONSUMERS, manifest(name, &url, endpoint, true));
        let action = run_once(&fake, &ctx, name).await.unwrap();
        assert_eq!(
            action,
            Action::await_change(),
            "{name}: waits for a spec change"
        );
        let q = qc(&fake, name);
        let valid = fake_kube::condition_of(q.clone(), "ConfigValid");
        assert_eq!(
            (valid.status.as_str(), valid.reason.as_str()),
            ("False", "EndpointNotAllowed"),
            "{name}"
        );
        assert!(
            valid.message.contains("spec.queue.endpoint")
                && valid.message.contains("aws.allowedEndpoints"),
            "names the field and the fix: {}",
            valid.message
        );
        let ready = fake_kube::condition_of(q.clone(), "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "ConfigInvalid")
        );
        assert!(
            q.metadata.finalizers.is_none(),
            "{name}: no alarm, no finalizer"
        );
        assert!(
            fake.get(DEPLOYMENTS, NS, name).is_none(),
            "{name}: nothing rolled out"
        );
    }
    assert!(
        provider.asked.lock().unwrap().is_empty(),
        "no AWS client was even built for a refused endpoint"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        silent.accepted.load(Ordering::SeqCst),
        0,
        "nothing reached the listener"
    );

    // One whose alarm was made while its endpoint was allowed: deleting it sends nothing there either;
    // the finalizer comes off with a Warning that the alarm was left.
    let mut m = manifest(
        "was-allowed",
        &format!("{}/1/q", silent.endpoint),
        &silent.endpoint,
        true,
    );
    m["metadata"]["finalizers"] = json!(["sqs.consumers.dev/cleanup"]);
    fake.create(QUEUE_CONSUMERS, m);
    fake.delete(QUEUE_CONSUMERS, NS, "was-allowed");
    assert!(
        fake.get(QUEUE_CONSUMERS, NS, "was-allowed").is_some(),
        "held by the finalizer"
    );
    run_once(&fake, &ctx, "was-allowed").await.unwrap();
    assert!(fake.get(QUEUE_CONSUMERS, NS, "was-allowed").is_none());
    assert!(event_reasons(&fake.requests()).contains(&"EndpointNotAllowed".to_string()));
    assert!(provider.asked.lock().unwrap().is_empty());
    assert_eq!(silent.accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_silent_allowed_endpoint_cannot_hang_a_reconcile() {
    let silent = silent_listener().await;
    let fake = FakeKube::new();
    // Allowed by the operator this time: the request goes out, and the SDK's deadlines end it.
    let (ctx, provider) = sdk_context(&fake, &[silent.endpoint.as_str()]);
    let url = format!("{}/123456789012/orders", silent.endpoint);
    fake.create(
        QUEUE_CONSUMERS,
        manifest("orders", &url, &silent.endpoint, true),
    );
    let started = std::time::Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(90), run_once(&fake, &ctx, "orders"))
        .await
        .expect("a reconcile against a silent endpoint must end by the SDK's operation timeout");
    let err = result.unwrap_err();
    assert_eq!(err.reason(), "Timeout", "{err}");
    assert!(
        silent.accepted.load(Ordering::SeqCst) >= 1,
        "the request did go out"
    );
    assert_eq!(
        provider.asked.lock().unwrap().as_slice(),
        &[Some(silent.endpoint.clone())]
    );
    let reachable = fake_kube::condition_of(qc(&fake, "orders"), "QueueReachable");
    assert_eq!(reachable.status, "False");
    eprintln!(
        "silent endpoint: reconcile returned after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn delete_alarms_never_trusts_status() {
    let (sqs, cw) = moto().await;
    let (url, _dlq) = queues(&sqs).await;
    let cloudwatch = CloudWatchAlarms::new(cw.clone());
    let fake = FakeKube::new();
    let ctx = context(
        &fake,
        Arc::new(SqsReader::new(sqs)),
        Arc::new(cloudwatch.clone()),
        None,
    );
    // Another alarm of qc-operator's, from before the uid tag: its tags alone would not protect it, so
    // only taking the name from the object's identity does.
    let victim = common::unique_name("victim");
    let v = dead_letter_alarm(&victim, "billing-dlq", "other", "billing");
    cw.put_metric_alarm()
        .alarm_name(&victim)
        .namespace(&v.namespace)
        .metric_name(&v.metric_name)
        .statistic(aws_sdk_cloudwatch::types::Statistic::Maximum)
        .comparison_operator(aws_sdk_cloudwatch::types::ComparisonOperator::GreaterThanThreshold)
        .threshold(0.0)
        .period(60)
        .evaluation_periods(1)
        .tags(
            aws_sdk_cloudwatch::types::Tag::builder()
                .key("managed-by")
                .value("qc-operator")
                .build(),
        )
        .send()
        .await
        .unwrap();

    for (name, how) in [
        ("off", "alarm turned off"),
        ("gone", "QueueConsumer deleted"),
    ] {
        fake.create(
            QUEUE_CONSUMERS,
            manifest(name, &url, &common::sqs_endpoint(), true),
        );
        run_once(&fake, &ctx, name).await.unwrap();
        let own = qc(&fake, name)
            .status
            .unwrap()
            .dead_letter
            .unwrap()
            .alarm_name
            .unwrap();
        assert!(cloudwatch.describe(&own).await.unwrap().is_some());
        // Status (writable by anyone with status access) now names the victim.
        fake.update(QUEUE_CONSUMERS, NS, name, |q| {
            q["status"]["deadLetter"]["alarmName"] = json!(victim);
        });
        if name == "off" {
            fake.update(QUEUE_CONSUMERS, NS, name, |q| {
                q["spec"]["deadLetter"]["alarm"] = json!(false);
            });
            run_once(&fake, &ctx, name).await.unwrap();
            assert!(
                qc(&fake, name)
                    .metadata
                    .finalizers
                    .unwrap_or_default()
                    .is_empty()
            );
        } else {
            fake.delete(QUEUE_CONSUMERS, NS, name);
            run_once(&fake, &ctx, name).await.unwrap();
            assert!(
                fake.get(QUEUE_CONSUMERS, NS, name).is_none(),
                "finalizer removed"
            );
        }
        assert_eq!(
            cloudwatch.describe(&own).await.unwrap(),
            None,
            "{how}: own alarm deleted"
        );
        assert!(
            cloudwatch.describe(&victim).await.unwrap().is_some(),
            "{how}: the alarm status named survives"
        );
    }
}

/// SQS that never answers: a reconcile waiting on it stands for one waiting its turn in a saturated
/// AWS budget, or a chain of slow calls each within its own timeout.
struct NeverAnswers;

#[async_trait::async_trait]
impl qc::aws::QueueReader for NeverAnswers {
    async fn attributes(
        &self,
        _: &str,
    ) -> Result<std::collections::HashMap<String, String>, qc::aws::SqsError> {
        std::future::pending().await
    }
    async fn url_for_arn(
        &self,
        _: &qc::aws::QueueArn,
    ) -> Result<Option<String>, qc::aws::SqsError> {
        std::future::pending().await
    }
}

fn aws_consumer(name: &str) -> Value {
    consumer(name)
        .namespace(NS)
        .queue_url("https://sqs.us-east-1.amazonaws.com/123456789012/orders")
        .image("shop/orders:1")
        .scaling(json!({"pollInterval": "1s", "maxReplicas": 10}))
        .alarm(false)
        .json()
}

#[tokio::test]
async fn a_reconcile_past_its_deadline_is_cancelled_and_backed_off() {
    let fake = FakeKube::new();
    let mut ctx = context(&fake, Arc::new(NeverAnswers), Arc::new(NoAlarms), None);
    Arc::get_mut(&mut ctx).unwrap().reconcile_timeout = Duration::from_secs(1);
    fake.create(QUEUE_CONSUMERS, aws_consumer("orders"));
    let err = tokio::time::timeout(Duration::from_secs(30), run_once(&fake, &ctx, "orders"))
        .await
        .expect("a reconcile must end by its deadline")
        .unwrap_err();
    assert_eq!(err.reason(), "ReconcileDeadlineExceeded", "{err}");
    assert!(err.to_string().contains("--reconcile-timeout"), "{err}");
    // Backed off like any failed step, and counted by its reason.
    let action = qc::controller::error_policy(Arc::new(qc(&fake, "orders")), &err, ctx.clone());
    assert_ne!(action, Action::await_change());
    let metrics = ctx.metrics.render();
    assert!(
        metrics.contains("qc_reconcile_errors_total{reason=\"ReconcileDeadlineExceeded\"} 1\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_operators_floors_and_caps_clamp_what_runs_and_status_says_so() {
    let (sqs, _) = moto().await;
    let (url, _dlq) = queues(&sqs).await;
    let fake = FakeKube::new();
    let mut ctx = context(
        &fake,
        Arc::new(SqsReader::new(sqs)),
        Arc::new(NoAlarms),
        None,
    );
    Arc::get_mut(&mut ctx).unwrap().limits = qc::validate::limits::AdminLimits {
        min_poll_interval: Some(qc::api::Duration::from_secs(30)),
        max_replicas: Some(3),
        max_concurrency_per_128mi: Some(4),
        max_consumers_per_namespace: None,
    };
    let mut m = manifest("orders", &url, &common::sqs_endpoint(), false);
    m["spec"]["processing"]["concurrency"] = json!(10);
    fake.create(QUEUE_CONSUMERS, m);
    let before = qc::controller::observe::wall_clock().as_millis();
    let a = run_once(&fake, &ctx, "orders").await.unwrap();
    let after = qc::controller::observe::wall_clock().as_millis();
    // Requeued on this consumer's slot of the floor's 30 s interval, not of the spec's 1 s (a slot
    // of 30 s may itself come within a second: the schedule, not the size, tells them apart).
    let key = qc::controller::key::ConsumerKey::of(&qc(&fake, "orders"));
    let on = |interval: Duration| {
        (before..=after)
            .any(|t| a == Action::requeue(qc::controller::spread::next_poll(&key, interval, t)))
    };
    assert!(
        on(Duration::from_secs(30)),
        "{a:?}: not on the 30 s schedule"
    );
    let status = qc(&fake, "orders").status.unwrap();
    let codes: Vec<(&str, qc::api::Severity)> = status
        .findings
        .iter()
        .map(|f| (f.code.as_str(), f.severity))
        .collect();
    for code in [
        qc::validate::limits::POLL_INTERVAL_BELOW_FLOOR,
        qc::validate::limits::MAX_REPLICAS_ABOVE_CAP,
        qc::validate::limits::CONCURRENCY_ABOVE_MEMORY_CAP,
    ] {
        assert!(
            codes.contains(&(code, qc::api::Severity::Warning)),
            "{code} in {codes:?}"
        );
    }
    // The worker runs the clamped concurrency (4 per 128Mi, the default worker memory).
    let d: Deployment =
        serde_json::from_value(fake.get(DEPLOYMENTS, NS, "orders").unwrap()).unwrap();
    let text = serde_json::to_string(&d).unwrap();
    assert!(text.contains("\"--concurrency\",\"4\""), "{text}");
    // The spec itself is the user's: unchanged.
    assert_eq!(qc(&fake, "orders").spec.processing.concurrency, 10);
}

#[tokio::test]
async fn past_the_namespaces_cap_the_newest_consumer_gets_no_aws_call() {
    let fake = FakeKube::new();
    // Any SQS call would hang the reconcile; none may be made.
    let mut ctx = context(&fake, Arc::new(NeverAnswers), Arc::new(NoAlarms), None);
    {
        let c = Arc::get_mut(&mut ctx).unwrap();
        c.limits.max_consumers_per_namespace = Some(2);
        c.reconcile_timeout = Duration::from_secs(20);
    }
    let (store, mut writer) = kube::runtime::reflector::store::<QueueConsumer>();
    for name in ["a", "b", "c"] {
        fake.create(QUEUE_CONSUMERS, aws_consumer(name));
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(qc(&fake, name)));
    }
    // Another namespace's consumers do not count.
    let mut other = aws_consumer("z");
    other["metadata"]["namespace"] = json!("elsewhere");
    let other: QueueConsumer = serde_json::from_value(other).unwrap();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(other));
    ctx.watch_store(store);
    let a = run_once(&fake, &ctx, "c").await.unwrap();
    // Looked at again each poll interval: a deletion may free a place.
    assert!(is_poll(&a), "{a:?}");
    let q = qc(&fake, "c");
    let reachable = fake_kube::condition_of(q.clone(), "QueueReachable");
    assert_eq!(
        (reachable.status.as_str(), reachable.reason.as_str()),
        ("Unknown", "NamespaceConsumerCapReached"),
        "{reachable:?}"
    );
    let valid = fake_kube::condition_of(q.clone(), "ConfigValid");
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "NamespaceConsumerCapReached"),
        "{valid:?}"
    );
    assert!(
        valid.message.contains("limits.maxConsumersPerNamespace")
            && valid.message.contains("at most 2"),
        "{}",
        valid.message
    );
    let status = q.status.unwrap();
    assert!(
        status
            .findings
            .iter()
            .any(|f| f.code == "NamespaceConsumerCapReached"
                && f.severity == qc::api::Severity::Error),
        "{:?}",
        status.findings
    );
    assert_eq!(fake.get(DEPLOYMENTS, NS, "c"), None, "no rollout");
}
