//! Data-safety drills of `qc-worker`: each reproduces a way a default could lose, skip or
//! double-handle a message, against the moto server, redis and real processes. docs/reliability.md
//! records each drill with its counts.

// Expected values are exact results of deterministic arithmetic (rates, ratios, sample values).
#![allow(clippy::float_cmp)]

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::MessageAttributeValue;
use support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn string_attr(v: &str) -> MessageAttributeValue {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(v)
        .build()
        .unwrap()
}

/// An empty key is no key: three different orders whose `orderId` is empty must all be handled, not
/// one handled and two deleted as its duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_idempotency_keys_are_handled_without_dedup_and_counted() {
    let q = TestQueue::new("empty-key", 5, 5, false).await;
    let bodies = vec![
        r#"{"orderId":"","item":"a"}"#.to_string(),
        r#"{"orderId":"","item":"b"}"#.to_string(),
        r#"{"orderId":"   ","item":"c"}"#.to_string(),
        r#"{"orderId":"o-1","item":"d"}"#.to_string(),
        r#"{"orderId":"o-1","item":"d"}"#.to_string(),
    ];
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let a = q.args(&[
        "--idempotency-store",
        "memory",
        "--idempotency-key",
        "jsonPointer:/orderId",
        "--concurrency",
        "1",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    eventually(SECS(60), "queue drained", || q.is_empty()).await;
    let counts = h.counts_by_body();
    for b in &bodies[..3] {
        assert_eq!(counts.get(b), Some(&1), "{b} handled once: {counts:?}");
    }
    // The real key still dedups: o-1 twice is handled once.
    assert_eq!(counts.get(&bodies[3]), Some(&1), "{counts:?}");
    assert_eq!(
        w.metric("qc_worker_idempotency_key_missing_total").await,
        Some(3.0)
    );
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"duplicate\"}")
            .await,
        Some(1.0)
    );
    let warned = w.log_lines("no idempotency key; handling the message without de-duplication");
    assert_eq!(warned.len(), 3, "{}", w.log_text());
    assert!(
        warned
            .iter()
            .all(|l| l["key_source"] == "jsonPointer:/orderId")
    );
    w.stop().await;
}

/// nginx's default `large_client_header_buffers 4 8k`: a request line or header line longer than
/// 8 KiB, or a head over 32 KiB, gets 400 (which the worker reads as poison).
fn nginx_would_reject(c: &Call) -> bool {
    let lines: Vec<usize> = c
        .headers
        .iter()
        .map(|(k, v)| k.len() + 2 + v.len())
        .collect();
    lines.iter().any(|&l| l > 8192) || lines.iter().map(|l| l + 2).sum::<usize>() > 32 * 1024
}

/// A 20 KB attribute would make a 60 KB request head, which a size-limited handler answers with 400,
/// read as poison: the attribute is left out and named instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_kb_attribute_is_left_out_and_named_so_a_size_limited_handler_takes_the_message() {
    let q = TestQueue::new("big-attr", 5, 5, false).await;
    let h = HttpHandler::start(|c| {
        if nginx_would_reject(c) {
            Reply::status(400)
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    q.client
        .send_message()
        .queue_url(&q.url)
        .message_body(r#"{"order":1}"#)
        .message_attributes("tenant", string_attr("t-1"))
        .message_attributes("blob", string_attr(&"x".repeat(20_000)))
        .message_attributes("note", string_attr(&"é".repeat(4_000)))
        .send()
        .await
        .unwrap();
    let a = q.args(&["--on-poison", "delete", "--http-url", &h.url]);
    let mut w = Worker::start(&a);
    eventually(SECS(30), "handler called", || async {
        !h.calls().is_empty()
    })
    .await;
    eventually(SECS(30), "queue drained", || q.is_empty()).await;
    let calls = h.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let c = &calls[0];
    assert_eq!(c.status, 200, "the handler accepted the request");
    assert_eq!(c.headers["x-sqs-attribute-tenant"], "t-1");
    assert_eq!(c.headers["x-qc-omitted-attributes"], "blob,note");
    assert!(!c.headers.contains_key("x-sqs-attribute-blob"));
    let head: usize = c.headers.iter().map(|(k, v)| k.len() + v.len() + 4).sum();
    assert!(head <= 8192, "head of {head} bytes");
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"poison\"}")
            .await,
        Some(0.0)
    );
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"success\"}")
            .await,
        Some(1.0)
    );
    w.stop().await;
}

