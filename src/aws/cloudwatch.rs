//! CloudWatch adapter: the dead-letter queue's alarm (visible > 0) and the queues' metrics.
//! The desired alarm is a pure value; the trait keeps the SDK at the edge so the controller can be tested.
//! Reads are batched across QueueConsumers (`super::batch`): one DescribeAlarms carries up to 100
//! alarms and one GetMetricData up to 500 metrics; every call goes through the service's `Limiter`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_sdk_cloudwatch::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_cloudwatch::types::{
    ComparisonOperator, Dimension, Metric, MetricAlarm, MetricDataQuery, MetricStat, ScanBy,
    Statistic, Tag,
};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;

use futures::future::BoxFuture;

use super::batch::{BatchError, Batcher, Counts, Known};
use super::classify::ErrorKind;
use super::error_chain;
use super::limit::{LimitConfig, Limiter};

use crate::sync::lock;

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
    /// ARNs notified when the alarm fires (`deadLetter.alarmActions`), sorted and without repeats.
    pub alarm_actions: Vec<String>,
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
        alarm_actions: Vec::new(),
    }
}

impl AlarmSpec {
    /// The alarm notifying `actions` (SNS topic ARNs) when it fires.
    pub fn with_actions(mut self, actions: &[String]) -> Self {
        self.alarm_actions = normalized(actions.to_vec());
        self
    }
}

/// Sorted, without repeats: how an alarm's actions are compared.
fn normalized(mut actions: Vec<String>) -> Vec<String> {
    actions.sort();
    actions.dedup();
    actions
}

/// An alarm as CloudWatch reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedAlarm {
    pub spec: AlarmSpec,
    /// OK, ALARM or INSUFFICIENT_DATA.
    pub state: String,
}

/// The QueueConsumer an alarm belongs to, written into the alarm's tags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlarmOwner {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// Tag keys of a managed alarm. The uid is what deletion checks: names can be reused, uids cannot.
pub const TAG_MANAGED_BY: &str = "managed-by";
pub const MANAGED_BY: &str = "qc-operator";
pub const TAG_OWNER_UID: &str = "sqs.consumers.dev/queueconsumer-uid";
pub const TAG_OWNER: &str = "sqs.consumers.dev/queueconsumer";

/// What a delete found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AlarmDeletion {
    Deleted,
    /// No alarm of that name: nothing to do.
    Absent,
    /// An alarm of that name exists and its tags say it is not the owner's: left in place.
    NotOurs {
        why: String,
    },
}

