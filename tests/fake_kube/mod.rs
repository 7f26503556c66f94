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
#![allow(dead_code)]

pub mod aws;
pub mod rbac;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

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

/// Paths a routed client sends to the real server: the QueueConsumer API and the CRD API. Everything
/// else (core, apps, events, coordination) stays with this fake: the CRD server does not serve them.
pub fn routes_to_real(path: &str) -> bool {
    path == "/apis/sqs.consumers.dev"
        || path.starts_with("/apis/sqs.consumers.dev/")
        || path.starts_with("/apis/apiextensions.k8s.io/")
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

    /// A client whose every request is served by this fake.
    pub fn client(&self) -> kube::Client {
        let fake = self.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let fake = fake.clone();
            async move { Ok::<_, Infallible>(fake.serve(req).await) }
        });
        kube::Client::new(service, "default")
    }

    /// A client that sends the QueueConsumer API (`sqs.consumers.dev`, and `apiextensions.k8s.io`
    /// for its CRD) to `real`, a real Kubernetes API server, and everything else (Deployments, Events,
    /// Leases) to this fake: one tower service dispatching by path. Requests to either side are
    /// recorded alike, so `requests()` and `writes()` see all of the controller's traffic.
    pub fn routed_client(&self, real: kube::Client) -> kube::Client {
        let fake = self.clone();
        let service = tower::service_fn(move |req: Request<kube::client::Body>| {
            let fake = fake.clone();
            let real = real.clone();
            async move {
                if routes_to_real(req.uri().path()) {
                    fake.forward(&real, req).await
                } else {
                    let (parts, body) = fake.serve(req).await.into_parts();
                    let body = body.map_err(|never| match never {}).boxed_unsync();
                    Ok(Response::from_parts(parts, body))
                }
            }
        });
        kube::Client::new(service, "default")
    }

    /// Send one request to the real server and record it as `serve` records the fake's.
    async fn forward(
        &self,
        real: &kube::Client,
        req: Request<kube::client::Body>,
    ) -> Result<Response<RoutedBody>, tower::BoxError> {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await?;
        let mut record = Recorded {
            method: parts.method.as_str().to_string(),
            path: parts.uri.path().to_string(),
            query: parts
                .uri
                .query()
                .map(|q| form_urlencoded_pairs(q).into_iter().collect())
                .unwrap_or_default(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body: (!bytes.is_empty()).then(|| {
                serde_json::from_slice(&bytes)
                    .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
            }),
            status: 0,
        };
        let response = real
            .send(Request::from_parts(
                parts,
                kube::client::Body::from(bytes.to_vec()),
            ))
            .await?;
        record.status = response.status().as_u16();
        self.inner.state.lock().unwrap().requests.push(record);
        let (parts, body) = response.into_parts();
        Ok(Response::from_parts(
            parts,
            body.map_err(tower::BoxError::from).boxed_unsync(),
        ))
    }

    // ---- inspection and setup used by tests (not recorded as requests) ----

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

    // ---- the API server ----

    async fn serve(&self, req: Request<kube::client::Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let method = parts.method.as_str().to_string();
        let path = parts.uri.path().to_string();
        let query: BTreeMap<String, String> = parts
            .uri
            .query()
            .map(|q| {
                form_urlencoded_pairs(q)
                    .into_iter()
                    .collect::<BTreeMap<_, _>>()
            })
            .unwrap_or_default();
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body_value: Option<Value> = if bytes.is_empty() {
            None
        } else {
            Some(
                serde_json::from_slice(&bytes)
                    .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned())),
            )
        };
        let mut record = Recorded {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            content_type: content_type.clone(),
            body: body_value.clone(),
            status: 0,
        };
        let result = self.handle(&method, &path, &query, content_type.as_deref(), body_value);
        let response = match result {
            Ok(Reply::Json(code, v)) => {
                record.status = code;
                json_response(code, &v)
            }
            Ok(Reply::Watch(stream)) => {
                record.status = 200;
                let body =
                    StreamBody::new(stream.map(|b| Ok::<_, Infallible>(http_body::Frame::data(b))));
                Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(BodyExt::boxed_unsync(body))
                    .unwrap()
            }
            Err(e) => {
                record.status = e.code;
                json_response(
                    e.code,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": e.message, "reason": e.reason, "code": e.code}),
                )
            }
        };
        self.inner.state.lock().unwrap().requests.push(record);
        response
    }

    fn handle(
        &self,
        method: &str,
        path: &str,
        query: &BTreeMap<String, String>,
        content_type: Option<&str>,
        body: Option<Value>,
    ) -> Result<Reply, ApiError> {
        let mut st = self.inner.state.lock().unwrap();
        if let Some(f) = st
            .faults
            .iter_mut()
            .find(|f| f.times > 0 && f.method == method && path.contains(&f.path_contains))
        {
            f.times -= 1;
            let reason: &'static str = Box::leak(f.reason.clone().into_boxed_str());
            return Err(err(f.code, reason, format!("injected {reason}")));
        }
        let route =
            route(path).ok_or_else(|| err(404, "NotFound", format!("no route for {path}")))?;
        let events = &self.inner.events;
        match (method, route.name.as_deref()) {
            ("GET", None) => {
                if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) {
                    let stream = st.watch(events, route.kind, route.namespace.as_deref(), query)?;
                    Ok(Reply::Watch(stream))
                } else {
                    Ok(Reply::Json(
                        200,
                        st.list(route.kind, route.namespace.as_deref(), query)?,
                    ))
                }
            }
            ("GET", Some(name)) => {
                let ns = route.namespace.clone().unwrap_or_default();
                st.objects
                    .get(&(route.kind, ns, name.to_string()))
                    .map(|s| Reply::Json(200, s.object.clone()))
                    .ok_or_else(|| not_found(route.kind, name))
            }
            ("POST", None) => {
                let ns = route
                    .namespace
                    .clone()
                    .ok_or_else(|| err(405, "MethodNotAllowed", "create needs a namespace"))?;
                let body = body.ok_or_else(|| err(400, "BadRequest", "empty body"))?;
                let manager = query
                    .get("fieldManager")
                    .cloned()
                    .unwrap_or_else(|| "unknown".into());
                st.create(events, route.kind, &ns, body, &manager)
                    .map(|o| Reply::Json(201, o))
            }
            ("PATCH", Some(name)) => {
                let ns = route
                    .namespace
                    .clone()
                    .ok_or_else(|| err(405, "MethodNotAllowed", "patch needs a namespace"))?;
                let body = body.ok_or_else(|| err(400, "BadRequest", "empty patch"))?;
                // Apply creates a missing object and answers 201, as the API server does.
                let existed = st
                    .objects
                    .contains_key(&(route.kind, ns.clone(), name.to_string()));
                st.patch(
                    events,
                    route.kind,
                    &ns,
                    name,
                    route.status,
                    content_type,
                    query,
                    body,
                )
                .map(|o| Reply::Json(if existed { 200 } else { 201 }, o))
            }
            ("DELETE", Some(name)) => {
                let ns = route.namespace.clone().unwrap_or_default();
                st.delete(events, route.kind, &ns, name)
                    .map(|o| Reply::Json(200, o))
            }
            _ => Err(err(
                405,
                "MethodNotAllowed",
                format!("{method} {path} is not supported by the fake"),
            )),
        }
    }
}

