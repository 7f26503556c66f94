//! End-to-end tests of `qc-worker`: the real binary against the moto server (and redis), with handlers
//! that record every call. Assertions are on counts and queue state, never on tight timings.

// Expected values are exact results of deterministic arithmetic (rates, ratios, sample values).
#![allow(clippy::float_cmp)]

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The drain summary a worker logs when it stops.
fn stopped(w: &Worker) -> serde_json::Value {
    w.log_lines("stopped")
        .pop()
        .unwrap_or_else(|| panic!("no `stopped` line; log:\n{}", w.log_text()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_500_messages_each_handled_and_deleted() {
    let q = TestQueue::new("drain", 30, 5, false).await;
    let bodies = numbered(500);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(5))).await;
    // moto does not lock a queue between concurrent receives and can hand one message to two of
    // them, which would break the exactly-once count below: the worker's receives (up to 3 at once
    // at C = 10) reach moto one at a time through the proxy. Parallel receives against a server
    // without that race are exercised by the benchmark.
    let proxy = FaultProxy::start().await;
    proxy.set(Fault::DelayAction("ReceiveMessage", 0)).await;
    let mut a = q.args_via(&proxy.endpoint, &[]);
    a.extend(args(&["--concurrency", "10", "--http-url", &h.url]));
    let mut w = Worker::start(&a);

    w.wait_deleted(500, SECS(120)).await;
    let counts = h.counts_by_body();
    let warnings: Vec<String> = w
        .log_text()
        .lines()
        .filter(|l| !l.contains("\"level\":\"INFO\""))
        .map(str::to_string)
        .collect();
    for b in &bodies {
        assert_eq!(
            counts.get(b),
            Some(&1),
            "{b} handled once; worker warnings: {warnings:#?}"
        );
    }
    assert_eq!(h.calls().len(), 500);
    eventually(SECS(10), "queue empty", || q.is_empty()).await;

    let (status, text) = w.get("/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        parse_metric(&text, "qc_worker_messages_received_total"),
        Some(500.0)
    );
    assert_eq!(
        parse_metric(
            &text,
            "qc_worker_messages_processed_total{outcome=\"success\"}"
        ),
        Some(500.0)
    );
    assert_eq!(
        parse_metric(&text, "qc_worker_handler_duration_seconds_count"),
        Some(500.0)
    );
    let deletes = parse_metric(
        &text,
        "qc_worker_sqs_requests_total{action=\"DeleteMessageBatch\"}",
    )
    .unwrap();
    assert!(
        (50.0..500.0).contains(&deletes),
        "deletes are batched: {deletes} calls"
    );
    assert!(
        parse_metric(
            &text,
            "qc_worker_sqs_requests_total{action=\"ReceiveMessage\"}"
        )
        .unwrap()
            >= 25.0
    );
    assert_eq!(parse_metric(&text, "qc_worker_in_flight"), Some(0.0));
    assert!(text.contains("# TYPE qc_worker_handler_duration_seconds histogram"));
    assert_eq!(w.get("/healthz").await.unwrap().0, 200);
    assert_eq!(w.get("/readyz").await.unwrap().0, 200);
    // Every call carried the CloudEvents binary-mode attributes.
    let c = &h.calls()[0];
    assert_eq!(c.headers["ce-specversion"], "1.0");
    assert_eq!(c.headers["ce-type"], "dev.consumers.sqs.message");
    assert!(
        c.headers["ce-source"].starts_with("arn:aws:sqs:"),
        "{:?}",
        c.headers
    );
    assert!(!c.id.is_empty());
    assert_eq!(c.receive_count, 1);

    w.stop_within(SECS(30)).await;
}

/// The worker times each message's stay from SQS's SentTimestamp: to each handler call's start
/// (`qc_worker_message_wait_seconds`, once per call) and to its leaving the queue
/// (`qc_worker_message_dwell_seconds`, once per message). The message waits 2 s before the worker starts
/// and fails once, so both calls waited at least 2 s, and its stay covers both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_and_dwell_time_count_from_the_send_through_a_retry() {
    let q = TestQueue::new("dwell", 30, 5, false).await;
    q.send_one("late").await;
    tokio::time::sleep(SECS(2)).await;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    let h = HttpHandler::start(move |_| {
        if seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            Reply::status(503)
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    let w = Worker::start(&q.args(&["--http-url", &h.url]));
    w.wait_deleted(1, SECS(90)).await;
    let (_, text) = w.get("/metrics").await.unwrap();
    let metric = |name: &str| parse_metric(&text, name).unwrap_or_else(|| panic!("{name}: {text}"));
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(metric("qc_worker_message_wait_seconds_count"), 2.0);
    assert_eq!(metric("qc_worker_message_dwell_seconds_count"), 1.0);
    let (wait, dwell) = (
        metric("qc_worker_message_wait_seconds_sum"),
        metric("qc_worker_message_dwell_seconds_sum"),
    );
    assert!(
        wait >= 4.0,
        "two calls, each at least 2 s after the send: {wait}"
    );
    // The stay ends after the second call began: at least half the two waits (the later one).
    assert!(
        dwell >= wait / 2.0 && dwell >= 2.0,
        "dwell {dwell}, waits {wait}"
    );
    assert!(dwell < 90.0, "{dwell}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_failing_handler_dead_letters_after_max_receive_count() {
    let q = TestQueue::new("dlq", 2, 3, false).await;
    let bodies = numbered(10);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::status(500)).await;
    // Every call failing is an outage to the breaker, which would hold the messages
    // (tests/worker_breaker.rs); this is the retry path without it.
    let a = q.args(&[
        "--breaker",
        "false",
        "--retry-base",
        "0s",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);

    eventually(SECS(90), "10 messages in the DLQ", || async {
        q.dlq_visible().await == 10
    })
    .await;
    eventually(SECS(10), "source queue empty", || q.is_empty()).await;
    let calls = h.calls();
    let mut by_body: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
    for c in &calls {
        by_body
            .entry(c.body.clone())
            .or_default()
            .push(c.receive_count);
    }
    assert_eq!(by_body.len(), 10);
    for (body, mut counts) in by_body {
        counts.sort_unstable();
        assert_eq!(counts, vec![1, 2, 3], "{}", String::from_utf8_lossy(&body));
    }
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(0.0)
    );
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"transient\"}")
            .await,
        Some(30.0)
    );
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_delete_removes_the_message_after_one_call() {
    let q = TestQueue::new("poison-del", 5, 3, false).await;
    let bodies = numbered(8);
    q.send_all(&bodies, |_| String::new()).await;
    // Even bodies are poison (422 and 400), odd ones succeed.
    let h = HttpHandler::start(|c| {
        let n: u32 = String::from_utf8_lossy(&c.body)
            .trim_start_matches("{\"n\":")
            .trim_end_matches('}')
            .parse()
            .unwrap();
        match n % 4 {
            0 => Reply::status(422),
            2 => Reply::status(400),
            _ => Reply::ok(Duration::ZERO),
        }
    })
    .await;
    let a = q.args(&["--on-poison", "delete", "--http-url", &h.url]);
    let mut w = Worker::start(&a);
    w.wait_deleted(8, SECS(60)).await;
    eventually(SECS(10), "queue empty", || q.is_empty()).await;
    assert_eq!(h.calls().len(), 8, "each message handled exactly once");
    assert_eq!(q.dlq_visible().await, 0);
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"poison\"}")
            .await,
        Some(4.0)
    );
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_leave_goes_to_the_dlq_without_calling_the_handler_again() {
    let q = TestQueue::new("poison-leave", 2, 3, false).await;
    let bodies = numbered(5);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::status(422)).await;
    let a = q.args(&[
        "--on-poison",
        "leave",
        "--retry-base",
        "0s",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    eventually(SECS(60), "5 messages in the DLQ", || async {
        q.dlq_visible().await == 5
    })
    .await;
    eventually(SECS(10), "source queue empty", || q.is_empty()).await;
    h.assert_each_handled_once(&bodies);
    assert_eq!(
        w.metric("qc_worker_messages_deleted_total").await,
        Some(0.0)
    );
    // Three receives each before the redrive: the first called the handler, the others did not.
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"poison\"}")
            .await,
        Some(15.0)
    );
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_running_three_visibility_timeouts_is_heartbeated_and_handled_once() {
    // VT 3 s (a 0.75 s margin per heartbeat call) so a slow moto on a loaded machine does not fail a
    // call inside the heartbeat's own deadline; the handler still runs three visibility timeouts.
    let q = TestQueue::new("long", 3, 3, false).await;
    q.send_all(&numbered(3), |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(9))).await;
    let a = q.args(&["--timeout", "20s", "--http-url", &h.url]);
    let mut w = Worker::start(&a);
    w.wait_deleted(3, SECS(60)).await;
    // Longer than one more visibility timeout: a lapsed lease would show as a second call by now.
    tokio::time::sleep(SECS(3)).await;
    h.assert_calls_all_first_deliveries(3);
    assert!(q.is_empty().await);
    let beats = w.metric("qc_worker_heartbeats_total").await.unwrap();
    assert!(
        beats >= 6.0,
        "at least two heartbeats per message, saw {beats}"
    );
    w.assert_no_lease_lost().await;
    w.stop().await;
}

/// Batched heartbeats: 20 messages in flight at once (10 running, 10 received ahead and waiting for a slot),
/// each handler running more than two visibility timeouts: every heartbeat goes out in a
/// ChangeMessageVisibilityBatch (none as a single ChangeMessageVisibility), several messages a call,
/// and each message is handled exactly once. The receives reach moto one at a time through the
/// proxy: moto can hand one message to two concurrent receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_long_messages_are_kept_alive_by_batched_heartbeats_and_handled_once() {
    let q = TestQueue::new("hb-batch", 3, 3, false).await;
    let bodies = numbered(20);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(7))).await;
    let proxy = FaultProxy::start().await;
    proxy.set(Fault::DelayAction("ReceiveMessage", 0)).await;
    let a = q.args_via(
        &proxy.endpoint,
        &[
            "--concurrency",
            "10",
            "--batch-size",
            "10",
            "--timeout",
            "20s",
            "--http-url",
            &h.url,
        ],
    );
    let mut w = Worker::start(&a);
    w.wait_deleted(20, SECS(90)).await;
    // Longer than one more visibility timeout: a lapsed lease would show as a second call by now.
    tokio::time::sleep(SECS(4)).await;
    h.assert_each_handled_once(&bodies);
    h.assert_calls_all_first_deliveries(20);
    assert!(q.is_empty().await);
    let requests = |action: &str| format!("qc_worker_sqs_requests_total{{action=\"{action}\"}}");
    let single = w.metric(&requests("ChangeMessageVisibility")).await;
    assert_eq!(single, Some(0.0), "no single ChangeMessageVisibility");
    let batched = w
        .metric(&requests("ChangeMessageVisibilityBatch"))
        .await
        .unwrap();
    let beats = w.metric("qc_worker_heartbeats_total").await.unwrap();
    let beat_calls = w.metric("qc_worker_heartbeat_calls_total").await.unwrap();
    eprintln!(
        "batched heartbeats: {beats} extensions in {beat_calls} calls ({batched} ChangeMessageVisibilityBatch requests, {single:?} single)"
    );
    assert!(
        beats >= 40.0,
        "at least two heartbeats per message, saw {beats}"
    );
    assert!(batched >= beat_calls && beat_calls > 0.0);
    assert!(
        beats >= 5.0 * beat_calls,
        "at least 5 extensions per call on average: {beats} in {beat_calls} calls"
    );
    w.assert_no_lease_lost().await;
    w.stop().await;
}

