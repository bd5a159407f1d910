//! The warm pools and their pods as the pools' controller's watches have them (docs/contract.md
//! "A warm claim reads its pool from the pools' watches"): the watches that wake a pool when it
//! or one of its pods changes also keep each, and a run's claim reads its pool and the pool's
//! pods here instead of listing them live. The claim's patch is guarded by the pod's
//! resourceVersion, so a copy older than the apiserver's only loses the race and picks again.
//! A claim lists live while its replica may have claimed a pod for the run a moment ago (the
//! watch may not show that claim yet), while a watch has not listed once, and when no pool of
//! the run's template is watched (one made a moment ago).
//!
//! The pods are kept without their managedFields (nothing reads them).

use std::sync::RwLock;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use kube::ResourceExt;

use super::pod::POOL_LABEL;
use crate::api::{SandboxRunPool, TemplateRef};

/// The stores of the pools' controller's watches: its pools and their pods, per scope (each
/// namespace of `run --namespaces`, or one for every namespace).
#[derive(Default)]
pub struct WatchedPools {
    scopes: RwLock<Vec<(Store<SandboxRunPool>, Store<Pod>)>>,
}

/// Whether a watch has listed its objects once.
fn listed<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|r| r.is_ok())
}

impl WatchedPools {
    /// Adds the stores of one more scope's watches: its pools and their pods.
    pub fn add(&self, pools: Store<SandboxRunPool>, pods: Store<Pod>) {
        if let Ok(mut scopes) = self.scopes.write() {
            scopes.push((pools, pods));
        }
    }

    /// The pool of `namespace` that serves `reference`, as the watch has it; None when no
    /// watched pool does, or a watch has not listed yet (the pools are then listed live).
    pub fn pool_for(&self, namespace: &str, reference: &TemplateRef) -> Option<SandboxRunPool> {
        let scopes = self.scopes.read().ok()?;
        if scopes.is_empty() || !scopes.iter().all(|(pools, _)| listed(pools)) {
            return None;
        }
        let serves = |pool: &SandboxRunPool| {
            pool.metadata.namespace.as_deref() == Some(namespace)
                && &pool.spec.template_ref == reference
        };
        let pool = scopes.iter().find_map(|(pools, _)| pools.find(serves))?;
        Some(SandboxRunPool::clone(&pool))
    }

    /// The pool `name` of `namespace`, as the watch has it (None: not watched, or not yet).
    pub fn named(&self, namespace: &str, name: &str) -> Option<SandboxRunPool> {
        let scopes = self.scopes.read().ok()?;
        let key = kube::runtime::reflector::ObjectRef::new(name).within(namespace);
        let pool = scopes.iter().find_map(|(pools, _)| pools.get(&key))?;
        Some(SandboxRunPool::clone(&pool))
    }

    /// The pods of `namespace` whose pool label is `pool` (the pool's [`super::pod::label_value`]),
    /// claimed ones too; None until every watch has listed its pods once (a replica just
    /// started lists live).
    pub fn of_pool(&self, namespace: &str, pool: &str) -> Option<Vec<Pod>> {
        let scopes = self.scopes.read().ok()?;
        if scopes.is_empty() || !scopes.iter().all(|(_, pods)| listed(pods)) {
            return None;
        }
        let of_pool = |pod: &Pod| {
            pod.metadata.namespace.as_deref() == Some(namespace)
                && pod.labels().get(POOL_LABEL).map(String::as_str) == Some(pool)
        };
        let pods = scopes
            .iter()
            .flat_map(|(_, pods)| pods.state_filter(of_pool));
        Some(pods.map(|pod| Pod::clone(&pod)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn pod(namespace: &str, name: &str, pool: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some(namespace.into());
        pod.metadata.labels = Some([(POOL_LABEL.to_string(), pool.to_string())].into());
        pod
    }

    fn pool(namespace: &str, name: &str, template: &str) -> SandboxRunPool {
        let mut pool = SandboxRunPool::new(
            name,
            serde_json::from_value(serde_json::json!(
            {"templateRef": {"name": template}, "replicas": 1}))
            .unwrap(),
        );
        pool.metadata.namespace = Some(namespace.into());
        pool
    }

    fn listed_pools(pools: &[SandboxRunPool]) -> Store<SandboxRunPool> {
        let (reader, mut writer) = kube::runtime::reflector::store::<SandboxRunPool>();
        writer.apply_watcher_event(&Event::Init);
        for p in pools {
            writer.apply_watcher_event(&Event::InitApply(p.clone()));
        }
        writer.apply_watcher_event(&Event::InitDone);
        reader
    }

    fn reference(template: &str) -> TemplateRef {
        TemplateRef {
            name: template.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_pool_of_a_template_is_its_namespaces_once_every_watch_listed_them() {
        let watched = WatchedPools::default();
        assert!(
            watched.pool_for("ns", &reference("t")).is_none(),
            "no watch yet"
        );
        let pools = [
            pool("ns", "a", "t"),
            pool("ns", "b", "u"),
            pool("other", "c", "v"),
        ];
        let (pods, _) = kube::runtime::reflector::store::<Pod>();
        watched.add(listed_pools(&pools), pods);
        let found = watched
            .pool_for("ns", &reference("t"))
            .map(|p| p.name_any());
        assert_eq!(found.as_deref(), Some("a"));
        assert!(
            watched.pool_for("ns", &reference("v")).is_none(),
            "another namespace's"
        );
        assert!(
            watched.pool_for("ns", &reference("w")).is_none(),
            "no pool serves it"
        );
        // A second scope whose pool watch has not listed yet: every pool is listed live.
        let (unlisted, _) = kube::runtime::reflector::store::<SandboxRunPool>();
        let (pods, _) = kube::runtime::reflector::store::<Pod>();
        watched.add(unlisted, pods);
        assert!(watched.pool_for("ns", &reference("t")).is_none());
    }

    #[test]
    fn a_pools_pods_are_its_namespaces_with_its_label_once_every_watch_listed_them() {
        let watched = WatchedPools::default();
        assert!(watched.of_pool("ns", "a").is_none(), "no watch yet");
        let (listed, mut writer) = kube::runtime::reflector::store::<Pod>();
        for event in [
            Event::Init,
            Event::InitApply(pod("ns", "a-1", "a")),
            Event::InitApply(pod("ns", "b-1", "b")),
            Event::InitApply(pod("other", "a-2", "a")),
            Event::InitDone,
            Event::Apply(pod("ns", "a-3", "a")),
        ] {
            writer.apply_watcher_event(&event);
        }
        watched.add(listed_pools(&[]), listed);
        let mut names: Vec<String> = watched
            .of_pool("ns", "a")
            .expect("listed")
            .iter()
            .map(|p| p.name_any())
            .collect();
        names.sort();
        assert_eq!(names, ["a-1", "a-3"]);
        // A second watch that has not listed yet: the pods are listed live.
        let (unlisted, mut writer) = kube::runtime::reflector::store::<Pod>();
        writer.apply_watcher_event(&Event::Init);
        watched.add(listed_pools(&[]), unlisted);
        assert!(watched.of_pool("ns", "a").is_none());
    }
}
