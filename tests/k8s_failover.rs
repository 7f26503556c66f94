//! Failures of the control plane's parts under a running operator (issue 42 item 3), on the real control
//! plane `scripts/test` starts: the leader killed with SIGKILL while QueueConsumers change (the standby takes
//! over, and no write is made twice: the API server's audit log shows every write with the object it stored),
//! and kube-apiserver stopped and started again mid-run (the operator keeps going, nothing written is lost,
//! what changed meanwhile is written after). `QC_REQUIRE_CLUSTER=1` makes a missing cluster a failure.
//!
//! One test at a time: the restart cuts every client of the cluster off, and the leader test counts writes.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::cluster::{self, Cluster, Release, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use qc::api::QueueConsumer;
use serde_json::Value;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The leader's claim in these tests: a takeover after a SIGKILL waits this out.
const LEASE: &str = "--lease-duration=6s";

async fn apply(cluster: &Cluster, ns: &str, doc: &Value) {
    let name = doc["metadata"]["name"].as_str().expect("a name");
    Api::<QueueConsumer>::namespaced(cluster.admin.clone(), ns)
        .patch(name, &PatchParams::apply("test-user"), &Patch::Apply(doc))
        .await
        .expect("the QueueConsumer applies");
}

/// A QueueConsumer of the restricted layout on `url`, polled every second, with `concurrency`. It stays
/// at zero replicas whatever its queue holds (no node runs its worker: the test node takes only pods
/// tolerating its taint; and a Deployment without its pods would make Ready False).
fn consumer(ns: &str, name: &str, url: &str, concurrency: u32, alarm: bool) -> Value {
    let mut doc = cluster::restricted_consumer(ns, name, url);
    doc["spec"]["processing"]["concurrency"] = concurrency.into();
    doc["spec"]["scaling"]["activationBacklog"] = 1000.into();
    doc["spec"]["deadLetter"]["alarm"] = alarm.into();
    doc
}

/// Settled: the controller has seen the current spec (observedGeneration), Ready is True, the DLQ alarm
/// (when asked for) is reported in status, and the worker Deployment runs the spec's concurrency.
async fn settled(qcs: &Api<QueueConsumer>, deployments: &Api<Deployment>, name: &str) -> bool {
    let Ok(qc) = qcs.get(name).await else {
        return false;
    };
    let Some(status) = qc.status.as_ref() else {
        return false;
    };
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let current = status.observed_generation == qc.metadata.generation;
    // Alarms are put and read back off the reconcile path (a pass every 15 s): not settled before.
    let alarmed = !qc.spec.dead_letter.alarm
        || status
            .dead_letter
            .as_ref()
            .is_some_and(|d| d.alarm_name.is_some() && d.alarm_state.is_some());
    let Ok(Some(d)) = deployments.get_opt(name).await else {
        return false;
    };
    ready
        && current
        && alarmed
        && worker_concurrency(&d) == Some(qc.spec.processing.concurrency.to_string())
}

/// The `--concurrency` the Deployment's worker runs with.
fn worker_concurrency(d: &Deployment) -> Option<String> {
    let spec = d.spec.template.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| {
            c.command
                .iter()
                .flatten()
                .chain(c.args.iter().flatten())
                .cloned()
                .collect::<Vec<_>>()
        })
        .collect::<Vec<_>>()
        .windows(2)
        .find(|w| w[0] == "--concurrency")
        .map(|w| w[1].clone())
}

fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
}

fn is_write(e: &Value) -> bool {
    matches!(e["verb"].as_str(), Some("create" | "update" | "patch"))
        && e["responseStatus"]["code"]
            .as_u64()
            .is_some_and(|c| (200..300).contains(&c))
}

/// "resource[/subresource] namespace/name" of an audit event.
fn target(e: &Value) -> String {
    let o = &e["objectRef"];
    format!(
        "{}{} {}/{}",
        o["resource"].as_str().unwrap_or(""),
        o["subresource"]
            .as_str()
            .map(|s| format!("/{s}"))
            .unwrap_or_default(),
        o["namespace"].as_str().unwrap_or(""),
        o["name"].as_str().unwrap_or("")
    )
}

/// The object a write left stored, as "resource namespace/name" (subresources share their object's
/// resourceVersion) and its resourceVersion; None for writes the audit policy logs without the object.
fn stored(e: &Value) -> Option<(String, String)> {
    let rv = e["responseObject"]["metadata"]["resourceVersion"].as_str()?;
    let o = &e["objectRef"];
    Some((
        format!(
            "{} {}/{}",
            o["resource"].as_str()?,
            o["namespace"].as_str()?,
            o["name"]
                .as_str()
                .or(e["responseObject"]["metadata"]["name"].as_str())?
        ),
        rv.to_string(),
    ))
}

