//! The scaler's memory in the controller: one sample [`History`] per QueueConsumer (keyed by uid), fed
//! at most one sample per `pollInterval` from the shared queue facts, dropped when the QueueConsumer goes.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Pod;

use super::workers::Deleted;
use crate::api::{Duration, QueueConsumerSpec};
use crate::aws::QueueFacts;
use crate::scaling::{self, History, STALE_AFTER_POLLS, Sample, ScalingError, Timestamp};

/// The deletes between two samples at `from` and `to`, from the workers' counters between their two
/// latest scrapes: scrapes and samples both come once per `poll` but not at the same instant, so the
/// scrapes' rate is taken over the samples' span. None (the policy then estimates completions from the
/// in-flight count) when the scrapes could not count every delete, are older than a poll before `to`,
/// or span more than three times the samples' span or poll (missed scrapes: a rate that old is no
/// reading of now).
pub fn deleted_between_samples(
    deleted: Option<Deleted>,
    from: Timestamp,
    to: Timestamp,
    poll: Duration,
) -> Option<u64> {
    let d = deleted?;
    let poll_ms = u64::try_from(poll.as_std().as_millis()).unwrap_or(u64::MAX);
    let span_ms = u64::try_from(d.span.as_std().as_millis()).unwrap_or(u64::MAX);
    let dt_ms = to.as_millis().checked_sub(from.as_millis())?;
    if span_ms == 0 || span_ms > poll_ms.max(dt_ms).saturating_mul(3) {
        return None;
    }
    if to.as_millis().abs_diff(d.at.as_millis()) > poll_ms {
        return None;
    }
    let scaled = u128::from(d.count) * u128::from(dt_ms) + u128::from(span_ms / 2);
    u64::try_from(scaled / u128::from(span_ms)).ok()
}

/// What [`Histories::record`] did with the facts it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// A new sample went into the history.
    Pushed,
    /// No sample for longer than the retention plus the staleness bound (an outage, or counts SQS kept
    /// leaving out): the history starts again from this sample, so a scale-down waits for a full
    /// window of fresh readings instead of acting on the few taken since.
    Restarted,
    /// The latest sample is younger than `pollInterval` (a watch event, or facts another
    /// QueueConsumer of the same queue read): nothing new to learn.
    NotDue,
}

struct Tracked {
    history: History,
    /// The last reconcile that recorded or decided: idle entries are swept.
    touched: Timestamp,
    /// How long the entry may sit untouched: its retention plus the staleness bound.
    idle_limit: Duration,
    /// The pods' measured start-up (`scaleDownStabilization: auto`), kept across history restarts, and
    /// when it was last measured.
    startup: Option<Duration>,
    startup_measured: Option<Timestamp>,
}

/// How often the pods' start-up is measured again once known, and while none is known yet.
pub const STARTUP_REFRESH: Duration = Duration::from_secs(300);
pub const STARTUP_RETRY: Duration = Duration::from_secs(60);

/// Histories of every QueueConsumer this controller reconciles. Critical sections are short and never
/// await, so concurrent reconciles of different QueueConsumers only contend for microseconds.
#[derive(Default)]
pub struct Histories {
    entries: Mutex<HashMap<String, Tracked>>,
}

fn idle_limit(spec: &QueueConsumerSpec, startup: Option<Duration>) -> Duration {
    scaling::retention_for(&spec.scaling, startup).saturating_add(
        spec.scaling
            .poll_interval
            .max(Duration::from_secs(1))
            .saturating_mul(STALE_AFTER_POLLS),
    )
}

impl Histories {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Tracked>> {
        crate::sync::lock(&self.entries)
    }

    /// Take the queue's counts, read at `at`, as a sample when one is due for this QueueConsumer's
    /// `pollInterval`. A count SQS left out is an error and pushes nothing (the policy then holds).
    pub fn record(
        &self,
        key: &str,
        spec: &QueueConsumerSpec,
        facts: &QueueFacts,
        at: Timestamp,
        now: Timestamp,
    ) -> Result<Recorded, ScalingError> {
        self.record_with_age(key, spec, facts, None, |_| None, at, now)
    }

