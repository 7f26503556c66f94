//! Batch mode (`--batch-max-items`): several messages in one handler call. The request is a list of
//! CloudEvents in structured JSON form (HTTP: the batched content mode,
//! `application/cloudevents-batch+json`; exec: one event per line on stdin), and the answer names
//! the items that failed in Lambda's `ReportBatchItemFailures` shape. Pure: building the events and
//! reading the answer; the calls are in `http` and `exec`.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::value::RawValue;

use super::{CE_TYPE, Verdict, rfc3339_millis};
use crate::worker::sqs::Message;
use crate::worker::trace::TraceContext;

/// Content type of an HTTP batch request (CloudEvents HTTP binding, batched content mode).
pub const BATCH_CONTENT_TYPE: &str = "application/cloudevents-batch+json";

/// What a batch call said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchVerdict {
    /// The handler answered: the items at these positions failed (retried under the normal
    /// policy), every other one succeeded.
    Items { failed: Vec<usize> },
    /// The call as a whole failed or said one thing for all: every item gets this verdict
    /// (a batch-wide poison answer is turned into a retry by `whole`).
    Whole(Verdict),
}

impl BatchVerdict {
    /// A verdict for every item of the call. HTTP 400/422 or exit 65 for a whole batch does not make
    /// every item poison (one bad item would take the others to the DLQ with it): the items are
    /// retried, and the ones that keep failing reach the DLQ by the redrive policy's count.
    pub fn whole(v: Verdict) -> BatchVerdict {
        match v {
            Verdict::Poison(reason) => BatchVerdict::Whole(Verdict::Transient {
                reason: format!(
                    "{reason} for the whole batch: every item is retried (name the failed items in batchItemFailures instead)"
                ),
                retry_after: None,
                cause: super::Cause::Other,
            }),
            v => BatchVerdict::Whole(v),
        }
    }
}

/// One message as a CloudEvent in structured JSON form.
#[derive(Serialize)]
struct Event<'a> {
    specversion: &'static str,
    id: &'a str,
    source: &'a str,
    #[serde(rename = "type")]
    ty: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<String>,
    datacontenttype: &'a str,
    /// A JSON body as its exact text, any other UTF-8 body as a string.
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Data<'a>>,
    /// A body that is not UTF-8, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    data_base64: Option<String>,
    sqsreceivecount: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    sqsgroupid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sqsdeduplicationid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sqssequencenumber: Option<&'a str>,
    /// The message attributes in Lambda's `messageAttributes` shape, as JSON text: a CloudEvents
    /// extension attribute holds a string, not an object.
    #[serde(skip_serializing_if = "Option::is_none")]
    sqsmessageattributes: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Data<'a> {
    Json(&'a RawValue),
    Text(&'a str),
}

/// The structured CloudEvent of one message (no trailing newline). `source` is the queue ARN.
pub fn event_json(msg: &Message, source: &str) -> Vec<u8> {
    let content_type = content_type(msg);
    let (data, data_base64) = match std::str::from_utf8(&msg.body) {
        Ok(text) => {
            let json = content_type
                .starts_with("application/json")
                .then(|| serde_json::from_str::<&RawValue>(text).ok())
                .flatten();
            (Some(json.map_or(Data::Text(text), Data::Json)), None)
        }
        Err(_) => (None, Some(base64(&msg.body))),
    };
    let trace = TraceContext::of_message(msg);
    let event = Event {
        specversion: "1.0",
        id: &msg.id,
        source,
        ty: CE_TYPE,
        time: msg.sent_timestamp.and_then(rfc3339_millis),
        datacontenttype: &content_type,
        data,
        data_base64,
        sqsreceivecount: msg.receive_count,
        sqsgroupid: msg.group_id.as_deref(),
        sqsdeduplicationid: msg.deduplication_id.as_deref(),
        sqssequencenumber: msg.sequence_number.as_deref(),
        sqsmessageattributes: attributes_json(msg),
        traceparent: trace.traceparent.as_deref(),
        tracestate: trace.tracestate.as_deref(),
    };
    // Serializing these plain fields cannot fail; an empty object stands in if it ever did.
    serde_json::to_vec(&event).unwrap_or_else(|_| b"{}".to_vec())
}

/// The HTTP request body: a JSON array of the events.
pub fn http_body(msgs: &[&Message], source: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(msgs.iter().map(|m| m.body.len() + 512).sum());
    out.push(b'[');
    for (i, m) in msgs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&event_json(m, source));
    }
    out.push(b']');
    out
}

