//! The operator administrator's floors and caps (chart `limits`, `run --min-poll-interval` ...): what a
//! tenant's spec may ask of the shared AWS budgets and the cluster. Pure: (spec, limits) in, the spec
//! the controller runs and the findings that say what was changed out. Never a silent change: every
//! value the controller does not run as written has a finding naming the field, the limit and the fix.

use crate::api::{Duration, Finding, QueueConsumerSpec, Severity};

pub const POLL_INTERVAL_BELOW_FLOOR: &str = "PollIntervalBelowOperatorFloor";
pub const MAX_REPLICAS_ABOVE_CAP: &str = "MaxReplicasAboveOperatorCap";
pub const CONCURRENCY_ABOVE_MEMORY_CAP: &str = "ConcurrencyAboveOperatorMemoryCap";
pub const NAMESPACE_CONSUMER_CAP_REACHED: &str = "NamespaceConsumerCapReached";

/// Every code of this module, in the order docs/rules.md describes them.
pub const ALL: &[&str] = &[
    POLL_INTERVAL_BELOW_FLOOR,
    MAX_REPLICAS_ABOVE_CAP,
    CONCURRENCY_ABOVE_MEMORY_CAP,
    NAMESPACE_CONSUMER_CAP_REACHED,
];

/// The memory the concurrency cap is counted per: the worker container's default limit.
pub const MEMORY_UNIT_BYTES: u64 = 128 * 1024 * 1024;

/// The administrator's limits; None: no limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdminLimits {
    /// Least `spec.scaling.pollInterval` the controller polls at.
    pub min_poll_interval: Option<Duration>,
    /// Most `spec.scaling.maxReplicas` the controller scales to.
    pub max_replicas: Option<u32>,
    /// Most `spec.processing.concurrency` per 128Mi of the worker container's memory limit.
    pub max_concurrency_per_128mi: Option<u32>,
    /// Most QueueConsumers the controller runs in one namespace (the oldest ones).
    pub max_consumers_per_namespace: Option<u32>,
}

/// What the controller runs of a spec under the limits.
#[derive(Clone, Debug, PartialEq)]
pub enum Limited {
    /// The spec, clamped where it went past a limit; a finding (Warning) for each clamped field.
    Run {
        spec: Box<QueueConsumerSpec>,
        findings: Vec<Finding>,
    },
    /// The namespace already has as many QueueConsumers as allowed, all older than this one: it gets
    /// no AWS call and no rollout (an Error finding says so).
    Refused(Finding),
}

impl AdminLimits {
    pub fn is_empty(&self) -> bool {
        *self == AdminLimits::default()
    }

