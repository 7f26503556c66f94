//! The one AWS error classifier: what kind of failure an SDK call had, from its error code, then its
//! HTTP status, then the kind of transport failure. The controller's SQS and CloudWatch adapters,
//! DLQ redrive and the worker all classify through here, so one code never means two things.

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;

/// What kind of failure an AWS call had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    QueueDoesNotExist,
    /// A CloudWatch resource (an alarm) that is not there.
    ResourceNotFound,
    InvalidCredentials,
    AccessDenied,
    /// The queue's KMS key is disabled, missing, in the wrong state or not opted in.
    KmsKeyUnusable,
    Throttled,
    ServerError,
    EndpointUnreachable,
    Timeout,
    InvalidReceiptHandle,
    InvalidParameter,
    /// SQS's `InvalidAddress`: the queue URL is not one it accepts.
    InvalidQueueUrl,
    /// The SDK could not build the request (region, endpoint, configuration).
    InvalidConfiguration,
    /// An answer that is not an AWS error document (no code, or a body the SDK could not read).
    BadResponse,
    Other,
}

impl ErrorKind {
    /// CamelCase reason, as in conditions, Events, logs and `reason` metric labels.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorKind::QueueDoesNotExist => "QueueDoesNotExist",
            ErrorKind::ResourceNotFound => "ResourceNotFound",
            ErrorKind::InvalidCredentials => "InvalidCredentials",
            ErrorKind::AccessDenied => "AccessDenied",
            ErrorKind::KmsKeyUnusable => "KmsKeyUnusable",
            ErrorKind::Throttled => "Throttled",
            ErrorKind::ServerError => "ServerError",
            ErrorKind::EndpointUnreachable => "EndpointUnreachable",
            ErrorKind::Timeout => "Timeout",
            ErrorKind::InvalidReceiptHandle => "InvalidReceiptHandle",
            ErrorKind::InvalidParameter => "InvalidParameter",
            ErrorKind::InvalidQueueUrl => "InvalidQueueUrl",
            ErrorKind::InvalidConfiguration => "InvalidConfiguration",
            ErrorKind::BadResponse => "BadResponse",
            ErrorKind::Other => "AwsError",
        }
    }

    /// Misconfiguration that retrying will not fix: the worker reports not ready until it clears.
    pub fn is_configuration(self) -> bool {
        matches!(
            self,
            ErrorKind::QueueDoesNotExist
                | ErrorKind::InvalidCredentials
                | ErrorKind::AccessDenied
                | ErrorKind::KmsKeyUnusable
        )
    }

    /// The request never got an answer (no route, refused, or too slow).
    pub fn is_transport(self) -> bool {
        matches!(self, ErrorKind::EndpointUnreachable | ErrorKind::Timeout)
    }
}

