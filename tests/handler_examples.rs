//! The example handlers of docs/handler-contract.md (examples/handlers/), each driven by the real
//! `qc-worker` against moto: successes deleted, a transient failure retried, poison per --on-poison.
//! The Go, Java and TypeScript kits are built once per run of this binary (go build, javac, tsc) into
//! a directory of their own and run in single and batch mode at once. A missing toolchain skips a
//! kit's test with a line saying so, except in CI (`CI=true`) or with `QC_REQUIRE_KITS=1`, where it
//! fails the test.

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
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

/// `qc-worker invoke --batch` with these lines on stdin (one message each): every line it printed
/// and its exit status.
fn invoke_batch(handler: &[&str], bodies: &[&str]) -> (Vec<String>, i32) {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .args(["invoke", "--batch", "--timeout", "10s"])
        .args(handler)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = bodies.join("\n");
    input.push('\n');
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        stdout.lines().map(str::to_string).collect(),
        out.status.code().unwrap_or(-1),
    )
}

/// The lines `invoke --batch` printed for the messages (not the handler's own), by message id.
fn invoke_items(lines: &[String]) -> Vec<(String, String)> {
    lines
        .iter()
        .filter_map(|l| l.split_once(": "))
        .filter(|(id, _)| id.starts_with("00000000-0000-4000-8000-"))
        .map(|(id, rest)| (id.to_string(), rest.to_string()))
        .collect()
}

/// A good order, the flaky one on its first delivery and a body that is not JSON in one batch: the
/// first deleted, the other two named in batchItemFailures and retried; exit 75.
fn assert_invoke_batch_partial(handler: &[&str]) {
    let (lines, code) = invoke_batch(handler, &[GOOD[0], FLAKY, POISON[0]]);
    assert_eq!(code, 75, "{lines:#?}");
    let items = invoke_items(&lines);
    let verdicts: Vec<(&str, bool)> = items
        .iter()
        .map(|(id, l)| {
            (
                &id[id.len() - 1..],
                l.starts_with("retried: named in batchItemFailures"),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [("1", false), ("2", true), ("3", true)],
        "{lines:#?}"
    );
    assert!(items[0].1.starts_with("deleted: "), "{lines:#?}");
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("batch of 3: 1 deleted, 2 retried;"),
        "{lines:#?}"
    );
    // Every item done: all deleted, exit 0.
    let (lines, code) = invoke_batch(handler, &[GOOD[0], GOOD[1]]);
    assert_eq!(code, 0, "{lines:#?}");
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with("batch of 2: 2 deleted, 0 retried;"),
        "{lines:#?}"
    );
}

#[test]
fn invoke_reads_the_python_exec_batch_handlers_answer_file() {
    let handler = example("exec_batch_handler.py");
    assert_invoke_batch_partial(&["--exec", "--", handler.to_str().unwrap()]);
}

/// The Go kit's batch endpoint, read item by item; its single-message endpoint answers a batch with
/// 422 (an array is no order), which retries every item rather than dead-lettering them.
#[test]
fn invoke_reads_a_batch_answer_from_the_go_kit() {
    let Some(kit) = built(KitName::Go) else {
        return;
    };
    let port = free_port();
    let _server = KitServer::start(kit, port);
    wait_listening(port);
    assert_invoke_batch_partial(&["--http-url", &format!("http://127.0.0.1:{port}/batch")]);
    let (lines, code) = invoke_batch(
        &["--http-url", &format!("http://127.0.0.1:{port}/messages")],
        &[GOOD[0], GOOD[1]],
    );
    assert_eq!(code, 75, "{lines:#?}");
    let items = invoke_items(&lines);
    assert_eq!(items.len(), 2, "{lines:#?}");
    for (_, l) in &items {
        assert!(
            l.starts_with("retried: handler answered HTTP 422 for the whole batch"),
            "{lines:#?}"
        );
    }
    assert!(
        lines
            .last()
            .unwrap()
            .starts_with("batch of 2: 0 deleted, 2 retried; the whole batch: retry:"),
        "{lines:#?}"
    );
}

