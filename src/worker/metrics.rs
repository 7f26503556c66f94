//! The worker's counters and its readiness state, rendered for `/metrics`, `/healthz` and `/readyz`.
//! Plain atomics: recording a message costs a few relaxed adds, never a lock.

use std::sync::Mutex;

use crate::telemetry::{Counter, Exposition, Gauge, Histogram, LATENCY_BUCKETS, Probes};

/// The SQS actions the worker uses; metrics are labelled with these names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    ReceiveMessage,
    DeleteMessageBatch,
    ChangeMessageVisibility,
    ChangeMessageVisibilityBatch,
    GetQueueAttributes,
}

impl Action {
    pub const ALL: [Action; 5] = [
        Action::ReceiveMessage,
        Action::DeleteMessageBatch,
        Action::ChangeMessageVisibility,
        Action::ChangeMessageVisibilityBatch,
        Action::GetQueueAttributes,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Action::ReceiveMessage => "ReceiveMessage",
            Action::DeleteMessageBatch => "DeleteMessageBatch",
            Action::ChangeMessageVisibility => "ChangeMessageVisibility",
            Action::ChangeMessageVisibilityBatch => "ChangeMessageVisibilityBatch",
            Action::GetQueueAttributes => "GetQueueAttributes",
        }
    }

    /// The action of an SDK operation name; None for operations the worker does not call.
    pub fn from_operation(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == name)
    }

    pub fn index(&self) -> usize {
        *self as usize
    }
}

/// One bucket per possible answer size of a ReceiveMessage call (MaxNumberOfMessages is at most 10).
pub const RECEIVE_SIZE_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
/// Bounds of `qc_worker_batch_items` (batch mode allows up to `MAX_BATCH_ITEMS` items a call).
pub const BATCH_ITEMS_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0];

/// Seconds from SQS's SentTimestamp (`sent_ms`, milliseconds since the epoch) to `now_ms`: None without a
/// timestamp, 0 when the clocks disagree the other way (SQS's clock ahead of this host's).
pub fn age_seconds(sent_ms: Option<u64>, now_ms: u64) -> Option<f64> {
    let sent = sent_ms?;
    Some(now_ms.saturating_sub(sent) as f64 / 1000.0)
}

/// Milliseconds since the epoch on this host's clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How a message ended; the `outcome` label of `qc_worker_messages_processed_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutcomeLabel {
    Success,
    Poison,
    Transient,
    Timeout,
    /// Idempotency store: the key was already done, deleted without calling the handler.
    Duplicate,
    /// Idempotency store: the key is being processed elsewhere; hidden until that claim ends.
    InProgressElsewhere,
}

impl OutcomeLabel {
    pub const ALL: [OutcomeLabel; 6] = [
        OutcomeLabel::Success,
        OutcomeLabel::Poison,
        OutcomeLabel::Transient,
        OutcomeLabel::Timeout,
        OutcomeLabel::Duplicate,
        OutcomeLabel::InProgressElsewhere,
    ];
    pub fn as_str(&self) -> &'static str {
        match self {
            OutcomeLabel::Success => "success",
            OutcomeLabel::Poison => "poison",
            OutcomeLabel::Transient => "transient",
            OutcomeLabel::Timeout => "timeout",
            OutcomeLabel::Duplicate => "duplicate",
            OutcomeLabel::InProgressElsewhere => "in_progress_elsewhere",
        }
    }
}

/// Readiness: why the worker is not (yet) consuming, if it is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    Starting(String),
    Ready,
    Failing(String),
    Draining,
}

