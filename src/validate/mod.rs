//! The rules: pure functions over (spec, queue facts) that return findings with numeric recommendations.
//! Shared by `qc-operator check`, `plan` and the controller; no I/O here.

pub mod codes;
pub mod limits;

use crate::api::{Duration, Finding, HeartbeatInterval, Mode, QueueConsumerSpec, Severity};
use crate::aws::{DeadLetterFacts, Facts, QueueFacts};

/// SQS's hard maximum for a visibility timeout (and so for one lease of a message).
pub const VISIBILITY_MAXIMUM: Duration = Duration::from_secs(12 * 3600);
/// SQS quota of in-flight messages per queue (standard and, today, FIFO).
pub const IN_FLIGHT_QUOTA: u64 = 120_000;
/// The longest retention SQS allows, and the least a DLQ should keep.
pub const DEAD_LETTER_RETENTION_MINIMUM: Duration = Duration::from_secs(14 * 24 * 3600);
/// The least maxReceiveCount MaxReceiveCountTooLow accepts.
pub const MIN_RECEIVE_COUNT: u32 = 3;
/// The maxReceiveCount the rules recommend for a new redrive policy ("5 is common").
pub const RECOMMENDED_RECEIVE_COUNT: u32 = 5;
/// SQS's largest maxReceiveCount.
pub const MAX_RECEIVE_COUNT: u32 = 1000;
/// What RetryWindowBeyondRetention adds to the retry window for the retention it recommends.
const RETENTION_SPARE: Duration = Duration::from_secs(3600);
const MARGIN_FLOOR: Duration = Duration::from_secs(5);
const EXCESSIVE_FLOOR: Duration = Duration::from_secs(15 * 60);

/// A rule that was not run, and what it needed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    pub code: &'static str,
    pub needs: &'static str,
}

/// Findings of one evaluation, and the rules left out for lack of facts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub findings: Vec<Finding>,
    pub skipped: Vec<Skipped>,
}

impl Report {
    pub fn has_errors(&self) -> bool {
        has_errors(&self.findings)
    }
}

pub fn has_errors(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.severity == Severity::Error)
}

/// Messages one replica holds at once: its `concurrency` slots, plus, with the heartbeat on and a
/// standard queue, the one batch (`batchSize`) that may wait locally for a slot and the few
/// (at most half a batch) that may still wait when the next batch is received (the worker's
/// prefetch; a FIFO message already waits behind its group, so FIFO workers have none), unless the
/// declared mean says the worker will not prefetch.
pub fn in_flight_per_replica(spec: &QueueConsumerSpec) -> u32 {
    let p = &spec.processing;
    if let Some(b) = &spec.handler.batch {
        // Batch mode: each of the `concurrency` calls with up to `maxItems` messages, plus the
        // calls' worth received ahead (`prefetch`).
        return p
            .concurrency
            .max(1)
            .saturating_mul(b.max_items.max(1))
            .saturating_add(prefetch(spec));
    }
    p.concurrency.max(1).saturating_add(prefetch(spec))
}

/// Messages one replica works on at once: `concurrency`, or in batch mode `concurrency` calls of
/// `maxItems` messages each (every one of them takes a whole call's time).
pub fn message_slots(spec: &QueueConsumerSpec) -> u32 {
    let c = spec.processing.concurrency.max(1);
    match &spec.handler.batch {
        Some(b) => c.saturating_mul(b.max_items.max(1)),
        None => c,
    }
}

/// What a worker may hold waiting for a slot: `batchSize` + ceil(`batchSize` / 2) with the heartbeat
/// on (their leases are extended while they wait) on a standard queue, else none (the worker
/// receives only into free slots). With a declared mean the worker's own test
/// (`worker::core::plan::prefetch_pays`) at the longest round trip it sizes by: a mean of 2s or more means
/// none, as the worker measures it. Without a declared mean, the most it may hold.
/// In batch mode, `worker::core::plan::batch_prefetch_calls` whole calls of `maxItems`, under the same test.
/// The worker's own rules (`worker::core::plan::prefetch`), so the prediction cannot drift from what it does.
pub fn prefetch(spec: &QueueConsumerSpec) -> u32 {
    let p = &spec.processing;
    let fixed_interval = match p.heartbeat.interval {
        HeartbeatInterval::Fixed(d) => Some(d.as_std()),
        // VT / 3 is known only with the queue's facts; any interval is at least as long as the
        // handlers that prefetch pays for.
        HeartbeatInterval::Auto => Some(std::time::Duration::MAX),
    };
    if let Some(mean) = p.mean
        && !crate::worker::core::plan::prefetch_pays(
            mean.as_std(),
            crate::worker::core::plan::PREFETCH_ROUND_TRIP_CEILING,
            fixed_interval,
        )
    {
        return 0;
    }
    let fifo = crate::aws::facts::is_fifo(&spec.queue.url);
    if let Some(b) = &spec.handler.batch {
        // Batch mode: whole calls' worth, waiting for a running call to end.
        return crate::worker::core::plan::batch_prefetch_calls(
            p.concurrency,
            p.heartbeat.enabled,
            fifo,
        )
        .saturating_mul(b.max_items.max(1));
    }
    crate::worker::core::plan::prefetch(p.batch_size, p.concurrency, p.heartbeat.enabled, fifo)
}

