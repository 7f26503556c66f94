//! The controller's spans (#46 item 1, docs/controller.md "Tracing"): a reconcile against the
//! in-memory Kubernetes API exports one `qc.reconcile` trace with a child per step to an OTLP/HTTP
//! receiver started by the test; a ratio of 0 exports nothing.

mod common;
mod fake_kube;
#[path = "common/otlp.rs"]
mod otlp;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::fixture::consumer;
use fake_kube::aws::{NoAlarms, context};
use fake_kube::{FakeKube, QUEUE_CONSUMERS};
use qc::api::QueueConsumer;
use qc::aws::StaticReader;
use qc::telemetry::otlp::{Otlp, Root, Sampling, Settings};

const URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders";
const NS: &str = "shop";

async fn reconcile_traced(sampling: Sampling) -> Vec<otlp::Exported> {
    let receiver = otlp::Receiver::start().await;
    let fake = FakeKube::new();
    let reader = StaticReader::new().with_queue(
        URL,
        HashMap::from([
            ("VisibilityTimeout", "60"),
            ("ApproximateNumberOfMessages", "3"),
            ("ApproximateNumberOfMessagesNotVisible", "0"),
        ]),
    );
    let mut ctx = context(&fake, Arc::new(reader), Arc::new(NoAlarms), Some("test"));
    let pipeline = Otlp::start(Settings {
        traces_url: format!("{}/v1/traces", receiver.url),
        sampling,
        service_name: "qc-operator".into(),
        timeout: Duration::from_secs(5),
    })
    .unwrap();
    Arc::get_mut(&mut ctx).unwrap().tracer = Some(pipeline.tracer());
    fake.create(
        QUEUE_CONSUMERS,
        consumer("orders")
            .namespace(NS)
            .queue_url(URL)
            .http(8080, "/messages")
            .image("shop/orders:1")
            .alarm(false)
            .json(),
    );
    let qc: QueueConsumer =
        serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, "orders").unwrap()).unwrap();
    qc::controller::reconcile(Arc::new(qc), ctx.clone())
        .await
        .unwrap();
    // Flushes what the batch holds.
    pipeline.shutdown().await;
    receiver.spans()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_is_one_trace_with_a_span_per_step() {
    let spans = reconcile_traced(Sampling::ParentBased(Root::AlwaysOn)).await;
    let roots: Vec<_> = spans.iter().filter(|s| s.name == "qc.reconcile").collect();
    assert_eq!(roots.len(), 1, "{spans:#?}");
    let root = roots[0];
    assert_eq!(root.parent_span_id, "");
    assert_eq!(root.service, "qc-operator");
    assert_eq!(root.attr("k8s.namespace.name"), Some(NS));
    assert_eq!(root.attr("qc.queueconsumer"), Some("orders"));
    assert_eq!(root.status.0, 0, "a reconcile that succeeded: {root:?}");
    let mut steps: Vec<&str> = spans
        .iter()
        .filter(|s| s.parent_span_id == root.span_id)
        .map(|s| {
            assert_eq!(s.trace_id, root.trace_id);
            assert!(
                root.start_ns <= s.start_ns && s.end_ns <= root.end_ns,
                "{s:?}"
            );
            s.name.as_str()
        })
        .collect();
    steps.sort_unstable();
    // The steps this reconcile runs: AWS clients, the queue read, the queue's settings (manage
    // off), the worker pods, the Deployment's apply and scale, the redrive step, the status write.
    // The alarm is off: its step returns at once without a call, still a span.
    assert_eq!(
        steps,
        [
            "qc.alarm",
            "qc.apply",
            "qc.aws_clients",
            "qc.manage",
            "qc.observe",
            "qc.read_workers",
            "qc.redrive",
            "qc.scale",
            "qc.write_status",
        ],
        "{spans:#?}"
    );
    assert_eq!(spans.len(), steps.len() + 1, "nothing else: {spans:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ratio_of_zero_exports_no_reconcile() {
    let spans = reconcile_traced(Sampling::ParentBased(Root::Ratio(0.0))).await;
    assert!(spans.is_empty(), "{spans:#?}");
}
