//! Batch mode (#32 item 1, `--batch-max-items`) against moto: several messages per handler call,
//! per-item failures in Lambda's `batchItemFailures` shape, and the ways a batch could lose or
//! double-handle a message: a failed or malformed call, a call longer than the visibility timeout,
//! FIFO order across a failed item, duplicates inside one batch, SIGTERM mid-call, and (#40) the
//! exec answer on its own channel and one message twice in a batch.

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;
const MS: fn(u64) -> Duration = Duration::from_millis;

/// The events of a batch call, parsed.
fn events(call: &Call) -> Vec<Value> {
    let v: Value = serde_json::from_slice(&call.body).expect("a JSON array of events");
    v.as_array().expect("an array").clone()
}

/// The `data` of each event as compact JSON text.
fn datas(call: &Call) -> Vec<String> {
    events(call).iter().map(|e| e["data"].to_string()).collect()
}

fn failures(ids: &[String]) -> String {
    let list: Vec<Value> = ids
        .iter()
        .map(|id| serde_json::json!({ "itemIdentifier": id }))
        .collect();
    serde_json::json!({ "batchItemFailures": list }).to_string()
}

/// Items named in the answer are retried (and only they); the rest are deleted after one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_items_an_answer_names_are_retried_the_rest_deleted() {
    let q = TestQueue::new("batch-items", 30, 5, false).await;
    let bodies = numbered(30);
    q.send_all(&bodies, |_| String::new()).await;
    // Every fifth message fails on its first delivery.
    let h = HttpHandler::start(|call| {
        let failed: Vec<String> = events(call)
            .iter()
            .filter(|e| e["data"]["n"].as_u64().unwrap() % 5 == 0 && e["sqsreceivecount"] == 1)
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect();
        Reply::answer(MS(50), &failures(&failed))
    })
    .await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "10",
        "--batch-max-wait",
        "300ms",
        "--concurrency",
        "2",
        "--retry-base",
        "1s",
        "--retry-max",
        "1s",
    ]));
    eventually(SECS(60), "the queue drained", || q.is_empty()).await;
    let calls = h.calls();
    let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
    for c in &calls {
        assert_eq!(
            c.headers.get("content-type").map(String::as_str),
            Some("application/cloudevents-batch+json")
        );
        let evs = events(c);
        assert!(!evs.is_empty() && evs.len() <= 10, "{} items", evs.len());
        for e in evs {
            assert_eq!(e["specversion"], "1.0");
            assert_eq!(e["type"], "dev.consumers.sqs.message");
            seen.entry(e["data"].to_string())
                .or_default()
                .push(e["sqsreceivecount"].as_u64().unwrap());
        }
    }
    eprintln!(
        "batch-items: {} calls for 30 messages ({} deliveries)",
        calls.len(),
        seen.values().map(Vec::len).sum::<usize>()
    );
    assert!(
        calls.iter().any(|c| events(c).len() > 1),
        "messages shared calls"
    );
    for (i, b) in bodies.iter().enumerate() {
        let got = seen.get(b).unwrap_or_else(|| panic!("{b} never handled"));
        let want: &[u64] = if i % 5 == 0 { &[1, 2] } else { &[1] };
        assert_eq!(got, want, "{b}: its deliveries' receive counts");
    }
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(30.0)
    );
    assert_eq!(q.dlq_visible().await, 0);
    let calls_metric = w.metric("qc_worker_batch_items_count").await.unwrap();
    assert_eq!(calls_metric as usize, calls.len(), "one observation a call");
    w.stop().await;
}

