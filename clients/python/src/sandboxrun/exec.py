"""Running a command in a sandbox's workload container through the exec API
(``kubernetes.stream``): stdout, stderr, and the exit code from the exec's error channel."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDIN_CHANNEL

from .errors import ExecError, Timeout

#: The run pod's container the workload runs in (the other one is the operator's holder).
WORKLOAD_CONTAINER = "workload"
_STDIN_CHUNK = 1 << 16


@dataclass(frozen=True)
class ExecResult:
    """How a command ended. ``stdout``/``stderr`` are text (UTF-8, undecodable bytes replaced);
    the raw bytes are in ``stdout_bytes``/``stderr_bytes``."""

    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def exit_code_of(error_channel: str) -> int:
    """The exit code the apiserver reports on the exec's error channel: a ``Status`` that is
    ``Success`` (0), or ``Failure`` with reason ``NonZeroExitCode`` and the code in its
    ``ExitCode`` cause. Anything else (the command could not be started, …) is :class:`ExecError`."""
    if not error_channel.strip():
        raise ExecError("the exec ended without a status on its error channel")
    try:
        status = json.loads(error_channel)
    except ValueError as e:
        raise ExecError(f"the exec's error channel is not a Status: {error_channel!r}") from e
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause["message"])
    raise ExecError(f"the exec failed: {status.get('message') or error_channel}")


def as_command(cmd: str | Sequence[str]) -> list[str]:
    """A string is run by ``sh -c`` (the image needs ``sh``); a list is run as it is."""
    return ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


def _open(api: CoreV1Api, namespace: str, pod: str, command: list[str], with_stdin: bool) -> Any:
    try:
        return stream(
            api.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            container=WORKLOAD_CONTAINER,
            command=command,
            stdin=with_stdin,
            stdout=True,
            stderr=True,
            tty=False,
            binary=True,
            _preload_content=False,
        )
    except ApiException as e:
        raise ExecError(f"exec in pod {namespace}/{pod} refused: {e.reason}") from e


def with_counted_stdin(command: list[str], size: int) -> list[str]:
    """``command`` fed exactly ``size`` bytes of stdin by ``head -c``, then EOF.

    The exec API's only EOF is closing the stdin stream (``v5.channel.k8s.io``), and on the
    bed's apiserver (v1.36) a close sent right after the data overtakes its tail: the command
    sees EOF early and the last bytes are lost, silently (observed: 32,768 of 562,151 bytes
    arrived). Counting the bytes in the pod needs no close at all, on v4 or v5, and a transfer
    cut short hangs until the timeout instead of leaving a truncated file."""
    return ["sh", "-c", 'head -c "$0" | "$@"', str(size), *command]


def _send_stdin(ws: Any, data: bytes) -> None:
    for start in range(0, len(data), _STDIN_CHUNK):
        ws.write_channel(STDIN_CHANNEL, data[start : start + _STDIN_CHUNK])


def exec_in(
    api: CoreV1Api,
    namespace: str,
    pod: str,
    cmd: str | Sequence[str],
    stdin: bytes | None = None,
    timeout: float = 300.0,
) -> ExecResult:
    """Runs ``cmd`` in the workload container of ``pod`` and waits for it to end. With
    ``stdin``, the command reads exactly those bytes then EOF (see :func:`with_counted_stdin`:
    the image needs ``sh`` and ``head``)."""
    command = as_command(cmd)
    if stdin is not None:
        command = with_counted_stdin(command, len(stdin))
    ws = _open(api, namespace, pod, command, stdin is not None)
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    try:
        if stdin is not None:
            _send_stdin(ws, stdin)
        while ws.is_open():
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"{command!r} in {namespace}/{pod}", timeout, f"{len(out)} byte(s) of stdout")
            ws.update(timeout=min(left, 1.0))
            out += ws.read_stdout(timeout=0) or b""
            err += ws.read_stderr(timeout=0) or b""
        out += ws.read_stdout(timeout=0) or b""
        err += ws.read_stderr(timeout=0) or b""
        status = ws.read_channel(ERROR_CHANNEL)
    finally:
        ws.close()
    text = status.decode("utf-8", "replace") if isinstance(status, bytes) else str(status)
    return ExecResult(exit_code_of(text), bytes(out), bytes(err))
