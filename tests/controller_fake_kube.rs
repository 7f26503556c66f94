//! The in-memory Kubernetes API the reconcile tests run against behaves like an API server where the
//! controller depends on it: apply ownership and conflicts, no-op writes, status, watch, deletion.

mod fake_kube;

use fake_kube::{DEPLOYMENTS, FakeKube, LEASES, PODS};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

fn deployment(image: &str, extra_env: bool) -> serde_json::Value {
    let mut env = vec![json!({"name": "A", "value": "1"})];
    if extra_env {
        env.push(json!({"name": "B", "value": "2"}));
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns", "labels": {"x": "y"}},
        "spec": {
            "selector": {"matchLabels": {"app": "d"}},
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {"containers": [{"name": "c", "image": image, "env": env}]}
            }
        }
    })
}

fn rv(d: &Deployment) -> String {
    d.metadata.resource_version.clone().unwrap()
}

#[tokio::test]
async fn apply_creates_defaults_and_noop_keeps_resource_version() {
    let fake = FakeKube::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(), "ns");
    let pp = PatchParams::apply("a").force();
    let d1 = api
        .patch("d", &pp, &Patch::Apply(deployment("img:1", false)))
        .await
        .unwrap();
    assert_eq!(d1.spec.replicas, Some(1), "server default");
    assert_eq!(d1.metadata.generation, Some(1));
    let d2 = api
        .patch("d", &pp, &Patch::Apply(deployment("img:1", false)))
        .await
        .unwrap();
    assert_eq!(rv(&d1), rv(&d2), "identical apply changes nothing");
    let d3 = api
        .patch("d", &pp, &Patch::Apply(deployment("img:2", false)))
        .await
        .unwrap();
    assert_ne!(rv(&d1), rv(&d3));
    assert_eq!(d3.metadata.generation, Some(2));
    let writes = fake.writes();
    assert_eq!(writes.len(), 3);
    assert!(
        writes
            .iter()
            .all(|w| w.is_apply() && w.field_manager() == Some("a") && w.force())
    );
}

#[tokio::test]
async fn apply_conflicts_force_and_field_removal() {
    let fake = FakeKube::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(), "ns");
    api.patch(
        "d",
        &PatchParams::apply("a"),
        &Patch::Apply(deployment("img:1", true)),
    )
    .await
    .unwrap();
    // Another manager setting replicas (not applied by "a") is no conflict, and "a" keeps it.
    api.patch(
        "d",
        &PatchParams::apply("scaler"),
        &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d"}, "spec": {"replicas": 4}})),
    )
    .await
    .unwrap();
    let err = api
        .patch(
            "d",
            &PatchParams::apply("b"),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "d"},
                "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "other"}]}}}})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"),
        "{err:?}"
    );
    // "a" drops env B: the field goes; replicas stay with the scaler.
    let d = api
        .patch(
            "d",
            &PatchParams::apply("a"),
            &Patch::Apply(deployment("img:1", false)),
        )
        .await
        .unwrap();
    let env = d.spec.template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    assert_eq!(env.len(), 1);
    assert_eq!(d.spec.replicas, Some(4));
    assert!(
        fake.owned_fields(DEPLOYMENTS, "ns", "d", "scaler")
            .contains(&"spec.replicas".to_string())
    );
    assert!(
        !fake
            .owned_fields(DEPLOYMENTS, "ns", "d", "a")
            .contains(&"spec.replicas".to_string())
    );
}

#[tokio::test]
async fn status_subresource_is_separate() {
    let fake = FakeKube::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(), "ns");
    api.create(
        &PostParams::default(),
        &serde_json::from_value(deployment("i", false)).unwrap(),
    )
    .await
    .unwrap();
    let d = api
        .patch_status(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 9}, "status": {"availableReplicas": 1}})),
        )
        .await
        .unwrap();
    assert_eq!(d.spec.replicas, Some(1), "status writes ignore spec");
    assert_eq!(d.status.unwrap().available_replicas, Some(1));
    let d = api
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"availableReplicas": 7}})),
        )
        .await
        .unwrap();
    assert_eq!(
        d.status.unwrap().available_replicas,
        Some(1),
        "main resource ignores status"
    );
}

