//! One message from receipt to its end: heartbeat, idempotency claim, handler under a timeout, then
//! delete, back off or leave. A `Lease` guard makes sure a message never ends without being accounted for.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::api::{IdempotencyKey, OnPoison, UnwrapSns};

use super::batcher::Batcher;
use super::breaker::{Breaker, Denied, Kind, Outcome, Pass};
use super::core::backoff::visibility_secs;
use super::core::fate::{Facts, Fate, Happened, Policy, decide};
use super::core::filter::Screen;
use super::dead_letter::DeadLetter;
use super::handler::{Cause, Handler, Verdict};
use super::heartbeat::{Heartbeats, Plan, lease_lost};
use super::held::{Admission, Held, ReceiptHandle};
use super::idempotency::{Claim, IdempotencyError, Store, key_of, payload_hash};
use super::metrics::{Metrics, OutcomeLabel};
use super::spans::{MessageSpan, Spans};
use super::sqs::{Entry, Message, Sqs};

mod batch;

/// Sent to the dispatcher when a message frees its slot.
#[derive(Debug)]
pub struct Freed {
    pub latency: Option<Duration>,
    /// The handler could not be reached: pause receiving until it can.
    pub unreachable: bool,
    /// The idempotency store did not answer: pause receiving until it does.
    pub store_down: bool,
}

/// Everything a message needs, shared by all in-flight messages.
pub struct Processor {
    pub sqs: Sqs,
    pub metrics: Arc<Metrics>,
    pub handler: Handler,
    pub store: Option<Store>,
    pub key: IdempotencyKey,
    pub idempotency_ttl: Duration,
    pub visibility_timeout: Duration,
    /// None: heartbeats off.
    pub heartbeat: Option<Duration>,
    /// The coalescer that batches heartbeats falling due together (None: heartbeats off).
    pub heartbeats: Option<Heartbeats>,
    pub timeout: Duration,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub on_poison: OnPoison,
    /// `--unwrap-sns`: the handler gets an SNS notification's Message and attributes (`worker::sns`).
    pub unwrap_sns: UnwrapSns,
    /// The DLQ client of `--on-poison dead-letter`.
    pub dead_letter: Option<DeadLetter>,
    /// `--s3-payloads`: the S3 client that fetches Extended Client payloads.
    pub s3: Option<super::s3::S3Payloads>,
    /// `--schema-file`: the JSON Schema a body must match before a handler call.
    pub schema: Option<super::core::schema::Schema>,
    /// `--filter`: a message no pattern matches is deleted without a call.
    pub filter: Option<super::core::filter::Filter>,
    pub deleter: Batcher,
    pub releaser: Batcher,
    pub freed: mpsc::UnboundedSender<Freed>,
    /// FIFO: a delete counts only once SQS confirmed it, so the group's next message cannot start
    /// before (a delete given up leaves the message on the queue and stops the group).
    pub confirm_deletes: bool,
    /// The outage breaker: every handler call passes its gate.
    pub breaker: Arc<Breaker>,
    /// The messages held here by id, with their newest receipt handles (`worker::held`).
    pub held: Held,
    /// Tracing on: makes each message's spans (`worker::spans`); None: no span anywhere.
    pub spans: Option<Spans>,
    poisoned: Mutex<BoundedSet>,
}

/// Message ids judged poison by this worker (for `--on-poison leave`), oldest forgotten first.
struct BoundedSet {
    set: HashSet<String>,
    order: VecDeque<String>,
    capacity: usize,
}

