//! What the egress proxy knows of the runs (docs/contract.md "ADR-006 network rules: validated
//! and enforced"): each run's rules, whether it is still live, and the addresses of its pods.
//! Two watches keep it current ([`watch_runs`], [`watch_pods`]); [`authorize`] is the pure
//! decision on a credential the proxy has verified: the run must be live and the connection must
//! come from one of the run's own pods. A live run holds a signal ([`RunEnd`]) that fires when
//! the table learns it ended, was deleted or is gone from a relist: its open tunnels close then.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::api::{NetworkMode, Phase, SandboxRun};
use crate::egress::mode::{egress_of, Egress};
use crate::egress::network::Rule;
use crate::names::RUN_UID_LABEL;

/// What the proxy knows of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRules {
    /// `namespace/name`, for logs and refusals.
    pub run: String,
    /// The run's namespace (its pods must be in it).
    pub namespace: String,
    /// The mode.
    pub mode: NetworkMode,
    /// Its parsed rules.
    pub rules: Vec<Rule>,
    /// Whether the run is over or being torn down: its token no longer opens anything.
    pub ended: bool,
    /// The egress the pod a connection comes from recorded at its creation
    /// ([`crate::started`]): a target must pass these rules too, so an edit of the run made
    /// after its pod exists narrows its egress and never widens it. None: the run as the table
    /// has it (not yet authorized for a pod), or a pod that records none.
    pub started: Option<Arc<StartedEgress>>,
}

/// The egress a run's pod recorded at its creation, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartedEgress {
    /// The mode.
    pub mode: NetworkMode,
    /// Its parsed rules (none with `allowlist`: nothing is allowed).
    pub rules: Vec<Rule>,
}

impl StartedEgress {
    /// The egress `pod` recorded; None when it records none or its record does not parse as
    /// admission parses rules (a pod the operator did not write: then the run's own rules alone
    /// judge, as before the record).
    fn of(pod: &Pod) -> Option<StartedEgress> {
        let network = crate::started::recorded_network(pod)?;
        match crate::egress::mode::egress_of_network(Some(&network)).ok()? {
            Egress::Open => None,
            Egress::DenyAll => Some(StartedEgress {
                mode: NetworkMode::Allowlist,
                rules: Vec::new(),
            }),
            Egress::Filtered { mode, rules } => Some(StartedEgress { mode, rules }),
        }
    }
}

/// Whether a run's workload may still use the proxy: not once the run is being torn down
/// (Draining), has ended (Succeeded, Failed, Stopped) or is being deleted.
pub(crate) fn run_ended(phase: Option<Phase>, deleting: bool) -> bool {
    deleting || phase.is_some_and(|p| p == Phase::Draining || p.is_final())
}

impl RunRules {
    /// The rules of a run; None when its rules do not parse (every request is then refused with
    /// 407, the same as an unknown run: the run cannot have started).
    pub fn of(run: &SandboxRun) -> Option<RunRules> {
        // A run made from a template runs with the template's network (docs/contract.md
        // "Templates"), recorded in its status before its pod exists.
        let made = crate::template::recorded(run);
        // Not recorded yet: its pod does not exist, and its own spec is not what it runs.
        if run.spec.template_ref.is_some() && made.is_none() {
            return None;
        }
        let (mode, rules) = match egress_of(made.as_ref().unwrap_or(run)).ok()? {
            Egress::Open => (NetworkMode::Open, Vec::new()),
            Egress::DenyAll => (NetworkMode::Allowlist, Vec::new()),
            Egress::Filtered { mode, rules } => (mode, rules),
        };
        // A run without its namespace or name has no rules: its traffic is refused (fail closed).
        let namespace = crate::identity::namespace_of(run).ok()?.to_string();
        let name = crate::identity::name_of(run).ok()?;
        Some(RunRules {
            run: format!("{namespace}/{name}"),
            namespace,
            mode,
            rules,
            ended: run_ended(
                run.status.as_ref().and_then(|s| s.phase),
                run.metadata.deletion_timestamp.is_some(),
            ),
            started: None,
        })
    }
}

/// Why a verified credential opens nothing (a 407, counted by reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthRefusal {
    /// No `Proxy-Authorization`, a token that does not verify, or a run the proxy does not know.
    BadCredentials,
    /// The run is being torn down, has ended or is being deleted.
    RunEnded,
    /// The connection does not come from one of the run's pods.
    WrongSource,
}

