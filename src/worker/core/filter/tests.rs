use proptest::prelude::*;
use serde_json::json;

use super::*;

fn filter(patterns: &[Value]) -> Filter {
    let texts: Vec<String> = patterns.iter().map(Value::to_string).collect();
    Filter::parse(&texts).unwrap_or_else(|e| panic!("{e}"))
}

/// A record with this JSON body (and nothing else that matters).
fn body(v: Value) -> Value {
    json!({"messageId": "m-1", "body": v, "attributes": {"ApproximateReceiveCount": "1"}, "messageAttributes": {}})
}

/// The syntax's documented rules, one fact per row: (pattern, record, matches). Written for this
/// table from the rules of Lambda's filter syntax (null, empty, equals, equals-ignore-case, and,
/// or, anything-but, numeric equals and ranges, exists, prefix, suffix, arrays, $or).
#[test]
fn documented_rules_of_the_syntax() {
    let rows: Vec<(Value, Value, bool)> = vec![
        // null matches a null value only, not a missing field nor a string.
        (
            json!({"body": {"user": [null]}}),
            body(json!({"user": null})),
            true,
        ),
        (
            json!({"body": {"user": [null]}}),
            body(json!({"user": "u"})),
            false,
        ),
        (json!({"body": {"user": [null]}}), body(json!({})), false),
        // the empty string matches the empty string.
        (
            json!({"body": {"note": [""]}}),
            body(json!({"note": ""})),
            true,
        ),
        (
            json!({"body": {"note": [""]}}),
            body(json!({"note": " "})),
            false,
        ),
        // equals is exact and case-sensitive.
        (
            json!({"body": {"kind": ["order"]}}),
            body(json!({"kind": "order"})),
            true,
        ),
        (
            json!({"body": {"kind": ["order"]}}),
            body(json!({"kind": "Order"})),
            false,
        ),
        (
            json!({"body": {"kind": [{"equals-ignore-case": "ORDER"}]}}),
            body(json!({"kind": "oRdEr"})),
            true,
        ),
        // a string value never equals a number, and numbers compare by value.
        (json!({"body": {"n": ["5"]}}), body(json!({"n": 5})), false),
        (json!({"body": {"n": [5]}}), body(json!({"n": 5.0})), true),
        (
            json!({"body": {"ok": [true]}}),
            body(json!({"ok": true})),
            true,
        ),
        // fields of one pattern: all must match (and).
        (
            json!({"body": {"city": ["Oslo"], "day": ["Mon"]}}),
            body(json!({"city": "Oslo", "day": "Mon"})),
            true,
        ),
        (
            json!({"body": {"city": ["Oslo"], "day": ["Mon"]}}),
            body(json!({"city": "Oslo", "day": "Tue"})),
            false,
        ),
        // values of one field: any may match (or).
        (
            json!({"body": {"pay": ["card", "cash"]}}),
            body(json!({"pay": "cash"})),
            true,
        ),
        (
            json!({"body": {"pay": ["card", "cash"]}}),
            body(json!({"pay": "iou"})),
            false,
        ),
        // $or across fields.
        (
            json!({"body": {"$or": [{"a": ["1"]}, {"b": ["2"]}]}}),
            body(json!({"b": "2"})),
            true,
        ),
        (
            json!({"body": {"$or": [{"a": ["1"]}, {"b": ["2"]}]}}),
            body(json!({"a": "2", "b": "1"})),
            false,
        ),
        // anything-but: present and not listed; a missing field does not match.
        (
            json!({"body": {"w": [{"anything-but": ["rain"]}]}}),
            body(json!({"w": "sun"})),
            true,
        ),
        (
            json!({"body": {"w": [{"anything-but": ["rain"]}]}}),
            body(json!({"w": "rain"})),
            false,
        ),
        (
            json!({"body": {"w": [{"anything-but": ["rain"]}]}}),
            body(json!({})),
            false,
        ),
        (
            json!({"body": {"w": [{"anything-but": "rain"}]}}),
            body(json!({"w": 3})),
            true,
        ),
        (
            json!({"body": {"w": [{"anything-but": {"prefix": "ra"}}]}}),
            body(json!({"w": "rain"})),
            false,
        ),
        (
            json!({"body": {"w": [{"anything-but": {"suffix": "in"}}]}}),
            body(json!({"w": "sun"})),
            true,
        ),
        // numeric: equals and ranges, numbers only.
        (
            json!({"body": {"p": [{"numeric": ["=", 100]}]}}),
            body(json!({"p": 100})),
            true,
        ),
        (
            json!({"body": {"p": [{"numeric": ["=", 100]}]}}),
            body(json!({"p": "100"})),
            false,
        ),
        (
            json!({"body": {"p": [{"numeric": [">", 10, "<=", 20]}]}}),
            body(json!({"p": 20})),
            true,
        ),
        (
            json!({"body": {"p": [{"numeric": [">", 10, "<=", 20]}]}}),
            body(json!({"p": 10})),
            false,
        ),
        (
            json!({"body": {"p": [{"numeric": ["<", 0]}]}}),
            body(json!({"p": -0.5})),
            true,
        ),
        // exists: true for a present field (even null), false for a missing one.
        (
            json!({"body": {"x": [{"exists": true}]}}),
            body(json!({"x": null})),
            true,
        ),
        (
            json!({"body": {"x": [{"exists": true}]}}),
            body(json!({})),
            false,
        ),
        (
            json!({"body": {"x": [{"exists": false}]}}),
            body(json!({})),
            true,
        ),
        (
            json!({"body": {"x": [{"exists": false}]}}),
            body(json!({"x": 1})),
            false,
        ),
        // prefix and suffix on strings.
        (
            json!({"body": {"r": [{"prefix": "us-"}]}}),
            body(json!({"r": "us-east-1"})),
            true,
        ),
        (
            json!({"body": {"r": [{"prefix": "us-"}]}}),
            body(json!({"r": "eu-west-1"})),
            false,
        ),
        (
            json!({"body": {"f": [{"suffix": ".png"}]}}),
            body(json!({"f": "a.png"})),
            true,
        ),
        (
            json!({"body": {"f": [{"suffix": ".png"}]}}),
            body(json!({"f": 7})),
            false,
        ),
        // an array in the message matches when one element does.
        (
            json!({"body": {"tags": ["red"]}}),
            body(json!({"tags": ["blue", "red"]})),
            true,
        ),
        (
            json!({"body": {"tags": ["red"]}}),
            body(json!({"tags": []})),
            false,
        ),
        (
            json!({"body": {"items": {"sku": ["a"]}}}),
            body(json!({"items": [{"sku": "b"}, {"sku": "a"}]})),
            true,
        ),
        // nested fields.
        (
            json!({"body": {"order": {"total": [{"numeric": [">=", 50]}]}}}),
            body(json!({"order": {"total": 50}})),
            true,
        ),
        (
            json!({"body": {"order": {"total": [{"numeric": [">=", 50]}]}}}),
            body(json!({"order": 50})),
            false,
        ),
        // a body pattern of fields against a plain-text body: no match (Lambda drops it); a plain
        // pattern on a plain body matches.
        (
            json!({"body": {"kind": ["order"]}}),
            body(json!("kind=order")),
            false,
        ),
        (json!({"body": ["hello"]}), body(json!("hello")), true),
        // attributes and message attributes.
        (
            json!({"attributes": {"ApproximateReceiveCount": ["1"]}}),
            body(json!({})),
            true,
        ),
        (
            json!({"messageAttributes": {"tenant": {"stringValue": ["acme"]}}}),
            json!({"body": "x", "messageAttributes": {"tenant": {"stringValue": "acme", "dataType": "String"}}}),
            true,
        ),
        (
            json!({"messageAttributes": {"tenant": {"stringValue": ["acme"]}}}),
            json!({"body": "x", "messageAttributes": {}}),
            false,
        ),
    ];
    for (i, (pattern, record, want)) in rows.iter().enumerate() {
        assert_eq!(
            filter(std::slice::from_ref(pattern)).matches(record),
            *want,
            "row {i}: {pattern} on {record}"
        );
    }
}

