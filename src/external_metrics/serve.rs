//! The external metrics API the webhook's listener serves with `run --external-metrics`
//! (docs/user-guide.md "Scaling a pool with a HorizontalPodAutoscaler"; docs/contract.md "A
//! pool's claims are served to an autoscaler of its namespace only"): discovery of
//! `external.metrics.k8s.io/v1beta1` (what makes its APIService Available) and
//! `sandboxrun_pool_claimed` ([`super::value`]) per namespace, answered from a
//! watch of the pools of its own, only to the apiserver's aggregation layer
//! ([`super::front_proxy`]). Every replica answers the same (a pool's status, whoever wrote it);
//! until its first list a replica answers 503, so an autoscaler keeps the scale rather than read
//! a zero. Reads only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use axum_server::tls::TlsInfo;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use rustls::pki_types::{CertificateDer, UnixTime};
use serde_json::json;
use tracing::{debug, warn};

use super::front_proxy::{FrontProxy, NotFrontProxy, AUTHENTICATION_CONFIGMAP};
use super::value::{self as external_metric, Refused};
use crate::api::SandboxRunPool;

/// Why the external metrics cannot be served (the operator stops at start: the flag asked).
#[derive(Debug, thiserror::Error)]
pub enum MetricsApiError {
    /// The apiserver's requestheader settings cannot be read.
    #[error("kube-system/{AUTHENTICATION_CONFIGMAP}: {0}")]
    Read(#[from] kube::Error),
    /// They hold no requestheader CA: the apiserver has no aggregation layer configured.
    #[error("kube-system/{AUTHENTICATION_CONFIGMAP} has no requestheader-client-ca-file: the apiserver's aggregation layer is not configured")]
    NoAggregationLayer,
}

/// What the routes answer from.
pub(crate) struct MetricsApi {
    front_proxy: FrontProxy,
    stores: Vec<Store<SandboxRunPool>>,
    listed: Vec<Arc<AtomicBool>>,
}

impl MetricsApi {
    /// Reads the requestheader settings and starts the pools' watch (`namespaces` empty: every
    /// namespace's).
    pub(crate) async fn start(
        client: &Client,
        namespaces: &[String],
    ) -> Result<Arc<MetricsApi>, MetricsApiError> {
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
        let data = configmaps
            .get(AUTHENTICATION_CONFIGMAP)
            .await?
            .data
            .unwrap_or_default();
        let front_proxy =
            FrontProxy::from_configmap(&data).ok_or(MetricsApiError::NoAggregationLayer)?;
        let (mut stores, mut listed) = (Vec::new(), Vec::new());
        for scope in scopes(namespaces) {
            let api: Api<SandboxRunPool> = match scope {
                None => Api::all(client.clone()),
                Some(ns) => Api::namespaced(client.clone(), ns),
            };
            let (store, writer) = reflector::store();
            let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
                .default_backoff()
                .applied_objects();
            tokio::spawn(stream.for_each(|event| async move {
                if let Err(e) = event {
                    warn!(error = %e, "the external metrics' watch of the pools");
                }
            }));
            let flag = Arc::new(AtomicBool::new(false));
            let (ready, waited) = (flag.clone(), store.clone());
            tokio::spawn(async move {
                if waited.wait_until_ready().await.is_ok() {
                    ready.store(true, Ordering::Release);
                }
            });
            stores.push(store);
            listed.push(flag);
        }
        Ok(Arc::new(MetricsApi {
            front_proxy,
            stores,
            listed,
        }))
    }

    /// The requestheader CA (PEM), which the listener trusts too.
    pub(crate) fn front_proxy_ca(&self) -> &[u8] {
        &self.front_proxy.ca_pem
    }

    /// Whether the request is the aggregation layer's; its user (logged) when it is.
    fn authenticate(
        &self,
        tls: Option<&TlsInfo>,
        headers: &HeaderMap,
    ) -> Result<String, NotFrontProxy> {
        let peer: Vec<CertificateDer<'_>> = tls
            .map(|t| {
                t.peer_certificates
                    .iter()
                    .map(|c| CertificateDer::from(c.as_slice()))
                    .collect()
            })
            .unwrap_or_default();
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        self.front_proxy
            .authenticate(&peer, header, UnixTime::now())
    }
}

/// The namespaces to watch: each of `namespaces`, or every namespace (None) when it is empty.
fn scopes(namespaces: &[String]) -> Vec<Option<&str>> {
    if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|ns| Some(ns.as_str())).collect()
    }
}

