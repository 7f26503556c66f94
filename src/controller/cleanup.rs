//! Deletion of a QueueConsumer: its CloudWatch alarm, then the finalizer that held it.

use kube::api::Api;
use kube::runtime::controller::Action;

use crate::api::QueueConsumer;
use crate::aws::ObserveError;
use crate::aws::cloudwatch::AlarmDeletion;

use super::pipeline::alarm_name;
use super::{Context, Error, alarm, observe};

/// Deletion: remove the alarm, then the finalizer. The Deployment goes by garbage collection. The
/// alarm's name comes from the object's identity (never from status, which anyone with status write
/// access can edit), and the alarm is deleted only when its tags say it is this object's.
pub(super) async fn cleanup(
    qc: &QueueConsumer,
    ctx: &Context,
    qcs: &Api<QueueConsumer>,
    clients: Result<&observe::AwsClients, &ObserveError>,
) -> Result<Action, Error> {
    if !alarm::has_finalizer(qc) {
        return Ok(Action::await_change());
    }
    let name = alarm_name(qc);
    let clients = match clients {
        Ok(c) => c,
        Err(refused) => {
            let why = match refused {
                ObserveError::EndpointNotAllowed(_) => {
                    "spec.queue.endpoint is not allowed by this operator, so no request is sent to it"
                }
                _ => {
                    "this operator's tenancy policy refuses the QueueConsumer, so no AWS call is made for it"
                }
            };
            ctx.event(
                qc,
                true,
                refused.reason(),
                format!(
                    "CloudWatch alarm {name} was not deleted: {why}; delete it by hand if it exists"
                ),
            )
            .await;
            alarm::remove_finalizer(qc, qcs).await?;
            alarm::release_access(qc, ctx.access.as_ref()).await?;
            return Ok(Action::await_change());
        }
    };
    match clients.alarms.delete(&name, &alarm::owner(qc)).await {
        Ok(AlarmDeletion::Deleted | AlarmDeletion::Absent) => {}
        Ok(AlarmDeletion::NotOurs { why }) => {
            ctx.event(
                qc,
                true,
                "AlarmNotOwned",
                format!("CloudWatch alarm {name} was left in place: {why}"),
            )
            .await;
        }
        Err(e) => {
            ctx.event(
                qc,
                true,
                e.reason(),
                format!("cannot delete CloudWatch alarm {name}: {e}; the QueueConsumer is kept until it is deleted (or remove the finalizer {} by hand)", alarm::FINALIZER),
            )
            .await;
            return Err(Error::DeleteAlarm(e));
        }
    }
    alarm::remove_finalizer(qc, qcs).await?;
    alarm::release_access(qc, ctx.access.as_ref()).await?;
    Ok(Action::await_change())
}
