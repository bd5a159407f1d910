//! The platform team's namespace policies (docs/contract.md "The platform's namespace policies"):
//! named rules for the runs of the namespaces a label selector picks — the runtime classes,
//! priority classes and toleration keys they may ask for, the images they may run, the largest
//! `sizeLimit` and `drainTimeout` they may declare, and whether they may name a ServiceAccount or
//! read Secrets at all. The operator reads them from a file (`run --namespace-policies`, chart
//! `runPolicy.namespacePolicies`); the webhook refuses a run that breaks one, naming it, and
//! `doctor` judges alike. Pure: the file in, the violations out.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::run_policy::{violations as list_violations, RunPolicy, Violation};
use crate::api::{MountType, SandboxRunSpec};

/// One policy as the file writes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespacePolicy {
    /// Its name: every refusal names it.
    pub name: String,
    /// The namespaces it governs; absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<Selector>,
    /// Allowed `runtimeClassName`s (absent: any; empty: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_classes: Option<Vec<String>>,
    /// Allowed `priorityClassName`s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_classes: Option<Vec<String>>,
    /// Allowed toleration keys (`*`: any, and a toleration without a key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_keys: Option<Vec<String>>,
    /// Image patterns `spec.image` must match one of: `*` matches within one `/`-separated part,
    /// `**` across parts (`registry.corp.example/**`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<String>>,
    /// The largest `readBack.paths[].sizeLimit` a run may declare (a quantity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size_limit: Option<String>,
    /// The longest `readBack.drainTimeout` a run may declare (`10m`, `1h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_drain_timeout: Option<String>,
    /// The largest `retryPolicy.limit` a run may declare (0: no counted retry; docs/user-guide.md
    /// "Retries").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry_limit: Option<u32>,
    /// The runtime class the controller gives a run of these namespaces that names none (the
    /// first governing policy that has one, in the file's order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_runtime_class: Option<String>,
    /// Whether a run may name a `serviceAccountName` (default true).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub service_accounts: bool,
    /// Whether a run may read Secrets: `env[].valueFrom.secretKeyRef` and `secret` mounts (default
    /// true; `imagePullSecrets` only pull the image and are not counted).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub secrets: bool,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// A namespace label selector, shaped like Kubernetes' `LabelSelector`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selector {
    /// Labels the namespace must carry with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements the namespace's labels must meet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// The values of `In` / `NotIn`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl Selector {
    /// Whether a namespace with `labels` is selected.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => value.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}

/// Why a policy file cannot be used: the operator does not start, `doctor` exits 2.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PolicyFileError {
    /// The file is not a YAML list of policies.
    #[error("namespace policies: {0}")]
    Parse(String),
    /// A policy's field is wrong.
    #[error("namespace policy `{policy}`: {message}")]
    Invalid {
        /// The policy's name.
        policy: String,
        /// What is wrong.
        message: String,
    },
}

/// A policy with its limits read, ready to judge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// As written (published for `doctor --context`).
    pub policy: NamespacePolicy,
    max_size_bytes: Option<u64>,
    max_drain_timeout: Option<Duration>,
}

impl Compiled {
    /// Whether this policy governs a namespace with `labels`.
    pub fn governs(&self, labels: &BTreeMap<String, String>) -> bool {
        self.policy
            .namespace_selector
            .as_ref()
            .is_none_or(|s| s.selects(labels))
    }

    /// Whether judging needs the namespace's labels.
    pub fn needs_labels(&self) -> bool {
        self.policy.namespace_selector.is_some()
    }
}

/// Reads a policy file: a YAML list of policies (an empty file: none).
pub fn load(text: &str) -> Result<Vec<Compiled>, PolicyFileError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let policies: Vec<NamespacePolicy> =
        serde_yaml::from_str(text).map_err(|e| PolicyFileError::Parse(e.to_string()))?;
    compile(policies)
}

