"""Typed errors of the client. An empty read-back path is NOT an error: it is a
:class:`~sandboxrun.status.PathStatus` whose phase is ``Empty`` (the tool wrote nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: The Event reason the operator records when a teardown's drain failed (ADR-143).
DRAIN_FAILED_REASON = "sandbox_runfiles_drain_failed"


class SandboxError(Exception):
    """Base of every error this package raises."""


@dataclass(frozen=True)
class FailedPath:
    """A read-back path whose drain failed: nothing was committed for it."""

    path: str
    message: str
    attempts: int = 0


class DrainFailed(SandboxError):
    """At least one read-back path could not be drained (``status.readBack[].phase == Failed``,
    Warning Event ``sandbox_runfiles_drain_failed``). Never raised for an empty path."""

    def __init__(self, run: str, failed: Sequence[FailedPath], event_note: str | None = None):
        self.run = run
        self.failed = list(failed)
        self.event_note = event_note
        lines = "; ".join(f"{p.path}: {p.message}" for p in self.failed)
        super().__init__(f"SandboxRun {run}: the drain failed for {len(self.failed)} path(s): {lines}")


class RunFailed(SandboxError):
    """The run ended before it could do what was asked (e.g. it failed or stopped while we waited
    for it to run), with the operator's reason and message."""

    def __init__(self, run: str, phase: str, reason: str, message: str):
        self.run = run
        self.phase = phase
        self.reason = reason
        self.message = message
        super().__init__(f"SandboxRun {run} is {phase} ({reason}): {message}")


class Timeout(SandboxError):
    """A wait ran out of time; ``last`` says what was seen last."""

    def __init__(self, what: str, seconds: float, last: str):
        self.what = what
        self.seconds = seconds
        self.last = last
        super().__init__(f"timed out after {seconds:g}s waiting for {what} (last seen: {last})")


class NotRunning(SandboxError):
    """An exec was asked of a run whose pod does not run (not yet, or no longer)."""


class ExecError(SandboxError):
    """The exec itself failed (the apiserver or kubelet refused it, the stream broke), as opposed
    to a command that ran and exited non-zero, which is an :class:`~sandboxrun.exec.ExecResult`."""


class CommandFailed(SandboxError):
    """A file operation's command exited non-zero (e.g. ``cat`` of a missing file)."""

    def __init__(self, command: Sequence[str], exit_code: int, stderr: str):
        self.command = list(command)
        self.exit_code = exit_code
        self.stderr = stderr
        super().__init__(f"{' '.join(self.command)} exited {exit_code}: {stderr.strip()}")


class StoreError(SandboxError):
    """The drained files cannot be read from the store (no such object, refused credentials, an
    unknown URL scheme)."""


class UnsafeArchive(SandboxError):
    """An archive member would land outside the extraction directory (``..``, an absolute path,
    a link pointing out, a device), or does not match its manifest record."""
