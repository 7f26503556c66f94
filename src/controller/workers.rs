//! Reads the worker pods' `/metrics`: per pod the handler-latency histogram and the in-flight gauge,
//! kept over a window of recent scrapes, from which observed P99, mean and throughput are computed.
//! Parsing and the window arithmetic are pure; `scrape` does the HTTP, bounded and with timeouts.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration as StdDuration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;

use crate::api::Duration;
use crate::render::{METRICS_PORT_NAME, WORKER_CONTAINER};
use crate::scaling::Timestamp;
use crate::worker::http1::Pool;

/// The worker's handler-latency histogram and in-flight gauge (src/worker/metrics.rs).
pub const HANDLER_HISTOGRAM: &str = "qc_worker_handler_duration_seconds";
pub const IN_FLIGHT_GAUGE: &str = "qc_worker_in_flight";
/// The worker's counter of messages deleted from the queue (acknowledged, poison moved, duplicates).
pub const DELETED_COUNTER: &str = "qc_worker_messages_deleted_total";

/// The worker's outage-breaker gauge: 0 closed, 1 open (intake paused, only probes), 2 recovering.
pub const BREAKER_GAUGE: &str = "qc_worker_breaker_state";
/// FIFO groups a worker holds, and its worst groups' heads (labelled `group`).
pub const FIFO_GROUPS_GAUGE: &str = "qc_worker_fifo_groups";
pub const FIFO_HEAD_RECEIVES_GAUGE: &str = "qc_worker_fifo_group_head_receives";
pub const FIFO_HEAD_AGE_GAUGE: &str = "qc_worker_fifo_group_head_age_seconds";
/// Group heads read from one pod at most (the worker reports 20).
const MAX_FIFO_HEADS: usize = 100;
/// SQS's longest MessageGroupId.
const MAX_GROUP_ID: usize = 128;

/// A worker's outage breaker as its gauge says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Breaker {
    Closed,
    /// Intake paused: the handler's dependency is failing.
    Open,
    /// Slow start after a successful probe: intake resumed.
    Recovering,
}

impl Breaker {
    /// The gauge's value; None for one this controller does not know (a newer worker).
    pub fn from_gauge(v: f64) -> Option<Breaker> {
        match v {
            0.0 => Some(Breaker::Closed),
            1.0 => Some(Breaker::Open),
            2.0 => Some(Breaker::Recovering),
            _ => None,
        }
    }
}

/// Pods scraped at once per QueueConsumer.
pub const SCRAPE_CONCURRENCY: usize = 16;
/// Pods scraped at once by the whole controller, whatever the number of reconciles running: each
/// scrape holds at most 1 MiB of answer, so the scrapes never hold more than this many MiB together
/// (1,000 consumers whose workers answer 64 MiB bodies: benches/scrape_memory.rs), and a thousand
/// scrapes at once cannot starve each other into timeouts that would report healthy pods unreachable.
pub const GLOBAL_SCRAPE_CONCURRENCY: usize = 32;
/// The controller's scrape slots (`GLOBAL_SCRAPE_CONCURRENCY`).
static SCRAPE_SLOTS: tokio::sync::Semaphore =
    tokio::sync::Semaphore::const_new(GLOBAL_SCRAPE_CONCURRENCY);
/// Connecting to a pod, and the whole exchange with it: a pod that takes longer counts as unreachable.
pub const CONNECT_TIMEOUT: StdDuration = StdDuration::from_secs(1);
pub const SCRAPE_TIMEOUT: StdDuration = StdDuration::from_secs(2);

/// The rule of `ProcessingTimeWithinDeclared`: the window is the last `WINDOW_SCRAPES` scrapes (so
/// `WINDOW_SCRAPES - 1` poll intervals), widened back up to `MAX_SCRAPES` until it holds
/// `MIN_MESSAGES` finished messages; the observed P99 is above the declared one when it exceeds it by
/// more than `TOLERANCE` (20 %).
pub use crate::scaling::objective::{MAX_SCRAPES, MIN_MESSAGES, WINDOW_SCRAPES};
pub const TOLERANCE: f64 = 1.2;
/// The worker's histogram of each message's dwell: SentTimestamp to its leaving the queue.
pub const DWELL_HISTOGRAM: &str = "qc_worker_message_dwell_seconds";

/// The annotation the ReplicaSet controller ranks pods by when it scales in (lower goes first).
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// Pods with a container in CrashLoopBackOff, as "pod/container (N restarts)".
pub fn crash_looping(pods: &[Pod]) -> Vec<String> {
    let mut out = Vec::new();
    for p in pods {
        let name = p.metadata.name.as_deref().unwrap_or("?");
        let statuses = p.status.as_ref().into_iter().flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        });
        for c in statuses {
            let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
            if waiting.and_then(|w| w.reason.as_deref()) == Some("CrashLoopBackOff") {
                out.push(format!("{name}/{} ({} restarts)", c.name, c.restart_count));
            }
        }
    }
    out
}

/// The deletion cost of each running worker pod whose annotation must change: its in-flight count at
/// the latest scrape, so idle pods go first; a pod that did not answer counts as `busy` (its work is
/// unknown, so it is not preferred over a pod known to be idle). Terminating pods are left alone.
pub fn deletion_costs(pods: &[Pod], latest: Option<&Round>, busy: i64) -> Vec<(String, i64)> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let name = p.metadata.name.clone()?;
            let cost = latest
                .and_then(|r| r.pods.get(&name))
                .map_or(busy, |m| m.in_flight.max(0));
            let current = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DELETION_COST));
            (current.map(String::as_str) != Some(cost.to_string().as_str())).then_some((name, cost))
        })
        .collect()
}

/// Why a pod's metrics could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("pod {pod}: {message}")]
    Fetch { pod: String, message: String },
    #[error("pod {pod}: no answer within {SCRAPE_TIMEOUT:?}")]
    Timeout { pod: String },
    #[error("pod {pod}: /metrics answered {status}")]
    Status { pod: String, status: u16 },
    #[error("pod {pod}: /metrics has no {HANDLER_HISTOGRAM} histogram")]
    NoHistogram { pod: String },
    #[error("list worker pods: {0}")]
    ListPods(#[source] kube::Error),
}

/// A worker pod the controller can scrape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub pod: String,
    pub ip: String,
    pub port: u16,
}

impl Target {
    fn authority(&self) -> String {
        if self.ip.contains(':') {
            format!("[{}]:{}", self.ip, self.port)
        } else {
            format!("{}:{}", self.ip, self.port)
        }
    }
}

