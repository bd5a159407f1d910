//! Templates for platform teams (docs/contract.md "Templates"): a run made from a
//! `SandboxRunTemplate` (or a cluster-scoped `ClusterSandboxRunTemplate`, the same spec) gets the
//! template's spec and may set only the fields the template leaves open. Pure: [`locked`] names every field a run sets that it may not, [`overlay`] builds the
//! spec the run is judged and run with, [`merge`] does both. The webhook and the controller read
//! the template; nothing here does I/O.
//!
//! The grammar is small on purpose: an open field is a top-level spec field ([`OpenField`]); the
//! run's value replaces the template's, except `env`, whose variables are added to the
//! template's (a variable the template sets stays the template's). `stop`, `suspend`,
//! `checkpoint`, `workspace` and `templateRef` are always the run's own ([`RUN_OWN`]).
//!
//! `label` in the functions below is the template as messages name it, its kind with its name
//! ([`crate::api::TemplateRef::label`]: `SandboxRunTemplate ci`, `ClusterSandboxRunTemplate ci`).

use kube::ResourceExt;
use serde_json::{Map, Value};
use thiserror::Error;

use crate::api::SandboxRunTemplateSpec;
use crate::api::{
    AppliedTemplate, ClusterSandboxRunTemplate, OpenField, SandboxRun, SandboxRunSpec,
    SandboxRunTemplate,
};

/// The spec fields that are always the run's: its lifecycle switch and the reference itself.
const RUN_OWN: [&str; 5] = ["stop", "suspend", "checkpoint", "workspace", "templateRef"];

/// A field the run sets that its template locks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Locked {
    /// The field, as admission names it (`spec.image`, `spec.env[2].name`).
    pub(crate) field: String,
    /// What is wrong, in words.
    pub(crate) message: String,
}

/// Why a template cannot make a run's spec.
#[derive(Debug, Error)]
pub(crate) enum MergeError {
    /// The run sets fields the template locks.
    #[error("{}", locked_words(.template, .locked))]
    Locked {
        /// The template's name.
        template: String,
        /// Every locked field the run sets.
        locked: Vec<Locked>,
    },
    /// The template's spec sets what a template may not (the CRD refuses it too).
    #[error("the {template} is invalid: {why}")]
    Invalid {
        /// The template's name.
        template: String,
        /// Its words.
        why: &'static str,
    },
    /// The merged spec is not a SandboxRun spec (cannot happen with typed inputs).
    #[error("the spec merged with the {template} does not parse: {source}")]
    Json {
        /// The template's name.
        template: String,
        /// The parser's words.
        #[source]
        source: serde_json::Error,
    },
}

