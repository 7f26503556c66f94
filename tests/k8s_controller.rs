//! The controller's own traffic on real Kubernetes code: the QueueConsumer API (and the CRD API) goes
//! to the real API server `scripts/test` starts (upstream apiextensions-apiserver with etcd), the rest
//! (Deployments, Events, Leases, which that server does not serve) to the in-memory fake, through one
//! client that dispatches by path. What is checked here is what the fake could get wrong about the
//! QueueConsumer itself: status by server-side apply (conditions merged as a list-map keyed by type),
//! no-op reconciles, generation and observedGeneration, the finalizer holding a deletion, watches and
//! requeues, and that only the leader writes status.

mod common;
mod fake_kube;

use common::fixture::consumer;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use common::k8s::{self, RealKube};
use fake_kube::aws::{NoAlarms, TEST_WORKER_IMAGE};
use fake_kube::{DEPLOYMENTS, FakeKube, LEASES, QUEUE_CONSUMERS, Recorded};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use qc::api::QueueConsumer;
use qc::aws::cloudwatch::{
    AlarmDeletion, AlarmOwner, AlarmSpec, Alarms, CloudWatchAlarms, CloudWatchError, ObservedAlarm,
};
use qc::aws::endpoints::AllowedEndpoints;
use qc::aws::{QueueReader, SqsReader, StaticReader};
use qc::controller::observe::{AwsClients, FixedProvider};
use qc::controller::run::{LeaderOptions, RunOptions, run};
use qc::controller::{Context, reconcile};
use qc::render::RenderOptions;
use serde_json::json;

const URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders";

const DLQ_URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders-dlq";
const DLQ_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:orders-dlq";

/// A healthy queue with a DLQ, so that nothing but the Deployment holds Ready.
fn static_reader() -> Arc<dyn QueueReader> {
    let redrive = json!({"deadLetterTargetArn": DLQ_ARN, "maxReceiveCount": 5}).to_string();
    Arc::new(
        StaticReader::new()
            .with_queue(
                URL,
                HashMap::from([
                    ("VisibilityTimeout", "60"),
                    ("MessageRetentionPeriod", "345600"),
                    ("RedrivePolicy", redrive.as_str()),
                    ("ApproximateNumberOfMessages", "0"),
                    ("ApproximateNumberOfMessagesNotVisible", "0"),
                ]),
            )
            .with_queue(
                DLQ_URL,
                HashMap::from([
                    ("MessageRetentionPeriod", "1209600"),
                    ("ApproximateNumberOfMessages", "0"),
                    ("ApproximateNumberOfMessagesNotVisible", "0"),
                ]),
            )
            .with_arn(DLQ_ARN, DLQ_URL),
    )
}

/// A controller context whose client sends the QueueConsumer API to the real server. The test SQS
/// endpoint (moto), which manifests name in `spec.queue.endpoint`, is allowed explicitly.
fn context(
    fake: &FakeKube,
    real: &RealKube,
    sqs: Arc<dyn QueueReader>,
    alarms: Arc<dyn Alarms>,
    identity: &str,
) -> Arc<Context> {
    let mut ctx = Context::new(
        fake.routed_client(real.client.clone()),
        Arc::new(FixedProvider(AwsClients { sqs, alarms })),
        RenderOptions {
            worker_image: TEST_WORKER_IMAGE.into(),
            ..Default::default()
        },
        Some(identity.to_string()),
    );
    ctx.endpoints = AllowedEndpoints::parse(std::env::var("QC_TEST_SQS_ENDPOINT").ok())
        .expect("QC_TEST_SQS_ENDPOINT is an http://HOST:PORT endpoint");
    Arc::new(ctx)
}

fn manifest(url: &str, endpoint: Option<&str>, alarm: bool) -> QueueConsumer {
    let qc = consumer("orders")
        .queue_url(url)
        .concurrency(4)
        .exec("/h")
        .image("app:1")
        .scaling(json!({"pollInterval": "1s", "minReplicas": 1}))
        .alarm(alarm);
    match endpoint {
        Some(e) => qc.endpoint(e),
        None => qc,
    }
    .typed()
}

