//! One gate for the controller's AWS calls of a service: at most `max_in_flight` calls at once and at
//! most `rate` calls a second (a token bucket holding one second's worth). A throttling answer halves
//! the rate and the call is tried again through the gate; each success wins back a little of it
//! (additive increase, multiplicative decrease), so a throttled account slows the controller down
//! instead of failing its reconciles. Every call is counted by action and outcome for /metrics.
//!
//! The budget is shared fairly between namespaces: calls wait in one queue per namespace (the
//! reconcile's, set by [`in_namespace`]) and the gate serves the namespaces with waiting calls in turn,
//! one call each (round-robin), so a namespace with a thousand QueueConsumers at a 1 s poll interval
//! takes its share and no more: another namespace's call waits behind at most one call of each other
//! namespace, not behind the thousand.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, oneshot};
use tokio::time::Instant;

use crate::sync::lock;
use crate::telemetry::Exposition;

/// Tries of one call while the service answers that it is throttling (the last answer is returned).
pub const THROTTLED_ATTEMPTS: u32 = 4;

/// The configured gate of one service.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LimitConfig {
    /// Calls a second when nothing is throttled.
    pub rate: f64,
    /// Calls in flight at once.
    pub max_in_flight: usize,
}

impl LimitConfig {
    pub const fn new(rate: f64, max_in_flight: usize) -> Self {
        LimitConfig {
            rate,
            max_in_flight,
        }
    }
}

/// How a call ended, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    Ok,
    Throttled,
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Throttled => "throttled",
            Outcome::Error => "error",
        }
    }
}

tokio::task_local! {
    /// The namespace whose turn a call waits for (the reconcile's).
    static NAMESPACE: String;
}

/// Runs `fut` with the AWS calls it makes through any gate queued as `namespace`'s. Calls made
/// outside (tasks spawned on their own, `check`) share one queue of their own.
pub async fn in_namespace<F: Future>(namespace: String, fut: F) -> F::Output {
    NAMESPACE.scope(namespace, fut).await
}

fn current_namespace() -> String {
    NAMESPACE.try_with(Clone::clone).unwrap_or_default()
}

/// Waiters by key, served round-robin: one of each key with waiters in turn, first come first served
/// within a key. Pure: the gate's order, tested as such.
#[derive(Debug)]
pub struct FairQueue<T> {
    queues: HashMap<String, VecDeque<T>>,
    /// Keys with waiters, in the order of their next turn.
    ring: VecDeque<String>,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        FairQueue {
            queues: HashMap::new(),
            ring: VecDeque::new(),
        }
    }
}

impl<T> FairQueue<T> {
    pub fn push(&mut self, key: &str, item: T) {
        if let Some(q) = self.queues.get_mut(key) {
            q.push_back(item);
        } else {
            self.queues.insert(key.to_string(), VecDeque::from([item]));
            self.ring.push_back(key.to_string());
        }
    }

    /// The next waiter: the first of the key whose turn it is; that key's next turn comes after
    /// every other key's with waiters.
    pub fn pop(&mut self) -> Option<(String, T)> {
        let key = self.ring.pop_front()?;
        let q = self.queues.get_mut(&key)?;
        let item = q.pop_front()?;
        if q.is_empty() {
            self.queues.remove(&key);
        } else {
            self.ring.push_back(key.clone());
        }
        Some((key, item))
    }

    pub fn len(&self) -> usize {
        self.queues.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }
}

struct Bucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

/// The calls waiting for their turn, and whether a task hands out turns now.
#[derive(Default)]
struct Waiting {
    queue: FairQueue<oneshot::Sender<()>>,
    pumping: bool,
}

/// What the gate's turn-giving task shares with the callers.
struct Shared {
    bucket: Mutex<Bucket>,
    waiting: Mutex<Waiting>,
}

/// The gate of one AWS service (`sqs`, `cloudwatch`).
pub struct Limiter {
    service: &'static str,
    config: LimitConfig,
    in_flight: Semaphore,
    shared: Arc<Shared>,
    calls: Mutex<BTreeMap<(&'static str, Outcome), u64>>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("service", &self.service)
            .field("config", &self.config)
            .field("rate", &self.rate())
            .finish_non_exhaustive()
    }
}

