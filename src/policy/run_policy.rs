//! The cluster's run policy (docs/contract.md "A run uses only its author's rights"): what the
//! platform team lets any run ask for, whoever its author is. The operator's flags
//! (`--allowed-runtime-classes`, `--allowed-priority-classes`, `--allowed-toleration-keys`, chart
//! `runPolicy.*`) restrict the pod fields that move a run onto other nodes, other sandboxes or
//! ahead of other workloads to a list; the webhook refuses the rest, `doctor` judges with the same
//! lists (`--context` reads them from the operator's published settings). Pure.

use crate::api::SandboxRunSpec;

/// The lists a run's pod fields must come from. `None`: anything the other rules accept; an
/// empty list: the field may not be set at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunPolicy {
    /// Allowed `spec.runtimeClassName`s.
    pub runtime_classes: Option<Vec<String>>,
    /// Allowed `spec.priorityClassName`s.
    pub priority_classes: Option<Vec<String>>,
    /// Allowed toleration keys of `spec.tolerations`; `*` also allows a toleration with no key
    /// (which tolerates every taint).
    pub toleration_keys: Option<Vec<String>>,
}

/// What `--allowed-toleration-keys` must hold for a toleration without a key to pass.
pub const ANY_KEY: &str = "*";

impl RunPolicy {
    /// Whether the policy restricts anything.
    pub fn is_restrictive(&self) -> bool {
        self.runtime_classes.is_some()
            || self.priority_classes.is_some()
            || self.toleration_keys.is_some()
    }

    /// One line for a report ("runtime classes gvisor; priority classes any; …").
    pub fn describe(&self) -> String {
        let list = |l: &Option<Vec<String>>| match l {
            None => "any".to_string(),
            Some(v) if v.is_empty() => "none".to_string(),
            Some(v) => v.join(","),
        };
        format!(
            "runtime classes {}; priority classes {}; toleration keys {}",
            list(&self.runtime_classes),
            list(&self.priority_classes),
            list(&self.toleration_keys)
        )
    }
}

/// Parses a flag's value into a list: `None` when the flag is unset, an empty list for `""`.
pub fn parse_list(value: Option<&str>) -> Option<Vec<String>> {
    value.map(|v| {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    })
}

/// A field of a run the policy does not allow (the rules engine turns it into a `run-policy`
/// finding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The field (`spec.runtimeClassName`, `spec.tolerations[1]`, …).
    pub field: String,
    /// The refused value, in words.
    pub message: String,
    /// The hint: the allowed values and the setting that lists them.
    pub hint: String,
}

/// Every field of `spec` the policy does not allow.
pub(crate) fn violations(spec: &SandboxRunSpec, policy: &RunPolicy) -> Vec<Violation> {
    let mut out = Vec::new();
    if let (Some(allowed), Some(rc)) = (&policy.runtime_classes, &spec.runtime_class_name) {
        if !allowed.contains(rc) {
            out.push(refusal(
                "spec.runtimeClassName",
                &format!("runtimeClassName `{rc}`"),
                allowed,
                "--allowed-runtime-classes (chart runPolicy.runtimeClasses)",
            ));
        }
    }
    if let (Some(allowed), Some(pc)) = (&policy.priority_classes, &spec.priority_class_name) {
        if !allowed.contains(pc) {
            out.push(refusal(
                "spec.priorityClassName",
                &format!("priorityClassName `{pc}`"),
                allowed,
                "--allowed-priority-classes (chart runPolicy.priorityClasses)",
            ));
        }
    }
    if let Some(allowed) = &policy.toleration_keys {
        for (i, t) in spec.tolerations.iter().flatten().enumerate() {
            let key = t.key.as_deref().unwrap_or("");
            let ok = if key.is_empty() {
                allowed.iter().any(|k| k == ANY_KEY)
            } else {
                allowed.iter().any(|k| k == key || k == ANY_KEY)
            };
            if !ok {
                let what = if key.is_empty() {
                    "a toleration without a key (it tolerates every taint)".to_string()
                } else {
                    format!("a toleration of key `{key}`")
                };
                out.push(refusal(
                    &format!("spec.tolerations[{i}]"),
                    &what,
                    allowed,
                    "--allowed-toleration-keys (chart runPolicy.tolerationKeys)",
                ));
            }
        }
    }
    out
}

