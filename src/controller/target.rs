//! Scale-only mode (`spec.scaleTargetRef`): the user's own workload, read and scaled through its
//! `/scale` subresource only. Its pod template, labels and everything else stay the user's: the
//! controller never applies the object and never owns it; it reads only its metadata, for the opt-in
//! (`sqs.consumers.dev/scaled-by`, naming the QueueConsumer) and its owners.

use k8s_openapi::api::autoscaling::v1::Scale;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use crate::api::{SCALED_BY_ANNOTATION, ScaleTargetRef};

use super::apply::SCALER_FIELD_MANAGER;

/// What the target's `/scale` said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetScale {
    /// What the target asks for (`spec.replicas`; 0 when unset, as `/scale` reports it).
    pub asks: u32,
    /// The replicas its controller counts (`status.replicas`).
    pub replicas: i32,
    /// Its pods' label selector, as `/scale` reports it.
    pub selector: Option<String>,
}

impl TargetScale {
    pub fn from_scale(s: &Scale) -> TargetScale {
        TargetScale {
            asks: s
                .spec
                .as_ref()
                .and_then(|s| s.replicas)
                .and_then(|r| u32::try_from(r).ok())
                .unwrap_or(0),
            replicas: s.status.as_ref().map_or(0, |s| s.replicas),
            selector: s.status.as_ref().and_then(|s| s.selector.clone()),
        }
    }
}

/// The target as this reconcile found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetRead {
    Found(TargetScale),
    /// No object of that kind and name in the namespace (404).
    NotFound,
    /// The API server does not serve that apiVersion and kind, or it has no `/scale` subresource.
    NotScalable(String),
    /// The target does not name this QueueConsumer in `sqs.consumers.dev/scaled-by`: the message.
    NotOptedIn(String),
    /// Anything else (403 without the chart's RBAC for that kind, a timeout): the message.
    Failed(String),
}

impl TargetRead {
    pub fn found(&self) -> Option<&TargetScale> {
        match self {
            TargetRead::Found(s) => Some(s),
            _ => None,
        }
    }

    /// Why the target cannot be scaled, for `ScalingActive` (None when it was found).
    pub fn problem(&self, t: &ScaleTargetRef, namespace: &str) -> Option<String> {
        match self {
            TargetRead::Found(_) => None,
            TargetRead::NotFound => Some(format!(
                "spec.scaleTargetRef {} ({}) does not exist in namespace {namespace}: create it, or fix scaleTargetRef's apiVersion, kind or name; nothing is scaled until then",
                t.describe(),
                t.api_version
            )),
            TargetRead::NotScalable(why)
            | TargetRead::NotOptedIn(why)
            | TargetRead::Failed(why) => Some(format!(
                "spec.scaleTargetRef {} ({}) cannot be scaled: {why}",
                t.describe(),
                t.api_version
            )),
        }
    }
}

/// `apps/v1` → ("apps", "v1"); `v1` → ("", "v1").
pub fn group_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

/// The kinds whose resource name is known without asking the API server (the built-in workloads with
/// `/scale`); any other kind is looked up by discovery.
pub fn known_resource(t: &ScaleTargetRef) -> Option<ApiResource> {
    let (group, version) = group_version(&t.api_version);
    let plural = match (group, t.kind.as_str()) {
        ("apps", "Deployment") => "deployments",
        ("apps", "StatefulSet") => "statefulsets",
        ("apps", "ReplicaSet") => "replicasets",
        _ => return None,
    };
    Some(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, &t.kind),
        plural,
    ))
}

/// The merge patch of `/scale` that asks for `replicas`.
pub fn replicas_patch(replicas: u32) -> serde_json::Value {
    json!({"spec": {"replicas": replicas}})
}

