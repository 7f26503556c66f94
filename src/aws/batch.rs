//! Reads batched across QueueConsumers: each caller asks for one key (a metric, an alarm) and may take
//! an answer up to `max_age` old; the first caller whose answer is stale starts a batch, every caller
//! in the next `window` joins it, and the batch also carries every remembered key that will be due
//! before the next one (older than half its `max_age`), so a poll interval's reads go out together
//! in as few calls as the service allows (`max_per_call` keys each). Answers are fanned back to each
//! caller and kept for the next. A key nobody asked for in two of its `max_age`s is forgotten.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::time::Instant;

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

type Waiter<V, E> = oneshot::Sender<Result<V, BatchError<E>>>;

struct Entry<V> {
    value: Option<(V, Instant)>,
    max_age: Duration,
    wanted: Instant,
}

struct State<K, V, E> {
    known: HashMap<K, Entry<V>>,
    pending: HashMap<K, Vec<Waiter<V, E>>>,
    scheduled: bool,
}

struct Inner<K, V, E> {
    state: Mutex<State<K, V, E>>,
    window: Duration,
    max_per_call: usize,
    fetch: Fetch<K, V, E>,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl<K, V, E> Batcher<K, V, E>
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Default + Send + 'static,
    E: Clone + Send + 'static,
{
    pub fn new(window: Duration, max_per_call: usize, fetch: Fetch<K, V, E>) -> Self {
        Batcher {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    known: HashMap::new(),
                    pending: HashMap::new(),
                    scheduled: false,
                }),
                window,
                max_per_call: max_per_call.max(1),
                fetch,
            }),
        }
    }

    /// The value of `key`, read at most `max_age` ago (zero: read now, in the next batch).
    pub async fn get(&self, key: K, max_age: Duration) -> Result<V, BatchError<E>> {
        let rx = {
            let mut st = lock(&self.inner.state);
            let now = Instant::now();
            let entry = st.known.entry(key.clone()).or_insert(Entry {
                value: None,
                max_age,
                wanted: now,
            });
            entry.wanted = now;
            entry.max_age = max_age;
            if let Some((v, at)) = &entry.value
                && now.duration_since(*at) < max_age
            {
                return Ok(v.clone());
            }
            let (tx, rx) = oneshot::channel();
            st.pending.entry(key).or_default().push(tx);
            if !st.scheduled {
                st.scheduled = true;
                // A task of its own: the batch answers its other callers even if this one is dropped.
                tokio::spawn(flush(self.inner.clone()));
            }
            rx
        };
        rx.await.unwrap_or(Err(BatchError::Abandoned))
    }

    /// Drop what is known of `key` (after a write, so the next read goes to the service).
    pub fn forget(&self, key: &K) {
        lock(&self.inner.state).known.remove(key);
    }

    /// Keys remembered (asked for recently).
    pub fn known(&self) -> usize {
        lock(&self.inner.state).known.len()
    }
}

async fn flush<K, V, E>(inner: Arc<Inner<K, V, E>>)
where
    K: Clone + Eq + Hash + Send + 'static,
    V: Clone + Default + Send + 'static,
    E: Clone + Send + 'static,
{
    tokio::time::sleep(inner.window).await;
    let (keys, mut waiters) = {
        let mut st = lock(&inner.state);
        st.scheduled = false;
        let waiters = std::mem::take(&mut st.pending);
        let now = Instant::now();
        st.known
            .retain(|_, e| now.duration_since(e.wanted) <= e.max_age * 2 + inner.window);
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
                    }
                    for w in waiters.remove(&k).unwrap_or_default() {
                        let _ = w.send(Ok(v.clone()));
                    }
                }
            }
            Err(e) => {
                // Nothing is cached from a failed call: the next read tries again.
                for k in chunk {
                    for w in waiters.remove(&k).unwrap_or_default() {
                        let _ = w.send(Err(BatchError::Call(e.clone())));
                    }
                }
            }
        }
    }
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
        all.sort();
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
        last.sort();
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
            b.get(1, Duration::from_secs(60)),
            b.get(2, Duration::from_secs(60))
        );
        assert_eq!(a, Err(BatchError::Call("denied".to_string())));
        assert_eq!(c, Err(BatchError::Call("denied".to_string())));
        assert_eq!(calls.lock().unwrap().len(), 1);
        let _ = b.get(1, Duration::from_secs(60)).await;
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
}
