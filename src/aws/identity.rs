//! The AWS identity of one QueueConsumer's calls: its `spec.aws.roleArn`, assumed with STS AssumeRole
//! through the SDK's own `AssumeRoleProvider` over the caller's credentials (the controller's, or the
//! worker pod's). The names (session, ExternalId) are pure; `assume` only wraps an SDK config.

use aws_config::SdkConfig;
use aws_config::sts::AssumeRoleProvider;
use aws_credential_types::provider::SharedCredentialsProvider;
use sha2::{Digest, Sha256};

/// STS's limit on a role session name.
const SESSION_NAME_MAX: usize = 64;

/// A role to assume, and as whom.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Role {
    pub arn: String,
    /// `qc-NAMESPACE.NAME` (shortened with a hash past 64 characters): CloudTrail shows which
    /// QueueConsumer a call was made for.
    pub session_name: String,
    /// `qc:NAMESPACE`: a role's trust policy can pin it to one namespace
    /// (`"Condition": {"StringEquals": {"sts:ExternalId": "qc:team-a"}}`), so a QueueConsumer in another
    /// namespace naming the role cannot have the controller assume it.
    pub external_id: String,
}

impl Role {
    /// The role QueueConsumer `namespace/name` names.
    pub fn for_consumer(arn: &str, namespace: &str, name: &str) -> Role {
        Role {
            arn: arn.to_string(),
            session_name: session_name(namespace, name),
            external_id: external_id(namespace),
        }
    }

    /// What tells the permissions of two sessions apart: the role and the ExternalId (the trust policy
    /// decides on both), not the session name. Reads made as one are valid for the other.
    pub fn grant(&self) -> (String, String) {
        (self.arn.clone(), self.external_id.clone())
    }
}

/// The role a QueueConsumer names (`spec.aws.roleArn`), as the controller and its workers assume it.
pub fn of_consumer(qc: &crate::api::QueueConsumer) -> Option<Role> {
    qc.spec.aws.role_arn.as_deref().map(|arn| {
        Role::for_consumer(
            arn,
            qc.metadata.namespace.as_deref().unwrap_or("default"),
            qc.metadata.name.as_deref().unwrap_or(""),
        )
    })
}

/// The ExternalId the controller and the worker present for a QueueConsumer of `namespace`.
pub fn external_id(namespace: &str) -> String {
    format!("qc:{namespace}")
}

/// `qc-NAMESPACE.NAME`, within STS's 64 characters: a longer one keeps its first 55 characters and
/// ends in 8 hex digits of a hash of the whole, so two QueueConsumers never share one. Namespaces and
/// names are DNS labels and subdomains, all characters STS accepts.
pub fn session_name(namespace: &str, name: &str) -> String {
    // A namespace holds no '.', so the first '.' ends it: `a-b/c` and `a/b-c` get two names.
    let full = format!("qc-{namespace}.{name}");
    if full.len() <= SESSION_NAME_MAX {
        return full;
    }
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let mut short: String = full.chars().take(SESSION_NAME_MAX - 9).collect();
    short.push('-');
    short.push_str(&hex::encode(&digest[..4]));
    short
}

/// `conf` acting as `role`: AssumeRole with `conf`'s own credentials, region and endpoint (so an
/// emulator allowed for the queue serves STS too). The SDK caches the credentials and refreshes them
/// before they expire (the config's identity cache); nothing here signs or stores a key.
pub async fn assume(conf: SdkConfig, role: &Role) -> SdkConfig {
    let mut builder = AssumeRoleProvider::builder(&role.arn)
        .session_name(&role.session_name)
        .configure(&conf);
    // The worker run by hand may present none.
    if !role.external_id.is_empty() {
        builder = builder.external_id(&role.external_id);
    }
    let provider = builder.build().await;
    conf.into_builder()
        .credentials_provider(SharedCredentialsProvider::new(provider))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_a_consumer() {
        let r = Role::for_consumer("arn:aws:iam::1:role/r", "team-a", "orders");
        assert_eq!(r.session_name, "qc-team-a.orders");
        assert_eq!(r.external_id, "qc:team-a");
        let b = Role::for_consumer("arn:aws:iam::1:role/r", "team-b", "orders");
        assert_ne!(r.grant(), b.grant(), "namespaces never share a grant");
        let again = Role::for_consumer("arn:aws:iam::1:role/r", "team-a", "billing");
        assert_eq!(
            r.grant(),
            again.grant(),
            "one namespace, one role: one grant"
        );
    }

    #[test]
    fn long_session_names_stay_distinct_within_64() {
        let ns = "n".repeat(63);
        let a = session_name(&ns, &"a".repeat(200));
        let b = session_name(&ns, &format!("{}b", "a".repeat(199)));
        assert_eq!(a.len(), 64);
        assert_eq!(b.len(), 64);
        assert_ne!(a, b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "+=,.@-_".contains(c)),
            "{a}"
        );
        assert_eq!(session_name("a", "b"), "qc-a.b");
        assert_ne!(
            session_name("a-b", "c"),
            session_name("a", "b-c"),
            "#41: one session name for two QueueConsumers"
        );
    }
}
