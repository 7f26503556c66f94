//! The receive planner: how many messages the worker may hold and how its receives go out, from
//! its shape (concurrency, batch, heartbeats), what it has measured (handler time, receive round
//! trip), what it holds now and the outage breaker's gate. Pure: `worker::dispatch` is the event
//! loop that feeds it and carries its answers out, and `validate` predicts prefetch with these same
//! functions. docs/worker.md, "Receiving", says why each number is what it is.

use std::time::Duration;

/// Messages one worker may hold beyond its `concurrency` slots, waiting for a slot or in a receive
/// in flight: one batch, plus at most `early_receive_max` still waiting when the next whole batch is
/// asked for, while heartbeats keep their leases, on a standard queue (a FIFO message already waits
/// behind its group); none without heartbeats, whose leases would run out while they wait. That is
/// max(`batch_size` + ceil(`batch_size` / 2), `concurrency`): with many slots, up to one message per
/// slot, so what is held ahead never takes longer than one handler time per slot to start. The
/// worker holds them only while prefetch pays (`prefetch_pays`), and only as many as one receive
/// round trip needs; `validate::prefetch` predicts with this function and that one.
pub fn prefetch(batch_size: u32, concurrency: u32, heartbeat: bool, fifo: bool) -> u32 {
    if heartbeat && !fifo {
        batch_size.saturating_add(early_receive_max(batch_size, concurrency))
    } else {
        0
    }
}

/// Batch mode's prefetch (`--batch-max-items` > 1): whole calls' worth of messages (`maxItems` each)
/// one worker may hold ahead, waiting for a running call to end, while heartbeats keep their leases
/// on a standard queue: at most half its calls, rounded up (the worker asks for as many as it
/// expects to end during one receive round trip, at least one, while prefetch pays). None on FIFO
/// queues (a message already waits behind its group) or without heartbeats.
pub fn batch_prefetch_calls(calls: u32, heartbeat: bool, fifo: bool) -> u32 {
    if heartbeat && !fifo {
        calls.max(1).div_ceil(2)
    } else {
        0
    }
}

/// Prefetch pays while one receive round trip is more than this share of a handler call: below it a
/// slot that waits a round trip for its next message loses less than 2 % of its time, and holding
/// messages ahead would only spend their visibility.
pub const PREFETCH_ROUND_TRIP_SHARE: f64 = 0.02;
/// The longest receive round trip prefetch is sized by: an in-region SQS receive takes 10-30 ms, and
/// a slower one (a congested path) does not make prefetch pay for handlers of seconds. With it,
/// validation predicts exactly when the worker may prefetch: only for a mean handler time under
/// `PREFETCH_ROUND_TRIP_CEILING` / `PREFETCH_ROUND_TRIP_SHARE` (2 s).
pub const PREFETCH_ROUND_TRIP_CEILING: Duration = Duration::from_millis(40);

/// Whether messages may wait locally for a slot, from the mean handler time and the receive round
/// trip: only while the round trip (at most `PREFETCH_ROUND_TRIP_CEILING`) is more than
/// `PREFETCH_ROUND_TRIP_SHARE` of a handler call, and the mean is below the heartbeat interval (a
/// message that would wait longer than that for a slot costs heartbeats and is better left on the
/// queue for another consumer).
pub fn prefetch_pays(mean: Duration, round_trip: Duration, heartbeat: Option<Duration>) -> bool {
    let rtt = round_trip.min(PREFETCH_ROUND_TRIP_CEILING).as_secs_f64();
    heartbeat.is_some_and(|hb| mean < hb) && rtt > mean.as_secs_f64() * PREFETCH_ROUND_TRIP_SHARE
}

/// The most messages that may still wait locally (or be on their way in receives already sent) when
/// the next whole-batch receive goes out: half a batch, rounded up, or with more slots than a batch
/// and a half, `concurrency` − `batch_size` (so the whole held ahead is at most one message per slot).
/// The worker asks that early by the messages its slots are expected to take during one receive
/// round trip (concurrency × round trip / mean handler time), within this cap (docs/worker.md): at
/// C = 100 and a 25 ms handler that is some 60 messages, several receives in flight at once.
pub fn early_receive_max(batch_size: u32, concurrency: u32) -> u32 {
    batch_size
        .div_ceil(2)
        .max(concurrency.saturating_sub(batch_size))
}

