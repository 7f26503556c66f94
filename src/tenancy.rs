//! The operator's tenancy policy: which namespaces may name which queues, accounts and IAM roles, and
//! whether a role is required (chart value `tenancy`, `qc-operator run --tenancy-policy`).
//! Pure: the policy and one QueueConsumer's identity in, a verdict out. The controller makes no AWS call
//! for a QueueConsumer the policy refuses.

use serde::Deserialize;

use crate::aws::QueueId;

/// The chart value an operator sets the policy with, named in every refusal.
pub const POLICY_SETTING: &str = "tenancy.rules";

/// Stands for the QueueConsumer's namespace in any pattern of a rule.
pub const NAMESPACE_PLACEHOLDER: &str = "{namespace}";

/// Why a policy could not be read, or why it refuses a QueueConsumer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenancyError {
    #[error("tenancy policy: {at}: {problem}")]
    BadPolicy { at: String, problem: String },
    #[error(
        "namespace {namespace:?} is in no rule of this operator's tenancy policy, so its QueueConsumers get no AWS call: ask the operator's administrator to add a rule naming it to the chart value {POLICY_SETTING}"
    )]
    NamespaceNotInPolicy { namespace: String },
    #[error(
        "spec.queue.url names queue {arn}, which the tenancy policy does not allow in namespace {namespace:?} (rule {rule} allows {allowed}): name a queue it allows, or ask the operator's administrator to add it to {POLICY_SETTING}[{rule}].queues"
    )]
    QueueNotAllowed {
        namespace: String,
        arn: String,
        rule: usize,
        allowed: String,
    },
    #[error(
        "the queue's redrive policy names dead-letter queue {arn}, which the tenancy policy does not allow in namespace {namespace:?} (rule {rule} allows {allowed}): it is neither read nor alarmed on nor redriven from; point the redrive policy at a dead-letter queue the rule allows, or ask the operator's administrator to add it to {POLICY_SETTING}[{rule}].queues"
    )]
    DeadLetterQueueNotAllowed {
        namespace: String,
        arn: String,
        rule: usize,
        allowed: String,
    },
    #[error(
        "spec.queue.url names a queue of AWS account {account}, which the tenancy policy does not allow in namespace {namespace:?} (rule {rule} allows {allowed}): name a queue of an allowed account, or ask the operator's administrator to add it to {POLICY_SETTING}[{rule}].accounts"
    )]
    AccountNotAllowed {
        namespace: String,
        account: String,
        rule: usize,
        allowed: String,
    },
    #[error(
        "spec.aws.roleArn is required in namespace {namespace:?} (the tenancy policy's rule {rule} sets requireRoleArn): set spec.aws.roleArn to an IAM role whose policy allows this queue (rule {rule} allows {allowed})"
    )]
    RoleArnRequired {
        namespace: String,
        rule: usize,
        allowed: String,
    },
    #[error(
        "spec.aws.roleArn {role} is not allowed in namespace {namespace:?} by the tenancy policy (rule {rule} allows {allowed}): name a role it allows, or ask the operator's administrator to add it to {POLICY_SETTING}[{rule}].roleArns"
    )]
    RoleArnNotAllowed {
        namespace: String,
        role: String,
        rule: usize,
        allowed: String,
    },
    #[error(
        "spec.queue.manage is {asked}, which the tenancy policy does not allow in namespace {namespace:?} (rule {rule} allows at most {allowed}): the queue is not changed; set spec.queue.manage to {allowed} or off, or ask the operator's administrator to raise {POLICY_SETTING}[{rule}].manage"
    )]
    ManageNotAllowed {
        namespace: String,
        asked: &'static str,
        rule: usize,
        allowed: &'static str,
    },
    #[error(
        "spec.handler.s3Payloads.buckets lists {bucket:?}, which the tenancy policy does not allow in namespace {namespace:?} (rule {rule} allows {allowed}): list only buckets it allows, or ask the operator's administrator to add it to {POLICY_SETTING}[{rule}].buckets"
    )]
    BucketNotAllowed {
        namespace: String,
        bucket: String,
        rule: usize,
        allowed: String,
    },
    #[error(
        "spec.queue.url {url:?} is not of the shape https://HOST/ACCOUNT/NAME (a 12-digit account, a queue name of letters, digits, '-' and '_' with an optional .fifo, nothing after it), which the tenancy policy needs to tell which queue it names: write the URL SQS printed for the queue"
    )]
    QueueUrlNotCanonical { url: String },
    #[error(
        "spec.deadLetter.alarmActions names topic {topic}, which the tenancy policy does not allow in namespace {namespace:?} (rule {rule} allows {allowed}): name a topic it allows, or ask the operator's administrator to add it to {POLICY_SETTING}[{rule}].alarmActions"
    )]
    AlarmActionNotAllowed {
        namespace: String,
        topic: String,
        rule: usize,
        allowed: String,
    },
    /// The operator's cap of QueueConsumers per namespace (`validate::limits`): this one is past it.
    #[error(
        "namespace {namespace:?} already has {older} older QueueConsumer(s) and the operator runs at most {cap} per namespace (limits.maxConsumersPerNamespace): this one gets no AWS call and no rollout; delete QueueConsumers the namespace no longer needs, or ask the operator's administrator to raise the limit"
    )]
    NamespaceConsumerCapReached {
        namespace: String,
        older: usize,
        cap: u32,
    },
}

impl TenancyError {
    /// CamelCase reason for conditions and Events.
    pub fn reason(&self) -> &'static str {
        use crate::api::conditions::reason;
        match self {
            TenancyError::BadPolicy { .. } => "InvalidTenancyPolicy",
            TenancyError::NamespaceNotInPolicy { .. } => reason::NAMESPACE_NOT_IN_POLICY,
            TenancyError::QueueNotAllowed { .. } => reason::QUEUE_NOT_ALLOWED,
            TenancyError::DeadLetterQueueNotAllowed { .. } => reason::DEAD_LETTER_QUEUE_NOT_ALLOWED,
            TenancyError::AccountNotAllowed { .. } => reason::ACCOUNT_NOT_ALLOWED,
            TenancyError::RoleArnRequired { .. } => reason::ROLE_ARN_REQUIRED,
            TenancyError::RoleArnNotAllowed { .. } => reason::ROLE_ARN_NOT_ALLOWED,
            TenancyError::ManageNotAllowed { .. } => reason::MANAGE_NOT_ALLOWED,
            TenancyError::BucketNotAllowed { .. } => reason::BUCKET_NOT_ALLOWED,
            TenancyError::AlarmActionNotAllowed { .. } => reason::ALARM_ACTION_NOT_ALLOWED,
            TenancyError::QueueUrlNotCanonical { .. } => reason::QUEUE_URL_NOT_CANONICAL,
            TenancyError::NamespaceConsumerCapReached { .. } => {
                crate::validate::limits::NAMESPACE_CONSUMER_CAP_REACHED
            }
        }
    }
}