/// A redis server of this test's own, so it can be stopped and started again on the same port.
struct OwnRedis {
    port: u16,
    child: Option<std::process::Child>,
}

impl OwnRedis {
    fn start() -> OwnRedis {
        let mut r = OwnRedis {
            port: free_port(),
            child: None,
        };
        r.up();
        r
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn up(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(started.elapsed() < SECS(10), "redis did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.down();
    }
}

/// A shared idempotency store the test can take down and bring back: a redis-server of its own, or
/// moto's DynamoDB behind a proxy that fails every DynamoDB request (SQS passes through).
enum OutageStore {
    Redis(OwnRedis),
    DynamoDb(FaultProxy),
}

impl OutageStore {
    async fn start(redis: bool) -> OutageStore {
        if redis {
            OutageStore::Redis(OwnRedis::start())
        } else {
            OutageStore::DynamoDb(FaultProxy::start().await)
        }
    }

    /// The worker's flags for this store on `q` (the DynamoDB one reaches SQS and the table
    /// through the proxy).
    async fn args(&self, q: &TestQueue, extra: &[&str]) -> Vec<String> {
        match self {
            OutageStore::Redis(r) => {
                let url = r.url();
                let mut a = vec!["--idempotency-store", "redis", "--redis-url", &url];
                a.extend(extra);
                q.args(&a)
            }
            OutageStore::DynamoDb(p) => {
                let table = common::dynamodb_table(&common::dynamodb_endpoint(), "id").await;
                let mut a = vec![
                    "--idempotency-store",
                    "dynamodb",
                    "--dynamodb-table",
                    &table,
                ];
                a.extend(extra);
                q.args_via(&p.endpoint, &a)
            }
        }
    }

    async fn down(&mut self) {
        match self {
            OutageStore::Redis(r) => r.down(),
            OutageStore::DynamoDb(p) => {
                p.set(Fault::FailDynamoDb(500, "InternalServerError")).await;
            }
        }
    }

    async fn up(&mut self) {
        match self {
            OutageStore::Redis(r) => r.up(),
            OutageStore::DynamoDb(p) => p.set(Fault::Forward).await,
        }
    }
}

/// While the store (redis, or DynamoDB) is down every claim fails: receiving on would back each
/// message off and cycle the backlog through its receives into the DLQ without one handler call, so
/// the worker stops receiving. One test, run on each shared store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_outage_makes_the_worker_unready_and_stops_receiving_until_it_returns() {
    for redis in [true, false] {
        store_outage_on(redis).await;
    }
}

async fn store_outage_on(redis_store: bool) {
    let q = TestQueue::new("store-outage", 2, 3, false).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut redis = OutageStore::start(redis_store).await;
    let a = redis
        .args(&q, &["--retry-base", "1s", "--http-url", &h.url])
        .await;
    let mut w = Worker::start(&a);
    w.wait_ready(SECS(30)).await;
    redis.down().await;
    let bodies = numbered(20);
    q.send_all(&bodies, |_| String::new()).await;
    eventually(SECS(30), "worker unready", || async {
        matches!(w.get("/readyz").await, Some((503, _)))
    })
    .await;
    // Long enough for the old behaviour to take every message through 3 receives into the DLQ.
    tokio::time::sleep(SECS(15)).await;
    let received_during = w.metric("qc_worker_messages_received_total").await.unwrap();
    assert!(
        matches!(w.get("/readyz").await, Some((503, _))),
        "still unready while the store is down"
    );
    assert_eq!(q.dlq_visible().await, 0, "nothing reached the DLQ");
    assert!(h.calls().is_empty(), "no handler call without a claim");
    redis.up().await;
    eventually(SECS(60), "queue drained after the store returned", || {
        q.is_empty()
    })
    .await;
    w.wait_ready(SECS(10)).await;
    h.assert_each_handled_once(&bodies);
    assert_eq!(q.dlq_visible().await, 0);
    eprintln!(
        "drill store-outage (redis {redis_store}): sent {}, handled {}, received while down {received_during}, received in all {:?}, deleted {:?}, dlq {}",
        bodies.len(),
        h.calls().len(),
        w.metric("qc_worker_messages_received_total").await,
        w.metric("qc_worker_messages_deleted_total").await,
        q.dlq_visible().await
    );
    // At most what the worker holds at once was received while the store was down: the 10 slots
    // and the one batch that may wait for them (released when receiving paused).
    assert!(
        received_during <= 20.0,
        "received {received_during} while the store was down"
    );
    w.stop().await;
}

/// The worker's child processes: (pid, state, command line).
fn children_of(pid: u32) -> Vec<(u32, char, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let mut f = stat[close + 1..].split_whitespace();
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid: u32 = f.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        if ppid == pid {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            out.push((p, state, cmd));
        }
    }
    out
}

