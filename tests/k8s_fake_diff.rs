//! Differential test of the in-memory API (tests/fake_kube): one sequence of QueueConsumer operations
//! runs against the fake and against the real Kubernetes API server `scripts/test` starts, and every
//! step must give the same result (what is compared is what the controller and its tests rely on;
//! docs/testing.md lists what the fake still does not imitate).

mod common;
mod fake_kube;

use std::time::Duration;

use common::k8s;
use fake_kube::FakeKube;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use qc::api::QueueConsumer;
use serde_json::{Value, json};

fn qc(spec: Value) -> Value {
    json!({"apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
           "metadata": {"name": "orders"}, "spec": spec})
}

fn base_spec() -> Value {
    json!({"queue": {"url": "https://sqs.us-east-1.amazonaws.com/1/orders"},
           "processing": {"p99": "1s"}, "handler": {"http": {}}})
}

fn condition(type_: &str, status: &str) -> Value {
    json!({"type": type_, "status": status, "reason": format!("Is{status}"), "message": "",
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// What a step shows, without what legitimately differs between servers (uids, timestamps,
/// resourceVersion values, managedFields which the fake does not keep).
fn view(o: &QueueConsumer) -> Value {
    let v = serde_json::to_value(o).unwrap();
    json!({
        "generation": v["metadata"]["generation"],
        "labels": v["metadata"]["labels"],
        "finalizers": v["metadata"]["finalizers"],
        "deleting": v["metadata"]["deletionTimestamp"].is_string(),
        "spec": v["spec"],
        "status": v["status"],
    })
}

fn outcome(r: Result<QueueConsumer, kube::Error>) -> Value {
    match r {
        Ok(o) => view(&o),
        Err(kube::Error::Api(s)) => {
            json!({"code": s.code, "reason": s.reason, "message": without_manager_notes(&s.message)})
        }
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// A conflict message without what the API server adds after a manager's name (` using <version>`
/// for an Update manager, ` with subresource "status"`): the fake does not keep those apart.
fn without_manager_notes(message: &str) -> String {
    message
        .lines()
        .map(|line| {
            let Some(start) = line.find("with \"") else {
                return line.to_string();
            };
            let name_start = start + "with \"".len();
            let Some(name_len) = line[name_start..].find('"') else {
                return line.to_string();
            };
            let after_name = name_start + name_len + 1;
            match line[after_name..].find(':') {
                Some(colon) => format!("{}{}", &line[..after_name], &line[after_name + colon..]),
                None => line.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn rv(api: &Api<QueueConsumer>) -> String {
    api.get("orders")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
}

/// The sequence; returns (step, result) pairs. Watch events from the resourceVersion after the create
/// come last.
async fn scenario(api: Api<QueueConsumer>) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let apply = |m: &str| PatchParams::apply(m);
    let get = || async { outcome(api.get("orders").await) };

    // 1. create, as `kubectl create` does: the CRD's defaults are filled in, and the creator owns
    // them too.
    let created = api
        .create(
            &PostParams {
                field_manager: Some("kubectl".into()),
                ..PostParams::default()
            },
            &serde_json::from_value(qc(base_spec())).unwrap(),
        )
        .await;
    out.push(("create".into(), outcome(created)));
    let after_create = rv(&api).await;

    // 2. server-side apply by two managers: a field the creator set (by default) conflicts until
    // forced; an identical apply changes nothing.
    let mut alice = qc(json!({"scaling": {"maxReplicas": 5}}));
    alice["metadata"]["labels"] = json!({"owner": "alice"});
    let r = api
        .patch("orders", &apply("alice"), &Patch::Apply(&alice))
        .await;
    out.push(("apply over the creator's field".into(), outcome(r)));
    let r = api
        .patch("orders", &apply("alice").force(), &Patch::Apply(&alice))
        .await;
    out.push(("forced apply alice".into(), outcome(r)));
    let bob = qc(json!({"scaling": {"minReplicas": 1}}));
    let r = api
        .patch("orders", &apply("bob").force(), &Patch::Apply(&bob))
        .await;
    out.push(("forced apply bob".into(), outcome(r)));
    let before = rv(&api).await;
    let r = api
        .patch("orders", &apply("bob"), &Patch::Apply(&bob))
        .await;
    out.push(("apply bob again".into(), outcome(r)));
    out.push((
        "identical apply keeps resourceVersion".into(),
        json!(before == rv(&api).await),
    ));

    // 3. a conflicting apply between the two: refused without force, taken with it; then the loser
    // conflicts; a manager that stops sending a field it alone owns removes it.
    let bob_max = qc(json!({"scaling": {"minReplicas": 1, "maxReplicas": 7}}));
    let r = api
        .patch("orders", &apply("bob"), &Patch::Apply(&bob_max))
        .await;
    out.push(("conflicting apply".into(), outcome(r)));
    let r = api
        .patch("orders", &apply("bob").force(), &Patch::Apply(&bob_max))
        .await;
    out.push(("forced conflicting apply".into(), outcome(r)));
    let r = api
        .patch("orders", &apply("alice"), &Patch::Apply(&alice))
        .await;
    out.push(("apply by the manager who lost the field".into(), outcome(r)));
    let bare = json!({"apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
                      "metadata": {"name": "orders"}});
    let r = api
        .patch("orders", &apply("alice"), &Patch::Apply(&bare))
        .await;
    out.push(("apply without the label".into(), outcome(r)));

    // 4. status by server-side apply: conditions merge by type across managers.
    let status = |conditions: Vec<Value>| {
        json!({"apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
               "metadata": {"name": "orders"}, "status": {"conditions": conditions}})
    };
    let r = api
        .patch_status(
            "orders",
            &apply("qc-operator").force(),
            &Patch::Apply(status(vec![
                condition("Ready", "False"),
                condition("QueueReachable", "True"),
            ])),
        )
        .await;
    out.push(("status apply qc-operator".into(), outcome(r)));
    let r = api
        .patch_status(
            "orders",
            &apply("checker"),
            &Patch::Apply(status(vec![condition("ExternalCheck", "True")])),
        )
        .await;
    out.push(("status apply by another manager".into(), outcome(r)));
    let r = api
        .patch_status(
            "orders",
            &apply("checker"),
            &Patch::Apply(status(vec![condition("Ready", "True")])),
        )
        .await;
    out.push((
        "status apply of a condition someone else owns".into(),
        outcome(r),
    ));
    // qc-operator flips Ready and drops QueueReachable: removed; the other manager's stays.
    let r = api
        .patch_status(
            "orders",
            &apply("qc-operator").force(),
            &Patch::Apply(status(vec![condition("Ready", "True")])),
        )
        .await;
    out.push(("status apply dropping a condition".into(), outcome(r)));
    // Spec in a status apply is ignored, status in a spec apply too.
    let mut both = status(vec![condition("Ready", "Unknown")]);
    both["spec"] = json!({"processing": {"concurrency": 3}});
    let r = api
        .patch_status("orders", &apply("mixed").force(), &Patch::Apply(&both))
        .await;
    out.push(("status apply with spec".into(), outcome(r)));

    // 5. finalizer, then delete: held until the finalizer goes.
    let add: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["sqs.consumers.dev/cleanup"]}
    ]))
    .unwrap();
    let r = api
        .patch("orders", &PatchParams::default(), &Patch::Json::<()>(add))
        .await;
    out.push(("add finalizer".into(), outcome(r)));
    let r = api.delete("orders", &DeleteParams::default()).await;
    out.push((
        "delete".into(),
        match r {
            Ok(either) => json!({"held": either.is_left()}),
            Err(e) => json!({"error": e.to_string()}),
        },
    ));
    out.push(("after delete".into(), get().await));
    let spec_change = api
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"processing": {"concurrency": 2}}})),
        )
        .await;
    out.push(("spec change while deleting".into(), outcome(spec_change)));
    let remove: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "sqs.consumers.dev/cleanup"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .unwrap();
    let r = api
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Json::<()>(remove),
        )
        .await
        .map(|o| o.metadata.finalizers.is_none());
    out.push((
        "remove finalizer".into(),
        match r {
            Ok(gone) => json!({"finalizers gone": gone}),
            Err(e) => json!({"error": e.to_string()}),
        },
    ));
    out.push(("after finalizer removal".into(), get().await));

    // 6. a watch from the resourceVersion after the create replays everything since, in order.
    let mut events = Vec::new();
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), &after_create)
        .await
        .unwrap()
        .boxed();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap_or(Ok(None))
    {
        match e {
            WatchEvent::Added(o) => events.push(json!(["ADDED", view(&o)])),
            WatchEvent::Modified(o) => events.push(json!(["MODIFIED", view(&o)])),
            WatchEvent::Deleted(o) => {
                events.push(json!(["DELETED", view(&o)]));
                break;
            }
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => events.push(json!(["ERROR", e.code])),
        }
    }
    out.push(("watch from after the create".into(), json!(events)));
    out
}

