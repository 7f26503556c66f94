//! Two namespaces on the controller's shared SQS budget (#29): `busy` with 1,000 QueueConsumers at a
//! 1 s poll interval (1,000 GetQueueAttributes a second asked of a 300 a second budget) and `quiet`
//! with one at 1 s. Each consumer polls on its own 1 s slot, as `spread::next_poll` spreads them: its
//! reconcile takes one of the controller's reconcile slots (`controller::slots`, 64), then makes its
//! call through the real `aws::limit::Limiter` with the controller's default SQS limit; a call costs
//! nothing, so the table shows the queueing alone. The lag is from a poll's slot to its call leaving
//! the gate. `fair`: each consumer queued as its own namespace's (the controller); `one queue`: every
//! reconcile and call in one queue (first come, first served, as before). `cargo bench --bench fairness`
//! (knobs: QC_BENCH_BUSY consumers, 1000; QC_BENCH_SECONDS, 20); under `cargo test`, a short smoke pass.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use qc::aws::limit::{Limiter, in_namespace};
use qc::controller::run::DEFAULT_RECONCILE_CONCURRENCY;
use qc::controller::slots::Slots;
use tokio::time::Instant;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Lags in milliseconds of `namespace`'s polls, as (p50, p99, max, polls).
fn summary(mut lags: Vec<f64>) -> (f64, f64, f64, usize) {
    lags.sort_by(f64::total_cmp);
    let at = |q: f64| lags[((lags.len() as f64 - 1.0) * q).round() as usize];
    if lags.is_empty() {
        return (0.0, 0.0, 0.0, 0);
    }
    (at(0.5), at(0.99), at(1.0), lags.len())
}

/// Runs the two namespaces for `seconds`; (busy lags, quiet lags) in ms.
async fn run(busy: usize, seconds: u64, fair: bool) -> (Vec<f64>, Vec<f64>) {
    let limiter = Arc::new(Limiter::new("sqs", qc::aws::sqs::DEFAULT_LIMIT));
    let slots = Slots::new(usize::from(DEFAULT_RECONCILE_CONCURRENCY));
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let lags: Arc<Mutex<(Vec<f64>, Vec<f64>)>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..=busy {
        let quiet = i == busy;
        let ns = if quiet && fair { "quiet" } else { "busy" };
        let (limiter, slots, lags) = (limiter.clone(), slots.clone(), lags.clone());
        // Slots spread over the interval, the quiet one's in the middle.
        let offset = Duration::from_millis(if quiet { 500 } else { (i * 1000 / busy) as u64 });
        tasks.push(tokio::spawn(in_namespace(ns.to_string(), async move {
            let mut due = start + offset;
            while due < end {
                tokio::time::sleep_until(due).await;
                let _slot = slots.acquire(ns).await;
                let _: Result<(), ()> = limiter
                    .run("GetQueueAttributes", |()| false, || async { Ok(()) })
                    .await;
                let lag = Instant::now().duration_since(due).as_secs_f64() * 1000.0;
                let mut l = lags.lock().unwrap();
                if quiet { &mut l.1 } else { &mut l.0 }.push(lag);
                drop(l);
                // The next poll is due an interval after this one's slot, or at once when late.
                due = (due + Duration::from_secs(1)).max(Instant::now());
            }
        })));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let l = lags.lock().unwrap();
    (l.0.clone(), l.1.clone())
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (busy, seconds) = if full {
        (
            env("QC_BENCH_BUSY", 1000) as usize,
            env("QC_BENCH_SECONDS", 20),
        )
    } else {
        (50, 2)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "SQS budget {}/s; busy: {busy} consumers at 1s, quiet: 1 at 1s; {seconds}s",
        qc::aws::sqs::DEFAULT_LIMIT.rate
    );
    println!("| queueing | namespace | polls | lag p50 (ms) | lag p99 (ms) | lag max (ms) |");
    println!("|---|---|---|---|---|---|");
    for fair in [true, false] {
        let (b, q) = rt.block_on(run(busy, seconds, fair));
        for (name, lags) in [("busy", b), ("quiet", q)] {
            let (p50, p99, max, n) = summary(lags);
            println!(
                "| {} | {name} | {n} | {p50:.0} | {p99:.0} | {max:.0} |",
                if fair {
                    "fair (per namespace)"
                } else {
                    "one queue"
                }
            );
        }
    }
}
