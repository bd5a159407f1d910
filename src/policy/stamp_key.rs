//! The key of the admission stamps ([`super::stamp`]): 32 random bytes in a Secret of the
//! operator's namespace (`run --admission-key-secret`), created by the first replica that finds
//! none, read by every other (a create that loses the race reads the winner's). The only I/O of
//! the stamps.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use ring::rand::{SecureRandom, SystemRandom};

use super::stamp::StampKey;

/// The Secret's key holding the stamp key.
const DATA_KEY: &str = "key";

/// Why the key could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StampKeyError {
    /// The apiserver refused the read or the create.
    #[error("the admission key Secret {namespace}/{name}: {source}")]
    Kube {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The Secret has no usable key.
    #[error(
        "the admission key Secret {namespace}/{name} has no `{DATA_KEY}` of at least 32 bytes"
    )]
    Unusable {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// No randomness.
    #[error("no random bytes for the admission key")]
    Random,
}

/// The stamp key in Secret `namespace/name`, created when missing.
pub(crate) async fn load_or_create(
    client: Client,
    namespace: &str,
    name: &str,
) -> Result<StampKey, StampKeyError> {
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let kube = |source| StampKeyError::Kube {
        namespace: namespace.to_string(),
        name: name.to_string(),
        source,
    };
    let secret = match secrets.get_opt(name).await.map_err(kube)? {
        Some(secret) => secret,
        None => match secrets.create(&PostParams::default(), &fresh(name)?).await {
            Ok(created) => created,
            // Another replica created it first: theirs is the key.
            Err(kube::Error::Api(e)) if e.code == 409 => secrets.get(name).await.map_err(kube)?,
            Err(e) => return Err(kube(e)),
        },
    };
    let bytes = secret
        .data
        .and_then(|mut d| d.remove(DATA_KEY))
        .map(|b| b.0)
        .filter(|b| b.len() >= 32)
        .ok_or_else(|| StampKeyError::Unusable {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })?;
    Ok(StampKey::new(&bytes))
}

/// A new key Secret named `name`.
fn fresh(name: &str) -> Result<Secret, StampKeyError> {
    let mut bytes = [0u8; 32];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| StampKeyError::Random)?;
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "sandboxrun-operator".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        data: Some([(DATA_KEY.to_string(), ByteString(bytes.to_vec()))].into()),
        ..Default::default()
    })
}
