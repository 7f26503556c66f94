//! Batched heartbeats. Each message keeps its own schedule (its `Beat` in `message.rs`, run inside
//! its task); when a beat falls due, its visibility extension is handed to this coalescer, which sends
//! the extensions falling due together in one ChangeMessageVisibilityBatch (at most 10 entries) and
//! answers each message with its own outcome.
//!
//! Safety rules (docs/decisions.md, "Batched heartbeats"):
//! - a batch is flushed after a short window or at 10 entries, and never later than the earliest
//!   member's lease end minus the margin;
//! - the call's deadline is the earliest member's lease left minus the margin (the rule of the single
//!   call, applied to the batch), so one slow call cannot outlive any member's lease;
//! - per-entry failures are answered per message; a whole-call "invalid receipt handle/parameter"
//!   answer for several entries is re-sent entry by entry, so one bad entry cannot stop its
//!   batch-mates' heartbeats;
//! - a message whose task is gone (its reply dropped) is left out of the call.
//!
//! Cadences are aligned on a grid of an eighth of the interval (rounded down, so a beat is only ever
//! earlier than its interval): messages received together share every beat, and messages received
//! apart within one grid step join the same beats.
//!
//! Extensions grow (`Plan`, docs/decisions.md "Growing heartbeat extensions"): the first is the
//! visibility timeout, each later one twice the one before, up to the cap; the next beat falls due
//! at the same fraction of the new lease as the interval is of the visibility timeout, so the slack
//! before a lease ends grows with it. Members of one call made the same number of extensions
//! (received together), so they get the same extension and keep one cadence.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::batcher::MAX_BATCH;
use super::core::backoff::{visibility_secs, within_twelve_hours};
use super::metrics::Metrics;
use super::sqs::{Action, Entry, EntryFailure, ErrorKind, Sqs, SqsError, classify_code};

/// Longest a due extension waits for others to join its call.
pub const WINDOW: Duration = Duration::from_millis(10);
/// Grid steps per heartbeat interval.
const GRID_STEPS: u32 = 8;
/// Shortest deadline given to a heartbeat call (a lease nearly over still gets a real attempt).
pub const MIN_CALL: Duration = Duration::from_millis(200);

/// Longest heartbeat extension: after a crash, no message stays hidden longer than this (or its
/// handler timeout, or the visibility timeout if that is longer).
pub const MAX_EXTENSION: Duration = Duration::from_mins(15);

/// The heartbeat's extensions and cadence: pure, so the schedule is tested without clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The queue's VisibilityTimeout: the first extension.
    pub vt: Duration,
    /// The configured heartbeat interval: the first beat's delay after the receive.
    pub interval: Duration,
    /// The longest extension: `max(vt, min(handler timeout, MAX_EXTENSION))`.
    pub cap: Duration,
}

impl Plan {
    pub fn new(vt: Duration, interval: Duration, timeout: Duration) -> Plan {
        Plan {
            vt,
            interval,
            cap: timeout.min(MAX_EXTENSION).max(vt),
        }
    }

    /// The extension after `made` successful ones, `since_receipt` after the message was received:
    /// `vt × 2^made`, at most `cap`, and within SQS's 12 hours of visibility since the receive (a
    /// longer value is refused, not shortened). None: the 12 hours are (nearly) used up, no
    /// extension is possible any more.
    pub fn extension(&self, made: u32, since_receipt: Duration) -> Option<Duration> {
        let grown = self
            .vt
            .checked_mul(1u32 << made.min(20))
            .unwrap_or(Duration::MAX)
            .min(self.cap)
            .max(self.vt);
        let ext = within_twelve_hours(grown, since_receipt);
        (ext >= Duration::from_secs(1)).then_some(ext)
    }

    /// From an extension's start to the next beat: the same fraction of `extension` as the interval
    /// is of the visibility timeout (the interval itself for an extension of one timeout).
    pub fn gap(&self, extension: Duration) -> Duration {
        if self.vt.is_zero() {
            return self.interval;
        }
        self.interval
            .mul_f64(extension.as_secs_f64() / self.vt.as_secs_f64())
    }
}

