//! A run's claim of a warm pool's pod (`run --warm-pools`, docs/user-guide.md "Sandboxes for
//! agents: warm pools"): between decide and plan, a run about to get a pod for an attempt (its
//! first, or a retry's) that is made from a pooled template, and sets nothing that would change
//! the pod, takes a ready pod of the pool instead of a new one.
//!
//! This stage reads (the pool and its pods through `observe::pool_of`, from the pools' watches
//! unless a pod may have been claimed for the run a moment ago: [`watched_pool_pods`]; the pod
//! the run would get cold through `prepare::for_creation`, the env's Secrets and ConfigMaps through
//! `env_sources::read`, the live run of a claim to resume) and chooses; the claim is a plan
//! (`plan::claim`) whose effects act carries out with typed answers, each answer's follow-up
//! planned, pure, with the reconcile's one `now`. In order, so that a restart anywhere resumes
//! it: (1) the pod is made the run's with one merge patch guarded by its resourceVersion (the
//! cold pod's labels and owner, the claim label: two runs racing for one pod, one wins, the
//! other picks again); (2) the launcher parked in the pod's workload container is handed the
//! run's command and env on its stdin, through `pods/attach` (the launcher takes the pod's one
//! start and reads one message) — an attempt that restores its paths is handed it later, by the
//! restore stage, once its restore answered; (3) the run's status records the pod
//! (`status.warmStart.pod`, from then on the run's pod for its attempt) and its start. A run
//! that finds a pod it claimed already resumes at (2), writing only to a launcher still waiting
//! (`launch-status`, `super::launcher`). No ready pod, or a run that sets a field that changes
//! the pod: the run starts cold, the pool counts the miss (`status.misses`) and
//! `status.warmStart.coldReason` says why.

use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::decide::Step;
use super::plan::claim::{self, Claim, Cold, CLAIM_REQUEUE};
use super::plan::{self, Effect, Inputs, Plan, Requeue, StepPlan};
use super::prepare::{MadeRun, QueueView};
use crate::api::{SandboxRun, SandboxRunPool, SandboxRunStatus};
use crate::controller::context::Context;
use crate::controller::error::ControllerError;
use crate::inpod::launch::StartMessage;
use crate::pool::pod as pool_pod;
use crate::pool::seal::Judge;

/// What the warm-pool stage leaves to do.
pub(super) enum Warm {
    /// Nothing: go on with the step.
    Go(Step),
    /// The claim (or the cold start) to carry out instead of the step.
    Claim(Box<Plan>),
    /// The claim is recorded already: look again then.
    Done(Requeue),
}

/// The warm-pool stage of the made run (its merged run's, but its own `templateRef`): what
/// the claim depends on read (the pool and its pods, the pod the run would get cold, the env's
/// Secrets and ConfigMaps, the live run of a claim to resume), then the claim chosen and planned
/// ([`plan::claim`]), for the pipeline to carry out in place of the step's plan (act, each
/// answer's follow-up planned by `plan::after`: [`super::drive`]). `now` is the reconcile's.
pub(super) async fn through_pool(
    ctx: &Arc<Context>,
    made: &MadeRun,
    (step, queue): (Step, Option<&QueueView>),
    inputs: &Inputs<'_>,
    rights_verified: bool,
    now: Timestamp,
) -> Result<Warm, ControllerError> {
    // A run in a Kueue queue gets here only once admitted (the queue stage holds it before):
    // its cold pod, with its flavor's placement, is compared with the pool's like any other.
    let run = made.merged();
    let candidate = ctx.lifecycle.warm_pools && asks_the_pool(run, &step, rights_verified);
    let authored = &made.authored().spec;
    let Some(reference) = authored.template_ref.as_ref().filter(|_| candidate) else {
        return Ok(Warm::Go(step));
    };
    if recorded_by_this_replica(ctx, run, now).await? {
        return Ok(Warm::Done(Requeue::After(CLAIM_REQUEUE)));
    }
    let ns = ns_of(run)?;
    let from = (&ctx.client, watched_pool_pods(ctx, run, now)?);
    let Some((pool, pods)) = super::observe::pool_of(from, &ns, reference).await? else {
        return Ok(Warm::Go(step));
    };
    let Some(cold) = cold_pod(ctx, run, inputs, queue).await? else {
        return Ok(Warm::Go(step));
    };
    let ids = (
        pool_pod::label_value(&pool.name_any()),
        pool.uid().ok_or(ControllerError::Metadata("uid"))?,
    );
    let judge = judge_of(ctx, &ids, now);
    let uid = run.uid().ok_or(ControllerError::Metadata("uid"))?;
    let attempt = crate::identity::current_attempt(run);
    let mine = pods
        .iter()
        .find(|p| pool_pod::claimed_for(p, judge.of(p), &uid, attempt));
    let plan = match mine {
        Some(pod) => match resume(ctx, run, (&pool, pod), &cold, now).await? {
            Some(plan) => plan,
            None => return Ok(Warm::Done(Requeue::After(CLAIM_REQUEUE))),
        },
        None => fresh(ctx, made, (&pool, &pods, judge), &cold, now).await?,
    };
    Ok(Warm::Claim(Box::new(plan)))
}

