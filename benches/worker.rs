//! Benchmark of `qc-worker` beside bbc/sqs-consumer: each drains N messages at concurrency C through
//! a loopback proxy that delays every SQS request by 5-15 ms (as real SQS answers) in front of
//! fauxqs, and an HTTP handler whose times are log-normal (P50 20 ms, P99 100 ms). Per run: SQS
//! requests per message (counted by the proxy), drain time against the ideal N·mean/C (the mean of
//! the handler times drawn in that run), CPU per message and peak RSS of the consumer process. Run
//! it with `bash scripts/bench-worker` (it starts fauxqs and installs sqs-consumer);
//! `cargo test --all-targets` only builds it.

#[path = "../tests/common/mod.rs"]
mod common;
// The worker tests' probe and port helpers (and `common`, which they build on).
#[path = "reference/consumer.rs"]
mod reference;
#[path = "../tests/worker/support.rs"]
mod support;
// The OTLP receiver the tracing rows export to (in this process: its decoding is not the worker's CPU).
#[path = "../tests/common/otlp.rs"]
mod otlp;

use std::collections::HashMap;
use std::convert::Infallible;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{QueueAttributeName, SendMessageBatchRequestEntry};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use support::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Run {
    consumer: String,
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

/// Earlier builds run beside this one, in order: `QC_BENCH_BEFORE_WORKER` names their qc-worker
/// binaries (comma-separated), `QC_BENCH_BEFORE_LABEL` their labels in the same order ("before" for
/// a label not given).
fn before_workers() -> Vec<(String, String)> {
    let Ok(paths) = std::env::var("QC_BENCH_BEFORE_WORKER") else {
        return Vec::new();
    };
    let labels = env_or("QC_BENCH_BEFORE_LABEL", "before");
    let mut labels = labels.split(',').map(str::trim);
    paths
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let label = labels.next().unwrap_or("before");
            (p.to_string(), format!("qc-worker {label}"))
        })
        .collect()
}

/// The consumers each C runs: qc-worker (one message a call, then batch mode), then bbc/sqs-consumer
/// in its four modes (if installed).
const BBC_MODES: [&str; 4] = ["batch1", "batch10", "handleMessageBatch", "bulk"];
/// Messages per handler call in the batch rows: qc-worker's batch mode (`--batch-max-items`) and
/// sqs-consumer's `bulk` mode (handleMessageBatch making one call for its batch).
const BATCH_ITEMS: usize = 10;

