"""Create -> the workload's first instruction, on the real node: a run that takes a warm pool's
pod, a cold run of the same template shape, and a bare pod of the same image and command, side by
side (interleaved), then claims per second until a pool of ready pods is empty.

The workload's first instruction writes its termination log and leaves that write's time (the
file's modification time, the kernel's clock in nanoseconds; the real node is this host, so it
shares the clock) as its termination message (`adjtimex` was used before; gVisor does not
implement it); the latency is
that time minus the time taken just before the create call. Driven by bench/warm_start.sh, which
starts the operator (the image's binary) with --warm-pools.

    python3 bench/warm_start.py <namespace> <samples> <image> <pool replicas> [agent-sandbox]

With `agent-sandbox` (bench/warm_start.sh AGENT_SANDBOX=1, its controller running), the same
number of kubernetes-sigs/agent-sandbox SandboxClaims on a SandboxWarmPool of the same size, same
image and node: create -> the claim's Ready condition.
"""

import calendar
import json
import os
import re
import statistics
import sys
import threading
import time

from kubernetes import client, config

GROUP, VERSION = "sandbox.iterion.io", "v1alpha1"
STAT_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d+) ([+-]\d{4})$")
# The first instruction: a write, then its time read back from the file (`stat -c %y`).
STAMP = 'echo > /dev/termination-log; t=$(stat -c %y /dev/termination-log)'
SCRIPT = STAMP + '; echo "$t" > /dev/termination-log'
# The templates' spec.network (bench/warm_start.sh NETWORK=1): a filtered template's pool pods
# pass the egress gate before they are ready, and its runs apply their own policy first.
NETWORK = json.loads(os.environ.get("BENCH_NETWORK") or "null")
PLACEMENT = {
    "nodeSelector": {"sandbox.iterion.io/real-node": "true"},
    "tolerations": [
        {
            "key": "sandbox.iterion.io/real-node",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        }
    ],
}
# RUNTIME_CLASS=gvisor: the runs' and the bare pods' RuntimeClass (the bed's gVisor, issue #55
# item 5: warm and cold starts under gVisor beside runc's).
RUNTIME_CLASS = os.environ.get("RUNTIME_CLASS") or None
if RUNTIME_CLASS:
    PLACEMENT["runtimeClassName"] = RUNTIME_CLASS


def first_instruction(message):
    """The wall time the workload left: `stat -c %y`'s "YYYY-MM-DD HH:MM:SS.fraction +0000", or
    `adjtimex`'s tv_sec and tv_usec lines; None if neither is there."""
    sec = usec = None
    for line in (message or "").splitlines():
        line = line.strip()
        stamp = STAT_TIME.match(line)
        if stamp:
            whole = time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
            offset = int(stamp.group(3)[1:3]) * 3600 + int(stamp.group(3)[3:5]) * 60
            sign = -1 if stamp.group(3)[0] == "+" else 1
            return calendar.timegm(whole) + float("0." + stamp.group(2)) + sign * offset
        if line.startswith("time.tv_sec:"):
            sec = int(line.split(":")[1])
        elif line.startswith("time.tv_usec:"):
            usec = int(line.split(":")[1])
    if sec is None or usec is None:
        return None
    return sec + usec / 1e6


