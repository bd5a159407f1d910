//! The README's "Install on your cluster" as written, on the bed (issue #56; docs/contract.md
//! "The README's install and uninstall work as written"): its `sh` blocks between the
//! `install-on-your-cluster` markers, in order, in one `bash -euo pipefail` from the repository
//! root — `make release … PUSH=1` into the bed's registry, the CRDs, the store Secret, `helm
//! install oci://…`, the sample run, `kubectl wait`, `kubectl sandboxrun files get` — then the
//! sample's file is read back from `./out`, then the README's "Uninstall" block runs and nothing
//! of the operator is left (its `-webhook-tls` and `-admission-key` Secrets, its settings
//! ConfigMap, the chart's objects, the CRDs).
//!
//! What differs from "your cluster", each a substitution that must find its text (a README that
//! changed it fails here, never runs something else), and each printed:
//! - `registry.example.com:5000` is the bed's loopback registry (`SANDBOXRUN_TEST_REGISTRY`), which
//!   speaks plain HTTP: `helm install` gets `--plain-http`;
//! - the bed's S3 server is not AWS: `helm install` gets a values file with its endpoint
//!   (`store.options`), and the shell's `AWS_*` (which the README takes the store Secret from and
//!   the plugin reads) are the bed's, with `AWS_ENDPOINT` and `AWS_ALLOW_HTTP`; `my-bucket` is the
//!   bed's bucket;
//! - the bed's real node is tainted and its kwok node runs no container: the operator (the same
//!   values file) and the sample (its `spec.nodeSelector` and `spec.tolerations`) go to the real
//!   node;
//! - no image reaches the bed from a public registry: the sample's `busybox:1.36` is the bed's
//!   busybox (`hack/images.sh base`), or `SANDBOXRUN_TEST_README_IMAGE` when set;
//! - the plugin is installed into a directory of the test's, first on PATH, not /usr/local/bin.
//!
//! It writes `dist/<version>/`, `./out` and `./sandboxrun-operator` in the repository (removed
//! at the end but dist/, which `make release` owns) and installs cluster-wide objects (CRDs, a
//! webhook for every namespace, an operator watching them all); the README's uninstall deletes
//! every SandboxRun of the cluster and the CRDs (put back at the end when they were there): an
//! area of its own, run alone like every area.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::support::*;

const INSTALL: &str = "install-on-your-cluster";
const UNINSTALL: &str = "uninstall";
const NAMESPACE: &str = "sandboxrun-system";
const RELEASE_PREFIX: &str = "sbr-";
const REAL_NODE_LABEL: &str = "sandbox.iterion.io/real-node";

/// The `sh` blocks between `<!-- {marker}` and `<!-- /{marker} -->` of `markdown`, in order.
fn marked_sh_blocks(markdown: &str, marker: &str) -> Vec<String> {
    let open = format!("<!-- {marker}");
    let close = format!("<!-- /{marker} -->");
    let Some(start) = markdown.lines().position(|l| l.starts_with(&open)) else {
        return Vec::new();
    };
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines().skip(start + 1) {
        if line.trim() == close {
            break;
        }
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), text) => {
                block.push_str(text);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// One difference between the README's cluster and the bed: `from` becomes `to`.
struct Substitution {
    why: &'static str,
    from: String,
    to: String,
}

/// `script` with every substitution made; panics naming one that found nothing.
fn substituted(script: &str, substitutions: &[Substitution]) -> String {
    let mut out = script.to_string();
    for s in substitutions {
        assert!(
            out.contains(&s.from),
            "the README no longer has {:?} ({}): update tests/it/readme_install.rs with it",
            s.from,
            s.why
        );
        eprintln!("readme_install: {:?} -> {:?} ({})", s.from, s.to, s.why);
        out = out.replace(&s.from, &s.to);
    }
    out
}

/// The image the sample runs on the bed: `SANDBOXRUN_TEST_README_IMAGE`, else the bed's busybox
/// as the real node pulls it.
fn sample_image() -> String {
    if let Ok(image) = std::env::var("SANDBOXRUN_TEST_README_IMAGE") {
        if !image.trim().is_empty() {
            return image.trim().to_string();
        }
    }
    let file = state_dir().join("images/busybox.ref");
    let pinned = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("no {} ({e}): hack/local-cluster.sh up", file.display()));
    let registry = bed_setting("SANDBOXRUN_TEST_POD_REGISTRY");
    match pinned.trim().split_once('/') {
        Some((_, rest)) => format!("{registry}/{rest}"),
        None => pinned.trim().to_string(),
    }
}