/// Room a visibility change keeps before the lease ends: a quarter of the visibility timeout, at most
/// 5 s. A call still unanswered then is given up, so a retry can still land inside the lease.
pub fn lease_margin(vt: Duration) -> Duration {
    (vt / 4).min(Duration::from_secs(5))
}

/// `t` rounded down onto the grid of step `step` that starts at `origin` (never later than `t`).
pub fn align(origin: Instant, step: Duration, t: Instant) -> Instant {
    if step.is_zero() || t <= origin {
        return t;
    }
    let since = t - origin;
    let steps = since.as_nanos() / step.as_nanos();
    let back = since.saturating_sub(step.saturating_mul(u32::try_from(steps).unwrap_or(u32::MAX)));
    t - back
}

/// The next beat of the members of a call started at `started`, answered at `now`: the grid point
/// at or before `started + interval` (the same for every member); if that is not a grid step
/// after `now` (a call that took nearly an interval), the one at or before `now + interval`.
pub fn next_after(
    origin: Instant,
    step: Duration,
    started: Instant,
    now: Instant,
    interval: Duration,
) -> Instant {
    let next = align(origin, step, started + interval);
    if next > now + step {
        next
    } else {
        align(origin, step, now + interval)
    }
}

/// When a pending batch must go out: `at`, or earlier so it still leaves `margin` before the end
/// of the member's lease `lease_until`.
pub fn flush_by(at: Instant, lease_until: Option<Instant>, margin: Duration) -> Instant {
    match lease_until.and_then(|l| l.checked_sub(margin)) {
        Some(latest) => at.min(latest),
        None => at,
    }
}

/// The deadline of a call started at `started`: the earliest member's lease left minus `margin`,
/// at least `MIN_CALL`.
pub fn call_limit(
    started: Instant,
    leases: impl IntoIterator<Item = Option<Instant>>,
    margin: Duration,
) -> Duration {
    leases
        .into_iter()
        .flatten()
        .map(|l| l.saturating_duration_since(started).saturating_sub(margin))
        .min()
        .unwrap_or(margin)
        .max(MIN_CALL)
}

/// Failures a retry cannot fix for this receipt handle: its heartbeats stop.
pub fn lease_lost(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::InvalidReceiptHandle | ErrorKind::InvalidParameter
    )
}

/// The error of one failed entry of a batch answer.
pub fn entry_error(f: &EntryFailure) -> SqsError {
    SqsError {
        action: Action::ChangeMessageVisibilityBatch,
        kind: classify_code(&f.code).unwrap_or(ErrorKind::Other),
        detail: format!("{}: {}", f.code, f.message),
    }
}

/// What a message hears back: the time the call carrying its extension was sent (the lease runs
/// from then), or why it failed.
pub type Outcome = Result<Instant, SqsError>;

struct Request {
    entry: Entry,
    /// The extension, whole seconds.
    secs: i32,
    reply: oneshot::Sender<Outcome>,
}

/// Handle to the coalescer; cheap to clone.
#[derive(Clone)]
pub struct Heartbeats {
    tx: mpsc::UnboundedSender<Request>,
    origin: Instant,
    step: Duration,
    plan: Plan,
}