impl BoundedSet {
    fn insert(&mut self, id: &str) {
        if self.set.insert(id.to_string()) {
            self.order.push_back(id.to_string());
            while self.order.len() > self.capacity {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

/// A received message not yet finished: its heartbeat, its slot, and a release if dropped unfinished.
///
/// The heartbeat runs inline while the message is processed (one task per message, no timer unless
/// a beat is due); a FIFO message waiting behind its group gets a background heartbeat meanwhile.
pub struct Lease {
    pub msg: Message,
    beat: Beat,
    background: Option<Heartbeat>,
    processor: Arc<Processor>,
    settled: bool,
    latency: Option<Duration>,
    unreachable: bool,
    store_down: bool,
    /// When a handler call for this message first failed in this receive (it is then held, or retried).
    failed_at: Option<Instant>,
    /// The S3 payload fetched for this message (`--s3-payloads`), deleted after the message with
    /// `--s3-delete-after`.
    s3_payload: Option<super::s3::Pointer>,
    /// Tracing on: the message's `qc.message` span, ended when the lease goes.
    span: Option<MessageSpan>,
}

impl Lease {
    /// The lease started at receipt: the first beat is due one interval after it, rounded down onto
    /// the shared cadence (messages received together share every beat). `rh`: the message's
    /// receipt handle as `Held::admit` keeps it (a later copy of the message replaces it).
    fn new(processor: &Arc<Processor>, msg: Message, rh: Arc<ReceiptHandle>) -> Lease {
        processor.metrics.in_flight.inc();
        let next = processor
            .heartbeat
            .zip(processor.heartbeats.as_ref())
            .map(|(interval, hb)| hb.align(Instant::from_std(msg.received_at) + interval));
        let received_at = Instant::from_std(msg.received_at);
        let lease_until = received_at + processor.visibility_timeout;
        let span = processor.spans.as_ref().map(|s| s.message(&msg));
        Lease {
            msg,
            beat: Beat {
                rh,
                next,
                failures: 0,
                made: 0,
                received_at,
                lease_until,
                lost: false,
            },
            background: None,
            processor: processor.clone(),
            settled: false,
            latency: None,
            unreachable: false,
            store_down: false,
            failed_at: None,
            s3_payload: None,
            span,
        }
    }

    /// How long ago this message first failed: in this receive (held for the breaker's probe), or
    /// since SQS first delivered it when redelivered. None on a first try.
    fn first_failed(&self) -> Option<Duration> {
        let here = self.failed_at.map(|t| t.elapsed());
        here.max(first_received(&self.msg))
    }

    /// Keeps the lease alive while the message waits (behind its FIFO group).
    pub fn beat_in_background(&mut self) {
        if self.background.is_none() && self.beat.next.is_some() {
            let (stop, stopped) = oneshot::channel();
            let processor = self.processor.clone();
            let id = self.msg.id.clone();
            let mut beat = self.beat.clone();
            let task = tokio::spawn(async move {
                tokio::pin!(stopped);
                while let Some(at) = beat.next {
                    tokio::select! {
                        _ = &mut stopped => break,
                        () = tokio::time::sleep_until(at) => beat.run(&processor, &id).await,
                    }
                }
                beat
            });
            self.background = Some(Heartbeat::Own { stop, task });
        }
    }

    /// `beat_in_background` for several leases with one task between them (a batch call's): their
    /// beats falling due together go out together. Each lease is taken back by `beat_inline`, or all
    /// at once by `beat_inline_all`, after any beat in flight. A lease already kept in the background
    /// stays as it is.
    pub fn beat_together<'a>(leases: impl IntoIterator<Item = &'a mut Lease>) {
        let (asks, inbox) = mpsc::unbounded_channel();
        let mut beats = Vec::new();
        let mut processor = None;
        for lease in leases {
            if lease.background.is_some() || lease.beat.next.is_none() {
                continue;
            }
            lease.background = Some(Heartbeat::Shared {
                asks: asks.clone(),
                at: beats.len(),
            });
            beats.push(Some(SharedBeat {
                beat: lease.beat.clone(),
                message_id: lease.msg.id.clone(),
            }));
            processor.get_or_insert_with(|| lease.processor.clone());
        }
        if let Some(p) = processor {
            tokio::spawn(beat_shared(p, beats, inbox));
        }
    }

    /// Takes the heartbeat back from the background task, waiting for a call it has in flight.
    async fn beat_inline(&mut self) {
        match self.background.take() {
            None => {}
            Some(Heartbeat::Own { stop, task }) => {
                let _ = stop.send(());
                if let Ok(beat) = task.await {
                    self.beat = beat;
                }
            }
            Some(Heartbeat::Shared { asks, at }) => {
                let (reply, answer) = oneshot::channel();
                if asks.send(Ask::Take(vec![at], reply)).is_ok()
                    && let Ok(mut beats) = answer.await
                    && let Some((_, beat)) = beats.pop()
                {
                    self.beat = beat;
                }
            }
        }
    }

    /// `beat_inline` for every lease, with one request to a shared task for the leases it beats.
    async fn beat_inline_all(leases: &mut [&mut Lease]) {
        let mut shared: Option<mpsc::UnboundedSender<Ask>> = None;
        let mut ats = Vec::new();
        for lease in leases.iter_mut() {
            if let Some(Heartbeat::Shared { asks, at }) = &lease.background
                && shared.as_ref().is_none_or(|s| s.same_channel(asks))
            {
                shared.get_or_insert_with(|| asks.clone());
                ats.push(*at);
            }
        }
        if let Some(asks) = shared {
            let (reply, answer) = oneshot::channel();
            let beats = if asks.send(Ask::Take(ats, reply)).is_ok() {
                answer.await.unwrap_or_default()
            } else {
                Vec::new()
            };
            let mut beats = beats.into_iter().peekable();
            for lease in leases.iter_mut() {
                if let Some(Heartbeat::Shared { asks: a, at }) = &lease.background
                    && a.same_channel(&asks)
                {
                    let at = *at;
                    lease.background = None;
                    if let Some((_, beat)) = beats.next_if(|(i, _)| *i == at) {
                        lease.beat = beat;
                    }
                }
            }
        }
        // Leases with a task of their own, or of another shared task.
        for lease in leases.iter_mut() {
            lease.beat_inline().await;
        }
    }

    /// When this message's next heartbeat is due, unless a background heartbeat already keeps it.
    pub fn beat_due(&self) -> Option<Instant> {
        match self.background {
            Some(_) => None,
            None => self.beat.next,
        }
    }

    fn entry(&self) -> Entry {
        Entry {
            message_id: self.msg.id.clone(),
            receipt_handle: self.beat.rh.get(),
            lease_until: Some(self.beat.lease_until.into_std()),
        }
    }

    /// Makes the message visible again at once, unhandled (shutdown, FIFO group stopped).
    pub async fn release(mut self) {
        self.release_in_place().await;
    }

    /// `release`, for a message task that still owns its lease (the breaker's gate on shutdown).
    async fn release_in_place(&mut self) {
        self.beat_inline().await;
        // Visible again at once: a copy received from now on is a new delivery.
        self.processor.held.forget(&self.msg.id);
        self.processor.releaser.send(self.entry()).await;
        self.settled = true;
    }

    /// `delete` after the handler succeeded (or the key was done): a copy of the message received
    /// soon after is deleted again without a call (`worker::held`).
    async fn delete_done(&mut self) -> Ended {
        self.processor.held.finished(&self.msg.id, Instant::now());
        self.delete().await
    }

    /// Deletes the message: `Deleted`, or with `confirm_deletes` `Kept` if SQS never confirmed it.
    /// With `--s3-delete-after` the delete is always confirmed first and the payload's object deleted
    /// after it: a message whose delete failed comes back and still finds its payload.
    async fn delete(&mut self) -> Ended {
        self.settled = true;
        let p = self.processor.clone();
        let payload = self
            .s3_payload
            .take()
            .filter(|_| p.s3.as_ref().is_some_and(|s| s.delete_after));
        if !p.confirm_deletes && payload.is_none() {
            p.deleter.send(self.entry()).await;
            return Ended::Deleted;
        }
        if !p.deleter.send_confirmed(self.entry()).await {
            return Ended::Kept;
        }
        if let (Some(ptr), Some(s3)) = (payload, &p.s3) {
            s3.delete(&ptr, &self.msg.id).await;
        }
        Ended::Deleted
    }

    /// Sets the visibility to `delay` (already within SQS's 12 hours since the receive: `decide`
    /// cuts it) so the message comes back then.
    async fn set_visibility(&mut self, delay: Duration) {
        let secs = visibility_secs(delay);
        self.processor.held.forget(&self.msg.id);
        if let Err(e) = self
            .processor
            .sqs
            .change_visibility(&self.beat.rh.get(), secs)
            .await
        {
            tracing::warn!(message_id = %self.msg.id, reason = e.kind.reason(), error = %e.detail, "cannot change the message's visibility; it reappears when its visibility timeout ends");
        }
        self.settled = true;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        match self.background.take() {
            Some(Heartbeat::Own { stop, .. }) => {
                let _ = stop.send(());
            }
            Some(Heartbeat::Shared { asks, at }) => {
                let _ = asks.send(Ask::Forget(at));
            }
            None => {}
        }
        self.processor.held.forget(&self.msg.id);
        if !self.settled {
            // Aborted mid-way (shutdown deadline) or a panic: hand the message back at once.
            self.processor.releaser.try_send(self.entry());
        }
        self.processor.metrics.in_flight.dec();
        let _ = self.processor.freed.send(Freed {
            latency: self.latency,
            unreachable: self.unreachable,
            store_down: self.store_down,
        });
    }
}

impl Processor {
    /// Leases for the messages of one receive. A copy of a message held here adds no lease (the
    /// held one takes its newest receipt handle); a copy of one deleted here after a success is
    /// deleted again without a call (`worker::held`).
    pub async fn admit(self: &Arc<Self>, messages: Vec<Message>) -> Vec<Lease> {
        let mut leases = Vec::with_capacity(messages.len());
        for msg in messages {
            match self
                .held
                .admit(&msg.id, &msg.receipt_handle, Instant::now())
            {
                Admission::New(rh) => leases.push(Lease::new(self, msg, rh)),
                Admission::Held => {
                    self.metrics.duplicate_receives.inc();
                    tracing::warn!(message_id = %msg.id, receive_count = msg.receive_count, "received a message this worker already holds (another receive got it too): the held one takes its newest receipt handle, no second handler call");
                }
                Admission::Done => {
                    self.metrics.duplicate_receives.inc();
                    self.metrics.outcome(OutcomeLabel::Duplicate);
                    tracing::info!(message_id = %msg.id, receive_count = msg.receive_count, "received again a message deleted here after its handler succeeded; deleting this copy without a call");
                    self.deleter
                        .send(Entry {
                            message_id: msg.id,
                            receipt_handle: msg.receipt_handle,
                            lease_until: None,
                        })
                        .await;
                }
            }
        }
        leases
    }
}

/// Who keeps a lease alive while its message task does something else.
enum Heartbeat {
    /// A task of its own (a message waiting for a slot or behind its FIFO group).
    Own {
        stop: oneshot::Sender<()>,
        task: tokio::task::JoinHandle<Beat>,
    },
    /// One task for the leases of a batch call (`Lease::beat_together`); `at` is its place there.
    Shared {
        asks: mpsc::UnboundedSender<Ask>,
        at: usize,
    },
}

/// What a lease asks of the shared heartbeat task.
enum Ask {
    /// Hand these beats back (after any beat in flight), in the order asked.
    Take(Vec<usize>, oneshot::Sender<Vec<(usize, Beat)>>),
    /// Stop beating this one: its lease is gone.
    Forget(usize),
}

/// One lease's beat inside the shared task.
struct SharedBeat {
    beat: Beat,
    message_id: String,
}

/// The shared heartbeat task: beats every lease given to it when due (those due together at once,
/// so the coalescer sends them in one call) until each has been taken back or forgotten.
async fn beat_shared(
    p: Arc<Processor>,
    mut beats: Vec<Option<SharedBeat>>,
    mut inbox: mpsc::UnboundedReceiver<Ask>,
) {
    while beats.iter().any(Option::is_some) {
        let due = beats.iter().flatten().filter_map(|b| b.beat.next).min();
        tokio::select! {
            ask = inbox.recv() => match ask {
                // Every lease is gone.
                None => return,
                Some(Ask::Take(ats, reply)) => {
                    let taken = ats
                        .into_iter()
                        .filter_map(|at| beats.get_mut(at).and_then(Option::take).map(|b| (at, b.beat)))
                        .collect();
                    let _ = reply.send(taken);
                }
                Some(Ask::Forget(at)) => {
                    if let Some(b) = beats.get_mut(at) {
                        *b = None;
                    }
                }
            },
            () = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                let now = Instant::now();
                futures::future::join_all(
                    beats
                        .iter_mut()
                        .flatten()
                        .filter(|b| b.beat.next.is_some_and(|n| n <= now))
                        .map(|b| b.beat.run(&p, &b.message_id)),
                )
                .await;
            }
        }
    }
}

/// Heartbeat schedule of one message.
#[derive(Clone)]
struct Beat {
    /// The message's newest receipt handle (`worker::held`).
    rh: Arc<ReceiptHandle>,
    next: Option<Instant>,
    failures: u32,
    /// Extensions made so far: the next one is `Plan::extension(made, ..)`.
    made: u32,
    /// When the receive returned (SQS's 12 hours of visibility count from the receive).
    received_at: Instant,
    /// The lease runs at least until then: receipt plus the visibility timeout, or the last
    /// extension's start plus that extension.
    lease_until: Instant,
    /// The lease was lost (counted once): the message may be delivered again.
    lost: bool,
}

impl Beat {
    /// How long ago the receive returned: SQS's 12 hours of visibility count from it.
    fn since_receipt(&self) -> Duration {
        Instant::now().saturating_duration_since(self.received_at)
    }

    /// Runs `work` while keeping the message's lease alive; None if it is still running at `deadline`.
    /// A beat is awaited before `work` is polled again, so no visibility change is in flight when
    /// this returns. One timer serves the beats and the deadline, reset in place.
    async fn until<T>(
        &mut self,
        p: &Processor,
        msg: &Message,
        deadline: Instant,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        self.until_or_lost(p, msg, deadline, false, work).await
    }

    /// `until`; with `stop_when_lost`, also None as soon as a beat finds the lease lost (a message
    /// waiting at the breaker's gate must not wait for a call it may no longer make).
    async fn until_or_lost<T>(
        &mut self,
        p: &Processor,
        msg: &Message,
        deadline: Instant,
        stop_when_lost: bool,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let due = |next: Option<Instant>| next.map_or(deadline, |n| n.min(deadline));
        tokio::pin!(work);
        let timer = tokio::time::sleep_until(due(self.next));
        tokio::pin!(timer);
        loop {
            tokio::select! {
                biased;
                out = &mut work => return Some(out),
                () = &mut timer => {
                    if Instant::now() >= deadline {
                        return None;
                    }
                    self.run(p, &msg.id).await;
                    if stop_when_lost && self.lost {
                        return None;
                    }
                    timer.as_mut().reset(due(self.next));
                }
            }
        }
    }

    /// One visibility extension (growing: the visibility timeout first, then twice the one before,
    /// up to the plan's cap), sent by the coalescer in a ChangeMessageVisibilityBatch with the
    /// others due now; schedules the next one on the shared cadence, at the same fraction of the
    /// new lease as the interval is of the visibility timeout.
    async fn run(&mut self, p: &Processor, message_id: &str) {
        let Some(heartbeats) = &p.heartbeats else {
            self.next = None;
            return;
        };
        let plan: &Plan = heartbeats.plan();
        let Some(extension) = plan.extension(self.made, self.since_receipt()) else {
            // SQS refuses any visibility past 12 hours from the receive: nothing left to extend.
            self.next = None;
            self.lose(
                p,
                message_id,
                "SQS's 12 hours of visibility since the receive are used up",
            );
            return;
        };
        // The coalescer gives the call the earliest member's lease end minus a margin as its
        // deadline: a hung call must not outlive the lease it is meant to extend.
        let entry = Entry {
            message_id: message_id.to_string(),
            receipt_handle: self.rh.get(),
            lease_until: Some(self.lease_until.into_std()),
        };
        match heartbeats.extend(entry, extension).await {
            Ok(started) => {
                p.metrics.heartbeats.inc();
                if started >= self.lease_until {
                    // Extended, but only after the lease had lapsed: another consumer may have
                    // received the message meanwhile.
                    self.lose(
                        p,
                        message_id,
                        "the extension started after the lease had ended",
                    );
                }
                self.failures = 0;
                self.made = self.made.saturating_add(1);
                self.lease_until = started + extension;
                self.next = Some(heartbeats.next_after(started, plan.gap(extension)));
            }
            Err(e) => {
                p.metrics.heartbeat_failures.inc();
                self.failures = self.failures.saturating_add(1);
                let gone = lease_lost(e.kind);
                tracing::warn!(message_id, reason = e.kind.reason(), error = %e.detail, "heartbeat failed{}", if gone { "; the lease is lost, the message may be delivered again" } else { "; retrying" });
                if gone {
                    self.lose(p, message_id, e.kind.reason());
                } else if Instant::now() >= self.lease_until {
                    self.lose(
                        p,
                        message_id,
                        "the lease ended before a heartbeat call succeeded",
                    );
                }
                self.next = if gone {
                    None
                } else {
                    // Retry well inside the remaining lease.
                    let retry = (plan.interval / 4)
                        .clamp(Duration::from_millis(100), Duration::from_secs(2));
                    let left = self.lease_until.saturating_duration_since(Instant::now());
                    Some(Instant::now() + (retry * self.failures.min(4)).min(left / 2))
                };
            }
        }
    }
}

impl Beat {
    /// Counts a lost lease once (`qc_worker_heartbeat_leases_lost_total`); failed calls retried in
    /// time are only in `qc_worker_heartbeat_failures_total`.
    fn lose(&mut self, p: &Processor, message_id: &str, why: &str) {
        if !self.lost {
            self.lost = true;
            p.metrics.heartbeat_leases_lost.inc();
            tracing::warn!(
                message_id,
                why,
                "lease lost; the message may be delivered again"
            );
        }
    }
}

/// A claim lives this long past its handler's deadline: room to stop the handler and record the result.
const CLAIM_GRACE: Duration = Duration::from_secs(10);
/// A handler call still not stopped this long after its deadline is dropped (its claim then expires
/// by itself, `CLAIM_GRACE` after the last renewal).
const STOP_BACKSTOP: Duration = Duration::from_secs(5);
/// How a message ended, for the FIFO group it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Deleted (success, duplicate, poison deleted): the group may go on.
    Deleted,
    /// Still on the queue (retry, poison left, in progress elsewhere): later messages of the group must wait.
    Kept,
}

impl Processor {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sqs: Sqs,
        metrics: Arc<Metrics>,
        handler: Handler,
        store: Option<Store>,
        key: IdempotencyKey,
        idempotency_ttl: Duration,
        visibility_timeout: Duration,
        heartbeat: Option<Duration>,
        timeout: Duration,
        retry_base: Duration,
        retry_max: Duration,
        on_poison: OnPoison,
        dead_letter: Option<DeadLetter>,
        deleter: Batcher,
        releaser: Batcher,
        freed: mpsc::UnboundedSender<Freed>,
        breaker: Arc<Breaker>,
    ) -> Self {
        let heartbeats = heartbeat.map(|interval| {
            Heartbeats::spawn(
                sqs.clone(),
                metrics.clone(),
                Plan::new(visibility_timeout, interval, timeout),
            )
        });
        Processor {
            sqs,
            metrics,
            handler,
            store,
            key,
            idempotency_ttl,
            visibility_timeout,
            heartbeats,
            heartbeat,
            timeout,
            retry_base,
            retry_max,
            on_poison,
            unwrap_sns: UnwrapSns::Off,
            s3: None,
            schema: None,
            filter: None,
            dead_letter,
            deleter,
            releaser,
            freed,
            confirm_deletes: false,
            breaker,
            held: Held::default(),
            spans: None,
            poisoned: Mutex::new(BoundedSet {
                set: HashSet::new(),
                order: VecDeque::new(),
                capacity: 10_000,
            }),
        }
    }

