//! The arguments of `sandboxrun-operator run` and what is derived from them before anything
//! connects (caps, the holder's resources): a bad value stops the operator at startup instead of
//! failing every run. The wiring itself is [`super::operate`].

use std::path::PathBuf;

use clap::Args;

use crate::caps::CapSettings;
use crate::process::LogArgs;
use crate::store::StoreArgs;
use crate::units::MIB;

/// Settings of `run`. Every flag has an environment variable.
#[derive(Args, Debug, Clone)]
pub(crate) struct RunArgs {
    /// Namespaces to watch (comma-separated); empty watches every namespace.
    #[arg(long, env = "SANDBOXRUN_NAMESPACES", value_delimiter = ',')]
    pub(crate) namespaces: Vec<String>,
    /// The object store.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Cap of a read-back path that declares no sizeLimit (bytes or a quantity like 1Gi).
    #[arg(long, env = "SANDBOXRUN_READBACK_DEFAULT_CAP", default_value = "1Gi")]
    pub(crate) default_cap: String,
    /// Highest cap any read-back path may get (ADR-143's escape hatch ITERION_SANDBOX_READBACK_CAP).
    #[arg(
        long = "max-cap",
        env = "SANDBOXRUN_READBACK_CAP",
        default_value = "16Gi"
    )]
    pub(crate) max_cap: String,
    /// What deleting a run does to its stored archives and manifests when its spec sets no
    /// readBack.retention: `Retain` (keep them) or `Delete` (delete them, after the drain).
    #[arg(long, env = "SANDBOXRUN_DEFAULT_RETENTION", default_value = "Retain")]
    pub(crate) default_retention: crate::api::Retention,
    /// Drain timeout of a run that sets no readBack.drainTimeout.
    #[arg(long, env = "SANDBOXRUN_DRAIN_TIMEOUT", default_value = "5m")]
    pub(crate) drain_timeout: String,
    /// Longest drain timeout any run gets: admission refuses a readBack.drainTimeout above it, and
    /// a run admitted before it was lowered is drained within it (default: rules'
    /// DEFAULT_MAX_DRAIN_TIMEOUT, which `doctor` judges with).
    #[arg(long, env = "SANDBOXRUN_MAX_DRAIN_TIMEOUT", default_value = "1h")]
    pub(crate) max_drain_timeout: String,
    /// Per-path idle bound of a drain: a packer that keeps the drain waiting this long in all
    /// without sending 64 KiB (stalled, or trickling a byte every few seconds) is cut off and the
    /// path ends Failed, so it cannot hold a drain slot until the run's drain timeout
    /// (docs/contract.md "Drain memory").
    #[arg(long, env = "SANDBOXRUN_DRAIN_IDLE_TIMEOUT", default_value = "60s")]
    pub(crate) drain_idle_timeout: String,
    /// Bytes a second this replica's drains may read together from the packers' exec streams
    /// (bytes or a quantity: 50M, 100Mi); 0 is unlimited. Every drained byte crosses the
    /// apiserver: this bounds what one replica makes it carry (docs/operations.md "Scaling").
    #[arg(
        long,
        env = "SANDBOXRUN_MAX_DRAIN_BYTES_PER_SECOND",
        default_value = "0"
    )]
    pub(crate) max_drain_bytes_per_second: String,
    /// How long a pod's image pull may keep failing with a retryable error (ErrImagePull /
    /// ImagePullBackOff) before the run is failed with reason ImagePullFailed, counted from the
    /// pod's start (status.startTime, else its creation). A registry that answers "not found"
    /// fails the run at once.
    #[arg(long, env = "SANDBOXRUN_IMAGE_PULL_TIMEOUT", default_value = "5m")]
    pub(crate) image_pull_timeout: String,
    /// How long a run's passing states may last unreported (docs/contract.md "A quiet
    /// lifecycle"): a fresh run's pod that runs within it is first written Running, a teardown
    /// that drains within it is written once with its final phase; 0s reports every state as
    /// it is seen (two more status writes and three more Events a run).
    #[arg(long, env = "SANDBOXRUN_QUIET_WINDOW", default_value = "2s")]
    pub(crate) quiet_window: String,
    /// Image of the holder container (the operator's own image).
    #[arg(
        long,
        env = "SANDBOXRUN_HOLDER_IMAGE",
        default_value = crate::pod::DEFAULT_HOLDER_IMAGE
    )]
    pub(crate) holder_image: String,
    /// CPU request of the holder container (a Kubernetes quantity; empty: none).
    #[arg(
        long,
        env = "SANDBOXRUN_HOLDER_CPU_REQUEST",
        default_value = crate::pod::DEFAULT_HOLDER_CPU_REQUEST
    )]
    pub(crate) holder_cpu_request: String,
    /// Memory request of the holder container (a Kubernetes quantity; empty: none).
    #[arg(
        long,
        env = "SANDBOXRUN_HOLDER_MEMORY_REQUEST",
        default_value = crate::pod::DEFAULT_HOLDER_MEMORY_REQUEST
    )]
    pub(crate) holder_memory_request: String,
    /// CPU limit of the holder container (a Kubernetes quantity); none unless set, e.g. for a
    /// namespace whose ResourceQuota requires limits.cpu.
    #[arg(long, env = "SANDBOXRUN_HOLDER_CPU_LIMIT")]
    pub(crate) holder_cpu_limit: Option<String>,
    /// Memory limit of the holder container (a Kubernetes quantity; empty: none).
    #[arg(
        long,
        env = "SANDBOXRUN_HOLDER_MEMORY_LIMIT",
        default_value = crate::pod::DEFAULT_HOLDER_MEMORY_LIMIT
    )]
    pub(crate) holder_memory_limit: String,
    /// Secrets (type dockerconfigjson) added to every run pod's imagePullSecrets after the run's
    /// own (repeatable / comma-separated), so a holder image from a private registry is pulled.
    /// Each must exist in the runs' namespaces. They are taken to serve the holder image's
    /// registry only: a run whose workload image is in that registry is refused by the webhook,
    /// and its pod never carries them (imagePullSecrets are pod-wide: the workload would be
    /// pulled with the platform's credentials), unless --pod-image-pull-secret-serves-workloads
    /// (docs/contract.md "The platform's pull Secrets pull the holder, not the workload").
    #[arg(
        long = "pod-image-pull-secret",
        env = "SANDBOXRUN_POD_IMAGE_PULL_SECRETS",
        value_delimiter = ','
    )]
    pub(crate) pod_image_pull_secrets: Vec<String>,
    /// Let the --pod-image-pull-secret Secrets pull workload images of the holder image's
    /// registry too (off: such runs are refused, their pods carry no platform Secret).
    #[arg(
        long = "pod-image-pull-secret-serves-workloads",
        env = "SANDBOXRUN_POD_IMAGE_PULL_SECRET_SERVES_WORKLOADS"
    )]
    pub(crate) pod_image_pull_secret_serves_workloads: bool,
    /// Absolute path of the operator's binary in the holder image: the holder's program, its
    /// preStop hook and mark-drained exec, and (unless --pack-command says otherwise) the packer.
    /// Never looked up through PATH (docs/contract.md "The holder runs only the operator's code").
    #[arg(
        long,
        env = "SANDBOXRUN_HOLDER_BINARY",
        default_value = crate::pod::HOLDER_BINARY
    )]
    pub(crate) holder_binary: String,
    /// The packer command exec'd in the holder, its program an absolute path; the path is
    /// appended. Default: `<--holder-binary> pack`.
    #[arg(long, env = "SANDBOXRUN_PACK_COMMAND")]
    pub(crate) pack_command: Option<String>,
    /// How the holder's packer sends each path's tar over the exec stream: `adaptive` (the
    /// default: in blocks, each compressed at zstd's fastest level when that shrinks it and sent
    /// as is when it does not, so incompressible data costs no compression on either side),
    /// `zstd` (one zstd frame) or `tar` (as is). The drain decodes the stream before sanitizing;
    /// a holder that predates `adaptive` gets `zstd`, one that predates `pack --wire` a plain tar
    /// (docs/contract.md "The stream on the wire", docs/performance.md "Compression on the wire").
    #[arg(
        long,
        env = "SANDBOXRUN_DRAIN_WIRE",
        value_enum,
        default_value = "adaptive"
    )]
    pub(crate) drain_wire: crate::drain::wire::Wire,
    /// Reconciles running at once per controller: one controller for every namespace, or one per
    /// namespace of --namespaces (each with this many workers).
    #[arg(long, env = "SANDBOXRUN_CONCURRENCY", default_value_t = 16)]
    pub(crate) concurrency: u16,
    /// Drains (teardowns) running at once, off the reconcile workers: a slow or stuck drain never
    /// holds up the reconciles of other runs; teardowns beyond this wait for a slot.
    #[arg(
        long,
        env = "SANDBOXRUN_MAX_CONCURRENT_DRAINS",
        default_value_t = 8,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub(crate) max_concurrent_drains: u16,
    /// Checkpoints one run may take (`spec.checkpoint`, docs/user-guide.md "Checkpoints"): each
    /// drains every read-back path of a running sandbox into a generation of its own; past this
    /// many a checkpoint is refused (a Warning, an entry saying why). At most 64: each keeps an
    /// entry in the run's status (docs/contract.md "A run's object stays bounded").
    #[arg(
        long,
        env = "SANDBOXRUN_MAX_CHECKPOINTS",
        default_value_t = crate::api::DEFAULT_MAX_CHECKPOINTS,
        value_parser = clap::value_parser!(u32).range(0..=i64::from(crate::api::MAX_CHECKPOINTS_LIMIT))
    )]
    pub(crate) max_checkpoints: u32,
    /// Paths drained at once, across every run: the declared paths of a run drain in parallel,
    /// each holding one of these slots, which bound the drain memory (see docs/operations.md,
    /// "Sizing").
    #[arg(
        long,
        env = "SANDBOXRUN_MAX_CONCURRENT_PATH_DRAINS",
        default_value_t = 8,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub(crate) max_concurrent_path_drains: u16,
    /// Path slots one run may hold at once: a run declaring many slow paths leaves the other
    /// slots to other runs; its other paths wait their turn (docs/contract.md "Fair drain
    /// slots").
    #[arg(
        long,
        env = "SANDBOXRUN_MAX_PATH_DRAINS_PER_RUN",
        default_value_t = 4,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub(crate) max_path_drains_per_run: u16,
    /// Metrics and health address (/metrics, /healthz, /readyz).
    #[arg(long, env = "SANDBOXRUN_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub(crate) metrics_addr: String,
    /// Webhook address (HTTPS); empty disables the webhook server.
    #[arg(long, env = "SANDBOXRUN_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub(crate) webhook_addr: String,
    /// Webhook certificates: `self-managed` (CA + serving cert kept in a Secret, caBundle patched),
    /// or `files` (cert-manager or any mounted tls.crt/tls.key in --webhook-cert-dir).
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_CERT_MODE",
        default_value = "self-managed"
    )]
    pub(crate) webhook_cert_mode: String,
    /// Directory with tls.crt and tls.key (cert mode `files`).
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_CERT_DIR",
        default_value = "/tmp/k8s-webhook-server/serving-certs"
    )]
    pub(crate) webhook_cert_dir: PathBuf,
    /// PEM file of the CA whose client certificates alone may call the webhook (the one the
    /// apiserver presents to webhooks, configured in its `--admission-control-config-file`): a
    /// caller without such a certificate never gets past the TLS handshake. Unset: any TLS
    /// client is served, and only a NetworkPolicy keeps pods from making up reviews
    /// (docs/contract.md "The webhook answers only the apiserver").
    #[arg(long, env = "SANDBOXRUN_WEBHOOK_CLIENT_CA")]
    pub(crate) webhook_client_ca: Option<PathBuf>,
    /// Secret (in --pod-namespace) holding the self-managed CA and serving cert.
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_SECRET",
        default_value = "sandboxrun-operator-webhook-tls"
    )]
    pub(crate) webhook_secret: String,
    /// ValidatingWebhookConfiguration whose caBundle the self-managed mode patches.
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_CONFIG",
        default_value = "sandboxrun-operator"
    )]
    pub(crate) webhook_config: String,
    /// DNS names / IPs of the serving certificate (comma-separated).
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_HOSTS",
        value_delimiter = ',',
        default_value = "sandboxrun-operator-webhook.sandboxrun-system.svc"
    )]
    pub(crate) webhook_hosts: Vec<String>,
    /// The run policy: the runtime classes runs may set (comma-separated; unset: any, empty:
    /// none). The webhook refuses others (docs/contract.md "A run uses only its author's rights").
    #[arg(long, env = "SANDBOXRUN_ALLOWED_RUNTIME_CLASSES", value_name = "NAMES")]
    pub(crate) allowed_runtime_classes: Option<String>,
    /// The priority classes runs may set (comma-separated; unset: any, empty: none).
    #[arg(
        long,
        env = "SANDBOXRUN_ALLOWED_PRIORITY_CLASSES",
        value_name = "NAMES"
    )]
    pub(crate) allowed_priority_classes: Option<String>,
    /// The toleration keys runs may set (comma-separated; `*` also allows a toleration without a
    /// key, which tolerates every taint; unset: any, empty: none).
    #[arg(long, env = "SANDBOXRUN_ALLOWED_TOLERATION_KEYS", value_name = "KEYS")]
    pub(crate) allowed_toleration_keys: Option<String>,
    /// The endpoints tenant stores may send their credentials to (docs/contract.md "A store per
    /// namespace"), comma-separated: URL prefixes (`http://minio.storage:9000`) or HTTPS hosts
    /// (`*.amazonaws.com`; GCS: `storage.googleapis.com`, `oauth2.googleapis.com`, every URL a
    /// service-account key names is judged). Unset: tenant stores are off and every run uses
    /// --store-url. On, the operator needs get on configmaps and secrets in run namespaces
    /// (chart: tenantStores).
    #[arg(
        long,
        env = "SANDBOXRUN_TENANT_STORE_ENDPOINTS",
        value_name = "PATTERNS",
        value_delimiter = ','
    )]
    pub(crate) tenant_store_endpoints: Vec<String>,
    /// The only Secret names a store ConfigMap may name (comma-separated; unset: any name). A
    /// store naming another is refused (the run is held, `StoreUnusable`) before any Secret is
    /// read, and the chart (tenantStores.secretNames) grants `get` on those names only.
    #[arg(
        long,
        env = "SANDBOXRUN_TENANT_STORE_SECRET_NAMES",
        value_name = "NAMES",
        value_delimiter = ','
    )]
    pub(crate) tenant_store_secret_names: Vec<String>,
    /// The runtime class of a run that names none (e.g. gvisor); it must be among
    /// --allowed-runtime-classes when those are set. A namespace policy's defaultRuntimeClass
    /// wins over it. Chart: runPolicy.defaultRuntimeClass.
    #[arg(long, env = "SANDBOXRUN_DEFAULT_RUNTIME_CLASS", value_name = "NAME")]
    pub(crate) default_runtime_class: Option<String>,
    /// A YAML file of the platform's namespace policies (docs/contract.md "The platform's
    /// namespace policies"): the webhook refuses a run that breaks one, naming it. Chart:
    /// runPolicy.namespacePolicies. A file that does not parse stops the operator at start.
    #[arg(long, env = "SANDBOXRUN_NAMESPACE_POLICIES", value_name = "FILE")]
    pub(crate) namespace_policies: Option<std::path::PathBuf>,
    /// With --namespaces: the webhook refuses a SandboxRun created in any other namespace (rule
    /// namespace-not-watched; nothing would ever run it). Chart: webhook.unwatchedNamespaces=refuse.
    #[arg(
        long,
        env = "SANDBOXRUN_WEBHOOK_REFUSE_UNWATCHED",
        default_value_t = false
    )]
    pub(crate) webhook_refuse_unwatched: bool,
    /// Serve the external metrics API (`external.metrics.k8s.io/v1beta1`) on the webhook's
    /// listener: `sandboxrun_pool_claimed`, each pool's claimed pods, for a HorizontalPodAutoscaler
    /// of the pool's namespace (docs/user-guide.md "Scaling a pool with a
    /// HorizontalPodAutoscaler"). Needs the apiserver's aggregation layer (its requestheader CA in
    /// kube-system/extension-apiserver-authentication, read at start) and an APIService pointing
    /// at the webhook's Service. Chart: externalMetrics.enabled.
    #[arg(long, env = "SANDBOXRUN_EXTERNAL_METRICS", default_value_t = false)]
    pub(crate) external_metrics: bool,
    /// The APIService whose caBundle the self-managed webhook certificates are published in
    /// (with --external-metrics).
    #[arg(
        long,
        env = "SANDBOXRUN_EXTERNAL_METRICS_API_SERVICE",
        default_value = "v1beta1.external.metrics.k8s.io"
    )]
    pub(crate) external_metrics_api_service: String,
    /// Check image resolvability (no pull) in the webhook; a failure only warns when transient.
    #[arg(long, env = "SANDBOXRUN_CHECK_IMAGES", default_value_t = false)]
    pub(crate) check_images: bool,
    /// Resolve each run's image against its registry (the manifest only, never a pull) before its
    /// pod is created: a definitive miss (manifest unknown, repository not found) fails the run
    /// at once with reason ImageUnresolvable and no pod; a transient error (timeout, 5xx,
    /// connection refused) creates the pod with a Warning Event. Reads the pods' imagePullSecrets.
    #[arg(long, env = "SANDBOXRUN_PREFLIGHT_IMAGES", default_value_t = false)]
    pub(crate) preflight_images: bool,
    /// ConfigMap (in --pod-namespace) the operator publishes its live settings in (caps, drain
    /// timeouts, network-policy mode, drain wire, image checks) and refreshes every minute while
    /// Ready, for `doctor --context`; empty: not published.
    #[arg(
        long,
        env = "SANDBOXRUN_SETTINGS_CONFIGMAP",
        default_value = crate::policy::published::DEFAULT_SETTINGS_CONFIGMAP
    )]
    pub(crate) settings_configmap: String,
    /// What the controller does with a run that uses a Secret, ConfigMap, PVC, ServiceAccount,
    /// template or store its author's rights were not verified for by the operator's webhook (no
    /// valid admission stamp, docs/contract.md "A run uses only its author's rights"): `hold`
    /// keeps it Pending with no pod (Ready=False RightsUnverified); `trust` gives it a pod with
    /// the operator's rights, for clusters whose every run author may use everything in the
    /// namespace.
    #[arg(
        long,
        value_enum,
        env = "SANDBOXRUN_UNADMITTED_REFERENCES",
        default_value = "hold"
    )]
    pub(crate) unadmitted_references: crate::policy::stamp::UnadmittedReferences,
    /// The Secret in --pod-namespace that holds the key of the admission stamps; created with 32
    /// random bytes by the first replica that finds none.
    #[arg(
        long,
        env = "SANDBOXRUN_ADMISSION_KEY_SECRET",
        default_value = "sandboxrun-operator-admission-key"
    )]
    pub(crate) admission_key_secret: String,
    /// Elect a leader on a Lease so several replicas can run.
    #[arg(long, env = "SANDBOXRUN_LEADER_ELECT", default_value_t = false)]
    pub(crate) leader_elect: bool,
    /// Share the runs among every replica (active-active, docs/operations.md "Scaling"): each
    /// run belongs to one of --shards shards, each shard is owned by one replica through its own
    /// Lease (`<--lease-name>-shard-<k>` in --pod-namespace), and a replica reconciles and drains
    /// only the runs of its shards. Not with --leader-elect.
    #[arg(long, env = "SANDBOXRUN_SHARDING", default_value_t = false)]
    pub(crate) sharding: bool,
    /// The number of shards with --sharding: the same on every replica (a change moves runs
    /// between shards: change it only with every replica stopped).
    #[arg(
        long,
        env = "SANDBOXRUN_SHARDS",
        default_value_t = crate::shard::DEFAULT_SHARDS,
        value_parser = clap::value_parser!(u32).range(1..=4096)
    )]
    pub(crate) shards: u32,
    /// Lease name (leader election), or the prefix of the shard and replica Leases (--sharding).
    #[arg(
        long,
        env = "SANDBOXRUN_LEASE_NAME",
        default_value = "sandboxrun-operator"
    )]
    pub(crate) lease_name: String,
    /// Namespace of the operator itself (lease, webhook Secret).
    #[arg(long, env = "POD_NAMESPACE", default_value = "sandboxrun-system")]
    pub(crate) pod_namespace: String,
    /// This replica's identity (events, leases): unique per replica.
    #[arg(long, env = "POD_NAME", default_value = "sandboxrun-operator-local")]
    pub(crate) pod_name: String,
    /// Whether this cluster's network plugin enforces NetworkPolicy: `enforced`, or
    /// `unenforced-refuse` (a run whose spec.network restricts egress does not start) or
    /// `unenforced-warn` (it starts with a Warning Event).
    #[arg(
        long,
        env = "SANDBOXRUN_NETWORK_POLICY",
        value_enum,
        default_value = "enforced"
    )]
    pub(crate) network_policy: crate::egress::PolicyEnforcement,
    /// URL of the egress proxy the workloads of filtered runs use (empty: none, and host-name
    /// rules are not enforced), e.g. http://sandboxrun-operator-egress-proxy.sandboxrun-system.svc:3128.
    #[arg(long, env = "SANDBOXRUN_EGRESS_PROXY_URL", default_value = "")]
    pub(crate) egress_proxy_url: String,
    /// Namespace of the egress proxy's pods (default: --pod-namespace).
    #[arg(long, env = "SANDBOXRUN_EGRESS_PROXY_NAMESPACE")]
    pub(crate) egress_proxy_namespace: Option<String>,
    /// Labels of the egress proxy's pods (key=value, comma-separated): what a run's
    /// NetworkPolicy lets it reach.
    #[arg(
        long,
        env = "SANDBOXRUN_EGRESS_PROXY_SELECTOR",
        value_delimiter = ',',
        default_value = "app.kubernetes.io/component=egress-proxy"
    )]
    pub(crate) egress_proxy_selector: Vec<String>,
    /// Port the egress proxy's pods listen on.
    #[arg(long, env = "SANDBOXRUN_EGRESS_PROXY_PORT", default_value_t = 3128)]
    pub(crate) egress_proxy_port: u16,
    /// The egress proxy's canary port (its `--canary-listen`): a filtered run's egress gate,
    /// anchored on the proxy, probes it instead of --egress-gate-probe when the run's policy
    /// allows no address range, so a closed or firewalled probe is never taken for the policy.
    #[arg(long, env = "SANDBOXRUN_EGRESS_PROXY_CANARY_PORT")]
    pub(crate) egress_proxy_canary_port: Option<u16>,
    /// File with the secret the per-run proxy tokens are derived from (the proxy reads the same).
    #[arg(long, env = "SANDBOXRUN_EGRESS_TOKEN_SECRET_FILE")]
    pub(crate) egress_token_secret_file: Option<PathBuf>,
    /// Namespace of the cluster DNS pods a filtered run may query.
    #[arg(long, env = "SANDBOXRUN_DNS_NAMESPACE", default_value = "kube-system")]
    pub(crate) dns_namespace: String,
    /// Labels of the cluster DNS pods (key=value, comma-separated).
    #[arg(
        long,
        env = "SANDBOXRUN_DNS_SELECTOR",
        value_delimiter = ',',
        default_value = "k8s-app=kube-dns"
    )]
    pub(crate) dns_selector: Vec<String>,
    /// What the egress gate of a filtered run's pod probes until the run's NetworkPolicy denies
    /// it, before the workload starts: `node:<port>` (the pod's node IP: its kubelet port is
    /// served on every node the drain can exec into), `<ip>:<port>`, or `off` (the workload
    /// starts at once and may race its policy). The address must be one no run's rules allow.
    #[arg(
        long,
        env = "SANDBOXRUN_EGRESS_GATE_PROBE",
        default_value = crate::inpod::gate::DEFAULT_GATE_PROBE
    )]
    pub(crate) egress_gate_probe: String,
    /// How long the egress gate waits for the policy before the run fails (`EgressNotEnforced`).
    #[arg(
        long,
        env = "SANDBOXRUN_EGRESS_GATE_TIMEOUT",
        default_value = crate::inpod::gate::DEFAULT_GATE_TIMEOUT
    )]
    pub(crate) egress_gate_timeout: String,
    /// Give a filtered run's egress gate the egress proxy as its anchor: a denied probe opens the
    /// gate only while the proxy (which the run's policy allows) answers, so a network that is
    /// not up yet is not taken for the policy. `false` where the run pods cannot resolve the
    /// proxy's Service name.
    #[arg(
        long,
        env = "SANDBOXRUN_EGRESS_GATE_ANCHOR",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub(crate) egress_gate_anchor: bool,
    /// Let a denylist run's NetworkPolicy allow every address but its denied ones. Off: it
    /// allows only DNS, the egress proxy and the ranges its `!` rules allow explicitly, so a
    /// denylist run never reaches more than its namespace's own NetworkPolicies allow (they add
    /// up); host names still go through the proxy, which applies the whole denylist.
    #[arg(long, env = "SANDBOXRUN_EGRESS_DENYLIST_WIDE", default_value_t = false)]
    pub(crate) egress_denylist_wide: bool,
    /// Queue runs labelled `kueue.x-k8s.io/queue-name` through Kueue (its Workload API; Kueue
    /// v0.17's CRDs must be installed): such a run gets a Workload asking for its pod's
    /// requests and no pod until Kueue admits it (docs/user-guide.md "Queueing with Kueue").
    /// Off: the label means nothing to the operator.
    #[arg(long, env = "SANDBOXRUN_KUEUE", default_value_t = false)]
    pub(crate) kueue: bool,
    /// Serve SandboxRunPools (their CRD must be installed): keep each pool's pods ready ahead of
    /// demand, and give a run made from a pooled template a ready pod instead of a new one
    /// (docs/user-guide.md "Sandboxes for agents: warm pools"). With sharded replicas, each pool
    /// is served by the replica that holds its shard.
    #[arg(long, env = "SANDBOXRUN_WARM_POOLS", default_value_t = false)]
    pub(crate) warm_pools: bool,
    /// NO_PROXY of a filtered run's workload: what it reaches without the proxy.
    #[arg(
        long,
        env = "SANDBOXRUN_NO_PROXY",
        default_value = crate::egress::settings::DEFAULT_NO_PROXY
    )]
    pub(crate) no_proxy: String,
    /// `--log-format`, `--log-level`.
    #[command(flatten)]
    pub(crate) log: LogArgs,
}

