//! The reconciler: observe → validate → build → apply → status for each QueueConsumer.
//! Orchestration only; the decisions live in pure modules (validate, render, conditions).