/// Time to work through what one replica holds: P × ceil(in-flight / C). In batch mode P is a
/// whole call's P99 and a message may first wait `maxWait` for its batch to fill: maxWait + P; one
/// received ahead (`prefetch`) may instead wait for a running call to end: max(maxWait, P) + P.
fn work_time(spec: &QueueConsumerSpec) -> Duration {
    let c = spec.processing.concurrency.max(1);
    if let Some(b) = &spec.handler.batch {
        return batch_wait(spec, b.max_wait).saturating_add(spec.processing.p99);
    }
    let rounds = in_flight_per_replica(spec).div_ceil(c);
    spec.processing.p99.saturating_mul(rounds)
}

/// Batch mode: how long a message may wait before its call starts: `maxWait` for its batch to fill,
/// or, received ahead while the worker prefetches, a running call's P99 if that is longer.
fn batch_wait(spec: &QueueConsumerSpec, max_wait: Duration) -> Duration {
    if prefetch(spec) > 0 {
        max_wait.max(spec.processing.p99)
    } else {
        max_wait
    }
}

/// M = max(5s, 10% of the work time).
pub fn margin(spec: &QueueConsumerSpec) -> Duration {
    let tenth = Duration::from_millis(work_time(spec).as_millis_u64() / 10);
    tenth.max(MARGIN_FLOOR)
}

/// Budget = P × ceil(in-flight per replica / C) + M: the least visibility timeout that covers a lease.
pub fn budget(spec: &QueueConsumerSpec) -> Duration {
    work_time(spec).saturating_add(margin(spec))
}

/// Visibility the worker sets after the k-th failed receive: base × 2^(k-1), capped at max and 12h.
/// The worker's own function, so the rules predict exactly what it does.
pub fn backoff(spec: &QueueConsumerSpec, receive_count: u32) -> Duration {
    let b = &spec.processing.retry_backoff;
    Duration::from_std(crate::worker::core::backoff::retry_delay(
        b.base.as_std(),
        b.max.as_std(),
        receive_count,
    ))
}

/// How long a failing message stays on the source queue before redrive moves it: each of the R
/// receives hides it for the longer of the visibility timeout (crash, timeout) and the backoff.
pub fn retry_window(spec: &QueueConsumerSpec, vt: Duration, max_receive_count: u32) -> Duration {
    (1..=max_receive_count).fold(Duration::ZERO, |acc, k| {
        acc.saturating_add(vt.max(backoff(spec, k)))
    })
}

/// The retention RetryWindowBeyondRetention recommends for a window (and OutageHoldBeyondRetention
/// for a hold): the window and an hour, in whole seconds, at most SQS's 14 days.
pub fn retention_covering(window: Duration) -> Duration {
    ceil_secs(window.saturating_add(RETENTION_SPARE)).min(DEAD_LETTER_RETENTION_MINIMUM)
}

/// Whether HeartbeatIntervalTooLong fires at this visibility timeout: the interval is not below
/// VT − M, so a lease can run out before it is extended.
fn heartbeat_interval_too_long(spec: &QueueConsumerSpec, vt: Duration, m: Duration) -> bool {
    spec.processing.heartbeat.interval.resolve(vt) >= vt.saturating_sub(m)
}

/// The VisibilityTimeout the rules that ask for a longer one recommend, the largest of their numbers
/// (VisibilityTimeoutBelowBudget: the budget; VisibilityTimeoutBelowSixTimesMean: 6 × mean;
/// HandlerTimeoutBeyondVisibility: timeout + M; HeartbeatIntervalTooLong: the least VT its interval
/// lands inside), in whole seconds, at most SQS's 12h: none of them fires at it. What
/// `queue.manage` raises the queue's to.
pub fn visibility_timeout_needed(spec: &QueueConsumerSpec) -> Duration {
    let p = &spec.processing;
    let m = margin(spec);
    let mut vt = ceil_secs(budget(spec));
    if let Some(mean) = p.mean {
        vt = vt.max(ceil_secs(mean.saturating_mul(6)));
    }
    if p.heartbeat.enabled {
        if let HeartbeatInterval::Fixed(interval) = p.heartbeat.interval {
            vt = vt.max(ceil_secs(interval.saturating_add(m)));
        }
        // A few steps at most: with `auto` (VT/3) the rule holds from 1.5 × M on, with a fixed
        // interval from just above interval + M.
        while vt < VISIBILITY_MAXIMUM && heartbeat_interval_too_long(spec, vt, m) {
            vt = vt.saturating_add(Duration::from_secs(1));
        }
    } else {
        vt = vt.max(ceil_secs(p.timeout.saturating_add(m)));
    }
    vt.min(VISIBILITY_MAXIMUM)
}

/// The least maxReceiveCount whose retry window at `vt` spans `processing.outageTolerance`, when
/// RetryWindowBelowOutageTolerance applies (a tolerance declared, the breaker off); None otherwise.
pub fn receive_count_for_outage(spec: &QueueConsumerSpec, vt: Duration) -> Option<u32> {
    let p = &spec.processing;
    let tolerance = p.outage_tolerance.filter(|_| !p.breaker.enabled)?;
    Some(
        (1..=MAX_RECEIVE_COUNT)
            .find(|&r| retry_window(spec, vt, r) >= tolerance)
            .unwrap_or(MAX_RECEIVE_COUNT),
    )
}

