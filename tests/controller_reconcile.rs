//! Reconcile against the in-memory Kubernetes API and a real SQS/CloudWatch server (moto): what gets
//! applied, what status says about the queue and its DLQ, the alarm's life, and what is left alone.

// Expected values are exact results of deterministic arithmetic (rates, ratios, sample values).
#![allow(clippy::float_cmp)]

mod common;
mod fake_kube;

use common::fixture::consumer;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use aws_sdk_sqs::types::QueueAttributeName;
use fake_kube::aws::{TEST_WORKER_IMAGE, UnreachableCloudWatch, context};
use fake_kube::rbac;
use fake_kube::{DEPLOYMENTS, EVENTS, FakeKube, QUEUE_CONSUMERS, Recorded};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use qc::api::QueueConsumer;
use qc::aws::cloudwatch::{
    AlarmDeletion, AlarmOwner, AlarmSpec, Alarms, CloudWatchAlarms, CloudWatchError, ObservedAlarm,
};
use qc::aws::{SqsReader, StaticReader};
use qc::controller::{Context, Error, reconcile};
use serde_json::{Value, json};

const NS: &str = "shop";

/// Real CloudWatch calls, counted, so a test can assert that nothing was written.
struct CountingAlarms {
    inner: CloudWatchAlarms,
    puts: AtomicU32,
    deletes: AtomicU32,
}

#[async_trait::async_trait]
impl Alarms for CountingAlarms {
    async fn describe(&self, name: &str) -> Result<Option<ObservedAlarm>, CloudWatchError> {
        self.inner.describe(name).await
    }
    async fn put(&self, alarm: &AlarmSpec, owner: &AlarmOwner) -> Result<(), CloudWatchError> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        self.inner.put(alarm, owner).await
    }
    async fn delete(
        &self,
        name: &str,
        owner: &AlarmOwner,
    ) -> Result<AlarmDeletion, CloudWatchError> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.inner.delete(name, owner).await
    }
    async fn oldest_message_age(&self, queue_name: &str) -> Result<Option<i64>, CloudWatchError> {
        self.inner.oldest_message_age(queue_name).await
    }
}

struct Env {
    fake: FakeKube,
    ctx: Arc<Context>,
    alarms: Arc<CountingAlarms>,
    sqs: aws_sdk_sqs::Client,
    cloudwatch: CloudWatchAlarms,
    cloudwatch_client: aws_sdk_cloudwatch::Client,
    url: String,
    dlq_url: String,
}

async fn moto_clients() -> (aws_sdk_sqs::Client, aws_sdk_cloudwatch::Client) {
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&common::sqs_endpoint())).await;
    (
        aws_sdk_sqs::Client::new(&conf),
        aws_sdk_cloudwatch::Client::new(&conf),
    )
}

/// A source queue with a DLQ (redrive after 5 receives) on moto, and a controller context.
async fn env() -> Env {
    let (sqs, cw) = moto_clients().await;
    let dlq_url = common::create_queue(
        &sqs,
        &common::unique_name("dlq"),
        &[(QueueAttributeName::MessageRetentionPeriod, "1209600".into())],
    )
    .await;
    let dlq_arn = common::queue_arn(&sqs, &dlq_url).await;
    let url = common::create_queue(
        &sqs,
        &common::unique_name("src"),
        &[
            (QueueAttributeName::VisibilityTimeout, "60".into()),
            (
                QueueAttributeName::RedrivePolicy,
                json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}).to_string(),
            ),
        ],
    )
    .await;
    let fake = FakeKube::new();
    let alarms = Arc::new(CountingAlarms {
        inner: CloudWatchAlarms::new(cw.clone()),
        puts: AtomicU32::new(0),
        deletes: AtomicU32::new(0),
    });
    let ctx = context(
        &fake,
        Arc::new(SqsReader::new(sqs.clone())),
        alarms.clone(),
        Some("test"),
    );
    Env {
        fake,
        ctx,
        alarms,
        sqs,
        cloudwatch: CloudWatchAlarms::new(cw.clone()),
        cloudwatch_client: cw,
        url,
        dlq_url,
    }
}

fn qc_manifest(name: &str, url: &str, alarm: bool) -> Value {
    consumer(name)
        .namespace(NS)
        .on_moto(url)
        .p99("2s")
        .timeout("10s")
        .wait_time("1s")
        .http(8080, "/messages")
        .image("shop/orders:1")
        // One replica throughout, so these tests see the Deployment, not the scaler (that is
        // tests/controller_scaling.rs and `a_new_consumer_on_an_idle_queue_starts_at_zero` below).
        .scaling(json!({"pollInterval": "1s", "minReplicas": 1}))
        .alarm(alarm)
        .json()
}

impl Env {
    fn qc(&self, name: &str) -> QueueConsumer {
        serde_json::from_value(self.fake.get(QUEUE_CONSUMERS, NS, name).unwrap()).unwrap()
    }

    async fn reconcile(&self, name: &str) -> Result<kube::runtime::controller::Action, Error> {
        reconcile(Arc::new(self.qc(name)), self.ctx.clone()).await
    }

    fn deployment(&self, name: &str) -> Option<Deployment> {
        self.fake
            .get(DEPLOYMENTS, NS, name)
            .map(|v| serde_json::from_value(v).unwrap())
    }