#[test]
fn invoke_refuses_several_bodies_without_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    std::fs::write(&a, GOOD[0]).unwrap();
    std::fs::write(&b, GOOD[1]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .arg("invoke")
        .arg("--body")
        .arg(&a)
        .arg("--body")
        .arg(&b)
        .args(["--http-url", "http://127.0.0.1:9/messages"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only with --batch"), "{err}");
}

// The kits: Go, Java and TypeScript HTTP handlers, each serving single mode on /messages and batch
// mode on /batch.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KitName {
    Go,
    Java,
    TypeScript,
}

impl KitName {
    /// The `handler` field of the kit's decision lines.
    fn label(self) -> &'static str {
        match self {
            KitName::Go => "go",
            KitName::Java => "java",
            KitName::TypeScript => "typescript",
        }
    }
}

/// A built kit: the command that serves it (its port follows).
struct Kit {
    name: KitName,
    command: Vec<OsString>,
}

/// A missing toolchain: a failure in CI (CI=true) or with QC_REQUIRE_KITS=1, else a loud skip.
fn toolchain_missing(kit: KitName, what: &str) {
    let required = std::env::var("CI").as_deref() == Ok("true")
        || std::env::var("QC_REQUIRE_KITS").as_deref() == Ok("1");
    assert!(
        !required,
        "the {kit:?} handler kit cannot be built: {what} (CI=true or QC_REQUIRE_KITS=1: a missing toolchain fails; scripts/test installs TypeScript with ensure_typescript)"
    );
    eprintln!("SKIPPED: the {kit:?} handler kit cannot be built here: {what}");
}

