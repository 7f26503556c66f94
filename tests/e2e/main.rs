//! End to end on a real Kubernetes control plane (kube-apiserver, kube-controller-manager, kube-scheduler,
//! etcd; `scripts/test` starts one built from the k8s.io/kubernetes modules): the chart installed with
//! helm into namespaces enforcing the restricted Pod Security Standard, `qc-operator run` out of cluster
//! with a TokenRequest token of the chart's ServiceAccount (so every request meets the chart's RBAC), and
//! QueueConsumers on moto's SQS and CloudWatch, in the namespaced and the cluster-wide mode.
//!
//! Pods stay Pending: the node of `scripts/test` (tests/node.rs) runs only pods that tolerate its taint.
//! Deployments, ReplicaSets (the controller-manager's), Pod admission, status, Events, Leases,
//! finalizers and garbage collection are the real ones. With
//! `QC_REQUIRE_CLUSTER=1` (scripts/test) these tests cannot skip.

#[path = "../common/mod.rs"]
mod common;

use common::cluster::{self, Cluster, Operator, Release, eventually};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use qc::api::QueueConsumer;

fn condition(qc: &QueueConsumer, type_: &str) -> Option<(String, String, String)> {
    qc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn apply(cluster: &Cluster, ns: &str, doc: &serde_json::Value) {
    let qcs: Api<QueueConsumer> = Api::namespaced(cluster.admin.clone(), ns);
    qcs.patch(
        "orders",
        &PatchParams::apply("e2e-user"),
        &Patch::Apply(doc),
    )
    .await
    .expect("the QueueConsumer applies");
}

/// The chart's own Deployment got a ReplicaSet and a Pod past the restricted profile's admission (the pod
/// then waits for a node, which this control plane has none of).
async fn chart_pod_admitted(cluster: &Cluster, release: &Release) {
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), &release.namespace);
    let rss: Api<ReplicaSet> = Api::namespaced(cluster.admin.clone(), &release.namespace);
    eventually(
        30,
        "the chart's controller Pod is admitted under restricted",
        String::new,
        || async {
            let rs = rss.list(&ListParams::default()).await.ok()?;
            let failure = rs.items.iter().find_map(|r| {
                r.status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .find(|c| c.type_.as_deref() == Some("ReplicaFailure"))
                    .cloned()
            });
            assert!(
                failure.is_none(),
                "the chart's ReplicaSet cannot create its pod: {failure:?}"
            );
            let list = pods.list(&ListParams::default()).await.ok()?;
            (!list.items.is_empty()).then_some(())
        },
    )
    .await;
}

