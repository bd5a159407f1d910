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
    let hash = template_hash(&pod);
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
    Ok((pod, hash))
}

/// The hash of a parked pod's spec, its **shape**: everything but what the launcher delivers at
/// claim time (the workload's command, args and plain env values; a value taken from a field or
/// a Secret stays in). A pool pod's is its template version; a run's cold pod, parked, must have
/// the same to take a pool pod (its namespace's default runtime class, say, would change it).
pub fn template_hash(pod: &Pod) -> String {
    let mut spec = pod.spec.clone().unwrap_or_default();
    for c in spec
        .containers
        .iter_mut()
        .filter(|c| c.name == WORKLOAD_CONTAINER)
    {
        c.args = None;
        if let Some(env) = c.env.as_mut() {
            env.retain(|e| e.value_from.is_some());
        }
    }
    crate::names::short_hash(&serde_json::to_string(&spec).unwrap_or_default())
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

/// What the pool's plan needs of one of its pods. Ready: its workload (parked in the launcher)
/// and its holder run.
pub fn view_of(pod: &Pod) -> PoolPod {
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
/// being deleted: an earlier attempt's pod may still be going).
pub fn claimed_for(pod: &Pod, run_uid: &str, attempt: u32) -> bool {
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ReadBack, ReadBackPath, SandboxRunPoolSpec, TemplateRef};

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
        assert!(claimed_for(&claimed, "run-uid", 1));
        assert!(!claimed_for(&claimed, "run-uid", 2));
        assert!(!claimed_for(&claimed, "other", 1));
        let labels = claimed.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(CLAIMED_ATTEMPT_LABEL.into(), "2".into());
        assert!(claimed_for(&claimed, "run-uid", 2));
        assert!(!claimed_for(&claimed, "run-uid", 1));
        claimed.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert!(!claimed_for(&claimed, "run-uid", 2), "going");
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
}
