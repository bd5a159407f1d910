#!/usr/bin/env python3
"""Scale-out of sharded replicas on the kwok node: one measurement of R replicas.

Run by bench/scale_replicas.sh (which starts the R replicas, each with --sharding and the same
--max-drain-bytes-per-second, and removes everything afterwards); prints numbers, asserts nothing.

  scale_replicas.py throughput R N NS DATA_DIR PORTS PIDS LIMIT
      N SandboxRuns created at once, each declaring one path (DATA_DIR, the same host directory
      for every run: kwok's exec runs the packer on this host), each pod ending its workload
      200 ms after Running (the bed's bench-workload-exit Stage); every run is drained by the
      replica that owns its shard. Reported: lifecycles/min (N over first create -> last
      Succeeded), the aggregate drain MB/s (the bytes the replicas read from the exec streams,
      sandboxrun_drain_wire_bytes_total summed, over the same window) and, per replica, its runs,
      bytes, MB/s over its own busy time (t0 -> its last drain), shards, peak RSS and CPU.
  scale_replicas.py rss R N NS DATA_DIR PORTS PIDS
      the same lifecycles (N large, e.g. 10,000), reporting each replica's peak RSS (VmHWM) with
      every run kept (a replica caches its own shards' runs).
  scale_replicas.py summary SUMMARY_JSONL
      the ratios side by side (1 -> 2 -> 4 replicas) of what the other two appended there.

PORTS and PIDS: the replicas' metrics ports and process ids, comma-separated, in the same order.
Every measurement is appended to $BENCH_RESULTS (JSON lines) when it is set, and to
$SCALE_SUMMARY (the summary's input) when that is set.
"""

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")
TIMEOUT_S = float(os.environ.get("SCALE_TIMEOUT", "3600"))


def kubectl(*args, stdin=None):
    return subprocess.run(
        ["kubectl", *args], input=stdin, capture_output=True, text=True, check=True
    ).stdout


def result(case, metric, value, unit, to=("BENCH_RESULTS", "SCALE_SUMMARY")):
    line = json.dumps({"bench": "scale_replicas", "case": case, "metric": metric,
                       "value": value, "unit": unit}) + "\n"
    for var in to:
        path = os.environ.get(var)
        if path:
            with open(path, "a") as f:
                f.write(line)


def scrape(port):
    """The replica's metrics as {name{labels}: value} (None when it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def metric_sum(metrics, name):
    return sum(v for k, v in (metrics or {}).items() if k == name or k.startswith(name + "{"))


def proc_stats(pid):
    """(CPU seconds, peak RSS MiB) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) // 1024
    return cpu, rss


def rss_mib(pid, field):
    """One resident-memory field of the process now (MiB): `RssAnon`, its private heap and stacks;
    `RssFile`, the pages of its executable it has mapped (file-backed, shared by every replica on a
    host, but counted in each one's RSS and VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


class Phases:
    """`kubectl get sandboxruns -w`: the first receipt of each (run, phase)."""

    def __init__(self, namespace):
        self.seen = {}
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            ["kubectl", "get", "sandboxruns", "-n", namespace, "-w", "--no-headers",
             "-o", 'jsonpath={.metadata.name} {.status.phase}{"\\n"}'],
            stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self.read, daemon=True).start()

    def read(self):
        for line in self.proc.stdout:
            now = time.time()
            parts = line.split()
            if len(parts) == 2:
                with self.lock:
                    self.seen.setdefault((parts[0], parts[1]), now)

    def times(self, phase):
        with self.lock:
            return {n: t for (n, p), t in self.seen.items() if p == phase}

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def runs_yaml(n, namespace, data_dir, size_limit, compression="none"):
    """N runs on the kwok node, each draining `data_dir`; `compression` None leaves the store's
    compression at the API's default (hack/code-order.sh's profile)."""
    line = "" if compression is None else f"\n    compression: {compression}"
    doc = """apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata: {{name: r{i:05d}, namespace: {ns}}}
spec:
  image: registry.example/tool@sha256:{digest}
  command: [sh, -c, work]
  user: "1000:1000"
  podAnnotations: {{bench.sandboxrun.test/exit-code: "0"}}
  readBack:{compression}
    drainTimeout: 1h
    paths: [{{path: "{data}", sizeLimit: {limit}}}]
