//! A pool's pods and a run's claim of one, as data (docs/user-guide.md "Sandboxes for agents:
//! warm pools"). Pure: the pool controller and the run controller read and write them.
//!
//! - [`pool_pod`]: the pod the pod builder makes for a run made from the pool's template (a
//!   stand-in run named after the pool), parked in the launcher ([`super::park`]), named
//!   `<pool>-<hash>-<suffix>`, labelled with its pool and its template's hash, owned by the pool.
//! - [`view_of`]: what the pool's plan needs to know of one of its pods.
//! - [`claim_patch`]: the merge patch that makes a pool pod a run's: the labels and owner of the
//!   pod the run would get cold, the claim label, guarded by the pod's resourceVersion.
//! - [`start_message`]: what the launcher starts: the cold pod's workload command and env.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::{Resource, ResourceExt};
use serde_json::{json, Value};

use super::plan::PoolPod;
use crate::api::{SandboxRun, SandboxRunPool, SandboxRunSpec};
use crate::inpod::launch::StartMessage;
use crate::pod::{PodSettings, WORKLOAD_CONTAINER};

/// The label naming a pool pod's pool (kept after a claim: the pool counts it as claimed).
pub const POOL_LABEL: &str = "sandbox.iterion.io/pool";
/// The label holding the hash of the template version a pool pod was made from.
pub const HASH_LABEL: &str = "sandbox.iterion.io/pool-template-hash";
/// The label a claim sets: the uid of the run that took the pod.
pub const CLAIMED_BY_LABEL: &str = "sandbox.iterion.io/claimed-by";
/// The label a claim sets beside [`CLAIMED_BY_LABEL`]: the run's attempt the pod serves (a
/// retried run claims a pod for each attempt; absent on pods claimed before: the first).
pub const CLAIMED_ATTEMPT_LABEL: &str = "sandbox.iterion.io/claimed-attempt";
/// The label naming the pool pod itself, which its NetworkPolicy selects ([`super::egress`]):
/// kept after a claim, so that policy never stops selecting it.
pub const POOL_POD_LABEL: &str = "sandbox.iterion.io/pool-pod";

/// Why a pool makes no pods.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolPodError {
    /// The template's runs restrict egress and the operator would refuse such a run (its rules
    /// cannot be enforced, or this cluster's NetworkPolicy is declared unenforced and restricted
    /// runs are refused): no pod is made for them ahead of a run either.
    #[error("its template's egress is refused: {0}")]
    Egress(String),
    /// The pod builder refused the template's spec.
    #[error("its template does not make a pod: {0}")]
    Build(String),
}

/// The stand-in run a pool's pods are built for: named after the pool, with the template's
/// merged spec (`made`), so every pod of one template version is the same pod.
pub fn stand_in(pool: &SandboxRunPool, made: SandboxRunSpec) -> SandboxRun {
    let mut run = SandboxRun::new(&pool.name_any(), made);
    run.metadata.namespace = pool.namespace();
    run.metadata.uid = Some(format!("pool-{}", pool.uid().unwrap_or_default()));
    run
}