async fn api(
    client: &kube::Client,
    ns: &str,
    t: &ScaleTargetRef,
) -> Result<Api<DynamicObject>, TargetRead> {
    let resource = if let Some(r) = known_resource(t) {
        r
    } else {
        let (group, version) = group_version(&t.api_version);
        let gvk = GroupVersionKind::gvk(group, version, &t.kind);
        match kube::discovery::pinned_kind(client, &gvk).await {
            Ok((resource, caps)) => {
                if !caps.subresources.iter().any(|(r, _)| r.plural == "scale") {
                    return Err(TargetRead::NotScalable(format!(
                        "{} {} has no /scale subresource",
                        t.api_version, t.kind
                    )));
                }
                resource
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(TargetRead::NotScalable(format!(
                    "the API server does not serve {} {} (is its CRD installed?)",
                    t.api_version, t.kind
                )));
            }
            Err(kube::Error::Discovery(e)) => {
                return Err(TargetRead::NotScalable(format!(
                    "the API server does not serve {} {}: {e}",
                    t.api_version, t.kind
                )));
            }
            Err(e) => return Err(TargetRead::Failed(format!("discovery: {e}"))),
        }
    };
    Ok(Api::namespaced_with(client.clone(), ns, &resource))
}

/// `what`: the request, e.g. "get its /scale".
fn failed(e: kube::Error, what: &str, t: &ScaleTargetRef) -> TargetRead {
    match e {
        kube::Error::Api(s) if s.code == 404 => TargetRead::NotFound,
        kube::Error::Api(s) if s.code == 403 => TargetRead::Failed(format!(
            "the operator may not {what} ({}): grant it in the chart's rbac.scaleTargets, e.g. {{apiGroup: {}, resources: [{}]}}",
            s.message,
            group_version(&t.api_version).0,
            t.kind.to_lowercase() + "s"
        )),
        e => TargetRead::Failed(format!("{what}: {e}")),
    }
}

/// Whether the target's metadata lets QueueConsumer `consumer` scale it: it names `consumer` in
/// [`SCALED_BY_ANNOTATION`], and no QueueConsumer controls it as its bundled worker. The message says why
/// not and how to opt in. Anyone who may create a QueueConsumer could otherwise have any workload of the
/// namespace scaled (to 0 by `suspend`, up to `maxReplicas`) without the right to scale it themselves;
/// the annotation is written by whoever may change the target, once.
pub fn opt_in_problem(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    t: &ScaleTargetRef,
    namespace: &str,
    consumer: &str,
) -> Option<String> {
    if let Some(owner) =
        worker_of_a_queue_consumer(meta.owner_references.as_deref().unwrap_or_default())
    {
        return Some(format!(
            "it is the bundled worker's Deployment of QueueConsumer {owner}, which scales it already: point scaleTargetRef at your own workload"
        ));
    }
    let named = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(SCALED_BY_ANNOTATION))
        .map(|v| v.trim());
    let fix = format!(
        "whoever may change it opts it in with {}",
        t.opt_in_command(Some(namespace), consumer)
    );
    match named {
        Some(n) if n == consumer => None,
        Some(n) => Some(format!(
            "its annotation {SCALED_BY_ANNOTATION} names QueueConsumer {n:?}, not {consumer}: one QueueConsumer scales a workload; {fix}"
        )),
        None => Some(format!(
            "it has no annotation {SCALED_BY_ANNOTATION}: {consumer}; {fix}"
        )),
    }
}

/// A target this or another QueueConsumer already scales as its bundled worker: the controlling owner
/// reference of a QueueConsumer on it (`apiVersion/kind name`). Two scalers on one `spec.replicas` would
/// undo each other's writes every poll.
pub fn worker_of_a_queue_consumer(
    owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
) -> Option<String> {
    owners
        .iter()
        .find(|o| {
            o.controller == Some(true)
                && o.kind == crate::api::KIND
                && o.api_version
                    .starts_with(&format!("{}/", crate::api::GROUP))
        })
        .map(|o| o.name.clone())
}

