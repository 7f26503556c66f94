//! QueueConsumer operator: run Amazon SQS consumers on Kubernetes declaratively.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod api;
pub mod aws;
pub mod telemetry;
pub mod worker;
