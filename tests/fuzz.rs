//! Fuzz targets (#29): the parsers and builders that take outside input, each with the properties
//! that must hold for any input, not only "no panic". `cargo test --test fuzz` runs every target for a
//! small budget; `bash scripts/fuzz [SECONDS]` runs them longer. A failure is kept in
//! `tests/data/fuzz/<target>/` and replayed first on every run (tests/common/fuzz.rs).
//!
//! | target | takes | from |
//! |---|---|---|
//! | `handler_answer` | the handler's HTTP answer, its status and Retry-After | the user's handler container |
//! | `batch_answer` | a batch handler's `batchItemFailures` answer (HTTP body or exec line) | the user's handler container |
//! | `scrape_exposition` | a worker's `/metrics` text | any pod a tenant runs |
//! | `cloudevents_head` | the request head built from a message | whoever sends to the queue |
//! | `durations`, `quantities` | spec strings | the manifest |
//! | `endpoint_allow_list` | `spec.queue.endpoint` and the operator's patterns | tenant, administrator |
//! | `manifest_loader` | manifests for `check` and `plan` | the user |

mod common;

use std::time::{Duration as StdDuration, SystemTime};

use common::fuzz::{exchange, fuzz, runtime};
use proptest::prelude::*;
use qc::api::Duration;
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// handler_answer

/// Retry-After as a handler may write it.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum RetryAfter {
    Seconds(u64),
    /// An HTTP date this many seconds after [`NOW`].
    DateIn(u32),
    Text(String),
}

/// Fixed "now" of the Retry-After dates (whole seconds, as HTTP dates are).
fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + StdDuration::from_hours(490_896)
}