/// A heartbeat batch refused as a whole with an answer that would mean "lease lost" for a single
/// entry (as emulators do for a bad entry, e.g. moto's InvalidParameterValue): which entry is at
/// fault is unknown, so each entry is sent again alone, and none of the three leases is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_batch_refused_as_a_whole_is_resent_entry_by_entry() {
    let q = TestQueue::new("hb-refused", 3, 5, false).await;
    q.send_all(&numbered(3), |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(7))).await;
    let proxy = FaultProxy::start().await;
    proxy
        .set(Fault::FailFirst(
            "ChangeMessageVisibilityBatch",
            400,
            "ReceiptHandleIsInvalid",
        ))
        .await;
    let a = q.args_via(&proxy.endpoint, &["--timeout", "20s", "--http-url", &h.url]);
    let mut w = Worker::start(&a);
    w.wait_deleted(3, SECS(60)).await;
    // Longer than one more visibility timeout: a lapsed lease would show as a second call by now.
    tokio::time::sleep(SECS(4)).await;
    h.assert_calls_all_first_deliveries(3);
    assert_eq!(
        w.log_lines("heartbeat batch refused as a whole; sending its entries one by one")
            .len(),
        1
    );
    w.assert_no_lease_lost().await;
    assert!(q.is_empty().await);
    w.stop().await;
}

/// One entry of a heartbeat batch refused by SQS (its receipt handle spoilt on the way, so the
/// server answers ReceiptHandleIsInvalid for it alone): that message's heartbeats stop, so it is
/// delivered again after its lease, while its batch-mates keep their leases. The copy comes back to
/// this worker while its first handler call still runs: it starts no second call (#40 item 3, one
/// lease per message id), its newest receipt handle is taken for the heartbeats and the delete, and
/// every message is handled once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_entry_stops_only_that_messages_heartbeats() {
    let q = TestQueue::new("hb-entry", 3, 5, false).await;
    let bodies = numbered(3);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(7))).await;
    let proxy = FaultProxy::start().await;
    proxy
        .set(Fault::SpoilFirstHandle("ChangeMessageVisibilityBatch"))
        .await;
    let a = q.args_via(&proxy.endpoint, &["--timeout", "20s", "--http-url", &h.url]);
    let mut w = Worker::start(&a);
    eventually(SECS(60), "3 messages deleted", || async {
        w.metric("qc_worker_messages_deleted_total").await >= Some(3.0) && h.finished_calls() == 3
    })
    .await;
    tokio::time::sleep(SECS(4)).await;
    let counts = h.counts_by_body();
    assert!(
        bodies.iter().all(|b| counts.get(b) == Some(&1)),
        "each handled once, the copy of the lost lease included: {counts:?}"
    );
    assert!(
        !w.log_lines("heartbeat failed; the lease is lost, the message may be delivered again")
            .is_empty()
    );
    assert!(w.metric("qc_worker_heartbeat_leases_lost_total").await >= Some(1.0));
    assert!(
        w.metric("qc_worker_duplicate_receives_total").await >= Some(1.0),
        "the copy was received and told apart"
    );
    assert!(q.is_empty().await);
    w.stop().await;
}

