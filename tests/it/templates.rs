//! Templates for platform teams (docs/contract.md "Templates"): a run that sets a field its
//! SandboxRunTemplate locks is refused by the live webhook, naming the field and the template;
//! a run that sets only open fields gets the pod the template says, with its own command and
//! variables, and keeps the template it was made from when the template is edited or deleted;
//! a run naming a template that does not exist is held with no pod until it does; the author
//! must be able to read the template. The cluster-scoped ClusterSandboxRunTemplate does the same
//! (`spec.templateRef.kind`), its reader granted by a ClusterRoleBinding.
//! The operator runs as a process on this host, its webhook registered by URL for the test's
//! namespace only; kwok plays the node.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use sandboxrun_operator::api::{
    ClusterSandboxRunTemplate, ClusterSandboxRunTemplateSpec, EnvVar, OpenField, Phase,
    ReadBackPhase, SandboxRun, SandboxRunSpec, SandboxRunTemplate, SandboxRunTemplateSpec,
    TemplateKind, TemplateRef,
};
use serde_json::json;

use crate::support::*;

/// How long the tests wait for the webhook or a status.
const CONVERGE: Duration = Duration::from_secs(90);

/// The platform team's template: image, user, pod labels, a variable and the read-back path
/// locked; `command` and `env` open.
fn template_spec(out: &std::path::Path) -> SandboxRunTemplateSpec {
    let locked = spec(&[out]).build();
    SandboxRunTemplateSpec {
        template: SandboxRunSpec {
            command: Some(vec!["/bin/true".into()]),
            env: vec![var("HTTPS_PROXY", "http://proxy.platform:3128")],
            pod_labels: Some(BTreeMap::from([("tier".into(), "locked".into())])),
            ..locked
        },
        open_fields: vec![OpenField::Command, OpenField::Env],
    }
}

fn var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: value.into(),
        value_from: None,
    }
}

/// The workload container of `pod`.
fn workload(pod: &Pod) -> &Container {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == "workload"))
        .expect("the pod has a workload container")
}

/// Deletes the webhook configuration when the test ends, however it ends.
struct WebhookConfig(String);

impl Drop for WebhookConfig {
    fn drop(&mut self) {
        let kubeconfig = kubeconfig_path();
        let _ = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["delete", "validatingwebhookconfiguration", &self.0])
            .args(["--ignore-not-found", "--wait=false"])
            .env("PATH", tools_path())
            .output();
    }
}

/// The tools directory of the bed first on PATH (kubectl).
fn tools_path() -> String {
    let bin = tools_bin()
        .map(|b| b.display().to_string())
        .unwrap_or_default();
    format!("{bin}:{}", std::env::var("PATH").unwrap_or_default())
}

/// Starts an operator that serves the webhook for `ns` (registered by URL) and reconciles its
/// runs; returns once the apiserver refuses a bad run through it.
async fn operator_with_webhook(
    client: &Client,
    ns: &str,
    store_url: &str,
) -> (Operator, WebhookConfig) {
    let port = free_port();
    let name = format!("sandboxrun-templates-{ns}");
    let config = loopback_webhook(
        &name,
        "validate.sandbox.iterion.io",
        ns,
        format!("https://127.0.0.1:{port}/validate-sandboxrun"),
        None,
        sandboxrun_rule(),
    );
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    vwcs.create(&PostParams::default(), &config)
        .await
        .expect("register the webhook configuration");
    let guard = WebhookConfig(name.clone());
    let addr = format!("127.0.0.1:{port}");
    let secret = format!("webhook-tls-{:08x}", rand_u32());
    let flags = [
        "--webhook-addr",
        &addr,
        "--webhook-cert-mode",
        "self-managed",
        "--webhook-hosts",
        "127.0.0.1,localhost",
        "--pod-namespace",
        ns,
        "--webhook-secret",
        &secret,
        "--webhook-config",
        &name,
    ];
    let op = Operator::builder(ns, store_url).flags(&flags).start();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), ns);
    let bad = SandboxRun::new(
        "probe-root",
        SandboxRunSpec {
            user: Some("0".into()),
            ..spec(&[]).build()
        },
    );
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually_or_log(
        "the apiserver to refuse a bad run through the webhook",
        CONVERGE,
        &op,
        || {
            let runs = runs.clone();
            let bad = bad.clone();
            let dry = dry.clone();
            async move {
                match runs.create(&dry, &bad).await {
                    Err(kube::Error::Api(e))
                        if e.message.contains("refused by ADR-006 admission") =>
                    {
                        Some(())
                    }
                    _ => None,
                }
            }
        },
    )
    .await;
    (op, guard)
}

