//! Batch mode (`--batch-max-items` > 1): several messages, one handler call. Each message keeps its
//! own lease, heartbeat, idempotency claim and retry schedule; only the call is shared.
//!
//! How a message could be lost or handled twice here, and what prevents it:
//! - a message is deleted only when the call answered and did not name it as failed (a timeout, a
//!   5xx, a malformed answer retry every item);
//! - every lease is extended in the background for the whole call, and each is taken back (its
//!   beat in flight awaited) before its delete or visibility change, so no beat lands after them;
//! - FIFO: items of a group after one that stays on the queue are not deleted, whatever the answer
//!   said (they come back after it), and a group whose earlier item ended before the call (hidden,
//!   backed off) does not go into the call at all.

use std::collections::HashSet;

use futures::future::join_all;
use tokio::time::Instant;

use super::{Ended, Lease, Payload, Processor, STOP_BACKSTOP, breaker_outcome};
use crate::worker::breaker::{Denied, Kind, Outcome, Pass};
use crate::worker::core::fate::Happened;
use crate::worker::handler::{BatchVerdict, Cause, Verdict};
use crate::worker::idempotency::{IdempotencyError, key_of, payload_hash};
use crate::worker::metrics::OutcomeLabel;
use crate::worker::sqs::Message;

/// Why an item is released unhandled when an earlier one of its FIFO group stays on the queue.
const GROUP_STOPPED: &str = "an earlier message of its FIFO group stays on the queue";

/// One message of the batch still headed for the call.
struct Item {
    /// Its place in the batch as given (results come back in that order).
    at: usize,
    lease: Lease,
    /// What the handler gets when not the message itself (an unwrapped SNS notification).
    view: Option<Message>,
    /// Our idempotency claim: key and token.
    claim: Option<(String, String)>,
}

impl Processor {
    /// Runs `leases` through one handler call (fewer if some end before it: known poison, a lost
    /// lease, a duplicate, a key in progress elsewhere). Returns how each ended, in the given order,
    /// with its FIFO group.
    pub async fn process_batch(&self, leases: Vec<Lease>) -> Vec<(Option<String>, Ended)> {
        let fifo = self.confirm_deletes;
        let mut results: Vec<(Option<String>, Option<Ended>)> = leases
            .iter()
            .map(|l| (l.msg.group_id.clone(), None))
            .collect();
        // FIFO groups of which an item stays on the queue: their later items must not run ahead.
        let mut stopped: HashSet<String> = HashSet::new();
        let mut items = Vec::with_capacity(leases.len());
        let mut leases = leases;
        // Kept alive by one shared task while waiting for a FIFO call slot: taken back at once.
        Lease::beat_inline_all(&mut leases.iter_mut().collect::<Vec<_>>()).await;
        if let Some(spans) = &self.spans {
            for m in leases.iter().filter_map(|l| l.span.as_ref()) {
                spans.waited(m);
            }
        }
        for (at, mut lease) in leases.into_iter().enumerate() {
            if let Some(ended) = self.before_call(&mut lease, fifo, &stopped).await {
                stop_group(&mut stopped, fifo, &lease, ended);
                results[at].1 = Some(ended);
                continue;
            }
            let view = match crate::worker::sns::unwrap(self.unwrap_sns, &lease.msg) {
                Ok(view) => view,
                Err(reason) => {
                    self.metrics.outcome(OutcomeLabel::Poison);
                    let ended = self
                        .settle(&mut lease, Happened::Poison(reason.clone()), &reason)
                        .await;
                    stop_group(&mut stopped, fifo, &lease, ended);
                    results[at].1 = Some(ended);
                    continue;
                }
            };
            let view = match self.fetch_payload_item(&mut lease, view).await {
                Ok(view) => view,
                Err(ended) => {
                    stop_group(&mut stopped, fifo, &lease, ended);
                    results[at].1 = Some(ended);
                    continue;
                }
            };
            if let Some(reason) = self.schema_violation(view.as_ref().unwrap_or(&lease.msg)) {
                self.metrics.outcome(OutcomeLabel::Poison);
                let ended = self
                    .settle(&mut lease, Happened::Poison(reason.clone()), &reason)
                    .await;
                stop_group(&mut stopped, fifo, &lease, ended);
                results[at].1 = Some(ended);
                continue;
            }
            items.push(Item {
                at,
                lease,
                view,
                claim: None,
            });
        }

        let mut failed_before = false;
        while !items.is_empty() {
            Lease::beat_together(items.iter_mut().map(|i| &mut i.lease));
            let Some(pass) = self
                .batch_gate(&mut items, failed_before, &mut results)
                .await
            else {
                break;
            };
            self.claim_all(&mut items, fifo, &mut stopped, &mut results)
                .await;
            if items.is_empty() {
                // The pass goes back unused (dropped: counted neutral).
                break;
            }
            let (verdicts, hold) = self.call(&mut items, pass).await;
            Lease::beat_inline_all(&mut items.iter_mut().map(|i| &mut i.lease).collect::<Vec<_>>())
                .await;
            // A failed call while the breaker holds: keep the items for its next probe (their
            // claims were given up) instead of spending their receives.
            let whole_failed = verdicts.iter().all(|v| !matches!(v, Verdict::Success));
            if whole_failed && hold && !verdicts.is_empty() {
                failed_before = true;
                // Claims are given up while held and taken again before the next call (a hold may
                // outlast a claim that is no longer renewed).
                if let Some(store) = &self.store {
                    for item in &mut items {
                        if let Some((key, token)) = item.claim.take()
                            && let Err(e) = store.abandon(&key, &token).await
                        {
                            self.metrics.idempotency_errors.inc();
                            tracing::warn!(message_id = %item.lease.msg.id, key = %key, error = %e, "cannot give up the idempotency claim");
                        }
                    }
                }
                for _ in &items {
                    self.metrics.breaker_holds.inc();
                }
                tracing::info!(
                    items = items.len(),
                    "batch failed while the breaker is open; holding its messages for the next probe instead of handing them back"
                );
                continue;
            }
            self.end_items(
                std::mem::take(&mut items),
                verdicts,
                fifo,
                &mut stopped,
                &mut results,
            )
            .await;
        }
        results
            .into_iter()
            .map(|(g, e)| (g, e.unwrap_or(Ended::Kept)))
            .collect()
    }