    fn known_poison(&self, id: &str) -> bool {
        self.poisoned.lock().is_ok_and(|s| s.set.contains(id))
    }

    fn remember_poison(&self, id: &str) {
        if let Ok(mut s) = self.poisoned.lock() {
            s.insert(id);
        }
    }

    /// The fate of `happened` for this message (`core::fate::decide`).
    fn fate(&self, lease: &Lease, happened: Happened) -> Fate {
        let policy = Policy {
            on_poison: self.on_poison,
            retry_base: self.retry_base,
            retry_max: self.retry_max,
            visibility_timeout: self.visibility_timeout,
        };
        let facts = Facts {
            receive_count: lease.msg.receive_count,
            since_receipt: lease.beat.since_receipt(),
        };
        decide(happened, &policy, facts)
    }

    /// Ends the message as `happened` decides: the fate, then `carry_out`.
    async fn settle(&self, lease: &mut Lease, happened: Happened, reason: &str) -> Ended {
        let fate = self.fate(lease, happened.clone());
        let ended = self.carry_out(lease, &happened, fate, reason).await;
        self.observe_dwell(lease, ended);
        ended
    }

    /// A message that left the queue (deleted, or moved to the DLQ): its time there.
    fn observe_dwell(&self, lease: &Lease, ended: Ended) {
        if matches!(ended, Ended::Deleted)
            && let Some(age) =
                super::metrics::age_seconds(lease.msg.sent_timestamp, super::metrics::now_ms())
        {
            self.metrics.dwell_seconds.observe(age);
        }
    }