/// The pool pod for `stand_in` (the run made from the pool's template), and its template hash
/// (of the parked pod's spec: a change of the template or of the operator's pod settings is a
/// new version). `suffix` makes its name unique.
pub fn pool_pod(
    pool: &SandboxRunPool,
    stand_in: &SandboxRun,
    settings: &PodSettings,
    suffix: &str,
) -> Result<(Pod, String), PoolPodError> {
    use crate::egress::verdict::{verdict, EgressVerdict};
    if let EgressVerdict::Refuse { message, .. } = verdict(stand_in, &settings.egress) {
        return Err(PoolPodError::Egress(message));
    }
    let built = crate::pod::build_pod(stand_in, settings)
        .map_err(|e| PoolPodError::Build(e.to_string()))?;
    let mut pod = super::park::park_in_launcher(built, settings)
        .ok_or_else(|| PoolPodError::Build("the pod has no workload container".into()))?;
    let hash = template_hash(
        &pod,
        &crate::egress::policy::egress_shape(stand_in, &settings.egress),
    );
    let pool_name = pool.name_any();
    let mut labels = BTreeMap::from([
        (
            crate::names::MANAGED_BY_LABEL.to_string(),
            crate::names::MANAGED_BY.to_string(),
        ),
        (POOL_LABEL.to_string(), label_value(&pool_name)),
        (HASH_LABEL.to_string(), hash.clone()),
    ]);
    // The template's own pod labels stay (a run's cold pod has them too).
    for (k, v) in stand_in.spec.pod_labels.iter().flatten() {
        if !crate::names::reserved_key(k) {
            labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let name = pod_name(&pool_name, &hash, suffix);
    labels.insert(POOL_POD_LABEL.to_string(), name.clone());
    pod.metadata.name = Some(name);
    pod.metadata.labels = Some(labels);
    pod.metadata.owner_references = pool.controller_owner_ref(&()).map(|o| vec![o]);
    spread_across_nodes(&mut pod, &label_value(&pool_name));
    Ok((pod, hash))
}

/// The topology key a pool spreads its pods over: one node.
pub const SPREAD_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// A pool's unclaimed pods spread across nodes (issue #52, docs/contract.md "Under gVisor, and
/// when the node fails"): a lost node takes as few of them as the scheduler can manage. Soft
/// (`ScheduleAnyway`): a pool still fills one node when that is all there is, or when the other
/// nodes are lost. Added after the template hash: it is not the template's shape, so a run's cold
/// pod compares equal and an earlier release's pool pods are not replaced for it.
fn spread_across_nodes(pod: &mut Pod, pool_label: &str) {
    use k8s_openapi::api::core::v1::TopologySpreadConstraint;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    let selector = LabelSelector {
        match_labels: Some(BTreeMap::from([(
            POOL_LABEL.to_string(),
            pool_label.to_string(),
        )])),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: CLAIMED_BY_LABEL.to_string(),
            operator: "DoesNotExist".to_string(),
            values: None,
        }]),
    };
    if let Some(spec) = pod.spec.as_mut() {
        spec.topology_spread_constraints = Some(vec![TopologySpreadConstraint {
            max_skew: 1,
            topology_key: SPREAD_TOPOLOGY_KEY.to_string(),
            when_unsatisfiable: "ScheduleAnyway".to_string(),
            label_selector: Some(selector),
            ..Default::default()
        }]);
    }
}

/// The hash of a parked pod's **shape**: its spec but what the launcher delivers at claim time
/// (the workload's command, args and plain env values; a value taken from a field or a Secret
/// stays in), its own labels and annotations (the run's `podLabels` and `podAnnotations`: the
/// operator's reserved keys, which name the run or the pool, are not its shape), and `egress`,
/// the NetworkPolicy its runs get ([`crate::egress::policy::egress_shape`]). A pool pod's is its template
/// version; a run's cold pod, parked, must have the same to take a pool pod (its namespace's
/// default runtime class, say, would change it). Everything that shapes the pod's network or
/// identity is in it (issue #51): a template narrowed to fewer rules or labels is a new version,
/// so the pool replaces its pods and no run takes one of the old, wider ones.
pub fn template_hash(pod: &Pod, egress: &Value) -> String {
    let mut spec = pod.spec.clone().unwrap_or_default();
    // The pool's own spreading ([`spread_across_nodes`]) is the operator's, as its labels are.
    spec.topology_spread_constraints = None;
    for c in spec
        .containers
        .iter_mut()
        .filter(|c| c.name == WORKLOAD_CONTAINER)
    {
        c.args = None;
        // Plain values and keys of Secrets and ConfigMaps are the launcher's to deliver
        // (`super::env`, issue #54): only a source the pod must carry shapes it.
        if let Some(env) = c.env.as_mut() {
            env.retain(|e| {
                e.value_from
                    .as_ref()
                    .is_some_and(|f| super::env::deliverable(f).is_none())
            });
        }
    }
    let own = |m: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        m.iter()
            .filter(|(k, _)| !crate::names::reserved_key(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let shape = json!({
        "spec": spec,
        "labels": own(pod.labels()),
        "annotations": own(pod.annotations()),
        "egress": egress,
    });
    crate::names::short_hash(&shape.to_string())
}

/// A label value for `name` (≤ 63 characters: longer names are cut and hashed).
pub fn label_value(name: &str) -> String {
    if name.len() <= 63 {
        return name.to_string();
    }
    format!(
        "{}-{}",
        name[..54].trim_end_matches(['-', '.']),
        crate::names::short_hash(name)
    )
}

/// `<pool>-<hash>-<suffix>`, cut to a DNS label's 63 characters.
fn pod_name(pool: &str, hash: &str, suffix: &str) -> String {
    let keep = 63 - hash.len() - suffix.len() - 2;
    let head = pool[..pool.len().min(keep)].trim_end_matches(['-', '.']);
    format!("{head}-{hash}-{suffix}")
}

/// The selector of a pool's unclaimed pods (its status' `selector`, for the scale subresource).
pub fn unclaimed_selector(pool: &str) -> String {
    format!("{POOL_LABEL}={},!{CLAIMED_BY_LABEL}", label_value(pool))
}

/// What the pool's plan needs of one of its pods, `made` what it is to the pool
/// (`super::seal::Judge::of`). Ready: its workload (parked in the launcher) and its holder run.
pub fn view_of(pod: &Pod, made: super::plan::Made) -> PoolPod {
    let running = |name: &str| {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.name == name && c.state.as_ref().is_some_and(|s| s.running.is_some())
                })
            })
    };
    PoolPod {
        name: pod.name_any(),
        template_hash: pod.labels().get(HASH_LABEL).cloned().unwrap_or_default(),
        claimed: pod.labels().contains_key(CLAIMED_BY_LABEL),
        ready: running(WORKLOAD_CONTAINER) && running(crate::names::HOLDER_CONTAINER),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        sealed: made == super::plan::Made::Sealed,
        orphan: made == super::plan::Made::Orphan,
    }
}

