//! Test support for the integration tests: connects to the local control plane started by
//! `hack/local-cluster.sh up`, gives each test a fresh namespace (deleted afterwards), and runs the
//! real operator binary against it. Without a running cluster every test that asks for one FAILS
//! with a message saying how to start it — never a silent skip or pass.
//!
//! One home for every helper the test files share: `cli` (the binary's verbs), `runs` (specs, create, end a workload),
//! `wait` (phases, polling), `operator` (`Operator::builder`), `kubectl` (commands, `apply`, the
//! plugin), `partition` (an apiserver
//! partition for one process), `ports`, `store` (S3 options,
//! `files get`), `egress` (the token secret, an operator with the proxy), `pools` (a template and
//! a pool of it, its ready pods), `templates`, `trees`, `tars`, `corpus`, `webhooks`, `s3_server`. Every test binary compiles
//! all of it and uses a part, hence the allows.
#![allow(dead_code, unused_imports)]

pub mod cli;
pub mod corpus;
pub mod egress;
pub mod events;
pub mod kubectl;
pub mod operator;
pub mod partition;
pub mod pools;
pub mod ports;
pub mod runs;
pub mod s3_server;
pub mod store;
pub mod tars;
pub mod templates;
pub mod trees;
pub mod wait;
pub mod webhooks;

/// The crate's one `SandboxRun` builder (`src/testkit/run.rs`), compiled here as it is: the unit
/// and the integration tests build a run the same way. It names the API as `super::api`.
#[path = "../../../src/testkit/run.rs"]
pub mod run_kit;
use sandboxrun_operator::api;

pub use cli::*;
pub use corpus::*;
pub use egress::*;
pub use events::*;
pub use kubectl::*;
pub use operator::{Operator, OperatorBuilder};
pub use partition::ApiserverProxy;
pub use pools::*;
pub use ports::free_port;
pub use run_kit::{sandbox_run, RunBuilder};
pub use runs::*;
pub use store::*;
pub use tars::*;
pub use templates::*;
pub use trees::*;
pub use wait::*;
pub use webhooks::*;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The kubeconfig of the local control plane: $KUBECONFIG if set, else the harness's default.
pub fn kubeconfig_path() -> PathBuf {
    std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".k8s-local/kubeconfig"))
}

/// The harness's state directory (PKI, logs).
pub fn state_dir() -> PathBuf {
    std::env::var_os("SANDBOXRUN_TEST_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".k8s-local"))
}

/// The directory holding kubectl and friends.
pub fn tools_bin() -> Option<PathBuf> {
    let out = Command::new(repo().join("hack/local-cluster.sh"))
        .arg("env")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines().find_map(|l| {
        l.strip_prefix("export PATH=")
            .and_then(|v| v.split(':').next())
            .map(PathBuf::from)
    })
}

/// The test bed's Kubernetes version (`K8S_VERSION` in hack/versions.env, without the `v`), for
/// `helm template|lint --kube-version`: the chart's kubeVersion (>=1.30) is checked against it,
/// and a Helm built with `go install` (the bed's) defaults to v1.20 without its release ldflags.
pub fn bed_kube_version() -> String {
    std::fs::read_to_string(repo().join("hack/versions.env"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("K8S_VERSION="))
        .map(|v| v.trim().trim_start_matches('v').to_string())
        .unwrap_or_else(|| "1.36.0".to_string())
}

const HOW_TO_START: &str =
    "the local control plane is not running. Start it with `hack/local-cluster.sh up` \
(or run the whole suite with `make test`, which brings it up and down)";

/// Installs the rustls crypto provider once per test process.
pub fn crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client of the local control plane; panics with instructions when it is not up.
pub async fn client() -> Client {
    crypto();
    let path = kubeconfig_path();
    let kc = Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("{HOW_TO_START} (cannot read {}: {e})", path.display()));
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{HOW_TO_START} (bad kubeconfig {}: {e})", path.display()));
    let client = Client::try_from(config).unwrap_or_else(|e| panic!("{HOW_TO_START} ({e})"));
    if let Err(e) = client.apiserver_version().await {
        panic!("{HOW_TO_START} (apiserver does not answer: {e})");
    }
    client
}

/// A client of the test bed acting as `user` (impersonated by the bed's admin credentials).
pub async fn client_as(user: &str) -> Client {
    crypto();
    let path = kubeconfig_path();
    let kc = Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("{HOW_TO_START} ({e})"));
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{HOW_TO_START} ({e})"));
    config.auth_info.impersonate = Some(user.to_string());
    Client::try_from(config).unwrap_or_else(|e| panic!("{HOW_TO_START} ({e})"))
}