    /// Carries a fate out: the one place a message is deleted, dead-lettered, retried, released,
    /// hidden or left, with its log line. `reason`: what happened. `Hold` is no end (the caller keeps
    /// the message for the breaker's probe); given here, the message is released, unhandled.
    async fn carry_out(
        &self,
        lease: &mut Lease,
        happened: &Happened,
        fate: Fate,
        reason: &str,
    ) -> Ended {
        let span = match (&self.spans, &lease.span) {
            (Some(s), Some(m)) => Some(s.settle(m, &fate)),
            _ => return self.carry_out_untraced(lease, happened, fate, reason).await,
        };
        let dead_letter = matches!(fate, Fate::DeadLetter(_));
        let ended = self.carry_out_untraced(lease, happened, fate, reason).await;
        if let Some(span) = span {
            // A dead-letter kept on the queue, or a delete SQS never confirmed, did not happen.
            let failed = match ended {
                Ended::Kept if dead_letter => Some(
                    "the dead-letter queue did not take the message; left for the redrive policy",
                ),
                _ => None,
            };
            span.end_settle(failed);
        }
        ended
    }

    async fn carry_out_untraced(
        &self,
        lease: &mut Lease,
        happened: &Happened,
        fate: Fate,
        reason: &str,
    ) -> Ended {
        // A batch item's or waiting message's heartbeat runs in the background: taken back first,
        // so no beat lands after the end.
        lease.beat_inline().await;
        let (id, count) = (lease.msg.id.clone(), lease.msg.receive_count);
        let mut fate = fate;
        // The DLQ could not take it: left for the redrive policy instead (`DeadLetterFailed`).
        if let Fate::DeadLetter(poison) = &fate {
            if let Some(ended) = self.dead_letter(lease, poison).await {
                return ended;
            }
            fate = self.fate(lease, Happened::DeadLetterFailed);
        }
        match fate {
            Fate::Delete { success: true } => lease.delete_done().await,
            Fate::Discard => {
                tracing::debug!(message_id = %id, receive_count = count, "no filter pattern matches the message; deleting it without calling the handler");
                lease.delete().await
            }
            Fate::Delete { success: false } => {
                tracing::warn!(message_id = %id, receive_count = count, reason, "poison message; deleting it (--on-poison delete)");
                lease.delete().await
            }
            Fate::RetryAfter { delay, wanted } => {
                if let Some(wanted) = wanted {
                    tracing::info!(message_id = %id, wanted_s = visibility_secs(wanted), retry_in_s = visibility_secs(delay), "retry delay cut to what is left of SQS's 12 hours since the receive");
                }
                let what = match happened {
                    Happened::StoreDown => {
                        "idempotency store unavailable; retrying the message later and pausing receives until the store answers"
                    }
                    Happened::GateGaveUp { .. } => {
                        "no longer holding the message; retrying it the normal way"
                    }
                    _ => "handler failed; retrying later",
                };
                tracing::warn!(message_id = %id, receive_count = count, reason, retry_in_s = visibility_secs(delay), "{what}");
                lease.set_visibility(delay).await;
                Ended::Kept
            }
            Fate::Release | Fate::Hold => {
                if matches!(fate, Fate::Hold) {
                    tracing::error!(message_id = %id, reason, "a held message reached its end; releasing it unhandled");
                } else {
                    tracing::info!(message_id = %id, reason, "releasing the message unhandled");
                }
                lease.release_in_place().await;
                Ended::Kept
            }
            Fate::Hide(delay) => {
                tracing::info!(message_id = %id, reason, hide_s = visibility_secs(delay), "hiding the message until the claim on its idempotency key ends");
                lease.set_visibility(delay).await;
                Ended::Kept
            }
            Fate::Leave(delay) => {
                if matches!(happened, Happened::Poison(_))
                    && !matches!(self.on_poison, OnPoison::DeadLetter)
                {
                    tracing::warn!(message_id = %id, receive_count = count, reason, "poison message; leaving it for the redrive policy (--on-poison leave)");
                }
                // Remembered: later receives here skip the handler until the redrive policy moves it.
                self.remember_poison(&id);
                lease.set_visibility(delay).await;
                Ended::Kept
            }
            Fate::DeadLetter(_) => {
                // `decide` never makes DeadLetterFailed a dead-letter again: left, not deleted.
                tracing::error!(message_id = %id, reason, "poison message; left for the redrive policy");
                self.remember_poison(&id);
                Ended::Kept
            }
            Fate::Abandon => {
                tracing::warn!(message_id = %id, receive_count = count, "the lease was lost before the handler call; leaving the message to SQS unhandled rather than risk two calls at once");
                lease.settled = true;
                Ended::Kept
            }
        }
    }