fn qc_writes(reqs: &[Recorded]) -> Vec<&Recorded> {
    reqs.iter()
        .filter(|r| r.is_write() && r.targets(QUEUE_CONSUMERS))
        .collect()
}

fn condition(qc: &QueueConsumer, type_: &str) -> Condition {
    fake_kube::condition_of(qc.clone(), type_)
}

/// The field manager entries of an object, as (manager, operation, subresource, fieldsV1 JSON).
fn managers(qc: &QueueConsumer) -> Vec<(String, String, String, String)> {
    qc.metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
                m.subresource.clone().unwrap_or_default(),
                m.fields_v1
                    .as_ref()
                    .map(|f| f.0.to_string())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One controller replica ("solo", no alarms, a static queue reader) on the real server and the fake,
/// with the `orders` QueueConsumer created on the real server; None when the test skips.
async fn solo(test: &str) -> Option<(RealKube, FakeKube, Arc<Context>, Api<QueueConsumer>)> {
    let real = k8s::connect(test).await?;
    let fake = FakeKube::new();
    let ctx = context(&fake, &real, static_reader(), Arc::new(NoAlarms), "solo");
    let qcs: Api<QueueConsumer> = Api::namespaced(real.client.clone(), &real.namespace);
    qcs.create(&PostParams::default(), &manifest(URL, None, false))
        .await
        .unwrap();
    Some((real, fake, ctx, qcs))
}

#[tokio::test]
async fn status_is_applied_by_qc_operator_merging_conditions_by_type() {
    let Some((real, fake, ctx, qcs)) =
        solo("status_is_applied_by_qc_operator_merging_conditions_by_type").await
    else {
        return;
    };
    // Another tool owns a condition of its own on the same status.
    qcs.patch_status(
        "orders",
        &PatchParams::apply("external-checker"),
        &Patch::Apply(json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
            "metadata": {"name": "orders"},
            "status": {"conditions": [{"type": "ExternalCheck", "status": "True", "reason": "Checked",
                "message": "all good", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        })),
    )
    .await
    .unwrap();

    reconcile(Arc::new(qcs.get("orders").await.unwrap()), ctx.clone())
        .await
        .unwrap();
    let qc = qcs.get("orders").await.unwrap();
    let status = qc.status.clone().unwrap();
    assert_eq!(status.observed_generation, Some(1));
    let types: Vec<_> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
    // The real server merges the list by `type`: the other manager's condition stays, first.
    assert_eq!(
        types,
        [
            "ExternalCheck",
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
    assert_eq!(condition(&qc, "ExternalCheck").message, "all good");
    let writes = qc_writes(&fake.requests()).len();
    let reqs = fake.requests();
    let status_writes: Vec<_> = qc_writes(&reqs)
        .into_iter()
        .filter(|r| r.is_status())
        .collect();
    assert_eq!(status_writes.len(), 1, "{writes}");
    assert!(status_writes[0].is_apply() && status_writes[0].force());
    assert_eq!(status_writes[0].field_manager(), Some("qc-operator"));
    assert_eq!(status_writes[0].status, 200);
    // The real server's managedFields: qc-operator applied its conditions (keyed by type) on the
    // status subresource; the other tool still owns its own.
    let m = managers(&qc);
    let ours = m
        .iter()
        .find(|(name, op, sub, _)| name == "qc-operator" && op == "Apply" && sub == "status")
        .unwrap_or_else(|| panic!("{m:#?}"));
    assert!(ours.3.contains(r#"k:{\"type\":\"Ready\"}"#), "{}", ours.3);
    assert!(!ours.3.contains("ExternalCheck"), "{}", ours.3);
    let theirs = m
        .iter()
        .find(|(name, ..)| name == "external-checker")
        .unwrap_or_else(|| panic!("{m:#?}"));
    assert!(
        theirs.3.contains(r#"k:{\"type\":\"ExternalCheck\"}"#),
        "{}",
        theirs.3
    );

    // A second reconcile with nothing changed writes nothing, anywhere.
    fake.clear_requests();
    reconcile(Arc::new(qc.clone()), ctx.clone()).await.unwrap();
    let writes = fake.writes();
    assert!(writes.is_empty(), "writes: {writes:#?}");
    assert!(
        fake.requests().iter().any(|r| r.targets(DEPLOYMENTS)),
        "the Deployment was read"
    );
    let again = qcs.get("orders").await.unwrap();
    assert_eq!(
        again.metadata.resource_version, qc.metadata.resource_version,
        "nothing written"
    );
    // The same from the object as the watch cache keeps it (managedFields cut to who owns which
    // condition, no last-applied copy): the other tool's condition is still told apart, so still no write.
    let mut cached = qc.clone();
    qc::controller::cache::trim(&mut cached);
    assert!(
        serde_json::to_vec(&cached).unwrap().len() < serde_json::to_vec(&qc).unwrap().len(),
        "the cache keeps less"
    );
    fake.clear_requests();
    reconcile(Arc::new(cached), ctx.clone()).await.unwrap();
    let writes = fake.writes();
    assert!(
        writes.is_empty(),
        "writes from the cached object: {writes:#?}"
    );
    assert_eq!(
        qcs.get("orders").await.unwrap().metadata.resource_version,
        qc.metadata.resource_version,
        "nothing written from the cached object"
    );

    // Ready flips when the Deployment becomes available: its lastTransitionTime moves, the others'
    // stay (timestamps have second precision: wait past the second).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    fake.update(DEPLOYMENTS, &real.namespace, "orders", |d| {
        d["status"] = json!({"observedGeneration": d["metadata"]["generation"], "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1,
            "conditions": [{"type": "Available", "status": "True"}]});
    });
    reconcile(Arc::new(again), ctx.clone()).await.unwrap();
    let flipped = qcs.get("orders").await.unwrap();
    let (before, after) = (condition(&qc, "Ready"), condition(&flipped, "Ready"));
    assert_eq!(
        (before.status.as_str(), after.status.as_str()),
        ("False", "True")
    );
    assert!(after.last_transition_time.0 > before.last_transition_time.0);
    for t in [
        "QueueReachable",
        "ConfigValid",
        "DeadLetterQueueHealthy",
        "ExternalCheck",
    ] {
        assert_eq!(
            condition(&qc, t).last_transition_time,
            condition(&flipped, t).last_transition_time,
            "{t} did not flip"
        );
    }
}

#[tokio::test]
async fn generation_moves_with_the_spec_and_observed_generation_follows() {
    let Some((real, fake, ctx, qcs)) =
        solo("generation_moves_with_the_spec_and_observed_generation_follows").await
    else {
        return;
    };
    reconcile(Arc::new(qcs.get("orders").await.unwrap()), ctx.clone())
        .await
        .unwrap();
    let qc = qcs.get("orders").await.unwrap();
    assert_eq!(
        qc.metadata.generation,
        Some(1),
        "a status write is no spec change"
    );
    // A label is no spec change either.
    qcs.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "shop"}}})),
    )
    .await
    .unwrap();
    assert_eq!(
        qcs.get("orders").await.unwrap().metadata.generation,
        Some(1)
    );
    let qc = qcs
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"processing": {"concurrency": 7}}})),
        )
        .await
        .unwrap();
    assert_eq!(qc.metadata.generation, Some(2));
    assert_eq!(qc.status.as_ref().unwrap().observed_generation, Some(1));
    reconcile(Arc::new(qc), ctx.clone()).await.unwrap();
    let qc = qcs.get("orders").await.unwrap();
    assert_eq!(qc.status.unwrap().observed_generation, Some(2));
    assert_eq!(
        worker_concurrency(&fake, &real.namespace).as_deref(),
        Some("7")
    );
}