/// The routes, merged into the webhook's router.
pub(crate) fn routes(api: Arc<MetricsApi>) -> Router {
    let base = format!(
        "/apis/{}/{}",
        external_metric::GROUP,
        external_metric::VERSION
    );
    Router::new()
        .route(&base, get(discovery))
        .route(
            &format!("{base}/namespaces/{{namespace}}/{{metric}}"),
            get(values),
        )
        .with_state(api)
}

/// A `Status` object, as the apiserver passes errors on.
fn status(code: StatusCode, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "code": code.as_u16(),
    });
    (code, Json(body)).into_response()
}

/// 401, saying why (the aggregation layer passes it on to its caller).
fn unauthorized(why: &NotFrontProxy) -> Response {
    debug!(%why, "external metrics request refused");
    status(StatusCode::UNAUTHORIZED, &why.to_string())
}

async fn discovery(
    State(api): State<Arc<MetricsApi>>,
    tls: Option<Extension<Arc<TlsInfo>>>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = api.authenticate(tls.as_deref().map(|t| t.as_ref()), &headers) {
        return unauthorized(&refused);
    }
    Json(external_metric::resource_list()).into_response()
}

#[derive(serde::Deserialize)]
struct ValuesQuery {
    #[serde(rename = "labelSelector", default)]
    label_selector: String,
}

