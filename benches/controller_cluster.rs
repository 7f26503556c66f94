//! The controller at scale on a real Kubernetes control plane (issue 42 item 5): N QueueConsumers on Q
//! queues of moto (each with a DLQ), one `qc-operator run` process (the cargo-built binary, cluster admin,
//! no leader election) against kube-apiserver 1.37 with etcd and the controller-manager (which makes a
//! ReplicaSet for every worker Deployment). Prints one table:
//!
//! - catch-up: from the controller's start until every QueueConsumer's status has caught up with its
//!   generation (first reconcile, Deployment written, status written);
//! - steady state: the controller's API requests per minute over `QC_BENCH_STEADY` seconds (from the API
//!   server's audit log: every request whose User-Agent is the operator's), reads and writes apart;
//! - reconcile latency: `QC_BENCH_CHANGES` spec changes spread over the steady window, each timed from
//!   the change's write to the status showing its generation (`observedGeneration`), seen through a watch;
//!   p50 / p99 / max;
//! - restart: the controller stopped (SIGTERM), every QueueConsumer's spec changed meanwhile, the
//!   controller started again; the time until every status shows its new generation;
//! - the controller's resident memory (VmRSS at the end of each phase, VmHWM: its peak).
//!
//! Run by `bash scripts/bench-cluster`, which builds the control plane (cached), starts a fresh one and a
//! moto per scale, and names them in `QC_TEST_CLUSTER_KUBECONFIG`, `QC_TEST_CLUSTER_AUDIT_LOG` and
//! `AWS_ENDPOINT_URL_SQS` / `AWS_ENDPOINT_URL_CLOUDWATCH` (so the manifests name no endpoint). Knobs:
//! `QC_BENCH_N` (1000), `QC_BENCH_QUEUES` (100), `QC_BENCH_STEADY` (120 s), `QC_BENCH_CHANGES` (100),
//! `QC_BENCH_POLL` (15s), `QC_BENCH_OPERATOR` (the qc-operator binary to run: default this build's, e.g. an
//! earlier commit's or a release build to compare). Without `--bench` (cargo test) it does nothing.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Seek};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use qc::api::QueueConsumer;
use serde_json::json;

/// QueueConsumers per namespace, as platform clusters hold them: many teams, a few consumers each.
const PER_NAMESPACE: usize = 100;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn namespace_of(i: usize) -> String {
    format!("bench-{}", i / PER_NAMESPACE)
}

fn name_of(i: usize) -> String {
    format!("qc-{i}")
}

fn manifest(i: usize, url: &str, poll: &str, concurrency: u32) -> serde_json::Value {
    json!({
        "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
        "metadata": {"name": name_of(i), "namespace": namespace_of(i)},
        "spec": {
            "queue": {"url": url, "region": "us-east-1"},
            "processing": {"p99": "2s", "concurrency": concurrency},
            "handler": {"http": {"port": 8080}},
            "template": {"spec": {"containers": [{"name": "app", "image": "example.org/app:1",
                "ports": [{"containerPort": 8080}]}]}},
            "scaling": {"pollInterval": poll},
            // No DLQ alarm: a catch-up bounded by moto's PutMetricAlarm would measure moto.
            "deadLetter": {"alarm": false}
        }
    })
}

/// A field of /proc/PID/status in MiB (VmRSS, VmHWM).
fn status_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

async fn create_queues(q: usize) -> Vec<String> {
    let conf = qc::aws::sdk_config(Some("us-east-1"), None).await;
    let sqs = aws_sdk_sqs::Client::new(&conf);
    let run = std::process::id();
    futures::stream::iter(0..q)
        .map(|i| {
            let sqs = sqs.clone();
            async move {
                let dlq = sqs
                    .create_queue()
                    .queue_name(format!("bench-{run}-{i}-dlq"))
                    .attributes(
                        aws_sdk_sqs::types::QueueAttributeName::MessageRetentionPeriod,
                        "1209600",
                    )
                    .send()
                    .await
                    .unwrap()
                    .queue_url
                    .unwrap();
                let arn = sqs
                    .get_queue_attributes()
                    .queue_url(&dlq)
                    .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
                    .send()
                    .await
                    .unwrap()
                    .attributes
                    .unwrap()[&aws_sdk_sqs::types::QueueAttributeName::QueueArn]
                    .clone();
                sqs.create_queue()
                    .queue_name(format!("bench-{run}-{i}"))
                    .attributes(
                        aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
                        "30",
                    )
                    .attributes(
                        aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy,
                        format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"5"}}"#),
                    )
                    .send()
                    .await
                    .unwrap()
                    .queue_url
                    .unwrap()
            }
        })
        .buffered(8)
        .collect()
        .await
}

