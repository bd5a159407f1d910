//! The pools' controller's plan (pure: no client, no clock — `now` is an argument): from what a
//! look at a pool observed ([`PoolObserved`]) to the effects its act stage
//! ([`super::act`]) carries out, in order, and from act's typed answers to what follows
//! (docs/architecture.md "The controllers beside the pipeline"). A pool keeps its replicas of
//! unclaimed, sealed pods of its template (docs/contract.md "Warm pools").

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use serde_json::Value;

use crate::api::{SandboxRun, SandboxRunPool, SandboxRunPoolStatus, SandboxRunSpec};
use crate::controller::error::ControllerError;
use crate::pod::PodSettings;
use crate::policy::namespace_policy::Compiled as NamespacePolicy;
use crate::policy::stamp::{RightsPolicy, StampKey};
use crate::policy::RuleSettings;
use crate::pool::plan::PoolPod;
use crate::pool::pod::{self as pool_pod, POOL_LABEL};
use crate::template::TemplateUnusable;

/// Why a pool makes no pods when the operator has no key to seal them with.
const NO_KEY: &str = "the operator could not read its admission key, which seals a pool's pods \
                      (a pod it cannot seal could not be told from a look-alike): no pool pods";

/// Why a pool makes no pods of its template (its status' message, a `NotPooled` Event).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotPooled {
    /// The template cannot make a run.
    #[error(transparent)]
    Template(#[from] TemplateUnusable),
    /// The operator's rules, or the rights its runs would need, refuse it ([`crate::pool::judge`]).
    #[error("{0}")]
    Refused(String),
    /// The operator has no key to seal its pods with ([`crate::pool::seal`]): a pod it made
    /// could not be told from a look-alike.
    #[error("{NO_KEY}")]
    NoKey,
}

/// What the pools' plan is given besides what the look observed: the operator's settings.
pub(crate) struct PoolSettings<'a> {
    /// The key pool pods are sealed with ([`crate::pool::seal`]); none: no pool pods.
    pub key: Option<&'a StampKey>,
    pub pod: &'a PodSettings,
    /// The egress proxy's pods' addresses, as the watch saw them when the look began.
    pub proxy: &'a [IpAddr],
}

/// What one look at a pool observed (the reads of `pools::observe`).
pub(crate) struct PoolObserved {
    /// The pods carrying the pool's label, as listed.
    pub pods: Vec<Pod>,
    /// The spec its template makes, judged ([`judged`], [`namespace_judged`]), or why none.
    pub made: Result<SandboxRunSpec, NotPooled>,
    /// The template's `metadata.generation`, as read (none: it was not read).
    pub template_generation: Option<i64>,
}

/// The spec a run made from the pool's template gets (the template `fetched` by observe merged
/// into an empty run), judged by the operator's rules and the author's rights: or why the pool
/// makes no pods. The namespace's policies come after ([`namespace_judged`]), once observe has
/// read the labels they need.
pub(crate) fn judged(
    pool: &SandboxRunPool,
    ns: &str,
    fetched: Result<Option<crate::template::Fetched>, TemplateUnusable>,
    (rules, rights): (&RuleSettings, &RightsPolicy),
) -> Result<SandboxRunSpec, NotPooled> {
    let reference = &pool.spec.template_ref;
    let fetched = fetched?.ok_or_else(|| TemplateUnusable::Missing {
        what: reference.describe(ns),
    })?;
    let empty = SandboxRunSpec {
        template_ref: Some(reference.clone()),
        ..Default::default()
    };
    let made = crate::template::merge(&fetched.spec, &reference.label(), &empty)
        .map_err(TemplateUnusable::from)?;
    match crate::pool::judge::refusal(&made, rules, rights) {
        Some(why) => Err(NotPooled::Refused(why)),
        None => Ok(made),
    }
}

/// `made` judged by the namespace's policies (docs/contract.md "The platform's namespace
/// policies", the namespace's `labels`), then by the key the pool's pods need.
pub(crate) fn namespace_judged(
    made: SandboxRunSpec,
    labels: &BTreeMap<String, String>,
    policies: &[NamespacePolicy],
    key: Option<&StampKey>,
) -> Result<SandboxRunSpec, NotPooled> {
    match crate::pool::judge::namespace_refusal(&made, labels, policies) {
        Some(why) => Err(NotPooled::Refused(why)),
        None if key.is_none() => Err(NotPooled::NoKey),
        None => Ok(made),
    }
}

