//! The no-pull resolvability check against real HTTP: a tiny registry on 127.0.0.1 that answers
//! `HEAD /v2/<repo>/manifests/<ref>` (plain HTTP is used for loopback registries).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, get};
use axum::Router;
use sandboxrun_operator::policy::resolvable;
use sandboxrun_operator::registry::{
    ImageResolver, ImageSettings, RegistryCredentials, Resolution,
};

use crate::support::ports::free_port;

#[derive(Clone, Default)]
struct Registry {
    hits: Arc<AtomicUsize>,
    /// Require `Authorization: Bearer good-token` (issued by /token).
    bearer: bool,
    /// Never answer.
    hang: bool,
    /// Token service expects basic auth user:pass.
    token_needs_basic: bool,
}

async fn manifests(
    State(r): State<Registry>,
    Path((repo, reference)): Path<(String, String)>,
    headers: HeaderMap,
) -> impl IntoResponse {
    r.hits.fetch_add(1, Ordering::SeqCst);
    if r.hang {
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    let accept = headers
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(
        accept.contains("application/vnd.oci.image.index.v1+json"),
        "accept: {accept}"
    );
    assert!(
        accept.contains("application/vnd.docker.distribution.manifest.v2+json"),
        "accept: {accept}"
    );
    let mut out = HeaderMap::new();
    if r.bearer {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if auth != "Bearer good-token" {
            let port = headers
                .get("host")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let challenge = format!(
                r#"Bearer realm="http://{port}/token",service="test-registry",scope="repository:{repo}:pull""#
            );
            out.insert(
                "www-authenticate",
                challenge.parse().unwrap_or_else(|e| panic!("{e:?}")),
            );
            return (StatusCode::UNAUTHORIZED, out);
        }
    }
    if repo == "team/app" && reference == "v1" {
        (StatusCode::OK, out)
    } else {
        (StatusCode::NOT_FOUND, out)
    }
}

async fn token(State(r): State<Registry>, headers: HeaderMap) -> impl IntoResponse {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // base64("user:pass") = dXNlcjpwYXNz
    if r.token_needs_basic && auth != "Basic dXNlcjpwYXNz" {
        return (StatusCode::UNAUTHORIZED, String::new());
    }
    (StatusCode::OK, r#"{"token":"good-token"}"#.to_string())
}

async fn start(registry: Registry) -> SocketAddr {
    let app = Router::new()
        .route(
            "/v2/{ns}/{name}/manifests/{reference}",
            any(
                |s: State<Registry>,
                 Path((ns, name, r)): Path<(String, String, String)>,
                 h: HeaderMap| async move {
                    manifests(s, Path((format!("{ns}/{name}"), r)), h).await
                },
            ),
        )
        .route("/token", get(token))
        .with_state(registry);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn resolver(timeout: Duration) -> ImageResolver {
    let _ = rustls::crypto::ring::default_provider().install_default();
    ImageResolver::new(ImageSettings {
        timeout,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn an_existing_tag_resolves_and_a_missing_one_fails() {
    let reg = Registry::default();
    let addr = start(reg.clone()).await;
    let r = resolver(Duration::from_secs(5));
    assert_eq!(
        r.resolve(&format!("127.0.0.1:{}/team/app:v1", addr.port()), None)
            .await,
        Resolution::Resolvable
    );
    let missing = r
        .resolve(&format!("127.0.0.1:{}/team/app:v2", addr.port()), None)
        .await;
    assert!(matches!(missing, Resolution::NotFound(_)), "{missing:?}");
    assert!(resolvable::finding(&missing, "x").is_some_and(|f| f.is_fail()));
    let no_repo = r
        .resolve(&format!("localhost:{}/team/nope:v1", addr.port()), None)
        .await;
    assert!(matches!(no_repo, Resolution::NotFound(_)), "{no_repo:?}");
}

#[tokio::test]
async fn definitive_answers_are_cached() {
    let reg = Registry::default();
    let addr = start(reg.clone()).await;
    let r = resolver(Duration::from_secs(5));
    let image = format!("127.0.0.1:{}/team/app:v1", addr.port());
    assert_eq!(r.resolve(&image, None).await, Resolution::Resolvable);
    assert_eq!(r.resolve(&image, None).await, Resolution::Resolvable);
    assert_eq!(reg.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_hanging_registry_is_a_warning_within_the_timeout() {
    let addr = start(Registry {
        hang: true,
        ..Default::default()
    })
    .await;
    let r = resolver(Duration::from_millis(300));
    let started = Instant::now();
    let v = r
        .resolve(&format!("127.0.0.1:{}/team/app:v1", addr.port()), None)
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(v, Resolution::Unknown(_)), "{v:?}");
    let f = resolvable::finding(&v, "img");
    assert!(
        f.as_ref()
            .is_some_and(|f| !f.is_fail() && f.hint.contains("kubelet may still pull")),
        "{f:?}"
    );
}

#[tokio::test]
async fn nothing_listening_is_a_warning() {
    let port = free_port();
    let v = resolver(Duration::from_secs(2))
        .resolve(&format!("127.0.0.1:{port}/team/app:v1"), None)
        .await;
    assert!(matches!(v, Resolution::Unknown(_)), "{v:?}");
}

#[tokio::test]
async fn the_bearer_challenge_is_answered_anonymously() {
    let addr = start(Registry {
        bearer: true,
        ..Default::default()
    })
    .await;
    let r = resolver(Duration::from_secs(5));
    assert_eq!(
        r.resolve(&format!("127.0.0.1:{}/team/app:v1", addr.port()), None)
            .await,
        Resolution::Resolvable
    );
    let v = r
        .resolve(&format!("127.0.0.1:{}/team/app:v9", addr.port()), None)
        .await;
    assert!(matches!(v, Resolution::NotFound(_)), "{v:?}");
}

#[tokio::test]
async fn pull_secret_credentials_are_used_for_the_token_and_their_absence_only_warns() {
    let addr = start(Registry {
        bearer: true,
        token_needs_basic: true,
        ..Default::default()
    })
    .await;
    let r = resolver(Duration::from_secs(5));
    let image = format!("127.0.0.1:{}/team/app:v1", addr.port());
    let anonymous = r.resolve(&image, None).await;
    assert!(matches!(anonymous, Resolution::Unknown(_)), "{anonymous:?}");
    let config = format!(
        r#"{{"auths":{{"127.0.0.1:{}":{{"auth":"dXNlcjpwYXNz"}}}}}}"#,
        addr.port()
    );
    let creds = RegistryCredentials::from_docker_config(config.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        r.resolve(&image, Some(&creds)).await,
        Resolution::Resolvable
    );
}