"""
    return "---\n".join(doc.format(i=i, ns=namespace, digest="0" * 64, data=data_dir,
                                   limit=size_limit, compression=line) for i in range(n))


def lifecycles(n, namespace, data_dir, ports, on_sample):
    """Creates the N runs and waits until every one ended; `on_sample(now)` every 0.5 s meanwhile.
    Returns (t0, t_last_succeeded, failed)."""
    watch = Phases(namespace)
    time.sleep(1.0)  # the watch is established before the first create
    t0 = time.time()
    # Documents in chunks: one `kubectl create` of 10,000 runs holds them all in memory at once.
    text = runs_yaml(n, namespace, data_dir, "64Mi")
    docs = text.split("---\n")
    for k in range(0, len(docs), 2000):
        kubectl("create", "-f", "-", stdin="---\n".join(docs[k:k + 2000]))
    deadline = time.time() + TIMEOUT_S
    while True:
        done, failed = watch.times("Succeeded"), watch.times("Failed")
        if len(done) + len(failed) >= n:
            break
        if time.time() > deadline:
            watch.stop()
            raise SystemExit(f"timed out: {len(done)} of {n} runs Succeeded, {len(failed)} Failed")
        on_sample(time.time())
        time.sleep(0.5)
    on_sample(time.time())
    watch.stop()
    return t0, max(done.values(), default=time.time()), len(failed)


def bed_cpu():
    """CPU seconds of the bed's apiserver and kwok (the node's stand-in: it runs the exec'd
    packers' streams), from $SCALE_APISERVER_PID / $SCALE_KWOK_PID; None when not given."""
    out = {}
    for name in ("APISERVER", "KWOK"):
        pid = os.environ.get(f"SCALE_{name}_PID")
        try:
            out[name.lower()] = proc_stats(int(pid))[0] if pid else None
        except (OSError, ValueError):
            out[name.lower()] = None
    return out


def throughput(r, n, namespace, data_dir, ports, pids, limit):
    case = f"R={r}"
    before = [scrape(p) for p in ports]
    cpu0 = [proc_stats(p)[0] for p in pids]
    bed0 = bed_cpu()
    last_change = [None] * r
    last_bytes = [metric_sum(m, "sandboxrun_drain_wire_bytes_total") for m in before]

    def sample(now):
        for i, p in enumerate(ports):
            b = metric_sum(scrape(p), "sandboxrun_drain_wire_bytes_total")
            if b != last_bytes[i]:
                last_bytes[i], last_change[i] = b, now

    print(f"== R={r}: {n} runs, each drained by its shard's replica "
          f"(--max-drain-bytes-per-second {limit} each)", file=sys.stderr)
    t0, t1, failed = lifecycles(n, namespace, data_dir, ports, sample)
    after = [scrape(p) for p in ports]
    bed1 = bed_cpu()
    window = t1 - t0
    rows = []
    for i in range(r):
        b = metric_sum(after[i], "sandboxrun_drain_wire_bytes_total") - \
            metric_sum(before[i], "sandboxrun_drain_wire_bytes_total")
        drained = metric_sum(after[i], 'sandboxrun_drains_total{phase="Drained"}') - \
            metric_sum(before[i], 'sandboxrun_drains_total{phase="Drained"}')
        busy = (last_change[i] or t1) - t0
        cpu, rss = proc_stats(pids[i])
        rows.append({"bytes": b, "runs": drained, "busy": busy, "rate": b / busy / 1e6 if busy > 0 else 0.0,
                     "shards": metric_sum(after[i], "sandboxrun_shards_owned"),
                     "cpu": cpu - cpu0[i], "rss": rss})
    total = sum(row["bytes"] for row in rows)
    per_min = n / window * 60
    agg = total / window / 1e6
    busy_sum = sum(row["rate"] for row in rows)
    print(f"\nR = {r} replicas, N = {n} runs, limit {limit} B/s a replica")
    print(f"  {per_min:8.0f} lifecycles/min ({window:.1f} s first create -> last Succeeded, {failed} failed)")
    print(f"  {agg:8.1f} MB/s aggregate drain ({total / 1e6:.0f} MB over the window); "
          f"{busy_sum:.1f} MB/s summing each replica over its own busy time")
    bed = {k: bed1[k] - bed0[k] for k in bed0
           if bed0[k] is not None and bed1[k] is not None and total > 0}
    for k, cpu in bed.items():
        print(f"  {k}: {cpu:.1f} CPU s over the run ({cpu / window:.2f} cores), "
              f"{cpu / (total / 1e9):.1f} CPU s per GB drained (every byte crossed it)")
        result(case, f"{k}_cpu", cpu, "s")
        result(case, f"{k}_cpu_per_gb", cpu / (total / 1e9), "s/GB")
    for i, row in enumerate(rows):
        print(f"    replica {i}: {row['shards']:.0f} shards, {row['runs']:.0f} runs, "
              f"{row['bytes'] / 1e6:.0f} MB in {row['busy']:.1f} s = {row['rate']:.1f} MB/s, "
              f"peak RSS {row['rss']} MiB, CPU {row['cpu']:.1f} s")
    for metric, value, unit in [
        ("lifecycles_per_minute", per_min, "1/min"), ("window", window, "s"),
        ("aggregate_drain_mbps", agg, "MB/s"), ("sum_of_replica_drain_mbps", busy_sum, "MB/s"),
        ("drained_bytes", total, "bytes"), ("runs", n, "count"), ("runs_failed", failed, "count"),
        ("limit_per_replica", limit, "B/s"),
        ("max_replica_peak_rss", max(row["rss"] for row in rows), "MiB"),
    ] + [(f"replica{i}_{k}", row[k], u) for i, row in enumerate(rows)
         for k, u in (("runs", "count"), ("rate", "MB/s"), ("shards", "count"), ("rss", "MiB"), ("cpu", "s"))]:
        result(case, metric, value, unit)


