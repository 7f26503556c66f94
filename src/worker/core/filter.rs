//! `spec.filter.patterns`: Lambda's FilterCriteria pattern syntax over a message's record (its body as
//! JSON, its attributes, its message attributes). Pure: patterns are parsed once, a message is matched
//! with no I/O; the worker deletes what no pattern matches, and only a clean non-match.

use serde_json::{Map, Value};

use crate::worker::sqs::Message;

/// Most patterns one filter may hold (Lambda's limit per event source mapping, raised).
pub const MAX_PATTERNS: usize = 10;

/// Top-level fields of the record a pattern may name: Lambda's SQS record. Any other is refused, so a
/// typo (`bdy`) cannot make every message a non-match and delete it.
const RECORD_FIELDS: [&str; 8] = [
    "body",
    "attributes",
    "messageAttributes",
    "messageId",
    "md5OfBody",
    "eventSource",
    "eventSourceARN",
    "awsRegion",
];

/// Why a pattern is refused: which one, where in it, what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("filter pattern {index} {at}: {problem}")]
pub struct PatternError {
    /// Its place in the list, from 0.
    pub index: usize,
    /// Where: `at line L column C` (not JSON) or `at body.amount[1]` (a field of the pattern).
    pub at: String,
    pub problem: String,
}

/// One value test of a field (an entry of a pattern's array).
#[derive(Clone, Debug, PartialEq)]
enum Test {
    /// A string, number, boolean or null, equal to the field's value (numbers numerically).
    Equals(Value),
    EqualsIgnoreCase(String),
    Prefix(String),
    Suffix(String),
    /// Present and none of these (strings and numbers), nor any given prefix or suffix.
    AnythingBut(Vec<Value>),
    AnythingButPrefix(String),
    AnythingButSuffix(String),
    /// A number within the bounds: (lower, inclusive), (upper, inclusive).
    Numeric {
        lower: Option<(f64, bool)>,
        upper: Option<(f64, bool)>,
    },
    Exists(bool),
}

/// A pattern object: every field must match (AND), and one of each `$or` list.
#[derive(Clone, Debug, PartialEq)]
struct Node {
    fields: Vec<(String, Field)>,
    ors: Vec<Vec<Node>>,
}

#[derive(Clone, Debug, PartialEq)]
enum Field {
    /// A nested object pattern.
    Object(Node),
    /// Any one of these tests (OR).
    Tests(Vec<Test>),
}

/// Parsed patterns: a message passes when any matches (OR across patterns).
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    patterns: Vec<Node>,
}

/// What the filter says of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Screen {
    /// A pattern matches: the message goes on to the handler.
    Pass,
    /// No pattern matches (a clean answer): the message is deleted without a call, as Lambda does.
    NoMatch,
    /// The record could not be built (a body the JSON parser gave up on for its depth): never a
    /// reason to delete; the message goes on to the handler.
    Undecided(String),
}

impl Filter {
    /// Parses `patterns` (each a JSON object in Lambda's syntax); the error names the pattern and the
    /// position of what is wrong.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Filter, PatternError> {
        if patterns.len() > MAX_PATTERNS {
            return Err(PatternError {
                index: MAX_PATTERNS,
                at: "in the list".into(),
                problem: format!(
                    "at most {MAX_PATTERNS} patterns; join patterns with $or or list more values per field"
                ),
            });
        }
        let patterns = patterns
            .iter()
            .enumerate()
            .map(|(index, text)| parse_one(index, text.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Filter { patterns })
    }

