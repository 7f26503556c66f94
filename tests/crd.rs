//! The committed CRD must equal what the types generate; regenerate with
//! `cargo run --bin qc-operator -- crd > crds/queueconsumers.sqs.consumers.dev.yaml`.

use kube::CustomResourceExt;
use qc::api::QueueConsumer;

const COMMITTED: &str = include_str!("../crds/queueconsumers.sqs.consumers.dev.yaml");

#[test]
fn committed_crd_matches_types() {
    let generated = qc::api::crd_yaml().expect("crd renders");
    assert!(
        generated == COMMITTED,
        "crds/queueconsumers.sqs.consumers.dev.yaml is stale: run `cargo run --bin qc-operator -- crd > crds/queueconsumers.sqs.consumers.dev.yaml`"
    );
}

#[test]
fn crd_names_match_design() {
    let crd = QueueConsumer::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("queueconsumers.sqs.consumers.dev")
    );
    assert_eq!(crd.spec.names.short_names, Some(vec!["qc".to_string()]));
    assert_eq!(crd.spec.names.categories, Some(vec!["sqs".to_string()]));
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, "v1alpha1");
    assert!(
        v.subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    assert!(
        v.subresources
            .as_ref()
            .and_then(|s| s.scale.as_ref())
            .is_none(),
        "replicas belong to the autoscaler"
    );
    let cols: Vec<_> = v
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        cols,
        ["Ready", "Replicas", "Visible", "InFlight", "DLQ", "Age"]
    );
}
