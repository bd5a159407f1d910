"""Pause -> resume on the real node (issue #54 item 1, docs/performance.md "Pause and resume"):
for each size N (MiB of random bytes in the read-back path), a run with
`spec.workspace.restore: Latest` writes N MiB, is paused (`spec.suspend: true`: drained, pod
gone) and resumed (`false`), once on a cold pod and once on a warm pool's pod (a run made from a
pooled template of the same shape); measured is resume -> the resumed workload's first instruction,
i.e. a new pod, N MiB read from the store, verified against the manifest and unpacked in the
pod, then the start handed to the launcher. Beside it, interleaved on the same bed and
operator: create -> first instruction of a cold run of the same image (nothing restored) and of
a warm run (a pool's pod). The pause itself (suspend -> drained, pod gone) is reported too.

    python3 bench/pause_resume.py <namespace> <samples> <image> <sizes MiB, comma-separated>

The clock and the first instruction are bench/warm_start.py's (a write's time in the workload,
left as its termination message). Driven by bench/pause_resume.sh.
"""

import subprocess
import sys
import threading
import time

from warm_start import GROUP, PLACEMENT, STAMP, VERSION, Bench, first_instruction, quantiles

# Attempt 1 writes N MiB, marks it written and waits to be paused; a later attempt's first
# instruction reads the clock, then it checks the restored size (a wrong size fails the run).
SCRIPT = STAMP + r"""; D="$ITERION_ARTIFACT_FILES_DIR"
if [ "$SANDBOXRUN_ATTEMPT" -eq 1 ]; then
  head -c $((SIZE_MIB * 1048576)) /dev/urandom > "$D/data"; touch "$D/written"; exec sleep 3600
fi
echo "$t" > /dev/termination-log
[ "$(wc -c < "$D/data")" -eq $((SIZE_MIB * 1048576)) ] || exit 9"""


class Pausing:
    def __init__(self, bench):
        self.b = bench

    def pooled(self, most_mib, replicas=2):
        """A template of the same shape with the read-back path, and a pool of it: resumes that
        a pool's pod serves (its files restored into the claimed pod)."""
        template = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxRunTemplate",
            "metadata": {"name": "bench-pause"},
            "spec": {
                "template": {
                    "image": self.b.image,
                    "user": "1000:1000",
                    "command": ["sh", "-c", "exit 3"],
                    "readBack": {"paths": [{"path": "/work/out", "sizeLimit": f"{most_mib + 16}Mi"}]},
                    **PLACEMENT,
                },
                "openFields": ["command", "env"],
            },
        }
        self.b.co.create_namespaced_custom_object(GROUP, VERSION, self.b.ns, "sandboxruntemplates", template)
        pool = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxRunPool",
            "metadata": {"name": "bench-pause"},
            "spec": {"templateRef": {"name": "bench-pause"}, "replicas": replicas},
        }
        self.b.co.create_namespaced_custom_object(GROUP, VERSION, self.b.ns, "sandboxrunpools", pool)

    def create(self, name, mib, warm):
        own = {
            "command": ["sh", "-c", SCRIPT],
            "env": [{"name": "SIZE_MIB", "value": str(mib)}],
            "workspace": {"restore": "Latest"},
        }
        if warm:
            spec = {"templateRef": {"name": "bench-pause"}, **own}
        else:
            spec = {
                "image": self.b.image,
                "user": "1000:1000",
                "readBack": {"paths": [{"path": "/work/out", "sizeLimit": f"{mib + 16}Mi"}]},
                **PLACEMENT,
                **own,
            }
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxRun",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.b.co.create_namespaced_custom_object(GROUP, VERSION, self.b.ns, "sandboxruns", body)

    def get(self, name):
        return self.b.co.get_namespaced_custom_object(GROUP, VERSION, self.b.ns, "sandboxruns", name)

    def wait(self, name, what, ok, timeout=300, every=0.05):
        end = time.time() + timeout
        while time.time() < end:
            status = self.get(name).get("status") or {}
            if ok(status):
                return status
            if status.get("phase") in ("Succeeded", "Failed", "Stopped"):
                raise SystemExit(f"run {name} ended ({status.get('phase')}) waiting for {what}: {status}")
            time.sleep(every)
        raise SystemExit(f"run {name}: no {what} in {timeout}s")

    def written(self, name, timeout=300):
        """Waits until attempt 1 has written its bytes (the marker file, seen by an exec)."""
        end = time.time() + timeout
        while time.time() < end:
            pods = self.b.core.list_namespaced_pod(
                self.b.ns, label_selector=f"sandbox.iterion.io/run={name}"
            ).items
            for p in pods:
                probe = subprocess.run(
                    ["kubectl", "exec", "-n", self.b.ns, p.metadata.name, "-c", "workload", "--",
                     "test", "-f", "/work/out/written"],
                    capture_output=True,
                )
                if probe.returncode == 0:
                    return
            time.sleep(0.5)
        raise SystemExit(f"run {name} did not write its bytes in {timeout}s")

    def suspend(self, name, on):
        self.b.co.patch_namespaced_custom_object(
            GROUP, VERSION, self.b.ns, "sandboxruns", name, {"spec": {"suspend": on}}
        )

    def measure(self, name, mib, warm):
        """(pause seconds, resume -> first instruction seconds) of one sample; `warm`: the run is
        made from the pooled template, and its resume is served by a ready pool pod."""
        if warm:
            self.b.wait_pool(1, pool="bench-pause")
        self.create(name, mib, warm)
        self.wait(name, "Running", lambda s: s.get("phase") == "Running")
        self.written(name)
        t = time.time()
        self.suspend(name, True)
        self.wait(name, "the pause", lambda s: any(
            c.get("type") == "Ready" and c.get("reason") == "Suspended"
            for c in s.get("conditions") or []
        ), every=0.1)
        paused = time.time() - t
        if warm:
            self.b.wait_pool(1, pool="bench-pause")
        t0 = time.time()
        self.suspend(name, False)
        status = self.wait(name, "the resumed first instruction", lambda s: (
            (first_instruction((s.get("workload") or {}).get("message")) or 0) > t0
        ))
        restores = status.get("restores") or []
        if not restores or restores[-1].get("outcome") != "Restored":
            raise SystemExit(f"run {name}: not restored: {restores}")
        ts = first_instruction(status["workload"]["message"])
        served = bool((status.get("warmStart") or {}).get("pod"))
        if warm != served:
            raise SystemExit(f"run {name}: resumed {'warm' if served else 'cold'}, wanted the other: {status.get('warmStart')}")
        # The resumed workload checks the restored size; a wrong one fails the run (exit 9).
        self.wait(name, "its end", lambda s: s.get("phase") == "Succeeded", every=0.2)
        return paused, ts - t0


