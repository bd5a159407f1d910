//! Whether a pool may make pods of its template at all (issues 38 and 39): a pool pod is made
//! before any run exists, so nobody's rights are verified for it and no webhook judged it. The
//! pool makes pods only of a template whose spec the operator's admission rules pass (the same
//! engine the webhook, `doctor` and the run's own pipeline apply) and that uses no reference an
//! author's rights must cover (a Secret, ConfigMap, ServiceAccount, PVC, store or a
//! ClusterSandboxRunTemplate; its own namespace's template is not one), unless the operator
//! trusts every author (`--unadmitted-references=trust`). Runs made from a template a
//! pool refuses start cold and are judged as any run is. Pure.

use crate::api::SandboxRunSpec;
use crate::policy::stamp::{RightsPolicy, UnadmittedReferences};
use crate::policy::{refusals, RuleSettings};

/// Why a pool makes no pods of `made` (its template merged into an empty run), or None.
pub(crate) fn refusal(
    made: &SandboxRunSpec,
    rules: &RuleSettings,
    rights: &RightsPolicy,
) -> Option<String> {
    if let Some(refused) = refusals(made, rules) {
        return Some(format!(
            "the operator's admission rules refuse its template: {refused}"
        ));
    }
    if rights.unadmitted == UnadmittedReferences::Trust {
        return None;
    }
    // The pool's own template, when it is one of the pool's namespace: whoever may read that
    // namespace's pods sees what its runs would get anyway. A ClusterSandboxRunTemplate is read
    // only by whom RBAC names: a pool of one is a right like any other.
    let own_template = made
        .template_ref
        .as_ref()
        .is_some_and(|t| t.kind == crate::api::TemplateKind::SandboxRunTemplate);
    let mut fields = crate::policy::access::required_fields(made);
    fields.retain(|f| !(own_template && f.starts_with("spec.templateRef")));
    (!fields.is_empty()).then(|| {
        format!(
            "its template uses what an author's rights must cover ({}): a pool pod is made before \
             any run's author is known, so no admission verified them; runs made from it start \
             cold (or run the operator with --unadmitted-references=trust)",
            fields.into_iter().collect::<Vec<_>>().join(", ")
        )
    })
}

/// Why a pool of a namespace with `labels` makes no pods of `made`: the platform's namespace
/// policies that govern the namespace refuse it (an image, a runtime class, a cap…: a pool pod
/// runs the template's image before any run exists, so a policy the pool ignored would be one
/// the tenant bypassed by making a pool); None when they pass.
pub(crate) fn namespace_refusal(
    made: &SandboxRunSpec,
    labels: &std::collections::BTreeMap<String, String>,
    policies: &[crate::policy::namespace_policy::Compiled],
) -> Option<String> {
    let refused: Vec<String> = crate::policy::namespace_policy::violations(made, labels, policies)
        .into_iter()
        .map(|v| format!("{}: {} (hint: {})", v.field, v.message, v.hint))
        .collect();
    (!refused.is_empty()).then(|| {
        format!(
            "the platform's namespace policies refuse its template: {}",
            refused.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnvVar, ReadBack, ReadBackPath};

    fn spec() -> SandboxRunSpec {
        SandboxRunSpec {
            image: Some("registry.example/img@sha256:abc".into()),
            user: Some("1000".into()),
            read_back: Some(ReadBack {
                paths: vec![ReadBackPath {
                    path: "/work/out".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn hold() -> RightsPolicy {
        RightsPolicy::default()
    }

    #[test]
    fn a_plain_template_of_the_namespace_is_pooled_a_cluster_one_needs_trust() {
        use crate::api::TemplateRef;
        let mut made = spec();
        made.template_ref = Some(TemplateRef::namespaced("agent"));
        assert_eq!(refusal(&made, &RuleSettings::default(), &hold()), None);
        made.template_ref = Some(TemplateRef::cluster("agent"));
        let why = refusal(&made, &RuleSettings::default(), &hold()).expect("refused");
        assert!(why.contains("spec.templateRef"), "{why}");
    }

    #[test]
    fn a_template_the_rules_refuse_makes_no_pool_pods() {
        let mut bad = spec();
        bad.read_back.as_mut().unwrap().paths[0].path = "/../usr/local/bin".into();
        let why = refusal(&bad, &RuleSettings::default(), &hold()).expect("refused");
        assert!(why.contains("admission rules refuse"), "{why}");
    }

    #[test]
    fn a_template_using_an_authors_rights_is_pooled_only_when_every_author_is_trusted() {
        let mut secret = spec();
        secret.env = vec![EnvVar {
            name: "TOKEN".into(),
            value: String::new(),
            value_from: Some(
                serde_json::from_value(serde_json::json!(
                    {"secretKeyRef": {"name": "db", "key": "password"}}
                ))
                .unwrap(),
            ),
        }];
        let why = refusal(&secret, &RuleSettings::default(), &hold()).expect("refused");
        assert!(
            why.contains("rights must cover") && why.contains("env"),
            "{why}"
        );
        let trust = RightsPolicy {
            unadmitted: UnadmittedReferences::Trust,
            ..RightsPolicy::default()
        };
        assert_eq!(refusal(&secret, &RuleSettings::default(), &trust), None);
    }

    /// Issue #51 item 8: a pool pod runs its template's image before any run exists; on the old
    /// code the pool judged only the cluster's rules, so a namespace policy's image list was
    /// bypassed by making a pool.
    #[test]
    fn a_pool_makes_no_pods_of_a_template_its_namespace_policy_refuses() {
        let policies = crate::policy::namespace_policy::load(
            "- name: locked-tier\n  namespaceSelector: {matchLabels: {tier: locked}}\n  images: [\"registry.corp.example/**\"]\n",
        )
        .unwrap();
        let locked = [("tier".to_string(), "locked".to_string())].into();
        let why = namespace_refusal(&spec(), &locked, &policies).expect("refused");
        assert!(
            why.contains("spec.image") && why.contains("locked-tier"),
            "{why}"
        );
        assert_eq!(
            namespace_refusal(&spec(), &Default::default(), &policies),
            None
        );
        let mut allowed = spec();
        allowed.image = Some("registry.corp.example/tools/x:1".into());
        assert_eq!(namespace_refusal(&allowed, &locked, &policies), None);
    }
}