impl RunArgs {
    /// The path slots (`--max-concurrent-path-drains`) and how many one run may hold
    /// (`--max-path-drains-per-run`).
    pub(crate) fn path_slots(&self) -> (usize, usize) {
        (
            usize::from(self.max_concurrent_path_drains),
            usize::from(self.max_path_drains_per_run),
        )
    }

    /// The run policy of `--allowed-runtime-classes`, `--allowed-priority-classes` and
    /// `--allowed-toleration-keys`.
    pub fn run_policy(&self) -> crate::policy::run_policy::RunPolicy {
        use crate::policy::run_policy::parse_list;
        crate::policy::run_policy::RunPolicy {
            runtime_classes: parse_list(self.allowed_runtime_classes.as_deref()),
            priority_classes: parse_list(self.allowed_priority_classes.as_deref()),
            toleration_keys: parse_list(self.allowed_toleration_keys.as_deref()),
        }
    }
}

/// A `run` flag the operator refuses at start: the text names the flag and what is wrong.
#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum FlagError {
    /// `--default-runtime-class` is not a name.
    #[error("--default-runtime-class {0:?} is not a DNS-1123 subdomain")]
    RuntimeClassName(String),
    /// `--default-runtime-class` is not among the allowed ones.
    #[error(
        "--default-runtime-class {class:?} is not among --allowed-runtime-classes ({allowed})"
    )]
    RuntimeClassNotAllowed {
        /// The class.
        class: String,
        /// The allowed ones, comma-separated.
        allowed: String,
    },
    /// `--namespace-policies` cannot be read.
    #[error("--namespace-policies {path}: {why}")]
    NamespacePoliciesRead {
        /// The file.
        path: String,
        /// The OS error's words.
        why: String,
    },
    /// `--namespace-policies` holds policies that cannot be used.
    #[error("--namespace-policies {path}: {source}")]
    NamespacePolicies {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: crate::policy::namespace_policy::PolicyFileError,
    },
    /// A cap is not a byte quantity.
    #[error("bad cap {text:?}: {source}")]
    Cap {
        /// The value.
        text: String,
        /// Why.
        #[source]
        source: crate::units::QuantityError,
    },
    /// `--max-cap` is below 1Mi.
    #[error("--max-cap {0} is below 1Mi")]
    MaxCapTooSmall(String),
    /// `--max-drain-bytes-per-second` is not a byte quantity.
    #[error("--max-drain-bytes-per-second {value:?}: {source}")]
    Bandwidth {
        /// The value.
        value: String,
        /// Why.
        #[source]
        source: crate::units::QuantityError,
    },
    /// A label selector flag does not parse.
    #[error(transparent)]
    Selector(#[from] crate::egress::settings::SelectorError),
    /// `--egress-token-secret-file` cannot serve (its words).
    #[error("{0}")]
    TokenSecret(String),
    /// `--egress-proxy-url` does not parse.
    #[error("--egress-proxy-url {value:?}: {source}")]
    ProxyUrl {
        /// The value.
        value: String,
        /// Why.
        #[source]
        source: url::ParseError,
    },
    /// `--egress-proxy-url` is not `http://host:port`.
    #[error("--egress-proxy-url {0:?}: want http://host:port")]
    ProxyUrlShape(String),
    /// A proxy without the token secret.
    #[error("--egress-proxy-url needs --egress-token-secret-file (the proxy's secret)")]
    ProxyWithoutSecret,
    /// `--egress-gate-probe` does not parse.
    #[error(transparent)]
    GateProbe(#[from] crate::inpod::gate::ProbeError),
    /// `--egress-gate-timeout` is not a duration.
    #[error("--egress-gate-timeout: {0}")]
    GateTimeout(#[source] crate::units::DurationError),
}

/// `--default-runtime-class`, checked: a DNS-1123 subdomain, among `--allowed-runtime-classes`
/// when those are set (else every run without one would be refused by its own default's pod).
pub(crate) fn default_runtime_class(args: &RunArgs) -> Result<Option<String>, FlagError> {
    let Some(class) = args.default_runtime_class.as_deref().map(str::trim) else {
        return Ok(None);
    };
    if class.is_empty() {
        return Ok(None);
    }
    if !crate::names::is_dns1123_subdomain(class) {
        return Err(FlagError::RuntimeClassName(class.to_string()));
    }
    if let Some(allowed) = args.run_policy().runtime_classes {
        if !allowed.iter().any(|a| a == class) {
            return Err(FlagError::RuntimeClassNotAllowed {
                class: class.to_string(),
                allowed: allowed.join(","),
            });
        }
    }
    Ok(Some(class.to_string()))
}

/// The namespace policies of `--namespace-policies` (none when unset).
pub(crate) fn namespace_policies(
    args: &RunArgs,
) -> Result<Vec<crate::policy::namespace_policy::Compiled>, FlagError> {
    let Some(path) = &args.namespace_policies else {
        return Ok(Vec::new());
    };
    let text = std::fs::read_to_string(path).map_err(|e| FlagError::NamespacePoliciesRead {
        path: path.display().to_string(),
        why: e.to_string(),
    })?;
    crate::policy::namespace_policy::load(&text).map_err(|source| FlagError::NamespacePolicies {
        path: path.display().to_string(),
        source,
    })
}

/// Parses a cap given in bytes or as a Kubernetes quantity.
pub(crate) fn parse_cap(text: &str) -> Result<u64, FlagError> {
    let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(text.to_string());
    crate::units::quantity_to_bytes(&q).map_err(|source| FlagError::Cap {
        text: text.to_string(),
        source,
    })
}

/// `--max-drain-bytes-per-second`: the replica's drain bandwidth (0: unlimited).
pub(crate) fn drain_bandwidth(
    args: &RunArgs,
) -> Result<crate::drain::bandwidth::DrainBandwidth, FlagError> {
    let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(
        args.max_drain_bytes_per_second.clone(),
    );
    let rate = crate::units::quantity_to_bytes(&q).map_err(|source| FlagError::Bandwidth {
        value: args.max_drain_bytes_per_second.clone(),
        source,
    })?;
    let bandwidth = crate::drain::bandwidth::DrainBandwidth::new(rate);
    if bandwidth.is_limited() {
        tracing::info!(bytes_per_second = %args.max_drain_bytes_per_second, "drain bandwidth limited");
    }
    Ok(bandwidth)
}

/// Cap settings from the run flags.
pub(crate) fn caps(args: &RunArgs) -> Result<CapSettings, FlagError> {
    let caps = CapSettings {
        default_bytes: parse_cap(&args.default_cap)?,
        max_bytes: parse_cap(&args.max_cap)?,
    };
    if caps.max_bytes < MIB {
        return Err(FlagError::MaxCapTooSmall(args.max_cap.clone()));
    }
    Ok(caps)
}

/// The holder container's resources from the run flags (checked as Kubernetes quantities, so a
/// bad value stops the operator at startup instead of failing every pod).
pub(crate) fn holder_resources(
    args: &RunArgs,
) -> Result<crate::pod::HolderResources, crate::pod::HolderResourcesError> {
    crate::pod::HolderResources::parse(
        &args.holder_cpu_request,
        &args.holder_memory_request,
        args.holder_cpu_limit.as_deref(),
        &args.holder_memory_limit,
    )
}

/// Egress settings from the run flags (checked at startup).
pub(crate) fn egress_settings(args: &RunArgs) -> Result<crate::egress::EgressSettings, FlagError> {
    use crate::egress::settings::parse_labels;
    let dns = crate::egress::PeerSelector {
        namespace: args.dns_namespace.clone(),
        pod_labels: parse_labels("--dns-selector", &args.dns_selector)?,
    };
    let token_secret = match &args.egress_token_secret_file {
        Some(path) => Some(crate::egress::settings::TokenSecret(
            crate::egress::proxy::read_secret(path)
                .map_err(|e| FlagError::TokenSecret(e.to_string()))?,
        )),
        None => None,
    };
    let proxy = if args.egress_proxy_url.trim().is_empty() {
        None
    } else {
        let url = url::Url::parse(args.egress_proxy_url.trim()).map_err(|source| {
            FlagError::ProxyUrl {
                value: args.egress_proxy_url.clone(),
                source,
            }
        })?;
        if url.scheme() != "http" || url.host_str().is_none() {
            return Err(FlagError::ProxyUrlShape(args.egress_proxy_url.clone()));
        }
        if token_secret.is_none() {
            return Err(FlagError::ProxyWithoutSecret);
        }
        Some(crate::egress::ProxyPeer {
            url: args
                .egress_proxy_url
                .trim()
                .trim_end_matches('/')
                .to_string(),
            selector: crate::egress::PeerSelector {
                namespace: args
                    .egress_proxy_namespace
                    .clone()
                    .unwrap_or_else(|| args.pod_namespace.clone()),
                pod_labels: parse_labels("--egress-proxy-selector", &args.egress_proxy_selector)?,
            },
            port: args.egress_proxy_port,
            canary_port: args.egress_proxy_canary_port,
            address: None,
        })
    };
    let gate = match crate::inpod::gate::parse_probe(&args.egress_gate_probe)? {
        None => None,
        Some(probe) => Some(crate::inpod::gate::GateSettings {
            probe,
            timeout: crate::units::parse_duration(&args.egress_gate_timeout)
                .map_err(FlagError::GateTimeout)?,
            anchor: args.egress_gate_anchor,
        }),
    };
    Ok(crate::egress::EgressSettings {
        enforcement: args.network_policy,
        dns,
        proxy,
        token_secret,
        no_proxy: args.no_proxy.clone(),
        gate,
        denylist_wide: args.egress_denylist_wide,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::{Cli, Command};
    use clap::Parser;
    use std::time::Duration;

    #[test]
    fn the_drain_bandwidth_is_unlimited_unless_set_and_a_bad_value_stops_the_start() {
        let bandwidth = |extra: &[&str]| {
            let argv: Vec<&str> = ["x", "run"].iter().chain(extra).copied().collect();
            let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else {
                panic!("run")
            };
            drain_bandwidth(&args)
        };
        assert!(!bandwidth(&[]).unwrap().is_limited());
        assert!(!bandwidth(&["--max-drain-bytes-per-second", "0"])
            .unwrap()
            .is_limited());
        assert!(bandwidth(&["--max-drain-bytes-per-second", "50M"])
            .unwrap()
            .is_limited());
        assert!(bandwidth(&["--max-drain-bytes-per-second=100Mi"])
            .unwrap()
            .is_limited());
        let bad = bandwidth(&["--max-drain-bytes-per-second", "fast"])
            .unwrap_err()
            .to_string();
        assert!(bad.contains("--max-drain-bytes-per-second"), "{bad}");
        assert!(bandwidth(&["--max-drain-bytes-per-second=-1M"]).is_err());
    }

    #[test]
    fn caps_accept_quantities_and_options_need_equals() {
        assert_eq!(parse_cap("1Gi"), Ok(1 << 30));
        assert_eq!(parse_cap("1048576"), Ok(1 << 20));
        assert!(parse_cap("lots").is_err());
        assert_eq!(
            crate::store::parse_options(&["endpoint=http://x".into(), "allow_http=true".into()]),
            Ok(vec![
                ("endpoint".into(), "http://x".into()),
                ("allow_http".into(), "true".into())
            ])
        );
        assert!(crate::store::parse_options(&["novalue".into()]).is_err());
    }

    #[test]
    fn the_image_pull_timeout_defaults_to_five_minutes() {
        let Command::Run(args) = Cli::try_parse_from(["x", "run"]).unwrap().command else {
            panic!("not run");
        };
        assert_eq!(
            crate::units::parse_duration(&args.image_pull_timeout),
            Ok(crate::caps::DEFAULT_IMAGE_PULL_TIMEOUT)
        );
        let Command::Run(args) = Cli::try_parse_from(["x", "run", "--image-pull-timeout", "90s"])
            .unwrap()
            .command
        else {
            panic!("not run");
        };
        assert_eq!(
            crate::units::parse_duration(&args.image_pull_timeout),
            Ok(Duration::from_secs(90))
        );
    }

    #[test]
    fn max_checkpoints_is_bounded_so_a_runs_status_stays_bounded() {
        let parsed = |argv: &[&str]| match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Run(args)) => Some(args.max_checkpoints),
            _ => None,
        };
        assert_eq!(
            parsed(&["x", "run"]),
            Some(crate::api::DEFAULT_MAX_CHECKPOINTS)
        );
        assert_eq!(parsed(&["x", "run", "--max-checkpoints=64"]), Some(64));
        assert_eq!(parsed(&["x", "run", "--max-checkpoints=10000"]), None);
    }

    #[test]
    fn the_image_preflight_is_off_unless_asked_for() {
        let parsed = |argv: &[&str]| match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Run(args)) => args.preflight_images,
            other => panic!("parsed as {other:?}"),
        };
        assert!(!parsed(&["x", "run"]));
        assert!(parsed(&["x", "run", "--preflight-images"]));
    }

    #[test]
    fn holder_resource_flags_default_to_todays_values_and_are_checked() {
        let run_args = |extra: &[&str]| {
            let argv = ["x", "run"].iter().chain(extra).copied();
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Run(args) => *args,
                other => panic!("parsed as {other:?}"),
            }
        };
        assert_eq!(
            holder_resources(&run_args(&[])),
            Ok(crate::pod::HolderResources::default())
        );
        let set = holder_resources(&run_args(&[
            "--holder-cpu-request=100m",
            "--holder-memory-request=32Mi",
            "--holder-cpu-limit=1",
            "--holder-memory-limit=256Mi",
        ]))
        .unwrap();
        let q = |s: &str| {
            Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                s.into(),
            ))
        };
        assert_eq!(
            (
                set.cpu_request,
                set.memory_request,
                set.cpu_limit,
                set.memory_limit
            ),
            (q("100m"), q("32Mi"), q("1"), q("256Mi"))
        );
        assert!(matches!(
            holder_resources(&run_args(&["--holder-cpu-limit=fast"])),
            Err(crate::pod::HolderResourcesError::NotAQuantity { .. })
        ));
    }

    #[test]
    fn egress_flags_default_to_enforced_without_a_proxy_and_a_proxy_needs_the_secret() {
        let run_args = |extra: &[&str]| {
            let argv = ["x", "run"].iter().chain(extra).copied();
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Run(args) => *args,
                other => panic!("parsed as {other:?}"),
            }
        };
        let plain = egress_settings(&run_args(&[])).unwrap();
        assert_eq!(plain, crate::egress::EgressSettings::default());
        assert!(egress_settings(&run_args(&["--egress-proxy-url=http://p.sys.svc:3128"])).is_err());
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("s");
        std::fs::write(&secret, "0123456789abcdef0123\n").unwrap();
        let secret_flag = format!("--egress-token-secret-file={}", secret.display());
        let set = egress_settings(&run_args(&[
            "--egress-proxy-url=http://p.sys.svc:3128/",
            &secret_flag,
            "--network-policy=unenforced-warn",
            "--pod-namespace=sys",
            "--egress-proxy-selector=a=b,c=d",
        ]))
        .unwrap();
        assert_eq!(
            set.enforcement,
            crate::egress::PolicyEnforcement::UnenforcedWarn
        );
        let proxy = set.proxy.unwrap();
        assert_eq!(proxy.url, "http://p.sys.svc:3128");
        assert_eq!(proxy.selector.namespace, "sys");
        assert_eq!(proxy.selector.pod_labels.len(), 2);
        assert_eq!(
            set.token_secret.map(|s| s.0.to_vec()),
            Some(b"0123456789abcdef0123".to_vec())
        );
        assert!(egress_settings(&run_args(&[
            "--egress-proxy-url=https://p:3128",
            &secret_flag
        ]))
        .is_err());
        assert!(
            !plain.denylist_wide,
            "a denylist run's policy is narrow by default"
        );
        let wide = egress_settings(&run_args(&["--egress-denylist-wide"])).unwrap();
        assert!(wide.denylist_wide);
        let unanchored = egress_settings(&run_args(&["--egress-gate-anchor=false"])).unwrap();
        assert_eq!(unanchored.gate.map(|g| g.anchor), Some(false));
        assert!(Cli::try_parse_from(["x", "run", "--network-policy=maybe"]).is_err());
        Cli::try_parse_from(["x", "egress-proxy", "--token-secret-file", "/s"]).unwrap();
    }
}
