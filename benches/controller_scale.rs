//! The controller at scale: N QueueConsumers on Q queues (each queue holding a message and with its
//! own dead-letter queue holding one, so both queues' oldest-message ages are read from CloudWatch and
//! every QueueConsumer keeps a DLQ alarm), the in-memory Kubernetes API, and the real `qc-operator run`
//! loop (kube Controller, watch triggers, AWS gates, batched CloudWatch reads) for a catch-up and then
//! three poll intervals. Prints one table row per interval. Run by `bash scripts/bench-controller`,
//! which starts SQS (fauxqs) and CloudWatch (moto) and names them in AWS_ENDPOINT_URL_SQS and
//! AWS_ENDPOINT_URL_CLOUDWATCH, which the SDK (so the controller) honours; the manifests name no
//! endpoint. Knobs: QC_BENCH_SCALES ("100:100,1000:1000,10000:1000" as consumers:queues),
//! QC_BENCH_POLL (15s), QC_BENCH_INTERVALS (3), QC_BENCH_CONCURRENCY (the default reconcile
//! concurrency), QC_BENCH_ALARMS (1; 0: no DLQ alarms). Without `--bench` (cargo test) it does nothing.

#[path = "../tests/fake_kube/mod.rs"]
mod fake_kube;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use fake_kube::{FakeKube, PODS, QUEUE_CONSUMERS};
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
                send(&sqs, &url, "poison").await;
                // The ARN as the server spells it (its account id is its own).
                sqs.get_queue_attributes()
                    .queue_url(&url)
                    .attribute_names(QueueAttributeName::QueueArn)
                    .send()
                    .await
                    .unwrap()
                    .attributes
                    .unwrap()
                    .remove(&QueueAttributeName::QueueArn)
                    .unwrap()
            }
        })
        .buffered(8)
        .collect()
        .await;
    let sources = futures::stream::iter(dlqs.into_iter().enumerate())
        .map(|(i, dlq_arn)| {
            let sqs = sqs.clone();
            async move {
                let policy = json!({
                    "deadLetterTargetArn": dlq_arn,
                    "maxReceiveCount": "5"
                });
                let url = sqs
                    .create_queue()
                    .queue_name(format!("{run}-src-{i}"))
                    .attributes(QueueAttributeName::RedrivePolicy, policy.to_string())
                    .attributes(QueueAttributeName::VisibilityTimeout, "60")
                    .send()
                    .await
                    .unwrap()
                    .queue_url
                    .unwrap();
                // A waiting message: the source queue's oldest age is read from CloudWatch too, and
                // the scaler keeps one replica.
                send(&sqs, &url, "work").await;
                url
            }
        })
        .buffered(8)
        .collect()
        .await;
    (sources, start.elapsed())
}

async fn send(sqs: &aws_sdk_sqs::Client, url: &str, body: &str) {
    sqs.send_message()
        .queue_url(url)
        .message_body(body)
        .send()
        .await
        .unwrap();
}

fn manifest(name: &str, url: &str, poll: &str) -> serde_json::Value {
    json!({
        "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
        "metadata": {"name": name, "namespace": NS, "generation": 1},
        "spec": {
            "queue": {"url": url, "region": "us-east-1"},
            "processing": {"p99": "2s"},
            "handler": {"http": {"port": 8080}},
            "template": {"spec": {"containers": [{"name": "app", "image": "app:1",
                "ports": [{"containerPort": 8080}]}]}},
            "scaling": {"pollInterval": poll},
            // QC_BENCH_ALARMS=0: no DLQ alarm, so a catch-up is not bounded by moto's PutMetricAlarm.
            "deadLetter": {"alarm": !std::env::var("QC_BENCH_ALARMS").is_ok_and(|v| v == "0")}
        }
    })
}

