//! Rendering of simulation results for `qc-operator simulate`: a text table (with the benchmark's goal
//! checks when ours, keda and oracle all ran) or JSON for machines. Pure: values in, text out.

use serde::Serialize;

use super::{Outcome, Policy, SimConfig};

/// The outcomes of one trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceResult {
    pub trace: String,
    /// Σ handling time / concurrency: the cost if every slot were busy all the time.
    pub work_replica_seconds: f64,
    pub outcomes: Vec<Outcome>,
}

/// Goal thresholds of the benchmark (docs/scaling.md).
pub const MAX_ORACLE_RATIO: f64 = 1.2;
pub const MIN_WITHIN_TARGET: f64 = 0.99;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonRow<'a> {
    trace: &'a str,
    work_replica_seconds: f64,
    #[serde(flatten)]
    outcome: &'a Outcome,
}

/// One JSON object per (trace, policy), with the keys of DESIGN "Scaling" and a `trace` key.
pub fn json(results: &[TraceResult]) -> Result<String, serde_json::Error> {
    let rows: Vec<JsonRow<'_>> = results
        .iter()
        .flat_map(|r| {
            r.outcomes.iter().map(|o| JsonRow {
                trace: &r.trace,
                work_replica_seconds: r.work_replica_seconds,
                outcome: o,
            })
        })
        .collect();
    serde_json::to_string_pretty(&rows)
}

fn find(outcomes: &[Outcome], p: Policy) -> Option<&Outcome> {
    outcomes.iter().find(|o| o.policy == p)
}

fn pct(x: f64) -> String {
    format!("{:.2}%", x * 100.0)
}

/// A markdown table (readable as text), then the goal checks.
pub fn text(cfg: &SimConfig, results: &[TraceResult]) -> String {
    let st = cfg.service_time();
    let s = &cfg.scaling;
    let mut out = format!(
        "spec: p99 {} (service mean {:.2}s, log-normal sigma {:.2}), concurrency {}, replicas {}..{}, \
         maxBacklogAge {}, pollInterval {}, scaleDownStabilization {}, activationBacklog {}; \
         start-up {}, seed {}; keda queueLength {}\n\n",
        cfg.p99,
        st.mean_seconds(),
        st.sigma(),
        cfg.concurrency,
        s.min_replicas,
        s.max_replicas,
        s.max_backlog_age,
        s.poll_interval,
        s.scale_down_stabilization,
        s.activation_backlog,
        cfg.startup,
        cfg.seed,
        cfg.keda.queue_length,
    );
    out.push_str("| trace | policy | replica-seconds | × oracle | P99 wait | max wait | over maxBacklogAge | scale events |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for r in results {
        let oracle = find(&r.outcomes, Policy::Oracle).map(|o| o.replica_seconds);
        for o in &r.outcomes {
            let ratio = match oracle {
                Some(base) if base > 0.0 => format!("{:.2}", o.replica_seconds / base),
                _ => "-".to_string(),
            };
            let unserved = if o.unserved > 0 {
                format!(" ({} unserved)", o.unserved)
            } else {
                String::new()
            };
            out.push_str(&format!(
                "| {} | {} | {:.0} | {} | {:.1}s | {:.1}s | {} | {}{} |\n",
                r.trace,
                o.policy.as_str(),
                o.replica_seconds,
                ratio,
                o.p99_wait_seconds,
                o.max_wait_seconds,
                pct(o.over_target_share),
                o.scale_events,
                unserved
            ));
        }
    }
    let goals: Vec<String> = results.iter().filter_map(goal_line).collect();
    if !goals.is_empty() {
        out.push_str(&format!(
            "\ngoals: ours ≤ {MAX_ORACLE_RATIO} × oracle replica-seconds with the backlog within maxBacklogAge \
             ≥ {}% of seconds; versus keda, better on replica-seconds or time over maxBacklogAge and no worse on the other; \
             work = handling time / concurrency, the floor no schedule goes under\n\n",
            MIN_WITHIN_TARGET * 100.0
        ));
        for g in goals {
            out.push_str(&g);
            out.push('\n');
        }
    }
    out
}

fn goal_line(r: &TraceResult) -> Option<String> {
    let ours = find(&r.outcomes, Policy::Ours)?;
    let keda = find(&r.outcomes, Policy::Keda)?;
    let oracle = find(&r.outcomes, Policy::Oracle)?;
    let ratio = if oracle.replica_seconds > 0.0 {
        ours.replica_seconds / oracle.replica_seconds
    } else {
        f64::INFINITY
    };
    let within = 1.0 - ours.over_target_share;
    let cost_ok = ratio <= MAX_ORACLE_RATIO;
    let age_ok = within >= MIN_WITHIN_TARGET;
    let cheaper = ours.replica_seconds < keda.replica_seconds;
    let not_costlier = ours.replica_seconds <= keda.replica_seconds;
    let fresher = ours.over_target_share < keda.over_target_share;
    let not_staler = ours.over_target_share <= keda.over_target_share;
    let vs_keda = (cheaper && not_staler) || (fresher && not_costlier);
    let mark = |ok: bool| if ok { "met" } else { "NOT met" };
    Some(format!(
        "- {}: ours/oracle {:.2} ({}); within target {} ({}); vs keda replica-seconds {:+.0}%, over target {} vs {} ({}); oracle/work {:.2}",
        r.trace,
        ratio,
        mark(cost_ok),
        pct(within),
        mark(age_ok),
        (ours.replica_seconds / keda.replica_seconds.max(f64::MIN_POSITIVE) - 1.0) * 100.0,
        pct(ours.over_target_share),
        pct(keda.over_target_share),
        mark(vs_keda),
        oracle.replica_seconds / r.work_replica_seconds.max(f64::MIN_POSITIVE),
    ))
}