#[test]
fn several_patterns_match_when_any_does() {
    let f = filter(&[
        json!({"body": {"kind": ["order"]}}),
        json!({"messageAttributes": {"priority": {"stringValue": ["high"]}}}),
    ]);
    assert!(f.matches(&body(json!({"kind": "order"}))));
    assert!(f.matches(&json!({"body": "x", "messageAttributes": {"priority": {"stringValue": "high", "dataType": "String"}}})));
    assert!(!f.matches(&body(json!({"kind": "refund"}))));
}

/// Each refusal names the pattern and where in it: a line and column for text that is not JSON, the
/// field path for a wrong operator or value.
#[test]
fn invalid_patterns_are_refused_with_their_position() {
    let cases: [(&str, &str, &str); 14] = [
        (
            r#"{"body": {"kind": ["order"]}"#,
            "at line 1 column 28",
            "not JSON",
        ),
        (
            "{\n  \"body\": {\"kind\": [\"order\",]}\n}",
            "at line 2 column",
            "not JSON",
        ),
        (r#"["order"]"#, "at the top", "JSON object"),
        ("{}", "at the top", "empty pattern"),
        (
            r#"{"bdy": {"kind": ["order"]}}"#,
            "at bdy",
            "unknown record field",
        ),
        (
            r#"{"body": {"kind": "order"}}"#,
            "at body.kind",
            "in an array",
        ),
        (r#"{"body": {"kind": []}}"#, "at body.kind", "empty array"),
        (
            r#"{"body": {"kind": [{"prefx": "o"}]}}"#,
            "at body.kind[0].prefx",
            "unknown operator",
        ),
        (
            r#"{"body": {"kind": ["a", {"prefix": 1}]}}"#,
            "at body.kind[1].prefix",
            "takes a string",
        ),
        (
            r#"{"body": {"n": [{"numeric": [">", "1"]}]}}"#,
            "at body.n[0].numeric",
            "pair 0",
        ),
        (
            r#"{"body": {"n": [{"numeric": [">", 5, "<", 1]}]}}"#,
            "at body.n[0].numeric",
            "not below",
        ),
        (
            r#"{"body": {"n": [{"numeric": [">", 1, ">", 2]}]}}"#,
            "at body.n[0].numeric",
            "at most one lower",
        ),
        (
            r#"{"body": {"n": [{"exists": "yes"}]}}"#,
            "at body.n[0].exists",
            "true or false",
        ),
        (
            r#"{"body": {"$or": [{"a": ["1"]}]}}"#,
            "at body.$or",
            "at least two",
        ),
    ];
    for (text, at, problem) in cases {
        let e = Filter::parse(&["{\"body\": [\"ok\"]}", text]).expect_err(text);
        assert_eq!(e.index, 1, "{text}");
        assert!(e.at.contains(at), "{text}: {e}");
        assert!(e.problem.contains(problem), "{text}: {e}");
    }
    let many: Vec<String> = (0..=MAX_PATTERNS)
        .map(|_| "{\"body\": [\"x\"]}".to_string())
        .collect();
    assert!(Filter::parse(&many).is_err());
}

#[test]
fn the_record_is_lambdas_shape_and_only_a_too_deep_body_is_undecided() {
    use crate::worker::sqs::{AttributeValue, Message};
    let msg = Message {
        group_id: Some("g-1".into()),
        attributes: vec![(
            "tenant".into(),
            AttributeValue {
                data_type: "String".into(),
                string: Some("acme".into()),
                binary: None,
            },
        )],
        ..Message::test(br#"{"kind":"order"}"#)
    };
    let r = record(&msg).unwrap();
    assert_eq!(r["body"]["kind"], "order");
    assert_eq!(r["attributes"]["MessageGroupId"], "g-1");
    assert_eq!(r["attributes"]["ApproximateReceiveCount"], "1");
    assert_eq!(r["messageAttributes"]["tenant"]["stringValue"], "acme");
    let f = filter(&[json!({"body": {"kind": ["order"]}})]);
    assert_eq!(f.screen(&msg), Screen::Pass);
    assert_eq!(f.screen(&Message::test(b"plain")), Screen::NoMatch);
    let deep: &'static [u8] = Box::leak("[".repeat(1000).into_bytes().into_boxed_slice());
    assert!(matches!(
        f.screen(&Message::test(deep)),
        Screen::Undecided(_)
    ));
}

fn word() -> impl Strategy<Value = String> {
    "[a-c]{0,4}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// prefix, suffix, equals and equals-ignore-case agree with the string functions they name, and
    /// anything-but with "not any of".
    #[test]
    fn string_tests_agree_with_their_definition(v in word(), p in word(), q in word()) {
        let rec = body(json!({"s": v}));
        let one = |t: Value| filter(&[json!({"body": {"s": [t]}})]).matches(&rec);
        prop_assert_eq!(one(json!({"prefix": p})), v.starts_with(&p));
        prop_assert_eq!(one(json!({"suffix": p})), v.ends_with(&p));
        prop_assert_eq!(one(json!(p)), v == p);
        prop_assert_eq!(one(json!({"equals-ignore-case": p.to_uppercase()})), v == p);
        prop_assert_eq!(one(json!({"anything-but": [p, q]})), v != p && v != q);
        prop_assert_eq!(one(json!({"anything-but": {"prefix": p}})), !v.starts_with(&p));
    }

    /// A numeric range matches exactly the numbers within its bounds.
    #[test]
    fn numeric_ranges_agree_with_comparison(x in -50i32..50, lo in -50i32..50, width in 1i32..40, li: bool, ui: bool) {
        let hi = lo + width;
        let (lop, uop) = (if li { ">=" } else { ">" }, if ui { "<=" } else { "<" });
        let f = filter(&[json!({"body": {"n": [{"numeric": [lop, lo, uop, hi]}]}})]);
        let want = (if li { x >= lo } else { x > lo }) && (if ui { x <= hi } else { x < hi });
        prop_assert_eq!(f.matches(&body(json!({"n": x}))), want);
        prop_assert_eq!(f.matches(&body(json!({"n": x.to_string()}))), false, "a string is no number");
    }

    /// Several patterns match exactly when one of them does; exists true and false split every record.
    #[test]
    fn patterns_or_together_and_exists_splits(a in word(), b in word(), v in proptest::option::of(word())) {
        let rec = body(match &v { Some(s) => json!({"s": s}), None => json!({}) });
        let pa = json!({"body": {"s": [a]}});
        let pb = json!({"body": {"s": [{"prefix": b}]}});
        let both = filter(&[pa.clone(), pb.clone()]).matches(&rec);
        prop_assert_eq!(both, filter(&[pa]).matches(&rec) || filter(&[pb]).matches(&rec));
        let yes = filter(&[json!({"body": {"s": [{"exists": true}]}})]).matches(&rec);
        let no = filter(&[json!({"body": {"s": [{"exists": false}]}})]).matches(&rec);
        prop_assert!(yes != no);
        prop_assert_eq!(yes, v.is_some());
    }

    /// Any body, JSON or not: the screen answers Pass or NoMatch, never panics.
    #[test]
    fn any_body_gets_a_clean_answer(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let f = filter(&[json!({"body": {"kind": ["order"]}}), json!({"body": [{"prefix": "a"}]})]);
        let msg = crate::worker::sqs::Message { body: bytes::Bytes::from(bytes), ..crate::worker::sqs::Message::test(b"") };
        prop_assert!(matches!(f.screen(&msg), Screen::Pass | Screen::NoMatch));
    }
}