/// Whether the run asks its pool for a pod now: about to get one for an attempt (its first, or
/// a retry's: `spec.retryPolicy`, each attempt asks once) that has not asked yet, with its
/// author's rights verified.
fn asks_the_pool(run: &SandboxRun, step: &Step, rights_verified: bool) -> bool {
    let attempt = crate::identity::current_attempt(run);
    let decided = run
        .status
        .as_ref()
        .and_then(|s| s.warm_start.as_ref())
        .is_some_and(|w| w.attempt() == attempt);
    matches!(step, Step::CreatePod) && !decided && rights_verified
}

/// A claim this run made in an earlier reconcile (`pod`, of `pool`), planned to its end; None:
/// recorded already. Most often the watch cache's copy of the run lags behind the claim this
/// replica recorded: the live run says whether it still needs finishing. Its env is read again;
/// a Secret or key gone since is the start refused (the pod is the run's: the attempt fails, its
/// retry policy decides).
async fn resume(
    ctx: &Context,
    run: &SandboxRun,
    (pool, pod): (&SandboxRunPool, &Pod),
    cold: &Pod,
    now: Timestamp,
) -> Result<Option<Plan>, ControllerError> {
    if live_run_records_its_start(ctx, run).await? {
        return Ok(None);
    }
    let message = match message_for(ctx, run, cold).await? {
        Ok(message) => message,
        Err(Cold::Env(why)) => StartMessage::refusal(&uid_of(run)?, &why.to_string()),
        Err(why) => return Ok(Some(claim::cold(&pool.name_any(), &why))),
    };
    let claim = claim_of(run, pool, pod, message);
    Ok(Some(claim::resume(run, claim, now)))
}

/// Whether this replica claimed a pod for the run a moment ago and the live run records it
/// already: the reconcile woken by the claimed pod's own update, before the recorded status
/// reached the watch cache, then waits as [`resume`] would, without listing the pool and its
/// pods (under a burst that list was the claim's longest read, docs/performance.md "Where the
/// operator's CPU goes, and a burst's workers"). Asked only while the replica holds a
/// reservation for the run ([`crate::pool::reservations`]); without one (a fresh run, a
/// restarted replica), or when the live run (of the same uid) records nothing for the attempt,
/// the claim stage goes on as before and finds a claimed pod by its label.
async fn recorded_by_this_replica(
    ctx: &Context,
    run: &SandboxRun,
    now: Timestamp,
) -> Result<bool, ControllerError> {
    if !ctx.memory.claims.holds_any(&uid_of(run)?, now) {
        return Ok(false);
    }
    live_run_records_its_start(ctx, run).await
}

/// Where the claim reads its pool and its pods: the pools' watches' ([`crate::pool::watched`];
/// the claim's patch is guarded by the pod's resourceVersion, so a stale copy only loses the
/// race and picks again), unless this replica holds a reservation for the run: then it may
/// have claimed a pod for it a moment ago (its record not read yet, [`recorded_by_this_replica`]),
/// which only the live list surely shows; from the watch's copy the run would take a second pod.
fn watched_pool_pods<'c>(
    ctx: &'c Context,
    run: &SandboxRun,
    now: Timestamp,
) -> Result<Option<&'c crate::pool::watched::WatchedPools>, ControllerError> {
    let holds = ctx.memory.claims.holds_any(&uid_of(run)?, now);
    Ok((!holds).then_some(&ctx.memory.watched_pools))
}

