//! The warm pools' controller (`run --warm-pools`, docs/user-guide.md "Sandboxes for agents: warm
//! pools"): a controller of its own beside the runs', with its own observe → decide → act. It
//! watches SandboxRunPools and the pods they own; each reconcile reads the pool's template and
//! its pods (observe), plans with [`crate::pool::plan::plan`] (pure), creates and deletes pods
//! and writes the pool's status (act). A pod a run claimed is the run's (its owner and labels
//! say so): the pool only counts it. With sharding, each pool is served by the replica that
//! holds its shard.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tracing::{info, warn};

use super::context::Context;
use super::error::{kube_err, ControllerError};
use crate::api::{SandboxRunPool, SandboxRunPoolStatus};
use crate::pool::pod::{self as pool_pod, POOL_LABEL};
use crate::template::TemplateUnusable;

/// How often a pool is looked at again without a watch event (pods becoming ready wake it).
const LOOK_AGAIN: Duration = Duration::from_secs(30);

/// Why a pool makes no pods when the operator has no key to seal them with.
const NO_KEY: &str = "the operator could not read its admission key, which seals a pool's pods \
                      (a pod it cannot seal could not be told from a look-alike): no pool pods";

/// Runs the pools' controller until `shutdown` resolves. `namespaces` empty = every namespace.
pub(crate) async fn run(
    ctx: Arc<Context>,
    namespaces: Vec<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let scopes = super::scopes(&namespaces).into_iter().map(|ns| match ns {
        None => (
            Api::<SandboxRunPool>::all(client.clone()),
            Api::<Pod>::all(client.clone()),
        ),
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
    });
    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    let mut streams = Vec::new();
    for (pools, pods) in scopes {
        // By the pool label, not the owner: a claimed pod is the run's, and its claim (or its
        // end) must wake its pool at once, which then makes another.
        let mut controller = Controller::new(pools, watcher::Config::default()).watches(
            pods,
            watcher::Config::default().labels(POOL_LABEL),
            pool_of_pod,
        );
        if let Some(gate) = &ctx.sharding.gate {
            controller = controller.reconcile_all_on(acquired(gate.acquisitions()));
        }
        let stream = controller
            .graceful_shutdown_on(shutdown.clone())
            .run(reconcile, error_policy, ctx.clone())
            .for_each(|res| async move {
                if let Err(e) = res {
                    warn!(error = %e, "pool reconcile failed");
                }
            });
        streams.push(stream);
    }
    futures::future::join_all(streams).await;
}

/// One item each time this replica acquires a shard: every pool is looked at again (the ones
/// of that shard are now this replica's to serve).
fn acquired(
    rx: tokio::sync::watch::Receiver<u64>,
) -> impl futures::Stream<Item = ()> + Send + Sync + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    })
}

/// The pool a pod carries the label of (its namespace's).
fn pool_of_pod(pod: Pod) -> Option<ObjectRef<SandboxRunPool>> {
    let pool = pod.labels().get(POOL_LABEL)?.clone();
    Some(ObjectRef::new(&pool).within(&pod.namespace()?))
}

fn error_policy(pool: Arc<SandboxRunPool>, error: &ControllerError, _: Arc<Context>) -> Action {
    warn!(pool = %pool.name_any(), %error, "pool reconcile error; retrying in 10s");
    Action::requeue(Duration::from_secs(10))
}