def main():
    ns, samples, image = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sizes = [int(s) for s in sys.argv[4].split(",")]
    b = Bench(ns, image, 1)
    b.template("bench")
    b.template("bench-cold")
    b.pool()
    b.wait_pool(1)
    p = Pausing(b)
    p.pooled(max(sizes))
    lat = {"warm": [], "cold": []}
    pause = {m: [] for m in sizes}
    resume = {(m, w): [] for m in sizes for w in (False, True)}
    for i in range(samples):
        for mib in sizes:
            for warm in (False, True):
                name = f"pause-{'w' if warm else 'c'}{mib}-{i}"
                paused, resumed = p.measure(name, mib, warm)
                pause[mib].append(paused)
                resume[(mib, warm)].append(resumed)
                b.delete_later("run", name)
        b.wait_pool(1)
        t0 = b.run(f"warm-{i}", "bench")
        ts, _ = b.run_started(f"warm-{i}")
        lat["warm"].append(ts - t0)
        b.delete_later("run", f"warm-{i}")
        t0 = b.run(f"cold-{i}", "bench-cold")
        ts, _ = b.run_started(f"cold-{i}")
        lat["cold"].append(ts - t0)
        b.delete_later("run", f"cold-{i}")
    print(f"on the real node, {samples} of each, interleaved (p50 / p99):")
    for kind in ("warm", "cold"):
        p50, p99 = quantiles(lat[kind])
        print(f"  {kind} start, create -> first instruction:       {p50 * 1000:7.0f} / {p99 * 1000:7.0f} ms")
    cold50, _ = quantiles(lat["cold"])
    for mib in sizes:
        for warm in (False, True):
            r50, r99 = quantiles(resume[(mib, warm)])
            print(f"  resume ({'warm' if warm else 'cold'}) with {mib:4} MiB restored -> first instruction:"
                  f" {r50 * 1000:7.0f} / {r99 * 1000:7.0f} ms  ({r50 / cold50:.2f}x a cold start)")
        s50, s99 = quantiles(pause[mib])
        print(f"  pause  with {mib:4} MiB (suspend -> Suspended, drained): {s50 * 1000:7.0f} / {s99 * 1000:7.0f} ms")
    # The deletions' threads end before the interpreter does (a daemon thread in the client at
    # shutdown aborts it).
    for t in threading.enumerate():
        if t is not threading.main_thread():
            t.join(timeout=60)


if __name__ == "__main__":
    main()