/// Why a run's template cannot make it (the run is held, never run with its own spec), or a
/// pool cannot make pods of it.
#[derive(Debug, Error)]
pub(crate) enum TemplateUnusable {
    /// The template does not exist (`what`: its kind and name, as [`TemplateRef::describe`]).
    #[error("the {what} does not exist")]
    Missing {
        /// The template, in words.
        what: String,
    },
    /// The operator may not read it.
    #[error("the operator may not read the {what} ({message}): it needs get on {resource}")]
    Forbidden {
        /// The template, in words.
        what: String,
        /// The apiserver's words.
        message: String,
        /// The resource the operator needs `get` on.
        resource: &'static str,
    },
    /// It does not make the run's spec.
    #[error(transparent)]
    Merge(#[from] MergeError),
}

fn locked_words(template: &str, locked: &[Locked]) -> String {
    let fields: Vec<&str> = locked.iter().map(|l| l.field.as_str()).collect();
    format!(
        "the run sets {} which the {template} locks",
        fields.join(", ")
    )
}

/// The name of an open field as the spec spells it (`workingDir`).
pub(crate) fn field_name(field: OpenField) -> String {
    match serde_json::to_value(field) {
        Ok(Value::String(s)) => s,
        _ => format!("{field:?}"),
    }
}

/// The spec as a JSON object, with its defaults left out (an empty list is not "set").
fn as_map(spec: &SandboxRunSpec) -> Map<String, Value> {
    match serde_json::to_value(spec) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

fn is_open(template: &SandboxRunTemplateSpec, key: &str) -> bool {
    template.open_fields.iter().any(|f| field_name(*f) == key)
}

/// What a template's spec may not set.
fn invalid(template: &SandboxRunTemplateSpec) -> Option<&'static str> {
    if template.template.template_ref.is_some() {
        return Some("its spec.template names a templateRef (templates do not nest)");
    }
    if template.template.stop {
        return Some("its spec.template sets stop (a run's own)");
    }
    None
}

/// Every field `run` sets that `template` (named `label`) locks, in spec order: a top-level field
/// not open, and with `env` open, a variable whose name the template sets.
pub(crate) fn locked(
    template: &SandboxRunTemplateSpec,
    label: &str,
    run: &SandboxRunSpec,
) -> Vec<Locked> {
    let mut out = Vec::new();
    for key in as_map(run).keys() {
        if RUN_OWN.contains(&key.as_str()) {
            continue;
        }
        if !is_open(template, key) {
            out.push(Locked {
                field: format!("spec.{key}"),
                message: format!(
                    "spec.{key} is locked by the {label} (open: {})",
                    open_list(template)
                ),
            });
        }
    }
    if is_open(template, "env") {
        for (i, var) in run.env.iter().enumerate() {
            if template.template.env.iter().any(|t| t.name == var.name) {
                out.push(Locked {
                    field: format!("spec.env[{i}].name"),
                    message: format!(
                        "the variable {} is set by the {label}; a run may add variables, not change the template's",
                        var.name
                    ),
                });
            }
        }
    }
    out
}

/// The open fields, for messages (`none` when every field is locked).
pub(crate) fn open_list(template: &SandboxRunTemplateSpec) -> String {
    if template.open_fields.is_empty() {
        return "none".to_string();
    }
    let names: Vec<String> = template
        .open_fields
        .iter()
        .map(|f| field_name(*f))
        .collect();
    names.join(", ")
}

/// The spec of a run made from `template`: the template's spec, with the run's own fields
/// ([`RUN_OWN`]) and the open fields the run sets. Locked fields the run sets are
/// ignored here ([`locked`] names them).
pub(crate) fn overlay(
    template: &SandboxRunTemplateSpec,
    label: &str,
    run: &SandboxRunSpec,
) -> Result<SandboxRunSpec, MergeError> {
    let mut merged = as_map(&template.template);
    for key in RUN_OWN {
        merged.remove(key);
    }
    for (key, value) in as_map(run) {
        if key == "env" && is_open(template, "env") {
            let mut env = template.template.env.clone();
            env.extend(
                run.env
                    .iter()
                    .filter(|v| !template.template.env.iter().any(|t| t.name == v.name))
                    .cloned(),
            );
            merged.insert(key, serde_json::to_value(env).unwrap_or(value));
        } else if RUN_OWN.contains(&key.as_str()) || is_open(template, &key) {
            merged.insert(key, value);
        }
    }
    serde_json::from_value(Value::Object(merged)).map_err(|source| MergeError::Json {
        template: label.to_string(),
        source,
    })
}

/// The spec of a run made from `template`, refused when the run sets a locked field or the
/// template is invalid.
pub(crate) fn merge(
    template: &SandboxRunTemplateSpec,
    label: &str,
    run: &SandboxRunSpec,
) -> Result<SandboxRunSpec, MergeError> {
    if let Some(why) = invalid(template) {
        return Err(MergeError::Invalid {
            template: label.to_string(),
            why,
        });
    }
    let locked = locked(template, label, run);
    if !locked.is_empty() {
        return Err(MergeError::Locked {
            template: label.to_string(),
            locked,
        });
    }
    overlay(template, label, run)
}

/// The run as it runs once its template is recorded (`status.template`): its spec is the
/// recorded template's with the run's open fields ([`overlay`]: a locked field the run sets never
/// reaches it). None: the run names no template, or its status records none for the kind and
/// name it names (the template must be resolved: [`resolve`]). A record without a kind (written
/// before cluster templates) is of a SandboxRunTemplate.
pub(crate) fn recorded(run: &SandboxRun) -> Option<SandboxRun> {
    let reference = run.spec.template_ref.as_ref()?;
    let applied = run.status.as_ref()?.template.as_ref()?;
    if applied.name != reference.name || applied.kind != reference.kind {
        return None;
    }
    let spec = overlay(&applied.spec, &reference.label(), &run.spec).ok()?;
    Some(SandboxRun {
        spec,
        ..run.clone()
    })
}

/// Whether the run's recorded template is the one it is made from: once its pod was created
/// (`has_pod`, or its status names a pod, or it ended). Before that the template is read again
/// and the record rewritten when the pod is created: a template edited meanwhile applies, and a
/// record nobody but the operator should write is not trusted before it made a pod.
pub(crate) fn record_holds(run: &SandboxRun, has_pod: bool) -> bool {
    let status = run.status.as_ref();
    has_pod
        || status.is_some_and(|s| s.pod_name.is_some())
        || status.and_then(|s| s.phase).is_some_and(|p| p.is_final())
}

/// A template as read from the cluster, of either kind: its spec and `metadata.generation`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Fetched {
    /// The template's spec.
    pub(crate) spec: SandboxRunTemplateSpec,
    /// Its `metadata.generation`.
    pub(crate) generation: Option<i64>,
}

