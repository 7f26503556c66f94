//! Support for the worker tests: queues on the moto server, real `qc-worker` processes, and handlers
//! (an HTTP server in the test process, or shell scripts) that record every call so tests count effects.
#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::{QueueAttributeName, SendMessageBatchRequestEntry};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common;

/// A source queue with a DLQ (redrive after `max_receive_count` receives).
pub struct TestQueue {
    pub client: aws_sdk_sqs::Client,
    pub url: String,
    pub dlq_url: String,
    pub fifo: bool,
}

impl TestQueue {
    pub async fn new(prefix: &str, vt_secs: u32, max_receive_count: u32, fifo: bool) -> Self {
        Self::on(
            common::sqs_client().await,
            prefix,
            vt_secs,
            max_receive_count,
            fifo,
        )
        .await
    }

    /// A queue on the server `client` talks to.
    pub async fn on(
        client: aws_sdk_sqs::Client,
        prefix: &str,
        vt_secs: u32,
        max_receive_count: u32,
        fifo: bool,
    ) -> Self {
        let suffix = if fifo { ".fifo" } else { "" };
        let name = common::unique_name(prefix);
        let fifo_attr: Vec<_> = if fifo {
            vec![(QueueAttributeName::FifoQueue, "true".to_string())]
        } else {
            Vec::new()
        };
        let dlq_url =
            common::create_queue(&client, &format!("{name}-dlq{suffix}"), &fifo_attr).await;
        let dlq_arn = common::queue_arn(&client, &dlq_url).await;
        let redrive = serde_json::json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receive_count});
        let mut attrs = vec![
            (QueueAttributeName::VisibilityTimeout, vt_secs.to_string()),
            (
                QueueAttributeName::MaximumMessageSize,
                "1048576".to_string(),
            ),
            (QueueAttributeName::RedrivePolicy, redrive.to_string()),
        ];
        attrs.extend(fifo_attr);
        let url = common::create_queue(&client, &format!("{name}{suffix}"), &attrs).await;
        TestQueue {
            client,
            url,
            dlq_url,
            fifo,
        }
    }

    /// Sends bodies in batches of 10; on FIFO queues `group` picks each body's group.
    pub async fn send_all(&self, bodies: &[String], group: impl Fn(usize) -> String) {
        for (chunk_no, chunk) in bodies.chunks(10).enumerate() {
            let mut req = self.client.send_message_batch().queue_url(&self.url);
            for (i, body) in chunk.iter().enumerate() {
                let n = chunk_no * 10 + i;
                let mut e = SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(body);
                if self.fifo {
                    e = e
                        .message_group_id(group(n))
                        .message_deduplication_id(format!("d{n}"));
                }
                req = req.entries(e.build().unwrap());
            }
            let out = req.send().await.unwrap();
            assert!(out.failed().is_empty(), "send failed: {:?}", out.failed());
        }
    }

    pub async fn send_one(&self, body: &str) {
        self.client
            .send_message()
            .queue_url(&self.url)
            .message_body(body)
            .send()
            .await
            .unwrap();
    }

    /// (visible, not visible, delayed) of a queue.
    pub async fn counts_of(&self, url: &str) -> (u64, u64, u64) {
        use qc::aws::QueueReader;
        let attrs = qc::aws::SqsReader::new(self.client.clone())
            .attributes(url)
            .await
            .unwrap();
        let get = |k: &str| attrs.get(k).map_or(0, |v| v.parse().unwrap());
        (
            get("ApproximateNumberOfMessages"),
            get("ApproximateNumberOfMessagesNotVisible"),
            get("ApproximateNumberOfMessagesDelayed"),
        )
    }

    pub async fn counts(&self) -> (u64, u64, u64) {
        self.counts_of(&self.url).await
    }

    pub async fn is_empty(&self) -> bool {
        self.counts().await == (0, 0, 0)
    }

    pub async fn dlq_visible(&self) -> u64 {
        self.counts_of(&self.dlq_url).await.0
    }
}

/// Polls `check` every 100 ms until it holds or `limit` passes; panics with `what` on timeout.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `qc-worker`.
pub struct Worker {
    child: Option<Child>,
    pub metrics_addr: String,
    pub log: PathBuf,
    _dir: Arc<tempfile::TempDir>,
}

/// Flags every test worker gets: the moto endpoint, short polls.
pub fn base_args(queue: &TestQueue) -> Vec<String> {
    queue.args_via(&common::sqs_endpoint(), &[])
}

impl TestQueue {
    /// The flags of a worker on this queue through moto (`base_args`), then `extra`.
    pub fn args(&self, extra: &[&str]) -> Vec<String> {
        self.args_via(&common::sqs_endpoint(), extra)
    }

    /// The flags of a worker on this queue that reaches SQS at `endpoint` (a `FaultProxy` in front of
    /// moto), with short polls, then `extra`.
    pub fn args_via(&self, endpoint: &str, extra: &[&str]) -> Vec<String> {
        let mut a = args(&[
            "--queue-url",
            &self.url,
            "--endpoint-url",
            endpoint,
            "--wait-time",
            "1s",
        ]);
        a.extend(args(extra));
        a
    }
}

impl Worker {
    pub fn start(args: &[String]) -> Worker {
        Self::start_in(Arc::new(tempfile::tempdir().unwrap()), args)
    }

