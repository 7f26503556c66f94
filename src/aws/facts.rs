//! What the rules and the controller know about a queue, parsed from SQS attributes.
//! Pure: the same parser serves `check --attributes FILE` and the live adapter.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::api::Duration;

/// Facts about one SQS queue, from GetQueueAttributes(All).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueFacts {
    pub url: String,
    pub arn: Option<String>,
    pub visibility_timeout: Duration,
    pub retention: Duration,
    pub fifo: bool,
    pub redrive: Option<RedrivePolicy>,
    pub visible: Option<i64>,
    pub in_flight: Option<i64>,
    pub delayed: Option<i64>,
}

/// The queue's RedrivePolicy attribute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedrivePolicy {
    pub dead_letter_target_arn: String,
    pub max_receive_count: u32,
}

/// What was found at the redrive target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum DeadLetterFacts {
    /// The source queue has no redrive policy.
    None,
    /// The policy names a queue that does not exist.
    Missing { arn: String },
    /// The DLQ could not be read (permissions, network); its health is unknown.
    Unreachable { arn: String, error: String },
    /// The DLQ exists; `oldest_age` comes from CloudWatch when available.
    Found {
        queue: QueueFacts,
        oldest_age_seconds: Option<i64>,
    },
    /// Offline: nothing is known about the DLQ (e.g. `--attributes` without one for it).
    NotRead { arn: String },
}

/// Everything observed for one QueueConsumer: the source queue and its DLQ.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Facts {
    pub queue: QueueFacts,
    pub dead_letter: DeadLetterFacts,
    /// The source queue's ApproximateAgeOfOldestMessage from CloudWatch, when read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_age_seconds: Option<i64>,
}

/// Why queue attributes could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FactsError {
    #[error("attribute {name} is missing")]
    Missing { name: &'static str },
    #[error("attribute {name} has value {value:?}, expected {expected}")]
    Invalid {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
}

pub const ATTR_VISIBILITY_TIMEOUT: &str = "VisibilityTimeout";
pub const ATTR_RETENTION: &str = "MessageRetentionPeriod";
pub const ATTR_REDRIVE_POLICY: &str = "RedrivePolicy";
pub const ATTR_FIFO: &str = "FifoQueue";
pub const ATTR_ARN: &str = "QueueArn";
pub const ATTR_VISIBLE: &str = "ApproximateNumberOfMessages";
pub const ATTR_IN_FLIGHT: &str = "ApproximateNumberOfMessagesNotVisible";
pub const ATTR_DELAYED: &str = "ApproximateNumberOfMessagesDelayed";

/// SQS's documented defaults, used when an attribute is absent (some emulators omit them).
const DEFAULT_VISIBILITY_TIMEOUT_SECS: u64 = 30;
const DEFAULT_RETENTION_SECS: u64 = 4 * 24 * 3600;

impl QueueFacts {
    /// Parse the attribute map of GetQueueAttributes(All).
    pub fn from_attributes(url: &str, attrs: &HashMap<String, String>) -> Result<Self, FactsError> {
        let secs = |name: &'static str, default: u64| -> Result<Duration, FactsError> {
            match attrs.get(name) {
                None => Ok(Duration::from_secs(default)),
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .map(Duration::from_secs)
                    .map_err(|_| FactsError::Invalid {
                        name,
                        value: v.clone(),
                        expected: "whole seconds",
                    }),
            }
        };
        let count = |name: &'static str| -> Result<Option<i64>, FactsError> {
            attrs
                .get(name)
                .map(|v| {
                    v.trim().parse::<i64>().map_err(|_| FactsError::Invalid {
                        name,
                        value: v.clone(),
                        expected: "a whole number",
                    })
                })
                .transpose()
        };
        let fifo = match attrs.get(ATTR_FIFO).map(|v| v.trim().to_ascii_lowercase()) {
            None => is_fifo(url),
            Some(v) if v == "true" => true,
            Some(v) if v == "false" => false,
            Some(v) => {
                return Err(FactsError::Invalid {
                    name: ATTR_FIFO,
                    value: v,
                    expected: "true or false",
                });
            }
        };
        let redrive = attrs
            .get(ATTR_REDRIVE_POLICY)
            .filter(|v| !v.trim().is_empty())
            .map(|v| parse_redrive_policy(v))
            .transpose()?;
        Ok(QueueFacts {
            url: url.to_string(),
            arn: attrs.get(ATTR_ARN).cloned(),
            visibility_timeout: secs(ATTR_VISIBILITY_TIMEOUT, DEFAULT_VISIBILITY_TIMEOUT_SECS)?,
            retention: secs(ATTR_RETENTION, DEFAULT_RETENTION_SECS)?,
            fifo,
            redrive,
            visible: count(ATTR_VISIBLE)?,
            in_flight: count(ATTR_IN_FLIGHT)?,
            delayed: count(ATTR_DELAYED)?,
        })
    }
}

