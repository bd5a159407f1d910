//! `spec.network` on real containers: the run's NetworkPolicy and the egress proxy enforced from
//! inside, a filtered run's first instruction already filtered, the gate anchored on the proxy's
//! canary, a namespace's default-deny egress policy.

use super::*;

/// What a run's workload does in the egress test: waits for the test's go-ahead (the enforcer has
/// programmed this pod), then tries each address directly and, when the operator gave it a proxy,
/// through the egress proxy, and writes one `name=ok|fail <answer>` line per attempt to its
/// termination message. busybox's applets are called through `busybox` (the image links only a
/// few); its wget has no timeout option, hence `timeout`.
const EGRESS_PROBE: &str = r#"bb=/bin/busybox
i=0; while [ ! -e /tmp/go ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done
try() {
  name=$1; shift
  if r=$($bb timeout 10 $bb wget -q -O - "$@" 2>&1); then echo "$name=ok $r"; else echo "$name=fail $r"; fi
}
{
  try direct_allowed -Y off "http://$ALLOWED/"
  try direct_denied -Y off "http://$DENIED/"
  if [ -n "${http_proxy:-}" ]; then
    echo "proxy_host=${http_proxy##*@}"
    # The bed has no cluster DNS: the proxy's Service name is swapped for its ClusterIP; the
    # scheme, the run's uid:token and the port stay the operator's.
    export http_proxy="${http_proxy%@*}@$PROXY_ADDR:${http_proxy##*:}"
    try proxy_allowed "http://$ALLOWED/"
    try proxy_denied "http://$DENIED/"
  fi
} > /dev/termination-log
cat /dev/termination-log
"#;

/// Starts the run's probe once the NetworkPolicy enforcer (kube-router, hack/real-node.sh) has
/// programmed its pod: a plugin applies a new pod's rules a moment after the pod got its address,
/// so the workload waits for the go-ahead instead of racing it. Returns the pod's IP.
async fn release_probe(pods: &Api<Pod>, ns: &str, run: &SandboxRun) -> String {
    let pod = pod_of(run);
    let ip = eventually(
        "the run's pod to get an IP",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            let pod = pod.clone();
            async move { pods.get(&pod).await.ok()?.status?.pod_ip }
        },
    )
    .await;
    let rule = format!("-s {ip}/32 ");
    eventually(
        "kube-router to program the pod",
        Duration::from_secs(60),
        || {
            let out = Command::new("iptables")
                .args(["-t", "filter", "-S", "KUBE-ROUTER-FORWARD"])
                .output();
            let programmed = out
                .map(|o| String::from_utf8_lossy(&o.stdout).contains(&rule))
                .unwrap_or(false);
            async move { programmed.then_some(()) }
        },
    )
    .await;
    // A filtered run's pod starts with the egress gate (an init container): its IP exists while
    // the gate waits for the policy, and the workload container does not yet.
    eventually(
        "the workload container to run",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            let pod = pod.clone();
            async move {
                pods.get(&pod)
                    .await
                    .ok()?
                    .status?
                    .container_statuses?
                    .into_iter()
                    .find(|c| c.name == "workload")?
                    .state?
                    .running
            }
        },
    )
    .await;
    let go = Command::new(kubectl_path())
        .args([
            "exec",
            "-n",
            ns,
            &pod,
            "-c",
            "workload",
            "--",
            "/bin/touch",
            "/tmp/go",
        ])
        .output()
        .expect("kubectl exec");
    assert!(go.status.success(), "{go:?}");
    ip
}

