//! The machine-readable results every Rust benchmark writes (hack/bench.sh reads them): one JSON
//! object a line, `{"bench", "case", "metric", "value", "unit"}`, appended to `$BENCH_RESULTS` when
//! it is set. Included by each benchmark with `#[path = "results.rs"] mod results;`.

use serde_json::json;

/// Appends one measurement of `bench` to `$BENCH_RESULTS`, when it is set.
pub fn record(bench: &str, case: &str, metric: &str, value: f64, unit: &str) {
    let Some(path) = std::env::var_os("BENCH_RESULTS") else {
        return;
    };
    let line = json!({
        "bench": bench,
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