/// Processes anywhere whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(format!("/proc/{p}/cmdline"))
            && String::from_utf8_lossy(&c).contains(marker)
        {
            out.push(p);
        }
    }
    out
}

/// In the exec layout the worker is PID 1, so whatever a handler leaves behind becomes its
/// child. Reproduced with the worker made a child subreaper before it starts (the kernel keeps the
/// attribute across exec), which gives it PID 1's duty without a PID namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_handlers_leave_no_zombies_or_strays_after_timeouts_and_forks() {
    let q = TestQueue::new("exec-reap", 30, 10, false).await;
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let marker = format!("qcstray{}", std::process::id());
    // `sleep` under a name of its own, so a stray is found by name.
    let stray = dir.path().join(&marker);
    std::os::unix::fs::symlink(
        Command::new("sh")
            .args(["-c", "command -v sleep"])
            .output()
            .map(|o| String::from_utf8(o.stdout).unwrap().trim().to_string())
            .unwrap(),
        &stray,
    )
    .unwrap();
    let handler = script(
        dir.path(),
        "handle.sh",
        &format!(
            r#"body=$(cat)
case "$body" in
  slow*) sleep 1000 & sleep 1001 & exec sleep 1002 ;;
  fork*) {stray} 300 & exit 0 ;;
  *) exit 0 ;;
esac"#,
            stray = stray.display()
        ),
    );
    let bodies = ["slow-1", "slow-2", "slow-3", "fork-1", "fork-2", "ok-1"];
    for b in bodies {
        q.send_one(b).await;
    }
    let a = q.args(&[
        "--timeout",
        "1s",
        "--retry-base",
        "900s",
        "--concurrency",
        "2",
        "--exec",
        "--",
        handler.to_str().unwrap(),
    ]);
    // python3 sets PR_SET_CHILD_SUBREAPER (36) and execs the worker: PID 1's duty, as in the pod.
    let worker = env!("CARGO_BIN_EXE_qc-worker");
    let wrapper = dir.path().join("as-pid1.py");
    std::fs::write(
        &wrapper,
        format!(
            "import ctypes, os, sys\nctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\nos.execv({worker:?}, [{worker:?}] + sys.argv[1:])\n"
        ),
    )
    .unwrap();
    let mut w = Worker::start_program(
        dir.clone(),
        &["python3", wrapper.to_str().unwrap()],
        &a,
        &[],
    );
    eventually(SECS(60), "3 timeouts and 3 successes", || async {
        w.metric("qc_worker_messages_processed_total{outcome=\"timeout\"}")
            .await
            == Some(3.0)
            && w.metric("qc_worker_messages_processed_total{outcome=\"success\"}")
                .await
                == Some(3.0)
    })
    .await;
    // The reaper runs on SIGCHLD; give the last exits a moment.
    let pid = w.pid();
    let started = std::time::Instant::now();
    while !children_of(pid).is_empty() && started.elapsed() < SECS(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = children_of(pid);
    let zombies = left.iter().filter(|c| c.1 == 'Z').count();
    assert!(
        left.is_empty(),
        "{zombies} zombies among {} children left: {left:?}",
        left.len()
    );
    let strays = processes_with(&marker);
    assert!(
        strays.is_empty(),
        "{} processes forked by the handler outlived it",
        strays.len()
    );
    w.stop().await;
}