pub struct Metrics {
    pub received: Counter,
    pub deleted: Counter,
    pub delete_failures: Counter,
    pub released: Counter,
    pub outcomes: [Counter; 6],
    pub handler_seconds: Histogram,
    /// From SQS's SentTimestamp to the handler call's start: queue wait, retries' delays and the
    /// worker's own wait for a slot.
    pub wait_seconds: Histogram,
    /// From SQS's SentTimestamp to leaving the queue (deleted, or moved to the DLQ).
    pub dwell_seconds: Histogram,
    pub heartbeats: Counter,
    pub heartbeat_failures: Counter,
    pub heartbeat_leases_lost: Counter,
    /// ChangeMessageVisibilityBatch calls made for heartbeats (each carries up to 10 extensions).
    pub heartbeat_calls: Counter,
    pub in_flight: Gauge,
    pub empty_receives: Counter,
    /// Received copies of a message this worker already held, or had just deleted after a success
    /// (`worker::held`): no second handler call was made for them.
    pub duplicate_receives: Counter,
    /// Messages each answered ReceiveMessage returned (0 to 10).
    pub receive_sizes: Histogram,
    /// Messages per batch handler call (batch mode only; its count is the number of calls).
    pub batch_items: Histogram,
    pub sqs_requests: [Counter; 5],
    pub sqs_errors: [Counter; 5],
    pub idempotency_errors: Counter,
    pub idempotency_key_missing: Counter,
    /// Messages no `--filter` pattern matched: deleted without a handler call.
    pub filtered: Counter,
    pub idempotency_claims_lost: Counter,
    pub dead_lettered: Counter,
    pub dead_letter_failures: Counter,
    /// Poison copies sent to the DLQ without the reason attribute (no room beside ten attributes).
    pub dead_letter_reasons_unattached: Counter,
    /// `qc_worker_breaker_state`: 0 closed, 1 open, 2 recovering (`breaker::State::gauge`).
    pub breaker_state: Gauge,
    /// Transitions by the state entered (`breaker::State` order: closed, open, recovering, spent).
    pub breaker_transitions: [Counter; 4],
    /// Probes by result: success, failure.
    pub breaker_probes: [Counter; 2],
    /// Messages waiting at the breaker's gate.
    pub breaker_held: Gauge,
    /// Transient failures held for the breaker's probe instead of handed back to the queue.
    pub breaker_holds: Counter,
    /// Milliseconds of open episodes that have ended; the current one is added when rendered.
    pub breaker_open_millis: Counter,
    breaker_open_since: Mutex<Option<std::time::Instant>>,
    /// This pod's share of `processing.maxRate` in thousandths of a message per second (0: unlimited).
    pub rate_share_millis: Gauge,
    /// Time receives waited for the rate's tokens, in microseconds.
    pub rate_throttled_micros: Counter,
    readiness: Mutex<Readiness>,
    /// The FIFO groups this worker holds, with their heads.
    pub fifo_heads: FifoHeads,
}

/// Most groups a worker keeps track of (the rest are not reported).
const MAX_FIFO_GROUPS: usize = 1000;
/// Groups reported in /metrics by name, the worst heads first.
pub const FIFO_GROUPS_REPORTED: usize = 20;
/// A group not seen for this long is forgotten (its head was handled elsewhere, or the queue moved on).
const FIFO_GROUP_FORGET: std::time::Duration = std::time::Duration::from_hours(1);

/// The FIFO groups whose head this worker handled last and has not yet seen deleted: per group, the
/// head's receive count (each earlier receive of a FIFO head failed: SQS redelivers a group's head
/// only when it was not deleted), its SentTimestamp (ms) and when it was last received here.
/// Per group: the head's receive count, SentTimestamp (ms) and when it was last received here.
type Heads = std::collections::HashMap<String, (u32, Option<u64>, std::time::Instant)>;

#[derive(Debug, Default)]
pub struct FifoHeads(Mutex<Heads>);

impl FifoHeads {
    /// A message of `group` starts: it is the group's head.
    pub fn started(&self, group: &str, receive_count: u32, sent_ms: Option<u64>) {
        if let Ok(mut m) = self.0.lock() {
            m.retain(|_, v| v.2.elapsed() < FIFO_GROUP_FORGET);
            if m.len() < MAX_FIFO_GROUPS || m.contains_key(group) {
                m.insert(
                    group.to_string(),
                    (receive_count, sent_ms, std::time::Instant::now()),
                );
            }
        }
    }

