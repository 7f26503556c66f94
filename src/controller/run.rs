//! `qc-operator run`: one kube Controller per watched namespace (or one for all), the /metrics,
//! /healthz and /readyz endpoints, and Lease-based leader election so two replicas can run.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use futures::future::{BoxFuture, FutureExt, Shared};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{Controller, controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube_lease_manager::LeaseManagerBuilder;

use crate::api::QueueConsumer;
use crate::render::{LABEL_MANAGED_BY, MANAGED_BY_VALUE};
use crate::telemetry::{self, Exposition, Probes, TelemetryError};

use super::apply::FIELD_MANAGER;
use super::{Context, error_policy, reconcile, triggers};

/// Leader election on a coordination.k8s.io/v1 Lease.
#[derive(Clone, Debug)]
pub struct LeaderOptions {
    pub lease_name: String,
    pub lease_namespace: String,
    /// This replica's identity in the Lease (the pod name).
    pub identity: String,
    /// How long a holder's claim lasts without renewal; a standby takes over after this.
    pub lease_seconds: u64,
    /// The holder renews this long before expiry (also the clock skew tolerated between nodes).
    pub grace_seconds: u64,
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Namespaces to watch; empty: all.
    pub namespaces: Vec<String>,
    pub metrics_addr: SocketAddr,
    pub leader: Option<LeaderOptions>,
    /// Reconciles run at once by each controller (one per watched namespace, or one for all).
    pub reconcile_concurrency: u16,
}

/// Reconciles at once by default. A reconcile mostly waits (SQS, the API server, the pods' scrapes) and
/// the AWS gates, not reconciles, bound the AWS calls; the bound keeps a burst of watch events from
/// running thousands of reconciles (and holding their memory) at once. The ones past it wait, before
/// doing anything, for a slot in their namespace's turn (`slots::Slots`).
pub const DEFAULT_RECONCILE_CONCURRENCY: u16 = 64;

/// Why `run` stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    BindMetrics(#[from] TelemetryError),
    #[error("set up leader election on lease {namespace}/{name}: {source}")]
    StartLeaderElection {
        namespace: String,
        name: String,
        source: kube_lease_manager::LeaseManagerError,
    },
    #[error("lost the leader lease {namespace}/{name}: stopping so that only the new leader acts")]
    LostLease { namespace: String, name: String },
}

/// Liveness and readiness as the endpoints report them.
#[derive(Default)]
pub struct Health {
    pub ready: AtomicBool,
    pub leading: AtomicBool,
}

type Stop = Shared<BoxFuture<'static, ()>>;

/// Run until `shutdown` resolves (graceful: reconciles in flight finish) or the lease is lost.
pub async fn run(
    ctx: Arc<Context>,
    opts: RunOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let health = Arc::new(Health::default());
    let listener = telemetry::bind_probes(&opts.metrics_addr.to_string()).await?;
    tracing::info!(addr = %opts.metrics_addr, "serving /metrics, /healthz and /readyz");
    let probes = Arc::new(ControllerProbes {
        ctx: ctx.clone(),
        health: health.clone(),
    });
    let server = tokio::spawn(telemetry::serve_probes(
        listener,
        probes,
        std::future::pending(),
    ));
    let shutdown: Stop = shutdown.boxed().shared();
    let result = match &opts.leader {
        None => {
            health.ready.store(true, Ordering::Relaxed);
            health.leading.store(true, Ordering::Relaxed);
            controllers(&ctx, &opts.namespaces, opts.reconcile_concurrency, shutdown).await;
            Ok(())
        }
        Some(leader) => lead(&ctx, &opts, leader, &health, shutdown).await,
    };
    server.abort();
    result
}

async fn lead(
    ctx: &Arc<Context>,
    opts: &RunOptions,
    leader: &LeaderOptions,
    health: &Health,
    shutdown: Stop,
) -> Result<(), RunError> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &leader.lease_namespace);
    ensure_lease(&leases, leader).await;
    tracing::info!(lease = %leader.lease_name, identity = %leader.identity, "waiting for the leader lease");
    // A standby tries for the Lease when it expires (the manager's own timer) or as soon as a watch shows it
    // released: a leader that steps down clears the holder, and waiting out the lease duration would leave
    // the QueueConsumers without a controller for that long. A manager built afresh reads the Lease anew.
    let mut built = false;
    let manager = loop {
        // The first failure stops `run` (a Lease it can never read is a set-up error); later ones retry.
        let manager = match build_manager(ctx, leader).await {
            Ok(manager) => manager,
            Err(e) if !built => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "leader election: reading the lease failed; trying again");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        built = true;
        // A standby is healthy and ready: it only waits.
        health.ready.store(true, Ordering::Relaxed);
        tokio::select! {
            changed = manager.changed() => match changed {
                Ok(true) => break manager,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, lease = %leader.lease_name, "leader election: reading the lease failed; trying again");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            },
            () = released(&leases, &leader.lease_name) => {
                tracing::debug!(lease = %leader.lease_name, "the leader released the lease");
            }
            () = shutdown.clone() => return Ok(()),
        }
    };
    // The manager renews from here on; dropping the receiver makes it release the Lease and stop.
    let (mut leading, task) = manager.watch().await;
    health.leading.store(true, Ordering::Relaxed);
    tracing::info!(identity = %leader.identity, "became the leader");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop: Stop = async move {
        let _ = stop_rx.await;
    }
    .boxed()
    .shared();
    let running = controllers(ctx, &opts.namespaces, opts.reconcile_concurrency, stop);
    tokio::pin!(running);
    let lost_lease = tokio::select! {
        () = &mut running => false,
        () = shutdown.clone() => false,
        _ = leading.wait_for(|l| !*l) => true,
    };
    let _ = stop_tx.send(());
    running.await;
    health.leading.store(false, Ordering::Relaxed);
    drop(leading);
    // The manager releases the lease when its channel closes, so a standby takes over at once.
    let _ = task.await;
    if lost_lease {
        Err(lost(leader))
    } else {
        tracing::info!("stopped; the leader lease is released");
        Ok(())
    }
}