/// Applies the committed CRDs (the same files users apply: SandboxRun, SandboxRunTemplate and
/// ClusterSandboxRunTemplate)
/// and waits until they are established.
pub async fn ensure_crd(client: &Client) {
    static DONE: OnceLock<()> = OnceLock::new();
    if DONE.get().is_some() {
        return;
    }
    for name in [
        "sandboxruns.sandbox.iterion.io",
        "sandboxruntemplates.sandbox.iterion.io",
        "clustersandboxruntemplates.sandbox.iterion.io",
        "sandboxrunpools.sandbox.iterion.io",
    ] {
        apply_crd(client, name).await;
    }
    let _ = DONE.set(());
}

/// Applies `crds/<name>.yaml` and waits until it is established.
async fn apply_crd(client: &Client, name: &str) {
    let text = std::fs::read_to_string(repo().join(format!("crds/{name}.yaml")))
        .unwrap_or_else(|e| panic!("crds/{name}.yaml (run `make crds`): {e}"));
    let crd: CustomResourceDefinition = serde_yaml::from_str(&text).expect("CRD parses");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        name,
        &PatchParams::apply("sandboxrun-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply CRD");
    for _ in 0..100 {
        let c = api.get(name).await.expect("get CRD");
        let established = c.status.and_then(|s| s.conditions).is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if established {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("CRD {name} not established");
}

/// A namespace that exists for one test and is deleted when dropped.
pub struct TestNamespace {
    pub name: String,
}

impl TestNamespace {
    /// Creates `t-<prefix>-<random>`, labelled so webhooks in tests can select it.
    pub async fn new(client: &Client, prefix: &str) -> TestNamespace {
        let suffix: String = format!("{:08x}", rand_u32());
        let name = format!("t-{prefix}-{suffix}");
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("sandboxrun-test".to_string(), name.clone())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create test namespace");
        // Pods need the default ServiceAccount, which the controller-manager creates shortly.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        for _ in 0..100 {
            if sas.get_opt("default").await.ok().flatten().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        TestNamespace { name }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("SANDBOXRUN_KEEP_NAMESPACES").is_some() {
            return;
        }
        let name = self.name.clone();
        clean_up_from_drop(move |client| async move {
            // The test's operator is gone (or going): runs still holding its finalizer would
            // keep the namespace Terminating for good, and the namespace controller would retry
            // its deletion now and then for the rest of the bed's life (writes in every later
            // benchmark's count). The test is over: let them go.
            let runs: Api<sandboxrun_operator::api::SandboxRun> =
                Api::namespaced(client.clone(), &name);
            if let Ok(list) = runs.list(&Default::default()).await {
                let release = serde_json::json!({"metadata": {"finalizers": null}});
                for run in list.items {
                    let _ = runs
                        .patch(
                            &kube::ResourceExt::name_any(&run),
                            &PatchParams::default(),
                            &Patch::Merge(&release),
                        )
                        .await;
                }
            }
            let _ = Api::<Namespace>::all(client)
                .delete(&name, &DeleteParams::background())
                .await;
        });
    }
}

/// A ClusterSandboxRunTemplate of a test, deleted when the test ends, however it ends
/// (cluster-scoped: no test namespace takes it with it).
pub struct ClusterTemplate(pub String);

impl Drop for ClusterTemplate {
    fn drop(&mut self) {
        use sandboxrun_operator::api::ClusterSandboxRunTemplate;
        let name = self.0.clone();
        clean_up_from_drop(move |client| async move {
            let _ = Api::<ClusterSandboxRunTemplate>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

/// Runs an async clean-up from a `Drop`, which cannot await: on a short-lived runtime of its own
/// thread, joined, with a client of its own (the test's client has its worker task on the test's
/// runtime, which is blocked in this join: sharing it would deadlock).
pub fn clean_up_from_drop<F, Fut>(clean_up: F)
where
    F: FnOnce(Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(async move { clean_up(client().await).await });
        }
    })
    .join();
}

/// A pseudo-random u32 (time and a counter; uniqueness is all tests need).
pub fn rand_u32() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(13))
        .unwrap_or(0);
    nanos
        .wrapping_mul(2654435761)
        .wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(40503))
        ^ std::process::id()
}

