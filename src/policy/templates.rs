//! The webhook's template step (docs/contract.md "Templates"): a run that names a
//! SandboxRunTemplate (or a ClusterSandboxRunTemplate) is judged as the spec it would run with — the template's spec with the
//! run's open fields ([`crate::template`]) — and refused when it sets a field the template locks.
//! [`resolve`] reads the template (the only I/O); [`judge_with`] is the pure verdict.
//!
//! CREATE is judged in full. An UPDATE is judged only for what it adds, as every other rule is
//! (`super::ratchet`): a locked field the stored run already set is not refused again, and the
//! stored and new specs are both merged with the template as it is now, so what the update rules
//! compare is only what the run itself changed. A template gone since the run was admitted does
//! not hold an update of the run (setting `stop`, say): the run's own specs are judged then, with
//! a warning.

use kube::api::Api;
use kube::Client;
use serde::Deserialize;
use serde_json::Value;

use super::rules::{ids, Finding};
use crate::api::{
    ClusterSandboxRunTemplate, SandboxRunSpec, SandboxRunTemplate, SandboxRunTemplateSpec,
    TemplateKind, TemplateRef,
};
use crate::template::{self, MergeError};

/// The field a template refusal names.
const FIELD: &str = "spec.templateRef.name";

/// How a review is judged with respect to templates.
#[derive(Debug, PartialEq)]
pub(crate) enum Templated {
    /// The run names no template (or its template is gone, on UPDATE): judged on its own, with
    /// these findings added.
    Plain(Vec<Finding>),
    /// The run is refused before any other rule: these findings say why.
    Refused(Vec<Finding>),
    /// Judge these merged specs instead of the run's (the stored one on UPDATE).
    Merged {
        /// The template as messages name it (its kind and name).
        name: String,
        /// The new run's spec merged with its template.
        new: Value,
        /// The stored run's spec merged with the same template.
        old: Option<Value>,
    },
}

/// Reads the template the new spec names (a SandboxRunTemplate of `namespace`, or a
/// ClusterSandboxRunTemplate) and judges the review with it. `old`: the stored spec on UPDATE.
/// Without a client every templated run is refused (fail closed: its spec alone is not what it
/// would run).
pub(crate) async fn resolve(
    client: Option<&Client>,
    namespace: Option<&str>,
    new: &Value,
    old: Option<&Value>,
) -> Templated {
    // A spec that does not parse is refused by the rules.
    let Ok(new) = SandboxRunSpec::deserialize(new) else {
        return Templated::Plain(Vec::new());
    };
    let Some(reference) = new.template_ref.clone() else {
        return Templated::Plain(Vec::new());
    };
    let old = old.and_then(|o| SandboxRunSpec::deserialize(o).ok());
    let (Some(client), Some(ns)) = (client, namespace) else {
        return Templated::Refused(vec![unusable(
            "the webhook cannot read the template (no client or namespace)".into(),
            "report this to the operator's admin",
        )]);
    };
    let found = match read(client, ns, &reference).await {
        Ok(found) => found,
        Err(e) => {
            return Templated::Refused(vec![unusable(
                format!(
                    "the {} could not be read by the webhook: {e}",
                    reference.describe(ns)
                ),
                &format!(
                    "the operator needs get on {} (the chart grants it); try again",
                    reference.kind.resource()
                ),
            )])
        }
    };
    judge_with(found.as_ref(), ns, &reference, &new, old.as_ref())
}

/// The spec of the template `reference` names, for a run of `namespace` (None: it does not
/// exist).
pub(crate) async fn read(
    client: &Client,
    namespace: &str,
    reference: &TemplateRef,
) -> Result<Option<SandboxRunTemplateSpec>, kube::Error> {
    Ok(match reference.kind {
        TemplateKind::SandboxRunTemplate => {
            let api: Api<SandboxRunTemplate> = Api::namespaced(client.clone(), namespace);
            api.get_opt(&reference.name).await?.map(|t| t.spec)
        }
        TemplateKind::ClusterSandboxRunTemplate => {
            let api: Api<ClusterSandboxRunTemplate> = Api::all(client.clone());
            api.get_opt(&reference.name).await?.map(|t| t.spec.0)
        }
    })
}

/// How to list the templates a run of `ns` may name of `kind`.
fn listing(kind: TemplateKind, ns: &str) -> String {
    match kind {
        TemplateKind::SandboxRunTemplate => format!("kubectl get sandboxruntemplates -n {ns}"),
        TemplateKind::ClusterSandboxRunTemplate => "kubectl get clustersandboxruntemplates".into(),
    }
}

