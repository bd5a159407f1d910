//! Self-managed webhook certificates: a private CA and a serving certificate for the webhook's
//! Service names, kept in a Secret, with the CA published in the ValidatingWebhookConfiguration's
//! `caBundle`. The certificate logic is pure (time passed in, PEM in and out) and unit-tested; the
//! Kubernetes part is three thin calls at the bottom.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use thiserror::Error;
use tracing::info;

/// Secret keys. `tls.crt`/`tls.key` make it a valid `kubernetes.io/tls` Secret.
pub(crate) const TLS_CRT: &str = "tls.crt";
/// Serving key.
pub(crate) const TLS_KEY: &str = "tls.key";
/// CA certificate (the caBundle).
pub(crate) const CA_CRT: &str = "ca.crt";
/// CA key (kept so the serving cert can be re-issued without changing the caBundle).
pub(crate) const CA_KEY: &str = "ca.key";

/// Subject of the private CA. Fixed, because re-issuing a serving cert from a stored CA key
/// rebuilds the issuer from it.
const CA_COMMON_NAME: &str = "sandboxrun-operator webhook CA";

/// Why certificates cannot be made, read or stored.
#[derive(Debug, Error)]
pub enum CertError {
    /// rcgen refused (bad name, key error).
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// A PEM certificate does not parse.
    #[error("certificate does not parse: {0}")]
    Parse(String),
    /// A time is outside what a certificate can carry.
    #[error("time out of range: {0}")]
    Time(String),
    /// The Secret lacks a key.
    #[error("secret {0} has no {1}")]
    MissingKey(String, &'static str),
    /// The Kubernetes API refused.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
}

/// A CA and a serving certificate, all PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertBundle {
    /// CA certificate (goes into caBundle).
    pub ca_cert_pem: String,
    /// CA private key.
    pub ca_key_pem: String,
    /// Serving certificate.
    pub cert_pem: String,
    /// Serving private key.
    pub key_pem: String,
}

fn to_offset(t: SystemTime) -> Result<time::OffsetDateTime, CertError> {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_err(|e| CertError::Time(e.to_string()))?
        .as_secs();
    let secs = i64::try_from(secs).map_err(|e| CertError::Time(e.to_string()))?;
    time::OffsetDateTime::from_unix_timestamp(secs).map_err(|e| CertError::Time(e.to_string()))
}

fn ca_params(now: SystemTime, validity: Duration) -> Result<CertificateParams, CertError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name
        .push(DnType::CommonName, CA_COMMON_NAME);
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // Backdate a little: clocks across the apiserver and this pod are not perfectly in sync.
    p.not_before = to_offset(now - Duration::from_secs(300))?;
    p.not_after = to_offset(now + validity)?;
    Ok(p)
}

/// Generates a fresh CA and a serving certificate for `names` (DNS names or IP literals, e.g.
/// `sandboxrun-operator-webhook.sandboxrun-system.svc`, `127.0.0.1`). The CA lives twice as long
/// as `validity` so a serving cert can be re-issued before the caBundle has to change.
pub fn generate(
    names: &[String],
    now: SystemTime,
    validity: Duration,
) -> Result<CertBundle, CertError> {
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params(now, validity * 2)?.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let (cert_pem, key_pem) = issue_serving(&ca_key_pem, names, now, validity)?;
    Ok(CertBundle {
        ca_cert_pem: ca_cert.pem(),
        ca_key_pem,
        cert_pem,
        key_pem,
    })
}

/// Issues a serving certificate for `names` signed by the stored CA key. Returns (cert, key) PEM.
pub(crate) fn issue_serving(
    ca_key_pem: &str,
    names: &[String],
    now: SystemTime,
    validity: Duration,
) -> Result<(String, String), CertError> {
    let ca_key = KeyPair::from_pem(ca_key_pem)?;
    // The issuer is rebuilt from the fixed CA subject and the CA key: the issuer name and the
    // authority key id then match the stored CA certificate.
    let issuer = Issuer::new(ca_params(now, validity)?, ca_key);
    let mut p = CertificateParams::new(names.to_vec())?;
    if let Some(first) = names.first() {
        p.distinguished_name
            .push(DnType::CommonName, first.as_str());
    }
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.use_authority_key_identifier_extension = true;
    p.not_before = to_offset(now - Duration::from_secs(300))?;
    p.not_after = to_offset(now + validity)?;
    let key = KeyPair::generate()?;
    let cert = p.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// notAfter of a PEM certificate.
pub(crate) fn not_after(cert_pem: &str) -> Result<SystemTime, CertError> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| CertError::Parse(e.to_string()))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| CertError::Parse(e.to_string()))?;
    let ts = cert.validity().not_after.timestamp();
    let secs = u64::try_from(ts).map_err(|_| CertError::Parse("notAfter before 1970".into()))?;
    Ok(UNIX_EPOCH + Duration::from_secs(secs))
}

