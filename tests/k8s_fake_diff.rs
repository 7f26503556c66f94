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
