//! HTTP handler: POST each message in CloudEvents binary mode to the handler container on localhost.
//! The body goes out as the exact bytes SQS returned; metadata travels in `ce-*` and `x-sqs-*` headers.

use std::io::Write as _;
use std::time::{Duration, SystemTime};

use hyper::Uri;

use super::batch::{self, BatchVerdict};
use super::{HandlerError, QueueContext, Verdict, rfc3339_millis, verdict_for_status};
use crate::worker::http1::{Pool, WireError, connect_authority};
use crate::worker::sqs::Message;
use crate::worker::trace::TraceContext;

/// `ce-type` of every event the worker sends.
pub const CE_TYPE: &str = "dev.consumers.sqs.message";

/// Names the message attributes left out of a request because the head would have outgrown its cap.
pub const OMITTED_HEADER: &str = "x-qc-omitted-attributes";
/// The request head's default cap: nginx's and most frameworks' limit for one header buffer.
pub const DEFAULT_MAX_HEAD: usize = 8 * 1024;

/// Idle connections to the handler are closed after this: under the 5 s keep-alive timeout of Node's
/// http server and uvicorn, so the worker drops a connection before the handler does and never
/// writes a request into one the handler is closing (such a request is not sent again).
const POOL_IDLE: Duration = Duration::from_secs(4);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub struct HttpHandler {
    uri: Uri,
    authority: String,
    /// `POST <path> HTTP/1.1` and the Host header: the same for every request.
    request_line: Vec<u8>,
    pool: Pool,
    source: String,
    queue_url: String,
    /// The request head never exceeds this many bytes (unless the fixed headers alone do).
    max_head: usize,
}

impl HttpHandler {
    pub fn new(
        url: &str,
        queue: &QueueContext,
        pool: usize,
        max_head: usize,
    ) -> Result<Self, HandlerError> {
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
        let host = uri.host().ok_or_else(|| err("no host"))?;
        let authority = connect_authority(&uri).ok_or_else(|| err("no host"))?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let mut request_line = Vec::with_capacity(64);
        // The Host header names the port only when it is not the default, like every HTTP client.
        let host_header = uri.authority().map_or(host, |a| a.as_str());
        let _ = write!(
            request_line,
            "POST {path} HTTP/1.1\r\nhost: {host_header}\r\n"
        );
        let source = if queue.arn.is_empty() {
            &queue.url
        } else {
            &queue.arn
        };
        Ok(HttpHandler {
            pool: Pool::new(authority.clone(), pool, POOL_IDLE, CONNECT_TIMEOUT),
            uri,
            authority,
            request_line,
            source: source.clone(),
            queue_url: queue.url.clone(),
            max_head,
        })
    }

    /// `ce-source` is the queue ARN; the URL stands in until the ARN is known.
    pub fn set_queue_arn(&mut self, arn: &str) {
        if !arn.is_empty() {
            self.source = arn.to_string();
        }
    }

    pub fn url(&self) -> String {
        self.uri.to_string()
    }

    pub async fn handle(&self, msg: &Message) -> Verdict {
        let head = self.head(msg);
        match self.pool.send(&head, &msg.body, false).await {
            Ok(answer) => verdict_for_status(
                answer.status,
                answer.retry_after.as_deref(),
                SystemTime::now(),
            ),
            Err(e @ WireError::Connect { .. }) => {
                Verdict::Unreachable(format!("{e} ({})", self.uri))
            }
            Err(e) => Verdict::Transient {
                reason: format!("no answer from {}: {e}", self.uri),
                retry_after: None,
                cause: super::Cause::Downstream,
            },
        }
    }