/// Whether tags mark an alarm as `owner`'s: managed by qc-operator, and carrying the owner's uid.
/// Alarms written before the uid tag existed carry only `managed-by`; their name, derived from the
/// uid, is the identity then.
pub fn owned_by(tags: &[(String, String)], owner: &AlarmOwner) -> Result<(), String> {
    let get = |k: &str| {
        tags.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    if get(TAG_MANAGED_BY) != Some(MANAGED_BY) {
        return Err(format!(
            "it has no tag {TAG_MANAGED_BY}={MANAGED_BY}: not created by qc-operator"
        ));
    }
    match get(TAG_OWNER_UID) {
        Some(uid) if uid != owner.uid => Err(format!(
            "its tag {TAG_OWNER_UID} is {uid}, not this QueueConsumer's uid {}",
            owner.uid
        )),
        _ => Ok(()),
    }
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
    #[error("read the tags of alarm {name}: {message}")]
    ListTagsForResource {
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
    #[error("read {metric} of {queue}: {message}")]
    GetMetricData {
        metric: String,
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
            | CloudWatchError::ListTagsForResource { reason, .. }
            | CloudWatchError::GetMetricData { reason, .. } => reason,
        }
    }
}

/// The CloudWatch calls the controller makes.
#[async_trait::async_trait]
pub trait Alarms: Send + Sync {
    async fn describe(&self, name: &str) -> Result<Option<ObservedAlarm>, CloudWatchError>;
    /// Create or update the alarm, tagged with its owner (tags count only at creation: CloudWatch
    /// ignores them on an update).
    async fn put(&self, alarm: &AlarmSpec, owner: &AlarmOwner) -> Result<(), CloudWatchError>;
    /// Delete the alarm if its tags say it is `owner`'s (see `owned_by`).
    async fn delete(
        &self,
        name: &str,
        owner: &AlarmOwner,
    ) -> Result<AlarmDeletion, CloudWatchError>;
    /// The latest ApproximateAgeOfOldestMessage of a queue (seconds); None when CloudWatch has no
    /// recent datapoint.
    async fn oldest_message_age(&self, queue_name: &str) -> Result<Option<i64>, CloudWatchError>;

    /// The latest ApproximateAgeOfOldestMessage as last read, without waiting for CloudWatch where the
    /// implementation reads in the background (`BatchOptions::refresh`): Ok(None) while it is not
    /// read yet or too old to use ([`STALE_AFTER`] of its reuse age). By default a read, like
    /// `oldest_message_age`.
    async fn known_oldest_message_age(
        &self,
        queue_name: &str,
    ) -> Result<Option<i64>, CloudWatchError> {
        self.oldest_message_age(queue_name).await
    }

    /// Bring the alarm in line with `want`: describe it, and put it when it is missing or differs.
    /// Where the implementation reads in the background, this never waits for CloudWatch: the
    /// description is the last one read, and a put runs in a task of its own whose outcome the next
    /// call reports. By default each step is a call, waited for.
    async fn ensure(&self, want: &AlarmSpec, owner: &AlarmOwner) -> Ensured {
        ensure_now(self, want, owner).await
    }
}

/// A value read more than this many times its reuse age ago is not used: unknown rather than wrong.
pub const STALE_AFTER: u32 = 2;

/// What `Alarms::ensure` found.
#[derive(Clone, Debug, PartialEq)]
pub enum Ensured {
    /// The alarm is as wanted, in this state; `wrote` when this call (or, in the background, a put
    /// since the last call) created or updated it.
    InSync {
        state: String,
        wrote: Option<AlarmWrite>,
    },
    /// Not known yet: the description is not read yet, or a put is under way.
    Pending,
    /// The last description is older than [`STALE_AFTER`] times its reuse age and no call failed:
    /// the refresher is behind.
    Stale { age: Duration },
    /// The last describe or put failed.
    Failed(CloudWatchError),
}

/// A write `ensure` made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlarmWrite {
    Created,
    Updated,
}

/// `ensure` with a call per step, waited for: describe; put when missing or different; describe
/// again (CloudWatch decides the state of a new or changed alarm).
pub async fn ensure_now<A: Alarms + ?Sized>(
    alarms: &A,
    want: &AlarmSpec,
    owner: &AlarmOwner,
) -> Ensured {
    let observed = match alarms.describe(&want.name).await {
        Ok(o) => o,
        Err(e) => return Ensured::Failed(e),
    };
    let wrote = match &observed {
        Some(o) if o.spec == *want => None,
        Some(_) => Some(AlarmWrite::Updated),
        None => Some(AlarmWrite::Created),
    };
    let observed = if wrote.is_none() {
        observed
    } else {
        if let Err(e) = alarms.put(want, owner).await {
            return Ensured::Failed(e);
        }
        alarms.describe(&want.name).await.ok().flatten()
    };
    Ensured::InSync {
        state: observed.map_or_else(|| "INSUFFICIENT_DATA".to_string(), |o| o.state),
        wrote,
    }
}

/// Map an SDK error to a reason (`aws::classify`) and message, without the SDK's type parameters.
fn classify<E: ProvideErrorMetadata + std::error::Error + 'static>(
    e: &SdkError<E, HttpResponse>,
) -> (&'static str, String) {
    let kind = crate::aws::classify::classify(e);
    let message = match e {
        _ if kind.is_transport() => format!("cannot reach CloudWatch: {}", error_chain(e)),
        SdkError::ServiceError(s) => format!(
            "{}: {}",
            s.err().code().unwrap_or("Unknown"),
            s.err().message().unwrap_or("no message")
        ),
        _ => error_chain(e),
    };
    (kind.reason(), message)
}

