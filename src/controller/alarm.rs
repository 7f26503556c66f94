//! The DLQ alarm and its finalizer: the one thing the controller manages outside the cluster.
//! The finalizer goes on before the alarm is created and comes off only after it is deleted.

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::api::QueueConsumer;
use crate::aws::cloudwatch::{Alarms, CloudWatchError};

use super::Error;
use super::pipeline::{AlarmPlan, alarm_name};
use super::status::AlarmStatus;

/// Finalizer that holds a QueueConsumer until its CloudWatch alarm is deleted.
pub const FINALIZER: &str = "sqs.consumers.dev/cleanup";

/// What an alarm sync did, for Events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AlarmChange {
    None,
    Created(String),
    Updated(String),
    Deleted(String),
}

pub fn has_finalizer(qc: &QueueConsumer) -> bool {
    qc.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

/// The alarm name this QueueConsumer created: recorded in status, else derived.
pub fn managed_alarm_name(qc: &QueueConsumer) -> String {
    qc.status
        .as_ref()
        .and_then(|s| s.dead_letter.as_ref())
        .and_then(|d| d.alarm_name.clone())
        .unwrap_or_else(|| alarm_name(qc))
}

/// Bring the alarm in line with the plan. Returns the alarm as status should show it, what changed,
/// and a CloudWatch failure (kept apart so the rest of the reconcile still runs and reports it).
pub async fn sync(
    qc: &QueueConsumer,
    plan: &AlarmPlan,
    alarms: &dyn Alarms,
    api: &Api<QueueConsumer>,
) -> Result<(AlarmStatus, AlarmChange, Option<CloudWatchError>), Error> {
    let previous = AlarmStatus {
        name: qc
            .status
            .as_ref()
            .and_then(|s| s.dead_letter.as_ref())
            .and_then(|d| d.alarm_name.clone()),
        state: qc
            .status
            .as_ref()
            .and_then(|s| s.dead_letter.as_ref())
            .and_then(|d| d.alarm_state.clone()),
    };
    match plan {
        AlarmPlan::Unchanged => Ok((previous, AlarmChange::None, None)),
        AlarmPlan::Keep(want) => {
            if !has_finalizer(qc) {
                add_finalizer(qc, api).await?;
            }
            let observed = match alarms.describe(&want.name).await {
                Ok(o) => o,
                Err(e) => return Ok((previous, AlarmChange::None, Some(e))),
            };
            let change = match &observed {
                Some(o) if o.spec == **want => AlarmChange::None,
                Some(_) => AlarmChange::Updated(want.name.clone()),
                None => AlarmChange::Created(want.name.clone()),
            };
            let observed = if change == AlarmChange::None {
                observed
            } else {
                if let Err(e) = alarms.put(want).await {
                    return Ok((previous, AlarmChange::None, Some(e)));
                }
                // Read back: CloudWatch decides the state of a new or changed alarm.
                alarms.describe(&want.name).await.ok().flatten()
            };
            let state = observed
                .map(|o| o.state)
                .unwrap_or_else(|| "INSUFFICIENT_DATA".to_string());
            Ok((
                AlarmStatus {
                    name: Some(want.name.clone()),
                    state: Some(state),
                },
                change,
                None,
            ))
        }
        AlarmPlan::Remove => {
            if !has_finalizer(qc) {
                return Ok((AlarmStatus::default(), AlarmChange::None, None));
            }
            let name = managed_alarm_name(qc);
            if let Err(e) = alarms.delete(&name).await {
                return Ok((previous, AlarmChange::None, Some(e)));
            }
            remove_finalizer(qc, api).await?;
            Ok((AlarmStatus::default(), AlarmChange::Deleted(name), None))
        }
    }
}

/// JSON patch guarded by a test of the current list, so a concurrent writer's finalizer is never lost
/// (the patch fails and the reconcile retries).
pub async fn add_finalizer(qc: &QueueConsumer, api: &Api<QueueConsumer>) -> Result<(), Error> {
    let name = qc.metadata.name.clone().unwrap_or_default();
    let ops = match &qc.metadata.finalizers {
        None => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
        ]),
        Some(list) => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": list},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        ]),
    };
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(Error::EncodePatch)?;
    api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(Error::AddFinalizer)?;
    Ok(())
}

pub async fn remove_finalizer(qc: &QueueConsumer, api: &Api<QueueConsumer>) -> Result<(), Error> {
    let name = qc.metadata.name.clone().unwrap_or_default();
    let Some(index) = qc
        .metadata
        .finalizers
        .iter()
        .flatten()
        .position(|f| f == FINALIZER)
    else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{index}");
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": path, "value": FINALIZER},
        {"op": "remove", "path": path},
    ]))
    .map_err(Error::EncodePatch)?;
    api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(Error::RemoveFinalizer)?;
    Ok(())
}