    fn condition(&self, name: &str, type_: &str) -> Condition {
        fake_kube::condition_of(self.qc(name), type_)
    }

    /// Past the 1s poll interval, so the next reconcile reads the queue again.
    async fn next_poll(&self) {
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }

    async fn send_to_dlq(&self, n: usize) {
        for i in 0..n {
            self.sqs
                .send_message()
                .queue_url(&self.dlq_url)
                .message_body(format!("poison {i}"))
                .send()
                .await
                .unwrap();
        }
    }
}

fn deployment_writes(reqs: &[Recorded]) -> Vec<&Recorded> {
    reqs.iter()
        .filter(|r| r.is_write() && r.targets(DEPLOYMENTS))
        .collect()
}

fn event_reasons(reqs: &[Recorded]) -> Vec<String> {
    reqs.iter()
        .filter(|r| r.method == "POST" && r.targets(EVENTS))
        .filter_map(|r| r.body.as_ref()?["reason"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn create_applies_the_rendered_deployment_with_owner_and_status() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, false));
    let action = e.reconcile("orders").await.unwrap();
    // Back on its own slot of the 1 s poll interval: within one interval.
    assert!(
        (1..=1000).any(|ms| action
            == kube::runtime::controller::Action::requeue(std::time::Duration::from_millis(ms))),
        "{action:?}"
    );

    let qc = e.qc("orders");
    let d = e.deployment("orders").expect("Deployment created");
    let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.kind, "QueueConsumer");
    assert_eq!(owner.uid, qc.metadata.uid.clone().unwrap());
    assert_eq!(owner.controller, Some(true));
    // The worker container is exactly what render produces.
    let rendered = qc::render::deployment(&qc, &e.ctx.render).unwrap();
    let want = rendered.spec.template.spec.unwrap().containers[1].clone();
    let got = d.spec.template.spec.clone().unwrap().containers[1].clone();
    let got_args = got.args.clone().unwrap();
    assert_eq!(got.name, "qc-worker");
    assert_eq!(got.args, want.args);
    assert_eq!(got.image.as_deref(), Some("qc:test"));
    assert!(got_args.contains(&e.url));

    let reqs = e.fake.requests();
    let writes = deployment_writes(&reqs);
    assert_eq!(writes.len(), 1);
    assert!(writes[0].is_apply());
    assert_eq!(writes[0].field_manager(), Some("qc-operator"));
    assert!(writes[0].force());
    assert!(
        writes[0].body.as_ref().unwrap()["spec"]
            .get("replicas")
            .is_none(),
        "render leaves replicas to the scaler"
    );

    let status = qc.status.unwrap();
    assert_eq!(status.observed_generation, Some(1));
    let types: Vec<_> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        [
            "Ready",
            "QueueReachable",
            "ConfigValid",
            "DeadLetterQueueHealthy",
            "ScalingActive",
            "ProcessingTimeWithinDeclared",
            "HandlerHealthy",
            "AlarmSynced"
        ]
    );
    assert_eq!(
        e.condition("orders", "AlarmSynced").reason,
        "AlarmNotManaged"
    );
    // No worker pod yet: nothing observed, and no Event for that on a new consumer.
    let p = e.condition("orders", "ProcessingTimeWithinDeclared");
    assert_eq!(
        (p.status.as_str(), p.reason.as_str()),
        ("Unknown", "NoObservations")
    );
    assert!(!event_reasons(&reqs).contains(&"NoObservations".to_string()));
    // An empty queue has no oldest message: 0, without asking CloudWatch.
    assert_eq!(status.queue.as_ref().unwrap().oldest_age_seconds, Some(0));
    assert_eq!(e.condition("orders", "QueueReachable").status, "True");
    assert_eq!(
        e.condition("orders", "DeadLetterQueueHealthy").reason,
        "DeadLetterQueueEmpty"
    );
    assert_eq!(
        e.condition("orders", "Ready").reason,
        "DeploymentUnavailable"
    );
    assert_eq!(
        status
            .queue
            .as_ref()
            .unwrap()
            .visibility_timeout
            .unwrap()
            .to_string(),
        "1m"
    );
    assert_eq!(status.queue.as_ref().unwrap().max_receive_count, Some(5));
    assert_eq!(
        status.dead_letter.as_ref().unwrap().url.as_deref(),
        Some(e.dlq_url.as_str())
    );
    let status_writes: Vec<_> = e
        .fake
        .writes()
        .into_iter()
        .filter(|r| r.targets(QUEUE_CONSUMERS) && r.is_status())
        .collect();
    assert_eq!(status_writes.len(), 1);
    assert_eq!(status_writes[0].field_manager(), Some("qc-operator"));
    assert!(status_writes[0].is_apply());
    let reasons = event_reasons(&e.fake.requests());
    assert!(
        reasons.contains(&"DeploymentCreated".to_string()),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&"DeploymentUnavailable".to_string()),
        "{reasons:?}"
    );

    // The Deployment controller reports it available: Ready flips, with one Event.
    e.fake.update(DEPLOYMENTS, NS, "orders", |d| {
        d["status"] = json!({"observedGeneration": d["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1,
            "conditions": [{"type": "Available", "status": "True"}]});
    });
    e.fake.clear_requests();
    e.reconcile("orders").await.unwrap();
    assert_eq!(e.condition("orders", "Ready").status, "True");
    assert_eq!(e.qc("orders").status.unwrap().replicas, Some(1));
    assert_eq!(event_reasons(&e.fake.requests()), ["Available"]);
    assert!(deployment_writes(&e.fake.requests()).is_empty());
}

