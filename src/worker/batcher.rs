//! Batched acknowledgements: deletes (DeleteMessageBatch) and releases (visibility 0 via
//! ChangeMessageVisibilityBatch), flushed at 10 entries or after a short delay; failures are retried or logged.
//!
//! Releases wait the fixed interval. Deletes wait about as long as the recent pace of deletes takes
//! to fill a batch (between the interval and `MAX_DELETE_DELAY`), and never past `LEASE_MARGIN`
//! before the lease of any message in the batch ends.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::core::backoff::error_backoff;
use super::metrics::Metrics;
use super::sqs::{Entry, ErrorKind, Sqs};

/// SQS batch calls take at most 10 entries.
pub const MAX_BATCH: usize = 10;
/// Attempts per entry before it is logged as failed (the message will then be delivered again).
const ATTEMPTS: u32 = 5;
/// Flushes running at once; more would only queue inside the HTTP client.
const MAX_FLUSHES: usize = 16;
/// Longest wait for a batch of deletes to fill.
pub const MAX_DELETE_DELAY: Duration = Duration::from_millis(200);
/// A delete goes out at least this long before its message's lease ends.
pub const LEASE_MARGIN: Duration = Duration::from_secs(2);

/// When a batch whose first entry arrives now should be flushed: after `interval` for releases; for
/// deletes after the time the recent gap between deletes takes to fill the batch, a quarter more,
/// within [interval, MAX_DELETE_DELAY].
pub fn flush_delay(kind: Kind, interval: Duration, gap: Option<Duration>) -> Duration {
    match (kind, gap) {
        (Kind::Delete, Some(gap)) => gap
            .mul_f64((MAX_BATCH - 1) as f64 * 1.25)
            .clamp(interval, MAX_DELETE_DELAY.max(interval)),
        _ => interval,
    }
}

/// The flush time `at`, brought forward so the delete reaches SQS before the lease ends.
pub fn within_lease(at: Instant, lease_until: Option<std::time::Instant>) -> Instant {
    match lease_until {
        Some(l) => at.min(Instant::from_std(l).checked_sub(LEASE_MARGIN).unwrap_or(at)),
        None => at,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Delete,
    Release,
}

impl Kind {
    fn verb(self) -> &'static str {
        match self {
            Kind::Delete => "delete",
            Kind::Release => "release",
        }
    }
}

/// An entry and, if its sender waits for the outcome, where to say whether SQS confirmed it.
type Queued = (Entry, Option<oneshot::Sender<bool>>);

/// Sending side; cheap to clone.
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Queued>,
}

impl Batcher {
    /// Queues an entry, waiting if the batcher is backed up (back-pressure on the handlers).
    pub async fn send(&self, entry: Entry) {
        if let Err(mpsc::error::SendError((e, _))) = self.tx.send((entry, None)).await {
            tracing::error!(message_id = %e.message_id, "acknowledgement queue closed; the message will be delivered again");
        }
    }

