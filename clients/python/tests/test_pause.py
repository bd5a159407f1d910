"""Pause, resume and fork through the client against a fake apiserver (docs/user-guide.md "Pause,
resume and fork"): what each call writes, and what it waits for — a resumed sandbox is running
only once its files were restored and its workload started on them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_lifecycle import FakeRuns, _sandboxes

from sandboxrun import AsyncSandboxes, RunFailed, SandboxError

PAUSED = {
    "phase": "Pending",
    "attempts": [{"index": 1}],
    "conditions": [{"type": "Ready", "status": "False", "reason": "Suspended", "message": "suspended"}],
}
RUNNING_PARKED = {"phase": "Running", "podName": "r-sbr-a2", "attempts": [{"index": 1}]}


def _restored(outcome: str = "Restored", delivered: bool = True) -> dict[str, Any]:
    record: dict[str, Any] = {"attempt": 2, "fromAttempt": 1, "outcome": outcome, "files": 1, "bytes": 6}
    if delivered:
        record["delivered"] = True
    if outcome == "Failed":
        record["message"] = "sha256 mismatch"
    return {**RUNNING_PARKED, "restores": [record]}


class SpecRuns(FakeRuns):
    """:class:`FakeRuns` whose objects carry ``spec`` (the waits read ``spec.workspace``)."""

    spec: dict[str, Any] = {"workspace": {"restore": "Latest"}}

    def _obj(self, status: dict[str, Any]) -> dict[str, Any]:
        return {**super()._obj(status), "spec": self.spec}


def _runs(monkeypatch: pytest.MonkeyPatch, statuses: list[dict[str, Any]]) -> tuple[Any, SpecRuns]:
    sandboxes, _ = _sandboxes(monkeypatch, [])
    runs = SpecRuns(statuses)
    sandboxes._custom = runs
    return sandboxes, runs


def test_create_asks_for_the_workspace_to_be_kept_or_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, runs = _runs(monkeypatch, [])
    sandboxes.create(template="agent-tools", command=["sleep", "3600"], workspace_restore="Latest")
    assert runs.created["spec"]["workspace"] == {"restore": "Latest"}
    sandboxes.create(template="agent-tools", command=["true"], fork_from="a")
    assert runs.created["spec"]["workspace"] == {"from": {"run": "a"}}
    sandboxes.create(template="agent-tools", command=["true"], fork_from=("a", 2), workspace_restore="Never")
    assert runs.created["spec"]["workspace"] == {"restore": "Never", "from": {"run": "a", "attempt": 2}}
    sandboxes.create(template="agent-tools", command=["true"], fork_from="a", fork_checkpoint=3)
    assert runs.created["spec"]["workspace"] == {"from": {"run": "a", "checkpoint": 3}}
    with pytest.raises(ValueError):
        sandboxes.create(template="agent-tools", command=["true"], fork_from=("a", 2), fork_checkpoint=3)
    sandboxes.create(template="agent-tools")
    assert "workspace" not in runs.created["spec"]
    with pytest.raises(ValueError):
        sandboxes.create(template="agent-tools", workspace_restore="latest")


def test_pause_suspends_and_waits_until_the_attempt_is_drained(monkeypatch: pytest.MonkeyPatch) -> None:
    draining = {"phase": "Draining", "podName": "r-sbr"}
    sandboxes, runs = _runs(monkeypatch, [{"phase": "Running", "podName": "r-sbr"}, draining, PAUSED])
    status = sandboxes.get("r").pause(timeout=5)
    assert runs.patched == [{"spec": {"suspend": True}}]
    assert (status.phase, status.condition("Ready").reason) == ("Pending", "Suspended")  # type: ignore[union-attr]
    assert len(runs.watches) == 1, "watched, not polled"


def test_a_run_that_ends_instead_of_pausing_is_run_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = {"phase": "Failed", "conditions": [{"type": "Failed", "status": "True", "reason": "WorkloadFailed"}]}
    sandboxes, _ = _runs(monkeypatch, [{"phase": "Running", "podName": "r-sbr"}, failed])
    with pytest.raises(RunFailed):
        sandboxes.get("r").pause(timeout=5)


def test_resume_waits_past_a_running_pod_until_its_files_were_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    # Running with a pod is not enough: the workload is parked until the restore is handed over.
    sandboxes, runs = _runs(monkeypatch, [PAUSED, PAUSED, RUNNING_PARKED, _restored(delivered=False), _restored()])
    sandbox = sandboxes.get("r")
    status = sandbox.resume(timeout=5)
    assert runs.patched == [{"spec": {"suspend": False}}]
    assert status.pod_name == "r-sbr-a2"
    assert runs.last["restores"][0]["delivered"] is True, "returned only once the start was handed over"


def test_a_failed_restore_is_an_error_never_a_running_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, _ = _runs(monkeypatch, [PAUSED, PAUSED, RUNNING_PARKED, _restored("Failed")])
    with pytest.raises(SandboxError, match="sha256 mismatch"):
        sandboxes.get("r").resume(timeout=5)


def test_a_forks_first_attempt_waits_for_its_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    first = {"phase": "Running", "podName": "r-sbr"}
    record = {"attempt": 1, "fromAttempt": 1, "fromRun": "a", "fromUid": "u-a", "outcome": "Restored", "delivered": True}
    sandboxes, runs = _runs(monkeypatch, [{}, first, {**first, "restores": [record]}])
    runs.spec = {"workspace": {"from": {"run": "a"}}}
    sandboxes.get("r").wait_running(timeout=5)
    assert runs.last.get("restores") == [record]
    # A plain run (nothing to restore) is running with its pod.
    plain, plain_runs = _runs(monkeypatch, [{}, first, {**first, "message": "later"}])
    plain_runs.spec = {}
    plain.get("r").wait_running(timeout=5)
    assert plain_runs.last == first


def test_the_async_client_pauses_and_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, runs = _runs(monkeypatch, [{"phase": "Running", "podName": "r-sbr"}, PAUSED, _restored()])

    async def main() -> str | None:
        sandbox = await AsyncSandboxes(sync=sandboxes).get("r")
        await sandbox.pause(timeout=5)
        return (await sandbox.resume(timeout=5)).pod_name

    assert asyncio.run(main()) == "r-sbr-a2"
    assert runs.patched == [{"spec": {"suspend": True}}, {"spec": {"suspend": False}}]