/// The merge patch that makes the pool pod `rv` (its resourceVersion) the pod of the run whose
/// cold pod is `cold`: the cold pod's labels (run uid, name, shard, the run's pod labels) added,
/// the claim label set, the run as its only owner. A pod changed since it was read is refused
/// (409): another run took it.
pub fn claim_patch(cold: &Pod, (run_uid, attempt): (&str, u32), rv: &str) -> Value {
    let mut labels: BTreeMap<String, String> = cold.labels().clone();
    labels.insert(CLAIMED_BY_LABEL.to_string(), run_uid.to_string());
    labels.insert(CLAIMED_ATTEMPT_LABEL.to_string(), attempt.to_string());
    json!({
        "metadata": {
            "resourceVersion": rv,
            "labels": labels,
            "ownerReferences": cold.metadata.owner_references,
        }
    })
}

/// Whether `pod` is the pool pod the run `run_uid` claimed for its attempt `attempt` (and not
/// being deleted: an earlier attempt's pod may still be going). `made`: what the pod is to the
/// pool (`super::seal::Judge::of`): a look-alike labelled `claimed-by=<the run's uid>` by
/// whoever created it is not the run's pod (issue #51).
pub fn claimed_for(pod: &Pod, made: super::plan::Made, run_uid: &str, attempt: u32) -> bool {
    if made != super::plan::Made::Sealed {
        return false;
    }
    let labels = pod.labels();
    let of_attempt = labels
        .get(CLAIMED_ATTEMPT_LABEL)
        .map_or(attempt == 1, |a| *a == attempt.to_string());
    labels.get(CLAIMED_BY_LABEL).map(String::as_str) == Some(run_uid)
        && of_attempt
        && pod.metadata.deletion_timestamp.is_none()
}