/// How long the breaker may hold a message through an outage (OutageHoldBeyondRetention), when it is
/// on: `outageTolerance`, else the worker's own default (`worker::core::breaker::DEFAULT_OUTAGE_TOLERANCE`).
pub fn outage_hold(spec: &QueueConsumerSpec) -> Option<Duration> {
    let p = &spec.processing;
    p.breaker.enabled.then(|| {
        p.outage_tolerance.unwrap_or(Duration::from_std(
            crate::worker::core::breaker::DEFAULT_OUTAGE_TOLERANCE,
        ))
    })
}

fn secs(d: Duration) -> String {
    d.to_string()
}

/// Round up to whole seconds, as SQS attributes are set.
fn ceil_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs_ceil())
}

fn finding(code: &str, severity: Severity, message: String, recommendation: String) -> Finding {
    Finding {
        code: code.to_string(),
        severity,
        message,
        recommendation,
    }
}

/// The API server refused the worker Deployment for its pod template (strict field validation): an
/// Error finding with the server's message, so ConfigValid is False with reason `TemplateInvalid`.
pub fn template_invalid(server_message: &str) -> Finding {
    finding(
        crate::api::conditions::reason::TEMPLATE_INVALID,
        Severity::Error,
        format!("the API server refused the worker Deployment: {server_message}"),
        "fix spec.template (field names are case-sensitive; `kubectl explain pod.spec` lists them); the Deployment stays as it was until then".to_string(),
    )
}

/// Run every rule that the available facts allow.
pub fn evaluate(spec: &QueueConsumerSpec, facts: Option<&Facts>) -> Report {
    match spec.mode() {
        Mode::Worker => evaluate_consumer(spec, facts),
        Mode::ScaleOnly(_) => {
            // The user's own consumer holds the messages: nothing extends their visibility unless it
            // does so itself, so the rules assume no heartbeat; the bundled worker's own settings
            // (poison handling, the breaker, maxRate, SNS unwrapping, S3 payloads) do not apply.
            let mut consumer = spec.clone();
            consumer.processing.heartbeat.enabled = false;
            let mut r = evaluate_consumer(&consumer, facts);
            r.findings
                .retain(|f| !codes::WORKER_ONLY_RULES.contains(&f.code.as_str()));
            r
        }
    }
}

fn evaluate_consumer(spec: &QueueConsumerSpec, facts: Option<&Facts>) -> Report {
    let mut report = Report::default();
    offline_rules(spec, &mut report.findings);
    fifo_rules(spec, &mut report.findings);
    rate_rule(
        spec,
        facts.and_then(|f| f.queue.visible),
        &mut report.findings,
    );
    match facts {
        None => {
            report
                .skipped
                .extend(codes::QUEUE_RULES.iter().map(|&code| Skipped {
                    code,
                    needs: "queue attributes",
                }));
            report
                .skipped
                .extend(codes::DEAD_LETTER_RULES.iter().map(|&code| Skipped {
                    code,
                    needs: "dead-letter queue attributes",
                }));
        }
        Some(facts) => {
            queue_rules(spec, &facts.queue, &mut report.findings);
            dead_letter_rules(
                &facts.queue,
                &facts.dead_letter,
                &mut report.findings,
                &mut report.skipped,
            );
        }
    }
    report
}

/// FilterOnBacklog (`check --live` only): a filter deletes every message no pattern matches, and
/// the queue already holds messages that were sent without it in mind. None without a filter or a
/// backlog.
pub fn filter_on_backlog(spec: &QueueConsumerSpec, q: &QueueFacts) -> Option<Finding> {
    let f = spec.filter.as_ref()?;
    let backlog = [q.visible, q.in_flight, q.delayed]
        .iter()
        .flatten()
        .copied()
        .sum::<i64>();
    (backlog > 0).then(|| {
        finding(
            codes::FILTER_ON_BACKLOG,
            Severity::Warning,
            format!(
                "spec.filter ({} pattern(s)) deletes every message none of its patterns matches, without a handler call, and {} already holds about {backlog} message(s) (visible, in flight and delayed): if the filter is new, those that do not match are destroyed once it rolls out",
                f.patterns.len(),
                q.url
            ),
            "drain the backlog before adding the filter, or check that the waiting messages match it (receive a few with the AWS CLI and match them against the patterns); redrive what must be kept from a copy of the queue".to_string(),
        )
    })
}

/// MaxRateBelowBacklog: `processing.maxRate` drains maxRate × maxBacklogAge messages within
/// `scaling.maxBacklogAge` whatever the replicas; a backlog above that waits longer. The backlog is the
/// queue's visible count when known (rounded up to two significant digits, so the finding's text
/// holds still while a busy queue's count moves), else the one the spec declares: activationBacklog,
/// the backlog a consumer at zero lets build before it starts.
fn rate_rule(spec: &QueueConsumerSpec, visible: Option<i64>, out: &mut Vec<Finding>) {
    let Some(max_rate) = spec.processing.max_rate else {
        return;
    };
    let age = spec.scaling.max_backlog_age;
    let drains = u64::from(max_rate).saturating_mul(age.as_millis_u64()) / 1000;
    let (backlog, what) = match visible.and_then(|v| u64::try_from(v).ok()) {
        Some(v) => (two_digits_up(v), "the queue's visible backlog, about"),
        None => (
            u64::from(spec.scaling.activation_backlog),
            "scaling.activationBacklog, the backlog a consumer at zero replicas waits for,",
        ),
    };
    if backlog <= drains {
        return;
    }
    let takes = backlog.div_ceil(u64::from(max_rate).max(1));
    let rate_needed = backlog
        .saturating_mul(1000)
        .div_ceil(age.as_millis_u64().max(1));
    out.push(finding(
        codes::MAX_RATE_BELOW_BACKLOG,
        Severity::Warning,
        format!(
            "processing.maxRate {max_rate}/s drains at most {drains} messages within scaling.maxBacklogAge {}, but {what} {backlog} messages takes {}s at that rate: messages will wait longer than maxBacklogAge however many replicas run",
            secs(age),
            takes
        ),
        format!(
            "raise processing.maxRate to at least {rate_needed}, or scaling.maxBacklogAge to at least {takes}s if the downstream cannot take more"
        ),
    ));
}