/// Ready, not terminating, with an IP and the worker's named metrics port, on the container the
/// worker runs in: `qc-worker` (http layout), else the first one (exec layout). A port of that name
/// on another container (a user's sidecar) is never scraped.
pub fn target(pod: &Pod) -> Option<Target> {
    if pod.metadata.deletion_timestamp.is_some() || !is_ready(pod) {
        return None;
    }
    let status = pod.status.as_ref()?;
    let ip = status.pod_ip.clone().filter(|ip| !ip.is_empty())?;
    let containers = &pod.spec.as_ref()?.containers;
    let worker = containers
        .iter()
        .find(|c| c.name == WORKER_CONTAINER)
        .or_else(|| containers.first())?;
    let port = worker
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(METRICS_PORT_NAME))?
        .container_port;
    Some(Target {
        pod: pod.metadata.name.clone()?,
        ip,
        port: u16::try_from(port).ok()?,
    })
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// What one pod's /metrics said.
#[derive(Clone, Debug, PartialEq)]
pub struct PodMetrics {
    /// Upper bounds of the finite buckets.
    pub bounds: Arc<[f64]>,
    /// Cumulative counts per finite bound (Prometheus exposition order).
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum: f64,
    pub in_flight: i64,
    /// `qc_worker_messages_deleted_total`; None when the exposition lacks it.
    pub deleted: Option<u64>,
    /// `qc_worker_breaker_state`; None when the exposition lacks it (a worker without the breaker).
    pub breaker: Option<Breaker>,
    /// `qc_worker_fifo_groups`; None when the exposition lacks it.
    pub fifo_groups: Option<u64>,
    /// The FIFO group heads the pod reports (receive count and age), at most 100.
    pub fifo_heads: Vec<crate::scaling::fifo::GroupHead>,
    /// `qc_worker_message_dwell_seconds`; None when the exposition lacks it (an older worker).
    pub dwell: Option<Buckets>,
}

/// A histogram's finite buckets and total, made sane as [`parse`] says.
#[derive(Clone, Debug, PartialEq)]
pub struct Buckets {
    pub bounds: Arc<[f64]>,
    pub cumulative: Vec<u64>,
    pub count: u64,
}

/// Bucket lines (bound, count) and the total into sorted finite bounds with cumulative counts that only
/// grow and never pass the total (of a bound written twice, the first line counts).
fn sane_buckets(mut buckets: Vec<(f64, u64)>, count: u64) -> Buckets {
    // Stable: of a bound written twice, the first line counts.
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets.dedup_by(|later, earlier| later.0.total_cmp(&earlier.0).is_eq());
    let mut running = 0;
    let cumulative = buckets
        .iter()
        .map(|b| {
            running = b.1.max(running).min(count);
            running
        })
        .collect();
    Buckets {
        bounds: buckets.iter().map(|b| b.0).collect(),
        cumulative,
        count,
    }
}

/// The bound of a `_bucket` line's `le` label and its count, when both are sane numbers.
fn bucket_line(labels: &str, value: Option<u64>) -> Option<(f64, u64)> {
    let le = labels
        .split(',')
        .find_map(|l| l.strip_prefix("le=\""))
        .map(|l| l.trim_end_matches('"'))?;
    let v = value?;
    if le == "+Inf" {
        return None;
    }
    let b = le
        .parse::<f64>()
        .ok()
        .filter(|b| b.is_finite() && *b >= 0.0)?;
    // abs: -0 is the bound 0 (tests/fuzz.rs, `scrape_exposition`).
    Some((b.abs(), v))
}

/// The value of the one label `group="..."` of a sample (Prometheus escapes `\`, `"` and newlines),
/// None when malformed or longer than a MessageGroupId can be.
fn group_label(name_labels: &str) -> Option<String> {
    let (_, rest) = name_labels.split_once('{')?;
    let quoted = rest
        .strip_suffix('}')?
        .strip_prefix("group=\"")?
        .strip_suffix('"')?;
    let mut out = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                other => out.push(other),
            },
            '"' => return None,
            c => out.push(c),
        }
    }
    (out.chars().count() <= MAX_GROUP_ID).then_some(out)
}

/// Parse the parts of a worker's exposition that matter here. None when the histogram is absent.
///
/// The text comes from a pod a tenant runs, so the figures are made sane whatever it says: bucket
/// bounds that are not finite non-negative numbers are left out (and a repeated bound counts once),
/// counts are finite and non-negative (saturating), the cumulative counts only grow and never pass
/// the total, and a sum that is not a finite non-negative number means no histogram. A pod can so
/// misreport only its own figures, never make the controller's observed P99 or mean NaN or infinite
/// (tests/fuzz.rs, `scrape_exposition`).
pub fn parse(text: &str) -> Option<PodMetrics> {
    let bucket = format!("{HANDLER_HISTOGRAM}_bucket");
    let sum_name = format!("{HANDLER_HISTOGRAM}_sum");
    let count_name = format!("{HANDLER_HISTOGRAM}_count");
    let mut buckets: Vec<(f64, u64)> = Vec::new();
    let dwell_bucket = format!("{DWELL_HISTOGRAM}_bucket");
    let dwell_count_name = format!("{DWELL_HISTOGRAM}_count");
    let mut dwell_buckets: Vec<(f64, u64)> = Vec::new();
    let mut dwell_count = None;
    let (mut count, mut sum, mut in_flight, mut deleted) = (None, None, 0i64, None);
    let mut breaker = None;
    let mut fifo_groups = None;
    let mut heads: BTreeMap<String, (u32, f64)> = BTreeMap::new();
    // A count as Prometheus writes it (a float): finite and non-negative, else none.
    let count_of = |value: &str| {
        value
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| v as u64)
    };
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = match name_labels.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (name_labels, ""),
        };
        if name == bucket {
            buckets.extend(bucket_line(labels, count_of(value)));
        } else if name == dwell_bucket {
            dwell_buckets.extend(bucket_line(labels, count_of(value)));
        } else if name == dwell_count_name {
            dwell_count = count_of(value);
        } else if name == sum_name {
            sum = value.parse::<f64>().ok();
        } else if name == count_name {
            count = count_of(value);
        } else if name == IN_FLIGHT_GAUGE {
            in_flight = value.parse::<f64>().map_or(0, |v| v as i64);
        } else if name == BREAKER_GAUGE {
            breaker = value.parse::<f64>().ok().and_then(Breaker::from_gauge);
        } else if name == DELETED_COUNTER {
            deleted = count_of(value);
        } else if name == FIFO_GROUPS_GAUGE {
            fifo_groups = count_of(value);
        } else if name == FIFO_HEAD_RECEIVES_GAUGE || name == FIFO_HEAD_AGE_GAUGE {
            let (Some(group), Some(v)) = (group_label(name_labels), count_of(value).map(|_| value))
            else {
                continue;
            };
            let Ok(v) = v.parse::<f64>() else { continue };
            if heads.len() >= MAX_FIFO_HEADS && !heads.contains_key(&group) {
                continue;
            }
            let e = heads.entry(group).or_insert((0, 0.0));
            if name == FIFO_HEAD_RECEIVES_GAUGE {
                e.0 = u32::try_from(v as u64).unwrap_or(u32::MAX);
            } else {
                e.1 = v.min(1e9);
            }
        }
    }
    let count = count?;
    let sum = sum.filter(|s| s.is_finite() && *s >= 0.0)?;
    let handler = sane_buckets(buckets, count);
    Some(PodMetrics {
        bounds: handler.bounds,
        cumulative: handler.cumulative,
        count,
        sum,
        in_flight,
        deleted,
        breaker,
        fifo_groups,
        fifo_heads: heads
            .into_iter()
            .map(|(group, (receives, age))| crate::scaling::fifo::GroupHead {
                group,
                head_age: std::time::Duration::from_secs_f64(age),
                head_failures: receives.saturating_sub(1),
                held: 1,
            })
            .collect(),
        dwell: dwell_count.map(|c| sane_buckets(dwell_buckets, c)),
    })
}