#[tokio::test]
async fn a_new_consumer_on_an_idle_queue_starts_at_zero() {
    let e = env().await;
    let mut m = qc_manifest("orders", &e.url, false);
    m["spec"]["scaling"]["minReplicas"] = json!(0);
    e.fake.create(QUEUE_CONSUMERS, m);
    e.reconcile("orders").await.unwrap();
    // The Deployment (the API server defaults it to 1 replica), then the scaler's 0 at once: no pod
    // exists yet, so there is nothing for the short-history hold to protect.
    let reqs = e.fake.requests();
    let writes = deployment_writes(&reqs);
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[0].field_manager(), Some("qc-operator"));
    assert_eq!(writes[1].field_manager(), Some("qc-operator-scaler"));
    assert_eq!(writes[1].body.as_ref().unwrap()["spec"]["replicas"], 0);
    assert_eq!(e.deployment("orders").unwrap().spec.replicas, Some(0));
    assert_eq!(
        e.condition("orders", "ScalingActive").reason,
        "ScaledToZero"
    );
    // Found again later (as after a controller restart), nothing more is written.
    e.next_poll().await;
    e.fake.clear_requests();
    e.reconcile("orders").await.unwrap();
    assert!(deployment_writes(&e.fake.requests()).is_empty());
}

#[tokio::test]
async fn second_reconcile_with_nothing_changed_writes_nothing() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("idle", &e.url, true));
    e.reconcile("idle").await.unwrap();
    let puts = e.alarms.puts.load(Ordering::SeqCst);
    assert_eq!(puts, 1, "alarm created once");
    e.fake.clear_requests();
    e.reconcile("idle").await.unwrap();
    // Also after the poll interval, when the queue is read again.
    e.next_poll().await;
    e.reconcile("idle").await.unwrap();
    let writes = e.fake.writes();
    assert!(writes.is_empty(), "writes: {writes:#?}");
    assert_eq!(
        e.alarms.puts.load(Ordering::SeqCst),
        puts,
        "alarm not rewritten"
    );
    assert!(
        e.fake.requests().iter().any(|r| r.targets(DEPLOYMENTS)),
        "the Deployment was read"
    );
}

#[tokio::test]
async fn spec_change_updates_the_deployment() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, false));
    e.reconcile("orders").await.unwrap();
    let before = e.deployment("orders").unwrap();
    e.fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["processing"]["concurrency"] = json!(3);
    });
    assert_eq!(e.qc("orders").metadata.generation, Some(2));
    e.fake.clear_requests();
    e.reconcile("orders").await.unwrap();
    let after = e.deployment("orders").unwrap();
    let args = after.spec.template.spec.unwrap().containers[1]
        .args
        .clone()
        .unwrap();
    let i = args.iter().position(|a| a == "--concurrency").unwrap();
    assert_eq!(args[i + 1], "3");
    assert_ne!(
        before.metadata.resource_version,
        after.metadata.resource_version
    );
    assert_eq!(deployment_writes(&e.fake.requests()).len(), 1);
    assert!(event_reasons(&e.fake.requests()).contains(&"DeploymentUpdated".to_string()));
    assert_eq!(e.qc("orders").status.unwrap().observed_generation, Some(2));
}

#[tokio::test]
async fn the_source_queue_oldest_age_comes_from_cloudwatch_like_the_dead_letter_one() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, false));
    e.sqs
        .send_message()
        .queue_url(&e.url)
        .message_body("waiting")
        .send()
        .await
        .unwrap();
    let name = e.url.rsplit('/').next().unwrap().to_string();
    common::put_oldest_age(&e.cloudwatch_client, &name, 77.0).await;
    e.reconcile("orders").await.unwrap();
    let queue = e.qc("orders").status.unwrap().queue.unwrap();
    assert_eq!(queue.visible, Some(1));
    assert_eq!(queue.oldest_age_seconds, Some(77));
}