/// Real CloudWatch calls on moto; while `fail_deletes` is set, DeleteAlarms fails as in an outage.
struct FlakyAlarms {
    inner: CloudWatchAlarms,
    fail_deletes: AtomicBool,
}

#[async_trait::async_trait]
impl Alarms for FlakyAlarms {
    async fn describe(&self, name: &str) -> Result<Option<ObservedAlarm>, CloudWatchError> {
        self.inner.describe(name).await
    }
    async fn put(&self, alarm: &AlarmSpec, owner: &AlarmOwner) -> Result<(), CloudWatchError> {
        self.inner.put(alarm, owner).await
    }
    async fn delete(
        &self,
        name: &str,
        owner: &AlarmOwner,
    ) -> Result<AlarmDeletion, CloudWatchError> {
        if self.fail_deletes.load(Ordering::SeqCst) {
            return Err(CloudWatchError::DeleteAlarms {
                name: name.to_string(),
                reason: "ServiceUnavailable",
                message: "injected outage".into(),
            });
        }
        self.inner.delete(name, owner).await
    }
    async fn oldest_message_age(&self, queue_name: &str) -> Result<Option<i64>, CloudWatchError> {
        self.inner.oldest_message_age(queue_name).await
    }
}

#[tokio::test]
async fn the_finalizer_holds_deletion_until_the_alarm_is_gone() {
    let test = "the_finalizer_holds_deletion_until_the_alarm_is_gone";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&common::sqs_endpoint())).await;
    let sqs = aws_sdk_sqs::Client::new(&conf);
    let cw = aws_sdk_cloudwatch::Client::new(&conf);
    let dlq = common::create_queue(&sqs, &common::unique_name("dlq"), &[]).await;
    let dlq_arn = common::queue_arn(&sqs, &dlq).await;
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
    let alarms = Arc::new(FlakyAlarms {
        inner: CloudWatchAlarms::new(cw.clone()),
        fail_deletes: AtomicBool::new(true),
    });
    let fake = FakeKube::new();
    let ctx = context(
        &fake,
        &real,
        Arc::new(SqsReader::new(sqs.clone())),
        alarms.clone(),
        "solo",
    );
    let qcs: Api<QueueConsumer> = Api::namespaced(real.client.clone(), &real.namespace);
    qcs.create(
        &PostParams::default(),
        &manifest(&url, Some(&common::sqs_endpoint()), true),
    )
    .await
    .unwrap();
    reconcile(Arc::new(qcs.get("orders").await.unwrap()), ctx.clone())
        .await
        .unwrap();
    let qc = qcs.get("orders").await.unwrap();
    assert_eq!(
        qc.metadata.finalizers.as_deref(),
        Some(&["sqs.consumers.dev/cleanup".to_string()][..])
    );
    let alarm_name = qc
        .status
        .as_ref()
        .and_then(|s| s.dead_letter.as_ref())
        .and_then(|d| d.alarm_name.clone())
        .expect("the alarm's name in status");
    let exists = |cw: aws_sdk_cloudwatch::Client, name: String| async move {
        !cw.describe_alarms()
            .alarm_names(name)
            .send()
            .await
            .unwrap()
            .metric_alarms()
            .is_empty()
    };
    assert!(exists(cw.clone(), alarm_name.clone()).await);

    // The user deletes it: the real server only marks it while the finalizer is there.
    qcs.delete("orders", &DeleteParams::default())
        .await
        .unwrap();
    let marked = qcs.get("orders").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    // CloudWatch fails: the finalizer stays, and so does the QueueConsumer.
    assert!(reconcile(Arc::new(marked), ctx.clone()).await.is_err());
    let held = qcs.get("orders").await.unwrap();
    assert!(held.metadata.finalizers.is_some());
    assert!(exists(cw.clone(), alarm_name.clone()).await);
    // CloudWatch is back: the alarm goes, then the finalizer, and the server finishes the deletion.
    alarms.fail_deletes.store(false, Ordering::SeqCst);
    reconcile(Arc::new(held), ctx.clone()).await.unwrap();
    assert!(qcs.get_opt("orders").await.unwrap().is_none(), "deleted");
    assert!(!exists(cw.clone(), alarm_name).await, "alarm deleted");
    let finalizer_writes: Vec<_> = fake
        .writes()
        .into_iter()
        .filter(|r| r.targets(QUEUE_CONSUMERS) && !r.is_status())
        .map(|r| (r.method.clone(), r.content_type.clone(), r.status))
        .collect();
    assert_eq!(
        finalizer_writes,
        [
            (
                "PATCH".to_string(),
                Some("application/json-patch+json".to_string()),
                200
            ),
            (
                "PATCH".to_string(),
                Some("application/json-patch+json".to_string()),
                200
            ),
        ],
        "added once, removed once"
    );
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// `--concurrency` of the worker (with an exec handler it runs in the handler's container).
fn worker_concurrency(fake: &FakeKube, ns: &str) -> Option<String> {
    let d = fake.get(DEPLOYMENTS, ns, "orders")?;
    let containers = d["spec"]["template"]["spec"]["containers"]
        .as_array()?
        .clone();
    containers.iter().find_map(|c| {
        let args = c["args"].as_array()?;
        let i = args.iter().position(|a| a == "--concurrency")?;
        args.get(i + 1)?.as_str().map(str::to_string)
    })
}