#[tokio::test]
async fn watch_replays_from_resource_version_and_streams() {
    let fake = FakeKube::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(), "ns");
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(deployment("i", false)).unwrap(),
        )
        .await
        .unwrap();
    let list = api.list(&kube::api::ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let mut stream = api
        .watch(&WatchParams::default().timeout(10), &rv(&created))
        .await
        .unwrap()
        .boxed();
    api.patch(
        "d",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"k": "v"}}})),
    )
    .await
    .unwrap();
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Modified(d) => assert_eq!(
            d.metadata.labels.unwrap().get("k").map(String::as_str),
            Some("v")
        ),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn lists_return_one_kind_in_one_namespace_or_all_namespaces_with_selectors() {
    let fake = FakeKube::new();
    for (ns, name, app) in [
        ("a", "p1", "x"),
        ("a", "p2", "y"),
        ("b", "p1", "x"),
        ("c", "p3", "x"),
    ] {
        fake.create(
            PODS,
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
                   "spec": {"containers": [{"name": "c", "image": "i"}]}}),
        );
    }
    // Another kind with the same names and labels in the same namespaces: never in a Pod list.
    for ns in ["a", "b"] {
        let mut d = deployment("i", false);
        d["metadata"]["namespace"] = json!(ns);
        d["metadata"]["labels"] = json!({"app": "x"});
        fake.create(DEPLOYMENTS, d);
    }
    let names = |pods: Vec<Pod>| -> Vec<String> {
        pods.into_iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p.metadata.namespace.unwrap(),
                    p.metadata.name.unwrap()
                )
            })
            .collect()
    };
    let list = |api: Api<Pod>, selector: &'static str| async move {
        let lp = kube::api::ListParams::default().labels(selector);
        names(api.list(&lp).await.unwrap().items)
    };
    assert_eq!(
        list(Api::namespaced(fake.client(), "a"), "").await,
        ["a/p1", "a/p2"]
    );
    assert_eq!(
        list(Api::namespaced(fake.client(), "a"), "app=x").await,
        ["a/p1"]
    );
    assert_eq!(
        list(Api::namespaced(fake.client(), "b"), "app=y").await,
        Vec::<String>::new()
    );
    assert_eq!(
        list(Api::namespaced(fake.client(), "z"), "").await,
        Vec::<String>::new()
    );
    assert_eq!(
        list(Api::all(fake.client()), "app=x").await,
        ["a/p1", "b/p1", "c/p3"]
    );
    assert_eq!(list(Api::all(fake.client()), "").await.len(), 4);
}

#[tokio::test]
async fn finalizers_hold_deletion_and_owners_collect_dependents() {
    let fake = FakeKube::new();
    let api: Api<Deployment> = Api::namespaced(fake.client(), "ns");
    let mut owner = deployment("i", false);
    owner["metadata"]["name"] = json!("owner");
    owner["metadata"]["finalizers"] = json!(["x/y"]);
    let owner: Deployment = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(owner).unwrap(),
        )
        .await
        .unwrap();
    let mut child = deployment("i", false);
    child["metadata"]["name"] = json!("child");
    child["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "Deployment",
        "name": "owner", "uid": owner.metadata.uid.clone().unwrap()}]);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(child).unwrap(),
    )
    .await
    .unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    let held = api.get("owner").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    let remove: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "x/y"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .unwrap();
    api.patch("owner", &PatchParams::default(), &Patch::Json::<()>(remove))
        .await
        .unwrap();
    assert!(api.get_opt("owner").await.unwrap().is_none());
    assert!(
        api.get_opt("child").await.unwrap().is_none(),
        "garbage collected"
    );
}

#[tokio::test]
async fn injected_faults_and_leases() {
    let fake = FakeKube::new();
    let api: Api<Lease> = Api::namespaced(fake.client(), "ns");
    fake.fail("POST", "/leases", 500, "InternalError", 1);
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "l"}})).unwrap();
    assert!(api.create(&PostParams::default(), &lease).await.is_err());
    api.create(&PostParams::default(), &lease).await.unwrap();
    assert!(fake.get(LEASES, "ns", "l").is_some());
    let statuses: Vec<u16> = fake.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [500, 201]);
}