#[tokio::test]
async fn dead_letter_messages_flip_health_and_back() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, false));
    e.reconcile("orders").await.unwrap();
    assert_eq!(
        e.condition("orders", "DeadLetterQueueHealthy").status,
        "True"
    );
    let ready_before = e.condition("orders", "Ready");

    e.send_to_dlq(2).await;
    // CloudWatch has the DLQ's age of oldest message (moto keeps what is put into AWS/SQS).
    let dlq_name = e.dlq_url.rsplit('/').next().unwrap().to_string();
    common::put_oldest_age(&e.cloudwatch_client, &dlq_name, 125.0).await;
    e.next_poll().await;
    e.fake.clear_requests();
    e.reconcile("orders").await.unwrap();
    let c = e.condition("orders", "DeadLetterQueueHealthy");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "MessagesInDeadLetterQueue")
    );
    assert!(c.message.contains("2 message(s)"), "{}", c.message);
    assert!(c.message.contains("the oldest 2m5s old"), "{}", c.message);
    let dl = e.qc("orders").status.unwrap().dead_letter.unwrap();
    assert_eq!(dl.visible, Some(2));
    assert_eq!(dl.oldest_age_seconds, Some(125));
    assert_eq!(
        event_reasons(&e.fake.requests()),
        ["MessagesInDeadLetterQueue"]
    );
    let ready = e.condition("orders", "Ready");
    assert_eq!(
        (ready.status, ready.reason),
        (ready_before.status, ready_before.reason),
        "DLQ health does not gate Ready"
    );

    e.sqs
        .purge_queue()
        .queue_url(&e.dlq_url)
        .send()
        .await
        .unwrap();
    e.next_poll().await;
    e.fake.clear_requests();
    e.reconcile("orders").await.unwrap();
    assert_eq!(
        e.condition("orders", "DeadLetterQueueHealthy").status,
        "True"
    );
    assert_eq!(event_reasons(&e.fake.requests()), ["DeadLetterQueueEmpty"]);

    // Messages again: a new Event with today's count, not the first one's series with its old note.
    e.send_to_dlq(3).await;
    e.next_poll().await;
    e.fake.clear_requests();
    e.reconcile("orders").await.unwrap();
    let posts: Vec<Value> = e
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.targets(EVENTS))
        .map(|r| {
            assert_eq!(r.method, "POST", "a new Event, not a patched series");
            r.body.unwrap()
        })
        .collect();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0]["reason"], "MessagesInDeadLetterQueue");
    let note = posts[0]["note"].as_str().unwrap();
    assert!(note.contains("3 message(s)"), "{note}");
    let events = e.fake.list(EVENTS);
    let dlq_events = events
        .iter()
        .filter(|ev| ev["reason"] == "MessagesInDeadLetterQueue")
        .count();
    assert_eq!(dlq_events, 2, "one Event per transition");
}

/// A reconcile handed a copy of the QueueConsumer from before its last status write (it fell due while
/// the watch had not brought the write, and waited for a slot while the watch did) compares with the
/// watch cache's newest status, not with its older copy's: it writes nothing again.
#[tokio::test]
async fn a_reconcile_on_an_older_copy_compares_with_the_newest_status() {
    use kube::runtime::{reflector, watcher};
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, false));
    let older = e.qc("orders");
    e.reconcile("orders").await.unwrap();
    // Settled: a reconcile on the current copy writes no status.
    e.fake.clear_requests();
    e.reconcile("orders").await.unwrap();
    let status_writes = |reqs: &[Recorded]| {
        reqs.iter()
            .filter(|r| r.is_write() && r.targets(QUEUE_CONSUMERS) && r.path.ends_with("/status"))
            .count()
    };
    assert_eq!(
        status_writes(&e.fake.requests()),
        0,
        "{:?}",
        e.fake.requests()
    );
    // The watch cache holds the written status, and the watch has let go of the write.
    let (store, mut writer) = reflector::store();
    let current = e.qc("orders");
    writer.apply_watcher_event(&watcher::Event::Apply(current.clone()));
    e.ctx.watch_store(store);
    e.ctx.status_seen(&current);
    assert_eq!(e.ctx.statuses_awaiting_the_watch(), 0);
    assert!(older.status.is_none());
    e.fake.clear_requests();
    reconcile(Arc::new(older), e.ctx.clone()).await.unwrap();
    assert_eq!(
        status_writes(&e.fake.requests()),
        0,
        "{:?}",
        e.fake.requests()
    );
}

/// Repeats of an Event within its fold window go into the first one's series (a patch of its count),
/// not a new Event each; the fake keeps one Event with the count.
#[tokio::test]
async fn repeated_events_fold_into_the_first_ones_series() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, false));
    e.reconcile("orders").await.unwrap();
    let mut writes = Vec::new();
    for concurrency in [2, 3, 4] {
        e.fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
            q["spec"]["processing"]["concurrency"] = json!(concurrency);
        });
        e.fake.clear_requests();
        e.reconcile("orders").await.unwrap();
        writes.extend(
            e.fake
                .requests()
                .into_iter()
                .filter(|r| r.is_write() && r.targets(EVENTS))
                .filter(|r| {
                    r.method == "PATCH"
                        || r.body
                            .as_ref()
                            .is_some_and(|b| b["reason"] == "DeploymentUpdated")
                }),
        );
    }
    let methods: Vec<&str> = writes.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(methods, ["POST", "PATCH", "PATCH"], "{writes:?}");
    let first = writes[0].body.as_ref().unwrap()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    for (r, count) in writes[1..].iter().zip([2, 3]) {
        assert!(r.path.ends_with(&format!("/events/{first}")), "{}", r.path);
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body.as_ref().unwrap()["series"]["count"], count, "{r:?}");
    }
    let updated: Vec<Value> = e
        .fake
        .list(EVENTS)
        .into_iter()
        .filter(|ev| ev["reason"] == "DeploymentUpdated")
        .collect();
    assert_eq!(updated.len(), 1, "{updated:?}");
    assert_eq!(updated[0]["series"]["count"], 3);
    assert_eq!(updated[0]["note"], "Updated Deployment orders");
}