/// Issue 13 on the real node, where kube-router enforces NetworkPolicy (hack/real-node.sh): from
/// inside real containers, a run whose `spec.network` allows one address and denies another
/// (docs/contract.md "ADR-006 network rules: validated and enforced").
/// - Control: a run with open egress reaches BOTH addresses directly, so the network works and
///   the denied address is reachable without the policy.
/// - Filtered (`allowlist`: `<host>/32`, `10.244.0.0/24`, `!<node IP>/32`): the allowed address
///   is reached directly, the denied one is not (its listener never sees this pod); through the
///   chart's egress proxy (with the run's token), the allowed address is fetched — the listener
///   sees the proxy pod, not the run's — and the denied one is refused with 403.
#[tokio::test]
async fn a_runs_network_policy_and_egress_proxy_are_enforced_from_inside_a_real_container() {
    let client = client().await;
    ensure_crd(&client).await;
    let release_ns = TestNamespace::new(&client, "egress").await;
    let runs_ns = restricted_namespace(&client, "egress-runs").await;
    let fullname = format!("sbr-{:08x}", rand_u32());
    let store_url = format!("s3://{}/egress-{fullname}", s3().bucket);
    let _release = install_operator_by_helm(
        &release_ns.name,
        &fullname,
        &store_url,
        json!({
            "replicas": 1,
            "watchNamespaces": [runs_ns.name],
            "webhook": {"enabled": false},
            // Without the webhook no admission stamps its runs, and they tolerate the real
            // node's taint (a right of their author's: docs/contract.md "A run uses only its
            // author's rights"): this test is about egress, so the release trusts them.
            "unadmittedReferences": "trust",
            // The bed has no cluster DNS: the gate could not resolve the proxy's Service name
            // to anchor on it (docs/contract.md "A filtered run never has an unfiltered instant").
            "runNetworkPolicy": {"gate": {"anchor": false}},
            "egressProxy": {
                "replicas": 1,
                "pdb": {"enabled": false},
                "nodeSelector": {REAL_NODE_LABEL: "true"},
                "tolerations": [real_node_toleration()],
            },
        }),
    );
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), &release_ns.name);
    let proxy_svc = format!("{fullname}-egress-proxy");
    let proxy_addr = services
        .get(&proxy_svc)
        .await
        .expect("egress proxy Service")
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("egress proxy ClusterIP");
    let proxy_pod_ips: Vec<String> = Api::<Pod>::namespaced(client.clone(), &release_ns.name)
        .list(&ListParams::default().labels("app.kubernetes.io/component=egress-proxy"))
        .await
        .expect("list egress proxy pods")
        .items
        .into_iter()
        .filter_map(|p| p.status?.pod_ip)
        .collect();
    assert!(!proxy_pod_ips.is_empty(), "the egress proxy runs");

    let node_ip = bed_setting("SANDBOXRUN_TEST_NODE_IP");
    let host_ip = other_host_address(&node_ip);
    let (allowed, allowed_peers) = echo_listener(&host_ip, "allowed").await;
    let (denied, denied_peers) = echo_listener(&node_ip, "denied").await;

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &runs_ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &runs_ns.name);
    let probe_spec = |network: Option<sandboxrun_operator::api::NetworkPolicy>| {
        let mut spec = real_spec(Some(EGRESS_PROBE), &[]);
        spec.env = vec![
            env_var("ALLOWED", &allowed),
            env_var("DENIED", &denied),
            env_var("PROXY_ADDR", &proxy_addr),
        ];
        spec.network = network;
        spec
    };
    let finished = |name: &'static str| {
        let runs = runs.clone();
        async move {
            eventually("the probe run to finish", Duration::from_secs(180), || {
                let runs = runs.clone();
                async move { runs.get(name).await.ok().filter(final_phase) }
            })
            .await
        }
    };

    // Control: open egress, no NetworkPolicy.
    let open = create(&runs, "open", probe_spec(None)).await;
    let open = wait_for_pod_name(&runs, open).await;
    let open_ip = release_probe(&pods, &runs_ns.name, &open).await;
    let open_done = finished("open").await;
    let lines = probe_lines(&open_done);
    assert_eq!(
        lines.get("direct_allowed").map(String::as_str),
        Some(format!("ok allowed from {open_ip}").as_str()),
        "{:?}",
        open_done.status
    );
    assert_eq!(
        lines.get("direct_denied").map(String::as_str),
        Some(format!("ok denied from {open_ip}").as_str()),
        "without a policy the denied address is reachable: {:?}",
        open_done.status
    );
    assert!(
        !lines.contains_key("proxy_host"),
        "open egress gets no proxy: {lines:?}"
    );

    // Filtered: allowlist, one address allowed, the node IP carved out of the range it is in.
    let filtered = create(
        &runs,
        "filtered",
        probe_spec(filtered_network(&host_ip, &node_ip)),
    )
    .await;
    let filtered = wait_for_pod_name(&runs, filtered).await;
    let filtered_ip = release_probe(&pods, &runs_ns.name, &filtered).await;
    let done = finished("filtered").await;
    let lines = probe_lines(&done);
    let line = |k: &str| lines.get(k).cloned().unwrap_or_default();
    assert_eq!(
        line("direct_allowed"),
        format!("ok allowed from {filtered_ip}"),
        "{lines:?}"
    );
    assert!(
        line("direct_denied").starts_with("fail"),
        "the NetworkPolicy stops a direct connection to the denied address: {lines:?}"
    );
    assert_eq!(
        line("proxy_host"),
        format!("{proxy_svc}.{}.svc:3128", release_ns.name),
        "the operator pointed the workload at the chart's proxy: {lines:?}"
    );
    let through_proxy = line("proxy_allowed");
    assert!(
        proxy_pod_ips
            .iter()
            .any(|ip| through_proxy == format!("ok allowed from {ip}")),
        "the allowed address is fetched through the proxy (peer is a proxy pod {proxy_pod_ips:?}): {lines:?}"
    );
    let refused = line("proxy_denied");
    assert!(
        refused.starts_with("fail") && refused.contains("403"),
        "the proxy refuses the denied address with 403: {lines:?}"
    );
    // The denied listener only ever saw the control run.
    let denied_seen = denied_peers.lock().expect("peers").clone();
    assert_eq!(
        denied_seen,
        vec![open_ip.clone()],
        "peers of the denied address"
    );
    let allowed_seen = allowed_peers.lock().expect("peers").clone();
    assert!(allowed_seen.contains(&filtered_ip), "{allowed_seen:?}");

    // Warm (issue #39): a run made from a pooled template of the same policy takes the pool's
    // ready pod, and its FIRST instruction fetches through the proxy: the proxy knows the run
    // (its status recorded the template before the claim) and learns the claimed pod is the
    // run's (waiting a moment for its pod watch when the request comes first).
    warm_run_through_the_proxy(&client, &runs_ns.name, &proxy_pod_ips, |spec| {
        spec.env = probe_spec(None).env;
        spec.network = filtered_network(&host_ip, &node_ip);
    })
    .await;
}

