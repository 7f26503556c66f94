//! Rule codes (user-visible: they appear in findings, conditions and `check` output).
//! Each is documented in docs/rules.md.

pub const VISIBILITY_TIMEOUT_BELOW_BUDGET: &str = "VisibilityTimeoutBelowBudget";
pub const VISIBILITY_TIMEOUT_BELOW_SIX_TIMES_MEAN: &str = "VisibilityTimeoutBelowSixTimesMean";
pub const VISIBILITY_TIMEOUT_EXCESSIVE: &str = "VisibilityTimeoutExcessive";
pub const PROCESSING_BEYOND_VISIBILITY_MAXIMUM: &str = "ProcessingBeyondVisibilityMaximum";
pub const HEARTBEAT_INTERVAL_TOO_LONG: &str = "HeartbeatIntervalTooLong";
pub const HANDLER_TIMEOUT_BEYOND_VISIBILITY: &str = "HandlerTimeoutBeyondVisibility";
pub const NO_REDRIVE_POLICY: &str = "NoRedrivePolicy";
pub const MAX_RECEIVE_COUNT_TOO_LOW: &str = "MaxReceiveCountTooLow";
pub const RETRY_WINDOW_BEYOND_RETENTION: &str = "RetryWindowBeyondRetention";
pub const RETRY_WINDOW_BELOW_OUTAGE_TOLERANCE: &str = "RetryWindowBelowOutageTolerance";
pub const DEAD_LETTER_RETENTION_TOO_SHORT: &str = "DeadLetterRetentionTooShort";
pub const DEAD_LETTER_QUEUE_TYPE_MISMATCH: &str = "DeadLetterQueueTypeMismatch";
pub const DEAD_LETTER_QUEUE_MISSING: &str = "DeadLetterQueueMissing";
pub const IN_FLIGHT_CEILING_REACHABLE: &str = "InFlightCeilingReachable";
pub const SHORT_POLLING: &str = "ShortPolling";
pub const POISON_DELETED: &str = "PoisonDeleted";
pub const UNWRAP_SNS_POISON_DELETED: &str = "UnwrapSnsPoisonDeleted";
pub const QUEUE_REGION_CONTRADICTS_URL: &str = "QueueRegionContradictsUrl";
pub const ALARM_ACTION_IN_ANOTHER_REGION: &str = "AlarmActionInAnotherRegion";
pub const BREAKER_DISABLED: &str = "BreakerDisabled";
pub const OUTAGE_HOLD_BEYOND_RETENTION: &str = "OutageHoldBeyondRetention";
pub const POD_NOT_RESTRICTED: &str = "PodNotRestricted";
pub const MAX_RATE_BELOW_BACKLOG: &str = "MaxRateBelowBacklog";
pub const S3_PAYLOAD_DELETE_WITH_SNS: &str = "S3PayloadDeleteWithSns";
pub const FILTER_PATTERN_INVALID: &str = "FilterPatternInvalid";
/// `check --live` only (never in status, where a busy queue would always carry it): a filter on a
/// queue that holds messages.
pub const FILTER_ON_BACKLOG: &str = "FilterOnBacklog";
pub const FIFO_PARALLELISM_ABOVE_GROUPS: &str = "FifoParallelismAboveGroups";
pub const FIFO_RATE_ABOVE_LIMIT: &str = "FifoRateAboveLimit";
/// `scaling.objective.dwellP99` shorter than a message on an idle queue waits when minReplicas is 0:
/// activation (two polls), a pod's start-up and its handling.
pub const OBJECTIVE_BELOW_ACTIVATION: &str = "ObjectiveBelowActivation";

/// Rules about the bundled worker's own settings: not run in scale-only mode (`spec.scaleTargetRef`),
/// where those settings do nothing.
pub const WORKER_ONLY_RULES: &[&str] = &[
    POISON_DELETED,
    UNWRAP_SNS_POISON_DELETED,
    BREAKER_DISABLED,
    OUTAGE_HOLD_BEYOND_RETENTION,
    POD_NOT_RESTRICTED,
    MAX_RATE_BELOW_BACKLOG,
    S3_PAYLOAD_DELETE_WITH_SNS,
    FILTER_PATTERN_INVALID,
    FIFO_RATE_ABOVE_LIMIT,
];

