"""Running a command in a sandbox's workload container through the exec API
(``kubernetes.stream``): stdout, stderr, and the exit code from the exec's error channel."""

from __future__ import annotations

import codecs
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDIN_CHANNEL

from .errors import ExecError, SandboxError, Timeout

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
    #: Whether output past the run's ``max_output`` bytes was left out of ``stdout_bytes`` /
    #: ``stderr_bytes`` (the callbacks still saw all of it).
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def stdout(self) -> str:
        """``stdout_bytes`` as text (UTF-8, undecodable bytes replaced)."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """``stderr_bytes`` as text (UTF-8, undecodable bytes replaced)."""
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """Whether the command exited 0."""
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


#: The script that reports the command's pid as the first line of stdout, then becomes the
#: command (``exec``): the pid a kill names is the command's own. The command is passed as
#: arguments (``"$@"``), never pasted into the script.
PID_SCRIPT = 'echo "$$"; exec "$@"'
#: Signals :meth:`Execution.kill` sends (a fixed set: nothing a caller passes reaches a shell).
SIGNALS = ("TERM", "KILL", "INT", "HUP")
#: Kills the command's process group (a pipeline, a shell's children) if it leads one, else the
#: command: ``$1`` is one of :data:`SIGNALS`, ``$2`` a pid the client parsed as digits.
KILL_SCRIPT = 'kill -s "$1" -- "-$2" 2>/dev/null || kill -s "$1" "$2"'
Output = Callable[[str], Any]


def with_pid(command: list[str]) -> list[str]:
    """``command`` run by :data:`PID_SCRIPT`: its pid first on stdout (the client strips it)."""
    return ["sh", "-c", PID_SCRIPT, "sh", *command]


def _send_stdin(ws: Any, data: bytes) -> None:
    for start in range(0, len(data), _STDIN_CHUNK):
        ws.write_channel(STDIN_CHANNEL, data[start : start + _STDIN_CHUNK])


class _Sink:
    """One output stream: kept for the result (its first ``limit`` bytes when a limit is set: a
    command that prints without end cannot fill the client's memory), and passed on whole as
    text, decoded incrementally (a character split between two frames is passed once, whole)."""

    def __init__(self, callback: Output | None, limit: int | None = None) -> None:
        self.data = bytearray()
        self.seen = 0
        self._limit = limit
        self._callback = callback
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    @property
    def truncated(self) -> bool:
        return self.seen > len(self.data)

    def feed(self, chunk: bytes, final: bool = False) -> None:
        self.seen += len(chunk)
        room = len(chunk) if self._limit is None else max(0, self._limit - len(self.data))
        self.data += chunk[:room]
        if self._callback is not None:
            text = self._decoder.decode(chunk, final)
            if text:
                self._callback(text)


class Execution:
    """A command running in a sandbox (:meth:`sandboxrun.Sandbox.start`): its output is read by a
    thread of its own, passed to the callbacks as it comes; :meth:`wait` for its result,
    :meth:`kill` to end it."""

    def __init__(
        self,
        ws: Any,
        where: str,
        kill_exec: Callable[[list[str]], Any],
        stdin: bytes | None = None,
        on_stdout: Output | None = None,
        on_stderr: Output | None = None,
        pid_line: bool = True,
        max_output: int | None = None,
    ) -> None:
        self._ws = ws
        self._where = where
        self._kill_exec = kill_exec
        self._stdin = stdin
        self._out, self._err = _Sink(on_stdout, max_output), _Sink(on_stderr, max_output)
        self._head = bytearray()
        self._pid: int | None = None
        self._pid_line = pid_line
        self._pid_known = threading.Event()
        if not pid_line:
            self._pid_known.set()
        self._done = threading.Event()
        self._result: ExecResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._pump, name=f"exec {where}", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"Execution({self._where}, pid={self._pid})"

    @property
    def pid(self) -> int | None:
        """The command's pid in the sandbox, once it started (else ``None``)."""
        return self._pid

    @property
    def running(self) -> bool:
        """Whether the command has not ended yet."""
        return not self._done.is_set()

    def _stdout(self, chunk: bytes) -> None:
        if self._pid_line:
            self._head += chunk
            line, sep, rest = bytes(self._head).partition(b"\n")
            if not sep:
                return
            self._pid = int(line) if line.strip().isdigit() else None
            self._pid_line = False
            self._pid_known.set()
            chunk = rest
        if chunk:
            self._out.feed(chunk)

    def _read(self) -> None:
        out = self._ws.read_stdout(timeout=0) or b""
        err = self._ws.read_stderr(timeout=0) or b""
        if out:
            self._stdout(out)
        if err:
            self._err.feed(err)

    def _pump(self) -> None:
        try:
            if self._stdin is not None:
                _send_stdin(self._ws, self._stdin)
            while self._ws.is_open():
                self._ws.update(timeout=1.0)
                self._read()
            self._read()
            status = self._ws.read_channel(ERROR_CHANNEL)
            text = status.decode("utf-8", "replace") if isinstance(status, bytes) else str(status)
            self._out.feed(b"", final=True)
            self._err.feed(b"", final=True)
            self._result = ExecResult(
                exit_code_of(text),
                bytes(self._out.data),
                bytes(self._err.data),
                self._out.truncated,
                self._err.truncated,
            )
        except BaseException as e:  # noqa: BLE001 - handed to the waiter, never lost
            self._error = e if isinstance(e, ExecError) else ExecError(f"the exec in {self._where} broke: {e}")
        finally:
            self._pid_known.set()
            self._done.set()
            self._close()

    def _close(self) -> None:
        try:
            self._ws.close()
        except Exception:  # noqa: BLE001 - closing a broken stream has nothing left to say
            pass

    def wait(self, timeout: float | None = None) -> ExecResult:
        """The command's result once it ended; :class:`Timeout` if it has not within ``timeout``
        seconds (it keeps running: :meth:`kill` it)."""
        if not self._done.wait(timeout):
            last = f"{self._out.seen} byte(s) of stdout"
            raise Timeout(f"the command in {self._where} to end", timeout or 0.0, last)
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def kill(self, signal: str = "KILL", timeout: float = 30.0) -> None:
        """Sends ``signal`` (one of :data:`SIGNALS`) to the command (its process group when it
        leads one), by a second exec. Nothing happens when it already ended."""
        if signal not in SIGNALS:
            raise ValueError(f"signal {signal!r} is not one of {', '.join(SIGNALS)}")
        self._pid_known.wait(timeout)
        if self._done.is_set() or self._pid is None:
            return
        self._kill_exec(["sh", "-c", KILL_SCRIPT, "sh", signal, str(self._pid)])


def start(
    api: CoreV1Api,
    namespace: str,
    pod: str,
    cmd: str | Sequence[str],
    stdin: bytes | None = None,
    on_stdout: Output | None = None,
    on_stderr: Output | None = None,
    max_output: int | None = None,
) -> Execution:
    """Starts ``cmd`` in the workload container of ``pod`` and returns at once. With ``stdin``,
    the command reads exactly those bytes then EOF (see :func:`with_counted_stdin`: the image
    needs ``sh`` and ``head``). The command is run by :data:`PID_SCRIPT` (the image needs ``sh``)
    so that a kill names it. With ``max_output``, the result keeps at most that many bytes of
    each stream (and says it was cut); the callbacks still get everything."""
    command = as_command(cmd)
    if stdin is not None:
        command = with_counted_stdin(command, len(stdin))
    ws = _open(api, namespace, pod, with_pid(command), stdin is not None)

    def kill_exec(kill: list[str]) -> Any:
        return _run_plain(api, namespace, pod, kill, 30.0)

    return Execution(ws, f"{namespace}/{pod}", kill_exec, stdin, on_stdout, on_stderr, max_output=max_output)


def _run_plain(api: CoreV1Api, namespace: str, pod: str, command: list[str], timeout: float) -> ExecResult:
    """``command`` as it is (no pid line), waited for; the kill's own exec."""
    ws = _open(api, namespace, pod, command, False)
    return Execution(ws, f"{namespace}/{pod}", lambda _: None, pid_line=False).wait(timeout)


def exec_in(
    api: CoreV1Api,
    namespace: str,
    pod: str,
    cmd: str | Sequence[str],
    stdin: bytes | None = None,
    timeout: float = 300.0,
    on_stdout: Output | None = None,
    on_stderr: Output | None = None,
    max_output: int | None = None,
) -> ExecResult:
    """Runs ``cmd`` in the workload container of ``pod`` and waits for it to end, passing its
    output to the callbacks as it comes. A command still running after ``timeout`` seconds is
    killed (``KILL``) and :class:`Timeout` raised. ``max_output``: as in :func:`start`."""
    execution = start(api, namespace, pod, cmd, stdin, on_stdout, on_stderr, max_output)
    try:
        return execution.wait(timeout)
    except Timeout:
        try:
            execution.kill("KILL")
        except SandboxError:
            pass  # the Timeout says what happened; a kill that failed leaves nothing to add
        last = f"{execution._out.seen} byte(s) of stdout"
        raise Timeout(f"{as_command(cmd)!r} in {namespace}/{pod}", timeout, last) from None
