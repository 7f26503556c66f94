//! An in-memory Kubernetes API server behind `kube::Client`, for reconcile and leader-election tests.
//! It keeps objects with resource versions, generations, field ownership and watch history, and records
//! every request so tests can assert what the controller wrote (verb, field manager, body).
//!
//! Supported: get, list, watch (with replay from a resourceVersion), create, server-side apply (field
//! managers, conflicts, `force`, removal of fields a manager stopped applying), JSON merge patch,
//! strategic merge patch (treated as a merge patch: lists are replaced), JSON patch, the status
//! subresource, delete with finalizers and ownerReference garbage collection, and a few API-server
//! defaults on Deployments (so "nothing changed" must survive defaulting, as on a real cluster), and the
//! CRD's own defaults on QueueConsumers (from its schema, as the API server applies them).
//! `status.conditions` of a QueueConsumer is a list-map keyed by `type`, as in the CRD: server-side apply
//! merges and owns it per condition. Other lists are atomic for field ownership. What the fake still
//! cannot imitate is listed in docs/testing.md; tests/k8s_fake_diff.rs compares it with a real server.
//!
//! Here: the kinds, the recorded requests and the calls tests make to set up and inspect the fake.
//! `routing` serves HTTP (clients, recording, faults, dispatch by path and verb), `store` keeps
//! objects (create, commit, delete and garbage collection, list), `apply` changes them (server-side
//! apply, patches, status), `fields` tracks field ownership, `watch` publishes and streams events,
//! `defaulting` applies the API server's defaults.
#![allow(dead_code)]

mod apply;
pub mod aws;
mod defaulting;
mod fields;
pub mod rbac;
mod routing;
mod store;
mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use serde_json::Value;
use tokio::sync::broadcast;

use fields::Ownership;

type Body = UnsyncBoxBody<Bytes, Infallible>;
type RoutedBody = UnsyncBoxBody<Bytes, tower::BoxError>;
type Path = Vec<String>;

/// The kinds the fake serves.
#[derive(Debug, PartialEq, Eq, Clone, Copy, PartialOrd, Ord, Hash)]
#[allow(clippy::struct_field_names)] // `kind` is the API's own name for it
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub status_subresource: bool,
}

pub const QUEUE_CONSUMERS: Kind = Kind {
    group: "sqs.consumers.dev",
    version: "v1alpha1",
    plural: "queueconsumers",
    kind: "QueueConsumer",
    status_subresource: true,
};
pub const DEPLOYMENTS: Kind = Kind {
    group: "apps",
    version: "v1",
    plural: "deployments",
    kind: "Deployment",
    status_subresource: true,
};
pub const EVENTS: Kind = Kind {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    kind: "Event",
    status_subresource: false,
};
pub const CORE_EVENTS: Kind = Kind {
    group: "",
    version: "v1",
    plural: "events",
    kind: "Event",
    status_subresource: false,
};
pub const LEASES: Kind = Kind {
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    kind: "Lease",
    status_subresource: false,
};
/// Pods: tests create them (as a ReplicaSet would) with the labels, IPs, ports and status they need;
/// controllers list, watch and patch them.
pub const PODS: Kind = Kind {
    group: "",
    version: "v1",
    plural: "pods",
    kind: "Pod",
    status_subresource: true,
};
const KINDS: [Kind; 6] = [
    QUEUE_CONSUMERS,
    DEPLOYMENTS,
    EVENTS,
    CORE_EVENTS,
    LEASES,
    PODS,
];

impl Kind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// One request as the fake received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    pub body: Option<Value>,
    /// The HTTP status the fake answered.
    pub status: u16,
}

impl Recorded {
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
    pub fn is_watch(&self) -> bool {
        matches!(
            self.query.get("watch").map(String::as_str),
            Some("true" | "1")
        )
    }
    pub fn field_manager(&self) -> Option<&str> {
        self.query.get("fieldManager").map(String::as_str)
    }
    pub fn force(&self) -> bool {
        self.query.get("force").map(String::as_str) == Some("true")
    }
    pub fn is_apply(&self) -> bool {
        self.content_type.as_deref() == Some("application/apply-patch+yaml")
    }
    /// True for writes to the `kind` resource (or its subresources).
    pub fn targets(&self, kind: Kind) -> bool {
        let prefix = if kind.group.is_empty() {
            "/api/v1/".to_string()
        } else {
            format!("/apis/{}/{}/", kind.group, kind.version)
        };
        self.path.starts_with(&prefix) && self.path.split('/').any(|s| s == kind.plural)
    }
    pub fn is_status(&self) -> bool {
        self.path.ends_with("/status")
    }
}

/// A planned failure: the next `times` requests matching `method` and `path_contains` get `code`.
#[derive(Clone, Debug)]
struct Fault {
    method: String,
    path_contains: String,
    code: u16,
    reason: String,
    times: u32,
}

#[derive(Clone, Debug)]
struct WatchEntry {
    rv: u64,
    kind: Kind,
    namespace: String,
    event: &'static str,
    object: Value,
}