fn dimension(queue_name: &str) -> Dimension {
    Dimension::builder()
        .name("QueueName")
        .value(queue_name)
        .build()
}

/// Most alarm names one DescribeAlarms takes (its AlarmNames limit).
pub const ALARMS_PER_CALL: usize = 100;
/// Most metrics one GetMetricData reads (without a Metrics Insights query).
pub const METRICS_PER_CALL: usize = 500;
/// Pages of one batched read followed at most (a page is 100 alarms, or up to 100,800 datapoints).
const MAX_PAGES: usize = 20;

/// How reads are batched and how long answers are reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOptions {
    /// How long the first stale read waits for others to join its call.
    pub window: Duration,
    /// How long an alarm's description (its settings and state) is reused; writes drop it at once.
    pub alarm_max_age: Duration,
    /// How long a metric's latest value is reused. AWS/SQS metrics have one-minute resolution, so
    /// reading them more often returns the same datapoint.
    pub metric_max_age: Duration,
    /// Some(every): reads are refreshed in the background, a pass every `every`, and the
    /// controller's reads (`Alarms::known_oldest_message_age`, `Alarms::ensure`) take the last answer
    /// without waiting for CloudWatch. None: every read waits for its batch.
    pub refresh: Option<Duration>,
}

impl Default for BatchOptions {
    /// Batch what is read concurrently, reuse nothing: every read sees CloudWatch as it is now.
    fn default() -> Self {
        BatchOptions {
            window: Duration::from_millis(50),
            alarm_max_age: Duration::ZERO,
            metric_max_age: Duration::ZERO,
            refresh: None,
        }
    }
}

/// The controller's CloudWatch calls per second and in flight by default: GetMetricData's
/// default quota is 50 a second, DescribeAlarms' 9 and PutMetricAlarm's 3, per account and region.
pub const DEFAULT_LIMIT: LimitConfig = LimitConfig::new(5.0, 4);

/// A metric of one queue (dimension QueueName) in the AWS/SQS namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QueueMetric {
    pub metric: String,
    pub queue: String,
}

/// A failed batched call, before it is told apart per key.
#[derive(Clone, Debug)]
struct Failure {
    reason: &'static str,
    message: String,
}

type AlarmBatcher = Batcher<String, Option<ObservedAlarm>, Failure>;
type MetricBatcher = Batcher<QueueMetric, Option<f64>, Failure>;

/// `Alarms` on the AWS SDK, with batched reads through a `Limiter`.
#[derive(Clone)]
pub struct CloudWatchAlarms {
    client: aws_sdk_cloudwatch::Client,
    limiter: Arc<Limiter>,
    options: BatchOptions,
    alarms: AlarmBatcher,
    metrics: MetricBatcher,
    /// Puts running in the background (`ensure` with `BatchOptions::refresh`), and the outcome of
    /// those done, by alarm name, until the next `ensure` of that alarm takes it.
    writes: Arc<Mutex<HashMap<String, WriteState>>>,
}

#[derive(Clone, Debug)]
enum WriteState {
    Running,
    Done(AlarmWrite),
    Failed(CloudWatchError),
}

impl std::fmt::Debug for CloudWatchAlarms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudWatchAlarms")
            .field("options", &self.options)
            .field("limiter", &self.limiter)
            .finish_non_exhaustive()
    }
}

impl CloudWatchAlarms {
    /// Default batching (nothing reused) behind a gate of its own.
    pub fn new(client: aws_sdk_cloudwatch::Client) -> Self {
        Self::with_options(
            client,
            Arc::new(Limiter::new("cloudwatch", DEFAULT_LIMIT)),
            BatchOptions::default(),
        )
    }