/// Whether the run as the apiserver has it now (the same uid: not another run made since under
/// its name) records its claim or cold start for its current attempt.
async fn live_run_records_its_start(
    ctx: &Context,
    run: &SandboxRun,
) -> Result<bool, ControllerError> {
    let uid = uid_of(run)?;
    let live = super::observe::live_run(&ctx.client, &ns_of(run)?, &run.name_any()).await?;
    let attempt = crate::identity::current_attempt(run);
    Ok(live
        .filter(|r| r.uid().as_deref() == Some(uid.as_str()))
        .is_some_and(|r| recorded(r.status, attempt)))
}

/// Whether `status` records the run's claim (or cold start) for `attempt`.
fn recorded(status: Option<SandboxRunStatus>, attempt: u32) -> bool {
    status
        .and_then(|s| s.warm_start)
        .is_some_and(|w| w.attempt() == attempt)
}

/// The claim of a ready pod of `pool` ([`choose`]) with the run's start (its env read now,
/// [`message_for`]), its egress restricted first ([`restrict_egress`]); or the run's cold start.
/// The pod picked is reserved from then on, so the burst's other runs of this replica pick past
/// it; taken or not, the claim's precondition decides (the reservation only spreads the picks,
/// and act gives it back when the claim is not made).
async fn fresh(
    ctx: &Context,
    made: &MadeRun,
    (pool, pods, judge): (&SandboxRunPool, &[Pod], Judge<'_>),
    cold: &Pod,
    now: Timestamp,
) -> Result<Plan, ControllerError> {
    let run = made.merged().as_ref();
    let (ns, uid) = (ns_of(run)?, uid_of(run)?);
    let pod = match choose(ctx, (made, cold), (pool, pods, judge), (&ns, &uid)) {
        Ok(pod) => pod,
        Err(why) => return Ok(claim::cold(&pool.name_any(), &why)),
    };
    // The env read before the claim (issue #54): a run whose values cannot be delivered starts
    // cold, the pod left to the others.
    let message = match message_for(ctx, run, cold).await? {
        Ok(message) => message,
        Err(why) => return Ok(claim::cold(&pool.name_any(), &why)),
    };
    ctx.memory
        .claims
        .reserve(&format!("{ns}/{}", pod.name_any()), &uid, now);
    let attempt = crate::identity::current_attempt(run);
    let rv = pod
        .resource_version()
        .ok_or(ControllerError::Metadata("resourceVersion"))?;
    let patch = pool_pod::claim_patch(cold, (&uid, attempt), &rv);
    let before = restrict_egress(ctx, made, pod);
    Ok(claim::take(
        claim_of(run, pool, pod, message),
        patch,
        before,
    ))
}

/// The claim of `pod` (of `pool`) for the run, its start `message`.
fn claim_of(run: &SandboxRun, pool: &SandboxRunPool, pod: &Pod, message: StartMessage) -> Claim {
    Claim {
        pool: pool.name_any(),
        pod: pod.name_any(),
        message,
        hand_over: starts_at_claim(run),
    }
}

/// The run's namespace.
fn ns_of(run: &SandboxRun) -> Result<String, ControllerError> {
    run.namespace()
        .ok_or(ControllerError::Metadata("namespace"))
}

/// The run's uid.
fn uid_of(run: &SandboxRun) -> Result<String, ControllerError> {
    run.uid().ok_or(ControllerError::Metadata("uid"))
}

/// The launcher's start for the run: its cold pod's command and env, each value of a Secret's or
/// ConfigMap's key read now in the run's own namespace (`crate::pool::env`, issue #54); or why
/// the run starts cold (no command; a value that cannot be delivered, named without its value).
pub(super) async fn message_for(
    ctx: &Context,
    run: &SandboxRun,
    cold: &Pod,
) -> Result<Result<StartMessage, Cold>, ControllerError> {
    let ns = ns_of(run)?;
    let sources = crate::pool::env::sources(cold);
    let read = super::env_sources::read(ctx, &ns, &sources).await?;
    let Some(base) = pool_pod::start_message(cold, &uid_of(run)?) else {
        return Ok(Err(Cold::NoCommand));
    };
    Ok(crate::pool::env::with_env(base, cold, &read).map_err(Cold::Env))
}

/// Before a run whose egress is restricted takes `pod`: its status records its template first
/// (the egress proxy knows a run made from a template by that record, and waits a moment for a
/// verified token's run it does not know yet: `crate::egress::runs::LEARN_WAIT`); then its own
/// NetworkPolicy is applied, with the pod's node denied when the gate probes
/// the node, as its cold pod's would be (the pool pod's policy, the same rules, keeps selecting
/// the pod: policies add up, so the run's must not allow what the pool pod's denies). A run the
/// operator would refuse for its egress never gets here: its pod's shape is not the pool's.
/// Planned: the status to write first (None: recorded already) and the effects before the
/// claim.
fn restrict_egress(
    ctx: &Context,
    made: &MadeRun,
    pod: &Pod,
) -> (Option<SandboxRunStatus>, Vec<Effect>) {
    let run = made.merged().as_ref();
    use crate::egress::verdict::{verdict, EgressVerdict};
    let EgressVerdict::Apply {
        policy,
        note,
        unenforced,
    } = verdict(run, &ctx.pod.egress)
    else {
        return (None, Vec::new());
    };
    let stored = made.authored().status.as_ref();
    let recorded = stored.is_some_and(|s| s.template.is_some());
    let status = run.status.clone().filter(|_| !recorded);
    let node = pod
        .status
        .as_ref()
        .and_then(|s| s.host_ip.as_deref())
        .and_then(|ip| ip.parse().ok());
    let proxy = ctx.egress_proxy.addresses();
    let on_node = crate::egress::policy::policy_while_gated(run, &ctx.pod.egress, node, &proxy)
        .ok()
        .flatten();
    let policy = on_node.map(Box::new).unwrap_or(policy);
    // The pool pod's own policy keeps selecting the pod after the claim, and policies add up:
    // it is made the run's own rules, computed now, first (issue #51; the same rules when the
    // pod is of the run's template version, narrower never wider).
    let own_rules = crate::pool::egress::pool_pod_policy(run, &ctx.pod.egress, pod, (node, &proxy));
    let mut effects: Vec<_> = own_rules
        .map(|p| Effect::ApplyNetworkPolicy(Box::new(p)))
        .into_iter()
        .collect();
    effects.extend(plan::egress_effects(policy, note, unenforced));
    (status, effects)
}

/// The pool pod the run takes, or why it starts cold: its own spec sets only what the launcher
/// delivers; the pod it would get (`cold`), parked, has the pool pods' shape (the pool's hash:
/// its namespace's default runtime class, say, would change it); a ready pod is there.
fn choose<'a>(
    ctx: &Context,
    (made, cold): (&MadeRun, &Pod),
    (pool, pods, judge): (&SandboxRunPool, &'a [Pod], Judge<'_>),
    (ns, uid): (&str, &str),
) -> Result<&'a Pod, Cold> {
    let run = made.merged().as_ref();
    crate::pool::compat::compatible(&made.authored().spec)?;
    // The run's shape computed now, its egress included: a pool pod of an older, wider version
    // of the template is never this run's (issue #51).
    let egress = crate::egress::policy::egress_shape(run, &ctx.pod.egress);
    let hash = as_pooled(cold, &ctx.pod)
        .map(|parked| pool_pod::template_hash(&parked, &egress))
        .unwrap_or_default();
    let current = pool
        .status
        .as_ref()
        .and_then(|s| s.template_hash.as_deref());
    if current != Some(hash.as_str()) {
        return Err(Cold::OtherShape);
    }
    // Only the pods the pool sealed: a look-alike with its labels is never handed a run.
    let views: Vec<_> = pods
        .iter()
        .map(|p| pool_pod::view_of(p, judge.of(p)))
        .collect();
    // Pods another run of this replica is claiming right now are picked past (a burst spreads).
    let in_ns = format!("{ns}/");
    let reserved: std::collections::HashSet<String> = (ctx.memory.claims)
        .held_by_others(uid, judge.now)
        .into_iter()
        .filter_map(|key| key.strip_prefix(&in_ns).map(str::to_string))
        .collect();
    let pick =
        crate::pool::plan::pick_for_claim(&hash, &views, uid, &reserved).ok_or(Cold::NoReadyPod)?;
    pods.iter()
        .find(|p| p.name_any() == pick.name)
        .ok_or(Cold::NoReadyPod)
}

