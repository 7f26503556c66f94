//! The finalizer that holds a QueueConsumer until its CloudWatch alarm is deleted: the alarm's module puts
//! it on and takes it off; the namespaced mode's access hold (`access`) counts who still carries it.

use crate::api::QueueConsumer;

/// Finalizer that holds a QueueConsumer until its CloudWatch alarm is deleted.
pub const FINALIZER: &str = "sqs.consumers.dev/cleanup";

pub fn has_finalizer(qc: &QueueConsumer) -> bool {
    qc.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}
