//! `doctor --context NAME | --kubeconfig PATH`: ADR-006's live probe (docs/contract.md ADR-006
//! §3), advisory: is the cluster ready to take these manifests, and does it take them? Reads
//! the SandboxRun CRD, the validating webhooks that would judge each run and their endpoints, the
//! operator's published settings and heartbeat ([`crate::policy::published`]), then per manifest a
//! server-side dry run (through the webhook) and the objects its pod needs. Every call is
//! bounded by `--timeout`. This module is the I/O; what the answers mean is
//! [`crate::doctor::live_verdicts`].

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde::de::DeserializeOwned;

use crate::api::SandboxRun;
use crate::doctor::live_verdicts::{
    self as verdicts, classify_dry_run, endpoint, CallError, DryRun, Endpoint, Probe, RefKind,
    Reference, StreamObject,
};
use crate::policy::published::{
    freshness, Freshness, PublishedSettings, SETTINGS_FORMAT, SETTINGS_LABEL,
};
use crate::policy::rules::{ids, Finding};
use crate::store::tenant::TenantStorePolicy;

/// The field manager of doctor's dry runs.
const DOCTOR_MANAGER: &str = "sandboxrun-doctor";
/// Where the operator runs when nothing says otherwise (the chart's documented namespace).
pub(crate) const DEFAULT_OPERATOR_NAMESPACE: &str = "sandboxrun-system";
/// At most this many manifests are probed at once.
const MANIFESTS_AT_ONCE: usize = 8;

/// A connection to the cluster doctor probes.
pub(crate) struct Cluster {
    client: Client,
    /// The context's name.
    pub(crate) context: String,
    /// The context's namespace ("default" when it names none): where a manifest without one goes.
    pub(crate) default_namespace: String,
    timeout: Duration,
    probe: Probe,
}

/// The operator's settings as doctor found them.
#[derive(Clone, Debug)]
pub(crate) struct Published {
    /// `namespace/name` of the ConfigMap.
    pub(crate) source: String,
    /// What it says.
    pub(crate) settings: PublishedSettings,
}

/// What the cluster-wide probes found.
#[derive(Debug, Default)]
pub(crate) struct ClusterProbe {
    /// Probe findings (warnings, failures under `--require-context`).
    pub(crate) findings: Vec<Finding>,
    /// The operator's published settings, when they could be read.
    pub(crate) published: Option<Published>,
}

/// Connects to `context` of `kubeconfig` (each: the default when None), every request bounded by
/// `timeout`. An error is a usage error: the context or the file does not exist.
pub(crate) async fn connect(
    context: Option<&str>,
    kubeconfig: Option<&PathBuf>,
    timeout: Duration,
    probe: Probe,
) -> Result<Cluster, ConnectError> {
    // The client's TLS needs the process-wide provider; doctor may be called as a library.
    crate::process::install_crypto_provider();
    let file = match kubeconfig {
        Some(path) => Kubeconfig::read_from(path).map_err(|source| ConnectError::Kubeconfig {
            path: path.display().to_string(),
            source,
        })?,
        None => Kubeconfig::read().map_err(ConnectError::DefaultKubeconfig)?,
    };
    let name = context
        .map(str::to_string)
        .or_else(|| file.current_context.clone())
        .unwrap_or_default();
    if let Some(wanted) = context {
        if !file.contexts.iter().any(|c| c.name == wanted) {
            return Err(ConnectError::NoSuchContext(wanted.to_string()));
        }
    }
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let mut config = Config::from_custom_kubeconfig(file, &options)
        .await
        .map_err(|source| ConnectError::Context {
            name: name.clone(),
            source,
        })?;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    let default_namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(|source| ConnectError::Client {
        name: name.clone(),
        source,
    })?;
    Ok(Cluster {
        client,
        context: name,
        default_namespace,
        timeout,
        probe,
    })
}