class Bench:
    def __init__(self, ns, image, replicas):
        config.load_kube_config()
        self.ns, self.image, self.replicas = ns, image, replicas
        self.co = client.CustomObjectsApi()
        self.core = client.CoreV1Api()

    def template(self, name):
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxRunTemplate",
            "metadata": {"name": name},
            "spec": {
                "template": {
                    "image": self.image,
                    "command": ["sh", "-c", "exit 3"],
                    "user": "1000:1000",
                    **PLACEMENT,
                    **({"network": NETWORK} if NETWORK else {}),
                },
                "openFields": ["command", "env"],
            },
        }
        self.co.create_namespaced_custom_object(GROUP, VERSION, self.ns, "sandboxruntemplates", body)

    def pool(self):
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxRunPool",
            "metadata": {"name": "bench"},
            "spec": {"templateRef": {"name": "bench"}, "replicas": self.replicas},
        }
        self.co.create_namespaced_custom_object(GROUP, VERSION, self.ns, "sandboxrunpools", body)

    def ready_pool_pods(self, pool="bench"):
        pods = self.core.list_namespaced_pod(
            self.ns, label_selector=f"sandbox.iterion.io/pool={pool},!sandbox.iterion.io/claimed-by"
        ).items
        ready = 0
        for p in pods:
            statuses = (p.status.container_statuses or []) if p.status else []
            running = {c.name for c in statuses if c.state and c.state.running}
            if p.metadata.deletion_timestamp is None and {"workload", "holder"} <= running:
                ready += 1
        return ready

    def wait_pool(self, at_least, timeout=300, pool="bench"):
        end = time.time() + timeout
        while time.time() < end:
            if self.ready_pool_pods(pool) >= at_least:
                return
            time.sleep(0.2)
        raise SystemExit(f"the pool {pool} did not have {at_least} ready pods in {timeout}s")

    def run(self, name, template):
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxRun",
            "metadata": {"name": name},
            "spec": {"templateRef": {"name": template}, "command": ["sh", "-c", SCRIPT]},
        }
        t0 = time.time()
        self.co.create_namespaced_custom_object(GROUP, VERSION, self.ns, "sandboxruns", body)
        return t0

    def run_started(self, name, timeout=180):
        end = time.time() + timeout
        while time.time() < end:
            run = self.co.get_namespaced_custom_object(GROUP, VERSION, self.ns, "sandboxruns", name)
            status = run.get("status") or {}
            ts = first_instruction((status.get("workload") or {}).get("message"))
            if ts is not None:
                warm = bool((status.get("warmStart") or {}).get("pod"))
                return ts, warm
            if status.get("phase") in ("Succeeded", "Failed", "Stopped"):
                raise SystemExit(f"run {name} ended without its workload's time: {status.get('message')}")
            time.sleep(0.05)
        raise SystemExit(f"run {name} did not start in {timeout}s")

    def bare(self, name):
        body = client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                restart_policy="Never",
                node_selector=PLACEMENT["nodeSelector"],
                runtime_class_name=RUNTIME_CLASS,
                tolerations=[client.V1Toleration(**t) for t in PLACEMENT["tolerations"]],
                security_context=client.V1PodSecurityContext(run_as_user=1000, run_as_group=1000),
                containers=[
                    client.V1Container(
                        name="workload", image=self.image, command=["sh", "-c", SCRIPT]
                    )
                ],
            ),
        )
        t0 = time.time()
        self.core.create_namespaced_pod(self.ns, body)
        return t0

    def bare_started(self, name, timeout=180):
        end = time.time() + timeout
        while time.time() < end:
            pod = self.core.read_namespaced_pod(name, self.ns)
            for c in (pod.status.container_statuses or []) if pod.status else []:
                term = c.state.terminated if c.state else None
                ts = first_instruction(term.message if term else None)
                if ts is not None:
                    return ts
            time.sleep(0.05)
        raise SystemExit(f"pod {name} did not start in {timeout}s")

    def delete_later(self, kind, name):
        def go():
            try:
                if kind == "pod":
                    self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)
                else:
                    self.co.delete_namespaced_custom_object(GROUP, VERSION, self.ns, "sandboxruns", name)
            except client.ApiException:
                pass

        threading.Thread(target=go, daemon=True).start()


AS_GROUP, AS_VERSION = "extensions.agents.x-k8s.io", "v1beta1"


