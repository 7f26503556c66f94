//! The scaler wired into reconcile, against the in-memory Kubernetes API and a real SQS server (moto):
//! replicas follow the queue through the scaler's own apply, hold on AWS errors and enforced findings.

mod common;
mod fake_kube;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use aws_sdk_sqs::types::QueueAttributeName;
use fake_kube::aws::{UnreachableCloudWatch, context};
use fake_kube::rbac;
use fake_kube::{DEPLOYMENTS, EVENTS, FakeKube, PODS, QUEUE_CONSUMERS, Recorded};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use qc::api::QueueConsumer;
use qc::aws::{QueueArn, QueueReader, SqsError, SqsReader};
use qc::controller::{Context, Error, reconcile};
use serde_json::{Value, json};

const NS: &str = "shop";

/// Reads moto, or, once `broken` is set, an endpoint nobody listens on (connection refused).
struct Switchable {
    moto: SqsReader,
    closed: SqsReader,
    broken: AtomicBool,
}

impl Switchable {
    fn reader(&self) -> &SqsReader {
        if self.broken.load(Ordering::SeqCst) {
            &self.closed
        } else {
            &self.moto
        }
    }
}

#[async_trait::async_trait]
impl QueueReader for Switchable {
    async fn attributes(&self, url: &str) -> Result<HashMap<String, String>, SqsError> {
        self.reader().attributes(url).await
    }
    async fn url_for_arn(&self, arn: &QueueArn) -> Result<Option<String>, SqsError> {
        self.reader().url_for_arn(arn).await
    }
}

struct Env {
    fake: FakeKube,
    ctx: Arc<Context>,
    reader: Arc<Switchable>,
    sqs: aws_sdk_sqs::Client,
    url: String,
}

/// A port nothing listens on: bound, then released.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A queue on moto with visibility timeout `vt` seconds, and a controller context reading it.
async fn env(vt: u32) -> Env {
    let sqs = common::sqs_client().await;
    let url = common::create_queue(
        &sqs,
        &common::unique_name("scale"),
        &[(QueueAttributeName::VisibilityTimeout, vt.to_string())],
    )
    .await;
    let closed_conf = qc::aws::sdk_config(
        Some("us-east-1"),
        Some(&format!("http://127.0.0.1:{}", closed_port())),
    )
    .await;
    let reader = Arc::new(Switchable {
        moto: SqsReader::new(sqs.clone()),
        closed: SqsReader::new(aws_sdk_sqs::Client::new(&closed_conf)),
        broken: AtomicBool::new(false),
    });
    let fake = FakeKube::new();
    let ctx = context(
        &fake,
        reader.clone(),
        Arc::new(UnreachableCloudWatch),
        Some("test"),
    );
    Env {
        fake,
        ctx,
        reader,
        sqs,
        url,
    }
}

/// P99 2s, concurrency 1, maxBacklogAge 2s: a replica drains one visible message in time, so with
/// nobody receiving, replicas = visible (clamped). Poll every second.
fn manifest(url: &str, scaling: Value) -> Value {
    let mut s = json!({"pollInterval": "1s", "maxBacklogAge": "2s"});
    s.as_object_mut()
        .unwrap()
        .extend(scaling.as_object().unwrap().clone());
    common::fixture::moto_consumer(NS, url)
        .p99("2s")
        .concurrency(1)
        .scaling(s)
        .json()
}

impl Env {
    fn qc(&self) -> QueueConsumer {
        serde_json::from_value(self.fake.get(QUEUE_CONSUMERS, NS, "orders").unwrap()).unwrap()
    }

    async fn reconcile(&self) -> Result<kube::runtime::controller::Action, Error> {
        reconcile(Arc::new(self.qc()), self.ctx.clone()).await
    }

    fn deployment(&self) -> Deployment {
        serde_json::from_value(self.fake.get(DEPLOYMENTS, NS, "orders").unwrap()).unwrap()
    }