/// Parse a RedrivePolicy JSON string. maxReceiveCount arrives as a number from some servers and a
/// string from others: both are accepted.
pub fn parse_redrive_policy(raw: &str) -> Result<RedrivePolicy, FactsError> {
    let invalid = |expected| FactsError::Invalid {
        name: ATTR_REDRIVE_POLICY,
        value: raw.to_string(),
        expected,
    };
    let v: serde_json::Value = serde_json::from_str(raw).map_err(|_| invalid("a JSON object"))?;
    let arn = v
        .get("deadLetterTargetArn")
        .and_then(|a| a.as_str())
        .filter(|a| !a.is_empty())
        .ok_or_else(|| invalid("a JSON object with deadLetterTargetArn"))?;
    let count = match v.get("maxReceiveCount") {
        Some(serde_json::Value::Number(n)) => n.as_u64(),
        Some(serde_json::Value::String(s)) => s.trim().parse::<u64>().ok(),
        _ => None,
    }
    .and_then(|n| u32::try_from(n).ok())
    .filter(|n| *n >= 1)
    .ok_or_else(|| invalid("maxReceiveCount as a positive whole number"))?;
    Ok(RedrivePolicy {
        dead_letter_target_arn: arn.to_string(),
        max_receive_count: count,
    })
}

/// The parts of an SQS queue ARN (`arn:aws:sqs:REGION:ACCOUNT:NAME`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueArn {
    pub partition: String,
    pub region: String,
    pub account: String,
    pub name: String,
}

impl QueueArn {
    pub fn parse(arn: &str) -> Option<QueueArn> {
        let parts: Vec<&str> = arn.split(':').collect();
        match parts.as_slice() {
            ["arn", partition, "sqs", region, account, name]
                if !partition.is_empty()
                    && !region.is_empty()
                    && !account.is_empty()
                    && !name.is_empty() =>
            {
                Some(QueueArn {
                    partition: partition.to_string(),
                    region: region.to_string(),
                    account: account.to_string(),
                    name: name.to_string(),
                })
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for QueueArn {
    /// The ARN text again, so a parsed ARN can be reported and looked up as the user wrote it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "arn:{}:sqs:{}:{}:{}",
            self.partition, self.region, self.account, self.name
        )
    }
}

/// The region in a queue URL's host, if it names one: `sqs.REGION.…` (AWS's hosts, their
/// dual-stack `sqs.REGION.api.aws`, and LocalStack's `sqs.REGION.localhost.localstack.cloud`) or the
/// legacy `REGION.queue.amazonaws.com`. None for other hosts (`localhost:4566`, an IP address): the
/// region then comes from `--region`/`spec.queue.region` or the SDK's environment.
pub fn region_from_url(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split(['/', ':', '?', '#']).next()?;
    let labels: Vec<&str> = host.split('.').collect();
    let region = match labels.as_slice() {
        ["sqs", region, _, ..] | [region, "queue", "amazonaws", ..] => *region,
        _ => return None,
    };
    looks_like_region(region).then(|| region.to_string())
}

/// `us-east-1`, `cn-north-1`, `us-gov-west-1`: the form the CRD's rule on `spec.queue.region`
/// accepts (`^[a-z]{2}(-[a-z]+)+-[0-9]+$`).
fn looks_like_region(label: &str) -> bool {
    let parts: Vec<&str> = label.split('-').collect();
    let lower = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase());
    match parts.as_slice() {
        [first, middle @ .., last] if !middle.is_empty() => {
            first.len() == 2
                && lower(first)
                && middle.iter().all(lower)
                && !last.is_empty()
                && last.bytes().all(|b| b.is_ascii_digit())
        }
        _ => false,
    }
}

/// The region a client of the queue at `url` uses: the one given, else the one in the URL. The
/// controller (the rendered `--region`, `check`) and `qc-worker` both resolve it here.
pub fn queue_region(given: Option<&str>, url: &str) -> Option<String> {
    given.map(str::to_string).or_else(|| region_from_url(url))
}

/// A queue URL names a FIFO queue when its name ends in `.fifo` (SQS requires it).
pub fn is_fifo(url: &str) -> bool {
    // SQS names are case-sensitive and the suffix is lowercase: `.FIFO` is not a FIFO queue.
    #[allow(clippy::case_sensitive_file_extension_comparisons)]
    url.trim_end_matches('/').ends_with(".fifo")
}

/// A queue's name from its URL: the last path segment (`…/ACCOUNT/NAME` → `NAME`).
pub fn queue_name_from_url(url: &str) -> &str {
    url.trim_end_matches('/').rsplit('/').next().unwrap_or(url)
}

/// A queue's identity: SQS names a queue by account, region and name. The URL's host does not
/// (`sqs.REGION.amazonaws.com` and `REGION.queue.amazonaws.com` are one queue) and, behind an
/// endpoint override, does not even name the region: one URL then names a queue per region, and the
/// region the client signs for picks it. What the controller shares between QueueConsumers (the
/// facts cache) is keyed by this, never by the URL alone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QueueId {
    /// The region the queue's clients use ([`queue_region`]); None: the SDK's environment decides.
    pub region: Option<String>,
    /// The account: the URL path's segment before the name (`…/ACCOUNT/NAME`).
    pub account: String,
    pub name: String,
}