/// An error status, then a 200 whose body is no batch answer: each retries every item; nothing is
/// deleted until a call succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_or_malformed_call_retries_every_item() {
    let q = TestQueue::new("batch-whole", 30, 5, false).await;
    let bodies = numbered(4);
    q.send_all(&bodies, |_| String::new()).await;
    let n = Arc::new(Mutex::new(0u32));
    let count = n.clone();
    let h = HttpHandler::start(move |_| {
        let mut n = count.lock().unwrap();
        *n += 1;
        match *n {
            1 => Reply::status(500),
            2 => Reply::answer(Duration::ZERO, "OK"),
            3 => Reply::answer(
                Duration::ZERO,
                r#"{"batchItemFailures":[{"itemIdentifier":"not-in-this-batch"}]}"#,
            ),
            _ => Reply::answer(Duration::ZERO, ""),
        }
    })
    .await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "10",
        "--batch-max-wait",
        "1s",
        "--retry-base",
        "1s",
        "--retry-max",
        "1s",
    ]));
    eventually(SECS(60), "the queue drained", || q.is_empty()).await;
    let calls = h.calls();
    let per_call: Vec<Vec<String>> = calls.iter().map(datas).collect();
    eprintln!("batch-whole: {per_call:?}");
    let mut sorted: Vec<Vec<String>> = per_call
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.sort();
            c
        })
        .collect();
    sorted.dedup();
    assert_eq!(calls.len(), 4, "three failed calls, then the good one");
    assert_eq!(
        sorted.len(),
        1,
        "every call carried the same four: {per_call:?}"
    );
    assert_eq!(sorted[0].len(), 4);
    let counts: Vec<Vec<u64>> = calls
        .iter()
        .map(|c| {
            events(c)
                .iter()
                .map(|e| e["sqsreceivecount"].as_u64().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(counts, [[1; 4], [2; 4], [3; 4], [4; 4]]);
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(4.0)
    );
    assert_eq!(q.dlq_visible().await, 0);
    w.stop().await;
}

/// A call longer than the visibility timeout: every lease is extended in the background, so no
/// message comes back while the call runs, and each is handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_longer_than_the_visibility_timeout_keeps_every_lease() {
    let q = TestQueue::new("batch-long", 2, 5, false).await;
    let bodies = numbered(5);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::answer(SECS(6), "")).await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "10",
        "--batch-max-wait",
        "500ms",
    ]));
    eventually(SECS(60), "the queue drained", || q.is_empty()).await;
    let calls = h.calls();
    let mut handled: Vec<String> = calls.iter().flat_map(datas).collect();
    handled.sort();
    let mut want = bodies.clone();
    want.sort();
    assert_eq!(handled, want, "each message in exactly one call");
    for c in &calls {
        for e in events(c) {
            assert_eq!(e["sqsreceivecount"], 1, "no lease lapsed");
        }
    }
    assert_eq!(
        w.metric("qc_worker_heartbeat_leases_lost_total").await,
        Some(0.0)
    );
    w.stop().await;
}

/// FIFO in batch mode reports its groups as single mode does: a group whose first item fails every
/// call is reported with its head's receive count (what the controller names as stuck), a group that
/// drained is no longer held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_batch_mode_reports_a_stuck_groups_head() {
    let q = TestQueue::new("batch-fifo-head", 30, 5, true).await;
    let bodies: Vec<String> = ["bad-0", "bad-1"]
        .into_iter()
        .map(String::from)
        .chain((0..4).map(|i| format!("good-{i}")))
        .collect();
    q.send_all(&bodies, |i| {
        if i < 2 { "g-bad" } else { "g-good" }.to_string()
    })
    .await;
    let h = HttpHandler::start(|call| {
        let failed: Vec<String> = events(call)
            .iter()
            .filter(|e| e["data"].as_str().is_some_and(|d| d.starts_with("bad")))
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect();
        Reply::answer(MS(5), &failures(&failed))
    })
    .await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "10",
        "--retry-base",
        "1s",
        "--retry-max",
        "1s",
        "--breaker",
        "false",
    ]));
    let head = "qc_worker_fifo_group_head_receives{group=\"g-bad\"}";
    eventually(
        SECS(60),
        "g-bad's head reported at its third receive",
        || async { w.metric(head).await.is_some_and(|n| n >= 3.0) },
    )
    .await;
    eventually(SECS(30), "g-good drained and no longer held", || async {
        w.metric("qc_worker_fifo_group_head_receives{group=\"g-good\"}")
            .await
            .is_none()
            && w.metric("qc_worker_fifo_groups").await == Some(1.0)
    })
    .await;
    let good = h
        .calls()
        .iter()
        .flat_map(events)
        .filter(|e| e["data"].as_str().is_some_and(|d| d.starts_with("good")))
        .count();
    assert_eq!(good, 4, "the healthy group went on, each message once");
    w.stop().await;
}

