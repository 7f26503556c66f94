//! QueueConsumer operator: run Amazon SQS consumers on Kubernetes declaratively.
#![deny(clippy::unwrap_used)]

pub mod api;
pub mod aws;
pub mod check;
pub mod controller;
pub mod import;
pub mod manage;
pub mod manifest;
pub mod process_metrics;
pub mod render;
pub mod roots;
pub mod scaling;
pub mod sync;
pub mod telemetry;
pub mod tenancy;
pub mod triage;
pub mod validate;
pub mod worker;