/// The network of [`a_runs_network_policy_and_egress_proxy_are_enforced_from_inside_a_real_container`]'s
/// filtered runs.
fn filtered_network(
    host_ip: &str,
    node_ip: &str,
) -> Option<sandboxrun_operator::api::NetworkPolicy> {
    Some(sandboxrun_operator::api::NetworkPolicy {
        mode: sandboxrun_operator::api::NetworkMode::Allowlist,
        rules: vec![
            format!("{host_ip}/32"),
            "10.244.0.0/24".to_string(),
            format!("!{node_ip}/32"),
        ],
    })
}

/// A warm run's first instruction: a fetch of `$ALLOWED` through the proxy (its Service name
/// swapped for `$PROXY_ADDR`: the bed has no cluster DNS).
const WARM_PROXY_FIRST: &str = r#"export http_proxy="${http_proxy%@*}@$PROXY_ADDR:${http_proxy##*:}"
if r=$(/bin/busybox timeout 10 /bin/busybox wget -q -O - "http://$ALLOWED/" 2>&1); then echo "first=ok $r"; else echo "first=fail $r"; fi > /dev/termination-log"#;

/// A pool of one of a template (`shape` fills in its env and network) in `ns`, then a run made
/// from it whose first instruction is [`WARM_PROXY_FIRST`]: it takes the pool's pod, and the
/// fetch is served by a proxy pod.
async fn warm_run_through_the_proxy(
    client: &Client,
    ns: &str,
    proxy_pod_ips: &[String],
    shape: impl FnOnce(&mut SandboxRunSpec),
) {
    use sandboxrun_operator::api::{OpenField, TemplateRef};
    let mut spec = real_spec(Some("exit 9"), &[]);
    shape(&mut spec);
    real_pool(
        client,
        ns,
        ("filtered-agent", "filtered-agents"),
        (spec, &[OpenField::Command]),
        1,
    )
    .await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), ns);
    let warm = SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced("filtered-agent")),
        command: Some(vec!["sh".into(), "-c".into(), WARM_PROXY_FIRST.into()]),
        ..Default::default()
    };
    create(&runs, "warm", warm).await;
    let done = eventually("the warm run to end", Duration::from_secs(180), || {
        let runs = runs.clone();
        async move { runs.get("warm").await.ok().filter(final_phase) }
    })
    .await;
    let status = done.status.clone().expect("status");
    let took = status.warm_start.as_ref().and_then(|w| w.pod.clone());
    assert!(took.is_some(), "a pool pod was taken: {status:?}");
    let first = probe_lines(&done).get("first").cloned().unwrap_or_default();
    assert!(
        proxy_pod_ips
            .iter()
            .any(|ip| first == format!("ok allowed from {ip}")),
        "the warm run's first instruction was served by the proxy {proxy_pod_ips:?}: {first:?} {status:?}"
    );
}

