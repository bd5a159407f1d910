//! Active-active replicas sharing the runs through shard Leases (`run --sharding`, issue #28,
//! docs/contract.md "Shards"): three operator processes on this host against the bed, runs on the
//! kwok node drained into a file store by a packer that takes a few seconds, then one replica
//! killed with SIGKILL while drains are in flight and another started later, then one stopped
//! with SIGTERM (it gives its shards back before it exits); and a rolling replacement of every
//! replica during 200 lifecycles.
//!
//! kwok plays the node: its exec runs the packer as a local process, so a declared path is a host
//! directory (one per run).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use sandboxrun_operator::api::{Phase, SandboxRun};
use sandboxrun_operator::shard::{shard_of, shard_of_lease_name, SHARD_LABEL};
use sandboxrun_operator::store::{list_manifests, store_from_url};

use crate::support::*;

/// The shards of the test's replicas (the default).
const SHARDS: u32 = 32;
/// Runs before the kill (the balance is counted on them) and during it: issue #28's 300 in all.
const RUNS_BEFORE: usize = 210;
const RUNS_DURING: usize = 90;
/// The Lease group (`--lease-name`).
const GROUP: &str = "sharding-test";

/// A packer that waits `seconds` first (so drains are in flight long enough to be interrupted)
/// and logs every attempt (its path) to `attempts`.
fn slow_packer(dir: &Path, attempts: &Path, seconds: u32) -> PathBuf {
    let script = dir.join("slow-pack.sh");
    let real = env!("CARGO_BIN_EXE_sandboxrun-operator");
    let text = format!(
        "#!/bin/sh\n# Packer of tests/it/sharding.rs: logs the attempt, waits, packs.\necho \"$1\" >> \"{}\"\nsleep {seconds}\nexec \"{real}\" pack \"$@\"\n",
        attempts.display()
    );
    std::fs::write(&script, text).expect("write the packer");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    script
}

/// A sharded replica named `id` of the test's operator, its metrics on `metrics`.
fn replica(ns: &str, store_url: &str, id: &str, packer: &Path, metrics: u16) -> Operator {
    replica_builder(ns, store_url, id, packer, metrics).start()
}

/// [`replica`], not started yet.
fn replica_builder(
    ns: &str,
    store_url: &str,
    id: &str,
    packer: &Path,
    metrics: u16,
) -> OperatorBuilder {
    Operator::builder(ns, store_url).flags(&[
        "--metrics-addr",
        &format!("127.0.0.1:{metrics}"),
        "--sharding",
        "--shards",
        &SHARDS.to_string(),
        "--lease-name",
        GROUP,
        "--pod-namespace",
        ns,
        "--pod-name",
        id,
        "--settings-configmap",
        "",
        "--quiet-window",
        "0s",
        "--pack-command",
        &packer.display().to_string(),
    ])
}

/// The runs in a replica's cache: the sum of its `sandboxrun_runs{phase}` gauge.
async fn cached_runs(metrics: u16) -> Option<u64> {
    let text = reqwest::get(format!("http://127.0.0.1:{metrics}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let mut sum = 0;
    for line in text.lines().filter(|l| l.starts_with("sandboxrun_runs{")) {
        sum += line.rsplit(' ').next()?.parse::<u64>().ok()?;
    }
    Some(sum)
}

/// Each shard's holder, from the shard Leases (released ones: absent).
async fn shard_holders(client: &Client, ns: &str) -> BTreeMap<u32, String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let listed = leases
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    listed
        .iter()
        .filter_map(|l| {
            let shard = shard_of_lease_name(GROUP, &l.name_any())?;
            let holder = l.spec.as_ref()?.holder_identity.clone()?;
            (!holder.is_empty()).then_some((shard, holder))
        })
        .collect()
}

/// Shards held per replica.
fn counts(holders: &BTreeMap<u32, String>) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for h in holders.values() {
        *counts.entry(h.clone()).or_default() += 1;
    }
    counts
}

/// Every run of `ended` Succeeded: none lost (the ones that did not are listed).
fn assert_all_succeeded(ended: &[SandboxRun]) {
    let lost: Vec<_> = ended
        .iter()
        .filter(|r| phase(r) != Some(Phase::Succeeded))
        .map(|r| (r.name_any(), r.status.clone()))
        .collect();
    assert!(lost.is_empty(), "no run lost: {lost:?}");
}

/// Waits until every shard is held by `ids` only, each holding ⌊N/R⌋ or ⌈N/R⌉.
async fn wait_balanced(client: &Client, ns: &str, ids: &[&str], timeout: Duration) {
    let want: BTreeSet<String> = ids.iter().map(|s| s.to_string()).collect();
    let r = ids.len() as u32;
    eventually(
        &format!("the {SHARDS} shards balanced over {ids:?}"),
        timeout,
        || async {
            let holders = shard_holders(client, ns).await;
            let counts = counts(&holders);
            let ok = holders.len() as u32 == SHARDS
                && counts.keys().cloned().collect::<BTreeSet<_>>() == want
                && counts
                    .values()
                    .all(|c| *c == SHARDS / r || *c == SHARDS.div_ceil(r));
            ok.then_some(())
        },
    )
    .await;
}