fn main() {
    if std::env::args().any(|a| a == "--reference-consumer") {
        reference::main();
        return;
    }
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
    let per_slot: usize = env_or("QC_BENCH_MESSAGES_PER_SLOT", "200").parse().unwrap();
    let concurrencies: Vec<usize> = env_or("QC_BENCH_CONCURRENCY", "1,10,100")
        .split(',')
        .map(|c| c.trim().parse().unwrap())
        .collect();
    let bbc = std::env::var("QC_BENCH_BBC_SCRIPT").ok();
    let suite = env_or("QC_BENCH_SUITE", "all");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let handler = Handler::start().await;
        let receiver = otlp::Receiver::start().await;
        let upstream = endpoint.trim_start_matches("http://").to_string();
        let proxy = LatencyProxy::start(upstream).await;
        let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&endpoint)).await;
        let client = aws_sdk_sqs::Client::new(&conf);
        if suite == "all" || suite == "heartbeats" {
            heartbeats::bench(&client, &proxy, &endpoint, bbc.as_deref()).await;
        }
        if suite == "heartbeats" {
            return;
        }
        let mut runs = Vec::new();
        for c in concurrencies {
            let n = (c * per_slot).max(per_slot);
            // The build before a change (QC_BENCH_BEFORE_WORKER) beside this one, same run.
            let mut consumers: Vec<Consumer> = before_workers()
                .into_iter()
                .map(|(bin, label)| Consumer::Worker(bin, label))
                .collect();
            consumers.push(Consumer::Worker(
                env!("CARGO_BIN_EXE_qc-worker").to_string(),
                "qc-worker".to_string(),
            ));
            // Tracing (#46 item 1): the row above has it off (no endpoint); these export every span
            // of 1 % and of all messages to the receiver above.
            for (ratio, label) in [("0.01", "1 %"), ("1", "100 %")] {
                consumers.push(Consumer::WorkerTraced {
                    bin: env!("CARGO_BIN_EXE_qc-worker").to_string(),
                    ratio,
                    label,
                    endpoint: receiver.url.clone(),
                });
            }
            consumers.push(Consumer::WorkerBatch(
                env!("CARGO_BIN_EXE_qc-worker").to_string(),
            ));
            // The rig's own limit, in the same run (#31 item 2), and its batch-mode twin: what
            // the SDK calls alone cost a message when one handler call carries ten (#32 item 4).
            consumers.push(Consumer::Reference(1));
            consumers.push(Consumer::Reference(BATCH_ITEMS));
            if let Some(script) = &bbc {
                consumers.extend(BBC_MODES.map(|m| Consumer::Bbc(script.clone(), m)));
            }
            // QC_BENCH_ONLY: run only the consumers whose name contains one of these.
            if let Ok(only) = std::env::var("QC_BENCH_ONLY") {
                let wanted: Vec<&str> = only.split(',').map(str::trim).collect();
                consumers.retain(|c| wanted.iter().any(|w| c.name().contains(w)));
            }
            // QC_BENCH_ROUNDS (1): the list run that many times, round-robin, so a busy minute of the
            // machine falls on every consumer alike; the summary table takes each one's median.
            let rounds: usize = env_or("QC_BENCH_ROUNDS", "1").parse().unwrap();
            let order: Vec<&Consumer> = (0..rounds.max(1)).flat_map(|_| &consumers).collect();
            for consumer in order {
                receiver.clear();
                let run = bench_one(&client, &proxy, &handler, consumer, c, n).await;
                if let Consumer::WorkerTraced { .. } = consumer {
                    eprintln!(
                        "{} C={c}: {} spans exported for {n} messages",
                        run.consumer,
                        receiver.spans().len()
                    );
                }
                eprintln!(
                    "{} C={c}: drained {n} in {:.2}s ({:.2} × ideal), {:.3} requests/msg",
                    run.consumer,
                    run.drain.as_secs_f64(),
                    run.drain.as_secs_f64() / run.ideal.as_secs_f64(),
                    run.requests
                );
                runs.push(run);
            }
        }
        print_table(&runs);
        print_medians(&runs);
    });
}

/// With several rounds: each consumer's median CPU per message and drain / ideal at each C, with the
/// range of the rounds, and the ratio to the first `qc-worker` row of that C (the peer in the same run).
fn print_medians(runs: &[Run]) {
    let mut groups: Vec<((String, usize), Vec<&Run>)> = Vec::new();
    for r in runs {
        let key = (r.consumer.clone(), r.concurrency);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(r),
            None => groups.push((key, vec![r])),
        }
    }
    if groups.iter().all(|(_, v)| v.len() < 2) {
        return;
    }
    let median = |mut xs: Vec<f64>| -> (f64, f64, f64) {
        xs.sort_by(f64::total_cmp);
        let mid = if xs.len() % 2 == 1 {
            xs[xs.len() / 2]
        } else {
            f64::midpoint(xs[xs.len() / 2 - 1], xs[xs.len() / 2])
        };
        (mid, xs[0], xs[xs.len() - 1])
    };
    let cpu = |r: &Run| r.cpu.as_secs_f64() * 1e6 / r.messages as f64;
    println!(
        "
| consumer | C | rounds | CPU / msg (median) | range | × qc-worker | drain / ideal (median) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for ((name, c), rs) in &groups {
        let (m, lo, hi) = median(rs.iter().map(|r| cpu(r)).collect());
        let peer = groups
            .iter()
            .find(|((n, pc), _)| n == "qc-worker" && pc == c)
            .map(|(_, prs)| median(prs.iter().map(|r| cpu(r)).collect()).0);
        let ratio = peer.map_or("-".to_string(), |p| format!("{:.3}", m / p));
        let (d, _, _) = median(
            rs.iter()
                .map(|r| r.drain.as_secs_f64() / r.ideal.as_secs_f64())
                .collect(),
        );
        println!(
            "| {name} | {c} | {} | {m:.1} µs | {lo:.1}-{hi:.1} µs | {ratio} | {d:.3} |",
            rs.len()
        );
    }
}

