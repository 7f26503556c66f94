//! What the watch cache keeps of each QueueConsumer.
//!
//! The reconcile reads a QueueConsumer's spec, status, labels, annotations, finalizers and, of its
//! `managedFields`, only which manager owns which status condition
//! ([`super::status::foreign_condition_types`]). Everything else in `managedFields` (each manager's
//! whole field set: all of the spec for kubectl and helm, all of the status for the controller) and
//! kubectl's `last-applied-configuration` annotation (the whole object once more, as text) is never
//! read, yet was most of a cached object. The cache drops it as each object arrives from the watch.
//!
//! Nothing trimmed can be written back: the controller writes QueueConsumers only with patches and
//! server-side applies it builds itself (status, finalizers, the redrive annotation), never by
//! replacing a cached object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
use kube::Resource;

use crate::api::QueueConsumer;

/// kubectl's client-side apply record: the whole applied object as JSON text.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Trims a QueueConsumer as the watch delivers it, before it enters the cache (see the module's text).
/// A `managedFields` entry is kept, with its manager and the keys of its `f:status.f:conditions` only
/// (which condition types it owns, not the fields of each), when it owns status conditions; other
/// entries are dropped.
pub fn trim(qc: &mut QueueConsumer) {
    let meta = qc.meta_mut();
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    if let Some(entries) = meta.managed_fields.as_mut() {
        entries.retain_mut(|entry| {
            let conditions: Option<serde_json::Map<String, serde_json::Value>> = entry
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:status"))
                .and_then(|s| s.get("f:conditions"))
                .and_then(serde_json::Value::as_object)
                .map(|owned| {
                    owned
                        .keys()
                        .map(|k| (k.clone(), serde_json::Value::Object(serde_json::Map::new())))
                        .collect()
                });
            let Some(conditions) = conditions else {
                return false;
            };
            entry.fields_v1 = Some(FieldsV1(serde_json::json!({
                "f:status": { "f:conditions": conditions }
            })));
            entry.time = None;
            entry.api_version = None;
            entry.fields_type = None;
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::status::foreign_condition_types;
    use serde_json::json;

    fn consumer() -> QueueConsumer {
        serde_json::from_value(json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1",
            "kind": "QueueConsumer",
            "metadata": {
                "name": "orders",
                "namespace": "shop",
                "annotations": {
                    LAST_APPLIED: "{\"apiVersion\":\"sqs.consumers.dev/v1alpha1\",\"spec\":{}}",
                    "sqs.consumers.dev/redrive": "now"
                },
                "managedFields": [
                    {
                        "manager": "kubectl-client-side-apply",
                        "operation": "Update",
                        "apiVersion": "sqs.consumers.dev/v1alpha1",
                        "time": "2026-12-07T10:00:00Z",
                        "fieldsType": "FieldsV1",
                        "fieldsV1": {"f:metadata": {"f:annotations": {".": {}}}, "f:spec": {"f:queue": {"f:url": {}}}}
                    },
                    {
                        "manager": "qc-operator",
                        "operation": "Apply",
                        "apiVersion": "sqs.consumers.dev/v1alpha1",
                        "time": "2026-12-07T10:00:01Z",
                        "fieldsType": "FieldsV1",
                        "subresource": "status",
                        "fieldsV1": {"f:status": {
                            "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}}},
                            "f:queue": {"f:visible": {}}
                        }}
                    },
                    {
                        "manager": "team-tool",
                        "operation": "Apply",
                        "fieldsType": "FieldsV1",
                        "subresource": "status",
                        "fieldsV1": {"f:status": {
                            "f:conditions": {"k:{\"type\":\"Audited\"}": {".": {}, "f:status": {}}}
                        }}
                    }
                ]
            },
            "spec": {
                "queue": {"url": "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"},
                "handler": {"http": {}},
                "processing": {"p99": "2s"}
            }
        }))
        .unwrap()
    }

    #[test]
    fn keeps_what_the_reconcile_reads_and_drops_the_rest() {
        let before = consumer();
        let mut after = before.clone();
        trim(&mut after);
        let annotations = after.metadata.annotations.as_ref().unwrap();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert_eq!(
            annotations
                .get("sqs.consumers.dev/redrive")
                .map(String::as_str),
            Some("now")
        );
        let managers: Vec<_> = after
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .map(|e| e.manager.clone().unwrap_or_default())
            .collect();
        assert_eq!(managers, ["qc-operator", "team-tool"]);
        let ours = &after.metadata.managed_fields.as_ref().unwrap()[0];
        assert_eq!(ours.subresource.as_deref(), Some("status"));
        assert_eq!(
            ours.fields_v1.as_ref().unwrap().0,
            json!({"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {}}}})
        );
        // The one reader of managedFields answers the same before and after.
        assert_eq!(
            foreign_condition_types(&after.metadata, "qc-operator"),
            foreign_condition_types(&before.metadata, "qc-operator")
        );
        assert_eq!(
            foreign_condition_types(&after.metadata, "qc-operator")
                .into_iter()
                .collect::<Vec<_>>(),
            ["Audited"]
        );
        assert_eq!(after.spec, before.spec);
        assert!(
            serde_json::to_vec(&after).unwrap().len() < serde_json::to_vec(&before).unwrap().len()
        );
    }

    #[test]
    fn an_object_without_managed_fields_or_annotations_is_left_as_it_is() {
        let mut qc = consumer();
        qc.metadata.annotations = None;
        qc.metadata.managed_fields = None;
        let before = serde_json::to_value(&qc).unwrap();
        trim(&mut qc);
        assert_eq!(serde_json::to_value(&qc).unwrap(), before);
    }
}