/// One scrape of a QueueConsumer's pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Round {
    pub at: Timestamp,
    pub pods: BTreeMap<String, PodMetrics>,
    /// Ready pods that did not answer.
    pub unreachable: Vec<String>,
}

impl Round {
    /// The FIFO group heads all pods report, and the groups they hold in all (None: no pod reports
    /// FIFO groups).
    pub fn fifo(&self) -> Option<(u64, Vec<crate::scaling::fifo::GroupHead>)> {
        let held: Option<u64> = self
            .pods
            .values()
            .filter_map(|m| m.fifo_groups)
            .reduce(u64::saturating_add);
        let heads = self
            .pods
            .values()
            .flat_map(|m| m.fifo_heads.iter().cloned())
            .collect();
        held.map(|h| (h, heads))
    }

    /// Pods that answered with their outage breaker open.
    pub fn breaker_open(&self) -> usize {
        self.pods
            .values()
            .filter(|m| m.breaker == Some(Breaker::Open))
            .count()
    }
}

/// What the window says.
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    /// None when no message finished in the window.
    pub p99_seconds: Option<f64>,
    pub mean_seconds: Option<f64>,
    pub messages_per_second: f64,
    pub messages: u64,
    pub window: Duration,
}

pub use crate::scaling::objective::quantile;

/// Deltas of every pod of the newest round against its oldest reading among `rounds` (a pod seen once
/// adds nothing: its counts may cover any past; a counter that went back means a restart, and the
/// reading after it is the base), summed over pods.
pub fn stats(rounds: &[&Round]) -> Option<Stats> {
    let newest = rounds.last()?;
    let mut bounds: Option<Arc<[f64]>> = None;
    let mut cumulative: Vec<u64> = Vec::new();
    let (mut count, mut sum, mut per_second, mut span_ms) = (0u64, 0.0f64, 0.0f64, 0u64);
    let mut any = false;
    for (pod, now) in &newest.pods {
        let handler = |m: &PodMetrics| Some((m.count, m.bounds.clone()));
        let Some((base_at, base)) = base_of(rounds, pod, now, handler) else {
            continue;
        };
        match &bounds {
            None => {
                bounds = Some(now.bounds.clone());
                cumulative = vec![0; now.bounds.len()];
            }
            Some(b) if *b != now.bounds => continue,
            Some(_) => {}
        }
        any = true;
        for (c, (n, o)) in cumulative
            .iter_mut()
            .zip(now.cumulative.iter().zip(&base.cumulative))
        {
            *c += n.saturating_sub(*o);
        }
        let d = now.count - base.count;
        count += d;
        sum += (now.sum - base.sum).max(0.0);
        let ms = newest.at.as_millis().saturating_sub(base_at.as_millis());
        if ms > 0 {
            per_second += d as f64 * 1000.0 / ms as f64;
        }
        span_ms = span_ms.max(ms);
    }
    if !any {
        return None;
    }
    let bounds = bounds.unwrap_or_else(|| Arc::from(Vec::new()));
    Some(Stats {
        p99_seconds: quantile(0.99, &bounds, &cumulative, count),
        // Finite per pod; a sum over pods can still overflow.
        mean_seconds: (count > 0)
            .then(|| sum / count as f64)
            .filter(|m| m.is_finite()),
        messages_per_second: per_second,
        messages: count,
        // To the second: the span moves by the scrapes' jitter (milliseconds) every poll, and it is
        // shown in status and in the condition's message, which would then change at every scrape.
        window: Duration::from_millis(span_ms.saturating_add(500) / 1000 * 1000),
    })
}

/// Messages the QueueConsumer's workers deleted from `older` to `newer`: the sum of each pod's counter
/// delta (a counter that went back is a restart, and counts from zero). None unless the two rounds account
/// for every delete: a pod of `older` missing from `newer` (scaled in, restarted under a new name, not
/// ready) took its last deletes with it, and a pod that did not answer or has no counter leaves a gap. A
/// pod new in `newer` counts its whole counter: it was not ready at `older`, and a worker receives only
/// once ready. The scaler then estimates completions instead (docs/scaling.md, "Arrivals").
pub fn deleted_between(older: &Round, newer: &Round) -> Option<u64> {
    if !older.unreachable.is_empty() || !newer.unreachable.is_empty() || newer.at <= older.at {
        return None;
    }
    if older.pods.keys().any(|pod| !newer.pods.contains_key(pod)) {
        return None;
    }
    let mut total = 0u64;
    for (pod, now) in &newer.pods {
        let now = now.deleted?;
        let delta = match older.pods.get(pod) {
            Some(before) => {
                let before = before.deleted?;
                if now >= before { now - before } else { now }
            }
            None => now,
        };
        total = total.saturating_add(delta);
    }
    Some(total)
}

/// Whether a scrape `since` the last one is due, scraping `every` interval.
pub fn scrape_due(since: StdDuration, every: StdDuration) -> bool {
    since + super::spread::slack(every) >= every
}

