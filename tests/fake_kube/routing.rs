//! The HTTP side of the fake: the clients (all to the fake, or the QueueConsumer API routed to a real
//! server), request recording, planned faults, and dispatch of each request by path and verb.

use std::collections::BTreeMap;
use std::convert::Infallible;

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Value, json};

use super::{ApiError, Body, FakeKube, KINDS, Kind, Recorded, RoutedBody, err, not_found};

/// Paths a routed client sends to the real server: the QueueConsumer API and the CRD API. Everything
/// else (core, apps, events, coordination) stays with this fake: the CRD server does not serve them.
pub(super) fn routes_to_real(path: &str) -> bool {
    path == "/apis/sqs.consumers.dev"
        || path.starts_with("/apis/sqs.consumers.dev/")
        || path.starts_with("/apis/apiextensions.k8s.io/")
}

impl FakeKube {
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
    pub(super) async fn forward(
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

    pub async fn serve(&self, req: Request<kube::client::Body>) -> Response<Body> {
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

    pub(super) fn handle(
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
                let foreground = body
                    .as_ref()
                    .is_some_and(|b| b["propagationPolicy"] == "Foreground");
                if foreground {
                    st.delete_foreground(events, route.kind, &ns, name)
                } else {
                    st.delete(events, route.kind, &ns, name)
                }
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

pub(super) enum Reply {
    Json(u16, Value),
    Watch(futures::stream::BoxStream<'static, Bytes>),
}

pub(super) fn json_response(code: u16, v: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(BodyExt::boxed_unsync(Full::new(Bytes::from(
            serde_json::to_vec(v).unwrap(),
        ))))
        .unwrap()
}

pub(super) fn form_urlencoded_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

pub(super) fn percent_decode(s: &str) -> String {
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

pub(super) struct Route {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

pub(super) fn route(path: &str) -> Option<Route> {
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