/// Checks and reads each policy's limits; names must be unique DNS-1123 labels.
pub fn compile(policies: Vec<NamespacePolicy>) -> Result<Vec<Compiled>, PolicyFileError> {
    let mut seen = std::collections::BTreeSet::new();
    policies
        .into_iter()
        .map(|policy| {
            let invalid = |message: String| PolicyFileError::Invalid {
                policy: policy.name.clone(),
                message,
            };
            if !crate::names::is_dns1123_label(&policy.name) {
                return Err(invalid("the name must be a DNS-1123 label".into()));
            }
            if !seen.insert(policy.name.clone()) {
                return Err(invalid("two policies have this name".into()));
            }
            for r in policy
                .namespace_selector
                .iter()
                .flat_map(|s| &s.match_expressions)
            {
                if !["In", "NotIn", "Exists", "DoesNotExist"].contains(&r.operator.as_str()) {
                    return Err(invalid(format!(
                        "matchExpressions operator `{}` (In, NotIn, Exists or DoesNotExist)",
                        r.operator
                    )));
                }
            }
            if let Some(class) = &policy.default_runtime_class {
                if !crate::names::is_dns1123_subdomain(class) {
                    return Err(invalid(format!(
                        "defaultRuntimeClass `{class}` is not a DNS-1123 subdomain"
                    )));
                }
                if let Some(allowed) = policy
                    .runtime_classes
                    .as_ref()
                    .filter(|a| !a.contains(class))
                {
                    return Err(invalid(format!(
                        "defaultRuntimeClass `{class}` is not among its runtimeClasses ({})",
                        allowed.join(", ")
                    )));
                }
            }
            let max_size_bytes = policy
                .max_size_limit
                .as_deref()
                .map(|q| quantity_bytes(q).map_err(|e| invalid(format!("maxSizeLimit: {e}"))))
                .transpose()?;
            let max_drain_timeout = policy
                .max_drain_timeout
                .as_deref()
                .map(|d| {
                    crate::units::parse_duration(d)
                        .map_err(|e| invalid(format!("maxDrainTimeout: {e}")))
                })
                .transpose()?;
            Ok(Compiled {
                policy,
                max_size_bytes,
                max_drain_timeout,
            })
        })
        .collect()
}

fn quantity_bytes(text: &str) -> Result<u64, crate::units::QuantityError> {
    crate::units::quantity_to_bytes(&k8s_openapi::apimachinery::pkg::api::resource::Quantity(
        text.to_string(),
    ))
}

/// The `defaultRuntimeClass` of the first policy governing a namespace with `labels` that has one.
pub fn default_runtime_class<'a>(
    labels: &BTreeMap<String, String>,
    policies: &'a [Compiled],
) -> Option<&'a str> {
    policies
        .iter()
        .filter(|p| p.governs(labels))
        .find_map(|p| p.policy.default_runtime_class.as_deref())
}

/// Whether any policy gives a default runtime class (the controller then reads namespaces'
/// labels before it creates pods).
pub fn gives_defaults(policies: &[Compiled]) -> bool {
    policies
        .iter()
        .any(|p| p.policy.default_runtime_class.is_some())
}

/// Every way `spec`, bound for a namespace with `labels`, breaks the policies that govern it.
pub fn violations(
    spec: &SandboxRunSpec,
    labels: &BTreeMap<String, String>,
    policies: &[Compiled],
) -> Vec<Violation> {
    policies
        .iter()
        .filter(|p| p.governs(labels))
        .flat_map(|p| violations_of(spec, p))
        .collect()
}

/// The violations of `spec` that `old` (the stored spec of an UPDATE) did not have already: a
/// policy written after a run was admitted never blocks its later updates (its finalizer's
/// release, `stop`), only what an update adds.
pub fn added_violations(
    spec: &SandboxRunSpec,
    old: Option<&SandboxRunSpec>,
    labels: &BTreeMap<String, String>,
    policies: &[Compiled],
) -> Vec<Violation> {
    let before = old
        .map(|o| violations(o, labels, policies))
        .unwrap_or_default();
    violations(spec, labels, policies)
        .into_iter()
        .filter(|v| !before.contains(v))
        .collect()
}