/// The verdict on a run of namespace `ns` that names the template `reference`, which is
/// `template` (None: it does not exist). Pure.
pub(crate) fn judge_with(
    template: Option<&SandboxRunTemplateSpec>,
    ns: &str,
    reference: &TemplateRef,
    new: &SandboxRunSpec,
    old: Option<&SandboxRunSpec>,
) -> Templated {
    let same_ref = old.is_some_and(|o| o.template_ref == new.template_ref);
    let name = reference.label();
    let name = name.as_str();
    let Some(template) = template else {
        let message = format!("the {} does not exist", reference.describe(ns));
        if same_ref {
            return Templated::Plain(vec![Finding::warn(
                ids::TEMPLATE_UNUSABLE,
                FIELD,
                format!("{message}; the run's own spec is judged"),
                "the run keeps the template it was made from (status.template)",
            )]);
        }
        return Templated::Refused(vec![unusable(
            message,
            &format!(
                "create it, or name one that exists: {}",
                listing(reference.kind, ns)
            ),
        )]);
    };
    let refusals = refusals(template, name, new, old.filter(|_| same_ref));
    if !refusals.is_empty() {
        return Templated::Refused(refusals);
    }
    let merge = |spec: &SandboxRunSpec| {
        template::overlay(template, name, spec).and_then(|s| {
            serde_json::to_value(s).map_err(|source| MergeError::Json {
                template: name.to_string(),
                source,
            })
        })
    };
    match (merge(new), old.map(merge).transpose()) {
        (Ok(new), Ok(old)) => Templated::Merged {
            name: name.to_string(),
            new,
            old,
        },
        (Err(e), _) | (_, Err(e)) => Templated::Refused(vec![unusable(
            e.to_string(),
            "report this to the platform team",
        )]),
    }
}

/// Why the template cannot make `new`'s spec: it is invalid, or `new` sets locked fields (on
/// UPDATE of a run that keeps its template, only those the stored run did not set already).
fn refusals(
    template: &SandboxRunTemplateSpec,
    name: &str,
    new: &SandboxRunSpec,
    old: Option<&SandboxRunSpec>,
) -> Vec<Finding> {
    let before: Vec<String> = old
        .map(|o| template::locked(template, name, o))
        .unwrap_or_default()
        .into_iter()
        .map(|l| l.field)
        .collect();
    match template::merge(template, name, new) {
        Ok(_) => Vec::new(),
        Err(MergeError::Locked { locked, .. }) => locked
            .into_iter()
            .filter(|l| !before.contains(&l.field))
            .map(|l| {
                Finding::fail(
                    ids::TEMPLATE_LOCKED,
                    l.field,
                    l.message,
                    format!(
                        "drop the field from the run (the {name} sets it), or ask the platform team to list it in the template's spec.openFields"
                    ),
                )
            })
            .collect(),
        Err(e) => vec![unusable(e.to_string(), "report this to the platform team")],
    }
}

fn unusable(message: String, hint: &str) -> Finding {
    Finding::fail(ids::TEMPLATE_UNUSABLE, FIELD, message, hint)
}

