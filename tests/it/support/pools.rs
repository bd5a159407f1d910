//! Warm pools as the tests make and read them: a template and a pool of it, the wait until its
//! pods are ready, and its pods as the apiserver lists them. The labels are written out here, not
//! taken from the crate, so that a changed label fails the tests instead of following them.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use sandboxrun_operator::api::{
    SandboxRunPool, SandboxRunPoolSpec, SandboxRunPoolStatus, SandboxRunTemplateSpec, TemplateRef,
};

use super::templates::put_template;
use super::wait::eventually;

/// The label naming a pool pod's pool.
pub const POOL_LABEL: &str = "sandbox.iterion.io/pool";
/// The label holding the template version a pool pod was made from.
pub const HASH_LABEL: &str = "sandbox.iterion.io/pool-template-hash";
/// The label a claim sets: the uid of the run that took the pod.
pub const CLAIMED_BY_LABEL: &str = "sandbox.iterion.io/claimed-by";

/// Creates the template `template` (`spec`) and a pool `pool` of `replicas` of it in `ns`
/// (without waiting for its pods); the pools of `ns`.
pub async fn make_template_and_pool(
    client: &Client,
    ns: &str,
    (template, pool): (&str, &str),
    spec: SandboxRunTemplateSpec,
    replicas: i32,
) -> Api<SandboxRunPool> {
    put_template(&Api::namespaced(client.clone(), ns), template, spec).await;
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), ns);
    let made = SandboxRunPool::new(
        pool,
        SandboxRunPoolSpec {
            template_ref: TemplateRef::namespaced(template),
            replicas,
        },
    );
    pools
        .create(&PostParams::default(), &made)
        .await
        .unwrap_or_else(|e| panic!("create the pool {pool}: {e}"));
    pools
}

/// The status of the pool `name`, once all its `ready` pods are ready (its `replicas` and
/// `readyReplicas` both `ready`; fails after `within`).
pub async fn wait_pool_ready(
    pools: &Api<SandboxRunPool>,
    name: &str,
    ready: i32,
    within: Duration,
) -> SandboxRunPoolStatus {
    eventually(
        &format!("the pool {name}'s {ready} pods to be ready"),
        within,
        || async move {
            let s = pools.get(name).await.ok()?.status?;
            (s.ready_replicas == ready && s.replicas == ready).then_some(s)
        },
    )
    .await
}

/// The live (not deleting) pods of pool `pool` in `ns`: (name, template hash, claimed).
pub async fn pool_pods(client: &Client, ns: &str, pool: &str) -> Vec<(String, String, bool)> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={pool}")))
        .await
        .expect("list the pool's pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let labels = p.labels().clone();
            (
                p.name_any(),
                labels.get(HASH_LABEL).cloned().unwrap_or_default(),
                labels.contains_key(CLAIMED_BY_LABEL),
            )
        })
        .collect()
}

/// The names of the live pods of pool `pool` in `ns` no run claimed ([`pool_pods`]).
pub async fn unclaimed_pool_pods(client: &Client, ns: &str, pool: &str) -> Vec<String> {
    pool_pods(client, ns, pool)
        .await
        .into_iter()
        .filter(|(_, _, claimed)| !claimed)
        .map(|(name, _, _)| name)
        .collect()
}

/// The value of the series `series` (its name and labels, as exposed) on the operator's
/// metrics at `port`; None when it is not exposed (yet).
pub async fn operator_metric(port: u16, series: &str) -> Option<f64> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|v| v.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}
