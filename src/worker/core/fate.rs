//! How a message ends, decided in one place: (what happened, the policy, the message's facts) → a
//! `Fate`. Pure: no I/O, no clock. `Lease::settle` (worker::message) carries a fate out: the SQS call,
//! the log line. A message is deleted only on an explicit success (or a key already done); the absence
//! of an answer is a failure, never a success.

use std::time::Duration;

use crate::api::OnPoison;

use super::backoff::{retry_delay, within_twelve_hours};

/// What happened to a message, before or in its handler call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Happened {
    /// The handler answered success.
    Succeeded,
    /// No pattern of `spec.filter` matched it (a clean non-match, never a filter error).
    Filtered,
    /// It was handled already: its idempotency key is done (elsewhere, or before), or its S3
    /// payload was deleted here after a success.
    KeyDone,
    /// It can never succeed: the handler said so (HTTP 400/422, exit 65), or its SNS envelope or
    /// S3 pointer cannot be read, or it cannot be handed to the handler at all.
    Poison(String),
    /// It was judged poison on an earlier receive here (`--on-poison leave` remembers it).
    KnownPoison,
    /// The dead-letter queue could not take it (none, not found, the send failed): left to the
    /// redrive policy instead.
    DeadLetterFailed,
    /// A transient failure: the handler's (5xx, 429, a timeout, no connection, an exec exit other
    /// than 0/65/75, an unreadable or missing batch answer) or the S3 payload's. `retry_after`: the
    /// handler asked for this delay. `hold`: the outage breaker holds it for its next probe.
    Failed {
        retry_after: Option<Duration>,
        hold: bool,
    },
    /// The idempotency store did not answer.
    StoreDown,
    /// Its idempotency key is claimed by another worker for about this long.
    InProgressElsewhere { claim_left: Duration },
    /// Its lease was lost before a call: SQS may have handed it to another consumer already.
    LeaseLost,
    /// It was never started: shutting down, its FIFO group stopped before its turn, or handled but
    /// behind a message of its group that stays on the queue.
    NotStarted,
    /// It waited at the breaker's gate as long as it may (its lease, the outage tolerance).
    /// `failed_before`: a call for it failed in this receive.
    GateGaveUp { failed_before: bool },
}

/// How a message ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Delete it. `success`: after its handler succeeded (or its key was done), so a copy received
    /// moments later is a duplicate (`worker::held`).
    Delete { success: bool },
    /// Delete it without a call: the filter matched none of its patterns, as Lambda's event
    /// filtering deletes such messages.
    Discard,
    /// Make it visible again after `delay` (ChangeMessageVisibility): a retry that spends a receive.
    /// `wanted`: the delay asked for, when SQS's 12 hours since the receive cut it.
    RetryAfter {
        delay: Duration,
        wanted: Option<Duration>,
    },
    /// Visible again at once, unhandled.
    Release,
    /// Hidden this long: another worker holds its key.
    Hide(Duration),
    /// Send it to the DLQ with this reason, then delete it from the source.
    DeadLetter(String),
    /// Poison left for the redrive policy: remembered here (no more calls) and backed off this long.
    Leave(Duration),
    /// No call, no visibility change: its receipt handle may be stale; it comes back by itself.
    Abandon,
    /// Kept in hand for the outage breaker's next probe.
    Hold,
}

/// What the fates depend on from the worker's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub on_poison: OnPoison,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub visibility_timeout: Duration,
}

/// What the fates depend on from the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts {
    /// ApproximateReceiveCount of this receive.
    pub receive_count: u32,
    /// Since the receive returned: SQS's 12 hours of visibility count from it.
    pub since_receipt: Duration,
}

/// A message claimed elsewhere comes back this long after the claim's end.
pub const HIDE_MARGIN: Duration = Duration::from_secs(2);