/// FIFO queues (name ending in .fifo): FifoParallelismAboveGroups when maxReplicas × message slots
/// exceed what the declared `scaling.messageGroups` can keep busy (one message per group at a time,
/// plus 25 % headroom); FifoRateAboveLimit when `processing.maxRate` exceeds what a FIFO queue takes
/// (300 receives a second × batchSize; high-throughput mode takes more, hence a Warning).
fn fifo_rules(spec: &QueueConsumerSpec, out: &mut Vec<Finding>) {
    use crate::scaling::fifo;
    if !crate::aws::facts::is_fifo(&spec.queue.url) {
        return;
    }
    let slots = message_slots(spec);
    let max = spec.scaling.max_replicas;
    if let Some(groups) = spec.scaling.message_groups {
        let useful = fifo::useful_slots(groups);
        let cap = fifo::replica_cap(groups, slots);
        if u64::from(max) * u64::from(slots) > u64::from(useful) && max > cap {
            out.push(finding(
                codes::FIFO_PARALLELISM_ABOVE_GROUPS,
                Severity::Warning,
                format!(
                    "scaling.maxReplicas {max} × {slots} message slots = {} at once, but {groups} message groups (scaling.messageGroups) keep at most {useful} busy (one message per group at a time, plus 25% headroom): the scaler stops at {cap} replicas",
                    u64::from(max) * u64::from(slots)
                ),
                format!(
                    "lower scaling.maxReplicas to {cap} (or processing.concurrency), or spread the messages over more MessageGroupIds if they need not be ordered together"
                ),
            ));
        }
    }
    if let Some(rate) = spec.processing.max_rate {
        let batch = spec.processing.batch_size;
        let limit = fifo::throughput_limit(batch, false);
        if rate > limit {
            out.push(finding(
                codes::FIFO_RATE_ABOVE_LIMIT,
                Severity::Warning,
                format!(
                    "processing.maxRate {rate}/s is above what a FIFO queue delivers to this consumer: 300 receives a second × processing.batchSize {batch} = {limit} messages/s (without high-throughput mode)"
                ),
                format!(
                    "lower processing.maxRate to {limit}{}, or turn on high-throughput FIFO on the queue (DeduplicationScope messageGroup, FifoThroughputLimit perMessageGroupId)",
                    if batch < 10 { " or raise processing.batchSize to 10" } else { "" }
                ),
            ));
        }
    }
}

/// Rounded up to two significant digits (7 → 7, 1234 → 1300).
fn two_digits_up(v: u64) -> u64 {
    let mut unit = 1u64;
    while v / unit >= 100 {
        unit = unit.saturating_mul(10);
    }
    v.div_ceil(unit).saturating_mul(unit)
}

/// What in a pod template the restricted Pod Security Standard forbids or asks for and is missing (the
/// checks a namespace enforcing `restricted` would refuse the worker pods for), each as "where: what".
/// `first_filled`: the exec layout, where render gives the first container (the handler, which runs the
/// worker) the fields the standard asks for that the user left unset (`render::restrict_unset`); the http
/// layout leaves every container of the template as the user wrote it.
pub fn restricted_violations(
    template: &k8s_openapi::api::core::v1::PodTemplateSpec,
    first_filled: bool,
) -> Vec<String> {
    let mut out = Vec::new();
    let Some(pod) = &template.spec else {
        return out;
    };
    for (field, on) in [
        ("hostPID", pod.host_pid),
        ("hostIPC", pod.host_ipc),
        ("hostNetwork", pod.host_network),
    ] {
        if on == Some(true) {
            out.push(format!("template.spec.{field}: true"));
        }
    }
    for v in pod.volumes.iter().flatten() {
        if v.host_path.is_some() {
            out.push(format!("template.spec.volumes[{}]: hostPath", v.name));
        }
    }
    if let Some(sc) = &pod.security_context {
        if sc.run_as_user == Some(0) {
            out.push("template.spec.securityContext.runAsUser: 0".into());
        }
        if sc
            .seccomp_profile
            .as_ref()
            .is_some_and(|p| p.type_ == "Unconfined")
        {
            out.push("template.spec.securityContext.seccompProfile: Unconfined".into());
        }
        if sc
            .app_armor_profile
            .as_ref()
            .is_some_and(|p| p.type_ == "Unconfined")
        {
            out.push("template.spec.securityContext.appArmorProfile: Unconfined".into());
        }
    }
    let containers = pod
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("initContainers", c))
        .chain(pod.containers.iter().map(|c| ("containers", c)));
    let pod_context = pod.security_context.clone().unwrap_or_default();
    for (i, (list, c)) in containers.enumerate() {
        let at = format!("template.spec.{list}[{}].securityContext", c.name);
        let filled = first_filled
            && list == "containers"
            && i == pod.init_containers.iter().flatten().count();
        if !filled {
            missing_restricted(&at, c.security_context.as_ref(), &pod_context, &mut out);
        }
        let Some(sc) = &c.security_context else {
            continue;
        };
        if sc.privileged == Some(true) {
            out.push(format!("{at}.privileged: true"));
        }
        if sc.run_as_user == Some(0) {
            out.push(format!("{at}.runAsUser: 0"));
        }
        if sc
            .seccomp_profile
            .as_ref()
            .is_some_and(|p| p.type_ == "Unconfined")
        {
            out.push(format!("{at}.seccompProfile: Unconfined"));
        }
        if sc
            .app_armor_profile
            .as_ref()
            .is_some_and(|p| p.type_ == "Unconfined")
        {
            out.push(format!("{at}.appArmorProfile: Unconfined"));
        }
    }
    out
}

