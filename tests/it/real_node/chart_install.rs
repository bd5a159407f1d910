//! The operator installed by Helm on the real node: a release uninstalled when dropped, its values
//! file, the pods described when an install fails.

use super::*;

/// A Helm release that is uninstalled when dropped (before its namespace goes, so its
/// cluster-scoped objects — ClusterRoles, the webhook configuration — go with it).
pub(super) struct HelmRelease {
    pub(super) name: String,
    pub(super) namespace: String,
    /// The namespaces its operator watches.
    pub(super) runs_namespaces: Vec<String>,
}

impl Drop for HelmRelease {
    fn drop(&mut self) {
        if std::env::var_os("SANDBOXRUN_KEEP_NAMESPACES").is_some() {
            return;
        }
        // The runs first, while the release's operator still runs: it holds their drain
        // finalizer, and once it is uninstalled nothing releases it (the namespace then stays
        // Terminating for good).
        for ns in &self.runs_namespaces {
            let mut cmd = tool("kubectl");
            cmd.args([
                "delete",
                "sandboxruns",
                "--all",
                "-n",
                ns,
                "--wait",
                "--timeout",
                "90s",
            ]);
            let _ = run(cmd, None);
        }
        let _ = run_helm(&[
            "uninstall",
            &self.name,
            "-n",
            &self.namespace,
            "--wait",
            "--timeout",
            "2m",
        ]);
    }
}

/// `helm install` of charts/ into `release_ns` as release `fullname`, with the operator image
/// built without Docker, the S3 store of the bed (credentials in a Secret, as
/// config/samples/s3-store.yaml says), the operator on the real node, and `values` on top (each
/// top-level key replaces the default). Waits until the release is ready; fails with the pods'
/// description when it is not.
pub(super) fn install_operator_by_helm(
    release_ns: &str,
    fullname: &str,
    store_url: &str,
    values: serde_json::Value,
) -> HelmRelease {
    let chart = repo().join("charts/sandboxrun-operator");
    install_chart_by_helm(
        (release_ns, fullname),
        store_url,
        values,
        (&chart, &pod_ref(&operator_ref())),
    )
}

/// [`install_operator_by_helm`] of `chart` (a directory or a packaged .tgz) with the operator
/// image `image` (pinned, as the real node pulls it).
pub(super) fn install_chart_by_helm(
    (release_ns, fullname): (&str, &str),
    store_url: &str,
    values: serde_json::Value,
    (chart, image): (&Path, &str),
) -> HelmRelease {
    let s3 = s3();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "store", "namespace": release_ns},
        "stringData": {
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_REGION": "us-east-1",
        },
    });
    let applied = kubectl_apply(release_ns, &secret.to_string());
    assert!(applied.status.success(), "{applied:?}");
    let values_file = helm_values_file(fullname, store_url, values.clone(), image);
    let runs_namespaces = values["watchNamespaces"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let release = HelmRelease {
        name: fullname.to_string(),
        namespace: release_ns.to_string(),
        runs_namespaces,
    };
    let installed = run_helm(&[
        "install",
        fullname,
        &chart.display().to_string(),
        "-n",
        release_ns,
        "-f",
        &values_file.display().to_string(),
        "--wait",
        "--timeout",
        "4m",
    ]);
    if !installed.status.success() {
        panic!(
            "helm install failed: {}\n{}",
            String::from_utf8_lossy(&installed.stderr),
            describe_pods(release_ns)
        );
    }
    release
}

/// The values file of a release `fullname` on the real node: the bed's S3 store at `store_url`
/// (its credentials in the Secret `store`), the operator image `image` (pinned, as the real node
/// pulls it; empty: none, the chart's own), and `values` on top (each top-level key replaces the
/// default).
pub(super) fn helm_values_file(
    fullname: &str,
    store_url: &str,
    values: serde_json::Value,
    image: &str,
) -> PathBuf {
    let mut all = json!({
        "fullnameOverride": fullname,
        "store": {
            "url": store_url,
            "existingSecret": "store",
            "options": [
                format!("endpoint={}", bed_setting("SANDBOXRUN_TEST_POD_S3_ENDPOINT")),
                "allow_http=true",
            ],
        },
        "readBack": {"drainTimeout": "2m"},
        "log": {"format": "text"},
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [real_node_toleration()],
    });
    if let Some((repository, digest)) = image.split_once('@') {
        all["image"] = json!({"repository": repository, "digest": digest});
    } else {
        assert!(image.is_empty(), "a pinned image, or none: {image}");
    }
    if let (Some(all), serde_json::Value::Object(extra)) = (all.as_object_mut(), values) {
        all.extend(extra);
    }
    let file = host_dir("helm-values").join(format!("{fullname}-{}.json", rand_u32()));
    std::fs::write(&file, all.to_string()).expect("write values");
    file
}

/// `kubectl describe pods` of `ns`, for a failed install's message.
pub(super) fn describe_pods(ns: &str) -> String {
    Command::new(kubectl_path())
        .args(["describe", "pods", "-n", ns])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default()
}

/// The toleration of the real node's taint, as a chart value.
pub(super) fn real_node_toleration() -> serde_json::Value {
    json!({"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"})
}
