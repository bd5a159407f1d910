//! Latency of the validating webhook (docs/contract.md, "ADR-006") as the apiserver sees it:
//! AdmissionReviews over TLS on loopback at a steady, open-loop rate (requests are sent on
//! schedule, never gated on earlier answers), side by side with a trivial always-allow axum TLS
//! endpoint on the same machine: both are loaded in the same seconds, their requests interleaved
//! (each at the rate, the peer's half a period after ours), so a hiccup of a shared machine lands
//! on both rather than on whichever happened to be measured then.
//!
//! `cargo bench --bench webhook_latency -- [--rate 200,1000] [--seconds 20] [--no-pin]`
//!
//! Both servers use the operator's stack: `admission::webhook::router` + `serve_tls` (axum-server,
//! rustls) with a certificate from `admission::certs::generate` — the same code path
//! `run --webhook-cert-mode self-managed` serves. The peer shares that stack and only swaps the
//! handler for "parse the review, answer allowed". The ratio is therefore the cost of the rules.
//! The access rule's SubjectAccessReviews are off (no apiserver here): a create pays one round
//! trip to the apiserver per right it adds on top of what is measured.
//! The servers' threads are pinned to CPU 0 and the client's to CPU 1 (unless `--no-pin`), so
//! neither starves the other on a small machine. Prints p50/p99/p999/max per rate; the targets
//! (p99 ≤ 10 ms at 200/s, rules ≤ 1.2x the peer's p99) are reported, not asserted. With
//! `BENCH_RESULTS` set (hack/bench.sh sets it), each number is also appended to that file as one
//! JSON object a line: `{"bench", "case", "metric", "value", "unit"}`, and the distributions go
//! to `webhook_latency_cdf.csv` beside it (for the plots).

#[path = "results.rs"]
mod results;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use axum::routing::{get, post};
use axum::{Json, Router};
use axum_server::tls_rustls::RustlsConfig;
use sandboxrun_operator::admission::certs;
use sandboxrun_operator::admission::webhook::{router, serve_tls, WebhookMetrics, WebhookState};
use sandboxrun_operator::policy::RuleSettings;
use serde_json::{json, Value};

const TARGET_P99: Duration = Duration::from_millis(10);
const PAYLOAD_FILE: &str = "tests/admission-corpus/ok-batch-full.yaml";

struct Options {
    rates: Vec<u32>,
    seconds: u32,
    pin: bool,
}

fn options() -> Options {
    let mut o = Options {
        rates: vec![200, 1000],
        seconds: 20,
        pin: true,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        // cargo passes `--bench`; anything unknown is ignored.
        let next = args.get(i + 1).map(String::as_str).unwrap_or_default();
        match args[i].as_str() {
            "--rate" => {
                let rates: Vec<u32> = next
                    .split(',')
                    .filter_map(|r| r.trim().parse().ok())
                    .filter(|r| *r > 0)
                    .collect();
                if !rates.is_empty() {
                    o.rates = rates;
                }
            }
            "--seconds" => {
                if let Some(v) = next.parse::<u32>().ok().filter(|v| *v > 0) {
                    o.seconds = v;
                }
            }
            "--no-pin" => o.pin = false,
            _ => {}
        }
        i += 1;
    }
    o
}