/// The exec handler's stdin: one event per line.
pub fn json_lines(msgs: &[&Message], source: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(msgs.iter().map(|m| m.body.len() + 512).sum());
    for m in msgs {
        out.extend_from_slice(&event_json(m, source));
        out.push(b'\n');
    }
    out
}

/// The Content-Type attribute when it is plain printable text, else a guess from the body.
fn content_type(msg: &Message) -> String {
    msg.attributes
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        .and_then(|(_, v)| v.string.as_deref())
        .filter(|t| t.len() <= 256 && t.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .map_or_else(
            || match msg.body.iter().find(|b| !b.is_ascii_whitespace()) {
                Some(b'{' | b'[') => "application/json".to_string(),
                _ => "text/plain; charset=utf-8".to_string(),
            },
            str::to_string,
        )
}

fn attributes_json(msg: &Message) -> Option<String> {
    if msg.attributes.is_empty() {
        return None;
    }
    let map: serde_json::Map<String, serde_json::Value> = msg
        .attributes
        .iter()
        .map(|(name, v)| {
            let mut a = serde_json::Map::new();
            a.insert("dataType".into(), v.data_type.clone().into());
            if let Some(s) = &v.string {
                a.insert("stringValue".into(), s.clone().into());
            }
            if let Some(b) = &v.binary {
                a.insert("binaryValue".into(), base64(b).into());
            }
            (name.clone(), serde_json::Value::Object(a))
        })
        .collect();
    Some(serde_json::Value::Object(map).to_string())
}

fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// What came back from a batch call that ended well (HTTP 2xx, exec exit 0), and so where its answer
/// is: the one decision of what counts as an answer (docs/handler-contract.md, "The answer").
#[derive(Clone, Copy, Debug)]
pub enum Answer<'a> {
    /// The body of an HTTP 2xx response, complete (its framing ended). An empty body is the
    /// handler's explicit "nothing failed", as Lambda reads a function that returned nothing.
    HttpBody(&'a [u8]),
    /// The exec handler's answer file (`QC_BATCH_ANSWER_FILE`) after the process exited 0.
    ExecFile(AnswerFile<'a>),
}

/// An exec batch handler's answer file as the worker found it after the process exited.
#[derive(Clone, Copy, Debug)]
pub enum AnswerFile<'a> {
    /// The handler wrote none. Exit 0 alone says nothing of the items (a handler written for
    /// the stdout answer of old exits 0 after listing its failures there): every item is retried.
    Missing,
    /// It is there but could not be read (not a regular file, larger than the cap, an I/O error).
    Unreadable(&'a str),
    /// Its bytes. It must hold a JSON object: an empty file is what an unflushed or unfinished
    /// write leaves, never "nothing failed".
    Written(&'a [u8]),
}

/// What a batch call that ended well said of its items: `Items` only for an explicit, well-formed
/// answer; anything else retries every item (`from` names the handler in the reason).
pub fn answered(answer: Answer<'_>, ids: &[&str], from: &str) -> BatchVerdict {
    let read = match answer {
        Answer::HttpBody(body) if body.iter().all(u8::is_ascii_whitespace) => Ok(Vec::new()),
        Answer::HttpBody(body) | Answer::ExecFile(AnswerFile::Written(body)) => {
            parse_answer(body, ids)
        }
        Answer::ExecFile(AnswerFile::Missing) => Err(format!(
            "it exited 0 without writing its answer to ${ANSWER_FILE_ENV} (stdout is never read \
             as the answer; write {{\"batchItemFailures\": []}} there when every item succeeded)"
        )),
        Answer::ExecFile(AnswerFile::Unreadable(why)) => {
            Err(format!("its answer file cannot be read: {why}"))
        }
    };
    match read {
        Ok(failed) => BatchVerdict::Items { failed },
        Err(why) => BatchVerdict::Whole(Verdict::Transient {
            reason: format!("no usable batch answer from {from}: {why}; every item is retried"),
            retry_after: None,
            cause: super::Cause::Other,
        }),
    }
}

/// The environment variable naming an exec batch handler's answer file.
pub const ANSWER_FILE_ENV: &str = "QC_BATCH_ANSWER_FILE";

/// Reads a batch answer in Lambda's `ReportBatchItemFailures` shape: a JSON object whose
/// `batchItemFailures` is missing, null or empty means every item succeeded; each listed
/// `itemIdentifier` (a message id of the batch) failed, at **every** position holding that id (SQS
/// can hand one message to two receives, so one batch may hold it twice: a failed id never lets a
/// copy count as a success). Anything else (empty, not JSON, not an object, a list entry without
/// a non-empty string `itemIdentifier`, an id not in the batch) is malformed: Err with the reason,
/// and the caller retries every item.
pub fn parse_answer(body: &[u8], ids: &[&str]) -> Result<Vec<usize>, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err("the answer is empty (write {} or {\"batchItemFailures\": []} when every item succeeded)".into());
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| format!("the answer is not JSON ({e}): {}", excerpt(body)))?;
    let serde_json::Value::Object(obj) = value else {
        return Err(format!(
            "the answer is not a JSON object: {}",
            excerpt(body)
        ));
    };
    let list = match obj.get("batchItemFailures") {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Array(list)) => list,
        Some(other) => {
            return Err(format!(
                "batchItemFailures is not a list: {}",
                excerpt(other.to_string().as_bytes())
            ));
        }
    };
    let mut failed = vec![false; ids.len()];
    for entry in list {
        let id = entry
            .get("itemIdentifier")
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                format!(
                    "a batchItemFailures entry has no itemIdentifier string: {}",
                    excerpt(entry.to_string().as_bytes())
                )
            })?;
        let mut named = false;
        for (at, _) in ids.iter().enumerate().filter(|(_, i)| **i == id) {
            failed[at] = true;
            named = true;
        }
        if !named {
            return Err(format!(
                "itemIdentifier {:?} is no message id of this batch",
                excerpt(id.as_bytes())
            ));
        }
    }
    Ok(failed
        .iter()
        .enumerate()
        .filter_map(|(at, f)| f.then_some(at))
        .collect())
}