/// The violation of `what` at `field`, refused by the policy `setting` that allows `allowed`.
fn refusal(field: &str, what: &str, allowed: &[String], setting: &str) -> Violation {
    let allowed_text = if allowed.is_empty() {
        "none is allowed".to_string()
    } else {
        format!("allowed: {}", allowed.join(", "))
    };
    Violation {
        field: field.to_string(),
        message: format!("{what} is not allowed by the cluster's run policy ({allowed_text})"),
        hint: format!(
            "use an allowed value or leave the field unset; the platform team sets the list with \
             the operator's {setting}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Toleration;

    fn toleration(key: Option<&str>) -> Toleration {
        Toleration {
            key: key.map(str::to_string),
            operator: Some(if key.is_some() { "Equal" } else { "Exists" }.into()),
            ..Toleration::default()
        }
    }

    fn judged(spec: &SandboxRunSpec, policy: &RunPolicy) -> Vec<String> {
        violations(spec, policy)
            .into_iter()
            .map(|v| v.field)
            .collect()
    }

    #[test]
    fn each_field_is_allowed_from_its_list_and_refused_outside_it() {
        let policy = RunPolicy {
            runtime_classes: Some(vec!["gvisor".into()]),
            priority_classes: Some(vec!["batch-low".into()]),
            toleration_keys: Some(vec!["sandbox".into()]),
        };
        let allowed = SandboxRunSpec {
            runtime_class_name: Some("gvisor".into()),
            priority_class_name: Some("batch-low".into()),
            tolerations: Some(vec![toleration(Some("sandbox"))]),
            ..Default::default()
        };
        assert!(judged(&allowed, &policy).is_empty());
        assert!(
            judged(&SandboxRunSpec::default(), &policy).is_empty(),
            "unset is fine"
        );
        let refused = SandboxRunSpec {
            runtime_class_name: Some("runc".into()),
            priority_class_name: Some("system-cluster-critical".into()),
            tolerations: Some(vec![toleration(Some("sandbox")), toleration(None)]),
            ..Default::default()
        };
        assert_eq!(
            judged(&refused, &policy),
            [
                "spec.runtimeClassName",
                "spec.priorityClassName",
                "spec.tolerations[1]"
            ]
        );
        // No policy: anything the other rules accept.
        assert!(judged(&refused, &RunPolicy::default()).is_empty());
    }

    #[test]
    fn an_empty_list_allows_none_and_a_star_allows_every_key() {
        let none = RunPolicy {
            runtime_classes: Some(Vec::new()),
            ..Default::default()
        };
        let spec = SandboxRunSpec {
            runtime_class_name: Some("gvisor".into()),
            tolerations: Some(vec![toleration(None)]),
            ..Default::default()
        };
        let out = violations(&spec, &none);
        assert_eq!(out.len(), 1);
        assert!(out[0].message.contains("none is allowed"), "{out:?}");
        let star = RunPolicy {
            toleration_keys: Some(vec![ANY_KEY.into()]),
            ..Default::default()
        };
        assert!(judged(&spec, &star).is_empty());
    }

    #[test]
    fn a_flag_value_is_a_list_and_an_empty_one_allows_nothing() {
        assert_eq!(parse_list(None), None);
        assert_eq!(parse_list(Some("")), Some(Vec::new()));
        assert_eq!(
            parse_list(Some("gvisor, kata,")),
            Some(vec!["gvisor".to_string(), "kata".to_string()])
        );
    }
}
