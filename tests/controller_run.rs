//! `run` end to end against the in-memory Kubernetes API: watches drive reconciles, the endpoints
//! answer, and with leader election only the Lease holder acts until it steps down.

mod common;
mod fake_kube;

use common::fixture::consumer;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fake_kube::aws::{NoAlarms, context as test_context};
use fake_kube::rbac;
use fake_kube::{DEPLOYMENTS, FakeKube, LEASES, QUEUE_CONSUMERS};
use qc::aws::StaticReader;
use qc::controller::Context;
use qc::controller::run::{LeaderOptions, RunError, RunOptions, run};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders";
const NS: &str = "shop";

fn context(fake: &FakeKube, identity: &str) -> Arc<Context> {
    let reader = StaticReader::new().with_queue(
        URL,
        HashMap::from([
            ("VisibilityTimeout", "60"),
            ("ApproximateNumberOfMessages", "0"),
            ("ApproximateNumberOfMessagesNotVisible", "0"),
        ]),
    );
    test_context(fake, Arc::new(reader), Arc::new(NoAlarms), Some(identity))
}

fn manifest(concurrency: u32) -> Value {
    consumer("orders")
        .namespace(NS)
        .queue_url(URL)
        .concurrency(concurrency)
        .exec("/h")
        .image("app:1")
        .alarm(false)
        .json()
}

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

fn worker_concurrency(fake: &FakeKube) -> Option<String> {
    let d = fake.get(DEPLOYMENTS, NS, "orders")?;
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()?
        .clone();
    let i = args.iter().position(|a| a == "--concurrency")?;
    args.get(i + 1)?.as_str().map(str::to_string)
}

#[tokio::test]
async fn run_reconciles_what_it_watches_and_serves_metrics() {
    let fake = FakeKube::new();
    let ctx = context(&fake, "solo");
    let addr = free_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run(
        ctx.clone(),
        RunOptions {
            namespaces: vec![NS.into()],
            metrics_addr: addr,
            leader: None,
            reconcile_concurrency: qc::controller::run::DEFAULT_RECONCILE_CONCURRENCY,
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    fake.create(QUEUE_CONSUMERS, manifest(4));
    eventually("the Deployment", || {
        fake.get(DEPLOYMENTS, NS, "orders").is_some()
    })
    .await;
    eventually("status", || {
        fake.get(QUEUE_CONSUMERS, NS, "orders").unwrap()["status"]["observedGeneration"] == 1
    })
    .await;
    // A spec change reaches the Deployment through the watch.
    fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["processing"]["concurrency"] = json!(7);
    });
    eventually("the updated Deployment", || {
        worker_concurrency(&fake).as_deref() == Some("7")
    })
    .await;
    // A QueueConsumer in a namespace not watched is left alone.
    let mut other = manifest(1);
    other["metadata"]["namespace"] = json!("elsewhere");
    fake.create(QUEUE_CONSUMERS, other);

    let (status, body) = get(addr, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("qc_reconciles_total"), "{body}");
    assert!(body.contains("qc_deployment_applies_total 2"), "{body}");
    assert!(body.contains("qc_leader 1"), "{body}");
    assert!(get(addr, "/readyz").await.0.contains("200"));
    assert!(get(addr, "/healthz").await.0.contains("200"));
    assert!(get(addr, "/nope").await.0.contains("404"));
    // Per-consumer series, and they go with their consumer.
    let series = "qc_replicas_desired{namespace=\"shop\",queueconsumer=\"orders\"}";
    assert!(body.contains(series), "{body}");
    assert!(
        body.contains("qc_condition{namespace=\"shop\",queueconsumer=\"orders\",type=\"Ready\","),
        "{body}"
    );
    fake.delete(QUEUE_CONSUMERS, NS, "orders");
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(addr, "/metrics").await.1.contains(series) {
        assert!(
            Instant::now() < deadline,
            "the deleted consumer's series are still served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    stop_tx.send(()).unwrap();
    task.await.unwrap().unwrap();
    assert!(fake.get(DEPLOYMENTS, "elsewhere", "orders").is_none());
    rbac::assert_granted(&["config/rbac/role.yaml"], &fake.requests());
}

#[tokio::test]
async fn two_replicas_one_leader_then_failover() {
    let fake = FakeKube::new();
    let leader_opts = |id: &str| LeaderOptions {
        lease_name: "qc-operator".into(),
        lease_namespace: "qc-system".into(),
        identity: id.into(),
        lease_seconds: 3,
        grace_seconds: 1,
    };
    let mut replicas = HashMap::new();
    for id in ["replica-a", "replica-b"] {
        let ctx = context(&fake, id);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(
            ctx.clone(),
            RunOptions {
                namespaces: vec![],
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
    eventually("a leader", || holder().is_some()).await;
    let leader = holder().unwrap();
    let standby = if leader == "replica-a" {
        "replica-b"
    } else {
        "replica-a"
    };

    fake.create(QUEUE_CONSUMERS, manifest(4));
    eventually("the Deployment", || {
        fake.get(DEPLOYMENTS, NS, "orders").is_some()
    })
    .await;
    assert!(
        replicas[leader.as_str()]
            .0
            .metrics
            .reconciles
            .load(Ordering::SeqCst)
            > 0
    );
    assert_eq!(
        replicas[standby]
            .0
            .metrics
            .reconciles
            .load(Ordering::SeqCst),
        0,
        "the standby does nothing"
    );

    // The leader steps down (SIGTERM): it releases the Lease and the standby takes over.
    let (_, stop_tx, task) = replicas.remove(leader.as_str()).unwrap();
    stop_tx.send(()).unwrap();
    task.await.unwrap().unwrap();
    eventually("the standby to lead", || {
        holder().as_deref() == Some(standby)
    })
    .await;
    fake.update(QUEUE_CONSUMERS, NS, "orders", |q| {
        q["spec"]["processing"]["concurrency"] = json!(9);
    });
    eventually("the new leader's update", || {
        worker_concurrency(&fake).as_deref() == Some("9")
    })
    .await;
    assert!(
        replicas[standby]
            .0
            .metrics
            .reconciles
            .load(Ordering::SeqCst)
            > 0
    );

    // Someone else takes the Lease by force: the replica stops rather than act alongside it.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    fake.update(LEASES, "qc-system", "qc-operator", |l| {
        l["spec"]["holderIdentity"] = json!("intruder");
        l["spec"]["renewTime"] = json!(now);
        l["spec"]["leaseDurationSeconds"] = json!(60);
    });
    let (_, _stop_tx, task) = replicas.remove(standby).unwrap();
    let result = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the replica stops after losing the lease")
        .unwrap();
    assert!(
        matches!(result, Err(RunError::LostLease { .. })),
        "{result:?}"
    );
    rbac::assert_granted(
        &[
            "config/rbac/role.yaml",
            "config/rbac/leader_election_role.yaml",
        ],
        &fake.requests(),
    );
}