/// The apiserver's refusal (422) of creating `spec` as `name`: its message.
async fn refusal(runs: &Api<SandboxRun>, name: &str, spec: SandboxRunSpec) -> String {
    match runs
        .create(&PostParams::default(), &SandboxRun::new(name, spec))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{name}: {status:?}");
            status.message
        }
        other => panic!("{name}: admitted, or not an apiserver refusal: {other:?}"),
    }
}

/// A user who may create runs but not read the template: refused with the right named; once the
/// template may be read, admitted (dry run).
async fn the_author_must_read_the_template(client: &Client, ns: &str, mine: &SandboxRunSpec) {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
    let role = |name: &str, rules: Vec<PolicyRule>| Role {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        rules: Some(rules),
    };
    let rule = |resource: &str, names: Option<Vec<String>>, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec!["sandbox.iterion.io".into()]),
        resources: Some(vec![resource.into()]),
        resource_names: names,
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    };
    let binding = |name: &str| RoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: "tmpl-alice".into(),
            namespace: None,
        }]),
    };
    let roles: Api<Role> = Api::namespaced(client.clone(), ns);
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    roles
        .create(
            &pp,
            &role("runs", vec![rule("sandboxruns", None, &["create", "get"])]),
        )
        .await
        .unwrap();
    bindings.create(&pp, &binding("runs")).await.unwrap();
    let alice: Api<SandboxRun> = Api::namespaced(client_as("tmpl-alice").await, ns);
    let message = refusal(&alice, "alice", mine.clone()).await;
    assert!(
        message.contains("[access] spec.templateRef.name")
            && message.contains("sandboxruntemplates"),
        "{message}"
    );
    let read = rule("sandboxruntemplates", Some(vec!["locked".into()]), &["get"]);
    roles
        .create(&pp, &role("template", vec![read]))
        .await
        .unwrap();
    bindings.create(&pp, &binding("template")).await.unwrap();
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually("alice may use the template she may read", CONVERGE, || {
        let alice = alice.clone();
        let run = SandboxRun::new("alice", mine.clone());
        let dry = dry.clone();
        async move { alice.create(&dry, &run).await.ok() }
    })
    .await;
}