    fn replicas(&self) -> Option<i32> {
        self.deployment().spec.replicas
    }

    fn condition(&self, type_: &str) -> Condition {
        fake_kube::condition_of(self.qc(), type_)
    }

    fn scaling_active(&self) -> (String, String, String) {
        let c = self.condition("ScalingActive");
        (c.status, c.reason, c.message)
    }

    /// Past the 1s poll interval, so the next reconcile reads the queue again and takes a sample.
    async fn next_poll(&self) {
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }

    async fn send(&self, n: usize) {
        common::send_numbered(&self.sqs, &self.url, "order", n).await;
    }

    /// Requests since `mark` (an earlier `requests().len()`).
    fn requests_since(&self, mark: usize) -> Vec<Recorded> {
        self.fake.requests().split_off(mark)
    }

    fn mark(&self) -> usize {
        self.fake.requests().len()
    }
}

fn deployment_writes(reqs: &[Recorded]) -> Vec<&Recorded> {
    reqs.iter()
        .filter(|r| r.is_write() && r.targets(DEPLOYMENTS))
        .collect()
}

fn scaler_writes(reqs: &[Recorded]) -> Vec<&Recorded> {
    deployment_writes(reqs)
        .into_iter()
        .filter(|r| r.field_manager() == Some("qc-operator-scaler"))
        .collect()
}

/// (type, reason, note) of the Events created.
fn events(reqs: &[Recorded]) -> Vec<(String, String, String)> {
    reqs.iter()
        .filter(|r| r.method == "POST" && r.targets(EVENTS))
        .filter_map(|r| {
            let b = r.body.as_ref()?;
            Some((
                b["type"].as_str()?.to_string(),
                b["reason"].as_str()?.to_string(),
                b["note"].as_str().unwrap_or("").to_string(),
            ))
        })
        .collect()
}

fn scaled_events(reqs: &[Recorded]) -> Vec<String> {
    events(reqs)
        .into_iter()
        .filter(|(_, reason, _)| reason == "Scaled")
        .map(|(type_, _, note)| {
            assert_eq!(type_, "Normal", "{note}");
            note
        })
        .collect()
}

/// The scaler's apply to `replicas`: forced, its own manager, and a body of identity and
/// `spec.replicas` only.
fn assert_scaler_apply(r: &Recorded, replicas: u64) {
    assert!(r.is_apply(), "{r:?}");
    assert!(r.force(), "{r:?}");
    assert_eq!(r.method, "PATCH");
    assert!(r.path.ends_with("/deployments/orders"), "{}", r.path);
    assert_eq!(
        r.body.as_ref().unwrap(),
        &json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "orders"}, "spec": {"replicas": replicas}})
    );
}

/// Every Deployment write is one of the two managers' applies, and they never carry each other's
/// fields: the main apply has no replicas, the scaler's nothing else.
fn assert_managers_apart(e: &Env) {
    let reqs = e.fake.requests();
    let writes = deployment_writes(&reqs);
    assert!(!writes.is_empty());
    for r in writes {
        let body = r.body.as_ref().unwrap();
        match r.field_manager() {
            Some("qc-operator") => {
                assert!(r.is_apply() && r.force(), "{r:?}");
                assert!(
                    body["spec"].get("replicas").is_none(),
                    "the main apply carries replicas: {body}"
                );
            }
            Some("qc-operator-scaler") => {
                let n = body["spec"]["replicas"].as_u64().unwrap();
                assert_scaler_apply(r, n);
            }
            other => panic!("Deployment written by {other:?}: {r:?}"),
        }
    }
    let owned = |m| -> BTreeSet<String> {
        e.fake
            .owned_fields(DEPLOYMENTS, NS, "orders", m)
            .into_iter()
            .collect()
    };
    assert!(!owned("qc-operator").contains("spec.replicas"));
    let scaler = owned("qc-operator-scaler");
    assert!(
        scaler.is_empty() || scaler == BTreeSet::from(["spec.replicas".to_string()]),
        "{scaler:?}"
    );
}