/// What the restricted standard asks of every container and `sc` (with the pod's context) leaves out.
fn missing_restricted(
    at: &str,
    sc: Option<&k8s_openapi::api::core::v1::SecurityContext>,
    pod: &k8s_openapi::api::core::v1::PodSecurityContext,
    out: &mut Vec<String>,
) {
    let sc = sc.cloned().unwrap_or_default();
    if sc.allow_privilege_escalation != Some(false) {
        out.push(format!("{at}.allowPrivilegeEscalation: not false"));
    }
    let drops_all = sc
        .capabilities
        .as_ref()
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|c| c == "ALL"));
    if !drops_all {
        out.push(format!("{at}.capabilities.drop: without ALL"));
    }
    let non_root = sc.run_as_non_root.or(pod.run_as_non_root);
    if non_root != Some(true) {
        out.push(format!(
            "{at}.runAsNonRoot: not true (here or in the pod's securityContext)"
        ));
    }
    if sc.seccomp_profile.is_none() && pod.seccomp_profile.is_none() {
        out.push(format!(
            "{at}.seccompProfile: unset (RuntimeDefault or Localhost, here or in the pod's securityContext)"
        ));
    }
}

/// How long the first message on an idle queue waits, at most, before its handling ends when
/// minReplicas is 0: two polls (activation needs the signal on two consecutive samples, the first up
/// to a poll after the send), a pod's start-up (the scaler's 30s until measured) and the declared P99.
pub fn dwell_from_zero(spec: &QueueConsumerSpec) -> Duration {
    spec.scaling
        .poll_interval
        .saturating_mul(2)
        .saturating_add(crate::api::DEFAULT_STARTUP)
        .saturating_add(spec.processing.p99)
}

/// `scaling.objective.dwellP99` against what scale-from-zero costs a message (Warning: a busy queue
/// never waits for activation, so the objective may still hold where traffic never stops).
fn objective_rules(spec: &QueueConsumerSpec, out: &mut Vec<Finding>) {
    let Some(o) = &spec.scaling.objective else {
        return;
    };
    let from_zero = dwell_from_zero(spec);
    if spec.scaling.min_replicas == 0 && o.dwell_p99 < from_zero {
        out.push(finding(
            codes::OBJECTIVE_BELOW_ACTIVATION,
            Severity::Warning,
            format!(
                "scaling.objective.dwellP99 is {} but with minReplicas 0 the first message on an idle queue may take {} (two polls of {} to activate, about {} of pod start-up, the declared p99 {}): every lull spends error budget",
                secs(o.dwell_p99),
                secs(from_zero),
                secs(spec.scaling.poll_interval),
                secs(crate::api::DEFAULT_STARTUP),
                secs(spec.processing.p99)
            ),
            format!(
                "set scaling.minReplicas to 1, or raise scaling.objective.dwellP99 to at least {}",
                secs(ceil_secs(from_zero))
            ),
        ));
    }
}

