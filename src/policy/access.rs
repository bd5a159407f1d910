//! A run uses only its author's rights (docs/contract.md "A run uses only its author's rights").
//! The operator creates the run's pod with its own ServiceAccount, so without this check a user
//! who may create SandboxRuns, but not pods and not read Secrets, would get a pod running as any
//! ServiceAccount of the namespace, with any Secret mounted. The webhook asks the apiserver, with
//! a SubjectAccessReview for the requesting user (the AdmissionReview's userInfo), for each right
//! the run's spec exercises:
//!
//! - `create pods` in the namespace when the run names a `serviceAccountName` (its token is
//!   mounted), a `runtimeClassName`, a `priorityClassName` or `tolerations`: what Kubernetes
//!   itself requires of someone creating that pod;
//! - `get secrets/<name>` for each Secret mount, `secretKeyRef` and the run's own
//!   `imagePullSecrets`; `get configmaps/<name>` for each ConfigMap mount and `configMapKeyRef`;
//!   `get persistentvolumeclaims/<name>` for each PVC mount;
//! - `get sandboxruntemplates/<name>` for the template `spec.templateRef` names (docs/contract.md
//!   "Templates"): a template is used only by those who may read it, so a platform team can keep
//!   a template to the users its RBAC names. The rights the template's own spec exercises are
//!   not asked of the author: its writer granted them (only what the run itself sets is); for a
//!   `ClusterSandboxRunTemplate`, `get clustersandboxruntemplates/<name>`, asked cluster-wide
//!   (no namespace in the review: a ClusterRoleBinding grants it);
//! - `get configmaps/<name>` for the store ConfigMap `spec.readBack.storeRef` names, and `get
//!   secrets/<name>` for the Secret that ConfigMap names ([`store_secret`]; docs/contract.md "A
//!   store per namespace"): a run author who could not read a store's credentials does not get
//!   the operator to write with them.
//!
//! [`required`] is the pure part (which rights a spec exercises); [`check`] asks the apiserver.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::Client;

use super::rules::Finding;
use crate::api::{MountType, SandboxRunSpec};

/// The rule id of every finding of this module.
pub(crate) const ACCESS_RULE: &str = "access";

/// The field that names a run's store ConfigMap.
pub(crate) const STORE_REF_FIELD: &str = "spec.readBack.storeRef";

/// The Secret right a store ConfigMap's `data` adds (its `secretName`), with the field to name.
pub(crate) fn store_secret(data: &BTreeMap<String, String>) -> Option<(Right, String)> {
    let name = data
        .get(crate::store::tenant::KEY_SECRET_NAME)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())?;
    Some((
        Right::get("secrets", name),
        format!("{STORE_REF_FIELD} (its ConfigMap's secretName)"),
    ))
}

/// The resource of the templates a run may name (`sandbox.iterion.io`).
pub(crate) const TEMPLATES: &str = "sandboxruntemplates";
/// The resource of the cluster-scoped templates a run may name (`sandbox.iterion.io`).
pub(crate) const CLUSTER_TEMPLATES: &str = "clustersandboxruntemplates";
/// The resource of the runs a fork may start from (`sandbox.iterion.io`, `spec.workspace.from`).
pub(crate) const RUNS: &str = "sandboxruns";
/// The field that names a fork's source run.
pub(crate) const FORK_FIELD: &str = "spec.workspace.from.run";

/// One right a run's spec exercises.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Right {
    /// The verb (`create`, `get`).
    pub(crate) verb: &'static str,
    /// The core-group resource (`pods`, `secrets`, …).
    pub(crate) resource: &'static str,
    /// The object's name; None: any (a `create`).
    pub(crate) name: Option<String>,
}

impl Right {
    pub(crate) fn get(resource: &'static str, name: &str) -> Right {
        Right {
            verb: "get",
            resource,
            name: Some(name.to_string()),
        }
    }

