//! The example handlers of docs/handler-contract.md (examples/handlers/), each driven by the real
//! `qc-worker` against moto: successes deleted, a transient failure retried, poison per --on-poison.

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;

const LIMIT: Duration = Duration::from_mins(1);

/// Three good orders, one that fails its first delivery, two poison bodies (not JSON; no orderId).
const GOOD: [&str; 3] = [
    r#"{"orderId":"o-1","amount":12}"#,
    r#"{"orderId":"o-2","amount":7}"#,
    r#"{"orderId":"o-3","amount":1}"#,
];
const FLAKY: &str = r#"{"orderId":"o-4","flaky":true}"#;
const POISON: [&str; 2] = ["this is not JSON", r#"{"amount":5}"#];

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/handlers")
        .join(name)
}

async fn send_orders(q: &TestQueue) {
    let bodies: Vec<String> = GOOD
        .iter()
        .chain([FLAKY].iter())
        .chain(POISON.iter())
        .map(std::string::ToString::to_string)
        .collect();
    q.send_all(&bodies, |_| String::new()).await;
}

/// The JSON lines an example handler printed (one per decision), from a log that may hold others.
fn decisions(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("result").is_some())
        .collect()
}

/// (result, receiveCount) of every decision, per orderId ("" for poison, which has none).
fn by_order(lines: &[serde_json::Value]) -> HashMap<String, Vec<(String, u64)>> {
    let mut m: HashMap<String, Vec<(String, u64)>> = HashMap::new();
    for l in lines {
        let order = l["orderId"].as_str().unwrap_or("").to_string();
        m.entry(order).or_default().push((
            l["result"].as_str().unwrap().to_string(),
            l["receiveCount"].as_u64().unwrap(),
        ));
    }
    for v in m.values_mut() {
        v.sort_by_key(|(_, n)| *n);
    }
    m
}

/// Every good order done once on its first delivery, the flaky one retried once, each poison body
/// seen by the handler exactly once.
fn assert_outcomes(lines: &[serde_json::Value], log: &str) {
    let m = by_order(lines);
    for n in 1..=3 {
        assert_eq!(
            m.get(&format!("o-{n}")),
            Some(&vec![("done".to_string(), 1)]),
            "o-{n}; log:\n{log}"
        );
    }
    assert_eq!(
        m.get("o-4"),
        Some(&vec![("retry".to_string(), 1), ("done".to_string(), 2)]),
        "the flaky order; log:\n{log}"
    );
    assert_eq!(
        m.get(""),
        Some(&vec![("poison".to_string(), 1), ("poison".to_string(), 1)]),
        "each poison body handled once; log:\n{log}"
    );
}