/// Rules that need only the spec.
pub const OFFLINE_RULES: &[&str] = &[
    PROCESSING_BEYOND_VISIBILITY_MAXIMUM,
    IN_FLIGHT_CEILING_REACHABLE,
    SHORT_POLLING,
    POISON_DELETED,
    UNWRAP_SNS_POISON_DELETED,
    QUEUE_REGION_CONTRADICTS_URL,
    ALARM_ACTION_IN_ANOTHER_REGION,
    POD_NOT_RESTRICTED,
    MAX_RATE_BELOW_BACKLOG,
    S3_PAYLOAD_DELETE_WITH_SNS,
    FILTER_PATTERN_INVALID,
    FIFO_PARALLELISM_ABOVE_GROUPS,
    FIFO_RATE_ABOVE_LIMIT,
    OBJECTIVE_BELOW_ACTIVATION,
];

/// Rules that need the source queue's attributes.
pub const QUEUE_RULES: &[&str] = &[
    VISIBILITY_TIMEOUT_BELOW_BUDGET,
    VISIBILITY_TIMEOUT_BELOW_SIX_TIMES_MEAN,
    VISIBILITY_TIMEOUT_EXCESSIVE,
    HEARTBEAT_INTERVAL_TOO_LONG,
    HANDLER_TIMEOUT_BEYOND_VISIBILITY,
    NO_REDRIVE_POLICY,
    MAX_RECEIVE_COUNT_TOO_LOW,
    RETRY_WINDOW_BEYOND_RETENTION,
    RETRY_WINDOW_BELOW_OUTAGE_TOLERANCE,
    BREAKER_DISABLED,
    OUTAGE_HOLD_BEYOND_RETENTION,
];

/// Rules that need the dead-letter queue's attributes.
pub const DEAD_LETTER_RULES: &[&str] = &[
    DEAD_LETTER_RETENTION_TOO_SHORT,
    DEAD_LETTER_QUEUE_TYPE_MISMATCH,
    DEAD_LETTER_QUEUE_MISSING,
];

/// Every rule code, in the order docs/rules.md describes them.
pub const ALL: &[&str] = &[
    VISIBILITY_TIMEOUT_BELOW_BUDGET,
    VISIBILITY_TIMEOUT_BELOW_SIX_TIMES_MEAN,
    VISIBILITY_TIMEOUT_EXCESSIVE,
    PROCESSING_BEYOND_VISIBILITY_MAXIMUM,
    HEARTBEAT_INTERVAL_TOO_LONG,
    HANDLER_TIMEOUT_BEYOND_VISIBILITY,
    NO_REDRIVE_POLICY,
    MAX_RECEIVE_COUNT_TOO_LOW,
    RETRY_WINDOW_BEYOND_RETENTION,
    RETRY_WINDOW_BELOW_OUTAGE_TOLERANCE,
    BREAKER_DISABLED,
    OUTAGE_HOLD_BEYOND_RETENTION,
    DEAD_LETTER_RETENTION_TOO_SHORT,
    DEAD_LETTER_QUEUE_TYPE_MISMATCH,
    DEAD_LETTER_QUEUE_MISSING,
    IN_FLIGHT_CEILING_REACHABLE,
    SHORT_POLLING,
    POISON_DELETED,
    UNWRAP_SNS_POISON_DELETED,
    QUEUE_REGION_CONTRADICTS_URL,
    ALARM_ACTION_IN_ANOTHER_REGION,
    POD_NOT_RESTRICTED,
    MAX_RATE_BELOW_BACKLOG,
    S3_PAYLOAD_DELETE_WITH_SNS,
    FILTER_PATTERN_INVALID,
    FIFO_PARALLELISM_ABOVE_GROUPS,
    FIFO_RATE_ABOVE_LIMIT,
    OBJECTIVE_BELOW_ACTIVATION,
];