/// The policy as the operator writes it (YAML or JSON): `{rules: [...]}`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PolicyText {
    #[serde(default)]
    rules: Vec<RuleText>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RuleText {
    namespaces: Vec<String>,
    #[serde(default)]
    require_role_arn: bool,
    #[serde(default)]
    queues: Option<Vec<String>>,
    #[serde(default)]
    accounts: Option<Vec<String>>,
    #[serde(default)]
    role_arns: Option<Vec<String>>,
    #[serde(default)]
    manage: Option<crate::api::QueueManage>,
    #[serde(default)]
    buckets: Option<Vec<String>>,
    #[serde(default)]
    alarm_actions: Option<Vec<String>>,
}

/// One rule: the namespaces it is for and what they may name. A list left out allows anything; an
/// empty list allows nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    namespaces: Vec<Glob>,
    require_role_arn: bool,
    queues: Option<Vec<Glob>>,
    accounts: Option<Vec<Glob>>,
    role_arns: Option<Vec<Glob>>,
    /// The most `spec.queue.manage` may ask for; None: anything.
    manage: Option<crate::api::QueueManage>,
    /// What `spec.handler.s3Payloads.buckets` may list: each listed name or pattern must lie within
    /// one of these.
    buckets: Option<Vec<Glob>>,
    /// The SNS topics `spec.deadLetter.alarmActions` may name.
    alarm_actions: Option<Vec<Glob>>,
}

/// The rules; the first whose `namespaces` matches a QueueConsumer's namespace decides for it. No rules
/// at all (the default) allows everything: one tenant, the controller's own identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenancyPolicy {
    rules: Vec<Rule>,
}

/// What the policy looks at in one QueueConsumer.
#[derive(Clone, Copy, Debug)]
pub struct Tenant<'a> {
    pub namespace: &'a str,
    pub queue_url: &'a str,
    /// The region its clients use (`render::region`).
    pub region: Option<&'a str>,
    pub role_arn: Option<&'a str>,
    /// `spec.handler.s3Payloads.buckets` when S3 payloads are on (`{namespace}` not yet filled in).
    pub buckets: &'a [String],
    /// `spec.deadLetter.alarmActions`: the topics the DLQ alarm notifies.
    pub alarm_actions: &'a [String],
}

impl<'a> Tenant<'a> {
    pub fn of(
        namespace: &'a str,
        spec: &'a crate::api::QueueConsumerSpec,
        region: Option<&'a str>,
    ) -> Self {
        Tenant {
            namespace,
            queue_url: &spec.queue.url,
            region,
            role_arn: spec.aws.role_arn.as_deref(),
            buckets: spec
                .handler
                .s3_payloads
                .as_ref()
                .filter(|s| s.enabled)
                .map_or(&[], |s| s.buckets.as_slice()),
            alarm_actions: &spec.dead_letter.alarm_actions,
        }
    }
}

impl TenancyPolicy {
    /// Everything allowed (no rules).
    pub fn allow_all() -> Self {
        Self::default()
    }

    /// Whether any rule is set.
    pub fn is_open(&self) -> bool {
        self.rules.is_empty()
    }

    /// Parse the policy text (YAML or JSON). Blank text is the default (no rules).
    pub fn parse(text: &str) -> Result<Self, TenancyError> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let parsed: PolicyText =
            serde_saphyr::from_str(text).map_err(|e| TenancyError::BadPolicy {
                at: "the text".into(),
                problem: format!(
                    "{e}; write {{rules: [{{namespaces: [team-a], queues: [\"arn:aws:sqs:*:123456789012:team-a_*\"], requireRoleArn: true}}]}}"
                ),
            })?;
        let rules = parsed
            .rules
            .into_iter()
            .enumerate()
            .map(|(i, r)| rule(i, r))
            .collect::<Result<_, _>>()?;
        Ok(TenancyPolicy { rules })
    }

    /// Whether the QueueConsumer may have AWS calls made for it.
    pub fn check(&self, t: &Tenant<'_>) -> Result<(), TenancyError> {
        if self.rules.is_empty() {
            return Ok(());
        }
        let ns = t.namespace;
        let Some((i, rule)) = self.rule_for(ns) else {
            return Err(TenancyError::NamespaceNotInPolicy {
                namespace: ns.to_string(),
            });
        };
        if !canonical_queue_url(t.queue_url) {
            return Err(TenancyError::QueueUrlNotCanonical {
                url: t.queue_url.to_string(),
            });
        }
        let id = QueueId::of(t.region, t.queue_url);
        if let Some(allowed) = &rule.accounts
            && !allowed.iter().any(|g| g.matches(&id.account, ns))
        {
            return Err(TenancyError::AccountNotAllowed {
                namespace: ns.to_string(),
                account: id.account,
                rule: i,
                allowed: listed(allowed, rule, ns),
            });
        }
        if let Some(allowed) = &rule.queues {
            let arn = queue_arn(&id);
            if !allowed.iter().any(|g| g.matches(&arn, ns)) {
                return Err(TenancyError::QueueNotAllowed {
                    namespace: ns.to_string(),
                    arn,
                    rule: i,
                    allowed: listed(allowed, rule, ns),
                });
            }
        }
        match t.role_arn {
            None if rule.require_role_arn => {
                return Err(TenancyError::RoleArnRequired {
                    namespace: ns.to_string(),
                    rule: i,
                    allowed: rule
                        .role_arns
                        .as_ref()
                        .map_or_else(|| "any role".to_string(), |a| listed(a, rule, ns)),
                });
            }
            Some(role) => {
                if let Some(allowed) = &rule.role_arns
                    && !allowed.iter().any(|g| g.matches(role, ns))
                {
                    return Err(TenancyError::RoleArnNotAllowed {
                        namespace: ns.to_string(),
                        role: role.to_string(),
                        rule: i,
                        allowed: listed(allowed, rule, ns),
                    });
                }
            }
            None => {}
        }
        if let Some(allowed) = &rule.alarm_actions
            && let Some(topic) = t
                .alarm_actions
                .iter()
                .find(|a| !allowed.iter().any(|g| g.matches(a, ns)))
        {
            return Err(TenancyError::AlarmActionNotAllowed {
                namespace: ns.to_string(),
                topic: topic.clone(),
                rule: i,
                allowed: listed(allowed, rule, ns),
            });
        }
        if let Some(allowed) = &rule.buckets {
            for b in t.buckets {
                let b = b.replace(NAMESPACE_PLACEHOLDER, ns);
                if !allowed.iter().any(|g| g.admits_pattern(&b, ns)) {
                    return Err(TenancyError::BucketNotAllowed {
                        namespace: ns.to_string(),
                        bucket: b,
                        rule: i,
                        allowed: listed(allowed, rule, ns),
                    });
                }
            }
        }
        Ok(())
    }
}

