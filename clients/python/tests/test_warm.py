"""A client that creates a sandbox from a template gets a warm pool's pod when the template has
a pool (issue #40: the client uses the warm pools of issue #39; nothing in the client knows of
them). On the bed's real node, through the operator with ``--warm-pools``."""

from __future__ import annotations

import json
import time

import bed
import pytest
from conftest import AGENT_TEMPLATE, Bed

pytestmark = pytest.mark.bed


def _ready_pool(b: Bed, name: str, replicas: int, timeout: float = 180.0) -> None:
    pool = {
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRunPool",
        "metadata": {"name": name, "namespace": b.namespace},
        "spec": {"templateRef": {"name": AGENT_TEMPLATE}, "replicas": replicas},
    }
    bed.kubectl(b.env, "apply", "-f", "-", stdin=json.dumps(pool))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = bed.kubectl(
            b.env, "get", "sbrp", name, "-n", b.namespace, "-o", "jsonpath={.status.readyReplicas}", check=False
        )
        if ready.strip() == str(replicas):
            return
        time.sleep(0.5)
    pytest.fail(f"the pool {name} did not get {replicas} ready pods in {timeout}s{b.diagnose()}")


def test_a_sandbox_from_a_pooled_template_takes_a_warm_pod_and_its_files_come_back(warm: Bed) -> None:
    _ready_pool(warm, "agents", 1)
    sandbox = warm.sandboxes.create(template=AGENT_TEMPLATE)
    status = sandbox.wait_running()
    taken = bed.kubectl(
        warm.env, "get", "sbr", sandbox.name, "-n", warm.namespace, "-o", "jsonpath={.status.warmStart.pod}"
    ).strip()
    assert taken.startswith("agents-"), f"a pool pod was taken: {taken!r}{warm.diagnose()}"
    assert status.pod_name == taken, status
    result = sandbox.run("echo warm > /work/out/warm.txt && id -u")
    assert (result.exit_code, result.stdout.strip()) == (0, "1000"), result
    sandbox.stop()
    drained = sandbox.wait_drained()
    files = {stored.container_path: drained.fetch(stored) for stored in drained.files()}
    assert files.get("/work/out/warm.txt") == b"warm\n", files