    /// Batch mode: POSTs the messages as a JSON array of structured CloudEvents (the batched content
    /// mode) and reads the answer's `batchItemFailures`.
    pub async fn handle_batch(&self, msgs: &[&Message]) -> BatchVerdict {
        let body = batch::http_body(msgs, &self.source);
        let mut head = Vec::with_capacity(256 + self.queue_url.len());
        head.extend_from_slice(&self.request_line);
        let _ = write!(head, "content-length: {}\r\n", body.len());
        let _ = write!(head, "content-type: {}\r\n", batch::BATCH_CONTENT_TYPE);
        header(&mut head, "x-sqs-queue-url", &self.queue_url);
        let _ = write!(head, "x-qc-batch-size: {}\r\n\r\n", msgs.len());
        match self.pool.send(&head, &body, true).await {
            Ok(answer) if (200..300).contains(&answer.status) => {
                let ids: Vec<&str> = msgs.iter().map(|m| m.id.as_str()).collect();
                batch::answered(
                    batch::Answer::HttpBody(&answer.body),
                    &ids,
                    &format!("{} (HTTP {})", self.uri, answer.status),
                )
            }
            Ok(answer) => BatchVerdict::whole(verdict_for_status(
                answer.status,
                answer.retry_after.as_deref(),
                SystemTime::now(),
            )),
            Err(e @ WireError::Connect { .. }) => {
                BatchVerdict::Whole(Verdict::Unreachable(format!("{e} ({})", self.uri)))
            }
            Err(e) => BatchVerdict::Whole(Verdict::Transient {
                reason: format!("no answer from {}: {e}", self.uri),
                retry_after: None,
                cause: super::Cause::Downstream,
            }),
        }
    }

    /// The request head: the body goes out as the exact bytes SQS returned, the metadata in
    /// CloudEvents binary-mode `ce-*` headers and `x-sqs-*` headers.
    pub fn head(&self, msg: &Message) -> Vec<u8> {
        let mut h = Vec::with_capacity(512 + self.source.len() + self.queue_url.len());
        h.extend_from_slice(&self.request_line);
        let _ = write!(h, "content-length: {}\r\n", msg.body.len());
        h.extend_from_slice(b"ce-specversion: 1.0\r\n");
        header(&mut h, "ce-id", &msg.id);
        header(&mut h, "ce-source", &self.source);
        header(&mut h, "ce-type", CE_TYPE);
        if let Some(t) = msg.sent_timestamp.and_then(rfc3339_millis) {
            header(&mut h, "ce-time", &t);
        }
        let _ = write!(h, "ce-sqsreceivecount: {}\r\n", msg.receive_count);
        if let Some(g) = &msg.group_id {
            header(&mut h, "ce-sqsgroupid", g);
        }
        if let Some(d) = &msg.deduplication_id {
            header(&mut h, "ce-sqsdeduplicationid", d);
        }
        if let Some(s) = &msg.sequence_number {
            header(&mut h, "ce-sqssequencenumber", s);
        }
        header(&mut h, "x-sqs-queue-url", &self.queue_url);
        // Trace context (W3C Trace Context headers, and X-Ray's own): only well-formed values.
        let trace = TraceContext::of_message(msg);
        // Validated printable ASCII (trace.rs), sent as is: these are not CloudEvents attributes.
        for (name, value) in [
            ("traceparent", &trace.traceparent),
            ("tracestate", &trace.tracestate),
            ("x-amzn-trace-id", &trace.xray),
        ] {
            if let Some(v) = value {
                let _ = write!(h, "{name}: {v}\r\n");
            }
        }
        let mut content_type = None;
        let mut lines: Vec<(&str, Vec<u8>)> = Vec::with_capacity(msg.attributes.len());
        // Header names are case-insensitive: of names equal after lowercasing, the first in the
        // message's order (SQS names sorted by byte, so `OrderId` before `orderid`) is sent, the
        // others are named in the omitted header.
        let mut collided: Vec<&str> = Vec::new();
        for (i, (name, value)) in msg.attributes.iter().enumerate() {
            if name.is_empty() || !name.bytes().all(is_token) {
                continue;
            }
            if msg.attributes[..i]
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name) && n.bytes().all(is_token))
            {
                collided.push(name);
                continue;
            }
            let text = match (&value.string, &value.binary) {
                (Some(s), _) => std::borrow::Cow::Borrowed(s.as_str()),
                (None, Some(b)) => std::borrow::Cow::Owned(base64_encode(b)),
                (None, None) => continue,
            };
            // Content-Type is a plain HTTP header (the CloudEvents binding maps `datacontenttype`
            // onto it, not onto a `ce-` header), so it is sent as written: only printable ASCII
            // qualifies (no CR/LF can reach the head); anything else falls back to the guess.
            if name.eq_ignore_ascii_case("content-type")
                && text.len() <= MAX_CONTENT_TYPE
                && text.bytes().all(|b| (0x20..0x7f).contains(&b))
            {
                content_type = Some(text.clone());
            }
            let mut line = Vec::with_capacity(20 + name.len() + text.len());
            line.extend_from_slice(b"x-sqs-attribute-");
            line.extend(name.bytes().map(|b| b.to_ascii_lowercase()));
            line.extend_from_slice(b": ");
            value_into(&mut line, &text);
            line.extend_from_slice(b"\r\n");
            lines.push((name.as_str(), line));
        }
        let content_type = content_type.unwrap_or_else(|| guess_content_type(&msg.body).into());
        h.extend_from_slice(b"content-type: ");
        h.extend_from_slice(content_type.as_bytes());
        h.extend_from_slice(b"\r\n");
        let omitted = fit_attributes(
            &mut lines,
            &collided,
            self.max_head.saturating_sub(h.len() + 2),
        );
        for (_, line) in &lines {
            h.extend_from_slice(line);
        }
        if !omitted.is_empty() {
            tracing::warn!(message_id = %msg.id, omitted = %omitted, max_request_head = self.max_head, "message attributes left out of the handler request: the request head would exceed its cap (--max-request-head), or their names equal an earlier one's after lowercasing");
            header(&mut h, OMITTED_HEADER, &omitted);
        }
        h.extend_from_slice(b"\r\n");
        h
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