def rss(r, n, namespace, data_dir, ports, pids):
    case = f"rss-R={r}-N={n}"
    print(f"== R={r}: {n} runs kept, peak RSS of each replica", file=sys.stderr)
    anon = [0.0 for _ in pids]
    files = [0.0 for _ in pids]

    def sample(_now):
        for i, pid in enumerate(pids):
            anon[i] = max(anon[i], rss_mib(pid, "RssAnon"))
            files[i] = max(files[i], rss_mib(pid, "RssFile"))

    t0, t1, failed = lifecycles(n, namespace, data_dir, ports, sample)
    # The runs stay: give the replicas a relist's worth of time with all of them cached.
    for _ in range(10):
        time.sleep(0.5)
        sample(time.time())
    stats = [proc_stats(p) for p in pids]
    cached = [metric_sum(scrape(p), "sandboxrun_runs") for p in ports]
    peaks = [s[1] for s in stats]
    print(f"\nR = {r} replicas, N = {n} runs ({n / (t1 - t0) * 60:.0f} lifecycles/min, {failed} failed)")
    for i, (cpu, peak) in enumerate(stats):
        print(f"    replica {i}: peak RSS {peak} MiB, peak anonymous {anon[i]:.0f} MiB, "
              f"peak file-backed {files[i]:.1f} MiB (both sampled every 0.5 s), "
              f"{cached[i]:.0f} runs cached, CPU {cpu:.1f} s")
    print(f"  largest replica peak RSS {max(peaks)} MiB, peak anonymous {max(anon):.0f} MiB")
    result(case, "max_replica_peak_rss", max(peaks), "MiB")
    result(case, "max_replica_peak_anon", max(anon), "MiB")
    result(case, "lifecycles_per_minute", n / (t1 - t0) * 60, "1/min")
    result(case, "runs_failed", failed, "count")
    for i, peak in enumerate(peaks):
        result(case, f"replica{i}_peak_rss", peak, "MiB")
        result(case, f"replica{i}_peak_anon", anon[i], "MiB")
        result(case, f"replica{i}_peak_file", files[i], "MiB")
        result(case, f"replica{i}_cached_runs", cached[i], "count")


