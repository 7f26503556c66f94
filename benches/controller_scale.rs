//! The controller at scale: N QueueConsumers on Q queues (each with its own dead-letter queue holding a
//! message, so every DLQ's age is read from CloudWatch and every QueueConsumer keeps a DLQ alarm) in
//! moto, the in-memory Kubernetes API, and the real `qc-operator run` loop (kube Controller, AWS gates,
//! batched CloudWatch reads) for a catch-up and then three poll intervals. Prints one table row per
//! interval. Run by `bash scripts/bench-controller`, which starts moto; knobs:
//! QC_BENCH_SCALES ("100:100,1000:1000,10000:1000" as consumers:queues), QC_BENCH_POLL (15s),
//! QC_BENCH_INTERVALS (3). Without `--bench` (cargo test) it does nothing.
#![allow(clippy::unwrap_used)]

#[path = "../tests/fake_kube/mod.rs"]
mod fake_kube;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use fake_kube::{FakeKube, QUEUE_CONSUMERS};
use futures::StreamExt;
use qc::aws::cloudwatch::BatchOptions;
use qc::aws::limit::{LimitConfig, Outcome};
use qc::controller::Context;
use qc::controller::observe::{AwsOptions, DEFAULT_BATCH_WINDOW, SdkProvider};
use qc::controller::run::{DEFAULT_RECONCILE_CONCURRENCY, RunOptions, run};
use qc::render::RenderOptions;
use serde_json::json;

const NS: &str = "bench";

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

async fn create_queues(sqs: &aws_sdk_sqs::Client, run: &str, q: usize) -> (Vec<String>, Duration) {
    let start = Instant::now();
    let dlqs: Vec<String> = futures::stream::iter(0..q)
        .map(|i| {
            let sqs = sqs.clone();
            let name = format!("{run}-dlq-{i}");
            async move {
                let url = sqs
                    .create_queue()
                    .queue_name(&name)
                    .send()
                    .await
                    .unwrap()
                    .queue_url
                    .unwrap();
                // One message in each DLQ: its age is read from CloudWatch on every interval.
                sqs.send_message()
                    .queue_url(&url)
                    .message_body("poison")
                    .send()
                    .await
                    .unwrap();
                name
            }
        })
        .buffered(8)
        .collect()
        .await;
    let sources = futures::stream::iter(dlqs.into_iter().enumerate())
        .map(|(i, dlq)| {
            let sqs = sqs.clone();
            async move {
                let policy = json!({
                    "deadLetterTargetArn": format!("arn:aws:sqs:us-east-1:123456789012:{dlq}"),
                    "maxReceiveCount": "5"
                });
                sqs.create_queue()
                    .queue_name(format!("{run}-src-{i}"))
                    .attributes(QueueAttributeName::RedrivePolicy, policy.to_string())
                    .attributes(QueueAttributeName::VisibilityTimeout, "60")
                    .send()
                    .await
                    .unwrap()
                    .queue_url
                    .unwrap()
            }
        })
        .buffered(8)
        .collect()
        .await;
    (sources, start.elapsed())
}

fn manifest(name: &str, url: &str, endpoint: &str, poll: &str) -> serde_json::Value {
    json!({
        "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
        "metadata": {"name": name, "namespace": NS, "generation": 1},
        "spec": {
            "queue": {"url": url, "region": "us-east-1", "endpoint": endpoint},
            "processing": {"p99": "2s"},
            "handler": {"http": {"port": 8080}},
            "template": {"spec": {"containers": [{"name": "app", "image": "app:1",
                "ports": [{"containerPort": 8080}]}]}},
            "scaling": {"pollInterval": poll}
        }
    })
}

#[derive(Default, Clone)]
struct Row {
    label: String,
    wall: Duration,
    reconciles: u64,
    distinct: usize,
    aws: BTreeMap<&'static str, u64>,
    throttled: u64,
    kube_requests: usize,
    kube_writes: usize,
    max_gap: Duration,
}

