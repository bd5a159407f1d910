//! Latency of the validating webhook (docs/contract.md, "ADR-006") as the apiserver sees it:
//! AdmissionReviews over TLS on loopback at a steady, open-loop rate (requests are sent on
//! schedule, never gated on earlier answers), side by side with a trivial always-allow axum TLS endpoint on the same machine.
//!
//! `cargo bench --bench webhook_latency -- [--rate 200] [--seconds 20]`
//!
//! Both servers use the operator's stack: `admission::webhook::router` + `serve_tls` (axum-server,
//! rustls) with a certificate from `admission::certs::generate` — the same code path
//! `run --webhook-cert-mode self-managed` serves. The peer shares that stack and only swaps the
//! handler for "parse the review, answer allowed". The ratio is therefore the cost of the rules.
//! Prints p50/p99/max; the p99 ≤ 10 ms target is reported, not asserted. With `BENCH_RESULTS`
//! set (hack/bench.sh sets it), each number is also appended to that file as one JSON object a
//! line: `{"bench", "case", "metric", "value", "unit"}`.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use axum::routing::{get, post};
use axum::{Json, Router};
use axum_server::tls_rustls::RustlsConfig;
use sandboxrun_operator::admission::certs;
use sandboxrun_operator::admission::webhook::{router, serve_tls, WebhookMetrics, WebhookState};
use sandboxrun_operator::admission::RuleSettings;
use serde_json::{json, Value};

const TARGET_P99: Duration = Duration::from_millis(10);
const PAYLOAD_FILE: &str = "tests/admission-corpus/ok-batch-full.yaml";

struct Options {
    rate: u32,
    seconds: u32,
}

fn options() -> Options {
    let mut o = Options {
        rate: 200,
        seconds: 20,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        // cargo passes `--bench`; anything unknown is ignored.
        let value = args.get(i + 1).and_then(|v| v.parse::<u32>().ok());
        match (args[i].as_str(), value) {
            ("--rate", Some(v)) if v > 0 => o.rate = v,
            ("--seconds", Some(v)) if v > 0 => o.seconds = v,
            _ => {}
        }
        i += 1;
    }
    o
}

fn unused_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral loopback port")
}

/// The AdmissionReview the apiserver would send to create the corpus's fullest valid run.
fn review_body() -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PAYLOAD_FILE);
    let text = std::fs::read_to_string(&path).expect("payload manifest");
    let mut object: Value = serde_yaml::from_str(&text).expect("payload YAML");
    object["metadata"]["namespace"] = json!("bench");
    object["metadata"]["uid"] = json!("3c1e9a52-4a84-4b0e-9a77-0f1cbd5a0c11");
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "sandbox.iterion.io", "version": "v1alpha1", "kind": "SandboxRun"},
            "resource": {"group": "sandbox.iterion.io", "version": "v1alpha1", "resource": "sandboxruns"},
            "requestKind": {"group": "sandbox.iterion.io", "version": "v1alpha1", "kind": "SandboxRun"},
            "requestResource": {"group": "sandbox.iterion.io", "version": "v1alpha1", "resource": "sandboxruns"},
            "name": object["metadata"]["name"],
            "namespace": "bench",
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    }))
    .expect("review JSON")
}