    /// `--on-poison dead-letter`: sends the message to the redrive policy's DLQ with `reason`, then
    /// deletes it from the source. None without a DLQ, or when the send failed: the caller leaves it
    /// for the redrive policy (`Happened::DeadLetterFailed`).
    async fn dead_letter(&self, lease: &mut Lease, reason: &str) -> Option<Ended> {
        let m = &self.metrics;
        let dl = self.dead_letter.as_ref()?;
        let (id, count) = (lease.msg.id.clone(), lease.msg.receive_count);
        let target = match dl.target().await {
            Ok(Some(url)) => url,
            Ok(None) => {
                tracing::warn!(message_id = %id, receive_count = count, reason = %reason, "poison message; the queue has no redrive policy, so it is left on the queue (--on-poison dead-letter acts as leave)");
                return None;
            }
            Err(e) => {
                m.dead_letter_failures.inc();
                tracing::error!(message_id = %id, reason = %reason, error = %e, "poison message; cannot find the dead-letter queue, leaving it for the redrive policy");
                return None;
            }
        };
        // Sent under the heartbeat: the lease must outlive the send and the delete.
        let deadline = Instant::now() + self.visibility_timeout.max(Duration::from_secs(10));
        let sent = lease
            .beat
            .until(
                self,
                &lease.msg,
                deadline,
                Box::pin(dl.send(&target, &lease.msg, reason)),
            )
            .await;
        match sent {
            Some(Ok(sent)) => {
                m.dead_lettered.inc();
                if sent.reason_attached {
                    tracing::warn!(message_id = %id, receive_count = count, reason = %reason, dead_letter_queue = %target, dead_letter_message_id = %sent.copy_id, "poison message; sent to the dead-letter queue and deleted from the source (--on-poison dead-letter)");
                } else {
                    m.dead_letter_reasons_unattached.inc();
                    tracing::warn!(message_id = %id, receive_count = count, reason = %reason, dead_letter_queue = %target, dead_letter_message_id = %sent.copy_id, "poison message; sent to the dead-letter queue WITHOUT its qc-poison-reason attribute (the message already carries SQS's ten attributes, all kept): the reason is only in this line, under the copy's dead_letter_message_id; deleted from the source");
                }
                Some(lease.delete().await)
            }
            other => {
                m.dead_letter_failures.inc();
                let error = match other {
                    Some(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                tracing::error!(message_id = %id, reason = %reason, error = %error, "poison message; cannot send it to the dead-letter queue, leaving it for the redrive policy");
                None
            }
        }
    }

    /// How long an in-progress mark lives: the handler's whole timeout, plus room to record the result.
    fn claim_lease(&self) -> Duration {
        self.timeout + CLAIM_GRACE
    }

    /// How often a held claim is renewed: at the configured heartbeat interval (not at the growing
    /// gaps between extensions: the claim has its own timer), at most every `CLAIM_GRACE / 2`, so a
    /// claim kept `CLAIM_GRACE` past now never lapses between two renewals.
    fn claim_renewal(&self) -> Duration {
        self.heartbeat
            .unwrap_or(CLAIM_GRACE / 2)
            .min(CLAIM_GRACE / 2)
            .max(Duration::from_millis(500))
    }

    /// Runs the handler call while keeping our claim on `key` alive: until the handler's deadline
    /// plus `CLAIM_GRACE`, and past it while the call is still stopping (the claim must outlive the
    /// handler, never the other way round). A separate hook beside the heartbeat, on its own timer.
    async fn holding_claim<T>(
        &self,
        key: &str,
        token: &str,
        deadline: Instant,
        call: impl std::future::Future<Output = T>,
    ) -> T {
        let Some(store) = &self.store else {
            return call.await;
        };
        tokio::pin!(call);
        let claim = [(key, token)];
        tokio::select! {
            out = &mut call => out,
            never = self.renew_claims(store, &claim, deadline) => match never {},
        }
    }

    /// Renews the claims every `claim_renewal` until dropped; a claim found lost (expired in the
    /// store) is counted once and no longer renewed.
    async fn renew_claims(
        &self,
        store: &Store,
        claims: &[(&str, &str)],
        deadline: Instant,
    ) -> std::convert::Infallible {
        let every = self.claim_renewal();
        let mut held: Vec<(&str, &str)> = claims.to_vec();
        loop {
            tokio::time::sleep(every).await;
            let until = deadline.max(Instant::now()) + CLAIM_GRACE;
            let ttl = until.saturating_duration_since(Instant::now());
            let renewed =
                futures::future::join_all(held.iter().map(|(k, t)| store.renew(k, t, ttl))).await;
            let mut still = Vec::with_capacity(held.len());
            for ((key, token), r) in held.iter().zip(renewed) {
                match r {
                    Ok(true) => still.push((*key, *token)),
                    Ok(false) => {
                        self.metrics.idempotency_claims_lost.inc();
                        tracing::warn!(
                            key,
                            "idempotency claim lost while the handler runs (it expired in the store); another worker may handle the key too"
                        );
                    }
                    Err(e) => {
                        self.metrics.idempotency_errors.inc();
                        tracing::warn!(key, error = %e, "cannot renew the idempotency claim; retrying");
                        still.push((*key, *token));
                    }
                }
            }
            held = still;
        }
    }

    /// The last moment a message may wait at the breaker's gate and still make a whole handler
    /// call inside its lease: with heartbeats, within SQS's 12 hours since the receive; without,
    /// within the lease it got at the receive.
    fn hold_deadline(&self, lease: &Lease) -> Instant {
        let call = self.timeout + STOP_BACKSTOP + Duration::from_secs(5);
        match self.heartbeat {
            Some(_) => {
                lease.beat.received_at
                    + super::core::backoff::VISIBILITY_MAX
                        .saturating_sub(super::core::backoff::TWELVE_HOURS_SLACK)
                        .saturating_sub(call)
            }
            None => lease
                .beat
                .lease_until
                .checked_sub(call)
                .unwrap_or(lease.beat.received_at),
        }
    }

    /// Passes the breaker's gate: at once while it is closed, else waiting (under the heartbeat)
    /// for the probe or a slow-start slot. A message that leaves without a call is settled here:
    /// released on shutdown (or when it never failed), backed off when it did.
    async fn pass_gate<'a>(
        &'a self,
        lease: &mut Lease,
        failed_before: bool,
    ) -> Result<Pass<'a>, Ended> {
        if lease.beat.lost {
            return Err(self.settle(lease, Happened::LeaseLost, "").await);
        }
        if let Some(pass) = self.breaker.try_pass() {
            return Ok(pass);
        }
        let deadline = self.hold_deadline(lease);
        let admitted = lease
            .beat
            .until_or_lost(
                self,
                &lease.msg,
                deadline,
                true,
                Box::pin(self.breaker.admit(gate_kind(failed_before, &lease.msg))),
            )
            .await;
        if lease.beat.lost {
            // A pass taken meanwhile goes back unused (dropped: counted neutral, the next waiter
            // probes).
            return Err(self.settle(lease, Happened::LeaseLost, "").await);
        }
        match admitted {
            Some(Ok(pass)) => Ok(pass),
            Some(Err(Denied::ShuttingDown)) => Err(self
                .settle(
                    lease,
                    Happened::NotStarted,
                    "shutting down while the breaker is open",
                )
                .await),
            other => {
                let why = if other.is_none() {
                    "held as long as its lease allows"
                } else {
                    "the breaker has been open longer than the outage tolerance"
                };
                Err(self
                    .settle(lease, Happened::GateGaveUp { failed_before }, why)
                    .await)
            }
        }
    }

