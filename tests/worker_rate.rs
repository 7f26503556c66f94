//! `processing.maxRate` (#31 item 3, docs/worker.md "The rate share") against moto, with real
//! `qc-worker` processes and a loopback HTTP handler that records when each call starts: the
//! aggregate rate stays under 110 % of maxRate (and above 75 % on a busy machine) across a scale from 1 to 3 workers whose share files are
//! rewritten as the kubelet does, and pacing never loses or double-handles a message on SIGTERM.

#![allow(clippy::float_cmp)]

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// Calls that started in [from, from + len).
fn started_in(h: &HttpHandler, from: Instant, len: Duration) -> usize {
    h.calls()
        .iter()
        .filter(|c| c.started >= from && c.started < from + len)
        .count()
}

/// Calls per second from `from` for `secs` seconds, for the log.
fn per_second(h: &HttpHandler, from: Instant, secs: u64) -> Vec<usize> {
    (0..secs)
        .map(|i| started_in(h, from + SECS(i), SECS(1)))
        .collect()
}

fn write_share(path: &Path, share: &str) {
    // As the kubelet does: a new file moved into place, never a half-written one.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, share).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The test: maxRate 20/s. One worker with the share 20, then three with 20/3 each (the
/// first one's file rewritten, the two new ones started with it): the handled rate stays within
/// 10 % of 20/s over each measured window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rate_holds_within_ten_percent_across_a_scale_from_one_to_three() {
    const MAX_RATE: f64 = 20.0;
    const PHASE1: u64 = 10;
    const PHASE2: u64 = 15;
    // The backlog is kept near this many messages (see the producer below).
    const BACKLOG: usize = 150;
    let q = TestQueue::new("rate", 30, 5, false).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(5))).await;
    // A backlog to the end, kept near BACKLOG messages: moto's ReceiveMessage slows with the queue's
    // length (about 1 s at 1000 messages on a busy machine, 0.1 s at 100), and a receive slower than
    // the rate's pace would measure moto instead of the bucket.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let (client, url, h, stop) = (q.client.clone(), q.url.clone(), h.clone(), stop.clone());
        tokio::spawn(async move {
            let mut sent = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if sent.saturating_sub(h.calls().len()) >= BACKLOG {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                let mut req = client.send_message_batch().queue_url(&url);
                for i in 0..10 {
                    req = req.entries(
                        aws_sdk_sqs::types::SendMessageBatchRequestEntry::builder()
                            .id(i.to_string())
                            .message_body(format!("{{\"n\":{}}}", sent + i))
                            .build()
                            .unwrap(),
                    );
                }
                req.send().await.unwrap();
                sent += 10;
            }
        })
    };
    eventually(SECS(60), "the backlog sent", || async {
        q.counts().await.0 >= BACKLOG as u64
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..3)
        .map(|i| dir.path().join(format!("share-{i}")))
        .collect();
    let start = |i: usize, initial: &str| {
        // Concurrency 40: up to four receives at once, so an unpaced worker outruns 20/s even
        // when moto answers a receive in half a second (one at a time would not).
        Worker::start(&q.args(&[
            "--concurrency",
            "40",
            "--http-url",
            &h.url,
            "--max-rate",
            initial,
            "--max-rate-file",
            files[i].to_str().unwrap(),
        ]))
    };

    // Phase 1: one replica, the whole rate.
    write_share(&files[0], "20");
    let mut w0 = start(0, "6.666");
    eventually(SECS(30), "the first call", || async {
        !h.calls().is_empty()
    })
    .await;
    tokio::time::sleep(SECS(3)).await;
    let p1 = Instant::now();
    tokio::time::sleep(SECS(PHASE1)).await;
    let phase1 = started_in(&h, p1, SECS(PHASE1)) as f64 / PHASE1 as f64;

    // Scale to three: the controller writes maxRate / 3 on the running pod (the kubelet rewrites its
    // file), and the new pods start with the file already annotated (their flag is maxRate /
    // maxReplicas, here 3).
    let share = qc::scaling::rate::share_text(qc::scaling::rate::share(20, 3));
    write_share(&files[0], &share);
    write_share(&files[1], &share);
    write_share(&files[2], &share);
    let transition = Instant::now();
    let mut w1 = start(1, &share);
    let mut w2 = start(2, &share);
    w1.wait_ready(SECS(30)).await;
    w2.wait_ready(SECS(30)).await;
    // The old worker reads its file within 2 s; the new ones have started their buckets.
    tokio::time::sleep(SECS(4)).await;
    let p2 = Instant::now();
    tokio::time::sleep(SECS(PHASE2)).await;
    let phase2 = started_in(&h, p2, SECS(PHASE2)) as f64 / PHASE2 as f64;
    let transition_rate =
        started_in(&h, transition, p2 - transition) as f64 / (p2 - transition).as_secs_f64();

    println!(
        "maxRate {MAX_RATE}/s: 1 worker {phase1:.2}/s over {PHASE1} s {:?}; transition {transition_rate:.2}/s over {:.1} s; 3 workers {phase2:.2}/s over {PHASE2} s {:?}",
        per_second(&h, p1, PHASE1),
        (p2 - transition).as_secs_f64(),
        per_second(&h, p2, PHASE2),
    );
    for (w, name) in [(&w0, "w0"), (&w1, "w1"), (&w2, "w2")] {
        let share = w.metric("qc_worker_rate_share").await;
        let throttled = w.metric("qc_worker_rate_throttled_seconds_total").await;
        println!("{name}: share {share:?}, throttled {throttled:?} s");
        assert_eq!(share, Some(6.666), "{name} paces to its new share");
        assert!(throttled.unwrap_or(0.0) > 1.0, "{name} was throttled");
    }
    for w in [&w0, &w1, &w2] {
        w.assert_no_lease_lost().await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    producer.await.unwrap();
    w0.stop().await;
    w1.stop().await;
    w2.stop().await;
    // maxRate is a ceiling: never more than 10 % over it. Below it the floor is 75 %: a limiter that
    // divides a share twice (10/s for one worker, 6.7/s for three) or never hands it back is under it.
    // CI runs once saw 12/s here, moto answering a receive in 1-2.5 s: its retention check scanned the
    // whole queue three times per message handed out (scripts/moto-atomic-receive.py now reads the one
    // attribute); with that fixed, four busy processes beside this test measured 19.0-20.5/s.
    for (rate, what) in [(phase1, "one worker"), (phase2, "three workers")] {
        assert!(
            (MAX_RATE * 0.75..=MAX_RATE * 1.1).contains(&rate),
            "{what}: {rate:.2}/s is not between 75 % and 110 % of {MAX_RATE}/s"
        );
    }
    // While the shares change hands, no more than the limiter's own bound: the new workers start with
    // empty buckets, the old one paces to the whole rate until it next reads its file (every
    // SHARE_POLL, a second late on a busy machine), plus its bucket's burst and one receive already
    // on its way when the files were rewritten. (A CI run saw 24.2/s over 4.8 s here, the old worker
    // still at 20/s for its first 2 s: within this bound, over a flat 110 %.) New workers that came up
    // at the whole rate, or an old one that never read its file, exceed it.
    let window = (p2 - transition).as_secs_f64();
    let share_f: f64 = share.parse().unwrap();
    let stale = qc::worker::rate::SHARE_POLL.as_secs_f64() + 1.0;
    let bound = MAX_RATE * window
        + (MAX_RATE - share_f) * stale
        + qc::worker::rate::burst(MAX_RATE, 10)
        + 10.0;
    let in_transition = started_in(&h, transition, p2 - transition) as f64;
    assert!(
        in_transition <= bound,
        "transition: {in_transition} calls in {window:.1} s ({transition_rate:.2}/s), over the bound {bound:.0}"
    );
}

/// Pacing happens before a receive, so no message waits for a token: SIGTERM finds nothing held
/// for the rate, the worker exits at once, and with a second worker draining the rest every
/// message is handled exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_paced_loses_and_repeats_nothing() {
    let q = TestQueue::new("rate-term", 30, 5, false).await;
    let bodies = numbered(100);
    q.send_all(&bodies, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(5))).await;
    let mut w = Worker::start(&q.args(&["--http-url", &h.url, "--max-rate", "5"]));
    eventually(SECS(30), "paced calls", || async { h.calls().len() >= 10 }).await;
    let before = Instant::now();
    w.stop_within(SECS(10)).await;
    let took = before.elapsed();
    let handled = h.calls().len();
    assert!(
        handled < 50,
        "paced at 5/s, yet {handled} calls before SIGTERM"
    );
    // Nothing is held waiting for tokens: nothing to release but what a receive already on its way
    // at the signal brings back (a loaded moto answers in a second: it is released at once, unhandled),
    // nothing left invisible.
    let log = w.log_text();
    let stopped = w.log_lines("stopped");
    let receiving = w
        .log_lines("shutting down: no new receives, finishing in-flight messages")
        .first()
        .and_then(|l| l["receiving"].as_u64())
        .expect("the shutdown line names the receives on their way");
    let released = stopped.first().and_then(|l| l["released"].as_u64());
    assert!(
        released.is_some_and(|r| r <= receiving * 10),
        "released {released:?} on SIGTERM with {receiving} receives on their way; log:\n{log}"
    );
    assert!(took < SECS(5), "drain took {took:?}; log:\n{log}");
    let (_, invisible, _) = q.counts().await;
    assert_eq!(invisible, 0, "messages left in flight after the drain");

    // The receives reach moto one at a time through the proxy (as in tests/worker.rs): moto can
    // hand a message to two concurrent receives.
    let proxy = FaultProxy::start().await;
    proxy.set(Fault::DelayAction("ReceiveMessage", 0)).await;
    let mut rest = Worker::start(&q.args_via(
        &proxy.endpoint,
        &["--concurrency", "10", "--http-url", &h.url],
    ));
    rest.wait_deleted(100 - handled, SECS(60)).await;
    eventually(SECS(30), "the queue empty", || async { q.is_empty().await }).await;
    rest.stop().await;
    let counts: HashMap<String, usize> = h.counts_by_body();
    for b in &bodies {
        assert_eq!(counts.get(b), Some(&1), "{b} handled once: {counts:?}");
    }
}

