//! Issue #52 item 2: more than one real node. The bed's second real node (`hack/second-node.sh`:
//! its own containerd, kubelet, kube-proxy and kube-router in a network namespace of its own) is
//! labelled and tainted `sandbox.iterion.io/real-node=second`, so every other real-node test stays
//! on the first; a run or template made with [`fleet_spec`] may land on either. The faults of two
//! nodes (one lost while a run or a pool's pods are on it) are in `chaos.rs` (`make chaos`).

use super::*;

/// The label both real nodes carry (`hack/real-node.sh` FLEET_LABEL).
pub(super) const FLEET_LABEL: &str = "sandbox.iterion.io/real-fleet";

/// The bed's second real node.
pub(super) fn second_node() -> String {
    bed_setting("SANDBOXRUN_TEST_SECOND_NODE")
}

/// [`real_spec`], free to land on either real node: it selects [`FLEET_LABEL`] and tolerates
/// the real nodes' taint whatever its value.
pub(super) fn fleet_spec(script: Option<&str>, paths: &[&str]) -> SandboxRunSpec {
    let mut spec = real_spec(script, paths);
    spec.node_selector = Some(BTreeMap::from([(
        FLEET_LABEL.to_string(),
        "true".to_string(),
    )]));
    spec.tolerations = Some(vec![Toleration {
        key: Some(REAL_NODE_LABEL.into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    }]);
    spec
}

/// The pool's pods not being deleted, each as (name, node, claimed).
pub(super) async fn pool_pods_by_node(
    client: &Client,
    ns: &str,
    pool: &str,
) -> Vec<(String, String, bool)> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("sandbox.iterion.io/pool={pool}")))
        .await
        .expect("list the pool's pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let claimed = p.labels().contains_key("sandbox.iterion.io/claimed-by");
            (p.name_any(), node, claimed)
        })
        .collect()
}

/// A warm pool's pods spread across the real nodes (the operator asks the scheduler to: a soft
/// topology spread over `kubernetes.io/hostname` among the pool's unclaimed pods), so one lost
/// node takes as few of them as can be. On the old code both pods went where the scheduler's
/// other scores put them (both on the first node, whose images were pulled already).
#[tokio::test]
async fn a_warm_pools_pods_spread_across_both_real_nodes() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "two-spread").await;
    let (_dir, store_url) = file_store("two-spread");
    let _op = start_operator_with(&ns.name, &store_url, &["--warm-pools"]);
    ready_pool(
        &client,
        &ns.name,
        fleet_spec(Some("exit 9"), &["/work/out"]),
        2,
    )
    .await;
    let pods = pool_pods_by_node(&client, &ns.name, "agents").await;
    let nodes: std::collections::BTreeSet<&str> =
        pods.iter().map(|(_, node, _)| node.as_str()).collect();
    let want =
        std::collections::BTreeSet::from([bed_setting("SANDBOXRUN_TEST_REAL_NODE"), second_node()]);
    assert_eq!(
        nodes,
        want.iter().map(String::as_str).collect(),
        "one ready pod on each real node: {pods:?}"
    );
}
