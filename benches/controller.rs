//! What one reconcile costs: CPU time of the pure steps, and wall time and API requests of whole
//! reconciles against the in-memory Kubernetes API with an in-memory queue reader.
//! `cargo bench --bench controller` prints a table; under `cargo test` it runs a small smoke pass.

#[path = "../tests/fake_kube/mod.rs"]
mod fake_kube;

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use fake_kube::aws::{NoAlarms, context};
use fake_kube::{FakeKube, QUEUE_CONSUMERS};
use qc::api::QueueConsumer;
use qc::aws::{Facts, QueueFacts, StaticReader};
use qc::controller::pipeline::{self, Observation, ReplicaDecision};
use qc::controller::status::{self, AlarmStatus, StatusInputs};
use qc::controller::{Context, reconcile};
use qc::render::RenderOptions;
use serde_json::json;

const URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders";

fn manifest(name: &str, exec: bool) -> serde_json::Value {
    let handler = if exec {
        json!({"exec": {"command": ["/app/handle"]}})
    } else {
        json!({"http": {"port": 8080}})
    };
    json!({
        "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
        "metadata": {"name": name, "namespace": "bench", "uid": "b-1", "generation": 1},
        "spec": {
            "queue": {"url": URL}, "processing": {"p99": "2s"}, "handler": handler,
            "template": {"spec": {"containers": [{"name": "app", "image": "app:1",
                "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 8080}]}]}},
            "scaling": {"pollInterval": "1h"}, "deadLetter": {"alarm": false}
        }
    })
}

fn attrs() -> HashMap<String, String> {
    [
        ("VisibilityTimeout", "60"),
        ("MessageRetentionPeriod", "1209600"),
        ("ApproximateNumberOfMessages", "12"),
        ("ApproximateNumberOfMessagesNotVisible", "3"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn time_pure(exec: bool, iterations: u32) -> f64 {
    let qc: QueueConsumer = serde_json::from_value(manifest("orders", exec)).unwrap();
    let facts = Facts {
        queue: QueueFacts::from_attributes(URL, &attrs()).unwrap(),
        dead_letter: qc::aws::DeadLetterFacts::None,
        oldest_age_seconds: None,
    };
    let opts = RenderOptions::default();
    let now = qc::controller::observe::now();
    let start = Instant::now();
    for _ in 0..iterations {
        let d = pipeline::decide(&qc, Observation::Read(&facts), None, &opts);
        let s = status::build(&StatusInputs {
            qc: &qc,
            facts: Observation::Read(&facts),
            report: &d.report,
            rollout: &d.rollout,
            deployment: d.rollout.deployment(),
            target: None,
            applied: None,
            alarm: AlarmStatus::default(),
            replicas: &ReplicaDecision::Keep,
            scaled_at: None,
            sampled_at: Some(now.clone()),
            redrive: None,
            redrive_after_recovery: None,
            workers: None,
            now: now.clone(),
        });
        black_box((d, s));
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(iterations)
}

#[allow(clippy::struct_field_names)] // each is a figure per reconcile
struct Pass {
    micros_per_reconcile: f64,
    requests_per_reconcile: f64,
    writes_per_reconcile: f64,
}

async fn pass(fake: &FakeKube, ctx: &Arc<Context>, n: usize) -> Pass {
    fake.clear_requests();
    let start = Instant::now();
    for i in 0..n {
        let v = fake
            .get(QUEUE_CONSUMERS, "bench", &format!("qc-{i}"))
            .unwrap();
        let qc: QueueConsumer = serde_json::from_value(v).unwrap();
        reconcile(Arc::new(qc), ctx.clone()).await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64() * 1e6;
    let reqs = fake.requests();
    let writes = reqs.iter().filter(|r| r.is_write()).count();
    Pass {
        micros_per_reconcile: elapsed / n as f64,
        requests_per_reconcile: reqs.len() as f64 / n as f64,
        writes_per_reconcile: writes as f64 / n as f64,
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (n, iterations) = if full { (500, 20_000) } else { (5, 10) };

    println!("| step | handler | µs per QueueConsumer |");
    println!("|---|---|---|");
    for exec in [false, true] {
        let us = time_pure(exec, iterations);
        println!(
            "| validate + render + decide + status (pure) | {} | {us:.1} |",
            if exec { "exec" } else { "http" }
        );
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let fake = FakeKube::new();
        let reader = Arc::new(StaticReader::new().with_queue(URL, attrs()));
        let ctx = context(&fake, reader.clone(), Arc::new(NoAlarms), None);
        for i in 0..n {
            let mut m = manifest(&format!("qc-{i}"), i % 2 == 1);
            m["metadata"].as_object_mut().unwrap().remove("uid");
            fake.create(QUEUE_CONSUMERS, m);
        }
        let first = pass(&fake, &ctx, n).await;
        let steady = pass(&fake, &ctx, n).await;
        let reads = reader
            .calls()
            .iter()
            .filter(|c| c.starts_with("GetQueueAttributes"))
            .count();
        println!();
        println!(
            "| reconcile of {n} QueueConsumers on one queue (in-memory API) | µs per reconcile | API requests per reconcile | writes per reconcile |"
        );
        println!("|---|---|---|---|");
        for (label, p) in [("first (creates)", &first), ("steady (nothing changed)", &steady)] {
            println!(
                "| {label} | {:.0} | {:.2} | {:.2} |",
                p.micros_per_reconcile, p.requests_per_reconcile, p.writes_per_reconcile
            );
        }
        println!();
        println!("GetQueueAttributes calls for {} reconciles: {reads}", 2 * n);
    });
}