async fn values(
    State(api): State<Arc<MetricsApi>>,
    Path((namespace, metric)): Path<(String, String)>,
    Query(query): Query<ValuesQuery>,
    tls: Option<Extension<Arc<TlsInfo>>>,
    headers: HeaderMap,
) -> Response {
    let user = match api.authenticate(tls.as_deref().map(|t| t.as_ref()), &headers) {
        Ok(user) => user,
        Err(refused) => return unauthorized(&refused),
    };
    if !api.listed.iter().all(|l| l.load(Ordering::Acquire)) {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the pools are not listed yet",
        );
    }
    let pools: Vec<Arc<SandboxRunPool>> = api.stores.iter().flat_map(|s| s.state()).collect();
    let second = jiff::Timestamp::now().as_second();
    let now = jiff::Timestamp::from_second(second)
        .unwrap_or_default()
        .to_string();
    let answer = external_metric::value_list(
        pools.iter().map(|p| p.as_ref()),
        &namespace,
        &metric,
        &query.label_selector,
        &now,
    );
    debug!(%user, %namespace, %metric, ok = answer.is_ok(), "external metric read");
    match answer {
        Ok(list) => Json(list).into_response(),
        Err(e @ Refused::UnknownMetric(_)) => status(StatusCode::NOT_FOUND, &e.to_string()),
        Err(e @ Refused::Selector(..)) => status(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::SocketAddr;
    use std::time::{Duration, SystemTime};

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;

    use crate::api::{SandboxRunPoolSpec, SandboxRunPoolStatus, TemplateRef};
    use crate::external_metrics::front_proxy::tests::ca_and_clients;

    fn pool(ns: &str, claimed: i32) -> SandboxRunPool {
        let mut pool = SandboxRunPool::new(
            "agents",
            SandboxRunPoolSpec {
                template_ref: TemplateRef::namespaced("agent"),
                replicas: 1,
            },
        );
        pool.metadata.namespace = Some(ns.into());
        pool.status = Some(SandboxRunPoolStatus {
            claimed,
            ..Default::default()
        });
        pool
    }

    /// The webhook's router and the metrics routes on one TLS listener, as `run
    /// --external-metrics` serves them, the pools `team-a/agents` (2 claimed) and
    /// `team-b/agents` (5) listed; `listed` false: before the first list.
    async fn serve(
        front_proxy_ca: &str,
        serving: &crate::admission::certs::CertBundle,
        listed: bool,
    ) -> SocketAddr {
        let (store, mut writer) = reflector::store::<SandboxRunPool>();
        for p in [pool("team-a", 2), pool("team-b", 5)] {
            writer.apply_watcher_event(&watcher::Event::Apply(p));
        }
        let data = std::collections::BTreeMap::from([
            (
                "requestheader-client-ca-file".to_string(),
                front_proxy_ca.to_string(),
            ),
            (
                "requestheader-allowed-names".to_string(),
                r#"["front-proxy-client"]"#.to_string(),
            ),
        ]);
        let api = Arc::new(MetricsApi {
            front_proxy: FrontProxy::from_configmap(&data).unwrap(),
            stores: vec![store],
            listed: vec![Arc::new(AtomicBool::new(listed))],
        });
        let config = crate::admission::client_auth::server_config(
            serving.cert_pem.as_bytes(),
            serving.key_pem.as_bytes(),
            None,
            Some(front_proxy_ca.as_bytes()),
        )
        .unwrap();
        let handle: axum_server::Handle<SocketAddr> = axum_server::Handle::new();
        let tls = axum_server::tls_rustls::RustlsConfig::from_config(config);
        let server =
            axum_server::bind_rustls("127.0.0.1:0".parse().unwrap(), tls).handle(handle.clone());
        let app = crate::admission::webhook::router(Default::default()).merge(routes(api));
        tokio::spawn(async move { server.serve(app.into_make_service()).await });
        handle.listening().await.unwrap()
    }

    /// `GET path` over TLS trusting `server_ca`, presenting `identity` when given, naming
    /// `X-Remote-User: someone`: the response (status line first), or why the connection failed.
    fn get(
        addr: SocketAddr,
        server_ca: &str,
        identity: Option<&(String, String)>,
        path: &str,
    ) -> std::io::Result<String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(server_ca.as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
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
                    CertificateDer::pem_slice_iter(cert.as_bytes())
                        .collect::<Result<_, _>>()
                        .unwrap(),
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
        };
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut tcp = std::net::TcpStream::connect(addr)?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Remote-User: someone\r\nConnection: close\r\n\r\n"
        );
        tls.write_all(request.as_bytes())?;
        let mut out = Vec::new();
        tls.read_to_end(&mut out)?;
        Ok(String::from_utf8_lossy(&out).to_string())
    }

    /// Only the aggregation layer's front-proxy certificate reads a pool's claims; the webhook
    /// beside it still answers a caller without a certificate; a request reads the namespace of
    /// its path only; before the first list a replica answers 503, never a made-up zero.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_front_proxy_reads_the_claims_and_only_of_the_namespace_it_names() {
        let serving = crate::admission::certs::generate(
            &["127.0.0.1".to_string()],
            SystemTime::now(),
            Duration::from_secs(86_400),
        )
        .unwrap();
        let (fp_ca, clients) = ca_and_clients(&["front-proxy-client", "a-pod"]);
        let (_, strangers) = ca_and_clients(&["front-proxy-client"]);
        let addr = serve(&fp_ca, &serving, true).await;
        let unlisted = serve(&fp_ca, &serving, false).await;
        let ca = serving.ca_cert_pem.clone();
        let base = "/apis/external.metrics.k8s.io/v1beta1";
        let a =
            format!("{base}/namespaces/team-a/sandboxrun_pool_claimed?labelSelector=pool%3Dagents");
        let c =
            format!("{base}/namespaces/team-c/sandboxrun_pool_claimed?labelSelector=pool%3Dagents");
        let [front, pod, stranger] = [&clients[0], &clients[1], &strangers[0]].map(|c| c.clone());
        let got = tokio::task::spawn_blocking(move || {
            [
                get(addr, &ca, Some(&front), &a),
                get(addr, &ca, Some(&front), &c),
                get(addr, &ca, Some(&front), base),
                get(addr, &ca, None, &a),
                get(addr, &ca, Some(&pod), &a),
                get(addr, &ca, Some(&stranger), &a),
                get(addr, &ca, None, "/healthz"),
                get(unlisted, &ca, Some(&front), &a),
            ]
        })
        .await
        .unwrap();
        let status = |r: &std::io::Result<String>| {
            r.as_ref()
                .map(|t| t.lines().next().unwrap_or_default().to_string())
                .unwrap_or_else(|e| e.to_string())
        };
        let [team_a, team_c, discovery, anonymous, pod, stranger, healthz, unlisted] = got;
        assert!(status(&team_a).contains("200"), "{team_a:?}");
        let body = team_a.unwrap();
        assert!(
            body.contains(r#""value":"2""#) && !body.contains(r#""value":"5""#),
            "{body}"
        );
        assert!(status(&team_c).contains("200"), "{team_c:?}");
        assert!(
            team_c.unwrap().contains(r#""items":[]"#),
            "team-c has no pool"
        );
        assert!(status(&discovery).contains("200"), "{discovery:?}");
        assert!(status(&anonymous).contains("401"), "{anonymous:?}");
        assert!(status(&pod).contains("401"), "{pod:?}");
        assert!(!status(&stranger).contains("200"), "{stranger:?}");
        assert!(status(&healthz).contains("200"), "{healthz:?}");
        assert!(status(&unlisted).contains("503"), "{unlisted:?}");
    }
}