/// FIFO: a failed item holds back the later items of its group in the same batch (not deleted,
/// whatever the answer said: they come again after it), other groups go on, and no group is in
/// two calls at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_a_failed_item_holds_back_the_rest_of_its_group() {
    let q = TestQueue::new("batch-fifo", 30, 5, true).await;
    let bodies: Vec<String> = (0..6)
        .map(|i| format!("a-{i:02}"))
        .chain((0..3).map(|i| format!("b-{i:02}")))
        .collect();
    q.send_all(&bodies, |i| if i < 6 { "a" } else { "b" }.to_string())
        .await;
    let h = HttpHandler::start(|call| {
        let failed: Vec<String> = events(call)
            .iter()
            .filter(|e| e["data"] == "a-02" && e["sqsreceivecount"] == 1)
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect();
        Reply::answer(MS(100), &failures(&failed))
    })
    .await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "10",
        "--retry-base",
        "1s",
        "--retry-max",
        "1s",
    ]));
    eventually(SECS(90), "the queue drained", || q.is_empty()).await;
    let mut calls = h.calls();
    calls.sort_by_key(|c| c.started);
    let per_call: Vec<Vec<String>> = calls
        .iter()
        .map(|c| {
            events(c)
                .iter()
                .map(|e| e["data"].as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    eprintln!("batch-fifo: {per_call:?}");
    // Each call holds one group's messages, in order.
    for items in &per_call {
        let group = &items[0][..1];
        assert!(items.iter().all(|i| i.starts_with(group)), "{items:?}");
        let mut sorted = items.clone();
        sorted.sort();
        assert_eq!(&sorted, items, "in group order");
    }
    // Group a: the last time each message was handled (when it was deleted) follows the group's
    // order, and what came after the failed a-02 was handled again after it.
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (k, items) in per_call.iter().enumerate() {
        for i in items {
            last.insert(
                i.as_str(),
                k * 100 + items.iter().position(|x| x == i).unwrap(),
            );
        }
    }
    let a: Vec<usize> = (0..6).map(|i| last[format!("a-{i:02}").as_str()]).collect();
    assert!(
        a.windows(2).all(|w| w[0] < w[1]),
        "group a's order: {per_call:?}"
    );
    let handled = |name: &str| per_call.iter().flatten().filter(|i| *i == name).count();
    assert_eq!(handled("a-00"), 1);
    assert_eq!(handled("a-02"), 2);
    for later in ["a-03", "a-04", "a-05"] {
        assert!(handled(later) >= 1);
    }
    for b in ["b-00", "b-01", "b-02"] {
        assert_eq!(handled(b), 1, "group b went on: {per_call:?}");
    }
    assert!(h.max_active() <= 2, "at most one call a group");
    assert_eq!(q.dlq_visible().await, 0);
    w.stop().await;
}

/// Idempotency per item: two messages with the same key in one batch reach the handler once; the
/// copy is deleted as a duplicate once the first is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_keys_in_one_batch_reach_the_handler_once() {
    let q = TestQueue::new("batch-idem", 4, 5, false).await;
    let bodies: Vec<String> = ["x", "y", "x", "z"]
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{{\"k\":\"{k}\",\"copy\":{i}}}"))
        .collect();
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::answer(MS(200), "")).await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "10",
        "--batch-max-wait",
        "1s",
        "--idempotency-store",
        "memory",
        "--idempotency-key",
        "jsonPointer:/k",
    ]));
    eventually(SECS(60), "the queue drained", || q.is_empty()).await;
    let keys: Vec<String> = h
        .calls()
        .iter()
        .flat_map(events)
        .map(|e| e["data"]["k"].as_str().unwrap().to_string())
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(sorted, ["x", "y", "z"], "each key handled once: {keys:?}");
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"duplicate\"}")
            .await,
        Some(1.0)
    );
    w.stop().await;
}

/// #40 item 7: `jsonPointer:` keys are type-distinct: the orders `{"k":1}` and `{"k":"1"}` (and
/// `true` and `"true"`) are four keys, so each reaches the handler; before, `1` and `"1"` were one
/// key and the second was deleted as a duplicate without a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_different_json_types_are_different_keys() {
    let q = TestQueue::new("batch-idem-types", 4, 5, false).await;
    let bodies: Vec<String> = ["1", r#""1""#, "true", r#""true""#]
        .iter()
        .map(|k| format!("{{\"k\":{k}}}"))
        .collect();
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::answer(MS(50), "")).await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "10",
        "--batch-max-wait",
        "1s",
        "--idempotency-store",
        "memory",
        "--idempotency-key",
        "jsonPointer:/k",
    ]));
    eventually(SECS(60), "the queue drained", || q.is_empty()).await;
    let mut handled: Vec<String> = h.calls().iter().flat_map(datas).collect();
    handled.sort();
    let mut want = bodies.clone();
    want.sort();
    assert_eq!(handled, want, "each handled once");
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"duplicate\"}")
            .await,
        Some(0.0)
    );
    w.stop().await;
}

