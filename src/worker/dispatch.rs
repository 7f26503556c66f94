//! The receive loop. At most `concurrency` messages run at once. With heartbeats on (standard
//! queues), one more batch may wait locally, kept alive by heartbeats: the next receive is then in
//! flight before slots free up, and a busy queue is received in whole batches. That next whole batch
//! is asked for while a few messages still wait (as many as slots take during a receive's round
//! trip, at most half a batch or, with more slots, one message a slot in all), so slots that free meanwhile find it already there; not once handlers
//! take longer than the heartbeat interval on average (a waiting message would cost heartbeats and
//! be kept from other consumers for a whole handler time). Without heartbeats the worker receives
//! only into free slots. FIFO groups run in order, one chain per MessageGroupId.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::core::backoff::error_backoff;
use super::core::plan::{self, Fill, Gate, Held, Measured, Next, Receiving};
use super::message::{Ended, Freed, Lease, Processor};
use super::metrics::Readiness;
use super::rate::{Grant, Limiter};
use super::sqs::{Message, SqsError};

pub struct Settings {
    pub concurrency: usize,
    pub batch_size: usize,
    pub wait_time: Duration,
    pub fifo: bool,
    /// Messages that may wait locally for a slot (0: receive only into free slots).
    pub prefetch: usize,
    /// With `prefetch`: the most messages that may still wait when the next whole batch is asked
    /// for (`worker::early_receive_max`); the held total stays within concurrency + prefetch + this.
    pub early_max: usize,
    /// The heartbeat interval (None: heartbeats off): the waiting batch is kept only while
    /// `worker::prefetch_pays` says so for the measured handler time and round trip.
    pub heartbeat: Option<Duration>,
    /// From the shutdown signal until handlers still running are abandoned (released).
    pub drain_budget: Duration,
    /// Batch mode (`--batch-max-items` > 1): messages go to the handler in calls of up to this many.
    pub batch: Option<BatchSettings>,
    /// `processing.maxRate`: this pod's share in messages per second (`worker::rate`); None: unlimited.
    pub rate: Option<tokio::sync::watch::Receiver<f64>>,
}

impl Settings {
    /// The planner's view of these settings.
    fn shape(&self) -> plan::Shape {
        plan::Shape {
            concurrency: self.concurrency,
            batch_size: self.batch_size,
            fifo: self.fifo,
            prefetch: self.prefetch,
            early_max: self.early_max,
            heartbeat: self.heartbeat,
            calls: self.batch.map(|b| plan::Calls {
                max_items: b.max_items,
                prefetch_calls: b.prefetch_calls,
            }),
        }
    }
}

/// Batch mode: `concurrency` counts handler calls, each with up to `max_items` messages.
#[derive(Clone, Copy, Debug)]
pub struct BatchSettings {
    pub max_items: usize,
    /// A call starts once `max_items` wait or the oldest has waited this long.
    pub max_wait: Duration,
    /// The most calls' worth of messages received ahead while calls run
    /// (`worker::batch_prefetch_calls`), held only while prefetch pays.
    pub prefetch_calls: usize,
}

/// Pending messages of each FIFO group that has a chain running, in queue order.
type Groups = Arc<Mutex<HashMap<String, VecDeque<Lease>>>>;

/// A receive's answer and how long it took.
type ReceiveResult = (Result<Vec<Message>, SqsError>, Duration);

pub struct Dispatcher {
    processor: Arc<Processor>,
    settings: Settings,
    freed: mpsc::UnboundedReceiver<Freed>,
}

impl Dispatcher {
    pub fn new(
        processor: Arc<Processor>,
        settings: Settings,
        freed: mpsc::UnboundedReceiver<Freed>,
    ) -> Self {
        Dispatcher {
            processor,
            settings,
            freed,
        }
    }

    /// Consumes until `shutdown` completes, then drains: in-flight messages finish, messages received
    /// afterwards are released. Returns once nothing is in flight or the drain budget is spent.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let p = self.processor.clone();
        let metrics = p.metrics.clone();
        let s = &self.settings;
        let mut prefetching = false;