/// The kind of an AWS error code. SQS sends the awsQuery-compatible spelling in `x-amzn-query-error`
/// (`AWS.SimpleQueueService.NonExistentQueue`, `KMS.ThrottlingException`), which the SDK reports;
/// the JSON spellings are listed too for endpoints and emulators that send only those. CloudWatch's
/// codes (`ResourceNotFound`, `RequestLimitExceeded`) are in the same table.
pub fn classify_code(code: &str) -> Option<ErrorKind> {
    Some(match code {
        "AWS.SimpleQueueService.NonExistentQueue"
        | "QueueDoesNotExist"
        | "QueueDoesNotExistException" => ErrorKind::QueueDoesNotExist,
        "ResourceNotFound" | "ResourceNotFoundException" => ErrorKind::ResourceNotFound,
        "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "UnrecognizedClientException"
        | "ExpiredToken"
        | "ExpiredTokenException"
        | "RequestExpired"
        | "InvalidSecurity"
        | "MissingAuthenticationToken"
        | "IncompleteSignature" => ErrorKind::InvalidCredentials,
        "AccessDenied"
        | "AccessDeniedException"
        | "KMS.AccessDeniedException"
        | "KmsAccessDenied" => ErrorKind::AccessDenied,
        "KMS.DisabledException"
        | "KmsDisabled"
        | "KMS.NotFoundException"
        | "KmsNotFound"
        | "KMS.InvalidStateException"
        | "KmsInvalidState"
        | "KMS.InvalidKeyUsageException"
        | "KmsInvalidKeyUsage"
        | "KMS.OptInRequired"
        | "KmsOptInRequired" => ErrorKind::KmsKeyUnusable,
        "Throttling"
        | "ThrottlingException"
        | "ThrottledException"
        | "RequestThrottled"
        | "RequestLimitExceeded"
        | "TooManyRequestsException"
        | "OverLimit"
        | "KMS.ThrottlingException"
        | "KmsThrottled" => ErrorKind::Throttled,
        "ReceiptHandleIsInvalid" | "InvalidReceiptHandle" | "MessageNotInflight" => {
            ErrorKind::InvalidReceiptHandle
        }
        "InvalidParameterValue" | "InvalidParameterValueException" => ErrorKind::InvalidParameter,
        "InvalidAddress" => ErrorKind::InvalidQueueUrl,
        "InternalError" | "InternalFailure" | "ServiceUnavailable" => ErrorKind::ServerError,
        _ => return None,
    })
}

/// Classifies an SDK failure (after the SDK's own retries): a service error by its code, else by its
/// HTTP status; a transport failure by its kind (credentials are resolved while the request is
/// dispatched, so their failure arrives as a dispatch failure).
pub fn classify<E>(err: &SdkError<E, HttpResponse>) -> ErrorKind
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    match err {
        SdkError::TimeoutError(_) => ErrorKind::Timeout,
        SdkError::DispatchFailure(d) if d.is_timeout() => ErrorKind::Timeout,
        SdkError::DispatchFailure(_) if has_credentials_error(err) => ErrorKind::InvalidCredentials,
        SdkError::DispatchFailure(_) => ErrorKind::EndpointUnreachable,
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            match s.err().code() {
                Some(code) => match classify_code(code) {
                    Some(kind) => kind,
                    None => by_status(status).unwrap_or(ErrorKind::Other),
                },
                None => by_status(status).unwrap_or(ErrorKind::BadResponse),
            }
        }
        SdkError::ConstructionFailure(_) => ErrorKind::InvalidConfiguration,
        SdkError::ResponseError(r) if r.raw().status().as_u16() >= 500 => ErrorKind::ServerError,
        SdkError::ResponseError(_) => ErrorKind::BadResponse,
        _ => ErrorKind::Other,
    }
}

fn by_status(status: u16) -> Option<ErrorKind> {
    match status {
        403 => Some(ErrorKind::AccessDenied),
        429 => Some(ErrorKind::Throttled),
        500.. => Some(ErrorKind::ServerError),
        _ => None,
    }
}

/// Whether a credentials provider's error is in the chain (no credentials, IRSA token unreadable).
pub fn has_credentials_error(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if e.downcast_ref::<aws_credential_types::provider::error::CredentialsError>()
            .is_some()
        {
            return true;
        }
        cur = e.source();
    }
    false
}

