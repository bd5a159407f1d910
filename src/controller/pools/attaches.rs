//! The attaches this replica holds open to its ready pool pods' launchers, opened and let go
//! as the pools' pod watch sees the pods pass ([`crate::pool::hold`] says which; kept in
//! [`crate::pool::attaches`]; docs/contract.md "A claim writes its start on an attach held
//! open"): at most `OPENS_AT_ONCE` opened at a time; let go (the stream closed, which leaves
//! the launcher waiting) when the pod goes, or [`CLAIMED_LET_GO_AFTER`] after another replica's
//! claim. A claim takes one in `crate::controller::run::act`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use prometheus::IntGauge;

use crate::api::SandboxRunPool;
use crate::controller::context::Context;
use crate::pool::attaches::HeldAttaches;
use crate::pool::hold::{hold_for, Hold};

/// How long a claimed pod's held attach is left for its claim to take.
pub(crate) const CLAIMED_LET_GO_AFTER: Duration = Duration::from_secs(15);

/// What the pools' pod watch does with each pod as it passes: holds an attach open to a ready
/// pool pod's launcher, lets go of one whose pod goes ([`hold_for`]).
/// With sharding, only the replica that serves a pod's pool holds attaches to it (a claim by
/// another replica opens its own).
pub(crate) fn hold_attaches(ctx: Arc<Context>) -> impl FnMut(&Result<Pod, watcher::Error>) {
    let (attaches, held) = (
        Arc::clone(&ctx.memory.held_attaches),
        ctx.metrics.attaches_held.clone(),
    );
    move |event| {
        show(&attaches, &held);
        let Ok(pod) = event else { return };
        let Some(hold) = hold_for(pod, ctx.admission.rights.key.as_ref()) else {
            return;
        };
        let (Some(namespace), name) = (pod.namespace(), pod.name_any()) else {
            return;
        };
        let at = (namespace, name);
        match hold {
            Hold::Open { uid } if serves_pool_of(&ctx, pod) => {
                open(&ctx.client, (&attaches, &held), at, uid);
            }
            Hold::Open { .. } | Hold::LetGo => attaches.let_go(&at, None),
            Hold::ClaimedLetGoLater if attaches.has(&at) => {
                let (attaches, uid) = (Arc::clone(&attaches), pod.metadata.uid.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(CLAIMED_LET_GO_AFTER).await;
                    attaches.let_go(&at, uid.as_deref());
                });
            }
            Hold::ClaimedLetGoLater | Hold::Wait => {}
        }
    }
}

/// Whether this replica serves the pool that owns `pod` (always without sharding).
fn serves_pool_of(ctx: &Context, pod: &Pod) -> bool {
    let Some(gate) = &ctx.sharding.gate else {
        return true;
    };
    let owner = pod.metadata.owner_references.iter().flatten().find(|o| {
        o.controller == Some(true) && o.kind == <SandboxRunPool as kube::Resource>::kind(&())
    });
    let pool = owner
        .zip(pod.namespace())
        .and_then(|(owner, ns)| ctx.memory.watched_pools.named(&ns, &owner.name));
    pool.and_then(|pool| gate.shard_of_meta(&pool.metadata))
        .is_some_and(|shard| gate.serving().borrow().contains(&shard))
}

/// Opens an attach to the launcher of `at` (the pod of `uid`) in a task of its own.
fn open(
    client: &Client,
    (attaches, held): (&Arc<HeldAttaches>, &IntGauge),
    at: (String, String),
    uid: String,
) {
    if !attaches.begin(&at, &uid) {
        return;
    }
    let (pods, attaches, held) = (
        Api::<Pod>::namespaced(client.clone(), &at.0),
        Arc::clone(attaches),
        held.clone(),
    );
    tokio::spawn(async move {
        let Ok(_slot) = attaches.opening_slots().acquire_owned().await else {
            return;
        };
        match super::act::open_attach(&pods, &at.1, uid.clone()).await {
            Some(attach) => attaches.opened(at, attach),
            None => attaches.let_go(&at, Some(&uid)),
        }
        show(&attaches, &held);
    });
}

/// Sets `sandboxrun_pool_attaches_held` to how many attaches are held.
fn show(attaches: &HeldAttaches, held: &IntGauge) {
    held.set(i64::try_from(attaches.held()).unwrap_or(i64::MAX));
}