#[tokio::test]
async fn the_fake_answers_queue_consumer_operations_as_the_real_server_does() {
    let test = "the_fake_answers_queue_consumer_operations_as_the_real_server_does";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let fake = FakeKube::new();
    let on_fake = scenario(Api::namespaced(fake.client(), "shop")).await;
    let on_real = scenario(Api::namespaced(real.client.clone(), &real.namespace)).await;
    assert_eq!(on_fake.len(), on_real.len());
    let mut differences = Vec::new();
    for ((step, f), (_, r)) in on_fake.iter().zip(&on_real) {
        if f != r {
            differences.push(format!(
                "{step}:\n  fake: {}\n  real: {}",
                serde_json::to_string(f).unwrap(),
                serde_json::to_string(r).unwrap()
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "the fake differs from the real API server:\n{}",
        differences.join("\n")
    );
}

/// The same QueueConsumer sequence against kube-apiserver 1.37 of the whole control plane (the CRD server
/// above is apiextensions-apiserver 0.36 alone): what the controller meets in a cluster.
#[tokio::test]
async fn the_fake_answers_queue_consumer_operations_as_kube_apiserver_does() {
    let test = "the_fake_answers_queue_consumer_operations_as_kube_apiserver_does";
    let Some(cluster) = common::cluster::connect(test).await else {
        return;
    };
    ensure_crd(&cluster.admin).await;
    let ns = common::cluster::unique("diff-qc");
    cluster.namespace(&ns, false).await;
    let on_fake = scenario(Api::namespaced(FakeKube::new().client(), "shop")).await;
    let on_real = scenario(Api::namespaced(cluster.admin.clone(), &ns)).await;
    cluster.delete_namespace(&ns).await;
    assert_same(&on_fake, &on_real);
}

/// The chart's CRD when a release installed it; the committed one (the same) otherwise.
async fn ensure_crd(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if crds.get_opt(k8s::CRD_NAME).await.unwrap().is_none() {
        k8s::install_crd(client, k8s::CRD_YAML, "qc-tests").await;
    }
}

fn assert_same(on_fake: &[(String, Value)], on_real: &[(String, Value)]) {
    assert_eq!(on_fake.len(), on_real.len());
    let mut differences = Vec::new();
    for ((step, f), (_, r)) in on_fake.iter().zip(on_real) {
        if f != r {
            differences.push(format!(
                "{step}:\n  fake: {}\n  real: {}",
                serde_json::to_string(f).unwrap(),
                serde_json::to_string(r).unwrap()
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "the fake differs from the real API server:\n{}",
        differences.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------------
// Against the whole control plane (kube-apiserver, kube-controller-manager: `scripts/test`'s
// `start_k8s_cluster`): the other verbs the controller uses, on the kinds the CRD server does not serve.

/// A Deployment as the controller's checks see it: what the controller-manager adds on its own (status,
/// the revision annotation) and what differs between servers (uids, times, resourceVersions,
/// managedFields) left out.
fn deployment_view(d: &k8s_openapi::api::apps::v1::Deployment) -> Value {
    let v = serde_json::to_value(d).unwrap();
    let mut annotations = v["metadata"]["annotations"].clone();
    if let Some(a) = annotations.as_object_mut() {
        a.remove("deployment.kubernetes.io/revision");
        // A hash over the rendered object, the owner's uid included: present on both, equal on neither.
        a.remove(qc::controller::apply::RENDERED_HASH);
    }
    let owners: Vec<Value> = v["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            let mut o = o.clone();
            o.as_object_mut().unwrap().remove("uid");
            o
        })
        .collect();
    json!({
        "generation": v["metadata"]["generation"],
        "labels": v["metadata"]["labels"],
        "annotations": annotations,
        "ownerReferences": owners,
        "spec": v["spec"],
    })
}

fn api_error(e: &kube::Error) -> Value {
    match e {
        kube::Error::Api(s) => {
            json!({"code": s.code, "reason": s.reason, "message": without_manager_notes(&s.message)})
        }
        e => json!({"error": e.to_string()}),
    }
}

fn result_of<T>(r: Result<T, kube::Error>, view: impl Fn(&T) -> Value) -> Value {
    match r {
        Ok(o) => view(&o),
        Err(e) => api_error(&e),
    }
}

/// On the real control plane, until the controller-manager has acted on the Deployment's last change
/// (its status has caught up with its generation), so what follows is not raced by its writes. The fake
/// has no controller-manager: nothing to wait for.
async fn quiet(api: &Api<k8s_openapi::api::apps::v1::Deployment>, name: &str, real: bool) {
    if !real {
        return;
    }
    let deadline = std::time::Instant::now() + Duration::from_mins(1);
    loop {
        let d = api.get(name).await.unwrap();
        let observed = d.status.as_ref().and_then(|s| s.observed_generation);
        let revised = d
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("deployment.kubernetes.io/revision"));
        if revised && observed == d.metadata.generation {
            // One more beat: its ReplicaSet's own status can come back to the Deployment once more.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let again = api.get(name).await.unwrap();
            if again.metadata.resource_version == d.metadata.resource_version {
                return;
            }
            continue;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the controller-manager never caught up with Deployment {name}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Until `check` holds on the real control plane (its garbage collector works asynchronously), or at once
/// on the fake; the value `check` gave last.
async fn settle<F, Fut>(real: bool, check: F) -> Value
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = (bool, Value)>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(if real { 60 } else { 0 });
    loop {
        let (done, v) = check().await;
        if done || std::time::Instant::now() >= deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The controller's verbs beyond the QueueConsumer itself, as it makes them (same managers, same bodies):
/// the rendered Deployment by server-side apply (forced, strict validation) and the decision that an
/// unchanged one needs no write; the scaler's replicas under its own manager and the conflict when the
/// main manager sends replicas; pods listed by selector and their deletion cost patched; the Lease as
/// kube-lease-manager takes, renews and releases it; Events; a watch resumed from a resourceVersion;
/// garbage collection held by a finalizer, then in the background and in the foreground.
#[allow(clippy::too_many_lines)]
async fn controller_verbs(client: kube::Client, ns: &str, real: bool) -> Vec<(String, Value)> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{ListParams, PropagationPolicy};
    use qc::controller::apply::{
        FIELD_MANAGER, SCALER_FIELD_MANAGER, needs_apply, replicas_patch, with_fingerprint,
    };

    let mut out: Vec<(String, Value)> = Vec::new();
    let qcs: Api<QueueConsumer> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let url = "https://sqs.us-east-1.amazonaws.com/123456789012/orders";
    let render = |qc: &QueueConsumer| {
        with_fingerprint(
            qc::render::deployment(
                qc,
                &qc::render::RenderOptions {
                    worker_image: "example.org/qc:1".into(),
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    };
    let operator = || {
        PatchParams::apply(FIELD_MANAGER)
            .force()
            .validation_strict()
    };

    // 1. The QueueConsumer and its rendered Deployment, applied as the controller applies it.
    let doc = common::fixture::moto_consumer(ns, url).json();
    let qc = qcs
        .patch(
            "orders",
            &PatchParams::apply("test-user"),
            &Patch::Apply(&doc),
        )
        .await
        .unwrap();
    let desired = render(&qc);
    let r = deployments
        .patch("orders", &operator(), &Patch::Apply(&desired))
        .await;
    out.push((
        "apply the rendered Deployment".into(),
        result_of(r, deployment_view),
    ));
    quiet(&deployments, "orders", real).await;
    let after_create = deployments
        .get("orders")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let live = deployments.get("orders").await.unwrap();
    out.push((
        "an unchanged render needs no apply (defaults and all)".into(),
        json!(!needs_apply(&desired, Some(&live))),
    ));
    let r = deployments
        .patch("orders", &operator(), &Patch::Apply(&desired))
        .await
        .map(|d| d.metadata.resource_version == live.metadata.resource_version);
    out.push((
        "an identical apply keeps the resourceVersion".into(),
        result_of(r, |same| json!(same)),
    ));

    // 2. Replicas belong to the scaler's manager: the main manager's apply leaves them; sending them
    // without force conflicts.
    let r = deployments
        .patch(
            "orders",
            &PatchParams::apply(SCALER_FIELD_MANAGER).force(),
            &Patch::Apply(&replicas_patch("orders", 3)),
        )
        .await;
    out.push((
        "the scaler applies replicas".into(),
        result_of(r, deployment_view),
    ));
    quiet(&deployments, "orders", real).await;
    let mut changed = qc.clone();
    changed.spec.processing.concurrency = 7;
    let desired = render(&changed);
    let r = deployments
        .patch("orders", &operator(), &Patch::Apply(&desired))
        .await;
    out.push((
        "a new render keeps the scaler's replicas".into(),
        result_of(r, deployment_view),
    ));
    quiet(&deployments, "orders", real).await;
    let mut with_replicas = serde_json::to_value(&desired).unwrap();
    with_replicas["spec"]["replicas"] = json!(1);
    let r = deployments
        .patch(
            "orders",
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&with_replicas),
        )
        .await;
    out.push((
        "replicas from the main manager, unforced".into(),
        result_of(r, deployment_view),
    ));

    // 3. A watch resumed from the resourceVersion after the first apply: the changes since, in order (the
    // controller-manager's own writes on the real server folded: only what the controller wrote shows).
    let mut seen: Vec<Value> = Vec::new();
    let mut stream = deployments
        .watch(&WatchParams::default().timeout(3), &after_create)
        .await
        .unwrap()
        .boxed();
    while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap_or(Ok(None))
    {
        let step = match e {
            WatchEvent::Added(d) => json!(["ADDED", d.metadata.generation, d.spec.replicas]),
            WatchEvent::Modified(d) => {
                json!(["MODIFIED", d.metadata.generation, d.spec.replicas])
            }
            WatchEvent::Deleted(d) => json!(["DELETED", d.metadata.generation]),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => json!(["ERROR", e.code]),
        };
        if seen.last() != Some(&step) {
            seen.push(step);
        }
    }
    out.push((
        "watch Deployments from after the first apply".into(),
        json!(seen),
    ));

    // 4. Pods by the worker selector; the deletion cost patched as the scaler patches it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for (name, labels) in [
        ("orders-a", qc::render::selector_labels("orders")),
        ("other-a", [("app".to_string(), "other".to_string())].into()),
    ] {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "example.org/c:1"}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let r = pods
        .list(&ListParams::default().labels(&qc::render::selector_string("orders")))
        .await
        .map(|l| {
            // The real ReplicaSets make pods of their own (replicas 3, no node to run them): only the
            // two made here are compared.
            l.items
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .filter(|n| n == "orders-a" || n == "other-a")
                .collect::<Vec<_>>()
        });
    out.push((
        "list pods by the worker selector".into(),
        result_of(r, |n| json!(n)),
    ));
    let r = pods
        .patch(
            "orders-a",
            &PatchParams {
                field_manager: Some(SCALER_FIELD_MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"metadata": {"annotations": {
                qc::controller::workers::DELETION_COST: "5"}}})),
        )
        .await;
    out.push((
        "patch a pod's deletion cost".into(),
        result_of(r, |p| json!(p.metadata.annotations)),
    ));

    // 5. The Lease: made empty under the operator's manager (run.rs), taken by server-side apply, its
    // transitions counted and renewed by strategic merge patches, released with nulls (kube-lease-manager's
    // own bodies, times fixed), and a second create refused.
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let lease_view = |l: &Lease| json!(l.spec);
    let empty: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "qc"}
    }))
    .unwrap();
    let create = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let r = leases.create(&create, &empty).await;
    out.push(("create the Lease".into(), result_of(r, lease_view)));
    let r = leases.create(&create, &empty).await;
    out.push(("create it again".into(), result_of(r, lease_view)));
    let manager = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let t0 = "2026-12-06T10:00:00.000000Z";
    let t1 = "2026-12-06T10:00:04.000000Z";
    let r = leases
        .patch(
            "qc",
            &manager,
            &Patch::Apply(
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "spec": {"acquireTime": t0, "renewTime": t0, "holderIdentity": "op-a",
                         "leaseDurationSeconds": 6}}),
            ),
        )
        .await;
    out.push(("take the Lease".into(), result_of(r, lease_view)));
    for (step, spec) in [
        ("count the transition", json!({"leaseTransitions": 1})),
        ("renew", json!({"renewTime": t1, "leaseDurationSeconds": 6})),
        (
            "release",
            json!({"acquireTime": null, "renewTime": null, "holderIdentity": null,
                   "leaseDurationSeconds": null}),
        ),
    ] {
        let r = leases
            .patch(
                "qc",
                &manager,
                &Patch::Strategic(
                    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                         "spec": spec}),
                ),
            )
            .await;
        out.push((format!("{step} the Lease"), result_of(r, lease_view)));
    }

    // 6. An Event as `distinct_event` writes it, and the same name again.
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let event: Event = serde_json::from_value(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "orders.1"},
        "eventTime": "2026-12-06T10:00:00.000000Z",
        "action": "Scale", "reason": "Scaled", "note": "from 0 to 1", "type": "Normal",
        "regarding": {"apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
                      "name": "orders", "namespace": ns},
        "reportingController": "qc-operator", "reportingInstance": "op-a"
    }))
    .unwrap();
    let event_view = |e: &Event| {
        json!({"reason": e.reason, "note": e.note, "type": e.type_, "action": e.action,
               "regarding": e.regarding.as_ref().map(|r| (&r.kind, &r.name))})
    };
    let r = events.create(&create, &event).await;
    out.push(("create an Event".into(), result_of(r, event_view)));
    let r = events.create(&create, &event).await;
    out.push(("create the same Event".into(), result_of(r, event_view)));
    // A repeat folded into it, as `Context::event` patches it; and the patch of an Event that is gone.
    let series = qc::controller::events::series_patch(2, "2026-12-06T10:00:15Z".parse().unwrap());
    let fold = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let r = events
        .patch("orders.1", &fold, &Patch::Merge(&series))
        .await;
    out.push((
        "fold a repeat into the Event's series".into(),
        result_of(r, |e: &Event| {
            let mut v = event_view(e);
            v["series"] = json!(
                e.series
                    .as_ref()
                    .map(|s| (s.count, s.last_observed_time.0.to_string()))
            );
            v
        }),
    ));
    let r = events
        .patch("orders.gone", &fold, &Patch::Merge(&series))
        .await;
    out.push((
        "fold into an Event that is gone".into(),
        result_of(r, event_view),
    ));

    // 7. Garbage collection. A finalizer holds the QueueConsumer, and with it its Deployment; once it goes
    // the Deployment goes too (background).
    let add: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["sqs.consumers.dev/cleanup"]}
    ]))
    .unwrap();
    qcs.patch("orders", &manager, &Patch::Json::<()>(add))
        .await
        .unwrap();
    qcs.delete("orders", &DeleteParams::default())
        .await
        .unwrap();
    if real {
        // Time for a garbage collector that would wrongly act on an owner being deleted.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let r = deployments.get_opt("orders").await.map(|d| d.is_some());
    out.push((
        "the Deployment stays while a finalizer holds its owner".into(),
        result_of(r, |there| json!(there)),
    ));
    let remove: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "sqs.consumers.dev/cleanup"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .unwrap();
    qcs.patch("orders", &manager, &Patch::Json::<()>(remove))
        .await
        .unwrap();
    let gone = settle(real, || async {
        let d = deployments.get_opt("orders").await.unwrap();
        (d.is_none(), json!({"deployment there": d.is_some()}))
    })
    .await;
    out.push(("the owner gone, the Deployment is collected".into(), gone));

    // Foreground: the owner stays, marked, until its blocking dependent is gone.
    let doc = common::fixture::moto_consumer(ns, url)
        .set("/metadata/name", "refunds")
        .json();
    let refunds = qcs
        .patch(
            "refunds",
            &PatchParams::apply("test-user"),
            &Patch::Apply(&doc),
        )
        .await
        .unwrap();
    deployments
        .patch("refunds", &operator(), &Patch::Apply(&render(&refunds)))
        .await
        .unwrap();
    let r = qcs
        .delete(
            "refunds",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Foreground),
                ..DeleteParams::default()
            },
        )
        .await
        .map(|either| either.map_left(|qc| qc.metadata.finalizers).left());
    out.push((
        "a foreground delete".into(),
        result_of(r, |finalizers| json!({"held with": finalizers})),
    ));
    let gone = settle(real, || async {
        let d = deployments.get_opt("refunds").await.unwrap().is_some();
        let q = qcs.get_opt("refunds").await.unwrap().is_some();
        (!d && !q, json!({"deployment there": d, "owner there": q}))
    })
    .await;
    out.push(("after the foreground delete".into(), gone));
    out
}

