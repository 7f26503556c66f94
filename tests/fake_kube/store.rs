//! Objects and their lifecycle: create (uid, timestamps, defaults, the creator's fields), commit of a
//! change (resourceVersion, generation, identity fields kept), delete with finalizers and ownerReference
//! garbage collection, and list with label and field selectors.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::defaulting::{default_deployment, default_lease, default_queue_consumer};
use super::fields::{canonical, leaf_set};
use super::{
    ApiError, DEPLOYMENTS, Kind, LEASES, Path, QUEUE_CONSUMERS, State, Stored, WatchEntry, err,
    not_found,
};

/// RFC 3339 in UTC at second precision, as the API server writes timestamps.
pub(super) fn now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap()
        .to_string()
}

pub(super) fn spec_part(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

/// The `k=v` (or `k==v`) terms of a selector; another form is refused with `unsupported(term)`.
fn selector_terms(
    sel: &str,
    unsupported: impl Fn(&str) -> String,
) -> Result<Vec<(&str, &str)>, ApiError> {
    sel.split(',')
        .map(|term| {
            let (k, v) = term
                .split_once('=')
                .ok_or_else(|| err(400, "BadRequest", unsupported(term)))?;
            Ok((k.trim_end_matches('='), v.trim_start_matches('=')))
        })
        .collect()
}

pub(super) fn matches_selector(
    obj: &Value,
    query: &BTreeMap<String, String>,
) -> Result<bool, ApiError> {
    if let Some(sel) = query.get("labelSelector").filter(|s| !s.is_empty()) {
        let terms = selector_terms(sel, |term| {
            format!("the fake supports only k=v label selectors, not {term:?}")
        })?;
        for (k, v) in terms {
            if obj["metadata"]["labels"][k].as_str() != Some(v) {
                return Ok(false);
            }
        }
    }
    if let Some(sel) = query.get("fieldSelector").filter(|s| !s.is_empty()) {
        for (k, v) in selector_terms(sel, |term| format!("unsupported field selector {term:?}"))? {
            let actual = match k {
                "metadata.name" => obj["metadata"]["name"].as_str(),
                "metadata.namespace" => obj["metadata"]["namespace"].as_str(),
                _ => {
                    return Err(err(
                        400,
                        "BadRequest",
                        format!("unsupported field selector {k}"),
                    ));
                }
            };
            if actual != Some(v) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

impl State {
    pub(super) fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    pub(super) fn create(
        &mut self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: &str,
        mut object: Value,
        manager: &str,
    ) -> Result<Value, ApiError> {
        let name = object["metadata"]["name"]
            .as_str()
            .map(str::to_string)
            .or_else(|| {
                object["metadata"]["generateName"]
                    .as_str()
                    .map(|p| format!("{p}{:05}", self.uid + 1))
            })
            .ok_or_else(|| err(422, "Invalid", "metadata.name: Required value"))?;
        let key = (kind, ns.to_string(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(err(
                409,
                "AlreadyExists",
                format!("{}.{} \"{name}\" already exists", kind.plural, kind.group),
            ));
        }
        if kind.status_subresource
            && let Some(m) = object.as_object_mut()
        {
            m.remove("status");
        }
        self.uid += 1;
        let rv = self.next_rv();
        // Unique across fakes and runs, as real uids are: names derived from them (the DLQ alarm)
        // must not collide between tests sharing one moto server.
        let salt = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let mix = (salt as u64)
            ^ (u64::from(std::process::id()) << 32)
            ^ self.uid.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let uid = format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (mix >> 32) as u32,
            (mix >> 16) as u16,
            (mix >> 4) & 0xfff,
            self.uid & 0xfff,
            self.uid
        );
        let meta = object
            .as_object_mut()
            .ok_or_else(|| err(400, "BadRequest", "object expected"))?
            .entry("metadata")
            .or_insert_with(|| json!({}));
        let m = meta.as_object_mut().unwrap();
        m.insert("name".into(), json!(name));
        m.insert("namespace".into(), json!(ns));
        m.insert("uid".into(), json!(uid));
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        m.insert("generation".into(), json!(1));
        m.insert("creationTimestamp".into(), json!(now()));
        object["apiVersion"] = json!(kind.api_version());
        object["kind"] = json!(kind.kind);
        if kind == DEPLOYMENTS {
            default_deployment(&mut object);
        }
        if kind == QUEUE_CONSUMERS {
            default_queue_consumer(&mut object);
        }
        if kind == LEASES {
            default_lease(&mut object);
        }
        let mut owners = BTreeMap::new();
        owners.insert(manager.to_string(), leaf_set(&canonical(kind, &object)));
        self.objects.insert(
            key,
            Stored {
                object: object.clone(),
                owners,
            },
        );
        self.publish(tx, kind, ns, "ADDED", object.clone());
        Ok(object)
    }

    /// Store `next` if it differs from the live object: bump resourceVersion (and generation when the
    /// spec changed), apply defaults, publish a watch event, finish deletion when finalizers are gone.
    #[allow(clippy::unnecessary_wraps)] // the same Result as every other write path
    pub(super) fn commit(
        &mut self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: &str,
        name: &str,
        mut next: Value,
        owners: BTreeMap<String, BTreeSet<Path>>,
    ) -> Result<Value, ApiError> {
        let key = (kind, ns.to_string(), name.to_string());
        let live = self.objects.get(&key).unwrap().object.clone();
        if kind == DEPLOYMENTS {
            default_deployment(&mut next);
        }
        if kind == QUEUE_CONSUMERS {
            default_queue_consumer(&mut next);
        }
        if kind == LEASES {
            default_lease(&mut next);
        }
        // Identity fields stay the server's.
        for f in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "resourceVersion",
            "generation",
            "deletionTimestamp",
        ] {
            match live["metadata"].get(f) {
                Some(v) => next["metadata"][f] = v.clone(),
                None => {
                    if let Some(m) = next["metadata"].as_object_mut() {
                        m.remove(f);
                    }
                }
            }
        }
        next["apiVersion"] = json!(kind.api_version());
        next["kind"] = json!(kind.kind);
        // An empty list of finalizers is no list (omitempty), as the API server stores it.
        if next["metadata"]["finalizers"]
            .as_array()
            .is_some_and(Vec::is_empty)
            && let Some(m) = next["metadata"].as_object_mut()
        {
            m.remove("finalizers");
        }
        let owners: BTreeMap<_, _> = owners.into_iter().filter(|(_, p)| !p.is_empty()).collect();
        if next == live {
            self.objects.get_mut(&key).unwrap().owners = owners;
            return Ok(live);
        }
        let rv = self.next_rv();
        next["metadata"]["resourceVersion"] = json!(rv.to_string());
        if spec_part(&next) != spec_part(&live) {
            let g = live["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            next["metadata"]["generation"] = json!(g);
        }
        let finished = next["metadata"].get("deletionTimestamp").is_some()
            && next["metadata"]["finalizers"]
                .as_array()
                .is_none_or(Vec::is_empty);
        if finished {
            // The API server deletes instead of storing the update: the DELETED event carries the
            // object as last stored, the writer gets the update's result.
            self.remove(tx, kind, ns, name);
            return Ok(next);
        }
        self.objects.insert(
            key,
            Stored {
                object: next.clone(),
                owners,
            },
        );
        self.publish(tx, kind, ns, "MODIFIED", next.clone());
        Ok(next)
    }

    /// A foreground deletion (`propagationPolicy: Foreground`), as the API server and the garbage collector
    /// carry it out: the object is marked (deletionTimestamp, the `foregroundDeletion` finalizer) and that is
    /// the answer; then its dependents are deleted and the finalizer removed, which removes the object
    /// unless other finalizers hold it. The fake does the collector's part at once.
    pub(super) fn delete_foreground(
        &mut self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        const FOREGROUND: &str = "foregroundDeletion";
        let key = (kind, ns.to_string(), name.to_string());
        let stored = self
            .objects
            .get(&key)
            .ok_or_else(|| not_found(kind, name))?
            .clone();
        if stored.object["metadata"].get("deletionTimestamp").is_some() {
            return Ok(stored.object);
        }
        let mut marked = stored.object.clone();
        let mut finalizers: Vec<Value> = marked["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        finalizers.push(json!(FOREGROUND));
        marked["metadata"]["finalizers"] = json!(finalizers);
        marked["metadata"]["deletionTimestamp"] = json!(now());
        marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        let g = marked["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        marked["metadata"]["generation"] = json!(g);
        marked["metadata"]["resourceVersion"] = json!(self.next_rv().to_string());
        self.objects.get_mut(&key).unwrap().object = marked.clone();
        self.publish(tx, kind, ns, "MODIFIED", marked.clone());
        // The collector: dependents first, then the owner's finalizer.
        let uid = marked["metadata"]["uid"].clone();
        for (k, d_ns, d_name) in self.dependents_of(&uid) {
            let _ = self.delete(tx, k, &d_ns, &d_name);
        }
        let mut next = marked.clone();
        finalizers.retain(|f| f != FOREGROUND);
        if finalizers.is_empty() {
            self.remove(tx, kind, ns, name);
        } else {
            next["metadata"]["finalizers"] = json!(finalizers);
            next["metadata"]["resourceVersion"] = json!(self.next_rv().to_string());
            self.objects.get_mut(&key).unwrap().object = next.clone();
            self.publish(tx, kind, ns, "MODIFIED", next);
        }
        Ok(marked)
    }

    /// What names `uid` in its ownerReferences.
    fn dependents_of(&self, uid: &Value) -> Vec<(Kind, String, String)> {
        self.objects
            .iter()
            .filter(|(_, s)| {
                s.object["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| &r["uid"] == uid))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    pub(super) fn delete(
        &mut self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let key = (kind, ns.to_string(), name.to_string());
        let stored = self
            .objects
            .get(&key)
            .ok_or_else(|| not_found(kind, name))?
            .clone();
        let has_finalizers = stored.object["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if stored.object["metadata"].get("deletionTimestamp").is_some() {
                return Ok(stored.object);
            }
            let rv = self.next_rv();
            let mut next = stored.object.clone();
            next["metadata"]["deletionTimestamp"] = json!(now());
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            // As the API server does when it marks an object for deletion.
            let g = next["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            next["metadata"]["generation"] = json!(g);
            next["metadata"]["resourceVersion"] = json!(rv.to_string());
            self.objects.get_mut(&key).unwrap().object = next.clone();
            self.publish(tx, kind, ns, "MODIFIED", next.clone());
            Ok(next)
        } else {
            Ok(self.remove(tx, kind, ns, name))
        }
    }

    /// Remove an object for good and garbage-collect what it owns.
    pub(super) fn remove(
        &mut self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> Value {
        let key = (kind, ns.to_string(), name.to_string());
        let Some(stored) = self.objects.remove(&key) else {
            return Value::Null;
        };
        let rv = self.next_rv();
        let mut gone = stored.object;
        gone["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.publish(tx, kind, ns, "DELETED", gone.clone());
        let uid = gone["metadata"]["uid"].clone();
        for (k, ns, name) in self.dependents_of(&uid) {
            let _ = self.delete(tx, k, &ns, &name);
        }
        gone
    }

    pub(super) fn list(
        &self,
        kind: Kind,
        ns: Option<&str>,
        query: &BTreeMap<String, String>,
    ) -> Result<Value, ApiError> {
        // Keys sort by kind, then namespace: read only that kind's (and namespace's) range, so a list
        // costs what it returns, as in the API server, not the whole store.
        let start = (kind, ns.unwrap_or_default().to_string(), String::new());
        let mut items = Vec::new();
        for ((k, o_ns, _), s) in self.objects.range(start..) {
            if *k != kind || ns.is_some_and(|n| n != o_ns) {
                break;
            }
            if matches_selector(&s.object, query)? {
                items.push(s.object.clone());
            }
        }
        Ok(json!({
            "apiVersion": kind.api_version(),
            "kind": format!("{}List", kind.kind),
            "metadata": {"resourceVersion": self.rv.to_string()},
            "items": items,
        }))
    }
}