#[tokio::test]
async fn a_locked_field_is_refused_and_the_merged_pod_is_what_the_template_says() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "templates").await;
    let (_store_dir, store_url) = file_store("templates");
    let (op, _webhook) = operator_with_webhook(&client, &ns.name, &store_url).await;
    let templates: Api<SandboxRunTemplate> = Api::namespaced(client.clone(), &ns.name);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let out = host_dir("out");
    std::fs::write(out.join("report.txt"), b"made from a template\n").unwrap();
    put_template(&templates, "locked", template_spec(&out)).await;

    // A run that sets locked fields: refused, each field and the template named.
    let evil = from_template(
        "locked",
        SandboxRunSpec {
            image: Some("registry.example/evil:1".into()),
            user: Some("0".into()),
            command: Some(vec!["id".into()]),
            ..Default::default()
        },
    );
    let message = refusal(&runs, "evil", evil).await;
    for want in [
        "[template-locked] spec.image",
        "spec.user",
        "SandboxRunTemplate locked",
        "open: command, env",
    ] {
        assert!(message.contains(want), "{want:?} not in: {message}");
    }
    // A variable the template sets is locked too, even with env open.
    let proxy = from_template(
        "locked",
        SandboxRunSpec {
            env: vec![var("HTTPS_PROXY", "http://mine")],
            ..Default::default()
        },
    );
    let message = refusal(&runs, "proxy", proxy).await;
    assert!(
        message.contains("spec.env[0].name") && message.contains("HTTPS_PROXY"),
        "{message}"
    );
    // A template that does not exist: refused.
    let message = refusal(
        &runs,
        "nowhere",
        from_template("nope", SandboxRunSpec::default()),
    )
    .await;
    assert!(
        message.contains("[template-unusable]") && message.contains("does not exist"),
        "{message}"
    );

    // Only open fields: admitted, and the pod is the template's with the run's command and env.
    let command = vec!["sh".to_string(), "-c".into(), "make report".into()];
    let mine = from_template(
        "locked",
        SandboxRunSpec {
            command: Some(command.clone()),
            env: vec![var("TARGET", "unit")],
            ..Default::default()
        },
    );
    the_author_must_read_the_template(&client, &ns.name, &mine).await;
    create(&runs, "made", mine).await;
    let run = wait_phase(&runs, "made", Phase::Running, &op).await;
    let applied = run
        .status
        .as_ref()
        .and_then(|s| s.template.clone())
        .expect("status.template");
    let stored = templates.get("locked").await.unwrap();
    assert_eq!(applied.name, "locked");
    assert_eq!(applied.generation, stored.metadata.generation);
    let pod = pods.get(&pod_of(&run)).await.unwrap();
    let w = workload(&pod);
    assert_eq!(
        w.image.as_deref(),
        Some(DIGEST_IMAGE),
        "the template's image"
    );
    assert_eq!(w.command.as_ref(), Some(&command), "the run's command");
    let env: BTreeMap<&str, &str> = w
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(
        env.get("HTTPS_PROXY"),
        Some(&"http://proxy.platform:3128"),
        "{env:?}"
    );
    assert_eq!(env.get("TARGET"), Some(&"unit"), "{env:?}");
    let sc = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    assert_eq!(
        (sc.run_as_user, sc.run_as_group),
        (Some(1000), Some(1000)),
        "the template's user"
    );
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("tier").map(String::as_str), Some("locked"));

    // The template edited, then deleted: the run keeps what it was made from, to its drain.
    let edit = json!({"spec": {"template": {"podLabels": {"tier": "edited"}}}});
    templates
        .patch("locked", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    templates
        .delete("locked", &DeleteParams::default())
        .await
        .unwrap();
    finish_workload(&pods, &pod_of(&run), 0).await;
    let done = wait_phase(&runs, "made", Phase::Succeeded, &op).await;
    let status = done.status.unwrap();
    assert_eq!(
        status.template.as_ref().map(|t| t.generation),
        Some(applied.generation)
    );
    assert_eq!(
        status.read_back.len(),
        1,
        "the template's read-back path: {status:?}"
    );
    assert_eq!(status.read_back[0].path, out.display().to_string());
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
}