    /// The API group of the resource: the core group, but for the templates.
    fn group(&self) -> &'static str {
        if [TEMPLATES, CLUSTER_TEMPLATES, RUNS].contains(&self.resource) {
            crate::api::GROUP
        } else {
            ""
        }
    }

    /// Whether the resource is cluster-scoped (asked with no namespace).
    fn cluster_scoped(&self) -> bool {
        self.resource == CLUSTER_TEMPLATES
    }

    /// Where the right is asked, in words: `in namespace team`, `cluster-wide`.
    fn scope(&self, namespace: &str) -> String {
        if self.cluster_scoped() {
            "cluster-wide".to_string()
        } else {
            format!("in namespace {namespace}")
        }
    }

    /// `kubectl auth can-i` arguments for this right.
    fn can_i(&self, namespace: &str, user: &str) -> String {
        let resource = match self.group() {
            "" => self.resource.to_string(),
            group => format!("{}.{group}", self.resource),
        };
        let what = match &self.name {
            Some(name) => format!("{resource}/{name}"),
            None => resource,
        };
        let namespace = if self.cluster_scoped() {
            String::new()
        } else {
            format!(" -n {namespace}")
        };
        format!(
            "kubectl auth can-i {} {what}{namespace} --as {user}",
            self.verb
        )
    }
}

/// The fields of `spec` that exercise a right (each named once, without its detail), in a stable
/// order: what a message says an author's rights must cover.
pub(crate) fn required_fields(spec: &SandboxRunSpec) -> std::collections::BTreeSet<String> {
    required(spec)
        .into_values()
        .flatten()
        .map(|f| f.split(" (").next().unwrap_or(&f).to_string())
        .collect()
}

/// Every right `spec` exercises, each with the fields that exercise it, in a stable order.
pub(crate) fn required(spec: &SandboxRunSpec) -> BTreeMap<Right, Vec<String>> {
    let mut out: BTreeMap<Right, Vec<String>> = BTreeMap::new();
    let mut need = |right: Right, field: String| out.entry(right).or_default().push(field);
    let create_pods = || Right {
        verb: "create",
        resource: "pods",
        name: None,
    };
    if spec.service_account_name.is_some() {
        need(create_pods(), "spec.serviceAccountName".to_string());
    }
    if spec.runtime_class_name.is_some() {
        need(create_pods(), "spec.runtimeClassName".to_string());
    }
    if spec.priority_class_name.is_some() {
        need(create_pods(), "spec.priorityClassName".to_string());
    }
    if spec.tolerations.as_ref().is_some_and(|t| !t.is_empty()) {
        need(create_pods(), "spec.tolerations".to_string());
    }
    for (i, m) in spec.mounts.iter().enumerate() {
        let resource = match m.kind {
            MountType::Secret => "secrets",
            MountType::ConfigMap => "configmaps",
            MountType::PersistentVolumeClaim => "persistentvolumeclaims",
            MountType::EmptyDir | MountType::Bind => continue,
        };
        if let Some(source) = &m.source {
            need(
                Right::get(resource, source),
                format!("spec.mounts[{i}].source"),
            );
        }
    }
    for (i, e) in spec.env.iter().enumerate() {
        let Some(from) = &e.value_from else { continue };
        if let Some(s) = &from.secret_key_ref {
            let field = format!("spec.env[{i}].valueFrom.secretKeyRef");
            need(Right::get("secrets", &s.name), field);
        }
        if let Some(c) = &from.config_map_key_ref {
            let field = format!("spec.env[{i}].valueFrom.configMapKeyRef");
            need(Right::get("configmaps", &c.name), field);
        }
    }
    if let Some(store) = spec.store_ref() {
        need(Right::get("configmaps", store), STORE_REF_FIELD.to_string());
    }
    if let Some(template) = &spec.template_ref {
        need(
            Right::get(template.kind.resource(), &template.name),
            "spec.templateRef.name".to_string(),
        );
    }
    // A fork reads another run's files (docs/contract.md "Pause, resume and fork").
    if let Some(from) = spec.workspace.as_ref().and_then(|w| w.from.as_ref()) {
        need(Right::get(RUNS, &from.run), FORK_FIELD.to_string());
    }
    for (i, name) in spec.image_pull_secrets.iter().enumerate() {
        need(
            Right::get("secrets", name),
            format!("spec.imagePullSecrets[{i}]"),
        );
    }
    out
}

/// The rights `new` exercises that `old` did not (all of them on CREATE): an UPDATE is judged
/// only for what it adds, so a user who may stop a run need not hold its author's rights.
pub(crate) fn added(
    old: Option<&SandboxRunSpec>,
    new: &SandboxRunSpec,
) -> BTreeMap<Right, Vec<String>> {
    let mut wanted = required(new);
    if let Some(old) = old {
        for right in required(old).into_keys() {
            wanted.remove(&right);
        }
    }
    wanted
}

