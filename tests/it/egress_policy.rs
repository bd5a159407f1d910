//! The per-run NetworkPolicy on the real control plane (docs/contract.md "ADR-006 network rules:
//! validated and enforced"): for each mode, the object the operator applies before the pod
//! (shape, owner, selector), the proxy variables of the pod, the EgressPolicyApplied Event, the
//! policy deleted with the run by the garbage collector; `--network-policy=unenforced-refuse`
//! keeps a restricted run from starting and `unenforced-warn` starts it with a Warning; the
//! `egress-proxy` binary follows runs (rules, deletion) through its watch of the apiserver.
//! Enforcement by a network plugin is not tested here (the bed's plugins do not enforce it).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy as NetPol;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use sandboxrun_operator::api::{NetworkMode, NetworkPolicy, SandboxRun, SandboxRunSpec};
use sandboxrun_operator::egress::policy::policy_name;
use sandboxrun_operator::egress::token;
use sandboxrun_operator::pod::{pod_name, workload_env, RUN_UID_LABEL};

use crate::support::*;

/// A run of [`DIGEST_IMAGE`] as uid 1000 with `network` (mode and rules), nothing else.
fn network_spec(network: Option<(NetworkMode, &[&str])>) -> SandboxRunSpec {
    SandboxRunSpec {
        image: Some(DIGEST_IMAGE.into()),
        user: Some("1000:1000".into()),
        network: network.map(|(mode, rules)| NetworkPolicy {
            mode,
            rules: rules.iter().map(|r| r.to_string()).collect(),
        }),
        ..Default::default()
    }
}