enum Consumer {
    /// A qc-worker binary and its label in the table.
    Worker(String, String),
    /// A qc-worker binary in batch mode: C / `BATCH_ITEMS` calls of `BATCH_ITEMS` messages.
    WorkerBatch(String),
    /// A qc-worker binary exporting spans to `endpoint`, sampling `ratio` of the messages
    /// (`parentbased_traceidratio`; the bench's messages carry no producer context).
    WorkerTraced {
        bin: String,
        ratio: &'static str,
        label: &'static str,
        endpoint: String,
    },
    /// The bench script of bbc/sqs-consumer and its mode.
    Bbc(String, &'static str),
    /// The reference consumer (`benches/reference/consumer.rs`): this bench binary run again, with
    /// this many messages a handler call (1, or `BATCH_ITEMS` like qc-worker's batch row).
    Reference(usize),
}

impl Consumer {
    fn name(&self) -> String {
        match self {
            Consumer::Worker(_, label) => label.clone(),
            Consumer::WorkerBatch(_) => format!("qc-worker batch {BATCH_ITEMS}"),
            Consumer::WorkerTraced { label, .. } => format!("qc-worker tracing {label}"),
            Consumer::Bbc(_, mode) => format!("sqs-consumer {mode}"),
            Consumer::Reference(1) => "reference loop".to_string(),
            Consumer::Reference(items) => format!("reference loop batch {items}"),
        }
    }

    /// Messages one handler call carries.
    fn per_call(&self) -> usize {
        match self {
            Consumer::WorkerBatch(_) | Consumer::Bbc(_, "bulk") => BATCH_ITEMS,
            Consumer::Reference(items) => *items,
            _ => 1,
        }
    }