fn lost(leader: &LeaderOptions) -> RunError {
    RunError::LostLease {
        namespace: leader.lease_namespace.clone(),
        name: leader.lease_name.clone(),
    }
}

/// The field manager of one replica's Lease writes: its own. The lease manager takes an orphaned Lease with
/// a server-side apply that is not forced, which the API server refuses (409) when another manager holds
/// `holderIdentity`; under one shared name both replicas' applies succeed, the later overwriting the
/// earlier, and two replicas starting together both led until the next renewal showed one of them the
/// other's name (seen on the real node: both scaled the same Deployment in the same second). At most
/// 128 characters, the API server's limit.
pub fn lease_field_manager(identity: &str) -> String {
    let name = format!("{FIELD_MANAGER}.{identity}");
    name.chars().take(128).collect()
}

async fn build_manager(
    ctx: &Context,
    leader: &LeaderOptions,
) -> Result<kube_lease_manager::LeaseManager, RunError> {
    LeaseManagerBuilder::new(ctx.client.clone(), &leader.lease_name)
        .with_namespace(&leader.lease_namespace)
        .with_identity(&leader.identity)
        .with_duration(leader.lease_seconds)
        .with_grace(leader.grace_seconds)
        .with_field_manager(lease_field_manager(&leader.identity))
        .build()
        .await
        .map_err(|source| RunError::StartLeaderElection {
            namespace: leader.lease_namespace.clone(),
            name: leader.lease_name.clone(),
            source,
        })
}

/// Creates the Lease under the operator's field manager when it is missing (the lease manager would create
/// it without one). Any failure is left to the lease manager, which creates it or says why it cannot.
async fn ensure_lease(leases: &Api<Lease>, leader: &LeaderOptions) {
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(leader.lease_name.clone()),
            ..kube::api::ObjectMeta::default()
        },
        spec: None,
    };
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    };
    if let Ok(None) = leases.get_opt(&leader.lease_name).await
        && let Err(e) = leases.create(&params, &lease).await
    {
        tracing::debug!(error = %e, lease = %leader.lease_name, "creating the lease");
    }
}

/// Resolves when a watch of the Lease shows it released: a change to no holder after the watch began (what
/// the initial list shows, the lease manager has just read itself). Watch errors (the chart grants list and
/// watch of this Lease; an older Role may not) only delay a takeover: the lease manager's own timer still
/// takes over after the lease duration.
async fn released(leases: &Api<Lease>, name: &str) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = watcher(leases.clone(), config).default_backoff();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(lease)) => {
                let holder = lease.spec.and_then(|s| s.holder_identity);
                if holder.is_none_or(|h| h.is_empty()) {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, lease = %name, "watching the lease"),
        }
    }
    std::future::pending::<()>().await;
}

