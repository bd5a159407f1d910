//! Who may call the webhook (docs/contract.md "The webhook answers only the apiserver"; issue #51
//! item 3). Its mutating route issues the admission stamps and both routes answer questions about
//! users' rights, so a caller other than the apiserver — any pod that reaches its port — could
//! make up a review. With `run --webhook-client-ca`, the TLS handshake requires a client
//! certificate signed by that CA: the one the apiserver presents to webhooks (its
//! `--admission-control-config-file`, a `WebhookAdmissionConfiguration` whose kubeconfig names
//! a client certificate for the webhook's host). Without it every TLS client is served, and only
//! the chart's NetworkPolicy keeps pods out. Pure: the PEM bytes are arguments.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// ALPN of the webhook's listener (as axum-server sets it).
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why the webhook's TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// A PEM block cannot be read.
    #[error("{what}: {source}")]
    Pem {
        /// Which one (the serving certificate, its key, the client CA).
        what: &'static str,
        /// Why.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The PEM holds no certificate.
    #[error("{0}: no certificate in it")]
    NoCertificate(&'static str),
    /// The client CA cannot verify anything.
    #[error("the client CA (--webhook-client-ca): {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// rustls refuses the configuration.
    #[error("the webhook's TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Every certificate of `pem`.
fn certificates(
    what: &'static str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsConfigError::Pem { what, source })?;
    if certs.is_empty() {
        return Err(TlsConfigError::NoCertificate(what));
    }
    Ok(certs)
}

/// The webhook's TLS configuration: the serving certificate `cert_pem` and its key `key_pem`;
/// with `client_ca`, a client certificate signed by it is required, and a client without one
/// never gets past the handshake. With `front_proxy_ca` (the external metrics' requestheader CA,
/// `crate::external_metrics::front_proxy`), a certificate it signed passes the handshake too; without `client_ca`
/// a client certificate is then asked for but not required (the webhook's callers present
/// none), and the metrics routes check it per request.
pub(crate) fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca: Option<&[u8]>,
    front_proxy_ca: Option<&[u8]>,
) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let mut roots = RootCertStore::empty();
    for cert in client_ca
        .map(|ca| certificates("the client CA (--webhook-client-ca)", ca))
        .transpose()?
        .unwrap_or_default()
    {
        roots.add(cert)?;
    }
    for cert in front_proxy_ca
        .map(|ca| certificates("the requestheader CA", ca))
        .transpose()?
        .unwrap_or_default()
    {
        roots.add(cert)?;
    }
    let builder = if roots.is_empty() {
        builder.with_no_client_auth()
    } else {
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        let verifier = match client_ca {
            Some(_) => verifier.build()?,
            None => verifier.allow_unauthenticated().build()?,
        };
        builder.with_client_cert_verifier(verifier)
    };
    let chain = certificates("the serving certificate", cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|source| TlsConfigError::Pem {
        what: "the serving key",
        source,
    })?;
    let mut config = builder.with_single_cert(chain, key)?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::SocketAddr;
    use std::time::{Duration, SystemTime};

    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };

    /// A CA (its PEM) and a client certificate it signed (cert, key PEM).
    fn client_ca_and_cert() -> (String, (String, String)) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = ca.clone().self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let mut client = CertificateParams::new(Vec::new()).unwrap();
        client
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = client.signed_by(&key, &issuer).unwrap();
        (ca_pem, (cert.pem(), key.serialize_pem()))
    }

    /// Serves the webhook's router over `config` on a free loopback port.
    async fn serve(config: Arc<ServerConfig>) -> SocketAddr {
        let handle: axum_server::Handle<SocketAddr> = axum_server::Handle::new();
        let tls = axum_server::tls_rustls::RustlsConfig::from_config(config);
        let server =
            axum_server::bind_rustls("127.0.0.1:0".parse().unwrap(), tls).handle(handle.clone());
        let app = super::super::webhook::router(Default::default());
        tokio::spawn(async move { server.serve(app.into_make_service()).await });
        handle.listening().await.unwrap()
    }

    /// `GET /healthz` over TLS trusting `server_ca`, presenting `identity` when given: the
    /// response's status line, or why the connection failed.
    fn get_healthz(
        addr: SocketAddr,
        server_ca: &str,
        identity: Option<&(String, String)>,
    ) -> std::io::Result<String> {
        let mut roots = RootCertStore::empty();
        for cert in certificates("server CA", server_ca.as_bytes()).unwrap() {
            roots.add(cert).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    certificates("client", cert.as_bytes()).unwrap(),
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
        };
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut tcp = std::net::TcpStream::connect(addr)?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
        let mut out = Vec::new();
        tls.read_to_end(&mut out)?;
        let text = String::from_utf8_lossy(&out);
        Ok(text.lines().next().unwrap_or_default().to_string())
    }

    /// Issue #51 item 3: the webhook served any TLS client, so any pod that reached its port
    /// could POST a review it made up and get a stamp. With a client CA, a caller without a
    /// certificate it signed — none at all, or another CA's — never gets an answer; the
    /// apiserver's certificate does. Without one (the old behaviour) anyone is served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_a_client_ca_only_a_caller_holding_its_certificate_is_answered() {
        let serving = crate::admission::certs::generate(
            &["127.0.0.1".to_string()],
            SystemTime::now(),
            Duration::from_secs(86_400),
        )
        .unwrap();
        let (ca, apiserver) = client_ca_and_cert();
        let (_, stranger) = client_ca_and_cert();
        let (cert, key) = (serving.cert_pem.as_bytes(), serving.key_pem.as_bytes());
        let guarded = serve(server_config(cert, key, Some(ca.as_bytes()), None).unwrap()).await;
        let open = serve(server_config(cert, key, None, None).unwrap()).await;
        let server_ca = serving.ca_cert_pem.clone();
        let results = tokio::task::spawn_blocking(move || {
            [
                get_healthz(guarded, &server_ca, Some(&apiserver)),
                get_healthz(guarded, &server_ca, None),
                get_healthz(guarded, &server_ca, Some(&stranger)),
                get_healthz(open, &server_ca, None),
            ]
        })
        .await
        .unwrap();
        let [apiserver, anonymous, stranger, open] = results;
        assert!(
            apiserver.as_ref().is_ok_and(|s| s.contains("200")),
            "{apiserver:?}"
        );
        assert!(
            !anonymous.as_ref().is_ok_and(|s| s.contains("200")),
            "a caller without a certificate was answered: {anonymous:?}"
        );
        assert!(
            !stranger.as_ref().is_ok_and(|s| s.contains("200")),
            "another CA's certificate was answered: {stranger:?}"
        );
        assert!(open.as_ref().is_ok_and(|s| s.contains("200")), "{open:?}");
        // A client CA that holds no certificate is refused at start, not taken for "none".
        assert!(matches!(
            server_config(cert, key, Some(b""), None),
            Err(TlsConfigError::NoCertificate(_))
        ));
    }

    /// With `--external-metrics` the listener trusts the requestheader CA too: a client CA stays
    /// required (a caller without a certificate is still never answered), and without one the
    /// webhook's callers, which present none, are still served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn trusting_the_front_proxy_ca_keeps_the_client_ca_required_and_anonymous_webhook_callers_served(
    ) {
        let serving = crate::admission::certs::generate(
            &["127.0.0.1".to_string()],
            SystemTime::now(),
            Duration::from_secs(86_400),
        )
        .unwrap();
        let (ca, apiserver) = client_ca_and_cert();
        let (front_proxy_ca, front_proxy) = client_ca_and_cert();
        let (cert, key) = (serving.cert_pem.as_bytes(), serving.key_pem.as_bytes());
        let (ca, fp) = (ca.as_bytes(), front_proxy_ca.as_bytes());
        let guarded = serve(server_config(cert, key, Some(ca), Some(fp)).unwrap()).await;
        let open = serve(server_config(cert, key, None, Some(fp)).unwrap()).await;
        let server_ca = serving.ca_cert_pem.clone();
        let results = tokio::task::spawn_blocking(move || {
            [
                get_healthz(guarded, &server_ca, Some(&apiserver)),
                get_healthz(guarded, &server_ca, Some(&front_proxy)),
                get_healthz(guarded, &server_ca, None),
                get_healthz(open, &server_ca, None),
            ]
        })
        .await
        .unwrap();
        let [apiserver, front_proxy, anonymous, open] = results;
        let answered = |r: &std::io::Result<String>| r.as_ref().is_ok_and(|s| s.contains("200"));
        assert!(answered(&apiserver), "{apiserver:?}");
        assert!(answered(&front_proxy), "{front_proxy:?}");
        assert!(!answered(&anonymous), "{anonymous:?}");
        assert!(answered(&open), "{open:?}");
    }
}