/// The one decision of how a message ends.
pub fn decide(happened: Happened, p: &Policy, f: Facts) -> Fate {
    match happened {
        Happened::Succeeded | Happened::KeyDone => Fate::Delete { success: true },
        Happened::Filtered => Fate::Discard,
        Happened::Poison(reason) => match p.on_poison {
            OnPoison::Delete => Fate::Delete { success: false },
            OnPoison::Leave => Fate::Leave(retry(p, f, None).0),
            OnPoison::DeadLetter => Fate::DeadLetter(reason),
        },
        Happened::KnownPoison => match p.on_poison {
            OnPoison::Delete => Fate::Delete { success: false },
            OnPoison::Leave => Fate::Leave(retry(p, f, None).0),
            OnPoison::DeadLetter => {
                Fate::DeadLetter("handler answered poison on an earlier receive".into())
            }
        },
        Happened::DeadLetterFailed => Fate::Leave(retry(p, f, None).0),
        Happened::Failed { hold: true, .. } => Fate::Hold,
        Happened::Failed {
            retry_after,
            hold: false,
        } => retry_fate(p, f, retry_after),
        Happened::StoreDown
        | Happened::GateGaveUp {
            failed_before: true,
        } => retry_fate(p, f, None),
        Happened::InProgressElsewhere { claim_left } => {
            Fate::Hide(hide_for(claim_left, p.visibility_timeout, f.since_receipt))
        }
        Happened::LeaseLost => Fate::Abandon,
        Happened::NotStarted
        | Happened::GateGaveUp {
            failed_before: false,
        } => Fate::Release,
    }
}

/// The retry delay for this receive (a handler's Retry-After up to `retry_max`: a typo of a few digits
/// must not hide the message for 12 hours), cut to what is left of SQS's 12 hours since the receive;
/// with the delay asked for when it was cut.
fn retry(p: &Policy, f: Facts, retry_after: Option<Duration>) -> (Duration, Option<Duration>) {
    let wanted = retry_after.map_or_else(
        || retry_delay(p.retry_base, p.retry_max, f.receive_count),
        |d| d.min(p.retry_max),
    );
    let delay = within_twelve_hours(wanted, f.since_receipt);
    (delay, (delay < wanted).then_some(wanted))
}

fn retry_fate(p: &Policy, f: Facts, retry_after: Option<Duration>) -> Fate {
    let (delay, wanted) = retry(p, f, retry_after);
    Fate::RetryAfter { delay, wanted }
}