/// How many messages may still wait (or be on their way) when the next whole batch is asked for:
/// those `concurrency` slots are expected to take during one receive round trip,
/// ceil(C × round trip / mean handler time), at most `max` (`early_receive_max`). A mean of zero
/// (handlers faster than the clock) asks for the most.
pub fn early_receive(
    concurrency: usize,
    round_trip: Duration,
    mean: Duration,
    max: usize,
) -> usize {
    if mean.is_zero() {
        return max;
    }
    // A float past usize's range converts to usize::MAX: the cap still holds.
    let taken = concurrency as f64 * round_trip.as_secs_f64() / mean.as_secs_f64();
    (taken.ceil() as usize).min(max)
}

/// Parallel receives at most; more only while the queue keeps returning messages.
pub const MAX_PARALLEL_RECEIVES: usize = 8;
/// Longest wait for more slots to free up before receiving a partial batch.
pub const MAX_FILL_WAIT: Duration = Duration::from_millis(100);

/// What the worker was started with, as the planner needs it (`worker::dispatch::Settings`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub concurrency: usize,
    /// Messages one receive asks for at most (SQS: 1..=10).
    pub batch_size: usize,
    pub fifo: bool,
    /// Messages that may wait locally for a slot while prefetch pays (`prefetch`; 0: none).
    pub prefetch: usize,
    /// The most messages still waiting when the next whole batch is asked for (`early_receive_max`).
    pub early_max: usize,
    /// The heartbeat interval (None: heartbeats off, nothing waits locally).
    pub heartbeat: Option<Duration>,
    /// Batch mode: `concurrency` counts handler calls of up to `max_items` messages.
    pub calls: Option<Calls>,
}

/// Batch mode's part of the shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Calls {
    pub max_items: usize,
    /// Whole calls' worth that may be received ahead (`batch_prefetch_calls`).
    pub prefetch_calls: usize,
}

impl Shape {
    /// Whether this worker may ever hold messages ahead of its slots (a log line says when it starts
    /// and stops doing so).
    pub fn may_prefetch(&self) -> bool {
        self.prefetch > 0 || self.calls.is_some_and(|c| c.prefetch_calls > 0)
    }
}

/// What the dispatcher has measured so far: moving means of the handler call and of receives that
/// found messages (None until the first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measured {
    pub handler: Option<Duration>,
    pub round_trip: Option<Duration>,
}

/// The outage breaker as the planner sees it (`worker::breaker`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Closed (or disabled): no limit of its own.
    Closed,
    /// Open (0) or recovering in slow start: at most this many messages held.
    Slots(usize),
    /// Open, and a probe wants fresh messages beside those held at the gate.
    WantsFresh,
}

/// What the dispatcher holds at this moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Received and not finished: running plus waiting.
    pub in_flight: usize,
    /// Of those, waiting for a slot (or a batch) locally.
    pub waiting: usize,
    /// Handler calls running (batch mode's calls; tasks otherwise).
    pub calls: usize,
    /// Messages asked for by receives still in flight.
    pub reserved: usize,
}

/// How many messages may be held and how receives go out, until something changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Messages that may be held (in flight plus asked for).
    pub capacity: usize,
    /// A whole receive: `batch_size`, or less where the capacity is smaller.
    pub full: usize,
    /// Receives that may be in flight at once.
    pub max_parallel: usize,
    /// Messages are held ahead of the slots (prefetch pays).
    pub prefetching: bool,
}

