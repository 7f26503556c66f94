//! AWS adapters: SQS queue facts behind a small trait (real SDK and test doubles).
//! `facts` is pure parsing; the SDK-backed adapter lives in `sqs`.

pub mod facts;

pub use facts::{DeadLetterFacts, Facts, FactsError, QueueArn, QueueFacts, RedrivePolicy};