/// Why the live probe cannot connect (a usage error: `doctor` exits 2).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// `--require-context` without a cluster to probe.
    #[error("--require-context needs --context or --kubeconfig")]
    NothingToProbe,
    /// `--timeout` cannot serve.
    #[error(transparent)]
    Timeout(#[from] TimeoutError),
    /// `--kubeconfig` cannot be read.
    #[error("--kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The default kubeconfig cannot be read.
    #[error("kubeconfig: {0}")]
    DefaultKubeconfig(#[source] kube::config::KubeconfigError),
    /// `--context` names no context of the kubeconfig.
    #[error("--context {0:?}: no such context in the kubeconfig")]
    NoSuchContext(String),
    /// The context cannot be configured.
    #[error("context {name:?}: {source}")]
    Context {
        /// The context.
        name: String,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client cannot be built.
    #[error("context {name:?}: {source}")]
    Client {
        /// The context.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// A `--timeout` that cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TimeoutError {
    /// Zero.
    #[error("--timeout {0:?}: must be positive")]
    NotPositive(String),
    /// Not a duration.
    #[error("--timeout {text:?}: {source}")]
    NotADuration {
        /// The value.
        text: String,
        /// Why.
        #[source]
        source: crate::units::DurationError,
    },
}

/// The words of a failed call.
fn error_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => other.to_string(),
    }
}

impl Cluster {
    /// `call`, bounded by the timeout.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(CallError::Refused(error_text(&e))),
            Err(_) => Err(CallError::Timeout(self.timeout)),
        }
    }

    /// Gets `name` from `api` (None: not found), bounded.
    async fn get_opt<K>(&self, api: Api<K>, name: &str) -> Result<Option<K>, CallError>
    where
        K: Clone + DeserializeOwned + std::fmt::Debug,
    {
        self.bounded(api.get_opt(name)).await
    }

    /// How this probe's findings are reported.
    pub(crate) fn probe(&self) -> Probe {
        self.probe
    }

    /// The spec of the template `reference` names for a run of `namespace` (a SandboxRunTemplate
    /// there, or a ClusterSandboxRunTemplate; None: it does not exist), bounded.
    pub(crate) async fn template(
        &self,
        reference: &crate::api::TemplateRef,
        namespace: &str,
    ) -> Result<Option<crate::api::SandboxRunTemplateSpec>, CallError> {
        let read = crate::policy::templates::read(&self.client, namespace, reference);
        self.bounded(read).await
    }

    /// The labels of namespace `name` (None: it does not exist), bounded.
    pub(crate) async fn namespace_labels(
        &self,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, CallError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        Ok(self
            .get_opt(api, name)
            .await?
            .map(|n| n.metadata.labels.unwrap_or_default()))
    }

    /// The cluster-wide probes for runs going to `namespaces`: the CRD, the webhooks that would
    /// judge them and their endpoints, the operator's published settings and heartbeat
    /// (looked for in `operator_namespace`, else the namespaces of the webhooks' Services, else
    /// [`DEFAULT_OPERATOR_NAMESPACE`]).
    pub(crate) async fn probe_cluster(
        &self,
        namespaces: &BTreeSet<String>,
        operator_namespace: Option<&str>,
    ) -> ClusterProbe {
        let mut out = ClusterProbe::default();
        let probe = self.probe;
        // The CRD.
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        match self.get_opt(crds, verdicts::CRD_NAME).await {
            Ok(crd) => out
                .findings
                .extend(verdicts::judge_crd(probe, crd.as_ref())),
            Err(why) => out
                .findings
                .push(probe.unanswered(&format!("crd/{}", verdicts::CRD_NAME), &why)),
        }
        // The webhooks.
        let mut service_namespaces = BTreeSet::new();
        let configs: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        match self.bounded(configs.list(&ListParams::default())).await {
            Ok(list) => {
                let (findings, seen) = self.probe_webhooks(&list.items, namespaces).await;
                out.findings.extend(findings);
                service_namespaces = seen;
            }
            Err(why) => out
                .findings
                .push(probe.unanswered("validatingwebhookconfigurations", &why)),
        }
        // The operator's published settings and heartbeat.
        let candidates: Vec<String> = match operator_namespace {
            Some(ns) => vec![ns.to_string()],
            None if !service_namespaces.is_empty() => service_namespaces.into_iter().collect(),
            None => vec![DEFAULT_OPERATOR_NAMESPACE.to_string()],
        };
        let (findings, published) = self.probe_operator(&candidates).await;
        out.findings.extend(findings);
        out.published = published;
        out
    }

    /// Judges every webhook that would judge a run in one of `namespaces`; returns the findings
    /// and the namespaces of their Services (where the operator runs).
    async fn probe_webhooks(
        &self,
        configs: &[ValidatingWebhookConfiguration],
        namespaces: &BTreeSet<String>,
    ) -> (Vec<Finding>, BTreeSet<String>) {
        let probe = self.probe;
        let mut findings = Vec::new();
        let mut service_namespaces = BTreeSet::new();
        let mut judged: BTreeSet<String> = BTreeSet::new();
        let ns_api: Api<Namespace> = Api::all(self.client.clone());
        for ns in namespaces {
            let labels = match self.get_opt(ns_api.clone(), ns).await {
                Ok(Some(n)) => n.metadata.labels.unwrap_or_default(),
                // A namespace that does not exist is reported by each manifest's dry run.
                Ok(None) => continue,
                Err(why) => {
                    findings.push(probe.unanswered(&format!("namespace/{ns}"), &why));
                    continue;
                }
            };
            let hooks = verdicts::webhooks_for_runs(configs, &labels, &BTreeMap::new());
            if hooks.is_empty() {
                findings.push(probe.finding(
                    ids::CLUSTER_WEBHOOK,
                    format!("namespace/{ns}"),
                    format!(
                        "no validating webhook judges SandboxRuns in namespace {ns}: runs are \
                         admitted without the ADR-006 rules"
                    ),
                    "install the operator with its webhook (chart webhook.enabled=true), or \
                     check the webhook's namespaceSelector",
                ));
            }
            for (config, hook) in hooks {
                if !judged.insert(format!("{config}/{}", hook.name)) {
                    continue;
                }
                findings.extend(verdicts::judge_ca_bundle(probe, config, hook));
                match endpoint(hook) {
                    Endpoint::Service {
                        namespace,
                        name,
                        port,
                    } => {
                        service_namespaces.insert(namespace.clone());
                        if let Some(down) = self.service_down(&namespace, &name, port).await {
                            findings
                                .push(verdicts::endpoint_down(probe, config, &hook.name, &down));
                        }
                    }
                    Endpoint::Url(url) => {
                        if let Some(down) = self.url_down(&url).await {
                            findings
                                .push(verdicts::endpoint_down(probe, config, &hook.name, &down));
                        }
                    }
                    Endpoint::Missing => findings.push(verdicts::endpoint_down(
                        probe,
                        config,
                        &hook.name,
                        "its clientConfig names neither a Service nor a URL",
                    )),
                }
            }
        }
        (findings, service_namespaces)
    }

    /// Why the Service `namespace/name` does not serve (None: it has a ready endpoint).
    async fn service_down(&self, namespace: &str, name: &str, port: i32) -> Option<String> {
        let services: Api<Service> = Api::namespaced(self.client.clone(), namespace);
        match self.get_opt(services, name).await {
            Ok(Some(_)) => {}
            Ok(None) => return Some(format!("Service {namespace}/{name} does not exist")),
            Err(why) => return Some(format!("Service {namespace}/{name} cannot be read: {why}")),
        }
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), namespace);
        let selector = format!("kubernetes.io/service-name={name}");
        match self
            .bounded(slices.list(&ListParams::default().labels(&selector)))
            .await
        {
            Ok(list) if verdicts::any_ready(&list.items) => None,
            Ok(_) => Some(format!(
                "Service {namespace}/{name} (port {port}) has no ready endpoint"
            )),
            Err(why) => Some(format!(
                "the endpoints of Service {namespace}/{name} cannot be read: {why}"
            )),
        }
    }

    /// Why nothing accepts connections at `url` (None: something does). A TCP connect, bounded:
    /// the apiserver's own TLS handshake is what the dry run then exercises.
    async fn url_down(&self, url: &str) -> Option<String> {
        let parsed = match url::Url::parse(url) {
            Ok(u) => u,
            Err(e) => return Some(format!("URL {url:?} does not parse: {e}")),
        };
        let host = parsed.host_str().unwrap_or_default().to_string();
        let port = parsed.port_or_known_default().unwrap_or(443);
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        match tokio::time::timeout(
            self.timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("{url}: {e}")),
            Err(_) => Some(format!("{url}: no connection within {:?}", self.timeout)),
        }
    }

    /// Finds the operator's published settings in the first of `namespaces` that has them and
    /// judges its heartbeat.
    async fn probe_operator(&self, namespaces: &[String]) -> (Vec<Finding>, Option<Published>) {
        let probe = self.probe;
        let mut findings = Vec::new();
        let selector = format!("{SETTINGS_LABEL}={SETTINGS_FORMAT}");
        let mut listed = false;
        for ns in namespaces {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
            let list = match self
                .bounded(api.list(&ListParams::default().labels(&selector)))
                .await
            {
                Ok(l) => l,
                Err(why) => {
                    findings.push(probe.unanswered(&format!("configmaps in {ns}"), &why));
                    continue;
                }
            };
            listed = true;
            let Some(cm) = list.items.into_iter().next() else {
                continue;
            };
            let source = format!("{ns}/{}", cm.metadata.name.clone().unwrap_or_default());
            let settings = match PublishedSettings::from_data(&cm.data.unwrap_or_default()) {
                Ok(s) => s,
                Err(e) => {
                    findings.push(probe.finding(
                        ids::CLUSTER_SETTINGS,
                        format!("configmap/{source}"),
                        format!("the operator's published settings do not read: {e}"),
                        "an operator newer or older than this doctor wrote them; use the \
                         doctor of the operator's version (its image)",
                    ));
                    return (findings, None);
                }
            };
            findings.extend(self.judge_operator(ns, &source, &settings).await);
            return (findings, Some(Published { source, settings }));
        }
        if !listed {
            // Every listing failed: that is the finding, not "nothing is published".
            return (findings, None);
        }
        findings.push(probe.finding(
            ids::CLUSTER_SETTINGS,
            format!("namespace/{}", namespaces.join(",")),
            format!(
                "no operator settings are published in {} (a ConfigMap labelled {selector}): the \
                 operator is not running there, or predates them; judged with doctor's own flags",
                namespaces.join(", ")
            ),
            "pass --operator-namespace where the operator runs, and its --max-cap / \
             --default-cap / --max-drain-timeout",
        ));
        (findings, None)
    }

    /// The operator is live (a fresh heartbeat) and, when its pod is in the cluster, Ready.
    async fn judge_operator(
        &self,
        namespace: &str,
        source: &str,
        settings: &PublishedSettings,
    ) -> Option<Finding> {
        let probe = self.probe;
        let field = format!("configmap/{source}");
        match freshness(settings, jiff::Timestamp::now()) {
            Freshness::Live => {}
            Freshness::Stale(age) => {
                return Some(probe.finding(
                    ids::CLUSTER_OPERATOR,
                    field,
                    format!(
                        "the operator is not running or not Ready: its last heartbeat (pod {}) \
                         was {} ago",
                        settings.pod,
                        crate::units::short_duration(
                            jiff::SignedDuration::try_from(age).unwrap_or_default()
                        )
                    ),
                    "kubectl -n <operator namespace> get pods; its log says why",
                ))
            }
            Freshness::Unknown => return Some(probe.finding(
                ids::CLUSTER_OPERATOR,
                field,
                "the operator's published settings carry no heartbeat: cannot tell whether it runs",
                "upgrade the operator to the doctor's version",
            )),
        }
        // A live heartbeat; the pod that wrote it, when it is one, must be Ready too.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match self.get_opt(pods, &settings.pod).await {
            Ok(Some(pod)) => {
                let ready = pod
                    .status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                (!ready).then(|| {
                    probe.finding(
                        ids::CLUSTER_OPERATOR,
                        format!("pod/{namespace}/{}", settings.pod),
                        format!("the operator pod {} is not Ready", settings.pod),
                        "kubectl describe pod; its readiness probe is /readyz",
                    )
                })
            }
            // Not a pod of this cluster (an operator run elsewhere): the heartbeat is the proof.
            Ok(None) => None,
            Err(why) => Some(probe.unanswered(&format!("pod/{namespace}/{}", settings.pod), &why)),
        }
    }

    /// The probes of one run bound for `namespace`: a server-side dry run of `document` (the
    /// manifest as written) and every object its pod needs that `stream` (the manifests being
    /// checked) does not bring.
    pub(crate) async fn probe_run(
        &self,
        document: &serde_json::Value,
        run: &SandboxRun,
        namespace: &str,
        stream: &BTreeSet<StreamObject>,
        stream_namespaces: &BTreeSet<String>,
    ) -> Vec<Finding> {
        let mut findings = Vec::new();
        let mut namespace_missing = false;
        match self.dry_run(document, namespace).await {
            Ok(()) => {}
            Err(DryRun::Refused(message)) => findings.push(verdicts::dry_run_refused(&message)),
            Err(DryRun::NoNamespace(_)) => {
                namespace_missing = true;
                if !stream_namespaces.contains(namespace) {
                    findings.push(Finding::fail(
                        ids::REFERENCE_MISSING,
                        "metadata.namespace",
                        format!("namespace {namespace:?} does not exist"),
                        "create it first, or add it to the manifests you check",
                    ));
                }
            }
            Err(DryRun::Unanswered(message)) => findings.push(self.probe.finding(
                ids::CLUSTER_PROBE,
                "metadata",
                format!("the server-side dry run could not judge this manifest: {message}"),
                "see the cluster findings above (webhook endpoint, RBAC for create/patch on \
                 sandboxruns)",
            )),
        }
        for r in verdicts::references(run) {
            if verdicts::in_stream(&r, namespace, stream) {
                continue;
            }
            if namespace_missing && r.kind.namespaced() {
                // Nothing can be in a namespace that does not exist; the namespace is the finding.
                continue;
            }
            match self.reference_exists(&r, namespace).await {
                Ok(true) => {}
                Ok(false) => findings.push(verdicts::missing_reference(&r, namespace)),
                Err(why) => findings.push(self.probe.unanswered(
                    &format!("{} {:?} ({})", r.kind.as_str(), r.name, r.field),
                    &why,
                )),
            }
        }
        findings
    }

    /// What stops the store `run` would drain into from being used, judged as the operator
    /// judges it (`policy`: its published tenant-store rules) with doctor's identity.
    pub(crate) async fn probe_store(
        &self,
        run: &SandboxRun,
        namespace: &str,
        policy: &TenantStorePolicy,
        stream: &BTreeSet<StreamObject>,
    ) -> Option<Finding> {
        let store_ref = run.spec.store_ref();
        let call = crate::store::tenant_read::tenant_of(&self.client, namespace, store_ref, policy);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(resolved) => {
                verdicts::store_finding(resolved.map(|_| ()), namespace, stream, self.probe)
            }
            Err(_) => Some(self.probe.unanswered(
                "the run's store",
                &format!("no answer within {:?}", self.timeout),
            )),
        }
    }

    /// A server-side dry run of `document` in `namespace`, as `kubectl apply --server-side
    /// --dry-run=server` does it (a create when the manifest has only `generateName`).
    async fn dry_run(&self, document: &serde_json::Value, namespace: &str) -> Result<(), DryRun> {
        let resource = ApiResource::erase::<SandboxRun>(&());
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource);
        let mut doc = document.clone();
        if let Some(meta) = doc.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            meta.insert("namespace".into(), namespace.into());
        }
        let name = doc
            .pointer("/metadata/name")
            .and_then(|n| n.as_str())
            .map(str::to_string);
        let call = async {
            match &name {
                Some(name) => {
                    let mut params = PatchParams::apply(DOCTOR_MANAGER).force();
                    params.dry_run = true;
                    api.patch(name, &params, &Patch::Apply(&doc))
                        .await
                        .map(|_| ())
                }
                None => {
                    let obj: DynamicObject =
                        serde_json::from_value(doc.clone()).map_err(kube::Error::SerdeError)?;
                    let params = PostParams {
                        dry_run: true,
                        field_manager: Some(DOCTOR_MANAGER.to_string()),
                    };
                    api.create(&params, &obj).await.map(|_| ())
                }
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(kube::Error::Api(s))) => Err(classify_dry_run(s.code, &s.reason, &s.message)),
            Ok(Err(e)) => Err(DryRun::Unanswered(e.to_string())),
            Err(_) => Err(DryRun::Unanswered(format!(
                "no answer within {:?}",
                self.timeout
            ))),
        }
    }

    /// Whether the object `r` names exists (in `namespace` when it is namespaced).
    async fn reference_exists(&self, r: &Reference, namespace: &str) -> Result<bool, CallError> {
        let c = self.client.clone();
        let found = match r.kind {
            RefKind::Secret => self
                .get_opt(Api::<Secret>::namespaced(c, namespace), &r.name)
                .await?
                .is_some(),
            RefKind::ConfigMap => self
                .get_opt(Api::<ConfigMap>::namespaced(c, namespace), &r.name)
                .await?
                .is_some(),
            RefKind::PersistentVolumeClaim => self
                .get_opt(
                    Api::<PersistentVolumeClaim>::namespaced(c, namespace),
                    &r.name,
                )
                .await?
                .is_some(),
            RefKind::ServiceAccount => self
                .get_opt(Api::<ServiceAccount>::namespaced(c, namespace), &r.name)
                .await?
                .is_some(),
            RefKind::PriorityClass => self
                .get_opt(Api::<PriorityClass>::all(c), &r.name)
                .await?
                .is_some(),
            RefKind::RuntimeClass => self
                .get_opt(Api::<RuntimeClass>::all(c), &r.name)
                .await?
                .is_some(),
        };
        Ok(found)
    }
}

/// Probes `runs` (document, run, namespace) at most [`MANIFESTS_AT_ONCE`] at a time; the
/// findings of each, in order.
pub(crate) async fn probe_runs(
    cluster: &Cluster,
    runs: &[(&serde_json::Value, &SandboxRun, String)],
    stream: &BTreeSet<StreamObject>,
    stream_namespaces: &BTreeSet<String>,
) -> Vec<Vec<Finding>> {
    use futures::StreamExt;
    futures::stream::iter(runs.iter())
        .map(|(doc, run, ns)| cluster.probe_run(doc, run, ns, stream, stream_namespaces))
        .buffered(MANIFESTS_AT_ONCE)
        .collect()
        .await
}