impl Limiter {
    /// A rate below one call a minute or no call in flight would stop the controller: both are
    /// raised to that floor (the flags' validation rejects them before this).
    pub fn new(service: &'static str, config: LimitConfig) -> Self {
        let config = LimitConfig {
            rate: config.rate.max(1.0 / 60.0),
            max_in_flight: config.max_in_flight.max(1),
        };
        Limiter {
            service,
            config,
            in_flight: Semaphore::new(config.max_in_flight),
            shared: Arc::new(Shared {
                bucket: Mutex::new(Bucket {
                    rate: config.rate,
                    tokens: config.rate.max(1.0),
                    last: Instant::now(),
                }),
                waiting: Mutex::new(Waiting::default()),
            }),
            calls: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn service(&self) -> &'static str {
        self.service
    }

    /// The rate now (below the configured one after throttling).
    pub fn rate(&self) -> f64 {
        lock(&self.shared.bucket).rate
    }

    /// Calls waiting for their turn now.
    pub fn waiting(&self) -> usize {
        lock(&self.shared.waiting).queue.len()
    }

    /// Waits for this call's turn: queued as the current namespace's, handed a token when its turn
    /// comes. The first caller to find no task handing out turns starts one.
    async fn turn(&self) {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut w = lock(&self.shared.waiting);
            w.queue.push(&current_namespace(), tx);
            !std::mem::replace(&mut w.pumping, true)
        };
        if start {
            tokio::spawn(pump(self.shared.clone()));
        }
        // The pump answers every waiter it pops; a sender dropped unanswered (the runtime shutting
        // down) lets the call through ungated.
        let _ = rx.await;
    }
}

/// Hands out turns while calls wait: a token from the bucket, then the next waiter in fair order. A
/// waiter that gave up (its reconcile was cancelled) gives the token back.
async fn pump(shared: Arc<Shared>) {
    /// Clears `pumping` if the task is dropped mid-way (its runtime shut down), so the next caller
    /// starts another.
    struct Running(Arc<Shared>, bool);
    impl Drop for Running {
        fn drop(&mut self) {
            if self.1 {
                lock(&self.0.waiting).pumping = false;
            }
        }
    }
    let mut running = Running(shared.clone(), true);
    loop {
        shared.token().await;
        let next = {
            let mut w = lock(&shared.waiting);
            let Some((_, tx)) = w.queue.pop() else {
                w.pumping = false;
                running.1 = false;
                drop(w);
                shared.refund();
                return;
            };
            tx
        };
        if next.send(()).is_err() {
            shared.refund();
        }
    }
}

impl Shared {
    fn refund(&self) {
        let mut b = lock(&self.bucket);
        b.tokens = (b.tokens + 1.0).min(b.rate.max(1.0));
    }

    /// Take a token, waiting for the bucket to refill when it is empty.
    async fn token(&self) {
        loop {
            let wait = {
                let mut b = lock(&self.bucket);
                let now = Instant::now();
                let burst = b.rate.max(1.0);
                b.tokens =
                    (b.tokens + now.duration_since(b.last).as_secs_f64() * b.rate).min(burst);
                b.last = now;
                if b.tokens >= 1.0 {
                    b.tokens -= 1.0;
                    return;
                }
                (1.0 - b.tokens) / b.rate
            };
            tokio::time::sleep(Duration::from_secs_f64(wait.min(60.0))).await;
        }
    }
}

impl Limiter {
    fn throttled(&self) {
        let floor = (self.config.rate / 64.0).max(1.0 / 60.0);
        let mut b = lock(&self.shared.bucket);
        b.rate = (b.rate / 2.0).max(floor);
        // The calls already let through count against the service too: start the new rate empty.
        b.tokens = b.tokens.min(0.0);
        tracing::info!(
            service = self.service,
            rate = b.rate,
            "AWS throttled the controller: slowing down"
        );
    }

    fn succeeded(&self) {
        let mut b = lock(&self.shared.bucket);
        if b.rate < self.config.rate {
            b.rate = (b.rate + self.config.rate / 50.0).min(self.config.rate);
        }
    }