impl From<SandboxRunTemplate> for Fetched {
    fn from(t: SandboxRunTemplate) -> Fetched {
        Fetched {
            spec: t.spec,
            generation: t.metadata.generation,
        }
    }
}

impl From<ClusterSandboxRunTemplate> for Fetched {
    fn from(t: ClusterSandboxRunTemplate) -> Fetched {
        Fetched {
            spec: t.spec.0,
            generation: t.metadata.generation,
        }
    }
}

/// The run made from `template` (None: it does not exist), before its pod exists: its spec
/// merged ([`merge`]: a locked field it sets refuses it), and `status.template` recording the
/// template's kind, name, generation and spec, which the run keeps for the rest of its life.
/// Err: why the run cannot be made (the run is held, never run with its own spec).
pub(crate) fn resolve(
    run: &SandboxRun,
    template: Option<&Fetched>,
) -> Result<SandboxRun, TemplateUnusable> {
    let Some(reference) = run.spec.template_ref.as_ref() else {
        return Ok(run.clone());
    };
    let namespace = run.namespace().unwrap_or_default();
    let Some(template) = template else {
        return Err(TemplateUnusable::Missing {
            what: reference.describe(&namespace),
        });
    };
    let spec = merge(&template.spec, &reference.label(), &run.spec)?;
    let mut status = run.status.clone().unwrap_or_default();
    status.template = Some(AppliedTemplate {
        kind: reference.kind,
        name: reference.name.clone(),
        generation: template.generation,
        spec: template.spec.clone(),
    });
    Ok(SandboxRun {
        spec,
        status: Some(status),
        ..run.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnvVar, TemplateRef};
    use kube::CustomResourceExt;

    const LABEL: &str = "SandboxRunTemplate locked";
    const IMAGE: &str =
        "registry.example/tools@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: value.into(),
            value_from: None,
        }
    }

    /// A platform team's template: image, user, runtime class and one variable locked; command,
    /// args and env open.
    fn template() -> SandboxRunTemplateSpec {
        SandboxRunTemplateSpec {
            template: SandboxRunSpec {
                image: Some(IMAGE.into()),
                user: Some("1000:1000".into()),
                runtime_class_name: Some("gvisor".into()),
                command: Some(vec!["/bin/true".into()]),
                env: vec![var("HTTPS_PROXY", "http://proxy:3128")],
                ..SandboxRunSpec::default()
            },
            open_fields: vec![OpenField::Command, OpenField::Args, OpenField::Env],
        }
    }

    fn run(spec: SandboxRunSpec) -> SandboxRunSpec {
        SandboxRunSpec {
            template_ref: Some(TemplateRef::namespaced("locked")),
            ..spec
        }
    }

    #[test]
    fn a_run_that_sets_only_open_fields_gets_the_template_with_its_command_and_variables() {
        let mine = run(SandboxRunSpec {
            command: Some(vec!["sh".into(), "-c".into(), "make test".into()]),
            env: vec![var("TARGET", "all")],
            stop: true,
            ..SandboxRunSpec::default()
        });
        let merged = merge(&template(), LABEL, &mine).unwrap();
        assert_eq!(merged.image.as_deref(), Some(IMAGE));
        assert_eq!(merged.user.as_deref(), Some("1000:1000"));
        assert_eq!(merged.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(merged.command, mine.command);
        assert_eq!(
            merged.env,
            [
                var("HTTPS_PROXY", "http://proxy:3128"),
                var("TARGET", "all")
            ]
        );
        assert!(merged.stop, "stop is the run's own");
        assert_eq!(merged.template_ref, mine.template_ref);
    }

    #[test]
    fn a_run_that_sets_nothing_is_the_template() {
        let merged = merge(&template(), LABEL, &run(SandboxRunSpec::default())).unwrap();
        assert_eq!(
            merged,
            SandboxRunSpec {
                template_ref: Some(TemplateRef::namespaced("locked")),
                ..template().template
            }
        );
    }

    #[test]
    fn a_run_that_sets_locked_fields_is_refused_with_each_field_named() {
        let mine = run(SandboxRunSpec {
            image: Some("evil:latest".into()),
            user: Some("0".into()),
            command: Some(vec!["id".into()]),
            env: vec![var("HTTPS_PROXY", "http://elsewhere"), var("OK", "1")],
            ..SandboxRunSpec::default()
        });
        let err = merge(&template(), LABEL, &mine).unwrap_err();
        let MergeError::Locked { locked, .. } = &err else {
            panic!("{err}");
        };
        let fields: Vec<&str> = locked.iter().map(|l| l.field.as_str()).collect();
        assert_eq!(fields, ["spec.image", "spec.user", "spec.env[0].name"]);
        assert!(
            locked[0].message.contains("SandboxRunTemplate locked")
                && locked[0].message.contains("open: command, args, env"),
            "{}",
            locked[0].message
        );
        assert!(err.to_string().contains("spec.image"), "{err}");
        // What merge refuses, overlay ignores: the locked values never reach the spec.
        let overlaid = overlay(&template(), LABEL, &mine).unwrap();
        assert_eq!(overlaid.image.as_deref(), Some(IMAGE));
        assert_eq!(overlaid.user.as_deref(), Some("1000:1000"));
        assert_eq!(
            overlaid.env,
            [var("HTTPS_PROXY", "http://proxy:3128"), var("OK", "1")]
        );
    }

    #[test]
    fn a_field_set_to_its_default_is_not_set() {
        let raw = serde_json::json!({
            "templateRef": {"name": "locked"},
            "env": [], "mounts": [], "stop": false, "imagePullSecrets": []
        });
        let mine: SandboxRunSpec = serde_json::from_value(raw).unwrap();
        assert!(locked(&template(), LABEL, &mine).is_empty());
    }

    #[test]
    fn an_open_field_other_than_env_replaces_the_template_value() {
        let mut t = template();
        t.open_fields.push(OpenField::WorkingDir);
        t.template.working_dir = Some("/srv".into());
        t.template.args = Some(vec!["--fast".into()]);
        let mine = run(SandboxRunSpec {
            working_dir: Some("/work".into()),
            ..SandboxRunSpec::default()
        });
        let merged = merge(&t, LABEL, &mine).unwrap();
        assert_eq!(merged.working_dir.as_deref(), Some("/work"));
        // Open but not set by the run: the template's value stays.
        assert_eq!(merged.args, Some(vec!["--fast".to_string()]));
    }

    #[test]
    fn a_template_that_nests_or_stops_is_invalid() {
        let mut nested = template();
        nested.template.template_ref = Some(TemplateRef::namespaced("x"));
        let err = merge(
            &nested,
            "SandboxRunTemplate t",
            &run(SandboxRunSpec::default()),
        )
        .unwrap_err();
        assert!(matches!(err, MergeError::Invalid { .. }), "{err}");
        let mut stops = template();
        stops.template.stop = true;
        assert!(merge(
            &stops,
            "SandboxRunTemplate t",
            &run(SandboxRunSpec::default())
        )
        .is_err());
    }

    fn templated_run() -> SandboxRun {
        crate::testkit::sandbox_run("r")
            .namespace("team")
            .spec(run(SandboxRunSpec {
                command: Some(vec!["make".into()]),
                ..SandboxRunSpec::default()
            }))
            .build()
    }

    fn stored_template(generation: i64) -> Fetched {
        let mut t = SandboxRunTemplate::new("locked", template());
        t.metadata.generation = Some(generation);
        t.into()
    }

    #[test]
    fn a_run_resolved_before_its_pod_keeps_that_template_whatever_happens_to_it_since() {
        let r = templated_run();
        assert!(
            recorded(&r).is_none(),
            "nothing recorded yet: resolve first"
        );
        let made = resolve(&r, Some(&stored_template(3))).unwrap();
        assert_eq!(made.spec.image.as_deref(), Some(IMAGE));
        assert_eq!(made.spec.command, r.spec.command);
        let applied = made.status.as_ref().unwrap().template.clone().unwrap();
        assert_eq!(
            (applied.name.as_str(), applied.generation),
            ("locked", Some(3))
        );
        // The stored run (its own spec, the record in its status) is made the same way later,
        // with no template read: an edited or deleted template changes nothing.
        let stored = SandboxRun {
            status: made.status.clone(),
            ..r.clone()
        };
        assert_eq!(recorded(&stored).unwrap().spec, made.spec);
    }

    #[test]
    fn a_missing_template_or_a_locked_field_holds_the_run_in_words() {
        let r = templated_run();
        let why = resolve(&r, None).unwrap_err();
        assert_eq!(
            why.to_string(),
            "the SandboxRunTemplate team/locked does not exist"
        );
        let mut bad = r.clone();
        bad.spec.image = Some("evil:1".into());
        let why = resolve(&bad, Some(&stored_template(1)))
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("spec.image") && why.contains("locked"),
            "{why}"
        );
    }

    #[test]
    fn the_record_holds_once_the_pod_was_created_or_the_run_ended() {
        use crate::api::{Phase, SandboxRunStatus};
        let mut r = templated_run();
        assert!(
            !record_holds(&r, false),
            "no pod yet: read the template again"
        );
        assert!(record_holds(&r, true));
        r.status = Some(SandboxRunStatus {
            phase: Some(Phase::Pending),
            ..Default::default()
        });
        assert!(!record_holds(&r, false), "held before its pod");
        r.status = Some(SandboxRunStatus {
            pod_name: Some("r-sbr".into()),
            ..Default::default()
        });
        assert!(record_holds(&r, false), "its pod was created (and is gone)");
        r.status = Some(SandboxRunStatus {
            phase: Some(Phase::Failed),
            ..Default::default()
        });
        assert!(record_holds(&r, false), "ended before a pod");
    }

    #[test]
    fn a_record_of_another_template_is_not_used() {
        let r = templated_run();
        let made = resolve(&r, Some(&stored_template(1))).unwrap();
        let mut renamed = SandboxRun {
            status: made.status,
            ..r
        };
        renamed.spec.template_ref = Some(TemplateRef::namespaced("other"));
        assert!(recorded(&renamed).is_none());
    }

    #[test]
    fn a_cluster_template_makes_the_run_names_itself_with_its_kind_and_records_it() {
        let mut r = templated_run();
        r.spec.template_ref = Some(TemplateRef::cluster("locked"));
        let fetched: Fetched = {
            let mut t = ClusterSandboxRunTemplate::new(
                "locked",
                crate::api::ClusterSandboxRunTemplateSpec(template()),
            );
            t.metadata.generation = Some(7);
            t.into()
        };
        let made = resolve(&r, Some(&fetched)).unwrap();
        assert_eq!(made.spec.image.as_deref(), Some(IMAGE));
        assert_eq!(made.spec.runtime_class_name.as_deref(), Some("gvisor"));
        let applied = made.status.clone().unwrap().template.unwrap();
        assert_eq!(
            (applied.kind, applied.name.as_str(), applied.generation),
            (
                crate::api::TemplateKind::ClusterSandboxRunTemplate,
                "locked",
                Some(7)
            )
        );
        let stored = SandboxRun {
            status: made.status.clone(),
            ..r.clone()
        };
        assert_eq!(recorded(&stored).unwrap().spec, made.spec);
        // Missing: named with its kind and without a namespace.
        assert_eq!(
            resolve(&r, None).unwrap_err().to_string(),
            "the ClusterSandboxRunTemplate locked does not exist"
        );
        // A locked field: the cluster template is named with its kind.
        let mut bad = r.clone();
        bad.spec.user = Some("0".into());
        let why = resolve(&bad, Some(&fetched)).unwrap_err().to_string();
        assert!(
            why.contains("spec.user") && why.contains("ClusterSandboxRunTemplate locked"),
            "{why}"
        );
        // The namespaced template of the same name is another template: its record is not used.
        let mut namespaced = stored.clone();
        namespaced.spec.template_ref = Some(TemplateRef::namespaced("locked"));
        assert!(recorded(&namespaced).is_none());
    }

    #[test]
    fn a_record_without_a_kind_is_of_the_namespaced_template() {
        let r = templated_run();
        let made = resolve(&r, Some(&stored_template(2))).unwrap();
        let mut status = serde_json::to_value(made.status.unwrap()).unwrap();
        assert_eq!(status["template"]["kind"], "SandboxRunTemplate");
        // As an operator of before cluster templates wrote it.
        status["template"].as_object_mut().unwrap().remove("kind");
        let old = SandboxRun {
            status: Some(serde_json::from_value(status).unwrap()),
            ..r.clone()
        };
        assert_eq!(recorded(&old).unwrap().spec.image.as_deref(), Some(IMAGE));
        let mut cluster = old.clone();
        cluster.spec.template_ref = Some(TemplateRef::cluster("locked"));
        assert!(
            recorded(&cluster).is_none(),
            "a kindless record is not a cluster template's"
        );
    }

    #[test]
    fn every_settable_spec_field_can_be_opened_and_no_other() {
        // The run-own fields and the two never served on a cluster are not open fields.
        let never = [
            "stop",
            "suspend",
            "checkpoint",
            "workspace",
            "templateRef",
            "hostState",
            "build",
        ];
        let crd = serde_json::to_value(crate::api::SandboxRun::crd()).unwrap();
        let props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !never.contains(&k.as_str()))
            .cloned()
            .collect::<std::collections::BTreeSet<_>>();
        let tcrd = serde_json::to_value(crate::api::SandboxRunTemplate::crd()).unwrap();
        let open: std::collections::BTreeSet<String> = tcrd["spec"]["versions"][0]["schema"]
            ["openAPIV3Schema"]["properties"]["spec"]["properties"]["openFields"]["items"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert_eq!(open, props);
    }
}