/// The plan for what the dispatcher holds now. Messages wait locally for a slot only once the
/// handler time and the round trip are measured and a round trip is a noticeable share of a handler
/// call (`prefetch_pays`); the next whole batch is asked for while `early` messages still wait; batch
/// mode holds whole calls' worth ahead, as many as are expected to end during one round trip. The
/// breaker caps it all (open: nothing new, except a batch of fresh messages a probe asks for).
pub fn plan(shape: &Shape, measured: Measured, held: Held, gate: Gate) -> Plan {
    let pays = match (measured.handler, measured.round_trip) {
        (Some(mean), Some(rtt)) => prefetch_pays(mean, rtt, shape.heartbeat),
        _ => false,
    };
    let prefetch = if pays && shape.calls.is_none() {
        shape.prefetch
    } else {
        0
    };
    // Batch mode: as many calls' worth as are expected to end during one round trip.
    let ahead_calls = match (shape.calls, measured.handler, measured.round_trip) {
        (Some(c), Some(mean), Some(rtt)) if pays && c.prefetch_calls > 0 => {
            let ending = if mean.is_zero() {
                c.prefetch_calls
            } else {
                // A float past usize's range converts to usize::MAX: the clamp still holds.
                (rtt.as_secs_f64() * shape.concurrency as f64 / mean.as_secs_f64()).ceil() as usize
            };
            ending.clamp(1, c.prefetch_calls)
        }
        _ => 0,
    };
    // As many as the slots are expected to take during one receive round trip, at most `early_max`.
    let early = match (prefetch, measured.round_trip, measured.handler) {
        (1.., Some(rtt), Some(mean)) => {
            early_receive(shape.concurrency, rtt, mean, shape.early_max)
        }
        _ => 0,
    };
    let mut capacity = match shape.calls {
        // Messages in running calls, plus a whole call's worth for each free call: a received
        // message always has a call to go into once its batch is due.
        Some(c) if !shape.fifo => {
            let in_calls = held.in_flight.saturating_sub(held.waiting);
            in_calls + (shape.concurrency.saturating_sub(held.calls) + ahead_calls) * c.max_items
        }
        Some(c) => shape.concurrency * c.max_items,
        None => shape.concurrency + prefetch + early,
    };
    capacity = match gate {
        Gate::Closed => capacity,
        // Fresh messages beside those held, to probe with: a batch, so one on its first receive is
        // likely among them. Only when no receive is out already.
        Gate::WantsFresh if held.reserved == 0 => held.in_flight + shape.batch_size,
        Gate::WantsFresh => 0,
        Gate::Slots(n) => capacity.min(n),
    };
    let full = shape.batch_size.min(capacity).max(1);
    // Message slots (batch mode's calls each take up to max_items), and what may be held ahead of
    // them: as many receives at once as whole batches fit in both, so a round trip longer than a
    // handler call is covered by several receives in flight.
    let items = shape.calls.map_or(1, |c| c.max_items);
    let slots = shape.concurrency * items;
    let ahead = prefetch + early + ahead_calls * shape.calls.map_or(0, |c| c.max_items);
    Plan {
        capacity,
        full,
        max_parallel: (slots + ahead)
            .div_ceil(full)
            .clamp(1, MAX_PARALLEL_RECEIVES),
        prefetching: prefetch + ahead_calls > 0,
    }
}

/// The wait for more slots to free before a partial receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// None set.
    Unset,
    /// Set and not over yet.
    Pending,
    /// Over: a partial receive may go.
    Due,
}

/// Where receives stand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receiving {
    /// Receives in flight.
    pub out: usize,
    /// The last receive that answered found nothing.
    pub last_empty: bool,
    pub fill: Fill,
}

/// What to do next about receiving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Send a receive for this many messages (before the rate limit, which may take fewer).
    Receive(usize),
    /// Wait this long for more slots to free, then receive what there is room for.
    WaitToFill(Duration),
    /// Nothing now: the next event (a message ending, a receive answering) decides again.
    Hold,
}