#[tokio::test]
async fn deleted_queue_leaves_the_deployment_untouched() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, false));
    e.reconcile("orders").await.unwrap();
    // The scaler (another field manager) has set replicas.
    e.fake.update(DEPLOYMENTS, NS, "orders", |d| {
        d["spec"]["replicas"] = json!(4);
    });
    let before = e.deployment("orders").unwrap();
    // And the spec changes during the outage: nothing rolls out until the queue is readable.
    e.fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["processing"]["concurrency"] = json!(2);
    });
    e.sqs.delete_queue().queue_url(&e.url).send().await.unwrap();
    e.next_poll().await;
    e.fake.clear_requests();

    let err = e.reconcile("orders").await.unwrap_err();
    assert!(matches!(err, Error::ObserveQueue(_)), "{err}");
    assert_eq!(err.reason(), "QueueDoesNotExist");
    let c = e.condition("orders", "QueueReachable");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "QueueDoesNotExist")
    );
    assert_eq!(e.condition("orders", "Ready").status, "False");
    assert_eq!(
        e.condition("orders", "ScalingActive").reason,
        "MetricsUnavailable"
    );
    assert!(deployment_writes(&e.fake.requests()).is_empty());
    let after = e.deployment("orders").unwrap();
    assert_eq!(
        before.metadata.resource_version,
        after.metadata.resource_version
    );
    assert_eq!(after.spec.replicas, Some(4));
    // The backoff grows with each failure.
    let a1 = qc::controller::error_policy(Arc::new(e.qc("orders")), &err, e.ctx.clone());
    let a2 = qc::controller::error_policy(Arc::new(e.qc("orders")), &err, e.ctx.clone());
    assert_eq!(
        a1,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(5))
    );
    assert_eq!(
        a2,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(10))
    );
}

#[tokio::test]
async fn alarm_is_created_kept_and_removed_through_the_finalizer() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, true));
    e.reconcile("orders").await.unwrap();
    let qc = e.qc("orders");
    assert_eq!(
        qc.metadata.finalizers.as_deref(),
        Some(&["sqs.consumers.dev/cleanup".to_string()][..])
    );
    let dl = qc.status.unwrap().dead_letter.unwrap();
    let name = dl.alarm_name.clone().unwrap();
    let alarm = e
        .cloudwatch
        .describe(&name)
        .await
        .unwrap()
        .expect("alarm exists");
    assert_eq!(
        dl.alarm_state.as_deref(),
        Some(alarm.state.as_str()),
        "state in status"
    );
    let dlq_name = e.dlq_url.rsplit('/').next().unwrap();
    assert_eq!(alarm.spec.queue_name, dlq_name);
    assert_eq!(alarm.spec.metric_name, "ApproximateNumberOfMessagesVisible");

    // Someone edits the alarm: the next reconcile puts it back.
    let mut drifted = alarm.spec.clone();
    drifted.threshold = 10.0;
    e.cloudwatch
        .put(&drifted, &qc::controller::alarm::owner(&e.qc("orders")))
        .await
        .unwrap();
    e.reconcile("orders").await.unwrap();
    assert_eq!(
        e.cloudwatch
            .describe(&name)
            .await
            .unwrap()
            .unwrap()
            .spec
            .threshold,
        0.0
    );

    e.fake.delete(QUEUE_CONSUMERS, NS, "orders");
    assert!(
        e.qc("orders").metadata.deletion_timestamp.is_some(),
        "held by the finalizer"
    );
    e.reconcile("orders").await.unwrap();
    assert_eq!(
        e.cloudwatch.describe(&name).await.unwrap(),
        None,
        "alarm deleted"
    );
    assert!(
        e.fake.get(QUEUE_CONSUMERS, NS, "orders").is_none(),
        "QueueConsumer gone"
    );
    assert!(
        e.deployment("orders").is_none(),
        "Deployment garbage-collected"
    );
    rbac::assert_granted(&["config/rbac/role.yaml"], &e.fake.requests());
}

#[tokio::test]
async fn turning_the_alarm_off_deletes_it_and_drops_the_finalizer() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, true));
    e.reconcile("orders").await.unwrap();
    let name = e
        .qc("orders")
        .status
        .unwrap()
        .dead_letter
        .unwrap()
        .alarm_name
        .unwrap();
    e.fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["deadLetter"]["alarm"] = json!(false);
    });
    e.reconcile("orders").await.unwrap();
    assert_eq!(e.cloudwatch.describe(&name).await.unwrap(), None);
    let qc = e.qc("orders");
    assert!(qc.metadata.finalizers.unwrap_or_default().is_empty());
    assert_eq!(qc.status.unwrap().dead_letter.unwrap().alarm_name, None);
}

#[tokio::test]
async fn no_alarm_means_no_finalizer() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, false));
    e.reconcile("orders").await.unwrap();
    assert!(e.qc("orders").metadata.finalizers.is_none());
    assert_eq!(e.alarms.puts.load(Ordering::SeqCst), 0);
    e.fake.delete(QUEUE_CONSUMERS, NS, "orders");
    assert!(e.fake.get(QUEUE_CONSUMERS, NS, "orders").is_none());
    assert!(e.deployment("orders").is_none());
}