    fn count(&self, action: &'static str, outcome: Outcome) {
        *lock(&self.calls).entry((action, outcome)).or_default() += 1;
    }

    /// Calls so far by action and outcome (throttled answers that were tried again count too).
    pub fn calls(&self) -> BTreeMap<(&'static str, Outcome), u64> {
        lock(&self.calls).clone()
    }

    /// Calls of `action` so far, whatever their outcome.
    pub fn calls_of(&self, action: &str) -> u64 {
        lock(&self.calls)
            .iter()
            .filter(|((a, _), _)| *a == action)
            .map(|(_, n)| n)
            .sum()
    }

    /// Run `call` through the gate. `throttled` tells a throttling answer from other failures: it
    /// slows the gate and the call is made again, up to `THROTTLED_ATTEMPTS` times in all.
    pub async fn run<T, E, F, Fut>(
        &self,
        action: &'static str,
        throttled: impl Fn(&E) -> bool,
        mut call: F,
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut attempt = 1;
        loop {
            self.turn().await;
            // The semaphore is never closed; should it be, the call goes through ungated.
            let permit = self.in_flight.acquire().await.ok();
            let result = call().await;
            drop(permit);
            match result {
                Ok(v) => {
                    self.count(action, Outcome::Ok);
                    self.succeeded();
                    return Ok(v);
                }
                Err(e) if throttled(&e) => {
                    self.count(action, Outcome::Throttled);
                    self.throttled();
                    if attempt >= THROTTLED_ATTEMPTS {
                        return Err(e);
                    }
                    attempt = attempt.saturating_add(1);
                }
                Err(e) => {
                    self.count(action, Outcome::Error);
                    return Err(e);
                }
            }
        }
    }
}