    /// Runs one message to its end.
    pub async fn process(&self, mut lease: Lease) -> Ended {
        let m = &self.metrics;
        if let (Some(s), Some(span)) = (&self.spans, &lease.span) {
            s.waited(span);
        }
        lease.beat_inline().await;
        if let Some(ended) = self.end_filtered(&mut lease).await {
            return ended;
        }
        if let Some(ended) = self.end_known_poison(&mut lease).await {
            return ended;
        }
        // What the handler gets: an SNS notification unwrapped (`--unwrap-sns`); the queue's own
        // message is what a retry, the DLQ and the idempotency claim's lease work on.
        let view = match super::sns::unwrap(self.unwrap_sns, &lease.msg) {
            Ok(view) => view,
            Err(reason) => {
                m.outcome(OutcomeLabel::Poison);
                return self
                    .settle(&mut lease, Happened::Poison(reason.clone()), &reason)
                    .await;
            }
        };
        // Failed in this receive and kept for another call (the breaker is open).
        let mut failed_before = false;
        loop {
            let pass = match self.pass_gate(&mut lease, failed_before).await {
                Ok(pass) => pass,
                Err(ended) => return ended,
            };
            match self.attempt(&mut lease, pass, view.as_ref()).await {
                Attempt::Ended(ended) => return ended,
                Attempt::Failed {
                    reason,
                    retry_after,
                    hold,
                } => {
                    let happened = Happened::Failed { retry_after, hold };
                    match self.fate(&lease, happened.clone()) {
                        Fate::Hold => {
                            failed_before = true;
                            m.breaker_holds.inc();
                            tracing::info!(message_id = %lease.msg.id, receive_count = lease.msg.receive_count, reason = %reason, "handler failed while the breaker is open; holding the message for the next probe instead of handing it back");
                        }
                        fate => {
                            let ended = self.carry_out(&mut lease, &happened, fate, &reason).await;
                            self.observe_dwell(&lease, ended);
                            return ended;
                        }
                    }
                }
            }
        }
    }

    /// A message no `--filter` pattern matches is deleted without a call; None for any other. Only a
    /// clean non-match deletes: a record the filter cannot read goes on to the handler.
    async fn end_filtered(&self, lease: &mut Lease) -> Option<Ended> {
        // A lost lease is the normal path's to settle (abandoned, never deleted with a stale handle).
        if lease.beat.lost {
            return None;
        }
        match self.filter.as_ref()?.screen(&lease.msg) {
            Screen::Pass => None,
            Screen::NoMatch => {
                self.metrics.filtered.inc();
                Some(self.settle(lease, Happened::Filtered, "").await)
            }
            Screen::Undecided(reason) => {
                tracing::warn!(message_id = %lease.msg.id, reason = %reason, "the filter cannot read the message; handing it to the handler rather than deleting it");
                None
            }
        }
    }