#[tokio::test]
async fn conflicts_retry_soon() {
    let e = env().await;
    e.fake
        .create(QUEUE_CONSUMERS, qc_manifest("orders", &e.url, false));
    e.fake
        .fail("PATCH", "/deployments/orders", 409, "Conflict", 1);
    let err = e.reconcile("orders").await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(
        qc::controller::error_policy(Arc::new(e.qc("orders")), &err, e.ctx.clone()),
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(1))
    );
    e.reconcile("orders").await.unwrap();
    assert!(e.deployment("orders").is_some());
}

// ---- with an in-memory queue reader: call counts and rules ----

fn static_env(reader: StaticReader) -> (FakeKube, Arc<Context>, Arc<StaticReader>) {
    let fake = FakeKube::new();
    let reader = Arc::new(reader);
    let ctx = context(&fake, reader.clone(), Arc::new(UnreachableCloudWatch), None);
    (fake, ctx, reader)
}

const S_URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders";
const S_DLQ: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders-dlq";
const S_DLQ_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders-dlq";

fn static_reader(vt: &str) -> StaticReader {
    let redrive = json!({"deadLetterTargetArn": S_DLQ_ARN, "maxReceiveCount": 5}).to_string();
    StaticReader::new()
        .with_queue(
            S_URL,
            HashMap::from([
                ("QueueArn", "arn:aws:sqs:us-east-1:123456789012:orders"),
                ("VisibilityTimeout", vt),
                ("MessageRetentionPeriod", "1209600"),
                ("ApproximateNumberOfMessages", "0"),
                ("ApproximateNumberOfMessagesNotVisible", "0"),
                ("RedrivePolicy", redrive.as_str()),
            ]),
        )
        .with_queue(
            S_DLQ,
            [
                ("QueueArn", S_DLQ_ARN),
                ("MessageRetentionPeriod", "1209600"),
                ("ApproximateNumberOfMessages", "0"),
            ],
        )
}

fn static_manifest(name: &str, enforce: bool) -> Value {
    let mut m = qc_manifest(name, S_URL, false);
    m["spec"]["queue"] = json!({"url": S_URL});
    m["spec"]["scaling"]["pollInterval"] = json!("1h");
    m["spec"]["processing"]["heartbeat"] = json!({"enabled": false});
    m["spec"]["validation"] = json!({"enforce": enforce});
    m
}

#[tokio::test]
async fn consumers_of_one_queue_share_one_read_per_poll_interval() {
    let (fake, ctx, reader) = static_env(static_reader("60"));
    for name in ["a", "b", "c"] {
        fake.create(QUEUE_CONSUMERS, static_manifest(name, false));
    }
    for name in ["a", "b", "c", "a"] {
        let qc: QueueConsumer =
            serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, name).unwrap()).unwrap();
        reconcile(Arc::new(qc), ctx.clone()).await.unwrap();
    }
    let reads = reader
        .calls()
        .iter()
        .filter(|c| *c == &format!("GetQueueAttributes {S_URL}"))
        .count();
    assert_eq!(reads, 1, "{:?}", reader.calls());
    assert_eq!(fake.list(DEPLOYMENTS).len(), 3);
}

/// Milliseconds since the Unix epoch.
fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn sleep_until_epoch_ms(t: u64) {
    tokio::time::sleep(std::time::Duration::from_millis(
        t.saturating_sub(epoch_ms()),
    ))
    .await;
}

/// #18: at most one GetQueueAttributes per queue per poll interval, wherever the slots of the
/// queue's QueueConsumers fall in it. Consumer a reads at the start of an interval (counted from the
/// epoch), b reconciles 9.4 s later in the same 10 s interval and takes that read (before, a read
/// within a tenth of the interval of its full age was read again, so two consumers of a queue whose
/// slots were far apart read it twice an interval); the next interval reads again, however soon.
#[tokio::test]
async fn a_queue_is_read_once_per_poll_interval_wherever_its_consumers_slots_fall() {
    const P: u64 = 10_000;
    let (fake, ctx, reader) = static_env(static_reader("60"));
    for name in ["a", "b"] {
        let mut m = static_manifest(name, false);
        m["spec"]["scaling"]["pollInterval"] = json!("10s");
        fake.create(QUEUE_CONSUMERS, m);
    }
    let reconcile_one = |name: &'static str| {
        let qc: QueueConsumer =
            serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, name).unwrap()).unwrap();
        reconcile(Arc::new(qc), ctx.clone())
    };
    let reads = || {
        reader
            .calls()
            .iter()
            .filter(|c| *c == &format!("GetQueueAttributes {S_URL}"))
            .count()
    };
    // A loaded machine may oversleep past the interval's end: then try the next interval.
    for _attempt in 0..4 {
        let cell = (epoch_ms() / P + 1) * P;
        sleep_until_epoch_ms(cell + 100).await;
        let before = reads();
        reconcile_one("a").await.unwrap();
        assert_eq!(reads(), before + 1, "a reads at the start of the interval");
        sleep_until_epoch_ms(cell + 9_500).await;
        reconcile_one("b").await.unwrap();
        if epoch_ms() >= cell + P {
            continue;
        }
        assert_eq!(
            reads(),
            before + 1,
            "b, 9.4 s later in the same interval, reads again: {:?}",
            reader.calls()
        );
        sleep_until_epoch_ms(cell + P + 100).await;
        reconcile_one("a").await.unwrap();
        assert_eq!(reads(), before + 2, "the next interval reads again");
        return;
    }
    panic!("the machine never held a 10 s interval's timing");
}