#[tokio::test]
async fn a_run_whose_template_is_missing_is_held_without_a_pod_until_it_exists() {
    let client = client().await;
    ensure_crd(&client).await;
    // No webhook here: the controller alone must never run a run without its template.
    let ns = TestNamespace::new(&client, "templates-held").await;
    let (_store_dir, store_url) = file_store("templates-held");
    let op = Operator::builder(&ns.name, &store_url).start();
    let templates: Api<SandboxRunTemplate> = Api::namespaced(client.clone(), &ns.name);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let out = host_dir("out");
    let mine = from_template(
        "later",
        SandboxRunSpec {
            command: Some(vec!["sh".into(), "-c".into(), "work".into()]),
            ..Default::default()
        },
    );
    create(&runs, "held", mine).await;
    let held = wait_for(
        &runs,
        "held",
        &op,
        CONVERGE,
        "Ready=False TemplateUnusable",
        |r| {
            r.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Ready" && c.status == "False" && c.reason == "TemplateUnusable"
                })
            })
        },
    )
    .await;
    let status = held.status.unwrap();
    assert_eq!(status.phase, Some(Phase::Pending));
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("later does not exist"),
        "{status:?}"
    );
    assert_eq!(status.pod_name, None);
    assert!(
        pods.get_opt("held-sbr").await.unwrap().is_none(),
        "no pod without its template"
    );

    // The template appears: the run starts from it (templates are not watched: within 30 s).
    put_template(&templates, "later", template_spec(&out)).await;
    let run = wait_phase(&runs, "held", Phase::Running, &op).await;
    let pod = pods.get(&pod_of(&run)).await.unwrap();
    assert_eq!(workload(&pod).image.as_deref(), Some(DIGEST_IMAGE));
    assert_eq!(
        run.status
            .and_then(|s| s.template)
            .map(|t| t.name)
            .as_deref(),
        Some("later")
    );
}

/// Cluster-scoped RBAC objects of this test (a ClusterRole and its ClusterRoleBinding, same
/// name), deleted when the test ends.
struct ClusterGrant(String);

impl Drop for ClusterGrant {
    fn drop(&mut self) {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        let name = self.0.clone();
        clean_up_from_drop(move |client| async move {
            let dp = DeleteParams::default();
            let _ = Api::<ClusterRoleBinding>::all(client.clone())
                .delete(&name, &dp)
                .await;
            let _ = Api::<ClusterRole>::all(client).delete(&name, &dp).await;
        });
    }
}

/// A RuntimeClass for the pods of this area (the apiserver refuses a pod whose class does not
/// exist; on the kwok node its handler is never run).
const RUNTIME_CLASS: &str = "sandboxrun-test-templates";

async fn ensure_runtime_class(client: &Client) {
    use k8s_openapi::api::node::v1::RuntimeClass;
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    let rc: RuntimeClass = serde_json::from_value(json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": RUNTIME_CLASS}, "handler": "runc",
    }))
    .expect("a RuntimeClass");
    match classes.create(&PostParams::default(), &rc).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create RuntimeClass {RUNTIME_CLASS}: {e}"),
    }
}