/// One pool: its template made into a pod, its pods planned, created, deleted, its status.
async fn reconcile(
    pool: Arc<SandboxRunPool>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    // Sharded: a pool is served by the replica that holds its shard (its uid's), while it holds
    // it; a shard acquired later reconciles every pool (docs/contract.md "Shards").
    let Some(_shard) = ctx.enter_shard_of(&pool.metadata) else {
        return Ok(Action::await_change());
    };
    let ns = pool
        .namespace()
        .ok_or(ControllerError::Metadata("namespace"))?;
    let name = pool.name_any();
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let (owned, views) = pods_of(&ctx, &pool, &pods_api).await?;
    let claimed = views.iter().filter(|p| p.claimed && p.sealed).count();
    let made = match judged_spec(&ctx, &pool, &ns).await? {
        Ok(made) => pool_pod::stand_in(&pool, made),
        Err(message) => {
            let status = unusable_status(&pool, claimed, message.to_string());
            write_status(&ctx, &pool, status).await?;
            return Ok(Action::requeue(LOOK_AGAIN));
        }
    };
    let replicas = usize::try_from(pool.spec.replicas).unwrap_or(0);
    let stamp = jiff::Timestamp::now().as_nanosecond();
    let suffix =
        |i: usize| crate::names::short_hash(&format!("{name}/{stamp}/{i}"))[..5].to_string();
    let hash = match pool_pod::pool_pod(&pool, &made, &ctx.pod, &suffix(0)) {
        Ok((_, hash)) => hash,
        Err(e) => {
            write_status(&ctx, &pool, unusable_status(&pool, claimed, e.to_string())).await?;
            return Ok(Action::requeue(LOOK_AGAIN));
        }
    };
    let plan = crate::pool::plan::plan(replicas, &hash, &views);
    for gone in &plan.delete {
        if let Some(pod) = owned.iter().find(|p| p.name_any() == *gone) {
            delete_pod(&pods_api, pod).await?;
        }
    }
    super::pool_policies::gates_waiting(&ctx, &made, (&owned, &views)).await?;
    let pods = (0..plan.create)
        .map_while(|i| pool_pod::pool_pod(&pool, &made, &ctx.pod, &suffix(i)).ok())
        .map(|(pod, _)| pod);
    let (created, refused) = create_pods(&ctx, (&pool, &made), pods).await?;
    if created > 0 {
        let note = format!("created {created} pool pod(s) of template version {hash}");
        publish(&ctx, &pool, EventType::Normal, "PodsCreated", note).await;
    }
    let status = SandboxRunPoolStatus {
        replicas: count(plan.ready + plan.pending),
        ready_replicas: count(plan.ready),
        pending_replicas: count(plan.pending),
        claimed: count(claimed),
        selector: Some(pool_pod::unclaimed_selector(&name)),
        template_hash: Some(hash),
        message: refused,
        observed_generation: pool.metadata.generation,
        misses: None,
    };
    write_status(&ctx, &pool, status).await?;
    Ok(Action::requeue(LOOK_AGAIN))
}

/// The pods carrying the pool's label, and what its plan needs of each: whether it is the
/// pool's is its seal's to say ([`crate::pool::seal`]), never its labels'.
async fn pods_of(
    ctx: &Context,
    pool: &SandboxRunPool,
    api: &Api<Pod>,
) -> Result<(Vec<Pod>, Vec<crate::pool::plan::PoolPod>), ControllerError> {
    let name = pool.name_any();
    let label = pool_pod::label_value(&name);
    let pods = api
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={label}")))
        .await
        .map_err(kube_err(format!("list the pods of pool {name}")))?
        .items;
    let pool_uid = pool.uid().unwrap_or_default();
    let judge = crate::pool::seal::Judge {
        key: ctx.admission.rights.key.as_ref(),
        pool: &label,
        pool_uid: &pool_uid,
        now: jiff::Timestamp::now(),
    };
    let views = pods
        .iter()
        .map(|p| pool_pod::view_of(p, judge.of(p)))
        .collect();
    Ok((pods, views))
}