/// Why a pool's status carries a message: the reason of the Warning Event that says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Warning {
    /// The pool makes no pods of its template ([`NotPooled`], or its pod cannot be built).
    NotPooled,
    /// The namespace refused a pool pod (its quota, Pod Security, another admission).
    PodRefused,
}

impl Warning {
    /// The Event's reason.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Warning::NotPooled => "NotPooled",
            Warning::PodRefused => "PodRefused",
        }
    }
}

/// An Event about the pool.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PoolEvent {
    pub warning: bool,
    pub reason: &'static str,
    /// Cut to [`crate::controller::events::EVENT_NOTE_LIMIT`].
    pub note: String,
}

/// One write of a look at a pool, carried out by [`super::act::carry_out`].
#[derive(Debug, Clone)]
pub(crate) enum PoolEffect {
    /// Delete an unclaimed pool pod as it was read: preconditioned on its uid and
    /// resourceVersion, so a pod a run claimed meanwhile is never deleted (404 and 409 are done).
    DeletePod {
        name: String,
        uid: Option<String>,
        resource_version: Option<String>,
    },
    /// End an unclaimed pool pod someone else is deleting ([`shortened_deletion`]): deleted again
    /// with [`UNCLAIMED_GRACE_SECONDS`] under the same precondition as [`PoolEffect::DeletePod`]
    /// (a later delete may shorten a grace period), and, when that took effect, its holder told
    /// the drain is done (`holder mark-drained`), since a kubelet already waiting in the
    /// holder's preStop does not cut that wait short.
    EndUnclaimed {
        name: String,
        uid: Option<String>,
        resource_version: Option<String>,
    },
    /// Apply a NetworkPolicy (server-side apply): a waiting gate's, with its node denied.
    ApplyPolicy(Box<NetworkPolicy>),
    /// Create a pool pod: answered [`PoolAnswer::Created`], `Exists` (409) or `Refused` (403, 422).
    CreatePod(Box<Pod>),
    /// Seal the pod just created (a merge patch); one that cannot be sealed is deleted, and the
    /// look fails.
    SealPod { name: String, patch: Value },
    /// Apply the policy of the pod just created; one whose policy cannot be applied is deleted
    /// (its gate would only time out), and the look fails.
    ApplyPodPolicy {
        pod: String,
        policy: Box<NetworkPolicy>,
    },
    /// Publish an Event about the pool (best effort).
    Publish(PoolEvent),
    /// Write the pool's status (server-side apply).
    WriteStatus(Box<SandboxRunPoolStatus>),
}

/// Act's answer to one [`PoolEffect`].
#[derive(Debug, Clone)]
pub(crate) enum PoolAnswer {
    Done,
    /// The pod as the apiserver returned it (its uid known).
    Created(Box<Pod>),
    /// A pod of that name exists already.
    Exists,
    /// The namespace refused it, in the apiserver's words.
    Refused(String),
}

/// A look at a pool, planned.
pub(crate) enum Look {
    /// The pool makes no pods: its status (and a Warning when its message changed).
    Unusable(Vec<PoolEffect>),
    /// The pool serves.
    Serve(Box<Serving>),
}

/// A pool that serves: what its look does before it creates, the pods it creates, and what it
/// reports after.
pub(crate) struct Serving {
    /// Outdated, surplus and orphaned pods deleted, then each waiting gate's policy applied.
    pub before: Vec<PoolEffect>,
    /// The pods to create, in order (stopping at the first the namespace refuses).
    pub creates: Vec<Pod>,
    /// The run the template makes (what a pod's policy is built from).
    pub stand_in: SandboxRun,
    /// The template version of its pods.
    pub hash: String,
    /// The status, but for the message a refused creation adds.
    pub status: SandboxRunPoolStatus,
}

