"""The local test bed (``hack/local-cluster.sh``) as the Python client's bed tests use it: its
settings, restricted namespaces, the operator binary started as a process of this test run (and
killed by it), the real node's placement, and the bed registry's images. Mirrors
tests/it/support/operator.rs and tests/it/real_node/bed.rs."""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
REAL_NODE_LABEL = "sandbox.iterion.io/real-node"


def bed_env() -> dict[str, str]:
    """``hack/local-cluster.sh env`` as a dict (the bed must be up; this never starts it)."""
    if os.environ.get("SANDBOXRUN_TEST_S3_ENDPOINT") and os.environ.get("KUBECONFIG"):
        return dict(os.environ)
    out = subprocess.run(
        [str(REPO / "hack/local-cluster.sh"), "env"], check=True, capture_output=True, text=True
    ).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export ") :].split("=", 1)
            env[key] = shlex.split(value)[0] if value else ""
    return env


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def kubectl(env: dict[str, str], *args: str, stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(["kubectl", *args], check=False, input=stdin, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout


def operator_binary(env: dict[str, str]) -> Path:
    """``SANDBOXRUN_TEST_OPERATOR_BIN``, else the debug build ``make test`` builds before the tests."""
    named = env.get("SANDBOXRUN_TEST_OPERATOR_BIN")
    target = Path(env.get("CARGO_TARGET_DIR") or REPO / "target")
    binary = Path(named) if named else target / "debug" / "sandboxrun-operator"
    if not os.access(binary, os.X_OK):
        raise RuntimeError(f"no operator binary at {binary}: `cargo build --bins` (make test builds it)")
    return binary


def pod_ref(env: dict[str, str], pinned: str) -> str:
    """A pushed reference as the real node pulls it (``localhost:<port>/…``)."""
    registry = env["SANDBOXRUN_TEST_POD_REGISTRY"]
    _, _, rest = pinned.partition("/")
    return f"{registry}/{rest}" if rest else pinned


def image_ref(env: dict[str, str], name: str) -> str:
    path = Path(env.get("SANDBOXRUN_TEST_STATE") or REPO / ".k8s-local") / "images" / f"{name}.ref"
    if not path.exists():
        raise RuntimeError(
            f"no image {name} ({path}): `hack/local-cluster.sh up` pushes busybox, "
            "`hack/images.sh operator` the operator image (make test runs both)"
        )
    return path.read_text().strip()


def holder_image(env: dict[str, str]) -> str:
    """The operator image the run pods' holder runs: ``SANDBOXRUN_TEST_OPERATOR_IMAGE`` when
    set, else the one ``hack/images.sh operator`` pinned (as tests/it/real_node/bed.rs)."""
    pinned = (env.get("SANDBOXRUN_TEST_OPERATOR_IMAGE") or "").strip() or image_ref(env, "sandboxrun-operator")
    return pod_ref(env, pinned)


def real_node_spec(env: dict[str, str], paths: list[str], compression: str = "none") -> dict[str, Any]:
    """A run spec that lands on the real node and runs the bed's busybox as uid 1000."""
    return {
        "image": pod_ref(env, image_ref(env, "busybox")),
        "user": "1000:1000",
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        "readBack": {"paths": [{"path": p} for p in paths], "compression": compression, "drainTimeout": "1m"},
    }


def restricted_namespace(env: dict[str, str], prefix: str) -> str:
    name = unique(prefix)
    kubectl(env, "create", "namespace", name)
    kubectl(
        env,
        "label",
        "namespace",
        name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    return name


def delete_namespace(env: dict[str, str], namespace: str) -> None:
    """Releases every run at once (skip-drain), deletes them while their operator still runs,
    then the namespace."""
    kubectl(env, "annotate", "sbr", "--all", "-n", namespace, "sandbox.iterion.io/skip-drain=true", check=False)
    kubectl(env, "delete", "sbr", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
    kubectl(env, "delete", "namespace", namespace, "--wait=false", check=False)


@dataclass
class S3:
    endpoint: str
    bucket: str
    access_key: str
    secret_key: str

    @staticmethod
    def of(env: dict[str, str]) -> S3:
        return S3(
            env["SANDBOXRUN_TEST_S3_ENDPOINT"],
            env["SANDBOXRUN_TEST_S3_BUCKET"],
            env["SANDBOXRUN_TEST_S3_ACCESS_KEY"],
            env["SANDBOXRUN_TEST_S3_SECRET_KEY"],
        )

    def options(self, secret: str | None = None) -> list[str]:
        flags: list[str] = []
        for key, value in [
            ("endpoint", self.endpoint),
            ("allow_http", "true"),
            ("access_key_id", self.access_key),
            ("secret_access_key", secret or self.secret_key),
            ("region", "us-east-1"),
        ]:
            flags += ["--store-option", f"{key}={value}"]
        return flags


class Operator:
    """``sandboxrun-operator run`` for one namespace, a child of this test run; killed by
    :meth:`stop` (only this process)."""

    def __init__(self, env: dict[str, str], namespace: str, store_url: str, extra: list[str]) -> None:
        self.log = Path(tempfile.gettempdir()) / f"sandboxrun-operator-{namespace}.log"
        args = [
            str(operator_binary(env)),
            "run",
            "--unadmitted-references",
            "trust",
            "--namespaces",
            namespace,
            "--store-url",
            store_url,
            "--metrics-addr",
            "127.0.0.1:0",
            "--webhook-addr",
            "",
            "--holder-image",
            holder_image(env),
            "--holder-binary",
            "/usr/local/bin/sandboxrun-operator",
            "--log-level",
            "info,sandboxrun_operator=debug",
            "--log-format",
            "json",
            "--pod-name",
            f"operator-{namespace}",
            *extra,
        ]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(0.5)
        if self.process.poll() is not None:
            raise RuntimeError(f"the operator exited {self.process.returncode}: {self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