/// How soon after this process's first scrape of a QueueConsumer's pods the second one comes: a
/// third of the poll interval, at most 5 s. One scrape gives no rate; without this the first rates
/// (and the status write they cause) came a whole poll interval later, in what is otherwise steady
/// state, and on a long `pollInterval` a new consumer showed nothing for that long.
pub fn warm_up(every: StdDuration) -> StdDuration {
    (every / 3).min(StdDuration::from_secs(5))
}

/// The reading of `pod` among `rounds` (newest last, `now` its reading in the newest) that a delta of the
/// histogram `of` starts from: back from the newest while the count only grew and the bounds stayed the
/// same (a count that went back is a restart, and the reading after it is the base); a scrape that missed
/// the pod (timeout under load) breaks nothing. None for a pod seen once (its counts may cover any past).
fn base_of<'a>(
    rounds: &[&'a Round],
    pod: &str,
    now: &PodMetrics,
    of: impl Fn(&PodMetrics) -> Option<(u64, Arc<[f64]>)>,
) -> Option<(Timestamp, &'a PodMetrics)> {
    let (mut next_count, bounds) = of(now)?;
    let mut base = None;
    for r in rounds[..rounds.len().saturating_sub(1)].iter().rev() {
        match r.pods.get(pod).map(|m| (m, of(m))) {
            Some((m, Some((count, b)))) if count <= next_count && b == bounds => {
                base = Some((r.at, m));
                next_count = count;
            }
            None => {}
            Some(_) => break,
        }
    }
    base
}

/// The dwell histogram's deltas over `rounds` (newest last), summed over pods as [`stats`] sums the
/// handler's, with the span they cover; None when no pod has two readings of it with the same bounds.
pub fn dwell_delta(rounds: &[&Round]) -> Option<(crate::scaling::objective::Histogram, Duration)> {
    let newest = rounds.last()?;
    let of = |m: &PodMetrics| m.dwell.as_ref().map(|d| (d.count, d.bounds.clone()));
    let mut out: Option<crate::scaling::objective::Histogram> = None;
    let mut span_ms = 0u64;
    for (pod, now) in &newest.pods {
        let (Some(d), Some((base_at, base))) = (&now.dwell, base_of(rounds, pod, now, of)) else {
            continue;
        };
        let Some(b) = &base.dwell else { continue };
        let h = out.get_or_insert_with(|| crate::scaling::objective::Histogram {
            bounds: d.bounds.to_vec(),
            cumulative: vec![0; d.bounds.len()],
            count: 0,
        });
        if h.bounds[..] != d.bounds[..] {
            continue;
        }
        for (c, (n, o)) in h
            .cumulative
            .iter_mut()
            .zip(d.cumulative.iter().zip(&b.cumulative))
        {
            *c += n.saturating_sub(*o);
        }
        h.count += d.count.saturating_sub(b.count);
        span_ms = span_ms.max(newest.at.as_millis().saturating_sub(base_at.as_millis()));
    }
    // to the second, as the handler's window (status shows it)
    out.map(|h| {
        (
            h,
            Duration::from_millis(span_ms.saturating_add(500) / 1000 * 1000),
        )
    })
}

/// Messages deleted by a QueueConsumer's workers between two scrapes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deleted {
    pub count: u64,
    /// From the older scrape to the newer one.
    pub span: Duration,
    /// When the newer scrape was made.
    pub at: Timestamp,
}

/// The rounds of one QueueConsumer, newest last.
#[derive(Clone, Debug, Default)]
pub struct Window {
    rounds: VecDeque<Round>,
    scraped: Option<Instant>,
}

impl Window {
    pub fn push(&mut self, round: Round) {
        self.rounds.push_back(round);
        while self.rounds.len() > MAX_SCRAPES {
            self.rounds.pop_front();
        }
    }

    pub fn latest(&self) -> Option<&Round> {
        self.rounds.back()
    }

    /// From the first scrape this process keeps to the last.
    pub fn span(&self) -> StdDuration {
        match (self.rounds.front(), self.rounds.back()) {
            (Some(a), Some(b)) => b.at.since(a.at).as_std(),
            _ => StdDuration::ZERO,
        }
    }

    /// The last scrape's pods answered, and none of them was read before: no rate yet, and the next
    /// scrape is due after [`warm_up`] (a new consumer's first pods, a restarted controller's first
    /// scrape, a rollout's new pods).
    fn first_scrape_only(&self) -> bool {
        let Some(last) = self.rounds.back() else {
            return false;
        };
        !last.pods.is_empty()
            && !self
                .rounds
                .iter()
                .take(self.rounds.len() - 1)
                .any(|r| r.pods.keys().any(|p| last.pods.contains_key(p)))
    }

    /// The deletes from the scrape nearest `from` (the previous scaling sample) to the newest one, with
    /// the time they span: every pair of scrapes between them must count ([`deleted_between`]). Scrapes
    /// and samples run on clocks of their own (a scrape may come in a reconcile that takes no sample),
    /// so counting only the two newest scrapes dropped the deletes of a scrape no sample took (and
    /// counted them twice when no scrape came between two samples). None when the newest scrape is the
    /// one nearest `from`.
    pub fn deleted_since(&self, from: Timestamp) -> Option<Deleted> {
        let newer = self.rounds.back()?;
        let older = self.rounds.len().checked_sub(1)?;
        let start = (0..self.rounds.len())
            .min_by_key(|&i| self.rounds[i].at.as_millis().abs_diff(from.as_millis()))?;
        if start == older {
            // No scrape since the one the previous sample took: its deletes are in that sample.
            return None;
        }
        let mut count = 0u64;
        for i in start..older {
            count = count.saturating_add(deleted_between(&self.rounds[i], &self.rounds[i + 1])?);
        }
        let oldest = &self.rounds[start];
        Some(Deleted {
            count,
            span: Duration::from_millis(newer.at.as_millis().saturating_sub(oldest.at.as_millis())),
            at: newer.at,
        })
    }

    /// The rule's window: the last `WINDOW_SCRAPES`, widened until it holds `MIN_MESSAGES`.
    pub fn stats(&self) -> Option<Stats> {
        let all: Vec<&Round> = self.rounds.iter().collect();
        let mut best = None;
        for n in WINDOW_SCRAPES..=MAX_SCRAPES.max(WINDOW_SCRAPES) {
            let from = all.len().saturating_sub(n);
            let s = stats(&all[from..]);
            let enough = s.as_ref().is_some_and(|s| s.messages >= MIN_MESSAGES);
            if s.is_some() {
                best = s;
            }
            if enough || from == 0 {
                break;
            }
        }
        best
    }
}

