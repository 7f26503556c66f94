//! `--on-poison dead-letter`: a poison message is sent to the redrive policy's DLQ at once (body,
//! attributes, FIFO group, a dedup id, a `qc-source-arn` attribute naming the source queue and a
//! `qc-poison-reason` attribute), then deleted from the source. The source attribute is what lets a
//! redrive (src/aws/redrive.rs) tell this queue's dead letters from another queue's in a shared DLQ:
//! a plain SendMessage carries no `DeadLetterQueueSourceArn`.

use aws_sdk_sqs::primitives::Blob;
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName};
use tokio::sync::{Mutex, OnceCell};

use super::sqs::Message;
use crate::aws::facts::{QueueArn, parse_redrive_policy};
pub use crate::aws::redrive::SOURCE_ATTRIBUTE;

/// The attribute that carries why the handler called the message poison (defined beside the source
/// attribute, which triage and redrive read too).
pub use crate::aws::redrive::REASON_ATTRIBUTE;
/// Longest reason kept, in bytes (cut at a character boundary).
pub const MAX_REASON: usize = 1024;
/// SQS accepts at most this many message attributes.
const MAX_ATTRIBUTES: usize = 10;

/// Why a poison message could not be dead-lettered (it is then left for the redrive policy).
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    #[error("cannot read the source queue's RedrivePolicy: {0}")]
    ReadRedrivePolicy(String),
    #[error("RedrivePolicy's deadLetterTargetArn {0:?} is not an SQS queue ARN")]
    ParseTargetArn(String),
    #[error("cannot find the dead-letter queue {name} (account {account}): {reason}")]
    FindQueue {
        name: String,
        account: String,
        reason: String,
    },
    #[error("SendMessage to the dead-letter queue failed: {0}")]
    SendMessage(String),
}

/// How long a looked-up DLQ is used before the redrive policy is read again: a policy pointed at
/// another DLQ reaches the worker's poison within this (a failed send forgets it at once).
pub const TARGET_TTL: std::time::Duration = std::time::Duration::from_mins(5);

/// Where poison goes: the DLQ of the source queue's redrive policy, looked up on first use and again
/// after `TARGET_TTL` or a failed send.
pub struct DeadLetter {
    client: aws_sdk_sqs::Client,
    source_url: String,
    /// When looked up, and the URL (None: the source has no redrive policy).
    target: Mutex<Option<(std::time::Instant, Option<String>)>>,
    /// The source queue's ARN (read with the redrive policy): the `qc-source-arn` of every send.
    source_arn: OnceCell<String>,
}

impl DeadLetter {
    pub fn new(client: aws_sdk_sqs::Client, source_url: &str) -> Self {
        DeadLetter {
            client,
            source_url: source_url.to_string(),
            target: Mutex::new(None),
            source_arn: OnceCell::new(),
        }
    }

    /// The DLQ's URL, None without a redrive policy. A failed lookup is not cached: the next poison
    /// message tries again.
    pub async fn target(&self) -> Result<Option<String>, DeadLetterError> {
        let mut t = self.target.lock().await;
        if let Some((at, url)) = &*t
            && at.elapsed() < TARGET_TTL
        {
            return Ok(url.clone());
        }
        let url = self.look_up().await?;
        *t = Some((std::time::Instant::now(), url.clone()));
        Ok(url)
    }