/// One Controller per namespace, all sharing the context (and so the facts cache).
async fn controllers(ctx: &Arc<Context>, namespaces: &[String], concurrency: u16, stop: Stop) {
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    };
    // kube's scheduler starts every due reconcile; they wait for one of these slots in their
    // namespace's turn (`slots`), not in the order they fell due.
    ctx.reconcile_slots
        .set_capacity(usize::from(concurrency.max(1)) * scopes.len());
    let runs = scopes.into_iter().map(|ns| {
        let ctx = ctx.clone();
        let stop = stop.clone();
        async move {
            let client = ctx.client.clone();
            let (qcs, deployments): (Api<QueueConsumer>, Api<Deployment>) = match &ns {
                Some(n) => (
                    Api::namespaced(client.clone(), n),
                    Api::namespaced(client, n),
                ),
                None => (Api::all(client.clone()), Api::all(client)),
            };
            tracing::info!(
                namespace = ns.as_deref().unwrap_or("<all>"),
                "watching QueueConsumers"
            );
            if let (Some(access), Some(n)) = (ctx.access.as_ref(), ns.as_deref())
                && let Err(e) = access.settle(n).await
            {
                tracing::warn!(namespace = n, error = %e, "cannot check the operator's RoleBinding");
            }
            // Only our Deployments: a cluster's other Deployments are neither cached nor watched.
            let owned = watcher::Config::default()
                .labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY_VALUE}"));
            // Every change goes into the cache the reconciles read; only changes the controller did
            // not make itself and would act on trigger a reconcile between polls (`triggers`).
            let (store, writer) = reflector::store();
            let seen = ctx.clone();
            let consumers = triggers::changes(
                watcher(qcs, watcher::Config::default())
                    .default_backoff()
                    .modify(super::cache::trim)
                    .reflect(writer)
                    // A status this process wrote is let go of once the cache holds it.
                    .inspect(move |event| {
                        if let Ok(watcher::Event::Apply(qc) | watcher::Event::InitApply(qc)) = event
                        {
                            seen.status_seen(qc);
                        }
                    }),
                triggers::consumer_fingerprint,
                triggers::FirstSight::Passes,
            );
            let children = triggers::changes(
                watcher(deployments, owned).default_backoff(),
                triggers::deployment_fingerprint,
                triggers::created_deployment(),
            );
            ctx.watch_store(store.clone());
            let sweep_ctx = ctx.clone();
            let controller = Controller::for_stream(consumers, store)
                .with_config(controller::Config::default())
                .owns_stream(children)
                .graceful_shutdown_on(stop)
                .run(reconcile, error_policy, ctx)
                .for_each(|res| async move {
                    match res {
                        Ok((obj, _)) => tracing::debug!(queueconsumer = %obj, "reconciled"),
                        Err(e) => tracing::debug!(error = %e, "reconcile failed"),
                    }
                });
            // Namespaced mode: the binding's release that no cleanup makes (`AccessBinding::sweep`)
            // runs as long as this namespace's controller.
            let sweep = async {
                match (sweep_ctx.access.as_ref(), ns.as_deref()) {
                    (Some(access), Some(n)) => access.sweep(n).await,
                    _ => std::future::pending().await,
                }
            };
            futures::pin_mut!(controller, sweep);
            futures::future::select(controller, sweep).await;
        }
    });
    futures::future::join_all(runs).await;
}

/// What the controller's `/metrics`, `/healthz` and `/readyz` answer (served by
/// `telemetry::serve_probes`, as the worker's are).
struct ControllerProbes {
    ctx: Arc<Context>,
    health: Arc<Health>,
}

impl Probes for ControllerProbes {
    fn metrics(&self) -> crate::telemetry::MetricsBody {
        metrics_body(&self.ctx, &self.health)
    }

    fn live(&self) -> Result<(), String> {
        Ok(())
    }

    fn ready(&self) -> Result<(), String> {
        if self.health.ready.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("starting".to_string())
        }
    }
}

/// The families of the controller process rather than of its QueueConsumers: whether it leads, its work
/// queue (reconciles `(running, waiting)`), its Kubernetes API requests, its build and its process.
pub fn render_process_state(e: &mut Exposition, leading: bool, (running, waiting): (usize, usize)) {
    e.gauge(
        "qc_leader",
        "Whether this replica holds the leader lease (1) or stands by (0).",
        &[(&[], i64::from(leading))],
    );
    e.gauge(
        "qc_reconciles_running",
        "Reconciles running now (at most --reconcile-concurrency per watched namespace).",
        &[(&[], i64::try_from(running).unwrap_or(i64::MAX))],
    );
    e.gauge(
        "qc_reconciles_waiting",
        "Reconciles due and waiting for a slot: the controller's work queue.",
        &[(&[], i64::try_from(waiting).unwrap_or(i64::MAX))],
    );
    super::client::render_into(e);
    crate::process_metrics::render_into(e);
}

/// Consumers whose series one part of `/metrics` carries: at ~100 bytes a sample, a part of a
/// family is some tens of kilobytes.
const SERIES_PART: usize = 256;

/// The controller's exposition: its counters, the AWS gates and whether it leads, at once; then the
/// per-QueueConsumer series (of consumers that still exist), family by family in parts of
/// [`SERIES_PART`] consumers, each rendered as the client reads.
pub fn metrics_body(ctx: &Arc<Context>, health: &Health) -> crate::telemetry::MetricsBody {
    ctx.forget_deleted_consumers();
    let mut e = Exposition::new();
    ctx.metrics.render_totals(&mut e);
    render_process_state(
        &mut e,
        health.leading.load(Ordering::Relaxed),
        ctx.reconcile_slots.load(),
    );
    let mut head = e.finish();
    head.push_str(&ctx.aws.metrics());
    let ctx = ctx.clone();
    let mut cursor = super::series::Cursor::default();
    let rest = std::iter::from_fn(move || {
        let mut e = Exposition::new();
        ctx.metrics
            .consumers
            .render_part(&mut e, &mut cursor, SERIES_PART)
            .then(|| e.finish())
    });
    crate::telemetry::MetricsBody {
        head,
        rest: Some(Box::new(rest)),
    }
}