impl Window {
    /// The dwell objective's measurement over the rule's window (the last `WINDOW_SCRAPES`, widened until
    /// it holds `MIN_MESSAGES` messages that left the queue).
    pub fn dwell(&self, objective: Duration) -> Option<crate::scaling::objective::Measurement> {
        let all: Vec<&Round> = self.rounds.iter().collect();
        let mut best = None;
        for n in WINDOW_SCRAPES..=MAX_SCRAPES.max(WINDOW_SCRAPES) {
            let from = all.len().saturating_sub(n);
            let m = dwell_delta(&all[from..]).map(|(h, window)| {
                crate::scaling::objective::Measurement::of(&h, objective, window)
            });
            let enough = m.is_some_and(|m| m.messages >= MIN_MESSAGES);
            if m.is_some() {
                best = m;
            }
            if enough || from == 0 {
                break;
            }
        }
        best
    }
}

/// The windows of every QueueConsumer, keyed like the scaler's histories.
#[derive(Default)]
pub struct Windows {
    entries: Mutex<HashMap<String, Window>>,
}

impl Windows {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Window>> {
        crate::sync::lock(&self.entries)
    }

    /// Whether a scrape is due: none yet, or the last one at least `every` ago.
    /// Whether a scrape is due: an interval since the last, less `spread::slack` (a reconcile on its
    /// slot comes back a little early as often as late; without the slack every other one skipped).
    /// Once in each poll interval counted from the Unix epoch (`spread::same_interval`, as the
    /// queue's facts): a QueueConsumer's reconcile on its slot scrapes, another one in the same
    /// interval does not. The second scrape is due sooner, after [`warm_up`].
    pub fn due(&self, key: &str, every: Duration, now: Timestamp) -> bool {
        self.lock().get(key).is_none_or(|w| {
            let Some(last) = w.latest() else {
                return true;
            };
            !super::spread::same_interval(last.at, now, every.as_std())
                || w.scraped.is_some_and(|t| {
                    w.first_scrape_only() && t.elapsed() >= warm_up(every.as_std())
                })
        })
    }

    /// How long until the warm-up scrape of `key` (its second) is due, when that is what comes next.
    pub fn warm_up_in(&self, key: &str, every: Duration) -> Option<StdDuration> {
        let entries = self.lock();
        let w = entries.get(key)?;
        let t = w.scraped?;
        w.first_scrape_only()
            .then(|| warm_up(every.as_std()).saturating_sub(t.elapsed()))
    }

    pub fn push(&self, key: &str, round: Round) {
        let mut entries = self.lock();
        let w = entries.entry(key.to_string()).or_default();
        w.scraped = Some(Instant::now());
        w.push(round);
    }

    pub fn get(&self, key: &str) -> Option<Window> {
        self.lock().get(key).cloned()
    }

    /// [`Window::deleted_since`] of `key`'s window.
    pub fn deleted_since(&self, key: &str, from: Timestamp) -> Option<Deleted> {
        self.lock().get(key).and_then(|w| w.deleted_since(from))
    }

    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }
}

/// Scrape every target, `SCRAPE_CONCURRENCY` at a time (and at most `GLOBAL_SCRAPE_CONCURRENCY` in
/// the whole controller), each within `SCRAPE_TIMEOUT` once it has its slot: one slow or
/// failing pod never holds the others back.
pub async fn scrape(targets: &[Target], at: Timestamp) -> (Round, Vec<ScrapeError>) {
    let results: Vec<(String, Result<PodMetrics, ScrapeError>)> =
        futures::stream::iter(targets.iter().cloned())
            .map(|t| async move {
                let pod = t.pod.clone();
                // A slot of the controller's (waiting for one is not the pod's time: the timeout
                // starts once the slot is ours). The semaphore is never closed.
                let _slot = SCRAPE_SLOTS.acquire().await.ok();
                let r = match tokio::time::timeout(SCRAPE_TIMEOUT, fetch(&t)).await {
                    Ok(r) => r,
                    Err(_) => Err(ScrapeError::Timeout { pod: pod.clone() }),
                };
                (pod, r)
            })
            .buffer_unordered(SCRAPE_CONCURRENCY)
            .collect()
            .await;
    let mut round = Round {
        at,
        ..Round::default()
    };
    let mut errors = Vec::new();
    for (pod, r) in results {
        match r {
            Ok(m) => {
                round.pods.insert(pod, m);
            }
            Err(e) => {
                round.unreachable.push(pod);
                errors.push(e);
            }
        }
    }
    round.unreachable.sort();
    (round, errors)
}

