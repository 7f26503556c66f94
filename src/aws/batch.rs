//! Reads batched across QueueConsumers: each caller asks for one key (a metric, an alarm) and may take
//! an answer up to `max_age` old. Two ways to run:
//!
//! - **On demand** (`Batcher::new`): the first caller whose answer is stale starts a batch, every
//!   caller in the next `window` joins it, and the batch also carries every remembered key that will be
//!   due before the next one (older than half its `max_age`). Callers wait for their batch.
//! - **In the background** (`Batcher::with_refresh`): a refresher task makes one pass every `every`
//!   and reads the keys due, and callers `peek` at the last answer (with its age) without ever
//!   waiting for the service. A pass reads, in as few calls as the service allows
//!   (`max_per_call` keys each): every key never read yet and every key a `get` waits for (these also
//!   start a pass of their own after `window`, so a new key is read within about `window`), then the
//!   keys read longest ago, as many as keep every key younger than its `max_age`
//!   (⌈Σ every / max_age⌉, and at least every key already older than that), filling the calls it
//!   makes anyway. So a steady set of keys is read in the same number of calls at every pass, spread
//!   over `max_age` rather than all at once.
//!
//! Answers are fanned back to each caller and kept for the next. A key nobody asked for in two of its
//! `max_age`s is forgotten.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::sync::lock;

/// One call for many keys. Keys missing from the answer get `V::default()` (no data).
pub type Fetch<K, V, E> =
    Arc<dyn Fn(Vec<K>) -> BoxFuture<'static, Result<HashMap<K, V>, E>> + Send + Sync>;

/// Why a batched read has no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError<E> {
    /// The call carrying this key failed; every key in it gets the same error.
    #[error("{0}")]
    Call(E),
    /// The batch was dropped before answering (the runtime is shutting down).
    #[error("the batched read was abandoned")]
    Abandoned,
}

/// What is known of a key without waiting: its last answer and how old it is, and the failure of the
/// last attempt when that attempt failed (the answer, if any, is then from before it).
#[derive(Clone, Debug, PartialEq)]
pub struct Known<V, E> {
    pub value: Option<(V, Duration)>,
    pub error: Option<E>,
}

/// Passes (background mode) or batches (on demand) made, and the calls they made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub passes: u64,
    pub calls: u64,
    pub keys: u64,
    /// The most calls one pass (or batch) made.
    pub max_pass_calls: u64,
}

type Waiter<V, E> = oneshot::Sender<Result<V, BatchError<E>>>;

struct Entry<V, E> {
    value: Option<(V, Instant)>,
    error: Option<E>,
    /// When the last read of this key started (None: never).
    tried: Option<Instant>,
    max_age: Duration,
    wanted: Instant,
}

impl<V, E> Entry<V, E> {
    fn new(max_age: Duration, now: Instant) -> Self {
        Entry {
            value: None,
            error: None,
            tried: None,
            max_age,
            wanted: now,
        }
    }
}

struct State<K, V, E> {
    known: HashMap<K, Entry<V, E>>,
    pending: HashMap<K, Vec<Waiter<V, E>>>,
    scheduled: bool,
    refresher: bool,
    counts: Counts,
}

impl<K: Eq + std::hash::Hash + Clone, V, E> State<K, V, E> {
    /// The key's entry (made on first sight), marked wanted now with this reuse age.
    fn want(&mut self, key: &K, max_age: Duration, now: Instant) -> &mut Entry<V, E> {
        let entry = self
            .known
            .entry(key.clone())
            .or_insert_with(|| Entry::new(max_age, now));
        entry.wanted = now;
        entry.max_age = max_age;
        entry
    }
}

struct Inner<K, V, E> {
    state: Mutex<State<K, V, E>>,
    window: Duration,
    max_per_call: usize,
    fetch: Fetch<K, V, E>,
    /// Background mode: the refresher's pass period.
    every: Option<Duration>,
    urgent: Arc<Notify>,
}

/// A batching, caching reader of keys `K` with values `V`.
pub struct Batcher<K, V, E> {
    inner: Arc<Inner<K, V, E>>,
}