/// A handler's 422 must not destroy the message: by default (`onPoison: dead-letter`) it goes to the
/// DLQ with its body, attributes and the reason, then is deleted from the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_goes_to_the_dlq_with_body_attributes_and_reason_by_default() {
    let q = TestQueue::new("poison-dlq", 30, 5, false).await;
    let h = HttpHandler::start(|c| {
        if c.body.starts_with(b"bad") {
            Reply::status(422)
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    for (i, body) in ["bad-1", "good-1", "bad-2 é", "bad-3"].iter().enumerate() {
        q.client
            .send_message()
            .queue_url(&q.url)
            .message_body(*body)
            .message_attributes("tenant", string_attr(&format!("t-{i}")))
            .send()
            .await
            .unwrap();
    }
    let source_arn = common::queue_arn(&q.client, &q.url).await;
    let a = q.args(&["--http-url", &h.url]);
    let mut w = Worker::start(&a);
    eventually(SECS(60), "source queue empty", || q.is_empty()).await;
    let dlq = drain_dlq(&q).await;
    let mut bodies: Vec<&str> = dlq.iter().map(|m| m.0.as_str()).collect();
    bodies.sort_unstable();
    assert_eq!(bodies, ["bad-1", "bad-2 é", "bad-3"], "{dlq:?}");
    for (body, attrs, _) in &dlq {
        assert!(attrs["tenant"].starts_with("t-"), "{body}: {attrs:?}");
        assert_eq!(
            attrs["qc-poison-reason"], "handler answered HTTP 422",
            "{body}"
        );
        assert_eq!(
            attrs["qc-source-arn"], source_arn,
            "{body}: a redrive from a shared DLQ knows it is this queue's"
        );
    }
    assert_eq!(h.calls().len(), 4, "each message handled once");
    assert_eq!(w.metric("qc_worker_dead_lettered_total").await, Some(3.0));
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(4.0)
    );
    w.stop().await;
}

/// Poison on FIFO: the copy keeps its group (SQS needs a group id and a dedup id on a FIFO DLQ).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_poison_reaches_the_fifo_dlq_in_its_group() {
    let q = TestQueue::new("poison-dlq-fifo", 30, 5, true).await;
    let h = HttpHandler::start(|c| {
        if c.body.starts_with(b"bad") {
            Reply::status(400)
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    let bodies: Vec<String> = ["ok-a", "bad-a", "ok-b", "bad-b"]
        .iter()
        .map(std::string::ToString::to_string)
        .collect();
    q.send_all(&bodies, |n| format!("g{}", n % 2)).await;
    let a = q.args(&["--http-url", &h.url]);
    let mut w = Worker::start(&a);
    eventually(SECS(60), "source queue empty", || q.is_empty()).await;
    let mut dlq = drain_dlq(&q).await;
    dlq.sort_by(|x, y| x.0.cmp(&y.0));
    let got: Vec<(&str, Option<&str>)> =
        dlq.iter().map(|m| (m.0.as_str(), m.2.as_deref())).collect();
    assert_eq!(
        got,
        [("bad-a", Some("g1")), ("bad-b", Some("g1"))],
        "{dlq:?}"
    );
    w.stop().await;
}

/// Poison without a DLQ: `dead-letter` acts as `leave`, the message stays on the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_without_a_dlq_is_left_on_the_queue() {
    use qc::aws::QueueReader;
    let client = common::sqs_client().await;
    let url = common::create_queue(
        &client,
        &common::unique_name("poison-no-dlq"),
        &[(
            aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
            "30".to_string(),
        )],
    )
    .await;
    client
        .send_message()
        .queue_url(&url)
        .message_body("bad")
        .send()
        .await
        .unwrap();
    let h = HttpHandler::start(|_| Reply::status(422)).await;
    let mut w = Worker::start(&args(&[
        "--queue-url",
        &url,
        "--endpoint-url",
        &common::sqs_endpoint(),
        "--wait-time",
        "1s",
        "--retry-base",
        "600s",
        "--http-url",
        &h.url,
    ]));
    eventually(SECS(30), "poison judged", || async {
        w.metric("qc_worker_messages_processed_total{outcome=\"poison\"}")
            .await
            == Some(1.0)
    })
    .await;
    tokio::time::sleep(SECS(1)).await;
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(0.0)
    );
    let attrs = qc::aws::SqsReader::new(client.clone());
    let a = attrs.attributes(&url).await.unwrap();
    assert_eq!(
        a["ApproximateNumberOfMessagesNotVisible"], "1",
        "still on the queue"
    );
    assert_eq!(w.log_lines("poison message; the queue has no redrive policy, so it is left on the queue (--on-poison dead-letter acts as leave)").len(), 1);
    w.stop().await;
}

/// A heartbeat call that hangs must be given up before the lease it extends runs out: waited for
/// up to a fixed 10 s call bound, past the end of a 4 s lease, a second worker would get the message
/// too. Heartbeats are batched: the hung ChangeMessageVisibilityBatch carries the three messages
/// received together, and is given up before the earliest of their leases runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_heartbeat_call_is_given_up_in_time_to_keep_the_lease() {
    let q = TestQueue::new("hung-beat", 4, 5, false).await;
    q.send_all(&numbered(3), |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(7))).await;
    let proxy = FaultProxy::start().await;
    proxy
        .set(Fault::HangFirst("ChangeMessageVisibilityBatch"))
        .await;
    let a = q.args_via(&proxy.endpoint, &["--timeout", "30s", "--http-url", &h.url]);
    let mut ws = Replicas::start(&a);
    eventually(SECS(60), "the messages deleted", || async {
        ws.sum("qc_worker_messages_deleted_total").await >= 3.0
    })
    .await;
    // Longer than a lease: a lapse would show as a second call by now.
    tokio::time::sleep(SECS(5)).await;
    let calls = h.calls();
    let failures = ws.sum("qc_worker_heartbeat_failures_total").await;
    eprintln!(
        "drill hung-heartbeat: sent 3, handler calls {}, heartbeat failures {failures}",
        calls.len()
    );
    assert_eq!(calls.len(), 3, "each handled once: {calls:?}");
    assert!(calls.iter().all(|c| c.receive_count == 1), "{calls:?}");
    assert!(failures >= 1.0, "the hung call counted as a failed beat");
    let lost = ws.sum("qc_worker_heartbeat_leases_lost_total").await;
    assert_eq!(lost, 0.0, "the failed beat was retried within the lease");
    assert!(q.is_empty().await);
    ws.stop().await;
}

