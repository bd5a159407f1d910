//! Who may read the external metrics ([`super::serve`]; docs/contract.md "A pool's
//! claims are served to an autoscaler of its namespace only"): only the apiserver's aggregation
//! layer, which proxies a request to an APIService after it has authenticated its user and
//! authorized it (RBAC on `external.metrics.k8s.io`, in the namespace of the path) and presents
//! its front-proxy client certificate: one signed by the requestheader CA of
//! `kube-system/extension-apiserver-authentication`, whose common name is one of its
//! `requestheader-allowed-names` (any, when the list is empty, as the apiserver reads it). The
//! user it names in the requestheader username header must be there. No SubjectAccessReview is
//! made again: the certificate proves the apiserver's authorization ran, and nothing here writes.
//! Pure: the certificates and headers are arguments.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

/// The ConfigMap the apiserver publishes its requestheader settings in (namespace kube-system).
pub const AUTHENTICATION_CONFIGMAP: &str = "extension-apiserver-authentication";

/// What the aggregation layer's requests are checked against.
#[derive(Clone, Debug)]
pub struct FrontProxy {
    /// The requestheader CA, PEM (also trusted by the listener's handshake).
    pub ca_pem: Vec<u8>,
    /// The common names allowed; empty: any the CA signed.
    pub allowed_names: Vec<String>,
    /// The headers that name the user (`X-Remote-User`).
    pub username_headers: Vec<String>,
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotFrontProxy {
    /// No client certificate (or no TLS information).
    #[error("no client certificate: only the apiserver's aggregation layer is served")]
    NoCertificate,
    /// The certificate is not the requestheader CA's.
    #[error("the client certificate is not signed by the requestheader CA")]
    Untrusted,
    /// Its common name is not an allowed one.
    #[error("the client certificate's common name {0:?} is not a requestheader allowed name")]
    NotAllowed(String),
    /// No user named.
    #[error("the request names no user")]
    NoUser,
    /// The requestheader CA cannot be read.
    #[error("the requestheader CA: {0}")]
    Ca(String),
}

impl FrontProxy {
    /// Reads the ConfigMap's data: `requestheader-client-ca-file` (PEM), and the JSON lists
    /// `requestheader-allowed-names` and `requestheader-username-headers`. None without a CA.
    pub fn from_configmap(data: &std::collections::BTreeMap<String, String>) -> Option<Self> {
        let list = |key: &str| -> Vec<String> {
            data.get(key)
                .and_then(|v| serde_json::from_str(v).ok())
                .unwrap_or_default()
        };
        let ca = data.get("requestheader-client-ca-file")?;
        let mut username_headers = list("requestheader-username-headers");
        if username_headers.is_empty() {
            username_headers.push("X-Remote-User".into());
        }
        Some(FrontProxy {
            ca_pem: ca.as_bytes().to_vec(),
            allowed_names: list("requestheader-allowed-names"),
            username_headers,
        })
    }

    /// The user the aggregation layer names, when `peer` (the TLS client's chain, end entity
    /// first) is its front-proxy certificate, at `now`; `header` reads a request header.
    pub fn authenticate<'h>(
        &self,
        peer: &[CertificateDer<'_>],
        header: impl Fn(&str) -> Option<&'h str>,
        now: UnixTime,
    ) -> Result<String, NotFrontProxy> {
        let (end, intermediates) = peer.split_first().ok_or(NotFrontProxy::NoCertificate)?;
        self.verifier()?
            .verify_client_cert(end, intermediates, now)
            .map_err(|_| NotFrontProxy::Untrusted)?;
        let name = common_name(end).unwrap_or_default();
        if !self.allowed_names.is_empty() && !self.allowed_names.contains(&name) {
            return Err(NotFrontProxy::NotAllowed(name));
        }
        self.username_headers
            .iter()
            .find_map(|h| header(h).filter(|u| !u.is_empty()))
            .map(str::to_string)
            .ok_or(NotFrontProxy::NoUser)
    }

    fn verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, NotFrontProxy> {
        let ca_err = |e: &dyn std::fmt::Display| NotFrontProxy::Ca(e.to_string());
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca_pem) {
            roots
                .add(cert.map_err(|e| ca_err(&e))?)
                .map_err(|e| ca_err(&e))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| ca_err(&e))
    }
}

/// The subject common name of a DER certificate.
fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };

    /// A CA's PEM and a client certificate (PEM, key PEM) per common name in `names`.
    pub(crate) fn ca_and_clients(names: &[&str]) -> (String, Vec<(String, String)>) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = ca.clone().self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let clients = names
            .iter()
            .map(|name| {
                let mut client = CertificateParams::new(Vec::new()).unwrap();
                client
                    .distinguished_name
                    .push(rcgen::DnType::CommonName, *name);
                client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                let key = KeyPair::generate().unwrap();
                let cert = client.signed_by(&key, &issuer).unwrap();
                (cert.pem(), key.serialize_pem())
            })
            .collect();
        (ca_pem, clients)
    }

    fn der(pem: &str) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn front_proxy(ca: &str) -> FrontProxy {
        let data = std::collections::BTreeMap::from([
            ("requestheader-client-ca-file".to_string(), ca.to_string()),
            (
                "requestheader-allowed-names".to_string(),
                r#"["front-proxy-client"]"#.to_string(),
            ),
            (
                "requestheader-username-headers".to_string(),
                r#"["X-Remote-User"]"#.to_string(),
            ),
        ]);
        FrontProxy::from_configmap(&data).unwrap()
    }

    #[test]
    fn only_the_front_proxy_certificate_with_a_user_is_authenticated() {
        let (ca, clients) = ca_and_clients(&["front-proxy-client", "someone-else"]);
        let (_, strangers) = ca_and_clients(&["front-proxy-client"]);
        let fp = front_proxy(&ca);
        let now = UnixTime::now();
        let user = |h: &str| (h == "X-Remote-User").then_some("system:serviceaccount:x:hpa");
        let good = der(&clients[0].0);
        assert_eq!(
            fp.authenticate(&good, user, now).as_deref(),
            Ok("system:serviceaccount:x:hpa")
        );
        assert_eq!(
            fp.authenticate(&good, |_| None, now),
            Err(NotFrontProxy::NoUser)
        );
        assert_eq!(
            fp.authenticate(&der(&clients[1].0), user, now),
            Err(NotFrontProxy::NotAllowed("someone-else".into()))
        );
        assert_eq!(
            fp.authenticate(&der(&strangers[0].0), user, now),
            Err(NotFrontProxy::Untrusted),
            "another CA's certificate with the allowed name"
        );
        assert_eq!(
            fp.authenticate(&[], user, now),
            Err(NotFrontProxy::NoCertificate)
        );
    }
}