impl AuthRefusal {
    /// The `reason` label of `sandboxrun_egress_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            AuthRefusal::BadCredentials => "bad_credentials",
            AuthRefusal::RunEnded => "run_ended",
            AuthRefusal::WrongSource => "wrong_source",
        }
    }
}

/// One pod of a run, as the pod watch last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RunPod {
    namespace: String,
    ips: Vec<IpAddr>,
    started: Option<Arc<StartedEgress>>,
}

/// IPv4-mapped IPv6 addresses compare as IPv4 (a dual-stack listener reports them).
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// The decision on a run whose token verified: live, and asked from one of its pods' addresses
/// (`pods`: the namespace and addresses of each pod labelled with the run's uid).
pub(crate) fn authorize<'a>(
    run: &RunRules,
    mut pods: impl Iterator<Item = (&'a str, &'a [IpAddr])>,
    peer: IpAddr,
) -> Result<(), AuthRefusal> {
    if run.ended {
        return Err(AuthRefusal::RunEnded);
    }
    let peer = canonical(peer);
    let own = pods.any(|(ns, ips)| ns == run.namespace && ips.contains(&peer));
    if own {
        Ok(())
    } else {
        Err(AuthRefusal::WrongSource)
    }
}

/// A run the table knows: its rules and, while it is live, the sender whose drop tells its
/// tunnels that it ended.
struct Known {
    rules: Arc<RunRules>,
    live: Option<watch::Sender<()>>,
}

impl Known {
    /// `rules` as the table's entry, keeping the signal of the `previous` entry of the same run
    /// while it stays live (an edit of its rules does not close its tunnels). An ended run has
    /// none, so dropping `previous` fires it.
    fn new(rules: RunRules, previous: Option<Known>) -> Known {
        let live = if rules.ended {
            None
        } else {
            previous
                .and_then(|k| k.live)
                .or_else(|| Some(watch::channel(()).0))
        };
        Known {
            rules: Arc::new(rules),
            live,
        }
    }
}

/// Resolves once a run is no longer live (docs/contract.md "ADR-006 network rules: validated and
/// enforced": a run's tunnels close when it ends).
pub(crate) struct RunEnd(Option<watch::Receiver<()>>);

impl RunEnd {
    /// Waits until the run ends; at once when it was not live when this was taken.
    pub(crate) async fn ended(self) {
        if let Some(mut rx) = self.0 {
            // Nothing is ever sent: `changed` fails when the sender is dropped.
            while rx.changed().await.is_ok() {}
        }
    }
}

/// The runs by uid and their pods' addresses, kept current by [`watch_runs`] and [`watch_pods`]
/// (tests fill it directly).
#[derive(Default)]
pub struct RunTable {
    runs: RwLock<HashMap<String, Known>>,
    /// Run uid → pod `namespace/name` → the pod.
    pods: RwLock<HashMap<String, BTreeMap<String, RunPod>>>,
    /// Set once the first list of runs is in: before it every token would be "unknown".
    synced: AtomicBool,
    /// Set once the first list of pods is in: before it every source would be "wrong".
    pods_synced: AtomicBool,
    /// Woken by every change of the runs or the pods ([`RunTable::authorize_soon`]).
    changed: tokio::sync::Notify,
}

