//! The product on the real node (issue 43 item 4), run by `scripts/bench-node`: the operator in cluster
//! from its image, worker pods of the test handler's image, moto on the node's address.
//!
//! 1. **From zero.** A QueueConsumer idle at zero replicas gets one message; measured: the time to the
//!    first worker pod existing, to its Ready, and to the handler starting on the message (the handler's
//!    own clock, the same machine's). Several rounds; beside it what KEDA's SQS scaler at its defaults
//!    would take (its polling interval of 30 s, then the same start-up), computed, not run.
//! 2. **A ramp.** A traffic trace (up, plateau, down, idle) of 2 s messages sent as it says; measured every
//!    half second: the worker pods that exist (starting, ready or draining), and from the handler's notes
//!    each message's wait (sent → handling began). The simulator (src/scaling/sim) runs the same messages
//!    with the same spec and the start-up measured in part 1; the table shows both and their ratio (the
//!    simulator's error).
//!
//! Prints tables; asserts nothing about times.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::cluster::{self, eventually};
use common::node::{node, queues, ready, seen_dir, send, timed_notes};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use qc::api::QueueConsumer;
use qc::scaling::sim::{self, Policy, SimConfig};

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// All worker pods of `orders` in `ns`, the deleting ones too.
async fn all_pods(api: &Api<Pod>) -> Vec<Pod> {
    api.list(&ListParams::default().labels("app.kubernetes.io/instance=orders"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo test --all-targets` runs benches without --bench: this one is minutes long and not a test.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let Some(node) = node("bench node").await else {
        eprintln!("no node: run scripts/bench-node");
        std::process::exit(1);
    };
    let rounds = env_u64("QC_BENCH_ROUNDS", 5);
    let peak = u32::try_from(env_u64("QC_BENCH_PEAK", 15)).unwrap_or(15);
    let (op_ns, ns) = (cluster::unique("bench-op"), cluster::unique("bench-node"));
    node.namespace(&ns, false).await;
    let _op = node.operator(&op_ns, &ns).await;
    let sqs = node.sqs().await;
    let (url, _dlq) = queues(&sqs, "bench-node").await;
    let seen_at = seen_dir();
    let mut doc = node.consumer(&ns, "orders", &url, seen_at.path(), 6);
    // What the handler is: 2 s a message (the ramp's bodies all say "slow").
    doc["spec"]["processing"]["p99"] = "2100ms".into();
    doc["spec"]["processing"]["mean"] = "2s".into();
    doc["spec"]["scaling"]["scaleDownStabilization"] = "auto".into();
    node.apply(&ns, &doc).await;
    let pods: Api<Pod> = Api::namespaced(node.cluster.admin.clone(), &ns);

    // 1. From zero.
    let mut to_pod = Vec::new();
    let mut to_ready = Vec::new();
    let mut to_handled = Vec::new();
    for round in 0..rounds {
        eventually(300, "back at zero, no pod", String::new, || async {
            (node.workers(&ns, "orders").await? == (0, 0) && all_pods(&pods).await.is_empty())
                .then_some(())
        })
        .await;
        let sent_ms = unix_ms();
        let t0 = Instant::now();
        let ids = send(&sqs, &url, &[format!("message {round}")]).await;
        let id = ids.into_iter().next().expect("an id");
        // The worker receives before its pod reports Ready (the readiness probe's period): polled until both.
        let (mut pod_at, mut ready_at, mut handled_ms) = (None, None, None);
        while ready_at.is_none() || handled_ms.is_none() {
            let list = all_pods(&pods).await;
            if pod_at.is_none() && !list.is_empty() {
                pod_at = Some(t0.elapsed().as_secs_f64());
            }
            if ready_at.is_none() && list.iter().any(ready) {
                ready_at = Some(t0.elapsed().as_secs_f64());
            }
            if handled_ms.is_none() {
                handled_ms = timed_notes(seen_at.path(), "started")
                    .into_iter()
                    .find(|n| n.0 == id)
                    .map(|n| n.3);
            }
            assert!(
                t0.elapsed() < Duration::from_mins(2),
                "round {round}: not handled and Ready in 120 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let handled_ms = handled_ms.unwrap_or(sent_ms);
        to_pod.push(pod_at.unwrap_or(f64::NAN));
        to_ready.push(ready_at.unwrap_or(f64::NAN));
        to_handled.push(handled_ms.saturating_sub(sent_ms) as f64 / 1000.0);
    }
    let startup = median(&mut to_ready.clone()) - median(&mut to_pod.clone());
    println!("\n## From zero to the first message handled ({rounds} rounds, pollInterval 1s)\n");
    println!("| measured | median | min | max |");
    println!("|---|---|---|---|");
    for (name, v) in [
        ("message sent → worker pod exists", &to_pod),
        ("message sent → worker pod Ready", &to_ready),
        ("message sent → handler starts on it", &to_handled),
    ] {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        println!(
            "| {name} | {:.1} s | {min:.1} s | {max:.1} s |",
            median(&mut v.clone())
        );
    }
    let handled = median(&mut to_handled.clone());
    println!(
        "| pod start-up (exists → Ready, medians) | {startup:.1} s | | |\n\
         | KEDA at its defaults, computed: pollingInterval 30 s + start-up | mean {:.1} s | {:.1} s | {:.1} s |",
        15.0 + startup,
        startup,
        30.0 + startup
    );
    println!(
        "\nGoal (issue 43): ≤ a pod's start-up + 3 s = {:.1} s; measured median {handled:.1} s.",
        startup + 3.0
    );

    // 2. The ramp.
    eventually(300, "back at zero before the ramp", String::new, || async {
        (node.workers(&ns, "orders").await? == (0, 0) && all_pods(&pods).await.is_empty())
            .then_some(())
    })
    .await;
    let up = 60u32;
    let mut per_second: Vec<u32> = Vec::new();
    per_second.extend((0..up).map(|s| (peak * s).div_ceil(up)));
    per_second.extend(std::iter::repeat_n(peak, 60));
    per_second.extend((0..up).map(|s| peak - (peak * s) / up));
    per_second.extend(std::iter::repeat_n(0, 120));
    let horizon = per_second.len();
    let start_ms = unix_ms();
    let t0 = Instant::now();
    let mut sent_at: BTreeMap<String, u64> = BTreeMap::new();
    let mut replica_half_seconds = 0u64;
    let mut most = 0usize;
    let mut next_sample = Duration::ZERO;
    for (second, &n) in per_second.iter().enumerate() {
        let due = Duration::from_secs(second as u64);
        let bodies: Vec<String> = (0..n).map(|i| format!("slow {second}.{i}")).collect();
        if !bodies.is_empty() {
            let at = unix_ms();
            for id in send(&sqs, &url, &bodies).await {
                sent_at.insert(id, at);
            }
        }
        while next_sample < due + Duration::from_secs(1) {
            while t0.elapsed() < next_sample {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let n = all_pods(&pods).await.len();
            most = most.max(n);
            replica_half_seconds += n as u64;
            next_sample += Duration::from_millis(500);
        }
    }
    let real_replica_seconds = replica_half_seconds as f64 / 2.0;
    eventually(300, "every ramp message handled", String::new, || async {
        let started = timed_notes(seen_at.path(), "started");
        let begun: std::collections::BTreeSet<&String> = started.iter().map(|n| &n.0).collect();
        sent_at.keys().all(|id| begun.contains(id)).then_some(())
    })
    .await;
    let started = timed_notes(seen_at.path(), "started");
    let mut first_start: BTreeMap<&String, u64> = BTreeMap::new();
    for n in &started {
        first_start.entry(&n.0).or_insert(n.3);
    }
    let mut waits: Vec<f64> = sent_at
        .iter()
        .map(|(id, at)| first_start[id].saturating_sub(*at) as f64 / 1000.0)
        .collect();
    let real_p99 = percentile(&mut waits, 0.99);
    let real_max = waits.iter().copied().fold(0.0, f64::max);

    // The simulator on the same messages (their send offsets, 2 s each), the same spec, the measured start-up.
    let qc: QueueConsumer = serde_json::from_value(doc.clone()).expect("the QueueConsumer");
    let cfg = SimConfig::from_spec(
        &qc.spec,
        qc::api::Duration::from_millis(u64::try_from((startup * 1000.0) as i64).unwrap_or(3000)),
        1,
    );
    let mut msgs: Vec<sim::trace::Msg> = sent_at
        .values()
        .map(|at| sim::trace::Msg {
            at: at.saturating_sub(start_ms),
            service: 2000,
        })
        .collect();
    msgs.sort_by_key(|m| m.at);
    let ours = sim::run_messages(&cfg, horizon as u64, &msgs, Policy::Ours);
    let keda = sim::run_messages(&cfg, horizon as u64, &msgs, Policy::Keda);
    println!(
        "\n## A ramp on the real node beside the simulator ({} messages of 2 s: 0 → {peak}/s over 60 s, 60 s at \
         {peak}/s, down over 60 s, 120 s idle; concurrency 10, pollInterval 1s, maxReplicas 6)\n",
        msgs.len()
    );
    println!("| | replica-seconds ({horizon} s) | p99 wait | max wait | most pods |");
    println!("|---|---|---|---|---|");
    println!(
        "| real node | {real_replica_seconds:.0} | {real_p99:.1} s | {real_max:.1} s | {most} |"
    );
    println!(
        "| simulator (ours) | {:.0} | {:.1} s | {:.1} s | |",
        ours.replica_seconds, ours.p99_wait_seconds, ours.max_wait_seconds
    );
    println!(
        "| real ÷ simulator | {:.2} | {:.2} | {:.2} | |",
        real_replica_seconds / ours.replica_seconds,
        real_p99 / ours.p99_wait_seconds,
        real_max / ours.max_wait_seconds
    );
    println!(
        "| simulator (KEDA at its defaults) | {:.0} | {:.1} s | {:.1} s | |",
        keda.replica_seconds, keda.p99_wait_seconds, keda.max_wait_seconds
    );
}