fn offline_rules(spec: &QueueConsumerSpec, out: &mut Vec<Finding>) {
    objective_rules(spec, out);
    if let Some(f) = &spec.filter
        && let Err(e) = crate::worker::core::filter::Filter::parse(&f.patterns)
    {
        out.push(finding(
            codes::FILTER_PATTERN_INVALID,
            Severity::Error,
            format!("filter.patterns[{}] {}: {} (the worker refuses to start with it)", e.index, e.at, e.problem),
            "write the pattern in Lambda's FilterCriteria syntax, a JSON object over body, attributes or messageAttributes whose fields hold arrays of values or operators, e.g. {\"body\": {\"type\": [\"order\"], \"amount\": [{\"numeric\": [\">\", 0]}]}}".to_string(),
        ));
    }
    let exec = matches!(spec.handler.one(), Some(crate::api::Handler::Exec(_)));
    let violations = restricted_violations(&spec.template, exec);
    if !violations.is_empty() {
        out.push(finding(
            codes::POD_NOT_RESTRICTED,
            Severity::Warning,
            format!(
                "the worker pods break the restricted Pod Security Standard: {}; a namespace enforcing it refuses them, and a handler compromised through a message gets that access",
                violations.join(", ")
            ),
            "set what the standard asks for in spec.template's containers (allowPrivilegeEscalation: false, capabilities.drop: [ALL], runAsNonRoot: true, seccompProfile.type: RuntimeDefault) and remove what it forbids (the worker needs none of it), or run the consumer in a namespace whose Pod Security level allows them on purpose".to_string(),
        ));
    }
    let q = &spec.queue;
    if let Some((given, in_url)) =
        crate::aws::facts::region_contradiction(q.region.as_deref(), &q.url)
    {
        out.push(finding(
            codes::QUEUE_REGION_CONTRADICTS_URL,
            Severity::Error,
            format!("queue.region is {given} but queue.url names a queue in {in_url}: the clients would sign for {given} and the queue meant is unknown"),
            format!("remove queue.region (the URL's region, {in_url}, is used) or set queue.url to the queue in {given}"),
        ));
    }
    let p = &spec.processing;
    let longest = p.p99.max(p.timeout);
    if longest > VISIBILITY_MAXIMUM {
        let which = if p.p99 >= p.timeout {
            "processing.p99"
        } else {
            "processing.timeout"
        };
        out.push(finding(
            codes::PROCESSING_BEYOND_VISIBILITY_MAXIMUM,
            Severity::Error,
            format!("{which} is {}, beyond the 12h SQS visibility maximum", secs(longest)),
            "split the work into steps under 12h (e.g. a workflow engine such as Step Functions) and keep processing.timeout at most 12h".to_string(),
        ));
    }
    let per_replica = u64::from(in_flight_per_replica(spec));
    let ceiling = u64::from(spec.scaling.max_replicas) * per_replica;
    if ceiling > IN_FLIGHT_QUOTA {
        let max_replicas = IN_FLIGHT_QUOTA / per_replica.max(1);
        out.push(finding(
            codes::IN_FLIGHT_CEILING_REACHABLE,
            Severity::Warning,
            format!(
                "scaling.maxReplicas {} × {} in flight per replica = {ceiling} can exceed the SQS quota of {IN_FLIGHT_QUOTA} in-flight messages; receives then return empty while the queue backs up",
                spec.scaling.max_replicas, per_replica
            ),
            format!("set scaling.maxReplicas to at most {max_replicas}, or lower processing.concurrency"),
        ));
    }
    if p.wait_time.is_zero() {
        out.push(finding(
            codes::SHORT_POLLING,
            Severity::Warning,
            "processing.waitTime is 0s: short polling samples a subset of servers, returns empty often and costs more requests".to_string(),
            "set processing.waitTime to 20s (long polling)".to_string(),
        ));
    }
    // The alarm lives in the queue's region (the controller's client for the queue makes it), and
    // CloudWatch notifies SNS topics of its own region only.
    if let Some(region) = crate::render::region(spec) {
        let elsewhere: Vec<&str> = spec
            .dead_letter
            .alarm_actions
            .iter()
            .filter(|a| a.split(':').nth(3).is_some_and(|r| r != region))
            .map(String::as_str)
            .collect();
        if !elsewhere.is_empty() {
            out.push(finding(
                codes::ALARM_ACTION_IN_ANOTHER_REGION,
                Severity::Error,
                format!("deadLetter.alarmActions names {} outside the queue's region {region}: CloudWatch alarms notify SNS topics of their own region only, so the alarm cannot be written", elsewhere.join(", ")),
                format!("name SNS topics in {region} (create one there, subscribed as the other was)"),
            ));
        }
    }
    if let Some(s3) = spec.handler.s3_payloads.as_ref()
        && s3.enabled
        && s3.delete_after_processing
        && spec.handler.unwrap_sns != crate::api::UnwrapSns::Off
    {
        out.push(finding(
            codes::S3_PAYLOAD_DELETE_WITH_SNS,
            Severity::Error,
            format!(
                "handler.s3Payloads.deleteAfterProcessing is true with handler.unwrapSns {:?}: a payload sent through an SNS topic is one S3 object with a pointer in every subscriber's queue (and in every duplicate delivery), so the first consumer to finish deletes it and every other copy fails as poison with a dangling pointer",
                spec.handler.unwrap_sns.as_str()
            ),
            "set handler.s3Payloads.deleteAfterProcessing to false and expire the payloads with an S3 lifecycle rule on the bucket (e.g. after 14 days, beyond the queues' retention), or set handler.unwrapSns to \"off\" if no message comes through SNS".to_string(),
        ));
    }
    if p.on_poison == crate::api::OnPoison::Delete {
        out.push(finding(
            codes::POISON_DELETED,
            Severity::Warning,
            "processing.onPoison is delete: a message the handler calls poison is gone, with only a log line left; a handler that answers 400 or 422 by mistake (a bug, an outage mapped to 422) destroys good messages".to_string(),
            "set processing.onPoison to deadLetter (the default): poison goes to the DLQ with its reason, where it can be inspected and redriven".to_string(),
        ));
        if spec.handler.unwrap_sns == crate::api::UnwrapSns::On {
            out.push(finding(
                codes::UNWRAP_SNS_POISON_DELETED,
                Severity::Error,
                "handler.unwrapSns is \"on\" and processing.onPoison is delete: under \"on\" every message that is not an SNS notification is poison, so once raw message delivery is switched on for the subscription (or anything else sends to the queue) every message is deleted without reaching the handler".to_string(),
                "set handler.unwrapSns to \"auto\" (notifications unwrapped, any other message handed over as sent), or processing.onPoison to deadLetter (the default: such messages wait in the DLQ with their reason, to be redriven)".to_string(),
            ));
        }
    }
}