    pub fn with_options(
        client: aws_sdk_cloudwatch::Client,
        limiter: Arc<Limiter>,
        options: BatchOptions,
    ) -> Self {
        fn batcher<K, V>(
            options: &BatchOptions,
            per_call: usize,
            fetch: super::batch::Fetch<K, V, Failure>,
        ) -> Batcher<K, V, Failure>
        where
            K: Clone + Eq + std::hash::Hash + Send + 'static,
            V: Clone + Default + Send + 'static,
        {
            match options.refresh {
                Some(every) => Batcher::with_refresh(options.window, per_call, every, fetch),
                None => Batcher::new(options.window, per_call, fetch),
            }
        }
        /// A batch's call, each run with its own handles on the client and the limiter.
        fn fetch<K, V, F, Fut>(
            client: &aws_sdk_cloudwatch::Client,
            limiter: &Arc<Limiter>,
            call: F,
        ) -> super::batch::Fetch<K, V, Failure>
        where
            F: Fn(aws_sdk_cloudwatch::Client, Arc<Limiter>, Vec<K>) -> Fut + Send + Sync + 'static,
            Fut: Future<Output = Result<HashMap<K, V>, Failure>> + Send + 'static,
        {
            let (c, l) = (client.clone(), limiter.clone());
            Arc::new(move |keys| -> BoxFuture<'static, _> {
                Box::pin(call(c.clone(), l.clone(), keys))
            })
        }
        let client = super::operator_cloudwatch(client);
        let alarms = batcher(
            &options,
            ALARMS_PER_CALL,
            fetch(&client, &limiter, describe_alarms),
        );
        let metrics = batcher(
            &options,
            METRICS_PER_CALL,
            fetch(&client, &limiter, get_metric_data),
        );
        CloudWatchAlarms {
            client,
            limiter,
            options,
            alarms,
            metrics,
            writes: Arc::default(),
        }
    }

    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// The metric reads' and alarm descriptions' passes (or batches) and calls so far.
    pub fn counts(&self) -> (Counts, Counts) {
        (self.metrics.counts(), self.alarms.counts())
    }

    /// What is known of a queue metric without waiting (the background refresher keeps it fresh).
    pub fn known_metric(&self, metric: &str, queue: &str) -> Known<Option<f64>, CloudWatchError> {
        let key = QueueMetric {
            metric: metric.to_string(),
            queue: queue.to_string(),
        };
        let k = self.metrics.peek(key, self.options.metric_max_age);
        Known {
            value: k.value,
            error: k.error.map(|f| CloudWatchError::GetMetricData {
                metric: metric.to_string(),
                queue: queue.to_string(),
                reason: f.reason,
                message: f.message,
            }),
        }
    }

    /// Start a put of `want` in a task of its own, unless one is running; its outcome waits in
    /// `writes` for the next `ensure`.
    fn put_in_background(&self, want: &AlarmSpec, owner: &AlarmOwner, wrote: AlarmWrite) {
        {
            let mut writes = lock(&self.writes);
            if matches!(writes.get(&want.name), Some(WriteState::Running)) {
                return;
            }
            writes.insert(want.name.clone(), WriteState::Running);
        }
        let (this, want, owner) = (self.clone(), want.clone(), owner.clone());
        tokio::spawn(async move {
            let outcome = match this.put(&want, &owner).await {
                Ok(()) => {
                    // Read back with the next pass (CloudWatch decides the state of a new or
                    // changed alarm), not in a call of its own: a thousand new QueueConsumers'
                    // puts would otherwise each start a DescribeAlarms.
                    this.alarms
                        .expire(want.name.clone(), this.options.alarm_max_age);
                    WriteState::Done(wrote)
                }
                Err(e) => WriteState::Failed(e),
            };
            lock(&this.writes).insert(want.name.clone(), outcome);
        });
    }

    /// The latest Maximum of `metric` for queue `queue` (AWS/SQS), batched with every other read
    /// due now; None when CloudWatch has no recent datapoint.
    pub async fn queue_metric(
        &self,
        metric: &str,
        queue: &str,
    ) -> Result<Option<f64>, CloudWatchError> {
        let key = QueueMetric {
            metric: metric.to_string(),
            queue: queue.to_string(),
        };
        self.metrics
            .get(key, self.options.metric_max_age)
            .await
            .map_err(|e| {
                let f = failure_of(e);
                CloudWatchError::GetMetricData {
                    metric: metric.to_string(),
                    queue: queue.to_string(),
                    reason: f.reason,
                    message: f.message,
                }
            })
    }
}