/// A group's next message must not start as soon as the previous one's delete is queued: if that
/// delete finally failed, the first message would come back after the others (order 1, 2, 3, 1). The
/// next message waits for SQS to confirm the delete, and a delete given up stops the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_next_message_waits_for_the_delete_and_a_failed_delete_stops_the_group() {
    // Visibility 30 s: the first message stays in flight through the delete's retries (ours and the
    // SDK's, ~10-20 s), so the group stays locked until it comes back. With a lease shorter than the
    // retries moto (unlike SQS) could hand out a later message of the group first: it re-reads which
    // groups are in flight only on meeting a lapsed message, so a lapsed later message can pass over
    // an earlier one already made visible (seen once in CI: order 0, 2, 0, 1).
    let q = TestQueue::new("fifo-del", 30, 10, true).await;
    let bodies: Vec<String> = (0..3).map(|i| format!("a-{i:02}")).collect();
    q.send_all(&bodies, |_| "a".to_string()).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(20))).await;
    let proxy = FaultProxy::start().await;
    proxy
        .set(Fault::FailAction("DeleteMessage", 500, "InternalFailure"))
        .await;
    let a = q.args_via(&proxy.endpoint, &["--http-url", &h.url]);
    let mut w = Worker::start(&a);
    eventually(SECS(60), "a delete given up", || async {
        w.metric("qc_worker_delete_failures_total").await >= Some(1.0)
    })
    .await;
    // The worker's own part, whatever order the server hands messages back in: nothing else of
    // the group started while the first one's delete was being tried, and the rest was released.
    let during: Vec<String> = h
        .calls()
        .iter()
        .map(|c| String::from_utf8(c.body.clone()).unwrap())
        .collect();
    assert_eq!(
        during,
        ["a-00"],
        "only the first message ran until its delete was given up"
    );
    eventually(SECS(10), "the group's later messages released", || async {
        w.metric("qc_worker_messages_released_total").await >= Some(2.0)
    })
    .await;
    proxy.set(Fault::Forward).await;
    eventually(SECS(90), "the queue empty", || async { q.is_empty().await }).await;
    let mut calls = h.calls();
    calls.sort_by_key(|c| c.started);
    let order: Vec<String> = calls
        .iter()
        .map(|c| String::from_utf8(c.body.clone()).unwrap())
        .collect();
    let deleted = w.metric("qc_worker_messages_deleted_total").await.unwrap();
    let failed = w.metric("qc_worker_delete_failures_total").await.unwrap();
    let (sent, handled) = (bodies.len(), order.len());
    let duplicates = handled - bodies.len().min(handled);
    let in_dlq = q.dlq_visible().await;
    eprintln!(
        "drill fifo-failed-delete: sent {sent}, handled {handled} ({order:?}), deleted {deleted}, delete failures {failed}, in DLQ {in_dlq}, duplicates {duplicates}"
    );
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(
        order, sorted,
        "a message of the group ran ahead of one whose delete failed"
    );
    for b in &bodies {
        assert!(order.contains(b), "{b} never handled: {order:?}");
    }
    assert_eq!(in_dlq, 0);
    w.stop().await;
}

