//! An OTLP/HTTP receiver for the tracing tests and the worker bench: takes `POST /v1/traces`
//! (protobuf, as the exporters send it), decodes it with the OpenTelemetry protocol's own types and
//! keeps every span, flattened. No collector binary ships in the registries here: this is the part of
//! one the tests need, a real HTTP server on a loopback port.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;

/// One span as received.
#[derive(Clone, Debug)]
pub struct Exported {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// The protocol's SpanKind number (1 internal, 2 server, 3 client, 4 producer, 5 consumer).
    pub kind: i32,
    pub attributes: HashMap<String, String>,
    /// The protocol's status code (0 unset, 1 ok, 2 error) and message.
    pub status: (i32, String),
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Exported {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Clone, Default)]
pub struct Receiver {
    pub url: String,
    spans: Arc<Mutex<Vec<Exported>>>,
    requests: Arc<Mutex<u64>>,
}

impl Receiver {
    pub async fn start() -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = Receiver {
            url: format!("http://{}", listener.local_addr().unwrap()),
            ..Receiver::default()
        };
        let server = r.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let server = server.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let server = server.clone();
                        async move { Ok::<_, Infallible>(server.serve(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        r
    }

    async fn serve(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let answer = |status: StatusCode| {
            let mut resp = Response::new(Full::new(Bytes::new()));
            *resp.status_mut() = status;
            resp.headers_mut()
                .insert("content-type", "application/x-protobuf".parse().unwrap());
            resp
        };
        if req.method() != hyper::Method::POST || req.uri().path() != "/v1/traces" {
            return answer(StatusCode::NOT_FOUND);
        }
        let protobuf = req
            .headers()
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/x-protobuf"));
        let body = req.into_body().collect().await.unwrap().to_bytes();
        if !protobuf {
            return answer(StatusCode::UNSUPPORTED_MEDIA_TYPE);
        }
        let Ok(export) = ExportTraceServiceRequest::decode(body) else {
            return answer(StatusCode::BAD_REQUEST);
        };
        let mut got = Vec::new();
        for rs in export.resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                .and_then(|a| a.value.as_ref())
                .map(|v| text(v.value.as_ref()))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Exported {
                        service: service.clone(),
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: hex(&s.parent_span_id),
                        name: s.name,
                        kind: s.kind,
                        attributes: s
                            .attributes
                            .iter()
                            .map(|a| {
                                (
                                    a.key.clone(),
                                    text(a.value.as_ref().and_then(|v| v.value.as_ref())),
                                )
                            })
                            .collect(),
                        status: s.status.map(|st| (st.code, st.message)).unwrap_or_default(),
                        start_ns: s.start_time_unix_nano,
                        end_ns: s.end_time_unix_nano,
                    });
                }
            }
        }
        self.spans.lock().unwrap().extend(got);
        *self.requests.lock().unwrap() += 1;
        answer(StatusCode::OK)
    }

    pub fn spans(&self) -> Vec<Exported> {
        self.spans.lock().unwrap().clone()
    }

    /// Export requests answered.
    pub fn requests(&self) -> u64 {
        *self.requests.lock().unwrap()
    }

    pub fn clear(&self) {
        self.spans.lock().unwrap().clear();
    }
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