/// FIFO with batched heartbeats: two groups of three received in one batch, each handler longer than
/// the visibility timeout, so the later messages of each group wait behind it for two visibility
/// timeouts with background heartbeats. All heartbeats are batched, order holds within each group,
/// and nothing is delivered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_messages_waiting_behind_their_group_are_kept_alive_by_batched_heartbeats() {
    let q = TestQueue::new("fifo-hb", 3, 5, true).await;
    let bodies: Vec<String> = (0..6)
        .map(|n| format!("{}-{:02}", ["a", "b"][n % 2], n / 2))
        .collect();
    q.send_all(&bodies, |n| ["a", "b"][n % 2].to_string()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(4))).await;
    let a = q.args(&["--timeout", "20s", "--http-url", &h.url]);
    let mut w = Worker::start(&a);
    w.wait_deleted(6, SECS(90)).await;
    tokio::time::sleep(SECS(4)).await;
    for g in ["a", "b"] {
        let want: Vec<String> = (0..3).map(|i| format!("{g}-{i:02}")).collect();
        assert_eq!(successes(&h, g), want, "group {g} in order, once each");
    }
    h.assert_calls_all_first_deliveries(6);
    assert_eq!(w.sqs_requests("ChangeMessageVisibility").await, Some(0.0));
    assert!(w.metric("qc_worker_heartbeats_total").await.unwrap() >= 6.0);
    w.assert_no_lease_lost().await;
    assert!(q.is_empty().await);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_failing_until_the_lease_ends_count_a_lost_lease() {
    // Every ChangeMessageVisibility answers 500 (after the SDK's own retries): the beats are retried
    // inside the lease and then the lease ends. The failures are counted per call, the loss once.
    // The message comes back while its handler still runs: no second call (#40 item 3, one lease per
    // message id); the running call ends and deletes it with the newest receipt handle, nothing lost.
    let q = TestQueue::new("lost-lease", 2, 10, false).await;
    q.send_one("slow").await;
    let h = HttpHandler::start(|c| {
        if c.receive_count == 1 {
            Reply::ok(SECS(5))
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    let proxy = FaultProxy::start().await;
    proxy
        .set(Fault::FailAction(
            "ChangeMessageVisibility",
            500,
            "InternalFailure",
        ))
        .await;
    let a = q.args_via(&proxy.endpoint, &["--timeout", "20s", "--http-url", &h.url]);
    let mut w = Worker::start(&a);
    eventually(SECS(60), "the message handled and deleted", || async {
        h.finished_calls() >= 1 && q.is_empty().await
    })
    .await;
    // The loss is counted by the first beat after the lease's end (the handler still runs then).
    eventually(SECS(20), "the lost lease counted", || async {
        w.metric("qc_worker_heartbeat_leases_lost_total").await >= Some(1.0)
    })
    .await;
    let lost = w
        .metric("qc_worker_heartbeat_leases_lost_total")
        .await
        .unwrap();
    let failures = w
        .metric("qc_worker_heartbeat_failures_total")
        .await
        .unwrap();
    assert_eq!(lost, 1.0, "one lease lost, counted once");
    assert!(
        failures > lost,
        "failed calls retried within the lease are failures, not losses: {failures} failures, {lost} lost"
    );
    assert_eq!(
        h.calls().len(),
        1,
        "the copy received while the call ran started no second call"
    );
    assert!(
        w.metric("qc_worker_duplicate_receives_total").await >= Some(1.0),
        "the copy was received (the lease was really lost) and told apart"
    );
    assert_eq!(q.dlq_visible().await, 0);
    w.stop().await;
}

/// #31: prefetch only when it pays. Handlers of 2 s beside a loopback receive round trip of
/// milliseconds: a batch held ahead would buy nothing and spend visibility, so at concurrency 1 (and
/// the default batch of 10) the worker holds at most one message beyond its slot, from the first
/// receive on (before #31 it held its slot, a waiting batch of 10 and 5 more: 16).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_get_no_waiting_batch() {
    let q = TestQueue::new("no-prefetch", 30, 5, false).await;
    let bodies = numbered(5);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(2))).await;
    let a = q.args(&[
        "--concurrency",
        "1",
        "--timeout",
        "20s",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    let mut most = 0.0f64;
    let mut hidden = 0u64;
    let deadline = std::time::Instant::now() + SECS(60);
    while w.metric("qc_worker_messages_deleted_total").await != Some(5.0) {
        assert!(std::time::Instant::now() < deadline, "5 deleted");
        if let Some(n) = w.metric("qc_worker_in_flight").await {
            most = most.max(n);
        }
        // What the queue says is hidden: the worker's holds as SQS sees them.
        hidden = hidden.max(q.counts().await.1);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        most <= 2.0,
        "at most one message beyond the slot, saw {most} in flight"
    );
    assert!(hidden <= 2, "at most two hidden on the queue, saw {hidden}");
    h.assert_each_handled_once(&bodies);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_timeout_is_transient_and_retried() {
    let q = TestQueue::new("timeout", 5, 5, false).await;
    q.send_one("slow-then-fast").await;
    let h = HttpHandler::start(|c| {
        if c.receive_count == 1 {
            Reply::ok(SECS(30))
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    let a = q.args(&[
        "--timeout",
        "1s",
        "--retry-base",
        "0s",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    w.wait_deleted(1, SECS(60)).await;
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"timeout\"}")
            .await,
        Some(1.0)
    );
    let counts: Vec<u32> = h.calls().iter().map(|c| c.receive_count).collect();
    assert_eq!(counts, vec![1, 2]);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_sets_the_retry_delay() {
    let q = TestQueue::new("retry-after", 30, 5, false).await;
    q.send_one("busy-once").await;
    let h = HttpHandler::start(|c| {
        if c.receive_count == 1 {
            Reply {
                status: 503,
                delay: Duration::ZERO,
                retry_after: Some("1".into()),
                body: Vec::new(),
            }
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    let mut a = base_args(&q);
    // The default backoff (5s base) would also retry; Retry-After: 1 must win well before the 30s lease.
    // With the breaker (the default), 503 + Retry-After pauses the worker and the message is retried
    // in-process instead (tests/worker_breaker.rs); this is the message's own retry delay.
    a.extend(args(&[
        "--breaker",
        "false",
        "--retry-base",
        "60s",
        "--http-url",
        &h.url,
    ]));
    let mut w = Worker::start(&a);
    w.wait_deleted(1, SECS(20)).await;
    assert_eq!(h.calls().len(), 2);
    w.stop().await;
}

/// Bodies SQS accepts that a naive consumer might choke on.
fn odd_bodies() -> Vec<String> {
    vec![
        "not json {".to_string(),
        "{\"unterminated\": \"".to_string(),
        "emoji \u{1F600} and \u{FFFD} and tabs\t\r\n".to_string(),
        "\u{10FFFF}\u{E000}".to_string(),
        " ".to_string(),
        "x".repeat(1024 * 1024 - 64),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_and_large_bodies_reach_the_http_handler_byte_exact() {
    let q = TestQueue::new("odd-http", 30, 5, false).await;
    let bodies = odd_bodies();
    for b in &bodies {
        q.send_one(b).await;
    }
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let a = q.args(&[
        "--idempotency-store",
        "memory",
        "--idempotency-key",
        "jsonPointer:/id",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    w.wait_deleted(bodies.len(), SECS(60)).await;
    let mut got: Vec<Vec<u8>> = h.calls().into_iter().map(|c| c.body).collect();
    let mut want: Vec<Vec<u8>> = bodies.iter().map(|b| b.as_bytes().to_vec()).collect();
    got.sort();
    want.sort();
    assert!(got == want, "bodies differ");
    assert!(w.running());
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_handler_gets_body_on_stdin_metadata_in_env_and_exit_codes_map() {
    let q = TestQueue::new("odd-exec", 30, 2, false).await;
    let mut bodies = odd_bodies();
    bodies.push("poison".into());
    for b in &bodies {
        q.client
            .send_message()
            .queue_url(&q.url)
            .message_body(b)
            .message_attributes(
                "tenant-id",
                aws_sdk_sqs::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value("t-1")
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let handler = script(
        dir.path(),
        "handle.sh",
        &format!(
            r#"set -e
f="{out}/$QC_MESSAGE_ID"
cat > "$f.body"
echo "$QC_RECEIVE_COUNT $QC_ATTR_TENANT_ID $QC_QUEUE_URL" > "$f.env"
if [ "$(cat "$f.body")" = poison ]; then exit 65; fi
exit 0"#,
            out = out.display()
        ),
    );
    let a = q.args(&["--exec", "--", handler.to_str().unwrap()]);
    let mut w = Worker::start(&a);
    w.wait_deleted(bodies.len(), SECS(60)).await;
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"poison\"}")
            .await,
        Some(1.0)
    );
    let mut got = Vec::new();
    for entry in std::fs::read_dir(&out).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "body") {
            got.push(std::fs::read(&p).unwrap());
            let env = std::fs::read_to_string(p.with_extension("env")).unwrap();
            assert_eq!(env.trim(), format!("1 t-1 {}", q.url));
        }
    }
    let mut want: Vec<Vec<u8>> = bodies.iter().map(|b| b.as_bytes().to_vec()).collect();
    got.sort();
    want.sort();
    assert!(got == want, "bodies differ");
    assert!(q.is_empty().await);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_batch_then_restart_loses_nothing() {
    let q = TestQueue::new("kill9", 2, 10, false).await;
    let bodies = numbered(60);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(300))).await;
    let a = q.args(&["--concurrency", "10", "--http-url", &h.url]);
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let mut first = Worker::start_in(dir.clone(), &a);
    eventually(SECS(60), "15 messages handled", || async {
        h.finished_calls() >= 15
    })
    .await;
    first.kill9();
    let (_, in_flight, _) = q.counts().await;
    assert!(in_flight > 0, "the kill left messages in flight");

    let mut second = Worker::start_in(dir, &a);
    eventually(SECS(90), "queue drained after the restart", || q.is_empty()).await;
    let counts = h.counts_by_body();
    for b in &bodies {
        assert!(
            counts.get(b).is_some_and(|n| *n >= 1),
            "{b} was never handled"
        );
    }
    second.signal("INT");
    assert!(second.wait_exit(SECS(20)).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_finishes_in_flight_and_strands_nothing() {
    let q = TestQueue::new("sigterm", 10, 5, false).await;
    let bodies = numbered(100);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(1))).await;
    let a = q.args(&[
        "--concurrency",
        "10",
        "--shutdown-timeout",
        "8s",
        "--http-url",
        &h.url,
    ]);
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let mut w = Worker::start_in(dir.clone(), &a);
    eventually(SECS(60), "a second wave in flight", || async {
        h.calls().len() >= 15
    })
    .await;
    let signalled = std::time::Instant::now();
    w.signal("TERM");
    let status = w.wait_exit(SECS(30)).await;
    let took = signalled.elapsed();
    assert!(status.success(), "exit status {status:?}");
    assert!(
        took < SECS(8) + Duration::from_millis(1500),
        "exit took {took:?}, budget 8s"
    );

    // Every call that started finished and was deleted; nothing is left invisible.
    let calls = h.calls();
    assert!(
        calls.iter().all(|c| c.finished.is_some()),
        "a handler was cut off"
    );
    let summary = stopped(&w);
    assert_eq!(
        summary["deleted"].as_u64().unwrap() as usize,
        calls.len(),
        "{summary}"
    );
    let (visible, in_flight, _) = q.counts().await;
    assert_eq!(in_flight, 0, "messages stranded invisible after shutdown");
    assert_eq!(visible as usize, 100 - calls.len());

    let mut rest = Worker::start_in(dir, &a);
    eventually(SECS(90), "the rest drained", || q.is_empty()).await;
    let counts = h.counts_by_body();
    for b in &bodies {
        assert_eq!(
            counts.get(b),
            Some(&1),
            "{b} handled exactly once across both workers"
        );
    }
    rest.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_budget_abandons_a_stuck_handler_and_releases_its_message() {
    let q = TestQueue::new("stuck", 60, 5, false).await;
    q.send_one("stuck").await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(40))).await;
    let a = q.args(&[
        "--timeout",
        "50s",
        "--shutdown-timeout",
        "3s",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    eventually(SECS(30), "the handler started", || async {
        !h.calls().is_empty()
    })
    .await;
    let signalled = std::time::Instant::now();
    w.stop().await;
    assert!(
        signalled.elapsed() < SECS(5),
        "took {:?}",
        signalled.elapsed()
    );
    assert_eq!(stopped(&w)["released"], 1);
    // Released with visibility 0: visible again at once, not after the 60s lease.
    assert_eq!(q.counts().await, (1, 0, 0));
}

/// Body text of the successful calls of `group`, in the order they started.
fn successes(h: &HttpHandler, group: &str) -> Vec<String> {
    let mut calls: Vec<Call> = h
        .calls()
        .into_iter()
        .filter(|c| c.group.as_deref() == Some(group) && c.status == 200)
        .collect();
    calls.sort_by_key(|c| c.started);
    calls
        .into_iter()
        .map(|c| String::from_utf8(c.body).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_keeps_order_within_a_group_and_runs_groups_in_parallel() {
    let q = TestQueue::new("fifo-order", 10, 5, true).await;
    let groups = ["a", "b", "c", "d"];
    // Interleaved sends: a-00, b-00, c-00, d-00, a-01, ...
    let bodies: Vec<String> = (0..60)
        .map(|n| format!("{}-{:02}", groups[n % 4], n / 4))
        .collect();
    q.send_all(&bodies, |n| groups[n % 4].to_string()).await;
    // Uneven latencies, so a group running ahead would show.
    let h = HttpHandler::start(|c| {
        let jitter = c.body.iter().map(|b| u64::from(*b)).sum::<u64>() % 40;
        Reply::ok(Duration::from_millis(5 + jitter))
    })
    .await;
    let a = q.args(&["--concurrency", "10", "--http-url", &h.url]);
    let mut w = Worker::start(&a);
    w.wait_deleted(60, SECS(90)).await;
    for g in groups {
        let want: Vec<String> = (0..15).map(|i| format!("{g}-{i:02}")).collect();
        assert_eq!(successes(&h, g), want, "group {g} out of order");
    }
    assert!(h.max_active() > 1, "groups never ran in parallel");
    assert!(q.is_empty().await);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_failure_stops_the_rest_of_its_group_from_running_ahead() {
    let q = TestQueue::new("fifo-fail", 10, 5, true).await;
    let bodies: Vec<String> = (0..10).map(|i| format!("a-{i:02}")).collect();
    q.send_all(&bodies, |_| "a".to_string()).await;
    let h = HttpHandler::start(|c| {
        if c.body == b"a-03" && c.receive_count == 1 {
            Reply::status(500)
        } else {
            Reply::ok(Duration::from_millis(20))
        }
    })
    .await;
    let a = q.args(&["--retry-base", "0s", "--http-url", &h.url]);
    let mut w = Worker::start(&a);
    w.wait_deleted(10, SECS(60)).await;
    let mut calls = h.calls();
    calls.sort_by_key(|c| c.started);
    let order: Vec<String> = calls
        .iter()
        .map(|c| String::from_utf8(c.body.clone()).unwrap())
        .collect();
    let want: Vec<String> = [
        "00", "01", "02", "03", "03", "04", "05", "06", "07", "08", "09",
    ]
    .iter()
    .map(|i| format!("a-{i}"))
    .collect();
    assert_eq!(order, want, "a message ran ahead of the failed one");
    assert!(
        w.metric("qc_worker_messages_released_total").await.unwrap() >= 1.0,
        "later messages of the failed group were released"
    );
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_shutdown_releases_messages_waiting_behind_their_group() {
    let q = TestQueue::new("fifo-term", 30, 5, true).await;
    let bodies: Vec<String> = (0..10).map(|i| format!("a-{i:02}")).collect();
    q.send_all(&bodies, |_| "a".to_string()).await;
    let h = HttpHandler::start(|_| Reply::ok(SECS(2))).await;
    let a = q.args(&["--shutdown-timeout", "10s", "--http-url", &h.url]);
    let mut w = Worker::start(&a);
    eventually(SECS(30), "the first message started", || async {
        !h.calls().is_empty()
    })
    .await;
    w.stop().await;
    let summary = stopped(&w);
    assert_eq!(h.calls().len(), 1, "nothing started after the signal");
    assert_eq!(summary["deleted"], 1, "{summary}");
    assert_eq!(
        summary["received"].as_u64(),
        summary["released"].as_u64().map(|r| r + 1)
    );
    let (visible, in_flight, _) = q.counts().await;
    assert_eq!(
        (visible, in_flight),
        (9, 0),
        "waiting messages released at once"
    );
}

/// Effects per orderId: successful calls only (a call that failed had no effect).
fn effects_by_order(h: &HttpHandler) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for c in h.calls().into_iter().filter(|c| c.status == 200) {
        let v: serde_json::Value = serde_json::from_slice(&c.body).unwrap();
        *m.entry(v["orderId"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    m
}

/// Two replicas sharing a store (redis, then DynamoDB: one test run on each shared store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_store_makes_duplicates_and_visibility_lapses_take_effect_once() {
    for redis in [true, false] {
        shared_store_dedups(redis).await;
    }
}

async fn shared_store_dedups(redis: bool) {
    let q = TestQueue::new("shared-dedup", 2, 10, false).await;
    // o-1 is sent twice (a producer retry); o-2's handler outlives the 2s lease with heartbeats off,
    // so it is delivered again while the first call still runs.
    let mut bodies = vec![
        r#"{"orderId":"o-1"}"#.to_string(),
        r#"{"orderId":"o-1"}"#.to_string(),
        r#"{"orderId":"o-2","slow":true}"#.to_string(),
    ];
    bodies.extend((3..10).map(|i| format!(r#"{{"orderId":"o-{i}"}}"#)));
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|c| {
        if c.body.windows(4).any(|w| w == b"slow") {
            Reply::ok(SECS(5))
        } else {
            Reply::ok(Duration::from_millis(50))
        }
    })
    .await;
    let a = q.args(&[
        "--heartbeat",
        "false",
        "--timeout",
        "20s",
        "--http-url",
        &h.url,
    ]);
    // Two workers share the store, as replicas of one QueueConsumer do.
    let table = common::dynamodb_table(&common::dynamodb_endpoint(), "id").await;
    let store = if redis {
        redis_orders_args()
    } else {
        args(&[
            "--idempotency-store",
            "dynamodb",
            "--dynamodb-table",
            &table,
            "--idempotency-key",
            "jsonPointer:/orderId",
        ])
    };
    let mut ws = Replicas::start(&[a, store].concat());
    eventually(SECS(90), "queue drained", || q.is_empty()).await;
    let effects = effects_by_order(&h);
    for i in 1..10 {
        assert_eq!(
            effects.get(&format!("o-{i}")),
            Some(&1),
            "o-{i}: {effects:?}"
        );
    }
    let skipped = ws
        .sum("qc_worker_messages_processed_total{outcome=\"duplicate\"}")
        .await;
    let waited = ws
        .sum("qc_worker_messages_processed_total{outcome=\"in_progress_elsewhere\"}")
        .await;
    // The second o-1 is skipped as done (or first seen in progress, then done). The redelivered o-2
    // is seen in progress; its first call's delete then removes it (its receipt handle still works).
    assert!(skipped >= 1.0, "the second o-1 was skipped: {skipped}");
    assert!(
        waited >= 1.0,
        "o-2 was seen in progress while its first call ran: {waited}"
    );
    // The store holds the keys as done, under the queue's prefix. Keyed by the queue's ARN: a
    // queue of the same name in another region or account has keys of its own.
    let arn = common::queue_arn(&q.client, &q.url).await;
    let key = format!("qc:idem:{arn}:o-2");
    let v = if redis {
        let client = redis::Client::open(common::redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let v: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        v
    } else {
        let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&common::dynamodb_endpoint())).await;
        let item = aws_sdk_dynamodb::Client::new(&conf)
            .get_item()
            .table_name(&table)
            .key(
                "id",
                aws_sdk_dynamodb::types::AttributeValue::S(key.clone()),
            )
            .send()
            .await
            .unwrap()
            .item
            .unwrap_or_default();
        item.get("status").and_then(|v| v.as_s().ok()).cloned()
    };
    assert_eq!(v.as_deref(), Some("done"), "redis {redis}");
    ws.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_skips_a_business_key_seen_before() {
    let q = TestQueue::new("mem-dedup", 2, 10, false).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let a = q.args(&[
        "--idempotency-store",
        "memory",
        "--idempotency-key",
        "attribute:orderId",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    for body in ["first", "second copy"] {
        q.client
            .send_message()
            .queue_url(&q.url)
            .message_body(body)
            .message_attributes(
                "orderId",
                aws_sdk_sqs::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value("o-77")
                    .build()
                    .unwrap(),
            )
            .send()
            .await
            .unwrap();
        eventually(SECS(30), "message gone", || q.is_empty()).await;
    }
    let calls = h.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].body, b"first");
    assert_eq!(calls[0].headers["x-sqs-attribute-orderid"], "o-77");
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"duplicate\"}")
            .await,
        Some(1.0)
    );
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_errors_back_off_and_the_worker_recovers() {
    let q = TestQueue::new("outage", 5, 10, false).await;
    let bodies = numbered(80);
    q.send_all(&bodies, |_| String::new()).await;
    let proxy = FaultProxy::start().await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(100))).await;
    let a = q.args_via(
        &proxy.endpoint,
        &["--concurrency", "2", "--http-url", &h.url],
    );
    let mut w = Worker::start(&a);
    eventually(SECS(60), "some messages deleted", || async {
        w.metric("qc_worker_messages_deleted_total").await >= Some(4.0)
    })
    .await;
    let receives = "qc_worker_sqs_requests_total{action=\"ReceiveMessage\"}";
    for (fault, reason) in [
        (Fault::Fail(500, "InternalFailure"), "ServerError"),
        (Fault::Fail(400, "RequestThrottled"), "Throttled"),
        (Fault::Refuse, "EndpointUnreachable"),
    ] {
        proxy.set(fault).await;
        let before = w.metric(receives).await.unwrap();
        tokio::time::sleep(SECS(3)).await;
        let during = w.metric(receives).await.unwrap() - before;
        assert!(w.running(), "{fault:?} killed the worker");
        // Backoff with jitter: a handful of attempts in 3s, where a hot loop would make hundreds.
        assert!(during <= 12.0, "{fault:?}: {during} receives in 3s");
        assert_eq!(w.get("/healthz").await.unwrap().0, 200);
        // The first receive the fault meets may come late: slots full of prefetched messages ask
        // for none (on a loaded machine the 3 s above can pass without one).
        eventually(
            SECS(30),
            &format!("{fault:?} logged as {reason}"),
            || async {
                w.log_lines("receive failed; backing off")
                    .iter()
                    .any(|l| l["reason"] == reason)
            },
        )
        .await;
        // Back to normal: the worker resumes by itself before the next fault.
        proxy.set(Fault::Forward).await;
        let received = w.metric("qc_worker_messages_received_total").await.unwrap();
        eventually(SECS(40), "receiving again", || async {
            w.metric("qc_worker_messages_received_total").await.unwrap() > received
                || q.is_empty().await
        })
        .await;
    }
    assert!(
        w.metric("qc_worker_sqs_errors_total{action=\"ReceiveMessage\"}")
            .await
            .unwrap()
            >= 3.0
    );
    eventually(SECS(90), "queue drained after the outages", || q.is_empty()).await;
    let counts = h.counts_by_body();
    for b in &bodies {
        assert!(counts.contains_key(b), "{b} never handled");
    }
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_queue_fails_readiness_until_the_queue_exists() {
    let client = common::sqs_client().await;
    let name = common::unique_name("late");
    let url = format!("{}/123456789012/{name}", common::sqs_endpoint());
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let a = args(&[
        "--queue-url",
        &url,
        "--endpoint-url",
        &common::sqs_endpoint(),
        "--wait-time",
        "1s",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    eventually(SECS(30), "/readyz names the missing queue", || async {
        matches!(w.get("/readyz").await, Some((503, body)) if body.contains("QueueDoesNotExist"))
    })
    .await;
    assert_eq!(w.get("/healthz").await.unwrap().0, 200);
    let lines = w.log_lines("cannot read the queue; not ready");
    assert!(!lines.is_empty(), "log:\n{}", w.log_text());
    assert_eq!(lines[0]["level"], "ERROR");
    assert_eq!(lines[0]["reason"], "QueueDoesNotExist");
    assert!(lines[0]["hint"].as_str().unwrap().contains("--queue-url"));
    assert!(w.running());

    let created = client
        .create_queue()
        .queue_name(&name)
        .send()
        .await
        .unwrap();
    assert_eq!(created.queue_url.as_deref(), Some(url.as_str()));
    w.wait_ready(SECS(40)).await;
    client
        .send_message()
        .queue_url(&url)
        .message_body("late")
        .send()
        .await
        .unwrap();
    eventually(SECS(30), "the message handled", || async {
        h.calls().len() == 1
    })
    .await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_fail_readiness_with_a_clear_log_line() {
    let q = TestQueue::new("creds", 5, 5, false).await;
    let proxy = FaultProxy::start().await;
    proxy.set(Fault::Fail(403, "InvalidClientTokenId")).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let a = q.args_via(&proxy.endpoint, &["--http-url", &h.url]);
    let mut w = Worker::start(&a);
    eventually(SECS(30), "/readyz names the credentials", || async {
        matches!(w.get("/readyz").await, Some((503, body)) if body.contains("InvalidCredentials"))
    })
    .await;
    let lines = w.log_lines("cannot read the queue; not ready");
    assert_eq!(lines[0]["reason"], "InvalidCredentials", "{}", w.log_text());
    assert!(lines[0]["hint"].as_str().unwrap().contains("credentials"));
    // Credentials fixed (the proxy lets requests through again): the worker becomes ready by itself.
    proxy.set(Fault::Forward).await;
    w.wait_ready(SECS(40)).await;
    q.send_one("after the fix").await;
    eventually(SECS(30), "the message handled", || async {
        h.calls().len() == 1
    })
    .await;
    w.stop().await;
}

/// Runs `qc-worker` with `args` and `env` to completion: (exit code, stderr).
fn run_cli(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn bad_flags_exit_2_naming_the_flag_and_the_fix() {
    let q = [
        "--queue-url",
        "http://127.0.0.1:1/1/q",
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    let http = ["--http-url", "http://127.0.0.1:1/m"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            [&q[..], &http[..], &["--batch-size", "11"]].concat(),
            "--batch-size",
        ),
        (
            [&q[..], &http[..], &["--wait-time", "30s"]].concat(),
            "at most 20s",
        ),
        (
            [&q[..], &http[..], &["--timeout", "soon"]].concat(),
            "--timeout",
        ),
        (
            [&q[..], &http[..], &["--on-poison", "maybe"]].concat(),
            "use dead-letter, leave or delete",
        ),
        (
            [&q[..], &http[..], &["--idempotency-key", "orderId"]].concat(),
            "jsonPointer:",
        ),
        (
            [&q[..], &http[..], &["--idempotency-store", "redis"]].concat(),
            "--redis-url",
        ),
        (
            [&q[..], &http[..], &["--heartbeat", "maybe"]].concat(),
            "--heartbeat",
        ),
        (q.to_vec(), "no handler"),
        ([&q[..], &["--exec"]].concat(), "after `--`"),
        (
            [&q[..], &http[..], &["--exec", "--", "sh"]].concat(),
            "--exec",
        ),
        (
            [&q[..], &["--exec", "--", "/nonexistent/handler"]].concat(),
            "not found",
        ),
        (http.to_vec(), "--queue-url"),
    ];
    for (args, needle) in cases {
        let (code, stderr) = run_cli(&args, &[]);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn flags_come_from_the_environment_too() {
    // QC_BATCH_SIZE is read (and refused), proving the env mapping; flags override env.
    let env = [
        ("QC_QUEUE_URL", "http://127.0.0.1:1/1/q"),
        ("QC_HTTP_URL", "http://127.0.0.1:1/m"),
        ("QC_METRICS_ADDR", "127.0.0.1:0"),
        ("QC_BATCH_SIZE", "12"),
    ];
    let (code, stderr) = run_cli(&[], &env);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--batch-size"), "{stderr}");
    let (code, stderr) = run_cli(&["--wait-time", "21s", "--batch-size", "5"], &env);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--wait-time"), "{stderr}");
}

#[test]
fn copy_self_to_installs_a_runnable_copy() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("qc-worker");
    let (code, stderr) = run_cli(&["--copy-self-to", target.to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let mode = std::fs::metadata(&target).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    // With this system's CA roots beside it.
    let bundle = std::fs::read_to_string(dir.path().join("ca-certificates.crt")).unwrap();
    assert!(
        bundle.starts_with("-----BEGIN CERTIFICATE-----\n"),
        "{bundle}"
    );
    let out = std::process::Command::new(&target)
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("qc-worker"));
    let (code, stderr) = run_cli(&["--copy-self-to", "/nonexistent/dir/qc-worker"], &[]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("cannot write the CA bundle /nonexistent/dir/ca-certificates.crt"),
        "{stderr}"
    );
}

/// The image holds one binary under two names (docs/image.md): `qc-operator` started as `qc-worker`
/// (a symlink, as in the image) is the worker, and its install step writes a copy that is the worker too
/// under the name the exec layout gives it. Under its own name it stays the controller.
#[test]
fn the_operator_binary_started_as_qc_worker_is_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let operator = std::path::Path::new(env!("CARGO_BIN_EXE_qc-operator"));
    let link = dir.path().join("qc-worker");
    std::os::unix::fs::symlink(operator, &link).unwrap();
    let run = |exe: &std::path::Path, args: &[&str]| {
        let out = std::process::Command::new(exe).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let version = format!("qc-worker {}", env!("CARGO_PKG_VERSION"));
    let (code, out, err) = run(&link, &["--version"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), version);
    // A worker's bad flag is refused by the worker's parser, naming it.
    let flags = [
        "--queue-url",
        "http://127.0.0.1:1/1/q",
        "--http-url",
        "http://127.0.0.1:1/m",
        "--metrics-addr",
        "127.0.0.1:0",
        "--batch-size",
        "12",
    ];
    let (code, _, err) = run(&link, &flags);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--batch-size"), "{err}");
    let (code, out, err) = run(operator, &["--version"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        format!("qc-operator {}", env!("CARGO_PKG_VERSION"))
    );
    // The install step copies the file the link points to, not the link.
    let installed = dir.path().join("bin").join("qc-worker");
    std::fs::create_dir(dir.path().join("bin")).unwrap();
    let (code, _, err) = run(&link, &["--copy-self-to", installed.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    let meta = std::fs::symlink_metadata(&installed).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.len(), std::fs::metadata(operator).unwrap().len());
    let (code, out, err) = run(&installed, &["--version"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_over_tls_dedups_and_an_untrusted_certificate_keeps_the_worker_unready() {
    let redis = TlsRedis::start();
    let q = TestQueue::new("redis-tls", 10, 10, false).await;
    let bodies: Vec<String> = ["o-1", "o-1", "o-2"]
        .iter()
        .map(|o| format!(r#"{{"orderId":"{o}"}}"#))
        .collect();
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(20))).await;
    let a = q.args(&[
        "--idempotency-store",
        "redis",
        "--redis-url",
        &redis.url(),
        "--idempotency-key",
        "jsonPointer:/orderId",
        "--http-url",
        &h.url,
    ]);

    // Without the test CA among its roots the worker cannot finish the handshake: not ready, says
    // why, receives nothing, and still stops cleanly.
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let other = redis.certs.other_ca_file.to_string_lossy().to_string();
    let mut untrusted = Worker::start_with_env(dir, &a, &[("SSL_CERT_FILE", &other)]);
    q.send_all(&bodies, |_| String::new()).await;
    untrusted
        .wait_error_logged(
            SECS(40),
            "idempotency store unreachable; not ready",
            &["rediss://localhost", "invalid peer certificate"],
        )
        .await;
    let (status, _) = untrusted.get("/readyz").await.unwrap();
    assert_ne!(status, 200, "not ready without redis");
    assert_eq!(q.counts().await.0, 3, "nothing received while not ready");
    assert_eq!(h.calls().len(), 0);
    untrusted.stop().await;

    // Trusting the CA (SSL_CERT_FILE, as in the image), the store works over TLS.
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let ca = redis.certs.ca_file.to_string_lossy().to_string();
    let mut w = Worker::start_with_env(dir, &a, &[("SSL_CERT_FILE", &ca)]);
    eventually(SECS(60), "queue drained", || q.is_empty()).await;
    let effects = effects_by_order(&h);
    assert_eq!(effects.get("o-1"), Some(&1), "{effects:?}");
    assert_eq!(effects.get("o-2"), Some(&1), "{effects:?}");
    let arn = common::queue_arn(&q.client, &q.url).await;
    assert_eq!(redis.cli(&["GET", &format!("qc:idem:{arn}:o-1")]), "done");
    w.stop().await;
}

/// SQS over https: the worker's own client (rustls, roots from SSL_CERT_FILE as in the image) against
/// a moto serving a test CA's certificate. Without that CA among its roots the worker is not ready,
/// says why and receives nothing; with it, every message is handled once and deleted.
#[tokio::test]
async fn sqs_over_https_trusts_the_given_roots_and_refuses_an_unknown_issuer() {
    let moto = TlsMoto::start();
    let q = TestQueue::on(moto.client().await, "https", 10, 10, false).await;
    let bodies = numbered(30);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(5))).await;
    let a = q.args_via(&moto.endpoint, &["--http-url", &h.url]);

    let dir = Arc::new(tempfile::tempdir().unwrap());
    let other = moto.certs.other_ca_file.to_string_lossy().to_string();
    let mut untrusted = Worker::start_with_env(dir, &a, &[("SSL_CERT_FILE", &other)]);
    untrusted
        .wait_error_logged(
            SECS(40),
            "cannot read the queue; retrying",
            &["https://localhost", "invalid peer certificate"],
        )
        .await;
    let (status, _) = untrusted.get("/readyz").await.unwrap();
    assert_ne!(
        status, 200,
        "not ready while the endpoint's certificate is not trusted"
    );
    assert_eq!(h.calls().len(), 0);
    untrusted.stop().await;
    assert_eq!(q.counts().await.0, 30, "nothing received");

    let dir = Arc::new(tempfile::tempdir().unwrap());
    let ca = moto.certs.ca_file.to_string_lossy().to_string();
    let mut w = Worker::start_with_env(dir, &a, &[("SSL_CERT_FILE", &ca)]);
    eventually(SECS(60), "queue drained over https", || q.is_empty()).await;
    let counts = h.counts_by_body();
    assert_eq!(counts.len(), bodies.len(), "every message handled");
    assert!(counts.values().all(|&n| n == 1), "each once: {counts:?}");
    let deletes = w
        .metric("qc_worker_sqs_requests_total{action=\"DeleteMessageBatch\"}")
        .await
        .unwrap_or(0.0);
    assert!(
        deletes >= 3.0,
        "deletes went out in batches over TLS: {deletes}"
    );
    w.stop().await;
}

/// The exec layout's worker in a user image without CA roots (#30's finding, docs/image.md): the install
/// step (`--copy-self-to`, in the operator image) writes that image's roots beside the copy, and a copy
/// that finds no system roots trusts them, for SQS over https and for rediss:// alike. A system that has
/// roots keeps them: the bundle never overrides a user image's own (a corporate CA's) roots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_worker_without_system_roots_trusts_the_roots_copied_beside_it() {
    use std::os::unix::fs::PermissionsExt;
    let moto = TlsMoto::start();
    let redis = TlsRedis::start();
    let q = TestQueue::on(moto.client().await, "roots", 10, 10, false).await;
    let bodies: Vec<String> = (0..20)
        .map(|i| format!(r#"{{"orderId":"o-{i}"}}"#))
        .collect();
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(5))).await;
    let a = q.args_via(
        &moto.endpoint,
        &[
            "--idempotency-store",
            "redis",
            "--redis-url",
            &redis.url(),
            "--idempotency-key",
            "jsonPointer:/orderId",
            "--http-url",
            &h.url,
        ],
    );

    // The "operator image": its roots are the two test CAs (SSL_CERT_FILE), which it copies.
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let operator_roots = dir.path().join("operator-roots.pem");
    let test_cas = [
        std::fs::read(&moto.certs.ca_file).unwrap(),
        std::fs::read(&redis.certs.ca_file).unwrap(),
    ]
    .concat();
    std::fs::write(&operator_roots, &test_cas).unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let copy = bin.join("qc-worker");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .args(["--copy-self-to", copy.to_str().unwrap()])
        .env("SSL_CERT_FILE", &operator_roots)
        .env_remove("SSL_CERT_DIR")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let bundle = bin.join("ca-certificates.crt");
    let mode = std::fs::metadata(&bundle).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
    // The certificates of a PEM text, sorted (the loader sorts them).
    let certs = |text: &[u8]| {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let mut all: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(text)
            .map(|c| c.unwrap().to_vec())
            .collect();
        all.sort();
        all
    };
    let copied = certs(&std::fs::read(&bundle).unwrap());
    assert_eq!(copied.len(), 2);
    assert!(
        copied == certs(&test_cas),
        "the bundle holds exactly the operator image's roots (the two test CAs)"
    );
    // A user image with no CA roots: no SSL_CERT_FILE, and the only place to look (SSL_CERT_DIR,
    // replacing the standard paths) is empty.
    let no_roots = dir.path().join("no-roots");
    std::fs::create_dir(&no_roots).unwrap();
    let no_roots = no_roots.to_str().unwrap();
    q.send_all(&bodies, |_| String::new()).await;

    // A user image whose own roots do not hold the test CAs: they are kept, not overridden by the
    // bundle, so the endpoint is refused.
    let other = moto.certs.other_ca_file.to_str().unwrap();
    let copy_str = copy.to_str().unwrap();
    let mut own_roots =
        Worker::start_program(dir.clone(), &[copy_str], &a, &[("SSL_CERT_FILE", other)]);
    own_roots
        .wait_error_logged(
            SECS(40),
            "cannot read the queue; retrying",
            &["https://localhost", "invalid peer certificate"],
        )
        .await;
    own_roots.stop().await;

    // No system roots and no bundle (the binary where it was built): nothing is trusted, and the
    // worker says so at start.
    let env_unset = [
        "env",
        "-u",
        "SSL_CERT_FILE",
        env!("CARGO_BIN_EXE_qc-worker"),
    ];
    let mut nothing =
        Worker::start_program(dir.clone(), &env_unset, &a, &[("SSL_CERT_DIR", no_roots)]);
    nothing
        .wait_error_logged(
            SECS(40),
            "cannot read the queue; retrying",
            &["https://localhost", "invalid peer certificate"],
        )
        .await;
    assert_eq!(nothing.log_lines("no CA roots: none on this system (SSL_CERT_FILE, SSL_CERT_DIR, the standard bundle) and no ca-certificates.crt beside qc-worker; every https or rediss:// certificate will be refused. Install CA certificates in the image or set SSL_CERT_FILE").len(), 1, "{}", nothing.log_text());
    nothing.stop().await;
    assert_eq!(h.calls().len(), 0);
    assert_eq!(q.counts().await.0, bodies.len() as u64, "nothing received");

    // No system roots, the bundle beside the copy: SQS over https and rediss:// both trust it.
    let env_unset = ["env", "-u", "SSL_CERT_FILE", copy_str];
    let mut w = Worker::start_program(dir.clone(), &env_unset, &a, &[("SSL_CERT_DIR", no_roots)]);
    eventually(SECS(60), "queue drained with the copied roots", || {
        q.is_empty()
    })
    .await;
    let lines = w.log_lines(
        "no CA roots on this system; TLS (SQS over https, rediss://) trusts the bundle beside qc-worker",
    );
    assert_eq!(lines.len(), 1, "{}", w.log_text());
    assert_eq!(lines[0]["certificates"], 2);
    let effects = effects_by_order(&h);
    assert_eq!(effects.len(), bodies.len(), "{effects:?}");
    assert!(effects.values().all(|&n| n == 1), "each once: {effects:?}");
    let arn = common::queue_arn(&q.client, &q.url).await;
    assert_eq!(redis.cli(&["GET", &format!("qc:idem:{arn}:o-0")]), "done");
    w.stop().await;
}

/// The proxy variables every proxy-aware tool reads, pointing at `proxy` (both spellings, so an
/// ambient lower-case variable cannot win), with no bypass.
fn proxy_env(var: &'static str, proxy: &str) -> Vec<(&'static str, String)> {
    let lower: &'static str = if var == "HTTP_PROXY" {
        "http_proxy"
    } else {
        "https_proxy"
    };
    vec![
        (var, proxy.to_string()),
        (lower, proxy.to_string()),
        ("NO_PROXY", "example.invalid".to_string()),
        ("no_proxy", "example.invalid".to_string()),
    ]
}

/// An egress proxy from the environment (HTTP_PROXY, plain HTTP to moto): every SQS call goes
/// through it (the proxy counts as many requests per action as the worker sent), the queue drains
/// with each message handled once, and the handler call on loopback does not use the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_calls_go_through_the_http_proxy_from_the_environment() {
    let q = TestQueue::new("proxied", 10, 10, false).await;
    let bodies = numbered(40);
    q.send_all(&bodies, |_| String::new()).await;
    let proxy = EgressProxy::start().await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(5))).await;
    let a = args(&[
        "--queue-url",
        &q.url,
        "--endpoint-url",
        &common::sqs_endpoint(),
        "--wait-time",
        "1s",
        "--http-url",
        &h.url,
    ]);
    let env = proxy_env("HTTP_PROXY", &proxy.url);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut w = Worker::start_with_env(Arc::new(tempfile::tempdir().unwrap()), &a, &env);
    eventually(SECS(60), "queue drained through the proxy", || q.is_empty()).await;
    let counts = h.counts_by_body();
    assert_eq!(counts.len(), bodies.len(), "every message handled");
    assert!(counts.values().all(|&n| n == 1), "each once: {counts:?}");

    // Read the worker's counts first: the proxy has then seen at least as many.
    let mut sent = Vec::new();
    for action in ["GetQueueAttributes", "ReceiveMessage", "DeleteMessageBatch"] {
        let n = w
            .metric(&format!(
                "qc_worker_sqs_requests_total{{action=\"{action}\"}}"
            ))
            .await
            .unwrap();
        sent.push((action, n as usize));
    }
    let moto = common::sqs_endpoint();
    let moto_authority = moto.trim_start_matches("http://").trim_end_matches('/');
    for (action, n) in sent {
        let through = proxy.forwarded(&format!("AmazonSQS.{action}"));
        assert!(n >= 1, "{action}: the worker counted no request");
        assert!(
            through >= n,
            "{action}: {through} through the proxy, {n} sent"
        );
    }
    let seen = proxy.seen();
    assert!(
        seen.iter().all(
            |p| matches!(p, Proxied::Forwarded { authority, .. } if authority == moto_authority)
        ),
        "only SQS calls to moto went through the proxy (not the handler's): {seen:?}"
    );
    w.stop().await;
}

/// HTTPS_PROXY with an https endpoint: the SQS calls are tunnelled with CONNECT, TLS to moto inside
/// the tunnel (its test CA trusted via SSL_CERT_FILE), and the queue drains, each message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_sqs_is_tunnelled_through_the_https_proxy_from_the_environment() {
    let moto = TlsMoto::start();
    let q = TestQueue::on(moto.client().await, "https-proxied", 10, 10, false).await;
    let bodies = numbered(20);
    q.send_all(&bodies, |_| String::new()).await;
    let proxy = EgressProxy::start().await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(5))).await;
    let a = q.args_via(&moto.endpoint, &["--http-url", &h.url]);
    let ca = moto.certs.ca_file.to_string_lossy().to_string();
    let mut env = proxy_env("HTTPS_PROXY", &proxy.url);
    env.push(("SSL_CERT_FILE", ca));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut w = Worker::start_with_env(Arc::new(tempfile::tempdir().unwrap()), &a, &env);
    eventually(SECS(60), "queue drained through the tunnel", || {
        q.is_empty()
    })
    .await;
    let counts = h.counts_by_body();
    assert_eq!(counts.len(), bodies.len(), "every message handled");
    assert!(counts.values().all(|&n| n == 1), "each once: {counts:?}");
    let endpoint_authority = moto.endpoint.trim_start_matches("https://").to_string();
    let seen = proxy.seen();
    assert!(!seen.is_empty(), "nothing went through the proxy");
    assert!(
        seen.iter().all(|p| *p
            == Proxied::Tunnel {
                authority: endpoint_authority.clone()
            }),
        "only CONNECT tunnels to moto: {seen:?}"
    );
    w.stop().await;
}

/// A batch waiting locally for a slot outlives its first lease (VisibilityTimeout 2s, one slot,
/// 1.5s per message, so the last of a batch of 5 waits 6s): heartbeats keep the waiting leases,
/// so nothing is delivered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_waiting_for_a_slot_is_kept_alive_and_handled_once() {
    let q = TestQueue::new("waiting", 2, 5, false).await;
    let bodies = numbered(6);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(1500))).await;
    let a = q.args(&[
        "--concurrency",
        "1",
        "--batch-size",
        "5",
        "--timeout",
        "10s",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    w.wait_deleted(6, SECS(60)).await;
    // Longer than one more visibility timeout: a lapsed lease would show as a second call by now.
    tokio::time::sleep(SECS(3)).await;
    h.assert_calls_all_first_deliveries(6);
    assert!(q.is_empty().await);
    // One receive of 5 while the first message runs: the rest waited, so they were heartbeated.
    assert!(w.metric("qc_worker_heartbeats_total").await.unwrap() >= 4.0);
    w.stop().await;
}

/// SIGTERM while a batch waits for the only slot: the running messages finish and are deleted, the
/// waiting ones are released at once (visible again although the queue's VisibilityTimeout is 60s).
/// The first call is instant, so prefetch pays (#31) and a batch of 10 is received for the one slot;
/// the second takes 2 s, and the signal comes while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_messages_waiting_for_a_slot() {
    let q = TestQueue::new("waiting-term", 60, 5, false).await;
    q.send_all(&numbered(12), |_| String::new()).await;
    let h = HttpHandler::start(first_call_instant_then(SECS(2))).await;
    let a = q.args(&[
        "--concurrency",
        "1",
        "--batch-size",
        "10",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    eventually(SECS(30), "the second message in the handler", || async {
        h.calls().len() == 2
    })
    .await;
    let received = w.metric("qc_worker_messages_received_total").await.unwrap();
    assert!(received >= 3.0, "a batch was received: {received}");
    w.stop().await;
    let s = stopped(&w);
    assert_eq!(s["deleted"], 2, "{s}");
    assert_eq!(s["released"].as_u64(), Some(received as u64 - 2), "{s}");
    let (visible, not_visible, _) = q.counts().await;
    assert_eq!(
        (visible, not_visible),
        (10, 0),
        "released, not left to the 60s lease"
    );
    assert_eq!(h.calls().len(), 2);
}

/// A handler whose first call answers at once and every later first delivery after `slow` (a
/// redelivery at once): the first call's time makes prefetch pay, so what the later ones find
/// waiting is a batch held ahead.
fn first_call_instant_then(slow: Duration) -> impl Fn(&Call) -> Reply + Send + Sync + 'static {
    let calls = std::sync::atomic::AtomicUsize::new(0);
    move |c| {
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n == 0 || c.receive_count > 1 {
            Reply::ok(Duration::ZERO)
        } else {
            Reply::ok(slow)
        }
    }
}

/// While a batch waits locally every slot is busy, so a busy queue is received in whole batches:
/// one slot, batches of 5, 21 messages of 80 ms. The first receive asks for the one slot (nothing is
/// held ahead before a handler time and a round trip are measured, #31); every later one is answered
/// with 5, never a receive of 1 into the slot a message just freed. The next batch is asked for while
/// one message of the waiting batch still waits (a slot frees per 80 ms, a receive takes less, also
/// with other tests loading moto): more than concurrency + batchSize held at times (before: the
/// receive went out only when the last waiting message started, and slots freeing meanwhile idled
/// for its round trip), never more than concurrency + batchSize + early_receive_max; each handled
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_queue_is_received_in_whole_batches_while_a_batch_waits() {
    let q = TestQueue::new("whole-batches", 60, 5, false).await;
    let bodies = numbered(21);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(80))).await;
    let a = q.args(&[
        "--concurrency",
        "1",
        "--batch-size",
        "5",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    let most = w
        .most_held_until_deleted(21.0, Duration::from_millis(20), SECS(60))
        .await;
    let bound = 1 + 5 + qc::worker::early_receive_max(5, 1);
    assert!(
        most <= f64::from(bound),
        "at most concurrency + batchSize + early_receive_max = {bound} held, saw {most}"
    );
    assert!(
        most >= 7.0,
        "the next batch was received while a message still waited (held at most {most}); log:\n{}",
        w.log_text()
    );
    let bucket = |le: &'static str| {
        let w = &w;
        async move {
            w.metric(&format!("qc_worker_receive_messages_bucket{{le=\"{le}\"}}"))
                .await
                .unwrap()
        }
    };
    let (empty, up_to_4, up_to_5) = (bucket("0").await, bucket("4").await, bucket("5").await);
    assert_eq!(
        up_to_4 - empty,
        1.0,
        "no partial receive while the queue was busy but the first, for the one slot; log:\n{}",
        w.log_text()
    );
    assert_eq!(up_to_5 - up_to_4, 4.0, "four receives of 5");
    h.assert_each_handled_once(&bodies);
    assert!(q.is_empty().await);
    w.stop().await;
}

/// #31 items 1-2: with many slots, what is held ahead grows to cover a receive round trip. C = 30,
/// batches of 10, 500 ms handlers, every ReceiveMessage 300 ms late (a proxy): the slots take some
/// 20 messages during one round trip, so the next batches are asked for while up to
/// `early_receive_max(10, 30)` = 20 still wait or are on their way, and more receives run at once
/// than the slots hold batches (3, the most before, when receives in flight were capped by the
/// slots alone); never more than C + max(15, C) = 60 held, which is what validation counts; each
/// message handled once (the proxy sends the receives to moto one at a time: moto may hand a
/// message to two receives it serves at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_slots_hold_ahead_what_a_slow_round_trip_needs_and_no_more() {
    let q = TestQueue::new("ahead-many", 60, 5, false).await;
    let bodies = numbered(300);
    q.send_all(&bodies, |_| String::new()).await;
    let proxy = FaultProxy::start().await;
    proxy.set(Fault::DelayAction("ReceiveMessage", 300)).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(500))).await;
    let a = q.args_via(
        &proxy.endpoint,
        &["--concurrency", "30", "--http-url", &h.url],
    );
    let mut w = Worker::start(&a);
    let most = w
        .most_held_until_deleted(300.0, Duration::from_millis(10), SECS(120))
        .await;
    let bound = 30 + qc::worker::prefetch(10, 30, true, false);
    assert_eq!(bound, 60);
    assert!(
        most <= f64::from(bound),
        "at most concurrency + max(15, concurrency) = {bound} held, saw {most}"
    );
    let receives = most_delayed_at_once();
    assert!(
        receives > 3,
        "more receives in flight at once than the slots hold batches (3) while a round trip takes most of a handler call: saw {receives}; log:\n{}",
        w.log_text()
    );
    h.assert_each_handled_once(&bodies);
    assert!(q.is_empty().await);
    w.stop().await;
}

const XRAY: &str = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
const XRAY_AS_W3C: &str = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01";
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// Sends one message with an optional `AWSTraceHeader` system attribute and string attributes;
/// returns its SQS message id.
async fn send_traced(
    q: &TestQueue,
    body: &str,
    xray: Option<&str>,
    attrs: &[(&str, &str)],
) -> String {
    use aws_sdk_sqs::types::{
        MessageAttributeValue, MessageSystemAttributeNameForSends, MessageSystemAttributeValue,
    };
    let mut req = q.client.send_message().queue_url(&q.url).message_body(body);
    if let Some(x) = xray {
        req = req.message_system_attributes(
            MessageSystemAttributeNameForSends::AwsTraceHeader,
            MessageSystemAttributeValue::builder()
                .data_type("String")
                .string_value(x)
                .build()
                .unwrap(),
        );
    }
    for (k, v) in attrs {
        req = req.message_attributes(
            *k,
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(*v)
                .build()
                .unwrap(),
        );
    }
    req.send().await.unwrap().message_id.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_reaches_the_http_handler_from_xray_or_a_traceparent_attribute() {
    let q = TestQueue::new("trace-http", 30, 5, false).await;
    let xray_id = send_traced(&q, "xray", Some(XRAY), &[]).await;
    let both_id = send_traced(&q, "both", Some(XRAY), &[("traceparent", TRACEPARENT)]).await;
    let bad_id = send_traced(
        &q,
        "bad",
        Some("Root=1-nothex;Parent=zz"),
        &[("traceparent", "00-zz-1-01")],
    )
    .await;
    let none_id = send_traced(&q, "none", None, &[]).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let a = q.args(&["--http-url", &h.url]);
    let mut w = Worker::start(&a);
    eventually(SECS(30), "all handled and deleted", || q.is_empty()).await;
    let calls: HashMap<String, Call> = h.calls().into_iter().map(|c| (c.id.clone(), c)).collect();
    assert_eq!(calls.len(), 4, "{calls:?}");
    let hdr = |id: &str, name: &str| calls[id].headers.get(name).cloned();
    assert_eq!(hdr(&xray_id, "traceparent").as_deref(), Some(XRAY_AS_W3C));
    assert_eq!(hdr(&xray_id, "x-amzn-trace-id").as_deref(), Some(XRAY));
    assert_eq!(hdr(&both_id, "traceparent").as_deref(), Some(TRACEPARENT));
    assert_eq!(hdr(&both_id, "x-amzn-trace-id").as_deref(), Some(XRAY));
    assert_eq!(
        hdr(&bad_id, "traceparent"),
        None,
        "malformed headers are dropped"
    );
    assert_eq!(
        calls[&bad_id].body, b"bad",
        "a malformed header is never fatal"
    );
    assert_eq!(hdr(&none_id, "traceparent"), None);
    assert_eq!(hdr(&none_id, "x-amzn-trace-id"), None);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_reaches_the_exec_handler_environment() {
    let q = TestQueue::new("trace-exec", 30, 5, false).await;
    let xray_id = send_traced(&q, "xray", Some(XRAY), &[]).await;
    let none_id = send_traced(&q, "none", None, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let handler = script(
        dir.path(),
        "handle.sh",
        &format!(
            r#"echo "tp=${{TRACEPARENT:-}} xray=${{_X_AMZN_TRACE_ID:-}}" > "{out}/$QC_MESSAGE_ID""#,
            out = out.display()
        ),
    );
    let a = q.args(&["--exec", "--", handler.to_str().unwrap()]);
    let mut w = Worker::start(&a);
    eventually(SECS(30), "all handled and deleted", || q.is_empty()).await;
    let env = |id: &str| std::fs::read_to_string(out.join(id)).unwrap();
    assert_eq!(
        env(&xray_id).trim(),
        format!("tp={XRAY_AS_W3C} xray={XRAY}")
    );
    assert_eq!(env(&none_id).trim(), "tp= xray=");
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_headers_are_percent_encoded_ce_id_is_the_message_id_and_collisions_are_named()
{
    let q = TestQueue::new("ce-binary", 30, 5, false).await;
    let attrs = [
        ("Note", "say \"hi\" 100% é\t"),
        ("Tenant", "first"),
        ("tenant", "second"),
    ];
    let id = send_traced(&q, "{}", None, &attrs).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let a = q.args(&["--http-url", &h.url]);
    let mut w = Worker::start(&a);
    eventually(SECS(30), "handled and deleted", || q.is_empty()).await;
    let calls = h.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let hdr = &calls[0].headers;
    assert_eq!(hdr["ce-id"], id, "ce-id is the SQS message id");
    assert_eq!(
        hdr["x-sqs-attribute-note"],
        "say%20%22hi%22%20100%25%20%C3%A9%09"
    );
    assert_eq!(hdr["x-sqs-attribute-tenant"], "first");
    assert_eq!(hdr["x-qc-omitted-attributes"], "tenant");
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_attributes_reach_the_exec_handler_in_base64() {
    use aws_sdk_sqs::primitives::Blob;
    use aws_sdk_sqs::types::MessageAttributeValue;
    let q = TestQueue::new("exec-binary", 30, 5, false).await;
    let id = q
        .client
        .send_message()
        .queue_url(&q.url)
        .message_body("b")
        .message_attributes(
            "blob-1",
            MessageAttributeValue::builder()
                .data_type("Binary")
                .binary_value(Blob::new(vec![0u8, 1, 2, 0xff, b'\n']))
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap()
        .message_id
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let handler = script(
        dir.path(),
        "handle.sh",
        &format!(
            r#"echo "${{QC_ATTR_BLOB_1:-unset}}" > "{out}/$QC_MESSAGE_ID""#,
            out = out.display()
        ),
    );
    let a = q.args(&["--exec", "--", handler.to_str().unwrap()]);
    let mut w = Worker::start(&a);
    eventually(SECS(30), "handled and deleted", || q.is_empty()).await;
    let got = std::fs::read_to_string(out.join(&id)).unwrap();
    assert_eq!(got.trim(), "AAEC/wo=");
    w.stop().await;
}

// Growing heartbeat extensions (docs/worker.md): each extension doubles (VT, 2 VT, 4 VT, ...) up to the
// handler timeout (at most 15 min). What a long lease must never change: the outcome's visibility,
// the release of unstarted messages at shutdown, and redelivery after a crash (bounded).

/// A transient failure and a handler timeout, each after the lease has grown to several visibility
/// timeouts: the outcome's retry delay (0 s here) replaces the long lease at once, so the message is
/// handled again right away instead of when the grown lease would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_or_timeout_after_a_grown_lease_comes_back_at_its_retry_delay() {
    // VT 2 s, timeout 9 s: extensions of 2, 4, 8 and 9 s at about 0.7, 1.3, 2.7 and 5.3 s, so at
    // 8.5-9 s the lease runs to about 14-17 s from the receive.
    let q = TestQueue::new("grown-outcome", 2, 10, false).await;
    q.send_all(&["fail".to_string(), "hang".to_string()], |_| String::new())
        .await;
    let h = HttpHandler::start(|c| match (c.receive_count, c.body.as_slice()) {
        (1, b"fail") => Reply {
            status: 503,
            delay: Duration::from_millis(8500),
            retry_after: None,
            body: Vec::new(),
        },
        (1, _) => Reply::ok(SECS(30)),
        _ => Reply::ok(Duration::ZERO),
    })
    .await;
    let a = q.args(&[
        "--timeout",
        "9s",
        "--retry-base",
        "0s",
        "--http-url",
        &h.url,
    ]);
    let mut w = Worker::start(&a);
    w.wait_deleted(2, SECS(60)).await;
    assert!(
        w.metric("qc_worker_heartbeats_total").await >= Some(6.0),
        "the leases grew over several extensions"
    );
    let calls = h.calls();
    for body in ["fail", "hang"] {
        let of: Vec<&Call> = calls.iter().filter(|c| c.body == body.as_bytes()).collect();
        assert_eq!(of.len(), 2, "{body}: {calls:?}");
        let again = of[1].started - of[0].started;
        // The grown lease would hold it until about 14-17 s after the first call; the retry
        // delay of 0 s brings it back with the next receive.
        assert!(
            again < SECS(13),
            "{body}: handled again {again:?} after the first call, not at the retry delay"
        );
    }
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"timeout\"}")
            .await,
        Some(1.0)
    );
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"transient\"}")
            .await,
        Some(1.0)
    );
    w.stop().await;
}

/// SIGTERM while a message received ahead waits for the only slot, its lease grown by background
/// heartbeats to several visibility timeouts: it is released at once (visibility 0), the running
/// one finishes, and a new worker handles the released one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_a_waiting_message_whose_lease_grew() {
    let q = TestQueue::new("grown-release", 2, 10, false).await;
    let bodies = numbered(3);
    q.send_all(&bodies, |_| String::new()).await;
    // The first call is instant, so prefetch pays (#31) and one message is received ahead.
    let h = HttpHandler::start(first_call_instant_then(SECS(9))).await;
    let a = q.args(&[
        "--concurrency",
        "1",
        "--batch-size",
        "1",
        "--timeout",
        "30s",
        "--shutdown-timeout",
        "20s",
        "--http-url",
        &h.url,
    ]);
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let mut w = Worker::start_in(dir.clone(), &a);
    eventually(
        SECS(30),
        "one handled, one running, one waiting",
        || async { h.calls().len() == 2 && w.metric("qc_worker_in_flight").await == Some(2.0) },
    )
    .await;
    // The waiting message's background beats (0.7, 1.3, 2.7, 5.3 s) have grown its lease past 20 s.
    eventually(
        SECS(30),
        "the waiting lease extended four times",
        || async { w.metric("qc_worker_heartbeats_total").await >= Some(7.0) },
    )
    .await;
    w.signal("TERM");
    eventually(SECS(5), "the waiting message visible again", || async {
        q.counts().await.0 == 1
    })
    .await;
    assert!(w.wait_exit(SECS(30)).await.success());
    assert_eq!(h.calls().len(), 2, "the waiting message never started");
    assert!(
        h.calls().iter().all(|c| c.finished.is_some()),
        "the running one finished"
    );
    let (visible, in_flight, _) = q.counts().await;
    assert_eq!((visible, in_flight), (1, 0), "one released, one deleted");
    let mut rest = Worker::start_in(dir, &a);
    eventually(SECS(30), "the released message handled", || q.is_empty()).await;
    h.assert_each_handled_once(&bodies);
    rest.stop().await;
}

/// kill -9 during a long handler whose lease has grown: the message is not lost. It comes back when
/// the current lease ends (later than a VT after the kill: the lease grew), within the documented
/// bound max(VT, VT/interval × the time since its receive), and a second worker handles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_long_handler_returns_its_message_within_the_grown_lease() {
    // VT 3 s, interval auto (1 s): extensions of 3, 6, 12, 24 s at about 1, 2, 4, 8 s.
    let q = TestQueue::new("grown-kill9", 3, 10, false).await;
    q.send_one("long").await;
    let h = HttpHandler::start(|c| {
        if c.receive_count == 1 {
            Reply::ok(SECS(120))
        } else {
            Reply::ok(Duration::ZERO)
        }
    })
    .await;
    let a = q.args(&["--timeout", "60s", "--http-url", &h.url]);
    let mut first = Worker::start(&a);
    eventually(SECS(30), "the handler called", || async {
        !h.calls().is_empty()
    })
    .await;
    let started = h.calls()[0].started;
    eventually(SECS(30), "three extensions made", || async {
        first.metric("qc_worker_heartbeats_total").await >= Some(3.0)
    })
    .await;
    // Past the third extension (12 s at about 4 s): the lease runs to about 16 s or later.
    tokio::time::sleep(
        (started + Duration::from_secs(6)).saturating_duration_since(std::time::Instant::now()),
    )
    .await;
    let held = started.elapsed();
    first.kill9();
    let killed = std::time::Instant::now();
    let mut second = Worker::start(&a);
    eventually(SECS(60), "handled again and deleted", || q.is_empty()).await;
    let calls = h.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[1].receive_count, 2);
    let back = calls[1].started - killed;
    eprintln!("held {held:?} before kill -9; handled again {back:?} after it");
    assert!(
        back > SECS(6),
        "hidden past the kill by the grown lease (more than 2 VT), back after {back:?}"
    );
    // max(VT, 3 × time held), plus a receive's poll and moto's latency.
    let bound = SECS(3).max(held * 3) + SECS(5);
    assert!(back < bound, "back after {back:?}, bound {bound:?}");
    second.stop().await;
}

/// #29 item 6: an exec handler's processes get the container's environment without the worker's
/// secrets (QC_REDIS_URL) and without static AWS keys, unless --exec-pass-aws-credentials asks for
/// them; the rest (PATH, the user's own variables, a pod identity's pointers) reaches them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_children_get_no_worker_secrets_and_aws_keys_only_when_asked() {
    for pass in [false, true] {
        let q = TestQueue::new("exec-env", 30, 3, false).await;
        q.send_one("one").await;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("env");
        let handler = script(
            dir.path(),
            "handle.sh",
            &format!("cat >/dev/null; env > {}", out.display()),
        );
        let mut args = q.args(&[]);
        if pass {
            args.push("--exec-pass-aws-credentials".into());
        }
        args.extend(["--exec".into(), "--".into(), handler.display().to_string()]);
        let mut w = Worker::start_with_env(
            Arc::new(tempfile::tempdir().unwrap()),
            &args,
            &[
                ("QC_REDIS_URL", "redis://:hunter2@redis:6379/0"),
                ("AWS_SESSION_TOKEN", "session-secret"),
                ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/handler"),
                ("APP_SETTING", "kept"),
            ],
        );
        w.wait_deleted(1, SECS(30)).await;
        let env = std::fs::read_to_string(&out).unwrap();
        let has = |name: &str| env.lines().any(|l| l.starts_with(&format!("{name}=")));
        assert!(
            !env.contains("hunter2"),
            "the Redis URL reached the handler"
        );
        for kept in [
            "PATH",
            "APP_SETTING",
            "AWS_ROLE_ARN",
            "QC_MESSAGE_ID",
            "QC_QUEUE_URL",
        ] {
            assert!(has(kept), "{kept} missing (pass {pass}): {env}");
        }
        // The test's worker has static keys (AWS_ACCESS_KEY_ID=testing) for moto.
        for key in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
        ] {
            assert_eq!(has(key), pass, "{key} with pass {pass}");
        }
        w.stop().await;
    }
}

/// #41 item 4: a worker does not keep its dead-letter queue for its lifetime. The redrive policy
/// pointed at a new DLQ and the old one deleted: the next poison message reaches the new DLQ, sent by
/// the worker (it carries `qc-poison-reason`, which SQS's own redrive would not add), within a few
/// receives rather than after maxReceiveCount (10) of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_queue_replaced_in_the_redrive_policy_is_found_again() {
    let q = TestQueue::new("dlq-moved", 2, 10, false).await;
    let h = HttpHandler::start(|_| Reply::status(422)).await;
    let mut w = Worker::start(&q.args(&["--http-url", &h.url]));
    q.send_one("first").await;
    eventually(Duration::from_secs(20), "first in the old DLQ", || async {
        q.dlq_visible().await == 1
    })
    .await;
    let new_dlq = common::create_queue(&q.client, &common::unique_name("dlq-new"), &[]).await;
    let arn = common::queue_arn(&q.client, &new_dlq).await;
    q.client
        .set_queue_attributes()
        .queue_url(&q.url)
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::RedrivePolicy,
            serde_json::json!({"deadLetterTargetArn": arn, "maxReceiveCount": 10}).to_string(),
        )
        .send()
        .await
        .unwrap();
    q.client
        .delete_queue()
        .queue_url(&q.dlq_url)
        .send()
        .await
        .unwrap();
    q.send_one("second").await;
    let moved = TestQueue {
        client: q.client.clone(),
        url: q.url.clone(),
        dlq_url: new_dlq.clone(),
        fifo: false,
    };
    eventually(Duration::from_secs(15), "second in the new DLQ", || async {
        moved.dlq_visible().await == 1
    })
    .await;
    let got = drain_dlq(&moved).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "second");
    assert!(
        got[0].1.contains_key("qc-poison-reason"),
        "sent by the worker, not moved by SQS: {:?}",
        got[0].1
    );
    w.stop().await;
}