fn failure_of(e: BatchError<Failure>) -> Failure {
    match e {
        BatchError::Call(f) => f,
        BatchError::Abandoned => Failure {
            reason: "AwsError",
            message: "the batched read was abandoned (shutting down)".to_string(),
        },
    }
}

fn sdk_failure<E: ProvideErrorMetadata + std::error::Error + 'static>(
    e: &SdkError<E, HttpResponse>,
) -> Failure {
    let (reason, message) = classify(e);
    Failure { reason, message }
}

fn is_throttled<E: ProvideErrorMetadata + std::error::Error + 'static>(
    e: &SdkError<E, HttpResponse>,
) -> bool {
    crate::aws::classify::classify(e) == ErrorKind::Throttled
}

fn observed(name: &str, a: MetricAlarm) -> ObservedAlarm {
    let queue_name = a
        .dimensions
        .iter()
        .flatten()
        .find(|d| d.name.as_deref() == Some("QueueName"))
        .and_then(|d| d.value.clone())
        .unwrap_or_default();
    ObservedAlarm {
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
            // Actions disabled by hand count as none: the alarm would notify nobody.
            alarm_actions: if a.actions_enabled == Some(false) {
                Vec::new()
            } else {
                normalized(a.alarm_actions.unwrap_or_default())
            },
        },
        state: a.state_value.map_or_else(
            || "INSUFFICIENT_DATA".to_string(),
            |s| s.as_str().to_string(),
        ),
    }
}

/// One DescribeAlarms (and its pages) for up to 100 names; a name not in the answer has no alarm.
async fn describe_alarms(
    client: aws_sdk_cloudwatch::Client,
    limiter: Arc<Limiter>,
    names: Vec<String>,
) -> Result<HashMap<String, Option<ObservedAlarm>>, Failure> {
    let mut found = HashMap::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let out = limiter
            .run("DescribeAlarms", is_throttled, || {
                client
                    .describe_alarms()
                    .set_alarm_names(Some(names.clone()))
                    .max_records(100)
                    .set_next_token(token.clone())
                    .send()
            })
            .await
            .map_err(|e| sdk_failure(&e))?;
        for a in out.metric_alarms.unwrap_or_default() {
            if let Some(name) = a.alarm_name.clone()
                && names.contains(&name)
            {
                let o = observed(&name, a);
                found.insert(name, Some(o));
            }
        }
        token = out.next_token.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    Ok(found)
}

/// One GetMetricData (and its pages) for up to 500 queue metrics: the latest one-minute Maximum of
/// each over the last 15 minutes (SQS metrics arrive a few minutes late).
async fn get_metric_data(
    client: aws_sdk_cloudwatch::Client,
    limiter: Arc<Limiter>,
    keys: Vec<QueueMetric>,
) -> Result<HashMap<QueueMetric, Option<f64>>, Failure> {
    let now = SystemTime::now();
    let start = now - Duration::from_mins(15);
    // A period ahead: timestamps travel with whole-second precision.
    let end = now + Duration::from_secs(ALARM_PERIOD_SECONDS.unsigned_abs().into());
    let queries: Vec<MetricDataQuery> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            MetricDataQuery::builder()
                .id(format!("m{i}"))
                .metric_stat(
                    MetricStat::builder()
                        .metric(
                            Metric::builder()
                                .namespace(SQS_NAMESPACE)
                                .metric_name(&k.metric)
                                .dimensions(dimension(&k.queue))
                                .build(),
                        )
                        .period(ALARM_PERIOD_SECONDS)
                        .stat("Maximum")
                        .build(),
                )
                .return_data(true)
                .build()
        })
        .collect();
    // Latest (timestamp, value) per query id.
    let mut latest: HashMap<String, (aws_sdk_cloudwatch::primitives::DateTime, f64)> =
        HashMap::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let out = limiter
            .run("GetMetricData", is_throttled, || {
                client
                    .get_metric_data()
                    .set_metric_data_queries(Some(queries.clone()))
                    .start_time(start.into())
                    .end_time(end.into())
                    .scan_by(ScanBy::TimestampDescending)
                    .set_next_token(token.clone())
                    .send()
            })
            .await
            .map_err(|e| sdk_failure(&e))?;
        for r in out.metric_data_results.unwrap_or_default() {
            let Some(id) = r.id else { continue };
            let points = r
                .timestamps
                .unwrap_or_default()
                .into_iter()
                .zip(r.values.unwrap_or_default());
            for (t, v) in points {
                let newer = latest.get(&id).is_none_or(|(seen, _)| t > *seen);
                if newer {
                    latest.insert(id.clone(), (t, v));
                }
            }
        }
        token = out.next_token.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    Ok(keys
        .into_iter()
        .enumerate()
        .map(|(i, k)| (k, latest.get(&format!("m{i}")).map(|(_, v)| *v)))
        .collect())
}