#[tokio::test]
async fn depth_rises_and_replicas_rise_through_the_scalers_own_apply() {
    let e = env(60).await;
    e.fake.create(
        QUEUE_CONSUMERS,
        manifest(
            &e.url,
            json!({"minReplicas": 0, "maxReplicas": 4, "scaleDownStabilization": "1m"}),
        ),
    );
    // Empty queue: the Deployment is created (the API server's 1 replica) and, since no pod of it
    // exists yet, the scaler takes it to 0 at once rather than hold the default for a window.
    let action = e.reconcile().await.unwrap();
    assert!(
        (1..=1000).any(|ms| action
            == kube::runtime::controller::Action::requeue(std::time::Duration::from_millis(ms))),
        "a good reconcile comes back within pollInterval, on its slot of it: {action:?}"
    );
    assert_eq!(e.replicas(), Some(0));
    let reqs = e.fake.requests();
    let writes = scaler_writes(&reqs);
    assert_eq!(writes.len(), 1);
    assert_scaler_apply(writes[0], 0);
    let (status, reason, _) = e.scaling_active();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "ScaledToZero"));
    assert_eq!(e.qc().status.unwrap().desired_replicas, Some(0));

    // Messages arrive: activation from zero needs the backlog on two consecutive samples.
    e.send(3).await;
    e.next_poll().await;
    let mark = e.mark();
    e.reconcile().await.unwrap();
    assert!(scaler_writes(&e.requests_since(mark)).is_empty());
    assert_eq!(e.replicas(), Some(0));
    let (_, _, message) = e.scaling_active();
    assert!(message.contains("Activation"), "{message}");
    e.next_poll().await;
    let mark = e.mark();
    e.reconcile().await.unwrap();
    let reqs = e.requests_since(mark);
    let writes = deployment_writes(&reqs);
    assert_eq!(writes.len(), 1, "only the scaler writes: {writes:#?}");
    assert_eq!(writes[0].field_manager(), Some("qc-operator-scaler"));
    assert_scaler_apply(writes[0], 3);
    assert_eq!(e.replicas(), Some(3));
    let notes = scaled_events(&reqs);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("from 0 to 3"), "{}", notes[0]);
    assert!(notes[0].contains("3 visible need 3"), "{}", notes[0]);
    let st = e.qc().status.unwrap();
    assert_eq!(st.desired_replicas, Some(3));
    assert!(st.last_scale_time.is_some());
    let (status, reason, message) = e.scaling_active();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Scaling"));
    assert!(message.starts_with("3 replicas (Activate)"), "{message}");

    // A reconcile from a watch event (before the next poll) reuses the cached read: no new sample, no write.
    let mark = e.mark();
    e.reconcile().await.unwrap();
    let reqs = e.requests_since(mark);
    assert!(deployment_writes(&reqs).is_empty(), "{reqs:#?}");
    assert!(scaled_events(&reqs).is_empty());

    // The Deployment controller reports the pods: status.replicas comes from the Deployment's status.
    e.fake.update(DEPLOYMENTS, NS, "orders", |d| {
        d["status"] = json!({"observedGeneration": d["metadata"]["generation"], "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3, "availableReplicas": 3,
            "conditions": [{"type": "Available", "status": "True"}]});
    });
    e.reconcile().await.unwrap();
    assert_eq!(e.qc().status.unwrap().replicas, Some(3));

    // Beyond maxReplicas: capped, and the condition says so.
    e.send(5).await;
    e.next_poll().await;
    let mark = e.mark();
    e.reconcile().await.unwrap();
    let reqs = e.requests_since(mark);
    assert_scaler_apply(scaler_writes(&reqs)[0], 4);
    assert_eq!(e.replicas(), Some(4));
    let (status, reason, _) = e.scaling_active();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "AtMaxReplicas")
    );
    assert!(scaled_events(&reqs)[0].contains("from 3 to 4"));

    // A spec change goes out through the main apply, which leaves the scaler's replicas alone.
    e.fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["processing"]["batchSize"] = json!(5);
    });
    let mark = e.mark();
    e.reconcile().await.unwrap();
    let reqs = e.requests_since(mark);
    let writes = deployment_writes(&reqs);
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(writes[0].field_manager(), Some("qc-operator"));
    assert_eq!(e.replicas(), Some(4), "replicas survive the main apply");
    assert_managers_apart(&e);
    assert_eq!(
        e.ctx.metrics.scale_writes.load(Ordering::Relaxed),
        3,
        "three replica changes written: 0, 3, 4"
    );
    rbac::assert_granted(&["config/rbac/role.yaml"], &e.fake.requests());
}

