//! The reconcile's error: one variant per pipeline step that can fail, with its Event reason and
//! whether it is a conflict (retried at once) or a failure (backed off).

use crate::aws::ObserveError;
use crate::aws::cloudwatch::CloudWatchError;

/// One variant per pipeline step that can fail; each becomes a Warning Event and a requeue.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("queueconsumer has no namespace")]
    MissingNamespace,
    #[error("read queue: {0}")]
    ObserveQueue(#[source] ObserveError),
    #[error("read deployment: {0}")]
    ReadDeployment(#[source] kube::Error),
    #[error("apply deployment: {0}")]
    ApplyDeployment(#[source] kube::Error),
    #[error("scale deployment: {0}")]
    ScaleDeployment(#[source] kube::Error),
    #[error("write status: {0}")]
    WriteStatus(#[source] kube::Error),
    #[error("add finalizer: {0}")]
    AddFinalizer(#[source] kube::Error),
    #[error("remove finalizer: {0}")]
    RemoveFinalizer(#[source] kube::Error),
    #[error("hold the operator's RoleBinding: {0}")]
    HoldAccess(#[source] kube::Error),
    #[error("let go of the operator's RoleBinding: {0}")]
    ReleaseAccess(#[source] kube::Error),
    #[error("encode patch: {0}")]
    EncodePatch(#[source] serde_json::Error),
    #[error("delete dead-letter alarm: {0}")]
    DeleteAlarm(#[source] CloudWatchError),
    /// The reconcile ran past its deadline (`run --reconcile-timeout`) and was cancelled.
    #[error(
        "the reconcile took longer than its deadline of {0:?} (waiting for AWS or the API server) and was cancelled; it is tried again with backoff (run --reconcile-timeout, chart reconcileTimeout)"
    )]
    DeadlineExceeded(std::time::Duration),
}

impl Error {
    /// CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::MissingNamespace => "MissingNamespace",
            Error::ObserveQueue(e) => e.reason(),
            Error::ReadDeployment(_) => "ReadDeploymentFailed",
            Error::ApplyDeployment(_) => "ApplyDeploymentFailed",
            Error::ScaleDeployment(_) => "ScaleDeploymentFailed",
            Error::WriteStatus(_) => "WriteStatusFailed",
            Error::AddFinalizer(_) => "AddFinalizerFailed",
            Error::RemoveFinalizer(_) => "RemoveFinalizerFailed",
            Error::HoldAccess(_) => "HoldAccessFailed",
            Error::ReleaseAccess(_) => "ReleaseAccessFailed",
            Error::EncodePatch(_) => "EncodePatchFailed",
            Error::DeleteAlarm(_) => "DeleteAlarmFailed",
            Error::DeadlineExceeded(_) => "ReconcileDeadlineExceeded",
        }
    }

    /// Another writer got there first (409, or a JSON-patch test that no longer holds): retry soon
    /// with fresh state rather than back off.
    pub fn is_conflict(&self) -> bool {
        let Some(kube_err) = self.kube_error() else {
            return false;
        };
        matches!(kube_err, kube::Error::Api(s) if s.code == 409 || (s.code == 422 && matches!(self, Error::AddFinalizer(_) | Error::RemoveFinalizer(_) | Error::HoldAccess(_) | Error::ReleaseAccess(_))))
    }

    /// The API server did not answer (connection refused or cut, a timeout) or answered that it cannot
    /// serve now (503, 504): nothing about this QueueConsumer failed, the cluster's API did.
    pub fn is_api_unavailable(&self) -> bool {
        match self.kube_error() {
            Some(kube::Error::Api(s)) => s.code == 503 || s.code == 504,
            Some(kube::Error::HyperError(_) | kube::Error::Service(_)) => true,
            _ => false,
        }
    }

    /// The API server's answer (or the failure to get one) of a step that talks to it.
    fn kube_error(&self) -> Option<&kube::Error> {
        let (Error::ReadDeployment(kube_err)
        | Error::ApplyDeployment(kube_err)
        | Error::ScaleDeployment(kube_err)
        | Error::WriteStatus(kube_err)
        | Error::AddFinalizer(kube_err)
        | Error::RemoveFinalizer(kube_err)
        | Error::HoldAccess(kube_err)
        | Error::ReleaseAccess(kube_err)) = self
        else {
            return None;
        };
        Some(kube_err)
    }
}