/// One setting of the running test bed, as `hack/local-cluster.sh env` exports it (fails with
/// instructions when absent: a test never skips silently).
pub fn bed_setting(key: &str) -> String {
    static ENV: OnceLock<String> = OnceLock::new();
    let text = ENV.get_or_init(|| {
        let out = Command::new(repo().join("hack/local-cluster.sh"))
            .arg("env")
            .output()
            .expect("run hack/local-cluster.sh env");
        String::from_utf8_lossy(&out.stdout).to_string()
    });
    text.lines()
        .find_map(|l| {
            l.strip_prefix(&format!("export {key}="))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("{HOW_TO_START} ({key} missing from hack/local-cluster.sh env)"))
}

/// A kubeconfig that authenticates as ServiceAccount `namespace/name` with a fresh token, and
/// nothing else.
pub async fn service_account_kubeconfig(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> std::path::PathBuf {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), namespace);
    let token = sas
        .create_token_request(
            name,
            &Default::default(),
            &TokenRequest {
                metadata: Default::default(),
                spec: Some(TokenRequestSpec {
                    audiences: None,
                    expiration_seconds: Some(3600),
                    bound_object_ref: None,
                }),
                status: None,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("a token for ServiceAccount {namespace}/{name}: {e}"))
        .status
        .and_then(|s| s.token)
        .expect("a token");
    let server = apiserver_url();
    let path = std::env::temp_dir().join(format!("{namespace}-{name}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{server}\", certificate-authority: \"{}\"}}}}]\nusers: [{{name: sa, user: {{token: \"{token}\"}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: sa}}}}]\ncurrent-context: c\n",
            state_dir().join("pki/ca.crt").display()
        ),
    )
    .expect("write the ServiceAccount's kubeconfig");
    path
}

/// A fresh host directory under the harness state (kwok's exec runs on this host, so a pod's
/// "container path" in tests is a real host path).
pub fn host_dir(name: &str) -> PathBuf {
    let dir = state_dir()
        .join("paths")
        .join(format!("{name}-{:08x}", rand_u32()));
    std::fs::create_dir_all(&dir).expect("create host dir");
    dir
}

/// Writes `len` deterministic pseudo-random bytes to `path`.
pub fn write_pattern(path: &Path, len: u64, seed: u64) {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create file"));
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut left = len;
    let mut buf = vec![0u8; 64 * 1024];
    while left > 0 {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let bytes = x.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).expect("write");
        left -= n as u64;
    }
    f.flush().expect("flush");
}

/// A tool of the test bed (kubectl, helm) by path, so the test does not depend on the caller's PATH.
pub fn tool(name: &str) -> Command {
    let path = tools_bin()
        .map(|b| b.join(name))
        .filter(|p| p.exists())
        .unwrap_or_else(|| name.into());
    let mut cmd = Command::new(path);
    cmd.current_dir(repo()).env("KUBECONFIG", kubeconfig_path());
    cmd
}

/// The test bed's helm with `args`.
pub fn helm(args: &[&str]) -> Command {
    let mut cmd = tool("helm");
    cmd.args(args);
    // Rendering offline checks the chart's kubeVersion against --kube-version: the bed's.
    if matches!(args.first(), Some(&"template") | Some(&"lint"))
        && !args.contains(&"--kube-version")
    {
        cmd.args(["--kube-version", &bed_kube_version()]);
    }
    cmd
}

/// [`helm`] with `args`, run to its end (see [`run`]).
pub fn run_helm(args: &[&str]) -> std::process::Output {
    run(helm(args), None)
}

/// Runs `cmd` to its end with `stdin` (or none) and its output captured; panics only when it
/// cannot be started.
pub fn run(mut cmd: Command, stdin: Option<&[u8]>) -> std::process::Output {
    let what = format!("{cmd:?}");
    cmd.stdin(if stdin.is_some() {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().expect("stdin is piped");
        std::io::Write::write_all(&mut pipe, bytes)
            .unwrap_or_else(|e| panic!("writing to {what}: {e}"));
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for {what}: {e}"))
}

/// The apiserver's address in the test bed's kubeconfig.
pub fn apiserver_url() -> String {
    let admin = std::fs::read_to_string(kubeconfig_path()).expect("the test bed's kubeconfig");
    admin
        .lines()
        .find_map(|l| l.split("server: \"").nth(1))
        .and_then(|s| s.split('"').next())
        .expect("the apiserver's address in the kubeconfig")
        .to_string()
}