/// A Content-Type attribute longer than this is sent as an attribute only (if it fits), not as the type.
const MAX_CONTENT_TYPE: usize = 256;

/// Keeps the attribute header lines that fit in `budget` bytes together with the header naming the
/// ones left out, and returns those names (comma-separated: `already` omitted ones first, then the
/// rest in message order; empty if none).
/// Attributes are kept in message order while they fit; if the omitted-names header then does not fit,
/// the largest kept lines give way until it does.
fn fit_attributes(lines: &mut Vec<(&str, Vec<u8>)>, already: &[&str], budget: usize) -> String {
    let total: usize = lines.iter().map(|(_, l)| l.len()).sum();
    if already.is_empty() && total <= budget {
        return String::new();
    }
    let mut keep = vec![false; lines.len()];
    let mut used = 0;
    for (i, (_, line)) in lines.iter().enumerate() {
        if used + line.len() <= budget {
            keep[i] = true;
            used += line.len();
        }
    }
    let names = |keep: &[bool]| {
        already
            .iter()
            .copied()
            .chain(
                lines
                    .iter()
                    .zip(keep)
                    .filter(|(_, k)| !**k)
                    .map(|((n, _), _)| *n),
            )
            .collect::<Vec<_>>()
            .join(",")
    };
    let line_len = |names: &str| OMITTED_HEADER.len() + 4 + names.len();
    loop {
        let omitted = names(&keep);
        if used + line_len(&omitted) <= budget {
            break;
        }
        let largest = lines
            .iter()
            .enumerate()
            .filter(|(i, _)| keep[*i])
            .max_by_key(|(_, (_, l))| l.len())
            .map(|(i, _)| i);
        match largest {
            Some(i) => {
                keep[i] = false;
                used -= lines[i].1.len();
            }
            // Not even the names fit: they go out anyway, the fixed headers alone are over the cap.
            None => break,
        }
    }
    let omitted = names(&keep);
    let mut k = keep.iter();
    lines.retain(|_| k.next().copied().unwrap_or(false));
    omitted
}

fn header(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    value_into(out, value);
    out.extend_from_slice(b"\r\n");
}

