//! Dead-letter queue triage against SQS: peek at a DLQ without consuming it (receive with a short
//! visibility, then release everything at once with ChangeMessageVisibility 0; never a delete), and
//! what a selective redrive would move (`--dry-run`). The summary itself is pure (crate::triage).
//!
//! The cost of a peek: every receive adds one to each peeked message's ApproximateReceiveCount on the
//! DLQ. That matters only when the DLQ has a redrive policy of its own (its maxReceiveCount then moves
//! a message peeked that often on to the DLQ's DLQ): [`Route::dlq_max_receive_count`] says so.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::MessageSystemAttributeName;

use crate::aws::redrive::{
    self, MoveOptions, RedriveError, Route, is_ours, now_ms, peeked, release,
};
use crate::triage::{Peeked, Selector};

/// How long a peeked message stays hidden if its release fails: short, so a failed release delays
/// the workers (of a DLQ nobody consumes, usually) by this at most.
pub const PEEK_VISIBILITY_SECS: i32 = 30;
/// A peek stops receiving after this long, so every message is released well before its peek
/// visibility ends (a message visible again mid-peek would be seen twice; it is counted once).
pub const PEEK_BUDGET: Duration = Duration::from_secs(20);
/// Messages peeked at most, by default.
pub const DEFAULT_PEEK_MAX: u64 = 1000;

/// What a peek saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peek {
    /// Each message once, in receive order.
    pub messages: Vec<Peeked>,
    /// True when a receive found nothing more: every visible message was seen. False when `max` or
    /// the time budget ended the peek first.
    pub complete: bool,
    /// Messages whose release failed: visible again by themselves after [`PEEK_VISIBILITY_SECS`].
    pub not_released: u64,
}

/// Peek at up to `max` messages of `dlq_url`: receive (10 at a time, 1 s long poll,
/// [`PEEK_VISIBILITY_SECS`]), keep what triage needs, then release every received message at once
/// (also when a receive fails). Never deletes.
pub async fn peek(
    client: &aws_sdk_sqs::Client,
    dlq_url: &str,
    max: u64,
) -> Result<Peek, RedriveError> {
    let mut held: HashMap<String, String> = HashMap::new();
    let mut messages = Vec::new();
    let result = receive_all(client, dlq_url, max, &mut held, &mut messages).await;
    let receipts: Vec<String> = held.into_values().collect();
    let not_released = release(client, dlq_url, &receipts).await;
    let complete = result?;
    Ok(Peek {
        messages,
        complete,
        not_released,
    })
}

async fn receive_all(
    client: &aws_sdk_sqs::Client,
    dlq_url: &str,
    max: u64,
    held: &mut HashMap<String, String>,
    messages: &mut Vec<Peeked>,
) -> Result<bool, RedriveError> {
    let started = Instant::now();
    loop {
        let seen = messages.len() as u64;
        if seen >= max || started.elapsed() >= PEEK_BUDGET {
            return Ok(false);
        }
        let want = (max - seen).min(10);
        let got = client
            .receive_message()
            .queue_url(dlq_url)
            .max_number_of_messages(i32::try_from(want).unwrap_or(10))
            .wait_time_seconds(1)
            .visibility_timeout(PEEK_VISIBILITY_SECS)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| redrive::call_error("ReceiveMessage", dlq_url, &e, redrive::IAM_HINT))?
            .messages
            .unwrap_or_default();
        if got.is_empty() {
            return Ok(true);
        }
        let mut fresh = false;
        for m in &got {
            let (Some(p), Some(receipt)) = (peeked(m), m.receipt_handle()) else {
                continue;
            };
            // A message handed twice: its newest receipt is the one to release.
            if held.insert(p.id.clone(), receipt.to_string()).is_none() {
                fresh = true;
                messages.push(p);
            }
        }
        if !fresh {
            return Ok(true);
        }
    }
}

/// What a selective redrive would move, and what it would leave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DryRun {
    pub route: Route,
    /// This source's selected messages: they would move to `route.source_url`.
    pub would_move: Vec<Peeked>,
    /// This source's messages the selection leaves.
    pub not_selected: u64,
    /// Messages of other source queues (or naming none, in a DLQ not known to be this queue's
    /// alone): a redrive of this queue never moves them.
    pub other_sources: u64,
    pub complete: bool,
    pub not_released: u64,
}

/// Where each peeked message would go under `opts` (pure): (would move, not selected, other sources).
pub fn plan_move(peeked: &[Peeked], opts: &MoveOptions, now_ms: u64) -> (Vec<Peeked>, u64, u64) {
    let mut would = Vec::new();
    let (mut not_selected, mut other) = (0, 0);
    for p in peeked {
        if !is_ours(opts, p.source.as_deref()) {
            other += 1;
        } else if opts.select.selects(p, now_ms) {
            would.push(p.clone());
        } else {
            not_selected += 1;
        }
    }
    (would, not_selected, other)
}

/// Peek at the DLQ of `source_url` and say what [`redrive::redrive_selected`] with `select` would
/// move, without moving anything.
pub async fn dry_run(
    client: &aws_sdk_sqs::Client,
    source_url: &str,
    max: u64,
    select: &Selector,
) -> Result<DryRun, RedriveError> {
    let route = redrive::route(client, source_url).await?;
    let move_unmarked = match redrive::dead_letter_sources(client, &route.dlq_url).await {
        Ok(sources) => redrive::sole_source(&sources, source_url),
        Err(_) => false,
    };
    let opts = MoveOptions {
        max: None,
        rate: 1,
        token: String::new(),
        source_arn: Some(route.source_arn.clone()).filter(|a| !a.is_empty()),
        move_unmarked,
        select: select.clone(),
        mark: false,
    };
    let peek = peek(client, &route.dlq_url, max).await?;
    let (would_move, not_selected, other_sources) = plan_move(&peek.messages, &opts, now_ms());
    Ok(DryRun {
        route,
        would_move,
        not_selected,
        other_sources,
        complete: peek.complete,
        not_released: peek.not_released,
    })
}

/// Peek at the DLQ of `source_url`: its route and what was seen.
pub async fn peek_source(
    client: &aws_sdk_sqs::Client,
    source_url: &str,
    max: u64,
) -> Result<(Route, Peek), RedriveError> {
    let route = redrive::route(client, source_url).await?;
    let peek = peek(client, &route.dlq_url, max).await?;
    Ok((route, peek))
}
