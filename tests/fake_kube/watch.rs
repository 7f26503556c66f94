//! Watch: every change is published to the history and to open watches; a watch replays the history
//! after its resourceVersion (or the current objects as ADDED) and then streams until its timeout.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::store::matches_selector;
use super::{ApiError, Kind, State, WatchEntry, err};

impl State {
    pub(super) fn publish(
        &mut self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: &str,
        event: &'static str,
        object: Value,
    ) {
        let entry = WatchEntry {
            rv: self.rv,
            kind,
            namespace: ns.to_string(),
            event,
            object,
        };
        self.history.push(entry.clone());
        let _ = tx.send(entry);
    }

    pub(super) fn watch(
        &self,
        tx: &broadcast::Sender<WatchEntry>,
        kind: Kind,
        ns: Option<&str>,
        query: &BTreeMap<String, String>,
    ) -> Result<futures::stream::BoxStream<'static, Bytes>, ApiError> {
        matches_selector(&json!({}), query)?;
        let since: Option<u64> = query
            .get("resourceVersion")
            .filter(|v| !v.is_empty() && *v != "0")
            .map(|v| {
                v.parse()
                    .map_err(|_| err(400, "BadRequest", format!("bad resourceVersion {v}")))
            })
            .transpose()?;
        let mut initial: VecDeque<Value> = VecDeque::new();
        let wanted = |e: &WatchEntry| e.kind == kind && ns.is_none_or(|n| n == e.namespace);
        match since {
            Some(rv) => {
                for e in self.history.iter().filter(|e| e.rv > rv && wanted(e)) {
                    if matches_selector(&e.object, query)? {
                        initial.push_back(json!({"type": e.event, "object": e.object}));
                    }
                }
            }
            None => {
                for ((k, o_ns, _), s) in &self.objects {
                    if *k == kind
                        && ns.is_none_or(|n| n == o_ns)
                        && matches_selector(&s.object, query)?
                    {
                        initial.push_back(json!({"type": "ADDED", "object": s.object}));
                    }
                }
            }
        }
        let rx = tx.subscribe();
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(300);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let ns = ns.map(str::to_string);
        let query = query.clone();
        let stream = futures::stream::unfold((initial, rx), move |(mut initial, mut rx)| {
            let ns = ns.clone();
            let query = query.clone();
            async move {
                if let Some(v) = initial.pop_front() {
                    return Some((line(&v), (initial, rx)));
                }
                loop {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => return None,
                        got = rx.recv() => match got {
                            Ok(e) => {
                                if e.kind == kind
                                    && ns.as_deref().is_none_or(|n| n == e.namespace)
                                    && matches_selector(&e.object, &query).unwrap_or(false)
                                {
                                    let v = json!({"type": e.event, "object": e.object});
                                    return Some((line(&v), (initial, rx)));
                                }
                            }
                            // Lagged or closed: end the watch; the client relists.
                            Err(_) => return None,
                        }
                    }
                }
            }
        });
        Ok(stream.boxed())
    }
}

pub(super) fn line(v: &Value) -> Bytes {
    let mut b = serde_json::to_vec(v).unwrap();
    b.push(b'\n');
    Bytes::from(b)
}