#[tokio::test]
async fn the_fake_answers_the_controllers_other_verbs_as_a_real_control_plane_does() {
    let test = "the_fake_answers_the_controllers_other_verbs_as_a_real_control_plane_does";
    let Some(cluster) = common::cluster::connect(test).await else {
        return;
    };
    ensure_crd(&cluster.admin).await;
    let ns = common::cluster::unique("diff-verbs");
    cluster.namespace(&ns, false).await;
    let fake = FakeKube::new();
    let started = std::time::Instant::now();
    let on_fake = Box::pin(controller_verbs(fake.client(), &ns, false)).await;
    let fake_took = started.elapsed();
    let started = std::time::Instant::now();
    let on_real = Box::pin(controller_verbs(cluster.admin.clone(), &ns, true)).await;
    let real_took = started.elapsed();
    eprintln!(
        "the scenario took {} ms on the fake, {} ms on the real control plane",
        fake_took.as_millis(),
        real_took.as_millis()
    );
    cluster.delete_namespace(&ns).await;
    assert_same(&on_fake, &on_real);
    // What the controller relies on, on the real server: a repeat's patch is taken and counted, and
    // the patch of an Event that is gone is a 404 (the controller then makes a new Event).
    let step = |name: &str| &on_real.iter().find(|(s, _)| s == name).unwrap().1;
    assert_eq!(
        step("fold a repeat into the Event's series")["series"],
        json!([2, "2026-12-06T10:00:15Z"]),
        "{on_real:?}"
    );
    assert_eq!(
        step("fold into an Event that is gone")["code"],
        json!(404),
        "{on_real:?}"
    );
}
