"""The lifecycle's waits and errors against a fake apiserver: what a status sequence raises."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

import sandboxrun.client as lifecycle
from sandboxrun import DrainFailed, RunFailed, Sandboxes, Timeout


class FakeRuns:
    """The CustomObjectsApi calls the client makes, answered from a list of statuses."""

    def __init__(self, statuses: list[dict[str, Any]]) -> None:
        self.statuses: Iterator[dict[str, Any]] = iter(statuses)
        self.last: dict[str, Any] = {}
        self.created: dict[str, Any] = {}
        self.patched: list[dict[str, Any]] = []

    def _obj(self, status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "r", "namespace": "ns", "uid": "u-1"}, "status": status}

    def create_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, body: Any) -> Any:
        self.created = body
        return self._obj({})

    def get_namespaced_custom_object(self, *args: Any) -> Any:
        self.last = next(self.statuses, self.last)
        return self._obj(self.last)

    def patch_namespaced_custom_object(self, *args: Any) -> Any:
        self.patched.append(args[-1])
        return self._obj(self.last)


class FakeEvents:
    def list_namespaced_event(self, namespace: str, field_selector: str) -> Any:
        assert "reason=sandbox_runfiles_drain_failed" in field_selector
        event = SimpleNamespace(involved_object=SimpleNamespace(uid="u-1"), message="1 of 1 path(s) FAILED")
        return SimpleNamespace(items=[event])


def _sandboxes(monkeypatch: pytest.MonkeyPatch, statuses: list[dict[str, Any]]) -> tuple[Sandboxes, FakeRuns]:
    monkeypatch.setattr(lifecycle, "_POLL", 0.0)
    sandboxes = Sandboxes("ns", api_client=client.ApiClient())
    runs = FakeRuns(statuses)
    sandboxes._custom = runs  # type: ignore[assignment]
    sandboxes._core = FakeEvents()  # type: ignore[assignment]
    return sandboxes, runs


def test_create_from_a_template_sets_only_the_ref_and_open_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, runs = _sandboxes(monkeypatch, [])
    sandboxes.create(template="agent-tools", command=["sh"], env={"A": "1"})
    assert runs.created["spec"] == {
        "templateRef": {"name": "agent-tools", "kind": "SandboxRunTemplate"},
        "command": ["sh"],
        "env": [{"name": "A", "value": "1"}],
    }
    assert runs.created["metadata"] == {"generateName": "sandbox-"}


def test_wait_running_returns_once_the_pod_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    sandboxes, _ = _sandboxes(monkeypatch, [{}, {"phase": "Pending"}, {"phase": "Running", "podName": "r-sbr"}])
    assert sandboxes.create().wait_running(timeout=5).pod_name == "r-sbr"


def test_a_run_that_ends_before_running_raises_run_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    ended = {
        "phase": "Failed",
        "message": "image not found",
        "conditions": [{"type": "Failed", "status": "True", "reason": "ImagePullFailed"}],
    }
    sandboxes, _ = _sandboxes(monkeypatch, [{"phase": "Pending"}, ended])
    with pytest.raises(RunFailed) as raised:
        sandboxes.create().wait_running(timeout=5)
    assert (raised.value.reason, raised.value.message) == ("ImagePullFailed", "image not found")


def test_a_wait_that_runs_out_says_what_it_saw_last(monkeypatch: pytest.MonkeyPatch) -> None:
    pending = {
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "False", "reason": "Unschedulable", "message": "no node"}],
    }
    sandboxes, _ = _sandboxes(monkeypatch, [pending])
    with pytest.raises(Timeout) as raised:
        sandboxes.create().wait_running(timeout=0.05)
    assert "Unschedulable: no node" in raised.value.last


def test_wait_drained_raises_drain_failed_with_the_events_note(monkeypatch: pytest.MonkeyPatch) -> None:
    draining = {"phase": "Draining", "readBack": [{"path": "/out", "phase": "Pending"}]}
    failed = {"phase": "Stopped", "readBack": [{"path": "/out", "phase": "Failed", "message": "store refused"}]}
    sandboxes, runs = _sandboxes(monkeypatch, [{"phase": "Running", "podName": "r-sbr"}, draining, failed])
    sandbox = sandboxes.create()
    sandbox.stop()
    assert runs.patched == [{"spec": {"stop": True}}]
    with pytest.raises(DrainFailed) as raised:
        sandbox.wait_drained(timeout=5)
    assert [(p.path, p.message) for p in raised.value.failed] == [("/out", "store refused")]
    assert raised.value.event_note == "1 of 1 path(s) FAILED"


def test_wait_drained_of_an_empty_path_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = {"phase": "Stopped", "readBack": [{"path": "/out", "phase": "Empty"}]}
    sandboxes, _ = _sandboxes(monkeypatch, [empty])
    files = sandboxes.create().wait_drained(timeout=5)
    assert files.files() == [] and [p.phase for p in files.status.read_back] == ["Empty"]