/// The violations of one policy.
fn violations_of(spec: &SandboxRunSpec, compiled: &Compiled) -> Vec<Violation> {
    let p = &compiled.policy;
    let lists = RunPolicy {
        runtime_classes: p.runtime_classes.clone(),
        priority_classes: p.priority_classes.clone(),
        toleration_keys: p.toleration_keys.clone(),
    };
    let hint = format!(
        "change the field, or ask the platform team about namespace policy `{}` (run \
         --namespace-policies, chart runPolicy.namespacePolicies)",
        p.name
    );
    let mut out: Vec<Violation> = list_violations(spec, &lists)
        .into_iter()
        .map(|v| Violation {
            message: v.message.replace(
                "the cluster's run policy",
                &format!("namespace policy `{}`", p.name),
            ),
            hint: hint.clone(),
            field: v.field,
        })
        .collect();
    let mut refuse = |field: &str, what: String, allowed: String| {
        out.push(Violation {
            field: field.to_string(),
            message: format!(
                "{what} is not allowed by namespace policy `{}` ({allowed})",
                p.name
            ),
            hint: hint.clone(),
        });
    };
    if let (Some(patterns), Some(image)) = (&p.images, &spec.image) {
        if !patterns.iter().any(|pat| image_matches(pat, image)) {
            let allowed = format!("images matching {}", patterns.join(", "));
            refuse("spec.image", format!("image `{image}`"), allowed);
        }
    }
    judge_limits(spec, compiled, &mut refuse);
    if !p.service_accounts {
        if let Some(sa) = &spec.service_account_name {
            let what = format!("serviceAccountName `{sa}`");
            refuse("spec.serviceAccountName", what, "no ServiceAccount".into());
        }
    }
    if !p.secrets {
        for (field, what) in secret_uses(spec) {
            refuse(&field, what, "no Secret".into());
        }
    }
    out
}

/// The declared `sizeLimit`s and `drainTimeout` above the policy's maxima.
fn judge_limits(
    spec: &SandboxRunSpec,
    compiled: &Compiled,
    refuse: &mut impl FnMut(&str, String, String),
) {
    if let (Some(max), Some(policy)) = (compiled.policy.max_retry_limit, &spec.retry_policy) {
        if policy.limit > max {
            refuse(
                "spec.retryPolicy.limit",
                format!("retryPolicy.limit {}", policy.limit),
                format!("at most {max}"),
            );
        }
    }
    let Some(rb) = &spec.read_back else { return };
    if let Some(max) = compiled.max_size_bytes {
        for (i, path) in rb.paths.iter().enumerate() {
            let Some(q) = &path.size_limit else { continue };
            // A limit that does not parse is the read-back-size-limit rule's.
            if crate::units::quantity_to_bytes(q).is_ok_and(|b| b > max) {
                let limit = compiled.policy.max_size_limit.clone().unwrap_or_default();
                refuse(
                    &format!("spec.readBack.paths[{i}].sizeLimit"),
                    format!("sizeLimit {}", q.0),
                    format!("at most {limit}"),
                );
            }
        }
    }
    if let (Some(max), Some(text)) = (compiled.max_drain_timeout, &rb.drain_timeout) {
        if crate::units::parse_duration(text).is_ok_and(|d| d > max) {
            let limit = compiled
                .policy
                .max_drain_timeout
                .clone()
                .unwrap_or_default();
            refuse(
                "spec.readBack.drainTimeout",
                format!("drainTimeout {text}"),
                format!("at most {limit}"),
            );
        }
    }
}