/// What each test here starts from: the cluster, a namespace, a file store, and the packer that
/// logs its attempts to `attempts`, reading the runs' directories under `src` (the store and the
/// work directory go with `_removed`).
struct Bed {
    client: Client,
    ns: TestNamespace,
    store_url: String,
    attempts: PathBuf,
    packer: PathBuf,
    src: PathBuf,
    _removed: (RemoveOnDrop, RemoveOnDrop),
}

impl Bed {
    /// The bed of a test named `prefix`, its packer waiting `seconds` before it packs.
    async fn new(prefix: &str, seconds: u32) -> Bed {
        let client = client().await;
        ensure_crd(&client).await;
        let ns = TestNamespace::new(&client, prefix).await;
        let (store_dir, store_url) = file_store(prefix);
        let work = host_dir(prefix);
        let attempts = work.join("attempts.log");
        let packer = slow_packer(&work, &attempts, seconds);
        let src = work.join("src");
        Bed {
            client,
            ns,
            store_url,
            attempts,
            packer,
            src,
            _removed: (RemoveOnDrop(store_dir), RemoveOnDrop(work)),
        }
    }
}

/// The last lines of every replica's log.
fn logs(ops: &BTreeMap<&str, Operator>) -> String {
    ops.iter()
        .map(|(id, op)| format!("--- {id}:\n{}", tail(op)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each run of `names` has exactly one committed manifest in the store.
async fn assert_one_manifest_each(store_url: &str, namespace: &str, names: &[String]) {
    let (store, prefix) = store_from_url(store_url, &[]).expect("store");
    for name in names {
        let manifests = list_manifests(&store, &prefix, namespace, name)
            .await
            .expect("list manifests");
        assert_eq!(manifests.len(), 1, "{name}: one committed manifest");
    }
}

/// Creates runs `prefix-0..n`, each reading back its own host directory under `src`.
async fn create_runs(runs: &Api<SandboxRun>, src: &Path, prefix: &str, n: usize) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let dir = src.join(&name);
        std::fs::create_dir_all(&dir).expect("run dir");
        write_pattern(&dir.join("out.bin"), 64 * 1024, i as u64);
        create(runs, &name, spec(&[&dir]).drain_timeout("3m")).await;
        names.push(name);
    }
    names
}

/// Waits until every run of `names` is Running, then ends every workload.
async fn run_then_finish_all(runs: &Api<SandboxRun>, pods: &Api<Pod>, names: &[String]) {
    let running = eventually("every run Running", Duration::from_secs(300), || async {
        let listed = runs.list(&ListParams::default()).await.ok()?.items;
        let running: BTreeMap<String, String> = listed
            .iter()
            .filter(|r| phase(r) == Some(Phase::Running))
            .filter_map(|r| Some((r.name_any(), r.status.as_ref()?.pod_name.clone()?)))
            .collect();
        names
            .iter()
            .all(|n| running.contains_key(n))
            .then_some(running)
    })
    .await;
    for name in names {
        finish_workload(pods, &running[name], 0).await;
    }
}

/// Waits until every run of `names` has ended; returns them.
async fn wait_all_final(
    runs: &Api<SandboxRun>,
    names: &[String],
    timeout: Duration,
    logs: impl Fn() -> String,
) -> Vec<SandboxRun> {
    let start = Instant::now();
    loop {
        let listed = runs
            .list(&ListParams::default())
            .await
            .expect("list runs")
            .items;
        let ended: Vec<SandboxRun> = listed
            .into_iter()
            .filter(|r| names.contains(&r.name_any()))
            .filter(|r| phase(r).is_some_and(Phase::is_final))
            .collect();
        if ended.len() == names.len() {
            return ended;
        }
        if start.elapsed() > timeout {
            let done: BTreeSet<String> = ended.iter().map(|r| r.name_any()).collect();
            let stuck: Vec<&String> = names.iter().filter(|n| !done.contains(*n)).collect();
            panic!("runs not ended after {timeout:?}: {stuck:?}\n{}", logs());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Each replica's count of the runs lies between 20 % and 50 % of them (3 replicas).
fn assert_spread(what: &str, per_replica: &BTreeMap<String, usize>) {
    assert_eq!(per_replica.len(), 3, "{what}: {per_replica:?}");
    for (id, n) in per_replica {
        let share = *n as f64 / RUNS_BEFORE as f64;
        assert!(
            (0.2..=0.5).contains(&share),
            "{id} {what} {n} of {RUNS_BEFORE}"
        );
    }
}

/// The commits and upload attempts of a test's runs.
struct Uploads {
    commits: usize,
    attempts: usize,
    packed: usize,
    again: usize,
    interrupted: usize,
}

/// Counts the commits and upload attempts of `names` (each reading back `src/<name>`) in the
/// replicas' logs and the packer's (`packer_log`), and checks them: one commit per path in all;
/// every path attempted, the packer run at most once per attempt the operator logged (each run
/// of it follows an attempt's start); a path attempted more than once was interrupted by the
/// kill (`victim` attempted it and did not commit it) or retried after a failed attempt
/// (logged).
fn count_uploads(
    ops: &BTreeMap<&str, Operator>,
    ns: &str,
    names: &[String],
    src: &Path,
    packer_log: &Path,
    victim: &str,
) -> Uploads {
    let commits = drain_lines(ops, ns, COMMITTED);
    let attempts = drain_lines(ops, ns, ATTEMPT_STARTED);
    let packer = std::fs::read_to_string(packer_log).unwrap_or_default();
    let logs: String = ops.values().map(Operator::plain_log_text).collect();
    let retried: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("drain attempt failed; retrying") || l.contains("; retrying with"))
        .collect();
    let mut count = Uploads {
        commits: 0,
        attempts: 0,
        packed: 0,
        again: 0,
        interrupted: 0,
    };
    for name in names {
        let committed: usize = commits.get(name).map_or(0, |by| by.values().sum());
        assert_eq!(
            committed,
            1,
            "{name}: committed once: {:?}",
            commits.get(name)
        );
        let by = attempts.get(name).cloned().unwrap_or_default();
        let tried: usize = by.values().sum();
        let path = src.join(name).display().to_string();
        // The packer logs the path it was given (the holder's view of it): matched by its
        // last component, the run's name.
        let packed = packer
            .lines()
            .filter(|l| Path::new(l.trim()).file_name() == Some(std::ffi::OsStr::new(name)))
            .count();
        assert!(
            (1..=tried).contains(&packed),
            "{name}: {packed} packer runs for {tried} attempts logged: {by:?}; the packer's \
             log begins {:?}",
            packer.lines().take(3).collect::<Vec<_>>()
        );
        let interrupted =
            by.contains_key(victim) && commits.get(name).is_none_or(|c| !c.contains_key(victim));
        if tried > 1 {
            let retry = retried.iter().any(|l| l.contains(&path));
            assert!(
                interrupted || retry,
                "{name} uploaded {tried} times, not interrupted by the kill nor retried: {by:?}"
            );
            count.again += 1;
        }
        count.interrupted += usize::from(interrupted);
        count.commits += committed;
        count.attempts += tried;
        count.packed += packed;
    }
    count
}

/// The replica that announced each run's end (its `Succeeded` Event's reporting instance).
async fn enders(client: &Client, ns: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut by_run: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in events_with_reason(client, ns, "Succeeded").await {
        let run = e.regarding.as_ref().and_then(|r| r.name.clone());
        if let (Some(run), Some(instance)) = (run, e.reporting_instance.clone()) {
            by_run.entry(run).or_default().insert(instance);
        }
    }
    by_run
}

/// The value of `field=` in a log line of the text format (values logged with `%`: unquoted).
fn field<'l>(line: &'l str, field: &str) -> Option<&'l str> {
    let key = format!("{field}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key.as_str()))
}

/// Per run of `ns`, per replica: how many of the log lines `message` (a drain's "drain attempt
/// started" or "committed the path's manifest") the replica wrote. Every replica's log counts,
/// a killed one's too (its file stays).
fn drain_lines(
    ops: &BTreeMap<&str, Operator>,
    ns: &str,
    message: &str,
) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mut by_run: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for (id, op) in ops {
        for line in op.plain_log_text().lines() {
            if !line.contains(message) || field(line, "namespace") != Some(ns) {
                continue;
            }
            if let Some(run) = field(line, "run") {
                *by_run
                    .entry(run.to_string())
                    .or_default()
                    .entry(id.to_string())
                    .or_default() += 1;
            }
        }
    }
    by_run
}

const ATTEMPT_STARTED: &str = "drain attempt started";
const COMMITTED: &str = "committed the path's manifest";

fn tail(op: &Operator) -> String {
    let log = op.log_text();
    let lines: Vec<&str> = log.lines().rev().take(25).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

#[tokio::test]
async fn three_replicas_share_the_runs_and_survive_a_killed_one() {
    let Bed {
        client,
        ns,
        store_url,
        attempts,
        packer,
        src,
        _removed,
    } = Bed::new("sharding", 3).await;

    let mut ops: BTreeMap<&str, Operator> = BTreeMap::new();
    let mut ports: BTreeMap<&str, u16> = BTreeMap::new();
    for id in ["sharding-a", "sharding-b", "sharding-c", "sharding-d"] {
        ports.insert(id, free_port());
    }
    for id in ["sharding-a", "sharding-b", "sharding-c"] {
        ops.insert(id, replica(&ns.name, &store_url, id, &packer, ports[id]));
    }
    wait_balanced(
        &client,
        &ns.name,
        &["sharding-a", "sharding-b", "sharding-c"],
        Duration::from_secs(60),
    )
    .await;
    println!(
        "shards: {:?}",
        counts(&shard_holders(&client, &ns.name).await)
    );

    // 1. The runs are shared: each replica ends between 20 % and 50 % of them.
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let before = create_runs(&runs, &src, "before", RUNS_BEFORE).await;
    run_then_finish_all(&runs, &pods, &before).await;
    let ended = wait_all_final(&runs, &before, Duration::from_secs(300), || logs(&ops)).await;
    assert!(
        ended.iter().all(|r| phase(r) == Some(Phase::Succeeded)),
        "every run succeeded: {:?}",
        ended
            .iter()
            .map(|r| (r.name_any(), phase(r)))
            .collect::<Vec<_>>()
    );
    let by_run = enders(&client, &ns.name).await;
    let mut per_replica: BTreeMap<String, usize> = BTreeMap::new();
    for name in &before {
        let instances = by_run.get(name).cloned().unwrap_or_default();
        assert_eq!(
            instances.len(),
            1,
            "{name} ended by exactly one replica: {instances:?}"
        );
        *per_replica
            .entry(instances.into_iter().next().unwrap())
            .or_default() += 1;
    }
    println!("runs ended per replica: {per_replica:?} of {RUNS_BEFORE}");
    assert_spread("ended", &per_replica);
    // The drains themselves: the replica that committed each run's manifest, from its log.
    let commits = drain_lines(&ops, &ns.name, COMMITTED);
    let mut drained: BTreeMap<String, usize> = BTreeMap::new();
    for name in &before {
        let by = commits.get(name).cloned().unwrap_or_default();
        assert_eq!(
            by.values().sum::<usize>(),
            1,
            "{name}: one commit in the replicas' logs: {by:?}"
        );
        *drained.entry(by.into_keys().next().unwrap()).or_default() += 1;
    }
    println!("runs drained per replica: {drained:?} of {RUNS_BEFORE}");
    assert_spread("drained", &drained);

    // Each replica caches only its shards' runs (label-selected watches): its gauge counts the
    // runs whose shard it holds, not all of them; every run carries its shard label.
    let listed = runs
        .list(&ListParams::default())
        .await
        .expect("list runs")
        .items;
    for r in &listed {
        let want = shard_of(&r.uid().unwrap_or_default(), SHARDS).to_string();
        assert_eq!(r.labels().get(SHARD_LABEL), Some(&want), "{}", r.name_any());
    }
    let holders = shard_holders(&client, &ns.name).await;
    for (id, port) in ports.iter().filter(|(id, _)| ops.contains_key(*id)) {
        let mine = listed
            .iter()
            .filter(|r| {
                let shard = shard_of(&r.uid().unwrap_or_default(), SHARDS);
                holders.get(&shard).map(String::as_str) == Some(*id)
            })
            .count() as u64;
        // The gauge is refreshed every 10 s.
        eventually(
            &format!("{id} to cache its {mine} runs of {RUNS_BEFORE}"),
            Duration::from_secs(30),
            || async move { (cached_runs(*port).await == Some(mine)).then_some(()) },
        )
        .await;
        println!("{id} caches {mine} of {RUNS_BEFORE} runs");
    }

    // 2. SIGKILL one replica while drains are in flight in its shards; start another later.
    let during = create_runs(&runs, &src, "during", RUNS_DURING).await;
    run_then_finish_all(&runs, &pods, &during).await;
    let victim = "sharding-b";
    eventually(
        "a drain in flight in the victim's shards",
        Duration::from_secs(60),
        || async {
            let holders = shard_holders(&client, &ns.name).await;
            let listed = runs.list(&ListParams::default()).await.ok()?.items;
            listed
                .iter()
                .any(|r| {
                    let shard = shard_of(&r.uid().unwrap_or_default(), SHARDS);
                    phase(r) == Some(Phase::Draining)
                        && holders.get(&shard).map(String::as_str) == Some(victim)
                })
                .then_some(())
        },
    )
    .await;
    let killed_at = Instant::now();
    ops.get_mut(victim).expect("victim").kill();
    println!("killed {victim} (SIGKILL) with drains in flight");
    // The survivors take its shards once its Leases expire.
    wait_balanced(
        &client,
        &ns.name,
        &["sharding-a", "sharding-c"],
        Duration::from_secs(60),
    )
    .await;
    println!(
        "takeover: every shard held by a survivor {:?} after the kill",
        killed_at.elapsed()
    );
    ops.insert(
        "sharding-d",
        replica(
            &ns.name,
            &store_url,
            "sharding-d",
            &packer,
            ports["sharding-d"],
        ),
    );
    let all: Vec<String> = before.iter().chain(&during).cloned().collect();
    let ended = wait_all_final(&runs, &all, Duration::from_secs(300), || logs(&ops)).await;
    assert_all_succeeded(&ended);
    wait_balanced(
        &client,
        &ns.name,
        &["sharding-a", "sharding-c", "sharding-d"],
        Duration::from_secs(60),
    )
    .await;

    // 3. Each path committed exactly once (one manifest in the store, one commit in the
    // replicas' logs); the upload attempts, counted from the replicas' logs and checked against
    // the packer's own count, were repeated only where the kill interrupted them.
    assert_one_manifest_each(&store_url, &ns.name, &all).await;
    let count = count_uploads(&ops, &ns.name, &all, &src, &attempts, victim);
    println!(
        "{} paths: {} manifests, {} commits and {} upload attempts in the replicas' logs \
         ({} packer runs); {} paths attempted again, {} of them interrupted by the kill",
        all.len(),
        all.len(),
        count.commits,
        count.attempts,
        count.packed,
        count.again,
        count.interrupted
    );
    for (id, op) in ops.iter_mut().filter(|(id, _)| **id != victim) {
        assert!(op.is_alive(), "{id} still runs:\n{}", tail(op));
    }

    // 4. SIGTERM (a rolling update's stop): the replica gives its shards back and deletes its
    // heartbeat before it exits, so the others take them without waiting for an expiry.
    let leaving = "sharding-a";
    let stopped_at = Instant::now();
    let pid = ops[leaving].pid().to_string();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM");
    assert!(term.success());
    let op = ops.get_mut(leaving).expect("leaving");
    eventually(
        "the stopped replica to exit",
        Duration::from_secs(60),
        || {
            let alive = op.is_alive();
            async move { (!alive).then_some(()) }
        },
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let heartbeat = format!("{GROUP}-replica-{leaving}");
    assert!(
        leases
            .get_opt(&heartbeat)
            .await
            .expect("get lease")
            .is_none(),
        "the heartbeat of a replica stopped with SIGTERM is deleted:\n{}",
        tail(&ops[leaving])
    );
    let holders = shard_holders(&client, &ns.name).await;
    assert!(
        holders.values().all(|h| h != leaving),
        "every shard given back: {holders:?}"
    );
    wait_balanced(
        &client,
        &ns.name,
        &["sharding-c", "sharding-d"],
        Duration::from_secs(60),
    )
    .await;
    println!(
        "handoff: every shard of {leaving} (SIGTERM) held by the others {:?} after the signal",
        stopped_at.elapsed()
    );
}

/// Issue #28's rolling upgrade: every replica is replaced, one by one, the way a Deployment's
/// rolling update does it (the old one stopped with SIGTERM, its successor started, the shards
/// balanced again before the next), while 200 runs run and drain. Every run ends `Succeeded` with
/// exactly one committed manifest, and every path was packed (at least once).
#[tokio::test]
async fn a_rolling_replacement_of_every_replica_during_200_lifecycles_loses_none() {
    const RUNS: usize = 200;
    let Bed {
        client,
        ns,
        store_url,
        attempts,
        packer,
        src,
        _removed,
    } = Bed::new("sharding-roll", 2).await;
    let ids = [
        "roll-a", "roll-b", "roll-c", "roll-a2", "roll-b2", "roll-c2",
    ];
    let ports: BTreeMap<&str, u16> = ids.iter().map(|id| (*id, free_port())).collect();
    let mut ops: BTreeMap<&str, Operator> = BTreeMap::new();
    for id in &ids[..3] {
        ops.insert(id, replica(&ns.name, &store_url, id, &packer, ports[id]));
    }
    wait_balanced(&client, &ns.name, &ids[..3], Duration::from_secs(120)).await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let names = create_runs(&runs, &src, "roll", RUNS).await;
    run_then_finish_all(&runs, &pods, &names).await;

    // The drains are under way: replace each replica in turn.
    let started = Instant::now();
    let listed = runs
        .list(&ListParams::default())
        .await
        .expect("list runs")
        .items;
    let open = listed
        .iter()
        .filter(|r| !phase(r).is_some_and(Phase::is_final))
        .count();
    println!("{open} of {RUNS} runs not ended when the first replica is stopped");
    assert!(open > 0, "the replacement happens during the lifecycles");
    for (old, new) in [
        ("roll-a", "roll-a2"),
        ("roll-b", "roll-b2"),
        ("roll-c", "roll-c2"),
    ] {
        let pid = ops[old].pid().to_string();
        let term = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        assert!(term.success());
        let op = ops.get_mut(old).expect("old replica");
        eventually("the old replica to exit", Duration::from_secs(90), || {
            let alive = op.is_alive();
            async move { (!alive).then_some(()) }
        })
        .await;
        ops.remove(old);
        ops.insert(new, replica(&ns.name, &store_url, new, &packer, ports[new]));
        let live: Vec<&str> = ops.keys().copied().collect();
        wait_balanced(&client, &ns.name, &live, Duration::from_secs(240)).await;
        println!("replaced {old} by {new} after {:?}", started.elapsed());
    }
    let ended = wait_all_final(&runs, &names, Duration::from_secs(300), || logs(&ops)).await;
    assert_all_succeeded(&ended);
    assert_one_manifest_each(&store_url, &ns.name, &names).await;
    let log = std::fs::read_to_string(&attempts).unwrap_or_default();
    let packed: BTreeSet<&str> = log.lines().collect();
    assert_eq!(packed.len(), RUNS, "every path packed");
    println!(
        "rolling replacement: {RUNS} runs ended, {} pack attempts for {RUNS} paths, {:?} in all",
        log.lines().count(),
        started.elapsed()
    );
}

/// Issue #28's self-fencing (docs/contract.md "Shards": a replica that cannot renew stops before
/// anyone may take its shards). Two replicas; `fence-a` talks to the apiserver through a proxy
/// the test owns. With `fence-a`'s drains in flight the proxy is cut — a partition that drops the
/// packets, so no call of `fence-a` fails, none is answered. `fence-a` must cancel its drains and
/// exit by itself before `fence-b` takes its shards: its exit, as this test sees it (an upper
/// bound), comes before the `acquireTime` `fence-b` writes in each of those Leases. Then
/// `fence-b` holds every shard and every run ends `Succeeded` with one manifest per path, the
/// paths `fence-a` left mid-drain attempted again.
#[tokio::test]
async fn a_replica_cut_off_from_the_apiserver_exits_before_another_takes_its_shards() {
    const RUNS: usize = 32;
    let Bed {
        client,
        ns,
        store_url,
        attempts,
        packer,
        src,
        _removed,
    } = Bed::new("sharding-fence", 10).await;
    let proxy = ApiserverProxy::start().await;
    let (cut_off, other) = ("fence-a", "fence-b");
    let mut ops: BTreeMap<&str, Operator> = BTreeMap::new();
    let builder = replica_builder(&ns.name, &store_url, cut_off, &packer, free_port());
    ops.insert(cut_off, builder.kubeconfig(proxy.kubeconfig()).start());
    let builder = replica_builder(&ns.name, &store_url, other, &packer, free_port());
    ops.insert(other, builder.start());
    wait_balanced(
        &client,
        &ns.name,
        &[cut_off, other],
        Duration::from_secs(60),
    )
    .await;

    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let names = create_runs(&runs, &src, "fence", RUNS).await;
    run_then_finish_all(&runs, &pods, &names).await;
    // A drain of the replica to cut off is in flight (its packer waits 10 s before it sends).
    eventually(
        "a drain in flight in the replica to cut off",
        Duration::from_secs(60),
        || {
            let started = drain_lines(&ops, &ns.name, ATTEMPT_STARTED);
            let committed = drain_lines(&ops, &ns.name, COMMITTED);
            let in_flight = started
                .iter()
                .any(|(run, by)| by.contains_key(cut_off) && !committed.contains_key(run));
            async move { in_flight.then_some(()) }
        },
    )
    .await;
    let shards: BTreeSet<u32> = shard_holders(&client, &ns.name)
        .await
        .into_iter()
        .filter_map(|(shard, holder)| (holder == cut_off).then_some(shard))
        .collect();
    assert!(!shards.is_empty());
    let cut_at = Instant::now();
    proxy.cut();

    // It exits by itself; when, as seen from here every 50 ms (at or after the exit).
    let op = ops.get_mut(cut_off).expect("the replica cut off");
    let deadline = Instant::now() + Duration::from_secs(90);
    while op.is_alive() {
        assert!(
            Instant::now() < deadline,
            "the replica cut off from the apiserver still runs 90 s later:\n{}",
            tail(op)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let exited = jiff::Timestamp::now();
    let exited_after = cut_at.elapsed();
    let status = op.exit_status().expect("exited");
    assert!(!status.success(), "it exits with an error: {status}");
    let log = op.plain_log_text();
    assert!(
        log.contains("shard lost; stopping every drain in flight"),
        "it says why:\n{}",
        tail(op)
    );

    // The other replica takes every shard, each of the cut-off replica's after it exited.
    wait_balanced(&client, &ns.name, &[other], Duration::from_secs(90)).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let mut first_taken: Option<jiff::Timestamp> = None;
    for shard in &shards {
        let name = sandboxrun_operator::shard::shard_lease_name(GROUP, *shard);
        let lease = leases.get(&name).await.expect("get the shard's lease");
        let spec = lease.spec.expect("a lease spec");
        assert_eq!(spec.holder_identity.as_deref(), Some(other), "{name}");
        let acquired = spec.acquire_time.expect("an acquireTime").0;
        assert!(
            exited < acquired,
            "{name}: taken by {other} at {acquired}, before {cut_off} exited (seen at {exited})"
        );
        first_taken = Some(first_taken.map_or(acquired, |t| t.min(acquired)));
    }
    let first_taken = first_taken.expect("shards taken");
    println!(
        "partition: {cut_off} exited {exited_after:?} after the cut; {other} took its first shard \
         {:.1} s after that exit",
        first_taken.duration_since(exited).as_secs_f64()
    );

    // Every run ends, each path committed once; the drains the partition interrupted were
    // cancelled by the replica cut off (its log says so) and attempted again by the other.
    let ended = wait_all_final(&runs, &names, Duration::from_secs(240), || logs(&ops)).await;
    assert_all_succeeded(&ended);
    assert_one_manifest_each(&store_url, &ns.name, &names).await;
    let count = count_uploads(&ops, &ns.name, &names, &src, &attempts, cut_off);
    assert!(count.interrupted > 0, "a drain was in flight at the cut");
    let started = drain_lines(&ops, &ns.name, ATTEMPT_STARTED);
    let committed = drain_lines(&ops, &ns.name, COMMITTED);
    for name in &names {
        let left = started.get(name).is_some_and(|by| by.contains_key(cut_off))
            && !committed
                .get(name)
                .is_some_and(|by| by.contains_key(cut_off));
        let path = format!("\"{}\"", src.join(name).display());
        assert!(
            !left
                || log
                    .lines()
                    .any(|l| l.contains("drain cancelled") && l.contains(&path)),
            "{name}: the drain {cut_off} left was cancelled"
        );
    }
    println!(
        "{RUNS} runs: {} commits, {} upload attempts ({} packer runs), {} drains cancelled by \
         the partition and done again by {other}",
        count.commits, count.attempts, count.packed, count.interrupted
    );
}

/// Issue #38: a tenant relabels its run's shard to another replica's while the run's path
/// drains (the webhook, which refuses that, out of the way: the harness has none). The second
/// replica must not drain it too — on the old code it did, and rewrote the archive the first had
/// committed. With the drain claims (src/shard/drain_claim.rs) the second replica sees the run,
/// finds the claim held by a live replica and leaves it: the packer ran once, one commit, the run
/// Succeeded with its one manifest.
#[tokio::test]
async fn a_run_relabelled_to_another_replicas_shard_mid_drain_is_drained_once() {
    let Bed {
        client,
        ns,
        store_url,
        attempts,
        packer,
        src,
        _removed,
    } = Bed::new("shard-relabel", 12).await;
    let ids = ["relabel-a", "relabel-b"];
    let mut ops: BTreeMap<&str, Operator> = BTreeMap::new();
    for id in ids {
        ops.insert(id, replica(&ns.name, &store_url, id, &packer, free_port()));
    }
    wait_balanced(&client, &ns.name, &ids, Duration::from_secs(60)).await;
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let names = create_runs(&runs, &src, "relabel", 1).await;
    let name = names[0].clone();
    run_then_finish_all(&runs, &pods, &names).await;

    // The drain is under way: the packer logged its start (it then waits 12 s).
    eventually("the packer started", Duration::from_secs(60), || async {
        let log = std::fs::read_to_string(&attempts).unwrap_or_default();
        (!log.trim().is_empty()).then_some(())
    })
    .await;
    let drainer = drain_lines(&ops, &ns.name, ATTEMPT_STARTED)
        .get(&name)
        .and_then(|by| by.keys().next().cloned())
        .unwrap_or_else(|| panic!("a replica logged the drain's start\n{}", logs(&ops)));
    let other = ids.iter().find(|id| **id != drainer).expect("two replicas");
    let holders = shard_holders(&client, &ns.name).await;
    let target = holders
        .iter()
        .find(|(_, h)| h.as_str() == *other)
        .map(|(shard, _)| *shard)
        .expect("the other replica holds a shard");
    let patch = serde_json::json!({"metadata": {"labels": {SHARD_LABEL: target.to_string()}}});
    runs.patch(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .expect("relabel the run");

    let ended = wait_all_final(&runs, &names, Duration::from_secs(120), || logs(&ops)).await;
    assert_all_succeeded(&ended);
    let packed = std::fs::read_to_string(&attempts).unwrap_or_default();
    assert_eq!(
        packed.lines().count(),
        1,
        "the packer ran once: {packed}\n{}",
        logs(&ops)
    );
    let started = drain_lines(&ops, &ns.name, ATTEMPT_STARTED);
    let committed = drain_lines(&ops, &ns.name, COMMITTED);
    assert_eq!(
        started.get(&name).map(|by| by.values().sum::<usize>()),
        Some(1),
        "one drain attempt in all: {started:?}"
    );
    assert_eq!(
        committed
            .get(&name)
            .map(|by| by.keys().cloned().collect::<Vec<_>>()),
        Some(vec![drainer.clone()]),
        "committed once, by the replica that held the claim"
    );
    // The other replica did see the run in its shard, and left the drain to the claim's holder.
    eventually(
        "the other replica saw the relabelled run and left its drain",
        Duration::from_secs(30),
        || async {
            let log = ops[*other].plain_log_text();
            log.lines()
                .any(|l| l.contains("another replica drains this run") && l.contains(&name))
                .then_some(())
        },
    )
    .await;
    assert_one_manifest_each(&store_url, &ns.name, &names).await;
}

/// Issue #39 with sharding (docs/user-guide.md "Sandboxes for agents: warm pools"): sharded
/// replicas serve the warm pools, each pool by the replica that holds its shard (its uid's).
/// - Two replicas with `--warm-pools`, pools of two pods of one template until both replicas
///   hold some pool's shard: every pool gets exactly its two pods, never more (no pool is served
///   by both);
/// - one replica killed: once the survivor holds every shard, every pool scaled to three gets its
///   third pod — the killed replica's pools too.
///
/// Before, a sharded replica served no pool at all ("not served by sharded replicas yet").
#[tokio::test]
async fn warm_pools_are_served_by_the_replica_holding_their_shard_and_survive_a_killed_one() {
    use sandboxrun_operator::api::{
        OpenField, SandboxRunPool, SandboxRunPoolSpec, SandboxRunSpec, SandboxRunTemplate,
        SandboxRunTemplateSpec, TemplateRef,
    };
    let Bed {
        client,
        ns,
        store_url,
        packer,
        src,
        _removed,
        ..
    } = Bed::new("sharding-pools", 0).await;
    let ids = ["pools-a", "pools-b"];
    let mut ops: BTreeMap<&str, Operator> = BTreeMap::new();
    for id in ids {
        let op = replica_builder(&ns.name, &store_url, id, &packer, free_port())
            .flags(&["--warm-pools"])
            .start();
        ops.insert(id, op);
    }
    wait_balanced(&client, &ns.name, &ids, Duration::from_secs(60)).await;
    let dir = src.join("pool");
    std::fs::create_dir_all(&dir).expect("dir");
    let template = SandboxRunTemplate::new(
        "t",
        SandboxRunTemplateSpec {
            template: SandboxRunSpec {
                command: Some(vec!["/bin/true".into()]),
                ..spec(&[&dir]).build()
            },
            open_fields: vec![OpenField::Command],
        },
    );
    Api::<SandboxRunTemplate>::namespaced(client.clone(), &ns.name)
        .create(&Default::default(), &template)
        .await
        .expect("create the template");
    let pools: Api<SandboxRunPool> = Api::namespaced(client.clone(), &ns.name);
    let holders = shard_holders(&client, &ns.name).await;
    let mut served_by: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..24 {
        let both = served_by.values().collect::<BTreeSet<_>>().len() == ids.len();
        if i >= 4 && both {
            break;
        }
        let name = format!("pool-{i}");
        let pool = SandboxRunPool::new(
            &name,
            SandboxRunPoolSpec {
                template_ref: TemplateRef::namespaced("t"),
                replicas: 2,
            },
        );
        let made = pools
            .create(&Default::default(), &pool)
            .await
            .expect("create the pool");
        let shard = shard_of(&made.uid().unwrap_or_default(), SHARDS);
        served_by.insert(name, holders.get(&shard).cloned().unwrap_or_default());
    }
    println!("pools by the replica holding their shard: {served_by:?}");
    let count_pods = |pool: String| {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            Api::<Pod>::namespaced(client, &ns)
                .list(&ListParams::default().labels(&format!("sandbox.iterion.io/pool={pool}")))
                .await
                .map(|l| l.items.len())
                .unwrap_or(usize::MAX)
        }
    };
    let all_ready = |n: i32| {
        let (pools, names) = (pools.clone(), served_by.clone());
        async move {
            eventually(
                &format!("every pool to have {n} ready pods"),
                Duration::from_secs(120),
                || {
                    let (pools, names) = (pools.clone(), names.clone());
                    async move {
                        for name in names.keys() {
                            let s = pools.get(name).await.ok()?.status?;
                            (s.ready_replicas == n).then_some(())?;
                        }
                        Some(())
                    }
                },
            )
            .await
        }
    };
    all_ready(2).await;
    // Served once: a few looks later no pool has more than its two pods.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in served_by.keys() {
        assert_eq!(count_pods(name.clone()).await, 2, "{name}: {}", logs(&ops));
    }

    // The second replica killed: the survivor takes its shards, and with them its pools.
    drop(ops.remove(ids[1]));
    wait_balanced(&client, &ns.name, &ids[..1], Duration::from_secs(90)).await;
    for name in served_by.keys() {
        pools
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&serde_json::json!({"spec": {"replicas": 3}})),
            )
            .await
            .expect("scale the pool");
    }
    all_ready(3).await;
    for name in served_by.keys() {
        assert_eq!(count_pods(name.clone()).await, 3, "{name}");
    }
}