/// A message whose key another worker has in progress must not come back every visibility timeout
/// while the claim lasts (with maxReceiveCount 2 it would reach the DLQ with no handler call at all):
/// it is hidden until the claim ends, the holder keeps its claim while the
/// handler runs, and the copy is deleted as done once the first completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_progress_elsewhere_is_hidden_until_done_not_burned_into_the_dlq() {
    // VisibilityTimeout 2 s, maxReceiveCount 2: leaving a copy would put it in the DLQ by 4-6 s,
    // while the first handler call takes 6 s.
    let q = TestQueue::new("in-progress", 2, 2, false).await;
    let keys = ["k-0", "k-1", "k-2"];
    let bodies: Vec<String> = keys
        .iter()
        .flat_map(|k| {
            let body = format!(r#"{{"orderId":"{k}"}}"#);
            [body.clone(), body]
        })
        .collect();
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(6))).await;
    let a = q.args(&[
        "--timeout",
        "10s",
        "--batch-size",
        "1",
        "--http-url",
        &h.url,
    ]);
    let mut ws = Replicas::start(&[a, redis_orders_args()].concat());
    let started = std::time::Instant::now();
    eventually(SECS(90), "the source queue empty", || q.is_empty()).await;
    let drained_s = started.elapsed().as_secs();
    let sum = |name| ws.sum(name);
    let waited = sum("qc_worker_messages_processed_total{outcome=\"in_progress_elsewhere\"}").await;
    let duplicates = sum("qc_worker_messages_processed_total{outcome=\"duplicate\"}").await;
    let deleted = sum("qc_worker_messages_deleted_total").await;
    let claims_lost = sum("qc_worker_idempotency_claims_lost_total").await;
    let store_errors = sum("qc_worker_idempotency_errors_total").await;
    let in_dlq = q.dlq_visible().await;
    let effects = calls_by_order(&h);
    eprintln!(
        "drill in-progress-elsewhere: sent {}, handled {}, deleted {deleted}, in DLQ {in_dlq}, duplicates {duplicates}, seen in progress {waited}, drained in {drained_s} s, claims lost {claims_lost}",
        bodies.len(),
        h.calls().len(),
    );
    assert_eq!(in_dlq, 0, "no copy burned its receives into the DLQ");
    for k in keys {
        assert_eq!(effects.get(k), Some(&1), "{k} handled once: {effects:?}");
    }
    assert!(waited >= 1.0, "a copy was seen in progress: {waited}");
    assert_eq!(
        duplicates, 3.0,
        "each copy deleted as done after the first completed"
    );
    assert_eq!(deleted, 6.0);
    assert_eq!(claims_lost, 0.0, "the holders renewed their claims");
    assert_eq!(
        store_errors, 0.0,
        "every claim, renewal and completion answered"
    );
    ws.stop().await;
}