    /// The spec as the controller runs it. `older_in_namespace`: QueueConsumers of the same namespace
    /// created before this one (by creation time, then name); None when not known (`check`, `plan`),
    /// which skips the namespace cap.
    pub fn apply(&self, spec: &QueueConsumerSpec, older_in_namespace: Option<usize>) -> Limited {
        if let (Some(cap), Some(older)) = (self.max_consumers_per_namespace, older_in_namespace)
            && older >= cap as usize
        {
            return Limited::Refused(Finding {
                code: NAMESPACE_CONSUMER_CAP_REACHED.into(),
                severity: Severity::Error,
                message: format!(
                    "this namespace already has {older} older QueueConsumer(s) and the operator allows at most {cap} per namespace (limits.maxConsumersPerNamespace): this one is not run (no AWS call, no rollout)"
                ),
                recommendation: format!(
                    "delete QueueConsumers this namespace no longer needs (at most {cap}), or ask the operator's administrator to raise limits.maxConsumersPerNamespace"
                ),
            });
        }
        let mut spec = spec.clone();
        let mut findings = Vec::new();
        if let Some(floor) = self.min_poll_interval
            && spec.scaling.poll_interval < floor
        {
            findings.push(Finding {
                code: POLL_INTERVAL_BELOW_FLOOR.into(),
                severity: Severity::Warning,
                message: format!(
                    "spec.scaling.pollInterval is {} but the operator polls no more often than every {floor} (limits.minPollInterval): the queue is read every {floor}",
                    spec.scaling.poll_interval
                ),
                recommendation: format!("set spec.scaling.pollInterval to {floor} or more"),
            });
            spec.scaling.poll_interval = floor;
        }
        if let Some(cap) = self.max_replicas
            && spec.scaling.max_replicas > cap
        {
            findings.push(Finding {
                code: MAX_REPLICAS_ABOVE_CAP.into(),
                severity: Severity::Warning,
                message: format!(
                    "spec.scaling.maxReplicas is {} but the operator runs at most {cap} replicas per QueueConsumer (limits.maxReplicas): it scales to {cap} at most",
                    spec.scaling.max_replicas
                ),
                recommendation: format!("set spec.scaling.maxReplicas to {cap} or less"),
            });
            spec.scaling.max_replicas = cap;
            spec.scaling.min_replicas = spec.scaling.min_replicas.min(cap);
        }
        if let Some(per_unit) = self.max_concurrency_per_128mi {
            let (memory, bytes) = worker_memory(&spec);
            let units = (bytes / MEMORY_UNIT_BYTES).max(1);
            let cap = u32::try_from(units.saturating_mul(u64::from(per_unit)))
                .unwrap_or(u32::MAX)
                .max(1);
            if spec.processing.concurrency > cap {
                let needs = u64::from(spec.processing.concurrency)
                    .div_ceil(u64::from(per_unit.max(1)))
                    .saturating_mul(128);
                findings.push(Finding {
                    code: CONCURRENCY_ABOVE_MEMORY_CAP.into(),
                    severity: Severity::Warning,
                    message: format!(
                        "spec.processing.concurrency is {} but the operator allows {per_unit} per 128Mi of the worker's memory (limits.maxConcurrencyPer128Mi), {cap} for its {memory}: each replica handles {cap} at once",
                        spec.processing.concurrency
                    ),
                    recommendation: format!(
                        "set spec.processing.concurrency to {cap} or less, or spec.worker.resources.limits.memory to {needs}Mi or more"
                    ),
                });
                spec.processing.concurrency = cap;
            }
        }
        Limited::Run {
            spec: Box::new(spec),
            findings,
        }
    }
}

/// The worker container's memory as the cap counts it: its limit, else its request, else the default
/// limit (128Mi); (as written, bytes).
fn worker_memory(spec: &QueueConsumerSpec) -> (String, u64) {
    let r = &spec.worker.resources;
    let written = r.limits.memory.as_ref().or(r.requests.memory.as_ref());
    written
        .and_then(|q| Some((format!("memory limit {}", q.0), bytes(&q.0)?)))
        .unwrap_or_else(|| ("default memory limit 128Mi".into(), MEMORY_UNIT_BYTES))
}