    pub fn len(&self) -> usize {
        self.patterns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Matches a record (Lambda's SQS record shape, `record`).
    pub fn matches(&self, record: &Value) -> bool {
        self.patterns.iter().any(|p| node_matches(p, record))
    }

    /// The decision for a message: its record matched against the patterns.
    pub fn screen(&self, msg: &Message) -> Screen {
        match record(msg) {
            Ok(r) if self.matches(&r) => Screen::Pass,
            Ok(_) => Screen::NoMatch,
            Err(reason) => Screen::Undecided(reason),
        }
    }
}

fn parse_one(index: usize, text: &str) -> Result<Node, PatternError> {
    let err = |at: String, problem: String| PatternError { index, at, problem };
    let value: Value = serde_json::from_str(text).map_err(|e| {
        err(
            format!("at line {} column {}", e.line(), e.column()),
            format!("not JSON: {e}"),
        )
    })?;
    let Value::Object(map) = &value else {
        return Err(err(
            "at the top".into(),
            "a pattern is a JSON object, e.g. {\"body\": {\"type\": [\"order\"]}}".into(),
        ));
    };
    if map.is_empty() {
        return Err(err(
            "at the top".into(),
            "an empty pattern; name at least one field, e.g. {\"body\": {\"type\": [\"order\"]}}"
                .into(),
        ));
    }
    for key in map.keys() {
        if key != "$or" && !RECORD_FIELDS.contains(&key.as_str()) {
            return Err(err(
                format!("at {key}"),
                format!(
                    "unknown record field {key:?}: use one of {} (a misspelt field would match no message, and every message would be deleted)",
                    RECORD_FIELDS.join(", ")
                ),
            ));
        }
    }
    parse_node(map, "").map_err(|(at, problem)| err(format!("at {at}"), problem))
}

type Problem = (String, String);

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn parse_node(map: &Map<String, Value>, path: &str) -> Result<Node, Problem> {
    let mut node = Node {
        fields: Vec::new(),
        ors: Vec::new(),
    };
    for (key, v) in map {
        let at = join(path, key);
        if key == "$or" {
            let Value::Array(alts) = v else {
                return Err((
                    at,
                    "$or takes an array of at least two pattern objects".into(),
                ));
            };
            if alts.len() < 2 {
                return Err((
                    at,
                    "$or takes an array of at least two pattern objects".into(),
                ));
            }
            let mut list = Vec::with_capacity(alts.len());
            for (i, alt) in alts.iter().enumerate() {
                let at = format!("{at}[{i}]");
                match alt {
                    Value::Object(m) if !m.is_empty() => list.push(parse_node(m, &at)?),
                    _ => return Err((at, "each $or entry is a non-empty pattern object".into())),
                }
            }
            node.ors.push(list);
            continue;
        }
        let field = match v {
            Value::Object(m) if m.is_empty() => {
                return Err((
                    at,
                    "an empty object matches nothing; give fields or an array of values".into(),
                ));
            }
            Value::Object(m) => Field::Object(parse_node(m, &at)?),
            Value::Array(tests) if tests.is_empty() => {
                return Err((
                    at,
                    "an empty array matches nothing; list at least one value".into(),
                ));
            }
            Value::Array(tests) => Field::Tests(
                tests
                    .iter()
                    .enumerate()
                    .map(|(i, t)| parse_test(t, &format!("{at}[{i}]")))
                    .collect::<Result<_, _>>()?,
            ),
            _ => {
                return Err((at, format!("a field's values go in an array, e.g. [{v}]")));
            }
        };
        node.fields.push((key.clone(), field));
    }
    Ok(node)
}

fn parse_test(t: &Value, at: &str) -> Result<Test, Problem> {
    let problem = |p: &str| Err((at.to_string(), p.to_string()));
    let Value::Object(m) = t else {
        return match t {
            Value::Array(_) => problem("a value inside a field's array cannot be an array"),
            v => Ok(Test::Equals(v.clone())),
        };
    };
    if m.len() != 1 {
        return problem(
            "an operator object holds exactly one operator, e.g. {\"prefix\": \"ord\"}",
        );
    }
    let Some((op, arg)) = m.iter().next() else {
        return problem("an empty operator object");
    };
    let at = format!("{at}.{op}");
    let text = |what: &str| -> Result<String, Problem> {
        match arg {
            Value::String(s) => Ok(s.clone()),
            _ => Err((at.clone(), format!("{what} takes a string"))),
        }
    };
    match op.as_str() {
        "prefix" => Ok(Test::Prefix(text("prefix")?)),
        "suffix" => Ok(Test::Suffix(text("suffix")?)),
        "equals-ignore-case" => Ok(Test::EqualsIgnoreCase(text("equals-ignore-case")?)),
        "exists" => match arg {
            Value::Bool(b) => Ok(Test::Exists(*b)),
            _ => Err((at, "exists takes true or false".into())),
        },
        "anything-but" => parse_anything_but(arg, &at),
        "numeric" => parse_numeric(arg, &at),
        other => Err((
            at,
            format!(
                "unknown operator {other:?}: use prefix, suffix, equals-ignore-case, anything-but, numeric or exists"
            ),
        )),
    }
}

fn parse_anything_but(arg: &Value, at: &str) -> Result<Test, Problem> {
    let scalar = |v: &Value| matches!(v, Value::String(_) | Value::Number(_));
    match arg {
        v if scalar(v) => Ok(Test::AnythingBut(vec![v.clone()])),
        Value::Array(vs) if !vs.is_empty() && vs.iter().all(scalar) => {
            Ok(Test::AnythingBut(vs.clone()))
        }
        Value::Object(m) if m.len() == 1 => match m.iter().next() {
            Some((k, Value::String(s))) if k == "prefix" => Ok(Test::AnythingButPrefix(s.clone())),
            Some((k, Value::String(s))) if k == "suffix" => Ok(Test::AnythingButSuffix(s.clone())),
            _ => Err((
                at.to_string(),
                "anything-but takes a string, a number, a non-empty array of them, or {\"prefix\": \"...\"} or {\"suffix\": \"...\"}".into(),
            )),
        },
        _ => Err((
            at.to_string(),
            "anything-but takes a string, a number, a non-empty array of them, or {\"prefix\": \"...\"} or {\"suffix\": \"...\"}".into(),
        )),
    }
}

fn parse_numeric(arg: &Value, at: &str) -> Result<Test, Problem> {
    let bad = |p: String| Err((at.to_string(), p));
    let Value::Array(items) = arg else {
        return bad("numeric takes an array such as [\">\", 0, \"<=\", 5] or [\"=\", 100]".into());
    };
    if items.is_empty() || items.len() % 2 != 0 || items.len() > 4 {
        return bad(
            "numeric takes one or two (operator, number) pairs, such as [\">\", 0, \"<=\", 5]"
                .into(),
        );
    }
    let mut lower = None;
    let mut upper = None;
    for (i, pair) in items.chunks(2).enumerate() {
        let (Some(Value::String(op)), Some(Value::Number(n))) = (pair.first(), pair.get(1)) else {
            return bad(format!(
                "pair {i} must be an operator string then a number, e.g. \">=\", 10"
            ));
        };
        let Some(n) = n.as_f64().filter(|f| f.is_finite()) else {
            return bad(format!("pair {i}: the number is out of range"));
        };
        let slot = match op.as_str() {
            ">" => (&mut lower, (n, false)),
            ">=" => (&mut lower, (n, true)),
            "<" => (&mut upper, (n, false)),
            "<=" => (&mut upper, (n, true)),
            "=" if items.len() == 2 => {
                return Ok(Test::Numeric {
                    lower: Some((n, true)),
                    upper: Some((n, true)),
                });
            }
            "=" => return bad("\"=\" stands alone: [\"=\", 100]".into()),
            other => {
                return bad(format!(
                    "unknown numeric operator {other:?}: use <, <=, >, >= or ="
                ));
            }
        };
        if slot.0.is_some() {
            return bad(
                "give at most one lower bound (> or >=) and one upper bound (< or <=)".into(),
            );
        }
        *slot.0 = Some(slot.1);
    }
    if let (Some((lo, _)), Some((hi, _))) = (lower, upper)
        && lo >= hi
    {
        return bad(format!(
            "the lower bound {lo} is not below the upper bound {hi}: no number matches"
        ));
    }
    Ok(Test::Numeric { lower, upper })
}

fn node_matches(node: &Node, value: &Value) -> bool {
    let Value::Object(map) = value else {
        return false;
    };
    node.fields
        .iter()
        .all(|(key, field)| field_matches(field, map.get(key)))
        && node
            .ors
            .iter()
            .all(|alts| alts.iter().any(|n| node_matches(n, value)))
}

fn field_matches(field: &Field, value: Option<&Value>) -> bool {
    match field {
        // A nested pattern: an object, or an array with one object matching.
        Field::Object(node) => match value {
            Some(Value::Array(items)) => items.iter().any(|v| node_matches(node, v)),
            Some(v) => node_matches(node, v),
            None => false,
        },
        Field::Tests(tests) => tests.iter().any(|t| test_matches(t, value)),
    }
}

fn test_matches(test: &Test, value: Option<&Value>) -> bool {
    match (test, value) {
        (Test::Exists(want), v) => *want == v.is_some(),
        (_, None) => false,
        // An array field matches when one of its elements does.
        (t, Some(Value::Array(items))) => items.iter().any(|v| scalar_matches(t, v)),
        (t, Some(v)) => scalar_matches(t, v),
    }
}

fn scalar_matches(test: &Test, v: &Value) -> bool {
    match test {
        Test::Exists(want) => *want,
        Test::Equals(want) => equal(want, v),
        Test::EqualsIgnoreCase(s) => v
            .as_str()
            .is_some_and(|x| x.to_lowercase() == s.to_lowercase()),
        Test::Prefix(p) => v.as_str().is_some_and(|x| x.starts_with(p.as_str())),
        Test::Suffix(p) => v.as_str().is_some_and(|x| x.ends_with(p.as_str())),
        Test::AnythingBut(not) => {
            matches!(v, Value::String(_) | Value::Number(_)) && !not.iter().any(|n| equal(n, v))
        }
        Test::AnythingButPrefix(p) => v.as_str().is_some_and(|x| !x.starts_with(p.as_str())),
        Test::AnythingButSuffix(p) => v.as_str().is_some_and(|x| !x.ends_with(p.as_str())),
        Test::Numeric { lower, upper } => v.as_f64().is_some_and(|x| {
            lower.is_none_or(|(lo, incl)| if incl { x >= lo } else { x > lo })
                && upper.is_none_or(|(hi, incl)| if incl { x <= hi } else { x < hi })
        }),
    }
}

/// Equal values: numbers by value (`1` and `1.0`), everything else exactly.
fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// The message as Lambda's SQS record: `body` parsed when it is JSON (else the text),
/// `attributes` the system attributes the worker reads (strings, as Lambda gives them),
/// `messageAttributes` as `{stringValue | binaryValue (base64), dataType}`. Err only for a body the
/// JSON parser gave up on for its depth, which is neither JSON nor plain text to match.
pub fn record(msg: &Message) -> Result<Value, String> {
    use base64::Engine as _;
    let text = String::from_utf8_lossy(&msg.body);
    let body = match serde_json::from_str::<Value>(&text) {
        Ok(v) => v,
        Err(e) if e.to_string().contains("recursion limit") => {
            return Err(format!(
                "the body nests too deeply for the filter to read ({e})"
            ));
        }
        Err(_) => Value::String(text.into_owned()),
    };
    let mut attributes = Map::new();
    attributes.insert(
        "ApproximateReceiveCount".into(),
        Value::String(msg.receive_count.to_string()),
    );
    let put = |m: &mut Map<String, Value>, k: &str, v: Option<String>| {
        if let Some(v) = v {
            m.insert(k.into(), Value::String(v));
        }
    };
    put(
        &mut attributes,
        "SentTimestamp",
        msg.sent_timestamp.map(|t| t.to_string()),
    );
    put(
        &mut attributes,
        "ApproximateFirstReceiveTimestamp",
        msg.first_receive_timestamp.map(|t| t.to_string()),
    );
    put(&mut attributes, "MessageGroupId", msg.group_id.clone());
    put(
        &mut attributes,
        "MessageDeduplicationId",
        msg.deduplication_id.clone(),
    );
    put(
        &mut attributes,
        "SequenceNumber",
        msg.sequence_number.clone(),
    );
    put(&mut attributes, "AWSTraceHeader", msg.trace_header.clone());
    let mut message_attributes = Map::new();
    for (name, a) in &msg.attributes {
        let mut m = Map::new();
        if let Some(s) = &a.string {
            m.insert("stringValue".into(), Value::String(s.clone()));
        }
        if let Some(b) = &a.binary {
            m.insert(
                "binaryValue".into(),
                Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
            );
        }
        m.insert("dataType".into(), Value::String(a.data_type.clone()));
        message_attributes.insert(name.clone(), Value::Object(m));
    }
    let mut r = Map::new();
    r.insert("messageId".into(), Value::String(msg.id.clone()));
    r.insert("body".into(), body);
    r.insert("attributes".into(), Value::Object(attributes));
    r.insert(
        "messageAttributes".into(),
        Value::Object(message_attributes),
    );
    r.insert("eventSource".into(), Value::String("aws:sqs".into()));
    Ok(Value::Object(r))
}

#[cfg(test)]
mod tests;