/// The machine's online CPUs (not the calling thread's mask, which pinning narrows).
fn online_cpus() -> usize {
    // SAFETY: sysconf only reads a system setting.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Pins the calling thread to `cpu` (when the machine has it), so the servers and the client
/// never take each other's core: the latency measured is the server's, not the scheduler's.
fn pin_to(cpu: usize) {
    let cpus = online_cpus();
    if cpus < 2 {
        return;
    }
    // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it; sched_setaffinity(0, …)
    // changes only the calling thread's mask.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % cpus, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!(
                "cannot pin a thread to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
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
fn start_servers(bundle: &certs::CertBundle, pin: bool) -> (SocketAddr, SocketAddr) {
    let (tx, rx) = mpsc::channel();
    let (cert, key) = (bundle.cert_pem.clone(), bundle.key_pem.clone());
    std::thread::spawn(move || {
        if pin {
            pin_to(0);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .on_thread_start(move || {
                if pin {
                    pin_to(0);
                }
            })
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
                // Off: with it on and no apiserver client the check fails closed for a spec that
                // uses a right (the payload mounts a ConfigMap), refusing every review. What it
                // costs in the operator is one SubjectAccessReview round trip to the apiserver per
                // right a create adds: network latency this in-process bench does not have.
                access_checks: false,
                watched_namespaces: Vec::new(),
                tenant_stores: Default::default(),
                shards: None,
                stamp_key: None,
                platform_pull: Default::default(),
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
/// Sends `rate` reviews per second to EACH of `urls` for `seconds`, on schedule and interleaved
/// (the second endpoint's requests half a period after the first's), so both endpoints are
/// measured in the same seconds under the same machine load: a hiccup of the machine lands on
/// both, not on whichever was measured at that time. Checks every answer allows the run.
async fn load_side_by_side(
    client: &reqwest::Client,
    urls: &[String; 2],
    body: &[u8],
    rate: u32,
    seconds: u32,
) -> [Run; 2] {
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let total = rate * seconds;
    let start = tokio::time::Instant::now();
    let mut tasks: [Vec<_>; 2] = [
        Vec::with_capacity(total as usize),
        Vec::with_capacity(total as usize),
    ];
    for i in 0..total {
        for (side, url) in urls.iter().enumerate() {
            let offset = if side == 0 {
                Duration::ZERO
            } else {
                interval / 2
            };
            tokio::time::sleep_until(start + interval * i + offset).await;
            let (client, url, body) = (client.clone(), url.clone(), body.to_vec());
            tasks[side].push(tokio::spawn(async move {
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
    }
    let [ours, peer] = tasks;
    [collect(ours).await, collect(peer).await]
}

async fn collect(tasks: Vec<tokio::task::JoinHandle<Result<Duration, String>>>) -> Run {
    let mut run = Run {
        latencies: Vec::with_capacity(tasks.len()),
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
    results::record("webhook_latency", case, metric, value, unit);
}

/// The latency distribution of one endpoint at one rate, as written for plots: one CSV row a
/// quantile (`endpoint,rate,quantile,ms`), next to `$BENCH_RESULTS` as `webhook_latency_cdf.csv`.
fn write_cdf(rows: &[(String, u32, &Run)]) {
    let Some(results) = std::env::var_os("BENCH_RESULTS") else {
        return;
    };
    let path = std::path::Path::new(&results).with_file_name("webhook_latency_cdf.csv");
    let mut text = String::from("endpoint,rate,quantile,ms\n");
    for (name, rate, run) in rows {
        for i in 1..=1000 {
            let q = f64::from(i) / 1000.0;
            text.push_str(&format!(
                "{name},{rate},{q:.3},{:.4}\n",
                ms(quantile(&run.latencies, q))
            ));
        }
    }
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("cannot write {}: {e}", path.display());
    }
}

const QUANTILES: [(&str, f64); 4] = [("p50", 0.50), ("p99", 0.99), ("p999", 0.999), ("max", 1.0)];

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let o = options();
    let names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    let bundle = certs::generate(&names, SystemTime::now(), Duration::from_secs(86_400))
        .expect("certificates");
    let (ours, peer) = start_servers(&bundle, o.pin);
    let body = review_body();
    if o.pin {
        pin_to(1);
    }
    let pin = o.pin;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .on_thread_start(move || {
            if pin {
                pin_to(1);
            }
        })
        .enable_all()
        .build()
        .expect("client runtime");
    rt.block_on(async move {
        let ca = reqwest::Certificate::from_pem(bundle.ca_cert_pem.as_bytes()).expect("CA");
        let client = reqwest::Client::builder()
            .tls_certs_only([ca])
            .timeout(Duration::from_secs(5)) // the webhook's timeoutSeconds
            .pool_max_idle_per_host(256)
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
            "webhook latency: open loop, {:?} AdmissionReviews/s for {} s per endpoint and rate, \
             TLS on loopback, HTTP/1.1 keep-alive, payload {} ({} bytes), {} CPUs, {}",
            o.rates,
            o.seconds,
            PAYLOAD_FILE,
            body.len(),
            online_cpus(),
            if o.pin {
                "servers pinned to CPU 0, client to CPU 1"
            } else {
                "not pinned"
            },
        );
        let mut results = Vec::new();
        let urls = [endpoints[0].1.clone(), endpoints[1].1.clone()];
        for &rate in &o.rates {
            // Warm up (connections, TLS sessions, allocator) for one second; not recorded.
            let _ = load_side_by_side(&client, &urls, &body, rate, 1).await;
            let [ours, peer] = load_side_by_side(&client, &urls, &body, rate, o.seconds).await;
            results.push((endpoints[0].0.to_string(), rate, ours));
            results.push((endpoints[1].0.to_string(), rate, peer));
        }
        println!(
            "{:<42} {:>6} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8}",
            "endpoint", "rate/s", "requests", "errors", "p50 ms", "p99 ms", "p999 ms", "max ms"
        );
        for (name, rate, r) in &results {
            println!(
                "{:<42} {:>6} {:>8} {:>6} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
                name,
                rate,
                r.latencies.len() + r.errors,
                r.errors,
                ms(quantile(&r.latencies, 0.50)),
                ms(quantile(&r.latencies, 0.99)),
                ms(quantile(&r.latencies, 0.999)),
                ms(quantile(&r.latencies, 1.0)),
            );
            if let Some(e) = &r.first_error {
                println!("  first error: {e}");
            }
            let case = format!("{name} @{rate}/s");
            record(
                &case,
                "requests",
                (r.latencies.len() + r.errors) as f64,
                "count",
            );
            record(&case, "errors", r.errors as f64, "count");
            for (metric, q) in QUANTILES {
                record(&case, metric, ms(quantile(&r.latencies, q)), "ms");
            }
        }
        // A refused or failed review is not a latency: with any, no ratio or target is reported
        // (an all-errors run once printed "met" with 0.00x) and the bench fails.
        let failed: usize = results.iter().map(|(_, _, r)| r.errors).sum();
        if failed > 0 {
            eprintln!(
                "NOT measured: {failed} requests failed (first errors above); no ratio or target reported"
            );
            std::process::exit(1);
        }
        for pair in results.chunks(2) {
            let [(_, rate, a), (_, _, b)] = pair else {
                continue;
            };
            let ratio = |q: f64| {
                ms(quantile(&a.latencies, q)) / ms(quantile(&b.latencies, q)).max(f64::EPSILON)
            };
            println!(
                "{:<42} {:>6} {:>8} {:>6} {:>7.2}x {:>7.2}x {:>7.2}x {:>7.2}x",
                "ratio webhook / peer",
                rate,
                "",
                "",
                ratio(0.50),
                ratio(0.99),
                ratio(0.999),
                ratio(1.0)
            );
            for (metric, q) in QUANTILES {
                record(
                    &format!("ratio webhook / peer @{rate}/s"),
                    metric,
                    ratio(q),
                    "ratio",
                );
            }
            if *rate == 200 {
                let p99 = quantile(&a.latencies, 0.99);
                println!(
                    "target at 200/s: p99 <= {} ms: {} (webhook p99 {:.3} ms); rules <= 1.2x the \
                     peer's p99: {} ({:.2}x)",
                    TARGET_P99.as_millis(),
                    if p99 <= TARGET_P99 && a.errors == 0 {
                        "met"
                    } else {
                        "NOT met"
                    },
                    ms(p99),
                    if ratio(0.99) <= 1.2 { "met" } else { "NOT met" },
                    ratio(0.99),
                );
            }
        }
        let rows: Vec<(String, u32, &Run)> = results
            .iter()
            .map(|(name, rate, run)| (name.clone(), *rate, run))
            .collect();
        write_cdf(&rows);
    });
}
