//! CPU per SQS call through aws-sdk-sqs as the worker makes them: ReceiveMessage of 10 and
//! DeleteMessageBatch of 10 against a loopback server (its own thread) that answers at once with
//! SQS-shaped JSON, so every microsecond counted is the client's. Rows: the worker's calls
//! (`qc::worker::sqs::Sqs`), the same requests made directly on its SDK client, that client with
//! the invocation id and request info interceptors off, and with the user agent off too: what
//! trimming the SDK's optional interceptors would save. Only the calling thread's CPU is counted
//! (`/proc/thread-self/schedstat`). Run with
//! `cargo bench --bench sqs_calls`; knob `QC_BENCH_CALLS` (calls per row, 5000).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_runtime::invocation_id::InvocationIdInterceptor;
use aws_runtime::request_info::RequestInfoInterceptor;
use aws_runtime::user_agent::UserAgentInterceptor;
use aws_sdk_sqs::config::interceptors::BeforeSerializationInterceptorContextRef;
use aws_sdk_sqs::config::{ConfigBag, Intercept};
use aws_sdk_sqs::error::BoxError;
use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
use aws_smithy_runtime_api::client::interceptors::disable_interceptor;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use qc::worker::metrics::Metrics;
use qc::worker::sqs::{Entry, SYSTEM_ATTRIBUTES, Sqs};

/// A receipt handle as long as SQS's (they run to several hundred characters).
fn receipt_handle(i: usize) -> String {
    format!("AQEB{i:04}{}", "x".repeat(380))
}

fn receive_answer() -> String {
    let messages: Vec<String> = (0..10)
        .map(|i| {
            format!(
                r#"{{"MessageId":"6f1c0d36-1c4e-4b7e-9d3e-0000000000{i:02}","ReceiptHandle":"{}","MD5OfBody":"9bb58f26192e4ba00f01e2e7b136bbd8","Body":"{{\"order\":{i},\"items\":[1,2,3],\"note\":\"a message body of about a hundred bytes\"}}","Attributes":{{"ApproximateReceiveCount":"1","SentTimestamp":"1764650000000"}}}}"#,
                receipt_handle(i)
            )
        })
        .collect();
    format!(r#"{{"Messages":[{}]}}"#, messages.join(","))
}

fn delete_answer() -> String {
    let ok: Vec<String> = (0..10).map(|i| format!(r#"{{"Id":"{i}"}}"#)).collect();
    format!(r#"{{"Successful":[{}],"Failed":[]}}"#, ok.join(","))
}

/// Requests that came without the SDK's invocation id header: those of the trimmed client.
static TRIMMED: AtomicU64 = AtomicU64::new(0);

/// Serves SQS's JSON protocol on a loopback port from its own thread; returns the endpoint.
fn serve() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let receive = Bytes::from(receive_answer());
    let delete = Bytes::from(delete_answer());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (receive, delete) = (receive.clone(), delete.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (receive, delete) = (receive.clone(), delete.clone());
                        async move {
                            let target = req
                                .headers()
                                .get("x-amz-target")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or_default()
                                .to_string();
                            if !req.headers().contains_key("amz-sdk-invocation-id") {
                                TRIMMED.fetch_add(1, Ordering::Relaxed);
                            }
                            let _ = req.into_body().collect().await;
                            let body = if target.ends_with("ReceiveMessage") {
                                receive
                            } else {
                                delete
                            };
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .header("content-type", "application/x-amz-json-1.0")
                                    .header(
                                        "x-amzn-requestid",
                                        "00000000-0000-0000-0000-000000000000",
                                    )
                                    .body(Full::new(body))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
    });
    format!("http://{addr}")
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    let ns: u64 = s.split_whitespace().next().unwrap().parse().unwrap();
    Duration::from_nanos(ns)
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How a row calls SQS.
enum Caller {
    /// The worker's own calls (`Sqs::receive`, `Sqs::delete_batch`).
    Worker(Sqs),
    /// The same SDK calls made directly on an SDK client.
    Sdk(aws_sdk_sqs::Client),
}

fn main() {
    // Outside `cargo bench` (`cargo test --all-targets`) a short run checks that every row works.
    let full = std::env::args().any(|a| a == "--bench");
    let calls: usize = std::env::var("QC_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|_| full)
        .unwrap_or(if full { 5000 } else { 60 });
    let block = if full { 200 } else { 20 };
    let endpoint = serve();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // Static keys: the server checks no signature, and the environment's are not needed.
        let sdk = qc::aws::sdk_config(Some("us-east-1"), Some(&endpoint))
            .await
            .into_builder()
            .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
                "bench", "bench", None, None, "bench",
            )))
            .build();
        let url = format!("{endpoint}/000000000000/bench");
        let sqs = Sqs::new(&sdk, &url, Arc::new(Metrics::default())).unwrap();
        let with = |disable: DisableOptional| {
            aws_sdk_sqs::Client::from_conf(
                sqs.client()
                    .config()
                    .to_builder()
                    .interceptor(disable)
                    .build(),
            )
        };
        let rows = [
            ("qc-worker's calls", Caller::Worker(sqs.clone())),
            ("its SDK client, direct", Caller::Sdk(sqs.client())),
            (
                "its SDK client, invocation id and request info off",
                Caller::Sdk(with(DisableOptional { user_agent: false })),
            ),
            (
                "its SDK client, the user agent off too",
                Caller::Sdk(with(DisableOptional { user_agent: true })),
            ),
        ];
        let entries: Vec<Entry> = (0..10)
            .map(|i| Entry {
                message_id: format!("6f1c0d36-1c4e-4b7e-9d3e-0000000000{i:02}"),
                receipt_handle: receipt_handle(i),
                lease_until: None,
            })
            .collect();
        // Rows interleaved in short blocks, the median block reported: this machine's speed drifts
        // by tens of percent over seconds, so rows run one after the other are not comparable.
        let cases: Vec<(usize, &str, bool)> = (0..rows.len())
            .flat_map(|r| {
                [
                    ("ReceiveMessage (10)", false),
                    ("DeleteMessageBatch (10)", true),
                ]
                .map(|(name, delete)| (r, name, delete))
            })
            .collect();
        let rounds = calls.div_ceil(block).max(3);
        let mut per_call: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
        for round in 0..=rounds {
            for (i, &(r, _, delete)) in cases.iter().enumerate() {
                let cpu0 = thread_cpu();
                for _ in 0..block {
                    one(&rows[r].1, &url, &entries, delete).await;
                }
                // Round 0 warms caches, connections and credentials.
                if round > 0 {
                    per_call[i]
                        .push(thread_cpu().saturating_sub(cpu0).as_secs_f64() * 1e6 / block as f64);
                }
            }
        }
        println!(
            "| client | call | calls | CPU / call (median of {rounds} blocks) | fastest block |"
        );
        println!("|---|---|---:|---:|---:|");
        for (i, &(r, name, _)) in cases.iter().enumerate() {
            let v = &mut per_call[i];
            v.sort_by(f64::total_cmp);
            println!(
                "| {} | {name} | {} | {:.1} µs | {:.1} µs |",
                rows[r].0,
                rounds * block,
                v[v.len() / 2],
                v[0]
            );
        }
        // The last two rows' requests, and only those, went out without the invocation id.
        let trimmed_calls = 2 * (rounds + 1) * block * 2;
        assert_eq!(TRIMMED.load(Ordering::Relaxed), trimmed_calls as u64);
    });
}