/// SIGTERM while a batch call runs: the call finishes, its items are deleted, nothing is handled
/// twice, and the worker exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_call_finishes_the_batch_and_deletes_it() {
    let q = TestQueue::new("batch-term", 30, 5, false).await;
    let bodies = numbered(6);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::answer(SECS(3), "")).await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "10",
        "--batch-max-wait",
        "500ms",
        "--timeout",
        "10s",
    ]));
    eventually(SECS(30), "a call under way", || async {
        !h.calls().is_empty()
    })
    .await;
    w.signal("TERM");
    let status = w.wait_exit(SECS(20)).await;
    assert!(status.success(), "{status}");
    let calls = h.calls();
    let handled: Vec<String> = calls.iter().flat_map(datas).collect();
    assert!(
        calls.iter().all(|c| c.finished.is_some()),
        "the call was not cut"
    );
    let (visible, in_flight, _) = q.counts().await;
    eprintln!(
        "batch-term: {} calls, {} items handled; left visible {visible}, in flight {in_flight}",
        calls.len(),
        handled.len()
    );
    // What was handled is gone from the queue; the rest is back, visible, unhandled.
    assert_eq!(handled.len() as u64 + visible, 6, "{handled:?}");
    assert_eq!(in_flight, 0);
    let mut unique = handled.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), handled.len(), "nothing handled twice");
}

/// Exec: one process per batch, one event per line on stdin; its stdout is its log, and the answer
/// file (`QC_BATCH_ANSWER_FILE`) names the failed items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_batches_read_json_lines_and_answer_in_their_file() {
    let q = TestQueue::new("batch-exec", 30, 5, false).await;
    let bodies = numbered(8);
    q.send_all(&bodies, |_| String::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let program = dir.path().join("handle.py");
    std::fs::write(
        &program,
        format!(
            r#"import json, os, sys
failed = []
n = 0
for line in sys.stdin:
    e = json.loads(line)
    n += 1
    name = "%s-%d" % (e["data"]["n"], e["sqsreceivecount"])
    open(os.path.join({out:?}, name), "w").write(os.environ["QC_BATCH_SIZE"])
    if e["data"]["n"] == 3 and e["sqsreceivecount"] == 1:
        failed.append({{"itemIdentifier": e["id"]}})
print("handled %d items" % n)
with open(os.environ["QC_BATCH_ANSWER_FILE"], "w") as f:
    json.dump({{"batchItemFailures": failed}}, f)
"#,
            out = out.display().to_string()
        ),
    )
    .unwrap();
    let handler = script(
        dir.path(),
        "handle.sh",
        &format!("exec python3 {}", program.display()),
    );
    let mut w = Worker::start(&q.args(&[
        "--batch-max-items",
        "10",
        "--batch-max-wait",
        "500ms",
        "--retry-base",
        "1s",
        "--retry-max",
        "1s",
        "--exec",
        "--",
        handler.to_str().unwrap(),
    ]));
    eventually(SECS(60), "the queue drained", || q.is_empty()).await;
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    files.sort();
    let mut want: Vec<String> = (0..8).map(|n| format!("{n}-1")).collect();
    want.push("3-2".into());
    want.sort();
    assert_eq!(files, want, "each handled once, the failed one twice");
    let log = std::fs::read_to_string(&w.log).unwrap();
    assert!(
        log.contains("handled "),
        "the handler's own output passed on"
    );
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(8.0)
    );
    w.stop().await;
}

