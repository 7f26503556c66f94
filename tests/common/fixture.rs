//! One QueueConsumer test fixture: a small valid manifest (a queue URL, a p99, an HTTP handler) and
//! named setters for what a test varies, so each test states only what its scenario depends on.
//!
//! ```ignore
//! let doc = consumer("orders").namespace(NS).on_moto(&queue.url).concurrency(1).alarm(false).json();
//! ```

use serde_json::{Value, json};

/// The queue URL of `consumer` unless a test sets one.
pub const QUEUE_URL: &str = "https://sqs.us-east-1.amazonaws.com/123456789012/orders";

/// A QueueConsumer manifest under construction.
#[derive(Clone, Debug)]
#[must_use]
pub struct Consumer {
    doc: Value,
}

/// A QueueConsumer named `name`: queue `QUEUE_URL`, p99 1s, an HTTP handler with its defaults, no
/// namespace, no template, everything else left to the CRD's defaults.
pub fn consumer(name: &str) -> Consumer {
    Consumer {
        doc: json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
            "metadata": {"name": name},
            "spec": {
                "queue": {"url": QUEUE_URL},
                "processing": {"p99": "1s"},
                "handler": {"http": {}}
            }
        }),
    }
}

/// The consumer most controller tests reconcile: `orders` in `ns` on a moto queue, timeout 10s, waitTime
/// 1s, an HTTP handler on 8080 at /messages, image shop/orders:1, no DLQ alarm.
pub fn moto_consumer(ns: &str, url: &str) -> Consumer {
    consumer("orders")
        .namespace(ns)
        .on_moto(url)
        .timeout("10s")
        .wait_time("1s")
        .http(8080, "/messages")
        .image("shop/orders:1")
        .alarm(false)
}

impl Consumer {
    /// Sets the field at the JSON pointer `pointer` (objects created on the way).
    pub fn set(mut self, pointer: &str, value: impl Into<Value>) -> Self {
        let mut at = &mut self.doc;
        for part in pointer.split('/').skip(1) {
            if !at.is_object() {
                *at = json!({});
            }
            at = at
                .as_object_mut()
                .expect("an object on the way")
                .entry(part)
                .or_insert(Value::Null);
        }
        *at = value.into();
        self
    }

    pub fn namespace(self, ns: &str) -> Self {
        self.set("/metadata/namespace", ns)
    }

    pub fn queue_url(self, url: &str) -> Self {
        self.set("/spec/queue/url", url)
    }

    /// `spec.queue.endpoint`: where the controller and the workers reach SQS.
    pub fn endpoint(self, endpoint: &str) -> Self {
        self.set("/spec/queue/endpoint", endpoint)
    }

    /// A queue on the moto server the tests run (`QC_TEST_SQS_ENDPOINT`).
    pub fn on_moto(self, url: &str) -> Self {
        self.queue_url(url).endpoint(&super::sqs_endpoint())
    }

    pub fn p99(self, p99: &str) -> Self {
        self.set("/spec/processing/p99", p99)
    }

    pub fn timeout(self, timeout: &str) -> Self {
        self.set("/spec/processing/timeout", timeout)
    }

    pub fn wait_time(self, wait: &str) -> Self {
        self.set("/spec/processing/waitTime", wait)
    }

    pub fn concurrency(self, n: u32) -> Self {
        self.set("/spec/processing/concurrency", n)
    }

    /// An HTTP handler on `port` at `path`.
    pub fn http(self, port: u16, path: &str) -> Self {
        self.set(
            "/spec/handler",
            json!({"http": {"port": port, "path": path}}),
        )
    }

    /// An exec handler running `command`.
    pub fn exec(self, command: &str) -> Self {
        self.set("/spec/handler", json!({"exec": {"command": [command]}}))
    }

    /// A pod template with one container `app` running `image`.
    pub fn image(self, image: &str) -> Self {
        self.set(
            "/spec/template",
            json!({"spec": {"containers": [{"name": "app", "image": image}]}}),
        )
    }

    /// `spec.scaling`, replaced whole.
    pub fn scaling(self, scaling: Value) -> Self {
        self.set("/spec/scaling", scaling)
    }

    /// `spec.deadLetter.alarm`.
    pub fn alarm(self, on: bool) -> Self {
        self.set("/spec/deadLetter/alarm", on)
    }

    pub fn suspend(self, suspend: bool) -> Self {
        self.set("/spec/suspend", suspend)
    }

    /// The manifest as JSON.
    pub fn json(self) -> Value {
        self.doc
    }

    /// The manifest as the Rust type (panics, as a test failure, if it does not parse).
    pub fn typed(self) -> qc::api::QueueConsumer {
        serde_json::from_value(self.doc).expect("the fixture is a QueueConsumer")
    }

    /// The manifest as YAML.
    pub fn yaml(self) -> String {
        serde_saphyr::to_string(&self.doc).expect("the fixture serializes to YAML")
    }
}
