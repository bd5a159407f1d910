//! `sandboxrun_pool_pods{pool_namespace, pool, state}`: each pool's pods by state, as the pool's
//! status last said them — what an autoscaler scales a pool on (docs/user-guide.md "Scaling a
//! pool with a HorizontalPodAutoscaler"). Read from the pools' controller's cache at each scrape,
//! so a deleted pool's series goes with it; exported only by the replica that serves the pool
//! (with sharding, the one holding its shard), so no series is doubled.

use std::sync::Arc;

use kube::runtime::reflector::Store;
use kube::ResourceExt;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{opts, IntGaugeVec};

use crate::api::SandboxRunPool;

/// The metric's name (the registry adds the `sandboxrun_` prefix).
pub const POOL_PODS_METRIC: &str = "pool_pods";

/// One pool's pods by state: `claimed` (runs hold them), `ready` (unclaimed, of the current
/// template version, ready to be claimed), `pending` (unclaimed, current, not ready yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolRow {
    pub namespace: String,
    pub pool: String,
    pub claimed: i32,
    pub ready: i32,
    pub pending: i32,
}

/// The rows of the `pools` this replica `serves`, from their statuses (a pool not looked at yet,
/// without a status, has none). Pure.
pub fn rows<'a>(
    pools: impl IntoIterator<Item = &'a SandboxRunPool>,
    serves: impl Fn(&SandboxRunPool) -> bool,
) -> Vec<PoolRow> {
    pools
        .into_iter()
        .filter(|p| serves(p))
        .filter_map(|p| {
            let s = p.status.as_ref()?;
            Some(PoolRow {
                namespace: p.namespace()?,
                pool: p.name_any(),
                claimed: s.claimed,
                ready: s.ready_replicas,
                pending: s.pending_replicas,
            })
        })
        .collect()
}

/// Whether this replica serves a pool (without sharding: every pool it watches).
pub type Serves = Box<dyn Fn(&SandboxRunPool) -> bool + Send + Sync>;

/// The collector: the pools' controller's caches, read at each scrape.
pub struct PoolGauges {
    stores: Vec<Store<SandboxRunPool>>,
    serves: Serves,
    /// Never set: it only describes the metric.
    described: IntGaugeVec,
}

fn gauges() -> Result<IntGaugeVec, prometheus::Error> {
    IntGaugeVec::new(
        opts!(
            POOL_PODS_METRIC,
            "A warm pool's pods by state (claimed, ready, pending), as its status says them"
        ),
        &["pool_namespace", "pool", "state"],
    )
}

impl PoolGauges {
    /// The collector of the pools in `stores` that this replica `serves`.
    pub fn new(
        stores: Vec<Store<SandboxRunPool>>,
        serves: Serves,
    ) -> Result<PoolGauges, prometheus::Error> {
        Ok(PoolGauges {
            stores,
            serves,
            described: gauges()?,
        })
    }
}

impl Collector for PoolGauges {
    fn desc(&self) -> Vec<&Desc> {
        self.described.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Ok(vec) = gauges() else {
            return Vec::new();
        };
        for store in &self.stores {
            let pools: Vec<Arc<SandboxRunPool>> = store.state();
            for row in rows(pools.iter().map(|p| p.as_ref()), &self.serves) {
                for (state, n) in [
                    ("claimed", row.claimed),
                    ("ready", row.ready),
                    ("pending", row.pending),
                ] {
                    vec.with_label_values(&[row.namespace.as_str(), &row.pool, state])
                        .set(i64::from(n));
                }
            }
        }
        vec.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SandboxRunPoolSpec, SandboxRunPoolStatus, TemplateRef};

    fn pool(ns: &str, name: &str, status: Option<(i32, i32, i32)>) -> SandboxRunPool {
        let mut pool = SandboxRunPool::new(
            name,
            SandboxRunPoolSpec {
                template_ref: TemplateRef::namespaced("agent"),
                replicas: 2,
            },
        );
        pool.metadata.namespace = Some(ns.into());
        pool.status = status.map(|(claimed, ready, pending)| SandboxRunPoolStatus {
            claimed,
            ready_replicas: ready,
            pending_replicas: pending,
            ..Default::default()
        });
        pool
    }

    #[test]
    fn a_pools_pods_are_exported_by_state_from_its_status_only_where_it_is_served() {
        let pools = [
            pool("team-a", "agents", Some((3, 1, 1))),
            pool("team-b", "agents", Some((0, 2, 0))),
            pool("team-a", "new", None),
        ];
        let all = rows(&pools, |_| true);
        assert_eq!(
            all,
            [
                PoolRow {
                    namespace: "team-a".into(),
                    pool: "agents".into(),
                    claimed: 3,
                    ready: 1,
                    pending: 1,
                },
                PoolRow {
                    namespace: "team-b".into(),
                    pool: "agents".into(),
                    claimed: 0,
                    ready: 2,
                    pending: 0,
                },
            ]
        );
        let served = rows(&pools, |p| p.namespace().as_deref() == Some("team-b"));
        assert_eq!(served.len(), 1);
        assert_eq!(served[0].namespace, "team-b");
    }

    #[test]
    fn the_collector_renders_a_series_per_pool_and_state_and_a_deleted_pool_has_none() {
        let (store, mut writer) = kube::runtime::reflector::store::<SandboxRunPool>();
        let registry = prometheus::Registry::new_custom(Some("sandboxrun".into()), None).unwrap();
        let gauges = PoolGauges::new(vec![store], Box::new(|_| true)).unwrap();
        registry.register(Box::new(gauges)).unwrap();
        let agents = pool("team-a", "agents", Some((3, 1, 0)));
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(agents.clone()));
        let text = |r: &prometheus::Registry| {
            let mut buf = Vec::new();
            prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut buf)
                .unwrap();
            String::from_utf8(buf).unwrap()
        };
        let seen = text(&registry);
        let series =
            r#"sandboxrun_pool_pods{pool="agents",pool_namespace="team-a",state="claimed"} 3"#;
        assert!(seen.contains(series), "{seen}");
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Delete(agents));
        assert!(!text(&registry).contains("team-a"), "{}", text(&registry));
    }
}
