#!/usr/bin/env python3
"""Full lifecycles per minute: N SandboxRuns against N batch/v1 Jobs, side by side on the kwok node.

Run by bench/lifecycle_vs_jobs.sh (which builds the operator and sets the environment); prints
numbers and ratios, asserts nothing. For each N:

  runs   N SandboxRuns created at once ($LIFECYCLE_CREATORS, default 8, `kubectl create -f`
         processes side by side, each creating its share of the N documents), each declaring
         one read-back path holding ~1 MiB (the same host directory: kwok's exec runs the packer
         on this host). Each pod carries the bench's exit annotation, so kwok ends its workload
         200 ms after Running (the bed's bench-workload-exit Stage); the operator then drains the
         path into a file:// store and the run reaches Succeeded.
  jobs   N Jobs created the same way, one pod each, completed by kwok's stock pod-complete Stage;
         kube-controller-manager's Job controller at its defaults.

Reported: lifecycles per minute (N over first create -> last final phase), create -> Running
and Running -> Succeeded p50/p99 for runs (from a watch, receipt times), create -> Complete
p50/p99 for Jobs, the operator's peak RSS (VmHWM) and CPU seconds, and the apiserver's
mutating requests per lifecycle (apiserver_request_total, verbs other than GET/LIST/WATCH,
over the whole window: everything the cluster wrote meanwhile is included, for both sides), and
of those the refused ones (a 4xx/5xx code: nothing written) by resource and verb.
Every measurement is also appended to $BENCH_RESULTS (JSON lines) when set, and the per-run
latencies go to lifecycle_cdf.csv beside it (for the plots).
"""

import json
import os
import subprocess
import sys
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
TIMEOUT_S = float(os.environ.get("LIFECYCLE_TIMEOUT", "1800"))
# One kubectl creates its documents one POST after the other: with the operator busy beside it
# (2026-12-06, 1,000 runs) that took ~140 s and made the window the creates' (each run
# create->Succeeded in ~3 s). Several creators side by side, on both sides alike; 1 = the old way.
CREATORS = max(1, int(os.environ.get("LIFECYCLE_CREATORS", "8")))


def kubectl(*args, stdin=None):
    return subprocess.run(
        ["kubectl", *args], input=stdin, capture_output=True, text=True, check=True
    ).stdout


def result(case, metric, value, unit):
    path = os.environ.get("BENCH_RESULTS")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"bench": "lifecycle_vs_jobs", "case": case, "metric": metric,
                            "value": value, "unit": unit}) + "\n")