impl QueueId {
    /// The queue a client in `region` reaches at `url`.
    pub fn of(region: Option<&str>, url: &str) -> QueueId {
        let path = url.split_once("://").map_or(url, |(_, r)| r);
        let path = path.split(['?', '#']).next().unwrap_or(path);
        let mut segments = path.trim_end_matches('/').rsplit('/');
        let name = segments.next().unwrap_or_default().to_string();
        // The host when the path has one segment only: no account to tell queues apart by.
        let account = match (segments.next(), segments.next()) {
            (Some(account), Some(_)) => account.to_string(),
            _ => String::new(),
        };
        QueueId {
            region: region.map(str::to_string),
            account,
            name,
        }
    }
}

/// A region given beside a queue URL that names another one: the client would sign for one region
/// and the URL names a queue of the other, so which queue is meant is unknown. `(given, in the URL)`.
pub fn region_contradiction(given: Option<&str>, url: &str) -> Option<(String, String)> {
    let given = given?;
    let in_url = region_from_url(url)?;
    (given != in_url).then(|| (given.to_string(), in_url))
}

impl QueueFacts {
    /// The queue's name (the CloudWatch `QueueName` dimension): from its ARN, else its URL.
    pub fn name(&self) -> String {
        self.arn
            .as_deref()
            .and_then(QueueArn::parse)
            .map_or_else(|| queue_name_from_url(&self.url).to_string(), |a| a.name)
    }
}