impl TenancyPolicy {
    /// Whether a QueueConsumer of `namespace` may have the dead-letter queue `arn` (from its queue's
    /// redrive policy) read, alarmed on and redriven from: the namespace's rule must allow it as it
    /// allows the queue (its `queues` and `accounts`). Only asked of a QueueConsumer `check` allowed.
    pub fn check_dead_letter(&self, namespace: &str, arn: &str) -> Result<(), TenancyError> {
        let Some((i, rule)) = self.rule_for(namespace) else {
            return if self.rules.is_empty() {
                Ok(())
            } else {
                Err(TenancyError::NamespaceNotInPolicy {
                    namespace: namespace.to_string(),
                })
            };
        };
        let account = arn.split(':').nth(4).unwrap_or("");
        let refuse = |allowed: &[Glob]| TenancyError::DeadLetterQueueNotAllowed {
            namespace: namespace.to_string(),
            arn: arn.to_string(),
            rule: i,
            allowed: listed(allowed, rule, namespace),
        };
        if let Some(allowed) = &rule.accounts
            && !allowed.iter().any(|g| g.matches(account, namespace))
        {
            return Err(refuse(allowed));
        }
        if let Some(allowed) = &rule.queues
            && !allowed.iter().any(|g| g.matches(arn, namespace))
        {
            return Err(refuse(allowed));
        }
        Ok(())
    }

    /// Whether a QueueConsumer of `namespace` may have its queue changed as `mode`
    /// (`spec.queue.manage`) asks: its rule's `manage` is the most it allows (`off` < `attributes` <
    /// `create`); a rule without it, or no rules at all, allows any. Only asked of a QueueConsumer
    /// `check` allowed.
    pub fn check_manage(
        &self,
        namespace: &str,
        mode: crate::api::QueueManage,
    ) -> Result<(), TenancyError> {
        match self.rule_for(namespace) {
            Some((i, rule)) => match rule.manage {
                Some(most) if mode > most => Err(TenancyError::ManageNotAllowed {
                    namespace: namespace.to_string(),
                    asked: mode.as_str(),
                    rule: i,
                    allowed: most.as_str(),
                }),
                _ => Ok(()),
            },
            None if self.rules.is_empty() => Ok(()),
            None => Err(TenancyError::NamespaceNotInPolicy {
                namespace: namespace.to_string(),
            }),
        }
    }

    fn rule_for(&self, namespace: &str) -> Option<(usize, &Rule)> {
        self.rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.namespaces.iter().any(|g| g.matches(namespace, namespace)))
    }
}

/// Whether `url` is `http(s)://HOST[:PORT]/ACCOUNT/NAME` and nothing else: no user info, query,
/// fragment, empty or dot segments, a 12-digit account and an SQS queue name. Anything looser could
/// let the policy read one queue from the URL while SQS reads another.
fn canonical_queue_url(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
    else {
        return false;
    };
    let Some((host, path)) = rest.split_once('/') else {
        return false;
    };
    let host_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b));
    let mut segments = path.split('/');
    let (Some(account), Some(name), None) = (segments.next(), segments.next(), segments.next())
    else {
        return false;
    };
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    host_ok
        && account.len() == 12
        && account.bytes().all(|b| b.is_ascii_digit())
        && (1..=80).contains(&name.len())
        && !stem.is_empty()
        && stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The ARN of the queue a client in its region reaches: `arn:PARTITION:sqs:REGION:ACCOUNT:NAME`. An
/// unknown region (an emulator's URL without `spec.queue.region`) leaves the region part empty, which
/// only a `*` matches.
pub fn queue_arn(id: &QueueId) -> String {
    let region = id.region.as_deref().unwrap_or("");
    format!(
        "arn:{}:sqs:{region}:{}:{}",
        partition(region),
        id.account,
        id.name
    )
}

/// The AWS partition of a region.
pub fn partition(region: &str) -> &'static str {
    if region.starts_with("cn-") {
        "aws-cn"
    } else if region.starts_with("us-gov-") {
        "aws-us-gov"
    } else {
        "aws"
    }
}

/// The patterns of a rule, as a refusal shows them to the tenant: those that name this namespace
/// (`{namespace}` filled in) and, in a rule for this namespace alone, the rest too; a rule shared by
/// several namespaces keeps its other patterns (other teams' queues, roles, accounts) to itself and
/// says how many it did not show.
fn listed(globs: &[Glob], rule: &Rule, namespace: &str) -> String {
    if globs.is_empty() {
        return "none".to_string();
    }
    let own_rule = matches!(&rule.namespaces[..], [only] if only.text == namespace);
    let (shown, hidden): (Vec<&Glob>, Vec<&Glob>) = globs
        .iter()
        .partition(|g| own_rule || g.text.contains(NAMESPACE_PLACEHOLDER));
    let mut parts: Vec<String> = shown
        .iter()
        .map(|g| g.text.replace(NAMESPACE_PLACEHOLDER, namespace))
        .collect();
    if !hidden.is_empty() {
        parts.push(format!(
            "{} more not shown (the rule is shared with other namespaces; the operator's administrator can say which apply to you)",
            hidden.len()
        ));
    }
    parts.join(", ")
}

/// An IAM-style pattern: `*` any run of characters (none included), `?` one character,
/// `{namespace}` the QueueConsumer's namespace; everything else literal and case-sensitive.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Glob {
    text: String,
}

impl Glob {
    /// Whether the pattern, `{namespace}` filled in with `namespace`, matches `value`, and no other
    /// namespace could be read from `value` in the placeholder's place: a value two namespaces' patterns
    /// both match belongs to neither (`{namespace}` matches a whole namespace, never part of a longer
    /// one, whatever the wildcards around it).
    fn matches(&self, value: &str, namespace: &str) -> bool {
        if !self.text.contains(NAMESPACE_PLACEHOLDER) {
            return glob_match(self.text.as_bytes(), value.as_bytes());
        }
        let filled = |ns: &str| self.text.replace(NAMESPACE_PLACEHOLDER, ns);
        if !glob_match(filled(namespace).as_bytes(), value.as_bytes()) {
            return false;
        }
        !namespace_candidates(value).any(|other| {
            other != namespace && glob_match(filled(other).as_bytes(), value.as_bytes())
        })
    }

    /// Whether every name the pattern `inner` matches is one this glob matches for `namespace`.
    fn admits_pattern(&self, inner: &str, namespace: &str) -> bool {
        let pattern = self.text.replace(NAMESPACE_PLACEHOLDER, namespace);
        glob_within(inner.as_bytes(), pattern.as_bytes())
    }
}

/// Whether every string the pattern `inner` matches is matched by the pattern `outer` (both with `*`
/// and `?`). Sound, not complete: `outer`'s `*` takes any run of `inner`'s symbols, its `?` one
/// literal or `?` of `inner`, and its literals only the same literal; a wildcard of `inner` is never
/// taken for a literal. Dynamic programming over the two lengths.
fn glob_within(inner: &[u8], outer: &[u8]) -> bool {
    let (n, m) = (inner.len(), outer.len());
    // ok[i][j]: outer[i..] covers inner[j..].
    let mut ok = vec![vec![false; n + 1]; m + 1];
    ok[m][n] = true;
    for i in (0..m).rev() {
        for j in (0..=n).rev() {
            ok[i][j] = match outer[i] {
                b'*' => ok[i + 1][j] || (j < n && ok[i][j + 1]),
                b'?' => j < n && inner[j] != b'*' && ok[i + 1][j + 1],
                c => j < n && inner[j] == c && ok[i + 1][j + 1],
            };
        }
    }
    ok[0][0]
}

