//! Benchmark of `qc-worker`: drain N messages through a handler of fixed latency P at concurrency C,
//! and report SQS requests per message (the worker's own counters), drain time against the ideal
//! N·P/C, worker CPU per message and peak RSS. Run it with `bash scripts/bench-worker` (it starts the
//! SQS server); `cargo test --all-targets` only builds it.
#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;
// The worker tests' probe and port helpers (and `common`, which they build on).
#[path = "../tests/worker/support.rs"]
mod support;

use std::convert::Infallible;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{QueueAttributeName, SendMessageBatchRequestEntry};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use support::{free_port, http_get, parse_metric};

struct Run {
    concurrency: usize,
    messages: usize,
    drain: Duration,
    ideal: Duration,
    requests: f64,
    receives: f64,
    deletes: f64,
    cpu: Duration,
    peak_rss_kib: u64,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "worker benchmark: run `bash scripts/bench-worker` (skipped outside `cargo bench`)"
        );
        return;
    }
    let Ok(endpoint) = std::env::var("QC_BENCH_SQS_ENDPOINT") else {
        eprintln!("QC_BENCH_SQS_ENDPOINT is not set: run `bash scripts/bench-worker`");
        std::process::exit(2);
    };
    let latency: qc::api::Duration = env_or("QC_BENCH_LATENCY", "50ms").parse().unwrap();
    let per_slot: usize = env_or("QC_BENCH_MESSAGES_PER_SLOT", "200").parse().unwrap();
    let concurrencies: Vec<usize> = env_or("QC_BENCH_CONCURRENCY", "1,10,100")
        .split(',')
        .map(|c| c.trim().parse().unwrap())
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let handler = start_handler(latency.as_std()).await;
        let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&endpoint)).await;
        let client = aws_sdk_sqs::Client::new(&conf);
        if std::env::var_os("QC_BENCH_SDK_PROBE").is_some() {
            sdk_probe(&client, &conf).await;
            return;
        }
        let mut runs = Vec::new();
        for c in concurrencies {
            let n = (c * per_slot).max(per_slot);
            let run = bench_one(&client, &endpoint, &handler, c, n, latency.as_std()).await;
            eprintln!(
                "C={c}: drained {n} in {:.2}s ({:.2} × ideal)",
                run.drain.as_secs_f64(),
                run.drain.as_secs_f64() / run.ideal.as_secs_f64()
            );
            runs.push(run);
        }
        print_table(latency, &runs);
    });
}

async fn bench_one(
    client: &aws_sdk_sqs::Client,
    endpoint: &str,
    handler_url: &str,
    concurrency: usize,
    messages: usize,
    latency: Duration,
) -> Run {
    let name = format!(
        "bench-c{concurrency}-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    );
    let url = client
        .create_queue()
        .queue_name(&name)
        .attributes(QueueAttributeName::VisibilityTimeout, "60")
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    fill(client, &url, messages).await;

    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let log = tempfile::NamedTempFile::new().unwrap();
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .args(["--queue-url", &url, "--endpoint-url", endpoint])
        .args(["--concurrency", &concurrency.to_string()])
        .args(["--metrics-addr", &metrics_addr, "--http-url", handler_url])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Drained = nothing left on the server. Polling the server, not the worker's /metrics, keeps the
    // measurement from costing the worker CPU.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if queue_len(client, &url).await == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "drain did not finish; worker log:\n{}",
            std::fs::read_to_string(log.path()).unwrap_or_default()
        );
    }
    let drain = started.elapsed();
    let cpu = cpu_time(pid);
    let peak_rss_kib = peak_rss_kib(pid);
    // The last delete's answer may still be on its way to the worker.
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = http_get(&metrics_addr, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default();
        if metric_or_zero(&metrics, "qc_worker_messages_deleted_total") >= messages as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric_or_zero(&metrics, "qc_worker_messages_deleted_total"),
        messages as f64,
        "every message deleted once"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    let _ = client.delete_queue().queue_url(&url).send().await;

    let action = |a: &str| {
        metric_or_zero(
            &metrics,
            &format!("qc_worker_sqs_requests_total{{action=\"{a}\"}}"),
        )
    };
    let requests: f64 = [
        "ReceiveMessage",
        "DeleteMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
        "GetQueueAttributes",
    ]
    .iter()
    .map(|a| action(a))
    .sum();
    Run {
        concurrency,
        messages,
        drain,
        ideal: latency * messages as u32 / concurrency as u32,
        requests: requests / messages as f64,
        receives: action("ReceiveMessage") / messages as f64,
        deletes: action("DeleteMessageBatch") / messages as f64,
        cpu,
        peak_rss_kib,
    }
}