    /// The group's last held message was deleted: it holds nothing here any more.
    pub fn done(&self, group: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(group);
        }
    }

    /// (groups held, the worst `top` heads as (group, receive count, age in seconds)).
    pub fn snapshot(&self, now_ms: u64, top: usize) -> (usize, Vec<(String, u32, f64)>) {
        let Ok(mut m) = self.0.lock() else {
            return (0, Vec::new());
        };
        m.retain(|_, v| v.2.elapsed() < FIFO_GROUP_FORGET);
        let mut heads: Vec<(String, u32, f64)> = m
            .iter()
            .map(|(g, (rc, sent, _))| {
                let age = sent.map_or(0.0, |s| now_ms.saturating_sub(s) as f64 / 1000.0);
                (g.clone(), *rc, age)
            })
            .collect();
        heads.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| b.2.total_cmp(&a.2))
                .then_with(|| a.0.cmp(&b.0))
        });
        heads.truncate(top);
        (m.len(), heads)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            received: Counter::default(),
            deleted: Counter::default(),
            delete_failures: Counter::default(),
            released: Counter::default(),
            outcomes: Default::default(),
            handler_seconds: Histogram::new(LATENCY_BUCKETS),
            wait_seconds: Histogram::new(LATENCY_BUCKETS),
            dwell_seconds: Histogram::new(LATENCY_BUCKETS),
            heartbeats: Counter::default(),
            heartbeat_failures: Counter::default(),
            heartbeat_leases_lost: Counter::default(),
            heartbeat_calls: Counter::default(),
            in_flight: Gauge::default(),
            empty_receives: Counter::default(),
            duplicate_receives: Counter::default(),
            receive_sizes: Histogram::new(RECEIVE_SIZE_BUCKETS),
            batch_items: Histogram::new(BATCH_ITEMS_BUCKETS),
            sqs_requests: Default::default(),
            sqs_errors: Default::default(),
            idempotency_errors: Counter::default(),
            idempotency_key_missing: Counter::default(),
            filtered: Counter::default(),
            idempotency_claims_lost: Counter::default(),
            dead_lettered: Counter::default(),
            dead_letter_failures: Counter::default(),
            dead_letter_reasons_unattached: Counter::default(),
            breaker_state: Gauge::default(),
            breaker_transitions: Default::default(),
            breaker_probes: Default::default(),
            breaker_held: Gauge::default(),
            breaker_holds: Counter::default(),
            fifo_heads: FifoHeads::default(),
            breaker_open_millis: Counter::default(),
            breaker_open_since: Mutex::new(None),
            rate_share_millis: Gauge::default(),
            rate_throttled_micros: Counter::default(),
            readiness: Mutex::new(Readiness::Starting("reading queue attributes".into())),
        }
    }
}

impl Metrics {
    pub fn outcome(&self, o: OutcomeLabel) {
        self.outcomes[o as usize].inc();
    }

    pub fn set_readiness(&self, r: Readiness) {
        if let Ok(mut g) = self.readiness.lock() {
            *g = r;
        }
    }

    pub fn readiness(&self) -> Readiness {
        self.readiness
            .lock()
            .map_or(Readiness::Failing("readiness lock poisoned".into()), |g| {
                g.clone()
            })
    }

    /// An open episode of the breaker begins (`open`) or ends.
    pub fn breaker_episode(&self, open: bool) {
        if let Ok(mut since) = self.breaker_open_since.lock() {
            if open {
                since.get_or_insert_with(std::time::Instant::now);
            } else if let Some(s) = since.take() {
                self.breaker_open_millis.add(s.elapsed().as_millis() as u64);
            }
        }
    }

