//! A scripted SQS stand-in for answers no real SQS-compatible server gives on request: it speaks the
//! JSON protocol `aws-sdk-sqs` uses (`POST /`, `x-amz-target: AmazonSQS.<Action>`, JSON bodies) on
//! loopback, answers each call from a script (per action and call number), and records every call.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One call the stand-in received: the action (`ReceiveMessage`), its JSON body, and its number
/// among the calls of that action (from 0).
#[derive(Clone, Debug)]
pub struct SqsCall {
    pub action: String,
    pub body: Value,
    pub nth: usize,
}

/// How the stand-in answers one call.
#[derive(Clone, Debug)]
pub enum Answer {
    /// HTTP 200 with this JSON body.
    Json(Value),
    /// HTTP 200 with exactly these bytes as the body (e.g. empty).
    Raw(&'static str),
    /// Waits this long, then answers.
    After(Duration, Box<Answer>),
    /// The usual answer of a well-behaved SQS (see [`usual`]).
    Usual,
}

type Script = Arc<dyn Fn(&SqsCall) -> Answer + Send + Sync>;

pub struct SqsScript {
    pub endpoint: String,
    pub queue_url: String,
    calls: Arc<Mutex<Vec<SqsCall>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl SqsScript {
    pub async fn start(script: impl Fn(&SqsCall) -> Answer + Send + Sync + 'static) -> SqsScript {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let queue_url = format!("{endpoint}/000000000000/odd");
        let calls: Arc<Mutex<Vec<SqsCall>>> = Arc::default();
        let script: Script = Arc::new(script);
        let log = calls.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(serve(stream, script.clone(), log.clone()));
            }
        });
        SqsScript {
            endpoint,
            queue_url,
            calls,
            accept,
        }
    }

    pub fn calls(&self) -> Vec<SqsCall> {
        self.calls.lock().unwrap().clone()
    }

    pub fn calls_of(&self, action: &str) -> Vec<SqsCall> {
        self.calls()
            .into_iter()
            .filter(|c| c.action == action)
            .collect()
    }

    /// Receipt handles sent in batch entries of `action` (with `visibility` for the visibility batch).
    pub fn handles_in(&self, action: &str, visibility: Option<i64>) -> Vec<String> {
        let mut out = Vec::new();
        for c in self.calls_of(action) {
            for e in c.body["Entries"].as_array().cloned().unwrap_or_default() {
                if visibility.is_none_or(|v| e["VisibilityTimeout"].as_i64() == Some(v)) {
                    out.push(e["ReceiptHandle"].as_str().unwrap_or_default().to_string());
                }
            }
        }
        out
    }
}

impl Drop for SqsScript {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A message as ReceiveMessage returns it: id `m-<n>`, receipt handle `rh-<n>`, body `b-<n>`.
pub fn message(n: usize) -> Value {
    json!({
        "MessageId": format!("m-{n}"),
        "ReceiptHandle": format!("rh-{n}"),
        "Body": format!("b-{n}"),
        "Attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "1700000000000"},
    })
}

pub fn messages(range: std::ops::Range<usize>) -> Answer {
    Answer::Json(json!({"Messages": range.map(message).collect::<Vec<_>>()}))
}

/// What a well-behaved SQS answers: queue attributes (VisibilityTimeout 30), an empty receive after
/// the long poll (at most 1 s here), every batch entry successful.
pub fn usual(call: &SqsCall) -> Answer {
    match call.action.as_str() {
        "GetQueueAttributes" => Answer::Json(json!({"Attributes": {
            "VisibilityTimeout": "30",
            "QueueArn": "arn:aws:sqs:us-east-1:000000000000:odd",
        }})),
        "ReceiveMessage" => {
            let wait = call.body["WaitTimeSeconds"].as_u64().unwrap_or(0).min(1);
            Answer::After(Duration::from_secs(wait), Box::new(Answer::Json(json!({}))))
        }
        "DeleteMessageBatch" | "ChangeMessageVisibilityBatch" => {
            let ok: Vec<Value> = call.body["Entries"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|e| json!({"Id": e["Id"]}))
                .collect();
            Answer::Json(json!({"Successful": ok, "Failed": []}))
        }
        _ => Answer::Json(json!({})),
    }
}

async fn serve(mut s: tokio::net::TcpStream, script: Script, log: Arc<Mutex<Vec<SqsCall>>>) {
    let mut buf = Vec::new();
    loop {
        let Some((head, body)) = read_request(&mut s, &mut buf).await else {
            return;
        };
        let action = head
            .lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.trim()
                    .eq_ignore_ascii_case("x-amz-target")
                    .then(|| v.trim().trim_start_matches("AmazonSQS.").to_string())
            })
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let call = {
            let mut log = log.lock().unwrap();
            let nth = log.iter().filter(|c| c.action == action).count();
            let call = SqsCall { action, body, nth };
            log.push(call.clone());
            call
        };
        let mut answer = script(&call);
        let text = loop {
            match answer {
                Answer::Json(v) => break v.to_string(),
                Answer::Raw(r) => break r.to_string(),
                Answer::After(d, next) => {
                    tokio::time::sleep(d).await;
                    answer = *next;
                }
                Answer::Usual => answer = usual(&call),
            }
        };
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\nx-amzn-requestid: scripted\r\ncontent-length: {}\r\n\r\n{text}",
            text.len()
        );
        if s.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// One request (head, Content-Length body) after what `buf` holds; None at EOF.
async fn read_request(
    s: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> Option<(String, Vec<u8>)> {
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len: usize = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = buf[head_end..head_end + len].to_vec();
    buf.drain(..head_end + len);
    Some((head, body))
}