impl<K, V, E> Clone for Batcher<K, V, E> {
    fn clone(&self) -> Self {
        Batcher {
            inner: self.inner.clone(),
        }
    }
}

impl<K, V, E> Batcher<K, V, E>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Default + Send + 'static,
    E: Clone + Send + 'static,
{
    /// On demand: callers wait for their batch.
    pub fn new(window: Duration, max_per_call: usize, fetch: Fetch<K, V, E>) -> Self {
        Self::build(window, max_per_call, None, fetch)
    }

    /// In the background: a refresher pass every `every` (see the module's doc).
    pub fn with_refresh(
        window: Duration,
        max_per_call: usize,
        every: Duration,
        fetch: Fetch<K, V, E>,
    ) -> Self {
        Self::build(window, max_per_call, Some(every.max(window)), fetch)
    }

    fn build(
        window: Duration,
        max_per_call: usize,
        every: Option<Duration>,
        fetch: Fetch<K, V, E>,
    ) -> Self {
        Batcher {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    known: HashMap::new(),
                    pending: HashMap::new(),
                    scheduled: false,
                    refresher: false,
                    counts: Counts::default(),
                }),
                window,
                max_per_call: max_per_call.max(1),
                fetch,
                every,
                urgent: Arc::new(Notify::new()),
            }),
        }
    }

    /// Whether a refresher reads in the background.
    pub fn refreshes(&self) -> bool {
        self.inner.every.is_some()
    }

    /// The value of `key`, read at most `max_age` ago (zero: read now, in the next batch or pass).
    pub async fn get(&self, key: K, max_age: Duration) -> Result<V, BatchError<E>> {
        let rx = {
            let mut st = lock(&self.inner.state);
            let now = Instant::now();
            let entry = st.want(&key, max_age, now);
            if let Some((v, at)) = &entry.value
                && now.duration_since(*at) < max_age
            {
                return Ok(v.clone());
            }
            let (tx, rx) = oneshot::channel();
            st.pending.entry(key).or_default().push(tx);
            self.schedule(&mut st);
            rx
        };
        rx.await.unwrap_or(Err(BatchError::Abandoned))
    }

    /// What is known of `key` now, never waiting. The key is remembered (so a refresher keeps it
    /// fresh); a key never read, or (on demand) a stale one, is read in the next batch or pass.
    pub fn peek(&self, key: K, max_age: Duration) -> Known<V, E> {
        let mut st = lock(&self.inner.state);
        let now = Instant::now();
        let entry = st.want(&key, max_age, now);
        let known = Known {
            value: entry
                .value
                .as_ref()
                .map(|(v, at)| (v.clone(), now.duration_since(*at))),
            error: entry.error.clone(),
        };
        let due = match self.inner.every {
            // The refresher reads what is due; only a key never tried asks for a pass of its own.
            Some(_) => entry.tried.is_none(),
            None => known.value.as_ref().is_none_or(|(_, age)| *age >= max_age),
        };
        if due {
            if self.inner.every.is_none() {
                st.pending.entry(key).or_default();
            }
            self.schedule(&mut st);
        }
        known
    }

    fn schedule(&self, st: &mut State<K, V, E>) {
        match self.inner.every {
            Some(every) => {
                if !st.refresher {
                    st.refresher = true;
                    tokio::spawn(refresher(
                        Arc::downgrade(&self.inner),
                        self.inner.urgent.clone(),
                        every,
                        self.inner.window,
                    ));
                }
                self.inner.urgent.notify_one();
            }
            None => {
                if !st.scheduled {
                    st.scheduled = true;
                    // A task of its own: the batch answers its other callers even if this one is
                    // dropped.
                    tokio::spawn(flush(self.inner.clone()));
                }
            }
        }
    }

    /// Mark `key` as due at the next pass (after a write), without a pass of its own: its value is
    /// dropped and it is read with the keys read longest ago, in the calls the next pass makes anyway
    /// (or one more, when many are due).
    pub fn expire(&self, key: K, max_age: Duration) {
        let mut st = lock(&self.inner.state);
        let now = Instant::now();
        let entry = st
            .known
            .entry(key)
            .or_insert_with(|| Entry::new(max_age, now));
        entry.value = None;
        entry.error = None;
        entry.tried = Some(now);
        entry.wanted = now;
    }

    /// Drop what is known of `key` (after a write, so the next read goes to the service).
    pub fn forget(&self, key: &K) {
        lock(&self.inner.state).known.remove(key);
    }

    /// Keys remembered (asked for recently).
    pub fn known(&self) -> usize {
        lock(&self.inner.state).known.len()
    }

    /// Passes or batches made so far, their calls and keys read.
    pub fn counts(&self) -> Counts {
        lock(&self.inner.state).counts
    }
}