/// The rights an admission must verify for the requesting user (docs/contract.md "A run uses
/// only its author's rights"): every right `new` exercises on CREATE, and on an UPDATE made
/// before the run's pod exists that changes anything that shapes the pod (all but `stop`,
/// `ttlSecondsAfterFinished` and `readBack.retention`) — whoever changes the command of
/// another user's run before it starts must hold every right it uses, not only the ones the
/// change adds (issue #38). Otherwise only what the update adds ([`added`]): a user who may
/// stop a run need not hold its author's rights.
pub(crate) fn to_verify(
    old: Option<&SandboxRunSpec>,
    new: &SandboxRunSpec,
    pod_exists: bool,
) -> BTreeMap<Right, Vec<String>> {
    match old {
        Some(old) if pod_exists || pod_shape(old) == pod_shape(new) => added(Some(old), new),
        _ => required(new),
    }
}

/// `spec` without the fields that never shape the pod.
fn pod_shape(spec: &SandboxRunSpec) -> SandboxRunSpec {
    let mut shape = spec.clone();
    shape.stop = false;
    shape.ttl_seconds_after_finished = None;
    if let Some(rb) = shape.read_back.as_mut() {
        rb.retention = None;
    }
    shape
}

/// The refusal of one right the user does not hold.
fn refused(right: &Right, fields: &[String], namespace: &str, user: &str, why: &str) -> Finding {
    let what = match &right.name {
        Some(name) => format!("{} {} \"{name}\"", right.verb, right.resource),
        None => format!("{} {}", right.verb, right.resource),
    };
    Finding::fail(
        ACCESS_RULE,
        fields.join(", "),
        format!(
            "{user} may not {what} {}{why}; a run may use only what its author may",
            right.scope(namespace)
        ),
        format!(
            "ask for that right, or drop the field; check with `{}`",
            right.can_i(namespace, user)
        ),
    )
}