/// Creates `pods` (of the template that made `stand_in`), each followed by its NetworkPolicy
/// when the template's runs restrict egress; stops at the first one the namespace refuses (its
/// quota, Pod Security or another admission: pool pods are judged as any pod is). How many it
/// created, and why it stopped, for the status.
async fn create_pods(
    ctx: &Context,
    (pool, stand_in): (&SandboxRunPool, &crate::api::SandboxRun),
    pods: impl Iterator<Item = Pod>,
) -> Result<(usize, Option<String>), ControllerError> {
    let name = pool.name_any();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pool.namespace().unwrap_or_default());
    let mut created = 0;
    for pod in pods {
        match api.create(&PostParams::default(), &pod).await {
            Ok(made) => {
                seal(ctx, &api, &made).await?;
                super::pool_policies::created(ctx, stand_in, &made).await?;
                created += 1;
                info!(pool = %name, pod = %pod.name_any(), "pool pod created");
            }
            Err(kube::Error::Api(ae)) if ae.code == 409 => {}
            Err(kube::Error::Api(ae)) if ae.code == 403 || ae.code == 422 => {
                warn!(pool = %name, reason = %ae.message, "a pool pod was refused");
                let why = format!("the namespace refused a pool pod: {}", ae.message);
                return Ok((created, Some(why)));
            }
            Err(e) => {
                let ns = pool.namespace().unwrap_or_default();
                return Err(kube_err(format!("create a pod of pool {ns}/{name}"))(e));
            }
        }
    }
    Ok((created, None))
}

/// Seals the pool pod `created` (as the apiserver returned it, its uid known:
/// [`crate::pool::seal`]); one that cannot be sealed is deleted (never served, it would only
/// wait for the orphan grace).
async fn seal(ctx: &Context, api: &Api<Pod>, created: &Pod) -> Result<(), ControllerError> {
    let name = created.name_any();
    let pool = created
        .labels()
        .get(POOL_LABEL)
        .cloned()
        .unwrap_or_default();
    let key = ctx.admission.rights.key.as_ref();
    let patch = key.and_then(|k| crate::pool::seal::seal_patch(k, created, &pool));
    let Some(patch) = patch else {
        return Err(ControllerError::Metadata("uid"));
    };
    if let Err(e) = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        warn!(pod = %name, error = %e, "a pool pod could not be sealed; deleting it");
        let _ = api.delete(&name, &DeleteParams::default()).await;
        return Err(kube_err(format!("seal pool pod {name}"))(e));
    }
    Ok(())
}