#[tokio::test]
async fn drained_queue_goes_back_to_min_after_the_stabilization_window() {
    let e = env(60).await;
    e.send(3).await;
    e.fake.create(
        QUEUE_CONSUMERS,
        manifest(
            &e.url,
            json!({"minReplicas": 1, "maxReplicas": 5, "scaleDownStabilization": "4s"}),
        ),
    );
    // The first reconcile creates the Deployment, then scales it at once: main apply, then scaler.
    e.reconcile().await.unwrap();
    let reqs = e.fake.requests();
    let writes = deployment_writes(&reqs);
    assert_eq!(writes.len(), 2, "{writes:#?}");
    assert_eq!(writes[0].field_manager(), Some("qc-operator"));
    assert_scaler_apply(writes[1], 3);
    assert_eq!(e.replicas(), Some(3));

    e.sqs.purge_queue().queue_url(&e.url).send().await.unwrap();
    e.next_poll().await;
    let mark = e.mark();
    e.reconcile().await.unwrap();
    assert_eq!(
        e.replicas(),
        Some(3),
        "within the window the earlier peak holds"
    );
    assert!(scaler_writes(&e.requests_since(mark)).is_empty());

    // Generous bound: the window is 4s; give it 30s on a loaded machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while e.replicas() != Some(1) && std::time::Instant::now() < deadline {
        e.next_poll().await;
        e.reconcile().await.unwrap();
    }
    assert_eq!(e.replicas(), Some(1), "back to minReplicas");
    let reqs = e.requests_since(mark);
    let writes = scaler_writes(&reqs);
    assert_eq!(writes.len(), 1, "straight down to min: {writes:#?}");
    assert_scaler_apply(writes[0], 1);
    let notes = scaled_events(&reqs);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("from 3 to 1"), "{}", notes[0]);
    assert!(notes[0].contains("ScaleDown"), "{}", notes[0]);
    let (status, reason, _) = e.scaling_active();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Scaling"));
    assert_eq!(e.qc().status.unwrap().desired_replicas, Some(1));
    assert_managers_apart(&e);
}

/// A worker pod of the QueueConsumer "orders" (the Deployment's selector labels) that became Ready
/// `took` after its creation.
fn ready_pod(e: &Env, name: &str, took: std::time::Duration) {
    let mut labels = serde_json::Map::new();
    for (k, v) in qc::render::selector_labels("orders") {
        labels.insert(k, json!(v));
    }
    let created = e.fake.create(
        PODS,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"containers": [{"name": "worker", "image": "qc-worker"}]}}),
    );
    let at: k8s_openapi::jiff::Timestamp = created["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let ready = at + k8s_openapi::jiff::SignedDuration::try_from(took).unwrap();
    e.fake.update(PODS, NS, name, |p| {
        p["status"] = json!({"conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": ready.to_string()}]});
    });
}