/// The run's cold pod as a pool pod of its template would be: parked in the launcher. A pod
/// parked for a restore already is, with the same writable holder mounts as every parked pod
/// (issue #54: a run that restores takes a pool pod).
fn as_pooled(cold: &Pod, settings: &crate::pod::PodSettings) -> Option<Pod> {
    match crate::pool::park::is_parked(cold) {
        true => Some(cold.clone()),
        false => crate::pool::park::park_in_launcher(cold.clone(), settings),
    }
}

/// Whether the claim hands the launcher its start: not when the attempt restores its paths,
/// whose start waits for the restore's answer (the restore stage, `plan::restore_step`,
/// docs/contract.md "Pause, resume and fork").
fn starts_at_claim(run: &SandboxRun) -> bool {
    plan::restore_source(run).is_none()
}

/// How the pool `pool` tells its pods ([`crate::pool::seal`]).
fn judge_of<'a>(
    ctx: &'a Context,
    (label, pool_uid): &'a (String, String),
    now: Timestamp,
) -> Judge<'a> {
    Judge {
        key: ctx.admission.rights.key.as_ref(),
        pool: label,
        pool_uid,
        now,
    }
}

/// The pod the run would get cold, as the cold path makes it (its rules passed, its namespace's
/// default runtime class, its Kueue flavor's node labels and tolerations: the same facts, read
/// by [`super::prepare::for_creation`] without the image pre-flight, and the same shaping,
/// [`plan::shaped_pod`]); None when the cold path would not create one now (a refusal, a store
/// it cannot use: the cold path says so).
async fn cold_pod(
    ctx: &Context,
    run: &SandboxRun,
    inputs: &Inputs<'_>,
    queue: Option<&QueueView>,
) -> Result<Option<Pod>, ControllerError> {
    let StepPlan::CreatePod(cold) = plan::plan_step(Step::CreatePod, inputs) else {
        return Ok(None);
    };
    let facts = super::prepare::for_creation(ctx, run, &cold, queue, false).await?;
    if facts.store_unusable.is_some() {
        return Ok(None);
    }
    let policies = &ctx.pod.namespace_policies;
    if plan::refused_by_namespace_policies(run, &facts, policies).is_some() {
        return Ok(None);
    }
    Ok(Some(plan::shaped_pod(run, *cold, &facts, policies)))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use object_store::memory::InMemory;

    use super::*;
    use crate::api::{AppliedTemplate, NetworkMode, NetworkPolicy, SandboxRunSpec};
    use crate::controller::testkit::mock_apiserver::{self, Route};

    const POLICIES: &str = "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/";

    /// A run of a filtered template whose status records the template already.
    fn run() -> SandboxRun {
        let mut run = SandboxRun::new(
            "job",
            SandboxRunSpec {
                network: Some(NetworkPolicy {
                    mode: NetworkMode::Allowlist,
                    rules: vec!["192.0.2.0/24".into()],
                }),
                ..SandboxRunSpec::default()
            },
        );
        run.metadata.namespace = Some("ns".into());
        run.metadata.uid = Some("run-uid".into());
        run.status = Some(crate::api::SandboxRunStatus {
            template: Some(AppliedTemplate::default()),
            ..Default::default()
        });
        run
    }

    /// A run of the template spec `made` at attempt `attempt` (its earlier ones ended), which
    /// restores its workspace.
    fn restoring(made: &SandboxRunSpec, attempt: u32) -> SandboxRun {
        let mut spec = made.clone();
        spec.workspace = Some(crate::api::Workspace {
            restore: crate::api::WorkspaceRestore::Latest,
            ..Default::default()
        });
        let mut run = SandboxRun::new("job", spec);
        run.metadata.namespace = Some("team".into());
        run.metadata.uid = Some("run-uid".into());
        run.status = Some(crate::api::SandboxRunStatus {
            attempts: (1..attempt)
                .map(|index| crate::api::AttemptStatus {
                    index,
                    ..Default::default()
                })
                .collect(),
            attempt: Some(attempt),
            ..Default::default()
        });
        run
    }

    /// Issue #54: an attempt that restores its paths is handed its start only after its restore
    /// answered (the restore stage), never by the claim; a first attempt (nothing to restore) and
    /// a run that does not restore are handed it at the claim.
    #[test]
    fn a_restoring_attempt_is_handed_its_start_after_its_restore_never_by_the_claim() {
        let made = SandboxRunSpec {
            command: Some(vec!["sh".into()]),
            ..Default::default()
        };
        assert!(
            starts_at_claim(&restoring(&made, 1)),
            "nothing to restore yet"
        );
        assert!(
            !starts_at_claim(&restoring(&made, 2)),
            "attempt 1's files first"
        );
        let mut never = restoring(&made, 2);
        never.spec.workspace = None;
        assert!(starts_at_claim(&never));
    }

    /// Issue #54: the pod a restoring attempt would get cold (parked, its holder's read-back
    /// mounts writable) has a pool pod's shape, and so has a first attempt's: both take a pool
    /// pod of the template (fails on the old code: a pool pod's holder mounted them read-only,
    /// and the restore pod was parked twice, so its hash never matched).
    #[test]
    fn a_restoring_runs_pod_has_the_pool_pods_shape() {
        use crate::api::{ReadBack, ReadBackPath, SandboxRunPoolSpec, TemplateRef};
        let settings = crate::pod::PodSettings::default();
        let made = SandboxRunSpec {
            image: Some("busybox@sha256:abc".into()),
            command: Some(vec!["sh".into(), "-c".into(), "true".into()]),
            user: Some("1000".into()),
            read_back: Some(ReadBack {
                paths: vec![ReadBackPath {
                    path: "/work/out".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut pool = SandboxRunPool::new(
            "agents",
            SandboxRunPoolSpec {
                template_ref: TemplateRef::namespaced("agent"),
                replicas: 1,
            },
        );
        pool.metadata.namespace = Some("team".into());
        pool.metadata.uid = Some("pool-uid".into());
        let stand_in = pool_pod::stand_in(&pool, made.clone());
        let (pooled, hash) = pool_pod::pool_pod(&pool, &stand_in, &settings, "x").unwrap();
        for attempt in [1, 2] {
            let run = restoring(&made, attempt);
            let built = crate::pod::build_pod(&run, &settings).unwrap();
            let cold = plan::parked_if_due(&run, built, &settings);
            let shaped = as_pooled(&cold, &settings).unwrap();
            assert_eq!(
                pool_pod::template_hash(&shaped, &serde_json::Value::Null),
                pool_pod::template_hash(&pooled, &serde_json::Value::Null),
                "attempt {attempt}"
            );
        }
        assert!(!hash.is_empty());
    }

    /// The cold pod of a run whose env takes `TOKEN` from the Secret `creds`.
    fn cold_with_secret_env() -> Pod {
        use k8s_openapi::api::core::v1::{Container, EnvVar, EnvVarSource, PodSpec};
        let from = EnvVarSource {
            secret_key_ref: Some(k8s_openapi::api::core::v1::SecretKeySelector {
                name: "creds".into(),
                key: "token".into(),
                optional: None,
            }),
            ..Default::default()
        };
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: crate::pod::WORKLOAD_CONTAINER.into(),
                    command: Some(vec!["sh".into(), "-c".into(), "true".into()]),
                    env: Some(vec![EnvVar {
                        name: "TOKEN".into(),
                        value: None,
                        value_from: Some(from),
                    }]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const CREDS: &str = "/api/v1/namespaces/ns/secrets/creds";

    /// Issue #54: a claim reads the Secret its env names, in the run's own namespace, and the
    /// launcher's start carries the value (on the old code the run went cold).
    #[tokio::test]
    async fn a_claims_start_carries_the_value_read_from_the_runs_namespaces_secret() {
        use base64::Engine;
        let token = base64::engine::general_purpose::STANDARD.encode("s3cr3t");
        let secret = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "ns"},
            "data": {"token": token},
        });
        let (client, log) =
            mock_apiserver::apiserver(vec![Route::fixed("GET", CREDS, 200, secret)]);
        let ctx = mock_apiserver::context(client, Arc::new(InMemory::new()));
        let message = message_for(&ctx, &run(), &cold_with_secret_env())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(message.env, [("TOKEN".to_string(), "s3cr3t".to_string())]);
        assert_eq!(message.run, "run-uid");
        assert_eq!(log.lines(), [format!("GET {CREDS}")]);
    }

    /// Issue #54: a Secret the run's env needs that does not exist means a cold start (its cold
    /// pod gets the kubelet's `CreateContainerConfigError`), named without any value.
    #[tokio::test]
    async fn a_missing_secret_means_a_cold_start_that_names_it() {
        let (client, log) = mock_apiserver::apiserver(vec![]);
        let ctx = mock_apiserver::context(client, Arc::new(InMemory::new()));
        let why = message_for(&ctx, &run(), &cold_with_secret_env())
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(&why, Cold::Env(crate::pool::env::Unresolved::Missing { name, .. }) if name == "creds"),
            "{why}"
        );
        assert!(why.to_string().contains("TOKEN"), "{why}");
        assert_eq!(log.lines(), [format!("GET {CREDS}")]);
    }

    /// Issue #51: a pool pod's own policy keeps selecting it after the claim and policies add up,
    /// so before the claim it is made the run's rules, computed now (whatever the pool applied
    /// when it made the pod), and before the run's own.
    #[tokio::test]
    async fn a_claim_makes_the_pool_pods_policy_the_runs_own_rules_first() {
        let (client, log) = mock_apiserver::apiserver(vec![
            Route::echo("PATCH", POLICIES, 200),
            Route::echo("POST", "/apis/events.k8s.io/", 201),
        ]);
        let ctx = Arc::new(mock_apiserver::context(client, Arc::new(InMemory::new())));
        let run = Arc::new(run());
        let mut pod = Pod::default();
        pod.metadata.name = Some("agents-h-x1".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some("pod-uid".into());
        let made = MadeRun::new(run.clone(), run.clone());
        let (status, effects) = restrict_egress(&ctx, &made, &pod);
        let plan = Plan {
            status,
            effects,
            ..Plan::wait(Requeue::After(CLAIM_REQUEUE))
        };
        let pod_name = crate::identity::current_pod_name(&run);
        super::super::drive::carry_out(&ctx, &run, &pod_name, None, plan, Timestamp::now())
            .await
            .unwrap();
        let applied = log.matching("PATCH", POLICIES);
        let names: Vec<&str> = applied
            .iter()
            .map(|s| s.path().trim_start_matches(POLICIES))
            .collect();
        let own = crate::egress::policy::policy_name("job");
        assert_eq!(names, ["agents-h-x1-egress", own.as_str()], "{names:?}");
        let pool_pods = &applied[0].body;
        assert_eq!(
            pool_pods["spec"]["podSelector"]["matchLabels"][pool_pod::POOL_POD_LABEL],
            "agents-h-x1"
        );
        // The run's rules, exactly: the same egress as the run's own policy.
        assert_eq!(
            pool_pods["spec"]["egress"],
            applied[1].body["spec"]["egress"]
        );
        assert!(pool_pods["spec"]["egress"]
            .to_string()
            .contains("192.0.2.0/24"));
    }

    const RUN: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxruns/job";

    /// The run `job` as the apiserver has it: `uid`, and its claim of a pool pod recorded for
    /// `recorded` (an attempt), if any.
    fn live(uid: &str, recorded: Option<u32>) -> serde_json::Value {
        let mut live = run();
        live.metadata.uid = Some(uid.into());
        if let Some(attempt) = recorded {
            let status = live.status.get_or_insert_with(Default::default);
            status.warm_start = Some(crate::api::WarmStart {
                pool: "agents".into(),
                pod: Some("agents-h-x1".into()),
                cold_reason: None,
                attempt: Some(attempt),
            });
        }
        serde_json::to_value(live).unwrap()
    }

    /// Issue #55 item 1: the reconcile woken by a claimed pod's own update, before the recorded
    /// status reached the cache, reads the live run once and waits; it lists neither the pools
    /// nor their pods (on the old code it listed both, then read the live run: under a burst of
    /// 20 the pod list was a claim's longest read).
    #[tokio::test]
    async fn a_claim_this_replica_just_recorded_is_seen_from_the_live_run_without_the_pool() {
        let (client, log) = mock_apiserver::apiserver(vec![Route::fixed(
            "GET",
            RUN,
            200,
            live("run-uid", Some(1)),
        )]);
        let ctx = mock_apiserver::context(client, Arc::new(InMemory::new()));
        let now = Timestamp::now();
        assert!(ctx.memory.claims.reserve("ns/agents-h-x1", "run-uid", now));
        assert!(recorded_by_this_replica(&ctx, &run(), now).await.unwrap());
        assert_eq!(log.lines(), [format!("GET {RUN}")]);
    }

    /// Without a reservation (a fresh run, a restarted replica) nothing is read here: the claim
    /// stage lists the pool as before and finds a claimed pod by its label. With one, a live run
    /// that records nothing for the attempt, or is another run of the same name, is not taken
    /// as recorded.
    #[tokio::test]
    async fn only_a_reservation_and_the_same_runs_record_for_this_attempt_skip_the_pool() {
        let (client, log) = mock_apiserver::apiserver(vec![]);
        let ctx = mock_apiserver::context(client, Arc::new(InMemory::new()));
        let now = Timestamp::now();
        assert!(!recorded_by_this_replica(&ctx, &run(), now).await.unwrap());
        assert!(log.lines().is_empty(), "{:?}", log.lines());
        for answer in [
            live("run-uid", None),
            live("run-uid", Some(2)),
            live("other-uid", Some(1)),
        ] {
            let (client, log) =
                mock_apiserver::apiserver(vec![Route::fixed("GET", RUN, 200, answer)]);
            let ctx = mock_apiserver::context(client, Arc::new(InMemory::new()));
            assert!(ctx.memory.claims.reserve("ns/agents-h-x1", "run-uid", now));
            assert!(!recorded_by_this_replica(&ctx, &run(), now).await.unwrap());
            assert_eq!(log.lines(), [format!("GET {RUN}")]);
        }
    }

    /// Issue #55 item 1: a claim reads its pool and the pool's pods from the pools' watches,
    /// once they have listed them, and sends no request; while this replica holds a
    /// reservation for the run (it may have claimed a pod for it a moment ago) it lists both
    /// live. On the old code every claim listed both live (under a burst of 20 the pod list
    /// was a claim's longest read).
    #[tokio::test]
    async fn a_claim_reads_its_pool_from_the_watches_unless_it_may_have_claimed_a_pod() {
        const POOLS: &str = "/apis/sandbox.iterion.io/v1alpha1/namespaces/ns/sandboxrunpools";
        const PODS: &str = "/api/v1/namespaces/ns/pods";
        let pools_list = serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {},
            "items": [{"apiVersion": "sandbox.iterion.io/v1alpha1", "kind": "SandboxRunPool",
                "metadata": {"name": "agents", "namespace": "ns", "uid": "pool-uid"},
                "spec": {"templateRef": {"name": "agent-tools"}, "replicas": 1}}]});
        let mut pooled = Pod::default();
        pooled.metadata.name = Some("agents-h-x1".into());
        pooled.metadata.namespace = Some("ns".into());
        pooled.metadata.labels = Some(
            [(
                pool_pod::POOL_LABEL.to_string(),
                pool_pod::label_value("agents"),
            )]
            .into(),
        );
        let mut elsewhere = pooled.clone();
        elsewhere.metadata.namespace = Some("other".into());
        let listed = serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {},
            "items": [serde_json::to_value(&pooled).unwrap()]});
        let reference = crate::api::TemplateRef {
            name: "agent-tools".into(),
            ..Default::default()
        };
        for reserved in [false, true] {
            let (client, log) = mock_apiserver::apiserver(vec![
                Route::fixed("GET", POOLS, 200, pools_list.clone()),
                Route::fixed("GET", PODS, 200, listed.clone()),
            ]);
            let ctx = mock_apiserver::context(client, Arc::new(InMemory::new()));
            let (reader, mut writer) = kube::runtime::reflector::store::<Pod>();
            for event in [
                kube::runtime::watcher::Event::Init,
                kube::runtime::watcher::Event::InitApply(pooled.clone()),
                kube::runtime::watcher::Event::InitApply(elsewhere.clone()),
                kube::runtime::watcher::Event::InitDone,
            ] {
                writer.apply_watcher_event(&event);
            }
            let (pools, mut pools_writer) = kube::runtime::reflector::store();
            for event in [
                kube::runtime::watcher::Event::Init,
                kube::runtime::watcher::Event::InitApply(
                    serde_json::from_value(pools_list["items"][0].clone()).unwrap(),
                ),
                kube::runtime::watcher::Event::InitDone,
            ] {
                pools_writer.apply_watcher_event(&event);
            }
            ctx.memory.watched_pools.add(pools, reader);
            let now = Timestamp::now();
            if reserved {
                assert!(ctx.memory.claims.reserve("ns/agents-h-x2", "run-uid", now));
            }
            let from = (&ctx.client, watched_pool_pods(&ctx, &run(), now).unwrap());
            let (pool, pods) = super::super::observe::pool_of(from, "ns", &reference)
                .await
                .unwrap()
                .expect("the pool is found");
            assert_eq!(pool.name_any(), "agents");
            let names: Vec<_> = pods.iter().map(|p| p.name_any()).collect();
            assert_eq!(names, ["agents-h-x1"], "its namespace's only");
            let live = if reserved {
                vec![format!("GET {POOLS}"), format!("GET {PODS}")]
            } else {
                Vec::new()
            };
            assert_eq!(log.lines(), live);
        }
    }
}