/// Forget keys nobody asked for in two of their max ages (and the time between two reads).
fn sweep_unwanted<K: Eq + Hash, V, E>(st: &mut State<K, V, E>, now: Instant, slack: Duration) {
    let pending = &st.pending;
    st.known.retain(|k, e| {
        pending.contains_key(k) || now.duration_since(e.wanted) <= e.max_age * 2 + slack
    });
}

async fn flush<K, V, E>(inner: Arc<Inner<K, V, E>>)
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Default + Send + 'static,
    E: Clone + Send + 'static,
{
    tokio::time::sleep(inner.window).await;
    let (keys, waiters) = {
        let mut st = lock(&inner.state);
        st.scheduled = false;
        let now = Instant::now();
        sweep_unwanted(&mut st, now, inner.window);
        let waiters = std::mem::take(&mut st.pending);
        let mut keys: Vec<K> = waiters.keys().cloned().collect();
        // Due before the next batch: read them now, in the same calls.
        keys.extend(
            st.known
                .iter()
                .filter(|(k, e)| {
                    !waiters.contains_key(*k)
                        && e.value
                            .as_ref()
                            .is_some_and(|(_, at)| now.duration_since(*at) >= e.max_age / 2)
                })
                .map(|(k, _)| k.clone()),
        );
        (keys, waiters)
    };
    read(&inner, keys, waiters).await;
}

/// Read `keys` in calls of at most `max_per_call`, keep the answers and hand them to the waiters.
async fn read<K, V, E>(
    inner: &Inner<K, V, E>,
    keys: Vec<K>,
    mut waiters: HashMap<K, Vec<Waiter<V, E>>>,
) where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Default + Send + 'static,
    E: Clone + Send + 'static,
{
    {
        let mut st = lock(&inner.state);
        let now = Instant::now();
        for k in &keys {
            if let Some(e) = st.known.get_mut(k) {
                e.tried = Some(now);
            }
        }
        let calls = keys.len().div_ceil(inner.max_per_call) as u64;
        st.counts.passes += 1;
        st.counts.calls += calls;
        st.counts.max_pass_calls = st.counts.max_pass_calls.max(calls);
        st.counts.keys += keys.len() as u64;
    }
    let calls = keys.chunks(inner.max_per_call).map(|chunk| {
        let chunk = chunk.to_vec();
        let fetch = inner.fetch.clone();
        async move {
            let answer = fetch(chunk.clone()).await;
            (chunk, answer)
        }
    });
    for (chunk, answer) in futures::future::join_all(calls).await {
        let mut st = lock(&inner.state);
        let at = Instant::now();
        match answer {
            Ok(mut values) => {
                for k in chunk {
                    let v = values.remove(&k).unwrap_or_default();
                    if let Some(e) = st.known.get_mut(&k) {
                        e.value = Some((v.clone(), at));
                        e.error = None;
                    }
                    for w in waiters.remove(&k).unwrap_or_default() {
                        let _ = w.send(Ok(v.clone()));
                    }
                }
            }
            Err(e) => {
                // The answer is not replaced: the next read tries again, and `peek` says both.
                for k in chunk {
                    if let Some(entry) = st.known.get_mut(&k) {
                        entry.error = Some(e.clone());
                    }
                    for w in waiters.remove(&k).unwrap_or_default() {
                        let _ = w.send(Err(BatchError::Call(e.clone())));
                    }
                }
            }
        }
    }
}