enum Reply {
    Json(u16, Value),
    Watch(futures::stream::BoxStream<'static, Bytes>),
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(BodyExt::boxed_unsync(Full::new(Bytes::from(
            serde_json::to_vec(v).unwrap(),
        ))))
        .unwrap()
}

fn not_found(kind: Kind, name: &str) -> ApiError {
    err(
        404,
        "NotFound",
        format!("{}.{} \"{name}\" not found", kind.plural, kind.group),
    )
}

fn form_urlencoded_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                if let Ok(b) = u8::from_str_radix(hex, 16) {
                    out.push(b);
                    i += 3;
                } else {
                    out.push(b'%');
                    i += 1;
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Route {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn route(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, plural, name, sub) = match rest {
        [plural] => (None, *plural, None, None),
        ["namespaces", ns, plural] => (Some(*ns), *plural, None, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name), None),
        ["namespaces", ns, plural, name, sub] => (Some(*ns), *plural, Some(*name), Some(*sub)),
        _ => return None,
    };
    let kind = *KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)?;
    let status = match sub {
        None => false,
        Some("status") if kind.status_subresource => true,
        Some(_) => return None,
    };
    Some(Route {
        kind,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        status,
    })
}

/// How a write changes field ownership: any write other than apply gives the writer the fields it
/// changed (apply is handled in `patch`, where the applier owns exactly what it sent).
enum Ownership<'a> {
    Update(&'a str),
}