async fn events(client: &kube::Client, ns: &str, run: &str) -> Vec<CoreEvent> {
    let api: Api<CoreEvent> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().fields(&format!("involvedObject.name={run}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

async fn event_with(
    client: &kube::Client,
    ns: &str,
    run: &str,
    reason: &str,
    op: &Operator,
) -> CoreEvent {
    eventually_or_log(
        &format!("Event {reason} of {run}"),
        Duration::from_secs(30),
        op,
        || async {
            events(client, ns, run)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
        },
    )
    .await
}

#[tokio::test]
async fn each_mode_gets_its_policy_before_the_pod_and_the_policy_goes_with_the_run() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "egress").await;
    let secret = egress_secret_file();
    let op = egress_operator(&ns.name, "egress", secret.path(), &[]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let policies: Api<NetPol> = Api::namespaced(client.clone(), &ns.name);

    let open = create(&runs, "open", network_spec(Some((NetworkMode::Open, &[])))).await;
    let none = create(&runs, "none", network_spec(None)).await;
    let deny = create(
        &runs,
        "deny-all",
        network_spec(Some((NetworkMode::Allowlist, &[]))),
    )
    .await;
    let sample = create(
        &runs,
        "sample",
        network_spec(Some((
            NetworkMode::Denylist,
            &["169.254.169.254", "**.internal"],
        ))),
    )
    .await;
    let allow = create(
        &runs,
        "allow",
        network_spec(Some((
            NetworkMode::Allowlist,
            &["**.github.com", "10.0.0.0/8", "!10.1.0.0/16"],
        ))),
    )
    .await;

    // Open runs: a pod, no policy, no proxy variables.
    for run in [&open, &none] {
        let pod = wait_for_pod(&pods, &run.name_any(), &op).await;
        assert!(
            policies
                .get_opt(&policy_name(&run.name_any()))
                .await
                .expect("get policy")
                .is_none(),
            "{} has no policy",
            run.name_any()
        );
        assert_eq!(workload_env(&pod, "HTTPS_PROXY"), None);
    }

    // Restricted runs: the policy exists by the time the pod does.
    for run in [&deny, &sample, &allow] {
        let name = run.name_any();
        let uid = run.uid().expect("uid");
        let pod = wait_for_pod(&pods, &name, &op).await;
        let policy = policies
            .get_opt(&policy_name(&name))
            .await
            .expect("get policy")
            .unwrap_or_else(|| panic!("{name}: the policy exists once the pod does"));
        assert!(
            policy.creation_timestamp() <= pod.creation_timestamp(),
            "{name}: applied before the pod"
        );
        let owner = &policy.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("SandboxRun", uid.as_str(), Some(true))
        );
        let spec = policy.spec.clone().expect("spec");
        assert_eq!(
            spec.pod_selector
                .and_then(|s| s.match_labels)
                .and_then(|l| l.get(RUN_UID_LABEL).cloned()),
            Some(uid.clone()),
            "{name}: selects the run's pod only"
        );
        assert_eq!(
            pod.labels().get(RUN_UID_LABEL),
            Some(&uid),
            "{name}: the pod carries the label the policy selects"
        );
        // Ingress listed in policyTypes with no rule: nothing may connect (the apiserver drops
        // the empty list on the way back).
        assert!(
            spec.ingress.clone().unwrap_or_default().is_empty(),
            "{name}: no ingress"
        );
        assert_eq!(
            spec.policy_types,
            Some(vec!["Ingress".to_string(), "Egress".to_string()])
        );
        let egress = spec.egress.clone().unwrap_or_default();
        let proxy_env = workload_env(&pod, "HTTPS_PROXY").map(str::to_string);
        match name.as_str() {
            "deny-all" => {
                assert!(egress.is_empty(), "deny-all: no egress rule: {egress:?}");
                assert_eq!(proxy_env, None, "deny-all: no proxy either");
            }
            _ => {
                // A denylist run without `!` rules: no address range (it never widens what its
                // namespace's own policies deny; the proxy applies its denylist to names).
                let want = if name == "sample" { 2 } else { 3 };
                assert_eq!(
                    egress.len(),
                    want,
                    "{name}: DNS, proxy (, addresses): {egress:?}"
                );
                let proxy_peer = &egress[1].to.as_ref().expect("to")[0];
                assert_eq!(
                    proxy_peer
                        .namespace_selector
                        .as_ref()
                        .and_then(|s| s.match_labels.as_ref())
                        .and_then(|l| l.get("kubernetes.io/metadata.name"))
                        .map(String::as_str),
                    Some("sys")
                );
                let blocks: Vec<_> = egress
                    .iter()
                    .flat_map(|r| r.to.clone().unwrap_or_default())
                    .filter_map(|p| p.ip_block)
                    .collect();
                if name == "sample" {
                    assert!(blocks.is_empty(), "{name}: {blocks:?}");
                } else {
                    let first = &blocks[0];
                    assert_eq!(first.cidr, "10.0.0.0/8");
                    assert_eq!(first.except, Some(vec!["10.1.0.0/16".to_string()]));
                }
                let url = proxy_env.unwrap_or_else(|| panic!("{name}: HTTPS_PROXY set"));
                let (creds, host) = url
                    .strip_prefix("http://")
                    .and_then(|u| u.split_once('@'))
                    .expect("userinfo in the proxy URL");
                assert_eq!(host, "egress.sys.svc:3128");
                let (user, tok) = creds.split_once(':').expect("user:token");
                assert_eq!(user, uid);
                assert!(
                    token::verify(EGRESS_TOKEN_SECRET.as_bytes(), &uid, tok),
                    "{name}: token"
                );
                assert_eq!(workload_env(&pod, "http_proxy"), Some(url.as_str()));
                assert!(workload_env(&pod, "NO_PROXY").is_some());
            }
        }
        let ev = event_with(&client, &ns.name, &name, "EgressPolicyApplied", &op).await;
        let note = ev.message.unwrap_or_default();
        assert!(note.contains(&policy_name(&name)), "{note}");
        assert!(
            note.contains("enforced by the cluster's network plugin"),
            "{note}"
        );
    }

    // Deleted with the run: the garbage collector follows the ownerReference.
    for run in [&deny, &sample, &allow] {
        runs.delete(&run.name_any(), &DeleteParams::default())
            .await
            .expect("delete run");
    }
    for run in [&deny, &sample, &allow] {
        let name = policy_name(&run.name_any());
        eventually_or_log(
            &format!("policy {name} deleted with its run"),
            Duration::from_secs(120),
            &op,
            || {
                let policies = policies.clone();
                let name = name.clone();
                async move { matches!(policies.get_opt(&name).await, Ok(None)).then_some(()) }
            },
        )
        .await;
    }
}

#[tokio::test]
async fn unenforced_refuse_keeps_a_restricted_run_from_starting_and_warn_starts_it() {
    let client = client().await;
    ensure_crd(&client).await;
    let secret = egress_secret_file();

    // Refuse.
    let ns = TestNamespace::new(&client, "egress-refuse").await;
    let op = egress_operator(
        &ns.name,
        "egress",
        secret.path(),
        &["--network-policy", "unenforced-refuse"],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let policies: Api<NetPol> = Api::namespaced(client.clone(), &ns.name);
    create(
        &runs,
        "restricted",
        network_spec(Some((NetworkMode::Allowlist, &["x.example.com"]))),
    )
    .await;
    create(&runs, "unrestricted", network_spec(None)).await;
    let refused = eventually_or_log(
        "the restricted run refused",
        Duration::from_secs(60),
        &op,
        || {
            let runs = runs.clone();
            async move {
                let r = runs.get("restricted").await.ok()?;
                let ready = r
                    .status
                    .as_ref()?
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "Ready")?
                    .clone();
                (ready.reason == "EgressPolicyUnenforced").then_some((r, ready))
            }
        },
    )
    .await;
    assert_eq!(refused.1.status, "False");
    assert!(
        refused.1.message.contains("unenforced-refuse"),
        "{}",
        refused.1.message
    );
    let ev = event_with(
        &client,
        &ns.name,
        "restricted",
        "EgressPolicyUnenforced",
        &op,
    )
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    // The unrestricted run starts; the restricted one has neither pod nor policy.
    wait_for_pod(&pods, "unrestricted", &op).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(pods
        .get_opt(&pod_name("restricted"))
        .await
        .expect("get pod")
        .is_none());
    assert!(policies
        .get_opt(&policy_name("restricted"))
        .await
        .expect("get policy")
        .is_none());
    drop(op);

    // Warn.
    let ns = TestNamespace::new(&client, "egress-warn").await;
    let op = egress_operator(
        &ns.name,
        "egress",
        secret.path(),
        &["--network-policy", "unenforced-warn"],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let policies: Api<NetPol> = Api::namespaced(client.clone(), &ns.name);
    create(
        &runs,
        "restricted",
        network_spec(Some((NetworkMode::Allowlist, &["x.example.com"]))),
    )
    .await;
    wait_for_pod(&pods, "restricted", &op).await;
    let ev = event_with(
        &client,
        &ns.name,
        "restricted",
        "EgressPolicyUnenforced",
        &op,
    )
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert!(ev
        .message
        .unwrap_or_default()
        .contains("may not be filtered"));
    // The policy is still applied (harmless where unenforced, right once it is enforced).
    assert!(policies
        .get_opt(&policy_name("restricted"))
        .await
        .expect("get policy")
        .is_some());
}

/// `sandboxrun-operator egress-proxy` itself, against the apiserver: ready once it has listed the
/// runs; a run's token opens its rules; a rule edit on the run and its deletion reach the proxy
/// through its watch.
#[tokio::test]
async fn the_proxy_binary_follows_the_runs_on_the_apiserver() {
    use kube::api::{Patch, PatchParams};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "egress-proxy").await;
    let secret = egress_secret_file();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let run = create(
        &runs,
        "proxied",
        network_spec(Some((NetworkMode::Allowlist, &["127.0.0.1"]))),
    )
    .await;
    let uid = run.uid().expect("uid");
    // The run's pod, as the proxy's pod watch sees it: labelled by the operator, at the address
    // the test connects from. Held by a scheduling gate so that no node (kwok) rewrites its status.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "proxied-pod", "labels": {
            "app.kubernetes.io/managed-by": "sandboxrun-operator",
            RUN_UID_LABEL: uid,
        }},
        "spec": {
            "schedulingGates": [{"name": "sandboxrun-test/held"}],
            "containers": [{"name": "c", "image": "registry.example/none:1"}],
        },
    }))
    .expect("pod");
    pods.create(&Default::default(), &pod)
        .await
        .expect("create the run's pod");
    pods.patch_status(
        "proxied-pod",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&serde_json::json!({"status": {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
        }})),
    )
    .await
    .expect("the pod's address");

    // A local echo server the run may reach.
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let target = echo.local_addr().expect("addr").to_string();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });

    let port = free_port();
    let metrics = free_port();
    let log = std::env::temp_dir().join(format!("egress-proxy-{}.log", ns.name));
    let out = std::fs::File::create(&log).expect("log");
    let err = out.try_clone().expect("log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"))
        .args([
            "egress-proxy",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--metrics-addr",
            &format!("127.0.0.1:{metrics}"),
            "--namespaces",
            &ns.name,
            "--token-secret-file",
            secret.path().to_str().expect("utf-8"),
        ])
        .env("KUBECONFIG", kubeconfig_path())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start egress-proxy");
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _kill = Kill(&mut child);
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();

    let ready = |code: &'static str| {
        let url = format!("http://127.0.0.1:{metrics}/readyz");
        async move {
            let out = tokio::process::Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &url])
                .output()
                .await
                .ok()?;
            (String::from_utf8_lossy(&out.stdout) == code).then_some(())
        }
    };
    eventually(
        "the proxy ready (runs listed)",
        Duration::from_secs(30),
        || ready("200"),
    )
    .await;

    let ask = |auth: String| {
        let target = target.clone();
        async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect");
            let req = format!(
                "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n"
            );
            s.write_all(req.as_bytes()).await.expect("write");
            let mut buf = vec![0u8; 1024];
            let n = s.read(&mut buf).await.expect("read");
            String::from_utf8_lossy(&buf[..n]).to_string()
        }
    };
    let auth = token::basic_header(&uid, &token::token(EGRESS_TOKEN_SECRET.as_bytes(), &uid));
    let head = ask(auth.clone()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{}", logs());

    // A rule edit on the run reaches the proxy through its watch.
    runs.patch(
        "proxied",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"spec": {"network": {"rules": ["10.0.0.1"]}}})),
    )
    .await
    .expect("edit the rules");
    let denied = eventually("the edit to take effect", Duration::from_secs(30), || {
        let ask = ask(auth.clone());
        async move {
            let head = ask.await;
            head.starts_with("HTTP/1.1 403").then_some(head)
        }
    })
    .await;
    assert!(denied.contains("the default of mode allowlist"), "{denied}");

    // Ended (not yet deleted): its token opens nothing.
    runs.patch_status(
        "proxied",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .expect("end the run");
    let ended = eventually("the end to take effect", Duration::from_secs(30), || {
        let ask = ask(auth.clone());
        async move {
            let head = ask.await;
            head.starts_with("HTTP/1.1 407").then_some(head)
        }
    })
    .await;
    assert!(ended.contains("has ended"), "{ended}");

    // Deleted: its token opens nothing.
    runs.delete("proxied", &DeleteParams::default())
        .await
        .expect("delete run");
    eventually(
        "the deletion to take effect",
        Duration::from_secs(30),
        || {
            let ask = ask(auth.clone());
            async move { ask.await.starts_with("HTTP/1.1 407").then_some(()) }
        },
    )
    .await;
    let metrics_text = tokio::process::Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{metrics}/metrics")])
        .output()
        .await
        .expect("curl metrics");
    let text = String::from_utf8_lossy(&metrics_text.stdout).to_string();
    // Counts, not exact values: until the rule edit reached the proxy, the polling above was
    // still allowed, so "allowed" is at least the first tunnel.
    let count = |verdict: &str| -> u64 {
        let prefix = format!("sandboxrun_egress_requests_total{{verdict=\"{verdict}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    assert!(count("allowed") >= 1, "{text}");
    assert!(count("denied") >= 1, "{text}");
    assert!(count("unauthenticated") >= 1, "{text}");
}
