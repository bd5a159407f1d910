//! A run's image pull Secrets read as registry credentials for the no-pull image check
//! (`crate::registry`, [`super::resolvable`] what its answer means): the webhook's `--check-images`
//! (`crate::admission::webhook`) and the controller's pre-flight (`run --preflight-images`) read
//! them alike. Reads only, in the run's own namespace.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::Client;
use tracing::{debug, warn};

use crate::registry::RegistryCredentials;

/// Credentials from the run's pull secrets; unreadable secrets are skipped (the check then warns
/// at worst, per ADR-006's transient bucket). Also the controller's pre-flight's
/// (`run --preflight-images`).
pub(crate) async fn pull_credentials(
    client: &Client,
    namespace: &str,
    names: &[String],
) -> Option<RegistryCredentials> {
    if names.is_empty() {
        return None;
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut creds = RegistryCredentials::default();
    for name in names {
        match api.get_opt(name).await {
            Ok(Some(secret)) => {
                let data = secret.data.unwrap_or_default();
                if let Some(bytes) = data.get(".dockerconfigjson") {
                    match RegistryCredentials::from_docker_config(&bytes.0) {
                        Ok(c) => creds.extend(c),
                        Err(e) => {
                            warn!(secret = %name, %namespace, error = %e, "pull secret does not parse")
                        }
                    }
                }
            }
            Ok(None) => debug!(secret = %name, %namespace, "pull secret not found"),
            Err(e) => warn!(secret = %name, %namespace, error = %e, "cannot read pull secret"),
        }
    }
    Some(creds)
}