/// The trivial peer: parse the review, allow it.
fn always_allow() -> Router {
    Router::new()
        .route(
            "/validate",
            post(|Json(review): Json<Value>| async move {
                Json(json!({
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {"uid": review["request"]["uid"], "allowed": true}
                }))
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
}

/// Starts both servers on their own runtime (as if in another process); returns their addresses.
fn start_servers(bundle: &certs::CertBundle) -> (SocketAddr, SocketAddr) {
    let (tx, rx) = mpsc::channel();
    let (cert, key) = (bundle.cert_pem.clone(), bundle.key_pem.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime");
        rt.block_on(async move {
            let tls = RustlsConfig::from_pem(cert.into_bytes(), key.into_bytes())
                .await
                .expect("TLS config");
            let registry = prometheus::Registry::new();
            let state = WebhookState {
                settings: RuleSettings::default(),
                metrics: Some(WebhookMetrics::register(&registry).expect("metrics")),
                images: None,
                client: None,
            };
            let (ours, peer) = (unused_port(), unused_port());
            tokio::spawn(serve_tls(ours, tls.clone(), router(state)));
            tokio::spawn(async move {
                axum_server::bind_rustls(peer, tls)
                    .serve(always_allow().into_make_service())
                    .await
            });
            tx.send((ours, peer)).expect("send addresses");
            futures::future::pending::<()>().await;
        });
    });
    rx.recv().expect("server addresses")
}

struct Run {
    latencies: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
}

/// Sends `rate` reviews per second for `seconds` on schedule; checks every answer allows the run.
async fn load(client: &reqwest::Client, url: &str, body: &[u8], rate: u32, seconds: u32) -> Run {
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let total = rate * seconds;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until(start + interval * i).await;
        let (client, url, body) = (client.clone(), url.to_string(), body.to_vec());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let resp = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .map_err(|e| format!("send: {e}"))?;
            let status = resp.status();
            let bytes = resp.bytes().await.map_err(|e| format!("body: {e}"))?;
            let took = sent.elapsed();
            let v: Value = serde_json::from_slice(&bytes).map_err(|e| format!("json: {e}"))?;
            if !status.is_success() || v["response"]["allowed"] != json!(true) {
                return Err(format!("{status}: {v}"));
            }
            Ok::<Duration, String>(took)
        }));
    }
    let mut run = Run {
        latencies: Vec::with_capacity(total as usize),
        errors: 0,
        first_error: None,
    };
    for t in tasks {
        match t.await {
            Ok(Ok(d)) => run.latencies.push(d),
            Ok(Err(e)) => {
                run.errors += 1;
                run.first_error.get_or_insert(e);
            }
            Err(e) => {
                run.errors += 1;
                run.first_error.get_or_insert(e.to_string());
            }
        }
    }
    run.latencies.sort();
    run
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[idx.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Appends one measurement to `$BENCH_RESULTS` (JSON lines), when it is set.
fn record(case: &str, metric: &str, value: f64, unit: &str) {
    let Some(path) = std::env::var_os("BENCH_RESULTS") else {
        return;
    };
    let line = json!({
        "bench": "webhook_latency",
        "case": case,
        "metric": metric,
        "value": value,
        "unit": unit,
    });
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        eprintln!("cannot append to {}: {e}", path.to_string_lossy());
    }
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let o = options();
    let names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let bundle = certs::generate(&names, SystemTime::now(), Duration::from_secs(86_400))
        .expect("certificates");
    let (ours, peer) = start_servers(&bundle);
    let body = review_body();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("client runtime");
    rt.block_on(async move {
        let ca = reqwest::Certificate::from_pem(bundle.ca_cert_pem.as_bytes()).expect("CA");
        let client = reqwest::Client::builder()
            .tls_certs_only([ca])
            .timeout(Duration::from_secs(5)) // the webhook's timeoutSeconds
            .pool_max_idle_per_host(64)
            .build()
            .expect("client");
        let endpoints = [
            (
                "sandboxrun webhook (router + serve_tls)",
                format!("https://{ours}/validate-sandboxrun"),
                format!("https://{ours}/healthz"),
            ),
            (
                "always-allow axum TLS peer",
                format!("https://{peer}/validate"),
                format!("https://{peer}/healthz"),
            ),
        ];
        for (name, _, health) in &endpoints {
            let mut ready = false;
            for _ in 0..100 {
                if client.get(health).send().await.is_ok() {
                    ready = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(ready, "{name} did not come up at {health}");
        }

        println!(
            "webhook latency: open loop, {} AdmissionReviews/s for {} s per endpoint ({} each), \
             TLS on loopback, HTTP/1.1 keep-alive, payload {} ({} bytes), {} CPUs",
            o.rate,
            o.seconds,
            o.rate * o.seconds,
            PAYLOAD_FILE,
            body.len(),
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
        );
        let mut results = Vec::new();
        for (name, url, _) in &endpoints {
            // Warm up (connections, TLS sessions, allocator) for one second; not recorded.
            let _ = load(&client, url, &body, o.rate, 1).await;
            let run = load(&client, url, &body, o.rate, o.seconds).await;
            results.push((*name, run));
        }
        println!(
            "{:<42} {:>8} {:>6} {:>8} {:>8} {:>8}",
            "endpoint", "requests", "errors", "p50 ms", "p99 ms", "max ms"
        );
        for (name, r) in &results {
            println!(
                "{:<42} {:>8} {:>6} {:>8.3} {:>8.3} {:>8.3}",
                name,
                r.latencies.len() + r.errors,
                r.errors,
                ms(quantile(&r.latencies, 0.50)),
                ms(quantile(&r.latencies, 0.99)),
                ms(quantile(&r.latencies, 1.0)),
            );
            if let Some(e) = &r.first_error {
                println!("  first error: {e}");
            }
            record(
                name,
                "requests",
                (r.latencies.len() + r.errors) as f64,
                "count",
            );
            record(name, "errors", r.errors as f64, "count");
            record(name, "p50", ms(quantile(&r.latencies, 0.50)), "ms");
            record(name, "p99", ms(quantile(&r.latencies, 0.99)), "ms");
            record(name, "max", ms(quantile(&r.latencies, 1.0)), "ms");
        }
        let (a, b) = (&results[0].1.latencies, &results[1].1.latencies);
        let ratio = |q: f64| ms(quantile(a, q)) / ms(quantile(b, q)).max(f64::EPSILON);
        println!(
            "{:<42} {:>8} {:>6} {:>7.2}x {:>7.2}x {:>7.2}x",
            "ratio webhook / peer",
            "",
            "",
            ratio(0.50),
            ratio(0.99),
            ratio(1.0)
        );
        for (metric, q) in [("p50", 0.50), ("p99", 0.99), ("max", 1.0)] {
            record("ratio webhook / peer", metric, ratio(q), "ratio");
        }
        let p99 = quantile(a, 0.99);
        println!(
            "target p99 <= {} ms: {} (webhook p99 {:.3} ms)",
            TARGET_P99.as_millis(),
            if p99 <= TARGET_P99 && results[0].1.errors == 0 {
                "met"
            } else {
                "NOT met"
            },
            ms(p99)
        );
    });
}
