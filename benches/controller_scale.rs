//! The controller at scale: N QueueConsumers on Q queues (each queue holding a message and with its
//! own dead-letter queue holding one, so both queues' oldest-message ages are read from CloudWatch and
//! every QueueConsumer keeps a DLQ alarm), the in-memory Kubernetes API, and the real `qc-operator run`
//! binary for a catch-up and then three poll intervals. Prints one table row per interval. The
//! in-memory API runs in this process and is served over loopback HTTP; the controller is the binary
//! in a process of its own, reaching it through a kubeconfig, so its RSS and CPU are its own (read
//! from /proc) and its AWS calls and reconciles are read from its /metrics. Run by
//! `bash scripts/bench-controller`, which starts SQS (fauxqs) and CloudWatch (moto) and names them in
//! AWS_ENDPOINT_URL_SQS and AWS_ENDPOINT_URL_CLOUDWATCH, which the SDK (so the controller) honours;
//! the manifests name no endpoint. Knobs: QC_BENCH_SCALES ("100:100,1000:1000,10000:1000" as
//! consumers:queues), QC_BENCH_POLL (15s), QC_BENCH_INTERVALS (3), QC_BENCH_CATCHUP_INTERVALS (40),
//! QC_BENCH_CONCURRENCY (--reconcile-concurrency), QC_BENCH_AWS_IN_FLIGHT (--aws-max-in-flight),
//! QC_BENCH_ALARMS (1; 0: no DLQ alarms), QC_BENCH_LOG (the controller's RUST_LOG, warn; its log is
//! qc-operator-bench.log in the temporary directory), QC_BENCH_BUSY (0; 1: busy queues, one message
//! more in every source queue at the start of each steady interval, so every QueueConsumer's counts
//! move at every poll and its status writes are bounded by the once-a-minute refresh of the counts).
//! Without `--bench` (cargo test) it does nothing.

#[path = "../tests/fake_kube/mod.rs"]
mod fake_kube;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_sqs::types::QueueAttributeName;
use fake_kube::{FakeKube, PODS, QUEUE_CONSUMERS};
use futures::StreamExt;
use http_body_util::BodyExt;
use qc::controller::run::DEFAULT_RECONCILE_CONCURRENCY;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The namespace of the kubeconfig's context (the controller watches every namespace).
const NS: &str = "bench";
/// QueueConsumers per namespace: platform clusters hold many teams' namespaces, each with a few
/// consumers, and the controller lists a QueueConsumer's pods in its own namespace.
const PER_NAMESPACE: usize = 100;

/// The namespace of the `i`-th QueueConsumer.
fn namespace_of(i: usize) -> String {
    format!("bench-{}", i / PER_NAMESPACE)
}

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM).
fn status_kib(pid: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
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

/// QC_BENCH_BUSY=1: the source queues get a message more at each steady interval.
fn busy_queues() -> bool {
    std::env::var("QC_BENCH_BUSY").is_ok_and(|v| v == "1")
}

async fn send(sqs: &aws_sdk_sqs::Client, url: &str, body: &str) {
    sqs.send_message()
        .queue_url(url)
        .message_body(body)
        .send()
        .await
        .unwrap();
}

fn manifest(name: &str, ns: &str, url: &str, poll: &str) -> serde_json::Value {
    json!({
        "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
        "metadata": {"name": name, "namespace": ns, "generation": 1},
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
fn worker_pod(name: &str, ns: &str, port: u16) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{name}-w0"), "namespace": ns,
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

/// Serve the in-memory API over loopback HTTP/1.1, as an API server would: the controller runs in a
/// process of its own (the real `qc-operator run`) and reaches it through a kubeconfig.
async fn serve_fake(fake: FakeKube) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let fake = fake.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let fake = fake.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let bytes = body
                                .collect()
                                .await
                                .map(http_body_util::Collected::to_bytes)
                                .unwrap_or_default();
                            let req = http::Request::from_parts(
                                parts,
                                kube::client::Body::from(bytes.to_vec()),
                            );
                            Ok::<_, Infallible>(fake.serve(req).await)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    port
}

fn kubeconfig(port: u16) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(
        &mut f,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: bench\n  user:\n    token: bench\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: bench\n    namespace: {NS}\ncurrent-context: fake\n"
        )
        .as_bytes(),
    )
    .unwrap();
    f
}

/// The controller's /metrics text (empty while it does not answer).
async fn controller_metrics(addr: std::net::SocketAddr) -> String {
    let Ok(Ok(mut sock)) =
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr)).await
    else {
        return String::new();
    };
    let req = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if sock.write_all(req.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), sock.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// What the controller's /metrics say: AWS calls by action (and throttled), reconciles, errors.
#[derive(Default, Clone)]
struct Counters {
    aws: BTreeMap<String, u64>,
    throttled: u64,
    reconciles: u64,
    errors: BTreeMap<String, u64>,
}

fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

fn counters(text: &str) -> Counters {
    let mut c = Counters::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        let v = v as u64;
        if series.starts_with("qc_aws_requests_total{") {
            if let Some(action) = label(series, "action") {
                *c.aws.entry(action.to_string()).or_default() += v;
            }
            if label(series, "outcome") == Some("throttled") {
                c.throttled += v;
            }
        } else if series == "qc_reconciles_total" {
            c.reconciles = v;
        } else if series.starts_with("qc_reconcile_errors_total{")
            && let Some(reason) = label(series, "reason")
        {
            *c.errors.entry(reason.to_string()).or_default() += v;
        }
    }
    c
}

/// The controller process's CPU time (user + system) so far.
fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 1000 / clock_ticks())
}

fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
            .unwrap_or(100)
    })
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[derive(Default, Clone)]
struct Row {
    label: String,
    length: Duration,
    wall: Duration,
    reconciles: u64,
    distinct: usize,
    aws: BTreeMap<String, u64>,
    throttled: u64,
    kube_requests: usize,
    pod_lists: usize,
    kube_writes: usize,
    /// Writes by what they wrote: status, Deployment, Event, other (finalizers, pods).
    writes_by: BTreeMap<&'static str, usize>,
    scrapes: u64,
    max_gap: Duration,
    cpu: Duration,
    rss_kib: u64,
}