/// What the launcher starts for the run `run_uid` whose cold pod is `cold`: its workload's command and
/// args, and its env's plain values (the ones from a field or resource are the same in the pool
/// pod, made by the same builder). None when the cold pod has no workload or no command: the
/// image's own entrypoint cannot be started by the launcher, so the run starts cold.
pub fn start_message(cold: &Pod, run_uid: &str) -> Option<StartMessage> {
    let workload = cold
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == WORKLOAD_CONTAINER)?;
    let mut argv = workload.command.clone().filter(|c| !c.is_empty())?;
    argv.extend(workload.args.clone().unwrap_or_default());
    let env = workload
        .env
        .iter()
        .flatten()
        .filter(|e| e.value_from.is_none())
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    Some(StartMessage {
        run: run_uid.to_string(),
        argv,
        env,
        refuse: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ReadBack, ReadBackPath, SandboxRunPoolSpec, TemplateRef};
    use crate::pool::plan::Made;

    fn pool() -> SandboxRunPool {
        let mut pool = SandboxRunPool::new(
            "agents",
            SandboxRunPoolSpec {
                template_ref: TemplateRef::namespaced("agent"),
                replicas: 2,
            },
        );
        pool.metadata.namespace = Some("team".into());
        pool.metadata.uid = Some("pool-uid".into());
        pool
    }

    fn made() -> SandboxRunSpec {
        SandboxRunSpec {
            image: Some("busybox".into()),
            command: Some(vec!["sh".into(), "-c".into(), "sleep 1".into()]),
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

    #[test]
    fn a_pool_pod_is_the_templates_pod_parked_owned_by_the_pool_and_hashed_by_its_spec() {
        let settings = PodSettings::default();
        let pool = pool();
        let (pod, hash) = pool_pod(&pool, &stand_in(&pool, made()), &settings, "x1y2z").unwrap();
        let name = pod.name_any();
        assert!(
            name.starts_with("agents-") && name.ends_with("-x1y2z"),
            "{name}"
        );
        assert_eq!(pod.labels()[POOL_LABEL], "agents");
        assert_eq!(pod.labels()[HASH_LABEL], hash);
        assert!(!pod.labels().contains_key(crate::names::RUN_UID_LABEL));
        assert!(!pod.labels().contains_key(CLAIMED_BY_LABEL));
        assert_eq!(pod.owner_references()[0].kind, "SandboxRunPool");
        let workload = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            workload.command.as_deref().unwrap()[0],
            super::super::park::launcher_path()
        );
        // Same template, same hash; another template version, another hash; an env value is not
        // the pod's shape (the launcher delivers it), the runtime class is.
        let (again, same) = pool_pod(&pool, &stand_in(&pool, made()), &settings, "other").unwrap();
        assert_eq!(same, hash);
        assert_ne!(again.name_any(), name);
        let mut changed = made();
        changed.image = Some("busybox:2".into());
        let (_, other) = pool_pod(&pool, &stand_in(&pool, changed), &settings, "a").unwrap();
        assert_ne!(other, hash);
        let mut env = made();
        env.env = vec![crate::api::EnvVar {
            name: "VERSION".into(),
            value: "2".into(),
            value_from: None,
        }];
        let (_, with_env) = pool_pod(&pool, &stand_in(&pool, env), &settings, "a").unwrap();
        assert_eq!(with_env, hash, "env values are delivered, not built in");
        let mut kata = made();
        kata.runtime_class_name = Some("kata".into());
        let (_, isolated) = pool_pod(&pool, &stand_in(&pool, kata), &settings, "a").unwrap();
        assert_ne!(isolated, hash, "a runtime class is the pod's shape");
        assert_eq!(pod.labels()[POOL_POD_LABEL], name);
        // Its unclaimed pods spread across nodes, softly; not the template's shape.
        let spread = pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.clone())
            .unwrap_or_default();
        assert_eq!(spread.len(), 1, "{spread:?}");
        assert_eq!(spread[0].topology_key, SPREAD_TOPOLOGY_KEY);
        assert_eq!(spread[0].when_unsatisfiable, "ScheduleAnyway");
        let selector = spread[0].label_selector.clone().unwrap_or_default();
        assert_eq!(
            selector.match_labels.unwrap_or_default().get(POOL_LABEL),
            Some(&"agents".to_string())
        );
        assert_eq!(
            selector.match_expressions.unwrap_or_default()[0].key,
            CLAIMED_BY_LABEL
        );
        assert_eq!(
            template_hash(&pod, &Value::Null),
            template_hash(&again, &Value::Null)
        );
        // A template whose runs restrict egress is pooled behind the egress gate, as a run's pod
        // would be; one the operator would refuse (this cluster declared NetworkPolicy
        // unenforced, restricted runs refused) is not.
        let mut filtered = made();
        filtered.network = Some(crate::api::NetworkPolicy {
            mode: crate::api::NetworkMode::Allowlist,
            rules: vec!["example.com".into()],
        });
        let (gated, _) =
            pool_pod(&pool, &stand_in(&pool, filtered.clone()), &settings, "a").unwrap();
        let inits = gated
            .spec
            .as_ref()
            .unwrap()
            .init_containers
            .clone()
            .unwrap();
        assert_eq!(inits[0].name, crate::inpod::gate::GATE_CONTAINER);
        let mut refusing = settings.clone();
        refusing.egress.enforcement = crate::egress::PolicyEnforcement::UnenforcedRefuse;
        let refused = pool_pod(&pool, &stand_in(&pool, filtered), &refusing, "a").unwrap_err();
        assert!(
            matches!(&refused, PoolPodError::Egress(m) if m.contains("unenforced")),
            "{refused}"
        );
        assert_eq!(
            unclaimed_selector("agents"),
            "sandbox.iterion.io/pool=agents,!sandbox.iterion.io/claimed-by"
        );
        assert!(pod_name(&"p".repeat(80), &hash, "abcde").len() <= 63);
    }

    /// Issue #54: an env value read from a key of a Secret or ConfigMap is delivered by the
    /// launcher, so a run's cold pod that references one has the pool pods' shape (fails on the
    /// old code: the reference was part of the hash, and the run went cold as `OtherShape`).
    #[test]
    fn an_env_value_from_a_secret_key_is_not_the_pool_pods_shape() {
        let settings = PodSettings::default();
        let pool = pool();
        let (_, hash) = pool_pod(&pool, &stand_in(&pool, made()), &settings, "a").unwrap();
        let mut secret = made();
        secret.env = vec![crate::api::EnvVar {
            name: "TOKEN".into(),
            value: String::new(),
            value_from: Some(crate::api::EnvVarSource {
                secret_key_ref: Some(k8s_openapi::api::core::v1::SecretKeySelector {
                    name: "creds".into(),
                    key: "token".into(),
                    optional: None,
                }),
                config_map_key_ref: None,
            }),
        }];
        let (_, with_secret) = pool_pod(&pool, &stand_in(&pool, secret), &settings, "a").unwrap();
        assert_eq!(with_secret, hash);
    }

    #[test]
    fn a_claim_gives_the_pod_the_cold_pods_labels_and_owner_and_the_launcher_its_command() {
        let mut run = SandboxRun::new("job", made());
        run.metadata.namespace = Some("team".into());
        run.metadata.uid = Some("run-uid".into());
        let mut spec = made();
        spec.env = vec![crate::api::EnvVar {
            name: "TASK".into(),
            value: "42".into(),
            value_from: None,
        }];
        run.spec = spec;
        let cold = crate::pod::build_pod(&run, &PodSettings::default()).unwrap();
        let patch = claim_patch(&cold, ("run-uid", 2), "17");
        assert_eq!(patch["metadata"]["resourceVersion"], "17");
        assert_eq!(patch["metadata"]["labels"][CLAIMED_BY_LABEL], "run-uid");
        assert_eq!(patch["metadata"]["labels"][CLAIMED_ATTEMPT_LABEL], "2");
        // The pod of the run's attempt: by the claim's labels, not a going one, not an earlier
        // attempt's (a pod claimed before the attempt label is the first attempt's).
        let mut claimed = cold.clone();
        let labels = claimed.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(CLAIMED_BY_LABEL.into(), "run-uid".into());
        assert!(claimed_for(&claimed, Made::Sealed, "run-uid", 1));
        assert!(!claimed_for(&claimed, Made::Sealed, "run-uid", 2));
        assert!(!claimed_for(&claimed, Made::Sealed, "other", 1));
        let labels = claimed.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(CLAIMED_ATTEMPT_LABEL.into(), "2".into());
        assert!(claimed_for(&claimed, Made::Sealed, "run-uid", 2));
        assert!(!claimed_for(&claimed, Made::Sealed, "run-uid", 1));
        claimed.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert!(!claimed_for(&claimed, Made::Sealed, "run-uid", 2), "going");
        // A look-alike labelled claimed-by the run (by whoever created it) is not its pod.
        claimed.metadata.deletion_timestamp = None;
        assert!(claimed_for(&claimed, Made::Sealed, "run-uid", 2));
        assert!(!claimed_for(&claimed, Made::Foreign, "run-uid", 2));
        assert!(!claimed_for(&claimed, Made::Orphan, "run-uid", 2));
        assert_eq!(
            patch["metadata"]["labels"][crate::names::RUN_UID_LABEL],
            "run-uid"
        );
        assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "run-uid");
        let msg = start_message(&cold, "run-uid").unwrap();
        assert_eq!(msg.run, "run-uid");
        assert_eq!(msg.argv, ["sh", "-c", "sleep 1"]);
        assert!(msg.env.contains(&("TASK".to_string(), "42".to_string())));
        assert!(msg
            .env
            .iter()
            .any(|(k, v)| k == crate::pod::ATTEMPT_ENV && v == "1"));
        // The image's own entrypoint cannot be started by the launcher: cold.
        let mut bare = cold.clone();
        bare.spec.as_mut().unwrap().containers[0].command = None;
        assert!(start_message(&bare, "run-uid").is_none());
    }

    /// The hash a run made from `made` gets for its cold pod, parked (what a claim compares).
    fn run_hash(made: SandboxRunSpec, settings: &PodSettings) -> String {
        let mut run = SandboxRun::new("job", made);
        run.metadata.namespace = Some("team".into());
        run.metadata.uid = Some("run-uid".into());
        let cold = crate::pod::build_pod(&run, settings).unwrap();
        let parked = super::super::park::park_in_launcher(cold, settings).unwrap();
        template_hash(
            &parked,
            &crate::egress::policy::egress_shape(&run, &settings.egress),
        )
    }

    #[test]
    fn a_template_narrowed_in_its_network_rules_or_pod_labels_is_a_new_version() {
        let settings = PodSettings::default();
        let pool = pool();
        let hash = |spec: SandboxRunSpec| {
            let (_, hash) =
                pool_pod(&pool, &stand_in(&pool, spec.clone()), &settings, "a").unwrap();
            // A run made from the same template has the pool's version: it may claim.
            assert_eq!(run_hash(spec, &settings), hash);
            hash
        };
        let network = |rules: &[&str]| {
            let mut spec = made();
            spec.network = Some(crate::api::NetworkPolicy {
                mode: crate::api::NetworkMode::Allowlist,
                rules: rules.iter().map(|r| r.to_string()).collect(),
            });
            spec
        };
        let wide = hash(network(&["example.com", "192.0.2.0/24"]));
        // An address range dropped (the NetworkPolicy narrows), a host dropped (the proxy's rules
        // narrow), everything dropped: each a new version.
        let no_range = hash(network(&["example.com"]));
        let no_host = hash(network(&["192.0.2.0/24"]));
        let nothing = hash(network(&[]));
        let versions = std::collections::BTreeSet::from([&wide, &no_range, &no_host, &nothing]);
        assert_eq!(versions.len(), 4, "{versions:?}");
        assert_eq!(hash(network(&["example.com", "192.0.2.0/24"])), wide);
        // Pod labels and annotations are the pod's identity: one dropped is a new version.
        let labelled = |labels: &[(&str, &str)]| {
            let mut spec = made();
            spec.pod_labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            spec
        };
        let both = hash(labelled(&[("team", "a"), ("egress", "wide")]));
        assert_ne!(hash(labelled(&[("team", "a")])), both);
        assert_eq!(hash(labelled(&[("team", "a"), ("egress", "wide")])), both);
        let mut annotated = made();
        annotated.pod_annotations = Some([("mesh/inject".to_string(), "no".to_string())].into());
        assert_ne!(hash(annotated), hash(made()));
        // The operator's own labels (the pool's, its hash, the run's uid) are not the shape.
        let (pod, version) = pool_pod(&pool, &stand_in(&pool, made()), &settings, "a").unwrap();
        let egress =
            crate::egress::policy::egress_shape(&stand_in(&pool, made()), &settings.egress);
        assert_eq!(template_hash(&pod, &egress), version);
    }
}
