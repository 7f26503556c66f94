//! Apply: when the rendered Deployment differs from the live one, and only then. Server-side apply
//! with field manager `qc-operator`, forced; a fingerprint annotation catches fields removed from the spec.
//! The scaler's own apply (`qc-operator-scaler`) carries `spec.replicas` and nothing else.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::Value;

use crate::api::quantity;

/// Field manager of everything the controller applies.
pub const FIELD_MANAGER: &str = "qc-operator";
/// Field manager of the scaler's writes: `spec.replicas` of the Deployment, nothing else, so the two
/// managers never own each other's fields and neither apply undoes the other.
pub const SCALER_FIELD_MANAGER: &str = "qc-operator-scaler";
/// Hash of the rendered Deployment, so a field dropped from the spec (which a "live contains desired"
/// check cannot see) still triggers an apply.
pub const RENDERED_HASH: &str = "sqs.consumers.dev/rendered-hash";

/// What the apply step wrote: the Deployment was absent, or it differed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Created,
    /// `new_template`: the pod template changed, so the Deployment controller rolls out new pods (a
    /// change of labels, annotations or other Deployment fields alone replaces no pod).
    Updated {
        new_template: bool,
    },
}

impl Applied {
    /// The verb of the `DeploymentCreated` / `DeploymentUpdated` Event.
    pub fn verb(self) -> &'static str {
        match self {
            Applied::Created => "Created",
            Applied::Updated { .. } => "Updated",
        }
    }

    /// What the apply of `written` over `before` (both as the API server returned them, defaults
    /// included, so their templates compare field by field) was.
    pub fn of(before: Option<&Deployment>, written: &Deployment) -> Applied {
        match before {
            None => Applied::Created,
            Some(b) => Applied::Updated {
                new_template: b.spec.template != written.spec.template,
            },
        }
    }
}

/// The rendered Deployment with its fingerprint annotation.
pub fn with_fingerprint(mut d: Deployment) -> Deployment {
    if let Some(a) = d.metadata.annotations.as_mut() {
        a.remove(RENDERED_HASH);
        if a.is_empty() {
            d.metadata.annotations = None;
        }
    }
    let hash = fingerprint(&d);
    d.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(RENDERED_HASH.to_string(), hash);
    d
}

/// FNV-1a over the canonical JSON (serde_json maps are sorted): stable across builds and releases,
/// unlike the standard library's hasher.
fn fingerprint(d: &Deployment) -> String {
    let bytes = serde_json::to_vec(d).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// True when `desired` (with fingerprint) must be applied over `live`: absent, a different
/// fingerprint (the spec changed), or a field of ours changed by someone else. Fields the API server
/// defaulted or other managers own (replicas) are extra in `live` and do not count.
pub fn needs_apply(desired: &Deployment, live: Option<&Deployment>) -> bool {
    let Some(live) = live else {
        return true;
    };
    let hash = |d: &Deployment| {
        d.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RENDERED_HASH))
            .cloned()
    };
    if hash(desired) != hash(live) {
        return true;
    }
    match (serde_json::to_value(desired), serde_json::to_value(live)) {
        (Ok(d), Ok(l)) => !contains(&l, &d),
        _ => true,
    }
}

/// The scaler's apply body: identity and `spec.replicas` only (an apply owns exactly what it sends).
pub fn replicas_patch(name: &str, replicas: u32) -> Value {
    serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas},
    })
}

/// `outer` holds every field of `inner` with the same value (lists element by element). Quantities
/// (resource requests and limits, `sizeLimit`) compare by value: the API server stores `0.5` as
/// `500m` and `1.5Gi` as `1536Mi`, and a textual comparison would re-apply every poll.
fn contains(outer: &Value, inner: &Value) -> bool {
    contains_at(outer, inner, false)
}