    /// Queues an entry and waits until SQS has confirmed it (true) or it was given up (false), still
    /// batched with the others.
    pub async fn send_confirmed(&self, entry: Entry) -> bool {
        let (tx, rx) = oneshot::channel();
        if let Err(mpsc::error::SendError((e, _))) = self.tx.send((entry, Some(tx))).await {
            tracing::error!(message_id = %e.message_id, "acknowledgement queue closed; the message will be delivered again");
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// Queues without waiting (from Drop); a full queue means the message reappears after its lease.
    pub fn try_send(&self, entry: Entry) {
        if let Err(e) = self.tx.try_send((entry, None)) {
            let (entry, _) = match e {
                mpsc::error::TrySendError::Full(e) | mpsc::error::TrySendError::Closed(e) => e,
            };
            tracing::warn!(message_id = %entry.message_id, "cannot queue the release; the message reappears when its visibility timeout ends");
        }
    }
}

/// Runs a batcher until `close` flips to true and every queued entry is flushed.
pub fn spawn(
    sqs: Sqs,
    metrics: Arc<Metrics>,
    kind: Kind,
    interval: Duration,
    capacity: usize,
    close: watch::Receiver<bool>,
) -> (Batcher, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(capacity.max(MAX_BATCH));
    let task = tokio::spawn(run(sqs, metrics, kind, interval, rx, close));
    (Batcher { tx }, task)
}

async fn run(
    sqs: Sqs,
    metrics: Arc<Metrics>,
    kind: Kind,
    interval: Duration,
    mut rx: mpsc::Receiver<Queued>,
    mut close: watch::Receiver<bool>,
) {
    let limit = Arc::new(Semaphore::new(MAX_FLUSHES));
    let mut flushes = JoinSet::new();
    let mut buf: Vec<Queued> = Vec::with_capacity(MAX_BATCH);
    let mut deadline = Instant::now();
    // Mean gap between entries (exponentially weighted), from the last arrival.
    let mut gap: Option<Duration> = None;
    let mut last: Option<Instant> = None;
    let mut closing = *close.borrow();
    loop {
        if closing {
            // Producers are done: take what is left without waiting.
            while let Ok(e) = rx.try_recv() {
                buf.push(e);
                if buf.len() == MAX_BATCH {
                    flush(&sqs, &metrics, kind, &limit, &mut flushes, &mut buf).await;
                }
            }
            break;
        }
        tokio::select! {
            e = rx.recv() => match e {
                Some(e) => {
                    let now = Instant::now();
                    if let Some(l) = last {
                        let g = now - l;
                        gap = Some(gap.map_or(g, |m| m.mul_f64(0.8) + g.mul_f64(0.2)));
                    }
                    last = Some(now);
                    if buf.is_empty() {
                        deadline = now + flush_delay(kind, interval, gap);
                    }
                    deadline = within_lease(deadline, e.0.lease_until);
                    buf.push(e);
                    if buf.len() < MAX_BATCH {
                        continue;
                    }
                }
                None => break,
            },
            () = tokio::time::sleep_until(deadline), if !buf.is_empty() => {}
            changed = close.changed() => {
                closing = changed.is_err() || *close.borrow();
                continue;
            }
            Some(_) = flushes.join_next(), if !flushes.is_empty() => continue,
        }
        flush(&sqs, &metrics, kind, &limit, &mut flushes, &mut buf).await;
    }
    if !buf.is_empty() {
        flush(&sqs, &metrics, kind, &limit, &mut flushes, &mut buf).await;
    }
    while flushes.join_next().await.is_some() {}
}

async fn flush(
    sqs: &Sqs,
    metrics: &Arc<Metrics>,
    kind: Kind,
    limit: &Arc<Semaphore>,
    flushes: &mut JoinSet<()>,
    buf: &mut Vec<Queued>,
) {
    if buf.is_empty() {
        return;
    }
    let (entries, confirms): (Vec<Entry>, Vec<_>) =
        std::mem::replace(buf, Vec::with_capacity(MAX_BATCH))
            .into_iter()
            .unzip();
    let Ok(permit) = limit.clone().acquire_owned().await else {
        return;
    };
    let sqs = sqs.clone();
    let metrics = metrics.clone();
    flushes.spawn(async move {
        let ids: Vec<String> = entries.iter().map(|e| e.message_id.clone()).collect();
        let failed = send_with_retries(&sqs, &metrics, kind, entries).await;
        drop(permit);
        for (id, confirm) in ids.iter().zip(confirms) {
            if let Some(c) = confirm {
                let _ = c.send(!failed.contains(id));
            }
        }
    });
}

/// Sends one batch; entries that fail for a retryable reason are sent again, the rest are logged.
/// Returns the message ids given up.
async fn send_with_retries(
    sqs: &Sqs,
    metrics: &Metrics,
    kind: Kind,
    mut entries: Vec<Entry>,
) -> Vec<String> {
    let mut failed = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let result = match kind {
            Kind::Delete => sqs.delete_batch(&entries).await,
            Kind::Release => sqs.change_visibility_batch(&entries, 0).await,
        };
        match result {
            Ok(failures) => {
                // At most one failure per entry (sqs::batch_failures), so this never underflows.
                let ok = entries.len().saturating_sub(failures.len());
                match kind {
                    Kind::Delete => metrics.deleted.add(ok as u64),
                    Kind::Release => metrics.released.add(ok as u64),
                }
                let mut retry = Vec::new();
                for f in failures {
                    let Some(entry) = entries.get(f.index) else {
                        continue;
                    };
                    if f.sender_fault || attempt == ATTEMPTS {
                        give_up(metrics, kind, entry, &f.code, &f.message);
                        failed.push(entry.message_id.clone());
                    } else {
                        retry.push(entry.clone());
                    }
                }
                if retry.is_empty() {
                    return failed;
                }
                entries = retry;
            }
            Err(e) => {
                let fatal = matches!(
                    e.kind,
                    ErrorKind::InvalidParameter | ErrorKind::InvalidReceiptHandle
                );
                if fatal || attempt == ATTEMPTS {
                    for entry in &entries {
                        give_up(metrics, kind, entry, e.kind.reason(), &e.detail);
                        failed.push(entry.message_id.clone());
                    }
                    return failed;
                }
                tracing::warn!(action = e.action.as_str(), reason = e.kind.reason(), error = %e.detail, attempt, entries = entries.len(), "batch {} failed; retrying", kind.verb());
            }
        }
        tokio::time::sleep(error_backoff(attempt, fastrand::f64())).await;
    }
    failed
}

fn give_up(metrics: &Metrics, kind: Kind, entry: &Entry, code: &str, detail: &str) {
    match kind {
        Kind::Delete => {
            metrics.delete_failures.inc();
            tracing::error!(message_id = %entry.message_id, code, error = detail, "delete failed; the message will be delivered again");
        }
        Kind::Release => {
            tracing::warn!(message_id = %entry.message_id, code, error = detail, "release failed; the message reappears when its visibility timeout ends");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn deletes_wait_for_the_pace_to_fill_a_batch_within_bounds() {
        let i = MS(20);
        assert_eq!(flush_delay(Kind::Delete, i, None), i, "no pace yet");
        // 10 ms between deletes: nine more take 90 ms, plus a quarter.
        assert_eq!(
            flush_delay(Kind::Delete, i, Some(MS(10))),
            MS(112) + Duration::from_micros(500)
        );
        assert_eq!(
            flush_delay(Kind::Delete, i, Some(MS(1))),
            i,
            "busy: the interval"
        );
        assert_eq!(
            flush_delay(Kind::Delete, i, Some(MS(500))),
            MAX_DELETE_DELAY
        );
        assert_eq!(
            flush_delay(Kind::Release, i, Some(MS(10))),
            i,
            "releases never wait longer"
        );
    }

    #[test]
    fn a_flush_never_waits_into_the_end_of_a_lease() {
        let now = Instant::now();
        let at = now + MS(200);
        assert_eq!(within_lease(at, None), at);
        let far = (now + Duration::from_secs(30)).into_std();
        assert_eq!(within_lease(at, Some(far)), at);
        let close = (now + Duration::from_secs(2) + MS(50)).into_std();
        assert_eq!(within_lease(at, Some(close)), now + MS(50));
        let lapsing = (now + Duration::from_secs(1)).into_std();
        assert!(within_lease(at, Some(lapsing)) <= now, "due at once");
    }
}