    /// Batch mode's S3 payloads (`--s3-payloads`): fetched per item before the call (under the
    /// item's heartbeat); a missing or oversized object is poison, an S3 failure backs the item off.
    async fn fetch_payload_item(
        &self,
        lease: &mut Lease,
        view: Option<Message>,
    ) -> Result<Option<Message>, Ended> {
        match self.fetch_payload(lease, view.as_ref()).await {
            Ok(None) => Ok(view),
            Ok(Some(v)) => Ok(Some(v)),
            Err(Payload::Poison(reason)) => {
                self.metrics.outcome(OutcomeLabel::Poison);
                Err(self
                    .settle(lease, Happened::Poison(reason.clone()), &reason)
                    .await)
            }
            Err(Payload::Duplicate(reason)) => {
                self.metrics.outcome(OutcomeLabel::Duplicate);
                tracing::info!(message_id = %lease.msg.id, reason = %reason, "a copy of a message already handled; deleting it without calling the handler");
                Err(self.settle(lease, Happened::KeyDone, &reason).await)
            }
            Err(Payload::Transient(reason)) => {
                self.metrics.outcome(OutcomeLabel::Transient);
                let failed = Happened::Failed {
                    retry_after: None,
                    hold: false,
                };
                Err(self.settle(lease, failed, &reason).await)
            }
        }
    }

    /// What ends a message before any call: a lost lease, or a message already judged poison here.
    async fn before_call(
        &self,
        lease: &mut Lease,
        fifo: bool,
        stopped: &HashSet<String>,
    ) -> Option<Ended> {
        if lease.beat.lost {
            return Some(self.settle(lease, Happened::LeaseLost, "").await);
        }
        if fifo
            && let Some(g) = &lease.msg.group_id
            && stopped.contains(g)
        {
            return Some(
                self.settle(lease, Happened::NotStarted, GROUP_STOPPED)
                    .await,
            );
        }
        if let Some(ended) = self.end_filtered(lease).await {
            return Some(ended);
        }
        if let Some(ended) = self.end_known_poison(lease).await {
            return Some(ended);
        }
        None
    }

