//! The worker's rows of the bad-input table (docs/reliability.md): flags and environment, handler answers, and
//! the odd inputs around them. Each row is named; each expects a clear error naming the flag and the
//! fix, or a safe outcome with nothing lost. The manifest rows live in tests/bad_input_manifests.rs.

#[path = "common/mod.rs"]
mod common;
#[path = "worker/sqs_script.rs"]
mod sqs_script;
#[path = "worker/support.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECS: fn(u64) -> Duration = Duration::from_secs;

fn run_cli(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A command line or environment the worker must refuse at start: exit 2, naming what to fix.
struct FlagRow {
    name: &'static str,
    args: Vec<&'static str>,
    env: Vec<(&'static str, &'static str)>,
    /// Every one of these is in the error.
    expect: Vec<&'static str>,
}

fn flag_rows() -> Vec<FlagRow> {
    let q = vec![
        "--queue-url",
        "http://127.0.0.1:1/1/q",
        "--metrics-addr",
        "127.0.0.1:0",
        "--http-url",
        "http://127.0.0.1:1/m",
    ];
    let with = |extra: &[&'static str]| [&q[..], extra].concat();
    let row = |name, args: Vec<&'static str>, expect: Vec<&'static str>| FlagRow {
        name,
        args,
        env: vec![],
        expect,
    };
    let env_row = |name, env: Vec<(&'static str, &'static str)>, expect| FlagRow {
        name,
        args: q.clone(),
        env,
        expect,
    };
    vec![
        env_row(
            "TOKIO_WORKER_THREADS=abc",
            vec![("TOKIO_WORKER_THREADS", "abc")],
            vec!["TOKIO_WORKER_THREADS", "whole number"],
        ),
        env_row(
            "TOKIO_WORKER_THREADS=0",
            vec![("TOKIO_WORKER_THREADS", "0")],
            vec!["TOKIO_WORKER_THREADS", "from 1"],
        ),
        env_row(
            "TOKIO_WORKER_THREADS empty",
            vec![("TOKIO_WORKER_THREADS", "")],
            vec!["TOKIO_WORKER_THREADS", "unset it"],
        ),
        env_row(
            "TOKIO_WORKER_THREADS=-3",
            vec![("TOKIO_WORKER_THREADS", "-3")],
            vec!["TOKIO_WORKER_THREADS"],
        ),
        env_row(
            "SSL_CERT_FILE pointing at an empty file",
            vec![("SSL_CERT_FILE", "/dev/null")],
            vec!["SSL_CERT_FILE", "no PEM certificate", "unset it"],
        ),
        env_row(
            "SSL_CERT_FILE pointing at no file",
            vec![("SSL_CERT_FILE", "/nonexistent/ca.pem")],
            vec!["SSL_CERT_FILE", "cannot read", "unset it"],
        ),
        env_row(
            "QC_BATCH_SIZE=12 from the environment",
            vec![("QC_BATCH_SIZE", "12")],
            vec!["--batch-size", "between 1 and 10"],
        ),
        row(
            "concurrency 4294967296 (past u32)",
            with(&["--concurrency", "4294967296"]),
            vec!["--concurrency"],
        ),
        row(
            "concurrency 4294967295",
            with(&["--concurrency", "4294967295"]),
            vec!["--concurrency", "at most"],
        ),
        row(
            "concurrency 0",
            with(&["--concurrency", "0"]),
            vec!["--concurrency", "at least 1"],
        ),
        row(
            "concurrency -1",
            with(&["--concurrency=-1"]),
            vec!["--concurrency"],
        ),
        row(
            "batch size 0",
            with(&["--batch-size", "0"]),
            vec!["--batch-size", "between 1 and 10"],
        ),
        row(
            "batch size 11",
            with(&["--batch-size", "11"]),
            vec!["--batch-size", "between 1 and 10"],
        ),
        row(
            "s3 delete after without s3 payloads",
            with(&["--s3-delete-after"]),
            vec!["--s3-delete-after", "needs --s3-payloads"],
        ),
        row(
            "dynamodb store without a table",
            with(&["--idempotency-store", "dynamodb"]),
            vec![
                "--dynamodb-table",
                "is required with --idempotency-store dynamodb",
            ],
        ),
        row(
            "dynamodb table name with a slash",
            with(&["--idempotency-store", "dynamodb", "--dynamodb-table", "a/b"]),
            vec!["--dynamodb-table", "3 to 255 letters"],
        ),
        row(
            "filter pattern that is not JSON",
            with(&["--filter", "{\"body\": {\"type\": [\"order\"]}"]),
            vec![
                "--filter",
                "filter pattern 0 at line 1 column 28",
                "not JSON",
            ],
        ),
        row(
            "filter pattern with a misspelt operator",
            with(&[
                "--filter",
                "{\"body\": [\"x\"]}",
                "--filter",
                "{\"body\": {\"type\": [{\"prefx\": \"o\"}]}}",
            ]),
            vec![
                "--filter",
                "filter pattern 1 at body.type[0].prefx",
                "unknown operator",
            ],
        ),
        row(
            "s3 payload max 0",
            with(&["--s3-payloads", "--s3-payload-max", "0"]),
            vec!["--s3-payload-max", "at least 1 byte"],
        ),
        row(
            "batch max items 0",
            with(&["--batch-max-items", "0"]),
            vec![
                "--batch-max-items",
                "between 1 (one message a call) and 100",
            ],
        ),
        row(
            "batch max items 101",
            with(&["--batch-max-items", "101"]),
            vec![
                "--batch-max-items",
                "between 1 (one message a call) and 100",
            ],
        ),
        row(
            "batch max wait 6m",
            with(&["--batch-max-wait", "6m"]),
            vec!["--batch-max-wait", "at most 5m"],
        ),
        row(
            "wait time 21s",
            with(&["--wait-time", "21s"]),
            vec!["--wait-time", "at most 20s"],
        ),
        row(
            "wait time without a unit",
            with(&["--wait-time", "5"]),
            vec!["--wait-time"],
        ),
        row(
            "timeout 0s",
            with(&["--timeout", "0s"]),
            vec!["--timeout", "greater than 0s"],
        ),
        row(
            "timeout 13h",
            with(&["--timeout", "13h"]),
            vec!["--timeout", "at most 12h"],
        ),
        row(
            "timeout overflowing",
            with(&["--timeout", "99999999999999999999h"]),
            vec!["--timeout"],
        ),
        row(
            "max rate 0",
            with(&["--max-rate", "0"]),
            vec!["--max-rate", "positive number"],
        ),
        row(
            "max rate not a number",
            with(&["--max-rate", "fast"]),
            vec!["--max-rate", "positive number", "e.g."],
        ),
        row(
            "max rate file without a max rate",
            with(&["--max-rate-file", "/etc/qc/rate/share"]),
            vec!["--max-rate-file", "needs --max-rate"],
        ),
        row(
            "retry max below retry base",
            with(&["--retry-base", "10s", "--retry-max", "1s"]),
            vec!["--retry-max", "--retry-base"],
        ),
        row(
            "heartbeat interval 0s",
            with(&["--heartbeat-interval", "0s"]),
            vec!["--heartbeat-interval", "auto"],
        ),
        row(
            "heartbeat maybe",
            with(&["--heartbeat", "maybe"]),
            vec!["--heartbeat"],
        ),
        row(
            "on-poison maybe",
            with(&["--on-poison", "maybe"]),
            vec!["--on-poison", "leave"],
        ),
        row(
            "redis store without a URL",
            with(&["--idempotency-store", "redis"]),
            vec!["--redis-url", "redis://"],
        ),
        row(
            "redis store with a blank URL",
            with(&["--idempotency-store", "redis", "--redis-url", "  "]),
            vec!["--redis-url"],
        ),
        row(
            "idempotency key without a kind",
            with(&["--idempotency-key", "orderId"]),
            vec!["jsonPointer:"],
        ),
        row(
            "idempotency key pointer without a slash",
            with(&["--idempotency-key", "jsonPointer:orderId"]),
            vec!["--idempotency-key"],
        ),
        row(
            "idempotency ttl 0s",
            with(&["--idempotency-store", "memory", "--idempotency-ttl", "0s"]),
            vec!["--idempotency-ttl"],
        ),
        row(
            "request head cap 100 bytes",
            with(&["--max-request-head", "100"]),
            vec!["--max-request-head", "1KiB"],
        ),
        row(
            "request head cap in made-up units",
            with(&["--max-request-head", "8XB"]),
            vec!["--max-request-head", "KiB"],
        ),
        row(
            "handler URL with another scheme",
            [&q[..4], &["--http-url", "ftp://127.0.0.1/m"]].concat(),
            vec!["--http-url", "only http://"],
        ),
        row(
            "handler URL empty",
            [&q[..4], &["--http-url", ""]].concat(),
            vec!["--http-url"],
        ),
        row(
            "exec without a command",
            [&q[..4], &["--exec"]].concat(),
            vec!["after `--`"],
        ),
        row(
            "exec command that does not exist",
            [&q[..4], &["--exec", "--", "/nonexistent/handler"]].concat(),
            vec!["--exec", "not found"],
        ),
        row(
            "both handlers",
            with(&["--exec", "--", "sh"]),
            vec!["--exec"],
        ),
        row(
            "no handler",
            q[..4].to_vec(),
            vec!["no handler", "--http-url"],
        ),
        row("queue URL missing", q[4..].to_vec(), vec!["--queue-url"]),
        row(
            "queue URL blank",
            [&["--queue-url", " "], &q[2..]].concat(),
            vec!["--queue-url"],
        ),
        row(
            "queue URL with CRLF",
            [
                &["--queue-url", "http://127.0.0.1:1/1/q\r\nx-evil: 1"],
                &q[2..],
            ]
            .concat(),
            vec!["--queue-url", "control"],
        ),
        row(
            "region with CRLF",
            with(&["--region", "us-east-1\r\nx-evil: 1"]),
            vec!["--region", "us-east-1"],
        ),
        row(
            "shutdown timeout in words",
            with(&["--shutdown-timeout", "later"]),
            vec!["--shutdown-timeout"],
        ),
    ]
}

#[test]
fn worker_flag_and_env_rows_exit_2_naming_the_flag_and_the_fix() {
    let mut failures = Vec::new();
    let rows = flag_rows();
    for r in &rows {
        let (code, stderr) = run_cli(&r.args, &r.env);
        let missing: Vec<_> = r.expect.iter().filter(|n| !stderr.contains(*n)).collect();
        if code != Some(2) || !missing.is_empty() || stderr.contains("panicked") {
            failures.push(format!(
                "{}: exit {code:?}, missing {missing:?} in:\n{stderr}",
                r.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

/// What the worker must do with a message after the handler's answer.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    /// Handled: the message is deleted.
    Deleted,
    /// Kept on the queue, to come back after `retry_in_s`; the reason names `why`.
    Retried { retry_in_s: u64, why: &'static str },
    /// Poison with `--on-poison leave`: kept for the redrive policy.
    LeftAsPoison,
    /// The handler ran past `--timeout`: kept, retried later.
    TimedOut,
}

/// How the scripted handler answers one request.
#[derive(Clone)]
enum Answer {
    /// These bytes, then the connection stays open for the next request.
    Bytes(Vec<u8>),
    /// These bytes, then the connection is closed.
    BytesThenClose(Vec<u8>),
    /// A chunked 200 whose chunks never end.
    EndlessChunks,
    /// Reads the request and never answers.
    Silence,
}

struct HandlerRow {
    name: &'static str,
    answer: Answer,
    expect: Expect,
}

fn handler_rows() -> Vec<HandlerRow> {
    use Answer::*;
    use Expect::*;
    let b = |s: &str| Bytes(s.as_bytes().to_vec());
    let retried = |why| Retried {
        retry_in_s: 300,
        why,
    };
    #[allow(clippy::format_collect)]
    let many_headers: String = (0..70).map(|i| format!("x-h{i}: v\r\n")).collect();
    vec![
        HandlerRow {
            name: "200 with Content-Length",
            answer: b("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
            expect: Deleted,
        },
        HandlerRow {
            name: "204 without a length",
            answer: b("HTTP/1.1 204 No Content\r\n\r\n"),
            expect: Deleted,
        },
        HandlerRow {
            name: "HTTP/1.0 200 delimited by the close",
            answer: BytesThenClose(b"HTTP/1.0 200 OK\r\n\r\nfine".to_vec()),
            expect: Deleted,
        },
        HandlerRow {
            name: "100 Continue before the 200",
            answer: b("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"),
            expect: Deleted,
        },
        HandlerRow {
            name: "chunked 200 with a trailer",
            answer: b(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nx-t: 1\r\n\r\n",
            ),
            expect: Deleted,
        },
        HandlerRow {
            name: "200 with more body than its length",
            answer: BytesThenClose(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokextra".to_vec()),
            expect: Deleted,
        },
        HandlerRow {
            name: "400 is poison",
            answer: b("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
            expect: LeftAsPoison,
        },
        HandlerRow {
            name: "422 is poison",
            answer: b("HTTP/1.1 422 Unprocessable\r\nContent-Length: 0\r\n\r\n"),
            expect: LeftAsPoison,
        },
        HandlerRow {
            name: "500",
            answer: b("HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"),
            expect: retried("HTTP 500"),
        },
        HandlerRow {
            name: "301 redirect",
            answer: b("HTTP/1.1 301 Moved\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n"),
            expect: retried("HTTP 301"),
        },
        HandlerRow {
            name: "401",
            answer: b("HTTP/1.1 401 No\r\nContent-Length: 0\r\n\r\n"),
            expect: retried("HTTP 401"),
        },
        HandlerRow {
            name: "status 999",
            answer: b("HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n"),
            expect: retried("HTTP 999"),
        },
        HandlerRow {
            name: "Retry-After: 99999999999",
            answer: b("HTTP/1.1 503 Busy\r\nRetry-After: 99999999999\r\nContent-Length: 0\r\n\r\n"),
            // Capped at --retry-max, never 12 hours (or 3000 years).
            expect: Retried {
                retry_in_s: 600,
                why: "HTTP 503",
            },
        },
        HandlerRow {
            name: "Retry-After: -1",
            answer: b("HTTP/1.1 429 Slow\r\nRetry-After: -1\r\nContent-Length: 0\r\n\r\n"),
            expect: retried("HTTP 429"),
        },
        HandlerRow {
            name: "Retry-After past u64",
            answer: b(
                "HTTP/1.1 429 Slow\r\nRetry-After: 99999999999999999999999\r\nContent-Length: 0\r\n\r\n",
            ),
            expect: retried("HTTP 429"),
        },
        HandlerRow {
            name: "Retry-After in words",
            answer: b("HTTP/1.1 503 Busy\r\nRetry-After: soon\r\nContent-Length: 0\r\n\r\n"),
            expect: retried("HTTP 503"),
        },
        HandlerRow {
            name: "Retry-After: 5 on a 500 is ignored",
            answer: b("HTTP/1.1 500 Oops\r\nRetry-After: 5\r\nContent-Length: 0\r\n\r\n"),
            expect: retried("HTTP 500"),
        },
        HandlerRow {
            name: "not HTTP at all",
            answer: BytesThenClose(b"SMTP ready\r\n\r\n".to_vec()),
            expect: retried("malformed"),
        },
        HandlerRow {
            name: "Content-Length in words",
            answer: BytesThenClose(b"HTTP/1.1 200 OK\r\nContent-Length: five\r\n\r\n".to_vec()),
            expect: retried("Content-Length"),
        },
        HandlerRow {
            name: "two different Content-Lengths",
            answer: BytesThenClose(
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab".to_vec(),
            ),
            expect: retried("conflicting"),
        },
        HandlerRow {
            name: "101 Switching Protocols",
            answer: BytesThenClose(b"HTTP/1.1 101 Switching\r\nUpgrade: x\r\n\r\n".to_vec()),
            expect: retried("101"),
        },
        HandlerRow {
            name: "answer head over 64 KiB",
            answer: BytesThenClose(
                format!("HTTP/1.1 200 OK\r\nx-big: {}\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            ),
            expect: retried("longer than"),
        },
        HandlerRow {
            name: "70 headers",
            answer: BytesThenClose(
                format!("HTTP/1.1 200 OK\r\n{many_headers}Content-Length: 0\r\n\r\n").into_bytes(),
            ),
            expect: retried("malformed"),
        },
        HandlerRow {
            name: "closed without an answer",
            answer: BytesThenClose(Vec::new()),
            expect: retried("no answer"),
        },
        HandlerRow {
            name: "200 cut off inside its body",
            answer: BytesThenClose(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc".to_vec()),
            expect: retried("closed before the answer was complete"),
        },
        HandlerRow {
            name: "chunk size in letters",
            answer: BytesThenClose(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            ),
            expect: retried("chunk size"),
        },
        HandlerRow {
            name: "chunk size past u64",
            answer: BytesThenClose(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\n"
                    .to_vec(),
            ),
            expect: retried("chunk size"),
        },
        HandlerRow {
            name: "endless chunked answer",
            answer: EndlessChunks,
            expect: TimedOut,
        },
        HandlerRow {
            name: "never answers",
            answer: Silence,
            expect: TimedOut,
        },
    ]
}

/// A raw TCP handler: answers each request with the bytes of the row its body names.
async fn scripted_handler(rows: Arc<HashMap<String, Answer>>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/messages", listener.local_addr().unwrap());
    let calls: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let rows = rows.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                loop {
                    let Some(body) = read_request(&mut s).await else {
                        return;
                    };
                    seen.lock().unwrap().push(body.clone());
                    match rows.get(&body).cloned() {
                        Some(Answer::Bytes(b)) => {
                            if s.write_all(&b).await.is_err() {
                                return;
                            }
                        }
                        Some(Answer::BytesThenClose(b)) => {
                            let _ = s.write_all(&b).await;
                            return;
                        }
                        Some(Answer::EndlessChunks) => {
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                                .await;
                            let chunk = format!("1000\r\n{}\r\n", "z".repeat(4096));
                            while s.write_all(chunk.as_bytes()).await.is_ok() {
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                            return;
                        }
                        Some(Answer::Silence) | None => {
                            tokio::time::sleep(SECS(3600)).await;
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, calls)
}

/// One request's body (Content-Length framed, as the worker sends); None at EOF.
async fn read_request(s: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut b).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = s.read(&mut b).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&b[..n]);
    }
    Some(String::from_utf8_lossy(&buf[head_end..head_end + len]).to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_answer_rows_end_safely_and_lose_nothing() {
    let rows = handler_rows();
    let answers: HashMap<String, Answer> = rows
        .iter()
        .map(|r| (r.name.to_string(), r.answer.clone()))
        .collect();
    let (url, calls) = scripted_handler(Arc::new(answers)).await;
    let q = TestQueue::new("bad-answers", 30, 10, false).await;
    let mut ids: HashMap<String, &HandlerRow> = HashMap::new();
    for r in &rows {
        let out = q
            .client
            .send_message()
            .queue_url(&q.url)
            .message_body(r.name)
            .send()
            .await
            .unwrap();
        ids.insert(out.message_id.unwrap(), r);
    }
    // Each answer's own retry: with the breaker (the default) the many failing rows, and the 503
    // with Retry-After at once, would pause the worker and hold them (tests/worker_breaker.rs).
    let a = q.args(&[
        "--breaker",
        "false",
        "--timeout",
        "2s",
        "--retry-base",
        "300s",
        "--retry-max",
        "600s",
        "--on-poison",
        "leave",
        "--concurrency",
        "10",
        "--http-url",
        &url,
    ]);
    let mut w = Worker::start(&a);
    let deleted_rows = rows.iter().filter(|r| r.expect == Expect::Deleted).count();
    let kept_rows = rows.len() - deleted_rows;
    eventually(SECS(90), "every row ended", || async {
        let deleted = w.metric("qc_worker_messages_deleted_total").await;
        let failed = w.log_lines("handler failed; retrying later").len()
            + w.log_lines("poison message; leaving it for the redrive policy (--on-poison leave)")
                .len();
        deleted == Some(deleted_rows as f64) && failed >= kept_rows
    })
    .await;

    // Each row's outcome, by its message id.
    let mut outcome: HashMap<String, Expect> = HashMap::new();
    for l in w.log_lines("handler failed; retrying later") {
        let id = l["message_id"].as_str().unwrap().to_string();
        let reason = l["reason"].as_str().unwrap_or_default().to_string();
        let retry = l["retry_in_s"].as_u64().unwrap_or(u64::MAX);
        let row = ids[&id];
        let got = if reason.contains("timed out") {
            Expect::TimedOut
        } else {
            match &row.expect {
                Expect::Retried { why, .. } if reason.contains(why) => Expect::Retried {
                    retry_in_s: retry,
                    why,
                },
                _ => Expect::Retried {
                    retry_in_s: retry,
                    why: Box::leak(reason.into_boxed_str()),
                },
            }
        };
        outcome.insert(id, got);
    }
    for l in w.log_lines("poison message; leaving it for the redrive policy (--on-poison leave)") {
        outcome.insert(
            l["message_id"].as_str().unwrap().to_string(),
            Expect::LeftAsPoison,
        );
    }
    let mut failures = Vec::new();
    for (id, r) in &ids {
        let got = outcome.get(id).cloned().unwrap_or(Expect::Deleted);
        if got != r.expect {
            failures.push(format!("{}: expected {:?}, got {got:?}", r.name, r.expect));
        }
    }
    // Nothing lost: every kept row is still on the queue (hidden for its retry delay).
    let (visible, hidden, _) = q.counts().await;
    assert_eq!(
        (visible, hidden),
        (0, kept_rows as u64),
        "kept messages stay on the queue"
    );
    let calls = calls.lock().unwrap().clone();
    for r in &rows {
        if !calls.iter().any(|c| c == r.name) {
            failures.push(format!("{}: the handler never got it", r.name));
        }
    }
    assert!(
        w.running(),
        "the worker survived every answer; log:\n{}",
        w.log_text()
    );
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
    w.stop().await;
}

/// A redis URL's password never reaches the log, whatever fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_password_is_never_logged() {
    let q = TestQueue::new("redis-secret", 30, 10, false).await;
    let port = free_port();
    let url = format!("redis://user:s3cr3t-pw@127.0.0.1:{port}/0");
    let a = q.args(&[
        "--idempotency-store",
        "redis",
        "--redis-url",
        &url,
        "--http-url",
        "http://127.0.0.1:1/m",
    ]);
    let mut w = Worker::start(&a);
    w.wait_error_logged(
        SECS(30),
        "idempotency store unreachable; not ready",
        &["127.0.0.1"],
    )
    .await;
    w.signal("TERM");
    w.wait_exit(SECS(20)).await;
    let log = w.log_text();
    assert!(!log.contains("s3cr3t-pw"), "password in the log:\n{log}");
    // A malformed URL with a password: refused at once, still without the password.
    let (code, stderr) = run_cli(
        &[
            "--queue-url",
            &q.url,
            "--endpoint-url",
            &common::sqs_endpoint(),
            "--metrics-addr",
            "127.0.0.1:0",
            "--idempotency-store",
            "redis",
            "--redis-url",
            "redis://user:s3cr3t-pw@[bad",
            "--http-url",
            "http://127.0.0.1:1/m",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--redis-url"), "{stderr}");
    assert!(!stderr.contains("s3cr3t-pw"), "{stderr}");
}

// ---- Odd SQS answers, from the scripted stand-in in tests/worker/sqs_script.rs.

use sqs_script::{Answer as Sqs, SqsCall, SqsScript, messages};

/// A row's check, run against its own stand-in and worker.
type RowRun = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// One odd SQS answer: the script, why moto cannot be made to give it, and what must hold.
struct SqsRow {
    name: &'static str,
    why_scripted: &'static str,
    run: fn() -> RowRun,
}

fn sqs_rows() -> Vec<SqsRow> {
    vec![
        SqsRow {
            name: "receive answers 5 messages when asked for 1",
            why_scripted: "moto honours MaxNumberOfMessages",
            run: || Box::pin(more_than_asked()),
        },
        SqsRow {
            name: "DeleteMessageBatch Failed lists an entry twice and ids that name no entry",
            why_scripted: "moto answers each entry once, with the ids it was sent",
            run: || Box::pin(delete_failed_odd_ids()),
        },
        SqsRow {
            name: "ChangeMessageVisibilityBatch Failed lists an unknown id and leaves an entry unanswered",
            why_scripted: "moto answers every entry, with the ids it was sent",
            run: || Box::pin(release_failed_odd_ids()),
        },
        SqsRow {
            name: "an empty 200 to a delete (no body, then {})",
            why_scripted: "moto always lists the entries it deleted",
            run: || Box::pin(empty_200_to_a_delete()),
        },
        SqsRow {
            name: "a receive hanging 11 s",
            why_scripted: "moto answers a long poll when its wait time ends",
            run: || Box::pin(receive_hangs()),
        },
    ]
}

/// A worker on the stand-in: concurrency 1, batches of 1, 1 s polls.
fn odd_worker(sqs: &SqsScript, handler: &str, extra: &[&str]) -> Worker {
    let mut a = args(&[
        "--queue-url",
        &sqs.queue_url,
        "--endpoint-url",
        &sqs.endpoint,
        "--wait-time",
        "1s",
        "--concurrency",
        "1",
        "--batch-size",
        "1",
        "--http-url",
        handler,
    ]);
    a.extend(args(extra));
    Worker::start_with_env(
        Arc::new(tempfile::tempdir().unwrap()),
        &a,
        &[
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ],
    )
}

/// Polls `check` for up to `limit`; Err(what) if it never holds.
async fn within<F, Fut>(limit: Duration, what: &str, mut check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("timed out waiting for: {what}"))
}

fn ensure(ok: bool, what: String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what) }
}

async fn stop(mut w: Worker) -> Result<(), String> {
    ensure(
        w.running(),
        format!("the worker died; log:\n{}", w.log_text()),
    )?;
    w.signal("TERM");
    ensure(w.wait_exit(SECS(20)).await.success(), "clean exit".into())
}

/// Process what fits the free slots, release the rest at once with visibility 0; in flight never
/// passes the concurrency; every message deleted or released (nothing lost).
async fn more_than_asked() -> Result<(), String> {
    let sqs = SqsScript::start(|c: &SqsCall| match (c.action.as_str(), c.nth) {
        ("ReceiveMessage", 0) => messages(0..5),
        _ => Sqs::Usual,
    })
    .await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(200))).await;
    let w = odd_worker(&sqs, &h.url, &[]);
    let all: Vec<String> = (0..5).map(|n| format!("rh-{n}")).collect();
    within(SECS(30), "every message deleted or released", || {
        let done = {
            let mut d = sqs.handles_in("DeleteMessageBatch", None);
            d.extend(sqs.handles_in("ChangeMessageVisibilityBatch", Some(0)));
            d
        };
        let all = all.clone();
        async move { all.iter().all(|rh| done.contains(rh)) }
    })
    .await?;
    let deleted = sqs.handles_in("DeleteMessageBatch", None);
    let released = sqs.handles_in("ChangeMessageVisibilityBatch", Some(0));
    ensure(
        deleted == ["rh-0"],
        format!("only the message asked for is handled: deleted {deleted:?}"),
    )?;
    let mut r = released.clone();
    r.sort();
    r.dedup();
    ensure(
        r == ["rh-1", "rh-2", "rh-3", "rh-4"],
        format!("the 4 extra ones released at once: {released:?}"),
    )?;
    ensure(
        h.calls().len() == 1,
        format!("handler calls: {:?}", h.calls()),
    )?;
    ensure(
        h.max_active() <= 1,
        format!("max in flight {}", h.max_active()),
    )?;
    let in_flight = w.metric("qc_worker_in_flight").await;
    ensure(
        in_flight == Some(0.0),
        format!("in-flight gauge back to 0 (no underflow): {in_flight:?}"),
    )?;
    stop(w).await
}

fn failed_entry(id: &str) -> serde_json::Value {
    serde_json::json!({"Id": id, "SenderFault": false, "Code": "InternalError", "Message": "scripted"})
}

/// Repeats and unknown ids neither panic nor count: the entry is retried until SQS confirms it.
async fn delete_failed_odd_ids() -> Result<(), String> {
    let sqs = SqsScript::start(|c: &SqsCall| match (c.action.as_str(), c.nth) {
        ("ReceiveMessage", 0) => messages(0..1),
        ("DeleteMessageBatch", 0) => Sqs::Json(serde_json::json!({
            "Successful": [],
            "Failed": [failed_entry("0"), failed_entry("0"), failed_entry("9"), failed_entry("zz")],
        })),
        _ => Sqs::Usual,
    })
    .await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let w = odd_worker(&sqs, &h.url, &[]);
    within(SECS(30), "the delete retried", || {
        let n = sqs.calls_of("DeleteMessageBatch").len();
        async move { n >= 2 }
    })
    .await?;
    within(SECS(10), "counted deleted once", || async {
        w.metric("qc_worker_messages_deleted_total").await == Some(1.0)
    })
    .await?;
    let deletes = sqs.handles_in("DeleteMessageBatch", None);
    ensure(
        deletes.iter().all(|h| h == "rh-0") && deletes.len() == 2,
        format!("sent twice, confirmed the second time: {deletes:?}"),
    )?;
    let failures = w.metric("qc_worker_delete_failures_total").await;
    ensure(
        failures == Some(0.0),
        format!("delete failures {failures:?}"),
    )?;
    stop(w).await
}

/// A release the answer does not confirm (an unknown id, an entry left out) is sent again.
async fn release_failed_odd_ids() -> Result<(), String> {
    let sqs = SqsScript::start(|c: &SqsCall| match (c.action.as_str(), c.nth) {
        ("ReceiveMessage", 0) => messages(0..3),
        ("ChangeMessageVisibilityBatch", 0) => Sqs::Json(serde_json::json!({
            "Successful": [],
            "Failed": [failed_entry("7"), failed_entry("0"), failed_entry("0")],
        })),
        _ => Sqs::Usual,
    })
    .await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let w = odd_worker(&sqs, &h.url, &[]);
    within(
        SECS(30),
        "both extra messages released and confirmed",
        || async { w.metric("qc_worker_messages_released_total").await == Some(2.0) },
    )
    .await?;
    let released = sqs.handles_in("ChangeMessageVisibilityBatch", Some(0));
    for rh in ["rh-1", "rh-2"] {
        let n = released.iter().filter(|r| *r == rh).count();
        ensure(
            n == 2,
            format!("{rh} sent again after an answer that did not confirm it: {released:?}"),
        )?;
    }
    stop(w).await
}

/// An empty 200 confirms nothing: the delete is sent again until an answer lists it.
async fn empty_200_to_a_delete() -> Result<(), String> {
    let sqs = SqsScript::start(|c: &SqsCall| match (c.action.as_str(), c.nth) {
        ("ReceiveMessage", 0) => messages(0..1),
        ("DeleteMessageBatch", 0) => Sqs::Raw(""),
        ("DeleteMessageBatch", 1) => Sqs::Raw("{}"),
        _ => Sqs::Usual,
    })
    .await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let w = odd_worker(&sqs, &h.url, &[]);
    within(SECS(30), "the delete confirmed", || {
        let n = sqs.calls_of("DeleteMessageBatch").len();
        async move { n >= 3 }
    })
    .await?;
    within(SECS(10), "counted deleted once", || async {
        w.metric("qc_worker_messages_deleted_total").await == Some(1.0)
    })
    .await?;
    let deletes = sqs.handles_in("DeleteMessageBatch", None);
    ensure(
        deletes == ["rh-0", "rh-0", "rh-0"],
        format!("sent until an answer listed it: {deletes:?}"),
    )?;
    stop(w).await
}

/// While a receive hangs the probes answer, and SIGTERM ends the worker within its shutdown budget.
async fn receive_hangs() -> Result<(), String> {
    let sqs = SqsScript::start(|c: &SqsCall| match (c.action.as_str(), c.nth) {
        ("ReceiveMessage", 0) => Sqs::After(SECS(11), Box::new(messages(0..1))),
        _ => Sqs::Usual,
    })
    .await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w = odd_worker(&sqs, &h.url, &["--shutdown-timeout", "3s"]);
    within(SECS(20), "the receive sent", || {
        let n = sqs.calls_of("ReceiveMessage").len();
        async move { n >= 1 }
    })
    .await?;
    tokio::time::sleep(SECS(2)).await;
    for path in ["/healthz", "/metrics"] {
        let got = tokio::time::timeout(SECS(1), w.get(path)).await;
        ensure(
            matches!(got, Ok(Some((200, _)))),
            format!("{path} answers within 1 s during the hang: {got:?}"),
        )?;
    }
    let asked = std::time::Instant::now();
    w.signal("TERM");
    let status = w.wait_exit(SECS(20)).await;
    let took = asked.elapsed();
    ensure(status.success(), format!("clean exit: {status:?}"))?;
    ensure(
        took < SECS(5),
        format!("exited within the 3 s shutdown budget (+2 s), not after the hang: {took:?}"),
    )?;
    ensure(
        h.calls().is_empty(),
        "nothing handled from a receive cut short".into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_sqs_answer_rows_end_safely_and_lose_nothing() {
    let rows = sqs_rows();
    let mut failures = Vec::new();
    for r in &rows {
        if let Err(e) = (r.run)().await {
            failures.push(format!("{} (scripted: {}): {e}", r.name, r.why_scripted));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

/// #29 item 6: `--help` shows where each flag's environment variable is set, never the value of
/// one that holds a secret: a redis URL carries its password.
#[test]
fn help_never_prints_the_redis_password_from_the_environment() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .arg("--help")
        .env("QC_REDIS_URL", "redis://:s3cret-pass@redis.internal:6379/0")
        .env("QC_CONCURRENCY", "7")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("QC_REDIS_URL"), "{help}");
    assert!(
        !help.contains("s3cret-pass"),
        "the password is printed:\n{help}"
    );
    // Other flags still show their environment value (the display is off for secrets only).
    assert!(help.contains("QC_CONCURRENCY=7"), "{help}");
}

/// #29 item 7: durations at the far end of what the flags parse (thousands of years) on every
/// duration flag without a documented bound: nothing panics or overflows, the worker handles what
/// it can, backs off what failed (SQS's 12 hours at most), and a SIGTERM mid-call still ends with
/// exit 0, nothing cut and nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extreme_durations_neither_panic_nor_lose_a_message() {
    let q = TestQueue::new("extreme-durations", 30, 5, false).await;
    let bodies = numbered(6);
    q.send_all(&bodies, |_| String::new()).await;
    // {"n":0} fails (a retry at the huge backoff, capped at 12h); the rest succeed after 1 s.
    let h = HttpHandler::start(|c| {
        if String::from_utf8_lossy(&c.body).contains("\"n\":0") {
            Reply {
                status: 500,
                delay: Duration::ZERO,
                retry_after: None,
                body: Vec::new(),
            }
        } else {
            Reply::ok(SECS(1))
        }
    })
    .await;
    let huge = "5000000000000h";
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--concurrency",
        "2",
        "--shutdown-timeout",
        huge,
        "--heartbeat-interval",
        huge,
        "--retry-base",
        huge,
        "--retry-max",
        huge,
        "--idempotency-store",
        "memory",
        "--idempotency-ttl",
        huge,
        "--breaker",
        "false",
    ]));
    eventually(
        SECS(30),
        "the failing message and two others called",
        || async { h.calls().len() >= 3 },
    )
    .await;
    w.signal("TERM");
    let status = w.wait_exit(SECS(20)).await;
    assert!(status.success(), "{status}");
    let calls = h.calls();
    assert!(calls.iter().all(|c| c.finished.is_some()), "no call cut");
    let handled: Vec<String> = calls
        .iter()
        .filter(|c| c.status == 200)
        .map(|c| String::from_utf8_lossy(&c.body).to_string())
        .collect();
    let (visible, in_flight, _) = q.counts().await;
    eprintln!(
        "extreme durations: {} calls, {} handled; visible {visible}, in flight {in_flight}",
        calls.len(),
        handled.len()
    );
    // The failed one is hidden for its (capped) backoff; the rest are handled or back, visible.
    assert_eq!(
        in_flight, 1,
        "only the failed message is hidden, for its retry"
    );
    assert_eq!(
        handled.len() as u64 + visible + in_flight,
        6,
        "nothing lost"
    );
}
