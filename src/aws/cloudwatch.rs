//! CloudWatch adapter: the dead-letter queue's alarm (visible > 0) and its age-of-oldest-message metric.
//! The desired alarm is a pure value; the trait keeps the SDK at the edge so the controller can be tested.

use std::time::{Duration, SystemTime};

use aws_sdk_cloudwatch::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_cloudwatch::types::{ComparisonOperator, Dimension, StandardUnit, Statistic, Tag};

use super::error_chain;

/// SQS metrics namespace and the metrics the controller reads or alarms on.
pub const SQS_NAMESPACE: &str = "AWS/SQS";
pub const METRIC_VISIBLE: &str = "ApproximateNumberOfMessagesVisible";
pub const METRIC_OLDEST_AGE: &str = "ApproximateAgeOfOldestMessage";
/// SQS publishes its metrics at one-minute resolution.
pub const ALARM_PERIOD_SECONDS: i32 = 60;

/// The alarm the controller keeps on a dead-letter queue: Maximum visible > 0 over one minute.
#[derive(Clone, Debug, PartialEq)]
pub struct AlarmSpec {
    pub name: String,
    pub description: String,
    pub queue_name: String,
    pub metric_name: String,
    pub namespace: String,
    pub statistic: String,
    pub comparison: String,
    pub threshold: f64,
    pub period_seconds: i32,
    pub evaluation_periods: i32,
    pub treat_missing_data: String,
}

/// The desired alarm for a DLQ named `queue_name`, on behalf of QueueConsumer `namespace/name`.
pub fn dead_letter_alarm(
    alarm_name: &str,
    queue_name: &str,
    namespace: &str,
    name: &str,
) -> AlarmSpec {
    AlarmSpec {
        name: alarm_name.to_string(),
        description: format!(
            "Messages in dead-letter queue {queue_name} of QueueConsumer {namespace}/{name}; managed by qc-operator, deleted with the QueueConsumer"
        ),
        queue_name: queue_name.to_string(),
        metric_name: METRIC_VISIBLE.to_string(),
        namespace: SQS_NAMESPACE.to_string(),
        statistic: "Maximum".to_string(),
        comparison: "GreaterThanThreshold".to_string(),
        threshold: 0.0,
        period_seconds: ALARM_PERIOD_SECONDS,
        evaluation_periods: 1,
        // No data means an idle, empty DLQ (SQS stops sending metrics for inactive queues).
        treat_missing_data: "notBreaching".to_string(),
    }
}

/// An alarm as CloudWatch reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedAlarm {
    pub spec: AlarmSpec,
    /// OK, ALARM or INSUFFICIENT_DATA.
    pub state: String,
}

/// Why a CloudWatch call failed; the variant names the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloudWatchError {
    #[error("describe alarm {name}: {message}")]
    DescribeAlarms {
        name: String,
        reason: &'static str,
        message: String,
    },
    #[error("put alarm {name}: {message}")]
    PutMetricAlarm {
        name: String,
        reason: &'static str,
        message: String,
    },
    #[error("delete alarm {name}: {message}")]
    DeleteAlarms {
        name: String,
        reason: &'static str,
        message: String,
    },
    #[error("read {METRIC_OLDEST_AGE} of {queue}: {message}")]
    GetMetricStatistics {
        queue: String,
        reason: &'static str,
        message: String,
    },
}

impl CloudWatchError {
    /// CamelCase reason for conditions and Events (AccessDenied, Throttled, EndpointUnreachable, ...).
    pub fn reason(&self) -> &'static str {
        match self {
            CloudWatchError::DescribeAlarms { reason, .. }
            | CloudWatchError::PutMetricAlarm { reason, .. }
            | CloudWatchError::DeleteAlarms { reason, .. }
            | CloudWatchError::GetMetricStatistics { reason, .. } => reason,
        }
    }
}

/// The CloudWatch calls the controller makes.
#[async_trait::async_trait]
pub trait Alarms: Send + Sync {
    async fn describe(&self, name: &str) -> Result<Option<ObservedAlarm>, CloudWatchError>;
    async fn put(&self, alarm: &AlarmSpec) -> Result<(), CloudWatchError>;
    /// Deleting an alarm that does not exist succeeds.
    async fn delete(&self, name: &str) -> Result<(), CloudWatchError>;
    /// The latest ApproximateAgeOfOldestMessage of a queue (seconds); None when CloudWatch has no
    /// recent datapoint.
    async fn oldest_message_age(&self, queue_name: &str) -> Result<Option<i64>, CloudWatchError>;
}

/// `Alarms` on the AWS SDK.
#[derive(Clone, Debug)]
pub struct CloudWatchAlarms {
    client: aws_sdk_cloudwatch::Client,
}

impl CloudWatchAlarms {
    pub fn new(client: aws_sdk_cloudwatch::Client) -> Self {
        CloudWatchAlarms { client }
    }
}

/// Map an SDK error to a reason and message, without the SDK's type parameters.
fn classify<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(
    e: &SdkError<E, R>,
) -> (&'static str, String) {
    match e {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => (
            "EndpointUnreachable",
            format!("cannot reach CloudWatch: {}", error_chain(e)),
        ),
        SdkError::ServiceError(s) => {
            let err = s.err();
            let code = err.code().unwrap_or("Unknown");
            let reason = match code {
                "AccessDenied" | "AccessDeniedException" => "AccessDenied",
                "Throttling" | "ThrottlingException" | "RequestLimitExceeded" => "Throttled",
                "InvalidClientTokenId"
                | "UnrecognizedClientException"
                | "SignatureDoesNotMatch"
                | "ExpiredToken" => "InvalidCredentials",
                "ResourceNotFound" | "ResourceNotFoundException" => "ResourceNotFound",
                _ => "AwsError",
            };
            (
                reason,
                format!("{code}: {}", err.message().unwrap_or("no message")),
            )
        }
        _ => ("AwsError", error_chain(e)),
    }
}