fn aws_calls(p: &SdkProvider) -> (BTreeMap<&'static str, u64>, u64) {
    let (sqs, cw) = p.limiters();
    let mut by_action = BTreeMap::new();
    let mut throttled = 0;
    for ((action, outcome), n) in sqs.calls().into_iter().chain(cw.calls()) {
        *by_action.entry(action).or_default() += n;
        if outcome == Outcome::Throttled {
            throttled += n;
        }
    }
    (by_action, throttled)
}

fn diff(
    now: &BTreeMap<&'static str, u64>,
    before: &BTreeMap<&'static str, u64>,
) -> BTreeMap<&'static str, u64> {
    now.iter()
        .map(|(k, v)| (*k, v - before.get(k).copied().unwrap_or(0)))
        .collect()
}

/// The name of the QueueConsumer a request reconciled: each reconcile reads its Deployment once.
fn reconciled(r: &fake_kube::Recorded) -> Option<String> {
    let prefix = format!("/apis/apps/v1/namespaces/{NS}/deployments/");
    (r.method == "GET" && !r.is_watch())
        .then(|| r.path.strip_prefix(&prefix).map(str::to_string))
        .flatten()
}

async fn scale(endpoint: &str, n: usize, q: usize, poll: Duration, intervals: usize) {
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(endpoint)).await;
    let sqs = aws_sdk_sqs::Client::new(&conf);
    let run_id = format!("s{n}x{q}-{}", std::process::id());
    let (urls, took) = create_queues(&sqs, &run_id, q).await;
    eprintln!("created {q} queues and {q} dead-letter queues in moto in {took:.1?}");

    let fake = FakeKube::new();
    let poll_s = format!("{}s", poll.as_secs());
    for i in 0..n {
        fake.create(
            QUEUE_CONSUMERS,
            manifest(&format!("qc-{i}"), &urls[i % q], endpoint, &poll_s),
        );
    }
    fake.clear_requests();
    // The bench's CloudWatch gate is wider than the default (5 a second): moto does not throttle, and
    // the catch-up creates one alarm per QueueConsumer. Steady-state calls do not depend on it.
    let provider = Arc::new(SdkProvider::new(AwsOptions {
        sqs: qc::aws::sqs::DEFAULT_LIMIT,
        cloudwatch: LimitConfig::new(200.0, 16),
        batch: BatchOptions {
            window: DEFAULT_BATCH_WINDOW,
            ..AwsOptions::default().batch
        },
    }));
    let ctx = Arc::new(Context::new(
        fake.client(),
        provider.clone(),
        RenderOptions {
            worker_image: "qc:bench".into(),
        },
        None,
    ));
    let baseline_kib = status_kib("VmRSS:");
    // Peak RSS from here on (Linux: writing 5 resets VmHWM to the current RSS).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let task = tokio::spawn(run(
        ctx.clone(),
        RunOptions {
            namespaces: vec![NS.into()],
            metrics_addr: addr,
            leader: None,
            reconcile_concurrency: DEFAULT_RECONCILE_CONCURRENCY,
        },
        async move {
            let _ = stop_rx.await;
        },
    ));

    let mut rows = Vec::new();
    let mut last_seen: HashMap<String, Instant> = HashMap::new();
    let (mut aws_before, mut thr_before) = (BTreeMap::new(), 0);
    let mut reconciles_before = 0;
    let started = Instant::now();
    // Interval 0 is the catch-up: it ends when every QueueConsumer has been reconciled once (bounded
    // at 20 intervals). Then `intervals` poll intervals of steady state.
    for k in 0..=intervals {
        let begin = Instant::now();
        let mut row = Row {
            label: if k == 0 {
                "catch-up".into()
            } else {
                format!("steady {k}")
            },
            ..Row::default()
        };
        let mut seen: HashMap<String, Instant> = HashMap::new();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = Instant::now();
            for r in fake.take_requests() {
                row.kube_requests += 1;
                if r.is_write() {
                    row.kube_writes += 1;
                }
                if let Some(name) = reconciled(&r) {
                    if k > 0
                        && let Some(prev) = last_seen.get(&name)
                    {
                        row.max_gap = row.max_gap.max(now.duration_since(*prev));
                    }
                    last_seen.insert(name.clone(), now);
                    seen.entry(name).or_insert(now);
                }
            }
            let done = if k == 0 {
                seen.len() >= n || begin.elapsed() > poll * 20
            } else {
                begin.elapsed() >= poll
            };
            if done {
                break;
            }
        }
        row.distinct = seen.len();
        row.wall = seen
            .values()
            .max()
            .map(|t| t.duration_since(begin))
            .unwrap_or_default();
        let (aws_now, thr_now) = aws_calls(&provider);
        row.aws = diff(&aws_now, &aws_before);
        row.throttled = thr_now - thr_before;
        (aws_before, thr_before) = (aws_now, thr_now);
        let r = ctx
            .metrics
            .reconciles
            .load(std::sync::atomic::Ordering::Relaxed);
        row.reconciles = r - reconciles_before;
        reconciles_before = r;
        rows.push(row);
    }
    let peak_kib = status_kib("VmHWM:");
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), task).await;

    println!(
        "\n### {n} QueueConsumers on {q} queues (+ {q} DLQs), poll {poll_s}; moto setup {took:.1?}; run {:.1?}\n",
        started.elapsed()
    );
    println!(
        "| interval | all reconciled after (s) | QueueConsumers reconciled | reconciles | GetQueueAttributes | GetQueueUrl | GetMetricData | DescribeAlarms | PutMetricAlarm | throttled | Kubernetes requests | Kubernetes writes | longest gap between reconciles (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let a = |name: &str| r.aws.get(name).copied().unwrap_or(0);
        println!(
            "| {} | {:.1} | {} / {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            r.wall.as_secs_f64(),
            r.distinct,
            r.reconciles,
            a("GetQueueAttributes"),
            a("GetQueueUrl"),
            a("GetMetricData"),
            a("DescribeAlarms"),
            a("PutMetricAlarm"),
            r.throttled,
            r.kube_requests,
            r.kube_writes,
            if r.label == "catch-up" {
                "-".to_string()
            } else {
                format!("{:.1}", r.max_gap.as_secs_f64())
            },
        );
    }
    let errors: Vec<String> = ctx
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("qc_reconcile_errors_total{"))
        .map(str::to_string)
        .collect();
    println!(
        "\nReconcile errors: {}",
        if errors.is_empty() {
            "none".to_string()
        } else {
            errors.join(", ")
        }
    );
    println!(
        "\nPeak RSS during the run: {:.1} MiB, of which {:.1} MiB were there before the controller started (the in-memory API holding {n} QueueConsumers, the bench, the runtime): the controller's share is about {:.1} MiB.",
        peak_kib as f64 / 1024.0,
        baseline_kib as f64 / 1024.0,
        peak_kib.saturating_sub(baseline_kib) as f64 / 1024.0
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let endpoint = std::env::var("QC_TEST_SQS_ENDPOINT").expect(
        "QC_TEST_SQS_ENDPOINT is not set: run `bash scripts/bench-controller` (it starts moto)",
    );
    let scales: Vec<(usize, usize)> = std::env::var("QC_BENCH_SCALES")
        .unwrap_or_else(|_| "100:100,1000:1000,10000:1000".into())
        .split(',')
        .filter_map(|s| {
            let (n, q) = s.trim().split_once(':')?;
            Some((n.parse().ok()?, q.parse().ok()?))
        })
        .collect();
    let poll = std::env::var("QC_BENCH_POLL")
        .ok()
        .and_then(|p| p.parse::<qc::api::Duration>().ok())
        .map_or(Duration::from_secs(15), |d| d.as_std());
    let intervals = std::env::var("QC_BENCH_INTERVALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for (n, q) in scales {
        rt.block_on(scale(&endpoint, n, q.clamp(1, n), poll, intervals));
    }
}