fn contains_at(outer: &Value, inner: &Value, quantity: bool) -> bool {
    match (outer, inner) {
        (Value::Object(o), Value::Object(i)) => i.iter().all(|(k, v)| {
            // The values of ResourceRequirements' maps and the pod's overhead, and emptyDir's
            // sizeLimit, are quantities.
            let q =
                quantity || matches!(k.as_str(), "limits" | "requests" | "overhead" | "sizeLimit");
            o.get(k).is_some_and(|ov| contains_at(ov, v, q))
        }),
        (Value::Array(o), Value::Array(i)) => {
            o.len() == i.len() && o.iter().zip(i).all(|(ov, iv)| contains_at(ov, iv, false))
        }
        (Value::String(o), Value::String(i)) if quantity && o != i => {
            matches!((quantity::value(o), quantity::value(i)), (Some(a), Some(b)) if a == b)
        }
        (o, i) => o == i,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dep(v: Value) -> Deployment {
        serde_json::from_value(v).unwrap()
    }

    fn base() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "n"},
            "spec": {"selector": {"matchLabels": {"a": "b"}},
                "template": {"spec": {"containers": [{"name": "c", "image": "i",
                    "env": [{"name": "A", "value": "1"}]}]}}}})
    }

    #[test]
    fn defaulted_live_object_needs_no_apply() {
        let desired = with_fingerprint(dep(base()));
        let mut live = serde_json::to_value(&desired).unwrap();
        live["spec"]["replicas"] = json!(3);
        live["metadata"]["resourceVersion"] = json!("7");
        live["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] =
            json!("IfNotPresent");
        assert!(!needs_apply(&desired, Some(&dep(live))));
    }

    #[test]
    fn drift_removal_and_absence_need_apply() {
        let desired = with_fingerprint(dep(base()));
        assert!(needs_apply(&desired, None));
        let mut drifted = serde_json::to_value(&desired).unwrap();
        drifted["spec"]["template"]["spec"]["containers"][0]["image"] = json!("other");
        assert!(needs_apply(&desired, Some(&dep(drifted))));
        // The spec dropped env A: live still contains everything desired, but the hash differs.
        let mut smaller = base();
        smaller["spec"]["template"]["spec"]["containers"][0]
            .as_object_mut()
            .unwrap()
            .remove("env");
        let desired_smaller = with_fingerprint(dep(smaller));
        assert!(needs_apply(&desired_smaller, Some(&desired)));
    }

    #[test]
    fn replicas_patch_carries_only_replicas() {
        let p = replicas_patch("orders", 4);
        assert_eq!(
            p,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "orders"}, "spec": {"replicas": 4}})
        );
    }

    #[test]
    fn normalised_quantities_need_no_apply_but_changed_ones_do() {
        let mut v = base();
        v["spec"]["template"]["spec"]["containers"][0]["resources"] =
            json!({"requests": {"cpu": "0.5", "memory": "1.5Gi"}, "limits": {"memory": "2Gi"}});
        v["spec"]["template"]["spec"]["volumes"] =
            json!([{"name": "tmp", "emptyDir": {"sizeLimit": "1024Mi"}}]);
        let desired = with_fingerprint(dep(v));
        let mut live = serde_json::to_value(&desired).unwrap();
        let c = &mut live["spec"]["template"]["spec"]["containers"][0];
        c["resources"]["requests"] = json!({"cpu": "500m", "memory": "1536Mi"});
        live["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = json!("1Gi");
        assert!(!needs_apply(&desired, Some(&dep(live.clone()))));
        live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] =
            json!("3Gi");
        assert!(
            needs_apply(&desired, Some(&dep(live.clone()))),
            "a real change"
        );
        // Not a quantity field: text must match exactly.
        live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] =
            json!("2Gi");
        live["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("1.0");
        assert!(
            needs_apply(&desired, Some(&dep(live))),
            "env values are text"
        );
    }

    #[test]
    fn fingerprint_is_stable_and_ignores_itself() {
        let a = with_fingerprint(dep(base()));
        let b = with_fingerprint(a.clone());
        assert_eq!(a, b);
    }
}