fn queue_rules(spec: &QueueConsumerSpec, q: &QueueFacts, out: &mut Vec<Finding>) {
    let p = &spec.processing;
    let vt = q.visibility_timeout;
    let budget = budget(spec);
    let m = margin(spec);
    let heartbeat = p.heartbeat.enabled;

    if vt < budget {
        let (severity, tail) = if heartbeat {
            (
                Severity::Warning,
                "; the heartbeat extends each lease, so this holds only while heartbeats get through",
            )
        } else {
            (
                Severity::Error,
                "; without a heartbeat a message still in work reappears and is handled twice",
            )
        };
        out.push(finding(
            codes::VISIBILITY_TIMEOUT_BELOW_BUDGET,
            severity,
            match &spec.handler.batch {
                Some(b) if prefetch(spec) > 0 => format!(
                    "queue VisibilityTimeout {} is below the budget {} (the longer of batch maxWait {} and a running call's p99 {}, which a batch received ahead waits for, + a call's p99 {} + margin {}){tail}",
                    secs(vt),
                    secs(budget),
                    secs(b.max_wait),
                    secs(p.p99),
                    secs(p.p99),
                    secs(m)
                ),
                Some(b) => format!(
                    "queue VisibilityTimeout {} is below the budget {} (batch maxWait {} + a call's p99 {} + margin {}){tail}",
                    secs(vt),
                    secs(budget),
                    secs(b.max_wait),
                    secs(p.p99),
                    secs(m)
                ),
                None => format!(
                    "queue VisibilityTimeout {} is below the budget {} (p99 {} × ceil({} in flight / concurrency {}) + margin {}){tail}",
                    secs(vt),
                    secs(budget),
                    secs(p.p99),
                    in_flight_per_replica(spec),
                    p.concurrency,
                    secs(m)
                ),
            },
            format!("set VisibilityTimeout to at least {}", secs(ceil_secs(budget))),
        ));
    }
    if let Some(mean) = p.mean {
        let six = mean.saturating_mul(6);
        if vt < six {
            out.push(finding(
                codes::VISIBILITY_TIMEOUT_BELOW_SIX_TIMES_MEAN,
                Severity::Warning,
                format!(
                    "queue VisibilityTimeout {} is below 6 × the declared mean {} = {}",
                    secs(vt),
                    secs(mean),
                    secs(six)
                ),
                format!("set VisibilityTimeout to at least {}", secs(ceil_secs(six))),
            ));
        }
    }
    let ten_budgets = budget.saturating_mul(10);
    if vt > ten_budgets && vt > EXCESSIVE_FLOOR {
        out.push(finding(
            codes::VISIBILITY_TIMEOUT_EXCESSIVE,
            Severity::Warning,
            format!(
                "queue VisibilityTimeout {} is more than 10 × the budget {} and over 15m: after a crash its messages stay hidden that long before a retry",
                secs(vt),
                secs(budget)
            ),
            format!(
                "set VisibilityTimeout to about {} and keep processing.heartbeat.enabled for long messages",
                secs(ceil_secs(budget.saturating_mul(2)))
            ),
        ));
    }
    if heartbeat {
        let interval = p.heartbeat.interval.resolve(vt);
        let limit = vt.saturating_sub(m);
        if heartbeat_interval_too_long(spec, vt, m) {
            let suggested = Duration::from_millis(limit.as_millis_u64() / 2);
            let recommendation = if suggested.is_zero() {
                format!(
                    "set VisibilityTimeout to at least {}",
                    secs(ceil_secs(budget))
                )
            } else {
                format!(
                    "set processing.heartbeat.interval to at most {} or raise VisibilityTimeout to at least {}",
                    secs(suggested),
                    secs(ceil_secs(
                        interval
                            .saturating_add(m)
                            .saturating_add(Duration::from_secs(1))
                    ))
                )
            };
            out.push(finding(
                codes::HEARTBEAT_INTERVAL_TOO_LONG,
                Severity::Error,
                format!(
                    "heartbeat interval {} is not below VisibilityTimeout {} minus margin {}: a lease can expire before it is extended",
                    secs(interval),
                    secs(vt),
                    secs(m)
                ),
                recommendation,
            ));
        }
    } else if p.timeout > vt {
        out.push(finding(
            codes::HANDLER_TIMEOUT_BEYOND_VISIBILITY,
            Severity::Warning,
            format!(
                "processing.timeout {} exceeds VisibilityTimeout {} and the heartbeat is off: a slow message reappears while still running",
                secs(p.timeout),
                secs(vt)
            ),
            format!(
                "enable processing.heartbeat, or set VisibilityTimeout to at least {}",
                secs(ceil_secs(p.timeout.saturating_add(m)))
            ),
        ));
    }

    // The breaker holds messages through an outage up to outageTolerance (else SQS's 12 h visibility
    // limit), while their retention runs from when they were sent: a hold that outlives the retention
    // lets SQS delete them unhandled.
    if let Some(hold) = outage_hold(spec)
        && hold >= q.retention
    {
        let what = if p.outage_tolerance.is_some() {
            format!("processing.outageTolerance {}", secs(hold))
        } else {
            format!(
                "the worker's default hold {} (no processing.outageTolerance)",
                secs(hold)
            )
        };
        out.push(finding(
            codes::OUTAGE_HOLD_BEYOND_RETENTION,
            Severity::Warning,
            format!(
                "the outage breaker holds messages through a dependency outage for {what}, not below MessageRetentionPeriod {}: a message held that long expires and SQS deletes it unhandled",
                secs(q.retention)
            ),
            format!(
                "set processing.outageTolerance below {} (less the time messages wait in the backlog), or raise MessageRetentionPeriod above {}",
                secs(q.retention),
                secs(hold)
            ),
        ));
    }

    let Some(redrive) = &q.redrive else {
        out.push(finding(
            codes::NO_REDRIVE_POLICY,
            Severity::Error,
            "the queue has no RedrivePolicy: a message that always fails is retried until it expires".to_string(),
            "create a dead-letter queue and set RedrivePolicy with maxReceiveCount 5".to_string(),
        ));
        return;
    };
    let r = redrive.max_receive_count;
    if r < MIN_RECEIVE_COUNT {
        out.push(finding(
            codes::MAX_RECEIVE_COUNT_TOO_LOW,
            Severity::Warning,
            format!("maxReceiveCount is {r}: one visibility lapse or crash can dead-letter a good message"),
            format!("set maxReceiveCount to at least {MIN_RECEIVE_COUNT} (5 is common)"),
        ));
    }
    let window = retry_window(spec, vt, r);
    if !p.breaker.enabled {
        out.push(finding(
            codes::BREAKER_DISABLED,
            Severity::Warning,
            format!(
                "processing.breaker.enabled is false on a queue that dead-letters after {r} receives: while the handler's dependency is down every message is received, fails and retries, so an outage longer than the retry window {} moves good messages to the DLQ (and more replicas on the growing backlog only burn receives faster)",
                secs(window)
            ),
            "set processing.breaker.enabled to true (the default): each worker then pauses receiving while the handler's transient failures cross processing.breaker.failurePercent of the window, keeps the messages it holds and probes until the dependency answers".to_string(),
        ));
    }
    if window > q.retention {
        // the largest R whose window still fits the retention
        let fits = (1..r)
            .rev()
            .find(|&k| retry_window(spec, vt, k) <= q.retention)
            .unwrap_or(0);
        let fix_count = if fits >= 1 {
            format!("lower maxReceiveCount to {fits} or ")
        } else {
            String::new()
        };
        let retention_needed = retention_covering(window);
        out.push(finding(
            codes::RETRY_WINDOW_BEYOND_RETENTION,
            Severity::Error,
            format!(
                "{r} receives × VisibilityTimeout {} (with backoff) = {} exceeds MessageRetentionPeriod {}: failing messages expire before reaching the DLQ (silent loss)",
                secs(vt),
                secs(window),
                secs(q.retention)
            ),
            format!("{fix_count}set MessageRetentionPeriod to at least {}", secs(retention_needed)),
        ));
    }
    // With the breaker on, an outage holds messages instead of burning their receives: the retry window
    // need not span it (OutageHoldBeyondRetention bounds the hold instead).
    if let Some(tolerance) = p.outage_tolerance
        && !p.breaker.enabled
        && window < tolerance
    {
        let per_receive = vt.max(Duration::from_secs(1));
        let needed_r = tolerance
            .as_millis_u64()
            .div_ceil(per_receive.as_millis_u64());
        out.push(finding(
                codes::RETRY_WINDOW_BELOW_OUTAGE_TOLERANCE,
                Severity::Warning,
                format!(
                    "retry window {} ({r} receives × VisibilityTimeout {}, with backoff) is shorter than processing.outageTolerance {}: an outage that long sends good messages to the DLQ",
                    secs(window),
                    secs(vt),
                    secs(tolerance)
                ),
                format!(
                    "set maxReceiveCount to at least {needed_r}, or raise processing.retryBackoff.max so the backoff spans {}",
                    secs(tolerance)
                ),
            ));
    }
}