#[tokio::test]
async fn auto_stabilization_holds_for_the_pods_measured_start_up() {
    let e = env(60).await;
    e.send(3).await;
    // No scaleDownStabilization: `auto`. The pods start in 2-3s (one slow outlier), so the hold is
    // about 3s, not the 30s `auto` holds until a start-up is measured.
    e.fake.create(
        QUEUE_CONSUMERS,
        manifest(&e.url, json!({"minReplicas": 0, "maxReplicas": 5})),
    );
    assert_eq!(
        e.qc().spec.scaling.scale_down_stabilization,
        qc::api::Stabilization::Auto
    );
    for (name, took) in [("orders-a", 2), ("orders-b", 3), ("orders-c", 300)] {
        ready_pod(&e, name, std::time::Duration::from_secs(took));
    }
    e.reconcile().await.unwrap();
    assert_eq!(e.replicas(), Some(3), "scale-up at once");
    let key = qc::controller::ConsumerKey::of(&e.qc());
    assert_eq!(
        e.ctx.scaling.startup(&key),
        Some(qc::api::Duration::from_secs(3)),
        "the median of the pods' creation → Ready"
    );
    let lists: Vec<_> = e
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/pods"))
        .collect();
    assert_eq!(lists.len(), 1, "{lists:#?}");
    assert_eq!(
        lists[0].query.get("labelSelector").map(String::as_str),
        Some(qc::render::selector_string("orders").as_str()),
        "only the consumer's pods"
    );

    e.sqs.purge_queue().queue_url(&e.url).send().await.unwrap();
    e.next_poll().await;
    e.reconcile().await.unwrap();
    assert_eq!(e.replicas(), Some(3), "within the hold the peak stays");
    // Two slow pods more would move the median to 60s if it were measured again now.
    ready_pod(&e, "orders-d", std::time::Duration::from_mins(1));
    ready_pod(&e, "orders-e", std::time::Duration::from_mins(1));
    // To zero after the measured hold: well before the 30s `auto` would hold unmeasured.
    let started = std::time::Instant::now();
    while e.replicas() != Some(0) && started.elapsed() < std::time::Duration::from_secs(20) {
        e.next_poll().await;
        e.reconcile().await.unwrap();
    }
    assert_eq!(e.replicas(), Some(0), "to zero after the hold");
    // The pods are listed at every reconcile (the worker scrape shares the list), but the start-up
    // is measured again only after 5 minutes.
    assert_eq!(
        e.ctx.scaling.startup(&key),
        Some(qc::api::Duration::from_secs(3)),
        "the start-up is measured again only after 5 minutes"
    );
    rbac::assert_granted(&["config/rbac/role.yaml"], &e.fake.requests());
    assert_managers_apart(&e);
}

/// A QueueConsumer scaled to 3 replicas by a backlog of 3, with a 1s window (so only holding, not
/// the window, keeps replicas up during an outage).
async fn scaled_to_three(e: &Env) {
    e.send(3).await;
    e.fake.create(
        QUEUE_CONSUMERS,
        manifest(
            &e.url,
            json!({"minReplicas": 0, "maxReplicas": 5, "scaleDownStabilization": "1s"}),
        ),
    );
    e.reconcile().await.unwrap();
    assert_eq!(e.replicas(), Some(3));
}

/// Reconcile through an outage, past the window and the staleness bound (3 polls): each fails with
/// `reason`, nothing is written to the Deployment, ScalingActive says MetricsUnavailable once.
async fn assert_held_through_outage(e: &Env, reason: &str) {
    let mark = e.mark();
    for _ in 0..4 {
        e.next_poll().await;
        let err = e.reconcile().await.unwrap_err();
        assert!(matches!(err, Error::ObserveQueue(_)), "{err}");
        assert_eq!(err.reason(), reason, "{err}");
        assert_eq!(e.replicas(), Some(3), "replicas held");
    }
    let reqs = e.requests_since(mark);
    assert!(deployment_writes(&reqs).is_empty(), "{reqs:#?}");
    assert!(scaled_events(&reqs).is_empty());
    let (status, cond_reason, message) = e.scaling_active();
    assert_eq!(
        (status.as_str(), cond_reason.as_str()),
        ("False", "MetricsUnavailable")
    );
    assert!(message.contains("replicas held at 3"), "{message}");
    assert_eq!(e.qc().status.unwrap().desired_replicas, Some(3));
    // One Warning for the flip, not one per reconcile.
    let flips: Vec<_> = events(&reqs)
        .into_iter()
        .filter(|(_, r, _)| r == "MetricsUnavailable")
        .collect();
    assert_eq!(flips.len(), 1, "{flips:?}");
    assert_eq!(flips[0].0, "Warning");
}