/// The example HTTP handler as a child process, killed on drop.
struct PythonServer {
    child: Child,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl PythonServer {
    fn start(port: u16) -> PythonServer {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("handler.out");
        let file = std::fs::File::create(&out).unwrap();
        // Run as a program, as a container's command would: the shebang and mode bit are part of it.
        let child = Command::new(example("http_handler.py"))
            .args(["--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("examples/handlers/http_handler.py starts (python3 on PATH)");
        PythonServer {
            child,
            out,
            _dir: dir,
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_http_handler_with_on_poison_delete() {
    let q = TestQueue::new("ex-http", 5, 3, false).await;
    send_orders(&q).await;
    let port = free_port();
    let handler = PythonServer::start(port);
    let url = format!("http://127.0.0.1:{port}/messages");
    let a = q.args(&[
        "--on-poison",
        "delete",
        "--retry-base",
        "0s",
        "--http-url",
        &url,
    ]);
    let mut w = Worker::start(&a);

    eventually(LIMIT, "all 6 messages deleted", || async {
        w.metric("qc_worker_messages_deleted_total").await == Some(6.0)
    })
    .await;
    eventually(Duration::from_secs(10), "queue empty", || q.is_empty()).await;
    assert_eq!(
        q.dlq_visible().await,
        0,
        "poison was deleted, not dead-lettered"
    );

    let out = handler.output();
    let lines = decisions(&out);
    assert_outcomes(&lines, &out);
    for l in &lines {
        assert_eq!(l["type"], "dev.consumers.sqs.message", "{l}");
        assert!(
            l["source"].as_str().unwrap().starts_with("arn:aws:sqs:"),
            "ce-source is the queue ARN: {l}"
        );
        assert!(!l["id"].as_str().unwrap().is_empty(), "{l}");
    }
    // content-type is guessed from the body when no content-type attribute is set.
    let types: Vec<&str> = lines
        .iter()
        .map(|l| l["contentType"].as_str().unwrap())
        .collect();
    assert!(types.contains(&"text/plain; charset=utf-8"), "{types:?}");
    assert!(types.contains(&"application/json"), "{types:?}");

    let processed = |o: &'static str| {
        let w = &w;
        async move {
            w.metric(&format!(
                "qc_worker_messages_processed_total{{outcome=\"{o}\"}}"
            ))
            .await
        }
    };
    assert_eq!(processed("success").await, Some(4.0));
    assert_eq!(processed("poison").await, Some(2.0));
    assert_eq!(
        processed("transient").await,
        Some(1.0),
        "the flaky order's 429"
    );
    w.stop_within(Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_exec_handler_with_on_poison_leave() {
    let q = TestQueue::new("ex-exec", 5, 3, false).await;
    send_orders(&q).await;
    let handler = example("exec_handler.py");
    let a = q.args(&[
        "--on-poison",
        "leave",
        "--retry-base",
        "0s",
        "--exec",
        "--",
        &handler.display().to_string(),
    ]);
    let mut w = Worker::start(&a);

    eventually(LIMIT, "both poison messages in the DLQ", || async {
        q.dlq_visible().await == 2
    })
    .await;
    eventually(Duration::from_secs(10), "queue empty", || q.is_empty()).await;
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(4.0),
        "the good and the flaky orders"
    );
    let log = w.log_text();
    let lines: Vec<_> = decisions(&log)
        .into_iter()
        .filter(|l| l["handler"] == "exec_handler.py")
        .collect();
    // Left poison is remembered: later receives skip the handler until SQS dead-letters it.
    assert_outcomes(&lines, &log);
    for l in &lines {
        assert!(
            l["queueArn"].as_str().unwrap().starts_with("arn:aws:sqs:"),
            "QC_QUEUE_ARN: {l}"
        );
    }
    w.stop_within(Duration::from_secs(30)).await;
}

/// The Python exec batch handler (#40): its answer in `$QC_BATCH_ANSWER_FILE`, while it logs every
/// body to stdout. The good orders are deleted after one call, the flaky one after its second
/// delivery; the poison bodies, listed as failed every time, reach the DLQ by the redrive policy
/// (maxReceiveCount 2). A body shaped like an answer, logged, changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_exec_batch_handler_answers_in_its_file() {
    let q = TestQueue::new("ex-batch", 5, 2, false).await;
    send_orders(&q).await;
    q.send_one(r#"{"batchItemFailures":[]}"#).await;
    let handler = example("exec_batch_handler.py");
    let a = q.args(&[
        "--batch-max-items",
        "10",
        "--batch-max-wait",
        "1s",
        "--retry-base",
        "1s",
        "--retry-max",
        "1s",
        "--exec",
        "--",
        &handler.display().to_string(),
    ]);
    let mut w = Worker::start(&a);
    eventually(LIMIT, "the poison bodies in the DLQ", || async {
        q.dlq_visible().await == 3
    })
    .await;
    eventually(Duration::from_secs(10), "queue empty", || q.is_empty()).await;
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(4.0),
        "the good and the flaky orders"
    );
    let log = w.log_text();
    let m = by_order(
        &decisions(&log)
            .into_iter()
            .filter(|l| l["handler"] == "exec_batch_handler.py")
            .collect::<Vec<_>>(),
    );
    for n in 1..=3 {
        assert_eq!(
            m.get(&format!("o-{n}")),
            Some(&vec![("done".to_string(), 1)]),
            "o-{n}; log:\n{log}"
        );
    }
    assert_eq!(
        m.get("o-4"),
        Some(&vec![("retry".to_string(), 1), ("done".to_string(), 2)]),
        "the flaky order; log:\n{log}"
    );
    let poison: Vec<u64> = m[""].iter().map(|(_, n)| *n).collect();
    assert_eq!(
        poison,
        [1, 1, 1, 2, 2, 2],
        "three bodies, two deliveries each; log:\n{log}"
    );
    w.stop_within(Duration::from_secs(30)).await;
}

/// The shell handler of scripts/demo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_exec_handler_with_on_poison_delete() {
    let handler = example("exec-handler.sh");
    let q = TestQueue::new("ex-sh", 5, 3, false).await;
    q.send_all(
        &args(&[r#"{"orderId":"o-1"}"#, r#"{"kind":"poison"}"#]),
        |_| String::new(),
    )
    .await;
    let a = q.args(&[
        "--on-poison",
        "delete",
        "--exec",
        "--",
        &handler.display().to_string(),
    ]);
    let mut w = Worker::start(&a);
    eventually(LIMIT, "both messages deleted", || async {
        w.metric("qc_worker_messages_deleted_total").await == Some(2.0)
    })
    .await;
    eventually(Duration::from_secs(10), "queue empty", || q.is_empty()).await;
    assert_eq!(q.dlq_visible().await, 0);
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"poison\"}")
            .await,
        Some(1.0)
    );
    let log = w.log_text();
    assert_eq!(log.matches("is malformed, giving up").count(), 1, "{log}");
    assert_eq!(log.matches("(receive 1)").count(), 1, "{log}");
    w.stop_within(Duration::from_secs(30)).await;
}

/// `qc-worker invoke` (#34 item 6) against each example handler: the outcome line and exit status a
/// handler author sees for a good order, a flaky one and poison.
fn invoke(handler: &[&str], body: &str) -> (String, i32) {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .arg("invoke")
        .args(["--attribute", "tenant=t-1", "--timeout", "10s"])
        .args(handler)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    // The outcome is the last line; an exec handler's own output comes before it.
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    (
        stdout.lines().last().unwrap_or_default().to_string(),
        out.status.code().unwrap_or(-1),
    )
}

fn assert_invoke_outcomes(handler: &[&str]) {
    let (line, code) = invoke(handler, GOOD[0]);
    assert_eq!(code, 0, "{line}");
    assert!(line.starts_with("success"), "{line}");
    let (line, code) = invoke(handler, FLAKY);
    assert_eq!(code, 75, "{line}");
    assert!(line.starts_with("retry"), "{line}");
    for p in POISON {
        let (line, code) = invoke(handler, p);
        assert_eq!(code, 65, "{p}: {line}");
        assert!(line.starts_with("poison"), "{line}");
    }
}

/// Waits until something accepts connections on the port.
fn wait_listening(port: u16) {
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on {port}");
}

#[test]
fn invoke_classifies_the_python_http_handlers_answers() {
    let port = free_port();
    let server = PythonServer::start(port);
    wait_listening(port);
    let url = format!("http://127.0.0.1:{port}/messages");
    assert_invoke_outcomes(&["--http-url", &url]);
    assert!(
        server
            .output()
            .contains("arn:aws:sqs:us-east-1:000000000000:invoke"),
        "the CloudEvent's source reached the handler: {}",
        server.output()
    );
}

#[test]
fn invoke_classifies_the_python_exec_handlers_answers() {
    let handler = example("exec_handler.py");
    let (line, code) = invoke(&["--exec", "--", handler.to_str().unwrap()], GOOD[1]);
    assert_eq!((code, line.starts_with("success")), (0, true), "{line}");
    let (line, code) = invoke(&["--exec", "--", handler.to_str().unwrap()], POISON[0]);
    assert_eq!((code, line.starts_with("poison")), (65, true), "{line}");
}

#[test]
fn invoke_classifies_the_node_http_handlers_answers() {
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("skipped: no node on PATH (the Node example needs it)");
        return;
    }
    let port = free_port();
    let mut node = Command::new("node")
        .arg(example("http_handler.mjs"))
        .args(["--port", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(port);
    let url = format!("http://127.0.0.1:{port}/messages");
    assert_invoke_outcomes(&["--http-url", &url]);
    let _ = node.kill();
    let _ = node.wait();
}