/// Growing extensions: with a handler of 6 × VT the gaps between extensions grow to
/// several seconds (extensions of 2, 4, 8, 14 s), but the idempotency claim is renewed on its own
/// timer and lives until the handler's deadline plus 10 s: two workers on one redis, each key sent
/// twice, each key handled once, no claim lost, every copy deleted as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_outlive_the_longer_gaps_between_grown_extensions() {
    let q = TestQueue::new("grown-claim", 2, 2, false).await;
    let keys = ["g-0", "g-1"];
    let bodies: Vec<String> = keys
        .iter()
        .flat_map(|k| {
            let body = format!(r#"{{"orderId":"{k}"}}"#);
            [body.clone(), body]
        })
        .collect();
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(12))).await;
    let a = q.args(&[
        "--timeout",
        "14s",
        "--batch-size",
        "1",
        "--http-url",
        &h.url,
    ]);
    let mut ws = Replicas::start(&[a, redis_orders_args()].concat());
    eventually(SECS(120), "the source queue empty", || q.is_empty()).await;
    let sum = |name| ws.sum(name);
    let effects = calls_by_order(&h);
    for k in keys {
        assert_eq!(effects.get(k), Some(&1), "{k} handled once: {effects:?}");
    }
    assert_eq!(
        sum("qc_worker_messages_processed_total{outcome=\"duplicate\"}").await,
        2.0,
        "each copy deleted as done"
    );
    assert_eq!(sum("qc_worker_idempotency_claims_lost_total").await, 0.0);
    assert_eq!(sum("qc_worker_heartbeat_leases_lost_total").await, 0.0);
    // Extensions of 2, 4, 8 and 14 s (at about 0.7, 1.3, 2.7, 5.3 and 10 s) per 12 s handler: the
    // grown gaps were really there (a fixed VT every VT/3 would make about 18).
    let beats = sum("qc_worker_heartbeats_total").await;
    let handled = sum("qc_worker_messages_processed_total{outcome=\"success\"}").await;
    assert_eq!(handled, 2.0);
    assert!(
        beats <= 7.0 * handled,
        "at most 7 extensions per 12 s handler, saw {beats} for {handled}"
    );
    assert_eq!(q.dlq_visible().await, 0);
    ws.stop().await;
}

/// Busy loops beside the test, one per core, so the worker's tasks, the handler and moto compete for
/// the CPU as on a loaded node. Stopped when dropped.
struct CpuHogs(Vec<std::process::Child>);

