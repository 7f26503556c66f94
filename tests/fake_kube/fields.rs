//! Field ownership for server-side apply: leaf paths of an object, who owns which, what a write
//! changed, conflict messages as the API server words them, and list-maps (`status.conditions`) kept
//! per item by turning them into maps and back.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::{Kind, Path, QUEUE_CONSUMERS};

/// How a write changes field ownership: any write other than apply gives the writer the fields it
/// changed (apply is handled in `patch`, where the applier owns exactly what it sent).
pub(super) enum Ownership<'a> {
    Update(&'a str),
}

/// Fields nobody owns: identity and bookkeeping the server maintains.
pub(super) fn untracked(path: &[String]) -> bool {
    matches!(
        path.first().map(String::as_str),
        Some("apiVersion" | "kind")
    ) || (path.first().map(String::as_str) == Some("metadata")
        && matches!(
            path.get(1).map(String::as_str),
            Some(
                "name"
                    | "namespace"
                    | "uid"
                    | "resourceVersion"
                    | "generation"
                    | "creationTimestamp"
                    | "deletionTimestamp"
                    | "deletionGracePeriodSeconds"
                    | "managedFields"
            )
        ))
}

pub(super) fn leaves(v: &Value, prefix: &mut Path, out: &mut BTreeSet<Path>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                prefix.push(k.clone());
                leaves(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            if !prefix.is_empty() && !untracked(prefix) {
                out.insert(prefix.clone());
            }
        }
    }
}

pub(super) fn leaf_set(v: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    leaves(v, &mut Vec::new(), &mut out);
    out
}

pub(super) fn at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(k))
}

pub(super) fn remove_at(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    if let Some(m) = at_mut(v, parents).and_then(Value::as_object_mut) {
        m.remove(last);
    }
    // Drop maps the removal left empty, as a server does for fields no manager keeps.
    prune_empty(v, parents);
}

pub(super) fn prune_empty(v: &mut Value, path: &[String]) {
    for depth in (1..=path.len()).rev() {
        let (parent_path, key) = (&path[..depth - 1], &path[depth - 1]);
        let Some(parent) = at_mut(v, parent_path) else {
            return;
        };
        let empty = parent
            .get(key)
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty);
        if empty {
            if let Some(m) = parent.as_object_mut() {
                m.remove(key);
            }
        } else {
            return;
        }
    }
}

pub(super) fn at_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |cur, k| cur.get_mut(k))
}

/// RFC 7386 JSON merge patch (also the merge step of apply: maps merge, everything else replaces).
pub(super) fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

pub(super) fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Paths whose value differs between two objects (leaves of either side).
pub(super) fn changed_paths(old: &Value, new: &Value) -> BTreeSet<Path> {
    leaf_set(old)
        .union(&leaf_set(new))
        .filter(|p| at(old, p) != at(new, p))
        .cloned()
        .collect()
}

/// A field path as the API server prints it: `.spec.x`, list-map items as `[type="Ready"]`.
pub(super) fn field_path(p: &[String]) -> String {
    let mut out = String::new();
    for seg in p {
        if let Some(key) = seg
            .strip_prefix("k:")
            .and_then(|k| serde_json::from_str::<Map<String, Value>>(k).ok())
        {
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", parts.join(",")));
        } else {
            out.push('.');
            out.push_str(seg);
        }
    }
    out
}

/// The API server's conflict message (without its note of the other manager's operation and
/// subresource, which the fake does not keep apart).
pub(super) fn conflict_message(conflicts: &[(String, Path)]) -> String {
    if let [(manager, path)] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with \"{manager}\": {}",
            field_path(path)
        );
    }
    let mut by_manager: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (manager, path) in conflicts {
        by_manager
            .entry(manager)
            .or_default()
            .push(field_path(path));
    }
    let mut lines = Vec::new();
    for (manager, paths) in by_manager {
        lines.push(format!("conflicts with \"{manager}\":"));
        lines.extend(paths.into_iter().map(|p| format!("- {p}")));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Lists a kind declares `x-kubernetes-list-type: map`, with their key: server-side apply merges them
/// item by item and owns fields per item.
pub(super) fn list_maps(kind: Kind) -> &'static [(&'static [&'static str], &'static str)] {
    if kind == QUEUE_CONSUMERS {
        &[(&["status", "conditions"], "type")]
    } else {
        &[]
    }
}

/// The path segment of one list-map item, as managedFields spell it: `k:{"type":"Ready"}`.
pub(super) fn item_key(key: &str, value: &Value) -> String {
    format!("k:{}", json!({ key: value }))
}

/// The object with each list-map turned into a map from item key to item, so ownership, conflicts,
/// removal and merge work per item with the map logic. Lists with an item lacking its key stay atomic.
pub(super) fn canonical(kind: Kind, v: &Value) -> Value {
    let mut v = v.clone();
    for (path, key) in list_maps(kind) {
        let path: Path = path.iter().map(std::string::ToString::to_string).collect();
        let Some(slot) = at_mut(&mut v, &path) else {
            continue;
        };
        let Some(items) = slot.as_array() else {
            continue;
        };
        if items.iter().any(|i| i.get(*key).is_none()) {
            continue;
        }
        let map: Map<String, Value> = items
            .iter()
            .map(|i| (item_key(key, &i[*key]), i.clone()))
            .collect();
        *slot = Value::Object(map);
    }
    v
}

/// Back from `canonical`: items already in `live` keep their place, new ones follow in the order the
/// request sent them (as the API server's merge orders them).
pub(super) fn listed(kind: Kind, mut v: Value, live: &Value, sent: &Value) -> Value {
    for (path, key) in list_maps(kind) {
        let path: Path = path.iter().map(std::string::ToString::to_string).collect();
        let Some(slot) = at_mut(&mut v, &path) else {
            continue;
        };
        let Some(map) = slot.as_object_mut() else {
            continue;
        };
        let order = |src: &Value| -> Vec<String> {
            at(src, &path)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|i| i.get(*key).map(|k| item_key(key, k)))
                .collect()
        };
        let mut items = Vec::new();
        for k in order(live).into_iter().chain(order(sent)) {
            if let Some(item) = map.remove(&k) {
                items.push(item);
            }
        }
        items.extend(std::mem::take(map).into_values());
        *slot = Value::Array(items);
    }
    v
}