#[tokio::test]
async fn deleted_queue_holds_replicas_and_says_metrics_unavailable() {
    let e = env(60).await;
    scaled_to_three(&e).await;
    e.sqs.delete_queue().queue_url(&e.url).send().await.unwrap();
    assert_held_through_outage(&e, "QueueDoesNotExist").await;
    assert_managers_apart(&e);
}

#[tokio::test]
async fn unreachable_endpoint_holds_replicas_and_recovers_without_flapping() {
    let e = env(60).await;
    scaled_to_three(&e).await;
    e.reader.broken.store(true, Ordering::SeqCst);
    assert_held_through_outage(&e, "EndpointUnreachable").await;

    // Reachable again, backlog unchanged: scaling resumes from a fresh sample, at the same replicas.
    e.reader.broken.store(false, Ordering::SeqCst);
    e.next_poll().await;
    let mark = e.mark();
    e.reconcile().await.unwrap();
    assert_eq!(e.replicas(), Some(3));
    let reqs = e.requests_since(mark);
    assert!(deployment_writes(&reqs).is_empty(), "{reqs:#?}");
    let (status, reason, _) = e.scaling_active();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Scaling"));
    assert_managers_apart(&e);
}

#[tokio::test]
async fn enforce_with_an_error_finding_holds_replicas() {
    // VT 5s is below the budget (P99 2s + 5s margin) and heartbeats are off: an Error finding.
    let e = env(5).await;
    let mut m = manifest(
        &e.url,
        json!({"minReplicas": 0, "maxReplicas": 5, "scaleDownStabilization": "1m"}),
    );
    m["spec"]["processing"]["heartbeat"] = json!({"enabled": false});
    e.send(2).await;
    e.fake.create(QUEUE_CONSUMERS, m);
    // Not enforced: the finding is reported and scaling goes on.
    e.reconcile().await.unwrap();
    assert_eq!(e.replicas(), Some(2));
    assert_eq!(e.condition("ConfigValid").status, "False");

    e.fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["validation"] = json!({"enforce": true});
    });
    e.send(3).await;
    e.next_poll().await;
    let mark = e.mark();
    e.reconcile().await.unwrap();
    let reqs = e.requests_since(mark);
    assert!(deployment_writes(&reqs).is_empty(), "{reqs:#?}");
    assert_eq!(e.replicas(), Some(2), "held by validation");
    let (status, reason, message) = e.scaling_active();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "HeldByValidation")
    );
    assert!(message.contains("replicas held at 2"), "{message}");
    assert_eq!(e.qc().status.unwrap().desired_replicas, Some(2));
    assert!(scaled_events(&reqs).is_empty());

    // Enforcement lifted: the backlog seen meanwhile scales at once.
    e.fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["validation"] = json!({"enforce": false});
    });
    e.reconcile().await.unwrap();
    assert_eq!(e.replicas(), Some(5));
    assert_managers_apart(&e);
}

