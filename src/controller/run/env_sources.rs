//! The reads of the Secrets and ConfigMaps a warm run's env takes values from
//! (`crate::pool::env`, issue #54; docs/contract.md "A warm run's env from Secrets and
//! ConfigMaps"): each object once, in the run's own namespace, its answer typed. Reads only: the
//! claim (`super::warm`) and a warm pod's hand-over after a restore (`super::workspace`) decide
//! what the answer means. The values go into the answer only, never a log line or an error.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;

use crate::controller::context::Context;
use crate::controller::error::{kube_err, ControllerError};
use crate::pool::env::{Kind, Object, Read, Source};

/// Reads, in the run's namespace `ns`, each Secret and ConfigMap a warm claim's env takes values
/// from (`crate::pool::env`, issue #54): the typed answer of each read (absent, forbidden, its
/// keys). The values go nowhere but into the answer: never a log line or an error.
pub(super) async fn read(
    ctx: &Context,
    ns: &str,
    sources: &[Source],
) -> Result<Read, ControllerError> {
    let mut read = Read::default();
    for (kind, name) in sources {
        let answer = match kind {
            Kind::Secret => Api::<Secret>::namespaced(ctx.client.clone(), ns)
                .get_opt(name)
                .await
                .map(|s| {
                    s.map(|s| {
                        let data = s.data.unwrap_or_default().into_iter();
                        data.map(|(k, v)| (k, v.0)).collect()
                    })
                }),
            Kind::ConfigMap => Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
                .get_opt(name)
                .await
                .map(|c| c.map(config_map_values)),
        };
        let object = match answer {
            Ok(Some(keys)) => Object::Found(keys),
            Ok(None) => Object::Absent,
            Err(kube::Error::Api(ae)) if ae.code == 403 => Object::Forbidden,
            Err(e) => return Err(kube_err(format!("read {kind} {name} for a warm claim"))(e)),
        };
        read.insert((*kind, name.clone()), object);
    }
    Ok(read)
}

/// A ConfigMap's keys as the kubelet reads them for `configMapKeyRef`: `data`, then
/// `binaryData`.
fn config_map_values(c: ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut keys: BTreeMap<String, Vec<u8>> = (c.binary_data.unwrap_or_default())
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for (k, v) in c.data.unwrap_or_default() {
        keys.insert(k, v.into_bytes());
    }
    keys
}