/// Where this test binary builds the kits: under the target's tmp dir, one directory per process;
/// those of processes that are gone are removed first.
fn kits_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("handler-kits");
    if let Ok(entries) = std::fs::read_dir(&root) {
        for e in entries.flatten() {
            let pid = e.file_name().to_string_lossy().to_string();
            if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(&pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = root.join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs a build step; Err with its output when it fails to start or exits non-zero.
fn build_step(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?} cannot start: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether `program --version`-like `args` runs: the toolchain is there.
fn runs(program: &Path, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// tsc from the `typescript` npm package, installed outside the clone by scripts/test
/// (`ensure_typescript`): QC_TEST_TSC, else under the project's cache.
fn tsc() -> PathBuf {
    if let Some(p) = std::env::var_os("QC_TEST_TSC") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("QC_CACHE").map_or_else(
        || {
            Path::new(&std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/queue-consumer-operator")
        },
        PathBuf::from,
    );
    cache.join("typescript/node_modules/.bin/tsc")
}

/// Builds a kit (go build, javac, tsc) into this process's kits directory; None when its toolchain
/// is missing outside CI (see `toolchain_missing`). A kit whose toolchain is there but whose build
/// fails fails the test.
fn build(name: KitName) -> Option<Kit> {
    let out = kits_dir().join(name.label());
    std::fs::create_dir_all(&out).unwrap();
    let src = example(match name {
        KitName::Go => "go",
        KitName::Java => "java",
        KitName::TypeScript => "typescript",
    });
    let started = std::time::Instant::now();
    let command: Vec<OsString> = match name {
        KitName::Go => {
            if !runs(Path::new("go"), &["version"]) {
                toolchain_missing(name, "no `go` on PATH");
                return None;
            }
            let bin = out.join("qc-handler");
            // Standard library only: no module download may happen (GOPROXY=off), nor a toolchain one.
            build_step(
                Command::new("nice")
                    .args(["go", "build", "-o"])
                    .arg(&bin)
                    .arg(".")
                    .current_dir(&src)
                    .env("GOTOOLCHAIN", "local")
                    .env("GOPROXY", "off")
                    .env("GOFLAGS", "-mod=readonly"),
            )
            .unwrap_or_else(|e| panic!("building the Go kit: {e}"));
            vec![bin.into()]
        }
        KitName::Java => {
            if !runs(Path::new("javac"), &["-version"]) || !runs(Path::new("java"), &["-version"]) {
                toolchain_missing(name, "no `javac` and `java` (JDK 17) on PATH");
                return None;
            }
            build_step(
                Command::new("nice")
                    .args(["javac", "-Xlint:all", "-Werror", "-d"])
                    .arg(&out)
                    .arg("Handler.java")
                    .current_dir(&src),
            )
            .unwrap_or_else(|e| panic!("building the Java kit: {e}"));
            vec![
                "java".into(),
                "-XX:TieredStopAtLevel=1".into(),
                "-cp".into(),
                out.clone().into(),
                "Handler".into(),
            ]
        }
        KitName::TypeScript => {
            let tsc = tsc();
            if !runs(Path::new("node"), &["--version"]) {
                toolchain_missing(name, "no `node` on PATH");
                return None;
            }
            if !tsc.exists() {
                toolchain_missing(
                    name,
                    &format!(
                        "no tsc at {} (set QC_TEST_TSC, or run `source scripts/lib.sh; ensure_typescript`)",
                        tsc.display()
                    ),
                );
                return None;
            }
            // @types/node sits beside typescript in the same node_modules.
            let types = tsc
                .parent()
                .and_then(Path::parent)
                .map(|m| m.join("@types"))
                .unwrap();
            build_step(
                Command::new("nice")
                    .arg("node")
                    .arg(&tsc)
                    .arg("-p")
                    .arg(&src)
                    .arg("--outDir")
                    .arg(&out)
                    .arg("--typeRoots")
                    .arg(&types),
            )
            .unwrap_or_else(|e| panic!("building the TypeScript kit: {e}"));
            vec!["node".into(), out.join("http_handler.js").into()]
        }
    };
    eprintln!(
        "built the {name:?} kit in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Some(Kit { name, command })
}

/// The kit, built at most once per run of this binary (tests that need it wait for the one build).
fn built(name: KitName) -> Option<&'static Kit> {
    static GO: OnceLock<Option<Kit>> = OnceLock::new();
    static JAVA: OnceLock<Option<Kit>> = OnceLock::new();
    static TS: OnceLock<Option<Kit>> = OnceLock::new();
    let cell = match name {
        KitName::Go => &GO,
        KitName::Java => &JAVA,
        KitName::TypeScript => &TS,
    };
    cell.get_or_init(|| build(name)).as_ref()
}

/// A kit's server as a child process, its output in a file, killed on drop.
struct KitServer {
    child: Child,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl KitServer {
    fn start(kit: &Kit, port: u16) -> KitServer {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("handler.out");
        let file = std::fs::File::create(&out).unwrap();
        let child = Command::new(&kit.command[0])
            .args(&kit.command[1..])
            .args(["--port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("the {:?} kit starts: {e}", kit.name));
        KitServer {
            child,
            out,
            _dir: dir,
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// The kit's decision lines of one mode ("single" or "batch").
    fn decisions(&self, kit: &Kit, mode: &str) -> (Vec<serde_json::Value>, String) {
        let out = self.output();
        let lines = decisions(&out)
            .into_iter()
            .filter(|l| l["handler"] == kit.name.label() && l["mode"] == mode)
            .collect();
        (lines, out)
    }
}

impl Drop for KitServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CloudEvent every decision line saw: the type, the queue ARN as source, an id, and the
/// content type guessed from the body (JSON and text among them).
fn assert_cloudevents(lines: &[serde_json::Value], log: &str) {
    for l in lines {
        assert_eq!(l["type"], "dev.consumers.sqs.message", "{l}; log:\n{log}");
        assert!(
            l["source"]
                .as_str()
                .is_some_and(|s| s.starts_with("arn:aws:sqs:")),
            "the source is the queue ARN: {l}"
        );
        assert!(l["id"].as_str().is_some_and(|s| !s.is_empty()), "{l}");
    }
    let types: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["contentType"].as_str())
        .collect();
    assert!(types.contains(&"text/plain; charset=utf-8"), "{types:?}");
    assert!(types.contains(&"application/json"), "{types:?}");
}

/// Single mode (/messages), the default onPoison (dead-letter): the good orders deleted after one
/// call, the flaky one answered 429 with Retry-After 1 and deleted on its second delivery, both
/// poison bodies answered 422 once and sent to the DLQ with the reason.
async fn kit_single_mode(kit: &Kit, server: &KitServer, port: u16) {
    let q = TestQueue::new(&format!("kit-{}", kit.name.label()), 5, 3, false).await;
    send_orders(&q).await;
    let url = format!("http://127.0.0.1:{port}/messages");
    let mut w = Worker::start(&q.args(&["--retry-base", "0s", "--http-url", &url]));
    eventually(LIMIT, "both poison bodies in the DLQ", || async {
        q.dlq_visible().await == 2
    })
    .await;
    eventually(Duration::from_secs(20), "queue empty", || q.is_empty()).await;
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"success\"}")
            .await,
        Some(4.0),
        "the good and the flaky orders"
    );
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"poison\"}")
            .await,
        Some(2.0)
    );
    let mut dead: Vec<(String, String)> = drain_dlq(&q)
        .await
        .into_iter()
        .map(|(body, attrs, _)| {
            (
                body,
                attrs.get("qc-poison-reason").cloned().unwrap_or_default(),
            )
        })
        .collect();
    dead.sort();
    let bodies: Vec<&str> = dead.iter().map(|(b, _)| b.as_str()).collect();
    let mut want = POISON.to_vec();
    want.sort_unstable();
    assert_eq!(bodies, want, "{dead:?}");
    for (_, reason) in &dead {
        assert!(reason.contains("HTTP 422"), "{dead:?}");
    }
    let (lines, log) = server.decisions(kit, "single");
    assert_outcomes(&lines, &log);
    assert_cloudevents(&lines, &log);
    w.stop_within(Duration::from_secs(30)).await;
}

/// Batch mode (/batch): only the items the answer names are retried; the good orders deleted after
/// one call, the flaky one after its second delivery, the poison bodies (named every time) moved to
/// the DLQ by the redrive policy after two receives.
async fn kit_batch_mode(kit: &Kit, server: &KitServer, port: u16) {
    let q = TestQueue::new(&format!("kit-{}-batch", kit.name.label()), 5, 2, false).await;
    send_orders(&q).await;
    let url = format!("http://127.0.0.1:{port}/batch");
    let mut w = Worker::start(&q.args(&[
        "--batch-max-items",
        "10",
        "--batch-max-wait",
        "1s",
        "--retry-base",
        "1s",
        "--retry-max",
        "1s",
        "--http-url",
        &url,
    ]));
    eventually(LIMIT, "both poison bodies in the DLQ", || async {
        q.dlq_visible().await == 2
    })
    .await;
    eventually(Duration::from_secs(20), "queue empty", || q.is_empty()).await;
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(4.0),
        "the good and the flaky orders"
    );
    let (lines, log) = server.decisions(kit, "batch");
    let m = by_order(&lines);
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
    let poison: Vec<u64> = m
        .get("")
        .map(|v| v.iter().map(|(_, n)| *n).collect())
        .unwrap_or_default();
    assert_eq!(
        poison,
        [1, 1, 2, 2],
        "two bodies, two deliveries each; log:\n{log}"
    );
    assert_cloudevents(&lines, &log);
    w.stop_within(Duration::from_secs(30)).await;
}

/// Builds the kit (once), starts it, and runs single and batch mode at once, each on its own queue.
async fn kit_in_both_modes(name: KitName) {
    let Some(kit) = built(name) else {
        return;
    };
    let port = free_port();
    let server = KitServer::start(kit, port);
    tokio::join!(
        Box::pin(kit_single_mode(kit, &server, port)),
        Box::pin(kit_batch_mode(kit, &server, port))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_kit_single_and_batch_mode() {
    Box::pin(kit_in_both_modes(KitName::Go)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_kit_single_and_batch_mode() {
    Box::pin(kit_in_both_modes(KitName::Java)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_kit_single_and_batch_mode() {
    Box::pin(kit_in_both_modes(KitName::TypeScript)).await;
}
