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
        [
            "Ready",
            "Reason",
            "Replicas",
            "Visible",
            "InFlight",
            "DLQ",
            "Suspended",
            "Age"
        ]
    );
}

/// Every property under `node`, as (dotted path, schema), depth first.
fn properties<'a>(
    node: &'a serde_json::Value,
    path: &str,
    out: &mut Vec<(String, &'a serde_json::Value)>,
) {
    if let Some(props) = node.get("properties").and_then(|p| p.as_object()) {
        for (name, schema) in props {
            let p = format!("{path}.{name}");
            out.push((p.clone(), schema));
            properties(schema, &p, out);
        }
    }
    if let Some(items) = node.get("items") {
        properties(items, &format!("{path}[]"), out);
    }
}

/// `kubectl explain queueconsumer --recursive` must show no `<no description>`: every property says
/// what it does; a property with a default names it; a duration says it is one (its format).
#[test]
fn every_property_explains_itself() {
    let crd = serde_json::to_value(qc::api::crd()).expect("crd serializes");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut props = Vec::new();
    properties(schema, "", &mut props);
    assert!(props.len() > 60, "walked only {} properties", props.len());
    let mut missing = Vec::new();
    let mut durations = 0;
    for (path, s) in &props {
        let description = s.get("description").and_then(|d| d.as_str()).unwrap_or("");
        if description.trim().len() < 8 {
            missing.push(format!("{path}: no description"));
            continue;
        }
        if path.starts_with(".spec")
            && s.get("default").is_some()
            && !description.contains("Default")
        {
            missing.push(format!(
                "{path}: has a default the description does not name"
            ));
        }
        // A duration field carries the rule that checks its grammar.
        let duration_rule = format!(
            "self.matches('{}')",
            qc::api::DURATION_PATTERN.replace('\\', "\\\\")
        );
        let is_duration = s["x-kubernetes-validations"][0]["rule"] == duration_rule.as_str();
        durations += usize::from(is_duration);
        if is_duration && !description.contains("duration") {
            missing.push(format!(
                "{path}: a duration whose description does not say so"
            ));
        }
        if description.starts_with("Time is a wrapper") {
            missing.push(format!(
                "{path}: the Go type's description, not the field's"
            ));
        }
    }
    assert!(durations > 15, "found only {durations} duration fields");
    assert!(
        missing.is_empty(),
        "properties without a proper description (add a doc comment to the field in src/api):\n{}",
        missing.join("\n")
    );
}

/// #34 item 3: the status's condition list describes every condition type the controller sets
/// (each constant of `api::conditions` before its reasons), so `kubectl explain` lists them all.
#[test]
fn the_conditions_description_names_every_condition_type() {
    let source = include_str!("../src/api/conditions.rs");
    let types_part = source.split("pub mod reason").next().unwrap();
    let types: Vec<&str> = types_part
        .lines()
        .filter_map(|l| l.strip_prefix("pub const "))
        .filter_map(|l| l.split('"').nth(1))
        .collect();
    assert!(types.len() >= 9, "{types:?}");
    let crd = serde_json::to_value(QueueConsumer::crd()).unwrap();
    let description = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        ["status"]["properties"]["conditions"]["description"]
        .as_str()
        .unwrap()
        .to_string();
    for t in types {
        assert!(
            description.contains(t),
            "the conditions' description lacks {t}: {description}"
        );
    }
}