#[async_trait::async_trait]
impl Alarms for CloudWatchAlarms {
    async fn describe(&self, name: &str) -> Result<Option<ObservedAlarm>, CloudWatchError> {
        self.alarms
            .get(name.to_string(), self.options.alarm_max_age)
            .await
            .map_err(|e| {
                let f = failure_of(e);
                CloudWatchError::DescribeAlarms {
                    name: name.to_string(),
                    reason: f.reason,
                    message: f.message,
                }
            })
    }

    async fn put(&self, alarm: &AlarmSpec, owner: &AlarmOwner) -> Result<(), CloudWatchError> {
        let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
        // Whatever happens, the next describe reads CloudWatch again.
        self.alarms.forget(&alarm.name);
        let result = self
            .limiter
            .run("PutMetricAlarm", is_throttled, || {
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
                    .actions_enabled(true)
                    .set_alarm_actions(
                        (!alarm.alarm_actions.is_empty()).then(|| alarm.alarm_actions.clone()),
                    )
                    .tags(tag(TAG_MANAGED_BY, MANAGED_BY))
                    .tags(tag(TAG_OWNER_UID, &owner.uid))
                    .tags(tag(
                        TAG_OWNER,
                        &format!("{}/{}", owner.namespace, owner.name),
                    ))
                    .send()
            })
            .await;
        self.alarms.forget(&alarm.name);
        result.map(|_| ()).map_err(|e| {
            let (reason, message) = classify(&e);
            CloudWatchError::PutMetricAlarm {
                name: alarm.name.clone(),
                reason,
                message,
            }
        })
    }