fn dimension(queue_name: &str) -> Dimension {
    Dimension::builder()
        .name("QueueName")
        .value(queue_name)
        .build()
}

#[async_trait::async_trait]
impl Alarms for CloudWatchAlarms {
    async fn describe(&self, name: &str) -> Result<Option<ObservedAlarm>, CloudWatchError> {
        let out = self
            .client
            .describe_alarms()
            .alarm_names(name)
            .send()
            .await
            .map_err(|e| {
                let (reason, message) = classify(&e);
                CloudWatchError::DescribeAlarms {
                    name: name.to_string(),
                    reason,
                    message,
                }
            })?;
        let Some(a) = out
            .metric_alarms
            .unwrap_or_default()
            .into_iter()
            .find(|a| a.alarm_name.as_deref() == Some(name))
        else {
            return Ok(None);
        };
        let queue_name = a
            .dimensions
            .iter()
            .flatten()
            .find(|d| d.name.as_deref() == Some("QueueName"))
            .and_then(|d| d.value.clone())
            .unwrap_or_default();
        Ok(Some(ObservedAlarm {
            spec: AlarmSpec {
                name: name.to_string(),
                description: a.alarm_description.unwrap_or_default(),
                queue_name,
                metric_name: a.metric_name.unwrap_or_default(),
                namespace: a.namespace.unwrap_or_default(),
                statistic: a
                    .statistic
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_default(),
                comparison: a
                    .comparison_operator
                    .map(|c| c.as_str().to_string())
                    .unwrap_or_default(),
                threshold: a.threshold.unwrap_or(f64::NAN),
                period_seconds: a.period.unwrap_or(0),
                evaluation_periods: a.evaluation_periods.unwrap_or(0),
                treat_missing_data: a.treat_missing_data.unwrap_or_default(),
            },
            state: a
                .state_value
                .map(|s| s.as_str().to_string())
                .unwrap_or_else(|| "INSUFFICIENT_DATA".to_string()),
        }))
    }

    async fn put(&self, alarm: &AlarmSpec) -> Result<(), CloudWatchError> {
        self.client
            .put_metric_alarm()
            .alarm_name(&alarm.name)
            .alarm_description(&alarm.description)
            .namespace(&alarm.namespace)
            .metric_name(&alarm.metric_name)
            .dimensions(dimension(&alarm.queue_name))
            .statistic(Statistic::from(alarm.statistic.as_str()))
            .comparison_operator(ComparisonOperator::from(alarm.comparison.as_str()))
            .threshold(alarm.threshold)
            .period(alarm.period_seconds)
            .evaluation_periods(alarm.evaluation_periods)
            .treat_missing_data(&alarm.treat_missing_data)
            .tags(
                Tag::builder()
                    .key("managed-by")
                    .value("qc-operator")
                    .build(),
            )
            .send()
            .await
            .map(|_| ())
            .map_err(|e| {
                let (reason, message) = classify(&e);
                CloudWatchError::PutMetricAlarm {
                    name: alarm.name.clone(),
                    reason,
                    message,
                }
            })
    }

    async fn delete(&self, name: &str) -> Result<(), CloudWatchError> {
        match self.client.delete_alarms().alarm_names(name).send().await {
            Ok(_) => Ok(()),
            Err(e) => {
                let (reason, message) = classify(&e);
                if reason == "ResourceNotFound" {
                    return Ok(());
                }
                Err(CloudWatchError::DeleteAlarms {
                    name: name.to_string(),
                    reason,
                    message,
                })
            }
        }
    }

    async fn oldest_message_age(&self, queue_name: &str) -> Result<Option<i64>, CloudWatchError> {
        let now = SystemTime::now();
        // SQS metrics arrive a few minutes late: look back far enough to find the latest one. The end
        // is a period ahead because timestamps travel with whole-second precision.
        let start = now - Duration::from_secs(15 * 60);
        let end = now + Duration::from_secs(ALARM_PERIOD_SECONDS.unsigned_abs().into());
        let out = self
            .client
            .get_metric_statistics()
            .namespace(SQS_NAMESPACE)
            .metric_name(METRIC_OLDEST_AGE)
            .dimensions(dimension(queue_name))
            .start_time(start.into())
            .end_time(end.into())
            .period(ALARM_PERIOD_SECONDS)
            .statistics(Statistic::Maximum)
            .unit(StandardUnit::Seconds)
            .send()
            .await
            .map_err(|e| {
                let (reason, message) = classify(&e);
                CloudWatchError::GetMetricStatistics {
                    queue: queue_name.to_string(),
                    reason,
                    message,
                }
            })?;
        let latest = out
            .datapoints
            .unwrap_or_default()
            .into_iter()
            .filter_map(|d| Some((d.timestamp?, d.maximum?)))
            .max_by(|a, b| a.0.cmp(&b.0));
        Ok(latest.map(|(_, v)| v.round() as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarm_is_visible_above_zero_on_the_dlq() {
        let a = dead_letter_alarm("qc-dlq-shop-orders-1234", "orders-dlq", "shop", "orders");
        assert_eq!(a.metric_name, "ApproximateNumberOfMessagesVisible");
        assert_eq!(a.namespace, "AWS/SQS");
        assert_eq!(a.comparison, "GreaterThanThreshold");
        assert_eq!(a.threshold, 0.0);
        assert_eq!(a.queue_name, "orders-dlq");
        assert!(a.description.contains("shop/orders"));
    }
}