/// A user who may create runs in `ns` but not read the cluster template `template`: refused,
/// the right named cluster-wide; once a ClusterRoleBinding lets them read it, admitted (dry run).
async fn the_author_must_read_the_cluster_template(
    client: &Client,
    ns: &str,
    template: &str,
    mine: &SandboxRunSpec,
) -> ClusterGrant {
    use k8s_openapi::api::rbac::v1::{
        ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
    };
    let user = format!("ctpl-alice-{ns}");
    let subject = Subject {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: "User".into(),
        name: user.clone(),
        namespace: None,
    };
    let rule = |resource: &str, names: Option<Vec<String>>, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec!["sandbox.iterion.io".into()]),
        resources: Some(vec![resource.into()]),
        resource_names: names,
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    };
    let meta = |name: &str| kube::api::ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    let pp = PostParams::default();
    // A Role in the namespace that names the cluster template is no grant of it: RBAC would
    // allow a namespaced review of that right, the webhook asks it cluster-wide.
    let named = Some(vec![template.to_string()]);
    let runs_role = Role {
        metadata: meta("runs"),
        rules: Some(vec![
            rule("sandboxruns", None, &["create", "get"]),
            rule("clustersandboxruntemplates", named, &["get"]),
        ]),
    };
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&pp, &runs_role)
        .await
        .unwrap();
    let runs_binding = RoleBinding {
        metadata: meta("runs"),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "runs".into(),
        },
        subjects: Some(vec![subject.clone()]),
    };
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&pp, &runs_binding)
        .await
        .unwrap();
    let as_alice = client_as(&user).await;
    eventually("alice's Role is in force", CONVERGE, || {
        namespaced_review_allowed(as_alice.clone(), ns, template)
    })
    .await;
    let alice: Api<SandboxRun> = Api::namespaced(as_alice, ns);
    let message = refusal(&alice, "alice", mine.clone()).await;
    for want in [
        "[access] spec.templateRef.name",
        &format!("clustersandboxruntemplates \"{template}\""),
        "cluster-wide",
    ] {
        assert!(message.contains(want), "{want:?} not in: {message}");
    }
    let grant = ClusterGrant(format!("sandboxrun-test-{ns}"));
    let read = rule(
        "clustersandboxruntemplates",
        Some(vec![template.into()]),
        &["get"],
    );
    Api::<ClusterRole>::all(client.clone())
        .create(
            &pp,
            &ClusterRole {
                metadata: meta(&grant.0),
                rules: Some(vec![read]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(
            &pp,
            &ClusterRoleBinding {
                metadata: meta(&grant.0),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: grant.0.clone(),
                },
                subjects: Some(vec![subject]),
            },
        )
        .await
        .unwrap();
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually(
        "alice may use the cluster template she may read",
        CONVERGE,
        || {
            let alice = alice.clone();
            let run = SandboxRun::new("alice", mine.clone());
            let dry = dry.clone();
            async move { alice.create(&dry, &run).await.ok() }
        },
    )
    .await;
    grant
}

/// Some(()) when `client`'s user may `get` the cluster template `template` as a review in
/// namespace `ns` asks it (what a namespaced Role grants).
async fn namespaced_review_allowed(client: Client, ns: &str, template: &str) -> Option<()> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(ns.into()),
                verb: Some("get".into()),
                group: Some("sandbox.iterion.io".into()),
                resource: Some("clustersandboxruntemplates".into()),
                name: Some(template.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client);
    let answer = api.create(&PostParams::default(), &review).await.ok()?;
    answer.status.is_some_and(|s| s.allowed).then_some(())
}

