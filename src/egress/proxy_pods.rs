//! The egress proxy's pod addresses as the operator sees them (docs/contract.md "A filtered run
//! never has an unfiltered instant"). A filtered run's egress gate probes the proxy's canary,
//! which no run's policy may let through; an address range the run allows may hold the proxy's
//! pods (a wide denylist always does), so while the gate waits the run's policy denies those
//! addresses ([`crate::egress::policy::policy_while_gated`]). This module keeps them: a watch of
//! the pods the proxy's NetworkPolicy peer selects, in the proxy's namespace.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tracing::warn;

use super::settings::PeerSelector;

/// The proxy's pods as the last watch event left them; none known without a watch (no proxy,
/// or a context built for a test).
#[derive(Clone, Default)]
pub(crate) struct ProxyPods(Option<Store<Pod>>);

impl ProxyPods {
    /// Starts watching the pods `selector` names (the proxy's), for as long as the process runs.
    /// A watch that fails (the list forbidden, the apiserver away) is retried with back-off;
    /// meanwhile no address is known, so a gate that probes the canary of a run whose ranges
    /// hold the proxy stays shut (it fails closed).
    pub(crate) fn watch(client: Client, selector: &PeerSelector) -> ProxyPods {
        let (reader, writer) = reflector::store();
        let api: Api<Pod> = Api::namespaced(client, &selector.namespace);
        let labels = label_selector(selector);
        let config = watcher::Config::default().labels(&labels);
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, config)
                .default_backoff()
                .modify(|pod| pod.metadata.managed_fields = None)
                .reflect(writer));
            while let Some(event) = events.next().await {
                if let Err(e) = event {
                    warn!(error = %e, "the watch of the egress proxy's pods failed; retried with back-off");
                }
            }
        });
        ProxyPods(Some(reader))
    }

    /// The addresses of the proxy's pods now (empty when none is known).
    pub(crate) fn addresses(&self) -> Vec<IpAddr> {
        match &self.0 {
            Some(store) => addresses_of(&store.state()),
            None => Vec::new(),
        }
    }
}

/// `key=value,…` of the selector's labels.
fn label_selector(selector: &PeerSelector) -> String {
    selector
        .pod_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Every address the pods have (each family of a dual-stack pod), sorted, once each; a pod
/// without an address yet adds none.
pub(crate) fn addresses_of(pods: &[Arc<Pod>]) -> Vec<IpAddr> {
    let mut out = BTreeSet::new();
    for status in pods.iter().filter_map(|p| p.status.as_ref()) {
        let listed = status.pod_ips.iter().flatten().map(|ip| ip.ip.as_str());
        for text in listed.chain(status.pod_ip.as_deref()) {
            if let Ok(addr) = text.trim().parse::<IpAddr>() {
                out.insert(addr);
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodIP, PodStatus};
    use std::collections::BTreeMap;

    fn pod(ip: Option<&str>, ips: &[&str]) -> Arc<Pod> {
        Arc::new(Pod {
            status: Some(PodStatus {
                pod_ip: ip.map(str::to_string),
                pod_ips: (!ips.is_empty())
                    .then(|| ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
                ..PodStatus::default()
            }),
            ..Pod::default()
        })
    }

    #[test]
    fn every_address_of_every_proxy_pod_once_and_none_of_a_pod_without_one() {
        let pods = [
            pod(Some("10.244.0.7"), &["10.244.0.7", "fd00::7"]),
            pod(Some("10.244.1.3"), &[]),
            pod(None, &[]),
            pod(Some("not an address"), &[]),
        ];
        let want: Vec<IpAddr> = ["10.244.0.7", "10.244.1.3", "fd00::7"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(addresses_of(&pods), want);
        assert!(addresses_of(&[]).is_empty());
        assert!(ProxyPods::default().addresses().is_empty());
    }

    #[test]
    fn the_watch_selects_the_proxys_labels() {
        let selector = PeerSelector {
            namespace: "sys".to_string(),
            pod_labels: BTreeMap::from([
                ("app".to_string(), "proxy".to_string()),
                ("tier".to_string(), "egress".to_string()),
            ]),
        };
        assert_eq!(label_selector(&selector), "app=proxy,tier=egress");
    }
}