def summary(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by = {}
    for row in rows:
        by.setdefault(row["case"], {})[row["metric"]] = row["value"]
    tp = sorted((int(c[2:]), m) for c, m in by.items() if c.startswith("R="))
    if tp:
        base = tp[0][1]
        print("\nScale-out, per-replica drain limit "
              f"{base['limit_per_replica'] / 1e6:.0f} MB/s (ratios against R = {tp[0][0]}):")
        print(f"  {'replicas':>8} {'lifecycles/min':>15} {'ratio':>6} {'drain MB/s':>11} {'ratio':>6} "
              f"{'sum of replicas MB/s':>21} {'ratio':>6}")
        for r, m in tp:
            print(f"  {r:>8} {m['lifecycles_per_minute']:>15.0f} "
                  f"{m['lifecycles_per_minute'] / base['lifecycles_per_minute']:>5.2f}x "
                  f"{m['aggregate_drain_mbps']:>11.1f} "
                  f"{m['aggregate_drain_mbps'] / base['aggregate_drain_mbps']:>5.2f}x "
                  f"{m['sum_of_replica_drain_mbps']:>21.1f} "
                  f"{m['sum_of_replica_drain_mbps'] / base['sum_of_replica_drain_mbps']:>5.2f}x")
            case = f"R={r}"
            result(case, "ratio_lifecycles_vs_one", m["lifecycles_per_minute"] / base["lifecycles_per_minute"], "ratio",
                   to=("BENCH_RESULTS",))
            result(case, "ratio_drain_mbps_vs_one", m["aggregate_drain_mbps"] / base["aggregate_drain_mbps"], "ratio",
                   to=("BENCH_RESULTS",))
            result(case, "ratio_sum_of_replica_mbps_vs_one",
                   m["sum_of_replica_drain_mbps"] / base["sum_of_replica_drain_mbps"], "ratio", to=("BENCH_RESULTS",))
        print("  (goal: >= 3.5x the drain MB/s at 4 replicas)")
    mem = sorted(((int(c.split("-")[1][2:]), int(c.split("-")[2][2:])), m)
                 for c, m in by.items() if c.startswith("rss-"))
    if mem:
        (r1, n1), base = mem[0]
        print(f"\nPeak RSS per replica at N = {n1}:")
        if len(mem) == 1:
            # SCALE_RSS_ONLY with one count: nothing here to divide by (a ratio of 1.00 would lie).
            m = base
            print(f"  {r1} replica(s): largest {m['max_replica_peak_rss']} MiB, anonymous "
                  f"{m.get('max_replica_peak_anon', 0):.0f} MiB (no other replica count in this run: no ratio)")
            return
        for (r, n), m in mem:
            peaks = [v for k, v in m.items() if k.startswith("replica") and k.endswith("_peak_rss")]
            print(f"  {r} replica(s): largest {max(peaks)} MiB ({', '.join(f'{p:.0f}' for p in peaks)}), "
                  f"{max(peaks) / base['max_replica_peak_rss']:.2f} of R = {r1}'s")
            if "max_replica_peak_anon" in m and base.get("max_replica_peak_anon"):
                print(f"  {'':>{len(str(r))}}              anonymous only: largest {m['max_replica_peak_anon']:.0f} MiB, "
                      f"{m['max_replica_peak_anon'] / base['max_replica_peak_anon']:.2f} of R = {r1}'s")
                result(f"rss-R={r}-N={n}", "ratio_anon_vs_one",
                       m["max_replica_peak_anon"] / base["max_replica_peak_anon"], "ratio", to=("BENCH_RESULTS",))
            result(f"rss-R={r}-N={n}", "ratio_rss_vs_one", max(peaks) / base["max_replica_peak_rss"], "ratio",
                   to=("BENCH_RESULTS",))
        print("  (goal: <= 1/3 of the single replica's at 4 replicas)")


def main():
    mode = sys.argv[1]
    if mode == "summary":
        summary(sys.argv[2])
        return
    r, n, namespace, data_dir = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    ports = [int(p) for p in sys.argv[6].split(",")]
    pids = [int(p) for p in sys.argv[7].split(",")]
    if mode == "throughput":
        throughput(r, n, namespace, data_dir, ports, pids, int(sys.argv[8]))
    elif mode == "rss":
        rss(r, n, namespace, data_dir, ports, pids)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