    /// A message already judged poison here (unless `--on-poison delete`) gets no handler call: it is
    /// left cycling towards the DLQ, or the dead-letter send is tried again. None for any other.
    async fn end_known_poison(&self, lease: &mut Lease) -> Option<Ended> {
        if self.on_poison == OnPoison::Delete || !self.known_poison(&lease.msg.id) {
            return None;
        }
        self.metrics.outcome(OutcomeLabel::Poison);
        Some(
            self.settle(
                lease,
                Happened::KnownPoison,
                "handler answered poison on an earlier receive",
            )
            .await,
        )
    }

    /// What the idempotency claim of `key` decides: the claim's token when acquired, else how the
    /// message ended without a call (a key already done is deleted, one in progress elsewhere hidden
    /// until that claim ends, a store that does not answer backs the message off and pauses receives).
    async fn claim_outcome(
        &self,
        lease: &mut Lease,
        key: &str,
        claimed: Result<Claim, IdempotencyError>,
    ) -> Result<String, Ended> {
        let m = &self.metrics;
        let (happened, reason) = match claimed {
            Ok(Claim::Acquired { token }) => return Ok(token),
            Ok(Claim::Done) => {
                tracing::info!(message_id = %lease.msg.id, key = %key, "idempotency key already done; deleting without calling the handler");
                m.outcome(OutcomeLabel::Duplicate);
                (Happened::KeyDone, String::new())
            }
            Ok(Claim::Mismatch { reason }) => {
                m.outcome(OutcomeLabel::Poison);
                (Happened::Poison(reason.clone()), reason)
            }
            Ok(Claim::InProgress { remaining }) => {
                m.outcome(OutcomeLabel::InProgressElsewhere);
                let claim_left = remaining.unwrap_or_else(|| self.claim_lease());
                (
                    Happened::InProgressElsewhere { claim_left },
                    format!(
                        "idempotency key {key} in progress elsewhere for {} ms more",
                        claim_left.as_millis()
                    ),
                )
            }
            Err(e) => {
                m.idempotency_errors.inc();
                lease.store_down = true;
                m.outcome(OutcomeLabel::Transient);
                (Happened::StoreDown, e.to_string())
            }
        };
        Err(self.settle(lease, happened, &reason).await)
    }

    /// One handler call (with its idempotency claim); a transient failure is returned for
    /// `process` to hold or back off. `view`: what the handler gets, when not the message itself.
    async fn attempt(&self, lease: &mut Lease, pass: Pass<'_>, view: Option<&Message>) -> Attempt {
        let m = &self.metrics;
        // An Extended Client payload is fetched for each call, after the breaker's gate: an S3
        // outage counts against it like the handler's own dependency.
        let fetched;
        let view = match self.fetch_payload(lease, view).await {
            Ok(None) => view,
            Ok(Some(v)) => {
                fetched = v;
                Some(&fetched)
            }
            Err(Payload::Poison(reason)) => {
                m.outcome(OutcomeLabel::Poison);
                drop(pass);
                let ended = self
                    .settle(lease, Happened::Poison(reason.clone()), &reason)
                    .await;
                return Attempt::Ended(ended);
            }
            Err(Payload::Duplicate(reason)) => {
                drop(pass);
                m.outcome(OutcomeLabel::Duplicate);
                tracing::info!(message_id = %lease.msg.id, reason = %reason, "a copy of a message already handled; deleting it without calling the handler");
                let ended = self.settle(lease, Happened::KeyDone, &reason).await;
                return Attempt::Ended(ended);
            }
            Err(Payload::Transient(reason)) => {
                m.outcome(OutcomeLabel::Transient);
                let hold = pass.record(Outcome::Failure {
                    first_received: lease.first_failed(),
                });
                lease.failed_at.get_or_insert_with(Instant::now);
                return Attempt::Failed {
                    reason,
                    retry_after: None,
                    hold,
                };
            }
        };
        if let Some(reason) = self.schema_violation(view.unwrap_or(&lease.msg)) {
            m.outcome(OutcomeLabel::Poison);
            drop(pass);
            let ended = self
                .settle(lease, Happened::Poison(reason.clone()), &reason)
                .await;
            return Attempt::Ended(ended);
        }
        let mut claimed: Option<(String, String)> = None;
        if let Some(store) = &self.store {
            match key_of(&self.key, view.unwrap_or(&lease.msg)) {
                Err(e) => {
                    m.idempotency_key_missing.inc();
                    tracing::warn!(message_id = %lease.msg.id, key_source = %self.key, error = %e, "no idempotency key; handling the message without de-duplication");
                }
                Ok(key) => {
                    let hash = payload_hash(&view.unwrap_or(&lease.msg).body);
                    let claim = lease
                        .beat
                        .until(
                            self,
                            &lease.msg,
                            Instant::now() + self.claim_lease(),
                            Box::pin(store.claim(&key, self.claim_lease(), &hash)),
                        )
                        .await
                        .unwrap_or(Err(IdempotencyError::TimedOut));
                    match self.claim_outcome(lease, &key, claim).await {
                        Ok(token) => claimed = Some((key, token)),
                        Err(ended) => return Attempt::Ended(ended),
                    }
                }
            }
        }

        let started = Instant::now();
        if let Some(age) =
            super::metrics::age_seconds(lease.msg.sent_timestamp, super::metrics::now_ms())
        {
            m.wait_seconds.observe(age);
        }
        let deadline = started + self.timeout;
        // The handler stops itself at the deadline (connection closed, process group killed and
        // reaped) and the claim is held until it has; the heartbeat's own bound is a backstop.
        let span = match (&self.spans, &lease.span) {
            (Some(s), Some(m)) => Some(s.handle(m)),
            _ => None,
        };
        // The handler's traceparent is the call's span (its own spans nest under it).
        let traced;
        let msg = match (&span, view) {
            (None, view) => view.unwrap_or(&lease.msg),
            (Some(span), None) => {
                lease.msg.handler_traceparent = Some(span.traceparent());
                &lease.msg
            }
            (Some(span), Some(view)) => {
                traced = Message {
                    handler_traceparent: Some(span.traceparent()),
                    ..view.clone()
                };
                &traced
            }
        };
        let call = async {
            let call = self.handler.handle(msg, deadline);
            match &claimed {
                Some((key, token)) => self.holding_claim(key, token, deadline, call).await,
                None => call.await,
            }
        };
        // Boxed, like the SQS calls: keeps the message task's future small to spawn.
        let verdict = lease
            .beat
            .until(self, &lease.msg, deadline + STOP_BACKSTOP, Box::pin(call))
            .await
            .flatten();
        let latency = started.elapsed();
        lease.latency = Some(latency);
        m.handler_seconds.observe(latency.as_secs_f64());

        let (verdict, timed_out) = match verdict {
            Some(v) => (v, false),
            None => (
                Verdict::Transient {
                    reason: format!(
                        "handler timed out after {}",
                        crate::api::Duration::from_std(self.timeout)
                    ),
                    retry_after: None,
                    cause: Cause::Downstream,
                },
                true,
            ),
        };
        if let Some(span) = span {
            span.end_handle(&verdict, timed_out);
        }

        if let Some((key, token)) = &claimed {
            let recorded = if verdict == Verdict::Success {
                let hash = payload_hash(&view.unwrap_or(&lease.msg).body);
                store_call(self, |s| s.complete(key, self.idempotency_ttl, &hash)).await
            } else {
                store_call(self, |s| s.abandon(key, token)).await
            };
            if let Err(e) = recorded {
                m.idempotency_errors.inc();
                tracing::warn!(message_id = %lease.msg.id, key = %key, error = %e, "cannot record the idempotency result");
            }
        }
        let hold = pass.record(breaker_outcome(&verdict, lease.first_failed()));
        if !matches!(verdict, Verdict::Success | Verdict::Poison(_)) {
            lease.failed_at.get_or_insert_with(Instant::now);
        }

        let msg = &lease.msg;
        match verdict {
            Verdict::Success => {
                m.outcome(OutcomeLabel::Success);
                Attempt::Ended(self.settle(lease, Happened::Succeeded, "").await)
            }
            Verdict::Poison(reason) => {
                m.outcome(OutcomeLabel::Poison);
                let ended = self
                    .settle(lease, Happened::Poison(reason.clone()), &reason)
                    .await;
                Attempt::Ended(ended)
            }
            Verdict::Transient {
                reason,
                retry_after,
                ..
            } => {
                m.outcome(if timed_out {
                    OutcomeLabel::Timeout
                } else {
                    OutcomeLabel::Transient
                });
                Attempt::Failed {
                    reason,
                    retry_after,
                    hold,
                }
            }
            Verdict::Unreachable(reason) => {
                m.outcome(OutcomeLabel::Transient);
                tracing::warn!(message_id = %msg.id, reason = %reason, "handler unreachable; pausing receives until it accepts connections");
                lease.unreachable = true;
                Attempt::Failed {
                    reason,
                    retry_after: None,
                    hold,
                }
            }
        }
    }
}