/// Applies `i`'s manifest with `concurrency`, 16 at a time; the generations written, by "ns/name".
async fn apply_all(
    client: &kube::Client,
    n: usize,
    urls: &[String],
    poll: &str,
    concurrency: u32,
) -> HashMap<String, i64> {
    futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let doc = manifest(i, &urls[i % urls.len()], poll, concurrency);
            async move {
                let api: Api<QueueConsumer> = Api::namespaced(client, &namespace_of(i));
                let qc = api
                    .patch(
                        &name_of(i),
                        &PatchParams::apply("bench"),
                        &Patch::Apply(&doc),
                    )
                    .await
                    .unwrap();
                (
                    format!("{}/{}", namespace_of(i), name_of(i)),
                    qc.metadata.generation.unwrap_or(0),
                )
            }
        })
        .buffer_unordered(16)
        .collect()
        .await
}

/// What the bench's own watch of every QueueConsumer has seen: the observedGeneration of each, and the
/// generations it waits for (with when they were written).
#[derive(Default)]
struct Seen {
    observed: HashMap<String, i64>,
    waiting: HashMap<String, (i64, Instant)>,
    latencies: Vec<Duration>,
}

fn spawn_watch(client: kube::Client, seen: Arc<Mutex<Seen>>) {
    tokio::spawn(async move {
        let api: Api<QueueConsumer> = Api::all(client);
        let stream = watcher(api, watcher::Config::default()).touched_objects();
        futures::pin_mut!(stream);
        while let Ok(Some(qc)) = stream.try_next().await {
            let key = format!(
                "{}/{}",
                qc.metadata.namespace.clone().unwrap_or_default(),
                qc.metadata.name.clone().unwrap_or_default()
            );
            let Some(g) = qc.status.as_ref().and_then(|s| s.observed_generation) else {
                continue;
            };
            let mut s = seen.lock().unwrap();
            s.observed.insert(key.clone(), g);
            if let Some(&(want, at)) = s.waiting.get(&key)
                && g >= want
            {
                s.waiting.remove(&key);
                s.latencies.push(at.elapsed());
            }
        }
    });
}

