//! A store per namespace, the reads (docs/contract.md "A store per namespace"): the store a run
//! uses, resolved when it is needed (a drain, a pod-lost record, a retention delete, `files`)
//! from its namespace's store ConfigMap and Secret with the caller's client, and built at once.
//! Nothing is cached: the credentials live as long as the returned store, one run's teardown.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};
use object_store::path::Path;
use object_store::ObjectStore;

use super::tenant::{self, StoreChoice, TenantStoreError, TenantStorePolicy, KEY_SECRET_NAME};

/// The store one run uses.
#[derive(Clone)]
pub struct RunStore {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// Key prefix inside it.
    pub prefix: Path,
    /// Its URL (object URLs in status).
    pub url: String,
    /// `namespace/name` of the tenant's store ConfigMap; None: the operator's store.
    pub tenant: Option<String>,
}

impl std::fmt::Debug for RunStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStore")
            .field("url", &self.url)
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

impl PartialEq for RunStore {
    /// The same store as far as a run can tell: its URL, key prefix and ConfigMap (an object
    /// store has no equality of its own).
    fn eq(&self, other: &RunStore) -> bool {
        self.url == other.url && self.prefix == other.prefix && self.tenant == other.tenant
    }
}

impl RunStore {
    /// How a message names this store.
    pub fn describe(&self) -> String {
        match &self.tenant {
            Some(cm) => format!("the store of ConfigMap {cm} ({})", self.url),
            None => format!("the operator's store ({})", self.url),
        }
    }
}

/// The store the run in `namespace` with `store_ref` uses: `operator` when its namespace names
/// none (or tenant stores are off), else the tenant store its ConfigMap and Secret describe, read
/// with `client`. Never the operator's store in place of a tenant's that cannot be used.
pub async fn resolve(
    client: &Client,
    namespace: &str,
    store_ref: Option<&str>,
    policy: &TenantStorePolicy,
    operator: impl FnOnce() -> RunStore,
) -> Result<RunStore, TenantStoreError> {
    let Some(tenant) = tenant_of(client, namespace, store_ref, policy).await? else {
        return Ok(operator());
    };
    let (built, prefix) = tenant
        .config
        .build()
        .map_err(|source| TenantStoreError::Store {
            store: tenant.store.clone(),
            source: Box::new(source),
        })?;
    Ok(RunStore {
        store: built,
        prefix,
        url: tenant.url,
        tenant: Some(tenant.store),
    })
}

/// The tenant store the run in `namespace` with `store_ref` uses, judged as the operator judges
/// it (`policy`: the endpoints, the Secret names), read with `client`: None when the run uses the
/// operator's store. `doctor --context` asks the same question with its user's client.
pub async fn tenant_of(
    client: &Client,
    namespace: &str,
    store_ref: Option<&str>,
    policy: &TenantStorePolicy,
) -> Result<Option<tenant::TenantStore>, TenantStoreError> {
    let (name, named_by_run) = match tenant::choose(namespace, store_ref, policy)? {
        StoreChoice::Operator => return Ok(None),
        StoreChoice::ConfigMap { name, named_by_run } => (name, named_by_run),
    };
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let configmap = match configmaps.get_opt(&name).await {
        Ok(Some(cm)) => cm,
        Ok(None) if !named_by_run => return Ok(None),
        Ok(None) => return Err(missing("ConfigMap", namespace, &name)),
        Err(e) => return Err(unreadable("ConfigMap", namespace, &name, e)),
    };
    let data = configmap.data.unwrap_or_default();
    let store = format!("{namespace}/{name}");
    let secret_name = data
        .get(KEY_SECRET_NAME)
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| TenantStoreError::Invalid {
            store: store.clone(),
            reason: format!(
                "it has no {KEY_SECRET_NAME:?} key (the Secret of this namespace holding its credentials)"
            ),
        })?;
    if let Some(refused) = policy.secret_refused(&store, &secret_name) {
        return Err(refused);
    }
    // The Secret's errors name the store too: a drain that fails says which store it was.
    let credentials = |e| match e {
        e @ TenantStoreError::Transient { .. } => e,
        e => TenantStoreError::Credentials {
            store: store.clone(),
            source: Box::new(e),
        },
    };
    let secret = fetch_secret(client, namespace, &secret_name)
        .await
        .map_err(credentials)?;
    // Whoever may edit the ConfigMap may name any Secret: only a Secret that says so is used.
    tenant::secret_consents(
        &store,
        namespace,
        &secret_name,
        secret.metadata.labels.as_ref(),
    )?;
    let secret = secret_text(namespace, &secret_name, secret).map_err(credentials)?;
    tenant::tenant_store(&store, &data, &secret, policy).map(Some)
}