/// Asks the apiserver whether `user` holds each right in `wanted`: a finding for each one it
/// does not hold, or that could not be asked (fail closed: the apiserver's words in the message).
pub(crate) async fn check(
    client: &Client,
    user: &UserInfo,
    namespace: &str,
    wanted: &BTreeMap<Right, Vec<String>>,
) -> Vec<Finding> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let name = user.username.clone().unwrap_or_default();
    let asks = wanted.iter().map(|(right, fields)| {
        let api = api.clone();
        let review = review_of(user, namespace, right);
        let name = name.clone();
        async move {
            match api.create(&PostParams::default(), &review).await {
                Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => None,
                Ok(answer) => {
                    let reason = answer
                        .status
                        .and_then(|s| s.reason)
                        .filter(|r| !r.is_empty())
                        .map(|r| format!(" ({r})"))
                        .unwrap_or_default();
                    Some(refused(right, fields, namespace, &name, &reason))
                }
                Err(e) => Some(refused(
                    right,
                    fields,
                    namespace,
                    &name,
                    &format!(" (the access check could not be made: {e})"),
                )),
            }
        }
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// The SubjectAccessReview of `right` for `user` in `namespace`.
fn review_of(user: &UserInfo, namespace: &str, right: &Right) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            groups: user.groups.clone(),
            uid: user.uid.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: (!right.cluster_scoped()).then(|| namespace.to_string()),
                verb: Some(right.verb.to_string()),
                group: Some(right.group().to_string()),
                resource: Some(right.resource.to_string()),
                name: right.name.clone(),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EnvVar, EnvVarSource, Mount};
    use k8s_openapi::api::core::v1::{ConfigMapKeySelector, SecretKeySelector, Toleration};

    fn mount(kind: MountType, source: &str) -> Mount {
        Mount {
            name: format!("m-{source}"),
            kind,
            source: Some(source.to_string()),
            target: format!("/m/{source}"),
            read_only: true,
        }
    }

    fn names(rights: &BTreeMap<Right, Vec<String>>) -> Vec<String> {
        rights
            .iter()
            .map(|(r, f)| {
                let name = r.name.clone().unwrap_or_else(|| "*".into());
                format!("{} {}/{name} <- {}", r.verb, r.resource, f.join(","))
            })
            .collect()
    }

    #[test]
    fn a_run_made_from_a_template_needs_get_on_that_template_and_only_on_what_it_sets() {
        let spec = SandboxRunSpec {
            template_ref: Some(crate::api::TemplateRef::namespaced("ci")),
            command: Some(vec!["make".into()]),
            ..SandboxRunSpec::default()
        };
        let rights = required(&spec);
        assert_eq!(
            rights.get(&Right::get(TEMPLATES, "ci")),
            Some(&vec!["spec.templateRef.name".to_string()])
        );
        assert_eq!(rights.len(), 1, "{rights:?}");
        let right = Right::get(TEMPLATES, "ci");
        assert_eq!(right.group(), "sandbox.iterion.io");
        assert_eq!(
            right.can_i("team", "alice"),
            "kubectl auth can-i get sandboxruntemplates.sandbox.iterion.io/ci -n team --as alice"
        );
        // Stopping a templated run adds no right.
        let stopped = SandboxRunSpec {
            stop: true,
            ..spec.clone()
        };
        assert!(added(Some(&spec), &stopped).is_empty());
    }

    #[test]
    fn a_run_made_from_a_cluster_template_needs_get_on_it_asked_cluster_wide() {
        let spec = SandboxRunSpec {
            template_ref: Some(crate::api::TemplateRef::cluster("ci")),
            ..SandboxRunSpec::default()
        };
        let rights = required(&spec);
        let right = Right::get(CLUSTER_TEMPLATES, "ci");
        assert_eq!(
            rights.keys().collect::<Vec<_>>(),
            [&right],
            "not the namespaced template of the same name"
        );
        assert_eq!(right.group(), "sandbox.iterion.io");
        assert_eq!(
            right.can_i("team", "alice"),
            "kubectl auth can-i get clustersandboxruntemplates.sandbox.iterion.io/ci --as alice"
        );
        let user = UserInfo {
            username: Some("alice".into()),
            ..UserInfo::default()
        };
        let attrs = review_of(&user, "team", &right)
            .spec
            .resource_attributes
            .unwrap();
        assert_eq!(attrs.namespace, None, "a cluster-scoped right");
        assert_eq!(
            (
                attrs.group.as_deref(),
                attrs.resource.as_deref(),
                attrs.name.as_deref()
            ),
            (
                Some("sandbox.iterion.io"),
                Some(CLUSTER_TEMPLATES),
                Some("ci")
            )
        );
        let namespaced = review_of(&user, "team", &Right::get(TEMPLATES, "ci"));
        let attrs = namespaced.spec.resource_attributes.unwrap();
        assert_eq!(attrs.namespace.as_deref(), Some("team"));
        let finding = refused(
            &right,
            &["spec.templateRef.name".into()],
            "team",
            "alice",
            "",
        );
        assert!(
            finding.message.contains("cluster-wide") && !finding.message.contains("namespace team"),
            "{}",
            finding.message
        );
    }

    #[test]
    fn a_plain_run_exercises_no_right_of_its_author() {
        assert!(required(&SandboxRunSpec::default()).is_empty());
    }

    #[test]
    fn every_field_that_reaches_beyond_the_run_needs_its_right() {
        let spec = SandboxRunSpec {
            service_account_name: Some("builder".into()),
            runtime_class_name: Some("gvisor".into()),
            tolerations: Some(vec![Toleration::default()]),
            mounts: vec![
                mount(MountType::Secret, "db"),
                mount(MountType::ConfigMap, "cfg"),
                mount(MountType::PersistentVolumeClaim, "data"),
                mount(MountType::EmptyDir, "scratch"),
            ],
            env: vec![
                EnvVar {
                    name: "TOKEN".into(),
                    value: String::new(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "api".into(),
                            key: "token".into(),
                            optional: None,
                        }),
                        config_map_key_ref: None,
                    }),
                },
                EnvVar {
                    name: "MODE".into(),
                    value: String::new(),
                    value_from: Some(EnvVarSource {
                        secret_key_ref: None,
                        config_map_key_ref: Some(ConfigMapKeySelector {
                            name: "cfg".into(),
                            key: "mode".into(),
                            optional: None,
                        }),
                    }),
                },
            ],
            image_pull_secrets: vec!["db".into()],
            ..SandboxRunSpec::default()
        };
        assert_eq!(
            names(&required(&spec)),
            [
                "create pods/* <- spec.serviceAccountName,spec.runtimeClassName,spec.tolerations",
                "get configmaps/cfg <- spec.mounts[1].source,spec.env[1].valueFrom.configMapKeyRef",
                "get persistentvolumeclaims/data <- spec.mounts[2].source",
                "get secrets/api <- spec.env[0].valueFrom.secretKeyRef",
                "get secrets/db <- spec.mounts[0].source,spec.imagePullSecrets[0]",
            ]
        );
    }

    /// docs/contract.md "Pause, resume and fork": a fork reads another run's files, so its
    /// author must hold `get` on that run, asked in the operator's API group.
    #[test]
    fn a_fork_needs_get_on_its_source_run() {
        let spec = SandboxRunSpec {
            workspace: Some(crate::api::Workspace {
                from: Some(crate::api::WorkspaceFrom {
                    run: "a".into(),
                    attempt: None,
                    checkpoint: None,
                }),
                ..crate::api::Workspace::default()
            }),
            ..SandboxRunSpec::default()
        };
        let rights = required(&spec);
        assert_eq!(
            names(&rights),
            ["get sandboxruns/a <- spec.workspace.from.run"]
        );
        let right = rights.keys().next().unwrap();
        assert_eq!(right.group(), crate::api::GROUP);
        assert_eq!(
            right.can_i("team", "alice"),
            "kubectl auth can-i get sandboxruns.sandbox.iterion.io/a -n team --as alice"
        );
    }

    #[test]
    fn an_update_is_judged_only_for_the_rights_it_adds() {
        let old = SandboxRunSpec {
            mounts: vec![mount(MountType::Secret, "db")],
            ..SandboxRunSpec::default()
        };
        let mut new = old.clone();
        assert!(added(Some(&old), &new).is_empty());
        new.mounts.push(mount(MountType::Secret, "other"));
        assert_eq!(
            names(&added(Some(&old), &new)),
            ["get secrets/other <- spec.mounts[1].source"]
        );
        assert_eq!(added(None, &new).len(), 2);
    }

    /// Issue #38: user B, who may patch sandboxruns, changed the command of user A's run before
    /// its pod existed and used A's Secret: only added rights were checked. Before the pod
    /// exists every change that shapes the pod re-checks every right for the user making it;
    /// a stop, a TTL or a retention change, and any change once the pod exists, only what it adds.
    #[test]
    fn a_change_before_the_pod_exists_re_checks_every_right_for_the_user_making_it() {
        let old = SandboxRunSpec {
            command: Some(vec!["true".into()]),
            mounts: vec![mount(MountType::Secret, "a-secret")],
            ..SandboxRunSpec::default()
        };
        let mut hijacked = old.clone();
        hijacked.command = Some(vec!["sh".into(), "-c".into(), "cat /secret/*".into()]);
        assert_eq!(
            names(&to_verify(Some(&old), &hijacked, false)),
            ["get secrets/a-secret <- spec.mounts[0].source"]
        );
        // Once the pod exists the spec is fixed (update-immutable): only what is added.
        assert!(to_verify(Some(&old), &hijacked, true).is_empty());
        // Stopping, or what happens after the end, exercises nothing new.
        let mut stopped = old.clone();
        stopped.stop = true;
        stopped.ttl_seconds_after_finished = Some(60);
        assert!(to_verify(Some(&old), &stopped, false).is_empty());
        assert_eq!(to_verify(None, &old, false).len(), 1);
    }

    #[test]
    fn a_refusal_names_the_user_the_right_and_the_can_i_line() {
        let right = Right::get("secrets", "db");
        let f = refused(
            &right,
            &["spec.mounts[0].source".into()],
            "team",
            "alice",
            "",
        );
        assert_eq!(f.rule, ACCESS_RULE);
        assert_eq!(f.field, "spec.mounts[0].source");
        assert!(
            f.message
                .contains("alice may not get secrets \"db\" in namespace team"),
            "{}",
            f.message
        );
        assert!(
            f.hint
                .contains("kubectl auth can-i get secrets/db -n team --as alice"),
            "{}",
            f.hint
        );
    }

    #[test]
    fn a_named_store_needs_its_configmap_and_the_secret_it_names() {
        let spec = SandboxRunSpec {
            read_back: Some(crate::api::ReadBack {
                store_ref: Some("fast".into()),
                ..Default::default()
            }),
            ..SandboxRunSpec::default()
        };
        assert_eq!(
            names(&required(&spec)),
            ["get configmaps/fast <- spec.readBack.storeRef"]
        );
        let data: BTreeMap<String, String> = [
            ("url".to_string(), "s3://b/p".to_string()),
            ("secretName".to_string(), "fast-creds".to_string()),
        ]
        .into();
        let (right, field) = store_secret(&data).expect("secret right");
        assert_eq!(right, Right::get("secrets", "fast-creds"));
        assert!(field.starts_with(STORE_REF_FIELD), "{field}");
        assert_eq!(store_secret(&BTreeMap::new()), None);
    }
}
