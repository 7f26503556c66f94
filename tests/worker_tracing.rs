//! Spans of the worker (#46 item 1, docs/worker.md "Tracing") against moto, with a real `qc-worker`
//! exporting over OTLP/HTTP to a receiver started by the test (`common/otlp.rs`): one trace per
//! message, `qc.message` with `qc.wait`, `qc.handle` and the settle under it, the producer's context
//! continued, the handler's traceparent the `qc.handle` span's, and a ratio of 0 exporting nothing.

#[path = "common/mod.rs"]
mod common;
#[path = "common/otlp.rs"]
mod otlp;
#[path = "worker/support.rs"]
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use otlp::{Exported as Span, Receiver};
use support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;
const XRAY: &str = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
/// OTLP SpanKind numbers.
const CONSUMER: i32 = 5;
const CLIENT: i32 = 3;
const STATUS_ERROR: i32 = 2;

/// Sends one message with an optional `AWSTraceHeader` and string attributes; returns its id.
async fn send_traced(
    q: &TestQueue,
    body: &str,
    xray: Option<&str>,
    attrs: &[(&str, &str)],
) -> String {
    use aws_sdk_sqs::types::{
        MessageAttributeValue, MessageSystemAttributeNameForSends, MessageSystemAttributeValue,
    };
    let mut req = q.client.send_message().queue_url(&q.url).message_body(body);
    if let Some(x) = xray {
        req = req.message_system_attributes(
            MessageSystemAttributeNameForSends::AwsTraceHeader,
            MessageSystemAttributeValue::builder()
                .data_type("String")
                .string_value(x)
                .build()
                .unwrap(),
        );
    }
    for (k, v) in attrs {
        req = req.message_attributes(
            *k,
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(*v)
                .build()
                .unwrap(),
        );
    }
    req.send().await.unwrap().message_id.unwrap()
}

fn start_traced(q: &TestQueue, h: &HttpHandler, env: &[(&str, &str)]) -> Worker {
    let a = q.args(&[
        "--http-url",
        &h.url,
        "--on-poison",
        "dead-letter",
        "--retry-base",
        "1s",
    ]);
    Worker::start_with_env(Arc::new(tempfile::tempdir().unwrap()), &a, env)
}

/// The `qc.message` spans of a message id, in receive order.
fn deliveries<'a>(spans: &'a [Span], id: &str) -> Vec<&'a Span> {
    let mut d: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "qc.message" && s.attr("messaging.message.id") == Some(id))
        .collect();
    d.sort_by_key(|s| s.attr("qc.receive_count").unwrap().parse::<u32>().unwrap());
    d
}

/// The children of `parent`, by name (each name at most once).
fn children<'a>(spans: &'a [Span], parent: &Span) -> HashMap<&'a str, &'a Span> {
    let mut by_name = HashMap::new();
    for s in spans.iter().filter(|s| s.parent_span_id == parent.span_id) {
        assert_eq!(
            s.trace_id, parent.trace_id,
            "a child in another trace: {s:?}"
        );
        assert!(
            by_name.insert(s.name.as_str(), s).is_none(),
            "two {} spans under one qc.message: {spans:#?}",
            s.name
        );
    }
    by_name
}