async fn fetch(t: &Target) -> Result<PodMetrics, ScrapeError> {
    let authority = t.authority();
    let pool = Pool::new(authority.clone(), 0, StdDuration::ZERO, CONNECT_TIMEOUT);
    let head = format!(
        "GET /metrics HTTP/1.1\r\nhost: {authority}\r\naccept: text/plain\r\nconnection: close\r\n\r\n"
    );
    let answer = pool
        .send(head.as_bytes(), b"", true)
        .await
        .map_err(|e| ScrapeError::Fetch {
            pod: t.pod.clone(),
            message: crate::aws::error_chain(&e),
        })?;
    if answer.status != 200 {
        return Err(ScrapeError::Status {
            pod: t.pod.clone(),
            status: answer.status,
        });
    }
    parse(&String::from_utf8_lossy(&answer.body))
        .ok_or_else(|| ScrapeError::NoHistogram { pod: t.pod.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// However many reconciles scrape at once, no more than `GLOBAL_SCRAPE_CONCURRENCY` pods are
    /// read at a time in the whole controller (each answer holds up to 1 MiB).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn scrapes_across_all_consumers_are_bounded_together() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = std::sync::Arc::new(AtomicUsize::new(0));
        let most = std::sync::Arc::new(AtomicUsize::new(0));
        let (o, m) = (open.clone(), most.clone());
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let (o, m) = (o.clone(), m.clone());
                tokio::spawn(async move {
                    let now = o.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    let mut req = [0u8; 1024];
                    let _ = s.read(&mut req).await;
                    tokio::time::sleep(StdDuration::from_millis(100)).await;
                    let body = "qc_worker_handler_duration_seconds_count 1\n";
                    let _ = s
                        .write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                    o.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        // Six reconciles at once, each with 16 pods: 96 scrapes.
        let rounds = futures::future::join_all((0..6).map(|c| async move {
            let targets: Vec<Target> = (0..SCRAPE_CONCURRENCY)
                .map(|i| Target {
                    pod: format!("qc-{c}-{i}"),
                    ip: "127.0.0.1".into(),
                    port,
                })
                .collect();
            scrape(&targets, Timestamp::from_millis(0)).await
        }))
        .await;
        let answered: usize = rounds.iter().map(|(r, e)| r.pods.len() + e.len()).sum();
        assert_eq!(answered, 6 * SCRAPE_CONCURRENCY, "every pod scraped");
        let most = most.load(Ordering::SeqCst);
        assert!(most <= 32, "{most} pods read at once, above 32");
        assert!(
            most > SCRAPE_CONCURRENCY,
            "reconciles did scrape side by side: {most}"
        );
    }

    /// #29 item 1: the scrape goes to the worker's own container, never to a port of the same name
    /// that a user's container declares (ahead of the worker's, or in the exec layout beside it).
    #[test]
    fn the_target_is_the_worker_containers_port_never_a_sidecars() {
        let pod = |containers: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": containers},
                "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .unwrap()
        };
        let port = |name: &str, n: u16| serde_json::json!({"name": name, "containerPort": n});
        // http layout: a sidecar declaring qc-metrics first is passed over for qc-worker's.
        let http = pod(serde_json::json!([
            {"name": "app", "ports": [port("http", 8080)]},
            {"name": "evil", "ports": [port("qc-metrics", 6666)]},
            {"name": "qc-worker", "ports": [port("qc-metrics", 9090)]},
        ]));
        assert_eq!(target(&http).map(|t| t.port), Some(9090));
        // exec layout: the worker runs in the first container; a later one's port is not it.
        let exec = pod(serde_json::json!([
            {"name": "handler", "ports": [port("qc-metrics", 9091)]},
            {"name": "evil", "ports": [port("qc-metrics", 6666)]},
        ]));
        assert_eq!(target(&exec).map(|t| t.port), Some(9091));
        // No metrics port on the worker's container: no target, whatever the others declare.
        let none = pod(serde_json::json!([
            {"name": "handler"},
            {"name": "evil", "ports": [port("qc-metrics", 6666)]},
        ]));
        assert_eq!(target(&none), None);
    }

    fn text(buckets: &[(f64, u64)], count: u64, sum: f64, in_flight: i64) -> String {
        let mut s = String::from(
            "# HELP qc_worker_handler_duration_seconds x\n# TYPE qc_worker_handler_duration_seconds histogram\n",
        );
        for (b, c) in buckets {
            s.push_str(&format!(
                "qc_worker_handler_duration_seconds_bucket{{le=\"{b}\"}} {c}\n"
            ));
        }
        s.push_str(&format!(
            "qc_worker_handler_duration_seconds_bucket{{le=\"+Inf\"}} {count}\nqc_worker_handler_duration_seconds_sum {sum}\nqc_worker_handler_duration_seconds_count {count}\nqc_worker_in_flight {in_flight}\n"
        ));
        s
    }

    fn round(at_ms: u64, pods: &[(&str, &str)]) -> Round {
        Round {
            at: Timestamp::from_millis(at_ms),
            pods: pods
                .iter()
                .map(|(p, t)| (p.to_string(), parse(t).unwrap()))
                .collect(),
            unreachable: vec![],
        }
    }

    #[test]
    fn a_tenants_odd_numbers_make_sane_figures() {
        let h = HANDLER_HISTOGRAM;
        let text = format!(
            "{h}_bucket{{le=\"NaN\"}} 1\n{h}_bucket{{le=\"0.5\"}} 1e309\n{h}_bucket{{le=\"1e308\"}} 1\n\
             {h}_bucket{{le=\"-1\"}} 1\n{h}_sum 3\n{h}_count 2\n"
        );
        let m = parse(&text).unwrap();
        assert_eq!(&m.bounds[..], &[1e308]);
        assert_eq!(m.cumulative, [1]);
        // Counts beyond the total are clamped to it; a sum that is no finite non-negative number
        // means no histogram.
        let m = parse(&format!(
            "{h}_bucket{{le=\"1\"}} 9\n{h}_sum 1\n{h}_count 2\n"
        ))
        .unwrap();
        assert_eq!(m.cumulative, [2]);
        for sum in ["NaN", "+Inf", "-1"] {
            assert_eq!(
                parse(&format!("{h}_sum {sum}\n{h}_count 2\n")),
                None,
                "{sum}"
            );
        }
        // A huge bound interpolates to a finite quantile.
        assert!(quantile(0.99, &[1.7e308], &[2], 2).unwrap().is_finite());
    }

    #[test]
    fn parses_the_workers_own_exposition() {
        let m = crate::worker::metrics::Metrics::default();
        m.handler_seconds.observe(0.3);
        m.handler_seconds.observe(0.02);
        m.in_flight.set(4);
        let p = parse(&m.render()).unwrap();
        assert_eq!(p.count, 2);
        assert!((p.sum - 0.32).abs() < 1e-6, "{}", p.sum);
        assert_eq!(p.in_flight, 4);
        assert_eq!(p.bounds.len(), p.cumulative.len());
        assert_eq!(p.cumulative.last(), Some(&2));
        assert!(parse("qc_worker_in_flight 3\n").is_none());
    }

    #[test]
    fn the_deleted_counter_is_read_from_the_workers_exposition() {
        let m = crate::worker::metrics::Metrics::default();
        m.handler_seconds.observe(0.3);
        assert_eq!(parse(&m.render()).unwrap().deleted, Some(0));
        m.deleted.add(7);
        assert_eq!(parse(&m.render()).unwrap().deleted, Some(7));
        // an exposition without it (another version of the worker) has no count, not zero
        assert_eq!(parse(&text(&[(1.0, 1)], 1, 0.3, 0)).unwrap().deleted, None);
    }

    #[test]
    fn the_breaker_state_is_read_per_pod() {
        let t = text(&[(1.0, 1)], 1, 0.3, 0);
        let with =
            |state: &str| format!("{t}# TYPE {BREAKER_GAUGE} gauge\n{BREAKER_GAUGE} {state}\n");
        assert_eq!(parse(&with("0")).unwrap().breaker, Some(Breaker::Closed));
        assert_eq!(parse(&with("1")).unwrap().breaker, Some(Breaker::Open));
        assert_eq!(
            parse(&with("2")).unwrap().breaker,
            Some(Breaker::Recovering)
        );
        // a value this controller does not know, or a worker without the breaker: not open
        assert_eq!(parse(&with("7")).unwrap().breaker, None);
        assert_eq!(parse(&t).unwrap().breaker, None);
        let r = round(
            0,
            &[
                ("a", &with("1")),
                ("b", &with("2")),
                ("c", &with("1")),
                ("d", &t),
            ],
        );
        assert_eq!(
            r.breaker_open(),
            2,
            "recovering and unknown pods are not open"
        );
    }

    fn with_deleted(t: &str, deleted: u64) -> String {
        format!("{t}{DELETED_COUNTER} {deleted}\n")
    }

    #[test]
    fn deletes_between_rounds_are_summed_over_pods() {
        let t = text(&[(1.0, 1)], 1, 0.3, 0);
        let r = |at, pods: &[(&str, u64)]| {
            let texts: Vec<(String, String)> = pods
                .iter()
                .map(|(p, d)| (p.to_string(), with_deleted(&t, *d)))
                .collect();
            let refs: Vec<(&str, &str)> = texts
                .iter()
                .map(|(p, x)| (p.as_str(), x.as_str()))
                .collect();
            round(at, &refs)
        };
        let older = r(1_000, &[("a", 100), ("b", 5)]);
        // a: +30; b restarted (counter went back to 2): its 2 since the restart; c new: all its 4
        let newer = r(16_000, &[("a", 130), ("b", 2), ("c", 4)]);
        assert_eq!(deleted_between(&older, &newer), Some(36));
        // b is gone: its deletes since `older` are unknown
        assert_eq!(
            deleted_between(&older, &r(16_000, &[("a", 130), ("c", 4)])),
            None
        );
        // a pod that did not answer leaves a gap
        let mut gap = newer.clone();
        gap.unreachable.push("d".to_string());
        assert_eq!(deleted_between(&older, &gap), None);
        // a pod without the counter leaves a gap too
        let mut plain = newer.clone();
        plain.pods.get_mut("c").unwrap().deleted = None;
        assert_eq!(deleted_between(&older, &plain), None);
        // rounds out of order count nothing
        assert_eq!(deleted_between(&newer, &older), None);

        let mut w = Window::default();
        w.push(older);
        assert_eq!(
            w.deleted_since(Timestamp::from_millis(1_000)),
            None,
            "one round has no span"
        );
        w.push(newer);
        assert_eq!(
            w.deleted_since(Timestamp::from_millis(900)),
            Some(Deleted {
                count: 36,
                span: Duration::from_secs(15),
                at: Timestamp::from_millis(16_000)
            })
        );
        // A scrape no sample took (at 31 s) keeps its deletes: a sample that came at 16.2 s and the
        // next at 46.1 s get every delete from the scrape nearest 16.2 s on, the 36 above not again.
        w.push(r(31_000, &[("a", 140), ("b", 2), ("c", 4)]));
        w.push(r(46_000, &[("a", 141), ("b", 3), ("c", 9)]));
        assert_eq!(
            w.deleted_since(Timestamp::from_millis(16_200)),
            Some(Deleted {
                count: 17,
                span: Duration::from_secs(30),
                at: Timestamp::from_millis(46_000)
            })
        );
        // A gap in any pair between them leaves the count unknown.
        let mut gap = r(61_000, &[("a", 150), ("b", 3), ("c", 9)]);
        gap.unreachable.push("d".to_string());
        w.push(gap);
        w.push(r(76_000, &[("a", 151), ("b", 3), ("c", 9)]));
        assert_eq!(w.deleted_since(Timestamp::from_millis(46_000)), None);
        assert_eq!(
            w.deleted_since(Timestamp::from_millis(75_000)),
            None,
            "no scrape since the one nearest the previous sample: its deletes were counted then"
        );
        assert_eq!(
            w.deleted_since(Timestamp::from_millis(74_000))
                .map(|d| d.count),
            None,
            "the nearest scrape to 74 s is the gap at 61 s"
        );
    }

    #[test]
    fn the_dwell_histogram_is_read_and_its_deltas_summed_over_pods() {
        let m = crate::worker::metrics::Metrics::default();
        m.handler_seconds.observe(0.1);
        // an exposition without the dwell histogram (an older worker) has none
        assert_eq!(parse(&text(&[(1.0, 1)], 1, 0.3, 0)).unwrap().dwell, None);
        let at = |at_ms: u64, pods: &[(&str, &[f64])]| {
            let texts: Vec<(String, String)> = pods
                .iter()
                .map(|(p, dwells)| {
                    let m = crate::worker::metrics::Metrics::default();
                    m.handler_seconds.observe(0.1);
                    for d in *dwells {
                        m.dwell_seconds.observe(*d);
                    }
                    (p.to_string(), m.render())
                })
                .collect();
            let refs: Vec<(&str, &str)> = texts
                .iter()
                .map(|(p, t)| (p.as_str(), t.as_str()))
                .collect();
            round(at_ms, &refs)
        };
        let first = at(0, &[("a", &[100.0; 5]), ("b", &[])]);
        assert_eq!(first.pods["a"].dwell.as_ref().unwrap().count, 5);
        // 15 s later: a +60 at 3 s, b +40 at 30 s; c is new (its counts could cover any past)
        let mut a = vec![100.0; 5];
        a.extend([3.0; 60]);
        let second = at(
            15_000,
            &[("a", &a), ("b", &[30.0; 40]), ("c", &[500.0; 99])],
        );
        let (h, window) = dwell_delta(&[&first, &second]).unwrap();
        assert_eq!(
            h.count, 100,
            "the lifetime totals are not counted, c not at all"
        );
        assert_eq!(window, Duration::from_secs(15));
        let m = crate::scaling::objective::Measurement::of(&h, Duration::from_secs(20), window);
        assert_eq!(m.messages, 100);
        assert!((m.bad_fraction() - 0.4).abs() < 1e-9, "{m:?}");
        assert!(m.burning());
        let mut w = Window::default();
        w.push(first);
        w.push(second);
        assert_eq!(w.dwell(Duration::from_secs(20)), Some(m));
        // a restarted pod counts from its restart
        let third = at(30_000, &[("a", &[3.0; 10]), ("b", &[30.0; 40])]);
        w.push(third);
        let fourth = at(45_000, &[("a", &[3.0; 70]), ("b", &[30.0; 40])]);
        w.push(fourth);
        let m = w.dwell(Duration::from_secs(20)).unwrap();
        assert_eq!(
            m.messages,
            60 + 40,
            "a since its restart, b since the first: {m:?}"
        );
    }

    #[test]
    fn quantile_interpolates_like_prometheus() {
        let b = [0.1, 0.5, 1.0];
        // 100 messages: 90 under 0.1, 10 in (0.1, 0.5]: rank 99 is 9/10 into the second bucket.
        let q = quantile(0.99, &b, &[90, 100, 100], 100).unwrap();
        assert!((q - 0.46).abs() < 1e-9, "{q}");
        // Beyond the last finite bound: that bound.
        assert_eq!(quantile(0.99, &b, &[0, 0, 0], 10), Some(1.0));
        assert_eq!(quantile(0.99, &b, &[0, 0, 0], 0), None);
    }

    #[test]
    fn stats_are_deltas_summed_over_pods() {
        let b = [(0.1, 0), (0.5, 0)];
        let r0 = round(
            0,
            &[
                ("a", &text(&b, 0, 0.0, 0)),
                ("b", &text(&[(0.1, 5), (0.5, 5)], 5, 0.25, 0)),
            ],
        );
        let r1 = round(
            10_000,
            &[
                ("a", &text(&[(0.1, 0), (0.5, 100)], 100, 30.0, 3)),
                ("b", &text(&[(0.1, 105), (0.5, 105)], 105, 5.25, 0)),
                // Seen once: its counts could cover any past, so they are left out.
                ("c", &text(&[(0.1, 999), (0.5, 999)], 999, 9.0, 0)),
            ],
        );
        let s = stats(&[&r0, &r1]).unwrap();
        assert_eq!(s.messages, 200);
        assert!((s.messages_per_second - 20.0).abs() < 1e-9);
        assert!((s.mean_seconds.unwrap() - 35.0 / 200.0).abs() < 1e-9);
        // 100 fast, 100 in (0.1, 0.5]: rank 198 is 98/100 into the slow bucket.
        assert!((s.p99_seconds.unwrap() - (0.1 + 0.4 * 0.98)).abs() < 1e-9);
        assert_eq!(s.window, Duration::from_secs(10));
        // One round: no delta.
        assert!(stats(&[&r1]).is_none());
    }

    #[test]
    fn a_restarted_pod_counts_from_its_restart() {
        let t = |n| text(&[(0.1, n), (0.5, n)], n, 0.0, 0);
        let rounds = [
            round(0, &[("a", &t(5))]),
            round(1000, &[("a", &t(500))]),
            round(2000, &[("a", &t(10))]),
            round(3000, &[("a", &t(30))]),
        ];
        let refs: Vec<&Round> = rounds.iter().collect();
        assert_eq!(stats(&refs).unwrap().messages, 20);
    }

    #[test]
    fn a_reconcile_on_its_slot_a_little_early_still_scrapes() {
        let poll = StdDuration::from_secs(15);
        assert!(scrape_due(StdDuration::from_millis(14_990), poll));
        assert!(scrape_due(StdDuration::from_millis(13_600), poll));
        assert!(!scrape_due(StdDuration::from_secs(12), poll));
        // A watch-triggered reconcile soon after a scrape does not scrape again.
        assert!(!scrape_due(StdDuration::from_secs(1), poll));
    }

    #[test]
    fn scrapes_once_per_interval_and_the_second_soon_after_the_first() {
        let poll = Duration::from_secs(15);
        let t = |n| text(&[(0.1, n), (0.5, n)], n, 0.0, 0);
        let cell = 1_700_000_010_000u64; // a multiple of 15 s
        let w = Windows::new();
        assert!(
            w.due("q", poll, Timestamp::from_millis(cell + 100)),
            "never scraped"
        );
        w.push("q", round(cell + 100, &[("a", &t(5))]));
        // The first scrape of these pods gives no rate: the second is due after the warm-up, in
        // the same interval, not a whole interval later.
        assert!(!w.due("q", poll, Timestamp::from_millis(cell + 200)));
        let warm = w.warm_up_in("q", poll).unwrap();
        assert!(warm > StdDuration::from_secs(4) && warm <= warm_up(poll.as_std()));
        {
            let mut entries = w.lock();
            let e = entries.get_mut("q").unwrap();
            e.scraped = Some(Instant::now().checked_sub(warm_up(poll.as_std())).unwrap());
        }
        assert!(w.due("q", poll, Timestamp::from_millis(cell + 5_200)));
        w.push("q", round(cell + 5_200, &[("a", &t(9))]));
        assert_eq!(w.warm_up_in("q", poll), None, "a rate now: no more warm-up");
        // Then once per interval counted from the epoch: not again in this one, however late in it
        // (a reconcile early on its slot), and at the start of the next.
        assert!(!w.due("q", poll, Timestamp::from_millis(cell + 14_999)));
        assert!(w.due("q", poll, Timestamp::from_millis(cell + 15_000)));
        w.push("q", round(cell + 15_000, &[("a", &t(20))]));
        assert!(!w.due("q", poll, Timestamp::from_millis(cell + 15_400)));
        // A pod never read before (a rollout): its second scrape is a warm-up again.
        w.push("q", round(cell + 30_000, &[("b", &t(1))]));
        assert!(w.warm_up_in("q", poll).is_some());
        // No pod answered: nothing to warm up.
        let empty = Windows::new();
        empty.push("e", round(cell, &[]));
        assert_eq!(empty.warm_up_in("e", poll), None);
    }

    #[test]
    fn the_window_is_shown_to_the_second() {
        // Scrapes 10 s apart, each a little late or early: the same window every time.
        for jitter in [0u64, 37, 480] {
            let mut w = Window::default();
            for (i, n) in [0u64, 10, 20].into_iter().enumerate() {
                let at = 1_000_000 + i as u64 * 10_000 + if i == 2 { jitter } else { 0 };
                w.push(round(at, &[("a", &text(&[(0.1, n), (0.5, n)], n, 0.0, 0))]));
            }
            assert_eq!(
                w.stats().unwrap().window,
                Duration::from_secs(20),
                "{jitter}"
            );
        }
    }

    #[test]
    fn the_window_widens_until_it_holds_enough_messages() {
        let t = |n| text(&[(0.1, n), (0.5, n)], n, 0.0, 0);
        let mut w = Window::default();
        // 10 messages per scrape, 12 scrapes: 5 scrapes hold 40, so the window widens to 6.
        for i in 0..12u64 {
            w.push(round(i * 1000, &[("a", &t(i * 10))]));
        }
        let s = w.stats().unwrap();
        assert_eq!(s.messages, MIN_MESSAGES);
        assert_eq!(s.window, Duration::from_secs(5));
        // Busy: the last five scrapes are enough.
        let mut w = Window::default();
        for i in 0..12u64 {
            w.push(round(i * 1000, &[("a", &t(i * 100))]));
        }
        assert_eq!(w.stats().unwrap().window, Duration::from_secs(4));
    }
}
