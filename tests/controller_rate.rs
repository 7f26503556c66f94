//! `processing.maxRate` in the controller (docs/controller.md, "The rate share"), against the
//! in-memory API and moto: each running worker pod's `sqs.consumers.dev/rate-share` annotation is
//! maxRate / the pods that may start messages, written in the reconcile that changes replicas, only
//! when it changes, by the scaler's field manager; the scaler holds replicas at what the rate keeps
//! busy (`ScalingActive` `AtMaxRate`).

mod common;
mod fake_kube;
#[path = "worker/support.rs"]
mod support;

use std::sync::Arc;

use common::fixture::consumer;
use fake_kube::aws::{NoAlarms, context};
use fake_kube::rbac;
use fake_kube::{DEPLOYMENTS, FakeKube, PODS, QUEUE_CONSUMERS};
use qc::api::QueueConsumer;
use qc::aws::SqsReader;
use qc::controller::{Context, reconcile};
use serde_json::{Value, json};
use support::TestQueue;

const NS: &str = "shop";
const NAME: &str = "orders";
const SHARE: &str = "sqs.consumers.dev/rate-share";

struct Env {
    fake: FakeKube,
    ctx: Arc<Context>,
    queue: TestQueue,
}

impl Env {
    async fn new() -> Env {
        let queue = TestQueue::new("rate-share", 30, 5, false).await;
        let fake = FakeKube::new();
        let ctx = context(
            &fake,
            Arc::new(SqsReader::new(queue.client.clone())),
            Arc::new(NoAlarms),
            Some("test"),
        );
        Env { fake, ctx, queue }
    }

    fn manifest(&self, max_rate: u32, min: u32, max: u32) -> Value {
        let mut m = consumer(NAME)
            .namespace(NS)
            .on_moto(&self.queue.url)
            .p99("1s")
            .concurrency(10)
            .wait_time("1s")
            .http(8080, "/messages")
            .image("shop/orders:1")
            .scaling(json!({"pollInterval": "1s", "minReplicas": min, "maxReplicas": max}))
            .alarm(false)
            .json();
        m["spec"]["processing"]["maxRate"] = json!(max_rate);
        m
    }

    fn qc(&self) -> QueueConsumer {
        serde_json::from_value(self.fake.get(QUEUE_CONSUMERS, NS, NAME).unwrap()).unwrap()
    }

    async fn reconcile(&self) {
        reconcile(Arc::new(self.qc()), self.ctx.clone())
            .await
            .unwrap();
    }

    /// A running worker pod of this QueueConsumer (no IP: its /metrics are not read).
    fn add_pod(&self, pod: &str) {
        self.fake.create_with_status(
            PODS,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": NS,
                             "labels": serde_json::to_value(qc::render::selector_labels(NAME)).unwrap()},
                "spec": {"containers": [{"name": "app", "image": "shop/orders:1"},
                                        {"name": "qc-worker", "image": "qc:test"}]},
                "status": {"phase": "Running"}
            }),
        );
    }

    fn share(&self, pod: &str) -> Value {
        self.fake.get(PODS, NS, pod).unwrap()["metadata"]["annotations"][SHARE].clone()
    }

    fn replicas(&self) -> Value {
        self.fake.get(DEPLOYMENTS, NS, NAME).unwrap()["spec"]["replicas"].clone()
    }

    fn pod_writes(&self) -> Vec<fake_kube::Recorded> {
        self.fake
            .writes()
            .into_iter()
            .filter(|r| r.targets(PODS))
            .collect()
    }
}