/// Why a message's S3 payload (`--s3-payloads`) is not at hand.
enum Payload {
    /// It can never be fetched (a malformed pointer, a missing object, over the cap).
    Poison(String),
    /// It may be fetched later.
    Transient(String),
    /// A copy of a message already handled: its object was deleted here after that one.
    Duplicate(String),
}

impl Processor {
    /// Why `msg` (what the handler would get) fails `--schema-file`; None when it passes or there
    /// is no schema. Checked before the idempotency claim: a body that can never be handled takes no key.
    fn schema_violation(&self, msg: &Message) -> Option<String> {
        self.schema.as_ref()?.violation(&msg.body)
    }

    /// The handler's view with the Extended Client payload of the message (or of `view`) fetched,
    /// under the message's heartbeat; Ok(None) when that is no pointer or `--s3-payloads` is off.
    async fn fetch_payload(
        &self,
        lease: &mut Lease,
        view: Option<&Message>,
    ) -> Result<Option<Message>, Payload> {
        let Some(s3) = &self.s3 else { return Ok(None) };
        let ptr = match super::s3::pointer_of(view.unwrap_or(&lease.msg)) {
            None => return Ok(None),
            Some(Ok(ptr)) => ptr,
            Some(Err(reason)) => return Err(Payload::Poison(reason)),
        };
        let deadline = Instant::now() + self.timeout;
        let got = lease
            .beat
            .until(self, &lease.msg, deadline, Box::pin(s3.fetch(&ptr)))
            .await;
        match got {
            Some(Ok(payload)) => {
                let v = super::s3::view_with(view.unwrap_or(&lease.msg), payload);
                lease.s3_payload = Some(ptr);
                Ok(Some(v))
            }
            Some(Err(super::s3::FetchError::Poison(reason))) => Err(Payload::Poison(reason)),
            Some(Err(super::s3::FetchError::Transient(reason))) => Err(Payload::Transient(reason)),
            Some(Err(super::s3::FetchError::Duplicate(reason))) => Err(Payload::Duplicate(reason)),
            None => Err(Payload::Transient(format!(
                "fetching the S3 payload {ptr} timed out"
            ))),
        }
    }
}

/// What a message is at the breaker's gate: held when a call for it failed in this receive, else
/// fresh (with what makes it a good witness for a probe).
pub fn gate_kind(failed_before: bool, msg: &Message) -> Kind {
    if failed_before {
        Kind::Held
    } else {
        Kind::Fresh {
            first_receive: msg.receive_count <= 1,
            sent_ms: msg.sent_timestamp.unwrap_or(0),
        }
    }
}

/// For a redelivered message, how long ago SQS first delivered it (None on its first receive).
fn first_received(msg: &Message) -> Option<Duration> {
    if msg.receive_count <= 1 {
        return None;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // Without the attribute (an endpoint that omits it): as if received at the start of time, so
    // any success since counts against the dependency being down.
    let first = Duration::from_millis(msg.first_receive_timestamp.unwrap_or(0));
    Some(now.saturating_sub(first))
}

/// What one handler call's verdict tells the outage breaker.
pub fn breaker_outcome(verdict: &Verdict, first_received: Option<Duration>) -> Outcome {
    match verdict {
        Verdict::Success => Outcome::Success,
        Verdict::Poison(_)
        | Verdict::Transient {
            cause: Cause::Other,
            ..
        } => Outcome::Neutral,
        Verdict::Transient {
            cause: Cause::Unavailable,
            retry_after,
            ..
        } => Outcome::Overloaded(*retry_after),
        Verdict::Transient {
            cause: Cause::Downstream,
            ..
        }
        | Verdict::Unreachable(_) => Outcome::Failure { first_received },
    }
}

/// How one handler call ended, for `process`.
enum Attempt {
    /// The message is settled (deleted, dead-lettered, hidden, backed off).
    Ended(Ended),
    /// A transient failure: hold it for the breaker's probe (`hold`), or back it off.
    Failed {
        reason: String,
        retry_after: Option<Duration>,
        hold: bool,
    },
}

async fn store_call<'a, F, Fut>(
    p: &'a Processor,
    f: F,
) -> Result<(), super::idempotency::IdempotencyError>
where
    F: FnOnce(&'a Store) -> Fut,
    Fut: std::future::Future<Output = Result<(), super::idempotency::IdempotencyError>>,
{
    match &p.store {
        Some(s) => Box::pin(f(s)).await,
        None => Ok(()),
    }
}
