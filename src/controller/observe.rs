//! Observe: queue and DLQ facts through the SQS adapter, shared per queue URL so that N QueueConsumers
//! on one queue cost one GetQueueAttributes per poll interval; the DLQ's oldest-message age from CloudWatch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::{Duration, QueueConsumer};
use crate::aws::cloudwatch::{self, Alarms, BatchOptions, CloudWatchAlarms};
use crate::aws::identity::Role;
use crate::aws::limit::{self, LimitConfig, Limiter};
use crate::aws::{
    DeadLetterFacts, Facts, ObserveError, QueueId, QueueReader, SqsReader, observe_with,
};
use crate::scaling::Timestamp;
use crate::tenancy::TenancyPolicy;

/// The AWS clients for one region and endpoint.
#[derive(Clone)]
pub struct AwsClients {
    pub sqs: Arc<dyn QueueReader>,
    pub alarms: Arc<dyn Alarms>,
}

/// Where and as whom one QueueConsumer's AWS calls go: its region, endpoint and role.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AwsTarget {
    pub region: Option<String>,
    pub endpoint: Option<String>,
    /// `spec.aws.roleArn`, assumed for every call; None: the controller's own identity.
    pub role: Option<Role>,
}

impl AwsTarget {
    /// The controller's own identity in `region` at `endpoint`.
    pub fn own(region: Option<&str>, endpoint: Option<&str>) -> Self {
        AwsTarget {
            region: region.map(str::to_string),
            endpoint: endpoint.map(str::to_string),
            role: None,
        }
    }
}

/// Hands out AWS clients per region, endpoint and role: each QueueConsumer may name its own.
#[async_trait::async_trait]
pub trait AwsProvider: Send + Sync {
    async fn clients(&self, target: &AwsTarget) -> AwsClients;
    /// Prometheus text about the AWS calls made (none by default).
    fn metrics(&self) -> String {
        String::new()
    }

    /// The writer of `spec.queue.manage`. None: queues are never changed (a provider of test doubles).
    async fn queue_writer(
        &self,
        _target: &AwsTarget,
    ) -> Option<Arc<dyn crate::aws::manage::QueueWriter>> {
        None
    }

    /// The SDK client DLQ redrives use (they move messages, so they need the SDK itself rather than
    /// a reader). None: redrive is unavailable (a provider of test doubles).
    async fn redrive_client(&self, _target: &AwsTarget) -> Option<aws_sdk_sqs::Client> {
        None
    }
}

/// How the controller's AWS calls are limited and its CloudWatch reads batched.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AwsOptions {
    pub sqs: LimitConfig,
    pub cloudwatch: LimitConfig,
    pub batch: BatchOptions,
}

/// How long the controller reuses an alarm's description by default: drift made by hand and the
/// alarm's state show in status within this; the controller's own writes show at once.
pub const DEFAULT_ALARM_RESYNC: std::time::Duration = std::time::Duration::from_mins(5);
/// The background CloudWatch refresher's pass period: the default poll interval.
pub const DEFAULT_REFRESH: std::time::Duration = std::time::Duration::from_secs(15);
/// How long the first stale CloudWatch read waits for others to join its call.
pub const DEFAULT_BATCH_WINDOW: std::time::Duration = std::time::Duration::from_millis(250);

impl Default for AwsOptions {
    fn default() -> Self {
        AwsOptions {
            sqs: crate::aws::sqs::DEFAULT_LIMIT,
            cloudwatch: cloudwatch::DEFAULT_LIMIT,
            batch: BatchOptions {
                window: DEFAULT_BATCH_WINDOW,
                alarm_max_age: DEFAULT_ALARM_RESYNC,
                // AWS/SQS metrics have one-minute resolution.
                metric_max_age: std::time::Duration::from_secs(
                    cloudwatch::ALARM_PERIOD_SECONDS.unsigned_abs().into(),
                ),
                refresh: Some(DEFAULT_REFRESH),
            },
        }
    }
}

/// Real SDK clients, built once per (region, endpoint, role) and reused: a role's credentials are
/// cached (and refreshed before they expire) by the SDK in its clients' config. Every client's calls
/// share one gate per service: the quotas they protect are the account's.
pub struct SdkProvider {
    clients: tokio::sync::Mutex<HashMap<AwsTarget, AwsClients>>,
    /// SDK SQS clients of the redrives, by the same key.
    redrive_clients: tokio::sync::Mutex<HashMap<AwsTarget, aws_sdk_sqs::Client>>,
    /// STS clients of the same identities (the account `queue.manage: create` acts in).
    sts_clients: tokio::sync::Mutex<HashMap<AwsTarget, aws_sdk_sts::Client>>,
    sqs: Arc<Limiter>,
    cloudwatch: Arc<Limiter>,
    batch: BatchOptions,
}