#[tokio::test]
async fn from_zero_activation_needs_two_consecutive_samples_above_the_activation_backlog() {
    let e = env(60).await;
    e.fake.create(
        QUEUE_CONSUMERS,
        manifest(
            &e.url,
            json!({"minReplicas": 0, "maxReplicas": 5, "scaleDownStabilization": "0s",
                "activationBacklog": 2}),
        ),
    );
    // Empty queue, no window: created at the API server's 1, scaled to zero at once.
    e.reconcile().await.unwrap();
    assert_eq!(e.replicas(), Some(0));
    let (status, reason, _) = e.scaling_active();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "ScaledToZero"));

    // 2 visible is not above activationBacklog 2.
    e.send(2).await;
    e.next_poll().await;
    e.reconcile().await.unwrap();
    assert_eq!(e.replicas(), Some(0));

    // 3 visible: one sample above is not enough, nor is a watch-triggered reconcile on the same read.
    e.send(1).await;
    e.next_poll().await;
    let mark = e.mark();
    e.reconcile().await.unwrap();
    e.reconcile().await.unwrap();
    assert_eq!(e.replicas(), Some(0));
    assert!(scaler_writes(&e.requests_since(mark)).is_empty());
    let (_, _, message) = e.scaling_active();
    assert!(message.contains("Activation"), "{message}");

    // The second consecutive sample above activates, straight to the recommendation.
    e.next_poll().await;
    let mark = e.mark();
    e.reconcile().await.unwrap();
    let reqs = e.requests_since(mark);
    let writes = scaler_writes(&reqs);
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_scaler_apply(writes[0], 3);
    let notes = scaled_events(&reqs);
    assert!(notes[0].contains("from 0 to 3"), "{notes:?}");
    assert!(notes[0].contains("Activate"), "{notes:?}");
    let (status, reason, _) = e.scaling_active();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Scaling"));
    assert_managers_apart(&e);
}

#[tokio::test]
async fn the_history_goes_with_the_queueconsumer() {
    let e = env(60).await;
    let mut m = manifest(&e.url, json!({"scaleDownStabilization": "1m"}));
    // Someone else's finalizer keeps the object visible while it is being deleted.
    m["metadata"]["finalizers"] = json!(["example.com/hold"]);
    e.fake.create(QUEUE_CONSUMERS, m);
    e.reconcile().await.unwrap();
    let key = qc::controller::ConsumerKey::of(&e.qc());
    assert!(
        e.qc().metadata.uid.as_deref() == Some(key.as_str()),
        "keyed by uid"
    );
    assert!(e.ctx.scaling.contains(&key));
    e.fake.delete(QUEUE_CONSUMERS, NS, "orders");
    e.reconcile().await.unwrap();
    assert!(!e.ctx.scaling.contains(&key), "dropped on deletion");
    assert!(e.ctx.scaling.is_empty());
}