/// DNS and IP subject alternative names of a PEM certificate, as strings.
pub fn subject_alt_names(cert_pem: &str) -> Result<Vec<String>, CertError> {
    use x509_parser::extensions::GeneralName;
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| CertError::Parse(e.to_string()))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| CertError::Parse(e.to_string()))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| CertError::Parse(e.to_string()))?;
    let mut out = Vec::new();
    for name in san
        .map(|s| s.value.general_names.clone())
        .unwrap_or_default()
    {
        match name {
            GeneralName::DNSName(d) => out.push(d.to_string()),
            GeneralName::IPAddress(b) => match b.len() {
                4 => out.push(std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string()),
                16 => {
                    let mut a = [0u8; 16];
                    a.copy_from_slice(b);
                    out.push(std::net::Ipv6Addr::from(a).to_string());
                }
                _ => {}
            },
            _ => {}
        }
    }
    Ok(out)
}

/// Whether the certificate expires within `before` of `now` (or already has, or does not parse:
/// a certificate we cannot read is one we must replace).
pub(crate) fn needs_rotation(cert_pem: &str, now: SystemTime, before: Duration) -> bool {
    match not_after(cert_pem) {
        Ok(end) => end <= now + before,
        Err(_) => true,
    }
}

/// What to do with the stored bundle.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    /// Keep it.
    Keep,
    /// Re-issue the serving cert from the stored CA (caBundle unchanged).
    ReissueServing,
    /// New CA and serving cert (caBundle changes).
    Regenerate,
}

/// Decides rotation: the CA first (it must outlive the serving cert), then the serving cert's
/// expiry and names (a renamed Service needs a new certificate).
pub(crate) fn plan(
    bundle: &CertBundle,
    names: &[String],
    now: SystemTime,
    before: Duration,
) -> Plan {
    if needs_rotation(&bundle.ca_cert_pem, now, before * 2)
        || KeyPair::from_pem(&bundle.ca_key_pem).is_err()
    {
        return Plan::Regenerate;
    }
    let names_ok = subject_alt_names(&bundle.cert_pem)
        .is_ok_and(|have| names.iter().all(|n| have.contains(n)));
    if needs_rotation(&bundle.cert_pem, now, before) || !names_ok {
        return Plan::ReissueServing;
    }
    Plan::Keep
}

/// The Secret holding `bundle`.
pub(crate) fn bundle_to_secret(name: &str, namespace: &str, bundle: &CertBundle) -> Secret {
    let data: BTreeMap<String, ByteString> = [
        (TLS_CRT, &bundle.cert_pem),
        (TLS_KEY, &bundle.key_pem),
        (CA_CRT, &bundle.ca_cert_pem),
        (CA_KEY, &bundle.ca_key_pem),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(data),
        ..Default::default()
    }
}

/// The bundle in a Secret.
pub(crate) fn bundle_from_secret(secret: &Secret) -> Result<CertBundle, CertError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let data = secret.data.clone().unwrap_or_default();
    let get = |k: &'static str| -> Result<String, CertError> {
        data.get(k)
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| CertError::MissingKey(name.clone(), k))
    };
    Ok(CertBundle {
        ca_cert_pem: get(CA_CRT)?,
        ca_key_pem: get(CA_KEY)?,
        cert_pem: get(TLS_CRT)?,
        key_pem: get(TLS_KEY)?,
    })
}

/// Loads the bundle from the Secret, creating or rotating it as [`plan`] says, and stores any
/// change. Several replicas serve the webhook and may start together: create and replace carry
/// optimistic concurrency, and the loser of a race (409) reads what the winner stored instead of
/// failing, so every replica ends up serving the same certificate.
pub async fn ensure_secret(
    api: &Api<Secret>,
    name: &str,
    namespace: &str,
    names: &[String],
    now: SystemTime,
    validity: Duration,
    rotate_before: Duration,
) -> Result<CertBundle, CertError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match ensure_secret_once(api, name, namespace, names, now, validity, rotate_before).await {
            Err(CertError::Kube(kube::Error::Api(ae))) if ae.code == 409 && tries < 3 => {
                info!(
                    secret = name,
                    "another replica stored the webhook certificates first; reading them"
                );
            }
            other => return other,
        }
    }
}