/// Issue 25 item 6 on the real node (docs/contract.md "A filtered run never has an unfiltered
/// instant"): kube-router programs a pod's NetworkPolicy only after the pod has its address, so a
/// workload that connects at once used to reach what its policy denies. With the egress gate (an
/// init container holding the workload until a probe the policy denies is refused):
/// - control: a run with open egress reaches the address in its first instruction (no gate);
/// - restricted: the same first instruction, from a run whose allowlist does not cover the
///   address, from a denylist run that lists it, and from a denylist run of another range (the
///   node is denied to a node-probed run once scheduled), is refused, the address's listener never
///   sees those pods, and each gate exited 0.
#[tokio::test]
async fn a_filtered_runs_first_instruction_is_already_filtered() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "gate").await;
    let (_dir, store_url) = file_store("gate");
    let probe = format!("node:{}", real_kubelet_port(&client).await);
    let op = start_operator_with(&ns.name, &store_url, &["--egress-gate-probe", &probe]);
    let node_ip = bed_setting("SANDBOXRUN_TEST_NODE_IP");
    let (denied, denied_peers) = echo_listener(&node_ip, "denied").await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let spec = |network: Option<sandboxrun_operator::api::NetworkPolicy>| {
        let mut spec = real_spec(Some(FIRST_INSTRUCTION_PROBE), &[]);
        spec.env = vec![env_var("DENIED", &denied)];
        spec.network = network;
        spec
    };
    let first_line = |run: &SandboxRun| probe_lines(run).get("first").cloned().unwrap_or_default();

    // Control: open egress, no gate, and the address is reached at once.
    create(&runs, "open", spec(None)).await;
    let open = wait_run(&runs, "open", "the open run to end", &op, final_phase).await;
    assert!(
        first_line(&open).starts_with("ok denied from"),
        "{:?}",
        open.status
    );

    // Restricted, three ways: an allowlist of a range that does not hold the node's address; a
    // denylist that lists the address (it used to start ungated and reach it at once); a denylist
    // of another range (the gate probes the node, so the node is denied to it once scheduled).
    let restricted = |mode, rule: &str| {
        spec(Some(sandboxrun_operator::api::NetworkPolicy {
            mode,
            rules: vec![rule.to_string()],
        }))
    };
    use sandboxrun_operator::api::NetworkMode::{Allowlist, Denylist};
    for (name, filtered) in [
        ("filtered", restricted(Allowlist, "192.0.2.0/24")),
        ("denylist-listed", restricted(Denylist, &node_ip)),
        ("denylist-other", restricted(Denylist, "192.0.2.0/24")),
    ] {
        create(&runs, name, filtered).await;
        let pod_name = pod_of(&wait_for_pod_name(&runs, runs.get(name).await.expect("run")).await);
        let gate = eventually("the egress gate to end", Duration::from_secs(120), || {
            let (pods, pod_name) = (pods.clone(), pod_name.clone());
            async move {
                pods.get(&pod_name)
                    .await
                    .ok()?
                    .status?
                    .init_container_statuses?
                    .into_iter()
                    .find(|c| c.name == "egress-gate")?
                    .state?
                    .terminated
            }
        })
        .await;
        assert_eq!(
            gate.exit_code, 0,
            "{name}: the gate saw the policy in force: {gate:?}"
        );
        let done = wait_run(&runs, name, "the restricted run to end", &op, final_phase).await;
        let line = first_line(&done);
        assert!(
            line.starts_with("fail"),
            "{name}: the first instruction was filtered: {line:?} {:?}",
            done.status
        );
        let seen = denied_peers.lock().expect("peers").clone();
        assert_eq!(
            seen.len(),
            1,
            "{name}: only the open run reached the denied address: {seen:?}"
        );
    }
}