#[tokio::test]
async fn run_watches_the_real_server_requeues_and_only_the_leader_writes_status() {
    let test = "run_watches_the_real_server_requeues_and_only_the_leader_writes_status";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let fake = FakeKube::new();
    let ns = real.namespace.clone();
    let leader_opts = |id: &str| LeaderOptions {
        lease_name: "qc-operator".into(),
        lease_namespace: "qc-system".into(),
        identity: id.into(),
        lease_seconds: 3,
        grace_seconds: 1,
    };
    let mut replicas = HashMap::new();
    for id in ["replica-a", "replica-b"] {
        let ctx = context(&fake, &real, static_reader(), Arc::new(NoAlarms), id);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(
            ctx.clone(),
            RunOptions {
                namespaces: vec![ns.clone()],
                metrics_addr: free_addr(),
                leader: Some(leader_opts(id)),
                reconcile_concurrency: qc::controller::run::DEFAULT_RECONCILE_CONCURRENCY,
            },
            async move {
                let _ = stop_rx.await;
            },
        ));
        replicas.insert(id, (ctx, stop_tx, task));
    }
    let holder = || {
        fake.get(LEASES, "qc-system", "qc-operator")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
    };
    eventually("a leader", || async { holder().is_some() }).await;
    let leader = holder().unwrap();
    let standby = if leader == "replica-a" {
        "replica-b"
    } else {
        "replica-a"
    };

    // Created on the real server: the leader's watch of it brings the reconcile.
    let qcs: Api<QueueConsumer> = Api::namespaced(real.client.clone(), &ns);
    qcs.create(&PostParams::default(), &manifest(URL, None, false))
        .await
        .unwrap();
    eventually("status on the real server", || async {
        qcs.get("orders")
            .await
            .unwrap()
            .status
            .and_then(|s| s.observed_generation)
            == Some(1)
    })
    .await;
    assert!(fake.get(DEPLOYMENTS, &ns, "orders").is_some());
    // Requeued after the 1s poll interval without any change.
    let ctxs: HashMap<&str, Arc<Context>> =
        replicas.iter().map(|(id, r)| (*id, r.0.clone())).collect();
    let reconciles = |id: &str| ctxs[id].metrics.reconciles.load(Ordering::SeqCst);
    let status_writes = |id: &str| ctxs[id].metrics.status_writes();
    let first = reconciles(&leader);
    eventually("a requeued reconcile", || async {
        reconciles(&leader) > first
    })
    .await;
    assert!(status_writes(&leader) >= 1);
    assert_eq!(reconciles(standby), 0, "the standby does nothing");
    assert_eq!(status_writes(standby), 0, "the standby writes no status");

    // The leader steps down; the standby leads, sees a spec change through its own watch, and writes.
    let (_, stop_tx, task) = replicas.remove(leader.as_str()).unwrap();
    stop_tx.send(()).unwrap();
    task.await.unwrap().unwrap();
    eventually("the standby to lead", || async {
        holder().as_deref() == Some(standby)
    })
    .await;
    qcs.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"processing": {"concurrency": 9}}})),
    )
    .await
    .unwrap();
    eventually("the new leader's Deployment", || async {
        worker_concurrency(&fake, &ns).as_deref() == Some("9")
    })
    .await;
    eventually("the new leader's status", || async {
        qcs.get("orders")
            .await
            .unwrap()
            .status
            .and_then(|s| s.observed_generation)
            == Some(2)
    })
    .await;
    assert!(status_writes(standby) >= 1);
    let qc = qcs.get("orders").await.unwrap();
    let status_managers: Vec<_> = managers(&qc)
        .into_iter()
        .filter(|(_, _, sub, _)| sub == "status")
        .map(|(m, op, ..)| (m, op))
        .collect();
    assert_eq!(
        status_managers,
        [("qc-operator".to_string(), "Apply".to_string())],
        "one field manager for status, whichever replica wrote it"
    );
    let (_, stop_tx, task) = replicas.remove(standby).unwrap();
    stop_tx.send(()).unwrap();
    task.await.unwrap().unwrap();
}

