//! The one key of the state the controller keeps per QueueConsumer across reconciles: scaling
//! histories, worker scrape windows, redrives in progress and the error backoff.

use kube::ResourceExt;

use crate::api::QueueConsumer;

/// A QueueConsumer's uid, so a recreated namesake starts afresh (namespace/name for an object without
/// one, which only tests build).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConsumerKey(String);

impl ConsumerKey {
    pub fn of(qc: &QueueConsumer) -> ConsumerKey {
        ConsumerKey(match qc.metadata.uid.as_deref() {
            Some(uid) if !uid.is_empty() => uid.to_string(),
            _ => format!("{}/{}", qc.namespace().unwrap_or_default(), qc.name_any()),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The stores index by the key's text, so a `&ConsumerKey` goes where they take a `&str`.
impl std::ops::Deref for ConsumerKey {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ConsumerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_uids() {
        let mut qc: QueueConsumer = serde_json::from_value(json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"queue": {"url": "https://sqs.us-east-1.amazonaws.com/1/orders"},
                     "processing": {"p99": "1s"}, "handler": {"http": {}},
                     "template": {"spec": {"containers": [{"name": "app", "image": "x"}]}}},
        }))
        .unwrap();
        assert_eq!(ConsumerKey::of(&qc).as_str(), "shop/orders");
        qc.metadata.uid = Some("u-1".into());
        assert_eq!(ConsumerKey::of(&qc).as_str(), "u-1");
        qc.metadata.uid = Some(String::new());
        assert_eq!(ConsumerKey::of(&qc).as_str(), "shop/orders");
    }
}