#[tokio::test]
async fn the_share_annotation_follows_the_replicas() {
    let e = Env::new().await;
    e.fake.create(QUEUE_CONSUMERS, e.manifest(20, 1, 3));
    e.reconcile().await;
    e.add_pod("orders-a");
    e.reconcile().await;
    assert_eq!(e.replicas(), json!(1));
    assert_eq!(e.share("orders-a"), json!("20"));

    // Nothing changed: no write.
    e.fake.clear_requests();
    e.reconcile().await;
    assert!(e.pod_writes().is_empty(), "{:#?}", e.pod_writes());

    // Scale to 3: the running pod drops to a third in the same reconcile that adds the others.
    e.fake.update(QUEUE_CONSUMERS, NS, NAME, |q| {
        q["spec"]["scaling"]["minReplicas"] = json!(3);
    });
    e.fake.clear_requests();
    e.reconcile().await;
    assert_eq!(e.replicas(), json!(3));
    assert_eq!(e.share("orders-a"), json!("6.666"));
    let writes: Vec<_> = e.fake.writes();
    let scale = writes
        .iter()
        .position(|r| {
            r.targets(DEPLOYMENTS)
                && r.body
                    .as_ref()
                    .is_some_and(|b| b["spec"]["replicas"] == json!(3))
        })
        .expect("scaled");
    let share = writes
        .iter()
        .position(|r| r.targets(PODS))
        .expect("share written");
    assert!(scale < share, "{writes:#?}");
    for w in e.pod_writes() {
        assert_eq!(w.field_manager(), Some("qc-operator-scaler"));
    }

    // The new pods get theirs at the next reconcile.
    e.add_pod("orders-b");
    e.add_pod("orders-c");
    e.reconcile().await;
    for pod in ["orders-a", "orders-b", "orders-c"] {
        assert_eq!(e.share(pod), json!("6.666"), "{pod}");
    }

    // A new maxRate reaches every pod without a restart (only the annotation changes).
    e.fake.update(QUEUE_CONSUMERS, NS, NAME, |q| {
        q["spec"]["processing"]["maxRate"] = json!(30);
    });
    e.reconcile().await;
    for pod in ["orders-a", "orders-b", "orders-c"] {
        assert_eq!(e.share(pod), json!("10"), "{pod}");
    }

    // Scale to 1: the remaining pod keeps a third while the others still run, then takes it all.
    e.fake.update(QUEUE_CONSUMERS, NS, NAME, |q| {
        q["spec"]["scaling"]["minReplicas"] = json!(1);
        q["spec"]["scaling"]["maxReplicas"] = json!(1);
    });
    e.reconcile().await;
    assert_eq!(e.replicas(), json!(1));
    assert_eq!(e.share("orders-a"), json!("10"));
    e.fake.delete(PODS, NS, "orders-b");
    e.fake.delete(PODS, NS, "orders-c");
    e.reconcile().await;
    assert_eq!(e.share("orders-a"), json!("30"));
    assert!(
        e.fake
            .owned_fields(PODS, NS, "orders-a", "qc-operator-scaler")
            .iter()
            .any(|f| f.contains("rate-share")),
        "{:?}",
        e.fake
            .owned_fields(PODS, NS, "orders-a", "qc-operator-scaler")
    );
    rbac::assert_granted(&["config/rbac/role.yaml"], &e.fake.requests());
}

#[tokio::test]
async fn replicas_are_held_at_what_the_rate_keeps_busy() {
    let e = Env::new().await;
    // A backlog that asks for many replicas; 10 slots at P99 1s make 10/s a replica, so 20/s keeps 2.
    let bodies: Vec<String> = (0..300).map(|n| format!("m{n}")).collect();
    e.queue.send_all(&bodies, |_| String::new()).await;
    let mut m = e.manifest(20, 1, 10);
    // 300 visible within 5s at 10 per replica-second ask for 6 replicas.
    m["spec"]["scaling"]["maxBacklogAge"] = json!("5s");
    e.fake.create(QUEUE_CONSUMERS, m);
    for _ in 0..3 {
        e.reconcile().await;
        tokio::time::sleep(std::time::Duration::from_millis(1050)).await;
    }
    e.reconcile().await;
    assert_eq!(e.replicas(), json!(2));
    let scaling = fake_kube::condition_of(e.qc(), "ScalingActive");
    assert_eq!(scaling.status, "True");
    assert_eq!(scaling.reason, "AtMaxRate", "{}", scaling.message);
    assert!(
        scaling.message.contains("limited by MaxRate"),
        "{}",
        scaling.message
    );
}