/// Plans a look at `pool` from what was `observed`, at `now` (the one clock reading of the look:
/// the seals' grace and the new pods' names).
pub(crate) fn look(
    pool: &SandboxRunPool,
    observed: PoolObserved,
    settings: &PoolSettings<'_>,
    now: jiff::Timestamp,
) -> Look {
    let views = views(pool, &observed.pods, settings.key, now);
    let claimed = views.iter().filter(|p| p.claimed && p.sealed).count();
    let made = match observed.made {
        Ok(made) => pool_pod::stand_in(pool, made),
        Err(why) => {
            return unusable(
                pool,
                (claimed, observed.template_generation),
                why.to_string(),
            )
        }
    };
    let name = pool.name_any();
    let stamp = now.as_nanosecond();
    let suffix =
        |i: usize| crate::names::short_hash(&format!("{name}/{stamp}/{i}"))[..5].to_string();
    let hash = match pool_pod::pool_pod(pool, &made, settings.pod, &suffix(0)) {
        Ok((_, hash)) => hash,
        Err(e) => return unusable(pool, (claimed, observed.template_generation), e.to_string()),
    };
    let replicas = usize::try_from(pool.spec.replicas).unwrap_or(0);
    let plan = crate::pool::plan::plan(replicas, &hash, &views);
    let deletes = plan.delete.iter().filter_map(|gone| {
        let pod = observed.pods.iter().find(|p| p.name_any() == *gone)?;
        Some(PoolEffect::DeletePod {
            name: pod.name_any(),
            uid: pod.uid(),
            resource_version: pod.resource_version(),
        })
    });
    let gates = super::policies::gates_waiting(
        (&made, &settings.pod.egress, settings.proxy),
        (&observed.pods, &views),
    )
    .map(|policy| PoolEffect::ApplyPolicy(Box::new(policy)));
    let before = deletes.chain(gates).collect();
    let creates = (0..plan.create)
        .map_while(|i| pool_pod::pool_pod(pool, &made, settings.pod, &suffix(i)).ok())
        .map(|(pod, _)| pod)
        .collect();
    let seen = plan.rollout;
    let status = SandboxRunPoolStatus {
        replicas: count(seen.replicas),
        updated_replicas: count(seen.updated),
        ready_replicas: count(seen.ready),
        pending_replicas: count(seen.pending()),
        claimed: count(claimed),
        selector: Some(pool_pod::unclaimed_selector(&name)),
        template_hash: Some(hash.clone()),
        template_generation: observed.template_generation,
        message: None,
        observed_generation: pool.metadata.generation,
        misses: None,
    };
    Look::Serve(Box::new(Serving {
        before,
        creates,
        stand_in: made,
        hash,
        status,
    }))
}

/// What the pool's plan sees of each of `pods`: whether it is the pool's is its seal's to say
/// ([`crate::pool::seal`]), never its labels', at `now` (an unsealed pod's grace).
fn views(
    pool: &SandboxRunPool,
    pods: &[Pod],
    key: Option<&StampKey>,
    now: jiff::Timestamp,
) -> Vec<PoolPod> {
    let label = pool_pod::label_value(&pool.name_any());
    let pool_uid = pool.uid().unwrap_or_default();
    let judge = crate::pool::seal::Judge {
        key,
        pool: &label,
        pool_uid: &pool_uid,
        now,
    };
    pods.iter()
        .map(|p| pool_pod::view_of(p, judge.of(p)))
        .collect()
}

/// What follows act's answer to a [`PoolEffect::CreatePod`].
#[derive(Debug)]
pub(crate) enum AfterCreate {
    /// Created: seal it, then apply its policy (when its runs restrict egress).
    Then(Vec<PoolEffect>),
    /// It existed already: on to the next.
    Next,
    /// The namespace refused it: no more are created this look, and the status says why.
    Stop(String),
}

/// What follows `answer` to the creation of a pod of the template that made `stand_in`.
pub(crate) fn after_create(
    answer: PoolAnswer,
    stand_in: &SandboxRun,
    settings: &PoolSettings<'_>,
) -> Result<AfterCreate, ControllerError> {
    let created = match answer {
        PoolAnswer::Created(pod) => *pod,
        PoolAnswer::Exists | PoolAnswer::Done => return Ok(AfterCreate::Next),
        PoolAnswer::Refused(message) => {
            return Ok(AfterCreate::Stop(format!(
                "the namespace refused a pool pod: {message}"
            )))
        }
    };
    let name = created.name_any();
    let pool = created
        .labels()
        .get(POOL_LABEL)
        .cloned()
        .unwrap_or_default();
    let patch = settings
        .key
        .and_then(|k| crate::pool::seal::seal_patch(k, &created, &pool))
        .ok_or(ControllerError::Metadata("uid"))?;
    let mut effects = vec![PoolEffect::SealPod {
        name: name.clone(),
        patch,
    }];
    let gated = (None, settings.proxy);
    let egress = &settings.pod.egress;
    if let Some(policy) = crate::pool::egress::pool_pod_policy(stand_in, egress, &created, gated) {
        effects.push(PoolEffect::ApplyPodPolicy {
            pod: name,
            policy: Box::new(policy),
        });
    }
    Ok(AfterCreate::Then(effects))
}