class AgentSandbox:
    """kubernetes-sigs/agent-sandbox's warm pool on the same node: a SandboxTemplate of the same
    image (idle: its workload is running before any claim, as a claimed sandbox's is), a
    SandboxWarmPool of the same size, and SandboxClaims; a claim's latency is create -> its
    Ready condition True."""

    def __init__(self, bench, replicas):
        self.b, self.replicas = bench, replicas

    def setup(self):
        co, ns = self.b.co, self.b.ns
        template = {
            "apiVersion": f"{AS_GROUP}/{AS_VERSION}",
            "kind": "SandboxTemplate",
            "metadata": {"name": "bench"},
            "spec": {
                "networkPolicyManagement": "Unmanaged",
                "podTemplate": {
                    "spec": {
                        **PLACEMENT,
                        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                        "containers": [
                            {"name": "workload", "image": self.b.image, "command": ["sleep", "infinity"]}
                        ],
                    }
                },
            },
        }
        co.create_namespaced_custom_object(AS_GROUP, AS_VERSION, ns, "sandboxtemplates", template)
        pool = {
            "apiVersion": f"{AS_GROUP}/{AS_VERSION}",
            "kind": "SandboxWarmPool",
            "metadata": {"name": "bench"},
            "spec": {"replicas": self.replicas, "sandboxTemplateRef": {"name": "bench"}},
        }
        co.create_namespaced_custom_object(AS_GROUP, AS_VERSION, ns, "sandboxwarmpools", pool)

    def ready(self):
        pool = self.b.co.get_namespaced_custom_object(
            AS_GROUP, AS_VERSION, self.b.ns, "sandboxwarmpools", "bench"
        )
        return (pool.get("status") or {}).get("readyReplicas", 0)

    def wait_ready(self, at_least, timeout=300):
        end = time.time() + timeout
        while time.time() < end:
            if self.ready() >= at_least:
                return
            time.sleep(0.2)
        raise SystemExit(f"agent-sandbox's warm pool did not have {at_least} ready in {timeout}s")

    def claim(self, name):
        body = {
            "apiVersion": f"{AS_GROUP}/{AS_VERSION}",
            "kind": "SandboxClaim",
            "metadata": {"name": name},
            "spec": {"warmPoolRef": {"name": "bench"}},
        }
        t0 = time.time()
        self.b.co.create_namespaced_custom_object(AS_GROUP, AS_VERSION, self.b.ns, "sandboxclaims", body)
        return t0

    def claim_ready(self, name, timeout=180):
        end = time.time() + timeout
        while time.time() < end:
            claim = self.b.co.get_namespaced_custom_object(
                AS_GROUP, AS_VERSION, self.b.ns, "sandboxclaims", name
            )
            for c in (claim.get("status") or {}).get("conditions") or []:
                if c.get("type") == "Ready" and c.get("status") == "True":
                    return time.time()
            time.sleep(0.02)
        raise SystemExit(f"claim {name} was not Ready in {timeout}s")

    def measure(self, samples):
        self.setup()
        self.wait_ready(self.replicas)
        lat = []
        for i in range(samples):
            self.wait_ready(1)
            t0 = self.claim(f"claim-{i}")
            lat.append(self.claim_ready(f"claim-{i}") - t0)
            try:
                self.b.co.delete_namespaced_custom_object(
                    AS_GROUP, AS_VERSION, self.b.ns, "sandboxclaims", f"claim-{i}"
                )
            except client.ApiException:
                pass
        p50, p99 = quantiles(lat)
        print(f"  agent-sandbox {AGENT_SANDBOX_VERSION}: SandboxClaim -> Ready (polled every 20 ms),"
              f" {samples}: p50 {p50 * 1000:.0f} ms   p99 {p99 * 1000:.0f} ms")
        self.wait_ready(self.replicas)
        names = [f"burst-claim-{i}" for i in range(self.replicas)]
        t0 = time.time()
        threads = [threading.Thread(target=self.claim, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        last = max(self.claim_ready(n) for n in names)
        print(f"  agent-sandbox burst of {self.replicas} claims on {self.replicas} ready:"
              f" all Ready {last - t0:.2f} s after the first create"
              f" ({self.replicas / (last - t0):.1f} claims/s)")
        return p50


AGENT_SANDBOX_VERSION = "v1.0.1"


def quantiles(values):
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return statistics.median(ordered), p99


def main():
    ns, samples, image, replicas = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    b = Bench(ns, image, replicas)
    b.template("bench")
    b.template("bench-cold")
    b.pool()
    b.wait_pool(replicas)
    lat = {"warm": [], "cold": [], "bare": []}
    misses = 0
    for i in range(samples):
        b.wait_pool(1)
        t0 = b.run(f"warm-{i}", "bench")
        ts, warm = b.run_started(f"warm-{i}")
        lat["warm"].append(ts - t0)
        misses += 0 if warm else 1
        b.delete_later("run", f"warm-{i}")
        t0 = b.run(f"cold-{i}", "bench-cold")
        ts, _ = b.run_started(f"cold-{i}")
        lat["cold"].append(ts - t0)
        b.delete_later("run", f"cold-{i}")
        t0 = b.bare(f"bare-{i}")
        lat["bare"].append(b.bare_started(f"bare-{i}") - t0)
        b.delete_later("pod", f"bare-{i}")
    print(f"create -> first instruction on the real node, {samples} of each, interleaved:")
    p50 = {}
    for kind in ("warm", "cold", "bare"):
        p50[kind], p99 = quantiles(lat[kind])
        print(f"  {kind:5} p50 {p50[kind] * 1000:7.0f} ms   p99 {p99 * 1000:7.0f} ms")
    print(f"  warm runs that took a pool pod: {samples - misses} of {samples}")
    print(f"  bare pod / warm run (p50): {p50['bare'] / p50['warm']:.2f}x;"
          f" cold run / warm run: {p50['cold'] / p50['warm']:.2f}x")
    # Claims per second: a pool of `replicas` ready pods, as many runs at once.
    b.wait_pool(replicas)
    t0 = time.time()
    names = [f"burst-{i}" for i in range(replicas)]
    threads = [threading.Thread(target=b.run, args=(n, "bench")) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    starts = [b.run_started(n) for n in names]
    took = sum(1 for _, warm in starts if warm)
    last = max(ts for ts, _ in starts)
    each = ", ".join(f"{n} {(ts - t0) * 1000:.0f}" for n, (ts, _) in zip(names, starts))
    print(f"  burst: each run's first instruction, ms after the first create (t0 {t0:.3f}): {each}")
    print(f"  burst of {replicas} runs on a pool of {replicas} ready pods: {took} warm, all started"
          f" {last - t0:.2f} s after the first create ({took / (last - t0):.1f} warm starts/s)")
    if len(sys.argv) > 5 and sys.argv[5] == "agent-sandbox":
        theirs = AgentSandbox(b, replicas).measure(samples)
        print(f"  agent-sandbox claim -> Ready / our warm run -> first instruction (p50):"
              f" {theirs / p50['warm']:.2f}x")


if __name__ == "__main__":
    main()