    /// The breaker's gate, once for the whole batch: at once while it is closed, else waiting
    /// (every lease extended in the background) for a probe or slow-start slot, at most as long as
    /// the batch's shortest hold allows. None when the items were settled instead.
    async fn batch_gate<'a>(
        &'a self,
        items: &mut Vec<Item>,
        failed_before: bool,
        results: &mut [(Option<String>, Option<Ended>)],
    ) -> Option<Pass<'a>> {
        if let Some(pass) = self.breaker.try_pass() {
            return Some(pass);
        }
        let deadline = items
            .iter()
            .map(|i| self.hold_deadline(&i.lease))
            .min()
            .unwrap_or_else(Instant::now);
        // The batch is as good a witness as its best item.
        let kind = items
            .iter()
            .map(|i| super::gate_kind(failed_before, &i.lease.msg))
            .max_by_key(|k| match k {
                Kind::Held => None,
                Kind::Fresh {
                    first_receive,
                    sent_ms,
                } => Some((*first_receive, *sent_ms)),
            })
            .unwrap_or(Kind::Held);
        let admitted = tokio::time::timeout_at(deadline, self.breaker.admit(kind)).await;
        let why = match admitted {
            Ok(Ok(pass)) => return Some(pass),
            Ok(Err(Denied::ShuttingDown)) => None,
            Ok(Err(_)) => Some("the breaker has been open longer than the outage tolerance"),
            Err(_) => Some("held as long as the batch's leases allow"),
        };
        let (happened, why) = match why {
            None => (
                Happened::NotStarted,
                "shutting down while the breaker is open",
            ),
            Some(why) => (Happened::GateGaveUp { failed_before }, why),
        };
        for mut item in items.drain(..) {
            let ended = self.settle(&mut item.lease, happened.clone(), why).await;
            results[item.at].1 = Some(ended);
        }
        None
    }

    /// Takes the idempotency claim of every item (with a store): a key already done is deleted
    /// without a call, one in progress elsewhere hidden until that claim ends, and a store that does
    /// not answer backs the item off (and pauses receives).
    async fn claim_all(
        &self,
        items: &mut Vec<Item>,
        fifo: bool,
        stopped: &mut HashSet<String>,
        results: &mut [(Option<String>, Option<Ended>)],
    ) {
        let Some(store) = &self.store else { return };
        let m = &self.metrics;
        let mut kept = Vec::with_capacity(items.len());
        for mut item in items.drain(..) {
            if fifo
                && let Some(g) = &item.lease.msg.group_id
                && stopped.contains(g)
            {
                let ended = self
                    .settle(&mut item.lease, Happened::NotStarted, GROUP_STOPPED)
                    .await;
                results[item.at].1 = Some(ended);
                continue;
            }
            if item.claim.is_some() {
                kept.push(item);
                continue;
            }
            let key = match key_of(&self.key, item.view.as_ref().unwrap_or(&item.lease.msg)) {
                Ok(key) => key,
                Err(e) => {
                    m.idempotency_key_missing.inc();
                    tracing::warn!(message_id = %item.lease.msg.id, key_source = %self.key, error = %e, "no idempotency key; handling the message without de-duplication");
                    kept.push(item);
                    continue;
                }
            };
            let hash = payload_hash(&item.view.as_ref().unwrap_or(&item.lease.msg).body);
            let claimed = tokio::time::timeout(
                self.claim_lease(),
                store.claim(&key, self.claim_lease(), &hash),
            )
            .await
            .unwrap_or(Err(IdempotencyError::TimedOut));
            let ended = match self.claim_outcome(&mut item.lease, &key, claimed).await {
                Ok(token) => {
                    item.claim = Some((key, token));
                    kept.push(item);
                    continue;
                }
                Err(ended) => ended,
            };
            stop_group(stopped, fifo, &item.lease, ended);
            results[item.at].1 = Some(ended);
        }
        // A FIFO item claimed before a later-stopped earlier one of its group gives its claim back.
        let mut out = Vec::with_capacity(kept.len());
        for mut item in kept {
            if fifo
                && let Some(g) = &item.lease.msg.group_id
                && stopped.contains(g)
            {
                if let Some((key, token)) = item.claim.take() {
                    let _ = store.abandon(&key, &token).await;
                }
                let ended = self
                    .settle(&mut item.lease, Happened::NotStarted, GROUP_STOPPED)
                    .await;
                results[item.at].1 = Some(ended);
                continue;
            }
            out.push(item);
        }
        *items = out;
    }

    /// The handler call for the items (their leases extended in the background meanwhile, their
    /// claims renewed), its outcome recorded with the breaker and each claim completed or given up
    /// by what will happen to the message. Returns each item's verdict, in order, and whether the items are to be held for the breaker's next probe.
    async fn call(&self, items: &mut [Item], pass: Pass<'_>) -> (Vec<Verdict>, bool) {
        let m = &self.metrics;
        let started = Instant::now();
        let now = super::super::metrics::now_ms();
        for item in items.iter() {
            if let Some(age) =
                super::super::metrics::age_seconds(item.lease.msg.sent_timestamp, now)
            {
                m.wait_seconds.observe(age);
            }
        }
        let deadline = started + self.timeout;
        // Tracing on: a `qc.handle` span per item (the call they share), each item's traceparent its own.
        let handles: Vec<Option<super::super::spans::Child>> = items
            .iter_mut()
            .map(|item| {
                let span = self
                    .spans
                    .as_ref()
                    .zip(item.lease.span.as_ref())
                    .map(|(s, m)| s.handle(m))?;
                let tp = Some(span.traceparent());
                match item.view.as_mut() {
                    Some(view) => view.handler_traceparent = tp,
                    None => item.lease.msg.handler_traceparent = tp,
                }
                Some(span)
            })
            .collect();
        let msgs: Vec<&Message> = items
            .iter()
            .map(|i| i.view.as_ref().unwrap_or(&i.lease.msg))
            .collect();
        let claims: Vec<(&str, &str)> = items
            .iter()
            .filter_map(|i| i.claim.as_ref().map(|(k, t)| (k.as_str(), t.as_str())))
            .collect();
        let call = self.handler.handle_batch(&msgs, deadline);
        // The handler stops itself at the deadline; the backstop bounds a call that does not.
        let answered = match &self.store {
            Some(store) if !claims.is_empty() => {
                tokio::select! {
                    out = tokio::time::timeout_at(deadline + STOP_BACKSTOP, call) => out.ok().flatten(),
                    never = self.renew_claims(store, &claims, deadline) => match never {},
                }
            }
            _ => tokio::time::timeout_at(deadline + STOP_BACKSTOP, call)
                .await
                .ok()
                .flatten(),
        };
        let latency = started.elapsed();
        m.handler_seconds.observe(latency.as_secs_f64());
        m.batch_items.observe(items.len() as f64);
        for item in items.iter_mut() {
            item.lease.latency = Some(latency);
        }
        let n = items.len();
        let answered_items = matches!(answered, Some(BatchVerdict::Items { .. }));
        let (verdicts, outcome_label, breaker): (Vec<Verdict>, Option<OutcomeLabel>, Verdict) =
            match answered {
                None => {
                    let v = Verdict::Transient {
                        reason: format!(
                            "batch handler timed out after {}",
                            crate::api::Duration::from_std(self.timeout)
                        ),
                        retry_after: None,
                        cause: Cause::Downstream,
                    };
                    (vec![v.clone(); n], Some(OutcomeLabel::Timeout), v)
                }
                Some(BatchVerdict::Whole(v)) => (vec![v.clone(); n], None, v),
                Some(BatchVerdict::Items { failed }) => {
                    let listed = Verdict::Transient {
                        reason: "named in the batch answer's batchItemFailures".into(),
                        retry_after: None,
                        cause: Cause::Other,
                    };
                    let verdicts: Vec<Verdict> = (0..n)
                        .map(|i| {
                            if failed.contains(&i) {
                                listed.clone()
                            } else {
                                Verdict::Success
                            }
                        })
                        .collect();
                    // The dependency answered for the batch: a success unless every item failed
                    // (which says nothing certain of it: neutral).
                    let breaker = if failed.len() < n {
                        Verdict::Success
                    } else {
                        listed
                    };
                    (verdicts, None, breaker)
                }
            };
        if let (false, Verdict::Transient { reason, .. } | Verdict::Unreachable(reason)) =
            (answered_items, &breaker)
        {
            tracing::warn!(items = n, reason = %reason, "batch handler call failed; every item is retried");
        }
        let first = items.first().and_then(|i| i.lease.first_failed());
        let hold = pass.record(match (&breaker, outcome_label) {
            (_, Some(OutcomeLabel::Timeout)) => Outcome::Failure {
                first_received: first,
            },
            _ => breaker_outcome(&breaker, first),
        });
        for (item, v) in items.iter_mut().zip(&verdicts) {
            if !matches!(v, Verdict::Success | Verdict::Poison(_)) {
                item.lease.failed_at.get_or_insert_with(Instant::now);
            }
        }
        let timed_out = outcome_label == Some(OutcomeLabel::Timeout);
        for (span, v) in handles.into_iter().zip(&verdicts) {
            if let Some(span) = span {
                span.end_handle(v, timed_out);
            }
        }
        for v in &verdicts {
            m.outcome(match (v, outcome_label) {
                (Verdict::Success, _) => OutcomeLabel::Success,
                (_, Some(label)) => label,
                _ => OutcomeLabel::Transient,
            });
        }
        (verdicts, hold)
    }

    /// Ends each called item by its verdict: successes deleted, failures retried (a handler's
    /// Retry-After up to `--retry-max`). Standard queues: all at once. FIFO: one at a time in the
    /// group's order, each delete confirmed before the next item ends, so an item after one of its
    /// group that stays on the queue (it failed, or its delete did) is released to come back after
    /// it, whatever its verdict, and never deleted ahead of it.
    async fn end_items(
        &self,
        items: Vec<Item>,
        verdicts: Vec<Verdict>,
        fifo: bool,
        stopped: &mut HashSet<String>,
        results: &mut [(Option<String>, Option<Ended>)],
    ) {
        if !fifo {
            let ended = join_all(
                items
                    .into_iter()
                    .zip(verdicts)
                    .map(|(item, verdict)| self.end_item(item, verdict, false)),
            )
            .await;
            for (at, ended) in ended {
                results[at].1 = Some(ended);
            }
            return;
        }
        for (item, verdict) in items.into_iter().zip(verdicts) {
            let group = item.lease.msg.group_id.clone();
            let behind = group.as_ref().is_some_and(|g| stopped.contains(g));
            let (at, ended) = self.end_item(item, verdict, behind).await;
            if ended == Ended::Kept
                && let Some(g) = group
            {
                stopped.insert(g);
            }
            results[at].1 = Some(ended);
        }
    }

    /// Ends one called item: records its idempotency claim (completed only when it is to be
    /// deleted) and settles it. `behind`: an earlier item of its FIFO group stays on the queue.
    async fn end_item(&self, mut item: Item, verdict: Verdict, behind: bool) -> (usize, Ended) {
        let (happened, reason) = match verdict {
            // Handled, but behind one of its group that stays: back in order after it.
            _ if behind => (
                Happened::NotStarted,
                "an earlier message of its FIFO group stays on the queue; it comes back after it"
                    .to_string(),
            ),
            Verdict::Success => (Happened::Succeeded, String::new()),
            Verdict::Transient {
                reason,
                retry_after,
                ..
            } => (
                Happened::Failed {
                    retry_after,
                    hold: false,
                },
                reason,
            ),
            Verdict::Unreachable(reason) => {
                item.lease.unreachable = true;
                (
                    Happened::Failed {
                        retry_after: None,
                        hold: false,
                    },
                    reason,
                )
            }
            // A batch answer names failed items; a whole-batch poison answer is a retry
            // (`BatchVerdict::whole`): no item of a call is poison by itself.
            Verdict::Poison(reason) => (
                Happened::Failed {
                    retry_after: None,
                    hold: false,
                },
                reason,
            ),
        };
        if let Some((key, token)) = item.claim.take() {
            let recorded = match &self.store {
                Some(s) if happened == Happened::Succeeded => {
                    let hash = payload_hash(&item.view.as_ref().unwrap_or(&item.lease.msg).body);
                    s.complete(&key, self.idempotency_ttl, &hash).await
                }
                Some(s) => s.abandon(&key, &token).await,
                None => Ok(()),
            };
            if let Err(e) = recorded {
                self.metrics.idempotency_errors.inc();
                tracing::warn!(message_id = %item.lease.msg.id, key = %key, error = %e, "cannot record the idempotency result");
            }
        }
        let ended = self.settle(&mut item.lease, happened, &reason).await;
        (item.at, ended)
    }
}

/// FIFO: a message that stays on the queue stops its group for the rest of the batch.
fn stop_group(stopped: &mut HashSet<String>, fifo: bool, lease: &Lease, ended: Ended) {
    if fifo
        && ended == Ended::Kept
        && let Some(g) = &lease.msg.group_id
    {
        stopped.insert(g.clone());
    }
}