async fn ensure_secret_once(
    api: &Api<Secret>,
    name: &str,
    namespace: &str,
    names: &[String],
    now: SystemTime,
    validity: Duration,
    rotate_before: Duration,
) -> Result<CertBundle, CertError> {
    match api.get_opt(name).await? {
        None => {
            let bundle = generate(names, now, validity)?;
            api.create(
                &PostParams::default(),
                &bundle_to_secret(name, namespace, &bundle),
            )
            .await?;
            info!(secret = name, "created webhook certificates");
            Ok(bundle)
        }
        Some(existing) => {
            let current = bundle_from_secret(&existing).ok();
            let next = match current.as_ref().map(|b| plan(b, names, now, rotate_before)) {
                Some(Plan::Keep) => {
                    return current.ok_or_else(|| CertError::MissingKey(name.to_string(), TLS_CRT))
                }
                Some(Plan::ReissueServing) => {
                    let mut b =
                        current.ok_or_else(|| CertError::MissingKey(name.to_string(), CA_KEY))?;
                    let (cert, key) = issue_serving(&b.ca_key_pem, names, now, validity)?;
                    b.cert_pem = cert;
                    b.key_pem = key;
                    b
                }
                Some(Plan::Regenerate) | None => generate(names, now, validity)?,
            };
            let mut secret = bundle_to_secret(name, namespace, &next);
            secret.metadata.resource_version = existing.metadata.resource_version.clone();
            api.replace(name, &PostParams::default(), &secret).await?;
            info!(secret = name, "rotated webhook certificates");
            Ok(next)
        }
    }
}

/// Sets `caBundle` of every webhook in the named ValidatingWebhookConfiguration. Returns false
/// when it was already up to date.
pub(crate) async fn patch_ca_bundle(
    api: &Api<ValidatingWebhookConfiguration>,
    name: &str,
    ca_pem: &str,
) -> Result<bool, CertError> {
    let mut vwc = api.get(name).await?;
    let hooks = vwc.webhooks.iter_mut().flatten();
    let changed = set_bundle(hooks.map(|h| &mut h.client_config), ca_pem);
    if changed {
        write_back(api, name, &vwc).await?;
        info!(config = name, "patched webhook caBundle");
    }
    Ok(changed)
}

/// Sets `caBundle` of every webhook in the named MutatingWebhookConfiguration (the admission
/// stamps' half, docs/contract.md "A run uses only its author's rights"), when there is one.
/// Returns false when it was already up to date or is not installed.
pub(crate) async fn patch_mutating_ca_bundle(
    api: &Api<MutatingWebhookConfiguration>,
    name: &str,
    ca_pem: &str,
) -> Result<bool, CertError> {
    let Some(mut mwc) = api.get_opt(name).await? else {
        return Ok(false);
    };
    let hooks = mwc.webhooks.iter_mut().flatten();
    let changed = set_bundle(hooks.map(|h| &mut h.client_config), ca_pem);
    if changed {
        write_back(api, name, &mwc).await?;
        info!(config = name, "patched the mutating webhook's caBundle");
    }
    Ok(changed)
}

/// Sets `caBundle` of the named APIService (the external metrics', `run --external-metrics`),
/// when there is one. Returns false when it was already up to date or is not installed.
pub(crate) async fn patch_api_service_ca_bundle(
    api: &Api<APIService>,
    name: &str,
    ca_pem: &str,
) -> Result<bool, CertError> {
    let Some(mut service) = api.get_opt(name).await? else {
        return Ok(false);
    };
    let bundle = ByteString(ca_pem.as_bytes().to_vec());
    let Some(spec) = service.spec.as_mut() else {
        return Ok(false);
    };
    if spec.ca_bundle.as_ref() == Some(&bundle) {
        return Ok(false);
    }
    spec.ca_bundle = Some(bundle);
    write_back(api, name, &service).await?;
    info!(apiservice = name, "patched the APIService's caBundle");
    Ok(true)
}

/// Writes `object` back whole (a PUT with the resourceVersion it was read at: a concurrent edit
/// fails it, and the next rotation check reads it again) — the one write of a caBundle.
async fn write_back<K>(api: &Api<K>, name: &str, object: &K) -> Result<(), CertError>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    api.replace(name, &PostParams::default(), object).await?;
    Ok(())
}