/// The writes of `by` that changed nothing: a successful write whose stored object has a resourceVersion
/// an earlier write of the same object (by anyone) already left, i.e. the server found nothing to change.
/// Every write to QueueConsumers and Deployments (subresources too) is logged with the object it stored.
fn unchanged_writes(events: &[Value], by: impl Fn(&Value) -> bool) -> Vec<String> {
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut unchanged = Vec::new();
    for e in events.iter().filter(|e| is_write(e)) {
        let Some(key) = stored(e) else { continue };
        if !seen.insert(key.clone()) && by(e) {
            unchanged.push(format!(
                "{} {} at {} (resourceVersion {} again)",
                e["verb"].as_str().unwrap_or(""),
                target(e),
                e["stageTimestamp"].as_str().unwrap_or(""),
                key.1
            ));
        }
    }
    unchanged
}

/// Every line of the audit log from `from` on (all users), once the server has written them.
async fn audit_since(cluster: &Cluster, from: usize) -> Vec<Value> {
    // The log backend writes each event as its request completes; a moment for the last ones.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log = cluster.audit_log.as_ref().expect("an audit log");
    std::fs::read_to_string(log)
        .expect("read the audit log")
        .lines()
        .skip(from)
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The QueueConsumer (or its Deployment, or an Event about it) a write of the operator concerns.
fn concerns(e: &Value) -> Option<String> {
    let name = e["objectRef"]["name"].as_str()?;
    match e["objectRef"]["resource"].as_str()? {
        "queueconsumers" | "deployments" => Some(name.to_string()),
        // Events are named after what they regard: NAME.SUFFIX.
        "events" => name.split('.').next().map(str::to_string),
        _ => None,
    }
}

/// Item 3: the leader is killed (SIGKILL: no release) while QueueConsumers change. The standby takes over
/// once the Lease expires; the changes made meanwhile all reach their Deployments and status; nothing is
/// written by both (every write of the old leader comes before the new one's first), no write repeats one
/// the server already holds (a write whose stored resourceVersion an earlier write left), and the
/// QueueConsumers nobody changed get no write at all from the new leader: it takes over what is current
/// without rewriting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_under_load_hands_over_without_duplicate_writes() {
    let test = "killing_the_leader_under_load_hands_over_without_duplicate_writes";
    let Some(cluster) = cluster::connect(test).await else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let op_ns = cluster::unique("kill-op");
    let team = cluster::unique("kill-team");
    cluster.namespace(&op_ns, true).await;
    cluster.namespace(&team, true).await;
    let watch = format!(r#"watchNamespaces=["{team}"]"#);
    let release = Release::install(
        &cluster,
        &cluster::unique("qc"),
        &op_ns,
        &["--set-json", &watch],
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(cluster.admin.clone(), &op_ns);
    let mut a = release.operator(&cluster, "op-a", &[LEASE]).await;
    eventually(
        60,
        "op-a leads",
        || a.logs(),
        || async {
            let lease = leases.get_opt(&release.fullname).await.ok()??;
            (holder(&lease).as_deref() == Some("op-a")).then_some(())
        },
    )
    .await;
    let mut b = release.operator(&cluster, "op-b", &[LEASE]).await;
    eventually(
        60,
        "op-b stands by",
        || b.logs(),
        || async {
            b.logs()
                .contains("waiting for the leader lease")
                .then_some(())
        },
    )
    .await;

    // Three that change all along ("busy", one with a DLQ alarm and so a finalizer) and three nobody touches
    // after they settle ("quiet", one with an alarm).
    let busy = ["busy0", "busy1", "busy2"];
    let quiet = ["quiet0", "quiet1", "quiet2"];
    let qcs: Api<QueueConsumer> = Api::namespaced(cluster.admin.clone(), &team);
    let deployments: Api<Deployment> = Api::namespaced(cluster.admin.clone(), &team);
    let mut urls = BTreeMap::new();
    for (i, name) in busy.iter().chain(&quiet).enumerate() {
        let url = cluster::queue_with_dlq(&common::unique_name("kill")).await;
        apply(&cluster, &team, &consumer(&team, name, &url, 1, i % 3 == 0)).await;
        urls.insert(*name, url);
    }
    let context = || format!("op-a:\n{}\nop-b:\n{}", a.logs(), b.logs());
    for name in busy.iter().chain(&quiet) {
        eventually(120, &format!("{name} settles"), context, || async {
            settled(&qcs, &deployments, name).await.then_some(())
        })
        .await;
    }
    // A few polls go by, so what each reconcile writes once is written.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mark = cluster.audit_mark();

    // Load: a spec change every 200 ms, round the busy ones, before, across and after the kill.
    let churn = {
        let cluster_admin = cluster.admin.clone();
        let team = team.clone();
        let urls = urls.clone();
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let qcs: Api<QueueConsumer> = Api::namespaced(cluster_admin, &team);
            let mut changes = 0u32;
            loop {
                let name = busy[changes as usize % busy.len()];
                let concurrency = 2 + changes;
                let doc = consumer(&team, name, &urls[name], concurrency, name == "busy0");
                qcs.patch(name, &PatchParams::apply("test-user"), &Patch::Apply(&doc))
                    .await
                    .expect("a spec change applies");
                changes += 1;
                tokio::select! {
                    _ = &mut stop_rx => return changes,
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        });
        (stop_tx, task)
    };
    tokio::time::sleep(Duration::from_secs(4)).await;
    a.kill();
    let killed = Instant::now();
    eventually(
        60,
        "op-b takes over",
        || b.logs(),
        || async {
            let lease = leases.get_opt(&release.fullname).await.ok()??;
            (holder(&lease).as_deref() == Some("op-b")).then_some(())
        },
    )
    .await;
    let took_over = killed.elapsed();
    // The new leader under the same load for a while.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let _ = churn.0.send(());
    let changes = churn.1.await.expect("the churn task");
    let caught_up = Instant::now();
    for name in busy.iter().chain(&quiet) {
        eventually(
            120,
            &format!("{name} settles under op-b"),
            || b.logs(),
            || async { settled(&qcs, &deployments, name).await.then_some(()) },
        )
        .await;
    }
    let caught_up = caught_up.elapsed();
    // Polls of a settled state: any write now would be a repeat.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(b.running(), "op-b exited:\n{}", b.logs());
    b.stop();

    let events = audit_since(&cluster, mark).await;
    let user = release.user();
    let ours: Vec<&Value> = events
        .iter()
        .filter(|e| e["user"]["username"] == user.as_str() && is_write(e))
        .collect();
    let by_a: Vec<&Value> = ours.iter().copied().filter(|e| a.made(e)).collect();
    let by_b: Vec<&Value> = ours.iter().copied().filter(|e| b.made(e)).collect();
    let not_lease = |e: &&&Value| e["objectRef"]["resource"] != "leases";
    let a_deployments = by_a
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "deployments")
        .count();
    let b_deployments = by_b
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "deployments")
        .count();
    eprintln!(
        "{changes} spec changes; op-b led {} ms after the SIGKILL; all settled {} ms after the load \
         stopped; writes since the load began: op-a {} ({a_deployments} Deployment), op-b {} \
         ({b_deployments} Deployment)",
        took_over.as_millis(),
        caught_up.as_millis(),
        by_a.len(),
        by_b.len(),
    );
    assert_eq!(
        ours.len(),
        by_a.len() + by_b.len(),
        "writes by neither replica's token: the audit events carry no credential id?"
    );
    // The scenario really ran: the old leader was writing under load, the new one took the load on.
    assert!(a_deployments > 0, "op-a wrote no Deployment under load");
    assert!(
        b_deployments > 0,
        "op-b wrote no Deployment after the takeover"
    );

    // One writer at a time.
    let a_last = by_a
        .iter()
        .filter(not_lease)
        .filter_map(|e| e["stageTimestamp"].as_str())
        .max()
        .expect("op-a's writes");
    let b_first = by_b
        .iter()
        .filter(not_lease)
        .filter_map(|e| e["stageTimestamp"].as_str())
        .min()
        .expect("op-b's writes");
    assert!(
        a_last < b_first,
        "op-b wrote ({b_first}) before op-a's last write ({a_last}): two leaders at once"
    );

    // No write repeats what the server holds.
    let unchanged = unchanged_writes(&events, |e| e["user"]["username"] == user.as_str());
    assert!(
        unchanged.is_empty(),
        "{} writes of the operator changed nothing (a write the server already held):\n{}",
        unchanged.len(),
        unchanged.join("\n")
    );

    // The new leader takes the quiet ones over as they are.
    let rewritten: Vec<String> = by_b
        .iter()
        .filter(|e| concerns(e).is_some_and(|n| quiet.contains(&n.as_str())))
        .map(|e| format!("{} {}", e["verb"], target(e)))
        .collect();
    assert!(
        rewritten.is_empty(),
        "op-b rewrote QueueConsumers nobody changed: {rewritten:#?}"
    );
    drop(a);
    cluster.delete_namespace(&team).await;
    cluster.delete_namespace(&op_ns).await;
}

