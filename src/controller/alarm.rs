//! The DLQ alarm and its finalizer: the one thing the controller manages outside the cluster.
//! The finalizer goes on before the alarm is created and comes off only after it is deleted.

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::api::QueueConsumer;
use crate::aws::cloudwatch::{AlarmDeletion, AlarmOwner, AlarmWrite, Alarms, Ensured};

use super::Error;
use super::access::AccessBinding;
use super::pipeline::{AlarmPlan, alarm_name};
use super::status::{AlarmStatus, AlarmSync};

pub use super::finalizer::{FINALIZER, has_finalizer};

/// AlarmSynced is Unknown for this reason when the alarm's description is too old to trust.
pub const ALARM_NOT_REFRESHED: &str = "AlarmNotRefreshed";

/// What an alarm sync did, for Events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AlarmChange {
    None,
    Created(String),
    Updated(String),
    Deleted(String),
}

/// What an alarm sync came to: the alarm as status shows it (with the AlarmSynced outcome), and the
/// write it made, for an Event.
#[derive(Clone, Debug, PartialEq)]
pub struct AlarmOutcome {
    pub status: AlarmStatus,
    pub change: AlarmChange,
}

impl AlarmOutcome {
    /// Nothing written: the alarm as `status` says.
    fn unchanged(status: AlarmStatus) -> AlarmOutcome {
        AlarmOutcome {
            status,
            change: AlarmChange::None,
        }
    }

    /// CloudWatch was not asked: the alarm as the last status showed it.
    pub fn not_checked(qc: &QueueConsumer) -> AlarmOutcome {
        AlarmOutcome::unchanged(previous(qc))
    }
}

/// Who an alarm belongs to: written into its tags when it is created, checked before it is deleted.
pub fn owner(qc: &QueueConsumer) -> AlarmOwner {
    AlarmOwner {
        uid: qc.metadata.uid.clone().unwrap_or_default(),
        namespace: qc.metadata.namespace.clone().unwrap_or_default(),
        name: qc.metadata.name.clone().unwrap_or_default(),
    }
}

/// The alarm as the last status showed it (kept when this reconcile did not look at CloudWatch).
pub fn previous(qc: &QueueConsumer) -> AlarmStatus {
    let dl = qc.status.as_ref().and_then(|s| s.dead_letter.as_ref());
    AlarmStatus {
        name: dl.and_then(|d| d.alarm_name.clone()),
        state: dl.and_then(|d| d.alarm_state.clone()),
        sync: AlarmSync::NotChecked,
    }
}

fn failed(previous: AlarmStatus, reason: &'static str, message: String) -> AlarmOutcome {
    AlarmOutcome::unchanged(AlarmStatus {
        sync: AlarmSync::Failed { reason, message },
        ..previous
    })
}