/// An exec batch handler in Python: records each item it got as `<n>-<receive count>` in `out`,
/// names as failed every item of its first delivery, and answers both where a handler answered
/// before #40 (its last stdout line) and in `$QC_BATCH_ANSWER_FILE`. `extra` runs after answering.
fn failing_first_delivery_handler(
    dir: &std::path::Path,
    out: &std::path::Path,
    extra: &str,
) -> std::path::PathBuf {
    let program = dir.join("handle.py");
    std::fs::write(
        &program,
        format!(
            r#"import json, os, subprocess, sys
events = [json.loads(line) for line in sys.stdin]
for e in events:
    n = e["data"]["n"] if isinstance(e["data"], dict) and "n" in e["data"] else "x"
    open(os.path.join({out:?}, "%s-%d-%s" % (n, e["sqsreceivecount"], os.getpid())), "w").close()
failed = [{{"itemIdentifier": e["id"]}} for e in events if e["sqsreceivecount"] == 1]
answer = json.dumps({{"batchItemFailures": failed}})
path = os.environ.get("QC_BATCH_ANSWER_FILE")
if path:
    with open(path, "w") as f:
        f.write(answer)
print(answer, flush=True)
{extra}
"#,
            out = out.display().to_string()
        ),
    )
    .unwrap();
    script(
        dir,
        "handle.sh",
        &format!("exec python3 {}", program.display()),
    )
}

/// The deliveries each message got, by its `n`: receive counts, from the handler's records.
fn deliveries(out: &std::path::Path) -> HashMap<String, Vec<u64>> {
    let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
    for e in std::fs::read_dir(out).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        let mut parts = name.split('-');
        let (Some(n), Some(count)) = (parts.next(), parts.next()) else {
            continue;
        };
        seen.entry(n.to_string())
            .or_default()
            .push(count.parse().unwrap());
    }
    for v in seen.values_mut() {
        v.sort_unstable();
    }
    seen
}

/// #40: an exec batch handler names all five items as failed and leaves a process holding its
/// stdout (a helper started in a new session, so the kill of its group misses it). Before, the
/// worker waited 2 s for stdout to close, took the missing answer for "all succeeded" and deleted
/// all five; now the answer is the file, read when the handler exits: none is deleted, each comes
/// back and succeeds on its second delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_an_answer_naming_every_item_is_kept_when_a_process_holds_stdout() {
    let q = TestQueue::new("batch-held", 30, 10, false).await;
    q.send_all(&numbered(5), |_| String::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let handler = failing_first_delivery_handler(
        dir.path(),
        &out,
        r#"subprocess.Popen(["sleep", "20"], start_new_session=True)"#,
    );
    let mut w = Worker::start(&q.args(&[
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
        handler.to_str().unwrap(),
    ]));
    eventually(SECS(45), "each of the five delivered twice", || async {
        let seen = deliveries(&out);
        seen.len() == 5 && seen.values().all(|c| c.len() >= 2)
    })
    .await;
    eventually(SECS(30), "the queue drained", || q.is_empty()).await;
    let seen = deliveries(&out);
    eprintln!("batch-held: {seen:?}");
    for (n, counts) in &seen {
        assert_eq!(counts, &[1, 2], "{n}: failed once, then done");
    }
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(5.0)
    );
    w.stop().await;
}

/// #40: a handler that logs what it handled after answering: a producer's body
/// `{"batchItemFailures":[]}` printed to stdout was read as the answer ("all succeeded") and every
/// failed item of its call deleted. stdout is the handler's log now, never the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_a_body_logged_to_stdout_cannot_pose_as_the_answer() {
    let q = TestQueue::new("batch-forged", 30, 10, false).await;
    let bodies: Vec<String> = vec![
        r#"{"n":0}"#.into(),
        r#"{"batchItemFailures":[]}"#.into(),
        r#"{"n":2}"#.into(),
    ];
    q.send_all(&bodies, |_| String::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let handler = failing_first_delivery_handler(
        dir.path(),
        &out,
        r#"for e in events:
    print(json.dumps(e["data"]), flush=True)"#,
    );
    let mut w = Worker::start(&q.args(&[
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
        handler.to_str().unwrap(),
    ]));
    eventually(SECS(45), "each of the three delivered twice", || async {
        let seen = deliveries(&out);
        seen.len() == 3 && seen.values().all(|c| c.len() >= 2)
    })
    .await;
    eventually(SECS(30), "the queue drained", || q.is_empty()).await;
    let seen = deliveries(&out);
    eprintln!("batch-forged: {seen:?}");
    for (n, counts) in &seen {
        assert_eq!(counts, &[1, 2], "{n}: failed once, then done");
    }
    let log = w.log_text();
    assert!(
        log.contains(r#"{"batchItemFailures": []}"#),
        "the logged body is in the log"
    );
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(3.0)
    );
    w.stop().await;
}

