//! The whole product as Kubernetes runs it (issue 43): a real node (the kubelet with containerd and runc,
//! pods on a CNI bridge; scripts/k8s-node.sh) under the real control plane, the operator installed with
//! helm and running in cluster from its image (2 replicas, leader election, its ServiceAccount, probes,
//! the restricted profile), worker pods of the product's image with the test handler's image beside them,
//! consuming from a moto the pods reach on the node's address.
//!
//! Each scenario asserts on SQS (queue, DLQ) and Kubernetes (Deployment, pods, Lease, status) state, and
//! counts what the handler saw from the file it appends each message id to (a hostPath of the node): every
//! message sent is handled exactly once, with no idempotency store to hide a second delivery.
//!
//! The node, the operator install and the handler's notes: tests/common/node.rs.
//!
//! With `QC_REQUIRE_NODE=1` (scripts/test) these tests cannot skip.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use aws_sdk_sqs::types::{QueueAttributeName as A, SendMessageBatchRequestEntry};
use common::cluster::eventually;
use common::node::{
    assert_handled_once, condition, counts, deletion_cost, events, holder, kill_container, node,
    notes, pod_hash, ready, seen, send, tag_handler_image,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;

/// One scenario at a time: each runs an operator and up to three workers on a 2-core machine, and (f)
/// kills a controller.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// (a) 2,000 messages on an idle consumer at minReplicas 0: the Deployment scales from zero, the pods
/// consume, drain, and it scales back to zero; every message handled exactly once, the queue and the DLQ
/// empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scales_from_zero_drains_and_returns_to_zero() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) = node("scales_from_zero_drains_and_returns_to_zero").await else {
        return;
    };
    let s = node.scenario("node-a").await;
    let (ns, sqs, url, seen_at) = (&s.ns, &s.sqs, &s.url, &s.seen);
    node.apply(ns, &node.consumer(ns, "orders", url, seen_at.path(), 3))
        .await;

    // Reconciled by the controller in cluster, idle: the Deployment exists at zero replicas.
    node.wait_workers(ns, (0, 0), 90).await;
    let lease: Api<Lease> = Api::namespaced(node.cluster.admin.clone(), &s.op.ns);
    let leader = holder(&lease.get(&s.op.fullname).await.expect("the Lease")).expect("a leader");
    assert!(
        leader.starts_with(&s.op.fullname),
        "the Lease is held by a controller pod: {leader}"
    );

    let bodies: Vec<String> = (0..2000).map(|i| format!("message {i}")).collect();
    // Ten first: the time from zero to the first handling; then the rest while the worker consumes.
    let started = Instant::now();
    let mut sent = send(sqs, url, &bodies[..10]).await;
    // The worker takes messages before its pod reports Ready (the readiness probe's period), and ten
    // are done before it would: wait for a worker pod, then for the handling.
    eventually(
        120,
        "scaled from zero: a worker pod",
        || node.describe(ns),
        || async {
            let (replicas, _) = node.workers(ns, "orders").await?;
            (replicas >= 1 && !node.worker_pods(ns, "orders").await.is_empty()).then_some(())
        },
    )
    .await;
    let pod_after = started.elapsed().as_secs_f64();
    eventually(
        120,
        "the first message handled",
        || node.describe(ns),
        || async { (!seen(seen_at.path()).is_empty()).then_some(()) },
    )
    .await;
    eprintln!(
        "from zero: a worker pod {pod_after:.1} s and the first message handled {:.1} s after it was sent",
        started.elapsed().as_secs_f64()
    );
    sent.extend(send(sqs, url, &bodies[10..]).await);
    assert_eq!(sent.len(), 2000);
    let peak = std::sync::atomic::AtomicI32::new(0);
    eventually(
        600,
        "all 2,000 messages handled",
        || format!("{} seen\n{}", seen(seen_at.path()).len(), node.describe(ns)),
        || async {
            if let Some((replicas, _)) = node.workers(ns, "orders").await {
                peak.fetch_max(replicas, std::sync::atomic::Ordering::Relaxed);
            }
            (seen(seen_at.path()).len() >= sent.len()).then_some(())
        },
    )
    .await;
    eprintln!(
        "peak replicas {}",
        peak.load(std::sync::atomic::Ordering::Relaxed)
    );
    eventually(
        180,
        "scaled back to zero, every pod gone",
        || node.describe(ns),
        || async {
            (node.workers(ns, "orders").await? == (0, 0)
                && node.worker_pods(ns, "orders").await.is_empty())
            .then_some(())
        },
    )
    .await;
    eprintln!(
        "drained in {:.1} s, back to zero",
        started.elapsed().as_secs_f64()
    );
    let again = assert_handled_once(seen_at.path(), &sent);
    eprintln!("{again} received more than once before their handling");
    s.settled(&sent).await;
    drop(s);
}