#[tokio::test]
async fn enforce_holds_rollout_on_an_error_finding() {
    // VT 5s is below the budget (2s + 5s margin) and there is no heartbeat: an Error.
    let (fake, ctx, _) = static_env(static_reader("5"));
    fake.create(QUEUE_CONSUMERS, static_manifest("strict", true));
    fake.create(QUEUE_CONSUMERS, static_manifest("lenient", false));
    for name in ["strict", "lenient"] {
        let qc: QueueConsumer =
            serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, name).unwrap()).unwrap();
        reconcile(Arc::new(qc), ctx.clone()).await.unwrap();
    }
    assert!(fake.get(DEPLOYMENTS, NS, "strict").is_none(), "held");
    assert!(
        fake.get(DEPLOYMENTS, NS, "lenient").is_some(),
        "warned, not held"
    );
    let strict: QueueConsumer =
        serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, "strict").unwrap()).unwrap();
    let status = strict.status.unwrap();
    let cond = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
            .clone()
    };
    assert_eq!(cond("ConfigValid").reason, "VisibilityTimeoutBelowBudget");
    assert!(cond("ConfigValid").message.contains("rollout held"));
    assert_eq!(cond("ScalingActive").reason, "HeldByValidation");
    assert!(
        status
            .findings
            .iter()
            .any(|f| f.code == "VisibilityTimeoutBelowBudget"
                && f.recommendation.contains("VisibilityTimeout"))
    );
}

#[tokio::test]
async fn edits_to_the_deployment_are_undone_but_replicas_stay_with_the_scaler() {
    let (fake, ctx, _) = static_env(static_reader("60"));
    fake.create(QUEUE_CONSUMERS, static_manifest("orders", false));
    let get_qc = || -> QueueConsumer {
        serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, "orders").unwrap()).unwrap()
    };
    reconcile(Arc::new(get_qc()), ctx.clone()).await.unwrap();
    // The scaler owns replicas (its own field manager); someone edits the worker's image by hand.
    let scaler: kube::Api<Deployment> = kube::Api::namespaced(fake.client(), NS);
    scaler
        .patch(
            "orders",
            &kube::api::PatchParams::apply("qc-operator-scaler").force(),
            &kube::api::Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "orders"}, "spec": {"replicas": 6}})),
        )
        .await
        .unwrap();
    fake.update(DEPLOYMENTS, NS, "orders", |d| {
        d["spec"]["template"]["spec"]["containers"][1]["image"] = json!("evil:1");
    });
    fake.clear_requests();
    reconcile(Arc::new(get_qc()), ctx.clone()).await.unwrap();
    let d: Deployment =
        serde_json::from_value(fake.get(DEPLOYMENTS, NS, "orders").unwrap()).unwrap();
    let worker = &d.spec.template.spec.as_ref().unwrap().containers[1];
    assert_eq!(
        worker.image,
        Some(TEST_WORKER_IMAGE.to_string()),
        "edit undone"
    );
    assert_eq!(d.spec.replicas, Some(6), "replicas are the scaler's");
    assert_eq!(deployment_writes(&fake.requests()).len(), 1);
}

#[tokio::test]
async fn a_deployment_owned_by_someone_else_is_never_taken_over() {
    let (fake, ctx, _) = static_env(static_reader("60"));
    fake.create(
        DEPLOYMENTS,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "orders", "namespace": NS},
            "spec": {"selector": {"matchLabels": {"app": "mine"}},
                "template": {"metadata": {"labels": {"app": "mine"}},
                    "spec": {"containers": [{"name": "mine", "image": "mine:1"}]}}}}),
    );
    let before = fake.get(DEPLOYMENTS, NS, "orders").unwrap();
    fake.create(QUEUE_CONSUMERS, static_manifest("orders", false));
    fake.clear_requests();
    let qc: QueueConsumer =
        serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, "orders").unwrap()).unwrap();
    reconcile(Arc::new(qc), ctx.clone()).await.unwrap();
    assert!(deployment_writes(&fake.requests()).is_empty());
    assert_eq!(fake.get(DEPLOYMENTS, NS, "orders").unwrap(), before);
    let qc: QueueConsumer =
        serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, "orders").unwrap()).unwrap();
    let status = qc.status.unwrap();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "DeploymentNotOwned");
    assert!(
        ready.message.contains("rename the QueueConsumer"),
        "{}",
        ready.message
    );
    assert_eq!(
        status.replicas, None,
        "someone else's replicas are not reported as ours"
    );
}

/// The value of a per-QueueConsumer series on the controller's /metrics.
fn consumer_metric(ctx: &Context, family: &str, name: &str) -> Option<f64> {
    let prefix = format!("{family}{{namespace=\"{NS}\",queueconsumer=\"{name}\"}} ");
    ctx.metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}

