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

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::backoff::visibility_secs;
use super::batcher::MAX_BATCH;
use super::metrics::Metrics;
use super::sqs::{Action, Entry, EntryFailure, ErrorKind, Sqs, SqsError, classify_code};

/// Longest a due extension waits for others to join its call.
pub const WINDOW: Duration = Duration::from_millis(10);
/// Grid steps per heartbeat interval.
const GRID_STEPS: u32 = 8;
/// Shortest deadline given to a heartbeat call (a lease nearly over still gets a real attempt).
pub const MIN_CALL: Duration = Duration::from_millis(200);

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
    reply: oneshot::Sender<Outcome>,
}

/// Handle to the coalescer; cheap to clone.
#[derive(Clone)]
pub struct Heartbeats {
    tx: mpsc::UnboundedSender<Request>,
    origin: Instant,
    step: Duration,
}

impl Heartbeats {
    /// Starts the coalescer for extensions to `vt` every `interval`.
    pub fn spawn(sqs: Sqs, metrics: Arc<Metrics>, vt: Duration, interval: Duration) -> Heartbeats {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(sqs, metrics, vt, rx));
        Heartbeats {
            tx,
            origin: Instant::now(),
            step: interval / GRID_STEPS,
        }
    }

    /// `t` rounded down onto the shared cadence grid.
    pub fn align(&self, t: Instant) -> Instant {
        align(self.origin, self.step, t)
    }

    /// The next beat after a call started at `started`: one interval on, on the grid, so every
    /// member of the call keeps the same cadence; if the call took nearly an interval, one interval
    /// after now (still on the grid). Never later than `started + interval`'s lease allows.
    pub fn next_after(&self, started: Instant, interval: Duration) -> Instant {
        next_after(self.origin, self.step, started, Instant::now(), interval)
    }

    /// Extends one message's visibility to the visibility timeout, batched with others due now.
    pub async fn extend(&self, entry: Entry) -> Outcome {
        let (reply, answer) = oneshot::channel();
        let message_id = entry.message_id.clone();
        if self.tx.send(Request { entry, reply }).is_err() {
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
    let secs = visibility_secs(vt);
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
            _ = tokio::time::sleep_until(deadline), if !pending.is_empty() => {}
        }
        let batch = std::mem::replace(&mut pending, Vec::with_capacity(MAX_BATCH));
        tokio::spawn(send(sqs.clone(), metrics.clone(), secs, margin, batch));
    }
    if !pending.is_empty() {
        send(sqs, metrics, secs, margin, pending).await;
    }
}

/// One ChangeMessageVisibilityBatch for `batch`; every member is answered.
async fn send(sqs: Sqs, metrics: Arc<Metrics>, secs: i32, margin: Duration, batch: Vec<Request>) {
    // A message whose task ended (aborted at the shutdown deadline) is not extended any more.
    let batch: Vec<Request> = batch.into_iter().filter(|r| !r.reply.is_closed()).collect();
    if batch.is_empty() {
        return;
    }
    let entries: Vec<Entry> = batch.iter().map(|r| r.entry.clone()).collect();
    let started = Instant::now();
    let limit = call_limit(
        started,
        entries.iter().map(|e| e.lease_until.map(Instant::from_std)),
        margin,
    );
    metrics.heartbeat_calls.inc();
    match sqs
        .change_visibility_batch_within(&entries, secs, limit)
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
                        .change_visibility_batch_within(std::slice::from_ref(&r.entry), secs, left)
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
    fn margin_is_a_quarter_of_the_visibility_timeout_at_most_5s() {
        assert_eq!(lease_margin(Duration::from_secs(3)), MS(750));
        assert_eq!(
            lease_margin(Duration::from_secs(60)),
            Duration::from_secs(5)
        );
    }
}