/// Bring the alarm in line with the plan. Never fails the reconcile: a CloudWatch (or finalizer)
/// failure comes back in `AlarmStatus::sync`, for the AlarmSynced condition and an Event, while the
/// rest of the reconcile (scaling, status) goes on.
pub async fn sync(
    qc: &QueueConsumer,
    plan: &AlarmPlan,
    alarms: &dyn Alarms,
    api: &Api<QueueConsumer>,
    access: Option<&AccessBinding>,
) -> AlarmOutcome {
    let previous = previous(qc);
    match plan {
        AlarmPlan::Unchanged => AlarmOutcome::unchanged(previous),
        AlarmPlan::Keep(want) => {
            // In namespaced mode the operator's access to this namespace is held first: a finalizer it
            // could no longer remove would hold the namespace's deletion for good.
            if !has_finalizer(qc)
                && let Err(e) = async {
                    hold_access(qc, access).await?;
                    add_finalizer(qc, api).await
                }
                .await
            {
                // No alarm without the finalizer that deletes it.
                return failed(previous, e.reason(), e.to_string());
            }
            // The controller's client answers from the background refresher's last description and
            // puts in a task of its own: the reconcile never waits for CloudWatch here.
            match alarms.ensure(want, &owner(qc)).await {
                Ensured::InSync { state, wrote } => AlarmOutcome {
                    status: AlarmStatus {
                        name: Some(want.name.clone()),
                        state: Some(state),
                        sync: AlarmSync::InSync,
                    },
                    change: match wrote {
                        None => AlarmChange::None,
                        Some(AlarmWrite::Created) => AlarmChange::Created(want.name.clone()),
                        Some(AlarmWrite::Updated) => AlarmChange::Updated(want.name.clone()),
                    },
                },
                // Known at a later reconcile; the condition stays as it was.
                Ensured::Pending => AlarmOutcome::unchanged(previous),
                Ensured::Stale { age } => AlarmOutcome::unchanged(AlarmStatus {
                    sync: AlarmSync::Unknown {
                        reason: ALARM_NOT_REFRESHED,
                        message: format!(
                            "the last description of CloudWatch alarm {} is {}s old: the background refresher is behind",
                            want.name,
                            age.as_secs()
                        ),
                    },
                    ..previous
                }),
                Ensured::Failed(e) => failed(previous, e.reason(), e.to_string()),
            }
        }
        AlarmPlan::Remove => {
            if !has_finalizer(qc) {
                return AlarmOutcome::unchanged(AlarmStatus {
                    sync: AlarmSync::NotManaged,
                    ..AlarmStatus::default()
                });
            }
            // The name from the object's identity, never from status (editable by anyone who may
            // write status): an alarm named there is not ours to delete.
            let name = alarm_name(qc);
            let change = match alarms.delete(&name, &owner(qc)).await {
                Ok(AlarmDeletion::Deleted) => AlarmChange::Deleted(name),
                Ok(AlarmDeletion::Absent) => AlarmChange::None,
                Ok(AlarmDeletion::NotOurs { why }) => {
                    tracing::warn!(alarm = %name, %why, "alarm left in place: not this QueueConsumer's");
                    AlarmChange::None
                }
                Err(e) => return failed(previous, e.reason(), e.to_string()),
            };
            if let Err(e) = remove_finalizer(qc, api).await {
                return failed(previous, e.reason(), e.to_string());
            }
            if let Err(e) = release_access(qc, access).await {
                return failed(previous, e.reason(), e.to_string());
            }
            AlarmOutcome {
                status: AlarmStatus {
                    sync: AlarmSync::NotManaged,
                    ..AlarmStatus::default()
                },
                change,
            }
        }
    }
}

/// Namespaced mode: hold the operator's RoleBinding in the QueueConsumer's namespace.
async fn hold_access(qc: &QueueConsumer, access: Option<&AccessBinding>) -> Result<(), Error> {
    match (access, qc.metadata.namespace.as_deref()) {
        (Some(access), Some(ns)) => access.hold(ns).await,
        _ => Ok(()),
    }
}

/// Namespaced mode: after a finalizer came off, let go of the operator's RoleBinding if it is being
/// deleted and nothing else there needs it.
pub async fn release_access(
    qc: &QueueConsumer,
    access: Option<&AccessBinding>,
) -> Result<(), Error> {
    match (access, qc.metadata.namespace.as_deref()) {
        (Some(access), Some(ns)) => {
            access
                .release_when_done(ns, qc.metadata.uid.as_deref())
                .await
        }
        _ => Ok(()),
    }
}

/// A finalizer patch under the operator's field manager, so `managedFields` names who holds it.
fn finalizer_params() -> PatchParams {
    PatchParams {
        field_manager: Some(super::apply::FIELD_MANAGER.to_string()),
        ..PatchParams::default()
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
    api.patch(&name, &finalizer_params(), &Patch::Json::<()>(patch))
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
    api.patch(&name, &finalizer_params(), &Patch::Json::<()>(patch))
        .await
        .map_err(Error::RemoveFinalizer)?;
    Ok(())
}
