//! How long `doctor --strict` takes offline on 50 manifests (docs/contract.md ADR-006 §3: the
//! live probe is advisory; offline, the CI gate must stay cheap). Budget: about 1 s for 50
//! manifests — reported, not asserted.
//!
//! `cargo bench --bench doctor_offline -- [--manifests 50] [--rounds 20]`
//!
//! The manifests are the corpus's `ok-*` and `fail-*` files (tests/admission-corpus/), cycled to
//! the count and written into one multi-document stream. Two cases: `in_process` calls
//! `doctor::run` (the rules, the schema walk, the report), `binary` runs the real
//! `sandboxrun-operator doctor --strict -f <file>` as CI does (process start included). Prints
//! p50 and max of each; with `BENCH_RESULTS` set (hack/bench.sh sets it) each number is also
//! appended to that file as one JSON object a line: `{"bench","case","metric","value","unit"}`.

#[path = "results.rs"]
mod results;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sandboxrun_operator::doctor::{run, DoctorArgs};
use sandboxrun_operator::policy::RuleSettings;

const BUDGET: Duration = Duration::from_secs(1);
const BIN: &str = env!("CARGO_BIN_EXE_sandboxrun-operator");

struct Options {
    manifests: usize,
    rounds: usize,
}

fn options() -> Options {
    let mut o = Options {
        manifests: 50,
        rounds: 20,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        let value = args.get(i + 1).and_then(|v| v.parse::<usize>().ok());
        match (args[i].as_str(), value) {
            ("--manifests", Some(v)) => o.manifests = v.max(1),
            ("--rounds", Some(v)) => o.rounds = v.max(1),
            _ => {}
        }
        i += 1;
    }
    o
}

/// `count` SandboxRun documents from the corpus, cycled, as one stream.
fn stream(corpus: &Path, count: usize) -> String {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        (name.starts_with("ok-") || name.starts_with("fail-")) && name.ends_with(".yaml")
    });
    files.sort();
    let docs: Vec<String> = files
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| {
            t.split("\n---")
                .map(|d| d.trim().to_string())
                .filter(|d| d.contains("kind: SandboxRun"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        !docs.is_empty(),
        "no corpus documents in {}",
        corpus.display()
    );
    docs.iter()
        .cycle()
        .take(count)
        .cloned()
        .collect::<Vec<_>>()
        .join("\n---\n")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// Appends one measurement to `$BENCH_RESULTS` (JSON lines), when it is set.
fn record(case: &str, metric: &str, value: f64, unit: &str) {
    results::record("doctor_offline", case, metric, value, unit);
}

fn report(case: &str, mut times: Vec<Duration>, manifests: usize) {
    times.sort();
    let p50 = percentile(&times, 0.5);
    let max = times.last().copied().unwrap_or_default();
    let verdict = if max <= BUDGET { "within" } else { "OVER" };
    println!(
        "{case:>10}: {manifests} manifests  p50 {:>8.1} ms  max {:>8.1} ms  ({verdict} the {} ms budget)",
        p50.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3,
        BUDGET.as_millis()
    );
    record(case, "p50", p50.as_secs_f64() * 1e3, "ms");
    record(case, "max", max.as_secs_f64() * 1e3, "ms");
}

fn main() {
    let o = options();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/admission-corpus");
    let dir = std::env::temp_dir().join(format!("doctor-offline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("manifests.yaml");
    std::fs::write(&file, stream(&corpus, o.manifests)).expect("write the manifests");
    let path = file.display().to_string();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut in_process = Vec::with_capacity(o.rounds);
    let mut summary = String::new();
    for _ in 0..o.rounds {
        let args = DoctorArgs {
            files: vec![path.clone()],
            strict: true,
            ..Default::default()
        };
        let mut sink = Vec::new();
        let t = Instant::now();
        let code = rt.block_on(run(args, RuleSettings::default(), &mut sink));
        in_process.push(t.elapsed());
        let text = String::from_utf8_lossy(&sink).into_owned();
        assert!(code <= 1, "doctor exited {code}: {text}");
        summary = text.lines().last().unwrap_or_default().to_string();
    }
    let mut binary = Vec::with_capacity(o.rounds);
    for _ in 0..o.rounds {
        let t = Instant::now();
        let out = Command::new(BIN)
            .args(["doctor", "--strict", "-f", &path])
            .output()
            .expect("run the doctor binary");
        binary.push(t.elapsed());
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "doctor exited {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    println!(
        "doctor --strict offline, {} rounds (budget ~{} ms for 50 manifests; reported, not asserted)",
        o.rounds,
        BUDGET.as_millis()
    );
    println!("report: {summary}");
    report("in_process", in_process, o.manifests);
    report("binary", binary, o.manifests);
    let _ = std::fs::remove_dir_all(&dir);
}