fn names<'a>(c: &HashMap<&'a str, &'a Span>) -> Vec<&'a str> {
    let mut n: Vec<&str> = c.keys().copied().collect();
    n.sort_unstable();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_message_is_one_trace_of_wait_handle_and_settle_continuing_the_producers() {
    let q = TestQueue::new("trace-spans", 30, 5, false).await;
    let receiver = Receiver::start().await;
    let ok = send_traced(&q, "ok", None, &[]).await;
    let produced = send_traced(&q, "produced", None, &[("traceparent", TRACEPARENT)]).await;
    let xray = send_traced(&q, "xray", Some(XRAY), &[]).await;
    let poison = send_traced(&q, "poison", None, &[]).await;
    let retried = send_traced(&q, "retry", None, &[]).await;
    let h = HttpHandler::start(|c| match (c.body.as_slice(), c.receive_count) {
        (b"poison", _) => Reply::status(422),
        (b"retry", 1) => Reply::status(500),
        _ => Reply::ok(Duration::from_millis(20)),
    })
    .await;
    let mut w = start_traced(
        &q,
        &h,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    eventually(SECS(60), "all settled", || async {
        q.is_empty().await && q.dlq_visible().await == 1
    })
    .await;
    // Every delete sent (the poison one's after its DLQ copy): the last may still be in its batch.
    w.wait_deleted(5, SECS(10)).await;
    w.stop().await;
    let spans = receiver.spans();
    assert!(
        spans.iter().all(|s| s.service == "qc-worker"),
        "service.name: {spans:#?}"
    );
    let queue_name = q.url.rsplit('/').next().unwrap();
    let calls: HashMap<String, Vec<Call>> =
        h.calls().into_iter().fold(HashMap::new(), |mut m, c| {
            m.entry(c.id.clone()).or_default().push(c);
            m
        });

    // A message without a producer's context: its own trace, from its id.
    let d = deliveries(&spans, &ok);
    assert_eq!(d.len(), 1, "{spans:#?}");
    let m = d[0];
    assert_eq!(
        m.trace_id,
        qc::worker::spans::message_trace_id(&ok).to_string()
    );
    assert_eq!(m.parent_span_id, "", "a root span");
    assert_eq!(m.kind, CONSUMER);
    assert_eq!(m.attr("messaging.system"), Some("aws_sqs"));
    assert_eq!(m.attr("messaging.destination.name"), Some(queue_name));
    assert_eq!(m.attr("messaging.operation.type"), Some("process"));
    assert_eq!(m.attr("qc.receive_count"), Some("1"));
    assert_eq!(m.attr("qc.outcome"), Some("delete"));
    // The time in the queue before the receipt, where the span starts: sent before the worker began.
    let queued = |s: &Span| -> i64 {
        s.attr("qc.queue_time_ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("qc.queue_time_ms on {s:?}"))
    };
    assert!((0..60_000).contains(&queued(m)), "{m:?}");
    let c = children(&spans, m);
    assert_eq!(
        names(&c),
        ["qc.delete", "qc.handle", "qc.wait"],
        "{spans:#?}"
    );
    let handle = c["qc.handle"];
    assert_eq!(handle.kind, CLIENT);
    assert_eq!(handle.attr("qc.verdict"), Some("success"));
    assert_eq!(
        c["qc.delete"].attr("messaging.operation.type"),
        Some("settle")
    );
    for child in c.values() {
        assert!(
            m.start_ns <= child.start_ns
                && child.end_ns <= m.end_ns
                && child.start_ns <= child.end_ns,
            "a child outside qc.message: {child:?} in {m:?}"
        );
    }
    assert!(
        c["qc.wait"].end_ns <= handle.start_ns,
        "the wait ends before the call"
    );
    assert!(
        handle.end_ns <= c["qc.delete"].start_ns,
        "the call ends before the delete"
    );
    // The handler's traceparent is the qc.handle span: its own spans nest under it.
    assert_eq!(
        calls[&ok][0].headers.get("traceparent").map(String::as_str),
        Some(format!("00-{}-{}-01", m.trace_id, handle.span_id).as_str())
    );

    // A traceparent attribute: the producer's span is the parent, in the producer's trace.
    let d = deliveries(&spans, &produced);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(d[0].parent_span_id, "b7ad6b7169203331");
    let handle = children(&spans, d[0])["qc.handle"];
    assert_eq!(
        calls[&produced][0]
            .headers
            .get("traceparent")
            .map(String::as_str),
        Some(format!("00-0af7651916cd43dd8448eb211c80319c-{}-01", handle.span_id).as_str())
    );
    // An X-Ray header, converted.
    let d = deliveries(&spans, &xray);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].trace_id, "5759e988bd862e3fe1be46a994272793");
    assert_eq!(d[0].parent_span_id, "53995c3f42cd8ad8");
    assert_eq!(
        calls[&xray][0]
            .headers
            .get("x-amzn-trace-id")
            .map(String::as_str),
        Some(XRAY),
        "the X-Ray header still goes to the handler as it came"
    );

    // Poison: the call's verdict and the dead-letter.
    let d = deliveries(&spans, &poison);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].attr("qc.outcome"), Some("dead_letter"));
    let c = children(&spans, d[0]);
    assert_eq!(names(&c), ["qc.dead_letter", "qc.handle", "qc.wait"]);
    assert_eq!(c["qc.handle"].attr("qc.verdict"), Some("poison"));
    assert_eq!(c["qc.handle"].status.0, STATUS_ERROR);
    assert_eq!(c["qc.dead_letter"].status.0, 0, "the DLQ took it");

    // A retry: two deliveries, one trace; the first set the visibility to the backoff.
    let d = deliveries(&spans, &retried);
    assert_eq!(d.len(), 2, "{spans:#?}");
    assert_eq!(
        d[0].trace_id, d[1].trace_id,
        "every delivery in the message's trace"
    );
    assert_eq!(
        d[0].trace_id,
        qc::worker::spans::message_trace_id(&retried).to_string()
    );
    assert_eq!(d[0].attr("qc.outcome"), Some("retry"));
    let first = children(&spans, d[0]);
    assert_eq!(names(&first), ["qc.handle", "qc.retry", "qc.wait"]);
    assert_eq!(first["qc.handle"].attr("qc.verdict"), Some("transient"));
    assert_eq!(first["qc.retry"].attr("qc.visibility_timeout_s"), Some("1"));
    assert_eq!(d[1].attr("qc.receive_count"), Some("2"));
    // The redelivery's time in the queue counts from the send: it holds the first delivery and its
    // 1 s backoff (less a little for the clocks' milliseconds).
    assert!(
        queued(d[1]) >= queued(d[0]) + 900,
        "{:?} then {:?}",
        d[0],
        d[1]
    );
    assert_eq!(d[1].attr("qc.outcome"), Some("delete"));
    assert_eq!(
        names(&children(&spans, d[1])),
        ["qc.delete", "qc.handle", "qc.wait"]
    );

    // Nothing else: 6 deliveries of 4 spans.
    assert_eq!(spans.len(), 6 * 4, "{spans:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampling_ratio_of_zero_exports_nothing_and_tells_the_handler_so() {
    let q = TestQueue::new("trace-ratio0", 30, 5, false).await;
    let receiver = Receiver::start().await;
    let bodies = numbered(10);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w = start_traced(
        &q,
        &h,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    w.wait_deleted(10, SECS(60)).await;
    w.stop().await;
    assert!(receiver.spans().is_empty(), "{:#?}", receiver.spans());
    // Tracing was on: each handler call carried the message's trace, marked not sampled.
    let calls = h.calls();
    assert_eq!(calls.len(), 10);
    for c in calls {
        let tp = c.headers.get("traceparent").expect("a traceparent");
        let trace = qc::worker::spans::message_trace_id(&c.id).to_string();
        assert!(
            tp.starts_with(&format!("00-{trace}-")) && tp.ends_with("-00"),
            "{tp}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_sampler_setting_stops_the_worker_naming_the_variable() {
    let q = TestQueue::new("trace-bad", 30, 5, false).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w = start_traced(
        &q,
        &h,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "5%"),
        ],
    );
    let status = w.wait_exit(SECS(20)).await;
    assert_eq!(status.code(), Some(2), "{}", w.log_text());
    let log = w.log_text();
    assert!(
        log.contains("OTEL_TRACES_SAMPLER_ARG") && log.contains("from 0 to 1"),
        "{log}"
    );
}

/// Batch mode: one handler call for several messages, still one trace per message, each with its
/// own `qc.handle` span, whose context is the traceparent of that message's event in the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_gives_each_message_its_trace_and_its_item_the_handle_span() {
    let q = TestQueue::new("trace-batch", 30, 5, false).await;
    let receiver = Receiver::start().await;
    let bodies = numbered(3);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::answer(Duration::from_millis(20), "{}")).await;
    let a = q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "3",
        "--batch-max-wait",
        "500ms",
    ]);
    let mut w = Worker::start_with_env(
        Arc::new(tempfile::tempdir().unwrap()),
        &a,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url)],
    );
    w.wait_deleted(3, SECS(60)).await;
    w.stop().await;
    let spans = receiver.spans();
    let events: Vec<serde_json::Value> = h
        .calls()
        .iter()
        .flat_map(|c| {
            serde_json::from_slice::<serde_json::Value>(&c.body)
                .unwrap()
                .as_array()
                .unwrap()
                .clone()
        })
        .collect();
    assert_eq!(events.len(), 3, "{events:#?}");
    for e in &events {
        let id = e["id"].as_str().unwrap();
        let d = deliveries(&spans, id);
        assert_eq!(d.len(), 1, "{spans:#?}");
        assert_eq!(
            d[0].trace_id,
            qc::worker::spans::message_trace_id(id).to_string()
        );
        let c = children(&spans, d[0]);
        assert_eq!(
            names(&c),
            ["qc.delete", "qc.handle", "qc.wait"],
            "{spans:#?}"
        );
        assert_eq!(c["qc.handle"].attr("qc.verdict"), Some("success"));
        assert_eq!(
            e["traceparent"].as_str(),
            Some(format!("00-{}-{}-01", d[0].trace_id, c["qc.handle"].span_id).as_str())
        );
    }
    assert_eq!(spans.len(), 3 * 4, "{spans:#?}");
}
