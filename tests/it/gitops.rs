//! The GitOps health checks shipped in `deploy/gitops/`, run by real evaluators against the
//! fixture objects in `tests/gitops-fixtures/` (each file's first line:
//! `# expect: argocd=<Healthy|Progressing|Degraded> flux=<Current|InProgress|Failed>`):
//! - the Argo CD Lua script under Debian's `lua5.4` (installed by `.ci/run`), with the object as
//!   the global `obj`, as Argo CD runs it;
//! - the Flux `healthCheckExprs` under a CEL interpreter, evaluated in Flux's order.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

struct Fixture {
    name: String,
    object: serde_json::Value,
    argocd: String,
    flux: String,
}

fn fixtures() -> Vec<Fixture> {
    let dir = root().join("tests/gitops-fixtures");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{e}"));
            let first = text.lines().next().unwrap_or_default();
            let want = |key: &str| {
                first
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{key}=")))
                    .unwrap_or_else(|| panic!("{}: no {key}= in {first:?}", p.display()))
                    .to_string()
            };
            Fixture {
                name: p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_string(),
                object: serde_yaml::from_str(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display())),
                argocd: want("argocd"),
                flux: want("flux"),
            }
        })
        .collect()
}

/// A JSON value as a Lua table constructor, as Argo CD hands objects to its scripts (null fields
/// are absent, arrays are 1-based sequences).
fn lua(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "nil".to_string(),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::String(s) => lua_string(s),
        serde_json::Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(lua).collect();
            format!("{{{}}}", parts.join(", "))
        }
        serde_json::Value::Object(map) => {
            let parts: Vec<String> = map
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("[{}] = {}", lua_string(k), lua(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
    }
}

fn lua_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\{}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Runs the Argo CD script on `object` under lua5.4; returns (status, message).
fn argocd_health(lua_bin: &Path, object: &serde_json::Value) -> (String, String) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let harness = dir.path().join("harness.lua");
    std::fs::write(
        &harness,
        format!(
            "obj = {}\nlocal script = assert(loadfile(arg[1]))\nlocal hs = script()\nio.write(tostring(hs.status), \"\\n\", tostring(hs.message), \"\\n\")\n",
            lua(object)
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(lua_bin)
        .arg(&harness)
        .arg(root().join("deploy/gitops/argocd-health.lua"))
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", lua_bin.display()));
    assert!(
        out.status.success(),
        "lua failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    (
        lines.next().unwrap_or_default().to_string(),
        lines.next().unwrap_or_default().to_string(),
    )
}

fn lua_binary() -> PathBuf {
    for name in ["lua5.4", "lua"] {
        if let Ok(out) = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
        {
            let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && !path.is_empty() {
                return PathBuf::from(path);
            }
        }
    }
    panic!("no Lua interpreter on PATH: `apt-get install -y lua5.4` (.ci/run installs it)");
}

#[test]
fn argocd_health_script_under_a_real_lua_interpreter() {
    let lua_bin = lua_binary();
    let fixtures = fixtures();
    assert!(fixtures.len() >= 10, "only {} fixtures", fixtures.len());
    let mut problems = Vec::new();
    for f in &fixtures {
        let (status, message) = argocd_health(&lua_bin, &f.object);
        println!("{:<32} argocd {status:<12} {message}", f.name);
        if status != f.argocd {
            problems.push(format!(
                "{}: Argo CD health {status} ({message}), expected {}",
                f.name, f.argocd
            ));
        }
        if message.is_empty() || message == "nil" {
            problems.push(format!("{}: no message", f.name));
        }
    }
    // Every verdict Argo CD knows for a SandboxRun is exercised.
    for want in ["Healthy", "Progressing", "Degraded"] {
        assert!(
            fixtures.iter().any(|f| f.argocd == want),
            "no fixture for {want}"
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn argocd_messages_carry_the_operators_words() {
    let lua_bin = lua_binary();
    let by_name = |n: &str| {
        fixtures()
            .into_iter()
            .find(|f| f.name == n)
            .unwrap_or_else(|| panic!("no fixture {n}"))
    };
    let (_, m) = argocd_health(&lua_bin, &by_name("failed-exit-code.yaml").object);
    assert_eq!(m, "WorkloadFailed: workload failed with exit code 3");
    let (_, m) = argocd_health(&lua_bin, &by_name("succeeded-but-drain-failed.yaml").object);
    assert!(m.starts_with("DrainFailed: drain failed for /out"), "{m}");
    let (_, m) = argocd_health(&lua_bin, &by_name("pending-pod-refused.yaml").object);
    assert!(m.contains("exceeded quota"), "{m}");
}

/// The Flux expressions for SandboxRuns from `deploy/gitops/flux-health-check-exprs.yaml`.
fn flux_exprs() -> (String, String, String) {
    let path = root().join("deploy/gitops/flux-health-check-exprs.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    let check = doc["healthCheckExprs"]
        .as_sequence()
        .and_then(|s| {
            s.iter().find(|c| {
                c["apiVersion"].as_str() == Some("sandbox.iterion.io/v1alpha1")
                    && c["kind"].as_str() == Some("SandboxRun")
            })
        })
        .unwrap_or_else(|| panic!("no SandboxRun entry in {}", path.display()));
    let get = |k: &str| {
        check[k]
            .as_str()
            .unwrap_or_else(|| panic!("no {k} expression"))
            .to_string()
    };
    (get("inProgress"), get("failed"), get("current"))
}

/// Flux's verdict for `object`: the object's top-level fields are the variables; inProgress,
/// failed, current are evaluated in that order and the first true one wins; none true is
/// Unknown. An evaluation error (a field not there yet, e.g. no `status`) makes Flux wait, which
/// a user sees as in progress.
fn flux_status(exprs: &(String, String, String), object: &serde_json::Value) -> String {
    let mut ctx = cel_interpreter::Context::default();
    for (k, v) in object.as_object().into_iter().flatten() {
        ctx.add_variable(k.as_str(), v.clone())
            .unwrap_or_else(|e| panic!("{k}: {e}"));
    }
    for (expr, verdict) in [
        (&exprs.0, "InProgress"),
        (&exprs.1, "Failed"),
        (&exprs.2, "Current"),
    ] {
        let program = cel_interpreter::Program::compile(expr)
            .unwrap_or_else(|e| panic!("{verdict} does not compile: {e}\n{expr}"));
        match program.execute(&ctx) {
            Ok(cel_interpreter::Value::Bool(true)) => return verdict.to_string(),
            Ok(cel_interpreter::Value::Bool(false)) => {}
            Ok(other) => panic!("{verdict} is not a bool: {other:?}"),
            Err(_) => return "InProgress".to_string(),
        }
    }
    "Unknown".to_string()
}

#[test]
fn flux_health_check_exprs_under_a_cel_interpreter() {
    let exprs = flux_exprs();
    let fixtures = fixtures();
    let mut problems = Vec::new();
    for f in &fixtures {
        let got = flux_status(&exprs, &f.object);
        println!("{:<32} flux {got}", f.name);
        if got != f.flux {
            problems.push(format!("{}: Flux {got}, expected {}", f.name, f.flux));
        }
    }
    for want in ["Current", "InProgress", "Failed"] {
        assert!(
            fixtures.iter().any(|f| f.flux == want),
            "no fixture for {want}"
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn argocd_and_flux_agree_on_every_fixture() {
    for f in fixtures() {
        let same = matches!(
            (f.argocd.as_str(), f.flux.as_str()),
            ("Healthy", "Current") | ("Progressing", "InProgress") | ("Degraded", "Failed")
        );
        assert!(same, "{}: argocd={} flux={}", f.name, f.argocd, f.flux);
    }
}