/// The name of the QueueConsumer a request reconciled: each reconcile reads its Deployment once.
fn reconciled(r: &fake_kube::Recorded) -> Option<String> {
    if r.method != "GET" || r.is_watch() {
        return None;
    }
    let (ns, name) = r
        .path
        .strip_prefix("/apis/apps/v1/namespaces/")?
        .split_once("/deployments/")?;
    Some(format!("{ns}/{name}"))
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One scale's figures for the summary across scales.
struct Summary {
    n: usize,
    q: usize,
    alarms: bool,
    steady: Vec<Row>,
    peak_kib: u64,
    settled_kib: u64,
}

#[allow(clippy::too_many_lines)]
async fn scale(n: usize, q: usize, poll: Duration, intervals: usize) -> Summary {
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
        let ns = namespace_of(i);
        fake.create(QUEUE_CONSUMERS, manifest(&name, &ns, &urls[i % q], &poll_s));
        // One worker pod each: the controller lists them every reconcile and scrapes them every interval.
        fake.create_with_status(PODS, worker_pod(&name, &ns, metrics_port));
    }
    fake.clear_requests();
    let api_port = serve_fake(fake.clone()).await;
    let config = kubeconfig(api_port);
    let metrics_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let alarms_on = !std::env::var("QC_BENCH_ALARMS").is_ok_and(|v| v == "0");
    // The real binary, as a Deployment runs it. Its CloudWatch gate is wider than the default (5 a
    // second): moto does not throttle, and the catch-up creates one alarm per QueueConsumer;
    // steady-state calls do not depend on it. QC_BENCH_AWS_IN_FLIGHT: --aws-max-in-flight.
    let log = std::fs::File::create(format!(
        "{}/qc-operator-bench.log",
        std::env::temp_dir().display()
    ))
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args([
            "run",
            "--metrics-addr",
            &metrics_addr.to_string(),
            "--worker-image",
            "qc:bench",
            "--log-format",
            "text",
            "--reconcile-concurrency",
            &env_or("QC_BENCH_CONCURRENCY", DEFAULT_RECONCILE_CONCURRENCY).to_string(),
            "--cloudwatch-requests-per-second",
            "200",
            "--aws-max-in-flight",
            &env_or(
                "QC_BENCH_AWS_IN_FLIGHT",
                qc::aws::sqs::DEFAULT_LIMIT.max_in_flight,
            )
            .to_string(),
        ])
        .env("KUBECONFIG", config.path())
        .env(
            "RUST_LOG",
            std::env::var("QC_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap().to_string();

    let mut rows = Vec::new();
    let mut last_seen: HashMap<String, Instant> = HashMap::new();
    let mut before = Counters::default();
    let mut scrapes_before = 0;
    let mut cpu_before = Duration::ZERO;
    let started = Instant::now();
    // Interval 0 is the catch-up: it ends at the first boundary of the poll interval (counted from
    // the Unix epoch, as the controller places each QueueConsumer's slot in it) after every
    // QueueConsumer has been reconciled and its status written once and, with DLQ alarms on, every
    // alarm is reported in sync in status (its put runs in the background, at moto's pace), bounded at
    // QC_BENCH_CATCHUP_INTERVALS (40) intervals. Then `intervals` whole poll intervals of steady state.
    let catch_up_bound: u32 = env_or("QC_BENCH_CATCHUP_INTERVALS", 40);
    let poll_ms = poll.as_millis() as u64;
    let (mut statuses_at, mut settled_at, mut alarms_at) = (None, None, None);
    let mut end_ms = 0u64;
    // Each row starts where the last one ended (at the boundary), not after the bench's own reading
    // of the controller's /metrics, which takes a while on a loaded machine.
    let mut begin = Instant::now();
    let busy = busy_queues();
    for k in 0..=intervals {
        if busy && k > 0 {
            // In the background: the controller reads each queue at its own slot in the interval.
            let (sqs, urls) = (sqs.clone(), urls.clone());
            tokio::spawn(async move {
                futures::stream::iter(urls)
                    .map(|url| {
                        let sqs = sqs.clone();
                        async move { send(&sqs, &url, "busy").await }
                    })
                    .buffer_unordered(32)
                    .collect::<Vec<()>>()
                    .await;
            });
        }
        let mut row = Row {
            label: if k == 0 {
                "catch-up".into()
            } else {
                format!("steady {k}")
            },
            ..Row::default()
        };
        if k > 0 {
            end_ms += poll_ms;
        }
        let mut seen: HashMap<String, Instant> = HashMap::new();
        // The catch-up ends once every QueueConsumer's first reconcile has written its status.
        let mut status_written = HashSet::<String>::default();
        let mut last_alarm_check = Instant::now();
        loop {
            let now_ms = epoch_ms();
            let nap = if k > 0 || end_ms > 0 {
                Duration::from_millis(end_ms.saturating_sub(now_ms).min(100))
            } else {
                Duration::from_millis(100)
            };
            tokio::time::sleep(nap).await;
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
            if let Ok(Some(exit)) = child.try_wait() {
                panic!(
                    "qc-operator exited ({exit}); see {}/qc-operator-bench.log",
                    std::env::temp_dir().display()
                );
            }
            if k > 0 || end_ms > 0 {
                if epoch_ms() >= end_ms {
                    break;
                }
                continue;
            }
            if statuses_at.is_none() && seen.len() >= n && status_written.len() >= n {
                statuses_at = Some(begin.elapsed());
            }
            // Read every QueueConsumer's status about once a second: caught up once each shows its
            // workers' first rates (status.observed.window: the second scrape's) and, with alarms
            // on, its alarm in sync.
            if statuses_at.is_some()
                && (settled_at.is_none() || (alarms_on && alarms_at.is_none()))
                && last_alarm_check.elapsed() >= Duration::from_secs(1)
            {
                last_alarm_check = Instant::now();
                let all = fake.list(QUEUE_CONSUMERS);
                let count =
                    |f: &dyn Fn(&serde_json::Value) -> bool| all.iter().filter(|q| f(q)).count();
                if settled_at.is_none()
                    && count(&|q| !q["status"]["observed"]["window"].is_null()) >= n
                {
                    settled_at = Some(begin.elapsed());
                }
                if alarms_on
                    && alarms_at.is_none()
                    && count(&|q| q["status"]["deadLetter"]["alarmName"].is_string()) >= n
                {
                    alarms_at = Some(begin.elapsed());
                }
            }
            let caught_up = settled_at.is_some() && (!alarms_on || alarms_at.is_some());
            if caught_up || begin.elapsed() > poll * catch_up_bound {
                // On to the next boundary of the interval.
                end_ms = (epoch_ms() / poll_ms + 1) * poll_ms;
            }
        }
        let boundary = Instant::now();
        row.length = boundary.duration_since(begin);
        row.distinct = seen.len();
        row.wall = seen
            .values()
            .max()
            .map(|t| t.duration_since(begin))
            .unwrap_or_default();
        let now = counters(&controller_metrics(metrics_addr).await);
        row.aws = now
            .aws
            .iter()
            .map(|(k, v)| (k.clone(), v - before.aws.get(k).copied().unwrap_or(0)))
            .collect();
        row.throttled = now.throttled - before.throttled;
        row.reconciles = now.reconciles - before.reconciles;
        before = now;
        let s = scrapes.load(std::sync::atomic::Ordering::Relaxed);
        row.scrapes = s - scrapes_before;
        scrapes_before = s;
        let cpu = cpu_time(&pid);
        row.cpu = cpu.saturating_sub(cpu_before);
        cpu_before = cpu;
        row.rss_kib = status_kib(&pid, "VmRSS:");
        rows.push(row);
        begin = boundary;
    }
    let peak_kib = status_kib(&pid, "VmHWM:");
    let settled_kib = status_kib(&pid, "VmRSS:");
    let api_kib = status_kib("self", "VmRSS:");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;

    let load = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    println!(
        "\n### {n} QueueConsumers on {q} queues (+ {q} DLQs), poll {poll_s}; DLQ alarms {}; {}SQS on {}, CloudWatch on moto; queues created in {took:.1?}; run {:.1?}; load average {load}\n",
        if alarms_on { "on" } else { "off" },
        if busy {
            "busy queues (one message more per queue per interval); "
        } else {
            ""
        },
        std::env::var("QC_BENCH_SQS").unwrap_or_else(|_| "fauxqs".into()),
        started.elapsed(),
    );
    println!(
        "| interval | length (s) | all reconciled after (s) | QueueConsumers reconciled | reconciles | GetQueueAttributes | GetQueueUrl | GetMetricData | DescribeAlarms | PutMetricAlarm | throttled | Kubernetes requests | of which pod lists | Kubernetes writes (status / Deployment / Event / other) | pod scrapes | longest gap between reconciles (s) | controller CPU (s) | controller RSS (MiB) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
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
            "| {} | {:.1} | {:.1} | {} / {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} | {:.1} |",
            r.label,
            r.length.as_secs_f64(),
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
            r.cpu.as_secs_f64(),
            r.rss_kib as f64 / 1024.0,
        );
    }
    let secs = |d: Option<Duration>| {
        d.map_or("not within the bound".to_string(), |d| {
            format!("{:.1} s", d.as_secs_f64())
        })
    };
    println!(
        "\nCatch-up: every QueueConsumer reconciled with its status written after {}, with its workers' first rates in status after {}; every DLQ alarm in sync in status after {}. Steady intervals are whole poll intervals counted from the Unix epoch (the grid the controller's slots and per-interval reads use).",
        secs(statuses_at),
        secs(settled_at),
        if alarms_on {
            secs(alarms_at)
        } else {
            "- (alarms off)".to_string()
        }
    );
    println!(
        "\nReconcile errors: {}",
        if before.errors.is_empty() {
            "none".to_string()
        } else {
            format!("{:?}", before.errors)
        }
    );
    println!(
        "\nController process (`qc-operator run`, its own process): peak RSS {:.1} MiB, {:.1} MiB at the end. The in-memory API and the bench, in the other process: {:.1} MiB.",
        peak_kib as f64 / 1024.0,
        settled_kib as f64 / 1024.0,
        api_kib as f64 / 1024.0,
    );
    Summary {
        n,
        q,
        alarms: alarms_on,
        steady: rows.into_iter().skip(1).collect(),
        peak_kib,
        settled_kib,
    }
}

/// One line per scale: what a steady interval costs, per interval and per QueueConsumer.
fn print_summary(all: &[Summary]) {
    println!(
        "\n### Cost per steady interval (mean over the steady intervals) and per QueueConsumer\n"
    );
    println!(
        "| QueueConsumers / queues | DLQ alarms | reconciles / interval | GetQueueAttributes / interval (per queue incl. DLQ) | CloudWatch calls / interval | Kubernetes requests / interval (per QueueConsumer) | Kubernetes writes / interval | controller CPU / interval (s) | CPU per reconcile (ms) | peak RSS (MiB) | RSS at the end per QueueConsumer (KiB) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for s in all {
        let k = s.steady.len().max(1) as f64;
        let sum = |f: &dyn Fn(&Row) -> f64| s.steady.iter().map(f).sum::<f64>() / k;
        let reconciles = sum(&|r| r.reconciles as f64);
        let gqa = sum(&|r| r.aws.get("GetQueueAttributes").copied().unwrap_or(0) as f64);
        let cw = sum(&|r| {
            [
                "GetMetricData",
                "DescribeAlarms",
                "PutMetricAlarm",
                "DeleteAlarms",
            ]
            .iter()
            .map(|a| r.aws.get(*a).copied().unwrap_or(0) as f64)
            .sum()
        });
        let kube = sum(&|r| r.kube_requests as f64);
        let writes = sum(&|r| r.kube_writes as f64);
        let cpu = sum(&|r| r.cpu.as_secs_f64());
        println!(
            "| {} / {} | {} | {:.0} | {:.0} ({:.2}) | {:.1} | {:.0} ({:.2}) | {:.1} | {:.2} | {:.2} | {:.1} | {:.1} |",
            s.n,
            s.q,
            if s.alarms { "on" } else { "off" },
            reconciles,
            gqa,
            gqa / (2 * s.q) as f64,
            cw,
            kube,
            kube / s.n as f64,
            writes,
            cpu,
            if reconciles > 0.0 {
                cpu * 1000.0 / reconciles
            } else {
                0.0
            },
            s.peak_kib as f64 / 1024.0,
            s.settled_kib as f64 / s.n as f64,
        );
    }
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
    let intervals = env_or("QC_BENCH_INTERVALS", 3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let summaries: Vec<Summary> = scales
        .into_iter()
        .map(|(n, q)| rt.block_on(scale(n, q.clamp(1, n), poll, intervals)))
        .collect();
    print_summary(&summaries);
}