#[derive(Clone, Debug, Default)]
struct Stored {
    object: Value,
    /// Leaf paths owned by each field manager.
    owners: BTreeMap<String, BTreeSet<Path>>,
}

#[derive(Default)]
struct State {
    rv: u64,
    uid: u64,
    objects: BTreeMap<(Kind, String, String), Stored>,
    history: Vec<WatchEntry>,
    requests: Vec<Recorded>,
    faults: Vec<Fault>,
}

struct Inner {
    state: Mutex<State>,
    events: broadcast::Sender<WatchEntry>,
}

/// The fake API server. Clones share state.
#[derive(Clone)]
pub struct FakeKube {
    inner: Arc<Inner>,
}

impl Default for FakeKube {
    fn default() -> Self {
        Self::new()
    }
}

/// An API error as the fake answers it.
#[derive(Debug)]
struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
}

fn err(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        code,
        reason,
        message: message.into(),
    }
}

impl FakeKube {
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(4096);
        FakeKube {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                events,
            }),
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.state.lock().unwrap().requests.clone()
    }

    /// Non-GET requests, i.e. everything that could change the cluster.
    pub fn writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_write)
            .collect()
    }

    /// The requests so far, leaving none behind (a long run reads them as it goes).
    pub fn take_requests(&self) -> Vec<Recorded> {
        std::mem::take(&mut self.inner.state.lock().unwrap().requests)
    }

    pub fn clear_requests(&self) {
        self.inner.state.lock().unwrap().requests.clear();
    }

    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        let st = self.inner.state.lock().unwrap();
        st.objects
            .get(&(kind, namespace.to_string(), name.to_string()))
            .map(|s| s.object.clone())
    }

    pub fn list(&self, kind: Kind) -> Vec<Value> {
        let st = self.inner.state.lock().unwrap();
        st.objects
            .iter()
            .filter(|((k, _, _), _)| *k == kind)
            .map(|(_, s)| s.object.clone())
            .collect()
    }

    /// Leaf paths (dot-joined) owned by `manager` on an object.
    pub fn owned_fields(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        manager: &str,
    ) -> Vec<String> {
        let st = self.inner.state.lock().unwrap();
        st.objects
            .get(&(kind, namespace.to_string(), name.to_string()))
            .and_then(|s| s.owners.get(manager))
            .map(|paths| paths.iter().map(|p| p.join(".")).collect())
            .unwrap_or_default()
    }

    /// Create an object as a user's `kubectl create` would (manager "kubectl").
    pub fn create(&self, kind: Kind, object: Value) -> Value {
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let mut st = self.inner.state.lock().unwrap();
        st.create(&self.inner.events, kind, &ns, object, "kubectl")
            .unwrap()
    }

    /// Create an object together with its status, as if its controller (the kubelet for a Pod: IP,
    /// conditions, container states) had written it right after: `create` drops the status of kinds
    /// with a status subresource, as the API server does.
    pub fn create_with_status(&self, kind: Kind, object: Value) -> Value {
        let status = object.get("status").cloned();
        let created = self.create(kind, object);
        let Some(status) = status else {
            return created;
        };
        let ns = created["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = created["metadata"]["name"].as_str().unwrap().to_string();
        self.update(kind, &ns, &name, |o| o["status"] = status)
    }

    /// Change an object as another client would (manager "kubectl", or the kind's own controller for
    /// status): `edit` receives the current object and returns the new one.
    pub fn update(
        &self,
        kind: Kind,
        namespace: &str,
        name: &str,
        edit: impl FnOnce(&mut Value),
    ) -> Value {
        let mut st = self.inner.state.lock().unwrap();
        let key = (kind, namespace.to_string(), name.to_string());
        let mut next = st.objects.get(&key).unwrap().object.clone();
        edit(&mut next);
        st.write(
            &self.inner.events,
            kind,
            namespace,
            name,
            next,
            Ownership::Update("kubectl"),
        )
        .unwrap()
    }

    /// Delete as `kubectl delete` would (finalizers hold the object until they are removed).
    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) {
        let mut st = self.inner.state.lock().unwrap();
        st.delete(&self.inner.events, kind, namespace, name)
            .unwrap();
    }

    /// Fail the next `times` requests whose method matches and whose path contains `path_contains`.
    pub fn fail(&self, method: &str, path_contains: &str, code: u16, reason: &str, times: u32) {
        self.inner.state.lock().unwrap().faults.push(Fault {
            method: method.to_string(),
            path_contains: path_contains.to_string(),
            code,
            reason: reason.to_string(),
            times,
        });
    }
}

fn not_found(kind: Kind, name: &str) -> ApiError {
    err(
        404,
        "NotFound",
        format!("{}.{} \"{name}\" not found", kind.plural, kind.group),
    )
}

/// The status condition of `type_` (panics, as a test failure, if the consumer has none).
pub fn condition_of(
    qc: qc::api::QueueConsumer,
    type_: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    qc.status
        .expect("the consumer has a status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}