/// Issue #29 item 3: the cluster-scoped template does what the namespaced one does, through the
/// live webhook and the controller: a locked field refused naming the field and the template
/// with its kind, the author's `get` on it asked cluster-wide, the pod the template's (image,
/// user, runtime class) with the run's command, and the kind in `status.template`.
#[tokio::test]
async fn a_cluster_template_locks_its_fields_is_read_only_by_whom_rbac_names_and_makes_the_pod() {
    let client = client().await;
    ensure_crd(&client).await;
    ensure_runtime_class(&client).await;
    let ns = TestNamespace::new(&client, "templates-cluster").await;
    let (_store_dir, store_url) = file_store("templates-cluster");
    let (op, _webhook) = operator_with_webhook(&client, &ns.name, &store_url).await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let out = host_dir("out");
    std::fs::write(out.join("report.txt"), b"made from a cluster template\n").unwrap();
    let name = format!("{}-ci", ns.name);
    let mut locked = template_spec(&out);
    locked.template.runtime_class_name = Some(RUNTIME_CLASS.into());
    let templates: Api<ClusterSandboxRunTemplate> = Api::all(client.clone());
    templates
        .create(
            &PostParams::default(),
            &ClusterSandboxRunTemplate::new(&name, ClusterSandboxRunTemplateSpec(locked)),
        )
        .await
        .expect("create the ClusterSandboxRunTemplate");
    let _template = ClusterTemplate(name.clone());
    let made_from = |extra: SandboxRunSpec| SandboxRunSpec {
        template_ref: Some(TemplateRef::cluster(&name)),
        ..extra
    };

    // Locked fields: refused, each named, the template named with its kind.
    let evil = made_from(SandboxRunSpec {
        image: Some("registry.example/evil:1".into()),
        runtime_class_name: Some("runc".into()),
        ..Default::default()
    });
    let message = refusal(&runs, "evil", evil).await;
    for want in [
        "[template-locked] spec.image",
        "spec.runtimeClassName",
        &format!("ClusterSandboxRunTemplate {name}"),
    ] {
        assert!(message.contains(want), "{want:?} not in: {message}");
    }
    // The kind matters: no SandboxRunTemplate of that name exists in the namespace.
    let namespaced = SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced(&name)),
        ..Default::default()
    };
    let message = refusal(&runs, "namespaced", namespaced).await;
    assert!(
        message.contains("[template-unusable]")
            && message.contains(&format!(
                "SandboxRunTemplate {}/{name} does not exist",
                ns.name
            )),
        "{message}"
    );

    let command = vec!["sh".to_string(), "-c".into(), "make report".into()];
    let mine = made_from(SandboxRunSpec {
        command: Some(command.clone()),
        env: vec![var("TARGET", "unit")],
        ..Default::default()
    });
    let _grant = the_author_must_read_the_cluster_template(&client, &ns.name, &name, &mine).await;
    create(&runs, "made", mine).await;
    let run = wait_phase(&runs, "made", Phase::Running, &op).await;
    let applied = run
        .status
        .as_ref()
        .and_then(|s| s.template.clone())
        .expect("status.template");
    let stored = templates.get(&name).await.unwrap();
    assert_eq!(
        (applied.kind, applied.name.as_str(), applied.generation),
        (
            TemplateKind::ClusterSandboxRunTemplate,
            name.as_str(),
            stored.metadata.generation
        )
    );
    let pod = pods.get(&pod_of(&run)).await.unwrap();
    let w = workload(&pod);
    assert_eq!(
        w.image.as_deref(),
        Some(DIGEST_IMAGE),
        "the template's image"
    );
    assert_eq!(w.command.as_ref(), Some(&command), "the run's command");
    let spec = pod.spec.clone().unwrap_or_default();
    assert_eq!(
        spec.runtime_class_name.as_deref(),
        Some(RUNTIME_CLASS),
        "the template's runtime class"
    );
    let sc = spec.security_context.unwrap_or_default();
    assert_eq!(
        (sc.run_as_user, sc.run_as_group),
        (Some(1000), Some(1000)),
        "the template's user"
    );
    let env: BTreeMap<&str, &str> = w
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(env.get("HTTPS_PROXY"), Some(&"http://proxy.platform:3128"));
    assert_eq!(env.get("TARGET"), Some(&"unit"));

    // Deleted: the run keeps what it was made from, to its drain.
    templates
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    finish_workload(&pods, &pod_of(&run), 0).await;
    let done = wait_phase(&runs, "made", Phase::Succeeded, &op).await;
    let status = done.status.unwrap();
    assert_eq!(status.read_back.len(), 1, "the template's path: {status:?}");
    assert_eq!(
        status.read_back[0].phase,
        ReadBackPhase::Drained,
        "{status:?}"
    );
}