/// Queue URLs and the region each names, shared by the tests of every caller of [`queue_region`].
#[cfg(test)]
pub(crate) const REGION_CASES: &[(&str, Option<&str>)] = &[
    ("https://sqs.us-east-1.amazonaws.com/1/q", Some("us-east-1")),
    (
        "https://sqs.eu-west-1.amazonaws.com:443/1/q",
        Some("eu-west-1"),
    ),
    (
        "https://us-west-2.queue.amazonaws.com/1/q",
        Some("us-west-2"),
    ),
    (
        "https://sqs.cn-north-1.amazonaws.com.cn/1/q",
        Some("cn-north-1"),
    ),
    (
        "https://sqs.us-gov-west-1.amazonaws.com/1/q",
        Some("us-gov-west-1"),
    ),
    ("https://sqs.eu-central-1.api.aws/1/q", Some("eu-central-1")),
    (
        "http://sqs.us-east-1.localhost.localstack.cloud:4566/000000000000/q",
        Some("us-east-1"),
    ),
    ("sqs.ap-south-1.amazonaws.com/1/q", Some("ap-south-1")),
    ("http://localhost:4566/000000000000/q", None),
    ("localhost:4566/000000000000/q", None),
    ("http://127.0.0.1:4566/000/q", None),
    ("http://sqs.local-stack:4566/1/q", None),
    ("http://sqs.a-1.example:4566/1/q", None),
    ("http://sqs.us-east-1a.example/1/q", None),
    ("http://sqs:9324/queue/q", None),
    ("https://queue.amazonaws.com/1/q", None),
    ("", None),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn redrive_count_as_string_or_number() {
        let s = parse_redrive_policy(
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:dlq","maxReceiveCount":"5"}"#,
        )
        .unwrap();
        let n = parse_redrive_policy(
            r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:dlq","maxReceiveCount":5}"#,
        )
        .unwrap();
        assert_eq!(s, n);
        assert_eq!(s.max_receive_count, 5);
        for bad in [
            r#"{"maxReceiveCount":5}"#,
            r#"{"deadLetterTargetArn":"x","maxReceiveCount":"five"}"#,
            "nope",
            r#"{"deadLetterTargetArn":"x","maxReceiveCount":0}"#,
        ] {
            assert!(parse_redrive_policy(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn facts_from_attributes() {
        let f = QueueFacts::from_attributes(
            "https://sqs.us-east-1.amazonaws.com/1/q.fifo",
            &attrs(&[
                ("VisibilityTimeout", "45"),
                ("MessageRetentionPeriod", "345600"),
                ("FifoQueue", "true"),
                ("ApproximateNumberOfMessages", "7"),
                ("ApproximateNumberOfMessagesNotVisible", "2"),
                ("RedrivePolicy", r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:d.fifo","maxReceiveCount":3}"#),
            ]),
        )
        .unwrap();
        assert_eq!(f.visibility_timeout, Duration::from_secs(45));
        assert!(f.fifo);
        assert_eq!(f.visible, Some(7));
        assert_eq!(f.in_flight, Some(2));
        assert_eq!(f.delayed, None);
        assert_eq!(f.redrive.unwrap().max_receive_count, 3);
    }

    #[test]
    fn bad_attribute_names_the_attribute() {
        let err =
            QueueFacts::from_attributes("u", &attrs(&[("VisibilityTimeout", "soon")])).unwrap_err();
        assert!(err.to_string().contains("VisibilityTimeout"), "{err}");
    }

    #[test]
    fn arn_and_region_parsing() {
        let a = QueueArn::parse("arn:aws:sqs:eu-west-1:123456789012:orders-dlq").unwrap();
        assert_eq!(
            (a.region.as_str(), a.account.as_str(), a.name.as_str()),
            ("eu-west-1", "123456789012", "orders-dlq")
        );
        assert_eq!(
            a.to_string(),
            "arn:aws:sqs:eu-west-1:123456789012:orders-dlq"
        );
        let cn = QueueArn::parse("arn:aws-cn:sqs:cn-north-1:1:q").unwrap();
        assert_eq!((cn.account.as_str(), cn.name.as_str()), ("1", "q"));
        for bad in [
            "",
            "q",
            "arn:aws:sns:eu-west-1:1:x",
            "arn:aws:sqs:us-east-1::q",
            "arn:aws:sqs::1:q",
            "arn:aws:sqs:us-east-1:1:",
            "arn:aws:sqs:us-east-1:1:q:extra",
        ] {
            assert_eq!(QueueArn::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn region_comes_from_the_url_host_when_not_given() {
        for (url, region) in REGION_CASES {
            assert_eq!(region_from_url(url).as_deref(), *region, "{url}");
            assert_eq!(queue_region(None, url).as_deref(), *region, "{url}");
            assert_eq!(
                queue_region(Some("af-south-1"), url).as_deref(),
                Some("af-south-1"),
                "{url}"
            );
        }
    }

    #[test]
    fn a_queue_is_its_account_region_and_name() {
        let id = |region, url| QueueId::of(region, url);
        let a = id(
            Some("us-east-1"),
            "https://sqs.us-east-1.amazonaws.com/111111111111/orders",
        );
        assert_eq!(
            (a.account.as_str(), a.name.as_str()),
            ("111111111111", "orders")
        );
        // One queue, two spellings of its URL.
        assert_eq!(
            a,
            id(
                Some("us-east-1"),
                "https://us-east-1.queue.amazonaws.com/111111111111/orders/"
            )
        );
        // Behind an endpoint override one URL names a queue per region.
        let url = "http://127.0.0.1:5000/111111111111/orders";
        assert_ne!(id(Some("us-east-1"), url), id(Some("eu-west-1"), url));
        assert_ne!(
            id(Some("us-east-1"), url),
            id(
                Some("us-east-1"),
                "http://127.0.0.1:5000/222222222222/orders"
            )
        );
        assert_eq!(id(None, "http://h/q").account, "");
        assert_eq!(id(None, "http://h/q?x=1").name, "q");
    }

    #[test]
    fn a_region_contradicting_the_url_is_named() {
        let url = "https://sqs.us-east-1.amazonaws.com/1/q";
        assert_eq!(
            region_contradiction(Some("eu-west-1"), url),
            Some(("eu-west-1".into(), "us-east-1".into()))
        );
        assert_eq!(region_contradiction(Some("us-east-1"), url), None);
        assert_eq!(region_contradiction(None, url), None);
        // A URL without a region (an emulator) contradicts nothing.
        assert_eq!(
            region_contradiction(Some("eu-west-1"), "http://localhost:4566/1/q"),
            None
        );
    }

    #[test]
    fn queue_names_from_arn_else_url() {
        assert_eq!(
            queue_name_from_url("https://sqs.us-east-1.amazonaws.com/1/orders.fifo"),
            "orders.fifo"
        );
        assert_eq!(queue_name_from_url("http://h/1/q/"), "q");
        assert_eq!(queue_name_from_url("q"), "q");
        let mut f = QueueFacts::from_attributes("http://h/1/by-url", &attrs(&[])).unwrap();
        assert_eq!(f.name(), "by-url");
        f.arn = Some("arn:aws:sqs:us-east-1:1:by-arn".into());
        assert_eq!(f.name(), "by-arn");
        f.arn = Some("not an arn".into());
        assert_eq!(f.name(), "by-url");
    }
}