    /// [`Self::record`], with the oldest visible message's age (CloudWatch
    /// ApproximateAgeOfOldestMessage, when read; a negative reading counts as unknown) and the deletes
    /// the workers' counters showed since the previous sample's time, asked of `deleted` with that time
    /// ([`deleted_between_samples`]).
    #[allow(clippy::too_many_arguments)]
    pub fn record_with_age(
        &self,
        key: &str,
        spec: &QueueConsumerSpec,
        facts: &QueueFacts,
        oldest_age_seconds: Option<i64>,
        deleted: impl FnOnce(Timestamp) -> Option<Deleted>,
        at: Timestamp,
        now: Timestamp,
    ) -> Result<Recorded, ScalingError> {
        let mut sample = Sample::from_facts(facts, at)?;
        sample.oldest_age = oldest_age_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs);
        let mut entries = self.lock();
        sweep(&mut entries, now);
        let tracked = entry(&mut entries, key, spec, now);
        let startup = tracked.startup;
        let retention = scaling::retention_for(&spec.scaling, startup);
        tracked.touched = now;
        tracked.idle_limit = idle_limit(spec, startup);
        // A spec change (window, poll interval) takes effect on the next push.
        tracked.history.set_retention(retention);
        let outcome = match tracked.history.latest() {
            Some(latest) if latest.at.saturating_add(tracked.idle_limit) < at => {
                tracked.history = History::for_spec(&spec.scaling, startup);
                Recorded::Restarted
            }
            _ if !tracked.history.is_due(at, spec.scaling.poll_interval) => {
                return Ok(Recorded::NotDue);
            }
            _ => Recorded::Pushed,
        };
        if let Some(previous) = tracked.history.latest() {
            sample.deleted = deleted_between_samples(
                deleted(previous.at),
                previous.at,
                at,
                spec.scaling.poll_interval,
            );
        }
        tracked.history.push(sample)?;
        Ok(outcome)
    }

    /// Run `f` on the QueueConsumer's history (an empty one when it has none yet: the policy then
    /// answers MetricsUnavailable and holds).
    pub fn with_history<R>(&self, key: &str, now: Timestamp, f: impl FnOnce(&History) -> R) -> R {
        let mut entries = self.lock();
        match entries.get_mut(key) {
            Some(t) => {
                t.touched = now;
                f(&t.history)
            }
            None => f(&History::new(Duration::ZERO)),
        }
    }

    /// Whether the pods' start-up should be measured (again) at `now`: never measured, or measured longer
    /// than [`STARTUP_REFRESH`] ago ([`STARTUP_RETRY`] while no pod had become Ready).
    pub fn startup_due(&self, key: &str, now: Timestamp) -> bool {
        let entries = self.lock();
        let Some(t) = entries.get(key) else {
            return true;
        };
        let every = if t.startup.is_some() {
            STARTUP_REFRESH
        } else {
            STARTUP_RETRY
        };
        t.startup_measured
            .is_none_or(|at| at.saturating_add(every) <= now)
    }

    /// Record a measurement of the pods' start-up made at `now` (`None`: no pod to measure; an earlier
    /// measurement stays). `scaleDownStabilization: auto` holds for it from the next decision.
    pub fn set_startup(
        &self,
        key: &str,
        spec: &QueueConsumerSpec,
        startup: Option<Duration>,
        now: Timestamp,
    ) {
        let mut entries = self.lock();
        let tracked = entry(&mut entries, key, spec, now);
        tracked.startup_measured = Some(now);
        if startup.is_some() {
            tracked.startup = startup;
            tracked.history.set_startup(startup);
            tracked.idle_limit = idle_limit(spec, startup);
        }
    }

    /// The start-up `auto` holds for now (None: not measured, 30s).
    pub fn startup(&self, key: &str) -> Option<Duration> {
        self.lock().get(key).and_then(|t| t.startup)
    }

    /// Drop a QueueConsumer's history (it is being deleted).
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    pub fn contains(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    /// How many QueueConsumers have a history.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// When a pod was created and when it last became Ready (its Ready condition, status True), for
/// [`scaling::measured_startup`]; None for a pod that is not Ready.
pub fn pod_startup(pod: &Pod) -> Option<(Timestamp, Timestamp)> {
    let created = pod.metadata.creation_timestamp.as_ref()?;
    let ready = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()?;
    Some((Timestamp::from_k8s(created), Timestamp::from_k8s(ready)))
}

fn entry<'a>(
    entries: &'a mut HashMap<String, Tracked>,
    key: &str,
    spec: &QueueConsumerSpec,
    now: Timestamp,
) -> &'a mut Tracked {
    entries.entry(key.to_string()).or_insert_with(|| Tracked {
        history: History::for_spec(&spec.scaling, None),
        touched: now,
        idle_limit: idle_limit(spec, None),
        startup: None,
        startup_measured: None,
    })
}