/// Issues #38 and #39: a warm pool's pods are judged as any pod is, with no webhook in the way.
/// The operator (`--warm-pools`, rights held without an admission) makes no pool pods of a
/// template its admission rules refuse (`hostState: auto`) nor of one whose runs would use an
/// author's rights (an env value from a Secret: a pool pod is made before any author is known),
/// and says why in the pool's status; a pool in a namespace whose ResourceQuota admits one pod
/// gets one, and its status says the namespace refused the next. (Before, the pool made pods of
/// both templates, and a quota refusal was only a retried error.)
#[tokio::test]
async fn a_warm_pool_is_judged_by_the_rules_the_authors_rights_and_the_quota() {
    use k8s_openapi::api::core::v1::ResourceQuota;
    use sandboxrun_operator::api::{HostState, SandboxRunPool, SandboxRunPoolSpec};
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "templates-pools").await;
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "pods"},
        "spec": {"hard": {"pods": "1"}},
    }))
    .unwrap();
    Api::<ResourceQuota>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();
    let (_store_dir, store_url) = file_store("templates-pools");
    let op = Operator::builder(&ns.name, &store_url)
        // The pool seals its pods with the admission key (issue #51): its Secret in the test's
        // namespace.
        .flags(&[
            "--warm-pools",
            "--unadmitted-references",
            "hold",
            "--pod-namespace",
            &ns.name,
        ])
        .start();
    let templates: Api<SandboxRunTemplate> = Api::namespaced(client.clone(), &ns.name);
    let out = host_dir("out");
    let plain = template_spec(&out);
    let mut refused = template_spec(&out);
    refused.template.host_state = Some(HostState::Auto);
    let mut secret = template_spec(&out);
    secret.template.env.push(EnvVar {
        name: "TOKEN".into(),
        value: String::new(),
        value_from: Some(
            serde_json::from_value(json!({"secretKeyRef": {"name": "db", "key": "password"}}))
                .unwrap(),
        ),
    });
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    for (name, spec, replicas) in [
        ("plain", plain, 3),
        ("refused", refused, 1),
        ("secret", secret, 1),
    ] {
        put_template(&templates, name, spec).await;
        let pool = SandboxRunPool::new(
            name,
            SandboxRunPoolSpec {
                template_ref: TemplateRef::namespaced(name),
                replicas,
            },
        );
        pools.create(&PostParams::default(), &pool).await.unwrap();
    }
    let message_of = |name: &'static str, words: &'static str| {
        let pools = pools.clone();
        async move {
            eventually(
                &format!("pool {name}'s status to say {words:?}"),
                CONVERGE,
                || {
                    let pools = pools.clone();
                    async move {
                        let s = pools.get(name).await.ok()?.status?;
                        s.message
                            .filter(|m| m.contains(words))
                            .map(|m| (m, s.replicas))
                    }
                },
            )
            .await
        }
    };
    let (why, _) = message_of("refused", "admission rules refuse").await;
    assert!(why.contains("hostState"), "{why}");
    let (why, _) = message_of("secret", "rights must cover").await;
    assert!(why.contains("env"), "{why}");
    // The one pod the quota admits is counted once it is seen; the next ones stay refused.
    let why = eventually("pool plain: one pod and the quota named", CONVERGE, || {
        let pools = pools.clone();
        async move {
            let s = pools.get("plain").await.ok()?.status?;
            let m = s.message.filter(|m| m.contains("exceeded quota"))?;
            (s.replicas == 1).then_some(m)
        }
    })
    .await;
    assert!(why.contains("refused a pool pod"), "{why}");
    // The same in `kubectl describe sbrp`: an Event per reason, about each pool.
    for (pool, reason) in [
        ("refused", "NotPooled"),
        ("secret", "NotPooled"),
        ("plain", "PodRefused"),
        ("plain", "PodsCreated"),
    ] {
        let event = wait_event(&client, &ns.name, Some(pool), reason, CONVERGE, &op).await;
        let warning = reason != "PodsCreated";
        assert_eq!(
            event.type_.as_deref(),
            Some(if warning { "Warning" } else { "Normal" }),
            "{event:?}"
        );
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pool_pods = pods
        .list(&kube::api::ListParams::default().labels("sandbox.iterion.io/pool"))
        .await
        .unwrap()
        .items;
    let names: Vec<_> = pool_pods.iter().map(|p| p.metadata.name.clone()).collect();
    assert_eq!(names.len(), 1, "{names:?}\n{}", op.log_text());
    assert!(
        names[0].as_deref().unwrap_or_default().starts_with("plain"),
        "{names:?}"
    );
}