/// What the Deployment controller reports: it has seen the current generation (or not), `total`
/// pods of which `updated` run the current template and `available` serve, and its own conditions
/// (Available per its minimum, Progressing as given).
fn report(
    e: &Env,
    observed: bool,
    (total, updated, available): (i32, i32, i32),
    progressing: Value,
) {
    e.fake.update(DEPLOYMENTS, NS, "orders", |d| {
        let generation = d["metadata"]["generation"].as_i64().unwrap();
        let want = d["spec"]["replicas"].as_i64().unwrap();
        let minimum = i64::from(available) >= want - want / 4;
        d["status"] = json!({
            "observedGeneration": if observed { generation } else { generation - 1 },
            "replicas": total, "updatedReplicas": updated,
            "readyReplicas": available, "availableReplicas": available,
            "conditions": [
                {"type": "Available", "status": if minimum { "True" } else { "False" },
                 "reason": if minimum { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" }},
                progressing]});
    });
}

fn ready(e: &Env) -> (String, String, String) {
    let c = e.condition("Ready");
    (c.status, c.reason, c.message)
}

/// #34 item 2: Ready follows a rollout of a new pod template until every replica runs it and is
/// available, and a stalled one says why in the Deployment's words; the scaler's replica writes
/// (which leave observedGeneration behind just the same) never take Ready away.
#[tokio::test]
async fn ready_follows_a_template_rollout_but_not_a_scale_write() {
    let e = env(60).await;
    // A dead-letter queue, so that no Error finding (NoRedrivePolicy) holds Ready.
    let dlq = common::create_queue(&e.sqs, &common::unique_name("dlq"), &[]).await;
    let policy = json!({"deadLetterTargetArn": common::queue_arn(&e.sqs, &dlq).await,
        "maxReceiveCount": 5});
    e.sqs
        .set_queue_attributes()
        .queue_url(&e.url)
        .attributes(QueueAttributeName::RedrivePolicy, policy.to_string())
        .send()
        .await
        .unwrap();
    scaled_to_three(&e).await;
    let done = json!({"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"});
    let moving = json!({"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"});
    report(&e, true, (3, 3, 3), done.clone());
    e.reconcile().await.unwrap();
    assert_eq!(ready(&e).1, "Available");

    // Two more messages: the scaler writes 5 replicas. The Deployment's generation moves on and
    // its status lags (as on a real cluster, where it also reports Available=False until 4 serve):
    // Ready stays True, at each step, with no Event.
    e.send(2).await;
    e.next_poll().await;
    let generation = e.deployment().metadata.generation;
    let mark = e.mark();
    e.reconcile().await.unwrap();
    assert_eq!(e.replicas(), Some(5));
    assert!(e.deployment().metadata.generation > generation);
    assert_eq!(ready(&e).0, "True", "{:?}", ready(&e));
    report(&e, true, (5, 5, 3), moving.clone());
    e.reconcile().await.unwrap();
    assert_eq!(ready(&e).0, "True", "{:?}", ready(&e));
    let reasons: Vec<_> = events(&e.requests_since(mark))
        .into_iter()
        .map(|(_, r, _)| r)
        .collect();
    assert_eq!(reasons, ["Scaled"], "{reasons:?}");
    report(&e, true, (5, 5, 5), done.clone());
    e.reconcile().await.unwrap();

    // A spec change that changes the pod template: a rollout. Not Ready until the Deployment
    // controller has seen it and every replica runs the new template and is available.
    e.fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["processing"]["batchSize"] = json!(5);
    });
    let mark = e.mark();
    e.reconcile().await.unwrap();
    let (status, reason, message) = ready(&e);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "RollingOut"),
        "{message}"
    );
    assert!(
        events(&e.requests_since(mark))
            .iter()
            .any(|(t, r, _)| t == "Normal" && r == "RollingOut")
    );
    assert_eq!(e.replicas(), Some(5), "a rollout is no scaling event");
    // Reconciled again before the Deployment controller has looked (its counts are the last
    // template's): still rolling out.
    e.reconcile().await.unwrap();
    let (_, reason, message) = ready(&e);
    assert_eq!(reason, "RollingOut");
    assert!(
        message.contains("waiting for the Deployment controller to observe generation"),
        "{message}"
    );
    report(&e, true, (6, 2, 4), moving.clone());
    e.reconcile().await.unwrap();
    let (_, reason, message) = ready(&e);
    assert_eq!(reason, "RollingOut");
    assert!(
        message.contains(
            "2 of 5 replica(s) run the current pod template, 4 pod(s) of an older one still running"
        ),
        "{message}"
    );
    // Stuck: the Deployment controller gave up waiting for progress.
    report(
        &e,
        true,
        (6, 2, 4),
        json!({"type": "Progressing", "status": "False",
        "reason": "ProgressDeadlineExceeded",
        "message": "ReplicaSet \"orders-5d8c7b\" has timed out progressing."}),
    );
    e.reconcile().await.unwrap();
    let (status, reason, message) = ready(&e);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "RolloutStalled")
    );
    assert!(
        message.contains("ReplicaSet \"orders-5d8c7b\" has timed out progressing."),
        "{message}"
    );
    // Unstuck (the image arrived): the old pods are gone, one new pod is not available yet.
    report(&e, true, (5, 5, 4), moving);
    e.reconcile().await.unwrap();
    assert_eq!(ready(&e).1, "RollingOut", "{:?}", ready(&e));
    report(&e, true, (5, 5, 5), done);
    e.reconcile().await.unwrap();
    let (status, reason, message) = ready(&e);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "Available"),
        "{message}"
    );
    assert_managers_apart(&e);
}
