//! Writes the operator's [`PublishedSettings`] into its settings ConfigMap (`run
//! --settings-configmap`, docs/contract.md ADR-006 §3): at start, then every
//! [`HEARTBEAT_INTERVAL`] while the operator is Ready, by server-side apply under the operator's
//! field manager (the operator owns every field it writes). A write that fails is logged and
//! tried again at the next beat: publishing never stops the operator.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::{Api, Client};
use tracing::{debug, warn};

use crate::names::MANAGER;
use crate::policy::published::{
    PublishedSettings, HEARTBEAT_INTERVAL, SETTINGS_FORMAT, SETTINGS_LABEL,
};

/// How often a publisher waiting for the operator to be Ready looks again.
const NOT_READY_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// The ConfigMap that carries `settings` (heartbeat set by the caller).
pub(crate) fn settings_configmap(
    namespace: &str,
    name: &str,
    settings: &PublishedSettings,
) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (SETTINGS_LABEL.to_string(), SETTINGS_FORMAT.to_string()),
                (
                    "app.kubernetes.io/managed-by".to_string(),
                    MANAGER.to_string(),
                ),
            ])),
            ..Default::default()
        },
        data: Some(settings.to_data()),
        ..Default::default()
    }
}

/// Publishes `settings` as `namespace/name` as soon as `ready` holds and at every beat while it
/// does, until the process ends. Spawn it.
pub(crate) async fn publish_forever(
    client: Client,
    namespace: String,
    name: String,
    settings: PublishedSettings,
    ready: Arc<AtomicBool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let params = PatchParams::apply(MANAGER).force();
    let mut last_error: Option<String> = None;
    loop {
        if !ready.load(Ordering::SeqCst) {
            // Not Ready (yet): no heartbeat, so doctor does not call this operator live.
            tokio::time::sleep(NOT_READY_POLL).await;
            continue;
        }
        {
            let beat = PublishedSettings {
                heartbeat: Some(Timestamp::now()),
                ..settings.clone()
            };
            let cm = settings_configmap(&namespace, &name, &beat);
            match api.patch(&name, &params, &Patch::Apply(&cm)).await {
                Ok(_) => {
                    if last_error.take().is_some() {
                        warn!(%namespace, %name, "operator settings published again");
                    }
                    debug!(%namespace, %name, "operator settings published");
                }
                Err(e) => {
                    let text = e.to_string();
                    // Once per distinct error, not once a minute.
                    if last_error.as_deref() != Some(text.as_str()) {
                        warn!(%namespace, %name, error = %text,
                            "cannot publish the operator settings; doctor --context will judge with its own flags");
                    }
                    last_error = Some(text);
                }
            }
        }
        tokio::time::sleep(HEARTBEAT_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::RuleSettings;

    #[test]
    fn the_configmap_is_labelled_for_doctor_and_carries_the_record() {
        let s = PublishedSettings {
            rules: RuleSettings::default(),
            default_drain_timeout: std::time::Duration::from_secs(300),
            drain_wire: Default::default(),
            image_pull_timeout: std::time::Duration::from_secs(300),
            check_images: false,
            preflight_images: true,
            webhook: true,
            pod: "p".into(),
            version: "v".into(),
            heartbeat: None,
            watched_namespaces: Vec::new(),
            tenant_stores: None,
        };
        let cm = settings_configmap("sys", "sbr-settings", &s);
        let labels = cm.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(SETTINGS_LABEL).map(String::as_str),
            Some(SETTINGS_FORMAT)
        );
        assert_eq!(
            PublishedSettings::from_data(&cm.data.unwrap_or_default()),
            Ok(s)
        );
        assert_eq!(cm.metadata.namespace.as_deref(), Some("sys"));
    }
}
