//! #29 item 1: the controller's memory while 1,000 QueueConsumers' workers answer their scrapes with
//! 64 MiB bodies. The controller reads a worker's /metrics only up to 1 MiB, and its reconciles run
//! 64 at a time (`DEFAULT_RECONCILE_CONCURRENCY`), each scraping its pods 16 at a time; this drives
//! `workers::scrape` exactly so, against a loopback server answering every scrape with a hostile
//! body (each consumer with 16 worker pods, all scraped at once by its reconcile), and prints the
//! process's peak RSS (VmHWM) growth beside the chart's controller memory limit
//! (256Mi). Rows: a body announced as 64 MiB (Content-Length), a 64 MiB chunked body (read until the
//! cap), and a normal worker's answer for comparison. Run with `cargo bench --bench scrape_memory`;
//! `cargo test --all-targets` runs it once quickly (100 consumers).

use std::sync::Arc;
use std::time::Instant;

use qc::controller::workers::{Target, scrape};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the server answers every scrape with.
#[derive(Clone, Copy, Debug)]
enum Body {
    /// `content-length: 64 MiB`, then the bytes.
    Announced,
    /// 64 MiB in 64 KiB chunks.
    Chunked,
    /// A worker's usual answer: a few KiB of metrics.
    Normal,
}

const HOSTILE: usize = 64 * 1024 * 1024;
/// Worker pods of each consumer: `SCRAPE_CONCURRENCY`, all scraped at once by its reconcile.
const PODS: usize = qc::controller::workers::SCRAPE_CONCURRENCY;

async fn serve(body: Body) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let chunk = Arc::new(vec![b'#'; 64 * 1024]);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let chunk = chunk.clone();
            tokio::spawn(async move {
                let mut req = [0u8; 1024];
                let _ = s.read(&mut req).await;
                let _ = match body {
                    Body::Announced => {
                        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {HOSTILE}\r\n\r\n");
                        if s.write_all(head.as_bytes()).await.is_ok() {
                            for _ in 0..HOSTILE / chunk.len() {
                                if s.write_all(&chunk).await.is_err() {
                                    break;
                                }
                            }
                        }
                        Ok(())
                    }
                    Body::Chunked => {
                        let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                        if s.write_all(head.as_bytes()).await.is_ok() {
                            for _ in 0..HOSTILE / chunk.len() {
                                let size = format!("{:x}\r\n", chunk.len());
                                if s.write_all(size.as_bytes()).await.is_err()
                                    || s.write_all(&chunk).await.is_err()
                                    || s.write_all(b"\r\n").await.is_err()
                                {
                                    break;
                                }
                            }
                        }
                        Ok(())
                    }
                    Body::Normal => {
                        let text = "# TYPE qc_worker_handler_duration_seconds histogram\n\
                                    qc_worker_handler_duration_seconds_bucket{le=\"+Inf\"} 10\n\
                                    qc_worker_handler_duration_seconds_sum 1\n\
                                    qc_worker_handler_duration_seconds_count 10\n"
                            .repeat(40);
                        let head =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", text.len());
                        s.write_all(format!("{head}{text}").as_bytes()).await
                    }
                };
            });
        }
    });
    port
}

/// Peak resident memory of this process so far, in KiB (VmHWM).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let consumers: usize = if quick { 100 } else { 1000 };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "| worker answer | consumers × pods | reconciles at once | unreadable pods | peak RSS growth | time |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for body in [Body::Normal, Body::Announced, Body::Chunked] {
        let (unreadable, growth, took) = runtime.block_on(async move {
            let port = serve(body).await;
            let before = peak_rss_kib();
            let started = Instant::now();
            let slots = Arc::new(tokio::sync::Semaphore::new(usize::from(
                qc::controller::run::DEFAULT_RECONCILE_CONCURRENCY,
            )));
            let mut tasks = tokio::task::JoinSet::new();
            for c in 0..consumers {
                let slots = slots.clone();
                tasks.spawn(async move {
                    let _slot = slots.acquire_owned().await.unwrap();
                    // PODS worker pods a consumer: what one reconcile scrapes at once.
                    let targets: Vec<Target> = (0..PODS)
                        .map(|i| Target {
                            pod: format!("qc-{c}-{i}"),
                            ip: "127.0.0.1".into(),
                            port,
                        })
                        .collect();
                    let (round, _errors) =
                        scrape(&targets, qc::scaling::Timestamp::from_millis(0)).await;
                    round.unreachable.len()
                });
            }
            let mut unreadable = 0;
            while let Some(r) = tasks.join_next().await {
                unreadable += r.unwrap();
            }
            (
                unreadable,
                peak_rss_kib().saturating_sub(before),
                started.elapsed(),
            )
        });
        println!(
            "| {body:?} | {consumers} × {PODS} | {} | {unreadable} | {:.1} MiB | {:.1} s |",
            qc::controller::run::DEFAULT_RECONCILE_CONCURRENCY,
            growth as f64 / 1024.0,
            took.as_secs_f64()
        );
    }
    println!("\ncontroller memory limit in the chart: 256Mi (values.yaml resources.limits.memory)");
}