impl RetryAfter {
    fn text(&self) -> String {
        match self {
            RetryAfter::Seconds(n) => n.to_string(),
            RetryAfter::DateIn(k) => {
                httpdate::fmt_http_date(now() + StdDuration::from_secs(u64::from(*k)))
            }
            RetryAfter::Text(t) => t.clone(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct AnswerCase {
    status: u16,
    retry_after: Option<RetryAfter>,
    headers: Vec<(String, String)>,
    /// 0: Content-Length, 1: chunked (cut at `cut`), 2: to the close.
    framing: u8,
    cut: usize,
    body: Vec<u8>,
    /// (position, byte) replacements applied to the whole answer.
    damage: Vec<(usize, u8)>,
}

impl AnswerCase {
    fn bytes(&self) -> Vec<u8> {
        let mut a = format!("HTTP/1.1 {} X\r\n", self.status).into_bytes();
        for (n, v) in &self.headers {
            a.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
        }
        if let Some(r) = &self.retry_after {
            a.extend_from_slice(format!("Retry-After: {}\r\n", r.text()).as_bytes());
        }
        match self.framing {
            0 => a.extend_from_slice(
                format!("Content-Length: {}\r\n\r\n", self.body.len()).as_bytes(),
            ),
            1 => a.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n"),
            _ => a.extend_from_slice(b"Connection: close\r\n\r\n"),
        }
        if self.framing == 1 {
            let at = self.cut % (self.body.len() + 1);
            for part in [&self.body[..at], &self.body[at..]] {
                if !part.is_empty() {
                    a.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                    a.extend_from_slice(part);
                    a.extend_from_slice(b"\r\n");
                }
            }
            a.extend_from_slice(b"0\r\n\r\n");
        } else {
            a.extend_from_slice(&self.body);
        }
        for (at, b) in &self.damage {
            let i = at % a.len();
            a[i] = *b;
        }
        a
    }
}

fn answer_case() -> impl Strategy<Value = AnswerCase> {
    let retry = prop_oneof![
        any::<u64>().prop_map(RetryAfter::Seconds),
        (0u32..1_000_000).prop_map(RetryAfter::DateIn),
        "[!-~]([ -~]{0,30}[!-~])?".prop_map(RetryAfter::Text),
    ];
    (
        (200u16..600).prop_filter("no body", |s| *s != 204 && *s != 304),
        proptest::option::of(retry),
        proptest::collection::vec(("x-[a-z]{1,10}", "[!-~]{0,20}"), 0..4),
        0u8..3,
        any::<usize>(),
        proptest::collection::vec(any::<u8>(), 0..600),
        prop_oneof![
            3 => Just(Vec::new()),
            1 => proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ],
    )
        .prop_map(
            |(status, retry_after, headers, framing, cut, body, damage)| AnswerCase {
                status,
                retry_after,
                headers,
                framing,
                cut,
                body,
                damage,
            },
        )
}

/// The handler's answer, as read by the worker's client and mapped to a verdict: an undamaged answer
/// reads back exactly (status, body, Retry-After) and maps as docs/handler-contract.md says; a damaged
/// one is a result within the client's limits, never a panic or a hang.
#[test]
fn handler_answer() {
    use qc::worker::handler::{Verdict, verdict_for_status};
    let rt = runtime();
    fuzz("handler_answer", answer_case(), |case| {
        let bytes = case.bytes();
        let out = rt.block_on(exchange(bytes.clone()));
        prop_assert_ne!(
            out.as_ref().err().map(String::as_str),
            Some("no result within 10s")
        );
        let Ok(answer) = out else {
            prop_assert!(
                !case.damage.is_empty(),
                "an undamaged answer failed: {out:?}"
            );
            return Ok(());
        };
        prop_assert!(answer.body.len() <= bytes.len());
        if case.damage.is_empty() {
            prop_assert_eq!(answer.status, case.status);
            prop_assert_eq!(&answer.body, &case.body);
            prop_assert_eq!(
                answer.retry_after.clone(),
                case.retry_after.as_ref().map(RetryAfter::text)
            );
        }
        let verdict = verdict_for_status(answer.status, answer.retry_after.as_deref(), now());
        match (answer.status, &verdict) {
            (200..=299, Verdict::Success) | (400 | 422, Verdict::Poison(_)) => {}
            (s, Verdict::Transient { retry_after, .. })
                if !(200..=299).contains(&s) && s != 400 && s != 422 =>
            {
                if retry_after.is_some() {
                    prop_assert!(s == 429 || s == 503, "Retry-After honoured on {s}");
                }
                if case.damage.is_empty() && (s == 429 || s == 503) {
                    match &case.retry_after {
                        Some(RetryAfter::Seconds(n)) => {
                            prop_assert_eq!(*retry_after, Some(StdDuration::from_secs(*n)));
                        }
                        Some(RetryAfter::DateIn(k)) => {
                            prop_assert_eq!(
                                *retry_after,
                                Some(StdDuration::from_secs(u64::from(*k)))
                            );
                        }
                        _ => {}
                    }
                }
            }
            (s, v) => prop_assert!(false, "HTTP {s} mapped to {v:?}"),
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// batch_answer

#[derive(Clone, Debug, Serialize, Deserialize)]
struct BatchCase {
    /// Message ids of the batch (distinct).
    ids: Vec<String>,
    /// Indices (into `ids`, modulo its length) of messages the batch holds a second time, at its
    /// end (SQS can hand one message to two receives).
    copies: Vec<usize>,
    /// Indices (into `ids`, modulo its length) the answer names as failed, in the answer's order,
    /// repeats included.
    failed: Vec<usize>,
    /// Other members in each entry and in the answer object.
    extra: Vec<(String, i64)>,
    /// Whitespace around the answer.
    pad: (String, String),
    /// (position, byte) replacements applied to the answer.
    damage: Vec<(usize, u8)>,
}

fn batch_case() -> impl Strategy<Value = BatchCase> {
    (
        proptest::collection::btree_set(
            prop_oneof![
                "[0-9a-f-]{1,36}",
                any::<String>().prop_filter("empty", |s| !s.is_empty())
            ],
            1..12,
        ),
        proptest::collection::vec(any::<usize>(), 0..14),
        proptest::collection::vec(any::<usize>(), 0..4),
        proptest::collection::vec(("[a-zA-Z]{1,10}", any::<i64>()), 0..3),
        ("[ \t\r\n]{0,3}", "[ \t\r\n]{0,3}"),
        prop_oneof![
            3 => Just(Vec::new()),
            1 => proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ],
    )
        .prop_map(|(ids, failed, copies, extra, pad, damage)| BatchCase {
            ids: ids.into_iter().collect(),
            copies,
            failed,
            extra,
            pad,
            damage,
        })
}

/// A batch handler's answer (Lambda's `ReportBatchItemFailures`) names exactly the items it lists,
/// in batch order, once each, whatever the entries' order, repeats and other members, and every
/// position of a listed id when the batch holds a message twice; an answer naming an id not in the
/// batch is refused with the reason; damaged bytes are an answer or a reason, never a panic, and an
/// answer is only ever positions of the batch. The same text as an exec answer file reads the same.
#[test]
fn batch_answer() {
    use qc::worker::handler::{Answer, AnswerFile, BatchVerdict, answered, parse_answer};
    fuzz("batch_answer", batch_case(), |c| {
        let distinct = c.ids.len();
        let ids: Vec<&str> = c
            .ids
            .iter()
            .map(String::as_str)
            .chain(c.copies.iter().map(|d| c.ids[d % distinct].as_str()))
            .collect();
        let entries: Vec<serde_json::Value> = c
            .failed
            .iter()
            .map(|i| {
                let mut e = serde_json::Map::new();
                for (k, v) in &c.extra {
                    e.insert(k.clone(), (*v).into());
                }
                e.insert("itemIdentifier".into(), ids[i % distinct].into());
                serde_json::Value::Object(e)
            })
            .collect();
        let mut answer = serde_json::Map::new();
        for (k, v) in &c.extra {
            answer.insert(format!("x{k}"), (*v).into());
        }
        answer.insert("batchItemFailures".into(), entries.into());
        let text = format!(
            "{}{}{}",
            c.pad.0,
            serde_json::Value::Object(answer),
            c.pad.1
        );
        let mut bytes = text.clone().into_bytes();
        for (at, b) in &c.damage {
            let i = at % bytes.len();
            bytes[i] = *b;
        }
        let out = parse_answer(&bytes, &ids);
        if let Ok(failed) = &out {
            prop_assert!(failed.windows(2).all(|w| w[0] < w[1]), "{failed:?}");
            prop_assert!(failed.iter().all(|i| *i < ids.len()), "{failed:?}");
        }
        if c.damage.is_empty() {
            let named: Vec<&str> = c.failed.iter().map(|i| ids[i % distinct]).collect();
            let want: Vec<usize> = (0..ids.len())
                .filter(|p| named.contains(&ids[*p]))
                .collect();
            prop_assert_eq!(&out, &Ok(want.clone()));
            prop_assert_eq!(
                answered(
                    Answer::ExecFile(AnswerFile::Written(text.as_bytes())),
                    &ids,
                    "h"
                ),
                BatchVerdict::Items { failed: want }
            );
            // An id the batch does not hold: refused, and the reason says which.
            let stranger = format!("{}-not-in-batch", ids.concat());
            let bad = format!(
                "{{\"batchItemFailures\":[{{\"itemIdentifier\":{}}}]}}",
                serde_json::Value::from(stranger.as_str())
            );
            let e = parse_answer(bad.as_bytes(), &ids);
            prop_assert!(
                e.as_ref().is_err_and(|e| e.contains("itemIdentifier")),
                "{e:?}"
            );
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// scrape_exposition

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Exposition {
    /// Finite bucket bounds in milliseconds and what each bucket adds.
    buckets: Vec<(u32, u32)>,
    /// Observations above the last finite bound.
    overflow: u32,
    sum_millis: u64,
    in_flight: Option<i32>,
    deleted: Option<u32>,
    breaker: Option<u8>,
    /// Other series between the worker's own (other metrics, comments).
    noise: Vec<String>,
    /// Rotates the series' lines (order does not matter to Prometheus).
    rotate: usize,
}

impl Exposition {
    fn bounds(&self) -> Vec<u32> {
        let mut b: Vec<u32> = self.buckets.iter().map(|b| b.0 + 1).collect();
        b.sort_unstable();
        b.dedup();
        b
    }

    fn text(&self) -> String {
        let name = qc::controller::workers::HANDLER_HISTOGRAM;
        let bounds = self.bounds();
        let mut lines = Vec::new();
        let mut cumulative = 0u64;
        for (i, b) in bounds.iter().enumerate() {
            cumulative += u64::from(self.buckets.get(i).map_or(0, |b| b.1));
            lines.push(format!(
                "{name}_bucket{{le=\"{}\"}} {cumulative}",
                f64::from(*b) / 1000.0
            ));
        }
        let count = cumulative + u64::from(self.overflow);
        lines.push(format!("{name}_bucket{{le=\"+Inf\"}} {count}"));
        lines.push(format!("{name}_sum {}", self.sum_millis as f64 / 1000.0));
        lines.push(format!("{name}_count {count}"));
        if let Some(n) = self.in_flight {
            lines.push(format!("{} {n}", qc::controller::workers::IN_FLIGHT_GAUGE));
        }
        if let Some(n) = self.deleted {
            lines.push(format!("{} {n}", qc::controller::workers::DELETED_COUNTER));
        }
        if let Some(n) = self.breaker {
            lines.push(format!("{} {n}", qc::controller::workers::BREAKER_GAUGE));
        }
        let r = self.rotate % lines.len();
        lines.rotate_left(r);
        let mut out = format!("# HELP {name} Handler latency.\n# TYPE {name} histogram\n");
        for (i, l) in lines.iter().enumerate() {
            out.push_str(l);
            out.push('\n');
            if let Some(n) = self.noise.get(i) {
                out.push_str(n);
                out.push('\n');
            }
        }
        out
    }
}

fn exposition() -> impl Strategy<Value = Exposition> {
    (
        proptest::collection::vec((0u32..100_000, 0u32..1000), 0..12),
        0u32..1000,
        0u64..10_000_000,
        proptest::option::of(-5i32..1000),
        proptest::option::of(any::<u32>()),
        proptest::option::of(0u8..4),
        proptest::collection::vec(
            prop_oneof![
                "# [ -~]{0,30}",
                "qc_worker_[a-z_]{1,20}(\\{[a-z]{1,5}=\"[a-z0-9]{0,5}\"\\})? [0-9]{1,6}",
                Just(String::new()),
            ],
            0..8,
        ),
        any::<usize>(),
    )
        .prop_map(
            |(buckets, overflow, sum_millis, in_flight, deleted, breaker, noise, rotate)| {
                Exposition {
                    buckets,
                    overflow,
                    sum_millis,
                    in_flight,
                    deleted,
                    breaker,
                    noise,
                    rotate,
                }
            },
        )
}

/// A number as a tenant's pod may write one where the worker writes a count or a bound.
fn odd_number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("NaN".to_string()),
        Just("+Inf".to_string()),
        Just("-Inf".to_string()),
        Just("-1".to_string()),
        Just("1e309".to_string()),
        Just("-0".to_string()),
        Just("18446744073709551616".to_string()),
        any::<f64>().prop_map(|v| v.to_string()),
        "[0-9a-z.+-]{0,8}",
    ]
}

/// What the controller keeps of a scrape is sane whatever the pod wrote: finite, ascending bounds,
/// counts that only grow, a finite non-negative sum; so the observed P99 and mean it derives are
/// finite numbers of seconds.
fn assert_sane(m: &qc::controller::workers::PodMetrics) -> Result<(), TestCaseError> {
    prop_assert!(m.bounds.iter().all(|b| b.is_finite() && *b >= 0.0), "{m:?}");
    prop_assert!(m.bounds.windows(2).all(|w| w[0] < w[1]), "{m:?}");
    prop_assert_eq!(m.bounds.len(), m.cumulative.len());
    prop_assert!(m.cumulative.windows(2).all(|w| w[0] <= w[1]), "{m:?}");
    prop_assert!(m.cumulative.last().is_none_or(|c| *c <= m.count), "{m:?}");
    prop_assert!(m.sum.is_finite() && m.sum >= 0.0, "{m:?}");
    Ok(())
}

/// A worker's exposition, with other series and comments between its lines in any order, parses to
/// exactly what it says; the same text with any of its numbers replaced by what a tenant's pod may
/// write parses to sane figures (or to none), never a panic.
#[test]
fn scrape_exposition() {
    use qc::controller::workers::{Breaker, Round, parse, stats};
    let damaged = (
        exposition(),
        proptest::collection::vec((any::<usize>(), odd_number()), 0..4),
    );
    fuzz("scrape_exposition", damaged, |(e, damage)| {
        let text = e.text();
        let m = parse(&text);
        prop_assert!(m.is_some(), "{text}");
        let m = m.unwrap();
        let bounds: Vec<f64> = e.bounds().iter().map(|b| f64::from(*b) / 1000.0).collect();
        prop_assert_eq!(&m.bounds[..], &bounds[..]);
        let mut c = 0u64;
        let cumulative: Vec<u64> = (0..bounds.len())
            .map(|i| {
                c += u64::from(e.buckets.get(i).map_or(0, |b| b.1));
                c
            })
            .collect();
        prop_assert_eq!(&m.cumulative, &cumulative);
        prop_assert_eq!(m.count, c + u64::from(e.overflow));
        prop_assert_eq!(m.sum.to_bits(), (e.sum_millis as f64 / 1000.0).to_bits());
        prop_assert_eq!(m.in_flight, i64::from(e.in_flight.unwrap_or(0)));
        prop_assert_eq!(m.deleted, e.deleted.map(u64::from));
        prop_assert_eq!(
            m.breaker,
            e.breaker.and_then(|b| Breaker::from_gauge(f64::from(b)))
        );
        assert_sane(&m)?;
        // Damage: the value of some lines replaced.
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        for (at, value) in damage {
            let i = at % lines.len();
            if let Some((series, _)) = lines[i].rsplit_once(' ') {
                lines[i] = format!("{series} {value}");
            }
            // And a bound, if the line has one.
            if let Some(start) = lines[i].find("le=\"") {
                let rest = &lines[i][start + 4..];
                if let Some(end) = rest.find('"') {
                    lines[i] = format!("{}{value}{}", &lines[i][..start + 4], &rest[end..]);
                }
            }
        }
        let damaged = lines.join("\n");
        if let Some(m) = parse(&damaged) {
            assert_sane(&m)?;
            // Two scrapes of it: what the controller derives is finite.
            let round = |at: u64, m: &qc::controller::workers::PodMetrics| Round {
                at: qc::scaling::Timestamp::from_millis(at),
                pods: [("p".to_string(), m.clone())].into(),
                unreachable: Vec::new(),
            };
            let empty = qc::controller::workers::PodMetrics {
                cumulative: vec![0; m.bounds.len()],
                count: 0,
                sum: 0.0,
                ..m.clone()
            };
            let (a, b) = (round(1_000, &empty), round(61_000, &m));
            if let Some(s) = stats(&[&a, &b]) {
                prop_assert!(s.p99_seconds.is_none_or(f64::is_finite), "{s:?}");
                prop_assert!(s.mean_seconds.is_none_or(f64::is_finite), "{s:?}");
                prop_assert!(s.messages_per_second.is_finite(), "{s:?}");
            }
        }
        Ok(())
    });
}

/// Any text at all: figures or none, never a panic, and sane when there are figures.
#[test]
fn scrape_any_text() {
    fuzz("scrape_any_text", any::<String>(), |text| {
        if let Some(m) = qc::controller::workers::parse(text) {
            assert_sane(&m)?;
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// cloudevents_head

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Attr {
    name: String,
    string: Option<String>,
    binary: Option<Vec<u8>>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct HeadCase {
    id: String,
    group: Option<String>,
    dedup: Option<String>,
    sequence: Option<String>,
    sent: Option<u64>,
    receive_count: u32,
    attributes: Vec<Attr>,
    body: Vec<u8>,
    trace: Option<String>,
    arn: String,
    max_head: usize,
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_.:/-]{0,40}",
        any::<String>(),
        "[ -~\\r\\n\"%é]{0,40}",
        (1usize..12_000).prop_map(|n| "v".repeat(n)),
    ]
}

fn head_case() -> impl Strategy<Value = HeadCase> {
    let name = prop_oneof![
        "[A-Za-z][A-Za-z0-9_.-]{0,20}",
        Just("Content-Type".to_string()),
        Just("content-type".to_string()),
        Just("OrderId".to_string()),
        Just("orderid".to_string()),
        Just("traceparent".to_string()),
        "[ -~]{0,12}",
        any::<String>(),
    ];
    let attr = (
        name,
        proptest::option::of(text()),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
    )
        .prop_map(|(name, string, binary)| Attr {
            name,
            string,
            binary,
        });
    (
        (
            text(),
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of("[0-9]{1,20}"),
            proptest::option::of(any::<u64>()),
            any::<u32>(),
        ),
        proptest::collection::vec(attr, 0..10),
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::option::of(prop_oneof![
            Just(
                "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
                    .to_string()
            ),
            "[ -~\\r\\n]{0,60}",
        ]),
        prop_oneof![
            Just(String::new()),
            "arn:aws:sqs:[a-z0-9-]{1,12}:[0-9]{12}:[ -~]{1,20}"
        ],
        prop_oneof![0usize..2048, Just(8 * 1024), 2048usize..80_000],
    )
        .prop_map(
            |(
                (id, group, dedup, sequence, sent, receive_count),
                attributes,
                body,
                trace,
                arn,
                max_head,
            )| HeadCase {
                id,
                group,
                dedup,
                sequence,
                sent,
                receive_count,
                attributes,
                body,
                trace,
                arn,
                max_head,
            },
        )
}

/// Percent-decoding of a header value the worker encoded (CloudEvents HTTP binding, 3.1.3.2).
fn percent_decode(v: &str) -> Option<String> {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The request head the worker builds from a message is one valid HTTP/1.1 head whatever the
/// message holds: every header a token name and a printable value; the CloudEvents attributes decode
/// back to the message's values; every attribute is either sent (and decodes back) or named as left
/// out; the head keeps to its cap unless the fixed headers alone exceed it.
#[test]
fn cloudevents_head() {
    use qc::worker::handler::{HttpHandler, OMITTED_HEADER, QueueContext};
    use qc::worker::sqs::{AttributeValue, Message};
    fuzz("cloudevents_head", head_case(), |c| {
        let queue = QueueContext {
            url: "https://sqs.us-east-1.amazonaws.com/123456789012/orders".into(),
            arn: c.arn.clone(),
        };
        let h = HttpHandler::new("http://127.0.0.1:8080/messages", &queue, 1, c.max_head).unwrap();
        let msg = Message {
            id: c.id.clone(),
            receipt_handle: "rh".into(),
            body: bytes::Bytes::from(c.body.clone()),
            receive_count: c.receive_count,
            group_id: c.group.clone(),
            deduplication_id: c.dedup.clone(),
            sequence_number: c.sequence.clone(),
            sent_timestamp: c.sent,
            first_receive_timestamp: None,
            attributes: c
                .attributes
                .iter()
                .map(|a| {
                    let data_type = if a.binary.is_some() && a.string.is_none() {
                        "Binary"
                    } else {
                        "String"
                    };
                    (
                        a.name.clone(),
                        AttributeValue {
                            data_type: data_type.into(),
                            string: a.string.clone(),
                            binary: a.binary.clone(),
                        },
                    )
                })
                .collect(),
            trace_header: c.trace.clone(),
            handler_traceparent: None,
            received_at: std::time::Instant::now(),
        };
        let head = h.head(&msg);
        let mut headers = [httparse::EMPTY_HEADER; 256];
        let mut req = httparse::Request::new(&mut headers);
        let parsed = req.parse(&head);
        prop_assert!(
            matches!(parsed, Ok(httparse::Status::Complete(n)) if n == head.len()),
            "not one complete head: {parsed:?}\n{}",
            String::from_utf8_lossy(&head)
        );
        prop_assert_eq!(req.method, Some("POST"));
        let mut fields: Vec<(String, String)> = Vec::new();
        for hd in req.headers.iter() {
            prop_assert!(is_token(hd.name), "header name {:?}", hd.name);
            prop_assert!(
                hd.value.iter().all(|b| (0x20..0x7f).contains(b)),
                "{}: {:?}",
                hd.name,
                hd.value
            );
            fields.push((
                hd.name.to_string(),
                String::from_utf8(hd.value.to_vec()).unwrap(),
            ));
        }
        let one = |name: &str| -> Result<Option<String>, TestCaseError> {
            let v: Vec<&String> = fields
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v)
                .collect();
            prop_assert!(v.len() <= 1, "{name} {} times", v.len());
            Ok(v.first().map(|s| (*s).clone()))
        };
        let decoded = |name: &str| -> Result<Option<String>, TestCaseError> {
            Ok(one(name)?
                .map(|v| percent_decode(&v).unwrap_or_else(|| format!("undecodable {v:?}"))))
        };
        prop_assert_eq!(decoded("ce-specversion")?, Some("1.0".to_string()));
        prop_assert_eq!(decoded("ce-id")?, Some(c.id.clone()));
        let source = if c.arn.is_empty() { &queue.url } else { &c.arn };
        prop_assert_eq!(decoded("ce-source")?, Some(source.clone()));
        prop_assert_eq!(decoded("ce-sqsgroupid")?, c.group.clone());
        prop_assert_eq!(decoded("ce-sqsdeduplicationid")?, c.dedup.clone());
        prop_assert_eq!(decoded("ce-sqssequencenumber")?, c.sequence.clone());
        prop_assert_eq!(
            one("ce-sqsreceivecount")?,
            Some(c.receive_count.to_string())
        );
        prop_assert_eq!(one("content-length")?, Some(c.body.len().to_string()));
        prop_assert!(one("content-type")?.is_some());
        let omitted: Vec<String> = one(OMITTED_HEADER)?
            .map(|v| {
                percent_decode(&v)
                    .unwrap()
                    .split(',')
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let attribute_lines = fields
            .iter()
            .filter(|(n, _)| n.starts_with("x-sqs-attribute-"))
            .count();
        let mut seen: Vec<String> = Vec::new();
        for a in &c.attributes {
            let value = match (&a.string, &a.binary) {
                (Some(s), _) => s.clone(),
                (None, Some(b)) => {
                    use base64::Engine as _;
                    base64::engine::general_purpose::STANDARD.encode(b)
                }
                (None, None) => continue,
            };
            if !is_token(&a.name) {
                continue;
            }
            let lower = a.name.to_ascii_lowercase();
            if seen.contains(&lower) {
                prop_assert!(
                    omitted.contains(&a.name),
                    "{} collides and is not named",
                    a.name
                );
                continue;
            }
            seen.push(lower.clone());
            match decoded(&format!("x-sqs-attribute-{lower}"))? {
                Some(v) => prop_assert_eq!(v, value),
                None => prop_assert!(
                    omitted.contains(&a.name),
                    "{} neither sent nor named",
                    a.name
                ),
            }
        }
        if head.len() > c.max_head {
            prop_assert_eq!(attribute_lines, 0, "over the cap with attributes in");
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// durations, quantities

/// The CRD's duration pattern, as the API server's RE2 reads it (Rust's `regex` has its syntax).
fn matches_duration_pattern(s: &str) -> bool {
    static PATTERN: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(qc::api::DURATION_PATTERN).expect("the duration pattern compiles")
    });
    PATTERN.is_match(s)
}

/// Duration text: the parser accepts exactly what the CRD's pattern accepts (too large aside, which
/// it names), sums the parts of a compound, prints what parses back to itself, and a refusal quotes
/// the text and an example.
#[test]
fn durations() {
    let text = prop_oneof![
        any::<String>(),
        "([0-9]{0,21}(ms|s|m|h|d|us|)){0,4}",
        "([0-9]{0,21}([.,][0-9]{0,5})?(ms|s|m|h|d|)){0,4}",
        "[ \\t]?[0-9]{1,4}(ms|s|m|h)[ \\t]?",
    ];
    fuzz(
        "durations",
        (text, 0u64..1 << 40, 0u64..1 << 40),
        |(s, a, b)| {
            let parsed = s.parse::<Duration>();
            let trimmed = s.trim();
            match &parsed {
                Ok(d) => {
                    prop_assert!(
                        matches_duration_pattern(trimmed),
                        "{s:?} accepted, but the CRD refuses it"
                    );
                    prop_assert_eq!(d.to_string().parse::<Duration>().unwrap(), *d);
                }
                Err(qc::api::DurationError::Overflow(t)) => {
                    prop_assert!(matches_duration_pattern(trimmed), "{s:?}");
                    prop_assert_eq!(t.as_str(), trimmed);
                }
                Err(e) => {
                    prop_assert!(
                        !matches_duration_pattern(trimmed),
                        "{s:?} refused ({e}), but the CRD accepts it"
                    );
                    let m = e.to_string();
                    prop_assert!(m.contains("e.g."), "{m}");
                    if !trimmed.is_empty() {
                        prop_assert!(m.contains(&format!("{trimmed:?}")), "{m}");
                    }
                }
            }
            let (da, db) = (Duration::from_millis(*a), Duration::from_millis(*b));
            let sum = format!("{da}{db}").parse::<Duration>();
            prop_assert_eq!(sum, Ok(da.saturating_add(db)));
            Ok(())
        },
    );
}

/// Kubernetes quantities compare by value whatever the notation: binary and decimal suffixes,
/// exponents and decimal points; a negative is the negation; the value is normalized; anything else
/// is refused, never a panic.
#[test]
fn quantities() {
    use qc::api::quantity::value;
    const BINARY: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    const DECIMAL: [(&str, i32); 9] = [
        ("n", -9),
        ("u", -6),
        ("m", -3),
        ("k", 3),
        ("M", 6),
        ("G", 9),
        ("T", 12),
        ("P", 15),
        ("E", 18),
    ];
    let case = (
        any::<String>(),
        0u64..1 << 20,
        0usize..6,
        0usize..9,
        "[0-9]{1,6}",
        "[0-9]{0,6}",
    );
    fuzz("quantities", case, |(s, n, bi, di, whole, frac)| {
        // Anything: a normalized value or none.
        if let Some((m, e)) = value(s) {
            prop_assert!(m == 0 && e == 0 || m % 10 != 0, "{s:?}: ({m}, {e})");
            if !s.starts_with(['+', '-']) {
                prop_assert_eq!(value(&format!("-{s}")), Some((-m, e)), "-{}", s);
            }
        }
        let n = *n;
        let (suffix, power) = (BINARY[*bi], 10 * (*bi as u32 + 1));
        prop_assert_eq!(
            value(&format!("{n}{suffix}")),
            value(&(i128::from(n) << power).to_string())
        );
        let (d, exp) = DECIMAL[*di];
        prop_assert_eq!(value(&format!("{n}{d}")), value(&format!("{n}e{exp}")));
        prop_assert_eq!(
            value(&format!("-{n}{d}")).map(|(m, e)| (-m, e)),
            value(&format!("{n}{d}"))
        );
        let point = if frac.is_empty() {
            whole.clone()
        } else {
            format!("{whole}.{frac}")
        };
        prop_assert_eq!(
            value(&point),
            value(&format!("{whole}{frac}e-{}", frac.len()))
        );
        prop_assert!(value(&point).is_some());
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// endpoint_allow_list

#[derive(Clone, Debug, Serialize, Deserialize)]
struct EndpointCase {
    /// (scheme, host, wildcard, port: None default, Some(0) any, else exact)
    patterns: Vec<(String, String, bool, Option<u16>)>,
    scheme: String,
    /// Host labels; the endpoint's host is their join with dots.
    host: Vec<String>,
    port: Option<u16>,
    /// 0 plain, 1 userinfo, 2 path, 3 query, 4 fragment, 5 trailing slash, 6 upper case,
    /// 7 a percent-encoded dot, 8 hexadecimal IPv4, 9 backslash before the host's end.
    decoration: u8,
}

fn endpoint_case() -> impl Strategy<Value = EndpointCase> {
    let label = prop_oneof![
        Just("sqs".to_string()),
        Just("us-east-1".to_string()),
        Just("amazonaws".to_string()),
        Just("com".to_string()),
        Just("svc".to_string()),
        Just("moto".to_string()),
        Just("127".to_string()),
        Just("0".to_string()),
        Just("1".to_string()),
        "[a-z0-9-]{1,8}",
    ];
    let host = proptest::collection::vec(label, 1..5);
    let scheme = prop_oneof![Just("http".to_string()), Just("https".to_string())];
    let pattern = (
        scheme.clone(),
        host.clone().prop_map(|l| l.join(".")),
        any::<bool>(),
        proptest::option::of(prop_oneof![
            Just(0u16),
            1u16..6000,
            Just(443u16),
            Just(80u16)
        ]),
    );
    (
        proptest::collection::vec(pattern, 0..4),
        scheme,
        host,
        proptest::option::of(prop_oneof![1u16..6000, Just(443u16), Just(80u16)]),
        0u8..10,
    )
        .prop_map(|(patterns, scheme, host, port, decoration)| EndpointCase {
            patterns,
            scheme,
            host,
            port,
            decoration,
        })
}

impl EndpointCase {
    fn pattern_texts(&self) -> Vec<String> {
        self.patterns
            .iter()
            .map(|(s, h, wild, port)| {
                let host = if *wild { format!("*.{h}") } else { h.clone() };
                match port {
                    None => format!("{s}://{host}"),
                    Some(0) => format!("{s}://{host}:*"),
                    Some(p) => format!("{s}://{host}:{p}"),
                }
            })
            .collect()
    }

    fn endpoint(&self) -> String {
        let host = self.host.join(".");
        let port = self.port.map(|p| format!(":{p}")).unwrap_or_default();
        let s = &self.scheme;
        match self.decoration {
            1 => format!("{s}://user:pw@{host}{port}"),
            2 => format!("{s}://{host}{port}/path"),
            3 => format!("{s}://{host}{port}?q=1"),
            4 => format!("{s}://{host}{port}#f"),
            5 => format!("{s}://{host}{port}/"),
            6 => format!("{s}://{}{port}", host.to_ascii_uppercase()),
            7 => format!("{s}://{}{port}", host.replacen('.', "%2e", 1)),
            8 => format!("{s}://0x7f.{}{port}", self.host.len()),
            9 => format!("{s}://{host}\\.x{port}"),
            _ => format!("{s}://{host}{port}"),
        }
    }

    /// What the administrator meant: the plain endpoint, its host written as URL parsers agree on
    /// it, matches a pattern (scheme, host exactly or a strictly deeper subdomain of a wildcard's,
    /// port).
    fn meant(&self) -> bool {
        let host = self.host.join(".");
        // A host the URL standard rewrites (`127` = `0.0.0.127`) is refused whatever the patterns say.
        let canonical = url::Url::parse(&format!("{}://{host}", self.scheme))
            .is_ok_and(|u| u.host_str() == Some(host.as_str()));
        if !canonical {
            return false;
        }
        let port = self
            .port
            .unwrap_or(if self.scheme == "https" { 443 } else { 80 });
        self.patterns.iter().any(|(s, h, wild, p)| {
            *s == self.scheme
                && if *wild {
                    host.ends_with(&format!(".{h}"))
                } else {
                    host == *h
                }
                && match p {
                    None => port == if s == "https" { 443 } else { 80 },
                    Some(0) => true,
                    Some(p) => *p == port,
                }
        })
    }
}

/// The allow-list refuses every endpoint with credentials, a path, a query or a fragment; allows a
/// plain one exactly when a pattern (or AWS's own endpoint) matches it; and whatever it allows names
/// the same host and port for the SDK (which reads the text with `http::Uri`) as for the check (which
/// reads it with the `url` crate), so no spelling reaches a host the check did not see. Refusals name
/// the field, the endpoint and the chart value.
#[test]
fn endpoint_allow_list() {
    use qc::aws::endpoints::AllowedEndpoints;
    fuzz(
        "endpoint_allow_list",
        (endpoint_case(), any::<String>()),
        |(c, noise)| {
            // Any text as a pattern or an endpoint: a verdict, never a panic.
            match AllowedEndpoints::parse([noise.as_str()]) {
                Ok(a) => {
                    let _ = a.check(noise);
                }
                Err(e) => {
                    let m = e.to_string();
                    prop_assert!(m.contains("SCHEME://HOST[:PORT]"), "{m}");
                }
            }
            let patterns = c.pattern_texts();
            let allowed = AllowedEndpoints::parse(&patterns);
            prop_assert!(allowed.is_ok(), "{patterns:?}: {allowed:?}");
            let allowed = allowed.unwrap();
            let endpoint = c.endpoint();
            let verdict = allowed.check(&endpoint);
            if let Err(e) = &verdict {
                let m = e.to_string();
                prop_assert!(
                    m.contains("spec.queue.endpoint")
                        && m.contains(qc::aws::endpoints::ALLOW_SETTING),
                    "{m}"
                );
                prop_assert!(m.contains(&format!("{endpoint:?}")), "{m}");
            } else {
                prop_assert!(!matches!(c.decoration, 1..=4), "{endpoint} allowed");
                let checked = url::Url::parse(&endpoint).unwrap();
                let sdk: http::Uri = endpoint
                    .parse()
                    .map_err(|e| TestCaseError::fail(format!("{endpoint}: {e}")))?;
                prop_assert_eq!(
                    sdk.host().map(str::to_ascii_lowercase),
                    checked.host_str().map(str::to_string),
                    "{} is read as two hosts",
                    endpoint
                );
                prop_assert_eq!(
                    sdk.port_u16()
                        .unwrap_or(if sdk.scheme_str() == Some("https") {
                            443
                        } else {
                            80
                        }),
                    checked.port_or_known_default().unwrap()
                );
            }
            if matches!(c.decoration, 0 | 5 | 6) {
                let aws = c.scheme == "https"
                    && c.port.is_none_or(|p| p == 443)
                    && AllowedEndpoints::aws_only().check(&endpoint).is_ok();
                prop_assert_eq!(
                    verdict.is_ok(),
                    c.meant() || aws,
                    "{} with {:?}",
                    endpoint,
                    patterns
                );
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// manifest_loader

/// Leaf fields of the sample manifest a mutation replaces.
const FIELDS: [&str; 14] = [
    "spec.queue.url",
    "spec.queue.region",
    "spec.processing.p99",
    "spec.processing.timeout",
    "spec.processing.concurrency",
    "spec.processing.batchSize",
    "spec.processing.waitTime",
    "spec.processing.onPoison",
    "spec.handler.http.port",
    "spec.idempotency.ttl",
    "spec.idempotency.key",
    "spec.scaling.maxReplicas",
    "spec.scaling.pollInterval",
    "spec.suspend",
];

fn odd_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{Value, json};
    prop_oneof![
        Just(json!("abc")),
        Just(json!("")),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(1e20)),
        Just(json!(u64::MAX)),
        Just(json!(true)),
        Just(json!([])),
        Just(json!({"x": 1})),
        Just(json!("1h30m")),
        Just(json!("99999999999999999999h")),
        any::<i64>().prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ]
}

/// A sample manifest with one field replaced by an odd value loads as a valid QueueConsumer or as
/// errors, one of which names that field (or the object around it); the YAML text cut or with bytes
/// replaced is documents or a YAML error, never a panic.
#[test]
fn manifest_loader() {
    let sample: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/samples/sqs_v1alpha1_queueconsumer_http.yaml"
        ))
        .unwrap(),
    )
    .unwrap();
    let case = (
        0..FIELDS.len(),
        odd_value(),
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        any::<usize>(),
    );
    fuzz("manifest_loader", case, |(field, value, damage, cut)| {
        let path = FIELDS[*field];
        let mut doc = sample.clone();
        let pointer = format!("/{}", path.replace('.', "/"));
        let (parent, leaf) = pointer.rsplit_once('/').unwrap();
        if doc.pointer(parent).is_none() {
            // An optional block the sample leaves out (spec.queue.region's parent exists; others may not).
            return Ok(());
        }
        doc.pointer_mut(parent).unwrap()[leaf] = value.clone();
        let text = serde_saphyr::to_string(&doc).unwrap();
        let docs = qc::manifest::load_str(&text);
        prop_assert!(docs.is_ok(), "{docs:?}");
        let docs = docs.unwrap();
        prop_assert_eq!(docs.len(), 1);
        match &docs[0] {
            qc::manifest::Document::Valid(_) => {}
            qc::manifest::Document::Invalid { errors, .. } => {
                prop_assert!(!errors.is_empty());
                prop_assert!(errors.iter().all(|e| !e.message.is_empty()), "{errors:?}");
                prop_assert!(
                    errors.iter().any(|e| {
                        let p = e.path.split('[').next().unwrap_or("");
                        !p.is_empty() && (path.starts_with(p) || p.starts_with(path))
                    }),
                    "{path} = {value}: no error names it: {errors:?}"
                );
            }
            other @ qc::manifest::Document::Other { .. } => prop_assert!(false, "{other:?}"),
        }
        // Bytes replaced, the text cut: no panic.
        let mut bytes = text.into_bytes();
        for (at, b) in damage {
            let i = at % bytes.len();
            bytes[i] = *b;
        }
        bytes.truncate(cut % (bytes.len() + 1));
        let _ = qc::manifest::load_str(&String::from_utf8_lossy(&bytes));
        Ok(())
    });
}