/// What a worker's /metrics says (a few lines of src/worker/metrics.rs's exposition): a handler
/// histogram and the in-flight gauge. Fixed, so status does not change from one scrape to the next.
const WORKER_METRICS: &str = "# TYPE qc_worker_handler_duration_seconds histogram
qc_worker_handler_duration_seconds_bucket{le=\"0.1\"} 40
qc_worker_handler_duration_seconds_bucket{le=\"0.5\"} 90
qc_worker_handler_duration_seconds_bucket{le=\"1\"} 100
qc_worker_handler_duration_seconds_bucket{le=\"+Inf\"} 100
qc_worker_handler_duration_seconds_sum 18.5
qc_worker_handler_duration_seconds_count 100
# TYPE qc_worker_in_flight gauge
qc_worker_in_flight 1
";

/// Every worker pod of the benchmark: one loopback server answering /metrics, counting scrapes.
async fn worker_metrics_server() -> (u16, Arc<std::sync::atomic::AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let scrapes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = scrapes.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut len = 0;
                loop {
                    match sock.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => len += n,
                    }
                    // One request at a time on a kept-alive connection.
                    while let Some(end) = buf[..len].windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.copy_within(end + 4..len, 0);
                        len -= end + 4;
                        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{WORKER_METRICS}",
                            WORKER_METRICS.len()
                        );
                        if sock.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    if len == buf.len() {
                        return;
                    }
                }
            });
        }
    });
    (port, scrapes)
}

/// A running, ready worker pod of QueueConsumer `name` whose metrics port is the bench's server.
fn worker_pod(name: &str, port: u16) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{name}-w0"), "namespace": NS,
                     "labels": qc::render::selector_labels(name)},
        "spec": {"containers": [
            {"name": "app", "image": "app:1"},
            {"name": "qc-worker", "image": "qc:bench",
             "ports": [{"name": qc::render::METRICS_PORT_NAME, "containerPort": port}]}
        ]},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]}
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
    pod_lists: usize,
    kube_writes: usize,
    /// Writes by what they wrote: status, Deployment, Event, other (finalizers, pods).
    writes_by: BTreeMap<&'static str, usize>,
    scrapes: u64,
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