def quantile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    i = max(1, min(len(s), int(-(-len(s) * q // 1))))
    return s[i - 1]


def apiserver_writes():
    """apiserver_request_total over mutating verbs, by resource (subresource joined with '/') and verb."""
    return apiserver_requests(reads=False)


def apiserver_reads():
    """apiserver_request_total over GET and LIST (what a controller reads live, not from its cache)."""
    return apiserver_requests(reads=True)


def apiserver_requests(reads):
    by_resource = {}
    for line in kubectl("get", "--raw", "/metrics").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, value = line.rsplit(" ", 1)
        fields = dict(
            part.split("=", 1) for part in labels[len("apiserver_request_total{"):-1].split('",')
            if "=" in part)
        fields = {k: v.strip('"') for k, v in fields.items()}
        if (fields.get("verb", "") in ("GET", "LIST")) != reads or fields.get("verb") in ("WATCH", "CONNECT"):
            continue
        resource = fields.get("resource", "")
        if fields.get("subresource"):
            resource += "/" + fields["subresource"]
        resource += " " + fields.get("verb", "")
        # A refused write (4xx/5xx: a 404 DELETE of a pod already gone, a 409 conflict) changes
        # nothing in etcd: counted apart, so "writes" can be told from "requests".
        if not reads and not fields.get("code", "").startswith("2"):
            resource += " " + REFUSED
        by_resource[resource] = by_resource.get(resource, 0.0) + float(value)
    return by_resource


REFUSED = "refused"


def refused(by_resource):
    return sum(v for k, v in by_resource.items() if k.endswith(" " + REFUSED))


def operator_steps():
    """The operator's reconciles and drains so far, from its /metrics (LIFECYCLE_OPERATOR_METRICS:
    host:port): {label: (count, seconds)} for each reconcile step and for the drains."""
    addr = os.environ.get("LIFECYCLE_OPERATOR_METRICS")
    if not addr:
        return {}
    import urllib.request
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    steps = {}
    for line in text.splitlines():
        for family, key in (("sandboxrun_reconcile_duration_seconds", "step"),
                            ("sandboxrun_drain_duration_seconds", "phase")):
            for part, slot in (("_count{", 0), ("_sum{", 1)):
                if line.startswith(family + part) and f'{key}="' in line:
                    label = ("drain " if key == "phase" else "") + line.split(f'{key}="', 1)[1].split('"', 1)[0]
                    entry = steps.setdefault(label, [0.0, 0.0])
                    entry[slot] += float(line.rsplit(" ", 1)[1])
    return steps


def writes_between(before, after):
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0) > 0}


class Watch:
    """`kubectl get KIND -w`, one line an event: name and a state, stamped on receipt."""

    def __init__(self, namespace, kind, template):
        self.first_seen = {}
        self.seen = {}  # (name, state) -> first receipt time
        # The reader thread adds while the main thread counts: at N = 10,000 an unguarded count
        # raised "dictionary changed size during iteration".
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            ["kubectl", "get", kind, "-n", namespace, "-w", "--no-headers",
             "-o", f"jsonpath={template}"],
            stdout=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        for line in self.proc.stdout:
            now = time.time()
            parts = line.split()
            if not parts:
                continue
            name, state = parts[0], " ".join(parts[1:])
            with self.lock:
                self.first_seen.setdefault(name, now)
                self.seen.setdefault((name, state), now)

    def count(self, state):
        with self.lock:
            return sum(1 for (_, s) in self.seen if s == state)

    def times(self, state):
        with self.lock:
            return {n: t for (n, s), t in self.seen.items() if s == state}

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def proc_stats(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) // 1024
    return cpu, rss


def wait_for(check, what):
    deadline = time.time() + TIMEOUT_S
    while not check():
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def quiet_cluster():
    """Waits (up to 2 min) until no namespace is Terminating: the namespace controller's deletes
    of an earlier run's objects would otherwise be counted in this window's writes. Namespaces
    held for good (objects with a finalizer nobody releases) are named, and the window goes on."""
    deadline = time.time() + 120
    while True:
        names = kubectl("get", "namespaces", "-o",
                        'jsonpath={range .items[?(@.status.phase=="Terminating")]}{.metadata.name} {end}'
                        ).split()
        if not names:
            return
        if time.time() > deadline:
            print(f"  (namespaces still Terminating, their deletes count in this window: "
                  f"{' '.join(names)})", file=sys.stderr)
            return
        time.sleep(2)


def create_all(documents):
    """`kubectl create -f` of the documents, shared round-robin among CREATORS processes."""
    docs = documents.split("---\n")
    shares = ["---\n".join(docs[i::CREATORS]) for i in range(min(CREATORS, len(docs)))]
    errors = []

    def create(share):
        try:
            kubectl("create", "-f", "-", stdin=share)
        except subprocess.CalledProcessError as e:
            errors.append(e.stderr)

    threads = [threading.Thread(target=create, args=(share,)) for share in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"kubectl create failed: {errors[0]}")


def run_side(n, namespace, documents, kind, template, final_state, failed_state, op_pid=None):
    quiet_cluster()
    watch = Watch(namespace, kind, template)
    time.sleep(1.0)  # the watch is established before the first create
    writes0, reads0 = apiserver_writes(), apiserver_reads()
    steps0 = operator_steps() if op_pid else {}
    cpu0 = proc_stats(op_pid)[0] if op_pid else 0.0
    t0 = time.time()
    create_all(documents)
    created = time.time() - t0
    wait_for(lambda: watch.count(final_state) + watch.count(failed_state) >= n,
             f"{n} {kind} to end")
    t1 = max(watch.times(final_state).values(), default=time.time())
    writes = writes_between(writes0, apiserver_writes())
    reads = writes_between(reads0, apiserver_reads())
    steps1 = operator_steps() if op_pid else {}
    steps = {k: (v[0] - steps0.get(k, [0, 0])[0], v[1] - steps0.get(k, [0, 0])[1])
             for k, v in steps1.items()}
    stats = proc_stats(op_pid) if op_pid else (0.0, 0)
    watch.stop()
    return {
        "watch": watch, "t0": t0, "seconds": t1 - t0, "failed": watch.count(failed_state),
        "created": created,
        "seen_over": max(list(watch.first_seen.values()), default=t0) - t0,
        "writes": sum(writes.values()), "by_resource": writes, "reads": reads, "steps": steps, "cpu": stats[0] - cpu0, "rss": stats[1],
    }


NODE = os.environ.get("LIFECYCLE_NODE", "kwok")
WORKLOAD_IMAGE = os.environ.get("LIFECYCLE_WORKLOAD_IMAGE", "")
# LIFECYCLE_RUNTIME_CLASS (bench/lifecycle_vs_jobs.sh RUNTIME_CLASS=gvisor): runs and Jobs alike
# under that RuntimeClass.
RUNTIME_CLASS = os.environ.get("LIFECYCLE_RUNTIME_CLASS", "")
REAL_PLACEMENT = ("""  nodeSelector: {sandbox.iterion.io/real-node: "true"}
  tolerations: [{key: sandbox.iterion.io/real-node, operator: Equal, value: "true", effect: NoSchedule}]
""" + (f"  runtimeClassName: {RUNTIME_CLASS}\n" if RUNTIME_CLASS else ""))


def runs_yaml(n, namespace, data_dir):
    if NODE == "real":
        return "---\n".join(real_runs_yaml(i, namespace) for i in range(n))
    docs = []
    for i in range(n):
        docs.append(f"""apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata: {{name: r{i:05d}, namespace: {namespace}}}
spec:
  image: registry.example/tool@sha256:{"0" * 64}
  command: [sh, -c, work]
  user: "1000:1000"
  podAnnotations: {{bench.sandboxrun.test/exit-code: "0"}}
  readBack:
    compression: none
    paths: [{{path: "{data_dir}", sizeLimit: 8Mi}}]
""")
    return "---\n".join(docs)


def real_runs_yaml(i, namespace):
    """A real container writing 1 MiB into its read-back path and exiting."""
    return f"""apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata: {{name: r{i:05d}, namespace: {namespace}}}
spec:
  image: {WORKLOAD_IMAGE}
  command: [sh, -c, "head -c 1048576 /dev/urandom > /work/out/blob"]
  user: "1000:1000"
{REAL_PLACEMENT}  readBack:
    compression: none
    paths: [{{path: /work/out, sizeLimit: 8Mi}}]
"""


def job_yaml(i, namespace, image, script, pod_extra=""):
    """One batch/v1 Job running `script` once in `image` (`pod_extra`: more pod spec lines)."""
    return f"""apiVersion: batch/v1
kind: Job
metadata: {{name: j{i:05d}, namespace: {namespace}}}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
{pod_extra}      containers:
      - {{name: work, image: {image}, command: [sh, -c, "{script}"]}}
"""


def jobs_yaml(n, namespace):
    if NODE == "real":
        # The same work as a run: a real container writing 1 MiB (kept nowhere) and exiting.
        extra = ("      securityContext: {runAsUser: 1000, runAsGroup: 1000}\n"
                 + REAL_PLACEMENT.replace("  ", "      ", 1)
                 .replace(chr(10) + "  tolerations", chr(10) + "      tolerations")
                 .replace(chr(10) + "  runtimeClassName", chr(10) + "      runtimeClassName"))
        return "---\n".join(
            job_yaml(i, namespace, WORKLOAD_IMAGE, "head -c 1048576 /dev/urandom > /tmp/blob", extra)
            for i in range(n))
    return "---\n".join(job_yaml(i, namespace, f"registry.example/tool@sha256:{'0' * 64}", "work")
                         for i in range(n))


def main():
    n = int(sys.argv[1])
    runs_ns, jobs_ns, data_dir, op_pid = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    case = f"N={n}-{NODE}"

    print(f"== N={n}: {n} SandboxRuns (create -> Running -> workload exit -> drain -> Succeeded)",
          file=sys.stderr)
    runs = run_side(n, runs_ns, runs_yaml(n, runs_ns, data_dir), "sandboxruns",
                    '{.metadata.name} {.status.phase}{"\\n"}', "Succeeded", "Failed", op_pid)
    # LIFECYCLE_JOBS_UP_TO=1000: larger N run the SandboxRuns alone (10,000 Jobs take ~50 min here).
    jobs_up_to = int(os.environ.get("LIFECYCLE_JOBS_UP_TO", "0") or 0)
    with_jobs = jobs_up_to == 0 or n <= jobs_up_to
    if with_jobs:
        print(f"== N={n}: {n} Jobs (create -> Complete)", file=sys.stderr)
        jobs = run_side(n, jobs_ns, jobs_yaml(n, jobs_ns), "jobs",
                        '{.metadata.name} {.status.succeeded}/{.status.failed}{"\\n"}', "1/", "/1")
    else:
        print(f"== N={n}: no Jobs (LIFECYCLE_JOBS_UP_TO={jobs_up_to})", file=sys.stderr)
        jobs = {"watch": None, "seconds": float("nan"), "failed": 0, "writes": float("nan"),
                "by_resource": {}}

    rw, jw = runs["watch"], jobs["watch"]
    running = rw.times("Running")
    succeeded = rw.times("Succeeded")
    create_to_running = [running[k] - rw.first_seen[k] for k in running if k in rw.first_seen]
    running_to_done = [succeeded[k] - running[k] for k in succeeded if k in running]
    create_to_done = [succeeded[k] - rw.first_seen[k] for k in succeeded if k in rw.first_seen]
    job_done = jw.times("1/") if jw else {}
    job_create_to_done = [job_done[k] - jw.first_seen[k] for k in job_done if k in jw.first_seen]

    runs_per_min = n / runs["seconds"] * 60
    jobs_per_min = n / jobs["seconds"] * 60
    ms = lambda v: v * 1000  # noqa: E731
    print(f"\nN = {n} on the {NODE} node")
    print(f"  SandboxRuns: {runs_per_min:8.0f} lifecycles/min ({runs['seconds']:.1f} s, "
          f"{runs['failed']} failed); create->Running p50 {ms(quantile(create_to_running, .5)):.0f} ms "
          f"p99 {ms(quantile(create_to_running, .99)):.0f} ms; Running->Succeeded (exit + drain) "
          f"p50 {ms(quantile(running_to_done, .5)):.0f} ms p99 {ms(quantile(running_to_done, .99)):.0f} ms; "
          f"create->Succeeded p50 {ms(quantile(create_to_done, .5)):.0f} ms "
          f"p99 {ms(quantile(create_to_done, .99)):.0f} ms (a workload that ends at once is never "
          f"seen Running)")
    # Where the window goes: the creates themselves (one kubectl, serial POSTs) and the spread of
    # the runs' first sightings on the watch (the window is no shorter than either).
    print(f"  creates: kubectl took {runs['created']:.1f} s; runs first seen over {runs['seen_over']:.1f} s")
    if with_jobs:
        print(f"  Jobs:        {jobs_per_min:8.0f} completions/min ({jobs['seconds']:.1f} s, "
              f"{jobs['failed']} failed); create->Complete p50 {ms(quantile(job_create_to_done, .5)):.0f} ms "
              f"p99 {ms(quantile(job_create_to_done, .99)):.0f} ms")
        print(f"  ratio runs/Jobs per minute: {runs_per_min / jobs_per_min:.2f}x (target >= 2x at N = 1,000)")
    print(f"  operator: peak RSS {runs['rss']} MiB (target <= 256 MiB at N = 10,000), "
          f"CPU {runs['cpu']:.1f} s ({runs['cpu'] / n * 1000:.1f} ms a run)")
    print(f"  apiserver mutating requests per lifecycle: runs {runs['writes'] / n:.1f} "
          f"(target <= 12), Jobs {jobs['writes'] / n:.1f} (whole cluster, both windows)")
    runs_refused = refused(runs["by_resource"])
    jobs_refused = refused(jobs["by_resource"]) if with_jobs else float("nan")
    print(f"    of which refused (4xx/5xx, nothing written): runs {runs_refused / n:.1f}, "
          f"Jobs {jobs_refused / n:.1f}; writes that took effect: runs "
          f"{(runs['writes'] - runs_refused) / n:.1f}, Jobs {(jobs['writes'] - jobs_refused) / n:.1f}")
    for side, w in (("runs", runs), ("Jobs", jobs))[:2 if with_jobs else 1]:
        top = sorted(w["by_resource"].items(), key=lambda kv: -kv[1])[:14]
        print(f"    {side} window, per lifecycle: "
              + ", ".join(f"{k} {v / n:.1f}" for k, v in top))
        steps = w.get("steps", {})
        if steps:
            print(f"    {side}: the operator's reconciles and drains per lifecycle (count, mean): "
                  + ", ".join(f"{k} {c / n:.2f} x {s / c * 1000:.0f} ms"
                              for k, (c, s) in sorted(steps.items(), key=lambda kv: -kv[1][1]) if c > 0))
        # Reads are what a controller asks the apiserver live instead of its watch cache.
        top = sorted(w.get("reads", {}).items(), key=lambda kv: -kv[1])[:8]
        print(f"    {side} window, reads (GET/LIST) per lifecycle: "
              + ", ".join(f"{k} {v / n:.1f}" for k, v in top))

    for metric, value, unit in [
        ("runs_per_minute", runs_per_min, "1/min"), ("jobs_per_minute", jobs_per_min, "1/min"),
        ("ratio_runs_vs_jobs", runs_per_min / jobs_per_min, "ratio"),
        ("runs_failed", runs["failed"], "count"), ("jobs_failed", jobs["failed"], "count"),
        ("run_create_to_running_p50", ms(quantile(create_to_running, .5)), "ms"),
        ("run_create_to_running_p99", ms(quantile(create_to_running, .99)), "ms"),
        ("run_running_to_succeeded_p50", ms(quantile(running_to_done, .5)), "ms"),
        ("run_running_to_succeeded_p99", ms(quantile(running_to_done, .99)), "ms"),
        ("run_create_to_succeeded_p50", ms(quantile(create_to_done, .5)), "ms"),
        ("run_create_to_succeeded_p99", ms(quantile(create_to_done, .99)), "ms"),
        ("job_create_to_complete_p50", ms(quantile(job_create_to_done, .5)), "ms"),
        ("job_create_to_complete_p99", ms(quantile(job_create_to_done, .99)), "ms"),
        ("operator_peak_rss", runs["rss"], "MiB"), ("operator_cpu", runs["cpu"], "s"),
        ("apiserver_writes_per_run", runs["writes"] / n, "requests"),
        ("apiserver_writes_per_job", jobs["writes"] / n, "requests"),
        ("apiserver_refused_writes_per_run", runs_refused / n, "requests"),
        ("apiserver_refused_writes_per_job", jobs_refused / n, "requests"),
    ] + [(f"apiserver_writes_per_run_{k.replace(' ', '_')}", v / n, "requests")
         for k, v in runs["by_resource"].items()] + [
        (f"apiserver_writes_per_job_{k.replace(' ', '_')}", v / n, "requests")
        for k, v in jobs["by_resource"].items()]:
        if with_jobs or "job" not in metric:
            result(case, metric, value, unit)

    path = os.environ.get("BENCH_RESULTS")
    if path:
        cdf = os.path.join(os.path.dirname(path), "lifecycle_cdf.csv")
        sides = ((f"SandboxRun ({NODE}) create->Succeeded", create_to_done),
                 (f"Job ({NODE}) create->Complete", job_create_to_done))[:2 if with_jobs else 1]
        # A re-run replaces its own lines (same side and N) and keeps the others (the other node,
        # the other sizes), so the plot never draws one case twice.
        replaced = {(side, str(n)) for side, _ in sides}
        kept = []
        if os.path.exists(cdf):
            with open(cdf) as f:
                kept = [line for line in f.readlines()[1:]
                        if tuple(line.split(",", 2)[:2]) not in replaced]
        with open(cdf, "w") as f:
            f.write("side,n,quantile,seconds\n")
            f.writelines(kept)
            for side, values in sides:
                for i in range(1, 201):
                    f.write(f"{side},{n},{i / 200:.3f},{quantile(values, i / 200):.4f}\n")

if __name__ == "__main__":
    main()