/// Whole bytes of a memory quantity (rounded down); None for a negative or unreadable one.
fn bytes(q: &str) -> Option<u64> {
    let (mantissa, exp10) = crate::api::quantity::value(q)?;
    let mut n = u64::try_from(mantissa).ok()?;
    if exp10 >= 0 {
        for _ in 0..exp10 {
            n = n.saturating_mul(10);
        }
    } else {
        for _ in 0..exp10.unsigned_abs().min(40) {
            n /= 10;
        }
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Quantity, ResourceAmounts, WorkerResources};

    fn spec() -> QueueConsumerSpec {
        serde_json::from_value(serde_json::json!({
            "queue": {"url": "https://sqs.us-east-1.amazonaws.com/1/orders"},
            "processing": {"p99": "2s", "concurrency": 10000},
            "handler": {"http": {}},
            "scaling": {"minReplicas": 5, "maxReplicas": 2_147_483_647, "pollInterval": "1s"},
            "template": {"spec": {"containers": [{"name": "app", "image": "x"}]}}
        }))
        .unwrap()
    }

    fn limits() -> AdminLimits {
        AdminLimits {
            min_poll_interval: Some(Duration::from_secs(10)),
            max_replicas: Some(50),
            max_concurrency_per_128mi: Some(100),
            max_consumers_per_namespace: Some(3),
        }
    }

    fn run(l: &Limited) -> (&QueueConsumerSpec, &[Finding]) {
        match l {
            Limited::Run { spec, findings } => (spec, findings),
            Limited::Refused(f) => panic!("refused: {f:?}"),
        }
    }

    #[test]
    fn a_spec_past_every_limit_is_clamped_and_each_clamp_is_a_finding() {
        let out = limits().apply(&spec(), Some(0));
        let (s, findings) = run(&out);
        assert_eq!(s.scaling.poll_interval, Duration::from_secs(10));
        assert_eq!(s.scaling.max_replicas, 50);
        assert_eq!(s.scaling.min_replicas, 5);
        // The default worker: 128Mi, so 100.
        assert_eq!(s.processing.concurrency, 100);
        let codes: Vec<&str> = findings.iter().map(|f| f.code.as_str()).collect();
        assert_eq!(
            codes,
            [
                POLL_INTERVAL_BELOW_FLOOR,
                MAX_REPLICAS_ABOVE_CAP,
                CONCURRENCY_ABOVE_MEMORY_CAP
            ]
        );
        for (f, (field, limit, fix)) in findings.iter().zip([
            (
                "spec.scaling.pollInterval",
                "limits.minPollInterval",
                "10s or more",
            ),
            (
                "spec.scaling.maxReplicas",
                "limits.maxReplicas",
                "50 or less",
            ),
            (
                "spec.processing.concurrency",
                "limits.maxConcurrencyPer128Mi",
                "limits.memory to 12800Mi or more",
            ),
        ]) {
            assert_eq!(f.severity, Severity::Warning);
            assert!(
                f.message.contains(field) && f.message.contains(limit),
                "{f:?}"
            );
            assert!(f.recommendation.contains(fix), "{f:?}");
        }
    }

    #[test]
    fn a_spec_within_the_limits_or_without_limits_runs_as_written() {
        let mut s = spec();
        s.scaling.poll_interval = Duration::from_secs(10);
        s.scaling.max_replicas = 50;
        s.processing.concurrency = 100;
        assert_eq!(
            limits().apply(&s, Some(2)),
            Limited::Run {
                spec: Box::new(s.clone()),
                findings: vec![]
            }
        );
        assert_eq!(
            AdminLimits::default().apply(&spec(), Some(1000)),
            Limited::Run {
                spec: Box::new(spec()),
                findings: vec![]
            }
        );
    }

    #[test]
    fn the_concurrency_cap_grows_with_the_worker_memory() {
        let l = AdminLimits {
            max_concurrency_per_128mi: Some(100),
            ..AdminLimits::default()
        };
        for (limit, request, cap) in [
            (Some("1Gi"), None, 800),
            (Some("256Mi"), Some("32Mi"), 200),
            (None, Some("512Mi"), 400),
            // Below 128Mi still allows one unit's worth; no memory at all counts as the default.
            (Some("64Mi"), None, 100),
            (None, None, 100),
            (Some("1e9"), None, 700),
        ] {
            let mut s = spec();
            s.worker.resources = WorkerResources {
                requests: ResourceAmounts {
                    memory: request.map(|m: &str| Quantity(m.into())),
                    ..ResourceAmounts::default()
                },
                limits: ResourceAmounts {
                    memory: limit.map(|m: &str| Quantity(m.into())),
                    ..ResourceAmounts::default()
                },
            };
            let out = l.apply(&s, None);
            assert_eq!(
                run(&out).0.processing.concurrency,
                cap,
                "{limit:?} {request:?}"
            );
        }
    }

    #[test]
    fn the_oldest_consumers_of_a_namespace_run_and_the_rest_are_refused() {
        for older in 0..3 {
            assert!(matches!(
                limits().apply(&spec(), Some(older)),
                Limited::Run { .. }
            ));
        }
        let Limited::Refused(f) = limits().apply(&spec(), Some(3)) else {
            panic!("the fourth runs");
        };
        assert_eq!(f.code, NAMESPACE_CONSUMER_CAP_REACHED);
        assert_eq!(f.severity, Severity::Error);
        assert!(
            f.message.contains("limits.maxConsumersPerNamespace"),
            "{f:?}"
        );
        // Unknown rank (check, plan): not refused.
        assert!(matches!(limits().apply(&spec(), None), Limited::Run { .. }));
    }
}