/// Publishes an Event about `pool` (best effort: a failure is logged).
async fn publish(
    ctx: &Context,
    pool: &SandboxRunPool,
    type_: EventType,
    reason: &str,
    mut note: String,
) {
    crate::text::truncate(&mut note, super::events::EVENT_NOTE_LIMIT);
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &pool.object_ref(&())).await {
        warn!(pool = %pool.name_any(), reason, error = %e, "could not publish Event");
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// The status of a pool that makes no pods, saying why.
fn unusable_status(pool: &SandboxRunPool, claimed: usize, message: String) -> SandboxRunPoolStatus {
    SandboxRunPoolStatus {
        claimed: count(claimed),
        selector: Some(pool_pod::unclaimed_selector(&pool.name_any())),
        message: Some(message),
        observed_generation: pool.metadata.generation,
        ..SandboxRunPoolStatus::default()
    }
}

/// Why a pool makes no pods of its template (its status' message, a `NotPooled` Event).
#[derive(Debug, thiserror::Error)]
enum NotPooled {
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

/// [`made_spec`], judged by the operator's rules and the author's rights, or why the pool makes
/// no pods.
async fn judged_spec(
    ctx: &Context,
    pool: &SandboxRunPool,
    ns: &str,
) -> Result<Result<crate::api::SandboxRunSpec, NotPooled>, ControllerError> {
    let made = match made_spec(ctx, pool, ns).await? {
        Ok(made) => made,
        Err(e) => return Ok(Err(e.into())),
    };
    let (rules, rights) = (&ctx.admission.rules, &ctx.admission.rights);
    if let Some(why) = crate::pool::judge::refusal(&made, rules, rights) {
        return Ok(Err(NotPooled::Refused(why)));
    }
    // The namespace policies too (docs/contract.md "The platform's namespace policies"): the
    // namespace's labels are read only when a policy selects by label.
    let policies = &ctx.pod.namespace_policies;
    let labels = if policies.iter().any(|p| p.needs_labels()) {
        super::observe::namespace_labels(&ctx.client, ns).await?
    } else {
        Default::default()
    };
    Ok(
        match crate::pool::judge::namespace_refusal(&made, &labels, policies) {
            Some(why) => Err(NotPooled::Refused(why)),
            None if rights.key.is_none() => Err(NotPooled::NoKey),
            None => Ok(made),
        },
    )
}

/// The spec a run made from the pool's template gets (its template merged into an empty run),
/// or why there is none.
async fn made_spec(
    ctx: &Context,
    pool: &SandboxRunPool,
    ns: &str,
) -> Result<Result<crate::api::SandboxRunSpec, TemplateUnusable>, ControllerError> {
    let reference = &pool.spec.template_ref;
    let fetched = match super::observe::template(&ctx.client, ns, reference).await? {
        Ok(Some(t)) => t,
        Ok(None) => {
            let what = reference.describe(ns);
            return Ok(Err(TemplateUnusable::Missing { what }));
        }
        Err(e) => return Ok(Err(e)),
    };
    let empty = crate::api::SandboxRunSpec {
        template_ref: Some(reference.clone()),
        ..Default::default()
    };
    Ok(crate::template::merge(&fetched.spec, &reference.label(), &empty).map_err(Into::into))
}

/// Deletes an unclaimed pool pod as it was read: preconditioned on its uid and resourceVersion,
/// so a pod a run claimed meanwhile (the claim changed it) is never deleted (a 409, left alone).
async fn delete_pod(pods: &Api<Pod>, pod: &Pod) -> Result<(), ControllerError> {
    let name = pod.name_any();
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: pod.uid(),
            resource_version: pod.resource_version(),
        }),
        ..DeleteParams::default()
    };
    match pods.delete(&name, &params).await {
        Ok(_) => {
            info!(pod = %name, "pool pod deleted (outdated or surplus)");
            Ok(())
        }
        Err(kube::Error::Api(ae)) if ae.code == 404 || ae.code == 409 => Ok(()),
        Err(e) => Err(kube_err(format!("delete pool pod {name}"))(e)),
    }
}

/// Writes the pool's status (server-side apply, the operator's field manager).
async fn write_status(
    ctx: &Context,
    pool: &SandboxRunPool,
    status: SandboxRunPoolStatus,
) -> Result<(), ControllerError> {
    // The misses are the claims' (`super::warm`): never written here, so never compared.
    let status = SandboxRunPoolStatus {
        misses: None,
        ..status
    };
    let current = pool
        .status
        .clone()
        .map(|s| SandboxRunPoolStatus { misses: None, ..s });
    if current.as_ref() == Some(&status) {
        return Ok(());
    }
    let ns = pool.namespace().unwrap_or_default();
    let api: Api<SandboxRunPool> = Api::namespaced(ctx.client.clone(), &ns);
    let body = serde_json::json!({
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRunPool",
        "metadata": {"name": pool.name_any(), "namespace": ns},
        "status": status,
    });
    api.patch_status(
        &pool.name_any(),
        &PatchParams::apply(crate::names::MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(kube_err(format!(
        "write the status of pool {ns}/{}",
        pool.name_any()
    )))?;
    // Why the pool does not serve (or serves fewer than asked), once each time it changes.
    let before = pool.status.as_ref().and_then(|s| s.message.as_ref());
    if let Some(message) = status.message.as_ref().filter(|m| Some(*m) != before) {
        let reason = if message.starts_with("the namespace refused") {
            "PodRefused"
        } else {
            "NotPooled"
        };
        publish(ctx, pool, EventType::Warning, reason, message.clone()).await;
    }
    Ok(())
}