/// How long to hide a message whose key is claimed elsewhere for `claim_left`: until the claim ends
/// plus a margin, never shorter than the visibility timeout (leaving it would hide it that long),
/// and within SQS's 12 hours from receipt.
pub fn hide_for(
    claim_left: Duration,
    visibility_timeout: Duration,
    since_receipt: Duration,
) -> Duration {
    within_twelve_hours(
        (claim_left + HIDE_MARGIN).max(visibility_timeout),
        since_receipt,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn policy(on_poison: OnPoison) -> Policy {
        Policy {
            on_poison,
            retry_base: S(5),
            retry_max: S(900),
            visibility_timeout: S(30),
        }
    }

    fn facts(receive_count: u32) -> Facts {
        Facts {
            receive_count,
            since_receipt: S(1),
        }
    }

    fn retry_in(secs: u64) -> Fate {
        Fate::RetryAfter {
            delay: S(secs),
            wanted: None,
        }
    }

    /// docs/handler-contract.md, "The answer decides the message's fate", row by row, and the ends
    /// a message can meet before its call.
    #[test]
    fn the_fate_table() {
        use Happened as H;
        use OnPoison::{DeadLetter, Delete, Leave};
        let poison = || H::Poison("HTTP 422".into());
        let rows: Vec<(Happened, OnPoison, u32, Fate)> = vec![
            // success: delete, remembered as done
            (H::Succeeded, DeadLetter, 1, Fate::Delete { success: true }),
            (H::KeyDone, Leave, 3, Fate::Delete { success: true }),
            // poison, by --on-poison
            (poison(), DeadLetter, 1, Fate::DeadLetter("HTTP 422".into())),
            (poison(), Leave, 2, Fate::Leave(S(10))),
            (poison(), Delete, 1, Fate::Delete { success: false }),
            (
                H::KnownPoison,
                DeadLetter,
                1,
                Fate::DeadLetter("handler answered poison on an earlier receive".into()),
            ),
            (H::KnownPoison, Leave, 3, Fate::Leave(S(20))),
            // without a DLQ (or its send failed): as leave
            (H::DeadLetterFailed, DeadLetter, 1, Fate::Leave(S(5))),
            // transient: the retry delay, base × 2^(receiveCount−1), capped
            (
                H::Failed {
                    retry_after: None,
                    hold: false,
                },
                DeadLetter,
                1,
                retry_in(5),
            ),
            (
                H::Failed {
                    retry_after: None,
                    hold: false,
                },
                DeadLetter,
                4,
                retry_in(40),
            ),
            (
                H::Failed {
                    retry_after: None,
                    hold: false,
                },
                DeadLetter,
                30,
                retry_in(900),
            ),
            // 429 with Retry-After: that delay, capped at retry_max
            (
                H::Failed {
                    retry_after: Some(S(7)),
                    hold: false,
                },
                DeadLetter,
                5,
                retry_in(7),
            ),
            (
                H::Failed {
                    retry_after: Some(S(86_400)),
                    hold: false,
                },
                DeadLetter,
                1,
                retry_in(900),
            ),
            // the breaker holds it
            (
                H::Failed {
                    retry_after: None,
                    hold: true,
                },
                DeadLetter,
                1,
                Fate::Hold,
            ),
            (H::StoreDown, DeadLetter, 2, retry_in(10)),
            (
                H::InProgressElsewhere { claim_left: S(40) },
                DeadLetter,
                1,
                Fate::Hide(S(42)),
            ),
            (H::LeaseLost, DeadLetter, 1, Fate::Abandon),
            (H::NotStarted, Delete, 1, Fate::Release),
            (
                H::GateGaveUp {
                    failed_before: false,
                },
                DeadLetter,
                1,
                Fate::Release,
            ),
            (
                H::GateGaveUp {
                    failed_before: true,
                },
                DeadLetter,
                3,
                retry_in(20),
            ),
        ];
        for (happened, on_poison, count, want) in rows {
            let got = decide(happened.clone(), &policy(on_poison), facts(count));
            assert_eq!(
                got, want,
                "{happened:?} with {on_poison:?}, receive {count}"
            );
        }
    }

    #[test]
    fn only_a_success_or_a_done_key_deletes_without_a_poison_policy_saying_so() {
        // Every way a message can end, under the two policies that never delete poison: only the
        // explicit successes delete.
        let all = [
            Happened::Succeeded,
            Happened::KeyDone,
            Happened::Poison("p".into()),
            Happened::KnownPoison,
            Happened::DeadLetterFailed,
            Happened::Failed {
                retry_after: None,
                hold: false,
            },
            Happened::Failed {
                retry_after: None,
                hold: true,
            },
            Happened::StoreDown,
            Happened::Filtered,
            Happened::InProgressElsewhere { claim_left: S(1) },
            Happened::LeaseLost,
            Happened::NotStarted,
            Happened::GateGaveUp {
                failed_before: true,
            },
            Happened::GateGaveUp {
                failed_before: false,
            },
        ];
        for on_poison in [OnPoison::DeadLetter, OnPoison::Leave] {
            for h in &all {
                let deletes = matches!(
                    decide(h.clone(), &policy(on_poison), facts(1)),
                    Fate::Delete { .. } | Fate::Discard
                );
                // A clean non-match of the filter deletes too, as Lambda does; nothing else.
                let success = matches!(
                    h,
                    Happened::Succeeded | Happened::KeyDone | Happened::Filtered
                );
                assert_eq!(deletes, success, "{h:?} with {on_poison:?}");
            }
        }
    }

    #[test]
    fn retries_and_hides_stay_within_twelve_hours_of_the_receive() {
        let late = Facts {
            receive_count: 30,
            since_receipt: S(12 * 3600 - 300),
        };
        // 15 min wanted, 4 min left after the minute of slack.
        assert_eq!(
            decide(
                Happened::Failed {
                    retry_after: None,
                    hold: false
                },
                &policy(OnPoison::DeadLetter),
                late
            ),
            Fate::RetryAfter {
                delay: S(240),
                wanted: Some(S(900))
            }
        );
        assert_eq!(hide_for(S(20), S(2), S(0)), S(22));
        assert_eq!(hide_for(S(1), S(30), S(0)), S(30));
        assert_eq!(hide_for(S(13 * 3600), S(30), S(0)), S(12 * 3600 - 60));
        assert_eq!(hide_for(S(13 * 3600), S(30), S(3600)), S(11 * 3600 - 60));
    }
}