/// Sets `ca_pem` as the caBundle of each of `configs`; whether one changed.
fn set_bundle<'a>(
    configs: impl Iterator<Item = &'a mut WebhookClientConfig>,
    ca_pem: &str,
) -> bool {
    let bundle = ByteString(ca_pem.as_bytes().to_vec());
    let mut changed = false;
    for config in configs {
        if config.ca_bundle.as_ref() != Some(&bundle) {
            config.ca_bundle = Some(bundle.clone());
            changed = true;
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn names() -> Vec<String> {
        vec![
            "webhook.sandboxrun-system.svc".to_string(),
            "127.0.0.1".to_string(),
        ]
    }

    #[test]
    fn generated_certs_carry_the_names_and_validity() {
        let now = SystemTime::now();
        let b = generate(&names(), now, 90 * DAY).unwrap_or_else(|e| panic!("{e}"));
        assert!(b.ca_cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(b.key_pem.contains("PRIVATE KEY"));
        assert_eq!(subject_alt_names(&b.cert_pem).unwrap_or_default(), names());
        let end = not_after(&b.cert_pem).unwrap_or(UNIX_EPOCH);
        let expected = now + 90 * DAY;
        let drift = end
            .duration_since(expected)
            .or_else(|e| Ok::<_, ()>(e.duration()))
            .unwrap_or_default();
        assert!(drift < Duration::from_secs(2), "{drift:?}");
        assert!(
            not_after(&b.ca_cert_pem).unwrap_or(UNIX_EPOCH) > end,
            "the CA outlives the serving cert"
        );
    }

    #[test]
    fn the_serving_cert_verifies_against_the_ca() {
        let b = generate(&names(), SystemTime::now(), 30 * DAY).unwrap_or_else(|e| panic!("{e}"));
        let (_, ca) = x509_parser::pem::parse_x509_pem(b.ca_cert_pem.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let ca = ca.parse_x509().unwrap_or_else(|e| panic!("{e}"));
        let (_, leaf) = x509_parser::pem::parse_x509_pem(b.cert_pem.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let leaf = leaf.parse_x509().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(leaf.issuer(), ca.subject());
        // The issuer/AKI match is what chain building keys on; the webpki check below is the
        // verification a TLS client (the apiserver) performs.
        let aki = leaf
            .extensions()
            .iter()
            .any(|e| e.oid == x509_parser::oid_registry::OID_X509_EXT_AUTHORITY_KEY_IDENTIFIER);
        assert!(aki);
    }

    #[test]
    fn a_tls_client_trusting_the_ca_accepts_the_serving_cert_for_its_names_only() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let b = generate(&names(), SystemTime::now(), 30 * DAY).unwrap_or_else(|e| panic!("{e}"));
        let der = |pem: &str| {
            let (_, p) =
                x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            CertificateDer::from(p.contents)
        };
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(der(&b.ca_cert_pem))
            .unwrap_or_else(|e| panic!("{e}"));
        let verifier = rustls::client::WebPkiServerVerifier::builder(std::sync::Arc::new(roots))
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let leaf = der(&b.cert_pem);
        let verify = |name: &'static str| {
            let server = ServerName::try_from(name).unwrap_or_else(|e| panic!("{e}"));
            verifier.verify_server_cert(&leaf, &[], &server, &[], UnixTime::now())
        };
        assert!(verify("webhook.sandboxrun-system.svc").is_ok());
        assert!(verify("127.0.0.1").is_ok());
        assert!(verify("other.svc").is_err());
    }

    #[test]
    fn rotation_is_due_inside_the_window_only() {
        let now = SystemTime::now();
        let b = generate(&names(), now, 30 * DAY).unwrap_or_else(|e| panic!("{e}"));
        assert!(!needs_rotation(&b.cert_pem, now, 7 * DAY));
        assert!(needs_rotation(&b.cert_pem, now + 24 * DAY, 7 * DAY));
        assert!(needs_rotation(&b.cert_pem, now + 31 * DAY, Duration::ZERO));
        assert!(needs_rotation("garbage", now, Duration::ZERO));
        assert_eq!(plan(&b, &names(), now, 7 * DAY), Plan::Keep);
        assert_eq!(
            plan(&b, &names(), now + 24 * DAY, 7 * DAY),
            Plan::ReissueServing
        );
        assert_eq!(
            plan(&b, &names(), now + 50 * DAY, 7 * DAY),
            Plan::Regenerate
        );
        let renamed = vec!["other.ns.svc".to_string()];
        assert_eq!(plan(&b, &renamed, now, 7 * DAY), Plan::ReissueServing);
    }

    #[test]
    fn reissued_serving_certs_keep_the_ca() {
        let now = SystemTime::now();
        let b = generate(&names(), now, 30 * DAY).unwrap_or_else(|e| panic!("{e}"));
        let (cert, _) = issue_serving(&b.ca_key_pem, &names(), now + 20 * DAY, 30 * DAY)
            .unwrap_or_else(|e| panic!("{e}"));
        let issuer = |pem: &str| {
            let (_, p) =
                x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            let c = p.parse_x509().unwrap_or_else(|e| panic!("{e}"));
            (c.issuer().to_string(), c.subject().to_string())
        };
        assert_eq!(issuer(&cert).0, issuer(&b.ca_cert_pem).1);
    }

    #[test]
    fn bundles_round_trip_through_a_secret() {
        let b = generate(&names(), SystemTime::now(), DAY).unwrap_or_else(|e| panic!("{e}"));
        let s = bundle_to_secret("tls", "ns", &b);
        assert_eq!(s.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(bundle_from_secret(&s).ok(), Some(b));
        let mut empty = s.clone();
        empty.data = None;
        assert!(matches!(
            bundle_from_secret(&empty),
            Err(CertError::MissingKey(_, _))
        ));
    }
}