/// The hint added to a finding on a merged spec whose field the run did not set: the template
/// (`name`: its kind and name) set it, so the fix is the platform team's.
/// `run`: the run's own raw spec.
pub(crate) fn blame_template(mut finding: Finding, name: &str, run: &Value) -> Finding {
    let top = finding
        .field
        .strip_prefix("spec.")
        .map(|f| f.split(['.', '[']).next().unwrap_or(f))
        .unwrap_or_default();
    let set_by_run = run.get(top).is_some();
    if !top.is_empty() && !set_by_run {
        finding.hint = format!(
            "{} (the value comes from the {name}: ask its platform team to fix it)",
            finding.hint
        );
    }
    finding
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{OpenField, TemplateRef};
    use std::sync::LazyLock;

    static T: LazyLock<TemplateRef> = LazyLock::new(|| TemplateRef::namespaced("t"));

    fn template() -> SandboxRunTemplateSpec {
        SandboxRunTemplateSpec {
            template: SandboxRunSpec {
                image: Some("registry.example/t:1".into()),
                user: Some("1000".into()),
                ..SandboxRunSpec::default()
            },
            open_fields: vec![OpenField::Command],
        }
    }

    fn run(image: Option<&str>) -> SandboxRunSpec {
        SandboxRunSpec {
            image: image.map(String::from),
            command: Some(vec!["make".into()]),
            template_ref: Some(T.clone()),
            ..SandboxRunSpec::default()
        }
    }

    fn refused_fields(t: &Templated) -> Vec<(&str, String)> {
        match t {
            Templated::Refused(f) => f.iter().map(|f| (f.rule, f.field.clone())).collect(),
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn a_create_that_sets_a_locked_field_is_refused_naming_it_and_the_template() {
        let t = judge_with(Some(&template()), "ns", &T, &run(Some("evil:1")), None);
        assert_eq!(
            refused_fields(&t),
            [(ids::TEMPLATE_LOCKED, "spec.image".to_string())]
        );
        let Templated::Refused(f) = &t else { panic!() };
        assert!(
            f[0].message.contains("SandboxRunTemplate t"),
            "{}",
            f[0].message
        );
        assert!(f[0].hint.contains("openFields"), "{}", f[0].hint);
    }

    #[test]
    fn a_cluster_template_is_judged_the_same_and_named_with_its_kind() {
        let cluster = TemplateRef::cluster("t");
        let mut evil = run(Some("evil:1"));
        evil.template_ref = Some(cluster.clone());
        let t = judge_with(Some(&template()), "ns", &cluster, &evil, None);
        let Templated::Refused(f) = &t else {
            panic!("{t:?}")
        };
        assert_eq!(
            (f[0].rule, f[0].field.as_str()),
            (ids::TEMPLATE_LOCKED, "spec.image")
        );
        assert!(
            f[0].message.contains("ClusterSandboxRunTemplate t"),
            "{}",
            f[0].message
        );
        let mut mine = run(None);
        mine.template_ref = Some(cluster.clone());
        let t = judge_with(Some(&template()), "ns", &cluster, &mine, None);
        assert!(
            matches!(&t, Templated::Merged { name, new, .. }
                if name == "ClusterSandboxRunTemplate t" && new["user"] == "1000"),
            "{t:?}"
        );
        let t = judge_with(None, "ns", &cluster, &mine, None);
        let Templated::Refused(f) = &t else {
            panic!("{t:?}")
        };
        assert!(
            f[0].message == "the ClusterSandboxRunTemplate t does not exist"
                && f[0].hint.contains("kubectl get clustersandboxruntemplates"),
            "{f:?}"
        );
    }

    #[test]
    fn a_create_with_open_fields_only_is_judged_as_the_merged_spec() {
        let t = judge_with(Some(&template()), "ns", &T, &run(None), None);
        let Templated::Merged { new, old, .. } = t else {
            panic!("{t:?}")
        };
        assert_eq!(new["image"], "registry.example/t:1");
        assert_eq!(new["command"], serde_json::json!(["make"]));
        assert_eq!(old, None);
    }

    #[test]
    fn a_missing_template_refuses_a_create_but_not_an_update_of_an_admitted_run() {
        let t = judge_with(None, "ns", &T, &run(None), None);
        assert_eq!(
            refused_fields(&t),
            [(ids::TEMPLATE_UNUSABLE, FIELD.to_string())]
        );
        let mut stopped = run(None);
        stopped.stop = true;
        let t = judge_with(None, "ns", &T, &stopped, Some(&run(None)));
        assert!(
            matches!(&t, Templated::Plain(f) if f.len() == 1 && !f[0].is_fail()),
            "{t:?}"
        );
    }

    #[test]
    fn an_update_refuses_only_the_locked_fields_it_adds() {
        // Admitted when the image was open; the template has locked it since.
        let old = run(Some("mine:1"));
        let mut new = old.clone();
        new.stop = true;
        let t = judge_with(Some(&template()), "ns", &T, &new, Some(&old));
        assert!(matches!(t, Templated::Merged { .. }), "{t:?}");
        new.user = Some("0".into());
        let t = judge_with(Some(&template()), "ns", &T, &new, Some(&old));
        assert_eq!(
            refused_fields(&t),
            [(ids::TEMPLATE_LOCKED, "spec.user".to_string())]
        );
    }

    #[test]
    fn a_finding_on_a_field_the_template_set_blames_the_template() {
        let f = Finding::fail(ids::USER_NON_ROOT, "spec.user", "uid 0", "use a uid");
        let raw = serde_json::to_value(run(None)).unwrap();
        let blamed = blame_template(f.clone(), "SandboxRunTemplate t", &raw);
        assert!(
            blamed.hint.contains("SandboxRunTemplate t"),
            "{}",
            blamed.hint
        );
        let own = Finding::fail(ids::IMAGE_DIGEST, "spec.command", "x", "fix it");
        assert_eq!(
            blame_template(own.clone(), "SandboxRunTemplate t", &raw),
            own
        );
    }
}