/// Whether `value` matches the IAM-style `pattern` (`*` any run of characters, `?` one; no
/// placeholder): the worker's `--s3-bucket` check.
pub fn glob_matches(pattern: &str, value: &str) -> bool {
    glob_match(pattern.as_bytes(), value.as_bytes())
}

/// `*` and `?` matching by the greedy algorithm with one backtrack point (linear in practice).
fn glob_match(p: &[u8], v: &[u8]) -> bool {
    let (mut pi, mut vi) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while vi < v.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, vi));
                pi += 1;
            }
            Some(&c) if c == b'?' || c == v[vi] => {
                pi += 1;
                vi += 1;
            }
            _ => match star {
                Some((sp, sv)) => {
                    pi = sp + 1;
                    vi = sv + 1;
                    star = Some((sp, sv + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Longest Kubernetes namespace name (an RFC 1123 label).
const NAMESPACE_MAX: usize = 63;

/// Whether a character may be part of a namespace name (RFC 1123 label: `[a-z0-9-]`).
fn namespace_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
}

/// Whether `s` is a namespace name Kubernetes accepts.
fn is_namespace(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= NAMESPACE_MAX
        && b.iter().all(|&c| namespace_char(c))
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Every substring of `value` that is a namespace name: what `{namespace}` could have stood for.
fn namespace_candidates(value: &str) -> impl Iterator<Item = &str> {
    let b = value.as_bytes();
    (0..b.len()).flat_map(move |i| {
        let run = b[i..]
            .iter()
            .take(NAMESPACE_MAX)
            .take_while(|&&c| namespace_char(c))
            .count();
        (i + 1..=i + run)
            .map(move |j| &value[i..j])
            .filter(|c| is_namespace(c))
    })
}

/// The characters a pattern may put right after `{namespace}`: none a namespace holds, so the
/// namespace cannot run on into another's (`{namespace}-*` of `shop` would match `shop-eu-orders` of
/// namespace `shop-eu`).
fn placeholder_bounded(p: &str) -> Result<(), String> {
    for (at, _) in p.match_indices(NAMESPACE_PLACEHOLDER) {
        let end = at + NAMESPACE_PLACEHOLDER.len();
        let Some(c) = p.as_bytes().get(end).copied() else {
            continue;
        };
        if namespace_char(c) || b"*?{".contains(&c) {
            // `{namespace}-*` becomes `{namespace}_*`; `{namespace}x` becomes `{namespace}_x`.
            let rest = if c == b'-' { &p[end + 1..] } else { &p[end..] };
            let instead = format!("{}{NAMESPACE_PLACEHOLDER}_{rest}", &p[..at]);
            return Err(format!(
                "{p:?} puts {:?} right after {NAMESPACE_PLACEHOLDER}, so one namespace's pattern matches another's names (for namespace shop, \"shop-*\" matches shop-eu-orders of namespace shop-eu): follow {NAMESPACE_PLACEHOLDER} with a character no namespace name holds: '_' for queues, roles and topics (write \"{instead}\" and name the resources so), '.' for buckets (e.g. \"{NAMESPACE_PLACEHOLDER}.payloads\")",
                c as char,
            ));
        }
    }
    Ok(())
}

fn rule(i: usize, r: RuleText) -> Result<Rule, TenancyError> {
    let bad = |field: &str, problem: String| TenancyError::BadPolicy {
        at: format!("rules[{i}].{field}"),
        problem,
    };
    if r.namespaces.is_empty() {
        return Err(bad(
            "namespaces",
            "empty: list the namespaces the rule is for, e.g. [team-a] or [\"team-*\"] or [\"*\"]"
                .into(),
        ));
    }
    let namespaces = r
        .namespaces
        .into_iter()
        .map(|p| {
            let ok = !p.is_empty()
                && !p.contains(NAMESPACE_PLACEHOLDER)
                && p
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-*?".contains(&b));
            if ok {
                Ok(Glob { text: p })
            } else {
                Err(bad(
                    "namespaces",
                    format!("{p:?} is not a namespace pattern: lowercase letters, digits, '-', and '*' or '?' as wildcards"),
                ))
            }
        })
        .collect::<Result<_, _>>()?;
    let queues = globs(format!("rules[{i}].queues"), r.queues, |p| {
        let parts: Vec<&str> = p.split(':').collect();
        (p == "*" || (parts.len() == 6 && parts[0] == "arn" && glob_match(parts[2].as_bytes(), b"sqs")))
            .then_some(())
            .ok_or_else(|| bad("queues", format!("{p:?} is not a queue ARN pattern: write arn:aws:sqs:REGION:ACCOUNT:NAME with '*' or '?' as wildcards, e.g. arn:aws:sqs:*:123456789012:{NAMESPACE_PLACEHOLDER}_*")))
    })?;
    let accounts = globs(format!("rules[{i}].accounts"), r.accounts, |p| {
        let plain = p.replace(NAMESPACE_PLACEHOLDER, "");
        (!p.is_empty() && plain.bytes().all(|b| b.is_ascii_digit() || b"*?".contains(&b)))
            .then_some(())
            .ok_or_else(|| bad("accounts", format!("{p:?} is not an AWS account pattern: twelve digits, e.g. \"123456789012\" (quoted in YAML), or '*'")))
    })?;
    let role_arns = globs(format!("rules[{i}].roleArns"), r.role_arns, |p| {
        let parts: Vec<&str> = p.splitn(6, ':').collect();
        (p == "*" || (parts.len() == 6 && parts[0] == "arn" && glob_match(parts[2].as_bytes(), b"iam")))
            .then_some(())
            .ok_or_else(|| bad("roleArns", format!("{p:?} is not an IAM role ARN pattern: write arn:aws:iam::ACCOUNT:role/NAME with '*' or '?' as wildcards, e.g. arn:aws:iam::123456789012:role/qc-{NAMESPACE_PLACEHOLDER}_*")))
    })?;
    let buckets = globs(format!("rules[{i}].buckets"), r.buckets, |p| {
        let plain = p.replace(NAMESPACE_PLACEHOLDER, "");
        (!p.is_empty()
            && plain
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-*?".contains(&b)))
        .then_some(())
        .ok_or_else(|| bad("buckets", format!("{p:?} is not an S3 bucket pattern: lowercase letters, digits, '.', '-', '*' or '?' as wildcards, and {NAMESPACE_PLACEHOLDER}, e.g. \"{NAMESPACE_PLACEHOLDER}.payloads\"")))?;
        // A bucket pattern is checked against the patterns a QueueConsumer lists, not one name at a
        // time: the namespace must sit at a fixed place, so nothing before it may be a wildcard.
        match p.find(NAMESPACE_PLACEHOLDER) {
            Some(at) if p[..at].contains(['*', '?']) => Err(bad(
                "buckets",
                format!(
                    "{p:?} has a wildcard before {NAMESPACE_PLACEHOLDER}, so the namespace could sit anywhere in a name: start the pattern with fixed text, e.g. \"{NAMESPACE_PLACEHOLDER}.payloads\" or \"qc.{NAMESPACE_PLACEHOLDER}.*\""
                ),
            )),
            _ => Ok(()),
        }
    })?;
    let alarm_actions = globs(format!("rules[{i}].alarmActions"), r.alarm_actions, |p| {
        let parts: Vec<&str> = p.split(':').collect();
        (p == "*" || (parts.len() == 6 && parts[0] == "arn" && glob_match(parts[2].as_bytes(), b"sns")))
            .then_some(())
            .ok_or_else(|| bad("alarmActions", format!("{p:?} is not an SNS topic ARN pattern: write arn:aws:sns:REGION:ACCOUNT:NAME with '*' or '?' as wildcards, e.g. arn:aws:sns:*:123456789012:{NAMESPACE_PLACEHOLDER}_*")))
    })?;
    Ok(Rule {
        alarm_actions,
        buckets,
        namespaces,
        require_role_arn: r.require_role_arn,
        queues,
        accounts,
        role_arns,
        manage: r.manage,
    })
}

fn globs(
    field: String,
    list: Option<Vec<String>>,
    check: impl Fn(&str) -> Result<(), TenancyError>,
) -> Result<Option<Vec<Glob>>, TenancyError> {
    list.map(|l| {
        l.into_iter()
            .map(|p| {
                let p = p.trim().to_string();
                if p.chars().any(|c| c.is_control() || c.is_whitespace()) {
                    return Err(TenancyError::BadPolicy {
                        at: format!("{field}: pattern {p:?}"),
                        problem: "holds whitespace or control characters".into(),
                    });
                }
                check(&p)?;
                placeholder_bounded(&p).map_err(|problem| TenancyError::BadPolicy {
                    at: format!("{field}: pattern {p:?}"),
                    problem,
                })?;
                Ok(Glob { text: p })
            })
            .collect()
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const URL: &str = "https://sqs.us-east-1.amazonaws.com/111111111111/team-a_orders";
    const OTHER: &str = "https://sqs.us-east-1.amazonaws.com/999999999999/team-b_orders";
    const ROLE: &str = "arn:aws:iam::111111111111:role/qc-team-a_orders";

    fn tenant<'a>(ns: &'a str, url: &'a str, role: Option<&'a str>) -> Tenant<'a> {
        Tenant {
            namespace: ns,
            queue_url: url,
            region: Some("us-east-1"),
            role_arn: role,
            buckets: &[],
            alarm_actions: &[],
        }
    }

    /// The chart's multi-tenant preset: every namespace's queues are its own prefix in one account,
    /// through a role of its own.
    const MULTI: &str = r#"
rules:
  - namespaces: ["*"]
    requireRoleArn: true
    queues: ["arn:aws:sqs:*:111111111111:{namespace}_*"]
    roleArns: ["arn:aws:iam::111111111111:role/qc-{namespace}_*"]
"#;

    #[test]
    fn a_rules_manage_is_the_most_its_namespaces_may_ask_for() {
        use crate::api::QueueManage::{Attributes, Create, Off};
        let p = TenancyPolicy::parse(
            "rules: [{namespaces: [ro], manage: off}, {namespaces: [fix], manage: attributes}, {namespaces: [\"*\"]}]",
        )
        .unwrap();
        assert_eq!(p.check_manage("ro", Off), Ok(()));
        let e = p.check_manage("ro", Attributes).unwrap_err();
        assert_eq!(e.reason(), "ManageNotAllowed");
        assert!(e.to_string().contains("tenancy.rules[0].manage"), "{e}");
        assert_eq!(p.check_manage("fix", Attributes), Ok(()));
        assert!(p.check_manage("fix", Create).is_err());
        assert_eq!(p.check_manage("other", Create), Ok(()));
        assert_eq!(
            TenancyPolicy::allow_all().check_manage("any", Create),
            Ok(())
        );
        let closed = TenancyPolicy::parse("rules: [{namespaces: [a]}]").unwrap();
        assert_eq!(
            closed.check_manage("b", Attributes).unwrap_err().reason(),
            "NamespaceNotInPolicy"
        );
        assert!(TenancyPolicy::parse("rules: [{namespaces: [a], manage: delete}]").is_err());
    }

    #[test]
    fn no_rules_allow_everything() {
        let p = TenancyPolicy::parse("").unwrap();
        assert!(p.is_open());
        assert_eq!(p, TenancyPolicy::parse("rules: []").unwrap());
        for t in [
            tenant("team-a", URL, None),
            tenant("team-a", OTHER, Some(ROLE)),
        ] {
            assert_eq!(p.check(&t), Ok(()));
        }
    }

    #[test]
    fn verdicts_by_table() {
        let one_ns = r#"{"rules": [{"namespaces": ["team-a"], "accounts": ["111111111111"]},
                                    {"namespaces": ["ops-*"]}]}"#;
        let none = r#"{"rules": [{"namespaces": ["team-a"], "queues": [], "roleArns": []}]}"#;
        let cases: &[(&str, &str, Tenant<'_>, Option<&str>)] = &[
            (
                "preset: own queue, own role",
                MULTI,
                tenant("team-a", URL, Some(ROLE)),
                None,
            ),
            (
                "preset: no role",
                MULTI,
                tenant("team-a", URL, None),
                Some("RoleArnRequired"),
            ),
            (
                "preset: another team's queue",
                MULTI,
                tenant(
                    "team-b",
                    URL,
                    Some("arn:aws:iam::111111111111:role/qc-team-b_x"),
                ),
                Some("QueueNotAllowed"),
            ),
            (
                "preset: another account's queue",
                MULTI,
                tenant("team-a", OTHER, Some(ROLE)),
                Some("QueueNotAllowed"),
            ),
            (
                "preset: another team's role",
                MULTI,
                tenant(
                    "team-a",
                    URL,
                    Some("arn:aws:iam::111111111111:role/qc-team-b_orders"),
                ),
                Some("RoleArnNotAllowed"),
            ),
            (
                "account rule: own account",
                one_ns,
                tenant("team-a", URL, None),
                None,
            ),
            (
                "account rule: another account",
                one_ns,
                tenant("team-a", OTHER, None),
                Some("AccountNotAllowed"),
            ),
            (
                "second rule by pattern",
                one_ns,
                tenant("ops-1", OTHER, Some(ROLE)),
                None,
            ),
            (
                "a namespace no rule names",
                one_ns,
                tenant("team-b", URL, None),
                Some("NamespaceNotInPolicy"),
            ),
            (
                "empty lists allow nothing",
                none,
                tenant("team-a", URL, None),
                Some("QueueNotAllowed"),
            ),
        ];
        for (name, policy, t, want) in cases {
            let p = TenancyPolicy::parse(policy).unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = p.check(t);
            assert_eq!(
                got.as_ref().err().map(TenancyError::reason),
                *want,
                "{name}: {got:?}"
            );
        }
    }

    #[test]
    fn refusals_name_the_field_the_rule_and_the_fix() {
        let p = TenancyPolicy::parse(MULTI).unwrap();
        let e = p
            .check(&tenant("team-a", OTHER, Some(ROLE)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("arn:aws:sqs:us-east-1:999999999999:team-b_orders"),
            "{e}"
        );
        assert!(
            e.contains("arn:aws:sqs:*:111111111111:team-a_*"),
            "the namespace is filled in: {e}"
        );
        assert!(e.contains("tenancy.rules[0].queues"), "{e}");
        let e = p
            .check(&tenant("team-a", URL, None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("spec.aws.roleArn is required"), "{e}");
        assert!(
            e.contains("arn:aws:iam::111111111111:role/qc-team-a_*"),
            "{e}"
        );
        let e = TenancyPolicy::parse("rules: [{namespaces: [a], accounts: []}]")
            .unwrap()
            .check(&tenant("b", URL, None))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"b\" is in no rule") && e.contains("tenancy.rules"),
            "{e}"
        );
    }

    #[test]
    fn only_a_queue_url_of_the_exact_shape_is_judged() {
        let p = TenancyPolicy::parse(MULTI).unwrap();
        assert_eq!(p.check(&tenant("team-a", URL, Some(ROLE))), Ok(()));
        for bad in [
            "https://sqs.us-east-1.amazonaws.com/999999999999/team-b_x/../../111111111111/team-a_orders",
            "https://sqs.us-east-1.amazonaws.com/111111111111/team-a_orders?QueueUrl=x",
            "https://sqs.us-east-1.amazonaws.com/111111111111/team-a_orders#x",
            "https://sqs.us-east-1.amazonaws.com/111111111111/team-a_orders/",
            "https://u@sqs.us-east-1.amazonaws.com/111111111111/team-a_orders",
            "https://sqs.us-east-1.amazonaws.com//111111111111/team-a_orders",
            "https://sqs.us-east-1.amazonaws.com/11111111111/team-a_orders",
            "https://sqs.us-east-1.amazonaws.com/111111111111/team-a.orders",
        ] {
            let e = p.check(&tenant("team-a", bad, Some(ROLE))).unwrap_err();
            assert_eq!(e.reason(), "QueueUrlNotCanonical", "{bad}");
            assert!(e.to_string().contains("spec.queue.url"), "{e}");
        }
        assert!(canonical_queue_url(
            "http://127.0.0.1:4566/000000000000/orders.fifo"
        ));
        assert_eq!(
            TenancyPolicy::allow_all().check(&tenant(
                "team-a",
                "https://sqs.us-east-1.amazonaws.com/1/q?x",
                None
            )),
            Ok(()),
            "no rules: one tenant, nothing to tell apart"
        );
    }

    /// #41 item 5: alarm actions are checked like queues: a namespace's alarm notifies its own topics.
    #[test]
    fn alarm_actions_name_only_topics_the_rule_allows() {
        let p = TenancyPolicy::parse(
            "rules: [{namespaces: [\"*\"], alarmActions: [\"arn:aws:sns:*:111111111111:{namespace}_*\"]}]",
        )
        .unwrap();
        let with = |ns: &'static str, topics: &'static [String]| Tenant {
            alarm_actions: topics,
            ..tenant(ns, URL, None)
        };
        let own: &'static [String] = Vec::leak(vec![
            "arn:aws:sns:us-east-1:111111111111:shop_alerts".to_string(),
        ]);
        let longer: &'static [String] = Vec::leak(vec![
            "arn:aws:sns:us-east-1:111111111111:shop-eu_alerts".to_string(),
        ]);
        assert_eq!(p.check(&with("shop", own)), Ok(()));
        assert_eq!(p.check(&with("shop-eu", longer)), Ok(()));
        let e = p.check(&with("shop", longer)).unwrap_err();
        assert_eq!(e.reason(), "AlarmActionNotAllowed");
        let m = e.to_string();
        assert!(
            m.contains("shop-eu_alerts")
                && m.contains("spec.deadLetter.alarmActions")
                && m.contains("tenancy.rules[0].alarmActions"),
            "{m}"
        );
        assert!(
            TenancyPolicy::parse(
                "rules: [{namespaces: [a], alarmActions: [\"arn:aws:sqs:x:1:q\"]}]"
            )
            .is_err()
        );
    }

    /// #41 item 6: a refusal shows the tenant the patterns that name its namespace, never another
    /// team's patterns or account ids from a rule shared with it.
    #[test]
    fn refusals_reveal_no_other_tenants_patterns_or_accounts() {
        let shared = r#"
rules:
  - namespaces: ["team-*"]
    accounts: ["111111111111", "222222222222"]
    queues: ["arn:aws:sqs:*:222222222222:team-b_payroll", "arn:aws:sqs:*:*:{namespace}_*"]
    roleArns: ["arn:aws:iam::222222222222:role/team-b-admin", "arn:aws:iam::*:role/qc-{namespace}_*"]
"#;
        let p = TenancyPolicy::parse(shared).unwrap();
        let other_account = "https://sqs.us-east-1.amazonaws.com/333333333333/team-a_orders";
        let other_queue = "https://sqs.us-east-1.amazonaws.com/111111111111/team-c_orders";
        for t in [
            tenant("team-a", other_account, None),
            tenant("team-a", other_queue, None),
            tenant(
                "team-a",
                URL,
                Some("arn:aws:iam::111111111111:role/someone"),
            ),
        ] {
            let m = p.check(&t).unwrap_err().to_string();
            for secret in ["222222222222", "team-b", "111111111111, "] {
                assert!(!m.contains(secret), "{secret} shown: {m}");
            }
            assert!(m.contains("not shown"), "{m}");
            assert!(
                m.contains("team-a_*") || m.contains("333333333333"),
                "says what team-a may do: {m}"
            );
        }
        let own =
            TenancyPolicy::parse("rules: [{namespaces: [team-a], accounts: [\"111111111111\"]}]")
                .unwrap();
        let m = own
            .check(&tenant("team-a", other_account, None))
            .unwrap_err()
            .to_string();
        assert!(m.contains("allows 111111111111"), "a rule of its own: {m}");
    }

    #[test]
    fn a_dead_letter_queue_is_allowed_as_the_queue_is() {
        let p = TenancyPolicy::parse(MULTI).unwrap();
        let own = "arn:aws:sqs:us-east-1:111111111111:team-a_orders-dlq";
        let theirs = "arn:aws:sqs:us-east-1:111111111111:team-b_orders-dlq";
        let elsewhere = "arn:aws:sqs:us-east-1:999999999999:team-a_dlq";
        assert_eq!(p.check_dead_letter("team-a", own), Ok(()));
        for arn in [theirs, elsewhere] {
            let e = p.check_dead_letter("team-a", arn).unwrap_err();
            assert_eq!(e.reason(), "DeadLetterQueueNotAllowed", "{arn}");
            let m = e.to_string();
            assert!(m.contains(arn) && m.contains("redrive policy"), "{m}");
        }
        let accounts =
            TenancyPolicy::parse("rules: [{namespaces: [a], accounts: [\"111111111111\"]}]")
                .unwrap();
        assert_eq!(accounts.check_dead_letter("a", theirs), Ok(()));
        assert!(accounts.check_dead_letter("a", elsewhere).is_err());
        assert!(accounts.check_dead_letter("b", own).is_err(), "no rule");
        assert_eq!(
            TenancyPolicy::allow_all().check_dead_letter("b", elsewhere),
            Ok(())
        );
    }

    #[test]
    fn listed_buckets_must_lie_within_the_rules_buckets() {
        let p = TenancyPolicy::parse(
            "rules: [{namespaces: [\"*\"], buckets: [\"{namespace}.payloads\", \"{namespace}.in-*\", \"shared-?\"]}]",
        )
        .unwrap();
        let with = |ns: &'static str, buckets: &'static [String]| Tenant {
            buckets,
            ..tenant(ns, URL, None)
        };
        let cases: &[(&[&str], Option<&str>)] = &[
            (&["{namespace}.payloads"], None),
            (&["team-a.payloads"], None),
            (
                &["{namespace}.in-2026", "{namespace}.in-*", "shared-1"],
                None,
            ),
            (&["team-a.in-?"], None),
            (&["*"], Some("*")),
            (&["team-a.*"], Some("team-a.*")),
            (&["shared-*"], Some("shared-*")),
            (&["team-b.payloads"], Some("team-b.payloads")),
            (
                &["team-a.payloads", "team-b-secrets"],
                Some("team-b-secrets"),
            ),
        ];
        for (buckets, refused) in cases {
            let owned: &'static [String] =
                Vec::leak(buckets.iter().map(ToString::to_string).collect());
            let got = p.check(&with("team-a", owned));
            match refused {
                None => assert_eq!(got, Ok(()), "{buckets:?}"),
                Some(b) => {
                    let e = got.expect_err(&format!("{buckets:?}"));
                    assert_eq!(e.reason(), "BucketNotAllowed");
                    let m = e.to_string();
                    assert!(
                        m.contains(&format!("{b:?}"))
                            && m.contains("spec.handler.s3Payloads.buckets")
                            && m.contains("tenancy.rules[0].buckets"),
                        "{m}"
                    );
                }
            }
        }
        assert!(TenancyPolicy::parse("rules: [{namespaces: [a], buckets: [Team_A]}]").is_err());
    }

    #[test]
    fn the_old_preset_is_refused_with_what_to_write_instead() {
        for (list, old, instead) in [
            (
                "queues",
                "arn:aws:sqs:*:*:{namespace}-*",
                "arn:aws:sqs:*:*:{namespace}_*",
            ),
            (
                "roleArns",
                "arn:aws:iam::*:role/qc-{namespace}-*",
                "arn:aws:iam::*:role/qc-{namespace}_*",
            ),
            (
                "queues",
                "arn:aws:sqs:*:*:{namespace}*",
                "arn:aws:sqs:*:*:{namespace}_*",
            ),
        ] {
            let text = format!("rules: [{{namespaces: [\"*\"], {list}: [\"{old}\"]}}]");
            let e = TenancyPolicy::parse(&text).expect_err(old);
            assert_eq!(e.reason(), "InvalidTenancyPolicy");
            let m = e.to_string();
            assert!(
                m.contains(&format!("rules[0].{list}"))
                    && m.contains(&format!("write {instead:?}")),
                "{m}"
            );
        }
        let e =
            TenancyPolicy::parse("rules: [{namespaces: [\"*\"], buckets: [\"*.{namespace}.*\"]}]")
                .unwrap_err()
                .to_string();
        assert!(e.contains("wildcard before {namespace}"), "{e}");
    }

    #[test]
    fn a_namespace_never_reaches_the_names_of_a_longer_one() {
        let p = TenancyPolicy::parse(MULTI).unwrap();
        for (ns, other) in [
            ("shop", "shop-eu"),
            ("team-a", "team-a-staging"),
            ("payments", "payments-eu"),
        ] {
            let q = |owner: &str| {
                format!("https://sqs.us-east-1.amazonaws.com/111111111111/{owner}_orders")
            };
            let role = |owner: &str| format!("arn:aws:iam::111111111111:role/qc-{owner}_orders");
            let (own_q, own_r) = (q(ns), role(ns));
            let (their_q, their_r) = (q(other), role(other));
            assert_eq!(p.check(&tenant(ns, &own_q, Some(&own_r))), Ok(()));
            assert_eq!(p.check(&tenant(other, &their_q, Some(&their_r))), Ok(()));
            for (url, r) in [(&their_q, &own_r), (&own_q, &their_r)] {
                assert!(
                    p.check(&tenant(ns, url, Some(r))).is_err(),
                    "{ns}: {url} {r}"
                );
                assert!(
                    p.check(&tenant(other, url, Some(r))).is_err(),
                    "{other}: {url} {r}"
                );
            }
        }
        // A wildcard before the placeholder: a name two namespaces could both read belongs to neither.
        let g = Glob {
            text: "arn:aws:sqs:*:1:*-{namespace}_*".into(),
        };
        let v = "arn:aws:sqs:r:1:x-shop-eu_y";
        assert!(!g.matches(v, "eu") && !g.matches(v, "shop-eu"));
        assert!(g.matches("arn:aws:sqs:r:1:x-shop_y", "shop"));
    }

    /// A namespace name: RFC 1123 label, 1..=20 characters here.
    fn namespace() -> impl proptest::strategy::Strategy<Value = String> {
        (
            prop::sample::select(b"abc0".to_vec()),
            prop::collection::vec(prop::sample::select(b"ab-c0".to_vec()), 0..8),
            prop::sample::select(b"abc1".to_vec()),
            any::<bool>(),
        )
            .prop_map(|(first, mid, last, one)| {
                let mut s = vec![first];
                if !one {
                    s.extend(mid);
                    s.push(last);
                }
                String::from_utf8(s).unwrap_or_default()
            })
    }

    /// Two different namespaces, often one a prefix of the other (`shop`, `shop-eu`).
    fn namespace_pair() -> impl proptest::strategy::Strategy<Value = (String, String)> {
        prop_oneof![
            (namespace(), namespace()).prop_map(|(a, b)| (a.clone(), format!("{a}-{b}"))),
            (namespace(), namespace()).prop_map(|(a, b)| (format!("{a}-{b}"), a)),
            (namespace(), namespace()).prop_map(|(a, b)| (format!("{b}-{a}"), a)),
            (namespace(), namespace()),
        ]
        .prop_filter("two namespaces", |(a, b)| a != b)
    }

    /// A pattern of literal runs, wildcards and placeholders; the policy's own check decides below
    /// whether it may be written.
    fn pattern(
        pieces: &'static [&'static str],
    ) -> impl proptest::strategy::Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(pieces.to_vec()), 1..9)
            .prop_map(|p: Vec<&'static str>| p.concat())
            .prop_filter("a placeholder", |p| p.contains(NAMESPACE_PLACEHOLDER))
    }

    /// A name the pattern admits for `owner`: each `*` some run of characters (namespace-like ones
    /// and delimiters, the other namespace's name among them), each `?` one.
    fn name_of(pattern: &str, owner: &str, fills: &[String]) -> String {
        let filled = pattern.replace(NAMESPACE_PLACEHOLDER, owner);
        let mut fills = fills.iter().cycle();
        let mut out = String::new();
        for c in filled.chars() {
            match c {
                '*' => out.push_str(fills.next().map_or("", String::as_str)),
                '?' => out.push(fills.next().and_then(|f| f.chars().next()).unwrap_or('x')),
                c => out.push(c),
            }
        }
        out
    }

    const ARN_PIECES: &[&str] = &[
        "arn:aws:sqs:",
        "arn:aws:iam::1:role/",
        "*",
        "?",
        ":",
        "/",
        "_",
        ".",
        "-",
        "qc-",
        "eu",
        "{namespace}",
        "{namespace}_",
        "{namespace}-",
    ];

    const BUCKET_PIECES: &[&str] = &[
        "qc.",
        "qc-",
        "*",
        "?",
        ".",
        "-",
        "eu",
        "payloads",
        "{namespace}",
        "{namespace}.",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 2000,
            max_global_rejects: 1_000_000,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// #41 item 2: for any two namespaces and any queue, role or topic pattern the policy
        /// accepts, no name of one namespace is admitted for the other.
        #[test]
        fn no_pattern_admits_another_namespaces_names(
            (mine, theirs) in namespace_pair(),
            p in pattern(ARN_PIECES),
            fills in proptest::collection::vec(
                proptest::sample::select(vec!["", "x", "-", "_", "eu", "-eu", "a-", ":", "shop"]).prop_map(String::from), 1..6),
            extra in namespace(),
        ) {
            prop_assume!(placeholder_bounded(&p).is_ok());
            let mut fills = fills;
            fills.extend([mine.clone(), theirs.clone(), extra]);
            let g = Glob { text: p.clone() };
            let name = name_of(&p, &theirs, &fills);
            prop_assert!(!g.matches(&name, &mine), "{p} admits {name} of {theirs} for {mine}");
        }

        /// The same for bucket patterns, without the check of other readings: a bucket pattern the
        /// policy accepts is disjoint between namespaces by its shape, so a QueueConsumer's listed
        /// bucket (a pattern, checked by containment) cannot reach another namespace's buckets.
        #[test]
        fn no_bucket_pattern_admits_another_namespaces_buckets(
            (mine, theirs) in namespace_pair(),
            p in pattern(BUCKET_PIECES),
            fills in proptest::collection::vec(
                proptest::sample::select(vec!["", "x", "-", ".", "eu", "-eu", "a-", "shop"]).prop_map(String::from), 1..6),
        ) {
            let policy = TenancyPolicy::parse(
                &serde_json::json!({"rules": [{"namespaces": ["*"], "buckets": [p]}]}).to_string(),
            );
            prop_assume!(policy.is_ok());
            let policy = policy.unwrap_or_default();
            let mut fills = fills;
            fills.extend([mine.clone(), theirs.clone()]);
            let name = name_of(&p, &theirs, &fills);
            let filled = p.replace(NAMESPACE_PLACEHOLDER, &mine);
            prop_assert!(!glob_match(filled.as_bytes(), name.as_bytes()), "{p} admits {name} of {theirs} for {mine}");
            let listed = [name.clone()];
            let t = Tenant { buckets: &listed, ..tenant(&mine, URL, None) };
            prop_assert!(policy.check(&t).is_err(), "{p}: {mine} may list {name} of {theirs}");
        }
    }

    #[test]
    fn a_pattern_lies_within_another_only_when_all_its_names_do() {
        for (inner, outer, want) in [
            ("a", "a", true),
            ("a", "*", true),
            ("a*", "*", true),
            ("a*", "a*", true),
            ("ab*", "a*", true),
            ("a*", "ab*", false),
            ("a?c", "a*c", true),
            ("a*c", "a?c", false),
            ("a?", "a?", true),
            ("a?", "ab", false),
            ("*", "?*", false),
            ("x.a.y", "*.a.*", true),
            ("", "*", true),
            ("", "?", false),
        ] {
            assert_eq!(
                glob_within(inner.as_bytes(), outer.as_bytes()),
                want,
                "{inner} within {outer}"
            );
        }
    }

    #[test]
    fn the_queue_arn_is_the_region_the_client_uses() {
        let id = QueueId::of(Some("cn-north-1"), "http://localhost:4566/000000000000/q");
        assert_eq!(queue_arn(&id), "arn:aws-cn:sqs:cn-north-1:000000000000:q");
        let id = QueueId::of(None, "http://localhost:4566/000000000000/q");
        assert_eq!(queue_arn(&id), "arn:aws:sqs::000000000000:q");
        assert_eq!(partition("us-gov-west-1"), "aws-us-gov");
    }

    #[test]
    fn globs_match_like_iam() {
        let g = |p: &str, v: &str| glob_match(p.as_bytes(), v.as_bytes());
        assert!(g("*", ""));
        assert!(g("a*c", "abbbc"));
        assert!(g("a*c", "ac"));
        assert!(!g("a*c", "abd"));
        assert!(g("a?c", "abc"));
        assert!(!g("a?c", "ac"));
        assert!(g(
            "arn:aws:sqs:*:1:team-a-*",
            "arn:aws:sqs:us-east-1:1:team-a-orders"
        ));
        assert!(!g(
            "arn:aws:sqs:*:1:team-a-*",
            "arn:aws:sqs:us-east-1:1:team-ab"
        ));
        assert!(g("*a*b*", "xxaxxbxx"));
        assert!(!g("Team", "team"), "case-sensitive");
    }

    #[test]
    fn bad_policies_name_where_and_how() {
        for (text, at) in [
            ("rules: [{namespaces: []}]", "rules[0].namespaces"),
            ("rules: [{namespaces: [Team_A]}]", "rules[0].namespaces"),
            (
                "rules: [{namespaces: [\"{namespace}\"]}]",
                "rules[0].namespaces",
            ),
            (
                "rules: [{namespaces: [a]}, {namespaces: [b], queues: [team-b-*]}]",
                "rules[1].queues",
            ),
            (
                "rules: [{namespaces: [a], queues: [\"arn:aws:iam::1:role/x\"]}]",
                "rules[0].queues",
            ),
            (
                "rules: [{namespaces: [a], accounts: [abc]}]",
                "rules[0].accounts",
            ),
            (
                "rules: [{namespaces: [a], roleArns: [\"arn:aws:sqs:x:1:q\"]}]",
                "rules[0].roleArns",
            ),
            ("rules: [{namespaces: [a], queue: [\"*\"]}]", "the text"),
            ("rules: {namespaces: [a]}", "the text"),
        ] {
            let e = TenancyPolicy::parse(text).expect_err(text);
            assert_eq!(e.reason(), "InvalidTenancyPolicy", "{text}");
            let msg = e.to_string();
            assert!(msg.contains(at), "{text}: {msg}");
        }
    }
}