async fn scale(n: usize, q: usize, poll: Duration, intervals: usize) {
    let conf = qc::aws::sdk_config(Some("us-east-1"), None).await;
    let sqs = aws_sdk_sqs::Client::new(&conf);
    let run_id = format!("s{n}x{q}-{}", std::process::id());
    let (urls, took) = create_queues(&sqs, &run_id, q).await;
    eprintln!("created {q} queues and {q} dead-letter queues in {took:.1?}");

    let fake = FakeKube::new();
    let (metrics_port, scrapes) = worker_metrics_server().await;
    let poll_s = format!("{}s", poll.as_secs());
    for i in 0..n {
        let name = format!("qc-{i}");
        fake.create(QUEUE_CONSUMERS, manifest(&name, &urls[i % q], &poll_s));
        // One worker pod each: the controller lists them every reconcile and scrapes them every interval.
        fake.create_with_status(PODS, worker_pod(&name, metrics_port));
    }
    fake.clear_requests();
    // The bench's CloudWatch gate is wider than the default (5 a second): moto does not throttle, and
    // the catch-up creates one alarm per QueueConsumer. Steady-state calls do not depend on it.
    let provider = Arc::new(SdkProvider::new(AwsOptions {
        // QC_BENCH_AWS_IN_FLIGHT: the SQS gate's calls at once (the flag --aws-max-in-flight).
        sqs: std::env::var("QC_BENCH_AWS_IN_FLIGHT")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(qc::aws::sqs::DEFAULT_LIMIT, |n| {
                LimitConfig::new(qc::aws::sqs::DEFAULT_LIMIT.rate, n)
            }),
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
            reconcile_concurrency: std::env::var("QC_BENCH_CONCURRENCY")
                .ok()
                .and_then(|c| c.parse().ok())
                .unwrap_or(DEFAULT_RECONCILE_CONCURRENCY),
        },
        async move {
            let _ = stop_rx.await;
        },
    ));

    let mut rows = Vec::new();
    let mut last_seen: HashMap<String, Instant> = HashMap::new();
    let (mut aws_before, mut thr_before) = (BTreeMap::new(), 0);
    let mut reconciles_before = 0;
    let mut scrapes_before = 0;
    let started = Instant::now();
    // Interval 0 is the catch-up: it ends when every QueueConsumer has been reconciled and its status
    // written once and, with DLQ alarms on, every alarm is reported in sync in status (its put runs in
    // the background, at moto's pace), bounded at QC_BENCH_CATCHUP_INTERVALS (40) intervals. Then `intervals` poll intervals of
    // steady state.
    let alarms_on = !std::env::var("QC_BENCH_ALARMS").is_ok_and(|v| v == "0");
    let catch_up_bound: u32 = std::env::var("QC_BENCH_CATCHUP_INTERVALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let (mut statuses_at, mut alarms_at) = (None, None);
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
        // The catch-up ends once every QueueConsumer's first reconcile has written its status.
        let mut status_written = std::collections::HashSet::<String>::default();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = Instant::now();
            for r in fake.take_requests() {
                row.kube_requests += 1;
                if r.is_write() {
                    row.kube_writes += 1;
                    let what = if r.path.ends_with("/status") {
                        status_written.insert(r.path.clone());
                        "status"
                    } else if r.path.contains("/deployments/") {
                        "Deployment"
                    } else if r.path.contains("/events") {
                        "Event"
                    } else {
                        "other"
                    };
                    *row.writes_by.entry(what).or_default() += 1;
                }
                if r.method == "GET" && !r.is_watch() && r.path.ends_with("/pods") {
                    row.pod_lists += 1;
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
                if statuses_at.is_none() && seen.len() >= n && status_written.len() >= n {
                    statuses_at = Some(begin.elapsed());
                }
                // Read every QueueConsumer's status about once a second.
                if alarms_on
                    && statuses_at.is_some()
                    && alarms_at.is_none()
                    && begin.elapsed().as_millis() % 1000 < 100
                {
                    let in_sync = fake
                        .list(QUEUE_CONSUMERS)
                        .iter()
                        .filter(|q| q["status"]["deadLetter"]["alarmName"].is_string())
                        .count();
                    if in_sync >= n {
                        alarms_at = Some(begin.elapsed());
                    }
                }
                let caught_up = statuses_at.is_some() && (!alarms_on || alarms_at.is_some());
                caught_up || begin.elapsed() > poll * catch_up_bound
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
        let s = scrapes.load(std::sync::atomic::Ordering::Relaxed);
        row.scrapes = s - scrapes_before;
        scrapes_before = s;
        rows.push(row);
    }
    let peak_kib = status_kib("VmHWM:");
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), task).await;

    println!(
        "\n### {n} QueueConsumers on {q} queues (+ {q} DLQs), poll {poll_s}; DLQ alarms {}; SQS on {}, CloudWatch on moto; queues created in {took:.1?}; run {:.1?}; load average {}\n",
        if std::env::var("QC_BENCH_ALARMS").is_ok_and(|v| v == "0") {
            "off"
        } else {
            "on"
        },
        std::env::var("QC_BENCH_SQS").unwrap_or_else(|_| "fauxqs".into()),
        started.elapsed(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "| interval | all reconciled after (s) | QueueConsumers reconciled | reconciles | GetQueueAttributes | GetQueueUrl | GetMetricData | DescribeAlarms | PutMetricAlarm | throttled | Kubernetes requests | of which pod lists | Kubernetes writes (status / Deployment / Event / other) | pod scrapes | longest gap between reconciles (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let a = |name: &str| r.aws.get(name).copied().unwrap_or(0);
        let w = |what: &str| r.writes_by.get(what).copied().unwrap_or(0);
        let writes = format!(
            "{} ({} / {} / {} / {})",
            r.kube_writes,
            w("status"),
            w("Deployment"),
            w("Event"),
            w("other")
        );
        println!(
            "| {} | {:.1} | {} / {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
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
            r.pod_lists,
            writes,
            r.scrapes,
            if r.label == "catch-up" {
                "-".to_string()
            } else {
                format!("{:.1}", r.max_gap.as_secs_f64())
            },
        );
    }
    let secs = |d: Option<Duration>| {
        d.map_or("not within the bound".to_string(), |d| {
            format!("{:.1} s", d.as_secs_f64())
        })
    };
    println!(
        "\nCatch-up: every QueueConsumer reconciled with its status written after {}; every DLQ alarm in sync in status after {}.",
        secs(statuses_at),
        if alarms_on {
            secs(alarms_at)
        } else {
            "- (alarms off)".to_string()
        }
    );
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
    for var in ["AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL_CLOUDWATCH"] {
        assert!(
            std::env::var(var).is_ok(),
            "{var} is not set: run `bash scripts/bench-controller` (it starts fauxqs and moto)"
        );
    }
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
        rt.block_on(scale(n, q.clamp(1, n), poll, intervals));
    }
}
