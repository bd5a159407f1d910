//! The warm pools' controller (`run --warm-pools`, docs/user-guide.md "Sandboxes for agents: warm
//! pools"): a controller of its own beside the runs', with its own observe → plan → act. It
//! watches SandboxRunPools and the pods they own; each reconcile reads the clock once, reads the
//! pool's template, the namespace's labels its policies need and its pods ([`observe`], reads
//! only), plans the look ([`self::plan::look`], pure: the deletes, the waiting gates'
//! policies, the pods to create, the status and its Events), and carries the effects out in
//! order ([`self::act`], the only writes), each creation's answer planned by
//! [`self::plan::after_create`] (seal it, apply its policy; or stop where the namespace
//! refused one). A pod a run claimed is the run's (its owner and labels say so): the pool only
//! counts it. With sharding, each pool is served by the replica that holds its shard.

mod act;
pub(crate) mod attaches;
mod plan;
pub(crate) mod policies;
#[cfg(test)]
mod scenarios;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use tracing::{info, warn};

use self::act::carry_out;
use self::plan::{AfterCreate, Look, PoolEffect, PoolObserved, PoolSettings};
use super::context::Context;
use super::error::{kube_err, ControllerError};
use crate::api::SandboxRunPool;
use crate::pool::gauges as pool_gauges;
use crate::pool::pod::{self as pool_pod, POOL_LABEL};

/// How often a pool is looked at again without a watch event (pods becoming ready wake it).
const LOOK_AGAIN: Duration = Duration::from_secs(30);

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
    let mut stores = Vec::new();
    for (pools, pods) in scopes {
        let controller = Controller::new(pools, watcher::Config::default());
        stores.push(controller.store());
        // By the pool label, not the owner: a claimed pod is the run's, and its claim (or its
        // end) must wake its pool at once, which then makes another.
        // The pools and their pods are kept as they pass, for the runs' claims to read
        // (src/pool/watched.rs).
        let (reader, writer) = kube::runtime::reflector::store();
        ctx.memory.watched_pools.add(controller.store(), reader);
        let kept = watcher(pods, watcher::Config::default().labels(POOL_LABEL))
            .modify(|pod: &mut Pod| pod.managed_fields_mut().clear())
            .reflect(writer)
            .touched_objects()
            .inspect(end_unclaimed_deletions(Arc::clone(&ctx)))
            .inspect(attaches::hold_attaches(Arc::clone(&ctx)));
        let mut controller = controller.watches_stream(kept, pool_of_pod);
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
    export_gauges(&ctx, stores);
    futures::future::join_all(streams).await;
}

