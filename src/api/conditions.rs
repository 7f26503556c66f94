//! Condition types and reasons of QueueConsumer status, as constants in one place.
//! Types are PascalCase, reasons CamelCase (Kubernetes API conventions).

pub const READY: &str = "Ready";
pub const QUEUE_REACHABLE: &str = "QueueReachable";
pub const CONFIG_VALID: &str = "ConfigValid";
pub const DEAD_LETTER_QUEUE_HEALTHY: &str = "DeadLetterQueueHealthy";
pub const SCALING_ACTIVE: &str = "ScalingActive";
pub const PROCESSING_TIME_WITHIN_DECLARED: &str = "ProcessingTimeWithinDeclared";
/// The workers' outage breakers: False while one or more report theirs open (the handler's dependency is
/// failing). Does not gate Ready.
pub const HANDLER_HEALTHY: &str = "HandlerHealthy";
/// The DLQ's CloudWatch alarm is as `deadLetter.alarm` asks (a step of its own: its failures never hold
/// back scaling or status).
pub const ALARM_SYNCED: &str = "AlarmSynced";
/// `spec.queue.manage` is on: whether the queue's settings are what the rules recommend (present only
/// with `attributes` or `create`; does not gate Ready).
pub const QUEUE_MANAGED: &str = "QueueManaged";
/// FIFO queues whose workers report their message groups: False while a group's head fails again and
/// again or has waited too long (every later message of the group waits behind it). Does not gate Ready.
pub const FIFO_GROUPS_HEALTHY: &str = "FifoGroupsHealthy";
/// Scale-only mode (`spec.scaleTargetRef`): present, True, only in that mode; its message lists what
/// runs without the bundled worker and what does not.
pub const SCALE_ONLY: &str = "ScaleOnly";
/// `spec.scaling.objective`: present only with it; False while more than 1 % of the messages the workers
/// removed in their window stayed longer than dwellP99. Does not gate Ready.
pub const OBJECTIVE_MET: &str = "ObjectiveMet";