    /// Starts a worker whose log lives in `dir` (so a restarted worker can share it).
    pub fn start_in(dir: Arc<tempfile::TempDir>, args: &[String]) -> Worker {
        Self::start_with_env(dir, args, &[])
    }

    /// Starts a worker with extra environment variables.
    pub fn start_with_env(
        dir: Arc<tempfile::TempDir>,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Worker {
        Self::start_program(dir, &[env!("CARGO_BIN_EXE_qc-worker")], args, env)
    }

    /// Starts the worker through `program` (a wrapper that execs the worker binary with the arguments
    /// it is given after its own).
    pub fn start_program(
        dir: Arc<tempfile::TempDir>,
        program: &[&str],
        args: &[String],
        env: &[(&str, &str)],
    ) -> Worker {
        // A port free a moment ago can be taken by another process before the worker binds it
        // (tests run in parallel): a worker that could not bind its port is started again on another.
        let mut attempt = 0;
        let (child, metrics_addr, log) = loop {
            attempt += 1;
            let metrics_addr = format!("127.0.0.1:{}", free_port());
            let n = std::fs::read_dir(dir.path()).unwrap().count();
            let log = dir.path().join(format!("worker-{n}.log"));
            let file = std::fs::File::create(&log).unwrap();
            let (before, after) = match args.iter().position(|a| a == "--") {
                Some(i) => (&args[..i], &args[i..]),
                None => (args, &[][..]),
            };
            let mut child = Command::new(program[0])
                .args(&program[1..])
                .args(before)
                .args(["--metrics-addr", &metrics_addr])
                .args(after)
                .env(
                    "RUST_LOG",
                    std::env::var("QC_TEST_WORKER_LOG").unwrap_or_else(|_| "info".into()),
                )
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(file.try_clone().unwrap())
                .stderr(file)
                .spawn()
                .expect("qc-worker starts");
            if attempt < 5 && lost_its_port(&mut child, &log) {
                continue;
            }
            break (child, metrics_addr, log);
        };
        Worker {
            child: Some(child),
            metrics_addr,
            log,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit; panics (after killing it) past `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return status;
            }
            if start.elapsed() > limit {
                let _ = self.child.as_mut().unwrap().kill();
                panic!(
                    "qc-worker did not exit within {limit:?}; log:\n{}",
                    self.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    pub fn kill9(&mut self) {
        let child = self.child.as_mut().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The JSON log lines whose message is `message`.
    pub fn log_lines(&self, message: &str) -> Vec<serde_json::Value> {
        self.log_text()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == message)
            .collect()
    }

    /// Waits until a log line `message` carries an `error` holding every one of `needles`.
    pub async fn wait_error_logged(&self, limit: Duration, message: &str, needles: &[&str]) {
        let what = format!("{message:?} logged with an error holding {needles:?}");
        eventually(limit, &what, || {
            let hit = self.log_lines(message).iter().any(|l| {
                let e = l["error"].as_str().unwrap_or_default();
                needles.iter().all(|n| e.contains(n))
            });
            async move { hit }
        })
        .await;
    }

    /// GET `path` on the probe server: (status, body).
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(&self.metrics_addr, path).await
    }

    pub async fn wait_ready(&self, limit: Duration) {
        eventually(limit, "worker /readyz = 200", || async {
            matches!(self.get("/readyz").await, Some((200, _)))
        })
        .await;
    }

    /// A sample's value from /metrics (`name` may include labels, e.g. `x{a="b"}`).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let (_, text) = self.get("/metrics").await?;
        parse_metric(&text, name)
    }

    /// The most messages the worker held at once (`qc_worker_in_flight`, read every `every`) until it
    /// has deleted `n`; panics if that takes longer than `within`.
    pub async fn most_held_until_deleted(&self, n: f64, every: Duration, within: Duration) -> f64 {
        let mut most = 0.0f64;
        let deadline = std::time::Instant::now() + within;
        while self.metric("qc_worker_messages_deleted_total").await != Some(n) {
            assert!(std::time::Instant::now() < deadline, "{n} deleted");
            if let Some(held) = self.metric("qc_worker_in_flight").await {
                most = most.max(held);
            }
            tokio::time::sleep(every).await;
        }
        most
    }

    /// The count of SQS requests of one action (`qc_worker_sqs_requests_total{action=...}`).
    pub async fn sqs_requests(&self, action: &str) -> Option<f64> {
        self.metric(&format!(
            "qc_worker_sqs_requests_total{{action=\"{action}\"}}"
        ))
        .await
    }

    /// Waits until the worker has counted exactly `n` messages deleted; panics past `limit`.
    pub async fn wait_deleted(&self, n: usize, limit: Duration) {
        let what = format!("{n} messages deleted");
        eventually(limit, &what, || async {
            self.metric("qc_worker_messages_deleted_total").await == Some(n as f64)
        })
        .await;
    }

    /// No heartbeat lease was lost. A heartbeat call that failed and was retried within the lease
    /// costs nothing (a loaded machine may fail one); what must not happen is a lease lost.
    pub async fn assert_no_lease_lost(&self) {
        assert_eq!(
            self.metric("qc_worker_heartbeat_leases_lost_total").await,
            Some(0.0),
            "a heartbeat lease was lost"
        );
    }

    /// SIGTERM, then the worker must drain and exit 0 within its own shutdown budget (the handler
    /// timeout plus 5 s: 35 s at the tests' 30 s) and 5 s more for a busy machine. Not less: under load
    /// a receive already sent (moto answering in 7 s) and a release call given up after 10 s and
    /// retried are the drain doing its job, and a worker that hangs is still caught here.
    pub async fn stop(&mut self) {
        self.stop_within(Duration::from_secs(40)).await;
    }

    /// SIGTERM, then the worker must drain and exit 0 within `limit`.
    pub async fn stop_within(&mut self, limit: Duration) {
        self.signal("TERM");
        let status = self.wait_exit(limit).await;
        assert!(
            status.success(),
            "qc-worker exited with {status} after SIGTERM; log:\n{}",
            self.log_text()
        );
    }
}

/// Two workers started with the same flags, as the replicas of one QueueConsumer.
pub struct Replicas(pub [Worker; 2]);

impl Replicas {
    pub fn start(args: &[String]) -> Replicas {
        Replicas([Worker::start(args), Worker::start(args)])
    }

    /// A sample summed over both workers; NaN when either lacks it, so every assertion on it fails.
    pub async fn sum(&self, name: &str) -> f64 {
        let mut total = 0.0;
        for w in &self.0 {
            total += w.metric(name).await.unwrap_or(f64::NAN);
        }
        total
    }

    /// Stops both (`Worker::stop`).
    pub async fn stop(&mut self) {
        for w in &mut self.0 {
            w.stop().await;
        }
    }
}

/// The flags of a redis idempotency store (the test server) keyed by each body's `/orderId`.
pub fn redis_orders_args() -> Vec<String> {
    args(&[
        "--idempotency-store",
        "redis",
        "--redis-url",
        &common::redis_url(),
        "--idempotency-key",
        "jsonPointer:/orderId",
    ])
}

/// Handler calls (whatever their answer) per `orderId` of the bodies.
pub fn calls_by_order(h: &HttpHandler) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for c in h.calls() {
        let v: serde_json::Value = serde_json::from_slice(&c.body).unwrap();
        *m.entry(v["orderId"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    m
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take()
            && c.try_wait().ok().flatten().is_none()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
        // A failed test shows what the worker logged (its directory goes with it); so does any
        // with QC_TEST_SHOW_WORKER_LOG set.
        if std::thread::panicking() || std::env::var_os("QC_TEST_SHOW_WORKER_LOG").is_some() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(300)..];
            eprintln!("--- {} (last {} lines) ---", self.log.display(), tail.len());
            for l in tail {
                eprintln!("{l}");
            }
        }
    }
}

pub fn parse_metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.rsplit_once(' ')?;
        (n == name).then(|| v.parse().ok()).flatten()
    })
}

pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// One call the HTTP handler received.
#[derive(Clone, Debug)]
pub struct Call {
    pub id: String,
    pub body: Vec<u8>,
    pub receive_count: u32,
    pub group: Option<String>,
    pub headers: HashMap<String, String>,
    pub started: Instant,
    /// Set when the handler answered.
    pub finished: Option<Instant>,
    pub status: u16,
}

/// How the handler answers a call: status, delay before answering, optional Retry-After.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub delay: Duration,
    pub retry_after: Option<String>,
    /// The answer's body (batch mode: the batchItemFailures answer).
    pub body: Vec<u8>,
}

impl Reply {
    pub fn ok(delay: Duration) -> Reply {
        Reply {
            status: 200,
            delay,
            retry_after: None,
            body: Vec::new(),
        }
    }
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            delay: Duration::ZERO,
            retry_after: None,
            body: Vec::new(),
        }
    }
    /// 200 after `delay` with this body.
    pub fn answer(delay: Duration, body: &str) -> Reply {
        Reply {
            body: body.as_bytes().to_vec(),
            ..Reply::ok(delay)
        }
    }
}

type Behavior = Arc<dyn Fn(&Call) -> Reply + Send + Sync>;

/// An HTTP handler in the test process.
#[derive(Clone)]
pub struct HttpHandler {
    pub url: String,
    calls: Arc<Mutex<Vec<Call>>>,
    active: Arc<AtomicUsize>,
    max_active: Arc<AtomicUsize>,
}

impl HttpHandler {
    pub async fn start(behavior: impl Fn(&Call) -> Reply + Send + Sync + 'static) -> HttpHandler {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/messages", listener.local_addr().unwrap());
        let h = HttpHandler {
            url,
            calls: Arc::default(),
            active: Arc::default(),
            max_active: Arc::default(),
        };
        let behavior: Behavior = Arc::new(behavior);
        let server = h.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let server = server.clone();
                let behavior = behavior.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let server = server.clone();
                        let behavior = behavior.clone();
                        async move { Ok::<_, Infallible>(server.serve(req, &*behavior).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        h
    }

    async fn serve(
        &self,
        req: Request<Incoming>,
        behavior: &(dyn Fn(&Call) -> Reply + Send + Sync),
    ) -> Response<Full<Bytes>> {
        let headers: HashMap<String, String> = req
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).to_string(),
                )
            })
            .collect();
        let body = req.into_body().collect().await.unwrap().to_bytes().to_vec();
        let mut call = Call {
            id: headers.get("ce-id").cloned().unwrap_or_default(),
            receive_count: headers
                .get("ce-sqsreceivecount")
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
            group: headers.get("ce-sqsgroupid").cloned(),
            headers,
            body,
            started: Instant::now(),
            finished: None,
            status: 0,
        };
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_active.fetch_max(now, Ordering::SeqCst);
        let reply = behavior(&call);
        call.status = reply.status;
        let index = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(call);
            calls.len() - 1
        };
        tokio::time::sleep(reply.delay).await;
        self.calls.lock().unwrap()[index].finished = Some(Instant::now());
        self.active.fetch_sub(1, Ordering::SeqCst);
        let mut resp = Response::new(Full::new(Bytes::from(reply.body)));
        *resp.status_mut() = hyper::StatusCode::from_u16(reply.status).unwrap();
        if let Some(ra) = reply.retry_after {
            resp.headers_mut()
                .insert("retry-after", ra.parse().unwrap());
        }
        resp
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn finished_calls(&self) -> usize {
        self.calls().iter().filter(|c| c.finished.is_some()).count()
    }

    pub fn max_active(&self) -> usize {
        self.max_active.load(Ordering::SeqCst)
    }

    /// Calls per body (as text).
    pub fn counts_by_body(&self) -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for c in self.calls() {
            *m.entry(String::from_utf8_lossy(&c.body).to_string())
                .or_default() += 1;
        }
        m
    }

    /// Each of `bodies` reached the handler exactly once.
    pub fn assert_each_handled_once(&self, bodies: &[String]) {
        let counts = self.counts_by_body();
        for b in bodies {
            assert_eq!(counts.get(b), Some(&1), "{b} handled once: {counts:?}");
        }
    }

    /// `n` calls, each a first delivery (receive count 1): no message came back after a lapsed lease.
    pub fn assert_calls_all_first_deliveries(&self, n: usize) {
        let calls = self.calls();
        assert_eq!(calls.len(), n, "{n} calls, no redelivery: {calls:?}");
        assert!(calls.iter().all(|c| c.receive_count == 1), "{calls:?}");
    }
}

/// Waits (a few seconds at most) until a just-started worker either serves its probes or exits;
/// true if it exited because its metrics port was taken meanwhile.
fn lost_its_port(child: &mut std::process::Child, log: &Path) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < until {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("serving /metrics") {
            return false;
        }
        if let Ok(Some(_)) = child.try_wait() {
            return text.contains("Address already in use");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Writes an executable shell script and returns its path.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Bodies `{"n":0}` .. `{"n":count-1}`, optionally padded.
pub fn numbered(count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{{\"n\":{n}}}")).collect()
}

pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(std::string::ToString::to_string).collect()
}

/// What the fault proxy does with SQS traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Pass requests through to the real server.
    Forward,
    /// Stop listening: connections are refused.
    Refuse,
    /// Answer every request with this HTTP status and AWS error code.
    Fail(u16, &'static str),
    /// Pass requests through, but the first one for this action (`X-Amz-Target: AmazonSQS.<action>`)
    /// is read and never answered: a hung call.
    HangFirst(&'static str),
    /// Pass requests through, but answer every one whose action starts with this name (so
    /// `DeleteMessage` covers `DeleteMessageBatch`) with this HTTP status and AWS error code.
    FailAction(&'static str, u16, &'static str),
    /// Pass requests through, but answer the first one for exactly this action with this HTTP
    /// status and AWS error code (once per proxy).
    FailFirst(&'static str, u16, &'static str),
    /// Pass requests through, but in the first one for exactly this action spoil the first
    /// `ReceiptHandle` of the JSON body, so the server refuses that entry alone (once per proxy).
    SpoilFirstHandle(&'static str),
    /// Pass requests through, each one for exactly this action this many milliseconds late: a
    /// longer round trip (a far region, a congested path).
    DelayAction(&'static str, u64),
    /// Pass requests through, but every message of every ReceiveMessage answer appears twice (same
    /// id, same receipt handle): what SQS does when it hands one message to two receives.
    DuplicateReceived,
    /// Pass requests through, but the first ReceiveMessage answer holding a message (once per
    /// proxy) holds its first message twice: both copies in one batch.
    DuplicateFirstReceived,
    /// SQS passes through; every DynamoDB request (`X-Amz-Target: DynamoDB_20120810.*`) is
    /// answered with this HTTP status and AWS error code: the table is down, the queue is not.
    FailDynamoDb(u16, &'static str),
    /// SQS passes through; every DynamoDB request reaches the table but its answer is dropped
    /// (the connection closed): the write happened, the caller never learns it.
    DropDynamoDbAnswers,
}

/// A TCP proxy in front of the moto server that can refuse connections or answer with AWS errors.
pub struct FaultProxy {
    pub endpoint: String,
    port: u16,
    upstream: String,
    state: Arc<Mutex<ProxyState>>,
    /// Set once a one-shot fault (`FailFirst`, `SpoilFirstHandle`) has fired.
    fired: Arc<std::sync::atomic::AtomicBool>,
}

/// Set once `Fault::HangFirst` has swallowed its request.
static HUNG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

struct ProxyState {
    fault: Fault,
    accept: Option<tokio::task::JoinHandle<()>>,
    conns: Vec<tokio::task::AbortHandle>,
}

impl FaultProxy {
    pub async fn start() -> FaultProxy {
        let upstream = common::sqs_endpoint()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let port = free_port();
        let p = FaultProxy {
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            upstream,
            fired: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            state: Arc::new(Mutex::new(ProxyState {
                fault: Fault::Forward,
                accept: None,
                conns: Vec::new(),
            })),
        };
        p.set(Fault::Forward).await;
        p
    }

    /// Whether a one-shot fault (`FailFirst`, `SpoilFirstHandle`, `DuplicateFirstReceived`) fired.
    pub fn fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Switches behaviour; open connections are cut so the change applies at once.
    pub async fn set(&self, fault: Fault) {
        let listen = fault != Fault::Refuse;
        let needs_bind = {
            let mut st = self.state.lock().unwrap();
            st.fault = fault;
            for c in st.conns.drain(..) {
                c.abort();
            }
            if !listen && let Some(a) = st.accept.take() {
                a.abort();
            }
            listen && st.accept.is_none()
        };
        if !needs_bind {
            return;
        }
        let listener = loop {
            // The aborted accept loop may still hold the port for a moment.
            match tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let state = self.state.clone();
        let upstream = self.upstream.clone();
        let fired = self.fired.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let fault = state.lock().unwrap().fault;
                let upstream = upstream.clone();
                let fired = fired.clone();
                let task = tokio::spawn(async move {
                    match fault {
                        Fault::Forward => {
                            let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await
                            else {
                                return;
                            };
                            let mut client = client;
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                        Fault::Fail(status, code) => answer_errors(client, status, code).await,
                        Fault::HangFirst(action) => relay_hanging(client, &upstream, action).await,
                        Fault::FailAction(action, status, code) => {
                            relay_failing(client, &upstream, action, status, code).await;
                        }
                        Fault::FailFirst(action, status, code) => {
                            relay_once(client, &upstream, action, &fired, |_| {
                                Err(error_response(status, code).into_bytes())
                            })
                            .await;
                        }
                        Fault::SpoilFirstHandle(action) => {
                            relay_once(client, &upstream, action, &fired, |req| {
                                Ok(spoil_first_handle(req))
                            })
                            .await;
                        }
                        Fault::DelayAction(action, ms) => {
                            relay_delaying(client, &upstream, action, Duration::from_millis(ms))
                                .await;
                        }
                        Fault::DuplicateReceived => {
                            relay_duplicating(client, &upstream, None).await;
                        }
                        Fault::DuplicateFirstReceived => {
                            relay_duplicating(client, &upstream, Some(&fired)).await;
                        }
                        Fault::FailDynamoDb(status, code) => {
                            relay_dynamodb(client, &upstream, Some((status, code))).await;
                        }
                        Fault::DropDynamoDbAnswers => {
                            relay_dynamodb(client, &upstream, None).await;
                        }
                        Fault::Refuse => {}
                    }
                });
                state.lock().unwrap().conns.push(task.abort_handle());
            }
        });
        self.state.lock().unwrap().accept = Some(accept);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Ok(mut st) = self.state.lock() {
            if let Some(a) = st.accept.take() {
                a.abort();
            }
            for c in st.conns.drain(..) {
                c.abort();
            }
        }
    }
}

/// One HTTP/1.1 message (head and Content-Length body) from `s`, after what `buf` already holds.
async fn read_message(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < header_end + len {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(buf.drain(..header_end + len).collect())
}

/// Sends one request on to the upstream and reads its answer; None once either side is gone.
async fn forward(
    server: &mut tokio::net::TcpStream,
    sbuf: &mut Vec<u8>,
    req: &[u8],
) -> Option<Vec<u8>> {
    server.write_all(req).await.ok()?;
    read_message(server, sbuf).await
}

/// Relays requests one by one to the upstream; the first request for `action` is swallowed and the
/// connection held open without an answer.
async fn relay_hanging(mut client: tokio::net::TcpStream, upstream: &str, action: &str) {
    let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let target = format!("x-amz-target: amazonsqs.{}\r\n", action.to_lowercase());
    let (mut cbuf, mut sbuf) = (Vec::new(), Vec::new());
    while let Some(req) = read_message(&mut client, &mut cbuf).await {
        let head = String::from_utf8_lossy(&req).to_lowercase();
        if head.contains(&target) && !HUNG.swap(true, std::sync::atomic::Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_hours(1)).await;
            return;
        }
        let Some(resp) = forward(&mut server, &mut sbuf, &req).await else {
            return;
        };
        if client.write_all(&resp).await.is_err() {
            return;
        }
    }
}

/// moto may hand one message to two ReceiveMessage calls it serves at once (a race in its server;
/// 5 duplicates in 1,500 messages with 8 threads receiving): `relay_delaying` sends the delayed
/// action to it one call at a time, so a test of parallel receives sees each message once.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// Calls of the delayed action in the proxy now, and the most at once (one test uses the delay).
static DELAYED_NOW: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static DELAYED_MOST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The most calls `Fault::DelayAction` held in the proxy at once: the client's calls in flight.
pub fn most_delayed_at_once() -> usize {
    DELAYED_MOST.load(std::sync::atomic::Ordering::SeqCst)
}

/// Relays requests one by one to the upstream, those for exactly `action` after `delay` (the waits
/// overlap; the calls reach moto one at a time, `ONE_AT_A_TIME`).
async fn relay_delaying(
    mut client: tokio::net::TcpStream,
    upstream: &str,
    action: &str,
    delay: Duration,
) {
    let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let target = format!("x-amz-target: amazonsqs.{}\r\n", action.to_lowercase());
    let (mut cbuf, mut sbuf) = (Vec::new(), Vec::new());
    while let Some(req) = read_message(&mut client, &mut cbuf).await {
        let delayed = String::from_utf8_lossy(&req)
            .to_lowercase()
            .contains(&target);
        if delayed {
            use std::sync::atomic::Ordering::SeqCst;
            let now = DELAYED_NOW.fetch_add(1, SeqCst) + 1;
            DELAYED_MOST.fetch_max(now, SeqCst);
            tokio::time::sleep(delay).await;
            DELAYED_NOW.fetch_sub(1, SeqCst);
        }
        let turn = if delayed {
            Some(ONE_AT_A_TIME.lock().await)
        } else {
            None
        };
        let Some(resp) = forward(&mut server, &mut sbuf, &req).await else {
            return;
        };
        drop(turn);
        if client.write_all(&resp).await.is_err() {
            return;
        }
    }
}

/// Relays requests one by one to the upstream, except those for an action starting with `action`,
/// which are answered with an AWS JSON-protocol error.
async fn relay_failing(
    mut client: tokio::net::TcpStream,
    upstream: &str,
    action: &str,
    status: u16,
    code: &str,
) {
    let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let target = format!("x-amz-target: amazonsqs.{}", action.to_lowercase());
    let (mut cbuf, mut sbuf) = (Vec::new(), Vec::new());
    while let Some(req) = read_message(&mut client, &mut cbuf).await {
        let head = String::from_utf8_lossy(&req).to_lowercase();
        let resp = if head.contains(&target) {
            error_response(status, code).into_bytes()
        } else {
            let Some(resp) = forward(&mut server, &mut sbuf, &req).await else {
                return;
            };
            resp
        };
        if client.write_all(&resp).await.is_err() {
            return;
        }
    }
}

/// Relays requests one by one to the upstream; DynamoDB requests are answered with `fail`'s error,
/// or (None) sent on and their answers dropped with the connection.
async fn relay_dynamodb(
    mut client: tokio::net::TcpStream,
    upstream: &str,
    fail: Option<(u16, &str)>,
) {
    let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let (mut cbuf, mut sbuf) = (Vec::new(), Vec::new());
    while let Some(req) = read_message(&mut client, &mut cbuf).await {
        let head = String::from_utf8_lossy(&req).to_lowercase();
        let dynamodb = head.contains("x-amz-target: dynamodb_20120810.");
        let resp = match (dynamodb, fail) {
            (true, Some((status, code))) => error_response(status, code).into_bytes(),
            (true, None) => {
                let _ = forward(&mut server, &mut sbuf, &req).await;
                return;
            }
            (false, _) => {
                let Some(resp) = forward(&mut server, &mut sbuf, &req).await else {
                    return;
                };
                resp
            }
        };
        if client.write_all(&resp).await.is_err() {
            return;
        }
    }
}

/// Relays requests one by one to the upstream; the first request for exactly `action` (once per
/// proxy, `fired`) goes through `change` first: Ok(request) is sent on, Err(response) is answered.
async fn relay_once(
    mut client: tokio::net::TcpStream,
    upstream: &str,
    action: &str,
    fired: &std::sync::atomic::AtomicBool,
    change: impl Fn(Vec<u8>) -> Result<Vec<u8>, Vec<u8>>,
) {
    let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let target = format!("x-amz-target: amazonsqs.{}\r\n", action.to_lowercase());
    let (mut cbuf, mut sbuf) = (Vec::new(), Vec::new());
    while let Some(mut req) = read_message(&mut client, &mut cbuf).await {
        let head = String::from_utf8_lossy(&req).to_lowercase();
        if head.contains(&target) && !fired.swap(true, std::sync::atomic::Ordering::SeqCst) {
            match change(req) {
                Ok(changed) => req = changed,
                Err(resp) => {
                    if client.write_all(&resp).await.is_err() {
                        return;
                    }
                    continue;
                }
            }
        }
        let Some(resp) = forward(&mut server, &mut sbuf, &req).await else {
            return;
        };
        if client.write_all(&resp).await.is_err() {
            return;
        }
    }
}

/// Relays requests one by one to the upstream; each ReceiveMessage answer goes back with every
/// message twice in a row, or with `first_only` (once per proxy) the first answer holding a
/// message with its first message appended again.
async fn relay_duplicating(
    mut client: tokio::net::TcpStream,
    upstream: &str,
    first_only: Option<&std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
        return;
    };
    let (mut cbuf, mut sbuf) = (Vec::new(), Vec::new());
    while let Some(req) = read_message(&mut client, &mut cbuf).await {
        let receive = String::from_utf8_lossy(&req)
            .to_lowercase()
            .contains("x-amz-target: amazonsqs.receivemessage\r\n");
        let Some(mut resp) = forward(&mut server, &mut sbuf, &req).await else {
            return;
        };
        if receive
            && !first_only.is_some_and(|f| f.load(SeqCst))
            && let Some(doubled) = duplicate_messages(&resp, first_only.is_some())
            && !first_only.is_some_and(|f| f.swap(true, SeqCst))
        {
            resp = doubled;
        }
        if client.write_all(&resp).await.is_err() {
            return;
        }
    }
}

/// A ReceiveMessage answer with each of its messages twice, or (`first_only`) its first message
/// appended again; None if it holds none.
fn duplicate_messages(resp: &[u8], first_only: bool) -> Option<Vec<u8>> {
    let split = resp.windows(4).position(|w| w == b"\r\n\r\n")?;
    let (head, body) = (&resp[..split], &resp[split + 4..]);
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let list = v.get_mut("Messages")?.as_array_mut()?;
    let first = list.first()?.clone();
    if first_only {
        list.push(first);
    } else {
        *list = list.iter().flat_map(|m| [m.clone(), m.clone()]).collect();
    }
    let body = serde_json::to_vec(&v).ok()?;
    Some(with_body(&String::from_utf8_lossy(head), &body))
}

/// An HTTP message of `head` (its Content-Length set to the body's) and `body`.
fn with_body(head: &str, body: &[u8]) -> Vec<u8> {
    let head: Vec<String> = head
        .split("\r\n")
        .map(|l| {
            if l.to_lowercase().starts_with("content-length:") {
                format!("content-length: {}", body.len())
            } else {
                l.to_string()
            }
        })
        .collect();
    let mut out = format!("{}\r\n\r\n", head.join("\r\n")).into_bytes();
    out.extend_from_slice(body);
    out
}

/// The request with its first `"ReceiptHandle":"` value prefixed by `spoilt-` (Content-Length
/// adjusted; the SDK does not sign the body's hash into anything the server checks here).
fn spoil_first_handle(req: Vec<u8>) -> Vec<u8> {
    let text = String::from_utf8_lossy(&req).to_string();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return req;
    };
    let body = body.replacen("\"ReceiptHandle\":\"", "\"ReceiptHandle\":\"spoilt-", 1);
    with_body(head, body.as_bytes())
}

fn error_response(status: u16, code: &str) -> String {
    let body = format!(
        r#"{{"__type":"com.amazonaws.sqs#{code}","message":"injected by the test proxy"}}"#
    );
    format!(
        "HTTP/1.1 {status} Injected\r\ncontent-type: application/x-amz-json-1.0\r\nx-amzn-query-error: {code};Sender\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Reads HTTP/1.1 requests and answers each with an AWS JSON-protocol error.
async fn answer_errors(mut client: tokio::net::TcpStream, status: u16, code: &str) {
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 8192];
        // Read one request: headers, then Content-Length bytes of body.
        let header_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..header_end]).to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < header_end + len {
            match client.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..header_end + len);
        let resp = error_response(status, code);
        if client.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// A real redis-server with only a TLS port, its certificate signed by a CA made for the test (with
/// the openssl command line). Killed on drop.
/// A test CA, a second CA that signed nothing, and a server certificate for localhost and
/// 127.0.0.1 signed by the first, made by openssl in a temporary directory.
pub struct TestCerts {
    pub ca_file: PathBuf,
    /// A CA that did not sign the server's certificate.
    pub other_ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    dir: tempfile::TempDir,
}

impl TestCerts {
    pub fn new() -> TestCerts {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // Each command is split on spaces (no argument here has one).
        let openssl = |command: &str| {
            let out = Command::new("openssl")
                .args(command.split(' '))
                .current_dir(d)
                .output()
                .expect("openssl runs (scripts/test installs it)");
            assert!(
                out.status.success(),
                "openssl {command}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let new_ca = |name: &str| {
            openssl(&format!(
                "req -x509 -newkey rsa:2048 -nodes -keyout {name}.key -out {name}.crt -days 2 -subj /CN={name}"
            ));
        };
        new_ca("ca");
        // A second CA that signed nothing: a trust store holding only it trusts no server here.
        new_ca("other-ca");
        openssl(
            "req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost",
        );
        std::fs::write(
            d.join("ext.cnf"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        openssl(
            "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile ext.cnf",
        );
        TestCerts {
            ca_file: d.join("ca.crt"),
            other_ca_file: d.join("other-ca.crt"),
            cert_file: d.join("server.crt"),
            key_file: d.join("server.key"),
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A redis-server with only a TLS port, its certificate signed by a test CA.
pub struct TlsRedis {
    pub port: u16,
    pub certs: TestCerts,
    child: std::process::Child,
}

impl TlsRedis {
    pub fn start() -> TlsRedis {
        let certs = TestCerts::new();
        let port = free_port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args([
                "--tls-cert-file",
                "server.crt",
                "--tls-key-file",
                "server.key",
            ])
            .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .current_dir(certs.dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let redis = TlsRedis { port, certs, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while redis.cli(&["PING"]) != "PONG" {
            assert!(Instant::now() < deadline, "TLS redis did not answer PING");
            std::thread::sleep(Duration::from_millis(100));
        }
        redis
    }

    pub fn url(&self) -> String {
        format!("rediss://localhost:{}", self.port)
    }

    /// One redis-cli command over TLS, trimmed output.
    pub fn cli(&self, command: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(&self.certs.ca_file)
            .args(["-p", &self.port.to_string()])
            .args(command)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// A second moto server, serving https only with a certificate from a test CA (moto's `-c`/`-k`).
pub struct TlsMoto {
    // First, so the server stops before its certificate files go.
    _moto: common::OwnMoto,
    pub endpoint: String,
    pub certs: TestCerts,
}

impl TlsMoto {
    pub fn start() -> TlsMoto {
        let certs = TestCerts::new();
        let moto = common::OwnMoto::start(
            &[
                "-c".as_ref(),
                certs.cert_file.as_os_str(),
                "-k".as_ref(),
                certs.key_file.as_os_str(),
            ],
            &[],
        );
        TlsMoto {
            endpoint: format!("https://localhost:{}", moto.port),
            _moto: moto,
            certs,
        }
    }

    /// An SDK client that trusts only the test CA.
    pub async fn client(&self) -> aws_sdk_sqs::Client {
        use aws_smithy_http_client::tls::{self, TlsContext, TrustStore};
        let ca = std::fs::read(&self.certs.ca_file).unwrap();
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::AwsLc,
            ))
            .tls_context(
                TlsContext::builder()
                    .with_trust_store(TrustStore::empty().with_pem_certificate(ca))
                    .build()
                    .unwrap(),
            )
            .build_https();
        let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .endpoint_url(&self.endpoint)
            .http_client(http)
            .load()
            .await;
        aws_sdk_sqs::Client::new(&conf)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request that went through the [`EgressProxy`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proxied {
    /// A plain-HTTP request forwarded to `authority`, with its `x-amz-target` (the SQS action).
    Forwarded { authority: String, target: String },
    /// A CONNECT tunnel to `authority` (https: the requests inside are encrypted).
    Tunnel { authority: String },
}

/// A forward proxy on loopback, as an egress proxy is: absolute-form requests for http targets are
/// forwarded (one per connection, `Connection: close` both ways), CONNECT requests for https targets
/// are tunnelled. Records what went through it; stopped on drop.
pub struct EgressProxy {
    pub url: String,
    seen: Arc<Mutex<Vec<Proxied>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl EgressProxy {
    pub async fn start() -> EgressProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let log = log.clone();
                tokio::spawn(async move {
                    let _ = proxy_one(client, log).await;
                });
            }
        });
        EgressProxy { url, seen, accept }
    }

    pub fn seen(&self) -> Vec<Proxied> {
        self.seen.lock().unwrap().clone()
    }

    /// How many forwarded requests carried this SQS action (e.g. `AmazonSQS.ReceiveMessage`).
    pub fn forwarded(&self, target: &str) -> usize {
        self.seen()
            .iter()
            .filter(|p| matches!(p, Proxied::Forwarded { target: t, .. } if t == target))
            .count()
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Reads up to the end of a head; returns (head, bytes already read past it).
async fn read_head<R: tokio::io::AsyncRead + Unpin>(stream: &mut R) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Some((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The head with its first line replaced and `Connection: close` instead of any connection header.
fn rewrite_head(head: &str, first_line: &str) -> String {
    let mut out = format!("{first_line}\r\n");
    for line in head.split("\r\n").skip(1).filter(|l| !l.is_empty()) {
        let name = line
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if name != "connection" && name != "proxy-connection" && name != "keep-alive" {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("connection: close\r\n\r\n");
    out
}

async fn proxy_one(mut client: tokio::net::TcpStream, log: Arc<Mutex<Vec<Proxied>>>) -> Option<()> {
    let (head, rest) = read_head(&mut client).await?;
    let mut first = head.lines().next()?.split(' ');
    let (method, target, version) = (first.next()?, first.next()?, first.next()?);
    if method == "CONNECT" {
        let mut server = tokio::net::TcpStream::connect(target).await.ok()?;
        log.lock().unwrap().push(Proxied::Tunnel {
            authority: target.to_string(),
        });
        client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .ok()?;
        server.write_all(&rest).await.ok()?;
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        return Some(());
    }
    // Absolute form: http://host:port/path?query
    let after_scheme = target.strip_prefix("http://")?;
    let (authority, path) = match after_scheme.find('/') {
        Some(i) => (&after_scheme[..i], &after_scheme[i..]),
        None => (after_scheme, "/"),
    };
    let amz_target = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("x-amz-target")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    let mut server = tokio::net::TcpStream::connect(authority).await.ok()?;
    log.lock().unwrap().push(Proxied::Forwarded {
        authority: authority.to_string(),
        target: amz_target,
    });
    let upstream_head = rewrite_head(&head, &format!("{method} {path} {version}"));
    server.write_all(upstream_head.as_bytes()).await.ok()?;
    server.write_all(&rest).await.ok()?;
    // The request body (Content-Length) follows from the client; the answer comes back until the close.
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let upload = tokio::io::copy(&mut client_read, &mut server_write);
    let download = async {
        let (answer_head, answer_rest) = read_head(&mut server_read).await?;
        let status_line = answer_head.lines().next()?.to_string();
        client_write
            .write_all(rewrite_head(&answer_head, &status_line).as_bytes())
            .await
            .ok()?;
        client_write.write_all(&answer_rest).await.ok()?;
        tokio::io::copy(&mut server_read, &mut client_write)
            .await
            .ok()?;
        client_write.shutdown().await.ok()
    };
    tokio::select! {
        _ = upload => {}
        _ = download => {}
    }
    Some(())
}

/// Every message of the DLQ: (body, attributes as text, group id).
pub async fn drain_dlq(q: &TestQueue) -> Vec<(String, HashMap<String, String>, Option<String>)> {
    use aws_sdk_sqs::types::MessageSystemAttributeName;
    let mut out = Vec::new();
    for _ in 0..20 {
        let got = q
            .client
            .receive_message()
            .queue_url(&q.dlq_url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        let msgs = got.messages.unwrap_or_default();
        if msgs.is_empty() && !out.is_empty() {
            break;
        }
        for m in msgs {
            let attrs = m
                .message_attributes()
                .map(|a| {
                    a.iter()
                        .map(|(k, v)| {
                            (
                                k.clone(),
                                v.string_value().unwrap_or("<binary>").to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let group = m
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                .cloned();
            out.push((m.body.clone().unwrap_or_default(), attrs, group));
        }
    }
    out
}
