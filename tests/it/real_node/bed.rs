//! The real node's bed: the images `hack/images.sh` pinned as the real node pulls them, the spec
//! that lands a run on the real node, a namespace enforcing Pod Security `restricted`, the operator
//! under test on this host, and [`RealBed`], what every real-node test starts from.

use super::*;

pub(super) const REAL_NODE_LABEL: &str = "sandbox.iterion.io/real-node";

/// The pinned operator image: `SANDBOXRUN_TEST_OPERATOR_IMAGE` when set (a branch's image pushed
/// beside `:dev`, e.g. `$(SANDBOXRUN_OPERATOR_TAG=mine hack/images.sh operator | tail -1)`), else
/// the `:dev` one `hack/images.sh operator` pinned.
pub(super) fn operator_ref() -> String {
    match std::env::var("SANDBOXRUN_TEST_OPERATOR_IMAGE") {
        Ok(pinned) if !pinned.trim().is_empty() => pinned.trim().to_string(),
        _ => image_ref("sandboxrun-operator"),
    }
}

/// A pinned image reference `hack/images.sh` pushed (`busybox`, `sandboxrun-operator`).
pub(super) fn image_ref(name: &str) -> String {
    let file = state_dir().join("images").join(format!("{name}.ref"));
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
        panic!(
            "no image {name} ({}: {e}). `hack/local-cluster.sh up` pushes busybox; \
             `hack/images.sh operator` builds and pushes the operator image (make test runs both)",
            file.display()
        )
    });
    text.trim().to_string()
}

/// The same reference as the real node pulls it (localhost:<port>/…).
pub(super) fn pod_image(name: &str) -> String {
    pod_ref(&image_ref(name))
}

/// `pinned` (as pushed) as the real node pulls it (localhost:<port>/…).
pub(super) fn pod_ref(pinned: &str) -> String {
    let pinned = pinned.to_string();
    let registry = bed_setting("SANDBOXRUN_TEST_POD_REGISTRY");
    match pinned.split_once('/') {
        Some((_, rest)) => format!("{registry}/{rest}"),
        None => pinned,
    }
}

/// The RuntimeClass the real-node runs are made with (issue #52): `SANDBOXRUN_TEST_RUNTIME_CLASS`,
/// none (the node's default, runc) when unset or empty. `hack/test.sh` runs this area twice: under
/// runc, then under `gvisor` (the bed's RuntimeClass for gVisor's runsc, `hack/real-node.sh`).
pub(super) fn runtime_class() -> Option<String> {
    std::env::var("SANDBOXRUN_TEST_RUNTIME_CLASS")
        .ok()
        .map(|class| class.trim().to_string())
        .filter(|class| !class.is_empty())
}

/// Which real node the runs of [`real_spec`] land on: its [`REAL_NODE_LABEL`] value,
/// `SANDBOXRUN_TEST_REAL_NODE_VALUE` (`true`, the first node, when unset; `second`, the second:
/// `hack/test.sh` runs the core flows there too, issue #52).
pub(super) fn real_node_value() -> String {
    std::env::var("SANDBOXRUN_TEST_REAL_NODE_VALUE")
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "true".to_string())
}

/// A spec that lands on the real node ([`real_node_value`]), runs busybox as uid 1000 and
/// declares `paths`, under [`runtime_class`].
pub(super) fn real_spec(script: Option<&str>, paths: &[&str]) -> SandboxRunSpec {
    SandboxRunSpec {
        image: Some(pod_image("busybox")),
        runtime_class_name: runtime_class(),
        command: script.map(|s| vec!["sh".into(), "-c".into(), s.into()]),
        user: Some("1000:1000".into()),
        node_selector: Some(BTreeMap::from([(
            REAL_NODE_LABEL.to_string(),
            real_node_value(),
        )])),
        tolerations: Some(vec![Toleration {
            key: Some(REAL_NODE_LABEL.into()),
            operator: Some("Equal".into()),
            value: Some(real_node_value()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        }]),
        read_back: (!paths.is_empty()).then(|| ReadBack {
            paths: paths
                .iter()
                .map(|p| ReadBackPath {
                    path: p.to_string(),
                    ..Default::default()
                })
                .collect(),
            drain_timeout: Some("2m".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A namespace that enforces Pod Security `restricted` (the run pods must pass it).
pub(super) async fn restricted_namespace(client: &Client, prefix: &str) -> TestNamespace {
    let ns = TestNamespace::new(client, prefix).await;
    let patch = json!({"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    Api::<Namespace>::all(client.clone())
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("label the namespace restricted");
    ns
}

/// The operator under test on this host, with the operator image as the holder of run pods.
pub(super) fn start_operator(ns: &str, store_url: &str) -> Operator {
    start_operator_with(ns, store_url, &[])
}

/// [`start_operator`] with more flags.
pub(super) fn start_operator_with(ns: &str, store_url: &str, flags: &[&str]) -> Operator {
    let holder = pod_ref(&operator_ref());
    Operator::builder(ns, store_url)
        .flags(&[
            "--holder-image",
            &holder,
            "--holder-binary",
            "/usr/local/bin/sandboxrun-operator",
        ])
        .flags(flags)
        .start()
}

/// What every real-node test starts from: a client, a namespace enforcing `restricted`, a
/// `file://` store on this host, the operator under test watching the namespace, and its runs.
pub(super) struct RealBed {
    pub(super) client: Client,
    pub(super) ns: TestNamespace,
    pub(super) store_url: String,
    pub(super) op: Operator,
    pub(super) runs: Api<SandboxRun>,
}

impl RealBed {
    pub(super) async fn new(tag: &str) -> RealBed {
        RealBed::with_flags(tag, &[]).await
    }

    /// [`RealBed::new`] with the operator started with more flags.
    pub(super) async fn with_flags(tag: &str, flags: &[&str]) -> RealBed {
        let client = client().await;
        ensure_crd(&client).await;
        let ns = restricted_namespace(&client, tag).await;
        let (_dir, store_url) = file_store(tag);
        let op = start_operator_with(&ns.name, &store_url, flags);
        let runs = Api::namespaced(client.clone(), &ns.name);
        RealBed {
            client,
            ns,
            store_url,
            op,
            runs,
        }
    }
}

pub(super) fn env_var(name: &str, value: &str) -> sandboxrun_operator::api::EnvVar {
    sandboxrun_operator::api::EnvVar {
        name: name.into(),
        value: value.into(),
        value_from: None,
    }
}