/// The start of an answer for a log line: at most 200 bytes, lossy UTF-8.
fn excerpt(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(200)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if bytes.len() > cut.len() {
        let _ = write!(s, "… ({} bytes)", bytes.len());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::sqs::AttributeValue;

    fn msg(id: &str, body: &[u8]) -> Message {
        Message {
            id: id.into(),
            receipt_handle: format!("rh-{id}"),
            body: bytes::Bytes::copy_from_slice(body),
            receive_count: 2,
            group_id: None,
            deduplication_id: None,
            sequence_number: None,
            sent_timestamp: Some(1_700_000_000_123),
            first_receive_timestamp: None,
            attributes: Vec::new(),
            trace_header: None,
            handler_traceparent: None,
            received_at: std::time::Instant::now(),
        }
    }

    #[test]
    fn answers_are_read_as_lambda_reads_them() {
        let ids = ["a", "b", "c"];
        for ok in [
            "{}",
            " {}\n",
            r#"{"batchItemFailures": null}"#,
            r#"{"batchItemFailures": []}"#,
        ] {
            assert_eq!(parse_answer(ok.as_bytes(), &ids), Ok(vec![]), "{ok:?}");
        }
        assert_eq!(
            parse_answer(
                br#"{"batchItemFailures":[{"itemIdentifier":"c"},{"itemIdentifier":"a"},{"itemIdentifier":"c"}]}"#,
                &ids
            ),
            Ok(vec![0, 2])
        );
        for (bad, why) in [
            ("", "empty"),
            ("  \n", "empty"),
            ("OK", "not JSON"),
            ("[]", "not a JSON object"),
            (r#"{"batchItemFailures": "a"}"#, "not a list"),
            (
                r#"{"batchItemFailures": [{"id": "a"}]}"#,
                "no itemIdentifier",
            ),
            (
                r#"{"batchItemFailures": [{"itemIdentifier": ""}]}"#,
                "no itemIdentifier",
            ),
            (
                r#"{"batchItemFailures": [{"itemIdentifier": 7}]}"#,
                "no itemIdentifier",
            ),
            (
                r#"{"batchItemFailures": [{"itemIdentifier": "z"}]}"#,
                "no message id of this batch",
            ),
        ] {
            let e = parse_answer(bad.as_bytes(), &ids).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// #40: SQS can hand one message to two receives, so a batch can hold one id twice. A failed
    /// id names every position holding it: no copy counts as a success and deletes the message.
    #[test]
    fn an_item_identifier_names_every_position_with_that_id() {
        let ids = ["a", "b", "a", "c", "a"];
        assert_eq!(
            parse_answer(br#"{"batchItemFailures":[{"itemIdentifier":"a"}]}"#, &ids),
            Ok(vec![0, 2, 4])
        );
        assert_eq!(
            parse_answer(
                br#"{"batchItemFailures":[{"itemIdentifier":"c"},{"itemIdentifier":"a"}]}"#,
                &ids
            ),
            Ok(vec![0, 2, 3, 4])
        );
        assert_eq!(parse_answer(b"{}", &ids), Ok(vec![]));
    }

    /// #40: only an explicit, complete answer says which items succeeded. The table of
    /// docs/handler-contract.md ("The answer"), row by row.
    #[test]
    fn only_an_explicit_answer_deletes_anything() {
        let ids = ["a", "b"];
        let items = |v: BatchVerdict| match v {
            BatchVerdict::Items { failed } => Some(failed),
            BatchVerdict::Whole(Verdict::Transient { cause, reason, .. }) => {
                assert_eq!(cause, super::super::Cause::Other, "{reason}");
                assert!(reason.contains("every item is retried"), "{reason}");
                None
            }
            other @ BatchVerdict::Whole(_) => panic!("{other:?}"),
        };
        let one = br#"{"batchItemFailures":[{"itemIdentifier":"b"}]}"#;
        for (answer, want) in [
            // HTTP: a complete 2xx body; empty is the handler's "nothing failed".
            (Answer::HttpBody(b""), Some(vec![])),
            (Answer::HttpBody(b" \r\n"), Some(vec![])),
            (Answer::HttpBody(b"{}"), Some(vec![])),
            (Answer::HttpBody(one), Some(vec![1])),
            (Answer::HttpBody(b"OK"), None),
            // Exec: the file, and only a JSON object in it.
            (Answer::ExecFile(AnswerFile::Written(b"{}")), Some(vec![])),
            (
                Answer::ExecFile(AnswerFile::Written(br#"{"batchItemFailures":[]}"#)),
                Some(vec![]),
            ),
            (Answer::ExecFile(AnswerFile::Written(one)), Some(vec![1])),
            (Answer::ExecFile(AnswerFile::Missing), None),
            (Answer::ExecFile(AnswerFile::Written(b"")), None),
            (Answer::ExecFile(AnswerFile::Written(b"\n")), None),
            (
                Answer::ExecFile(AnswerFile::Written(br#"{"batchItemFail"#)),
                None,
            ),
            (
                Answer::ExecFile(AnswerFile::Unreadable("a directory")),
                None,
            ),
        ] {
            assert_eq!(items(answered(answer, &ids, "h")), want, "{answer:?}");
        }
        match answered(Answer::ExecFile(AnswerFile::Missing), &ids, "/app/h") {
            BatchVerdict::Whole(Verdict::Transient { reason, .. }) => {
                assert!(reason.contains(ANSWER_FILE_ENV), "{reason}");
                assert!(reason.contains("/app/h"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn events_carry_the_body_exactly_and_the_metadata() {
        let mut m = msg("m-1", br#"{ "b":1,"a" : [2] }"#);
        m.group_id = Some("g".into());
        m.attributes.push((
            "Kind".into(),
            AttributeValue {
                data_type: "String".into(),
                string: Some("x".into()),
                binary: None,
            },
        ));
        m.attributes.push((
            "Blob".into(),
            AttributeValue {
                data_type: "Binary".into(),
                string: None,
                binary: Some(vec![0, 255]),
            },
        ));
        let text = String::from_utf8(event_json(&m, "arn:aws:sqs:us-east-1:1:q")).unwrap();
        // The JSON body is embedded as its exact text.
        assert!(text.contains(r#""data":{ "b":1,"a" : [2] }"#), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["specversion"], "1.0");
        assert_eq!(v["id"], "m-1");
        assert_eq!(v["source"], "arn:aws:sqs:us-east-1:1:q");
        assert_eq!(v["type"], CE_TYPE);
        assert_eq!(v["time"], "2023-11-14T22:13:20.123Z");
        assert_eq!(v["datacontenttype"], "application/json");
        assert_eq!(v["sqsreceivecount"], 2);
        assert_eq!(v["sqsgroupid"], "g");
        let attrs: serde_json::Value =
            serde_json::from_str(v["sqsmessageattributes"].as_str().unwrap()).unwrap();
        assert_eq!(attrs["Kind"]["stringValue"], "x");
        assert_eq!(attrs["Kind"]["dataType"], "String");
        assert_eq!(attrs["Blob"]["binaryValue"], "AP8=");

        // Text that is not JSON (even when it starts like it) is a string; non-UTF-8 is base64.
        let v: serde_json::Value =
            serde_json::from_slice(&event_json(&msg("t", b"{not json"), "s")).unwrap();
        assert_eq!(v["data"], "{not json");
        let v: serde_json::Value =
            serde_json::from_slice(&event_json(&msg("b", &[0xff, 0xfe]), "s")).unwrap();
        assert_eq!(v["data_base64"], "//4=");
        assert!(v.get("data").is_none());
    }

    #[test]
    fn bodies_list_every_event_in_order() {
        let (a, b) = (msg("a", b"one"), msg("b", b"two\nlines"));
        let v: serde_json::Value = serde_json::from_slice(&http_body(&[&a, &b], "s")).unwrap();
        assert_eq!(v[0]["id"], "a");
        assert_eq!(v[1]["data"], "two\nlines");
        let lines = json_lines(&[&a, &b], "s");
        let text = String::from_utf8(lines).unwrap();
        let ids: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].to_string())
            .collect();
        assert_eq!(
            ids,
            [r#""a""#, r#""b""#],
            "a newline in a body stays escaped"
        );
    }

    #[test]
    fn a_whole_batch_poison_answer_retries_every_item() {
        match BatchVerdict::whole(Verdict::Poison("HTTP 400".into())) {
            BatchVerdict::Whole(Verdict::Transient { cause, reason, .. }) => {
                assert_eq!(cause, super::super::Cause::Other);
                assert!(reason.contains("batchItemFailures"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