impl Default for SdkProvider {
    fn default() -> Self {
        Self::new(AwsOptions::default())
    }
}

impl SdkProvider {
    pub fn new(options: AwsOptions) -> Self {
        SdkProvider {
            clients: tokio::sync::Mutex::default(),
            redrive_clients: tokio::sync::Mutex::default(),
            sts_clients: tokio::sync::Mutex::default(),
            sqs: Arc::new(Limiter::new("sqs", options.sqs)),
            cloudwatch: Arc::new(Limiter::new("cloudwatch", options.cloudwatch)),
            batch: options.batch,
        }
    }

    /// The SQS and CloudWatch gates (their call counts).
    pub fn limiters(&self) -> (&Limiter, &Limiter) {
        (&self.sqs, &self.cloudwatch)
    }
}

#[async_trait::async_trait]
impl AwsProvider for SdkProvider {
    async fn clients(&self, target: &AwsTarget) -> AwsClients {
        let mut clients = self.clients.lock().await;
        if let Some(c) = clients.get(target) {
            return c.clone();
        }
        let mut conf =
            crate::aws::controller_sdk_config(target.region.as_deref(), target.endpoint.as_deref())
                .await;
        if let Some(role) = &target.role {
            conf = crate::aws::identity::assume(conf, role).await;
        }
        let sqs = aws_sdk_sqs::Client::new(&conf);
        self.sts_clients
            .lock()
            .await
            .insert(target.clone(), aws_sdk_sts::Client::new(&conf));
        self.redrive_clients
            .lock()
            .await
            .insert(target.clone(), sqs.clone());
        let c = AwsClients {
            sqs: Arc::new(SqsReader::with_limiter(sqs, self.sqs.clone())),
            alarms: Arc::new(CloudWatchAlarms::with_options(
                aws_sdk_cloudwatch::Client::new(&conf),
                self.cloudwatch.clone(),
                self.batch,
            )),
        };
        clients.insert(target.clone(), c.clone());
        c
    }

    fn metrics(&self) -> String {
        limit::render_metrics(&[&self.sqs, &self.cloudwatch])
    }

    async fn queue_writer(
        &self,
        target: &AwsTarget,
    ) -> Option<Arc<dyn crate::aws::manage::QueueWriter>> {
        let client = self.redrive_client(target).await?;
        let sts = self.sts_clients.lock().await.get(target).cloned()?;
        Some(Arc::new(crate::aws::manage::SdkQueueWriter::new(
            client, sts,
        )))
    }

    async fn redrive_client(&self, target: &AwsTarget) -> Option<aws_sdk_sqs::Client> {
        if let Some(c) = self.redrive_clients.lock().await.get(target) {
            return Some(c.clone());
        }
        // Only reached before the first `clients` call for this key.
        self.clients(target).await;
        self.redrive_clients.lock().await.get(target).cloned()
    }
}

/// The same clients for every QueueConsumer (tests, and `plan --live` against one endpoint).
pub struct FixedProvider(pub AwsClients);

#[async_trait::async_trait]
impl AwsProvider for FixedProvider {
    async fn clients(&self, _target: &AwsTarget) -> AwsClients {
        self.0.clone()
    }
}

/// Region, endpoint and role of a QueueConsumer's AWS calls.
pub fn aws_target(qc: &QueueConsumer) -> AwsTarget {
    let spec = &qc.spec;
    AwsTarget {
        region: crate::render::region(spec),
        endpoint: spec.queue.endpoint.clone(),
        role: crate::aws::identity::of_consumer(qc),
    }
}

/// Facts as read at one moment.
#[derive(Clone, Debug)]
pub struct Observed {
    pub facts: Facts,
    pub sampled_at: Time,
    /// When the read was made, to the millisecond: the time of the scaler's sample.
    pub at: Timestamp,
}

type Slot = Arc<tokio::sync::Mutex<Option<Observed>>>;

/// Whether a reconcile reads the source queue's ApproximateAgeOfOldestMessage from CloudWatch. With
/// `scaling.objective` the workers measure each message's age themselves (their dwell histograms), and
/// the scaler takes that instead: no CloudWatch read for it (docs/scaling.md, "Dwell objective").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceAge {
    FromCloudWatch,
    FromWorkers,
}

impl SourceAge {
    pub fn of(spec: &crate::api::QueueConsumerSpec) -> SourceAge {
        if spec.scaling.objective.is_some() {
            SourceAge::FromWorkers
        } else {
            SourceAge::FromCloudWatch
        }
    }
}