impl CpuHogs {
    fn start() -> CpuHogs {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        CpuHogs(
            (0..cores)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// #27 item 7: SIGTERM mid-batch on a loaded machine, repeated. 60 messages, 1 s handler, concurrency
/// 10, batch 10, VT 30 s; SIGTERM once the third wave is running (a batch running, one received ahead),
/// then a second worker takes the rest. In every round each message reaches the handler exactly once
/// (no second start, so no two calls of one message overlap), and every call that started finished
/// (none cut by the shutdown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_batch_under_cpu_load_never_starts_a_message_twice_or_cuts_one() {
    let _hogs = CpuHogs::start();
    for round in 0..3 {
        let q = TestQueue::new(&format!("stress{round}"), 30, 5, false).await;
        let bodies = numbered(60);
        q.send_all(&bodies, |_| String::new()).await;
        let h = HttpHandler::start(|_| Reply::ok(SECS(1))).await;
        let a = q.args(&[
            "--concurrency",
            "10",
            "--batch-size",
            "10",
            "--http-url",
            &h.url,
        ]);
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let mut first = Worker::start_in(dir.clone(), &a);
        eventually(SECS(60), "the third wave running", || async {
            h.calls().len() > 20
        })
        .await;
        first.signal("TERM");
        let status = first.wait_exit(SECS(40)).await;
        assert!(status.success(), "round {round}: exit status {status:?}");
        let cut: Vec<_> = h
            .calls()
            .into_iter()
            .filter(|c| c.finished.is_none())
            .collect();
        assert!(
            cut.is_empty(),
            "round {round}: calls cut by the shutdown: {cut:?}"
        );

        let mut second = Worker::start_in(dir, &a);
        eventually(SECS(90), "the rest handled", || q.is_empty()).await;
        second.stop().await;
        let counts = h.counts_by_body();
        let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "round {round}: started more than once: {twice:?}\nfirst worker:\n{}\nsecond worker:\n{}",
            first.log_text(),
            second.log_text()
        );
        h.assert_each_handled_once(&bodies);
        assert!(
            h.calls().iter().all(|c| c.finished.is_some()),
            "round {round}: a call was cut"
        );
        assert_eq!(q.dlq_visible().await, 0, "round {round}");
    }
}

/// #34 item 4: a poison message that already carries SQS's ten attributes reaches the DLQ with all
/// ten (none dropped for ours); its reason, finding no room, is never lost silently: the worker's
/// log line carries it under the copy's message id, and a counter says it happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_reason_without_room_is_logged_under_the_copys_id_and_counted() {
    let q = TestQueue::new("poison-ten-attrs", 30, 5, false).await;
    let mut req = q
        .client
        .send_message()
        .queue_url(&q.url)
        .message_body("bad");
    for i in 0..10 {
        req = req.message_attributes(
            format!("a{i}"),
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(format!("v{i}"))
                .build()
                .unwrap(),
        );
    }
    req.send().await.unwrap();
    let h = HttpHandler::start(|_| Reply::status(400)).await;
    let mut w = Worker::start(&q.args(&["--http-url", &h.url]));
    eventually(SECS(30), "dead-lettered", || async {
        q.dlq_visible().await == 1
    })
    .await;
    eventually(SECS(10), "counted", || async {
        w.metric("qc_worker_dead_letter_reasons_unattached_total")
            .await
            == Some(1.0)
    })
    .await;
    let got = drain_dlq(&q).await;
    assert_eq!(got.len(), 1);
    let (body, attrs, _) = &got[0];
    assert_eq!(body, "bad");
    let mut names: Vec<&String> = attrs.keys().collect();
    names.sort();
    assert_eq!(
        names.len(),
        10,
        "the message's own ten, all kept: {attrs:?}"
    );
    assert!(names.iter().all(|n| n.starts_with('a')), "{names:?}");
    let log = std::fs::read_to_string(&w.log).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("WITHOUT its qc-poison-reason"))
        .unwrap_or_else(|| panic!("no log line for the unattached reason:\n{log}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert!(
        !v["dead_letter_message_id"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{line}"
    );
    assert!(
        v["reason"].as_str().unwrap_or_default().contains("400"),
        "{line}"
    );
    w.stop().await;
}

/// #40 item 3: SQS (and moto) may hand one message to two receives. Here every message of every
/// receive comes twice (same id, through the fault proxy): each receive of a message starts one
/// handler call, a failed message is never deleted through its copy (all 20 reach the DLQ after
/// maxReceiveCount), and each healthy one is handled and deleted once. On main 98389f7 both copies
/// started a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_received_twice_starts_once_and_a_failed_copy_is_never_deleted() {
    let q = TestQueue::new("twice", 30, 2, false).await;
    let bodies = numbered(60);
    q.send_all(&bodies, |_| String::new()).await;
    let failing = |body: &[u8]| {
        let text = String::from_utf8_lossy(body);
        let n: usize = text
            .trim_start_matches("{\"n\":")
            .trim_end_matches('}')
            .parse()
            .unwrap();
        n.is_multiple_of(3)
    };
    let h = HttpHandler::start(move |c| {
        if failing(&c.body) {
            Reply::status(500)
        } else {
            Reply::ok(Duration::from_millis(50))
        }
    })
    .await;
    let proxy = FaultProxy::start().await;
    proxy.set(Fault::DuplicateReceived).await;
    let a = q.args_via(
        &proxy.endpoint,
        &[
            "--breaker",
            "false",
            "--retry-base",
            "1s",
            "--concurrency",
            "10",
            "--http-url",
            &h.url,
        ],
    );
    let mut w = Worker::start(&a);
    eventually(SECS(90), "40 deleted and 20 in the DLQ", || async {
        w.metric("qc_worker_messages_deleted_total")
            .await
            .unwrap_or(0.0)
            >= 40.0
            && q.dlq_visible().await == 20
    })
    .await;
    // One call per receive of each message: never two for the same receive count.
    let mut per_receive: HashMap<(String, u32), usize> = HashMap::new();
    for c in h.calls() {
        *per_receive
            .entry((
                String::from_utf8_lossy(&c.body).to_string(),
                c.receive_count,
            ))
            .or_default() += 1;
    }
    let twice: Vec<_> = per_receive.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "started twice in one receive: {twice:?}");
    let counts = h.counts_by_body();
    for (n, b) in bodies.iter().enumerate() {
        let want = if n % 3 == 0 { 2 } else { 1 };
        assert_eq!(counts.get(b), Some(&want), "{b}: {counts:?}");
    }
    assert!(
        w.metric("qc_worker_duplicate_receives_total")
            .await
            .unwrap_or(0.0)
            >= 60.0,
        "every copy counted"
    );
    w.stop().await;
}