/// (c) `kubectl delete pod` of a busy worker: its in-flight messages finish (the handler outlives the
/// worker's drain), what it had received but not begun is released, the ReplicaSet's replacement takes the
/// rest; every message handled exactly once, none cut short, nothing in the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_busy_worker_pod_loses_nothing_and_cuts_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) = node("deleting_a_busy_worker_pod_loses_nothing_and_cuts_nothing").await else {
        return;
    };
    let s = node.scenario("node-c").await;
    let (ns, sqs, url, seen_at) = (&s.ns, &s.sqs, &s.url, &s.seen);
    let mut doc = node.consumer(ns, "orders", url, seen_at.path(), 1);
    doc["spec"]["scaling"]["minReplicas"] = 1.into();
    node.apply(ns, &doc).await;
    node.wait_workers(ns, (1, 1), 120).await;
    // 60 messages of 2 s each at concurrency 10: about 12 s of work for the one pod.
    let bodies: Vec<String> = (0..60).map(|i| format!("slow {i}")).collect();
    let sent = send(sqs, url, &bodies).await;
    // Deleted while handlings are under way: the second ten begun, not finished.
    let (done_then, begun_then) = eventually(
        60,
        "ten handled, more in flight",
        || node.describe(ns),
        || async {
            let done = seen(seen_at.path()).len();
            let begun: usize = notes(seen_at.path(), "started")
                .values()
                .map(Vec::len)
                .sum();
            (done >= 10 && begun >= done + 5).then_some((done, begun))
        },
    )
    .await;
    let busy = node.worker_pods(ns, "orders").await;
    assert_eq!(busy.len(), 1);
    let busy_name = busy[0].metadata.name.clone().expect("a name");
    Api::<Pod>::namespaced(node.cluster.admin.clone(), ns)
        .delete(&busy_name, &DeleteParams::default())
        .await
        .expect("delete the busy pod");
    eventually(
        240,
        "all 60 handled",
        || format!("{} seen\n{}", seen(seen_at.path()).len(), node.describe(ns)),
        || async { (seen(seen_at.path()).len() >= sent.len()).then_some(()) },
    )
    .await;
    let again = assert_handled_once(seen_at.path(), &sent);
    let by_pod = notes(seen_at.path(), "receipts").values().fold(
        BTreeMap::<String, usize>::new(),
        |mut m, h| {
            *m.entry(h[0].1.clone()).or_default() += 1;
            m
        },
    );
    eprintln!(
        "{} begun and not finished ({done_then} finished) when {busy_name} was deleted; handled by pod: \
         {by_pod:?}; {again} received again before their handling",
        begun_then - done_then
    );
    assert!(
        by_pod.contains_key(&busy_name),
        "the deleted pod handled some"
    );
    assert!(
        by_pod.len() >= 2,
        "its replacement handled the rest: {by_pod:?}"
    );
    s.settled(&sent).await;
    drop(s);
}