/// Facts per queue, reused within the asking QueueConsumer's poll interval (`spread::same_interval`). Concurrent
/// reconciles of one queue wait for the read in flight instead of issuing their own. A queue is its
/// endpoint, account, region and name ([`QueueId`]): two QueueConsumers whose URLs are equal but whose
/// regions differ read two queues, and never each other's counts.
#[derive(Default)]
pub struct FactsCache {
    slots: Mutex<HashMap<FactsKey, Slot>>,
}

/// A queue as read by one grant: the endpoint, the role and ExternalId (None: the controller's own
/// identity), the namespace when a tenancy policy is set (its rule decides which DLQ may be read), and
/// the queue. A read made as one namespace's role, or under one namespace's rule, is never handed to
/// another.
type FactsKey = (
    Option<String>,
    Option<(String, String)>,
    Option<String>,
    QueueId,
);

impl FactsCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// Drop what is known of `url` as `get` with the same arguments keys it: the controller changed
    /// the queue (`queue.manage`), so the next `get` reads it again.
    pub async fn forget(
        &self,
        url: &str,
        target: &AwsTarget,
        (tenancy, namespace): (&TenancyPolicy, &str),
    ) {
        let slot = self.slot(Self::key(url, target, (tenancy, namespace)));
        *slot.lock().await = None;
    }

    fn key(
        url: &str,
        target: &AwsTarget,
        (tenancy, namespace): (&TenancyPolicy, &str),
    ) -> FactsKey {
        (
            target.endpoint.clone(),
            target.role.as_ref().map(Role::grant),
            (!tenancy.is_open()).then(|| namespace.to_string()),
            QueueId::of(target.region.as_deref(), url),
        )
    }

    fn slot(&self, key: FactsKey) -> Slot {
        let mut slots = crate::sync::lock(&self.slots);
        slots.entry(key).or_default().clone()
    }

    /// The facts of `url` as a client of `target` reads them, read now or at most `max_age` ago.
    /// Failures are not cached: the next reconcile (after its backoff) reads again.
    ///
    /// The DLQ of the queue's redrive policy is read only when `tenancy` allows it for `namespace`.
    pub async fn get(
        &self,
        url: &str,
        target: &AwsTarget,
        (tenancy, namespace): (&TenancyPolicy, &str),
        max_age: Duration,
        clients: &AwsClients,
        age: SourceAge,
    ) -> Result<Observed, ObserveError> {
        let slot = self.slot(Self::key(url, target, (tenancy, namespace)));
        let mut cached = slot.lock().await;
        // One read per queue in each poll interval, counted from the Unix epoch (the grid the
        // QueueConsumers' slots are placed on, `spread`): whichever QueueConsumer of the queue comes
        // first in an interval reads, the others (and a reconcile of the same one early on its slot)
        // take that read. So the facts a reconcile uses are always younger than its poll interval, and
        // a queue costs at most one GetQueueAttributes per interval however many QueueConsumers share
        // it and wherever their slots fall.
        if let Some(o) = cached.as_ref()
            && super::spread::same_interval(o.at, wall_clock(), max_age.as_std())
        {
            let mut o = o.clone();
            // Another QueueConsumer of the queue read it: the source's age as this one asks for it.
            match age {
                SourceAge::FromWorkers => o.facts.oldest_age_seconds = None,
                SourceAge::FromCloudWatch if o.facts.oldest_age_seconds.is_none() => {
                    o.facts = with_ages(o.facts, age, false, |name| async move {
                        age_or_none(&name, clients.alarms.known_oldest_message_age(&name).await)
                    })
                    .await;
                }
                SourceAge::FromCloudWatch => {}
            }
            return Ok(o);
        }
        let at = wall_clock();
        let allowed = |arn: &str| {
            tenancy
                .check_dead_letter(namespace, arn)
                .map_err(|e| e.to_string())
        };
        let facts = match observe_with(clients.sqs.as_ref(), url, &allowed).await {
            Ok(f) => f,
            Err(e) => {
                *cached = None;
                return Err(e);
            }
        };
        let facts = with_ages(facts, age, true, |name| async move {
            age_or_none(&name, clients.alarms.known_oldest_message_age(&name).await)
        })
        .await;
        let o = Observed {
            facts,
            sampled_at: now(),
            at,
        };
        *cached = Some(o.clone());
        Ok(o)
    }
}

/// The ApproximateAgeOfOldestMessage of the source queue and of the DLQ, through the same CloudWatch
/// adapter call for both. A queue SQS reports empty (nothing visible, in flight or delayed) has no
/// oldest message: 0, without a call. The DLQ is read only when it holds messages. A CloudWatch failure
/// only leaves an age out: the counts from SQS are what scaling and health are decided on.
pub async fn with_oldest_age(facts: Facts, alarms: &dyn Alarms) -> Facts {
    with_ages(facts, SourceAge::FromCloudWatch, true, |name| async move {
        age_or_none(&name, alarms.oldest_message_age(&name).await)
    })
    .await
}