/// Drop entries nobody reconciled for longer than their idle limit: a QueueConsumer deleted without a
/// finalizer is never reconciled again, and its history would otherwise stay forever. An entry swept
/// while its QueueConsumer still exists (a long error backoff) only restarts its history, which
/// [`Histories::record`] would have done anyway.
fn sweep(entries: &mut HashMap<String, Tracked>, now: Timestamp) {
    entries.retain(|_, t| t.touched.saturating_add(t.idle_limit) >= now);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(poll: &str, window: &str) -> QueueConsumerSpec {
        serde_json::from_value(json!({
            "queue": {"url": "https://sqs.us-east-1.amazonaws.com/1/q"},
            "processing": {"p99": "2s"}, "handler": {"http": {}},
            "template": {"spec": {"containers": [{"name": "app", "image": "x"}]}},
            "scaling": {"pollInterval": poll, "scaleDownStabilization": window}
        }))
        .unwrap()
    }

    fn facts(visible: i64) -> QueueFacts {
        let attrs: std::collections::HashMap<String, String> = [
            ("VisibilityTimeout", "60".to_string()),
            ("MessageRetentionPeriod", "345600".to_string()),
            ("ApproximateNumberOfMessages", visible.to_string()),
            ("ApproximateNumberOfMessagesNotVisible", "0".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        QueueFacts::from_attributes("https://sqs.us-east-1.amazonaws.com/1/q", &attrs).unwrap()
    }

    fn s(secs: u64) -> Timestamp {
        Timestamp::from_secs(secs)
    }

    #[test]
    fn the_oldest_message_age_goes_with_the_sample() {
        let h = Histories::new();
        let sp = spec("15s", "auto");
        let age =
            |h: &Histories, t| h.with_history("k", s(t), |x| x.latest().and_then(|l| l.oldest_age));
        h.record_with_age("k", &sp, &facts(5), Some(40), |_| None, s(0), s(0))
            .unwrap();
        assert_eq!(age(&h, 0), Some(Duration::from_secs(40)));
        // a negative reading is no reading; none read is none
        h.record_with_age("k", &sp, &facts(5), Some(-1), |_| None, s(15), s(15))
            .unwrap();
        assert_eq!(age(&h, 15), None);
        h.record("k", &sp, &facts(5), s(30), s(30)).unwrap();
        assert_eq!(age(&h, 30), None);
    }

    #[test]
    fn the_scrapes_deletes_are_taken_over_the_samples_span() {
        let d = |count, span_s, at_s| {
            Some(Deleted {
                count,
                span: Duration::from_secs(span_s),
                at: s(at_s),
            })
        };
        let poll = Duration::from_secs(15);
        // scrapes 15 s apart, samples 15 s apart: the count as it is
        assert_eq!(
            deleted_between_samples(d(30, 15, 100), s(85), s(100), poll),
            Some(30)
        );
        // samples 10 s apart over scrapes 20 s apart: the rate over the samples' span
        assert_eq!(
            deleted_between_samples(d(30, 20, 101), s(90), s(100), poll),
            Some(15)
        );
        // no count, scrapes more than a poll away from the sample, or spanning over three polls: none
        assert_eq!(deleted_between_samples(None, s(85), s(100), poll), None);
        assert_eq!(
            deleted_between_samples(d(30, 15, 80), s(85), s(100), poll),
            None
        );
        assert_eq!(
            deleted_between_samples(d(30, 46, 100), s(85), s(100), poll),
            None
        );
        assert_eq!(
            deleted_between_samples(d(30, 0, 100), s(85), s(100), poll),
            None
        );

        // the first sample has no previous one to count from; the next one carries the deletes
        let h = Histories::new();
        let sp = spec("15s", "auto");
        let latest =
            |h: &Histories, t| h.with_history("k", s(t), |x| x.latest().and_then(|l| l.deleted));
        h.record_with_age("k", &sp, &facts(5), None, |_| d(7, 15, 0), s(0), s(0))
            .unwrap();
        assert_eq!(latest(&h, 0), None);
        h.record_with_age("k", &sp, &facts(5), None, |_| d(12, 15, 15), s(15), s(15))
            .unwrap();
        assert_eq!(latest(&h, 15), Some(12));
    }

    #[test]
    fn one_sample_per_poll_interval() {
        let h = Histories::new();
        let sp = spec("10s", "1m");
        let rec = |at, now| h.record("k", &sp, &facts(5), s(at), s(now)).unwrap();
        assert_eq!(rec(100, 100), Recorded::Pushed);
        // The same cached read again, and a read 4s later (another QueueConsumer's poll): not due.
        assert_eq!(rec(100, 101), Recorded::NotDue);
        assert_eq!(rec(104, 104), Recorded::NotDue);
        assert_eq!(rec(110, 110), Recorded::Pushed);
        assert_eq!(h.with_history("k", s(110), crate::scaling::History::len), 2);
    }

    #[test]
    fn a_gap_longer_than_the_retention_restarts_the_history() {
        let h = Histories::new();
        let sp = spec("1s", "10s");
        for t in 0..5 {
            h.record("k", &sp, &facts(1), s(t), s(t)).unwrap();
        }
        // A sample a poll late is no gap.
        assert_eq!(
            h.record("k", &sp, &facts(1), s(6), s(6)).unwrap(),
            Recorded::Pushed
        );
        // Retention 71s (window 10s + maxBacklogAge 60s + poll 1s) + 3 polls: the entry is touched
        // (decisions) but sampled 75s later starts afresh.
        h.with_history("k", s(12), |_| ());
        assert_eq!(
            h.record("k", &sp, &facts(1), s(81), s(81)).unwrap(),
            Recorded::Restarted
        );
        let (len, covers) = h.with_history("k", s(81), |hist| {
            (hist.len(), hist.covers(s(81), Duration::from_secs(1)))
        });
        assert_eq!((len, covers), (1, false));
        // Untouched past the idle limit (74s) the entry was swept: a fresh history all the same.
        assert_eq!(
            h.record("k", &sp, &facts(1), s(156), s(156)).unwrap(),
            Recorded::Pushed
        );
        assert_eq!(h.with_history("k", s(156), crate::scaling::History::len), 1);
    }

    #[test]
    fn a_missing_count_pushes_nothing() {
        let h = Histories::new();
        let mut f = facts(1);
        f.visible = None;
        let err = h
            .record("k", &spec("1s", "10s"), &f, s(1), s(1))
            .unwrap_err();
        assert!(
            err.to_string().contains("ApproximateNumberOfMessages"),
            "{err}"
        );
        assert!(h.with_history("k", s(1), crate::scaling::History::is_empty));
    }

    #[test]
    fn forgotten_and_idle_histories_go() {
        let h = Histories::new();
        let sp = spec("1s", "10s");
        h.record("gone", &sp, &facts(1), s(0), s(0)).unwrap();
        h.record("kept", &sp, &facts(1), s(0), s(0)).unwrap();
        h.forget("gone");
        assert!(!h.contains("gone") && h.contains("kept"));
        h.record("other", &sp, &facts(1), s(5), s(5)).unwrap();
        assert!(h.contains("kept"), "within retention + 3 polls (74s)");
        h.record("other", &sp, &facts(1), s(75), s(75)).unwrap();
        assert!(!h.contains("kept"), "idle past 74s: swept");
        assert_eq!(h.len(), 1);
    }
}
