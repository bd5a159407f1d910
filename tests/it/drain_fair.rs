//! Fair drain slots on the bed (docs/contract.md "Fair drain slots", issue #28 items 4 and 5):
//! with every slot held by a drain the test keeps waiting, a second namespace's run is served
//! before the first namespace's queue, and a run whose pod is deleted is served before every
//! other waiting run — its files drained, not lost when the pod's grace period ends.
//!
//! kwok plays the node: its exec runs the packer as a local process, so a declared path is a host
//! directory, and the test's packer ([`gate_packer`]) waits while `<path>.hold` exists, then
//! appends the path's name to an order log and packs. One teardown slot and one path slot make
//! the order of service the order of that log. Assertions are on that order and the outcomes,
//! never on timings.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::Api;
use sandboxrun_operator::api::{Phase, ReadBackPhase, SandboxRun};
use sandboxrun_operator::store::{list_manifests, store_from_url};

use crate::support::*;

/// The packer of these tests: while `<path>.hold` exists it waits (having written
/// `<path>.waiting`), then appends the path's name (its host dir name without the random suffix)
/// to `order`, then packs.
fn gate_packer(bin_dir: &Path, order: &Path) -> PathBuf {
    let script = bin_dir.join("gate-pack.sh");
    let real = env!("CARGO_BIN_EXE_sandboxrun-operator");
    let text = format!(
        r#"#!/bin/sh
d="$1"; shift
if [ -e "$d.hold" ]; then : > "$d.waiting"; fi
while [ -e "$d.hold" ]; do sleep 0.1; done
basename "$d" | sed 's/-[0-9a-f]*$//' >> "{order}"
exec "{real}" pack "$d" "$@"
"#,
        order = order.display()
    );
    std::fs::write(&script, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// A host dir for the path of run `name` (named `<tag>-<name>-<random>`), with one file.
fn path_dir(tag: &str, name: &str) -> PathBuf {
    let dir = host_dir(&format!("{tag}-{name}"));
    std::fs::write(dir.join("result.txt"), format!("{name}\n")).unwrap();
    dir
}

/// Waits until the operator has logged a reconcile of run `name` in `ns` with step `teardown`:
/// the reconcile that queues its teardown (synchronously, right after that line).
async fn wait_teardown_queued(op: &Operator, ns: &str, name: &str) {
    let line = format!("reconcile run={name} namespace={ns} step=\"teardown\"");
    eventually_or_log(
        &format!("the teardown of {name} to be started"),
        Duration::from_secs(60),
        op,
        || {
            let found = op.plain_log_text().contains(&line);
            async move { found.then_some(()) }
        },
    )
    .await;
    // The enqueue follows the logged line within the same task.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Waits until the packer of the held path `dir` waits at its gate (its drain holds the slots).
async fn wait_holding(dir: &Path, op: &Operator) {
    let waiting = PathBuf::from(format!("{}.waiting", dir.display()));
    eventually_or_log(
        "the held drain to hold the slots",
        Duration::from_secs(60),
        op,
        || {
            let there = waiting.exists();
            async move { there.then_some(()) }
        },
    )
    .await;
}

/// The names in the order log, each once (its first drain).
fn served(order: &Path, tag: &str) -> Vec<String> {
    let text = std::fs::read_to_string(order).unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    for line in text.lines() {
        let name = line
            .trim()
            .trim_start_matches(&format!("{tag}-"))
            .to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The operator of these tests: one teardown slot, one path slot, a long idle bound (the held
/// packer sends nothing while it waits), the gate packer.
fn gated_operator(ns: &str, store_url: &str, pack: &str, more: &[&str]) -> Operator {
    Operator::builder(ns, store_url)
        .flags(more)
        .flags(&[
            "--pack-command",
            pack,
            "--max-concurrent-drains",
            "1",
            "--max-concurrent-path-drains",
            "1",
            "--drain-idle-timeout",
            "10m",
        ])
        .start()
}

/// Issue #28 item 4: with the only slot held by namespace A's drain and three more of A's
/// teardowns queued, namespace B's run, queued last, is served next — before A's queue empties
/// (FIFO served it last) — and `kubectl describe` of a waiting run shows a `DrainQueued` Event
/// with its place.
#[tokio::test]
async fn a_second_namespaces_run_drains_before_the_first_namespaces_queue_empties() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns_a = TestNamespace::new(&client, "fair-a").await;
    let ns_b = TestNamespace::new(&client, "fair-b").await;
    let (_d, store_url) = file_store("fair");
    let bin = host_dir("fair-bin");
    let order = bin.join("order.log");
    let pack = format!("{} ", gate_packer(&bin, &order).display());
    let watched = format!("{},{}", ns_a.name, ns_b.name);
    let op = gated_operator(&ns_a.name, &store_url, &pack, &["--namespaces", &watched]);
    let runs_a: Api<SandboxRun> = Api::namespaced(client.clone(), &ns_a.name);
    let pods_a: Api<Pod> = Api::namespaced(client.clone(), &ns_a.name);
    let runs_b: Api<SandboxRun> = Api::namespaced(client.clone(), &ns_b.name);
    let pods_b: Api<Pod> = Api::namespaced(client.clone(), &ns_b.name);

    let held = path_dir("fair", "a0");
    let hold = PathBuf::from(format!("{}.hold", held.display()));
    std::fs::write(&hold, b"").unwrap();
    create(&runs_a, "a0", spec(&[&held])).await;
    run_then_finish(&runs_a, &pods_a, "a0", &op).await;
    wait_holding(&held, &op).await;
    for name in ["a1", "a2", "a3"] {
        let dir = path_dir("fair", name);
        create(&runs_a, name, spec(&[&dir])).await;
        run_then_finish(&runs_a, &pods_a, name, &op).await;
        wait_teardown_queued(&op, &ns_a.name, name).await;
    }
    let dir = path_dir("fair", "b0");
    create(&runs_b, "b0", spec(&[&dir])).await;
    run_then_finish(&runs_b, &pods_b, "b0", &op).await;
    wait_teardown_queued(&op, &ns_b.name, "b0").await;
    // Past the quiet window, `kubectl describe` of the waiting run shows it queued, with its
    // place: next, though 3 of A's teardowns came before it.
    let queued = wait_event(
        &client,
        &ns_b.name,
        Some("b0"),
        "DrainQueued",
        Duration::from_secs(60),
        &op,
    )
    .await;
    let note = queued.note.unwrap_or_default();
    assert!(note.contains("place 1 of 4 waiting teardowns"), "{note}");

    std::fs::remove_file(&hold).unwrap();
    for (runs, name) in [
        (&runs_a, "a0"),
        (&runs_b, "b0"),
        (&runs_a, "a1"),
        (&runs_a, "a2"),
        (&runs_a, "a3"),
    ] {
        let run = wait_final(runs, name, &op, Duration::from_secs(120)).await;
        assert_eq!(read_back(&run, 0).phase, ReadBackPhase::Drained, "{run:?}");
    }
    let order = served(&order, "fair");
    assert_eq!(
        order.first().map(String::as_str),
        Some("a0"),
        "the held drain first: {order:?}"
    );
    assert_eq!(
        order.get(1).map(String::as_str),
        Some("b0"),
        "namespace B's run is served before the 3 of A queued before it: {order:?}"
    );
    assert_eq!(order.len(), 5, "{order:?}");
}

/// Issue #28 item 4, the eviction test: with the only slot held and two teardowns queued, a run
/// whose pod is deleted while it runs (`ev1`), and one whose pod is deleted while its teardown
/// waits (`ev2`), are served before the two queued before them, and their files are drained
/// (FIFO served them last: with slow drains ahead, after their pods' grace period).
#[tokio::test]
async fn a_run_whose_pod_is_deleted_while_the_slots_are_full_is_drained_first() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "fair-evict").await;
    let (_d, store_url) = file_store("fair-evict");
    let bin = host_dir("fair-evict-bin");
    let order = bin.join("order.log");
    let pack = format!("{} ", gate_packer(&bin, &order).display());
    let op = gated_operator(&ns.name, &store_url, &pack, &[]);
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    let held = path_dir("evict", "held");
    let hold = PathBuf::from(format!("{}.hold", held.display()));
    std::fs::write(&hold, b"").unwrap();
    create(&runs, "held", spec(&[&held])).await;
    run_then_finish(&runs, &pods, "held", &op).await;
    wait_holding(&held, &op).await;
    for name in ["q1", "q2"] {
        let dir = path_dir("evict", name);
        create(&runs, name, spec(&[&dir])).await;
        run_then_finish(&runs, &pods, name, &op).await;
        wait_teardown_queued(&op, &ns.name, name).await;
    }
    // ev2: its teardown waits, then its pod is deleted.
    let dir = path_dir("evict", "ev2");
    create(&runs, "ev2", spec(&[&dir]).drain_timeout("60s")).await;
    run_then_finish(&runs, &pods, "ev2", &op).await;
    wait_teardown_queued(&op, &ns.name, "ev2").await;
    let ev2_pod = pod_of(&runs.get("ev2").await.unwrap());
    pods.delete(&ev2_pod, &DeleteParams::default())
        .await
        .expect("delete ev2's pod");
    let promoted = "its pod is being deleted: its teardown is served first run=ev2".to_string();
    eventually_or_log(
        "ev2's teardown to be served first",
        Duration::from_secs(60),
        &op,
        || {
            let found = op.plain_log_text().contains(&promoted);
            async move { found.then_some(()) }
        },
    )
    .await;
    // ev1: its pod is deleted while it runs (the grace period, drainTimeout + 30 s, starts now).
    let dir = path_dir("evict", "ev1");
    create(&runs, "ev1", spec(&[&dir]).drain_timeout("60s")).await;
    let run = wait_phase(&runs, "ev1", Phase::Running, &op).await;
    pods.delete(&pod_of(&run), &DeleteParams::default())
        .await
        .expect("delete ev1's pod");
    wait_teardown_queued(&op, &ns.name, "ev1").await;

    std::fs::remove_file(&hold).unwrap();
    for name in ["held", "ev2", "ev1", "q1", "q2"] {
        wait_final(&runs, name, &op, Duration::from_secs(120)).await;
    }
    let order = served(&order, "evict");
    assert_eq!(order.len(), 5, "{order:?}");
    assert_eq!(order[0], "held", "{order:?}");
    let mut urgent = order[1..3].to_vec();
    urgent.sort();
    assert_eq!(
        urgent,
        ["ev1", "ev2"],
        "the runs whose pod is being deleted are served before the two queued before them: \
         {order:?}"
    );
    // Their files were drained, not lost when the pod went.
    let (store, prefix) = store_from_url(&store_url, &[]).unwrap();
    for name in ["ev1", "ev2"] {
        let run = runs.get(name).await.unwrap();
        assert_eq!(read_back(&run, 0).phase, ReadBackPhase::Drained, "{run:?}");
        let manifests = list_manifests(&store, &prefix, &ns.name, name)
            .await
            .unwrap();
        assert_eq!(manifests.len(), 1, "{name}: one committed manifest");
        assert!(
            manifests[0]
                .1
                .members
                .iter()
                .any(|m| m.path == "result.txt"),
            "{name}: its file is stored"
        );
    }
}

/// Issue #28 item 4: a run declaring 6 held paths holds at most `--max-path-drains-per-run` (2)
/// of the 8 path slots, so another run's path still drains meanwhile; released, its other paths
/// drain in turn.
#[tokio::test]
async fn one_run_holds_at_most_its_share_of_the_path_slots() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "fair-cap").await;
    let (_d, store_url) = file_store("fair-cap");
    let bin = host_dir("fair-cap-bin");
    let order = bin.join("order.log");
    let pack = format!("{} ", gate_packer(&bin, &order).display());
    let op = Operator::builder(&ns.name, &store_url)
        .flags(&[
            "--pack-command",
            pack.as_str(),
            "--max-concurrent-drains",
            "4",
            "--max-concurrent-path-drains",
            "8",
            "--max-path-drains-per-run",
            "2",
            "--drain-idle-timeout",
            "10m",
        ])
        .start();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    let wide: Vec<PathBuf> = (0..6).map(|i| path_dir("cap", &format!("w{i}"))).collect();
    let holds: Vec<PathBuf> = wide
        .iter()
        .map(|d| PathBuf::from(format!("{}.hold", d.display())))
        .collect();
    for hold in &holds {
        std::fs::write(hold, b"").unwrap();
    }
    let refs: Vec<&Path> = wide.iter().map(PathBuf::as_path).collect();
    create(&runs, "wide", spec(&refs)).await;
    run_then_finish(&runs, &pods, "wide", &op).await;
    wait_holding(&wide[0], &op).await;
    wait_holding(&wide[1], &op).await;
    // Another run drains meanwhile: a free slot was left to it.
    let dir = path_dir("cap", "narrow");
    create(&runs, "narrow", spec(&[&dir])).await;
    run_then_finish(&runs, &pods, "narrow", &op).await;
    let narrow = wait_final(&runs, "narrow", &op, Duration::from_secs(120)).await;
    assert_eq!(read_back(&narrow, 0).phase, ReadBackPhase::Drained);
    let started = wide
        .iter()
        .filter(|d| PathBuf::from(format!("{}.waiting", d.display())).exists())
        .count();
    assert_eq!(started, 2, "the wide run holds 2 path slots, not 6 of 8");
    for hold in &holds {
        std::fs::remove_file(hold).unwrap();
    }
    let run = wait_final(&runs, "wide", &op, Duration::from_secs(120)).await;
    for i in 0..6 {
        assert_eq!(read_back(&run, i).phase, ReadBackPhase::Drained, "{run:?}");
    }
}

/// The packer of the 500-run test: waits while `hold` exists (one gate for every path), then
/// appends `<the path's directory name> <unix time>` to `order` and packs.
fn held_packer(bin_dir: &Path, hold: &Path, order: &Path) -> PathBuf {
    let script = bin_dir.join("held-pack.sh");
    let real = env!("CARGO_BIN_EXE_sandboxrun-operator");
    let text = format!(
        r#"#!/bin/sh
d="$1"; shift
while [ -e "{hold}" ]; do sleep 0.2; done
echo "$(basename "$d") $(date +%s.%N)" >> "{order}"
exec "{real}" pack "$d" "$@"
"#,
        hold = hold.display(),
        order = order.display()
    );
    std::fs::write(&script, text).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

/// The operator's `sandboxrun_drain_queue_waiting{run_namespace=ns}` (teardowns waiting for a
/// slot), read from its metrics on `port`.
async fn queue_waiting(port: u16, ns: &str) -> Option<u64> {
    let series = format!("sandboxrun_drain_queue_waiting{{run_namespace=\"{ns}\"}}");
    operator_metric(port, &series).await.map(|v| v as u64)
}

/// Now, in seconds since the epoch (the packer's `date +%s.%N` clock).
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Creates runs `<prefix>-0..n` in `runs`, each reading back its own directory under `src`
/// (named as the run), waits until each is Running and ends its workload; returns each run's
/// name and the time its workload was ended (its teardown's start).
async fn finished_runs(
    runs: &Api<SandboxRun>,
    pods: &Api<Pod>,
    src: &Path,
    prefix: &str,
    n: usize,
    op: &Operator,
) -> Vec<(String, f64)> {
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let dir = src.join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("result.txt"), format!("{name}\n")).unwrap();
        create(runs, &name, spec(&[&dir]).drain_timeout("10m")).await;
        names.push(name);
    }
    let mut finished = Vec::new();
    for name in names {
        let run =
            wait_phase_within(runs, &name, Phase::Running, op, Duration::from_secs(300)).await;
        finish_workload(pods, &pod_of(&run), 0).await;
        finished.push((name, unix_now()));
    }
    finished
}