/// #40: SQS (and moto) can hand one message to two receives, so one batch could hold it twice. The
/// proxy doubles the first message of the first receive; the handler names every item of a first
/// delivery as failed. Before, the id named only its first position and the copy counted as a
/// success, deleting the message with its receipt handle; now the worker keeps one lease per id
/// (the copy never reaches a call; `handler::batch::parse_answer` would name every position
/// anyway), nothing is deleted early, and every message comes back for its second delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_identifier_fails_every_copy_of_a_message_in_the_batch() {
    let q = TestQueue::new("batch-twice", 30, 10, false).await;
    let bodies = numbered(3);
    q.send_all(&bodies, |_| String::new()).await;
    let proxy = FaultProxy::start().await;
    proxy.set(Fault::DuplicateFirstReceived).await;
    let h = HttpHandler::start(|call| {
        let failed: Vec<String> = events(call)
            .iter()
            .filter(|e| e["sqsreceivecount"] == 1)
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect();
        Reply::answer(MS(50), &failures(&failed))
    })
    .await;
    let mut w = Worker::start(&q.args_via(
        &proxy.endpoint,
        &[
            "--http-url",
            &h.url,
            "--batch-max-items",
            "10",
            "--batch-max-wait",
            "1s",
            "--retry-base",
            "1s",
            "--retry-max",
            "1s",
        ],
    ));
    eventually(
        SECS(45),
        "every message delivered a second time",
        || async {
            let seen: std::collections::HashSet<String> = h
                .calls()
                .iter()
                .flat_map(events)
                .filter(|e| e["sqsreceivecount"] == 2)
                .map(|e| e["data"].to_string())
                .collect();
            seen.len() == 3
        },
    )
    .await;
    eventually(SECS(30), "the queue drained", || q.is_empty()).await;
    assert!(proxy.fired(), "the proxy doubled a message");
    let per_call: Vec<Vec<(String, u64)>> = h
        .calls()
        .iter()
        .map(|c| {
            events(c)
                .iter()
                .map(|e| {
                    (
                        e["data"].to_string(),
                        e["sqsreceivecount"].as_u64().unwrap(),
                    )
                })
                .collect()
        })
        .collect();
    // The worker holds one lease per message id (`worker::held`): the copy never reaches a call.
    for call in &per_call {
        let mut ids: Vec<&String> = call.iter().map(|(d, _)| d).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(
            ids.len(),
            call.len(),
            "a message twice in one call: {per_call:?}"
        );
    }
    assert_eq!(q.dlq_visible().await, 0);
    w.stop().await;
}

/// The outage breaker sees batch calls: a handler whose dependency is down answers 500 to every
/// call for 8 s; the breaker opens, the failed batches are held for its probes instead of burning
/// their receives, and every message is deleted afterwards with none in the DLQ (maxReceiveCount 3,
/// a 1 s retry: without the breaker they would reach it within the outage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_outage_opens_the_breaker_for_batches_without_filling_the_dlq() {
    let q = TestQueue::new("batch-outage", 30, 3, false).await;
    let bodies = numbered(20);
    q.send_all(&bodies, |_| String::new()).await;
    let until = std::time::Instant::now() + SECS(8);
    let h = HttpHandler::start(move |_| {
        if std::time::Instant::now() < until {
            Reply::status(500)
        } else {
            Reply::answer(MS(20), "")
        }
    })
    .await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "5",
        "--batch-max-wait",
        "200ms",
        "--concurrency",
        "2",
        "--breaker-consecutive",
        "3",
        "--breaker-probe-base",
        "1s",
        "--breaker-probe-max",
        "2s",
        "--retry-base",
        "1s",
        "--retry-max",
        "1s",
    ]));
    eventually(SECS(90), "the queue drained", || q.is_empty()).await;
    let opened = w
        .metric("qc_worker_breaker_transitions_total{to=\"open\"}")
        .await
        .unwrap_or(0.0);
    let calls = h.calls();
    let failed = calls.iter().filter(|c| c.status == 500).count();
    eprintln!(
        "batch-outage: {} calls ({failed} failed), breaker opened {opened} times",
        calls.len()
    );
    assert!(opened >= 1.0, "the breaker opened");
    assert_eq!(q.dlq_visible().await, 0, "no message reached the DLQ");
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(20.0)
    );
    w.stop().await;
}