async fn one(caller: &Caller, url: &str, entries: &[Entry], delete: bool) {
    match (caller, delete) {
        (Caller::Worker(sqs), true) => assert!(sqs.delete_batch(entries).await.unwrap().is_empty()),
        (Caller::Worker(sqs), false) => {
            assert_eq!(sqs.receive(10, Duration::ZERO).await.unwrap().len(), 10);
        }
        (Caller::Sdk(client), true) => {
            let built = entries
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(&e.receipt_handle)
                        .build()
                        .unwrap()
                })
                .collect();
            let out = client
                .delete_message_batch()
                .queue_url(url)
                .set_entries(Some(built))
                .send()
                .await
                .unwrap();
            assert_eq!(out.successful().len(), 10);
        }
        (Caller::Sdk(client), false) => {
            let mut req = client
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .message_attribute_names("All");
            for name in SYSTEM_ATTRIBUTES {
                req = req.message_system_attribute_names(name);
            }
            assert_eq!(req.send().await.unwrap().messages().len(), 10);
        }
    }
}

/// Turns off, at the start of each call (the SDK has no client-wide switch), the SDK interceptors
/// a worker could do without: the invocation id and request info headers, and with `user_agent`
/// the user agent headers too (the Lambda recursion detection is permanent). What trimming them
/// would save, measured rather than guessed (docs/decisions.md).
#[derive(Debug)]
struct DisableOptional {
    user_agent: bool,
}

impl Intercept for DisableOptional {
    fn name(&self) -> &'static str {
        "DisableOptional"
    }

    fn read_before_execution(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let state = cfg.interceptor_state();
        if self.user_agent {
            state.store_put(disable_interceptor::<UserAgentInterceptor>("bench"));
        }
        state.store_put(disable_interceptor::<InvocationIdInterceptor>("bench"));
        state.store_put(disable_interceptor::<RequestInfoInterceptor>("bench"));
        Ok(())
    }
}