/// The waits (seconds from the teardown's start to its packer's start) of `finished`, from the
/// order log's times: (median, max).
fn waits(finished: &[(String, f64)], served: &[(String, f64)]) -> (f64, f64) {
    let mut w: Vec<f64> = finished
        .iter()
        .filter_map(|(name, end)| {
            let (_, at) = served.iter().find(|(n, _)| n == name)?;
            Some(at - end)
        })
        .collect();
    w.sort_by(f64::total_cmp);
    (
        w.get(w.len() / 2).copied().unwrap_or(0.0),
        w.last().copied().unwrap_or(0.0),
    )
}

/// Issue #28's fairness at scale: namespace A finishes 500 runs, their teardowns queued behind
/// the 4 slots (held by a gate until the queue is built), then namespace B finishes 5: once the
/// gate opens, B's 5 are served and end while most of A's queue still waits (FIFO would serve
/// them after all 500). B's wait is printed beside A's.
#[tokio::test]
async fn five_runs_of_a_second_namespace_end_before_the_first_namespaces_500_drain() {
    const RUNS_A: usize = 500;
    const RUNS_B: usize = 5;
    const SLOTS: usize = 4;
    let client = client().await;
    ensure_crd(&client).await;
    let ns_a = TestNamespace::new(&client, "fair-scale-a").await;
    let ns_b = TestNamespace::new(&client, "fair-scale-b").await;
    let (_d, store_url) = file_store("fair-scale");
    let work = host_dir("fair-scale");
    let _removed = RemoveOnDrop(work.clone());
    let (hold, order) = (work.join("hold"), work.join("order.log"));
    std::fs::write(&hold, b"").unwrap();
    let pack = format!("{} ", held_packer(&work, &hold, &order).display());
    let port = free_port();
    let slots = SLOTS.to_string();
    let op = Operator::builder(&ns_a.name, &store_url)
        .flags(&[
            "--namespaces",
            &format!("{},{}", ns_a.name, ns_b.name),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--pack-command",
            &pack,
            "--max-concurrent-drains",
            &slots,
            "--max-concurrent-path-drains",
            &slots,
            "--drain-idle-timeout",
            "10m",
        ])
        .start();
    let runs_a: Api<SandboxRun> = Api::namespaced(client.clone(), &ns_a.name);
    let runs_b: Api<SandboxRun> = Api::namespaced(client.clone(), &ns_b.name);
    let src = work.join("src");

    // A's 500 teardowns: SLOTS of them hold the slots at the gate, the others queue.
    let pods_a: Api<Pod> = Api::namespaced(client.clone(), &ns_a.name);
    let finished_a = finished_runs(&runs_a, &pods_a, &src, "a", RUNS_A, &op).await;
    let queued = (RUNS_A - SLOTS) as u64;
    eventually_or_log(
        &format!("{queued} of A's teardowns queued"),
        Duration::from_secs(300),
        &op,
        || async { (queue_waiting(port, &ns_a.name).await == Some(queued)).then_some(()) },
    )
    .await;
    // Then B's 5.
    let pods_b: Api<Pod> = Api::namespaced(client.clone(), &ns_b.name);
    let finished_b = finished_runs(&runs_b, &pods_b, &src, "b", RUNS_B, &op).await;
    eventually_or_log(
        "B's 5 teardowns queued",
        Duration::from_secs(120),
        &op,
        || async { (queue_waiting(port, &ns_b.name).await == Some(RUNS_B as u64)).then_some(()) },
    )
    .await;

    // The gate opens: B's runs end while A's are still queued.
    let opened = unix_now();
    std::fs::remove_file(&hold).unwrap();
    let a_open = eventually_or_log("B's runs to end", Duration::from_secs(300), &op, || async {
        let b = runs_b.list(&Default::default()).await.ok()?.items;
        let ended = b.iter().filter(|r| phase(r).is_some_and(Phase::is_final));
        if ended.count() < RUNS_B {
            return None;
        }
        let a = runs_a.list(&Default::default()).await.ok()?.items;
        Some(
            a.iter()
                .filter(|r| !phase(r).is_some_and(Phase::is_final))
                .count(),
        )
    })
    .await;
    let b_done = unix_now();
    for i in 0..RUNS_B {
        let run = runs_b.get(&format!("b-{i}")).await.unwrap();
        assert_eq!(phase(&run), Some(Phase::Succeeded), "{run:?}");
        assert_eq!(read_back(&run, 0).phase, ReadBackPhase::Drained, "{run:?}");
    }
    assert!(
        a_open > 0,
        "B's runs ended before A's queue drained: none of A's runs was still open"
    );
    eventually_or_log("A's runs to end", Duration::from_secs(600), &op, || async {
        let a = runs_a.list(&Default::default()).await.ok()?.items;
        (a.iter()
            .filter(|r| phase(r).is_some_and(Phase::is_final))
            .count()
            == RUNS_A)
            .then_some(())
    })
    .await;
    let a_done = unix_now();

    // The order of service: B's 5 among the first served, most of A's after them.
    let served: Vec<(String, f64)> = std::fs::read_to_string(&order)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (name, at) = l.split_once(' ')?;
            Some((name.to_string(), at.trim().parse().ok()?))
        })
        .collect();
    let names: Vec<&str> = served.iter().map(|(n, _)| n.as_str()).collect();
    let last_b = names
        .iter()
        .rposition(|n| n.starts_with("b-"))
        .expect("B's paths served");
    let a_after_b = names[last_b..]
        .iter()
        .filter(|n| n.starts_with("a-"))
        .count();
    let (a_median, a_max) = waits(&finished_a, &served);
    let (b_median, b_max) = waits(&finished_b, &served);
    println!(
        "500 vs 5: B's wait (teardown start to drain start) median {b_median:.1}s, max \
         {b_max:.1}s; A's median {a_median:.1}s, max {a_max:.1}s. After the gate opened: B's \
         runs ended in {:.1}s with {a_open} of A's still open, A's all ended in {:.1}s; {a_after_b} \
         of A's paths were served after B's last",
        b_done - opened,
        a_done - opened
    );
    let distinct: std::collections::BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(distinct.len(), RUNS_A + RUNS_B, "every path drained");
    assert!(
        a_after_b >= RUNS_A / 2,
        "B's 5 are served before most of A's queue (FIFO serves them after all {queued}): \
         {a_after_b} of A's after B's last"
    );
}