/// The next receive under `plan`. While messages wait locally every slot is busy and the next ones
/// are at hand: a partial receive would only cost a request, so the next receive goes out whole.
/// A first receive goes out partial when nothing is held, or once a short wait for more slots (a
/// tenth of a handler call, at most `MAX_FILL_WAIT`) is over: one full receive beats several small
/// ones, and that wait re-joins batches that drifted apart. A further receive in parallel only while
/// the queue keeps returning messages, and at most `max_parallel`.
pub fn next_receive(
    plan: &Plan,
    shape: &Shape,
    measured: Measured,
    held: Held,
    r: Receiving,
) -> Next {
    let free = plan.capacity.saturating_sub(held.in_flight + held.reserved);
    let want = free.min(shape.batch_size);
    if want == 0 {
        return Next::Hold;
    }
    let launch = if r.out == 0 {
        want >= plan.full || (held.waiting == 0 && (held.in_flight == 0 || r.fill == Fill::Due))
    } else {
        want >= plan.full && !r.last_empty && r.out < plan.max_parallel
    };
    if launch {
        Next::Receive(want)
    } else if r.out == 0 && held.waiting == 0 && r.fill == Fill::Unset {
        let wait = measured
            .handler
            .map_or(Duration::ZERO, |mean| mean / 10)
            .min(MAX_FILL_WAIT);
        Next::WaitToFill(wait)
    } else {
        Next::Hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_mode_receives_at_most_half_its_calls_ahead() {
        assert_eq!(batch_prefetch_calls(1, true, false), 1);
        assert_eq!(batch_prefetch_calls(10, true, false), 5);
        assert_eq!(batch_prefetch_calls(7, true, false), 4);
        // Never none for a worker with calls, nothing without heartbeats or on FIFO.
        assert_eq!(batch_prefetch_calls(0, true, false), 1);
        assert_eq!(batch_prefetch_calls(10, false, false), 0);
        assert_eq!(batch_prefetch_calls(10, true, true), 0);
    }

    #[test]
    fn what_is_held_ahead_grows_with_the_slots_to_one_message_a_slot() {
        // #31 item 1: one batch plus half a batch while that is more than the slots...
        assert_eq!(early_receive_max(10, 1), 5);
        assert_eq!(early_receive_max(10, 10), 5);
        assert_eq!(early_receive_max(10, 15), 5);
        assert_eq!(prefetch(10, 1, true, false), 15);
        assert_eq!(prefetch(10, 15, true, false), 15);
        // ...then one message a slot in all, so what waits starts within one handler time a slot.
        assert_eq!(early_receive_max(10, 16), 6);
        assert_eq!(early_receive_max(10, 100), 90);
        assert_eq!(prefetch(10, 100, true, false), 100);
        assert_eq!(prefetch(1, 1, true, false), 2);
        assert_eq!(prefetch(1, 50, true, false), 50);
        // Nothing ahead without heartbeats or on FIFO queues, whatever the slots.
        assert_eq!(prefetch(10, 100, false, false), 0);
        assert_eq!(prefetch(10, 100, true, true), 0);
    }

    #[test]
    fn the_early_receive_covers_what_the_slots_take_during_one_round_trip() {
        let ms = Duration::from_millis;
        // C = 100, 25 ms handlers, a 15 ms round trip: 60 messages go in one round trip.
        assert_eq!(early_receive(100, ms(15), ms(25), 90), 60);
        // Rounded up: a slot that frees during the round trip finds a message.
        assert_eq!(early_receive(10, ms(15), ms(25), 5), 5);
        assert_eq!(early_receive(1, ms(15), ms(25), 5), 1);
        assert_eq!(early_receive(1, ms(1), ms(2000), 5), 1);
        // Never past the cap, however fast the handler or slow the round trip.
        assert_eq!(early_receive(100, ms(40), ms(1), 90), 90);
        assert_eq!(early_receive(100, ms(15), Duration::ZERO, 90), 90);
        assert_eq!(early_receive(100, Duration::from_hours(1), ms(1), 90), 90);
        // A round trip too short to measure: none held back for it.
        assert_eq!(early_receive(100, Duration::ZERO, ms(25), 90), 0);
    }

    #[test]
    fn prefetch_pays_while_a_round_trip_is_a_noticeable_share_of_a_call() {
        let ms = Duration::from_millis;
        let hb = Some(Duration::from_secs(10));
        // 20 ms round trip: 2 % of a 1 s call is exactly 20 ms, so it pays only below 1 s.
        assert!(prefetch_pays(ms(50), ms(20), hb));
        assert!(prefetch_pays(ms(999), ms(20), hb));
        assert!(!prefetch_pays(ms(1000), ms(20), hb));
        assert!(!prefetch_pays(ms(2000), ms(20), hb));
        // A round trip past the ceiling counts as the ceiling: never for a mean of 2 s or more.
        assert!(prefetch_pays(ms(1999), Duration::from_secs(5), hb));
        assert!(!prefetch_pays(ms(2000), Duration::from_secs(5), hb));
        // Not without heartbeats, nor for a mean at or above the heartbeat interval.
        assert!(!prefetch_pays(ms(50), ms(20), None));
        assert!(!prefetch_pays(ms(50), ms(20), Some(ms(50))));
        // An instant handler: any round trip is a large share.
        assert!(prefetch_pays(Duration::ZERO, ms(1), hb));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A standard queue, 10 slots, receives of 10, heartbeats on: what `worker::run` derives.
    fn standard(concurrency: usize) -> Shape {
        Shape {
            concurrency,
            batch_size: 10,
            fifo: false,
            prefetch: prefetch(10, concurrency as u32, true, false) as usize,
            early_max: early_receive_max(10, concurrency as u32) as usize,
            heartbeat: Some(Duration::from_secs(10)),
            calls: None,
        }
    }

    /// Fast handlers beside the round trip: prefetch pays.
    const FAST: Measured = Measured {
        handler: Some(Duration::from_millis(25)),
        round_trip: Some(Duration::from_millis(15)),
    };
    /// Handlers of seconds: it does not.
    const SLOW: Measured = Measured {
        handler: Some(Duration::from_secs(5)),
        round_trip: Some(Duration::from_millis(15)),
    };

    fn idle() -> Receiving {
        Receiving {
            out: 0,
            last_empty: false,
            fill: Fill::Unset,
        }
    }

    fn held(in_flight: usize, waiting: usize, reserved: usize) -> Held {
        Held {
            in_flight,
            waiting,
            calls: in_flight - waiting,
            reserved,
        }
    }

    #[test]
    fn before_anything_is_measured_only_the_free_slots_are_received_into() {
        let s = standard(10);
        let p = plan(&s, Measured::default(), Held::default(), Gate::Closed);
        assert_eq!(
            p,
            Plan {
                capacity: 10,
                full: 10,
                max_parallel: 1,
                prefetching: false
            }
        );
        assert_eq!(
            next_receive(&p, &s, Measured::default(), Held::default(), idle()),
            Next::Receive(10)
        );
        // Asked for: nothing more until it answers.
        let h = held(0, 0, 10);
        assert_eq!(
            next_receive(&p, &s, Measured::default(), h, idle()),
            Next::Hold
        );
        // Three slots: a receive of three, never more than the slots.
        let s = standard(3);
        let p = plan(&s, Measured::default(), Held::default(), Gate::Closed);
        assert_eq!((p.capacity, p.full), (3, 3));
        assert_eq!(
            next_receive(&p, &s, Measured::default(), Held::default(), idle()),
            Next::Receive(3)
        );
    }

    #[test]
    fn fast_handlers_hold_one_batch_ahead_and_ask_early_in_parallel() {
        let s = standard(10);
        assert_eq!((s.prefetch, s.early_max), (15, 5));
        let p = plan(&s, FAST, Held::default(), Gate::Closed);
        // 10 slots + 15 ahead + 5 asked for early (ceil(10 × 15 / 25) = 6, capped at 5).
        assert_eq!(p.capacity, 30);
        assert_eq!(p.max_parallel, 3);
        assert!(p.prefetching);
        // All slots busy and 10 waiting: the next whole batch goes out at once...
        let h = held(20, 10, 0);
        assert_eq!(next_receive(&p, &s, FAST, h, idle()), Next::Receive(10));
        // ...and a second beside it while the queue keeps returning messages...
        let one_out = Receiving { out: 1, ..idle() };
        assert_eq!(
            next_receive(&p, &s, FAST, held(10, 0, 10), one_out),
            Next::Receive(10)
        );
        // ...not after an empty answer (long polls would only pile up)...
        let empty = Receiving {
            last_empty: true,
            ..one_out
        };
        assert_eq!(
            next_receive(&p, &s, FAST, held(10, 0, 10), empty),
            Next::Hold
        );
        // ...and never past the capacity: 25 held and 5 asked for is all.
        assert_eq!(
            next_receive(&p, &s, FAST, held(25, 15, 5), one_out),
            Next::Hold
        );
    }

    #[test]
    fn slow_handlers_or_no_heartbeats_hold_nothing_ahead() {
        let s = standard(10);
        let p = plan(&s, SLOW, Held::default(), Gate::Closed);
        assert_eq!((p.capacity, p.prefetching), (10, false));
        let no_heartbeat = Shape {
            heartbeat: None,
            prefetch: 0,
            early_max: 0,
            ..s
        };
        let p = plan(&no_heartbeat, FAST, Held::default(), Gate::Closed);
        assert_eq!((p.capacity, p.prefetching), (10, false));
        // A mean at or above the heartbeat interval: a waiting message would cost heartbeats.
        let long = Measured {
            handler: Some(Duration::from_secs(10)),
            ..FAST
        };
        assert!(!plan(&s, long, Held::default(), Gate::Closed).prefetching);
    }

    #[test]
    fn a_partial_receive_waits_a_tenth_of_a_call_for_more_slots() {
        let s = standard(10);
        let p = plan(&s, SLOW, held(7, 0, 0), Gate::Closed);
        // 7 running, 3 free: wait (at most 100 ms) for more to free rather than ask for 3.
        let h = held(7, 0, 0);
        assert_eq!(
            next_receive(&p, &s, SLOW, h, idle()),
            Next::WaitToFill(MAX_FILL_WAIT)
        );
        let quick = Measured {
            handler: Some(ms(300)),
            ..SLOW
        };
        assert_eq!(
            next_receive(&p, &s, quick, h, idle()),
            Next::WaitToFill(ms(30))
        );
        // While that wait runs, nothing; once over, what there is room for.
        let pending = Receiving {
            fill: Fill::Pending,
            ..idle()
        };
        assert_eq!(next_receive(&p, &s, SLOW, h, pending), Next::Hold);
        let due = Receiving {
            fill: Fill::Due,
            ..idle()
        };
        assert_eq!(next_receive(&p, &s, SLOW, h, due), Next::Receive(3));
        // Nothing held at all: no reason to wait.
        assert_eq!(
            next_receive(&p, &s, SLOW, Held::default(), idle()),
            Next::Receive(10)
        );
    }

    #[test]
    fn the_breaker_caps_what_is_held_and_asks_for_fresh_messages_to_probe_with() {
        let s = standard(10);
        // Open: nothing new.
        let h = held(10, 0, 0);
        let p = plan(&s, FAST, h, Gate::Slots(0));
        assert_eq!(p.capacity, 0);
        assert_eq!(next_receive(&p, &s, FAST, h, idle()), Next::Hold);
        // Open and a probe wants fresh messages: one batch beside the 10 held at the gate.
        let p = plan(&s, FAST, h, Gate::WantsFresh);
        assert_eq!(p.capacity, 20);
        assert_eq!(next_receive(&p, &s, FAST, h, idle()), Next::Receive(10));
        // That receive out: no second.
        let out = held(10, 0, 10);
        let p = plan(&s, FAST, out, Gate::WantsFresh);
        assert_eq!(p.capacity, 0);
        assert_eq!(
            next_receive(&p, &s, FAST, out, Receiving { out: 1, ..idle() }),
            Next::Hold
        );
        // Recovering with 2 slots: receives of 2.
        let p = plan(&s, FAST, Held::default(), Gate::Slots(2));
        assert_eq!((p.capacity, p.full), (2, 2));
        assert_eq!(
            next_receive(&p, &s, FAST, Held::default(), idle()),
            Next::Receive(2)
        );
    }

    #[test]
    fn batch_mode_receives_whole_calls_for_the_free_calls() {
        let s = Shape {
            concurrency: 4,
            batch_size: 10,
            fifo: false,
            prefetch: 0,
            early_max: 0,
            heartbeat: Some(Duration::from_secs(10)),
            calls: Some(Calls {
                max_items: 10,
                prefetch_calls: batch_prefetch_calls(4, true, false) as usize,
            }),
        };
        // Nothing measured: 4 free calls of 10.
        let p = plan(&s, Measured::default(), Held::default(), Gate::Closed);
        assert_eq!((p.capacity, p.max_parallel), (40, 4));
        // 3 calls running with 30 messages: room for one call's worth.
        let h = Held {
            in_flight: 30,
            waiting: 0,
            calls: 3,
            reserved: 0,
        };
        assert_eq!(plan(&s, Measured::default(), h, Gate::Closed).capacity, 40);
        // Fast calls: calls' worth ahead, as many as end during a round trip (ceil(15 × 4 / 25) = 3,
        // capped at half the calls: 2).
        let p = plan(&s, FAST, h, Gate::Closed);
        assert_eq!(p.capacity, 30 + (1 + 2) * 10);
        assert!(p.prefetching);
        // FIFO: every call's worth, nothing ahead (a message already waits behind its group).
        let fifo = Shape {
            fifo: true,
            calls: Some(Calls {
                max_items: 10,
                prefetch_calls: 0,
            }),
            ..s
        };
        let p = plan(&fifo, FAST, h, Gate::Closed);
        assert_eq!((p.capacity, p.prefetching), (40, false));
    }

    proptest::proptest! {
        /// Sending every receive the planner asks for, until it holds: what is held and asked for
        /// stays within the capacity, the capacity within the slots plus one batch and
        /// `early_receive_max` ahead (standard queues) or the breaker's slots, and receives in
        /// flight within `max_parallel` (beyond the first).
        #[test]
        fn the_planner_never_asks_past_what_may_be_held(
            concurrency in 1usize..=200,
            batch_size in 1usize..=10,
            heartbeat in proptest::bool::ANY,
            fifo in proptest::bool::ANY,
            handler_ms in proptest::option::of(0u64..5_000),
            rtt_ms in proptest::option::of(0u64..200),
            running in 0usize..=200,
            waiting in 0usize..=30,
            gate_slots in proptest::option::of(0usize..=50),
            last_empty in proptest::bool::ANY,
        ) {
            let shape = Shape {
                concurrency,
                batch_size,
                fifo,
                prefetch: prefetch(batch_size as u32, concurrency as u32, heartbeat, fifo) as usize,
                early_max: early_receive_max(batch_size as u32, concurrency as u32) as usize,
                heartbeat: heartbeat.then(|| Duration::from_secs(10)),
                calls: None,
            };
            let measured = Measured {
                handler: handler_ms.map(ms),
                round_trip: rtt_ms.map(ms),
            };
            let gate = gate_slots.map_or(Gate::Closed, Gate::Slots);
            let mut h = Held {
                in_flight: running.min(concurrency) + waiting,
                waiting,
                calls: running.min(concurrency),
                reserved: 0,
            };
            let p = plan(&shape, measured, h, gate);
            let bound = concurrency + shape.prefetch + shape.early_max;
            proptest::prop_assert!(p.capacity <= bound);
            if let Some(n) = gate_slots {
                proptest::prop_assert!(p.capacity <= n);
            }
            proptest::prop_assert!(p.full >= 1 && p.full <= batch_size);
            let mut r = Receiving { out: 0, last_empty, fill: Fill::Due };
            for _ in 0..=MAX_PARALLEL_RECEIVES + 1 {
                match next_receive(&p, &shape, measured, h, r) {
                    Next::Receive(n) => {
                        proptest::prop_assert!(n >= 1 && n <= batch_size);
                        h.reserved += n;
                        r.out += 1;
                    }
                    Next::WaitToFill(w) => proptest::prop_assert!(w <= MAX_FILL_WAIT),
                    Next::Hold => {}
                }
                proptest::prop_assert!(h.reserved == 0 || h.in_flight + h.reserved <= p.capacity);
                proptest::prop_assert!(r.out <= p.max_parallel.max(1));
            }
        }
    }
}