/// How long a verified token of a run the table does not know yet, or a connection from a pod
/// it has not seen become the run's yet, waits for the watches to catch up before it is refused:
/// a warm pool pod's claim relabels the pod a moment before the run's workload starts in it
/// (docs/user-guide.md "Sandboxes for agents: warm pools"), and the pod watch may tell the proxy
/// a moment after the workload's first request. Only a token that verified waits (its run's
/// own workload, or a leak of it), holding its connection slot meanwhile.
pub(crate) const LEARN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The run uid a pod is labelled with, its `namespace/name` key, and its addresses (none when
/// it has finished or shares its node's network: such an address is not the run's alone).
fn pod_entry(pod: &Pod) -> Option<(String, String, RunPod)> {
    let uid = pod.labels().get(RUN_UID_LABEL)?.clone();
    let namespace = crate::identity::namespace_of(pod).ok()?.to_string();
    let key = format!("{namespace}/{}", pod.name_any());
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let status = pod.status.as_ref();
    let finished = status
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    let mut ips: Vec<IpAddr> = Vec::new();
    if !host_network && !finished {
        let listed = status.and_then(|s| s.pod_ips.as_ref());
        let texts = listed
            .into_iter()
            .flatten()
            .map(|p| p.ip.as_str())
            .chain(status.and_then(|s| s.pod_ip.as_deref()));
        for ip in texts
            .filter_map(|t| t.parse::<IpAddr>().ok())
            .map(canonical)
        {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
    }
    let started = StartedEgress::of(pod).map(Arc::new);
    Some((
        uid,
        key,
        RunPod {
            namespace,
            ips,
            started,
        },
    ))
}

impl RunTable {
    /// Adds or replaces a run.
    pub fn upsert(&self, run: &SandboxRun) {
        let _wake = Wake(&self.changed);
        let Some(uid) = run.metadata.uid.clone() else {
            return;
        };
        if let Ok(mut map) = self.runs.write() {
            // The previous entry is dropped here when the run ended or no longer parses.
            let previous = map.remove(&uid);
            if let Some(r) = RunRules::of(run) {
                map.insert(uid, Known::new(r, previous));
            }
        }
    }

    /// Forgets a run.
    pub fn remove(&self, uid: &str) {
        let _wake = Wake(&self.changed);
        if let Ok(mut map) = self.runs.write() {
            map.remove(uid);
        }
    }

    /// Replaces every run (a watch relist); a run left out has ended for its tunnels.
    pub fn replace(&self, runs: &[SandboxRun]) {
        let _wake = Wake(&self.changed);
        if let Ok(mut map) = self.runs.write() {
            let mut old = std::mem::take(&mut *map);
            for (uid, rules) in runs
                .iter()
                .filter_map(|r| Some((r.metadata.uid.clone()?, RunRules::of(r)?)))
            {
                let previous = old.remove(&uid);
                map.insert(uid, Known::new(rules, previous));
            }
        }
        self.synced.store(true, Ordering::SeqCst);
    }

    /// Adds or replaces a pod of a run (one labelled with a run uid; others are ignored).
    pub fn upsert_pod(&self, pod: &Pod) {
        let _wake = Wake(&self.changed);
        let Some((uid, key, entry)) = pod_entry(pod) else {
            return;
        };
        if let Ok(mut map) = self.pods.write() {
            map.entry(uid).or_default().insert(key, entry);
        }
    }

    /// Forgets a pod.
    pub fn remove_pod(&self, pod: &Pod) {
        let Some((uid, key, _)) = pod_entry(pod) else {
            return;
        };
        if let Ok(mut map) = self.pods.write() {
            if let Some(pods) = map.get_mut(&uid) {
                pods.remove(&key);
                if pods.is_empty() {
                    map.remove(&uid);
                }
            }
        }
    }

    /// Replaces every pod (a watch relist).
    pub fn replace_pods(&self, pods: &[Pod]) {
        let _wake = Wake(&self.changed);
        let mut fresh: HashMap<String, BTreeMap<String, RunPod>> = HashMap::new();
        for (uid, key, entry) in pods.iter().filter_map(pod_entry) {
            fresh.entry(uid).or_default().insert(key, entry);
        }
        if let Ok(mut map) = self.pods.write() {
            *map = fresh;
        }
        self.pods_synced.store(true, Ordering::SeqCst);
    }

    /// Whether runs and pods have been listed at least once.
    pub(crate) fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst) && self.pods_synced.load(Ordering::SeqCst)
    }

    /// The rules of the run with this uid.
    pub fn get(&self, uid: &str) -> Option<Arc<RunRules>> {
        let map = self.runs.read().ok()?;
        map.get(uid).map(|k| Arc::clone(&k.rules))
    }

    /// The signal of the run's end; already fired when the run is not live now.
    pub(crate) fn run_end(&self, uid: &str) -> RunEnd {
        let rx = self.runs.read().ok().and_then(|map| {
            let live = map.get(uid)?.live.as_ref()?;
            Some(live.subscribe())
        });
        RunEnd(rx)
    }

    /// The run with this uid if a connection from `peer` may use its (verified) token.
    /// The rules returned carry the egress the peer's pod recorded at its creation
    /// ([`RunRules::started`]).
    pub fn authorize(&self, uid: &str, peer: IpAddr) -> Result<Arc<RunRules>, AuthRefusal> {
        let run = self.get(uid).ok_or(AuthRefusal::BadCredentials)?;
        let pods = self.pods.read().map_err(|_| AuthRefusal::WrongSource)?;
        let entries = pods.get(uid).into_iter().flat_map(|m| m.values());
        authorize(
            &run,
            entries
                .clone()
                .map(|p| (p.namespace.as_str(), p.ips.as_slice())),
            peer,
        )?;
        let peer = canonical(peer);
        let started = entries
            .filter(|p| p.namespace == run.namespace && p.ips.contains(&peer))
            .find_map(|p| p.started.clone());
        Ok(match started {
            Some(started) => Arc::new(RunRules {
                started: Some(started),
                ..(*run).clone()
            }),
            None => run,
        })
    }

    /// [`RunTable::authorize`], waiting up to `within` ([`LEARN_WAIT`]) for the watches to tell
    /// of the run or of its pod when it is not known yet; a run that ended is refused at once.
    pub(crate) async fn authorize_soon(
        &self,
        uid: &str,
        peer: IpAddr,
        within: std::time::Duration,
    ) -> Result<Arc<RunRules>, AuthRefusal> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Registered before the look, so a change in between is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let verdict = self.authorize(uid, peer);
            if !matches!(
                verdict,
                Err(AuthRefusal::BadCredentials | AuthRefusal::WrongSource)
            ) {
                return verdict;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.authorize(uid, peer);
            }
        }
    }

    /// Runs known.
    pub fn len(&self) -> usize {
        self.runs.read().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether no run is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Wakes the waiters of [`RunTable::authorize_soon`] when dropped: after the change was made.
struct Wake<'a>(&'a tokio::sync::Notify);

