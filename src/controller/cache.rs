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

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::Resource;

use super::apply::FIELD_MANAGER;

use crate::api::QueueConsumer;

/// kubectl's client-side apply record: the whole applied object as JSON text.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Trims a QueueConsumer as the watch delivers it, before it enters the cache (see the module's text).
/// Of `managedFields`, what stays is what [`super::status::foreign_condition_types`] answers from: for
/// each other manager owning status conditions, an entry with its manager and the keys of the conditions
/// it owns and the controller does not. The controller's own entry goes: it only ever cancelled out
/// types another manager owned as well, and those keys are dropped instead. So a QueueConsumer whose
/// conditions are all the controller's keeps no `managedFields` at all.
pub fn trim(qc: &mut QueueConsumer) {
    let meta = qc.meta_mut();
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    let Some(mut entries) = meta.managed_fields.take() else {
        return;
    };
    let condition_keys = |entry: &ManagedFieldsEntry| -> Vec<String> {
        entry
            .fields_v1
            .as_ref()
            .and_then(|f| f.0.get("f:status"))
            .and_then(|s| s.get("f:conditions"))
            .and_then(serde_json::Value::as_object)
            .map(|owned| owned.keys().cloned().collect())
            .unwrap_or_default()
    };
    let ours: BTreeSet<String> = entries
        .iter()
        .filter(|e| e.manager.as_deref() == Some(FIELD_MANAGER))
        .flat_map(condition_keys)
        .collect();
    entries.retain_mut(|entry| {
        if entry.manager.as_deref() == Some(FIELD_MANAGER) {
            return false;
        }
        let theirs: serde_json::Map<String, serde_json::Value> = condition_keys(entry)
            .into_iter()
            .filter(|k| !ours.contains(k))
            .map(|k| (k, serde_json::Value::Object(serde_json::Map::new())))
            .collect();
        if theirs.is_empty() {
            return false;
        }
        *entry = ManagedFieldsEntry {
            manager: entry.manager.take(),
            operation: entry.operation.take(),
            subresource: entry.subresource.take(),
            fields_v1: Some(FieldsV1(serde_json::json!({
                "f:status": { "f:conditions": theirs }
            }))),
            ..ManagedFieldsEntry::default()
        };
        true
    });
    meta.managed_fields = (!entries.is_empty()).then_some(entries);
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
        assert_eq!(managers, ["team-tool"]);
        let theirs = &after.metadata.managed_fields.as_ref().unwrap()[0];
        assert_eq!(theirs.subresource.as_deref(), Some("status"));
        assert_eq!(
            theirs.fields_v1.as_ref().unwrap().0,
            json!({"f:status": {"f:conditions": {"k:{\"type\":\"Audited\"}": {}}}})
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

    /// A type another manager owns as well stays the controller's: trimmed, the other manager's entry
    /// loses it, and with nothing else of theirs the entry goes; the answer is the same as before.
    #[test]
    fn conditions_the_controller_owns_too_are_not_foreign_after_the_trim() {
        let mut before = consumer();
        let entries = before.metadata.managed_fields.as_mut().unwrap();
        entries[2].fields_v1 = Some(FieldsV1(json!({"f:status": {"f:conditions": {
            "k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}}
        }}})));
        let mut after = before.clone();
        trim(&mut after);
        assert_eq!(after.metadata.managed_fields, None);
        assert!(foreign_condition_types(&before.metadata, "qc-operator").is_empty());
        assert!(foreign_condition_types(&after.metadata, "qc-operator").is_empty());
        // Both owning Ready and the other also Audited: Audited alone stays, as theirs.
        let mut both = consumer();
        both.metadata.managed_fields.as_mut().unwrap()[2].fields_v1 =
            Some(FieldsV1(json!({"f:status": {"f:conditions": {
                "k:{\"type\":\"Ready\"}": {}, "k:{\"type\":\"Audited\"}": {}
            }}})));
        let mut trimmed = both.clone();
        trim(&mut trimmed);
        assert_eq!(
            trimmed.metadata.managed_fields.as_ref().unwrap()[0]
                .fields_v1
                .as_ref()
                .unwrap()
                .0,
            json!({"f:status": {"f:conditions": {"k:{\"type\":\"Audited\"}": {}}}})
        );
        assert_eq!(
            foreign_condition_types(&trimmed.metadata, "qc-operator"),
            foreign_condition_types(&both.metadata, "qc-operator")
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
