//! Writes to existing objects: server-side apply (field managers, conflicts, `force`, removal of
//! fields a manager stopped sending), JSON merge patch, JSON patch, the status subresource, and the
//! ownership moves of a plain update.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::fields::{
    Ownership, at, canonical, changed_paths, conflict_message, leaf_set, listed, merge, related,
    remove_at,
};
use super::{ApiError, Kind, Path, State, WatchEntry, err, not_found};

impl State {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn patch(
        &mut self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: &str,
        name: &str,
        status: bool,
        content_type: Option<&str>,
        query: &BTreeMap<String, String>,
        body: Value,
    ) -> Result<Value, ApiError> {
        let key = (kind, ns.to_string(), name.to_string());
        let manager = query.get("fieldManager").cloned();
        let exists = self.objects.contains_key(&key);
        match content_type {
            Some("application/apply-patch+yaml") => {
                let manager = manager.ok_or_else(|| {
                    err(400, "BadRequest", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch")
                })?;
                let force = query.get("force").map(String::as_str) == Some("true");
                if body["metadata"]["name"].as_str().is_some_and(|n| n != name) {
                    return Err(err(
                        400,
                        "BadRequest",
                        "metadata.name must match the request path",
                    ));
                }
                let mut applied = body.clone();
                if kind.status_subresource {
                    scope_to(&mut applied, status);
                }
                if !exists {
                    if status {
                        return Err(not_found(kind, name));
                    }
                    let mut object = applied.clone();
                    object["metadata"]["name"] = json!(name);
                    let created = self.create(tx, kind, ns, object, &manager)?;
                    // The applier owns what it sent, not what the server defaulted.
                    let stored = self.objects.get_mut(&key).unwrap();
                    stored
                        .owners
                        .insert(manager.clone(), leaf_set(&canonical(kind, &applied)));
                    return Ok(created);
                }
                let stored = self.objects.get(&key).unwrap();
                check_precondition(&stored.object, &body)?;
                let live_listed = stored.object.clone();
                let sent_listed = applied.clone();
                let live = canonical(kind, &live_listed);
                let applied = canonical(kind, &applied);
                let sent = leaf_set(&applied);
                let mut owners = stored.owners.clone();
                let mut conflicts: Vec<(String, Path)> = Vec::new();
                for (other, paths) in &mut owners {
                    if *other == manager {
                        continue;
                    }
                    // An empty map sent is structure, not a value: it never conflicts by itself.
                    let clashing: Vec<Path> = paths
                        .iter()
                        .filter(|o| {
                            sent.iter().any(|s| {
                                // Owning a map (as an empty one created) is owning its existence,
                                // not its keys: an apply of a key under it is no conflict, as on the
                                // API server.
                                let under_a_map = s.len() > o.len()
                                    && s.starts_with(o)
                                    && at(&live, o).is_some_and(Value::is_object);
                                !under_a_map
                                    && related(s, o)
                                    && !at(&applied, s)
                                        .is_some_and(|v| v.as_object().is_some_and(Map::is_empty))
                                    && at(&live, s) != at(&applied, s)
                            })
                        })
                        .cloned()
                        .collect();
                    if force {
                        for p in clashing {
                            paths.remove(&p);
                        }
                    } else {
                        conflicts.extend(clashing.into_iter().map(|p| (other.clone(), p)));
                    }
                }
                if !conflicts.is_empty() {
                    return Err(err(409, "Conflict", conflict_message(&conflicts)));
                }
                let mut next = live.clone();
                // Fields this manager applied before and no longer sends are removed unless another
                // manager still owns them. Only within what this apply can write: the API server keeps
                // a manager's entries per subresource, so an apply to /status never removes the
                // finalizers its manager patched on the main resource (and the reverse).
                let in_scope = |p: &Path| {
                    !kind.status_subresource
                        || (p.first().map(String::as_str) == Some("status")) == status
                };
                let before = owners.get(&manager).cloned().unwrap_or_default();
                let (before, out_of_scope): (BTreeSet<Path>, BTreeSet<Path>) =
                    before.into_iter().partition(|p| in_scope(p));
                for p in before
                    .iter()
                    .filter(|p| !sent.iter().any(|s| related(s, p)))
                {
                    let kept = owners
                        .iter()
                        .any(|(m, paths)| *m != manager && paths.iter().any(|o| related(o, p)));
                    if !kept {
                        remove_at(&mut next, p);
                    }
                }
                merge(&mut next, &applied);
                owners.insert(
                    manager.clone(),
                    sent.into_iter().chain(out_of_scope).collect(),
                );
                let next = listed(kind, next, &live_listed, &sent_listed);
                self.commit(tx, kind, ns, name, next, owners)
            }
            Some("application/merge-patch+json" | "application/strategic-merge-patch+json") => {
                let stored = self
                    .objects
                    .get(&key)
                    .ok_or_else(|| not_found(kind, name))?;
                check_precondition(&stored.object, &body)?;
                let mut patch = body;
                if kind.status_subresource {
                    scope_to(&mut patch, status);
                }
                let mut next = stored.object.clone();
                merge(&mut next, &patch);
                let manager = manager.unwrap_or_else(|| "unknown".into());
                self.write(tx, kind, ns, name, next, Ownership::Update(&manager))
            }
            Some("application/json-patch+json") => {
                let stored = self
                    .objects
                    .get(&key)
                    .ok_or_else(|| not_found(kind, name))?;
                // As the API server's JSON-patch library does, a `test` for null passes on a
                // missing path (kube's finalizer helper relies on it).
                let body = match body {
                    Value::Array(ops) => Value::Array(
                        ops.into_iter()
                            .filter(|op| {
                                !(op["op"] == "test"
                                    && op["value"].is_null()
                                    && op["path"]
                                        .as_str()
                                        .is_some_and(|p| stored.object.pointer(p).is_none()))
                            })
                            .collect(),
                    ),
                    other => other,
                };
                let ops: json_patch::Patch = serde_json::from_value(body)
                    .map_err(|e| err(400, "BadRequest", format!("invalid json patch: {e}")))?;
                let mut next = stored.object.clone();
                json_patch::patch(&mut next, &ops)
                    .map_err(|e| err(422, "Invalid", format!("json patch failed: {e}")))?;
                if kind.status_subresource {
                    let mut scoped = stored.object.clone();
                    let take = |v: &Value, k: &str| v.get(k).cloned();
                    if status {
                        match take(&next, "status") {
                            Some(s) => scoped["status"] = s,
                            None => {
                                scoped.as_object_mut().unwrap().remove("status");
                            }
                        }
                    } else {
                        let live_status = take(&stored.object, "status");
                        scoped = next;
                        match live_status {
                            Some(s) => scoped["status"] = s,
                            None => {
                                scoped.as_object_mut().unwrap().remove("status");
                            }
                        }
                    }
                    next = scoped;
                }
                let manager = manager.unwrap_or_else(|| "unknown".into());
                self.write(tx, kind, ns, name, next, Ownership::Update(&manager))
            }
            other => Err(err(
                415,
                "UnsupportedMediaType",
                format!("the fake does not support patch content type {other:?}"),
            )),
        }
    }

    /// Replace an object with `next`, moving ownership as the kind of write implies.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write(
        &mut self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: &str,
        name: &str,
        next: Value,
        ownership: Ownership<'_>,
    ) -> Result<Value, ApiError> {
        let key = (kind, ns.to_string(), name.to_string());
        let stored = self
            .objects
            .get(&key)
            .ok_or_else(|| not_found(kind, name))?;
        let mut owners = stored.owners.clone();
        match ownership {
            Ownership::Update(manager) => {
                let changed =
                    changed_paths(&canonical(kind, &stored.object), &canonical(kind, &next));
                for paths in owners.values_mut() {
                    paths.retain(|p| !changed.iter().any(|c| related(c, p)));
                }
                let mine = owners.entry(manager.to_string()).or_default();
                let next_canonical = canonical(kind, &next);
                for c in changed {
                    if at(&next_canonical, &c).is_some() {
                        mine.insert(c);
                    }
                }
            }
        }
        self.commit(tx, kind, ns, name, next, owners)
    }
}

/// A write to the main resource of a kind with a status subresource ignores status; a write to
/// `/status` changes only status.
pub(super) fn scope_to(v: &mut Value, status: bool) {
    let Some(m) = v.as_object_mut() else { return };
    if status {
        m.retain(|k, _| matches!(k.as_str(), "status" | "apiVersion" | "kind" | "metadata"));
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.retain(|k, _| matches!(k.as_str(), "name" | "namespace" | "resourceVersion"));
        }
    } else {
        m.remove("status");
    }
}

/// Optimistic concurrency: a resourceVersion in the body must match the live one.
pub(super) fn check_precondition(live: &Value, body: &Value) -> Result<(), ApiError> {
    match body["metadata"]["resourceVersion"].as_str() {
        Some(rv) if Some(rv) != live["metadata"]["resourceVersion"].as_str() => Err(err(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and try again",
        )),
        _ => Ok(()),
    }
}