impl Drop for Wake<'_> {
    fn drop(&mut self) {
        self.0.notify_waiters();
    }
}

/// Keeps the runs of `table` equal to the runs the apiserver has (a relist replaces them whole).
pub(crate) async fn watch_runs(api: Api<SandboxRun>, table: Arc<RunTable>) {
    let mut init: Vec<SandboxRun> = Vec::new();
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(run)) => table.upsert(&run),
            Ok(watcher::Event::Delete(run)) => {
                if let Some(uid) = run.metadata.uid.as_deref() {
                    table.remove(uid);
                }
            }
            Ok(watcher::Event::Init) => init.clear(),
            Ok(watcher::Event::InitApply(run)) => init.push(run),
            Ok(watcher::Event::InitDone) => {
                table.replace(&init);
                info!(runs = table.len(), "egress proxy: runs listed");
                init.clear();
            }
            Err(e) => warn!(error = %e, "watching SandboxRuns"),
        }
    }
}

/// Keeps the pods of `table` equal to the operator's pods the apiserver has (labelled
/// managed-by=sandboxrun-operator; a relist replaces them whole).
pub(crate) async fn watch_pods(api: Api<Pod>, table: Arc<RunTable>) {
    let mut init: Vec<Pod> = Vec::new();
    let config = watcher::Config::default().labels(&crate::names::managed_by_selector());
    let stream = watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(pod)) => table.upsert_pod(&pod),
            Ok(watcher::Event::Delete(pod)) => table.remove_pod(&pod),
            Ok(watcher::Event::Init) => init.clear(),
            Ok(watcher::Event::InitApply(pod)) => init.push(pod),
            Ok(watcher::Event::InitDone) => {
                table.replace_pods(&init);
                info!(pods = init.len(), "egress proxy: run pods listed");
                init.clear();
            }
            Err(e) => warn!(error = %e, "watching run pods"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodIP, PodSpec, PodStatus};

    fn rules(ended: bool) -> RunRules {
        RunRules {
            run: "ns/r".into(),
            namespace: "ns".into(),
            mode: NetworkMode::Allowlist,
            rules: Vec::new(),
            ended,
            started: None,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))
    }

    #[test]
    fn a_run_made_from_a_template_has_the_recorded_templates_rules_and_none_before() {
        use crate::api::{
            AppliedTemplate, NetworkPolicy, SandboxRunSpec, SandboxRunStatus,
            SandboxRunTemplateSpec, TemplateKind, TemplateRef,
        };
        let mut run = SandboxRun::new(
            "r",
            SandboxRunSpec {
                template_ref: Some(TemplateRef::namespaced("t")),
                ..SandboxRunSpec::default()
            },
        );
        run.metadata.namespace = Some("ns".into());
        assert!(RunRules::of(&run).is_none(), "no record: unknown");
        run.status = Some(SandboxRunStatus {
            template: Some(AppliedTemplate {
                kind: TemplateKind::SandboxRunTemplate,
                name: "t".into(),
                generation: Some(1),
                spec: SandboxRunTemplateSpec {
                    template: SandboxRunSpec {
                        network: Some(NetworkPolicy {
                            mode: NetworkMode::Allowlist,
                            rules: vec!["mirror.example.com".into()],
                        }),
                        ..SandboxRunSpec::default()
                    },
                    open_fields: Vec::new(),
                },
            }),
            ..SandboxRunStatus::default()
        });
        let rules = RunRules::of(&run).expect("recorded");
        assert_eq!(rules.mode, NetworkMode::Allowlist);
        assert_eq!(rules.rules.len(), 1);
        // A run made from the cluster template of the same name: that record is not its own.
        let mut cluster = run.clone();
        cluster.spec.template_ref = Some(TemplateRef::cluster("t"));
        assert!(
            RunRules::of(&cluster).is_none(),
            "another template's record"
        );
        if let Some(t) = cluster.status.as_mut().and_then(|s| s.template.as_mut()) {
            t.kind = TemplateKind::ClusterSandboxRunTemplate;
        }
        let rules = RunRules::of(&cluster).expect("its cluster template's record");
        assert_eq!(rules.mode, NetworkMode::Allowlist);
    }

    #[test]
    fn a_run_ends_with_its_teardown_not_only_its_deletion() {
        assert!(!run_ended(None, false));
        assert!(!run_ended(Some(Phase::Pending), false));
        assert!(!run_ended(Some(Phase::Running), false));
        for p in [
            Phase::Draining,
            Phase::Succeeded,
            Phase::Failed,
            Phase::Stopped,
        ] {
            assert!(run_ended(Some(p), false), "{p:?}");
        }
        assert!(run_ended(Some(Phase::Running), true), "being deleted");
    }

    #[test]
    fn only_a_live_run_from_its_own_pod_is_authorized() {
        let pod_ips = [ip("10.0.0.5"), ip("fd00::5")];
        let pods = || [("ns", pod_ips.as_slice())].into_iter();
        assert_eq!(authorize(&rules(false), pods(), ip("10.0.0.5")), Ok(()));
        assert_eq!(authorize(&rules(false), pods(), ip("fd00::5")), Ok(()));
        assert_eq!(
            authorize(&rules(false), pods(), ip("::ffff:10.0.0.5")),
            Ok(()),
            "a v4-mapped peer is its v4 address"
        );
        assert_eq!(
            authorize(&rules(false), pods(), ip("10.0.0.6")),
            Err(AuthRefusal::WrongSource)
        );
        assert_eq!(
            authorize(&rules(true), pods(), ip("10.0.0.5")),
            Err(AuthRefusal::RunEnded)
        );
        assert_eq!(
            authorize(&rules(false), std::iter::empty(), ip("10.0.0.5")),
            Err(AuthRefusal::WrongSource),
            "no pod known: nothing is its source"
        );
        let other_ns = [("other", pod_ips.as_slice())];
        assert_eq!(
            authorize(&rules(false), other_ns.into_iter(), ip("10.0.0.5")),
            Err(AuthRefusal::WrongSource),
            "a pod in another namespace labelled with the run's uid is not the run's"
        );
    }

    fn pod(name: &str, uid: &str, phase: &str, host_network: bool, ips: &[&str]) -> Pod {
        let mut pod = Pod {
            spec: Some(PodSpec {
                host_network: Some(host_network),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                pod_ip: ips.first().map(|s| s.to_string()),
                pod_ips: Some(ips.iter().map(|s| PodIP { ip: s.to_string() }).collect()),
                ..PodStatus::default()
            }),
            ..Pod::default()
        };
        pod.metadata.name = Some(name.into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.labels = Some([(RUN_UID_LABEL.to_string(), uid.to_string())].into());
        pod
    }

    #[test]
    fn the_table_knows_the_addresses_of_running_pods_only() {
        let table = RunTable::default();
        let run = crate::testkit::sandbox_run("r")
            .namespace("ns")
            .uid("u")
            .build();
        table.upsert(&run);
        let peer = ip("10.0.0.5");
        assert_eq!(
            table.authorize("u", peer).err(),
            Some(AuthRefusal::WrongSource)
        );
        table.upsert_pod(&pod("p", "u", "Running", false, &["10.0.0.5"]));
        assert!(table.authorize("u", peer).is_ok());
        table.upsert_pod(&pod("p", "u", "Succeeded", false, &["10.0.0.5"]));
        assert_eq!(
            table.authorize("u", peer).err(),
            Some(AuthRefusal::WrongSource),
            "a finished pod's address may already be another pod's"
        );
        table.upsert_pod(&pod("p", "u", "Running", true, &["10.0.0.5"]));
        assert!(
            table.authorize("u", peer).is_err(),
            "a host-network pod's address is its node's"
        );
        table.upsert_pod(&pod("p", "u", "Running", false, &["10.0.0.5"]));
        table.remove_pod(&pod("p", "u", "Running", false, &[]));
        assert!(table.authorize("u", peer).is_err(), "deleted");
        assert_eq!(
            table.authorize("nobody", peer).err(),
            Some(AuthRefusal::BadCredentials)
        );
    }

    #[tokio::test]
    async fn a_verified_token_waits_a_moment_for_the_watches_to_tell_of_its_run_and_pod() {
        let table = Arc::new(RunTable::default());
        let run = crate::testkit::sandbox_run("r")
            .namespace("ns")
            .uid("u")
            .build();
        let peer = ip("10.0.0.5");
        // Neither the run nor its pod known when the request comes; both learnt a moment later
        // (a warm pool pod's claim): the request is served.
        let waiting = {
            let table = Arc::clone(&table);
            tokio::spawn(async move { table.authorize_soon("u", peer, LEARN_WAIT).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        table.upsert(&run);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        table.upsert_pod(&pod("p", "u", "Running", false, &["10.0.0.5"]));
        let served = waiting.await.expect("join");
        assert!(served.is_ok(), "{:?}", served.err());
        // Never learnt: refused once the wait is over, with what was wrong.
        let other = ip("10.0.0.6");
        let short = std::time::Duration::from_millis(100);
        assert_eq!(
            table.authorize_soon("u", other, short).await.err(),
            Some(AuthRefusal::WrongSource)
        );
        // An ended run is refused at once, without waiting.
        let mut ended = run.clone();
        ended.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        table.upsert(&ended);
        let started = std::time::Instant::now();
        assert_eq!(
            table.authorize_soon("u", peer, LEARN_WAIT).await.err(),
            Some(AuthRefusal::RunEnded)
        );
        assert!(started.elapsed() < LEARN_WAIT);
    }

    /// Whether `end` has fired (polled once, without waiting).
    fn fired(end: &mut std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>) -> bool {
        use futures::FutureExt;
        end.as_mut().now_or_never().is_some()
    }

    fn live_run(uid: &str, rules: &[&str]) -> SandboxRun {
        crate::testkit::sandbox_run(uid)
            .namespace("ns")
            .uid(uid)
            .network(NetworkMode::Allowlist, rules)
            .build()
    }

    #[test]
    fn a_runs_end_fires_when_it_ends_is_deleted_or_is_left_out_of_a_relist() {
        let table = RunTable::default();
        let end_of =
            |uid: &str| -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
                Box::pin(table.run_end(uid).ended())
            };
        // Ended: its phase.
        let mut run = live_run("u", &["a.example"]);
        table.upsert(&run);
        let mut end = end_of("u");
        assert!(!fired(&mut end), "live");
        run.spec.network = Some(crate::api::NetworkPolicy {
            mode: NetworkMode::Allowlist,
            rules: vec!["b.example".into()],
        });
        table.upsert(&run);
        assert!(!fired(&mut end), "a rule edit does not end the run");
        run.status = Some(crate::api::SandboxRunStatus {
            phase: Some(Phase::Succeeded),
            ..crate::api::SandboxRunStatus::default()
        });
        table.upsert(&run);
        assert!(fired(&mut end), "ended");
        assert!(
            fired(&mut end_of("u")),
            "an ended run's end has fired already"
        );
        // Deleted.
        table.upsert(&live_run("v", &[]));
        let mut end = end_of("v");
        table.remove("v");
        assert!(fired(&mut end), "deleted");
        // Left out of a relist; a run kept by it stays live.
        table.upsert(&live_run("w", &[]));
        table.upsert(&live_run("x", &[]));
        let (mut w, mut x) = (end_of("w"), end_of("x"));
        table.replace(&[live_run("x", &[])]);
        assert!(fired(&mut w), "not in the relist");
        assert!(!fired(&mut x), "still listed");
        assert!(fired(&mut end_of("nobody")), "an unknown run is not live");
    }

    #[test]
    fn the_table_is_synced_by_the_first_lists_only() {
        let table = RunTable::default();
        let mut run = SandboxRun::new("r", crate::api::SandboxRunSpec::default());
        run.metadata.uid = Some("u".into());
        table.upsert(&run);
        assert!(!table.is_synced(), "a single event is not a list");
        table.replace(&[]);
        assert!(!table.is_synced(), "the pods are not listed yet");
        table.replace_pods(&[]);
        assert!(table.is_synced());
        assert!(
            table.get("u").is_none(),
            "a relist replaces the table whole"
        );
    }
}