/// A status the controller wrote is kept (to compare with, while the cache lags behind the write) only
/// until its watch shows it: with a 10-minute poll, no later reconcile lets go of it, the watch does.
#[tokio::test]
async fn a_written_status_is_let_go_of_once_the_watch_shows_it() {
    let test = "a_written_status_is_let_go_of_once_the_watch_shows_it";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let fake = FakeKube::new();
    let ns = real.namespace.clone();
    let ctx = context(&fake, &real, static_reader(), Arc::new(NoAlarms), "solo");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run(
        ctx.clone(),
        RunOptions {
            namespaces: vec![ns.clone()],
            metrics_addr: free_addr(),
            leader: None,
            reconcile_concurrency: qc::controller::run::DEFAULT_RECONCILE_CONCURRENCY,
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let qcs: Api<QueueConsumer> = Api::namespaced(real.client.clone(), &ns);
    let mut qc = manifest(URL, None, false);
    qc.spec.scaling.poll_interval = "10m".parse().unwrap();
    qcs.create(&PostParams::default(), &qc).await.unwrap();
    eventually("status on the real server", || async {
        qcs.get("orders")
            .await
            .unwrap()
            .status
            .and_then(|s| s.observed_generation)
            == Some(1)
    })
    .await;
    eventually("the written status let go of", || async {
        ctx.statuses_awaiting_the_watch() == 0
    })
    .await;
    // A spec change the Deployment does not carry: one reconcile, one status write, and nothing else to
    // run a reconcile for ten minutes; only the watch can let go of that status.
    let writes = ctx.metrics.status_writes();
    qcs.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"scaling": {"maxBacklogAge": "7m"}}})),
    )
    .await
    .unwrap();
    eventually("status of the spec change", || async {
        qcs.get("orders")
            .await
            .unwrap()
            .status
            .and_then(|s| s.observed_generation)
            == Some(2)
    })
    .await;
    assert!(ctx.metrics.status_writes() > writes);
    eventually("the second written status let go of", || async {
        ctx.statuses_awaiting_the_watch() == 0
    })
    .await;
    assert!(ctx.metrics.status_writes() >= 1);
    stop_tx.send(()).unwrap();
    task.await.unwrap().unwrap();
}