/// What a look reports once its pods are created: `created` of them, and `refused`, why the
/// namespace stopped it.
pub(crate) fn closing(
    pool: &SandboxRunPool,
    serving: Serving,
    created: usize,
    refused: Option<String>,
) -> Vec<PoolEffect> {
    let mut effects = Vec::new();
    if created > 0 {
        let note = format!(
            "created {created} pool pod(s) of template version {}",
            serving.hash
        );
        effects.push(PoolEffect::Publish(event(false, "PodsCreated", note)));
    }
    let status = SandboxRunPoolStatus {
        message: refused,
        ..serving.status
    };
    effects.extend(status_effects(pool, status, Warning::PodRefused));
    effects
}

/// The status of a pool that makes no pods, saying why: its `claimed` pods counted, of the
/// template at `template_generation` (when it was read).
fn unusable(
    pool: &SandboxRunPool,
    (claimed, template_generation): (usize, Option<i64>),
    message: String,
) -> Look {
    let status = SandboxRunPoolStatus {
        claimed: count(claimed),
        template_generation,
        selector: Some(pool_pod::unclaimed_selector(&pool.name_any())),
        message: Some(message),
        observed_generation: pool.metadata.generation,
        ..SandboxRunPoolStatus::default()
    };
    Look::Unusable(status_effects(pool, status, Warning::NotPooled))
}

/// The write of `status` unless the pool has it already (the claims' misses are never written
/// here, so never compared), and a Warning `why` when its message is new.
fn status_effects(
    pool: &SandboxRunPool,
    status: SandboxRunPoolStatus,
    why: Warning,
) -> Vec<PoolEffect> {
    let status = SandboxRunPoolStatus {
        misses: None,
        ..status
    };
    let current = pool
        .status
        .clone()
        .map(|s| SandboxRunPoolStatus { misses: None, ..s });
    if current.as_ref() == Some(&status) {
        return Vec::new();
    }
    let before = pool.status.as_ref().and_then(|s| s.message.as_ref());
    let warning = status
        .message
        .as_ref()
        .filter(|m| Some(*m) != before)
        .map(|m| PoolEffect::Publish(event(true, why.reason(), m.clone())));
    std::iter::once(PoolEffect::WriteStatus(Box::new(status)))
        .chain(warning)
        .collect()
}