/// A header value for arbitrary text, encoded as the CloudEvents HTTP protocol binding requires of
/// `ce-*` values (section 3.1.3.2): space, `"`, `%` and every byte outside printable ASCII (controls,
/// DEL, each UTF-8 byte of a non-ASCII character) percent-encoded with upper-case hex; everything
/// else as is. The same rule for every header the worker fills with message data.
fn value_into(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let plain = |b: u8| (0x21..0x7f).contains(&b) && b != b'%' && b != b'"';
    let bytes = s.as_bytes();
    if bytes.iter().all(|&b| plain(b)) {
        // The usual case (ids, ARNs, URLs, timestamps): one copy.
        out.extend_from_slice(bytes);
        return;
    }
    for &b in bytes {
        if plain(b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

/// An HTTP token character (RFC 9110 `tchar`): what a header name may hold.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn guess_content_type(body: &[u8]) -> &'static str {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{' | b'[') => "application/json",
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

    fn value(s: &str) -> String {
        let mut out = Vec::new();
        value_into(&mut out, s);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn header_values_percent_encode_what_http_cannot_carry() {
        assert_eq!(
            value("plain-text_1.2:3/4?a=b&c"),
            "plain-text_1.2:3/4?a=b&c"
        );
        assert_eq!(value("plain text"), "plain%20text");
        assert_eq!(value("say \"hi\""), "say%20%22hi%22");
        assert_eq!(value("100%"), "100%25");
        assert_eq!(value("é\n"), "%C3%A9%0A");
        assert_eq!(value("\u{1}\t\u{7f}€"), "%01%09%7F%E2%82%AC");
        assert_eq!(value(" padded "), "%20padded%20");
        assert_eq!(value(""), "");
    }

    #[test]
    fn the_head_carries_cloudevents_and_sqs_headers_and_nothing_unsafe() {
        use crate::worker::sqs::AttributeValue;
        let queue = QueueContext {
            url: "http://q/1/orders".into(),
            arn: "arn:aws:sqs:us-east-1:1:orders".into(),
        };
        let h = HttpHandler::new(
            "http://127.0.0.1:8080/messages?x=1",
            &queue,
            4,
            DEFAULT_MAX_HEAD,
        )
        .unwrap();
        let attr = AttributeValue::string;
        let msg = Message {
            receive_count: 3,
            group_id: Some("g\r\nx-evil: 1".into()),
            sent_timestamp: Some(951_782_400_123),
            first_receive_timestamp: None,
            attributes: vec![
                ("Content-Type".into(), attr("application/xml")),
                ("OrderId".into(), attr(" o-77")),
                ("bad name".into(), attr("dropped")),
            ],
            ..Message::test(b"<xml/>")
        };
        let head = String::from_utf8(h.head(&msg)).unwrap();
        let lines: Vec<&str> = head.split("\r\n").collect();
        assert_eq!(lines[0], "POST /messages?x=1 HTTP/1.1");
        assert!(head.ends_with("\r\n\r\n"));
        for want in [
            "host: 127.0.0.1:8080",
            "content-length: 6",
            "ce-specversion: 1.0",
            "ce-id: m-1",
            "ce-source: arn:aws:sqs:us-east-1:1:orders",
            "ce-type: dev.consumers.sqs.message",
            "ce-time: 2000-02-29T00:00:00.123Z",
            "ce-sqsreceivecount: 3",
            "ce-sqsgroupid: g%0D%0Ax-evil:%201",
            "x-sqs-queue-url: http://q/1/orders",
            "x-sqs-attribute-content-type: application/xml",
            "x-sqs-attribute-orderid: %20o-77",
            "content-type: application/xml",
        ] {
            assert!(lines.contains(&want), "{want:?} in {head}");
        }
        assert!(
            !head.contains("dropped"),
            "a name that is no HTTP token is left out"
        );
        assert!(!lines.iter().any(|l| l.starts_with("x-evil")));
        // Content-Type is a plain HTTP header: its space is not percent-encoded, and a value with a
        // line break is never sent as the type (the guess from the body is).
        let mut text = msg.clone();
        text.body = bytes::Bytes::from_static(b"hello");
        text.attributes = vec![("Content-Type".into(), attr("text/x\r\nx-evil: 1"))];
        let head = String::from_utf8(h.head(&text)).unwrap();
        let lines: Vec<&str> = head.split("\r\n").collect();
        assert!(
            lines.contains(&"content-type: text/plain; charset=utf-8"),
            "{head}"
        );
        assert!(!lines.iter().any(|l| l.starts_with("x-evil")), "{head}");
    }

    #[test]
    fn attributes_that_do_not_fit_the_head_cap_are_left_out_and_named() {
        use crate::worker::sqs::AttributeValue;
        let queue = QueueContext {
            url: "http://q/1/orders".into(),
            arn: String::new(),
        };
        let attr = AttributeValue::string::<String>;
        let msg = |attributes| Message {
            attributes,
            ..Message::test(b"{}")
        };
        for cap in [1024, DEFAULT_MAX_HEAD, 64 * 1024] {
            let h = HttpHandler::new("http://127.0.0.1:8080/m", &queue, 1, cap).unwrap();
            let m = msg(vec![
                ("small".into(), attr("s".into())),
                ("big".into(), attr("x".repeat(20_000))),
                ("wide".into(), attr("é".repeat(500))),
                ("tail".into(), attr("t".into())),
            ]);
            let head = String::from_utf8(h.head(&m)).unwrap();
            assert!(head.len() <= cap, "{cap}: {} bytes", head.len());
            assert!(head.ends_with("\r\n\r\n"));
            assert!(head.contains("x-sqs-attribute-small: s\r\n"), "{cap}");
            assert!(head.contains("x-sqs-attribute-tail: t\r\n"), "{cap}");
            let omitted = head
                .lines()
                .find_map(|l| l.strip_prefix("x-qc-omitted-attributes: "));
            let expected = match cap {
                1024 => Some("big,wide"),
                DEFAULT_MAX_HEAD => Some("big"),
                _ => None,
            };
            assert_eq!(omitted, expected, "{cap}");
        }
        // Everything fits: no omitted header at all.
        let h = HttpHandler::new("http://127.0.0.1:8080/m", &queue, 1, DEFAULT_MAX_HEAD).unwrap();
        let head = String::from_utf8(h.head(&msg(vec![("a".into(), attr("1".into()))]))).unwrap();
        assert!(!head.contains(OMITTED_HEADER));
    }

    #[test]
    fn the_head_carries_the_trace_context_and_drops_malformed_headers() {
        use crate::worker::sqs::AttributeValue;
        let queue = QueueContext {
            url: "http://q/1/orders".into(),
            arn: String::new(),
        };
        let h = HttpHandler::new("http://127.0.0.1:8080/m", &queue, 1, DEFAULT_MAX_HEAD).unwrap();
        let attr = AttributeValue::string;
        let msg = |trace_header: Option<&str>, attributes| Message {
            attributes,
            trace_header: trace_header.map(str::to_string),
            handler_traceparent: None,
            ..Message::test(b"{}")
        };
        let xray = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        let line = |head: &str, name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_string))
        };
        // X-Ray only: converted, and passed on as is.
        let head = String::from_utf8(h.head(&msg(Some(xray), vec![]))).unwrap();
        assert_eq!(
            line(&head, "traceparent").as_deref(),
            Some("00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01")
        );
        assert_eq!(line(&head, "x-amzn-trace-id").as_deref(), Some(xray));
        assert_eq!(line(&head, "tracestate"), None);
        // A traceparent attribute wins over the X-Ray header; its tracestate goes along.
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let head = String::from_utf8(h.head(&msg(
            Some(xray),
            vec![
                ("traceparent".into(), attr(tp)),
                ("tracestate".into(), attr("congo=t61rcWkgMzE")),
            ],
        )))
        .unwrap();
        assert_eq!(line(&head, "traceparent").as_deref(), Some(tp));
        assert_eq!(
            line(&head, "tracestate").as_deref(),
            Some("congo=t61rcWkgMzE")
        );
        assert_eq!(line(&head, "x-amzn-trace-id").as_deref(), Some(xray));
        // Malformed: no trace headers at all, the rest of the head intact.
        let head = String::from_utf8(h.head(&msg(
            Some("Root=1-xyz;Parent=nothex"),
            vec![("traceparent".into(), attr("00-zz-11-01"))],
        )))
        .unwrap();
        assert_eq!(line(&head, "traceparent"), None);
        assert!(head.contains("ce-id: m-1\r\n") && head.ends_with("\r\n\r\n"));
        // Nothing that is not printable ASCII reaches a header line.
        let head = String::from_utf8(h.head(&msg(Some("Root=1-\r\nx-evil: 1"), vec![]))).unwrap();
        assert_eq!(line(&head, "x-amzn-trace-id"), None);
        assert!(!head.contains("x-evil"));
    }

    #[test]
    fn attribute_names_equal_after_lowercasing_send_the_first_and_name_the_rest() {
        use crate::worker::sqs::AttributeValue;
        let queue = QueueContext {
            url: "http://q/1/orders".into(),
            arn: String::new(),
        };
        let attr = AttributeValue::string;
        let msg = Message {
            // As SQS's names arrive: sorted by byte.
            attributes: vec![
                ("ORDERID".into(), attr("upper")),
                ("OrderId".into(), attr("camel")),
                ("other".into(), attr("o")),
                ("orderid".into(), attr("lower")),
            ],
            ..Message::test(b"{}")
        };
        for cap in [DEFAULT_MAX_HEAD, 64 * 1024] {
            let h = HttpHandler::new("http://127.0.0.1:8080/m", &queue, 1, cap).unwrap();
            let head = String::from_utf8(h.head(&msg)).unwrap();
            assert!(head.len() <= cap, "{cap}: {head}");
            let values: Vec<&str> = head
                .lines()
                .filter_map(|l| l.strip_prefix("x-sqs-attribute-orderid: "))
                .collect();
            assert_eq!(values, ["upper"], "{head}");
            let omitted = head
                .lines()
                .find_map(|l| l.strip_prefix("x-qc-omitted-attributes: "));
            assert_eq!(omitted, Some("OrderId,orderid"), "{cap}: {head}");
            assert!(head.contains("x-sqs-attribute-other: o\r\n"));
        }
    }

    /// #40: the exec handler's NUL-byte failure has no HTTP twin. Every byte an attribute (an SNS
    /// one, unwrapped) can hold is encoded, a name that is no header token is skipped, so the request
    /// is always built: no message makes the handler look unreachable.
    #[test]
    fn attribute_bytes_never_break_the_request() {
        use crate::worker::sqs::AttributeValue;
        let queue = QueueContext {
            url: "http://q/1/orders".into(),
            arn: String::new(),
        };
        let h = HttpHandler::new("http://127.0.0.1:8080/m", &queue, 1, DEFAULT_MAX_HEAD).unwrap();
        let every_byte: String =
            (0u8..=0x7f).map(char::from).collect::<String>() + "\u{80}\u{ffff}";
        let msg = Message {
            attributes: vec![
                ("tenant".into(), AttributeValue::string("a\0b")),
                ("all".into(), AttributeValue::string(every_byte)),
                ("nul\0name".into(), AttributeValue::string("x")),
                ("Content-Type".into(), AttributeValue::string("text/x\0y")),
            ],
            ..Message::test(b"{}")
        };
        let head = h.head(&msg);
        assert!(
            head.iter()
                .all(|&b| (0x20..0x7f).contains(&b) || b == b'\r' || b == b'\n'),
            "only printable ASCII and line ends"
        );
        let text = String::from_utf8(head).unwrap();
        assert_eq!(text.matches("\r\n\r\n").count(), 1, "{text}");
        assert!(text.ends_with("\r\n\r\n"));
        assert!(text.contains("x-sqs-attribute-tenant: a%00b\r\n"), "{text}");
        assert!(text.contains("x-sqs-attribute-all: %00%01"), "{text}");
        assert!(!text.contains("nul"), "a name that is no token is left out");
        assert!(
            text.contains("content-type: application/json\r\n"),
            "{text}"
        );
    }

    #[test]
    fn content_type_guess() {
        assert_eq!(guess_content_type(b"  {\"a\":1}"), "application/json");
        assert_eq!(guess_content_type(b"[1]"), "application/json");
        assert_eq!(guess_content_type(b"hello"), "text/plain; charset=utf-8");
        assert_eq!(guess_content_type(b""), "text/plain; charset=utf-8");
    }
}