    /// Seconds the breaker has not been closed, the current episode included.
    pub fn breaker_open_seconds(&self) -> f64 {
        let current = self
            .breaker_open_since
            .lock()
            .ok()
            .and_then(|s| s.map(|s| s.elapsed().as_secs_f64()))
            .unwrap_or(0.0);
        self.breaker_open_millis.get() as f64 / 1000.0 + current
    }

    /// The share of `processing.maxRate` this pod now paces itself to, messages per second.
    pub fn set_rate_share(&self, rate: f64) {
        self.rate_share_millis.set((rate * 1000.0).round() as i64);
    }

    /// Total SQS requests of every action.
    pub fn sqs_requests_total(&self) -> u64 {
        self.sqs_requests.iter().map(Counter::get).sum()
    }

    pub fn render(&self) -> String {
        let mut e = Exposition::new();
        e.counter(
            "qc_worker_messages_received_total",
            "Messages received from SQS.",
            &[(&[], self.received.get())],
        );
        e.counter(
            "qc_worker_messages_deleted_total",
            "Messages deleted from SQS (acknowledged).",
            &[(&[], self.deleted.get())],
        );
        e.counter(
            "qc_worker_delete_failures_total",
            "Deletes that failed for good; those messages will be delivered again.",
            &[(&[], self.delete_failures.get())],
        );
        e.counter(
            "qc_worker_messages_released_total",
            "Messages made visible again unhandled (shutdown, FIFO group stopped by a failure).",
            &[(&[], self.released.get())],
        );
        let outcomes: Vec<([(&str, &str); 1], u64)> = OutcomeLabel::ALL
            .iter()
            .map(|o| ([("outcome", o.as_str())], self.outcomes[*o as usize].get()))
            .collect();
        let samples: Vec<(&[(&str, &str)], u64)> =
            outcomes.iter().map(|(l, v)| (&l[..], *v)).collect();
        e.counter(
            "qc_worker_messages_processed_total",
            "Messages finished, by outcome.",
            &samples,
        );
        e.histogram(
            "qc_worker_handler_duration_seconds",
            "Time the handler took per message.",
            &self.handler_seconds,
        );
        e.histogram(
            "qc_worker_message_wait_seconds",
            "From the message's SentTimestamp to its handler call's start (each call of a retried message).",
            &self.wait_seconds,
        );
        e.histogram(
            "qc_worker_message_dwell_seconds",
            "From the message's SentTimestamp to its leaving the queue (deleted, or moved to the DLQ).",
            &self.dwell_seconds,
        );
        e.counter(
            "qc_worker_heartbeats_total",
            "Visibility extensions of in-flight messages, one per message extended.",
            &[(&[], self.heartbeats.get())],
        );
        e.counter(
            "qc_worker_heartbeat_calls_total",
            "ChangeMessageVisibilityBatch calls made for heartbeats (up to 10 messages each).",
            &[(&[], self.heartbeat_calls.get())],
        );
        e.counter(
            "qc_worker_heartbeat_failures_total",
            "Visibility extension calls that failed, including those retried in time (see qc_worker_heartbeat_leases_lost_total).",
            &[(&[], self.heartbeat_failures.get())],
        );
        e.counter(
            "qc_worker_heartbeat_leases_lost_total",
            "In-flight messages whose lease the heartbeat could not keep (receipt handle refused, or the lease ended before an extension): each may be delivered again.",
            &[(&[], self.heartbeat_leases_lost.get())],
        );
        e.gauge(
            "qc_worker_in_flight",
            "Messages received and not yet finished.",
            &[(&[], self.in_flight.get())],
        );
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let (held, heads) = self.fifo_heads.snapshot(now_ms, FIFO_GROUPS_REPORTED);
        e.gauge(
            "qc_worker_fifo_groups",
            "FIFO message groups whose head this worker handled and has not seen deleted.",
            &[(&[], i64::try_from(held).unwrap_or(i64::MAX))],
        );
        let labels: Vec<[(&str, &str); 1]> =
            heads.iter().map(|h| [("group", h.0.as_str())]).collect();
        let receives: Vec<(&[(&str, &str)], i64)> = labels
            .iter()
            .zip(&heads)
            .map(|(l, h)| (&l[..], i64::from(h.1)))
            .collect();
        e.gauge(
            "qc_worker_fifo_group_head_receives",
            "Receive count of each FIFO group's head (the worst 20 groups): every earlier receive of a head failed.",
            &receives,
        );
        let ages: Vec<(&[(&str, &str)], f64)> = labels
            .iter()
            .zip(&heads)
            .map(|(l, h)| (&l[..], h.2))
            .collect();
        e.gauge_f64(
            "qc_worker_fifo_group_head_age_seconds",
            "Age (since SentTimestamp) of each FIFO group's head (the worst 20 groups).",
            &ages,
        );
        e.counter(
            "qc_worker_empty_receives_total",
            "ReceiveMessage calls that returned no message.",
            &[(&[], self.empty_receives.get())],
        );
        e.histogram(
            "qc_worker_receive_messages",
            "Messages per answered ReceiveMessage call (a busy queue should fill batchSize).",
            &self.receive_sizes,
        );
        e.histogram(
            "qc_worker_batch_items",
            "Messages per batch handler call (batch mode; qc_worker_handler_duration_seconds then times whole calls).",
            &self.batch_items,
        );
        let labels: Vec<[(&str, &str); 1]> = Action::ALL
            .iter()
            .map(|a| [("action", a.as_str())])
            .collect();
        let requests: Vec<(&[(&str, &str)], u64)> = Action::ALL
            .iter()
            .zip(&labels)
            .map(|(a, l)| (&l[..], self.sqs_requests[a.index()].get()))
            .collect();
        e.counter(
            "qc_worker_sqs_requests_total",
            "SQS API requests, by action.",
            &requests,
        );
        let errors: Vec<(&[(&str, &str)], u64)> = Action::ALL
            .iter()
            .zip(&labels)
            .map(|(a, l)| (&l[..], self.sqs_errors[a.index()].get()))
            .collect();
        e.counter(
            "qc_worker_sqs_errors_total",
            "SQS API requests that failed, by action.",
            &errors,
        );
        e.counter(
            "qc_worker_idempotency_errors_total",
            "Idempotency store calls that failed.",
            &[(&[], self.idempotency_errors.get())],
        );
        e.counter(
            "qc_worker_idempotency_key_missing_total",
            "Messages handled without de-duplication: their idempotency key was missing, empty or unreadable.",
            &[(&[], self.idempotency_key_missing.get())],
        );
        e.counter(
            "qc_worker_messages_filtered_total",
            "Messages no filter pattern matched: deleted without a handler call, as Lambda's event filtering does.",
            &[(&[], self.filtered.get())],
        );
        e.counter(
            "qc_worker_idempotency_claims_lost_total",
            "Idempotency claims found expired (not ours any more) while their handler still ran: another worker may handle the key too.",
            &[(&[], self.idempotency_claims_lost.get())],
        );
        e.counter(
            "qc_worker_duplicate_receives_total",
            "Received copies of a message this worker already held (a parallel receive got it too) or had just deleted after a success: no second handler call was made for them.",
            &[(&[], self.duplicate_receives.get())],
        );
        e.counter(
            "qc_worker_dead_lettered_total",
            "Poison messages sent to the dead-letter queue (--on-poison dead-letter).",
            &[(&[], self.dead_lettered.get())],
        );
        e.counter(
            "qc_worker_dead_letter_failures_total",
            "Poison messages that could not be sent to the dead-letter queue and were left on the source.",
            &[(&[], self.dead_letter_failures.get())],
        );
        e.counter(
            "qc_worker_dead_letter_reasons_unattached_total",
            "Poison messages sent to the dead-letter queue without the qc-poison-reason attribute (they already carried ten attributes); the reason is in the worker's log line under the copy's message id.",
            &[(&[], self.dead_letter_reasons_unattached.get())],
        );
        e.gauge(
            "qc_worker_breaker_state",
            "Outage breaker: 0 closed, 1 open (the handler's dependency is failing: receiving paused, held messages retried in-process by probes), 2 recovering (slow start after a successful probe).",
            &[(&[], self.breaker_state.get())],
        );
        let to = ["closed", "open", "recovering", "spent"];
        let transitions: Vec<([(&str, &str); 1], u64)> = to
            .iter()
            .zip(&self.breaker_transitions)
            .map(|(s, c)| ([("to", *s)], c.get()))
            .collect();
        let samples: Vec<(&[(&str, &str)], u64)> =
            transitions.iter().map(|(l, v)| (&l[..], *v)).collect();
        e.counter(
            "qc_worker_breaker_transitions_total",
            "Outage breaker transitions, by the state entered (spent: open longer than the outage tolerance, nothing held).",
            &samples,
        );
        e.counter_f64(
            "qc_worker_breaker_open_seconds_total",
            "Seconds the outage breaker has not been closed (open, recovering or spent).",
            &[(&[], self.breaker_open_seconds())],
        );
        e.gauge(
            "qc_worker_breaker_held_messages",
            "Messages held at the outage breaker's gate, under their heartbeats, waiting for a probe or a slot.",
            &[(&[], self.breaker_held.get())],
        );
        e.counter(
            "qc_worker_breaker_holds_total",
            "Transient failures kept in hand for the outage breaker's probe instead of handed back to the queue (each saves a receive toward maxReceiveCount).",
            &[(&[], self.breaker_holds.get())],
        );
        e.counter(
            "qc_worker_breaker_probes_total",
            "Handler calls made as the outage breaker's probe, by result.",
            &[
                (&[("result", "success")], self.breaker_probes[0].get()),
                (&[("result", "failure")], self.breaker_probes[1].get()),
            ],
        );
        let share = self.rate_share_millis.get();
        if share > 0 {
            e.gauge_f64(
                "qc_worker_rate_share",
                "This pod's share of processing.maxRate (maxRate / replicas, from the controller), messages per second started at most.",
                &[(&[], share as f64 / 1000.0)],
            );
            e.counter_f64(
                "qc_worker_rate_throttled_seconds_total",
                "Seconds the worker held a receive back for its rate share (messages were wanted but the share was spent).",
                &[(&[], self.rate_throttled_micros.get() as f64 / 1e6)],
            );
        }
        let ready = i64::from(self.readiness() == Readiness::Ready);
        e.gauge(
            "qc_worker_ready",
            "1 when the worker is consuming.",
            &[(&[], ready)],
        );
        crate::process_metrics::render_into(&mut e);
        e.finish()
    }
}

impl Probes for Metrics {
    fn metrics(&self) -> crate::telemetry::MetricsBody {
        self.render().into()
    }
    fn live(&self) -> Result<(), String> {
        Ok(())
    }
    fn ready(&self) -> Result<(), String> {
        match self.readiness() {
            Readiness::Ready => Ok(()),
            Readiness::Starting(why) => Err(format!("starting: {why}")),
            Readiness::Failing(why) => Err(format!("not ready: {why}")),
            Readiness::Draining => Err("shutting down".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_age_is_counted_from_its_sent_timestamp_never_below_zero() {
        assert_eq!(age_seconds(Some(1_000), 3_500), Some(2.5));
        assert_eq!(
            age_seconds(Some(5_000), 3_500),
            Some(0.0),
            "SQS's clock ahead"
        );
        assert_eq!(age_seconds(None, 3_500), None);
    }
}