impl Heartbeats {
    /// Starts the coalescer for the extensions of `plan`.
    pub fn spawn(sqs: Sqs, metrics: Arc<Metrics>, plan: Plan) -> Heartbeats {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(sqs, metrics, plan.vt, rx));
        Heartbeats {
            tx,
            origin: Instant::now(),
            step: plan.interval / GRID_STEPS,
            plan,
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// `t` rounded down onto the shared cadence grid.
    pub fn align(&self, t: Instant) -> Instant {
        align(self.origin, self.step, t)
    }

    /// The next beat after a call started at `started`: `gap` on, on the grid, so every member of
    /// the call keeps the same cadence; if the call took nearly that long, `gap` after now (still on
    /// the grid).
    pub fn next_after(&self, started: Instant, gap: Duration) -> Instant {
        next_after(self.origin, self.step, started, Instant::now(), gap)
    }

    /// Extends one message's visibility to `extension` from the call's start, batched with others
    /// due now.
    pub async fn extend(&self, entry: Entry, extension: Duration) -> Outcome {
        let (reply, answer) = oneshot::channel();
        let message_id = entry.message_id.clone();
        let secs = visibility_secs(extension);
        if self.tx.send(Request { entry, secs, reply }).is_err() {
            return Err(closed(&message_id));
        }
        answer.await.unwrap_or_else(|_| Err(closed(&message_id)))
    }
}

fn closed(message_id: &str) -> SqsError {
    SqsError {
        action: Action::ChangeMessageVisibilityBatch,
        kind: ErrorKind::Other,
        detail: format!("heartbeat scheduler stopped before extending {message_id}"),
    }
}

async fn run(
    sqs: Sqs,
    metrics: Arc<Metrics>,
    vt: Duration,
    mut rx: mpsc::UnboundedReceiver<Request>,
) {
    let margin = lease_margin(vt);
    let mut pending: Vec<Request> = Vec::with_capacity(MAX_BATCH);
    let mut deadline = Instant::now();
    loop {
        tokio::select! {
            r = rx.recv() => match r {
                Some(r) => {
                    if pending.is_empty() {
                        deadline = Instant::now() + WINDOW;
                    }
                    deadline = flush_by(deadline, r.entry.lease_until.map(Instant::from_std), margin);
                    pending.push(r);
                    if pending.len() < MAX_BATCH {
                        continue;
                    }
                }
                None => break,
            },
            () = tokio::time::sleep_until(deadline), if !pending.is_empty() => {}
        }
        let batch = std::mem::replace(&mut pending, Vec::with_capacity(MAX_BATCH));
        tokio::spawn(send(sqs.clone(), metrics.clone(), margin, batch));
    }
    if !pending.is_empty() {
        send(sqs, metrics, margin, pending).await;
    }
}

/// One ChangeMessageVisibilityBatch for `batch`; every member is answered.
async fn send(sqs: Sqs, metrics: Arc<Metrics>, margin: Duration, batch: Vec<Request>) {
    // A message whose task ended (aborted at the shutdown deadline) is not extended any more.
    let batch: Vec<Request> = batch.into_iter().filter(|r| !r.reply.is_closed()).collect();
    if batch.is_empty() {
        return;
    }
    let entries: Vec<Entry> = batch.iter().map(|r| r.entry.clone()).collect();
    let secs: Vec<i32> = batch.iter().map(|r| r.secs).collect();
    let started = Instant::now();
    let limit = call_limit(
        started,
        entries.iter().map(|e| e.lease_until.map(Instant::from_std)),
        margin,
    );
    metrics.heartbeat_calls.inc();
    match sqs
        .change_visibility_batch_within(&entries, &secs, limit)
        .await
    {
        Ok(failures) => {
            let mut outcomes: Vec<Outcome> = vec![Ok(started); batch.len()];
            for f in &failures {
                if let Some(o) = outcomes.get_mut(f.index) {
                    *o = Err(entry_error(f));
                }
            }
            for (r, o) in batch.into_iter().zip(outcomes) {
                let _ = r.reply.send(o);
            }
        }
        Err(e) if lease_lost(e.kind) && batch.len() > 1 => {
            // The whole call refused: which entry is at fault is unknown, so each goes alone
            // (within what is left of the deadline) and only the one at fault loses its lease.
            tracing::warn!(reason = e.kind.reason(), error = %e.detail, entries = batch.len(), "heartbeat batch refused as a whole; sending its entries one by one");
            let left = limit.saturating_sub(started.elapsed()).max(MIN_CALL);
            let solo = batch.into_iter().map(|r| {
                let sqs = sqs.clone();
                let metrics = metrics.clone();
                async move {
                    let started = Instant::now();
                    metrics.heartbeat_calls.inc();
                    let outcome = match sqs
                        .change_visibility_batch_within(
                            std::slice::from_ref(&r.entry),
                            &[r.secs],
                            left,
                        )
                        .await
                    {
                        Ok(failures) => match failures.first() {
                            Some(f) => Err(entry_error(f)),
                            None => Ok(started),
                        },
                        Err(e) => Err(e),
                    };
                    let _ = r.reply.send(outcome);
                }
            });
            futures::future::join_all(solo).await;
        }
        Err(e) => {
            for r in batch {
                let _ = r.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::core::backoff::VISIBILITY_MAX;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_grid_only_ever_moves_a_beat_earlier_and_by_less_than_a_step() {
        let origin = Instant::now();
        let step = MS(125);
        for ms in [0u64, 1, 124, 125, 126, 999, 1000, 12_345] {
            let t = origin + MS(ms);
            let a = align(origin, step, t);
            assert!(a <= t, "{ms}");
            assert!(t - a < step, "{ms}");
            assert_eq!((a - origin).as_nanos() % step.as_nanos(), 0, "{ms}");
        }
        // Two messages received 40 ms apart share the beat of their grid step.
        let a = align(origin, step, origin + MS(1010));
        let b = align(origin, step, origin + MS(1050));
        assert_eq!(a, b);
        assert_eq!(
            align(origin, Duration::ZERO, origin + MS(7)),
            origin + MS(7)
        );
    }

    #[test]
    fn members_of_one_call_keep_one_cadence() {
        let origin = Instant::now();
        let step = MS(125);
        let interval = MS(1000);
        let started = origin + MS(3010);
        // Answered 20 ms or 60 ms later: the same next beat, on the grid, an interval after the call.
        let a = next_after(origin, step, started, started + MS(20), interval);
        let b = next_after(origin, step, started, started + MS(60), interval);
        assert_eq!(a, b);
        assert_eq!(a, origin + MS(4000));
        // A call that took 950 ms: one interval after its answer instead of at once.
        let slow = next_after(origin, step, started, started + MS(950), interval);
        assert_eq!(slow, origin + MS(4875));
        assert!(slow > started + MS(950));
    }

    #[test]
    fn a_batch_goes_out_before_the_earliest_lease_runs_into_its_margin() {
        let now = Instant::now();
        let at = now + WINDOW;
        let margin = MS(500);
        assert_eq!(flush_by(at, None, margin), at);
        assert_eq!(
            flush_by(at, Some(now + Duration::from_secs(10)), margin),
            at
        );
        // A member whose lease ends 505 ms from now forces the flush 5 ms from now.
        assert_eq!(flush_by(at, Some(now + MS(505)), margin), now + MS(5));
        assert!(flush_by(at, Some(now + MS(100)), margin) <= now);
    }

    #[test]
    fn the_call_deadline_is_the_earliest_members_lease_left_minus_the_margin() {
        let now = Instant::now();
        let margin = MS(750);
        let long = Some(now + Duration::from_secs(3));
        let short = Some(now + Duration::from_secs(1));
        assert_eq!(call_limit(now, [long], margin), MS(2250));
        assert_eq!(call_limit(now, [long, short, long], margin), MS(250));
        // Nearly lapsed: still one real attempt.
        assert_eq!(
            call_limit(now, [long, Some(now + MS(100))], margin),
            MIN_CALL
        );
        assert_eq!(call_limit(now, [None], margin), margin);
    }

    #[test]
    fn per_entry_codes_decide_whether_the_lease_is_lost() {
        let f = |code: &str| EntryFailure {
            index: 0,
            code: code.to_string(),
            sender_fault: true,
            message: "m".into(),
        };
        for code in [
            "ReceiptHandleIsInvalid",
            "MessageNotInflight",
            "InvalidParameterValue",
        ] {
            assert!(lease_lost(entry_error(&f(code)).kind), "{code}");
        }
        for code in ["InternalError", "ThrottlingException", "SomethingNew"] {
            assert!(!lease_lost(entry_error(&f(code)).kind), "{code}");
        }
        assert!(
            entry_error(&f("MessageNotInflight"))
                .detail
                .contains("MessageNotInflight")
        );
    }

    #[test]
    fn extensions_double_up_to_the_cap_and_the_next_beat_keeps_the_fraction() {
        let s = Duration::from_secs;
        // VT 30 s, interval auto (10 s), handler timeout 10 min.
        let plan = Plan::new(s(30), s(10), s(600));
        let made: Vec<u64> = (0..8)
            .map(|k| plan.extension(k, s(0)).unwrap().as_secs())
            .collect();
        assert_eq!(made, [30, 60, 120, 240, 480, 600, 600, 600]);
        assert_eq!(plan.gap(s(30)), s(10), "the first gap is the interval");
        assert_eq!(
            plan.gap(s(120)),
            s(40),
            "a third of the lease, as the interval is of VT"
        );
        assert_eq!(plan.extension(u32::MAX, s(0)), Some(s(600)));
        // The cap: the handler timeout, at most 15 minutes, never below the visibility timeout.
        assert_eq!(Plan::new(s(30), s(10), s(7200)).cap, MAX_EXTENSION);
        assert_eq!(Plan::new(s(30), s(10), s(5)).cap, s(30));
        assert_eq!(
            Plan::new(s(30), s(10), s(5)).extension(6, s(0)),
            Some(s(30)),
            "a timeout below VT: no growth"
        );
    }

    #[test]
    fn extensions_stay_inside_sqs_twelve_hours_since_the_receive() {
        let s = Duration::from_secs;
        let plan = Plan::new(s(300), s(100), s(13 * 3600));
        assert_eq!(plan.extension(9, s(3600)), Some(MAX_EXTENSION));
        // 5 minutes left of the 12 hours: 4 minutes (a minute kept clear), not the full 15.
        assert_eq!(
            plan.extension(9, VISIBILITY_MAX.checked_sub(s(300)).unwrap()),
            Some(s(240))
        );
        assert_eq!(
            plan.extension(0, VISIBILITY_MAX.checked_sub(s(61)).unwrap()),
            Some(s(1))
        );
        assert_eq!(
            plan.extension(0, VISIBILITY_MAX.checked_sub(s(60)).unwrap()),
            None
        );
        assert_eq!(plan.extension(0, VISIBILITY_MAX + s(1)), None);
    }

    /// The schedule with instant calls: a handler of 3 × VT at the default interval needs 4
    /// extensions (VT, 2 VT, 4 VT, 8 VT at VT/3, 2 VT/3, 4 VT/3, 8 VT/3) instead of 9; at every moment the
    /// lease left covers at least VT − interval (the slack of the fixed schedule) and at most
    /// max(VT, VT/interval × the time since the receive): what a crash costs.
    #[test]
    fn a_long_handler_needs_few_extensions_and_a_crash_costs_a_bounded_wait() {
        let ms = Duration::from_millis;
        let vt = ms(3000);
        for (interval, handler, want) in [
            (ms(1000), ms(9000), 4),
            (ms(1000), ms(18_000), 5),
            (ms(1500), ms(9000), 3),
        ] {
            let plan = Plan::new(vt, interval, ms(60_000));
            let ratio = vt.as_secs_f64() / interval.as_secs_f64();
            let (mut beat, mut lease_end, mut made) = (interval, vt, 0u32);
            let mut t = ms(0);
            while t < handler {
                if t >= beat {
                    let e = plan.extension(made, beat).unwrap();
                    made += 1;
                    lease_end = beat + e;
                    beat += plan.gap(e);
                }
                let left = lease_end.checked_sub(t).unwrap();
                assert!(
                    left >= vt.checked_sub(interval).unwrap(),
                    "{interval:?} at {t:?}: {left:?} left"
                );
                let bound = vt.max(t.mul_f64(ratio));
                assert!(left <= bound, "{interval:?} at {t:?}: {left:?} > {bound:?}");
                t += ms(10);
            }
            assert_eq!(made, want, "{interval:?}, handler {handler:?}");
        }
    }

    #[test]
    fn margin_is_a_quarter_of_the_visibility_timeout_at_most_5s() {
        assert_eq!(lease_margin(Duration::from_secs(3)), MS(750));
        assert_eq!(lease_margin(Duration::from_mins(1)), Duration::from_secs(5));
    }
}