        let groups: Groups = Arc::new(Mutex::new(HashMap::new()));
        // FIFO batch mode: the calls running at once, across groups.
        let calls = Arc::new(tokio::sync::Semaphore::new(s.concurrency));
        let mut tasks: JoinSet<()> = JoinSet::new();
        let mut receives: JoinSet<ReceiveResult> = JoinSet::new();
        let mut asked: HashMap<tokio::task::Id, usize> = HashMap::new();
        let mut ready = metrics.readiness() == Readiness::Ready;
        // Received and not finished: running plus waiting.
        let mut in_flight = 0usize;
        let mut waiting: VecDeque<Lease> = VecDeque::new();
        let mut reserved = 0usize;
        let mut last_empty = false;
        let mut errors = 0u32;
        let mut backoff_until: Option<Instant> = None;
        let mut fill_at: Option<Instant> = None;
        let mut fill_ready = false;
        let mut latency_ewma: Option<f64> = None;
        // Round trip of receives that found messages (an empty one may have long-polled).
        let mut receive_ewma: Option<f64> = None;
        let mut paused: Option<Pin<Box<dyn std::future::Future<Output = ()> + Send>>> = None;
        let mut draining = false;
        let mut drain_deadline = Instant::now();
        let mut breaker_state = p.breaker.subscribe();
        // maxRate: a receive takes its messages' tokens before it goes out (`worker::rate`).
        let mut limiter = s
            .rate
            .clone()
            .map(|share| Limiter::new(share, s.batch_size, metrics.clone(), Instant::now()));
        let mut rate_wake: Option<Instant>;
        let shape = s.shape();

