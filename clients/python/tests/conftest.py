"""Fixtures of the bed tests: the running local cluster (never started or stopped here), one
restricted namespace per operator, the operator binary as a child process of this test run, the
bed's S3 server. Unit tests need none of them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bed

from sandboxrun import Sandboxes, StoreReader

#: The template the docs' agent loop names (docs/user-guide.md, "Sandboxes for agents").
AGENT_TEMPLATE = "agent-tools"


@dataclass
class Bed:
    """One namespace, its operator, a client of it, and where its runs drain to."""

    env: dict[str, str]
    namespace: str
    operator: bed.Operator
    sandboxes: Sandboxes
    s3: bed.S3
    store_url: str

    def diagnose(self) -> str:
        """What to print when a test fails: the operator's last words."""
        return f"\n--- operator log ({self.operator.log}) ---\n{self.operator.log_tail()}"


@pytest.fixture(scope="session")
def env() -> dict[str, str]:
    settings = bed.bed_env()
    # The CRDs of this checkout (the Rust tests apply them the same way).
    bed.kubectl(
        settings,
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager",
        "sandboxrun-tests",
        *[a for f in sorted((bed.REPO / "crds").glob("*.sandbox.iterion.io.yaml")) for a in ("-f", str(f))],
    )
    return settings


def _agent_template(env: dict[str, str], namespace: str) -> None:
    spec = bed.real_node_spec(env, ["/work/out"], compression="zstd")
    template = {
        "apiVersion": "sandbox.iterion.io/v1alpha1",
        "kind": "SandboxRunTemplate",
        "metadata": {"name": AGENT_TEMPLATE, "namespace": namespace},
        "spec": {"template": spec, "openFields": ["command", "args", "env"]},
    }
    import json

    bed.kubectl(env, "apply", "-f", "-", stdin=json.dumps(template))


def _bed(env: dict[str, str], prefix: str, wrong_secret: bool, extra: tuple[str, ...] = ()) -> Iterator[Bed]:
    s3 = bed.S3.of(env)
    namespace = bed.restricted_namespace(env, prefix)
    store_url = f"s3://{s3.bucket}/{bed.unique('pyclient')}"
    flags = s3.options("not-the-secret" if wrong_secret else None) + list(extra)
    if "--warm-pools" in flags:
        # A pool seals its pods with the admission key, kept in a Secret of --pod-namespace: the
        # test's own namespace, where the operator may create it (docs/contract.md, issue #51).
        flags += ["--pod-namespace", namespace]
    operator = bed.Operator(env, namespace, store_url, flags)
    try:
        _agent_template(env, namespace)
        reader = StoreReader(
            endpoint_url=s3.endpoint, access_key=s3.access_key, secret_key=s3.secret_key, region="us-east-1"
        )
        sandboxes = Sandboxes(namespace, kubeconfig=env["KUBECONFIG"], store=reader)
        yield Bed(env, namespace, operator, sandboxes, s3, store_url)
    finally:
        bed.delete_namespace(env, namespace)
        operator.stop()
        _purge(s3, store_url)


def _purge(s3: bed.S3, store_url: str) -> None:
    """Deletes what this run stored (its own prefix only)."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3.endpoint,
        aws_access_key_id=s3.access_key,
        aws_secret_access_key=s3.secret_key,
        region_name="us-east-1",
    )
    prefix = store_url.split("/", 3)[3] + "/"
    listed = client.list_objects_v2(Bucket=s3.bucket, Prefix=prefix).get("Contents", [])
    for obj in listed:
        client.delete_object(Bucket=s3.bucket, Key=obj["Key"])


@pytest.fixture(scope="session")
def good(env: dict[str, str]) -> Iterator[Bed]:
    """An operator storing into the bed's S3 server with its credentials."""
    yield from _bed(env, "py-client", wrong_secret=False)


@pytest.fixture(scope="session")
def warm(env: dict[str, str]) -> Iterator[Bed]:
    """An operator serving warm pools (``--warm-pools``), storing into the bed's S3 server."""
    yield from _bed(env, "py-warm", wrong_secret=False, extra=("--warm-pools",))


@pytest.fixture(scope="session")
def broken(env: dict[str, str]) -> Iterator[Bed]:
    """An operator whose S3 store refuses its credentials: every drain fails."""
    yield from _bed(env, "py-client-broken", wrong_secret=True)