/// Waits until every QueueConsumer in `want` shows at least its generation; how long that took.
async fn until_current(
    seen: &Arc<Mutex<Seen>>,
    want: &HashMap<String, i64>,
    limit: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    loop {
        let behind = {
            let s = seen.lock().unwrap();
            want.iter()
                .filter(|(k, g)| s.observed.get(*k).is_none_or(|o| o < g))
                .count()
        };
        if behind == 0 {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            eprintln!(
                "  {behind} of {} still behind after {} s",
                want.len(),
                limit.as_secs()
            );
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The operator's requests in the audit log from byte `from` on: by "verb resource[/subresource]".
fn operator_requests(log: &str, from: u64) -> (BTreeMap<String, u64>, u64) {
    let mut f = std::fs::File::open(log).unwrap();
    let end = f.seek(std::io::SeekFrom::End(0)).unwrap();
    f.seek(std::io::SeekFrom::Start(from)).unwrap();
    let mut counts = BTreeMap::new();
    for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if !e["userAgent"]
            .as_str()
            .is_some_and(|ua| ua.starts_with("qc-operator/"))
        {
            continue;
        }
        let key = format!(
            "{} {}{}",
            e["verb"].as_str().unwrap_or(""),
            e["objectRef"]["resource"].as_str().unwrap_or(""),
            e["objectRef"]["subresource"]
                .as_str()
                .map(|s| format!("/{s}"))
                .unwrap_or_default()
        );
        *counts.entry(key).or_insert(0) += 1;
    }
    (counts, end)
}

fn log_size(log: &str) -> u64 {
    std::fs::metadata(log).map_or(0, |m| m.len())
}

/// The operator's status writes so far by cause (`qc_status_writes_total{cause}` on its /metrics); empty
/// for an operator from before the label, or when /metrics does not answer.
fn status_writes(metrics: &str) -> BTreeMap<String, u64> {
    use std::io::{Read, Write};
    let mut out = BTreeMap::new();
    let Ok(mut conn) = std::net::TcpStream::connect(metrics) else {
        return out;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = write!(conn, "GET /metrics HTTP/1.0\r\nHost: {metrics}\r\n\r\n");
    let mut text = String::new();
    let _ = conn.read_to_string(&mut text);
    for line in text.lines() {
        if let Some((cause, n)) = line
            .strip_prefix("qc_status_writes_total{cause=\"")
            .and_then(|rest| rest.split_once("\"} "))
        {
            out.insert(cause.to_string(), n.trim().parse().unwrap_or(0));
        }
    }
    out
}

/// QC_BENCH_OPERATOR: another build of qc-operator to run (an earlier commit's, a release or musl build).
fn other_operator() -> Option<String> {
    std::env::var("QC_BENCH_OPERATOR").ok()
}

fn start_operator(kubeconfig: &str, metrics: &str, log: &std::path::Path) -> tokio::process::Child {
    let operator =
        other_operator().unwrap_or_else(|| env!("CARGO_BIN_EXE_qc-operator").to_string());
    tokio::process::Command::new(operator)
        .args([
            "run",
            "--metrics-addr",
            metrics,
            "--worker-image",
            "example.org/qc:bench",
            "--log-format",
            "text",
        ])
        .env("KUBECONFIG", kubeconfig)
        .env(
            "RUST_LOG",
            std::env::var("QC_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap(),
        )
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[allow(clippy::too_many_lines)]
async fn bench(n: usize, q: usize, poll: &str, steady: Duration, changes: usize) {
    let kubeconfig = std::env::var("QC_TEST_CLUSTER_KUBECONFIG").unwrap();
    let audit = std::env::var("QC_TEST_CLUSTER_AUDIT_LOG").unwrap();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    // The bench's own writes go fast; the default client has no rate limit either.
    config.read_timeout = Some(Duration::from_mins(5));
    let client = kube::Client::try_from(config).unwrap();

    // The CRD, the namespaces, the queues.
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_saphyr::from_str(include_str!("../crds/queueconsumers.sqs.consumers.dev.yaml")).unwrap();
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    crds.patch(
        "queueconsumers.sqs.consumers.dev",
        &PatchParams::apply("bench").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for i in (0..n).step_by(PER_NAMESPACE) {
        let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace_of(i)}}),
        )
        .unwrap();
        let _ = namespaces.create(&PostParams::default(), &ns).await;
    }
    let started = Instant::now();
    let urls = create_queues(q).await;
    eprintln!(
        "{n} QueueConsumers on {q} queues (+{q} DLQs): queues made in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let mut want = apply_all(&client, n, &urls, poll, 1).await;
    let created_in = started.elapsed();
    eprintln!(
        "  {n} QueueConsumers applied in {:.1} s",
        created_in.as_secs_f64()
    );

    let seen = Arc::new(Mutex::new(Seen::default()));
    spawn_watch(client.clone(), seen.clone());
    let dir = tempfile::tempdir().unwrap();
    let oplog = dir.path().join("qc-operator.log");
    let metrics = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let limit = Duration::from_secs(env_or("QC_BENCH_CATCHUP_LIMIT", 1800));

    // Catch-up.
    let mut op = start_operator(&kubeconfig, &metrics, &oplog);
    let pid = op.id().unwrap();
    let catch_up = until_current(&seen, &want, limit).await;
    let rss_catch_up = status_mib(pid, "VmRSS:");
    eprintln!("  catch-up: {catch_up:?}, RSS {rss_catch_up:.1} MiB");

    // Steady state: settle one poll interval and a half, then count; changes spread over the window.
    let poll_secs = poll.trim_end_matches('s').parse::<u64>().unwrap_or(15);
    tokio::time::sleep(Duration::from_secs(poll_secs * 3 / 2)).await;
    let mark = log_size(&audit);
    let writes_before = status_writes(&metrics);
    let window = Instant::now();
    let gap = steady / u32::try_from(changes.max(1)).unwrap();
    let mut changed = 0;
    let mut concurrency = 2;
    while window.elapsed() < steady {
        if changed < changes {
            let i = (changed * 7919) % n;
            let api: Api<QueueConsumer> = Api::namespaced(client.clone(), &namespace_of(i));
            let doc = manifest(i, &urls[i % urls.len()], poll, concurrency);
            let at = Instant::now();
            let qc = api
                .patch(
                    &name_of(i),
                    &PatchParams::apply("bench"),
                    &Patch::Apply(&doc),
                )
                .await
                .unwrap();
            let key = format!("{}/{}", namespace_of(i), name_of(i));
            let g = qc.metadata.generation.unwrap_or(0);
            want.insert(key.clone(), g);
            seen.lock().unwrap().waiting.insert(key, (g, at));
            changed += 1;
            concurrency += 1;
        }
        tokio::time::sleep(gap).await;
    }
    let minutes = window.elapsed().as_secs_f64() / 60.0;
    let (requests, _) = operator_requests(&audit, mark);
    let writes_after = status_writes(&metrics);
    let rss_steady = status_mib(pid, "VmRSS:");
    // Let the last changes land before reading the latencies.
    let _ = until_current(&seen, &want, Duration::from_mins(2)).await;
    let mut latencies = std::mem::take(&mut seen.lock().unwrap().latencies);
    latencies.sort();

    // Restart: stopped, every spec changed meanwhile, started again.
    let peak_first = status_mib(pid, "VmHWM:");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = op.wait().await;
    let started = Instant::now();
    let changed_all = apply_all(&client, n, &urls, poll, 5000).await;
    let changed_in = started.elapsed();
    want.extend(changed_all);
    let mut op = start_operator(&kubeconfig, &metrics, &oplog);
    let pid = op.id().unwrap();
    let restart = until_current(&seen, &want, limit).await;
    let rss_restart = status_mib(pid, "VmRSS:");
    let peak = status_mib(pid, "VmHWM:");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = op.wait().await;

    let reads: u64 = requests
        .iter()
        .filter(|(k, _)| k.starts_with("get ") || k.starts_with("list ") || k.starts_with("watch "))
        .map(|(_, v)| v)
        .sum();
    let total: u64 = requests.values().sum();
    let secs = |d: Option<Duration>| {
        d.map_or("not within the limit".into(), |d| {
            format!("{:.1} s", d.as_secs_f64())
        })
    };
    println!();
    println!(
        "#### {n} QueueConsumers on {q} queues (+{q} DLQs), poll {poll}, alarms off; kube-apiserver v1.37.2; load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    if let Some(operator) = other_operator() {
        println!();
        println!("qc-operator: {operator}");
    }
    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| QueueConsumers applied (bench, 16 at a time) | {:.1} s |",
        created_in.as_secs_f64()
    );
    println!(
        "| catch-up: start to every status current | {} |",
        secs(catch_up)
    );
    println!("| controller RSS after catch-up | {rss_catch_up:.1} MiB |");
    println!(
        "| steady state: controller API requests / minute | {:.0} ({:.0} reads, {:.0} writes) over {:.0} s |",
        total as f64 / minutes,
        reads as f64 / minutes,
        (total - reads) as f64 / minutes,
        minutes * 60.0
    );
    for (k, v) in &requests {
        println!("| … {k} / minute | {:.1} |", *v as f64 / minutes);
    }
    println!(
        "| of which spec changes made by the bench in the window | {changed} ({:.1} / minute) |",
        changed as f64 / minutes
    );
    for (cause, n) in &writes_after {
        let was = writes_before.get(cause).copied().unwrap_or(0);
        println!(
            "| … status writes caused by {cause} / minute | {:.1} |",
            n.saturating_sub(was) as f64 / minutes
        );
    }
    println!(
        "| reconcile latency, spec change to observedGeneration (n = {}) | p50 {:.2} s, p99 {:.2} s, max {:.2} s |",
        latencies.len(),
        percentile(&latencies, 0.50).as_secs_f64(),
        percentile(&latencies, 0.99).as_secs_f64(),
        latencies.last().copied().unwrap_or_default().as_secs_f64()
    );
    println!("| controller RSS at steady state | {rss_steady:.1} MiB |");
    println!("| controller peak RSS (VmHWM), first run | {peak_first:.1} MiB |");
    println!(
        "| restart: every spec changed while stopped (bench, 16 at a time) | {:.1} s |",
        changed_in.as_secs_f64()
    );
    println!(
        "| restart: start to every status current | {} |",
        secs(restart)
    );
    println!(
        "| controller RSS after the restart's catch-up / peak | {rss_restart:.1} / {peak:.1} MiB |"
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    for var in [
        "QC_TEST_CLUSTER_KUBECONFIG",
        "QC_TEST_CLUSTER_AUDIT_LOG",
        "AWS_ENDPOINT_URL_SQS",
    ] {
        assert!(
            std::env::var(var).is_ok(),
            "{var} is not set: run `bash scripts/bench-cluster` (it starts the control plane and moto)"
        );
    }
    let n: usize = env_or("QC_BENCH_N", 1000);
    let q: usize = env_or("QC_BENCH_QUEUES", 100);
    let poll = std::env::var("QC_BENCH_POLL").unwrap_or_else(|_| "15s".into());
    let steady = Duration::from_secs(env_or("QC_BENCH_STEADY", 120));
    let changes: usize = env_or("QC_BENCH_CHANGES", 100);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench(n, q.clamp(1, n), &poll, steady, changes));
}