    async fn delete(
        &self,
        name: &str,
        owner: &AlarmOwner,
    ) -> Result<AlarmDeletion, CloudWatchError> {
        // A put of this alarm still running in the background would create it again after the
        // delete: wait for it (it ends within the SDK's operation timeout), or fail and be retried.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while matches!(lock(&self.writes).get(name), Some(WriteState::Running)) {
            if tokio::time::Instant::now() >= deadline {
                return Err(CloudWatchError::DeleteAlarms {
                    name: name.to_string(),
                    reason: "AlarmWriteInProgress",
                    message: "a put of this alarm is still running; the delete is retried".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        lock(&self.writes).remove(name);
        self.alarms.forget(&name.to_string());
        // Read fresh (never the cache): the ARN, for the tags that say whose alarm this is.
        let found = self
            .limiter
            .run("DescribeAlarms", is_throttled, || {
                self.client.describe_alarms().alarm_names(name).send()
            })
            .await
            .map_err(|e| {
                let (reason, message) = classify(&e);
                CloudWatchError::DescribeAlarms {
                    name: name.to_string(),
                    reason,
                    message,
                }
            })?
            .metric_alarms
            .unwrap_or_default()
            .into_iter()
            .find(|a| a.alarm_name.as_deref() == Some(name));
        let Some(alarm) = found else {
            return Ok(AlarmDeletion::Absent);
        };
        let Some(arn) = alarm.alarm_arn else {
            return Ok(AlarmDeletion::NotOurs {
                why: "CloudWatch reported it without an ARN, so its tags cannot be checked".into(),
            });
        };
        let tags: Vec<(String, String)> = self
            .limiter
            .run("ListTagsForResource", is_throttled, || {
                self.client
                    .list_tags_for_resource()
                    .resource_arn(&arn)
                    .send()
            })
            .await
            .map_err(|e| {
                let (reason, message) = classify(&e);
                CloudWatchError::ListTagsForResource {
                    name: name.to_string(),
                    reason,
                    message,
                }
            })?
            .tags
            .unwrap_or_default()
            .into_iter()
            .filter_map(|t| Some((t.key?, t.value?)))
            .collect();
        if let Err(why) = owned_by(&tags, owner) {
            return Ok(AlarmDeletion::NotOurs { why });
        }
        let result = self
            .limiter
            .run("DeleteAlarms", is_throttled, || {
                self.client.delete_alarms().alarm_names(name).send()
            })
            .await;
        self.alarms.forget(&name.to_string());
        match result {
            Ok(_) => Ok(AlarmDeletion::Deleted),
            Err(e) if crate::aws::classify::classify(&e) == ErrorKind::ResourceNotFound => {
                Ok(AlarmDeletion::Absent)
            }
            Err(e) => {
                let (reason, message) = classify(&e);
                Err(CloudWatchError::DeleteAlarms {
                    name: name.to_string(),
                    reason,
                    message,
                })
            }
        }
    }

    async fn oldest_message_age(&self, queue_name: &str) -> Result<Option<i64>, CloudWatchError> {
        Ok(self
            .queue_metric(METRIC_OLDEST_AGE, queue_name)
            .await?
            .map(|v| v.round() as i64))
    }

    async fn known_oldest_message_age(
        &self,
        queue_name: &str,
    ) -> Result<Option<i64>, CloudWatchError> {
        if !self.metrics.refreshes() {
            return self.oldest_message_age(queue_name).await;
        }
        let known = self.known_metric(METRIC_OLDEST_AGE, queue_name);
        let limit = self.options.metric_max_age * STALE_AFTER;
        match (known.value, known.error) {
            (Some((v, age)), _) if age <= limit => Ok(v.map(|v| v.round() as i64)),
            (_, Some(e)) => Err(e),
            // Not read yet, or the refresher is behind: unknown, never an old age.
            _ => Ok(None),
        }
    }

    async fn ensure(&self, want: &AlarmSpec, owner: &AlarmOwner) -> Ensured {
        if !self.alarms.refreshes() {
            return ensure_now(self, want, owner).await;
        }
        let write = lock(&self.writes).get(&want.name).cloned();
        let wrote = match write {
            Some(WriteState::Running) => return Ensured::Pending,
            Some(WriteState::Done(w)) => Some(w),
            Some(WriteState::Failed(_)) | None => None,
        };
        let known = self
            .alarms
            .peek(want.name.clone(), self.options.alarm_max_age);
        let limit = self.options.alarm_max_age * STALE_AFTER;
        let observed = match (known.value, known.error) {
            (_, Some(e)) => {
                return Ensured::Failed(CloudWatchError::DescribeAlarms {
                    name: want.name.clone(),
                    reason: e.reason,
                    message: e.message,
                });
            }
            (None, None) => return Ensured::Pending,
            (Some((_, age)), None) if age > limit => return Ensured::Stale { age },
            (Some((o, _)), None) => o,
        };
        match observed {
            Some(o) if o.spec == *want => {
                if wrote.is_some() {
                    lock(&self.writes).remove(&want.name);
                }
                Ensured::InSync {
                    state: o.state,
                    wrote,
                }
            }
            other => {
                let kind = if other.is_some() {
                    AlarmWrite::Updated
                } else {
                    AlarmWrite::Created
                };
                // A put that failed is reported once, and tried again now.
                let failed = match lock(&self.writes).remove(&want.name) {
                    Some(WriteState::Failed(e)) => Some(e),
                    _ => None,
                };
                self.put_in_background(want, owner, kind);
                match failed {
                    Some(e) => Ensured::Failed(e),
                    None => Ensured::Pending,
                }
            }
        }
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
        assert!(a.threshold.abs() < f64::EPSILON, "{}", a.threshold);
        assert_eq!(a.queue_name, "orders-dlq");
        assert!(a.description.contains("shop/orders"));
    }
}