/// A service error as the SDK reports it: the HTTP `status` and, if any, the error `code`; for the
/// tests of this classifier and of the adapters that classify through it.
///
/// # Panics
///
/// On a `status` that is not an HTTP status (100-999).
#[cfg(test)]
pub fn service_error(
    status: u16,
    code: Option<&str>,
) -> SdkError<aws_sdk_sqs::operation::receive_message::ReceiveMessageError, HttpResponse> {
    let mut meta = aws_sdk_sqs::error::ErrorMetadata::builder().message("from the test");
    if let Some(code) = code {
        meta = meta.code(code);
    }
    let raw = HttpResponse::new(
        status.try_into().expect("an HTTP status"),
        aws_smithy_types::body::SdkBody::empty(),
    );
    SdkError::service_error(
        aws_sdk_sqs::operation::receive_message::ReceiveMessageError::generic(meta.build()),
        raw,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_sqs::operation::receive_message::ReceiveMessageError;
    use aws_smithy_runtime_api::client::result::ConnectorError;

    fn service(status: u16, code: Option<&str>) -> ErrorKind {
        classify(&service_error(status, code))
    }

    #[test]
    fn every_family_of_codes_has_its_kind() {
        for (code, kind) in [
            (
                "AWS.SimpleQueueService.NonExistentQueue",
                ErrorKind::QueueDoesNotExist,
            ),
            ("QueueDoesNotExist", ErrorKind::QueueDoesNotExist),
            ("QueueDoesNotExistException", ErrorKind::QueueDoesNotExist),
            ("ResourceNotFound", ErrorKind::ResourceNotFound),
            ("InvalidClientTokenId", ErrorKind::InvalidCredentials),
            ("SignatureDoesNotMatch", ErrorKind::InvalidCredentials),
            ("ExpiredToken", ErrorKind::InvalidCredentials),
            ("UnrecognizedClientException", ErrorKind::InvalidCredentials),
            ("KmsAccessDenied", ErrorKind::AccessDenied),
            ("KMS.AccessDeniedException", ErrorKind::AccessDenied),
            ("KMS.InvalidStateException", ErrorKind::KmsKeyUnusable),
            ("KMS.DisabledException", ErrorKind::KmsKeyUnusable),
            ("KMS.NotFoundException", ErrorKind::KmsKeyUnusable),
            ("KMS.OptInRequired", ErrorKind::KmsKeyUnusable),
            ("KmsThrottled", ErrorKind::Throttled),
            ("KMS.ThrottlingException", ErrorKind::Throttled),
            ("RequestThrottled", ErrorKind::Throttled),
            ("ThrottlingException", ErrorKind::Throttled),
            ("RequestLimitExceeded", ErrorKind::Throttled),
            ("Throttling", ErrorKind::Throttled),
            ("ReceiptHandleIsInvalid", ErrorKind::InvalidReceiptHandle),
            ("MessageNotInflight", ErrorKind::InvalidReceiptHandle),
            ("InvalidParameterValue", ErrorKind::InvalidParameter),
            ("InvalidAddress", ErrorKind::InvalidQueueUrl),
            ("ServiceUnavailable", ErrorKind::ServerError),
        ] {
            assert_eq!(classify_code(code), Some(kind), "{code}");
        }
        assert_eq!(classify_code("SomethingNew"), None);
        assert!(ErrorKind::AccessDenied.is_configuration());
        assert!(ErrorKind::KmsKeyUnusable.is_configuration());
        assert!(!ErrorKind::Throttled.is_configuration());
    }

    #[test]
    fn a_known_code_wins_over_the_status_and_an_unknown_one_falls_back_to_it() {
        assert_eq!(
            service(503, Some("ThrottlingException")),
            ErrorKind::Throttled
        );
        assert_eq!(service(403, Some("Novel")), ErrorKind::AccessDenied);
        assert_eq!(service(400, Some("Novel")), ErrorKind::Other);
        assert_eq!(service(400, None), ErrorKind::BadResponse);
        assert_eq!(service(502, None), ErrorKind::ServerError);
        assert_eq!(service(429, None), ErrorKind::Throttled);
    }

    #[test]
    fn transport_failures_are_unreachable_or_timeouts() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let refused: SdkError<ReceiveMessageError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::io(io.into()));
        assert_eq!(classify(&refused), ErrorKind::EndpointUnreachable);
        let slow: SdkError<ReceiveMessageError, HttpResponse> =
            SdkError::dispatch_failure(ConnectorError::timeout("slow".into()));
        assert_eq!(classify(&slow), ErrorKind::Timeout);
        assert!(ErrorKind::Timeout.is_transport());
        assert!(!ErrorKind::Throttled.is_transport());
    }
}