/// The background refresher: a pass every `every`, and one `window` after a key never read (or a
/// waiting `get`) asks for it. Ends when the batcher is dropped. One pass at a time.
async fn refresher<K, V, E>(
    inner: Weak<Inner<K, V, E>>,
    urgent: Arc<Notify>,
    every: Duration,
    window: Duration,
) where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Default + Send + 'static,
    E: Clone + Send + 'static,
{
    let mut next_sweep = Instant::now() + every;
    loop {
        let woken = urgent.notified();
        tokio::pin!(woken);
        tokio::select! {
            () = &mut woken => tokio::time::sleep(window).await,
            () = tokio::time::sleep_until(next_sweep) => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        let now = Instant::now();
        let sweep = now >= next_sweep;
        if sweep {
            next_sweep = now + every;
        }
        let (keys, waiters) = pass_keys(&inner, now, sweep, every);
        if !keys.is_empty() || !waiters.is_empty() {
            read(&inner, keys, waiters).await;
        }
    }
}

/// The keys of one refresher pass (see the module's doc), and the waiters they answer.
#[allow(clippy::type_complexity)]
fn pass_keys<K, V, E>(
    inner: &Inner<K, V, E>,
    now: Instant,
    sweep: bool,
    every: Duration,
) -> (Vec<K>, HashMap<K, Vec<Waiter<V, E>>>)
where
    K: Clone + Eq + Hash,
{
    let mut st = lock(&inner.state);
    sweep_unwanted(&mut st, now, every + inner.window);
    let waiters = std::mem::take(&mut st.pending);
    let mut keys: Vec<K> = waiters.keys().cloned().collect();
    let mut rest: Vec<(Option<Instant>, &K)> = Vec::new();
    let (mut share, mut stale) = (0.0_f64, 0usize);
    for (k, e) in &st.known {
        if waiters.contains_key(k) {
            continue;
        }
        if e.tried.is_none() {
            keys.push(k.clone());
            continue;
        }
        let read_at = e.value.as_ref().map(|(_, at)| *at);
        if read_at.is_none_or(|at| now.duration_since(at) >= e.max_age) {
            stale += 1;
        }
        share += if e.max_age.is_zero() {
            1.0
        } else {
            (every.as_secs_f64() / e.max_age.as_secs_f64()).min(1.0)
        };
        rest.push((read_at, k));
    }
    let due = if sweep {
        (share.ceil() as usize).max(stale)
    } else {
        0
    };
    let want = keys.len() + due;
    let room = want.div_ceil(inner.max_per_call) * inner.max_per_call;
    if room > keys.len() {
        // Read longest ago first (never answered before all).
        rest.sort_by_key(|(at, _)| *at);
        keys.extend(
            rest.into_iter()
                .take(room - keys.len())
                .map(|(_, k)| k.clone()),
        );
    }
    (keys, waiters)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    type Calls = Arc<Mutex<Vec<Vec<u32>>>>;

    fn squares(calls: Calls, fail: bool) -> Fetch<u32, Option<u32>, String> {
        Arc::new(move |keys: Vec<u32>| {
            let calls = calls.clone();
            Box::pin(async move {
                calls.lock().unwrap().push(keys.clone());
                if fail {
                    return Err("denied".to_string());
                }
                // Odd keys have no data.
                Ok(keys
                    .into_iter()
                    .filter(|k| k.is_multiple_of(2))
                    .map(|k| (k, Some(k * k)))
                    .collect())
            })
        })
    }

    #[tokio::test]
    async fn concurrent_reads_share_calls_of_at_most_max_per_call_keys() {
        let calls = Calls::default();
        let b = Batcher::new(Duration::from_millis(100), 4, squares(calls.clone(), false));
        let reads = (0..10).map(|k| {
            let b = b.clone();
            async move { b.get(k, Duration::from_secs(15)).await }
        });
        let answers = futures::future::join_all(reads).await;
        for (k, a) in answers.into_iter().enumerate() {
            let k = k as u32;
            assert_eq!(a, Ok(k.is_multiple_of(2).then_some(k * k)), "key {k}");
        }
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert!(calls.iter().all(|c| c.len() <= 4));
        let mut all: Vec<u32> = calls.concat();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn answers_are_reused_until_stale_and_due_keys_ride_along() {
        // Time scaled down: a 1.5 s interval, 10 ms windows.
        let ms = Duration::from_millis;
        let calls = Calls::default();
        let b = Batcher::new(ms(10), 500, squares(calls.clone(), false));
        let age = ms(1500);
        b.get(2, age).await.unwrap();
        tokio::time::sleep(ms(500)).await;
        b.get(4, age).await.unwrap();
        assert_eq!(calls.lock().unwrap().len(), 2);
        // Fresh: no call.
        tokio::time::sleep(ms(500)).await;
        assert_eq!(b.get(2, age).await, Ok(Some(4)));
        assert_eq!(calls.lock().unwrap().len(), 2);
        // Key 2 is stale at 1.5 s; key 4 (read 1 s ago) is due within the next half interval and
        // goes in the same call, so its next read is free.
        tokio::time::sleep(ms(600)).await;
        b.get(2, age).await.unwrap();
        let mut last = calls.lock().unwrap().last().cloned().unwrap();
        last.sort_unstable();
        assert_eq!(last, vec![2, 4]);
        tokio::time::sleep(ms(100)).await;
        b.get(4, age).await.unwrap();
        assert_eq!(calls.lock().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn failures_reach_every_caller_and_are_not_kept() {
        let calls = Calls::default();
        let b = Batcher::new(Duration::from_millis(10), 500, squares(calls.clone(), true));
        let (a, c) = tokio::join!(
            b.get(1, Duration::from_mins(1)),
            b.get(2, Duration::from_mins(1))
        );
        assert_eq!(a, Err(BatchError::Call("denied".to_string())));
        assert_eq!(c, Err(BatchError::Call("denied".to_string())));
        assert_eq!(calls.lock().unwrap().len(), 1);
        let _ = b.get(1, Duration::from_mins(1)).await;
        assert_eq!(calls.lock().unwrap().len(), 2, "a failure is read again");
    }

    #[tokio::test]
    async fn forgotten_and_unwanted_keys_leave() {
        let n = Arc::new(AtomicUsize::new(0));
        let counter = n.clone();
        let fetch: Fetch<u32, Option<u32>, String> = Arc::new(move |keys: Vec<u32>| {
            counter.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok(keys.into_iter().map(|k| (k, Some(k))).collect()) })
        });
        let b = Batcher::new(Duration::from_millis(10), 500, fetch);
        let age = Duration::from_millis(100);
        b.get(1, age).await.unwrap();
        b.forget(&1);
        b.get(1, age).await.unwrap();
        assert_eq!(
            n.load(Ordering::SeqCst),
            2,
            "forget makes the next read go out"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        b.get(2, age).await.unwrap();
        assert_eq!(
            b.known(),
            1,
            "key 1 was not asked for in two of its max ages"
        );
    }

    type Reads = Arc<Mutex<HashMap<u32, u32>>>;

    /// Every key's value is the key; counts how often each key was read; fails while `down`.
    fn counting(
        reads: Reads,
        down: Arc<std::sync::atomic::AtomicBool>,
    ) -> Fetch<u32, Option<u32>, String> {
        Arc::new(move |keys: Vec<u32>| {
            let (reads, down) = (reads.clone(), down.clone());
            Box::pin(async move {
                if down.load(Ordering::SeqCst) {
                    return Err("throttled".to_string());
                }
                let mut r = reads.lock().unwrap();
                for k in &keys {
                    *r.entry(*k).or_default() += 1;
                }
                Ok(keys.into_iter().map(|k| (k, Some(k))).collect())
            })
        })
    }

    async fn until<F: Fn() -> bool>(what: &str, f: F) {
        for _ in 0..1000 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("not reached within 10 s: {what}");
    }

    #[tokio::test]
    async fn peek_never_waits_and_new_keys_are_read_together_in_the_background() {
        let reads = Reads::default();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ms = Duration::from_millis;
        let b = Batcher::with_refresh(
            ms(50),
            4,
            Duration::from_mins(1),
            counting(reads.clone(), down),
        );
        // Ten new keys: nothing known yet, and nothing waited for.
        for k in 0..10 {
            assert_eq!(
                b.peek(k, ms(500)),
                Known {
                    value: None,
                    error: None
                }
            );
        }
        until("the new keys are read", || b.counts().keys >= 10).await;
        // One pass (of three calls of at most 4), long before the 60 s sweep.
        let c = b.counts();
        assert_eq!((c.passes, c.calls, c.keys), (1, 3, 10), "{c:?}");
        for k in 0..10 {
            let known = b.peek(k, ms(500));
            assert_eq!(known.value.map(|(v, _)| v), Some(Some(k)));
        }
        // A blocking read of a known, fresh key makes no call.
        assert_eq!(b.get(3, ms(500)).await, Ok(Some(3)));
        assert_eq!(b.counts().calls, 3);
    }

    /// 1,000 keys with a 2 s max age and a pass every 500 ms: after the first read (all new keys
    /// together), each pass reads the quarter read longest ago in the same 3 calls of 100
    /// (⌈1000 x 500/2000 / 100⌉), never all of them at once, and every key is read again within
    /// four passes. (Half-second passes: a pass that runs late reads the keys that became overdue
    /// meanwhile too, and a loaded machine delayed 100 ms passes that much.)
    #[tokio::test]
    async fn a_steady_set_is_read_in_the_same_calls_every_pass_spread_over_its_max_age() {
        let reads = Reads::default();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ms = Duration::from_millis;
        let (every, max_age) = (ms(500), ms(2000));
        let b = Batcher::with_refresh(ms(10), 100, every, counting(reads.clone(), down));
        let peek_all = |b: &Batcher<u32, Option<u32>, String>| {
            (0..1000).for_each(|k| {
                b.peek(k, max_age);
            });
        };
        peek_all(&b);
        until("the first read", || b.counts().keys >= 1000).await;
        let first = b.counts();
        assert_eq!(first.calls, 10, "new keys go out together: {first:?}");
        reads.lock().unwrap().clear();
        // Eight sweeps, keeping every key wanted.
        until("eight more passes", || {
            peek_all(&b);
            b.counts().passes >= first.passes + 8
        })
        .await;
        let c = b.counts();
        let (passes, calls) = (c.passes - first.passes, c.calls - first.calls);
        assert!(passes >= 8);
        assert_eq!(calls, 3 * passes, "3 calls a pass: {c:?}");
        assert_eq!(c.max_pass_calls, 10, "only the first read took 10");
        let reads = reads.lock().unwrap();
        for k in 0..1000 {
            assert!(
                reads.get(&k).copied().unwrap_or(0) >= 2,
                "key {k} read {:?} times in {passes} passes",
                reads.get(&k)
            );
        }
    }

    #[tokio::test]
    async fn a_failed_refresh_keeps_the_last_answer_and_says_so() {
        let reads = Reads::default();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ms = Duration::from_millis;
        let b = Batcher::with_refresh(ms(10), 500, ms(50), counting(reads, down.clone()));
        b.peek(7, ms(100));
        until("read", || b.peek(7, ms(100)).value.is_some()).await;
        down.store(true, Ordering::SeqCst);
        until("a failed pass", || b.peek(7, ms(100)).error.is_some()).await;
        let known = b.peek(7, ms(100));
        assert_eq!(
            known.value.map(|(v, _)| v),
            Some(Some(7)),
            "the last answer stays"
        );
        assert_eq!(known.error.as_deref(), Some("throttled"));
        // A blocking read gets the failure.
        assert_eq!(
            b.get(7, Duration::ZERO).await,
            Err(BatchError::Call("throttled".to_string()))
        );
        down.store(false, Ordering::SeqCst);
        until("recovered", || b.peek(7, ms(100)).error.is_none()).await;
    }
}