/// A busy queue, whose depth moves at every poll, has its counts written at most once per refresh
/// (a minute; 6 s here) while the per-QueueConsumer series carry them fresh at every poll; the queue
/// emptying is written at once.
#[tokio::test]
async fn a_busy_queues_counts_are_written_once_per_refresh_and_fresh_in_the_metrics() {
    use std::time::{Duration, Instant};
    const REFRESH: Duration = Duration::from_secs(6);
    let mut e = env().await;
    Arc::get_mut(&mut e.ctx).unwrap().counts_refresh = REFRESH;
    let mut m = qc_manifest("busy", &e.url, false);
    // One replica whatever the depth: only the counts move.
    m["spec"]["scaling"] = json!({"pollInterval": "1s", "minReplicas": 1, "maxReplicas": 1});
    e.fake.create(QUEUE_CONSUMERS, m);
    let status_writes = || {
        e.fake
            .writes()
            .into_iter()
            .filter(|r| r.targets(QUEUE_CONSUMERS) && r.is_status())
            .count()
    };
    let visible_in_status = || e.qc("busy").status.unwrap().queue.unwrap().visible;
    let send = |i: i32| {
        e.sqs
            .send_message()
            .queue_url(&e.url)
            .message_body(format!("m{i}"))
            .send()
    };

    send(0).await.unwrap();
    let start = Instant::now();
    e.reconcile("busy").await.unwrap();
    assert_eq!(status_writes(), 1);
    assert_eq!(visible_in_status(), Some(1));
    // (start of the reconcile that wrote, end of the one that wrote next)
    let mut last_write = start;
    let (mut held, mut written_after_held) = (0, 0);
    let mut visible: i32 = 1;
    let mut last_was_write = false;
    // Until the counts were held twice and then written, the last poll being a write.
    for _ in 0..12 {
        if held >= 2 && written_after_held >= 1 && last_was_write {
            break;
        }
        send(visible).await.unwrap();
        visible += 1;
        e.next_poll().await;
        let before = status_writes();
        let start = Instant::now();
        e.reconcile("busy").await.unwrap();
        let end = Instant::now();
        let want = Some(f64::from(visible));
        assert_eq!(
            consumer_metric(&e.ctx, "qc_queue_messages_visible", "busy"),
            want,
            "the series carry the fresh count at every poll"
        );
        let sv = visible_in_status().unwrap();
        last_was_write = status_writes() > before;
        if last_was_write {
            assert_eq!(status_writes(), before + 1);
            assert_eq!(sv, i64::from(visible), "a write carries the fresh counts");
            assert!(
                end - last_write >= REFRESH,
                "written {:?} after the last write",
                end - last_write
            );
            last_write = start;
            if held > 0 {
                written_after_held += 1;
            }
        } else {
            assert!(
                sv < i64::from(visible),
                "held: status keeps {sv}, fresh {visible}"
            );
            held += 1;
        }
    }
    assert!(
        held >= 2 && written_after_held >= 1 && last_was_write,
        "held {held}, written after a hold {written_after_held}"
    );

    // The queue empties: written at once, well within the refresh of the last write.
    e.sqs.purge_queue().queue_url(&e.url).send().await.unwrap();
    e.next_poll().await;
    let before = status_writes();
    e.reconcile("busy").await.unwrap();
    assert!(last_write.elapsed() < REFRESH, "{:?}", last_write.elapsed());
    assert_eq!(status_writes(), before + 1, "the emptying is written");
    assert_eq!(visible_in_status(), Some(0));
    assert_eq!(
        consumer_metric(&e.ctx, "qc_queue_messages_visible", "busy"),
        Some(0.0)
    );
}

#[tokio::test]
async fn alarm_actions_notify_the_topics_the_spec_names() {
    let e = env().await;
    let topic = |n: &str| format!("arn:aws:sns:us-east-1:123456789012:{n}");
    let mut m = qc_manifest("orders", &e.url, true);
    m["spec"]["deadLetter"]["alarmActions"] = json!([topic("oncall")]);
    e.fake.create(QUEUE_CONSUMERS, m);
    e.reconcile("orders").await.unwrap();
    let name = e
        .qc("orders")
        .status
        .unwrap()
        .dead_letter
        .unwrap()
        .alarm_name
        .unwrap();
    let actions = || async {
        let out = e
            .cloudwatch_client
            .describe_alarms()
            .alarm_names(&name)
            .send()
            .await
            .unwrap();
        let a = out
            .metric_alarms
            .unwrap_or_default()
            .pop()
            .expect("the alarm exists");
        assert_ne!(a.actions_enabled, Some(false), "actions enabled");
        let mut got = a.alarm_actions.unwrap_or_default();
        got.sort();
        got
    };
    assert_eq!(actions().await, vec![topic("oncall")]);
    let puts = e.alarms.puts.load(Ordering::SeqCst);
    e.next_poll().await;
    e.reconcile("orders").await.unwrap();
    assert_eq!(
        e.alarms.puts.load(Ordering::SeqCst),
        puts,
        "in sync: not written again"
    );

    // Another topic added (listed out of order): the alarm notifies both.
    e.fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["deadLetter"]["alarmActions"] = json!([topic("team"), topic("oncall")]);
    });
    e.reconcile("orders").await.unwrap();
    assert_eq!(actions().await, vec![topic("oncall"), topic("team")]);

    // Removed: the alarm notifies nobody again, and is kept.
    e.fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["deadLetter"]["alarmActions"] = json!([]);
    });
    e.reconcile("orders").await.unwrap();
    assert_eq!(actions().await, Vec::<String>::new());
    assert_eq!(e.condition("orders", "AlarmSynced").status, "True");
}