/// Item 3: kube-apiserver stops (SIGTERM) and starts again while the operator runs. Meanwhile messages
/// arrive (status must follow), and right after the restart a spec changes (its watch must resume and see
/// it). The operator does not exit, keeps the Lease, and every QueueConsumer ends current: status with all
/// it held before (conditions, the DLQ alarm), the counts sent during the outage, the new spec in its
/// Deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_recovers_from_an_api_server_restart_without_losing_status() {
    let test = "the_operator_recovers_from_an_api_server_restart_without_losing_status";
    let Some(cluster) = cluster::connect(test).await else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let op_ns = cluster::unique("restart-op");
    let team = cluster::unique("restart-team");
    cluster.namespace(&op_ns, true).await;
    cluster.namespace(&team, true).await;
    let watch = format!(r#"watchNamespaces=["{team}"]"#);
    let release = Release::install(
        &cluster,
        &cluster::unique("qc"),
        &op_ns,
        &["--set-json", &watch],
    )
    .await;
    let mut op = release.operator(&cluster, "op-0", &[]).await;
    let qcs: Api<QueueConsumer> = Api::namespaced(cluster.admin.clone(), &team);
    let deployments: Api<Deployment> = Api::namespaced(cluster.admin.clone(), &team);
    let names = ["alpha", "beta", "gamma"];
    let mut urls = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        let url = cluster::queue_with_dlq(&common::unique_name("restart")).await;
        apply(&cluster, &team, &consumer(&team, name, &url, 1, i == 0)).await;
        urls.insert(*name, url);
    }
    for name in names {
        eventually(
            120,
            &format!("{name} settles"),
            || op.logs(),
            || async { settled(&qcs, &deployments, name).await.then_some(()) },
        )
        .await;
    }
    let before: BTreeMap<&str, QueueConsumer> = {
        let mut m = BTreeMap::new();
        for name in names {
            m.insert(name, qcs.get(name).await.expect("read"));
        }
        m
    };
    let conditions = |qc: &QueueConsumer| -> BTreeSet<String> {
        qc.status
            .iter()
            .flat_map(|s| s.conditions.iter().map(|c| c.type_.clone()))
            .collect()
    };

    // The outage: 8 s down, then the server's own start (seconds on a loaded machine). Messages arrive
    // meanwhile, on a thread of its own since the restart blocks.
    let sqs = common::sqs_client().await;
    let restart = {
        let kubeconfig_cluster = Cluster {
            admin: cluster.admin.clone(),
            kubeconfig: cluster.kubeconfig.clone(),
            audit_log: cluster.audit_log.clone(),
            run_dir: cluster.run_dir.clone(),
        };
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            kubeconfig_cluster.restart_apiserver(8, "TERM");
            started.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    common::send_numbered(&sqs, &urls["beta"], "outage", 7).await;
    let outage = restart.await.expect("the restart");
    let back = Instant::now();
    // Right after: a spec change, which only a watch that resumed (or relisted) brings.
    apply(
        &cluster,
        &team,
        &consumer(&team, "gamma", &urls["gamma"], 5, false),
    )
    .await;

    // Bounded by the reconcile deadline (2 min): on a loaded machine a request sent while the new server
    // starts can hang until it (docs/testing.md, "Failover tests").
    for name in names {
        eventually(
            240,
            &format!("{name} is current after the restart"),
            || op.logs(),
            || async {
                let qc = qcs.get(name).await.ok()?;
                let visible = qc.status.as_ref()?.queue.as_ref()?.visible;
                let counted = name != "beta" || visible == Some(7);
                (counted && settled(&qcs, &deployments, name).await).then_some(())
            },
        )
        .await;
    }
    let recovered = back.elapsed();
    eprintln!(
        "kube-apiserver down and back up in {} ms; every QueueConsumer current {} ms after it answered \
         again",
        outage.as_millis(),
        recovered.as_millis()
    );
    assert!(op.running(), "the operator exited:\n{}", op.logs());
    let lease = Api::<Lease>::namespaced(cluster.admin.clone(), &op_ns)
        .get(&release.fullname)
        .await
        .expect("the Lease");
    assert_eq!(holder(&lease).as_deref(), Some("op-0"), "{lease:?}");
    for name in names {
        let now = qcs.get(name).await.expect("read");
        let (was, is) = (conditions(&before[name]), conditions(&now));
        assert!(
            was.is_subset(&is),
            "{name}: conditions {was:?} before, {is:?} after"
        );
        let alarm = |qc: &QueueConsumer| {
            qc.status
                .as_ref()
                .and_then(|s| s.dead_letter.as_ref())
                .and_then(|d| d.alarm_name.clone())
        };
        assert_eq!(
            alarm(&before[name]),
            alarm(&now),
            "{name}: the DLQ alarm in status"
        );
        assert_eq!(
            now.metadata.finalizers, before[name].metadata.finalizers,
            "{name}: finalizers"
        );
    }
    op.stop();
    cluster.delete_namespace(&team).await;
    cluster.delete_namespace(&op_ns).await;
}
