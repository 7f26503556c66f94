//! What a failed SQS call was: the action (metrics are labelled by it), the kind of failure from
//! the one AWS classifier (`aws::classify`), and what an operator should do about it.

use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

/// Defined with the counters it labels (`worker::metrics`), so metrics need nothing from here.
pub use crate::worker::metrics::Action;

pub use crate::aws::classify::{ErrorKind, classify_code};

impl SqsError {
    /// What an operator should do about it, for the log line and `/readyz`.
    pub fn hint(&self) -> &'static str {
        match self.kind {
            ErrorKind::QueueDoesNotExist => {
                "check --queue-url (and --region/--endpoint-url): the queue does not exist"
            }
            ErrorKind::InvalidCredentials => {
                "check the pod's AWS credentials (IRSA role, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
            }
            ErrorKind::AccessDenied => {
                "grant sqs:ReceiveMessage, DeleteMessage, ChangeMessageVisibility and GetQueueAttributes on the queue (and kms:Decrypt on its key if it is encrypted with a customer managed key)"
            }
            ErrorKind::KmsKeyUnusable => {
                "the queue's KMS key is disabled, deleted or not usable: enable the key or change the queue's encryption"
            }
            ErrorKind::Throttled => "SQS is throttling: backing off",
            ErrorKind::ServerError => "SQS returned a server error: backing off",
            ErrorKind::EndpointUnreachable => {
                "cannot reach the SQS endpoint (check egress, HTTPS_PROXY/NO_PROXY): backing off"
            }
            ErrorKind::Timeout => "the SQS call timed out: backing off",
            _ => "backing off",
        }
    }
}

/// One failed SQS call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{action} failed ({reason}): {detail}", action = action.as_str(), reason = kind.reason())]
pub struct SqsError {
    pub action: Action,
    pub kind: ErrorKind,
    pub detail: String,
}

/// Classifies an SDK failure (after the SDK's own retries): the service's error code first, then
/// the HTTP status; transport failures by their kind.
pub(super) fn classify<E>(
    action: Action,
    endpoint: Option<&str>,
    err: SdkError<E, aws_sdk_sqs::config::http::HttpResponse>,
) -> SqsError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let kind = crate::aws::classify::classify(&err);
    let mut detail = DisplayErrorContext(&err).to_string();
    // A transport failure names where it was going: a proxy, a private endpoint or a certificate.
    if let (SdkError::DispatchFailure(_) | SdkError::TimeoutError(_), Some(endpoint)) =
        (&err, endpoint)
    {
        detail = format!("{endpoint}: {detail}");
    }
    SqsError {
        action,
        kind,
        detail,
    }
}

/// A batch entry the SDK refused to build (a required field missing): a bug, not an SQS answer.
pub(super) fn invalid_request(action: Action, e: &dyn std::error::Error) -> SqsError {
    SqsError {
        action,
        kind: ErrorKind::InvalidParameter,
        detail: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_sqs::error::ConnectorError;
    use aws_sdk_sqs::operation::receive_message::ReceiveMessageError;

    fn service_error(status: u16, code: Option<&str>) -> SqsError {
        classify(
            Action::ReceiveMessage,
            Some("https://sqs.test"),
            crate::aws::classify::service_error(status, code),
        )
    }

    #[test]
    fn an_error_keeps_its_code_and_a_transport_failure_names_its_endpoint() {
        // The kind is aws::classify's (its tests cover the table, statuses and transport kinds).
        let e = service_error(400, Some("KMS.DisabledException"));
        assert_eq!(e.kind, ErrorKind::KmsKeyUnusable);
        assert!(e.detail.contains("KMS.DisabledException"), "{}", e.detail);
        assert!(!e.detail.contains("sqs.test"), "{}", e.detail);

        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let refused: SdkError<ReceiveMessageError, aws_sdk_sqs::config::http::HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io(io.into()));
        let e = classify(Action::ReceiveMessage, Some("https://sqs.test"), refused);
        assert_eq!(e.kind, ErrorKind::EndpointUnreachable);
        assert!(
            e.detail.starts_with("https://sqs.test: ") && e.detail.contains("refused"),
            "{}",
            e.detail
        );
        let slow: SdkError<ReceiveMessageError, aws_sdk_sqs::config::http::HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::timeout("slow".into()));
        let e = classify(Action::ReceiveMessage, Some("https://sqs.test"), slow);
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.detail.starts_with("https://sqs.test: "), "{}", e.detail);
    }

    #[test]
    fn operations_map_to_actions() {
        for a in Action::ALL {
            assert_eq!(Action::from_operation(a.as_str()), Some(a));
        }
        assert_eq!(Action::from_operation("SendMessage"), None);
    }
}