/// Where `spec` reads a Secret: `(field, in words)`.
fn secret_uses(spec: &SandboxRunSpec) -> Vec<(String, String)> {
    let env = spec.env.iter().enumerate().filter_map(|(i, e)| {
        let r = e.value_from.as_ref()?.secret_key_ref.as_ref()?;
        Some((
            format!("spec.env[{i}].valueFrom.secretKeyRef"),
            format!("env {} from Secret `{}`", e.name, r.name),
        ))
    });
    let mounts = spec
        .mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| m.kind == MountType::Secret)
        .map(|(i, m)| {
            (
                format!("spec.mounts[{i}]"),
                format!(
                    "the mount of Secret `{}`",
                    m.source.as_deref().unwrap_or_default()
                ),
            )
        });
    env.chain(mounts).collect()
}

/// Whether `image` matches `pattern`: `**` matches any run of characters, `*` any run without a
/// `/`, everything else itself. Linear in the image for a given pattern (one pass a pattern
/// character: the run author writes the image, so no backtracking), and an image longer than any
/// reference can be (4 KiB) matches nothing.
pub fn image_matches(pattern: &str, image: &str) -> bool {
    let s = image.as_bytes();
    if s.len() > 4096 {
        return false;
    }
    // can[j]: the pattern read so far matches s[..j].
    let mut can = vec![false; s.len() + 1];
    can[0] = true;
    let mut p = pattern.as_bytes();
    while let Some((&c, rest)) = p.split_first() {
        let mut next = vec![false; s.len() + 1];
        if c == b'*' && rest.first() == Some(&b'*') {
            let mut seen = false;
            for j in 0..=s.len() {
                seen |= can[j];
                next[j] = seen;
            }
            p = &rest[1..];
        } else if c == b'*' {
            for j in 0..=s.len() {
                next[j] = can[j] || (j > 0 && next[j - 1] && s[j - 1] != b'/');
            }
            p = rest;
        } else {
            for j in 0..s.len() {
                next[j + 1] = can[j] && s[j] == c;
            }
            p = rest;
        }
        can = next;
    }
    can[s.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnvVar, EnvVarSource, Mount, ReadBack, ReadBackPath};
    use k8s_openapi::api::core::v1::SecretKeySelector;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const FILE: &str = r#"
- name: free-tier
  namespaceSelector:
    matchLabels: {tier: free}
  runtimeClasses: [gvisor]
  priorityClasses: []
  tolerationKeys: [sandbox]
  images: ["registry.corp.example/**", "docker.io/library/busybox:*"]
  maxSizeLimit: 1Gi
  maxDrainTimeout: 10m
  maxRetryLimit: 2
  serviceAccounts: false
  secrets: false
- name: everyone
  maxSizeLimit: 100Gi
"#;

    fn spec_with(edit: impl FnOnce(&mut SandboxRunSpec)) -> SandboxRunSpec {
        let mut spec = SandboxRunSpec {
            image: Some("registry.corp.example/team/tool:1".into()),
            runtime_class_name: Some("gvisor".into()),
            read_back: Some(ReadBack {
                paths: vec![ReadBackPath {
                    path: "/out".into(),
                    size_limit: Some(Quantity("512Mi".into())),
                    required: false,
                }],
                drain_timeout: Some("5m".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        edit(&mut spec);
        spec
    }

    fn refused(spec: &SandboxRunSpec, ns: &BTreeMap<String, String>) -> Vec<String> {
        let policies = load(FILE).unwrap();
        violations(spec, ns, &policies)
            .into_iter()
            .map(|v| {
                let policy = v
                    .message
                    .split("namespace policy `")
                    .nth(1)
                    .and_then(|rest| rest.split('`').next())
                    .unwrap_or("?")
                    .to_string();
                format!("{} by {policy}", v.field)
            })
            .collect()
    }

    #[test]
    fn each_rule_refuses_in_the_namespaces_it_selects_and_names_its_policy() {
        let free = labels(&[("tier", "free")]);
        let paid = labels(&[("tier", "paid")]);
        assert_eq!(refused(&spec_with(|_| {}), &free), Vec::<String>::new());
        let policies = load(FILE).unwrap();
        let runc = spec_with(|s| s.runtime_class_name = Some("runc".into()));
        let hint = &violations(&runc, &free, &policies)[0].hint;
        assert!(hint.contains("namespace policy `free-tier`"), "{hint}");
        type Edit = Box<dyn Fn(&mut SandboxRunSpec)>;
        let table: Vec<(&str, Edit)> = vec![
            (
                "spec.runtimeClassName",
                Box::new(|s| s.runtime_class_name = Some("runc".into())),
            ),
            (
                "spec.priorityClassName",
                Box::new(|s| s.priority_class_name = Some("high".into())),
            ),
            (
                "spec.image",
                Box::new(|s| s.image = Some("docker.io/evil/miner:1".into())),
            ),
            (
                "spec.readBack.paths[0].sizeLimit",
                Box::new(|s| {
                    if let Some(rb) = s.read_back.as_mut() {
                        rb.paths[0].size_limit = Some(Quantity("2Gi".into()));
                    }
                }),
            ),
            (
                "spec.readBack.drainTimeout",
                Box::new(|s| {
                    if let Some(rb) = s.read_back.as_mut() {
                        rb.drain_timeout = Some("1h".into());
                    }
                }),
            ),
            (
                "spec.retryPolicy.limit",
                Box::new(|s| {
                    s.retry_policy = Some(crate::api::RetryPolicy {
                        limit: 5,
                        ..Default::default()
                    })
                }),
            ),
            (
                "spec.serviceAccountName",
                Box::new(|s| s.service_account_name = Some("ci-bot".into())),
            ),
            (
                "spec.env[0].valueFrom.secretKeyRef",
                Box::new(|s| {
                    s.env = vec![EnvVar {
                        name: "TOKEN".into(),
                        value: String::new(),
                        value_from: Some(EnvVarSource {
                            secret_key_ref: Some(SecretKeySelector {
                                name: "db".into(),
                                key: "password".into(),
                                optional: None,
                            }),
                            config_map_key_ref: None,
                        }),
                    }]
                }),
            ),
            (
                "spec.mounts[0]",
                Box::new(|s| {
                    s.mounts = vec![Mount {
                        name: "creds".into(),
                        kind: MountType::Secret,
                        source: Some("db".into()),
                        target: "/creds".into(),
                        read_only: true,
                    }]
                }),
            ),
        ];
        for (field, edit) in &table {
            let spec = spec_with(|s| edit(s));
            // Refused where the policy governs, naming it; allowed in a namespace it does not.
            assert_eq!(
                refused(&spec, &free),
                [format!("{field} by free-tier")],
                "{field}"
            );
            assert_eq!(refused(&spec, &paid), Vec::<String>::new(), "{field}");
        }
        // A policy without a selector governs every namespace.
        let huge = spec_with(|s| {
            if let Some(rb) = s.read_back.as_mut() {
                rb.paths[0].size_limit = Some(Quantity("200Gi".into()));
            }
        });
        assert_eq!(
            refused(&huge, &paid),
            ["spec.readBack.paths[0].sizeLimit by everyone"]
        );
    }

    #[test]
    fn an_update_is_judged_only_on_what_it_adds() {
        let policies = load(FILE).unwrap();
        let free = labels(&[("tier", "free")]);
        let stored = spec_with(|s| s.service_account_name = Some("ci-bot".into()));
        // The stored run already broke the policy (written after it was admitted): stopping it
        // adds nothing; a new violation is still refused.
        let stopped = spec_with(|s| {
            s.service_account_name = Some("ci-bot".into());
            s.stop = true;
        });
        assert!(added_violations(&stopped, Some(&stored), &free, &policies).is_empty());
        let worse = spec_with(|s| {
            s.service_account_name = Some("ci-bot".into());
            s.runtime_class_name = Some("runc".into());
        });
        let added = added_violations(&worse, Some(&stored), &free, &policies);
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].field, "spec.runtimeClassName");
        assert_eq!(added_violations(&stored, None, &free, &policies).len(), 1);
    }

    #[test]
    fn the_first_governing_policy_with_a_default_runtime_class_gives_it() {
        let policies = load(
            "- name: free-tier
  namespaceSelector: {matchLabels: {tier: free}}
  runtimeClasses: [gvisor]
  defaultRuntimeClass: gvisor
- name: everyone
  defaultRuntimeClass: kata
- name: late
  defaultRuntimeClass: runc
",
        )
        .unwrap();
        assert_eq!(
            default_runtime_class(&labels(&[("tier", "free")]), &policies),
            Some("gvisor")
        );
        assert_eq!(default_runtime_class(&labels(&[]), &policies), Some("kata"));
        assert!(gives_defaults(&policies));
        assert!(!gives_defaults(&load(FILE).unwrap()));
        // A default outside the policy's own list, or not a name, is refused at load.
        let err = load("- name: a\n  runtimeClasses: [gvisor]\n  defaultRuntimeClass: runc\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not among its runtimeClasses"), "{err}");
        assert!(load("- name: a\n  defaultRuntimeClass: Not_A_Name\n").is_err());
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let s = Selector {
            match_labels: labels(&[("tier", "free")]),
            match_expressions: vec![
                Requirement {
                    key: "region".into(),
                    operator: "In".into(),
                    values: vec!["eu".into(), "us".into()],
                },
                Requirement {
                    key: "legacy".into(),
                    operator: "DoesNotExist".into(),
                    values: vec![],
                },
            ],
        };
        assert!(s.selects(&labels(&[("tier", "free"), ("region", "eu")])));
        assert!(!s.selects(&labels(&[("tier", "free"), ("region", "ap")])));
        assert!(!s.selects(&labels(&[("tier", "free")])));
        assert!(!s.selects(&labels(&[
            ("tier", "free"),
            ("region", "eu"),
            ("legacy", "1")
        ])));
        assert!(Selector::default().selects(&labels(&[])));
    }

    #[test]
    fn a_bad_file_is_refused_with_the_policy_and_the_field() {
        let err = |text: &str| load(text).unwrap_err().to_string();
        assert!(err("- name: a\n  maxSizeLimit: lots\n").contains("`a`: maxSizeLimit"));
        assert!(err("- name: a\n  maxDrainTimeout: soon\n").contains("maxDrainTimeout"));
        assert!(err("- name: a\n- name: a\n").contains("two policies"));
        assert!(err("- name: Not_A_Label\n").contains("DNS-1123"));
        assert!(err("- name: a\n  imagez: []\n").contains("unknown field"));
        assert!(err(
            "- name: a\n  namespaceSelector:\n    matchExpressions: [{key: k, operator: Like}]\n"
        )
        .contains("Like"));
        assert_eq!(load("").unwrap(), Vec::new());
        assert_eq!(load(FILE).unwrap().len(), 2);
    }

    #[test]
    fn image_patterns_star_within_a_part_and_double_star_across() {
        assert!(image_matches(
            "registry.corp.example/**",
            "registry.corp.example/a/b:1"
        ));
        assert!(!image_matches(
            "registry.corp.example/*",
            "registry.corp.example/a/b:1"
        ));
        assert!(image_matches(
            "registry.corp.example/*",
            "registry.corp.example/a:1"
        ));
        assert!(image_matches(
            "docker.io/library/busybox:*",
            "docker.io/library/busybox:1.36"
        ));
        assert!(!image_matches(
            "docker.io/library/busybox:*",
            "docker.io/library/busybox"
        ));
        assert!(!image_matches(
            "registry.corp.example/**",
            "registry.corp.example.evil.io/x"
        ));
        assert!(image_matches("exact:tag", "exact:tag"));
        assert!(!image_matches("exact:tag", "exact:tag2"));
        assert!(image_matches("**", ""));
        assert!(image_matches("a/*/c", "a//c"));
        // A long image against many stars stays linear (no backtracking), and one longer than
        // any reference matches nothing.
        let long = "a".repeat(4000);
        assert!(!image_matches("**a**b**a**b**a**b**c", &long));
        assert!(!image_matches("**", &"a".repeat(5000)));
    }
}