/// Registers `sandboxrun_pool_pods` ([`pool_gauges`]), read from the controller's `stores`: the
/// pools this replica serves (with sharding, those of the shards it holds).
fn export_gauges(ctx: &Context, stores: Vec<kube::runtime::reflector::Store<SandboxRunPool>>) {
    let gate = ctx.sharding.gate.clone();
    let serves: pool_gauges::Serves = Box::new(move |pool| match &gate {
        None => true,
        Some(gate) => gate
            .shard_of_meta(&pool.metadata)
            .is_some_and(|shard| gate.serving().borrow().contains(&shard)),
    });
    let registered = pool_gauges::PoolGauges::new(stores, serves)
        .and_then(|gauges| ctx.metrics.registry.register(Box::new(gauges)));
    if let Err(e) = registered {
        warn!(error = %e, "the pools' gauges are not exported");
    }
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

/// How many unclaimed pool pods being deleted are ended at once ([`end_unclaimed_deletions`]).
const ENDINGS_AT_ONCE: usize = 4;

/// What the pools' pod watch does with each pod as it passes: an unclaimed pool pod someone
/// else deletes with a long grace period is ended now ([`plan::shortened_deletion`]; its pool
/// may be gone, so no pool's reconcile would see it), in a task of its own, at most
/// [`ENDINGS_AT_ONCE`] at a time, so the watch that wakes the pools never waits on it.
fn end_unclaimed_deletions(ctx: Arc<Context>) -> impl FnMut(&Result<Pod, watcher::Error>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(ENDINGS_AT_ONCE));
    move |event| {
        let key = ctx.admission.rights.key.as_ref();
        let Some((ns, end)) = event
            .as_ref()
            .ok()
            .and_then(|p| plan::shortened_deletion(p, key))
        else {
            return;
        };
        let (ctx, slots) = (Arc::clone(&ctx), Arc::clone(&slots));
        tokio::spawn(async move {
            let Ok(_slot) = slots.acquire_owned().await else {
                return;
            };
            if let Err(e) = act::carry_out_shortened(&ctx, &ns, end).await {
                warn!(error = %e, "could not end an unclaimed pool pod being deleted");
            }
        });
    }
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

/// One pool: observed, planned and acted on, with one reading of the clock.
pub(super) async fn reconcile(
    pool: Arc<SandboxRunPool>,
    ctx: Arc<Context>,
) -> Result<Action, ControllerError> {
    // Sharded: a pool is served by the replica that holds its shard (its uid's), while it holds
    // it; a shard acquired later reconciles every pool (docs/contract.md "Shards").
    let Some(_shard) = ctx.enter_shard_of(&pool.metadata) else {
        return Ok(Action::await_change());
    };
    // A pool without its identity is served no further: its seals and its pods' owner would
    // name no pool (docs/contract.md "A write always names its object").
    crate::identity::uid_of(pool.as_ref())?;
    crate::identity::namespace_of(pool.as_ref())?;
    let now = jiff::Timestamp::now();
    let observed = observe(&ctx, &pool).await?;
    let proxy = ctx.egress_proxy.addresses();
    let settings = PoolSettings {
        key: ctx.admission.rights.key.as_ref(),
        pod: &ctx.pod,
        proxy: &proxy,
    };
    let mut serving = match plan::look(&pool, observed, &settings, now) {
        Look::Unusable(effects) => {
            carry_all(&ctx, &pool, effects).await?;
            return Ok(Action::requeue(LOOK_AGAIN));
        }
        Look::Serve(serving) => serving,
    };
    carry_all(&ctx, &pool, std::mem::take(&mut serving.before)).await?;
    let (created, refused) = create_pods(&ctx, &pool, &settings, &serving).await?;
    let effects = plan::closing(&pool, *serving, created, refused);
    carry_all(&ctx, &pool, effects).await?;
    Ok(Action::requeue(LOOK_AGAIN))
}

/// Carries out `effects` in order, stopping at the first that fails.
async fn carry_all(
    ctx: &Context,
    pool: &SandboxRunPool,
    effects: Vec<PoolEffect>,
) -> Result<(), ControllerError> {
    for effect in effects {
        carry_out(ctx, pool, effect).await?;
    }
    Ok(())
}

/// Creates the look's pods in order, each followed by what its answer plans (its seal, its
/// policy); stops at the first one the namespace refuses (its quota, Pod Security or another
/// admission: pool pods are judged as any pod is). How many it created, and why it stopped.
async fn create_pods(
    ctx: &Context,
    pool: &SandboxRunPool,
    settings: &PoolSettings<'_>,
    serving: &plan::Serving,
) -> Result<(usize, Option<String>), ControllerError> {
    let mut created = 0;
    for pod in &serving.creates {
        let answer = carry_out(ctx, pool, PoolEffect::CreatePod(Box::new(pod.clone()))).await?;
        match plan::after_create(answer, &serving.stand_in, settings)? {
            AfterCreate::Then(effects) => {
                carry_all(ctx, pool, effects).await?;
                created += 1;
                info!(pool = %pool.name_any(), pod = %pod.name_any(), "pool pod created");
            }
            AfterCreate::Next => {}
            AfterCreate::Stop(why) => return Ok((created, Some(why))),
        }
    }
    Ok((created, None))
}

/// What a look at `pool` reads (reads only): the pods carrying its label, and the spec its
/// template makes, judged ([`plan::judged`]) — the namespace's labels read only when the
/// template made a spec the rules let through and a namespace policy selects by label.
async fn observe(ctx: &Context, pool: &SandboxRunPool) -> Result<PoolObserved, ControllerError> {
    let ns = pool
        .namespace()
        .ok_or(ControllerError::Metadata("namespace"))?;
    let name = pool.name_any();
    let label = pool_pod::label_value(&name);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pods = pods_api
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={label}")))
        .await
        .map_err(kube_err(format!("list the pods of pool {name}")))?
        .items;
    let reference = &pool.spec.template_ref;
    let fetched = super::run::observe::template(&ctx.client, &ns, reference).await?;
    let template_generation = fetched.as_ref().ok().and_then(|t| t.as_ref()?.generation);
    let rules = (&ctx.admission.rules, &ctx.admission.rights);
    let made = match plan::judged(pool, &ns, fetched, rules) {
        Ok(made) => {
            // The namespace policies too (docs/contract.md "The platform's namespace
            // policies"): the namespace's labels are read only when a policy selects by label.
            let policies = &ctx.pod.namespace_policies;
            let labels = if policies.iter().any(|p| p.needs_labels()) {
                super::run::observe::namespace_labels(&ctx.client, &ns).await?
            } else {
                Default::default()
            };
            let key = ctx.admission.rights.key.as_ref();
            plan::namespace_judged(made, &labels, policies, key)
        }
        Err(why) => Err(why),
    };
    Ok(PoolObserved {
        pods,
        made,
        template_generation,
    })
}