/// Everything a working install shows for one QueueConsumer in `ns`: Ready, an owned Deployment with a
/// ReplicaSet of the controller-manager's, the Lease held by `op`, Events, and no 403 in the audit log.
async fn reconciles_under_the_charts_rbac(
    cluster: &Cluster,
    release: &Release,
    op: &Operator,
    ns: &str,
) {
    let mark = cluster.audit_mark();
    let url = cluster::queue_with_dlq(&common::unique_name("e2e")).await;
    apply(
        cluster,
        ns,
        &cluster::restricted_consumer(ns, "orders", &url),
    )
    .await;
    let qcs: Api<QueueConsumer> = Api::namespaced(cluster.admin.clone(), ns);
    let ready = eventually(
        60,
        "Ready=True",
        || op.logs(),
        || async {
            let qc = qcs.get("orders").await.ok()?;
            let ready = condition(&qc, "Ready")?;
            (ready.0 == "True").then_some(qc)
        },
    )
    .await;
    assert_eq!(
        ready.metadata.finalizers.as_deref(),
        Some(&[qc::controller::alarm::FINALIZER.to_string()][..]),
        "the DLQ alarm's finalizer"
    );
    let leases: Api<Lease> = Api::namespaced(cluster.admin.clone(), &release.namespace);
    let lease = leases
        .get(&release.fullname)
        .await
        .expect("the chart's Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(op.identity.as_str()),
        "the operator holds the chart's Lease"
    );

    // The worker Deployment: controlled by the QueueConsumer; the controller-manager made its ReplicaSet.
    let deployments: Api<Deployment> = Api::namespaced(cluster.admin.clone(), ns);
    let d = deployments
        .get("orders")
        .await
        .expect("the worker Deployment");
    let owner = &d
        .metadata
        .owner_references
        .as_ref()
        .expect("owner references")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("QueueConsumer", "orders", Some(true))
    );
    let rss: Api<ReplicaSet> = Api::namespaced(cluster.admin.clone(), ns);
    eventually(
        30,
        "a ReplicaSet of the worker Deployment",
        String::new,
        || async {
            let list = rss.list(&ListParams::default()).await.ok()?;
            list.items
                .iter()
                .any(|r| {
                    r.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.kind == "Deployment" && o.name == "orders")
                })
                .then_some(())
        },
    )
    .await;
    let events: Api<Event> = Api::namespaced(cluster.admin.clone(), ns);
    let ours = events
        .list(&ListParams::default())
        .await
        .expect("Events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("QueueConsumer"))
        .count();
    assert!(ours > 0, "the operator records Events on the QueueConsumer");

    // Every request the operator made in this scenario was allowed by the chart's RBAC.
    let user = release.user();
    assert!(
        !cluster.audit_events(&user, mark, |_| true).await.is_empty(),
        "the audit log shows the operator's requests"
    );
    let refused = cluster.rbac_refusals(&user, mark).await;
    assert!(refused.is_empty(), "RBAC refused {user}: {refused:#?}");

    // Deletion: the finalizer holds it until the alarm is deleted, then the garbage collector takes the
    // Deployment.
    qcs.delete("orders", &DeleteParams::default())
        .await
        .expect("delete the QueueConsumer");
    eventually(
        60,
        "the QueueConsumer is deleted",
        || op.logs(),
        || async { qcs.get_opt("orders").await.ok()?.is_none().then_some(()) },
    )
    .await;
    eventually(
        60,
        "the garbage collector deletes the worker Deployment",
        String::new,
        || async {
            deployments
                .get_opt("orders")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_install_reconciles_under_the_charts_rbac() {
    let test = "namespaced_install_reconciles_under_the_charts_rbac";
    let Some(cluster) = cluster::connect(test).await else {
        return;
    };
    let _shared = cluster::CLUSTER_WIDE.read().await;
    let op_ns = cluster::unique("e2e-op");
    let team = cluster::unique("e2e-team");
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
    chart_pod_admitted(&cluster, &release).await;
    let op = release.operator(&cluster, "op-0", &[]).await;
    Box::pin(reconciles_under_the_charts_rbac(
        &cluster, &release, &op, &team,
    ))
    .await;
    drop(op);
    cluster.delete_namespace(&team).await;
    cluster.delete_namespace(&op_ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wide_install_reconciles_and_scales_in_any_namespace() {
    let test = "cluster_wide_install_reconciles_and_scales_in_any_namespace";
    let Some(cluster) = cluster::connect(test).await else {
        return;
    };
    let _alone = cluster::CLUSTER_WIDE.write().await;
    let op_ns = cluster::unique("e2e-all");
    let team = cluster::unique("e2e-any");
    cluster.namespace(&op_ns, true).await;
    cluster.namespace(&team, true).await;
    let release = Release::install(&cluster, &cluster::unique("qcall"), &op_ns, &[]).await;
    chart_pod_admitted(&cluster, &release).await;
    let op = release.operator(&cluster, "op-all-0", &[]).await;

    // Scaling on a real Deployment: messages in the queue make a replica; its Pod passes restricted.
    let url = cluster::queue_with_dlq(&common::unique_name("e2e-scale")).await;
    let sqs = common::sqs_client().await;
    common::send_numbered(&sqs, &url, "order", 40).await;
    let doc = cluster::restricted_consumer(&team, "scaled", &url);
    let qcs: Api<QueueConsumer> = Api::namespaced(cluster.admin.clone(), &team);
    qcs.patch(
        "scaled",
        &PatchParams::apply("e2e-user"),
        &Patch::Apply(&doc),
    )
    .await
    .expect("the QueueConsumer applies");
    let deployments: Api<Deployment> = Api::namespaced(cluster.admin.clone(), &team);
    let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), &team);
    eventually(
        60,
        "a worker Pod for the backlog",
        || op.logs(),
        || async {
            let d = deployments.get_opt("scaled").await.ok()??;
            let replicas = d.spec.replicas?;
            if replicas < 1 {
                return None;
            }
            let list = pods.list(&ListParams::default()).await.ok()?;
            (!list.items.is_empty()).then_some(())
        },
    )
    .await;
    qcs.delete("scaled", &DeleteParams::default())
        .await
        .expect("delete");

    Box::pin(reconciles_under_the_charts_rbac(
        &cluster, &release, &op, &team,
    ))
    .await;
    drop(op);
    cluster.delete_namespace(&team).await;
    cluster.delete_namespace(&op_ns).await;
}
