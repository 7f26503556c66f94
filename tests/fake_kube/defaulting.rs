//! Defaults the API server applies on every write: the CRD's structural defaults on QueueConsumers
//! (from its schema) and the built-in defaults of the Deployment fields the controller renders.

use serde_json::{Value, json};

/// The CRD's structural defaults, applied as the API server applies them on every write: a missing
/// property with a `default` gets it, then defaulting goes on inside.
pub(super) fn default_from_schema(schema: &Value, v: &mut Value) {
    match v {
        Value::Object(m) => {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                return;
            };
            for (k, prop) in props {
                if !m.contains_key(k)
                    && let Some(d) = prop.get("default")
                {
                    m.insert(k.clone(), d.clone());
                }
                if let Some(child) = m.get_mut(k) {
                    default_from_schema(prop, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for i in items {
                    default_from_schema(item_schema, i);
                }
            }
        }
        _ => {}
    }
}

pub(super) fn default_queue_consumer(obj: &mut Value) {
    use kube::CustomResourceExt;
    static SCHEMA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    let schema = SCHEMA.get_or_init(|| {
        let crd = qc::api::QueueConsumer::crd();
        serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref()),
        )
        .unwrap()
    });
    default_from_schema(schema, obj);
}

/// The API server's defaults for the Deployment fields the controller renders.
pub(super) fn default_deployment(obj: &mut Value) {
    let spec = obj
        .as_object_mut()
        .unwrap()
        .entry("spec")
        .or_insert_with(|| json!({}));
    let s = spec.as_object_mut().unwrap();
    s.entry("replicas").or_insert(json!(1));
    s.entry("revisionHistoryLimit").or_insert(json!(10));
    s.entry("progressDeadlineSeconds").or_insert(json!(600));
    s.entry("strategy")
        .or_insert(json!({"type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}));
    let Some(pod) = s
        .get_mut("template")
        .and_then(|t| t.get_mut("spec"))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    pod.entry("restartPolicy").or_insert(json!("Always"));
    pod.entry("dnsPolicy").or_insert(json!("ClusterFirst"));
    pod.entry("schedulerName")
        .or_insert(json!("default-scheduler"));
    pod.entry("securityContext").or_insert(json!({}));
    for list in ["containers", "initContainers"] {
        for c in pod
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Some(c) = c.as_object_mut() else { continue };
            c.entry("imagePullPolicy").or_insert(json!("IfNotPresent"));
            c.entry("terminationMessagePath")
                .or_insert(json!("/dev/termination-log"));
            c.entry("terminationMessagePolicy").or_insert(json!("File"));
            // A struct, not a pointer, in the API's Go types: always there, empty or not.
            c.entry("resources").or_insert(json!({}));
            for e in c
                .get_mut("env")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(f) = e
                    .pointer_mut("/valueFrom/fieldRef")
                    .and_then(Value::as_object_mut)
                {
                    f.entry("apiVersion").or_insert(json!("v1"));
                }
            }
            for p in c
                .get_mut("ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(p) = p.as_object_mut() {
                    p.entry("protocol").or_insert(json!("TCP"));
                }
            }
            for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                if let Some(p) = c.get_mut(probe).and_then(Value::as_object_mut) {
                    p.entry("successThreshold").or_insert(json!(1));
                    p.entry("timeoutSeconds").or_insert(json!(1));
                    p.entry("periodSeconds").or_insert(json!(10));
                    p.entry("failureThreshold").or_insert(json!(3));
                    if let Some(h) = p.get_mut("httpGet").and_then(Value::as_object_mut) {
                        h.entry("scheme").or_insert(json!("HTTP"));
                    }
                }
            }
        }
    }
}

/// The Lease's spec is a struct in the API's Go types: a Lease created without one reads back with `{}`.
pub(super) fn default_lease(obj: &mut Value) {
    if let Some(o) = obj.as_object_mut() {
        o.entry("spec").or_insert(json!({}));
    }
}