/// Fields nobody owns: identity and bookkeeping the server maintains.
fn untracked(path: &[String]) -> bool {
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

fn leaves(v: &Value, prefix: &mut Path, out: &mut BTreeSet<Path>) {
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

fn leaf_set(v: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    leaves(v, &mut Vec::new(), &mut out);
    out
}

fn at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| cur.get(k))
}

fn remove_at(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    if let Some(m) = at_mut(v, parents).and_then(Value::as_object_mut) {
        m.remove(last);
    }
    // Drop maps the removal left empty, as a server does for fields no manager keeps.
    prune_empty(v, parents);
}

fn prune_empty(v: &mut Value, path: &[String]) {
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

fn at_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |cur, k| cur.get_mut(k))
}

/// RFC 7386 JSON merge patch (also the merge step of apply: maps merge, everything else replaces).
fn merge(target: &mut Value, patch: &Value) {
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

fn related(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Paths whose value differs between two objects (leaves of either side).
fn changed_paths(old: &Value, new: &Value) -> BTreeSet<Path> {
    leaf_set(old)
        .union(&leaf_set(new))
        .filter(|p| at(old, p) != at(new, p))
        .cloned()
        .collect()
}

/// A field path as the API server prints it: `.spec.x`, list-map items as `[type="Ready"]`.
fn field_path(p: &[String]) -> String {
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
fn conflict_message(conflicts: &[(String, Path)]) -> String {
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

/// RFC 3339 in UTC at second precision, as the API server writes timestamps.
fn now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap()
        .to_string()
}

/// Lists a kind declares `x-kubernetes-list-type: map`, with their key: server-side apply merges them
/// item by item and owns fields per item.
fn list_maps(kind: Kind) -> &'static [(&'static [&'static str], &'static str)] {
    if kind == QUEUE_CONSUMERS {
        &[(&["status", "conditions"], "type")]
    } else {
        &[]
    }
}

/// The path segment of one list-map item, as managedFields spell it: `k:{"type":"Ready"}`.
fn item_key(key: &str, value: &Value) -> String {
    format!("k:{}", json!({ key: value }))
}

/// The object with each list-map turned into a map from item key to item, so ownership, conflicts,
/// removal and merge work per item with the map logic. Lists with an item lacking its key stay atomic.
fn canonical(kind: Kind, v: &Value) -> Value {
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
fn listed(kind: Kind, mut v: Value, live: &Value, sent: &Value) -> Value {
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

/// The CRD's structural defaults, applied as the API server applies them on every write: a missing
/// property with a `default` gets it, then defaulting goes on inside.
fn default_from_schema(schema: &Value, v: &mut Value) {
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

fn default_queue_consumer(obj: &mut Value) {
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
fn default_deployment(obj: &mut Value) {
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

fn spec_part(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

fn matches_selector(obj: &Value, query: &BTreeMap<String, String>) -> Result<bool, ApiError> {
    if let Some(sel) = query.get("labelSelector").filter(|s| !s.is_empty()) {
        for term in sel.split(',') {
            let (k, v) = term.split_once('=').ok_or_else(|| {
                err(
                    400,
                    "BadRequest",
                    format!("the fake supports only k=v label selectors, not {term:?}"),
                )
            })?;
            let (k, v) = (k.trim_end_matches('='), v.trim_start_matches('='));
            if obj["metadata"]["labels"][k].as_str() != Some(v) {
                return Ok(false);
            }
        }
    }
    if let Some(sel) = query.get("fieldSelector").filter(|s| !s.is_empty()) {
        for term in sel.split(',') {
            let (k, v) = term.split_once('=').ok_or_else(|| {
                err(
                    400,
                    "BadRequest",
                    format!("unsupported field selector {term:?}"),
                )
            })?;
            let (k, v) = (k.trim_end_matches('='), v.trim_start_matches('='));
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
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn publish(
        &mut self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: &str,
        event: &'static str,
        object: Value,
    ) {
        let entry = WatchEntry {
            rv: self.rv,
            kind,
            namespace: ns.to_string(),
            event,
            object,
        };
        self.history.push(entry.clone());
        let _ = tx.send(entry);
    }

    fn create(
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

    #[allow(clippy::too_many_arguments)]
    fn patch(
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
                                related(s, o)
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
                // manager still owns them.
                let before = owners.get(&manager).cloned().unwrap_or_default();
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
                owners.insert(manager.clone(), sent);
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
    fn write(
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

    /// Store `next` if it differs from the live object: bump resourceVersion (and generation when the
    /// spec changed), apply defaults, publish a watch event, finish deletion when finalizers are gone.
    #[allow(clippy::unnecessary_wraps)] // the same Result as every other write path
    fn commit(
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

    fn delete(
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
    fn remove(
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
        let dependents: Vec<(Kind, String, String)> = self
            .objects
            .iter()
            .filter(|(_, s)| {
                s.object["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for (k, ns, name) in dependents {
            let _ = self.delete(tx, k, &ns, &name);
        }
        gone
    }

    fn list(
        &self,
        kind: Kind,
        ns: Option<&str>,
        query: &BTreeMap<String, String>,
    ) -> Result<Value, ApiError> {
        let mut items = Vec::new();
        for ((k, o_ns, _), s) in &self.objects {
            if *k == kind && ns.is_none_or(|n| n == o_ns) && matches_selector(&s.object, query)? {
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

    fn watch(
        &self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: Option<&str>,
        query: &BTreeMap<String, String>,
    ) -> Result<futures::stream::BoxStream<'static, Bytes>, ApiError> {
        matches_selector(&json!({}), query)?;
        let since: Option<u64> = query
            .get("resourceVersion")
            .filter(|v| !v.is_empty() && *v != "0")
            .map(|v| {
                v.parse()
                    .map_err(|_| err(400, "BadRequest", format!("bad resourceVersion {v}")))
            })
            .transpose()?;
        let mut initial: VecDeque<Value> = VecDeque::new();
        let wanted = |e: &WatchEntry| e.kind == kind && ns.is_none_or(|n| n == e.namespace);
        match since {
            Some(rv) => {
                for e in self.history.iter().filter(|e| e.rv > rv && wanted(e)) {
                    if matches_selector(&e.object, query)? {
                        initial.push_back(json!({"type": e.event, "object": e.object}));
                    }
                }
            }
            None => {
                for ((k, o_ns, _), s) in &self.objects {
                    if *k == kind
                        && ns.is_none_or(|n| n == o_ns)
                        && matches_selector(&s.object, query)?
                    {
                        initial.push_back(json!({"type": "ADDED", "object": s.object}));
                    }
                }
            }
        }
        let rx = tx.subscribe();
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(300);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let ns = ns.map(str::to_string);
        let query = query.clone();
        let stream = futures::stream::unfold((initial, rx), move |(mut initial, mut rx)| {
            let ns = ns.clone();
            let query = query.clone();
            async move {
                if let Some(v) = initial.pop_front() {
                    return Some((line(&v), (initial, rx)));
                }
                loop {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => return None,
                        got = rx.recv() => match got {
                            Ok(e) => {
                                if e.kind == kind
                                    && ns.as_deref().is_none_or(|n| n == e.namespace)
                                    && matches_selector(&e.object, &query).unwrap_or(false)
                                {
                                    let v = json!({"type": e.event, "object": e.object});
                                    return Some((line(&v), (initial, rx)));
                                }
                            }
                            // Lagged or closed: end the watch; the client relists.
                            Err(_) => return None,
                        }
                    }
                }
            }
        });
        Ok(stream.boxed())
    }
}

fn line(v: &Value) -> Bytes {
    let mut b = serde_json::to_vec(v).unwrap();
    b.push(b'\n');
    Bytes::from(b)
}

/// A write to the main resource of a kind with a status subresource ignores status; a write to
/// `/status` changes only status.
fn scope_to(v: &mut Value, status: bool) {
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
fn check_precondition(live: &Value, body: &Value) -> Result<(), ApiError> {
    match body["metadata"]["resourceVersion"].as_str() {
        Some(rv) if Some(rv) != live["metadata"]["resourceVersion"].as_str() => Err(err(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and try again",
        )),
        _ => Ok(()),
    }
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