/// The gates of every service, as /metrics shows them.
pub fn render_metrics(limiters: &[&Limiter]) -> String {
    let calls: Vec<([(&str, &str); 3], u64)> = limiters
        .iter()
        .flat_map(|l| {
            l.calls().into_iter().map(|((action, outcome), n)| {
                (
                    [
                        ("service", l.service),
                        ("action", action),
                        ("outcome", outcome.as_str()),
                    ],
                    n,
                )
            })
        })
        .collect();
    let rates: Vec<([(&str, &str); 1], f64)> = limiters
        .iter()
        .map(|l| ([("service", l.service)], l.rate()))
        .collect();
    let mut e = Exposition::new();
    e.counter(
        "qc_aws_requests_total",
        "AWS calls made by the controller, by service, action and outcome.",
        &calls.iter().map(|(l, n)| (&l[..], *n)).collect::<Vec<_>>(),
    );
    e.gauge_f64(
        "qc_aws_request_rate_limit",
        "Calls a second the controller allows itself now (lower than configured after throttling).",
        &rates.iter().map(|(l, v)| (&l[..], *v)).collect::<Vec<_>>(),
    );
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

    #[tokio::test]
    async fn throttling_slows_the_gate_and_the_call_is_tried_again() {
        let l = Limiter::new("test", LimitConfig::new(64.0, 4));
        let tries = AtomicU32::new(0);
        let r: Result<u32, &str> = l
            .run(
                "Get",
                |e| *e == "throttled",
                || async {
                    if tries.fetch_add(1, Ordering::SeqCst) < 2 {
                        Err("throttled")
                    } else {
                        Ok(7)
                    }
                },
            )
            .await;
        assert_eq!(r, Ok(7));
        assert_eq!(tries.load(Ordering::SeqCst), 3);
        // Two halvings, then one step back up.
        assert!(
            (l.rate() - (16.0 + 64.0 / 50.0)).abs() < 1e-9,
            "{}",
            l.rate()
        );
        assert_eq!(l.calls().get(&("Get", Outcome::Throttled)), Some(&2));
        assert_eq!(l.calls().get(&("Get", Outcome::Ok)), Some(&1));
    }

    #[tokio::test]
    async fn a_call_throttled_every_time_fails_after_the_last_attempt() {
        let l = Limiter::new("test", LimitConfig::new(1000.0, 4));
        let r: Result<(), &str> = l.run("Get", |_| true, || async { Err("throttled") }).await;
        assert_eq!(r, Err("throttled"));
        assert_eq!(l.calls_of("Get"), u64::from(THROTTLED_ATTEMPTS));
        let other: Result<(), &str> = l.run("Put", |_| false, || async { Err("denied") }).await;
        assert_eq!(other, Err("denied"));
        assert_eq!(l.calls().get(&("Put", Outcome::Error)), Some(&1));
    }

    #[test]
    fn the_queue_serves_namespaces_in_turn() {
        let mut q = FairQueue::default();
        for i in 0..5 {
            q.push("big", i);
        }
        q.push("small", 10);
        q.push("other", 20);
        q.push("small", 11);
        assert_eq!(q.len(), 8);
        let order: Vec<(String, i32)> = std::iter::from_fn(|| q.pop()).collect();
        let keys: Vec<&str> = order.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            ["big", "small", "other", "big", "small", "big", "big", "big"]
        );
        // First come, first served within a namespace.
        let big: Vec<i32> = order
            .iter()
            .filter(|(k, _)| k == "big")
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(big, [0, 1, 2, 3, 4]);
        assert!(q.is_empty());
        // A namespace that comes back later joins at the end of the turn.
        q.push("big", 5);
        q.push("small", 12);
        q.push("big", 6);
        assert_eq!(q.pop(), Some(("big".into(), 5)));
        q.push("late", 30);
        assert_eq!(q.pop(), Some(("small".into(), 12)));
        assert_eq!(q.pop(), Some(("big".into(), 6)));
        assert_eq!(q.pop(), Some(("late".into(), 30)));
        assert_eq!(q.pop(), None);
    }

    #[tokio::test]
    async fn a_busy_namespace_cannot_make_another_wait_behind_all_its_calls() {
        // Twenty calls a second (a second's worth at once); a namespace queues 60 calls at once,
        // then another namespace one. Order is asserted, not time.
        let l = Arc::new(Limiter::new("test", LimitConfig::new(20.0, 100)));
        let order = Arc::new(Mutex::new(Vec::new()));
        let call = |ns: &'static str| {
            let (l, order) = (l.clone(), order.clone());
            tokio::spawn(in_namespace(ns.to_string(), async move {
                let _: Result<(), ()> = l
                    .run(
                        "Get",
                        |()| false,
                        || async {
                            order.lock().unwrap().push(ns);
                            Ok(())
                        },
                    )
                    .await;
            }))
        };
        let mut tasks: Vec<_> = (0..60).map(|_| call("busy")).collect();
        // The second's worth of tokens is spent: from now on one call every 50 ms.
        while order.lock().unwrap().len() < 20 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(l.waiting() >= 30, "{}", l.waiting());
        let before = order.lock().unwrap().len();
        tasks.push(call("quiet"));
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap();
        let quiet = order.iter().position(|n| *n == "quiet").unwrap();
        // Its turn comes after at most one more call of the busy namespace (the one already handed a
        // token), not after the 90 still waiting.
        assert!(
            quiet <= before + 2,
            "quiet call {quiet}th, {before} done before it queued"
        );
        assert_eq!(order.len(), 61);
    }

    #[tokio::test]
    async fn the_rate_holds_over_a_burst() {
        let l = Limiter::new("test", LimitConfig::new(100.0, 100));
        let start = tokio::time::Instant::now();
        for _ in 0..130 {
            let _: Result<(), ()> = l.run("Get", |()| false, || async { Ok(()) }).await;
        }
        // A second's worth at once, then a hundred a second: the 130th call leaves after about 0.3 s.
        let took = start.elapsed().as_secs_f64();
        assert!((0.28..1.0).contains(&took), "{took}");
    }

    #[tokio::test]
    async fn no_more_than_max_in_flight_at_once() {
        let l = Arc::new(Limiter::new("test", LimitConfig::new(1000.0, 3)));
        let now = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let (l, now, peak) = (l.clone(), now.clone(), peak.clone());
                tokio::spawn(async move {
                    let _: Result<(), ()> = l
                        .run(
                            "Get",
                            |()| false,
                            || async {
                                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(n, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                now.fetch_sub(1, Ordering::SeqCst);
                                Ok(())
                            },
                        )
                        .await;
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 3);
    }
}