/// A stand-in for the egress proxy on the real node: busybox's httpd on the proxy's port and on
/// its canary port (the same pod, so only a policy tells the two ports apart). Returns its IP.
async fn canary_proxy_stand_in(client: &Client, ns: &str) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "proxy", "labels": {"app": "stand-in-proxy"}},
        "spec": {
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "tolerations": [real_node_toleration()],
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "httpd",
                "image": pod_image("busybox"),
                "command": ["sh", "-c",
                    "/bin/busybox httpd -f -p 3128 & exec /bin/busybox httpd -f -p 3129"],
                "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}},
                "readinessProbe": {"tcpSocket": {"port": 3129}, "periodSeconds": 1},
            }],
        },
    }))
    .expect("the stand-in pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&Default::default(), &pod)
        .await
        .expect("create the stand-in proxy");
    eventually(
        "the stand-in proxy to be ready",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                let status = pods.get("proxy").await.ok()?.status?;
                let ready = status
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready.then_some(status.pod_ip?)
            }
        },
    )
    .await
}

/// The workload of [`a_gate_anchored_on_the_proxy_probes_its_canary_so_a_dead_node_probe_never_opens_it`]:
/// it only ends, 0.
const GATED_ONLY: &str = "echo started > /dev/termination-log";

/// Issue #38 item 4 on the real node (docs/contract.md "A filtered run never has an unfiltered
/// instant"): a probe where nothing listens reads as refused, so with the node probe at a closed
/// port (`node:1`, as on a node whose kubelet port is closed or firewalled for pods) the gate of
/// old opened at once whether or not any policy was in force. The gate of a run anchored on the
/// proxy now probes the proxy's canary (a stand-in: the same pod answers both ports):
/// - the namespace widened by its tenant (an allow-all egress NetworkPolicy: policies add up, so
///   the run's own is not in force): the canary answers, the gate stays shut and the run fails
///   `EgressNotEnforced` with the gate's words, its workload never started; so does a run that
///   also allows an address range the proxy is outside (`192.0.2.0/24`), whose gate used to
///   probe the node, one whose range holds the proxy's pod (its `/16`), and one that may reach
///   nothing (`allowlist` without rules): the gates of the last two probed the dead node port
///   until now and opened at once;
/// - without that policy: the canary is refused, the anchor answers, the gate exits 0 and the
///   run succeeds — the covering run too (while its gate waits its policy denies the proxy's
///   pod in that range: the operator watches the proxy's pods), and the one that may reach
///   nothing (its policy allows the proxy's port alone, its gate's anchor, by address).
#[tokio::test]
async fn a_gate_anchored_on_the_proxy_probes_its_canary_so_a_dead_node_probe_never_opens_it() {
    use sandboxrun_operator::api::NetworkMode::Allowlist;
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "canary").await;
    let proxy_ns = TestNamespace::new(&client, "canary-proxy").await;
    let proxy_ip = canary_proxy_stand_in(&client, &proxy_ns.name).await;
    let (dir, store_url) = file_store("canary");
    let secret = dir.join("token-secret");
    std::fs::create_dir_all(&dir).expect("store dir");
    std::fs::write(&secret, "canary-test-token-secret-0123456789").expect("token secret");
    let proxy_url = format!("http://{proxy_ip}:3128");
    let op = start_operator_with(
        &ns.name,
        &store_url,
        &[
            "--egress-gate-probe",
            "node:1",
            "--egress-gate-timeout",
            "15s",
            "--egress-proxy-url",
            &proxy_url,
            "--egress-proxy-namespace",
            &proxy_ns.name,
            "--egress-proxy-selector",
            "app=stand-in-proxy",
            "--egress-proxy-port",
            "3128",
            "--egress-proxy-canary-port",
            "3129",
            "--egress-token-secret-file",
            secret.to_str().expect("utf-8 path"),
        ],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let spec = || {
        let mut spec = real_spec(Some(GATED_ONLY), &[]);
        spec.network = Some(sandboxrun_operator::api::NetworkPolicy {
            mode: Allowlist,
            rules: vec!["example.com".to_string()],
        });
        spec
    };
    // The tenant widens its namespace: every pod may send anywhere.
    let allow_all: k8s_openapi::api::networking::v1::NetworkPolicy =
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "allow-all-egress"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]},
        }))
        .expect("policy");
    let policies: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        Api::namespaced(client.clone(), &ns.name);
    policies
        .create(&Default::default(), &allow_all)
        .await
        .expect("create the allow-all policy");
    // (Its pod goes as soon as the run fails: the gate's words are read from the run.)
    create(&runs, "widened", spec()).await;
    // A run that also allows an address range the proxy is not in: its gate probes the canary
    // too (before, any range sent it to the node's probe, which, dead, opened it at once).
    let mut ranged = spec();
    if let Some(network) = ranged.network.as_mut() {
        network.rules.push("192.0.2.0/24".to_string());
    }
    create(&runs, "widened-ranged", ranged).await;
    // A run allowing a range that holds the proxy's pod: before, its gate probed the node.
    let covering = || {
        let octets: Vec<&str> = proxy_ip.split('.').collect();
        let mut spec = spec();
        if let (Some(network), [a, b, ..]) = (spec.network.as_mut(), octets.as_slice()) {
            network.rules.push(format!("{a}.{b}.0.0/16"));
        }
        spec
    };
    create(&runs, "widened-covering", covering()).await;
    // A run that may reach nothing: its gate probed the dead node port and opened at once; now
    // it is anchored on the proxy by address (the flag's URL names it by address here).
    let nothing = || {
        let mut spec = spec();
        if let Some(network) = spec.network.as_mut() {
            network.rules.clear();
        }
        spec
    };
    create(&runs, "widened-nothing", nothing()).await;
    for name in [
        "widened",
        "widened-ranged",
        "widened-covering",
        "widened-nothing",
    ] {
        let done = wait_run(&runs, name, "the widened run to fail", &op, final_phase).await;
        let status = done.status.clone().unwrap_or_default();
        assert_eq!(status.phase, Some(Phase::Failed), "{name}: {status:?}");
        let said = status.message.clone().unwrap_or_default();
        assert!(
            said.contains(&format!("{proxy_ip}:3129")) && said.contains("still reachable"),
            "{name}: the gate, shut, names the canary: {said:?}"
        );
        assert!(
            status.workload.is_none() || status.exit_code.is_none(),
            "{name}: the workload never started: {status:?}"
        );
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.reason == "EgressNotEnforced"),
            "{name}: {status:?}"
        );
    }

    // Without the tenant's policy the run's own is in force: the canary is refused.
    policies
        .delete("allow-all-egress", &Default::default())
        .await
        .expect("delete the allow-all policy");
    create(&runs, "enforced", spec()).await;
    create(&runs, "enforced-covering", covering()).await;
    create(&runs, "enforced-nothing", nothing()).await;
    // Each gate opened (the canary refused, the anchor answered): a shut one fails its run
    // `EgressNotEnforced` before the workload starts.
    for name in ["enforced", "enforced-covering", "enforced-nothing"] {
        let done = wait_run(&runs, name, "the enforced run to end", &op, final_phase).await;
        assert_eq!(
            phase(&done),
            Some(Phase::Succeeded),
            "{name}: {:?}",
            done.status
        );
    }
}

