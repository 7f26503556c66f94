//! RBAC for tests: which verb on which resource each recorded request needs (as the API server
//! authorizes it), and whether the rules of a Role or ClusterRole file grant it.

use serde_json::Value;

use super::Recorded;

/// What the API server authorizes for one request.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Need {
    pub group: String,
    /// `plural` or `plural/subresource`.
    pub resource: String,
    pub verb: String,
    pub name: Option<String>,
}

impl std::fmt::Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {group}/{}", self.verb, self.resource)?;
        if let Some(n) = &self.name {
            write!(f, " {n}")?;
        }
        Ok(())
    }
}

/// The verb and resource a request needs. Server-side apply of an object that did not exist is a
/// create (the API server authorizes it as such); the fake answers 201 then.
pub fn need(r: &Recorded) -> Need {
    let segments: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
        _ => panic!("not a resource path: {}", r.path),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        other => other,
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(name.to_string()), None),
        [plural, name, sub] => (*plural, Some(name.to_string()), Some(*sub)),
        _ => panic!("unexpected resource path: {}", r.path),
    };
    let verb = match (r.method.as_str(), name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if r.is_watch() => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PATCH", _) if r.is_apply() && r.status == 201 => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (m, _) => panic!("unexpected method {m} on {}", r.path),
    };
    Need {
        group,
        resource: match sub {
            Some(s) => format!("{plural}/{s}"),
            None => plural.to_string(),
        },
        verb: verb.to_string(),
        // Creates carry no name RBAC could match; a list or watch does when it selects one object by
        // `fieldSelector=metadata.name=NAME`, as the API server authorizes it (the real control plane
        // grants a standby's watch of its own Lease that way: tests/e2e, tests/k8s_real.rs).
        name: match verb {
            "create" => None,
            "list" | "watch" => r
                .query
                .get("fieldSelector")
                .and_then(|f| f.strip_prefix("metadata.name="))
                .filter(|n| !n.contains(','))
                .map(str::to_string),
            _ => name,
        },
    }
}

/// The rules of every Role and ClusterRole in a YAML file.
pub fn rules(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .unwrap()
        .into_iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("Role" | "ClusterRole")))
        .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn has(list: &Value, item: &str) -> bool {
    list.as_array()
        .is_some_and(|l| l.iter().any(|v| v.as_str() == Some(item)))
}

/// True when one of `rules` grants `need`.
pub fn grants(rules: &[Value], need: &Need) -> bool {
    rules.iter().any(|rule| {
        has(&rule["apiGroups"], &need.group)
            && has(&rule["resources"], &need.resource)
            && has(&rule["verbs"], &need.verb)
            && match rule.get("resourceNames") {
                None => true,
                Some(names) => need.name.as_deref().is_some_and(|n| has(names, n)),
            }
    })
}

/// The distinct needs of `requests` that `rules` do not grant, for an assertion message.
pub fn ungranted(rules: &[Value], requests: &[Recorded]) -> Vec<String> {
    let mut out: Vec<String> = requests
        .iter()
        .map(need)
        .filter(|n| !grants(rules, n))
        .map(|n| n.to_string())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Fails the test when a request in `requests` is not granted by the Roles and ClusterRoles of
/// `files` (paths relative to the crate root, e.g. config/rbac/role.yaml).
pub fn assert_granted(files: &[&str], requests: &[Recorded]) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules: Vec<Value> = files
        .iter()
        .flat_map(|f| rules(&std::fs::read_to_string(root.join(f)).unwrap()))
        .collect();
    assert!(!requests.is_empty(), "no requests recorded");
    let missing = ungranted(&rules, requests);
    assert!(
        missing.is_empty(),
        "the controller made requests {files:?} do not grant: {missing:?}"
    );
}