/// `with_oldest_age` as the reconcile does it: from what the background refresher last read, never
/// waiting for CloudWatch (`Alarms::known_oldest_message_age`). An age not read yet, or too old to use,
/// is left out, like a failed read.
pub async fn with_known_oldest_age(facts: Facts, alarms: &dyn Alarms) -> Facts {
    with_ages(facts, SourceAge::FromCloudWatch, true, |name| async move {
        age_or_none(&name, alarms.known_oldest_message_age(&name).await)
    })
    .await
}

/// The source queue's (unless `source` says the workers measure it) and, with `dead_letter`, the DLQ's
/// oldest-message age from `age(queue name)`, skipping the call for a queue SQS reports empty (0) and for
/// an empty DLQ.
async fn with_ages<F, Fut>(mut facts: Facts, source: SourceAge, dead_letter: bool, age: F) -> Facts
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Option<i64>>,
{
    let q = &facts.queue;
    let empty = [q.visible, q.in_flight, q.delayed]
        .iter()
        .all(|c| *c == Some(0));
    facts.oldest_age_seconds = match source {
        SourceAge::FromWorkers => None,
        SourceAge::FromCloudWatch if empty => Some(0),
        SourceAge::FromCloudWatch => age(q.name()).await,
    };
    if !dead_letter {
        return facts;
    }
    if let DeadLetterFacts::Found {
        queue,
        oldest_age_seconds,
    } = &mut facts.dead_letter
        && queue.visible.unwrap_or(0) > 0
    {
        *oldest_age_seconds = age(queue.name()).await;
    }
    facts
}

/// An age read from CloudWatch, or none (logged) when the read failed.
fn age_or_none(name: &str, read: Result<Option<i64>, cloudwatch::CloudWatchError>) -> Option<i64> {
    read.unwrap_or_else(|e| {
        tracing::debug!(queue = %name, error = %e, "oldest message age unavailable");
        None
    })
}

/// Now, at the second precision of Kubernetes timestamps.
pub fn now() -> Time {
    let t = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// Milliseconds since the Unix epoch (the scaler's clock; a clock before 1970 reads as the epoch).
pub fn wall_clock() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Timestamp::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::aws::QueueFacts;

    fn facts(visible: i64) -> Facts {
        Facts {
            queue: QueueFacts {
                url: "https://sqs.us-east-1.amazonaws.com/1/orders".into(),
                arn: Some("arn:aws:sqs:us-east-1:1:orders".into()),
                visibility_timeout: Duration::from_secs(30),
                retention: Duration::from_secs(345_600),
                fifo: false,
                redrive: None,
                visible: Some(visible),
                in_flight: Some(0),
                delayed: Some(0),
            },
            dead_letter: DeadLetterFacts::None,
            oldest_age_seconds: None,
        }
    }

    #[tokio::test]
    async fn with_an_objective_the_source_queues_age_is_not_read() {
        let asked = Mutex::new(Vec::new());
        let age = |name: String| {
            asked.lock().unwrap().push(name);
            async { Some(42) }
        };
        let f = with_ages(facts(5), SourceAge::FromCloudWatch, true, age).await;
        assert_eq!(f.oldest_age_seconds, Some(42));
        assert_eq!(asked.lock().unwrap().as_slice(), ["orders"]);
        asked.lock().unwrap().clear();
        let f = with_ages(facts(5), SourceAge::FromWorkers, true, age).await;
        assert_eq!(f.oldest_age_seconds, None, "the workers measure it");
        assert!(
            asked.lock().unwrap().is_empty(),
            "{:?}",
            asked.lock().unwrap()
        );
        // an empty queue's age is 0 without a call, but not claimed when the workers measure it
        let f = with_ages(facts(0), SourceAge::FromCloudWatch, true, age).await;
        assert_eq!(f.oldest_age_seconds, Some(0));
        assert!(asked.lock().unwrap().is_empty());
        let spec = |objective: &str| -> crate::api::QueueConsumerSpec {
            serde_saphyr::from_str(&format!(
                "queue: {{url: https://sqs.us-east-1.amazonaws.com/1/q}}\nhandler: {{http: {{}}}}\nprocessing: {{p99: 2s}}\nscaling: {objective}\n"
            ))
            .unwrap()
        };
        assert_eq!(SourceAge::of(&spec("{}")), SourceAge::FromCloudWatch);
        assert_eq!(
            SourceAge::of(&spec("{objective: {dwellP99: 1m}}")),
            SourceAge::FromWorkers
        );
    }
}
