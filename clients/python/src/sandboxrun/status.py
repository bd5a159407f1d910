"""The parts of a SandboxRun's status the client acts on, typed (``status`` as the API returns it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import DrainFailed, FailedPath

FINAL_PHASES = ("Succeeded", "Failed", "Stopped")
#: Phases of a read-back path that mean "settled" (everything but Pending).
SETTLED_PATH_PHASES = ("Drained", "Empty", "Capped", "Failed")


@dataclass(frozen=True)
class PathStatus:
    """One ``status.readBack[]`` entry: ``Drained``, ``Empty`` (the tool wrote nothing),
    ``Capped`` (stored, members over the cap dropped) or ``Failed`` (see ``message``)."""

    path: str
    phase: str
    bytes: int = 0
    members: int = 0
    object: str | None = None
    manifest: str | None = None
    attempts: int = 0
    message: str | None = None

    @property
    def stored(self) -> bool:
        """Whether a manifest was committed for the path (Drained, Empty or Capped)."""
        return self.manifest is not None and self.phase in ("Drained", "Empty", "Capped")

    @staticmethod
    def from_dict(entry: Mapping[str, Any]) -> PathStatus:
        return PathStatus(
            path=str(entry.get("path", "")),
            phase=str(entry.get("phase", "Pending")),
            bytes=int(entry.get("bytes", 0) or 0),
            members=int(entry.get("members", 0) or 0),
            object=entry.get("object"),
            manifest=entry.get("manifest"),
            attempts=int(entry.get("attempts", 0) or 0),
            message=entry.get("message"),
        )


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class RunStatus:
    """``status`` of a SandboxRun."""

    phase: str = "Pending"
    pod_name: str | None = None
    exit_code: int | None = None
    message: str = ""
    conditions: list[Condition] = field(default_factory=list)
    read_back: list[PathStatus] = field(default_factory=list)

    @staticmethod
    def from_dict(status: Mapping[str, Any] | None) -> RunStatus:
        status = status or {}
        return RunStatus(
            phase=str(status.get("phase") or "Pending"),
            pod_name=status.get("podName"),
            exit_code=status.get("exitCode"),
            message=str(status.get("message") or ""),
            conditions=[
                Condition(
                    type=str(c.get("type", "")),
                    status=str(c.get("status", "")),
                    reason=str(c.get("reason", "")),
                    message=str(c.get("message", "")),
                )
                for c in status.get("conditions") or []
            ],
            read_back=[PathStatus.from_dict(e) for e in status.get("readBack") or []],
        )

    @property
    def final(self) -> bool:
        """Whether the run reached a final phase."""
        return self.phase in FINAL_PHASES

    def condition(self, type_: str) -> Condition | None:
        """The condition of that type, if the status has one."""
        return next((c for c in self.conditions if c.type == type_), None)

    @property
    def drain_settled(self) -> bool:
        """Whether the run ended and every declared path has an outcome."""
        return self.final and all(p.phase in SETTLED_PATH_PHASES for p in self.read_back)

    @property
    def failed_paths(self) -> list[FailedPath]:
        """Each read-back path whose drain failed, with its message."""
        return [
            FailedPath(p.path, p.message or "the drain failed (no message)", p.attempts)
            for p in self.read_back
            if p.phase == "Failed"
        ]

    def failure_reason(self) -> str:
        """The reason of the ``Failed`` condition, else of ``Ready``."""
        for type_ in ("Failed", "Ready"):
            cond = self.condition(type_)
            if cond is not None and cond.reason:
                return cond.reason
        return ""


def check_drain(run: str, status: RunStatus, event_note: str | None = None) -> RunStatus:
    """Raises :class:`DrainFailed` when a path failed to drain; returns ``status`` otherwise
    (an ``Empty`` path is a success: the tool wrote nothing)."""
    failed = status.failed_paths
    if failed:
        raise DrainFailed(run, failed, event_note)
    return status
