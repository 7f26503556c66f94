//! Property tests: the worker's HTTP/1.1 answer reader and chunked decoder, the duration
//! parser and the manifest loader take any input without panicking, and round-trip where they can.
//! The SQS answers are parsed by aws-sdk-sqs, which has its own tests.

mod common;

use common::fuzz::{exchange, runtime};
use proptest::prelude::*;
use qc::api::Duration;

/// `body` as a chunked encoding cut at `cuts`, with optional chunk extensions and a trailer.
fn chunked(body: &[u8], cuts: &[usize], ext: bool, trailer: bool) -> Vec<u8> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    points.push(0);
    points.push(body.len());
    points.sort_unstable();
    points.dedup();
    let mut out = Vec::new();
    for w in points.windows(2) {
        let part = &body[w[0]..w[1]];
        if part.is_empty() {
            continue;
        }
        out.extend_from_slice(format!("{:x}", part.len()).as_bytes());
        if ext {
            out.extend_from_slice(b";name=value");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n");
    if trailer {
        out.extend_from_slice(b"x-checksum: 1\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Any bytes from the server end in an answer or an error, never a panic or a hang.
    #[test]
    fn any_answer_bytes_end_in_a_result(answer in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = runtime().block_on(exchange(answer));
    }

    /// Heads that look like HTTP with arbitrary header lines and bodies: still a result, and a 2xx is
    /// only reported when the head parsed.
    #[test]
    fn http_looking_answers_end_in_a_result(
        status in 0u16..1000,
        headers in proptest::collection::vec(("[A-Za-z-]{1,20}", "[ -~]{0,40}"), 0..12),
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut a = format!("HTTP/1.1 {status:03} X\r\n").into_bytes();
        for (n, v) in &headers {
            a.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
        }
        a.extend_from_slice(b"\r\n");
        a.extend_from_slice(&body);
        if let Ok(answer) = runtime().block_on(exchange(a)) {
            prop_assert_eq!(answer.status, status);
        }
    }

    /// A chunked body, however it is cut, with extensions and trailers, decodes to the same bytes.
    #[test]
    fn chunked_bodies_round_trip(
        body in proptest::collection::vec(any::<u8>(), 0..4096),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        ext in any::<bool>(),
        trailer in any::<bool>(),
    ) {
        let mut a = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        a.extend(chunked(&body, &cuts, ext, trailer));
        let answer = runtime().block_on(exchange(a)).unwrap();
        prop_assert_eq!(answer.status, 200);
        prop_assert_eq!(answer.body, body);
    }

    /// A chunked body cut short or with a corrupted size line is an error, never a success.
    #[test]
    fn damaged_chunked_bodies_are_errors(
        body in proptest::collection::vec(any::<u8>(), 1..2048),
        cuts in proptest::collection::vec(any::<usize>(), 0..8),
        keep in any::<prop::sample::Index>(),
    ) {
        let encoded = chunked(&body, &cuts, false, false);
        // Cut anywhere before the final CRLF of the last chunk.
        let at = keep.index(encoded.len() - 2);
        let mut a = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        a.extend_from_slice(&encoded[..at]);
        prop_assert!(runtime().block_on(exchange(a)).is_err());
    }

    /// Content-Length bodies round-trip too.
    #[test]
    fn length_bodies_round_trip(body in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let mut a = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        a.extend_from_slice(&body);
        let answer = runtime().block_on(exchange(a)).unwrap();
        prop_assert_eq!(answer.body, body);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any text: a duration or an error, never a panic.
    #[test]
    fn any_text_parses_to_a_duration_or_an_error(s in any::<String>()) {
        let _ = s.parse::<Duration>();
    }

    /// Text built from digits, decimal points and units: still no panic, and what parses prints back
    /// to itself.
    #[test]
    fn duration_like_text_round_trips(s in "([0-9]{0,22}(\\.[0-9]{0,4})?(ms|s|m|h|d|)){0,4}") {
        if let Ok(d) = s.parse::<Duration>() {
            let again: Duration = d.to_string().parse().unwrap();
            prop_assert_eq!(again, d);
        }
    }

    /// Every duration the worker can hold prints as text that parses back to it.
    #[test]
    fn durations_round_trip_through_text(ms in any::<u64>()) {
        let d = Duration::from_millis(ms);
        prop_assert_eq!(d.to_string().parse::<Duration>().unwrap(), d);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any text as a manifest: documents or a YAML error, never a panic.
    #[test]
    fn any_text_loads_as_a_manifest_or_an_error(s in any::<String>()) {
        let _ = qc::manifest::load_str(&s);
    }

    /// A valid QueueConsumer with arbitrary values in its fields: a valid document or named field
    /// errors, never a panic; a valid one survives a YAML round trip unchanged.
    #[test]
    fn queue_consumers_with_odd_values_load_or_name_their_errors(
        url in "[ -~]{0,80}",
        p99 in "[0-9a-z]{0,8}",
        concurrency in any::<i64>(),
        batch in any::<i64>(),
        wait in "[0-9a-z]{0,6}",
        min in any::<i32>(),
        max in any::<i32>(),
        on_poison in "[a-zA-Z]{0,12}",
        port in any::<i64>(),
    ) {
        let doc = serde_json::json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1",
            "kind": "QueueConsumer",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {
                "queue": {"url": url},
                "processing": {
                    "p99": p99, "concurrency": concurrency, "batchSize": batch,
                    "waitTime": wait, "onPoison": on_poison
                },
                "scaling": {"minReplicas": min, "maxReplicas": max},
                "handler": {"http": {"port": port, "path": "/m"}},
                "template": {"spec": {"containers": [{"name": "app", "image": "a:1"}]}}
            }
        });
        let text = serde_saphyr::to_string(&doc).unwrap();
        let docs = qc::manifest::load_str(&text).unwrap();
        prop_assert_eq!(docs.len(), 1);
        match &docs[0] {
            qc::manifest::Document::Valid(qc) => {
                let again = serde_saphyr::to_string(&serde_json::to_value(qc.as_ref()).unwrap()).unwrap();
                match &qc::manifest::load_str(&again).unwrap()[0] {
                    qc::manifest::Document::Valid(back) => prop_assert_eq!(back.spec.clone(), qc.spec.clone()),
                    other => prop_assert!(false, "round trip lost validity: {other:?}"),
                }
            }
            qc::manifest::Document::Invalid { errors, .. } => {
                prop_assert!(!errors.is_empty());
                for e in errors {
                    prop_assert!(!e.message.is_empty(), "{e:?}");
                }
            }
            other @ qc::manifest::Document::Other { .. } => prop_assert!(false, "{other:?}"),
        }
    }
}