    fn spawn(
        &self,
        url: &str,
        endpoint: &str,
        handler_url: &str,
        concurrency: usize,
        metrics_port: u16,
        log: &tempfile::NamedTempFile,
    ) -> std::process::Child {
        let mut cmd = match self {
            Consumer::Worker(bin, _) => {
                let mut cmd = Command::new(bin);
                cmd.args(["--queue-url", url, "--endpoint-url", endpoint])
                    .args(["--concurrency", &concurrency.to_string()])
                    .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
                    .args(["--http-url", handler_url])
                    .env("RUST_LOG", "warn");
                cmd
            }
            Consumer::WorkerTraced {
                bin,
                ratio,
                endpoint: otlp_endpoint,
                ..
            } => {
                let mut cmd = Command::new(bin);
                cmd.args(["--queue-url", url, "--endpoint-url", endpoint])
                    .args(["--concurrency", &concurrency.to_string()])
                    .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
                    .args(["--http-url", handler_url])
                    .env("RUST_LOG", "warn")
                    .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_endpoint)
                    .env("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
                    .env("OTEL_TRACES_SAMPLER_ARG", ratio);
                cmd
            }
            Consumer::WorkerBatch(bin) => {
                let calls = concurrency.div_ceil(BATCH_ITEMS).max(1);
                let mut cmd = Command::new(bin);
                cmd.args(["--queue-url", url, "--endpoint-url", endpoint])
                    .args(["--concurrency", &calls.to_string()])
                    .args(["--batch-max-items", &BATCH_ITEMS.to_string()])
                    .args(["--batch-max-wait", "50ms"])
                    .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
                    .args(["--http-url", handler_url])
                    .env("RUST_LOG", "warn");
                cmd
            }
            Consumer::Reference(items) => {
                let mut cmd = Command::new(std::env::current_exe().unwrap());
                cmd.arg("--reference-consumer")
                    .env("QC_REF_QUEUE_URL", url)
                    .env("QC_REF_ENDPOINT", endpoint)
                    .env("QC_REF_HANDLER_URL", handler_url)
                    .env("QC_REF_CONCURRENCY", concurrency.to_string())
                    .env("QC_REF_BATCH_ITEMS", items.to_string());
                cmd
            }
            Consumer::Bbc(script, mode) => {
                let per_consumer = if *mode == "batch1" { 1 } else { 10 };
                let mut cmd = Command::new("node");
                cmd.arg(script)
                    .env("QUEUE_URL", url)
                    .env("SQS_ENDPOINT", endpoint)
                    .env("HANDLER_URL", handler_url)
                    .env("MODE", mode)
                    .env(
                        "CONSUMERS",
                        concurrency.div_ceil(per_consumer).max(1).to_string(),
                    );
                cmd
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap()
    }
}

async fn bench_one(
    client: &aws_sdk_sqs::Client,
    proxy: &LatencyProxy,
    handler: &Handler,
    consumer: &Consumer,
    concurrency: usize,
    messages: usize,
) -> Run {
    let url = filled_queue(client, &format!("bench-c{concurrency}"), 60, messages).await;
    proxy.reset();
    handler.reset();

    let log = tempfile::NamedTempFile::new().unwrap();
    let started = Instant::now();
    let metrics_port = free_port();
    let mut child = consumer.spawn(
        &url,
        &proxy.url,
        &handler.url,
        concurrency,
        metrics_port,
        &log,
    );
    let pid = child.id();
    wait_drained(client, &url, &log, "drain", Duration::from_millis(10)).await;
    let drain = started.elapsed();
    let cpu = cpu_time(pid);
    let peak_rss_kib = peak_rss_kib(pid);
    if let Consumer::Worker(..) | Consumer::WorkerBatch(..) | Consumer::WorkerTraced { .. } =
        consumer
    {
        // How full the receives were (qc_worker_receive_messages), for the log.
        if let Some((_, text)) =
            support::http_get(&format!("127.0.0.1:{metrics_port}"), "/metrics").await
        {
            eprintln!(
                "{} C={concurrency}: messages per receive: {}",
                consumer.name(),
                receive_sizes(&text)
            );
        }
    }
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    let _ = client.delete_queue().queue_url(&url).send().await;
    let (calls, handled_time) = handler.totals();
    assert!(
        calls >= messages as u64,
        "{}: {calls} handler calls for {messages} messages",
        consumer.name()
    );
    let counts = proxy.counts();
    let action = |a: &str| *counts.get(&format!("AmazonSQS.{a}")).unwrap_or(&0) as f64;
    let requests: f64 = counts.values().sum::<u64>() as f64;
    Run {
        consumer: consumer.name(),
        concurrency,
        messages,
        drain,
        // The mean of the handler times drawn in this run (one a call), over the calls that run at
        // once: N·mean/C for one message a call, (N/10)·mean/(C/10) in the batch rows.
        ideal: handled_time.mul_f64(messages as f64 / calls as f64)
            / concurrency.div_ceil(consumer.per_call()).max(1) as u32,
        requests: requests / messages as f64,
        receives: action("ReceiveMessage") / messages as f64,
        deletes: (action("DeleteMessageBatch") + action("DeleteMessage")) / messages as f64,
        cpu,
        peak_rss_kib,
    }
}

/// `size×count` for each answer size of `qc_worker_receive_messages` that occurred.
fn receive_sizes(metrics: &str) -> String {
    let mut below = 0.0;
    let mut out = Vec::new();
    for size in 0..=10 {
        let name = format!("qc_worker_receive_messages_bucket{{le=\"{size}\"}}");
        let Some(cumulative) = support::parse_metric(metrics, &name) else {
            continue;
        };
        if cumulative > below {
            out.push(format!("{size}×{}", cumulative - below));
        }
        below = cumulative;
    }
    out.join(" ")
}

/// Visible plus in-flight messages.
/// A new queue named `prefix`-pid-random with this VisibilityTimeout (seconds), holding `messages`.
async fn filled_queue(
    client: &aws_sdk_sqs::Client,
    prefix: &str,
    vt: u64,
    messages: usize,
) -> String {
    let name = format!("{prefix}-{}-{}", std::process::id(), fastrand::u32(..));
    let url = client
        .create_queue()
        .queue_name(&name)
        .attributes(QueueAttributeName::VisibilityTimeout, vt.to_string())
        .send()
        .await
        .unwrap()
        .queue_url
        .unwrap();
    fill(client, &url, messages).await;
    url
}

/// Until nothing is left on the server, polled directly every `poll` (not through the proxy, not the
/// consumer, so measuring costs the consumer nothing); panics with the consumer's log after 10 min.
async fn wait_drained(
    client: &aws_sdk_sqs::Client,
    url: &str,
    log: &tempfile::NamedTempFile,
    what: &str,
    poll: Duration,
) {
    let deadline = Instant::now() + Duration::from_mins(10);
    loop {
        tokio::time::sleep(poll).await;
        if queue_len(client, url).await == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not finish; log:\n{}",
            std::fs::read_to_string(log.path()).unwrap_or_default()
        );
    }
}

/// "debug" or "release", for the tables' headers.
fn build_kind() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

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
    out.attributes().map_or(u64::MAX, |a| {
        a.values().filter_map(|v| v.parse::<u64>().ok()).sum()
    })
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

fn print_table(runs: &[Run]) {
    let build = build_kind();
    println!(
        "\nhandler: log-normal, P50 20 ms, P99 100 ms; every SQS request delayed 5-15 ms by a proxy in front of fauxqs; qc-worker: {build} build\n"
    );
    println!(
        "| consumer | C | N | drain | ideal N·mean/C | drain / ideal | SQS requests / msg (receive + delete) | CPU / msg | peak RSS |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in runs {
        println!(
            "| {} | {} | {} | {:.2} s | {:.2} s | {:.3} | {:.3} ({:.3} + {:.3}) | {:.1} µs | {:.1} MiB |",
            r.consumer,
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

/// The handler: answers 200 after a log-normal time (P50 20 ms, P99 100 ms: σ = ln 5 / 2.326),
/// and sums the times it drew.
struct Handler {
    url: String,
    calls: Arc<AtomicU64>,
    micros: Arc<AtomicU64>,
}

impl Handler {
    async fn start() -> Handler {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/messages", listener.local_addr().unwrap());
        let calls = Arc::new(AtomicU64::new(0));
        let micros = Arc::new(AtomicU64::new(0));
        let (c, m) = (calls.clone(), micros.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (c, m) = (c.clone(), m.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (c, m) = (c.clone(), m.clone());
                        async move {
                            // A batch call (a JSON array of events or bodies) counts its items;
                            // it takes one handler time, as one bulk write does.
                            let batch = req
                                .headers()
                                .get("content-type")
                                .is_some_and(|v| v.as_bytes().ends_with(b"batch+json"));
                            let items = if batch {
                                use http_body_util::BodyExt as _;
                                let body = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(http_body_util::Collected::to_bytes);
                                body.ok()
                                    .and_then(|b| {
                                        serde_json::from_slice::<Vec<serde_json::Value>>(&b).ok()
                                    })
                                    .map_or(1, |v| v.len() as u64)
                            } else {
                                1
                            };
                            let t = handler_time();
                            c.fetch_add(items, Ordering::Relaxed);
                            m.fetch_add(t.as_micros() as u64, Ordering::Relaxed);
                            tokio::time::sleep(t).await;
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Handler { url, calls, micros }
    }

    fn reset(&self) {
        self.calls.store(0, Ordering::Relaxed);
        self.micros.store(0, Ordering::Relaxed);
    }

    /// Calls and the sum of the times drawn since the last reset.
    fn totals(&self) -> (u64, Duration) {
        (
            self.calls.load(Ordering::Relaxed),
            Duration::from_micros(self.micros.load(Ordering::Relaxed)),
        )
    }
}

/// One draw of the handler time: exp(ln 20 ms + σ·z), z standard normal (Box-Muller).
fn handler_time() -> Duration {
    let sigma = 5f64.ln() / 2.326;
    let (u1, u2) = (fastrand::f64().max(1e-12), fastrand::f64());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    Duration::from_secs_f64(0.020 * (sigma * z).exp())
}

/// A loopback HTTP/1.1 proxy in front of the SQS server: each request is held 5-15 ms (uniform)
/// before it is forwarded, and counted by its `x-amz-target`; answers flow back untouched.
struct LatencyProxy {
    url: String,
    counts: Arc<Mutex<HashMap<String, u64>>>,
}

impl LatencyProxy {
    async fn start(upstream: String) -> LatencyProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let c = counts.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let (c, upstream) = (c.clone(), upstream.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                    });
                    let mut buf: Vec<u8> = Vec::new();
                    let mut chunk = vec![0u8; 16 * 1024];
                    loop {
                        // One request: the head, then Content-Length bytes of body.
                        let head_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            match client_read.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                        let header = |name: &str| {
                            head.lines().find_map(|l| {
                                l.strip_prefix(name)
                                    .and_then(|v| v.strip_prefix(':'))
                                    .map(|v| v.trim().to_string())
                            })
                        };
                        let len: usize = header("content-length")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        let target = header("x-amz-target").unwrap_or_default();
                        while buf.len() < head_end + len {
                            match client_read.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let request: Vec<u8> = buf.drain(..head_end + len).collect();
                        // The original spelling of the action (the head was lower-cased).
                        let action = target
                            .strip_prefix("amazonsqs.")
                            .map(|a| format!("AmazonSQS.{}", canonical_action(a)))
                            .unwrap_or(target);
                        *c.lock().unwrap().entry(action).or_insert(0) += 1;
                        tokio::time::sleep(Duration::from_micros(fastrand::u64(5_000..15_000)))
                            .await;
                        if server_write.write_all(&request).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        LatencyProxy { url, counts }
    }

    fn reset(&self) {
        self.counts.lock().unwrap().clear();
    }

    fn counts(&self) -> HashMap<String, u64> {
        self.counts.lock().unwrap().clone()
    }
}

/// The CamelCase name of a lower-cased SQS action.
fn canonical_action(lower: &str) -> String {
    [
        "ReceiveMessage",
        "DeleteMessageBatch",
        "DeleteMessage",
        "ChangeMessageVisibilityBatch",
        "ChangeMessageVisibility",
        "GetQueueAttributes",
        "GetQueueUrl",
    ]
    .iter()
    .find(|a| a.eq_ignore_ascii_case(lower))
    .map_or_else(|| lower.to_string(), std::string::ToString::to_string)
}

/// Heartbeat benchmark: N = rounds × C messages whose handler takes 3 × VisibilityTimeout,
/// through the same latency proxy; heartbeat calls per message (ChangeMessageVisibility and
/// ChangeMessageVisibilityBatch requests counted by the proxy during the drain), extensions per message
/// (the worker's own counter), and messages handled more than once (a lapsed lease). The build before
/// the change runs beside this one when `QC_BENCH_BEFORE_WORKER` names its qc-worker binary.
mod heartbeats {
    use super::{
        Arc, Bytes, Command, Duration, Full, HashMap, Incoming, Infallible, Instant, LatencyProxy,
        Mutex, Request, Response, Stdio, build_kind, env_or, filled_queue, free_port, support,
        wait_drained,
    };

    struct HbRun {
        consumer: String,
        concurrency: usize,
        messages: usize,
        interval: String,
        drain: Duration,
        ideal: Duration,
        single: u64,
        batched: u64,
        extensions: Option<f64>,
        /// The worker's failed extensions (retried in time or not) and leases lost.
        beat_failures: Option<f64>,
        leases_lost: Option<f64>,
        handled_twice: usize,
        handler_calls: usize,
    }

    enum HbConsumer {
        /// A qc-worker binary and its label.
        Worker(String, String),
        /// bbc/sqs-consumer's bench script and mode, with its own heartbeat (whole seconds).
        Bbc(String, &'static str),
    }

    pub async fn bench(
        client: &aws_sdk_sqs::Client,
        proxy: &LatencyProxy,
        endpoint: &str,
        bbc: Option<&str>,
    ) {
        let vt: u64 = env_or("QC_BENCH_HB_VT", "2").parse().unwrap();
        let rounds: usize = env_or("QC_BENCH_HB_ROUNDS", "2").parse().unwrap();
        let concurrencies: Vec<usize> = env_or("QC_BENCH_HB_CONCURRENCY", "10,100")
            .split(',')
            .map(|c| c.trim().parse().unwrap())
            .collect();
        // auto = VT/3; VT/2 is the Amazon SQS Developer Guide's example cadence.
        let half = format!("{}ms", vt * 500);
        let intervals_env = env_or("QC_BENCH_HB_INTERVALS", &format!("auto,{half}"));
        let intervals: Vec<&str> = intervals_env.split(',').map(str::trim).collect();
        let handler_time = Duration::from_secs(3 * vt);
        let handler = LongHandler::start(handler_time).await;
        let mut consumers: Vec<HbConsumer> = super::before_workers()
            .into_iter()
            .map(|(bin, label)| HbConsumer::Worker(bin, label))
            .collect();
        consumers.push(HbConsumer::Worker(
            env!("CARGO_BIN_EXE_qc-worker").to_string(),
            "qc-worker this build".to_string(),
        ));
        if let Some(script) = bbc {
            for mode in ["batch10", "handleMessageBatch"] {
                consumers.push(HbConsumer::Bbc(script.to_string(), mode));
            }
        }
        let mut runs = Vec::new();
        for &c in &concurrencies {
            let n = c * rounds;
            for consumer in &consumers {
                let ivs: Vec<String> = match consumer {
                    HbConsumer::Worker(..) => intervals
                        .iter()
                        .map(std::string::ToString::to_string)
                        .collect(),
                    // sqs-consumer takes whole seconds below the timeout: VT/2 rounded up.
                    HbConsumer::Bbc(..) => vec![format!("{}s", vt.div_ceil(2))],
                };
                for interval in ivs {
                    let run = one(
                        client, proxy, endpoint, &handler, consumer, c, n, vt, &interval,
                    )
                    .await;
                    eprintln!(
                        "heartbeats {} C={c} interval {interval}: {:.3} heartbeat calls/msg, {} handled twice, drain {:.2}s",
                        run.consumer,
                        (run.single + run.batched) as f64 / n as f64,
                        run.handled_twice,
                        run.drain.as_secs_f64()
                    );
                    runs.push(run);
                }
            }
        }
        print(&runs, vt, handler_time);
    }

    #[allow(clippy::too_many_arguments)]
    async fn one(
        client: &aws_sdk_sqs::Client,
        proxy: &LatencyProxy,
        _endpoint: &str,
        handler: &LongHandler,
        consumer: &HbConsumer,
        concurrency: usize,
        messages: usize,
        vt: u64,
        interval: &str,
    ) -> HbRun {
        let url = filled_queue(client, &format!("bench-hb-c{concurrency}"), vt, messages).await;
        proxy.reset();
        handler.reset();
        let log = tempfile::NamedTempFile::new().unwrap();
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        let started = Instant::now();
        let mut child = match consumer {
            HbConsumer::Worker(bin, _) => Command::new(bin)
                .args(["--queue-url", &url, "--endpoint-url", &proxy.url])
                .args(["--concurrency", &concurrency.to_string()])
                .args(["--heartbeat-interval", interval])
                .args(["--timeout", &format!("{}s", 10 * vt)])
                .args(["--metrics-addr", &metrics_addr])
                .args(["--http-url", &handler.url])
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log.reopen().unwrap())
                .spawn()
                .unwrap(),
            HbConsumer::Bbc(script, mode) => Command::new("node")
                .arg(script)
                .env("QUEUE_URL", &url)
                .env("SQS_ENDPOINT", &proxy.url)
                .env("HANDLER_URL", &handler.url)
                .env("MODE", mode)
                .env("CONSUMERS", concurrency.div_ceil(10).max(1).to_string())
                .env("HEARTBEAT_INTERVAL", interval.trim_end_matches('s'))
                .env("VISIBILITY_TIMEOUT", vt.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log.reopen().unwrap())
                .spawn()
                .unwrap(),
        };
        wait_drained(
            client,
            &url,
            &log,
            "heartbeat drain",
            Duration::from_millis(20),
        )
        .await;
        let drain = started.elapsed();
        // Counted before the consumer is stopped: a shutdown's releases are not heartbeats.
        let counts = proxy.counts();
        let metrics = match consumer {
            HbConsumer::Worker(..) => support::http_get(&metrics_addr, "/metrics")
                .await
                .map(|(_, text)| text),
            HbConsumer::Bbc(..) => None,
        };
        let metric = |name: &str| {
            metrics
                .as_deref()
                .and_then(|text| support::parse_metric(text, name))
        };
        let extensions = metric("qc_worker_heartbeats_total");
        let beat_failures = metric("qc_worker_heartbeat_failures_total");
        let leases_lost = metric("qc_worker_heartbeat_leases_lost_total");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let _ = child.wait();
        let _ = client.delete_queue().queue_url(&url).send().await;
        let (calls, distinct) = handler.totals();
        if calls > distinct {
            // A lapsed lease: show why (the consumer's warnings).
            let text = std::fs::read_to_string(log.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().take(30).collect();
            eprintln!(
                "{} messages handled twice; first log lines:\n{}",
                calls - distinct,
                lines.join("\n")
            );
        }
        let action = |a: &str| *counts.get(&format!("AmazonSQS.{a}")).unwrap_or(&0);
        HbRun {
            consumer: match consumer {
                HbConsumer::Worker(_, label) => label.clone(),
                HbConsumer::Bbc(_, mode) => format!("sqs-consumer {mode}"),
            },
            concurrency,
            messages,
            interval: interval.to_string(),
            drain,
            ideal: Duration::from_secs(3 * vt) * (messages.div_ceil(concurrency) as u32),
            single: action("ChangeMessageVisibility"),
            batched: action("ChangeMessageVisibilityBatch"),
            extensions,
            beat_failures,
            leases_lost,
            handled_twice: calls - distinct,
            handler_calls: calls,
        }
    }

    fn print(runs: &[HbRun], vt: u64, handler: Duration) {
        let build = build_kind();
        println!(
            "\nheartbeats: VisibilityTimeout {vt}s, handler {:.0}s (3 × VT), N = rounds × C; every SQS request delayed 5-15 ms by a proxy in front of fauxqs; this qc-worker: {build} build\n",
            handler.as_secs_f64()
        );
        println!(
            "| consumer | C | N | heartbeat interval | heartbeat calls / msg (single + batch) | extensions / msg | failed extensions / leases lost | handled twice | handler calls | drain / ideal |"
        );
        println!("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|");
        for r in runs {
            let n = r.messages as f64;
            println!(
                "| {} | {} | {} | {} | {:.3} ({} + {}) | {} | {} | {} | {} | {:.2} |",
                r.consumer,
                r.concurrency,
                r.messages,
                r.interval,
                (r.single + r.batched) as f64 / n,
                r.single,
                r.batched,
                r.extensions
                    .map_or("-".to_string(), |e| format!("{:.2}", e / n)),
                match (r.beat_failures, r.leases_lost) {
                    (Some(f), Some(l)) => format!("{f} / {l}"),
                    _ => "-".to_string(),
                },
                r.handled_twice,
                r.handler_calls,
                r.drain.as_secs_f64() / r.ideal.as_secs_f64()
            );
        }
    }

    /// An HTTP handler that answers 200 after a fixed time and counts calls per body.
    struct LongHandler {
        url: String,
        bodies: Arc<Mutex<HashMap<Bytes, usize>>>,
    }

    impl LongHandler {
        async fn start(delay: Duration) -> LongHandler {
            use http_body_util::BodyExt;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/messages", listener.local_addr().unwrap());
            let bodies: Arc<Mutex<HashMap<Bytes, usize>>> = Arc::default();
            let b = bodies.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let b = b.clone();
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                            let b = b.clone();
                            async move {
                                let body = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(http_body_util::Collected::to_bytes)
                                    .unwrap_or_default();
                                *b.lock().unwrap().entry(body).or_insert(0) += 1;
                                tokio::time::sleep(delay).await;
                                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
            LongHandler { url, bodies }
        }

        fn reset(&self) {
            self.bodies.lock().unwrap().clear();
        }

        /// Calls and distinct bodies since the last reset.
        fn totals(&self) -> (usize, usize) {
            let b = self.bodies.lock().unwrap();
            (b.values().sum(), b.len())
        }
    }
}