/// (f) The leading controller pod's process killed (SIGKILL through containerd) while a backlog drains:
/// the other replica takes the Lease over, and scaling goes on under it (the scale back to zero is its);
/// every message handled exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leading_controller_hands_scaling_over() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) = node("killing_the_leading_controller_hands_scaling_over").await else {
        return;
    };
    let s = node.scenario("node-f").await;
    let (ns, sqs, url, seen_at) = (&s.ns, &s.sqs, &s.url, &s.seen);
    node.apply(ns, &node.consumer(ns, "orders", url, seen_at.path(), 3))
        .await;
    node.wait_workers(ns, (0, 0), 90).await;
    // A backlog that takes a while: 400 messages, one in ten slow.
    let bodies: Vec<String> = (0..400)
        .map(|i| {
            if i % 10 == 0 {
                format!("slow {i}")
            } else {
                format!("message {i}")
            }
        })
        .collect();
    let sent = send(sqs, url, &bodies).await;
    eventually(
        120,
        "scaled from zero",
        || node.describe(ns),
        || async {
            let (replicas, ready) = node.workers(ns, "orders").await?;
            (replicas >= 1 && ready >= 1).then_some(())
        },
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(node.cluster.admin.clone(), &s.op.ns);
    let leader = holder(&leases.get(&s.op.fullname).await.expect("the Lease")).expect("a leader");
    let pods: Api<Pod> = Api::namespaced(node.cluster.admin.clone(), &s.op.ns);
    let leader_pod = pods
        .get(&leader)
        .await
        .expect("the leader is a pod of the release");
    // Killed as a crash would (SIGKILL: its Lease is not given up), and its pod removed at once so it
    // does not come back under the same identity: the standby must wait the claim out.
    let killed = Instant::now();
    kill_container(&leader_pod, "qc-operator");
    pods.delete(&leader, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the leader's pod");
    let next = eventually(
        60,
        "another controller holds the Lease",
        || node.describe(&s.op.ns),
        || async {
            let h = holder(&leases.get(&s.op.fullname).await.ok()?)?;
            (h != leader).then_some(h)
        },
    )
    .await;
    eprintln!(
        "{next} took the Lease over {:.1} s after {leader} was killed",
        killed.elapsed().as_secs_f64()
    );
    eventually(
        300,
        "all 400 handled",
        || format!("{} seen\n{}", seen(seen_at.path()).len(), node.describe(ns)),
        || async { (seen(seen_at.path()).len() >= sent.len()).then_some(()) },
    )
    .await;
    node.wait_workers(ns, (0, 0), 180).await;
    // The controller writes the scale, then its Event: the Event may come a little after the
    // Deployment shows zero (seen on a loaded machine: the last Event read was the 3 to 2 before it).
    let scaled = eventually(60, "the scale to zero's Event", String::new, || async {
        let scaled = events(&node, ns, "orders", "Scaled").await;
        scaled.last()?.0.contains("to 0").then_some(scaled)
    })
    .await;
    let last = scaled.last().expect("Scaled events");
    assert_eq!(
        last.1, next,
        "the scale to zero is the new leader's: {scaled:?}"
    );
    let again = assert_handled_once(seen_at.path(), &sent);
    eprintln!("{again} received again before their handling");
    s.settled(&sent).await;
    drop(s);
}

/// (b) Scale-in while messages are in flight: three busy replicas, then the backlog runs out and the
/// controller scales in step by step. Each pod the ReplicaSet removes is one the controller gave the lowest
/// pod-deletion-cost (its in-flight count) among the running ones; what the removed pods had in hand
/// finishes or is released: every message handled exactly once, none cut short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_removes_the_least_busy_pods_and_cuts_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) = node("scale_in_removes_the_least_busy_pods_and_cuts_nothing").await else {
        return;
    };
    let s = node.scenario("node-b").await;
    let (ns, sqs, url, seen_at) = (&s.ns, &s.sqs, &s.url, &s.seen);
    let mut doc = node.consumer(ns, "orders", url, seen_at.path(), 3);
    // Declared as what it is (2 s a message), so three replicas are what the backlog asks for.
    doc["spec"]["processing"]["p99"] = "3s".into();
    doc["spec"]["scaling"]["maxBacklogAge"] = "20s".into();
    node.apply(ns, &doc).await;
    node.wait_workers(ns, (0, 0), 90).await;
    // The last one lingers 8 s (within the 10 s timeout): when the backlog is gone one pod still has it in hand while the others
    // are idle, and the scale-in must keep that pod.
    let mut bodies: Vec<String> = (0..240).map(|i| format!("slow {i}")).collect();
    bodies.push("linger 240".to_string());
    let sent = send(sqs, url, &bodies).await;
    node.wait_workers(ns, (3, 3), 120).await;
    // Every pod the ReplicaSet takes away while others run: its cost and theirs, from one list.
    let pods: Api<Pod> = Api::namespaced(node.cluster.admin.clone(), ns);
    let selector = "app.kubernetes.io/instance=orders".to_string();
    let mut removed: BTreeMap<String, (Option<i64>, Vec<Option<i64>>)> = BTreeMap::new();
    let mut story: Vec<String> = Vec::new();
    let t0 = Instant::now();
    let deadline = t0 + std::time::Duration::from_mins(5);
    loop {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let survivors: Vec<Option<i64>> = list
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(deletion_cost)
            .collect();
        for p in list
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
        {
            let name = p.metadata.name.clone().expect("a name");
            if !removed.contains_key(&name) {
                let pods: Vec<_> = list
                    .iter()
                    .map(|p| {
                        format!(
                            "{} cost {:?} ready {} deleting {} rs {:?}",
                            p.metadata.name.as_deref().unwrap_or("?"),
                            deletion_cost(p),
                            ready(p),
                            p.metadata.deletion_timestamp.is_some(),
                            p.metadata
                                .labels
                                .as_ref()
                                .and_then(|l| l.get("pod-template-hash"))
                        )
                    })
                    .collect();
                story.push(format!(
                    "{:.1} s: {name} removed; {pods:?}",
                    t0.elapsed().as_secs_f64()
                ));
            }
            removed
                .entry(name)
                .or_insert_with(|| (deletion_cost(p), survivors.clone()));
        }
        if seen(seen_at.path()).len() >= sent.len() && list.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not drained and scaled to zero within 300 s: {} seen\n{}",
            seen(seen_at.path()).len(),
            node.describe(ns)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!(
        "removed pods (their cost, the survivors' costs then): {removed:?}\n{}",
        story.join("\n")
    );
    let mut checked = 0;
    for (name, (cost, survivors)) in &removed {
        if survivors.is_empty() {
            continue; // the last ones, to zero: nothing to compare with
        }
        let cost = cost.unwrap_or_else(|| panic!("{name} was removed with no deletion cost set"));
        for s in survivors {
            let s = s.unwrap_or(i64::MAX);
            assert!(
                cost <= s,
                "{name} (cost {cost}) went before a pod of cost {s}: {removed:?}"
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 1,
        "no scale-in with pods left running was seen: {removed:?}"
    );
    let again = assert_handled_once(seen_at.path(), &sent);
    eprintln!("{again} received again before their handling");
    s.settled(&sent).await;
    drop(s);
}

/// (d) The handler's dependency down for 60 s (every call answers 503): the workers' breakers open,
/// `HandlerHealthy` turns False, the controller holds the replicas it had (no scale-out onto the
/// failing dependency), nothing reaches the DLQ; once the dependency is back every message is handled
/// exactly once and `HandlerHealthy` is True again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_down_for_a_minute_holds_replicas_and_dead_letters_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) =
        node("a_dependency_down_for_a_minute_holds_replicas_and_dead_letters_nothing").await
    else {
        return;
    };
    let s = node.scenario("node-d").await;
    let (ns, sqs, url, seen_at) = (&s.ns, &s.sqs, &s.url, &s.seen);
    let mut doc = node.consumer(ns, "orders", url, seen_at.path(), 3);
    doc["spec"]["scaling"]["minReplicas"] = 1.into();
    node.apply(ns, &doc).await;
    node.wait_workers(ns, (1, 1), 120).await;
    std::fs::write(seen_at.path().join("down"), b"").expect("the dependency goes down");
    let down = Instant::now();
    // A backlog three replicas would be asked for, were the handler healthy.
    let bodies: Vec<String> = (0..600).map(|i| format!("message {i}")).collect();
    let sent = send(sqs, url, &bodies).await;
    eventually(
        60,
        "HandlerHealthy False",
        || node.describe(ns),
        || async {
            let (status, _) = condition(&node, ns, "orders", "HandlerHealthy").await?;
            (status == "False").then_some(())
        },
    )
    .await;
    let unhealthy_after = down.elapsed().as_secs_f64();
    let mut most = 0;
    while down.elapsed() < std::time::Duration::from_mins(1) {
        if let Some((replicas, _)) = node.workers(ns, "orders").await {
            most = most.max(replicas);
        }
        assert_eq!(
            counts(sqs, &s.dlq).await,
            (0, 0),
            "dead-lettered during the outage"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    std::fs::remove_file(seen_at.path().join("down")).expect("the dependency comes back");
    eprintln!(
        "HandlerHealthy False {unhealthy_after:.1} s into the outage; at most {most} replicas during it"
    );
    assert!(
        most <= 1,
        "scaled out onto a failing dependency: {most} replicas"
    );
    assert!(
        seen(seen_at.path()).is_empty(),
        "handled while the dependency was down"
    );
    eventually(
        300,
        "all 600 handled after the recovery",
        || format!("{} seen\n{}", seen(seen_at.path()).len(), node.describe(ns)),
        || async { (seen(seen_at.path()).len() >= sent.len()).then_some(()) },
    )
    .await;
    eventually(
        60,
        "HandlerHealthy True again",
        || node.describe(ns),
        || async {
            let (status, _) = condition(&node, ns, "orders", "HandlerHealthy").await?;
            (status == "True").then_some(())
        },
    )
    .await;
    let again = assert_handled_once(seen_at.path(), &sent);
    eprintln!(
        "recovered in {:.1} s; {again} received again before their handling",
        down.elapsed().as_secs_f64() - 60.0
    );
    s.settled(&sent).await;
    drop(s);
}

/// (e) A rollout of a new handler image under load: the old pods drain and go, the new ones take over;
/// no message lost or handled twice, and the QueueConsumer's Ready follows the rollout (False with
/// RollingOut while it runs, True once every pod runs the new image).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_under_load_loses_nothing_and_ready_follows_it() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) = node("a_rollout_under_load_loses_nothing_and_ready_follows_it").await else {
        return;
    };
    let s = node.scenario("node-e").await;
    let (ns, sqs, url, seen_at) = (&s.ns, &s.sqs, &s.url, &s.seen);
    let mut doc = node.consumer(ns, "orders", url, seen_at.path(), 2);
    doc["spec"]["scaling"]["minReplicas"] = 2.into();
    node.apply(ns, &doc).await;
    node.wait_workers(ns, (2, 2), 120).await;
    let bodies: Vec<String> = (0..600)
        .map(|i| {
            if i % 5 == 0 {
                format!("slow {i}")
            } else {
                format!("message {i}")
            }
        })
        .collect();
    let mut sent = send(sqs, url, &bodies).await;
    eventually(
        60,
        "50 handled",
        || node.describe(ns),
        || async { (seen(seen_at.path()).len() >= 50).then_some(()) },
    )
    .await;
    // Under load through the whole rollout: ten messages every half second until the new pods have
    // run for 5 s (the 600 alone were drained by the old pods before the new ones came up once the
    // test server answered fast).
    let producing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let producer = {
        let (sqs, url, producing) = (sqs.clone(), url.clone(), producing.clone());
        tokio::spawn(async move {
            let mut ids = BTreeSet::new();
            let mut n = 0;
            while producing.load(std::sync::atomic::Ordering::Relaxed) {
                let bodies: Vec<String> = (n..n + 10).map(|i| format!("during {i}")).collect();
                ids.extend(send(&sqs, &url, &bodies).await);
                n += 10;
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            ids
        })
    };
    let v2 = tag_handler_image(&node, &format!("rollout-{}", std::process::id()));
    doc["spec"]["template"]["spec"]["containers"][0]["image"] = v2.clone().into();
    node.apply(ns, &doc).await;
    let rolled = Instant::now();
    // Ready as the rollout goes: every (status, reason) it shows, in order.
    let mut ready_seen: Vec<(String, String)> = Vec::new();
    let deadline = rolled + std::time::Duration::from_mins(4);
    loop {
        if let Some(r) = condition(&node, ns, "orders", "Ready").await
            && ready_seen.last() != Some(&r)
        {
            ready_seen.push(r);
        }
        let pods = node.worker_pods(ns, "orders").await;
        let all_new = pods.len() == 2
            && pods.iter().all(|p| {
                ready(p)
                    && p.spec.as_ref().is_some_and(|s| {
                        s.containers
                            .iter()
                            .any(|c| c.image.as_deref() == Some(v2.as_str()))
                    })
            });
        let leaving = Api::<Pod>::namespaced(node.cluster.admin.clone(), ns)
            .list(&ListParams::default().labels("app.kubernetes.io/instance=orders"))
            .await
            .map_or(0, |l| l.items.len());
        if all_new && leaving == 2 && ready_seen.last().is_some_and(|(s, _)| s == "True") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rollout did not complete within 240 s; Ready went {ready_seen:?}\n{}",
            node.describe(ns)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!(
        "rolled out in {:.1} s; Ready went {ready_seen:?}",
        rolled.elapsed().as_secs_f64()
    );
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    producing.store(false, std::sync::atomic::Ordering::Relaxed);
    sent.extend(producer.await.expect("the producer"));
    assert!(
        ready_seen
            .iter()
            .any(|(s, r)| s == "False" && r == "RollingOut"),
        "Ready never said RollingOut during the rollout: {ready_seen:?}"
    );
    eventually(
        240,
        "every message sent handled",
        || {
            format!(
                "{} seen of {}\n{}",
                seen(seen_at.path()).len(),
                sent.len(),
                node.describe(ns)
            )
        },
        || async { (seen(seen_at.path()).len() >= sent.len()).then_some(()) },
    )
    .await;
    let hashes: BTreeSet<String> = notes(seen_at.path(), "receipts")
        .values()
        .flatten()
        .map(|(_, pod)| pod_hash(pod).to_string())
        .collect();
    assert!(
        hashes.len() >= 2,
        "handled by the old and the new pods: {hashes:?}"
    );
    eventually(60, "the queue empty", String::new, || async {
        (counts(sqs, url).await == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(counts(sqs, &s.dlq).await, (0, 0), "nothing dead-lettered");
    let again = assert_handled_once(seen_at.path(), &sent);
    eprintln!("{again} received again before their handling");
    drop(s);
}

/// (g) The exec layout (qc-worker copied into the handler's own image, a process per message) on a FIFO
/// queue: six message groups, scaled from zero to several replicas and back; within each group the
/// messages are handled in the order sent, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_layout_on_a_fifo_queue_keeps_each_groups_order_across_scaling() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) =
        node("exec_layout_on_a_fifo_queue_keeps_each_groups_order_across_scaling").await
    else {
        return;
    };
    let mut s = node.scenario("node-g").await;
    // FIFO queues instead of the scenario's standard ones.
    let dlq = common::create_queue(
        &s.sqs,
        &format!("{}.fifo", common::unique_name("node-g-dlq")),
        &[
            (A::FifoQueue, "true".into()),
            (A::MessageRetentionPeriod, "1209600".into()),
        ],
    )
    .await;
    let arn = common::queue_arn(&s.sqs, &dlq).await;
    let url = common::create_queue(
        &s.sqs,
        &format!("{}.fifo", common::unique_name("node-g")),
        &[
            (A::FifoQueue, "true".into()),
            (A::VisibilityTimeout, "30".into()),
            (
                A::RedrivePolicy,
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"5"}}"#),
            ),
        ],
    )
    .await;
    (s.url, s.dlq) = (url, dlq);
    let (ns, sqs, url, seen_at) = (&s.ns, &s.sqs, &s.url, &s.seen);
    let mut doc = node.consumer(ns, "orders", url, seen_at.path(), 3);
    doc["spec"]["handler"] = json!({"exec": {"command": ["/app/make-thumbnail"]}});
    doc["spec"]["processing"]["concurrency"] = 3.into();
    doc["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "SEEN_FILE", "value": "/seen/ids"}]);
    node.apply(ns, &doc).await;
    node.wait_workers(ns, (0, 0), 90).await;
    // 6 groups of 40, interleaved as sent; each message's (group, place in its group) by its id.
    let mut order: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for i in 0..40 {
        let entries: Vec<_> = (0..6)
            .map(|g| {
                SendMessageBatchRequestEntry::builder()
                    .id(format!("g{g}"))
                    .message_body(format!("group {g} message {i}"))
                    .message_group_id(format!("g{g}"))
                    .message_deduplication_id(format!("g{g}-{i}"))
                    .build()
                    .expect("an entry")
            })
            .collect();
        let out = sqs
            .send_message_batch()
            .queue_url(url.as_str())
            .set_entries(Some(entries))
            .send()
            .await
            .expect("send a batch");
        assert!(out.failed.is_empty(), "{:?}", out.failed);
        for s in out.successful {
            let g: usize = s.id[1..].parse().expect("a group");
            order.insert(s.message_id, (g, i));
        }
    }
    let sent: BTreeSet<String> = order.keys().cloned().collect();
    let peak = std::sync::atomic::AtomicI32::new(0);
    eventually(
        400,
        "all 240 handled",
        || format!("{} seen\n{}", seen(seen_at.path()).len(), node.describe(ns)),
        || async {
            if let Some((replicas, _)) = node.workers(ns, "orders").await {
                peak.fetch_max(replicas, std::sync::atomic::Ordering::Relaxed);
            }
            (seen(seen_at.path()).len() >= sent.len()).then_some(())
        },
    )
    .await;
    node.wait_workers(ns, (0, 0), 180).await;
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    // The receipts in the order they were written: per group, places must rise.
    let text = std::fs::read_to_string(seen_at.path().join("receipts")).expect("receipts");
    let mut last: BTreeMap<usize, usize> = BTreeMap::new();
    let mut pods = BTreeSet::new();
    for line in text.lines() {
        let mut parts = line.split(' ');
        let id = parts.next().expect("an id");
        let pod = parts.nth(1).expect("a pod");
        pods.insert(pod.to_string());
        let (g, i) = order[id];
        if let Some(prev) = last.insert(g, i) {
            assert!(
                prev < i,
                "group {g}: message {i} handled after {prev}\n{text}"
            );
        }
    }
    eprintln!(
        "peak {peak} replicas, {} pods handled; each group in order",
        pods.len()
    );
    assert!(
        peak >= 2 && pods.len() >= 2,
        "no scale event: peak {peak}, pods {pods:?}"
    );
    eventually(60, "the queue empty", String::new, || async {
        (counts(sqs, url).await == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(counts(sqs, &s.dlq).await, (0, 0), "nothing dead-lettered");
    assert_handled_once(seen_at.path(), &sent);
    drop(s);
}