/// The namespace's store as `files` reads it, with the reader's own `client` (its right to read
/// the ConfigMap and the Secret): None when the namespace names none (the run's `storeRef`, else
/// `sandboxrun-store`). No platform allowlist: the reader is not the operator.
pub async fn for_reader(
    client: &Client,
    namespace: &str,
    store_ref: Option<&str>,
) -> Result<Option<tenant::TenantStore>, TenantStoreError> {
    let name = store_ref.unwrap_or(tenant::DEFAULT_STORE_CONFIGMAP);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let configmap = match configmaps.get_opt(name).await {
        Ok(Some(cm)) => cm,
        Ok(None) => return Ok(None),
        Err(e) => return Err(unreadable("ConfigMap", namespace, name, e)),
    };
    let data = configmap.data.unwrap_or_default();
    let store = format!("{namespace}/{name}");
    let Some(secret_name) = data.get(KEY_SECRET_NAME).map(|s| s.trim().to_string()) else {
        return Err(TenantStoreError::Invalid {
            store,
            reason: format!("it has no {KEY_SECRET_NAME:?} key"),
        });
    };
    let secret = read_secret(client, namespace, &secret_name).await?;
    tenant::for_reader(&store, &data, &secret).map(Some)
}

/// The Secret's data as text (a key that is not UTF-8 is refused by name).
async fn read_secret(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<BTreeMap<String, String>, TenantStoreError> {
    let secret = fetch_secret(client, namespace, name).await?;
    secret_text(namespace, name, secret)
}

/// The Secret `namespace/name`, or why it cannot be had.
async fn fetch_secret(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Secret, TenantStoreError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match secrets.get_opt(name).await {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err(missing("Secret", namespace, name)),
        Err(e) => Err(unreadable("Secret", namespace, name, e)),
    }
}

/// `secret`'s data as text (a key that is not UTF-8 is refused by name).
fn secret_text(
    namespace: &str,
    name: &str,
    secret: Secret,
) -> Result<BTreeMap<String, String>, TenantStoreError> {
    let mut out = BTreeMap::new();
    for (key, value) in secret.data.unwrap_or_default() {
        let text = String::from_utf8(value.0).map_err(|_| TenantStoreError::Unreadable {
            kind: "Secret",
            namespace: namespace.into(),
            name: name.into(),
            reason: format!("its key {key:?} is not UTF-8 text"),
        })?;
        out.insert(key, text);
    }
    for (key, value) in secret.string_data.unwrap_or_default() {
        out.insert(key, value);
    }
    Ok(out)
}

fn missing(kind: &'static str, namespace: &str, name: &str) -> TenantStoreError {
    TenantStoreError::Missing {
        kind,
        namespace: namespace.into(),
        name: name.into(),
    }
}

fn unreadable(kind: &'static str, namespace: &str, name: &str, e: kube::Error) -> TenantStoreError {
    let reason = match &e {
        kube::Error::Api(ae) if ae.code == 403 => format!(
            "Forbidden ({}): the reader needs get on {}s in this namespace (the operator's: chart value tenantStores.enabled)",
            ae.message,
            kind.to_ascii_lowercase()
        ),
        kube::Error::Api(ae) if ae.code < 500 && ae.code != 429 => e.to_string(),
        // Unreachable, overloaded or failing: may pass.
        _ => {
            return TenantStoreError::Transient {
                kind,
                namespace: namespace.into(),
                name: name.into(),
                source: Box::new(e),
            }
        }
    };
    TenantStoreError::Unreadable {
        kind,
        namespace: namespace.into(),
        name: name.into(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("words", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn a_read_that_may_pass_is_transient_and_a_refusal_is_a_verdict_with_its_fix() {
        for code in [500, 503, 429] {
            assert!(
                matches!(
                    unreadable("Secret", "team", "creds", api(code)),
                    TenantStoreError::Transient { .. }
                ),
                "{code}"
            );
        }
        let forbidden = unreadable("Secret", "team", "creds", api(403)).to_string();
        assert!(
            forbidden.contains("team/creds")
                && forbidden.contains("get on secrets")
                && forbidden.contains("tenantStores.enabled"),
            "{forbidden}"
        );
        assert!(matches!(
            unreadable("ConfigMap", "team", "s", api(400)),
            TenantStoreError::Unreadable { .. }
        ));
    }
}