/// The workload of [`no_run_reaches_what_its_namespaces_default_deny_egress_policy_denies`]:
/// waits for the test's go-ahead (the enforcer has programmed this pod), then tries `$HOST`
/// directly and writes `host=ok|fail <answer>` to its termination message.
const HOST_PROBE: &str = r#"bb=/bin/busybox
i=0; while [ ! -e /tmp/go ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done
if r=$($bb timeout 10 $bb wget -q -O - -Y off "http://$HOST/" 2>&1); then echo "host=ok $r"; else echo "host=fail $r"; fi > /dev/termination-log
cat /dev/termination-log
"#;

/// Issue #38 item 2 on the real node (docs/contract.md "ADR-006 network rules: validated and
/// enforced"): NetworkPolicies add up, so a run's own policy must never allow what its
/// namespace's policies deny. In a namespace whose own policy denies all egress:
/// - control, before that policy exists: an open run reaches a listener on this host;
/// - with it: an open run, an allowlist run (`192.0.2.0/24`) and a denylist run
///   (`203.0.113.0/24`, whose policy used to allow `0.0.0.0/0` minus that range) all fail to
///   reach the same listener, which never sees their pods.
#[tokio::test]
async fn no_run_reaches_what_its_namespaces_default_deny_egress_policy_denies() {
    use sandboxrun_operator::api::NetworkMode::{Allowlist, Denylist};
    let client = client().await;
    ensure_crd(&client).await;
    let ns = restricted_namespace(&client, "deny-ns").await;
    let (_dir, store_url) = file_store("deny-ns");
    let probe = format!("node:{}", real_kubelet_port(&client).await);
    let op = start_operator_with(&ns.name, &store_url, &["--egress-gate-probe", &probe]);
    let node_ip = bed_setting("SANDBOXRUN_TEST_NODE_IP");
    let host_ip = other_host_address(&node_ip);
    let (host, host_peers) = echo_listener(&host_ip, "host").await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let spec = |network: Option<sandboxrun_operator::api::NetworkPolicy>| {
        let mut spec = real_spec(Some(HOST_PROBE), &[]);
        spec.env = vec![env_var("HOST", &host)];
        spec.network = network;
        spec
    };
    let restricted = |mode, rule: &str| {
        spec(Some(sandboxrun_operator::api::NetworkPolicy {
            mode,
            rules: vec![rule.to_string()],
        }))
    };
    let host_line = |run: &SandboxRun| probe_lines(run).get("host").cloned().unwrap_or_default();

    // Control: no policy in the namespace yet, and an open run reaches the listener.
    let control = create(&runs, "control", spec(None)).await;
    let control = wait_for_pod_name(&runs, control).await;
    let control_ip = release_probe(&pods, &ns.name, &control).await;
    let done = wait_run(&runs, "control", "the control run to end", &op, final_phase).await;
    assert_eq!(
        host_line(&done),
        format!("ok host from {control_ip}"),
        "without a policy the host is reachable: {:?}",
        done.status
    );

    // The namespace's own policy: no pod of it may send anything anywhere.
    let default_deny: k8s_openapi::api::networking::v1::NetworkPolicy =
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "default-deny-egress"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": []},
        }))
        .expect("a NetworkPolicy");
    Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), &ns.name)
        .create(&kube::api::PostParams::default(), &default_deny)
        .await
        .expect("create the namespace's default-deny egress policy");

    // An allowlist of a range that holds the listener's address allows it explicitly (the run
    // asked for it): the range must be one this host's address is not in (the bed's machine has
    // had 192.0.2.2 on eth0).
    let allowlisted = ["198.51.100.0/24", "192.0.2.0/24"]
        .into_iter()
        .find(|cidr| !host_ip.starts_with(&cidr[..cidr.len() - 4]))
        .expect("a documentation range without this host's address");
    for (name, run_spec) in [
        ("open", spec(None)),
        ("allowlist", restricted(Allowlist, allowlisted)),
        ("denylist", restricted(Denylist, "203.0.113.0/24")),
    ] {
        let run = create(&runs, name, run_spec).await;
        let run = wait_for_pod_name(&runs, run).await;
        release_probe(&pods, &ns.name, &run).await;
        let done = wait_run(&runs, name, "the run to end", &op, final_phase).await;
        let line = host_line(&done);
        assert!(
            line.starts_with("fail"),
            "{name}: the namespace's default-deny holds: {line:?} {:?}",
            done.status
        );
        let seen = host_peers.lock().expect("peers").clone();
        assert_eq!(
            seen,
            vec![control_ip.clone()],
            "{name}: only the control run reached the host"
        );
    }
}