/// CPU of this process per DeleteMessageBatch of 10 unknown handles (the emulator answers without
/// work), through the SDK and through the worker's own client, side by side.
async fn sdk_probe(client: &aws_sdk_sqs::Client, conf: &aws_config::SdkConfig) {
    let url = client
        .create_queue()
        .queue_name(format!("probe-{}", std::process::id()))
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    let calls = 2000;
    let before = cpu_time(std::process::id());
    let started = Instant::now();
    for _ in 0..calls {
        let mut req = client.delete_message_batch().queue_url(&url);
        for i in 0..10 {
            req = req.entries(
                aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(format!("bogus-handle-{i}-{}", "x".repeat(200)))
                    .build()
                    .unwrap(),
            );
        }
        let _ = req.send().await;
    }
    let cpu = cpu_time(std::process::id()) - before;
    println!(
        "SDK DeleteMessageBatch: {:.1} µs CPU per call (client and server share the machine), {:.2} ms wall per call",
        cpu.as_secs_f64() * 1e6 / calls as f64,
        started.elapsed().as_secs_f64() * 1e3 / calls as f64
    );
    let metrics = std::sync::Arc::new(qc::worker::metrics::Metrics::default());
    let sqs = qc::worker::sqs::Sqs::new(conf, &url, metrics).unwrap();
    let entries: Vec<qc::worker::sqs::Entry> = (0..10)
        .map(|i| qc::worker::sqs::Entry {
            message_id: i.to_string(),
            receipt_handle: format!("bogus-handle-{i}-{}", "x".repeat(200)),
            lease_until: None,
        })
        .collect();
    let before = cpu_time(std::process::id());
    let started = Instant::now();
    for _ in 0..calls {
        let _ = sqs.delete_batch(&entries).await;
    }
    let cpu = cpu_time(std::process::id()) - before;
    println!(
        "worker client DeleteMessageBatch: {:.1} µs CPU per call, {:.2} ms wall per call",
        cpu.as_secs_f64() * 1e6 / calls as f64,
        started.elapsed().as_secs_f64() * 1e3 / calls as f64
    );
}

/// Visible plus in-flight messages.
async fn queue_len(client: &aws_sdk_sqs::Client, url: &str) -> u64 {
    let Ok(out) = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
    else {
        return u64::MAX;
    };
    out.attributes()
        .map(|a| a.values().filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(u64::MAX)
}

/// Sends `n` small messages, 10 per call, 16 calls at a time.
async fn fill(client: &aws_sdk_sqs::Client, url: &str, n: usize) {
    let batches: Vec<usize> = (0..n.div_ceil(10)).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for chunk in batches.chunks(batches.len().div_ceil(16).max(1)) {
        let client = client.clone();
        let url = url.to_string();
        let chunk = chunk.to_vec();
        tasks.spawn(async move {
            for b in chunk {
                let mut req = client.send_message_batch().queue_url(&url);
                for i in 0..10.min(n - b * 10) {
                    let body = format!(
                        "{{\"orderId\":\"o-{}\",\"amount\":42,\"note\":\"benchmark\"}}",
                        b * 10 + i
                    );
                    req = req.entries(
                        SendMessageBatchRequestEntry::builder()
                            .id(i.to_string())
                            .message_body(body)
                            .build()
                            .unwrap(),
                    );
                }
                let out = req.send().await.unwrap();
                assert!(out.failed().is_empty());
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// CPU time of every live thread of `pid` (ns precision from schedstat), or utime+stime if larger.
fn cpu_time(pid: u32) -> Duration {
    let mut ns: u64 = 0;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
            }
        }
    }
    // utime + stime in clock ticks (100 Hz) also count threads that already exited.
    let ticks: u64 = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    Duration::from_nanos(ns).max(Duration::from_millis(ticks * 10))
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn print_table(latency: qc::api::Duration, runs: &[Run]) {
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!("\nP = {latency} per message; SQS server: fauxqs; worker: {build} build\n");
    println!(
        "| C | N | drain | ideal N·P/C | drain / ideal | SQS requests / msg (receive + delete) | worker CPU / msg | peak RSS |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        println!(
            "| {} | {} | {:.2} s | {:.2} s | {:.3} | {:.3} ({:.3} + {:.3}) | {:.1} µs | {:.1} MiB |",
            r.concurrency,
            r.messages,
            r.drain.as_secs_f64(),
            r.ideal.as_secs_f64(),
            r.drain.as_secs_f64() / r.ideal.as_secs_f64(),
            r.requests,
            r.receives,
            r.deletes,
            r.cpu.as_secs_f64() * 1e6 / r.messages as f64,
            r.peak_rss_kib as f64 / 1024.0
        );
    }
}

/// The handler: answers 200 after exactly `latency`.
async fn start_handler(latency: Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/messages", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |_req: Request<Incoming>| async move {
                        tokio::time::sleep(latency).await;
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    url
}

/// A counter the worker has not exported yet reads 0.
fn metric_or_zero(text: &str, name: &str) -> f64 {
    parse_metric(text, name).unwrap_or(0.0)
}