fn event(warning: bool, reason: &'static str, mut note: String) -> PoolEvent {
    crate::text::truncate(&mut note, crate::controller::events::EVENT_NOTE_LIMIT);
    PoolEvent {
        warning,
        reason,
        note,
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The grace period (seconds) of a pool pod no run claimed, as the pool deletes it (surplus,
/// outdated, or one it could not seal) and as it ends one someone else deletes with a longer one
/// ([`shortened_deletion`]): nothing in an unclaimed pod is owed to anyone, but its holder's
/// preStop waits for a drain (`holder --wait-drained`) and would hold the pod, its node's
/// resources and its namespace's quota for the pod's whole grace period (the drain timeout's,
/// 330 s by default). One second lets the kubelet end it the usual way (not 0, as for a drained
/// run's pod: that removes the object before the kubelet has stopped the containers, which a
/// pod never used has no reason to skip).
pub(crate) const UNCLAIMED_GRACE_SECONDS: u32 = 1;

/// A pool pod someone else is deleting with a grace period over [`UNCLAIMED_GRACE_SECONDS`]
/// (the garbage collector once its pool is deleted, the namespace controller, an eviction, a
/// user), that no run claimed, whose controller is a pool and which carries the operator's seal
/// as that pool's pod (a look-alike is never touched): ended now ([`PoolEffect::EndUnclaimed`]).
/// Its holder's preStop waits for a drain that never comes and would hold the pod, its node's
/// resources and its namespace's quota for its whole grace period (330 s by default;
/// docs/contract.md "A warm pool's launcher is the operator's code"). Its namespace and the
/// effect; None for any other pod.
pub(crate) fn shortened_deletion(
    pod: &Pod,
    key: Option<&StampKey>,
) -> Option<(String, PoolEffect)> {
    let meta = &pod.metadata;
    meta.deletion_timestamp.as_ref()?;
    let pool = pod.labels().get(POOL_LABEL)?;
    if !crate::pool::seal::sealed(key, pod, pool) {
        return None;
    }
    let grace = meta.deletion_grace_period_seconds.unwrap_or(i64::MAX);
    let pooled = meta.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.kind == <SandboxRunPool as kube::Resource>::kind(&())
            && o.api_version == <SandboxRunPool as kube::Resource>::api_version(&())
    });
    let claimed = pod.labels().contains_key(pool_pod::CLAIMED_BY_LABEL);
    if grace <= i64::from(UNCLAIMED_GRACE_SECONDS) || !pooled || claimed {
        return None;
    }
    let end = PoolEffect::EndUnclaimed {
        name: pod.name_any(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
    };
    Some((pod.namespace()?, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SandboxRunPoolSpec, TemplateRef};
    use crate::controller::testkit::fixtures::now;

    fn pool(status: Option<SandboxRunPoolStatus>) -> SandboxRunPool {
        let mut pool = SandboxRunPool::new(
            "agents",
            SandboxRunPoolSpec {
                template_ref: TemplateRef::namespaced("agent"),
                replicas: 1,
            },
        );
        pool.metadata.namespace = Some("ns".into());
        pool.status = status;
        pool
    }

    fn settings<'a>(pod: &'a PodSettings, rights: &'a RightsPolicy) -> PoolSettings<'a> {
        PoolSettings {
            key: rights.key.as_ref(),
            pod,
            proxy: &[],
        }
    }

    fn reasons(effects: &[PoolEffect]) -> Vec<String> {
        effects
            .iter()
            .map(|e| match e {
                PoolEffect::Publish(ev) => format!("{}:{}", ev.warning, ev.reason),
                PoolEffect::WriteStatus(s) => format!("status:{:?}", s.message),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_refused_creation_stops_the_look_with_the_apiservers_words() {
        let (pod, rights) = (PodSettings::default(), RightsPolicy::default());
        let run = crate::testkit::sandbox_run("agents").build();
        let after = after_create(
            PoolAnswer::Refused("quota".into()),
            &run,
            &settings(&pod, &rights),
        );
        assert!(
            matches!(after, Ok(AfterCreate::Stop(ref m)) if m == "the namespace refused a pool pod: quota"),
            "{after:?}"
        );
        let exists = after_create(PoolAnswer::Exists, &run, &settings(&pod, &rights));
        assert!(matches!(exists, Ok(AfterCreate::Next)), "{exists:?}");
    }

    #[test]
    fn a_created_pod_is_sealed_first_and_one_without_a_key_or_uid_fails_the_look() {
        let pod_settings = PodSettings::default();
        let mut rights = RightsPolicy::default();
        let run = crate::testkit::sandbox_run("agents").build();
        let mut created = Pod::default();
        created.metadata.name = Some("agents-x".into());
        created.metadata.uid = Some("u".into());
        created.metadata.namespace = Some("ns".into());
        created.metadata.labels = Some([(POOL_LABEL.to_string(), "agents".to_string())].into());
        let answer = || PoolAnswer::Created(Box::new(created.clone()));
        let none = after_create(answer(), &run, &settings(&pod_settings, &rights));
        assert!(
            matches!(none, Err(ControllerError::Metadata("uid"))),
            "{none:?}"
        );
        rights.key = Some(StampKey::new(b"0123456789abcdef0123456789abcdef"));
        let then = after_create(answer(), &run, &settings(&pod_settings, &rights));
        let Ok(AfterCreate::Then(effects)) = then else {
            panic!("{then:?}")
        };
        assert!(
            matches!(&effects[0], PoolEffect::SealPod { name, .. } if name == "agents-x"),
            "{effects:?}"
        );
    }

    #[test]
    fn the_warning_of_a_status_message_is_typed_by_where_it_came_from_not_its_words() {
        let status = |m: &str| SandboxRunPoolStatus {
            message: Some(m.into()),
            ..Default::default()
        };
        // A refusal the template's judge words like the namespace's is still NotPooled.
        let words = "the namespace refused its template";
        let effects = status_effects(&pool(None), status(words), Warning::NotPooled);
        assert_eq!(
            reasons(&effects),
            [format!("status:Some({words:?})"), "true:NotPooled".into()]
        );
        let effects = status_effects(&pool(None), status("quota"), Warning::PodRefused);
        assert_eq!(reasons(&effects)[1], "true:PodRefused");
    }

    #[test]
    fn a_status_the_pool_has_is_not_written_again_and_an_old_message_is_not_said_again() {
        let said = SandboxRunPoolStatus {
            message: Some("why".into()),
            ..Default::default()
        };
        let same = status_effects(&pool(Some(said.clone())), said.clone(), Warning::NotPooled);
        assert!(same.is_empty(), "{same:?}");
        let counted = SandboxRunPoolStatus {
            claimed: 2,
            ..said.clone()
        };
        let effects = status_effects(&pool(Some(said)), counted, Warning::NotPooled);
        assert_eq!(reasons(&effects), ["status:Some(\"why\")"]);
    }

    #[test]
    fn a_look_that_created_pods_says_so_before_it_writes_the_status() {
        let serving = Serving {
            before: Vec::new(),
            creates: Vec::new(),
            stand_in: crate::testkit::sandbox_run("agents").build(),
            hash: "h1".into(),
            status: SandboxRunPoolStatus::default(),
        };
        let effects = closing(&pool(None), serving, 2, None);
        assert_eq!(reasons(&effects), ["false:PodsCreated", "status:None"]);
    }

    /// A spec a pool pod can be made of.
    fn made() -> SandboxRunSpec {
        SandboxRunSpec {
            image: Some("busybox".into()),
            command: Some(vec!["sh".into(), "-c".into(), "sleep 1".into()]),
            user: Some("1000".into()),
            ..Default::default()
        }
    }

    fn replicas(mut pool: SandboxRunPool, n: i32) -> SandboxRunPool {
        pool.spec.replicas = n;
        pool.metadata.uid = Some("pool-uid".into());
        pool
    }

    /// A pool whose template is gone makes no pods and names the template it misses; one the
    /// operator cannot seal pods for makes none either and says so.
    #[test]
    fn a_pool_whose_template_is_missing_or_whose_pods_cannot_be_sealed_makes_none_and_says_why() {
        let rules = RuleSettings::default();
        let rights = RightsPolicy::default();
        let missing = judged(&pool(None), "ns", Ok(None), (&rules, &rights));
        let Err(NotPooled::Template(TemplateUnusable::Missing { what })) = &missing else {
            panic!("{missing:?}")
        };
        assert!(what.contains("agent"), "{what}");
        let labels = BTreeMap::new();
        let no_key = namespace_judged(made(), &labels, &[], None);
        assert!(matches!(no_key, Err(NotPooled::NoKey)), "{no_key:?}");
        let key = StampKey::new(b"0123456789abcdef0123456789abcdef");
        let sealed = namespace_judged(made(), &labels, &[], Some(&key));
        assert_eq!(sealed.ok(), Some(made()));
    }

    /// A look at a pool that makes no pods writes its status with the reason and warns once,
    /// and creates nothing.
    #[test]
    fn a_look_at_a_pool_that_makes_no_pods_writes_why_and_creates_nothing() {
        let (pod, rights) = (PodSettings::default(), RightsPolicy::default());
        let observed = PoolObserved {
            pods: Vec::new(),
            made: Err(NotPooled::NoKey),
            template_generation: Some(3),
        };
        let pool = replicas(pool(None), 2);
        let Look::Unusable(effects) = look(&pool, observed, &settings(&pod, &rights), now()) else {
            panic!("a pool without its key serves no runs")
        };
        assert_eq!(
            reasons(&effects),
            [format!("status:Some({NO_KEY:?})"), "true:NotPooled".into()]
        );
        let Some(PoolEffect::WriteStatus(status)) = effects.first() else {
            panic!("{effects:?}")
        };
        assert_eq!(status.template_generation, Some(3));
        assert_eq!(status.replicas, 0);
    }

    /// A look at a pool without pods creates its replicas, each named from the look's one clock
    /// reading (the same reading names the same pods; a later one, new ones), of one template
    /// version, and its status says that version with none ready yet.
    #[test]
    fn a_look_at_an_empty_pool_creates_its_replicas_named_from_the_looks_clock() {
        let (pod, mut rights) = (PodSettings::default(), RightsPolicy::default());
        rights.key = Some(StampKey::new(b"0123456789abcdef0123456789abcdef"));
        let pool = replicas(pool(None), 2);
        let at = |now: jiff::Timestamp| {
            let observed = PoolObserved {
                pods: Vec::new(),
                made: Ok(made()),
                template_generation: Some(1),
            };
            match look(&pool, observed, &settings(&pod, &rights), now) {
                Look::Serve(serving) => serving,
                Look::Unusable(effects) => panic!("{effects:?}"),
            }
        };
        let first = at(now());
        let names: Vec<String> = first.creates.iter().map(|p| p.name_any()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert_ne!(names[0], names[1]);
        assert!(first.before.is_empty(), "{:?}", first.before);
        for created in &first.creates {
            assert_eq!(
                created.labels().get(POOL_LABEL).map(String::as_str),
                Some("agents")
            );
        }
        assert_eq!(
            first.status.template_hash.as_deref(),
            Some(first.hash.as_str())
        );
        assert_eq!((first.status.replicas, first.status.ready_replicas), (0, 0));
        let again: Vec<String> = at(now()).creates.iter().map(|p| p.name_any()).collect();
        assert_eq!(again, names, "the same clock reading names the same pods");
        let later = now()
            .checked_add(jiff::SignedDuration::from_secs(1))
            .expect("a second later");
        let next: Vec<String> = at(later).creates.iter().map(|p| p.name_any()).collect();
        assert!(
            next.iter().all(|n| !names.contains(n)),
            "{next:?} {names:?}"
        );
    }

    /// An unclaimed, sealed pool pod deleted by someone else with its full grace period (its
    /// pool deleted: the garbage collector) is ended, guarded by its uid and resourceVersion; a
    /// claimed one, a look-alike without the seal, a run's, one not being deleted, or one
    /// already on the short grace period is left alone.
    #[test]
    fn only_an_unclaimed_pool_pod_deleted_with_a_long_grace_period_is_deleted_again_shortly() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
        let owner = |kind: &str| OwnerReference {
            api_version: "sandbox.iterion.io/v1alpha1".into(),
            kind: kind.into(),
            name: "agents".into(),
            uid: "owner".into(),
            controller: Some(true),
            ..Default::default()
        };
        let mut going = Pod::default();
        going.metadata.name = Some("agents-h-x1".into());
        going.metadata.namespace = Some("ns".into());
        going.metadata.uid = Some("p1".into());
        going.metadata.resource_version = Some("9".into());
        going.metadata.owner_references = Some(vec![owner("SandboxRunPool")]);
        going.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        going.metadata.deletion_grace_period_seconds = Some(330);
        going.metadata.labels = Some([(POOL_LABEL.to_string(), "agents".to_string())].into());
        let key = StampKey::new(b"a key for the test's seals");
        let seal = crate::pool::seal::seal_of(&key, &going, "agents").unwrap();
        going.metadata.annotations =
            Some([(crate::pool::seal::SEAL_ANNOTATION.to_string(), seal)].into());
        let key = Some(&key);
        match shortened_deletion(&going, key) {
            Some((
                ns,
                PoolEffect::EndUnclaimed {
                    name,
                    uid,
                    resource_version,
                },
            )) => {
                assert_eq!((ns.as_str(), name.as_str()), ("ns", "agents-h-x1"));
                assert_eq!(uid.as_deref(), Some("p1"));
                assert_eq!(resource_version.as_deref(), Some("9"));
            }
            other => panic!("ended, guarded: {other:?}"),
        }
        let mut claimed = going.clone();
        if let Some(labels) = claimed.metadata.labels.as_mut() {
            labels.insert(
                pool_pod::CLAIMED_BY_LABEL.to_string(),
                "run-uid".to_string(),
            );
        }
        let mut unsealed = going.clone();
        unsealed.metadata.annotations = None;
        let mut runs = going.clone();
        runs.metadata.owner_references = Some(vec![owner("SandboxRun")]);
        let mut standing = going.clone();
        standing.metadata.deletion_timestamp = None;
        let mut short = going.clone();
        short.metadata.deletion_grace_period_seconds = Some(i64::from(UNCLAIMED_GRACE_SECONDS));
        for pod in [claimed, unsealed, runs, standing, short] {
            assert!(
                shortened_deletion(&pod, key).is_none(),
                "{:?}",
                pod.metadata
            );
        }
        assert!(
            shortened_deletion(&going, None).is_none(),
            "no key: nothing verifies"
        );
    }
}