/// Batch mode: the rate counts messages, not handler calls (the downstream sees messages). At
/// maxRate 5/s with calls of up to 10 items, the messages handled stay within 10 % of 5/s over
/// 20 s; a rate of calls would let 50 through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_mode_counts_messages_not_calls() {
    const RATE: f64 = 5.0;
    const WINDOW: u64 = 20;
    let q = TestQueue::new("rate-batch", 30, 5, false).await;
    q.send_all(&numbered(150), |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::answer(Duration::from_millis(5), "")).await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--batch-max-items",
        "10",
        "--batch-max-wait",
        "300ms",
        "--max-rate",
        "5",
    ]));
    eventually(SECS(30), "the first call", || async {
        !h.calls().is_empty()
    })
    .await;
    tokio::time::sleep(SECS(2)).await;
    let from = Instant::now();
    tokio::time::sleep(SECS(WINDOW)).await;
    let calls: Vec<_> = h
        .calls()
        .into_iter()
        .filter(|c| c.started >= from && c.started < from + SECS(WINDOW))
        .collect();
    let messages: usize = calls
        .iter()
        .map(|c| {
            serde_json::from_slice::<serde_json::Value>(&c.body)
                .expect("a JSON array of events")
                .as_array()
                .map_or(0, Vec::len)
        })
        .sum();
    let empty = w.metric("qc_worker_empty_receives_total").await;
    let shape: Vec<(u128, usize)> = calls
        .iter()
        .map(|c| {
            (
                (c.started - from).as_millis(),
                serde_json::from_slice::<serde_json::Value>(&c.body)
                    .ok()
                    .and_then(|v| v.as_array().map(Vec::len))
                    .unwrap_or(0),
            )
        })
        .collect();
    println!("empty receives {empty:?}; calls (ms, items) {shape:?}");
    w.stop().await;
    let rate = messages as f64 / WINDOW as f64;
    println!(
        "batch mode at maxRate {RATE}/s: {rate:.2} messages/s in {} calls over {WINDOW} s",
        calls.len()
    );
    // At most 10 % over the rate, at least 75 % of it (as above; four busy processes beside it measured
    // 4.75-5.0/s): a limiter counting calls rather than messages (a call per token would be 25/s) is
    // over the ceiling, and one counting each message twice (2.5/s) is under the floor.
    assert!(
        (RATE * 0.75..=RATE * 1.1).contains(&rate),
        "{rate:.2} messages/s is not between 75 % and 110 % of {RATE}/s"
    );
    assert!(messages > calls.len(), "calls of several messages each");
}
