#!/usr/bin/env python3
"""Drain end -> next step: how long after a run's drain ends its next step comes (issue #55 item 4).

Run by bench/drain_next_step.sh (which starts the operator); prints numbers, asserts nothing.

N SandboxRuns are created at once on the kwok node, each declaring one read-back path (~1 MiB,
the same host directory: kwok's exec runs the packer on this host) and a retry policy of one
retry after `backoff` seconds; kwok ends every workload with code 1, 200 ms after Running. The
first attempt's drain ends with the status write that records it (`status.attempt` 2, the run
Pending until `status.nextAttemptTime`); the next step is the second attempt's pod
(`<run>-sbr-a2`). Both are stamped on receipt from watches (ms), so

    delay = (second pod first seen) - (attempt 2 first seen on the run) - backoff

is what the operator adds to the backoff: the wake of the run after its drain, its reconcile,
and the pod's creation. Before the fix most runs waited for the 30 s in-flight requeue.
"""

import subprocess
import sys
import time

# The lifecycle bench's watch (events stamped on receipt) and nearest-rank quantile.
from lifecycle_vs_jobs import Watch, quantile

TIMEOUT_S = 600


def runs_yaml(n, namespace, data_dir, backoff):
    docs = []
    for i in range(n):
        docs.append(f"""apiVersion: sandbox.iterion.io/v1alpha1
kind: SandboxRun
metadata: {{name: r{i:04d}, namespace: {namespace}}}
spec:
  image: registry.example/tool@sha256:{"0" * 64}
  command: [sh, -c, work]
  user: "1000:1000"
  podAnnotations: {{bench.sandboxrun.test/exit-code: "1"}}
  retryPolicy: {{limit: 1, backoff: {{baseSeconds: {backoff}, factor: 1}}}}
  readBack:
    compression: none
    paths: [{{path: "{data_dir}", sizeLimit: 8Mi}}]
""")
    return "---\n".join(docs)


def main():
    n, namespace, data_dir, backoff = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    runs = Watch(namespace, "sandboxruns", '{.metadata.name} {.status.attempt}{"\\n"}')
    pods = Watch(namespace, "pods", '{.metadata.name} seen{"\\n"}')
    time.sleep(1)
    subprocess.run(["kubectl", "create", "-f", "-"], input=runs_yaml(n, namespace, data_dir, backoff),
                   capture_output=True, text=True, check=True)
    names = [f"r{i:04d}" for i in range(n)]
    deadline = time.time() + TIMEOUT_S
    while time.time() < deadline:
        if all((f"{r}-sbr-a2", "seen") in pods.seen for r in names):
            break
        time.sleep(0.5)
    runs.stop()
    pods.stop()
    delays, by_run = [], {}
    for r in names:
        ended = runs.seen.get((r, "2"))
        started = pods.seen.get((f"{r}-sbr-a2", "seen"))
        if ended is not None and started is not None:
            delays.append(started - ended - backoff)
            by_run[r] = started - ended - backoff
    slow = sorted((d, r) for r, d in by_run.items() if d > 5)
    if slow:
        print("over 5 s: " + ", ".join(f"{r} {d:.1f} s" for d, r in slow), file=sys.stderr)
    missing = n - len(delays)
    if not delays:
        print(f"N={n}: no second attempt seen", file=sys.stderr)
        sys.exit(1)
    print(f"N={n} backoff {backoff} s: drain end -> next attempt's pod, beyond the backoff: "
          f"p50 {quantile(delays, .5):.2f} s, p90 {quantile(delays, .9):.2f} s, "
          f"p99 {quantile(delays, .99):.2f} s, max {max(delays):.2f} s; "
          f"{sum(1 for d in delays if d > 5)} of {len(delays)} over 5 s"
          + (f" ({missing} runs not seen)" if missing else ""))


if __name__ == "__main__":
    main()
