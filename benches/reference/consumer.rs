//! The reference consumer of the worker bench (#31 item 2): the least a consumer can do through the
//! same rig, so the rig's own limit is measured in the same run as qc-worker. It is the bench binary
//! run again as a separate process (`--reference-consumer`), so its CPU and memory are its own.
//!
//! What it does, and nothing else: `ceil(C / 10)` receivers each ask for 10 messages (long poll 1 s)
//! through aws-sdk-sqs, built as qc-worker builds its client, and hand them to C tasks through a
//! channel holding up to one batch per receiver, so a task that finishes always finds its next
//! message at hand; each task POSTs the body to the same handler over qc-worker's own HTTP/1.1
//! client and passes the receipt handle on; one deleter sends DeleteMessageBatch at 10 handles or
//! after 20 ms. No heartbeats, no leases, no retries, no idempotency, no metrics, no shutdown
//! drain: a failed call leaves its message to come back after the visibility timeout. It is a
//! yardstick, not a consumer to run.
//!
//! With `QC_REF_BATCH_ITEMS` = N > 1 it is batch mode's yardstick (#32 item 4): ceil(C / N) tasks
//! each take up to N messages (the first, then as many as come within 50 ms, qc-worker's
//! `--batch-max-wait` in the bench) and POST them to the handler as one JSON array
//! (`application/cloudevents-batch+json`, one handler time a call); their handles go to the deleter
//! together on a 2xx. What it costs a message is then the SDK's receive and delete calls and a tenth
//! of a handler call: the floor under qc-worker's batch mode.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
use qc::worker::http1::Pool;
use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;

/// Runs the reference consumer from `QC_REF_QUEUE_URL`, `QC_REF_ENDPOINT`, `QC_REF_HANDLER_URL` and
/// `QC_REF_CONCURRENCY` (messages at once), with `QC_REF_BATCH_ITEMS` messages a handler call (1 when
/// unset), until it is killed.
///
/// # Panics
/// When one of them is missing or malformed (a bench, not a product: it stops loudly).
pub fn main() {
    let var = |n: &str| std::env::var(n).unwrap_or_else(|_| panic!("{n} is not set"));
    let url = var("QC_REF_QUEUE_URL");
    let endpoint = var("QC_REF_ENDPOINT");
    let handler = var("QC_REF_HANDLER_URL");
    let concurrency: usize = var("QC_REF_CONCURRENCY").parse().expect("a count");
    let items: usize = std::env::var("QC_REF_BATCH_ITEMS")
        .map_or(1, |v| v.parse().expect("QC_REF_BATCH_ITEMS: a count"))
        .max(1);
    // The same runtime as qc-worker's: two worker threads.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(url, endpoint, handler, concurrency, items));
}

/// How long a batch call waits for its batch to fill after its first message.
const BATCH_FILL: Duration = Duration::from_millis(50);

async fn run(url: String, endpoint: String, handler: String, concurrency: usize, items: usize) {
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&endpoint)).await;
    let client = aws_sdk_sqs::Client::new(&conf);
    let uri: hyper::Uri = handler.parse().expect("handler URL");
    let authority = uri.authority().expect("host:port").to_string();
    let content_type = if items > 1 {
        "application/cloudevents-batch+json"
    } else {
        "application/json"
    };
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: {content_type}\r\ncontent-length: ",
        uri.path()
    );
    let pool = Arc::new(Pool::new(
        authority,
        concurrency,
        Duration::from_secs(4),
        Duration::from_secs(5),
    ));

    let (done, mut handles) = mpsc::unbounded_channel::<String>();
    let (del_client, del_url) = (client.clone(), url.clone());
    tokio::spawn(async move {
        while let Some(first) = handles.recv().await {
            let mut batch = vec![first];
            let deadline = Instant::now() + Duration::from_millis(20);
            while batch.len() < 10 {
                match tokio::time::timeout_at(deadline, handles.recv()).await {
                    Ok(Some(h)) => batch.push(h),
                    _ => break,
                }
            }
            let entries: Vec<_> = batch
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(h)
                        .build()
                        .unwrap()
                })
                .collect();
            let (c, u) = (del_client.clone(), del_url.clone());
            tokio::spawn(async move {
                let _ = c
                    .delete_message_batch()
                    .queue_url(u)
                    .set_entries(Some(entries))
                    .send()
                    .await;
            });
        }
    });

    let receivers = concurrency.div_ceil(10).max(1);
    let (to_tasks, from_receivers) = mpsc::channel::<(String, String)>(10 * receivers);
    let from_receivers = Arc::new(Mutex::new(from_receivers));
    for _ in 0..concurrency.div_ceil(items) {
        let (rx, pool, done, head) = (
            from_receivers.clone(),
            pool.clone(),
            done.clone(),
            head.clone(),
        );
        tokio::spawn(async move {
            loop {
                let batch = {
                    let mut rx = rx.lock().await;
                    let Some(first) = rx.recv().await else { return };
                    let mut batch = vec![first];
                    let deadline = Instant::now() + BATCH_FILL;
                    while batch.len() < items {
                        match tokio::time::timeout_at(deadline, rx.recv()).await {
                            Ok(Some(m)) => batch.push(m),
                            _ => break,
                        }
                    }
                    batch
                };
                let body = if items > 1 {
                    // A JSON array of the bodies (each one JSON already).
                    let bodies: Vec<&str> = batch.iter().map(|(b, _)| b.as_str()).collect();
                    format!("[{}]", bodies.join(","))
                } else {
                    batch[0].0.clone()
                };
                let head = format!("{head}{}\r\n\r\n", body.len());
                if let Ok(answer) = pool.send(head.as_bytes(), body.as_bytes(), false).await
                    && (200..300).contains(&answer.status)
                {
                    for (_, handle) in batch {
                        let _ = done.send(handle);
                    }
                }
            }
        });
    }
    let mut receiving = Vec::new();
    for _ in 0..receivers {
        let (client, url, to_tasks) = (client.clone(), url.clone(), to_tasks.clone());
        receiving.push(tokio::spawn(async move {
            loop {
                let Ok(out) = client
                    .receive_message()
                    .queue_url(&url)
                    .max_number_of_messages(10)
                    .wait_time_seconds(1)
                    .send()
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                for m in out.messages.unwrap_or_default() {
                    let body = m.body.unwrap_or_default();
                    let handle = m.receipt_handle.unwrap_or_default();
                    if to_tasks.send((body, handle)).await.is_err() {
                        return;
                    }
                }
            }
        }));
    }
    for r in receiving {
        let _ = r.await;
    }
}
