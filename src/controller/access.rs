//! Namespaced mode: the RoleBinding that gives the operator its access to a watched namespace is held by a
//! finalizer of ours while a QueueConsumer there holds the alarm finalizer, and let go after the last one.
//! Deleting a namespace deletes the binding in the same sweep as the QueueConsumers (in no fixed order);
//! without this hold the operator lost the access it needs to remove their finalizers, and the namespace
//! stayed Terminating for good (docs/install.md, "Deleting a watched namespace").

use std::collections::HashSet;
use std::sync::Mutex;

use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::api::QueueConsumer;

use super::Error;
use super::apply::FIELD_MANAGER;

/// Finalizer on the operator's RoleBinding in a watched namespace.
pub const FINALIZER: &str = "sqs.consumers.dev/access";

/// How often each watched namespace's binding is checked for a release nobody else will make
/// ([`AccessBinding::sweep`]).
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The operator's RoleBinding in each watched namespace (`run --access-binding`, set by the chart in
/// namespaced mode): its name, and the namespaces where this process has seen it held.
pub struct AccessBinding {
    client: kube::Client,
    name: String,
    held: Mutex<HashSet<String>>,
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

impl AccessBinding {
    pub fn new(client: kube::Client, name: impl Into<String>) -> Self {
        AccessBinding {
            client,
            name: name.into(),
            held: Mutex::new(HashSet::new()),
        }
    }

    fn api(&self, ns: &str) -> Api<RoleBinding> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Puts the finalizer on the binding in `ns` (once a process and namespace) before a QueueConsumer
    /// there gets the alarm finalizer. A binding already being deleted cannot take a new finalizer: then
    /// the namespace (or the release) is going away, and nothing is added.
    pub async fn hold(&self, ns: &str) -> Result<(), Error> {
        if self.held.lock().is_ok_and(|h| h.contains(ns)) {
            return Ok(());
        }
        let api = self.api(ns);
        let binding = api.get(&self.name).await.map_err(Error::HoldAccess)?;
        let finalizers = binding.metadata.finalizers.clone().unwrap_or_default();
        if binding.metadata.deletion_timestamp.is_none()
            && !finalizers.iter().any(|f| f == FINALIZER)
        {
            let ops = if binding.metadata.finalizers.is_none() {
                json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": null},
                    {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
                ])
            } else {
                json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                    {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
                ])
            };
            let patch: json_patch::Patch =
                serde_json::from_value(ops).map_err(Error::EncodePatch)?;
            api.patch(&self.name, &params(), &Patch::Json::<()>(patch))
                .await
                .map_err(Error::HoldAccess)?;
            tracing::info!(namespace = ns, binding = %self.name, "holding the operator's RoleBinding while QueueConsumers here hold finalizers");
        }
        if let Ok(mut held) = self.held.lock() {
            held.insert(ns.to_string());
        }
        Ok(())
    }

    /// Takes the finalizer off the binding in `ns` when the binding is being deleted and no QueueConsumer
    /// there holds the alarm finalizer any more (`except`: the uid of one just let go, which a list may
    /// still show). The last request the operator makes in a namespace it is leaving.
    pub async fn release_if_done(&self, ns: &str, except: Option<&str>) -> Result<(), Error> {
        let api = self.api(ns);
        let Some(binding) = api
            .get_opt(&self.name)
            .await
            .map_err(Error::ReleaseAccess)?
        else {
            return Ok(());
        };
        let finalizers = binding.metadata.finalizers.clone().unwrap_or_default();
        let Some(index) = finalizers.iter().position(|f| f == FINALIZER) else {
            return Ok(());
        };
        if binding.metadata.deletion_timestamp.is_none() {
            return Ok(());
        }
        let qcs: Api<QueueConsumer> = Api::namespaced(self.client.clone(), ns);
        let holding = qcs
            .list(&ListParams::default())
            .await
            .map_err(Error::ReleaseAccess)?
            .items
            .into_iter()
            .filter(|qc| qc.metadata.uid.as_deref() != except)
            .filter(super::finalizer::has_finalizer)
            .count();
        if holding > 0 {
            tracing::debug!(
                namespace = ns,
                holding,
                "the operator's RoleBinding is being deleted; held until these QueueConsumers are cleaned up"
            );
            return Ok(());
        }
        let path = format!("/metadata/finalizers/{index}");
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": path, "value": FINALIZER},
            {"op": "remove", "path": path},
        ]))
        .map_err(Error::EncodePatch)?;
        api.patch(&self.name, &params(), &Patch::Json::<()>(patch))
            .await
            .map_err(Error::ReleaseAccess)?;
        if let Ok(mut held) = self.held.lock() {
            held.remove(ns);
        }
        tracing::info!(namespace = ns, binding = %self.name, "let go of the operator's RoleBinding: no QueueConsumer here holds a finalizer");
        Ok(())
    }

    /// At start-up, for a watched namespace: hold the binding if a QueueConsumer there holds the alarm
    /// finalizer (one an earlier version put on), else let go of it if it is being deleted (an earlier run
    /// stopped before it could).
    pub async fn settle(&self, ns: &str) -> Result<(), Error> {
        let qcs: Api<QueueConsumer> = Api::namespaced(self.client.clone(), ns);
        let any = qcs
            .list(&ListParams::default())
            .await
            .map_err(Error::HoldAccess)?
            .items
            .iter()
            .any(super::finalizer::has_finalizer);
        if any {
            self.hold(ns).await
        } else {
            self.release_if_done(ns, None).await
        }
    }

    /// Every [`SWEEP_EVERY`], [`Self::release_if_done`] for `ns` with nobody excepted; never returns
    /// (dropped with the namespace's controller). The cleanups let go at once in the common case; this
    /// catches the orders they cannot see: two QueueConsumers cleaned up together each still list the
    /// other with its finalizer, and a namespace's sweep may mark the binding for deletion only after
    /// the last QueueConsumer's cleanup has looked at it. Either way, without it the namespace stayed
    /// `Terminating` for good. One GET a namespace each time; a list only while the binding is held
    /// and being deleted.
    pub async fn sweep(&self, ns: &str) {
        loop {
            tokio::time::sleep(SWEEP_EVERY).await;
            if let Err(e) = self.release_if_done(ns, None).await {
                tracing::debug!(namespace = ns, error = %e, "checking the operator's RoleBinding");
            }
        }
    }

    /// `release_if_done`, tried up to three times a second apart: after the last QueueConsumer is gone no
    /// reconcile comes back to try again.
    pub async fn release_when_done(&self, ns: &str, except: Option<&str>) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            match self.release_if_done(ns, except).await {
                Ok(()) => return Ok(()),
                Err(e) if tries >= 2 => return Err(e),
                Err(e) => {
                    tracing::warn!(namespace = ns, error = %e, "letting go of the operator's RoleBinding failed; trying again");
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }
        }
    }
}