        loop {
            // What may be held and how receives go out: `core::plan`, from what is measured and held.
            let measured = Measured {
                handler: latency_ewma.and_then(|l| Duration::try_from_secs_f64(l).ok()),
                round_trip: receive_ewma.and_then(|r| Duration::try_from_secs_f64(r).ok()),
            };
            let gate = match p.breaker.cap() {
                None => Gate::Closed,
                Some(0) if p.breaker.wants_message(Instant::now(), in_flight) => Gate::WantsFresh,
                Some(n) => Gate::Slots(n),
            };
            let plan = plan::plan(
                &shape,
                measured,
                held(in_flight, &waiting, &tasks, reserved),
                gate,
            );
            if shape.may_prefetch() && prefetching != plan.prefetching {
                prefetching = plan.prefetching;
                tracing::info!(
                    mean_handler_ms = latency_ewma.map(|l| (l * 1000.0) as u64),
                    receive_round_trip_ms = receive_ewma.map(|r| (r * 1000.0) as u64),
                    "{}",
                    if prefetching {
                        "a receive round trip is a noticeable share of a handler call: one batch may wait locally for a slot"
                    } else {
                        "handlers are long beside a receive round trip or the heartbeat interval: receiving only into free slots, no batch waits locally"
                    }
                );
            }
            // Open: messages waiting for a slot go to the breaker's gate, where they make no call
            // until admitted (its slow start keeps calls within the slots), so a probe can take them.
            if matches!(gate, Gate::Slots(0) | Gate::WantsFresh) && !waiting.is_empty() && !draining
            {
                if s.batch.is_some() {
                    start_batches(&p, &mut tasks, &mut waiting, s, usize::MAX);
                } else {
                    start_waiting(&p, &mut tasks, &mut waiting, in_flight, usize::MAX);
                }
            }
            rate_wake = None;
            if !draining && paused.is_none() && backoff_until.is_none() {
                loop {
                    let receiving = Receiving {
                        out: receives.len(),
                        last_empty,
                        fill: match (fill_at, fill_ready) {
                            (None, _) => Fill::Unset,
                            (Some(_), false) => Fill::Pending,
                            (Some(_), true) => Fill::Due,
                        },
                    };
                    let h = held(in_flight, &waiting, &tasks, reserved);
                    let want = match plan::next_receive(&plan, &shape, measured, h, receiving) {
                        Next::Hold => break,
                        Next::WaitToFill(wait) => {
                            fill_at = Some(Instant::now() + wait);
                            break;
                        }
                        Next::Receive(want) => want,
                    };
                    let want = match limiter.as_mut().map(|l| l.grant(want, Instant::now())) {
                        None => want,
                        Some(Grant::Take(n)) => n,
                        Some(Grant::At(at)) => {
                            rate_wake = Some(at);
                            break;
                        }
                    };
                    reserved += want;
                    fill_at = None;
                    fill_ready = false;
                    let sqs = p.sqs.clone();
                    let wait = s.wait_time;
                    let handle = receives.spawn(async move {
                        let sent = Instant::now();
                        let result = sqs.receive(want as u32, wait).await;
                        (result, sent.elapsed())
                    });
                    asked.insert(handle.id(), want);
                }
            }
            if draining && receives.is_empty() && in_flight == 0 {
                break;
            }
            // Waiting messages whose heartbeat falls due get a background one until they start.
            let beat_due = waiting.iter().filter_map(Lease::beat_due).min();
            // Batch mode: when the oldest waiting message's batch is due with fewer than a full one.
            let batch_due = match (s.batch, waiting.front()) {
                (Some(b), Some(l)) if tasks.len() < s.concurrency && !draining => {
                    Some(Instant::from_std(l.msg.received_at) + b.max_wait)
                }
                _ => None,
            };
            // Only a future instant: one already past is the waiters' to act on (or a probe
            // receive already asked for), and waking for it again would spin.
            let breaker_wake = if draining {
                None
            } else {
                p.breaker.next_wake().filter(|at| *at > Instant::now())
            };

            tokio::select! {
                () = &mut shutdown, if !draining => {
                    draining = true;
                    drain_deadline = Instant::now() + s.drain_budget;
                    metrics.set_readiness(Readiness::Draining);
                    // Messages held at the breaker's gate are released by their tasks.
                    p.breaker.shut_down();
                    tracing::info!(in_flight, receiving = receives.len(), "shutting down: no new receives, finishing in-flight messages");
                    // Messages waiting for a slot or behind their FIFO group have not started:
                    // release them now.
                    for lease in waiting.drain(..).chain(take_all(&groups)) {
                        lease.release().await;
                    }
                }
                Some(first) = self.freed.recv() => {
                    // Slots free up in bursts (a batch received together ends together): take
                    // every one already sent before deciding on receives again.
                    let mut next = Some(first);
                    while let Some(freed) = next {
                        in_flight = in_flight.saturating_sub(1);
                        if let Some(l) = freed.latency {
                            let l = l.as_secs_f64();
                            latency_ewma = Some(latency_ewma.map_or(l, |e| e * 0.8 + l * 0.2));
                        }
                        if freed.unreachable && paused.is_none() && !draining {
                            let p = p.clone();
                            metrics.set_readiness(Readiness::Failing(format!("handler unreachable ({})", p.handler.describe())));
                            ready = false;
                            paused = Some(Box::pin(async move { p.handler.wait_reachable().await }));
                        }
                        if freed.store_down && paused.is_none() && !draining {
                            let p = p.clone();
                            metrics.set_readiness(Readiness::Failing("idempotency store unreachable".into()));
                            ready = false;
                            paused = Some(Box::pin(async move { wait_store(&p).await }));
                        }
                        next = self.freed.try_recv().ok();
                    }
                    if paused.is_some() {
                        // Paused (handler or store down): waiting messages go back to the queue
                        // rather than fail one by one.
                        for lease in waiting.drain(..) {
                            lease.release().await;
                        }
                    }
                    start(&p, &mut tasks, &mut waiting, in_flight, s);
                }
                Some(joined) = receives.join_next_with_id(), if !receives.is_empty() => {
                    let (id, (result, took)) = match joined {
                        Ok(r) => r,
                        Err(e) => {
                            // Only a bug panics a receive task; its slots are given back.
                            tracing::error!(error = %e, "receive task failed");
                            let want = asked.remove(&e.id()).unwrap_or(0);
                            reserved -= want;
                            if let Some(l) = limiter.as_mut() {
                                l.refund(want, Instant::now());
                            }
                            continue;
                        }
                    };
                    let want = asked.remove(&id).unwrap_or(0);
                    reserved -= want;
                    if let Some(l) = limiter.as_mut() {
                        // Tokens of messages not received go back (all of them after an error).
                        let got = result.as_ref().map_or(0, Vec::len);
                        l.refund(want.saturating_sub(got), Instant::now());
                    }
                    match result {
                        Ok(messages) => {
                            let answered = messages.len();
                            // A copy of a message held here adds no lease (`worker::held`): copies
                            // are told apart before anything is handed back, so a release never
                            // makes a message visible that a lease here still holds.
                            let mut leases = p.admit(messages).await;
                            in_flight += leases.len();
                            if leases.len() > want {
                                // More than asked for (an odd endpoint): keep what the reserved
                                // slots hold, hand the rest back at once so in-flight never passes
                                // the capacity and nothing waits unheartbeated.
                                let extra = leases.split_off(want);
                                tracing::warn!(asked = want, answered, released = extra.len(), "receive answered more messages than asked for; releasing the extra ones");
                                for lease in extra {
                                    lease.release().await;
                                }
                            }
                            if errors > 0 {
                                tracing::info!(after_failures = errors, "receiving again");
                            }
                            if !ready && !draining && paused.is_none() {
                                metrics.set_readiness(Readiness::Ready);
                                ready = true;
                            }
                            errors = 0;
                            if answered > 0 {
                                let t = took.as_secs_f64();
                                receive_ewma = Some(receive_ewma.map_or(t, |e| e * 0.8 + t * 0.2));
                            }
                            metrics.received.add(answered as u64);
                            metrics.receive_sizes.observe(answered as f64);
                            tracing::debug!(asked = want, answered, in_flight, waiting = waiting.len(), "received");
                            last_empty = answered == 0;
                            if last_empty {
                                metrics.empty_receives.inc();
                                // Open and receiving to probe: the probe takes a held message.
                                p.breaker.nothing_received();
                            }
                            if draining {
                                for lease in leases {
                                    lease.release().await;
                                }
                            } else if s.fifo {
                                start_fifo(&p, &groups, &mut tasks, leases, s.batch.map(|b| (b.max_items, calls.clone())));
                            } else if paused.is_some() {
                                // Received just before the pause: back to the queue.
                                for lease in leases {
                                    lease.release().await;
                                }
                            } else {
                                waiting.extend(leases);
                                start(&p, &mut tasks, &mut waiting, in_flight, s);
                            }
                        }
                        Err(e) => {
                            errors = errors.saturating_add(1);
                            let delay = error_backoff(errors, fastrand::f64());
                            backoff_until = Some(Instant::now() + delay);
                            if e.kind.is_configuration() {
                                ready = false;
                                tracing::error!(reason = e.kind.reason(), error = %e.detail, hint = e.hint(), retry_in_ms = delay.as_millis() as u64, "cannot receive messages; not ready");
                                metrics.set_readiness(Readiness::Failing(format!("{}: {}", e.kind.reason(), e.hint())));
                            } else {
                                tracing::warn!(reason = e.kind.reason(), error = %e.detail, attempt = errors, retry_in_ms = delay.as_millis() as u64, "receive failed; backing off");
                            }
                        }
                    }
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {
                    while tasks.try_join_next().is_some() {}
                    // Batch mode: a call slot is free.
                    if s.batch.is_some() && !s.fifo && paused.is_none() && !draining {
                        start(&p, &mut tasks, &mut waiting, in_flight, s);
                    }
                }
                Ok(()) = breaker_state.changed() => {
                    // Opened, recovering or closed: the capacity above changes with it.
                }
                () = sleep_until_opt(breaker_wake), if breaker_wake.is_some() => {
                    // A probe falls due (a message to probe with may be needed) or the outage
                    // tolerance ends.
                    p.breaker.tick(Instant::now());
                }
                () = sleep_until_opt(rate_wake), if rate_wake.is_some() => {
                    // The rate's tokens for the next receive are there.
                }
                () = async { if let Some(l) = limiter.as_mut() { l.changed().await } }, if limiter.is_some() => {
                    // A new share: the next receive is paced by it.
                }
                () = sleep_until_opt(fill_at), if fill_at.is_some() && !fill_ready => {
                    fill_ready = true;
                }
                () = sleep_until_opt(backoff_until), if backoff_until.is_some() => {
                    backoff_until = None;
                }
                () = sleep_until_opt(batch_due), if batch_due.is_some() => {
                    start_batches(&p, &mut tasks, &mut waiting, s, s.concurrency);
                }
                () = sleep_until_opt(beat_due), if beat_due.is_some() => {
                    for lease in &mut waiting {
                        lease.beat_in_background();
                    }
                }
                () = async { if let Some(f) = paused.as_mut() { f.await } }, if paused.is_some() => {
                    paused = None;
                    if !draining {
                        tracing::info!("receiving again");
                        metrics.set_readiness(Readiness::Ready);
                        ready = true;
                    }
                }
                () = tokio::time::sleep_until(drain_deadline), if draining => {
                    tracing::warn!(in_flight, receiving = receives.len(), "shutdown budget spent; abandoning handlers still running and releasing their messages");
                    receives.abort_all();
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    while receives.join_next().await.is_some() {}
                    drop(take_all(&groups));
                    waiting.clear();
                    break;
                }
            }
        }
    }
}