/// Reads the target's metadata (for the opt-in and its owners) and its `/scale`. Without the opt-in the
/// target is not scaled; its `/scale` is still read, so status shows what it runs.
pub async fn read(
    client: &kube::Client,
    ns: &str,
    consumer: &str,
    t: &ScaleTargetRef,
) -> TargetRead {
    let api = match api(client, ns, t).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    let meta = match api.get_metadata_opt(&t.name).await {
        Ok(Some(m)) => m.metadata,
        Ok(None) => return TargetRead::NotFound,
        Err(e) => return failed(e, "get its metadata", t),
    };
    if let Some(why) = opt_in_problem(&meta, t, ns, consumer) {
        return TargetRead::NotOptedIn(why);
    }
    match api.get_scale(&t.name).await {
        Ok(s) => TargetRead::Found(TargetScale::from_scale(&s)),
        Err(e) => failed(e, "get its /scale", t),
    }
}

/// Writes `spec.replicas` through `/scale` as the scaler's field manager: a merge patch, which every
/// `/scale` serves (server-side apply of `/scale` is not served for every kind).
pub async fn scale(
    client: &kube::Client,
    ns: &str,
    t: &ScaleTargetRef,
    replicas: u32,
) -> Result<TargetScale, TargetRead> {
    let api = api(client, ns, t).await?;
    let params = PatchParams {
        field_manager: Some(SCALER_FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    api.patch_scale(&t.name, &params, &Patch::Merge(replicas_patch(replicas)))
        .await
        .map(|s| TargetScale::from_scale(&s))
        .map_err(|e| failed(e, "patch its /scale", t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(api_version: &str, kind: &str) -> ScaleTargetRef {
        ScaleTargetRef {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "orders".into(),
        }
    }

    #[test]
    fn the_built_in_workloads_need_no_discovery() {
        let d = known_resource(&target("apps/v1", "Deployment")).unwrap();
        assert_eq!((d.group.as_str(), d.version.as_str()), ("apps", "v1"));
        assert_eq!(d.plural, "deployments");
        assert_eq!(
            known_resource(&target("apps/v1", "StatefulSet"))
                .unwrap()
                .plural,
            "statefulsets"
        );
        assert_eq!(
            known_resource(&target("argoproj.io/v1alpha1", "Rollout")),
            None
        );
        assert_eq!(known_resource(&target("v1", "ReplicationController")), None);
        assert_eq!(group_version("v1"), ("", "v1"));
        assert_eq!(
            group_version("argoproj.io/v1alpha1"),
            ("argoproj.io", "v1alpha1")
        );
    }

    #[test]
    fn scale_reads_what_the_target_asks_for_and_runs() {
        let s: Scale = serde_json::from_value(json!({
            "metadata": {"name": "orders"},
            "spec": {"replicas": 3},
            "status": {"replicas": 2, "selector": "app=orders"}
        }))
        .unwrap();
        assert_eq!(
            TargetScale::from_scale(&s),
            TargetScale {
                asks: 3,
                replicas: 2,
                selector: Some("app=orders".into())
            }
        );
        let empty: Scale = serde_json::from_value(json!({"metadata": {}})).unwrap();
        assert_eq!(TargetScale::from_scale(&empty).asks, 0);
        assert_eq!(replicas_patch(4), json!({"spec": {"replicas": 4}}));
    }

    #[test]
    fn a_queue_consumers_worker_is_no_target() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let owner = |api_version: &str, kind: &str, controller| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "payments".into(),
            uid: "u".into(),
            controller,
            block_owner_deletion: None,
        };
        assert_eq!(
            worker_of_a_queue_consumer(&[owner(
                "sqs.consumers.dev/v1alpha1",
                "QueueConsumer",
                Some(true)
            )]),
            Some("payments".into())
        );
        for other in [
            owner("sqs.consumers.dev/v1alpha1", "QueueConsumer", None),
            owner("argoproj.io/v1alpha1", "Rollout", Some(true)),
            owner("example.org/v1", "QueueConsumer", Some(true)),
        ] {
            assert_eq!(
                worker_of_a_queue_consumer(std::slice::from_ref(&other)),
                None,
                "{other:?}"
            );
        }
        assert_eq!(worker_of_a_queue_consumer(&[]), None);
    }

    #[test]
    fn only_a_target_that_names_the_queue_consumer_is_scaled() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
        let meta = |scaled_by: Option<&str>| ObjectMeta {
            name: Some("orders".into()),
            annotations: scaled_by
                .map(|v| [(SCALED_BY_ANNOTATION.to_string(), v.to_string())].into()),
            ..ObjectMeta::default()
        };
        let t = target("apps/v1", "Deployment");
        assert_eq!(
            opt_in_problem(&meta(Some("orders-qc")), &t, "shop", "orders-qc"),
            None
        );
        assert_eq!(
            opt_in_problem(&meta(Some(" orders-qc ")), &t, "shop", "orders-qc"),
            None
        );
        // No annotation: refused, with the command that opts it in.
        let none = opt_in_problem(&meta(None), &t, "shop", "orders-qc").unwrap();
        assert!(
            none.contains("no annotation sqs.consumers.dev/scaled-by")
                && none.contains(
                    "kubectl annotate -n shop deployment.apps/orders sqs.consumers.dev/scaled-by=orders-qc"
                ),
            "{none}"
        );
        // Another QueueConsumer named: one scaler per workload.
        let other = opt_in_problem(&meta(Some("billing")), &t, "shop", "orders-qc").unwrap();
        assert!(
            other.contains("names QueueConsumer \"billing\", not orders-qc"),
            "{other}"
        );
        // Empty value, a prefix, a case change: no match.
        for v in ["", "orders", "Orders-qc", "orders-qc2"] {
            assert!(
                opt_in_problem(&meta(Some(v)), &t, "shop", "orders-qc").is_some(),
                "{v:?}"
            );
        }
        // The bundled worker of a QueueConsumer is refused even when annotated.
        let mut worker = meta(Some("orders-qc"));
        worker.owner_references = Some(vec![OwnerReference {
            api_version: "sqs.consumers.dev/v1alpha1".into(),
            kind: "QueueConsumer".into(),
            name: "payments".into(),
            uid: "u".into(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
        let w = opt_in_problem(&worker, &t, "shop", "orders-qc").unwrap();
        assert!(
            w.contains("bundled worker's Deployment of QueueConsumer payments"),
            "{w}"
        );
        // A core-group or custom kind is named as kubectl reads it.
        let rollout = opt_in_problem(
            &meta(None),
            &target("argoproj.io/v1alpha1", "Rollout"),
            "shop",
            "orders-qc",
        )
        .unwrap();
        assert!(rollout.contains("rollout.argoproj.io/orders"), "{rollout}");
        let rc = opt_in_problem(
            &meta(None),
            &target("v1", "ReplicationController"),
            "shop",
            "q",
        )
        .unwrap();
        assert!(rc.contains(" replicationcontroller/orders "), "{rc}");
    }

    #[test]
    fn problems_name_the_target_and_the_fix() {
        let t = target("apps/v1", "Deployment");
        assert_eq!(
            TargetRead::Found(TargetScale {
                asks: 1,
                replicas: 1,
                selector: None
            })
            .problem(&t, "shop"),
            None
        );
        let missing = TargetRead::NotFound.problem(&t, "shop").unwrap();
        assert!(
            missing.contains("Deployment/orders (apps/v1) does not exist in namespace shop"),
            "{missing}"
        );
        let denied = failed(
            kube::Error::Api(Box::new(
                kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
            )),
            "get its /scale",
            &target("argoproj.io/v1alpha1", "Rollout"),
        );
        let TargetRead::Failed(why) = &denied else {
            panic!("{denied:?}")
        };
        assert!(
            why.contains("rbac.scaleTargets")
                && why.contains("argoproj.io")
                && why.contains("rollouts"),
            "{why}"
        );
    }
}