    async fn look_up(&self) -> Result<Option<String>, DeadLetterError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.source_url)
            .attribute_names(QueueAttributeName::RedrivePolicy)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| DeadLetterError::ReadRedrivePolicy(crate::aws::error_chain(&e)))?;
        if let Some(arn) = out
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
        {
            let _ = self.source_arn.set(arn.clone());
        }
        let Some(policy) = out
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::RedrivePolicy))
        else {
            return Ok(None);
        };
        let arn = parse_redrive_policy(policy)
            .map_err(|_| DeadLetterError::ParseTargetArn(policy.clone()))?
            .dead_letter_target_arn;
        let QueueArn { account, name, .. } =
            QueueArn::parse(&arn).ok_or(DeadLetterError::ParseTargetArn(arn))?;
        let out = self
            .client
            .get_queue_url()
            .queue_name(&name)
            .queue_owner_aws_account_id(&account)
            .send()
            .await
            .map_err(|e| DeadLetterError::FindQueue {
                name,
                account,
                reason: crate::aws::error_chain(&e),
            })?;
        Ok(out.queue_url)
    }

    /// Sends a copy of `msg` to the DLQ at `url`, with the source queue's ARN and the reason attached
    /// (the source first: without it a redrive from a shared DLQ leaves the message where it is). The
    /// message's `qc-` attributes from an earlier trip are replaced.
    pub async fn send(
        &self,
        url: &str,
        msg: &Message,
        reason: &str,
    ) -> Result<Sent, DeadLetterError> {
        let mut req = self
            .client
            .send_message()
            .queue_url(url)
            .message_body(String::from_utf8_lossy(&msg.body));
        let source = self.source_arn.get().map(String::as_str);
        let own = msg
            .attributes
            .iter()
            .filter(|(name, _)| name != REASON_ATTRIBUTE && name != SOURCE_ATTRIBUTE);
        let mut count = 0;
        for (name, value) in own {
            let mut v = MessageAttributeValue::builder().data_type(&value.data_type);
            if let Some(s) = &value.string {
                v = v.string_value(s);
            }
            if let Some(b) = &value.binary {
                v = v.binary_value(Blob::new(b.clone()));
            }
            if let Ok(v) = v.build() {
                req = req.message_attributes(name, v);
                count += 1;
            }
        }
        // SQS takes ten attributes at most: a message that already has ten keeps its own (none is
        // dropped), goes without the source mark (a redrive then moves it only from a DLQ that serves
        // this queue alone) and without the reason, which the worker's log line then carries under
        // the copy's message id (and qc_worker_dead_letter_reasons_unattached_total counts).
        // The source mark first (a redrive from a shared DLQ needs it to move the copy back), then
        // the reason; what finds no room is said in the worker's log line (`Sent`).
        if count < MAX_ATTRIBUTES
            && let Some(arn) = source
            && let Ok(v) = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(arn)
                .build()
        {
            req = req.message_attributes(SOURCE_ATTRIBUTE, v);
            count += 1;
        }
        let mut reason_attached = false;
        if count < MAX_ATTRIBUTES
            && let Ok(v) = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(truncate(reason, MAX_REASON))
                .build()
        {
            req = req.message_attributes(REASON_ATTRIBUTE, v);
            reason_attached = true;
        }
        if let Some(g) = &msg.group_id {
            // The message id dedups a resend within SQS's five-minute window (FIFO DLQs only).
            req = req.message_group_id(g).message_deduplication_id(&msg.id);
        }
        let out = match req.send().await {
            Ok(out) => out,
            Err(e) => {
                // The DLQ may be gone or the redrive policy changed: look it up again next time.
                *self.target.lock().await = None;
                return Err(DeadLetterError::SendMessage(crate::aws::error_chain(&e)));
            }
        };
        Ok(Sent {
            copy_id: out.message_id.unwrap_or_default(),
            reason_attached,
        })
    }
}

/// A copy sent to the DLQ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The copy's MessageId in the DLQ: the key of the worker's log line when the reason had no room.
    pub copy_id: String,
    /// False when the message already carried SQS's ten attributes: the reason is then only in the
    /// worker's log line (keyed by `copy_id`) and counted by `qc_worker_dead_letter_reasons_unattached_total`.
    pub reason_attached: bool,
}

/// At most `max` bytes of `s`, cut at a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("ééé", 5), "éé");
        assert_eq!(truncate(&"x".repeat(5000), MAX_REASON).len(), MAX_REASON);
    }
}
