//! Warm pools on the real node, made the one way these tests make them and waited on until ready.

use super::*;

/// How long a real-node pool's pods may take to be ready (images pulled, containers started).
pub(super) const POOL_READY: Duration = Duration::from_secs(240);

/// A warm pool on the real node, the one way these tests make one: the template `template` of
/// `spec` (its runs may set `open`), and the pool `pool` of `replicas` of it, once all its pods
/// are ready; the pools of `ns`.
pub(super) async fn real_pool(
    client: &Client,
    ns: &str,
    (template, pool): (&str, &str),
    (spec, open): (SandboxRunSpec, &[OpenField]),
    replicas: i32,
) -> Api<SandboxRunPool> {
    let pools = make_template_and_pool(
        client,
        ns,
        (template, pool),
        template_of(spec, open),
        replicas,
    )
    .await;
    wait_pool_ready(&pools, pool, replicas, POOL_READY).await;
    pools
}

/// [`real_pool`] of the template `agent` of `spec`, whose runs set their command, as the pool
/// `agents`.
pub(super) async fn ready_pool(
    client: &Client,
    ns: &str,
    spec: SandboxRunSpec,
    replicas: i32,
) -> Api<SandboxRunPool> {
    real_pool(
        client,
        ns,
        ("agent", "agents"),
        (spec, &[OpenField::Command]),
        replicas,
    )
    .await
}