/// One call at a time of up to five messages, started after 100 ms at most.
fn one_call_of_five(q: &TestQueue, handler_url: &str) -> Vec<String> {
    q.args(&[
        "--http-url",
        handler_url,
        "--batch-max-items",
        "5",
        "--batch-max-wait",
        "100ms",
        "--concurrency",
        "1",
        "--timeout",
        "10s",
    ])
}

/// Fast calls (a round trip is a noticeable share of one): while a call runs the next call's worth
/// is received and waits, never more (one call: one batch ahead). On SIGTERM the batch waiting
/// ahead goes back to the queue unhandled: nothing lost, nothing handled twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_calls_get_one_batch_ahead_which_sigterm_hands_back() {
    let q = TestQueue::new("batch-ahead", 30, 5, false).await;
    let bodies = numbered(60);
    q.send_all(&bodies, |_| String::new()).await;
    // 200 ms: fast enough that prefetch pays (a round trip over 4 ms, 2 % of it), slow enough that the
    // batch received ahead lands while the call runs even when a loaded machine's receive takes 100 ms
    // and more (with 100 ms calls a loaded CI run saw every prefetch land after its call had ended).
    let h = HttpHandler::start(|_| Reply::answer(MS(200), "")).await;
    let mut w = Worker::start(&one_call_of_five(&q, &h.url));
    let mut most = 0.0f64;
    let deadline = std::time::Instant::now() + SECS(60);
    while h.calls().len() < 8 {
        assert!(std::time::Instant::now() < deadline, "8 calls made");
        if let Some(n) = w.metric("qc_worker_in_flight").await {
            most = most.max(n);
        }
        tokio::time::sleep(MS(15)).await;
    }
    assert!(
        most > 5.0,
        "a batch is received while the call runs (prefetch pays for 200 ms calls): at most {most} in flight"
    );
    assert!(most <= 10.0, "one call's worth ahead, no more: saw {most}");
    w.signal("TERM");
    let status = w.wait_exit(SECS(20)).await;
    assert!(status.success(), "{status}");
    let calls = h.calls();
    assert!(
        calls.iter().all(|c| c.finished.is_some()),
        "no call was cut"
    );
    assert!(
        calls.iter().all(|c| events(c).len() <= 5),
        "at most 5 items a call"
    );
    let handled: Vec<String> = calls.iter().flat_map(datas).collect();
    let mut unique = handled.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), handled.len(), "nothing handled twice");
    let (visible, in_flight, _) = q.counts().await;
    eprintln!(
        "batch-ahead: most {most} in flight; {} calls, {} handled; left visible {visible}, in flight {in_flight}",
        calls.len(),
        handled.len()
    );
    assert_eq!(
        in_flight, 0,
        "the batch waiting ahead was handed back at once"
    );
    assert_eq!(handled.len() as u64 + visible, 60, "nothing lost");
}

/// Slow calls (2 s, far beyond a round trip): nothing is received ahead of a free call, so no
/// message spends its visibility waiting (#31's rule, in batch mode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_calls_get_no_batch_ahead() {
    let q = TestQueue::new("batch-slow", 30, 5, false).await;
    let bodies = numbered(10);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::answer(SECS(2), "")).await;
    let mut w = Worker::start(&one_call_of_five(&q, &h.url));
    let mut most = 0.0f64;
    let mut hidden = 0u64;
    let deadline = std::time::Instant::now() + SECS(60);
    while w.metric("qc_worker_messages_deleted_total").await != Some(10.0) {
        assert!(std::time::Instant::now() < deadline, "10 deleted");
        if let Some(n) = w.metric("qc_worker_in_flight").await {
            most = most.max(n);
        }
        // What SQS sees hidden, once the previous call's deletes (batched, at most 200 ms) are out:
        // a call running for more than half a second.
        let settled = h
            .calls()
            .last()
            .is_some_and(|c| c.finished.is_none() && c.started.elapsed() > MS(500));
        if settled {
            hidden = hidden.max(q.counts().await.1);
        }
        tokio::time::sleep(MS(50)).await;
    }
    assert!(most <= 5.0, "only a call's worth in flight, saw {most}");
    assert!(
        (1..=5).contains(&hidden),
        "only a call's worth hidden on the queue mid-call, saw {hidden}"
    );
    let handled: Vec<String> = h.calls().iter().flat_map(datas).collect();
    assert_eq!(handled.len(), 10, "{handled:?}");
    w.stop().await;
}
