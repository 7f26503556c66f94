//! HTTP handler: POST each message in CloudEvents binary mode to the handler container on localhost.
//! The body goes out as the exact bytes SQS returned; metadata travels in `ce-*` and `x-sqs-*` headers.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{HandlerError, QueueContext, Verdict, rfc3339_millis, verdict_for_status};
use crate::worker::sqs::Message;

/// `ce-type` of every event the worker sends.
pub const CE_TYPE: &str = "dev.consumers.sqs.message";

pub struct HttpHandler {
    uri: Uri,
    authority: String,
    client: Client<HttpConnector, Full<Bytes>>,
    source: HeaderValue,
    queue_url: HeaderValue,
}

impl HttpHandler {
    pub fn new(url: &str, queue: &QueueContext, pool: usize) -> Result<Self, HandlerError> {
        let err = |reason: &str| HandlerError::ParseHttpUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let uri: Uri = url.parse().map_err(|_| err("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(err(
                "only http:// is supported (the handler runs in the same pod)",
            ));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| err("no host"))?
            .as_str()
            .to_string();
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(pool)
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        let source = if queue.arn.is_empty() {
            &queue.url
        } else {
            &queue.arn
        };
        Ok(HttpHandler {
            uri,
            authority,
            client,
            source: header_value(source),
            queue_url: header_value(&queue.url),
        })
    }

    /// `ce-source` is the queue ARN; the URL stands in until the ARN is known.
    pub fn set_queue_arn(&mut self, arn: &str) {
        if !arn.is_empty() {
            self.source = header_value(arn);
        }
    }

    pub fn url(&self) -> String {
        self.uri.to_string()
    }

    pub async fn handle(&self, msg: &Message) -> Verdict {
        let req = self.request(msg);
        let resp = match self.client.request(req).await {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                return Verdict::Unreachable(format!("cannot connect to {}: {e}", self.uri));
            }
            Err(e) => {
                return Verdict::Transient {
                    reason: format!("no answer from {}: {e}", self.uri),
                    retry_after: None,
                };
            }
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // Drain the body so the connection goes back to the pool.
        let mut body = resp.into_body();
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                break;
            }
        }
        verdict_for_status(status, retry_after.as_deref(), SystemTime::now())
    }

    fn request(&self, msg: &Message) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(msg.body.clone()));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.uri.clone();
        let h = req.headers_mut();
        h.insert("ce-specversion", HeaderValue::from_static("1.0"));
        h.insert("ce-id", header_value(&msg.id));
        h.insert("ce-source", self.source.clone());
        h.insert("ce-type", HeaderValue::from_static(CE_TYPE));
        if let Some(t) = msg.sent_timestamp {
            h.insert("ce-time", header_value(&rfc3339_millis(t)));
        }
        h.insert("ce-sqsreceivecount", HeaderValue::from(msg.receive_count));
        if let Some(g) = &msg.group_id {
            h.insert("ce-sqsgroupid", header_value(g));
        }
        if let Some(d) = &msg.deduplication_id {
            h.insert("ce-sqsdeduplicationid", header_value(d));
        }
        if let Some(s) = &msg.sequence_number {
            h.insert("ce-sqssequencenumber", header_value(s));
        }
        h.insert("x-sqs-queue-url", self.queue_url.clone());
        let mut content_type = None;
        for (name, value) in &msg.attributes {
            let Ok(header) = HeaderName::from_bytes(format!("x-sqs-attribute-{name}").as_bytes())
            else {
                continue;
            };
            let text = match (&value.string, &value.binary) {
                (Some(s), _) => s.clone(),
                (None, Some(b)) => base64_encode(b),
                (None, None) => continue,
            };
            if name.eq_ignore_ascii_case("content-type") {
                content_type = Some(text.clone());
            }
            h.append(header, header_value(&text));
        }
        let content_type = content_type.unwrap_or_else(|| guess_content_type(&msg.body).into());
        h.insert(CONTENT_TYPE, header_value(&content_type));
        req
    }

    /// Waits until the handler's port accepts a TCP connection, logging while it does not.
    pub async fn wait_reachable(&self) {
        let mut delay = Duration::from_millis(50);
        let started = std::time::Instant::now();
        let mut warned = false;
        loop {
            match tokio::net::TcpStream::connect(&self.authority).await {
                Ok(_) => {
                    if warned {
                        tracing::info!(handler = %self.uri, "handler reachable");
                    }
                    return;
                }
                Err(e) => {
                    if !warned && started.elapsed() > Duration::from_secs(2) {
                        tracing::warn!(handler = %self.uri, error = %e, "waiting for the handler to accept connections; not receiving meanwhile");
                        warned = true;
                    }
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }
}

/// A header value for arbitrary text: printable ASCII as is, anything else percent-encoded as UTF-8
/// (the CloudEvents HTTP binding's rule for `ce-*` values).
fn header_value(s: &str) -> HeaderValue {
    let plain = s.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'%');
    if plain && let Ok(v) = HeaderValue::from_str(s) {
        return v;
    }
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn guess_content_type(body: &[u8]) -> &'static str {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') | Some(b'[') => "application/json",
        _ => "text/plain; charset=utf-8",
    }
}

fn base64_encode(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_percent_encode_what_http_cannot_carry() {
        assert_eq!(header_value("plain text").to_str().unwrap(), "plain text");
        assert_eq!(header_value("100%").to_str().unwrap(), "100%25");
        assert_eq!(header_value("é\n").to_str().unwrap(), "%C3%A9%0A");
    }

    #[test]
    fn content_type_guess() {
        assert_eq!(guess_content_type(b"  {\"a\":1}"), "application/json");
        assert_eq!(guess_content_type(b"[1]"), "application/json");
        assert_eq!(guess_content_type(b"hello"), "text/plain; charset=utf-8");
        assert_eq!(guess_content_type(b""), "text/plain; charset=utf-8");
    }
}