fn dead_letter_rules(
    q: &QueueFacts,
    dlq: &DeadLetterFacts,
    out: &mut Vec<Finding>,
    skipped: &mut Vec<Skipped>,
) {
    match dlq {
        DeadLetterFacts::None => {}
        DeadLetterFacts::Missing { arn } => out.push(finding(
            codes::DEAD_LETTER_QUEUE_MISSING,
            Severity::Error,
            format!("the RedrivePolicy targets {arn}, which does not exist: redrive fails and messages stay on the source queue"),
            format!("create the queue {arn} (retention 14 days) or point RedrivePolicy at an existing dead-letter queue"),
        )),
        DeadLetterFacts::Unreachable { .. } | DeadLetterFacts::NotRead { .. } => {
            skipped.extend(codes::DEAD_LETTER_RULES.iter().map(|&code| Skipped { code, needs: "dead-letter queue attributes" }));
        }
        DeadLetterFacts::Found { queue: d, .. } => {
            if d.retention < DEAD_LETTER_RETENTION_MINIMUM || d.retention < q.retention {
                let why = if d.retention < q.retention {
                    format!("shorter than the source queue's {}", secs(q.retention))
                } else {
                    "below 14 days".to_string()
                };
                out.push(finding(
                    codes::DEAD_LETTER_RETENTION_TOO_SHORT,
                    Severity::Warning,
                    format!(
                        "dead-letter queue MessageRetentionPeriod {} is {why}: a message keeps its original enqueue time, so evidence can expire before anyone looks",
                        secs(d.retention)
                    ),
                    format!("set the DLQ's MessageRetentionPeriod to {} (1209600 seconds)", secs(DEAD_LETTER_RETENTION_MINIMUM)),
                ));
            }
            if d.fifo != q.fifo {
                let (src, dst) = if q.fifo { ("FIFO", "standard") } else { ("standard", "FIFO") };
                out.push(finding(
                    codes::DEAD_LETTER_QUEUE_TYPE_MISMATCH,
                    Severity::Error,
                    format!("a {src} queue redrives to a {dst} dead-letter queue: SQS requires both to be of the same type"),
                    format!("point RedrivePolicy at a {src} dead-letter queue{}", if q.fifo { " (name ending in .fifo)" } else { "" }),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests;
