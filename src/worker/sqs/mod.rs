//! The worker's SQS calls through `aws-sdk-sqs`: receive, batched delete and visibility changes, queue
//! attributes. One client per process, built from the shared aws-config loader (credentials chain,
//! standard retries honouring `AWS_RETRY_MODE`/`AWS_MAX_ATTEMPTS`, proxies from the environment).
//! Every HTTP request is counted by action, every call bounded by a timeout, and its errors
//! classified for backoff and readiness.
//!
//! - `client`: the `Sqs` type and its calls;
//! - `wire`: the shapes of the answers (messages, batch entries and failures, queue attributes);
//! - `errors`: `SqsError`, the `Action` it names, classification on top of `aws::classify`.

mod client;
mod errors;
mod wire;

pub use client::{RECEIVE_LAG, SYSTEM_ATTRIBUTES, Sqs, lease_start};
pub use errors::{Action, ErrorKind, SqsError, classify_code};
pub use wire::{
    AttributeValue, Entry, EntryFailure, Message, NO_ANSWER, QueueInfo, batch_failures,
    parse_queue_info,
};