/// What the dispatcher holds, as the planner sees it.
fn held(in_flight: usize, waiting: &VecDeque<Lease>, tasks: &JoinSet<()>, reserved: usize) -> Held {
    Held {
        in_flight,
        waiting: waiting.len(),
        calls: tasks.len(),
        reserved,
    }
}

/// Returns once the idempotency store answers again, probing with backoff.
async fn wait_store(p: &Processor) {
    let Some(store) = &p.store else { return };
    let mut attempt = 0u32;
    loop {
        match store.ping().await {
            Ok(()) => {
                tracing::info!(after_attempts = attempt, "idempotency store answers again");
                return;
            }
            Err(e) => {
                attempt = attempt.saturating_add(1);
                let delay = error_backoff(attempt, fastrand::f64());
                tracing::error!(error = %e, attempt, retry_in_ms = delay.as_millis() as u64, "idempotency store unreachable; not receiving");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Starts what waits: one message a task, or in batch mode the batches that are due.
fn start(
    p: &Arc<Processor>,
    tasks: &mut JoinSet<()>,
    waiting: &mut VecDeque<Lease>,
    in_flight: usize,
    s: &Settings,
) {
    if s.batch.is_some() {
        start_batches(p, tasks, waiting, s, s.concurrency);
    } else {
        start_waiting(p, tasks, waiting, in_flight, s.concurrency);
    }
}

/// Batch mode: while fewer than `calls` calls run, starts a call with the oldest waiting messages
/// when a whole batch waits, or with what there is once the oldest has waited `max_wait`.
fn start_batches(
    p: &Arc<Processor>,
    tasks: &mut JoinSet<()>,
    waiting: &mut VecDeque<Lease>,
    s: &Settings,
    calls: usize,
) {
    let Some(b) = s.batch else { return };
    while tasks.len() < calls && !waiting.is_empty() {
        let oldest_due = waiting
            .front()
            .is_some_and(|l| l.msg.received_at.elapsed() >= b.max_wait);
        if waiting.len() < b.max_items && !oldest_due {
            break;
        }
        let n = waiting.len().min(b.max_items);
        let leases: Vec<Lease> = waiting.drain(..n).collect();
        let p = p.clone();
        tasks.spawn(Box::pin(async move {
            p.process_batch(leases).await;
        }));
    }
}

/// Starts waiting messages, oldest first, while fewer than `concurrency` run.
fn start_waiting(
    p: &Arc<Processor>,
    tasks: &mut JoinSet<()>,
    waiting: &mut VecDeque<Lease>,
    in_flight: usize,
    concurrency: usize,
) {
    let mut running = in_flight - waiting.len();
    while running < concurrency {
        let Some(lease) = waiting.pop_front() else {
            break;
        };
        running += 1;
        let p = p.clone();
        // Boxed: the message's future is large, and the runtime moves a task's future (and writes
        // its stage) by value; a box makes those moves a pointer's (perf showed them in memmove).
        tasks.spawn(Box::pin(async move {
            p.process(lease).await;
        }));
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn take_all(groups: &Groups) -> Vec<Lease> {
    match groups.lock() {
        Ok(mut g) => g.drain().flat_map(|(_, q)| q).collect(),
        Err(_) => Vec::new(),
    }
}

/// Queues each message behind its group; a group without a running chain gets one.
fn start_fifo(
    p: &Arc<Processor>,
    groups: &Groups,
    tasks: &mut JoinSet<()>,
    leases: Vec<Lease>,
    batch: Option<(usize, Arc<tokio::sync::Semaphore>)>,
) {
    let mut to_start = Vec::new();
    if let Ok(mut g) = groups.lock() {
        for lease in leases {
            let group = lease.msg.group_id.clone().unwrap_or_default();
            if let Some(queue) = g.get_mut(&group) {
                let mut lease = lease;
                lease.beat_in_background();
                queue.push_back(lease);
            } else {
                g.insert(group.clone(), VecDeque::new());
                to_start.push((group, lease));
            }
        }
    }
    for (group, first) in to_start {
        let p = p.clone();
        let groups = groups.clone();
        match &batch {
            Some((max_items, calls)) => {
                let calls = calls.clone();
                let max_items = *max_items;
                tasks.spawn(Box::pin(run_group_batches(
                    p, groups, group, first, max_items, calls,
                )));
            }
            None => {
                tasks.spawn(Box::pin(run_group(p, groups, group, first)));
            }
        }
    }
}

/// Handles a group's messages one after another; after one that stays on the queue, the rest of the
/// group is released so nothing runs ahead of it.
async fn run_group(p: Arc<Processor>, groups: Groups, group: String, first: Lease) {
    let mut next = Some(first);
    while let Some(lease) = next.take() {
        p.metrics
            .fifo_heads
            .started(&group, lease.msg.receive_count, lease.msg.sent_timestamp);
        let ended = p.process(lease).await;
        let mut stopped = Vec::new();
        if let Ok(mut g) = groups.lock() {
            match ended {
                Ended::Deleted => {
                    next = g
                        .get_mut(&group)
                        .and_then(std::collections::VecDeque::pop_front);
                    if next.is_none() {
                        g.remove(&group);
                        p.metrics.fifo_heads.done(&group);
                    }
                }
                Ended::Kept => {
                    if let Some(q) = g.remove(&group) {
                        stopped.extend(q);
                    }
                }
            }
        }
        if !stopped.is_empty() {
            tracing::info!(group = %group, released = stopped.len(), "group stopped by a failure; releasing its later messages");
        }
        for lease in stopped {
            lease.release().await;
        }
    }
}

/// Batch mode on a FIFO queue: the group's messages go to the handler in order, up to `max_items` a
/// call, one call of the group at a time (and at most `concurrency` calls across groups); after a
/// call in which one of them stays on the queue, the rest of the group is released.
async fn run_group_batches(
    p: Arc<Processor>,
    groups: Groups,
    group: String,
    first: Lease,
    max_items: usize,
    calls: Arc<tokio::sync::Semaphore>,
) {
    let mut batch = vec![first];
    loop {
        if let Ok(mut g) = groups.lock()
            && let Some(q) = g.get_mut(&group)
        {
            while batch.len() < max_items {
                match q.pop_front() {
                    Some(l) => batch.push(l),
                    None => break,
                }
            }
        }
        // Waiting for a call slot: every lease kept alive meanwhile.
        Lease::beat_together(batch.iter_mut());
        let Ok(_permit) = calls.acquire().await else {
            return;
        };
        // The group's head for qc_worker_fifo_group_head_*: the call's first item, and after the call
        // the first item that stayed on the queue (it comes back first), as single mode reports them.
        let heads: Vec<(u32, Option<u64>)> = batch
            .iter()
            .map(|l| (l.msg.receive_count, l.msg.sent_timestamp))
            .collect();
        if let Some(&(rc, sent)) = heads.first() {
            p.metrics.fifo_heads.started(&group, rc, sent);
        }
        let ended = p.process_batch(std::mem::take(&mut batch)).await;
        let first_kept = ended.iter().position(|(_, e)| *e == Ended::Kept);
        let kept = first_kept.is_some();
        if let Some(&(rc, sent)) = first_kept.and_then(|i| heads.get(i)) {
            p.metrics.fifo_heads.started(&group, rc, sent);
        }
        let mut stopped = Vec::new();
        if let Ok(mut g) = groups.lock() {
            if kept {
                if let Some(q) = g.remove(&group) {
                    stopped.extend(q);
                }
            } else if let Some(l) = g.get_mut(&group).and_then(VecDeque::pop_front) {
                batch.push(l);
            } else {
                g.remove(&group);
                p.metrics.fifo_heads.done(&group);
            }
        }
        if !stopped.is_empty() {
            tracing::info!(group = %group, released = stopped.len(), "group stopped by a failure; releasing its later messages");
        }
        for lease in stopped {
            lease.release().await;
        }
        if batch.is_empty() {
            return;
        }
    }
}
