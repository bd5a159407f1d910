//! A routing mock apiserver for the scenario tests (tower-test, no cluster): each request is
//! answered by the first route whose method and path prefix match it, and recorded (method, uri,
//! content type, body as JSON); a request no route matches is answered 404 with a Kubernetes
//! `Status`, and recorded too. With it, the [`context`] the act, pipeline and teardown scenarios
//! run in.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
use object_store::memory::InMemory;
use serde_json::{json, Value};

use crate::caps::CapSettings;
use crate::controller::context::Context;
use crate::controller::run::decide::DecideSettings;
use crate::metrics::Metrics;
use crate::pod::PodSettings;

/// A context over `client` (the mock apiserver) and `store` (prefix `runs`), with the default
/// settings: tenant stores, Kueue, warm pools, pre-flight and sharding off.
pub(crate) fn context(client: kube::Client, store: Arc<InMemory>) -> Context {
    Context::new(
        client,
        store,
        object_store::path::Path::from("runs"),
        "memory:///runs".to_string(),
        PodSettings::default(),
        CapSettings::default(),
        DecideSettings::default(),
        Vec::new(),
        Metrics::new().unwrap(),
        "test".to_string(),
        1,
    )
}

/// One request as the mock apiserver saw it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    /// `GET`, `POST`, `PATCH`, `DELETE`, …
    pub method: String,
    /// The path and query.
    pub uri: String,
    /// The request's `Content-Type` (empty when absent).
    pub content_type: String,
    /// The body as JSON (`Null` when empty or not JSON).
    pub body: Value,
}

impl Seen {
    /// The request's path, without its query.
    pub(crate) fn path(&self) -> &str {
        self.uri.split('?').next().unwrap_or_default()
    }

    /// `METHOD path`, for asserting the order of requests.
    pub(crate) fn line(&self) -> String {
        format!("{} {}", self.method, self.path())
    }
}

/// The method of a route that takes every method ([`Route::any`]).
const ANY_METHOD: &str = "*";

/// How a route answers: (HTTP status, body) from the request.
type Answer = Arc<dyn Fn(&Seen) -> (u16, Value) + Send + Sync>;

/// A route: the requests with this method whose path starts with `prefix`.
#[derive(Clone)]
pub(crate) struct Route {
    method: &'static str,
    prefix: String,
    answer: Answer,
    /// The answer is sent only once this is true ([`Route::held`]); the others go on meanwhile.
    hold: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Route {
    /// Answers `status` with `body`.
    pub(crate) fn fixed(method: &'static str, prefix: &str, status: u16, body: Value) -> Route {
        Route::with(method, prefix, move |_| (status, body.clone()))
    }

    /// Answers every request, whatever its method and path, `status` with `body`.
    pub(crate) fn any(status: u16, body: Value) -> Route {
        Route::fixed(ANY_METHOD, "/", status, body)
    }

    /// Answers with what `answer` makes of the request.
    pub(crate) fn with(
        method: &'static str,
        prefix: &str,
        answer: impl Fn(&Seen) -> (u16, Value) + Send + Sync + 'static,
    ) -> Route {
        Route {
            method,
            prefix: prefix.to_string(),
            answer: Arc::new(answer),
            hold: None,
        }
    }

    /// This route, its answers held back until `gate` is true (the request is logged when it
    /// comes); the requests of other routes are answered meanwhile.
    pub(crate) fn held(self, gate: tokio::sync::watch::Receiver<bool>) -> Route {
        Route {
            hold: Some(gate),
            ..self
        }
    }

    /// Answers `status` with the request's own body (a create or apply the apiserver accepted).
    pub(crate) fn echo(method: &'static str, prefix: &str, status: u16) -> Route {
        Route::with(method, prefix, move |seen| (status, seen.body.clone()))
    }

    fn matches(&self, seen: &Seen) -> bool {
        (self.method == ANY_METHOD || self.method == seen.method)
            && seen.path().starts_with(&self.prefix)
    }
}

/// A Kubernetes `Status` failure body.
pub(crate) fn status_failure(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "reason": reason, "code": code
    })
}

/// What the mock apiserver was sent, in order.
#[derive(Clone, Default)]
pub(crate) struct Log(Arc<Mutex<Vec<Seen>>>);

impl Log {
    /// Every request so far.
    pub(crate) fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    /// Every request so far as `METHOD path`.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.all().iter().map(Seen::line).collect()
    }

    /// The requests with `method` to exactly `path`.
    pub(crate) fn exactly(&self, method: &str, path: &str) -> Vec<Seen> {
        self.all()
            .into_iter()
            .filter(|s| s.method == method && s.path() == path)
            .collect()
    }

    /// The requests with `method` whose path starts with `prefix`.
    pub(crate) fn matching(&self, method: &str, prefix: &str) -> Vec<Seen> {
        self.all()
            .into_iter()
            .filter(|s| s.method == method && s.path().starts_with(prefix))
            .collect()
    }
}

/// A mock apiserver answering by `routes` (first match wins); returns the client (default
/// namespace `ns`) and the log of what it was sent.
pub(crate) fn apiserver(routes: Vec<Route>) -> (kube::Client, Log) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let log = Log::default();
    let seen = log.clone();
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let (parts, payload) = request.into_parts();
            let bytes = payload.collect_bytes().await.unwrap_or_default();
            let request = Seen {
                method: parts.method.to_string(),
                uri: parts.uri.to_string(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let route = routes.iter().find(|r| r.matches(&request));
            let (status, body) = match route {
                Some(route) => (route.answer)(&request),
                None => (
                    404,
                    status_failure(404, "NotFound", &format!("no route: {}", request.line())),
                ),
            };
            seen.0.lock().unwrap().push(request);
            let response = Response::builder()
                .status(status)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string().into_bytes()))
                .unwrap();
            match route.and_then(|r| r.hold.clone()) {
                Some(mut gate) => {
                    tokio::spawn(async move {
                        let _ = gate.wait_for(|open| *open).await;
                        send.send_response(response);
                    });
                }
                None => send.send_response(response),
            }
        }
    });
    (kube::Client::new(service, "ns"), log)
}