pub mod reason {
    // ObjectiveMet (the Warning Event on a flip to False is DwellAboveObjective, the Normal one back
    // ObjectiveMet)
    pub const OBJECTIVE_MET: &str = "ObjectiveMet";
    pub const DWELL_ABOVE_OBJECTIVE: &str = "DwellAboveObjective";
    /// Too few messages measured in the window, no worker pod answered, or one scrape so far.
    pub const NO_MEASUREMENT: &str = "NoMeasurement";
    // FifoGroupsHealthy
    pub const NO_STUCK_GROUPS: &str = "NoStuckGroups";
    pub const GROUP_STUCK: &str = "GroupStuck";
    // QueueManaged (False reasons of a failed call are the SQS error's own: AccessDenied, ...)
    /// The queue's settings are at (or above) what the rules recommend: nothing to change.
    pub const QUEUE_IN_SYNC: &str = "QueueInSync";
    /// The controller changed the queue's settings in this reconcile (the Event's reason too).
    pub const QUEUE_ATTRIBUTES_UPDATED: &str = "QueueAttributesUpdated";
    /// The controller created the queue or its dead-letter queue (the Event's reason too).
    pub const QUEUE_CREATED: &str = "QueueCreated";
    /// Another QueueConsumer manages the same queue with different values: nothing is changed.
    pub const MANAGE_CONFLICT: &str = "ManageConflict";
    /// The queue's facts could not be read: nothing is changed until they can. (While `spec.suspend`
    /// is true the reason is Suspended, as ScalingActive's: the queue is not touched.)
    pub const QUEUE_NOT_READ: &str = "QueueNotRead";
    /// The tenancy policy's rule for the namespace allows less than `spec.queue.manage` asks for.
    pub const MANAGE_NOT_ALLOWED: &str = "ManageNotAllowed";
    /// `queue.manage: create` on a queue URL of another account than the one the calls act in.
    pub const QUEUE_IN_ANOTHER_ACCOUNT: &str = "QueueInAnotherAccount";
    /// With tenancy rules: `spec.queue.url` is not exactly `https://HOST/ACCOUNT/NAME`.
    pub const QUEUE_URL_NOT_CANONICAL: &str = "QueueUrlNotCanonical";
    /// `spec.deadLetter.alarmActions` names a topic outside what the tenancy policy allows.
    pub const ALARM_ACTION_NOT_ALLOWED: &str = "AlarmActionNotAllowed";
    /// `spec.handler.s3Payloads.buckets` lists a bucket outside what the tenancy policy allows.
    pub const BUCKET_NOT_ALLOWED: &str = "BucketNotAllowed";
    /// `create`: the URL's last segment is no queue name SQS accepts (or its DLQ's name would not be).
    pub const INVALID_QUEUE_NAME: &str = "InvalidQueueName";
    /// The operator has no SQS client to write with (only a provider of test doubles).
    pub const QUEUE_WRITER_UNAVAILABLE: &str = "QueueWriterUnavailable";
    /// `create` on a live queue without a redrive policy that holds messages: the policy (and its DLQ)
    /// waits until the queue is empty, since messages already received more than maxReceiveCount times
    /// would go to the DLQ on their next receive, unhandled.
    pub const REDRIVE_POLICY_DEFERRED: &str = "RedrivePolicyDeferred";
    // Ready
    pub const AVAILABLE: &str = "Available";
    /// Scale-only mode: `ScaleOnly`'s reason; Ready's, ProcessingTimeWithinDeclared's and
    /// HandlerHealthy's when the target is found (no qc-worker reports on the pods).
    pub const SCALE_ONLY: &str = "ScaleOnly";
    /// Scale-only mode: the target does not exist, is not served, has no /scale, or the operator may
    /// not read or write its /scale.
    pub const SCALE_TARGET_UNAVAILABLE: &str = "ScaleTargetUnavailable";
    pub const DEPLOYMENT_UNAVAILABLE: &str = "DeploymentUnavailable";
    pub const QUEUE_UNREACHABLE: &str = "QueueUnreachable";
    pub const CONFIG_INVALID: &str = "ConfigInvalid";
    // ConfigValid
    /// The API server refused the worker Deployment for its pod template (unknown field, bad value).
    pub const TEMPLATE_INVALID: &str = "TemplateInvalid";
    /// The Deployment's progress deadline passed, or its pods crash-loop.
    pub const ROLLOUT_STALLED: &str = "RolloutStalled";
    /// The Deployment cannot create pods (its ReplicaFailure condition: Pod Security admission, a quota,
    /// a webhook); the message carries the Deployment's reason and message.
    pub const REPLICA_FAILURE: &str = "ReplicaFailure";
    /// A new pod template is rolling out: not yet observed by the Deployment controller, pods of an
    /// older template still running, or new ones not yet all available. A change of replicas alone is
    /// no rollout.
    pub const ROLLING_OUT: &str = "RollingOut";
    // QueueReachable
    pub const QUEUE_ATTRIBUTES_READ: &str = "QueueAttributesRead";
    // ConfigValid
    pub const NO_ERRORS: &str = "NoErrorFindings";
    // DeadLetterQueueHealthy
    pub const DEAD_LETTER_QUEUE_EMPTY: &str = "DeadLetterQueueEmpty";
    pub const MESSAGES_IN_DEAD_LETTER_QUEUE: &str = "MessagesInDeadLetterQueue";
    pub const NO_DEAD_LETTER_QUEUE: &str = "NoDeadLetterQueue";
    pub const DEAD_LETTER_QUEUE_UNREACHABLE: &str = "DeadLetterQueueUnreachable";
    // ScalingActive
    pub const SCALING: &str = "Scaling";
    pub const SCALED_TO_ZERO: &str = "ScaledToZero";
    pub const AT_MAX_REPLICAS: &str = "AtMaxReplicas";
    /// Replicas held at what `processing.maxRate` keeps busy (`scaling::rate::replica_cap`).
    pub const AT_MAX_RATE: &str = "AtMaxRate";
    pub const METRICS_UNAVAILABLE: &str = "MetricsUnavailable";
    pub const HELD_BY_VALIDATION: &str = "HeldByValidation";
    /// `spec.suspend` is true: replicas are 0 and the scaler is paused.
    pub const SUSPENDED: &str = "Suspended";
    // ProcessingTimeWithinDeclared
    pub const OBSERVED_P99_WITHIN_DECLARED: &str = "ObservedP99WithinDeclared";
    pub const OBSERVED_P99_ABOVE_DECLARED: &str = "ObservedP99AboveDeclared";
    pub const NO_OBSERVATIONS: &str = "NoObservations";
    // HandlerHealthy (Unknown: NoObservations); DownstreamFailing is also ScalingActive's reason while
    // most workers are open and replicas are held, and the Warning Event's
    pub const HANDLER_RESPONDING: &str = "HandlerResponding";
    pub const DOWNSTREAM_FAILING: &str = "DownstreamFailing";
    /// The Normal Event when no worker reports its breaker open any more.
    pub const DOWNSTREAM_RECOVERED: &str = "DownstreamRecovered";
    // AlarmSynced (False reasons are the CloudWatch failure's own: AccessDenied, EndpointUnreachable, ...)
    pub const ALARM_IN_SYNC: &str = "AlarmInSync";
    pub const ALARM_NOT_MANAGED: &str = "AlarmNotManaged";
    // ConfigValid / QueueReachable
    pub const ENDPOINT_NOT_ALLOWED: &str = "EndpointNotAllowed";
    // Ready / ConfigValid / QueueReachable (Unknown): the operator's tenancy policy refuses the
    // QueueConsumer, and no AWS call is made for it
    pub const NAMESPACE_NOT_IN_POLICY: &str = "NamespaceNotInPolicy";
    pub const QUEUE_NOT_ALLOWED: &str = "QueueNotAllowed";
    pub const ACCOUNT_NOT_ALLOWED: &str = "AccountNotAllowed";
    pub const ROLE_ARN_REQUIRED: &str = "RoleArnRequired";
    pub const ROLE_ARN_NOT_ALLOWED: &str = "RoleArnNotAllowed";
    /// In the message of DeadLetterQueueHealthy=Unknown (DeadLetterQueueUnreachable): the DLQ of the
    /// queue's redrive policy is outside the namespace's tenancy rule, so it is not read.
    pub const DEAD_LETTER_QUEUE_NOT_ALLOWED: &str = "DeadLetterQueueNotAllowed";
}
