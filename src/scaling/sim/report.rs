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

/// Goal thresholds of the benchmark (docs/scaling.md "Goals"): replica-seconds against the oracle on a busy
/// trace, and on a near-idle one (the ski-rental bound: holding for one start-up never pays more than twice
/// the clairvoyant cost); seconds within maxBacklogAge; scale events per minute against KEDA's.
pub const MAX_ORACLE_RATIO: f64 = 1.3;
pub const MAX_ORACLE_RATIO_NEAR_IDLE: f64 = 2.0;
pub const MIN_WITHIN_TARGET: f64 = 0.99;
pub const MAX_EVENTS_VS_KEDA: f64 = 2.0;
/// A trace is near-idle when its handling time keeps less than this share of one replica busy on average
/// (its cost is then start-ups and holds, not work).
pub const NEAR_IDLE_LOAD: f64 = 0.01;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonRow<'a> {
    trace: &'a str,
    work_replica_seconds: f64,
    #[serde(flatten)]
    outcome: &'a Outcome,
}

/// One JSON object per (trace, policy): the measures of docs/scaling.md "The simulator", and a `trace` key.
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
         maxBacklogAge {}, pollInterval {}, scaleDownStabilization {} (window {}), activationBacklog {}; \
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
        s.scale_down_stabilization.window(Some(cfg.startup)),
        s.activation_backlog,
        cfg.startup,
        cfg.seed,
        cfg.keda.queue_length,
    );
    if let Some(o) = &s.objective {
        out.push_str(&format!(
            "objective: dwellP99 {} (P99 dwell: arrival to deletion, what it bounds)\n\n",
            o.dwell_p99
        ));
    }
    out.push_str("| trace | policy | replica-seconds | × oracle | P99 wait | max wait | P99 dwell | over maxBacklogAge | scale events | events/min |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
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
                "| {} | {} | {:.0} | {} | {:.1}s | {:.1}s | {:.1}s | {} | {}{} | {:.2} |\n",
                r.trace,
                o.policy.as_str(),
                o.replica_seconds,
                ratio,
                o.p99_wait_seconds,
                o.max_wait_seconds,
                o.p99_dwell_seconds,
                pct(o.over_target_share),
                o.scale_events,
                unserved,
                events_per_minute(o),
            ));
        }
    }
    let goals: Vec<String> = results.iter().filter_map(goal_line).collect();
    if !goals.is_empty() {
        out.push_str(&format!(
            "\ngoals: ours ≤ {MAX_ORACLE_RATIO} × oracle replica-seconds on a busy trace, ≤ {MAX_ORACLE_RATIO_NEAR_IDLE} × on a \
             near-idle one (handling keeps < {}% of a replica busy); the backlog within maxBacklogAge ≥ {}% of seconds; \
             scale events per minute ≤ {MAX_EVENTS_VS_KEDA} × keda's; fewer replica-seconds than keda; \
             work = handling time / concurrency, the floor no schedule goes under\n\n",
            NEAR_IDLE_LOAD * 100.0,
            MIN_WITHIN_TARGET * 100.0
        ));
        for g in goals {
            out.push_str(&g);
            out.push('\n');
        }
    }
    out
}

/// Scale events per simulated minute.
pub fn events_per_minute(o: &Outcome) -> f64 {
    if o.simulated_seconds == 0 {
        0.0
    } else {
        f64::from(o.scale_events) * 60.0 / o.simulated_seconds as f64
    }
}

/// Whether a trace is near-idle: its handling keeps less than [`NEAR_IDLE_LOAD`] of a replica busy.
pub fn near_idle(r: &TraceResult, o: &Outcome) -> bool {
    o.simulated_seconds > 0
        && r.work_replica_seconds / (o.simulated_seconds as f64) < NEAR_IDLE_LOAD
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
    let idle = near_idle(r, ours);
    let bound = if idle {
        MAX_ORACLE_RATIO_NEAR_IDLE
    } else {
        MAX_ORACLE_RATIO
    };
    let within = 1.0 - ours.over_target_share;
    let (ours_epm, keda_epm) = (events_per_minute(ours), events_per_minute(keda));
    let mark = |ok: bool| if ok { "met" } else { "NOT met" };
    let floor = if ratio < 1.0 && oracle.unserved == 0 {
        " (ours below the oracle: the oracle is no floor here, look at it)"
    } else {
        ""
    };
    Some(format!(
        "- {}{}: ours/oracle {:.2} ≤ {bound} ({}); within target {} ({}); events/min {:.2} vs keda {:.2} ({}); \
         vs keda replica-seconds {:+.0}% ({}); oracle/work {:.2}{floor}",
        r.trace,
        if idle { " (near-idle)" } else { "" },
        ratio,
        mark(ratio <= bound),
        pct(within),
        mark(within >= MIN_WITHIN_TARGET),
        ours_epm,
        keda_epm,
        mark(ours_epm <= MAX_EVENTS_VS_KEDA * keda_epm),
        (ours.replica_seconds / keda.replica_seconds.max(f64::MIN_POSITIVE) - 1.0) * 100.0,
        mark(ours.replica_seconds < keda.replica_seconds),
        oracle.replica_seconds / r.work_replica_seconds.max(f64::MIN_POSITIVE),
    ))
}