/// The values file `helm install` gets on the bed: the S3 server's endpoint as pods reach it, the
/// operator on the real node.
fn bed_values(dir: &Path) -> PathBuf {
    let values = json!({
        "store": {"options": [
            format!("endpoint={}", bed_setting("SANDBOXRUN_TEST_POD_S3_ENDPOINT")),
            "allow_http=true",
        ]},
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [
            {"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        ],
    });
    let file = dir.join("bed-values.json");
    std::fs::write(&file, values.to_string()).expect("write the bed's values");
    file
}

fn bed_substitutions(bin: &Path, values: &Path) -> Vec<Substitution> {
    let registry = bed_setting("SANDBOXRUN_TEST_REGISTRY");
    let placed = format!(
        "  image: {}\n  nodeSelector: {{{REAL_NODE_LABEL}: \"true\"}}\n  tolerations: \
         [{{key: {REAL_NODE_LABEL}, operator: Equal, value: \"true\", effect: NoSchedule}}]\n",
        sample_image()
    );
    vec![
        Substitution {
            why: "the bed's registry",
            from: "registry.example.com:5000".into(),
            to: registry,
        },
        Substitution {
            why: "the bed's registry speaks HTTP; its S3 endpoint; the operator on the real node",
            from: "helm install sbr oci://".into(),
            to: format!(
                "helm install --plain-http -f {} sbr oci://",
                values.display()
            ),
        },
        Substitution {
            why: "the bed's bucket",
            from: "s3://my-bucket/".into(),
            to: format!("s3://{}/", bed_setting("SANDBOXRUN_TEST_S3_BUCKET")),
        },
        Substitution {
            why: "the bed's busybox, on the real node",
            from: "  image: busybox:1.36\n".into(),
            to: placed,
        },
        Substitution {
            why: "the plugin in the test's directory, first on PATH",
            from: "/usr/local/bin/".into(),
            to: format!("{}/", bin.display()),
        },
    ]
}

/// `bash -euxo pipefail -c script` from the repository root with the bed's tools and store
/// credentials; panics with its output (and the operator's pods) when it fails.
fn run_script(what: &str, script: &str, bin: &Path) {
    let tools = tools_bin()
        .map(|b| b.display().to_string())
        .unwrap_or_default();
    let path = format!(
        "{}:{tools}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // Bounded: a README command that waits for ever (a run whose finalizer nothing releases)
    // fails the test after 25 minutes instead of holding the bed.
    let mut cmd = Command::new("timeout");
    cmd.args([
        "--kill-after=30s",
        "1500",
        "bash",
        "-euxo",
        "pipefail",
        "-c",
        script,
    ])
    .current_dir(repo())
    .env("PATH", path)
    .env("KUBECONFIG", kubeconfig_path())
    .env(
        "AWS_ACCESS_KEY_ID",
        bed_setting("SANDBOXRUN_TEST_S3_ACCESS_KEY"),
    )
    .env(
        "AWS_SECRET_ACCESS_KEY",
        bed_setting("SANDBOXRUN_TEST_S3_SECRET_KEY"),
    )
    .env("AWS_REGION", "us-east-1")
    .env("AWS_ENDPOINT", bed_setting("SANDBOXRUN_TEST_S3_ENDPOINT"))
    .env("AWS_ALLOW_HTTP", "true");
    let out = run(cmd, None);
    let log = format!(
        "--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        let mut describe = tool("kubectl");
        describe.args(["describe", "pods,sbr", "-n", NAMESPACE]);
        let pods = String::from_utf8_lossy(&run(describe, None).stdout).to_string();
        panic!(
            "{what} failed ({}):\n{log}\n--- {NAMESPACE}\n{pods}",
            out.status
        );
    }
    eprintln!("readme_install: {what}:\n{log}");
}

/// `kubectl get <kinds> -o name` (in `namespace`, or cluster-wide), each name.
fn names(kinds: &str, namespace: Option<&str>) -> Vec<String> {
    let mut cmd = tool("kubectl");
    cmd.args(["get", kinds, "-o", "name", "--ignore-not-found"]);
    if let Some(ns) = namespace {
        cmd.args(["-n", ns]);
    }
    let out = run(cmd, None);
    assert!(out.status.success(), "kubectl get {kinds}: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// What of the operator is left on the cluster: objects of the release `sbr` in its namespace
/// (the chart's and what the operator wrote beside them), cluster-scoped ones, and the CRDs.
fn operator_leftovers() -> Vec<String> {
    let in_namespace = names(
        "all,secrets,configmaps,leases,serviceaccounts,roles,rolebindings,pvc,networkpolicies",
        Some(NAMESPACE),
    );
    let cluster = names(
        "clusterroles,clusterrolebindings,validatingwebhookconfigurations,\
         mutatingwebhookconfigurations",
        None,
    );
    let crds = names("customresourcedefinitions", None);
    in_namespace
        .into_iter()
        .chain(cluster)
        .filter(|n| {
            n.split('/')
                .nth(1)
                .is_some_and(|n| n.starts_with(RELEASE_PREFIX))
        })
        .chain(
            crds.into_iter()
                .filter(|n| n.ends_with(".sandbox.iterion.io")),
        )
        .collect()
}

/// Puts the bed back as the test found it, whatever happened: the release and its webhook gone,
/// the namespace deleted when the test made it, the CRDs back when they were there, the files the
/// README wrote into the repository removed.
struct Restore {
    namespace_was_there: bool,
    crds_were_there: bool,
    dir: PathBuf,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let mut script = String::from(
            "kubectl delete sandboxruns --all -A --wait --timeout=90s || true\n\
             helm uninstall sbr -n sandboxrun-system --wait --timeout 2m || true\n\
             kubectl delete validatingwebhookconfigurations,mutatingwebhookconfigurations \
             -l app.kubernetes.io/instance=sbr --ignore-not-found || true\n\
             rm -rf out sandboxrun-operator hello.yaml\n",
        );
        if !self.namespace_was_there {
            script.push_str(
                "kubectl delete namespace sandboxrun-system --ignore-not-found --wait=false\n",
            );
        }
        if self.crds_were_there {
            script.push_str("kubectl apply --server-side --force-conflicts -k crds/ >/dev/null\n");
        }
        let tools = tools_bin()
            .map(|b| b.display().to_string())
            .unwrap_or_default();
        let mut cmd = Command::new("bash");
        cmd.args(["-c", &script])
            .current_dir(repo())
            .env("KUBECONFIG", kubeconfig_path())
            .env(
                "PATH",
                format!("{tools}:{}", std::env::var("PATH").unwrap_or_default()),
            );
        let _ = run(cmd, None);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn the_readme_sections_are_found_with_their_sh_blocks_only() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let install = marked_sh_blocks(&readme, INSTALL);
    assert_eq!(
        install.len(),
        2,
        "the install block and the sample: {install:?}"
    );
    assert!(install[0].starts_with("make release "), "{}", install[0]);
    assert!(
        install[1].contains("kubectl sandboxrun files get hello"),
        "{}",
        install[1]
    );
    let uninstall = marked_sh_blocks(&readme, UNINSTALL);
    assert_eq!(uninstall.len(), 1, "{uninstall:?}");
    assert!(
        uninstall[0].contains("kubectl delete -f dist/"),
        "{}",
        uninstall[0]
    );
    let text = "<!-- x: y -->\n```console\n$ no\n```\n```sh\na\n```\n<!-- /x -->\n```sh\nb\n```\n";
    assert_eq!(marked_sh_blocks(text, "x"), vec!["a\n".to_string()]);
}

#[test]
fn the_readmes_install_as_written_brings_the_samples_files_back_and_its_uninstall_leaves_nothing() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let (install, uninstall) = (
        marked_sh_blocks(&readme, INSTALL),
        marked_sh_blocks(&readme, UNINSTALL),
    );
    assert!(
        !install.is_empty() && !uninstall.is_empty(),
        "README markers"
    );
    let dir = host_dir("readme-install");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    let restore = Restore {
        namespace_was_there: names("namespaces", None).contains(&format!("namespace/{NAMESPACE}")),
        crds_were_there: !names("customresourcedefinitions", None)
            .iter()
            .all(|n| !n.ends_with(".sandbox.iterion.io")),
        dir: dir.clone(),
    };
    let _ = std::fs::remove_dir_all(repo().join("out"));
    let substitutions = bed_substitutions(&bin, &bed_values(&dir));
    run_script(
        "the README's install",
        &substituted(&install.concat(), &substitutions),
        &bin,
    );
    // `make release` built every artefact a release names, the Python wheel among them.
    let version = env!("CARGO_PKG_VERSION");
    let sums = std::fs::read_to_string(repo().join(format!("dist/{version}/SHA256SUMS")))
        .expect("dist/<version>/SHA256SUMS");
    for artefact in [
        format!("sandboxrun-{version}-py3-none-any.whl"),
        format!("sandboxrun-operator-{version}.tgz"),
        "sandboxrun-operator-linux-amd64.tar.gz".to_string(),
    ] {
        assert!(
            sums.lines().any(|l| l.ends_with(&format!("  {artefact}"))),
            "make release built no {artefact}:\n{sums}"
        );
    }
    let fetched = repo().join("out/00-work-out/hello.txt");
    assert_eq!(
        std::fs::read_to_string(&fetched).unwrap_or_else(|e| panic!("{}: {e}", fetched.display())),
        "hello\n",
        "the sample's file, fetched by `kubectl sandboxrun files get`"
    );
    let mut phase = tool("kubectl");
    phase.args(["get", "sbr", "hello", "-o", "jsonpath={.status.phase}"]);
    assert_eq!(
        String::from_utf8_lossy(&run(phase, None).stdout),
        "Succeeded"
    );

    run_script("the README's uninstall", &uninstall.concat(), &bin);
    let left = operator_leftovers();
    assert!(left.is_empty(), "the README's uninstall left {left:?}");
    drop(restore);
}
